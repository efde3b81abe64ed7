"""Mutants of the documentation site (issue 27): each makes a generated page say less than the code
(a key, its doc, an algorithm's own defaults or formulas, a metric's meaning, the API's `run`), or
stops generating altogether; tests/tooling/test_docs_site.py, which builds the site, catches each."""

T = "tests/tooling/test_docs_site.py::"
CONFIG = T + "test_the_config_reference_holds_every_key_aiorl_config_keys_knows"
HOOK = "docs/hooks/generated.py"

MUTANTS = [
    dict(
        name="docs-config-reference-drops-a-key-of-each-section",
        path=HOOK,
        old='        keys = [shared[p] for p in listed if p.startswith(section + ".") and p in shared]\n',
        new='        keys = [shared[p] for p in listed if p.startswith(section + ".") and p in shared][:-1]\n',
        tests=[CONFIG],
    ),
    dict(
        name="docs-config-reference-loses-the-docs",
        path=HOOK,
        old="    return [(code(k.path), cell(k.type), code(flow(k.default)), cell(k.doc)) for k in keys]\n",
        new='    return [(code(k.path), cell(k.type), code(flow(k.default)), "") for k in keys]\n',
        tests=[CONFIG],
    ),
    dict(
        name="docs-algorithm-page-without-its-agent-defaults",
        path=HOOK,
        old='        out.append(f"Its own defaults of shared keys: {_values(defaults)}.\\n")\n',
        new="        pass\n",
        tests=[T + "test_each_algorithms_model_keys_are_on_the_reference_and_on_its_page[impala]"],
    ),
    dict(
        name="docs-algorithm-math-without-its-formulas",
        path=HOOK,
        old='            out.extend(["", "```text", body, "```", ""])\n',
        new='            out.extend(["", ""])\n',
        tests=[T + "test_each_algorithm_page_states_its_math_and_includes_its_examples[dppo]"],
    ),
    dict(
        name="docs-metrics-meaning-loses-its-continuation-lines",
        path=HOOK,
        old='            rows[-1][1] += " " + meaning\n',
        new="            pass\n",
        tests=[T + "test_the_metrics_page_lists_every_row_key"],
    ),
    dict(
        name="docs-api-page-without-run",
        path="docs/reference/api.md",
        old="::: aiorl.api.run\n\n",
        new="",
        tests=[T + "test_the_api_page_holds_the_public_apis_docstrings"],
    ),
    dict(
        name="docs-hook-not-loaded",
        path="mkdocs.yml",
        old="hooks:\n  - docs/hooks/generated.py\n",
        new="hooks: []\n",
        tests=[CONFIG],
    ),
]

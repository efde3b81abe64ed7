"""MkDocs hook: the pages of the site that are generated from the code, so they cannot drift.

A page asks for a generated part with a marker on a line of its own::

    <!-- aiorl:config-reference -->            every key `aiorl config keys` knows, by section
    <!-- aiorl:algorithm-keys NAME -->         NAME's model keys and its own agent defaults
    <!-- aiorl:algorithm-math NAME -->         the module docstring of aiorl/algos/NAME.py
    <!-- aiorl:algorithms -->                  the registry: one row and one page link per algorithm
    <!-- aiorl:metrics-reference -->           the metrics.jsonl keys of aiorl/io/metrics.py's docstring

The keys come from `aiorl.experiment.reference`, the module behind `aiorl config keys` and
`aiorl config ALGO` (no torch: it reads the config dataclasses and each algorithm's settings);
docstrings are read from the source with `ast`, without importing the module. An unknown
marker, or a generated part that comes out empty, fails the build.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]  # docs/hooks/generated.py -> the checkout
MARKER = re.compile(r"^<!-- aiorl:([\w-]+)(?: (\w+))? -->$", flags=re.M)


def on_config(config):
    # Document the checkout the site is built from, whatever aiorl the Python may have installed.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind not in GENERATORS:
            raise PluginError(f"{page.file.src_uri}: unknown marker aiorl:{kind} (known: {', '.join(GENERATORS)})")
        text = GENERATORS[kind](arg) if arg else GENERATORS[kind]()
        if not text.strip():
            raise PluginError(f"{page.file.src_uri}: aiorl:{kind} {arg or ''} generated nothing")
        return text

    try:
        return MARKER.sub(replace, markdown)
    except PluginError:
        raise
    except Exception as exc:  # an import or parse error: name the page, fail the build
        raise PluginError(f"{page.file.src_uri}: generating its reference failed: {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------------------- markdown helpers


def cell(text: object) -> str:
    """`text` for one table cell: code spans kept, everything else escaped, pipes escaped."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", r"\|"))
        else:
            part = html.escape(part, quote=False)
            out.append(re.sub(r"([\\*_\[\]|])", r"\\\1", part))
    return "".join(out)


def code(text: str) -> str:
    """`text` as an inline code span (double backticks when it holds one)."""
    text = str(text)
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", r"\|")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def module_docstring(relative: str) -> str:
    source = (ROOT / relative).read_text()
    text = ast.get_docstring(ast.parse(source, relative))
    if not text:
        raise PluginError(f"{relative} has no module docstring")
    return text


# ---------------------------------------------------------------------------- config keys


def _reference():
    from aiorl.experiment import reference

    return reference


def _key_rows(keys) -> list[tuple[str, ...]]:
    flow = _reference()._flow  # what `aiorl config ALGO` prints as the value
    return [(code(k.path), cell(k.type), code(flow(k.default)), cell(k.doc)) for k in keys]


HEADER = ("key", "type", "default", "what it does")


def config_reference() -> str:
    """Every dotted key of `aiorl config keys`: the shared sections, then each algorithm's model."""
    from aiorl.algos import available_algorithms, get_settings
    from aiorl.config import Config

    reference = _reference()
    listed = reference.all_keys()  # what `aiorl config keys` prints, one line per key
    shared = {k.path: k for k in reference.keys()}
    section_doc = {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(Config)}
    algos = available_algorithms()
    out = [
        "## `algo`\n",
        f"{cell(section_doc['algo'])} One of " + ", ".join(f"[`{a}`](../algorithms/{a}.md)" for a in algos) + ".\n",
    ]
    for section in reference.SECTIONS:
        keys = [shared[p] for p in listed if p.startswith(section + ".") and p in shared]
        out += [f"## `{section}`\n", cell(section_doc[section]) + "\n", table(HEADER, _key_rows(keys))]
    out += [
        "## `model`\n",
        cell(section_doc["model"])
        + " Each algorithm has its own keys; `aiorl config keys ALGO` lists them with the shared ones.\n",
    ]
    for algo in algos:
        keys = [k for k in reference.keys(algo) if k.path.startswith("model.")]  # `aiorl config ALGO`'s order
        out.append(f"### `{algo}` {{ #model-{algo} }}\n")
        out.append(f"The model section of [`{algo}`](../algorithms/{algo}.md).\n")
        out.append(table(HEADER, _key_rows(keys)) if keys else "No model keys.\n")
        defaults = get_settings(algo).agent_defaults
        if defaults:
            out.append(f"`{algo}` defaults these `agent` keys differently: {_values(defaults)}.\n")
    # Every key listed must have landed on the page: a key the loops above miss fails the build.
    text = "\n".join(out)
    missing = [p for p in listed if p != "algo" and code(p) not in text]
    if missing:
        raise PluginError(f"config reference: keys of `aiorl config keys` left out: {missing}")
    return text


def _values(agent_defaults: dict) -> str:
    """An algorithm's own defaults of `agent` keys (`AlgorithmSettings.agent_defaults`), as YAML."""
    flow = _reference()._flow
    return ", ".join(f"{code('agent.' + k)}: {code(flow(v))}" for k, v in agent_defaults.items())


def algorithm_keys(algo: str) -> str:
    """`algo`'s model keys with their defaults, and the agent keys it defaults differently."""
    from aiorl.algos import available_algorithms, get_settings

    if algo not in available_algorithms():
        raise PluginError(f"aiorl:algorithm-keys: no algorithm {algo!r} in the registry")
    keys = [k for k in _reference().keys(algo) if k.path.startswith("model.")]
    out = [table(HEADER, _key_rows(keys)) if keys else "No model keys.\n"]
    defaults = get_settings(algo).agent_defaults
    if defaults:
        out.append(f"Its own defaults of shared keys: {_values(defaults)}.\n")
    out.append(
        f"The shared sections (`env`, `cluster`, `agent`, `run`) are in the [config reference]"
        f"(../reference/config.md); `aiorl config {algo}` prints every key with its default.\n"
    )
    return "\n".join(out)


def algorithm_math(algo: str) -> str:
    """The module docstring of the algorithm, which states what it computes."""
    from aiorl.algos import available_algorithms

    if algo not in available_algorithms():
        raise PluginError(f"aiorl:algorithm-math: no algorithm {algo!r} in the registry")
    text = module_docstring(f"aiorl/algos/{algo}.py")
    return f"From the module docstring of `aiorl/algos/{algo}.py`:\n\n" + _quote(text)


def _quote(text: str) -> str:
    """A docstring as Markdown: its indented blocks (formulas) become code blocks, the rest text."""
    out, block = [], []

    def flush():
        if block:
            width = min(len(line) - len(line.lstrip()) for line in block if line.strip())
            body = "\n".join(line[width:] for line in block).strip("\n")
            out.extend(["", "```text", body, "```", ""])
            block.clear()

    lines = text.splitlines()
    for i, line in enumerate(lines):
        indented = line.startswith("    ") and not line.lstrip().startswith("- ")
        previous_blank = i == 0 or not lines[i - 1].strip()
        if indented and (block or previous_blank):
            block.append(line)
        elif block and not line.strip():
            block.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out).strip() + "\n"


def algorithms() -> str:
    """The registry as a table: each algorithm, the first line of its docstring, its page."""
    from aiorl.algos import available_algorithms, get_settings
    from aiorl.experiment.loading import load_config

    rows = []
    for algo in available_algorithms():
        first = module_docstring(f"aiorl/algos/{algo}.py").split("\n\n")[0]
        settings = get_settings(algo)
        data = {"algo": algo, "offline": {"dataset": "x"}} if settings.offline_only else {"algo": algo}
        cfg = load_config(data=data)  # its defaults (an offline algorithm's with a dataset named)
        if settings.offline_only:
            flow = "offline: a dataset, no actors"
        elif settings.is_synchronous(cfg):
            flow = "synchronous: work items" if settings.work_items(cfg) else "synchronous: rollouts, barrier"
        else:
            flow = "asynchronous: trajectory queue" if settings.fragment_queue(cfg) else "asynchronous: replay"
        rows.append((f"[`{algo}`]({algo}.md)", cell(first), flow))
    return table(("algo", "what it is", "data flow"), rows)


# ---------------------------------------------------------------------------- metrics


def metrics_reference() -> str:
    """The key table of aiorl/io/metrics.py's docstring (an RST simple table) as Markdown."""
    text = module_docstring("aiorl/io/metrics.py")
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+ +=+", line.strip())]
    if len(rules) != 2:
        raise PluginError("aiorl/io/metrics.py: its docstring no longer holds one '=== ===' table of row keys")
    start, end = rules
    width = lines[start].index(" ", lines[start].index("="))
    width = len(lines[start]) - len(lines[start][width:].lstrip())  # where the second column starts
    rows: list[list[str]] = []
    for line in lines[start + 1 : end]:
        key, meaning = line[:width].strip(), line[width:].strip()
        if key:
            rows.append([key, meaning])
        elif rows:
            rows[-1][1] += " " + meaning
    before = "\n".join(lines[:start]).split("\n\n", 1)[1]  # without the first line, the page's title
    after = "\n".join(lines[end + 1 :]).strip()
    keys = [(", ".join(code(k.strip()) for k in key.split(",")), cell(meaning)) for key, meaning in rows]
    parts = [cell_paragraphs(before), table(("key", "meaning"), keys)]
    if after:
        parts.append(cell_paragraphs(after))
    return "\n".join(parts)


def cell_paragraphs(text: str) -> str:
    """Prose of a docstring (RST's ``double`` backticks as Markdown code), paragraph by paragraph."""
    return "\n\n".join(cell(re.sub(r"``([^`]+)``", r"`\1`", p)) for p in text.split("\n\n") if p.strip()) + "\n"


GENERATORS = {
    "config-reference": config_reference,
    "algorithm-keys": algorithm_keys,
    "algorithm-math": algorithm_math,
    "algorithms": algorithms,
    "metrics-reference": metrics_reference,
}

"""The README and the documentation site's pages tell the truth (issues 15, 27): the keys, metric
names, algorithms and cheap commands they show are checked against the code, so they cannot drift.
(What the site generates from the code is checked by tests/tooling/test_docs_site.py.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from aiorl.algos import available_algorithms
from aiorl.experiment import reference as config_reference
from aiorl.io.metrics import ROW_KEYS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))}
DOCS = "\n".join([README, *PAGES.values()])  # every fence closes within its file
SECTIONS = ("env", "cluster", "agent", "model", "run")
FILES = {"run.json"}  # dotted names the README shows that are files, not keys


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOCS, flags=re.S | re.M)


def dotted_keys() -> set[str]:
    """Every `section.key` the README and the pages show: in code spans, --set, and YAML-ish
    `key: value` spans."""
    found = set()
    texts = code_spans(DOCS) + blocks("bash")
    for text in texts:
        for section, key in re.findall(rf"(?<![\w./-])({'|'.join(SECTIONS)})\.([A-Za-z_][\w*]*)", text):
            if f"{section}.{key}" not in FILES:
                found.add(f"{section}.{key}")
    return found


def matches(pattern: str, keys) -> bool:
    return any(re.fullmatch(re.escape(pattern).replace(r"\*", r"\w+"), k) for k in keys)


def test_every_dotted_key_the_readme_shows_exists():
    real = config_reference.all_keys()
    shown = dotted_keys()
    assert len(shown) > 20  # the pattern finds them at all
    missing = sorted(k for k in shown if not matches(k, real))
    assert not missing, f"README shows keys that do not exist: {missing}"


def test_the_readmes_algorithm_table_names_every_algorithm_and_its_page():
    # The README's table of algorithms: every registered one, and nothing else, each linking its page.
    rows = re.findall(r"^\| \[`(\w+)`\]\(docs/algorithms/(\w+)\.md\) \|", README, flags=re.M)
    assert {name for name, _ in rows} == set(available_algorithms())
    assert all(name == page for name, page in rows)
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    names = set(available_algorithms())
    families = {"Ape-X": {"apex_dqn", "apex_ddpg"}, "distributed PPO": {"dppo"}, "ES": {"es"}, "IMPALA": {"impala"}}
    for phrase, algos in families.items():
        if phrase in description or phrase in README.split("## Running")[0]:
            assert algos & names, f"{phrase!r} is advertised, but no such algorithm is registered"


def test_the_readmes_links_into_the_docs_lead_to_pages():
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), f"README links {target}, which does not exist"


def learner_metric_names() -> set[str]:
    """Names learners report (`learner/<name>`): string literals of the algorithms and the learner runtime."""
    sources = [
        *(ROOT / "aiorl" / "algos").glob("*.py"),
        ROOT / "aiorl" / "runtime" / "learner.py",
        ROOT / "aiorl" / "runtime" / "fragments.py",
    ]  # the policy lag learners report (IMPALA)
    return {m for path in sources for m in re.findall(r"[\"']([\w/]+)[\"']", path.read_text())}


def test_metric_names_the_readme_and_the_pages_give_are_real_keys():
    paragraph = DOCS[DOCS.index("`metrics.jsonl` gets one row") :]
    paragraph = paragraph[: paragraph.index("so metrics cost no extra messages")]
    shown = [s for s in code_spans(paragraph) if re.fullmatch(r"[\w/]*\w", s) and s not in available_algorithms()]
    assert len(shown) > 10
    emitted = learner_metric_names()
    for name in shown:
        if name.startswith("learner/"):
            assert name.split("/", 1)[1] in emitted, f"no learner reports {name}"
        else:
            assert name in ROW_KEYS or name in ("metrics.jsonl",), f"{name} is not a metrics.jsonl key"
    for name in re.findall(r"`(learner/[\w/]+)`", DOCS):
        assert name.split("/", 1)[1] in emitted, f"no learner reports {name}"


CHEAP = ("aiorl --help", "aiorl --version", "aiorl config ", "aiorl run --help")


def cheap_commands() -> list[str]:
    commands = []
    for block in blocks("bash"):
        for line in block.splitlines():
            command = line.split("  #")[0].strip().split(" > ")[0]
            if command.startswith(CHEAP) and command not in commands:
                commands.append(command)
    return commands


@pytest.mark.parametrize("command", cheap_commands())
def test_the_readmes_cheap_commands_work_as_written(command):
    argv = shlex.split(command)
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout


def test_the_readmes_config_error_transcript_is_what_aiorl_prints():
    transcript = re.search(r"^\$ (aiorl run [^\n]*batch_sise[^\n]*)\n([^\n]+)\n", README, flags=re.M)
    assert transcript, "the README no longer shows what a config error looks like"
    command, expected = transcript.groups()
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", *shlex.split(command)[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(expected.removesuffix("...)")), (expected, result.stderr)


def test_the_readmes_python_example_uses_the_real_api():
    import aiorl

    sources = blocks("python")
    assert sources
    for source in sources:
        compile(source, "README.md", "exec")
        for name in set(re.findall(r"\baiorl\.(\w+)", source)):
            assert hasattr(aiorl, name), name


def test_the_makefile_variables_and_targets_the_readme_documents_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"^make ([\w-]+)", "\n".join(blocks("bash")), flags=re.M)):
        assert re.search(rf"^{target}:", makefile, flags=re.M), (
            f"make {target} is documented, the Makefile has no such target"
        )
    for name in set(re.findall(r"make setup (\w+)=", DOCS)):
        assert re.search(rf"^{name}\s*\?=", makefile, flags=re.M), name

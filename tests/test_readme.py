"""The README tells the truth (issue 15): its keys, metric names, algorithms and cheap commands
are checked against the code, so it cannot drift."""

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

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SECTIONS = ("env", "cluster", "agent", "model", "run")
FILES = {"run.json"}  # dotted names the README shows that are files, not keys


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def dotted_keys() -> set[str]:
    """Every `section.key` the README shows: in code spans, --set, and YAML-ish `key: value` spans."""
    found = set()
    texts = code_spans(README) + blocks("bash")
    for text in texts:
        for section, key in re.findall(rf"(?<![\w./-])({'|'.join(SECTIONS)})\.([A-Za-z_][\w*]*)", text):
            if f"{section}.{key}" not in FILES:
                found.add(f"{section}.{key}")
    return found


def table_keys() -> dict[str, set[str]]:
    """The config table: section -> the keys its row names."""
    rows = {}
    for section, cells in re.findall(r"^\| `(\w+)` \| (.*) \|$", README, flags=re.M):
        rows[section] = set(code_spans(cells))
    return rows


def matches(pattern: str, keys) -> bool:
    return any(re.fullmatch(re.escape(pattern).replace(r"\*", r"\w+"), k) for k in keys)


def test_every_dotted_key_the_readme_shows_exists():
    real = config_reference.all_keys()
    shown = dotted_keys()
    assert len(shown) > 20  # the pattern finds them at all
    missing = sorted(k for k in shown if not matches(k, real))
    assert not missing, f"README shows keys that do not exist: {missing}"


def test_the_key_table_names_real_keys_and_every_shared_key():
    rows = table_keys()
    assert set(rows) >= {"algo", "env", "cluster", "agent", "model", "run"}
    real = config_reference.all_keys()
    for section in ("env", "cluster", "agent", "run"):
        names = {k.split(".", 1)[1] for k in real if k.startswith(section + ".")}
        shown = {c for c in rows[section] if re.fullmatch(r"[\w*]+", c)}
        assert not [c for c in shown if not matches(c, names)], (section, shown - names)
        unlisted = sorted(n for n in names if not any(matches(c, [n]) for c in shown))
        assert not unlisted, f"README's {section} row leaves out {unlisted}"
    model_keys = {k.split(".", 1)[1] for k in real if k.startswith("model.")}
    listed = {c for c in rows["model"] if re.fullmatch(r"\w+", c)} - set(available_algorithms())
    assert listed <= model_keys, listed - model_keys


def test_the_readme_and_pyproject_name_only_algorithms_that_exist():
    names = set(available_algorithms())
    assert set(code_spans(table_keys_row("algo"))) == names  # every one, and nothing else
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    families = {"Ape-X": {"apex_dqn", "apex_ddpg"}, "distributed PPO": {"dppo"}, "ES": {"es"}, "IMPALA": {"impala"}}
    for phrase, algos in families.items():
        if phrase in description or phrase in README.split("## Running")[0]:
            assert algos & names, f"{phrase!r} is advertised, but no such algorithm is registered"


def table_keys_row(section: str) -> str:
    return re.search(rf"^\| `{section}` \| (.*) \|$", README, flags=re.M).group(1)


def learner_metric_names() -> set[str]:
    """Names learners report (`learner/<name>`): string literals of the algorithms and the learner runtime."""
    sources = [
        *(ROOT / "aiorl" / "algos").glob("*.py"),
        ROOT / "aiorl" / "runtime" / "learner.py",
        ROOT / "aiorl" / "runtime" / "fragments.py",
    ]  # the policy lag learners report (IMPALA)
    return {m for path in sources for m in re.findall(r"[\"']([\w/]+)[\"']", path.read_text())}


def test_metric_names_the_readme_gives_are_real_keys():
    paragraph = README[README.index("`metrics.jsonl` gets one row") :]
    paragraph = paragraph[: paragraph.index("so metrics cost no extra messages")]
    shown = [s for s in code_spans(paragraph) if re.fullmatch(r"[\w/]*\w", s) and s not in available_algorithms()]
    assert len(shown) > 10
    emitted = learner_metric_names()
    for name in shown:
        if name.startswith("learner/"):
            assert name.split("/", 1)[1] in emitted, f"no learner reports {name}"
        else:
            assert name in ROW_KEYS or name in ("metrics.jsonl",), f"{name} is not a metrics.jsonl key"
    for name in re.findall(r"`(learner/[\w/]+)`", README):
        assert name.split("/", 1)[1] in emitted, f"no learner reports {name}"


CHEAP = ("aiorl --help", "aiorl --version", "aiorl config ", "aiorl run --help")


def cheap_commands() -> list[str]:
    commands = []
    for block in blocks("bash"):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command.startswith(CHEAP):
                commands.append(command.split(" > ")[0])
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


def test_the_makefile_variables_the_readme_documents_exist():
    makefile = (ROOT / "Makefile").read_text()
    for name in set(re.findall(r"make setup (\w+)=", README)):
        assert re.search(rf"^{name}\s*\?=", makefile, flags=re.M), name

"""The mutants runner (tests/mutants.py) on a tiny project of its own: it reports killed and
survived mutants, always restores the file byte for byte (also on Ctrl-C), and refuses a
definition whose `old` text is not found exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mutants
import psutil
import pytest
from cluster_helpers import wait_for

RUNNER = Path(mutants.__file__)
# CRLF, no final newline, a non-ASCII byte: whatever the file holds comes back as it was.
CALC = "# calc\r\ndef add(a, b):\r\n    return a + b\r\n\r\nx = 1\r\nx = 1\r\nname = 'café'".encode()


def project(tmp_path: Path, defs: dict[str, list[dict]]) -> tuple[Path, Path]:
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:asyncio\n")
    (root / "conftest.py").write_text("")  # puts the root on sys.path
    (root / "calc.py").write_bytes(CALC)
    (root / "tests" / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / "tests" / "test_slow.py").write_text(
        textwrap.dedent("""
        import os, pathlib, time
        import calc

        def test_waits():
            pathlib.Path(os.environ["MUTANT_STARTED"]).write_text("started")
            time.sleep(120)
    """)
    )
    d = root / "defs"
    d.mkdir()
    for name, items in defs.items():
        (d / f"{name}.py").write_text(f"MUTANTS = {items!r}\n")
    return root, d


def mutant(name, old="return a + b", new="return a - b", tests=("tests/test_calc.py",), path="calc.py"):
    return dict(name=name, path=path, old=old, new=new, tests=list(tests))


@pytest.fixture(autouse=True)
def quick_inner_pytest(monkeypatch):
    # The little project's tests need no plugins: skip loading them (seconds per run).
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_killed_and_survived_mutants_and_the_file_restored(tmp_path, capsys):
    root, defs = project(tmp_path, {"arith": [mutant("add_subtracts"), mutant("add_commutes", new="return b + a")]})
    out = tmp_path / "outcomes.json"
    code = mutants.main(["--root", str(root), "--defs", str(defs), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 1  # one survived
    assert (root / "calc.py").read_bytes() == CALC
    assert not (root / mutants.BACKUP_DIR).exists()  # the backup and its folders are gone
    result = json.loads(out.read_text())
    assert {o["name"]: o["status"] for o in result["outcomes"]} == {
        "add_subtracts": "killed",
        "add_commutes": "survived",
    }
    assert "kill rate 1/2 (50%)" in printed and "survived: add_commutes" in printed
    assert printed.splitlines()[0].startswith("killed ") and printed.splitlines()[0].endswith("add_subtracts")
    # --only picks one mutant by name, or a definition file by name.
    found = mutants.load_definitions(defs, root)
    assert [m.name for m in mutants.select(found, ["add_subtracts"])] == ["add_subtracts"]
    assert [m.name for m in mutants.select(found, ["arith.py"])] == ["add_subtracts", "add_commutes"]
    assert mutants.main(["--root", str(root), "--defs", str(defs), "--only", "arith", "--list"]) == 0
    assert "2 mutant(s)" in capsys.readouterr().out


def test_an_old_text_found_twice_or_never_is_refused_by_name(tmp_path, capsys):
    root, defs = project(
        tmp_path,
        {
            "bad": [mutant("twice", old="x = 1", new="x = 2"), mutant("never", old="return a * b")],
            "good": [mutant("fine")],
        },
    )
    with pytest.raises(mutants.DefinitionError) as info:
        mutants.load_definitions(defs, root)
    message = str(info.value)
    assert "bad.py: mutant 'twice': old text occurs 2 times in calc.py, expected exactly once" in message
    assert "bad.py: mutant 'never': old text occurs 0 times in calc.py" in message
    assert "fine" not in message
    assert mutants.main(["--root", str(root), "--defs", str(defs)]) == 2
    assert "mutants: refused: bad.py: mutant 'twice'" in capsys.readouterr().err
    assert (root / "calc.py").read_bytes() == CALC  # nothing was applied
    assert mutants.main(["--root", str(root), "--defs", str(defs), "--only", "nope"]) == 2


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(name="x", path="calc.py", old="return a + b", new="y"), "missing key(s) tests"),
        (mutant("x", path="../calc.py"), "path '../calc.py' is not a file under"),
        (mutant("x", new="return a + b"), "old and new are the same text"),
        (mutant("x", tests=["test_calc.py"]), "tests must be a non-empty list of pytest ids under tests/"),
    ],
)
def test_malformed_definitions_are_refused(tmp_path, bad, message):
    root, defs = project(tmp_path, {"bad": [bad]})
    with pytest.raises(
        mutants.DefinitionError,
        match=r"bad\.py: mutant 'x': " + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\."),
    ):
        mutants.load_definitions(defs, root)


def test_ctrl_c_while_a_mutant_runs_restores_the_file_and_ends_its_tests(tmp_path):
    root, defs = project(tmp_path, {"slow": [mutant("slow_one", tests=["tests/test_slow.py"])]})
    marker = tmp_path / "started"
    proc = subprocess.Popen(
        [sys.executable, str(RUNNER), "--root", str(root), "--defs", str(defs)],
        env={**os.environ, "MUTANT_STARTED": str(marker)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(marker.exists, 60, "the mutant's tests to start")
        assert (root / "calc.py").read_bytes() != CALC  # the mutant is applied now
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted by SIGINT; every file is restored" in err
    assert (root / "calc.py").read_bytes() == CALC
    wait_for(
        lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
        30,
        "the mutant's test run to end",
    )


def test_a_killed_runner_leaves_a_backup_the_next_run_restores(tmp_path, capsys):
    root, defs = project(tmp_path, {"arith": [mutant("add_subtracts")]})
    backup = root / mutants.BACKUP_DIR / "calc.py"
    backup.parent.mkdir(parents=True)
    backup.write_bytes(CALC)
    (root / "calc.py").write_bytes(CALC.replace(b"a + b", b"a - b"))  # as a SIGKILLed run leaves it
    assert mutants.main(["--root", str(root), "--defs", str(defs), "--list"]) == 0
    assert "restored calc.py from a previous run that was killed" in capsys.readouterr().err
    assert (root / "calc.py").read_bytes() == CALC and not (root / mutants.BACKUP_DIR).exists()

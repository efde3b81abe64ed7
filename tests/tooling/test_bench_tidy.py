"""bench/ stays tidy: its scripts share bench/common.py (repository path, JSON output with the
machine and its load, an `aiorl run` always ended, waiting, metrics rows) instead of their own
copies, edit no sys.path (each runs as `python bench/NAME.py`, its folder first on the path), keep
every function under 100 lines, and each one's --help runs."""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SHARED = {"common.py", "blas_one_thread.py"}  # modules the scripts import, not scripts themselves
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in SHARED)
PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)\s*\(|\+?=)|noqa:[^\n]*E402")


def load_common():
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_sys_path_edits_and_no_e402_noqa():
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(BENCH.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PATH_EDIT.search(line)
    ]
    assert found == []


def test_no_function_over_100_lines():
    long = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_writes_its_json_through_common(script):
    tree = ast.parse((BENCH / script).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    calls = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "common"
    }
    assert "common" in imported and "write_json" in calls


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_help_runs(script):
    out = subprocess.run(
        [sys.executable, f"bench/{script}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "usage:" in out.stdout, out.stdout + out.stderr


def test_every_json_gains_the_machine_block_a_list_under_rows(tmp_path):
    common = load_common()
    common.write_json(tmp_path / "r.json", {"rows": [1], "path": tmp_path}, load_before=(9.0, 8.0, 7.0))
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["rows"] == [1] and result["path"] == str(tmp_path)
    machine = result["machine"]
    assert machine["loadavg_before"] == [9.0, 8.0, 7.0] and len(machine["loadavg_after"]) == 3
    assert machine["cpus"] > 0 and machine["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {"torch", "numpy", "commit", "platform", "arch"} <= set(machine)
    common.write_json(tmp_path / "l.json", [{"example": "x"}])
    listed = json.loads((tmp_path / "l.json").read_text())
    assert listed["rows"] == [{"example": "x"}] and listed["machine"]["cpus"] > 0


def test_metrics_rows_leave_out_a_half_written_line(tmp_path):
    common = load_common()
    assert common.metrics_rows(tmp_path) == [] and common.last_metrics_row(tmp_path) == {}
    rows = [{"phase": "STARTING", "env_steps": 0}, {"phase": "RUNNING", "env_steps": 5}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"phase": "RUNNING", "env_st'
    (tmp_path / "metrics.jsonl").write_text(text)
    assert common.metrics_rows(tmp_path) == rows
    assert common.metrics_rows(tmp_path, "RUNNING") == rows[1:]
    assert common.last_metrics_row(tmp_path) == rows[1]


def test_wait_for_returns_the_first_true_value_or_none():
    common = load_common()
    values = iter([0, None, 7])
    assert common.wait_for(lambda: next(values), 5, 0.001) == 7
    assert common.wait_for(lambda: False, 0.05, 0.01) is None


def test_a_launch_is_always_ended(tmp_path):
    common = load_common()
    launch = common.Launch({"algo": "random_agent"}, tmp_path / "run", grace_s=10)
    config = json.loads((tmp_path / "run.json").read_text())
    assert config["run"]["dir"] == str(tmp_path / "run") and launch.command[-2:] == [
        str(tmp_path / "run.json"),
        "--quiet",
    ]
    assert common.Launch("x.yaml", tmp_path / "r2", ["a=1"]).command[-4:] == [
        "--set",
        "a=1",
        "--set",
        f"run.dir={tmp_path / 'r2'}",
    ]
    # The run itself stands in for a process that would go on: the exit ends it (SIGINT, as `aiorl run` stops).
    launch.command = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    launch.output = subprocess.PIPE
    with pytest.raises(RuntimeError), launch:
        assert launch.proc.stdout.readline().strip() == "up" and launch.running()
        raise RuntimeError("the bench broke mid-run")
    assert not launch.running() and launch.proc.returncode != 0

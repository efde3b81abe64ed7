"""aiorl.replay is the compiled extension, never a silent numpy fallback; the bench still runs."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import aiorl.replay as replay
from aiorl._ext import buffers, gae, nstep, sequence, sumtree

ROOT = Path(__file__).resolve().parents[2]


def test_public_api_is_backed_by_the_compiled_modules():
    assert replay.BACKEND == "cython"
    compiled = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for module in (buffers, gae, nstep, sequence, sumtree):
        assert module.__file__.endswith(compiled), module.__file__
    for name in (
        "SumTree",
        "ReplayBuffer",
        "PrioritizedReplayBuffer",
        "AggregateBuffer",
        "NStep",
        "n_step_adjustment",
        "n_step_flush",
        "SequenceAdder",
        "gae",
    ):
        assert getattr(replay, name).__module__.startswith("aiorl._ext."), name


def test_missing_extension_is_an_import_error_that_says_how_to_build():
    code = (
        "import sys; sys.modules['aiorl._ext.sumtree'] = None\n"
        "try:\n    import aiorl.replay\nexcept ImportError as exc:\n    print('IMPORT-ERROR', exc)\n"
        "else:\n    print('IMPORTED', aiorl.replay.BACKEND)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "IMPORT-ERROR" in out.stdout, out.stdout + out.stderr
    assert "build_ext --inplace" in out.stdout and "not a fallback" in out.stdout


def test_bench_quick_run_writes_its_table_and_json(tmp_path):
    """A smoke run of bench/replay.py (tiny sizes; no timing is checked)."""
    path = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # cpprb is a bench-only comparison (`make bench`): left out, the run says so and why.
    installed = importlib.util.find_spec("cpprb") is not None
    why = "--no-cpprb" if installed else "cpprb is not installed (make bench, or pip install 'aiorl[bench]')"
    out = subprocess.run(
        [
            sys.executable,
            "bench/replay.py",
            "--quick",
            "--no-large",
            "--json",
            str(path),
            *(["--no-cpprb"] if installed else []),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "learner step" in out.stdout and "aiorl/floor" in out.stdout
    result = json.loads(path.read_text())
    ops = {row["op"] for row in result["rows"]}
    assert {"add", "sample", "update", "learner step", "n-step", "gae"} <= ops
    for row in result["rows"]:
        assert row["aiorl"] > 0 and row["numpy"] > 0
    assert result["backend"] == "cython" and {t["name"] for t in result["targets"]}
    assert f"skipped: the cpprb comparisons ({why})" in out.stdout
    assert result["skipped"] == {"cpprb": why} and all(row["cpprb"] is None for row in result["rows"])

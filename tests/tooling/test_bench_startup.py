"""bench/startup.py stays runnable: its cheapest rows (the `aiorl config` commands beside the
import reference, one repeat) print the table and write the JSON with every row and number.
No wall-clock value is asserted; the run rows (real `aiorl run`s) are the bench's own job."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_rows_write_their_table_and_json(tmp_path):
    path = tmp_path / "startup.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "bench/startup.py", "--only", "config", "--repeats", "1", "--json", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "import torch, gymnasium" in out.stdout and "aiorl config apex_dqn" in out.stdout
    result = json.loads(path.read_text())
    ref = result["reference"]
    assert len(ref["times_s"]) == 1 and ref["median_s"] > 0
    names = [r["name"] for r in result["rows"]]
    assert names == ["aiorl config apex_dqn", "aiorl config show examples/dppo_cartpole.yaml"]
    for row in result["rows"]:
        assert row["row"] == "config" and row["target"] == "< 1 s"
        (col,) = row["variants"]
        assert col["errors"] == [], col["errors"]
        assert len(col["times_s"]) == 1 and col["median_s"] > 0 and col["ratio"] > 0
        assert isinstance(col["met"], bool)
    assert result["runs"] == {} and result["restart_runs"] == {}  # no `aiorl run` was started

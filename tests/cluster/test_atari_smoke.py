"""CI smoke test of pixels end to end: the Pong example, with a tiny budget, starts, streams
frames (each sent once), trains, checkpoints, exports, evaluates, and exits 0."""

import json
from pathlib import Path

import pytest
import yaml
from cluster_helpers import read_json, run

from aiorl.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster]


def test_pong_example_trains_checkpoints_and_evaluates(tmp_path, capsys):
    config = yaml.safe_load((ROOT / "examples" / "apex_dqn_pong.yaml").read_text())
    config["env"]["num_envs"] = 2
    config["cluster"]["memories"] = 2  # every actor batch goes to the other memory than the last
    config["agent"].update(
        buffer_size=2000, learning_starts=200, scheduled_global_steps=12, scheduled_timesteps=None, target_return=None
    )
    config["model"].update(device="cpu", sync_target_frequency=5)
    config["run"] = {"checkpoint_every": 6}
    code, out, run_dir = run(tmp_path, config, timeout_s=240)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["learner_steps"] >= 12
    actor = summary["roles"]["actor-0"]["stats"]
    transitions = sum(m["transitions"] for m in actor["memories"])
    assert transitions >= 200 and all(m["transitions"] > 0 for m in actor["memories"])
    # Frames sent once: one new 84x84 frame per step and env (+ the first), plus, in each batch
    # of 50 steps, the frames of the last stack and open n-step windows that went to the other
    # memory: stack 4 + n_step 3 - 1 per env.
    assert actor["frames_sent"] <= transitions * (1 + (4 + 3 - 1) / 50) + 2
    assert actor["payload_bytes"] / transitions <= 8 * 1024
    for m in range(2):
        memory = summary["roles"][f"memory-{m}"]["stats"]
        assert memory["inserted"] == actor["memories"][m]["transitions"]
        assert all(a["seq_errors"] == 0 and a["finished"] for a in memory["actors"].values())
    assert len(list((run_dir / "checkpoints").glob("checkpoint-*.pt"))) >= 2
    meta = json.loads((run_dir / "policy" / "policy.json").read_text())
    assert meta["observation_shape"] == [4, 84, 84] and meta["env_id"] == "ALE/Pong-v5"
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # A full game of Pong ends at 21 points: raw scores, no life-loss cuts.
    assert result["episodes"] == 1 and -21 <= result["returns"][0] <= 21 and result["lengths"][0] > 500

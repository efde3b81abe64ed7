"""Evaluation during training (aiorl.runtime.evaluator): the best policy kept, resume, the eval/* rows,
target_return on the evaluation return, `aiorl eval --best/--final`, `aiorl plot --metric eval/...`."""
import json
import re

import pytest
import torch

from aiorl.cli import main
from aiorl.config import load_config
from aiorl.evaluate import run_episodes, run_episodes_together
from aiorl.runtime.evaluator import BEST_DIR, EVAL_SEED_BASE, Evaluator, evaluation_metrics, read_best
from apex_helpers import make_algo
from cluster_helpers import read_json, run

META = {"observation_shape": [4], "observation_dtype": "float32"}


class Balance(torch.nn.Module):
    """Push toward the side the pole falls to: CartPole's classic hand policy (returns in the hundreds)."""

    def forward(self, obs):
        return (obs[:, 2] + obs[:, 3] > 0).long()


class Left(torch.nn.Module):
    """Always push left: the pole falls in about ten steps."""

    def forward(self, obs):
        return torch.zeros(obs.shape[0], dtype=torch.long)


def cartpole_cfg(tmp_path, **run_keys):
    algo = make_algo("apex_dqn", "CartPole-v1")
    cfg = algo.cfg
    cfg.run.eval_every, cfg.run.eval_episodes, cfg.run.seed = 100, 3, 7
    for key, value in run_keys.items():
        setattr(cfg.run, key, value)
    return cfg


def acting(module) -> tuple[torch.nn.Module, dict]:
    """What `LearnerCore.acting_policy` returns: the module and its policy.json meta."""
    return module, dict(META)


def test_the_best_evaluation_is_kept_not_the_last_and_a_resume_keeps_it(tmp_path):
    cfg = cartpole_cfg(tmp_path)
    policy_dir = tmp_path / "run" / "policy"
    ev = Evaluator(cfg, policy_dir)
    assert ev.best is None
    good = ev.run(*acting(Balance()), learner_steps=100, env_steps=1000)
    bad = ev.run(*acting(Left()), learner_steps=200, env_steps=2000)
    assert good["return_mean"] > 100 > bad["return_mean"]
    assert ev.last == bad and ev.best == good and ev.count == 2
    # policy/best/ holds the program that scored best, with the evaluation that chose it
    assert read_best(policy_dir) == good
    best = torch.export.load(str(policy_dir / BEST_DIR / "policy.pt2")).module()
    obs = torch.tensor([[0.0, 0.0, 0.1, 0.1]])
    assert int(best(obs)[0]) == 1  # Balance's answer; Left's is 0
    meta = json.loads((policy_dir / BEST_DIR / "policy.json").read_text())
    assert meta["evaluation"]["learner_steps"] == 100 and meta["observation_shape"] == [4]
    # A resumed run reads its best back: a worse evaluation does not replace it, a better one does
    again = Evaluator(cfg, policy_dir)
    assert again.best == good
    again.run(*acting(Left()), learner_steps=300, env_steps=3000)
    assert read_best(policy_dir) == good
    summary = again.summary()
    assert summary["best"] == good and summary["last"]["learner_steps"] == 300
    assert evaluation_metrics(summary)["eval/best_return_mean"] == good["return_mean"]


def test_evaluation_episodes_have_their_own_seeds(tmp_path):
    cfg = cartpole_cfg(tmp_path)
    ev = Evaluator(cfg, tmp_path / "policy")
    result = ev.run(*acting(Balance()), learner_steps=1, env_steps=1)
    assert result["seed"] == EVAL_SEED_BASE + cfg.run.seed
    by_hand = run_episodes(Balance(), cfg.env, 3, EVAL_SEED_BASE + cfg.run.seed)
    assert result["return_mean"] == pytest.approx(by_hand["mean"])
    other_seed = run_episodes(Balance(), cfg.env, 3, cfg.run.seed)
    assert other_seed["returns"] != by_hand["returns"]


def test_due_by_learner_steps_and_stopped_at_shutdown(tmp_path):
    import threading

    cfg = cartpole_cfg(tmp_path, eval_every=100)
    ev = Evaluator(cfg, tmp_path / "policy")
    assert not ev.due(99) and ev.due(100)
    ev.mark(100)
    assert not ev.due(150) and ev.due(200)
    stop = threading.Event()
    stop.set()
    assert run_episodes_together(Balance(), cfg.env, 3, 0, stop=stop) is None
    # side by side, the same episodes as one after another
    together = run_episodes_together(Balance(), cfg.env, 3, 5)
    assert together == run_episodes(Balance(), cfg.env, 3, 5)


@pytest.mark.parametrize("algo_name, env_id", [("apex_dqn", "CartPole-v1"), ("apex_ddpg", "Pendulum-v1"),
                                               ("dppo", "CartPole-v1"), ("es", "CartPole-v1"),
                                               ("impala", "CartPole-v1")])
def test_every_algorithms_export_evaluates(tmp_path, algo_name, env_id):
    algo = make_algo(algo_name, env_id)
    algo.cfg.run.eval_every, algo.cfg.run.eval_episodes = 1, 1
    policy = algo.make_learner(0, 1, seed=0).acting_policy()
    result = Evaluator(algo.cfg, tmp_path / "policy").run(*policy, learner_steps=1, env_steps=0)
    assert result["episodes"] == 1 and (tmp_path / "policy" / BEST_DIR / "policy.pt2").is_file()
    # the best kept is the module scored, exported: the same actions
    best = torch.export.load(str(tmp_path / "policy" / BEST_DIR / "policy.pt2")).module()
    obs = torch.zeros((3, *policy[1]["observation_shape"]))
    assert torch.equal(best(obs), policy[0](obs))


DQN = {
    "algo": "apex_dqn",
    "env": {"id": "CartPole-v1", "num_envs": 1},
    "cluster": {"actors": 1, "memories": 1, "learners": 1},
    "agent": {"sample_batch_size": 16, "batch_size": 32, "buffer_size": 5000, "learning_starts": 200,
              "publish_interval": 10, "scheduled_global_steps": 1_000_000, "target_return": 1.0},
    "model": {"network": ["linear:16", "relu"]},
    "run": {"eval_every": 40, "eval_episodes": 2, "seed": 3, "max_seconds": 90},
}


def test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best(tmp_path, capsys):
    # target_return 1: every CartPole policy scores more, so the first evaluation the coordinator
    # hears of ends the run (a training window of 100 episodes is far off; evaluations every 40
    # learner steps may outpace heartbeats); scheduled_global_steps never ends it.
    code, out, run_dir = run(tmp_path, DQN, timeout_s=200)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    stop = re.match(r"evaluation (\d+) \(learner step (\d+)\): mean return [-\d.]+ >= target_return 1", summary["stop_detail"])
    assert stop is not None, summary["stop_detail"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/return_mean" in r]
    assert len(evals) >= 1
    first = evals[0]
    assert first["eval/episodes"] == 2 and first["eval/learner_steps"] == int(stop[2]) >= 40
    assert first["eval/seed"] == EVAL_SEED_BASE + 3 and first["eval/return_std"] >= 0
    assert first["eval/best_return_mean"] >= first["eval/return_mean"]
    assert summary["evaluation"]["best"]["return_mean"] == first["eval/best_return_mean"]
    assert summary["roles"]["learner-0"]["stats"]["evaluation"]["count"] >= 1
    assert (run_dir / "policy" / "policy.pt2").is_file() and (run_dir / "policy" / BEST_DIR / "policy.pt2").is_file()
    assert not (run_dir / "policy" / ".eval").exists()

    # aiorl eval: the best by default, --final the final one, each named
    assert main(["eval", str(run_dir), "--episodes", "2", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["which"] == "best" and default["policy"].endswith("best/policy.pt2")
    assert default["chosen_by"]["learner_steps"] == 40
    assert main(["eval", str(run_dir), "--episodes", "2", "--final"]) == 0
    assert f"with the final policy {run_dir / 'policy' / 'policy.pt2'}" in capsys.readouterr().out
    assert main(["eval", str(run_dir), "--episodes", "2", "--best"]) == 0
    text = capsys.readouterr().out
    assert "with the best policy" in text and "chosen by evaluation 1 at learner step 40" in text

    # aiorl plot --metric eval/return_mean draws the evaluation rows
    assert main(["plot", str(run_dir), "--metric", "eval/return_mean", "-o", str(tmp_path / "eval.png")]) == 0
    assert (tmp_path / "eval.png").stat().st_size > 0


def test_best_on_a_run_without_a_best_policy_is_one_line_exit_2(tmp_path, capsys):
    algo = make_algo("apex_dqn", "CartPole-v1")
    algo.cfg.dump(tmp_path / "config.yaml")
    algo.make_learner(0, 1, seed=0).export_policy(str(tmp_path / "policy"))
    assert main(["eval", str(tmp_path), "--best"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--best:" in err and "no best policy" in err and "run.eval_every" in err
    assert main(["eval", str(tmp_path), "--episodes", "1", "--json"]) == 0  # no best: the final, said so
    assert json.loads(capsys.readouterr().out)["which"] == "final"
    assert main(["eval", str(tmp_path), "--best", "--policy", str(tmp_path / "policy" / "policy.pt2")]) == 2
    assert "give one of" in capsys.readouterr().err


def test_eval_keys_are_checked(tmp_path):
    from aiorl.config import ConfigError

    for key, value, expected in [("eval_every", 0, "run.eval_every: must be at least 1"),
                                 ("eval_interval_s", 0, "run.eval_interval_s: must be > 0"),
                                 ("eval_episodes", 0, "run.eval_episodes: must be at least 1")]:
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**DQN, "run": {key: value}}))
        with pytest.raises(ConfigError, match=expected):
            load_config(path)


def test_the_panel_shows_the_last_evaluation_until_the_next(tmp_path):
    import io

    from rich.console import Console

    from aiorl.progress import Progress, render_panel

    cfg = load_config(data={"algo": "apex_dqn"})
    progress = Progress(cfg, tmp_path, stream=io.StringIO())
    base = {"phase": "RUNNING", "env_steps": 100, "learner_steps": 10, "roles_alive": 3}
    rows = [{**base, "time_s": 1.0, "eval/return_mean": 321.5, "eval/return_std": 4.0, "eval/learner_steps": 1000,
             "eval/best_return_mean": 400.25}, {**base, "time_s": 2.0}]  # the second row has no evaluation
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    progress.update()
    console = Console(record=True, width=300, file=io.StringIO(), color_system=None)
    console.print(render_panel(progress.state))
    text = console.export_text()
    assert "last evaluation" in text and "321.50 ± 4.0 at step 1,000 (best 400.25)" in text

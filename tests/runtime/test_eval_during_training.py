"""Evaluation during training (aiorl.runtime.evaluator): the best policy kept, resume, the eval/* rows,
target_return on the evaluation return, `aiorl eval --best/--final`, `aiorl plot --metric eval/...`."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from apex_helpers import make_algo
from cluster_helpers import read_json, run, wait_for

from aiorl.cli.main import main
from aiorl.evaluation.episodes import run_episodes, run_episodes_together
from aiorl.experiment.loading import load_config
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.evaluator import BEST_DIR, EVAL_SEED_BASE, Evaluator, evaluation_metrics, read_best


class Balance(torch.nn.Module):
    """Push toward the side the pole falls to: CartPole's classic hand policy (returns in the hundreds)."""

    def forward(self, obs):
        return (obs[:, 2] + obs[:, 3] > 0).long()


def cartpole_cfg(tmp_path, **run_keys):
    algo = make_algo("apex_dqn", "CartPole-v1")
    cfg = algo.cfg
    cfg.run.eval_every, cfg.run.eval_episodes, cfg.run.seed = 100, 3, 7
    for key, value in run_keys.items():
        setattr(cfg.run, key, value)
    return cfg


def acting(cfg, rule: str) -> tuple[torch.nn.Module, dict]:
    """The DQN learner's own acting policy (what the evaluation process rebuilds), its weights set by
    hand: "balance" computes Balance's rule, "left" always pushes left (the pole falls in ~10 steps)."""
    policy, meta = build_algorithm(cfg).make_learner(0, 1, seed=0).acting_policy()
    first, second, value, advantage = [m for m in policy.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for layer in (first, second, value, advantage):
            layer.weight.zero_()
            layer.bias.zero_()
        if rule == "balance":  # Q(right) - Q(left) = relu(x2 + x3) - relu(-(x2 + x3)) = x2 + x3
            first.weight[0, 2:], first.weight[1, 2:] = 1.0, -1.0
            second.weight[0, 0] = second.weight[1, 1] = 1.0
            advantage.weight[1, 0] = advantage.weight[0, 1] = 1.0
        else:
            advantage.bias[0] = 1.0
    return policy, meta


def test_the_best_evaluation_is_kept_not_the_last_and_a_resume_keeps_it(tmp_path):
    cfg = cartpole_cfg(tmp_path)
    policy_dir = tmp_path / "run" / "policy"
    policy_dir.parent.mkdir(mode=0o700)  # the run directory, which a run always has
    ev = Evaluator(cfg, policy_dir)
    try:
        assert ev.best is None
        good = ev.run(*acting(cfg, "balance"), learner_steps=100, env_steps=1000)
        bad = ev.run(*acting(cfg, "left"), learner_steps=200, env_steps=2000)
    finally:
        ev.close()
    assert good["return_mean"] > 100 > bad["return_mean"]
    assert ev.last == bad and ev.count == 2
    # policy/best/ holds the program that scored best, with the evaluation that chose it (as the
    # evaluation process scored it: without what the learner adds, its lag and the best so far)
    recorded = read_best(policy_dir)
    assert recorded == ev.best and recorded["n"] == 1 and recorded.items() <= good.items() and "lag_s" in good
    best = torch.export.load(str(policy_dir / BEST_DIR / "policy.pt2")).module()
    obs = torch.tensor([[0.0, 0.0, 0.1, 0.1], [0.0, 0.0, -0.1, -0.1]])
    assert best(obs).tolist() == [1, 0]  # Balance's answers; Left's are [0, 0]
    meta = json.loads((policy_dir / BEST_DIR / "policy.json").read_text())
    assert meta["evaluation"]["learner_steps"] == 100 and meta["observation_shape"] == [4]
    # A resumed run reads its best back: a worse evaluation does not replace it, a better one does
    again = Evaluator(cfg, policy_dir)
    try:
        assert again.best == recorded
        again.run(*acting(cfg, "left"), learner_steps=300, env_steps=3000)
    finally:
        again.close()
    assert read_best(policy_dir) == recorded
    summary = again.summary()
    assert summary["best"] == recorded and summary["last"]["learner_steps"] == 300
    assert evaluation_metrics(summary)["eval/best_return_mean"] == good["return_mean"]


def test_evaluation_episodes_have_their_own_seeds(tmp_path):
    cfg = cartpole_cfg(tmp_path)
    ev = Evaluator(cfg, tmp_path / "policy")
    try:
        result = ev.run(*acting(cfg, "balance"), learner_steps=1, env_steps=1)
    finally:
        ev.close()
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


def test_an_interrupted_evaluation_is_not_recorded_and_close_ends_the_process(tmp_path):
    import threading

    cfg = cartpole_cfg(tmp_path, eval_episodes=100)  # 100 balancing episodes side by side: seconds
    ev = Evaluator(cfg, tmp_path / "policy")
    policy = acting(cfg, "balance")
    try:
        first = ev.run(*policy, learner_steps=1, env_steps=1)  # the process is up
        assert first is not None and first["worker_cpu_s"] > 0.5  # its imports alone take more
        worker = ev.worker.proc
        # run.eval_nice (default 10) above the learner's own: under contention training goes first
        # (taken once the process is warm: idle after its first evaluation, it traces an export)
        nicer = min(psutil.Process().nice() + 10, 19)
        wait_for(lambda: psutil.Process(worker.pid).nice() == nicer, 60, "the evaluation process at eval_nice")
        results = []
        scoring = threading.Thread(target=lambda: results.append(ev.run(*policy, learner_steps=2, env_steps=2)))
        scoring.start()
        time.sleep(0.3)  # inside the episodes: 100 of them take far longer
        ev.interrupt()
        scoring.join(timeout=60)
        assert results == [None] and ev.count == 1 and ev.last["learner_steps"] == 1
        assert worker.wait(timeout=30) == 0  # it exits once interrupted
        assert ev.run(*policy, learner_steps=3, env_steps=3) is None  # none starts after shutdown
    finally:
        ev.close()
    assert not ev.worker.dir.exists()


def test_the_evaluation_process_dies_with_a_learner_killed_outright(tmp_path):
    # Killed in the middle of an evaluation of minutes (20,000 balancing episodes): an idle worker
    # would end at its closed stdin anyway; a busy one only by PR_SET_PDEATHSIG.
    script = f"""
import sys, threading, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
from test_eval_during_training import acting, cartpole_cfg
from aiorl.runtime.evaluator import Evaluator
from pathlib import Path
cfg = cartpole_cfg(Path({str(tmp_path)!r}), eval_episodes=20_000)
ev = Evaluator(cfg, Path({str(tmp_path)!r}) / "policy")
ev.start()
threading.Thread(target=ev.run, args=acting(cfg, "balance"), kwargs=dict(learner_steps=1, env_steps=1)).start()
while not (ev.worker.dir / "state.npz").exists():  # the request is on its way
    time.sleep(0.05)
print(ev.worker.proc.pid, flush=True)
time.sleep(600)
"""
    learner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = psutil.Process(int(learner.stdout.readline()))
        assert worker.ppid() == learner.pid
    finally:
        learner.kill()
        learner.wait()
    try:
        worker.wait(timeout=30)  # psutil raises TimeoutExpired if it outlives the learner
    finally:
        if worker.is_running():
            worker.kill()  # a failed test leaves nothing behind either


SIGTERM_IN_WARM_UP = """
import json, os, signal, sys
from pathlib import Path

import numpy as np
import torch

from aiorl.evaluation import worker
from aiorl.evaluation.options import cpu_learner
from aiorl.experiment.loading import load_config

cfg = load_config(data={"algo": "apex_dqn", "env": {"id": "CartPole-v1"}, "run": {"eval_episodes": 1}})
policy, meta = cpu_learner(cfg).acting_policy()
policy = policy.train(False).requires_grad_(False)
policy_dir = Path(sys.argv[1])
state = policy_dir.parent / "state.npz"
np.savez(state, **{k: v.numpy() for k, v in policy.state_dict().items()})
r, w = os.pipe()
request = {"n": 1, "learner_steps": 1, "env_steps": 0, "copy_s": 0.0, "meta": meta, "best": None, "state": str(state)}
os.write(w, (json.dumps(request) + "\\n").encode())
stop = worker._Stop()
signal.signal(signal.SIGTERM, stop.on_sigterm)

warmed = []


def warm():  # the learner's SIGTERM arrives as the warm-up starts its imports: they must go on
    os.kill(os.getpid(), signal.SIGTERM)
    import torch._dynamo  # noqa: F401

    warmed.append(True)


with open(os.devnull, "w") as replies:
    worker.serve(policy, cfg, worker._Requests(r), replies, policy_dir, stop, warm)
print("served", "warmed" if warmed else "cut short")
"""


def test_a_sigterm_in_the_warm_up_still_exports_the_best_waiting_for_it(tmp_path):
    # The learner's close() sends SIGTERM right after the reply of a best; the worker, still in its
    # warm-up imports (torch._dynamo's, most of a second), must finish them and export that best.
    policy_dir = tmp_path / "policy"
    out = subprocess.run(
        [sys.executable, "-c", SIGTERM_IN_WARM_UP, str(policy_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "served warmed" in out.stdout, out.stdout + out.stderr[-3000:]
    assert (policy_dir / BEST_DIR / "policy.pt2").is_file(), out.stderr[-3000:]


@pytest.mark.parametrize(
    "algo_name, env_id",
    [
        ("apex_dqn", "CartPole-v1"),
        ("apex_ddpg", "Pendulum-v1"),
        ("dppo", "CartPole-v1"),
        ("es", "CartPole-v1"),
        ("impala", "CartPole-v1"),
    ],
)
def test_every_algorithms_export_evaluates(tmp_path, algo_name, env_id):
    algo = make_algo(algo_name, env_id)
    algo.cfg.run.eval_every, algo.cfg.run.eval_episodes = 1, 1
    # Other weights and buffers than the evaluation process's own module (built with seed 0): the
    # scored policy must be the one sent.
    policy = algo.make_learner(0, 1, seed=1).acting_policy()
    with torch.no_grad():
        for buffer in policy[0].buffers():
            if buffer.is_floating_point():
                buffer.add_(0.5)
    ev = Evaluator(algo.cfg, tmp_path / "policy")
    try:
        result = ev.run(*policy, learner_steps=1, env_steps=0)
    finally:
        ev.close()
    assert result["episodes"] == 1 and (tmp_path / "policy" / BEST_DIR / "policy.pt2").is_file()
    # the best kept is the module scored, exported: the same actions
    best = torch.export.load(str(tmp_path / "policy" / BEST_DIR / "policy.pt2")).module()
    obs = torch.randn((64, *policy[1]["observation_shape"]), generator=torch.Generator().manual_seed(0))
    assert torch.equal(best(obs), policy[0](obs))


DQN = {
    "algo": "apex_dqn",
    "env": {"id": "CartPole-v1", "num_envs": 1},
    "cluster": {"actors": 1, "memories": 1, "learners": 1},
    "agent": {
        "sample_batch_size": 16,
        "batch_size": 32,
        "buffer_size": 5000,
        "learning_starts": 200,
        "publish_interval": 10,
        "scheduled_global_steps": 1_000_000,
        "target_return": 1.0,
    },
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
    stop = re.match(
        r"evaluation (\d+) \(learner step (\d+)\): mean return [-\d.]+ >= target_return 1", summary["stop_detail"]
    )
    assert stop is not None, summary["stop_detail"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/return_mean" in r]
    assert len(evals) >= 1
    first = evals[0]
    assert first["eval/episodes"] == 2 and first["eval/learner_steps"] == int(stop[2]) >= 40
    assert first["eval/seed"] == EVAL_SEED_BASE + 3 and first["eval/return_std"] >= 0
    assert first["eval/best_return_mean"] >= first["eval/return_mean"]
    # the final evaluation may beat the first: the best never goes down
    assert summary["evaluation"]["best"]["return_mean"] >= first["eval/best_return_mean"]
    assert summary["roles"]["learner-0"]["stats"]["evaluation"]["count"] >= 1
    # The run ended by its criterion: learner 0 scored the final policy too, and the best is chosen
    # among every evaluation up to it.
    last, best = summary["evaluation"]["last"], summary["evaluation"]["best"]
    assert last["learner_steps"] == summary["learner_steps"] > first["eval/learner_steps"]
    assert last["n"] == summary["evaluation"]["count"] >= 2
    assert best["return_mean"] >= max(last["return_mean"], first["eval/return_mean"])
    assert (run_dir / "policy" / "policy.pt2").is_file() and (run_dir / "policy" / BEST_DIR / "policy.pt2").is_file()
    assert not (run_dir / "policy" / ".eval").exists()
    assert not list(run_dir.glob(".evaluation-*"))  # the evaluation process was ended and cleaned up

    # aiorl status of the finished run: the best evaluation beside the training return
    assert main(["status", str(run_dir)]) == 0
    status = capsys.readouterr().out
    assert f"evaluation: best {best['return_mean']:.2f} ± {best['return_std']:.1f} at learner step " in status

    # aiorl eval: the best by default, --final the final one, each named
    assert main(["eval", str(run_dir), "--episodes", "2", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["which"] == "best" and default["policy"].endswith("best/policy.safetensors")
    assert default["chosen_by"] == best
    assert main(["eval", str(run_dir), "--episodes", "2", "--final"]) == 0
    assert f"with the final policy {run_dir / 'policy' / 'policy.safetensors'}" in capsys.readouterr().out
    assert main(["eval", str(run_dir), "--episodes", "2", "--best"]) == 0
    text = capsys.readouterr().out
    assert (
        "with the best policy" in text
        and f"chosen by evaluation {best['n']} at learner step {best['learner_steps']}" in text
    )

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

    for key, value, expected in [
        ("eval_every", 0, "run.eval_every: must be at least 1"),
        ("eval_interval_s", 0, "run.eval_interval_s: must be > 0"),
        ("eval_episodes", 0, "run.eval_episodes: must be at least 1"),
        ("eval_nice", 20, "run.eval_nice: expected 0 to 19, got 20"),
    ]:
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**DQN, "run": {key: value}}))
        with pytest.raises(ConfigError, match=expected):
            load_config(path)


def test_the_panel_shows_the_last_evaluation_until_the_next(tmp_path):
    import io

    from rich.console import Console

    from aiorl.launch.panel import Progress, render_panel

    cfg = load_config(data={"algo": "apex_dqn"})
    progress = Progress(cfg, tmp_path, stream=io.StringIO())
    base = {"phase": "RUNNING", "env_steps": 100, "learner_steps": 10, "roles_alive": 3}
    rows = [
        {
            **base,
            "time_s": 1.0,
            "eval/return_mean": 321.5,
            "eval/return_std": 4.0,
            "eval/learner_steps": 1000,
            "eval/best_return_mean": 400.25,
        },
        {**base, "time_s": 2.0},
    ]  # the second row has no evaluation
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    progress.update()
    console = Console(record=True, width=300, file=io.StringIO(), color_system=None)
    console.print(render_panel(progress.state))
    text = console.export_text()
    assert "last evaluation" in text and "321.50 ± 4.0 at step 1,000 (best 400.25)" in text


def test_a_resumed_run_keeps_the_best_of_its_earlier_launch(tmp_path):
    # Both launches end at their first evaluation the coordinator hears of (target_return 1).
    code, out, run_dir = run(tmp_path, DQN, timeout_s=200)
    assert code == 0, out
    first = read_json(run_dir / "summary.json")
    record = run_dir / "policy" / BEST_DIR / "policy.json"
    program = (run_dir / "policy" / BEST_DIR / "policy.pt2").read_bytes()
    meta = json.loads(record.read_text())
    meta["evaluation"]["return_mean"] = 1e6  # a best that no evaluation of the second launch beats
    record.write_text(json.dumps(meta))

    resumed = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["attempt"] == 2 and summary["learner_steps"] > first["learner_steps"]
    assert summary["evaluation"]["best"]["return_mean"] == 1e6
    # the second launch evaluated, counting learner steps on from the first
    assert summary["evaluation"]["last"]["learner_steps"] > first["evaluation"]["last"]["learner_steps"]
    assert 1 <= summary["evaluation"]["last"]["return_mean"] < 1e6
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    second = [r for r in rows if r.get("attempt") == 2 and "eval/return_mean" in r]
    assert second and all(r["eval/best_return_mean"] == 1e6 for r in second)
    # the earlier launch's best policy is still the one kept
    assert (run_dir / "policy" / BEST_DIR / "policy.pt2").read_bytes() == program
    assert json.loads(record.read_text())["evaluation"]["return_mean"] == 1e6

"""bench/offline.py without d3rlpy: its arguments, the d3rlpy config it derives from aiorl's, the
numbers of a side's row, its two tables, and the .npz it hands d3rlpy's worker. No run is started
and no wall-clock value is asserted (the bench's own job)."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench(monkeypatch):
    """bench/offline.py as `python bench/offline.py` sees it: bench/ first on the path (here for
    this test only), so that its `import common` and `offline_peer` resolve."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setitem(sys.modules, "common", load_module("bench_common", "common.py"))
    return load_module("bench_offline", "offline.py", monkeypatch)


def load_module(name: str, file: str, monkeypatch=None):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / file)
    module = importlib.util.module_from_spec(spec)
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_arguments_default_to_every_case_on_the_same_evaluation(monkeypatch):
    bench = load_bench(monkeypatch)
    args = bench.parse_args([])
    assert args.cases == ["bc", "bcq", "cql", "marwil", "iql", "marwil_pendulum"]
    assert (args.eval_episodes, args.eval_every, args.eval_seed) == (20, 1000, 1_000_000)
    args = bench.parse_args(["--cases", "bcq", "iql", "--data", "CartPole-v1=d/cp", "--config", "iql=x.yaml"])
    assert args.cases == ["bcq", "iql"] and args.data == ["CartPole-v1=d/cp"] and args.config == ["iql=x.yaml"]
    assert bench.CASES["iql"].threshold == -200.0 and bench.CASES["bcq"].threshold == 475.0
    assert bench.CASES["marwil"].d3rlpy is None and "MARWIL" in bench.CASES["marwil"].why_not


@pytest.mark.parametrize(
    "argv", [["--data", "d/cp"], ["--data", "Acrobot-v1=d"], ["--config", "dqn=x.yaml"], ["--cases", "sac"]]
)
def test_a_bad_argument_is_refused(monkeypatch, capsys, argv):
    bench = load_bench(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_d3rlpy_gets_aiorls_knobs(monkeypatch):
    bench = load_bench(monkeypatch)
    assert bench.hidden_units(["linear:64", "relu", "linear:32", "relu"]) == [64, 32]
    assert bench.hidden_units([]) == [256, 256]
    model = SimpleNamespace(network=["linear:64", "relu"], learning_rate=5e-4, gamma=0.98, ratio_threshold=0.2)
    model.sync_target_frequency, model.adam_eps, model.grad_clip_norm = 100, 1e-5, 40.0
    model.behaviour_logit_penalty = 0.01
    cfg = SimpleNamespace(model=model, agent=SimpleNamespace(batch_size=128))
    params, hidden = bench.d3rlpy_params(bench.CASES["bcq"], cfg)
    assert params == {
        "batch_size": 128,
        "learning_rate": 5e-4,
        "gamma": 0.98,
        "target_update_interval": 100,
        "optim_factory": {"eps": 1e-5, "clip_grad_norm": 40.0},
        "action_flexibility": 0.2,
        "beta": 0.01,
    }
    assert hidden == {"default": [64]}
    iql = SimpleNamespace(actor_network=["linear:32", "relu"], critic_network=[], value_network=[], beta=2.0)
    iql.reward_scale = 0.1
    params, hidden = bench.d3rlpy_params(bench.CASES["iql"], SimpleNamespace(model=iql, agent=cfg.agent))
    assert params["weight_temp"] == 2.0 and params["batch_size"] == 128
    assert params["reward_scaler"] == {"multiply": 0.1}
    assert hidden["critic_encoder_factory"] == [32] and hidden["actor_encoder_factory"] == [32]


def test_a_row_reaches_the_threshold_at_its_first_point_at_or_above_it(monkeypatch):
    bench = load_bench(monkeypatch)
    points = [
        {"steps": 1000, "seconds": 3.0, "eval_mean": 200.0, "eval_std": 1.0},
        {"steps": 2000, "seconds": 5.0, "eval_mean": 475.0, "eval_std": 2.0},
        {"steps": 3000, "seconds": 7.0, "eval_mean": 480.0, "eval_std": 3.0},
        {"steps": 4000, "seconds": 9.0, "eval_mean": 300.0, "eval_std": 4.0},
    ]
    row = bench.summarize(points, 475.0, 10.0, 4000)
    assert (row["to_threshold_s"], row["steps_to_threshold"]) == (5.0, 2000)
    assert (row["final_return"], row["final_std"], row["best_return"]) == (300.0, 4.0, 480.0)
    assert row["total_s"] == 10.0
    assert bench.summarize(points, 500.0, 10.0, 4000)["to_threshold_s"] is None


def side(bench, library, final, reach, total, case="bcq"):
    points = [{"steps": 1000, "seconds": reach or total, "eval_mean": final, "eval_std": 0.0}]
    row = bench.summarize(points, 475.0 if reach else 1e9, total, 1000)
    return {"case": case, "env": "CartPole-v1", "library": library, "algorithm": "x", "batch_size": 64, **row}


def test_tables_show_both_sides_and_their_ratio(monkeypatch):
    bench = load_bench(monkeypatch)
    rows = [
        side(bench, "aiorl", 500.0, 10.0, 20.0),
        side(bench, "d3rlpy", 480.0, 40.0, 50.0),
        side(bench, "aiorl", 300.0, None, 30.0, case="cql"),
        side(bench, "d3rlpy", 490.0, 15.0, 60.0, case="cql"),
        {
            "case": "marwil",
            "env": "CartPole-v1",
            "library": "d3rlpy",
            "algorithm": None,
            "note": "d3rlpy has no MARWIL",
        },
    ]
    (bcq, cql) = bench.ratio_rows(rows)
    assert bcq["case"] == "bcq" and bcq["return_diff"] == 20.0
    assert bcq["to_threshold_ratio"] == 0.25 and bcq["total_ratio"] == 0.4 and bcq["reached"] == "yes/yes"
    assert cql["to_threshold_ratio"] is None and cql["total_ratio"] == 0.5 and cql["reached"] == "no/yes"
    table = bench.result_table(rows)
    assert "10.0 s (1000)" in table and "not reached" in table and "d3rlpy has no MARWIL" in table
    ratios = bench.ratio_table(rows)
    assert "0.25" in ratios and "+20.0" in ratios and "marwil" not in ratios


def test_the_npz_holds_the_same_rows_and_episodes(monkeypatch, tmp_path):
    load_bench(monkeypatch)
    from offline_peer.datasets import export_npz, heuristic_dataset

    for env_id in ("CartPole-v1", "Pendulum-v1"):
        dataset = heuristic_dataset(env_id, 700)
        data = np.load(export_npz(dataset, tmp_path / f"{env_id}.npz"))
        assert np.array_equal(data["observations"], dataset.obs) and np.array_equal(data["actions"], dataset.action)
        assert np.array_equal(data["rewards"], dataset.reward)
        assert np.array_equal(data["terminals"], dataset.terminated)
        ends = np.flatnonzero(data["terminals"] | data["timeouts"])
        assert np.array_equal(ends, dataset.episode_ends) and not (data["terminals"] & data["timeouts"]).any()
    assert int(data["action_size"]) == 1 and data["action_low"].tolist() == [-2.0]


def test_both_sides_are_scored_on_the_episodes_aiorl_eval_plays(monkeypatch):
    import torch

    from aiorl.config import EnvConfig
    from aiorl.evaluation.episodes import run_episodes

    load_bench(monkeypatch)
    from offline_peer.episodes import greedy_returns

    def act(obs):  # a poor policy, so that each episode's return depends on its start
        return (np.asarray(obs)[:, 2] > 0).astype(np.int64)

    ours = greedy_returns("CartPole-v1", act, 4, seed=7)
    theirs = run_episodes(lambda obs: torch.as_tensor(act(obs.numpy())), EnvConfig(id="CartPole-v1"), 4, 7)
    assert ours["mean"] == theirs["mean"] and ours["std"] == theirs["std"]
    assert greedy_returns("CartPole-v1", act, 4, seed=8)["mean"] != ours["mean"]

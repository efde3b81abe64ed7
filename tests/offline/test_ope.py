"""Off-policy evaluation (aiorl.ope, `aiorl ope`): IPS and DR unbiased on a small MDP whose value
is computed exactly; WIPS, SWIPS, DR and FQE within 10% of three CartPole policies' true
discounted return; the behaviour cloned when no propensity is recorded; the CLI's user errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from aiorl.cli import ope as cli_ope
from aiorl.cli.main import main
from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats import write_dataset
from aiorl.ope import estimate_all, evaluate_policy
from aiorl.ope.behaviour import CLONED, RECORDED
from aiorl.ope.training import OPE_KEYS, TrainingOpe
from aiorl.runtime.evaluator import describe, evaluation_row

# ---------------------------------------------------------------- a small MDP with an exact value

GAMMA = 0.9
HORIZON = 5  # an episode not terminated by then is truncated
S, A = 3, 2


def small_mdp(seed: int = 0):
    """Transition probabilities P[s, a, s'] (s' == S: terminal), rewards R[s, a], start d0, and
    a behaviour and a target policy [S, A] (the target prefers what the behaviour does less)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(S + 1), size=(S, A))
    r = rng.uniform(-1.0, 2.0, size=(S, A))
    d0 = np.array([0.6, 0.3, 0.1])
    behaviour = np.array([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]])
    target = np.array([[0.4, 0.6], [0.6, 0.4], [0.7, 0.3]])
    return p, r, d0, behaviour, target


def exact_value(p, r, d0, policy) -> float:
    """E[sum_{t<HORIZON} gamma^t r_t] under `policy`, by backward induction over the steps left."""
    v = np.zeros(S)
    for _ in range(HORIZON):
        q = r + GAMMA * p[:, :, :S] @ v
        v = (policy * q).sum(axis=1)
    return float(d0 @ v)


def mdp_dataset(p, r, d0, behaviour, episodes: int, rng) -> Dataset:
    rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "propensity")}
    for _ in range(episodes):
        s = rng.choice(S, p=d0)
        for t in range(HORIZON):
            a = rng.choice(A, p=behaviour[s])
            s2 = rng.choice(S + 1, p=p[s, a])
            values = (s, a, r[s, a], min(s2, S - 1), s2 == S, s2 != S and t == HORIZON - 1, behaviour[s, a])
            for key, value in zip(rows, values):
                rows[key].append(value)
            if s2 == S:
                break
            s = s2
    return Dataset(
        obs=np.array(rows["obs"], np.float32)[:, None],
        action=np.array(rows["action"], np.int64),
        reward=np.array(rows["reward"], np.float32),
        next_obs=np.array(rows["next_obs"], np.float32)[:, None],
        terminated=np.array(rows["terminated"], bool),
        truncated=np.array(rows["truncated"], bool),
        observation_space=gym.spaces.Box(0, S - 1, (1,), np.float32),
        action_space=gym.spaces.Discrete(A),
        propensity=np.array(rows["propensity"], np.float64),
    )


def test_ips_and_dr_are_unbiased_on_a_small_mdp():
    """Over many datasets the exact value is inside IPS's and DR's bootstrap intervals about as
    often as their level says, and the estimates' mean is the exact value (within 3 standard
    errors). DR's Q is deliberately wrong: DR corrects it."""
    p, r, d0, behaviour, target = small_mdp()
    truth = exact_value(p, r, d0, target)
    assert abs(truth - exact_value(p, r, d0, behaviour)) > 0.25  # off-policy: the behaviour's value differs
    wrong_q = np.array([[1.5, -0.5], [0.0, 2.0], [1.0, 1.0]])  # not the target's Q at any step
    rng = np.random.default_rng(1)
    datasets, covered, values = 150, {"ips": 0, "dr": 0}, {"ips": [], "dr": [], "wips": []}
    for k in range(datasets):
        ds = mdp_dataset(p, r, d0, behaviour, 100, rng)
        s = ds.obs[:, 0].astype(int)
        estimates = estimate_all(ds, target[s], ds.propensity, GAMMA, wrong_q[s], bootstrap=300, seed=k)
        for name in values:
            e = estimates[name]
            covered[name] = covered.get(name, 0) + (e.low <= truth <= e.high)
            values[name].append(e.value)
    print(
        {name: ((np.mean(v) - truth) / (np.std(v) / np.sqrt(datasets)), np.std(v)) for name, v in values.items()},
        covered,
    )
    for name in ("ips", "dr"):
        mean, se = np.mean(values[name]), np.std(values[name]) / np.sqrt(datasets)
        assert abs(mean - truth) < 3 * se, (name, mean, truth, se)
        assert covered[name] >= 0.85 * datasets, (name, covered[name], datasets)
    # Weighting trades a little bias for far less variance (not normalised, it would be IPS).
    assert np.std(values["wips"]) < 0.8 * np.std(values["ips"])


def test_bootstrap_intervals_are_seeded():
    p, r, d0, behaviour, target = small_mdp()
    ds = mdp_dataset(p, r, d0, behaviour, 60, np.random.default_rng(0))
    s = ds.obs[:, 0].astype(int)

    def intervals(seed):
        estimates = estimate_all(ds, target[s], ds.propensity, GAMMA, bootstrap=200, seed=seed)
        return {name: (e.low, e.high) for name, e in estimates.items()}

    assert intervals(4) == intervals(4) != intervals(5)
    assert set(intervals(4)) == {"ips", "sips", "wips", "swips"}  # no Q model: no DR, no FQE


# ---------------------------------------------------------------- CartPole, three target policies


def heuristic(obs: np.ndarray) -> np.ndarray:
    """Push the cart the way the pole falls (about 500 steps alone; far less epsilon-greedy)."""
    return (obs[..., 2] + 0.5 * obs[..., 3] > 0).astype(np.int64)


def heuristic_policy(obs):
    """`heuristic` as an exported policy acts: a batch of observations (a tensor) -> actions."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).long()


BEHAVIOUR_EPSILON = 0.6
TARGET_EPSILONS = (0.5, 0.6, 0.7)  # true discounted returns about 65, 51 and 38


def cartpole_episodes(epsilon: float, episodes: int, seed: int, record: bool):
    """(discounted returns at 0.99, a Dataset of the steps when `record`) of `heuristic` acting
    `epsilon`-greedy, with each action's probability recorded as its propensity."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "propensity")}
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        ret, discount, done = 0.0, 1.0, False
        while not done:
            greedy = int(heuristic(obs))
            action = greedy if rng.random() >= epsilon else int(rng.integers(2))
            next_obs, reward, terminated, truncated, _ = env.step(action)
            if record:
                p = 1 - epsilon + epsilon / 2 if action == greedy else epsilon / 2
                for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated, p)):
                    rows[key].append(value)
            ret, discount, done, obs = ret + discount * reward, discount * 0.99, terminated or truncated, next_obs
        returns.append(ret)
    if not record:
        return np.array(returns), None
    dataset = Dataset(
        **{k: np.array(rows[k], np.float32) for k in ("obs", "reward", "next_obs")},
        action=np.array(rows["action"], np.int64),
        terminated=np.array(rows["terminated"], bool),
        truncated=np.array(rows["truncated"], bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        propensity=np.array(rows["propensity"], np.float64),
        source="in-test CartPole",
    )
    return np.array(returns), dataset


@pytest.fixture(scope="module")
def cartpole_dataset():
    return cartpole_episodes(BEHAVIOUR_EPSILON, 600, seed=0, record=True)[1]


@pytest.mark.slow
def test_wips_dr_fqe_estimate_three_cartpole_policies_within_10_percent(cartpole_dataset):
    truths = {eps: cartpole_episodes(eps, 1000, seed=10**6, record=False)[0].mean() for eps in TARGET_EPSILONS}
    assert truths[0.5] > 1.2 * truths[0.6] > 1.44 * truths[0.7]  # an estimate off by 10% is told apart
    for eps, truth in truths.items():
        report = evaluate_policy(cartpole_dataset, heuristic_policy, target_epsilon=eps, bootstrap=100)
        assert report["behaviour"] == RECORDED
        for name in ("wips", "swips", "dr", "fqe"):
            value = report["estimates"][name]["value"]
            assert abs(value / truth - 1) < 0.10, (eps, name, value, truth)


def test_behaviour_is_cloned_when_no_propensity_is_recorded(cartpole_dataset):
    """Without propensities a cloned behaviour model stands in: the report says so, and the weighted
    estimate of a target near the behaviour is still close to its return."""
    unrecorded = cartpole_dataset.slice(0, len(cartpole_dataset))
    unrecorded.propensity = None
    truth = cartpole_episodes(0.7, 1000, seed=10**6, record=False)[0].mean()
    report = evaluate_policy(unrecorded, heuristic_policy, target_epsilon=0.7, bootstrap=0, fqe=None)
    assert report["behaviour"] == CLONED
    assert set(report["estimates"]) == {"ips", "sips", "wips", "swips"}
    assert report["estimates"]["wips"]["low"] is None  # no resamples, no interval
    assert abs(report["estimates"]["wips"]["value"] / truth - 1) < 0.15


# ---------------------------------------------------------------- aiorl ope

POLICY = Path(__file__).resolve().parents[2] / "examples" / "policies" / "cartpole_dqn_200"


def serve_dataset(monkeypatch, dataset_or_error):
    """`aiorl ope`'s dataset reader answers with this dataset (or raises this error)."""

    def load_dataset(source, fmt=None, **_):
        if isinstance(dataset_or_error, Exception):
            raise dataset_or_error
        return dataset_or_error

    monkeypatch.setattr(cli_ope, "load_dataset", load_dataset)


def one_line_error(capsys, argv) -> str:
    assert main(["ope", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("aiorl ope: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


def mdp_data():
    p, r, d0, behaviour, _ = small_mdp()
    return mdp_dataset(p, r, d0, behaviour, 20, np.random.default_rng(0))


def test_cli_refuses_bad_inputs_in_one_line(tmp_path, monkeypatch, capsys, cartpole_dataset):
    serve_dataset(monkeypatch, cartpole_dataset)
    assert "does not exist" in one_line_error(capsys, [str(tmp_path / "nowhere"), "--data", "d"])
    assert "--target-epsilon" in one_line_error(capsys, [str(POLICY), "--data", "d", "--target-epsilon", "1.5"])
    assert "--gamma" in one_line_error(capsys, [str(POLICY), "--data", "d", "--gamma", "0"])
    assert "--bootstrap" in one_line_error(capsys, [str(POLICY), "--data", "d", "--bootstrap", "-1"])
    assert "--best" in one_line_error(capsys, [str(POLICY), "--data", "d", "--best"])  # not a run directory
    serve_dataset(monkeypatch, mdp_data())  # observations of shape [1]; the policy takes [4]
    assert "shape [4]" in one_line_error(capsys, [str(POLICY), "--data", "d"])
    serve_dataset(monkeypatch, DatasetError("d: row 3: reward is nan"))
    assert "row 3" in one_line_error(capsys, [str(POLICY), "--data", "d"])
    box = cartpole_dataset.slice(0, len(cartpole_dataset))
    box.action = box.action[:, None].astype(np.float32)
    box.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    serve_dataset(monkeypatch, box)
    assert "discrete action space" in one_line_error(capsys, [str(POLICY), "--data", "d"])


def test_cli_takes_a_run_directorys_policy(tmp_path, monkeypatch, capsys, cartpole_dataset):
    """A run directory gives its final policy when it kept no best, as `aiorl eval` chooses."""
    run_dir = tmp_path / "run"
    shutil.copytree(POLICY, run_dir / "policy")
    (run_dir / "config.yaml").write_text("algo: apex_dqn\n")
    serve_dataset(monkeypatch, cartpole_dataset)
    assert main(["ope", str(run_dir), "--data", "d", "--no-fqe", "--bootstrap", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["which"] == "final" and report["policy"] == str(run_dir / "policy" / "policy.safetensors")
    unrecorded = cartpole_dataset.slice(0, 5000)
    unrecorded.propensity = None
    serve_dataset(monkeypatch, unrecorded)
    assert main(["ope", str(run_dir), "--data", "d", "--no-fqe", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    assert "fitting a behaviour-cloning model" in captured.err
    assert "estimated by a behaviour-cloning model" in captured.out
    assert "--best" in one_line_error(capsys, [str(run_dir), "--data", "d", "--best"])  # it kept none


def test_cli_reports_every_estimate_with_its_interval(monkeypatch, capsys, cartpole_dataset):
    serve_dataset(monkeypatch, cartpole_dataset)
    argv = ["ope", str(POLICY), "--data", "d", "--bootstrap", "50", "--seed", "3"]
    assert main([*argv, "--target-epsilon", "0.6", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["behaviour"] == RECORDED and report["which"] == "file" and report["seed"] == 3
    assert set(report["estimates"]) == {"ips", "sips", "wips", "swips", "dr", "fqe"}
    for e in report["estimates"].values():
        assert e["low"] <= e["high"]
    assert "fitted Q evaluation: iteration 300/300" in captured.err  # progress on the long part
    assert main([*argv, "--no-fqe"]) == 0
    table = capsys.readouterr().out
    assert "recorded in the dataset" in table and "weighted IPS" in table and "doubly robust" not in table


# ---------------------------------------------------------------- during training


def test_training_ope_scores_each_policy_and_rows_carry_the_estimates(cartpole_dataset):
    """Each evaluation's record gains the estimates of the greedy policy (FQE going on from the
    previous one); metrics rows carry them as ope/<name>; a record without episodes logs them."""
    held_out = cartpole_dataset.slice(0, 3000)
    ope = TrainingOpe(held_out, 0.99)
    first, second = ope.score(heuristic_policy), ope.score(heuristic_policy)
    assert set(first) == set(second) == set(OPE_KEYS)
    assert first["ope_wips"] is None  # greedy: every logged episode leaves its action somewhere
    assert first["ope_ips"] == 0.0 and first["ope_effective_episodes"] == 0.0
    # The same policy again: FQE goes on from its model (one started over, 60 iterations from the
    # logged returns, is some 16% lower here).
    assert abs(second["ope_fqe"] / first["ope_fqe"] - 1) < 0.08
    record = {"n": 3, "learner_steps": 300, "return_mean": None, "lag_s": 0.1, **second}
    row = evaluation_row(record)
    assert row["ope/dr"] == second["ope_dr"] and row["ope/wips"] is None and row["eval/return_mean"] is None
    assert not any(key.startswith("ope_") for key in row)
    assert f"fqe {second['ope_fqe']:.2f}" in describe(record) and "mean return" not in describe(record)


def test_cli_reads_a_dataset_written_to_disk(tmp_path, capsys, cartpole_dataset):
    """The real reader: a dataset aiorl wrote is scored (propensities recorded); a file that is not
    a dataset is the reader's one line, exit 2."""
    write_dataset(cartpole_dataset.slice(0, 5000), tmp_path / "data")
    assert main(["ope", str(POLICY), "--data", str(tmp_path / "data"), "--no-fqe", "--bootstrap", "20", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["behaviour"] == RECORDED and report["rows"] == 5000
    (tmp_path / "junk.txt").write_text("not a dataset\n")
    one_line_error(capsys, [str(POLICY), "--data", str(tmp_path / "junk.txt")])

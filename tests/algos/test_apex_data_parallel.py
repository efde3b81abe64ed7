"""Two data-parallel learners (torch.distributed, gloo) in real processes:
averaged gradients equal one learner on the whole batch, the stop protocol
leaves no learner waiting in a collective, and a NaN loss stops both."""

import multiprocessing as mp
import socket
import traceback

import numpy as np
import pytest
from apex_helpers import episode_rollout, make_algo, replay_batch

JOIN_TIMEOUT_S = 120  # only bounds a hang; the processes normally finish in seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def halves(algo_name: str):
    """A 16-row batch of the algorithm's own rows, and its two 8-row halves."""
    if algo_name == "apex_dqn":
        algo = make_algo(algo_name, "CartPole-v1", {"learning_rate": 0.01})
        rollout = episode_rollout([1.0] * 18, terminated_at=17)
    else:
        algo = make_algo(algo_name, "Pendulum-v1", {"actor_learning_rate": 0.01, "critic_learning_rate": 0.01})
        rollout = episode_rollout([-1.0] * 18, truncated_at=17, obs_dim=3, action=np.full((18, 1, 1), 0.3, np.float32))
    rows, _ = algo.make_actor(0, 1, seed=0).postprocess(rollout)
    rows = {k: v[:16] for k, v in rows.items()}
    return algo, rows, [{k: v[:8] for k, v in rows.items()}, {k: v[8:] for k, v in rows.items()}]


def flat_weights(core) -> np.ndarray:
    return np.concatenate([v.ravel().astype(np.float64) for _, v in sorted(core.get_weights().items())])


def flat_grads(core) -> np.ndarray:
    """The gradients the optimizer applied (averaged over learners, then clipped)."""
    return np.concatenate([p.grad.detach().numpy().ravel().astype(np.float64) for p in core.dp.params])


def worker(rank: int, ports: list[int], out) -> None:
    try:
        results = {}
        for algo_name, port in zip(("apex_dqn", "apex_ddpg"), ports[:2]):
            algo, _, parts = halves(algo_name)
            # Different seeds: learner 1's own initial weights must be replaced by learner 0's.
            core = algo.make_learner(rank, 2, seed=rank, rendezvous=f"tcp://127.0.0.1:{port}")
            result = core.step(replay_batch(parts[rank]))
            results[algo_name] = {
                "weights": flat_weights(core),
                "grads": flat_grads(core),
                "priorities": result.priorities,
                "stop": result.stop,
            }
            core.finish()
            core.close()

        # Stop protocol: learner 1 has data for 2 steps, learner 0 for 5.
        algo, _, parts = halves("apex_dqn")
        core = algo.make_learner(rank, 2, seed=0, rendezvous=f"tcp://127.0.0.1:{ports[2]}")
        stops = []
        for _ in range(5 if rank == 0 else 2):
            result = core.step(replay_batch(parts[rank]))
            stops.append(result.stop)
            if result.stop:
                break
        core.finish()
        core.finish()  # idempotent
        core.close()
        results["stops"] = stops

        # NaN on learner 1 at the second step: both learners raise at that step.
        core = algo.make_learner(rank, 2, seed=0, rendezvous=f"tcp://127.0.0.1:{ports[3]}")
        core.step(replay_batch(parts[rank]))
        bad = {k: v.copy() for k, v in parts[rank].items()}
        if rank == 1:
            bad["reward"][0] = np.nan
        try:
            core.step(replay_batch(bad))
            results["nan"] = None
        except FloatingPointError as exc:
            results["nan"] = f"{type(exc).__name__}: {exc}"
        core.close()
        out.put((rank, results))
    except BaseException:  # report instead of leaving the parent waiting
        out.put((rank, traceback.format_exc()))


@pytest.fixture(scope="module")
def two_learners():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ports = [free_port() for _ in range(4)]
    procs = [ctx.Process(target=worker, args=(rank, ports, out), daemon=True) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=JOIN_TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank, value in results.items():
        assert not isinstance(value, str), f"learner {rank} failed:\n{value}"
    return results


@pytest.mark.parametrize("algo_name", ["apex_dqn", "apex_ddpg"])
def test_two_learners_match_one_learner_on_the_whole_batch(two_learners, algo_name):
    algo, rows, _ = halves(algo_name)
    single = algo.make_learner(0, 1, seed=0)
    expected = single.step(replay_batch(rows))
    w0, w1 = two_learners[0][algo_name]["weights"], two_learners[1][algo_name]["weights"]
    assert np.array_equal(w0, w1), "learners diverged"
    assert np.allclose(w0, flat_weights(single), atol=1e-6)
    assert not np.allclose(w0, flat_weights(algo.make_learner(0, 1, seed=0))), "the step changed nothing"
    # Adam hides a gradient scale in the weights: compare the gradients themselves (the mean, not the sum).
    assert np.allclose(two_learners[0][algo_name]["grads"], flat_grads(single), rtol=1e-4, atol=1e-7)
    assert np.array_equal(two_learners[0][algo_name]["grads"], two_learners[1][algo_name]["grads"])
    got = np.concatenate([two_learners[0][algo_name]["priorities"], two_learners[1][algo_name]["priorities"]])
    assert np.allclose(got, expected.priorities, atol=1e-6)


def test_stop_protocol_releases_the_peer(two_learners):
    assert two_learners[1]["stops"] == [False, False]
    assert two_learners[0]["stops"] == [False, False, True]


def test_nan_loss_stops_every_learner(two_learners):
    assert two_learners[1]["nan"].startswith("FloatingPointError: ") and "loss is NaN" in two_learners[1]["nan"]
    # The peer whose own loss was finite says so: its runtime drops the step instead of failing.
    assert two_learners[0]["nan"].startswith("PeerNotFinite: ") and "data-parallel peer" in two_learners[0]["nan"]

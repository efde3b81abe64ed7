"""DPPO and ES through the real runtime (role processes over loopback TCP): the barrier's
ordering, data-parallel learners, lost actors, shutdown mid-iteration, work items."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import pytest
from cluster_helpers import NO_RESTARTS, alive, finish, last_metrics, pids, read_json, run, wait_for
from configs import dppo_cartpole, es_tiny

pytestmark = pytest.mark.cluster

ROLLOUT = 2 * 16  # rows per actor per iteration: num_envs x sample_batch_size


def dppo(actors, memories, learners, **agent):
    return dppo_cartpole(actors, memories, learners, epochs=2, **agent)


def learner_steps(run_dir):
    return (last_metrics(run_dir) or {}).get("learner_steps", 0)


def log_text(run_dir, role):
    path = run_dir / "logs" / f"{role}.log"
    return path.read_text() if path.exists() else ""


def trained_with(run_dir, rows: int) -> int:
    """Iterations learner 0 has trained on `rows` rows, from its log: metrics.jsonl lags a heartbeat
    behind, and a wait on it can count iterations that ran before the change it waits to see."""
    return sum(int(n) == rows for n in re.findall(r"iteration \d+: (\d+) rows", log_text(run_dir, "learner-0")))


def end_all(proc, started: dict[str, int]) -> None:
    """Kill the launcher and every role it started: a SIGSTOPped role ignores the SIGTERM it gets when the
    launcher dies, so a test that fails while one is stopped must not leave it behind."""
    proc.kill()
    for pid in started.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def coordinator_status(run_dir) -> dict:
    from aiorl.cli.status import fetch_status
    from aiorl.wire import load_token

    port = read_json(run_dir / "coordinator.json")["port"]
    return asyncio.run(fetch_status("127.0.0.1", port, load_token(run_dir / "token")))


def test_dppo_lockstep_with_two_memories_and_two_identical_data_parallel_learners(tmp_path):
    iterations = 6
    config = dppo(3, 2, 2, scheduled_timesteps=3 * ROLLOUT * iterations)
    config["model"]["obs_norm"] = True  # the normalizers, merged over both learners' shares, must agree too
    config["run"] = {"checkpoint_every": 1, "keep_checkpoints": 1000}  # as bench/learning.py's grid does
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    roles = summary["roles"]
    # No actor acts on stale weights: iteration k starts after version k is published, with version k.
    published = dict(summary["weights_published_monotonic"])
    for a in range(3):
        log = roles[f"actor-{a}"]["stats"]["iterations"]
        assert len(log) >= iterations and len(published) >= iterations
        for k, entry in enumerate(log[: len(published)]):  # summary.json keeps the first 32 publications
            assert entry["iteration"] == k and entry["weights_version"] == k
            assert entry["started_monotonic"] >= published[k]
    first, second = (roles[f"learner-{j}"]["stats"]["iterations"] for j in (0, 1))
    assert len(first) >= iterations and [e["iteration"] for e in first] == list(range(len(first)))
    # Both learners trained the same iterations and hold the same weights after each one.
    assert [(e["iteration"], e["weights_digest"]) for e in first] == [
        (e["iteration"], e["weights_digest"]) for e in second
    ]
    for k, (a, b) in enumerate(zip(first, second)):
        assert a["policy_lag"] == b["policy_lag"] == 0 and a["versions"] == b["versions"] == [k, k]
        # The learners split each round evenly (each memory splits its share in two).
        assert abs(a["rows"] - b["rows"]) <= 2
        total = a["rows"] + b["rows"]
        assert total == 3 * ROLLOUT if k < len(first) - 1 else total in (ROLLOUT, 2 * ROLLOUT, 3 * ROLLOUT)
    assert (run_dir / "policy" / "policy.pt2").exists()
    # Learner 0 checkpoints every iteration (after publishing it): the grid evaluation needs each one.
    assert len(list((run_dir / "checkpoints").glob("checkpoint-*.pt"))) >= iterations


def test_dppo_lost_actors_leave_the_barrier_and_with_no_actor_left_the_run_ends(launch):
    config = dppo(3, 1, 1, scheduled_timesteps=10**9)
    config["cluster"]["heartbeat_timeout_s"] = 2.0
    config["cluster"].update(NO_RESTARTS)
    proc, run_dir = launch(config)
    started = {}
    try:
        started = pids(run_dir)
        wait_for(lambda: learner_steps(run_dir) >= 3, 120, "3 iterations")
        # A hung actor: its connections stay open, its heartbeats stop.
        os.kill(started["actor-2"], signal.SIGSTOP)
        wait_for(
            lambda: "barrier 'iteration' goes on without actor-2" in log_text(run_dir, "memory-0"),
            60,
            "actor-2 to leave the barrier",
        )
        wait_for(lambda: trained_with(run_dir, 2 * ROLLOUT) >= 3, 120, "iterations without actor-2 (still hung)")
        # The launcher ends a role the coordinator declared lost: a stopped process dies of SIGKILL too.
        wait_for(lambda: not alive(started["actor-2"]), 60, "the launcher to end the hung actor-2")
        os.kill(started["actor-1"], signal.SIGKILL)  # mid-iteration, wherever it was
        wait_for(lambda: trained_with(run_dir, ROLLOUT) >= 3, 120, "iterations with actor-0 alone")
        os.kill(started["actor-0"], signal.SIGKILL)
        code, out = finish(proc)
    finally:
        end_all(proc, started)
    assert code != 0 and "every actor is gone" in out
    summary = read_json(run_dir / "summary.json")
    assert [p["phase"] for p in summary["phases"]][-1] == "EXITED"
    assert {summary["roles"][f"actor-{a}"]["status"] for a in range(3)} == {"lost"}, [
        (r["status"], r["reason"]) for r in summary["roles"].values()
    ]
    assert "no heartbeat for" in summary["roles"]["actor-2"]["reason"]
    assert summary["roles"]["learner-0"]["status"] == "done"
    exits = read_json(run_dir / "exits.json")
    # actor-2, declared lost while hung, was ended by the launcher (it could never rejoin).
    assert exits["actor-0"] == exits["actor-1"] == exits["actor-2"] == -signal.SIGKILL
    assert exits["learner-0"] == 0
    # Every round trained was whole rollouts of the actors still there: 3, then 2, then 1.
    rows = [e["rows"] for e in summary["roles"]["learner-0"]["stats"]["iterations"]]
    assert rows[0] == 3 * ROLLOUT and rows == sorted(rows, reverse=True)
    assert {2 * ROLLOUT, ROLLOUT} <= set(rows) <= {ROLLOUT, 2 * ROLLOUT, 3 * ROLLOUT}
    assert (run_dir / "policy" / "policy.pt2").exists()
    assert not any(alive(pid) for pid in started.values())


def test_dppo_sigint_mid_iteration_trains_every_delivered_rollout_and_writes_the_outputs(launch):
    proc, run_dir = launch(dppo(2, 1, 1, scheduled_timesteps=10**9, sample_batch_size=64))
    started = pids(run_dir)
    wait_for(lambda: learner_steps(run_dir) >= 3, 120, "3 iterations")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    assert code == 130, out  # interrupted, after a clean shutdown
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and summary["signal"] == "SIGINT"
    roles = summary["roles"]
    trained = roles["learner-0"]["stats"]["iterations"]
    assert all(e["rows"] in (128, 256) for e in trained)  # whole rollouts of 2 envs x 64 steps
    # The last, possibly partial, round was trained on, nothing discarded.
    last_acted = max(roles[f"actor-{a}"]["stats"]["iterations"][-1]["iteration"] for a in range(2))
    assert trained[-1]["iteration"] == last_acted
    assert roles["memory-0"]["stats"]["rounds"]["discarded_rows"] == 0
    assert list((run_dir / "checkpoints").glob("checkpoint-*.pt"))
    assert (run_dir / "policy" / "policy.pt2").exists()
    assert not any(alive(pid) for pid in started.values())


def test_es_items_per_iteration_whatever_the_actors_and_a_hung_actors_item_is_redone(launch):
    population = 5
    config = es_tiny(3, 2, 1, population=population, env="Pendulum-v1", scheduled_timesteps=10**9)
    config["cluster"]["heartbeat_timeout_s"] = 2.0
    config["cluster"].update(NO_RESTARTS)  # the hung actor, ended by the launcher, stays lost
    proc, run_dir = launch(config)
    started = {}
    try:
        started = pids(run_dir)
        wait_for(lambda: learner_steps(run_dir) >= 2, 120, "2 iterations")

        def held_by_actor_1() -> list[tuple[int, int]]:
            work = coordinator_status(run_dir)["work"]
            return [(work["iteration"], int(item)) for item, who in work["leases"].items() if who == "actor-1"]

        def stopped_holding_an_item():
            # Stopped between items, actor-1 would hold none and the rounds would go on without it:
            # stop it while it holds one, and look again once it is stopped, and once more after a
            # few heartbeats (a result already on its way would have ended that lease by then).
            # The item is taken from that look, not from a later moment when only it is left: under
            # load the heartbeat timeout could release it before the others were done.
            if len(held_by_actor_1()) != 1:
                return None
            os.kill(started["actor-1"], signal.SIGSTOP)
            held = held_by_actor_1()
            if len(held) == 1:
                time.sleep(0.5)
                if held_by_actor_1() == held:
                    return held[0]
            os.kill(started["actor-1"], signal.SIGCONT)
            return None

        iteration, item = wait_for(
            stopped_holding_an_item, 60, "actor-1 stopped while it holds a work item", interval_s=0.01
        )
        wait_for(
            lambda: (
                f"work items [{item}] of iteration {iteration}, held by actor-1, go back to the queue"
                in log_text(run_dir, "memory-0")
            ),
            60,
            "the release of actor-1's item",
        )
        try:
            os.kill(started["actor-1"], signal.SIGCONT)
        except ProcessLookupError:
            pass  # ended already: the launcher ends a role the coordinator declared lost
        wait_for(lambda: learner_steps(run_dir) >= iteration + 3, 120, "iterations after the release")
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc, timeout_s=120)
    finally:
        end_all(proc, started)
    summary = read_json(run_dir / "summary.json")
    roles = summary["roles"]
    assert roles["actor-1"]["status"] == "lost" and code != 0
    trained = roles["learner-0"]["stats"]["iterations"]
    assert len(trained) >= iteration + 2
    assert all(e["rows"] == population and e["policy_lag"] == 0 for e in trained)  # 3 actors or 2
    redone = [
        e
        for a in (0, 2)
        for e in roles[f"actor-{a}"]["stats"]["iterations"]
        if (e["iteration"], e["item"]) == (iteration, item)
    ]
    assert len(redone) == 1
    assert not any(alive(pid) for pid in started.values())

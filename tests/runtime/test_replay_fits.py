"""A replay capacity that cannot fit this machine's memory is refused before any process starts
(`aiorl.experiment.preflight.check_replay_fits`), from the bytes a row takes in the store
(`Store.bytes_per_row`): 1e10 rows used to crash memory host 0 on its first allocation (149 GiB),
restarted three times, the cause only in its log; 4e8 was accepted and would run out of memory
as it filled."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config
from aiorl.experiment.preflight import REPLAY_MEMORY_SHARE, check_replay_fits, machine_memory_bytes
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.memory.build import replay_bytes

GIB = 2**30


def apex(buffer_size: int, memories: int = 1, prioritized: bool = True):
    cfg = load_config(
        data={
            "algo": "apex_dqn",
            "env": {"id": "CartPole-v1"},
            "agent": {"buffer_size": buffer_size, "prioritized_replay": prioritized, "learning_starts": 100},
            "cluster": {"memories": memories},
        }
    )
    return cfg, build_algorithm(cfg)


def spec_bytes(algo) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in algo.transition_spec().values())


def test_a_row_takes_its_fields_and_its_priority():
    cfg, algo = apex(1000)
    per_row, shard = replay_bytes(cfg, algo)
    assert per_row == spec_bytes(algo) + 8 and shard == 1000 * per_row  # a float64 leaf per row
    cfg, algo = apex(1000, memories=4, prioritized=False)
    per_row, shard = replay_bytes(cfg, algo)
    assert per_row == spec_bytes(algo) and shard == 250 * per_row


def test_in_the_frame_layout_a_row_takes_its_ids_and_one_new_frame():
    """Frames are stored once (an env step makes one); each row holds its stacks' ids. Pong's
    100k rows: about 0.7 GB, as examples/apex_dqn_pong.yaml says."""
    from aiorl.replay.frames import FrameLayout
    from aiorl.runtime.memory.replay_store import ReplayStore

    spec = {
        "obs": ((4, 84, 84), "uint8"),
        "next_obs": ((4, 84, 84), "uint8"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
    }
    layout = FrameLayout.for_spec(spec, ("obs", "next_obs"), num_envs=4, steps_per_batch=50, lookback_steps=3)

    class Algo:
        def transition_spec(self):
            return spec

    per_row = ReplayStore.bytes_per_row(apex(1000)[0], Algo(), layout)
    assert per_row == 8 + 4 + 2 * 4 * 8 + 84 * 84 + 8  # action, reward, 8 ids, a frame, a priority
    assert 0.7e9 < 100_000 * per_row < 0.75e9


def test_a_replay_that_cannot_fit_is_refused_in_one_line_naming_what_it_needs():
    cfg, algo = apex(10**10)
    per_row = replay_bytes(cfg, algo)[0]
    with pytest.raises(ConfigError) as refused:
        check_replay_fits(cfg, algo, 64 * GIB)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("agent.buffer_size: 10000000000 rows")
    assert f"{per_row} bytes" in message and f"{10**10 * per_row / GIB:.1f} GiB" in message, message
    fit = int(64 * GIB * REPLAY_MEMORY_SHARE) // per_row
    assert "64.0 GiB of memory" in message and f"at most {fit} rows fit" in message, message
    # What it says fits, fits; one more row is refused.
    check_replay_fits(apex(fit)[0], algo, 64 * GIB)
    with pytest.raises(ConfigError):
        check_replay_fits(apex(fit + 1)[0], algo, 64 * GIB)


def test_memory_hosts_of_a_local_run_share_the_machine():
    """The capacity is split over the memory hosts, all on this machine: their shards add up."""
    cfg, algo = apex(4 * 10**8, memories=4)
    per_row = replay_bytes(cfg, algo)[0]
    memory = int(4 * 10**8 * per_row / REPLAY_MEMORY_SHARE) - 1
    with pytest.raises(ConfigError, match="over 4 memory hosts"):
        check_replay_fits(cfg, algo, memory)
    check_replay_fits(cfg, algo, memory + 10)


def test_stores_that_do_not_grow_with_the_capacity_are_never_refused():
    cfg = load_config(data={"algo": "dppo", "env": {"id": "CartPole-v1"}, "agent": {"buffer_size": 10**12}})
    algo = build_algorithm(cfg)
    assert replay_bytes(cfg, algo) == (0, 0)
    check_replay_fits(cfg, algo, GIB)


def test_the_machine_memory_is_its_ram_at_most():
    memory = machine_memory_bytes()
    assert memory is not None and 0 < memory <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_aiorl_run_refuses_it_before_any_process_starts(tmp_path):
    run_dir = tmp_path / "run"
    config = {
        "algo": "apex_dqn",
        "env": {"id": "CartPole-v1"},
        "agent": {"buffer_size": 10**10},
        "run": {"dir": str(run_dir)},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(tmp_path / "config.json")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent.buffer_size: 10000000000 rows" in lines[0], done.stderr
    assert "of memory" in lines[0] and "rows fit" in lines[0]
    assert not run_dir.exists(), list(run_dir.iterdir())  # no run directory claimed, no role started

"""A real full disk mid-run (a small tmpfs the run directory lives on, filled once the first
checkpoint is there): the run ends, in one line naming the file it could not write and why, with no
traceback, no temporary file of a writer left behind and nothing made readable by others.

Mounting needs root (as in CI); the test is skipped, saying why, where it cannot mount."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_helpers import finish, wait_for
from configs import APEX_CARTPOLE_TINY, configured

from aiorl.io import checkpoint
from aiorl.launch.local import LocalLauncher

pytestmark = pytest.mark.cluster

# Room for the run's own files before the disk is filled (the network is tiny: a checkpoint is a
# few hundred KB).
DISK = "64m"
# What the filler leaves free: small writes (a log line, maybe a status file) may still fit, no
# checkpoint or policy does.
LEFT_FREE = 8 * 1024
PAGE = 4096  # what tmpfs allocates a file by
ENOSPC = os.strerror(errno.ENOSPC)
CONFIG = configured(
    APEX_CARTPOLE_TINY,
    agent={"scheduled_global_steps": 3000},
    run={"checkpoint_every": 100, "checkpoint_interval_s": None, "keep_checkpoints": 2},
)
# Bounds a hang (a run restarting for ever, a launcher waiting on a role that cannot write), not the run.
END_TIMEOUT_S = 240
# The names each writer gives its temporary files: aiorl.io.checkpoint.atomic_write
# (".NAME.tmp-PID"), aiorl.io.export.save_policy (".policy-PID.tmp.*", ".policy.json.PID.tmp"),
# aiorl.io.rundir.write_json_atomic ("NAME.tmp") and its latest-link (".latest-PID").
TEMP_PATTERNS = ("*.tmp", "*.tmp-*", "*.tmp.*", ".policy-*", ".policy.json.*", ".latest-*")


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK mounted at tmp_path/disk (unmounted at the end, after the test's runs were
    ended: this fixture is set up before `launch`, so torn down after it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0755", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {(mounted.stderr or mounted.stdout).strip()}")
    try:
        yield disk
    finally:
        # Lazily, should a process the fixtures missed still hold a file there.
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Write a file taking all the free space of `disk`, then give back `leave` bytes."""
    filler = disk / "filler"
    block = b"\0" * (1 << 20)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            try:
                written = os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    break
                block = block[: len(block) // 2]  # the last pages
                continue
            if written < len(block):
                block = block[: max(1, len(block) // 2)]
        size = os.fstat(fd).st_size
        os.ftruncate(fd, max(0, size - leave))
    finally:
        os.close(fd)
    return filler


def temporaries(run_dir: Path) -> list[Path]:
    return sorted({p for pattern in TEMP_PATTERNS for p in run_dir.rglob(pattern)})


def modes(run_dir: Path) -> dict[Path, int]:
    """The permission bits of each file and directory of the run (not its links)."""
    found = {}
    for path in [run_dir, *run_dir.rglob("*")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # replaced while this looks
            continue
        if not stat.S_ISLNK(mode):
            found[path] = stat.S_IMODE(mode)
    return found


def widened(run_dir: Path, before: dict[Path, int]) -> list[str]:
    """Each path of the run that others may write, or that gained a permission since `before`."""
    return [
        f"{path} {mode:o} (was {before.get(path, 0):o})"
        for path, mode in modes(run_dir).items()
        if mode & 0o022 or mode & ~before.get(path, mode)
    ]


def test_a_disk_full_mid_run_ends_the_run_in_one_line_with_no_temporary_file_left(small_disk, launch):
    """The review's run reached its budget, was reported failed and restarted from a stale
    checkpoint; the launcher then died with a traceback, leaving 0-byte .policy-*.tmp.pt2 files."""
    proc, run_dir = launch(CONFIG, where=small_disk)

    def first_checkpoint() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before its first checkpoint:\n{proc.stdout.read()}")
        return bool(checkpoint.list_checkpoints(run_dir / "checkpoints"))

    wait_for(first_checkpoint, 180, "the first checkpoint")
    filler = fill(small_disk, LEFT_FREE)
    before = modes(run_dir)
    code, out = finish(proc, timeout_s=END_TIMEOUT_S)
    assert filler.exists()
    assert "Traceback" not in out, out
    # Learner 0 could not write its final checkpoint nor the policy: the run ends failed, exit 1,
    # and is not restarted (a restart from the stale checkpoint meets the same full disk).
    assert code == 1 and "(FAILED)" in out, out
    assert "restarting the whole run" not in out, out
    # Whichever file the disk ran out on first (the coordinator's summary, the launcher's own files,
    # learner 0's policy), a line names it and the full disk.
    full = [line for line in out.splitlines() if str(run_dir) in line and "No space left on device" in line]
    assert full and "unexpected pos" not in out, out
    assert not temporaries(run_dir), (temporaries(run_dir), out)
    assert run_dir.stat().st_mode & 0o077 == 0, oct(run_dir.stat().st_mode)
    assert not widened(run_dir, before), widened(run_dir, before)


# Exports a tiny network to argv[1] and prints what went wrong; its own process: a torch writer
# left half-written by a full disk aborted the process that collected it (a C++ exception thrown in
# its destructor), and pytest with it.
EXPORT = """
import gc, sys
import torch
from aiorl.io.export import PolicyWriteError, save_policy

net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
try:
    save_policy(net, sys.argv[1], {"observation_shape": [4], "observation_dtype": "float32"})
except PolicyWriteError as exc:
    print(exc)
gc.collect()
"""


def test_a_policy_program_on_a_full_disk_is_one_line_saying_so_and_leaves_no_temporary_file(small_disk):
    """Its weights fit, its program did not: torch's writer said "unexpected pos 3904 vs 3806" (the
    run's one line named no full disk, and the launcher restarted the whole run for it), or the
    process aborted when the writer was collected."""
    fill(small_disk, PAGE)  # the weights (under a page) fit, nothing after them
    done = subprocess.run([sys.executable, "-c", EXPORT, str(small_disk)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    said = f"could not write the policy's program to {small_disk}/policy.pt2: {ENOSPC}"
    assert done.stdout.splitlines() == [said], done.stdout
    assert not temporaries(small_disk), temporaries(small_disk)


@pytest.mark.parametrize(
    "reason, restarted",
    [
        (f"PolicyWriteError: could not write the policy's program to /r/policy/policy.pt2: {ENOSPC}", False),
        ("exit code -9 (SIGKILL)", True),
    ],
    ids=["full-disk", "killed"],
)
def test_a_learner_failed_for_a_full_disk_does_not_restart_the_whole_run(tmp_path, reason, restarted):
    """A restart writes to the same disk: it failed the same way, from an older checkpoint."""
    launcher = LocalLauncher.__new__(LocalLauncher)  # only what run_restart_cause reads
    launcher.signals, launcher.stalled, launcher.unwritten = 0, None, []
    launcher.policy = SimpleNamespace(synchronous=False)
    summary = {"outcome": "failed", "roles": {"learner-0": {"status": "failed", "reason": reason}}}
    launcher.rundir = SimpleNamespace(read_owned=lambda name: summary if name == "summary.json" else None)
    cause = launcher.run_restart_cause()
    assert (cause == f"learner-0 failed: {reason}") if restarted else cause is None, cause
    launcher.unwritten = [f"could not write /r/exits.json: {ENOSPC}"]  # the launcher's own files too
    assert launcher.run_restart_cause() is None

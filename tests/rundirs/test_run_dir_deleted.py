"""A run directory deleted mid-run is never made again by a writer inside a role: it came back
0755 (a ``mkdir(parents=True)`` under it), checkpoints and the policy readable by others, and the
run reported ok. Subdirectories are made 0700 under an existing run directory only; a missing
one is an error naming it (`aiorl.io.rundir.RunDirDeleted`)."""

from __future__ import annotations

import shutil
import stat

import pytest

from aiorl.io.metrics import MetricsWriter
from aiorl.io.rundir import (
    DIR_MODE,
    RunDirDeleted,
    RunDirError,
    RunDirWatch,
    make_run_dir,
    make_subdir,
    role_run_dir,
)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def run_dir(tmp_path):
    return make_run_dir(tmp_path / "run")


def test_subdirectories_are_made_owner_only_under_the_run_directory(run_dir):
    made = make_subdir(run_dir, "policy", "models")
    assert made == run_dir / "policy" / "models" and made.is_dir()
    assert mode(run_dir / "policy") == mode(made) == DIR_MODE
    assert make_subdir(run_dir, "policy", "models") == made  # already there: fine
    assert make_subdir(run_dir) == run_dir


def test_a_deleted_run_directory_is_named_and_never_made_again(run_dir):
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirDeleted) as gone:
        make_subdir(run_dir, "checkpoints")
    assert str(gone.value) == f"run directory {run_dir} was deleted"
    assert isinstance(gone.value, OSError)  # the writers' handlers of a failed write see it
    assert not run_dir.exists()


def test_the_watch_sees_a_deleted_or_replaced_run_directory(run_dir):
    watch = RunDirWatch(run_dir)
    watch.check()
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirDeleted, match="was deleted"):
        watch.check()
    run_dir.mkdir(mode=0o755)  # made again by someone: not the run's directory
    with pytest.raises(RunDirDeleted):
        watch.check()


def test_metrics_rows_stop_when_the_run_directory_is_deleted(run_dir):
    """The writer keeps metrics.jsonl open: without a check, rows went on into the deleted file."""
    writer = MetricsWriter(run_dir, tensorboard=False, loggers=[])
    writer.write({"env_steps": 1})
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirDeleted, match=f"run directory {run_dir} was deleted"):
        writer.write({"env_steps": 2})
    writer.close()
    assert not run_dir.exists()


def test_a_launched_role_never_makes_its_run_directory(run_dir):
    assert role_run_dir(str(run_dir), "apex_dqn", "CartPole-v1") == run_dir
    run_dir.chmod(0o755)  # widened by hand: tightened, as before
    role_run_dir(str(run_dir), "apex_dqn", "CartPole-v1")
    assert mode(run_dir) == DIR_MODE
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirError, match=f"run directory {run_dir} was deleted"):
        role_run_dir(str(run_dir), "apex_dqn", "CartPole-v1")
    assert not run_dir.exists()


def test_tensorboard_makes_its_directory_owner_only_and_never_the_run_directory(run_dir):
    pytest.importorskip("tensorboard")
    from aiorl.io.loggers import TensorBoardLogger

    logger = TensorBoardLogger(run_dir, {"algo": "apex_dqn"}, None)
    logger.close()
    assert mode(run_dir / "tb") == DIR_MODE
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirDeleted):
        TensorBoardLogger(run_dir, {"algo": "apex_dqn"}, None)
    assert not run_dir.exists()

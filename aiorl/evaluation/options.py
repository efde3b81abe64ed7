"""What `aiorl eval` can evaluate and show besides the exported policy: an
older checkpoint (``--checkpoint N``), a video of the episodes (``--video
DIR``) and a window (``--render``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import tempfile
from pathlib import Path

from aiorl.config import Config, EnvConfig
from aiorl.evaluation.policies import load_policy
from aiorl.io import checkpoint
from aiorl.io.checkpoint import CheckpointError
from aiorl.io.export import policy_file
from aiorl.runtime.algorithm import build_algorithm

log = logging.getLogger("aiorl.eval")

VIDEO_EXTRA = "video"
VIDEO_ENCODER = "moviepy"  # what Gymnasium's RecordVideo writes its mp4 files with


class EvalOptionError(RuntimeError):
    """A user's eval option that cannot be honoured (missing checkpoint, missing extra)."""


def checkpoint_path(run_dir: Path, which: str) -> Path:
    """The checkpoint ``--checkpoint`` names: learner steps N (``checkpoints/checkpoint-N.pt``) or a file."""

    candidate = Path(which)
    if candidate.is_file():
        return candidate
    available = checkpoint.list_checkpoints(run_dir / "checkpoints")
    steps = {int(checkpoint.CHECKPOINT_RE.match(p.name).group(1)): p for p in available}
    if which.isdigit() and int(which) in steps:
        return steps[int(which)]
    have = ", ".join(str(s) for s in sorted(steps)) or "none"
    raise EvalOptionError(
        f"--checkpoint {which}: no such checkpoint file, and {run_dir / 'checkpoints'} has no "
        f"checkpoint at learner step {which} (learner steps there: {have})"
    )


def cpu_learner(cfg: Config):
    """A learner core of `cfg` as learner 0 builds it, alone and on the CPU: what an evaluation
    (`--checkpoint`, the evaluation process during training) takes its acting policy from."""

    if hasattr(cfg.model, "device"):
        cfg.model.device = "cpu"  # evaluation runs on the CPU, wherever the learner trains
    return build_algorithm(cfg).make_learner(0, 1, seed=0)


def checkpoint_policy(cfg: Config, path: Path):
    """The acting policy of checkpoint `path`, built as learner 0 builds it and exported the same way.

    The checkpoint is read with ``weights_only=True`` (`aiorl.io.checkpoint.load`);
    the policy then goes through the same `save_policy` / loader pair as the
    exported one, so a checkpoint evaluates exactly as its export would.
    """

    learner = cpu_learner(cfg)
    try:
        learner.load_checkpoint(str(path))
    except CheckpointError as exc:
        raise EvalOptionError(str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise EvalOptionError(f"{path}: not a checkpoint of this run's {cfg.algo} learner ({exc})") from None
    with tempfile.TemporaryDirectory(prefix="aiorl-eval-") as tmp:
        if learner.export_policy(tmp) is None:
            raise EvalOptionError(f"--checkpoint: {cfg.algo} exports no policy to evaluate")
        return load_policy(policy_file(tmp))


def render_env_config(env_cfg: EnvConfig, video_dir: str | None, render: bool) -> EnvConfig:
    """`env_cfg` with the render mode that --video (rgb_array) or --render (human) needs."""
    if video_dir is None and not render:
        return env_cfg
    if video_dir is not None and render:
        raise EvalOptionError("--video and --render: choose one (a video records off screen)")
    if video_dir is not None and importlib.util.find_spec(VIDEO_ENCODER) is None:
        raise EvalOptionError(
            f"--video needs {VIDEO_ENCODER} to encode the episodes: pip install 'aiorl[{VIDEO_EXTRA}]'"
        )
    if video_dir is not None:
        # Off-screen frames need no display: without this, SDL (pygame, which draws the classic
        # control envs) looks for one and prints an XDG_RUNTIME_DIR error on a headless host.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    mode = "rgb_array" if video_dir is not None else "human"
    return dataclasses.replace(env_cfg, kwargs={**env_cfg.kwargs, "render_mode": mode})


def record_episodes(env, video_dir: str | None):
    """Wrap `env` in RecordVideo writing every episode to `video_dir` (unchanged when None)."""
    if video_dir is None:
        return env
    import gymnasium as gym

    log.info("recording every episode to %s", video_dir)
    return gym.wrappers.RecordVideo(
        env, video_folder=str(video_dir), episode_trigger=lambda episode: True, name_prefix="eval", disable_logger=True
    )

"""Where the coordinator's metrics rows go besides metrics.jsonl: ``run.loggers``.

- ``tensorboard`` (default; extra ``tb``): event files under ``RUN_DIR/tb``.
- ``wandb`` (extra ``wandb``): a Weights & Biases run; ``WANDB_MODE`` decides
  online or offline as usual (``WANDB_MODE=offline`` writes ``RUN_DIR/wandb``
  for a later ``wandb sync``); the project is ``WANDB_PROJECT`` or ``aiorl``.
- ``mlflow`` (extra ``mlflow``): an MLflow run in the store ``MLFLOW_TRACKING_URI``
  names, by default a local SQLite store ``RUN_DIR/mlflow.db`` (view it with
  ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db``, from the full
  ``mlflow`` package); the experiment is ``MLFLOW_EXPERIMENT_NAME`` or ``aiorl``.

Each logger gets the resolved config once, flattened to ``section.key``
values, as hyper-parameters (TensorBoard's HPARAMS tab too), and then every
numeric value of every row against env steps; each evaluation's ``eval/*``
values against the env steps of the policy it scored (``eval/env_steps``;
in W&B, whose steps only grow, on a step of their own, charted against
``eval/env_steps``). A logger that fails at run
time is logged once and dropped: it must not end the run. A logger asked for
whose package is missing is refused before any process starts
(`check_installed`), with the extra to install.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from pathlib import Path

from aiorl.io.rundir import make_subdir

log = logging.getLogger("aiorl.loggers")

# logger name -> (module that must import, extra that installs it)
PACKAGES = {"tensorboard": ("tensorboard", "tb"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
KNOWN = tuple(PACKAGES)


def check_names(names) -> str | None:
    """The config error for run.loggers, or None."""
    if not isinstance(names, (list, tuple)):
        return f"run.loggers: expected a list of {', '.join(KNOWN)}, got {names!r}"
    for name in names:
        if name not in PACKAGES:
            return f"run.loggers: unknown logger {name!r} (available: {', '.join(KNOWN)})"
    return None


def check_installed(names) -> str | None:
    """For a run about to start: the first asked-for logger whose package is missing, as a one-line fix.

    TensorBoard is the default, so its absence is only a notice at run time.
    """
    for name in names:
        module, extra = PACKAGES[name]
        if name != "tensorboard" and importlib.util.find_spec(module) is None:
            return f"run.loggers: {name!r} needs the {module} package: pip install 'aiorl[{extra}]'"
    return None


def flat_hparams(config: dict, prefix: str = "") -> dict:
    """``{"agent.batch_size": 32, ...}``: numbers, strings and bools as they are, the rest as JSON text."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)
    return out


def numbers(row: dict):
    for key, value in row.items():
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and key not in ("env_steps", "time_s")
        ):
            yield key if "/" in key else f"charts/{key}", value


class TensorBoardLogger:
    def __init__(self, run_dir: Path, hparams: dict, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        # A resumed run: TensorBoard hides the earlier launch's events past the checkpoint.
        # Made here, owner-only and under the run directory only (SummaryWriter would make its
        # parents too, a deleted run directory among them, with the default permissions).
        self.writer = SummaryWriter(log_dir=str(make_subdir(run_dir, "tb")), purge_step=purge_step)
        # In this run's own event file (add_hparams would open a sub-run): the HPARAMS tab
        # lists the config beside the final return.
        for summary in hparams_summary(hparams, {"charts/return_mean_100": 0.0}):
            self.writer.file_writer.add_summary(summary)

    def log_row(self, row: dict, step: int) -> None:
        for key, value in numbers(row):
            self.writer.add_scalar(key, value, step)

    log_evaluation = log_row  # any step, earlier ones too

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, run_dir: Path, hparams: dict, purge_step: int | None):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "aiorl"),
            name=run_dir.name,
            dir=str(run_dir),
            config=hparams,
            resume="allow" if purge_step else None,
            id=_run_id(run_dir, "wandb"),
        )
        self.run.define_metric("eval/*", step_metric="eval/env_steps")
        self.step = 0  # W&B refuses a step below the last one

    def log_row(self, row: dict, step: int) -> None:
        self.step = max(step, self.step)
        self.run.log(dict(numbers(row)), step=self.step)

    def log_evaluation(self, values: dict, step: int) -> None:
        # A step of its own after the row's (two evaluations in one step would be one history row),
        # drawn against eval/env_steps (define_metric above).
        self.step += 1
        self.run.log({**dict(numbers(values)), "eval/env_steps": step}, step=self.step)

    def close(self) -> None:
        self.run.finish()


class MlflowLogger:
    def __init__(self, run_dir: Path, hparams: dict, purge_step: int | None):
        import mlflow

        # MLflow's own default backend (its file store is in maintenance mode), kept in the run.
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "aiorl")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        from mlflow.entities import Param

        # MLflow caps one batch at 100 params.
        params = [Param(k, str(v)[:500]) for k, v in hparams.items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_row(self, row: dict, step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in numbers(row)]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    log_evaluation = log_row  # any step, earlier ones too

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


CLASSES = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MlflowLogger}


def _run_id(run_dir: Path, name: str) -> str:
    """A stable id per run directory, so that --resume continues the same logged run."""
    path = run_dir / f".{name}-id"
    if path.exists():
        return path.read_text().strip()
    import secrets

    run_id = secrets.token_hex(8)
    path.write_text(run_id + "\n")
    return run_id


def make_loggers(names, run_dir: Path, config: dict, purge_step: int | None = None) -> list:
    """The loggers of ``run.loggers`` that start; one that cannot is a one-line notice, not an error."""
    hparams = flat_hparams(config)
    loggers = []
    for name in names:
        module, extra = PACKAGES[name]
        try:
            loggers.append(CLASSES[name](Path(run_dir), hparams, purge_step))
        except ImportError:
            log.info(
                "%s is not installed (pip install 'aiorl[%s]'): metrics go to metrics.jsonl without it",
                "TensorBoard" if name == "tensorboard" else module,
                extra,
            )
        except Exception as exc:  # a logging service must not end the run
            log.warning("%s logger could not start (%s: %s); metrics go on without it", name, type(exc).__name__, exc)
    return loggers

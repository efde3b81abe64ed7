"""run.loggers: TensorBoard (with hparams), Weights & Biases (offline) and MLflow (local file store), each
fed the resolved config as hyper-parameters and the metrics rows; unknown or uninstalled loggers are
one-line config errors."""

import subprocess
import sys

import pytest

from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config
from aiorl.io.loggers import check_installed, flat_hparams
from aiorl.io.metrics import MetricsWriter

ROWS = [
    {
        "time_s": 0.5 * k,
        "env_steps": 100 * k,
        "learner_steps": 10 * k,
        "return_mean_100": float(k),
        "phase": "RUNNING",
        "learner/losses/td_loss": 1.0 / (k + 1),
    }
    for k in range(1, 4)
]


def config():
    return load_config(data={"algo": "apex_dqn", "agent": {"batch_size": 48}}).to_dict()


# Two evaluations heard of by the last row: each at the env steps of the policy it scored.
EVALUATIONS = [
    {"eval/return_mean": 51.0, "eval/learner_steps": 10, "eval/env_steps": 120},
    {"eval/return_mean": 362.0, "eval/learner_steps": 20, "eval/env_steps": 210},
]


def write_rows(tmp_path, loggers):
    writer = MetricsWriter(tmp_path, loggers=loggers, config=config())
    assert [type(lg).__name__ for lg in writer.loggers] == [
        f"{name.capitalize()}Logger".replace("Tensorboard", "TensorBoard") for name in loggers
    ]
    for row in ROWS:
        writer.write(row, EVALUATIONS if row is ROWS[-1] else ())
    writer.close()


def test_hparams_are_the_flattened_resolved_config():
    hparams = flat_hparams(config())
    assert hparams["agent.batch_size"] == 48 and hparams["algo"] == "apex_dqn"
    assert hparams["model.n_step"] == 3 and hparams["env.id"] == "CartPole-v1"
    assert all(isinstance(v, (bool, int, float, str)) for v in hparams.values())


def test_tensorboard_gets_the_rows_and_the_config_as_hparams(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_rows(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.value for e in events.Scalars("charts/return_mean_100")] == [1.0, 2.0, 3.0]
    assert [e.step for e in events.Scalars("learner/losses/td_loss")] == [100, 200, 300]
    assert [(e.step, e.value) for e in events.Scalars("eval/return_mean")] == [(120, 51.0), (210, 362.0)]
    plugin = events.PluginTagToContent("hparams")
    session = next(content for tag, content in plugin.items() if tag == "_hparams_/session_start_info")
    assert b"agent.batch_size" in session and b"apex_dqn" in session


def test_wandb_offline_run_holds_config_and_metrics(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_rows(tmp_path, ["wandb"])
    wandb.teardown()  # the service writes the run file asynchronously: wait for it, as process exit does
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    # The offline record (wandb's own binary log, protobuf records) names the config and metric keys
    # in plain UTF-8; there is no public reader for it in this wandb.
    record = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"agent.batch_size" in record and b"apex_dqn" in record
    assert record.count(b"charts/return_mean_100") >= len(ROWS)
    assert record.count(b"eval/return_mean") >= len(EVALUATIONS)  # each evaluation a history row of its own
    assert wandb.run is None  # finished


def test_mlflow_local_store_in_the_run_holds_params_and_metrics(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_rows(tmp_path, ["mlflow"])
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("aiorl").experiment_id])
    assert run.data.params["agent.batch_size"] == "48" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "charts/return_mean_100")
    assert [(m.step, m.value) for m in history] == [(100, 1.0), (200, 2.0), (300, 3.0)]
    history = client.get_metric_history(run.info.run_id, "eval/return_mean")
    assert sorted((m.step, m.value) for m in history) == [(120, 51.0), (210, 362.0)]


def test_unknown_or_missing_logger_is_a_config_error(tmp_path, monkeypatch):
    with pytest.raises(
        ConfigError,
        match=r"run.loggers: unknown logger 'wandbb' \(available: tensorboard, wandb, "
        r"mlflow\)",
    ):
        load_config(data={"algo": "apex_dqn", "run": {"loggers": ["wandbb"]}})
    monkeypatch.setitem(sys.modules, "mlflow", None)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    assert (
        check_installed(["tensorboard", "mlflow"])
        == "run.loggers: 'mlflow' needs the mlflow package: pip install 'aiorl[mlflow]'"
    )


def test_aiorl_run_refuses_a_missing_logger_package_before_anything_starts(tmp_path):
    code = (
        "import importlib.util, sys; real = importlib.util.find_spec; "
        "importlib.util.find_spec = lambda n, *a: None if n == 'wandb' else real(n, *a); "
        "from aiorl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"algo: apex_dqn\nrun: {{dir: {tmp_path / 'run'}, loggers: [tensorboard, wandb]}}\n")
    out = subprocess.run(
        [sys.executable, "-c", code, "run", str(cfg)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        "aiorl: config error: run.loggers: 'wandb' needs the wandb package: pip install 'aiorl[wandb]'"
    )
    assert not (tmp_path / "run").exists()

"""The launcher's live panel, rendered from recorded metrics rows, and role stderr routed into the logs."""

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from configs import configured, random_cartpole
from rich.console import Console

from aiorl.core.console import aiorl_command
from aiorl.experiment.loading import load_config
from aiorl.launch.panel import PanelState, Progress, RateWindow, render_panel
from aiorl.launch.role_logs import RoleLogWatch

DQN_METRICS = (
    ("td loss", "learner/losses/td_loss"),
    ("epsilon (sampled)", "learner/values/sampled_epsilon_mean"),
    ("weights lag", "weights_lag_max"),
)


def rows(n=12, dt=1.0, env_per_s=1000, learner_per_s=50):
    return [
        {
            "time_s": k * dt,
            "phase": "RUNNING",
            "env_steps": k * env_per_s,
            "learner_steps": k * learner_per_s,
            "episodes": 3 * k,
            "return_mean_100": 20.5,
            "roles_alive": 3,
            "replay_size": 100 * k,
            "replay_fill": 0.1,
            "weights_version": k,
            "weights_lag_max": 1,
            "learner/losses/td_loss": 0.0123,
            "learner/values/sampled_epsilon_mean": 0.25,
        }
        for k in range(n)
    ]


def frame(state) -> str:
    console = Console(record=True, width=300, file=io.StringIO(), color_system=None)
    console.print(render_panel(state))
    return console.export_text()


def state_from(recorded, **kw):
    window = RateWindow()
    for row in recorded:
        window.add(row)
    env_rate, learner_rate = window.rates()
    return PanelState(
        "aiorl apex_dqn on CartPole-v1",
        kw.pop("run_dir", "RUN"),
        "env_steps",
        20_000,
        DQN_METRICS,
        row=recorded[-1],
        env_rate=env_rate,
        learner_rate=learner_rate,
        **kw,
    )


def test_running_frame_shows_totals_rates_loss_exploration_lag_and_eta():
    text = frame(state_from(rows()))
    assert "RUNNING" in text and re.search(r"roles alive\s+3\b", text)
    assert "11,000 (1,000/s)" in text  # total env steps and the windowed rate
    assert "550 (50/s)" in text
    assert "td loss" in text and "0.0123" in text and "epsilon (sampled)" in text and "0.25" in text
    assert "weights lag" in text
    assert "eta 0:00:09" in text  # 9,000 env steps left at 1,000/s


def test_rates_are_smoothed_over_a_window_not_the_last_short_interval():
    recorded = rows()
    last = dict(recorded[-1], time_s=recorded[-1]["time_s"] + 0.1, env_steps=recorded[-1]["env_steps"] + 10)
    window = RateWindow(window_s=10.0)
    for row in [*recorded, last]:
        window.add(row)
    env_rate, _ = window.rates()
    assert 900 < env_rate < 1000  # a 0.1 s step of 10 env steps barely moves it (between two rows: 100/s)
    assert (last["env_steps"] - window.points[0][1]) / (last["time_s"] - window.points[0][0]) == env_rate


def test_last_frame_says_exited_with_the_summary_counters_and_the_next_command(tmp_path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "policy.pt2").write_bytes(b"")
    final = {
        "outcome": "finished",
        "ok": True,
        "stop_detail": "reached scheduled_timesteps (20016 >= 20000)",
        "stopped_at": {"env_steps": 20016, "learner_steps": 800},
        "env_steps": 20_512,
        "learner_steps": 812,
        "episodes": 999,
        "return_mean_100": 31.25,
    }
    text = frame(state_from(rows(), run_dir=tmp_path, final=final, roles_alive=0))
    assert "EXITED" in text and "RUNNING" not in text
    assert re.search(r"roles alive\s+0\b", text)
    assert "eta" not in text
    assert "20,512" in text and "812" in text and "999" in text and "31.25" in text  # summary.json's, not the row's
    assert "stopped: reached scheduled_timesteps (20016 >= 20000)" in text
    assert "at the stop env_steps 20,016, learner_steps 800" in text
    assert f"policy at {tmp_path / 'policy'}; try `{aiorl_command()} eval {tmp_path} --episodes 20`" in text


@pytest.mark.parametrize("activated", [True, False])
def test_the_suggested_command_runs_as_written_with_the_venv_activated_or_not(tmp_path, monkeypatch, activated):
    """After `make run` the venv is not activated: `aiorl` is not on PATH, and a hint that said
    `aiorl eval ...` failed with "command not found". The hint names what this shell can run."""
    venv_bin = Path(sys.executable).parent
    others = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != venv_bin.resolve()]
    path = os.pathsep.join(([str(venv_bin)] if activated else []) + others)
    monkeypatch.setenv("PATH", path)
    command = aiorl_command()
    assert (command == "aiorl") == activated, command
    done = subprocess.run(
        f"{command} --version", shell=True, capture_output=True, text=True, env={**os.environ, "PATH": path}
    )
    assert done.returncode == 0 and done.stdout.startswith("aiorl "), done.stderr


def test_no_eta_after_an_interrupt():
    assert "eta " not in frame(state_from(rows(), interrupted=True))
    assert "eta " in frame(state_from(rows()))


def write_log(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))


def test_role_log_problems_counted_once_each_with_the_latest_first_line(tmp_path):
    logs = tmp_path / "logs"
    watch = RoleLogWatch(logs)
    write_log(
        logs / "actor-0.log",
        """
        2026-12-01 15:00:00,001 actor-0 INFO aiorl.actor: started
        2026-12-01 15:00:00,002 actor-0 WARNING py.warnings: /x/y.py:3: UserWarning: knob is deprecated
        /lib/mod.py:12: DeprecationWarning: raw warning on stderr
          warnings.warn("raw warning on stderr")
        2026-12-01 15:00:01,000 actor-0 ERROR aiorl.actor: crashed
        Traceback (most recent call last):
          File "a.py", line 1, in <module>
        ValueError: counted with its record
        """,
    )
    assert len(watch.poll()) == 3
    write_log(
        logs / "learner-0.log",
        """
        Traceback (most recent call last):
          File "b.py", line 2, in <module>
            boom()
        RuntimeError: CUDA out of memory
        second line of the message
        """,
    )
    new = watch.poll()
    assert [(p.role, p.kind, p.message) for p in new] == [("learner-0", "error", "RuntimeError: CUDA out of memory")]
    assert watch.counts == {"warning": 2, "error": 2}
    summary = watch.summary()
    assert summary.startswith(
        "2 warning(s), 2 error(s) in the role logs; latest: learner-0 error: RuntimeError: CUDA out of memory (see "
    ) and summary.endswith("learner-0.log)")
    write_log(logs / "learner-0.log", "2026-12-01 15:00:02,000 learner-0 WARN")  # half a line: not yet
    assert watch.poll() == []
    write_log(logs / "learner-0.log", "ING aiorl.learner: slow\n")
    assert [p.message for p in watch.poll()] == ["slow"]


def test_off_a_terminal_problems_arrive_as_plain_lines(tmp_path):
    cfg = load_config(data={"algo": "apex_dqn"})
    out = io.StringIO()
    progress = Progress(cfg, tmp_path, stream=out)
    write_log(tmp_path / "logs" / "actor-1.log", "2026-12-01 15:00:00,002 actor-1 WARNING aiorl.env: obs clipped\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows(1)[0]) + "\n")
    progress.update()
    lines = out.getvalue().splitlines()
    assert f"aiorl: actor-1 warning: obs clipped (see {tmp_path / 'logs' / 'actor-1.log'})" in lines
    assert any(line.startswith("[") and "RUNNING" in line for line in lines)


SITECUSTOMIZE = """
import sys

def _stray():  # what a library might do, outside logging
    import warnings
    sys.stderr.write("STRAY-STDERR-MARKER from a library\\n")
    print("STRAY-STDOUT-MARKER", flush=True)
    warnings.warn("ROLE-WARNING-MARKER", UserWarning)

strayed = "--role" in sys.argv and sys.argv[sys.argv.index("--role") + 1:][:1] == ["actor"]
if strayed:  # an actor started as a process of its own: at its interpreter's start
    _stray()
import logging
import aiorl.runtime.process as process
setup = process.setup_logging

def setup_then_warn(run_dir, name, *args, **kwargs):
    if name.startswith("actor") and not strayed:  # an actor forked by the warm spawner
        _stray()
    setup(run_dir, name, *args, **kwargs)
    if name.startswith("actor"):  # a warning logged once the role's logging is set up
        logging.getLogger("aiorl.test").warning("LOGGED-MARKER")

process.setup_logging = setup_then_warn
"""


@pytest.mark.cluster
def test_a_role_writing_to_stderr_goes_to_its_log_and_the_launcher_reports_it(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    config = configured(
        random_cartpole(1, 1, 1, scheduled_timesteps=5000),
        run={"dir": str(tmp_path / "run"), "metrics_interval_s": 0.1},
    )
    (tmp_path / "c.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(tmp_path / "c.json")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "STRAY" not in output  # nothing raw from the role
    log = (tmp_path / "run" / "logs" / "actor-0.log").read_text()
    assert "STRAY-STDERR-MARKER" in log and "STRAY-STDOUT-MARKER" in log and "ROLE-WARNING-MARKER" in log
    assert log.count("UserWarning: ROLE-WARNING-MARKER") == 1
    assert log.count("LOGGED-MARKER") == 1  # once: not also through a handler on stderr, which is the log
    reported = [line for line in proc.stdout.splitlines() if "ROLE-WARNING-MARKER" in line]
    assert reported and reported[0].startswith("aiorl: actor-0 warning: UserWarning: ROLE-WARNING-MARKER (see ")
    assert "aiorl: actor-0 warning: LOGGED-MARKER (see " in proc.stdout
    assert "2 warning(s), 0 error(s) in the role logs; latest: actor-0 warning: LOGGED-MARKER" in output
    assert "try `aiorl eval" not in output  # random_agent exports no policy: no next command to suggest


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_live_panel_last_frame_is_the_end_not_the_last_running_row(tmp_path):
    cfg = load_config(data={"algo": "apex_dqn", "agent": {"scheduled_timesteps": 20_000}})
    out = Terminal()
    progress = Progress(cfg, tmp_path, stream=out)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    progress.start()
    progress.update()
    progress.interrupted()
    progress.stop(
        {
            "outcome": "interrupted",
            "ok": True,
            "stop_detail": "interrupted by SIGINT (launcher)",
            "env_steps": 11_500,
            "learner_steps": 560,
            "episodes": 40,
            "return_mean_100": 20.5,
        },
        roles_alive=0,
    )
    last = out.getvalue().rsplit("aiorl apex_dqn on CartPole-v1", 1)[1]
    assert "EXITED" in last and re.search(r"roles alive\s+0\b", last) and "eta" not in last
    assert "11,500" in last and "stopped: interrupted by SIGINT (launcher)" in last


def test_the_store_line_is_replay_a_queue_or_nothing_as_the_algorithm_keeps():
    assert re.search(r"replay\s+1,100 \(10%\)", frame(state_from(rows())))
    impala = {**rows()[-1], "queue/fragments": 5, "queue/capacity": 8}
    assert re.search(r"queue\s+5/8 fragments", frame(state_from([impala], store="queue")))
    text = frame(state_from(rows(), store=None))  # dppo, es: rounds, nothing worth a line
    assert "replay" not in text and "queue" not in text
    for algo, store in (("apex_dqn", "replay"), ("impala", "queue"), ("dppo", None), ("es", None)):
        progress = Progress(load_config(data={"algo": algo}), Path("RUN"), quiet=True)
        assert progress.state.store == store, algo


def test_elapsed_is_this_launchs_with_a_resumed_runs_total_beside_it():
    resumed = [{**row, "time_s": row["time_s"] + 600} for row in rows()]  # the clock of the first launch
    text = frame(state_from(resumed, elapsed_s=11.0))
    assert "elapsed 0:00:11 (run 0:10:11)" in text
    assert "elapsed 0:00:11" in frame(state_from(rows(), elapsed_s=11.0))
    assert "(run " not in frame(state_from(rows(), elapsed_s=11.0))

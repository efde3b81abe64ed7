"""`aiorl status RUN_DIR` prints what a run directory (or the coordinator it names) holds: role
names, reasons, failures, paths. Control characters in them are escaped, never sent to the terminal
raw (an OSC title, a cleared screen, a CSI written as one C1 byte, text reversed by a bidi override)."""

from __future__ import annotations

import argparse
import json

from aiorl.cli import status as status_cli

HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m", "\r\x08", "\u202e"]
ESCAPED = ["\\x1b]0;pwned\\x07", "\\x1b[2J", "\\x9b31m", "\\r\\x08", "\\u202e"]


def args(target, json_out: bool = False) -> argparse.Namespace:
    return argparse.Namespace(target=str(target), json=json_out, token_file=None, timeout=1.0)


def assert_escaped(text: str, count: int) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b\r\x08\u202e"), repr(text)
    for escaped in ESCAPED:
        assert text.count(escaped) >= count, (escaped, text)


def test_a_finished_runs_summary_is_printed_escaped(tmp_path, capsys):
    bad = "".join(HOSTILE)
    summary = {
        "ok": False,
        "outcome": f"failed{bad}",
        "stop_reason": "failed",
        "stop_detail": f"detail{bad}",
        "env_steps": 1,
        "learner_steps": 1,
        "episodes": 1,
        "roles": {f"actor-0{bad}": {"status": f"lost{bad}", "reason": f"why{bad}"}},
        "failures": [f"failure{bad}"],
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert status_cli.cmd_status(args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert_escaped(out, 6)
    assert "\n" in out.strip()  # its own lines stay lines


def test_a_live_status_is_printed_escaped(tmp_path, capsys, monkeypatch):
    bad = "".join(HOSTILE)
    live = {
        "phase": f"RUNNING{bad}",
        "stop_reason": f"stop{bad}",
        "env_steps": 1,
        "learner_steps": 1,
        "episodes": 1,
        "roles": {f"actor-0{bad}": {"status": f"alive{bad}", "pid": 7, "counters": {f"k{bad}": 1}, "reason": bad}},
    }

    async def fetch(*_args, **_kw):
        return live

    monkeypatch.setattr(status_cli, "resolve_target", lambda target, token_file: ("127.0.0.1", 1, b"t", None))
    monkeypatch.setattr(status_cli, "fetch_status", fetch)
    assert status_cli.cmd_status(args("127.0.0.1:1")) == 0
    assert_escaped(capsys.readouterr().out, 6)


def test_a_run_directorys_path_in_an_error_is_escaped(tmp_path, capsys):
    run_dir = tmp_path / ("run" + "".join(HOSTILE))
    run_dir.mkdir()
    assert status_cli.cmd_status(args(run_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no coordinator.json" in err
    assert_escaped(err, 1)


def test_json_output_holds_no_raw_control_characters(tmp_path, capsys):
    summary = {"ok": True, "env_steps": 1, "learner_steps": 1, "episodes": 1, "roles": {}, "failures": HOSTILE}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert status_cli.cmd_status(args(tmp_path, json_out=True)) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["failures"] == HOSTILE
    assert not any(c in out for c in "\x1b\x07\x9b\r\x08\u202e")

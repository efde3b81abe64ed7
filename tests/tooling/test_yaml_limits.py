"""What a config file may be (`aiorl.config.files`): at most MAX_CONFIG_BYTES, read no further; at
most MAX_CONFIG_VALUES values once its YAML aliases are expanded (an alias bomb under env.kwargs
hung `aiorl run`); no key given twice in one mapping, at any depth, in YAML or JSON (the last one
silently won). Each is one line naming the file and the key or line, exit 2, before any process
starts; anchors, aliases and merge keys of a sensible size still work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiorl.config import ConfigError, apply_overrides, read_config_file
from aiorl.config.files import MAX_CONFIG_BYTES, MAX_CONFIG_VALUES

ROOT = Path(__file__).resolve().parents[2]


def bomb(levels: int = 8) -> str:
    """env.kwargs whose last list stands for 10**levels ones, in a few hundred bytes."""
    lines = ["    l0: &l0 [" + ", ".join(["1"] * 10) + "]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "algo: apex_dqn\nenv:\n  id: CartPole-v1\n  kwargs:\n" + "\n".join(lines) + "\n"


def refused(path: Path, *words: str) -> str:
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message, message
    return message


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path):
    (tmp_path / "bomb.yaml").write_text(bomb())
    refused(tmp_path / "bomb.yaml", "env.kwargs.l", f"more than {MAX_CONFIG_VALUES:,} values", "aliases")


def test_an_alias_of_itself_is_refused(tmp_path):
    (tmp_path / "loop.yaml").write_text("algo: apex_dqn\nenv:\n  kwargs:\n    x: &x [1, *x]\n")
    refused(tmp_path / "loop.yaml", "env.kwargs.x", "alias of itself")


def test_an_alias_bomb_in_a_set_override_is_refused():
    value = "[" + ", ".join(["&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + ["*a"] * 9) + "]"
    for level in "bcdefg":
        prev = value
        value = f"[&{level} {prev}, " + ", ".join([f"*{level}"] * 9) + "]"
    with pytest.raises(ConfigError, match=f"more than {MAX_CONFIG_VALUES:,} values") as caught:
        apply_overrides({}, [f"env.kwargs.x={value}"])
    assert str(caught.value).startswith("--set 'env.kwargs.x=") and "\n" not in str(caught.value)


def test_anchors_aliases_and_merge_keys_of_a_sensible_size_still_work(tmp_path):
    (tmp_path / "ok.yaml").write_text(
        "base: &base {lr: 0.1, batch_size: 4}\nagent:\n  <<: *base\n  lr: 0.2\nlist: &l [1, 2]\nagain: *l\n"
    )
    data = read_config_file(tmp_path / "ok.yaml")
    assert data["agent"] == {"lr": 0.2, "batch_size": 4} and data["again"] == [1, 2]


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_still_reads_as_before(example):
    import yaml

    path = ROOT / "examples" / example
    assert read_config_file(path) == yaml.safe_load(path.read_text())


def test_a_file_over_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.write("algo: apex_dqn\n")
        f.write("#" * (MAX_CONFIG_BYTES - 15) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES + 1
    refused(path, f"at most {MAX_CONFIG_BYTES:,} bytes (1 MiB)", f"this one has {MAX_CONFIG_BYTES + 1:,}")
    # Two sparse GiB: refused from its size, nothing read.
    os.truncate(path, 2 << 30)
    refused(path, f"at most {MAX_CONFIG_BYTES:,} bytes")


def test_a_file_at_the_cap_is_read(tmp_path):
    path = tmp_path / "full.yaml"
    path.write_text("algo: apex_dqn\n" + "#" * (MAX_CONFIG_BYTES - 16) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert read_config_file(path) == {"algo": "apex_dqn"}


@pytest.mark.parametrize(
    "text, key, line",
    [
        ("algo: apex_dqn\nalgo: dppo\n", "'algo'", "line 2 (first at line 1)"),
        ("agent:\n  lr: 0.1\n  batch_size: 4\n  lr: 0.2\n", "'agent.lr'", "line 4 (first at line 2)"),
        ("env:\n  kwargs: {a: {b: 1, c: 2, b: 3}}\n", "'env.kwargs.a.b'", "line 2"),
        ("env:\n  wrappers:\n    - {TimeLimit: {x: 1, x: 2}}\n", "'env.wrappers[0].TimeLimit.x'", "line 3"),
    ],
)
def test_a_key_given_twice_in_yaml_is_refused_at_any_depth(tmp_path, text, key, line):
    (tmp_path / "dup.yaml").write_text(text)
    refused(tmp_path / "dup.yaml", f"duplicate key {key}", line)


@pytest.mark.parametrize("text", ['{"algo": "apex_dqn", "algo": "dppo"}', '{"env": {"kwargs": {"a": 1, "a": 2}}}'])
def test_a_key_given_twice_in_json_is_refused_at_any_depth(tmp_path, text):
    (tmp_path / "dup.json").write_text(text)
    refused(tmp_path / "dup.json", "duplicate key")
    assert json.loads(text)  # Python's json alone keeps the last one


@pytest.mark.parametrize("name, text", [("bomb.yaml", bomb()), ("dup.yaml", "algo: apex_dqn\nalgo: dppo\n")])
def test_aiorl_run_refuses_in_one_line_with_exit_2_before_any_process(tmp_path, name, text):
    run_dir = tmp_path / "run"
    (tmp_path / name).write_text(text + f"run: {{dir: {json.dumps(str(run_dir))}}}\n")
    env = {**os.environ, "AIORL_WARM_SPAWNER": "0"}
    env.pop("AIORL_FORKSERVER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], lines
    assert not run_dir.exists()

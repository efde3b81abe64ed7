"""Reading a config file and applying `--set key.path=value` overrides."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from aiorl.config.schema import ConfigError


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        hint = f"; to continue the run in it: aiorl run --resume {path}" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"config file {str(path)!r} is a directory, not a YAML or JSON file{hint}")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `key.path=value` overrides; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        key_path, raw = item.split("=", 1)
        keys = key_path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"--set {item!r}: empty key in {key_path!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: cannot parse value: {exc}") from None
        node = data
        for i, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(keys[: i + 1])} is not a section")
            node = child
        node[keys[-1]] = value
    return data

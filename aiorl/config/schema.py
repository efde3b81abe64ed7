"""The config schema: documented dataclass fields, and building dataclasses from mappings
with every error naming its key path."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from typing import Any

from aiorl.core.suggest import did_you_mean


class ConfigError(ValueError):
    """A run config that cannot work; the message names the key path."""


def doc(text: str, **kwargs):
    """A dataclass field with its documentation attached (shown by `aiorl config ALGO` and
    `aiorl config keys`: aiorl/experiment/reference.py)."""
    return field(metadata={"doc": text}, **kwargs)


def type_name(tp) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def coerce(value, tp, path: str):
    """Check `value` against annotation `tp`, converting only int -> float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        return build_dataclass(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 reads 5e-4 and 1e30 (no dot) as strings; take them as the numbers they are.
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif tp is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
    else:
        raise TypeError(f"unsupported config annotation {tp!r} at {path}")
    raise ConfigError(f"{path}: expected {type_name(tp)}, got {type(value).__name__} {value!r}")


def build_dataclass(cls, data, path: str):
    """Build dataclass `cls` from a mapping, naming the key path of any error."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            hint = did_you_mean(str(key), names, prefix=f"{path}." if path else "", cutoff=0.5)
            raise ConfigError(f"unknown key '{key_path}'{hint} (valid keys: {', '.join(names)})")
        kwargs[key] = coerce(value, hints[key], key_path)
    return cls(**kwargs)


def field_docs(cls) -> dict[str, str]:
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(cls)}

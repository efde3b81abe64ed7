"""Reading a config file and applying `--set key.path=value` overrides."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from aiorl.config.schema import ConfigError
from aiorl.core import unique_json
from aiorl.core.unique_json import DuplicateKey

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: the largest example is a few KB; PyYAML reads 1 MiB in seconds
MAX_CONFIG_VALUES = 100_000  # values in the config once YAML aliases are expanded


class _Refused(ValueError):
    """A config text refused before it is built: too big once expanded, or a key given twice."""


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        hint = f"; to continue the run in it: aiorl run --resume {path}" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"config file {str(path)!r} is a directory, not a YAML or JSON file{hint}")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = _read_capped(path)
    try:
        data = load_json(text) if path.suffix == ".json" else load_yaml(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    except _Refused as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _read_capped(path: Path) -> str:
    """The file's text, refused unread beyond MAX_CONFIG_BYTES (a file that grows meanwhile too)."""
    too_big = f"{path}: a config file may have at most {MAX_CONFIG_BYTES:,} bytes (1 MiB)"
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{too_big}; this one has {size:,}")
    with open(path) as f:
        text = f.read(MAX_CONFIG_BYTES + 1)
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ConfigError(too_big)
    return text


def load_json(text: str):
    """JSON with no key given twice in one object (json keeps the last one silently)."""

    try:
        return unique_json.loads(text)
    except DuplicateKey as exc:
        raise _Refused(f"duplicate key {exc.key!r} in one object (JSON would keep the last silently)") from None
    except RecursionError:
        raise _Refused("nested too deeply") from None


def load_yaml(text: str):
    """`yaml.safe_load`, refusing a key given twice in one mapping and a document whose aliases
    expand it beyond MAX_CONFIG_VALUES values (a few lines of anchors can stand for billions of
    values, which every later walk of the config would visit), both before anything is built."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node(node, {}, set(), "")
        return loader.construct_document(node)
    except RecursionError:
        raise _Refused("nested too deeply") from None
    finally:
        loader.dispose()


def _check_node(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int], where: str) -> int:
    """The values `node` stands for once its aliases are expanded (an alias is the node itself);
    _Refused for a duplicate key in it or beyond MAX_CONFIG_VALUES."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise _Refused(f"{where or 'the document'} (line {node.start_mark.line + 1}) holds an alias of itself")
    open_nodes.add(id(node))
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_check_node(item, sizes, open_nodes, f"{where}[{i}]") for i, item in enumerate(node.value))
    elif isinstance(node, yaml.MappingNode):
        size += _check_mapping(node, sizes, open_nodes, where)
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    if size > MAX_CONFIG_VALUES:
        raise _Refused(
            f"{where or 'the document'} (line {node.start_mark.line + 1}) stands for more than "
            f"{MAX_CONFIG_VALUES:,} values once its YAML aliases are expanded; a config needs far fewer"
        )
    return size


def _check_mapping(node: yaml.MappingNode, sizes: dict[int, int], open_nodes: set[int], where: str) -> int:
    size, seen = 0, {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key_node.tag == "tag:yaml.org,2002:merge":
            key = None  # `<<: *base`: its keys are meant to be overridden
        name = f"{where}.{key}" if where else str(key)
        if key is not None:
            identity = (key_node.tag, key)
            if identity in seen:
                raise _Refused(
                    f"duplicate key {name!r} at line {key_node.start_mark.line + 1} "
                    f"(first at line {seen[identity]}); YAML would keep the last silently"
                )
            seen[identity] = key_node.start_mark.line + 1
        size += _check_node(key_node, sizes, open_nodes, name) + _check_node(value_node, sizes, open_nodes, name)
    return size


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
            value = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: cannot parse value: {exc}") from None
        except _Refused as exc:
            raise ConfigError(f"--set {item!r}: {exc}") from None
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

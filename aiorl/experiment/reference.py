"""The config reference, generated from the config dataclasses: `aiorl config ...`.

- ``aiorl config ALGO``: every key of a run config for ALGO with its default,
  type and documentation, as commented YAML that `aiorl run` loads back.
- ``aiorl config show CONFIG [--set k=v ...]``: the resolved config of a file.
- ``aiorl config keys [ALGO]``: one line per dotted key (``agent.batch_size``).

Everything here is read from the dataclasses (`aiorl.config`) and the
algorithm registry (`aiorl.algos`: each algorithm's settings, which import no
torch), so a new key or a new algorithm shows up without touching this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import dataclass

import yaml

from aiorl.algos import available_algorithms, get_settings
from aiorl.config import Config, ConfigError
from aiorl.config import type_name as _type_name
from aiorl.experiment.loading import load_config

SECTIONS = ("env", "cluster", "agent", "run", "offline")  # then the algorithm's own `model`


@dataclass(frozen=True)
class Key:
    """One documented config key."""

    path: str  # dotted: agent.batch_size
    type: str
    default: object
    doc: str


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _keys_of(cls, prefix: str, instance=None) -> list[Key]:
    if not dataclasses.is_dataclass(cls):  # an algorithm without a model dataclass
        return []
    hints = typing.get_type_hints(cls)
    return [
        Key(
            f"{prefix}.{f.name}",
            _type_name(hints[f.name]),
            getattr(instance, f.name) if instance is not None else _default(f),
            f.metadata.get("doc", ""),
        )
        for f in dataclasses.fields(cls)
    ]


def section_classes(algo: str | None = None) -> dict[str, type]:
    """Section name -> its dataclass; `model` is `algo`'s own (left out without an algorithm)."""
    hints = typing.get_type_hints(Config)
    classes = {name: hints[name] for name in SECTIONS}
    if algo is not None:
        classes["model"] = get_settings(algo).model_config
    return classes


def keys(algo: str | None = None) -> list[Key]:
    """Every key of a config for `algo` (without one: the shared sections only)."""
    out = []
    for name, cls in section_classes(algo).items():
        out.extend(_keys_of(cls, name))
    return out


def all_keys() -> dict[str, list[str]]:
    """Every dotted key any config can hold -> the algorithms it applies to (all, for shared keys)."""

    names = available_algorithms()
    table = {"algo": list(names)}
    for key in keys():
        table[key.path] = list(names)
    for algo in names:
        for key in _keys_of(section_classes(algo)["model"], "model"):
            table.setdefault(key.path, []).append(algo)
    return table


def _flow(value) -> str:
    """`value` as one line of YAML (flow style), for `key: value`."""
    text = yaml.safe_dump([value], default_flow_style=True, width=10**9).strip()
    return text[1:-1]


def _comment(text: str) -> list[str]:
    return [f"# {line}" if line else "#" for line in text.splitlines()] or ["#"]


def render(cfg_like: dict[str, object], algo: str, header: str) -> str:
    """Commented YAML of a config: `cfg_like` maps each section to its dataclass instance
    (or None for the defaults)."""
    lines = [*_comment(header), "", "# Algorithm name; one of: " + ", ".join(_algorithms()), f"algo: {_flow(algo)}"]
    for name, cls in section_classes(algo).items():
        section_doc = next(f.metadata.get("doc", "") for f in dataclasses.fields(Config) if f.name == name)
        lines += ["", f"# {section_doc}"]
        section_keys = _keys_of(cls, name, cfg_like.get(name))
        if not section_keys:
            lines.append(f"{name}: {{}}")
            continue
        lines.append(f"{name}:")
        for key in section_keys:
            for line in _comment(f"{key.doc} ({key.type})".strip()):
                lines.append(f"  {line}")
            lines.append(f"  {key.path.split('.', 1)[1]}: {_flow(key.default)}")
    return "\n".join(lines) + "\n"


def _algorithms() -> list[str]:
    return available_algorithms()


def default_yaml(algo: str) -> str:
    # The agent section as the algorithm has it (`AlgorithmSettings.agent_defaults`), with the
    # budget and evaluation of its `starter`: a config that stops (a run without a budget is refused).
    starter = get_settings(algo).starter
    cfg = load_config(data={"algo": algo}, overrides=[f"{key}={_flow(value)}" for key, value in starter.items()])
    return render(
        # An offline algorithm's starter names its dataset, and its run no actors (cluster.actors 0).
        {"agent": cfg.agent, "run": cfg.run, "env": cfg.env, "cluster": cfg.cluster, "offline": cfg.offline},
        algo,
        f"aiorl run config for {algo}: every key with its default, type and documentation, and "
        f"a budget and evaluation to start from ({', '.join(f'{k}: {v}' for k, v in starter.items())}).\n"
        "Save it, edit it, then: aiorl run FILE.yaml",
    )


def resolved_yaml(cfg: Config, source: str) -> str:
    sections = {name: getattr(cfg, name) for name in (*SECTIONS, "model")}
    return render(sections, cfg.algo, f"resolved config of {source} (every key, defaults filled in)")


def keys_table(algo: str | None) -> str:
    if algo is not None:
        rows = [("algo", "str", algo, "Algorithm name.")] + [
            (k.path, k.type, _flow(k.default), k.doc) for k in keys(algo)
        ]
    else:
        table = all_keys()
        docs = {k.path: k for k in keys()}
        rows = []
        for path, algos in table.items():
            if path in docs:
                k = docs[path]
                rows.append((path, k.type, _flow(k.default), k.doc))
            elif path == "algo":
                rows.append((path, "str", "(required)", "one of " + ", ".join(algos)))
            else:
                rows.append((path, "", "", "model key of " + ", ".join(algos) + " (aiorl config keys ALGO)"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{p:<{width}}  {t:<12} {d:<12} {doc}".rstrip() for p, t, d, doc in rows) + "\n"


# --------------------------------------------------------------------------
# `aiorl config`


def cmd_config(args: argparse.Namespace) -> int:
    try:
        if args.what == "show":
            if args.arg is None:
                raise ConfigError("aiorl config show needs a CONFIG file")
            text = resolved_yaml(load_config(args.arg, args.set), args.arg)
        elif args.what == "keys":
            text = keys_table(_checked_algo(args.arg) if args.arg else None)
        else:
            if args.arg is not None:
                raise ConfigError(
                    f"aiorl config {args.what}: unexpected {args.arg!r} "
                    "(usage: aiorl config ALGO | show CONFIG | keys [ALGO])"
                )
            text = default_yaml(_checked_algo(args.what))
    except ConfigError as exc:
        print(f"aiorl config: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _checked_algo(name: str) -> str:
    get_settings(name)  # names the choices when unknown
    return name


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "config",
        help="print the config reference: every key with default, type and doc",
        description=__doc__.split("\n\n")[0] + " Algorithms: " + ", ".join(_algorithms()) + ".",
    )
    p.add_argument(
        "what",
        metavar="ALGO|show|keys",
        help="an algorithm (its full default config), 'show' (a file's resolved config) or 'keys'",
    )
    p.add_argument("arg", nargs="?", metavar="CONFIG|ALGO", help="the config file of 'show'; the algorithm of 'keys'")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="with 'show': override a value, as `aiorl run --set` does",
    )
    p.set_defaults(func=cmd_config)
    return p

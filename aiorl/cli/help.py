"""Examples and pointers at the end of each `aiorl ... --help`, kept in one place.

The subcommands' parsers live with their commands; `add_examples` appends
these once every parser exists (an unknown subcommand gets the pointer only).
"""

from __future__ import annotations

import argparse

from aiorl.algos import available_algorithms

KEYS_HELP = "Every config key, with its default, type and doc: `aiorl config ALGO` or `aiorl config keys`."

EXAMPLES = {
    None: [
        "aiorl run examples/apex_dqn_cartpole.yaml --set cluster.actors=2",
        "aiorl eval runs/apex_dqn-CartPole-v1-<timestamp> --episodes 20",
        "aiorl config apex_dqn > my.yaml",
    ],
    "run": [
        "aiorl run examples/apex_dqn_cartpole.yaml --set agent.batch_size=64",
        "aiorl run --resume runs/apex_dqn-CartPole-v1-<timestamp>",
        "AIORL_TOKEN=... aiorl run cfg.yaml --role actor --index 0 --set cluster.port=7000",
    ],
    "eval": ["aiorl eval runs/apex_dqn-CartPole-v1-<timestamp> --episodes 20 --seed 100"],
    "plot": ["aiorl plot runs/a runs/b -o curves.png --x time"],
    "status": ["aiorl status runs/apex_dqn-CartPole-v1-<timestamp> --json"],
    "config": [
        "aiorl config apex_dqn > my.yaml          every key of an apex_dqn run, with defaults and docs",
        "aiorl config show my.yaml --set agent.batch_size=64",
        "aiorl config keys                        every dotted key (keys dppo: with dppo's model keys)",
    ],
}


def _epilog(command: str | None) -> str:
    lines = []
    if command == "run":
        lines += [f"algorithms (algo:): {', '.join(available_algorithms())}", ""]
    if EXAMPLES.get(command):
        lines += ["examples:", *(f"  {example}" for example in EXAMPLES[command]), ""]
    return "\n".join([*lines, KEYS_HELP])


def add_examples(parser: argparse.ArgumentParser, subparsers) -> None:
    for command, sub in [(None, parser), *subparsers.choices.items()]:
        sub.epilog = _epilog(command)
        sub.formatter_class = argparse.RawDescriptionHelpFormatter

"""argparse value types shared by the subcommands: a bad value is argparse's one error line, exit 2."""

from __future__ import annotations

import argparse


def non_negative(kind=int):
    """An argparse ``type`` accepting numbers of `kind` that are >= 0."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} >= 0, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    parse.__name__ = f"non-negative {kind.__name__}"
    return parse

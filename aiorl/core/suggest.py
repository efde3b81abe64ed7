"""The "did you mean" of every error that names a bad key, name or metric: one rule, one place.

difflib alone scores by shared characters, which misleads on names made of words: for
``eval_return`` it picks ``eval/return_std`` (shorter) over ``eval/return_mean``. So a
candidate that holds every word of the name (``_ / . - :`` and case ignored) comes first,
the caller's `prefer` order breaking ties among those (the metric a person usually means);
otherwise the closest spelling wins, as difflib says.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

_SEPARATORS = re.compile(r"[\s_/.:\-]+")


def _words(text: str) -> list[str]:
    return [w for w in _SEPARATORS.split(text.lower()) if w]


def _holds_every_word(name: str, candidate: str) -> bool:
    """Each word of `name` begins a word of `candidate`, in order (``eval_ret`` in ``eval/return_mean``)."""
    words, theirs = _words(name), _words(candidate)
    at = 0
    for word in words:
        while at < len(theirs) and not theirs[at].startswith(word):
            at += 1
        if at == len(theirs):
            return False
        at += 1
    return bool(words)


def closest(name: str, candidates: Iterable[str], prefer: Iterable[str] = (), cutoff: float = 0.6) -> str | None:
    """The candidate `name` most likely meant, or None when none is close."""
    pool = list(dict.fromkeys(str(c) for c in candidates))
    if not pool:
        return None
    holding = [c for c in pool if _holds_every_word(name, c)]
    if holding:
        ranked = [p for p in prefer if p in holding]
        if ranked:
            return ranked[0]
        return max(holding, key=lambda c: difflib.SequenceMatcher(None, name.lower(), c.lower()).ratio())
    lowered = {c.lower(): c for c in pool}
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[match[0]] if match else None


def did_you_mean(
    name: str, candidates: Iterable[str], prefer: Iterable[str] = (), prefix: str = "", cutoff: float = 0.6
) -> str:
    """``"; did you mean 'X'?"`` for the closest candidate (`prefix` before it, e.g. a key's
    section), or ``""``: the tail of an error message."""
    match = closest(name, candidates, prefer, cutoff)
    return f"; did you mean '{prefix}{match}'?" if match is not None else ""

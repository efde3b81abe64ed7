"""JSON whose objects name each key once.

Python's `json` keeps the last value of a key given twice, silently; a file read by two readers
(aiorl's check, then another loader) or edited by hand could then mean two things. Every JSON aiorl
reads from a file someone else may have written (configs, policy.json, a weights file's header, a
policy archive's records) goes through `loads`, and each caller words the refusal for its file.
"""

from __future__ import annotations

import json


class DuplicateKey(ValueError):
    """A JSON object names `key` twice."""

    def __init__(self, key: str):
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


def unique_object(pairs: list[tuple[str, object]]) -> dict:
    """`json`'s object_pairs_hook: the object, or DuplicateKey for its first key given twice."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads(text: str | bytes):
    """`json.loads`, refusing any object that names a key twice (DuplicateKey)."""
    return json.loads(text, object_pairs_hook=unique_object)

"""Peer names and text from peers, made safe before anything logs them.

A peer chooses its handshake name, message kinds and error reasons; written
to a log as they came, a newline or an ANSI escape in them forges log lines
(or rewrites a terminal). Peer names are therefore held to a strict set of
characters, refused otherwise, and any other text from a peer goes through
`safe_text` on its way into a log line.
"""

from __future__ import annotations

import re

__all__ = ["PEER_NAME_CHARS", "MAX_PEER_NAME", "is_peer_name", "safe_text"]

#: What a peer name may hold: role names (``actor-3``), host-like names (``node.a_1``).
PEER_NAME_CHARS = "A-Z a-z 0-9 . _ -"
MAX_PEER_NAME = 64
_PEER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,%d}" % (MAX_PEER_NAME - 1))


def is_peer_name(name: object) -> bool:
    """True for 1..64 characters of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit."""
    return type(name) is str and _PEER_NAME.fullmatch(name) is not None


def safe_text(value: object, limit: int = 200) -> str:
    """`value` as one line of printable ASCII: everything else escaped, at most `limit` characters."""
    text = value if type(value) is str else str(value)
    if len(text) > limit:
        text = text[:limit]
        cut = "..."
    else:
        cut = ""
    if text.isascii() and text.isprintable():
        return text + cut
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text) + cut

"""The unit of exchange: a kind, small metadata and named arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Message"]


@dataclass(slots=True, repr=False)
class Message:
    """One received message.

    ``arrays`` are ``np.frombuffer``-style views over the frame's own receive
    buffer (writable, 8-byte aligned, no per-array copy). They stay valid for as
    long as you keep them; nothing reuses that buffer.
    """

    kind: str
    """Short message name chosen by the sender, e.g. ``"batch"``."""
    meta: dict[str, Any]
    """Small msgpack metadata (str keys; None/bool/int/float/str/bytes/list/dict values)."""
    arrays: dict[str, np.ndarray]
    """Named arrays."""
    request_id: int | None = None
    """Set on requests (answer them with ``Connection.reply``) and on their replies."""

    def __repr__(self) -> str:
        arrays = ", ".join(f"{name}:{a.dtype}{list(a.shape)}" for name, a in self.arrays.items())
        request = f" request_id={self.request_id}" if self.request_id is not None else ""
        return f"<Message {self.kind!r}{request} meta={self.meta!r:.200} arrays={{{arrays}}}>"


class _EOF:
    """Queue sentinel: the connection has ended and every message before it was delivered."""

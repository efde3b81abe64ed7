"""Process resources a role sets up before it serves: the open-file limit."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("aiorl.resources")


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) as they are now.

    Every connection is a file descriptor, and the usual soft limit (1024) is
    far below what the hard limit allows. Servers also cap connections that
    are still handshaking (see ``aiorl.wire.Server``), so this is headroom,
    not the defence.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. macOS caps it below an "unlimited" hard limit
            log.info("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard


def listen_backlog(peers: int) -> int:
    """The listen queue of a server that `peers` roles may all connect to at once.

    Every actor attaches to every memory host the moment the run starts; past
    a full queue Linux drops the connection's last ACK and the client waits
    for SYN-ACK retransmits (1 s, 3 s, 7 s...), which at 512 actors ran past
    the 10 s handshake timeout (bench/scale.py). The kernel caps it at
    net.core.somaxconn.
    """
    return max(128, peers)

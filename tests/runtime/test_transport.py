"""The transport seam (aiorl/runtime/transport.py): one value from the config, and every
``serve()``/``connect()`` of the runtime takes its transport arguments from it."""

from __future__ import annotations

import ast
import platform
import re
from pathlib import Path

import pytest

from aiorl.experiment.loading import load_config
from aiorl.runtime import local_sockets
from aiorl.runtime.transport import SOCKETS_ONLY, Transport, transport_of
from aiorl.wire import shm

ROOT = Path(__file__).resolve().parents[2]
LOCAL = {local_sockets.ENV_ON: "1"}  # what the local launcher gives each role it starts
RING = 256 * 1024


def _cfg(**cluster):
    return load_config(data={"algo": "random_agent", "cluster": {"shm_ring_bytes": RING, **cluster}})


@pytest.mark.parametrize(
    "cluster, environ, machine, unix, rings",
    [
        ({"transport": "auto"}, LOCAL, "x86_64", True, True),  # a local run on x86-64: rings
        ({"transport": "shm"}, LOCAL, "x86_64", True, True),
        ({"transport": "tcp"}, LOCAL, "x86_64", True, False),  # tcp: the sockets alone
        ({"transport": "auto"}, LOCAL, "aarch64", True, False),  # no rings where stores may reorder
        ({"transport": "auto"}, {}, "x86_64", False, False),  # Ray or by hand: TCP
        ({"transport": "auto", "unix_sockets": False}, LOCAL, "x86_64", False, False),
    ],
)
def test_each_config_gives_its_serve_and_connect_args(tmp_path, monkeypatch, cluster, environ, machine, unix, rings):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    transport = transport_of(_cfg(**cluster), environ)
    assert transport == Transport(unix_sockets=unix, ring_bytes=RING if rings else None)
    socket = str(tmp_path.absolute() / local_sockets.SOCKET_DIR / "memory-1")
    served = transport.server_args(tmp_path, "memory-1")
    assert served == {
        "unix_path": socket if unix else None,
        "rings": rings,
        "ring_bytes": RING if rings else shm.DEFAULT_RING_BYTES,
    }
    # A client: the peer's socket where it is on this host, and its ring listener where rings are on.
    Path(socket).parent.mkdir(exist_ok=True)
    Path(socket).touch()
    Path(shm.ring_path(socket)).touch()
    assert transport.peer_socket(socket) == (socket if unix else None)
    assert transport.connect_args(transport.peer_socket(socket)) == {
        "unix_path": socket if unix else None,
        "ring_path": shm.ring_path(socket) if rings else None,
    }


def test_the_ring_size_comes_from_the_config_never_from_the_environment(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("AIORL_SHM_RING_BYTES", "99")
    assert transport_of(_cfg(), LOCAL).serve_args("/run/sock/coordinator")["ring_bytes"] == RING
    assert transport_of(_cfg(shm_ring_bytes=1 << 20), LOCAL).ring_bytes == 1 << 20


def test_a_server_without_a_socket_hands_out_no_rings_and_a_peer_without_one_is_reached_over_tcp(tmp_path):
    transport = Transport(unix_sockets=True, ring_bytes=RING)
    assert transport.serve_args(None) == {"unix_path": None, "rings": False, "ring_bytes": RING}
    assert transport.connect_args(None) == {"unix_path": None, "ring_path": None}
    # An advertised socket that is not on this host, or no socket at all.
    assert transport.peer_socket(str(tmp_path / "elsewhere")) is None
    assert transport.peer_socket(None) is None and transport.peer_socket("") is None
    # A server of this host that hands out no rings: its socket alone.
    (tmp_path / "s").touch()
    assert transport.connect_args(str(tmp_path / "s")) == {"unix_path": str(tmp_path / "s"), "ring_path": None}


def test_the_launchers_own_connections_use_the_socket_and_never_rings(tmp_path):
    (tmp_path / "s").touch()
    (tmp_path / ("s" + shm.RING_SUFFIX)).touch()
    assert SOCKETS_ONLY.connect_args(str(tmp_path / "s")) == {"unix_path": str(tmp_path / "s"), "ring_path": None}


# The ring choice's inputs as code reads them: the old environment variable, the config's keys, the machine check.
CONFIG_READS = (r"\.shm_ring_bytes\b", r"\.cluster\.transport\b", r"\brings_supported\(")
READS = ("AIORL_SHM_RING_BYTES", r"\blocal_sockets\.ring", *CONFIG_READS)
TRANSPORT_KEYWORDS = {"unix_path", "ring_path", "rings", "ring_bytes"}
SEAM = ROOT / "aiorl" / "runtime" / "transport.py"


def _runtime_modules():
    for path in sorted((ROOT / "aiorl").rglob("*.py")):
        if path != SEAM and "wire" not in path.relative_to(ROOT / "aiorl").parts[:1]:
            yield path


def test_no_serve_or_connect_outside_the_seam_and_wire_spells_out_its_transport():
    """A new transport is aiorl/runtime/transport.py and aiorl/wire/: every other call takes
    its transport arguments from the seam (``**transport.serve_args(...)``)."""
    spelled = []
    for path in _runtime_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("serve", "connect"):
                for keyword in node.keywords:
                    if keyword.arg in TRANSPORT_KEYWORDS:
                        spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}({keyword.arg}=...)")
    assert spelled == []


def test_only_the_seam_reads_the_ring_choice():
    """The ring choice and size are the config's, read in the seam alone (the config checks them)."""
    readers = []
    for path in _runtime_modules():
        if path.parent.name == "config":
            continue
        text = path.read_text()
        for word in READS:
            if re.search(word, text):
                readers.append(f"{path.relative_to(ROOT)}: {word}")
    assert readers == []
    assert all(re.search(word, SEAM.read_text()) for word in CONFIG_READS)
    assert not any("AIORL_SHM_RING_BYTES" in p.read_text() for p in (ROOT / "aiorl" / "wire").glob("*.py"))
    assert not hasattr(local_sockets, "ENV_RINGS")

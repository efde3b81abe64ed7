"""The learners' torch.distributed rendezvous listens on the learners' address only."""

from __future__ import annotations

import json
import subprocess
import sys

from aiorl.runtime import rendezvous

SCRIPT = """
import json, psutil, torch.distributed as dist
from aiorl.runtime import rendezvous
url = rendezvous.listen("127.0.0.1")
rendezvous.init_process_group("gloo", url, 0, 1, 30)
listening = sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"})
dist.destroy_process_group()
print(json.dumps({"url": url, "listening": listening}))
"""


def test_store_and_gloo_listen_on_the_learners_address_only():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["url"].startswith("tcp://127.0.0.1:")
    assert result["listening"] == ["127.0.0.1"], result  # never 0.0.0.0 or ::


def test_listen_keeps_the_socket_bound_for_the_store():
    url = rendezvous.listen("127.0.0.1")
    try:
        sock = rendezvous._listening[url]
        assert sock.getsockname()[0] == "127.0.0.1" and url.endswith(f":{sock.getsockname()[1]}")
    finally:
        rendezvous._listening.pop(url).close()

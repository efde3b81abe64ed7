import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
import uvloop

from aiorl.runtime.warm_fork import ENV_FORKSERVER, set_parent_death_signal

# Tests live in folders by concern (kernels/, wire/, replay/, runtime/, rundirs/, algos/, cluster/,
# learning/, tooling/). Shared helpers (cluster_helpers, apex_helpers, hostile_helpers) sit here, and a
# test may import another concern's module by name (a frame-limit helper, a config builder): every
# folder is on the path whatever subset pytest was asked to run.
HERE = os.path.dirname(os.path.abspath(__file__))
for _folder in sorted(os.listdir(HERE)):
    _path = os.path.join(HERE, _folder)
    if os.path.isfile(os.path.join(_path, "conftest.py")) and _path not in sys.path:
        sys.path.append(_path)

# Every test may ask for `launch`: runs it starts are ended at its teardown, passed or failed.
from cluster_helpers import launch  # noqa: E402, F401


def pytest_asyncio_loop_factories(config, item):
    # Every async test runs on uvloop, the loop aiorl roles run on.
    return {"uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`make test` runs the suite on three workers, a file at a time: --dist
    # loadfile, in collection order) the long files go out first, so that a worker is not left
    # alone with a learning check at the end while the other has finished: the files with slow
    # checks, then those with cluster tests, then the rest. The order inside a file is kept (the
    # Ray tests rely on theirs); a run without workers keeps pytest's own order.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    weight: dict[str, tuple[int, int]] = {}
    for item in items:
        slow, cluster = weight.get(item.fspath.strpath, (0, 0))
        weight[item.fspath.strpath] = (
            slow + (item.get_closest_marker("slow") is not None),
            cluster + (item.get_closest_marker("cluster") is not None),
        )
    items.sort(key=lambda item: tuple(-w for w in weight[item.fspath.strpath]))


@pytest.fixture(scope="session", autouse=True)
def forkserver(request):
    """One fork server per test process (`aiorl.cli.forkserver`): every local `aiorl run` a test
    starts forks its warm spawner from it instead of importing torch and the runtime again, which
    was most of a short cluster test's CPU. It is ready a few seconds after the session starts;
    runs before that start spawners of their own. ``AIORL_TEST_FORKSERVER=0`` turns it off;
    tests/runtime/test_spawner.py turns it off for its own tests, which are about the spawner's start."""
    wanted = any(item.get_closest_marker("cluster") for item in request.session.items)
    if not wanted or os.environ.get("AIORL_TEST_FORKSERVER", "1") == "0":
        yield None  # a session without cluster tests launches no run: it would import torch for nothing
        return
    where = tempfile.mkdtemp(prefix="aiorl-forkserver-")  # 0700
    path = os.path.join(where, "sock")
    with open(os.path.join(where, "log"), "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "aiorl.cli.forkserver", path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),
        )
    os.environ[ENV_FORKSERVER] = path
    yield path
    os.environ.pop(ENV_FORKSERVER, None)
    proc.terminate()
    proc.wait()
    shutil.rmtree(where, ignore_errors=True)

import os

import uvloop


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

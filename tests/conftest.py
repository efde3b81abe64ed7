import uvloop


def pytest_asyncio_loop_factories(config, item):
    # Every async test runs on uvloop, the loop aiorl roles run on.
    return {"uvloop": uvloop.new_event_loop}

"""aiorl: distributed reinforcement learning on one asyncio loop per role.

Python API (imported on first use, so `import aiorl` stays cheap): `run`,
`RunResult`, `load_config`, `load_policy`, `Policy`, `ConfigError`; see aiorl/api.py.
"""

__version__ = "0.1.0"

_API = {
    "run": "aiorl.api",
    "RunResult": "aiorl.api",
    "load_policy": "aiorl.api",
    "Policy": "aiorl.api",
    "load_config": "aiorl.config",
    "Config": "aiorl.config",
    "ConfigError": "aiorl.config",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'aiorl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})

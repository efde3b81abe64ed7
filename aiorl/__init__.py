"""aiorl: distributed reinforcement learning on one asyncio loop per role.

Python API: `run`, `RunResult`, `load_config`, `load_policy`, `Policy`, `Config`,
`ConfigError` (aiorl/api.py). The API module is imported on first use, so that `import
aiorl` stays cheap: it brings torch and gymnasium.
"""

from aiorl.config import Config, ConfigError

__version__ = "0.1.0"

_API = ("run", "RunResult", "load_config", "load_policy", "Policy")
__all__ = ["__version__", "Config", "ConfigError", *_API]


def __getattr__(name: str):
    if name in _API:
        from aiorl import api

        return getattr(api, name)
    raise AttributeError(f"module 'aiorl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})

"""Launching a run: every role a child process of this one (`aiorl.launch.local`), or placed on
a Ray cluster (`aiorl.launch.ray_launcher`, `aiorl.launch.placement`); the live panel
(`aiorl.launch.panel`) and the roles' logs it reads (`aiorl.launch.role_logs`)."""

from __future__ import annotations

from aiorl.config import Config
from aiorl.launch.local import LocalLauncher


def launcher_for(cfg: Config) -> type[LocalLauncher]:
    """The launcher ``cluster.launcher`` names (the Ray one imports Ray: only when it is asked for)."""
    if cfg.cluster.launcher == "ray":
        from aiorl.launch.ray_launcher import RayLauncher

        return RayLauncher
    return LocalLauncher

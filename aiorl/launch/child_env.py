"""The environment a launcher gives a role process: its own, less every internal ``AIORL_*``
variable a launcher sets itself, then this launch's.

A launcher's roles learn which run and launch they belong to, where to resume from, and how to
reach the coordinator from variables only a launcher sets (`INTERNAL`). One left over in the
shell (``AIORL_RESUME_FROM`` after running a role by hand, say) must never reach a new run: a
new run would silently continue another run's checkpoint. So each is removed from what the
launcher inherits and set again only from this launch. The user's own variables stay
(``AIORL_TOKEN``, ``AIORL_WARM_SPAWNER``, ``AIORL_FORKSERVER``), and so does
``AIORL_HOLD_BEFORE_REGISTER`` (`aiorl.runtime.hold`), which the local launcher then gives to the
first process of each role of the launch the user started only, never to a restart: of a role in
place, or of the whole run.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiorl.io.rundir import ENV_ATTEMPT, ENV_LAUNCH_ID, ENV_RESUME_FROM, ENV_RUN_ID
from aiorl.runtime import local_sockets
from aiorl.runtime.warm_fork import ENV_SPAWNER_FD

INTERNAL = frozenset(
    {
        ENV_RUN_ID,
        ENV_LAUNCH_ID,
        ENV_ATTEMPT,
        ENV_RESUME_FROM,
        local_sockets.ENV_ON,
        local_sockets.ENV_COORDINATOR,
        ENV_SPAWNER_FD,
    }
)


def inherited(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less `INTERNAL`."""
    return {key: value for key, value in environ.items() if key not in INTERNAL}

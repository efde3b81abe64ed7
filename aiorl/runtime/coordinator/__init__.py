"""The coordinator, in memory host 0: `Coordinator` (the service) and its parts."""

from aiorl.runtime.coordinator.service import Coordinator

__all__ = ["Coordinator"]

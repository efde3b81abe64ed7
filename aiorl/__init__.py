"""aiorl: distributed reinforcement learning on one asyncio loop per role."""

__version__ = "0.1.0"

"""Compiled replay kernels (Cython). Import through `aiorl.replay`, not directly."""

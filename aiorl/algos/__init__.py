"""Algorithms: one module each, exposing ``ALGORITHM`` (see aiorl.runtime.algorithm)."""

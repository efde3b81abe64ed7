"""Compiled kernels (Cython): replay, imported through `aiorl.replay`, not directly; and `wire`, the
wire's hot steps (`aiorl.wire.codec`, `aiorl.wire.ring`)."""

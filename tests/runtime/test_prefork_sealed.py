"""The warm spawner's prefork memfd (ES's noise table, shared by every role it forks) is sealed
before it is mapped: nothing holding the descriptor can write it, resize it or unseal it, and a
writable mapping of it is refused, so no role can change the table the others read."""

from __future__ import annotations

import fcntl
import mmap
import os

import numpy as np
import pytest

from aiorl.launch.spawner import map_arrays, prefork_memfd, write_arrays

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfds are Linux's")


def test_the_prefork_memfd_is_sealed_against_writes_resizes_and_writable_mappings():
    noise = np.random.default_rng(0).standard_normal(1000, dtype=np.float32)
    fd = prefork_memfd()
    try:
        got = map_arrays(fd, write_arrays(fd, {"noise": noise}))
        size = os.fstat(fd).st_size
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        for name in ("F_SEAL_WRITE", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL"):
            assert seals & getattr(fcntl, name), name
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\0" * 4, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, size + mmap.PAGESIZE)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with open(f"/proc/self/fd/{fd}", "r+b", buffering=0) as again:  # a reopened copy, as a role could
            with pytest.raises(PermissionError):
                again.write(b"\0" * 4)
        assert os.fstat(fd).st_size == size and np.array_equal(got["noise"], noise)
    finally:
        os.close(fd)

# cython: language_level=3
"""Types and tiny inline helpers shared by the replay kernels (cimported, no module of its own)."""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

ctypedef fused floating:
    float
    double

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define AIORL_PREFETCH(p) __builtin_prefetch((const void *)(p))
    #else
    #define AIORL_PREFETCH(p) ((void)0)
    #endif
    """
    void prefetch "AIORL_PREFETCH"(const void *p) noexcept nogil


cdef inline void copy_row(char *dst, const char *src, Py_ssize_t nbytes) noexcept nogil:
    # A memcpy with a constant size compiles to one or two moves; with a runtime
    # size it is a libc call per row, which dominates small-row gathers.
    if nbytes == 4:
        memcpy(dst, src, 4)
    elif nbytes == 8:
        memcpy(dst, src, 8)
    elif nbytes == 16:
        memcpy(dst, src, 16)
    elif nbytes == 1:
        memcpy(dst, src, 1)
    else:
        memcpy(dst, src, nbytes)


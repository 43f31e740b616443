# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native expiry scan over the registry's timestamp column (twin: engine/registry/_expiry_py.py).

One pass without the GIL over ``last_update`` and ``live``; the indices found go into a C buffer that doubles
when full, and are copied into a numpy array at the end (a scan normally finds few or none). Bounds: the loop
index runs over ``[0, n)`` where ``n`` is the length of both views, checked equal before the loop, so the
disabled bounds checks are safe.
"""
import numpy as np

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from engine.registry._expiry_py import check_columns

__all__ = ["scan_expired", "monotonic_ms"]


def monotonic_ms():
    """CLOCK_MONOTONIC in whole milliseconds: the clock ``time.monotonic_ns()`` reads, without the Python float or
    the big-int division (the registry reads it once per heartbeat)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


def scan_expired(last_update, live, now, timeout):
    """Slots that are live and whose last update is more than ``timeout`` ms before ``now`` (ascending int64)."""
    cdef int64_t c_now
    cdef int64_t c_timeout
    try:
        c_now = now
        c_timeout = timeout
    except OverflowError:
        raise OverflowError("now and timeout must fit in int64") from None
    lu_arr, lv_arr = check_columns(last_update, live, c_timeout)
    cdef const int64_t[:] lu = lu_arr
    cdef const uint8_t[:] lv = lv_arr
    cdef Py_ssize_t n = lu.shape[0]
    cdef Py_ssize_t i
    cdef Py_ssize_t found = 0
    cdef Py_ssize_t cap = 256
    cdef Py_ssize_t* grown
    cdef uint64_t limit = <uint64_t>c_timeout
    cdef int64_t t
    cdef bint oom = False
    cdef Py_ssize_t* out = <Py_ssize_t*>malloc(cap * sizeof(Py_ssize_t))
    if out == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in range(n):
                t = lu[i]
                # exact test of now - t > timeout: only older timestamps qualify, compared as unsigned distance
                if lv[i] != 0 and t < c_now and <uint64_t>c_now - <uint64_t>t > limit:
                    if found == cap:
                        grown = <Py_ssize_t*>realloc(out, 2 * cap * sizeof(Py_ssize_t))
                        if grown == NULL:
                            oom = True
                            break
                        out = grown
                        cap *= 2
                    out[found] = i
                    found += 1
        if oom:
            raise MemoryError()
        result = np.empty(found, dtype=np.int64)
        _copy_out(result, out, found)
        return result
    finally:
        free(out)


cdef void _copy_out(int64_t[::1] dst, Py_ssize_t* src, Py_ssize_t count) noexcept:
    # dst was allocated with exactly `count` elements just before; Py_ssize_t is int64 on the 64-bit targets
    cdef Py_ssize_t j
    if sizeof(Py_ssize_t) == sizeof(int64_t):
        if count:
            memcpy(&dst[0], src, count * sizeof(int64_t))
    else:
        for j in range(count):
            dst[j] = src[j]

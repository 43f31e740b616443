# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native expiry scan over the registry's timestamp column (twin: engine/registry/_expiry_py.py).

One pass without the GIL over ``last_update`` and ``live`` in blocks tested by a vectorised reduction (AVX2 where
the CPU has it); the indices found go into a C buffer that doubles when full, and are copied into a numpy array at
the end (a scan normally finds few or none). Bounds: the loop
index runs over ``[0, n)`` where ``n`` is the length of both views, checked equal before the loop, so the
disabled bounds checks are safe.
"""
import numpy as np

from libc.stdint cimport INT64_MIN, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from engine.registry._expiry_py import check_columns, check_scalars

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    /* Whether any of n slots is live with a timestamp below thr: a branch-free reduction the compiler vectorises; on
       x86-64 with GCC or Clang an AVX2 clone is picked at load time when the CPU has it (64-bit compares are
       AVX2's), the default clone elsewhere. */
    #if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
    #if __has_attribute(target_clones)
    #define EXPIRY_CLONES __attribute__((target_clones("avx2", "default")))
    #endif
    #endif
    #ifndef EXPIRY_CLONES
    #define EXPIRY_CLONES
    #endif
    EXPIRY_CLONES static int expiry_any_below(const int64_t *t, const uint8_t *live, ptrdiff_t n, int64_t thr) {
        int64_t flag = 0;
        for (ptrdiff_t j = 0; j < n; j++)
            flag |= (int64_t)(live[j] != 0) & (int64_t)(t[j] < thr);
        return flag != 0;
    }
    """
    int expiry_any_below(const int64_t* t, const uint8_t* live, Py_ssize_t n, int64_t thr) nogil

DEF BLOCK = 2048

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
    now, timeout = check_scalars(now, timeout)  # the twin's checks: same accepted types and errors
    c_now = now
    c_timeout = timeout
    lu_arr, lv_arr = check_columns(last_update, live, c_timeout)
    lu_arr, lv_arr = np.ascontiguousarray(lu_arr), np.ascontiguousarray(lv_arr)  # a copy only of a strided view
    cdef const int64_t[:] lu = lu_arr
    cdef const uint8_t[:] lv = lv_arr
    cdef Py_ssize_t n = lu.shape[0]
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t j, end
    cdef Py_ssize_t found = 0
    cdef Py_ssize_t cap = 256
    cdef Py_ssize_t* grown
    cdef bint oom = False
    cdef bint none = c_now < INT64_MIN + c_timeout
    # live and now - t > timeout in exact arithmetic is t < now - timeout (timeout >= 0); when now - timeout is
    # below int64's range no slot qualifies
    cdef int64_t thr = 0 if none else c_now - c_timeout
    cdef const int64_t* lp = &lu[0] if n else NULL
    cdef const uint8_t* vp = &lv[0] if n else NULL
    cdef Py_ssize_t* out = <Py_ssize_t*>malloc(cap * sizeof(Py_ssize_t))
    if out == NULL:
        raise MemoryError()
    try:
        with nogil:
            # blocks of BLOCK slots go through the vectorised test; only a block with a hit is walked again
            while not none and i < n and not oom:
                end = i + BLOCK if n - i > BLOCK else n
                if expiry_any_below(lp + i, vp + i, end - i, thr):
                    for j in range(i, end):
                        if vp[j] != 0 and lp[j] < thr:
                            if found == cap:
                                grown = <Py_ssize_t*>realloc(out, 2 * cap * sizeof(Py_ssize_t))
                                if grown == NULL:
                                    oom = True
                                    break
                                out = grown
                                cap *= 2
                            out[found] = j
                            found += 1
                i = end
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

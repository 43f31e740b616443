# cython: language_level=3
"""Native helper of the Spark scan: numbering the distinct heartbeat bodies of a recording split.

A client sends the same bytes every 30 s until its state changes, so a body is nearly always equal to the last
body seen on its connection: one length check and memcmp against that body settle most records without creating
a bytes object or hashing. The pure-Python twin is ``engine.bindings.segments.BodyDeduperPy`` (same results).
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcmp

import numpy as np

from engine.recorder import SegmentError


cdef class BodyDeduper:
    """Numbers distinct bodies in first-seen order across any number of ``add`` calls.

    ``bodies`` is the list of distinct bodies (index = id).
    """

    cdef object _last_arr  # numpy int64: connection index -> id of its last body, -1 before the first
    cdef readonly list bodies
    cdef dict _index

    def __init__(self):
        self.bodies = []
        self._index = {}
        self._last_arr = np.full(1024, -1, dtype=np.int64)

    def __len__(self):
        return len(self.bodies)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def add(self, const long long[::1] conn_index, const int[::1] offsets, const unsigned char[::1] data):
        """Ids (int64 array) of the bodies ``data[offsets[i]:offsets[i + 1]]`` received on connection
        ``conn_index[i]`` (a small non-negative index per connection, e.g. from numpy.unique)."""
        cdef Py_ssize_t n = conn_index.shape[0]
        cdef Py_ssize_t i, body_id, c
        cdef int a, b, length
        cdef object prev, body, found
        if offsets.shape[0] != n + 1:
            raise SegmentError(f"{offsets.shape[0]} offsets for {n} bodies")
        # the loop below indexes data[a:b] only after these checks prove 0 <= a <= b <= len(data)
        if n >= 0 and offsets[0] < 0:
            raise SegmentError("negative body offset at 0")
        for i in range(n):
            if offsets[i + 1] < offsets[i]:
                raise SegmentError(f"body offsets descend at {i + 1}")
        if offsets[n] > data.shape[0]:
            raise SegmentError(f"body offsets end at {offsets[n]}, past the {data.shape[0]} data bytes")
        cdef long long top = -1
        for i in range(n):
            if conn_index[i] < 0:
                raise SegmentError(f"negative connection index at {i}")
            if conn_index[i] > top:
                top = conn_index[i]
        if top >= len(self._last_arr):  # grow; every conn_index[i] < len(last) from here on
            grown = np.full(max(top + 1, 2 * len(self._last_arr)), -1, dtype=np.int64)
            grown[: len(self._last_arr)] = self._last_arr
            self._last_arr = grown
        cdef long long[::1] last = self._last_arr
        out = np.empty(n, dtype=np.int64)
        cdef long long[::1] ids = out
        cdef const char* base = <const char*>&data[0] if data.shape[0] else <const char*>b""
        for i in range(n):
            a = offsets[i]
            b = offsets[i + 1]
            length = b - a
            c = conn_index[i]
            body_id = last[c]
            if body_id >= 0:
                prev = self.bodies[body_id]
                if PyBytes_GET_SIZE(prev) == length and memcmp(PyBytes_AS_STRING(prev), base + a, length) == 0:
                    ids[i] = body_id
                    continue
            body = PyBytes_FromStringAndSize(base + a, length)
            found = self._index.get(body)
            if found is None:
                body_id = len(self.bodies)
                self.bodies.append(body)
                self._index[body] = body_id
            else:
                body_id = found
            last[c] = body_id
            ids[i] = body_id
        return out

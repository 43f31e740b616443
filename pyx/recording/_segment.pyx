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

from engine.recording.recorder import SegmentError


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


# ---------------------------------------------------------------------------------------------------------------
# The scan task's per-record work: whole decompressed blocks in, per-record columns and member runs out.

from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

import sys

# Fixed bytes of a decompressed block (engine.recording.recorder's layout): 29 per record plus the two trailing offsets.
cdef enum:
    RECORD_FIXED = 29
    BLOCK_FIXED = 8


cdef inline int64_t _i64(const unsigned char* p) noexcept nogil:
    cdef int64_t v
    memcpy(&v, p, 8)  # unaligned-safe load; the layout is little-endian (checked at construction)
    return v


cdef inline int32_t _i32(const unsigned char* p) noexcept nogil:
    cdef int32_t v
    memcpy(&v, p, 4)
    return v


cdef void* _grow(void* p, Py_ssize_t count, size_t item) except NULL:
    cdef void* q = realloc(p, <size_t>count * item if count else item)
    if q == NULL:
        raise MemoryError()
    return q


cdef class BlockScanner:
    """Per-record columns of decompressed recorder blocks (``add_block``): receive time, connection id and body
    id, the body's index among the distinct bodies seen so far (``bodies``, first-seen order), without a Python
    object per record.

    A body nearly always equals the last body of its connection (clients resend the same bytes until their state
    changes): one length check and memcmp settle it; only other bodies are hashed. Connection ids map to a dense
    index through an open-addressing table. ``add_block`` validates the whole block before changing any state, so
    a block it rejects (SegmentError) leaves the scanner as it was. Pure-Python twin:
    ``engine.bindings.segments.BlockScannerPy``.
    """

    cdef int64_t* _recv
    cdef int64_t* _conn
    cdef int32_t* _ids
    cdef Py_ssize_t _n, _cap
    cdef int64_t* _hkeys        # connection table: key
    cdef int32_t* _hvals        # dense index, -1 = empty slot
    cdef Py_ssize_t _hcap, _nconn
    cdef int32_t* _last         # dense connection index -> id of its last body
    cdef Py_ssize_t _last_cap
    cdef readonly list bodies
    cdef dict _index
    cdef const char** _bptr     # id -> the body's bytes (kept alive by self.bodies)
    cdef Py_ssize_t* _blen
    cdef Py_ssize_t _bcap

    def __cinit__(self):
        self._recv = self._conn = NULL
        self._ids = self._hvals = self._last = NULL
        self._hkeys = NULL
        self._bptr = NULL
        self._blen = NULL
        self._n = self._cap = self._hcap = self._nconn = self._last_cap = self._bcap = 0

    def __init__(self):
        if sys.byteorder != "little":
            raise RuntimeError("BlockScanner reads the little-endian block layout natively; use BlockScannerPy")
        self.bodies = []
        self._index = {}
        self._hcap = 1024
        self._hkeys = <int64_t*>_grow(NULL, self._hcap, sizeof(int64_t))
        self._hvals = <int32_t*>_grow(NULL, self._hcap, sizeof(int32_t))
        memset(self._hvals, 0xff, self._hcap * sizeof(int32_t))

    def __dealloc__(self):
        free(self._recv)
        free(self._conn)
        free(self._ids)
        free(self._hkeys)
        free(self._hvals)
        free(self._last)
        free(self._bptr)
        free(self._blen)

    @property
    def n_records(self):
        return self._n

    cdef int32_t _dense(self, int64_t key) except -1:
        """The dense index of a connection id, assigned on first sight."""
        cdef size_t mask = <size_t>self._hcap - 1
        cdef size_t h = (<uint64_t>key * <uint64_t>0x9E3779B97F4A7C15) >> 17
        cdef size_t slot = h & mask
        while self._hvals[slot] >= 0:
            if self._hkeys[slot] == key:
                return self._hvals[slot]
            slot = (slot + 1) & mask
        if self._nconn >= 0x7FFFFFFF:
            raise SegmentError("more than 2**31 connections")
        cdef int32_t d = <int32_t>self._nconn
        self._hkeys[slot] = key
        self._hvals[slot] = d
        self._nconn += 1
        if self._nconn >= self._last_cap:
            self._last_cap = max(1024, 2 * self._last_cap)
            self._last = <int32_t*>_grow(self._last, self._last_cap, sizeof(int32_t))
        self._last[d] = -1
        if 2 * self._nconn > self._hcap:
            self._rehash()
        return d

    cdef int _rehash(self) except -1:
        cdef Py_ssize_t old_cap = self._hcap, i
        cdef int64_t* old_keys = self._hkeys
        cdef int32_t* old_vals = self._hvals
        cdef Py_ssize_t cap = 2 * old_cap
        cdef int64_t* keys = <int64_t*>malloc(cap * sizeof(int64_t))
        cdef int32_t* vals = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef size_t mask = <size_t>cap - 1, slot
        if keys == NULL or vals == NULL:
            free(keys)
            free(vals)
            raise MemoryError()
        memset(vals, 0xff, cap * sizeof(int32_t))
        for i in range(old_cap):
            if old_vals[i] >= 0:
                slot = ((<uint64_t>old_keys[i] * <uint64_t>0x9E3779B97F4A7C15) >> 17) & mask
                while vals[slot] >= 0:
                    slot = (slot + 1) & mask
                keys[slot] = old_keys[i]
                vals[slot] = old_vals[i]
        self._hkeys, self._hvals, self._hcap = keys, vals, cap
        free(old_keys)
        free(old_vals)
        return 0

    cdef int32_t _new_body(self, const char* p, Py_ssize_t length) except -1:
        body = PyBytes_FromStringAndSize(p, length)
        found = self._index.get(body)
        if found is not None:
            return <int32_t>found
        cdef Py_ssize_t body_id = len(self.bodies)
        if body_id >= 0x7FFFFFFF:
            raise SegmentError("more than 2**31 distinct bodies")
        if body_id >= self._bcap:
            self._bcap = max(1024, 2 * self._bcap)
            self._bptr = <const char**>_grow(self._bptr, self._bcap, sizeof(char*))
            self._blen = <Py_ssize_t*>_grow(self._blen, self._bcap, sizeof(Py_ssize_t))
        self.bodies.append(body)
        self._index[body] = body_id
        self._bptr[body_id] = PyBytes_AS_STRING(body)
        self._blen[body_id] = length
        return <int32_t>body_id

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def add_block(self, const unsigned char[::1] raw, Py_ssize_t n_records, int64_t first_ms, int64_t last_ms,
                  str where="block"):
        """Append the records of one decompressed block (engine.recording.recorder's columnar layout) whose header claims
        ``n_records`` records received between ``first_ms`` and ``last_ms``. Raises SegmentError, changing
        nothing, when the layout or the receive times disagree."""
        cdef Py_ssize_t size = raw.shape[0]
        cdef Py_ssize_t n = n_records, i
        if n < 0 or n > (size - BLOCK_FIXED) // RECORD_FIXED:
            raise SegmentError(f"{where}: block of {n} records needs {n * RECORD_FIXED + BLOCK_FIXED} bytes, "
                               f"payload has {size}")
        # from here 29 n + 8 <= size: every fixed column lies inside raw
        cdef const unsigned char* p = &raw[0]
        cdef const unsigned char* recv = p
        cdef const unsigned char* conn = p + 8 * n
        cdef const unsigned char* addr_off = p + 20 * n
        cdef const unsigned char* body_off = p + 24 * n + 4
        cdef Py_ssize_t pos = RECORD_FIXED * n + BLOCK_FIXED
        cdef int32_t a, b
        if _i32(addr_off) != 0 or _i32(body_off) != 0:
            raise SegmentError(f"{where}: {'address' if _i32(addr_off) != 0 else 'body'} offsets are not "
                               f"ascending from 0")
        for i in range(n):
            if _i32(addr_off + 4 * i + 4) < _i32(addr_off + 4 * i):
                raise SegmentError(f"{where}: address offsets are not ascending from 0")
        for i in range(n):
            if _i32(body_off + 4 * i + 4) < _i32(body_off + 4 * i):
                raise SegmentError(f"{where}: body offsets are not ascending from 0")
        # offsets ascend from 0, so 0 <= offset[i] <= offset[n] for all i; the data regions must fill raw exactly
        cdef int64_t addr_len = _i32(addr_off + 4 * n), body_len = _i32(body_off + 4 * n)
        if pos + addr_len + body_len != size:
            raise SegmentError(f"{where}: columns need {pos + addr_len + body_len} bytes, payload has {size}")
        cdef int64_t t, lo = 0, hi = 0
        for i in range(n):
            t = _i64(recv + 8 * i)
            if i == 0 or t < lo:
                lo = t
            if i == 0 or t > hi:
                hi = t
        if n and (lo != first_ms or hi != last_ms):
            raise SegmentError(f"{where}: receive times disagree with the block header")
        if self._n + n > self._cap:
            self._cap = max(self._n + n, 2 * self._cap, 4096)
            self._recv = <int64_t*>_grow(self._recv, self._cap, sizeof(int64_t))
            self._conn = <int64_t*>_grow(self._conn, self._cap, sizeof(int64_t))
            self._ids = <int32_t*>_grow(self._ids, self._cap, sizeof(int32_t))
        cdef const char* bodies = <const char*>(p + pos + addr_len)
        cdef int64_t c
        cdef int32_t d, body_id
        cdef Py_ssize_t length, k = self._n
        for i in range(n):
            c = _i64(conn + 8 * i)
            a = _i32(body_off + 4 * i)
            b = _i32(body_off + 4 * i + 4)
            length = b - a
            d = self._dense(c)
            body_id = self._last[d]
            if not (body_id >= 0 and self._blen[body_id] == length
                    and memcmp(self._bptr[body_id], bodies + a, length) == 0):
                body_id = self._new_body(bodies + a, length)
                self._last[d] = body_id
            self._recv[k] = _i64(recv + 8 * i)
            self._conn[k] = c
            self._ids[k] = body_id
            k += 1
        self._n = k

    def columns(self):
        """(recv_ms int64, conn_id int64, body id int32) arrays of every record added, in order (copies)."""
        recv = np.empty(self._n, dtype=np.int64)
        conn = np.empty(self._n, dtype=np.int64)
        ids = np.empty(self._n, dtype=np.int32)
        cdef int64_t[::1] rv = recv
        cdef int64_t[::1] cv = conn
        cdef int32_t[::1] iv = ids
        if self._n:
            memcpy(&rv[0], self._recv, self._n * sizeof(int64_t))
            memcpy(&cv[0], self._conn, self._n * sizeof(int64_t))
            memcpy(&iv[0], self._ids, self._n * sizeof(int32_t))
        return recv, conn, ids


cdef struct _Runs:
    int64_t* o64     # per run: conn, first, last, n
    int32_t* o32     # per run: member, key
    Py_ssize_t n, cap


cdef int _emit_run(_Runs* out, Py_ssize_t m, int32_t key, int64_t conn, int64_t first, int64_t last,
                   int64_t count) except -1:
    """Append a closed run, growing the buffers (a failed realloc raises and leaves them valid for free)."""
    if out.n == out.cap:
        out.cap = max(1024, 2 * out.cap)
        out.o64 = <int64_t*>_grow(out.o64, 4 * out.cap, sizeof(int64_t))
        out.o32 = <int32_t*>_grow(out.o32, 2 * out.cap, sizeof(int32_t))
    out.o32[2 * out.n] = <int32_t>m
    out.o32[2 * out.n + 1] = key
    out.o64[4 * out.n] = conn
    out.o64[4 * out.n + 1] = first
    out.o64[4 * out.n + 2] = last
    out.o64[4 * out.n + 3] = count
    out.n += 1
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def member_runs(const int64_t[::1] recv, const int64_t[::1] conn, const int32_t[::1] ids,
                const int32_t[::1] body_client, const int32_t[::1] entry_offsets, const int32_t[::1] entry_member,
                const int32_t[::1] entry_key, Py_ssize_t n_clients, Py_ssize_t n_members, int64_t split_ms):
    """The scan's maximal member runs of records given as columns (receive time, connection, body id), in one
    pass without sorting.

    Body ``b`` belongs to client ``body_client[b]`` (-1: a bad body, counted) and holds the observations
    ``entry_offsets[b] <= e < entry_offsets[b + 1]``: member ``entry_member[e]`` (a (role, group, client)) with
    subscription-set id ``entry_key[e]`` (-1: none). A member's observations join one run while they stay on one
    connection with the same set id and at most ``split_ms`` apart.

    That is the Spark merge's order only if every client's records come in (receive time, connection) order, and
    records of a client with the same time and connection carry the same body: the pass checks this and returns
    None when it does not hold (the caller then sorts). Otherwise returns (member, conn_id, key, first_ms,
    last_ms, n) arrays of the runs and (bad records, min receive time, max receive time) of all records.
    """
    cdef Py_ssize_t n = recv.shape[0], n_bodies = body_client.shape[0], n_entries = entry_member.shape[0]
    cdef Py_ssize_t i, e, m
    if conn.shape[0] != n or ids.shape[0] != n:
        raise ValueError("recv, conn and ids differ in length")
    if entry_offsets.shape[0] != n_bodies + 1 or entry_key.shape[0] != n_entries:
        raise ValueError("entry tables do not match the bodies")
    if n_clients < 0 or n_members < 0 or split_ms < 0:
        raise ValueError("negative table size or split_ms")
    # bounds, proved once here for the unchecked loop below
    if entry_offsets[0] != 0 or entry_offsets[n_bodies] != n_entries:
        raise ValueError("entry offsets must run from 0 to the number of entries")
    for i in range(n_bodies):
        if entry_offsets[i + 1] < entry_offsets[i]:
            raise ValueError(f"entry offsets descend at {i + 1}")
        if body_client[i] < -1 or body_client[i] >= n_clients:
            raise ValueError(f"body {i}: client {body_client[i]} out of range")
    for e in range(n_entries):
        if entry_member[e] < 0 or entry_member[e] >= n_members or entry_key[e] < -1:
            raise ValueError(f"entry {e}: member or key out of range")
    for i in range(n):
        if ids[i] < 0 or ids[i] >= n_bodies:
            raise ValueError(f"record {i}: body id {ids[i]} out of range")

    cdef int64_t* c_recv = <int64_t*>_grow(NULL, n_clients, sizeof(int64_t))
    cdef int64_t* c_conn = NULL
    cdef int32_t* c_body = NULL
    cdef int64_t* m_conn = NULL
    cdef int64_t* m_first = NULL
    cdef int64_t* m_last = NULL
    cdef int64_t* m_n = NULL
    cdef int32_t* m_key = NULL
    cdef _Runs out
    out.o64 = NULL
    out.o32 = NULL
    out.n = out.cap = 0
    cdef int64_t t, c, lo = 0, hi = 0, n_bad = 0
    cdef int32_t b, cl, key
    cdef bint ordered = True
    cdef int64_t[:, ::1] wv
    cdef int32_t[:, ::1] nv
    try:
        c_conn = <int64_t*>_grow(NULL, n_clients, sizeof(int64_t))
        c_body = <int32_t*>_grow(NULL, n_clients, sizeof(int32_t))
        m_conn = <int64_t*>_grow(NULL, n_members, sizeof(int64_t))
        m_first = <int64_t*>_grow(NULL, n_members, sizeof(int64_t))
        m_last = <int64_t*>_grow(NULL, n_members, sizeof(int64_t))
        m_n = <int64_t*>_grow(NULL, n_members, sizeof(int64_t))
        m_key = <int32_t*>_grow(NULL, n_members, sizeof(int32_t))
        for i in range(n_clients):
            c_body[i] = -1  # no record yet
        for i in range(n_members):
            m_n[i] = 0      # no open run
        for i in range(n):
            t = recv[i]
            c = conn[i]
            b = ids[i]
            if i == 0 or t < lo:
                lo = t
            if i == 0 or t > hi:
                hi = t
            cl = body_client[b]
            if cl < 0:
                n_bad += 1
                continue
            if c_body[cl] >= 0 and (t < c_recv[cl] or (t == c_recv[cl] and (
                    c < c_conn[cl] or (c == c_conn[cl] and b != c_body[cl])))):
                ordered = False
                break
            c_recv[cl] = t
            c_conn[cl] = c
            c_body[cl] = b
            for e in range(entry_offsets[b], entry_offsets[b + 1]):
                m = entry_member[e]
                key = entry_key[e]
                # t >= m_last when each member belongs to one client (as in the scan): the client's times ascend;
                # then the unsigned difference is exact even across the whole int64 range
                if (m_n[m] and m_conn[m] == c and m_key[m] == key and t >= m_last[m]
                        and <uint64_t>t - <uint64_t>m_last[m] <= <uint64_t>split_ms):
                    m_last[m] = t
                    m_n[m] += 1
                    continue
                if m_n[m]:
                    _emit_run(&out, m, m_key[m], m_conn[m], m_first[m], m_last[m], m_n[m])
                m_conn[m] = c
                m_key[m] = key
                m_first[m] = t
                m_last[m] = t
                m_n[m] = 1
        if not ordered:
            return None
        for m in range(n_members):  # close the open runs
            if m_n[m]:
                _emit_run(&out, m, m_key[m], m_conn[m], m_first[m], m_last[m], m_n[m])
        wide = np.empty((out.n, 4), dtype=np.int64)
        narrow = np.empty((out.n, 2), dtype=np.int32)
        wv = wide
        nv = narrow
        if out.n:
            memcpy(&wv[0, 0], out.o64, out.n * 4 * sizeof(int64_t))
            memcpy(&nv[0, 0], out.o32, out.n * 2 * sizeof(int32_t))
        runs = (narrow[:, 0].copy(), wide[:, 0].copy(), narrow[:, 1].copy(), wide[:, 1].copy(), wide[:, 2].copy(),
                wide[:, 3].copy())
        return runs, (int(n_bad), int(lo) if n else None, int(hi) if n else None)
    finally:
        free(c_recv)
        free(c_conn)
        free(c_body)
        free(m_conn)
        free(m_first)
        free(m_last)
        free(m_n)
        free(m_key)
        free(out.o64)
        free(out.o32)

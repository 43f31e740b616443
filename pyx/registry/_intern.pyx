# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native string pool of the registry (twin: engine/registry/_intern_py.py, whose docstring is the specification:
same ids for the same sequence of calls, same results and errors).

Columns, index and arena are C arrays (freed ids are chained through the offset column) allocated with PyMem (tracemalloc sees them). Bounds: every public
method checks its id against ``top`` and liveness before indexing; index positions are masked by ``isize - 1``
(a power of two); arena reads stay within ``[off, off + len)`` of a live id, which lies below ``arena_len``.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcmp, memcpy

from engine.registry._arrays cimport grow_array, reg_hint_huge

__all__ = ["StringPool"]

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    void* PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define REG_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define REG_PREFETCH(p) ((void)(p))
    #endif
    """
    void REG_PREFETCH(const void* p) nogil  # a hint: never faults, reads nothing

DEF EMPTY = -1
DEF TOMBSTONE = -2
cdef int64_t ARENA_LIMIT = 1LL << 32
cdef Py_ssize_t MAX_LEN = 0x7FFFFFFF  # a length is an int32
cdef uint32_t FREE_END = 0xFFFFFFFF  # the free list's end (ids stay below 2^31)


cdef inline int32_t _h32(object s) except? -1:
    # the low 32 bits of the str hash, as a signed int32 (the twin's _h32); a str caches its hash. A str subclass
    # is hashed as a str: its own __hash__ must not split one string into two ids
    cdef Py_hash_t h = hash(s) if type(s) is str else str.__hash__(s)
    return <int32_t><uint32_t>h


cdef Py_ssize_t _index_size(Py_ssize_t n):
    """Power of two holding ``n`` entries at load <= 1/2 (the twin's _index_size)."""
    cdef Py_ssize_t size = 16
    while size < 2 * n:
        size <<= 1
    return size


cdef class StringPool:
    """Reference-counted string ids over flat arrays (the twin's docstring). Not thread-safe."""


    def __cinit__(self, capacity=64):
        cdef Py_ssize_t cap = max(16, int(capacity))
        self._cap = 0
        self._free = -1
        self._alloc_ids(cap)
        self._alloc_index(_index_size(cap))

    def __dealloc__(self):
        PyMem_Free(self._off)
        PyMem_Free(self._len)
        PyMem_Free(self._hash)
        PyMem_Free(self._refs)
        PyMem_Free(self._index)
        PyMem_Free(self._arena)

    # ---------------------------------------------------------------------------------------------- storage
    cdef int _alloc_ids(self, Py_ssize_t cap) except -1:
        if cap > (1 << 31) - 1:
            raise MemoryError("string pool is full (2^31 ids)")
        self._off = <uint32_t*>grow_array(self._off, self._cap, cap, sizeof(uint32_t), 0)
        self._len = <int32_t*>grow_array(self._len, self._cap, cap, sizeof(int32_t), 0xFF)  # -1: not live
        self._hash = <int32_t*>grow_array(self._hash, self._cap, cap, sizeof(int32_t), 0)
        self._refs = <int32_t*>grow_array(self._refs, self._cap, cap, sizeof(int32_t), 0)
        self._cap = cap
        return 0

    cdef int _alloc_index(self, Py_ssize_t size) except -1:
        cdef int32_t* index = <int32_t*>PyMem_Malloc(size * sizeof(int32_t))
        cdef Py_ssize_t i, j, mask = size - 1
        if index == NULL:
            raise MemoryError()
        reg_hint_huge(index, size * sizeof(int32_t))  # probed at random: before its first write
        for i in range(size):
            index[i] = EMPTY
        for i in range(self._top):
            if self._len[i] >= 0:
                j = <uint32_t>self._hash[i] & mask
                while index[j] != EMPTY:
                    j = (j + 1) & mask
                index[j] = <int32_t>i
        PyMem_Free(self._index)
        self._index = index
        self._isize = size
        self._tombstones = 0
        return 0

    cdef int _reserve_arena(self, int64_t need) except -1:
        # grown by an eighth (as a bytearray, the twin's arena): amortised O(1) appends, little slack per string
        cdef int64_t cap
        cdef void* p
        if need > self._arena_cap:
            cap = max(need, self._arena_cap + (self._arena_cap >> 3) + 256)
            p = PyMem_Realloc(self._arena, <size_t>cap)
            if p == NULL:
                raise MemoryError()
            self._arena = <char*>p
            self._arena_cap = cap
        return 0

    cdef void _compact_arena(self) noexcept:
        # into a fresh buffer in id order, as the twin (a reused id's bytes are not in arena order)
        cdef char* fresh
        cdef int64_t pos = 0
        cdef Py_ssize_t i
        cdef int64_t cap
        for i in range(self._top):
            if self._len[i] >= 0:
                pos += self._len[i]
        cap = pos + (pos >> 3) + 256
        fresh = <char*>PyMem_Malloc(<size_t>cap)
        if fresh == NULL:
            return  # keep the old arena: compaction is an optimisation
        pos = 0
        for i in range(self._top):
            if self._len[i] >= 0:
                if self._len[i]:
                    memcpy(fresh + pos, self._arena + self._off[i], self._len[i])
                self._off[i] = <uint32_t>pos
                pos += self._len[i]
        PyMem_Free(self._arena)
        self._arena = fresh
        self._arena_len = pos
        self._arena_cap = cap
        self._garbage = 0

    # ---------------------------------------------------------------------------------------------- lookup
    cdef Py_ssize_t _find(self, const char* data, Py_ssize_t n, int32_t h, Py_ssize_t* where) noexcept:
        """The id holding ``data`` or -1; ``where``: the index position where it is or would be inserted."""
        cdef Py_ssize_t mask = self._isize - 1
        cdef Py_ssize_t j = <uint32_t>h & mask
        cdef Py_ssize_t insert_at = -1
        cdef Py_ssize_t p = j
        cdef int32_t e
        cdef int i
        # the hash entries of the run's first ids are requested together (in a large pool each is a cache miss:
        # overlapped instead of one after another), then compared
        for i in range(8):
            e = self._index[p]
            if e == EMPTY:
                break
            if e >= 0:
                REG_PREFETCH(&self._hash[e])
            p = (p + 1) & mask
        while True:
            e = self._index[j]
            if e == EMPTY:
                where[0] = insert_at if insert_at >= 0 else j
                return -1
            if e == TOMBSTONE:
                if insert_at < 0:
                    insert_at = j
            elif self._hash[e] == h and self._len[e] == n and (
                    n == 0 or memcmp(self._arena + self._off[e], data, n) == 0):  # no arena yet: only ""
                where[0] = j
                return e
            j = (j + 1) & mask

    cdef object _utf8(self, object s, const char** data, Py_ssize_t* n):
        """UTF-8 of the str ``s``: an ASCII str's own buffer (nothing returned), else a new bytes object (returned,
        to be kept alive while ``data`` is used); lone surrogates pass; a subclass is encoded as a str (the twin's
        encode)."""
        if type(s) is str and PyUnicode_IS_ASCII(s):
            data[0] = <const char*>PyUnicode_DATA(s)
            n[0] = PyUnicode_GET_LENGTH(s)
            return None
        b = str.encode(s, "utf-8", "surrogatepass")
        data[0] = PyBytes_AS_STRING(b)
        n[0] = PyBytes_GET_SIZE(b)
        return b

    def lookup(self, s) -> int:
        """The id of ``s``, or -1 if it is not interned (no reference taken)."""
        if not isinstance(s, str):
            raise TypeError(f"a string pool holds str, not {type(s).__name__}")
        return self.c_lookup(s)

    cdef Py_ssize_t c_lookup(self, object s) except -2:
        cdef const char* data
        cdef Py_ssize_t n, j
        keep = self._utf8(s, &data, &n)
        return self._find(data, n, _h32(s), &j)

    cdef int c_prefetch(self, object s) except -1:
        """Request the index entries where the str ``s`` is probed (its hash is computed now, and cached by the str),
        for a caller that interns it after other work: in a large pool the line then comes in meanwhile."""
        if type(s) is str:
            REG_PREFETCH(&self._index[<uint32_t>_h32(s) & (self._isize - 1)])
        return 0

    def intern(self, s) -> int:
        """The id of ``s``, interning it if needed; takes one reference."""
        if not isinstance(s, str):
            raise TypeError(f"a string pool holds str, not {type(s).__name__}")
        return self.c_intern(s)

    cdef int32_t c_intern(self, object s) except -1:
        cdef const char* data
        cdef Py_ssize_t n, j, e
        cdef int32_t h = _h32(s)
        keep = self._utf8(s, &data, &n)
        e = self._find(data, n, h, &j)
        if e >= 0:
            self._refs[e] += 1
            return <int32_t>e
        if n > MAX_LEN:
            raise MemoryError("string too long for the string pool (2 GiB)")
        if self._arena_len + n >= ARENA_LIMIT:
            self._compact_arena()
            if self._arena_len + n >= ARENA_LIMIT:
                raise MemoryError("string pool arena is full (4 GiB)")
        self._reserve_arena(self._arena_len + n)
        if self._free >= 0:
            e = self._free
            self._free = -1 if self._off[e] == FREE_END else self._off[e]
        else:
            if self._top == self._cap:
                self._alloc_ids(self._cap * 2)
            e = self._top
            self._top += 1
        if n:  # "" may come before any arena
            memcpy(self._arena + self._arena_len, data, n)
        self._off[e] = <uint32_t>self._arena_len
        self._arena_len += n
        self._len[e] = <int32_t>n
        self._hash[e] = h
        self._refs[e] = 1
        if self._index[j] == TOMBSTONE:
            self._tombstones -= 1
        self._index[j] = <int32_t>e
        self._live += 1
        if (self._live + self._tombstones) * 10 > self._isize * 7:
            # rebuild at load <= 1/2 once live strings and tombstones fill 70 %: grows, and drops tombstones
            self._alloc_index(_index_size(self._live))
        return <int32_t>e

    cdef inline Py_ssize_t _live_id(self, object e) except -1:
        cdef Py_ssize_t i
        try:
            i = e  # an int (operator.index), as the twin's
        except OverflowError:
            raise KeyError(f"string id {e.__index__()} is not live") from None
        if i < 0 or i >= self._top or self._refs[i] <= 0:
            raise KeyError(f"string id {i} is not live")
        return i

    def acquire(self, e) -> int:
        """Take one more reference on a live id; returns it."""
        return self.c_acquire(e)

    cdef Py_ssize_t c_acquire(self, object e) except -1:
        cdef Py_ssize_t i = self._live_id(e)
        self._refs[i] += 1
        return i

    cdef int c_acquire_id(self, Py_ssize_t e) except -1:
        """c_acquire of a C id."""
        if e < 0 or e >= self._top or self._refs[e] <= 0:
            raise KeyError(f"string id {e} is not live")
        self._refs[e] += 1
        return 0

    def release(self, id) -> None:
        """Drop one reference; the string is freed when none is left."""
        self.c_release(id)

    cdef int c_release(self, object id) except -1:
        return self.c_release_id(self._live_id(id))

    cdef int c_release_id(self, Py_ssize_t e) except -1:
        """c_release of a C id."""
        cdef Py_ssize_t j, mask
        if e < 0 or e >= self._top or self._refs[e] <= 0:
            raise KeyError(f"string id {e} is not live")
        self._refs[e] -= 1
        if self._refs[e]:
            return 0
        mask = self._isize - 1
        j = <uint32_t>self._hash[e] & mask
        while self._index[j] != e:  # a live id is indexed: the probe ends
            j = (j + 1) & mask
        self._index[j] = TOMBSTONE
        self._tombstones += 1
        self._garbage += self._len[e]
        self._len[e] = -1
        self._off[e] = FREE_END if self._free < 0 else <uint32_t>self._free
        self._free = e
        self._live -= 1
        if self._garbage > 4096 and self._garbage * 2 > self._arena_len:
            self._compact_arena()
        return 0

    def get(self, e) -> str:
        """The string of a live id."""
        cdef Py_ssize_t i = self._live_id(e)
        if self._len[i] == 0:
            return ""  # the arena may not exist yet
        return PyUnicode_DecodeUTF8(self._arena + self._off[i], self._len[i], "surrogatepass")

    def refs(self, e) -> int:
        cdef Py_ssize_t i
        try:
            i = e
        except OverflowError:
            return 0
        return self._refs[i] if 0 <= i < self._top else 0

    # ---------------------------------------------------------------------------------------------- stats
    def __len__(self):
        return self._live

    @property
    def high_water(self) -> int:
        """Ids handed out so far (live + free); bounded by the peak number of live strings."""
        return self._top

    def nbytes(self) -> int:
        """Bytes held by the columns, the free list, the index and the arena (implementation-specific)."""
        return self._cap * 4 * 4 + self._isize * 4 + self._arena_cap

    def check(self) -> None:
        """Verify the internal invariants (tests): every live id indexed once, refs positive, counts right."""
        cdef Py_ssize_t i, tomb = 0
        live = [i for i in range(self._top) if self._len[i] >= 0]
        assert len(live) == self._live, (len(live), self._live)
        assert all(self._refs[i] > 0 for i in live)
        free = []
        e = self._free
        while e >= 0:
            free.append(e)
            e = -1 if self._off[e] == FREE_END else self._off[e]
        free.sort()
        assert free == sorted(i for i in range(self._top) if self._len[i] < 0)
        indexed = []
        for i in range(self._isize):
            if self._index[i] >= 0:
                indexed.append(self._index[i])
            elif self._index[i] == TOMBSTONE:
                tomb += 1
        assert sorted(indexed) == live
        assert tomb == self._tombstones
        for i in live:
            assert self._off[i] + <int64_t>self._len[i] <= self._arena_len
            s = self.get(i)
            assert self.lookup(s) == i

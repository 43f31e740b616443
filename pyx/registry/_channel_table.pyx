# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native channel table of the registry (twin: engine/registry/_channel_table_py.py, whose docstring is the
specification: same methods, results and errors).

The columns are C arrays allocated with PyMem (tracemalloc sees them), one element per slot, grown by half up to
the slot budget; the member arrays are one C int32 array per membership key. Python objects: the channel of each
slot, the fast path's token and the rare side tables (overflow memberships, own membership times and client
infos), as in the twin; the channel -> slot map is a C hash index over the slots (the twin's is a dict). Bounds:
every public method validates its slot (in use, below ``top``) and key (non-negative int32, below the member-array table for reads) before indexing; the scan
runs over ``[0, top)``.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport INT64_MIN, INT64_MAX, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from engine.registry._arrays cimport grow_array as _grow_array
from engine.registry._arrays cimport reg_hint_huge

import numpy as np

from engine.registry._channel_table_py import INLINE as _PY_INLINE
from engine.registry._channel_table_py import MAX_SLOTS as _PY_MAX_SLOTS
from engine.registry._channel_table_py import NO_LANGUAGE as _PY_NO_LANGUAGE
from engine.registry._channel_table_py import ChannelTableError
from engine.registry._channel_table_py import _as_int

__all__ = ["ChannelTable", "ChannelTableError", "INLINE", "MAX_SLOTS", "NO_LANGUAGE", "pack_ipv4"]

DEF C_INLINE = 4
INLINE = C_INLINE
MAX_SLOTS = _PY_MAX_SLOTS
NO_LANGUAGE = _PY_NO_LANGUAGE
assert INLINE == _PY_INLINE

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    /* Whether any of n slots is live with a scan key below thr: a branch-free reduction the compiler vectorises; on
       x86-64 with GCC or Clang an AVX2 clone is picked at load time when the CPU has it (64-bit compares are
       AVX2's, SSE2 has none), the default clone elsewhere. */
    #if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
    #if __has_attribute(target_clones)
    #define CT_CLONES __attribute__((target_clones("avx2", "default")))
    #endif
    #endif
    #ifndef CT_CLONES
    #define CT_CLONES
    #endif
    CT_CLONES static int ct_any_below(const int64_t *oldest, const uint8_t *live, ptrdiff_t n, int64_t thr) {
        int64_t flag = 0;
        for (ptrdiff_t j = 0; j < n; j++)
            flag |= (int64_t)(live[j] != 0) & (int64_t)(oldest[j] < thr);
        return flag != 0;
    }
    """
    int ct_any_below(const int64_t* oldest, const uint8_t* live, Py_ssize_t n, int64_t thr) nogil

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define REG_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define REG_PREFETCH(p) ((void)(p))
    #endif
    """
    void REG_PREFETCH(const void* p) nogil  # a hint: never faults, reads nothing

cdef int64_t I64_MAX = INT64_MAX
cdef int64_t I64_MIN = INT64_MIN
cdef int MAX_MEMBERSHIPS = 65535
DEF SCAN_BLOCK = 2048
DEF CSLOT_START = 64


cdef int64_t _int64(str name, object value) except? -1:
    if type(value) is not int:
        value = _as_int(name, value)  # the twin's conversion and error
    if not -(1 << 63) <= value <= (1 << 63) - 1:
        raise ChannelTableError(f"{name} must fit in int64, not {value}")
    return <int64_t>value


cdef inline int64_t _sat_add(int64_t a, int64_t b) noexcept:
    # a + b saturated to int64 (b is a shift within +-2**40, a any int64)
    if b > 0 and a > I64_MAX - b:
        return I64_MAX
    if b < 0 and a < I64_MIN - b:
        return I64_MIN
    return a + b




def pack_ipv4(addr):
    """The address column's value of ``a.b.c.d:port`` (0 when not exactly that form); see the twin. One pass over
    the characters: four dot-separated fields then the port after the only colon, decimal ASCII digits, no
    leading zero, at most 5 digits a field (so no overflow), each field <= 255 and the port <= 65535."""
    if not isinstance(addr, str):
        raise ChannelTableError(f"addr must be a str, not {type(addr).__name__}")
    return c_pack_ipv4(addr)


cdef int64_t c_pack_ipv4(object addr) except -1:
    """pack_ipv4 of a str (or str subclass: its characters, as the twin's); for engine.registry._rules."""
    cdef str text = <str>addr
    cdef Py_UCS4 c
    cdef int field = 0
    cdef int ndig = 0
    cdef int64_t value = 0
    cdef int64_t packed = (<int64_t>1) << 48
    for c in text:
        if 48 <= c <= 57:  # '0'-'9'
            if ndig == 1 and value == 0:
                return 0  # a leading zero
            ndig += 1
            if ndig > 5:
                return 0
            value = value * 10 + (<int>c - 48)
        elif (c == 46 and field < 3) or (c == 58 and field == 3):  # '.' then ':'
            if ndig == 0 or value > 255:
                return 0
            packed |= value << (40 - 8 * field)
            field += 1
            value = 0
            ndig = 0
        else:
            return 0
    if field != 4 or ndig == 0 or value > 65535:
        return 0
    return packed | value


cdef class ChannelTable:
    """Slots of open channels with their columns and memberships (the twin's docstring). Not thread-safe."""


    def __cinit__(self):
        self._last = self._oldest = self._addr = self._fkey = self._armed = NULL
        self._cid = self._ver = self._mkey = self._mpos = self._free = NULL
        self._lang = self._live = self._used = self._kinds = NULL
        self._nmem = NULL
        self._hash = NULL
        self._index = NULL
        self._isize = 0
        self._mutations = 0
        self._members = NULL
        self._msize = self._mcap = NULL
        self._nkeys = self._top = self._cap = self._nfree = 0
        self._memberships = 0
        self._cslot = NULL
        self._ncslot = 0

    def __dealloc__(self):
        cdef Py_ssize_t k
        PyMem_Free(self._last); PyMem_Free(self._oldest); PyMem_Free(self._addr); PyMem_Free(self._fkey)
        PyMem_Free(self._armed); PyMem_Free(self._cid); PyMem_Free(self._ver); PyMem_Free(self._mkey)
        PyMem_Free(self._mpos); PyMem_Free(self._lang); PyMem_Free(self._live); PyMem_Free(self._used)
        PyMem_Free(self._kinds); PyMem_Free(self._nmem); PyMem_Free(self._free)
        PyMem_Free(self._hash); PyMem_Free(self._index); PyMem_Free(self._cslot)
        if self._members != NULL:
            for k in range(self._nkeys):
                PyMem_Free(self._members[k])
        PyMem_Free(self._members); PyMem_Free(self._msize); PyMem_Free(self._mcap)

    def __init__(self, capacity=1024, max_slots=MAX_SLOTS, producer_shift=0):
        capacity, max_slots = _as_int("capacity", capacity), _as_int("max_slots", max_slots)
        if not 1 <= max_slots <= MAX_SLOTS:
            raise ChannelTableError(f"max_slots must be in [1, {MAX_SLOTS}], not {max_slots}")
        if capacity < 1:
            raise ChannelTableError(f"capacity must be >= 1, not {capacity}")
        cdef int64_t shift = _int64("producer_shift", producer_shift)
        if not -(1 << 40) <= shift <= 1 << 40:
            raise ChannelTableError(f"producer_shift must be within +-2**40 ms, not {shift}")
        if self._cap:
            raise ChannelTableError("the channel table is already initialised")
        self.max_slots = max_slots
        self.producer_shift = shift
        self._fresh[0] = 0
        self._fresh[1] = 0
        self._fresh[2] = shift
        self._fresh[3] = shift if shift < 0 else 0
        self._channels = []
        self._armed_by = []
        self._overflow = {}
        self._lag = {}
        self._info = {}
        self._grow(min(capacity, max_slots))
        self._cslot = <int32_t*>_grow_array(self._cslot, 0, CSLOT_START, 4, 0xFF)  # -1
        self._ncslot = CSLOT_START

    # ------------------------------------------------------------------------------------------------ storage
    cdef int _grow(self, Py_ssize_t cap) except -1:
        cdef Py_ssize_t old = self._cap
        self._last = <int64_t*>_grow_array(self._last, old, cap, 8, 0)
        self._oldest = <int64_t*>_grow_array(self._oldest, old, cap, 8, 0)
        self._addr = <int64_t*>_grow_array(self._addr, old, cap, 8, 0)
        self._fkey = <int64_t*>_grow_array(self._fkey, old, cap, 8, 0)
        self._armed = <int64_t*>_grow_array(self._armed, old, cap, 8, 0)
        self._cid = <int32_t*>_grow_array(self._cid, old, cap, 4, 0)
        self._ver = <int32_t*>_grow_array(self._ver, old, cap, 4, 0)
        self._mkey = <int32_t*>_grow_array(self._mkey, old * C_INLINE, cap * C_INLINE, 4, 0xFF)  # -1
        self._mpos = <int32_t*>_grow_array(self._mpos, old * C_INLINE, cap * C_INLINE, 4, 0)
        self._lang = <uint8_t*>_grow_array(self._lang, old, cap, 1, 0)
        self._live = <uint8_t*>_grow_array(self._live, old, cap, 1, 0)
        self._used = <uint8_t*>_grow_array(self._used, old, cap, 1, 0)
        self._kinds = <uint8_t*>_grow_array(self._kinds, old, cap, 1, 0)
        self._nmem = <uint16_t*>_grow_array(self._nmem, old, cap, 2, 0)
        self._free = <int32_t*>_grow_array(self._free, old, cap, 4, 0)
        self._hash = <uint32_t*>_grow_array(self._hash, old, cap, 4, 0)
        self._channels.extend([None] * (cap - old))
        self._armed_by.extend([None] * (cap - old))
        self._cap = cap
        cdef Py_ssize_t isize = 8
        while isize < 2 * cap:
            isize *= 2
        if isize > self._isize:
            self._rehash(isize)
        return 0

    # ------------------------------------------------------------------------------------------------ channel index
    # channel -> slot: open addressing with linear probing over int32 slot numbers (-1 empty), at most half full,
    # deletion by backward shift (no tombstones); each slot keeps 32 bits of its channel's mixed hash, so probing
    # compares channels (Python ==) only on a hash match and rehashing calls no Python code. ~12 B a channel where
    # a dict with its int values took ~75 B.
    cdef int _rehash(self, Py_ssize_t isize) except -1:
        cdef int32_t* index = <int32_t*>PyMem_Malloc(isize * sizeof(int32_t))
        cdef Py_ssize_t i, j, s, mask = isize - 1
        if index == NULL:
            raise MemoryError()
        reg_hint_huge(index, isize * sizeof(int32_t))  # probed at random: before its first write
        memset(index, 0xFF, isize * sizeof(int32_t))
        if self._index != NULL:
            for i in range(self._isize):
                s = self._index[i]
                if s >= 0:
                    j = self._hash[s] & mask
                    while index[j] >= 0:
                        j = (j + 1) & mask
                    index[j] = <int32_t>s
            PyMem_Free(self._index)
        self._index = index
        self._isize = isize
        return 0

    cdef inline uint32_t _hash_of(self, object channel) except? 0xFFFFFFFF:
        # hash(channel) may run Python code (a channel's __hash__); Fibonacci mixing spreads sequential or
        # aligned hashes (ints, object addresses) over the index
        cdef uint64_t h = <uint64_t>hash(channel)
        return <uint32_t>((h * <uint64_t>0x9E3779B97F4A7C15ULL) >> 32)

    cdef Py_ssize_t _find_channel(self, object channel, uint32_t h) except -2:
        # -1 when absent. A channel's __eq__ may run Python code that changes the table: the probe restarts then
        cdef Py_ssize_t i, s, mask
        cdef uint64_t mutations
        cdef int n
        mask = self._isize - 1
        i = h & mask
        for n in range(8):  # the run's hash entries requested together (see StringPool._find), then compared
            s = self._index[i]
            if s < 0:
                break
            REG_PREFETCH(&self._hash[s])
            i = (i + 1) & mask
        while True:
            mask = self._isize - 1
            i = h & mask
            mutations = self._mutations
            while True:
                s = self._index[i]
                if s < 0:
                    return -1
                if self._hash[s] == h:
                    other = self._channels[s]
                    if other is channel:
                        return s
                    if other == channel:
                        if mutations == self._mutations:
                            return s
                        break
                    if mutations != self._mutations:
                        break
                i = (i + 1) & mask

    cdef void _index_add(self, Py_ssize_t slot, uint32_t h) noexcept:
        cdef Py_ssize_t mask = self._isize - 1
        cdef Py_ssize_t i = h & mask
        while self._index[i] >= 0:
            i = (i + 1) & mask
        self._index[i] = <int32_t>slot
        self._hash[slot] = h

    cdef void _index_remove(self, Py_ssize_t slot) noexcept:
        cdef Py_ssize_t mask = self._isize - 1
        cdef Py_ssize_t i = self._hash[slot] & mask
        cdef Py_ssize_t j, home
        while self._index[i] != slot:  # every open slot is in the index; an empty entry ends the run anyway
            if self._index[i] < 0:
                return
            i = (i + 1) & mask
        j = i
        while True:  # backward shift: move up each later entry of the run whose home is not in (i, j]
            j = (j + 1) & mask
            if self._index[j] < 0:
                break
            home = self._hash[self._index[j]] & mask
            if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                self._index[i] = self._index[j]
                i = j
        self._index[i] = -1

    cdef inline Py_ssize_t _slot(self, object slot) except -1:
        cdef Py_ssize_t s
        if type(slot) is not int:
            slot = _as_int("slot", slot)
        try:
            s = slot
        except OverflowError:
            s = -1
        if s < 0 or s >= self._top or not self._used[s]:
            raise ChannelTableError(f"slot {int(slot)} is not in use")
        return s

    cdef inline int32_t _key(self, object key) except -1:
        cdef long long k
        if type(key) is not int:
            key = _as_int("membership key", key)
        try:
            k = key
        except OverflowError:
            k = -1
        if k < 0 or k >= (1 << 31):
            raise ChannelTableError(f"membership key must be in [0, 2**31), not {int(key)}")
        return <int32_t>k

    # ------------------------------------------------------------------------------------------------ channels
    cpdef open(self, channel, addr=0):
        """A slot for a new channel (``addr``: the address column's value); the columns start empty."""
        cdef int64_t a = _int64("addr", addr)
        cdef Py_ssize_t slot
        cdef uint32_t h = self._hash_of(channel)
        if self._find_channel(channel, h) >= 0:
            raise ChannelTableError("the channel is already open")
        if self._nfree:
            self._nfree -= 1
            slot = self._free[self._nfree]
        else:
            if self._top == self._cap:
                if self._cap >= self.max_slots:
                    raise ChannelTableError(f"the channel table is full ({self.max_slots} slots)")
                self._grow(min(self.max_slots, self._cap + max(1, self._cap // 2)))
            slot = self._top
            self._top += 1
        self._channels[slot] = channel
        self._index_add(slot, h)
        self._mutations += 1
        self._used[slot] = 1
        self._cid[slot] = -1
        self._lang[slot] = NO_LANGUAGE
        self._ver[slot] = 0
        self._addr[slot] = a
        self._last[slot] = 0
        self._oldest[slot] = 0
        self._fkey[slot] = 0
        self._armed[slot] = 0
        return slot

    cpdef find(self, channel):
        """The channel's slot, or None when it is not open."""
        cdef Py_ssize_t s = self._find_channel(channel, self._hash_of(channel))
        return None if s < 0 else s

    def items(self):
        """``(channel, slot)`` of every open channel, by slot."""
        cdef Py_ssize_t i
        cdef list channels = self._channels
        return [(channels[i], i) for i in range(self._top) if self._used[i]]

    def in_use(self, slot):
        """Whether ``slot`` is the slot of an open channel (any int; only a non-int raises)."""
        slot = _as_int("slot", slot)
        return 0 <= slot < self._top and self._used[<Py_ssize_t>slot] != 0

    def channel(self, slot):
        return self._channels[self._slot(slot)]

    cpdef close(self, slot):
        """Free the slot of a channel whose memberships are all removed; its channel is forgotten."""
        cdef Py_ssize_t s = self._slot(slot)
        if self._nmem[s]:
            raise ChannelTableError(f"slot {s} still has {self._nmem[s]} memberships")
        # every state change first; the channel and token are released last (the locals): a channel's __del__
        # that re-enters the table then sees the slot free
        channel, token = self._channels[s], self._armed_by[s]
        self._index_remove(s)
        self._mutations += 1
        self._channels[s] = None
        self._armed_by[s] = None
        self._used[s] = 0
        self._cid[s] = -1
        self._addr[s] = 0
        self._armed[s] = 0
        self._kinds[s] = 0
        self._free[self._nfree] = <int32_t>s
        self._nfree += 1
        del channel, token

    # ------------------------------------------------------------------------------------------------ columns
    cpdef client(self, slot):
        """The slot's own ``(client id, language, version)``."""
        cdef Py_ssize_t s = self._slot(slot)
        return self._cid[s], self._lang[s], self._ver[s]

    cpdef set_client(self, slot, cid, language, version):
        cdef Py_ssize_t s = self._slot(slot)
        cid, language, version = (_as_int("client id", cid), _as_int("language", language),
                                  _as_int("version", version))
        if not -1 <= cid < 1 << 31:
            raise ChannelTableError(f"client id must be in [-1, 2**31), not {cid}")
        if not 0 <= language <= 255:
            raise ChannelTableError(f"language must be in [0, 255], not {language}")
        if not -(1 << 31) <= version < 1 << 31:
            raise ChannelTableError(f"version must fit in int32, not {version}")
        self._cid[s] = cid
        self._lang[s] = language
        self._ver[s] = version

    cpdef addr(self, slot):
        return self._addr[self._slot(slot)]

    cpdef set_addr(self, slot, addr):
        cdef Py_ssize_t s = self._slot(slot)
        self._addr[s] = _int64("addr", addr)

    def last(self, slot):
        return self._last[self._slot(slot)]

    def oldest(self, slot):
        return self._oldest[self._slot(slot)]

    def live(self, slot):
        return self._live[self._slot(slot)] != 0

    cpdef nmem(self, slot):
        return self._nmem[self._slot(slot)]

    cpdef kinds(self, slot):
        """Bit 0: the slot has a consumer membership, bit 1: a producer one."""
        return self._kinds[self._slot(slot)]

    cpdef touch(self, slot, now):
        """Every membership of the slot refreshed at ``now`` (the fast path): own older times kept by
        :meth:`refresh` go, as in the twin (the registry never arms a slot that keeps any: refresh disarms)."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int64_t t = _int64("now", now)
        if self._lag and s in self._lag:
            del self._lag[s]
        self._last[s] = t
        self._oldest[s] = _sat_add(t, self._fresh[self._kinds[s] & 3])

    # ------------------------------------------------------------------------------------------------ fast path
    cpdef armed(self, slot):
        return self._armed[self._slot(slot)]

    cpdef fkey(self, slot):
        return self._fkey[self._slot(slot)]

    cpdef armed_by(self, slot):
        return self._armed_by[self._slot(slot)]

    cpdef arm(self, slot, fkey, by, armed):
        """Arm the fast path: the digest of the heartbeat it may repeat, its token object, the arming tick."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int64_t f = _int64("fkey", fkey)
        cdef int64_t a = _int64("armed", armed)
        self._fkey[s] = f
        self._armed_by[s] = by
        self._armed[s] = a

    def disarm(self, slot):
        self._armed[self._slot(slot)] = 0

    # ------------------------------------------------------------------------------------------------ memberships
    cdef Py_ssize_t _find(self, Py_ssize_t slot, int32_t key) except -2:
        cdef Py_ssize_t base = slot * C_INLINE
        cdef int n = self._nmem[slot]
        cdef int i
        for i in range(n if n < C_INLINE else C_INLINE):
            if self._mkey[base + i] == key:
                return self._mpos[base + i]
        if n > C_INLINE:
            return (<dict>self._overflow[slot]).get(key, -1)
        return -1

    cpdef mem_pos(self, slot, key):
        """Position of ``slot`` in the member array of ``key``, or -1 when it is not a member."""
        cdef Py_ssize_t s = self._slot(slot)
        return self._find(s, self._key(key))

    cpdef mem_keys(self, slot):
        """The slot's membership keys: the inline ones in order, then the overflow ones."""
        return self._keys(self._slot(slot))

    cdef list _keys(self, Py_ssize_t slot):
        cdef int n = self._nmem[slot]
        cdef Py_ssize_t base = slot * C_INLINE
        cdef int i
        cdef list keys = [self._mkey[base + i] for i in range(n if n < C_INLINE else C_INLINE)]
        if n > C_INLINE:
            keys.extend(self._overflow[slot])
        return keys

    cdef int _ensure_key(self, int32_t key) except -1:
        cdef Py_ssize_t n
        if key < self._nkeys:
            return 0
        n = max(<Py_ssize_t>key + 1, 2 * self._nkeys, 16)
        self._members = <int32_t**>_grow_array(self._members, self._nkeys, n, sizeof(int32_t*), 0)
        self._msize = <int32_t*>_grow_array(self._msize, self._nkeys, n, 4, 0)
        self._mcap = <int32_t*>_grow_array(self._mcap, self._nkeys, n, 4, 0)
        self._nkeys = n
        return 0

    cpdef add_member(self, slot, key):
        """Make ``slot`` a member of ``key`` (appended to its member array); returns its position. Disarms."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int32_t k = self._key(key)
        return self._add(s, k)

    cdef Py_ssize_t _add(self, Py_ssize_t s, int32_t k) except -1:
        if self._find(s, k) >= 0:
            raise ChannelTableError(f"slot {s} is already a member of key {k}")
        cdef int n = self._nmem[s]
        if n >= MAX_MEMBERSHIPS:
            raise ChannelTableError(f"slot {s} has {n} memberships, the most a slot can hold")
        self._ensure_key(k)
        cdef int32_t pos = self._msize[k]
        cdef int32_t cap = self._mcap[k]
        if pos == cap:
            self._members[k] = <int32_t*>_grow_array(self._members[k], cap, 4 if cap == 0 else 2 * cap, 4, 0)
            cap = 4 if cap == 0 else 2 * cap
            self._mcap[k] = cap
        self._members[k][pos] = <int32_t>s
        self._msize[k] = pos + 1
        if n < C_INLINE:
            self._mkey[s * C_INLINE + n] = k
            self._mpos[s * C_INLINE + n] = pos
        else:
            over = self._overflow.get(s)
            if over is None:
                over = self._overflow[s] = {}
            over[k] = pos
        # the new membership's time is the slot's last: the scan key takes it in
        cdef int64_t t = _sat_add(self._last[s], self.producer_shift if k & 1 else 0)
        if n == 0 or t < self._oldest[s]:
            self._oldest[s] = t
        self._nmem[s] = n + 1
        self._live[s] = 1
        self._kinds[s] |= 1 << (k & 1)
        self._armed[s] = 0
        self._memberships += 1
        return pos

    cdef void _set_pos(self, Py_ssize_t slot, int32_t key, int32_t pos) except *:
        cdef Py_ssize_t base = slot * C_INLINE
        cdef int n = self._nmem[slot]
        cdef int i
        for i in range(n if n < C_INLINE else C_INLINE):
            if self._mkey[base + i] == key:
                self._mpos[base + i] = pos
                return
        (<dict>self._overflow[slot])[key] = pos

    cpdef remove_member(self, slot, key):
        """Remove ``slot`` from ``key``; -2 when it was not a member, else the client id of the membership's own
        client info that went with it (-1: none). See the twin."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int32_t k = self._key(key)
        return self._remove(s, k)

    cdef int64_t _remove(self, Py_ssize_t s, int32_t k) except? -3:
        cdef Py_ssize_t pos = self._find(s, k)
        cdef int32_t last, moved
        cdef int n, inline, i, j, kinds
        cdef Py_ssize_t base = s * C_INLINE
        if pos < 0:
            return -2
        last = self._msize[k] - 1
        self._msize[k] = last
        if pos != last:
            moved = self._members[k][last]
            self._members[k][pos] = moved
            self._set_pos(moved, k, <int32_t>pos)
        if last == 0:  # an emptied key gives its array back
            PyMem_Free(self._members[k])
            self._members[k] = NULL
            self._mcap[k] = 0
        n = self._nmem[s]
        inline = n if n < C_INLINE else C_INLINE
        for i in range(inline):
            if self._mkey[base + i] == k:
                for j in range(i, inline - 1):  # keep the inline keys compact and in order
                    self._mkey[base + j] = self._mkey[base + j + 1]
                    self._mpos[base + j] = self._mpos[base + j + 1]
                if n > C_INLINE:
                    over = <dict>self._overflow[s]
                    first = next(iter(over))
                    self._mkey[base + inline - 1] = first
                    self._mpos[base + inline - 1] = over.pop(first)
                    if not over:
                        del self._overflow[s]
                else:
                    self._mkey[base + inline - 1] = -1
                break
        else:
            over = <dict>self._overflow[s]
            del over[k]
            if not over:
                del self._overflow[s]
        n -= 1
        self._nmem[s] = n
        self._memberships -= 1
        self._armed[s] = 0
        kinds = 0
        for i in range(n if n < C_INLINE else C_INLINE):
            kinds |= 1 << (self._mkey[base + i] & 1)
        if n > C_INLINE:
            for key in self._overflow[s]:
                kinds |= 1 << (<int>key & 1)
        self._kinds[s] = kinds
        if self._lag:
            lag = self._lag.get(s)
            if lag is not None:
                (<dict>lag).pop(k, None)
                if not lag:
                    del self._lag[s]
        cdef int64_t released = -1
        if self._info:
            info = self._info.get(s)
            if info is not None and k in info:
                released = (<dict>info).pop(k)[0]
                if not info:
                    del self._info[s]
        if n == 0:
            self._live[s] = 0
        elif not (self._lag and s in self._lag):  # every membership at the slot's last: the key by kinds, no walk
            self._oldest[s] = _sat_add(self._last[s], self._fresh[kinds & 3])
        else:
            self._recompute_oldest(s)
        return released

    cdef inline int64_t _time(self, Py_ssize_t slot, int32_t key) except? -1:
        if self._lag:
            lag = self._lag.get(slot)
            if lag is not None:
                t = (<dict>lag).get(key)
                if t is not None:
                    return t
        return self._last[slot]

    def member_time(self, slot, key):
        """The membership's time: its own older time when a later heartbeat left it out, else the slot's last."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int32_t k = self._key(key)
        if self._find(s, k) < 0:
            raise ChannelTableError(f"slot {s} is not a member of key {k}")
        return self._time(s, k)

    cdef int _recompute_oldest(self, Py_ssize_t s) except -1:
        cdef int64_t best = I64_MAX
        cdef int64_t t
        cdef int n = self._nmem[s]
        cdef int i
        cdef int32_t k
        cdef Py_ssize_t base = s * C_INLINE
        for i in range(n if n < C_INLINE else C_INLINE):
            k = self._mkey[base + i]
            t = _sat_add(self._time(s, k), self.producer_shift if k & 1 else 0)
            if t < best:
                best = t
        if n > C_INLINE:
            for key in self._overflow[s]:
                k = key
                t = _sat_add(self._time(s, k), self.producer_shift if k & 1 else 0)
                if t < best:
                    best = t
        self._oldest[s] = best
        return 0

    cpdef member_info(self, slot, key):
        """``(client id, language, version)`` of the membership: its own when set, else the slot's."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int32_t k = self._key(key)
        if self._info:
            info = self._info.get(s)
            if info is not None:
                t = (<dict>info).get(k)
                if t is not None:
                    return t
        return self._cid[s], self._lang[s], self._ver[s]

    def set_member_info(self, slot, key, cid, language, version):
        """Make the membership's client info ``(cid, language, version)``; returns the client id of the own info it
        replaced (-1: none). See the twin."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int32_t k = self._key(key)
        cid, language, version = (_as_int("client id", cid), _as_int("language", language),
                                  _as_int("version", version))
        if self._find(s, k) < 0:
            raise ChannelTableError(f"slot {s} is not a member of key {k}")
        if not 0 <= cid < 1 << 31 or not 0 <= language <= 255 or not -(1 << 31) <= version < 1 << 31:
            raise ChannelTableError(f"bad client info ({cid}, {language}, {version})")
        info = self._info.get(s)
        old = info.get(k) if info is not None else None
        released = -1 if old is None else old[0]
        if cid == self._cid[s] and language == self._lang[s] and version == self._ver[s]:
            if old is not None:
                del info[k]
                if not info:
                    del self._info[s]
            return released
        if info is None:
            info = self._info[s] = {}
        info[k] = (cid, language, version)
        return released

    def info_cids(self, slot):
        """Client ids held by the slot's own membership infos (reference checks)."""
        return [t[0] for t in self._info.get(self._slot(slot), {}).values()]

    cpdef refresh(self, slot, keys, now):
        """A heartbeat at ``now`` refreshed the memberships ``keys`` of the slot; 1, 2 or 0 (disarmed) as in the
        twin."""
        cdef Py_ssize_t s = self._slot(slot)
        cdef int64_t t = _int64("now", now)
        cdef set ks = set()
        for k in keys:
            ks.add(self._key(k))
        for k in ks:
            if self._find(s, <int32_t>k) < 0:
                raise ChannelTableError(f"slot {s} is not a member of key {k}")
        lag = self._lag.get(s) if self._lag else None
        if len(ks) == self._nmem[s]:
            self._last[s] = t
            self._oldest[s] = _sat_add(t, self._fresh[self._kinds[s] & 3])
            if lag is not None:
                del self._lag[s]
                return 2
            return 1
        cdef int64_t old_last = self._last[s]
        if lag is None:
            lag = self._lag[s] = {}
        for key in self._keys(s):
            if key in ks:
                (<dict>lag).pop(key, None)
            elif key not in lag:
                lag[key] = old_last
        if not lag:
            del self._lag[s]
        self._last[s] = t
        self._armed[s] = 0  # the fast path repeats a heartbeat that covered every membership: not this state
        self._recompute_oldest(s)
        return 0

    def lag_items(self, slot):
        """``(key, own time)`` of the slot's memberships that keep their own time (checks)."""
        return list(self._lag.get(self._slot(slot), {}).items())

    # ------------------------------------------------------------------------------------------------ groups
    cpdef group_size(self, key):
        cdef int32_t k = self._key(key)
        return self._msize[k] if k < self._nkeys else 0

    def group_slots(self, key):
        """The member slots of ``key`` in member-array order."""
        cdef int32_t k = self._key(key)
        cdef int32_t i
        if k >= self._nkeys:
            return []
        cdef int32_t* arr = self._members[k]
        return [arr[i] for i in range(self._msize[k])]

    def group_channels(self, key):
        """The channels of the member slots of ``key`` in member-array order."""
        cdef int32_t k = self._key(key)
        cdef int32_t i
        if k >= self._nkeys:
            return ()
        cdef int32_t* arr = self._members[k]
        cdef list channels = self._channels
        return tuple([channels[arr[i]] for i in range(self._msize[k])])

    # ------------------------------------------------------------------------------------------------ client slots
    # ProducerManager's clientChannelTable: client id (pool id) -> the slot last registered for it, -1 when none. A
    # C int32 column indexed by pool id (below 2**31), grown by doubling and never shrunk; the table keeps no pool
    # reference and does not clear an entry when its slot closes (the registry's rules do both)
    @property
    def memberships(self):
        """Memberships held by all slots (the registry's max_memberships budget)."""
        return self._memberships

    def client_slot(self, cid):
        """The clientChannelTable entry of pool id ``cid`` (any int): its slot, -1 when none."""
        cid = _as_int("client id", cid)
        if 0 <= cid < self._ncslot:
            return self._cslot[<Py_ssize_t>cid]
        return -1

    def set_client_slot(self, cid, slot):
        """Point the entry of pool id ``cid`` at ``slot`` (in use); returns the entry it replaced (-1: none, the
        caller then takes a pool reference for it)."""
        cdef Py_ssize_t s = self._slot(slot)
        cid = _as_int("client id", cid)
        if not 0 <= cid < 1 << 31:
            raise ChannelTableError(f"client id must be in [0, 2**31), not {cid}")
        return self.c_set_client_slot(<int32_t>cid, s)

    cdef int32_t c_set_client_slot(self, int32_t cid, Py_ssize_t s) except -2:
        # cid in [0, 2**31) and s a slot in use: the callers' checks
        cdef int32_t old
        cdef Py_ssize_t n
        if cid >= self._ncslot:
            n = max(<Py_ssize_t>cid + 1, 2 * self._ncslot)
            self._cslot = <int32_t*>_grow_array(self._cslot, self._ncslot, n, 4, 0xFF)  # -1
            self._ncslot = n
        old = self._cslot[cid]
        self._cslot[cid] = <int32_t>s
        return old

    def drop_client_slot(self, cid, only_slot=-1):
        """Clear the entry of pool id ``cid`` (any int) when it has one and, with ``only_slot`` >= 0, it points at
        that slot; whether it was cleared (the caller then drops the entry's pool reference)."""
        cid, only_slot = _as_int("client id", cid), _as_int("slot", only_slot)
        if not 0 <= cid < self._ncslot:
            return False
        if only_slot >= 1 << 31:
            only_slot = 1 << 31  # no entry points there (slots are below MAX_SLOTS)
        elif only_slot < 0:
            only_slot = -1
        return self.c_drop_client_slot(<Py_ssize_t>cid, <int64_t>only_slot)

    cdef bint c_drop_client_slot(self, Py_ssize_t cid, int64_t only_slot) noexcept:
        cdef int32_t cur
        if cid < 0 or cid >= self._ncslot:
            return False
        cur = self._cslot[cid]
        if cur >= 0 and (only_slot < 0 or cur == only_slot):
            self._cslot[cid] = -1
            return True
        return False

    def client_slot_items(self):
        """``(pool id, slot)`` of every clientChannelTable entry, by pool id."""
        cdef Py_ssize_t i
        return [(i, self._cslot[i]) for i in range(self._ncslot) if self._cslot[i] >= 0]

    def client_slots_nbytes(self):
        """Bytes of the clientChannelTable column (at its capacity; not in :meth:`nbytes`)."""
        return self._ncslot * 4

    def client_slots_capacity(self):
        return self._ncslot

    # ------------------------------------------------------------------------------------------------ rules' access
    # C entries for engine.registry._rules: slots that the table itself handed out (``c_find``, ``open``) and that
    # the caller re-checks with ``c_in_use`` after any Python code ran
    cdef Py_ssize_t c_find(self, object channel) except -2:
        """The channel's slot, -1 when it is not open."""
        return self._find_channel(channel, self._hash_of(channel))

    cdef bint c_in_use(self, Py_ssize_t s) noexcept:
        return 0 <= s < self._top and self._used[s] != 0

    cdef int c_set_client(self, Py_ssize_t s, int32_t cid, uint8_t language, int32_t version) except -1:
        if not self.c_in_use(s):
            raise ChannelTableError(f"slot {s} is not in use")
        self._cid[s] = cid
        self._lang[s] = language
        self._ver[s] = version
        return 0

    cdef int c_refresh_all(self, Py_ssize_t s, object now) except -1:
        """``refresh(s, keys, now)`` of keys that are every membership of the slot (the caller knows): 1, or 2 when
        own older times went."""
        if not self.c_in_use(s):
            raise ChannelTableError(f"slot {s} is not in use")
        cdef int64_t t = _int64("now", now)
        self._last[s] = t
        self._oldest[s] = _sat_add(t, self._fresh[self._kinds[s] & 3])
        if self._lag and s in self._lag:
            del self._lag[s]
            return 2
        return 1

    cdef int64_t c_member_cid(self, Py_ssize_t s, int32_t k) except? -3:
        """The client id of the membership's info (its own when set, else the slot's); s in use."""
        if self._info:
            info = self._info.get(s)
            if info is not None:
                t = (<dict>info).get(k)
                if t is not None:
                    return (<tuple>t)[0]
        return self._cid[s]

    # ------------------------------------------------------------------------------------------------ expiry
    def scan(self, now, timeout):
        """Live slots whose scan key is more than ``timeout`` ms before ``now`` (exact for any int64), ascending.
        The scan key saturates at the int64 ends, so a producer membership within ``producer_shift`` of them can be
        expired (``expired_keys``) and not found here; registry clocks (ms since an epoch) never come near."""
        cdef int64_t c_now = _int64("now", now)
        cdef int64_t c_timeout = _int64("timeout", timeout)
        if c_timeout < 0:
            raise ChannelTableError(f"timeout must be >= 0, not {c_timeout}")
        cdef list out = []
        cdef Py_ssize_t i, j, end, n = self._top
        cdef int64_t* oldest = self._oldest
        cdef uint8_t* live = self._live
        cdef Py_ssize_t* hits
        cdef Py_ssize_t nhits
        # expired: live and now - t > timeout in exact arithmetic, i.e. t < now - timeout (timeout >= 0); when
        # now - timeout is below int64's range no slot qualifies
        if c_now < I64_MIN + c_timeout:
            return out
        cdef int64_t thr = c_now - c_timeout
        hits = <Py_ssize_t*>PyMem_Malloc(SCAN_BLOCK * sizeof(Py_ssize_t))
        if hits == NULL:
            raise MemoryError()
        # blocks of SCAN_BLOCK slots are tested by the vectorised reduction; only a block with a hit is walked
        # again for its slots (a scan normally finds few or none)
        try:
            i = 0
            while i < n:
                nhits = 0
                with nogil:
                    while i < n and nhits == 0:
                        end = i + SCAN_BLOCK if n - i > SCAN_BLOCK else n
                        if ct_any_below(oldest + i, live + i, end - i, thr):
                            for j in range(i, end):
                                if live[j] != 0 and oldest[j] < thr:
                                    hits[nhits] = j
                                    nhits += 1
                        i = end
                for j in range(nhits):
                    out.append(hits[j])
        finally:
            PyMem_Free(hits)
        return out

    def expired_keys(self, slot, now, timeout, producer_timeout):
        """The slot's membership keys whose own time is more than their kind's timeout before ``now``."""
        cdef Py_ssize_t s = self._slot(slot)
        t_now = _int64("now", now)
        timeouts = (_int64("timeout", timeout), _int64("producer_timeout", producer_timeout))
        return [k for k in self._keys(s) if t_now - self._time(s, k) > timeouts[k & 1]]

    def columns(self):
        """Copies of the scan columns ``(oldest int64, live uint8)`` over the slots handed out (tests)."""
        oldest = np.empty(self._top, np.int64)
        live = np.empty(self._top, np.uint8)
        cdef int64_t[::1] o = oldest
        cdef uint8_t[::1] l = live
        if self._top:
            memcpy(&o[0], self._oldest, self._top * 8)
            memcpy(&l[0], self._live, self._top)
        return oldest, live

    # ------------------------------------------------------------------------------------------------ stats
    def __len__(self):
        return self._top - self._nfree  # every slot handed out and not freed is an open channel

    @property
    def capacity(self):
        return self._cap

    @property
    def top(self):
        """Slots handed out so far (in use + free)."""
        return self._top

    def registered_count(self):
        """Slots with memberships."""
        cdef Py_ssize_t i, n = 0
        for i in range(self._top):
            n += self._live[i] != 0
        return n

    def nbytes(self):
        """Bytes of this implementation's flat arrays: the C columns (with the free list and the channel index's
        hash column), the channel index and the member arrays at their capacity; Python objects not included. The
        twin counts its own numpy columns and member arrays (its free list and channel map are Python objects), so
        the two differ by design."""
        cdef Py_ssize_t k, total = self._cap * (5 * 8 + 2 * 4 + 2 * C_INLINE * 4 + 4 * 1 + 2 + 4 + 4) + self._isize * 4
        for k in range(self._nkeys):
            total += self._mcap[k] * 4
        return total

    def check(self):
        """Verify the table's invariants; raises AssertionError on the first violation."""
        cdef Py_ssize_t i
        free = [self._free[i] for i in range(self._nfree)]
        slot_of = dict(self.items())
        assert len(slot_of) + len(free) == self._top, "slots leak"
        free_set = set(free)
        assert len(free_set) == len(free)
        for channel, slot in slot_of.items():
            assert self._channels[slot] is channel and slot not in free_set and self._used[slot]
            assert self._hash[slot] == self._hash_of(channel) and self.find(channel) == slot, "index"
        assert sum(1 for i in range(self._isize) if self._index[i] >= 0) == len(slot_of), "index entries"
        assert self._isize >= 2 * self._cap, "index more than half full"
        for slot in free:
            assert self._channels[slot] is None and not self._used[slot] and not self._live[slot]
            assert not self._nmem[slot] and not self._armed[slot]
            assert slot not in self._lag and slot not in self._info and slot not in self._overflow
        count = [0] * self._nkeys
        for slot in slot_of.values():
            keys = self._keys(slot)
            assert len(keys) == len(set(keys)) == self._nmem[slot]
            assert bool(self._live[slot]) == bool(keys)
            kinds = 0
            for k in keys:
                kinds |= 1 << (k & 1)
                pos = self._find(slot, k)
                assert 0 <= pos < self._msize[k] and self._members[k][pos] == slot
                count[k] += 1
            assert kinds == self._kinds[slot]
            if keys:
                shift = <object>self.producer_shift  # Python ints: no int64 wrap-around in the check itself
                assert self._oldest[slot] == min(max(min(<object>self._time(slot, k) + (shift if k & 1 else 0),
                                                         (1 << 63) - 1), -(1 << 63)) for k in keys)
            for k in self._lag.get(slot, {}):
                assert k in keys  # t may be after last: the registry's clock can go back
            for k in self._info.get(slot, {}):
                assert k in keys
            assert len(self._overflow.get(slot, ())) == max(0, len(keys) - C_INLINE)
        assert count == [self._msize[i] for i in range(self._nkeys)], "member arrays and memberships disagree"
        assert self._memberships == sum(count), "membership count"

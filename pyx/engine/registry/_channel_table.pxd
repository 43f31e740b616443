# The native channel table's C layout, for the modules that cimport it (engine.registry._rules calls its cpdef
# methods directly). Defined in pyx/registry/_channel_table.pyx (the layout: see pyx/engine/codec/_heartbeat.pxd).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef int64_t c_pack_ipv4(object addr) except -1


cdef class ChannelTable:
    cdef int64_t* _last
    cdef int64_t* _oldest
    cdef int64_t* _addr
    cdef int64_t* _fkey
    cdef int64_t* _armed
    cdef int32_t* _cid
    cdef int32_t* _ver
    cdef int32_t* _mkey
    cdef int32_t* _mpos
    cdef uint8_t* _lang
    cdef uint8_t* _live
    cdef uint8_t* _used
    cdef uint8_t* _kinds
    cdef uint16_t* _nmem
    cdef int32_t* _free
    cdef Py_ssize_t _nfree
    cdef Py_ssize_t _top
    cdef Py_ssize_t _cap
    cdef int32_t** _members
    cdef int32_t* _msize
    cdef int32_t* _mcap
    cdef Py_ssize_t _nkeys
    cdef int64_t _fresh[4]
    cdef readonly Py_ssize_t max_slots
    cdef readonly int64_t producer_shift
    cdef uint32_t* _hash
    cdef int32_t* _index
    cdef Py_ssize_t _isize
    cdef uint64_t _mutations
    cdef list _channels
    cdef list _armed_by
    cdef dict _overflow
    cdef dict _lag
    cdef dict _info
    cdef Py_ssize_t _memberships
    cdef int32_t* _cslot
    cdef Py_ssize_t _ncslot

    cdef int _grow(self, Py_ssize_t cap) except -1
    cdef int _rehash(self, Py_ssize_t isize) except -1
    cdef uint32_t _hash_of(self, object channel) except? 0xFFFFFFFF
    cdef Py_ssize_t _find_channel(self, object channel, uint32_t h) except -2
    cdef void _index_add(self, Py_ssize_t slot, uint32_t h) noexcept
    cdef void _index_remove(self, Py_ssize_t slot) noexcept
    cdef Py_ssize_t _slot(self, object slot) except -1
    cdef int32_t _key(self, object key) except -1
    cdef Py_ssize_t _find(self, Py_ssize_t slot, int32_t key) except -2
    cdef list _keys(self, Py_ssize_t slot)
    cdef int _ensure_key(self, int32_t key) except -1
    cdef Py_ssize_t _add(self, Py_ssize_t s, int32_t k) except -1
    cdef void _set_pos(self, Py_ssize_t slot, int32_t key, int32_t pos) except *
    cdef int64_t _remove(self, Py_ssize_t s, int32_t k) except? -3
    cdef int64_t _time(self, Py_ssize_t slot, int32_t key) except? -1
    cdef int _recompute_oldest(self, Py_ssize_t s) except -1
    cdef int32_t c_set_client_slot(self, int32_t cid, Py_ssize_t s) except -2
    cdef bint c_drop_client_slot(self, Py_ssize_t cid, int64_t only_slot) noexcept
    cdef Py_ssize_t c_find(self, object channel) except -2
    cdef bint c_in_use(self, Py_ssize_t s) noexcept
    cdef int c_set_client(self, Py_ssize_t s, int32_t cid, uint8_t language, int32_t version) except -1
    cdef int64_t c_member_cid(self, Py_ssize_t s, int32_t k) except? -3
    cdef int c_refresh_all(self, Py_ssize_t s, object now) except -1

    cpdef find(self, channel)
    cpdef client(self, slot)
    cpdef set_client(self, slot, cid, language, version)
    cpdef nmem(self, slot)
    cpdef arm(self, slot, fkey, by, armed)
    cpdef mem_pos(self, slot, key)
    cpdef add_member(self, slot, key)
    cpdef member_info(self, slot, key)
    cpdef refresh(self, slot, keys, now)
    cpdef close(self, slot)
    cpdef addr(self, slot)
    cpdef kinds(self, slot)
    cpdef mem_keys(self, slot)
    cpdef remove_member(self, slot, key)
    cpdef group_size(self, key)
    cpdef open(self, channel, addr=*)
    cpdef set_addr(self, slot, addr)
    cpdef touch(self, slot, now)
    cpdef armed(self, slot)
    cpdef fkey(self, slot)
    cpdef armed_by(self, slot)

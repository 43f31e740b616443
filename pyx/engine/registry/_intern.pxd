# The native string pool's C layout, for the modules that cimport it (engine.registry._rules). Defined in
# pyx/registry/_intern.pyx (the layout: see pyx/engine/codec/_heartbeat.pxd).
from libc.stdint cimport int32_t, int64_t, uint32_t


cdef class StringPool:
    cdef uint32_t* _off
    cdef int32_t* _len
    cdef int32_t* _hash
    cdef int32_t* _refs
    cdef int64_t _free  # the last freed id, -1 if none; a freed id's offset column holds the one freed before it
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _top
    cdef int32_t* _index
    cdef Py_ssize_t _isize
    cdef char* _arena
    cdef int64_t _arena_len
    cdef int64_t _arena_cap
    cdef Py_ssize_t _live
    cdef Py_ssize_t _tombstones
    cdef int64_t _garbage

    cdef int _alloc_ids(self, Py_ssize_t cap) except -1
    cdef int _alloc_index(self, Py_ssize_t size) except -1
    cdef int _reserve_arena(self, int64_t need) except -1
    cdef void _compact_arena(self) noexcept
    cdef Py_ssize_t _find(self, const char* data, Py_ssize_t n, int32_t h, Py_ssize_t* where) noexcept
    cdef object _utf8(self, object s, const char** data, Py_ssize_t* n)
    cdef Py_ssize_t c_lookup(self, object s) except -2
    cdef int32_t c_intern(self, object s) except -1
    cdef Py_ssize_t _live_id(self, object e) except -1
    cdef Py_ssize_t c_acquire(self, object e) except -1
    cdef int c_release(self, object id) except -1
    cdef int c_acquire_id(self, Py_ssize_t e) except -1
    cdef int c_release_id(self, Py_ssize_t e) except -1
    cdef int c_prefetch(self, object s) except -1

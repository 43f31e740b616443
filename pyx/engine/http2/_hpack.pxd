# The compiled HPACK decoder's C layout, for the connection core that calls its scan (engine.http2._core). Defined in
# pyx/http2/_hpack.pyx.
cimport cython
from cpython.object cimport PyObject


cdef struct Lazy:
    # one field of the last scanned block, not yet a tuple (see HpackDecoder.scan_unary)
    PyObject* entry  # the (name, value) tuple when the field is one (static, in the table, or kept in _graves)
    PyObject* name  # a literal's indexed name (borrowed from a tuple held as above); NULL: the name's string at npos
    Py_ssize_t npos, vpos  # a literal's name and value strings: offsets in the block


cdef struct Entry:
    # one slot of the dynamic table
    PyObject* field  # the (name, value) tuple (a reference)
    PyObject* name  # its name and value (borrowed from it)
    PyObject* value
    Py_ssize_t size  # RFC 7541 4.1
    unsigned char kind  # what scan_unary reads of it


@cython.final
cdef class _Ring:
    cdef Entry* entries
    cdef Py_ssize_t cap, tail, count
    cdef public Py_ssize_t size, limit

    cdef Py_ssize_t slot(self, Py_ssize_t i) noexcept
    cdef tuple get(self, Py_ssize_t i)
    cdef tuple pop_oldest(self)
    cdef int push(self, tuple entry, Py_ssize_t size) except -1
    cdef list items(self)


@cython.final
cdef class HpackDecoder:
    cdef readonly Py_ssize_t max_table_size, max_header_list_size
    cdef _Ring _table
    cdef Lazy* _lazy
    cdef Py_ssize_t _lazy_n, _lazy_cap
    cdef list _graves  # entries evicted while the scanned block's fields still point at them
    cdef object _block  # what the scanned block is part of (its fields' strings are read from it)
    cdef const unsigned char* _block_p
    cdef Py_ssize_t _block_n
    cdef object path, client_id  # what the last scan read (see scan_unary)

    cdef tuple _field(self, Py_ssize_t index, Py_ssize_t pos)
    cdef bytes _name(self, Py_ssize_t index, Py_ssize_t pos)
    cdef int _evict_to(self, Py_ssize_t size) except -1
    cdef int _add(self, tuple entry) except -1
    cdef int _decode(self, const unsigned char* p, Py_ssize_t end, list out, Py_ssize_t max_metadata) except -1
    cdef int _lazy_field(self, PyObject* entry, PyObject* name, Py_ssize_t npos, Py_ssize_t vpos) except -1
    cdef int scan_unary(self, object owner, const unsigned char* p, Py_ssize_t n, Py_ssize_t max_metadata) except -1
    cdef list fields(self)
    cdef void release(self)

# C arrays grown in place, for the modules that cimport this (the channel table, the string pool). Inline only, so
# no module of this name exists at run time; the file name is the full module name (see
# pyx/codec/engine.codec._heartbeat.pxd).
from cpython.mem cimport PyMem_Realloc
from libc.string cimport memset


cdef inline void* grow_array(void* p, Py_ssize_t old_n, Py_ssize_t new_n, size_t item, int fill) except NULL:
    """``p`` reallocated to ``new_n`` items of ``item`` bytes, the ones past ``old_n`` filled with the byte
    ``fill``; MemoryError (``p`` left as it was) when the allocator fails."""
    cdef void* q = PyMem_Realloc(p, new_n * item if new_n else 1)
    if q == NULL:
        raise MemoryError()
    if new_n > old_n:
        memset(<char*>q + old_n * item, fill, (new_n - old_n) * item)
    return q

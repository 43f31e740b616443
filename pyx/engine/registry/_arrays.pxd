# C arrays grown in place, for the modules that cimport this (the channel table, the string pool). Inline only, so
# no module of this name exists at run time (the layout: see pyx/engine/codec/_heartbeat.pxd).
from cpython.mem cimport PyMem_Realloc
from libc.string cimport memset

cdef extern from *:
    """
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    #include <stdint.h>
    /* Ask for transparent huge pages over the 2 MiB-aligned interior of a large array (Linux, THP in "madvise"
       mode or "always"): a registry of a million clients probes its hash indexes at random, and with 4 KiB pages
       nearly every probe also misses the TLB. Only pages inside [p, p + n) are advised; a refusal is ignored
       (the hint changes no contents). */
    static void reg_hint_huge(void *p, size_t n) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const uintptr_t huge = (uintptr_t)2 << 20;
        uintptr_t start = ((uintptr_t)p + huge - 1) & ~(huge - 1);
        uintptr_t end = ((uintptr_t)p + n) & ~(huge - 1);
        if (n >= 2 * huge && end > start)
            (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
    #else
        (void)p; (void)n;
    #endif
    }
    """
    void reg_hint_huge(void* p, size_t n) nogil


cdef inline void* grow_array(void* p, Py_ssize_t old_n, Py_ssize_t new_n, size_t item, int fill) except NULL:
    """``p`` reallocated to ``new_n`` items of ``item`` bytes, the ones past ``old_n`` filled with the byte
    ``fill``; MemoryError (``p`` left as it was) when the allocator fails. A large array is advised huge pages
    before its new part is first written."""
    cdef void* q = PyMem_Realloc(p, new_n * item if new_n else 1)
    if q == NULL:
        raise MemoryError()
    if new_n > old_n:
        reg_hint_huge(q, new_n * item)
        memset(<char*>q + old_n * item, fill, (new_n - old_n) * item)
    return q

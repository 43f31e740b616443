# cython: language_level=3, boundscheck=False, wraparound=False
"""Native heartbeat digest for the registry's fast path (twin and specification: engine/registry/_digest_py.py).

Reads the heartbeat through ordinary attribute access (any object with the HeartbeatData attributes works) and
computes the same value as the twin: header words, then each set (producer groups, consumers, each consumer's
subscriptions) as an order-free sum when its keys' hashes are distinct, in order otherwise.
"""
from cpython.object cimport PyObject_Hash
from libc.stdint cimport int64_t, uint64_t

__all__ = ["heartbeat_digest"]

cdef uint64_t _OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t _PRIME = 0x100000001B3ULL
cdef enum:
    SMALL = 16   # sets up to this size are checked for equal keys pairwise; larger ones with a Python set


cdef inline uint64_t _mix(uint64_t h, uint64_t w) noexcept:
    return (h ^ w) * _PRIME


cdef inline uint64_t _fmix(uint64_t h) noexcept:
    h ^= h >> 30
    h *= 0xBF58476D1CE4E5B9ULL
    h ^= h >> 27
    h *= 0x94D049BB133111EBULL
    return h ^ (h >> 31)


cdef inline uint64_t _ordinal(object e) except? 0xFFFFFFFFFFFFFFFF:
    if e is None:
        return <uint64_t>(-1)
    return <uint64_t><int64_t>e


cdef inline uint64_t _word(object value) except? 0xFFFFFFFFFFFFFFFF:
    # the twin masks Python ints to 64 bits after checking they fit int64; the cast does the same here
    return <uint64_t><int64_t>value


cdef uint64_t _set_digest(const uint64_t* keys, const uint64_t* elements, Py_ssize_t n,
                         uint64_t* mode) noexcept:
    """The twin's _set_words over C arrays: mode 1 and the wrapping sum of the finalized elements when the keys
    are pairwise different, mode 2 and the ordered FNV otherwise. Quadratic: only for n <= SMALL."""
    cdef Py_ssize_t i, j
    cdef uint64_t h = 0
    for i in range(1, n):
        for j in range(i):
            if keys[j] == keys[i]:
                mode[0] = 2
                h = _OFFSET
                for j in range(n):
                    h = _mix(h, elements[j])
                return h
    mode[0] = 1
    for i in range(n):
        h += _fmix(elements[i])
    return h


cdef uint64_t _set_digest_large(list keys, list elements, uint64_t* mode) except? 0xFFFFFFFFFFFFFFFF:
    """The same for sets over SMALL elements (Python ints in lists; a Python set checks the keys)."""
    cdef uint64_t h = 0
    cdef object e
    if len(set(keys)) == len(keys):
        mode[0] = 1
        for e in elements:
            h += _fmix(<uint64_t>e)
        return h
    mode[0] = 2
    h = _OFFSET
    for e in elements:
        h = _mix(h, <uint64_t>e)
    return h


cdef uint64_t _subscriptions_digest(object subs, uint64_t* mode) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t keys[SMALL]
    cdef uint64_t elements[SMALL]
    cdef uint64_t t
    cdef Py_ssize_t n = len(subs), i = 0
    cdef object s
    if n > SMALL:
        large_keys, large_elements = [], []
        for s in subs:
            t = <uint64_t>PyObject_Hash(s.topic)
            large_keys.append(t)
            large_elements.append(_mix(_mix(_OFFSET, t), _word(s.sub_version)))
        return _set_digest_large(large_keys, large_elements, mode)
    for s in subs:
        if i >= n:  # the sequence grew while read: a heartbeat object is not shared, but never write past
            raise ValueError("subscriptions changed while digested")
        t = <uint64_t>PyObject_Hash(s.topic)
        keys[i] = t
        elements[i] = _mix(_mix(_OFFSET, t), _word(s.sub_version))
        i += 1
    return _set_digest(keys, elements, i, mode)


def heartbeat_digest(hb, language, version):
    """Digest of ``hb`` as received with the request header's ``language`` and ``version`` (signed int64)."""
    cdef uint64_t h = _OFFSET, sum_p = 0, group, e, mode_s = 0, mode_c = 0, digest
    cdef uint64_t keys[SMALL]
    cdef uint64_t elements[SMALL]
    cdef Py_ssize_t n, i = 0
    cdef object producers, consumers, subs, p, c
    cdef list large_keys = None, large_elements = None
    h = _mix(h, <uint64_t>PyObject_Hash(hb.client_id))
    h = _mix(h, _word(hb.fingerprint))
    h = _mix(h, 1 if hb.without_sub else 0)
    h = _mix(h, _ordinal(language))
    h = _mix(h, _word(version))
    producers = hb.producers
    for p in producers:
        sum_p += _fmix(<uint64_t>PyObject_Hash(p.group))
    h = _mix(h, <uint64_t>len(producers))
    h = _mix(h, sum_p)
    consumers = hb.consumers
    n = len(consumers)
    if n > SMALL:
        large_keys, large_elements = [], []
    for c in consumers:
        subs = c.subscriptions
        digest = _subscriptions_digest(subs, &mode_s)
        group = <uint64_t>PyObject_Hash(c.group)
        e = _mix(_OFFSET, group)
        e = _mix(e, _ordinal(c.consume_type))
        e = _mix(e, _ordinal(c.message_model))
        e = _mix(e, _ordinal(c.consume_from_where))
        e = _mix(e, 1 if c.unit_mode else 0)
        e = _mix(e, <uint64_t>len(subs))
        e = _mix(e, mode_s)
        e = _mix(e, digest)
        if large_keys is not None:
            large_keys.append(group)
            large_elements.append(e)
        elif i >= n:
            raise ValueError("consumers changed while digested")
        else:
            keys[i] = group
            elements[i] = e
        i += 1
    if large_keys is not None:
        digest = _set_digest_large(large_keys, large_elements, &mode_c)
    else:
        digest = _set_digest(keys, elements, i, &mode_c)
    h = _mix(h, <uint64_t>i)
    h = _mix(h, mode_c)
    h = _mix(h, digest)
    return <int64_t>_fmix(h)

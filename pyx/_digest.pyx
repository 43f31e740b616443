# cython: language_level=3, boundscheck=False, wraparound=False
"""Native heartbeat digest for the registry's fast path (twin and specification: engine/_digest_py.py).

Reads the heartbeat through ordinary attribute access (any object with the HeartbeatData attributes works) and
mixes the same 64-bit words as the twin, in the same order, so both return the same value for the same input.
"""
from cpython.object cimport PyObject_Hash
from libc.stdint cimport int64_t, uint64_t

__all__ = ["heartbeat_digest"]

cdef uint64_t _OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t _PRIME = 0x100000001B3ULL


cdef inline uint64_t _mix(uint64_t h, uint64_t w) noexcept:
    return (h ^ w) * _PRIME


cdef inline uint64_t _ordinal(object e) except? 0xFFFFFFFFFFFFFFFF:
    if e is None:
        return <uint64_t>(-1)
    return <uint64_t><int64_t>e


cdef inline uint64_t _word(object value) except? 0xFFFFFFFFFFFFFFFF:
    # the twin masks Python ints to 64 bits after checking they fit int64; the cast does the same here
    return <uint64_t><int64_t>value


def heartbeat_digest(hb, language, version):
    """Digest of ``hb`` as received with the request header's ``language`` and ``version`` (signed int64)."""
    cdef uint64_t h = _OFFSET
    cdef object producers, consumers, subs, p, c, s
    h = _mix(h, <uint64_t>PyObject_Hash(hb.client_id))
    h = _mix(h, _word(hb.fingerprint))
    h = _mix(h, 1 if hb.without_sub else 0)
    h = _mix(h, _ordinal(language))
    h = _mix(h, _word(version))
    producers = hb.producers
    h = _mix(h, <uint64_t>len(producers))
    for p in producers:
        h = _mix(h, <uint64_t>PyObject_Hash(p.group))
    consumers = hb.consumers
    h = _mix(h, <uint64_t>len(consumers))
    for c in consumers:
        subs = c.subscriptions
        h = _mix(h, <uint64_t>PyObject_Hash(c.group))
        h = _mix(h, _ordinal(c.consume_type))
        h = _mix(h, _ordinal(c.message_model))
        h = _mix(h, _ordinal(c.consume_from_where))
        h = _mix(h, 1 if c.unit_mode else 0)
        h = _mix(h, <uint64_t>len(subs))
        for s in subs:
            h = _mix(h, <uint64_t>PyObject_Hash(s.topic))
            h = _mix(h, _word(s.sub_version))
    # splitmix64 finalizer
    h ^= h >> 30
    h *= 0xBF58476D1CE4E5B9ULL
    h ^= h >> 27
    h *= 0x94D049BB133111EBULL
    h ^= h >> 31
    return <int64_t>h

# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native HeartbeatData decoder: a JSON parser in Cython over the raw body, building the model directly.

Same names, inputs, outputs and errors as the twin ``engine.codec._heartbeat_py`` (read its docstring for the rules).
Bounds: the body is read only through ``Parser.s[i]`` with ``i < Parser.n`` checked before every read (``_peek``
returns 0 past the end, and every multi-byte read checks its length first); Cython's own boundscheck is off
because no Cython-indexed buffer is used.

Design: one parser fills a ``_Sink`` of C records (producers, consumers, subscriptions) holding the decoded
strings; ``decode_heartbeat`` turns the records of one body into model objects, ``decode_heartbeats`` keeps the
records of every good body and turns them into numpy columns, without model objects. A body decodes at most
``max_elements`` elements (tags, codes, subscriptions, consumers, producers: one counter increment each), so what
it builds is bounded by its size plus a bounded overhead per element. Repeated short strings
(client ids, groups, topics, tags, expression types) come from a bounded direct-mapped cache keyed by their raw
bytes, so a steady-state heartbeat allocates little besides its result.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLong
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF, PyObject
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy

cimport numpy as cnp

import time

import numpy as np

from .enums import ConsumeFromWhere, ConsumeType, MessageModel
from .errors import HeartbeatError, echo
from .heartbeat import CONSUMER_COLUMNS, HEARTBEAT_COLUMNS, PRODUCER_COLUMNS, SUBSCRIPTION_COLUMNS, HeartbeatBatch
from ._heartbeat_py import DEFAULT_MAX_ELEMENTS, _check_int, _check_items, _check_str, _coerce_enum, _enum_repr
from ._heartbeat_py import _max_elements, _too_many

cnp.import_array()

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "ConsumerData",
    "HeartbeatData",
    "ProducerData",
    "SubscriptionData",
    "decode_heartbeat",
    "decode_heartbeats",
]

#: Deepest nesting of arrays/objects accepted anywhere in a body (the top-level object is depth 1).
MAX_DEPTH = 64
cdef enum:
    C_MAX_DEPTH = 64
    PATH_SLOTS = 16         # path components kept for messages (the known structure needs 7)
    CACHE_SLOTS = 4096      # string cache entries (power of two)
    CACHE_MAX_LEN = 160     # longer strings are not cached
    KEY_MAX = 32            # escaped keys longer than this cannot be a known key

cdef object _DEFAULT_MAX_ELEMENTS = DEFAULT_MAX_ELEMENTS
cdef Py_ssize_t C_DEFAULT_MAX_ELEMENTS = DEFAULT_MAX_ELEMENTS

cdef int64_t INT32_MIN_ = -2147483648
cdef int64_t INT32_MAX_ = 2147483647
cdef int64_t INT64_MIN_ = INT64_MIN
cdef int64_t INT64_MAX_ = INT64_MAX

# enum members by ordinal, and their names as bytes for matching raw JSON strings
cdef tuple _CONSUME_TYPES = tuple(ConsumeType)
cdef tuple _MESSAGE_MODELS = tuple(MessageModel)
cdef tuple _CONSUME_FROM_WHERES = tuple(ConsumeFromWhere)
cdef tuple _CONSUME_TYPE_NAMES = tuple(m.name.encode() for m in ConsumeType)
cdef tuple _MESSAGE_MODEL_NAMES = tuple(m.name.encode() for m in MessageModel)
cdef tuple _CONSUME_FROM_WHERE_NAMES = tuple(m.name.encode() for m in ConsumeFromWhere)
cdef str _TAG = "TAG"
cdef tuple _EMPTY = ()


# ==============================================================================================================
# Model: immutable cdef classes, compared and hashed by fields, equal to the twin's classes.

cdef class _Model:
    """What the four model classes share: equality by fields (a typed fast path against the same class, the field
    tuple ``_key()`` against the twin's class of the same ``_rmq_kind``), hashing, pickling.

    The subclasses define neither __eq__ nor __hash__, so they inherit both slots together (a subclass that
    defined __eq__ alone would be unhashable)."""

    _rmq_kind = None

    cdef bint _same(self, _Model other) except -1:
        """Field equality with an instance of the same class (overridden: typed field comparisons)."""
        return self._key() == other._key()

    def _key(self):
        raise NotImplementedError

    def __eq__(self, other):
        if type(other) is type(self):
            return self._same(<_Model>other)
        if getattr(other, "_rmq_kind", None) != self._rmq_kind:
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash((self._rmq_kind,) + self._key())

    def __reduce__(self):
        return (type(self), self._key())


cdef class SubscriptionData(_Model):
    """One subscription: topic, expression (sub_string), its tags and their Java hash codes, version, type."""


    _rmq_kind = "SubscriptionData"

    def __init__(self, topic, sub_string="*", tags=(), codes=(), sub_version=0, expression_type="TAG",
                 class_filter_mode=False):
        tags = tuple(tags)
        for t in tags:
            if not isinstance(t, str):
                raise TypeError(f"tags must hold str, not {type(t).__name__}")
        self.topic = _check_str(topic, "topic")
        self.sub_string = _check_str(sub_string, "sub_string")
        self.tags = tags
        self.codes = tuple([_check_int(c, "codes element", -(1 << 31), (1 << 31) - 1) for c in codes])
        self.sub_version = _check_int(sub_version, "sub_version", -(1 << 63), (1 << 63) - 1)
        self.expression_type = _TAG if expression_type is None else _check_str(expression_type, "expression_type")
        self.class_filter_mode = bool(class_filter_mode)

    def _key(self):
        return (self.topic, self.sub_string, self.tags, self.codes, self.sub_version, self.expression_type,
                self.class_filter_mode)

    cdef bint _same(self, _Model other) except -1:
        cdef SubscriptionData o = <SubscriptionData>other
        return (self.sub_version == o.sub_version and self.class_filter_mode == o.class_filter_mode
                and self.topic == o.topic and self.sub_string == o.sub_string and self.tags == o.tags
                and self.codes == o.codes and self.expression_type == o.expression_type)

    def to_dict(self):
        return {
            "topic": self.topic,
            "sub_string": self.sub_string,
            "tags": list(self.tags),
            "codes": list(self.codes),
            "sub_version": self.sub_version,
            "expression_type": self.expression_type,
            "class_filter_mode": self.class_filter_mode,
        }

    def __repr__(self):
        return (f"SubscriptionData(topic={self.topic!r}, sub_string={self.sub_string!r}, tags={self.tags!r}, "
                f"codes={self.codes!r}, sub_version={self.sub_version!r}, expression_type={self.expression_type!r}, "
                f"class_filter_mode={self.class_filter_mode!r})")


cdef class ProducerData(_Model):
    """A producer group of the client."""


    _rmq_kind = "ProducerData"

    def __init__(self, group):
        self.group = _check_str(group, "group")

    def _key(self):
        return (self.group,)

    cdef bint _same(self, _Model other) except -1:
        return self.group == (<ProducerData>other).group

    def to_dict(self):
        return {"group": self.group}

    def __repr__(self):
        return f"ProducerData(group={self.group!r})"


cdef class ConsumerData(_Model):
    """A consumer group of the client with its consume settings and subscriptions."""


    _rmq_kind = "ConsumerData"

    def __init__(self, group, consume_type=None, message_model=None, consume_from_where=None, unit_mode=False,
                 subscriptions=()):
        self.group = _check_str(group, "group")
        self.consume_type = _coerce_enum(ConsumeType, consume_type, "consume_type")
        self.message_model = _coerce_enum(MessageModel, message_model, "message_model")
        self.consume_from_where = _coerce_enum(ConsumeFromWhere, consume_from_where, "consume_from_where")
        self.unit_mode = bool(unit_mode)
        self.subscriptions = _check_items(subscriptions, "SubscriptionData", "subscriptions")

    def _key(self):
        return (self.group, self.consume_type, self.message_model, self.consume_from_where, self.unit_mode,
                self.subscriptions)

    cdef bint _same(self, _Model other) except -1:
        cdef ConsumerData o = <ConsumerData>other
        return (self.consume_type is o.consume_type and self.message_model is o.message_model
                and self.consume_from_where is o.consume_from_where and self.unit_mode == o.unit_mode
                and self.group == o.group and self.subscriptions == o.subscriptions)

    def to_dict(self):
        return {
            "group": self.group,
            "consume_type": None if self.consume_type is None else self.consume_type.name,
            "message_model": None if self.message_model is None else self.message_model.name,
            "consume_from_where": None if self.consume_from_where is None else self.consume_from_where.name,
            "unit_mode": self.unit_mode,
            "subscriptions": [s.to_dict() for s in self.subscriptions],
        }

    def __repr__(self):
        return (f"ConsumerData(group={self.group!r}, consume_type={_enum_repr(self.consume_type)}, "
                f"message_model={_enum_repr(self.message_model)}, "
                f"consume_from_where={_enum_repr(self.consume_from_where)}, unit_mode={self.unit_mode!r}, "
                f"subscriptions={self.subscriptions!r})")


cdef class HeartbeatData(_Model):
    """The body of a HEART_BEAT request: client id, producer and consumer groups, V2 fingerprint and flag."""


    _rmq_kind = "HeartbeatData"

    def __init__(self, client_id=None, producers=(), consumers=(), fingerprint=0, without_sub=False):
        self.client_id = _check_str(client_id, "client_id")
        self.producers = _check_items(producers, "ProducerData", "producers")
        self.consumers = _check_items(consumers, "ConsumerData", "consumers")
        self.fingerprint = _check_int(fingerprint, "fingerprint", -(1 << 31), (1 << 31) - 1)
        self.without_sub = bool(without_sub)

    def _key(self):
        return (self.client_id, self.producers, self.consumers, self.fingerprint, self.without_sub)

    cdef bint _same(self, _Model other) except -1:
        cdef HeartbeatData o = <HeartbeatData>other
        return (self.fingerprint == o.fingerprint and self.without_sub == o.without_sub
                and self.client_id == o.client_id and self.producers == o.producers
                and self.consumers == o.consumers)

    def to_dict(self):
        return {
            "client_id": self.client_id,
            "producers": [p.to_dict() for p in self.producers],
            "consumers": [c.to_dict() for c in self.consumers],
            "fingerprint": self.fingerprint,
            "without_sub": self.without_sub,
        }

    def __repr__(self):
        return (f"HeartbeatData(client_id={self.client_id!r}, producers={self.producers!r}, "
                f"consumers={self.consumers!r}, fingerprint={self.fingerprint!r}, "
                f"without_sub={self.without_sub!r})")


# ==============================================================================================================
# String cache: direct-mapped, keyed by the raw (escape-free) UTF-8 bytes. Holds at most CACHE_SLOTS strings.

cdef PyObject* _cache_key[CACHE_SLOTS]   # bytes (owned) or NULL
cdef PyObject* _cache_val[CACHE_SLOTS]   # str (owned) or NULL


cdef inline uint64_t _load8(const unsigned char* s) noexcept:
    cdef uint64_t v
    memcpy(&v, s, 8)
    return v


cdef inline uint64_t _string_hash(const unsigned char* s, Py_ssize_t n) noexcept:
    """A cheap hash for the cache: length, first and last 8 bytes (a collision only costs a miss)."""
    cdef uint64_t a = 0, b = 0, h
    cdef Py_ssize_t i
    if n >= 8:
        a = _load8(s)
        b = _load8(s + n - 8)
    else:
        for i in range(n):
            a = (a << 8) | s[i]
    h = (a * 0x9E3779B97F4A7C15ULL) ^ (b * 0xC2B2AE3D27D4EB4FULL) ^ <uint64_t>n
    return h ^ (h >> 32) ^ (h >> 17)


cdef object _cached_str(const unsigned char* s, Py_ssize_t n):
    """The str of n raw UTF-8 bytes (already validated, no escapes)."""
    cdef uint64_t slot
    cdef PyObject* key
    if n > CACHE_MAX_LEN:
        return PyUnicode_DecodeUTF8(<const char*>s, n, "strict")
    slot = _string_hash(s, n) & (CACHE_SLOTS - 1)
    key = _cache_key[slot]
    if key != NULL and PyBytes_GET_SIZE(<object>key) == n and memcmp(PyBytes_AS_STRING(<object>key), s, n) == 0:
        return <object>_cache_val[slot]
    value = PyUnicode_DecodeUTF8(<const char*>s, n, "strict")
    new_key = PyBytes_FromStringAndSize(<const char*>s, n)
    Py_XDECREF(_cache_key[slot])
    Py_XDECREF(_cache_val[slot])
    Py_INCREF(new_key)
    Py_INCREF(value)
    _cache_key[slot] = <PyObject*>new_key
    _cache_val[slot] = <PyObject*>value
    return value


# ==============================================================================================================
# Records filled by the parser

cdef struct SubRec:
    PyObject* topic            # str or NULL (None); all PyObject* fields are owned references
    PyObject* sub_string
    PyObject* expression_type  # NULL = "TAG"
    PyObject* tags             # tuple or NULL (empty)
    PyObject* codes
    int64_t sub_version
    int32_t consumer
    int32_t row
    bint has_version
    bint class_filter_mode

cdef struct ConsRec:
    PyObject* group
    Py_ssize_t first_sub
    int32_t row
    int32_t n_subs
    int8_t consume_type        # ordinal, -1 = None
    int8_t message_model
    int8_t consume_from_where
    bint unit_mode

cdef struct ProdRec:
    PyObject* group
    int32_t row


cdef inline void _put(PyObject** slot, object value):
    """Store value (None -> NULL) in an owned slot, releasing what was there."""
    cdef PyObject* old = slot[0]
    if value is None:
        slot[0] = NULL
    else:
        Py_INCREF(value)
        slot[0] = <PyObject*>value
    Py_XDECREF(old)


cdef inline object _get(PyObject* p):
    return None if p == NULL else <object>p


cdef void* _grow(void* buf, Py_ssize_t* cap, size_t item) except NULL:
    cdef Py_ssize_t new_cap = cap[0] * 2 if cap[0] else 16
    cdef void* out = realloc(buf, <size_t>new_cap * item)
    if out == NULL:
        raise MemoryError()
    cap[0] = new_cap
    return out


cdef class _Sink:
    """Growable arrays of records; owns the string/tuple references they hold."""

    cdef SubRec* subs
    cdef ConsRec* cons
    cdef ProdRec* prods
    cdef Py_ssize_t ns, nc, np_, cap_s, cap_c, cap_p
    cdef PyObject** scratch   # tags being read (owned)
    cdef int32_t* iscratch    # codes being read
    cdef Py_ssize_t cap_scratch, cap_iscratch
    cdef unsigned char* text  # unescaped string bytes
    cdef Py_ssize_t cap_text
    cdef bint busy

    def __dealloc__(self):
        self.truncate(0, 0, 0)
        free(self.subs)
        free(self.cons)
        free(self.prods)
        free(self.scratch)
        free(self.iscratch)
        free(self.text)

    cdef void truncate_subs(self, Py_ssize_t ns) noexcept:
        cdef SubRec* r
        while self.ns > ns:
            self.ns -= 1
            r = &self.subs[self.ns]
            Py_XDECREF(r.topic)
            Py_XDECREF(r.sub_string)
            Py_XDECREF(r.expression_type)
            Py_XDECREF(r.tags)
            Py_XDECREF(r.codes)

    cdef void truncate_cons(self, Py_ssize_t nc) noexcept:
        while self.nc > nc:
            self.nc -= 1
            Py_XDECREF(self.cons[self.nc].group)

    cdef void truncate_prods(self, Py_ssize_t np_) noexcept:
        while self.np_ > np_:
            self.np_ -= 1
            Py_XDECREF(self.prods[self.np_].group)

    cdef void truncate(self, Py_ssize_t np_, Py_ssize_t nc, Py_ssize_t ns) noexcept:
        self.truncate_prods(np_)
        self.truncate_cons(nc)
        self.truncate_subs(ns)

    cdef SubRec* add_sub(self, int32_t consumer, int32_t row) except NULL:
        cdef SubRec* r
        if self.ns == self.cap_s:
            self.subs = <SubRec*>_grow(self.subs, &self.cap_s, sizeof(SubRec))
        r = &self.subs[self.ns]
        r.topic = r.sub_string = r.expression_type = r.tags = r.codes = NULL
        r.sub_version = 0
        r.has_version = False
        r.class_filter_mode = False
        r.consumer = consumer
        r.row = row
        self.ns += 1
        return r

    cdef ConsRec* add_cons(self, int32_t row) except NULL:
        cdef ConsRec* r
        if self.nc == self.cap_c:
            self.cons = <ConsRec*>_grow(self.cons, &self.cap_c, sizeof(ConsRec))
        r = &self.cons[self.nc]
        r.group = NULL
        r.first_sub = self.ns
        r.row = row
        r.n_subs = 0
        r.consume_type = r.message_model = r.consume_from_where = -1
        r.unit_mode = False
        self.nc += 1
        return r

    cdef ProdRec* add_prod(self, int32_t row) except NULL:
        cdef ProdRec* r
        if self.np_ == self.cap_p:
            self.prods = <ProdRec*>_grow(self.prods, &self.cap_p, sizeof(ProdRec))
        r = &self.prods[self.np_]
        r.group = NULL
        r.row = row
        self.np_ += 1
        return r

    cdef int reserve_text(self, Py_ssize_t n) except -1:
        cdef unsigned char* out
        if n > self.cap_text:
            out = <unsigned char*>realloc(self.text, <size_t>n)
            if out == NULL:
                raise MemoryError()
            self.text = out
            self.cap_text = n
        return 0


cdef _Sink _shared_sink = _Sink()


cdef _Sink _acquire_sink():
    """The shared sink, or a fresh one if it is in use (a decode re-entered from a finalizer during parsing)."""
    global _shared_sink
    cdef _Sink sink = _shared_sink
    if sink.busy:
        sink = _Sink()
    sink.busy = True
    return sink


# ==============================================================================================================
# Parser

# 1 for bytes that stand for themselves inside a JSON string: printable ASCII except '"' and '\\'
cdef unsigned char _PLAIN[256]
for _c in range(256):
    _PLAIN[_c] = 1 if (0x20 <= _c < 0x80 and _c != 0x22 and _c != 0x5C) else 0

cdef inline uint64_t _special8(uint64_t v) noexcept:
    """Nonzero if any of the 8 bytes is '"', '\\', < 0x20 or >= 0x80 (may flag extra bytes after a real one)."""
    cdef uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL
    cdef uint64_t q = v ^ 0x2222222222222222ULL
    cdef uint64_t b = v ^ 0x5C5C5C5C5C5C5C5CULL
    return (((q - ones) & ~q) | ((b - ones) & ~b) | (v - 0x2020202020202020ULL) | v) & high


cdef enum:
    F_ESCAPE = 1
    F_NON_ASCII = 2

cdef struct Parser:
    const unsigned char* s
    Py_ssize_t n
    Py_ssize_t pos
    int depth
    int plen                              # path components in use
    const unsigned char* pkey[PATH_SLOTS]   # key bytes, or NULL for an array index
    Py_ssize_t pkeylen[PATH_SLOTS]
    Py_ssize_t pidx[PATH_SLOTS]
    const unsigned char* raw_key          # the last key read, as in the input
    Py_ssize_t raw_key_len
    int64_t now_ms                        # Java's default subVersion, read lazily; -1 = not read yet
    int32_t row
    Py_ssize_t elements                   # decoded elements so far (tags, codes, subscriptions, groups)
    Py_ssize_t max_elements               # ... at most (decode_heartbeat's max_elements)


cdef inline unsigned char _peek(Parser* p) noexcept:
    return p.s[p.pos] if p.pos < p.n else 0


cdef inline void _ws(Parser* p) noexcept:
    cdef unsigned char c
    while p.pos < p.n:
        c = p.s[p.pos]
        if c == 32 or c == 10 or c == 13 or c == 9:
            p.pos += 1
        else:
            return


cdef inline void _push_key(Parser* p, const char* key, Py_ssize_t n) noexcept:
    if p.plen < PATH_SLOTS:
        p.pkey[p.plen] = <const unsigned char*>key
        p.pkeylen[p.plen] = n
    p.plen += 1


cdef inline void _push_index(Parser* p) noexcept:
    if p.plen < PATH_SLOTS:
        p.pkey[p.plen] = NULL
        p.pidx[p.plen] = 0
    p.plen += 1


cdef inline void _set_index(Parser* p, Py_ssize_t i) noexcept:
    if 0 < p.plen <= PATH_SLOTS:
        p.pidx[p.plen - 1] = i


cdef inline void _pop(Parser* p) noexcept:
    p.plen -= 1


cdef str _path(Parser* p):
    parts = ["$"]
    cdef int i
    cdef Py_ssize_t n
    for i in range(min(p.plen, PATH_SLOTS)):
        if p.pkey[i] == NULL:
            parts.append(f"[{p.pidx[i]}]")
        else:
            n = min(p.pkeylen[i], 32)
            parts.append("." + (<bytes>p.pkey[i][:n]).decode("utf-8", "replace"))
    return "".join(parts)


cdef int _fail(Parser* p, Py_ssize_t at, str what) except -1:
    """Raise HeartbeatError: path, problem, byte offset and a short echo of the input there."""
    if at > p.n:
        at = p.n
    raise HeartbeatError(f"{_path(p)}: {what} at byte {at}: {echo(<bytes>p.s[at:min(p.n, at + 32)])}")


cdef int _syntax(Parser* p, str expected) except -1:
    if p.pos >= p.n:
        return _fail(p, p.pos, f"malformed JSON: expected {expected}, got end of input")
    return _fail(p, p.pos, f"malformed JSON: expected {expected}")


cdef str _kind_at(Parser* p):
    cdef unsigned char c = _peek(p)
    if c == b'"':
        return "a string"
    if c == b'{':
        return "an object"
    if c == b'[':
        return "an array"
    if c == b't' or c == b'f':
        return "a boolean"
    if c == b'n':
        return "null"
    if c == b'-' or (b'0' <= c <= b'9'):
        return "a number"
    return "invalid JSON"


cdef int _wrong_type(Parser* p, str expected) except -1:
    if _kind_at(p) == "invalid JSON":
        return _syntax(p, "a JSON value")
    return _fail(p, p.pos, f"expected {expected}, got {_kind_at(p)}")


cdef inline int _hex4(const unsigned char* s) noexcept:
    """Value of 4 hex digits, or -1."""
    cdef int v = 0, i, c
    for i in range(4):
        c = s[i]
        if b'0' <= c <= b'9':
            v = v * 16 + (c - 48)
        elif b'a' <= c <= b'f':
            v = v * 16 + (c - 87)
        elif b'A' <= c <= b'F':
            v = v * 16 + (c - 55)
        else:
            return -1
    return v


cdef inline Py_ssize_t _utf8_len(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept:
    """Length of the valid UTF-8 sequence starting at s[i] (a byte >= 0x80), or 0 if invalid.

    Exactly the sequences Python's strict decoder accepts: no overlongs, no surrogates, nothing above U+10FFFF.
    """
    cdef unsigned char c = s[i], c1, c2, c3
    if 0xC2 <= c <= 0xDF:
        if i + 1 < n and 0x80 <= s[i + 1] <= 0xBF:
            return 2
        return 0
    if 0xE0 <= c <= 0xEF:
        if i + 2 >= n:
            return 0
        c1 = s[i + 1]
        c2 = s[i + 2]
        if not (0x80 <= c2 <= 0xBF):
            return 0
        if c == 0xE0:
            return 3 if 0xA0 <= c1 <= 0xBF else 0
        if c == 0xED:
            return 3 if 0x80 <= c1 <= 0x9F else 0
        return 3 if 0x80 <= c1 <= 0xBF else 0
    if 0xF0 <= c <= 0xF4:
        if i + 3 >= n:
            return 0
        c1 = s[i + 1]
        c2 = s[i + 2]
        c3 = s[i + 3]
        if not (0x80 <= c2 <= 0xBF and 0x80 <= c3 <= 0xBF):
            return 0
        if c == 0xF0:
            return 4 if 0x90 <= c1 <= 0xBF else 0
        if c == 0xF4:
            return 4 if 0x80 <= c1 <= 0x8F else 0
        return 4 if 0x80 <= c1 <= 0xBF else 0
    return 0


cdef int _scan_string(Parser* p, Py_ssize_t* start, Py_ssize_t* end) except -1:
    """Validate the JSON string at p.pos ('"'); set its content span; return F_* flags; move past it."""
    cdef const unsigned char* s = p.s
    cdef Py_ssize_t n = p.n
    cdef Py_ssize_t i = p.pos + 1
    cdef int flags = 0, cp, lo
    cdef unsigned char c, e
    cdef Py_ssize_t k
    start[0] = i
    while True:
        while i + 8 <= n and not _special8(_load8(s + i)):   # 8 plain bytes at a time
            i += 8
        while i < n and _PLAIN[s[i]]:
            i += 1
        if i >= n:
            return _fail(p, p.pos, "malformed JSON: unterminated string")
        c = s[i]
        if c == b'"':
            end[0] = i
            p.pos = i + 1
            return flags
        if c == b'\\':
            flags |= F_ESCAPE
            if i + 1 >= n:
                return _fail(p, p.pos, "malformed JSON: unterminated string")
            e = s[i + 1]
            if e == b'"' or e == b'\\' or e == b'/' or e == b'b' or e == b'f' or e == b'n' or e == b'r' or e == b't':
                i += 2
                continue
            if e != b'u':
                return _fail(p, i, "malformed JSON: invalid escape")
            if i + 6 > n or (cp := _hex4(s + i + 2)) < 0:
                return _fail(p, i, "malformed JSON: invalid \\uXXXX escape")
            if 0xD800 <= cp <= 0xDBFF:
                if (i + 12 <= n and s[i + 6] == b'\\' and s[i + 7] == b'u'
                        and 0xDC00 <= (lo := _hex4(s + i + 8)) <= 0xDFFF):
                    i += 12
                    continue
                return _fail(p, i, "lone surrogate in a \\u escape")
            if 0xDC00 <= cp <= 0xDFFF:
                return _fail(p, i, "lone surrogate in a \\u escape")
            i += 6
            continue
        if c < 0x20:
            return _fail(p, i, "malformed JSON: control character in a string")
        k = _utf8_len(s, i, n)
        if k == 0:
            return _fail(p, i, "invalid UTF-8")
        flags |= F_NON_ASCII
        i += k


cdef inline void _put_utf8(unsigned char* out, Py_ssize_t* j, int cp) noexcept:
    cdef Py_ssize_t o = j[0]
    if cp < 0x80:
        out[o] = cp
        j[0] = o + 1
    elif cp < 0x800:
        out[o] = 0xC0 | (cp >> 6)
        out[o + 1] = 0x80 | (cp & 0x3F)
        j[0] = o + 2
    elif cp < 0x10000:
        out[o] = 0xE0 | (cp >> 12)
        out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[o + 2] = 0x80 | (cp & 0x3F)
        j[0] = o + 3
    else:
        out[o] = 0xF0 | (cp >> 18)
        out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
        out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
        out[o + 3] = 0x80 | (cp & 0x3F)
        j[0] = o + 4


cdef Py_ssize_t _unescape(Parser* p, _Sink sink, Py_ssize_t start, Py_ssize_t end) except -1:
    """Decode the escapes of a string span validated by _scan_string into sink.text; return the UTF-8 length.

    The output is never longer than the input (an escape of 2, 6 or 12 bytes gives at most 1, 3 or 4 bytes).
    Every read stays inside [start, end) even if the span is not what _scan_string saw (a bytes-like body
    changed by another thread): that is reported, never read past.
    """
    cdef const unsigned char* s = p.s
    cdef Py_ssize_t i = start, j = 0
    cdef unsigned char* out
    cdef unsigned char e
    cdef int cp, lo
    sink.reserve_text(end - start + 1)
    out = sink.text
    while i < end:
        if s[i] != b'\\':
            out[j] = s[i]
            i += 1
            j += 1
            continue
        if i + 2 > end:
            return _fail(p, i, "body changed while decoding")
        e = s[i + 1]
        i += 2
        if e == b'u':
            if i + 4 > end or (cp := _hex4(s + i)) < 0:
                return _fail(p, i, "body changed while decoding")
            i += 4
            if 0xD800 <= cp <= 0xDBFF:
                if (i + 6 > end or s[i] != b'\\' or s[i + 1] != b'u'
                        or not (0xDC00 <= (lo := _hex4(s + i + 2)) <= 0xDFFF)):
                    return _fail(p, i, "body changed while decoding")
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                i += 6
            _put_utf8(out, &j, cp)
        else:
            if e == b'b':
                out[j] = 8
            elif e == b'f':
                out[j] = 12
            elif e == b'n':
                out[j] = 10
            elif e == b'r':
                out[j] = 13
            elif e == b't':
                out[j] = 9
            else:
                out[j] = e   # " \ /
            j += 1
    return j


cdef object _read_string(Parser* p, _Sink sink):
    """The JSON string at p.pos as str (cached when it has no escapes)."""
    cdef Py_ssize_t start, end, n
    cdef int flags = _scan_string(p, &start, &end)
    if not (flags & F_ESCAPE):
        return _cached_str(p.s + start, end - start)
    n = _unescape(p, sink, start, end)
    return PyUnicode_DecodeUTF8(<const char*>sink.text, n, "strict")


cdef object _read_opt_string(Parser* p, _Sink sink, str expected):
    """A string or null (-> None) at p.pos; any other value fails with `expected`."""
    cdef unsigned char c = _peek(p)
    if c == b'"':
        return _read_string(p, sink)
    if c == b'n':
        _literal(p, b"null", 4)
        return None
    _wrong_type(p, expected)


cdef int _literal(Parser* p, const char* word, Py_ssize_t n) except -1:
    if p.pos + n > p.n or memcmp(p.s + p.pos, word, n) != 0:
        return _syntax(p, "a JSON value")
    p.pos += n
    return 0


cdef int _read_opt_bool(Parser* p) except -1:
    """true -> 1, false or null -> 0."""
    cdef unsigned char c = _peek(p)
    if c == b't':
        _literal(p, b"true", 4)
        return 1
    if c == b'f':
        _literal(p, b"false", 5)
        return 0
    if c == b'n':
        _literal(p, b"null", 4)
        return 0
    return _wrong_type(p, "true or false")


cdef enum:
    NUM_INT = 0        # integer within int64
    NUM_OVERFLOW = 1   # integer outside int64
    NUM_REAL = 2       # fraction or exponent


cdef int _scan_number(Parser* p, int64_t* value) except -1:
    """Validate the JSON number at p.pos (strict grammar), move past it; return NUM_*; set value for NUM_INT."""
    cdef const unsigned char* s = p.s
    cdef Py_ssize_t n = p.n
    cdef Py_ssize_t i = p.pos
    cdef bint negative = False, overflow = False, real = False
    cdef uint64_t mag = 0
    cdef unsigned char c
    if i < n and s[i] == b'-':
        negative = True
        i += 1
    if i >= n or not (b'0' <= s[i] <= b'9'):
        p.pos = i
        return _syntax(p, "a digit")
    if s[i] == b'0':
        i += 1
    else:
        while i < n and b'0' <= s[i] <= b'9':
            c = s[i] - 48
            if mag > (9223372036854775808ULL - c) // 10:
                overflow = True
            else:
                mag = mag * 10 + c
            i += 1
    if i < n and s[i] == b'.':
        real = True
        i += 1
        if i >= n or not (b'0' <= s[i] <= b'9'):
            p.pos = i
            return _syntax(p, "a digit")
        while i < n and b'0' <= s[i] <= b'9':
            i += 1
    if i < n and (s[i] == b'e' or s[i] == b'E'):
        real = True
        i += 1
        if i < n and (s[i] == b'+' or s[i] == b'-'):
            i += 1
        if i >= n or not (b'0' <= s[i] <= b'9'):
            p.pos = i
            return _syntax(p, "a digit")
        while i < n and b'0' <= s[i] <= b'9':
            i += 1
    p.pos = i
    if real:
        return NUM_REAL
    if overflow or (not negative and mag > 9223372036854775807ULL):
        return NUM_OVERFLOW
    # negate in uint64 (defined, wraps): -<int64_t>mag overflows for 2**63 (INT64_MIN), UB without -fwrapv
    value[0] = <int64_t>((<uint64_t>0) - mag) if negative else <int64_t>mag
    return NUM_INT


cdef int _digits(const unsigned char* s, Py_ssize_t n, int64_t* value) noexcept:
    """A numeric string '-?[0-9]+' -> NUM_INT/NUM_OVERFLOW with value; -1 if not numeric."""
    cdef Py_ssize_t i = 0
    cdef bint negative = False, overflow = False
    cdef uint64_t mag = 0
    cdef unsigned char c
    if n > 0 and s[0] == b'-':
        negative = True
        i = 1
    if i >= n:
        return -1
    while i < n:
        c = s[i]
        if not (b'0' <= c <= b'9'):
            return -1
        c -= 48
        if mag > (9223372036854775808ULL - c) // 10:
            overflow = True
        else:
            mag = mag * 10 + c
        i += 1
    if overflow or (not negative and mag > 9223372036854775807ULL):
        return NUM_OVERFLOW
    # negate in uint64 (defined, wraps): -<int64_t>mag overflows for 2**63 (INT64_MIN), UB without -fwrapv
    value[0] = <int64_t>((<uint64_t>0) - mag) if negative else <int64_t>mag
    return NUM_INT


cdef int64_t _read_int(Parser* p, _Sink sink, int64_t lo, int64_t hi, str what, bint numeric_string) except? -1:
    """A JSON integer (or, if allowed, a numeric string) within [lo, hi] at p.pos."""
    cdef Py_ssize_t at = p.pos, start, end, n
    cdef int64_t value = 0
    cdef int kind = NUM_INT, flags
    cdef unsigned char c = _peek(p)
    if c == b'-' or (b'0' <= c <= b'9'):
        kind = _scan_number(p, &value)
        if kind == NUM_REAL:
            _fail(p, at, "expected an integer, got a number with a fraction or exponent")
    elif c == b'"' and numeric_string:
        flags = _scan_string(p, &start, &end)
        if flags & F_ESCAPE:
            n = _unescape(p, sink, start, end)
            kind = _digits(sink.text, n, &value)
        else:
            kind = _digits(p.s + start, end - start, &value)
        if kind < 0:
            _fail(p, at, "expected an integer, got a non-numeric string")
    else:
        _wrong_type(p, "an integer or numeric string" if numeric_string else "an integer")
    if kind == NUM_OVERFLOW or value < lo or value > hi:
        _fail(p, at, f"out of {what} range")
    return value


cdef int _read_enum(Parser* p, _Sink sink, tuple names) except -2:
    """An enum by name or ordinal at p.pos -> ordinal, or -1 for null/unknown."""
    cdef Py_ssize_t at = p.pos, start, end, n, i
    cdef const unsigned char* text
    cdef int flags, kind
    cdef int64_t value = 0
    cdef unsigned char c = _peek(p)
    if c == b'"':
        flags = _scan_string(p, &start, &end)
        if flags & F_ESCAPE:
            n = _unescape(p, sink, start, end)
            text = sink.text
        else:
            n = end - start
            text = p.s + start
        for i in range(len(names)):
            name = <bytes>names[i]
            if PyBytes_GET_SIZE(name) == n and memcmp(PyBytes_AS_STRING(name), text, n) == 0:
                return <int>i
        return -1
    if c == b'-' or (b'0' <= c <= b'9'):
        kind = _scan_number(p, &value)
        if kind == NUM_REAL:
            return _fail(p, at, "expected an enum name or ordinal, got a number with a fraction or exponent")
        if kind == NUM_OVERFLOW or value < INT32_MIN_ or value > INT32_MAX_:
            return _fail(p, at, "out of int32 range")
        return <int>value if 0 <= value < len(names) else -1
    if c == b'n':
        _literal(p, b"null", 4)
        return -1
    return _wrong_type(p, "an enum name or ordinal")


cdef int _skip_value(Parser* p) except -1:
    """Validate and skip any JSON value at p.pos (unknown keys), bounded by C_MAX_DEPTH."""
    cdef Py_ssize_t start, end
    cdef int64_t value
    cdef unsigned char c = _peek(p)
    if c == b'"':
        _scan_string(p, &start, &end)
    elif c == b'{':
        _enter(p)
        p.pos += 1
        _ws(p)
        if _peek(p) == b'}':
            p.pos += 1
        else:
            while True:
                if _peek(p) != b'"':
                    return _syntax(p, "a string key")
                _scan_string(p, &start, &end)
                _colon(p)
                _skip_value(p)
                if _next(p, b'}'):
                    break
        p.depth -= 1
    elif c == b'[':
        _enter(p)
        p.pos += 1
        _ws(p)
        if _peek(p) == b']':
            p.pos += 1
        else:
            while True:
                _skip_value(p)
                if _next(p, b']'):
                    break
        p.depth -= 1
    elif c == b't':
        _literal(p, b"true", 4)
    elif c == b'f':
        _literal(p, b"false", 5)
    elif c == b'n':
        _literal(p, b"null", 4)
    elif c == b'-' or (b'0' <= c <= b'9'):
        _scan_number(p, &value)
    else:
        return _syntax(p, "a JSON value")
    return 0


cdef inline int _count(Parser* p) except -1:
    """One decoded element (at its start, its index on the path), against the body's budget (the twin's count)."""
    p.elements += 1
    if p.elements > p.max_elements:
        return _fail(p, p.pos, _too_many(p.max_elements))
    return 0


cdef Py_ssize_t _limit(object max_elements) except -1:
    """decode_heartbeat's max_elements as a C size (TypeError / ValueError exactly as the twin)."""
    if max_elements is _DEFAULT_MAX_ELEMENTS:
        return C_DEFAULT_MAX_ELEMENTS
    if type(max_elements) is int and 0 < max_elements < (1 << 62):   # the broker's property: no Python call
        return max_elements
    max_elements = _max_elements(max_elements)
    return min(max_elements, 1 << 62)   # no body has that many: the same as no limit


cdef inline int _enter(Parser* p) except -1:
    p.depth += 1
    if p.depth > C_MAX_DEPTH:
        return _fail(p, p.pos, f"nesting deeper than {C_MAX_DEPTH}")
    return 0


cdef inline int _colon(Parser* p) except -1:
    """After a key: whitespace, ':', whitespace."""
    _ws(p)
    if _peek(p) != b':':
        return _syntax(p, "':'")
    p.pos += 1
    _ws(p)
    return 0


cdef inline int _next(Parser* p, unsigned char close) except -1:
    """After a value: whitespace, then ',' (-> 0, positioned at the next item) or `close` (-> 1, consumed)."""
    cdef unsigned char c
    _ws(p)
    c = _peek(p)
    if c == b',':
        p.pos += 1
        _ws(p)
        return 0
    if c == close:
        p.pos += 1
        return 1
    return _syntax(p, "',' or '}'" if close == b'}' else "',' or ']'")


cdef int _open(Parser* p, unsigned char opener, str expected) except -1:
    """At an object/array start (or null for arrays): 1 = opened and non-empty, 0 = empty or null."""
    cdef unsigned char c = _peek(p)
    if c != opener:
        if c == b'n' and opener == b'[':
            _literal(p, b"null", 4)
            return 0
        return _wrong_type(p, expected)
    cdef unsigned char closer = b'}' if opener == b'{' else b']'
    _enter(p)
    p.pos += 1
    _ws(p)
    if _peek(p) == closer:
        p.pos += 1
        p.depth -= 1
        return 0
    return 1


cdef Py_ssize_t _key(Parser* p, _Sink sink, const unsigned char** key) except -2:
    """The key at p.pos (then ':' consumed): its bytes (unescaped into sink.text if needed) and length, or -1
    when it cannot be a known key. The raw span stays in p.raw_key/p.raw_key_len for error paths."""
    cdef Py_ssize_t start, end, n
    cdef int flags
    if _peek(p) != b'"':
        _syntax(p, "a string key")
    flags = _scan_string(p, &start, &end)
    p.raw_key = p.s + start
    p.raw_key_len = end - start
    _colon(p)
    if flags & F_ESCAPE:
        if end - start > KEY_MAX * 6:
            key[0] = p.s + start
            return -1
        n = _unescape(p, sink, start, end)
        key[0] = sink.text   # read after _unescape: it may move sink.text
        return n
    key[0] = p.s + start
    return end - start


cdef inline bint _is(const unsigned char* key, Py_ssize_t n, const char* name, Py_ssize_t name_len) noexcept:
    # the length argument is the literal's, a constant after inlining, so the compiler inlines the compare
    return n == name_len and memcmp(key, name, <size_t>name_len) == 0


cdef int _parse_tags(Parser* p, _Sink sink, PyObject** slot) except -1:
    """tagsSet: array of strings (or null) -> tuple stored in slot."""
    cdef Py_ssize_t count = 0, i
    cdef PyObject** scratch
    cdef object tup
    if _open(p, b'[', "an array"):
        _push_index(p)
        try:
            while True:
                _set_index(p, count)
                _count(p)
                if _peek(p) != b'"':
                    _wrong_type(p, "a string")
                item = _read_string(p, sink)
                if count == sink.cap_scratch:
                    sink.scratch = <PyObject**>_grow(sink.scratch, &sink.cap_scratch, sizeof(PyObject*))
                Py_INCREF(item)
                sink.scratch[count] = <PyObject*>item
                count += 1
                if _next(p, b']'):
                    break
        except BaseException:
            for i in range(count):
                Py_DECREF(<object>sink.scratch[i])
            raise
        _pop(p)
        p.depth -= 1
        tup = PyTuple_New(count)
        for i in range(count):
            PyTuple_SET_ITEM(tup, i, <object>sink.scratch[i])   # steals the reference taken above
    else:
        tup = _EMPTY
    _put(slot, tup)
    return 0


cdef int _parse_codes(Parser* p, _Sink sink, PyObject** slot) except -1:
    """codeSet: array of int32 numbers or numeric strings (or null) -> tuple of int stored in slot."""
    cdef Py_ssize_t count = 0, i
    cdef int32_t v
    cdef object tup
    if _open(p, b'[', "an array"):
        _push_index(p)
        while True:
            _set_index(p, count)
            _count(p)
            v = <int32_t>_read_int(p, sink, INT32_MIN_, INT32_MAX_, "int32", True)
            if count == sink.cap_iscratch:
                sink.iscratch = <int32_t*>_grow(sink.iscratch, &sink.cap_iscratch, sizeof(int32_t))
            sink.iscratch[count] = v
            count += 1
            if _next(p, b']'):
                break
        _pop(p)
        p.depth -= 1
        tup = PyTuple_New(count)
        for i in range(count):
            item = PyLong_FromLong(sink.iscratch[i])
            Py_INCREF(item)
            PyTuple_SET_ITEM(tup, i, item)
    else:
        tup = _EMPTY
    _put(slot, tup)
    return 0


cdef int _parse_subscription(Parser* p, _Sink sink, int32_t consumer) except -1:
    cdef Py_ssize_t index = sink.ns
    cdef const unsigned char* key
    cdef Py_ssize_t n
    cdef SubRec* r
    _count(p)
    sink.add_sub(consumer, p.row)
    if _open(p, b'{', "an object"):
        while True:
            n = _key(p, sink, &key)
            r = &sink.subs[index]   # re-read: nothing below grows sink.subs, but keep it obviously safe
            if _is(key, n, "topic", 5):
                _push_key(p, "topic", 5)
                _put(&r.topic, _read_opt_string(p, sink, "a string"))
            elif _is(key, n, "subString", 9):
                _push_key(p, "subString", 9)
                _put(&r.sub_string, _read_opt_string(p, sink, "a string"))
            elif _is(key, n, "tagsSet", 7):
                _push_key(p, "tagsSet", 7)
                _parse_tags(p, sink, &r.tags)
            elif _is(key, n, "codeSet", 7):
                _push_key(p, "codeSet", 7)
                _parse_codes(p, sink, &r.codes)
            elif _is(key, n, "subVersion", 10):
                _push_key(p, "subVersion", 10)
                if _peek(p) == b'n':
                    _literal(p, b"null", 4)
                    r.has_version = False
                else:
                    r.sub_version = _read_int(p, sink, INT64_MIN_, INT64_MAX_, "int64", True)
                    r.has_version = True
            elif _is(key, n, "expressionType", 14):
                _push_key(p, "expressionType", 14)
                _put(&r.expression_type, _read_opt_string(p, sink, "a string"))
            elif _is(key, n, "classFilterMode", 15):
                _push_key(p, "classFilterMode", 15)
                r.class_filter_mode = _read_opt_bool(p)
            else:
                _push_key(p, <const char*>p.raw_key, p.raw_key_len)
                _skip_value(p)
            _pop(p)
            if _next(p, b'}'):
                break
        p.depth -= 1
    r = &sink.subs[index]
    if not r.has_version:
        if p.now_ms < 0:
            p.now_ms = time.time_ns() // 1000000
        r.sub_version = p.now_ms
    return 0


cdef int _parse_consumer(Parser* p, _Sink sink) except -1:
    cdef Py_ssize_t index = sink.nc, count
    cdef const unsigned char* key
    cdef Py_ssize_t n
    cdef ConsRec* r
    _count(p)
    sink.add_cons(p.row)
    if _open(p, b'{', "an object"):
        while True:
            n = _key(p, sink, &key)
            r = &sink.cons[index]
            if _is(key, n, "groupName", 9):
                _push_key(p, "groupName", 9)
                _put(&r.group, _read_opt_string(p, sink, "a string"))
            elif _is(key, n, "consumeType", 11):
                _push_key(p, "consumeType", 11)
                r.consume_type = _read_enum(p, sink, _CONSUME_TYPE_NAMES)
            elif _is(key, n, "messageModel", 12):
                _push_key(p, "messageModel", 12)
                r.message_model = _read_enum(p, sink, _MESSAGE_MODEL_NAMES)
            elif _is(key, n, "consumeFromWhere", 16):
                _push_key(p, "consumeFromWhere", 16)
                r.consume_from_where = _read_enum(p, sink, _CONSUME_FROM_WHERE_NAMES)
            elif _is(key, n, "unitMode", 8):
                _push_key(p, "unitMode", 8)
                r.unit_mode = _read_opt_bool(p)
            elif _is(key, n, "subscriptionDataSet", 19):
                _push_key(p, "subscriptionDataSet", 19)
                sink.truncate_subs(r.first_sub)   # a repeated key replaces the earlier set
                count = 0
                if _open(p, b'[', "an array"):
                    _push_index(p)
                    while True:
                        _set_index(p, count)
                        _parse_subscription(p, sink, <int32_t>index)
                        count += 1
                        if _next(p, b']'):
                            break
                    _pop(p)
                    p.depth -= 1
                sink.cons[index].n_subs = <int32_t>count
            else:
                _push_key(p, <const char*>p.raw_key, p.raw_key_len)
                _skip_value(p)
            _pop(p)
            if _next(p, b'}'):
                break
        p.depth -= 1
    return 0


cdef int _parse_producer(Parser* p, _Sink sink) except -1:
    cdef Py_ssize_t index = sink.np_
    cdef const unsigned char* key
    cdef Py_ssize_t n
    _count(p)
    sink.add_prod(p.row)
    if _open(p, b'{', "an object"):
        while True:
            n = _key(p, sink, &key)
            if _is(key, n, "groupName", 9):
                _push_key(p, "groupName", 9)
                _put(&sink.prods[index].group, _read_opt_string(p, sink, "a string"))
            else:
                _push_key(p, <const char*>p.raw_key, p.raw_key_len)
                _skip_value(p)
            _pop(p)
            if _next(p, b'}'):
                break
        p.depth -= 1
    return 0


cdef struct Top:
    PyObject* client_id   # owned or NULL
    Py_ssize_t first_prod
    Py_ssize_t first_cons
    Py_ssize_t first_sub
    int32_t fingerprint
    bint without_sub


cdef int _parse_heartbeat(Parser* p, _Sink sink, Top* top) except -1:
    """The whole body: one top-level object, then only whitespace. Records go to sink, the rest to top."""
    cdef const unsigned char* key
    cdef Py_ssize_t n, count
    top.first_prod = sink.np_
    top.first_cons = sink.nc
    top.first_sub = sink.ns
    _ws(p)
    if p.pos >= p.n:
        return _fail(p, p.pos, "malformed JSON: empty body")
    if _open(p, b'{', "an object"):
        while True:
            n = _key(p, sink, &key)
            if _is(key, n, "clientID", 8):
                _push_key(p, "clientID", 8)
                _put(&top.client_id, _read_opt_string(p, sink, "a string"))
            elif _is(key, n, "consumerDataSet", 15):
                _push_key(p, "consumerDataSet", 15)
                sink.truncate_subs(top.first_sub)   # a repeated key replaces the earlier set
                sink.truncate_cons(top.first_cons)
                count = 0
                if _open(p, b'[', "an array"):
                    _push_index(p)
                    while True:
                        _set_index(p, count)
                        _parse_consumer(p, sink)
                        count += 1
                        if _next(p, b']'):
                            break
                    _pop(p)
                    p.depth -= 1
            elif _is(key, n, "producerDataSet", 15):
                _push_key(p, "producerDataSet", 15)
                sink.truncate_prods(top.first_prod)
                count = 0
                if _open(p, b'[', "an array"):
                    _push_index(p)
                    while True:
                        _set_index(p, count)
                        _parse_producer(p, sink)
                        count += 1
                        if _next(p, b']'):
                            break
                    _pop(p)
                    p.depth -= 1
            elif _is(key, n, "heartbeatFingerprint", 20):
                _push_key(p, "heartbeatFingerprint", 20)
                if _peek(p) == b'n':
                    _literal(p, b"null", 4)
                    top.fingerprint = 0
                else:
                    top.fingerprint = <int32_t>_read_int(p, sink, INT32_MIN_, INT32_MAX_, "int32", False)
            elif _is(key, n, "withoutSub", 10) or _is(key, n, "isWithoutSub", 12):
                _push_key(p, <const char*>p.raw_key, p.raw_key_len)
                top.without_sub = _read_opt_bool(p)
            else:
                _push_key(p, <const char*>p.raw_key, p.raw_key_len)
                _skip_value(p)
            _pop(p)
            if _next(p, b'}'):
                break
        p.depth -= 1
    _ws(p)
    if p.pos != p.n:
        return _fail(p, p.pos, "malformed JSON: trailing data after the object")
    return 0


cdef inline void _init_parser(Parser* p, const unsigned char* s, Py_ssize_t n, int32_t row,
                              Py_ssize_t max_elements) noexcept:
    p.elements = 0
    p.max_elements = max_elements
    p.s = s
    p.n = n
    p.pos = 0
    p.depth = 0
    p.plen = 0
    p.now_ms = -1
    p.row = row


cdef int _get_buffer(object body, Py_buffer* view) except -1:
    if not PyObject_CheckBuffer(body):
        raise TypeError(f"expected a bytes-like body, got {type(body).__name__}")
    try:
        PyObject_GetBuffer(body, view, PyBUF_SIMPLE)
    except Exception:
        raise TypeError(f"expected a bytes-like body, got a non-contiguous {type(body).__name__}") from None
    return 0


cdef int _parse_body(object body, Parser* p, _Sink sink, Top* top, int32_t row, Py_ssize_t max_elements) except -1:
    """Parse one body (bytes fast path, else the buffer protocol) into sink/top."""
    cdef Py_buffer view
    if type(body) is bytes:
        _init_parser(p, <const unsigned char*>PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), row, max_elements)
        return _parse_heartbeat(p, sink, top)
    _get_buffer(body, &view)
    try:
        _init_parser(p, <const unsigned char*>view.buf, view.len, row, max_elements)
        _parse_heartbeat(p, sink, top)
    finally:
        PyBuffer_Release(&view)
    return 0


cdef inline object _enum_member(tuple members, int8_t ordinal):
    return None if ordinal < 0 else members[ordinal]


cdef SubscriptionData _make_subscription(SubRec* r):
    cdef SubscriptionData s = SubscriptionData.__new__(SubscriptionData)
    s.topic = _get(r.topic)
    s.sub_string = _get(r.sub_string)
    s.tags = _EMPTY if r.tags == NULL else <tuple>r.tags
    s.codes = _EMPTY if r.codes == NULL else <tuple>r.codes
    s.sub_version = r.sub_version
    s.expression_type = _TAG if r.expression_type == NULL else <object>r.expression_type
    s.class_filter_mode = r.class_filter_mode
    return s


cdef HeartbeatData _build(_Sink sink, Top* top):
    """Model objects from the records of one body (all of the sink's records from top.first_*)."""
    cdef Py_ssize_t i, j, np_ = sink.np_ - top.first_prod, nc = sink.nc - top.first_cons
    cdef ConsRec* cr
    cdef ProducerData pd
    cdef ConsumerData cd
    cdef HeartbeatData hb = HeartbeatData.__new__(HeartbeatData)
    producers = PyTuple_New(np_)
    for i in range(np_):
        pd = ProducerData.__new__(ProducerData)
        pd.group = _get(sink.prods[top.first_prod + i].group)
        Py_INCREF(pd)
        PyTuple_SET_ITEM(producers, i, pd)
    consumers = PyTuple_New(nc)
    for i in range(nc):
        cr = &sink.cons[top.first_cons + i]
        cd = ConsumerData.__new__(ConsumerData)
        cd.group = _get(cr.group)
        cd.consume_type = _enum_member(_CONSUME_TYPES, cr.consume_type)
        cd.message_model = _enum_member(_MESSAGE_MODELS, cr.message_model)
        cd.consume_from_where = _enum_member(_CONSUME_FROM_WHERES, cr.consume_from_where)
        cd.unit_mode = cr.unit_mode
        subs = PyTuple_New(cr.n_subs)
        for j in range(cr.n_subs):
            sd = _make_subscription(&sink.subs[cr.first_sub + j])
            Py_INCREF(sd)
            PyTuple_SET_ITEM(subs, j, sd)
        cd.subscriptions = subs
        Py_INCREF(cd)
        PyTuple_SET_ITEM(consumers, i, cd)
    hb.client_id = _get(top.client_id)
    hb.producers = producers
    hb.consumers = consumers
    hb.fingerprint = top.fingerprint
    hb.without_sub = top.without_sub
    return hb


def decode_heartbeat(body, max_elements=DEFAULT_MAX_ELEMENTS):
    """A HEART_BEAT body (bytes-like, UTF-8 JSON in any client dialect) -> HeartbeatData.

    Raises HeartbeatError for a malformed body (the message names the JSON path and byte offset) or one of more than
    ``max_elements`` decoded elements, and TypeError when ``body`` is not a contiguous bytes-like object.
    """
    cdef Parser p
    cdef Top top
    cdef Py_ssize_t limit = _limit(max_elements)
    cdef _Sink sink = _acquire_sink()
    top.client_id = NULL
    top.fingerprint = 0
    top.without_sub = False
    try:
        _parse_body(body, &p, sink, &top, 0, limit)
        return _build(sink, &top)
    finally:
        Py_XDECREF(top.client_id)
        sink.truncate(0, 0, 0)
        sink.busy = False


# ==============================================================================================================
# Batch decoding into columns

cdef inline void _set_obj(cnp.ndarray arr, Py_ssize_t i, PyObject* value) noexcept:
    """arr[i] = value (NULL -> None) for a fresh object array (holding None)."""
    cdef PyObject** data = <PyObject**>cnp.PyArray_DATA(arr)
    cdef PyObject* old = data[i]
    if value == NULL:
        return
    Py_INCREF(<object>value)
    data[i] = value
    Py_XDECREF(old)


def decode_heartbeats(bodies, max_elements=DEFAULT_MAX_ELEMENTS):
    """Decode many bodies into columns (see engine.codec.heartbeat.HeartbeatBatch for the layout). Never raises for a bad
    row: it gets ok=False and its error message, and no child rows. ``max_elements`` bounds each body as in
    decode_heartbeat."""
    cdef Py_ssize_t limit = _limit(max_elements)
    cdef _Sink sink = _Sink()   # a private sink: its records become the columns
    cdef Parser p
    cdef Top top
    cdef Py_ssize_t rows = 0, cap = 0
    cdef Py_ssize_t base_p, base_c, base_s
    cdef list client_ids = [], errors = []
    cdef int32_t* ints = NULL           # per row: fingerprint, n_producers, n_consumers
    cdef unsigned char* flags = NULL    # per row: ok, without_sub
    cdef void* tmp
    try:
        for body in bodies:
            if rows == cap:
                cap = cap * 2 if cap else 64
                tmp = realloc(ints, <size_t>cap * 3 * sizeof(int32_t))
                if tmp == NULL:
                    raise MemoryError()
                ints = <int32_t*>tmp
                tmp = realloc(flags, <size_t>cap * 2)
                if tmp == NULL:
                    raise MemoryError()
                flags = <unsigned char*>tmp
            base_p, base_c, base_s = sink.np_, sink.nc, sink.ns
            top.client_id = NULL
            top.fingerprint = 0
            top.without_sub = False
            try:
                _parse_body(body, &p, sink, &top, <int32_t>rows, limit)
            except (HeartbeatError, TypeError) as e:
                sink.truncate(base_p, base_c, base_s)
                client_ids.append(None)
                errors.append(str(e))
                ints[3 * rows] = ints[3 * rows + 1] = ints[3 * rows + 2] = 0
                flags[2 * rows] = flags[2 * rows + 1] = 0
            else:
                client_ids.append(_get(top.client_id))
                errors.append(None)
                ints[3 * rows] = top.fingerprint
                ints[3 * rows + 1] = <int32_t>(sink.np_ - base_p)
                ints[3 * rows + 2] = <int32_t>(sink.nc - base_c)
                flags[2 * rows] = 1
                flags[2 * rows + 1] = top.without_sub
            finally:
                Py_XDECREF(top.client_id)
                top.client_id = NULL
            rows += 1
        return _columns(sink, rows, client_ids, errors, ints, flags)
    finally:
        free(ints)
        free(flags)


cdef object _columns(_Sink sink, Py_ssize_t rows, list client_ids, list errors, int32_t* ints,
                     unsigned char* flags):
    cdef Py_ssize_t i
    cdef cnp.npy_bool* b1
    cdef cnp.npy_bool* b2
    cdef int32_t* i1
    cdef int32_t* i2
    cdef int32_t* i3
    cdef int8_t* e1
    cdef int8_t* e2
    cdef int8_t* e3
    cdef int64_t* l1
    cdef SubRec* sr
    cdef ConsRec* cr

    heartbeats = {name: (np.empty(rows, dtype=object) if dtype is object else np.empty(rows, dtype=dtype))
                  for name, dtype in HEARTBEAT_COLUMNS}
    b1 = <cnp.npy_bool*>cnp.PyArray_DATA(heartbeats["ok"])
    b2 = <cnp.npy_bool*>cnp.PyArray_DATA(heartbeats["without_sub"])
    i1 = <int32_t*>cnp.PyArray_DATA(heartbeats["fingerprint"])
    i2 = <int32_t*>cnp.PyArray_DATA(heartbeats["n_producers"])
    i3 = <int32_t*>cnp.PyArray_DATA(heartbeats["n_consumers"])
    client_col = heartbeats["client_id"]
    error_col = heartbeats["error"]
    for i in range(rows):
        b1[i] = flags[2 * i]
        b2[i] = flags[2 * i + 1]
        i1[i] = ints[3 * i]
        i2[i] = ints[3 * i + 1]
        i3[i] = ints[3 * i + 2]
        client_id = client_ids[i]
        if client_id is not None:
            _set_obj(client_col, i, <PyObject*>client_id)
        error = errors[i]
        if error is not None:
            _set_obj(error_col, i, <PyObject*>error)

    producers = {name: (np.empty(sink.np_, dtype=object) if dtype is object else np.empty(sink.np_, dtype=dtype))
                 for name, dtype in PRODUCER_COLUMNS}
    i1 = <int32_t*>cnp.PyArray_DATA(producers["row"])
    group = producers["group"]
    for i in range(sink.np_):
        i1[i] = sink.prods[i].row
        _set_obj(group, i, sink.prods[i].group)

    consumers = {name: (np.empty(sink.nc, dtype=object) if dtype is object else np.empty(sink.nc, dtype=dtype))
                 for name, dtype in CONSUMER_COLUMNS}
    i1 = <int32_t*>cnp.PyArray_DATA(consumers["row"])
    i2 = <int32_t*>cnp.PyArray_DATA(consumers["n_subscriptions"])
    e1 = <int8_t*>cnp.PyArray_DATA(consumers["consume_type"])
    e2 = <int8_t*>cnp.PyArray_DATA(consumers["message_model"])
    e3 = <int8_t*>cnp.PyArray_DATA(consumers["consume_from_where"])
    b1 = <cnp.npy_bool*>cnp.PyArray_DATA(consumers["unit_mode"])
    group = consumers["group"]
    for i in range(sink.nc):
        cr = &sink.cons[i]
        i1[i] = cr.row
        i2[i] = cr.n_subs
        e1[i] = cr.consume_type
        e2[i] = cr.message_model
        e3[i] = cr.consume_from_where
        b1[i] = cr.unit_mode
        _set_obj(group, i, cr.group)

    subscriptions = {name: (np.empty(sink.ns, dtype=object) if dtype is object else np.empty(sink.ns, dtype=dtype))
                     for name, dtype in SUBSCRIPTION_COLUMNS}
    i1 = <int32_t*>cnp.PyArray_DATA(subscriptions["consumer"])
    i2 = <int32_t*>cnp.PyArray_DATA(subscriptions["row"])
    l1 = <int64_t*>cnp.PyArray_DATA(subscriptions["sub_version"])
    b1 = <cnp.npy_bool*>cnp.PyArray_DATA(subscriptions["class_filter_mode"])
    topic = subscriptions["topic"]
    sub_string = subscriptions["sub_string"]
    expression_type = subscriptions["expression_type"]
    tags = subscriptions["tags"]
    codes = subscriptions["codes"]
    for i in range(sink.ns):
        sr = &sink.subs[i]
        i1[i] = sr.consumer
        i2[i] = sr.row
        l1[i] = sr.sub_version
        b1[i] = sr.class_filter_mode
        _set_obj(topic, i, sr.topic)
        _set_obj(sub_string, i, sr.sub_string)
        _set_obj(expression_type, i, sr.expression_type if sr.expression_type != NULL else <PyObject*>_TAG)
        _set_obj(tags, i, sr.tags if sr.tags != NULL else <PyObject*>_EMPTY)
        _set_obj(codes, i, sr.codes if sr.codes != NULL else <PyObject*>_EMPTY)
    return HeartbeatBatch(heartbeats, producers, consumers, subscriptions)

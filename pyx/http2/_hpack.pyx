# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""RFC 7541 HPACK, the compiled build of ``engine.http2._hpack_py`` (the readable twin, which documents the rules).

Same inputs, outputs, table states and errors (the twin's ``HpackError``, word for word) as the twin, step by step.
What is native here: the block is read through a char pointer, integers, raw strings and the Huffman automaton
(the twin's 4-bit tables, copied into C arrays at import) run in C, and the dynamic table is a ring of (name, value)
tuples, so an indexed field costs a tuple reference and no copy.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

from engine.http2._hpack_py import (DEFAULT_MAX_HEADER_LIST_SIZE, DEFAULT_MAX_TABLE_SIZE, ENTRY_OVERHEAD,
                                    HUFFMAN_CODES, HUFFMAN_END, HUFFMAN_FSM, MAX_INTEGER, MAX_INTEGER_BYTES,
                                    NEVER_INDEXED, NOT_INDEXED, STATIC_TABLE, HpackError)

__all__ = ["HpackDecoder", "HpackEncoder", "HpackError"]

cdef int32_t FSM[4096]
cdef uint8_t END[256]
cdef uint32_t HCODE[257]
cdef uint8_t HLEN[257]
cdef Py_ssize_t _k
for _k in range(4096):
    FSM[_k] = HUFFMAN_FSM[_k]
for _k in range(256):
    END[_k] = HUFFMAN_END[_k]
for _k in range(257):
    HCODE[_k] = HUFFMAN_CODES[_k][0]
    HLEN[_k] = HUFFMAN_CODES[_k][1]

cdef tuple STATIC = STATIC_TABLE
cdef dict STATIC_FIELDS = {}
cdef dict STATIC_NAMES = {}
for _k in range(61):
    STATIC_FIELDS.setdefault(STATIC[_k], _k + 1)
    STATIC_NAMES.setdefault(STATIC[_k][0], _k + 1)
cdef enum:
    # what decode_unary reads of a field (its name and value, classified once, when the field enters the table)
    K_OTHER = 0
    K_PATH = 1
    K_METHOD_POST = 2
    K_METHOD_OTHER = 3
    K_CONTENT_GRPC = 4
    K_CONTENT_OTHER = 5
    K_TIMEOUT_OK = 6
    K_TIMEOUT_BAD = 7
    K_ENCODING_IDENTITY = 8
    K_ENCODING_OTHER = 9
    K_CLIENT_ID = 10


cdef inline bint _eq(const char* p, Py_ssize_t n, const char* lit, Py_ssize_t m) noexcept:
    return n == m and memcmp(p, lit, m) == 0


cdef unsigned char _kind_of(const char* p, Py_ssize_t n, const char* v, Py_ssize_t m) noexcept:
    """The kind of the field ``p[:n]: v[:m]`` for scan_unary (engine.http2._frames_py.scan_request_headers' rules,
    and the x-mq-client-id of header_value)."""
    cdef Py_ssize_t i
    cdef unsigned char u
    if _eq(p, n, b":path", 5):
        return K_PATH
    if _eq(p, n, b":method", 7):
        return K_METHOD_POST if _eq(v, m, b"POST", 4) else K_METHOD_OTHER
    if _eq(p, n, b"content-type", 12):
        return K_CONTENT_GRPC if m >= 16 and memcmp(v, b"application/grpc", 16) == 0 else K_CONTENT_OTHER
    if _eq(p, n, b"grpc-timeout", 12):  # 1-8 digits and a unit (parse_timeout)
        if not 2 <= m <= 9:
            return K_TIMEOUT_BAD
        u = v[m - 1]
        if u not in b"HMSmun":
            return K_TIMEOUT_BAD
        for i in range(m - 1):
            if not 48 <= <unsigned char>v[i] <= 57:
                return K_TIMEOUT_BAD
        return K_TIMEOUT_OK
    if _eq(p, n, b"grpc-encoding", 13):
        return K_ENCODING_IDENTITY if _eq(v, m, b"identity", 8) else K_ENCODING_OTHER
    if _eq(p, n, b"x-mq-client-id", 14):
        return K_CLIENT_ID
    return K_OTHER


cdef inline unsigned char _kind(bytes name, bytes value) noexcept:
    return _kind_of(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), PyBytes_AS_STRING(value),
                    PyBytes_GET_SIZE(value))


cdef Py_ssize_t STATIC_SIZE[61]
cdef unsigned char STATIC_KIND[61]
for _k in range(61):
    STATIC_SIZE[_k] = len(STATIC[_k][0]) + len(STATIC[_k][1]) + ENTRY_OVERHEAD
    STATIC_KIND[_k] = _kind(STATIC[_k][0], STATIC[_k][1])

#: one object per distinct header name (and :path value) decoded, shared by every connection's table: a repeated
#: call's name and path are then warm where they are read and hashed. Bounded: at most MAX_INTERNED strings of at
#: most MAX_INTERNED_LEN bytes (about 1.5 MiB); past it a string is kept as it came (only slower to read)
cdef dict INTERNED = {}
cdef Py_ssize_t MAX_INTERNED = 4096
cdef Py_ssize_t MAX_INTERNED_LEN = 256


cdef bytes _intern(bytes s):
    cdef object known = INTERNED.get(s)
    if known is not None:
        return <bytes>known
    if PyBytes_GET_SIZE(s) <= MAX_INTERNED_LEN and len(INTERNED) < MAX_INTERNED:
        INTERNED[s] = s
    return s


for _k in range(61):
    _intern(<bytes>STATIC[_k][0])

cdef frozenset NEVER = NEVER_INDEXED
cdef frozenset NOT_IDX = NOT_INDEXED
cdef Py_ssize_t OVERHEAD = ENTRY_OVERHEAD
cdef Py_ssize_t MAX_INT = MAX_INTEGER
cdef int MAX_INT_BYTES = MAX_INTEGER_BYTES
cdef enum:
    STACK = 512


cdef Py_ssize_t _read_int(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos, int prefix_bits) except -1:
    cdef Py_ssize_t limit = (1 << prefix_bits) - 1
    cdef Py_ssize_t start = pos[0]
    cdef Py_ssize_t i = start
    cdef Py_ssize_t value = p[i] & limit
    cdef int shift = 0, k
    cdef unsigned char b
    i += 1
    if value < limit:
        pos[0] = i
        return value
    for k in range(MAX_INT_BYTES):
        if i >= end:
            raise HpackError(f"hpack: integer cut short at byte {start}")
        b = p[i]
        i += 1
        value += (<Py_ssize_t>(b & 127)) << shift
        if value > MAX_INT:
            raise HpackError(f"hpack: integer over 2^31-1 at byte {start}")
        if not b & 128:
            pos[0] = i
            return value
        shift += 7
    raise HpackError(f"hpack: integer longer than {MAX_INT_BYTES + 1} bytes at byte {start}")


cdef bytes _huffman_decode(const unsigned char* s, Py_ssize_t n, Py_ssize_t start):
    cdef unsigned char stack[STACK]
    cdef unsigned char* buf = stack
    cdef Py_ssize_t cap = n * 8 // 5 + 1, k = 0, i
    cdef int32_t e
    cdef int state = 0, bad = 0
    cdef unsigned char b
    if cap > STACK:
        buf = <unsigned char*>malloc(cap)
        if buf == NULL:
            raise MemoryError()
    try:
        for i in range(n):
            b = s[i]
            e = FSM[(state << 4) | (b >> 4)]
            if e < 0:
                bad = 1
                break
            if e > 255:
                buf[k] = (e >> 8) - 1
                k += 1
            e = FSM[((e & 255) << 4) | (b & 15)]
            if e < 0:
                bad = 1
                break
            if e > 255:
                buf[k] = (e >> 8) - 1
                k += 1
            state = e & 255
        if bad:
            raise HpackError(f"hpack: EOS inside a Huffman string at byte {start}")
        if END[state]:
            raise HpackError(f"hpack: Huffman padding {'longer than 7 bits' if END[state] == 1 else 'not all ones'} "
                             f"at byte {start}")
        return PyBytes_FromStringAndSize(<char*>buf, k)
    finally:
        if buf != stack:
            free(buf)


cdef Py_ssize_t _string_span(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos) except -1:
    """The offset of the string literal's octets at ``p[pos]`` (RFC 7541 5.2); ``pos`` moves past them."""
    cdef Py_ssize_t at = pos[0], n, start
    if at >= end:
        raise HpackError(f"hpack: string missing at byte {at}")
    n = _read_int(p, end, pos, 7)
    start = pos[0]
    if n > end - start:
        raise HpackError(f"hpack: string of {n} bytes past the block's end at byte {at}")
    pos[0] = start + n
    return start


cdef bytes _read_string(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos):
    cdef Py_ssize_t at = pos[0]
    cdef Py_ssize_t start = _string_span(p, end, pos)
    if p[at] & 128:
        return _huffman_decode(p + start, pos[0] - start, at)
    return PyBytes_FromStringAndSize(<const char*>p + start, pos[0] - start)


cdef inline Py_ssize_t _entry_size(tuple entry):
    return PyBytes_GET_SIZE(<bytes>PyTuple_GET_ITEM(entry, 0)) + PyBytes_GET_SIZE(<bytes>PyTuple_GET_ITEM(entry, 1)) \
        + OVERHEAD


cdef class _Ring:
    """The dynamic table: (name, value) tuples in a growing ring of C structs, oldest at ``tail``; index 0 is the
    newest. Each slot keeps its tuple (a reference), the tuple's name and value (borrowed) and the entry's size and
    kind: scan_unary reads a repeated call's fields from the slots alone, without touching the tuples, which with
    thousands of connections are cold. (Its C layout: pyx/engine/http2/_hpack.pxd.)"""

    def __cinit__(self, Py_ssize_t limit):
        self.entries = <Entry*>PyMem_Malloc(8 * sizeof(Entry))
        if self.entries == NULL:
            raise MemoryError()
        self.cap = 8
        self.tail = self.count = self.size = 0
        self.limit = limit

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.entries != NULL:
            for i in range(self.count):
                Py_XDECREF(self.entries[(self.tail + i) % self.cap].field)
            PyMem_Free(self.entries)

    cdef Py_ssize_t slot(self, Py_ssize_t i) noexcept:
        return (self.tail + self.count - 1 - i) % self.cap

    cdef tuple get(self, Py_ssize_t i):
        return <tuple>self.entries[self.slot(i)].field

    cdef tuple pop_oldest(self):
        cdef Entry* e = &self.entries[self.tail]
        cdef tuple entry = <tuple>e.field
        Py_DECREF(entry)  # the slot's reference, now the local's
        e.field = NULL
        self.size -= e.size
        self.tail = (self.tail + 1) % self.cap
        self.count -= 1
        return entry

    cdef int push(self, tuple entry, Py_ssize_t size) except -1:
        cdef Entry* grown
        cdef Entry* e
        cdef Py_ssize_t i, cap = self.cap
        if self.count == cap:
            grown = <Entry*>PyMem_Malloc(2 * cap * sizeof(Entry))
            if grown == NULL:
                raise MemoryError()
            for i in range(self.count):
                grown[i] = self.entries[(self.tail + i) % cap]
            PyMem_Free(self.entries)
            self.entries, self.cap, self.tail = grown, 2 * cap, 0
        e = &self.entries[(self.tail + self.count) % self.cap]
        Py_INCREF(entry)
        e.field = <PyObject*>entry
        e.name = PyTuple_GET_ITEM(entry, 0)
        e.value = PyTuple_GET_ITEM(entry, 1)
        e.size = size
        e.kind = _kind(<bytes>e.name, <bytes>e.value)
        self.count += 1
        self.size += size
        return 0

    cdef list items(self):
        return [self.get(i) for i in range(self.count)]


cdef class HpackDecoder:
    """The decoding context of one connection (see the twin): its dynamic table lives across header blocks.

    ``decode`` makes the list of (name, value) tuples. ``scan_unary``, for the connection core's prepared path (C
    only; ``decode_unary`` is its Python face), reads a block without making that list: each field is recorded as the
    table's or the static table's tuple, unread, or as the offsets of a literal's strings, and only the :path and the
    client id are made objects; ``fields()`` makes the list afterwards when the call needs it. Entries evicted while
    such a record points at them are kept in ``_graves`` until ``release()``. (C layout: pyx/engine/http2/_hpack.pxd.)
    """

    def __cinit__(self, *args, **kwargs):
        self._lazy = NULL
        self._lazy_n = self._lazy_cap = 0
        self._graves = []
        self._block = self.path = self.client_id = None
        self._block_p = NULL
        self._block_n = 0

    def __dealloc__(self):
        PyMem_Free(self._lazy)

    def __init__(self, Py_ssize_t max_table_size=DEFAULT_MAX_TABLE_SIZE,
                 Py_ssize_t max_header_list_size=DEFAULT_MAX_HEADER_LIST_SIZE):
        if max_table_size < 0 or max_header_list_size < 0:
            raise ValueError("hpack: table and header list sizes must be >= 0")
        self.max_table_size = max_table_size
        self.max_header_list_size = max_header_list_size
        self._table = _Ring(max_table_size)

    @property
    def table_size_limit(self):
        return self._table.limit

    @property
    def table_size(self):
        return self._table.size

    @property
    def entries(self):
        """The dynamic table, newest first, as (name, value) pairs."""
        return self._table.items()

    cdef tuple _field(self, Py_ssize_t index, Py_ssize_t pos):
        if index == 0:
            raise HpackError(f"hpack: index 0 at byte {pos}")
        if index <= 61:
            return <tuple>STATIC[index - 1]
        if index - 62 >= self._table.count:
            raise HpackError(f"hpack: index {index} past the table ({61 + self._table.count} entries) at byte {pos}")
        return self._table.get(index - 62)

    cdef bytes _name(self, Py_ssize_t index, Py_ssize_t pos):
        """The name of field ``index`` (_field's errors), read from the static table or the slot."""
        if index == 0 or index - 62 >= self._table.count:
            self._field(index, pos)  # its error
        if index <= 61:
            return <bytes>PyTuple_GET_ITEM(STATIC[index - 1], 0)
        return <bytes>self._table.entries[self._table.slot(index - 62)].name

    cdef int _evict_to(self, Py_ssize_t size) except -1:
        """Evict the oldest entries until the table holds at most ``size`` bytes (kept alive while scanning)."""
        cdef _Ring t = self._table
        cdef tuple entry
        while t.size > size:
            entry = t.pop_oldest()
            if self._block is not None:
                self._graves.append(entry)
        return 0

    cdef int _add(self, tuple entry) except -1:
        cdef _Ring t = self._table
        cdef Py_ssize_t size = _entry_size(entry)
        if size > t.limit:
            self._evict_to(0)
            return 0
        self._evict_to(t.limit - size)
        t.push(entry, size)
        return 0

    def decode(self, block):
        """The (name, value) fields of one complete header block (HEADERS + CONTINUATION payloads joined)."""
        if not isinstance(block, bytes):
            block = bytes(block)
        cdef list out = []
        self._decode(<const unsigned char*>PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block), out, 0)
        return out

    def decode_unary(self, block, Py_ssize_t max_metadata):
        """``(fields, path, client_id)``: decode's fields; the :path when the list passes what a unary call's
        prepared path needs (engine.http2._frames_py.scan_request_headers' fields: a POST, a gRPC content-type, no
        grpc-encoding but identity, well-formed grpc-timeouts, its size within ``max_metadata``), else None; the first
        x-mq-client-id value (None without one). scan_unary, then fields()."""
        if not isinstance(block, bytes):
            block = bytes(block)
        self.scan_unary(block, <const unsigned char*>PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block), max_metadata)
        out = self.fields(), self.path, self.client_id
        self.release()
        return out

    cdef int scan_unary(self, object owner, const unsigned char* p, Py_ssize_t n, Py_ssize_t max_metadata) except -1:
        """Decode the block ``p[:n]`` (inside ``owner``, kept until release()) as decode does (the same table
        changes, the same errors), setting ``path`` and ``client_id`` as decode_unary returns them; its fields are
        recorded for fields()."""
        self.release()
        self._block, self._block_p, self._block_n = owner, p, n
        self._decode(p, n, None, max_metadata)
        return 0

    cdef list fields(self):
        """The last scanned block's fields, as decode returns them."""
        cdef list out = []
        cdef Lazy* f
        cdef Py_ssize_t k, pos
        for k in range(self._lazy_n):
            f = &self._lazy[k]
            if f.entry != NULL:
                out.append(<object>f.entry)
                continue
            pos = f.npos
            name = <object>f.name if f.name != NULL else _read_string(self._block_p, self._block_n, &pos)
            pos = f.vpos
            out.append((name, _read_string(self._block_p, self._block_n, &pos)))
        return out

    cdef void release(self):
        """Forget the last scan (its block, the entries it kept alive)."""
        self._lazy_n = 0
        self._block = self.path = self.client_id = None
        self._block_p = NULL
        if PyList_GET_SIZE(self._graves):
            del self._graves[:]

    cdef int _lazy_field(self, PyObject* entry, PyObject* name, Py_ssize_t npos, Py_ssize_t vpos) except -1:
        cdef Lazy* grown
        cdef Py_ssize_t cap
        if self._lazy_n == self._lazy_cap:
            cap = 16 if not self._lazy_cap else 2 * self._lazy_cap
            grown = <Lazy*>PyMem_Realloc(self._lazy, cap * sizeof(Lazy))
            if grown == NULL:
                raise MemoryError()
            self._lazy, self._lazy_cap = grown, cap
        self._lazy[self._lazy_n] = Lazy(entry, name, npos, vpos)
        self._lazy_n += 1
        return 0

    cdef int _decode(self, const unsigned char* p, Py_ssize_t end, list out, Py_ssize_t max_metadata) except -1:
        """decode's loop; ``out`` None: scan_unary's (fields recorded, path and client id set)."""
        cdef Py_ssize_t pos = 0, start, index, size, fsize, i, nfields = 0, nstart, vstart, nn, vn
        cdef Py_ssize_t list_size = 0, budget = self.max_header_list_size
        cdef tuple field
        cdef bytes name, value, held
        cdef const char* np
        cdef const char* vp
        cdef PyObject* entry
        cdef PyObject* value_p = NULL
        cdef Entry* e
        cdef PyObject* path = NULL
        cdef PyObject* client_id = NULL
        cdef unsigned char b, kind = K_OTHER, content = 0, encoding = 0
        cdef bint bad = False, lazy = out is None
        cdef _Ring t = self._table
        while pos < end:
            start = pos
            b = p[pos]
            if b & 128:
                index = _read_int(p, end, &pos, 7)
                if index == 0 or index - 62 >= t.count:
                    self._field(index, start)  # its error
                if index <= 61:
                    entry = PyTuple_GET_ITEM(STATIC, index - 1)
                    fsize, kind = STATIC_SIZE[index - 1], STATIC_KIND[index - 1]
                else:  # read from the slot: the tuple stays untouched
                    e = &t.entries[t.slot(index - 62)]
                    entry, fsize, kind = e.field, e.size, e.kind
                if lazy:
                    self._lazy_field(entry, NULL, 0, 0)
                    if kind == K_PATH or kind == K_CLIENT_ID:
                        value_p = e.value if index > 61 else PyTuple_GET_ITEM(<tuple>entry, 1)
                else:
                    out.append(<object>entry)
            elif (b & 0xE0) == 0x20:
                if nfields:
                    raise HpackError(f"hpack: table size update after a header field at byte {start}")
                size = _read_int(p, end, &pos, 5)
                if size > self.max_table_size:
                    raise HpackError(f"hpack: table size update to {size} over the limit {self.max_table_size} "
                                     f"at byte {start}")
                t.limit = size
                self._evict_to(size)
                continue
            else:
                index = _read_int(p, end, &pos, 6 if b & 64 else 4)
                if not lazy or b & 64:  # the field as a tuple (a new table entry)
                    if index:
                        name = self._name(index, start)
                    else:
                        name = _intern(_read_string(p, end, &pos))
                    value = _read_string(p, end, &pos)
                    field = (name, value)
                    fsize = PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + OVERHEAD
                    if lazy:
                        kind = _kind(name, value)
                        if kind == K_PATH:  # one object for every connection's path: warm where it is hashed
                            value = _intern(value)
                            field = (name, value)
                        self._graves.append(field)  # held while recorded (an entry too large for the table is not)
                        self._lazy_field(<PyObject*>field, NULL, 0, 0)
                        entry = <PyObject*>field
                        value_p = <PyObject*>value
                    else:
                        out.append(field)
                    if b & 64:
                        self._add(field)
                else:  # a literal not indexed, recorded by its strings' offsets: no tuple, no copy
                    held = None
                    if index:
                        name = self._name(index, start)  # held by its entry (or interned)
                        entry = <PyObject*>name
                        np, nn, nstart = PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), 0
                    else:
                        entry, nstart = NULL, pos
                        i = _string_span(p, end, &pos)
                        if p[nstart] & 128:
                            held = _huffman_decode(p + i, pos - i, nstart)
                            np, nn = PyBytes_AS_STRING(held), PyBytes_GET_SIZE(held)
                        else:
                            np, nn = <const char*>p + i, pos - i
                    vstart = pos
                    i = _string_span(p, end, &pos)
                    if p[vstart] & 128:
                        value = _huffman_decode(p + i, pos - i, vstart)
                        vp, vn = PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value)
                    else:
                        value = None
                        vp, vn = <const char*>p + i, pos - i
                    fsize = nn + vn + OVERHEAD
                    kind = _kind_of(np, nn, vp, vn)
                    self._lazy_field(NULL, entry, nstart, vstart)
                    if kind == K_PATH or kind == K_CLIENT_ID:  # wanted as an object: kept alive with the graves
                        if value is None:
                            value = PyBytes_FromStringAndSize(vp, vn)
                        if kind == K_PATH:
                            value = _intern(value)
                        self._graves.append(value)
                        entry = NULL
                        if kind == K_PATH:
                            path = <PyObject*>value
                        elif client_id == NULL:
                            client_id = <PyObject*>value
                        kind = K_OTHER
            nfields += 1
            list_size += fsize
            if list_size > budget:
                raise HpackError(f"hpack: header list over {budget} bytes at byte {start}")
            if lazy and kind:
                if kind == K_PATH:
                    path = value_p
                elif kind == K_CLIENT_ID:
                    if client_id == NULL:
                        client_id = value_p
                elif kind == K_METHOD_OTHER or kind == K_TIMEOUT_BAD:
                    bad = True
                elif kind == K_CONTENT_GRPC or kind == K_CONTENT_OTHER:
                    content = kind
                elif kind == K_ENCODING_IDENTITY or kind == K_ENCODING_OTHER:
                    encoding = kind
        if lazy:
            if client_id != NULL:
                self.client_id = <object>client_id
            if (path != NULL and not bad and list_size <= max_metadata and content == K_CONTENT_GRPC
                    and encoding != K_ENCODING_OTHER):
                self.path = <object>path
        return 0


cdef class _Out:
    """A growing output buffer."""
    cdef unsigned char* buf
    cdef Py_ssize_t n, cap

    def __cinit__(self):
        self.cap = 256
        self.n = 0
        self.buf = <unsigned char*>malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.buf)

    cdef int reserve(self, Py_ssize_t more) except -1:
        cdef unsigned char* grown
        cdef Py_ssize_t cap = self.cap
        if self.n + more <= cap:
            return 0
        while cap < self.n + more:
            cap *= 2
        grown = <unsigned char*>realloc(self.buf, cap)
        if grown == NULL:
            raise MemoryError()
        self.buf, self.cap = grown, cap
        return 0

    cdef int write_int(self, unsigned char first, int prefix_bits, Py_ssize_t value) except -1:
        cdef Py_ssize_t limit = (1 << prefix_bits) - 1
        self.reserve(11)
        if value < limit:
            self.buf[self.n] = first | value
            self.n += 1
            return 0
        self.buf[self.n] = first | limit
        self.n += 1
        value -= limit
        while value >= 128:
            self.buf[self.n] = (value & 127) | 128
            self.n += 1
            value >>= 7
        self.buf[self.n] = value
        self.n += 1
        return 0

    cdef int write_string(self, bytes data) except -1:
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data), i, bits = 0, hn
        cdef uint64_t acc = 0
        cdef int pending = 0
        for i in range(n):
            bits += HLEN[s[i]]
        hn = (bits + 7) >> 3
        if n and hn <= n:
            self.write_int(128, 7, hn)
            self.reserve(hn)
            for i in range(n):
                acc = (acc << HLEN[s[i]]) | HCODE[s[i]]
                pending += HLEN[s[i]]
                while pending >= 8:
                    pending -= 8
                    self.buf[self.n] = (acc >> pending) & 255
                    self.n += 1
                acc &= (<uint64_t>1 << pending) - 1
            if pending:
                self.buf[self.n] = ((acc << (8 - pending)) | ((1 << (8 - pending)) - 1)) & 255
                self.n += 1
        else:
            self.write_int(0, 7, n)
            self.reserve(n)
            memcpy(self.buf + self.n, s, n)
            self.n += n
        return 0


cdef class HpackEncoder:
    """The encoding context of one connection (see the twin for the indexing rules)."""
    cdef readonly Py_ssize_t max_table_size
    cdef _Ring _table
    cdef Py_ssize_t _inserted
    cdef dict _fields, _names
    cdef object _pending

    def __init__(self, Py_ssize_t max_table_size=DEFAULT_MAX_TABLE_SIZE):
        if max_table_size < 0:
            raise ValueError("hpack: table size must be >= 0")
        self.max_table_size = max_table_size
        self._table = _Ring(min(DEFAULT_MAX_TABLE_SIZE, max_table_size))
        self._inserted = 0
        self._fields = {}
        self._names = {}
        limit = self._table.limit
        self._pending = (limit, limit) if max_table_size < 4096 else None

    @property
    def table_size_limit(self):
        return self._table.limit

    @property
    def table_size(self):
        return self._table.size

    @property
    def entries(self):
        return self._table.items()

    def set_max_table_size(self, Py_ssize_t n):
        """The peer's SETTINGS_HEADER_TABLE_SIZE (see the twin)."""
        if n < 0:
            raise ValueError("hpack: table size must be >= 0")
        cdef Py_ssize_t size = min(n, self.max_table_size)
        if self._pending is None and size == self._table.limit:
            return
        low = size if self._pending is None else min(self._pending[0], size)
        self._pending = (low, size)
        self._table.limit = size
        self._evict(size)

    cdef void _evict(self, Py_ssize_t limit):
        cdef _Ring t = self._table
        cdef tuple entry
        cdef Py_ssize_t number
        while t.size > limit:
            number = self._inserted - t.count
            entry = t.pop_oldest()
            if self._fields.get(entry) == number:
                del self._fields[entry]
            if self._names.get(entry[0]) == number:
                del self._names[entry[0]]

    def encode(self, headers):
        """One header block for ``headers``, a sequence of (name, value) bytes pairs."""
        cdef _Out out = _Out()
        cdef object index, number
        cdef Py_ssize_t size, idx
        cdef tuple field
        if self._pending is not None:
            low, size = self._pending
            if low < size:
                out.write_int(32, 5, low)
            out.write_int(32, 5, size)
            self._pending = None
        for name, value in headers:
            if type(name) is not bytes or type(value) is not bytes:
                if not isinstance(name, bytes) or not isinstance(value, bytes):
                    raise TypeError("hpack: header names and values must be bytes")
                name, value = bytes(name), bytes(value)
            field = (name, value)
            index = STATIC_FIELDS.get(field)
            if index is not None:
                out.write_int(128, 7, index)
                continue
            number = self._fields.get(field)
            if number is not None:
                out.write_int(128, 7, 62 + self._inserted - 1 - <Py_ssize_t>number)
                continue
            index = STATIC_NAMES.get(name)
            if index is None:
                number = self._names.get(name)
                idx = 0 if number is None else 62 + self._inserted - 1 - <Py_ssize_t>number
            else:
                idx = index
            size = PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + OVERHEAD
            if name in NEVER:
                out.write_int(16, 4, idx)
            elif name in NOT_IDX or size > self._table.limit:
                out.write_int(0, 4, idx)
            else:
                out.write_int(64, 6, idx)
                self._evict(self._table.limit - size)
                self._table.push(field, size)
                self._fields[field] = self._names[name] = self._inserted
                self._inserted += 1
            if not idx:
                out.write_string(name)
            out.write_string(value)
        return PyBytes_FromStringAndSize(<char*>out.buf, out.n)

# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""RFC 7541 HPACK, the compiled build of ``engine.http2._hpack_py`` (the readable twin, which documents the rules).

Same inputs, outputs, table states and errors (the twin's ``HpackError``, word for word) as the twin, step by step.
What is native here: the block is read through a char pointer, integers, raw strings and the Huffman automaton
(the twin's 4-bit tables, copied into C arrays at import) run in C, and the dynamic table is a ring of (name, value)
tuples, so an indexed field costs a tuple reference and no copy.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyObject
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


cdef unsigned char _kind(bytes name, bytes value) noexcept:
    """The field's kind for decode_unary (engine.http2._frames_py.scan_request_headers' rules, and the
    x-mq-client-id of header_value)."""
    cdef const char* p = PyBytes_AS_STRING(name)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(name), m = PyBytes_GET_SIZE(value), i
    cdef const char* v = PyBytes_AS_STRING(value)
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


cdef struct _Scan:
    Py_ssize_t size
    PyObject* path  # borrowed: the fields' list holds them
    PyObject* client_id
    unsigned char content, encoding
    bint bad


cdef Py_ssize_t STATIC_SIZE[61]
cdef unsigned char STATIC_KIND[61]
for _k in range(61):
    STATIC_SIZE[_k] = len(STATIC[_k][0]) + len(STATIC[_k][1]) + ENTRY_OVERHEAD
    STATIC_KIND[_k] = _kind(STATIC[_k][0], STATIC[_k][1])

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


cdef bytes _read_string(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos):
    cdef Py_ssize_t at = pos[0], n, start
    if at >= end:
        raise HpackError(f"hpack: string missing at byte {at}")
    cdef bint huffman = p[at] & 128
    n = _read_int(p, end, pos, 7)
    start = pos[0]
    if n > end - start:
        raise HpackError(f"hpack: string of {n} bytes past the block's end at byte {at}")
    pos[0] = start + n
    if huffman:
        return _huffman_decode(p + start, n, at)
    return PyBytes_FromStringAndSize(<const char*>p + start, n)


cdef inline Py_ssize_t _entry_size(tuple entry):
    return PyBytes_GET_SIZE(<bytes>PyTuple_GET_ITEM(entry, 0)) + PyBytes_GET_SIZE(<bytes>PyTuple_GET_ITEM(entry, 1)) \
        + OVERHEAD


cdef class _Ring:
    """The dynamic table: (name, value) tuples in a growing ring, oldest at ``tail``; index 0 is the newest. Each
    slot's entry size and kind are kept beside it in C arrays: decode_unary reads them without touching the entry."""
    cdef list slots
    cdef Py_ssize_t* sizes
    cdef unsigned char* kinds
    cdef Py_ssize_t cap, tail, count
    cdef public Py_ssize_t size, limit

    def __cinit__(self, Py_ssize_t limit):
        self.slots = [None] * 8
        self.cap = 8
        self.sizes = <Py_ssize_t*>malloc(8 * sizeof(Py_ssize_t))
        self.kinds = <unsigned char*>malloc(8)
        if self.sizes == NULL or self.kinds == NULL:
            raise MemoryError()
        self.tail = self.count = self.size = 0
        self.limit = limit

    def __dealloc__(self):
        free(self.sizes)
        free(self.kinds)

    cdef inline Py_ssize_t slot(self, Py_ssize_t i) noexcept:
        return (self.tail + self.count - 1 - i) % self.cap

    cdef inline tuple get(self, Py_ssize_t i):
        return <tuple>self.slots[self.slot(i)]

    cdef tuple pop_oldest(self):
        cdef tuple entry = <tuple>self.slots[self.tail]
        self.slots[self.tail] = None
        self.size -= self.sizes[self.tail]
        self.tail = (self.tail + 1) % self.cap
        self.count -= 1
        return entry

    cdef int push(self, tuple entry, Py_ssize_t size) except -1:
        cdef list grown
        cdef Py_ssize_t i, j, cap = self.cap
        cdef Py_ssize_t* sizes
        cdef unsigned char* kinds
        if self.count == cap:
            grown = [None] * (2 * cap)
            sizes = <Py_ssize_t*>malloc(2 * cap * sizeof(Py_ssize_t))
            kinds = <unsigned char*>malloc(2 * cap)
            if sizes == NULL or kinds == NULL:
                free(sizes)
                free(kinds)
                raise MemoryError()
            for i in range(self.count):
                j = (self.tail + i) % cap
                grown[i] = self.slots[j]
                sizes[i] = self.sizes[j]
                kinds[i] = self.kinds[j]
            free(self.sizes)
            free(self.kinds)
            self.slots, self.sizes, self.kinds, self.cap, self.tail = grown, sizes, kinds, 2 * cap, 0
        i = (self.tail + self.count) % self.cap
        self.slots[i] = entry
        self.sizes[i] = size
        self.kinds[i] = _kind(<bytes>PyTuple_GET_ITEM(entry, 0), <bytes>PyTuple_GET_ITEM(entry, 1))
        self.count += 1
        self.size += size
        return 0

    cdef void clear(self):
        while self.count:
            self.pop_oldest()

    cdef list items(self):
        return [self.get(i) for i in range(self.count)]


cdef class HpackDecoder:
    """The decoding context of one connection (see the twin): its dynamic table lives across header blocks."""
    cdef readonly Py_ssize_t max_table_size, max_header_list_size
    cdef _Ring _table

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

    cdef int _add(self, tuple entry) except -1:
        cdef _Ring t = self._table
        cdef Py_ssize_t size = _entry_size(entry)
        if size > t.limit:
            t.clear()
            return 0
        while t.size > t.limit - size:
            t.pop_oldest()
        t.push(entry, size)
        return 0

    def decode(self, block):
        """The (name, value) fields of one complete header block (HEADERS + CONTINUATION payloads joined)."""
        if not isinstance(block, bytes):
            block = bytes(block)
        cdef list out = []
        self._decode(<bytes>block, out, NULL)
        return out

    def decode_unary(self, block, Py_ssize_t max_metadata):
        """``(fields, path, client_id)``: decode's fields; the :path when the list passes what a unary call's
        prepared path needs (engine.http2._frames_py.scan_request_headers' fields: a POST, a gRPC content-type, no
        grpc-encoding but identity, well-formed grpc-timeouts, its size within ``max_metadata``), else None; the first
        x-mq-client-id value (None without one). Read from the sizes and kinds kept beside the table's entries."""
        if not isinstance(block, bytes):
            block = bytes(block)
        cdef list out = []
        cdef _Scan scan
        scan.size = 0
        scan.path = scan.client_id = NULL
        scan.content = scan.encoding = 0
        scan.bad = False
        self._decode(<bytes>block, out, &scan)
        path = client_id = None
        if scan.client_id != NULL:
            client_id = <object>scan.client_id
        if (scan.path != NULL and not scan.bad and scan.size <= max_metadata and scan.content == K_CONTENT_GRPC
                and scan.encoding != K_ENCODING_OTHER):
            path = <object>scan.path
        return out, path, client_id

    cdef int _decode(self, bytes data, list out, _Scan* scan) except -1:
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t end = PyBytes_GET_SIZE(data), pos = 0, start, index, size, fsize, i
        cdef Py_ssize_t list_size = 0, budget = self.max_header_list_size
        cdef tuple field
        cdef bytes name, value
        cdef unsigned char b, kind = K_OTHER
        cdef _Ring t = self._table
        while pos < end:
            start = pos
            b = p[pos]
            if b & 128:
                index = _read_int(p, end, &pos, 7)
                field = self._field(index, start)
                if index <= 61:
                    fsize, kind = STATIC_SIZE[index - 1], STATIC_KIND[index - 1]
                else:
                    i = t.slot(index - 62)
                    fsize, kind = t.sizes[i], t.kinds[i]
            elif (b & 0xE0) == 0x20:
                if PyList_GET_SIZE(out):
                    raise HpackError(f"hpack: table size update after a header field at byte {start}")
                size = _read_int(p, end, &pos, 5)
                if size > self.max_table_size:
                    raise HpackError(f"hpack: table size update to {size} over the limit {self.max_table_size} "
                                     f"at byte {start}")
                t.limit = size
                while t.size > size:
                    t.pop_oldest()
                continue
            else:
                index = _read_int(p, end, &pos, 6 if b & 64 else 4)
                if index:
                    name = <bytes>PyTuple_GET_ITEM(self._field(index, start), 0)
                else:
                    name = _read_string(p, end, &pos)
                value = _read_string(p, end, &pos)
                field = (name, value)
                fsize = PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + OVERHEAD
                if scan != NULL:
                    kind = _kind(name, value)
                if b & 64:
                    self._add(field)
            list_size += fsize
            if list_size > budget:
                raise HpackError(f"hpack: header list over {budget} bytes at byte {start}")
            out.append(field)
            if scan != NULL and kind:
                if kind == K_PATH:
                    scan.path = PyTuple_GET_ITEM(field, 1)
                elif kind == K_CLIENT_ID:
                    if scan.client_id == NULL:
                        scan.client_id = PyTuple_GET_ITEM(field, 1)
                elif kind == K_METHOD_OTHER or kind == K_TIMEOUT_BAD:
                    scan.bad = True
                elif kind == K_CONTENT_GRPC or kind == K_CONTENT_OTHER:
                    scan.content = kind
                elif kind == K_ENCODING_IDENTITY or kind == K_ENCODING_OTHER:
                    scan.encoding = kind
        if scan != NULL:
            scan.size = list_size
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

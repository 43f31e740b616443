# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""HTTP/2 frames and gRPC message framing, the compiled build of ``engine.http2._frames_py`` (the readable twin,
which documents the rules).

Same outputs and errors (the twin's ``FrameError``, code and message word for word) as the twin, however the bytes
are split. What is native here: frame headers and message prefixes are read through a char pointer, a partial frame
or message grows in place in a bytearray, and the serializers write header and payload into one new bytes. An
argument the wire format cannot carry (a negative or too large field) goes to the twin, which raises its error.
"""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from libc.string cimport memcmp, memcpy

from engine.http2 import _frames_py as _py
from engine.http2._frames_py import (CONTINUATION, DATA, DEFAULT_MAX_FRAME_SIZE, DEFAULT_WINDOW, FLAG_ACK,
                                     FLAG_END_HEADERS, FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY, GOAWAY,
                                     HEADERS, MAX_MAX_FRAME_SIZE, MAX_WINDOW, MESSAGE_COMPRESSED, MESSAGE_TOO_LARGE,
                                     PING, PREFACE, PRIORITY, PUSH_PROMISE, RST_STREAM, SETTINGS, WINDOW_UPDATE,
                                     RESERVED_HEADERS, FrameError)

__all__ = ["FrameReader", "MessageReader", "FrameError", "frame", "settings", "parse_settings", "ping", "goaway",
           "rst_stream", "window_update", "u32", "data_message", "unary_answer", "parse_timeout",
           "scan_request_headers", "invocation_metadata"]

cdef int _FRAME_SIZE_ERROR = _py.FRAME_SIZE_ERROR
cdef int _COMPRESSED = MESSAGE_COMPRESSED
cdef int _TOO_LARGE = MESSAGE_TOO_LARGE


cdef inline unsigned long _be32(const unsigned char* p) noexcept:
    return (<unsigned long>p[0] << 24) | (<unsigned long>p[1] << 16) | (<unsigned long>p[2] << 8) | p[3]


cdef inline void _put_head(unsigned char* p, Py_ssize_t n, int ftype, int flags, unsigned long sid) noexcept:
    p[0] = (n >> 16) & 0xFF
    p[1] = (n >> 8) & 0xFF
    p[2] = n & 0xFF
    p[3] = ftype
    p[4] = flags
    p[5] = (sid >> 24) & 0xFF
    p[6] = (sid >> 16) & 0xFF
    p[7] = (sid >> 8) & 0xFF
    p[8] = sid & 0xFF


cdef inline void _put_u32(unsigned char* p, unsigned long v) noexcept:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline bint _is_u8(object v):
    return type(v) is int and 0 <= v <= 0xFF


cdef inline bint _is_u32(object v):
    return type(v) is int and 0 <= v <= 0xFFFFFFFF


cdef class FrameReader:
    """Bytes in, frames out: ``feed(data)`` returns ``[(type, flags, stream_id, payload), ...]`` (payload: bytes)
    of the whole frames received so far; the rest is kept for the next call (at most one frame's worth)."""

    cdef public object max_frame_size
    cdef bytearray _buf

    def __init__(self, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    def feed(self, data):
        cdef bytearray kept = self._buf
        cdef object src
        cdef const unsigned char* p
        cdef Py_ssize_t pos = 0, end, length, stop
        cdef long long limit = self.max_frame_size
        cdef list out = []
        cdef bint in_kept = PyByteArray_GET_SIZE(kept) > 0
        if in_kept:
            kept += data
            p = <const unsigned char*>PyByteArray_AS_STRING(kept)
            end = PyByteArray_GET_SIZE(kept)
        else:
            src = data if type(data) is bytes else bytes(data)
            p = <const unsigned char*>PyBytes_AS_STRING(src)
            end = PyBytes_GET_SIZE(src)
        while end - pos >= 9:
            length = (<Py_ssize_t>p[pos] << 16) | (<Py_ssize_t>p[pos + 1] << 8) | p[pos + 2]
            if length > limit:
                PyByteArray_Resize(kept, 0)
                raise FrameError(_FRAME_SIZE_ERROR,
                                 f"frame of {length} bytes past SETTINGS_MAX_FRAME_SIZE {self.max_frame_size}")
            stop = pos + 9 + length
            if stop > end:
                break
            out.append((p[pos + 3], p[pos + 4], _be32(p + pos + 5) & 0x7FFFFFFF,
                        PyBytes_FromStringAndSize(<const char*>p + pos + 9, length)))
            pos = stop
        if in_kept:
            if pos >= end:
                PyByteArray_Resize(kept, 0)
            elif pos:
                del kept[:pos]
        elif pos < end:
            kept += (<const char*>p)[pos:end]
        return out

    @property
    def buffered(self):
        return PyByteArray_GET_SIZE(self._buf)


cdef class MessageReader:
    """gRPC's length-prefixed messages out of one stream's DATA payloads (see the twin)."""

    cdef public object max_message
    cdef public int error
    cdef public object error_length
    cdef bytearray _buf  # None until a message is split over payloads: an idle stream holds no buffer
    cdef Py_ssize_t _need
    cdef long long _length

    def __init__(self, max_message):
        self.max_message = max_message
        self.error = 0
        self.error_length = 0
        self._buf = None
        self._need = 5
        self._length = -1

    def feed(self, payload):
        cdef bytearray kept = self._buf
        cdef object src
        cdef const unsigned char* p
        cdef Py_ssize_t pos = 0, end, stop
        cdef long long length
        cdef list out = []
        cdef bint in_kept
        cdef long long limit
        if self.error:
            return out
        limit = self.max_message
        in_kept = kept is not None and PyByteArray_GET_SIZE(kept) > 0
        if in_kept:
            kept += payload
            p = <const unsigned char*>PyByteArray_AS_STRING(kept)
            end = PyByteArray_GET_SIZE(kept)
        else:
            src = payload if type(payload) is bytes else bytes(payload)
            p = <const unsigned char*>PyBytes_AS_STRING(src)
            end = PyBytes_GET_SIZE(src)
        while end - pos >= self._need:
            if self._length < 0:
                length = _be32(p + pos + 1)
                if p[pos]:
                    self.error = _COMPRESSED
                elif length > limit:
                    self.error = _TOO_LARGE
                if self.error:
                    self.error_length = length
                    self._buf = None
                    return out
                self._length = length
                self._need = 5 + <Py_ssize_t>length
                continue
            stop = pos + self._need
            out.append(PyBytes_FromStringAndSize(<const char*>p + pos + 5, self._need - 5))
            pos = stop
            self._need = 5
            self._length = -1
        if in_kept:
            if pos >= end:
                PyByteArray_Resize(kept, 0)
            elif pos:
                del kept[:pos]
        elif pos < end:
            if kept is None:
                kept = self._buf = bytearray()
            kept += (<const char*>p)[pos:end]
        return out

    @property
    def buffered(self):
        return 0 if self._buf is None else PyByteArray_GET_SIZE(self._buf)


cdef bytes _frame(int ftype, int flags, unsigned long sid, const char* payload, Py_ssize_t n):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 9 + n)
    cdef unsigned char* w = <unsigned char*>PyBytes_AS_STRING(out)
    _put_head(w, n, ftype, flags, sid)
    if n:
        memcpy(w + 9, payload, n)
    return out


def frame(ftype, flags, stream_id, payload=b""):
    if type(payload) is not bytes or not (_is_u8(ftype) and _is_u8(flags) and _is_u32(stream_id)) \
            or PyBytes_GET_SIZE(payload) > 0xFFFFFF:
        return _py.frame(ftype, flags, stream_id, payload)
    return _frame(ftype, flags, stream_id, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))


def settings(pairs=(), ack=False):
    cdef list items = list(pairs)
    cdef Py_ssize_t i, n = len(items)
    cdef bytes out
    cdef unsigned char* w
    cdef object k, v
    if n * 6 > 0xFFFFFF:
        return _py.settings(items, ack)
    for i in range(n):
        if type(items[i]) is not tuple or len(items[i]) != 2:
            return _py.settings(items, ack)
        k, v = items[i]
        if not (type(k) is int and 0 <= k <= 0xFFFF and _is_u32(v)):
            return _py.settings(items, ack)
    out = PyBytes_FromStringAndSize(NULL, 9 + 6 * n)
    w = <unsigned char*>PyBytes_AS_STRING(out)
    _put_head(w, 6 * n, 4, 1 if ack else 0, 0)
    for i in range(n):
        k, v = items[i]
        w[9 + 6 * i] = (<unsigned long>k >> 8) & 0xFF
        w[10 + 6 * i] = <unsigned long>k & 0xFF
        _put_u32(w + 11 + 6 * i, v)
    return out


def parse_settings(payload):
    """The (identifier, value) pairs of a SETTINGS payload (a length not a multiple of 6: FRAME_SIZE_ERROR)."""
    if type(payload) is not bytes:
        return _py.parse_settings(payload)
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(payload)
    if n % 6:
        raise FrameError(_FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
    return [((<unsigned int>p[i] << 8) | p[i + 1], _be32(p + i + 2)) for i in range(0, n, 6)]


def ping(data, ack=False):
    return frame(6, 1 if ack else 0, 0, data)


def goaway(last_stream_id, code, debug=b""):
    cdef bytes out
    cdef unsigned char* w
    cdef Py_ssize_t n
    if type(debug) is not bytes or type(last_stream_id) is not int or not _is_u32(code) \
            or PyBytes_GET_SIZE(debug) > 0xFFFFFF - 8:
        return _py.goaway(last_stream_id, code, debug)
    n = PyBytes_GET_SIZE(debug)
    out = PyBytes_FromStringAndSize(NULL, 17 + n)
    w = <unsigned char*>PyBytes_AS_STRING(out)
    _put_head(w, 8 + n, 7, 0, 0)
    _put_u32(w + 9, last_stream_id & 0x7FFFFFFF)
    _put_u32(w + 13, code)
    if n:
        memcpy(w + 17, PyBytes_AS_STRING(debug), n)
    return out


cdef bytes _u32_frame(int ftype, object stream_id, object value):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 13)
    cdef unsigned char* w = <unsigned char*>PyBytes_AS_STRING(out)
    _put_head(w, 4, ftype, 0, stream_id)
    _put_u32(w + 9, value)
    return out


def rst_stream(stream_id, code):
    if not (_is_u32(stream_id) and _is_u32(code)):
        return _py.rst_stream(stream_id, code)
    return _u32_frame(3, stream_id, code)


def window_update(stream_id, increment):
    if not (_is_u32(stream_id) and _is_u32(increment)):
        return _py.window_update(stream_id, increment)
    return _u32_frame(8, stream_id, increment)


def u32(payload, pos=0):
    cdef Py_ssize_t i
    if type(payload) is not bytes or type(pos) is not int or not 0 <= pos <= PyBytes_GET_SIZE(payload) - 4:
        return _py.u32(payload, pos)
    i = pos
    return _be32(<const unsigned char*>PyBytes_AS_STRING(payload) + i)


def data_message(stream_id, message):
    """One DATA frame carrying one gRPC message (its 5-byte prefix, uncompressed)."""
    cdef bytes out
    cdef unsigned char* w
    cdef Py_ssize_t n
    if type(message) is not bytes or not _is_u32(stream_id) or PyBytes_GET_SIZE(message) > 0xFFFFFF - 5:
        return _py.data_message(stream_id, message)
    n = PyBytes_GET_SIZE(message)
    out = PyBytes_FromStringAndSize(NULL, 14 + n)
    w = <unsigned char*>PyBytes_AS_STRING(out)
    _put_head(w, n + 5, 0, 0, stream_id)
    w[9] = 0
    _put_u32(w + 10, n)
    if n:
        memcpy(w + 14, PyBytes_AS_STRING(message), n)
    return out


def unary_answer(stream_id, headers_block, message, trailers_block, rst):
    """A unary call's whole answer in one bytes (see the twin)."""
    cdef bytes out
    cdef unsigned char* w
    cdef Py_ssize_t h, m, t, size
    cdef unsigned long sid
    if type(headers_block) is not bytes or type(message) is not bytes or type(trailers_block) is not bytes \
            or not _is_u32(stream_id) or PyBytes_GET_SIZE(headers_block) > 0xFFFFFF \
            or PyBytes_GET_SIZE(message) > 0xFFFFFF - 5 or PyBytes_GET_SIZE(trailers_block) > 0xFFFFFF:
        return _py.unary_answer(stream_id, headers_block, message, trailers_block, rst)
    sid = stream_id
    h, m, t = PyBytes_GET_SIZE(headers_block), PyBytes_GET_SIZE(message), PyBytes_GET_SIZE(trailers_block)
    size = 9 + h + 14 + m + 9 + t + (13 if rst else 0)
    out = PyBytes_FromStringAndSize(NULL, size)
    w = <unsigned char*>PyBytes_AS_STRING(out)
    _put_head(w, h, 1, 4, sid)
    memcpy(w + 9, PyBytes_AS_STRING(headers_block), h)
    w += 9 + h
    _put_head(w, m + 5, 0, 0, sid)
    w[9] = 0
    _put_u32(w + 10, m)
    memcpy(w + 14, PyBytes_AS_STRING(message), m)
    w += 14 + m
    _put_head(w, t, 1, 5, sid)
    memcpy(w + 9, PyBytes_AS_STRING(trailers_block), t)
    if rst:
        w += 9 + t
        _put_head(w, 4, 3, 0, sid)
        _put_u32(w + 9, 0)
    return out


# ---------------------------------------------------------------------------------------------------------------
# a gRPC call's request headers

cdef frozenset _RESERVED = RESERVED_HEADERS


cdef inline bint _is(const char* p, Py_ssize_t n, const char* lit, Py_ssize_t m) noexcept:
    return n == m and memcmp(p, lit, m) == 0


cdef object _timeout(const unsigned char* p, Py_ssize_t n):
    cdef double unit
    cdef long long v = 0
    cdef Py_ssize_t i
    cdef unsigned char c
    if n < 1:
        return None
    c = p[n - 1]
    if c == b'H':
        unit = 3600.0
    elif c == b'M':
        unit = 60.0
    elif c == b'S':
        unit = 1.0
    elif c == b'm':
        unit = 1e-3
    elif c == b'u':
        unit = 1e-6
    elif c == b'n':
        unit = 1e-9
    else:
        return None
    if not 0 < n - 1 <= 8:
        return None
    for i in range(n - 1):
        if not 48 <= p[i] <= 57:
            return None
        v = v * 10 + (p[i] - 48)
    return <double>v * unit


def parse_timeout(value):
    """grpc-timeout (1-8 digits and a unit) in seconds, or None when malformed."""
    if type(value) is not bytes:
        return _py.parse_timeout(value)
    return _timeout(<const unsigned char*>PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))


cdef inline bint _pair(object field):
    return type(field) is tuple and len(<tuple>field) == 2 and type((<tuple>field)[0]) is bytes \
        and type((<tuple>field)[1]) is bytes


cdef bint _all_pairs(object headers):
    """A list of (bytes, bytes) tuples: what the compiled readers take; anything else goes to the twin's code."""
    if type(headers) is not list:
        return False
    for field in <list>headers:
        if not _pair(field):
            return False
    return True


def scan_request_headers(headers):
    """``(size, path, content_type, encoding, timeout, bad)`` of a request's header list (see the twin)."""
    cdef Py_ssize_t size = 0, n, m
    cdef object path = None, content_type = None, encoding = None, timeout = None
    cdef bint bad = False
    cdef bytes name, value
    cdef const char* p
    if not _all_pairs(headers):
        return _py.scan_request_headers(headers)
    for field in <list>headers:
        name = (<tuple>field)[0]
        value = (<tuple>field)[1]
        n = PyBytes_GET_SIZE(name)
        m = PyBytes_GET_SIZE(value)
        size += n + m + 32
        p = PyBytes_AS_STRING(name)
        if n < 5:
            continue
        if p[0] == b':':
            if _is(p, n, b":path", 5):
                path = value
            elif _is(p, n, b":method", 7):
                bad |= not _is(PyBytes_AS_STRING(value), m, b"POST", 4)
        elif _is(p, n, b"content-type", 12):
            content_type = value
        elif _is(p, n, b"grpc-timeout", 12):
            timeout = _timeout(<const unsigned char*>PyBytes_AS_STRING(value), m)
            bad |= timeout is None
        elif _is(p, n, b"grpc-encoding", 13):
            encoding = value
    return size, path, content_type, encoding, timeout, bad


def invocation_metadata(headers):
    """grpc's invocation metadata of a request (see the twin)."""
    cdef list md = []
    cdef bytes name, value
    cdef const char* p
    cdef Py_ssize_t n
    if not _all_pairs(headers):
        return _py.invocation_metadata(headers)
    for field in <list>headers:
        name = (<tuple>field)[0]
        value = (<tuple>field)[1]
        n = PyBytes_GET_SIZE(name)
        p = PyBytes_AS_STRING(name)
        if (n and p[0] == b':') or name in _RESERVED:
            continue
        if n >= 4 and memcmp(p + n - 4, b"-bin", 4) == 0:
            md.extend(_py.invocation_metadata([field]))  # base64: rare, the twin's code
            continue
        md.append((PyUnicode_DecodeASCII(p, n, "replace"),
                   PyUnicode_DecodeUTF8(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), "replace")))
    return tuple(md)

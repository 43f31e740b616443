# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native RocketMQ remoting frame codec (PROTOCOL.md 1 and 2): RemotingCommand, FrameDecoder, decode_frame.

Twin and reference: engine/codec/_frame_py.py. This module follows it step by step and gives the same results and the
same errors, messages included. It works on ``const unsigned char*`` with an explicit bound on every read:
boundscheck/wraparound are off for the whole module, so every pointer read ``s[i]`` is preceded by a check
``i < end`` (or a length check covering it) where ``end`` is within the buffer the pointer came from, and every
tuple index is checked against the tuple's length (or runs over ``range(len(...))``). Cold paths (field
normalization and its errors, repr, lone-surrogate encoding) call the twin so that messages cannot drift.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcmp, memcpy, memmove

from engine.codec import _frame_py as _twin
from engine.codec.enums import (
    BROKER_VERSION,
    DEFAULT_MAX_FRAME_SIZE,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_BY_NAME,
    MAX_EXT_FIELDS,
    LanguageCode,
)
from engine.codec.errors import MAX_ECHO, FrameError, echo

__all__ = ["RemotingCommand", "FrameDecoder", "decode_frame", "AnswerTemplate", "body_digest"]


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    object PyUnicode_FromOrdinal(int ordinal)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1


MAX_JSON_DEPTH = _twin.MAX_JSON_DEPTH
MAX_HEADER_LENGTH = _twin.MAX_HEADER_LENGTH
ROCKETMQ_FIXED_LENGTH = _twin.ROCKETMQ_FIXED_LENGTH

cdef int C_MAX_JSON_DEPTH = MAX_JSON_DEPTH
cdef Py_ssize_t C_MAX_EXT_FIELDS = MAX_EXT_FIELDS
cdef Py_ssize_t C_MAX_ECHO = MAX_ECHO
cdef long long C_DEFAULT_MAX_FRAME_SIZE = DEFAULT_MAX_FRAME_SIZE
# Any limit above this equals "no limit": total_length is an int32, so total_length + 4 <= 2**31 + 3.
cdef long long C_FRAME_SIZE_CEILING = (1 << 31) + 3
cdef int64_t INT32_MIN = -(1 << 31)
cdef int64_t INT32_MAX = (1 << 31) - 1

cdef object _DEFAULT_MAX_FRAME_SIZE = DEFAULT_MAX_FRAME_SIZE
cdef object _JAVA = LanguageCode.JAVA
cdef object _BROKER_VERSION = BROKER_VERSION
cdef object _FLAG_RESPONSE = FLAG_RESPONSE
cdef bytes _EMPTY_BYTES = b""
cdef str _S_JSON = "JSON"
cdef str _S_ROCKETMQ = "ROCKETMQ"

# Languages by ordinal (None for gaps) and their names as bytes, for the raw-byte name match.
cdef Py_ssize_t _N_LANG = max(m.value for m in LanguageCode) + 1
cdef tuple _LANG_BY_ORDINAL = tuple(
    next((m for m in LanguageCode if m.value == i), None) for i in range(_N_LANG)
)
cdef tuple _LANG_NAMES = tuple(m.name.encode() if m is not None else b"" for m in _LANG_BY_ORDINAL)

# Ext-field names real clients send most, interned: a decoded header then shares these str objects.
cdef tuple _COMMON_KEYS = tuple(
    (k.encode(), k)
    for k in (
        "topic", "consumerGroup", "queueId", "commitOffset", "sysFlag", "queueOffset", "maxMsgNums",
        "suspendTimeoutMillis", "subscription", "subVersion", "expressionType", "AccessKey", "OnsChannel",
        "Signature", "producerGroup", "clientID", "IS_SUPPORT_HEART_BEAT_V2", "IS_SUB_CHANGE", "bname", "ns",
        "nsd", "oway", "lo", "acceptStandardJsonOnly",
    )
)

# JSON tokens
cdef enum:
    K_STRING = 0
    K_NUMBER = 1
    K_OBJECT = 2
    K_ARRAY = 3
    K_TRUE = 4
    K_FALSE = 5
    K_NULL = 6

# String token flags
cdef enum:
    S_ESCAPE = 1
    S_NON_ASCII = 2

# Known header keys
cdef enum:
    F_OTHER = 0
    F_CODE = 1
    F_FLAG = 2
    F_OPAQUE = 3
    F_VERSION = 4
    F_LANGUAGE = 5
    F_REMARK = 6
    F_EXT = 7

cdef dict _FIELD_IDS = {
    "code": F_CODE, "flag": F_FLAG, "opaque": F_OPAQUE, "version": F_VERSION, "language": F_LANGUAGE,
    "remark": F_REMARK, "extFields": F_EXT,
}


cdef struct Tok:
    int kind
    Py_ssize_t start   # first byte of the token
    Py_ssize_t stop    # one past its last byte
    int flags          # strings: S_ESCAPE | S_NON_ASCII; numbers: 1 when integral


cdef struct Scan:
    const unsigned char* s   # frame start: offsets are frame offsets, as in error messages
    Py_ssize_t pos
    Py_ssize_t end           # header end; no read at or past it


# ---------------------------------------------------------------------------------------------------------------
# Small helpers


cdef inline uint32_t _be32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int16_t _be16s(const unsigned char* p) noexcept nogil:
    return <int16_t>((<unsigned int>p[0] << 8) | <unsigned int>p[1])


cdef inline object _ascii_str(const unsigned char* p, Py_ssize_t n):
    """A str from bytes known to be ASCII (PyUnicode_New writes the terminating NUL)."""
    cdef object u
    if n == 1:
        return PyUnicode_FromOrdinal(p[0])  # CPython's cached one-character strings
    u = PyUnicode_New(n, 127)
    if n:
        memcpy(PyUnicode_DATA(u), p, n)
    return u


cdef int _fail(str what, Py_ssize_t at, const unsigned char* s, Py_ssize_t end) except -1:
    """FrameError naming the byte offset and echoing a short piece of the input there (twin: _fail)."""
    cdef Py_ssize_t stop
    if at < end:
        stop = at + C_MAX_ECHO if at + C_MAX_ECHO < end else end
        raise FrameError(f"{what} at byte {at} near {echo(PyBytes_FromStringAndSize(<const char*>s + at, stop - at))}")
    raise FrameError(f"{what} at byte {at}")


cdef inline Py_ssize_t _utf8_len(const unsigned char* s, Py_ssize_t i, Py_ssize_t end) noexcept nogil:
    """Length of the valid UTF-8 sequence led by the non-ASCII byte s[i] (i < end), 0 when invalid.

    Strict: no overlongs, no surrogates, nothing above U+10FFFF, no sequence running past end.
    """
    cdef unsigned char c = s[i]
    cdef unsigned char lo = 0x80, hi = 0xBF
    if c < 0xC2:
        return 0
    if c < 0xE0:
        if i + 1 < end and (s[i + 1] & 0xC0) == 0x80:
            return 2
        return 0
    if c < 0xF0:
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
        if i + 2 < end and lo <= s[i + 1] <= hi and (s[i + 2] & 0xC0) == 0x80:
            return 3
        return 0
    if c < 0xF5:
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
        if i + 3 < end and lo <= s[i + 1] <= hi and (s[i + 2] & 0xC0) == 0x80 and (s[i + 3] & 0xC0) == 0x80:
            return 4
    return 0


cdef object _utf8_str(const unsigned char* s, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t end):
    """Strict UTF-8 text of s[start:stop] (stop <= end); FrameError at the first invalid sequence."""
    cdef Py_ssize_t i = start, n
    cdef bint ascii = True
    while i < stop:
        if s[i] < 0x80:
            i += 1
            continue
        ascii = False
        n = _utf8_len(s, i, stop)
        if n == 0:
            _fail("invalid UTF-8", i, s, end)
        i += n
    if ascii:
        return _ascii_str(s + start, stop - start)
    return PyUnicode_DecodeUTF8(<const char*>s + start, stop - start, "strict")


cdef inline int _parse_int32(const unsigned char* p, Py_ssize_t n, int32_t* out) noexcept nogil:
    """[+-]?[0-9]+ within int32 -> 1 and *out; anything else -> 0 (twin: _INT_STRING and _small_int)."""
    cdef Py_ssize_t i = 0
    cdef bint negative = False
    cdef int64_t v = 0
    if n > 0 and (p[0] == 45 or p[0] == 43):  # '-' '+'
        negative = p[0] == 45
        i = 1
    if i >= n:
        return 0
    while i < n:
        if p[i] < 48 or p[i] > 57:
            return 0
        if v <= INT32_MAX + 1:  # once past the range keep checking digits only; no overflow
            v = v * 10 + (p[i] - 48)
        i += 1
    if negative:
        v = -v
    if v < INT32_MIN or v > INT32_MAX:
        return 0
    out[0] = <int32_t>v
    return 1


# ---------------------------------------------------------------------------------------------------------------
# JSON scanner (twin: _JsonScanner)


cdef inline Py_ssize_t _skip_space(const unsigned char* s, Py_ssize_t i, Py_ssize_t end) noexcept nogil:
    """The first index at or after i (below end) that is not JSON whitespace, else end."""
    cdef unsigned char c
    while i < end:
        c = s[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            break
        i += 1
    return i


cdef inline void _ws(Scan* sc) noexcept nogil:
    sc.pos = _skip_space(sc.s, sc.pos, sc.end)


cdef int _expect(Scan* sc, unsigned char ch, str what) except -1:
    if sc.pos >= sc.end:
        _fail("unexpected end of JSON header", sc.end, sc.s, sc.end)
    if sc.s[sc.pos] != ch:
        _fail(what, sc.pos, sc.s, sc.end)
    sc.pos += 1
    return 0


cdef inline int _hex4(const unsigned char* s, Py_ssize_t i, Py_ssize_t end) noexcept nogil:
    """Value of the 4 hex digits at s[i:i+4], or -1."""
    cdef int v = 0, d
    cdef Py_ssize_t k
    cdef unsigned char c
    if i + 4 > end:
        return -1
    for k in range(i, i + 4):
        c = s[k]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return -1
        v = (v << 4) | d
    return v


cdef Py_ssize_t _escape(Scan* sc, Py_ssize_t j, Py_ssize_t start) except -1:
    """Check the escape at j (a backslash); returns the offset after it (twin: _JsonScanner.escape)."""
    cdef const unsigned char* s = sc.s
    cdef Py_ssize_t end = sc.end
    cdef unsigned char c
    cdef int cp, low
    if j + 1 >= end:
        _fail("unterminated string", start, s, end)
    c = s[j + 1]
    if c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
        return j + 2
    if c != 117:  # 'u'
        _fail("invalid escape", j, s, end)
    cp = _hex4(s, j + 2, end)
    if cp < 0:
        _fail("invalid escape", j, s, end)
    if 0xD800 <= cp <= 0xDBFF:
        if j + 7 < end and s[j + 6] == 92 and s[j + 7] == 117:
            low = _hex4(s, j + 8, end)
            if low < 0:
                _fail("invalid escape", j + 6, s, end)
            if 0xDC00 <= low <= 0xDFFF:
                return j + 12
        _fail("lone surrogate", j, s, end)
    if 0xDC00 <= cp <= 0xDFFF:
        _fail("lone surrogate", j, s, end)
    return j + 6


# 1 for the bytes a JSON string holds as they are: printable ASCII but '"' and '\\' (the scan's fast loop).
cdef unsigned char _PLAIN[256]
for _c in range(256):
    _PLAIN[_c] = 0x20 <= _c < 0x80 and _c != 34 and _c != 92
del _c


cdef inline Py_ssize_t _skip_plain(const unsigned char* s, Py_ssize_t i, Py_ssize_t end) noexcept nogil:
    """First index >= i (< end) whose byte is not _PLAIN, or end: 8 bytes per step while they are all plain.

    Word tests (exact as booleans; a hit only sends us to the byte loop): a byte < 0x20 makes
    (v - 0x20..) & ~v set its high bit; a '"' or '\\' makes (x - 0x01..) & ~x do so for x = v ^ that byte;
    a non-ASCII byte has its own high bit set.
    """
    cdef uint64_t v, q, b
    while i + 8 <= end:
        memcpy(&v, s + i, 8)
        q = v ^ 0x2222222222222222ULL
        b = v ^ 0x5C5C5C5C5C5C5C5CULL
        if (((v - 0x2020202020202020ULL) & ~v) | ((q - 0x0101010101010101ULL) & ~q)
                | ((b - 0x0101010101010101ULL) & ~b) | v) & 0x8080808080808080ULL:
            break
        i += 8
    while i < end and _PLAIN[s[i]]:
        i += 1
    return i


cdef int _scan_string(Scan* sc, Tok* t) except -1:
    """Validate the string at pos (an opening quote) without decoding it (twin: _JsonScanner.string)."""
    cdef const unsigned char* s = sc.s
    cdef Py_ssize_t end = sc.end, start = sc.pos, i = sc.pos + 1, n
    cdef int flags = 0
    cdef unsigned char c
    while True:
        i = _skip_plain(s, i, end)
        if i >= end:
            _fail("unterminated string", start, s, end)
        c = s[i]
        if c == 34:
            break
        if c == 92:
            flags |= S_ESCAPE
            i = _escape(sc, i, start)
        elif c < 0x20:
            _fail("control character in string", i, s, end)
        elif c < 0x80:
            i += 1
        else:
            flags |= S_NON_ASCII
            n = _utf8_len(s, i, end)
            if n == 0:
                _fail("invalid UTF-8", i, s, end)
            i += n
    t.kind = K_STRING
    t.start = start
    t.stop = i + 1
    t.flags = flags
    sc.pos = i + 1
    return 0


cdef inline Py_ssize_t _put_utf8(unsigned char* out, Py_ssize_t k, int cp) noexcept nogil:
    if cp < 0x80:
        out[k] = cp
        return k + 1
    if cp < 0x800:
        out[k] = 0xC0 | (cp >> 6)
        out[k + 1] = 0x80 | (cp & 0x3F)
        return k + 2
    if cp < 0x10000:
        out[k] = 0xE0 | (cp >> 12)
        out[k + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[k + 2] = 0x80 | (cp & 0x3F)
        return k + 3
    out[k] = 0xF0 | (cp >> 18)
    out[k + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[k + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[k + 3] = 0x80 | (cp & 0x3F)
    return k + 4


cdef object _string_value(const unsigned char* s, Tok* t):
    """The str of a string token already validated by _scan_string."""
    cdef Py_ssize_t a = t.start + 1, b = t.stop - 1, i, k = 0
    cdef unsigned char c
    cdef int cp, low
    cdef unsigned char small[256]
    cdef unsigned char* out
    if t.flags == 0:
        return _ascii_str(s + a, b - a)
    if t.flags == S_NON_ASCII:
        return PyUnicode_DecodeUTF8(<const char*>s + a, b - a, "strict")
    # Escapes: every escape is at least as long as the UTF-8 it stands for, so b - a bytes of output suffice.
    if b - a <= 256:
        out = &small[0]
    else:
        out = <unsigned char*>PyMem_Malloc(b - a)
        if out == NULL:
            raise MemoryError()
    try:
        i = a
        while i < b:
            c = s[i]
            if c != 92:
                out[k] = c
                k += 1
                i += 1
                continue
            c = s[i + 1]  # validated: an escape is complete within the token
            if c == 117:
                cp = _hex4(s, i + 2, b)
                if 0xD800 <= cp <= 0xDBFF:
                    low = _hex4(s, i + 8, b)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    i += 12
                else:
                    i += 6
                k = _put_utf8(out, k, cp)
                continue
            if c == 98:
                c = 8
            elif c == 102:
                c = 12
            elif c == 110:
                c = 10
            elif c == 114:
                c = 13
            elif c == 116:
                c = 9
            out[k] = c  # '"', '\\', '/' stand for themselves
            k += 1
            i += 2
        return PyUnicode_DecodeUTF8(<const char*>out, k, "strict")
    finally:
        if out != &small[0]:
            PyMem_Free(out)


cdef int _scan_number(Scan* sc, Tok* t) except -1:
    """-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)? matched like the twin's regex (optional parts back off)."""
    cdef const unsigned char* s = sc.s
    cdef Py_ssize_t end = sc.end, start = sc.pos, i = sc.pos, j
    cdef int integral = 1
    if s[i] == 45:
        i += 1
    if i >= end or s[i] < 48 or s[i] > 57:
        _fail("invalid number", start, s, end)
    if s[i] == 48:
        i += 1
    else:
        while i < end and 48 <= s[i] <= 57:
            i += 1
    if i + 1 < end and s[i] == 46 and 48 <= s[i + 1] <= 57:
        i += 2
        while i < end and 48 <= s[i] <= 57:
            i += 1
        integral = 0
    if i < end and (s[i] == 101 or s[i] == 69):
        j = i + 1
        if j < end and (s[j] == 43 or s[j] == 45):
            j += 1
        if j < end and 48 <= s[j] <= 57:
            i = j + 1
            while i < end and 48 <= s[i] <= 57:
                i += 1
            integral = 0
    t.kind = K_NUMBER
    t.start = start
    t.stop = i
    t.flags = integral
    sc.pos = i
    return 0


cdef int _scan_key(Scan* sc, Tok* t) except -1:
    if sc.pos >= sc.end:
        _fail("unexpected end of JSON header", sc.end, sc.s, sc.end)
    if sc.s[sc.pos] != 34:
        _fail("expected a string key", sc.pos, sc.s, sc.end)
    _scan_string(sc, t)
    _ws(sc)
    _expect(sc, 58, "expected ':'")
    _ws(sc)
    return 0


cdef int _after_member(Scan* sc, unsigned char close, str what) except -1:
    """Skip ',' (returns 1: another member follows) or the closing bracket (returns 0)."""
    cdef unsigned char c
    _ws(sc)
    if sc.pos >= sc.end:
        _fail("unexpected end of JSON header", sc.end, sc.s, sc.end)
    c = sc.s[sc.pos]
    sc.pos += 1
    if c == 44:
        _ws(sc)
        return 1
    if c == close:
        return 0
    _fail(what, sc.pos - 1, sc.s, sc.end)


cdef int _scan_value(Scan* sc, int depth, Tok* t) except -1:
    """Scan one value inside a container at ``depth`` (twin: _JsonScanner.value)."""
    cdef const unsigned char* s = sc.s
    cdef Py_ssize_t start = sc.pos, end = sc.end
    cdef unsigned char c
    if start >= end:
        _fail("unexpected end of JSON header", end, s, end)
    c = s[start]
    if c == 34:
        return _scan_string(sc, t)
    if c == 123 or c == 91:
        _skip_container(sc, depth + 1)
        t.kind = K_OBJECT if c == 123 else K_ARRAY
        t.start = start
        t.stop = sc.pos
        t.flags = 0
        return 0
    if c == 45 or 48 <= c <= 57:
        return _scan_number(sc, t)
    if c == 116 and start + 4 <= end and memcmp(s + start, b"true", 4) == 0:
        t.kind = K_TRUE
        sc.pos = start + 4
    elif c == 102 and start + 5 <= end and memcmp(s + start, b"false", 5) == 0:
        t.kind = K_FALSE
        sc.pos = start + 5
    elif c == 110 and start + 4 <= end and memcmp(s + start, b"null", 4) == 0:
        t.kind = K_NULL
        sc.pos = start + 4
    else:
        _fail("invalid JSON value", start, s, end)
    t.start = start
    t.stop = sc.pos
    t.flags = 0
    return 0


cdef int _skip_container(Scan* sc, int depth) except -1:
    """Validate the object or array at pos (twin: _JsonScanner.skip_container)."""
    cdef Tok t
    cdef bint is_object
    cdef unsigned char close
    cdef str what
    if depth > C_MAX_JSON_DEPTH:
        _fail(f"JSON nesting deeper than {C_MAX_JSON_DEPTH}", sc.pos, sc.s, sc.end)
    is_object = sc.s[sc.pos] == 123
    close = 125 if is_object else 93
    what = "expected ',' or '}'" if is_object else "expected ',' or ']'"
    sc.pos += 1
    _ws(sc)
    if sc.pos < sc.end and sc.s[sc.pos] == close:
        sc.pos += 1
        return 0
    while True:
        if is_object:
            _scan_key(sc, &t)
        _scan_value(sc, depth, &t)
        if not _after_member(sc, close, what):
            return 0


cdef str _S_TRUE = "true"
cdef str _S_FALSE = "false"


cdef inline object _raw_text(const unsigned char* s, Tok* t):
    """Source text of a non-string token (validated UTF-8): how fastjson stringifies into a String field."""
    if t.kind == K_NUMBER:  # ASCII by grammar
        return _ascii_str(s + t.start, t.stop - t.start)
    if t.kind == K_TRUE:
        return _S_TRUE
    if t.kind == K_FALSE:
        return _S_FALSE
    return PyUnicode_DecodeUTF8(<const char*>s + t.start, t.stop - t.start, "strict")


# The same as C arrays (the tuple keeps the objects alive): the lookup is a length compare per entry.
cdef enum:
    N_COMMON_KEYS_MAX = 64
cdef Py_ssize_t _N_COMMON_KEYS = 0
cdef const char* _COMMON_KEY_BYTES[N_COMMON_KEYS_MAX]
cdef Py_ssize_t _COMMON_KEY_LENGTHS[N_COMMON_KEYS_MAX]
cdef PyObject* _COMMON_KEY_STRS[N_COMMON_KEYS_MAX]
for _raw, _text in _COMMON_KEYS[:N_COMMON_KEYS_MAX]:
    _COMMON_KEY_BYTES[_N_COMMON_KEYS] = PyBytes_AS_STRING(_raw)
    _COMMON_KEY_LENGTHS[_N_COMMON_KEYS] = PyBytes_GET_SIZE(_raw)
    _COMMON_KEY_STRS[_N_COMMON_KEYS] = <PyObject*>_text
    _N_COMMON_KEYS += 1
del _raw, _text


cdef object _ext_key(const unsigned char* s, Tok* t):
    cdef Py_ssize_t a = t.start + 1, n = t.stop - t.start - 2, i
    if t.flags == 0:
        for i in range(_N_COMMON_KEYS):
            if _COMMON_KEY_LENGTHS[i] == n and memcmp(_COMMON_KEY_BYTES[i], s + a, n) == 0:
                return <object>_COMMON_KEY_STRS[i]
    return _string_value(s, t)


cdef dict _ext_fields_object(Scan* sc):
    """The extFields object at pos, depth 2 (twin: _JsonScanner.ext_fields)."""
    cdef dict fields = {}
    cdef Tok kt, vt
    cdef Py_ssize_t count = 0
    cdef object key, value
    sc.pos += 1
    _ws(sc)
    if sc.pos < sc.end and sc.s[sc.pos] == 125:
        sc.pos += 1
        return fields
    while True:
        count += 1
        if count > C_MAX_EXT_FIELDS:
            _fail(f"more than {C_MAX_EXT_FIELDS} ext fields", sc.pos, sc.s, sc.end)
        _scan_key(sc, &kt)
        _scan_value(sc, 2, &vt)
        key = _ext_key(sc.s, &kt)
        if vt.kind == K_STRING:
            value = _string_value(sc.s, &vt)
        elif vt.kind == K_NULL:
            value = None
        else:  # numbers, booleans, containers: their source text (String.valueOf for ints and booleans)
            value = _raw_text(sc.s, &vt)
        PyDict_SetItem(fields, key, value)
        if not _after_member(sc, 125, "expected ',' or '}'"):
            return fields


cdef int _key_id(const unsigned char* s, Tok* t) except -1:
    cdef const unsigned char* p = s + t.start + 1
    cdef Py_ssize_t n = t.stop - t.start - 2
    if t.flags & S_ESCAPE:
        return _FIELD_IDS.get(_string_value(s, t), F_OTHER)
    if t.flags:
        return F_OTHER
    if n == 4:
        if memcmp(p, b"code", 4) == 0:
            return F_CODE
        if memcmp(p, b"flag", 4) == 0:
            return F_FLAG
    elif n == 6:
        if memcmp(p, b"opaque", 6) == 0:
            return F_OPAQUE
        if memcmp(p, b"remark", 6) == 0:
            return F_REMARK
    elif n == 7:
        if memcmp(p, b"version", 7) == 0:
            return F_VERSION
    elif n == 8:
        if memcmp(p, b"language", 8) == 0:
            return F_LANGUAGE
    elif n == 9:
        if memcmp(p, b"extFields", 9) == 0:
            return F_EXT
    return F_OTHER


cdef int _int_field(Scan* sc, Tok* t, str name, int32_t* out) except -1:
    """code/flag/opaque/version: JSON integer, integer string or null (twin: _int_field)."""
    cdef const char* p
    cdef Py_ssize_t n
    cdef object text
    if t.kind == K_NUMBER and t.flags:
        if _parse_int32(sc.s + t.start, t.stop - t.start, out):
            return 0
    elif t.kind == K_STRING:
        if t.flags == 0:
            if _parse_int32(sc.s + t.start + 1, t.stop - t.start - 2, out):
                return 0
        elif t.flags & S_ESCAPE:
            text = _string_value(sc.s, t)
            p = PyUnicode_AsUTF8AndSize(text, &n)
            if _parse_int32(<const unsigned char*>p, n, out):
                return 0
    elif t.kind == K_NULL:
        out[0] = 0
        return 0
    _fail(f"'{name}' is not an int32", t.start, sc.s, sc.end)


cdef object _language_field(Scan* sc, Tok* t):
    """A LanguageCode member, or None when unknown (twin: _language_field)."""
    cdef const unsigned char* p = sc.s + t.start + 1
    cdef Py_ssize_t n = t.stop - t.start - 2, i
    cdef bytes name
    cdef int32_t ordinal
    if t.kind == K_STRING:
        if t.flags & S_ESCAPE:
            return LANGUAGE_BY_NAME.get(_string_value(sc.s, t))
        if t.flags == 0:
            for i in range(_N_LANG):
                name = <bytes>_LANG_NAMES[i]
                if PyBytes_GET_SIZE(name) == n and n and memcmp(PyBytes_AS_STRING(name), p, n) == 0:
                    return _LANG_BY_ORDINAL[i]
        return None
    if t.kind == K_NULL:
        return None
    if t.kind == K_NUMBER and t.flags:
        if _parse_int32(sc.s + t.start, t.stop - t.start, &ordinal) and 0 <= ordinal < _N_LANG:
            return _LANG_BY_ORDINAL[ordinal]
        return None
    _fail("'language' is not a name or an ordinal", t.start, sc.s, sc.end)


cdef int _decode_json_header(const unsigned char* f, Py_ssize_t end, RemotingCommand cmd) except -1:
    """Fill cmd from the JSON header f[8:end] (twin: _decode_json_header)."""
    cdef Scan sc
    cdef Tok kt, vt
    cdef int fid
    cdef int32_t code = 0, flag = 0, opaque = 0, version = 0
    cdef object language = _JAVA, remark = None, ext = None
    sc.s = f
    sc.pos = 8
    sc.end = end
    _ws(&sc)
    if sc.pos >= end:
        _fail("empty JSON header", sc.pos, f, end)
    if f[sc.pos] != 123:
        _fail("JSON header is not an object", sc.pos, f, end)
    sc.pos += 1
    _ws(&sc)
    if sc.pos < end and f[sc.pos] == 125:
        sc.pos += 1
    else:
        while True:
            _scan_key(&sc, &kt)
            fid = _key_id(f, &kt)
            if fid == F_EXT and sc.pos < end and f[sc.pos] == 123:
                ext = _ext_fields_object(&sc)
            else:
                _scan_value(&sc, 1, &vt)
                if fid == F_CODE:
                    _int_field(&sc, &vt, "code", &code)
                elif fid == F_FLAG:
                    _int_field(&sc, &vt, "flag", &flag)
                elif fid == F_OPAQUE:
                    _int_field(&sc, &vt, "opaque", &opaque)
                elif fid == F_VERSION:
                    _int_field(&sc, &vt, "version", &version)
                elif fid == F_LANGUAGE:
                    language = _language_field(&sc, &vt)
                elif fid == F_REMARK:
                    if vt.kind == K_STRING:
                        remark = _string_value(f, &vt)
                    elif vt.kind == K_NULL:
                        remark = None
                    else:
                        remark = _raw_text(f, &vt)
                elif fid == F_EXT:
                    if vt.kind != K_NULL:
                        _fail("'extFields' is not an object", vt.start, f, end)
                    ext = None
                # anything else (serializeTypeCurrentRPC included: the header word decides) is ignored
            if not _after_member(&sc, 125, "expected ',' or '}'"):
                break
    _ws(&sc)
    if sc.pos < end:
        _fail("trailing data after the JSON header", sc.pos, f, end)
    cmd.code = code
    cmd.flag = flag
    cmd.opaque = opaque
    cmd.version = version
    cmd.language = language
    cmd.remark = remark
    cmd.ext_fields = ext
    return 0


# ---------------------------------------------------------------------------------------------------------------
# ROCKETMQ binary header (twin: _decode_rocketmq_header)


cdef int _decode_rocketmq_header(const unsigned char* f, Py_ssize_t end, RemotingCommand cmd) except -1:
    cdef Py_ssize_t pos, ext_end, count = 0
    cdef int32_t remark_length, ext_length, value_length
    cdef int16_t key_length
    cdef unsigned char language
    cdef dict fields
    cdef object key, value
    if end - 8 < 21:
        _fail(f"ROCKETMQ header of {end - 8} bytes is shorter than 21", 8, f, end)
    # fixed part: code int16 @8, language @10, version int16 @11, opaque @13, flag @17, remark_len @21
    language = f[10]
    cmd.code = _be16s(f + 8)
    cmd.language = _LANG_BY_ORDINAL[language] if language < _N_LANG else None
    cmd.version = _be16s(f + 11)
    cmd.opaque = <int32_t>_be32(f + 13)
    cmd.flag = <int32_t>_be32(f + 17)
    remark_length = <int32_t>_be32(f + 21)
    if remark_length < 0:
        _fail(f"negative remark length {remark_length}", 21, f, end)
    if remark_length > end - 29:  # the remark must leave room for the 4-byte ext length
        _fail(f"remark length {remark_length} exceeds the header", 21, f, end)
    pos = 25 + remark_length
    cmd.remark = _utf8_str(f, 25, pos, end) if remark_length else None
    ext_length = <int32_t>_be32(f + pos)  # pos + 4 <= end by the check above
    if ext_length < 0:
        _fail(f"negative ext fields length {ext_length}", pos, f, end)
    if ext_length > end - pos - 4:
        _fail(f"ext fields length {ext_length} exceeds the header", pos, f, end)
    pos += 4
    ext_end = pos + ext_length
    cmd.ext_fields = None
    if ext_length:
        fields = {}
        while pos < ext_end:
            count += 1
            if count > C_MAX_EXT_FIELDS:
                _fail(f"more than {C_MAX_EXT_FIELDS} ext fields", pos, f, end)
            if ext_end - pos < 2:
                _fail("truncated ext field key length", pos, f, end)
            key_length = _be16s(f + pos)
            if key_length < 0:
                _fail(f"negative ext field key length {key_length}", pos, f, end)
            if key_length > ext_end - pos - 2:
                _fail(f"ext field key length {key_length} overruns the ext fields", pos, f, end)
            pos += 2
            key = _utf8_str(f, pos, pos + key_length, end) if key_length else None
            pos += key_length
            if ext_end - pos < 4:
                _fail("truncated ext field value length", pos, f, end)
            value_length = <int32_t>_be32(f + pos)
            if value_length < 0:
                _fail(f"negative ext field value length {value_length}", pos, f, end)
            if value_length > ext_end - pos - 4:
                _fail(f"ext field value length {value_length} overruns the ext fields", pos, f, end)
            pos += 4
            value = _utf8_str(f, pos, pos + value_length, end) if value_length else None
            pos += value_length
            if key is not None:  # a zero-length key (Java: a null key) is skipped
                PyDict_SetItem(fields, key, value)
        cmd.ext_fields = fields
    if pos != end:
        _fail("extra bytes after the ROCKETMQ header", pos, f, end)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Frame level


cdef int _check_length(int32_t total, long long max_frame_size) except -1:
    if total < 0:
        raise FrameError(f"negative frame length {total}")
    if <long long>total + 4 > max_frame_size:
        raise FrameError(f"frame length {total} exceeds the max frame size {max_frame_size}")
    if total < 4:
        raise FrameError(f"frame length {total} leaves no room for the header word")
    return 0


cdef int _check_header_word(uint32_t word, int32_t total) except -1:
    cdef uint32_t header_length = word & 0xFFFFFF
    if <int64_t>header_length > <int64_t>total - 4:
        raise FrameError(f"bad header length {header_length} for frame length {total}")
    if (word >> 24) > 1:
        raise FrameError(f"unknown serialize type {word >> 24}")
    return 0


cdef RemotingCommand _decode_command(const unsigned char* f, Py_ssize_t size, uint32_t word):
    """f[0:size] is one whole frame whose length and header word are already checked."""
    cdef Py_ssize_t header_end = 8 + (word & 0xFFFFFF)
    cdef RemotingCommand cmd = RemotingCommand.__new__(RemotingCommand)
    if (word >> 24) == 0:
        _decode_json_header(f, header_end, cmd)
        cmd.serialize_type = _S_JSON
    else:
        _decode_rocketmq_header(f, header_end, cmd)
        cmd.serialize_type = _S_ROCKETMQ
    if size > header_end:
        cmd.body = PyBytes_FromStringAndSize(<const char*>f + header_end, size - header_end)
    else:
        cmd.body = _EMPTY_BYTES
    return cmd


cdef long long _limit(object max_frame_size) except -1:
    cdef long long value
    if max_frame_size is _DEFAULT_MAX_FRAME_SIZE:
        return C_DEFAULT_MAX_FRAME_SIZE
    max_frame_size = _twin._max_frame_size(max_frame_size)  # TypeError/ValueError exactly as the twin
    if max_frame_size >= C_FRAME_SIZE_CEILING:
        return C_FRAME_SIZE_CEILING
    return max_frame_size


cdef int _get_buffer(object data, Py_buffer* view) except -1:
    try:
        PyObject_GetBuffer(data, view, PyBUF_SIMPLE)
    except (TypeError, BufferError):
        raise TypeError(f"expected a contiguous bytes-like object, got {type(data).__name__}") from None
    return 0


def decode_frame(frame, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
    """Decode exactly one whole frame (4-byte length prefix included) into a RemotingCommand."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t size
    cdef bint release = False
    cdef long long limit
    cdef int32_t total
    cdef uint32_t word
    if type(frame) is bytes:
        p = <const unsigned char*>PyBytes_AS_STRING(frame)
        size = PyBytes_GET_SIZE(frame)
    else:
        _get_buffer(frame, &view)
        release = True
        p = <const unsigned char*>view.buf
        size = view.len
    try:
        limit = _limit(max_frame_size)
        if size < 4:
            raise FrameError(f"truncated frame: {size} bytes, the length prefix needs 4")
        total = <int32_t>_be32(p)
        _check_length(total, limit)
        if <Py_ssize_t>total + 4 != size:
            raise FrameError(f"frame length {total} does not match the {size - 4} bytes after the prefix")
        word = _be32(p + 4)  # size >= 8: total >= 4 and total + 4 == size
        _check_header_word(word, total)
        return _decode_command(p, size, word)
    finally:
        if release:
            PyBuffer_Release(&view)


# ---------------------------------------------------------------------------------------------------------------
# Encoding


cdef struct Writer:
    unsigned char* buf
    Py_ssize_t n
    Py_ssize_t cap
    bint heap
    unsigned char small[512]


cdef inline void _w_init(Writer* w) noexcept:
    w.buf = w.small
    w.n = 0
    w.cap = 512
    w.heap = False


cdef inline void _w_free(Writer* w) noexcept:
    if w.heap:
        PyMem_Free(w.buf)
        w.heap = False


cdef int _w_reserve(Writer* w, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap
    cdef unsigned char* p
    if w.n + extra <= w.cap:
        return 0
    cap = w.cap * 2
    if cap < w.n + extra:
        cap = w.n + extra
    if w.heap:
        p = <unsigned char*>PyMem_Realloc(w.buf, cap)
    else:
        p = <unsigned char*>PyMem_Malloc(cap)
        if p != NULL:
            memcpy(p, w.buf, w.n)
    if p == NULL:
        raise MemoryError()
    w.buf = p
    w.cap = cap
    w.heap = True
    return 0


cdef inline int _w_raw(Writer* w, const void* p, Py_ssize_t n) except -1:
    _w_reserve(w, n)
    memcpy(w.buf + w.n, p, n)
    w.n += n
    return 0


cdef int _w_int(Writer* w, int64_t v) except -1:
    cdef unsigned char tmp[24]
    cdef int k = 24
    cdef bint negative = v < 0
    cdef uint64_t u = <uint64_t>(-v) if negative else <uint64_t>v
    while True:
        k -= 1
        tmp[k] = 48 + (u % 10)
        u //= 10
        if u == 0:
            break
    if negative:
        k -= 1
        tmp[k] = 45
    return _w_raw(w, tmp + k, 24 - k)


cdef inline void _w_be16(Writer* w, unsigned int v) noexcept:
    w.buf[w.n] = (v >> 8) & 0xFF
    w.buf[w.n + 1] = v & 0xFF
    w.n += 2


cdef inline void _w_be32(Writer* w, uint32_t v) noexcept:
    w.buf[w.n] = (v >> 24) & 0xFF
    w.buf[w.n + 1] = (v >> 16) & 0xFF
    w.buf[w.n + 2] = (v >> 8) & 0xFF
    w.buf[w.n + 3] = v & 0xFF
    w.n += 4


cdef const char* _HEX_UPPER = b"0123456789ABCDEF"


cdef object _utf8_of(object text, const char** p, Py_ssize_t* n):
    """UTF-8 of a str as Java writes it; returns the object owning the bytes (keep it alive)."""
    cdef object owner
    try:
        p[0] = PyUnicode_AsUTF8AndSize(text, n)
        return text
    except UnicodeEncodeError:
        owner = _twin._java_utf8(text)  # lone surrogates -> '?', split pairs joined (rare; the twin's code)
        p[0] = PyBytes_AS_STRING(owner)
        n[0] = PyBytes_GET_SIZE(owner)
        return owner


cdef int _w_json_string(Writer* w, object text) except -1:
    """fastjson default-mode string (twin: _json_string), escaping on the UTF-8 bytes."""
    cdef const char* cp
    cdef const unsigned char* p
    cdef Py_ssize_t n, i, extra = 0, run
    cdef unsigned char c, d
    cdef int code
    cdef object owner = _utf8_of(text, &cp, &n)
    p = <const unsigned char*>cp
    # Pass 1: exact output size.
    for i in range(n):
        c = p[i]
        if c < 0x20:
            extra += 1 if (c == 8 or c == 9 or c == 10 or c == 12 or c == 13) else 5
        elif c == 34 or c == 92:
            extra += 1
        elif c == 0x7F:
            extra += 5
        elif c == 0xC2 and i + 1 < n and p[i + 1] <= 0x9F:  # U+0080..U+009F (C2 80..C2 9F)
            extra += 4
        elif c == 0xE2 and i + 2 < n and p[i + 1] == 0x80 and (p[i + 2] == 0xA8 or p[i + 2] == 0xA9):
            extra += 3  # U+2028, U+2029
    _w_reserve(w, n + extra + 2)
    w.buf[w.n] = 34
    w.n += 1
    if extra == 0:
        memcpy(w.buf + w.n, p, n)
        w.n += n
    else:
        i = 0
        while i < n:
            c = p[i]
            code = -1
            run = 1
            if c < 0x20:
                if c == 8:
                    d = 98
                elif c == 9:
                    d = 116
                elif c == 10:
                    d = 110
                elif c == 12:
                    d = 102
                elif c == 13:
                    d = 114
                else:
                    d = 0
                    code = c
                if d:
                    w.buf[w.n] = 92
                    w.buf[w.n + 1] = d
                    w.n += 2
                    i += 1
                    continue
            elif c == 34 or c == 92:
                w.buf[w.n] = 92
                w.buf[w.n + 1] = c
                w.n += 2
                i += 1
                continue
            elif c == 0x7F:
                code = 0x7F
            elif c == 0xC2 and i + 1 < n and p[i + 1] <= 0x9F:
                code = p[i + 1]
                run = 2
            elif c == 0xE2 and i + 2 < n and p[i + 1] == 0x80 and (p[i + 2] == 0xA8 or p[i + 2] == 0xA9):
                code = 0x2000 | (p[i + 2] - 0x80)  # 0x2028 / 0x2029
                run = 3
            if code < 0:
                w.buf[w.n] = c
                w.n += 1
                i += 1
                continue
            w.buf[w.n] = 92
            w.buf[w.n + 1] = 117
            w.buf[w.n + 2] = _HEX_UPPER[(code >> 12) & 0xF]
            w.buf[w.n + 3] = _HEX_UPPER[(code >> 8) & 0xF]
            w.buf[w.n + 4] = _HEX_UPPER[(code >> 4) & 0xF]
            w.buf[w.n + 5] = _HEX_UPPER[code & 0xF]
            w.n += 6
            i += run
    w.buf[w.n] = 34
    w.n += 1
    return 0


cdef inline object _v_int32(str name, object value):
    cdef int overflow = 0
    cdef long long v
    if type(value) is int:
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and INT32_MIN <= v <= INT32_MAX:
            return value
    return _twin._int32(name, value)


cdef inline object _v_language(object value):
    if value is None or type(value) is LanguageCode:
        return value
    return _twin._language(value)


cdef inline object _v_remark(object value):
    if value is None or type(value) is str:
        return value
    return _twin._remark(value)


cdef inline object _v_ext_fields(object value):
    if value is None or type(value) is dict:
        return value
    return _twin._ext_fields(value)


cdef inline object _v_body(object value):
    if type(value) is bytes:
        return value
    return _twin._body(value)


cdef inline str _v_serialize_type(object value):
    if type(value) is str:
        if value == _S_JSON:
            return _S_JSON
        if value == _S_ROCKETMQ:
            return _S_ROCKETMQ
    # the twin normalizes (or raises); map its answer onto our constants, which encode() tests by identity
    return _S_JSON if _twin._serialize_type(value) == _S_JSON else _S_ROCKETMQ


cdef list _ext_entries(dict ext):
    """Sorted (key, value) pairs to write, None keys or values left out (twin: _ext_entries)."""
    cdef list entries = []
    cdef Py_ssize_t i = 0
    cdef PyObject* k
    cdef PyObject* v
    cdef object key, value
    while PyDict_Next(ext, &i, &k, &v):
        key = <object>k
        value = <object>v
        if key is not None and not isinstance(key, str):
            raise TypeError(f"ext_fields keys must be str, got {type(key).__name__}")
        if value is not None and not isinstance(value, str):
            raise TypeError(f"ext_fields values must be str or None, got {type(value).__name__}")
        if key is not None and value is not None:
            PyList_Append(entries, (key, value))
    if len(entries) > 1:
        entries.sort()
    return entries


cdef int _w_json_header(Writer* w, int32_t code, object language, int32_t version, int32_t opaque,
                        int32_t flag, object remark, list entries) except -1:
    """fastjson SortField order: code, extFields, flag, language, opaque, remark, serializeTypeCurrentRPC, version."""
    cdef Py_ssize_t i
    cdef tuple entry
    cdef bytes name
    cdef Py_ssize_t ordinal
    _w_raw(w, b'{"code":', 8)
    _w_int(w, code)
    if entries is not None:
        _w_raw(w, b',"extFields":{', 14)
        for i in range(len(entries)):
            entry = <tuple>entries[i]
            if i:
                _w_raw(w, b",", 1)
            _w_json_string(w, entry[0])
            _w_raw(w, b":", 1)
            _w_json_string(w, entry[1])
        _w_raw(w, b"}", 1)
    _w_raw(w, b',"flag":', 8)
    _w_int(w, flag)
    if language is not None:
        ordinal = language  # an IntEnum member is an int
        name = <bytes>_LANG_NAMES[ordinal] if 0 <= ordinal < _N_LANG else language.name.encode()
        _w_raw(w, b',"language":"', 13)
        _w_raw(w, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name))
        _w_raw(w, b'"', 1)
    _w_raw(w, b',"opaque":', 10)
    _w_int(w, opaque)
    if remark is not None:
        _w_raw(w, b',"remark":', 10)
        _w_json_string(w, remark)
    _w_raw(w, b',"serializeTypeCurrentRPC":"JSON","version":', 44)
    _w_int(w, version)
    _w_raw(w, b"}", 1)
    return 0


cdef int _w_rocketmq_header(Writer* w, int32_t code, object language, int32_t version, int32_t opaque,
                            int32_t flag, object remark, list entries) except -1:
    """Fixed 21 bytes, remark, ext entries (twin: _rocketmq_header)."""
    cdef const char* p
    cdef const char* q
    cdef Py_ssize_t n, m, i, ext_at, header_length
    cdef tuple entry
    cdef object owner, owner2
    cdef unsigned int language_byte = 0 if language is None else <unsigned int>(<int>language)
    _w_reserve(w, 17)
    _w_be16(w, <uint32_t>code & 0xFFFF)  # Java (short) cast
    w.buf[w.n] = language_byte & 0xFF
    w.n += 1
    _w_be16(w, <uint32_t>version & 0xFFFF)
    _w_be32(w, <uint32_t>opaque)
    _w_be32(w, <uint32_t>flag)
    n = 0
    owner = None
    if remark:
        owner = _utf8_of(remark, &p, &n)
    _w_be32(w, <uint32_t>n)
    if n:
        _w_raw(w, p, n)
    _w_reserve(w, 4)
    ext_at = w.n
    w.n += 4
    for i in range(len(entries) if entries is not None else 0):
        entry = <tuple>entries[i]
        owner = _utf8_of(entry[0], &p, &n)
        owner2 = _utf8_of(entry[1], &q, &m)
        if n > 0x7FFF:
            raise ValueError(f"ext field key of {n} bytes does not fit the int16 length")
        _w_reserve(w, 6 + n + m)
        _w_be16(w, <uint32_t>n)
        memcpy(w.buf + w.n, p, n)
        w.n += n
        _w_be32(w, <uint32_t>m)
        memcpy(w.buf + w.n, q, m)
        w.n += m
    header_length = w.n - 8
    if header_length > 0xFFFFFF:
        raise ValueError(f"header of {header_length} bytes exceeds {0xFFFFFF} bytes")
    n = w.n - ext_at - 4
    w.buf[ext_at] = (n >> 24) & 0xFF
    w.buf[ext_at + 1] = (n >> 16) & 0xFF
    w.buf[ext_at + 2] = (n >> 8) & 0xFF
    w.buf[ext_at + 3] = n & 0xFF
    return 0


cdef bytes _finish_frame(Writer* w, int serialize_type, bytes body):
    """Prefix + header word + the header in w.buf[8:] + body, as one bytes object (twin: _frame)."""
    cdef Py_ssize_t header_length = w.n - 8, body_length = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t total
    cdef bytes out
    cdef unsigned char* o
    cdef uint32_t word
    if header_length > 0xFFFFFF:
        raise ValueError(f"header of {header_length} bytes exceeds {0xFFFFFF} bytes")
    total = 4 + header_length + body_length
    if total > INT32_MAX:
        raise ValueError(f"frame of {total} bytes does not fit the int32 length")
    out = PyBytes_FromStringAndSize(NULL, 4 + total)
    o = <unsigned char*>PyBytes_AS_STRING(out)
    word = (<uint32_t>serialize_type << 24) | <uint32_t>header_length
    o[0] = (total >> 24) & 0xFF
    o[1] = (total >> 16) & 0xFF
    o[2] = (total >> 8) & 0xFF
    o[3] = total & 0xFF
    o[4] = (word >> 24) & 0xFF
    o[5] = (word >> 16) & 0xFF
    o[6] = (word >> 8) & 0xFF
    o[7] = word & 0xFF
    memcpy(o + 8, w.buf + 8, header_length)
    if body_length:
        memcpy(o + 8 + header_length, PyBytes_AS_STRING(body), body_length)
    return out


# ---------------------------------------------------------------------------------------------------------------
# RemotingCommand


@cython.freelist(64)
@cython.final
cdef class RemotingCommand:
    """One remoting command: header fields plus body. Mutable; encode() validates every field again."""

    cdef public object code
    cdef public object language
    cdef public object version
    cdef public object opaque
    cdef public object flag
    cdef public object remark
    cdef public object ext_fields
    cdef public object body
    cdef public object serialize_type

    def __init__(self, code, *, language=LanguageCode.JAVA, version=BROKER_VERSION, opaque=0, flag=0,
                 remark=None, ext_fields=None, body=b"", serialize_type="JSON"):
        self.code = _v_int32("code", code)
        self.language = _v_language(language)
        self.version = _v_int32("version", version)
        self.opaque = _v_int32("opaque", opaque)
        self.flag = _v_int32("flag", flag)
        self.remark = _v_remark(remark)
        self.ext_fields = _v_ext_fields(ext_fields)
        self.body = _v_body(body)
        self.serialize_type = _v_serialize_type(serialize_type)

    @property
    def is_response(self):
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self):
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code=0, remark=None, ext_fields=None, body=b""):
        """The response to this request: flag RESPONSE, the request's opaque and serialize type (PROTOCOL.md 2.6)."""
        cdef RemotingCommand r = RemotingCommand.__new__(RemotingCommand)
        r.code = _v_int32("code", code)
        r.language = _JAVA
        r.version = _BROKER_VERSION
        r.opaque = _v_int32("opaque", self.opaque)
        r.flag = _FLAG_RESPONSE
        r.remark = _v_remark(remark)
        r.ext_fields = _v_ext_fields(ext_fields)
        r.body = _v_body(body)
        r.serialize_type = _v_serialize_type(self.serialize_type)
        return r

    def encode(self):
        """The whole frame (length prefix included), header serialized as ``serialize_type`` says."""
        cdef Writer w
        cdef int32_t code = _v_int32("code", self.code)
        cdef object language = _v_language(self.language)
        cdef int32_t version = _v_int32("version", self.version)
        cdef int32_t opaque = _v_int32("opaque", self.opaque)
        cdef int32_t flag = _v_int32("flag", self.flag)
        cdef object remark = _v_remark(self.remark)
        cdef object ext = _v_ext_fields(self.ext_fields)
        cdef list entries = _ext_entries(ext) if ext is not None else None
        cdef bytes body = _v_body(self.body)
        cdef str serialize_type = _v_serialize_type(self.serialize_type)
        _w_init(&w)
        try:
            w.n = 8  # prefix and header word are written by _finish_frame
            if serialize_type is _S_JSON:
                _w_json_header(&w, code, language, version, opaque, flag, remark, entries)
                return _finish_frame(&w, 0, body)
            _w_rocketmq_header(&w, code, language, version, opaque, flag, remark, entries)
            return _finish_frame(&w, 1, body)
        finally:
            _w_free(&w)

    def to_dict(self):
        """The fields as a plain dict (language by name), for parity tests and tools."""
        return {
            "code": self.code,
            "language": self.language.name if isinstance(self.language, LanguageCode) else self.language,
            "version": self.version,
            "opaque": self.opaque,
            "flag": self.flag,
            "remark": self.remark,
            "ext_fields": dict(self.ext_fields) if isinstance(self.ext_fields, dict) else self.ext_fields,
            "body": self.body,
            "serialize_type": self.serialize_type,
        }

    def __eq__(self, other):
        if not isinstance(other, _COMMAND_TYPES):
            return NotImplemented
        return (
            self.code == other.code
            and self.language == other.language
            and self.version == other.version
            and self.opaque == other.opaque
            and self.flag == other.flag
            and self.remark == other.remark
            and self.ext_fields == other.ext_fields
            and self.body == other.body
            and self.serialize_type == other.serialize_type
        )

    __hash__ = None  # mutable

    def __repr__(self):
        return _twin._command_repr(self)


cdef tuple _COMMAND_TYPES = (RemotingCommand, _twin.RemotingCommand)

# ---- the repeat pattern (native twin of engine.codec._frame_py.repeat_pattern / repeat_frame: same results)

cdef tuple _REPEAT_CHECKS = (0, 2147483647, -2147483648)
cdef tuple _REPEAT_FIELDS = ("code", "language", "version", "flag", "remark", "ext_fields", "body", "serialize_type")


cdef object _repeat_pattern(object frame):
    """``(serialize byte, text, header prefix, header suffix, body)`` of one whole request frame with its opaque
    cut out, or None when the opaque cannot be located unambiguously; verified by decoding frames filled in with
    other opaques (they must decode to the same command but for the opaque)."""
    cdef bytes f = bytes(frame)
    cdef Py_ssize_t i, j, hlen
    cdef unsigned int word
    try:
        cmd = decode_frame(f)
    except FrameError:
        return None
    word = int.from_bytes(f[4:8], "big")
    kind, hlen = word >> 24, word & 0xFFFFFF
    header, body = f[8:8 + hlen], f[8 + hlen:]
    if kind == 0:
        i = header.find(b'"opaque":')
        if i < 0 or header.find(b'"opaque":', i + 1) >= 0:
            return None
        j = i + 9
        digits = b"%d" % cmd.opaque
        if header[j:j + len(digits)] != digits or header[j + len(digits):j + len(digits) + 1].isdigit():
            return None
        pattern = (kind, True, header[:j], header[j + len(digits):], body)
    else:
        if hlen < 9 or header[5:9] != (<int>cmd.opaque).to_bytes(4, "big", signed=True):
            return None
        pattern = (kind, False, header[:5], header[9:], body)
    want = [getattr(cmd, name) for name in _REPEAT_FIELDS]
    for opaque in _REPEAT_CHECKS:
        try:
            other = decode_frame(_repeat_frame(pattern, opaque))
        except FrameError:
            return None
        if other.opaque != opaque or [getattr(other, name) for name in _REPEAT_FIELDS] != want:
            return None
    return pattern


cdef bytes _repeat_frame(tuple pattern, object opaque):
    """The frame of ``pattern`` carrying ``opaque``."""
    kind, text, prefix, suffix, body = pattern
    slot = b"%d" % opaque if text else opaque.to_bytes(4, "big", signed=True)
    cdef Py_ssize_t hlen = len(prefix) + len(slot) + len(suffix)
    return ((4 + hlen + len(body)).to_bytes(4, "big") + ((kind << 24) | hlen).to_bytes(4, "big") + prefix + slot
            + suffix + body)


# ---- the body digest of a repeat armed with sets=True (twin and specification: engine.codec._frame_py.body_digest)

cdef int C_MAX_DIGEST_DEPTH = _twin.MAX_DIGEST_DEPTH
cdef Py_ssize_t C_MAX_DIGEST_ELEMENTS = _twin.MAX_DIGEST_ELEMENTS
cdef uint64_t _OFFSET64 = 0xCBF29CE484222325ULL
cdef uint64_t _PRIME64 = 0x100000001B3ULL
cdef uint64_t _GOLDEN64 = 0x9E3779B97F4A7C15ULL
cdef enum:
    _T_STR = 1
    _T_ATOM = 2
    _T_KEY = 3
    _T_OBJ = 4
    _T_SET = 5
    _T_LIST = 6
    _SMALL_SET = 16  # sets up to this size are checked for distinct keys pairwise; larger ones sorted


cdef inline uint64_t _fmix64(uint64_t h) noexcept nogil:
    h ^= h >> 30
    h *= 0xBF58476D1CE4E5B9ULL
    h ^= h >> 27
    h *= 0x94D049BB133111EBULL
    return h ^ (h >> 31)


cdef inline uint64_t _mix64(uint64_t h, uint64_t w) noexcept nogil:
    return (h ^ w) * _PRIME64


cdef uint64_t _MUL64 = 0x9FB21C651E98DF25ULL
cdef uint64_t _SEED = _twin.DIGEST_SEED


cdef inline uint64_t _le64(const unsigned char* s) noexcept:
    # the same word on any byte order (gcc makes it one load on a little-endian machine)
    return (<uint64_t>s[0] | <uint64_t>s[1] << 8 | <uint64_t>s[2] << 16 | <uint64_t>s[3] << 24
            | <uint64_t>s[4] << 32 | <uint64_t>s[5] << 40 | <uint64_t>s[6] << 48 | <uint64_t>s[7] << 56)


cdef inline uint64_t _leaf(int tag, const unsigned char* s, Py_ssize_t n) noexcept:
    """The twin's _leaf: s[0:n] as little-endian words (the last zero-padded), each xored in and mixed."""
    cdef uint64_t h = _SEED ^ (<uint64_t>n * _PRIME64) ^ (<uint64_t>tag * _GOLDEN64)
    cdef uint64_t w
    cdef Py_ssize_t i = 0, k
    while n - i >= 8:
        w = _le64(s + i)
        h = (h ^ w) * _MUL64
        h ^= h >> 29
        i += 8
    if i < n:
        w = 0
        k = n - 1
        while k >= i:
            w = (w << 8) | s[k]
            k -= 1
        h = (h ^ w) * _MUL64
        h ^= h >> 29
    return _fmix64(h)


cdef struct _Digest:
    const unsigned char* b
    Py_ssize_t n
    uint64_t* keys      # a stack of the open sets' element keys: an inner set's keys sit above its outer's
    Py_ssize_t top
    Py_ssize_t cap
    uint64_t small[64]


cdef inline Py_ssize_t _d_skip(_Digest* d, Py_ssize_t i) noexcept:
    return _skip_space(d.b, i, d.n)


cdef inline Py_ssize_t _d_string(_Digest* d, Py_ssize_t i) noexcept:
    """The end of the string at d.b[i] == '"' (past its closing quote), or -1: unterminated, an escape or a
    control byte inside."""
    cdef unsigned char c
    i += 1
    while i < d.n:
        c = d.b[i]
        if c == 34:
            return i + 1
        if c == 92 or c < 32:
            return -1
        i += 1
    return -1


cdef inline bint _d_atom_byte(unsigned char c) noexcept:
    return (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c == 43 or c == 45 or c == 46


cdef int _d_push(_Digest* d, uint64_t key) noexcept:
    """Push a key on the stack; -1 past C_MAX_DIGEST_ELEMENTS or when memory cannot be had (then: no digest)."""
    cdef uint64_t* grown
    cdef Py_ssize_t cap
    if d.top >= C_MAX_DIGEST_ELEMENTS:
        return -1
    if d.top == d.cap:
        cap = d.cap * 2
        if d.keys == d.small:
            grown = <uint64_t*>PyMem_Malloc(cap * sizeof(uint64_t))
            if grown != NULL:
                memcpy(grown, d.small, d.top * sizeof(uint64_t))
        else:
            grown = <uint64_t*>PyMem_Realloc(d.keys, cap * sizeof(uint64_t))
        if grown == NULL:
            return -1
        d.keys = grown
        d.cap = cap
    d.keys[d.top] = key
    d.top += 1
    return 0


cdef int _cmp_u64(const void* a, const void* b) noexcept nogil:
    cdef uint64_t x = (<const uint64_t*>a)[0]
    cdef uint64_t y = (<const uint64_t*>b)[0]
    return (x > y) - (x < y)


cdef bint _d_distinct(uint64_t* k, Py_ssize_t n) noexcept:
    """Whether k[0:n] holds n distinct values (sorts k in place when n > _SMALL_SET)."""
    cdef Py_ssize_t i, j
    if n <= _SMALL_SET:
        for i in range(1, n):
            for j in range(i):
                if k[i] == k[j]:
                    return False
        return True
    qsort(k, n, sizeof(uint64_t), _cmp_u64)
    for i in range(1, n):
        if k[i] == k[i - 1]:
            return False
    return True


cdef Py_ssize_t _d_value(_Digest* d, Py_ssize_t i, int depth, uint64_t* h, uint64_t* key) noexcept:
    """The digest and key of the JSON value at d.b[i] (no space before it) into h / key; its end, or -1: no
    digest. Bounds: every read of d.b is at an index checked < d.n first."""
    cdef unsigned char c
    cdef Py_ssize_t j
    if i >= d.n:
        return -1
    c = d.b[i]
    if c == 34:
        j = _d_string(d, i)
        if j < 0:
            return -1
        h[0] = key[0] = _leaf(_T_STR, d.b + i + 1, j - i - 2)
        return j
    if c == 123 or c == 91:
        if depth > C_MAX_DIGEST_DEPTH:
            return -1
        if c == 123:
            return _d_object(d, _d_skip(d, i + 1), depth, h, key)
        return _d_array(d, _d_skip(d, i + 1), depth, h, key)
    j = i
    while j < d.n and _d_atom_byte(d.b[j]):
        j += 1
    if j == i:
        return -1
    h[0] = key[0] = _leaf(_T_ATOM, d.b + i, j - i)
    return j


cdef Py_ssize_t _d_object(_Digest* d, Py_ssize_t i, int depth, uint64_t* h, uint64_t* key) noexcept:
    cdef uint64_t acc = _mix64(_OFFSET64, _T_OBJ)
    cdef uint64_t vh, vk, k = 0
    cdef bint keyed = False
    cdef Py_ssize_t n = 0, j, nlen
    cdef const unsigned char* name
    if i < d.n and d.b[i] == 125:
        h[0] = key[0] = _fmix64(_mix64(acc, 0))
        return i + 1
    while True:
        if i >= d.n or d.b[i] != 34:
            return -1
        j = _d_string(d, i)
        if j < 0:
            return -1
        name = d.b + i + 1
        nlen = j - i - 2
        i = _d_skip(d, j)
        if i >= d.n or d.b[i] != 58:
            return -1
        i = _d_value(d, _d_skip(d, i + 1), depth + 1, &vh, &vk)
        if i < 0:
            return -1
        if (nlen == 9 and memcmp(name, b"groupName", 9) == 0) or (nlen == 5 and memcmp(name, b"topic", 5) == 0):
            if keyed:
                return -1
            keyed = True
            k = vh
        acc = _mix64(_mix64(acc, _leaf(_T_KEY, name, nlen)), vh)
        n += 1
        i = _d_skip(d, i)
        if i < d.n and d.b[i] == 44:
            i = _d_skip(d, i + 1)
            continue
        if i < d.n and d.b[i] == 125:
            h[0] = _fmix64(_mix64(acc, <uint64_t>n))
            key[0] = k if keyed else h[0]
            return i + 1
        return -1


cdef Py_ssize_t _d_array(_Digest* d, Py_ssize_t i, int depth, uint64_t* h, uint64_t* key) noexcept:
    cdef uint64_t total = 0, ordered = _mix64(_OFFSET64, _T_LIST)
    cdef uint64_t eh, ek
    cdef Py_ssize_t base = d.top, n
    if not (i < d.n and d.b[i] == 93):
        while True:
            i = _d_value(d, i, depth + 1, &eh, &ek)
            if i < 0:
                return -1
            total += _fmix64(eh)
            ordered = _mix64(ordered, eh)
            if _d_push(d, ek) < 0:
                return -1
            i = _d_skip(d, i)
            if i < d.n and d.b[i] == 44:
                i = _d_skip(d, i + 1)
                continue
            if i < d.n and d.b[i] == 93:
                break
            return -1
    n = d.top - base
    if _d_distinct(d.keys + base, n):
        h[0] = _fmix64(_mix64(_mix64(_mix64(_OFFSET64, _T_SET), <uint64_t>n), total))
    else:
        h[0] = _fmix64(_mix64(ordered, <uint64_t>n))
    key[0] = h[0]
    d.top = base
    return i + 1


cdef bint _body_digest(const unsigned char* b, Py_ssize_t n, uint64_t* out) noexcept:
    """body_digest of b[0:n] into out; False: no digest."""
    cdef _Digest d
    cdef uint64_t key
    cdef Py_ssize_t i
    d.b = b
    d.n = n
    d.keys = d.small
    d.top = 0
    d.cap = 64
    i = _d_value(&d, _d_skip(&d, 0), 1, out, &key)
    if d.keys != d.small:
        PyMem_Free(d.keys)
    return i >= 0 and _d_skip(&d, i) == n


def body_digest(body):
    """64-bit digest of a JSON body with its sets taken in any order, or None (see engine.codec._frame_py)."""
    cdef Py_buffer view
    cdef uint64_t h
    cdef bint ok
    _get_buffer(body, &view)
    try:
        ok = _body_digest(<const unsigned char*>view.buf, view.len, &h)
    finally:
        PyBuffer_Release(&view)
    return h if ok else None


# ---------------------------------------------------------------------------------------------------------------
# Streaming


@cython.final
cdef class FrameDecoder:
    """Incremental decoder for one connection: feed() bytes as they arrive, get every complete command back.

    The length prefix is checked as soon as its 4 bytes are in, the header word as soon as its 4 are: a bad
    length is refused before its frame is buffered. After an error the decoder stays failed: every later
    feed() raises FrameError (the connection is to be closed). The error raised by feed() carries in
    ``commands`` the commands completed earlier in that same call.

    Frames are decoded in place: straight from the chunk when nothing is pending, else from the buffer, which
    keeps a consumed-bytes offset and is compacted once that offset is large, so nothing is re-copied per frame.
    """

    cdef bytearray _buf
    cdef Py_ssize_t _off
    cdef long long _max
    cdef object _max_obj
    cdef object _error
    cdef bint _feeding
    # the armed repeat (engine.codec._frame_py.repeat_pattern's tuple, and its parts for the matcher)
    cdef object _repeat
    cdef uint32_t _r_kind
    cdef bint _r_text
    cdef bytes _r_prefix
    cdef bytes _r_suffix
    cdef bytes _r_body
    cdef bint _r_sets         # armed with sets=True and the body has a digest (_r_digest)
    cdef uint64_t _r_digest
    cdef public object watch_code
    cdef object _watched

    def __init__(self, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
        self._max_obj = _twin._max_frame_size(max_frame_size)
        self._max = _limit(self._max_obj)
        self._buf = bytearray()
        self._off = 0
        self._error = None
        self._feeding = False
        self._repeat = None
        self._r_sets = False
        self.watch_code = None
        self._watched = None

    @property
    def watched(self):
        """The last frame (bytes) with code ``watch_code`` that the latest feed() decoded into a command, or None."""
        return self._watched

    def drop_watched(self):
        """Let go of :attr:`watched` (a copy of a whole frame) once the caller has decided on it: until the next
        feed() it would otherwise stay held for nothing."""
        self._watched = None

    @property
    def repeating(self):
        return self._repeat is not None

    @property
    def repeat_body(self):
        """The armed frame's body (bytes), or None: a caller that keeps the same body can share this object."""
        return None if self._repeat is None else self._r_body

    def arm_repeat(self, frame, sets=False):
        """Return later frames equal to ``frame`` but for the opaque as their opaque; False if it cannot be. With
        ``sets``, also those whose body differs from ``frame``'s only in the order of its sets (body_digest; a
        body without a digest: only equal bytes)."""
        pattern = _repeat_pattern(frame)
        self._repeat = pattern
        self._r_sets = False
        if pattern is None:
            return False
        self._r_kind, self._r_text, self._r_prefix, self._r_suffix, self._r_body = pattern
        if sets:
            self._r_sets = _body_digest(<const unsigned char*>PyBytes_AS_STRING(self._r_body),
                                        PyBytes_GET_SIZE(self._r_body), &self._r_digest)
        return True

    def disarm_repeat(self):
        self._repeat = None

    def repeat_command(self, opaque):
        """The command a repeat with ``opaque`` stands for (the armed frame decoded with that opaque; a repeat taken
        on its digest had its sets in another order)."""
        if self._repeat is None:
            raise ValueError("no repeat is armed")
        return decode_frame(_repeat_frame(self._repeat, opaque), self._max_obj)

    cdef object _repeat_opaque(self, const unsigned char* f, Py_ssize_t size, uint32_t word):
        """The opaque of frame f[0:size] if it repeats the armed pattern, else None (twin: _repeat_opaque).

        Bounds: the caller checked the header word (8 + hlen <= size). The size checks below make prefix, slot,
        suffix and body partition f[8:size] exactly, so every memcmp, the slot reads and the body digest stay
        inside the frame."""
        cdef Py_ssize_t hlen = word & 0xFFFFFF
        cdef Py_ssize_t np_ = PyBytes_GET_SIZE(self._r_prefix)
        cdef Py_ssize_t ns = PyBytes_GET_SIZE(self._r_suffix)
        cdef Py_ssize_t nb = PyBytes_GET_SIZE(self._r_body)
        cdef Py_ssize_t nd, i
        cdef const unsigned char* slot
        cdef int64_t v = 0
        cdef uint64_t digest
        cdef bint neg
        if (word >> 24) != self._r_kind or size - 8 - hlen != nb:
            return None
        nd = hlen - np_ - ns
        if (self._r_text and (nd < 1 or nd > 11)) or (not self._r_text and nd != 4):
            return None
        if (memcmp(f + 8, PyBytes_AS_STRING(self._r_prefix), np_) != 0
                or memcmp(f + 8 + np_ + nd, PyBytes_AS_STRING(self._r_suffix), ns) != 0):
            return None
        if memcmp(f + 8 + hlen, PyBytes_AS_STRING(self._r_body), nb) != 0 and not (
                self._r_sets and _body_digest(f + 8 + hlen, nb, &digest) and digest == self._r_digest):
            return None
        slot = f + 8 + np_
        if not self._r_text:
            return <int32_t>_be32(slot)
        # canonical decimal only: "0", or an optional "-" and 1-10 digits without a leading zero
        neg = slot[0] == 45
        i = 1 if neg else 0
        if i >= nd or nd - i > 10 or (slot[i] == 48 and (neg or nd - i != 1)):
            return None
        while i < nd:
            if slot[i] < 48 or slot[i] > 57:
                return None
            v = v * 10 + (slot[i] - 48)
            i += 1
        if neg:
            v = -v
        if v < -0x80000000 or v > 0x7FFFFFFF:
            return None
        return v

    @property
    def buffered(self):
        """Bytes held for a frame not yet complete."""
        return PyByteArray_GET_SIZE(self._buf) - self._off

    @property
    def max_frame_size(self):
        return self._max_obj

    cdef Py_ssize_t _scan(self, const unsigned char* p, Py_ssize_t n, list out) except -1:
        """Decode every complete frame of p[0:n] into out; returns the bytes consumed."""
        cdef Py_ssize_t pos = 0
        cdef int32_t total
        cdef uint32_t word
        while n - pos >= 4:
            total = <int32_t>_be32(p + pos)
            _check_length(total, self._max)
            if n - pos < 8:
                break
            word = _be32(p + pos + 4)
            _check_header_word(word, total)
            if n - pos < <Py_ssize_t>total + 4:
                break
            if self._repeat is not None:
                opaque = self._repeat_opaque(p + pos, <Py_ssize_t>total + 4, word)
                if opaque is not None:
                    PyList_Append(out, opaque)
                    pos += <Py_ssize_t>total + 4
                    continue
            cmd = _decode_command(p + pos, <Py_ssize_t>total + 4, word)
            if self.watch_code is not None and cmd.code == self.watch_code:
                self._watched = PyBytes_FromStringAndSize(<const char*>p + pos, <Py_ssize_t>total + 4)
            PyList_Append(out, cmd)
            pos += <Py_ssize_t>total + 4
        return pos

    cdef int _append(self, const unsigned char* p, Py_ssize_t n) except -1:
        cdef Py_ssize_t old = PyByteArray_GET_SIZE(self._buf)
        PyByteArray_Resize(self._buf, old + n)
        memcpy(PyByteArray_AS_STRING(self._buf) + old, p, n)
        return 0

    cdef int _compact(self) except -1:
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self._buf)
        cdef Py_ssize_t pending = size - self._off
        if pending == 0:
            PyByteArray_Resize(self._buf, 0)
            self._off = 0
        elif self._off >= 65536 or self._off >= pending:
            # Amortized: the bytes moved are at most the bytes consumed since the last compaction.
            memmove(PyByteArray_AS_STRING(self._buf), PyByteArray_AS_STRING(self._buf) + self._off, pending)
            PyByteArray_Resize(self._buf, pending)
            self._off = 0
        return 0

    def feed(self, chunk):
        """Take the next bytes of the stream; returns the commands completed by them (possibly none)."""
        cdef Py_buffer view
        cdef const unsigned char* p
        cdef Py_ssize_t n, consumed
        cdef list commands = []
        if self._error is not None:
            raise FrameError(f"decoder failed earlier: {self._error}")
        if self._feeding:  # e.g. from a finalizer run by the GC mid-feed: the buffer must not move under us
            raise RuntimeError("FrameDecoder.feed() is not re-entrant")
        _get_buffer(chunk, &view)
        self._watched = None
        self._feeding = True
        try:
            p = <const unsigned char*>view.buf
            n = view.len
            if PyByteArray_GET_SIZE(self._buf) == self._off:
                # Nothing pending: decode straight from the chunk, keep only its incomplete tail.
                consumed = self._scan(p, n, commands)
                PyByteArray_Resize(self._buf, 0)
                self._off = 0
                if consumed < n:
                    self._append(p + consumed, n - consumed)
            else:
                self._append(p, n)
                self._off += self._scan(<const unsigned char*>PyByteArray_AS_STRING(self._buf) + self._off,
                                        PyByteArray_GET_SIZE(self._buf) - self._off, commands)
                self._compact()
        except BaseException as exc:
            self._error = str(exc) or type(exc).__name__
            PyByteArray_Resize(self._buf, 0)
            self._off = 0
            if isinstance(exc, FrameError):
                exc.commands = commands
            raise
        finally:
            self._feeding = False
            PyBuffer_Release(&view)
        return commands


@cython.final
cdef class AnswerTemplate:
    """An encoded answer frame in which only the opaque changes (twin: engine.codec._frame_py.AnswerTemplate).

    ``frame`` writes the whole answer into one new bytes object: the length words, the header up to the opaque,
    the opaque (int32 or decimal text) and the rest. Bounds: the constructor checks ``h1`` holds the 8-byte prefix,
    and the output is allocated at exactly the size the copies fill.
    """

    cdef bytes _h1
    cdef bytes _h2
    cdef int _kind  # -1: int32 slot; else the serialize-type byte of a decimal-text slot

    def __init__(self, h1, h2, kind):
        if type(h1) is not bytes or type(h2) is not bytes:
            raise TypeError("h1 and h2 must be bytes")
        if kind is not None and not (type(kind) is int and 0 <= kind <= 255):
            raise ValueError(f"kind must be None or a byte value, not {echo(repr(kind))}")
        if len(h1) < 8 or len(h1) + len(h2) + 11 - 8 > 0xFFFFFF:
            raise ValueError(f"h1 must hold the 8-byte prefix and the header fit 24 bits ({len(h1)}+{len(h2)} bytes)")
        self._h1 = h1
        self._h2 = h2
        self._kind = -1 if kind is None else kind

    def frame(self, opaque):
        """The answer frame carrying ``opaque`` (an int32; OverflowError otherwise)."""
        cdef int64_t v = opaque  # OverflowError past int64, TypeError for a non-integer
        if v < -0x80000000 or v > 0x7FFFFFFF:
            raise OverflowError(f"opaque {opaque} does not fit an int32")
        cdef char digits[12]
        cdef Py_ssize_t nd = 0, i
        cdef uint64_t u
        cdef Py_ssize_t n1 = PyBytes_GET_SIZE(self._h1), n2 = PyBytes_GET_SIZE(self._h2)
        cdef const char* h1 = PyBytes_AS_STRING(self._h1)
        cdef uint32_t word = <uint32_t>v
        cdef Py_ssize_t total
        cdef uint32_t hlen, flen
        cdef char* p
        if self._kind < 0:
            out = PyBytes_FromStringAndSize(NULL, n1 + 4 + n2)
            p = PyBytes_AS_STRING(out)
            memcpy(p, h1, n1)
            p[n1] = <char>(word >> 24)
            p[n1 + 1] = <char>(word >> 16)
            p[n1 + 2] = <char>(word >> 8)
            p[n1 + 3] = <char>word
            memcpy(p + n1 + 4, PyBytes_AS_STRING(self._h2), n2)
            return out
        # decimal text, written backwards into digits[] (at most "-2147483648": 11 characters)
        u = <uint64_t>(-v) if v < 0 else <uint64_t>v
        while True:
            digits[11 - nd] = <char>(48 + u % 10)
            nd += 1
            u //= 10
            if u == 0:
                break
        if v < 0:
            digits[11 - nd] = 45  # '-'
            nd += 1
        total = n1 + nd + n2
        hlen = <uint32_t>(total - 8)
        flen = <uint32_t>(total - 4)
        out = PyBytes_FromStringAndSize(NULL, total)
        p = PyBytes_AS_STRING(out)
        p[0] = <char>(flen >> 24)
        p[1] = <char>(flen >> 16)
        p[2] = <char>(flen >> 8)
        p[3] = <char>flen
        p[4] = <char>self._kind
        p[5] = <char>(hlen >> 16)
        p[6] = <char>(hlen >> 8)
        p[7] = <char>hlen
        memcpy(p + 8, h1 + 8, n1 - 8)
        memcpy(p + n1, &digits[12 - nd], nd)
        memcpy(p + n1 + nd, PyBytes_AS_STRING(self._h2), n2)
        return out

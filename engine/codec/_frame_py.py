"""Pure-Python twin of ``engine.codec._frame``: the RocketMQ remoting frame codec (PROTOCOL.md 1 and 2).

This module is the readable reference: the Cython module follows it step by step and must give the same
results and raise the same errors (the same classes, and the same messages) for every input.

Wire frame: ``total_length`` (int32, excludes itself) | ``header_word`` (type << 24 | header_length) | header |
body. Headers are JSON (type 0, fastjson style) or ROCKETMQ binary (type 1).

Decoding rules that are ours rather than Java's, chosen to be strict where Java would misbehave and lenient where
real clients differ (all documented in tests/test_frame.py):

* The JSON header must be standard JSON (RFC 8259): fastjson's unquoted keys, single quotes and extra commas are
  refused; no client sends them. Nesting deeper than ``MAX_JSON_DEPTH`` is refused.
* ``code``, ``flag``, ``opaque``, ``version``: a JSON integer or a string ``[+-]?[0-9]+`` within int32; ``null`` or
  absent is 0. ``language``: a name, an ordinal or ``null``; unknown values give None, absent gives JAVA (the Java
  field default). ``remark`` and ext-field values that are neither strings nor null become their raw JSON text.
* ROCKETMQ: an ext entry with a zero-length key is skipped (Java would store a null key); its value is still
  checked. Zero-length values and remarks decode to None, as Java's ``readStr`` does.
* Encoding a string that holds lone surrogates writes ``?`` for each (what Java's UTF-8 encoder does), and a
  surrogate pair held as two code points as the one character it stands for.
"""
import operator
import os
import re
import struct

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

_CANONICAL_INT = re.compile(rb"-?(?:0|[1-9][0-9]{0,9})")

#: Deepest JSON nesting a header may have (the header object itself is depth 1).
MAX_JSON_DEPTH = 64
#: Largest header the 24-bit length of the header word can describe.
MAX_HEADER_LENGTH = 0xFFFFFF
#: Fixed part of a ROCKETMQ header: code 2, language 1, version 2, opaque 4, flag 4, remark_len 4, ext_len 4.
ROCKETMQ_FIXED_LENGTH = 21

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body", "serialize_type")
_LANGUAGE_BY_ORDINAL = {m.value: m for m in LanguageCode}
_SERIALIZE_TYPE_NAMES = ("JSON", "ROCKETMQ")


# ---------------------------------------------------------------------------------------------------------------
# Field validation (constructor and encode)


def _int32(name, value):
    if type(value) is not int:
        value = int(operator.index(value))  # TypeError for non-integers; IntEnum members become plain ints
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{name} must be an int32, got {value}")
    return value


def _language(value):
    if value is None or type(value) is LanguageCode:
        return value
    if isinstance(value, str):
        member = LANGUAGE_BY_NAME.get(value)
        if member is None:
            raise ValueError(f"unknown language {echo(value)}")
        return member
    ordinal = int(operator.index(value))
    member = _LANGUAGE_BY_ORDINAL.get(ordinal)
    if member is None:
        raise ValueError(f"unknown language {ordinal}")
    return member


def _remark(value):
    if value is not None and not isinstance(value, str):
        raise TypeError(f"remark must be a str or None, got {type(value).__name__}")
    return value


def _ext_fields(value):
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"ext_fields must be a dict or None, got {type(value).__name__}")
    return value


def _body(value):
    if value is None:
        return b""
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"body must be bytes, got {type(value).__name__}")


def _serialize_type(value):
    if isinstance(value, str):
        if value == "JSON":
            return "JSON"
        if value == "ROCKETMQ":
            return "ROCKETMQ"
        raise ValueError(f"unknown serialize type {echo(value)}")
    ordinal = int(operator.index(value))  # SerializeType members and 0/1
    if ordinal == 0 or ordinal == 1:
        return _SERIALIZE_TYPE_NAMES[ordinal]
    raise ValueError(f"unknown serialize type {ordinal}")


def _max_frame_size(value):
    if type(value) is not int:
        value = int(operator.index(value))
    if value < 8:
        raise ValueError(f"max_frame_size must be at least 8, got {value}")
    return value


def _as_buffer(data):
    """A flat byte view of any C-contiguous bytes-like object."""
    try:
        return memoryview(data).cast("B")
    except TypeError:
        raise TypeError(f"expected a contiguous bytes-like object, got {type(data).__name__}") from None


# ---------------------------------------------------------------------------------------------------------------
# RemotingCommand


class RemotingCommand:
    """One remoting command: header fields plus body. Mutable; encode() validates every field again."""

    __slots__ = _FIELDS

    def __init__(
        self,
        code,
        *,
        language=LanguageCode.JAVA,
        version=BROKER_VERSION,
        opaque=0,
        flag=0,
        remark=None,
        ext_fields=None,
        body=b"",
        serialize_type="JSON",
    ):
        self.code = _int32("code", code)
        self.language = _language(language)
        self.version = _int32("version", version)
        self.opaque = _int32("opaque", opaque)
        self.flag = _int32("flag", flag)
        self.remark = _remark(remark)
        self.ext_fields = _ext_fields(ext_fields)
        self.body = _body(body)
        self.serialize_type = _serialize_type(serialize_type)

    @property
    def is_response(self):
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self):
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code=0, remark=None, ext_fields=None, body=b""):
        """The response to this request: flag RESPONSE, the request's opaque and serialize type (PROTOCOL.md 2.6)."""
        return RemotingCommand(
            code,
            language=LanguageCode.JAVA,
            version=BROKER_VERSION,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
            serialize_type=self.serialize_type,
        )

    def encode(self):
        """The whole frame (length prefix included), header serialized as ``serialize_type`` says."""
        code = _int32("code", self.code)
        language = _language(self.language)
        version = _int32("version", self.version)
        opaque = _int32("opaque", self.opaque)
        flag = _int32("flag", self.flag)
        remark = _remark(self.remark)
        entries = _ext_entries(_ext_fields(self.ext_fields))
        body = _body(self.body)
        if _serialize_type(self.serialize_type) == "JSON":
            return _frame(0, _json_header(code, language, version, opaque, flag, remark, entries), body)
        return _frame(1, _rocketmq_header(code, language, version, opaque, flag, remark, entries), body)

    def to_dict(self):
        """The fields as a plain dict (language by name), for parity tests and tools."""
        out = {name: getattr(self, name) for name in _FIELDS}
        if isinstance(self.language, LanguageCode):
            out["language"] = self.language.name
        if isinstance(self.ext_fields, dict):
            out["ext_fields"] = dict(self.ext_fields)
        return out

    def __eq__(self, other):
        if not isinstance(other, _command_types()):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # mutable

    def __repr__(self):
        return _command_repr(self)


def _command_repr(cmd):
    language = cmd.language.name if isinstance(cmd.language, LanguageCode) else repr(cmd.language)
    remark = echo(cmd.remark) if isinstance(cmd.remark, str) else repr(cmd.remark)
    ext = repr(cmd.ext_fields)
    if len(ext) > 120:
        ext = f"<{len(cmd.ext_fields)} fields>"
    try:
        body = f"<{len(cmd.body)} bytes>"
    except TypeError:
        body = repr(cmd.body)
    return (
        f"RemotingCommand(code={cmd.code!r}, flag={cmd.flag!r}, opaque={cmd.opaque!r}, language={language}, "
        f"version={cmd.version!r}, serialize_type={cmd.serialize_type!r}, remark={remark}, ext_fields={ext}, "
        f"body={body})"
    )


_COMMAND_TYPES = None


def _command_types():
    """This class and, when it is built, the native one: equality works across implementations."""
    global _COMMAND_TYPES
    if _COMMAND_TYPES is None:
        try:
            from engine.codec._frame import RemotingCommand as native
        except ImportError:
            _COMMAND_TYPES = (RemotingCommand,)
        else:
            _COMMAND_TYPES = (RemotingCommand, native)
    return _COMMAND_TYPES


# ---------------------------------------------------------------------------------------------------------------
# Encoding

_JSON_ESCAPE = re.compile('[\x00-\x1f"\\\\\x7f-\x9f\u2028\u2029]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_SURROGATES = re.compile("[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


def _escape_char(match):
    c = match.group()
    return _SHORT_ESCAPES.get(c) or "\\u%04X" % ord(c)


def _json_string(text):
    """fastjson default-mode string (PROTOCOL.md 4.7): short escapes, uppercase \\uXXXX, the rest raw."""
    return '"' + _JSON_ESCAPE.sub(_escape_char, text) + '"'


def _fix_surrogate(match):
    s = match.group()
    if len(s) == 2:
        return chr(0x10000 + ((ord(s[0]) - 0xD800) << 10) + (ord(s[1]) - 0xDC00))
    return "?"


def _java_utf8(text):
    """UTF-8 as Java's String.getBytes writes it: a lone surrogate becomes '?'."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub(_fix_surrogate, text).encode("utf-8")


def _ext_entries(ext):
    """Sorted (key, value) pairs to write; entries with a None key or value are left out, as Java does."""
    if ext is None:
        return None
    entries = []
    for key, value in ext.items():
        if key is not None and not isinstance(key, str):
            raise TypeError(f"ext_fields keys must be str, got {type(key).__name__}")
        if value is not None and not isinstance(value, str):
            raise TypeError(f"ext_fields values must be str or None, got {type(value).__name__}")
        if key is not None and value is not None:
            entries.append((key, value))
    entries.sort()
    return entries


def _json_header(code, language, version, opaque, flag, remark, entries):
    # fastjson SortField order: code, extFields, flag, language, opaque, remark, serializeTypeCurrentRPC, version
    parts = ['{"code":', str(code)]
    if entries is not None:
        parts.append(',"extFields":{')
        parts.append(",".join(_json_string(k) + ":" + _json_string(v) for k, v in entries))
        parts.append("}")
    parts += [',"flag":', str(flag)]
    if language is not None:
        parts += [',"language":"', language.name, '"']
    parts += [',"opaque":', str(opaque)]
    if remark is not None:
        parts += [',"remark":', _json_string(remark)]
    parts += [',"serializeTypeCurrentRPC":"JSON","version":', str(version), "}"]
    return _java_utf8("".join(parts))


def _int16(value):
    return ((value + 0x8000) & 0xFFFF) - 0x8000  # Java (short) cast


def _rocketmq_header(code, language, version, opaque, flag, remark, entries):
    remark_bytes = _java_utf8(remark) if remark else b""
    ext = bytearray()
    for key, value in entries or ():
        key_bytes = _java_utf8(key)
        value_bytes = _java_utf8(value)
        if len(key_bytes) > 0x7FFF:
            raise ValueError(f"ext field key of {len(key_bytes)} bytes does not fit the int16 length")
        ext += struct.pack(">h", len(key_bytes)) + key_bytes + struct.pack(">i", len(value_bytes)) + value_bytes
    header_length = ROCKETMQ_FIXED_LENGTH + len(remark_bytes) + len(ext)
    if header_length > MAX_HEADER_LENGTH:
        raise ValueError(f"header of {header_length} bytes exceeds {MAX_HEADER_LENGTH} bytes")
    fixed = struct.pack(
        ">hBhiii",
        _int16(code),
        language.value if language is not None else 0,
        _int16(version),
        opaque,
        flag,
        len(remark_bytes),
    )
    return fixed + remark_bytes + struct.pack(">i", len(ext)) + bytes(ext)


def _frame(serialize_type, header, body):
    header_length = len(header)
    if header_length > MAX_HEADER_LENGTH:
        raise ValueError(f"header of {header_length} bytes exceeds {MAX_HEADER_LENGTH} bytes")
    total = 4 + header_length + len(body)
    if total > _INT32_MAX:
        raise ValueError(f"frame of {total} bytes does not fit the int32 length")
    return struct.pack(">ii", total, (serialize_type << 24) | header_length) + header + body


# ---------------------------------------------------------------------------------------------------------------
# Decoding: frame level


def _check_length(total, max_frame_size):
    """The length prefix, checked as soon as its 4 bytes are in (Netty LengthFieldBasedFrameDecoder)."""
    if total < 0:
        raise FrameError(f"negative frame length {total}")
    if total + 4 > max_frame_size:
        raise FrameError(f"frame length {total} exceeds the max frame size {max_frame_size}")
    if total < 4:
        raise FrameError(f"frame length {total} leaves no room for the header word")


def _check_header_word(word, total):
    header_length = word & 0xFFFFFF
    if header_length > total - 4:
        raise FrameError(f"bad header length {header_length} for frame length {total}")
    serialize_type = word >> 24
    if serialize_type > 1:
        raise FrameError(f"unknown serialize type {serialize_type}")


def decode_frame(frame, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
    """Decode exactly one whole frame (4-byte length prefix included) into a RemotingCommand."""
    view = _as_buffer(frame)
    limit = _max_frame_size(max_frame_size)
    size = len(view)
    if size < 4:
        raise FrameError(f"truncated frame: {size} bytes, the length prefix needs 4")
    total = int.from_bytes(view[:4], "big", signed=True)
    _check_length(total, limit)
    if total + 4 != size:
        raise FrameError(f"frame length {total} does not match the {size - 4} bytes after the prefix")
    word = int.from_bytes(view[4:8], "big")
    _check_header_word(word, total)
    return _decode_command(bytes(view), word)


def _decode_command(frame, word):
    """``frame`` is one whole frame whose length and header word are already checked."""
    header_end = 8 + (word & 0xFFFFFF)
    if word >> 24 == 0:
        cmd = _decode_json_header(frame, header_end)
        cmd.serialize_type = "JSON"
    else:
        cmd = _decode_rocketmq_header(frame, header_end)
        cmd.serialize_type = "ROCKETMQ"
    cmd.body = frame[header_end:]
    return cmd


def _blank_command():
    cmd = RemotingCommand.__new__(RemotingCommand)
    cmd.code = cmd.flag = cmd.opaque = cmd.version = 0
    cmd.language = LanguageCode.JAVA
    cmd.remark = cmd.ext_fields = None
    return cmd


def _fail(what, at, frame, end):
    """FrameError naming the byte offset in the frame and echoing a short piece of the input there."""
    if at < end:
        raise FrameError(f"{what} at byte {at} near {echo(frame[at : min(end, at + MAX_ECHO)])}")
    raise FrameError(f"{what} at byte {at}")


def _utf8(frame, start, stop, end):
    piece = frame[start:stop]
    if piece.isascii():
        return piece.decode("ascii")
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail("invalid UTF-8", start + exc.start, frame, end)


# ---------------------------------------------------------------------------------------------------------------
# Decoding: JSON header (a small strict JSON scanner that keeps byte offsets and raw token text)

_STRING = 0
_NUMBER = 1
_OBJECT = 2
_ARRAY = 3
_TRUE = 4
_FALSE = 5
_NULL = 6
_LITERALS = {0x74: (b"true", _TRUE), 0x66: (b"false", _FALSE), 0x6E: (b"null", _NULL)}

_WS_RUN = re.compile(rb"[ \t\n\r]*")
_PLAIN_RUN = re.compile(rb'[^"\\\x00-\x1f]*')
_NUMBER_TOKEN = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_INT_STRING = re.compile(r"([+-]?)([0-9]+)")
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x62: "\b", 0x66: "\f", 0x6E: "\n", 0x72: "\r", 0x74: "\t"}
_INT_FIELDS = frozenset(("code", "flag", "opaque", "version"))


def _small_int(sign, digits):
    """int(sign + digits) when it can be an int32, else None (also avoids int()'s digit limit)."""
    digits = digits.lstrip(b"0" if isinstance(digits, bytes) else "0")
    if len(digits) > 10:
        return None
    value = int(digits) if digits else 0
    value = -value if sign in ("-", b"-") else value
    return value if _INT32_MIN <= value <= _INT32_MAX else None


class _JsonScanner:
    __slots__ = ("s", "pos", "end")

    def __init__(self, frame, end):
        self.s = frame
        self.pos = 8
        self.end = end

    def fail(self, what, at):
        _fail(what, at, self.s, self.end)

    def ws(self):
        self.pos = _WS_RUN.match(self.s, self.pos, self.end).end()

    def expect(self, char, what):
        if self.pos >= self.end:
            self.fail("unexpected end of JSON header", self.end)
        if self.s[self.pos] != char:
            self.fail(what, self.pos)
        self.pos += 1

    def peek_is(self, char):
        return self.pos < self.end and self.s[self.pos] == char

    def key(self):
        if self.pos >= self.end:
            self.fail("unexpected end of JSON header", self.end)
        if self.s[self.pos] != 0x22:
            self.fail("expected a string key", self.pos)
        key = self.string()
        self.ws()
        self.expect(0x3A, "expected ':'")
        self.ws()
        return key

    def after_member(self, close, what):
        """Skip ',' (True: another member follows) or the closing bracket (False)."""
        self.ws()
        if self.pos >= self.end:
            self.fail("unexpected end of JSON header", self.end)
        c = self.s[self.pos]
        self.pos += 1
        if c == 0x2C:
            self.ws()
            return True
        if c == close:
            return False
        self.fail(what, self.pos - 1)

    def string(self):
        """Decode the string at pos (an opening quote)."""
        s, end, start = self.s, self.end, self.pos
        i = start + 1
        parts = []
        while True:
            j = _PLAIN_RUN.match(s, i, end).end()
            if j > i:
                parts.append(_utf8(s, i, j, end))
            if j >= end:
                self.fail("unterminated string", start)
            c = s[j]
            if c == 0x22:
                self.pos = j + 1
                return "".join(parts)
            if c != 0x5C:
                self.fail("control character in string", j)
            i = self.escape(j, start, parts)

    def hex4(self, i):
        if i + 4 > self.end:
            return None
        digits = self.s[i : i + 4]
        if all(c in _HEX_DIGITS for c in digits):
            return int(digits, 16)
        return None

    def escape(self, j, start, parts):
        """Decode the escape at j (a backslash) into parts; returns the offset after it."""
        s, end = self.s, self.end
        if j + 1 >= end:
            self.fail("unterminated string", start)
        c = s[j + 1]
        simple = _SIMPLE_ESCAPES.get(c)
        if simple is not None:
            parts.append(simple)
            return j + 2
        if c != 0x75:
            self.fail("invalid escape", j)
        cp = self.hex4(j + 2)
        if cp is None:
            self.fail("invalid escape", j)
        if 0xD800 <= cp <= 0xDBFF:
            if s.startswith(b"\\u", j + 6, end):
                low = self.hex4(j + 8)
                if low is None:
                    self.fail("invalid escape", j + 6)
                if 0xDC00 <= low <= 0xDFFF:
                    parts.append(chr(0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)))
                    return j + 12
            self.fail("lone surrogate", j)
        if 0xDC00 <= cp <= 0xDFFF:
            self.fail("lone surrogate", j)
        parts.append(chr(cp))
        return j + 6

    def value(self, depth):
        """Scan one value inside a container at ``depth``: (kind, start, stop, decoded string or integral flag)."""
        s, end, start = self.s, self.end, self.pos
        if start >= end:
            self.fail("unexpected end of JSON header", end)
        c = s[start]
        if c == 0x22:
            text = self.string()
            return _STRING, start, self.pos, text
        if c == 0x7B or c == 0x5B:
            self.skip_container(depth + 1)
            return (_OBJECT if c == 0x7B else _ARRAY), start, self.pos, None
        if c == 0x2D or 0x30 <= c <= 0x39:
            m = _NUMBER_TOKEN.match(s, start, end)
            if m is None:
                self.fail("invalid number", start)
            self.pos = m.end()
            return _NUMBER, start, self.pos, m.group(1) is None and m.group(2) is None
        literal = _LITERALS.get(c)
        if literal is not None and s.startswith(literal[0], start, end):
            self.pos = start + len(literal[0])
            return literal[1], start, self.pos, None
        self.fail("invalid JSON value", start)

    def skip_container(self, depth):
        if depth > MAX_JSON_DEPTH:
            self.fail(f"JSON nesting deeper than {MAX_JSON_DEPTH}", self.pos)
        is_object = self.s[self.pos] == 0x7B
        close = 0x7D if is_object else 0x5D
        self.pos += 1
        self.ws()
        if self.peek_is(close):
            self.pos += 1
            return
        what = "expected ',' or '}'" if is_object else "expected ',' or ']'"
        while True:
            if is_object:
                self.key()
            self.value(depth)
            if not self.after_member(close, what):
                return

    def ext_fields(self):
        """The extFields object at pos (depth 2): values stringified the Java way, null kept as None."""
        fields = {}
        self.pos += 1
        self.ws()
        if self.peek_is(0x7D):
            self.pos += 1
            return fields
        count = 0
        while True:
            count += 1
            if count > MAX_EXT_FIELDS:
                self.fail(f"more than {MAX_EXT_FIELDS} ext fields", self.pos)
            key = self.key()
            kind, start, stop, text = self.value(2)
            if kind == _STRING:
                fields[key] = text
            elif kind == _NULL:
                fields[key] = None
            else:  # numbers, booleans, containers: their source text (String.valueOf for ints and booleans)
                fields[key] = self.s[start:stop].decode("utf-8")
            if not self.after_member(0x7D, "expected ',' or '}'"):
                return fields


def _int_field(scanner, name, token):
    kind, start, stop, extra = token
    value = None
    if kind == _NUMBER and extra:
        token_text = scanner.s[start:stop]
        negative = token_text[:1] == b"-"
        value = _small_int(b"-" if negative else b"", token_text[1:] if negative else token_text)
    elif kind == _STRING:
        m = _INT_STRING.fullmatch(extra)
        if m is not None:
            value = _small_int(m.group(1), m.group(2))
    elif kind == _NULL:
        value = 0
    if value is None:
        scanner.fail(f"'{name}' is not an int32", start)
    return value


def _language_field(scanner, token):
    kind, start, stop, extra = token
    if kind == _STRING:
        return LANGUAGE_BY_NAME.get(extra)
    if kind == _NULL:
        return None
    if kind == _NUMBER and extra:
        token_text = scanner.s[start:stop]
        negative = token_text[:1] == b"-"
        ordinal = _small_int(b"-" if negative else b"", token_text[1:] if negative else token_text)
        return None if ordinal is None else _LANGUAGE_BY_ORDINAL.get(ordinal)
    scanner.fail("'language' is not a name or an ordinal", start)


def _decode_json_header(frame, end):
    sc = _JsonScanner(frame, end)
    cmd = _blank_command()
    sc.ws()
    if sc.pos >= end:
        sc.fail("empty JSON header", sc.pos)
    if frame[sc.pos] != 0x7B:
        sc.fail("JSON header is not an object", sc.pos)
    sc.pos += 1
    sc.ws()
    if sc.peek_is(0x7D):
        sc.pos += 1
    else:
        while True:
            key = sc.key()
            if key == "extFields" and sc.peek_is(0x7B):
                cmd.ext_fields = sc.ext_fields()
            else:
                token = sc.value(1)
                if key in _INT_FIELDS:
                    setattr(cmd, key, _int_field(sc, key, token))
                elif key == "language":
                    cmd.language = _language_field(sc, token)
                elif key == "remark":
                    kind, start, stop, text = token
                    if kind == _STRING:
                        cmd.remark = text
                    elif kind == _NULL:
                        cmd.remark = None
                    else:
                        cmd.remark = frame[start:stop].decode("utf-8")
                elif key == "extFields":
                    if token[0] != _NULL:
                        sc.fail("'extFields' is not an object", token[1])
                    cmd.ext_fields = None
                # anything else (serializeTypeCurrentRPC included: the header word decides) is ignored
            if not sc.after_member(0x7D, "expected ',' or '}'"):
                break
    sc.ws()
    if sc.pos < end:
        sc.fail("trailing data after the JSON header", sc.pos)
    return cmd


# ---------------------------------------------------------------------------------------------------------------
# Decoding: ROCKETMQ binary header (bounded by header_length, unlike Java's decoder)


def _decode_rocketmq_header(frame, end):
    if end - 8 < ROCKETMQ_FIXED_LENGTH:
        _fail(f"ROCKETMQ header of {end - 8} bytes is shorter than {ROCKETMQ_FIXED_LENGTH}", 8, frame, end)
    code, language, version, opaque, flag, remark_length = struct.unpack_from(">hBhiii", frame, 8)
    cmd = _blank_command()
    cmd.code, cmd.version, cmd.opaque, cmd.flag = code, version, opaque, flag
    cmd.language = _LANGUAGE_BY_ORDINAL.get(language)
    if remark_length < 0:
        _fail(f"negative remark length {remark_length}", 21, frame, end)
    if remark_length > end - 29:  # the remark must leave room for the 4-byte ext length
        _fail(f"remark length {remark_length} exceeds the header", 21, frame, end)
    pos = 25 + remark_length
    cmd.remark = _utf8(frame, 25, pos, end) if remark_length else None
    (ext_length,) = struct.unpack_from(">i", frame, pos)
    if ext_length < 0:
        _fail(f"negative ext fields length {ext_length}", pos, frame, end)
    if ext_length > end - pos - 4:
        _fail(f"ext fields length {ext_length} exceeds the header", pos, frame, end)
    pos += 4
    ext_end = pos + ext_length
    if ext_length:
        fields = {}
        count = 0
        while pos < ext_end:
            count += 1
            if count > MAX_EXT_FIELDS:
                _fail(f"more than {MAX_EXT_FIELDS} ext fields", pos, frame, end)
            if ext_end - pos < 2:
                _fail("truncated ext field key length", pos, frame, end)
            (key_length,) = struct.unpack_from(">h", frame, pos)
            if key_length < 0:
                _fail(f"negative ext field key length {key_length}", pos, frame, end)
            if key_length > ext_end - pos - 2:
                _fail(f"ext field key length {key_length} overruns the ext fields", pos, frame, end)
            pos += 2
            key = _utf8(frame, pos, pos + key_length, end) if key_length else None
            pos += key_length
            if ext_end - pos < 4:
                _fail("truncated ext field value length", pos, frame, end)
            (value_length,) = struct.unpack_from(">i", frame, pos)
            if value_length < 0:
                _fail(f"negative ext field value length {value_length}", pos, frame, end)
            if value_length > ext_end - pos - 4:
                _fail(f"ext field value length {value_length} overruns the ext fields", pos, frame, end)
            pos += 4
            value = _utf8(frame, pos, pos + value_length, end) if value_length else None
            pos += value_length
            if key is not None:  # a zero-length key (Java: a null key) is skipped
                fields[key] = value
        cmd.ext_fields = fields
    if pos != end:
        _fail("extra bytes after the ROCKETMQ header", pos, frame, end)
    return cmd


# ---------------------------------------------------------------------------------------------------------------
# Streaming



# ---------------------------------------------------------------------------------------------------------------
# Repeats: a request whose frame equals an earlier one's but for the opaque (a client's heartbeat, sent again)

#: opaques a derived pattern is checked with: the shortest and the longest text forms, of both signs
_REPEAT_CHECKS = (0, 2147483647, -2147483648)
_REPEAT_FIELDS = ("code", "language", "version", "flag", "remark", "ext_fields", "body", "serialize_type")


def repeat_pattern(frame, decode):
    """``(serialize byte, text, header prefix, header suffix, body)`` of one whole request frame: the frame with
    its opaque cut out (decimal text in a JSON header, an int32 in a ROCKETMQ one), or None when the opaque cannot
    be located unambiguously. ``decode`` is the implementation's decode_frame: the pattern is used only if frames
    filled in from it with a set of other opaques decode to the same command but for the opaque. The native
    decoder has its own (engine.codec._frame._repeat_pattern); the parity tests compare the two."""
    frame = bytes(frame)
    try:
        cmd = decode(frame)
    except FrameError:
        return None
    word = int.from_bytes(frame[4:8], "big")
    kind, hlen = word >> 24, word & 0xFFFFFF
    header, body = frame[8:8 + hlen], frame[8 + hlen:]
    if kind == 0:
        key = b'"opaque":'
        i = header.find(key)
        if i < 0 or header.find(key, i + 1) >= 0:
            return None
        j = i + len(key)
        digits = b"%d" % cmd.opaque
        if header[j:j + len(digits)] != digits or header[j + len(digits):j + len(digits) + 1].isdigit():
            return None
        pattern = (kind, True, header[:j], header[j + len(digits):], body)
    else:
        if hlen < 9 or header[5:9] != cmd.opaque.to_bytes(4, "big", signed=True):
            return None
        pattern = (kind, False, header[:5], header[9:], body)
    want = [getattr(cmd, name) for name in _REPEAT_FIELDS]
    for opaque in _REPEAT_CHECKS:
        try:
            other = decode(repeat_frame(pattern, opaque))
        except FrameError:
            return None
        if other.opaque != opaque or [getattr(other, name) for name in _REPEAT_FIELDS] != want:
            return None
    return pattern


def repeat_frame(pattern, opaque) -> bytes:
    """The frame of ``pattern`` carrying ``opaque``."""
    kind, text, prefix, suffix, body = pattern
    slot = b"%d" % opaque if text else opaque.to_bytes(4, "big", signed=True)
    hlen = len(prefix) + len(slot) + len(suffix)
    return ((4 + hlen + len(body)).to_bytes(4, "big") + ((kind << 24) | hlen).to_bytes(4, "big") + prefix + slot
            + suffix + body)


def _repeat_opaque(pattern, frame, word, sets=None):
    """The opaque of ``frame`` (a whole frame, length and header word checked) if it repeats ``pattern``, else None.

    Text opaques are taken only in canonical form (no sign on 0, no leading zeros) and within int32: exactly the
    inputs on which the JSON decoder yields that number, so a repeat decodes to the pattern's command. ``sets``:
    the pattern body's :func:`body_digest`, and then a body of the same length with that digest repeats it too
    (the same heartbeat, its sets in another order)."""
    kind, text, prefix, suffix, body = pattern
    if word >> 24 != kind:
        return None
    hlen = word & 0xFFFFFF
    if len(frame) - 8 - hlen != len(body):
        return None
    np_, ns = len(prefix), len(suffix)
    nd = hlen - np_ - ns
    if (text and not 1 <= nd <= 11) or (not text and nd != 4):
        return None
    if frame[8:8 + np_] != prefix or frame[8 + np_ + nd:8 + hlen] != suffix:
        return None
    if frame[8 + hlen:] != body and (sets is None or body_digest(frame[8 + hlen:]) != sets):
        return None
    slot = frame[8 + np_:8 + np_ + nd]
    if not text:
        return int.from_bytes(slot, "big", signed=True)
    if not _CANONICAL_INT.fullmatch(slot) or slot == b"-0":
        return None
    value = int(slot)
    return value if _INT32_MIN <= value <= _INT32_MAX else None


# ---------------------------------------------------------------------------------------------------------------
# The body digest of a repeat armed with sets=True (a heartbeat's sets in another order)

#: nesting a body may have and still be digested (the top-level value is depth 1); deeper: no digest
MAX_DIGEST_DEPTH = 32
#: array elements a digest holds at once (the elements of the arrays open around a point); more: no digest
MAX_DIGEST_ELEMENTS = 1 << 16
#: members whose value keys an object within an array (ProducerData / ConsumerData groupName, SubscriptionData topic)
DIGEST_SET_KEYS = (b"groupName", b"topic")
_MASK64 = (1 << 64) - 1
_OFFSET64 = 0xCBF29CE484222325
_PRIME64 = 0x100000001B3
_GOLDEN64 = 0x9E3779B97F4A7C15
_MUL64 = 0x9FB21C651E98DF25
#: the digest's seed, random per process (the native module takes it from here: both give the same digests)
DIGEST_SEED = int.from_bytes(os.urandom(8), "little")
_T_STR, _T_ATOM, _T_KEY, _T_OBJ, _T_SET, _T_LIST = 1, 2, 3, 4, 5, 6
_D_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')
_D_ATOM = re.compile(rb"[0-9A-Za-z+\-.]+")
_D_SPACE = re.compile(rb"[ \t\r\n]*")


class _NoDigest(Exception):
    pass


def _fmix64(h: int) -> int:
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK64
    return h ^ (h >> 31)


def _mix64(h: int, w: int) -> int:
    return ((h ^ w) * _PRIME64) & _MASK64


def _leaf(tag: int, raw: bytes) -> int:
    """A string's or an atom's word: its bytes as little-endian 64-bit words (the last one zero-padded), each xored
    in and mixed (a multiply by an odd constant and an xorshift: both bijective, so two leaves of one length that
    differ in one word never collide), from the seed, the length and the tag."""
    n = len(raw)
    h = DIGEST_SEED ^ ((n * _PRIME64) & _MASK64) ^ ((tag * _GOLDEN64) & _MASK64)
    for i in range(0, n, 8):
        h = ((h ^ int.from_bytes(raw[i:i + 8], "little")) * _MUL64) & _MASK64
        h ^= h >> 29
    return _fmix64(h)


def _d_skip(b: bytes, i: int) -> int:
    return _D_SPACE.match(b, i).end()


def _d_string(b: bytes, i: int) -> int:
    m = _D_STRING.match(b, i)
    if m is None:  # unterminated, or an escape or a control byte inside: not digested
        raise _NoDigest
    return m.end()


def _d_value(b: bytes, i: int, depth: int, held: list):
    """(digest, end, key) of the JSON value at b[i] (no space before it); key: what makes it distinct in a set."""
    if i >= len(b):
        raise _NoDigest
    c = b[i]
    if c == 0x22:
        j = _d_string(b, i)
        h = _leaf(_T_STR, b[i + 1:j - 1])
        return h, j, h
    if c == 0x7B or c == 0x5B:
        if depth > MAX_DIGEST_DEPTH:
            raise _NoDigest
        return (_d_object if c == 0x7B else _d_array)(b, _d_skip(b, i + 1), depth, held)
    m = _D_ATOM.match(b, i)
    if m is None:
        raise _NoDigest
    h = _leaf(_T_ATOM, b[i:m.end()])
    return h, m.end(), h


def _d_object(b: bytes, i: int, depth: int, held: list):
    """Members in order; the key is the value of its one groupName or topic member (two of them: not digested)."""
    h, n, key, end = _mix64(_OFFSET64, _T_OBJ), 0, None, len(b)
    if i < end and b[i] == 0x7D:
        h = _fmix64(_mix64(h, 0))
        return h, i + 1, h
    while True:
        if i >= end or b[i] != 0x22:
            raise _NoDigest
        j = _d_string(b, i)
        name = b[i + 1:j - 1]
        i = _d_skip(b, j)
        if i >= end or b[i] != 0x3A:
            raise _NoDigest
        vh, i, _ = _d_value(b, _d_skip(b, i + 1), depth + 1, held)
        if name in DIGEST_SET_KEYS:
            if key is not None:
                raise _NoDigest
            key = vh
        h = _mix64(_mix64(h, _leaf(_T_KEY, name)), vh)
        n += 1
        i = _d_skip(b, i)
        if i < end and b[i] == 0x2C:
            i = _d_skip(b, i + 1)
            continue
        if i < end and b[i] == 0x7D:
            h = _fmix64(_mix64(h, n))
            return h, i + 1, (h if key is None else key)
        raise _NoDigest


def _d_array(b: bytes, i: int, depth: int, held: list):
    """A set (the wrapping sum of its elements' finalized digests) when its elements' keys are distinct, else a
    list (its elements in order): a duplicate key's order can decide which element wins."""
    total, ordered, keys, end = 0, _mix64(_OFFSET64, _T_LIST), [], len(b)
    if not (i < end and b[i] == 0x5D):
        while True:
            eh, i, k = _d_value(b, i, depth + 1, held)
            total = (total + _fmix64(eh)) & _MASK64
            ordered = _mix64(ordered, eh)
            keys.append(k)
            held[0] += 1  # the native module's key stack
            if held[0] > MAX_DIGEST_ELEMENTS:
                raise _NoDigest
            i = _d_skip(b, i)
            if i < end and b[i] == 0x2C:
                i = _d_skip(b, i + 1)
                continue
            if i < end and b[i] == 0x5D:
                break
            raise _NoDigest
    n = len(keys)
    held[0] -= n
    if len(set(keys)) == n:
        h = _fmix64(_mix64(_mix64(_mix64(_OFFSET64, _T_SET), n), total))
    else:
        h = _fmix64(_mix64(ordered, n))
    return h, i + 1, h


def body_digest(body) -> int | None:
    """64-bit digest of a JSON body in which every array whose elements have distinct keys is digested as a set
    (order-free), or None where the body is not digested (not JSON, an escape or a control byte in a string,
    nesting past MAX_DIGEST_DEPTH, more than MAX_DIGEST_ELEMENTS elements in the arrays open at one point, an
    object with two key members).

    Java clients write a heartbeat's sets (producers, consumers, subscriptions, tags, codes) in HashSet order, which
    changes between heartbeats of the same registration; two bodies with the same digest are the same heartbeat
    but for that order. An element's key is its groupName or topic (an object's), else the element itself, so a
    set with a duplicate group or topic, whose order could decide which one wins, is digested in order. Strings
    are compared as their raw bytes (an escape: no digest), so equal digests mean equal decoded values. The
    digest is seeded per process (DIGEST_SEED). It is not a cryptographic hash: a client that found a collision
    would only have its own changed heartbeat taken as a repeat of its own previous one, which it could as well
    not have sent."""
    b = bytes(_as_buffer(body))
    try:
        h, i, _ = _d_value(b, _d_skip(b, 0), 1, [0])
    except _NoDigest:
        return None
    return h if _d_skip(b, i) == len(b) else None


class FrameDecoder:
    """Incremental decoder for one connection: feed() bytes as they arrive, get every complete command back.

    The length prefix is checked as soon as its 4 bytes are in, the header word as soon as its 4 are: a bad
    length is refused before its frame is buffered. After an error the decoder stays failed: every later
    feed() raises FrameError (the connection is to be closed). The error raised by feed() carries in
    ``commands`` the commands completed earlier in that same call.

    Repeats: with a pattern armed (:meth:`arm_repeat`), a frame equal to the armed one but for its opaque (and,
    armed with ``sets=True``, the order of its body's sets) is returned as that opaque (an int) instead of a
    command: the caller already knows the command. With
    ``watch_code`` set, :attr:`watched` is the last frame of that code which the latest feed() decoded in full
    (the one to arm from).
    """

    __slots__ = ("_buf", "_max", "_error", "_feeding", "_repeat", "_sets", "watch_code", "_watched")

    def __init__(self, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
        self._max = _max_frame_size(max_frame_size)
        self._buf = bytearray()
        self._error = None
        self._feeding = False
        self._repeat = None
        self._sets = None
        self.watch_code = None
        self._watched = None

    @property
    def watched(self):
        """The last frame (bytes) with code ``watch_code`` that the latest feed() decoded into a command, or None."""
        return self._watched

    def drop_watched(self) -> None:
        """Let go of :attr:`watched` (a copy of a whole frame) once the caller has decided on it: until the next
        feed() it would otherwise stay held for nothing."""
        self._watched = None

    @property
    def repeating(self) -> bool:
        return self._repeat is not None

    @property
    def repeat_body(self):
        """The armed frame's body (bytes), or None: a caller that keeps the same body can share this object."""
        return None if self._repeat is None else self._repeat[4]

    def arm_repeat(self, frame, sets: bool = False) -> bool:
        """Return later frames equal to ``frame`` but for the opaque as their opaque; False if it cannot be. With
        ``sets``, also those whose body differs from ``frame``'s only in the order of its sets (body_digest; a
        body without a digest: only equal bytes)."""
        self._repeat = repeat_pattern(frame, decode_frame)
        self._sets = body_digest(self._repeat[4]) if sets and self._repeat is not None else None
        return self._repeat is not None

    def disarm_repeat(self) -> None:
        self._repeat = None

    def repeat_command(self, opaque):
        """The command a repeat with ``opaque`` stands for (the armed frame decoded with that opaque; a repeat taken
        on its digest had its sets in another order)."""
        if self._repeat is None:
            raise ValueError("no repeat is armed")
        return decode_frame(repeat_frame(self._repeat, opaque), self._max)

    @property
    def buffered(self):
        """Bytes held for a frame not yet complete."""
        return len(self._buf)

    @property
    def max_frame_size(self):
        return self._max

    def feed(self, chunk):
        """Take the next bytes of the stream; returns the commands completed by them (possibly none)."""
        if self._error is not None:
            raise FrameError(f"decoder failed earlier: {self._error}")
        if self._feeding:  # as the native decoder, which must not have its buffer moved mid-feed
            raise RuntimeError("FrameDecoder.feed() is not re-entrant")
        view = _as_buffer(chunk)
        commands = []
        self._watched = None
        repeat, sets, watch = self._repeat, self._sets, self.watch_code
        self._feeding = True
        try:
            buf = self._buf
            buf += view
            off, size = 0, len(buf)
            while size - off >= 4:
                total = int.from_bytes(buf[off : off + 4], "big", signed=True)
                _check_length(total, self._max)
                if size - off < 8:
                    break
                word = int.from_bytes(buf[off + 4 : off + 8], "big")
                _check_header_word(word, total)
                if size - off < total + 4:
                    break
                frame = bytes(buf[off : off + total + 4])
                off += total + 4
                if repeat is not None:
                    opaque = _repeat_opaque(repeat, frame, word, sets)
                    if opaque is not None:
                        commands.append(opaque)
                        continue
                cmd = _decode_command(frame, word)
                if cmd.code == watch:
                    self._watched = frame
                commands.append(cmd)
            # Drop consumed bytes once per feed: deleting a bytearray's head is O(1) in CPython (it moves a
            # start offset), so a stream of small frames is never re-copied.
            if off:
                del buf[:off]
        except BaseException as exc:  # any failure mid-stream leaves the stream out of sync: fail for good
            self._error = str(exc) or type(exc).__name__
            self._buf = bytearray()
            if isinstance(exc, FrameError):
                exc.commands = commands
            raise
        finally:
            self._feeding = False
        return commands


class AnswerTemplate:
    """An encoded answer frame in which only the opaque changes from one request to the next.

    ``h1`` is the frame up to the opaque (its 8-byte length prefix included), ``h2`` the rest. ``kind`` None: the
    opaque is a big-endian int32 (ROCKETMQ header); else the opaque is decimal text in a JSON header and ``kind`` is
    the serialize-type byte, so the two length words are rebuilt for its digit count.
    :func:`engine.broker.processors.answer_template` builds one from the frame encoder and checks it before use.
    """

    __slots__ = ("_h1", "_h2", "_kind", "_fixed", "_heads")

    def __init__(self, h1: bytes, h2: bytes, kind):
        if type(h1) is not bytes or type(h2) is not bytes:
            raise TypeError("h1 and h2 must be bytes")
        if kind is not None and not (type(kind) is int and 0 <= kind <= 255):
            raise ValueError(f"kind must be None or a byte value, not {echo(repr(kind))}")
        if len(h1) < 8 or len(h1) + len(h2) + 11 - 8 > MAX_HEADER_LENGTH:
            raise ValueError(f"h1 must hold the 8-byte prefix and the header fit 24 bits ({len(h1)}+{len(h2)} bytes)")
        self._h1, self._h2 = h1, h2
        self._kind = kind
        self._fixed = len(h1) + len(h2) - 8  # header bytes besides the digits (h1 includes the 8-byte prefix)
        self._heads: dict[int, bytes] = {}  # digit count -> length words + header up to the opaque

    def frame(self, opaque) -> bytes:
        """The answer frame carrying ``opaque`` (an int32; OverflowError otherwise)."""
        if not _INT32_MIN <= operator.index(opaque) <= _INT32_MAX:
            raise OverflowError(f"opaque {opaque} does not fit an int32")
        if self._kind is None:
            return self._h1 + opaque.to_bytes(4, "big", signed=True) + self._h2
        digits = b"%d" % opaque
        head = self._heads.get(len(digits))
        if head is None:
            n = self._fixed + len(digits)
            head = self._heads[len(digits)] = (
                (n + 4).to_bytes(4, "big") + bytes((self._kind,)) + n.to_bytes(3, "big") + self._h1[8:])
        return head + digits + self._h2

"""HTTP/2 frames and gRPC message framing, the readable twin of pyx/http2/_frames.pyx (built as
``engine.http2._frames``): the per-frame and per-message work of the native transport (engine.http2.server).

Both give the same output or the same error (``FrameError``, defined here and shared, code and message word for
word) for the same input, however it is split; tests/test_h2frames.py and fuzz/fuzz_h2frames.py compare them.

* :class:`FrameReader`: bytes in, whole frames out; a frame longer than our SETTINGS_MAX_FRAME_SIZE is a
  FRAME_SIZE_ERROR of the connection (RFC 7540 §4.2), raised before its payload is buffered, so a peer cannot make
  the buffer grow past one frame. A partial frame grows in place (linear work however the bytes are split).
* :class:`MessageReader`: gRPC's length-prefixed messages (a flag byte, a 4-byte length) out of a stream's DATA
  payloads, each message's declared length within ``max_message`` (checked on its prefix, before its bytes are
  held); a compressed flag or a length past it stops the reading (``error``), the server answers the call.
* the serializers of the frames a server sends, and :func:`unary_answer`, a unary call's whole answer (HEADERS,
  DATA with the message, trailers, RST_STREAM) in one bytes;
* a call's request headers: :func:`scan_request_headers` (what the server checks of them) and
  :func:`invocation_metadata` (grpc's metadata tuple the handlers read).
"""
from __future__ import annotations

import base64
import struct

from engine.codec.errors import RemotingError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20
# settings
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
# error codes (RFC 7540 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR, \
    REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY, \
    HTTP_1_1_REQUIRED = range(14)

DEFAULT_MAX_FRAME_SIZE = 16_384
MAX_MAX_FRAME_SIZE = (1 << 24) - 1
DEFAULT_WINDOW = 65_535
MAX_WINDOW = (1 << 31) - 1

#: MessageReader.error: the message's compressed flag is set / its declared length is past max_message
MESSAGE_COMPRESSED = 1
MESSAGE_TOO_LARGE = 2

_HEAD = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, R + stream id
_U32 = struct.Struct(">I")
_U32x2 = struct.Struct(">II")
_SETTING = struct.Struct(">HI")


class FrameError(RemotingError, ValueError):
    """A connection error (RFC 7540 §5.4.1): the connection ends with GOAWAY ``code``. One class for both builds
    (the native module raises this one), a RemotingError as the codec's and HPACK's errors are."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _rest(buf, pos: int, end: int, kept: bool):
    """What a reader keeps after reading up to ``pos`` of ``buf`` (``kept``: ``buf`` is its own buffer, cut in
    place): nothing, or the partial frame / message, growing in place as more arrives."""
    if pos >= end:
        return b""
    if kept:
        del buf[:pos]
        return buf
    return bytearray(buf[pos:])


class FrameReader:
    """Bytes in, frames out: ``feed(data)`` returns ``[(type, flags, stream_id, payload), ...]`` (payload: bytes)
    of the whole frames received so far; the rest is kept for the next call (at most one frame's worth)."""

    __slots__ = ("max_frame_size", "_buf")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self.max_frame_size = max_frame_size
        self._buf = b""

    def feed(self, data) -> list:
        # a partial frame is kept in a bytearray that grows in place: a frame arriving a byte at a time costs
        # linear work, not a copy of the frame per byte
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        out = []
        pos, end = 0, len(buf)
        limit = self.max_frame_size
        unpack = _HEAD.unpack_from
        kept = buf is self._buf
        copy = kept or type(buf) is not bytes  # payloads are bytes, whatever the buffer is
        while end - pos >= 9:
            hi, lo, ftype, flags, sid = unpack(buf, pos)
            length = hi << 16 | lo
            if length > limit:
                self._buf = b""
                raise FrameError(FRAME_SIZE_ERROR, f"frame of {length} bytes past SETTINGS_MAX_FRAME_SIZE {limit}")
            stop = pos + 9 + length
            if stop > end:
                break
            payload = buf[pos + 9:stop]
            out.append((ftype, flags, sid & 0x7FFFFFFF, bytes(payload) if copy else payload))
            pos = stop
        self._buf = _rest(buf, pos, end, kept)
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


class MessageReader:
    """gRPC's length-prefixed messages out of one stream's DATA payloads: ``feed(payload)`` returns the whole
    messages (bytes, without their prefixes) the payload completed; a partial one is kept, growing in place.

    A prefix with the compressed flag set, or declaring more than ``max_message`` bytes, stops the reading:
    ``error`` becomes MESSAGE_COMPRESSED / MESSAGE_TOO_LARGE (``error_length``: the declared length), the messages
    before it are still returned, nothing after it is read, and every later feed returns nothing."""

    __slots__ = ("max_message", "error", "error_length", "_buf", "_need", "_length")

    def __init__(self, max_message: int):
        self.max_message = max_message
        self.error = 0
        self.error_length = 0
        self._buf = b""  # bytes of the message being received (with its 5-byte prefix)
        self._need = 5  # bytes _buf must reach: the prefix, then the whole message
        self._length = -1  # the length of the message being received (-1: its prefix is not read yet)

    def feed(self, payload) -> list:
        out = []
        if self.error:
            return out
        # a message spread over frames grows in place (a bytearray): linear in its size, not a copy per frame
        if self._buf:
            self._buf += payload
            buf = self._buf
        else:
            buf = payload
        copy = buf is self._buf or type(buf) is not bytes  # messages are bytes, whatever the buffer is
        pos, end = 0, len(buf)
        while end - pos >= self._need:
            if self._length < 0:  # the 5-byte prefix: compressed flag, length
                length = _U32.unpack_from(buf, pos + 1)[0]
                if buf[pos]:
                    self.error, self.error_length = MESSAGE_COMPRESSED, length
                elif length > self.max_message:
                    self.error, self.error_length = MESSAGE_TOO_LARGE, length
                if self.error:
                    self._buf = b""
                    return out
                self._length = length
                self._need = 5 + length
                continue
            stop = pos + self._need
            out.append(bytes(buf[pos + 5:stop]) if copy else buf[pos + 5:stop])
            pos = stop
            self._need = 5
            self._length = -1
        self._buf = _rest(buf, pos, end, buf is self._buf)
        return out

    @property
    def buffered(self) -> int:
        """Bytes of the message being received (its prefix included): 0 between messages."""
        return len(self._buf)


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def settings(pairs=(), ack: bool = False) -> bytes:
    return frame(SETTINGS, FLAG_ACK if ack else 0, 0, b"".join(_SETTING.pack(k, v) for k, v in pairs))


def parse_settings(payload: bytes) -> list:
    """The (identifier, value) pairs of a SETTINGS payload (a length not a multiple of 6: FRAME_SIZE_ERROR)."""
    if len(payload) % 6:
        raise FrameError(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def ping(data: bytes, ack: bool = False) -> bytes:
    return frame(PING, FLAG_ACK if ack else 0, 0, data)


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32x2.pack(last_stream_id & 0x7FFFFFFF, code) + debug)


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def u32(payload: bytes, pos: int = 0) -> int:
    return _U32.unpack_from(payload, pos)[0]


def data_message(stream_id: int, message: bytes) -> bytes:
    """One DATA frame carrying one gRPC message (its 5-byte prefix, uncompressed)."""
    n = len(message) + 5
    return _HEAD.pack(n >> 16, n & 0xFFFF, DATA, 0, stream_id) + b"\x00" + _U32.pack(n - 5) + message


def unary_answer(stream_id: int, headers_block: bytes, message: bytes, trailers_block: bytes, rst: bool) -> bytes:
    """A unary call's whole answer in one bytes: HEADERS (``headers_block``), one DATA frame with ``message``,
    HEADERS END_STREAM (``trailers_block``) and, when ``rst`` (the client has not ended its side), RST_STREAM
    NO_ERROR. The caller checks that the DATA frame fits the windows and the peer's SETTINGS_MAX_FRAME_SIZE."""
    out = (frame(HEADERS, FLAG_END_HEADERS, stream_id, headers_block) + data_message(stream_id, message)
           + frame(HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, stream_id, trailers_block))
    return out + rst_stream(stream_id, NO_ERROR) if rst else out


# ---------------------------------------------------------------------------------------------------------------
# a gRPC call's request headers (the decoded HPACK header list: [(name, value), ...], bytes)

TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
#: headers that are gRPC's transport, not the call's metadata (grpc leaves them out of invocation_metadata)
RESERVED_HEADERS = frozenset((b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))


def parse_timeout(value: bytes):
    """grpc-timeout (1-8 digits and a unit) in seconds, or None when malformed."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit


def scan_request_headers(headers) -> tuple:
    """``(size, path, content_type, encoding, timeout, bad)`` of a request's header list: its size as RFC 7540
    §6.5.2 counts it (name + value + 32 per field), the last :path, content-type and grpc-encoding (None when
    absent), the last grpc-timeout in seconds (None when absent or malformed), and ``bad``: a :method other than
    POST or a malformed grpc-timeout."""
    size = 0
    path = content_type = encoding = timeout = None
    bad = False
    for name, value in headers:
        size += len(name) + len(value) + 32
        if name == b":path":
            path = value
        elif name == b":method":
            bad |= value != b"POST"
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = parse_timeout(value)
            bad |= timeout is None
        elif name == b"grpc-encoding":
            encoding = value
    return size, path, content_type, encoding, timeout, bad


def header_value(headers, name: bytes):
    """The value of a header list's first field named ``name`` (bytes; None when there is none): one metadata
    value read without building the whole invocation metadata."""
    for key, value in headers:
        if key == name:
            return value
    return None


def invocation_metadata(headers) -> tuple:
    """grpc's invocation metadata of a request: ``((key, value), ...)`` without the pseudo-headers and
    RESERVED_HEADERS, keys as ASCII text, values as UTF-8 text (undecodable bytes replaced), a ``-bin`` key's value
    base64-decoded to bytes (unpadded accepted; one that does not decode is left out)."""
    md = []
    for name, value in headers:
        if name[:1] == b":" or name in RESERVED_HEADERS:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                md.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            md.append((key, value.decode("utf-8", "replace")))
    return tuple(md)

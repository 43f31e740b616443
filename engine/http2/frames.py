"""HTTP/2 frames (RFC 7540 §4, §6): constants, the frame reader and the serializers of the frames a server sends.

The reader takes the bytes a connection received and hands back whole frames; a frame longer than our
SETTINGS_MAX_FRAME_SIZE is a FRAME_SIZE_ERROR of the connection (RFC 7540 §4.2), raised before its payload is
buffered, so a peer cannot make the buffer grow past one frame.
"""
from __future__ import annotations

import struct

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

_HEAD = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, R + stream id
_U32 = struct.Struct(">I")
_U32x2 = struct.Struct(">II")
_SETTING = struct.Struct(">HI")


class FrameError(Exception):
    """A connection error (RFC 7540 §5.4.1): the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


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
            out.append((ftype, flags, sid & 0x7FFFFFFF, bytes(payload) if kept else payload))
            pos = stop
        if pos >= end:
            self._buf = b""
        elif kept:
            del buf[:pos]
        else:
            self._buf = bytearray(buf[pos:])
        return out

    @property
    def buffered(self) -> int:
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

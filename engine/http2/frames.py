"""HTTP/2 frames (RFC 7540 §4, §6): constants, the frame reader, gRPC's message reader and the serializers of the
frames a server sends.

The reader takes the bytes a connection received and hands back whole frames; a frame longer than our
SETTINGS_MAX_FRAME_SIZE is a FRAME_SIZE_ERROR of the connection (RFC 7540 §4.2), raised before its payload is
buffered, so a peer cannot make the buffer grow past one frame.

``FrameReader``, ``MessageReader``, the serializers and the request-header readers (``scan_request_headers``,
``invocation_metadata``, ``parse_timeout``) come from the compiled ``engine.http2._frames``
(pyx/http2/_frames.pyx) when it is built, else from its pure-Python twin ``engine.http2._frames_py`` (which
documents the rules; the constants and ``FrameError`` are defined there); ``ENGINE_NO_EXTENSIONS=1`` forces the
twin. ``NATIVE_FRAMES`` says which one this process uses.
"""
from __future__ import annotations

from engine import compiled_or_twin
from engine.http2._frames_py import (  # noqa: F401  (re-exported: the frame layer's public names)
    CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, CONTINUATION, DATA, DEFAULT_MAX_FRAME_SIZE, DEFAULT_WINDOW,
    ENHANCE_YOUR_CALM, FLAG_ACK, FLAG_END_HEADERS, FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY, FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR, GOAWAY, HEADERS, HTTP_1_1_REQUIRED, INADEQUATE_SECURITY, INTERNAL_ERROR, MAX_MAX_FRAME_SIZE,
    MAX_WINDOW, MESSAGE_COMPRESSED, MESSAGE_TOO_LARGE, NO_ERROR, PING, PREFACE, PRIORITY, PROTOCOL_ERROR,
    PUSH_PROMISE, REFUSED_STREAM, RESERVED_HEADERS, RST_STREAM, SETTINGS, SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE, SETTINGS_TIMEOUT, STREAM_CLOSED, TIMEOUT_UNITS,
    WINDOW_UPDATE, FrameError)

_frames, NATIVE_FRAMES = compiled_or_twin("_frames")
(FrameReader, MessageReader, data_message, frame, goaway, invocation_metadata, parse_settings, parse_timeout, ping,
 rst_stream, scan_request_headers, settings, u32, unary_answer, window_update) = (
    _frames.FrameReader, _frames.MessageReader, _frames.data_message, _frames.frame, _frames.goaway,
    _frames.invocation_metadata, _frames.parse_settings, _frames.parse_timeout, _frames.ping, _frames.rst_stream,
    _frames.scan_request_headers, _frames.settings, _frames.u32, _frames.unary_answer, _frames.window_update)
del _frames


def apply_initial_window(streams, old: int, value: int) -> int:
    """A peer's SETTINGS_INITIAL_WINDOW_SIZE ``value`` (RFC 7540 §6.9.2): the send window of every open stream (an
    object with ``send_window``) moves by its change from ``old``; returns ``value``, the new initial window.
    FrameError FLOW_CONTROL_ERROR past 2^31-1, the setting's or a stream window's."""
    if value > MAX_WINDOW:
        raise FrameError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1")
    delta = value - old
    for stream in streams:
        stream.send_window += delta
        if stream.send_window > MAX_WINDOW:
            raise FrameError(FLOW_CONTROL_ERROR, "a stream window past 2^31-1")
    return value

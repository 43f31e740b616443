"""HTTP/2 for the 5.x gRPC port (issue 30): HPACK header compression (RFC 7541) and the server connection.

``HpackDecoder``, ``HpackEncoder`` and ``HpackError`` come from the compiled ``engine.http2._hpack`` (pyx/http2/)
when it is built, else from its pure-Python twin ``engine.http2._hpack_py``; ``ENGINE_NO_EXTENSIONS=1`` forces the
twin. Both raise the same ``HpackError`` class (defined in the twin). The frame layer (``engine.http2.frames``:
the frame reader, gRPC's message reader, the serializers, the request-header readers) chooses the same way between
``engine.http2._frames`` (pyx/http2/_frames.pyx) and ``engine.http2._frames_py``.
"""
import os as _os

from engine.http2._hpack_py import HpackError

NATIVE_HPACK = False
if not _os.environ.get("ENGINE_NO_EXTENSIONS"):
    try:
        from engine.http2._hpack import HpackDecoder, HpackEncoder

        NATIVE_HPACK = True
    except ImportError:  # not built: the twin below
        pass
if not NATIVE_HPACK:
    from engine.http2._hpack_py import HpackDecoder, HpackEncoder

__all__ = ["HpackDecoder", "HpackEncoder", "HpackError", "NATIVE_HPACK"]

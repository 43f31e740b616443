"""HTTP/2 for the 5.x gRPC port (issue 30): HPACK header compression (RFC 7541) and the server connection.

``HpackDecoder``, ``HpackEncoder`` and ``HpackError`` come from the compiled ``engine.http2._hpack`` (pyx/http2/)
when it is built, else from its pure-Python twin ``engine.http2._hpack_py``; ``ENGINE_NO_EXTENSIONS=1`` forces the
twin. Both raise the same ``HpackError`` class (defined in the twin). The frame layer (``engine.http2.frames``:
the frame reader, gRPC's message reader, the serializers, the request-header readers) chooses the same way between
``engine.http2._frames`` (pyx/http2/_frames.pyx) and ``engine.http2._frames_py``.
"""
from engine import compiled_or_twin
from engine.http2._hpack_py import HpackError

# not named _hpack: that is the compiled submodule's attribute on this package
_impl, NATIVE_HPACK = compiled_or_twin("_hpack")
HpackDecoder, HpackEncoder = _impl.HpackDecoder, _impl.HpackEncoder
del _impl

__all__ = ["HpackDecoder", "HpackEncoder", "HpackError", "NATIVE_HPACK"]

"""RocketMQ broker client management: frame codec, heartbeat decoding, client registry, server.

Every hot path has a Cython module (``engine.codec._frame``, ``engine.codec._heartbeat``, ``engine.registry._expiry``,
``engine.registry._digest``, ``engine.registry._channel_table``, ``engine.registry._intern``, ``engine.registry._rules``, ``engine.recording._segment``, ``engine.recording._brokerlog``, ``engine.recording._pcap``, ``engine.http2._hpack``, the connection protocol
``engine.broker._protocol``, built from ``pyx/``) and a pure-Python twin with the same inputs, outputs and errors. The compiled modules are used when they are built;
``ENGINE_NO_EXTENSIONS=1`` forces the twins. ``engine.native_modules()`` says, per module, which one is in use;
``engine.NATIVE`` is true only when every compiled module is.
"""
import importlib as _importlib
import os as _os
import sys as _sys

from engine.codec.enums import (
    BROKER_VERSION,
    ConsumeFromWhere,
    ConsumeType,
    LanguageCode,
    MessageModel,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from engine.codec.errors import FrameError, HeartbeatError, RemotingError

_NATIVE_CODEC = False
if not _os.environ.get("ENGINE_NO_EXTENSIONS"):
    try:
        from engine.codec._frame import AnswerTemplate, FrameDecoder, RemotingCommand, decode_frame
        from engine.codec._heartbeat import (
            ConsumerData,
            HeartbeatData,
            ProducerData,
            SubscriptionData,
            decode_heartbeat,
            decode_heartbeats,
        )

        _NATIVE_CODEC = True
    except ImportError:  # not built: fall back to the twins below
        pass
if not _NATIVE_CODEC:
    from engine.codec._frame_py import AnswerTemplate, FrameDecoder, RemotingCommand, decode_frame
    from engine.codec._heartbeat_py import (
        ConsumerData,
        HeartbeatData,
        ProducerData,
        SubscriptionData,
        decode_heartbeat,
        decode_heartbeats,
    )

from engine.codec.heartbeat import HeartbeatBatch, build_subscription, encode_heartbeat, heartbeat_fingerprint, java_string_hash

__all__ = [
    "NATIVE",
    "AnswerTemplate",
    "BROKER_VERSION",
    "ConsumeFromWhere",
    "ConsumeType",
    "ConsumerData",
    "FrameDecoder",
    "FrameError",
    "HeartbeatData",
    "HeartbeatError",
    "LanguageCode",
    "MessageModel",
    "ProducerData",
    "RemotingCommand",
    "RemotingError",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "SubscriptionData",
    "decode_frame",
    "decode_heartbeat",
    "decode_heartbeats",
    "encode_heartbeat",
    "java_string_hash",
    "heartbeat_fingerprint",
    "build_subscription",
    "HeartbeatBatch",
]

__all__ += ["Broker", "BrokerConfig", "native_modules"]


#: every compiled module (short name: (the extension built from pyx/<package>/<name>.pyx, where its twin lives))
COMPILED_MODULES = {
    "_frame": ("engine.codec._frame", "engine.codec._frame_py"),
    "_heartbeat": ("engine.codec._heartbeat", "engine.codec._heartbeat_py"),
    "_expiry": ("engine.registry._expiry", "engine.registry._expiry_py"),
    "_digest": ("engine.registry._digest", "engine.registry._digest_py"),
    "_channel_table": ("engine.registry._channel_table", "engine.registry._channel_table_py"),
    "_intern": ("engine.registry._intern", "engine.registry._intern_py"),
    "_rules": ("engine.registry._rules", "engine.registry.client_registry"),  # twin: ClientRegistry._heartbeat
    "_segment": ("engine.recording._segment", "engine.bindings.segments"),
    "_brokerlog": ("engine.recording._brokerlog", "engine.recording._brokerlog_py"),
    "_pcap": ("engine.recording._pcap", "engine.recording._pcap_py"),
    "_hpack": ("engine.http2._hpack", "engine.http2._hpack_py"),
    "_frames": ("engine.http2._frames", "engine.http2._frames_py"),
    "_core": ("engine.http2._core", "engine.http2._core_py"),  # the native gRPC transport's connection core
    "_protocol": ("engine.broker._protocol", "engine.broker.server"),  # twin: server.PyConnection
    "_grpc_repeat": ("engine.broker._grpc_repeat", "engine.broker.grpc_repeat"),  # a repeated 5.x Heartbeat
}
_native_modules: dict | None = None


def native_modules() -> dict:
    """``{module: True if its compiled build is in use, False if its pure-Python twin is}`` for every compiled
    module. The rule is the one each user of a module applies (registry, Spark binding): the build is used unless
    ``ENGINE_NO_EXTENSIONS`` is set or it cannot be imported; ``_segment`` also needs a little-endian machine."""
    global _native_modules
    if _native_modules is None:
        out = {}
        for name in COMPILED_MODULES:
            if name in ("_frame", "_heartbeat"):
                out[name] = _NATIVE_CODEC
                continue
            ok = not _os.environ.get("ENGINE_NO_EXTENSIONS") and (name != "_segment" or _sys.byteorder == "little")
            if ok:
                try:
                    _importlib.import_module(COMPILED_MODULES[name][0])
                except ImportError:
                    ok = False
            out[name] = ok
        _native_modules = out
    return dict(_native_modules)


def __getattr__(name):
    # NATIVE imports every compiled module, so it is computed on first use; the broker front end also loads on
    # first use, so `import engine` stays light for codec-only users
    if name == "NATIVE":
        return all(native_modules().values())
    if name == "Broker":
        from engine.broker.controller import Broker

        return Broker
    if name == "BrokerConfig":
        from engine.broker.config import BrokerConfig

        return BrokerConfig
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

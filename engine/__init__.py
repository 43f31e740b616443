"""RocketMQ broker client management: frame codec, heartbeat decoding, client registry, server.

Every hot path has a Cython module, built from ``pyx/`` (each one in ``COMPILED_MODULES``, beside where its twin
lives), and a pure-Python twin with the same inputs, outputs and errors. The compiled modules are used when they are
built; ``ENGINE_NO_EXTENSIONS=1`` forces the twins. Every user of a module chooses with ``compiled_module`` /
``compiled_or_twin``; ``engine.native_modules()`` says, per module, which one is in use; ``engine.NATIVE`` is true
only when every compiled module is.
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


def compiled_module(name: str):
    """The compiled module ``COMPILED_MODULES[name]`` if it is to be used, else None. The rule, the same for every
    module: the build is used unless ``ENGINE_NO_EXTENSIONS`` is set or it cannot be imported (not built);
    ``_segment`` also needs a little-endian machine."""
    if _os.environ.get("ENGINE_NO_EXTENSIONS") or (name == "_segment" and _sys.byteorder != "little"):
        return None
    try:
        return _importlib.import_module(COMPILED_MODULES[name][0])
    except ImportError:  # not built
        return None


def compiled_or_twin(name: str):
    """``(module, True)``: the compiled module ``name`` (see :func:`compiled_module`); else ``(its pure-Python twin,
    False)``."""
    module = compiled_module(name)
    if module is not None:
        return module, True
    return _importlib.import_module(COMPILED_MODULES[name][1]), False


# the codec is one unit: both compiled modules, or both twins when either one is not used
_frame, _heartbeat = compiled_module("_frame"), compiled_module("_heartbeat")
_NATIVE_CODEC = _frame is not None and _heartbeat is not None
if not _NATIVE_CODEC:
    from engine.codec import _frame_py as _frame, _heartbeat_py as _heartbeat
AnswerTemplate, FrameDecoder, RemotingCommand, decode_frame = (
    _frame.AnswerTemplate, _frame.FrameDecoder, _frame.RemotingCommand, _frame.decode_frame)
ConsumerData, HeartbeatData, ProducerData, SubscriptionData, decode_heartbeat, decode_heartbeats = (
    _heartbeat.ConsumerData, _heartbeat.HeartbeatData, _heartbeat.ProducerData, _heartbeat.SubscriptionData,
    _heartbeat.decode_heartbeat, _heartbeat.decode_heartbeats)
del _frame, _heartbeat

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


_native_modules: dict | None = None


def native_modules() -> dict:
    """``{module: True if its compiled build is in use, False if its pure-Python twin is}`` for every compiled
    module: :func:`compiled_module`, the rule every user of a module applies."""
    global _native_modules
    if _native_modules is None:
        _native_modules = {name: compiled_module(name) is not None for name in COMPILED_MODULES}
        _native_modules["_frame"] = _native_modules["_heartbeat"] = _NATIVE_CODEC  # the codec pair: see above
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

"""RocketMQ broker client management: frame codec, heartbeat decoding, client registry, server.

Every hot path has a Cython module (``engine._frame``, ``engine._heartbeat``, ``engine._expiry``, built from
``pyx/``) and a pure-Python twin (``engine._frame_py``, ...) with the same inputs, outputs and errors.
The compiled modules are used when they are built; ``ENGINE_NO_EXTENSIONS=1`` forces the twins.
"""
import os as _os

from .enums import (
    BROKER_VERSION,
    ConsumeFromWhere,
    ConsumeType,
    LanguageCode,
    MessageModel,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from .errors import FrameError, HeartbeatError, RemotingError

NATIVE = False
if not _os.environ.get("ENGINE_NO_EXTENSIONS"):
    try:
        from ._frame import AnswerTemplate, FrameDecoder, RemotingCommand, decode_frame
        from ._heartbeat import (
            ConsumerData,
            HeartbeatData,
            ProducerData,
            SubscriptionData,
            decode_heartbeat,
            decode_heartbeats,
        )

        NATIVE = True
    except ImportError:  # not built: fall back to the twins below
        pass
if not NATIVE:
    from ._frame_py import AnswerTemplate, FrameDecoder, RemotingCommand, decode_frame
    from ._heartbeat_py import (
        ConsumerData,
        HeartbeatData,
        ProducerData,
        SubscriptionData,
        decode_heartbeat,
        decode_heartbeats,
    )

from .heartbeat import HeartbeatBatch, build_subscription, encode_heartbeat, heartbeat_fingerprint, java_string_hash

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

__all__ += ["Broker", "BrokerConfig"]


def __getattr__(name):
    # the broker front end loads on first use, so `import engine` stays light for codec-only users
    if name == "Broker":
        from .broker import Broker

        return Broker
    if name == "BrokerConfig":
        from .config import BrokerConfig

        return BrokerConfig
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

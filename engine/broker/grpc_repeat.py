"""A repeated 5.x Heartbeat answered from the registry's repeat path (issue 30): the reference twin of the compiled
``engine.broker._grpc_repeat`` (pyx/broker/_grpc_repeat.pyx), which the native gRPC transport calls for every
repeated Heartbeat; ``ENGINE_NO_EXTENSIONS=1`` (or no build) uses this one.

A session's Heartbeat with the very bytes of its previous one is answered here while the registry's fast path armed
by that one still holds (no Settings, config or group change since: ``ClientRegistry.heartbeat_repeat``, which also
touches the channel), on the connection of the session's Telemetry stream: no metadata dict, no protobuf parse, no
HeartbeatData, no answer built (remoting's repeat route, for 5.x). Anything else, and every call with aclEnable (each
call's signature is checked) or the ``on_request`` hook, is None: the Heartbeat handler runs.
"""
from __future__ import annotations

import time


def header_client_id(value: bytes | None) -> str | None:
    """The session key (grpc_endpoint's _client_id) of a native call's first x-mq-client-id header value (bytes,
    None without one): decoded as invocation_metadata decodes it, stripped."""
    return None if value is None else value.decode("utf-8", "replace").strip()


class HeartbeatRepeat:
    """``answer(request, client_id, peer)``: the answer of a repeated Heartbeat (``client_id``: the session's key,
    the call's x-mq-client-id as a str; ``peer``: grpc's ``context.peer()``), else None. Called with the header's
    bytes (``repeat(request, client_id_bytes, peer)``), it is the native transport's ``prepared`` answer."""

    __slots__ = ("ep",)

    def __init__(self, endpoint):
        self.ep = endpoint

    def __call__(self, request: bytes, client_id: bytes | None, peer: str) -> bytes | None:
        return self.answer(request, header_client_id(client_id), peer)

    def answer(self, request: bytes, client_id: str | None, peer: str) -> bytes | None:
        ep = self.ep
        if ep.acl is not None or ep.on_request is not None:
            return None
        session = ep.sessions.get(client_id)
        if session is None:
            return None
        repeat = session._hb_repeat
        if repeat is None or repeat[0] != request:
            return None
        stream = session.stream
        if stream is not None and stream.peer != peer:
            return None
        broker = ep.broker
        if broker.registry.heartbeat_repeat(repeat[1]) is None:
            session._hb_repeat = None  # the registry's fast path no longer holds: the next one takes the handler
            return None
        session.last_seen = time.monotonic()
        ep.heartbeat_repeats += 1
        if broker.recorder is not None:
            ep._record(session)
        return ep._heartbeat_ok

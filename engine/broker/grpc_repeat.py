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
    bytes (``repeat(request, client_id_bytes, peer)``), it is the native transport's ``prepared`` answer.

    It holds what the endpoint never replaces (its sessions dict, broker, registry, ACL validator and prepared
    answer), read once when the endpoint makes it; ``hits`` counts the repeats answered (the endpoint's
    ``heartbeat_repeats``)."""

    __slots__ = ("ep", "sessions", "broker", "registry", "acl", "ok", "hits")

    def __init__(self, endpoint):
        self.ep = endpoint
        self.sessions = endpoint.sessions
        self.broker = endpoint.broker
        self.registry = endpoint.broker.registry
        self.acl = endpoint.acl
        self.ok = endpoint._heartbeat_ok
        self.hits = 0

    def __call__(self, request: bytes, client_id: bytes | None, peer: str) -> bytes | None:
        return None if client_id is None else self.answer(request, header_client_id(client_id), peer)

    def answer(self, request: bytes, client_id: str | None, peer: str) -> bytes | None:
        if self.acl is not None or self.ep.on_request is not None:
            return None
        session = self.sessions.get(client_id)
        if session is None:
            return None
        repeat = session._hb_repeat
        if repeat is None or repeat[0] != request:
            return None
        stream = session.stream
        if stream is not None and stream.peer != peer:
            return None
        if self.registry.heartbeat_repeat(repeat[1]) is None:
            session._hb_repeat = None  # the registry's fast path no longer holds: the next one takes the handler
            return None
        session.last_seen = time.monotonic()
        self.hits += 1
        if self.broker.recorder is not None:
            self.ep._record(session)
        return self.ok

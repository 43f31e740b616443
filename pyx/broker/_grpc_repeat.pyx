# cython: language_level=3
"""A repeated 5.x Heartbeat answered from the registry's repeat path, compiled: the twin
``engine.broker.grpc_repeat`` documents it and is the reference (the same checks in the same order, the same
effects, the same answers). The native gRPC transport calls it for every repeated Heartbeat: compiled, no Python
frame runs for one."""
from engine._clock cimport monotonic as _monotonic


cdef class HeartbeatRepeat:
    """See the twin."""

    cdef readonly object ep

    def __init__(self, endpoint):
        self.ep = endpoint

    def __call__(self, request, client_id, peer):
        if client_id is None:
            return None
        return self.answer(request, client_id.decode("utf-8", "replace").strip(), peer)  # header_client_id

    cpdef answer(self, request, client_id, peer):
        cdef object ep = self.ep
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
            session._hb_repeat = None
            return None
        session.last_seen = _monotonic()
        ep.heartbeat_repeats += 1
        if broker.recorder is not None:
            ep._record(session)
        return ep._heartbeat_ok

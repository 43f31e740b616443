# cython: language_level=3
"""A repeated 5.x Heartbeat answered from the registry's repeat path, compiled: the twin
``engine.broker.grpc_repeat`` documents it and is the reference (the same checks in the same order, the same
effects, the same answers). The native gRPC transport calls it for every repeated Heartbeat: no Python frame runs
for one, the client id is decoded without a method call, and what the endpoint never replaces is held in C fields
(one attribute read is left on the endpoint: its ``on_request`` hook, which tests set at any time)."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8, Py_UNICODE_ISSPACE
from engine._clock cimport monotonic as _monotonic


cdef inline str _header_client_id(bytes value):
    """The twin's header_client_id: ``value.decode("utf-8", "replace").strip()``, stripped only when an end is
    whitespace (str.strip's own test)."""
    cdef str s = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), "replace")
    cdef Py_ssize_t n = len(s)
    if n and (Py_UNICODE_ISSPACE(s[0]) or Py_UNICODE_ISSPACE(s[n - 1])):
        return s.strip()
    return s


@cython.final
cdef class HeartbeatRepeat:
    """See the twin."""

    cdef readonly object ep
    cdef readonly dict sessions
    cdef readonly object broker, registry, acl
    cdef readonly bytes ok
    cdef public Py_ssize_t hits

    def __init__(self, endpoint):
        self.ep = endpoint
        self.sessions = endpoint.sessions
        self.broker = endpoint.broker
        self.registry = endpoint.broker.registry
        self.acl = endpoint.acl
        self.ok = endpoint._heartbeat_ok
        self.hits = 0

    def __call__(self, request, client_id, peer):
        if client_id is None:
            return None
        return self.answer(request, _header_client_id(client_id), peer)

    cpdef answer(self, request, client_id, peer):
        cdef tuple repeat
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
            session._hb_repeat = None
            return None
        session.last_seen = _monotonic()
        self.hits += 1
        if self.broker.recorder is not None:
            self.ep._record(session)
        return self.ok

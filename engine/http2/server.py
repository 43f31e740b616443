"""HTTP/2 + gRPC server on the broker's own asyncio loop (issue 30, ``grpcTransport=native``).

One :class:`H2Connection` (an ``asyncio.Protocol``) per client connection: connection preface, SETTINGS and their
ACK, PING, GOAWAY, flow control both ways (connection and stream windows), HEADERS + CONTINUATION (HPACK:
engine.http2), DATA carrying gRPC's length-prefixed messages, RST_STREAM, stream states (RFC 7540 §5.1), trailers
(grpc-status, percent-encoded grpc-message) and grpc-timeout deadlines. What every frame passes through (the frame
loop, the windows, the prepared path, the request bytes held) is its core, ``H2Core``: compiled
(engine.http2._core, pyx/http2/_core.pyx) when built, else the twin engine.http2._core_py; the methods here are what
waits on the loop (the calls' handlers, deadlines, keepalive, GOAWAY and closing). Calls are handed to the handlers of
engine.broker.grpc_endpoint's ``_Servicer`` with a context (:class:`_Context`) giving them what they use of grpc's:
``abort``, ``invocation_metadata``, ``peer``, ``read``, ``write``, ``time_remaining``.

A handler coroutine is first run inline, in the callback that received its last frame: one that returns without
waiting (Heartbeat's repeat path, QueryRoute, ...) costs no task; only one that waits becomes a task. A unary call
whose frames come in one read (as the SDKs write them) and whose method has a ``prepared`` answer for it (the
endpoint's: a repeated Heartbeat, a QueryRoute / QueryAssignment asked before) is answered without a call, a context
or a coroutine (the core's ``_unary``), byte for byte what the handler's answer would be.

Budgets (README, 5.x gRPC budget table): the endpoint's grpcMax* properties (connections, streams per connection,
calls in progress, message and metadata bytes) and the constants below; past each one the answer named there.
"""
from __future__ import annotations

import asyncio
import logging
import time
import types
from collections import deque

from engine import compiled_or_twin
from engine.alarms import Alarms
from engine.http2 import frames as F
from engine.http2.frames import FrameError
# the connection core: compiled (pyx/http2/_core.pyx) when built, else its twin; ENGINE_NO_EXTENSIONS=1 forces the twin
from engine.http2._core_py import (CONNECTION_WINDOW, CONTROL_WINDOW_S, OK_TRAILERS, RESET_WINDOW_S,  # noqa: F401
                                   RESPONSE_HEADERS, STREAM_WINDOW)

_core, NATIVE_CORE = compiled_or_twin("_core")
H2Core = _core.H2Core
del _core

log = logging.getLogger("engine.grpc")

#: the bytes of partial and unread request messages one connection may hold, in messages of grpcMaxMessageBytes
#: (plus one STREAM_WINDOW); past it the stream whose DATA passed it ends RESOURCE_EXHAUSTED
MAX_BUFFERED_MESSAGES = 4
#: the same for our answers a client has not opened its window for (a peer that reads nothing); past it the
#: connection ends (GOAWAY FLOW_CONTROL_ERROR)
MAX_PENDING_MESSAGES = 4
#: a stream whose answer waits for a window the client does not open for this long ends the connection, ms
FLOW_STALL_MS = 10_000
#: RST_STREAM frames a client may send per RESET_WINDOW_S (rapid reset, CVE-2023-44487); past it GOAWAY
#: ENHANCE_YOUR_CALM and the connection ends
MAX_RESETS_PER_WINDOW = 200
#: SETTINGS, PRIORITY, empty DATA frames, and PINGs without a HEADERS or DATA frame since the previous PING (a
#: ping after request data is a flow-control probe, as grpc counts them), a client may send per CONTROL_WINDOW_S;
#: past it GOAWAY ENHANCE_YOUR_CALM and the connection ends (a settings / ping flood makes the server write answers)
MAX_CONTROL_FRAMES_PER_WINDOW = 200
#: CONTINUATION frames of one header block at most; past it GOAWAY ENHANCE_YOUR_CALM (CONTINUATION flood)
MAX_CONTINUATIONS = 32
#: a header block (HEADERS + CONTINUATION, encoded) and its decoded header list may be this many times
#: grpcMaxMetadataBytes (at least 64 KiB) before the connection ends (COMPRESSION_ERROR / ENHANCE_YOUR_CALM); up to
#: it, a call with metadata past grpcMaxMetadataBytes is answered RESOURCE_EXHAUSTED and the connection lives
HARD_METADATA_FACTOR = 4
#: a TLS handshake (grpcTlsCertPath) must end within this many seconds, else the connection is closed (asyncio
#: hands the connection to the server, and to its connection budget, only after the handshake)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: the longest grpc-message we send, characters
MAX_STATUS_MESSAGE = 1024

_OK, _CANCELLED, _UNKNOWN, _INVALID_ARGUMENT, _DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
_RESOURCE_EXHAUSTED, _UNIMPLEMENTED, _INTERNAL, _UNAVAILABLE = 8, 12, 13, 14



def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name (RFC 7541 §6.2.2), no Huffman."""
    return b"\x00" + _hpack_len(len(name)) + name + _hpack_len(len(value)) + value


def _hpack_len(n: int) -> bytes:
    if n < 127:
        return bytes((n,))
    out = bytearray((127,))
    n -= 127
    while n >= 128:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(message: str) -> bytes:
    """grpc-message: UTF-8, bytes outside 0x20-0x7E and '%' as %XX (the gRPC HTTP/2 protocol spec)."""
    data = message[:MAX_STATUS_MESSAGE].encode("utf-8", "replace")
    return b"".join(bytes((c,)) if c in _UNRESERVED else b"%%%02X" % c for c in data)


def status_block(code: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(int(code)).encode())
    if message:
        block += _literal(b"grpc-message", percent_encode(message))
    return block


parse_timeout = F.parse_timeout  # grpc-timeout (1-8 digits and a unit) in seconds, or None when malformed


def _status_of(code) -> int:
    """grpc.StatusCode or int -> int."""
    value = getattr(code, "value", code)
    return value[0] if isinstance(value, tuple) else int(value)


@types.coroutine
def _resume(coro, yielded):
    """Go on with a coroutine that was started inline and yielded ``yielded`` (a future it waits for): the rest of
    it, inside a task."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # noqa: B902 - cancellation included: thrown into the handler
            try:
                yielded = coro.throw(e)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class _Method:
    __slots__ = ("path", "handler", "request_type", "raw", "client_streaming", "server_streaming", "prepared")

    def __init__(self, path, handler, request_type, raw, client_streaming, server_streaming, prepared=None):
        self.path = path
        self.handler = handler
        self.request_type = request_type
        self.raw = raw
        self.client_streaming = client_streaming
        self.server_streaming = server_streaming
        #: ``prepared(message, client_id, peer) -> bytes | None``: the answer of a request that needs no handler
        #: (Heartbeat's repeat), else None and the handler runs (see H2Core._unary); ``client_id``: the first
        #: x-mq-client-id header's value (bytes), None without one
        self.prepared = prepared


class H2Server:
    """The native gRPC server of a GrpcEndpoint: ``await start(host, port)`` / ``await stop(grace)``."""

    def __init__(self, endpoint, servicer, service_name: str, raw_methods=("Heartbeat",), prepared=None):
        self.ep = endpoint
        p = endpoint.p
        self.abort_error = p.aio.AbortError
        self.eof = p.aio.EOF
        self.methods: dict[bytes, _Method] = {}
        svc = p.s.DESCRIPTOR.services_by_name[service_name.rpartition(".")[2]]
        for m in svc.methods:
            path = f"/{service_name}/{m.name}".encode()
            self.methods[path] = _Method(path, getattr(servicer, m.name), getattr(p.s, m.input_type.name),
                                         m.name in raw_methods, m.client_streaming, m.server_streaming,
                                         None if m.client_streaming or m.server_streaming
                                         else (prepared or {}).get(m.name))
        self.max_connections = getattr(endpoint, "max_connections", 10_000)
        self.max_streams = endpoint.max_streams_per_connection
        self.max_message = endpoint.max_message_bytes
        self.max_metadata = endpoint.max_metadata_bytes
        self.hard_metadata = max(HARD_METADATA_FACTOR * self.max_metadata, 65536)
        self.max_calls = endpoint.max_concurrent_rpcs
        # the grpcio server's keepalive, as the endpoint gives it (grpc_endpoint.KEEPALIVE_TIME_MS /
        # KEEPALIVE_TIMEOUT_MS: read there, so that this layer does not import the endpoint back)
        self.keepalive_s = getattr(endpoint, "keepalive_time_ms", 20_000) / 1000.0
        self.keepalive_timeout_s = getattr(endpoint, "keepalive_timeout_ms", 10_000) / 1000.0
        self.max_write_buffer = int(getattr(endpoint.broker.config, "max_write_buffer_bytes", 8 << 20))
        self.connections: set[H2Connection] = set()
        self.calls = 0  # calls in progress over all connections
        self.refused = 0  # connections closed at accept (past max_connections)
        self.goaways: dict = {}  # code -> GOAWAY frames sent for protocol errors and floods
        self._server = None
        self.alarms = None  # the connections' keepalives (engine.alarms), from start()
        self.stopping = False
        self._settings = F.settings((
            (F.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_streams),
            (F.SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (F.SETTINGS_MAX_HEADER_LIST_SIZE, self.max_metadata),
            (F.SETTINGS_ENABLE_PUSH, 0),
        )) + F.window_update(0, CONNECTION_WINDOW - F.DEFAULT_WINDOW)

    async def start(self, host: str, port: int, ssl=None) -> int:
        loop = asyncio.get_running_loop()
        self.alarms = Alarms(loop, lambda: self.ep.internal_error("native gRPC keepalive"))
        kw = {} if ssl is None else {"ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT_S}
        self._server = await loop.create_server(lambda: H2Connection(self), host or None, port, ssl=ssl,
                                                reuse_address=True, backlog=1024, **kw)
        return self._server.sockets[0].getsockname()[1]

    @staticmethod
    def limits() -> tuple:
        """The budgets a connection's core takes when it is made: this module's constants as they are now."""
        return (MAX_BUFFERED_MESSAGES, MAX_PENDING_MESSAGES, MAX_RESETS_PER_WINDOW, MAX_CONTROL_FRAMES_PER_WINDOW,
                MAX_CONTINUATIONS)

    def refuse(self) -> None:
        self.refused += 1
        metrics = getattr(self.ep.broker, "metrics", None)
        if metrics is not None:
            metrics.connections_refused["grpc"] += 1

    async def stop(self, grace: float = 1.0) -> None:
        """GOAWAY (NO_ERROR, the last stream each connection took) to every connection, calls in progress get
        ``grace`` seconds to end, then what is left is cancelled (UNAVAILABLE) and the connections close."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.goaway(F.NO_ERROR, close=False)
        deadline = time.monotonic() + grace
        while any(c.streams for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.shutdown()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except asyncio.TimeoutError:
                pass
            self._server = None
        await asyncio.sleep(0)  # the cancelled handlers' finally blocks


class _Read(asyncio.Future):
    """A pending ``read()`` of a stream. ``set_result(None)`` (the core's wake-up) resolves it with the next message,
    the server's ``eof`` once the client ended the stream (or it closed), or the abort error of a message that does
    not parse (INTERNAL "Failed to parse request", as grpc answers); a wake-up with neither leaves it waiting."""

    __slots__ = ("call",)

    def set_result(self, _):
        call = self.call
        inbox = call.inbox
        if not inbox and not (call.remote_closed or call.closed):
            return
        if call.waiter is self:
            call.waiter = None
        if not inbox:
            return super().set_result(call.conn.server.eof)
        if type(inbox) is list and len(inbox) > 8:  # messages queue up: a deque from here on (a list while they do
            inbox = call.inbox = deque(inbox)  # not: an empty deque is ~0.7 KB a held stream, an empty list 56 B)
        data = inbox.pop(0) if type(inbox) is list else inbox.popleft()
        call.conn.consumed(call, len(data))
        try:
            message = call.method.request_type.FromString(data)
        except Exception:
            call.status = (_INTERNAL, "Failed to parse request")
            return self.set_exception(call.conn.server.abort_error())
        super().set_result(message)


class _Context:
    """What ``_Servicer`` uses of grpc's ServicerContext, for one call (stream)."""

    __slots__ = ("call",)

    def __init__(self, call):
        self.call = call

    def invocation_metadata(self):
        call = self.call
        md = call.metadata
        if md is None:
            md = F.invocation_metadata(call.headers)
            if call.inbox is None:  # a unary call keeps it for its other reads; a stream makes it again, or every
                call.metadata = md  # held 5.x session would keep it for its life (~1.4 KB)
        return md

    def peer(self) -> str:
        return self.call.conn.peer

    def time_remaining(self):
        deadline = self.call.deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    async def abort(self, code, details: str = ""):
        call = self.call
        call.status = (_status_of(code), details or "")
        raise call.conn.server.abort_error()

    def read(self):
        """The next request message, as a future to await (grpc's ``read()`` is a coroutine: here a held stream's
        pending read needs no task of its own, ~0.7 KB a session): see :class:`_Read`."""
        call = self.call
        future = _Read(loop=call.conn.loop)
        future.call = call
        if call.inbox or call.remote_closed or call.closed:
            future.set_result(None)
        else:
            call.waiter = future  # the core's set_result(None): a message or the stream's end arrived
        return future

    async def write(self, message):
        call = self.call
        if call.closed:
            return
        call.conn.send_message(call, message.SerializeToString())

    def cancelled(self) -> bool:
        return self.call.closed

    def done(self) -> bool:
        return self.call.closed


class H2Connection(H2Core, asyncio.Protocol):
    """One client connection: the core (frames in, windows, the prepared path; compiled, engine.http2._core, or its
    twin) and what waits on the loop: the calls' handlers, deadlines, keepalive, GOAWAY and closing."""

    __slots__ = ()

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport):
        server = self.server
        self.transport = transport
        if server.stopping or len(server.connections) >= server.max_connections:
            server.refuse()
            self.closed = True
            transport.abort()
            return
        server.connections.add(self)
        self.loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if peer and ":" in peer[0]:
            self.peer = f"ipv6:[{peer[0]}]:{peer[1]}"
        elif peer:
            self.peer = f"ipv4:{peer[0]}:{peer[1]}"
        now = time.monotonic()
        self.last_recv = self.settings_sent_at = now
        transport.write(server._settings)
        self.keepalive = server.alarms.set(self, server.keepalive_s)

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)
        if self.keepalive is not None:
            self.server.alarms.cancel(self, self.keepalive)
            self.keepalive = None
        for call in list(self.streams.values()):
            self._drop(call)

    def eof_received(self):
        return False

    # ---------------------------------------------------------------- writing
    def _stalled(self) -> None:
        """An answer waits for a window (the core's send_message): the keepalive looks at the stall within
        FLOW_STALL_MS."""
        if self.keepalive is not None:
            alarms = self.server.alarms
            alarms.cancel(self, self.keepalive)
            self.keepalive = alarms.set(self, FLOW_STALL_MS / 1000.0 + 0.01)

    def _close(self) -> None:
        """The connection ends: what is written goes first, then the transport closes."""
        self._write_later()
        self.closed = True
        self.transport.close()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.abort()

    def goaway(self, code: int, debug: bytes = b"", close: bool = True) -> None:
        """GOAWAY with the last stream we took; ``close``: the connection ends now (an error), else once its
        calls are done (a graceful stop)."""
        if self.closed:
            return
        if code:
            self.server.goaways[code] = self.server.goaways.get(code, 0) + 1
            log.debug("HTTP/2 connection %s: GOAWAY %d %r", self.peer, code, debug[:80])
        self.going_away = True
        self.write(F.goaway(self.last_sid, code, debug))
        if close:
            if self._out:
                self.transport.write(b"".join(self._out))
                self._out = None
            for call in list(self.streams.values()):
                self._drop(call)
            self._close()
        elif not self.streams and self._out is None:
            self._close()

    def shutdown(self) -> None:
        """The server stops: calls still in progress end UNAVAILABLE, the connection closes."""
        for call in list(self.streams.values()):
            if not call.closed:
                self._finish(call, (_UNAVAILABLE, "the broker is shutting down"))
            self._drop(call)
        if not self.closed:
            self._close()

    # ---------------------------------------------------------------- frames in
    def _open(self, sid, flags, headers):
        """A decoded header block: a new call (or a request's trailers)."""
        end_stream = flags & F.FLAG_END_STREAM
        call = self.streams.get(sid)
        if call is not None:  # trailers of a request
            if not end_stream or call.remote_closed:
                return self._reset(call, F.PROTOCOL_ERROR)
            return self._remote_end(call)
        if sid <= self.last_sid:
            raise FrameError(F.STREAM_CLOSED, "HEADERS on a closed stream")
        self.last_sid = sid
        server = self.server
        if self.going_away:
            self.write(F.rst_stream(sid, F.REFUSED_STREAM))
            return
        if len(self.streams) >= server.max_streams:
            self.write(F.rst_stream(sid, F.REFUSED_STREAM))
            return
        size, path, content_type, encoding, timeout, bad = F.scan_request_headers(headers)
        call = self.new_call(sid, headers)
        call.encoding = encoding
        if end_stream:
            call.remote_closed = True
        if size > server.max_metadata:
            return self._refuse_call(call, _RESOURCE_EXHAUSTED,
                                     f"received metadata size exceeds limit ({size} vs. {server.max_metadata})")
        if bad or path is None or content_type is None or not content_type.startswith(b"application/grpc"):
            return self._refuse_call(call, _INTERNAL if not bad else _INVALID_ARGUMENT, "malformed gRPC request")
        method = server.methods.get(path)
        if method is None:
            return self._refuse_call(call, _UNIMPLEMENTED, "Method not found!")
        if server.calls >= server.max_calls:
            return self._refuse_call(call, _RESOURCE_EXHAUSTED, "too many calls in progress")
        call.method = method
        if timeout is not None:
            call.deadline = time.monotonic() + timeout
        self.streams[sid] = call
        server.calls += 1
        call.reader = F.MessageReader(server.max_message)
        if method.client_streaming:
            call.inbox = []  # read() makes it a deque once messages queue up
            self._start(call, None)
        elif end_stream:
            self._remote_end(call)

    def _refuse_call(self, call, code, message):
        """A call answered at once with a status (trailers only), its stream closed (RST NO_ERROR when the client
        may still be sending)."""
        self.write(F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, call.sid,
                           RESPONSE_HEADERS + status_block(code, message)))
        if not call.remote_closed:
            self.write(F.rst_stream(call.sid, F.NO_ERROR))
        call.closed = True

    def _remote_end(self, call):
        call.remote_closed = True
        if call.reader.buffered:
            return self._finish(call, (_INTERNAL, "the request ended inside a message"))
        if call.inbox is not None:
            waiter = call.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if len(call.messages) != 1:
            return self._finish(call, (_UNIMPLEMENTED if call.messages else _INTERNAL,
                                       "exactly one request message expected"))
        data = call.messages[0]
        call.messages = None
        self.buffered -= call.held
        call.held = 0
        method = call.method
        if method.raw:
            request = data
        else:
            try:
                request = method.request_type.FromString(data)
            except Exception:
                return self._finish(call, (_INTERNAL, "Failed to parse request"))
        self._start(call, request)

    # ---------------------------------------------------------------- calls
    def _start(self, call, request):
        """Run the handler inline; one that waits goes on in a task."""
        call.started = True
        coro = call.method.handler(request, _Context(call))
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return self._finish(call, None, stop.value)
        except self.server.abort_error:
            return self._finish(call, call.status or (_UNKNOWN, ""))
        except Exception:
            self.server.ep.internal_error("native gRPC call")
            return self._finish(call, (_UNKNOWN, "Unexpected error"))
        call.coro = coro
        call.task = self.loop.create_task(self._rest(call, coro, yielded))
        if call.deadline is not None:
            call.timer = self.loop.call_at(self.loop.time() + max(0.0, call.deadline - time.monotonic()),
                                           self._deadline, call)

    async def _rest(self, call, coro, yielded):
        call.coro = None  # started: a cancellation reaches the handler through _resume
        try:
            result = await _resume(coro, yielded)
        except asyncio.CancelledError:
            return  # reset by the client, the deadline, the connection's end: the stream is already answered
        except self.server.abort_error:
            return self._finish(call, call.status or (_UNKNOWN, ""))
        except Exception:
            self.server.ep.internal_error("native gRPC call")
            return self._finish(call, (_UNKNOWN, "Unexpected error"))
        self._finish(call, None, result)

    def _deadline(self, call):
        call.timer = None
        if not call.closed:
            self._finish(call, (_DEADLINE_EXCEEDED, "Deadline Exceeded"))
            if call.task is not None:
                call.task.cancel()

    def _finish(self, call, status, result=None):
        """The call's answer (its last message, if any) and trailers; the stream is done on our side."""
        if call.closed:
            return
        if status is None:
            if result is not None:
                data = result if isinstance(result, bytes) else result.SerializeToString()
                size = len(data) + 5
                if (not call.headers_sent and call.status is None and not call.pending
                        and size <= self.send_window and size <= call.send_window and size <= self.peer_max_frame
                        and size - 5 <= self.server.max_message):
                    # a unary answer that fits the windows (Heartbeat's repeat answer, ...): HEADERS, DATA,
                    # trailers and RST_STREAM as one bytes, the frames send_message and the lines below would write
                    self.send_window -= size
                    call.send_window -= size
                    call.headers_sent = True
                    self.write(F.unary_answer(call.sid, RESPONSE_HEADERS, data, OK_TRAILERS,
                                              not call.remote_closed))
                    self._drop(call)
                    call.closed = True
                    return
                self.send_message(call, data)
            code, message = call.status or (_OK, "")
        else:
            code, message = status
        if call.headers_sent:
            block = OK_TRAILERS if code == 0 and not message else status_block(code, message)
        else:  # trailers only
            block = RESPONSE_HEADERS + status_block(code, message)
            call.headers_sent = True
        trailers = F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, call.sid, block)
        if not call.remote_closed:
            trailers += F.rst_stream(call.sid, F.NO_ERROR)  # the client need not send the rest
        if call.pending:
            call.trailers = trailers
        else:
            self.write(trailers)
            self._drop(call)
        call.closed = True

    def _reset(self, call, code):
        """A stream error: RST_STREAM, the call cancelled."""
        self.write(F.rst_stream(call.sid, code))
        call.closed = True
        self._drop(call)

    def _drop(self, call):
        """The stream leaves the connection: its task cancelled, its bytes released."""
        if self.streams.pop(call.sid, None) is call:
            self.server.calls -= 1
        call.closed = True
        self.buffered -= call.held
        call.held = 0
        if call.pending_size:
            self.pending -= call.pending_size
            call.pending_size = 0
            call.pending = []
        self.blocked.pop(call.sid, None)
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        waiter = call.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        task = call.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            coro, call.coro = call.coro, None
            if coro is not None:  # its task never ran: the handler is told here (its finally blocks run)
                try:
                    coro.throw(asyncio.CancelledError())
                except BaseException:  # noqa: B902 - the cancellation (or the handler's end)
                    pass
                coro.close()
        if self.going_away and not self.streams and not self.closed and self._out is None \
                and self.server.stopping:
            self._close()

    # ---------------------------------------------------------------- keepalive
    def alarm(self):  # engine.alarms: ``keepalive`` is the tick it is set for
        self._keepalive()

    def _keepalive(self):
        """KEEPALIVE_TIME_MS without a frame from the client: a PING; no ACK within KEEPALIVE_TIMEOUT_MS: closed.
        Also: SETTINGS never acknowledged, answers stalled on a window past FLOW_STALL_MS."""
        self.keepalive = None
        if self.closed:
            return
        server = self.server
        now = time.monotonic()
        if self.blocked and now - self.stall_since > FLOW_STALL_MS / 1000.0:
            return self.goaway(F.FLOW_CONTROL_ERROR, b"window not opened")
        if not self.settings_acked and now - self.settings_sent_at > server.keepalive_timeout_s:
            return self.goaway(F.SETTINGS_TIMEOUT, b"SETTINGS not acknowledged")
        if self.ping_sent is not None:
            if now - self.ping_sent > server.keepalive_timeout_s:
                log.debug("HTTP/2 connection %s: keepalive ping not answered, closed", self.peer)
                return self.abort()
            delay = self.ping_sent + server.keepalive_timeout_s - now
        elif now - self.last_recv >= server.keepalive_s:
            self.ping_sent = now
            self.write(F.ping(b"rmqhbkal"))
            delay = server.keepalive_timeout_s
        else:
            delay = self.last_recv + server.keepalive_s - now
        if self.blocked:
            delay = min(delay, FLOW_STALL_MS / 1000.0)
        self.keepalive = self.server.alarms.set(self, max(0.05, delay))

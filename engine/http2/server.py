"""HTTP/2 + gRPC server on the broker's own asyncio loop (issue 30, ``grpcTransport=native``).

One :class:`H2Connection` (an ``asyncio.Protocol``) per client connection: connection preface, SETTINGS and their
ACK, PING, GOAWAY, flow control both ways (connection and stream windows), HEADERS + CONTINUATION (HPACK:
engine.http2), DATA carrying gRPC's length-prefixed messages, RST_STREAM, stream states (RFC 7540 §5.1), trailers
(grpc-status, percent-encoded grpc-message) and grpc-timeout deadlines. Calls are handed to the handlers of
engine.broker.grpc_endpoint's ``_Servicer`` with a context (:class:`_Context`) giving them what they use of grpc's:
``abort``, ``invocation_metadata``, ``peer``, ``read``, ``write``, ``time_remaining``.

A handler coroutine is first run inline, in the callback that received its last frame: one that returns without
waiting (Heartbeat's repeat path, QueryRoute, ...) costs no task; only one that waits becomes a task. A unary call
whose frames come in one read (as the SDKs write them) and whose method has a ``prepared`` answer for it (the
endpoint's: a repeated Heartbeat, a QueryRoute / QueryAssignment asked before) is answered without a call, a context
or a coroutine (:meth:`H2Connection._unary`), byte for byte what the handler's answer would be.

Budgets (README, 5.x gRPC budget table): the endpoint's grpcMax* properties (connections, streams per connection,
calls in progress, message and metadata bytes) and the constants below; past each one the answer named there.
"""
from __future__ import annotations

import asyncio
import logging
import time
import types

from engine.http2 import HpackDecoder, HpackError
from engine.http2 import frames as F
from engine.http2.frames import FrameError

log = logging.getLogger("engine.grpc")

#: our receive window of one stream, bytes (SETTINGS_INITIAL_WINDOW_SIZE): what a client may send on a stream
#: before the server has read it (a Telemetry stream's unread commands are at most this)
STREAM_WINDOW = 1 << 20
#: our receive window of a connection, bytes (refilled as frames arrive: the streams' windows and
#: MAX_BUFFERED_MESSAGES bound what is held)
CONNECTION_WINDOW = 8 << 20
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
RESET_WINDOW_S = 1.0
#: SETTINGS, PRIORITY, empty DATA frames, and PINGs without a HEADERS or DATA frame since the previous PING (a
#: ping after request data is a flow-control probe, as grpc counts them), a client may send per CONTROL_WINDOW_S;
#: past it GOAWAY ENHANCE_YOUR_CALM and the connection ends (a settings / ping flood makes the server write answers)
MAX_CONTROL_FRAMES_PER_WINDOW = 200
CONTROL_WINDOW_S = 1.0
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

# response header blocks without the dynamic table (literals without indexing): the same bytes on every
# connection, no HPACK encoder state to keep
_RESPONSE_HEADERS = (b"\x88"  # :status 200 (static index 8)
                     b"\x0f\x10\x10application/grpc")  # content-type (static name 31), not indexed


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


_OK_TRAILERS = _literal(b"grpc-status", b"0")
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
        #: ``prepared(message, headers, peer) -> bytes | None``: the answer of a request that needs no handler
        #: (Heartbeat's repeat), else None and the handler runs (see H2Connection._unary)
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
        self.stopping = False
        self._settings = F.settings((
            (F.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_streams),
            (F.SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (F.SETTINGS_MAX_HEADER_LIST_SIZE, self.max_metadata),
            (F.SETTINGS_ENABLE_PUSH, 0),
        )) + F.window_update(0, CONNECTION_WINDOW - F.DEFAULT_WINDOW)

    async def start(self, host: str, port: int, ssl=None) -> int:
        loop = asyncio.get_running_loop()
        kw = {} if ssl is None else {"ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT_S}
        self._server = await loop.create_server(lambda: H2Connection(self), host or None, port, ssl=ssl,
                                                reuse_address=True, backlog=1024, **kw)
        return self._server.sockets[0].getsockname()[1]

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


class _Context:
    """What ``_Servicer`` uses of grpc's ServicerContext, for one call (stream)."""

    __slots__ = ("call",)

    def __init__(self, call):
        self.call = call

    def invocation_metadata(self):
        call = self.call
        md = call.metadata
        if md is None:
            md = call.metadata = F.invocation_metadata(call.headers)
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

    async def read(self):
        call = self.call
        while not call.inbox:
            if call.remote_closed or call.closed:
                return call.conn.server.eof
            waiter = call.waiter = call.conn.loop.create_future()
            try:
                await waiter
            finally:
                call.waiter = None
        data = call.inbox.popleft()
        call.conn.consumed(call, len(data))
        try:
            return call.method.request_type.FromString(data)
        except Exception:
            call.status = (_INTERNAL, "Failed to parse request")
            raise call.conn.server.abort_error() from None

    async def write(self, message):
        call = self.call
        if call.closed:
            return
        call.conn.send_message(call, message.SerializeToString())

    def cancelled(self) -> bool:
        return self.call.closed

    def done(self) -> bool:
        return self.call.closed


_RESERVED_HEADERS = F.RESERVED_HEADERS
#: HEADERS flags that keep a call off H2Connection._unary's path (END_STREAM: no DATA follows; PADDED, PRIORITY:
#: a payload to cut) beside END_HEADERS, which it needs
_UNARY_HEADERS_MASK = F.FLAG_END_HEADERS | F.FLAG_END_STREAM | F.FLAG_PADDED | F.FLAG_PRIORITY
_UNARY_DATA_MASK = F.FLAG_END_STREAM | F.FLAG_PADDED  # its DATA: END_STREAM, unpadded
_DATA, _HEADERS, _WINDOW_UPDATE = F.DATA, F.HEADERS, F.WINDOW_UPDATE
_END_HEADERS, _END_STREAM = F.FLAG_END_HEADERS, F.FLAG_END_STREAM


class _Call:
    """One HTTP/2 stream carrying one gRPC call."""

    __slots__ = ("sid", "conn", "method", "headers", "metadata", "deadline", "reader", "inbox",
                 "held", "waiter", "send_window", "recv_window", "pending", "pending_size", "trailers",
                 "headers_sent", "remote_closed", "closed", "task", "status", "encoding", "timer", "started",
                 "messages", "coro")

    def __init__(self, sid, conn, method, headers, send_window):
        self.sid = sid
        self.conn = conn
        self.method = method
        self.headers = headers
        self.metadata = None
        self.deadline = None
        self.reader = None  # its messages out of its DATA (F.MessageReader), once the call is taken
        self.inbox = None  # whole messages not yet read (a streaming call's)
        self.messages = []  # a unary call's messages
        self.held = 0  # bytes of partial and unread messages (the connection's buffered count)
        self.waiter = None
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW
        self.pending = []  # DATA payload waiting for a window
        self.pending_size = 0
        self.trailers = None  # trailers waiting behind pending
        self.headers_sent = False
        self.remote_closed = False
        self.closed = False
        self.task = None
        self.coro = None  # the handler while its task has not started
        self.status = None  # (code, message) set by abort
        self.encoding = None
        self.timer = None
        self.started = False


class H2Connection(asyncio.Protocol):
    # slots: a call touches a dozen of these; with thousands of connections each read finds its connection's state
    # cold, and a slotted object holds it in a few cache lines instead of a dict's table and entries
    __slots__ = ("server", "loop", "transport", "peer", "preface", "reader", "decoder", "streams", "last_sid",
                 "send_window", "recv_window", "peer_initial_window", "peer_max_frame", "got_settings",
                 "settings_acked", "settings_sent_at", "header_block", "buffered", "pending", "blocked", "stall_since",
                 "resets", "resets_since", "control", "control_since", "last_recv", "ping_sent", "fed", "keepalive",
                 "going_away", "closed", "_out", "_later")

    def __init__(self, server: H2Server):
        self.server = server
        self.loop = None
        self.transport = None
        self.peer = ""
        self.preface = b""  # bytes of the preface received so far (until it is whole)
        self.reader = F.FrameReader(F.DEFAULT_MAX_FRAME_SIZE)
        self.decoder = HpackDecoder(4096, server.hard_metadata)
        self.streams: dict[int, _Call] = {}
        self.last_sid = 0
        self.send_window = F.DEFAULT_WINDOW
        self.recv_window = CONNECTION_WINDOW
        self.peer_initial_window = F.DEFAULT_WINDOW
        self.peer_max_frame = F.DEFAULT_MAX_FRAME_SIZE
        self.got_settings = False
        self.settings_acked = False
        self.settings_sent_at = 0.0
        self.header_block = None  # (sid, flags, [payloads], size, continuations) while CONTINUATION is expected
        self.buffered = 0  # bytes of partial and unread messages of all streams
        self.pending = 0  # bytes of answers waiting for a window
        self.blocked: dict[int, _Call] = {}
        self.stall_since = 0.0
        # Rate windows start at their first event, not at connect: a burst that began late in a window opened at
        # connect would be split over two windows and pass under either budget.
        self.resets = 0
        self.resets_since = float("-inf")
        self.control = 0
        self.control_since = float("-inf")
        self.last_recv = 0.0
        self.ping_sent = None  # time.monotonic() of our keepalive ping waiting for its ACK
        self.fed = False  # a HEADERS or non-empty DATA frame came since the last PING
        self.keepalive = None
        self.going_away = False
        self.closed = False
        self._out = None  # frames written while a read is handled: one write at its end
        # frames written outside a read (by handlers in tasks: Telemetry's answers, unary calls that waited, the
        # keepalive): one write when the loop gets to it, however many streams wrote in between
        self._later = None

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
        self.keepalive = self.loop.call_later(server.keepalive_s, self._keepalive)

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)
        if self.keepalive is not None:
            self.keepalive.cancel()
        for call in list(self.streams.values()):
            self._drop(call)

    def data_received(self, data):
        if self.closed:
            return
        self.last_recv = time.monotonic()
        if self.preface is not None:
            buf = self.preface + data
            if len(buf) < 24:
                if not F.PREFACE.startswith(buf):
                    return self.goaway(F.PROTOCOL_ERROR, b"bad connection preface")
                self.preface = buf
                return
            if buf[:24] != F.PREFACE:
                return self.goaway(F.PROTOCOL_ERROR, b"bad connection preface")
            self.preface = None
            data = buf[24:]
        later, self._later = self._later, None  # written before this read: they go first
        self._out = out = later or []
        try:
            frames = self.reader.feed(data)
            i, n = 0, len(frames)
            while i < n:
                ftype, flags, sid, payload = frames[i]
                i += 1
                # a unary call whole in this read: HEADERS (END_HEADERS only), WINDOW_UPDATEs of its stream (grpc
                # C-core sends one), then its DATA (END_STREAM only)
                if (ftype == _HEADERS and i < n and flags & _UNARY_HEADERS_MASK == _END_HEADERS
                        and self.header_block is None and self.got_settings):
                    j = i
                    while j < n and frames[j][0] == _WINDOW_UPDATE and frames[j][2] == sid:
                        j += 1
                    nxt = frames[j] if j < n else None
                    if (nxt is not None and nxt[0] == _DATA and nxt[2] == sid
                            and nxt[1] & _UNARY_DATA_MASK == _END_STREAM
                            and self._unary(sid, payload, nxt[3], frames[i:j] if j > i else ())):
                        i = j + 1
                        if self.closed:
                            return
                        continue
                self._frame(ftype, flags, sid, payload)
                if self.closed:
                    return
        except FrameError as e:
            self.goaway(e.code, str(e).encode()[:200])
        except HpackError as e:
            self.goaway(F.COMPRESSION_ERROR, str(e).encode("ascii", "replace")[:200])
        finally:
            self._out = None
            if out and not self.closed:
                self.transport.write(b"".join(out))
        if not self.closed and self.transport.get_write_buffer_size() > self.server.max_write_buffer:
            self.abort()  # a peer that does not read what it asks for (pings, settings answers)

    def eof_received(self):
        return False

    # ---------------------------------------------------------------- writing
    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self._out is not None:
            self._out.append(data)
        elif self._later is not None:
            self._later.append(data)
        else:
            self._later = [data]
            self.loop.call_soon(self._write_later)

    def _write_later(self) -> None:
        later, self._later = self._later, None
        if later and not self.closed:
            self.transport.write(b"".join(later) if len(later) > 1 else later[0])

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
    def _frame(self, ftype, flags, sid, payload):
        if self.header_block is not None and ftype != F.CONTINUATION:
            raise FrameError(F.PROTOCOL_ERROR, "a header block interrupted")
        if not self.got_settings and ftype != F.SETTINGS:
            raise FrameError(F.PROTOCOL_ERROR, "the first frame is not SETTINGS")
        if ftype == F.DATA:
            self._data(flags, sid, payload)
        elif ftype == F.HEADERS:
            self._headers(flags, sid, payload)
        elif ftype == F.CONTINUATION:
            self._continuation(flags, sid, payload)
        elif ftype == F.WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == F.RST_STREAM:
            self._rst_stream(sid, payload)
        elif ftype == F.SETTINGS:
            self._settings(flags, sid, payload)
        elif ftype == F.PING:
            if sid:
                raise FrameError(F.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise FrameError(F.FRAME_SIZE_ERROR, "PING of a length other than 8")
            if flags & F.FLAG_ACK:
                self.ping_sent = None
            else:
                # a ping after a request frame is a client's flow-control (BDP) probe, as grpc counts them: only
                # pings without a request frame between them count against the budget
                if self.fed:
                    self.fed = False
                else:
                    self._count_control()
                self.write(F.ping(payload, ack=True))
        elif ftype == F.GOAWAY:
            if sid:
                raise FrameError(F.PROTOCOL_ERROR, "GOAWAY on a stream")
            self.going_away = True  # the client opens no more streams; its calls go on
        elif ftype == F.PRIORITY:
            if not sid:
                raise FrameError(F.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise FrameError(F.FRAME_SIZE_ERROR, "PRIORITY of a length other than 5")
            self._count_control()
        elif ftype == F.PUSH_PROMISE:
            raise FrameError(F.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # other types: ignored (RFC 7540 §4.1)

    def _count_control(self):
        now = self.last_recv
        if now - self.control_since > CONTROL_WINDOW_S:
            self.control_since = now
            self.control = 0
        self.control += 1
        if self.control > MAX_CONTROL_FRAMES_PER_WINDOW:
            raise FrameError(F.ENHANCE_YOUR_CALM, "too many control frames")

    def _settings(self, flags, sid, payload):
        if sid:
            raise FrameError(F.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & F.FLAG_ACK:
            if payload:
                raise FrameError(F.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self.settings_acked = True
            return
        if self.got_settings:
            self._count_control()
        self.got_settings = True
        for key, value in F.parse_settings(payload):
            if key == F.SETTINGS_INITIAL_WINDOW_SIZE:
                self.peer_initial_window = F.apply_initial_window(self.streams.values(), self.peer_initial_window,
                                                                  value)
            elif key == F.SETTINGS_MAX_FRAME_SIZE:
                if not F.DEFAULT_MAX_FRAME_SIZE <= value <= F.MAX_MAX_FRAME_SIZE:
                    raise FrameError(F.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == F.SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise FrameError(F.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            # SETTINGS_HEADER_TABLE_SIZE: our answers use no dynamic table; the others do not bind a server
        self.write(F.settings(ack=True))
        if self.blocked:
            self._flush_blocked()

    def _window_update(self, sid, payload):
        if len(payload) != 4:
            raise FrameError(F.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = F.u32(payload) & 0x7FFFFFFF
        if sid == 0:
            if not increment:
                raise FrameError(F.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > F.MAX_WINDOW:
                raise FrameError(F.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
        else:
            call = self.streams.get(sid)
            if call is None:
                if sid > self.last_sid:
                    raise FrameError(F.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                return  # a closed stream's: ignored
            if not increment:
                return self._reset(call, F.PROTOCOL_ERROR)
            call.send_window += increment
            if call.send_window > F.MAX_WINDOW:
                return self._reset(call, F.FLOW_CONTROL_ERROR)
        if self.blocked:
            self._flush_blocked()

    def _rst_stream(self, sid, payload):
        if not sid:
            raise FrameError(F.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise FrameError(F.FRAME_SIZE_ERROR, "RST_STREAM of a length other than 4")
        if sid > self.last_sid:
            raise FrameError(F.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        now = self.last_recv
        if now - self.resets_since > RESET_WINDOW_S:
            self.resets_since = now
            self.resets = 0
        self.resets += 1
        if self.resets > MAX_RESETS_PER_WINDOW:
            raise FrameError(F.ENHANCE_YOUR_CALM, "too many stream resets")
        call = self.streams.get(sid)
        if call is not None:
            call.closed = True
            self._drop(call)

    def _headers(self, flags, sid, payload):
        self.fed = True
        if not sid or not sid & 1:
            raise FrameError(F.PROTOCOL_ERROR, "HEADERS on stream 0 or an even stream")
        pos, end = 0, len(payload)
        if flags & F.FLAG_PADDED:
            if not payload:
                raise FrameError(F.PROTOCOL_ERROR, "padded HEADERS without a pad length")
            pos = 1
            end -= payload[0]
        if flags & F.FLAG_PRIORITY:
            pos += 5
        if end < pos:
            raise FrameError(F.PROTOCOL_ERROR, "HEADERS padding past its payload")
        block = payload[pos:end] if pos or end != len(payload) else payload
        if flags & F.FLAG_END_HEADERS:
            self._header_block(sid, flags, block)
        else:
            if len(block) > self.server.hard_metadata:
                raise FrameError(F.ENHANCE_YOUR_CALM, "header block too large")
            self.header_block = [sid, flags, [block], len(block), 0]

    def _continuation(self, flags, sid, payload):
        hb = self.header_block
        if hb is None or hb[0] != sid:
            raise FrameError(F.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        hb[2].append(payload)
        hb[3] += len(payload)
        hb[4] += 1
        if hb[3] > self.server.hard_metadata or hb[4] > MAX_CONTINUATIONS:
            raise FrameError(F.ENHANCE_YOUR_CALM, "CONTINUATION flood")
        if flags & F.FLAG_END_HEADERS:
            self.header_block = None
            self._header_block(sid, hb[1], b"".join(hb[2]))

    def _unary(self, sid, block, body, updates=()) -> bool:
        """A unary call whose HEADERS and DATA (END_STREAM) came in one read, for a method with a prepared answer
        (Heartbeat's repeat): answered here, without a _Call, a context or the handler's coroutine; the frames and
        windows counted as _headers, _window_update (``updates``: WINDOW_UPDATE frames of the stream between its
        HEADERS and DATA) and _data count them. False (nothing done): the frames take the general path, as do, once
        the header block is decoded, a request the checks below do not pass or one ``prepared`` declines (its
        handler then runs)."""
        server = self.server
        n = len(body)
        if (not sid & 1 or sid <= self.last_sid or self.going_away or len(self.streams) >= server.max_streams
                or server.calls >= server.max_calls or n > self.recv_window or n > STREAM_WINDOW
                or self.buffered + n > MAX_BUFFERED_MESSAGES * server.max_message + STREAM_WINDOW):
            return False  # (the last: the general path's answer to request bytes held past the budget)
        stream_window = self.peer_initial_window
        for update in updates:  # what _window_update would do on the open stream; its errors: the general path
            increment = F.u32(update[3]) & 0x7FFFFFFF if len(update[3]) == 4 else 0
            stream_window += increment
            if not increment or stream_window > F.MAX_WINDOW:
                return False
        self.fed = True
        headers = self.decoder.decode(block)  # from here the frames are taken: the HPACK table has moved on
        # the path of a well-formed unary request whose body is one uncompressed message within the budgets
        path = F.unary_path(headers, body, server.max_metadata, server.max_message)
        method = None if path is None else server.methods.get(path)
        answer = None
        if method is not None and method.prepared is not None:
            try:
                answer = method.prepared(body[5:], headers, self.peer)
            except Exception:  # a bug: the handler answers instead, as the general path would run it
                server.ep.internal_error("native gRPC prepared answer")
        if answer is None:
            self._open(sid, F.FLAG_END_HEADERS, headers)
            for update in updates:
                if not self.closed:
                    self._window_update(sid, update[3])
            if not self.closed:
                self._data(F.FLAG_END_STREAM, sid, body)
            return True
        self.last_sid = sid
        self.recv_window -= n
        if self.recv_window < CONNECTION_WINDOW // 2:
            self.write(F.window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        size = len(answer) + 5
        if (size <= self.send_window and size <= stream_window and size <= self.peer_max_frame
                and size - 5 <= server.max_message):
            self.send_window -= size
            self.write(F.unary_answer(sid, _RESPONSE_HEADERS, answer, _OK_TRAILERS, False))
        else:  # no window for it now: a call waiting for one, as _finish queues it
            call = _Call(sid, self, method, headers, stream_window)
            call.remote_closed = call.started = True
            self.streams[sid] = call
            server.calls += 1
            self._finish(call, None, answer)
        return True

    def _header_block(self, sid, flags, block):
        self._open(sid, flags, self.decoder.decode(block))  # always decoded: the HPACK table stays in sync

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
        call = _Call(sid, self, None, headers, self.peer_initial_window)
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
            from collections import deque
            call.inbox = deque()
            self._start(call, None)
        elif end_stream:
            self._remote_end(call)

    def _refuse_call(self, call, code, message):
        """A call answered at once with a status (trailers only), its stream closed (RST NO_ERROR when the client
        may still be sending)."""
        self.write(F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, call.sid,
                           _RESPONSE_HEADERS + status_block(code, message)))
        if not call.remote_closed:
            self.write(F.rst_stream(call.sid, F.NO_ERROR))
        call.closed = True

    def _data(self, flags, sid, payload):
        n = len(payload)
        if not sid:
            raise FrameError(F.PROTOCOL_ERROR, "DATA on stream 0")
        self.recv_window -= n
        if self.recv_window < 0:
            raise FrameError(F.FLOW_CONTROL_ERROR, "DATA past the connection window")
        if self.recv_window < CONNECTION_WINDOW // 2:
            self.write(F.window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        if not n and not flags & F.FLAG_END_STREAM:
            self._count_control()
        else:
            self.fed = True
        call = self.streams.get(sid)
        if call is None:
            if sid > self.last_sid:
                raise FrameError(F.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream closed (reset or answered) while the client was sending: ignored
        if call.remote_closed:
            return self._reset(call, F.STREAM_CLOSED)
        call.recv_window -= n
        if call.recv_window < 0:
            return self._reset(call, F.FLOW_CONTROL_ERROR)
        if flags & F.FLAG_PADDED:
            if not n or payload[0] >= n:
                raise FrameError(F.PROTOCOL_ERROR, "DATA padding past its payload")
            payload = payload[1:n - payload[0]]
        if payload and not self._receive(call, payload):
            return
        if call.recv_window < STREAM_WINDOW // 2 and (call.inbox is None or call.held < STREAM_WINDOW):
            self.write(F.window_update(sid, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW
        if flags & F.FLAG_END_STREAM:
            self._remote_end(call)

    def _receive(self, call, payload) -> bool:
        """gRPC messages out of a stream's DATA: whole ones to the call, a partial one kept (its declared length
        within grpcMaxMessageBytes, the connection's buffered bytes within MAX_BUFFERED_MESSAGES). ``held``: the
        call's partial and not yet handled messages' bytes (with their prefixes)."""
        server = self.server
        n = len(payload)
        call.held += n
        self.buffered += n
        if self.buffered > MAX_BUFFERED_MESSAGES * server.max_message + STREAM_WINDOW:
            self._finish(call, (_RESOURCE_EXHAUSTED, "too many request bytes held on this connection"))
            return False
        # F.MessageReader: a message spread over frames grows in place, its declared length checked on its prefix
        reader = call.reader
        for message in reader.feed(payload):
            if call.inbox is not None:
                call.inbox.append(message)
                waiter = call.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            else:
                call.messages.append(message)
                if len(call.messages) > 1:
                    self._finish(call, (_UNIMPLEMENTED, "more than one request message for a unary call"))
                    return False
        if reader.error == F.MESSAGE_COMPRESSED:
            if call.encoding in (None, b"identity"):
                status = (_INTERNAL, "Compressed message but no grpc-encoding (compressed flag set)")
            else:
                status = (_UNIMPLEMENTED, "Compression is not supported by this server (grpc-encoding "
                          f"{call.encoding[:40].decode('ascii', 'replace')})")
            self._finish(call, status)
            return False
        if reader.error:
            self._finish(call, (_RESOURCE_EXHAUSTED, f"Received message larger than max ({reader.error_length} vs. "
                                f"{server.max_message})"))
            return False
        return True

    def consumed(self, call, n) -> None:
        """A streaming call's message was read: its bytes are released, the stream's window reopens."""
        n += 5
        call.held -= n
        self.buffered -= n
        if (not call.remote_closed and not call.closed and call.recv_window < STREAM_WINDOW // 2
                and call.held < STREAM_WINDOW):
            self.write(F.window_update(call.sid, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW

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
                    self.write(F.unary_answer(call.sid, _RESPONSE_HEADERS, data, _OK_TRAILERS,
                                              not call.remote_closed))
                    self._drop(call)
                    call.closed = True
                    return
                self.send_message(call, data)
            code, message = call.status or (_OK, "")
        else:
            code, message = status
        if call.headers_sent:
            block = _OK_TRAILERS if code == 0 and not message else status_block(code, message)
        else:  # trailers only
            block = _RESPONSE_HEADERS + status_block(code, message)
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

    def send_message(self, call, data: bytes) -> None:
        n = len(data)
        if n > self.server.max_message:
            call.status = (_RESOURCE_EXHAUSTED, f"Sent message larger than max ({n} vs. {self.server.max_message})")
            return
        out = [] if call.headers_sent else [F.frame(F.HEADERS, F.FLAG_END_HEADERS, call.sid, _RESPONSE_HEADERS)]
        call.headers_sent = True
        size = n + 5
        if not call.pending and size <= self.send_window and size <= call.send_window and size <= self.peer_max_frame:
            self.send_window -= size
            call.send_window -= size
            out.append(F.data_message(call.sid, data))
            self.write(b"".join(out) if len(out) > 1 else out[0])
            return
        if out:
            self.write(out[0])
        payload = b"\x00" + n.to_bytes(4, "big") + data
        call.pending.append(payload)
        call.pending_size += size
        self.pending += size
        if self.pending > MAX_PENDING_MESSAGES * self.server.max_message + STREAM_WINDOW:
            return self.goaway(F.FLOW_CONTROL_ERROR, b"answers waiting for a window past the budget")
        if not self.blocked:
            self.stall_since = time.monotonic()
            if self.keepalive is not None:  # the stall is looked at within FLOW_STALL_MS
                self.keepalive.cancel()
                self.keepalive = self.loop.call_later(FLOW_STALL_MS / 1000.0 + 0.01, self._keepalive)
        self.blocked[call.sid] = call
        self._flush_blocked()

    def _flush_blocked(self):
        progressed = False
        for sid, call in list(self.blocked.items()):
            while call.pending and self.send_window > 0 and call.send_window > 0:
                chunk = call.pending[0]
                n = min(len(chunk), self.send_window, call.send_window, self.peer_max_frame)
                if n < len(chunk):
                    call.pending[0] = chunk[n:]
                    chunk = chunk[:n]
                else:
                    call.pending.pop(0)
                self.send_window -= n
                call.send_window -= n
                call.pending_size -= n
                self.pending -= n
                self.write(F.frame(F.DATA, 0, sid, chunk))
                progressed = True
            if not call.pending:
                del self.blocked[sid]
                if call.trailers is not None:
                    self.write(call.trailers)
                    call.trailers = None
                    self._drop(call)
        if progressed:
            self.stall_since = time.monotonic()

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
        self.keepalive = self.loop.call_later(max(0.05, delay), self._keepalive)

"""Load generator for RocketMQ 5.x endpoints (`rmqhb loadgen --protocol grpc`): thousands of simulated 5.x SDK
clients (sessions) against any gRPC MessagingService port: this broker's (either grpcTransport) or a RocketMQ 5.x
proxy's.

Each session is what a 5.x SDK client does on one endpoint: at start QueryRoute for its topic and its Telemetry
stream (bidirectional, never ended by the client) with its Settings first (producers publish to one topic, push
consumers subscribe one group to one topic with a TAG expression); then unary Heartbeat calls, QueryAssignment
every ``--assignment-interval`` s for push consumers (the SDKs' 5 s scan) and QueryRoute every
``--route-interval`` s (their 30 s route refresh); at shutdown NotifyClientTermination, then the end of its
Telemetry stream. Several sessions share one HTTP/2 connection (``--sessions-per-connection``), as the SDKs of one
process do (grpcio, Go); every call carries the SDK metadata (x-mq-client-id, x-mq-language, x-mq-client-version,
x-mq-protocol, x-mq-date-time, a fresh x-mq-request-id) and the SDKs' 3 s deadline. The fleet is varied: languages
(Java, Go, Python, C++, .NET with their SDK versions), producers and consumers, ``--groups`` groups over
``--topics`` topics; ``--vary`` also sends each Heartbeat in two encodings in turn (the same request as
different bytes, which a server's repeat path must not take for a repeat: a consumer's fields in the other order,
a producer's one field twice).

The client side is a small HTTP/2 client on asyncio over engine.http2 (frame serializers, FrameReader, HPACK with
the dynamic table as grpc clients use it): h2c, or TLS with ALPN h2 (``--tls``, no certificate check, as the 5.x
Java client's default); it honours the server's SETTINGS (concurrent streams: calls past them wait for a stream;
initial window, frame size, header table size), sends WINDOW_UPDATE for what it receives, answers PING, and
stops opening streams on GOAWAY. Requests are protobuf bodies encoded once per session (the official
``rocketmq.grpc_protocol`` messages); answers are checked without a parse when they repeat the bytes of an OK
answer.

Scenarios as the remoting load generator's (``engine.loadgen``): ``steady`` (sessions register, then heartbeat
for ``--duration`` s: ``--rate R`` offered heartbeats/s over the sessions, a 5.x fleet's is sessions / 10;
``--rate 0`` closed loop with ``--depth`` heartbeats in flight per session, or ``--inflight`` over all) and
``storm`` (every session registers at once: the time until their Settings are answered). The same JSON result
(heartbeats/s, latency percentiles, broker CPU with ``--server-pid``, a per-second timeline), progress line and
``--plot`` SVG, plus the calls by method and the errors by status.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import ssl as _ssl
import sys
import time
from collections import Counter, deque

from engine import loadgen as L
from engine.http2 import HpackDecoder, HpackEncoder, HpackError
from engine.http2 import frames as F
from engine.http2.frames import FrameError
from engine.http2.server import MAX_CONTINUATIONS

SERVICE = "/apache.rocketmq.v2.MessagingService/"
HEARTBEAT, TELEMETRY, QUERY_ROUTE, QUERY_ASSIGNMENT, NOTIFY_TERMINATION = range(5)
METHODS = ("Heartbeat", "Telemetry", "QueryRoute", "QueryAssignment", "NotifyClientTermination")
PATHS = tuple((SERVICE + m).encode() for m in METHODS)
RESPONSES = ("HeartbeatResponse", "TelemetryCommand", "QueryRouteResponse", "QueryAssignmentResponse",
             "NotifyClientTerminationResponse")

#: grpc status codes by number (the names grpc's clients report)
GRPC_STATUS = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
               "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
               "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
H2_ERRORS = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
             "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR",
             "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")

#: the largest answer message we take (grpc clients' default max receive size); past it the call is cancelled
MAX_MESSAGE = 4 << 20
#: our receive windows (SETTINGS_INITIAL_WINDOW_SIZE per stream; the connection's by WINDOW_UPDATE), bytes. They
#: reopen as whole messages are read: what a server makes us hold is at most one partial message per stream and
#: CONNECTION_WINDOW per connection
STREAM_WINDOW = MAX_MESSAGE + 5
CONNECTION_WINDOW = 16 << 20
#: --core-frames: the increment of the WINDOW_UPDATE a call's new stream gets before its DATA (grpc C-core sends
#: one; a few bytes, so what a server may send on a stream stays STREAM_WINDOW and this)
CORE_STREAM_UPDATE = 5
#: a header block (HEADERS + CONTINUATION) and its decoded list at most (SETTINGS_MAX_HEADER_LIST_SIZE we announce);
#: a block also has at most MAX_CONTINUATIONS CONTINUATION frames (32, engine.http2.server's): past either the
#: connection ends (GOAWAY ENHANCE_YOUR_CALM, counted as "connection: HTTP/2 protocol error")
MAX_HEADER_LIST = 64 << 10
#: bytes written and not yet taken by the server past which a connection sends no new call (a server that reads
#: nothing cannot make the load generator's memory grow): the call counts as not sent; past twice it (our ACKs to
#: a server flooding PING or SETTINGS and reading nothing) the connection is closed, counted
MAX_WRITE_BUFFER = 4 << 20
#: the SDKs' request timeout, sent as grpc-timeout on unary calls and kept by us as they keep it: a unary call
#: (waiting for a stream or sent) older than DEADLINE_S ends DEADLINE_EXCEEDED, its stream reset (RST_STREAM
#: CANCEL); checked every DEADLINE_SWEEP_S
DEADLINE = b"3S"
DEADLINE_S = 3.0
DEADLINE_SWEEP_S = 0.5
#: calls waiting for a stream on one connection at most (a server announcing MAX_CONCURRENT_STREAMS 0, or holding
#: its streams); past it a call is counted not sent ("not sent: no stream free")
MAX_WAITING = 4096
#: --rate at most (Heartbeats/s over all processes): far past what one machine sends
MAX_RATE = 10_000_000
#: calls of one kind one loop pass sends at most: an offered rate the loop cannot keep up with falls behind
#: (sent < offered in the result) instead of each pass's backlog growing faster than it is sent, so the run
#: still ends at its duration
MAX_TICK_CALLS = 10_000
#: the SDKs' periods: QueryAssignment of a push consumer, QueryRoute of every client, s
ASSIGNMENT_INTERVAL_S = 5.0
ROUTE_INTERVAL_S = 30.0
#: how long a connection may take to show it speaks HTTP/2 (the server's SETTINGS), s
HANDSHAKE_TIMEOUT_S = 10.0
#: registration waits for Settings answers while some come: once none has come for this long (or after
#: REGISTER_LIMIT_S in all), the sessions still unanswered are counted as errors ("Settings not answered") and
#: the run goes on without them, s
REGISTER_STALL_S = 10.0
REGISTER_LIMIT_S = 120.0

#: (x-mq-language, Settings user_agent language, SDK version) of the simulated fleet, in proportion
SDKS = (("JAVA", "JAVA", "5.0.7"), ("JAVA", "JAVA", "5.0.7"), ("JAVA", "JAVA", "5.0.5"), ("GOLANG", "GOLANG", "5.1.0"),
        ("PYTHON", "PYTHON", "5.1.2"), ("CPP", "CPP", "5.0.1"), ("DOTNET", "DOT_NET", "5.1.0"),
        ("JAVA", "JAVA", "5.0.7"))

#: progress fields a worker publishes (the parent's progress line)
PROGRESS_FIELDS = ("sessions", "sent", "answered", "errors")


class LoadgenError(Exception):
    """What stops a run before it starts, as one line for the user."""


def load_protocol():
    """The 5.x protobuf messages (the official client's generated modules, the grpc extra)."""
    try:
        from rocketmq.grpc_protocol import definition_pb2, service_pb2
    except ImportError:
        raise LoadgenError("--protocol grpc needs the grpc extra (the rocketmq 5.x protocol messages): "
                           "pip install 'rocketmq-heartbeat-engine[grpc]'") from None
    return definition_pb2, service_pb2


def grpc_message(data: bytes) -> bytes:
    """A gRPC length-prefixed message: uncompressed flag, 4-byte length, the message."""
    return b"\x00" + len(data).to_bytes(4, "big") + data


# ---------------------------------------------------------------------------------------------------------------
# Sessions: the simulated SDK clients


class Session:
    """One 5.x client on one endpoint: its metadata and its requests, encoded once."""

    __slots__ = ("index", "client_id", "consumer", "group", "topic", "metadata", "settings", "heartbeats", "route",
                 "assignment", "termination", "conn", "telemetry", "registered", "settled", "started",
                 "hb_turn", "terminated")

    def __init__(self, index: int, token: str, groups: int, topics: int, consumer_share: float, topic_prefix: str,
                 host: str, port: int, vary: bool, d, s):
        g = index % groups
        self.index = index
        language, ua_language, version = SDKS[index % len(SDKS)]
        # the Java SDK's client id shape: host@pid@index@time-based suffix (the token: unique per run)
        self.client_id = f"loadgen-{index % 97}@{4000 + index // 97}@{index}@{token}"
        self.consumer = (index * 41) % 100 < consumer_share * 100  # the share in every 100, well mixed
        self.topic = f"{topic_prefix}{g % topics}"
        self.group = f"GID_load_{g}" if self.consumer else None
        self.metadata = ((b"x-mq-language", language.encode()), (b"x-mq-protocol", b"v2"),
                         (b"x-mq-client-version", version.encode()))
        endpoints = d.Endpoints(scheme=d.AddressScheme.IPv6 if ":" in host else d.AddressScheme.IPv4
                                if host.replace(".", "").isdigit() else d.AddressScheme.DOMAIN_NAME)
        endpoints.addresses.add(host=host, port=port)
        st = d.Settings()
        st.access_point.CopyFrom(endpoints)
        st.request_timeout.seconds = 3
        st.user_agent.language = d.Language.Value(ua_language)
        st.user_agent.version = version
        st.user_agent.platform = "Linux 5.15 amd64"
        st.user_agent.hostname = f"loadgen-{index % 97}"
        hb = s.HeartbeatRequest()
        if self.consumer:
            st.client_type = hb.client_type = d.ClientType.PUSH_CONSUMER
            st.subscription.group.name = hb.group.name = self.group
            e = st.subscription.subscriptions.add()
            e.topic.name = self.topic
            e.expression.type = d.FilterType.TAG
            e.expression.expression = "TagA || TagB" if index % 3 else f"Tag{g % 5}"
            st.subscription.fifo = False
            st.subscription.receive_batch_size = 32
            st.subscription.long_polling_timeout.seconds = 30
            self.assignment = grpc_message(s.QueryAssignmentRequest(
                topic=d.Resource(name=self.topic), group=d.Resource(name=self.group),
                endpoints=endpoints).SerializeToString())
            self.termination = grpc_message(s.NotifyClientTerminationRequest(
                group=d.Resource(name=self.group)).SerializeToString())
        else:
            st.client_type = hb.client_type = d.ClientType.PRODUCER
            st.publishing.topics.add(name=self.topic)
            st.publishing.max_body_size = 4 << 20
            st.publishing.validate_message_type = True
            self.assignment = None
            self.termination = grpc_message(s.NotifyClientTerminationRequest().SerializeToString())
        self.settings = grpc_message(s.TelemetryCommand(settings=st).SerializeToString())
        body = hb.SerializeToString()
        self.heartbeats = [grpc_message(body)]
        if vary:
            # the same request as other bytes: its fields in the other order (protobuf parsers take any order), or
            # a producer's one field twice (the last one wins)
            fields = _fields(body)
            other = b"".join(fields[::-1]) if len(fields) > 1 else body + fields[-1]
            self.heartbeats.append(grpc_message(other))
        self.route = grpc_message(s.QueryRouteRequest(topic=d.Resource(name=self.topic),
                                                      endpoints=endpoints).SerializeToString())
        self.conn = None
        self.telemetry = None  # its Telemetry stream while open
        self.registered = False  # Settings answered OK
        self.settled = False  # registered, or refused
        self.started = 0.0
        self.hb_turn = 0
        self.terminated = False


def _fields(body: bytes) -> list:
    """A serialized message's top-level fields as their bytes (tag, length, value: the HeartbeatRequest's
    fields are length-delimited or small varints)."""
    out, pos = [], 0
    while pos < len(body):
        start = pos
        tag = body[pos]
        pos += 1
        if tag & 7 == 0:  # varint
            while body[pos] & 0x80:
                pos += 1
            pos += 1
        else:  # length-delimited (lengths below 128 here)
            pos += 1 + body[pos]
        out.append(body[start:pos])
    return out


def make_sessions(n: int, offset: int, token: str, groups: int, topics: int, consumer_share: float,
                  topic_prefix: str, host: str, port: int, vary: bool) -> list:
    d, s = load_protocol()
    return [Session(i, token, groups, topics, consumer_share, topic_prefix, host, port, vary, d, s)
            for i in range(offset, offset + n)]


# ---------------------------------------------------------------------------------------------------------------
# The HTTP/2 client connection


class Stream:
    __slots__ = ("sid", "kind", "session", "t0", "reader", "messages", "status", "message", "send_window", "pending",
                 "end_pending", "recv_used", "recv_window", "http_status", "local_closed", "body", "end", "attempt")

    def __init__(self, sid, kind, session, t0, send_window, body, end, attempt):
        self.sid = sid
        self.kind = kind
        self.session = session
        self.t0 = t0
        self.body, self.end, self.attempt = body, end, attempt  # what a refused stream sends again
        self.reader = F.MessageReader(MAX_MESSAGE)  # its answer's messages out of DATA (None once cancelled)
        self.messages = []  # a unary call's answer messages
        self.status = None  # grpc-status once its trailers came
        self.message = b""  # grpc-message
        self.send_window = send_window
        self.pending = b""  # DATA waiting for a window
        self.end_pending = False  # END_STREAM goes with the last of ``pending``
        self.recv_used = 0  # bytes received since our last WINDOW_UPDATE of the stream
        self.recv_window = STREAM_WINDOW  # what the server may still send on it (our SETTINGS, our updates)
        self.http_status = None
        self.local_closed = False


class ConnectError(Exception):
    """The peer is no HTTP/2 gRPC endpoint, or refused the connection: one line."""


class GrpcConn(asyncio.Protocol):
    """One HTTP/2 client connection carrying the calls of several sessions."""

    def __init__(self, runner, authority: bytes, scheme: bytes):
        self.runner = runner
        self.authority = authority
        self.scheme = scheme
        self.transport = None
        self.loop = asyncio.get_running_loop()
        self.handshake = self.loop.create_future()  # None once the server's SETTINGS came, else a ConnectError
        self.closed = self.loop.create_future()
        self.first = b""  # the first bytes, checked to be HTTP/2 (a remoting or HTTP/1 port is said so); then None
        self.reader = F.FrameReader(F.DEFAULT_MAX_FRAME_SIZE)
        self.encoder = HpackEncoder()
        self.decoder = HpackDecoder(4096, MAX_HEADER_LIST)
        self.streams: dict[int, Stream] = {}
        self.next_sid = 1
        self.max_streams = 100  # until the server's SETTINGS say otherwise (RFC 7540 says unlimited)
        self.pinging = False  # --core-frames: our flow-control (BDP) PING waits for its ACK
        self.ended_calls = False  # --core-frames: a unary call ended in this read
        self.peer_initial_window = F.DEFAULT_WINDOW
        self.peer_max_frame = F.DEFAULT_MAX_FRAME_SIZE
        self.send_window = F.DEFAULT_WINDOW
        self.recv_used = 0
        self.recv_window = CONNECTION_WINDOW  # what the server may still send on the connection
        self.blocked: dict[int, Stream] = {}  # streams with DATA waiting for a window, in order
        self.waiting = deque()  # calls waiting for a stream: (kind, session, body, end, send time, attempt)
        self.unary = 0  # unary calls in flight (they have deadlines; a Telemetry stream has none)
        self.header_block = None  # [sid, flags, [payloads], size] while CONTINUATION is expected
        self.goaway = None  # (last stream id, code, debug) once the server sent GOAWAY
        self.out = []
        self.sessions: list[Session] = []
        self.inflight = 0  # closed loop: heartbeats kept in flight on this connection
        self.hb_turn = 0
        self.bye = False
        self.lost = False

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        transport.write(F.PREFACE + F.settings(((F.SETTINGS_ENABLE_PUSH, 0),
                                                (F.SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                                                (F.SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
                        + F.window_update(0, CONNECTION_WINDOW - F.DEFAULT_WINDOW))
        self.runner.watch(self)

    def connection_lost(self, exc):
        self.lost = True
        if not self.handshake.done():
            hint = "" if self.runner.tls is not None else "; a TLS port? add --tls"
            self.handshake.set_result(ConnectError(
                "closed the connection before any HTTP/2 frame: no gRPC (HTTP/2) port, or it refused the "
                f"connection (a remoting port? use --protocol remoting{hint})"))
        for st in list(self.streams.values()):
            self._finish(st, None, b"connection lost")
        self.runner.connection_lost(self)
        if not self.closed.done():
            self.closed.set_result(exc)

    def data_received(self, data):
        if self.first is not None:
            data = self._check_first(data)
            if not data:
                return
        try:
            frames = self.reader.feed(data)
            self.ended_calls = False
            for ftype, flags, sid, payload in frames:
                if ftype == F.DATA:
                    self._data(flags, sid, payload)
                elif ftype == F.HEADERS or ftype == F.CONTINUATION:
                    self._headers(ftype, flags, sid, payload)
                else:
                    self._control(ftype, flags, sid, payload)
        except FrameError as e:
            self._error(e.code, str(e))
        except HpackError as e:
            self._error(F.COMPRESSION_ERROR, f"HPACK: {e}")
        if self.ended_calls and self.runner.core_frames and not self.pinging:
            # grpc C-core's BDP estimator pings when data arrives and none of its pings is in flight
            self.pinging = True
            self.out.append(F.ping(b"rmqhbbdp"))
        self.flush()
        if self.runner.dirty:  # calls the answers sent on other connections (closed loop, sessions in turn)
            self.runner.flush()

    # ------------------------------------------------------------------ frames in
    def _check_first(self, data) -> bytes:
        """The first frame of an HTTP/2 server is its SETTINGS (or a GOAWAY); anything else is said in one line.
        Returns the bytes to read as frames once the first 9 are here (b"" until then, or when refused)."""
        head = self.first + data
        if len(head) < 9 and head[:5] != b"HTTP/":
            self.first = head
            return b""
        self.first = None
        if head[:5] == b"HTTP/":
            reason = "answered HTTP/1.x, not HTTP/2: no gRPC port"
        elif head[:1] in (b"\x15", b"\x16") and head[1:2] == b"\x03":
            reason = "answered with TLS: it is a TLS port (add --tls)"
        elif (head[3] == F.SETTINGS and not head[4] & F.FLAG_ACK or head[3] == F.GOAWAY) \
                and head[5:9] == b"\0\0\0\0":
            return head
        else:
            reason = ("did not answer with HTTP/2 SETTINGS: no gRPC (HTTP/2) port (a remoting port? use "
                      "--protocol remoting)")
        if not self.handshake.done():
            self.handshake.set_result(ConnectError(reason))
        self.transport.abort()
        return b""

    def _data(self, flags, sid, payload):
        n = len(payload)
        # DATA past the windows we announced is the server's FLOW_CONTROL_ERROR: a server ignoring them would make
        # us hold without bound what our windows limit (CONNECTION_WINDOW per connection)
        self.recv_window -= n
        if self.recv_window < 0:
            raise FrameError(F.FLOW_CONTROL_ERROR, "DATA past our connection window")
        st = self.streams.get(sid)
        if st is None:
            return self._give_back(n)  # a stream we reset or finished: nothing of it is held
        st.recv_window -= n
        if st.recv_window < 0:
            raise FrameError(F.FLOW_CONTROL_ERROR, "DATA past our stream window")
        consumed = 0
        if flags & F.FLAG_PADDED:
            if not n or payload[0] >= n:
                raise FrameError(F.PROTOCOL_ERROR, "DATA padding past its payload")
            consumed = payload[0] + 1
            payload = payload[1:n - payload[0]]
        if payload:
            reader = st.reader
            held = reader.buffered
            messages = reader.feed(payload)
            if st.kind == TELEMETRY:
                for msg in messages:
                    self.runner.telemetry_message(st.session, msg)
            elif len(st.messages) + len(messages) > 1:  # a unary call is answered with one message
                return self._cancel(st, n + held, 2, b"several answer messages")
            elif messages:
                st.messages.append(messages[0])
            if reader.error == F.MESSAGE_TOO_LARGE:
                return self._cancel(st, n + held, 8, b"answer larger than 4 MiB")
            if reader.error:  # compressed, though we asked for no grpc-encoding: INTERNAL, as grpc clients say
                return self._cancel(st, n + held, 13, b"compressed answer without grpc-encoding")
            # consumed: what the reader no longer holds
            consumed += held + len(payload) - reader.buffered
        # our windows reopen by what was read as whole messages: a stream holds at most one partial message
        # (STREAM_WINDOW), a connection at most CONNECTION_WINDOW of them
        self._give_back(consumed, None if flags & F.FLAG_END_STREAM else st)
        if flags & F.FLAG_END_STREAM:
            self._finish(st, st.status, st.message if st.status is not None else _no_status(st))

    def _cancel(self, st: Stream, held: int, status: int, why: bytes) -> None:
        """The call ends on our side (RST_STREAM CANCEL) with ``status``; the bytes it held are given back."""
        st.reader = None  # what it held is given back here, not again at its end
        st.local_closed = True
        self.out.append(F.rst_stream(st.sid, F.CANCEL))
        self._give_back(held)
        self._finish(st, status, why)

    def _give_back(self, n: int, st: Stream | None = None) -> None:
        self.recv_used += n
        if self.recv_used >= CONNECTION_WINDOW // 2:
            self.out.append(F.window_update(0, self.recv_used))
            self.recv_window += self.recv_used
            self.recv_used = 0
        if st is not None:
            st.recv_used += n
            if st.recv_used >= STREAM_WINDOW // 2:
                self.out.append(F.window_update(st.sid, st.recv_used))
                st.recv_window += st.recv_used
                st.recv_used = 0

    def _headers(self, ftype, flags, sid, payload):
        if ftype == F.CONTINUATION:
            hb = self.header_block
            if hb is None or hb[0] != sid:
                raise FrameError(F.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            hb[2].append(payload)
            hb[3] += len(payload)
            if hb[3] > MAX_HEADER_LIST:
                raise FrameError(F.ENHANCE_YOUR_CALM, "header block past our header list size")
            if len(hb[2]) > 1 + MAX_CONTINUATIONS:  # empty ones add no bytes: their count is bounded too
                raise FrameError(F.ENHANCE_YOUR_CALM, "CONTINUATION flood")
            if not flags & F.FLAG_END_HEADERS:
                return
            self.header_block = None
            flags, block = hb[1], b"".join(hb[2])
        else:
            if self.header_block is not None:
                raise FrameError(F.PROTOCOL_ERROR, "a header block interrupted")
            pos, end = 0, len(payload)
            if flags & F.FLAG_PADDED:
                if not payload or payload[0] >= end:
                    raise FrameError(F.PROTOCOL_ERROR, "HEADERS padding past its payload")
                pos, end = 1, end - payload[0]
            if flags & F.FLAG_PRIORITY:
                pos += 5
            block = payload[pos:end] if pos or end != len(payload) else payload
            if not flags & F.FLAG_END_HEADERS:
                self.header_block = [sid, flags, [block], len(block)]
                return
        headers = self.decoder.decode(block)  # every block: the table stays in sync
        st = self.streams.get(sid)
        if st is None:
            return
        for name, value in headers:
            if name == b"grpc-status":
                st.status = int(value) if value.isdigit() and len(value) <= 3 else 2  # UNKNOWN, as grpc reads it
            elif name == b"grpc-message":
                st.message = value
            elif name == b":status":
                st.http_status = value
        if flags & F.FLAG_END_STREAM:
            self._finish(st, st.status, st.message if st.status is not None else _no_status(st))

    def _control(self, ftype, flags, sid, payload):
        if ftype == F.SETTINGS:
            if flags & F.FLAG_ACK:
                return
            if sid:
                raise FrameError(F.PROTOCOL_ERROR, "SETTINGS on a stream")
            for key, value in F.parse_settings(payload):
                if key == F.SETTINGS_MAX_CONCURRENT_STREAMS:
                    self.max_streams = value
                elif key == F.SETTINGS_INITIAL_WINDOW_SIZE:
                    self.peer_initial_window = F.apply_initial_window(self.streams.values(),
                                                                      self.peer_initial_window, value)
                elif key == F.SETTINGS_MAX_FRAME_SIZE:
                    if not F.DEFAULT_MAX_FRAME_SIZE <= value <= F.MAX_MAX_FRAME_SIZE:
                        raise FrameError(F.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                    self.peer_max_frame = value
                elif key == F.SETTINGS_HEADER_TABLE_SIZE:
                    self.encoder.set_max_table_size(min(value, 4096))
            self.out.append(F.settings(ack=True))
            if not self.handshake.done():
                self.handshake.set_result(None)
            self._unblock()
        elif ftype == F.PING:
            if len(payload) != 8:
                raise FrameError(F.FRAME_SIZE_ERROR, "PING of a length other than 8")
            if not flags & F.FLAG_ACK:
                self.out.append(F.ping(payload, ack=True))
            elif payload == b"rmqhbbdp":
                self.pinging = False
        elif ftype == F.WINDOW_UPDATE:
            if len(payload) != 4:
                raise FrameError(F.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
            inc = F.u32(payload) & 0x7FFFFFFF
            if not sid:
                self.send_window += inc
            elif (st := self.streams.get(sid)) is not None:
                st.send_window += inc
            self._unblock()
        elif ftype == F.RST_STREAM:
            st = self.streams.get(sid)
            if st is not None and len(payload) == 4:
                code = F.u32(payload)
                if code == F.REFUSED_STREAM and st.attempt == 0 and self.goaway is None:
                    # not processed: sent again once a stream is free, as grpc clients retry it transparently; the
                    # server counts more streams open than we do, so we keep to what we have open now
                    del self.streams[sid]
                    self.blocked.pop(sid, None)
                    self.max_streams = max(len(self.streams),  # a Telemetry stream never frees its place
                                           1 + sum(1 for x in self.streams.values() if x.kind == TELEMETRY))
                    self.runner.stats["refused_retries"] += 1
                    self._wait((st.kind, st.session, st.body, st.end, st.t0, 1))
                    return self._dispatch()
                st.local_closed = True
                self._finish(st, None, b"RST_STREAM " + _name(H2_ERRORS, code).encode())
        elif ftype == F.GOAWAY:
            if len(payload) < 8:
                raise FrameError(F.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            last, code = F.u32(payload) & 0x7FFFFFFF, F.u32(payload, 4)
            first = self.goaway is None  # a graceful server sends two (grpc: the last stream id lowered)
            self.goaway = (last, code, bytes(payload[8:208]))
            if not self.handshake.done():
                self.handshake.set_result(ConnectError(f"answered GOAWAY {_name(H2_ERRORS, code)}"
                                                       + _debug(payload[8:])))
            if first:
                self.runner.goaway(self, code)
            for st in [st for st in self.streams.values() if st.sid > last]:
                self._finish(st, None, b"GOAWAY " + _name(H2_ERRORS, code).encode())
            if not self.streams:
                self.bye = True
                self.transport.close()
        elif ftype == F.PUSH_PROMISE:
            raise FrameError(F.PROTOCOL_ERROR, "PUSH_PROMISE after SETTINGS_ENABLE_PUSH 0")

    def _error(self, code: int, why: str) -> None:
        """A connection error of the server's: GOAWAY to it, the calls fail, the connection ends."""
        self.runner.protocol_error(self, why)
        if not self.handshake.done():
            self.handshake.set_result(ConnectError(f"broke HTTP/2: {why}"))
        self.out.append(F.goaway(0, code, why.encode("ascii", "replace")[:100]))
        self.flush()
        self.transport.close()

    # ------------------------------------------------------------------ calls out
    def call(self, kind: int, session: Session, body: bytes, now: float, end: bool = True,
             attempt: int = 0) -> Stream | None:
        """A call's HEADERS and its request message (END_STREAM unless ``end`` is False: the Telemetry stream).
        Past the server's concurrent streams it waits for a stream; after GOAWAY it is not sent (None)."""
        if self.goaway is not None or self.lost or self.transport.is_closing():
            self.runner.not_sent(kind, session)
            return None
        if self.transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.runner.not_sent(kind, session, "the server does not read")
            return None
        if len(self.streams) >= self.max_streams or self.next_sid > F.MAX_WINDOW:
            self._wait((kind, session, body, end, now, attempt))
            return None
        sid = self.next_sid
        self.next_sid = sid + 2
        headers = [(b":method", b"POST"), (b":scheme", self.scheme), (b":path", PATHS[kind]),
                   (b":authority", self.authority), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                   (b"user-agent", b"rmqhb-loadgen grpc-python-h2/1.0")]
        if end:
            headers.append((b"grpc-timeout", DEADLINE))
        headers += session.metadata
        runner = self.runner
        headers += ((b"x-mq-date-time", runner.date_time), (b"x-mq-request-id", runner.request_id()),
                    (b"x-mq-client-id", session.client_id.encode()))
        if runner.authorization is not None:
            headers.append((b"authorization", runner.authorization))
        block = self.encoder.encode(headers)
        out = self.out
        limit = self.peer_max_frame
        if len(block) <= limit:
            out.append(F.frame(F.HEADERS, F.FLAG_END_HEADERS, sid, block))
            if end and runner.core_frames:  # C-core: the new stream's WINDOW_UPDATE before its DATA
                out.append(F.window_update(sid, CORE_STREAM_UPDATE))
        else:
            out.append(F.frame(F.HEADERS, 0, sid, block[:limit]))
            for i in range(limit, len(block), limit):
                out.append(F.frame(F.CONTINUATION, F.FLAG_END_HEADERS if i + limit >= len(block) else 0, sid,
                                   block[i:i + limit]))
        st = Stream(sid, kind, session, now, self.peer_initial_window, body, end, attempt)
        if end and runner.core_frames and len(block) <= limit:
            st.recv_window += CORE_STREAM_UPDATE
        self.streams[sid] = st
        if end:
            self.unary += 1
            self.runner.busy.add(self)
        if kind == TELEMETRY:
            session.telemetry = st
        n = len(body)
        if n <= self.send_window and n <= st.send_window and n <= limit and not self.blocked:
            out.append(F.frame(F.DATA, F.FLAG_END_STREAM if end else 0, sid, body))
            self.send_window -= n
            st.send_window -= n
            st.local_closed = end
        else:
            st.pending, st.end_pending = body, end
            self.blocked[sid] = st
            self._unblock()
        return st

    def end_stream(self, st: Stream) -> None:
        """Half-close a stream (the end of a Telemetry stream): an empty DATA frame with END_STREAM."""
        if st.local_closed or st.sid not in self.streams:
            return
        if st.pending:
            st.end_pending = True
        else:
            st.local_closed = True
            self.out.append(F.frame(F.DATA, F.FLAG_END_STREAM, st.sid))

    def _unblock(self) -> None:
        """Send what waits for a window, in order, as far as the windows go."""
        for sid, st in list(self.blocked.items()):
            while st.pending:
                n = min(len(st.pending), self.send_window, st.send_window, self.peer_max_frame)
                if n <= 0:
                    return
                chunk, st.pending = st.pending[:n], st.pending[n:]
                last = not st.pending
                self.out.append(F.frame(F.DATA, F.FLAG_END_STREAM if last and st.end_pending else 0, sid, chunk))
                self.send_window -= n
                st.send_window -= n
                if last and st.end_pending:
                    st.local_closed = True
            del self.blocked[sid]

    def _finish(self, st: Stream, status, message) -> None:
        """A call's end: its trailers (``status``: grpc-status; None: reset or lost)."""
        if self.streams.pop(st.sid, None) is None:
            return
        self.blocked.pop(st.sid, None)
        if st.end:
            self.unary -= 1
            if not self.unary and not self.waiting:
                self.runner.busy.discard(self)
        if st.reader is not None and st.reader.buffered:  # a partial message it ended in: the connection's window
            self._give_back(st.reader.buffered)  # gets it back
            st.reader = None
        if not st.local_closed and not self.transport.is_closing():
            self.out.append(F.rst_stream(st.sid, F.NO_ERROR if status is not None else F.CANCEL))
        self.runner.finished(self, st, status, message)
        if st.end:
            self.ended_calls = True
        self._dispatch()
        if self.goaway is not None and not self.streams and not self.transport.is_closing():
            self.bye = True  # closed by us after the server's GOAWAY: counted there, not as lost
            self.flush()
            self.transport.close()

    def _wait(self, call: tuple) -> None:
        """A call waits for a stream (MAX_WAITING at most: past it, not sent)."""
        if len(self.waiting) >= MAX_WAITING:
            self.runner.not_sent(call[0], call[1], "no stream free")
        else:
            self.waiting.append(call)
            self.runner.busy.add(self)

    def expire(self, now: float) -> bool:
        """Unary calls past their deadline end DEADLINE_EXCEEDED, as the SDKs end them: those waiting for a stream
        unsent, those sent with RST_STREAM CANCEL. Whether any did."""
        limit = now - DEADLINE_S
        expired = [c for c in self.waiting if c[3] and c[4] <= limit]
        if expired:
            self.waiting = deque(c for c in self.waiting if not (c[3] and c[4] <= limit))
            for kind, session, body, end, t0, attempt in expired:
                self.runner.finished(self, Stream(0, kind, session, t0, 0, body, end, attempt), 4, b"")
        late = [st for st in self.streams.values() if st.end and st.t0 <= limit]
        for st in late:
            if st.sid in self.streams:  # (an earlier one's end may have ended it)
                st.local_closed = True  # reset here, not again by _finish
                self.out.append(F.rst_stream(st.sid, F.CANCEL))
                self._finish(st, 4, b"")
        return bool(expired or late)

    def _dispatch(self) -> None:
        """Calls waiting for a stream go, as far as the server's concurrent streams allow."""
        while self.waiting and len(self.streams) < self.max_streams and self.goaway is None:
            kind, session, body, end, t0, attempt = self.waiting.popleft()
            self.call(kind, session, body, t0, end, attempt)  # its latency counts its wait for a stream

    def flush(self) -> None:
        if self.out:
            data = b"".join(self.out)
            self.out = []
            if not self.transport.is_closing():
                self.transport.write(data)
                if self.transport.get_write_buffer_size() > 2 * MAX_WRITE_BUFFER:
                    # calls stop at MAX_WRITE_BUFFER: only our answers to its frames (PING and SETTINGS ACKs) take
                    # it past twice that, a server flooding them and reading nothing; dropped, not buffered on
                    self.runner.errors_by_status["connection: the server does not read (write buffer)"] += 1
                    self.transport.abort()

    def close(self) -> None:
        """The client goes: GOAWAY NO_ERROR (as grpc clients send on channel close), then the connection closes."""
        self.bye = True
        if not self.transport.is_closing():
            self.out.append(F.goaway(0, F.NO_ERROR))
            self.flush()
            self.transport.close()


def _no_status(st: Stream) -> bytes:
    """A call that ended without grpc-status (an HTTP/2 server that is no gRPC server): its HTTP status."""
    code = st.http_status if st.http_status and st.http_status.isdigit() and len(st.http_status) == 3 else b"?"
    return b"no grpc-status (HTTP " + code + b")"


def _name(names: tuple, code: int) -> str:
    """A code's name; the codes we do not know are one name, OTHER (a server choosing them cannot grow
    errors_by_status by one key per code)."""
    return names[code] if 0 <= code < len(names) else "OTHER"


def _debug(data: bytes) -> str:
    from engine.logutil import escape_text

    text = bytes(data[:120]).decode("utf-8", "replace").strip()
    return f" ({escape_text(text)})" if text else ""


# ---------------------------------------------------------------------------------------------------------------
# One process's fleet: what each answer means, and what to send next


def _new_stats() -> dict:
    return {"sessions": 0, "sent": 0, "answered": 0, "ok": 0, "errors": 0, "settings_ok": 0, "routes_sent": 0,
            "routes_ok": 0, "assignments_sent": 0, "assignments_ok": 0, "terminations_sent": 0,
            "terminations_ok": 0, "not_sent": 0, "goaways": 0, "connections_lost": 0, "connect_failed": 0,
            "connect_retries": 0, "server_commands": 0, "telemetry_sent": 0, "refused_retries": 0,
            "hb_ended_unanswered": 0}


class Runner:
    """The sessions of one process: counters, answer checks, the closed loop."""

    def __init__(self, host: str, port: int, tls, token: str, credentials: tuple | None = None,
                 core_frames: bool = False):
        self.d, self.s = load_protocol()
        #: send each call's frames as grpc C-core does (--core-frames)
        self.core_frames = core_frames
        self.credentials = credentials  # (access key, secret key): every call signed as the 5.x SDKs sign
        self.authorization = None
        d, s = self.d, self.s
        self.parsers = (s.HeartbeatResponse.FromString, s.TelemetryCommand.FromString,
                        s.QueryRouteResponse.FromString, s.QueryAssignmentResponse.FromString,
                        s.NotifyClientTerminationResponse.FromString)
        self.code_ok = d.Code.OK
        self.host, self.port, self.tls = host, port, tls
        self.authority = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode()
        self.scheme = b"https" if tls is not None else b"http"
        self.stats = _new_stats()
        self.errors_by_status: Counter = Counter()
        self.lat: list = []  # Heartbeat latencies (s)
        self.reg_lat: list = []  # Settings answered, from the session's start (s)
        self.ok_answers = [set() for _ in METHODS]  # answer bytes known to be OK (a repeat is not parsed)
        self.auto = False  # closed loop: an answered Heartbeat sends the next one
        #: closed loop with --inflight: the sessions in turn over all connections (None: --depth, each connection
        #: its own sessions in turn)
        self.live: list | None = None
        self.turn = 0
        self.dirty: list[GrpcConn] = []  # connections with frames to write
        self.unsettled = 0  # sessions started whose Settings are neither answered nor refused
        self.unanswered = 0  # sessions whose Settings registration gave up on (REGISTER_STALL_S)
        self.hb_outstanding = 0
        self.terminations_outstanding = 0
        self.conns: list[GrpcConn] = []
        self.watched: set[GrpcConn] = set()  # open connections: their calls' deadlines are kept
        #: connections with unary calls in flight or waiting for a stream: the only ones a deadline sweep looks
        #: at (a sweep over every connection, 9,800 of them, paused this loop ~10 ms each time: late ticks, then a
        #: burst of the heartbeats due meanwhile)
        self.busy: set[GrpcConn] = set()
        self._sweep = None  # the timer of the next deadline check
        self._rid_prefix = os.urandom(12).hex()
        self._rid = 0
        self.date_time = b""
        self.update_date()

    def update_date(self) -> None:
        self.date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()).encode()
        if self.credentials is not None:  # the SDKs' signature: HMAC-SHA1 of x-mq-date-time with the secret key
            import hashlib
            import hmac

            ak, sk = self.credentials
            sign = hmac.new(sk.encode(), self.date_time, hashlib.sha1).hexdigest()
            self.authorization = (f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
                                  f"Signature={sign}").encode()

    def request_id(self) -> bytes:
        """A fresh x-mq-request-id in the UUID shape the SDKs send (cheaper than uuid4 per call)."""
        self._rid += 1
        p = self._rid_prefix
        return f"{p[:8]}-{p[8:12]}-4{p[13:16]}-{p[16:20]}-{self._rid:012x}".encode()

    def watch(self, conn: GrpcConn) -> None:
        self.watched.add(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_later(DEADLINE_SWEEP_S, self._expire, conn.loop)

    def _expire(self, loop) -> None:
        """Every DEADLINE_SWEEP_S while a connection is open: the calls past their deadline end."""
        self._sweep = None
        now = time.perf_counter()
        for c in list(self.busy):
            if c.expire(now):
                c.flush()
            if not c.unary and not c.waiting:
                self.busy.discard(c)
        self.flush()  # what the closed loop sent in their place
        if self.watched:
            self._sweep = loop.call_later(DEADLINE_SWEEP_S, self._expire, loop)

    def flush(self) -> None:
        for c in self.dirty:
            c.flush()
        self.dirty.clear()

    def _send(self, conn: GrpcConn, kind: int, session: Session, body: bytes, now: float, end: bool = True):
        if not conn.out:
            self.dirty.append(conn)
        return conn.call(kind, session, body, now, end)

    # ------------------------------------------------------------------ calls
    def register(self, session: Session, now: float) -> None:
        """What an SDK does at start: its topic's route, then its Telemetry stream with its Settings."""
        session.started = now
        self.unsettled += 1
        self.stats["routes_sent"] += 1
        self.stats["telemetry_sent"] += 1
        self._send(session.conn, QUERY_ROUTE, session, session.route, now)
        self._send(session.conn, TELEMETRY, session, session.settings, now, end=False)

    def heartbeat(self, session: Session, now: float) -> None:
        bodies = session.heartbeats
        body = bodies[session.hb_turn % len(bodies)] if len(bodies) > 1 else bodies[0]
        session.hb_turn += 1
        self.stats["sent"] += 1
        self.hb_outstanding += 1
        self._send(session.conn, HEARTBEAT, session, body, now)

    def next_heartbeat(self, now: float) -> None:
        """Closed loop with --inflight: the next session in turn, whichever its connection."""
        live = self.live
        self.turn += 1
        self.heartbeat(live[self.turn % len(live)], now)

    def conn_heartbeat(self, conn: GrpcConn, now: float) -> None:
        """Closed loop: the connection's next registered session in turn."""
        live = conn.sessions
        if live:
            conn.hb_turn += 1
            self.heartbeat(live[conn.hb_turn % len(live)], now)

    def periodic(self, kind: int, session: Session, now: float) -> None:
        if kind == QUERY_ASSIGNMENT:
            self.stats["assignments_sent"] += 1
            self._send(session.conn, QUERY_ASSIGNMENT, session, session.assignment, now)
        else:
            self.stats["routes_sent"] += 1
            self._send(session.conn, QUERY_ROUTE, session, session.route, now)

    def terminate(self, session: Session, now: float) -> None:
        """NotifyClientTermination; its answer ends the session's Telemetry stream (as the SDKs close it)."""
        self.stats["terminations_sent"] += 1
        self.terminations_outstanding += 1
        self._send(session.conn, NOTIFY_TERMINATION, session, session.termination, now)

    # ------------------------------------------------------------------ answers
    def _error(self, kind: int, what: str) -> None:
        self.stats["errors"] += 1
        self.errors_by_status[f"{METHODS[kind]}: {what}"] += 1

    def _verdict(self, kind: int, status, message: bytes, messages: list):
        """None for an OK answer, else what was wrong (grpc-status, the answer's status code, a reset...)."""
        if status is None:
            return message.decode("ascii", "replace")  # our own words: a reset, GOAWAY, the connection lost
        if status:
            return f"grpc-status {_name(GRPC_STATUS, status)}"
        if len(messages) != 1:
            return "no answer message" if not messages else "several answer messages"
        msg = messages[0]
        known = self.ok_answers[kind]
        if msg in known:
            return None
        try:
            code = self.parsers[kind](msg).status.code
        except Exception:
            return "unparsable answer"
        if code == self.code_ok:
            if len(known) < 1024:
                known.add(msg)
            return None
        return "code " + _code_name(self.d, code)

    def finished(self, conn: GrpcConn, st: Stream, status, message: bytes) -> None:
        kind, session, stats = st.kind, st.session, self.stats
        if kind == HEARTBEAT:
            now = time.perf_counter()
            self.hb_outstanding -= 1
            why = self._verdict(kind, status, message, st.messages)
            # answered: the server's status was read (its trailers, or its answer we cancelled); a call reset, ended
            # by GOAWAY or the connection's loss, or past its deadline unanswered is an error without a latency, as
            # the remoting generator counts only the answers it read
            if st.status is not None or status is not None and st.http_status is not None:
                self.lat.append(now - st.t0)
                stats["answered"] += 1
            else:
                stats["hb_ended_unanswered"] += 1
            if why is None:
                stats["ok"] += 1
            else:
                self._error(kind, why)
            if self.auto:
                if self.live is not None:
                    self.next_heartbeat(now)
                elif conn.inflight:
                    self.conn_heartbeat(conn, now)
        elif kind == TELEMETRY:
            if session.telemetry is st:
                session.telemetry = None
            if not session.settled:
                session.settled = True
                self.unsettled -= 1
                self._error(kind, message.decode("ascii", "replace") if status is None
                            else f"grpc-status {_name(GRPC_STATUS, status)}" if status
                            else "stream ended before its Settings were answered")
            elif session.registered:
                session.registered = False
                stats["sessions"] -= 1
                if not st.local_closed and not conn.bye:  # ended by the server, not by the session's end
                    self._error(kind, "stream ended by the server" if status == 0 else
                                message.decode("ascii", "replace") if status is None
                                else f"grpc-status {_name(GRPC_STATUS, status)}")
        else:
            why = self._verdict(kind, status, message, st.messages)
            if kind == QUERY_ROUTE:
                stats["routes_ok"] += why is None
            elif kind == QUERY_ASSIGNMENT:
                stats["assignments_ok"] += why is None
            else:
                self.terminations_outstanding -= 1
                if why is None:
                    stats["terminations_ok"] += 1
                    session.terminated = True
                    if session.registered:
                        session.registered = False
                        stats["sessions"] -= 1
                if session.telemetry is not None:
                    conn.end_stream(session.telemetry)
            if why is not None:
                self._error(kind, why)

    def telemetry_message(self, session: Session, msg: bytes) -> None:
        """A command on a Telemetry stream: the answer to its Settings registers the session."""
        try:
            cmd = self.parsers[TELEMETRY](msg)
        except Exception:
            return self._error(TELEMETRY, "unparsable command")
        if cmd.WhichOneof("command") != "settings" and not cmd.HasField("status"):
            self.stats["server_commands"] += 1  # thread stack, message verification...: not answered here
            return
        code = cmd.status.code if cmd.HasField("status") else self.code_ok
        if code != self.code_ok:
            self._error(TELEMETRY, "code " + _code_name(self.d, code))
        elif not session.settled and not session.terminated:  # (a late answer, counted unanswered, is not)
            session.registered = True
            self.stats["sessions"] += 1
            self.stats["settings_ok"] += 1
            self.reg_lat.append(time.perf_counter() - session.started)
        if not session.settled:
            session.settled = True
            self.unsettled -= 1

    def not_sent(self, kind: int, session: Session, why: str = "the connection is going away") -> None:
        """A call the connection could not send (GOAWAY, closed, a server that does not read)."""
        self.stats["not_sent"] += 1
        if kind == HEARTBEAT:
            self.hb_outstanding -= 1
        elif kind == NOTIFY_TERMINATION:
            self.terminations_outstanding -= 1
        elif kind == TELEMETRY and not session.settled:
            session.settled = True
            self.unsettled -= 1
        self._error(kind, f"not sent: {why}")

    def goaway(self, conn: GrpcConn, code: int) -> None:
        self.stats["goaways"] += 1
        self.errors_by_status[f"connection: GOAWAY {_name(H2_ERRORS, code)}"] += 1
        for kind, session, *_ in conn.waiting:
            self.not_sent(kind, session)
        conn.waiting.clear()

    def protocol_error(self, conn: GrpcConn, why: str) -> None:
        self.errors_by_status["connection: HTTP/2 protocol error"] += 1

    def connection_lost(self, conn: GrpcConn) -> None:
        self.watched.discard(conn)
        self.busy.discard(conn)
        if not conn.bye and conn.goaway is None:  # a connection that went away is counted once, in goaways
            self.stats["connections_lost"] += 1
        for kind, session, *_ in conn.waiting:
            self.not_sent(kind, session)
        conn.waiting.clear()


def _code_name(d, code: int) -> str:
    try:
        return d.Code.Name(code)
    except ValueError:
        return "OTHER"  # one key for every code the protocol does not name (see _name)


# ---------------------------------------------------------------------------------------------------------------
# Connecting


def client_tls():
    """TLS as the 5.x Java client's default: ALPN h2, no certificate check (its insecure trust manager)."""
    ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = _ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    return ctx


def _why_cut(e: OSError) -> str:
    """Why a TLS handshake on a connected socket did not finish (asyncio aborts one past its timeout)."""
    if isinstance(e, ConnectionAbortedError):
        return f"not answered within {HANDSHAKE_TIMEOUT_S:g} s"
    return "closed by the server"


async def connect(runner: Runner, attempts: int = 20, backoff: float = 0.05) -> GrpcConn | ConnectError | None:
    """One connection whose server showed it speaks HTTP/2 (its SETTINGS); a ConnectError saying why not; None
    when no TCP connection could be made in ``attempts``."""
    loop = asyncio.get_running_loop()
    for attempt in range(attempts):
        try:
            _, conn = await loop.create_connection(
                lambda: GrpcConn(runner, runner.authority, runner.scheme), runner.host, runner.port,
                ssl=runner.tls, server_hostname=runner.host if runner.tls is not None else None,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if runner.tls is not None else None,
                local_addr=L._local_addr())
            break
        except _ssl.SSLError as e:
            return ConnectError(f"TLS handshake failed ({e.reason or e}): a plaintext port? (drop --tls)")
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as e:
            # TCP connected (a refused connect is ConnectionRefusedError), then the handshake was cut or timed out
            if runner.tls is not None and attempt == attempts - 1:
                return ConnectError(f"TLS handshake failed (the connection was {_why_cut(e)}): a plaintext port? "
                                    f"(drop --tls)")
            runner.stats["connect_retries"] += 1
            await asyncio.sleep(backoff * (attempt + 1))
        except (OSError, RuntimeError):  # uvloop: RuntimeError for a transport the server closed at once
            runner.stats["connect_retries"] += 1
            await asyncio.sleep(backoff * (attempt + 1))
    else:
        runner.stats["connect_failed"] += 1
        return None
    if runner.tls is not None:
        alpn = conn.transport.get_extra_info("ssl_object").selected_alpn_protocol()
        if alpn != "h2":
            conn.transport.abort()
            return ConnectError(f"TLS without ALPN h2 (the server chose {alpn!r}): no gRPC port")
    try:
        why = await asyncio.wait_for(asyncio.shield(conn.handshake), HANDSHAKE_TIMEOUT_S)
    except asyncio.TimeoutError:
        why = ConnectError(f"sent no HTTP/2 SETTINGS within {HANDSHAKE_TIMEOUT_S:g} s: no gRPC (HTTP/2) port")
    if why is not None:
        conn.bye = True
        conn.transport.abort()
        return why
    runner.conns.append(conn)
    return conn


async def connect_all(runner: Runner, sessions: list, per_connection: int, concurrency: int = 256) -> list:
    """ceil(N / per_connection) connections, each carrying its run of consecutive sessions (an SDK process's
    clients share its channel); the sessions of a connection that failed are left out."""
    chunks = [sessions[i:i + per_connection] for i in range(0, len(sessions), per_connection)]
    sem = asyncio.Semaphore(concurrency)
    conns = [None] * len(chunks)

    async def one(k):
        async with sem:
            c = await connect(runner)
        if isinstance(c, GrpcConn):
            conns[k] = c
            c.sessions = []
            for s in chunks[k]:
                s.conn = c
        elif isinstance(c, ConnectError):
            runner.stats["connect_failed"] += 1
            runner.errors_by_status[f"connection: {c}"] += 1

    await asyncio.gather(*(one(k) for k in range(len(chunks))))
    return [c for c in conns if c is not None]


async def register_all(runner: Runner, sessions: list, pending: int) -> float:
    """Every connected session starts (QueryRoute, Telemetry + Settings), at most ``pending`` waiting for their
    Settings answer at a time; returns the seconds until all were answered or refused, or until none was for
    REGISTER_STALL_S (REGISTER_LIMIT_S at most): those left are counted as errors."""
    t0 = last = time.perf_counter()
    settled = runner.stats["settings_ok"] + runner.stats["errors"]
    runner.unanswered = 0

    def stalled() -> bool:
        """No Settings answered (or refused) for REGISTER_STALL_S, or REGISTER_LIMIT_S passed: the sessions
        waiting count as unanswered, and those started next get a wait of their own (until the limit)."""
        nonlocal last, settled
        now = time.perf_counter()
        progress = runner.stats["settings_ok"] + runner.stats["errors"]
        if progress != settled:
            settled, last = progress, now
        if now - last < REGISTER_STALL_S and now - t0 < REGISTER_LIMIT_S:
            return False
        for s in sessions:
            if s.started and not s.settled:
                s.settled = True
                runner.unsettled -= 1
                runner.unanswered += 1
                runner._error(TELEMETRY, "Settings not answered")
        settled, last = runner.stats["settings_ok"] + runner.stats["errors"], now
        return True

    started = 0
    for s in sessions:
        if s.conn is None:
            continue
        while runner.unsettled >= pending and not stalled():
            runner.flush()
            await asyncio.sleep(0.001)
        runner.register(s, time.perf_counter())
        started += 1
        if started % 64 == 0:
            runner.flush()
            await asyncio.sleep(0)
    runner.flush()
    while runner.unsettled > 0 and not stalled():
        await asyncio.sleep(0.005)
    for c in runner.conns:
        c.sessions = []
    for s in sessions:  # the closed loop heartbeats a connection's registered sessions in turn
        if s.conn is not None and s.registered:
            s.conn.sessions.append(s)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------------------
# Scenarios (one process)


def _runner_and_fleet(a: dict):
    runner = Runner(a["host"], a["port"], client_tls() if a["tls"] else None, a["token"], a["credentials"],
                    a.get("core_frames", False))
    sessions = make_sessions(a["n"], a["offset"], a["token"], a["groups"], a["topics"], a["consumer_share"],
                             a["topic_prefix"], a["host"], a["port"], a["vary"])
    return runner, sessions


async def _close_all(runner: Runner, sessions: list, wait: float = 5.0) -> None:
    """The sessions' Telemetry streams end (END_STREAM), then each connection says GOAWAY and closes."""
    for s in sessions:
        if s.telemetry is not None:
            if not s.conn.out:
                runner.dirty.append(s.conn)
            s.conn.end_stream(s.telemetry)
    runner.flush()
    t0 = time.perf_counter()
    while any(s.telemetry is not None for s in sessions) and time.perf_counter() - t0 < wait:
        await asyncio.sleep(0.01)
    for c in runner.conns:
        c.close()


async def steady(a: dict, barrier=None, slot=None) -> dict:
    runner, sessions = _runner_and_fleet(a)
    stats, lat = runner.stats, runner.lat
    progress = L.Progress(stats, lat, slot, PROGRESS_FIELDS)
    conns = await connect_all(runner, sessions, a["per_connection"])
    registered_s = await register_all(runner, sessions, a["pending"])
    live = [s for s in sessions if s.registered]
    await L._together(barrier)  # every process registered: the windows overlap and see no registration traffic
    gc.freeze()  # the fleet lives until the end: the collector's passes skip it
    # a full pass paused this loop 5-23 ms, every ~4 s by the default rule (one per 10 middle passes, at 10,000
    # calls/s); one per 100, as the broker does, leaves it out of a window
    gc.set_threshold(700, 10, 100)
    rate = a["rate"]
    closed_loop = rate <= 0
    clock = time.perf_counter
    if closed_loop and live:
        runner.auto = True
        now = clock()
        if a["inflight"]:  # the sessions in turn, each on its connection, as independent clients' timers are
            runner.live = live
            for _ in range(a["inflight"]):
                runner.next_heartbeat(now)
        else:  # --depth per session: each connection keeps its sessions' share in flight
            for c in conns:
                c.inflight = a["depth"] * len(c.sessions)
                for _ in range(c.inflight):
                    runner.conn_heartbeat(c, now)
        runner.flush()
    # the SDKs' periodic calls, spread evenly: (kind, sessions in turn, calls/s)
    consumers = [s for s in live if s.consumer]
    periodic = [(kind, pool, len(pool) / every) for kind, pool, every in
                ((QUERY_ASSIGNMENT, consumers, a["assignment_interval"]), (QUERY_ROUTE, live, a["route_interval"]))
                if every > 0 and pool]
    p_sent, p_next = [0] * len(periodic), [0] * len(periodic)
    # warm-up: at least ``warmup`` s and, open loop, one pass over the sessions (their first heartbeats after the
    # Settings arm the server's repeat path), then until the answers have caught up (WARMUP_LIMIT_S at most)
    warm = a["warmup"] if closed_loop or not live else max(a["warmup"], min(len(live) / rate, L.WARMUP_LIMIT_S))
    tick = 0.001 if not closed_loop else 0.005
    late, work = [], []
    start = wake = clock()
    next_date = start + 1.0
    win = synced = None
    ended = False
    window_start = float("inf")
    hb_sent = i = 0
    answered0 = stats["answered"]
    gc_watch = None
    while True:
        now = clock()
        late.append(now - wake)
        elapsed = now - start
        if now >= next_date:
            runner.update_date()
            next_date += 1.0
            if not ended and all(c.transport.is_closing() for c in conns):
                ended = True  # the endpoint ended every connection (or none was made): done, once the window
                # barrier is passed (the other processes wait there for every one)
        if ended and win is None and synced is None:
            synced = asyncio.get_running_loop().run_in_executor(None, barrier.wait, 900) \
                if barrier is not None else True
        if win is None:
            if synced is None and elapsed >= warm and (closed_loop or elapsed >= L.WARMUP_LIMIT_S
                                                       or hb_sent - (stats["answered"] - answered0) <= rate * 0.02):
                synced = asyncio.get_running_loop().run_in_executor(None, barrier.wait, 900) \
                    if barrier is not None else True
            if synced is True or (synced is not None and synced.done()):
                lat.clear()
                late.clear()
                work.clear()
                win = L.Window(stats, a["server_pid"])
                progress.open_window()
                gc_watch = L.GcWatch()
                window_start = warm = elapsed
        if elapsed >= window_start + a["duration"] or ended and win is not None:
            break
        if not closed_loop and live and not ended:
            due = min(int(elapsed * rate) - hb_sent, MAX_TICK_CALLS)
            if due > 0:
                n_live = len(live)
                for _ in range(due):
                    runner.heartbeat(live[i], clock())
                    i += 1
                    if i == n_live:
                        i = 0
                hb_sent += due
        for k, (kind, pool, per_s) in enumerate(periodic if not ended else ()):
            due = min(int(elapsed * per_s) - p_sent[k], MAX_TICK_CALLS)
            if due > 0:
                for _ in range(due):
                    runner.periodic(kind, pool[p_next[k]], now)
                    p_next[k] = (p_next[k] + 1) % len(pool)
                p_sent[k] += due
        runner.flush()
        wake = clock()
        work.append(wake - now)
        wake += tick
        await asyncio.sleep(tick)
    if win is None:  # ended before the window opened: an empty one (the warm-up's latencies are not its)
        lat.clear()
        late.clear()
        work.clear()
        win, gc_watch = L.Window(stats, a["server_pid"]), L.GcWatch()
        progress.open_window()
        warm = clock() - start
    res = win.close()
    res["timeline_marks"] = list(progress.marks) + [(round(clock() - progress.window_t0, 3), len(lat))]
    res.update(gc_watch.close())
    if not closed_loop:
        res["tick_late"], res["tick_work"] = late, work
    runner.auto = False
    runner.live = None
    for c in conns:
        c.inflight = 0
    await L._together(barrier)  # nobody terminates while another process is still measuring
    window_lat = list(lat)
    # drain what is in flight (late answers still count for latency, open loop: a slow answer must not vanish)
    t1 = clock()
    while runner.hb_outstanding > 0 and clock() - t1 < 30:
        await asyncio.sleep(0.01)
    if not closed_loop:
        window_lat += lat[len(window_lat):]
    backlog = runner.hb_outstanding
    # shutdown as the SDKs: NotifyClientTermination, then the Telemetry stream ends, then the connection
    now = clock()
    for s in live:
        if s.registered:
            runner.terminate(s, now)
    runner.flush()
    t2 = clock()
    while runner.terminations_outstanding > 0 and clock() - t2 < 30:
        await asyncio.sleep(0.01)
    await _close_all(runner, sessions)
    progress.close()
    res.update(sessions=len(live), connections=len(conns), registered_s=round(registered_s, 3),
               warmup_s=round(warm, 3), unanswered_after_drain=backlog,
               terminated_sessions=stats["terminations_ok"], connect_failed=stats["connect_failed"],
               errors_by_status=dict(runner.errors_by_status), run_stats=dict(stats), latencies=window_lat)
    return res


async def storm(a: dict, barrier=None, slot=None) -> dict:
    """Every session connects and registers at once (at most ``pending`` per process waiting for their Settings
    answer); the time until every Settings is answered."""
    runner, sessions = _runner_and_fleet(a)
    progress = L.Progress(runner.stats, runner.reg_lat, slot, PROGRESS_FIELDS)
    progress.open_window()  # the storm is measured from its first connection
    win = L.Window(runner.stats, a["server_pid"])
    conns = await connect_all(runner, sessions, a["per_connection"])
    await register_all(runner, sessions, a["pending"])
    res = win.close()
    res["timeline_marks"] = progress.close() + [(round(time.perf_counter() - progress.window_t0, 3),
                                                 len(runner.reg_lat))]
    await L._together(barrier)  # no process leaves before all are registered
    unanswered = runner.unanswered
    await _close_all(runner, sessions)
    res.update(clients=len(sessions), connections=len(conns), registered=runner.stats["settings_ok"],
               unanswered=unanswered, connect_failed=runner.stats["connect_failed"],
               errors_by_status=dict(runner.errors_by_status), run_stats=dict(runner.stats),
               latencies=runner.reg_lat)
    return res


def _worker(args: dict, out, barrier=None, progress=None):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers, reports, exits 130
    L.raise_nofile()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    slot = None if progress is None else L._Slot(progress, args["index"], len(PROGRESS_FIELDS))
    try:
        scenario = steady if args["scenario"] == "steady" else storm
        res = asyncio.run(scenario(args, barrier, slot))
    except BaseException as e:  # the parent reports it instead of waiting for a result that never comes
        out.put({"worker_error": f"{type(e).__name__}: {e}"[:500]})
        raise
    out.put(res)


# ---------------------------------------------------------------------------------------------------------------
# Several processes, one result


def _progress_line(scenario: str, elapsed: float, totals: list, last: list, dt: float) -> str:
    sessions, sent, answered, errors = totals
    rate = (answered - last[2]) / dt if dt > 0 else 0.0
    return (f"loadgen grpc {scenario} {elapsed:5.0f} s: sessions {sessions:,}  heartbeats sent {sent:,}  "
            f"answered {answered:,} ({rate:,.0f}/s)  errors {errors:,}")


def run(scenario: str, host: str, port: int, sessions: int, procs: int = 1, duration: float = 5.0,
        rate: float = 0.0, per_connection: int = 8, depth: int = 1, inflight: int = 0, groups: int = 100,
        topics: int = 7, topic_prefix: str = "TopicLoad", consumer_share: float = 0.5, pending: int = 1024,
        assignment_interval: float = ASSIGNMENT_INTERVAL_S, route_interval: float = ROUTE_INTERVAL_S,
        vary: bool = False, tls: bool = False, server_pid: int | None = None, warmup: float = 2.0,
        credentials: tuple | None = None, progress=None, core_frames: bool = False) -> dict:
    """Run a scenario over ``procs`` processes and merge their results (engine.loadgen.run's keys where they
    apply; see the module's doc)."""
    token = f"{int(time.time() * 1000) % 36 ** 6:x}{os.getpid() % 4096:x}"  # client ids unique to this run
    # every process carries at least one connection (a process with none would have nothing to measure)
    procs = max(1, min(procs, -(-sessions // per_connection)))
    per = [sessions // procs + (1 if i < sessions % procs else 0) for i in range(procs)]
    args, off = [], 0
    for i, n in enumerate(per):
        args.append(dict(scenario=scenario, host=host, port=port, n=n, offset=off, duration=duration,
                         rate=rate / procs, per_connection=per_connection, depth=depth,
                         inflight=max(1, inflight // procs) if inflight else 0, groups=groups, topics=topics,
                         topic_prefix=topic_prefix, consumer_share=consumer_share, pending=max(1, pending // procs),
                         assignment_interval=assignment_interval, route_interval=route_interval, vary=vary, tls=tls,
                         server_pid=server_pid, warmup=warmup, token=token, credentials=credentials, index=i,
                         core_frames=core_frames))
        off += n
    results = L.run_workers(_worker, args, PROGRESS_FIELDS,
                            lambda elapsed, totals, last, dt: _progress_line(scenario, elapsed, totals, last, dt),
                            {"scenario": scenario, "protocol": "grpc", "target": f"{host}:{port}"},
                            900 + duration, progress)
    timeline = L._timeline(results)
    lat = [x for r in results for x in r.pop("latencies")]
    ticks = {k: [x for r in results for x in r.pop(k, ())] for k in ("tick_late", "tick_work")}
    seconds = max(r["seconds"] for r in results)
    total = lambda k: sum(r.get(k) or 0 for r in results)  # noqa: E731
    errors_by_status: Counter = Counter()
    for r in results:
        errors_by_status.update(r.pop("errors_by_status"))
    merged = {"scenario": scenario, "protocol": "grpc", "procs": procs}
    if scenario == "steady":
        merged.update(sessions=total("sessions"), connections=total("connections"),
                      sessions_per_connection=per_connection, depth=None if rate or inflight else depth,
                      inflight=(inflight or None) if not rate else None,
                      registered_s=max(r["registered_s"] for r in results),
                      warmup_s=max(r["warmup_s"] for r in results), offered_rate=rate or "closed-loop",
                      sent=total("sent"), answered=total("answered"), seconds=round(seconds, 3),
                      heartbeats_per_s=round(total("answered") / seconds) if seconds else 0,
                      errors=total("errors"), unanswered_after_drain=total("unanswered_after_drain"),
                      ended_unanswered=total("hb_ended_unanswered"),
                      calls_in_window={"Heartbeat": {"sent": total("sent"), "ok": total("ok")},
                                       "QueryAssignment": {"sent": total("assignments_sent"),
                                                           "ok": total("assignments_ok")},
                                       "QueryRoute": {"sent": total("routes_sent"), "ok": total("routes_ok")}},
                      terminated_sessions=total("terminated_sessions"), connect_failed=total("connect_failed"))
    else:
        merged.update(clients=total("clients"), connections=total("connections"),
                      sessions_per_connection=per_connection, pending=pending, registered=total("registered"),
                      seconds=round(seconds, 3),
                      registered_per_s=round(total("registered") / seconds) if seconds else 0,
                      errors=total("errors"), unanswered=total("unanswered"), connect_failed=total("connect_failed"))
    run_total = lambda k: sum(r["run_stats"][k] for r in results)  # noqa: E731
    merged.update(goaways=run_total("goaways"), connections_lost=run_total("connections_lost"),
                  refused_retries=run_total("refused_retries"),
                  errors_by_status=dict(errors_by_status.most_common()),
                  calls={method: {"sent": run_total(sent), "ok": run_total(ok)} for method, sent, ok in (
                      ("Heartbeat", "sent", "ok"), ("Telemetry", "telemetry_sent", "settings_ok"),
                      ("QueryRoute", "routes_sent", "routes_ok"), ("QueryAssignment", "assignments_sent",
                                                                   "assignments_ok"),
                      ("NotifyClientTermination", "terminations_sent", "terminations_ok"))})
    for r in results:
        r.pop("run_stats")
    L.merge_measures(merged, results, lat, ticks, scenario, f"{host}:{port}")
    merged["tls"] = tls
    merged["core_frames"] = core_frames
    if scenario == "steady":
        merged["vary"] = {"field_orders": vary}
    merged["timeline"] = timeline
    merged.update(L.per_heartbeat(merged, total("answered") if scenario == "steady" else total("registered"),
                                  seconds))
    return merged


# ---------------------------------------------------------------------------------------------------------------
# Before the run: is there a 5.x endpoint, and does it route the fleet's topics?


class _ProbeRunner(Runner):
    def __init__(self, *args):
        super().__init__(*args)
        self.answers: list = []

    def finished(self, conn, st, status, message):
        why = self._verdict(st.kind, status, message, st.messages)
        detail = message if status else b""
        self.answers.append((st.session.topic, why, detail))


async def _probe(host: str, port: int, tls: bool, topic_prefix: str, topics: int, timeout: float,
                 credentials, limits: dict) -> str | None:
    from engine.logutil import escape_text

    runner = _ProbeRunner(host, port, client_tls() if tls else None, "probe", credentials)
    where = f"{host}:{port}"
    c = await connect(runner, attempts=1)
    if c is None:
        return f"cannot connect to {where}"
    if isinstance(c, ConnectError):
        return f"{where} {c}"
    limits["max_streams"] = c.max_streams  # its SETTINGS_MAX_CONCURRENT_STREAMS (ours, 100, if it said none)
    # one producer per topic of the fleet: its route, as every SDK asks at start
    sessions = make_sessions(topics, 0, "probe", topics, topics, 0.0, topic_prefix, host, port, False)
    for s in sessions:
        s.conn = c
        runner.periodic(QUERY_ROUTE, s, time.perf_counter())
    runner.flush()
    t0 = time.perf_counter()
    while len(runner.answers) < topics and time.perf_counter() - t0 < timeout and not c.closed.done():
        await asyncio.sleep(0.005)
    c.close()
    if c.goaway is not None and (c.goaway[1] or len(runner.answers) < topics
                                 or any((why or "").startswith("GOAWAY") for _, why, _ in runner.answers)):
        return (f"{where} answered GOAWAY {_name(H2_ERRORS, c.goaway[1])}{_debug(c.goaway[2])}: it takes no new "
                f"calls (stopping, or past a budget of its own)")
    if len(runner.answers) < topics:
        return f"{where} did not answer QueryRoute within {timeout:g} s"
    missing = []
    for topic, why, detail in runner.answers:
        if why is None:
            continue
        if why == "grpc-status UNIMPLEMENTED":
            return f"{where} does not serve apache.rocketmq.v2.MessagingService (grpc-status UNIMPLEMENTED): " \
                   f"no RocketMQ 5.x endpoint"
        if why == "code TOPIC_NOT_FOUND":
            missing.append(topic)
            continue
        if why == "grpc-status DEADLINE_EXCEEDED":  # ended at the SDKs' deadline, ours or the server's
            return f"{where} did not answer QueryRoute within the SDKs' {DEADLINE_S:g} s deadline"
        text = bytes(detail[:200]).decode("utf-8", "replace")
        hint = " (an ACL: sign the calls with --access-key)" if why == "code UNAUTHORIZED" and not credentials \
            else f" ({escape_text(text)})" if text else ""
        return f"{where} answered QueryRoute of {escape_text(topic)}: {why}{hint}"
    if missing:
        return (f"{where} has no topic {', '.join(missing)}: a 5.x endpoint routes existing topics only; create "
                f"them (rmqhb updateTopic -b BROKER:REMOTING_PORT -t TOPIC, or mqadmin updateTopic) or name "
                f"existing ones (--topic-prefix, --topics)")
    return None


def probe(host: str, port: int, tls: bool, topic_prefix: str, topics: int, timeout: float = 10.0,
          credentials: tuple | None = None, limits: dict | None = None) -> str | None:
    """Why the run cannot go (one line), or None: checked before the workers start, so a wrong address, a port
    that is no gRPC port or topics the endpoint does not route fail at once instead of counting errors for the
    whole duration."""
    unreachable = L.probe(host, port)
    if unreachable:
        return unreachable
    return asyncio.run(_probe(host, port, tls, topic_prefix, topics, timeout, credentials,
                              {} if limits is None else limits))


# ---------------------------------------------------------------------------------------------------------------
# Command line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rmqhb loadgen --protocol grpc", description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=["steady", "storm"])
    p.add_argument("--protocol", choices=["grpc"], default="grpc")
    p.add_argument("--broker", required=True, metavar="HOST:PORT",
                   help="the 5.x endpoint's gRPC address (a broker's grpcServerPort, a proxy's gRPC port)")
    p.add_argument("--clients", "--sessions", dest="clients", type=int, default=1000,
                   help="simulated 5.x clients (sessions)")
    p.add_argument("--sessions-per-connection", type=int, default=8,
                   help="sessions sharing one HTTP/2 connection, as the clients of one SDK process (default 8)")
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=0.0,
                   help="offered Heartbeats/s over all sessions (a 5.x fleet: sessions / 10); 0 = closed loop")
    p.add_argument("--depth", type=int, default=1, help="closed loop: Heartbeats in flight per session")
    p.add_argument("--inflight", type=int, default=0,
                   help="closed loop: Heartbeats in flight over all sessions, the sessions in turn (instead of --depth)")
    p.add_argument("--pending", type=int, default=1024,
                   help="sessions waiting for their Settings answer at a time while registering (all processes)")
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--topics", type=int, default=7, help="topics the fleet uses: TOPIC_PREFIX0 .. (default 7)")
    p.add_argument("--topic-prefix", default="TopicLoad",
                   help="the topics' names (they must exist: a 5.x endpoint creates no topic on a route query)")
    p.add_argument("--consumer-share", type=float, default=0.5, help="the share of push consumers (the rest "
                   "producers)")
    p.add_argument("--assignment-interval", type=float, default=ASSIGNMENT_INTERVAL_S,
                   help="s between a push consumer's QueryAssignment (the SDKs' 5; 0: none)")
    p.add_argument("--route-interval", type=float, default=ROUTE_INTERVAL_S,
                   help="s between a session's QueryRoute after its first (the SDKs' 30; 0: none)")
    p.add_argument("--vary", action="store_true",
                   help="steady: send each Heartbeat in two encodings in turn (other bytes, the same request)")
    p.add_argument("--tls", action="store_true",
                   help="TLS with ALPN h2, no certificate check (the 5.x Java client's default)")
    p.add_argument("--core-frames", action="store_true",
                   help="send each call as grpc C-core (the Python 5.x SDK) does: a WINDOW_UPDATE of the new stream "
                        "between its HEADERS and DATA, and a flow-control (BDP) PING after a read that ended a call, "
                        "one in flight per connection")
    p.add_argument("--access-key", help="ACL: sign every call with this account, as the 5.x SDKs do; its secret key "
                                        "comes from $RMQHB_SECRET_KEY or --secret-key-file, never the command line")
    p.add_argument("--secret-key-file", metavar="PATH", help="file holding the ACL secret key (its first line)")
    p.add_argument("--secret-key", dest="secret_key_argv", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, help="the broker's pid (same machine): report its CPU use in the window")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--plot", help="write latency and answered rate over time to this SVG file")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    a = p.parse_args(argv)
    host, _, port = a.broker.rpartition(":")
    if not host or not port.isdigit() or not int(port) < 65536 or a.clients < 1 or a.procs < 1:
        p.error("--broker HOST:PORT (a port below 65536), --clients >= 1, --procs >= 1")
    interval = lambda x: x == 0 or 0.01 <= x < 1e9  # noqa: E731 (false for nan and inf)
    if not 0 < a.duration < 1e9 or not 0 <= a.rate <= MAX_RATE or a.groups < 1 or a.depth < 1 or a.inflight < 0 \
            or a.pending < 1 or a.sessions_per_connection < 1 or a.topics < 1 or not 0 <= a.consumer_share <= 1 \
            or not interval(a.assignment_interval) or not interval(a.route_interval) or not a.topic_prefix:
        p.error(f"--duration > 0, --rate from 0 to {MAX_RATE:,}, --groups, --topics, --depth, --pending, "
                "--sessions-per-connection >= 1, --inflight >= 0, --consumer-share from 0 to 1, intervals 0 or "
                ">= 0.01 s, a --topic-prefix (finite numbers)")
    host = host.strip("[]")
    from engine.broker.admin import AdminError, _secret_key

    try:
        secret = _secret_key(a)
    except AdminError as e:
        p.error(str(e))
    credentials = (a.access_key, secret) if a.access_key else None
    if L.check_outputs(a):
        return 2
    limits = {}
    try:
        load_protocol()
        why = probe(host, int(port), a.tls, a.topic_prefix, min(a.topics, a.groups), credentials=credentials,
                    limits=limits)
    except LoadgenError as e:
        why = str(e)
    if why:
        print(f"rmqhb loadgen: {why}", file=sys.stderr)
        return 1
    streams = limits.get("max_streams")
    if streams is not None and a.sessions_per_connection + 1 > streams:
        # each session's Telemetry stream holds a stream for good: with no stream left, every unary call (its
        # Heartbeats) would wait for one until its deadline
        print(f"rmqhb loadgen: --sessions-per-connection {a.sessions_per_connection}: {host}:{port} allows "
              f"{streams} concurrent streams per connection and each session holds one (its Telemetry stream), "
              f"leaving none for the unary calls: at most {max(streams - 1, 0)}", file=sys.stderr)
        return 2
    status, res = L.run_and_print(a, lambda: run(
        a.scenario, host, int(port), a.clients, a.procs, a.duration, a.rate, a.sessions_per_connection, a.depth,
        a.inflight, a.groups, a.topics, a.topic_prefix, a.consumer_share, a.pending, a.assignment_interval,
        a.route_interval, a.vary, a.tls, a.server_pid, credentials=credentials,
        progress=None if a.quiet else sys.stderr, core_frames=a.core_frames))
    if status:
        return status
    ended = res["goaways"] + res["connections_lost"]
    if not res["connections"] or ended >= res["connections"]:
        # the endpoint went away during the run (stopped, or refused every connection): the result above counts
        # what it answered before; one line says so, and the status is not "done"
        errors = res["errors_by_status"]
        first = next((k for k in errors if k.startswith("connection:")), next(iter(errors), "no connection"))
        print(f"rmqhb loadgen: {host}:{port} ended {ended:,} of {res['connections']:,} connections during the run "
              f"({first}; the result above has what was answered)", file=sys.stderr)
        return 1
    registered = res["sessions"] if a.scenario == "steady" else res["registered"]
    if not registered:
        errors = res["errors_by_status"]
        first = next(iter(errors), "no error counted")
        print(f"rmqhb loadgen: no session registered at {host}:{port} ({first}; the result above has the "
              f"counts)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The native gRPC transport's HTTP/2 layer (engine.http2.server, grpcTransport=native) with raw sockets: a bad
preface, frames past SETTINGS_MAX_FRAME_SIZE, stream-state errors, CONTINUATION floods, rapid reset, ping floods,
header lists past the budget, windows a client never opens, too many streams or connections, deadlines, keepalive
and GOAWAY on stop; each attack scaled down (lowered budgets) and the broker still serving after it."""
import socket
import time

import pytest

from conftest import require_module
from engine.broker.controller import Broker
from engine.http2 import HpackDecoder, HpackEncoder
from engine.http2 import frames as F
from engine.http2 import server as H

grpc = require_module("grpc")
require_module("rocketmq.grpc_protocol")
from rocketmq.grpc_protocol import service_pb2 as s  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as sg  # noqa: E402

from test_grpc_endpoint import free_port, md  # noqa: E402
from test_server import make_config  # noqa: E402

PATH = "/apache.rocketmq.v2.MessagingService/"


@pytest.fixture
def nbroker(tmp_path):
    started = []

    def make(**kw):
        b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_transport="native", **kw)).start()
        started.append(b)
        return b
    yield make
    for b in started:
        b.stop()


class Raw:
    """A raw HTTP/2 client connection."""

    def __init__(self, port, preface=True, settings=()):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.reader = F.FrameReader(F.MAX_MAX_FRAME_SIZE)
        self.enc = HpackEncoder()
        self.dec = HpackDecoder(4096, 1 << 20)
        self.got = []
        self.eof = False
        if preface:
            self.send(F.PREFACE + F.settings(settings))

    def send(self, *data):
        try:
            self.sock.sendall(b"".join(data))
        except OSError:
            self.eof = True

    def headers(self, sid, method="QueryRoute", extra=(), end_stream=False, timeout=None):
        hs = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", (PATH + method).encode()),
              (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        if timeout:
            hs.append((b"grpc-timeout", timeout.encode()))
        hs += [(k.encode(), v.encode()) for k, v in md()] + list(extra)
        flags = F.FLAG_END_HEADERS | (F.FLAG_END_STREAM if end_stream else 0)
        return F.frame(F.HEADERS, flags, sid, self.enc.encode(hs))

    @staticmethod
    def message(data: bytes, flag=0):
        return bytes((flag,)) + len(data).to_bytes(4, "big") + data

    def read(self, timeout=3.0, until=None):
        """Frames until ``until(frame)`` holds, the connection closes, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.eof:
            if until is not None and any(until(f) for f in self.got):
                break
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            self.got.extend(self.reader.feed(data))
        return self.got

    def goaway(self, timeout=3.0):
        self.read(timeout, until=lambda f: f[0] == F.GOAWAY)
        codes = [F.u32(f[3], 4) for f in self.got if f[0] == F.GOAWAY]
        return codes[0] if codes else None

    def trailers(self, sid, timeout=3.0):
        """The decoded header blocks the server sent on ``sid`` once its END_STREAM arrived."""
        self.read(timeout, until=lambda f: f[0] == F.HEADERS and f[2] == sid and f[1] & F.FLAG_END_STREAM)
        out = {}
        for ftype, flags, fsid, payload in self.got:
            if ftype == F.HEADERS and fsid == sid:
                out.update(dict(self.dec.decode(payload)))
        return out

    def close(self):
        self.sock.close()


def query_route_works(b):
    """A grpcio client still gets answers: the attack cost the broker nothing else."""
    channel = grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}")
    try:
        req = s.QueryRouteRequest()
        req.topic.name = "Nope"
        return sg.MessagingServiceStub(channel).QueryRoute(req, metadata=md(), timeout=5).status.code != 0
    finally:
        channel.close()


def route_request():
    req = s.QueryRouteRequest()
    req.topic.name = "Nope"
    return req.SerializeToString()


def test_a_unary_call_over_raw_frames(nbroker):
    b = nbroker()
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), c.headers(1), F.frame(F.DATA, F.FLAG_END_STREAM, 1, c.message(route_request())))
    t = c.trailers(1)
    assert t[b":status"] == b"200" and t[b"grpc-status"] == b"0"
    data = b"".join(f[3] for f in c.got if f[0] == F.DATA and f[2] == 1)
    answer = s.QueryRouteResponse.FromString(data[5:])
    assert answer.status.message.startswith("topic not found")
    # the server's SETTINGS came first and acknowledged ours
    assert c.got[0][0] == F.SETTINGS and any(f[0] == F.SETTINGS and f[1] & F.FLAG_ACK for f in c.got)
    c.close()


def test_a_bad_preface_is_a_protocol_error(nbroker):
    b = nbroker()
    c = Raw(b.ports["grpc"], preface=False)
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert c.goaway() == F.PROTOCOL_ERROR
    c.read(1.0)
    assert c.eof
    assert query_route_works(b)


def test_a_frame_past_max_frame_size_ends_the_connection_before_its_payload(nbroker):
    b = nbroker()
    c = Raw(b.ports["grpc"])
    # a header announcing 1 MiB: the answer comes without the payload being sent
    c.send(F.settings(ack=True), bytes((0x10, 0, 0, F.DATA, 0, 0, 0, 0, 1)))
    assert c.goaway() == F.FRAME_SIZE_ERROR
    assert query_route_works(b)


@pytest.mark.parametrize("frame, code", [
    (F.frame(F.DATA, 0, 7, b"x"), F.PROTOCOL_ERROR),  # DATA on an idle stream
    (F.frame(F.HEADERS, F.FLAG_END_HEADERS, 2, b"\x88"), F.PROTOCOL_ERROR),  # a client stream id must be odd
    (F.frame(F.PING, 0, 1, b"12345678"), F.PROTOCOL_ERROR),  # PING on a stream
    (F.frame(F.PING, 0, 0, b"1234"), F.FRAME_SIZE_ERROR),
    (F.frame(F.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), F.PROTOCOL_ERROR),  # a zero increment
    (F.frame(F.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), F.FLOW_CONTROL_ERROR),  # a window past 2^31-1
    (F.frame(F.PUSH_PROMISE, F.FLAG_END_HEADERS, 1, b"\0\0\0\2"), F.PROTOCOL_ERROR),
    (F.frame(F.CONTINUATION, F.FLAG_END_HEADERS, 1, b""), F.PROTOCOL_ERROR),  # without its HEADERS
    (F.frame(F.RST_STREAM, 0, 9, b"\0\0\0\0"), F.PROTOCOL_ERROR),  # on an idle stream
    (F.frame(F.SETTINGS, 0, 0, b"\0\5\0\0\0\1"), F.PROTOCOL_ERROR),  # MAX_FRAME_SIZE below 16384
    (F.frame(F.HEADERS, F.FLAG_END_HEADERS, 1, b"\xff\xff\xff\xff\xff\xff\xff"), F.COMPRESSION_ERROR),
])
def test_protocol_errors_end_the_connection_with_goaway(nbroker, frame, code):
    b = nbroker()
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), frame)
    assert c.goaway() == code
    assert query_route_works(b)


def test_the_first_frame_must_be_settings(nbroker):
    b = nbroker()
    c = Raw(b.ports["grpc"], preface=False)
    c.send(F.PREFACE + F.ping(b"12345678"))
    assert c.goaway() == F.PROTOCOL_ERROR


def test_a_continuation_flood_is_cut(nbroker):
    b = nbroker()
    c = Raw(b.ports["grpc"])
    block = c.headers(1)[9:]
    c.send(F.settings(ack=True), F.frame(F.HEADERS, 0, 1, block[:1]))
    c.send(*(F.frame(F.CONTINUATION, 0, 1, b"") for _ in range(H.MAX_CONTINUATIONS + 5)))
    assert c.goaway() == F.ENHANCE_YOUR_CALM
    # the same by bytes: 16 KiB continuations past the hard header block budget
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), F.frame(F.HEADERS, 0, 1, block[:1]))
    c.send(*(F.frame(F.CONTINUATION, 0, 1, b"a" * 16000) for _ in range(10)))
    assert c.goaway() == F.ENHANCE_YOUR_CALM
    assert query_route_works(b)


def test_metadata_past_the_budget_is_refused_and_the_connection_lives(nbroker):
    b = nbroker(grpc_max_metadata_bytes=4096)
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), c.headers(1, extra=[(b"x-pad", b"p" * 4500)], end_stream=True))
    t = c.trailers(1)
    assert t[b"grpc-status"] == b"8" and b"metadata" in t[b"grpc-message"]
    c.send(c.headers(3), F.frame(F.DATA, F.FLAG_END_STREAM, 3, c.message(route_request())))
    assert c.trailers(3)[b"grpc-status"] == b"0"
    # past the hard budget (4 x, at least 64 KiB): the connection ends
    big = [(b"x-pad%d" % i, b"p" * 8000) for i in range(10)]
    block = c.headers(5, extra=big, end_stream=True)[9:]
    chunks = [block[i:i + 16000] for i in range(0, len(block), 16000)]
    c.send(F.frame(F.HEADERS, F.FLAG_END_STREAM, 5, chunks[0]),
           *(F.frame(F.CONTINUATION, F.FLAG_END_HEADERS if i == len(chunks) - 1 else 0, 5, x)
             for i, x in enumerate(chunks) if i))
    assert c.goaway() in (F.COMPRESSION_ERROR, F.ENHANCE_YOUR_CALM)
    assert query_route_works(b)


def test_rapid_reset_is_answered_enhance_your_calm(nbroker, monkeypatch):
    monkeypatch.setattr(H, "MAX_RESETS_PER_WINDOW", 20)
    b = nbroker()
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True))
    burst = []
    for i in range(30):
        sid = 1 + 2 * i
        burst += [c.headers(sid, method="Telemetry"), F.rst_stream(sid, F.CANCEL)]
    c.send(*burst)  # one write: the 30 resets arrive within one window however busy the machine is
    assert c.goaway() == F.ENHANCE_YOUR_CALM
    assert b.grpc._server.calls == 0 or time.sleep(0.2) or b.grpc._server.calls == 0
    assert query_route_works(b)


def test_a_ping_flood_is_answered_enhance_your_calm(nbroker, monkeypatch):
    monkeypatch.setattr(H, "MAX_CONTROL_FRAMES_PER_WINDOW", 50)
    b = nbroker()
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), *(F.ping(b"%08d" % i) for i in range(100)))
    assert c.goaway() == F.ENHANCE_YOUR_CALM
    assert sum(1 for f in c.got if f[0] == F.PING) <= 51
    c = Raw(b.ports["grpc"])  # pings after request frames are flow-control probes (grpc's BDP pings): not counted
    c.send(F.settings(ack=True))
    for i in range(100):
        c.send(c.headers(1 + 2 * i, method="NoSuchMethod", end_stream=True), F.ping(b"%08d" % i))
    c.read(1.0, until=lambda f: f[0] == F.PING and f[3] == b"%08d" % 99)
    assert not any(f[0] == F.GOAWAY for f in c.got)
    assert sum(1 for f in c.got if f[0] == F.PING) == 100
    c = Raw(b.ports["grpc"])  # and a SETTINGS flood
    c.send(F.settings(ack=True), *(F.settings() for _ in range(100)))
    assert c.goaway() == F.ENHANCE_YOUR_CALM
    assert query_route_works(b)


def test_a_window_never_opened_ends_the_connection(nbroker, monkeypatch):
    monkeypatch.setattr(H, "FLOW_STALL_MS", 300)
    b = nbroker()
    c = Raw(b.ports["grpc"], settings=[(F.SETTINGS_INITIAL_WINDOW_SIZE, 0)])
    c.send(F.settings(ack=True), c.headers(1), F.frame(F.DATA, F.FLAG_END_STREAM, 1, c.message(route_request())))
    start = time.monotonic()
    assert c.goaway(5.0) == F.FLOW_CONTROL_ERROR
    assert time.monotonic() - start < 3.0
    assert not any(f[0] == F.DATA for f in c.got)  # nothing past the window
    assert b.grpc._server.calls == 0
    assert query_route_works(b)


def test_messages_past_the_budget_and_compressed_ones_are_answered_as_grpc_does(nbroker):
    b = nbroker(grpc_max_message_bytes=65536)
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), c.headers(1), F.frame(F.DATA, 0, 1, b"\0" + (70_000).to_bytes(4, "big")))
    t = c.trailers(1)
    assert t[b"grpc-status"] == b"8" and b"larger than max" in t[b"grpc-message"]
    c.send(c.headers(3), F.frame(F.DATA, F.FLAG_END_STREAM, 3, c.message(route_request(), flag=1)))
    assert c.trailers(3)[b"grpc-status"] == b"13"
    c.send(c.headers(5, method="NoSuchMethod", end_stream=True))
    assert c.trailers(5)[b"grpc-status"] == b"12"
    c.send(c.headers(7), F.frame(F.DATA, F.FLAG_END_STREAM, 7, c.message(b"\xff\xff")))  # not a protobuf
    assert c.trailers(7)[b"grpc-status"] == b"13"


def test_streams_past_max_concurrent_streams_are_refused(nbroker):
    b = nbroker(grpc_max_streams_per_connection=2)
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), c.headers(1, method="Telemetry"), c.headers(3, method="Telemetry"),
           c.headers(5, method="Telemetry"))
    c.read(2.0, until=lambda f: f[0] == F.RST_STREAM)
    assert [(f[2], F.u32(f[3])) for f in c.got if f[0] == F.RST_STREAM] == [(5, F.REFUSED_STREAM)]
    assert F.frame(F.SETTINGS, 0, 0, b"")[:3]  # (the server's SETTINGS announced 2)
    announced = dict(F.parse_settings(c.got[0][3]))
    assert announced[F.SETTINGS_MAX_CONCURRENT_STREAMS] == 2


def test_connections_past_the_ports_share_are_closed_at_accept(nbroker):
    b = nbroker(grpc_max_connections=2)
    conns = [Raw(b.ports["grpc"]) for _ in range(2)]
    for c in conns:
        c.read(0.5, until=lambda f: f[0] == F.SETTINGS)
        assert c.got and c.got[0][0] == F.SETTINGS
    extra = Raw(b.ports["grpc"])
    extra.read(2.0)
    assert extra.eof and not extra.got
    assert b.metrics.connections_refused["grpc"] >= 1


def test_a_deadline_ends_a_call_deadline_exceeded(nbroker):
    b = nbroker()
    c = Raw(b.ports["grpc"])
    start = time.monotonic()
    c.send(F.settings(ack=True), c.headers(1, method="Telemetry", timeout="300m"))
    t = c.trailers(1, timeout=5.0)
    assert t[b"grpc-status"] == b"4"
    assert 0.25 < time.monotonic() - start < 3.0


def test_keepalive_closes_a_connection_that_does_not_answer_pings(tmp_path, monkeypatch):
    import engine.broker.grpc_endpoint as ge
    monkeypatch.setattr(ge, "KEEPALIVE_TIME_MS", 300)
    monkeypatch.setattr(ge, "KEEPALIVE_TIMEOUT_MS", 300)
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_transport="native")).start()
    try:
        c = Raw(b.ports["grpc"])
        c.send(F.settings(ack=True))
        c.read(3.0)
        assert any(f[0] == F.PING and not f[1] & F.FLAG_ACK for f in c.got)
        assert c.eof  # the ping unanswered: closed
        live = Raw(b.ports["grpc"])  # one that answers stays
        live.send(F.settings(ack=True))
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for f in live.read(0.1):
                if f[0] == F.PING and not f[1] & F.FLAG_ACK:
                    live.send(F.ping(f[3], ack=True))
            live.got.clear()
        assert not live.eof
    finally:
        b.stop()


def test_stop_sends_goaway_with_the_last_stream(tmp_path):
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_transport="native")).start()
    c = Raw(b.ports["grpc"])
    c.send(F.settings(ack=True), c.headers(1), F.frame(F.DATA, F.FLAG_END_STREAM, 1, c.message(route_request())))
    assert c.trailers(1)[b"grpc-status"] == b"0"
    c.send(c.headers(3, method="Telemetry"))
    time.sleep(0.2)
    b.stop()
    goaways = [f for f in c.read(3.0) if f[0] == F.GOAWAY]
    assert goaways and F.u32(goaways[0][3], 4) == F.NO_ERROR and F.u32(goaways[0][3]) == 3
    assert c.eof


class _Transport:
    """What H2Connection uses of an asyncio transport, recording what it writes."""

    def __init__(self):
        self.out = []
        self.closed = False

    def write(self, data):
        self.out.append(bytes(data))

    def get_extra_info(self, name):
        return ("127.0.0.1", 5555) if name == "peername" else None

    def get_write_buffer_size(self):
        return 0

    def close(self):
        self.closed = True

    abort = close


def _mutated_conversations(seed, n):
    """Valid client conversations (preface, SETTINGS, a unary call, a Telemetry stream, PING, WINDOW_UPDATE,
    RST_STREAM) with random bytes flipped, cut, duplicated or inserted, split at random points."""
    import random

    rnd = random.Random(seed)
    c = Raw.__new__(Raw)
    for _ in range(n):
        c.enc = HpackEncoder()
        parts = [F.PREFACE, F.settings([(F.SETTINGS_INITIAL_WINDOW_SIZE, rnd.choice((0, 10, 65535, 1 << 20)))]),
                 F.settings(ack=True), c.headers(1), F.frame(F.DATA, 0, 1, c.message(route_request())[:7]),
                 F.frame(F.DATA, F.FLAG_END_STREAM, 1, c.message(route_request())[7:]),
                 c.headers(3, method="Telemetry", timeout="5S"), F.ping(b"abcdefgh"), F.window_update(0, 1000),
                 F.window_update(1, 5), F.frame(F.DATA, 0, 3, c.message(b"\x0a\x00")), F.rst_stream(3, F.CANCEL),
                 c.headers(5, method="Heartbeat", end_stream=True)]
        data = bytearray(b"".join(parts))
        for _ in range(rnd.randrange(4)):
            op, pos = rnd.randrange(4), rnd.randrange(24, len(data))
            if op == 0:
                data[pos] ^= 1 << rnd.randrange(8)
            elif op == 1:
                del data[pos:pos + rnd.randrange(1, 40)]
            elif op == 2:
                data[pos:pos] = data[pos:pos + rnd.randrange(1, 60)]
            else:
                data[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 20)))
        cuts = sorted(rnd.sample(range(1, len(data)), min(len(data) - 1, rnd.randrange(1, 8))))
        yield [bytes(data[a:b]) for a, b in zip([0] + cuts, cuts + [len(data)])]


def test_mutated_conversations_never_raise_out_of_the_protocol(nbroker):
    """Random damage to valid conversations: the connection answers or ends with GOAWAY, nothing escapes
    data_received, and no call, byte or stream is left held once the connection is gone."""
    b = nbroker()
    server = b.grpc._server

    def run(chunks):
        conn = H.H2Connection(server)
        t = _Transport()
        conn.connection_made(t)
        for chunk in chunks:
            conn.data_received(chunk)
        held = (conn.buffered, conn.pending)
        conn.connection_lost(None)
        return t, held, conn

    seen = set()
    for chunks in _mutated_conversations(seed=30, n=300):
        t, held, conn = b.call(run, chunks)
        out = F.FrameReader(F.MAX_MAX_FRAME_SIZE).feed(b"".join(t.out))
        assert out and out[0][0] == F.SETTINGS
        seen.update(f[0] for f in out)
        assert held[0] >= 0 and held[1] >= 0
        assert not conn.streams and conn.buffered == 0 and conn.pending == 0
    assert {F.DATA, F.HEADERS, F.GOAWAY, F.PING} <= seen  # answered calls and ended connections both
    time.sleep(0.2)
    assert server.calls == 0
    assert query_route_works(b)


def test_an_answer_waits_for_the_clients_window_and_goes_on_when_it_opens(nbroker):
    """A client announcing a 10-byte stream window gets 10 bytes of DATA, then the rest (and the trailers) as its
    WINDOW_UPDATEs come: the answer is whole and in order."""
    b = nbroker()
    c = Raw(b.ports["grpc"], settings=[(F.SETTINGS_INITIAL_WINDOW_SIZE, 10), (F.SETTINGS_MAX_FRAME_SIZE, 16384)])
    c.send(F.settings(ack=True), c.headers(1), F.frame(F.DATA, F.FLAG_END_STREAM, 1, c.message(route_request())))
    c.read(1.0, until=lambda f: f[0] == F.DATA)
    first = [f for f in c.got if f[0] == F.DATA]
    assert sum(len(f[3]) for f in first) == 10
    assert not any(f[0] == F.HEADERS and f[1] & F.FLAG_END_STREAM for f in c.got)  # trailers wait behind data
    for _ in range(20):
        c.send(F.window_update(1, 7))
    t = c.trailers(1)
    assert t[b"grpc-status"] == b"0"
    data = b"".join(f[3] for f in c.got if f[0] == F.DATA and f[2] == 1)
    assert s.QueryRouteResponse.FromString(data[5:]).status.message.startswith("topic not found")
    assert b.grpc._server.calls == 0


def test_the_frame_reader_gives_the_same_frames_however_the_bytes_are_split():
    import random

    rnd = random.Random(7)
    data = b"".join(F.frame(rnd.randrange(10), rnd.randrange(256), rnd.randrange(1 << 31),
                            bytes(rnd.randrange(256) for _ in range(rnd.randrange(300)))) for _ in range(60))
    whole = F.FrameReader().feed(data)
    assert len(whole) == 60
    for sizes in (1, 7, 500):
        reader, got, i = F.FrameReader(), [], 0
        while i < len(data):
            n = rnd.randrange(1, sizes + 1)
            got += reader.feed(data[i:i + n])
            i += n
        assert got == whole and all(type(f[3]) is bytes for f in got)
        assert reader.buffered == 0
    with pytest.raises(F.FrameError) as e:  # past the limit: raised from the header alone
        F.FrameReader(16384).feed(b"\x00\x40\x01" + bytes(6))
    assert e.value.code == F.FRAME_SIZE_ERROR


def test_a_streams_queued_messages_are_read_in_order_however_many_queue_up():
    """A stream's inbox is a list while it holds a few messages (a held Telemetry stream's usual state) and a deque
    once more queue up: the messages come out in order across the change, each consumed."""
    import asyncio
    import types

    consumed = []
    conn = types.SimpleNamespace(consumed=lambda call, n: consumed.append(n), server=None)
    method = types.SimpleNamespace(request_type=types.SimpleNamespace(FromString=bytes.decode))
    call = types.SimpleNamespace(inbox=[], conn=conn, method=method, remote_closed=False, closed=False, waiter=None)
    sent = [str(i).encode() * (i % 3 + 1) for i in range(40)]

    async def read(n):
        conn.loop = asyncio.get_running_loop()
        return [await H._Context(call).read() for _ in range(n)]

    call.inbox.extend(sent[:3])
    got = asyncio.run(read(2))
    assert type(call.inbox) is list
    call.inbox.extend(sent[3:])  # 38 waiting: the next read takes them as a deque
    got += asyncio.run(read(38))
    assert type(call.inbox) is not list and not call.inbox
    assert got == [m.decode() for m in sent] and consumed == [len(m) for m in sent]


def test_a_pending_read_is_the_next_message_the_streams_end_or_its_parse_error():
    """``read()`` is a future the core's wake-up (``set_result(None)``) resolves: with the message that arrived, the
    server's eof once the stream ended, or the abort error of a message that does not parse; a wake-up with
    neither leaves it waiting."""
    import asyncio
    import types

    class Abort(Exception):
        pass

    def parse(data):
        if data == b"bad":
            raise ValueError(data)
        return data.decode()

    eof = object()
    conn = types.SimpleNamespace(consumed=lambda call, n: None, server=types.SimpleNamespace(eof=eof,
                                                                                             abort_error=Abort))
    call = types.SimpleNamespace(inbox=[], conn=conn, remote_closed=False, closed=False, waiter=None, status=None,
                                 method=types.SimpleNamespace(request_type=types.SimpleNamespace(FromString=parse)))

    async def go():
        conn.loop = asyncio.get_running_loop()
        ctx = H._Context(call)
        r = ctx.read()
        assert not r.done() and call.waiter is r
        r.set_result(None)  # nothing arrived
        assert not r.done() and call.waiter is r
        call.inbox.append(b"one")
        r.set_result(None)
        assert await r == "one" and call.waiter is None
        r = ctx.read()
        call.inbox.append(b"bad")
        r.set_result(None)
        with pytest.raises(Abort):
            await r
        assert call.status == (H._INTERNAL, "Failed to parse request")
        r = ctx.read()
        call.remote_closed = True
        r.set_result(None)
        assert await r is eof and call.waiter is None
        assert await ctx.read() is eof  # and every read after it

    asyncio.run(go())


def test_a_large_message_over_many_frames_a_byte_apart(nbroker):
    """A 1 MiB request in 1,000-byte DATA frames, sent in 997-byte writes (frames cut anywhere): answered whole."""
    b = nbroker()
    c = Raw(b.ports["grpc"])
    req = s.QueryRouteRequest()
    req.topic.name = "T" * (1 << 20)
    msg = c.message(req.SerializeToString())
    frames_ = b"".join(F.frame(F.DATA, F.FLAG_END_STREAM if i + 1000 >= len(msg) else 0, 1, msg[i:i + 1000])
                       for i in range(0, len(msg), 1000))
    c.send(F.settings(ack=True), c.headers(1))
    for i in range(0, len(frames_), 997):
        c.send(frames_[i:i + 997])
    t = c.trailers(1, timeout=10.0)
    assert t[b"grpc-status"] == b"0"
    data = b"".join(f[3] for f in c.got if f[0] == F.DATA and f[2] == 1)
    assert s.QueryRouteResponse.FromString(data[5:]).status.code != 0  # the topic's name is illegal: an answer


def test_calls_past_the_brokers_calls_in_progress_are_refused(nbroker):
    """grpcMaxConcurrentRpcs counts calls over all connections: the third call (on another connection) is answered
    RESOURCE_EXHAUSTED while two Telemetry streams are open, and served once one has ended."""
    b = nbroker(grpc_max_concurrent_rpcs=2)
    c1, c2 = Raw(b.ports["grpc"]), Raw(b.ports["grpc"])
    c1.send(F.settings(ack=True), c1.headers(1, method="Telemetry"), c1.headers(3, method="Telemetry"))
    deadline = time.monotonic() + 3
    while b.grpc._server.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    c2.send(F.settings(ack=True), c2.headers(1), F.frame(F.DATA, F.FLAG_END_STREAM, 1, c2.message(route_request())))
    assert c2.trailers(1)[b"grpc-status"] == b"8"
    c1.send(F.rst_stream(1, F.CANCEL))
    deadline = time.monotonic() + 3
    while b.grpc._server.calls > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    c2.send(c2.headers(3), F.frame(F.DATA, F.FLAG_END_STREAM, 3, c2.message(route_request())))
    assert c2.trailers(3)[b"grpc-status"] == b"0"


def test_frames_written_outside_a_read_go_out_once_in_order(nbroker):
    """Frames a handler writes outside a read (a Telemetry answer, a call that waited) are gathered into one socket
    write per loop pass; a read that comes first takes them in front of its own frames, and a close writes them
    before the GOAWAY."""
    b = nbroker()
    server = b.grpc._server
    ping_ack = F.ping(b"12345678", ack=True)

    def start():
        conn = H.H2Connection(server)
        t = _Transport()
        conn.connection_made(t)
        conn.data_received(F.PREFACE + F.settings() + F.settings(ack=True))
        t.out.clear()
        return conn, t

    def gathered():
        conn, t = start()
        conn.write(F.window_update(1, 10))
        conn.write(F.window_update(3, 20))
        return conn, t, list(t.out)

    conn, t, before = b.call(gathered)
    assert before == []  # nothing written until the loop gets to it
    time.sleep(0.1)
    assert t.out == [F.window_update(1, 10) + F.window_update(3, 20)]  # then one write
    b.call(conn.connection_lost, None)

    def read_first():
        conn, t = start()
        conn.write(F.window_update(1, 10))
        conn.data_received(F.ping(b"12345678"))  # a read before the loop's pass: the earlier frame goes first
        return conn, t

    conn, t = b.call(read_first)
    time.sleep(0.1)
    assert t.out == [F.window_update(1, 10) + ping_ack]
    b.call(conn.connection_lost, None)

    def closed():
        conn, t = start()
        conn.write(F.window_update(1, 10))
        conn.goaway(F.NO_ERROR)
        return conn, t

    conn, t = b.call(closed)
    assert t.closed and b"".join(t.out) == F.window_update(1, 10) + F.goaway(0, F.NO_ERROR)
    time.sleep(0.1)
    assert b"".join(t.out) == F.window_update(1, 10) + F.goaway(0, F.NO_ERROR)  # written once


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_a_streams_packed_commands_are_handled_one_loop_step_each(tmp_path, transport):
    """A client packing hundreds of Telemetry commands into one write (within its stream's window) may not hold the
    broker's loop while they are handled: the handler yields once per command. (c3471cd handled a read's whole
    backlog in one step: 49,600 Settings in 1 MiB held the loop ~1 s.) Counted, not timed: a callback that
    reschedules itself with call_soon counts the loop's steps, and each command handled notes the count."""
    from collections import Counter

    from test_grpc_endpoint import producer_settings

    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_transport=transport)).start()
    try:
        steps, seen, running = [0], [], [True]

        def step():
            steps[0] += 1
            if running[0]:
                b.loop.call_soon(step)
        b.grpc.on_request = lambda method, metadata, request: seen.append(steps[0]) if method == "Telemetry" else None
        c = Raw(b.ports["grpc"], settings=((F.SETTINGS_INITIAL_WINDOW_SIZE, (1 << 31) - 1),))
        c.send(F.settings(ack=True), F.window_update(0, (1 << 31) - 1 - 65535), c.headers(1, "Telemetry"))
        body = c.message(s.TelemetryCommand(settings=producer_settings("T")).SerializeToString())
        per_frame = 16000 // len(body)
        frames = [F.frame(F.DATA, 0, 1, body * per_frame) for _ in range(60000 // (len(body) * per_frame))]
        n = per_frame * len(frames)
        b.loop.call_soon_threadsafe(step)
        c.send(*frames)
        deadline = time.monotonic() + 20
        while len(seen) < n and time.monotonic() < deadline:
            c.read(0.2)
        running[0] = False
        assert len(seen) == n > 300
        assert max(Counter(seen).values()) <= 2, Counter(seen).most_common(3)
    finally:
        b.stop()

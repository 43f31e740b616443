"""The HTTP/2 frame layer and gRPC message framing of the native 5.x transport, side by side in one run: the Cython
module engine.http2._frames and its pure-Python twin engine.http2._frames_py; and a repeated Heartbeat through the
whole transport (H2Connection on a real broker's endpoint, a stand-in socket) with either build under it.

The request bytes are real: the grpc C-core Heartbeat header blocks of tests/data/hpack (a 5.x client's second call
on a connection: 365 bytes naming what the first one indexed) with a 4-byte HeartbeatRequest. Run:

    .venv/bin/python -m pytest bench/bench_h2frames.py --benchmark-only --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,ops
"""
import asyncio
import json
import logging
import socket
import tempfile
import types
from pathlib import Path

import pytest

from engine.http2 import _frames_py, _hpack_py

try:
    from engine.http2 import _frames, _hpack
except ImportError:  # not built: the twin only
    _frames = _hpack = None

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = json.loads((ROOT / "tests" / "data" / "hpack" / "grpc_c_core_blocks.json").read_text())
REQUESTS = [bytes.fromhex(b) for b in BLOCKS["requests"]]
MESSAGE = b"\x08\x01\x12\x00"  # a HeartbeatRequest
IMPLS = {"native": _frames, "twin": _frames_py}


def mod(impl):
    if IMPLS[impl] is None:
        pytest.skip("engine.http2._frames is not built")
    return IMPLS[impl]


def calls(n, first_sid=1):
    """The bytes of ``n`` unary calls as a client writes them: HEADERS (END_HEADERS) and DATA (END_STREAM) each."""
    p = _frames_py
    out = []
    for i in range(n):
        sid = first_sid + 2 * i
        out.append(p.frame(p.HEADERS, p.FLAG_END_HEADERS, sid, REQUESTS[1]))
        out.append(p.frame(p.DATA, p.FLAG_END_STREAM, sid, b"\0" + len(MESSAGE).to_bytes(4, "big") + MESSAGE))
    return b"".join(out)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("n", [3, 32])
def test_frame_reader(benchmark, impl, n):
    """One read carrying ``n`` calls (at 10,000 sessions the broker's reads carry ~3, at 1,000 ~32)."""
    m = mod(impl)
    data = calls(n)
    benchmark.group = f"FrameReader.feed: one read of {n} calls ({len(data)} B)"
    reader = m.FrameReader()
    frames = benchmark(reader.feed, data)
    assert len(frames) == 2 * n and reader.buffered == 0


@pytest.mark.parametrize("impl", list(IMPLS))
def test_frame_reader_large_message(benchmark, impl):
    """A 1 MiB message in 16 KiB DATA frames arriving in 4,000-byte reads (frames split across reads)."""
    m = mod(impl)
    body = _frames_py.frame(0, 0, 1, b"m" * 16_384) * 64
    reads = [body[i:i + 4000] for i in range(0, len(body), 4000)]
    benchmark.group = "FrameReader.feed: 1 MiB in 16 KiB frames, 4,000-byte reads"

    def run():
        r = m.FrameReader()
        return sum(len(r.feed(x)) for x in reads)

    assert benchmark(run) == 64


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("size", [4, 65_536])
def test_message_reader(benchmark, impl, size):
    """A unary call's DATA: one message in one frame (4 B), or a 64 KiB message over 4 frames."""
    m = mod(impl)
    data = b"\0" + size.to_bytes(4, "big") + b"q" * size
    pieces = [data] if size < 16_384 else [data[i:i + 16_384] for i in range(0, len(data), 16_384)]
    benchmark.group = f"MessageReader: a {size}-byte message in {len(pieces)} DATA payload(s)"

    def run():
        r = m.MessageReader(4 << 20)
        out = []
        for p in pieces:
            out += r.feed(p)
        return out

    assert [len(x) for x in benchmark(run)] == [size]


ANSWER = b"\x0a\x02\x08\x00"  # HeartbeatResponse(status=OK)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_unary_answer(benchmark, impl):
    """A unary call's answer: HEADERS, DATA, trailers, RST_STREAM as one bytes."""
    m = mod(impl)
    benchmark.group = "unary_answer: HEADERS + DATA + trailers + RST_STREAM"
    out = benchmark(m.unary_answer, 7, b"\x88\x0f\x10\x10application/grpc", ANSWER, b"\x00\x0bgrpc-status\x010",
                    True)
    assert len(_frames_py.FrameReader().feed(out)) == 4


@pytest.mark.parametrize("impl", list(IMPLS))
def test_request_headers(benchmark, impl):
    """What the server reads of a call's headers (the 17-field grpc C-core Heartbeat list): the scan and the
    metadata tuple the handler's client id comes from."""
    m = mod(impl)
    d = _hpack_py.HpackDecoder()
    d.decode(REQUESTS[0])
    headers = d.decode(REQUESTS[1])
    benchmark.group = f"scan_request_headers + invocation_metadata ({len(headers)} fields)"
    scan, md = benchmark(lambda: (m.scan_request_headers(headers), m.invocation_metadata(headers)))
    assert scan[1].endswith(b"/Heartbeat") and any(k == "x-mq-client-id" for k, _ in md)


# ---------------------------------------------------------------------------------------------------------------
# the whole transport: a repeated Heartbeat through H2Connection


class _Transport:
    def __init__(self):
        self.written = 0

    def write(self, data):
        self.written += len(data)

    def get_extra_info(self, name):
        return ("127.0.0.1", 40000) if name == "peername" else None

    def get_write_buffer_size(self):
        return 0

    def close(self):
        pass

    abort = close


@pytest.fixture(scope="module")
def broker():
    logging.disable(logging.WARNING)
    from engine.broker.config import BrokerConfig
    from engine.broker.controller import Broker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tempfile.TemporaryDirectory()
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=store.name,
                            grpc_server_port=port, grpc_transport="native", grpc_max_sessions_per_connection=100_000,
                            grpc_max_sessions_per_ip=100_000)).start()
    yield b
    b.stop()
    store.cleanup()
    logging.disable(logging.NOTSET)


def _run(b, coro):
    return asyncio.run_coroutine_threadsafe(coro, b.loop).result()


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("per_read", [1, 3, 32])
def test_transport_repeated_heartbeat(benchmark, broker, monkeypatch, impl, per_read):
    """``per_read`` repeated Heartbeats of one session per read, answered from the repeat path; figure per read.
    The twin row runs server.py over the twins (connection core, frame layer and HPACK) instead of the native
    modules."""
    from engine.http2 import frames, server
    from rocketmq.grpc_protocol import definition_pb2 as d

    mod(impl)
    if impl == "twin":
        from engine.http2 import _core_py

        twin = types.SimpleNamespace(**{k: getattr(frames, k) for k in dir(frames) if not k.startswith("__")})
        for k in dir(_frames_py):
            if not k.startswith("_"):
                setattr(twin, k, getattr(_frames_py, k))
        for module in (server, _core_py):
            monkeypatch.setattr(module, "F", twin)
        monkeypatch.setattr(_core_py, "HpackDecoder", _hpack_py.HpackDecoder)
        # H2Connection's own methods over the twin core (the connection core decodes the header blocks)
        own = {k: v for k, v in vars(server.H2Connection).items() if k not in ("__dict__", "__weakref__")}
        connection = type("H2ConnectionTwin", (_core_py.H2Core, asyncio.Protocol), own)
    elif not server.NATIVE_CORE:
        pytest.skip("engine.http2._core is not built")
    else:
        connection = server.H2Connection
    ep = broker.grpc
    client_id = f"bench@h2frames-{impl}-{per_read}@0@x"  # its own session: the first call arms its repeat path
    hpack = (_hpack or _hpack_py).HpackEncoder()
    headers = [(b":method", b"POST"), (b":scheme", b"http"),
               (b":path", b"/apache.rocketmq.v2.MessagingService/Heartbeat"), (b":authority", b"127.0.0.1:8081"),
               (b"te", b"trailers"), (b"content-type", b"application/grpc"), (b"grpc-timeout", b"2999m"),
               (b"x-mq-client-id", client_id.encode()), (b"x-mq-language", b"PYTHON"),
               (b"x-mq-client-version", b"5.1.2"), (b"x-mq-protocol", b"v2"),
               (b"x-mq-request-id", b"f122a1e0-dbcf-4ca4-9db7-221903354be7"),
               (b"user-agent", b"grpc-python/1.85.3 grpc-c/52.0.0 (linux; chttp2)")]
    request = d.Settings(client_type=d.ClientType.PRODUCER)
    request.publishing.topics.add(name="T1")

    class Ctx:
        def invocation_metadata(self):
            return (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"), ("x-mq-client-version", "5.1.2"))

        def peer(self):
            return "ipv4:127.0.0.1:40000"

    state = {}

    async def setup():
        ep._update_settings(ep._session(Ctx(), create=True), request)
        conn = connection(ep._server)
        conn.connection_made(_Transport())
        conn.data_received(_frames_py.PREFACE + _frames_py.settings() + _frames_py.settings(ack=True))
        state["conn"], state["sid"] = conn, 1

    _run(broker, setup())
    conn = state["conn"]
    body = b"\0" + len(MESSAGE).to_bytes(4, "big") + MESSAGE
    # a client's HPACK table is per connection: the blocks are made in order, once, before the timed reads
    batch, rounds, warmup = 50, 20, 3
    reads = []
    sid = 1
    for _ in range((rounds + warmup + 1) * batch):
        parts = []
        for _ in range(per_read):
            parts.append(_frames_py.frame(1, 4, sid, hpack.encode(headers)))
            parts.append(_frames_py.frame(0, 1, sid, body))
            sid += 2
        reads.append(b"".join(parts))
    reads = iter(reads)

    async def some():
        for _ in range(batch):
            conn.data_received(next(reads))
            conn.send_window = conn.recv_window = 1 << 30  # the stand-in client never sends WINDOW_UPDATE

    def run():  # timed on the caller's thread: a round is `batch` reads, so the hop to the loop is ~1 % of it
        _run(broker, some())

    repeats = ep.heartbeat_repeats
    run()  # the first call arms the repeat path
    benchmark.group = (f"transport: {per_read} repeated Heartbeats per read through H2Connection "
                       f"(a round: {batch} reads, {batch * per_read} calls)")
    benchmark.pedantic(run, rounds=rounds, warmup_rounds=warmup)
    assert ep.heartbeat_repeats - repeats == (rounds + warmup + 1) * batch * per_read - 1 and not conn.closed
    _run(broker, asyncio.sleep(0))
    conn.connection_lost(None)

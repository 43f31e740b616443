"""Regression tests from the line-by-line review of the connection protocol (issue 15): each runs on the native
protocol (NativeConnection) and its twin (PyConnection) and holds both to the project's rules for untrusted
clients (nothing escapes ``data_received``, a decoded request is answered once, one logged close)."""
import asyncio
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.broker import server as server_mod
from engine.broker.config import BrokerConfig
from engine.broker.controller import Broker
from engine.codec.enums import FLAG_ONEWAY, RequestCode, ResponseCode

import test_protocol_parity as parity
from test_protocol_parity import native_class
from test_server_fastpath import FakeTransport, body, split_frames


@pytest.fixture(params=["native", "twin"])
def conn_class(request):
    return native_class() if request.param == "native" else server_mod.PyConnection


def make_broker(tmp_path, cls, **cfg):
    loop = asyncio.new_event_loop()
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=str(tmp_path / "store"), **cfg))
    b.loop = b.server.loop = loop
    b.server.connection_class = cls
    b.server.repeats = True
    return b


def connect(b):
    conn = b.server.new_connection("main")
    conn.connection_made(FakeTransport())
    return conn


def heartbeat(opaque, ext=None, **kw):
    return engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, ext_fields=ext, body=body(**kw)).encode()


def answers(conn):
    return [f for c in conn.transport.chunks for f in map(engine.decode_frame, split_frames(c)) if f.is_response]


def test_a_candidate_whose_opaque_would_push_the_armed_frame_past_the_limit_is_answered(tmp_path, conn_class):
    """The route armed on a heartbeat frame of exactly maxFrameSize bytes (opaque 1); then another heartbeat with
    an 11-character opaque is offered. RepeatRoute.arm asked the decoder for the armed frame with that opaque, which
    is 10 bytes over the limit: the FrameError escaped data_received (asyncio's unthrottled "Fatal error" traceback
    and a close without a logged reason in-process) and the heartbeat, applied to the registry, went unanswered."""
    limit = 4096
    b = make_broker(tmp_path, conn_class, max_frame_size=limit)
    try:
        conn = connect(b)
        pad = limit - len(heartbeat(1, {"pad": ""}))
        big = heartbeat(1, {"pad": "x" * pad})
        assert len(big) == limit
        for _ in range(3):
            conn.data_received(big)
        assert conn.route.armed is not None and conn.decoder.repeating
        conn.data_received(heartbeat(-2**31))  # a different frame (no pad), a different request: the full path
        got = answers(conn)
        assert [(a.opaque, a.code) for a in got] == [(1, 0)] * 3 + [(-2**31, ResponseCode.SUCCESS)]
        assert not conn.closing
        assert b.metrics.internal_errors.get("dispatch_failed", 0) == 0
        # the connection keeps being served: the big frame's repeats and the small one's alike
        conn.data_received(big.replace(b'"opaque":1,', b'"opaque":2,') + heartbeat(5))
        assert [(a.opaque, a.code) for a in answers(conn)[4:]] == [(2, 0), (5, 0)]
        assert not conn.closing
    finally:
        b.loop.close()


@settings(max_examples=int(os.environ.get("PARITY_EXAMPLES", 40)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(parity.REPEATING_STEPS, min_size=1, max_size=3),
       cuts=st.lists(st.lists(st.integers(0, 1 << 16), max_size=8), min_size=3, max_size=3),
       rules=st.sampled_from([4, 5]), per_frame=st.booleans())
def test_the_repeat_route_is_transparent(tmp_path_factory, steps, cuts, rules, per_frame):
    """The repeat route is an optimisation only: the same byte streams, split the same way, give the same writes,
    closes, registry state and metrics with the route on as with it off (every heartbeat decoded and run through
    the registry). The parity test compares native and twin with each other; this compares the route with the
    full path, which catches a repeat answered from a template after the registry's state changed (a oneway
    heartbeat, an unregister, another client's change to a shared group, a changed subVersion or fingerprint);
    with f28a3fb's oneway check taken out of Processors.heart_beat it fails (twin run). ``per_frame`` also cuts at
    every frame's end (a client's heartbeats arrive a read each, which is where the route arms and answers). Run on
    the protocol in use (native, or the twin under ENGINE_NO_EXTENSIONS=1)."""
    frames = [[parity.request(s, 100 * n + j) for j, s in enumerate(conn_steps)] for n, conn_steps in enumerate(steps)]
    streams = [b"".join(f) for f in frames]
    if per_frame:
        cuts = [c + [sum(map(len, f[:k])) for k in range(1, len(f))] for c, f in zip(cuts, frames)]
    tmp = tmp_path_factory.mktemp("route")
    on = parity.run(tmp, "on", server_mod.Connection, rules, streams, cuts, True)
    off = parity.run(tmp, "off", server_mod.Connection, rules, streams, cuts, False)
    assert not any(armed for armed, _ in off.pop("armed"))
    on.pop("armed")
    assert on == off


class FlowTransport(FakeTransport):
    """Records pause_reading / resume_reading."""

    def __init__(self):
        super().__init__()
        self.reading = True

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True


def test_a_drained_queue_does_not_resume_reading_while_writes_are_paused(tmp_path, conn_class):
    """Reading stops while the client does not read its answers (pause_writing) and resumes only once it does
    (resume_writing). The executor's drain resumed reading as soon as the connection's queued requests were few,
    with the write side still paused: a client that does not read kept being read, its answers piling up."""
    b = make_broker(tmp_path, conn_class)
    try:
        conn = b.server.new_connection("main")
        conn.connection_made(FlowTransport())
        ask = engine.RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, opaque=7,
                                     ext_fields={"consumerGroup": "g", "topic": "t", "queueId": "0"}).encode()
        conn.data_received(ask)  # queued on the consumer-manage executor
        assert conn.inflight == 1
        conn.pause_writing()  # the transport's buffer passed its high-water mark
        assert conn.reading_paused and not conn.transport.reading
        parity.drain(b)
        assert conn.inflight == 0
        assert conn.reading_paused and not conn.transport.reading  # still not reading: writes are paused
        conn.resume_writing()
        assert not conn.reading_paused and conn.transport.reading
        assert [a.opaque for a in answers(conn)] == [7]
    finally:
        b.loop.close()


LIMIT = 2048
#: opaques by decimal width: a repeat (same frame but the opaque) keeps its width, so the frame keeps its length
OPAQUE_WIDTHS = ([0, 1, 7, 9], [10, 42, 99], [123456, -99999], [2**31 - 1, 1_000_000_000], [-2**31, -1_000_000_000])


@st.composite
def heartbeats_at_the_limit(draw):
    """One connection's heartbeats padded (an ext field) to LIMIT bytes or a little less, from a pool of 1-3 kinds
    (client, slack under the limit, oneway, opaque width) sent many times, so the route arms on frames at the limit
    and meets other kinds with shorter and longer opaques."""
    pool = [(draw(st.integers(0, 1)), draw(st.sampled_from([0, 0, 1, 10, 40])), draw(st.integers(0, 3)) == 0,
             draw(st.sampled_from(OPAQUE_WIDTHS))) for _ in range(draw(st.integers(1, 3)))]
    frames = []
    for i in draw(st.lists(st.integers(0, 2), min_size=1, max_size=16)):
        who, slack, oneway, opaques = pool[i % len(pool)]
        opaque = draw(st.sampled_from(opaques))
        hb = body(client=f"10.0.0.{who}@1#1")
        bare = len(engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, ext_fields={"pad": ""},
                                          body=hb).encode())
        frames.append(engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, body=hb,
                                             ext_fields={"pad": "x" * max(0, LIMIT - bare - slack)},
                                             flag=FLAG_ONEWAY if oneway else 0).encode())
    return b"".join(frames)


def run_at_the_limit(tmp_path, cls, streams, cuts, repeats):
    b = make_broker(tmp_path, cls, max_frame_size=LIMIT)
    b.server.repeats = repeats
    try:
        conns = [parity.connect(b, 40001 + i) for i in range(len(streams))]
        pieces = []
        for i, data in enumerate(streams):
            points = sorted({p % (len(data) + 1) for p in cuts[i]} | {0, len(data)})
            pieces.append([data[a:z] for a, z in zip(points, points[1:])])
        k = 0
        while any(pieces):
            i = k % len(pieces)
            k += 1
            if pieces[i]:
                conns[i].data_received(pieces[i].pop(0))
                parity.drain(b)
        return parity.state(b, conns)
    finally:
        b.loop.close()


@settings(max_examples=int(os.environ.get("PARITY_EXAMPLES", 30)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(streams=st.lists(heartbeats_at_the_limit(), min_size=1, max_size=2),
       cuts=st.lists(st.lists(st.integers(0, 1 << 16), max_size=8), min_size=2, max_size=2))
def test_heartbeats_at_the_frame_limit_with_any_opaque(tmp_path_factory, streams, cuts):
    """Heartbeat frames of maxFrameSize bytes or just under, with opaques of every width, split anywhere: native
    and twin agree, the route on gives what the route off gives, and no connection is closed (every frame is within
    the limit). Before cdc32c2 the route's arming raised FrameError out of data_received here."""
    native = native_class()
    got = run_at_the_limit(tmp_path_factory.mktemp("n"), native, streams, cuts, True)
    want = run_at_the_limit(tmp_path_factory.mktemp("t"), server_mod.PyConnection, streams, cuts, True)
    assert got == want
    off = run_at_the_limit(tmp_path_factory.mktemp("off"), server_mod.Connection, streams, cuts, False)
    assert not any(armed for armed, _ in off.pop("armed"))
    got.pop("armed")
    assert got == off
    assert not any(closing for closing, _ in got["closed"]), got["closed"]

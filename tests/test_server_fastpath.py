"""The heartbeat fast path: answers served from encoded templates, decoded bodies reused per connection.

Every answer must stay byte-identical to ``cmd.response(...).encode()`` (both implementations, both serialize
types, any int32 opaque), and a reused decode must never hide a changed body.
"""
import asyncio
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from conftest import require_native
from engine.broker import processors as processors_mod
from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig
from engine.codec.enums import RequestCode, ResponseCode
from engine.broker.processors import answer_template
from engine.broker.server import Connection

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
V2_EXT = "IS_SUPPORT_HEART_BEAT_V2"
SUB_EXT = "IS_SUB_CHANGE"

BODY = (
    b'{"clientID":"%s","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":'
    b'"CONSUME_PASSIVELY","groupName":"%s","messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":'
    b'false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1718000000001,"tagsSet":[],"topic":'
    b'"%%RETRY%%%s"}],"unitMode":false}],"heartbeatFingerprint":%d,"producerDataSet":[{"groupName":'
    b'"CLIENT_INNER_PRODUCER"}],"withoutSub":%s}'
)


def body(client="10.0.0.1@1#1", group="g_fast", fingerprint=0, without_sub=False):
    return BODY % (client.encode(), group.encode(), group.encode(), fingerprint,
                   b"true" if without_sub else b"false")


def encoder(impl, serialize_type, code=0, remark=None, ext=None):
    def encode(opaque):
        req = impl.frame.RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, serialize_type=serialize_type)
        return req.response(code, remark=remark, ext_fields=ext).encode()

    return encode


# ------------------------------------------------------------------------------------------------ templates


@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
@pytest.mark.parametrize("sub_change", ["true", "false"])
def test_template_is_byte_identical_to_the_encoder(impl, serialize_type, sub_change):
    encode = encoder(impl, serialize_type, ext={V2_EXT: "true", SUB_EXT: sub_change})
    tpl = answer_template(encode, impl.frame.AnswerTemplate)
    assert isinstance(tpl, impl.frame.AnswerTemplate)
    for opaque in (0, 1, 9, 10, 99, 100, 123456789, 2**31 - 1, -1, -9, -10, -(2**31)):
        assert tpl.frame(opaque) == encode(opaque), opaque

    @settings(max_examples=300, deadline=None)
    @given(INT32)
    def prop(opaque):
        assert tpl.frame(opaque) == encode(opaque)

    prop()


@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
def test_template_with_remark_and_error_code(impl, serialize_type):
    encode = encoder(impl, serialize_type, code=ResponseCode.SYSTEM_ERROR, remark="r\u00e9mark \"quoted\"")
    tpl = answer_template(encode, impl.frame.AnswerTemplate)
    assert tpl is not None
    for opaque in (0, -5, 2**31 - 1, 4242):
        assert tpl.frame(opaque) == encode(opaque)


@pytest.mark.parametrize("kind", [None, 0, 1])
def test_template_implementations_agree_on_any_opaque(kind):
    require_native()  # not engine.NATIVE: the twin run (ENGINE_NO_EXTENSIONS=1) still has both to compare
    import engine.codec._frame as native
    import engine.codec._frame_py as twin

    h1, h2 = b"\x00\x00\x00\x00\x00\x00\x00\x00{\"opaque\":", b',"flag":1}'
    a, b = native.AnswerTemplate(h1, h2, kind), twin.AnswerTemplate(h1, h2, kind)

    @settings(max_examples=500, deadline=None)
    @given(st.integers(min_value=-(2**70), max_value=2**70))
    def prop(opaque):
        outcome = []
        for tpl in (a, b):
            try:
                outcome.append(tpl.frame(opaque))
            except OverflowError:
                outcome.append(OverflowError)
        assert outcome[0] == outcome[1]
        if -(2**31) <= opaque < 2**31:
            frame = outcome[0]
            if kind is not None:  # the length words follow the digit count
                assert int.from_bytes(frame[:4], "big") == len(frame) - 4
                assert frame[4] == kind and int.from_bytes(frame[5:8], "big") == len(frame) - 8
                assert frame[8:] == h1[8:] + b"%d" % opaque + h2
            else:  # a fixed-size slot: the prefix is the encoder's, as given
                assert frame == h1 + opaque.to_bytes(4, "big", signed=True) + h2
        else:
            assert outcome[0] is OverflowError

    prop()


def test_template_constructor_refuses_what_it_cannot_frame(impl):
    cls = impl.frame.AnswerTemplate
    with pytest.raises(ValueError):
        cls(b"short", b"", 0)  # no room for the 8-byte prefix
    with pytest.raises(ValueError):
        cls(b"\x00" * 8, b"", 256)
    with pytest.raises(TypeError):
        cls(bytearray(8), b"", None)
    with pytest.raises(TypeError):
        cls(b"\x00" * 8, b"", None).frame("1")


def test_template_refuses_layouts_it_cannot_patch():
    assert answer_template(lambda o: b"\x00\x00\x00\x08\x00\x00\x00\x04{}{}") is None  # opaque not in the frame
    assert answer_template(lambda o: b"\x00\x00\x00\x02ab") is None  # shorter than a header
    hexed = lambda o: (lambda h: (len(h) + 4).to_bytes(4, "big") + len(h).to_bytes(4, "big") + h)(  # noqa: E731
        b'{"opaque":"%x"}' % (o & 0xFFFFFFFF))
    assert answer_template(hexed) is None  # neither decimal text nor an int32
    body_after = lambda o: (lambda h: (len(h) + 7).to_bytes(4, "big") + len(h).to_bytes(4, "big") + h + b"bod")(  # noqa: E731
        b'{"opaque":%d}' % o)
    assert answer_template(body_after) is None  # a JSON answer with a body: its length words are not the header's


# ------------------------------------------------------------------------------------------------ processor


class FakeTransport:
    def __init__(self):
        self.chunks = []

    def get_extra_info(self, name):
        return ("127.0.0.1", 40001)

    def write(self, data):
        self.chunks.append(bytes(data))

    def get_write_buffer_size(self):
        return 0

    def close(self):
        self.closed = True

    abort = close

    def pause_reading(self):
        pass

    resume_reading = pause_reading


@pytest.fixture(params=[5, 4])
def offline(tmp_path, request):
    """A broker that is built but not listening: its processors driven through Connection.data_received; under
    5.x rules (heartbeat V2) and under the seeds' 4.x rules (clientManagementRules)."""
    loop = asyncio.new_event_loop()
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=str(tmp_path / "store"),
                            client_management_rules=request.param))
    b.loop = b.server.loop = loop
    yield b
    loop.close()


def split_frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        end = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
        out.append(data[pos:end])
        pos = end
    return out


def connect(broker):
    conn = Connection(broker.server, "main")
    conn.connection_made(FakeTransport())
    return conn


def test_every_heartbeat_answer_equals_the_encoded_response(offline, monkeypatch):
    """Spy on the registry: whatever it answers (V1, V2 changed/unchanged, errors), the bytes on the wire are
    exactly ``cmd.response(result...).encode()``."""
    results = []
    real = offline.registry.heartbeat

    def spy(*a, **kw):
        r = real(*a, **kw)
        results.append(r)
        return r

    monkeypatch.setattr(offline.registry, "heartbeat", spy)
    conn = connect(offline)
    sends = [(body(), "JSON", 1), (body(), "JSON", -7), (body(), "ROCKETMQ", 2**31 - 1),
             (body(fingerprint=77), "JSON", 10), (body(fingerprint=77, without_sub=True), "JSON", 11),
             (body(fingerprint=78, without_sub=True), "ROCKETMQ", -(2**31)), (body(fingerprint=78), "JSON", 0),
             (body(client=""), "JSON", 5), (body(group="g_other", fingerprint=78), "JSON", 123456)]
    for data, st_, opaque in sends:
        cmd = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, ext_fields={}, body=data,
                                     serialize_type=st_)
        conn.data_received(cmd.encode())
        r = results[-1]
        want = cmd.response(r.code, remark=r.remark, ext_fields=r.ext_fields).encode()
        # the read's one write may also carry a NOTIFY_CONSUMER_IDS_CHANGED this heartbeat caused
        answers = [f for f in split_frames(conn.transport.chunks[-1]) if engine.decode_frame(f).is_response]
        assert answers == [want]
    assert len(results) == len(sends)
    v2 = offline.config.client_management_rules == 5  # 4.x answers carry no ext fields
    assert {k for k, v in offline.processors._hb_answers.items() if v} >= {("JSON", True, v2), ("ROCKETMQ", True, v2)}


def test_identical_body_is_decoded_once_and_a_changed_body_again(offline, monkeypatch):
    calls = []
    real = processors_mod.decode_heartbeat
    monkeypatch.setattr(processors_mod, "decode_heartbeat", lambda b, *a: (calls.append(b), real(b, *a))[1])
    conn = connect(offline)

    def beat(data, opaque):
        conn.data_received(engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, ext_fields={},
                                                  body=data).encode())
        return [c for c in map(engine.decode_frame, split_frames(conn.transport.chunks[-1])) if c.is_response][0]

    for i in range(3):
        assert beat(body(group="g_a"), i).code == ResponseCode.SUCCESS
    assert len(calls) == 1
    assert list(offline.registry.consumer_ids("g_a")) == ["10.0.0.1@1#1"]
    # the client moves to another group: decoded again, and the registry sees the new body
    assert beat(body(group="g_b"), 10).code == ResponseCode.SUCCESS
    assert len(calls) == 2
    assert list(offline.registry.consumer_ids("g_b")) == ["10.0.0.1@1#1"]
    # a broken body is an error answer; it does not replace the remembered one
    bad = beat(b'{"clientID":', 11)
    assert bad.code == ResponseCode.SYSTEM_ERROR and len(calls) == 3
    assert beat(body(group="g_b"), 12).code == ResponseCode.SUCCESS
    assert len(calls) == 3
    # the cache is per connection: another connection with the same body decodes for itself
    other = connect(offline)
    other.data_received(engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=1, ext_fields={},
                                               body=body(group="g_b")).encode())
    assert len(calls) == 4


def test_batched_heartbeats_in_one_read_are_answered_in_one_write(offline):
    conn = connect(offline)
    frames = [engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=o, ext_fields={}, body=body()).encode()
              for o in range(100, 108)]
    conn.data_received(b"".join(frames))
    assert len(conn.transport.chunks) == 1
    decoder = engine.FrameDecoder()
    answers = [c for c in decoder.feed(conn.transport.chunks[0]) if c.is_response]  # a NOTIFY may ride along
    assert [a.opaque for a in answers] == list(range(100, 108))
    assert all(a.code == ResponseCode.SUCCESS and a.is_response for a in answers)


# ------------------------------------------------------------------------------------------------ over the wire


@pytest.mark.parametrize("rules", [5, 4])
def test_wire_answers_carry_each_requests_opaque(tmp_path, rules):
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "s"),
                            fast_port_enable=False, client_management_rules=rules)).start()
    ext = {V2_EXT: "true", SUB_EXT: "true"} if rules == 5 else None  # a 4.9 broker's answer has no ext fields
    try:
        sock = socket.create_connection(("127.0.0.1", b.ports["main"]), timeout=5)
        opaques = [0, 1, 9, 10, 2**31 - 1, -1, -(2**31), 5, 5]
        sts = ["JSON", "ROCKETMQ"]
        sent = []
        for i, o in enumerate(opaques):
            cmd = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=o, ext_fields={}, body=body(),
                                         serialize_type=sts[i % 2])
            sent.append(cmd)
        sock.sendall(b"".join(c.encode() for c in sent))
        decoder, got = engine.FrameDecoder(), []
        while len(got) < len(sent):
            data = sock.recv(65536)
            assert data
            got += [c for c in decoder.feed(data) if c.is_response]  # NOTIFY requests may be interleaved
        for req, ans in zip(sent, got):
            assert ans.opaque == req.opaque and ans.is_response and ans.code == ResponseCode.SUCCESS
            assert ans.serialize_type == req.serialize_type
            assert ans.version == engine.BROKER_VERSION
            assert ans.ext_fields == ext
            assert ans.encode() == req.response(0, ext_fields=ext).encode()
        sock.close()
    finally:
        b.stop()


def test_int32_pack_matches_rocketmq_header_layout():
    # the ROCKETMQ header keeps the opaque as a big-endian int32 right after code, language and version
    cmd = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=-2, serialize_type="ROCKETMQ")
    frame = cmd.response(0).encode()
    assert frame[8 + 5:8 + 9] == struct.pack(">i", -2)


# ------------------------------------------------------------------------------------------------ send_soon


def test_send_soon_coalesces_a_loop_iteration_into_one_write(offline):
    a, b = connect(offline), connect(offline)

    async def go():
        a.send_soon(b"n1")
        b.send_soon(b"m1")
        a.send_soon(b"n2")
        assert a.transport.chunks == [] and b.transport.chunks == []  # nothing written before the iteration ends
        for _ in range(3):
            await asyncio.sleep(0)
        return list(a.transport.chunks), list(b.transport.chunks)

    assert offline.loop.run_until_complete(go()) == ([b"n1n2"], [b"m1"])


def test_send_soon_during_the_clients_own_read_joins_that_reads_write(offline, monkeypatch):
    a = connect(offline)
    real = offline.processors.heart_beat

    def hb_and_notify(conn, cmd):
        conn.send_soon(b"NOTIFY")
        return real(conn, cmd)

    monkeypatch.setitem(offline.server.table, int(RequestCode.HEART_BEAT),
                        (hb_and_notify, offline.server.table[int(RequestCode.HEART_BEAT)][1]))
    a.data_received(engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=3, ext_fields={}, body=body()).encode())
    assert len(a.transport.chunks) == 1 and a.transport.chunks[0].startswith(b"NOTIFY")


def test_send_soon_is_flushed_by_a_graceful_close_and_dropped_by_an_abort(offline):
    a, b = connect(offline), connect(offline)

    async def go():
        a.send_soon(b"bye")
        b.send_soon(b"lost")
        a.close("test", abort=False)
        b.close("test", abort=True)
        for _ in range(3):
            await asyncio.sleep(0)

    offline.loop.run_until_complete(go())
    assert a.transport.chunks == [b"bye"] and b.transport.chunks == []


def test_send_soon_without_a_running_loop_writes_at_once(offline):
    a = connect(offline)
    a.send_soon(b"x")
    assert a.transport.chunks == [b"x"]


# ------------------------------------------------------------------------------------------------ sweep


def test_sweep_checks_idleness_a_slice_at_a_time_and_finds_every_idle_connection(offline, monkeypatch):
    server = offline.server
    monkeypatch.setattr(type(server), "IDLE_SLICE", 3)
    conns = [connect(offline) for _ in range(10)]
    server._closing = True  # no rescheduling on the offline loop
    busy = conns[4]
    idle_limit = offline.config.server_channel_max_idle_time_seconds
    for c in conns:
        c.last_io -= idle_limit + 5
    seen_closed = []
    for _ in range(4):  # ceil(10 / 3) sweeps make one pass
        busy.last_io = server.tick + 10  # keeps talking
        server._sweep()
        seen_closed.append(sum(c.closing for c in conns))
    assert seen_closed[0] <= 3 and seen_closed == sorted(seen_closed)
    assert [c.closing for c in conns] == [c is not busy for c in conns]
    assert all(c.close_reason.startswith("idle for") for c in conns if c is not busy)


def test_partial_frames_and_write_stalls_are_tracked_for_the_sweep(offline):
    server = offline.server
    a, b, c = connect(offline), connect(offline), connect(offline)
    server._closing = True  # no rescheduling on the offline loop
    frame = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=1, ext_fields={}, body=body()).encode()
    a.data_received(frame[:10])
    b.data_received(frame[:10])
    assert server.partial == {a, b}
    b.data_received(frame[10:])  # completed: no longer partial
    assert server.partial == {a}
    c.pause_writing()
    assert server.stalled == {c}
    a.partial_since -= offline.config.incomplete_frame_timeout_ms / 1000.0 + 1
    c.write_paused_since -= offline.config.write_stall_timeout_ms / 1000.0 + 1
    server._sweep()
    assert a.closing and a.close_reason.startswith("incomplete frame for")
    assert c.closing and c.close_reason.startswith("client does not read its responses")
    assert not b.closing
    for x in (a, c):
        x.connection_lost(None)
    assert server.partial == set() and server.stalled == set()


# ------------------------------------------------------------------------------------------------ descriptor cap


def test_connection_cap_keeps_descriptors_for_the_broker(tmp_path):
    import resource

    from engine.broker.server import FD_RESERVE, connection_capacity

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_capacity(10) == 10
    if soft != resource.RLIM_INFINITY:
        assert connection_capacity(10**9) == soft - FD_RESERVE
    # a lowered limit: the broker answers "too many connections" instead of losing clients at accept
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_RESERVE + 3, hard))
    try:
        b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "s"),
                                fast_port_enable=False, max_connections=1000)).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert b.server.max_connections == 3
        socks = [socket.create_connection(("127.0.0.1", b.ports["main"]), timeout=5) for _ in range(4)]
        last = socks[-1]
        last.sendall(engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=9, ext_fields={}, body=body()).encode())
        decoder, got = engine.FrameDecoder(), []
        while not got:
            data = last.recv(65536)
            assert data
            got = [c for c in decoder.feed(data) if c.is_response]
        assert got[0].code == ResponseCode.SYSTEM_BUSY
        assert got[0].remark.startswith("too many connections (3, maxConnections=3)")
        for s in socks:
            s.close()
    finally:
        b.stop()

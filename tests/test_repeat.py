"""Repeated requests: FrameDecoder.arm_repeat (native and twin) and the broker's short route for a heartbeat its
client sends again unchanged.

A repeat is only ever a frame equal to the armed one but for its opaque, so handing back just the opaque loses
nothing: decoding that frame in full must give exactly ``repeat_command(opaque)``. The broker must answer a repeat
byte for byte as the full path would, refresh the registry the same way, and fall back to the full path the moment
the registry's fast-path conditions stop holding.
"""
import asyncio
import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig
from engine.codec.enums import RequestCode, ResponseCode
from engine.registry.client_registry import ConsumerGroupEvent
from engine.broker.server import Connection

from conftest import require_native
from test_server_fastpath import FakeTransport, body, split_frames

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def request(opaque, data=b"hb-body", serialize_type="JSON", ext=None, code=RequestCode.HEART_BEAT, **kw):
    return engine.RemotingCommand(code, opaque=opaque, ext_fields={} if ext is None else ext, body=data,
                                  serialize_type=serialize_type, **kw).encode()


def with_opaque_text(frame: bytes, text: bytes) -> bytes:
    """A JSON-header frame with its opaque's digits replaced by ``text`` (length words rebuilt)."""
    hlen = int.from_bytes(frame[5:8], "big")
    header, rest = frame[8:8 + hlen], frame[8 + hlen:]
    i = header.index(b'"opaque":') + 9
    j = i
    while header[j:j + 1] in b"-0123456789" and j < len(header):
        j += 1
    header = header[:i] + text + header[j:]
    return (4 + len(header) + len(rest)).to_bytes(4, "big") + bytes((frame[4],)) + len(header).to_bytes(3, "big") \
        + header + rest


# ------------------------------------------------------------------------------------------------ decoder


@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
def test_a_repeat_comes_back_as_its_opaque_and_anything_else_in_full(impl, serialize_type):
    d = impl.frame.FrameDecoder()
    d.watch_code = RequestCode.HEART_BEAT
    first = request(5, serialize_type=serialize_type)
    assert [c.opaque for c in d.feed(first)] == [5] and d.watched == first and not d.repeating
    assert d.arm_repeat(d.watched) and d.repeating and d.repeat_body == b"hb-body"
    other_body = request(8, data=b"hb-bodY", serialize_type=serialize_type)
    other_code = request(9, code=RequestCode.UNREGISTER_CLIENT, serialize_type=serialize_type)
    out = d.feed(request(-77, serialize_type=serialize_type) + other_body + other_code
                 + request(2**31 - 1, serialize_type=serialize_type))
    assert out[0] == -77 and out[3] == 2**31 - 1
    assert out[1] == impl.frame.decode_frame(other_body) and out[2] == impl.frame.decode_frame(other_code)
    assert d.watched == other_body  # the last heartbeat frame decoded in full; the other code is not watched
    for opaque in (-77, 0, 2**31 - 1, -(2**31)):
        assert d.repeat_command(opaque) == impl.frame.decode_frame(request(opaque, serialize_type=serialize_type))
    assert d.feed(b"") == [] and d.watched is None  # each feed says what it saw
    d.disarm_repeat()
    assert not d.repeating and d.repeat_body is None
    assert d.feed(request(3, serialize_type=serialize_type))[0].opaque == 3
    with pytest.raises(ValueError):
        d.repeat_command(3)


@pytest.mark.parametrize("text", [b"007", b"-0", b"00", b"2147483648", b"-2147483649", b"99999999999", b"+5"])
def test_non_canonical_or_out_of_range_opaque_text_is_decoded_in_full(impl, text):
    d = impl.frame.FrameDecoder()
    assert d.arm_repeat(request(5))
    frame = with_opaque_text(request(5), text)
    try:
        want = [impl.frame.decode_frame(frame)]
    except engine.FrameError:
        want = None
    if want is None:
        with pytest.raises(engine.FrameError):
            d.feed(frame)
    else:
        assert d.feed(frame) == want and type(want[0]) is not int


def test_a_frame_whose_opaque_cannot_be_located_is_not_armed(impl):
    d = impl.frame.FrameDecoder()
    assert not d.arm_repeat(request(5, ext={"opaque": "5"}))  # "opaque": twice in the header
    assert not d.arm_repeat(b"\x00\x00\x00\x02ab")  # not a frame
    assert not d.repeating
    assert d.arm_repeat(request(5, remark='"opaque":5'))  # inside a string it is escaped: not a second key


def test_the_frame_limit_holds_for_repeats_too(impl):
    frame = request(1, data=b"x")
    fits = next(m for m in range(len(frame) - 8, len(frame) + 8) if _decodes(impl, frame, m))
    d = impl.frame.FrameDecoder(max_frame_size=fits + 1)  # room for 2 digits, not 10
    assert d.arm_repeat(frame)
    assert d.repeat_command(99).opaque == 99
    with pytest.raises(engine.FrameError):
        d.repeat_command(2**31 - 1)
    with pytest.raises(engine.FrameError):
        d.feed(request(2**31 - 1, data=b"x"))


def _decodes(impl, frame, max_frame_size):
    try:
        impl.frame.decode_frame(frame, max_frame_size)
        return True
    except engine.FrameError:
        return False


def other_topic(client, group):
    """A consumer of ``group`` subscribed to another topic than body()'s: joining flips the group's table."""
    return engine.encode_heartbeat(engine.HeartbeatData(client, (), (engine.ConsumerData(
        group, engine.ConsumeType.CONSUME_PASSIVELY, engine.MessageModel.CLUSTERING,
        engine.ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, False,
        (engine.SubscriptionData("T_other", "*", (), (), 1),)),)))


FIELDS = st.fixed_dictionaries({
    "serialize_type": st.sampled_from(["JSON", "ROCKETMQ"]),
    "data": st.binary(max_size=40),
    "ext": st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), st.text(max_size=6), max_size=3),
    "remark": st.none() | st.text(max_size=8),
})


@settings(max_examples=300, deadline=None)
@given(FIELDS, st.lists(st.tuples(st.sampled_from(["repeat", "body", "text", "other"]), INT32, st.binary(max_size=3)),
                        max_size=8), st.integers(min_value=1, max_value=97))
def test_native_and_twin_agree_and_every_repeat_is_exact(fields, stream, chunk):
    require_native()
    native, twin = importlib.import_module("engine.codec._frame"), importlib.import_module("engine.codec._frame_py")
    base = request(1, fields["data"], fields["serialize_type"], fields["ext"], remark=fields["remark"])
    frames = []
    for kind, opaque, noise in stream:
        if kind == "repeat":
            frames.append(request(opaque, fields["data"], fields["serialize_type"], fields["ext"],
                                  remark=fields["remark"]))
        elif kind == "body":
            frames.append(request(opaque, fields["data"] + noise + b"!", fields["serialize_type"], fields["ext"],
                                  remark=fields["remark"]))
        elif kind == "text" and fields["serialize_type"] == "JSON":
            frames.append(with_opaque_text(base, b"-0"))  # valid JSON for 0, but not the canonical text
        else:
            frames.append(request(opaque, noise, fields["serialize_type"], code=RequestCode.UNREGISTER_CLIENT))
    data = b"".join(frames)
    outs = []
    for mod in (native, twin):
        d = mod.FrameDecoder()
        d.watch_code = RequestCode.HEART_BEAT
        armed = d.arm_repeat(base)
        out = []
        for k in range(0, len(data), chunk):
            out.extend(d.feed(data[k:k + chunk]))
        outs.append((armed, [x if type(x) is int else x.to_dict() for x in out], d.watched))
        for x, frame in zip(out, frames):  # soundness: a repeat stands for exactly its frame's full decode
            if type(x) is int:
                assert d.repeat_command(x) == mod.decode_frame(frame)
    assert outs[0] == outs[1]
    assert outs[0][0]  # every such request frame can be armed


# ------------------------------------------------------------------------------------------------ broker route


@pytest.fixture
def make_broker(tmp_path):
    loops = []

    def make(**cfg):
        loop = asyncio.new_event_loop()
        loops.append(loop)
        b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=str(tmp_path / f"store{len(loops)}"), **cfg))
        b.loop = b.server.loop = loop
        return b

    yield make
    for loop in loops:
        loop.close()


def connect(broker, port=40001):
    conn = Connection(broker.server, "main")
    t = FakeTransport()
    t.get_extra_info = lambda name: ("127.0.0.1", port)
    conn.connection_made(t)
    return conn


def beat(conn, opaques, data, serialize_type="JSON"):
    """One read of heartbeats; the answers (responses only: a NOTIFY may ride along)."""
    conn.data_received(b"".join(request(o, data, serialize_type) for o in opaques))
    return [f for f in split_frames(conn.transport.chunks[-1]) if engine.decode_frame(f).is_response]


@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
def test_repeats_are_answered_as_the_full_path_answers_them(make_broker, serialize_type):
    fast, full = make_broker(), make_broker()
    full.server.repeats = False  # before its connections exist: they do not watch heartbeats
    a, b = connect(fast), connect(full)
    data = body(fingerprint=0)
    for opaques in ([1], [2, 3], [4, 5, 6], [-(2**31), 2**31 - 1, 0, 10]):
        assert beat(a, opaques, data, serialize_type) == beat(b, opaques, data, serialize_type)
    assert a.repeat is not None and a.decoder.repeating and b.repeat is None and not b.decoder.repeating
    assert a.hb_body is a.decoder.repeat_body  # the connection keeps one copy of the body
    # the route did the registry's work: the slot's time is the clock's, as on the full path
    slot = fast.registry.channel_table.find(a)
    assert fast.registry.channel_table.last(slot) > 0
    assert fast.metrics.heartbeats == full.metrics.heartbeats == 10
    assert fast.metrics.requests[RequestCode.HEART_BEAT] == full.metrics.requests[RequestCode.HEART_BEAT] == 10
    assert fast.registry.consumer_ids("g_fast") == full.registry.consumer_ids("g_fast")


def test_a_group_change_sends_the_next_repeat_down_the_full_path(make_broker, monkeypatch):
    broker = make_broker()
    a = connect(broker, 40001)
    data = body(client="10.0.0.1@1#1", group="g_x")
    beat(a, [1], data)
    beat(a, [2, 3], data)
    assert a.repeat is not None
    full = []
    real = broker.processors.heart_beat
    monkeypatch.setattr(broker.server, "table", {**broker.server.table, RequestCode.HEART_BEAT: (
        lambda conn, cmd: (full.append(cmd.opaque), real(conn, cmd))[1], broker.server.table[RequestCode.HEART_BEAT][1])})
    # another consumer of the group subscribes to another topic: the group's subscription table flips, a change
    # a's next heartbeat must see (it flips the table back, and the members are notified)
    b = connect(broker, 40002)
    beat(b, [1], other_topic("10.0.0.2@1#1", "g_x"))
    assert set(broker.registry.consumer_group_info("g_x").subscription_table) == {"T_other"}
    answers = beat(a, [4, 5, 6], data)
    assert [engine.decode_frame(f).opaque for f in answers] == [4, 5, 6]
    assert all(engine.decode_frame(f).code == ResponseCode.SUCCESS for f in answers)
    assert full[-3:] == [4, 5, 6]  # none of them was served on the stale token
    # the full path re-armed the registry on the new state, and the route with it: the next read is repeats again
    n = len(full)
    beat(a, [7, 8], data)
    assert len(full) == n and a.repeat is not None
    assert sorted(broker.registry.consumer_ids("g_x")) == ["10.0.0.1@1#1", "10.0.0.2@1#1"]
    assert set(broker.registry.consumer_group_info("g_x").subscription_table) == {"%RETRY%g_x"}


def test_a_changed_body_is_decoded_in_full_and_the_old_one_is_no_longer_a_repeat(make_broker, monkeypatch):
    broker = make_broker()
    a = connect(broker)
    beat(a, [1], body(group="g_1"))
    beat(a, [2], body(group="g_1"))
    assert a.decoder.repeating
    beat(a, [3], body(group="g_2"))  # the client moved: not a repeat, the registry sees it
    assert list(broker.registry.consumer_ids("g_2")) == ["10.0.0.1@1#1"]
    # the slot's memberships changed: the old body, sent again, must take the full path (the token is stale)
    served = []
    real = broker.registry.heartbeat
    monkeypatch.setattr(broker.registry, "heartbeat", lambda *a, **k: (served.append(1), real(*a, **k))[1])
    answers = beat(a, [4], body(group="g_1"))
    assert served == [1] and engine.decode_frame(answers[0]).code == ResponseCode.SUCCESS


def test_no_route_when_every_request_must_be_seen(make_broker, tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: ak\n    secretKey: sk12345678\n    admin: true\n")
    for broker in (make_broker(acl_enable=True, acl_file=str(acl)), make_broker(record_dir=str(tmp_path / "rec"))):
        assert not broker.server.repeats
        conn = connect(broker)
        assert conn.decoder.watch_code is None
        for o in range(4):
            conn.data_received(request(o, body()))
        assert conn.repeat is None and not conn.decoder.repeating
        if broker.recorder is not None:
            broker.recorder.close()


def test_registry_tokens_hold_only_while_the_fast_path_would(make_broker):
    reg = make_broker().registry
    hb = engine.decode_heartbeat(body(group="g_t"))
    reg.heartbeat("ch", hb)
    assert reg.repeat_token("ch", hb) is None  # a registering run does not arm
    reg.heartbeat("ch", hb)
    token = reg.repeat_token("ch", hb)
    assert token is not None and reg.repeat_token("ch", hb, version=1) is None
    assert reg.heartbeat_repeat(token) is not None
    reg.heartbeat("other", engine.decode_heartbeat(body(client="10.0.0.9@1#1", group="g_t")))  # a member joins
    assert reg.heartbeat_repeat(token) is not None  # nothing a repeat would see
    reg.heartbeat("other", engine.decode_heartbeat(other_topic("10.0.0.9@1#1", "g_t")))  # the table flips
    assert reg.heartbeat_repeat(token) is None
    reg.heartbeat("ch", hb)  # flips the table back (a change)
    reg.heartbeat("ch", hb)  # the no-op run re-arms the fast path
    token = reg.repeat_token("ch", hb)
    assert reg.heartbeat_repeat(token) is not None
    reg.close_channel("ch")
    assert reg.heartbeat_repeat(token) is None


def test_no_tokens_while_register_events_are_wanted(tmp_path):
    from engine.registry.client_registry import ClientRegistry

    reg = ClientRegistry(listener=lambda e: None, events={ConsumerGroupEvent.REGISTER})
    hb = engine.decode_heartbeat(body())
    reg.heartbeat("ch", hb)
    reg.heartbeat("ch", hb)
    assert reg.repeat_token("ch", hb) is None


def test_every_captured_client_heartbeat_can_be_armed_and_repeated(impl, vectors):
    seen = set()
    for client, _, raw in vectors:
        try:
            cmd = impl.frame.decode_frame(raw)
        except engine.FrameError:
            continue
        if cmd.code != RequestCode.HEART_BEAT or cmd.is_response:
            continue
        d = impl.frame.FrameDecoder()
        assert d.arm_repeat(raw), client
        again = cmd.opaque + 1 if cmd.opaque < 2**31 - 1 else 0
        frame = with_opaque_text(raw, b"%d" % again) if cmd.serialize_type == "JSON" else None
        if frame is not None:
            assert d.feed(raw + frame) == [cmd.opaque, again]
            assert d.repeat_command(again) == impl.frame.decode_frame(frame)
        seen.add(client)
    assert len(seen) >= 2  # both real clients' heartbeats


def test_native_arm_repeat_has_its_own_derivation(monkeypatch):
    """The parity test compares two implementations: the native decoder does not call the twin's derivation."""
    require_native()
    native = importlib.import_module("engine.codec._frame")
    twin = importlib.import_module("engine.codec._frame_py")

    def refuse(*a, **kw):
        raise AssertionError("the twin's repeat_pattern was called")

    monkeypatch.setattr(twin, "repeat_pattern", refuse)
    monkeypatch.setattr(twin, "repeat_frame", refuse)
    frame = request(7, b"hb-body")
    dec = native.FrameDecoder()
    assert dec.arm_repeat(frame)
    assert dec.feed(request(99, b"hb-body")) == [99]
    assert dec.repeat_command(99).opaque == 99

"""engine.broker.repeat.RepeatRoute: the one object holding a connection's repeat route (issue 15), on its own (over the
native and the twin FrameDecoder) and its invariants along a connection's life in the broker."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.codec.enums import FLAG_ONEWAY, RequestCode, ResponseCode
from engine.broker import server as server_mod
from engine.broker.repeat import RepeatRoute

from test_repeat import beat, connect, make_broker, other_topic, request  # noqa: F401 (fixture)
from test_server_fastpath import FakeTransport, body, split_frames

ANSWER = object()  # stands for the HeartbeatRepeat the heartbeat processor offers


def fed(impl, *frames):
    """A decoder watching heartbeats that has read ``frames`` (one read); its commands."""
    d = impl.frame.FrameDecoder()
    d.watch_code = RequestCode.HEART_BEAT
    return d, d.feed(b"".join(frames))


def test_a_new_route_is_idle():
    r = RepeatRoute()
    assert (r.body, r.hb, r.norepeat, r.candidate, r.armed) == (None, None, None, None, None)
    assert "idle" in repr(r)
    with pytest.raises(AttributeError):
        r.other = 1  # slots: the state is exactly the documented attributes


def test_the_candidate_arms_the_decoder_on_the_reads_heartbeat_frame(impl):
    d, (cmd,) = fed(impl, request(5, b"hb-1"))
    r = RepeatRoute()
    r.body = cmd.body  # the processor cached this decode
    r.offer(ANSWER, cmd)
    assert r.candidate == (ANSWER, cmd) and "candidate" in repr(r)
    r.arm(False, d)
    assert r.candidate is None and r.armed is ANSWER and d.repeating and "armed" in repr(r)
    assert d.repeat_command(77) == impl.frame.decode_frame(request(77, b"hb-1"))
    assert r.body is d.repeat_body  # one copy of the body
    assert d.feed(request(8, b"hb-1")) == [8]


def test_a_closing_connection_arms_nothing_and_drops_the_candidate(impl):
    d, (cmd,) = fed(impl, request(5, b"hb-1"))
    r = RepeatRoute()
    r.offer(ANSWER, cmd)
    r.arm(True, d)
    assert r.candidate is None and r.armed is None and not d.repeating and r.norepeat is None


def test_a_decoder_already_armed_on_the_candidates_request_is_kept(impl):
    """The registry re-armed after a change: the repeat that was replayed is the candidate, no new frame."""
    d, _ = fed(impl, request(5, b"hb-1"))
    assert d.arm_repeat(d.watched)
    (opaque,) = d.feed(request(6, b"hb-1"))
    assert opaque == 6 and d.watched is None
    r = RepeatRoute()
    r.offer(ANSWER, d.repeat_command(6))
    r.arm(False, d)
    assert r.armed is ANSWER and d.repeating


def test_a_candidate_that_is_not_the_watched_frame_is_not_armed_and_not_offered_again(impl):
    # the read's last heartbeat frame is another body than the candidate's request
    d, (first, last) = fed(impl, request(5, b"hb-1"), request(6, b"hb-2"))
    r = RepeatRoute()
    r.armed = ANSWER  # armed earlier: a failed arming clears it
    r.offer(ANSWER, first)
    r.arm(False, d)
    assert r.armed is None and not d.repeating and r.norepeat == b"hb-1"


def test_no_heartbeat_frame_in_the_read_leaves_the_route_unarmed(impl):
    d, _ = fed(impl, request(5, b"x", code=RequestCode.UNREGISTER_CLIENT))
    cmd = impl.frame.decode_frame(request(5, b"hb-1"))
    r = RepeatRoute()
    r.offer(ANSWER, cmd)
    r.arm(False, d)
    assert r.armed is None and not d.repeating and r.norepeat is None


def test_a_frame_the_decoder_cannot_arm_is_not_offered_again():
    class Refusing:
        repeating = False
        watched = b"frame"

        def arm_repeat(self, frame, sets=False):
            return False

    r = RepeatRoute()
    r.offer(ANSWER, engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=1, body=b"hb-9"))
    r.arm(False, Refusing())
    assert r.armed is None and r.norepeat == b"hb-9"


def check(conn):
    """The RepeatRoute invariants that can be seen from outside, after a read."""
    r, d = conn.route, conn.decoder
    assert (r.body is None) == (r.hb is None)
    if r.body is not None:
        assert r.hb == engine.decode_heartbeat(r.body)
    assert r.candidate is None  # never outlives its read
    if r.armed is not None:
        assert d.repeating
        assert d.repeat_command(12345).opaque == 12345 and d.repeat_command(12345).body == d.repeat_body
        assert r.armed.token[0] is not None
    assert conn.repeat is r.armed and conn.hb_body is r.body  # the Connection's views


def test_the_invariants_hold_along_a_connections_life(make_broker):  # noqa: F811
    broker = make_broker()
    a, b = connect(broker, 40001), connect(broker, 40002)
    one, two = body(group="g_r"), body(group="g_s")
    armed = []
    for step, data in enumerate([one, one, one, one, one, two, two]):
        beat(a, [3 * step, 3 * step + 1, 3 * step + 2], data)
        check(a)
        armed.append(a.route.armed is not None)
        if step == 2:  # another member flips g_r's subscription table: a's token no longer holds
            beat(b, [1], other_topic("10.0.0.2@1#1", "g_r"))
            check(b)
            assert a.route.armed.answer(a, 99) is None
    # re-armed by the full path in the read after the flip
    assert armed[:5] == [True] * 5
    assert a.route.body == two and a.route.hb == engine.decode_heartbeat(two)
    # a body without subVersion is decoded every time and never armed
    c = connect(broker, 40003)
    nosub = body(client="10.0.0.3@1#1").replace(b'"subVersion":1718000000001,', b"")
    assert b"subVersion" not in nosub
    for step in range(3):
        beat(c, [step], nosub)
        check(c)
        assert c.route.armed is None and c.route.norepeat == nosub and c.route.body is None


def test_no_route_where_the_server_runs_none(make_broker):  # noqa: F811
    broker = make_broker()
    broker.server.repeats = False
    a = connect(broker)
    for step in range(3):
        beat(a, [step], body())
        check(a)
    assert a.route.armed is None and a.route.body == body()  # the decode is still cached


# ---------------------------------------------------------------------------------------------------------------
# A oneway heartbeat is never answered, also when repeated (the route was armed by a oneway heartbeat and answered
# its later repeats from the template), in any order with answered heartbeats of the same body: both protocols

@pytest.fixture(params=["native", "twin"])
def conn_class(request):  # noqa: F811 (pytest's request)
    from test_protocol_parity import native_class
    return native_class() if request.param == "native" else server_mod.PyConnection


def _connect_with(broker, cls, port=40001):
    broker.server.connection_class = cls
    conn = broker.server.new_connection("main")
    assert type(conn) is cls
    t = FakeTransport()
    t.get_extra_info = lambda name: ("127.0.0.1", port)
    conn.connection_made(t)
    return conn


def _answers(conn):
    """(opaque, code) of every response written on ``conn``."""
    frames = [engine.decode_frame(f) for chunk in conn.transport.chunks for f in split_frames(chunk)]
    return [(f.opaque, f.code) for f in frames if f.is_response]


@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
@pytest.mark.parametrize("per_read", [1, 5])
def test_repeated_oneway_heartbeats_are_never_answered(make_broker, conn_class, serialize_type, per_read):  # noqa: F811
    broker = make_broker()
    broker.server.repeats = True
    conn = _connect_with(broker, conn_class)
    frames = [request(o, body(), serialize_type, flag=FLAG_ONEWAY) for o in range(1, 6)]
    for i in range(0, 5, per_read):
        conn.data_received(b"".join(frames[i:i + per_read]))
        check(conn)
        assert conn.route.armed is None and not conn.decoder.repeating  # nothing to answer: nothing armed
    assert _answers(conn) == []
    assert not conn.closing and broker.metrics.heartbeats == 5
    assert broker.registry.channel_groups(conn)  # the heartbeats were applied all the same


ONEWAY_STEP = st.tuples(st.booleans(), st.sampled_from(["JSON", "ROCKETMQ"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(ONEWAY_STEP, min_size=1, max_size=16),
       cuts=st.lists(st.integers(0, 16), max_size=6))
def test_oneway_and_answered_heartbeats_in_any_order(make_broker, conn_class, steps, cuts):  # noqa: F811
    """The same heartbeat body, oneway or not, JSON or ROCKETMQ, in any order, in reads of any number of frames:
    exactly the requests that are not oneway are answered (SUCCESS, in order); the route arms only on them."""
    broker = make_broker()
    broker.server.repeats = True
    conn = _connect_with(broker, conn_class)
    frames = [request(o, body(), st_, flag=FLAG_ONEWAY if oneway else 0) for o, (oneway, st_) in enumerate(steps)]
    points = sorted({c % (len(frames) + 1) for c in cuts} | {0, len(frames)})
    for a, z in zip(points, points[1:]):
        conn.data_received(b"".join(frames[a:z]))
        check(conn)
        if conn.decoder.repeating:
            assert not conn.decoder.repeat_command(0).is_oneway
    assert _answers(conn) == [(o, ResponseCode.SUCCESS) for o, (oneway, _) in enumerate(steps) if not oneway]
    assert not conn.closing and broker.metrics.heartbeats == len(steps)

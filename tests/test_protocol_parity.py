"""The native connection protocol (engine.broker._protocol, ``NativeConnection``) against its twin
(``PyConnection``): the same byte streams, split at any points, give the same writes, the same registry state, the
same metrics and the same closes.

Both protocols are driven through the same broker code (processors, executors, registry), one broker each. The
requests are what clients send on the paths the native protocol serves itself (heartbeats: producers, consumers,
the other HashSet orders of a Java client, a newer subVersion, a subscription without subVersion, a body that
does not decode, oneway, the ROCKETMQ header) and the ones it hands to the Python processors (UNREGISTER_CLIENT,
GET_CONSUMER_LIST_BY_GROUP, an unknown code, a stray response, a bad frame that closes the connection).
Under ENGINE_NO_EXTENSIONS=1 the native protocol is still compared (over the twin codec) when it is built.
"""
import asyncio
import importlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from conftest import require_native
from engine import loadgen
from engine.broker.config import BrokerConfig
from engine.broker.controller import Broker
from engine.broker import server as server_mod
from engine.codec.enums import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode

from test_server_fastpath import FakeTransport, body, split_frames


def native_class():
    """NativeConnection, also under ENGINE_NO_EXTENSIONS=1 (built from the module itself)."""
    if server_mod.NativeConnection is not None:
        return server_mod.NativeConnection
    require_native("engine.broker._protocol")
    try:
        core = importlib.import_module("engine.broker._protocol").ProtocolCore
    except ImportError:
        if os.environ.get("CI") == "true" or os.environ.get("ENGINE_REQUIRE_NATIVE"):
            pytest.fail("engine.broker._protocol is not built")
        pytest.skip("engine.broker._protocol is not built")

    class NativeConnection(core, server_mod.ConnectionMethods):
        __slots__ = ()

    return NativeConnection


FLEET = loadgen.make_fleet(4, 0, 2, 0.5)  # two consumers (one group each), two producers


def _frame(code, opaque, *, ext=None, body=b"", flag=0, serialize_type="JSON"):
    return engine.RemotingCommand(code, opaque=opaque, flag=flag, ext_fields=ext, body=body,
                                  serialize_type=serialize_type).encode()


def _variants(client):
    return [engine.decode_frame(f).body for f in client.heartbeat_variants(loadgen.OPAQUE_BASE)]


VARIANTS = [_variants(c) for c in FLEET]


def request(step, opaque):
    kind, who, which = step
    client = FLEET[who]
    bodies = VARIANTS[who]
    if kind == "hb":
        return _frame(RequestCode.HEART_BEAT, opaque, ext={}, body=bodies[which % len(bodies)])
    if kind == "hb_rocketmq":
        return _frame(RequestCode.HEART_BEAT, opaque, body=bodies[which % len(bodies)], serialize_type="ROCKETMQ")
    if kind == "hb_oneway":
        return _frame(RequestCode.HEART_BEAT, opaque, body=bodies[which % len(bodies)], flag=FLAG_ONEWAY)
    if kind == "hb_subversion":
        new = b'"subVersion":%d' % (client.sub_version + 1 + which)
        return _frame(RequestCode.HEART_BEAT, opaque, body=bodies[0].replace(
            b'"subVersion":%d' % client.sub_version, new))
    if kind == "hb_nosubversion":
        return _frame(RequestCode.HEART_BEAT, opaque, body=body(client.client_id, f"g_nosub_{which % 2}").replace(
            b'"subVersion":1718000000001,', b""))
    if kind == "hb_v2":
        return _frame(RequestCode.HEART_BEAT, opaque, body=body(client.client_id, "g_v2", fingerprint=which + 1))
    if kind == "hb_bad":
        return _frame(RequestCode.HEART_BEAT, opaque, body=b'{"clientID":' + b"x" * which)
    if kind == "hb_response":
        return _frame(RequestCode.HEART_BEAT, opaque, body=bodies[0], flag=FLAG_RESPONSE)
    if kind == "unregister":
        group = (client.consumer_table[0][0] if client.consumer_table else client.producer_table[0])
        key = "consumerGroup" if client.consumer_table else "producerGroup"
        return _frame(RequestCode.UNREGISTER_CLIENT, opaque, ext={"clientID": client.client_id, key: group})
    if kind == "consumer_list":
        return _frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP, opaque, ext={"consumerGroup": f"CID_load_{which % 2}"})
    if kind == "unknown":
        return _frame(9999, opaque)
    raise AssertionError(kind)


KINDS = ["hb"] * 6 + ["hb_rocketmq", "hb_oneway", "hb_oneway", "hb_subversion", "hb_nosubversion", "hb_v2", "hb_bad",
                      "hb_response", "unregister", "consumer_list", "unknown"]
STEP = st.tuples(st.sampled_from(KINDS), st.integers(0, len(FLEET) - 1), st.integers(0, 3))
#: one connection's requests as a few distinct steps each sent many times: the route arms on the second identical
#: heartbeat (read apart) and answers from the third on, which STEP lists seldom reach; this is what has repeats meet
#: every other kind
REPEATING_STEPS = st.tuples(st.lists(STEP, min_size=1, max_size=3),
                            st.lists(st.integers(0, 2), min_size=1, max_size=24)).map(
    lambda pool_seq: [pool_seq[0][i % len(pool_seq[0])] for i in pool_seq[1]])


def make_broker(tmp_path, name, cls, rules):
    loop = asyncio.new_event_loop()
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=str(tmp_path / name), client_management_rules=rules))
    b.loop = b.server.loop = loop
    b.server.connection_class = cls
    return b


def connect(broker, port):
    conn = broker.server.new_connection("main")
    t = FakeTransport()
    t.get_extra_info = lambda name: ("127.0.0.1", port)
    conn.connection_made(t)
    return conn


def drain(broker):
    """Run the loop until the executors' queues are empty (their answers written)."""
    loop = broker.loop
    for _ in range(100):
        if not any(len(ex) for ex in broker.server.executors.values()):
            break
        loop.run_until_complete(asyncio.sleep(0))


def state(broker, conns):
    reg, m = broker.registry, broker.metrics
    groups = reg.groups()
    return {
        "writes": [c.transport.chunks for c in conns],
        "closed": [(c.closing, c.close_reason) for c in conns],
        "serialize": [c.serialize_type for c in conns],
        "armed": [(c.route.armed is not None, c.decoder.repeating) for c in conns],
        "groups": groups,
        "consumers": {g: list(reg.consumer_ids(g)) for g in groups},
        "producers": {g: sorted(i.client_id for i in reg.producer_channels(g)) for g in groups},
        "fingerprints": {g: reg.fingerprint(g) for g in groups},
        "channel_groups": [reg.channel_groups(c) for c in conns],
        "metrics": (dict(m.requests), m.heartbeats, m.heartbeat_errors, m.frame_errors,
                    dict(m.request_errors), dict(m.connections_closed)),
    }


def run(tmp_path, name, cls, rules, streams, cuts, repeats, flush=None):
    b = make_broker(tmp_path, name, cls, rules)
    b.server.repeats = repeats
    if flush is not None:
        b.server.out_flush_bytes = flush
    try:
        conns = [connect(b, 40001 + i) for i in range(len(streams))]
        assert all(type(c) is cls for c in conns)
        pieces = []
        for i, data in enumerate(streams):
            points = sorted({p % (len(data) + 1) for p in cuts[i]} | {0, len(data)})
            pieces.append([data[a:z] for a, z in zip(points, points[1:])])
        k = 0
        while any(pieces):  # the connections' reads interleaved
            i = k % len(pieces)
            k += 1
            if pieces[i]:
                conns[i].data_received(pieces[i].pop(0))
                drain(b)
        return state(b, conns)
    finally:
        b.loop.close()


@settings(max_examples=int(os.environ.get("PARITY_EXAMPLES", 80)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.one_of(st.lists(STEP, min_size=1, max_size=14), REPEATING_STEPS), min_size=1,
                     max_size=3),
       cuts=st.lists(st.lists(st.integers(0, 1 << 16), max_size=8), min_size=3, max_size=3),
       rules=st.sampled_from([4, 5]), repeats=st.booleans(), garbage=st.booleans(),
       flush=st.sampled_from([None, 1, 300]))
def test_native_and_twin_protocols_agree_on_any_split(tmp_path_factory, steps, cuts, rules, repeats, garbage,
                                                      flush):
    """``flush``: RemotingServer.out_flush_bytes (None: the default), small enough for the consumer lists' and
    unregisters' answers to flush a read's write early."""
    native = native_class()
    streams = []
    for n, conn_steps in enumerate(steps):
        data = b"".join(request(s, 100 * n + j) for j, s in enumerate(conn_steps))
        if garbage and n == 0:
            data += b"\x00\x00\x00\x08\x07\x00\x00\x00junk"  # a header word naming an unknown serialize type
        streams.append(data)
    tmp = tmp_path_factory.mktemp("parity")
    got = run(tmp, "native", native, rules, streams, cuts, repeats, flush)
    want = run(tmp, "twin", server_mod.PyConnection, rules, streams, cuts, repeats, flush)
    assert got == want
    # a oneway request is never answered (a property of both, which their agreement alone does not show)
    for n, (conn_steps, chunks) in enumerate(zip(steps, got["writes"])):
        oneway = {100 * n + j for j, s in enumerate(conn_steps) if s[0] == "hb_oneway"}
        answered = {f.opaque for c in chunks for f in map(engine.decode_frame, split_frames(c)) if f.is_response}
        assert not oneway & answered


def test_repeated_and_varied_heartbeats_one_per_read(tmp_path):
    """The loadgen --vary shape: every client's heartbeat in its other orders, one per read, many rounds: the
    repeat route and the full path alike in both."""
    native = native_class()
    out = []
    for name, cls in (("native", native), ("twin", server_mod.PyConnection)):
        b = make_broker(tmp_path, name, cls, 5)
        b.server.repeats = True
        conns = [connect(b, 40001 + i) for i in range(len(FLEET))]
        for r in range(12):
            for i, c in enumerate(conns):
                c.data_received(request(("hb", i, r), r))
        out.append(state(b, conns))
        assert b.metrics.heartbeats == 12 * len(FLEET)
        b.loop.close()
    assert out[0] == out[1]
    for chunks in out[0]["writes"]:  # one write per read, holding its answer (NOTIFYs of a group join apart)
        with_answer = [[engine.decode_frame(f) for f in split_frames(c)] for c in chunks]
        answers = [[x for x in frames if x.is_response] for frames in with_answer]
        answers = [a for a in answers if a]
        assert [[x.opaque for x in a] for a in answers] == [[r] for r in range(12)]
        assert all(a[0].code == 0 for a in answers)


def test_a_failure_in_the_repeat_route_closes_only_that_connection_once(tmp_path, monkeypatch):
    """An unexpected error on the native path (here: the registry's repeat check) answers what was answered,
    closes that connection with one reason and leaves the other connection served."""
    native = native_class()
    b = make_broker(tmp_path, "native", native, 5)
    b.server.repeats = True
    a, other = connect(b, 40001), connect(b, 40002)
    for opaque in (1, 2):
        a.data_received(request(("hb", 0, 0), opaque))
        other.data_received(request(("hb", 1, 0), opaque))
    assert a.route.armed is not None

    def boom(token):
        raise RuntimeError("bug")

    monkeypatch.setattr(b.registry, "heartbeat_repeat", boom)
    before = len(a.transport.chunks)
    a.data_received(request(("hb", 0, 0), 3))
    assert a.closing and a.close_reason == "internal error while dispatching requests"
    assert b.metrics.internal_errors["dispatch_failed"] == 1
    assert len(a.transport.chunks) == before  # nothing of the failed read went out
    monkeypatch.undo()
    other.data_received(request(("hb", 1, 0), 3))
    assert not other.closing and engine.decode_frame(other.transport.chunks[-1]).opaque == 3
    b.loop.close()

"""body_digest and repeats armed with sets=True: a Java client's heartbeat whose sets come in another HashSet order
is the same registration (vectors/README.md), so the repeat route answers it as a repeat instead of decoding it.

What a user relies on: the same registration in any set order has one digest (native and twin alike); anything the
rules could read differently (another value, a duplicate group or topic whose order decides which one wins, an
escape the decoder would resolve) never shares a digest with it; and the broker answers a reordered heartbeat
exactly as the full path does.
"""
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.codec._frame_py import MAX_DIGEST_DEPTH
from engine.codec.enums import RequestCode, ResponseCode

from test_repeat import beat, connect, make_broker, request  # noqa: F401 (make_broker is a fixture)

JAVA = "/work/shared/vectors/java-rocketmq-4.9.8"


def java_body(consumers=(("g1", (("T1", 1, ["a", "b"]), ("T2", 2, []))),), producers=("CLIENT_INNER_PRODUCER",)):
    return {
        "clientID": "10.0.0.1@1#1",
        "consumerDataSet": [
            {"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY", "groupName": g,
             "messageModel": "CLUSTERING", "unitMode": False,
             "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [hash(t) & 0xFFFF for t in tags],
                                      "expressionType": "TAG", "subString": " || ".join(tags) or "*",
                                      "subVersion": v, "tagsSet": list(tags), "topic": topic}
                                     for topic, v, tags in subs]}
            for g, subs in consumers],
        "producerDataSet": [{"groupName": p} for p in producers],
    }


def dumps(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def shuffled(value, rnd):
    """``value`` with every array in another order (the same registration as Java sends it after a HashSet
    rebuild)."""
    if isinstance(value, dict):
        return {k: shuffled(v, rnd) for k, v in value.items()}
    if isinstance(value, list):
        items = [shuffled(v, rnd) for v in value]
        rnd.shuffle(items)
        return items
    return value


# ------------------------------------------------------------------------------------------------ the digest


def test_the_same_registration_in_any_set_order_has_one_digest(impl):
    hb = java_body(consumers=(("g1", (("T1", 1, ["a", "b", "c"]), ("T2", 2, []), ("T3", 3, ["x"]))),
                              ("g2", (("T1", 4, ["q"]),))),
                   producers=("CLIENT_INNER_PRODUCER", "p1", "p2"))
    base = impl.frame.body_digest(dumps(hb))
    assert base is not None
    rnd = random.Random(7)
    orders = {dumps(shuffled(hb, rnd)) for _ in range(50)}
    assert len(orders) > 10  # really other bytes
    assert {impl.frame.body_digest(b) for b in orders} == {base}


@pytest.mark.parametrize("change", [
    lambda hb: hb["consumerDataSet"][0]["subscriptionDataSet"][0].update(subVersion=5),   # a re-subscription
    lambda hb: hb["consumerDataSet"][0]["subscriptionDataSet"][0]["tagsSet"].append("c"),
    lambda hb: hb["consumerDataSet"][0].update(consumeType="CONSUME_ACTIVELY"),
    lambda hb: hb["producerDataSet"].append({"groupName": "p9"}),
    lambda hb: hb["producerDataSet"].clear(),
    lambda hb: hb.update(clientID="10.0.0.1@1#2"),
    lambda hb: hb["consumerDataSet"][0].update(unitMode=None),
    lambda hb: hb["consumerDataSet"][0]["subscriptionDataSet"].pop(),
])
def test_another_registration_has_another_digest(impl, change):
    hb = java_body()
    before = impl.frame.body_digest(dumps(hb))
    change(hb)
    assert impl.frame.body_digest(dumps(hb)) not in (None, before)


def test_a_duplicate_group_or_topic_keeps_its_order(impl):
    """Two consumers of one group (or two subscriptions of one topic): which one wins depends on their order, so
    the set is digested in order: the other order is another digest."""
    c1 = {"groupName": "g", "consumeType": "CONSUME_ACTIVELY"}
    c2 = {"groupName": "g", "consumeType": "CONSUME_PASSIVELY"}
    a = impl.frame.body_digest(dumps({"consumerDataSet": [c1, c2]}))
    b = impl.frame.body_digest(dumps({"consumerDataSet": [c2, c1]}))
    assert None not in (a, b) and a != b
    s1, s2 = {"topic": "T", "subVersion": 1}, {"topic": "T", "subVersion": 2}
    assert (impl.frame.body_digest(dumps({"subscriptionDataSet": [s1, s2]}))
            != impl.frame.body_digest(dumps({"subscriptionDataSet": [s2, s1]})))
    # distinct groups: one set in either order
    c3 = {"groupName": "h", "consumeType": "CONSUME_PASSIVELY"}
    assert (impl.frame.body_digest(dumps({"consumerDataSet": [c1, c3]}))
            == impl.frame.body_digest(dumps({"consumerDataSet": [c3, c1]})))


@pytest.mark.parametrize("raw", [
    b'{"clientID":"a\\u0041"}',                 # an escape: the decoder would resolve it, the digest does not
    b'{"clientID":"a\x01"}',                   # a control byte inside a string
    b'{"groupName":"a","topic":"b"}',          # two key members
    b'{"groupName":"a","groupName":"b"}',
    b'{"a":1} x',                              # trailing bytes
    b'{"a":}', b'{"a" 1}', b'{"a":1,}', b'[1,]', b'{,}', b'', b'   ', b'"open', b'{"a":[1,2}', b'{1:2}',
    b'{"a":"\xff"',
    b"[" * 33 + b"]" * 33,                     # past MAX_DIGEST_DEPTH
])
def test_what_is_not_digested(impl, raw):
    assert impl.frame.body_digest(raw) is None


def test_the_depth_limit_and_spaces(impl):
    limit = MAX_DIGEST_DEPTH
    assert impl.frame.body_digest(b"[" * limit + b"]" * limit) is not None
    # spaces between tokens are not part of the value (the C++ client ends its body with a newline)
    assert impl.frame.body_digest(b' { "a" : [ 1 , 2 ] }\n') == impl.frame.body_digest(b'{"a":[2,1]}')
    # but inside a string they are
    assert impl.frame.body_digest(b'{"a":"x y"}') != impl.frame.body_digest(b'{"a":"xy"}')


def test_real_java_heartbeats_in_another_order_share_a_digest(impl):
    """The captured Java 4.9.8 producer's heartbeats 0056 and 0208: the same registration, its producer set in
    another order; and the consumer's heartbeats whose subVersion changed during start-up do not share one."""
    def heartbeat_body(name):
        raw = open(f"{JAVA}/{name}_34.bin", "rb").read()
        return impl.frame.decode_frame(raw).body

    a, b = heartbeat_body("0056"), heartbeat_body("0208")
    assert a != b and impl.frame.body_digest(a) == impl.frame.body_digest(b) is not None
    digests = [impl.frame.body_digest(heartbeat_body(n)) for n in ("0007", "0020", "0042")]
    assert None not in digests and len(set(digests)) == 3


# JSON-ish values: keys that are key members or not, strings with and without escapes / control bytes
_KEYS = st.sampled_from(["groupName", "topic", "a", "subVersion", "tagsSet"])
_LEAVES = st.one_of(st.integers(-10, 10), st.booleans(), st.none(), st.sampled_from(["x", "y", "g", "T", ""]),
                    st.text(max_size=3))
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=3),
                       max_leaves=20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_VALUES, st.randoms(use_true_random=False))
def test_native_and_twin_agree_and_a_reorder_never_changes_a_digest(pair, value, rnd):
    native, twin = pair
    raw = json.dumps(value, separators=(",", ":")).encode()
    d = native.frame.body_digest(raw)
    assert d == twin.frame.body_digest(raw)
    other = json.dumps(shuffled(value, rnd), separators=(",", ":")).encode()
    o = native.frame.body_digest(other)
    assert o == twin.frame.body_digest(other)
    if d is not None and o is not None:
        # another order: the same digest exactly where every reordered array had distinct keys
        assert (o == d) == _sets_only(value, json.loads(other))


def _canonical(v):
    """An exact form of the digest's rule (no hashing): objects in order, arrays as sorted sets where their
    elements' keys (an object's groupName / topic value, else the element) are distinct, else in order."""
    if isinstance(v, dict):
        return ("d", tuple((k, _canonical(x)) for k, x in v.items()))
    if isinstance(v, list):
        items = [_canonical(x) for x in v]
        keys = [_canonical(x[m]) if isinstance(x, dict) and (m := next((k for k in ("groupName", "topic") if k in x),
                                                                         None)) else c for x, c in zip(v, items)]
        if len(set(keys)) == len(keys):
            return ("s", tuple(sorted(items, key=repr)))
        return ("l", tuple(items))
    return json.dumps(v)


def _sets_only(a, b) -> bool:
    """Whether b equals a but for the order of arrays whose elements have distinct keys (the digest's rule)."""
    return _canonical(a) == _canonical(b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=64))
def test_native_and_twin_agree_on_any_bytes(pair, raw):
    native, twin = pair
    assert native.frame.body_digest(raw) == twin.frame.body_digest(raw)


# ------------------------------------------------------------------------------------------------ the decoder


@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
def test_a_decoder_armed_with_sets_takes_a_reordered_body_as_a_repeat(impl, serialize_type):
    hb = java_body(consumers=(("g1", (("T1", 1, ["a", "b"]), ("T2", 2, []))), ("g2", (("T3", 3, []),))))
    first, rnd = dumps(hb), random.Random(3)
    reordered = next(b for b in (dumps(shuffled(hb, rnd)) for _ in range(100)) if b != first)
    changed = dumps(dict(hb, clientID="10.0.0.1@1#9"))
    assert len(changed) == len(first)
    for sets in (True, False):
        d = impl.frame.FrameDecoder()
        assert d.arm_repeat(request(1, first, serialize_type), sets=sets)
        out = d.feed(request(2, reordered, serialize_type) + request(3, first, serialize_type)
                     + request(4, changed, serialize_type))
        assert out[1] == 3 and out[2].body == changed  # equal bytes: a repeat; another registration: in full
        if sets:
            assert out[0] == 2
            assert d.repeat_command(2).body == first  # the repeat stands for the armed request
        else:
            assert out[0].body == reordered


def test_a_body_without_a_digest_repeats_only_as_equal_bytes(impl):
    first = b'{"clientID":"a\\u0041","producerDataSet":[{"groupName":"p1"},{"groupName":"p2"}]}'
    other = b'{"clientID":"a\\u0041","producerDataSet":[{"groupName":"p2"},{"groupName":"p1"}]}'
    d = impl.frame.FrameDecoder()
    assert d.arm_repeat(request(1, first), sets=True)
    out = d.feed(request(2, other) + request(3, first))
    assert out[0].body == other and out[1] == 3


# ------------------------------------------------------------------------------------------------ the broker


def test_the_broker_answers_a_reordered_heartbeat_as_the_full_path_does(make_broker, monkeypatch):
    fast, full = make_broker(), make_broker()
    full.server.repeats = False
    a, b = connect(fast), connect(full)
    hb = java_body(consumers=(("g_fast", (("T1", 1, ["a", "b"]), ("T2", 2, []))),),
                   producers=("CLIENT_INNER_PRODUCER", "p1"))
    rnd = random.Random(11)
    bodies = [dumps(hb)] + [dumps(shuffled(hb, rnd)) for _ in range(12)]
    assert len(set(bodies)) > 3
    # the first heartbeat registers, the second (in another order) arms the route
    assert beat(a, [1], bodies[0]) == beat(b, [1], bodies[0])
    assert beat(a, [2], bodies[1]) == beat(b, [2], bodies[1])
    assert a.decoder.repeating
    served = []
    real = fast.registry.heartbeat
    monkeypatch.setattr(fast.registry, "heartbeat", lambda *x, **k: (served.append(1), real(*x, **k))[1])
    for i, data in enumerate(bodies[2:], start=3):
        answers = beat(a, [i], data)
        assert answers == beat(b, [i], data)
        assert engine.decode_frame(answers[0]).code == ResponseCode.SUCCESS
    # every heartbeat after the arming was a repeat, whatever its order (no rules run)
    assert served == [] and a.decoder.repeating
    assert fast.metrics.heartbeats == full.metrics.heartbeats == len(bodies)
    assert fast.registry.consumer_ids("g_fast") == full.registry.consumer_ids("g_fast")
    sub = fast.registry.consumer_group_info("g_fast").subscription_table
    assert set(sub) == set(full.registry.consumer_group_info("g_fast").subscription_table) == {"T1", "T2"}
    # a real change in the same length still reaches the rules
    changed = dumps(shuffled(java_body(consumers=(("g_fast", (("T1", 3, ["a", "b"]), ("T2", 2, []))),),
                                       producers=("CLIENT_INNER_PRODUCER", "p1")), rnd))
    assert len(changed) == len(bodies[0])
    beat(a, [99], changed)
    assert served == [1]
    assert fast.registry.consumer_group_info("g_fast").subscription_table["T1"].sub_version == 3
    assert RequestCode.HEART_BEAT in fast.metrics.requests


@pytest.mark.parametrize("body", [5, "text", None])
def test_a_body_that_is_not_bytes_is_a_type_error(impl, body):
    with pytest.raises(TypeError):
        impl.frame.body_digest(body)
    assert impl.frame.body_digest(bytearray(b"[1]")) == impl.frame.body_digest(memoryview(b"[1]"))


def test_the_element_budget(impl):
    from engine.codec._frame_py import MAX_DIGEST_ELEMENTS as limit

    assert impl.frame.body_digest(b"[" + b",".join([b"1"] * limit) + b"]") is not None
    assert impl.frame.body_digest(b"[" + b",".join([b"1"] * (limit + 1)) + b"]") is None
    # the elements of the arrays open at one point count together; closed ones give theirs back
    half = b"[" + b",".join([b"1"] * (limit // 2)) + b"]"
    assert impl.frame.body_digest(b"[" + b",".join([half] * 3) + b"]") is not None
    inner = b"[" + b",".join([b"2"] * (limit // 2 + 1)) + b"]"
    assert impl.frame.body_digest(b"[" + b",".join([b"1"] * (limit // 2)) + b"," + inner + b"]") is None

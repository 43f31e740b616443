"""The element budget of one heartbeat body (maxHeartbeatElements, decode_heartbeat's max_elements): tags, codes,
subscriptions, consumers and producers the decoder builds are counted, every occurrence of a repeated key too; past
the budget both builds refuse the body with the same HeartbeatError (the first element over it, its path and
offset), so what a body decodes to is bounded by its size plus ELEMENT_OVERHEAD_BYTES per element. Over a real
connection a heartbeat past maxHeartbeatElements is a bad heartbeat: SYSTEM_ERROR, not registered, counted."""
import json
import re
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import HeartbeatError
from engine.codec import _heartbeat_py as twin
from engine.codec.enums import RequestCode, ResponseCode

from test_heartbeat_parity import (MODULES, SEEDS, SETTINGS, dialect_bodies, masked, mutated, native, needs_native,
                                   now_ms)
from test_server import Client, broker_factory, consumer_ids, hb_body, wait_until  # noqa: F401  (fixtures)

TOO_MANY = "elements (tags, codes, subscriptions, groups)"


def elements(hb) -> int:
    """What the budget counts in a decoded heartbeat without repeated keys."""
    n = len(hb.producers) + len(hb.consumers)
    for cd in hb.consumers:
        n += len(cd.subscriptions) + sum(len(sd.tags) + len(sd.codes) for sd in cd.subscriptions)
    return n


def outcome(module, body, max_elements):
    t0 = now_ms()
    try:
        hb = module.decode_heartbeat(body, max_elements)
    except HeartbeatError as e:
        return ("error", str(e))
    return ("ok", masked(hb.to_dict(), t0, now_ms()))


def assert_parity(body, max_elements):
    results = [outcome(m, body, max_elements) for m in MODULES]
    assert all(r == results[0] for r in results), (body, max_elements, results)
    return results[0]


# ---------------------------------------------------------------------------------------------------------------
# The count, on both builds


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_real_bodies_decode_at_their_count_and_are_refused_one_below(module):
    for body in SEEDS:
        count = elements(module.decode_heartbeat(body))
        assert module.decode_heartbeat(body, max(count, 1)) == module.decode_heartbeat(body)
        if count > 1:
            with pytest.raises(HeartbeatError, match=re.escape(f"more than {count - 1} {TOO_MANY} at byte ")):
                module.decode_heartbeat(body, count - 1)
    # the real clients' heartbeats are far below the default
    assert max(elements(module.decode_heartbeat(b)) for b in SEEDS) < twin.DEFAULT_MAX_ELEMENTS // 1000


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_kind_counts_and_repeated_keys_count_every_occurrence(module):
    sub = {"topic": "t", "tagsSet": ["a", "b"], "codeSet": [97, 98], "subVersion": 1}
    body = json.dumps({"producerDataSet": [{"groupName": "p"}], "consumerDataSet": [
        {"groupName": "g", "subscriptionDataSet": [sub, {}]}]}).encode()
    # 1 producer + 1 consumer + 2 subscriptions + 2 tags + 2 codes
    assert elements(module.decode_heartbeat(body, 8)) == 8
    with pytest.raises(HeartbeatError) as e:
        module.decode_heartbeat(body, 7)
    assert str(e.value).startswith("$.consumerDataSet[0].subscriptionDataSet[1]: more than 7 elements")
    # a repeated tagsSet keeps the last, but the decoder built both: both count
    repeated = b'{"consumerDataSet":[{"subscriptionDataSet":[{"tagsSet":["a","b","c"],"tagsSet":["d"]}]}]}'
    assert module.decode_heartbeat(repeated, 6).consumers[0].subscriptions[0].tags == ("d",)
    with pytest.raises(HeartbeatError, match=r"tagsSet\[0\]: more than 5 elements"):
        module.decode_heartbeat(repeated, 5)
    # values of unknown keys are skipped, not built: not counted
    unknown = b'{"x":[1,2,3,4,5,6,7,8,9],"producerDataSet":[{"groupName":"p","y":[{},{},{}]}]}'
    assert len(module.decode_heartbeat(unknown, 1).producers) == 1


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_max_elements_argument(module):
    body = hb_body()
    for bad, exc in ((0, ValueError), (-5, ValueError), ("9", TypeError), (1.5, TypeError), (None, TypeError)):
        with pytest.raises(exc):
            module.decode_heartbeat(body, bad)
        with pytest.raises(exc):
            module.decode_heartbeats([body], bad)
    assert module.decode_heartbeat(body, 1 << 80) == module.decode_heartbeat(body)


# ---------------------------------------------------------------------------------------------------------------
# Parity: native and twin refuse at the same element with the same message


@needs_native
@SETTINGS
@given(case=dialect_bodies(), data=st.data())
def test_parity_at_and_around_the_budget_on_generated_dialects(case, data):
    hb, body = case
    count = elements(hb)
    assert assert_parity(body, max(count, 1))[0] == "ok"
    if count > 1:
        below = data.draw(st.integers(1, count - 1))
        result = assert_parity(body, below)
        assert result[0] == "error" and f"more than {below} {TOO_MANY}" in result[1]


@needs_native
@SETTINGS
@given(body=mutated(), max_elements=st.integers(1, 40))
def test_parity_with_small_budgets_on_mutated_bodies(body, max_elements):
    assert_parity(body, max_elements)


@needs_native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(mutated() | st.sampled_from(SEEDS), max_size=8), max_elements=st.integers(1, 12))
def test_batch_error_column_parity_with_a_budget(bodies, max_elements):
    a, b = native.decode_heartbeats(bodies, max_elements), twin.decode_heartbeats(bodies, max_elements)
    assert a.heartbeats["error"].tolist() == b.heartbeats["error"].tolist()
    assert a.heartbeats["ok"].tolist() == b.heartbeats["ok"].tolist()
    for i, body in enumerate(bodies):
        expected = outcome(native, body, max_elements)
        assert a.heartbeats["error"][i] == (expected[1] if expected[0] == "error" else None)


# ---------------------------------------------------------------------------------------------------------------
# The bound: a body at the budget decodes within its size plus ELEMENT_OVERHEAD_BYTES per element (scaled down to a
# budget of 4,096: the bound is per element)

BUDGET = 4096


def _at_budget_bodies(n):
    """Bodies of exactly n elements, each the worst kind for overhead per body byte, or one near 16 MiB."""
    names = (format(i, "x") for i in range(10 * n))
    subs = [{"topic": next(names), "subString": next(names), "expressionType": next(names)} for _ in range(n - 1)]
    yield "subscriptions of three distinct one-character strings", {"consumerDataSet": [{"subscriptionDataSet": subs}]}
    yield "empty subscriptions", {"consumerDataSet": [{"subscriptionDataSet": [{}] * (n - 1)}]}
    yield "empty producers", {"producerDataSet": [{}] * n}
    yield "consumers with distinct groups", {"consumerDataSet": [{"groupName": f"g{i}"} for i in range(n)]}
    codes = list(range(10**9, 10**9 + n - 2))
    yield "distinct codes", {"consumerDataSet": [{"subscriptionDataSet": [{"codeSet": codes}]}]}
    # a body near the 16 MiB frame limit: n distinct tags of 4 KiB each
    tags = [f"{i:08x}" + "t" * 4000 for i in range(n - 2)]
    yield "distinct 4 KiB tags (a ~16 MiB body)", {"consumerDataSet": [{"subscriptionDataSet": [{"tagsSet": tags}]}]}


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_a_body_at_the_budget_decodes_within_its_size_plus_the_overhead_per_element(module):
    n = BUDGET
    for label, doc in _at_budget_bodies(n):
        body = json.dumps(doc, separators=(",", ":")).encode()
        hb = module.decode_heartbeat(body, n)
        assert elements(hb) == n, label
        with pytest.raises(HeartbeatError, match=f"more than {n - 1} "):
            module.decode_heartbeat(body, n - 1)
        del hb
        bound = len(body) + n * twin.ELEMENT_OVERHEAD_BYTES
        tracemalloc.start()
        try:
            hb = module.decode_heartbeat(body, n)
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        del hb
        assert held <= bound, (label, len(body), held, bound)
        if module is native:
            # the native decode builds nothing else (the twin's json.loads tree is transient and not bounded so)
            assert peak <= bound, (label, len(body), peak, bound)


def test_the_same_body_past_the_budget_unbounded_before():
    """The attack: a body of many tiny tags decodes to many times its size (the reason for the budget)."""
    n = 4 * BUDGET
    body = json.dumps({"consumerDataSet": [{"subscriptionDataSet": [{}] * n}]}, separators=(",", ":")).encode()
    for module in MODULES:
        with pytest.raises(HeartbeatError, match=re.escape(f"subscriptionDataSet[{BUDGET - 1}]: more than {BUDGET} ")):
            module.decode_heartbeat(body, BUDGET)
        tracemalloc.start()
        try:
            hb = module.decode_heartbeat(body, n + 1)   # what the budget prevents: ~35 times the body
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        del hb
        assert held > 20 * len(body)


# ---------------------------------------------------------------------------------------------------------------
# The broker: maxHeartbeatElements over a real connection


def _big_body(client_id, group, tags):
    doc = json.loads(hb_body(client_id, group))
    doc["consumerDataSet"][0]["subscriptionDataSet"][1]["tagsSet"] = [f"T{i}" for i in range(tags)]
    doc["consumerDataSet"][0]["subscriptionDataSet"][1]["codeSet"] = []
    return json.dumps(doc).encode()


@pytest.mark.parametrize("record", [False, True], ids=["no-recorder", "recorder"])
def test_a_heartbeat_past_max_heartbeat_elements_is_refused_and_not_registered(broker_factory, tmp_path, record):
    # hb_body: 2 producers + 1 consumer + 2 subscriptions + 2 codes; with k tags: 5 + 2 (codes) - 2 + k
    limit = 100
    kw = {"record_dir": str(tmp_path / "rec")} if record else {}
    broker = broker_factory(max_heartbeat_elements=limit, **kw)
    c = Client(broker.ports["main"])
    at = _big_body("10.0.0.9@1#1", "at_limit", limit - 5)          # 2 + 1 + 2 + (limit - 5) tags = limit
    over = _big_body("10.0.0.9@1#2", "over_limit", limit - 4)     # limit + 1
    errors = broker.metrics.heartbeat_errors
    r = c.call(RequestCode.HEART_BEAT, {}, over)
    assert r.code == ResponseCode.SYSTEM_ERROR
    # the producers come last in this body: the second is the element over the budget
    assert r.remark.startswith(f"$.producerDataSet[1]: more than {limit} {TOO_MANY} at byte ")
    assert len(r.remark) < 256 and "Traceback" not in r.remark and "Error" not in r.remark
    assert wait_until(lambda: broker.metrics.heartbeat_errors == errors + 1)
    assert consumer_ids(broker, "over_limit") == []
    r = c.call(RequestCode.HEART_BEAT, {}, at)
    assert r.code == ResponseCode.SUCCESS
    assert consumer_ids(broker, "at_limit") == ["10.0.0.9@1#1"]
    # the same over-limit body again (not served from a cached decode) is refused again
    r = c.call(RequestCode.HEART_BEAT, {}, over)
    assert r.code == ResponseCode.SYSTEM_ERROR and consumer_ids(broker, "over_limit") == []
    c.close()


def test_max_heartbeat_elements_is_a_positive_property():
    from engine.broker.config import BrokerConfig, ConfigError

    assert BrokerConfig().max_heartbeat_elements == twin.DEFAULT_MAX_ELEMENTS
    assert BrokerConfig().apply({"maxHeartbeatElements": "1000"}).validate().max_heartbeat_elements == 1000
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match="maxHeartbeatElements must be > 0"):
            BrokerConfig().apply({"maxHeartbeatElements": bad}).validate()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_strings_mixing_astral_characters_take_at_most_four_bytes_per_body_byte(module):
    """Python keeps such a string in UCS-4: its ASCII characters cost 4 bytes each, the body 1 (README's bound)."""
    n = 256
    tags = [f"\U0001F600{i:08x}" + "a" * 4000 for i in range(n - 2)]
    body = json.dumps({"consumerDataSet": [{"subscriptionDataSet": [{"tagsSet": tags}]}]}, ensure_ascii=False,
                      separators=(",", ":")).encode()
    module.decode_heartbeat(body, n)
    tracemalloc.start()
    try:
        hb = module.decode_heartbeat(body, n)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elements(hb) == n
    assert 3 * len(body) < held <= 4 * len(body) + n * twin.ELEMENT_OVERHEAD_BYTES


def test_acl_decodes_a_heartbeat_within_the_same_property(broker_factory, tmp_path):
    """An account with resource permissions has its heartbeat's body decoded by the ACL check too: within
    maxHeartbeatElements, not the decoder's default (a raised property would otherwise be refused by the ACL)."""
    from engine import RemotingCommand
    from engine.broker.acl import sign_request

    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: rocketmq2\n    secretKey: 12345678\n    admin: false\n"
                   "    defaultTopicPerm: SUB\n    defaultGroupPerm: SUB\n    topicPerms:\n      - TopicTest=SUB\n")
    limit = twin.DEFAULT_MAX_ELEMENTS + 100
    broker = broker_factory(acl_enable=True, acl_file=str(acl), max_heartbeat_elements=limit)
    c = Client(broker.ports["main"])
    for opaque, client_id, group, tags in ((1, "10.0.0.9@1#1", "at_limit", limit - 5),
                                           (2, "10.0.0.9@1#2", "over_limit", limit - 4)):
        cmd = RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, ext_fields={},
                              body=_big_body(client_id, group, tags))
        sign_request(cmd, "rocketmq2", "12345678")
        c.sock.sendall(cmd.encode())
        r = c.read(timeout=20, pred=lambda x, o=opaque: x.is_response and x.opaque == o)
        if opaque == 1:
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert consumer_ids(broker, "at_limit") == [client_id]
        else:  # refused by the ACL check, which cannot know its resources: NO_PERMISSION, as any undecodable body
            assert r.code == ResponseCode.NO_PERMISSION
            assert r.remark.startswith("Cannot read the resources of request code=34: $.producerDataSet[1]: more than")
            assert consumer_ids(broker, "over_limit") == []
    c.close()

"""clientManagementRules=4|5 (issue 18 item 1): the seeds' RocketMQ 4.9.x client-management rules and the 5.x ones,
over the wire where a client can see the difference (PROTOCOL.md 6.3 version table, 6.6.2-6.6.5, 6.11).

A NOTIFY the broker sends because of a request is written in the same loop iteration that answers the request, and
before that answer (the listener runs inside the registry call), so once the answer is read the count of
notifications sent is final: absence is asserted without waiting."""
import json

import pytest

from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig, ConfigError
from engine.codec.enums import RequestCode, ResponseCode
from engine.registry.client_registry import ClientRegistry, ConsumerGroupEvent, ProducerGroupEvent, RegistryConfig
from engine.registry.store import TopicConfig

from test_server import Client, hb_body, make_config, wait_until

NOTIFY = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
V2_ANSWER = {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"}


@pytest.fixture
def start(tmp_path):
    started = []

    def make(rules, **kw):
        b = Broker(make_config(tmp_path / f"b{len(started)}", client_management_rules=rules, **kw)).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def notified(broker) -> int:
    return broker.metrics.notifications_sent


def consumer_list(client, group):
    r = client.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    return sorted(json.loads(r.body)["consumerIdList"]) if r.code == 0 else r.remark


def broadcasting(body: bytes) -> bytes:
    return body.replace(b'"messageModel":"CLUSTERING"', b'"messageModel":"BROADCASTING"')


def test_default_is_the_seeds_4x_rules_and_only_4_or_5():
    assert BrokerConfig().client_management_rules == 4
    assert BrokerConfig.load(None, {"clientManagementRules": "5"}).client_management_rules == 5
    with pytest.raises(ConfigError, match="clientManagementRules must be 4 or 5"):
        BrokerConfig.load(None, {"clientManagementRules": "6"})
    # 4.9 has no rejectPullConsumerEnable: asking for it under 4.x rules is an error, not a silent no-op
    with pytest.raises(ConfigError, match="rejectPullConsumerEnable .* needs clientManagementRules=5"):
        BrokerConfig.load(None, {"rejectPullConsumerEnable": "true"})
    assert BrokerConfig.load(None, {"rejectPullConsumerEnable": "true", "clientManagementRules": "5"})


@pytest.mark.parametrize("rules", [4, 5])
def test_heartbeat_answer_ext_fields_follow_the_rules(start, rules):
    b = start(rules)
    c = Client(b.ports["main"])
    for serialize_type in ("JSON", "ROCKETMQ", "JSON"):  # the second JSON one is served from the answer template
        r = c.call(RequestCode.HEART_BEAT, {}, hb_body(), serialize_type=serialize_type)
        assert r.code == 0 and r.remark is None
        # 4.9 answers createResponseCommand(null): no extFields at all; 5.1.3+ the V2 fields
        assert r.ext_fields == (None if rules == 4 else V2_ANSWER)
    # a fingerprint heartbeat: 4.9's HeartbeatData has no such field (fastjson drops it), so it is a V1 one
    v2 = hb_body(client_id="v2@1").replace(b'"heartbeatFingerprint":0', b'"heartbeatFingerprint":77')
    r = c.call(RequestCode.HEART_BEAT, {}, v2)
    assert r.ext_fields == (None if rules == 4 else {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"})
    assert b.call(b.registry.fingerprint, "demo_consumer_group") == (None if rules == 4 else 77)


@pytest.mark.parametrize("rules", [4, 5])
@pytest.mark.parametrize("case", ["auto_create_off", "invalid_name"])
def test_consumer_of_a_group_without_config(start, rules, case):
    """4.9: registered with notify on and no retry topic; 5.1.1+: SUCCESS and not registered."""
    if case == "auto_create_off":
        b, group = start(rules, auto_create_subscription_group=False), "CID_NO_CONFIG"
    else:
        b, group = start(rules), "my.group"  # validateGroup refuses '.', so it is never auto-created
    c = Client(b.ports["main"])
    before = notified(b)
    r = c.heartbeat(client_id="a@1", group=group)
    assert r.code == 0
    assert b.call(b.registry.subscription_group_config, group) is None
    assert b.call(b.registry.topic_config, "%RETRY%" + group) is None  # no retry topic either way
    if rules == 4:
        assert consumer_list(c, group) == ["a@1"]
        n = c.read(pred=lambda x: x.code == NOTIFY)  # notify=true: a new member is told
        assert n.ext_fields == {"consumerGroup": group} and n.flag == 2
        assert notified(b) == before + 1
    else:
        assert consumer_list(c, group) == f"no consumer for this group, {group}"
        assert notified(b) == before


@pytest.mark.parametrize("rules", [4, 5])
def test_broadcasting_group_join_unregister_close(start, rules):
    """4.9 sends CHANGE for BROADCASTING groups on join, unregister and close; 5.x never does."""
    b = start(rules)
    a, c = Client(b.ports["main"]), Client(b.ports["main"])
    body_a, body_c = broadcasting(hb_body(client_id="a@1")), broadcasting(hb_body(client_id="c@1"))
    per_event = 1 if rules == 4 else 0
    n0 = notified(b)
    assert a.call(RequestCode.HEART_BEAT, {}, body_a).code == 0
    assert notified(b) == n0 + per_event  # a joins: a is told
    assert c.call(RequestCode.HEART_BEAT, {}, body_c).code == 0
    assert notified(b) == n0 + 3 * per_event  # c joins: both are told
    assert a.call(RequestCode.HEART_BEAT, {}, body_a).code == 0
    assert notified(b) == n0 + 3 * per_event  # nothing changed: no CHANGE under either rules
    r = c.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "c@1", "consumerGroup": "demo_consumer_group"})
    assert r.code == 0
    assert notified(b) == n0 + 4 * per_event  # the remaining member a is told
    assert c.call(RequestCode.HEART_BEAT, {}, body_c).code == 0
    assert notified(b) == n0 + 6 * per_event
    c.close()
    assert wait_until(lambda: b.call(b.registry.consumer_ids, "demo_consumer_group") == ["a@1"])
    assert wait_until(lambda: notified(b) == n0 + 7 * per_event)  # the close: a is told (4.x)
    if rules == 4:  # a was told on its join, c's join, c's unregister, c's second join and c's close
        for _ in range(5):
            assert a.read(pred=lambda x: x.code == NOTIFY).ext_fields == {"consumerGroup": "demo_consumer_group"}


@pytest.mark.parametrize("rules", [4, 5])
def test_clustering_groups_are_notified_under_both(start, rules):
    b = start(rules)
    a = Client(b.ports["main"])
    n0 = notified(b)
    assert a.heartbeat(client_id="a@1").code == 0
    assert notified(b) == n0 + 1
    a.read(pred=lambda x: x.code == NOTIFY)


@pytest.mark.parametrize("rules", [4, 5])
def test_retry_topic_order_flag(start, rules):
    """5.x creates/adjusts the retry topic with hasOrderTopicSub; 4.9's createTopicInSendMessageBackMethod has no
    order argument (created unordered, an existing one left as it is)."""
    b = start(rules)
    b.call(b.registry.update_topic_config, TopicConfig("TopicTest", read_queue_nums=4, write_queue_nums=4, order=True))
    c = Client(b.ports["main"])
    assert c.heartbeat(client_id="a@1").code == 0
    retry = b.call(b.registry.topic_config, "%RETRY%demo_consumer_group")
    assert retry is not None and retry.perm == 6 and retry.read_queue_nums == 1
    assert retry.order is (rules == 5)


def test_reject_pull_consumer_only_under_5(start):
    body = hb_body(client_id="p@1").replace(b'"CONSUME_PASSIVELY"', b'"CONSUME_ACTIVELY"')
    b = start(5, reject_pull_consumer_enable=True)
    c = Client(b.ports["main"])
    assert c.call(RequestCode.HEART_BEAT, {}, body).code == 0
    assert consumer_list(c, "demo_consumer_group") == "no consumer for this group, demo_consumer_group"
    b4 = start(4)
    c4 = Client(b4.ports["main"])
    assert c4.call(RequestCode.HEART_BEAT, {}, body).code == 0
    assert consumer_list(c4, "demo_consumer_group") == ["p@1"]


# ------------------------------------------------------------------------------------------ registry level


class _HB:
    def __init__(self, client_id, consumers=(), producers=(), fingerprint=0, without_sub=False):
        self.client_id, self.consumers, self.producers = client_id, consumers, producers
        self.fingerprint, self.without_sub = fingerprint, without_sub


@pytest.mark.parametrize("rules", [4, 5])
def test_registry_events_and_topic_index(rules):
    """4.9 has no CLIENT_REGISTER / CLIENT_UNREGISTER events and no topicGroupTable (queryTopicConsumeByWho reads
    the live groups); a light V2 heartbeat is a full one with no subscriptions under 4.x (its withoutSub is
    dropped by a 4.9 broker's fastjson)."""
    import engine

    events = []
    reg = ClientRegistry(RegistryConfig(client_management_rules=rules), clock=lambda: 1000, listener=events.append)
    full = engine.decode_heartbeat(hb_body(client_id="a@1"))
    assert reg.heartbeat(1, full).ext_fields == (None if rules == 4 else V2_ANSWER)
    kinds = {e.kind for e in events}
    assert (ConsumerGroupEvent.CLIENT_REGISTER in kinds) is (rules == 5)
    assert reg.topic_consumed_by("TopicTest") == {"demo_consumer_group"}
    reg.unregister(1, "a@1", "demo_producer_group", "demo_consumer_group")
    kinds = {e.kind for e in events}
    assert (ConsumerGroupEvent.CLIENT_UNREGISTER in kinds) is (rules == 5)
    assert (ProducerGroupEvent.CLIENT_UNREGISTER in kinds) is (rules == 5)
    # 5.x keeps the group in topicGroupTable only until the group goes; 4.x reads the live table
    assert reg.topic_consumed_by("TopicTest") == set()
    light = engine.decode_heartbeat(hb_body(client_id="a@1").replace(b'"heartbeatFingerprint":0',
                                                                       b'"heartbeatFingerprint":5'))
    reg.heartbeat(1, light)
    assert reg.find_subscription("demo_consumer_group", "TopicTest") is not None
    no_subs = engine.decode_heartbeat(
        b'{"clientID":"a@1","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":'
        b'"CONSUME_PASSIVELY","groupName":"demo_consumer_group","messageModel":"CLUSTERING","subscriptionDataSet":'
        b'[],"unitMode":false}],"heartbeatFingerprint":5,"producerDataSet":[],"withoutSub":true}')
    r = reg.heartbeat(1, no_subs)
    if rules == 4:
        assert r.ext_fields is None and reg.find_subscription("demo_consumer_group", "TopicTest") is None
    else:
        assert r.ext_fields == {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "false"}
        assert reg.find_subscription("demo_consumer_group", "TopicTest") is not None
    reg.check_invariants()


@pytest.mark.parametrize("rules", [4, 5])
def test_empty_producer_groups_follow_the_rules(rules):
    """4.9 keeps a producer group whose last channel closed or expired (GET_PRODUCER_CONNECTION_LIST: SUCCESS with
    no connection), 5.x removes it. Under both the emptied group leaves the live groups; 4.x rules keep its name,
    within a budget (README: conformance table; tests/test_conformance_answers.py)."""
    import engine

    reg = ClientRegistry(RegistryConfig(client_management_rules=rules), clock=lambda: 1000)
    reg.heartbeat(1, engine.decode_heartbeat(hb_body(client_id="a@1")))
    assert sorted(reg.producer_groups()) == ["CLIENT_INNER_PRODUCER", "demo_producer_group"]
    assert reg.close_channel(1) is True
    kept = {"connectionSet": []} if rules == 4 else None
    pc = reg.producer_connection("demo_producer_group")
    assert reg.producer_groups() == [] and (pc if pc is None else pc.to_dict()) == kept
    reg.heartbeat(2, engine.decode_heartbeat(hb_body(client_id="b@1", producer="expiring_producer_group")))
    assert reg.scan_expired(now=1000 + 130_000) == [2]
    assert reg.producer_groups() == [] and reg.consumer_groups() == []
    pc = reg.producer_connection("expiring_producer_group")
    assert (pc if pc is None else pc.to_dict()) == kept
    reg.check_invariants()

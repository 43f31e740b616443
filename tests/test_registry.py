"""ClientRegistry rule by rule (PROTOCOL.md 5.4/5.5, 6.3-6.12, pitfalls 7-13): registration, change detection,
events and notify switches, V2 fingerprints, retry topics, subscription groups, unregister, close, offsets,
CHECK_CLIENT_CONFIG, queries, coalescing and the fast path."""
import pytest
from test_registry_model import hb

import engine
from engine.codec.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel, ResponseCode
from engine.registry.client_registry import (
    ClientRegistry,
    ConsumerGroupEvent,
    ProducerGroupEvent,
    RegistryConfig,
)
from engine.registry.store import SYSTEM_CONSUMER_GROUPS, SubscriptionGroupConfig, TopicConfig

CE, PE = ConsumerGroupEvent, ProducerGroupEvent
A, B = "10.0.0.1@1", "10.0.0.2@2"


class Harness:
    """A registry with a driven clock that records its events."""

    def __init__(self, **config):
        self.now = 1_000
        self.events = []
        self.reg = ClientRegistry(RegistryConfig(**config), clock=lambda: self.now, listener=self.events.append)

    def take(self, *kinds):
        """Events since the last call as (kind, group) pairs, optionally only of the given kinds."""
        out = [(e.kind, e.group) for e in self.events if not kinds or e.kind in kinds]
        self.events.clear()
        return out

    def changes(self):
        out = [(e.group, sorted(e.channels)) for e in self.events if e.kind is CE.CHANGE]
        self.events.clear()
        return out


@pytest.fixture
def h():
    return Harness()


def sub(topic, expr="*", version=1, expression_type="TAG"):
    tags = () if expr == "*" else tuple(t.strip() for t in expr.split("||"))
    return engine.SubscriptionData(topic, expr, tags, (), version, expression_type)


def consumer(group, *subs, model=MessageModel.CLUSTERING, ctype=ConsumeType.CONSUME_PASSIVELY,
             where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, unit_mode=False):
    return engine.ConsumerData(group, ctype, model, where, unit_mode, tuple(subs))


# ------------------------------------------------------------------------------------------------- heartbeat V1


def test_v1_heartbeat_registers_and_answers_sub_change_true(h):
    r = h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]), LanguageCode.JAVA, 479)
    assert r.code == ResponseCode.SUCCESS and r.remark is None
    assert r.ext_fields == {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"}
    assert h.reg.consumer_ids("G") == [A]
    assert h.reg.channel_groups(1) == (("G",), ("P",))
    assert h.take() == [(CE.CLIENT_REGISTER, "G"), (CE.CHANGE, "G"), (CE.REGISTER, "G")]
    info = h.reg.consumer_group_info("G")
    assert info.channels[0].language is LanguageCode.JAVA and info.channels[0].version == 479
    # repeated: nothing changed, but REGISTER always fires; V1 always says IS_SUB_CHANGE=true
    r = h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]), LanguageCode.JAVA, 479)
    assert r.ext_fields["IS_SUB_CHANGE"] == "true"
    assert h.take() == [(CE.REGISTER, "G")]


def test_new_connection_is_a_change_notifying_every_member_including_itself(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.take()
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T"])]))
    assert h.changes() == [("G", [1, 2])]
    assert h.reg.consumer_ids("G") == [A, B]  # table order: registration order


def test_topic_added_or_removed_is_a_change(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))
    h.take()
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1", "T2"])]))
    assert h.changes() == [("G", [1])]
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T2"])]))
    assert h.changes() == [("G", [1])]
    assert set(h.reg.consumer_group_info("G").subscription_table) == {"T2"}


def test_newer_sub_version_replaces_the_expression_silently(h):
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagA", 5))]))
    h.take()
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagB", 6))]))
    assert h.changes() == []
    assert h.reg.find_subscription("G", "T").sub_string == "TagB"
    # same or older version: the new expression is ignored
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagC", 6))]))
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagD", 2))]))
    assert h.reg.find_subscription("G", "T").sub_string == "TagB"
    assert h.changes() == []


def test_sub_version_compares_as_signed_int64(h):
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagA", 1718000000000000000))]))  # Go: ns
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagB", -1))]))
    assert h.reg.find_subscription("G", "T").sub_string == "TagA"


def test_inconsistent_subscriptions_flip_the_group_table_every_heartbeat(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T2"])]))
    h.take()
    for _ in range(3):
        h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))
        h.reg.heartbeat(2, hb(B, consumers=[("G", ["T2"])]))
        assert h.changes() == [("G", [1, 2]), ("G", [1, 2])]


def test_client_id_change_on_a_channel_replaces_the_entry_without_change(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]))
    h.take()
    h.reg.heartbeat(1, hb(B, consumers=[("G", ["T"])], producers=["P"]), LanguageCode.CPP, 7)
    assert h.changes() == []
    assert h.reg.consumer_ids("G") == [B]
    assert h.reg.consumer_group_info("G").channels[0].language is LanguageCode.CPP
    # a producer entry is never replaced (registerProducer only refreshes the timestamp)
    assert [c.client_id for c in h.reg.producer_channels("P")] == [A]
    assert h.reg.find_producer_channel(A) == 1 and h.reg.find_producer_channel(B) is None


def test_group_settings_are_last_writer_wins(h):
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T"), where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)]))
    h.reg.heartbeat(2, hb(B, consumers=[consumer("G", sub("T"), ctype=ConsumeType.CONSUME_ACTIVELY)]))
    info = h.reg.consumer_group_info("G")
    assert info.consume_type is ConsumeType.CONSUME_ACTIVELY
    assert info.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET


def test_heartbeat_without_client_id_or_group_name_is_an_error_that_changes_nothing(h):
    for bad in (hb(None, consumers=[("G", ["T"])]),
                engine.HeartbeatData(A, (), (engine.ConsumerData(None),)),
                engine.HeartbeatData(A, (engine.ProducerData(None),), ())):
        r = h.reg.heartbeat(1, bad)
        assert r.code == ResponseCode.SYSTEM_ERROR and r.ext_fields is None and r.remark
    assert h.reg.groups() == [] and h.take() == []


def test_language_and_version_of_the_request_are_recorded(h):
    h.reg.heartbeat(1, hb(A, producers=["P"]), None, 63)
    c = h.reg.producer_channels("P")[0]
    assert c.language is None and c.version == 63


# ------------------------------------------------------------------------------------------------- notify rules


def test_broadcasting_groups_get_no_change(h):
    cd = consumer("G", sub("T"), model=MessageModel.BROADCASTING)
    h.reg.heartbeat(1, hb(A, consumers=[cd]))
    h.reg.heartbeat(2, hb(B, consumers=[cd]))
    h.reg.unregister(1, A, consumer_group="G")
    h.reg.close_channel(2)
    assert h.take(CE.CHANGE) == []
    assert h.reg.consumer_groups() == []


def test_group_notify_flag_off_suppresses_change_except_on_close():
    h = Harness()
    h.reg.update_subscription_group_config(SubscriptionGroupConfig("G", notify_consumer_ids_changed_enable=False))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T"])]))
    h.reg.heartbeat(3, hb("c@3", consumers=[("G", ["T"])]))
    h.reg.unregister(3, "c@3", consumer_group="G")
    assert h.changes() == []
    h.reg.close_channel(2)  # doChannelCloseEvent ignores the per-group flag
    assert h.changes() == [("G", [1])]


def test_broker_wide_notify_off_delivers_no_change():
    h = Harness(notify_consumer_ids_changed_enable=False)
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T"])]))
    h.reg.close_channel(1)
    kinds = {k for k, _ in h.take()}
    assert CE.CHANGE not in kinds and CE.CLIENT_REGISTER in kinds and CE.CLIENT_UNREGISTER in kinds


def test_listener_event_filter_and_failing_listener():
    seen = []

    def listener(ev):
        seen.append(ev.kind)
        raise RuntimeError("listener bug")

    reg = ClientRegistry(listener=listener, events={CE.CHANGE})
    reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    reg.heartbeat(2, hb(B, consumers=[("G", ["T"])]))
    assert seen == [CE.CHANGE, CE.CHANGE]
    reg.check_invariants()
    assert reg.consumer_ids("G") == [A, B]


# ------------------------------------------------------------------------------------------------- unregister


def test_unregister_removes_by_channel_and_notifies_the_rest(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.reg.heartbeat(2, hb(A, consumers=[("G", ["T"])]))  # same client id, other connection
    h.take()
    assert h.reg.unregister(2, A, None, "G") == (ResponseCode.SUCCESS, None)
    assert h.take() == [(CE.CLIENT_UNREGISTER, "G"), (CE.CHANGE, "G")]
    assert h.reg.consumer_ids("G") == [A]
    assert h.reg.channel_groups(1) == (("G",), ())


def test_unregister_change_fires_even_if_nothing_was_removed(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.take()
    h.reg.unregister(99, "x@9", None, "G")
    assert h.changes() == [("G", [1])]


def test_unregister_of_the_last_member_removes_the_group(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]))
    h.take()
    h.reg.unregister(1, A, "P", "G")
    assert h.take() == [(PE.CLIENT_UNREGISTER, "P"), (PE.GROUP_UNREGISTER, "P"), (CE.CLIENT_UNREGISTER, "G"),
                        (CE.UNREGISTER, "G"), (CE.CHANGE, "G")]
    assert h.reg.groups() == []
    assert h.reg.topic_consumed_by("T") == set()
    assert h.reg.find_producer_channel(A) is None


def test_unregister_empty_strings_are_absent_cpp_dialect(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]))
    h.take()
    h.reg.unregister(1, A, "", "G")
    h.reg.unregister(1, A, "P", "")
    assert h.reg.groups() == []
    assert "" not in h.reg.store.groups.table


def test_unregister_without_client_id_is_an_error(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    code, remark = h.reg.unregister(1, None, None, "G")
    assert code == ResponseCode.SYSTEM_ERROR and "clientID" in remark
    assert h.reg.consumer_ids("G") == [A]


def test_unregister_auto_creates_the_group_config_as_java_does(h):
    h.reg.unregister(1, A, None, "NeverSeen")
    assert h.reg.subscription_group_config("NeverSeen") is not None


def test_unregister_producer_drops_the_request_client_id_from_the_client_table(h):
    h.reg.heartbeat(1, hb(A, producers=["P", "Q"]))
    h.reg.unregister(1, A, "P")
    # Java removes clientChannelTable[clientID] unconditionally, though the channel is still in Q
    assert h.reg.find_producer_channel(A) is None
    assert h.reg.channel_groups(1) == ((), ("Q",))


def test_stale_client_table_entry_dies_with_its_channel(h):
    h.reg.heartbeat(1, hb(A, producers=["P"]))
    h.reg.unregister(1, B, "P")  # another client id: Java leaves clientChannelTable[A] -> channel 1
    assert h.reg.find_producer_channel(A) == 1
    h.reg.close_channel(1)
    h.reg.heartbeat(2, hb(B, producers=["P"]))  # reuses the freed slot
    assert h.reg.find_producer_channel(A) is None
    h.reg.check_invariants()


# ------------------------------------------------------------------------------------------------- close


def test_close_removes_from_every_group_producers_first(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G1", ["T"]), ("G2", ["T"])], producers=["P"]))
    h.reg.heartbeat(2, hb(B, consumers=[("G1", ["T"])]))
    h.take()
    assert h.reg.close_channel(1) is True
    assert h.take() == [(PE.CLIENT_UNREGISTER, "P"), (PE.GROUP_UNREGISTER, "P"),
                        (CE.CLIENT_UNREGISTER, "G1"), (CE.CHANGE, "G1"),
                        (CE.CLIENT_UNREGISTER, "G2"), (CE.UNREGISTER, "G2"), (CE.CHANGE, "G2")]
    assert h.reg.consumer_groups() == ["G1"] and h.reg.consumer_ids("G1") == [B]
    assert h.reg.close_channel(1) is False
    assert h.reg.channel_count == 1
    h.reg.check_invariants()


class Channel:
    """A connection-like channel (weakly referenceable)."""


@pytest.mark.parametrize("events", [None, [CE.REGISTER]])
def test_a_closed_channel_is_not_kept_by_the_registry(events):
    """Nothing of the registry keeps a channel once it closed (the request being handled was kept until the next
    changing heartbeat: a closed connection's buffers and transport with it), on the slow and the fast path, with
    REGISTER events (built on the fast path) or none. The first heartbeat registers, the second arms, the third
    takes the fast path."""
    import gc
    import weakref

    reg = ClientRegistry(RegistryConfig(), clock=lambda: 1_000, listener=(lambda e: None) if events else None,
                         events=events)
    ch = Channel()
    ref = weakref.ref(ch)
    data = hb(A, consumers=[("G1", ["T"])], producers=["P"])
    for _ in range(3):
        assert reg.heartbeat(ch, data).code == ResponseCode.SUCCESS
    assert reg.close_channel(ch) is True
    del ch
    gc.collect()
    assert ref() is None
    reg.check_invariants()


def test_close_of_an_unregistered_channel(h):
    h.reg.open_channel(5, "127.0.0.1:1")
    assert h.reg.close_channel(5) is False
    assert h.reg.channel_count == 0


# ------------------------------------------------------------------------------------------------- V2


def test_v2_full_then_light_with_the_same_fingerprint(h):
    full = hb(A, consumers=[("G", ["T"])], fingerprint=42)
    r = h.reg.heartbeat(1, full)
    assert r.ext_fields == {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "false"}  # absent: no change
    assert h.reg.fingerprint("G") == 42
    h.take()
    light = hb(A, consumers=[("G", [])], fingerprint=42, without_sub=True)
    r = h.reg.heartbeat(1, light)
    assert r.is_sub_change is False
    assert h.take() == []  # no REGISTER on the light path
    assert set(h.reg.consumer_group_info("G").subscription_table) == {"T"}  # untouched


def test_v2_changed_fingerprint_is_a_sub_change(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], fingerprint=42))
    r = h.reg.heartbeat(1, hb(A, consumers=[("G", [])], fingerprint=43, without_sub=True))
    assert r.is_sub_change is True and h.reg.fingerprint("G") == 43


def test_v2_fingerprint_is_per_group_so_two_members_alternate(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], fingerprint=1))
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T"])], fingerprint=2))
    for _ in range(2):
        assert h.reg.heartbeat(1, hb(A, consumers=[("G", [])], fingerprint=1, without_sub=True)).is_sub_change
        assert h.reg.heartbeat(2, hb(B, consumers=[("G", [])], fingerprint=2, without_sub=True)).is_sub_change


def test_v1_stores_fingerprint_zero(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], fingerprint=5))
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T"])]))
    assert h.reg.fingerprint("G") == 0
    assert h.reg.heartbeat(1, hb(A, consumers=[("G", [])], fingerprint=5, without_sub=True)).is_sub_change


def test_v2_restart_quirk_light_heartbeat_for_an_unknown_group(h):
    light = hb(A, consumers=[("G", [])], fingerprint=7, without_sub=True)
    r = h.reg.heartbeat(1, light)
    assert r.is_sub_change is True  # deviation: make the client send its subscriptions
    assert h.reg.consumer_ids("G") == [A]


def test_v2_restart_quirk_when_the_group_was_removed_but_the_fingerprint_kept(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], fingerprint=7))
    h.reg.close_channel(1)
    assert h.reg.fingerprint("G") == 7  # the table is never pruned
    r = h.reg.heartbeat(2, hb(A, consumers=[("G", [])], fingerprint=7, without_sub=True))
    assert r.is_sub_change is True


def test_v2_java_restart_behaviour_when_not_restart_safe():
    h = Harness(v2_restart_safe=False)
    r = h.reg.heartbeat(1, hb(A, consumers=[("G", [])], fingerprint=7, without_sub=True))
    assert r.is_sub_change is False
    assert h.reg.consumer_group_info("G").subscription_table == {}  # pulls would fail with 24


# ------------------------------------------------------------------------------------------------- retry topic


def test_retry_topic_created_per_group_with_retry_queue_nums_and_perm_6(h):
    h.reg.update_subscription_group_config(SubscriptionGroupConfig("G", retry_queue_nums=3))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"]), ("H", ["T"])]))
    g = h.reg.topic_config("%RETRY%G")
    assert (g.read_queue_nums, g.write_queue_nums, g.perm, g.topic_sys_flag, g.order) == (3, 3, 6, 0, False)
    assert h.reg.topic_config("%RETRY%H").read_queue_nums == 1


def test_retry_topic_of_a_unit_mode_consumer_has_flag_unit_sub(h):
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T"), unit_mode=True)]))
    assert h.reg.topic_config("%RETRY%G").topic_sys_flag == 2


def test_retry_topic_order_flag_follows_order_topic_subscriptions(h):
    h.reg.update_topic_config(TopicConfig("OrderT", order=True))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["OrderT"])], fingerprint=3))
    assert h.reg.topic_config("%RETRY%G").order is True
    # a light V2 heartbeat has no subscriptions, so hasOrderTopicSub is false and Java resets the flag
    h.reg.heartbeat(1, hb(A, consumers=[("G", [])], fingerprint=3, without_sub=True))
    assert h.reg.topic_config("%RETRY%G").order is False
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["OrderT"])], fingerprint=3))
    assert h.reg.topic_config("%RETRY%G").order is True


# ------------------------------------------------------------------------------------------------- groups


def test_system_groups_exist_at_start(h):
    assert set(SYSTEM_CONSUMER_GROUPS) <= set(h.reg.store.groups.table)
    assert "CID_RMQ_SYS_TRANS" in SYSTEM_CONSUMER_GROUPS


@pytest.mark.parametrize("name", ["has space", "x" * 121, "   ", "", "grüppe", "a/b", "a.b"])
def test_invalid_group_names_are_not_registered_but_heartbeat_succeeds(h, name):
    r = h.reg.heartbeat(1, hb(A, consumers=[(name, ["T"])]))
    assert r.code == ResponseCode.SUCCESS
    assert h.reg.consumer_groups() == [] and h.reg.subscription_group_config(name) is None
    assert h.reg.topic_config("%RETRY%" + name) is None
    assert h.reg.fingerprint(name) == 0  # stored before the config lookup, as Java does


@pytest.mark.parametrize("name", ["x" * 120, "%|a-Z_0", "CID_AliOnsCluster"])
def test_valid_group_names_are_auto_created(h, name):
    h.reg.heartbeat(1, hb(A, consumers=[(name, ["T"])]))
    assert h.reg.consumer_groups() == [name]
    cfg = h.reg.subscription_group_config(name)
    assert (cfg.retry_queue_nums, cfg.retry_max_times, cfg.notify_consumer_ids_changed_enable) == (1, 16, True)


def test_auto_create_off_skips_unknown_groups_but_creates_sys_groups():
    h = Harness(auto_create_subscription_group=False)
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"]), ("CID_RMQ_SYS_X", ["T"])]))
    assert h.reg.consumer_groups() == ["CID_RMQ_SYS_X"]
    h.reg.update_subscription_group_config(SubscriptionGroupConfig("G"))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    assert sorted(h.reg.consumer_groups()) == ["CID_RMQ_SYS_X", "G"]
    h2 = Harness(auto_create_subscription_group=False, enable_create_sys_group=False)
    h2.reg.heartbeat(1, hb(A, consumers=[("CID_RMQ_SYS_X", ["T"])]))
    assert h2.reg.consumer_groups() == []


def test_reject_pull_consumer():
    h = Harness(reject_pull_consumer_enable=True)
    pull = consumer("Pull", sub("T"), ctype=ConsumeType.CONSUME_ACTIVELY)
    h.reg.heartbeat(1, hb(A, consumers=[pull, ("Push", ["T"])]))
    assert h.reg.consumer_groups() == ["Push"]
    assert h.reg.fingerprint("Pull") is None


def test_deleting_a_group_config_stops_registration(h):
    h.reg.update_subscription_group_config(SubscriptionGroupConfig("G"))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    assert h.reg.delete_subscription_group_config("G")
    h2 = Harness(auto_create_subscription_group=False)
    h2.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    assert h2.reg.consumer_groups() == []


# ------------------------------------------------------------------------------------------------- offsets


def test_offsets_commit_and_query(h):
    code, remark = h.reg.update_consumer_offset("1.2.3.4:5", "G", "T", 0, 5)
    assert code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and remark == "Group G not exist!"
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    code, remark = h.reg.update_consumer_offset("1.2.3.4:5", "G", "T", 0, 5)
    assert code == ResponseCode.TOPIC_NOT_EXIST and remark == "Topic T not exist!"
    h.reg.update_topic_config(TopicConfig("T", read_queue_nums=4, write_queue_nums=4))
    assert h.reg.update_consumer_offset("1.2.3.4:5", "G", "T", None, 5)[0] == ResponseCode.SYSTEM_ERROR
    assert h.reg.update_consumer_offset("1.2.3.4:5", "G", "T", 0, None)[0] == ResponseCode.SYSTEM_ERROR
    assert h.reg.update_consumer_offset("1.2.3.4:5", "G", "T", 0, 5) == (ResponseCode.SUCCESS, None)
    assert h.reg.update_consumer_offset("1.2.3.4:5", "G", "T", 0, 3) == (ResponseCode.SUCCESS, None)  # may go back
    assert h.reg.query_consumer_offset("G", "T", 0) == 3
    assert h.reg.query_consumer_offset("G", "T", 1) == -1
    assert h.reg.query_consumer_offset("Other", "T", 0) == -1
    # the retry topic exists once the group heartbeats
    assert h.reg.update_consumer_offset("h", "G", "%RETRY%G", 0, 1)[0] == ResponseCode.SUCCESS


# ------------------------------------------------------------------------------------------------- CHECK_CLIENT_CONFIG


def check_body(expression_type, sub_string="a > 5"):
    return {"clientId": A, "group": "G", "subscriptionData": {
        "classFilterMode": False, "codeSet": [], "expressionType": expression_type, "subString": sub_string,
        "subVersion": 1718000000000, "tagsSet": [], "topic": "TopicTest"}}


def test_check_client_config(h):
    assert h.reg.check_client_config(None) == (ResponseCode.SUCCESS, None)
    assert h.reg.check_client_config({"clientId": A}) == (ResponseCode.SUCCESS, None)
    for t in (None, "", "TAG"):
        assert h.reg.check_client_config(check_body(t)) == (ResponseCode.SUCCESS, None)
    assert h.reg.check_client_config(check_body("SQL92")) == (
        ResponseCode.SYSTEM_ERROR, "The broker does not support consumer to filter message by SQL92")


def test_check_client_config_with_property_filter():
    reg = ClientRegistry(RegistryConfig(enable_property_filter=True))
    assert reg.check_client_config(check_body("SQL92", "a > 5 AND b = 'x'")) == (ResponseCode.SUCCESS, None)
    code, remark = reg.check_client_config(check_body("SQL92", "a > 'x'"))
    assert code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "cannot be compared" in remark
    assert reg.check_client_config(check_body("SQL92", "a >"))[0] == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert reg.check_client_config(check_body("XPATH", "/a")) == (ResponseCode.SUBSCRIPTION_PARSE_FAILED, None)
    sd = engine.SubscriptionData("T", "a IS NULL", expression_type="SQL92")
    body = type("Body", (), {"subscription_data": sd})()
    assert reg.check_client_config(body) == (ResponseCode.SUCCESS, None)


# ------------------------------------------------------------------------------------------------- queries


def test_consumer_connection_is_the_203_body(h):
    h.reg.open_channel(1, "10.0.0.1:50001")
    h.reg.heartbeat(1, hb(A, consumers=[consumer("G", sub("T", "TagA || TagB", 9))]), LanguageCode.JAVA, 479)
    conn = h.reg.consumer_connection("G")
    assert conn.to_dict() == {
        "connectionSet": [{"clientAddr": "10.0.0.1:50001", "clientId": A, "language": "JAVA", "version": 479}],
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        "consumeType": "CONSUME_PASSIVELY",
        "messageModel": "CLUSTERING",
        "subscriptionTable": {"T": {"classFilterMode": False, "codeSet": [], "expressionType": "TAG",
                                    "subString": "TagA || TagB", "subVersion": 9, "tagsSet": ["TagA", "TagB"],
                                    "topic": "T"}},
    }
    assert h.reg.consumer_connection("nope") is None


def test_producer_connection_is_the_204_body(h):
    h.reg.open_channel(1, "[::1]:7")
    h.reg.heartbeat(1, hb(A, producers=["P"]), LanguageCode.CPP, 63)
    assert h.reg.producer_connection("P").to_dict() == {
        "connectionSet": [{"clientAddr": "[::1]:7", "clientId": A, "language": "CPP", "version": 63}]}
    assert h.reg.producer_connection("nope") is None


def test_remote_address_from_the_channel_object(h):
    class Conn:
        remote_addr = "192.168.1.10:40000"

    conn = Conn()
    h.reg.heartbeat(conn, hb(A, producers=["P"]))
    assert h.reg.channel_info(conn).remote_addr == "192.168.1.10:40000"


def test_topic_consumed_by_keeps_java_stale_entries(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T2"])]))
    assert h.reg.topic_consumed_by("T1") == {"G"}  # topicGroupTable is only cleared for current topics
    assert h.reg.topic_consumed_by("T2") == {"G"}
    h.reg.close_channel(1)
    assert h.reg.topic_consumed_by("T2") == set() and h.reg.topic_consumed_by("T1") == {"G"}


def test_group_stats_and_counts(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]))
    h.reg.heartbeat(2, hb(A, consumers=[("G", ["T"])]))
    assert sorted(h.reg.group_stats()) == [("consumer", "G", 1, 2), ("producer", "P", 1, 1)]
    s = h.reg.stats()
    assert (s["channels"], s["consumer_groups"], s["producer_groups"], s["consumer_memberships"]) == (2, 1, 1, 2)
    assert h.reg.groups() == ["G", "P"]


# ------------------------------------------------------------------------------------------------- coalescing


def test_change_is_immediate_by_default(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    assert h.changes() == [("G", [1])]
    assert h.reg.flush_notifications() == 0


def test_reconnect_storm_is_coalesced_into_one_change_per_group():
    h = Harness(notify_coalesce_window_ms=500)
    for ch in range(10):
        h.reg.heartbeat(ch, hb(f"c@{ch}", consumers=[("G", ["T"]), ("H", ["T"])]))
        h.now += 20
    h.reg.close_channel(0)
    assert h.changes() == []
    assert h.reg.flush_notifications() == 0  # window not over yet (opened at t=1000)
    h.now = 1_500
    assert h.reg.flush_notifications() == 2
    assert sorted(h.changes()) == [("G", list(range(1, 10))), ("H", list(range(1, 10)))]
    assert h.reg.flush_notifications() == 0
    h.reg.heartbeat(20, hb("c@20", consumers=[("G", ["T"])]))
    assert h.reg.flush_notifications(force=True) == 1
    assert h.changes() == [("G", list(range(1, 10)) + [20])]


def test_coalesced_change_of_a_removed_group_has_no_channels():
    h = Harness(notify_coalesce_window_ms=100)
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    h.reg.close_channel(1)
    h.now += 100
    h.reg.flush_notifications()
    assert h.changes() == [("G", [])]


# ------------------------------------------------------------------------------------------------- fast path


def test_repeated_heartbeat_takes_the_fast_path_with_the_same_answers(h):
    data = hb(A, consumers=[("G", ["T"])], producers=["P", "CLIENT_INNER_PRODUCER"])
    h.reg.heartbeat(1, data)
    h.reg.heartbeat(1, data)  # a no-op run arms the fast path
    h.take()
    slot = h.reg.channel_table.find(1)
    assert h.reg.channel_table.armed(slot)
    for _ in range(3):
        h.now += 30_000
        assert h.reg.heartbeat(1, data).ext_fields["IS_SUB_CHANGE"] == "true"
    assert h.take() == [(CE.REGISTER, "G")] * 3  # REGISTER still fires on every heartbeat
    assert {c.last_update_timestamp for c in h.reg.consumer_group_info("G").channels} == {h.now}
    assert {c.last_update_timestamp for c in h.reg.producer_channels("P")} == {h.now}
    h.reg.check_invariants()


def test_the_same_decoded_heartbeat_with_another_language_or_version_is_not_a_repeat(h, monkeypatch):
    # the fast path recognises a repeat by the decoded object's identity; the request header must still match
    slow = []
    real = h.reg._heartbeat
    monkeypatch.setattr(h.reg, "_heartbeat", lambda *a: (slow.append(a[3:]), real(*a))[1])
    data = hb(A, producers=["P"])
    for language, version in [(LanguageCode.JAVA, 400)] * 3 + [(LanguageCode.JAVA, 401)] * 2 + [(LanguageCode.CPP, 401)]:
        h.reg.heartbeat(1, data, language, version)
    # first sight, the arming no-op run, then one slow run per header change (which re-arms for the new header)
    assert slow == [(LanguageCode.JAVA, 400)] * 2 + [(LanguageCode.JAVA, 401), (LanguageCode.CPP, 401)]
    h.reg.check_invariants()


def test_an_equal_heartbeat_decoded_anew_still_takes_the_fast_path(h):
    h.reg.heartbeat(1, hb(A, producers=["P"]))
    h.reg.heartbeat(1, hb(A, producers=["P"]))
    slot = h.reg.channel_table.find(1)
    armed = h.reg.channel_table.armed(slot)
    h.now += 5_000
    h.reg.heartbeat(1, hb(A, producers=["P"]))  # another object, equal content: matched by its digest
    assert h.reg.channel_table.armed(slot) == armed and h.reg.producer_channels("P")[0].last_update_timestamp == h.now


def test_a_heartbeat_in_another_set_order_takes_the_fast_path(h, monkeypatch):
    """A Java client's HashSets come out in another order between heartbeats of one registration: no change."""
    slow = []
    real = h.reg._heartbeat
    monkeypatch.setattr(h.reg, "_heartbeat", lambda *a: (slow.append(1), real(*a))[1])
    groups = [("G1", ["T1", "T2", "%RETRY%G1"]), ("G2", ["T3", "T4"])]
    h.reg.heartbeat(1, hb(A, consumers=groups, producers=["P", "CLIENT_INNER_PRODUCER"]))
    h.reg.heartbeat(1, hb(A, consumers=groups, producers=["P", "CLIENT_INNER_PRODUCER"]))  # arms
    assert len(slow) == 2
    h.take()
    h.now += 10_000
    reordered = [(g, topics[::-1]) for g, topics in groups[::-1]]
    h.reg.heartbeat(1, hb(A, consumers=reordered, producers=["CLIENT_INNER_PRODUCER", "P"]))
    assert len(slow) == 2  # answered by the fast path
    assert {c.last_update_timestamp for c in h.reg.consumer_group_info("G1").channels} == {h.now}
    assert h.take() == [(CE.REGISTER, "G2"), (CE.REGISTER, "G1")]
    h.reg.heartbeat(1, hb(A, consumers=[("G1", ["T1", "T2"]), ("G2", ["T3", "T4"])],
                          producers=["P", "CLIENT_INNER_PRODUCER"]))  # a topic less: a change, the full path
    assert len(slow) == 3
    h.reg.check_invariants()


def test_fast_path_is_invalidated_by_another_members_change(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))
    h.reg.heartbeat(2, hb(B, consumers=[("G", ["T2"])]))  # flips the group table to T2
    h.take()
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T1"])]))  # must flip it back, with a CHANGE
    assert h.changes() == [("G", [1, 2])]
    assert set(h.reg.consumer_group_info("G").subscription_table) == {"T1"}


def test_fast_path_is_invalidated_by_admin_config_changes(h):
    data = hb(A, consumers=[("G", ["OrderT"])])
    h.reg.heartbeat(1, data)
    h.reg.heartbeat(1, data)
    h.reg.update_topic_config(TopicConfig("OrderT", order=True))
    h.reg.heartbeat(1, data)
    assert h.reg.topic_config("%RETRY%G").order is True


def test_fast_path_never_refreshes_memberships_the_heartbeat_does_not_name(h):
    h.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P"]))
    h.now += 1
    empty = hb(A)
    h.reg.heartbeat(1, empty)
    h.reg.heartbeat(1, empty)
    h.now += 100_000
    h.reg.heartbeat(1, empty)
    assert {c.last_update_timestamp for c in h.reg.consumer_group_info("G").channels} == {1_000}


@pytest.mark.parametrize("addr", ["10.0.0.1:80", "0.0.0.0:0", "255.255.255.255:65535", "010.0.0.1:80",
                                  "1.2.3.4:65536", "[::1]:5000", "[fe80::1%eth0]:1", "host-a:1", "1.2.3.4:+1", ""])
def test_remote_addresses_round_trip(h, addr):
    h.reg.open_channel(1, addr)
    h.reg.heartbeat(1, hb(A, producers=["P"]))
    assert h.reg.producer_connection("P").connections[0].client_addr == addr
    h.reg.close_channel(1)
    assert h.reg.stats()["interned_strings"] == 0


def test_groups_per_channel_budget_refuses_before_any_change():
    """A channel is registered in at most RegistryConfig.max_groups_per_channel groups (default 1024; Java has no
    budget): a heartbeat that could pass it is answered SYSTEM_ERROR and changes nothing. It also bounds what a
    close or an expiry does per membership (65,535 groups on one channel made a close take 37 s)."""
    assert RegistryConfig().max_groups_per_channel == 1024
    h = Harness(max_groups_per_channel=8)
    h.reg.heartbeat(1, hb(A, producers=["P0"]))
    too_many = hb(A, producers=[f"P{i}" for i in range(1, 9)])  # P0 + 8 new ones
    res = h.reg.heartbeat(1, too_many)
    assert res.code == ResponseCode.SYSTEM_ERROR and res.remark == "a channel is registered in 8 groups at most"
    assert h.reg.producer_groups() == ["P0"] and h.reg.channel_groups(1) == ((), ("P0",))
    fits = hb(B, producers=[f"P{i}" for i in range(8)])
    assert h.reg.heartbeat(2, fits).code == ResponseCode.SUCCESS  # a fresh channel takes exactly the budget
    assert len(h.reg.channel_groups(2)[1]) == 8
    h.reg.check_invariants()
    with pytest.raises(ValueError):
        RegistryConfig(max_groups_per_channel=4097)  # a close's work is linear per membership: bounded
    RegistryConfig(channel_expired_timeout_ms=(1 << 40) + 120_000)  # the table's producer shift at its bound
    with pytest.raises(ValueError, match="channel_expired_timeout_ms must be at most"):
        RegistryConfig(channel_expired_timeout_ms=(1 << 40) + 120_001)


def test_groups_per_channel_budget_counts_only_the_groups_that_would_be_new():
    """A heartbeat re-sending the channel's groups is not refused; groups past the budget that would be new are."""
    h = Harness(max_groups_per_channel=10)
    n = 6
    groups = [f"P{i}" for i in range(n)]
    assert h.reg.heartbeat(1, hb(A, producers=groups), LanguageCode.JAVA, 1).code == ResponseCode.SUCCESS
    h.now += 30_000
    res = h.reg.heartbeat(1, hb(A, producers=groups), LanguageCode.JAVA, 2)  # a change: the full path
    assert res.code == ResponseCode.SUCCESS
    slot = h.reg.channel_table.find(1)
    assert h.reg.channel_table.member_time(slot, h.reg._producers["P0"].key) == h.now  # applied
    # the same groups + the new ones up to the budget fit; one more new group does not (state unchanged)
    over = groups + [f"Q{i}" for i in range(10 - n + 1)]
    res = h.reg.heartbeat(1, hb(A, producers=over), LanguageCode.JAVA, 2)
    assert res.code == ResponseCode.SYSTEM_ERROR and res.remark == "a channel is registered in 10 groups at most"
    assert h.reg.channel_table.nmem(slot) == n
    assert h.reg.heartbeat(1, hb(A, producers=over[:-1]), LanguageCode.JAVA, 2).code == ResponseCode.SUCCESS
    assert h.reg.channel_table.nmem(slot) == 10 and len(h.reg.producer_groups()) == 10


def test_broker_wide_group_and_membership_budgets_refuse_before_any_change():
    """Live groups (consumer + producer) and (group, channel) registrations of all channels have budgets too
    (RegistryConfig.max_groups, max_memberships): producer groups need no config, so without them many
    connections with many group names each held memory without bound (~25 MB a connection at 65,535 groups)."""
    h = Harness(max_groups=5, max_memberships=7)
    assert h.reg.heartbeat(1, hb(A, consumers=[("G1", ["T"])], producers=["P1", "P2"])).code == ResponseCode.SUCCESS
    # 3 groups, 3 memberships; a new channel naming 3 new groups would make 6 > 5
    res = h.reg.heartbeat(2, hb(B, producers=["P3", "P4", "P5"]))
    assert res.code == ResponseCode.SYSTEM_ERROR and res.remark == "the broker holds 5 consumer and producer groups at most"
    assert h.reg.producer_groups() == ["P1", "P2"] and h.reg.channel_groups(2) == ((), ())
    # existing groups only: 3 more memberships (6 <= 7) fit, then one more channel of 2 does not (8 > 7)
    assert h.reg.heartbeat(2, hb(B, consumers=[("G1", ["T"])], producers=["P1", "P2"])).code == ResponseCode.SUCCESS
    res = h.reg.heartbeat(3, hb("10.0.0.3@3", producers=["P1", "P2"]))
    assert res.code == ResponseCode.SYSTEM_ERROR and res.remark == "the broker holds 7 group registrations at most"
    assert h.reg.channel_groups(3) == ((), ())
    assert h.reg.heartbeat(3, hb("10.0.0.3@3", producers=["P1"])).code == ResponseCode.SUCCESS  # exactly 7
    h.reg.check_invariants()
    h.reg.close_channel(1)  # registrations given back: room again
    assert h.reg.heartbeat(4, hb("10.0.0.4@4", producers=["P3", "P4"])).code == ResponseCode.SUCCESS
    h.reg.check_invariants()


@pytest.mark.parametrize("language,version", [(LanguageCode.JAVA, 1 << 31), (LanguageCode.JAVA, -(1 << 31) - 1),
                                              ("JAVA", 479), (LanguageCode.JAVA, "x")])
def test_a_bad_language_or_version_changes_nothing(language, version):
    """The registry's API refuses a version outside int32 or a language that is not a code before any change (it
    used to create the group, take references and then fail in the table, leaving an empty group and a leaked
    string reference)."""
    h = Harness()
    assert h.reg.heartbeat(1, hb(A, producers=["P0"]), LanguageCode.JAVA, 479).code == ResponseCode.SUCCESS
    before = h.reg.stats()
    for ch in (1, 2):
        res = h.reg.heartbeat(ch, hb(A, consumers=[("G1", ["T"])], producers=["P1"]), language, version)
        assert res.code == ResponseCode.SYSTEM_ERROR
    stats = h.reg.stats()
    assert {k: v for k, v in stats.items() if k not in ("channels", "slot_top")} == \
        {k: v for k, v in before.items() if k not in ("channels", "slot_top")}
    h.reg.check_invariants()


def test_fast_path_refreshes_a_group_a_later_heartbeat_left_out():
    """A channel alternates heartbeats A = {G1, G2} and B = {G1}: B leaves G2 its own older time, and a repeat of A
    (armed before B) must refresh G2 (Java: every heartbeat sets lastUpdateTimestamp of the groups it names). Before
    the fix the fast path answered A, G2 kept its time from before B and expired while A still named it."""
    h = Harness()
    ch = object()
    a = hb(A, consumers=[("G1", ["T"]), ("G2", ["T"])])
    b = hb(A, consumers=[("G1", ["T"])])
    ct = h.reg.channel_table
    h.now = 1000
    h.reg.heartbeat(ch, a, LanguageCode.JAVA, 1)
    h.now = 2000
    h.reg.heartbeat(ch, a, LanguageCode.JAVA, 1)  # the same object: a no-op run, arms the fast path
    slot = ct.find(ch)
    assert ct.armed(slot)
    h.now = 3000
    h.reg.heartbeat(ch, b, LanguageCode.JAVA, 1)  # leaves G2 out: G2 keeps its own time 2000, the slot is disarmed
    assert ct.armed(slot) == 0
    g2 = h.reg._consumers["G2"].key
    assert ct.member_time(slot, g2) == 2000
    h.now = 100_000
    h.reg.heartbeat(ch, a, LanguageCode.JAVA, 1)
    assert ct.member_time(slot, g2) == 100_000 and ct.lag_items(slot) == [] and ct.oldest(slot) == 100_000
    assert {c.last_update_timestamp for c in h.reg.consumer_group_info("G2").channels} == {100_000}
    ct.check()
    h.reg.check_invariants()
    h.now = 110_000
    h.reg.heartbeat(ch, b, LanguageCode.JAVA, 1)
    h.take()
    assert h.reg.scan_expired(125_000) == []  # G2 was refreshed 25 s before: not expired
    assert h.take() == [] and h.reg.channel_groups(ch) == (("G1", "G2"), ())
    # the steady state still takes the fast path: A twice more arms it again, and it refreshes every group
    h.reg.heartbeat(ch, a, LanguageCode.JAVA, 1)
    h.reg.heartbeat(ch, a, LanguageCode.JAVA, 1)
    assert ct.armed(slot)
    h.now = 130_000
    h.reg.heartbeat(ch, a, LanguageCode.JAVA, 1)
    assert ct.member_time(slot, g2) == 130_000
    h.reg.check_invariants()

"""engine.registry.consumer_manager.ConsumerManager on its own: the consumer table (live ConsumerGroupInfo per group) and the
topic -> groups table over the registry's channel table (registerConsumer with updateChannel / updateSubscription,
the light V2 registration, unregister, close, expiry scan, queries, invariants), under both rule sets. The
registry's rule tests (test_registry*.py) exercise it through the facade."""
import logging

import pytest
from test_registry_model import hb

import engine
from engine.registry.client_channel import CONSUMER
from engine.registry.consumer_manager import (
    ConsumerConnection,
    ConsumerGroup,
    ConsumerGroupEvent,
    ConsumerGroupInfo,
    ConsumerManager,
)
from engine.codec.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel
from engine.registry.client_registry import ClientRegistry, RegistryConfig

CE = ConsumerGroupEvent
A, B = "10.0.0.1@1", "10.0.0.2@2"


def sub(topic, version=1):
    return engine.SubscriptionData(topic, "*", (), (), version)


def cdata(group, *subs, model=MessageModel.CLUSTERING, ctype=ConsumeType.CONSUME_PASSIVELY):
    return engine.ConsumerData(group, ctype, model, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, False, tuple(subs))


class Table:
    """A channel table (the registry) with a driven clock and its events; ``cm`` is its ConsumerManager."""

    def __init__(self, rules=5, **config):
        self.now = 1_000
        self.events = []
        self.reg = ClientRegistry(RegistryConfig(client_management_rules=rules, **config), clock=lambda: self.now,
                                  listener=self.events.append)
        self.cm = self.reg.consumers

    def take(self, *kinds):
        out = [(e.kind, e.group) for e in self.events if not kinds or e.kind in kinds]
        self.events.clear()
        return out

    def register(self, channel, client_id, cd, notify=True, light=False):
        """registerConsumer on ``channel`` for a heartbeat of ``client_id`` (what ClientRegistry.heartbeat does
        once ClientManageProcessor's checks passed)."""
        reg = self.reg
        slot = reg._slot_for(channel)
        cid = reg._pool.intern(client_id)
        reg._request = (channel, client_id, LanguageCode.JAVA, 479, self.now, slot)
        reg._dirty = False
        req = (cid, int(LanguageCode.JAVA), 479)
        key = (self.cm.register_without_sub if light else self.cm.register)(cd.group, slot, req, cd, notify)
        reg._pool.release(cid)
        return slot, key


@pytest.fixture(params=[5, 4], ids=["rules5", "rules4"])
def t(request):
    return Table(request.param)


def test_the_facade_composes_one_manager_over_its_table():
    reg = ClientRegistry()
    assert isinstance(reg.consumers, ConsumerManager) and reg.consumers.table is reg
    assert reg._consumers is reg.consumers.group_table and reg._topic_groups is reg.consumers.topic_groups


def test_register_creates_the_group_with_its_channel_and_subscriptions(t):
    slot, key = t.register(1, A, cdata("G", sub("T1"), sub("T2")))
    g = t.cm.group_table["G"]
    assert isinstance(g, ConsumerGroup) and key == g.key == g.gid * 2 + CONSUMER and t.cm.by_gid[g.gid] is g
    assert g.members.tolist() == [slot] and set(g.subscriptions) == {"T1", "T2"}
    assert t.cm.topic_groups == {"T1": {"G"}, "T2": {"G"}}
    assert t.take(CE.CHANGE) == [(CE.CHANGE, "G")]
    assert t.reg._dirty
    # the same registration again: nothing changes, no CHANGE, the epoch stays
    epoch = g.epoch
    t.reg._dirty = False
    assert t.register(1, A, cdata("G", sub("T1"), sub("T2")))[1] == key
    assert not t.reg._dirty and g.epoch == epoch and t.take(CE.CHANGE) == []
    t.reg.check_invariants()


def test_update_subscription_adds_replaces_and_removes_topics(t):
    t.register(1, A, cdata("G", sub("T1"), sub("T2")))
    g = t.cm.group_table["G"]
    assert t.cm.update_subscription(g, (sub("T1"), sub("T2"))) is False
    epoch = g.epoch
    # a newer subVersion replaces silently: not a change of topics, but an epoch change (the fast path sees it)
    newer = sub("T1", version=2)
    assert t.cm.update_subscription(g, (newer, sub("T2"))) is False
    assert g.subscriptions["T1"] is newer and g.epoch > epoch
    # an older one does not replace
    assert t.cm.update_subscription(g, (sub("T1", version=1), sub("T2"))) is False
    assert g.subscriptions["T1"] is newer
    assert t.cm.update_subscription(g, (newer,)) is True and set(g.subscriptions) == {"T1"}
    assert t.cm.update_subscription(g, (newer, sub("T3"))) is True and set(g.subscriptions) == {"T1", "T3"}


def test_update_channel_settings_and_a_client_id_change(t, caplog):
    slot, _ = t.register(1, A, cdata("G", sub("T")))
    g = t.cm.group_table["G"]
    epoch = g.epoch
    t.register(1, A, cdata("G", sub("T"), model=MessageModel.BROADCASTING))
    assert g.message_model is MessageModel.BROADCASTING and g.epoch > epoch  # settings follow the last heartbeat
    with caplog.at_level(logging.ERROR, logger="RocketmqBroker"):
        t.register(1, B, cdata("G", sub("T"), model=MessageModel.BROADCASTING))
    lines = [r.getMessage() for r in caplog.records if r.name == "RocketmqBroker"]
    assert len(lines) == 1
    # Java's ConsumerGroupInfo.updateChannel wording of the rules' version, both ClientChannelInfo texts
    head = ("[BUG] consumer channel exist in broker, but clientId not equal. GROUP: G OLD: " if t.reg._rules4 else
            "ConsumerGroupInfo: consumer channel exists in broker, but clientId is not the same one, group=G, "
            "old clientChannelInfo=")
    assert lines[0].startswith(head + "ClientChannelInfo [") and f"clientId={A}," in lines[0]
    assert f"clientId={B}," in lines[0].split("NEW: " if t.reg._rules4 else "new clientChannelInfo=")[1]
    assert t.cm.consumer_ids("G") == [B] and t.reg.channel_table.armed(slot) == 0
    t.reg.check_invariants()


def test_broadcasting_groups_are_not_notified_under_5x_rules_but_are_under_4x(t):
    t.register(1, A, cdata("G", sub("T"), model=MessageModel.BROADCASTING))
    assert t.take(CE.CHANGE) == ([(CE.CHANGE, "G")] if t.reg._rules4 else [])
    t.register(2, B, cdata("G", sub("T"), model=MessageModel.BROADCASTING), notify=False)
    assert t.take(CE.CHANGE) == []  # the group's notify flag off


def test_the_light_registration_keeps_the_subscriptions():
    t = Table(5)
    t.register(1, A, cdata("G", sub("T")))
    t.take()
    slot, key = t.register(2, B, cdata("G"), light=True)
    g = t.cm.group_table["G"]
    assert key == g.key and set(g.subscriptions) == {"T"} and t.cm.consumer_ids("G") == [A, B]
    assert t.take(CE.CHANGE) == [(CE.CHANGE, "G")]
    t.reg.check_invariants()


def test_queries(t):
    t.reg.open_channel(1, "10.0.0.1:5000")
    t.register(1, A, cdata("G", sub("T")))
    t.reg.open_channel(2, "10.0.0.2:5001")
    t.register(2, B, cdata("G", sub("T")))
    assert t.cm.consumer_ids("G") == [A, B] and t.cm.consumer_ids("nope") == []
    info = t.cm.group_info("G")
    assert isinstance(info, ConsumerGroupInfo) and info.client_ids == [A, B] and set(info.subscription_table) == {"T"}
    assert t.cm.group_info("nope") is None and t.cm.connection("nope") is None
    conn = t.cm.connection("G")
    assert isinstance(conn, ConsumerConnection)
    d = conn.to_dict()
    assert [c["clientAddr"] for c in d["connectionSet"]] == ["10.0.0.1:5000", "10.0.0.2:5001"]
    assert d["messageModel"] == "CLUSTERING" and d["subscriptionTable"]["T"]["topic"] == "T"
    assert t.cm.find_subscription("G", "T").topic == "T" and t.cm.find_subscription("G", "U") is None
    assert t.cm.find_subscription("nope", "T") is None
    assert t.cm.topic_consumed_by("T") == {"G"} and t.cm.groups() == ["G"]
    # the facade answers from the manager
    assert t.reg.consumer_ids("G") == [A, B] and t.reg.consumer_connection("G").to_dict() == d
    assert repr(t.reg.consumer_group_info("G")) == repr(info) and t.reg.consumer_groups() == ["G"]


def test_unregister_drops_the_emptied_group_and_notifies_even_when_nothing_was_removed(t):
    t.register(1, A, cdata("G", sub("T")))
    t.take()
    t.reg.unregister(2, B, consumer_group="G")  # not a member: CHANGE anyway (6.6.4)
    assert t.take(CE.CHANGE, CE.UNREGISTER) == [(CE.CHANGE, "G")]
    t.reg.unregister(1, A, consumer_group="G")
    assert t.take(CE.UNREGISTER, CE.CHANGE) == [(CE.UNREGISTER, "G"), (CE.CHANGE, "G")]
    assert "G" not in t.cm.group_table and t.cm.topic_groups == {}
    t.reg.check_invariants()


def test_close_removes_every_consumer_membership_and_notifies_the_rest(t):
    t.reg.heartbeat(1, hb(A, consumers=[("G1", ["T"]), ("G2", ["T"])]))
    t.reg.heartbeat(2, hb(B, consumers=[("G1", ["T"])]))
    t.take()
    t.reg.close_channel(1)
    ev = t.take(CE.CHANGE, CE.UNREGISTER)
    assert (CE.CHANGE, "G1") in ev and (CE.UNREGISTER, "G2") in ev
    assert t.cm.groups() == ["G1"] and t.cm.consumer_ids("G1") == [B]
    t.reg.check_invariants()


def test_a_producer_only_channel_closes_without_the_manager(t, monkeypatch):
    calls = []
    real = ConsumerManager.close_channel
    monkeypatch.setattr(ConsumerManager, "close_channel", lambda self, *a: (calls.append(a), real(self, *a)))
    t.reg.heartbeat(1, hb(A, producers=["P"]))
    t.reg.close_channel(1)
    assert calls == []
    t.reg.heartbeat(2, hb(B, consumers=[("G", ["T"])]))
    t.reg.close_channel(2)
    assert len(calls) == 1


def test_the_scan_drops_an_emptied_group_silently_and_keeps_its_topics(t):
    t.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    t.take()
    t.now += t.reg.config.channel_expired_timeout_ms + 1
    assert t.reg.scan_expired() == [1]
    assert t.take(CE.CHANGE, CE.UNREGISTER) == []
    assert t.cm.groups() == []
    assert t.cm.topic_groups == {"T": {"G"}}  # kept, as Java keeps them
    t.reg.close_channel(1)
    t.reg.check_invariants()


def test_the_invariant_check_can_fail(t):
    t.register(1, A, cdata("G", sub("T")))
    t.cm.check_invariants()
    g = t.cm.group_table["G"]
    g.subscriptions["U"] = sub("T")
    with pytest.raises(AssertionError):
        t.cm.check_invariants()
    del g.subscriptions["U"]
    t.cm.topic_groups["X"] = set()
    with pytest.raises(AssertionError):
        t.cm.check_invariants()

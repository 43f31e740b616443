"""A reference model of the broker's client management, written as a literal transcription of the Java classes
(ClientManageProcessor, ConsumerManager, ConsumerGroupInfo, ProducerManager; PROTOCOL.md 6) with plain dicts,
and the hypothesis strategies the registry tests share. The stateful test in test_registry_stateful.py drives
this model and engine.registry.client_registry.ClientRegistry side by side and compares everything observable.

The model follows the spec where Java's code has an artefact the spec does not describe: Java inserts one
ClientChannelInfo object into every table a request registers it in, so refreshing one entry refreshes its
siblings; the spec (6.7, 6.8) and the registry keep a time per entry. It also applies the registry's documented
deviations (module docstring of engine.registry.client_registry): a heartbeat without clientID or group name is an error that
changes nothing, the V2 restart-safe answer, and a stale producer clientChannelTable entry dies with its channel.
"""
from hypothesis import strategies as st

import engine
from engine.codec.enums import ConsumeFromWhere, ConsumeType, MessageModel
from engine.registry.client_registry import (
    PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS,
    ConsumerGroupEvent,
    ProducerGroupEvent,
    RegistryConfig,
)
from engine.registry.store import FLAG_UNIT_SUB, PERM_READ, PERM_WRITE, Store

CLIENT_IDS = ["10.0.0.1@1", "10.0.0.2@2#77", "10.0.0.1@DEFAULT"]
CONSUMER_GROUPS = ["G1", "G2", "G3", "bad group"]  # "bad group" fails validateGroup: never registered
PRODUCER_GROUPS = ["P1", "CLIENT_INNER_PRODUCER", "G1"]  # "G1" is also a consumer group name
TOPICS = ["T1", "T2", "T3", "%RETRY%G1"]
LANGUAGES = [engine.LanguageCode.JAVA, engine.LanguageCode.CPP, None]
VERSIONS = [0, 121, 479]


# ----------------------------------------------------------------------------------------------------------- data

subscriptions = st.builds(
    engine.SubscriptionData,
    topic=st.sampled_from(TOPICS),
    sub_string=st.sampled_from(["*", "TagA || TagB"]),
    sub_version=st.integers(0, 3),
)
consumers = st.builds(
    engine.ConsumerData,
    group=st.sampled_from(CONSUMER_GROUPS),
    consume_type=st.sampled_from([ConsumeType.CONSUME_PASSIVELY, ConsumeType.CONSUME_PASSIVELY,
                                  ConsumeType.CONSUME_ACTIVELY, None]),
    message_model=st.sampled_from([MessageModel.CLUSTERING, MessageModel.CLUSTERING, MessageModel.BROADCASTING,
                                   None]),
    consume_from_where=st.sampled_from([ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                                        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET]),
    unit_mode=st.booleans(),
    subscriptions=st.lists(subscriptions, max_size=3).map(tuple),
)
producers = st.builds(engine.ProducerData, group=st.sampled_from(PRODUCER_GROUPS))
heartbeats = st.builds(
    engine.HeartbeatData,
    client_id=st.sampled_from(CLIENT_IDS + CLIENT_IDS + [None]),
    producers=st.lists(producers, max_size=3).map(tuple),
    consumers=st.lists(consumers, max_size=3).map(tuple),
    fingerprint=st.sampled_from([0, 0, 0, 7, 9]),
    without_sub=st.booleans(),
)


def hb(client_id="10.0.0.1@1", consumers=(), producers=(), fingerprint=0, without_sub=False):
    """A heartbeat from names: consumers as (group, [topic, ...]) or ConsumerData, producers as group names."""
    cds = []
    for c in consumers:
        if isinstance(c, tuple):
            group, topics = c
            c = engine.ConsumerData(group, ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING,
                                    ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                                    subscriptions=tuple(engine.SubscriptionData(t, sub_version=1) for t in topics))
        cds.append(c)
    return engine.HeartbeatData(client_id, tuple(engine.ProducerData(p) for p in producers), tuple(cds),
                                fingerprint, without_sub)


# ----------------------------------------------------------------------------------------------------------- model


class RefInfo:
    """ClientChannelInfo."""

    def __init__(self, channel, client_id, language, version, now):
        self.channel = channel
        self.client_id = client_id
        self.language = language
        self.version = version
        self.last_update = now

    def copy(self):
        return RefInfo(self.channel, self.client_id, self.language, self.version, self.last_update)


class RefGroup:
    """ConsumerGroupInfo."""

    def __init__(self, name, consume_type, message_model, consume_from_where):
        self.name = name
        self.channel_table = {}  # channel -> RefInfo
        self.subscription_table = {}
        self.consume_type = consume_type
        self.message_model = message_model
        self.consume_from_where = consume_from_where

    def update_channel(self, info, consume_type, message_model, consume_from_where, now):
        updated = False
        self.consume_type, self.message_model, self.consume_from_where = (consume_type, message_model,
                                                                          consume_from_where)
        old = self.channel_table.get(info.channel)
        if old is None:
            self.channel_table[info.channel] = info.copy()  # one object per entry (see the module docstring)
            updated = True
        elif old.client_id != info.client_id:
            self.channel_table[info.channel] = info.copy()
        self.channel_table[info.channel].last_update = now
        return updated

    def update_subscription(self, subs):
        updated = False
        topics = set()
        for sub in subs:
            old = self.subscription_table.get(sub.topic)
            if old is None:
                self.subscription_table[sub.topic] = sub
                updated = True
            elif sub.sub_version > old.sub_version:
                self.subscription_table[sub.topic] = sub
            topics.add(sub.topic)
        for topic in list(self.subscription_table):
            if topic not in topics:
                del self.subscription_table[topic]
                updated = True
        return updated


class RefRegistry:
    """The Java managers as plain Python. ``events`` collects (kind, group, payload) tuples."""

    def __init__(self, config: RegistryConfig, clock):
        self.cfg = config
        self.clock = clock
        self.store = Store(None)
        self.consumer_table: dict[str, RefGroup] = {}
        self.producer_table: dict[str, dict] = {}
        self.client_channel_table: dict = {}
        self.fingerprints: dict = {}
        self.topic_group_table: dict = {}
        self.addr: dict = {}
        self.events: list = []

    # -------------------------------------------------------------------------------------------- events
    def emit(self, kind, group, payload=None):
        self.events.append((kind, group, payload))

    def change(self, group, channels):
        if self.cfg.notify_consumer_ids_changed_enable:
            self.emit(ConsumerGroupEvent.CHANGE, group, tuple(sorted(channels)))

    # -------------------------------------------------------------------------------------------- processor
    def find_group_config(self, group):
        return self.store.groups.find(group, self.cfg.auto_create_subscription_group,
                                      self.cfg.enable_create_sys_group)[0]

    def heartbeat(self, channel, data, language, version):
        if data.client_id is None or any(c.group is None for c in data.consumers) \
                or any(p.group is None for p in data.producers):
            return ("error",)
        now = self.clock()
        info = RefInfo(channel, data.client_id, language, version, now)
        v2 = data.fingerprint != 0
        is_sub_change = False
        for cd in data.consumers:
            if self.cfg.reject_pull_consumer_enable and cd.consume_type is ConsumeType.CONSUME_ACTIVELY:
                continue
            prev = self.fingerprints.get(cd.group)
            if v2:
                if prev is not None and prev != data.fingerprint:
                    is_sub_change = True
                elif data.without_sub and self.cfg.v2_restart_safe and (
                        prev is None or cd.group not in self.consumer_table):
                    is_sub_change = True
            self.fingerprints[cd.group] = data.fingerprint
            has_order = any(self.store.topics.is_order_topic(s.topic) for s in cd.subscriptions)
            sgc = self.find_group_config(cd.group)
            if sgc is None:
                continue
            self.store.topics.create_topic_in_send_message_back_method(
                "%RETRY%" + cd.group, sgc.retry_queue_nums, PERM_READ | PERM_WRITE, has_order,
                FLAG_UNIT_SUB if cd.unit_mode else 0)
            if v2 and data.without_sub:
                self.register_consumer_without_sub(cd.group, info, cd, sgc.notify_consumer_ids_changed_enable, now)
            else:
                self.register_consumer(cd.group, info, cd, sgc.notify_consumer_ids_changed_enable, now)
        for pd in data.producers:
            self.register_producer(pd.group, info, now)
        return ("ok", True if not v2 else is_sub_change)

    def unregister(self, channel, client_id, producer_group, consumer_group):
        if client_id is None:
            return ("error",)
        info = RefInfo(channel, client_id, None, 0, self.clock())
        if producer_group:
            self.unregister_producer(producer_group, info)
        if consumer_group:
            sgc = self.find_group_config(consumer_group)
            notify = sgc.notify_consumer_ids_changed_enable if sgc is not None else True
            self.unregister_consumer(consumer_group, info, notify)
        return ("ok",)

    def close(self, channel):
        self.producer_close(channel)
        self.consumer_close(channel)
        for cid in [c for c, ch in self.client_channel_table.items() if ch == channel]:
            del self.client_channel_table[cid]  # the registry's documented deviation
        self.addr.pop(channel, None)

    def scan(self):
        closed = set()
        now = self.clock()
        for group in list(self.producer_table):
            table = self.producer_table[group]
            for ch, info in list(table.items()):
                if now - info.last_update > PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS:
                    del table[ch]
                    if self.client_channel_table.get(info.client_id) == ch:
                        del self.client_channel_table[info.client_id]
                    self.emit(ProducerGroupEvent.CLIENT_UNREGISTER, group, self.client_key(info))
                    closed.add(ch)
            if not table:
                del self.producer_table[group]
                self.emit(ProducerGroupEvent.GROUP_UNREGISTER, group)
        for group in list(self.consumer_table):
            g = self.consumer_table[group]
            for ch, info in list(g.channel_table.items()):
                if now - info.last_update > self.cfg.channel_expired_timeout_ms:
                    self.emit(ConsumerGroupEvent.CLIENT_UNREGISTER, group,
                              (self.client_key(info), frozenset(g.subscription_table)))
                    del g.channel_table[ch]
                    closed.add(ch)
            if not g.channel_table:
                del self.consumer_table[group]
        return closed

    # -------------------------------------------------------------------------------------------- consumers
    def register_consumer(self, group, info, cd, notify, now):
        g = self.consumer_table.get(group)
        if g is None:
            g = self.consumer_table[group] = RefGroup(group, cd.consume_type, cd.message_model,
                                                      cd.consume_from_where)
        for sub in cd.subscriptions:
            self.topic_group_table.setdefault(sub.topic, set()).add(group)
        r1 = g.update_channel(info, cd.consume_type, cd.message_model, cd.consume_from_where, now)
        if r1:
            self.emit(ConsumerGroupEvent.CLIENT_REGISTER, group,
                      (self.client_key(info), frozenset(s.topic for s in cd.subscriptions)))
        r2 = g.update_subscription(cd.subscriptions)
        if (r1 or r2) and notify and g.message_model is not MessageModel.BROADCASTING:
            self.change(group, g.channel_table)
        self.emit(ConsumerGroupEvent.REGISTER, group, (self.client_key(info), tuple(cd.subscriptions)))

    def register_consumer_without_sub(self, group, info, cd, notify, now):
        g = self.consumer_table.get(group)
        if g is None:
            g = self.consumer_table[group] = RefGroup(group, cd.consume_type, cd.message_model,
                                                      cd.consume_from_where)
        for topic in g.subscription_table:
            self.topic_group_table.setdefault(topic, set()).add(group)
        r = g.update_channel(info, cd.consume_type, cd.message_model, cd.consume_from_where, now)
        if r and notify and g.message_model is not MessageModel.BROADCASTING:
            self.change(group, g.channel_table)

    def clear_topic_group_table(self, g):
        for topic in g.subscription_table:
            groups = self.topic_group_table.get(topic)
            if groups is not None:
                groups.discard(g.name)
                if not groups:
                    del self.topic_group_table[topic]

    def unregister_consumer(self, group, info, notify):
        g = self.consumer_table.get(group)
        if g is None:
            return
        if g.channel_table.pop(info.channel, None) is not None:
            self.emit(ConsumerGroupEvent.CLIENT_UNREGISTER, group,
                      (self.client_key(info), frozenset(g.subscription_table)))
        if not g.channel_table:
            del self.consumer_table[group]
            self.emit(ConsumerGroupEvent.UNREGISTER, group)
            self.clear_topic_group_table(g)
        if notify and g.message_model is not MessageModel.BROADCASTING:
            self.change(group, g.channel_table)

    def consumer_close(self, channel):
        for group in list(self.consumer_table):
            g = self.consumer_table[group]
            old = g.channel_table.pop(channel, None)
            if old is None:
                continue
            self.emit(ConsumerGroupEvent.CLIENT_UNREGISTER, group,
                      (self.client_key(old), frozenset(g.subscription_table)))
            if not g.channel_table:
                del self.consumer_table[group]
                self.emit(ConsumerGroupEvent.UNREGISTER, group)
                self.clear_topic_group_table(g)
            if g.message_model is not MessageModel.BROADCASTING:
                self.change(group, g.channel_table)

    # -------------------------------------------------------------------------------------------- producers
    def register_producer(self, group, info, now):
        table = self.producer_table.setdefault(group, {})
        found = table.get(info.channel)
        if found is None:
            table[info.channel] = info.copy()
            self.client_channel_table[info.client_id] = info.channel
        else:
            found.last_update = now

    def unregister_producer(self, group, info):
        table = self.producer_table.get(group)
        if not table:
            return
        old = table.pop(info.channel, None)
        self.client_channel_table.pop(info.client_id, None)
        if old is not None:
            self.emit(ProducerGroupEvent.CLIENT_UNREGISTER, group, self.client_key(info))
        if not table:
            del self.producer_table[group]
            self.emit(ProducerGroupEvent.GROUP_UNREGISTER, group)

    def producer_close(self, channel):
        for group in list(self.producer_table):
            table = self.producer_table[group]
            old = table.pop(channel, None)
            if old is None:
                continue
            self.client_channel_table.pop(old.client_id, None)
            self.emit(ProducerGroupEvent.CLIENT_UNREGISTER, group, self.client_key(old))
            if not table:
                del self.producer_table[group]
                self.emit(ProducerGroupEvent.GROUP_UNREGISTER, group)

    # -------------------------------------------------------------------------------------------- views
    def client_key(self, info):
        return (info.channel, info.client_id, info.language, info.version, info.last_update,
                self.addr.get(info.channel, ""))

    def snapshot(self):
        return {
            "consumers": {name: (frozenset(self.client_key(i) for i in g.channel_table.values()),
                                 dict(g.subscription_table), g.consume_type, g.message_model, g.consume_from_where)
                          for name, g in self.consumer_table.items()},
            "producers": {name: frozenset(self.client_key(i) for i in t.values())
                          for name, t in self.producer_table.items()},
            "client_table": {cid: self.client_channel_table.get(cid) for cid in CLIENT_IDS},
            "fingerprints": {g: self.fingerprints.get(g) for g in CONSUMER_GROUPS},
            "topic_groups": {t: set(self.topic_group_table.get(t, ())) for t in TOPICS},
            "topics": {name: tc.to_dict() for name, tc in self.store.topics.table.items()},
            "group_configs": set(self.store.groups.table),
        }


def client_key(info):
    return (info.channel, info.client_id, info.language, info.version, info.last_update_timestamp, info.remote_addr)


def registry_snapshot(reg):
    """The same view of an engine.registry.client_registry.ClientRegistry."""
    consumers = {}
    for name in reg.consumer_groups():
        info = reg.consumer_group_info(name)
        consumers[name] = (frozenset(client_key(c) for c in info.channels), info.subscription_table,
                           info.consume_type, info.message_model, info.consume_from_where)
    return {
        "consumers": consumers,
        "producers": {name: frozenset(client_key(c) for c in reg.producer_channels(name))
                      for name in reg.producer_groups()},
        "client_table": {cid: reg.find_producer_channel(cid) for cid in CLIENT_IDS},
        "fingerprints": {g: reg.fingerprint(g) for g in CONSUMER_GROUPS},
        "topic_groups": {t: reg.topic_consumed_by(t) for t in TOPICS},
        "topics": {name: tc.to_dict() for name, tc in reg.store.topics.table.items()},
        "group_configs": set(reg.store.groups.table),
    }


def registry_event_key(ev):
    """A registry event in the model's (kind, group, payload) form."""
    kind = ev.kind
    if kind is ConsumerGroupEvent.CHANGE:
        return (kind, ev.group, tuple(sorted(ev.channels)))
    if kind in (ConsumerGroupEvent.UNREGISTER, ProducerGroupEvent.GROUP_UNREGISTER):
        return (kind, ev.group, None)
    if kind is ConsumerGroupEvent.REGISTER:
        return (kind, ev.group, (client_key(ev.client), tuple(ev.subscriptions)))
    if kind is ProducerGroupEvent.CLIENT_UNREGISTER:
        return (kind, ev.group, client_key(ev.client))
    return (kind, ev.group, (client_key(ev.client), frozenset(ev.topics)))


# ----------------------------------------------------------------------------------------------------------- tests
# (of the model itself, so a mistake in it cannot silently make the differential test agree with a bug)


def test_model_follows_change_detection_rules():
    t = [0]
    ref = RefRegistry(RegistryConfig(), lambda: t[0])
    assert ref.heartbeat(1, hb(consumers=[("G1", ["T1"])]), None, 0) == ("ok", True)
    kinds = [e[0] for e in ref.events]
    assert kinds == [ConsumerGroupEvent.CLIENT_REGISTER, ConsumerGroupEvent.CHANGE, ConsumerGroupEvent.REGISTER]
    ref.events.clear()
    ref.heartbeat(1, hb(consumers=[("G1", ["T1"])]), None, 0)
    assert [e[0] for e in ref.events] == [ConsumerGroupEvent.REGISTER]
    ref.events.clear()
    ref.heartbeat(1, hb(consumers=[("G1", ["T2"])]), None, 0)
    assert [e[0] for e in ref.events] == [ConsumerGroupEvent.CHANGE, ConsumerGroupEvent.REGISTER]


def test_model_scan_is_silent_and_close_notifies():
    t = [0]
    ref = RefRegistry(RegistryConfig(), lambda: t[0])
    ref.heartbeat(1, hb(consumers=[("G1", ["T1"])]), None, 0)
    ref.heartbeat(2, hb("10.0.0.2@2#77", consumers=[("G1", ["T1"])]), None, 0)
    t[0] = 60_000
    ref.heartbeat(2, hb("10.0.0.2@2#77", consumers=[("G1", ["T1"])]), None, 0)
    ref.events.clear()
    t[0] = 120_001
    assert ref.scan() == {1}
    assert [e[0] for e in ref.events] == [ConsumerGroupEvent.CLIENT_UNREGISTER]
    ref.events.clear()
    ref.close(2)
    assert [e[0] for e in ref.events] == [ConsumerGroupEvent.CLIENT_UNREGISTER, ConsumerGroupEvent.UNREGISTER,
                                          ConsumerGroupEvent.CHANGE]
    assert ref.consumer_table == {}

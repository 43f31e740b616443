"""The native rule paths (engine.registry._rules: heartbeat and close) against their twin, the registry's Python
paths: two registries, one with the native rules and one without, take the same operations (heartbeats, closes,
unregisters, scans, clock steps, admin updates) and must give the same answers, CHANGE events,
Java log lines, tables, arming state and string-pool contents; and the native path takes the heartbeats its
docstring names (a new client of existing groups, subscription and setting changes) and leaves the others alone,
having changed nothing."""
import logging
import re

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_registry_model import CLIENT_IDS, CONSUMER_GROUPS, LANGUAGES, PRODUCER_GROUPS, TOPICS, VERSIONS, hb
from test_registry_model import heartbeats, registry_event_key, registry_snapshot

import engine
from conftest import require_native
from engine.codec.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel, ResponseCode
from engine.registry import client_registry as registry_module
from engine.registry import clientlog
from engine.registry.client_registry import ClientRegistry, ConsumerGroupEvent, RegistryConfig
from engine.registry.store import TopicConfig

CHANGE = {ConsumerGroupEvent.CHANGE}


class Lines(logging.Handler):
    """Java's client-management lines, as written."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        # lastUpdateTimestamp is the wall clock at the time of writing: it differs between the two registries
        self.lines.append(re.sub(r"lastUpdateTimestamp=-?\d+", "lastUpdateTimestamp=T", record.getMessage()))

    def take(self):
        out, self.lines = self.lines, []
        return out


@pytest.fixture
def lines():
    handler = Lines()
    log = clientlog.log
    old = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)
    log.setLevel(old)


def pair(config=RegistryConfig(), clock=lambda: 0):
    """(native, twin): the same registry with and without the native rules, CHANGE events only. Both are built
    here over the native channel table and string pool, which the rules need, so that a twin run
    (ENGINE_NO_EXTENSIONS=1: the registry builds neither) tests them too."""
    require_native()
    from engine.registry._channel_table import ChannelTable
    from engine.registry._intern import StringPool
    from engine.registry._rules import HeartbeatRules

    out = []
    for native in (True, False):
        events = []
        saved = registry_module._ChannelTable, registry_module.StringPool
        registry_module._ChannelTable, registry_module.StringPool = ChannelTable, StringPool
        try:
            reg = ClientRegistry(config, clock=clock, listener=events.append, events=CHANGE)
        finally:
            registry_module._ChannelTable, registry_module.StringPool = saved
        reg._use_rules(HeartbeatRules(reg, registry_module._heartbeat_digest, reg._result_v1,
                                      registry_module._RESULT_V2_SAME, registry_module._pack_ipv4,
                                      ClientRegistry.heartbeat) if native else None)
        reg.client_log.clock = lambda: clock() / 1000  # both budgets count the same minutes
        out.append((reg, events))
    return out


def native_model(h, client_id_type=str):
    """The heartbeat as the native decoder's model (the rules decline the twin's)."""
    from engine.codec import _heartbeat as nh

    return nh.HeartbeatData(
        h.client_id if h.client_id is None else client_id_type(h.client_id), tuple(nh.ProducerData(p.group) for p in h.producers),
        tuple(nh.ConsumerData(c.group, c.consume_type, c.message_model, c.consume_from_where, c.unit_mode,
                              tuple(nh.SubscriptionData(s.topic, s.sub_string, s.tags, s.codes, s.sub_version,
                                                        s.expression_type, s.class_filter_mode)
                                    for s in c.subscriptions))
              for c in h.consumers), h.fingerprint, h.without_sub)


def state(reg):
    """Everything a later request could observe, internals included (the fast path's arming, epochs, ids)."""
    ct = reg.channel_table
    slots = {}
    for channel, slot in sorted(ct.items(), key=lambda kv: kv[1]):
        keys = ct.mem_keys(slot)
        slots[slot] = (channel, ct.addr(slot), ct.client(slot), ct.armed(slot), ct.fkey(slot), ct.armed_by(slot),
                       tuple(keys),
                       tuple(ct.member_info(slot, k) for k in keys), tuple(ct.member_time(slot, k) for k in keys))
    groups = {name: (g.gid, g.epoch, dict(g.subscriptions), g.consume_type, g.message_model, g.consume_from_where)
              for name, g in reg._consumers.items()}
    pool = reg._pool
    strings = {pool.get(i): pool.refs(i) for i in range(pool.high_water) if pool.refs(i)}
    return (registry_snapshot(reg), slots, groups, sorted(reg._producers), dict(reg._fingerprints),
            {t: set(g) for t, g in reg._topic_groups.items()}, reg._tick, reg._config_epoch, reg._nmemberships,
            dict(reg._pending), strings, reg.client_log.left_out, list(reg.producers.client_table_items()),
            list(reg.producers.emptied.items()),  # the emptied producer groups kept under 4.x rules
            {g: reg.consumer_ids(g) for g in CONSUMER_GROUPS + ["not_a_group"]})  # the native list in member order


class Chan:
    """A connection: the registry reads its remote address when its first heartbeat opens its slot."""

    __slots__ = ("n", "remote_addr")

    def __init__(self, n, remote_addr):
        self.n, self.remote_addr = n, remote_addr

    def __lt__(self, other):
        return self.n < other.n

    def __repr__(self):
        return f"Chan({self.n})"


class Name(str):
    """A client id of a str subclass (an API caller's): the Python path takes it, with the same pool ids."""


ADDRESSES = ["10.0.0.9:4000", "[::1]:5000", "host-b:2", ""]


class RulesMachine(RuleBasedStateMachine):
    config = RegistryConfig(client_log_lines_per_minute=3)

    def __init__(self):
        super().__init__()
        # IPv4, IPv6, host name and no address, as the first heartbeat finds them (open_channel may set another)
        self.chans = [Chan(0, "10.0.0.1:4000"), Chan(1, "[::1]:5000"), Chan(2, "host-a:1"), Chan(3, None),
                      Chan(4, "10.0.0.2:4001")]
        self.now = 1_000_000
        (self.native, self.native_events), (self.twin, self.twin_events) = pair(self.config, lambda: self.now)
        self.tokens = {}  # channel -> (native registry's token, twin's) of its last armed heartbeat
        self.lines = Lines()
        clientlog.log.addHandler(self.lines)
        self.level = clientlog.log.level
        clientlog.log.setLevel(logging.INFO)

    def teardown(self):
        clientlog.log.removeHandler(self.lines)
        clientlog.log.setLevel(self.level)
        clientlog.log.disabled = False

    def both(self, op, *args):
        ours = op(self.native, *args)
        ours_lines = self.lines.take()
        theirs = op(self.twin, *args)
        assert ours == theirs
        assert ours_lines == self.lines.take()
        assert [registry_event_key(e) for e in self.native_events] == [registry_event_key(e) for e in self.twin_events]
        self.native_events.clear()
        self.twin_events.clear()

    @rule(channel=st.integers(0, 4), data=heartbeats, language=st.sampled_from(LANGUAGES + [7, 300, -1]),
          version=st.sampled_from(VERSIONS + [1 << 63, -(1 << 64), True]), repeat=st.booleans(),
          subclass=st.booleans())
    def heartbeat(self, channel, data, language, version, repeat, subclass):
        chan = self.chans[channel]
        data = native_model(data, Name if subclass else str)
        for _ in range(2 if repeat else 1):
            self.both(lambda reg: reg.heartbeat(chan, data, language, version))
        # the repeat route's token for this request (None where the fast path did not arm), kept across later
        # steps (a close, another client's change, a config change) as a connection keeps it while armed
        tokens = (self.native.repeat_token(chan, data, language, version),
                  self.twin.repeat_token(chan, data, language, version))
        assert (tokens[0] is None) == (tokens[1] is None)
        if tokens[0] is not None:
            assert len(tokens[0]) == len(tokens[1]) and tokens[0][-1] == tokens[1][-1]
            self.tokens[channel] = tokens
            if repeat:  # the client repeats it at once (the route answers from the next read on)
                self.repeat(channel)

    @rule(channel=st.integers(0, 4))
    def repeat(self, channel):
        """A repeat of the channel's armed heartbeat (ClientRegistry.heartbeat_repeat on its token): the native
        rules' check against the Python method's, the same answer (None once the arming, the config or a group
        changed) and the same state after (the slot touched)."""
        if channel not in self.tokens:
            return
        native, twin = self.tokens[channel]
        self.now += 7  # the touch is seen in the slot's times
        ours, theirs = self.native.heartbeat_repeat(native), self.twin.heartbeat_repeat(twin)
        assert ours == theirs
        assert self.native.heartbeat_repeat.__self__ is self.native._rules  # the C method answered

    @rule()
    def repeat_all(self):
        """Every held token repeats: most are stale by now (closed, re-armed, a group or the config changed)."""
        for channel in sorted(self.tokens):
            self.repeat(channel)

    @rule(channel=st.integers(0, 4), data=st.data())
    def changed_heartbeat(self, channel, data):
        """A member's heartbeat again with a subscription changed (a subVersion bump, a topic added or dropped)."""
        channel = self.chans[channel]
        info = self.twin.channel_info(channel)
        cds = []
        for cd in data.draw(heartbeats).consumers:
            subs = list(cd.subscriptions)
            if subs and data.draw(st.booleans()):
                s = subs[0]
                subs[0] = engine.SubscriptionData(s.topic, s.sub_string, s.tags, s.codes, s.sub_version + 1)
            cds.append(engine.ConsumerData(cd.group, cd.consume_type, cd.message_model, cd.consume_from_where,
                                           cd.unit_mode, tuple(subs)))
        client_id = info.client_id if info is not None else CLIENT_IDS[0]
        heartbeat = native_model(engine.HeartbeatData(client_id, (), tuple(cds)))
        self.both(lambda reg: reg.heartbeat(channel, heartbeat, LanguageCode.JAVA, 479))

    @rule(channel=st.integers(0, 4), client_id=st.sampled_from(CLIENT_IDS),
          producer_group=st.sampled_from(PRODUCER_GROUPS + [None]),
          consumer_group=st.sampled_from(CONSUMER_GROUPS + [None]))
    def unregister(self, channel, client_id, producer_group, consumer_group):
        channel = self.chans[channel]
        self.both(lambda reg: reg.unregister(channel, client_id, producer_group, consumer_group))

    @rule(channel=st.integers(0, 4))
    def close(self, channel):
        channel = self.chans[channel]
        self.both(lambda reg: reg.close_channel(channel))

    @rule(channel=st.integers(0, 4), addr=st.sampled_from(ADDRESSES))
    def open_channel(self, channel, addr):
        channel = self.chans[channel]
        self.both(lambda reg: reg.open_channel(channel, addr))

    @rule(level=st.sampled_from([logging.INFO, logging.WARNING, logging.ERROR]))
    def log_level(self, level):
        """An operator changes the log level: the native rules ask it once a request."""
        clientlog.log.setLevel(level)

    @rule(disabled=st.booleans())
    def log_disabled(self, disabled):
        """logging.config disables the logger (Logger.disabled, which its level cache does not reflect; the native
        rules read that cache): both paths write nothing and count nothing against the log budget meanwhile."""
        clientlog.log.disabled = disabled

    @rule(ms=st.sampled_from([0, 1, 30_000, 60_001, 120_001]))
    def advance(self, ms):
        self.now += ms

    @rule()
    def scan(self):
        self.both(lambda reg: reg.scan_expired())

    @rule(topic=st.sampled_from(TOPICS), order=st.booleans())
    def admin_sets_order_flag(self, topic, order):
        self.both(lambda reg: reg.update_topic_config(TopicConfig(topic, order=order)))

    @rule()
    def flush(self):
        self.both(lambda reg: reg.flush_notifications(force=True))

    @invariant()
    def same_state(self):
        assert state(self.native) == state(self.twin)
        self.native.check_invariants()


SETTINGS = settings(max_examples=80, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def machine(name, **config):
    cls = type(name, (RulesMachine,), {"config": RegistryConfig(client_log_lines_per_minute=3, **config)})
    case = cls.TestCase
    case.settings = SETTINGS
    return case


TestRulesDefaults = machine("RulesDefaults")
TestRulesRejectPullNoAutoCreate = machine("RulesRejectPullNoAutoCreate", reject_pull_consumer_enable=True,
                                          auto_create_subscription_group=False)
TestRulesCoalesced = machine("RulesCoalesced", notify_coalesce_window_ms=1000, v2_restart_safe=False)
TestRulesNotifyOff = machine("RulesNotifyOff", notify_consumer_ids_changed_enable=False)
TestRules4x = machine("Rules4x", client_management_rules=4)  # the broker's default (clientManagementRules=4)
TestRules4xNoAutoCreate = machine("Rules4xNoAutoCreate", client_management_rules=4,
                                  auto_create_subscription_group=False)
TestRulesTightBudgets = machine("RulesTightBudgets", max_groups_per_channel=3, max_groups=4, max_memberships=6)


# ------------------------------------------------------------------------------------------ what the native path takes


def consumer(group, topics, version=1, model=MessageModel.CLUSTERING, ctype=ConsumeType.CONSUME_PASSIVELY):
    return engine.ConsumerData(group, ctype, model, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                               subscriptions=tuple(engine.SubscriptionData(t, sub_version=version) for t in topics))


def run_steps(config, steps):
    """Each (channel, heartbeat) on a pair of registries, one second apart, compared after each step; returns
    whether the native rules took each one, and the native registry with its events."""
    t = [0]
    (native, native_events), (twin, twin_events) = pair(config, lambda: t[0])
    rules = native._rules
    taken = []
    for channel, heartbeat in steps:
        heartbeat = native_model(heartbeat)
        before = rules.taken
        t[0] += 1000
        assert native.heartbeat(channel, heartbeat, LanguageCode.JAVA, 479) == \
            twin.heartbeat(channel, heartbeat, LanguageCode.JAVA, 479)
        taken.append(rules.taken - before)
        assert state(native) == state(twin)
        assert [registry_event_key(e) for e in native_events] == [registry_event_key(e) for e in twin_events]
    return taken, native, twin, native_events


def test_the_native_path_takes_the_common_heartbeats(lines):
    steps = [
        (1, hb("c1", [("G1", ["T1"])], ["P1"])),  # new groups: declined (created by the Python path)
        (2, hb("c2", [("G1", ["T1"])], ["P1"])),  # a new client of existing groups: taken
        (2, hb("c2", [consumer("G1", ["T1"], version=2)], ["P1"])),  # a subVersion bump: taken
        (2, hb("c2", [consumer("G1", ["T1", "T2"], version=2)], ["P1"])),  # a topic added: taken
        (2, hb("c2", [consumer("G1", ["T2"], version=2)], ["P1"])),  # a topic dropped: taken
        (2, hb("c2", [consumer("G1", ["T2"], model=MessageModel.BROADCASTING)], ["P1"])),  # settings: taken
        (3, hb("c3", [("G2", ["T1"])])),  # a new group: declined
        (2, hb("c9", [consumer("G1", ["T2"])])),  # another client id on the channel: declined
        (2, hb("c9", [consumer("G1", ["T2"])], fingerprint=5)),  # a fingerprint change: declined
        (2, hb("c9", [consumer("G1", ["T2"])], fingerprint=5, without_sub=True)),  # light V2: declined
        (4, hb("c4", [("G1", ["T1"])], ["P1"], fingerprint=5)),  # a new client, V2, the group's fingerprint: taken
    ]
    taken, _, _, _ = run_steps(RegistryConfig(), steps)
    assert taken == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1]
    assert any("new consumer connected" in line for line in lines.lines)


def test_a_declined_heartbeat_changed_nothing():
    (native, _), _ = pair()
    native.heartbeat(1, hb("c1", [("G1", ["T1"])], ["P1"]), LanguageCode.JAVA, 479)
    rules = native._rules
    before = state(native)
    for declined in (hb("c1", [("G2", ["T1"])]), hb("c1", producers=["P2"]), hb(None, [("G1", ["T1"])]),
                     hb("c2", [("G1", ["T1"])]), hb("c1", [("G1", ["T1"])], fingerprint=3)):
        slot = native._find_slot(1)
        assert rules.heartbeat(1, slot, native_model(declined), LanguageCode.JAVA, 479) is None
        assert state(native) == before
    accepted = native_model(hb("c1", [("G1", ["T1"])]))
    for language, version in ((LanguageCode.JAVA, 1 << 31), ("JAVA", 1), (LanguageCode.JAVA, 1.0)):
        assert rules.heartbeat(1, native._find_slot(1), accepted, language, version) is None
        assert state(native) == before
    from engine.codec import _heartbeat_py

    twin_decoded = _heartbeat_py.HeartbeatData("c1", (), (_heartbeat_py.ConsumerData("G1"),))
    assert rules.heartbeat(1, native._find_slot(1), twin_decoded, LanguageCode.JAVA, 479) is None
    assert state(native) == before
    assert rules.heartbeat(1, native._find_slot(1), accepted, LanguageCode.JAVA, 479) is not None


def test_events_other_than_change_keep_the_python_path():
    built = registry_module._HeartbeatRules is not None  # not under ENGINE_NO_EXTENSIONS=1 (twin table and pool)
    assert (ClientRegistry()._rules is not None) == built
    assert (ClientRegistry(listener=lambda e: None, events=CHANGE)._rules is not None) == built
    assert ClientRegistry(listener=lambda e: None)._rules is None
    assert (ClientRegistry(RegistryConfig(client_management_rules=4))._rules is not None) == built


def test_the_native_path_takes_the_common_heartbeats_under_4x_rules(lines):
    """The broker's default rules (clientManagementRules=4): no fingerprints, BROADCASTING groups notified too."""
    steps = [
        (1, hb("c1", [("G1", ["T1"])], ["P1"])),  # new groups: declined
        (2, hb("c2", [("G1", ["T1"])], ["P1"], fingerprint=7)),  # a new client (fingerprints ignored): taken
        (2, hb("c2", [consumer("G1", ["T1", "T2"], model=MessageModel.BROADCASTING)], ["P1"])),  # taken
        (3, hb("c3", [consumer("G1", ["T2"], model=MessageModel.BROADCASTING)])),  # taken: CHANGE for BROADCASTING
    ]
    taken, native, twin, native_events = run_steps(RegistryConfig(client_management_rules=4), steps)
    assert taken == [0, 1, 1, 1]
    assert any(registry_event_key(e)[1] == "G1" for e in native_events)  # CHANGE for the BROADCASTING group
    assert native.close_channel(3) == twin.close_channel(3)
    assert state(native) == state(twin)


@pytest.mark.parametrize("language, version, answer", [
    (LanguageCode.JAVA, 1 << 63, (ResponseCode.SYSTEM_ERROR, "version must fit in int32")),
    (LanguageCode.JAVA, -(1 << 64), (ResponseCode.SYSTEM_ERROR, "version must fit in int32")),
    ("JAVA", 479, (ResponseCode.SYSTEM_ERROR, "bad language or version")),
    (1 << 70, 479, (ResponseCode.SUCCESS, None)),  # not a language code: registered without one
])
def test_a_header_the_digest_cannot_take_is_answered_not_raised(language, version, answer):
    """An API caller's language or version outside int64 (the frame codec reads int32s) on an armed slot: the
    fast path's digest check once raised; the answer is the Python path's, in both registries."""
    for reg, _ in pair():
        data = native_model(hb("c1", [("G1", ["T1"])], ["P1"]))
        for _ in range(3):  # register, arm, repeat
            assert reg.heartbeat(1, data, LanguageCode.JAVA, 479).code == 0
        assert reg.channel_table.armed(reg._find_slot(1))
        result = reg.heartbeat(1, data, language, version)
        assert (result.code, result.remark) == answer
        reg.check_invariants()


@pytest.mark.parametrize("rules", [4, 5])
def test_a_repeat_is_answered_on_its_token_until_the_arming_changes(rules):
    """The repeat route's check (heartbeat_repeat) in C: a token answers, the slot touched, in both registries;
    after a config change, a group change, a re-arming or a close the same token is refused, nothing done. The
    machine above compares the two on tokens held across random steps."""
    now = [1_000]
    (native, _), (twin, _) = pair(RegistryConfig(client_management_rules=rules), lambda: now[0])
    assert native.heartbeat_repeat.__self__ is native._rules and twin._rules is None
    data = native_model(hb("c1", [("G1", ["T1"])], ["P1"]))
    other = native_model(hb("c2", [consumer("G1", ["T1", "T2"])]))

    def tokens():
        for reg in (native, twin):
            for _ in range(2):  # register, then arm
                assert reg.heartbeat(1, data, LanguageCode.JAVA, 479).code == 0
        out = [reg.repeat_token(1, data, LanguageCode.JAVA, 479) for reg in (native, twin)]
        assert None not in out
        return out

    def repeat(toks):
        now[0] += 5
        got = [reg.heartbeat_repeat(t) for reg, t in zip((native, twin), toks)]
        assert got[0] == got[1]
        assert state(native) == state(twin)
        return got[0]

    toks = tokens()
    assert repeat(toks) is not None and repeat(toks) is not None
    slot = native._find_slot(1)
    assert native.channel_table.member_time(slot, native.channel_table.mem_keys(slot)[0]) == now[0]  # touched
    # the registry's clock is read at each call, as the Python method does (a test may replace it, as
    # test_grpc_endpoint's repeat test does)
    for reg in (native, twin):
        reg._clock = lambda: 7_000_000
    assert repeat(toks) is not None
    assert native.channel_table.member_time(slot, native.channel_table.mem_keys(slot)[0]) == 7_000_000
    for reg in (native, twin):
        reg._clock = lambda: now[0]
    for change in (lambda reg: reg.update_topic_config(TopicConfig("T9")),  # the config epoch moves
                   lambda reg: reg.heartbeat(2, other, LanguageCode.JAVA, 479),  # the group's subscriptions change
                   lambda reg: reg.heartbeat(1, data, LanguageCode.JAVA, 480),  # another header re-arms the slot
                   lambda reg: reg.close_channel(1)):  # the slot is freed
        for reg in (native, twin):
            change(reg)
        assert repeat(toks) is None
        toks = tokens()
    for bogus in ((10**30, None, None), (-1, None, None)):  # a slot the table does not have: refused, as the twin
        assert native.heartbeat_repeat(bogus) is None and twin.heartbeat_repeat(bogus) is None


def test_the_consumer_list_is_read_in_c_in_member_order():
    """GET_CONSUMER_LIST_BY_GROUP's list (consumer_ids) from the native rules: the members' client ids in the
    member array's order (a close moves the last member into the freed place), "" and non-ASCII ids as the pool
    holds them, [] for a group that is not live; the same as the Python method's (the machine compares them at
    every step)."""
    (native, _), (twin, _) = pair(RegistryConfig(client_management_rules=4))
    assert native.consumer_ids.__self__ is native._rules and twin._rules is None
    ids = ["c0", "", "c\u00e9\U0001f600", "c3"]
    for reg in (native, twin):
        for n, cid in enumerate(ids):
            assert reg.heartbeat(n, native_model(hb(cid, [("G1", ["T1"])])), LanguageCode.JAVA, 479).code == 0
    assert native.consumer_ids("G1") == twin.consumer_ids("G1") == ids
    for reg in (native, twin):
        reg.close_channel(1)
    assert native.consumer_ids("G1") == twin.consumer_ids("G1") == ["c0", "c3", "c\u00e9\U0001f600"]
    assert native.consumer_ids("G2") == twin.consumer_ids("G2") == []

"""Any interleaving of heartbeats, unregisters, closes, clock steps and scans: the registry matches the reference
model (test_registry_model.RefRegistry) in every answer, event and query, its tables stay consistent (no slot in a
group after removal, interned ids bounded by what live channels reference), and the native and twin expiry
scans and the channel table's own scan agree on its columns."""
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_registry_model import (
    CLIENT_IDS,
    CONSUMER_GROUPS,
    LANGUAGES,
    PRODUCER_GROUPS,
    TOPICS,
    VERSIONS,
    RefRegistry,
    heartbeats,
    registry_event_key,
    registry_snapshot,
)

import engine.registry._expiry_py as expiry_twin
from engine.registry.client_registry import ClientRegistry, RegistryConfig
from engine.registry.store import TopicConfig

try:
    import engine.registry._expiry as expiry_native
except ImportError:  # pragma: no cover - twin-only environments
    expiry_native = None

CHANNELS = st.integers(0, 4)
ADDRESSES = ["10.0.0.1:4000", "[::1]:5000", "host-a:1", ""]


class RegistryMachine(RuleBasedStateMachine):
    config = RegistryConfig()

    def __init__(self):
        super().__init__()
        self.now = 1_000_000
        clock = lambda: self.now  # noqa: E731
        self.events = []
        self.reg = ClientRegistry(self.config, clock=clock, listener=self.events.append)
        self.ref = RefRegistry(self.config, clock)
        self.last_hb = {}

    def compare_events(self):
        ours = sorted(map(repr, (registry_event_key(e) for e in self.events)))
        theirs = sorted(map(repr, self.ref.events))
        self.events.clear()
        self.ref.events.clear()
        assert ours == theirs

    @rule(channel=CHANNELS, data=heartbeats, language=st.sampled_from(LANGUAGES), version=st.sampled_from(VERSIONS))
    def heartbeat(self, channel, data, language, version):
        self.last_hb[channel] = (data, language, version)
        self.send(channel, data, language, version)

    @precondition(lambda self: self.last_hb)
    @rule(data=st.data(), repeats=st.integers(1, 3))
    def repeat_heartbeat(self, data, repeats):
        """The same heartbeat again (what clients do every 30 s): exercises the fast path."""
        channel = data.draw(st.sampled_from(sorted(self.last_hb)))
        for _ in range(repeats):
            self.send(channel, *self.last_hb[channel])

    def send(self, channel, data, language, version):
        ours = self.reg.heartbeat(channel, data, language, version)
        theirs = self.ref.heartbeat(channel, data, language, version)
        if theirs == ("error",):
            assert ours.code != 0 and ours.ext_fields is None
        else:
            assert ours.code == 0 and ours.is_sub_change == theirs[1]

    @rule(channel=CHANNELS, client_id=st.sampled_from(CLIENT_IDS + [None]),
          producer_group=st.sampled_from(PRODUCER_GROUPS + ["", None]),
          consumer_group=st.sampled_from(CONSUMER_GROUPS + ["", None]))
    def unregister(self, channel, client_id, producer_group, consumer_group):
        code, _ = self.reg.unregister(channel, client_id, producer_group, consumer_group)
        theirs = self.ref.unregister(channel, client_id, producer_group, consumer_group)
        assert (code == 0) == (theirs == ("ok",))

    @rule(channel=CHANNELS)
    def close(self, channel):
        self.reg.close_channel(channel)
        self.ref.close(channel)
        self.last_hb.pop(channel, None)

    @rule(channel=CHANNELS, addr=st.sampled_from(ADDRESSES))
    def open_channel(self, channel, addr):
        if self.reg.channel_info(channel) is None and channel not in self.ref.addr:
            self.reg.open_channel(channel, addr)
            if addr:
                self.ref.addr[channel] = addr

    @rule(ms=st.sampled_from([0, 1, 999, 10_000, 30_000, 59_999, 60_000, 60_001, 119_999]))
    def advance(self, ms):
        self.now += ms

    @rule()
    def scan(self):
        lu, live = self.reg.channel_table.columns()
        twin = expiry_twin.scan_expired(lu, live, self.now, self.reg._timeout)
        if expiry_native is not None:
            assert np.array_equal(expiry_native.scan_expired(lu, live, self.now, self.reg._timeout), twin)
        # the table's own scan (the registry's) over the same columns
        assert self.reg.channel_table.scan(self.now, self.reg._timeout) == twin.tolist()
        closed = self.reg.scan_expired()
        assert len(closed) == len(set(closed))
        assert set(closed) == self.ref.scan()

    @rule(topic=st.sampled_from(TOPICS), order=st.booleans())
    def admin_sets_order_flag(self, topic, order):
        """An admin update of a topic's order flag (it feeds hasOrderTopicSub and the retry topic's flag)."""
        self.reg.update_topic_config(TopicConfig(topic, order=order))
        self.ref.store.topics.put(TopicConfig(topic, order=order))

    @invariant()
    def agrees_with_the_model(self):
        self.compare_events()
        assert registry_snapshot(self.reg) == self.ref.snapshot()

    @invariant()
    def tables_are_consistent(self):
        self.reg.check_invariants()
        stats = self.reg.stats()
        # interned strings: at most a client id and an address per open channel, plus one per membership
        # whose client id differs from its channel's, plus the producer client table
        bound = 2 * stats["channels"] + stats["consumer_memberships"] + stats["producer_memberships"]
        assert stats["interned_strings"] <= bound
        assert stats["interned_groups"] <= stats["consumer_groups"] + stats["producer_groups"]


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def machine(name, **config):
    cls = type(name, (RegistryMachine,), {"config": RegistryConfig(**config)})
    case = cls.TestCase
    case.settings = SETTINGS
    return case


TestDefaults = machine("Defaults")
TestShortConsumerTimeout = machine("ShortConsumerTimeout", channel_expired_timeout_ms=60_000)
TestLongConsumerTimeout = machine("LongConsumerTimeout", channel_expired_timeout_ms=200_000)
TestRejectPullNoAutoCreate = machine("RejectPullNoAutoCreate", reject_pull_consumer_enable=True,
                                     auto_create_subscription_group=False)
TestNotifyOffJavaV2 = machine("NotifyOffJavaV2", notify_consumer_ids_changed_enable=False, v2_restart_safe=False)


class _DefaultsLong(RegistryMachine):
    pass


TestDefaultsLong = pytest.mark.slow(_DefaultsLong.TestCase)
TestDefaultsLong.settings = settings(max_examples=600, stateful_step_count=80, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

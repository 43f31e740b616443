"""Expiry with a driven clock (PROTOCOL.md 6.6.6, 6.8, 6.9, pitfall 9): the housekeeping scan runs every 10 s from
10 s after start; an entry silent for more than 120 s (strictly) is removed without UNREGISTER or CHANGE and its
channel is handed back to be closed. Runs with the native and the twin channel table."""
import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_registry_model import hb

import engine
import engine.registry.client_registry as registry_module
from engine.registry.client_registry import ClientRegistry, ConsumerGroupEvent, ProducerGroupEvent, RegistryConfig

CE, PE = ConsumerGroupEvent, ProducerGroupEvent
HEARTBEAT_PERIOD = 30_000
SCAN_PERIOD = 10_000


@pytest.fixture
def scan_impl(impl, monkeypatch):
    """Run the registry with the native or the twin channel table (whose scan is the expiry scan)."""
    module = importlib.import_module("engine.registry._channel_table" if impl.name == "native"
                                     else "engine.registry._channel_table_py")
    monkeypatch.setattr(registry_module, "_ChannelTable", module.ChannelTable)
    return impl.name


class Broker:
    """A registry plus the broker's housekeeping timer, on a simulated clock (ms since start)."""

    def __init__(self, **config):
        self.now = 0
        self.events = []
        self.closed = {}  # channel -> time it was handed back for closing
        self.reg = ClientRegistry(RegistryConfig(**config), clock=lambda: self.now, listener=self.events.append)

    def run_until(self, t, heartbeats=()):
        """Advance to ``t``, delivering scans (every 10 s) and ``heartbeats`` [(time, channel, hb)] in order."""
        timeline = [(at, 1, ch, data) for at, ch, data in heartbeats]
        first_scan = ((self.now // SCAN_PERIOD) + 1) * SCAN_PERIOD
        timeline += [(at, 0, None, None) for at in range(first_scan, t + 1, SCAN_PERIOD)]
        for at, kind, channel, data in sorted(timeline, key=lambda x: (x[0], x[1])):
            self.now = at
            if kind == 1:
                if channel not in self.closed:
                    assert self.reg.heartbeat(channel, data).code == 0
            else:
                for ch in self.reg.scan_expired():
                    self.closed.setdefault(ch, at)
                    self.reg.close_channel(ch)  # what the server does once the connection is closed
                self.reg.check_invariants()
        self.now = t


def periodic(channel, data, start, stop):
    return [(t, channel, data) for t in range(start, stop, HEARTBEAT_PERIOD)]


def vector_heartbeats(vectors):
    out = {}
    for client, entry, raw in vectors:
        if entry["code"] == 34:
            out[client] = engine.decode_heartbeat(engine.decode_frame(raw).body)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 60_000), rounds=st.integers(1, 6))
def test_silent_client_is_gone_between_120_and_130_s_and_a_live_one_never(scan_impl, vectors, start, rounds):
    hbs = vector_heartbeats(vectors)
    b = Broker()
    silent = periodic("silent", hbs["ali-ons"], start, start + rounds * HEARTBEAT_PERIOD)
    last = silent[-1][0]
    live = periodic("live", hbs["cpp-rocketmq-0.4.4"], start + 1234, 3_600_000)
    b.run_until(3_600_000, silent + live)
    assert "live" not in b.closed
    assert last + 120_000 < b.closed["silent"] <= last + 130_000
    assert b.reg.consumer_ids("CID_CppCluster") == ["12098-127.0.0.1@DEFAULT"]
    assert b.reg.channel_groups("silent") == ((), ())


def test_expiry_is_strictly_greater_than_the_timeout(scan_impl):
    b = Broker()
    b.reg.heartbeat(1, hb("a@1", consumers=[("G", ["T"])]))
    b.now = 120_000
    assert b.reg.scan_expired() == []
    b.now = 120_001
    assert b.reg.scan_expired() == [1]


def test_scan_removes_silently_and_the_later_close_finds_nothing(scan_impl):
    b = Broker()
    b.reg.heartbeat(1, hb("a@1", consumers=[("G", ["T"])], producers=["P"]))
    b.reg.heartbeat(2, hb("b@2", consumers=[("G", ["T"])]))
    b.now = 60_000
    b.reg.heartbeat(2, hb("b@2", consumers=[("G", ["T"])]))
    b.events.clear()
    b.now = 125_000
    assert b.reg.scan_expired() == [1]
    kinds = [(e.kind, e.group) for e in b.events]
    assert kinds == [(PE.CLIENT_UNREGISTER, "P"), (PE.GROUP_UNREGISTER, "P"), (CE.CLIENT_UNREGISTER, "G")]
    assert b.reg.consumer_ids("G") == ["b@2"]  # the survivor learns at its next rebalance, not by NOTIFY
    b.events.clear()
    assert b.reg.close_channel(1) is False and b.events == []
    assert b.reg.scan_expired() == []


def test_an_expired_group_is_dropped_without_unregister_event(scan_impl):
    b = Broker()
    b.reg.heartbeat(1, hb("a@1", consumers=[("G", ["T"])]))
    b.events.clear()
    b.now = 200_000
    assert b.reg.scan_expired() == [1]
    assert [(e.kind, e.group) for e in b.events] == [(CE.CLIENT_UNREGISTER, "G")]
    assert b.reg.consumer_groups() == []
    assert b.reg.topic_consumed_by("T") == {"G"}  # Java's scan does not clear topicGroupTable


def test_a_group_the_client_stops_naming_expires_and_closes_the_channel(scan_impl):
    b = Broker()
    both = hb("a@1", consumers=[("G", ["T"]), ("H", ["T"])])
    only_g = hb("a@1", consumers=[("G", ["T"])])
    b.reg.heartbeat(1, both)
    b.reg.heartbeat(2, hb("b@2", consumers=[("H", ["T"])]))
    hbs = periodic(1, only_g, 30_000, 300_000) + periodic(2, hb("b@2", consumers=[("H", ["T"])]), 30_000, 300_000)
    b.events.clear()
    b.run_until(300_000, hbs)
    assert 120_000 < b.closed[1] <= 130_000  # H's entry went stale: Java closes the whole connection
    # the scan removed H silently; the close removed G with the usual events
    kinds = [(e.kind, e.group) for e in b.events if e.kind is not CE.REGISTER]
    assert kinds[:1] == [(CE.CLIENT_UNREGISTER, "H")]
    assert (CE.UNREGISTER, "G") in kinds and (CE.CHANGE, "G") in kinds
    assert b.reg.consumer_ids("H") == ["b@2"]


def test_producer_timeout_is_fixed_while_the_consumer_one_is_configurable(scan_impl):
    b = Broker(channel_expired_timeout_ms=60_000)
    b.reg.heartbeat(1, hb("a@1", producers=["P"]))
    b.reg.heartbeat(2, hb("b@2", consumers=[("G", ["T"])]))
    b.now = 60_001
    assert b.reg.scan_expired() == [2]
    b.now = 120_000
    assert b.reg.scan_expired() == []
    b.now = 120_001
    assert b.reg.scan_expired() == [1]

    b = Broker(channel_expired_timeout_ms=300_000)
    b.reg.heartbeat(1, hb("a@1", consumers=[("G", ["T"])], producers=["P"]))
    b.now = 120_001
    assert b.reg.scan_expired() == [1]  # the producer entry expired; the consumer one is still fresh
    assert b.reg.channel_groups(1) == (("G",), ())
    b.now = 300_001
    assert b.reg.scan_expired() == [1]  # handed back again if the server did not close it
    assert b.reg.channel_groups(1) == ((), ())


def test_open_channels_without_registrations_never_expire(scan_impl):
    b = Broker()
    b.reg.open_channel(1, "127.0.0.1:9")
    b.reg.heartbeat(2, hb("b@2"))  # a heartbeat with no groups registers nothing either
    b.now = 10**9
    assert b.reg.scan_expired() == []


def test_heartbeat_on_a_channel_handed_back_but_not_yet_closed(scan_impl):
    b = Broker()
    b.reg.heartbeat(1, hb("a@1", consumers=[("G", ["T"])]))
    b.now = 130_000
    assert b.reg.scan_expired() == [1]
    b.reg.heartbeat(1, hb("a@1", consumers=[("G", ["T"])]))  # raced the close: registers again
    assert b.reg.consumer_ids("G") == ["a@1"]
    b.reg.close_channel(1)
    assert b.reg.consumer_groups() == []


def test_fast_path_keeps_expiry_exact(scan_impl):
    b = Broker()
    data = hb("a@1", consumers=[("G", ["T"])], producers=["P"])
    b.run_until(600_000, periodic(1, data, 0, 600_000))
    assert 1 not in b.closed
    assert b.reg.channel_table.armed(b.reg.channel_table.find(1))  # the repeated heartbeats went through the fast path
    b.run_until(800_000)
    assert 570_000 + 120_000 < b.closed[1] <= 570_000 + 130_000

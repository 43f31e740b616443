"""engine.registry.producer_manager.ProducerManager on its own: the group table and the client channel table over the
registry's channel table (registration, unregister, close, expiry scan, admin 204 listing, invariants), under both
rule sets. The registry's rule tests (test_registry*.py) exercise it through the facade."""
import logging

import pytest
from test_registry_model import hb

from engine.registry.client_channel import PRODUCER, ClientChannelInfo
from engine.codec.enums import LanguageCode
from engine.registry.producer_manager import (
    PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS,
    ProducerConnection,
    ProducerGroupEvent,
    ProducerManager,
)
from engine.registry.client_registry import ClientRegistry, RegistryConfig

PE = ProducerGroupEvent
A, B = "10.0.0.1@1", "10.0.0.2@2"


class Table:
    """A channel table (the registry) with a driven clock and its events; ``pm`` is its ProducerManager."""

    def __init__(self, rules=5):
        self.now = 1_000
        self.events = []
        self.reg = ClientRegistry(RegistryConfig(client_management_rules=rules), clock=lambda: self.now,
                                  listener=self.events.append)
        self.pm = self.reg.producers

    def take(self):
        out = [(e.kind, e.group, e.client.client_id if e.client is not None else None)
               for e in self.events if isinstance(e.kind, ProducerGroupEvent)]
        self.events.clear()
        return out

    def register(self, channel, client_id, *groups, addr=""):
        """registerProducer of each group for a heartbeat on ``channel`` (what ClientRegistry.heartbeat does)."""
        reg = self.reg
        if addr:
            reg.open_channel(channel, addr)
        slot = reg._slot_for(channel)
        cid = reg._pool.intern(client_id)
        reg._request = (channel, client_id, LanguageCode.JAVA, 479, self.now, slot)
        reg._dirty = False
        keys = [self.pm.register(g, slot, (cid, int(LanguageCode.JAVA), 479)) for g in groups]
        reg._pool.release(cid)
        return slot, keys


@pytest.fixture(params=[5, 4], ids=["rules5", "rules4"])
def t(request):
    return Table(request.param)


def test_the_facade_composes_one_manager_over_its_table():
    reg = ClientRegistry()
    assert isinstance(reg.producers, ProducerManager) and reg.producers.table is reg
    assert reg._producers is reg.producers.group_table  # one group table, not a copy


def test_register_creates_the_group_and_the_client_table_entry(t):
    slot, (key,) = t.register(7, A, "P", addr="10.0.0.1:5000")
    g = t.pm.group_table["P"]
    assert key == g.key == g.gid * 2 + PRODUCER and t.pm.by_gid[g.gid] is g
    assert g.members.tolist() == [slot] and t.reg._dirty
    assert t.pm.find_channel(A) == 7 and t.pm.find_channel(B) is None
    assert t.pm.groups() == ["P"]
    # the same registration again changes nothing (the fast path may arm)
    t.reg._dirty = False
    assert t.register(7, A, "P")[1] == [key] and not t.reg._dirty
    assert g.members.n == 1
    t.reg.check_invariants()


def test_the_admin_listing_204(t):
    t.register(1, A, "P", addr="10.0.0.1:5000")
    t.register(2, B, "P", addr="10.0.0.2:5001")
    conn = t.pm.connection("P")
    assert isinstance(conn, ProducerConnection)
    assert conn.to_dict() == {"connectionSet": [
        {"clientAddr": "10.0.0.1:5000", "clientId": A, "language": "JAVA", "version": 479},
        {"clientAddr": "10.0.0.2:5001", "clientId": B, "language": "JAVA", "version": 479}]}
    assert t.pm.connection("nope") is None and t.pm.channels("nope") == []
    chans = t.pm.channels("P")
    assert [c.channel for c in chans] == [1, 2] and all(isinstance(c, ClientChannelInfo) for c in chans)
    # the facade answers from the manager
    assert t.reg.producer_connection("P").to_dict() == conn.to_dict()
    assert t.reg.producer_channels("P") == chans and t.reg.producer_groups() == ["P"]


def test_unregister_removes_the_member_the_entry_and_the_emptied_group(t):
    t.register(1, A, "P", "Q")
    t.take()
    t.reg.unregister(1, A, producer_group="P")
    expected = [(PE.GROUP_UNREGISTER, "P", None)]  # 4.9 has no CLIENT_UNREGISTER event
    assert t.take() == (expected if t.reg._rules4 else [(PE.CLIENT_UNREGISTER, "P", A)] + expected)
    assert "P" not in t.pm.group_table and t.pm.groups() == ["Q"]
    assert t.pm.find_channel(A) is None  # the request's client id, unconditionally, as Java does
    t.reg.check_invariants()
    # a group that does not exist, or an unknown channel: nothing happens
    t.reg.unregister(1, A, producer_group="nope")
    t.reg.unregister(99, A, producer_group="Q")
    assert t.pm.group_table["Q"].members.n == 1
    t.reg.check_invariants()


def test_unregister_with_another_client_id_leaves_a_stale_entry_that_dies_with_the_slot(t):
    slot, _ = t.register(1, A, "P")
    t.reg.unregister(1, B, producer_group="P")
    assert t.pm.find_channel(A) == 1 and t.pm.stale == {slot: {t.reg._pool.lookup(A)}}
    t.reg.check_invariants()
    t.reg.close_channel(1)
    assert t.pm.find_channel(A) is None and t.pm.stale == {}
    t.reg.check_invariants()


def test_close_removes_every_producer_membership_first(t):
    t.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])], producers=["P", "Q"]))
    t.reg.heartbeat(2, hb(B, producers=["Q"]))
    t.events.clear()
    assert t.reg.close_channel(1)
    kinds = [(e.kind, e.group) for e in t.events]
    producer_part = [k for k in kinds if isinstance(k[0], ProducerGroupEvent)]
    if t.reg._rules4:  # 4.9 has no CLIENT_UNREGISTER
        assert producer_part == [(PE.GROUP_UNREGISTER, "P")]
    else:
        assert producer_part == [(PE.CLIENT_UNREGISTER, "P"), (PE.GROUP_UNREGISTER, "P"), (PE.CLIENT_UNREGISTER, "Q")]
    first_consumer = next(i for i, k in enumerate(kinds) if not isinstance(k[0], ProducerGroupEvent))
    assert all(isinstance(k[0], ProducerGroupEvent) for k in kinds[:first_consumer]) and first_consumer > 0
    assert t.pm.groups() == ["Q"] and t.pm.group_table["Q"].members.n == 1
    assert t.pm.find_channel(A) is None and t.pm.find_channel(B) == 2
    t.reg.check_invariants()


def test_a_consumer_only_channel_closes_without_the_manager(t, monkeypatch):
    t.reg.heartbeat(1, hb(A, consumers=[("G", ["T"])]))
    calls = []
    real = ProducerManager.close_channel
    monkeypatch.setattr(ProducerManager, "close_channel", lambda self, *a: (calls.append(a), real(self, *a)))
    t.reg.close_channel(1)
    assert calls == []
    t.reg.heartbeat(2, hb(B, producers=["P"]))
    t.reg.close_channel(2)
    assert len(calls) == 1


def test_the_scan_expires_producers_after_the_fixed_timeout_only(t, caplog):
    t.reg.heartbeat(1, hb(A, producers=["P"]))
    t.reg.heartbeat(2, hb(B, producers=["P"]))
    t.now += 60_000
    t.reg.heartbeat(2, hb(B, producers=["P"]))
    t.events.clear()
    t.now += PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS - 60_000  # channel 1 exactly at the timeout: not yet
    assert t.reg.scan_expired() == []
    t.now += 1
    with caplog.at_level(logging.WARNING, logger="RocketmqBroker"):
        assert t.reg.scan_expired() == [1]
    prefix = "SCAN" if t.reg._rules4 else "ProducerManager#scanNotActiveChannel"
    assert any(r.getMessage().startswith(prefix + ": remove expired channel[") for r in caplog.records)
    assert [m.channel for m in t.pm.channels("P")] == [2]
    assert t.pm.find_channel(A) is None and t.pm.find_channel(B) == 2
    if not t.reg._rules4:
        assert t.take() == [(PE.CLIENT_UNREGISTER, "P", A)]
    t.reg.close_channel(1)
    t.reg.check_invariants()


def test_the_scan_keeps_a_client_entry_that_moved_to_another_channel(t):
    t.reg.heartbeat(1, hb(A, producers=["P"]))
    t.now += 100_000
    t.reg.heartbeat(2, hb(A, producers=["P"]))  # the client reconnected: its entry points at channel 2
    assert t.pm.find_channel(A) == 2
    t.now += 30_000
    assert t.reg.scan_expired() == [1]
    assert t.pm.find_channel(A) == 2  # only the expired slot's own entry goes (only_slot)
    t.reg.close_channel(1)
    t.reg.check_invariants()


def test_the_client_table_grows_past_its_initial_size(t):
    for i in range(200):
        t.reg.heartbeat(i, hb(f"10.1.{i}.1@1", producers=[f"P{i % 3}"]))
    ct = t.reg.channel_table  # the client table is its client slot column
    assert ct.client_slots_capacity() >= 200 and t.pm.nbytes() == ct.client_slots_nbytes() == 4 * ct.client_slots_capacity()
    assert all(t.pm.find_channel(f"10.1.{i}.1@1") == i for i in range(200))
    assert sorted(t.pm.groups()) == ["P0", "P1", "P2"]
    for i in range(0, 200, 2):
        t.reg.close_channel(i)
    assert sum(1 for _ in t.pm.client_table_items()) == 100
    t.reg.check_invariants()


def test_the_invariant_check_can_fail(t):
    t.register(1, A, "P")
    g = t.pm.group_table["P"]
    t.pm.by_gid[g.gid] = None
    with pytest.raises(AssertionError):
        t.pm.check_invariants()
    t.pm.by_gid[g.gid] = g
    t.pm.check_invariants()
    t.pm.stale[12345] = {0}  # a free slot
    with pytest.raises(AssertionError):
        t.pm.check_invariants()

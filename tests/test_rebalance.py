"""RebalanceLockManager (LOCK_BATCH_MQ 41 / UNLOCK_BATCH_MQ 42): one owner per group and queue, 60 s live time."""
import json

import pytest

from engine.codec.enums import RequestCode, ResponseCode
from engine.registry.rebalance import LOCK_MAX_LIVE_TIME_MS, RebalanceLockManager
from test_server import Client, broker, broker_factory, wait_until  # noqa: F401  (fixtures)

MQ = [("TopicA", "broker-a", q) for q in range(4)]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def mgr():
    clock = Clock()
    m = RebalanceLockManager(clock=clock)
    m.clock_obj = clock
    return m


def test_first_client_gets_every_queue_and_the_second_none(mgr):
    assert mgr.try_lock_batch("g", MQ, "c1") == MQ
    assert mgr.try_lock_batch("g", MQ, "c2") == []
    assert all(mgr.owner("g", mq) == "c1" for mq in MQ)
    # another group locks the same queues independently
    assert mgr.try_lock_batch("other", MQ, "c2") == MQ


def test_owner_renews_and_others_take_over_only_after_the_live_time(mgr):
    mgr.try_lock_batch("g", MQ[:2], "c1")
    mgr.clock_obj.t += 50  # renewal inside the 60 s
    assert mgr.try_lock_batch("g", MQ[:2], "c1") == MQ[:2]
    mgr.clock_obj.t += 59.9  # 59.9 s after the renewal: still c1's
    assert mgr.try_lock_batch("g", MQ[:2], "c2") == []
    mgr.clock_obj.t += 0.2  # > 60 s without renewal: expired, c2 takes it
    assert mgr.try_lock_batch("g", MQ[:2], "c2") == MQ[:2]
    assert mgr.owner("g", MQ[0]) == "c2"
    assert mgr.try_lock_batch("g", MQ[:2], "c1") == []


def test_exactly_the_live_time_is_not_expired(mgr):
    mgr.try_lock_batch("g", MQ[:1], "c1")
    mgr.clock_obj.t += LOCK_MAX_LIVE_TIME_MS / 1000  # Java: expired only when now - last > live time
    assert mgr.try_lock_batch("g", MQ[:1], "c2") == []


def test_partial_grant_and_unlock_releases_only_own_locks(mgr):
    mgr.try_lock_batch("g", MQ[:2], "c1")
    assert mgr.try_lock_batch("g", MQ, "c2") == MQ[2:]
    assert mgr.unlock_batch("g", MQ, "c2") == 2  # c1's two queues stay locked
    assert [mgr.owner("g", mq) for mq in MQ] == ["c1", "c1", None, None]
    assert mgr.unlock_batch("missing-group", MQ, "c1") == 0
    assert mgr.unlock_batch("g", MQ, "c1") == 2
    assert mgr.table == {} and mgr.entries == 0


def test_duplicates_in_a_request_count_once(mgr):
    assert mgr.try_lock_batch("g", [MQ[0], MQ[0]], "c1") == [MQ[0]]
    assert mgr.entries == 1


def test_table_is_bounded_and_expired_entries_are_purged():
    clock = Clock()
    m = RebalanceLockManager(max_entries=3, clock=clock)
    assert m.try_lock_batch("g", MQ, "c1") == MQ[:3]
    assert m.refused == 1
    clock.t += 61
    assert m.purge_expired() == 3 and m.entries == 0 and m.table == {}
    assert m.try_lock_batch("g", MQ, "c2") == MQ[:3]


def _lock_body(group, client_id, mqs):
    return json.dumps({"consumerGroup": group, "clientId": client_id, "onlyThisBroker": False,
                       "mqSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in mqs]}).encode()


def _locked(resp):
    assert resp.code == ResponseCode.SUCCESS
    return sorted((m["topic"], m["brokerName"], m["queueId"]) for m in json.loads(resp.body)["lockOKMQSet"])


def test_two_orderly_consumers_of_one_group_over_the_wire(broker):
    """Two clients of one group ask for the same queues: each queue is granted to exactly one of them."""
    a, b = Client(broker.ports["main"]), Client(broker.ports["main"])
    try:
        a.heartbeat(client_id="10.0.0.1@a", group="orderly_group")
        b.heartbeat(client_id="10.0.0.2@b", group="orderly_group")
        got_a = _locked(a.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.1@a", MQ)))
        got_b = _locked(b.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.2@b", MQ)))
        assert got_a == sorted(MQ) and got_b == []
        # a renews (still all its own); b's unlock of a's queues changes nothing
        assert _locked(a.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.1@a", MQ))) == sorted(MQ)
        r = b.call(RequestCode.UNLOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.2@b", MQ))
        assert r.code == ResponseCode.SUCCESS
        assert _locked(b.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.2@b", MQ))) == []
        # a rebalance hands queues 2 and 3 to b: a unlocks them, b locks them
        assert a.call(RequestCode.UNLOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.1@a", MQ[2:])).code == 0
        assert _locked(b.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.2@b", MQ))) == sorted(MQ[2:])
        assert _locked(a.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("orderly_group", "10.0.0.1@a", MQ))) == sorted(MQ[:2])
    finally:
        a.close()
        b.close()


def test_lock_expires_after_the_configured_live_time_over_the_wire(broker_factory):
    broker = broker_factory(rebalance_lock_max_live_time=200)
    a, b = Client(broker.ports["main"]), Client(broker.ports["main"])
    try:
        assert _locked(a.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("g", "ca", MQ[:1]))) == MQ[:1]
        assert _locked(b.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("g", "cb", MQ[:1]))) == []
        # a stops renewing (killed): after the live time b gets the queue
        assert wait_until(lambda: _locked(b.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body("g", "cb", MQ[:1])))
                          == MQ[:1], timeout=3)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"consumerGroup":"g","mqSet":[]}',
                                  b'{"consumerGroup":"g","clientId":"c","mqSet":{}}',
                                  b'{"consumerGroup":"g","clientId":"c","mqSet":[{"topic":"t","brokerName":"b"}]}',
                                  b'{"consumerGroup":"g","clientId":"c","mqSet":[{"topic":"t","brokerName":"b",'
                                  b'"queueId":99999999999}]}'])
def test_malformed_lock_body_is_a_short_error(broker, body):
    c = Client(broker.ports["main"])
    try:
        for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
            r = c.call(code, {}, body)
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert "RequestBody" in r.remark and len(r.remark) < 200
    finally:
        c.close()


# --------------------------------------------------------------------------------- the manager across clients


def test_expired_locks_answer_like_missing_ones_until_purged(mgr):
    """owner() and is_lock_all_expired() see expiry at once; the entry itself goes at the next purge."""
    assert mgr.is_lock_all_expired("g")  # a group without locks (Java: no table -> true)
    mgr.try_lock_batch("g", MQ[:2], "c1")
    mgr.clock_obj.t += 30
    mgr.try_lock_batch("g", MQ[1:2], "c1")  # only queue 1 renewed
    assert not mgr.is_lock_all_expired("g")
    mgr.clock_obj.t += 31  # queue 0: 61 s without renewal, queue 1: 31 s
    assert mgr.owner("g", MQ[0]) is None and mgr.owner("g", MQ[1]) == "c1"
    assert mgr.entries == 2 and mgr.purge_expired() == 1 and mgr.entries == 1
    assert list(mgr.table["g"]) == [MQ[1]]
    mgr.clock_obj.t += 31
    assert mgr.is_lock_all_expired("g")


def test_an_owner_whose_lock_expired_gets_it_back_and_renewals_add_no_entry(mgr):
    mgr.try_lock_batch("g", MQ[:1], "c1")
    for _ in range(3):
        mgr.clock_obj.t += 59
        assert mgr.try_lock_batch("g", MQ[:1], "c1") == MQ[:1]
    assert mgr.entries == 1
    mgr.clock_obj.t += 61  # expired, nobody took it: the same client locks it again
    assert mgr.try_lock_batch("g", MQ[:1], "c1") == MQ[:1] and mgr.entries == 1
    assert mgr.try_lock_batch("g", MQ[:1], "c2") == []


def test_a_takeover_of_an_expired_lock_is_granted_at_the_budget():
    """At max_entries a new queue is refused, but an expired entry changes hands (it uses no new entry)."""
    clock = Clock()
    m = RebalanceLockManager(max_entries=2, clock=clock)
    assert m.try_lock_batch("g", MQ[:2], "c1") == MQ[:2]
    clock.t += 61
    assert m.try_lock_batch("g", MQ[:3], "c2") == MQ[:2]
    assert m.refused == 1 and m.entries == 2 and all(m.owner("g", mq) == "c2" for mq in MQ[:2])
    # c1, whose locks were taken, can release nothing of c2's
    assert m.unlock_batch("g", MQ, "c1") == 0 and m.entries == 2
    assert m.unlock_batch("g", MQ[:1], "c2") == 1
    assert m.try_lock_batch("g", MQ[2:3], "c1") == MQ[2:3] and m.entries == 2


def test_unlocking_another_clients_expired_lock_leaves_it(mgr):
    """UNLOCK releases only the caller's own entries, expired or not."""
    mgr.try_lock_batch("g", MQ[:1], "c1")
    mgr.clock_obj.t += 61
    assert mgr.unlock_batch("g", MQ[:1], "c2") == 0 and mgr.table["g"][MQ[0]][0] == "c1"
    assert mgr.unlock_batch("g", MQ[:1], "c1") == 1 and mgr.table == {}


def test_the_live_time_is_configurable():
    clock = Clock()
    m = RebalanceLockManager(lock_max_live_time_ms=1500, clock=clock)
    m.try_lock_batch("g", MQ[:1], "c1")
    clock.t += 1.5
    assert m.try_lock_batch("g", MQ[:1], "c2") == []
    clock.t += 0.01
    assert m.try_lock_batch("g", MQ[:1], "c2") == MQ[:1]

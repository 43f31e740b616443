"""Overload, as the broker protects itself (BrokerFastFailure, bounded executor queues).

* a full executor queue answers SYSTEM_BUSY "[OVERLOAD]..." at once, counted per executor;
* a request that waited in its queue past the limit (waitTimeMillsInQueue / waitTimeMillsInPullQueue) is answered
  SYSTEM_BUSY "[TIMEOUT_CLEAN_QUEUE]... period in queue: Nms, size of queue: M" instead of late, counted too;
  a oneway one is dropped (counted, not answered);
* every request gets exactly one answer, and heartbeats on other connections are answered in time throughout
  (they never queue: the heartbeat executor runs in the read callback);
* brokerFastFailureEnable=false turns the wait limit off (everything is answered, late).
"""
import re
import threading
import time
import urllib.request

import pytest

import engine
from engine.broker.config import BrokerConfig, ConfigError
from engine.codec.enums import RequestCode, ResponseCode
from engine.broker.server import OVERLOAD_REMARK
from conftest import free_port
from test_server import Client, broker_factory, consumer_ids  # noqa: F401  (fixture)

TIMEOUT_RE = re.compile(r"\[TIMEOUT_CLEAN_QUEUE\]broker busy, start flow control for a while, "
                        r"period in queue: (\d+)ms, size of queue: (\d+)$")
SLOW_CODE = 9001  # a test processor on the admin executor that costs 4 ms of loop time per request


def install_slow_processor(b, cost_s=0.004):
    def slow(conn, cmd):
        time.sleep(cost_s)  # CPU-heavy processing: holds the event loop like a busy worker pool
        return cmd.response(ResponseCode.SUCCESS)

    b.call(lambda: b.server.register_processor(SLOW_CODE, slow, b.server.executor("admin")))


def flood(client, code, n, ext=None, flag=0):
    data = b"".join(engine.RemotingCommand(code, opaque=i + 1, flag=flag, ext_fields=ext).encode() for i in range(n))
    t = threading.Thread(target=client.sock.sendall, args=(data,), daemon=True)
    t.start()
    return t


def collect(client, n, timeout=30.0):
    """The n answers to opaques 1..n, each exactly once."""
    got = {}
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        r = client.read(timeout=max(0.1, deadline - time.monotonic()), pred=lambda c: c.is_response)
        assert r.opaque not in got, f"two answers to opaque {r.opaque}"
        got[r.opaque] = r
    assert sorted(got) == list(range(1, n + 1)), f"{n - len(got)} requests never answered"
    return got


class HeartbeatProbe(threading.Thread):
    """Heartbeats on its own connection every 20 ms while the flood runs; records each round trip."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.client = Client(port)
        self.latencies, self.codes = [], []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            self.codes.append(self.client.heartbeat(client_id="probe@1").code)
            self.latencies.append(time.monotonic() - t0)
            time.sleep(0.02)


def test_full_queue_answers_overload_and_heartbeats_stay_fast(broker_factory):  # noqa: F811
    b = broker_factory(admin_broker_thread_pool_queue_capacity=50, metrics_port=free_port())
    probe = HeartbeatProbe(b.ports["main"])
    probe.start()
    flooder = Client(b.ports["main"])
    n = 3000
    flood(flooder, RequestCode.GET_CONSUMER_CONNECTION_LIST, n, {"consumerGroup": "demo_consumer_group"})
    answers = collect(flooder, n)
    time.sleep(0.2)
    probe.stop.set()
    probe.join(5)
    busy = [r for r in answers.values() if r.code == ResponseCode.SYSTEM_BUSY]
    assert busy and all(r.remark == OVERLOAD_REMARK for r in busy)
    assert len(busy) < n  # the queue still served what it could hold
    assert b.metrics.overloaded["admin"] == len(busy)
    assert probe.codes and set(probe.codes) == {0}
    assert max(probe.latencies) < 1.0, max(probe.latencies)
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.config.metrics_port}/metrics", timeout=5).read().decode()
    assert f'rocketmq_broker_overload_total{{executor="admin"}} {len(busy)}' in text
    assert consumer_ids(b, "demo_consumer_group") == ["probe@1"]


def test_requests_that_waited_too_long_are_answered_busy_not_late(broker_factory):  # noqa: F811
    b = broker_factory(wait_time_mills_in_queue=100, metrics_port=free_port())
    install_slow_processor(b)
    probe = HeartbeatProbe(b.ports["main"])
    probe.start()
    flooder = Client(b.ports["main"])
    n = 400  # 1.6 s of work queued at once: most of it would be answered well past 100 ms
    flood(flooder, SLOW_CODE, n)
    answers = collect(flooder, n)
    probe.stop.set()
    probe.join(5)
    ok = [r for r in answers.values() if r.code == ResponseCode.SUCCESS]
    late = [r for r in answers.values() if r.code == ResponseCode.SYSTEM_BUSY]
    assert len(ok) + len(late) == n and ok and late
    for r in late:
        m = TIMEOUT_RE.match(r.remark)
        assert m, r.remark
        assert int(m.group(1)) >= 100 and int(m.group(2)) < n  # waited > 100 ms, printed truncated to ms
    assert len(ok) <= n // 2, "the expired requests were run anyway"
    assert b.metrics.queue_timeouts["admin"] == len(late)
    assert max(probe.latencies) < 1.0 and set(probe.codes) == {0}, max(probe.latencies)
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.config.metrics_port}/metrics", timeout=5).read().decode()
    assert f'rocketmq_broker_queue_timeout_total{{executor="admin"}} {len(late)}' in text


def test_expired_oneway_requests_are_dropped_and_counted(broker_factory):  # noqa: F811
    b = broker_factory(wait_time_mills_in_queue=50)
    install_slow_processor(b)
    c = Client(b.ports["main"])
    flood(c, SLOW_CODE, 200, flag=2).join(10)
    time.sleep(0.1)
    r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, opaque=5000)
    assert r.code in (0, ResponseCode.SYSTEM_BUSY)  # queued behind the flood on the admin executor
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b.call(lambda: len(b.server.executors["admin"])):
        time.sleep(0.05)
    assert 0 < b.metrics.queue_timeouts["admin"] < 200
    assert not [x for x in c.inbox if x.is_response and x.opaque != 5000]  # oneway: never answered


def test_fast_failure_can_be_turned_off(broker_factory):  # noqa: F811
    b = broker_factory(wait_time_mills_in_queue=20, broker_fast_failure_enable=False)
    install_slow_processor(b, cost_s=0.002)
    c = Client(b.ports["main"])
    flood(c, SLOW_CODE, 200)
    answers = collect(c, 200)
    assert {r.code for r in answers.values()} == {ResponseCode.SUCCESS}
    assert not b.metrics.queue_timeouts


def test_pull_queue_has_its_own_limit(broker_factory):  # noqa: F811
    b = broker_factory(wait_time_mills_in_pull_queue=1234, wait_time_mills_in_queue=777)
    ex = b.server.executors
    assert ex["pull"].max_wait == 1.234 and ex["admin"].max_wait == 0.777
    assert ex["consumer_manage"].max_wait == 0.777 and ex["client_manage"].max_wait == 0.777
    # heartbeats, unregisters and consumer lists run in the read callback: nothing to wait in
    assert not hasattr(ex["inline"], "queue")
    table = b.server.table
    assert {code for code, (_, executor) in table.items() if executor is ex["inline"]} == {
        RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP}


def test_wait_limits_are_validated():
    with pytest.raises(ConfigError, match="waitTimeMillsInQueue must be >= 0"):
        BrokerConfig.load(overrides={"waitTimeMillsInQueue": "-1"})
    cfg = BrokerConfig.load(overrides={"waitTimeMillsInPullQueue": "0", "brokerFastFailureEnable": "false"})
    assert cfg.wait_time_mills_in_pull_queue == 0 and cfg.broker_fast_failure_enable is False

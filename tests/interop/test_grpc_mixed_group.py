"""A consumer group whose members subscribe different topic sets (issue 27 section 5), with the real clients: two
SimpleConsumers of the official Python 5.x client (rocketmq-python-client 5.1.2) and two of the Node.js 5.x client
(rocketmq-client-nodejs 1.0.8), one of each subscribing T1 and T2 and the other T1 only, beside a 4.x remoting member
of the same group (npm ali-ons 3.12.0, T1).

The 5.x proxy's Heartbeat registers the client without updating its group's subscriptions (ClientActivity.heartbeat
calls registerConsumer with updateSubscription false; only the Settings of the Telemetry stream update them). So
while nobody joins or leaves, the group's subscription table stays what the last registration made it, the broker
logs no "subscription changed" line, and the 4.x member receives no NOTIFY_CONSUMER_IDS_CHANGED however often the
5.x members heartbeat. Had each Heartbeat re-applied its session's subscriptions (as before commit 24ab4a5), the
table would gain and lose T2 at every round of heartbeats, and each flip would be a CHANGE that the 4.x member is
notified of: run against that behaviour, this test saw 20 "subscription changed" lines and 19 NOTIFYs, all received
by ali-ons, in its 10 s window. When the Node.js client leaves (its two members), the 4.x member is notified: the
test sees a NOTIFY when there is one.

The drivers shorten the 5.x clients' Heartbeat period (10 s in both clients) to HEARTBEAT_S, so the window holds
several heartbeats of every 5.x member; the test takes about 15 s under each of clientManagementRules 4 and 5. The clients are installed and pinned as in
test_grpc_interop / test_grpc_node_interop / test_interop; under ``CI=true`` / ``ENGINE_REQUIRE_PEERS=1`` a client
that cannot be installed fails the test.
"""
import json
import logging
import threading
import time

import pytest

import test_interop as ti
from test_interop import drivers, ons_dir  # noqa: F401  (fixtures)
from conftest import require_module
from test_grpc_interop import connections, free_port, start_v5, v5_python  # noqa: F401
from test_grpc_node_interop import start_v5_node, v5_node_dir  # noqa: F401
from engine.broker.admin import AdminClient, AdminError
from engine.broker.config import BrokerConfig
from engine.broker.controller import Broker
from engine.registry import clientlog

pytestmark = pytest.mark.interop

GROUP = "GID_MIXED_SUBS"
T1, T2 = "TopicMixedSubs1", "TopicMixedSubs2"
RETRY = "%RETRY%" + GROUP
#: the 5.x clients' Heartbeat period here, in seconds (10 in the clients)
HEARTBEAT_S = 2
#: how long the stable group is watched: several heartbeats of each 5.x member
WINDOW_S = 5 * HEARTBEAT_S
#: the lines a change of the group's subscription table writes (ConsumerGroupInfo.updateSubscription)
FLAP_WORDS = ("subscription changed", "add new topic", "remove topic")


class _Lines(logging.Handler):
    """The broker's client-management lines (logger RocketmqBroker), with the time each was written."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append((time.monotonic(), record.getMessage()))


@pytest.fixture(params=[4, 5], ids=["rules4", "rules5"])
def mixed_broker(request, tmp_path):
    """A broker with a gRPC port and T1, T2 created (a 5.x client's route query of an unknown topic is
    TOPIC_NOT_FOUND), under clientManagementRules 4 and 5, and its client-management lines."""
    require_module("grpc")  # the broker's grpc extra: a failure under CI, never a skip
    from engine.registry.topic_config_manager import TopicConfig

    config = tmp_path / "store" / "config"
    config.mkdir(parents=True)
    (config / "topics.json").write_text(json.dumps({"topicConfigTable": {
        t: TopicConfig(t, 4, 4).to_dict() for t in (T1, T2)}}))
    lines = _Lines()
    logger = logging.getLogger(clientlog.LOGGER_NAME)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                            grpc_server_port=free_port(), client_management_rules=request.param)).start()
    try:
        yield b, lines
    finally:
        b.stop()
        logger.removeHandler(lines)
        logger.setLevel(level)


class _Follow:
    """The stdout lines of a driver after its READY line, read as they come (NOTIFY lines of ali-ons)."""

    def __init__(self, driver):
        self.driver = driver
        self.lines = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self.driver.proc.stdout:
            self.lines.append((time.monotonic(), line.strip()))

    def since(self, t, word):
        return [line for at, line in list(self.lines) if at > t and line.startswith(word)]

    def close(self):
        self.driver.proc.stdin.write("close\n")
        self.driver.proc.stdin.flush()
        self._thread.join(60)
        assert self.since(0, "CLOSED"), self.driver.proc.stderr.read()[-3000:]
        return self.driver.proc.wait(60)


def _registry_topics(broker):
    g = broker.registry.consumers.group_table.get(GROUP)
    return None if g is None else tuple(sorted(g.subscriptions))


def _listed_topics(broker):
    """The group's subscription table as consumerConnection answers it over the remoting port."""
    try:
        with AdminClient("127.0.0.1", broker.ports["main"]) as c:
            return tuple(sorted(c.consumer_connection(GROUP).get("subscriptionTable") or {}))
    except AdminError as e:
        return f"consumerConnection failed: {e}"


def _members(broker):
    return {cid for cid, _ in connections(broker, GROUP) or []}


def test_5x_heartbeats_of_members_with_different_topic_sets_change_nothing(v5_python, v5_node_dir, ons_dir,  # noqa
                                                                          drivers, mixed_broker, tmp_path):
    b, log = mixed_broker
    settings = []  # (time, client id) of every Settings the gRPC endpoint registers
    update_settings = b.grpc._update_settings

    def spy(session, s):
        settings.append((time.monotonic(), session.client_id))
        return update_settings(session, s)

    b.grpc._update_settings = spy
    members = [{"group": GROUP, "subscriptions": {T1: "*", T2: "*"}}, {"group": GROUP, "subscriptions": {T1: "*"}}]
    py = start_v5(v5_python, drivers, b, tmp_path / "py", simpleConsumers=members, heartbeatSeconds=HEARTBEAT_S)
    py_ids = py.ready_line.split()[1:]
    node = start_v5_node(v5_node_dir, drivers, b, tmp_path / "node", simpleConsumers=members,
                         heartbeatIntervalMs=HEARTBEAT_S * 1000)
    node_ids = node.ready_line.split()[1:]
    v5_ids = py_ids + node_ids
    assert len(set(v5_ids)) == 4
    assert ti.wait_for(lambda: _members(b) == set(v5_ids))
    # the Python client sends its Settings again 1 s after its start (its sync-settings scheduler: 1 s, then every
    # 300 s), and Settings do update the group's subscriptions: wait for them
    assert ti.wait_for(lambda: all(sum(c == cid for _, c in settings) >= 2 for cid in py_ids))
    # the 4.x member joins last: its heartbeats (which update subscriptions, as remoting heartbeats do in Java) make
    # the table its own, T1 and the retry topic ali-ons subscribes once started, as its later ones (every 30 s) keep it
    ons = ti.start_ons(ons_dir, drivers, b.ports["main"], reportNotify=True,
                       consumers=[{"group": GROUP, "topic": T1, "expr": "*"}])
    ons_id = ons.ready_line.split()[1]
    ons = _Follow(ons)
    assert ti.wait_for(lambda: _members(b) == {*v5_ids, ons_id})
    table = (RETRY, T1)
    assert ti.wait_for(lambda: _registry_topics(b) == table), _registry_topics(b)
    time.sleep(1.0)  # the NOTIFYs of the 4.x member's own join are delivered

    mark = time.monotonic()
    notified = b.metrics.notifications_sent
    registry_tables, listed_tables = set(), set()
    beats = {cid: set() for cid in v5_ids}  # the distinct last_seen of each session: its Settings and Heartbeats
    tick = 0
    while time.monotonic() - mark < WINDOW_S:
        registry_tables.add(_registry_topics(b))
        for cid in v5_ids:
            beats[cid].add(b.grpc.sessions[cid].last_seen)
        if tick % 10 == 0:
            listed_tables.add(_listed_topics(b))
        tick += 1
        time.sleep(0.05)
    end = time.monotonic()
    # every 5.x member heartbeat several times while it was watched, and none sent Settings
    assert [cid for at, cid in settings if at > mark] == []
    assert all(len(seen) >= 4 for seen in beats.values()), {cid: len(seen) for cid, seen in beats.items()}
    # the group's table did not flip, in the registry nor as consumerConnection lists it
    assert registry_tables == {table}
    assert listed_tables == {table}
    flaps = [m for at, m in log.lines if at > mark and any(w in m for w in FLAP_WORDS)]
    assert flaps == []
    # the log capture works: the 4.x member's join was logged
    assert any("new consumer connected" in m and ons_id in m for at, m in log.lines if at <= mark)
    # no NOTIFY_CONSUMER_IDS_CHANGED was sent, nor did the 4.x member receive one
    assert b.metrics.notifications_sent == notified
    assert ons.since(mark, "NOTIFY") == []
    assert _members(b) == {*v5_ids, ons_id}

    # a 5.x client leaves (NotifyClientTermination of its two members): that is a change, notified
    assert node.close() == 0
    assert ti.wait_for(lambda: ons.since(end, "NOTIFY"), timeout=10)
    assert set(ons.since(end, "NOTIFY")) == {f"NOTIFY {GROUP}"}
    assert b.metrics.notifications_sent > notified
    assert _members(b) == {*py_ids, ons_id}
    assert py.close() == 0
    assert ons.close() == 0
    assert ti.wait_for(lambda: connections(b, GROUP) is None)

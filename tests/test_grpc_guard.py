"""The 5.x gRPC port against hostile clients (issue 26 §1), each attack scaled down: Settings whose decoded size is
counted and bounded, shares of an address in what all clients share, route queries that create nothing, streams
without Settings, another connection presenting a client's id, a sessions file that outgrows its limit; and a 5.x
Heartbeat that leaves its group's subscriptions to the Settings (issue 27 §5)."""
import gc
import json
import logging
import socket
import threading
import time
import tracemalloc

import pytest

from conftest import require_module
from engine.broker.controller import Broker
from engine.broker.metrics import render
from engine.codec.enums import RequestCode
from engine.registry.subscription_group_manager import SubscriptionGroupConfig
from engine.registry.topic_config_manager import TopicConfig

grpc = require_module("grpc")
require_module("rocketmq.grpc_protocol")
from rocketmq.grpc_protocol import definition_pb2 as d  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as s  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as sg  # noqa: E402

import engine.broker.grpc_endpoint as ge  # noqa: E402
from test_grpc_endpoint import (Telemetry, consumer_settings, consumers, free_port, grpc_transport,  # noqa: E402,F401
                                md, producer_settings, producers, wait_until)
from test_server import Client, hb_body, make_config  # noqa: E402

Code = d.Code




@pytest.fixture
def gbroker(tmp_path):
    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    yield b
    b.stop()


def channel_to(port, own_connection=False):
    """A grpc channel; ``own_connection``: its own TCP connection (grpc shares one between channels to the same
    target by default), as a client in another process has."""
    options = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=options)


@pytest.fixture
def stub(gbroker):
    channel = channel_to(gbroker.ports["grpc"])
    yield sg.MessagingServiceStub(channel)
    channel.close()


class Relay:
    """A TCP relay on 127.0.0.1 whose connections reach the broker from another source address (127.0.0.2): a
    client behind it is another address to the broker."""

    def __init__(self, port, source="127.0.0.2"):
        self.target, self.source = port, source
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target), source_address=(self.source, 0))
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def _pipe(x, y):
        try:
            while data := x.recv(65536):
                y.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (x, y):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.server.close()


def settings_with_tags(group, n_subs, n_tags, prefix="T"):
    return consumer_settings(group, [(f"{prefix}{i}", " || ".join(f"tag{i}_{j}" for j in range(n_tags)))
                                     for i in range(n_subs)])


def start_session(stub, client_id, settings):
    t = Telemetry(stub, md(client_id))
    t.send(settings=settings)
    return t, t.recv()


def refused_stream(t):
    with pytest.raises(grpc.RpcError) as e:
        t.recv()
    return e.value


# ------------------------------------------------------------------------------------------ Settings bytes


def test_the_settings_budget_counts_what_a_session_keeps(gbroker, stub):
    """Settings of 32 subscriptions x 200 tags (the 1,024 x 633 attack scaled down): what the broker keeps per
    session, measured with tracemalloc, is within what the budget counts for it (and the count is not a wild
    over-estimate either)."""
    ep = gbroker.grpc
    n = 4
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        streams = []
        for k in range(n):
            t, answer = start_session(stub, f"big@{k}", settings_with_tags(f"GroupBig{k}", 32, 200, f"T{k}_"))
            assert answer.status.code == Code.OK
            streams.append(t)
        gbroker.call(gc.collect)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = gbroker.call(lambda: ep.settings_cost)
    per_session = kept / n
    assert per_session > 32 * 200 * 100  # the attack is real: ~100+ bytes per decoded tag
    assert counted >= kept, (counted, kept)  # the budget does not undercount what sessions cost
    assert counted <= 4 * kept, (counted, kept)
    assert sum(ep._ip_cost.values()) == counted
    for t in streams:
        t.end()
    wait_until(lambda: ep.sessions == {})
    assert ep.settings_cost == 0 and not ep._ip_cost and not ep._ip_groups and not ep._ip_sessions


def test_the_default_settings_budget_holds_grpc_max_sessions_sessions_of_the_sdks(gbroker):
    """A fleet meets grpcMaxSessions before the Settings budget: the default grpcMaxSettingsBytesTotal holds that
    many sessions with an SDK's usual Settings (the load generator's: a producer of one topic, a push consumer of
    one subscription, the SDKs' access point and user agent). At 256 MiB it held ~54,000."""
    from engine import loadgen_grpc
    from engine.broker.config import BrokerConfig

    cfg = BrokerConfig()
    ep = gbroker.grpc
    sessions = loadgen_grpc.make_sessions(200, 0, "budget", 100, 7, 0.5, "TopicLoad", "broker-host.example", 8081,
                                          False)
    costs = [ep.settings_cost_of(s.TelemetryCommand.FromString(x.settings[5:]).settings) for x in sessions]
    assert {x.consumer for x in sessions} == {True, False}
    assert max(costs) * cfg.grpc_max_sessions <= cfg.grpc_max_settings_bytes_total, max(costs)


def test_settings_past_the_bytes_budget_end_the_stream_and_a_closed_session_frees_its_share(gbroker, stub):
    ep = gbroker.grpc
    one = ep.settings_cost_of(settings_with_tags("GroupB0", 16, 50, "A"))
    ep.max_settings_bytes_total = 3 * one + one // 2
    streams = []
    for k in range(3):
        t, answer = start_session(stub, f"b@{k}", settings_with_tags(f"GroupB{k}", 16, 50, "A"))
        assert answer.status.code == Code.OK
        streams.append(t)
    t = Telemetry(stub, md("b@3"))
    t.send(settings=settings_with_tags("GroupB3", 16, 50, "A"))
    e = refused_stream(t)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "budget" in e.details()
    assert consumers(gbroker, "GroupB3") is None and "b@3" not in ep.sessions
    assert ep.refused["settings_bytes"] == 1
    # small Settings still fit; a session that leaves gives its share back (streams kept: a dropped one ends)
    t, answer = start_session(stub, "small@1", consumer_settings("GroupSmall", [("TopicS", "*")]))
    assert answer.status.code == Code.OK
    streams.append(t)
    streams[0].end()
    wait_until(lambda: "b@0" not in ep.sessions)
    t, answer = start_session(stub, "b@4", settings_with_tags("GroupB4", 16, 50, "A"))
    assert answer.status.code == Code.OK
    streams.append(t)
    # the same for one address's share
    ep.max_settings_bytes_total = 1 << 30
    ep.max_settings_bytes_per_ip = ep._ip_cost["127.0.0.1"] + 100
    t = Telemetry(stub, md("b@5"))
    t.send(settings=settings_with_tags("GroupB5", 16, 50, "A"))
    assert refused_stream(t).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ep.refused["settings_bytes"] == 2


def test_tags_per_subscription_are_bounded(gbroker, stub):
    ep = gbroker.grpc
    ep.max_tags_per_subscription = 8
    t, answer = start_session(stub, "tags@1", settings_with_tags("GroupTags", 2, 8))
    assert answer.status.code == Code.OK
    t2 = Telemetry(stub, md("tags@2"))
    t2.send(settings=settings_with_tags("GroupTags2", 2, 9))
    e = refused_stream(t2)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than 8 tags" in e.details()
    assert consumers(gbroker, "GroupTags2") is None and ep.refused["tags_per_subscription"] == 1


# ------------------------------------------------------------------------------------------ shared budgets


def test_one_address_cannot_fill_the_broker_wide_group_table(gbroker, stub):
    """98 Settings filled maxRegisteredGroups in 0.7 s: scaled down, an address's sessions register at most
    grpcMaxGroupsPerIp distinct groups, and a client at another address still registers a new group."""
    ep = gbroker.grpc
    ep.max_groups_per_ip = 7
    streams = []
    for k in range(3):  # 3 producers of 2 topics each: 6 groups (a producer's topics are its groups)
        t, answer = start_session(stub, f"p@{k}", producer_settings(f"Junk{k}a", f"Junk{k}b"))
        assert answer.status.code == Code.OK
        streams.append(t)
    t, answer = start_session(stub, "p@same", producer_settings("Junk0a"))  # a group the address already has
    assert answer.status.code == Code.OK
    streams.append(t)
    t, answer = start_session(stub, "c@1", consumer_settings("Junk0b", [("TopicX", "*")]))  # a consumer group: 7
    assert answer.status.code == Code.OK
    streams.append(t)
    t = Telemetry(stub, md("p@3"))
    t.send(settings=producer_settings("Junk3a"))
    e = refused_stream(t)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many groups" in e.details()
    assert producers(gbroker, "Junk3a") is None and ep.refused["groups_per_ip"] == 1
    # a Heartbeat naming another group is counted too
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = "OtherGroup"
    assert stub.Heartbeat(hb, metadata=md("c@1")).status.code == Code.TOO_MANY_REQUESTS
    assert consumers(gbroker, "OtherGroup") is None and ep.refused["groups_per_ip"] == 2
    assert len(gbroker.call(gbroker.registry.groups)) < gbroker.config.max_registered_groups
    relay = Relay(gbroker.ports["grpc"])
    try:
        far = sg.MessagingServiceStub(channel_to(relay.port, own_connection=True))
        t, answer = start_session(far, "good@1", consumer_settings("GoodGroup", [("TopicG", "*")]))
        assert answer.status.code == Code.OK
        conns = consumers(gbroker, "GoodGroup")["connectionSet"]
        assert [(c["clientId"], c["clientAddr"].rpartition(":")[0]) for c in conns] == [("good@1", "127.0.0.2")]
        t.end()
    finally:
        relay.close()
    for t in streams:
        t.end()
    wait_until(lambda: ep.sessions == {})
    assert not ep._ip_groups and not ep._ip_sessions
    t, answer = start_session(stub, "p@4", producer_settings("Junk4a"))  # the address's groups were given back
    assert answer.status.code == Code.OK


def test_a_refused_heartbeat_group_holds_no_share_of_the_address(tmp_path):
    """A Heartbeat naming a group the registry does not take (5.x rules, autoCreateSubscriptionGroup=false: a
    group without config is not registered) holds nothing, so it takes nothing of its address's
    grpcMaxGroupsPerIp: junk group names heartbeated by one session do not lock the address's other clients out."""
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), auto_create_subscription_group=False,
                           client_management_rules=5)).start()
    try:
        ep = b.grpc
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        for group in ("GroupKept", "GroupGood"):
            b.call(b.registry.update_subscription_group_config, SubscriptionGroupConfig(group))
        ep.max_groups_per_ip = 3
        t, answer = start_session(stub, "c@1", consumer_settings("GroupKept", [("TopicS", "*")]))
        assert answer.status.code == Code.OK
        for k in range(4):
            hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
            hb.group.name = f"NoSuch{k}"
            assert stub.Heartbeat(hb, metadata=md("c@1")).status.code == Code.OK
            assert consumers(b, f"NoSuch{k}") is None
        assert b.call(lambda: dict(ep._ip_groups["127.0.0.1"])) == {("C", "GroupKept"): 1}
        assert ep.refused["groups_per_ip"] == 0
        t2, answer = start_session(stub, "c@2", consumer_settings("GroupGood", [("TopicS", "*")]))
        assert answer.status.code == Code.OK
        # a heartbeat group the registry takes is counted, and given back with the session
        b.call(b.registry.update_subscription_group_config, SubscriptionGroupConfig("GroupMore"))
        hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
        hb.group.name = "GroupMore"
        assert stub.Heartbeat(hb, metadata=md("c@1")).status.code == Code.OK
        assert b.call(lambda: sorted(ep._ip_groups["127.0.0.1"])) == [("C", "GroupGood"), ("C", "GroupKept"),
                                                                       ("C", "GroupMore")]
        t.end()
        t2.end()
        wait_until(lambda: ep.sessions == {})
        assert not ep._ip_groups
    finally:
        b.stop()


def test_sessions_per_address(gbroker, stub):
    ep = gbroker.grpc
    ep.max_sessions_per_ip = 2
    kept = [start_session(stub, f"s@{k}", producer_settings("TopicS")) for k in range(2)]
    assert [answer.status.code for _, answer in kept] == [Code.OK, Code.OK]
    t = Telemetry(stub, md("s@2"))
    t.send(settings=producer_settings("TopicS"))
    e = refused_stream(t)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "from this address" in e.details()
    assert ep.refused["sessions_per_ip"] == 1 and len(ep.sessions) == 2


def test_a_route_query_for_an_unknown_topic_creates_nothing(gbroker, stub):
    """Unauthenticated QueryRoute calls auto-created 20,000 junk topics: now each answers TOPIC_NOT_FOUND, as the
    proxy does when the name server answers TOPIC_NOT_EXIST, and no topic is created (none saved either)."""
    topics_before = len(gbroker.call(gbroker.registry.topic_configs))
    for k in range(200):
        req = s.QueryRouteRequest()
        req.topic.name = f"Junk{k}"
        r = stub.QueryRoute(req, metadata=md())
        assert (r.status.code, r.status.message) == (Code.TOPIC_NOT_FOUND, f"topic not found: Junk{k}")
        a = s.QueryAssignmentRequest()
        a.topic.name, a.group.name = f"Junk{k}", "G"
        assert stub.QueryAssignment(a, metadata=md()).status.code == Code.TOPIC_NOT_FOUND
    assert len(gbroker.call(gbroker.registry.topic_configs)) == topics_before
    gbroker.call(gbroker.registry.update_topic_config, TopicConfig("Known", 2, 2))
    req = s.QueryRouteRequest()
    req.topic.name = "Known"
    r = stub.QueryRoute(req, metadata=md())
    assert r.status.code == Code.OK and [q.id for q in r.message_queues] == [0, 1]


def test_streams_without_settings_hold_no_session_and_end(gbroker, stub):
    """Idle Telemetry streams locked good clients out at grpcMaxSessions: a stream is a session only once its
    Settings arrive, and one without Settings ends after grpcSettingsTimeoutMs."""
    ep = gbroker.grpc
    ep.max_sessions = 2
    ep.settings_timeout_ms = 600
    idle = [Telemetry(stub, md(f"idle@{k}")) for k in range(6)]
    time.sleep(0.3)
    assert ep.sessions == {}
    t, answer = start_session(stub, "good@1", producer_settings("TopicGood"))
    assert answer.status.code == Code.OK
    for x in idle:
        assert list(x.call) == []  # ended by the broker without a client's end
    assert ep.refused["settings_timeout"] == 6
    assert list(ep.sessions) == ["good@1"]


def test_an_unauthenticated_stream_ends_as_a_stream_without_settings(tmp_path):
    """With aclEnable a stream that fails authentication gets each command answered with the refusal; it never
    has Settings accepted, so it ends after grpcSettingsTimeoutMs as any stream without Settings (it was kept open
    for as long as the client wished)."""
    from test_grpc_acl import ACL

    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), acl_enable=True, acl_file=str(acl))).start()
    try:
        ep = b.grpc
        ep.settings_timeout_ms = 600
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        streams = [Telemetry(stub, md(f"anon@{k}")) for k in range(3)]
        streams[0].send(settings=producer_settings("TopicX"))
        assert streams[0].recv().status.code == Code.UNAUTHORIZED
        wait_until(lambda: all(t.call.done() for t in streams), timeout=5)
        assert ep.refused["settings_timeout"] == 3 and ep.sessions == {}
    finally:
        b.stop()


def test_a_silent_session_ends_with_its_stream(tmp_path):
    """A session the registry holds no registration of (under the 5.x rules a group without config is not
    registered with autoCreateSubscriptionGroup=false: nothing for the housekeeping to expire) still ends when
    silent."""
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), auto_create_subscription_group=False,
                           client_management_rules=5, channel_expired_timeout=700)).start()
    try:
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        b.call(b.registry.update_subscription_group_config, SubscriptionGroupConfig("GroupKept"))
        kept, answer = start_session(stub, "kept@1", consumer_settings("GroupKept", [("TopicS", "*")]))
        assert answer.status.code == Code.OK and consumers(b, "GroupKept") is not None
        t, answer = start_session(stub, "silent@1", consumer_settings("GroupSilent", [("TopicS", "*")]))
        assert answer.status.code == Code.OK
        assert "silent@1" in b.grpc.sessions and consumers(b, "GroupSilent") is None
        assert list(t.call) == []
        assert "silent@1" not in b.grpc.sessions and b.grpc.refused["idle_session"] == 1
        # a registered session is the housekeeping's to expire (its scan every 10 s), as any channel
        time.sleep(0.3)
        assert "kept@1" in b.grpc.sessions and b.grpc.refused["idle_session"] == 1
        assert b.call(b.scan_expired) == 1
        assert list(kept.call) == [] and "kept@1" not in b.grpc.sessions
    finally:
        b.stop()


# ------------------------------------------------------------------------------------------ another client's id


def test_another_connection_cannot_end_take_over_or_move_a_live_session(gbroker, stub, caplog):
    ep = gbroker.grpc
    victim, answer = start_session(stub, "victim@1", consumer_settings("GroupV", [("TopicV", "TagA")]))
    assert answer.status.code == Code.OK
    channel = channel_to(gbroker.ports["grpc"], own_connection=True)
    attacker = sg.MessagingServiceStub(channel)
    with caplog.at_level(logging.WARNING, logger="engine.grpc"):
        term = s.NotifyClientTerminationRequest()
        term.group.name = "GroupV"
        for _ in range(8):
            r = attacker.NotifyClientTermination(term, metadata=md("victim@1"))
            assert r.status.code == Code.FORBIDDEN
        hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
        hb.group.name = "GroupElsewhere"
        assert attacker.Heartbeat(hb, metadata=md("victim@1")).status.code == Code.FORBIDDEN
        t = Telemetry(attacker, md("victim@1"))
        t.send(settings=consumer_settings("GroupV", [("TopicEvil", "*")]))
        e = refused_stream(t)
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [c["clientId"] for c in consumers(gbroker, "GroupV")["connectionSet"]] == ["victim@1"]
    assert list(consumers(gbroker, "GroupV")["subscriptionTable"]) == ["TopicV"]
    assert consumers(gbroker, "GroupElsewhere") is None
    # the victim's stream still serves it
    victim.send(settings=consumer_settings("GroupV", [("TopicV", "TagB")]))
    assert victim.recv().status.code == Code.OK
    assert ep.refused["foreign_client_id"] == 10
    assert gbroker.metrics.grpc_refused["foreign_client_id"] == 10
    assert 'rocketmq_broker_grpc_refused_total{reason="foreign_client_id"} 10' in render(gbroker.metrics, 0)
    lines = [r.getMessage() for r in caplog.records if "presented by another connection" in r.getMessage()]
    assert 1 <= len(lines) <= 5 and all("'victim@1'" in x for x in lines)  # budgeted, the id quoted (escaped)
    # once the victim's stream is gone, its client may come back on a new connection
    victim.end()
    wait_until(lambda: "victim@1" not in ep.sessions)
    t, answer = start_session(attacker, "victim@1", consumer_settings("GroupV", [("TopicV", "TagA")]))
    assert answer.status.code == Code.OK
    t.end()
    channel.close()


def test_the_owning_connection_still_replaces_its_stream_and_terminates(gbroker, stub):
    t1, _ = start_session(stub, "own@1", producer_settings("TopicOwn"))
    t2, answer = start_session(stub, "own@1", producer_settings("TopicOwn"))
    assert answer.status.code == Code.OK
    assert list(t1.call) == []  # replaced by the newer stream of the same connection
    r = stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=md("own@1"))
    assert r.status.code == Code.OK and "own@1" not in gbroker.grpc.sessions
    assert gbroker.grpc.refused["foreign_client_id"] == 0


# ------------------------------------------------------------------------------------------ restart


def test_the_sessions_file_keeps_what_fits_and_a_start_restores_what_fits(tmp_path, monkeypatch):
    """Hostile sessions made grpcSessions.json pass its read limit and nobody was restored: a stop saves the
    smallest sessions first within the limit, and a start reads the entries within the limit of a file past it."""
    limit = 4096
    monkeypatch.setattr(ge, "MAX_SESSIONS_FILE_BYTES", limit)
    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    ports = b.ports
    path = tmp_path / "store" / "config" / "grpcSessions.json"
    try:
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        streams = [start_session(stub, f"small@{k}", producer_settings(f"TopicSmall{k}"))[0] for k in range(5)]
        huge = [start_session(stub, f"huge@{k}", producer_settings(*(f"HugeTopic{k}_{i}" for i in range(400))))[0]
                for k in range(2)]
        assert len(b.grpc.sessions) == 7 and streams and huge
    finally:
        b.stop()
    data = path.read_bytes()
    assert len(data) <= limit
    saved = [json.loads(line)["clientId"] for line in data.splitlines()[1:]]
    assert sorted(saved) == [f"small@{k}" for k in range(5)]
    # a file past the limit (as an older run could leave): the entries within it are restored
    lines = data.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:4]) + b'{"clientId": "x", "settings": "' + b"A" * limit + b'"}\n'
                     + b"".join(lines[4:]))
    b = Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"])).start()
    try:
        assert sorted(b.grpc.dormant) == sorted(saved[:3])
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        hb = s.HeartbeatRequest(client_type=d.ClientType.PRODUCER)
        assert stub.Heartbeat(hb, metadata=md(saved[0])).status.code == Code.OK
        topic = saved[0].replace("small@", "TopicSmall")
        assert [c["clientId"] for c in producers(b, topic)["connectionSet"]] == [saved[0]]
    finally:
        b.stop()


def test_a_restore_that_fails_inside_leaves_no_session(tmp_path, monkeypatch):
    """A restore whose registration fails with an internal error (not a bad request) answers INTERNAL_ERROR and
    leaves nothing behind: a restored session has no stream, so one left there would never be reaped and would
    hold its slot of grpcMaxSessions and its address's shares for ever."""
    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    ports = b.ports
    try:
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        t, answer = start_session(stub, "back@1", producer_settings("TopicBack"))
        assert answer.status.code == Code.OK
    finally:
        b.stop()
    b = Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"])).start()
    try:
        ep = b.grpc
        assert list(ep.dormant) == ["back@1"]

        def boom(*args, **kw):
            raise RuntimeError("registry failure")

        monkeypatch.setattr(ge.GrpcEndpoint, "_register", boom)
        stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
        r = stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER), metadata=md("back@1"))
        assert (r.status.code, r.status.message) == (Code.INTERNAL_ERROR, "internal error")
        assert b.call(lambda: (dict(ep.sessions), ep.settings_cost, dict(ep._ip_sessions), dict(ep._ip_groups))) \
            == ({}, 0, {}, {})
    finally:
        b.stop()


# ------------------------------------------------------------------------------------------ issue 27 §5


def test_a_heartbeat_does_not_rewrite_its_groups_subscriptions(gbroker, stub):
    """Two 5.x members of one group subscribe different topic sets beside a 4.x member: their Heartbeats leave
    the group's subscriptions to the Settings (the proxy's ClientActivity.heartbeat), so the 4.x member gets no
    NOTIFY_CONSUMER_IDS_CHANGED while the membership does not change."""
    c = Client(gbroker.ports["main"])
    assert c.heartbeat(client_id="java@1", group="MixedG").code == 0
    a, answer = start_session(stub, "py-a@1", consumer_settings("MixedG", [("TopicTest", "*"), ("T2", "*")]))
    assert answer.status.code == Code.OK
    b, answer = start_session(stub, "py-b@1", consumer_settings("MixedG", [("TopicTest", "*")],
                                                                d.ClientType.SIMPLE_CONSUMER))
    assert answer.status.code == Code.OK
    # the joins notify (a membership change each)
    joins = 0
    try:
        while True:
            c.read(timeout=1.0, pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
            joins += 1
    except TimeoutError:
        pass
    assert joins >= 2
    table = sorted(consumers(gbroker, "MixedG")["subscriptionTable"])
    for _ in range(3):
        for client_id, kind in (("py-a@1", d.ClientType.PUSH_CONSUMER), ("py-b@1", d.ClientType.SIMPLE_CONSUMER)):
            hb = s.HeartbeatRequest(client_type=kind)
            hb.group.name = "MixedG"
            assert stub.Heartbeat(hb, metadata=md(client_id)).status.code == Code.OK
            assert sorted(consumers(gbroker, "MixedG")["subscriptionTable"]) == table
    with pytest.raises(TimeoutError):
        c.read(timeout=1.5, pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    conns = sorted(x["clientId"] for x in consumers(gbroker, "MixedG")["connectionSet"])
    assert conns == ["java@1", "py-a@1", "py-b@1"]
    # Settings still change the table (and the 4.x member hears of it)
    a.send(settings=consumer_settings("MixedG", [("TopicTest", "*"), ("T3", "*")]))
    assert a.recv().status.code == Code.OK
    c.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert "T3" in consumers(gbroker, "MixedG")["subscriptionTable"]
    a.end()
    b.end()
    c.close()

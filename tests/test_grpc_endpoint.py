"""The gRPC endpoint of RocketMQ 5.x clients (engine.broker.grpc_endpoint) driven with a grpcio client stub: routes,
the Telemetry settings exchange, heartbeats, termination, expiry, a mixed 4.x/5.x group, and bad input."""
import json
import logging
import queue
import threading
import time
from pathlib import Path

import pytest

from conftest import free_port, require_module
from engine.broker.admin import AdminClient, AdminError
from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig, ConfigError
from engine.codec.enums import RequestCode
from engine.registry.topic_config_manager import TopicConfig

grpc = require_module("grpc")
require_module("rocketmq.grpc_protocol")
from rocketmq.grpc_protocol import definition_pb2 as d  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as s  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as sg  # noqa: E402

from test_server import Client, hb_body, make_config  # noqa: E402

Code = d.Code



def wait_until(fn, timeout=20.0):
    """Polls ``fn`` until it is true (a state change the broker makes on its own loop); fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


#: topics the tests route: a gRPC route query creates no topic (it answers TOPIC_NOT_FOUND, as the proxy)
TOPICS = ("TopicC", "TopicD", "TopicS", "TopicX", "StillServing", "TopicCapture", "TopicHook")


@pytest.fixture(autouse=True, params=["grpcio", "native"])
def grpc_transport(request, monkeypatch):
    """Every test on both transports of the gRPC port (grpcTransport): grpcio's and engine.http2's (issue 30).
    The brokers of the test's module are made with its make_config (test_server's); a module importing this
    fixture gets it too."""
    import test_server

    base = test_server.make_config
    monkeypatch.setattr(request.module, "make_config",
                        lambda tmp_path, **kw: base(tmp_path, **{"grpc_transport": request.param, **kw}))
    return request.param


@pytest.fixture
def gbroker(tmp_path):
    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    for topic in TOPICS:
        b.call(b.registry.update_topic_config, TopicConfig(topic, 4, 4))
    # a short long-polling window: ReceiveMessage answers sooner (the limits are read per request)
    b.grpc.min_long_polling_ms, b.grpc.max_long_polling_ms = 50, 200
    yield b
    b.stop()


@pytest.fixture
def stub(gbroker):
    channel = grpc.insecure_channel(f"127.0.0.1:{gbroker.ports['grpc']}")
    yield sg.MessagingServiceStub(channel)
    channel.close()


def md(client_id="py-client@1", language="PYTHON", version="5.1.2"):
    out = [("x-mq-language", language), ("x-mq-client-version", version), ("x-mq-protocol", "GRPC_V2")]
    if client_id is not None:
        out.append(("x-mq-client-id", client_id))
    return out


class Telemetry:
    """One Telemetry stream: send commands, read the broker's answers."""

    def __init__(self, stub, metadata):
        self.q = queue.Queue()
        self.call = stub.Telemetry(iter(self.q.get, None), metadata=metadata)

    def send(self, **kw):
        self.q.put(s.TelemetryCommand(**kw))

    def send_command(self, command):
        self.q.put(command)

    def recv(self):
        return next(self.call)

    def end(self):
        self.q.put(None)

    def cancel(self):
        self.call.cancel()


def producer_settings(*topics):
    st = d.Settings(client_type=d.ClientType.PRODUCER)
    for t in topics:
        st.publishing.topics.add(name=t)
    st.user_agent.language = d.Language.PYTHON
    return st


def consumer_settings(group, subs, client_type=d.ClientType.PUSH_CONSUMER):
    st = d.Settings(client_type=client_type)
    st.subscription.group.name = group
    for topic, expr in subs:
        e = st.subscription.subscriptions.add()
        e.topic.name = topic
        e.expression.type = d.FilterType.TAG
        e.expression.expression = expr
    return st


def admin(broker):
    return AdminClient("127.0.0.1", broker.ports["main"])


def consumers(broker, group):
    try:
        return admin(broker).consumer_connection(group)
    except AdminError:
        return None


def producers(broker, group):
    try:
        return admin(broker).producer_connection(group)
    except AdminError:
        return None


# ---------------------------------------------------------------------------------------------------------------


def test_grpc_server_port_property():
    cfg = BrokerConfig.load(None, {"grpcServerPort": "8081"})
    assert cfg.grpc_server_port == 8081 and BrokerConfig().grpc_server_port == 0
    with pytest.raises(ConfigError, match="grpcServerPort must be between 0 and 65535"):
        BrokerConfig(grpc_server_port=70000).validate()


def test_off_by_default(tmp_path):
    with Broker(make_config(tmp_path)) as b:
        assert b.grpc is None and "grpc" not in b.ports


def test_missing_extra_fails_the_start_before_any_port_is_bound(tmp_path, monkeypatch):
    import engine.broker.grpc_endpoint as ge

    def missing():
        raise ge.GrpcEndpointError("grpcServerPort needs the grpc extra")
    monkeypatch.setattr(ge, "load_protocol", missing)
    b = Broker(make_config(tmp_path, grpc_server_port=free_port()))
    with pytest.raises(ValueError, match="grpc extra"):
        b.start()
    assert b.ports == {}


def test_port_in_use_fails_start(tmp_path, gbroker):
    with pytest.raises(ValueError, match="grpcServerPort"):
        Broker(make_config(tmp_path / "b2", grpc_server_port=gbroker.ports["grpc"])).start()


def test_query_route(gbroker, stub):
    port = gbroker.ports["grpc"]
    req = s.QueryRouteRequest()
    req.topic.name = "TopicA"
    req.endpoints.scheme = d.AddressScheme.IPv4
    req.endpoints.addresses.add(host="127.0.0.1", port=port)
    # an unknown topic: TOPIC_NOT_FOUND, created by nobody (the proxy's answer to the name server's TOPIC_NOT_EXIST)
    r = stub.QueryRoute(req, metadata=md())
    assert (r.status.code, r.status.message) == (Code.TOPIC_NOT_FOUND, "topic not found: TopicA")
    assert gbroker.call(gbroker.registry.topic_config, "TopicA") is None
    gbroker.call(gbroker.registry.update_topic_config, TopicConfig("TopicA", 4, 4))
    r = stub.QueryRoute(req, metadata=md())
    assert r.status.code == Code.OK
    assert [q.id for q in r.message_queues] == [0, 1, 2, 3]
    for q in r.message_queues:
        assert q.topic.name == "TopicA" and q.permission == d.Permission.READ_WRITE
        assert list(q.accept_message_types) == [d.MessageType.NORMAL]
        assert q.broker.name == gbroker.config.broker_name and q.broker.id == 0
        assert [(a.host, a.port) for a in q.broker.endpoints.addresses] == [("127.0.0.1", port)]
    # the remoting port routes the same topic now
    assert admin(gbroker).route("TopicA")["queueDatas"][0]["readQueueNums"] == 4


def test_query_route_bad_requests(stub):
    req = s.QueryRouteRequest()
    req.topic.name = "bad topic!"
    assert stub.QueryRoute(req, metadata=md()).status.code == Code.ILLEGAL_TOPIC
    req.topic.name = "TopicA"
    r = stub.QueryRoute(req, metadata=md(client_id=None))
    assert (r.status.code, r.status.message) == (Code.CLIENT_ID_REQUIRED, "client id cannot be empty")


def test_heartbeat_needs_settings(stub):
    r = stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER), metadata=md())
    assert (r.status.code, r.status.message) == (Code.UNRECOGNIZED_CLIENT_TYPE,
                                                 "cannot find client settings for this client")


def test_producer_settings_exchange_heartbeat_and_termination(gbroker, stub):
    t = Telemetry(stub, md("prod@1"))
    t.send(settings=producer_settings("TopicP", "TopicQ"))
    answer = t.recv()
    assert answer.status.code == Code.OK
    st = answer.settings
    assert st.client_type == d.ClientType.PRODUCER
    assert [x.name for x in st.publishing.topics] == ["TopicP", "TopicQ"]
    assert st.publishing.max_body_size == 4 * 1024 * 1024 and st.publishing.validate_message_type
    assert st.backoff_policy.max_attempts == 3
    assert st.backoff_policy.exponential_backoff.initial.ToMilliseconds() == 10
    assert st.backoff_policy.exponential_backoff.max.ToMilliseconds() == 1000
    assert st.metric.on is False
    # the proxy's producer group of a 5.x producer is the topic
    for group in ("TopicP", "TopicQ"):
        conns = producers(gbroker, group)["connectionSet"]
        assert len(conns) == 1
        assert conns[0]["clientId"] == "prod@1" and conns[0]["language"] == "PYTHON"
        assert conns[0]["clientAddr"].startswith("127.0.0.1:")
    hb = stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER), metadata=md("prod@1"))
    assert hb.status.code == Code.OK
    r = stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=md("prod@1"))
    assert r.status.code == Code.OK
    assert producers(gbroker, "TopicP") is None and producers(gbroker, "TopicQ") is None
    assert gbroker.grpc.sessions == {}
    # a terminated client closes its stream itself (as from the proxy); Settings sent again first register it anew
    t.send(settings=producer_settings("TopicP"))
    assert t.recv().status.code == Code.OK
    assert [c["clientId"] for c in producers(gbroker, "TopicP")["connectionSet"]] == ["prod@1"]
    t.end()
    assert list(t.call) == []
    # the stream's end closes the session: its emptied group is kept as 4.9.8 keeps it (clientManagementRules=4,
    # the default: SUCCESS with no connection; README conformance table)
    wait_until(lambda: producers(gbroker, "TopicP") == {"connectionSet": []} and gbroker.grpc.sessions == {})


def test_consumer_settings_listed_and_removed_when_the_stream_ends(gbroker, stub):
    t = Telemetry(stub, md("push@1"))
    t.send(settings=consumer_settings("GroupC", [("TopicC", "TagA || TagB"), ("TopicD", "*")]))
    st = t.recv().settings
    sub = st.subscription
    assert sub.receive_batch_size == 32 and sub.long_polling_timeout.ToMilliseconds() == 200 and not sub.fifo
    assert st.backoff_policy.max_attempts == 17  # retryMaxTimes 16 + 1
    assert [x.ToMilliseconds() for x in st.backoff_policy.customized_backoff.next][:4] == [1000, 5000, 10000, 30000]
    cc = consumers(gbroker, "GroupC")
    assert [(c["clientId"], c["language"], c["version"]) for c in cc["connectionSet"]] == [("push@1", "PYTHON", 479)]
    assert cc["consumeType"] == "CONSUME_PASSIVELY" and cc["messageModel"] == "CLUSTERING"
    table = cc["subscriptionTable"]
    assert sorted(table) == ["TopicC", "TopicD"]
    assert table["TopicC"]["tagsSet"] == ["TagA", "TagB"] and table["TopicD"]["subString"] == "*"
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = "GroupC"
    assert stub.Heartbeat(hb, metadata=md("push@1")).status.code == Code.OK
    a = s.QueryAssignmentRequest()
    a.topic.name, a.group.name = "TopicC", "GroupC"
    r = stub.QueryAssignment(a, metadata=md("push@1"))
    assert r.status.code == Code.OK and [x.message_queue.id for x in r.assignments] == [-1]
    assert r.assignments[0].message_queue.broker.endpoints.addresses[0].port == gbroker.ports["grpc"]
    t.cancel()
    wait_until(lambda: consumers(gbroker, "GroupC") is None)
    assert gbroker.grpc.sessions == {}


def test_simple_consumer_and_receive_answers_no_message(gbroker, stub):
    t = Telemetry(stub, md("simple@1"))
    t.send(settings=consumer_settings("GroupS", [("TopicS", "*")], d.ClientType.SIMPLE_CONSUMER))
    assert t.recv().status.code == Code.OK
    assert consumers(gbroker, "GroupS")["consumeType"] == "CONSUME_ACTIVELY"
    req = s.ReceiveMessageRequest(batch_size=16, auto_renew=False)
    req.group.name = "GroupS"
    req.message_queue.topic.name = "TopicS"
    req.message_queue.id = -1
    req.long_polling_timeout.FromMilliseconds(100)
    answers = list(stub.ReceiveMessage(req, metadata=md("simple@1"), timeout=30))
    assert [(a.status.code, a.status.message) for a in answers] == [(Code.MESSAGE_NOT_FOUND, "no new message")]
    t.end()


def test_expired_session_is_closed_by_the_housekeeping(gbroker, stub):
    t = Telemetry(stub, md("old@1"))
    t.send(settings=consumer_settings("GroupE", [("TopicE", "*")]))
    t.recv()
    assert consumers(gbroker, "GroupE") is not None
    later = gbroker.call(gbroker.registry._clock) + gbroker.config.channel_expired_timeout + 1000
    assert gbroker.call(gbroker.scan_expired, later) == 1
    assert consumers(gbroker, "GroupE") is None
    assert gbroker.grpc.sessions == {}
    assert list(t.call) == []  # its stream was ended


def test_mixed_group_is_listed_whole_and_notify_reaches_the_remoting_client(gbroker, stub):
    c = Client(gbroker.ports["main"])
    assert c.heartbeat(client_id="java@1", group="MixedGroup").code == 0
    c.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    t = Telemetry(stub, md("py@1"))
    t.send(settings=consumer_settings("MixedGroup", [("TopicM", "*")]))
    assert t.recv().status.code == Code.OK
    n = c.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)  # the 5.x join reaches 4.x
    assert n.ext_fields == {"consumerGroup": "MixedGroup"}
    conns = consumers(gbroker, "MixedGroup")["connectionSet"]
    assert sorted((x["clientId"], x["language"]) for x in conns) == [("java@1", "JAVA"), ("py@1", "PYTHON")]
    r = c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "MixedGroup"})
    assert sorted(json.loads(r.body)["consumerIdList"]) == ["java@1", "py@1"]
    t.end()
    wait_until(lambda: [x["clientId"] for x in consumers(gbroker, "MixedGroup")["connectionSet"]] == ["java@1"])


def test_registry_is_only_touched_on_the_broker_loop(gbroker, stub):
    seen = []
    reg = gbroker.registry
    for name in ("heartbeat", "open_channel", "close_channel", "unregister"):
        orig = getattr(reg, name)

        def wrapped(*a, _orig=orig, **kw):
            seen.append(threading.current_thread())
            return _orig(*a, **kw)
        setattr(reg, name, wrapped)
    t = Telemetry(stub, md("thr@1"))
    t.send(settings=consumer_settings("GroupT", [("TopicT", "*")]))
    t.recv()
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = "GroupT"
    stub.Heartbeat(hb, metadata=md("thr@1"))
    r = s.NotifyClientTerminationRequest()
    r.group.name = "GroupT"
    stub.NotifyClientTermination(r, metadata=md("thr@1"))
    assert len(seen) >= 4 and set(seen) == {gbroker._thread}


def test_unsupported_rpcs_answer_not_implemented(stub):
    r = stub.SendMessage(s.SendMessageRequest(), metadata=md())
    assert r.status.code == Code.NOT_IMPLEMENTED and "not supported" in r.status.message
    assert stub.AckMessage(s.AckMessageRequest(), metadata=md()).status.code == Code.NOT_IMPLEMENTED
    pulled = list(stub.PullMessage(s.PullMessageRequest(), metadata=md()))
    assert [p.status.code for p in pulled] == [Code.NOT_IMPLEMENTED]


def test_bad_settings_end_the_stream_and_the_endpoint_keeps_serving(gbroker, stub):
    t = Telemetry(stub, md("bad@1"))
    t.send(settings=d.Settings(client_type=d.ClientType.PRODUCER))  # neither publishing nor subscription
    with pytest.raises(grpc.RpcError) as e:
        t.recv()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no publishing or subscription" in e.value.details()
    t2 = Telemetry(stub, md("bad@2"))
    t2.send(settings=consumer_settings("bad group!", [("TopicB", "*")]))
    with pytest.raises(grpc.RpcError) as e:
        t2.recv()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Traceback" not in e.value.details()
    wait_until(lambda: gbroker.grpc.sessions == {})
    # undecodable bytes, an oversized message: refused by grpc; the endpoint answers the next request
    raw = grpc.insecure_channel(f"127.0.0.1:{gbroker.ports['grpc']}")
    call = raw.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute")
    with pytest.raises(grpc.RpcError) as e:
        call(b"\xff\xff\xff\xff", metadata=md())
    assert "Traceback" not in (e.value.details() or "")
    with pytest.raises(grpc.RpcError) as e:
        call(b"\x0a" + b"\x80\x80\x80\x03" + b"x" * (5 * 1024 * 1024), metadata=md())
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    raw.close()
    req = s.QueryRouteRequest()
    req.topic.name = "StillServing"
    assert stub.QueryRoute(req, metadata=md()).status.code == Code.OK


def test_a_repeated_heartbeat_takes_the_repeat_path_and_anything_else_the_full_one(gbroker, stub, monkeypatch):
    """The same request bytes of a session again: answered from the registry's repeat path (which still refreshes
    the session); a changed request, new Settings, a bad group and undecodable bytes go the full way."""
    ep = gbroker.grpc
    now = [gbroker.call(gbroker.registry._clock)]
    monkeypatch.setattr(gbroker.registry, "_clock", lambda: now[0])
    t = Telemetry(stub, md("rep@1"))
    t.send(settings=consumer_settings("GroupRep", [("TopicRep", "TagA")]))
    assert t.recv().status.code == Code.OK
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = "GroupRep"
    answers = [stub.Heartbeat(hb, metadata=md("rep@1")) for _ in range(3)]
    assert [(a.status.code, a.status.message) for a in answers] == [(Code.OK, "OK")] * 3
    assert ep.heartbeat_repeats == 2  # the first one armed it
    # a repeat refreshes the session as a full heartbeat does: not expired a timeout after the first heartbeat
    timeout = gbroker.config.channel_expired_timeout
    now[0] += timeout - 1000
    assert stub.Heartbeat(hb, metadata=md("rep@1")).status.code == Code.OK
    assert ep.heartbeat_repeats == 3
    assert gbroker.call(gbroker.scan_expired, now[0] + 2000) == 0
    assert [c["clientId"] for c in consumers(gbroker, "GroupRep")["connectionSet"]] == ["rep@1"]
    # other bytes (another group, here an illegal one): the full path and its status
    bad = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    bad.group.name = "bad group!"
    assert stub.Heartbeat(bad, metadata=md("rep@1")).status.code == Code.ILLEGAL_CONSUMER_GROUP
    assert ep.heartbeat_repeats == 3
    # new Settings (another subscription): the same heartbeat bytes take the full path once, then repeat again
    t.send(settings=consumer_settings("GroupRep", [("TopicRep2", "TagB")]))
    assert t.recv().status.code == Code.OK
    assert stub.Heartbeat(hb, metadata=md("rep@1")).status.code == Code.OK
    assert ep.heartbeat_repeats == 3
    assert sorted(consumers(gbroker, "GroupRep")["subscriptionTable"]) == ["TopicRep2"]
    assert stub.Heartbeat(hb, metadata=md("rep@1")).status.code == Code.OK
    assert ep.heartbeat_repeats == 4
    # another session's identical bytes are its own: a client without Settings is not answered from rep@1's path
    r = stub.Heartbeat(hb, metadata=md("other@1"))
    assert (r.status.code, r.status.message) == (Code.UNRECOGNIZED_CLIENT_TYPE,
                                                 "cannot find client settings for this client")
    # undecodable bytes: refused without the parser's text, and the endpoint keeps serving
    raw = grpc.insecure_channel(f"127.0.0.1:{gbroker.ports['grpc']}")
    with pytest.raises(grpc.RpcError) as e:
        raw.unary_unary("/apache.rocketmq.v2.MessagingService/Heartbeat")(b"\xff\xff\xff\xff", metadata=md("rep@1"))
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert e.value.details() == "Invalid protobuf byte sequence"
    raw.close()
    assert stub.Heartbeat(hb, metadata=md("rep@1")).status.code == Code.OK
    assert ep.heartbeat_repeats == 5
    # after termination the session is gone: the same bytes are no repeat
    term = s.NotifyClientTerminationRequest()
    term.group.name = "GroupRep"
    assert stub.NotifyClientTermination(term, metadata=md("rep@1")).status.code == Code.OK
    assert stub.Heartbeat(hb, metadata=md("rep@1")).status.code == Code.UNRECOGNIZED_CLIENT_TYPE
    assert ep.heartbeat_repeats == 5
    t.end()


def test_a_failing_handler_answers_internal_error_without_its_text(gbroker, stub, monkeypatch):
    def boom(request):
        raise RuntimeError("secret detail")
    monkeypatch.setattr(gbroker.grpc, "query_route", boom)
    req = s.QueryRouteRequest()
    req.topic.name = "TopicX"
    r = stub.QueryRoute(req, metadata=md())
    assert (r.status.code, r.status.message) == (Code.INTERNAL_ERROR, "internal error")
    assert gbroker.grpc.internal_errors == 1


def test_session_budget(gbroker, stub):
    gbroker.grpc.max_sessions = 1
    t = Telemetry(stub, md("one@1"))
    t.send(settings=producer_settings("TopicOne"))
    assert t.recv().status.code == Code.OK
    t2 = Telemetry(stub, md("two@1"))
    t2.send(settings=producer_settings("TopicOne"))
    with pytest.raises(grpc.RpcError) as e:
        t2.recv()
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [c["clientId"] for c in producers(gbroker, "TopicOne")["connectionSet"]] == ["one@1"]
    t.end()


def test_budgets_are_broker_properties(tmp_path):
    """grpcMaxSessions / grpcMaxMessageBytes / ... reach the endpoint: one session and 64 KiB messages here."""
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_max_sessions=1,
                           grpc_max_message_bytes=65536, grpc_max_streams_per_connection=8,
                           grpc_max_concurrent_rpcs=100, grpc_max_metadata_bytes=4096)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}")
    try:
        ep = b.grpc
        assert (ep.max_sessions, ep.max_message_bytes, ep.max_streams_per_connection, ep.max_concurrent_rpcs,
                ep.max_metadata_bytes) == (1, 65536, 8, 100, 4096)
        stub = sg.MessagingServiceStub(channel)
        req = s.QueryRouteRequest()
        req.topic.name = "T" * 70_000  # a 70 KB message: past the 64 KiB budget
        with pytest.raises(grpc.RpcError) as e:
            stub.QueryRoute(req, metadata=md())
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for _ in range(20):  # 4.5 KB of metadata: past the 4 KiB budget, every time
            with pytest.raises(grpc.RpcError):
                stub.QueryRoute(s.QueryRouteRequest(), metadata=md() + [("x-pad", "p" * 4500)])
        t = Telemetry(stub, md("one@1"))
        t.send(settings=producer_settings("TopicOne"))
        assert t.recv().status.code == Code.OK
        t2 = Telemetry(stub, md("two@1"))
        t2.send(settings=producer_settings("TopicOne"))
        with pytest.raises(grpc.RpcError) as e:
            t2.recv()
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        t.end()
    finally:
        channel.close()
        b.stop()


@pytest.mark.parametrize("prop, value", [("grpc_max_sessions", 0), ("grpc_max_message_bytes", 1000),
                                         ("grpc_max_metadata_bytes", 100), ("grpc_max_streams_per_connection", -1)])
def test_budget_properties_are_checked(tmp_path, prop, value):
    from engine.broker.config import ConfigError

    with pytest.raises(ConfigError):
        make_config(tmp_path, **{prop: value}).validate()


def test_a_new_stream_of_the_same_client_replaces_the_old_one(gbroker, stub):
    t1 = Telemetry(stub, md("re@1"))
    t1.send(settings=producer_settings("TopicR"))
    t1.recv()
    t2 = Telemetry(stub, md("re@1"))
    t2.send(settings=producer_settings("TopicR"))
    t2.recv()
    assert list(t1.call) == []  # the older stream is ended; the session stays
    assert [c["clientId"] for c in producers(gbroker, "TopicR")["connectionSet"]] == ["re@1"]
    t2.end()
    wait_until(lambda: producers(gbroker, "TopicR") == {"connectionSet": []})  # kept empty under rules 4


def test_settings_budgets_and_client_id_length(gbroker, stub):
    t = Telemetry(stub, md("many@1"))
    t.send(settings=producer_settings(*(f"T{i}" for i in range(1025))))
    with pytest.raises(grpc.RpcError) as e:
        t.recv()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than 1024 topics" in e.value.details()
    t = Telemetry(stub, md("x" * 1025))
    t.send(settings=producer_settings("TopicL"))
    with pytest.raises(grpc.RpcError) as e:
        t.recv()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert producers(gbroker, "TopicL") is None and producers(gbroker, "T0") is None


def test_languages_and_peer_addresses():
    from engine.codec.enums import LanguageCode
    from engine.broker.grpc_endpoint import language_of, peer_address

    assert [language_of(x) for x in ("PYTHON", "java", "GOLANG", "DOT_NET", "NODE_JS", "COBOL", None)] == [
        LanguageCode.PYTHON, LanguageCode.JAVA, LanguageCode.GO, LanguageCode.DOTNET, LanguageCode.NODE_JS,
        LanguageCode.OTHER, LanguageCode.OTHER]
    assert peer_address("ipv4:127.0.0.1:4321") == "127.0.0.1:4321"
    assert peer_address("ipv6:%5B::1%5D:4321") == "[::1]:4321"


# ---------------------------------------------------------------------------------------------------------------
# recorded like any member; the capture of the real 5.x Python client; the on_request hook

CAPTURE = Path(__file__).parent / "data" / "grpc" / "python-5.1.2.txtpb"


def test_a_grpc_session_is_recorded_and_scanned_like_any_member(tmp_path):
    from engine import ConsumerData, HeartbeatData, build_subscription, decode_heartbeat, encode_heartbeat
    from engine.codec.enums import ConsumeFromWhere, ConsumeType, MessageModel
    from engine.recording.recorder import iter_records
    from engine.recording.scan_py import scan

    rec = tmp_path / "rec"
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), record_dir=str(rec))).start()
    try:
        stub = sg.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}"))
        t = Telemetry(stub, md("rec@1"))
        t.send(settings=consumer_settings("GroupRec", [("TopicRec", "TagA || TagB")]))
        assert t.recv().status.code == Code.OK
        hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
        hb.group.name = "GroupRec"
        assert stub.Heartbeat(hb, metadata=md("rec@1")).status.code == Code.OK
        assert stub.Heartbeat(hb, metadata=md("rec@1")).status.code == Code.OK  # the repeat path records too
        assert b.grpc.heartbeat_repeats == 1
        session_id = b.grpc.sessions["rec@1"].id
        # a 4.x member of the same group with another subscription: the scan sees the two disagree
        c = Client(b.ports["main"])
        java = HeartbeatData("java@1", consumers=[ConsumerData(
            "GroupRec", ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING,
            ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, subscriptions=[build_subscription("TopicOther", "*", 1)])])
        assert c.call(RequestCode.HEART_BEAT, {}, encode_heartbeat(java)).code == 0
        t.end()
    finally:
        b.stop()
    records = [r for r in iter_records(rec) if r.conn_id == session_id]
    assert len(records) == 3  # the Settings and the two Heartbeats
    for r in records:
        assert r.language.name == "PYTHON" and r.remote_addr.startswith("127.0.0.1:")
        data = decode_heartbeat(r.body)
        assert data.client_id == "rec@1" and not data.producers
        [consumer] = data.consumers
        assert consumer.group == "GroupRec" and consumer.consume_type == ConsumeType.CONSUME_PASSIVELY
        assert [(x.topic, sorted(x.tags)) for x in consumer.subscriptions] == [("TopicRec", ["TagA", "TagB"])]
    assert len({r.conn_id for r in iter_records(rec)}) == 2  # the session's id is not a connection's
    findings = scan(rec)
    [size] = [g for g in findings["group_sizes"] if g["group"] == "GroupRec"]
    assert size["role"] == "consumer" and size["members"] == 2 and size["max_members"] == 2
    [span] = [x for x in findings["inconsistent_subscriptions"] if x["group"] == "GroupRec"]
    assert sorted(c for v in span["variants"] for c in v["clients"]) == ["java@1", "rec@1"]


def test_capture_format_round_trip_and_bad_text():
    from engine.broker.grpc_endpoint import CaptureError, format_capture, parse_capture

    req = s.QueryRouteRequest()
    req.topic.name = "T === x\n=== y"  # a string that looks like an entry line stays inside its request
    term = s.NotifyClientTerminationRequest()  # an empty request
    cmd = s.TelemetryCommand(settings=producer_settings("T"))
    meta = (("x-mq-client-id", "c@1"), ("authorization", "MQv2-HMAC-SHA1 Credential=ak"), ("x-mq-namespace", ""))
    text = format_capture([("QueryRoute", meta, req), ("NotifyClientTermination", meta, term),
                           ("Telemetry", meta, cmd)])
    assert "authorization" not in text  # signatures and dates are not kept
    entries = parse_capture(text)
    assert [(m, md_, r) for m, md_, r in entries] == [
        ("QueryRoute", (("x-mq-client-id", "c@1"), ("x-mq-namespace", "")), req),
        ("NotifyClientTermination", (("x-mq-client-id", "c@1"), ("x-mq-namespace", "")), term),
        ("Telemetry", (("x-mq-client-id", "c@1"), ("x-mq-namespace", "")), cmd)]
    for bad, match in (("junk\n=== QueryRoute\n---\n", "before the first"),
                       ("=== NoSuchRpc\n---\n", "not a MessagingService method"),
                       ("=== QueryRoute\nx-mq-client-id: a\n", "no '---' line"),
                       ("=== QueryRoute\nno colon here\n---\n", "key: value"),
                       ("=== QueryRoute\n---\ntopic { nme: 1 }\n", "capture entry 1")):
        with pytest.raises(CaptureError, match=match):
            parse_capture(bad)


def test_the_real_python_clients_capture_replayed_registers_what_the_live_client_did(gbroker, stub):
    """tests/data/grpc/python-5.1.2.txtpb (scripts/grpc_capture.py: the official client's producer, push consumer
    and simple consumer against this broker) sent again: the same groups as the live client had, then none."""
    from engine.broker.grpc_endpoint import parse_capture

    entries = parse_capture(CAPTURE.read_text())
    assert {m for m, _, _ in entries} == {"QueryRoute", "Telemetry", "Heartbeat", "QueryAssignment",
                                          "ReceiveMessage", "NotifyClientTermination"}
    ids = {}
    for _, meta, req in entries:
        if isinstance(req, s.TelemetryCommand):
            ids[d.ClientType.Name(req.settings.client_type)] = dict(meta)["x-mq-client-id"]
    assert sorted(ids) == ["PRODUCER", "PUSH_CONSUMER", "SIMPLE_CONSUMER"]
    assert all(dict(meta)["x-mq-language"] == "PYTHON" for _, meta, _ in entries)
    streams, listed = {}, None
    # a repeat: a session's heartbeat with its previous heartbeat's bytes, no other Settings between
    last_heartbeat, last_settings, repeats = {}, {}, 0
    for method, meta, req in entries:
        client_id = dict(meta)["x-mq-client-id"]
        if method == "Telemetry" and last_settings.get(client_id) != req.settings:
            last_heartbeat.pop(client_id, None)
            last_settings[client_id] = req.settings
        elif method == "Heartbeat":
            repeats += last_heartbeat.get(client_id) == req.SerializeToString()
            last_heartbeat[client_id] = req.SerializeToString()
        if method == "NotifyClientTermination" and listed is None:  # before the first client leaves
            listed = (producers(gbroker, "TopicCapture"), consumers(gbroker, "GID_CAPTURE_PUSH"),
                      consumers(gbroker, "GID_CAPTURE_SIMPLE"))
        if method == "Telemetry":
            if client_id not in streams:
                streams[client_id] = Telemetry(stub, list(meta))
            streams[client_id].send_command(req)
            assert streams[client_id].recv().status.code == Code.OK
        elif method == "ReceiveMessage":
            answers = list(stub.ReceiveMessage(req, metadata=list(meta), timeout=30))
            assert [a.status.code for a in answers] == [Code.MESSAGE_NOT_FOUND]
        else:
            answer = getattr(stub, method)(req, metadata=list(meta))
            assert answer.status.code == Code.OK, (method, answer.status)
    prod, push, simple = listed
    assert [(c["clientId"], c["language"]) for c in prod["connectionSet"]] == [(ids["PRODUCER"], "PYTHON")]
    assert [(c["clientId"], c["language"]) for c in push["connectionSet"]] == [(ids["PUSH_CONSUMER"], "PYTHON")]
    assert push["consumeType"] == "CONSUME_PASSIVELY"
    assert push["subscriptionTable"]["TopicCapture"]["tagsSet"] == ["TagA", "TagB"]
    assert [(c["clientId"], c["language"]) for c in simple["connectionSet"]] == [(ids["SIMPLE_CONSUMER"], "PYTHON")]
    assert simple["consumeType"] == "CONSUME_ACTIVELY"
    assert simple["subscriptionTable"]["TopicCapture"]["subString"] == "*"
    # the client sends the same HeartbeatRequest every time: each one after a session's first is a repeat
    assert repeats == 9 - 3 and gbroker.grpc.heartbeat_repeats == repeats  # 9 heartbeats of 3 clients
    # the terminations at the end of the capture: every registration gone, as after the live client's shutdown
    assert producers(gbroker, "TopicCapture") is None
    assert consumers(gbroker, "GID_CAPTURE_PUSH") is None and consumers(gbroker, "GID_CAPTURE_SIMPLE") is None
    for t in streams.values():
        t.end()
    wait_until(lambda: gbroker.grpc.sessions == {})


def test_the_on_request_hook_sees_requests_and_its_failure_is_only_logged(gbroker, stub, caplog):
    seen = []
    gbroker.grpc.on_request = lambda method, meta, req: seen.append((method, dict(meta)["x-mq-client-id"], req))
    req = s.QueryRouteRequest()
    req.topic.name = "TopicHook"
    assert stub.QueryRoute(req, metadata=md("hook@1")).status.code == Code.OK
    t = Telemetry(stub, md("hook@1"))
    t.send(settings=producer_settings("TopicHook"))
    assert t.recv().status.code == Code.OK
    assert [(m, c) for m, c, _ in seen] == [("QueryRoute", "hook@1"), ("Telemetry", "hook@1")]
    assert seen[0][2] == req and seen[1][2].settings.publishing.topics[0].name == "TopicHook"

    def boom(method, meta, request):
        raise RuntimeError("hook bug")
    gbroker.grpc.on_request = boom
    with caplog.at_level(logging.ERROR, logger="engine.grpc"):
        assert stub.QueryRoute(req, metadata=md("hook@1")).status.code == Code.OK
        hb = stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER), metadata=md("hook@1"))
        assert hb.status.code == Code.OK
        t.send(settings=producer_settings("TopicHook"))
        assert t.recv().status.code == Code.OK
    assert [r.getMessage() for r in caplog.records if r.name == "engine.grpc"] == ["gRPC on_request hook failed"] * 3
    assert gbroker.grpc.internal_errors == 0
    t.end()


# ---------------------------------------------------------------------------------------------------------------
# sessions across a broker restart


def _restart(tmp_path, b, **kw):
    ports = b.ports
    b.stop()
    return Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"], **kw)).start()


def test_sessions_survive_a_graceful_restart_and_come_back_with_their_next_heartbeat(tmp_path):
    """A 5.x client does not send its Settings again when its broker comes back (the Python client 5.1.2 only
    every 300 s): the Settings a graceful stop saved register it again at its next Heartbeat."""
    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    stub = sg.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}"))
    tc = Telemetry(stub, md("cons@1"))
    tc.send(settings=consumer_settings("GroupRs", [("TopicRs", "TagA || TagB")]))
    assert tc.recv().status.code == Code.OK
    tp = Telemetry(stub, md("prod@1"))
    tp.send(settings=producer_settings("TopicRs"))
    assert tp.recv().status.code == Code.OK
    tx = Telemetry(stub, md("gone@1"))
    tx.send(settings=producer_settings("TopicGone"))
    assert tx.recv().status.code == Code.OK
    b = _restart(tmp_path, b)
    try:
        assert (tmp_path / "store" / "config" / "grpcSessions.json").exists() is False  # read once, removed
        assert sorted(b.grpc.dormant) == ["cons@1", "gone@1", "prod@1"] and b.grpc.sessions == {}
        assert consumers(b, "GroupRs") is None and producers(b, "TopicRs") is None
        with pytest.raises(grpc.RpcError):  # the old streams ended with the old broker
            tc.recv()
        hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
        hb.group.name = "GroupRs"
        assert stub.Heartbeat(hb, metadata=md("cons@1")).status.code == Code.OK
        cc = consumers(b, "GroupRs")
        assert [(c["clientId"], c["language"]) for c in cc["connectionSet"]] == [("cons@1", "PYTHON")]
        assert cc["subscriptionTable"]["TopicRs"]["tagsSet"] == ["TagA", "TagB"]
        assert stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER),
                              metadata=md("prod@1")).status.code == Code.OK
        assert [c["clientId"] for c in producers(b, "TopicRs")["connectionSet"]] == ["prod@1"]
        assert b.grpc.restored == 2
        # a client unknown before the restart is not registered by a Heartbeat; one that leaves is forgotten
        r = stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER), metadata=md("new@1"))
        assert r.status.code == Code.UNRECOGNIZED_CLIENT_TYPE
        r = stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=md("gone@1"))
        assert r.status.code == Code.UNRECOGNIZED_CLIENT_TYPE and "gone@1" not in b.grpc.dormant
        # the restored session takes the client's new Telemetry stream when it opens one
        t2 = Telemetry(stub, md("cons@1"))
        t2.send(settings=consumer_settings("GroupRs", [("TopicRs", "*")]))
        assert t2.recv().status.code == Code.OK
        assert consumers(b, "GroupRs")["subscriptionTable"]["TopicRs"]["subString"] == "*"
        t2.end()
        wait_until(lambda: consumers(b, "GroupRs") is None)
    finally:
        b.stop()


def test_saved_sessions_expire_and_a_bad_file_is_ignored(tmp_path, caplog):
    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    stub = sg.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}"))
    t = Telemetry(stub, md("old@1"))
    t.send(settings=producer_settings("TopicOld"))
    assert t.recv().status.code == Code.OK
    ports = b.ports
    b.stop()
    path = tmp_path / "store" / "config" / "grpcSessions.json"
    head, rest = path.read_text().split("\n", 1)  # a header line, then one line per session
    doc = json.loads(head)
    doc["savedMs"] -= 200_000  # stopped longer ago than channelExpiredTimeout (120 s): expired meanwhile
    path.write_text(json.dumps(doc) + "\n" + rest)
    b = Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"])).start()
    assert b.grpc.dormant == {} and not path.exists()
    b.stop()
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="engine.grpc"):
        b = Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"])).start()
    try:
        assert b.grpc.dormant == {} and not path.exists()
        assert any("gRPC sessions file" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
        r = stub.Heartbeat(s.HeartbeatRequest(client_type=d.ClientType.PRODUCER), metadata=md("old@1"))
        assert r.status.code == Code.UNRECOGNIZED_CLIENT_TYPE
    finally:
        b.stop()


def test_settings_again_after_termination_past_the_session_budget_end_the_stream_resource_exhausted(gbroker, stub):
    """A terminated client sending Settings again on its stream needs a new session: past the budget its stream
    ends RESOURCE_EXHAUSTED (not INVALID_ARGUMENT, not an internal error)."""
    gbroker.grpc.max_sessions = 1
    t = Telemetry(stub, md("first@1"))
    t.send(settings=producer_settings("TopicBudget"))
    assert t.recv().status.code == Code.OK
    r = stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=md("first@1"))
    assert r.status.code == Code.OK
    other = Telemetry(stub, md("second@1"))
    other.send(settings=producer_settings("TopicBudget"))
    assert other.recv().status.code == Code.OK  # takes the only slot
    t.send(settings=producer_settings("TopicBudget"))
    with pytest.raises(grpc.RpcError) as e:
        t.recv()
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many client sessions" in e.value.details()
    assert gbroker.grpc.internal_errors == 0
    assert [c["clientId"] for c in producers(gbroker, "TopicBudget")["connectionSet"]] == ["second@1"]
    other.end()


def test_tls_with_alpn_h2(tmp_path, grpc_transport):
    """grpcTlsCertPath / grpcTlsKeyPath: the port speaks TLS (ALPN h2) on both transports; a plaintext client gets
    nothing."""
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    with pytest.raises(ConfigError):
        make_config(tmp_path, grpc_server_port=free_port(), grpc_tls_cert_path=str(cert)).validate()
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_tls_cert_path=str(cert),
                           grpc_tls_key_path=str(key))).start()
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        channel = grpc.secure_channel(f"127.0.0.1:{b.ports['grpc']}", creds,
                                      options=[("grpc.ssl_target_name_override", "localhost")])
        req = s.QueryRouteRequest()
        req.topic.name = "TopicTls"
        assert sg.MessagingServiceStub(channel).QueryRoute(req, metadata=md(), timeout=10).status.code \
            == Code.TOPIC_NOT_FOUND
        channel.close()
        plain = grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}")
        with pytest.raises(grpc.RpcError) as e:
            sg.MessagingServiceStub(plain).QueryRoute(req, metadata=md(), timeout=3)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        plain.close()
    finally:
        b.stop()

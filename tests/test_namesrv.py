"""The broker behind a name server as a deployment runs it (tests/nameserver.py keeps 4.9.8's route table from the
broker's REGISTER_BROKER), and the routes a standalone broker answers itself, which follow the name server's."""
import json
import logging
import time

import pytest

from engine.broker.controller import Broker
from engine.codec.enums import RequestCode, ResponseCode
from engine.registry.topic_config_manager import TopicConfig
from tests.nameserver import APPLY_TOPIC_SUGGESTION, NameServer
from tests.test_server import Client, hb_body, make_config, wait_until

GROUP = "demo_consumer_group"  # the group of hb_body()'s consumer
RETRY = f"%RETRY%{GROUP}"


@pytest.fixture
def nameserver():
    ns = NameServer().start()
    yield ns
    ns.stop()


@pytest.fixture
def brokers():
    started = []
    yield started
    for b in started:
        b.stop()


def start(brokers, tmp_path, **kw):
    b = Broker(make_config(tmp_path, broker_ip1="127.0.0.1", **kw)).start()
    brokers.append(b)
    return b


def queue_data(route):
    (qd,) = route["queueDatas"]
    return {k: qd[k] for k in ("perm", "readQueueNums", "writeQueueNums", "topicSysFlag")}


def q(perm, n, sys_flag=0):
    return {"perm": perm, "readQueueNums": n, "writeQueueNums": n, "topicSysFlag": sys_flag}


#: 4.9.8's TopicConfigManager constructor with 4.9.8's default properties (defaultTopicQueueNums=8), cluster
#: DefaultCluster and broker broker-a
JAVA_START_TOPICS = {
    "SELF_TEST_TOPIC": q(6, 1),
    "TBW102": q(7, 8),
    "BenchmarkTest": q(6, 1024),
    "DefaultCluster": q(7, 16),
    "broker-a": q(7, 1),
    "OFFSET_MOVED_EVENT": q(6, 1),
    "SCHEDULE_TOPIC_XXXX": q(6, 18),
    "DefaultCluster_REPLY_TOPIC": q(6, 1),
}


def test_start_registers_the_topics_a_4_9_8_broker_registers(nameserver, brokers, tmp_path):
    b = start(brokers, tmp_path, namesrv_addr=nameserver.addr, broker_name="broker-a", default_topic_queue_nums=8)
    assert wait_until(lambda: nameserver.count(RequestCode.REGISTER_BROKER) >= 1, 10)
    topics = {t: {k: v for k, v in qd.items() if k != "brokerName"} for t, qd in nameserver.topics_of("broker-a").items()}
    assert topics == JAVA_START_TOPICS
    # a producer of a topic with no route finds this broker through TBW102's route, as a Java client does
    route = nameserver.route("TBW102")
    assert route["brokerDatas"] == [{"brokerAddrs": {0: f"127.0.0.1:{b.ports['main']}"}, "brokerName": "broker-a",
                                     "cluster": "DefaultCluster"}]
    # no other topic has a route until the broker creates it
    c = Client(nameserver.port)
    r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert r.remark == ("No topic route info in name server for the topic: TopicTest"
                        "\nSee http://rocketmq.apache.org/docs/faq/ for further details.")


def test_start_topics_follow_the_properties(nameserver, brokers, tmp_path):
    """autoCreateTopicEnable=false: no TBW102; clusterTopicEnable / brokerTopicEnable=false: perm 1 (inherit only);
    traceTopicEnable: msgTraceTopicName; defaultTopicQueueNums sizes TBW102 (this broker's default: 4)."""
    start(brokers, tmp_path / "a", namesrv_addr=nameserver.addr, broker_name="broker-a", broker_cluster_name="C1",
          auto_create_topic_enable=False, cluster_topic_enable=False, broker_topic_enable=False,
          trace_topic_enable=True, msg_trace_topic_name="MyTrace")
    start(brokers, tmp_path / "b", namesrv_addr=nameserver.addr, broker_name="broker-b", broker_cluster_name="C2")
    assert wait_until(lambda: nameserver.count(RequestCode.REGISTER_BROKER) >= 2, 10)
    a, b = nameserver.topics_of("broker-a"), nameserver.topics_of("broker-b")
    assert "TBW102" not in a and a["C1"]["perm"] == 1 and a["broker-a"]["perm"] == 1
    assert a["MyTrace"]["readQueueNums"] == 1 and "RMQ_SYS_TRACE_TOPIC" not in b and "C1_REPLY_TOPIC" in a
    assert b["TBW102"]["perm"] == 7 and b["TBW102"]["readQueueNums"] == b["TBW102"]["writeQueueNums"] == 4
    assert b["C2"]["perm"] == 7 and b["broker-b"]["perm"] == 7
    assert [qd["brokerName"] for qd in nameserver.route("TBW102")["queueDatas"]] == ["broker-b"]


def test_topics_json_keeps_its_entries_for_start_topics(nameserver, brokers, tmp_path):
    """Java puts the start topics in its table, then loads topics.json over them: a stored TBW102 wins."""
    config = tmp_path / "store" / "config"
    config.mkdir(parents=True)
    stored = TopicConfig("TBW102", read_queue_nums=2, write_queue_nums=2, perm=5).to_dict()
    (config / "topics.json").write_text(json.dumps({"topicConfigTable": {"TBW102": stored}}))
    b = start(brokers, tmp_path, namesrv_addr=nameserver.addr, broker_name="broker-a")
    assert wait_until(lambda: nameserver.route("TBW102") is not None, 10)
    assert queue_data(nameserver.route("TBW102")) == q(5, 2)
    assert b.call(lambda: b.registry.topic_config("SELF_TEST_TOPIC")).read_queue_nums == 1


def test_a_retry_topic_is_routed_once_the_heartbeat_creates_it(nameserver, brokers, tmp_path):
    """No route before the group's first heartbeat; the heartbeat creates it (1 queue, perm 6) and the broker
    registers at once, not at the next period (30 s)."""
    b = start(brokers, tmp_path, namesrv_addr=nameserver.addr, broker_name="broker-a")
    assert wait_until(lambda: nameserver.count(RequestCode.REGISTER_BROKER) >= 1, 10)
    assert nameserver.route(RETRY) is None
    c = Client(b.ports["main"])
    assert c.call(RequestCode.HEART_BEAT, {}, hb_body()).code == 0
    assert wait_until(lambda: nameserver.route(RETRY) is not None, 5)
    assert queue_data(nameserver.route(RETRY)) == q(6, 1)
    assert nameserver.count(RequestCode.REGISTER_BROKER) == 2
    b.stop()
    # UNREGISTER_BROKER at shutdown: its routes are gone
    assert wait_until(lambda: nameserver.route(RETRY) is None and nameserver.route("TBW102") is None, 10)


def test_the_broker_routes_are_dropped_when_its_connection_closes(nameserver, brokers, tmp_path):
    b = start(brokers, tmp_path, namesrv_addr=nameserver.addr, broker_name="broker-a")
    assert wait_until(lambda: nameserver.route("TBW102") is not None, 10)
    b.call(lambda: [b._namesrv._drop(a) for a in list(b._namesrv._conns)])  # onChannelDestroy
    assert wait_until(lambda: nameserver.route("TBW102") is None, 10)


def test_name_server_answers_as_4_9_8(nameserver, brokers, tmp_path):
    """Route bodies: bare numeric brokerAddrs keys below V4_9_4 (401), standard JSON from it; a body whose CRC does
    not match its header is refused; other codes are not supported."""
    b = start(brokers, tmp_path, namesrv_addr=nameserver.addr, broker_name="broker-a")
    assert wait_until(lambda: nameserver.route("TBW102") is not None, 10)
    import engine

    c = Client(nameserver.port)
    addr = f"127.0.0.1:{b.ports['main']}"
    old = c.sock.sendall(engine.RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=77, version=317,
                                                ext_fields={"topic": "TBW102"}).encode())
    assert old is None
    r = c.read(pred=lambda x: x.opaque == 77)
    assert b'"brokerAddrs":{0:"%s"}' % addr.encode() in r.body
    r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})  # version 479
    assert json.loads(r.body)["brokerDatas"][0]["brokerAddrs"] == {"0": addr}
    r = c.call(RequestCode.REGISTER_BROKER, {"brokerName": "x", "brokerAddr": "1.2.3.4:5", "clusterName": "C",
                                             "brokerId": "0", "bodyCrc32": "1"}, b'{"topicConfigSerializeWrapper":{}}')
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
    assert c.call(RequestCode.HEART_BEAT, {}).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert nameserver.unsupported == [RequestCode.HEART_BEAT]
    info = json.loads(c.call(RequestCode.GET_BROKER_CLUSTER_INFO).body)
    assert info == {"brokerAddrTable": {"broker-a": {"brokerAddrs": {"0": addr}, "brokerName": "broker-a",
                                                     "cluster": "DefaultCluster"}},
                    "clusterAddrTable": {"DefaultCluster": ["broker-a"]}}


# ------------------------------------------------------------------------------------------------ standalone


def route_of(c, topic):
    r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return r.code, (json.loads(r.body) if r.code == 0 else r.remark)


def test_standalone_routes_a_retry_topic_only_once_its_heartbeat_created_it(brokers, tmp_path):
    """Java's name server answers TOPIC_NOT_EXIST for %RETRY%G until the broker has created it in the group's first
    heartbeat (retryQueueNums 1, perm 6); a standalone broker answers the same, and creates nothing on the query."""
    b = start(brokers, tmp_path)
    c = Client(b.ports["main"])
    code, remark = route_of(c, RETRY)
    assert code == ResponseCode.TOPIC_NOT_EXIST and remark == (f"No topic route info in name server for the topic: "
                                                               f"{RETRY}{APPLY_TOPIC_SUGGESTION}")
    assert b.call(lambda: b.registry.topic_config(RETRY)) is None
    assert route_of(c, "%DLQ%" + GROUP)[0] == ResponseCode.TOPIC_NOT_EXIST
    assert c.call(RequestCode.HEART_BEAT, {}, hb_body()).code == 0
    code, route = route_of(c, RETRY)
    assert code == 0 and queue_data(route) == q(6, 1)
    # an ordinary unknown topic keeps the auto-create rule: defaultTopicQueueNums queues, perm 6
    code, route = route_of(c, "TopicTest")
    assert code == 0 and queue_data(route) == q(6, 4)
    # the start topics are routed as registered: TBW102 perm 7
    assert queue_data(route_of(c, "TBW102")[1]) == q(7, 4)
    # a DLQ topic an admin created is routed with its config
    b.call(lambda: b.registry.update_topic_config(TopicConfig("%DLQ%G", 1, 1, perm=2)))
    assert queue_data(route_of(c, "%DLQ%G")[1]) == q(2, 1)


def test_a_start_topic_named_twice_is_the_later_one_as_in_javas_constructor(brokers, tmp_path):
    """TopicConfigManager's constructor puts its topics in order into one map: a broker named as its cluster has
    the broker-name topic (1 queue, perm by brokerTopicEnable), which replaced the cluster-name topic."""
    b = start(brokers, tmp_path, broker_name="same", broker_cluster_name="same", broker_topic_enable=False)
    c = Client(b.ports["main"])
    assert queue_data(route_of(c, "same")[1]) == q(1, 1)


def test_standalone_without_auto_create_routes_only_known_topics(brokers, tmp_path):
    b = start(brokers, tmp_path, auto_create_topic_enable=False)
    c = Client(b.ports["main"])
    assert route_of(c, "TopicTest")[0] == ResponseCode.TOPIC_NOT_EXIST
    assert route_of(c, "TBW102")[0] == ResponseCode.TOPIC_NOT_EXIST
    assert queue_data(route_of(c, "SELF_TEST_TOPIC")[1]) == q(6, 1)
    b.call(lambda: b.registry.update_topic_config(TopicConfig("TopicTest", 2, 2)))
    assert queue_data(route_of(c, "TopicTest")[1]) == q(6, 2)


def test_standalone_routes_what_the_name_server_routes(nameserver, brokers, tmp_path):
    """The same broker state, asked of a standalone broker and of the name server it registered with: the same
    queue datas for the start topics, a created retry topic, and the same TOPIC_NOT_EXIST for one not created."""
    alone = start(brokers, tmp_path / "alone", broker_name="broker-a")
    behind = start(brokers, tmp_path / "behind", broker_name="broker-a", namesrv_addr=nameserver.addr)
    for b in (alone, behind):
        assert Client(b.ports["main"]).call(RequestCode.HEART_BEAT, {}, hb_body()).code == 0
    assert wait_until(lambda: nameserver.route(RETRY) is not None, 10)
    c_alone, c_ns = Client(alone.ports["main"]), Client(nameserver.port)
    for topic in ["TBW102", "SELF_TEST_TOPIC", "DefaultCluster", "broker-a", RETRY, "%RETRY%other", "%DLQ%x"]:
        a, n = route_of(c_alone, topic), route_of(c_ns, topic)
        assert a[0] == n[0], topic
        if a[0] != 0:
            assert a[1] == n[1], topic  # the same remark
        else:
            assert queue_data(a[1]) == queue_data(n[1]), topic


# ------------------------------------------------------------------------------------------------ sends create topics


def send(c, topic, default_topic="TBW102", queue_nums=4, v2=True, unit_mode=False, **kw):
    if v2:
        ext = {"a": "PID", "b": topic, "c": default_topic, "d": str(queue_nums), "e": "0", "f": "0",
               "g": "1700000000000", "h": "0", "i": "", "j": "0", "k": str(unit_mode).lower(), "m": "false"}
        return c.call(RequestCode.SEND_MESSAGE_V2, ext, b"hello", **kw)
    ext = {"producerGroup": "PID", "topic": topic, "defaultTopic": default_topic,
           "defaultTopicQueueNums": str(queue_nums), "queueId": "0", "sysFlag": "0", "bornTimestamp": "1",
           "flag": "0", "unitMode": str(unit_mode).lower()}
    return c.call(RequestCode.SEND_MESSAGE, ext, b"hello", **kw)


def test_a_send_creates_its_topic_from_tbw102_and_registers_it_at_once(nameserver, brokers, tmp_path):
    """msgCheck -> createTopicInSendMessageMethod: min(client's defaultTopicQueueNums, TBW102's write queues)
    queues, TBW102's perm without inherit (6), then registerBrokerAll at once; the send itself is not stored."""
    b = start(brokers, tmp_path, namesrv_addr=nameserver.addr, broker_name="broker-a", default_topic_queue_nums=8)
    assert wait_until(lambda: nameserver.route("TBW102") is not None, 10)
    c = Client(b.ports["main"])
    r = send(c, "TopicNew", queue_nums=4)
    assert (r.code, r.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 310 not supported")
    assert wait_until(lambda: nameserver.route("TopicNew") is not None, 5)
    assert queue_data(nameserver.route("TopicNew")) == q(6, 4)
    assert send(c, "TopicBig", queue_nums=16, v2=False).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert send(c, "TopicUnit", unit_mode=True).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert wait_until(lambda: nameserver.route("TopicBig") is not None and nameserver.route("TopicUnit"), 5)
    assert queue_data(nameserver.route("TopicBig")) == q(6, 8)
    assert queue_data(nameserver.route("TopicUnit")) == q(6, 4, sys_flag=1)  # TopicSysFlag unit
    # an existing topic is left as it is
    assert send(c, "TopicNew", queue_nums=2).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert b.call(lambda: b.registry.topic_config("TopicNew")).read_queue_nums == 4


def test_a_send_is_refused_as_4_9_8_refuses_it(nameserver, brokers, tmp_path):
    b = start(brokers, tmp_path / "a", namesrv_addr=nameserver.addr, broker_name="broker-a", auto_create_max_topics=1)
    c = Client(b.ports["main"])
    not_exist = ("topic[%s] not exist, apply first please!\nSee http://rocketmq.apache.org/docs/faq/ for further "
                 "details.")
    r = send(c, "T1", default_topic="NoSuchDefault")
    assert (r.code, r.remark) == (ResponseCode.TOPIC_NOT_EXIST, not_exist % "T1")
    r = send(c, "T1", default_topic="SELF_TEST_TOPIC")  # exists, but without the inherit perm
    assert (r.code, r.remark) == (ResponseCode.TOPIC_NOT_EXIST, not_exist % "T1")
    r = send(c, "bad topic")
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "The specified topic contains illegal characters, "
                                                              "allowing only ^[%|a-zA-Z0-9_-]+$")
    assert send(c, "x" * 128).remark == "The specified topic is longer than topic max length."
    r = send(c, "SCHEDULE_TOPIC_XXXX")
    assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "Sending message to topic[SCHEDULE_TOPIC_XXXX] is forbidden.")
    # autoCreateMaxTopics=1 (the start topics not counted): the first send creates its topic, the next is refused
    assert send(c, "T2").code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    r = send(c, "T3")
    assert (r.code, r.remark) == (ResponseCode.TOPIC_NOT_EXIST, not_exist % "T3")
    assert b.call(lambda: (b.registry.topic_config("T2") is not None, b.registry.topic_config("T3"))) == (True, None)
    # without autoCreateTopicEnable there is no TBW102 to create from
    b2 = start(brokers, tmp_path / "b", broker_name="broker-b", auto_create_topic_enable=False)
    r = send(Client(b2.ports["main"]), "T4")
    assert (r.code, r.remark) == (ResponseCode.TOPIC_NOT_EXIST, not_exist % "T4")


def test_a_send_to_a_topic_not_there_logs_msg_checks_warn(brokers, tmp_path, caplog):
    """AbstractSendMessageProcessor.msgCheck logs 'the topic {} not exist, producer: {}' before it creates the
    topic (created or refused alike); a topic that exists logs nothing."""
    b = start(brokers, tmp_path, broker_name="broker-a")
    c = Client(b.ports["main"])
    with caplog.at_level(logging.WARNING, logger="RocketmqBroker"):
        send(c, "TopicNew")
        send(c, "TopicNew")
        send(c, "T1", default_topic="NoSuchDefault")
    lines = [r.getMessage() for r in caplog.records if "not exist, producer" in r.getMessage()]
    peer = f"/127.0.0.1:{c.sock.getsockname()[1]}"
    assert lines == [f"the topic TopicNew not exist, producer: {peer}", f"the topic T1 not exist, producer: {peer}"]


def test_the_topic_properties_are_used_not_listed_as_unused():
    """They were 'accepted, not used by this broker' before: now they are this broker's properties."""
    from engine.broker.config import BrokerConfig

    cfg = BrokerConfig.load(overrides={"autoCreateTopicEnable": "false", "clusterTopicEnable": "false",
                                       "brokerTopicEnable": "false", "traceTopicEnable": "true",
                                       "msgTraceTopicName": "T_TRACE", "namesrvAddr": "127.0.0.1:9876"})
    assert cfg.java_unused_properties() == []
    assert (cfg.auto_create_topic_enable, cfg.cluster_topic_enable, cfg.broker_topic_enable,
            cfg.trace_topic_enable, cfg.msg_trace_topic_name) == (False, False, False, True, "T_TRACE")


def test_a_broker_stops_at_once_while_it_registers_a_new_topic(nameserver, tmp_path):
    """A heartbeat creates its group's retry topic, which is registered at once; a stop right then ends at once.
    (Python 3.11's asyncio.wait_for could swallow the stop's cancel of the registration task, which then waited
    for the next topic for ever and held Broker.stop until its 30 s join timeout, and stop_async for ever.)"""
    for i in range(5):
        b = Broker(make_config(tmp_path / str(i), broker_ip1="127.0.0.1", namesrv_addr=nameserver.addr)).start()
        c = Client(b.ports["main"])
        assert c.call(RequestCode.HEART_BEAT, {}, hb_body()).code == 0
        c.close()
        thread = b._thread
        t0 = time.monotonic()
        b.stop(timeout=10)
        assert not thread.is_alive() and time.monotonic() - t0 < 5, i


def test_registration_lines_are_broker_outer_apis(nameserver, tmp_path, caplog):
    """BrokerOuterAPI's lines (4.9.8), which alert rules on a Java broker's broker.log look for: each registration's
    'register broker[0]to name server ADDR OK', the stop's 'unregisterBroker OK, NamesrvAddr: ADDR', and
    'registerBroker Exception, ADDR' (WARN) for a name server that cannot be reached."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with caplog.at_level(logging.INFO, logger="engine.broker.controller"):
        b = Broker(make_config(tmp_path, broker_ip1="127.0.0.1",
                               namesrv_addr=f"{nameserver.addr};{dead}")).start()
        b.stop()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "engine.broker.controller"]
    assert (logging.INFO, f"register broker[0]to name server {nameserver.addr} OK") in lines
    assert (logging.INFO, f"unregisterBroker OK, NamesrvAddr: {nameserver.addr}") in lines
    assert any(level == logging.WARNING and m.startswith(f"registerBroker Exception, {dead} (") for level, m in lines)
    assert any(level == logging.WARNING and m.startswith(f"unregisterBroker Exception, {dead} (") for level, m in lines)

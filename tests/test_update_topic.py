"""UPDATE_AND_CREATE_TOPIC (17) as 4.9.8's AdminBrokerProcessor.updateAndCreateTopic answers it, its topic-table
budget (maxTopicConfigs), ACL's admin requirement, the name-server push and `rmqhb updateTopic`."""
import json
import os
import subprocess
import sys

import pytest

from engine.broker.admin import AdminClient, AdminError
from engine.codec.enums import RequestCode, ResponseCode
from test_server import broker_factory, wait_until  # noqa: F401  (fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def header(topic, r="4", w="4", perm="6", **kw):
    """The CreateTopicRequestHeader mqadmin updateTopic sends."""
    return {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": r, "writeQueueNums": w, "perm": perm,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false", **kw}


def invoke(b, ext, **kw):
    with AdminClient("127.0.0.1", b.ports["main"], **kw) as c:
        return c.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)


def stored(b):
    path = b.registry.store.config_dir / "topics.json"
    return json.loads(path.read_text())["topicConfigTable"]


def test_creates_and_updates_a_topic_written_at_once(broker_factory):
    b = broker_factory()
    r = invoke(b, header("TopicNew", r="3", w="5", perm="4", topicSysFlag="1"))
    assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
    tc = b.call(b.registry.topic_config, "TopicNew")
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag) == (3, 5, 4, 1)
    assert stored(b)["TopicNew"] == tc.to_dict()  # on disk already, not within a second
    # an existing topic is updated; the route answers the new config
    assert invoke(b, header("TopicNew", r="8", w="8", perm="6")).code == ResponseCode.SUCCESS
    assert stored(b)["TopicNew"]["readQueueNums"] == 8
    with AdminClient("127.0.0.1", b.ports["main"]) as c:
        qd = c.route("TopicNew")["queueDatas"][0]
    assert (qd["readQueueNums"], qd["writeQueueNums"], qd["perm"]) == (8, 8, 6)


@pytest.mark.parametrize("topic, remark", [
    ("", "The specified topic is blank."),
    ("  ", "The specified topic is blank."),
    ("bad topic", "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
    ("T" * 128, "The specified topic is longer than topic max length."),
    ("TBW102", "The topic[TBW102] is conflict with system topic."),
    ("RMQ_SYS_TRANS_HALF_TOPIC", "The topic[RMQ_SYS_TRANS_HALF_TOPIC] is conflict with system topic."),
    ("rmq_sys_x", "The topic[rmq_sys_x] is conflict with system topic."),
    # the broker's start topics are system topics (TopicValidator.addSystemTopic): the cluster and broker names
    ("DefaultCluster", "The topic[DefaultCluster] is conflict with system topic."),
    ("broker-a", "The topic[broker-a] is conflict with system topic."),
    ("DefaultCluster_REPLY_TOPIC", "The topic[DefaultCluster_REPLY_TOPIC] is conflict with system topic."),
])
def test_refusals_with_java_remarks(broker_factory, topic, remark):
    b = broker_factory(broker_cluster_name="DefaultCluster", broker_name="broker-a")
    before = b.call(b.registry.topic_config, topic) if topic else None
    r = invoke(b, header(topic))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    assert (b.call(b.registry.topic_config, topic) if topic else None) == before


@pytest.mark.parametrize("ext, remark", [
    ({"perm": None}, "the custom field <perm> is null"),
    ({"order": None}, "the custom field <order> is null"),
    ({"readQueueNums": "x"}, "the custom field <readQueueNums> is not a number: 'x'"),
    ({"topicFilterType": "NOPE"}, "No enum constant org.apache.rocketmq.common.TopicFilterType.NOPE"),
])
def test_bad_header_fields(broker_factory, ext, remark):
    b = broker_factory()
    fields = {k: v for k, v in {**header("TopicH"), **ext}.items() if v is not None}
    r = invoke(b, fields)
    assert r.code == ResponseCode.SYSTEM_ERROR and remark in r.remark
    assert b.call(b.registry.topic_config, "TopicH") is None


def test_topic_table_budget(broker_factory):
    b = broker_factory(max_topic_configs=0)
    n = b.call(lambda: len(b.registry.store.topics.table))
    b.stop()
    b = broker_factory(max_topic_configs=n + 2)
    assert invoke(b, header("Budget1")).code == ResponseCode.SUCCESS
    assert invoke(b, header("Budget2")).code == ResponseCode.SUCCESS
    r = invoke(b, header("Budget3"))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, f"the topic table is full (maxTopicConfigs={n + 2})")
    assert b.call(b.registry.topic_config, "Budget3") is None and "Budget3" not in stored(b)
    assert 'auto_create_refused_total{kind="topic_table"} 1' in b.call(b.render_metrics)
    # an existing topic is still updated
    assert invoke(b, header("Budget1", r="2", w="2")).code == ResponseCode.SUCCESS
    assert b.call(b.registry.topic_config, "Budget1").read_queue_nums == 2


ACL = ("accounts:\n  - accessKey: opsadmin\n    secretKey: s3cr3t-value\n    admin: true\n"
       "  - accessKey: plainuser\n    secretKey: plain-secret\n    admin: false\n"
       "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: PUB|SUB\n")


def test_acl_needs_an_admin_account(broker_factory, tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    b = broker_factory(acl_enable=True, acl_file=str(acl))
    for kw, remark in (({}, "No accessKey is configured"),
                       ({"access_key": "plainuser", "secret_key": "plain-secret"},
                        "Need admin permission for request code=17, but accessKey='plainuser' is not")):
        r = invoke(b, header("AclTopic"), **kw)
        assert r.code == ResponseCode.NO_PERMISSION and r.remark.startswith(remark)
        assert b.call(b.registry.topic_config, "AclTopic") is None
    r = invoke(b, header("AclTopic"), access_key="opsadmin", secret_key="s3cr3t-value")
    assert r.code == ResponseCode.SUCCESS
    assert b.call(b.registry.topic_config, "AclTopic").read_queue_nums == 4


def test_registered_with_the_name_server_at_once(broker_factory):
    from tests.nameserver import NameServer

    with NameServer() as ns:
        b = broker_factory(namesrv_addr=ns.addr, broker_ip1="127.0.0.1", broker_name="broker-a")
        assert wait_until(lambda: ns.count(RequestCode.REGISTER_BROKER) >= 1, 10)
        assert ns.route("NsTopic") is None
        assert invoke(b, header("NsTopic", r="2", w="3", perm="6")).code == ResponseCode.SUCCESS
        assert wait_until(lambda: ns.route("NsTopic") is not None, 5)  # not the 30 s period
        (qd,) = ns.route("NsTopic")["queueDatas"]
        assert (qd["readQueueNums"], qd["writeQueueNums"], qd["perm"]) == (2, 3, 6)
        # an update is pushed too
        assert invoke(b, header("NsTopic", r="5", w="5", perm="4")).code == ResponseCode.SUCCESS
        assert wait_until(lambda: ns.route("NsTopic")["queueDatas"][0]["readQueueNums"] == 5, 5)
        b.stop()


def rmqhb(*args):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60, cwd=ROOT)


def test_cli_update_topic(broker_factory):
    b = broker_factory()
    addr = f"127.0.0.1:{b.ports['main']}"
    p = rmqhb("updateTopic", "-b", addr, "-t", "CliTopic", "-r", "2", "-w", "3", "-p", "4")
    assert p.returncode == 0, p.stderr
    assert p.stdout == (f"create topic to {addr} success: topic=CliTopic readQueueNums=2 writeQueueNums=3 "
                        "perm=4\n")
    tc = b.call(b.registry.topic_config, "CliTopic")
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (2, 3, 4)
    # a refusal: status 1, the broker's code and remark on one line
    p = rmqhb("updateTopic", "-b", addr, "-t", "TBW102")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == ("UpdateTopicSubCommand command failed: CODE: 1  DESC: The topic[TBW102] is conflict with "
                        "system topic.\n")
    # a bad command line: status 2
    assert rmqhb("updateTopic", "-t", "X").returncode == 2
    assert rmqhb("updateTopic", "-b", addr).returncode == 2


def test_update_topic_in_the_command_list():
    p = rmqhb("--help")
    assert p.returncode == 0 and "updateTopic" in p.stdout


def test_a_5x_client_routes_the_created_topic(broker_factory):
    """docs/grpc.md: QueryRoute answers TOPIC_NOT_FOUND for an unknown topic until `rmqhb updateTopic` makes it."""
    from conftest import require_module

    grpc = require_module("grpc")
    require_module("rocketmq.grpc_protocol")
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol import service_pb2_grpc as sg
    from test_grpc_endpoint import free_port, md

    b = broker_factory(grpc_server_port=free_port())
    port = b.ports["grpc"]
    req = s.QueryRouteRequest()
    req.topic.name = "Topic5x"
    req.endpoints.scheme = d.AddressScheme.IPv4
    req.endpoints.addresses.add(host="127.0.0.1", port=port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = sg.MessagingServiceStub(channel)
        assert stub.QueryRoute(req, metadata=md()).status.code == d.Code.TOPIC_NOT_FOUND
        p = rmqhb("updateTopic", "-b", f"127.0.0.1:{b.ports['main']}", "-t", "Topic5x", "-r", "2", "-w", "2")
        assert p.returncode == 0, p.stderr
        r = stub.QueryRoute(req, metadata=md())
        assert r.status.code == d.Code.OK
        assert [q.id for q in r.message_queues] == [0, 1]
        assert all(q.topic.name == "Topic5x" and q.permission == d.Permission.READ_WRITE for q in r.message_queues)
    finally:
        channel.close()


def test_the_topic_config_lines_are_javas(broker_factory, caplog):
    """TopicConfigManager.updateTopicConfig's lines, with TopicConfig.toString() (4.9.8), not a Python repr."""
    import logging

    b = broker_factory()
    with caplog.at_level(logging.INFO, logger="engine.broker.controller"):
        assert invoke(b, header("TopicLog", r="3", w="5", perm="4")).code == ResponseCode.SUCCESS
        assert invoke(b, header("TopicLog", r="8", w="8", perm="6")).code == ResponseCode.SUCCESS
    lines = [r.getMessage() for r in caplog.records if "topic" in r.getMessage()]
    first = ("TopicConfig [topicName=TopicLog, readQueueNums=3, writeQueueNums=5, perm=R--, topicFilterType=SINGLE_TAG, "
             "topicSysFlag=0, order=false]")
    second = ("TopicConfig [topicName=TopicLog, readQueueNums=8, writeQueueNums=8, perm=RW-, "
              "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]")
    assert f"create new topic [{first}]" in lines
    assert f"update topic config, old:[{first}] new:[{second}]" in lines

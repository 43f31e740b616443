"""Real clients reaching the broker only through a name server, as a deployment runs (issue 27 §1).

The name server is tests/nameserver.py (4.9.8's RouteInfoManager fed by the broker's REGISTER_BROKER); the broker
has 4.9.8's default properties (namesrvAddr set, autoCreateTopicEnable=true) and no topic is created beforehand: the
clients find the broker through TBW102's route and the topics the broker creates and registers at once (a
producer's first send, a consumer group's retry topic). The clients: the C++ client (PyPI rocketmq 0.4.4) and
npm ali-ons 3.12.0, installed by tests/interop/test_interop.py's fixtures; and the 5.x clients (PyPI
rocketmq-python-client 5.1.2, npm rocketmq-client-nodejs 1.0.8) through the broker's gRPC port, whose route answers
are the name server's (a topic nobody created has none, as from the 5.x proxy).
"""
import sys
from pathlib import Path

import pytest

import test_interop as ti
from test_interop import cpp_dir, drivers, ons_dir  # noqa: F401  (fixtures)
from conftest import require_module
from test_grpc_interop import connections, free_port, start_v5, v5_python  # noqa: F401
from test_grpc_node_interop import start_v5_node, v5_node_dir  # noqa: F401
from engine.broker.config import BrokerConfig
from engine.broker.controller import Broker
from engine.codec.enums import RequestCode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.nameserver import NameServer  # noqa: E402

pytestmark = pytest.mark.interop

TOPIC = "TopicNS"


@pytest.fixture
def deployment(tmp_path):
    """The name server and a broker behind it with 4.9.8's default properties (and a gRPC port for 5.x clients)."""
    require_module("grpc")  # the broker's grpc extra: a failure under CI, never a skip
    ns = NameServer().start()
    cfg = BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                       namesrv_addr=ns.addr, broker_ip1="127.0.0.1", broker_name="broker-ns",
                       grpc_server_port=free_port())
    b = Broker(cfg).start()
    yield ns, b
    b.stop()
    ns.stop()


def sent_line(driver):
    return driver.proc.stdout.readline().strip()


def queue_data(route):
    (qd,) = route["queueDatas"]
    return qd["perm"], qd["readQueueNums"], qd["writeQueueNums"]


def test_cpp_and_ali_ons_fleet_behind_a_name_server_without_created_topics(deployment, ons_dir, cpp_dir, drivers,
                                                                           tmp_path):
    ns, b = deployment
    port = b.ports["main"]
    addr = f"127.0.0.1:{port}"
    assert ti.wait_for(lambda: ns.route("TBW102") is not None, 10)
    assert ns.route("TBW102")["brokerDatas"][0]["brokerAddrs"] == {0: addr} and ns.route(TOPIC) is None

    # ali-ons asks only for its topic's own route and gives up on TOPIC_NOT_EXIST (3.12.0 never falls back to
    # TBW102: its producer throws before), so alone it cannot create a topic, with this broker as with Java's
    alone = ti.start_ons(ons_dir, drivers, ns.port, producerGroup="PID_NS_ALONE", send=[TOPIC])
    assert TOPIC in ns.not_found and "TBW102" not in ns.route_queries and ns.route(TOPIC) is None
    alone.close()

    # the C++ producer's send goes through TBW102's route: the broker creates the topic (4 queues, perm 6: the
    # client's defaultTopicQueueNums and TBW102's perm without inherit) and registers it at once; its consumer
    # heartbeats at start (the broker is known from TBW102's route), which creates the group's retry topic
    cpp = ti.start_cpp(cpp_dir, drivers, ns.port, tmp_path / "home", producerGroup="PID_NS_CPP", send=[TOPIC],
                       consumers=[{"group": "CID_NS_CPP", "topic": TOPIC, "expr": "*"}])
    assert ti.wait_for(lambda: ns.route(TOPIC) is not None, 10)
    assert queue_data(ns.route(TOPIC)) == (6, 4, 4)
    assert ns.route(TOPIC)["brokerDatas"][0]["brokerAddrs"] == {0: addr}
    assert ti.wait_for(lambda: len(ti.client_ids(port, "CID_NS_CPP")) == 1, 45)
    assert ti.wait_for(lambda: ns.route("%RETRY%CID_NS_CPP") is not None, 10)
    assert queue_data(ns.route("%RETRY%CID_NS_CPP")) == (6, 1, 1)

    # now the topic has a route: ali-ons (producer and consumer) finds the broker and registers
    ons = ti.start_ons(ons_dir, drivers, ns.port, producerGroup="PID_NS_ONS", send=[TOPIC],
                       consumers=[{"group": "CID_NS_ONS", "topic": TOPIC, "expr": "TagA"}])
    ons_id = ons.ready_line.split()[1]
    assert ti.wait_for(lambda: ti.client_ids(port, "CID_NS_ONS") == [ons_id], 30)
    rc, out, err = ti.admin_cli("producerConnection", "-g", "PID_NS_ONS", "-t", TOPIC, "-b", addr)
    assert rc == 0 and ons_id in out, err
    assert ti.wait_for(lambda: ns.route("%RETRY%CID_NS_ONS") is not None, 10)

    # every route came from the name server; the broker was asked nothing it does not serve (a route query would be)
    assert {TOPIC, "TBW102"} <= set(ns.route_queries) and ns.unsupported == []
    assert b.metrics.requests.get("other", 0) == 0, dict(b.metrics.requests)
    assert b.metrics.requests[RequestCode.SEND_MESSAGE_V2] + b.metrics.requests[RequestCode.SEND_MESSAGE] >= 2
    # 4.9.8 answers a never-committed queue's QUERY_CONSUMER_OFFSET with offset 0 (no message on disk), so the
    # consumers start there and ask no GET_MAX_OFFSET (answered QUERY_NOT_FOUND, as 5.x does, they ask it per queue)
    assert b.metrics.requests[RequestCode.QUERY_CONSUMER_OFFSET] > 0
    assert b.metrics.requests.get(RequestCode.GET_MAX_OFFSET, 0) == 0, dict(b.metrics.requests)
    ons.close()
    cpp.close(tolerate_crash=True)
    assert ti.wait_for(lambda: ti.consumer_connection(port, "CID_NS_ONS") is None, 30)
    assert ti.wait_for(lambda: ti.consumer_connection(port, "CID_NS_CPP") is None, 60)


def test_5x_clients_behind_a_name_server_use_the_topic_a_send_created(deployment, cpp_dir, v5_python, v5_node_dir,
                                                                      drivers, tmp_path):
    """The 5.x clients of the same deployment: before any send, a topic has no route on the gRPC port either (the
    proxy's TOPIC_NOT_FOUND, which the Python 5.x producer logs) and none is created; once a 4.x producer's send
    created it through TBW102, the Python and Node.js 5.x clients route it and register, and their groups' retry
    topics reach the name server at once (1 queue, perm 6), as the 4.x consumers' groups' do."""
    ns, b = deployment
    topic = "TopicNS5"
    assert ti.wait_for(lambda: ns.route("TBW102") is not None, 10) and ns.route(topic) is None

    # a 5.x producer of it starts (5.1.2 logs the failed route query and goes on), routing nothing
    refused = start_v5(v5_python, drivers, b, tmp_path / "v5refused", producerTopics=[topic])
    assert refused.close() == 0
    log = (tmp_path / "v5refused" / "logs" / "rocketmq_python" / "rocketmq_client.log").read_text()
    assert f"query topic raise exception, 40402, topic not found: {topic}" in log, log[-3000:]
    assert b.registry.topic_config(topic) is None and ns.route(topic) is None

    cpp = ti.start_cpp(cpp_dir, drivers, ns.port, tmp_path / "home", producerGroup="PID_NS5_CPP", send=[topic])
    assert ti.wait_for(lambda: ns.route(topic) is not None, 10)
    assert queue_data(ns.route(topic)) == (6, 4, 4)

    py = start_v5(v5_python, drivers, b, tmp_path / "v5", producerTopics=[topic],
                  pushConsumers=[{"group": "GID_NS5_PY", "topic": topic, "expr": "*"}])
    py_producer, py_push = py.ready_line.split()[1:]
    node = start_v5_node(v5_node_dir, drivers, b, tmp_path / "v5node",
                         simpleConsumers=[{"group": "GID_NS5_NODE", "topic": topic}])
    (node_simple,) = node.ready_line.split()[1:]
    assert ti.wait_for(lambda: connections(b, "GID_NS5_PY") == [(py_push, "PYTHON")])
    assert ti.wait_for(lambda: connections(b, "GID_NS5_NODE") == [(node_simple, "HTTP")])
    assert ti.wait_for(lambda: connections(b, topic, producer=True) == [(py_producer, "PYTHON")])
    for group in ("GID_NS5_PY", "GID_NS5_NODE"):
        assert ti.wait_for(lambda: ns.route("%RETRY%" + group) is not None, 10), group
        assert queue_data(ns.route("%RETRY%" + group)) == (6, 1, 1)
    assert ns.unsupported == []
    assert py.close() == 0 and node.close() == 0
    cpp.close(tolerate_crash=True)
    assert connections(b, "GID_NS5_PY") is None and connections(b, "GID_NS5_NODE") is None

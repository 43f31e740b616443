"""Real clients reaching the broker only through a name server, as a deployment runs (issue 27 §1).

The name server is tests/nameserver.py (4.9.8's RouteInfoManager fed by the broker's REGISTER_BROKER); the broker
has 4.9.8's default properties (namesrvAddr set, autoCreateTopicEnable=true) and no topic is created beforehand: the
clients find the broker through TBW102's route and the topics the broker creates and registers at once (a
producer's first send, a consumer group's retry topic). The clients: the C++ client (PyPI rocketmq 0.4.4) and
npm ali-ons 3.12.0, installed by tests/interop/test_interop.py's fixtures.
"""
import sys
from pathlib import Path

import pytest

import test_interop as ti
from test_interop import cpp_dir, drivers, ons_dir  # noqa: F401  (fixtures)
from engine.broker.config import BrokerConfig
from engine.broker.controller import Broker
from engine.codec.enums import RequestCode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.nameserver import NameServer  # noqa: E402

pytestmark = pytest.mark.interop

TOPIC = "TopicNS"


@pytest.fixture
def deployment(tmp_path):
    ns = NameServer().start()
    cfg = BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                       namesrv_addr=ns.addr, broker_ip1="127.0.0.1", broker_name="broker-ns")
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
    ons.close()
    cpp.close(tolerate_crash=True)
    assert ti.wait_for(lambda: ti.consumer_connection(port, "CID_NS_ONS") is None, 30)
    assert ti.wait_for(lambda: ti.consumer_connection(port, "CID_NS_CPP") is None, 60)

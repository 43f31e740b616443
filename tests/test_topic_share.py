"""Issue 26 s1: route queries and sends prove nothing, so one client address may auto-create at most
autoCreateTopicsPerIp topics and cannot fill autoCreateMaxTopics for every client (the junk-topic attack)."""
import socket

import pytest

from engine.broker.controller import Broker, auto_create_share_key
from engine.codec.enums import RequestCode, ResponseCode
from tests.test_namesrv import send
from tests.test_server import Client, make_config


@pytest.fixture
def broker(tmp_path):
    b = Broker(make_config(tmp_path, broker_ip1="127.0.0.1", auto_create_topics_per_ip=5,
                           auto_create_max_topics=100)).start()
    yield b
    b.stop()


def client_from(port, source_ip):
    c = Client(port)
    c.sock.close()
    c.sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source_ip, 0))
    return c


def route(c, topic):
    return c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def test_one_address_cannot_fill_the_topic_table(broker):
    port = broker.ports["main"]
    attacker = client_from(port, "127.0.0.1")
    codes = [route(attacker, f"Junk{k}").code for k in range(12)]
    assert codes == [ResponseCode.SUCCESS] * 5 + [ResponseCode.TOPIC_NOT_EXIST] * 7
    # a send from the same address is refused too (it would create a topic from TBW102)
    assert send(attacker, "JunkSend").code == ResponseCode.TOPIC_NOT_EXIST
    # topics it already made still route; nothing was created past its share
    assert route(attacker, "Junk0").code == ResponseCode.SUCCESS
    made = broker.call(lambda: sorted(t for t in broker.registry.store.topics.table if t.startswith("Junk")))
    assert made == sorted(f"Junk{k}" for k in range(5))
    # another address still gets its new topics, by route query and by send
    good = client_from(port, "127.0.0.2")
    assert route(good, "GoodTopic").code == ResponseCode.SUCCESS
    assert send(good, "GoodSend").code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED  # created, not stored
    assert broker.call(lambda: broker.registry.topic_config("GoodSend")) is not None
    refused = broker.call(lambda: broker.registry.store.auto_create_refused["topic_ip_share"])
    assert refused == 8
    text = broker.call(broker.render_metrics)
    assert 'auto_create_refused_total{kind="topic_ip_share"} 8' in text


def test_zero_is_no_share(tmp_path):
    b = Broker(make_config(tmp_path, auto_create_topics_per_ip=0, auto_create_max_topics=100)).start()
    try:
        c = Client(b.ports["main"])
        assert all(route(c, f"T{k}").code == ResponseCode.SUCCESS for k in range(12))
    finally:
        b.stop()


def test_the_share_key_is_the_ipv4_address_or_the_ipv6_64():
    assert auto_create_share_key("10.1.2.3") == "10.1.2.3"
    assert auto_create_share_key("2001:db8:1:2:aaaa::1") == auto_create_share_key("2001:db8:1:2:bbbb::7") \
        == "2001:db8:1:2::/64"
    assert auto_create_share_key("2001:db8:1:3::1") != auto_create_share_key("2001:db8:1:2::1")
    assert auto_create_share_key("not-an-ip:x") == "not-an-ip:x"

"""The broker front end on real sockets: processors, notifications, limits, faults, ACL, metrics, name server."""
import asyncio
import json
import logging
import socket
import struct
import threading
import time
import urllib.request
import zlib

import pytest

import engine
from engine.broker.acl import sign_request
from engine.broker.admin import AdminClient, consumer_connection_main, producer_connection_main
from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig
from engine.codec.enums import RequestCode, ResponseCode

JAVA_BODY = (
    b'{"clientID":"%s","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":'
    b'"CONSUME_PASSIVELY","groupName":"%s","messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":'
    b'false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1718000000001,"tagsSet":[],"topic":'
    b'"%%RETRY%%%s"},{"classFilterMode":false,"codeSet":[2598919,2598920],"expressionType":"TAG","subString":'
    b'"TagA || TagB","subVersion":1718000000000,"tagsSet":["TagA","TagB"],"topic":"TopicTest"}],"unitMode":false}],'
    b'"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"},{"groupName":"%s"}],'
    b'"withoutSub":false}'
)


def hb_body(client_id="10.0.0.1@1#1", group="demo_consumer_group", producer="demo_producer_group"):
    return JAVA_BODY % (client_id.encode(), group.encode(), group.encode(), producer.encode())


def make_config(tmp_path, **kw):
    base = dict(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"))
    base.update(kw)
    return BrokerConfig(**base)


@pytest.fixture
def broker_factory(tmp_path, broker_defaults):
    started = []

    def make(**kw):
        b = Broker(make_config(tmp_path, **{**broker_defaults, **kw})).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory):
    return broker_factory()


class Client:
    """A raw remoting client: send commands, read every frame the broker writes (responses and requests)."""

    def __init__(self, port, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.decoder = engine.FrameDecoder()
        self.inbox = []
        self.opaque = 0

    def send(self, code, ext=None, body=b"", flag=0, serialize_type="JSON", raw=False, opaque=None):
        self.opaque += 1
        cmd = engine.RemotingCommand(code, opaque=self.opaque if opaque is None else opaque, flag=flag,
                                     ext_fields=ext, body=body, serialize_type=serialize_type)
        self.sock.sendall(cmd.encode())
        return cmd

    def read(self, timeout=5.0, pred=lambda c: True):
        deadline = time.monotonic() + timeout
        while True:
            for c in self.inbox:
                if pred(c):
                    self.inbox.remove(c)
                    return c
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no matching frame")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                raise ConnectionError("closed by broker")
            self.inbox.extend(self.decoder.feed(data))

    def call(self, code, ext=None, body=b"", **kw):
        cmd = self.send(code, ext, body, **kw)
        return self.read(pred=lambda c: c.is_response and c.opaque == cmd.opaque)

    def heartbeat(self, **kw):
        return self.call(RequestCode.HEART_BEAT, {}, hb_body(**kw))

    def closed_by_peer(self, timeout=5.0):
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def wait_until(fn, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.02)
    return fn()


def consumer_ids(broker, group):
    return list(broker.call(broker.registry.consumer_ids, group))


# ------------------------------------------------------------------------------------------------ processors


def test_heartbeat_v1_response(broker):
    c = Client(broker.ports["main"])
    r = c.heartbeat()
    assert r.code == 0 and r.flag == 1 and r.version == 479 and r.serialize_type == "JSON"
    assert r.ext_fields is None  # clientManagementRules=4 (default): a 4.9 broker's answer (tests/test_rules.py)
    assert consumer_ids(broker, "demo_consumer_group") == ["10.0.0.1@1#1"]


def test_fast_port_is_main_minus_two_and_serves_the_same(broker_factory, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    if port < 1026:
        pytest.skip("no usable port pair")
    try:
        b = broker_factory(listen_port=port)
    except OSError:
        pytest.skip("port pair busy")
    assert b.ports["fast"] == port - 2
    c = Client(b.ports["fast"])
    r = c.heartbeat(client_id="vip@1")
    assert r.code == 0 and "vip@1" in consumer_ids(b, "demo_consumer_group")


def test_answers_in_the_request_serialize_type(broker):
    c = Client(broker.ports["main"])
    r = c.call(RequestCode.HEART_BEAT, {}, hb_body(), serialize_type="ROCKETMQ")
    assert r.serialize_type == "ROCKETMQ" and r.code == 0 and r.version == 479


def test_unknown_code_and_oneway(broker):
    c = Client(broker.ports["main"])
    r = c.call(999)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and r.remark == " request type 999 not supported"
    # a oneway request is processed but never answered: the next frame is the answer to the next request
    c.send(RequestCode.HEART_BEAT, {}, hb_body(client_id="oneway@1"), flag=2)
    r = c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "demo_consumer_group"})
    assert r.opaque == c.opaque and json.loads(r.body) == {"consumerIdList": ["oneway@1"]}
    assert not [x for x in c.inbox if x.is_response]


def test_consumer_list_notify_unregister_and_close(broker):
    a, b = Client(broker.ports["main"]), Client(broker.ports["main"])
    assert a.heartbeat(client_id="a@1").code == 0
    n1 = a.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)  # a new member is told too
    assert n1.flag == 2 and n1.ext_fields == {"consumerGroup": "demo_consumer_group"} and not n1.is_response
    assert b.heartbeat(client_id="b@1").code == 0
    n2 = a.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert n2.ext_fields["consumerGroup"] == "demo_consumer_group"
    r = a.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "demo_consumer_group"})
    assert r.code == 0 and sorted(json.loads(r.body)["consumerIdList"]) == ["a@1", "b@1"]
    r = a.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "nobody"})
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "no consumer for this group, nobody"
    r = a.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {})
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "the custom field <consumerGroup> is null"
    # UNREGISTER_CLIENT removes the entry of the connection it arrives on
    r = b.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "b@1", "consumerGroup": "demo_consumer_group",
                                               "producerGroup": ""})
    assert r.code == 0 and r.ext_fields == {}
    assert consumer_ids(broker, "demo_consumer_group") == ["a@1"]
    # closing a connection removes it at once
    a.close()
    assert wait_until(lambda: consumer_ids(broker, "demo_consumer_group") == [])


def test_admin_connection_lists_over_the_wire(broker, capsys):
    c = Client(broker.ports["main"])
    assert c.heartbeat(client_id="10.0.0.9@77#1").code == 0
    addr = f"127.0.0.1:{broker.ports['main']}"
    assert consumer_connection_main(["-g", "demo_consumer_group", "-b", addr, "--json"]) == 0
    cc = json.loads(capsys.readouterr().out)
    (conn,) = cc["connectionSet"]
    assert conn["clientId"] == "10.0.0.9@77#1" and conn["language"] == "JAVA" and conn["version"] == 479
    assert conn["clientAddr"].startswith("127.0.0.1:")
    assert cc["consumeType"] == "CONSUME_PASSIVELY" and cc["messageModel"] == "CLUSTERING"
    assert set(cc["subscriptionTable"]) == {"TopicTest", "%RETRY%demo_consumer_group"}
    assert cc["subscriptionTable"]["TopicTest"]["subString"] == "TagA || TagB"
    assert consumer_connection_main(["-g", "demo_consumer_group", "-b", addr]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["#ClientId", "#ClientAddr", "#Language", "#Version"]
    assert "10.0.0.9@77#1" in text and "V5_3_3" in text and "ConsumeType: CONSUME_PASSIVELY" in text
    assert producer_connection_main(["-g", "demo_producer_group", "-t", "TopicTest", "-b", addr]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("0001  10.0.0.9@77#1") and line.split()[-2:] == ["JAVA", "V5_3_3"]
    assert consumer_connection_main(["-g", "nobody", "-b", addr]) == 1
    assert "the consumer group[nobody] not online" in capsys.readouterr().err
    assert producer_connection_main(["-g", "nobody", "-t", "T", "-b", addr]) == 1
    assert "the producer group[nobody] not exist" in capsys.readouterr().err


def test_route_answers_point_at_this_broker(broker):
    c = Client(broker.ports["main"])
    r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
    route = json.loads(r.body)
    assert r.code == 0
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": f"127.0.0.1:{broker.ports['main']}"}
    assert route["queueDatas"][0]["perm"] == 6 and route["queueDatas"][0]["readQueueNums"] == 4
    assert route["queueDatas"][0]["brokerName"] == route["brokerDatas"][0]["brokerName"] == broker.config.broker_name
    r = c.call(RequestCode.GET_BROKER_CLUSTER_INFO)
    assert json.loads(r.body)["clusterAddrTable"] == {"DefaultCluster": [broker.config.broker_name]}


def test_offsets_and_max_offset(broker):
    c = Client(broker.ports["main"])
    assert c.heartbeat().code == 0
    q = {"consumerGroup": "demo_consumer_group", "topic": "TopicTest", "queueId": "1"}
    rules4 = broker.config.client_management_rules == 4
    # 5.3+ commits offsets only for a topic that exists (a standalone broker creates it on the first route query,
    # as clients do); 4.9.8 for any (README: conformance table; tests/test_conformance_answers.py)
    r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, dict(q, queueId="2", commitOffset="42"))
    if rules4:
        assert r.code == 0
    else:
        assert r.code == ResponseCode.TOPIC_NOT_EXIST and r.remark == "Topic TopicTest not exist!"
    assert c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == 0
    r = c.call(RequestCode.QUERY_CONSUMER_OFFSET, q)
    # never committed: 4.9.8 answers offset 0 (an empty queue), 5.x QUERY_NOT_FOUND
    if rules4:
        assert r.code == 0 and r.ext_fields == {"offset": "0"}
    else:
        assert r.code == 22 and r.remark.startswith("Not found")
    r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, dict(q, commitOffset="42"))
    assert r.code == 0
    r = c.call(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert r.code == 0 and r.ext_fields["offset"] == "42"
    r = c.call(RequestCode.GET_MAX_OFFSET, {"topic": "TopicTest", "queueId": "0"})
    assert r.code == 0 and r.ext_fields == {"offset": "0"}


def test_pull_is_held_then_answered_not_found(broker):
    c = Client(broker.ports["main"])
    ext = {"consumerGroup": "g", "topic": "TopicTest", "queueId": "0", "queueOffset": "5", "maxMsgNums": "32",
           "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "400", "subscription": "*", "subVersion": "1"}
    t0 = time.monotonic()
    pull = c.send(RequestCode.PULL_MESSAGE, ext)
    # the connection keeps working while the pull is held
    assert c.heartbeat().code == 0
    assert time.monotonic() - t0 < 0.3
    r = c.read(pred=lambda x: x.is_response and x.opaque == pull.opaque)
    assert time.monotonic() - t0 >= 0.35
    assert r.code == ResponseCode.PULL_NOT_FOUND and r.remark == "no new message"
    assert r.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "5", "minOffset": "0", "maxOffset": "0"}


def test_bad_heartbeat_body_is_an_error_answer_not_a_disconnect(broker):
    c = Client(broker.ports["main"])
    r = c.call(RequestCode.HEART_BEAT, {}, b'{"clientID":')
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark
    assert c.heartbeat().code == 0  # same connection still served


def test_heartbeats_stay_fast_while_admin_queue_is_flooded(broker):
    c = Client(broker.ports["main"])
    assert c.heartbeat().code == 0
    flood = Client(broker.ports["main"])
    req = b"".join(engine.RemotingCommand(RequestCode.GET_CONSUMER_CONNECTION_LIST, opaque=i,
                                          ext_fields={"consumerGroup": "demo_consumer_group"}).encode()
                   for i in range(3000))
    threading.Thread(target=flood.sock.sendall, args=(req,), daemon=True).start()
    worst = 0.0
    for _ in range(20):
        t0 = time.monotonic()
        assert c.heartbeat().code == 0
        worst = max(worst, time.monotonic() - t0)
    assert worst < 1.0, worst


# ------------------------------------------------------------------------------------------------ faults and limits


def _good_client_keeps_working(broker, client):
    assert client.heartbeat(client_id="good@1").code == 0


def test_faults_are_cut_off_and_others_keep_being_served(broker_factory, caplog):
    b = broker_factory(incomplete_frame_timeout_ms=600, channel_expired_timeout=500)
    port = b.ports["main"]
    good = Client(port)
    _good_client_keeps_working(b, good)
    caplog.set_level(logging.INFO, logger="engine.broker.server")

    # each bad client first registers, then misbehaves
    garbage = Client(port)
    assert garbage.heartbeat(client_id="garbage@1").code == 0
    garbage.sock.sendall(b"\x00\x00\x00\x10\x07garbage-garbage!")
    assert garbage.closed_by_peer()
    _good_client_keeps_working(b, good)

    huge = Client(port)
    assert huge.heartbeat(client_id="huge@1").code == 0
    huge.sock.sendall(struct.pack(">I", 0x7FFFFFF0) + b"\x00\x00\x00\x10")
    assert huge.closed_by_peer()
    _good_client_keeps_working(b, good)

    trickle = Client(port)
    assert trickle.heartbeat(client_id="trickle@1").code == 0
    frame = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=99, ext_fields={}, body=hb_body()).encode()
    closed = False
    for i in range(0, 40):  # one byte every 0.1 s: never completes within the 0.6 s limit
        try:
            trickle.sock.sendall(frame[i:i + 1])
        except OSError:
            closed = True
            break
        time.sleep(0.1)
        if i % 5 == 0:
            _good_client_keeps_working(b, good)
    assert closed or trickle.closed_by_peer(3)

    midframe = Client(port)
    assert midframe.heartbeat(client_id="midframe@1").code == 0
    midframe.sock.sendall(frame[:20])
    midframe.close()
    _good_client_keeps_working(b, good)

    silent = Client(port)
    assert silent.heartbeat(client_id="silent@1").code == 0

    reasons = [r.getMessage() for r in caplog.records if r.getMessage().startswith("closing")]
    assert any("undecodable frame" in m for m in reasons), reasons
    assert any("incomplete frame" in m for m in reasons), reasons
    assert sum("undecodable frame" in m for m in reasons) == 2  # exactly one reason per bad connection

    # keep the good client alive, let the silent one expire, run the scan (housekeeping does it every 10 s)
    time.sleep(0.7)
    _good_client_keeps_working(b, good)
    assert b.call(b.scan_expired) >= 1
    assert silent.closed_by_peer()
    assert wait_until(lambda: consumer_ids(b, "demo_consumer_group") == ["good@1"])
    for who in ("garbage@1", "huge@1", "trickle@1", "midframe@1", "silent@1"):
        assert who not in consumer_ids(b, "demo_consumer_group")
    pc = b.call(b.registry.producer_connection, "demo_producer_group")
    assert [x["clientId"] for x in pc.to_dict()["connectionSet"]] == ["good@1"]
    assert b.metrics.frame_errors == 2 and b.metrics.expired_channels >= 1


def test_connection_limits(broker_factory):
    b = broker_factory(max_connections_per_ip=2)
    port = b.ports["main"]
    c1, c2 = Client(port), Client(port)
    assert c1.heartbeat(client_id="c1@1").code == 0 and c2.heartbeat(client_id="c2@1").code == 0
    c3 = Client(port)
    r = c3.call(RequestCode.HEART_BEAT, {}, hb_body(client_id="c3@1"))
    assert r.code == ResponseCode.SYSTEM_BUSY and "maxConnectionsPerIp=2" in r.remark
    assert c3.closed_by_peer()
    assert "c3@1" not in consumer_ids(b, "demo_consumer_group")
    assert c1.heartbeat(client_id="c1@1").code == 0


def test_client_that_never_reads_is_disconnected(broker_factory):
    """The transport reports its buffer over the high-water mark (pause_writing): reading from that client
    pauses, and if it stays stalled past writeStallTimeoutMs it is disconnected; others are unaffected.
    (Loopback kernel buffers hold many MB, so the stall is signalled the way the transport signals it.)"""
    b = broker_factory(write_stall_timeout_ms=500)
    port = b.ports["main"]
    good = Client(port)
    assert good.heartbeat(client_id="good@1").code == 0
    lazy = Client(port)
    assert lazy.heartbeat(client_id="lazy@1").code == 0
    conn = next(c for c in b.server.connections if c.remote_port == lazy.sock.getsockname()[1])
    b.call(conn.pause_writing)
    assert conn.reading_paused
    assert lazy.closed_by_peer(5)
    assert b.metrics.connections_closed["write_buffer"] == 1
    assert conn.close_reason.startswith("client does not read its responses")
    assert good.heartbeat(client_id="good@1").code == 0
    assert "lazy@1" not in consumer_ids(b, "demo_consumer_group")


def test_write_buffer_bound(broker_factory):
    """Output queued beyond maxWriteBufferBytes closes the connection at once."""
    b = broker_factory(max_write_buffer_bytes=1024)
    lazy = Client(b.ports["main"])
    assert lazy.heartbeat(client_id="lazy@1").code == 0
    conn = next(iter(b.server.connections))

    class Stuck:  # a transport whose peer reads nothing: everything written stays queued
        def __init__(self, real):
            self.real, self.size = real, 0

        def write(self, data):
            self.size += len(data)

        def get_write_buffer_size(self):
            return self.size

        def __getattr__(self, name):
            return getattr(self.real, name)

    def stick():
        conn.transport = Stuck(conn.transport)
        for _ in range(10):
            conn.send(b"x" * 200)

    b.call(stick)
    assert conn.closing and conn.close_reason.startswith("client does not read its responses (1200 bytes pending)")
    assert wait_until(lambda: "lazy@1" not in consumer_ids(b, "demo_consumer_group"))


# ------------------------------------------------------------------------------------------------ ACL


def test_acl_refuses_unsigned_and_wrongly_signed(broker_factory, tmp_path):
    acl = tmp_path / "plain_acl.yml"
    # unset default permissions are DENY (PlainPermissionManager): the account may subscribe anywhere
    acl.write_text("accounts:\n  - accessKey: rocketmq2\n    secretKey: 12345678\n    admin: false\n"
                   "    defaultTopicPerm: SUB\n    defaultGroupPerm: SUB\n")
    b = broker_factory(acl_enable=True, acl_file=str(acl))
    c = Client(b.ports["main"])
    r = c.heartbeat(client_id="nosig@1")
    assert r.code == ResponseCode.NO_PERMISSION and r.remark == "No accessKey is configured"
    cmd = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=77, ext_fields={}, body=hb_body(client_id="bad@1"))
    sign_request(cmd, "rocketmq2", "wrong-secret")
    c.sock.sendall(cmd.encode())
    r = c.read(pred=lambda x: x.is_response and x.opaque == 77)
    assert r.code == ResponseCode.NO_PERMISSION and r.remark == "Check signature failed for accessKey='rocketmq2'"
    assert b.call(b.registry.consumer_ids, "demo_consumer_group") in ([], None) or not consumer_ids(b, "demo_consumer_group")
    cmd = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=78, ext_fields={}, body=hb_body(client_id="ok@1"))
    sign_request(cmd, "rocketmq2", "12345678")
    c.sock.sendall(cmd.encode())
    r = c.read(pred=lambda x: x.is_response and x.opaque == 78)
    assert r.code == 0 and consumer_ids(b, "demo_consumer_group") == ["ok@1"]
    # route queries (the name-server role) are not authenticated, as on a RocketMQ name server
    assert c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}).code == 0
    # the admin client signs with --access-key/--secret-key
    with AdminClient("127.0.0.1", b.ports["main"], access_key="rocketmq2", secret_key="12345678") as admin:
        assert [x["clientId"] for x in admin.consumer_connection("demo_consumer_group")["connectionSet"]] == ["ok@1"]
    assert b.metrics.acl_denied == 2


# ------------------------------------------------------------------------------------------------ metrics, name server


def test_metrics_endpoint(broker_factory):
    b = broker_factory(metrics_port=0)
    assert "metrics" not in b.ports  # 0 = off
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    mport = s.getsockname()[1]
    s.close()
    b2 = broker_factory(metrics_port=mport)
    c = Client(b2.ports["main"])
    assert c.heartbeat(client_id="m@1").code == 0
    stay = Client(b2.ports["main"])
    assert stay.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}).code == 0
    stay.send(RequestCode.HEART_BEAT, {}, hb_body(client_id="m@2"), flag=2)  # oneway: registered, not answered
    c.sock.sendall(b"\x00\x00\x00\x08\x09bad!bad!")
    assert c.closed_by_peer()
    text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
    assert "# TYPE rocketmq_broker_heartbeats_total counter" in text
    assert "rocketmq_broker_heartbeats_total 2" in text
    assert 'rocketmq_broker_decode_errors_total{kind="frame"} 1' in text
    assert "rocketmq_broker_connections_accepted_total 2" in text
    assert "rocketmq_broker_connections 1" in text
    sent = int(text.split("\nrocketmq_broker_notifications_sent_total ")[1].split()[0])
    assert sent >= 3  # m@1 told on joining, then both when m@2 joined (and m@2 when m@1 left)
    assert 'rocketmq_broker_group_channels{role="consumer",group="demo_consumer_group"} 1' in text
    assert 'rocketmq_broker_group_clients{role="producer",group="demo_producer_group"} 1' in text
    assert 'rocketmq_broker_requests_total{code="105"} 1' in text


class FakeNamesrv:
    """A name server on its own thread that answers every request SUCCESS and keeps what it received."""

    def __init__(self):
        self.received = []
        ready = threading.Event()
        state = {}

        async def main():
            async def handle(reader, writer):
                dec = engine.FrameDecoder()
                while True:
                    data = await reader.read(65536)
                    if not data:
                        break
                    for cmd in dec.feed(data):
                        self.received.append(cmd)
                        writer.write(cmd.response(0, ext_fields={"haServerAddr": "", "masterAddr": ""}).encode())

            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            state["port"] = server.sockets[0].getsockname()[1]
            ready.set()
            await asyncio.sleep(3600)

        threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
        assert ready.wait(10)
        self.port = state["port"]

    def registrations(self):
        return [c for c in list(self.received) if c.code == RequestCode.REGISTER_BROKER]


class FakeTimers:
    """(clock, sleep) of the broker's registration schedule in virtual time: each sleep is recorded and advances
    the clock by its delay; past ``runs`` sleeps the schedule parks for good (the test ends before)."""

    def __init__(self, runs):
        self.now, self.delays, self.runs = 0.0, [], runs

    def clock(self):
        return self.now

    async def sleep(self, delay):
        self.delays.append(delay)
        if len(self.delays) > self.runs:
            await asyncio.get_running_loop().create_future()
        self.now += delay


def test_register_broker_at_start_then_every_period_from_10_s(tmp_path):
    """BrokerController.start: registerBrokerAll at start, then scheduleAtFixedRate(10 s, registerNameServerPeriod)."""
    ns, timers = FakeNamesrv(), FakeTimers(runs=2)
    cfg = make_config(tmp_path, namesrv_addr=f"127.0.0.1:{ns.port}", broker_name="broker-x", broker_ip1="127.0.0.1")
    b = Broker(cfg, namesrv_timers=(timers.clock, timers.sleep)).start()
    try:
        # at start + the runs at +10 s and +40 s; the schedule's third sleep follows the third registration's
        # answer, which the name server has sent when it counts the registration: wait for that sleep too
        assert wait_until(lambda: len(ns.registrations()) == 3 and len(timers.delays) >= 3, 30)
        assert timers.delays[:3] == [10.0, 30.0, 30.0]
        assert b.call(lambda: b._namesrv.registrations) == 3
        # with a name server the broker does not answer routes itself
        c = Client(b.ports["main"])
        assert c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    finally:
        b.stop()
    first = ns.registrations()[0]
    ext = first.ext_fields
    assert ext["brokerName"] == "broker-x" and ext["clusterName"] == "DefaultCluster" and ext["brokerId"] == "0"
    assert ext["brokerAddr"] == f"127.0.0.1:{b.ports['main']}" and ext["compressed"] == "false"
    assert int(ext["bodyCrc32"]) == zlib.crc32(first.body) & 0x7FFFFFFF
    body = json.loads(first.body)
    assert "topicConfigTable" in body["topicConfigSerializeWrapper"] and body["filterServerList"] == []
    assert any(c.code == RequestCode.UNREGISTER_BROKER for c in ns.received)  # on shutdown


def many_groups_body(client_id, groups):
    consumers = ",".join(
        '{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"%s",'
        '"messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],"expressionType":'
        '"TAG","subString":"*","subVersion":1,"tagsSet":[],"topic":"T"}],"unitMode":false}' % g for g in groups)
    return ('{"clientID":"%s","consumerDataSet":[%s],"producerDataSet":[]}' % (client_id, consumers)).encode()


@pytest.mark.parametrize("rules", [4, 5])
def test_new_retry_topics_reach_the_name_server_at_once_coalesced(tmp_path, rules):
    ns, timers = FakeNamesrv(), FakeTimers(runs=0)  # the periodic schedule never runs: every call is accounted for
    cfg = make_config(tmp_path, namesrv_addr=f"127.0.0.1:{ns.port}", broker_ip1="127.0.0.1",
                      client_management_rules=rules)
    b = Broker(cfg, namesrv_timers=(timers.clock, timers.sleep)).start()
    try:
        assert wait_until(lambda: len(ns.registrations()) == 1, 30)  # at start
        c = Client(b.ports["main"])
        assert c.heartbeat(client_id="a@1").code == 0  # a new group: its retry topic is created
        assert wait_until(lambda: len(ns.registrations()) == 2, 30)
        topics = json.loads(ns.registrations()[1].body)["topicConfigSerializeWrapper"]["topicConfigTable"]
        assert topics["%RETRY%demo_consumer_group"]["perm"] == 6
        # 20 retry topics created by one heartbeat: one registration carries them all
        groups = [f"G{i}" for i in range(20)]
        assert c.call(RequestCode.HEART_BEAT, {}, many_groups_body("a@1", groups)).code == 0
        assert wait_until(lambda: len(ns.registrations()) == 3, 30)
        topics = json.loads(ns.registrations()[2].body)["topicConfigSerializeWrapper"]["topicConfigTable"]
        assert {f"%RETRY%{g}" for g in groups} <= set(topics)
        # nothing new: no registration is asked for
        assert c.call(RequestCode.HEART_BEAT, {}, many_groups_body("a@1", groups)).code == 0
        assert b.call(lambda: (b._namesrv.on_demand_registrations, b._namesrv._wanted.is_set())) == (2, False)
        assert b.call(lambda: b._namesrv.registrations) == 3 and timers.delays == [10.0]
    finally:
        b.stop()


def test_serve_sigterm_persists_state(tmp_path):
    """rmqhb serve: boots from a properties file, and SIGTERM shuts down gracefully, writing the offsets."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    props = tmp_path / "broker.properties"
    props.write_text(f"brokerName=broker-t\nstorePathRootDir={tmp_path / 'store'}\nflushConsumerOffsetInterval=600000\n")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "-c", str(props), "--listenPort", "0",
                             "--listenHost", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(root), env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        line = proc.stdout.readline()
        assert "boot success" in line, proc.stderr.read()
        port = int(line.split("127.0.0.1:")[1].split("]")[0])
        c = Client(port)
        assert c.heartbeat().code == 0
        assert c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == 0
        r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "demo_consumer_group", "topic": "TopicTest",
                                                        "queueId": "2", "commitOffset": "1234"})
        assert r.code == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    offsets = json.loads((tmp_path / "store" / "config" / "consumerOffset.json").read_text())
    assert "1234" in json.dumps(offsets) and "TopicTest@demo_consumer_group" in json.dumps(offsets)
    # the auto-created group, retry topic and routed topic (deferred writes, engine.registry.store.Store) are on disk too
    config = tmp_path / "store" / "config"
    assert "demo_consumer_group" in json.loads((config / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
    topics = json.loads((config / "topics.json").read_text())["topicConfigTable"]
    assert {"%RETRY%demo_consumer_group", "TopicTest"} <= set(topics)

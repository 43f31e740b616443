"""ACL on the gRPC endpoint (aclEnable with grpcServerPort): the 5.x signature scheme (``authorization:
MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=hex HMAC-SHA1(sk, x-mq-date-time)``) against
the plain_acl.yml accounts of the remoting ACL, and the permissions of the groups and topics a request names."""
import time

import pytest

from conftest import require_module
from engine.broker.acl import AclError, AclValidator, grpc_authorization, grpc_signature, parse_grpc_authorization
from engine.broker.controller import Broker
from engine.registry.topic_config_manager import TopicConfig

grpc = require_module("grpc")
require_module("rocketmq.grpc_protocol")
from rocketmq.grpc_protocol import definition_pb2 as d  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as s  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as sg  # noqa: E402

from engine.broker.admin import AdminClient, AdminError  # noqa: E402
from test_grpc_endpoint import Telemetry, consumer_settings, free_port, md, producer_settings, wait_until  # noqa
from test_grpc_endpoint import grpc_transport  # noqa: E402,F401  (fixture: every test on both transports)
from test_server import make_config  # noqa: E402

Code = d.Code

ACL = """\
accounts:
- accessKey: rocketmq2
  secretKey: "12345678"
  admin: true
- accessKey: limited
  secretKey: limited-secret
  defaultTopicPerm: DENY
  defaultGroupPerm: DENY
  topicPerms:
  - TopicOK=PUB|SUB
  - TopicPubOnly=PUB
  groupPerms:
  - GroupOK=SUB
- accessKey: trusted
  secretKey: trusted-secret
  whiteRemoteAddress: 127.0.0.1
  defaultTopicPerm: PUB|SUB
  defaultGroupPerm: SUB
"""
SECRETS = {"rocketmq2": "12345678", "limited": "limited-secret", "trusted": "trusted-secret"}


def signed(client_id, access_key="limited", secret=None, date_time=None):
    date_time = date_time or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    secret = SECRETS.get(access_key, "whatever") if secret is None else secret
    return md(client_id) + [("x-mq-date-time", date_time),
                            ("authorization", grpc_authorization(access_key, secret, date_time))]


@pytest.fixture
def acl_broker(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), acl_enable=True, acl_file=str(acl))).start()
    b.grpc.min_long_polling_ms, b.grpc.max_long_polling_ms = 50, 200
    for topic in ("TopicOK", "TopicPubOnly"):  # a gRPC route query creates no topic (TOPIC_NOT_FOUND, as the proxy)
        b.call(b.registry.update_topic_config, TopicConfig(topic, 4, 4))
    yield b
    b.stop()


@pytest.fixture
def astub(acl_broker):
    channel = grpc.insecure_channel(f"127.0.0.1:{acl_broker.ports['grpc']}")
    yield sg.MessagingServiceStub(channel)
    channel.close()


def _admin(broker, producer, group):
    """The remoting listing, as the admin account (the remoting port checks its ACL too)."""
    try:
        with AdminClient("127.0.0.1", broker.ports["main"], access_key="rocketmq2", secret_key="12345678") as c:
            return c.producer_connection(group) if producer else c.consumer_connection(group)
    except AdminError:
        return None


def consumers(broker, group):
    return _admin(broker, False, group)


def producers(broker, group):
    return _admin(broker, True, group)


def route(stub, metadata, topic="TopicOK"):
    req = s.QueryRouteRequest()
    req.topic.name = topic
    return stub.QueryRoute(req, metadata=metadata).status


# ---------------------------------------------------------------------------------------------------------------


def test_the_signature_is_the_python_5x_clients():
    """The header this module builds and reads is byte for byte the one rocketmq-python-client 5.1.2 sends."""
    signature = require_module("rocketmq.v5.util.signature")  # the grpc extra installs the whole client
    from rocketmq.v5.client import ClientConfiguration, Credentials

    config = ClientConfiguration("127.0.0.1:1", Credentials("myAK", "mySecret"))
    meta = dict(signature.Signature.metadata(config, "cid@1"))
    date_time = meta["x-mq-date-time"]
    assert meta["authorization"] == grpc_authorization("myAK", "mySecret", date_time)
    assert signature.Signature.sign("mySecret", date_time) == grpc_signature("mySecret", date_time)
    ak, sig = parse_grpc_authorization(meta["authorization"])
    assert ak == "myAK" and sig.hex() == grpc_signature("mySecret", date_time)


def test_authorization_header_parsing():
    assert parse_grpc_authorization("MQv2-HMAC-SHA1 Credential=ak/region/x, Signature=0aff") == ("ak", b"\x0a\xff")
    assert parse_grpc_authorization("M Credential=ak") == ("ak", None)  # no Signature: fails the check later
    assert parse_grpc_authorization("M Credential=, Signature=") == ("", b"")
    for bad in ("MQv2-HMAC-SHA1", "M Credential", "M Credential=ak, Signature=zz", "M Credential=ak,, x=y"):
        with pytest.raises(AclError) as e:
            parse_grpc_authorization(bad)
        assert "zz" not in str(e.value)


def test_check_grpc_decisions():
    from engine.broker.acl import parse_acl_yaml, retry_topic, ANY, PUB, SUB

    v = AclValidator.from_document(parse_acl_yaml(ACL))
    dt = "20261126T141200Z"

    def check(ak, secret, resources, ip="10.0.0.1", date_time=dt):
        return v.check_grpc(grpc_authorization(ak, secret, dt), date_time, ip, resources)

    assert check("limited", "limited-secret", {"TopicOK": SUB, retry_topic("GroupOK"): SUB}) is None
    assert check("limited", "wrong", {}) == ("UNAUTHORIZED", "Check signature failed for accessKey='limited'")
    assert check("limited", "limited-secret", {}, date_time="20261126T141201Z")[0] == "UNAUTHORIZED"
    assert check("limited", "limited-secret", {}, date_time=None) == ("UNAUTHORIZED", "datetime is null")
    assert check("nobody", "x", {}) == ("UNAUTHORIZED", "No acl config for 'nobody'")
    assert v.check_grpc(None, dt, "10.0.0.1", {}) == ("UNAUTHORIZED", "No accessKey is configured")
    assert check("limited", "limited-secret", {retry_topic("GroupBad"): SUB}) == (
        "FORBIDDEN", "No default permission for group:'GroupBad'")
    assert check("limited", "limited-secret", {"TopicPubOnly": SUB}) == (
        "FORBIDDEN", "No default permission for topic:'TopicPubOnly'")
    assert check("limited", "limited-secret", {"TopicPubOnly": ANY}) is None  # a route query: PUB or SUB
    assert check("limited", "limited-secret", {"TopicBad": PUB})[0] == "FORBIDDEN"
    assert check("rocketmq2", "12345678", {"AnyTopic": PUB, retry_topic("AnyGroup"): SUB}) is None  # admin
    # the account's white list: no signature needed from there
    assert check("trusted", "wrong", {}, ip="127.0.0.1") is None
    assert check("trusted", "wrong", {}, ip="10.0.0.2")[0] == "UNAUTHORIZED"
    glob = AclValidator.from_document(parse_acl_yaml(ACL + "globalWhiteRemoteAddresses:\n- 10.0.0.*\n"))
    assert glob.check_grpc(None, None, "10.0.0.7", {"TopicBad": PUB}) is None
    assert glob.check_grpc(None, None, "10.0.1.7", {})[0] == "UNAUTHORIZED"


def test_acl_enable_with_grpc_starts(tmp_path):
    """aclEnable with grpcServerPort was refused at start before the signature check existed."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    with Broker(make_config(tmp_path, grpc_server_port=free_port(), acl_enable=True, acl_file=str(acl))) as b:
        assert b.grpc is not None and b.grpc.acl is b.acl


def test_a_good_signature_is_accepted_end_to_end(acl_broker, astub):
    assert route(astub, signed("ok@1")).code == Code.OK
    t = Telemetry(astub, signed("ok@1"))
    t.send(settings=consumer_settings("GroupOK", [("TopicOK", "*")]))
    assert t.recv().status.code == Code.OK
    assert [c["clientId"] for c in consumers(acl_broker, "GroupOK")["connectionSet"]] == ["ok@1"]
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = "GroupOK"
    assert astub.Heartbeat(hb, metadata=signed("ok@1")).status.code == Code.OK
    # the same request bytes again with a wrong signature: every call is checked (no repeat path with ACL)
    assert astub.Heartbeat(hb, metadata=signed("ok@1", secret="wrong")).status.code == Code.UNAUTHORIZED
    assert astub.Heartbeat(hb, metadata=signed("ok@1")).status.code == Code.OK
    assert acl_broker.grpc.heartbeat_repeats == 0 and acl_broker.grpc.acl_denied == 1
    acl_broker.grpc.acl_denied = 0
    a = s.QueryAssignmentRequest()
    a.topic.name, a.group.name = "TopicOK", "GroupOK"
    assert astub.QueryAssignment(a, metadata=signed("ok@1")).status.code == Code.OK
    r = s.NotifyClientTerminationRequest()
    r.group.name = "GroupOK"
    assert astub.NotifyClientTermination(r, metadata=signed("ok@1")).status.code == Code.OK
    assert consumers(acl_broker, "GroupOK") is None
    t.end()
    # an admin account may use any group and topic; a producer's settings need PUB on its topics
    t = Telemetry(astub, signed("admin@1", "rocketmq2"))
    t.send(settings=producer_settings("AnyTopic"))
    assert t.recv().status.code == Code.OK
    assert [c["clientId"] for c in producers(acl_broker, "AnyTopic")["connectionSet"]] == ["admin@1"]
    t.end()
    wait_until(lambda: acl_broker.grpc.sessions == {})
    assert acl_broker.grpc.acl_denied == 0


@pytest.mark.parametrize("metadata, message", [
    (lambda: signed("c@1", secret="wrong-secret"), "Check signature failed for accessKey='limited'"),
    (lambda: signed("c@1", "nobody"), "No acl config for 'nobody'"),
    (lambda: md("c@1"), "No accessKey is configured"),
    (lambda: md("c@1") + [("authorization", grpc_authorization("limited", "limited-secret", "20261126T000000Z"))],
     "datetime is null"),
    (lambda: md("c@1") + [("x-mq-date-time", "20261126T000000Z"), ("authorization", "MQv2-HMAC-SHA1")],
     "authorization header is incorrect"),
    (lambda: md("c@1") + [("x-mq-date-time", "20261126T000000Z"),
                          ("authorization", "MQv2-HMAC-SHA1 Credential=limited, Signature=not-hex")],
     "authorization signature is not hex"),
], ids=["wrong-secret", "unknown-ak", "missing-header", "missing-date", "malformed", "bad-hex"])
def test_authentication_failures_are_unauthorized(acl_broker, astub, metadata, message):
    assert (route(astub, metadata()).code, route(astub, metadata()).message) == (Code.UNAUTHORIZED, message)
    hb = s.HeartbeatRequest(client_type=d.ClientType.PRODUCER)
    assert astub.Heartbeat(hb, metadata=metadata()).status.code == Code.UNAUTHORIZED
    # an unsupported RPC is refused by the ACL first (the proxy's interceptor runs before any handler)
    assert astub.SendMessage(s.SendMessageRequest(), metadata=metadata()).status.code == Code.UNAUTHORIZED
    assert [x.status.code for x in astub.PullMessage(s.PullMessageRequest(), metadata=metadata())] == [
        Code.UNAUTHORIZED]
    rq = s.ReceiveMessageRequest()
    rq.group.name, rq.message_queue.topic.name = "GroupOK", "TopicOK"
    assert [x.status.code for x in astub.ReceiveMessage(rq, metadata=metadata(), timeout=30)] == [Code.UNAUTHORIZED]
    # a Telemetry stream: every command answered UNAUTHORIZED, nothing registered, no session
    t = Telemetry(astub, metadata())
    for _ in range(2):
        t.send(settings=producer_settings("TopicOK"))
        answer = t.recv()
        assert (answer.status.code, answer.status.message) == (Code.UNAUTHORIZED, message)
        assert not answer.HasField("settings")
    assert acl_broker.grpc.sessions == {} and producers(acl_broker, "TopicOK") is None
    t.end()
    assert list(t.call) == []
    assert acl_broker.grpc.acl_denied == 2 + 1 + 1 + 1 + 1 + 1  # a stream's signature is checked once, at its open


def test_permissions_of_groups_and_topics(acl_broker, astub):
    assert route(astub, signed("p@1"), "TopicPubOnly").code == Code.OK  # a route query needs PUB or SUB
    status = route(astub, signed("p@1"), "TopicBad")
    assert (status.code, status.message) == (Code.FORBIDDEN, "No default permission for topic:'TopicBad'")
    t = Telemetry(astub, signed("p@1"))
    # settings naming a group the account may not use: refused and not applied; the stream stays
    t.send(settings=consumer_settings("GroupBad", [("TopicOK", "*")]))
    answer = t.recv()
    assert (answer.status.code, answer.status.message) == (Code.FORBIDDEN, "No default permission for group:'GroupBad'")
    assert consumers(acl_broker, "GroupBad") is None
    t.send(settings=consumer_settings("GroupOK", [("TopicPubOnly", "*")]))  # SUB on a PUB-only topic
    assert t.recv().status.code == Code.FORBIDDEN
    assert consumers(acl_broker, "GroupOK") is None
    t.send(settings=consumer_settings("GroupOK", [("TopicOK", "*")]))
    assert t.recv().status.code == Code.OK
    assert [c["clientId"] for c in consumers(acl_broker, "GroupOK")["connectionSet"]] == ["p@1"]
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = "GroupBad"
    assert astub.Heartbeat(hb, metadata=signed("p@1")).status.code == Code.FORBIDDEN
    a = s.QueryAssignmentRequest()
    a.topic.name, a.group.name = "TopicOK", "GroupBad"
    assert astub.QueryAssignment(a, metadata=signed("p@1")).status.code == Code.FORBIDDEN
    rq = s.ReceiveMessageRequest()
    rq.group.name, rq.message_queue.topic.name = "GroupOK", "TopicBad"
    assert [x.status.code for x in astub.ReceiveMessage(rq, metadata=signed("p@1"), timeout=30)] == [Code.FORBIDDEN]
    r = s.NotifyClientTerminationRequest()
    r.group.name = "GroupBad"
    assert astub.NotifyClientTermination(r, metadata=signed("p@1")).status.code == Code.FORBIDDEN
    assert [c["clientId"] for c in consumers(acl_broker, "GroupOK")["connectionSet"]] == ["p@1"]
    t.end()
    wait_until(lambda: consumers(acl_broker, "GroupOK") is None)
    # a producer: PUB on each topic it publishes to
    t = Telemetry(astub, signed("prod@1"))
    t.send(settings=producer_settings("TopicPubOnly", "TopicBad"))
    assert t.recv().status.code == Code.FORBIDDEN
    t.send(settings=producer_settings("TopicPubOnly"))
    assert t.recv().status.code == Code.OK
    assert [c["clientId"] for c in producers(acl_broker, "TopicPubOnly")["connectionSet"]] == ["prod@1"]
    # its termination names no group: nothing to check beyond the signature (RocketMQ 5.0-5.2 would check %RETRY%)
    assert astub.NotifyClientTermination(s.NotifyClientTerminationRequest(),
                                         metadata=signed("prod@1")).status.code == Code.OK
    t.end()


def test_the_accounts_white_list_needs_no_signature(acl_broker, astub):
    assert route(astub, signed("w@1", "trusted", secret="not-the-secret")).code == Code.OK


def test_a_restored_session_is_checked_again(tmp_path):
    """Settings saved by a graceful stop register again at the client's next Heartbeat only if the account may
    still use what they name (plain_acl.yml may have changed meanwhile)."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), acl_enable=True, acl_file=str(acl))).start()
    stub = sg.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}"))
    streams = [Telemetry(stub, signed(cid)) for cid in ("keep@1", "lose@1")]  # open until the stop
    for t in streams:
        t.send(settings=consumer_settings("GroupOK", [("TopicOK", "*")]))
        assert t.recv().status.code == Code.OK
    ports = b.ports
    b.stop()
    acl.write_text(ACL.replace("  - GroupOK=SUB\n", "  - GroupOK=SUB\n  - GroupGone=SUB\n"))
    b = Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"], acl_enable=True,
                           acl_file=str(acl))).start()
    try:
        hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
        hb.group.name = "GroupOK"
        # a wrong signature restores nothing (the Heartbeat itself is refused first)
        assert stub.Heartbeat(hb, metadata=signed("lose@1", secret="wrong")).status.code == Code.UNAUTHORIZED
        assert "lose@1" in b.grpc.dormant
        assert stub.Heartbeat(hb, metadata=signed("keep@1")).status.code == Code.OK
        assert [c["clientId"] for c in consumers(b, "GroupOK")["connectionSet"]] == ["keep@1"]
    finally:
        b.stop()
    # the account loses SUB on the group's topic: the saved Settings are refused when the client comes back
    acl.write_text(ACL.replace("  - TopicOK=PUB|SUB\n", "  - TopicOK=PUB\n"))
    b = Broker(make_config(tmp_path, listen_port=ports["main"], grpc_server_port=ports["grpc"], acl_enable=True,
                           acl_file=str(acl))).start()
    try:
        assert "keep@1" in b.grpc.dormant
        status = stub.Heartbeat(hb, metadata=signed("keep@1")).status
        assert (status.code, status.message) == (Code.FORBIDDEN, "No default permission for topic:'TopicOK'")
        assert consumers(b, "GroupOK") is None and b.grpc.sessions == {} and b.grpc.dormant == {}
    finally:
        b.stop()

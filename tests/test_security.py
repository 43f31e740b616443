"""Security with ACL on: refused requests register nothing, and no credential leaks into logs, metrics or admin.

Refused: unsigned, wrongly signed, a signed request replayed with a changed body or changed ext fields, an
unknown AccessKey, a non-admin account on an admin code, each as a normal and as a oneway request. After all of
them the registry, the subscription-group table and the topic table hold nothing of the attacker, and the only
channels the broker still tracks are the well-behaved client's.

Leaks: the secret keys (and the signatures clients sent) must not appear in any log record at any level, in the
metrics text, in the admin answers (consumer/producer connection lists over the wire), in the config's and the
validator's reprs, or in the errors a malformed ACL file produces.
"""
import json
import logging
import urllib.request

import pytest

import engine
from engine.broker.acl import AclError, AclValidator, parse_acl_yaml, sign, sign_request
from engine.broker.admin import AdminClient
from engine.codec.enums import RequestCode, ResponseCode
from conftest import free_port
from test_server import Client, broker_factory, consumer_ids, hb_body, wait_until  # noqa: F401  (fixture)

USER_AK, USER_SK = "rocketmq2", "u5er-S3CRET-key-7f3a"
ADMIN_AK, ADMIN_SK = "rocketmq-admin", "adm1n-S3CRET-key-91cc"
SECRETS = (USER_SK, ADMIN_SK)
GOOD_GROUP, EVIL_GROUP = "good_consumer_group", "evil_consumer_group"
ACL_YML = f"""\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: {USER_AK}
    secretKey: {USER_SK}
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    groupPerms:
      - {EVIL_GROUP}=DENY
  - accessKey: {ADMIN_AK}
    secretKey: "{ADMIN_SK}"
    admin: true
"""


@pytest.fixture
def acl_broker(broker_factory, tmp_path, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)  # every logger, every level: a secret must not show up anywhere
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YML)
    return broker_factory(acl_enable=True, acl_file=str(path), metrics_port=free_port())


def signed(code, ext, body, ak=USER_AK, sk=USER_SK, opaque=1, flag=0):
    cmd = engine.RemotingCommand(code, opaque=opaque, flag=flag, ext_fields=dict(ext), body=body)
    return sign_request(cmd, ak, sk)


def evil_body(client_id="evil@1"):
    return hb_body(client_id=client_id, group=EVIL_GROUP, producer="evil_producer_group")


def attacks():
    """(name, command) pairs that must be refused with NO_PERMISSION; opaques are unique."""
    out = []
    out.append(("unsigned", engine.RemotingCommand(RequestCode.HEART_BEAT, ext_fields={}, body=evil_body())))
    out.append(("unsigned, AccessKey only",
                engine.RemotingCommand(RequestCode.HEART_BEAT, ext_fields={"AccessKey": USER_AK}, body=evil_body())))
    out.append(("wrong secret", signed(RequestCode.HEART_BEAT, {}, evil_body(), sk="not-the-secret")))
    out.append(("admin's secret with the user's key", signed(RequestCode.HEART_BEAT, {}, evil_body(), sk=ADMIN_SK)))
    # a request a real client signed, captured and replayed with another body: the signature covers the body
    good = signed(RequestCode.HEART_BEAT, {}, hb_body(client_id="victim@1", group=GOOD_GROUP))
    replay = engine.RemotingCommand(RequestCode.HEART_BEAT, ext_fields=dict(good.ext_fields), body=evil_body())
    out.append(("replayed with a changed body", replay))
    trimmed = engine.RemotingCommand(RequestCode.HEART_BEAT, ext_fields=dict(good.ext_fields),
                                     body=good.body[:-1] + b" ")
    out.append(("replayed with one byte changed", trimmed))
    # ... and with changed ext fields (the signed text is every ext value but the Signature)
    unreg = signed(RequestCode.UNREGISTER_CLIENT, {"clientID": "victim@1", "consumerGroup": GOOD_GROUP}, b"")
    moved = dict(unreg.ext_fields, consumerGroup=EVIL_GROUP)
    out.append(("replayed with a changed ext field",
                engine.RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields=moved)))
    added = dict(good.ext_fields, extra="1")
    out.append(("replayed with an added ext field",
                engine.RemotingCommand(RequestCode.HEART_BEAT, ext_fields=added, body=good.body)))
    out.append(("unknown AccessKey", signed(RequestCode.HEART_BEAT, {}, evil_body(), ak="nobody", sk="whatever1")))
    # rightly signed, but for a group the account is denied (groupPerms: evil_consumer_group=DENY)
    out.append(("a denied group", signed(RequestCode.HEART_BEAT, {}, evil_body())))
    out.append(("a denied group, unregistering", signed(RequestCode.UNREGISTER_CLIENT,
                                                        {"clientID": "good@1", "consumerGroup": EVIL_GROUP}, b"")))
    out.append(("garbage signature", engine.RemotingCommand(
        RequestCode.HEART_BEAT, ext_fields={"AccessKey": USER_AK, "Signature": "\x00" * 28 + "=="}, body=evil_body())))
    return out


def send_raw(client, cmd, opaque, flag=0):
    cmd.opaque, cmd.flag = opaque, flag
    client.sock.sendall(cmd.encode())


def assert_nothing_of_the_attacker(b):
    reg = b.registry
    assert consumer_ids(b, EVIL_GROUP) == []
    assert b.call(reg.producer_connection, "evil_producer_group") is None
    assert EVIL_GROUP not in b.call(reg.groups) and "evil_producer_group" not in b.call(reg.groups)
    assert b.call(reg.subscription_group_config, EVIL_GROUP) is None  # no auto-created group
    topics = [t.topic_name for t in b.call(reg.topic_configs)]
    assert not [t for t in topics if "evil" in t], topics  # no retry topic either
    assert "victim@1" not in consumer_ids(b, GOOD_GROUP)


def test_refused_requests_register_nothing(acl_broker):
    b = acl_broker
    attacker = Client(b.ports["main"])
    results = {}
    for i, (name, cmd) in enumerate(attacks()):
        send_raw(attacker, cmd, opaque=1000 + i)
        r = attacker.read(pred=lambda x, o=1000 + i: x.is_response and x.opaque == o)
        results[name] = (r.code, r.remark)
    refused = {n: rr for n, rr in results.items() if rr[0] == ResponseCode.NO_PERMISSION}
    assert refused == results, {n: rr for n, rr in results.items() if n not in refused}
    assert results["unsigned"][1] == "No accessKey is configured"
    assert results["unknown AccessKey"][1] == "No acl config for 'nobody'"
    assert results["wrong secret"][1] == f"Check signature failed for accessKey='{USER_AK}'"
    assert results["a denied group"][1] == f"No default permission for group:'{EVIL_GROUP}'"
    # oneway: refused silently (no answer), and still nothing registered
    for i, (name, cmd) in enumerate(attacks()):
        send_raw(attacker, cmd, opaque=2000 + i, flag=2)
    probe = attacker.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})  # not authenticated (name server)
    assert probe.code == 0 and not [x for x in attacker.inbox if x.is_response]
    assert b.metrics.acl_denied == 2 * len(results)
    assert_nothing_of_the_attacker(b)
    assert b.call(lambda: b.registry.registered_channel_count) == 0
    # the same connection with the right credentials is served: the refusals were about the requests
    ok = signed(RequestCode.HEART_BEAT, {}, hb_body(client_id="good@1", group=GOOD_GROUP))
    send_raw(attacker, ok, opaque=3000)
    assert attacker.read(pred=lambda x: x.is_response and x.opaque == 3000).code == 0
    assert consumer_ids(b, GOOD_GROUP) == ["good@1"]
    assert_nothing_of_the_attacker(b)
    b.call(b.registry.check_invariants)


def collected_text(caplog):
    out = []
    for r in caplog.records:
        out.append(r.getMessage())
        if r.exc_info:
            out.append(logging.Formatter().formatException(r.exc_info))
    return "\n".join(out)


def test_no_credential_in_logs_metrics_or_admin(acl_broker, caplog):
    b = acl_broker
    signatures = set()
    c = Client(b.ports["main"])
    for i, (name, cmd) in enumerate(attacks()):
        send_raw(c, cmd, opaque=10 + i)
        c.read(pred=lambda x, o=10 + i: x.is_response and x.opaque == o)
    members = []
    for i, (client_id, ak, sk) in enumerate((("good@1", USER_AK, USER_SK), ("boss@1", ADMIN_AK, ADMIN_SK))):
        member = Client(b.ports["main"])
        members.append(member)
        cmd = signed(RequestCode.HEART_BEAT, {}, hb_body(client_id=client_id, group=GOOD_GROUP), ak=ak, sk=sk)
        signatures.add(cmd.ext_fields["Signature"])
        send_raw(member, cmd, opaque=100 + i)
        assert member.read(pred=lambda x, o=100 + i: x.is_response and x.opaque == o).code == 0
    # a bad frame and a bad heartbeat body from a signed client: error paths log and echo input
    bad = signed(RequestCode.HEART_BEAT, {}, b'{"clientID":tru')
    signatures.add(bad.ext_fields["Signature"])
    send_raw(c, bad, opaque=200)
    # the user account has per-group permissions, so the ACL reads the body for its groups and refuses it
    r = c.read(pred=lambda x: x.is_response and x.opaque == 200)
    assert r.code == ResponseCode.NO_PERMISSION and r.remark.startswith("Cannot read the resources of request")
    bad = signed(RequestCode.HEART_BEAT, {}, b'{"clientID":tru', ak=ADMIN_AK, sk=ADMIN_SK)
    signatures.add(bad.ext_fields["Signature"])
    send_raw(c, bad, opaque=201)  # the admin may use every resource: the processor's decoder refuses it
    assert c.read(pred=lambda x: x.is_response and x.opaque == 201).code == ResponseCode.SYSTEM_ERROR
    # the admin surfaces, signed as mqadmin would
    with AdminClient("127.0.0.1", b.ports["main"], access_key=ADMIN_AK, secret_key=ADMIN_SK) as admin:
        consumers = json.dumps(admin.consumer_connection(GOOD_GROUP))
        producers = json.dumps(admin.producer_connection("demo_producer_group"))
    assert "good@1" in consumers and "boss@1" in consumers
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{b.config.metrics_port}/metrics", timeout=5).read().decode()
    assert "rocketmq_broker_acl_denied_total" in metrics
    surfaces = {
        "logs": collected_text(caplog),
        "metrics": metrics,
        "consumer connections": consumers,
        "producer connections": producers,
        "config repr": repr(b.config) + str(b.config.to_properties()),
        "validator repr": repr(b.acl) + repr(list(b.acl.accounts.values())),
    }
    for where, text in surfaces.items():
        for secret in SECRETS:
            assert secret not in text, f"secret key in {where}"
        for sig in signatures:
            assert sig not in text, f"a client's signature in {where}"
    c.sock.sendall(b"\x00\x00\x00\x20\x00\x00\x00\x18{\"AccessKey\":\"" + USER_SK.encode())  # undecodable frame
    assert c.closed_by_peer()
    assert wait_until(lambda: "undecodable frame" in collected_text(caplog))
    for secret in SECRETS:  # the frame error echoes at most 32 bytes of input: not the whole secret
        assert secret not in collected_text(caplog)


@pytest.mark.parametrize("line", [
    f"    secretKey {USER_SK}",  # missing ':'
    f"    secretKey={USER_SK}",
    f"    {USER_SK}",
    f'    secretKey: "{USER_SK}\\x"',  # broken escape in a quoted secret
    f'    secretKey: "{USER_SK}',  # unterminated quote
    f"\tsecretKey: {USER_SK}",
])
def test_malformed_acl_file_errors_do_not_echo_secrets(line):
    text = f"accounts:\n  - accessKey: {USER_AK}\n{line}\n    admin: false\n"
    with pytest.raises(AclError) as exc:
        AclValidator.from_document(parse_acl_yaml(text))
    assert USER_SK not in str(exc.value) and USER_SK[:8] not in str(exc.value), str(exc.value)
    assert "line 3" in str(exc.value)


def test_admin_codes_need_an_admin_account():
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) and the other admin codes: a user account is refused even when
    signed correctly. (Checked on the validator: this broker serves none of those codes, and an unserved code is
    answered REQUEST_CODE_NOT_SUPPORTED before any ACL check.)"""
    v = AclValidator.from_document(parse_acl_yaml(ACL_YML))
    body = json.dumps({"groupName": EVIL_GROUP}).encode()
    for code in (17, 25, 200, 207, 215):
        user = signed(code, {}, body)
        remark = v.check(code, user.ext_fields, user.body, "10.0.0.9")
        assert remark == f"Need admin permission for request code={code}, but accessKey='{USER_AK}' is not"
        admin = signed(code, {}, body, ak=ADMIN_AK, sk=ADMIN_SK)
        assert v.check(code, admin.ext_fields, admin.body, "10.0.0.9") is None


def test_signature_helpers_do_not_expose_the_secret():
    assert USER_SK not in sign(USER_SK, {"AccessKey": USER_AK}, b"body")
    v = AclValidator.from_document(parse_acl_yaml(ACL_YML))
    for secret in SECRETS:
        assert secret not in repr(v) and all(secret not in repr(a) for a in v.accounts.values())

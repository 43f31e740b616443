"""ACL: plain_acl.yml parsing, the signature real clients compute, and the validator's decisions."""
import pytest

import engine
from engine.broker.acl import AclError, AclValidator, parse_acl_yaml, sign, sign_request

# RocketMQ 4.9.8 distribution/conf/plain_acl.yml (comments trimmed)
PLAIN_ACL = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY

  - accessKey: rocketmq2
    secretKey: "12345678"   # quoted works too
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


def test_parse_rocketmq_sample():
    doc = parse_acl_yaml(PLAIN_ACL)
    assert doc["globalWhiteRemoteAddresses"] == ["10.10.103.*", "192.168.0.*"]
    a, b = doc["accounts"]
    assert a["accessKey"] == "RocketMQ" and a["secretKey"] == "12345678" and a["admin"] is False
    assert a["whiteRemoteAddress"] is None and a["topicPerms"] == ["topicA=DENY", "topicB=PUB|SUB"]
    assert b == {"accessKey": "rocketmq2", "secretKey": "12345678", "whiteRemoteAddress": "192.168.1.*", "admin": True}


@pytest.mark.parametrize("text, msg", [
    ("accounts:\n  - accessKey: a\n   secretKey: b\n", "line 3"),
    ("accounts:\n\t- accessKey: a\n", "tabs"),
    ("accounts: [\n", None),
    ("a: 1\na: 2\n", "duplicate key"),
    ("just text\n", "expected 'key: value'"),
])
def test_malformed_yaml_names_the_line(text, msg):
    with pytest.raises(AclError) as e:
        AclValidator.from_document(parse_acl_yaml(text))
    if msg:
        assert msg in str(e.value)


def test_account_checks():
    with pytest.raises(AclError, match=r"accounts\[0\].secretKey"):
        AclValidator.from_document(parse_acl_yaml("accounts:\n  - accessKey: a\n    secretKey: short\n"))
    with pytest.raises(AclError, match=r"accounts\[0\].accessKey"):
        AclValidator.from_document(parse_acl_yaml("accounts:\n  - secretKey: 12345678\n"))


def test_secret_never_in_repr():
    v = AclValidator.from_document(parse_acl_yaml(PLAIN_ACL))
    assert "12345678" not in repr(v) and "12345678" not in repr(list(v.accounts.values()))


def test_cpp_client_signatures_verify(vectors):
    """Every request the C++ client sent carries a Signature over its ext fields and body (empty secret)."""
    checked = 0
    for client, entry, frame in vectors:
        if not client.startswith("cpp"):
            continue
        cmd = engine.decode_frame(frame)
        assert cmd.ext_fields and "Signature" in cmd.ext_fields
        assert sign("", cmd.ext_fields, cmd.body) == cmd.ext_fields["Signature"], entry["seq"]
        checked += 1
    assert checked > 200


def test_validator_decisions():
    v = AclValidator.from_document(parse_acl_yaml(PLAIN_ACL))
    cmd = engine.RemotingCommand(34, ext_fields={}, body=b'{"clientID":"x"}')
    sign_request(cmd, "RocketMQ", "12345678")
    assert v.check(34, cmd.ext_fields, cmd.body, "127.0.0.1") is None
    # a changed body, a changed field, a wrong secret, an unknown key, no key
    assert v.check(34, cmd.ext_fields, b'{"clientID":"y"}', "127.0.0.1") == "Check signature failed for accessKey='RocketMQ'"
    bad = dict(cmd.ext_fields, extra="1")
    assert v.check(34, bad, cmd.body, "127.0.0.1").startswith("Check signature failed")
    wrong = engine.RemotingCommand(34, ext_fields={}, body=cmd.body)
    sign_request(wrong, "RocketMQ", "87654321")
    assert v.check(34, wrong.ext_fields, wrong.body, "127.0.0.1").startswith("Check signature failed")
    assert v.check(34, {"AccessKey": "nobody", "Signature": "x"}, b"", "127.0.0.1") == "No acl config for 'nobody'"
    assert v.check(34, {}, b"", "127.0.0.1") == "No accessKey is configured"
    assert v.check(34, None, b"", "127.0.0.1") == "No accessKey is configured"
    # admin-only request codes (Permission.ADMIN_CODE) need an admin account
    admin_req = engine.RemotingCommand(17, ext_fields={"topic": "t"})
    sign_request(admin_req, "RocketMQ", "12345678")
    assert "Need admin permission for request code=17" in v.check(17, admin_req.ext_fields, b"", "127.0.0.1")
    sign_request(admin_req, "rocketmq2", "12345678")
    assert v.check(17, admin_req.ext_fields, b"", "127.0.0.1") is None


def test_white_lists():
    v = AclValidator.from_document(parse_acl_yaml(PLAIN_ACL))
    assert v.check(34, {}, b"", "10.10.103.7") is None  # global white list: no signature needed
    assert v.check(34, {}, b"", "10.10.104.7") == "No accessKey is configured"
    # the account's own white list skips the signature for that account only
    assert v.check(34, {"AccessKey": "rocketmq2", "Signature": "bogus"}, b"", "192.168.1.20") is None
    assert v.check(34, {"AccessKey": "rocketmq2", "Signature": "bogus"}, b"", "192.168.2.20") is not None


# ---------------------------------------------------------------------------------------------------------------
# Resource permissions (PlainPermissionManager.checkPerm): topicPerms, groupPerms, defaultTopicPerm, defaultGroupPerm


def heartbeat_body(consumers=(), producers=()):
    from test_registry_model import hb

    return engine.encode_heartbeat(hb(consumers=consumers, producers=producers))


def decide(v, code, ext, body=b"", ak="RocketMQ", sk="12345678", ip="127.0.0.1"):
    cmd = engine.RemotingCommand(code, ext_fields=dict(ext), body=body)
    sign_request(cmd, ak, sk)
    return v.check(code, cmd.ext_fields, cmd.body, ip)


def test_permission_bits():
    from engine.broker.acl import ANY, DENY, PUB, SUB, check_permission, parse_perm

    assert [parse_perm(t) for t in ("PUB", " SUB ", "PUB|SUB", "SUB|PUB", "DENY", "pub", "ALL", None)] == [
        PUB, SUB, PUB | SUB, PUB | SUB, DENY, DENY, DENY, DENY]
    assert check_permission(SUB, SUB) and check_permission(SUB, PUB | SUB) and not check_permission(SUB, PUB)
    assert not check_permission(PUB, DENY | PUB)  # DENY wins
    assert check_permission(ANY, PUB) and check_permission(ANY, SUB) and not check_permission(ANY, DENY)


def test_heartbeat_needs_sub_on_each_consumer_group_and_subscribed_topic():
    v = AclValidator.from_document(parse_acl_yaml(PLAIN_ACL))
    # RocketMQ: defaultTopicPerm DENY, defaultGroupPerm SUB, topicA=DENY, topicB=PUB|SUB, groupA=DENY
    assert decide(v, 34, {}, heartbeat_body([("groupX", ["topicB"])])) is None
    assert decide(v, 34, {}, heartbeat_body([("groupX", ["topicB", "topicC"])])) == \
        "No default permission for topic:'topicC'"  # not listed: the default topic permission (DENY)
    assert decide(v, 34, {}, heartbeat_body([("groupX", ["topicA"])])) == "No default permission for topic:'topicA'"
    assert decide(v, 34, {}, heartbeat_body([("groupA", ["topicB"])])) == "No default permission for group:'groupA'"
    assert decide(v, 34, {}, heartbeat_body([("groupX", ["topicB"]), ("groupA", [])])) is not None
    # producers are not checked on a heartbeat (PlainAccessValidator reads only the consumer data)
    assert decide(v, 34, {}, heartbeat_body(producers=["groupA"])) is None
    # the body must decode to know its groups: a restricted account's undecodable heartbeat is refused
    assert decide(v, 34, {}, b'{"consumerDataSet":[{"groupName":').startswith(
        "Cannot read the resources of request code=34")


def test_request_codes_and_their_resources():
    v = AclValidator.from_document(parse_acl_yaml(PLAIN_ACL))
    assert decide(v, 10, {"topic": "topicB"}) is None  # SEND_MESSAGE: PUB on the topic
    assert decide(v, 10, {"topic": "topicA"}) == "No default permission for topic:'topicA'"
    assert decide(v, 310, {"b": "topicC"}) == "No default permission for topic:'topicC'"  # SEND_MESSAGE_V2
    assert decide(v, 11, {"topic": "topicB", "consumerGroup": "groupX"}) is None  # PULL_MESSAGE
    assert decide(v, 11, {"topic": "topicB", "consumerGroup": "groupA"}) == "No default permission for group:'groupA'"
    assert decide(v, 36, {"originTopic": "topicB", "group": "groupX"}) is None  # CONSUMER_SEND_MSG_BACK
    assert decide(v, 36, {"originTopic": "topicA", "group": "groupX"}) is not None
    assert decide(v, 15, {"topic": "topicB", "consumerGroup": "groupX"}) is None  # UPDATE_CONSUMER_OFFSET
    assert decide(v, 15, {"topic": "topicC", "consumerGroup": "groupX"}) is not None
    assert decide(v, 35, {"clientID": "c", "consumerGroup": "groupA"}) is not None  # UNREGISTER_CLIENT
    assert decide(v, 35, {"clientID": "c", "producerGroup": "groupA"}) is None  # no consumer group: no resource
    assert decide(v, 38, {"consumerGroup": "groupA"}) is not None  # GET_CONSUMER_LIST_BY_GROUP
    assert decide(v, 38, {"consumerGroup": "groupB"}) is None
    assert decide(v, 14, {"topic": "topicA", "consumerGroup": "groupA"}) is None  # QUERY_CONSUMER_OFFSET: none


def test_admin_accounts_and_unset_defaults():
    doc = parse_acl_yaml("""\
accounts:
  - accessKey: admin-all
    secretKey: 12345678
    admin: true
  - accessKey: admin-limited
    secretKey: 12345678
    admin: true
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
    topicPerms:
      - secret_topic=DENY
  - accessKey: plain
    secretKey: 12345678
  - accessKey: subscriber
    secretKey: 12345678
    defaultTopicPerm: SUB
    defaultGroupPerm: PUB|SUB
""")
    v = AclValidator.from_document(doc)
    body = heartbeat_body([("anyGroup", ["secret_topic"])])
    assert decide(v, 34, {}, body, ak="admin-all") is None  # admin without resource permissions: everything
    # an admin that names resources is held to them and to its defaults
    assert decide(v, 34, {}, body, ak="admin-limited") == "No default permission for topic:'secret_topic'"
    assert decide(v, 34, {}, heartbeat_body([("g", ["other"])]), ak="admin-limited") is None
    assert decide(v, 10, {"topic": "other"}, ak="admin-limited") == "No default permission for topic:'other'"
    assert decide(v, 34, {}, body, ak="plain") == "No default permission for group:'anyGroup'"  # unset: DENY
    assert decide(v, 34, {}, heartbeat_body(producers=["p"]), ak="plain") is None
    assert decide(v, 34, {}, body, ak="subscriber") is None
    assert decide(v, 10, {"topic": "t"}, ak="subscriber") == "No default permission for topic:'t'"  # no PUB
    # the defaults grant every SUB a heartbeat needs, so its body is not decoded here (the processor does)
    assert decide(v, 34, {}, b"not json", ak="subscriber") is None


def test_white_listed_account_skips_the_resource_check_as_in_java():
    v = AclValidator.from_document(parse_acl_yaml(PLAIN_ACL.replace(
        "    whiteRemoteAddress:\n    admin: false", "    whiteRemoteAddress: 10.9.8.7\n    admin: false")))
    body = heartbeat_body([("groupA", ["topicA"])])
    assert v.check(34, {"AccessKey": "RocketMQ"}, body, "10.9.8.7") is None
    assert decide(v, 34, {}, body, ip="10.9.8.6") == "No default permission for group:'groupA'"


@pytest.mark.parametrize("entry", ["topicA", "=SUB", "a=SUB=PUB"])
def test_malformed_resource_permissions(entry):
    with pytest.raises(AclError, match=r"accounts\[0\]\.topicPerms\[0\]: expected 'name=PERM'"):
        AclValidator.from_document(parse_acl_yaml(
            f"accounts:\n  - accessKey: a\n    secretKey: 12345678\n    topicPerms:\n      - {entry}\n"))
    with pytest.raises(AclError, match="must be a list"):
        AclValidator.from_document(parse_acl_yaml(
            "accounts:\n  - accessKey: a\n    secretKey: 12345678\n    groupPerms: g=SUB\n"))


def test_white_list_of_several_addresses():
    v = AclValidator.from_document(parse_acl_yaml(
        "globalWhiteRemoteAddresses:\n  - 192.168.0.{100,101}\naccounts:\n  - accessKey: a\n    secretKey: 12345678\n"))
    assert v.check(34, {}, b"", "192.168.0.101") is None
    assert v.check(34, {}, b"", "192.168.0.102") == "No accessKey is configured"
    assert v.check(34, {}, b"", "192.168.0.1") == "No accessKey is configured"

"""ACL: plain_acl.yml parsing, the signature real clients compute, and the validator's decisions."""
import pytest

import engine
from engine.acl import AclError, AclValidator, parse_acl_yaml, sign, sign_request

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

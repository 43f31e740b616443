"""HeartbeatData decoding (native and twin through `impl`), encoding, Java hash, V2 fingerprint, FilterAPI.

Oracles are independent of the decoders: the captures' index.json `body_json` (parsed by json.loads) normalised by
`expected_dict`, and the example bodies of PROTOCOL.md 4.4 (checked to be verbatim in the spec).
"""
import json
import pickle
import struct
import time

import numpy as np
import pytest

import engine
from engine import ConsumeFromWhere, ConsumeType, HeartbeatError, MessageModel, RemotingError
from engine.codec.heartbeat import (
    HeartbeatBatch,
    build_subscription,
    encode_heartbeat,
    heartbeat_fingerprint,
    java_string_hash,
)
from engine.codec.vectors import JAVA_HEARTBEAT_BODY as JAVA_BODY  # shared with the benches

from conftest import SHARED, require_native

# ---------------------------------------------------------------------------------------------------------------
# PROTOCOL.md 4.4 examples (verbatim; test_spec_samples_are_verbatim checks them against the spec); the Java one,
# JAVA_BODY, is engine.codec.vectors.JAVA_HEARTBEAT_BODY

LIGHT_BODY = (
    b'{"clientID":"192.168.1.10@12345#1234567890123","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    b'"consumeType":"CONSUME_PASSIVELY","groupName":"demo_consumer_group","messageModel":"CLUSTERING",'
    b'"subscriptionDataSet":[],"unitMode":false}],"heartbeatFingerprint":901960232,'
    b'"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],"withoutSub":true}'
)
EMPTY_BODY = b'{"consumerDataSet":[],"heartbeatFingerprint":0,"producerDataSet":[],"withoutSub":false}'
GO_BODY = (
    b'{"clientID":"10.0.0.1@4242","producerDataSet":[],"consumerDataSet":[{"groupName":"g","consumeType":'
    b'"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    b'"subscriptionDataSet":[{"classFilterMode":false,"topic":"T","subString":"a||b","tagsSet":["a","b"],'
    b'"codeSet":["97","98"],"subVersion":1718000000000000000,"expressionType":"TAG"}],"unitMode":false}]}'
)
SPEC_SAMPLES = {"java": JAVA_BODY, "light": LIGHT_BODY, "empty": EMPTY_BODY, "go": GO_BODY}

# The Java example in the other dialects (same logical heartbeat, 4.4 / vectors/README.md).
ALI_ONS_BODY = (
    b'{"clientID":"192.168.1.10@12345#1234567890123","consumerDataSet":[{"groupName":"demo_consumer_group",'
    b'"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    b'"subscriptionDataSet":[{"topic":"%RETRY%demo_consumer_group","subString":"*","classFilterMode":false,'
    b'"tagsSet":[],"codeSet":[],"subVersion":1718000000001},{"topic":"TopicTest","subString":"TagA || TagB",'
    b'"classFilterMode":false,"tagsSet":["TagA","TagB"],"codeSet":[2598919,2598920],"subVersion":1718000000000}],'
    b'"unitMode":false}],"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}'
)
CPP_BODY = (
    b'{"clientID":"192.168.1.10@12345#1234567890123","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
    b'"groupName":"demo_consumer_group","messageModel":1,"subscriptionDataSet":[{"subString":"*",'
    b'"subVersion":"1718000000001","topic":"%RETRY%demo_consumer_group"},{"codeSet":[2598919,2598920],'
    b'"subString":"TagA || TagB","subVersion":"1718000000000","tagsSet":["TagA","TagB"],"topic":"TopicTest"}]}],'
    b'"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}\n'
)
GO_STYLE_BODY = (
    b'{"clientID":"192.168.1.10@12345#1234567890123","producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],'
    b'"consumerDataSet":[{"groupName":"demo_consumer_group","consumeType":"CONSUME_PASSIVELY","messageModel":'
    b'"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"classFilterMode":false,'
    b'"topic":"%RETRY%demo_consumer_group","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1718000000001,'
    b'"expressionType":"TAG"},{"classFilterMode":false,"topic":"TopicTest","subString":"TagA || TagB","tagsSet":'
    b'["TagA","TagB"],"codeSet":["2598919","2598920"],"subVersion":1718000000000,"expressionType":"TAG"}],'
    b'"unitMode":false}]}'
)
PRETTY_BODY = (
    b' \r\n\t{ "withoutSub" : false ,\n "producerDataSet" : [ { "groupName" : "CLIENT_INNER_PRODUCER" } ] ,'
    b' "heartbeatFingerprint":0, "consumerDataSet" : [ { "unitMode" : null , "subscriptionDataSet" : [ {'
    b' "topic" : "%RETRY%demo_consumer_group" , "subVersion" : 1718000000001 , "subString" : "*" , "tagsSet" :'
    b' null , "codeSet" : null , "expressionType" : null , "classFilterMode" : null } , { "tagsSet" : [ "TagA" ,'
    b' "TagB" ] , "codeSet" : [ 2598919 , "2598920" ] , "subString" : "TagA || TagB" , "subVersion" :'
    b' "1718000000000" , "topic" : "TopicTest" , "filterClassSource" : { "x" : [ 1 , 2.5e3 , true , null ] } } ] ,'
    b' "messageModel" : "CLUSTERING" , "groupName" : "demo_consumer_group" , "consumeType" : 1 ,'
    b' "consumeFromWhere" : "CONSUME_FROM_LAST_OFFSET" , "extra" : "\\u00e9" } ] ,'
    b' "clientID" : "192.168.1.10@12345#1234567890123" } \n\n'
)
DIALECTS = {"ali-ons": ALI_ONS_BODY, "cpp": CPP_BODY, "go": GO_STYLE_BODY, "pretty": PRETTY_BODY}


# ---------------------------------------------------------------------------------------------------------------
# Oracle: a body's JSON (json.loads) -> the dict HeartbeatData.to_dict() must give, with Java's defaults


def _enum_name(cls, value):
    if value is None:
        return None
    if isinstance(value, int):
        return cls(value).name if 0 <= value < len(cls) else None
    return value if value in cls.__members__ else None


def expected_dict(doc, now=None):
    """Java's reading of a parsed body (PROTOCOL.md 4.1, 4.5). `now` replaces missing subVersions."""

    def sub(s):
        version = s.get("subVersion")
        return {
            "topic": s.get("topic"),
            "sub_string": s.get("subString"),
            "tags": list(s.get("tagsSet") or []),
            "codes": [int(c) for c in s.get("codeSet") or []],
            "sub_version": now if version is None else int(version),
            "expression_type": "TAG" if s.get("expressionType") is None else s["expressionType"],
            "class_filter_mode": bool(s.get("classFilterMode")),
        }

    def consumer(c):
        return {
            "group": c.get("groupName"),
            "consume_type": _enum_name(ConsumeType, c.get("consumeType")),
            "message_model": _enum_name(MessageModel, c.get("messageModel")),
            "consume_from_where": _enum_name(ConsumeFromWhere, c.get("consumeFromWhere")),
            "unit_mode": bool(c.get("unitMode")),
            "subscriptions": [sub(s) for s in c.get("subscriptionDataSet") or []],
        }

    without = doc.get("withoutSub", doc.get("isWithoutSub"))
    return {
        "client_id": doc.get("clientID"),
        "producers": [{"group": p.get("groupName")} for p in doc.get("producerDataSet") or []],
        "consumers": [consumer(c) for c in doc.get("consumerDataSet") or []],
        "fingerprint": doc.get("heartbeatFingerprint") or 0,
        "without_sub": bool(without),
    }


def heartbeat_bodies(vectors):
    """(client, entry, body) of every HEART_BEAT frame: body = frame[8 + header_len:]."""
    out = []
    for client, entry, frame in vectors:
        if entry["code"] != 34:
            continue
        total, word = struct.unpack(">II", frame[:8])
        header_len = word & 0xFFFFFF
        assert total + 4 == len(frame) and header_len == entry["header_len"]
        body = frame[8 + header_len :]
        assert len(body) == entry["body_len"]
        out.append((client, entry, body))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Real clients' bytes


def test_vectors_hold_heartbeats_of_every_client(vectors):
    clients = {client for client, _, _ in heartbeat_bodies(vectors)}
    assert clients == {"ali-ons", "cpp-rocketmq-0.4.4", "java-rocketmq-4.9.8"}


def test_vector_heartbeats_decode_to_index_json(impl, vectors):
    for client, entry, body in heartbeat_bodies(vectors):
        hb = impl.heartbeat.decode_heartbeat(body)
        assert hb.to_dict() == expected_dict(entry["body_json"]), (client, entry["seq"])


def test_cpp_vector_quirks_are_read_as_java_would(impl, vectors):
    """C++: ordinals, subVersion strings, no tagsSet/codeSet for "*", codeSet [0, 0] kept, trailing newline."""
    bodies = [(e, b) for c, e, b in heartbeat_bodies(vectors) if c.startswith("cpp")]
    assert bodies and all(b.endswith(b"}\n") for _, b in bodies)
    hb = impl.heartbeat.decode_heartbeat(bodies[0][1])
    cluster = next(c for c in hb.consumers if c.group == "CID_CppCluster")
    assert cluster.consume_type is ConsumeType.CONSUME_PASSIVELY
    assert cluster.message_model is MessageModel.CLUSTERING
    assert cluster.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    retry, tagged = cluster.subscriptions
    assert (retry.topic, retry.sub_string, retry.tags, retry.codes) == ("%RETRY%CID_CppCluster", "*", (), ())
    assert retry.expression_type == "TAG" and retry.sub_version == 1795312865212
    assert tagged.tags == ("TagA", "TagB") and tagged.codes == (0, 0)


def test_ali_ons_vector_quirks(impl, vectors):
    bodies = [b for c, _, b in heartbeat_bodies(vectors) if c == "ali-ons"]
    hb = impl.heartbeat.decode_heartbeat(bodies[0])
    sub = hb.consumers[0].subscriptions[0]
    assert b"expressionType" not in bodies[0] and sub.expression_type == "TAG"
    assert sub.codes == tuple(java_string_hash(t) for t in sub.tags) == (2598919, 2598920)
    assert hb.fingerprint == 0 and hb.without_sub is False


def test_spec_samples_are_verbatim():
    spec = (SHARED / "PROTOCOL.md").read_text()
    for name, body in SPEC_SAMPLES.items():
        assert body.decode() in spec, name


@pytest.mark.parametrize("name", list(SPEC_SAMPLES))
def test_spec_samples_decode(impl, name):
    body = SPEC_SAMPLES[name]
    hb = impl.heartbeat.decode_heartbeat(body)
    assert hb.to_dict() == expected_dict(json.loads(body))


def test_spec_java_sample_fields(impl):
    hb = impl.heartbeat.decode_heartbeat(JAVA_BODY)
    assert hb.client_id == "192.168.1.10@12345#1234567890123"
    assert [p.group for p in hb.producers] == ["CLIENT_INNER_PRODUCER"]
    (c,) = hb.consumers
    assert c.consume_type.name == "CONSUME_PASSIVELY" and c.message_model is MessageModel.CLUSTERING
    assert [s.topic for s in c.subscriptions] == ["%RETRY%demo_consumer_group", "TopicTest"]
    assert c.subscriptions[1].sub_version == 1718000000000 and c.subscriptions[1].codes == (2598919, 2598920)
    light = impl.heartbeat.decode_heartbeat(LIGHT_BODY)
    assert light.fingerprint == 901960232 and light.without_sub is True and light.consumers[0].subscriptions == ()
    go = impl.heartbeat.decode_heartbeat(GO_BODY)
    assert go.consumers[0].subscriptions[0].codes == (97, 98)
    assert go.consumers[0].subscriptions[0].sub_version == 1718000000000000000  # ns


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_dialects_give_the_same_heartbeat(impl, dialect):
    assert impl.heartbeat.decode_heartbeat(DIALECTS[dialect]) == impl.heartbeat.decode_heartbeat(JAVA_BODY)


# ---------------------------------------------------------------------------------------------------------------
# Leniency that must be accepted


def _decode(impl, doc):
    return impl.heartbeat.decode_heartbeat(json.dumps(doc).encode())


def test_defaults_for_missing_and_null_keys(impl):
    t0 = time.time_ns() // 1_000_000
    hb = impl.heartbeat.decode_heartbeat(
        b'{"clientID":null,"producerDataSet":[{}],"consumerDataSet":[{"subscriptionDataSet":[{}],"groupName":null,'
        b'"consumeType":null,"unitMode":null}],"heartbeatFingerprint":null,"withoutSub":null}'
    )
    t1 = time.time_ns() // 1_000_000
    assert hb.client_id is None and hb.fingerprint == 0 and hb.without_sub is False
    assert hb.producers[0].group is None
    c = hb.consumers[0]
    assert (c.group, c.consume_type, c.message_model, c.consume_from_where, c.unit_mode) == (None, None, None, None, False)
    s = c.subscriptions[0]
    assert (s.topic, s.sub_string, s.tags, s.codes, s.expression_type, s.class_filter_mode) == (
        None, None, (), (), "TAG", False)
    assert t0 <= s.sub_version <= t1  # Java's constructor default: now, in ms
    assert impl.heartbeat.decode_heartbeat(b"{}") == impl.heartbeat.HeartbeatData()


def test_null_sets_are_empty(impl):
    hb = impl.heartbeat.decode_heartbeat(b'{"producerDataSet":null,"consumerDataSet":null}')
    assert hb.producers == () and hb.consumers == ()


def test_is_without_sub_alias(impl):
    assert impl.heartbeat.decode_heartbeat(b'{"isWithoutSub":true}').without_sub is True
    assert impl.heartbeat.decode_heartbeat(b'{"withoutSub":true,"isWithoutSub":false}').without_sub is False


@pytest.mark.parametrize(
    "value,expected",
    [
        ('"CONSUME_POP"', ConsumeType.CONSUME_POP),
        ("2", ConsumeType.CONSUME_POP),
        ("-0", ConsumeType.CONSUME_ACTIVELY),
        ('"PUSH"', None),  # Java's display text is not a name
        ('"consume_passively"', None),
        ('"1"', None),  # a string is looked up by name
        ("3", None),
        ("-1", None),
        ("2147483647", None),
        ("null", None),
        ('"CONSUME_\\u0050OP"', ConsumeType.CONSUME_POP),
    ],
)
def test_enums_by_name_or_ordinal_unknown_is_none(impl, value, expected):
    hb = impl.heartbeat.decode_heartbeat(f'{{"consumerDataSet":[{{"consumeType":{value}}}]}}'.encode())
    assert hb.consumers[0].consume_type is expected


def test_every_enum_member_by_name_and_ordinal(impl):
    for cls, key, attr in (
        (ConsumeType, "consumeType", "consume_type"),
        (MessageModel, "messageModel", "message_model"),
        (ConsumeFromWhere, "consumeFromWhere", "consume_from_where"),
    ):
        for m in cls:
            for value in (m.name, int(m)):
                hb = _decode(impl, {"consumerDataSet": [{key: value}]})
                assert getattr(hb.consumers[0], attr) is m


def test_numeric_strings_and_ranges(impl):
    doc = {"consumerDataSet": [{"subscriptionDataSet": [{
        "codeSet": ["-2147483648", "2147483647", "007", -5, "-0"],
        "subVersion": "-9223372036854775808",
    }, {"subVersion": 9223372036854775807}, {"subVersion": "0009223372036854775807"}]}]}
    subs = _decode(impl, doc).consumers[0].subscriptions
    assert subs[0].codes == (-(2**31), 2**31 - 1, 7, -5, 0)
    assert subs[0].sub_version == -(2**63)
    assert subs[1].sub_version == subs[2].sub_version == 2**63 - 1


def test_unknown_keys_are_skipped_at_every_level(impl):
    junk = {"a": [1, -2.5e-3, True, False, None, "x\u00e9\\", {"b": [[], {}]}], "c": {}}
    doc = json.loads(JAVA_BODY)
    doc["unknownTop"] = junk
    doc["consumerDataSet"][0]["unknownConsumer"] = junk
    doc["consumerDataSet"][0]["subscriptionDataSet"][1]["filterClassSource"] = junk
    doc["producerDataSet"][0]["unknownProducer"] = junk
    assert _decode(impl, doc) == impl.heartbeat.decode_heartbeat(JAVA_BODY)


def test_duplicate_keys_last_wins(impl):
    hb = impl.heartbeat.decode_heartbeat(
        b'{"clientID":"a","consumerDataSet":[{"groupName":"g1"},{"groupName":"g2"}],"producerDataSet":[{}],'
        b'"clientID":"b","consumerDataSet":[{"groupName":"g3","subscriptionDataSet":[{"topic":"t1"}],'
        b'"subscriptionDataSet":[{"topic":"t2"},{"topic":"t3","tagsSet":["x"],"tagsSet":["y"]}]}],'
        b'"producerDataSet":null}'
    )
    assert hb.client_id == "b" and hb.producers == ()
    assert [c.group for c in hb.consumers] == ["g3"]
    assert [s.topic for s in hb.consumers[0].subscriptions] == ["t2", "t3"]
    assert hb.consumers[0].subscriptions[1].tags == ("y",)


def test_escapes_in_keys_and_values(impl):
    hb = impl.heartbeat.decode_heartbeat(
        b'{"client\\u0049D":"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\u4e2d\\ud83d\\ude00",'
        b'"producerDataSet":[{"groupName":"\xe4\xb8\xad\xf0\x9f\x98\x80"}]}'
    )
    assert hb.client_id == 'a"b\\c/d\b\f\n\r\té中😀'
    assert hb.producers[0].group == "中😀"


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8)])
def test_bytes_like_bodies(impl, kind):
    assert impl.heartbeat.decode_heartbeat(kind(JAVA_BODY)) == impl.heartbeat.decode_heartbeat(JAVA_BODY)


@pytest.mark.parametrize("body", ["{}", None, 12, memoryview(b"{}  ")[::2]])
def test_non_bytes_body_is_type_error(impl, body):
    with pytest.raises(TypeError, match="bytes-like"):
        impl.heartbeat.decode_heartbeat(body)


def test_nesting_up_to_the_limit(impl):
    depth = impl.heartbeat.MAX_DEPTH
    assert depth == 64
    ok = b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    assert impl.heartbeat.decode_heartbeat(ok) == impl.heartbeat.HeartbeatData()
    too_deep = b'{"x":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(HeartbeatError, match="nesting deeper than 64"):
        impl.heartbeat.decode_heartbeat(too_deep)
    with pytest.raises(HeartbeatError, match="nesting deeper than 64"):
        impl.heartbeat.decode_heartbeat(b'{"x":' + b'{"a":' * 100_000)


# ---------------------------------------------------------------------------------------------------------------
# Errors: every branch, each saying where (JSON path or byte offset), with at most a short echo

P_SUB = '{"consumerDataSet":[{"subscriptionDataSet":[{},{%s}]}]}'
P_CONS = '{"consumerDataSet":[{},{%s}]}'
SUB_PATH = "$.consumerDataSet[0].subscriptionDataSet[1]"
CONS_PATH = "$.consumerDataSet[1]"

BAD = {
    # malformed JSON and framing of the document
    "empty": (b"", None),
    "whitespace only": (b" \n", None),
    "unterminated object": (b'{"clientID":"x"', None),
    "unterminated string": (b'{"clientID":"x', None),
    "missing colon": (b'{"clientID" "x"}', None),
    "missing comma": (b'{"clientID":"x" "a":1}', None),
    "trailing comma object": (b'{"clientID":"x",}', None),
    "trailing comma array": (b'{"producerDataSet":[{},]}', None),
    "single quotes": (b"{'clientID':'x'}", None),
    "unquoted key": (b"{clientID:1}", None),
    "trailing garbage": (b"{} x", None),
    "two objects": (b"{}{}", None),
    "nul after object": (b"{}\x00", None),
    "bom": (b"\xef\xbb\xbf{}", None),
    "nan": (b'{"x":NaN}', None),
    "infinity": (b'{"x":-Infinity}', None),
    "leading zero": (b'{"x":01}', None),
    "bare minus": (b'{"x":-}', None),
    "plus sign": (b'{"x":+1}', None),
    "dot without digits": (b'{"x":1.}', None),
    "exponent without digits": (b'{"x":1e+}', None),
    "bad literal": (b'{"x":tru}', None),
    "bad literal known key": (b'{"withoutSub":nul}', None),
    "raw control char": (b'{"clientID":"a\tb"}', None),
    "invalid escape": (b'{"clientID":"\\x41"}', None),
    "short unicode escape": (b'{"clientID":"\\u12"}', None),
    "non-hex unicode escape": (b'{"clientID":"\\u12G4"}', None),
    # top level
    "top array": (b"[]", "$"),
    "top string": (b'"x"', "$"),
    "top number": (b"1", "$"),
    "top null": (b"null", "$"),
    "top true": (b"true", "$"),
    # wrong types
    "number for clientID": (b'{"clientID":1}', "$.clientID"),
    "bool for clientID": (b'{"clientID":true}', "$.clientID"),
    "object for producerDataSet": (b'{"producerDataSet":{}}', "$.producerDataSet"),
    "string for consumerDataSet": (b'{"consumerDataSet":"x"}', "$.consumerDataSet"),
    "array for producer": (b'{"producerDataSet":[[]]}', "$.producerDataSet[0]"),
    "null producer": (b'{"producerDataSet":[null]}', "$.producerDataSet[0]"),
    "number for groupName": (b'{"producerDataSet":[{"groupName":5}]}', "$.producerDataSet[0].groupName"),
    "object for groupName": ((P_CONS % '"groupName":{}').encode(), CONS_PATH + ".groupName"),
    "array for consumer": (b'{"consumerDataSet":[{},[]]}', CONS_PATH),
    "bool for enum": ((P_CONS % '"consumeType":true').encode(), CONS_PATH + ".consumeType"),
    "object for enum": ((P_CONS % '"messageModel":{}').encode(), CONS_PATH + ".messageModel"),
    "real for enum": ((P_CONS % '"consumeFromWhere":1.5').encode(), CONS_PATH + ".consumeFromWhere"),
    "string for unitMode": ((P_CONS % '"unitMode":"false"').encode(), CONS_PATH + ".unitMode"),
    "number for unitMode": ((P_CONS % '"unitMode":0').encode(), CONS_PATH + ".unitMode"),
    "object for subscriptions": ((P_CONS % '"subscriptionDataSet":{}').encode(), CONS_PATH + ".subscriptionDataSet"),
    "string for subscription": (b'{"consumerDataSet":[{"subscriptionDataSet":["x"]}]}',
                                "$.consumerDataSet[0].subscriptionDataSet[0]"),
    "number for topic": ((P_SUB % '"topic":1').encode(), SUB_PATH + ".topic"),
    "number for subString": ((P_SUB % '"subString":1').encode(), SUB_PATH + ".subString"),
    "number for expressionType": ((P_SUB % '"expressionType":0').encode(), SUB_PATH + ".expressionType"),
    "string for tagsSet": ((P_SUB % '"tagsSet":"TagA"').encode(), SUB_PATH + ".tagsSet"),
    "number in tagsSet": ((P_SUB % '"tagsSet":["a",1]').encode(), SUB_PATH + ".tagsSet[1]"),
    "null in tagsSet": ((P_SUB % '"tagsSet":[null]').encode(), SUB_PATH + ".tagsSet[0]"),
    "object for codeSet": ((P_SUB % '"codeSet":{}').encode(), SUB_PATH + ".codeSet"),
    "null in codeSet": ((P_SUB % '"codeSet":[1,null]').encode(), SUB_PATH + ".codeSet[1]"),
    "bool in codeSet": ((P_SUB % '"codeSet":[true]').encode(), SUB_PATH + ".codeSet[0]"),
    "real in codeSet": ((P_SUB % '"codeSet":[1.0]').encode(), SUB_PATH + ".codeSet[0]"),
    "exponent in codeSet": ((P_SUB % '"codeSet":[1e3]').encode(), SUB_PATH + ".codeSet[0]"),
    "non-numeric string in codeSet": ((P_SUB % '"codeSet":["0x1"]').encode(), SUB_PATH + ".codeSet[0]"),
    "empty string in codeSet": ((P_SUB % '"codeSet":[""]').encode(), SUB_PATH + ".codeSet[0]"),
    "spaced string in codeSet": ((P_SUB % '"codeSet":[" 1"]').encode(), SUB_PATH + ".codeSet[0]"),
    "plus string in codeSet": ((P_SUB % '"codeSet":["+1"]').encode(), SUB_PATH + ".codeSet[0]"),
    "minus string in codeSet": ((P_SUB % '"codeSet":["-"]').encode(), SUB_PATH + ".codeSet[0]"),
    "unicode digit string in codeSet": ((P_SUB % '"codeSet":["\\u0661"]').encode(), SUB_PATH + ".codeSet[0]"),
    "bool for subVersion": ((P_SUB % '"subVersion":false').encode(), SUB_PATH + ".subVersion"),
    "real for subVersion": ((P_SUB % '"subVersion":1718000000000.0').encode(), SUB_PATH + ".subVersion"),
    "word for subVersion": ((P_SUB % '"subVersion":"soon"').encode(), SUB_PATH + ".subVersion"),
    "number for classFilterMode": ((P_SUB % '"classFilterMode":1').encode(), SUB_PATH + ".classFilterMode"),
    "string for fingerprint": (b'{"heartbeatFingerprint":"1"}', "$.heartbeatFingerprint"),
    "real for fingerprint": (b'{"heartbeatFingerprint":1.0}', "$.heartbeatFingerprint"),
    "string for withoutSub": (b'{"withoutSub":"true"}', "$.withoutSub"),
    "number for isWithoutSub": (b'{"isWithoutSub":1}', "$.isWithoutSub"),
    # out of range
    "fingerprint over int32": (b'{"heartbeatFingerprint":2147483648}', "$.heartbeatFingerprint"),
    "fingerprint under int32": (b'{"heartbeatFingerprint":-2147483649}', "$.heartbeatFingerprint"),
    "code over int32": ((P_SUB % '"codeSet":[2147483648]').encode(), SUB_PATH + ".codeSet[0]"),
    "code string under int32": ((P_SUB % '"codeSet":["-2147483649"]').encode(), SUB_PATH + ".codeSet[0]"),
    "subVersion over int64": ((P_SUB % '"subVersion":9223372036854775808').encode(), SUB_PATH + ".subVersion"),
    "subVersion under int64": ((P_SUB % '"subVersion":-9223372036854775809').encode(), SUB_PATH + ".subVersion"),
    "subVersion string over int64": ((P_SUB % '"subVersion":"9223372036854775808"').encode(), SUB_PATH + ".subVersion"),
    "subVersion huge": ((P_SUB % ('"subVersion":' + "9" * 5000)).encode(), SUB_PATH + ".subVersion"),
    "subVersion huge string": ((P_SUB % ('"subVersion":"1' + "0" * 5000 + '"')).encode(), SUB_PATH + ".subVersion"),
    "enum ordinal over int32": ((P_CONS % '"consumeType":2147483648').encode(), CONS_PATH + ".consumeType"),
    # invalid UTF-8 (exactly what Python's strict decoder rejects), in values, keys and skipped values
    "bad byte in value": (b'{"clientID":"a\xffb"}', None),
    "bad byte in key": (b'{"client\xc0\x80ID":"a"}', None),
    "overlong": (b'{"x":"\xc0\xaf"}', None),
    "overlong 3 bytes": (b'{"x":"\xe0\x80\xaf"}', None),
    "encoded surrogate": (b'{"x":"\xed\xa0\x80"}', None),
    "above U+10FFFF": (b'{"x":"\xf4\x90\x80\x80"}', None),
    "F5 lead": (b'{"x":"\xf5\x80\x80\x80"}', None),
    "lone continuation": (b'{"x":"\x80"}', None),
    "truncated sequence": (b'{"x":"\xe4\xb8"}', None),
    "truncated at end": (b'{"x":"\xe4', None),
    "non-ASCII outside strings": (b'{"x":\xc3\xa9}', None),
    # lone surrogates in escapes
    "lone high": (b'{"clientID":"\\ud800"}', None),
    "lone low": (b'{"clientID":"\\udc00"}', None),
    "high then letter": (b'{"clientID":"\\ud800A"}', None),
    "high then non-low escape": (b'{"clientID":"\\ud800\\u0041"}', None),
    "high then high": (b'{"clientID":"\\ud800\\ud800"}', None),
    "lone surrogate in skipped value": (b'{"x":["\\udfff"]}', None),
    "lone surrogate in key": (b'{"\\ud800":1}', None),
    "lone surrogate in tag": ((P_SUB % '"tagsSet":["\\ud83d"]').encode(), None),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_bodies_raise_heartbeat_error_saying_where(impl, name):
    body, path = BAD[name]
    with pytest.raises(HeartbeatError) as info:
        impl.heartbeat.decode_heartbeat(body)
    err = info.value
    assert isinstance(err, RemotingError) and isinstance(err, ValueError)
    msg = str(err)
    assert "$" in msg or "byte" in msg, msg
    if path is not None:
        assert path in msg, msg
    assert len(msg) < 300, msg


def test_bad_utf8_error_has_byte_offset(impl):
    with pytest.raises(HeartbeatError, match="byte 14"):
        impl.heartbeat.decode_heartbeat(b'{"clientID":"a\xffb"}')


def test_error_echo_is_short(impl):
    huge = b'{"clientID":' + b"x" * 1_000_000 + b"}"
    with pytest.raises(HeartbeatError) as info:
        impl.heartbeat.decode_heartbeat(huge)
    assert len(str(info.value)) < 200


# ---------------------------------------------------------------------------------------------------------------
# Model


def test_constructor_defaults(impl):
    m = impl.heartbeat
    s = m.SubscriptionData("T")
    assert (s.topic, s.sub_string, s.tags, s.codes, s.sub_version, s.expression_type, s.class_filter_mode) == (
        "T", "*", (), (), 0, "TAG", False)
    c = m.ConsumerData("g")
    assert (c.group, c.consume_type, c.message_model, c.consume_from_where, c.unit_mode, c.subscriptions) == (
        "g", None, None, None, False, ())
    assert m.ProducerData("p").group == "p"
    hb = m.HeartbeatData()
    assert (hb.client_id, hb.producers, hb.consumers, hb.fingerprint, hb.without_sub) == (None, (), (), 0, False)


def test_constructor_coercions_and_checks(impl):
    m = impl.heartbeat
    c = m.ConsumerData("g", consume_type="CONSUME_POP", message_model=1, consume_from_where=ConsumeFromWhere(5),
                       unit_mode=1, subscriptions=[m.SubscriptionData("t", tags=["a"], codes=[97])])
    assert c.consume_type is ConsumeType.CONSUME_POP and c.message_model is MessageModel.CLUSTERING
    assert c.consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and c.unit_mode is True
    assert isinstance(c.subscriptions, tuple) and c.subscriptions[0].tags == ("a",)
    with pytest.raises(ValueError):
        m.ConsumerData("g", consume_type="PUSH")
    with pytest.raises(ValueError):
        m.ConsumerData("g", message_model=7)
    with pytest.raises(TypeError):
        m.ConsumerData("g", consume_type=1.0)
    with pytest.raises(TypeError):
        m.ConsumerData(1)
    with pytest.raises(TypeError):
        m.ConsumerData("g", subscriptions=["x"])
    with pytest.raises(TypeError):
        m.SubscriptionData("t", tags=[1])
    with pytest.raises(TypeError):
        m.SubscriptionData("t", sub_version=1.5)
    with pytest.raises(OverflowError):
        m.SubscriptionData("t", codes=[2**31])
    with pytest.raises(OverflowError):
        m.SubscriptionData("t", sub_version=2**63)
    with pytest.raises(OverflowError):
        m.HeartbeatData(fingerprint=-(2**31) - 1)
    with pytest.raises(TypeError):
        m.HeartbeatData(producers=[m.ConsumerData("g")])
    assert m.SubscriptionData("t", expression_type=None).expression_type == "TAG"


def test_models_are_immutable(impl):
    hb = impl.heartbeat.decode_heartbeat(JAVA_BODY)
    for obj, attr in ((hb, "client_id"), (hb.producers[0], "group"), (hb.consumers[0], "group"),
                      (hb.consumers[0].subscriptions[0], "topic")):
        with pytest.raises(AttributeError):
            setattr(obj, attr, "x")


def test_eq_hash_repr_to_dict_pickle(impl):
    a = impl.heartbeat.decode_heartbeat(JAVA_BODY)
    b = impl.heartbeat.decode_heartbeat(ALI_ONS_BODY)
    assert a == b and not (a != b) and hash(a) == hash(b) and repr(a) == repr(b)
    assert a != impl.heartbeat.decode_heartbeat(LIGHT_BODY)
    assert a.consumers[0].subscriptions[0] != a.consumers[0].subscriptions[1]
    assert a != "x" and a.producers[0] != a.consumers[0]
    assert len({a, b, a.producers[0], impl.heartbeat.ProducerData("CLIENT_INNER_PRODUCER")}) == 2
    assert pickle.loads(pickle.dumps(a)) == a
    d = a.to_dict()
    assert json.loads(json.dumps(d)) == d == expected_dict(json.loads(JAVA_BODY))
    assert repr(a).startswith("HeartbeatData(client_id='192.168.1.10@12345#1234567890123', producers=(ProducerData(")
    assert "consume_type=ConsumeType.CONSUME_PASSIVELY" in repr(a)


def test_native_and_twin_objects_compare_equal():
    from engine.codec import _heartbeat_py as twin

    require_native()
    from engine.codec import _heartbeat as native
    for body in list(SPEC_SAMPLES.values()) + list(DIALECTS.values()):
        n, t = native.decode_heartbeat(body), twin.decode_heartbeat(body)
        assert n == t and t == n and hash(n) == hash(t) and repr(n) == repr(t) and n.to_dict() == t.to_dict()
    assert native.SubscriptionData("t") == twin.SubscriptionData("t")
    assert native.ConsumerData("g", subscriptions=[twin.SubscriptionData("t")]) == twin.ConsumerData(
        "g", subscriptions=[native.SubscriptionData("t")])


def test_facade_uses_the_native_module_when_built():
    assert engine.decode_heartbeat.__module__ == ("engine.codec._heartbeat" if engine.NATIVE else "engine.codec._heartbeat_py")


# ---------------------------------------------------------------------------------------------------------------
# Encoding


@pytest.mark.parametrize("name", ["java", "light", "empty"])
def test_java_bodies_round_trip_byte_for_byte(impl, name):
    body = SPEC_SAMPLES[name]
    assert encode_heartbeat(impl.heartbeat.decode_heartbeat(body)) == body


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_other_dialects_encode_as_java(impl, dialect):
    assert encode_heartbeat(impl.heartbeat.decode_heartbeat(DIALECTS[dialect])) == JAVA_BODY


def test_encode_escapes_like_fastjson(impl):
    m = impl.heartbeat
    hb = m.HeartbeatData(client_id='a/bé中\x7f\u2028\t"', producers=[m.ProducerData("\x00\x1f\b\f\n\r\\\x9f\xa0")])
    out = encode_heartbeat(hb)
    assert out.startswith('{"clientID":"a/bé中\\u007F\\u2028\\t\\""'.encode())
    assert b'"groupName":"\\u0000\\u001F\\b\\f\\n\\r\\\\\\u009F\xc2\xa0"' in out
    assert m.decode_heartbeat(out) == hb


def test_encode_omits_nulls_and_writes_enums_by_name(impl):
    m = impl.heartbeat
    hb = m.HeartbeatData(consumers=[m.ConsumerData(None, message_model=MessageModel.BROADCASTING, subscriptions=[
        m.SubscriptionData(None, None, sub_version=-1, class_filter_mode=True)])], fingerprint=-7, without_sub=True)
    assert encode_heartbeat(hb) == (
        b'{"consumerDataSet":[{"messageModel":"BROADCASTING","subscriptionDataSet":[{"classFilterMode":true,'
        b'"codeSet":[],"expressionType":"TAG","subVersion":-1,"tagsSet":[]}],"unitMode":false}],'
        b'"heartbeatFingerprint":-7,"producerDataSet":[],"withoutSub":true}'
    )
    assert m.decode_heartbeat(encode_heartbeat(hb)) == hb


def test_encode_refuses_lone_surrogates(impl):
    with pytest.raises(HeartbeatError, match=r"\$\.producerDataSet\[0\]\.groupName"):
        encode_heartbeat(impl.heartbeat.HeartbeatData(producers=[impl.heartbeat.ProducerData("a\ud800")]))


# ---------------------------------------------------------------------------------------------------------------
# Java hash, V2 fingerprint, FilterAPI


@pytest.mark.parametrize(
    "text,expected",
    [
        ("TagA", 2598919),
        ("TagB", 2598920),
        ("TagC", 2598921),
        ("", 0),
        ("a", 97),
        ("polygenelubricants", -(2**31)),  # wraps to Integer.MIN_VALUE
        ("é", 233),
        ("中", 20013),
        ("😀", 0xD83D * 31 + 0xDE00),  # two UTF-16 units
        ("\ud800", 0xD800),
    ],
)
def test_java_string_hash(text, expected):
    assert java_string_hash(text) == expected


def test_java_string_hash_matches_reference_loop():
    for text in ["Hello, World", "x" * 1000, "é" * 300 + "😀", "TopicTest%RETRY%"]:
        h = 0
        units = text.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(units), 2):
            h = (31 * h + int.from_bytes(units[i : i + 2], "big")) % 2**32
        assert java_string_hash(text) == (h - 2**32 if h >= 2**31 else h)


def test_fingerprint_test_vector(impl):
    full = impl.heartbeat.decode_heartbeat(JAVA_BODY)
    assert heartbeat_fingerprint(full) == 901960232
    # the light body carries the fingerprint of the full heartbeat; subVersion, clientID, flags do not matter
    assert impl.heartbeat.decode_heartbeat(LIGHT_BODY).fingerprint == 901960232
    changed = impl.heartbeat.decode_heartbeat(JAVA_BODY.replace(b"1718000000000", b"1").replace(b"@12345", b"@1"))
    assert heartbeat_fingerprint(changed) == 901960232
    other_tags = impl.heartbeat.decode_heartbeat(JAVA_BODY.replace(b'"TagA || TagB"', b'"TagA"'))
    assert heartbeat_fingerprint(other_tags) != 901960232


@pytest.mark.parametrize(
    "expression,sub_string,tags",
    [
        ("*", "*", ()),
        ("", "*", ()),
        (None, "*", ()),
        ("TagA || TagB", "TagA || TagB", ("TagA", "TagB")),
        ("TagA||TagB", "TagA||TagB", ("TagA", "TagB")),
        (" TagA ||  || TagB ||", " TagA ||  || TagB ||", ("TagA", "TagB")),
        ("TagA || TagA", "TagA || TagA", ("TagA",)),
        (" * ", " * ", ("*",)),  # only the exact "*" means all (Java)
        ("\tTag\u00e9\n", "\tTag\u00e9\n", ("Tag\u00e9",)),
        ("a|b", "a|b", ("a|b",)),
    ],
)
def test_build_subscription(expression, sub_string, tags):
    s = build_subscription("T", expression, 42)
    assert (s.topic, s.sub_string, s.tags, s.sub_version, s.expression_type) == ("T", sub_string, tags, 42, "TAG")
    assert s.codes == tuple(dict.fromkeys(java_string_hash(t) for t in tags))
    assert isinstance(s, engine.SubscriptionData)


def test_build_subscription_matches_java_example():
    hb = engine.decode_heartbeat(JAVA_BODY)
    retry, tagged = hb.consumers[0].subscriptions
    assert build_subscription("TopicTest", "TagA || TagB", 1718000000000) == tagged
    assert build_subscription("%RETRY%demo_consumer_group", "*", 1718000000001) == retry


def test_build_subscription_duplicate_hash_codes_collapse():
    s = build_subscription("T", "Aa||BB", 1)  # "Aa" and "BB" share the Java hash 2112
    assert s.tags == ("Aa", "BB") and s.codes == (2112,)


def test_build_subscription_sql92():
    s = build_subscription("T", "a > 1 || b", 5, "SQL92")
    assert (s.sub_string, s.tags, s.codes, s.expression_type) == ("a > 1 || b", (), (), "SQL92")
    with pytest.raises(ValueError):
        build_subscription("T", "", 5, "SQL92")
    assert build_subscription("T", "x", 5, " ").expression_type == "TAG"


# ---------------------------------------------------------------------------------------------------------------
# Batch decoding into columns


def _assert_batch_matches_rows(impl, bodies, batch):
    assert isinstance(batch, HeartbeatBatch) and len(batch) == len(bodies)
    for i, body in enumerate(bodies):
        try:
            expected = impl.heartbeat.decode_heartbeat(body)
        except (HeartbeatError, TypeError) as e:
            assert not batch.heartbeats["ok"][i] and batch.heartbeats["error"][i] == str(e)
            assert batch.heartbeat(i) is None
            continue
        assert batch.heartbeats["ok"][i] and batch.heartbeats["error"][i] is None
        assert batch.heartbeat(i) == expected


def test_batch_layout_and_dtypes(impl):
    from engine.codec.heartbeat import CONSUMER_COLUMNS, HEARTBEAT_COLUMNS, PRODUCER_COLUMNS, SUBSCRIPTION_COLUMNS

    batch = impl.heartbeat.decode_heartbeats([JAVA_BODY, b"{", CPP_BODY])
    for table, spec in (("heartbeats", HEARTBEAT_COLUMNS), ("producers", PRODUCER_COLUMNS),
                        ("consumers", CONSUMER_COLUMNS), ("subscriptions", SUBSCRIPTION_COLUMNS)):
        cols = getattr(batch, table)
        assert list(cols) == [name for name, _ in spec]
        assert len({len(c) for c in cols.values()}) == 1
        for name, dtype in spec:
            assert cols[name].dtype == np.dtype(dtype) and cols[name].ndim == 1, (table, name)
    h, p, c, s = batch.heartbeats, batch.producers, batch.consumers, batch.subscriptions
    assert h["ok"].tolist() == [True, False, True]
    assert h["n_producers"].tolist() == [1, 0, 1] and h["n_consumers"].tolist() == [1, 0, 1]
    assert p["row"].tolist() == [0, 2] and p["group"].tolist() == ["CLIENT_INNER_PRODUCER"] * 2
    assert c["row"].tolist() == [0, 2] and c["consume_type"].tolist() == [1, 1]
    assert c["message_model"].tolist() == [1, 1] and c["consume_from_where"].tolist() == [0, 0]
    assert c["n_subscriptions"].tolist() == [2, 2]
    assert s["consumer"].tolist() == [0, 0, 1, 1] and s["row"].tolist() == [0, 0, 2, 2]
    assert s["tags"][1] == ("TagA", "TagB") and s["codes"][1] == (2598919, 2598920) and s["tags"][0] == ()
    assert s["sub_version"].tolist() == [1718000000001, 1718000000000] * 2
    assert s["expression_type"].tolist() == ["TAG"] * 4
    assert "malformed JSON" in h["error"][1] and h["client_id"][1] is None and h["fingerprint"][1] == 0
    assert repr(batch) == "HeartbeatBatch(3 heartbeats, 2 ok, 2 producers, 2 consumers, 4 subscriptions)"


def test_batch_unknown_enums_are_minus_one(impl):
    batch = impl.heartbeat.decode_heartbeats([b'{"consumerDataSet":[{"consumeType":"X","messageModel":9}]}'])
    c = batch.consumers
    assert c["consume_type"].tolist() == [-1] and c["message_model"].tolist() == [-1]
    assert c["consume_from_where"].tolist() == [-1] and c["group"].tolist() == [None]


def test_batch_equals_per_body_decode_and_marks_bad_rows(impl, vectors):
    bodies = [b for _, _, b in heartbeat_bodies(vectors)] + list(SPEC_SAMPLES.values()) + list(DIALECTS.values())
    bad = [BAD[k][0] for k in ("empty", "lone high", "number for clientID", "subVersion huge", "bad byte in key")]
    mixed = []
    for i, body in enumerate(bodies):
        mixed.append(body)
        mixed.append(bad[i % len(bad)])
    mixed += [None, "{}", bytearray(JAVA_BODY), memoryview(CPP_BODY)]
    batch = impl.heartbeat.decode_heartbeats(mixed)
    _assert_batch_matches_rows(impl, mixed, batch)
    assert int(batch.heartbeats["ok"].sum()) == len(bodies) + 2
    assert batch.heartbeats["error"][-3] == "expected a bytes-like body, got str"


def test_batch_accepts_numpy_object_arrays_and_empty_input(impl):
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = JAVA_BODY, EMPTY_BODY
    batch = impl.heartbeat.decode_heartbeats(arr)
    assert batch.heartbeats["ok"].tolist() == [True, True]
    assert batch.heartbeat(0) == impl.heartbeat.decode_heartbeat(JAVA_BODY)
    empty = impl.heartbeat.decode_heartbeats([])
    assert len(empty) == 0 and all(len(v) == 0 for v in empty.subscriptions.values())
    assert empty.subscriptions["sub_version"].dtype == np.int64


def test_batch_rolls_back_rows_that_fail_late(impl):
    # the bad row has already produced consumers/subscriptions when it fails: none may remain
    late = JAVA_BODY[:-1] + b',"x":[}'
    batch = impl.heartbeat.decode_heartbeats([late, JAVA_BODY, late])
    assert batch.heartbeats["ok"].tolist() == [False, True, False]
    assert batch.consumers["row"].tolist() == [1] and batch.subscriptions["row"].tolist() == [1, 1]
    assert batch.subscriptions["consumer"].tolist() == [0, 0] and batch.producers["row"].tolist() == [1]

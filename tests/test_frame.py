"""Frame codec unit tests, run against both implementations through the `impl` fixture.

Covers PROTOCOL.md Appendix A and 2.4 byte examples, the decoding leniencies real clients need, every error branch,
the RemotingCommand API, and FrameDecoder streaming/poisoning behaviour.
"""
import json
import struct

import pytest

from engine import FrameError, LanguageCode, RemotingError, SerializeType
from engine.codec.enums import BROKER_VERSION, DEFAULT_MAX_FRAME_SIZE, MAX_EXT_FIELDS

HEADER_LIMIT = 0xFFFFFF


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def rmq_header(code=0, language=0, version=0, opaque=0, flag=0, remark=b"", ext=b"", remark_len=None, ext_len=None):
    """A ROCKETMQ binary header (PROTOCOL.md 2.5), with optional forged lengths."""
    remark_len = len(remark) if remark_len is None else remark_len
    ext_len = len(ext) if ext_len is None else ext_len
    return struct.pack(">hBhiii", code, language, version, opaque, flag, remark_len) + remark + struct.pack(">i", ext_len) + ext


def rmq_entry(key: bytes, value: bytes, key_len=None, value_len=None) -> bytes:
    key_len = len(key) if key_len is None else key_len
    value_len = len(value) if value_len is None else value_len
    return struct.pack(">h", key_len) + key + struct.pack(">i", value_len) + value


def decode_json(impl, header, body=b""):
    return impl.frame.decode_frame(frame(header, body))


def frame_error(impl, data, *fragments):
    """decode_frame(data) must raise FrameError whose message holds every fragment; returns the message."""
    with pytest.raises(FrameError) as info:
        impl.frame.decode_frame(data)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def json_error(impl, header, *fragments):
    return frame_error(impl, frame(header), *fragments)


# ---------------------------------------------------------------------------------------------------------------
# PROTOCOL.md Appendix A and 2.4: exact bytes

A1_HEADER = b'{"code":34,"extFields":{},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}'
# A.2 as Java writes it: ext keys in HashMap order (IS_SUPPORT_HEART_BEAT_V2 first).
A2_JAVA_HEADER = (
    b'{"code":0,"extFields":{"IS_SUPPORT_HEART_BEAT_V2":"true","IS_SUB_CHANGE":"true"},"flag":1,"language":"JAVA",'
    b'"opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}'
)
# The same with ext keys sorted, which is what we write (deterministic; clients never rely on map order).
A2_SORTED_HEADER = (
    b'{"code":0,"extFields":{"IS_SUB_CHANGE":"true","IS_SUPPORT_HEART_BEAT_V2":"true"},"flag":1,"language":"JAVA",'
    b'"opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}'
)
A3_JAVA = bytes.fromhex(
    "00000052" "0100004e" "0000" "00" "01df" "00000007" "00000001" "00000000" "00000039"
    "0018" + b"IS_SUPPORT_HEART_BEAT_V2".hex() + "00000004" + b"true".hex()
    + "000d" + b"IS_SUB_CHANGE".hex() + "00000004" + b"true".hex()
)
A3_SORTED = bytes.fromhex(
    "00000052" "0100004e" "0000" "00" "01df" "00000007" "00000001" "00000000" "00000039"
    "000d" + b"IS_SUB_CHANGE".hex() + "00000004" + b"true".hex()
    + "0018" + b"IS_SUPPORT_HEART_BEAT_V2".hex() + "00000004" + b"true".hex()
)
A4 = bytes.fromhex(
    "0000006d" "01000069" "0023" "00" "01df" "0000000c" "00000000" "00000000" "00000054"
    "0008" + b"clientID".hex() + "00000020" + b"192.168.1.10@12345#1234567890123".hex()
    + "000d" + b"consumerGroup".hex() + "00000013" + b"demo_consumer_group".hex()
)
A5_HEADER = (
    b'{"code":40,"extFields":{"consumerGroup":"demo_consumer_group"},"flag":2,"language":"JAVA","opaque":13,'
    b'"serializeTypeCurrentRPC":"JSON","version":479}'
)
A6_HEADER = b'{"code":0,"extFields":{},"flag":1,"language":"JAVA","opaque":9,"serializeTypeCurrentRPC":"JSON","version":479}'
A6_BODY = b'{"consumerIdList":["192.168.1.10@12345#1234567890123","192.168.1.11@999#42"]}'
HB_V2 = {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"}
UNREGISTER_EXT = {"clientID": "192.168.1.10@12345#1234567890123", "consumerGroup": "demo_consumer_group"}


def test_a1_heartbeat_request(impl):
    cmd = impl.frame.RemotingCommand(34, opaque=7, ext_fields={}, body=b"{}")
    data = cmd.encode()
    assert data == bytes.fromhex("000000750000006f") + A1_HEADER + b"{}"
    back = impl.frame.decode_frame(data)
    assert back == cmd and back.ext_fields == {} and back.body == b"{}"


def test_a2_heartbeat_response(impl):
    request = impl.frame.decode_frame(frame(A1_HEADER, b"{}"))
    response = request.response(0, ext_fields=dict(HB_V2))
    data = response.encode()
    assert data[:8] == bytes.fromhex("000000aa000000a6")
    assert data == bytes.fromhex("000000aa000000a6") + A2_SORTED_HEADER
    # Java's own bytes (HashMap order) decode to the same command.
    assert impl.frame.decode_frame(bytes.fromhex("000000aa000000a6") + A2_JAVA_HEADER) == response


def test_a3_rocketmq_response(impl):
    request = impl.frame.RemotingCommand(34, opaque=7, serialize_type="ROCKETMQ")
    response = request.response(0, ext_fields=dict(HB_V2))
    assert response.serialize_type == "ROCKETMQ"
    assert response.encode() == A3_SORTED
    assert impl.frame.decode_frame(A3_JAVA) == response
    assert impl.frame.decode_frame(A3_SORTED) == response


def test_a4_rocketmq_unregister(impl):
    cmd = impl.frame.RemotingCommand(35, opaque=12, ext_fields=dict(UNREGISTER_EXT, producerGroup=None),
                                     serialize_type=SerializeType.ROCKETMQ)
    assert cmd.encode() == A4  # producerGroup None: left out
    back = impl.frame.decode_frame(A4)
    assert back.code == 35 and back.opaque == 12 and back.version == 479 and back.language is LanguageCode.JAVA
    assert back.ext_fields == UNREGISTER_EXT and back.remark is None and back.serialize_type == "ROCKETMQ"


def test_a5_notify_oneway(impl):
    cmd = impl.frame.RemotingCommand(40, opaque=13, flag=2, ext_fields={"consumerGroup": "demo_consumer_group"})
    assert cmd.encode() == bytes.fromhex("0000009900000095") + A5_HEADER
    back = impl.frame.decode_frame(cmd.encode())
    assert back.is_oneway and not back.is_response and back == cmd


def test_a6_consumer_list_response(impl):
    cmd = impl.frame.RemotingCommand(38, opaque=9).response(0, ext_fields={}, body=A6_BODY)
    assert cmd.encode() == frame(A6_HEADER, A6_BODY)


@pytest.mark.parametrize(
    "kwargs,header",
    [
        (dict(code=34, opaque=7, version=409),
         b'{"code":34,"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":409}'),
        (dict(code=35, opaque=12, ext_fields=UNREGISTER_EXT),
         b'{"code":35,"extFields":{"clientID":"192.168.1.10@12345#1234567890123","consumerGroup":"demo_consumer_group"},'
         b'"flag":0,"language":"JAVA","opaque":12,"serializeTypeCurrentRPC":"JSON","version":479}'),
        (dict(code=3, flag=1, opaque=11, remark=" request type 999 not supported"),
         b'{"code":3,"flag":1,"language":"JAVA","opaque":11,"remark":" request type 999 not supported",'
         b'"serializeTypeCurrentRPC":"JSON","version":479}'),
    ],
    ids=["heartbeat-4x", "unregister", "error-response"],
)
def test_section_2_4_examples(impl, kwargs, header):
    kwargs = dict(kwargs)
    code = kwargs.pop("code")
    cmd = impl.frame.RemotingCommand(code, **kwargs)
    assert cmd.encode() == frame(header)
    assert impl.frame.decode_frame(frame(header)) == cmd


def test_fastjson_escaping_example(impl):
    # PROTOCOL.md 4.7, verified against fastjson: a/bé中<DEL><U+2028><TAB>" -> "a/bé中\u007F\u2028\t\""
    cmd = impl.frame.RemotingCommand(1, remark='a/bé中\x7f\u2028\t"')
    header = cmd.encode()[8:]
    assert b',"remark":"a/b\xc3\xa9\xe4\xb8\xad\\u007F\\u2028\\t\\"",' in header
    assert impl.frame.decode_frame(cmd.encode()).remark == 'a/bé中\x7f\u2028\t"'


def test_json_escaping_all_classes(impl):
    text = "".join(chr(c) for c in range(0x20)) + '"\\/\x7f\x80\x9f\xa0\u2027\u2028\u2029\u202a\U0001F600'
    cmd = impl.frame.RemotingCommand(0, remark=text, ext_fields={text: text})
    header = cmd.encode()[8:]
    expected = (
        '"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000B\\f\\r\\u000E\\u000F'
        + "".join("\\u%04X" % c for c in range(0x10, 0x20))
        + '\\"\\\\/\\u007F\\u0080\\u009F\xa0\u2027\\u2028\\u2029\u202a\U0001F600"'
    ).encode()
    assert header.count(expected) == 3  # ext key, ext value, remark
    assert impl.frame.decode_frame(cmd.encode()) == cmd


def test_lone_surrogates_encode_like_java(impl):
    cmd = impl.frame.RemotingCommand(0, remark="a\ud800b\udc00", ext_fields={"k\ud83d\ude00": "\ud83d\ude00"})
    back = impl.frame.decode_frame(cmd.encode())
    assert back.remark == "a?b?"  # Java's UTF-8 encoder writes '?' for a lone surrogate
    assert back.ext_fields == {"k\U0001F600": "\U0001F600"}  # a pair held as two code points is one character
    cmd.serialize_type = "ROCKETMQ"
    back = impl.frame.decode_frame(cmd.encode())
    assert back.remark == "a?b?" and back.ext_fields == {"k\U0001F600": "\U0001F600"}


# ---------------------------------------------------------------------------------------------------------------
# JSON header decoding: what real clients send


def test_any_key_order_and_unknown_keys(impl):
    header = (
        b'{"version":317,"unknown":{"a":[1,2,{"b":null}],"c":"\\u00e9"},"opaque":5,"extFields":{"topic":"T"},'
        b'"flag":0,"code":105,"language":"GO","serializeTypeCurrentRPC":"JSON","x":[true,false,null,-1.5e3]}'
    )
    cmd = decode_json(impl, header)
    assert (cmd.code, cmd.version, cmd.opaque, cmd.flag) == (105, 317, 5, 0)
    assert cmd.language is LanguageCode.GO and cmd.ext_fields == {"topic": "T"} and cmd.remark is None


@pytest.mark.parametrize("remark,expected", [(None, None), (b'""', ""), (b"null", None), (b'"x"', "x"),
                                             (b"12", "12"), (b"true", "true")])
def test_remark_forms(impl, remark, expected):
    header = b'{"code":0' + (b',"remark":' + remark if remark is not None else b"") + b"}"
    assert decode_json(impl, header).remark == expected


def test_cpp_trailing_newline_and_whitespace(impl):
    header = b' \t{ "code" : 34 ,\n "language" : "CPP" , "remark" : "" }\r\n \n'
    cmd = decode_json(impl, header, b"{}\n")
    assert cmd.code == 34 and cmd.language is LanguageCode.CPP and cmd.remark == "" and cmd.body == b"{}\n"


def test_serialize_type_comes_from_header_word(impl):
    cmd = decode_json(impl, b'{"code":1,"serializeTypeCurrentRPC":"ROCKETMQ"}')
    assert cmd.serialize_type == "JSON"
    assert decode_json(impl, b'{"code":1}').serialize_type == "JSON"


@pytest.mark.parametrize(
    "value,expected",
    [(b'"JAVA"', LanguageCode.JAVA), (b'"NODE_JS"', LanguageCode.NODE_JS), (b'"RUST"', LanguageCode.RUST),
     (b"1", LanguageCode.CPP), (b"13", LanguageCode.NODE_JS), (b"-0", LanguageCode.JAVA), (b"0", LanguageCode.JAVA),
     (b'"COBOL"', None), (b'"java"', None), (b'""', None), (b"14", None), (b"-1", None), (b"99999999999999", None),
     (b"null", None), (b'"\\u004aAVA"', LanguageCode.JAVA), (b'"JAV\\u00c1"', None), (b'"J\xc3\x81VA"', None)],
)
def test_language_forms(impl, value, expected):
    assert decode_json(impl, b'{"code":0,"language":' + value + b"}").language is expected


def test_missing_fields_default(impl):
    cmd = decode_json(impl, b"{}")
    assert (cmd.code, cmd.flag, cmd.opaque, cmd.version) == (0, 0, 0, 0)
    assert cmd.language is LanguageCode.JAVA  # the Java field default
    assert cmd.remark is None and cmd.ext_fields is None and cmd.body == b""


@pytest.mark.parametrize(
    "value,expected",
    [(b"12", 12), (b"-12", -12), (b"-0", 0), (b'"12"', 12), (b'"+12"', 12), (b'"-12"', -12), (b'"007"', 7),
     (b"null", 0), (b"2147483647", 2147483647), (b"-2147483648", -2147483648), (b'"-2147483648"', -2147483648),
     (b'"' + b"0" * 5000 + b'1"', 1), (b'"\\u0031\\u0032"', 12)],
)
def test_int_field_forms(impl, value, expected):
    for name in ("code", "flag", "opaque", "version"):
        assert getattr(decode_json(impl, b'{"' + name.encode() + b'":' + value + b"}"), name) == expected


@pytest.mark.parametrize(
    "value",
    [b"2147483648", b"-2147483649", b'"2147483648"', b'"-2147483649"', b"1" * 5000, b"34.0", b"1e2", b"true",
     b"false", b'""', b'"+"', b'" 1"', b'"1 "', b'"0x10"', b'"1.0"', b"[1]", b'{"a":1}', b'"\xd9\xa1"',
     b'"\\uff11"'],
)
def test_int_field_refused(impl, value):
    for name in ("code", "flag", "opaque", "version"):
        header = b'{"' + name.encode() + b'":' + value + b"}"
        json_error(impl, header, f"'{name}' is not an int32 at byte {8 + len(name) + 4}")


@pytest.mark.parametrize("value", [b"1.0", b"1e0", b"true", b"false", b"[0]", b'{"a":0}'])
def test_language_bad_types(impl, value):
    json_error(impl, b'{"language":' + value + b"}", "'language' is not a name or an ordinal at byte 20")


@pytest.mark.parametrize(
    "raw,expected",
    [(b'"v"', "v"), (b'""', ""), (b"null", None), (b"false", "false"), (b"true", "true"), (b"12", "12"),
     (b"-0", "-0"), (b"1.50", "1.50"), (b"1E+3", "1E+3"), (b'{"a": [1, "x"]}', '{"a": [1, "x"]}'),
     (b"[ ]", "[ ]"), (b'"\\ud83d\\ude00"', "\U0001F600"), (b'"\\/\\b\\f\\n\\r\\t\\"\\\\"', '/\b\f\n\r\t"\\'),
     (b'"\xe4\xb8\xad\xf0\x9f\x98\x80"', "中😀"), (b'["\xc3\xa9"]', '["é"]')],
)
def test_ext_field_values(impl, raw, expected):
    cmd = decode_json(impl, b'{"extFields":{"k":' + raw + b',"z":"last"}}')
    assert cmd.ext_fields == {"k": expected, "z": "last"}


def test_ext_fields_null_empty_and_duplicates(impl):
    assert decode_json(impl, b'{"extFields":null}').ext_fields is None
    assert decode_json(impl, b'{"extFields":{}}').ext_fields == {}
    assert decode_json(impl, b'{"extFields":{ }}').ext_fields == {}
    cmd = decode_json(impl, b'{"extFields":{"a":"1","a":"2","":"empty"},"code":1,"code":2}')
    assert cmd.ext_fields == {"a": "2", "": "empty"} and cmd.code == 2  # last one wins, as in fastjson
    cmd = decode_json(impl, b'{"extFields":{"a":"1"},"extFields":null}')
    assert cmd.ext_fields is None


def test_escaped_keys_match(impl):
    cmd = decode_json(impl, b'{"\\u0063ode":7,"ext\\u0046ields":{"\\u0061":"b"},"langu\\u0061ge":"CPP"}')
    assert cmd.code == 7 and cmd.ext_fields == {"a": "b"} and cmd.language is LanguageCode.CPP


def test_ext_fields_limit(impl):
    entries = ",".join(f'"k{i}":"{i}"' for i in range(MAX_EXT_FIELDS))
    cmd = decode_json(impl, ('{"extFields":{' + entries + "}}").encode())
    assert len(cmd.ext_fields) == MAX_EXT_FIELDS
    json_error(impl, ('{"extFields":{' + entries + ',"one_more":"x"}}').encode(),
               f"more than {MAX_EXT_FIELDS} ext fields")


def test_nesting_limit(impl):
    depth = impl.frame.MAX_JSON_DEPTH
    # The header object is depth 1: depth - 1 nested arrays fit under an unknown key, one more does not.
    ok = b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    assert decode_json(impl, ok).code == 0
    too_deep = b'{"x":' + b"[" * depth + b"]" * depth + b"}"
    json_error(impl, too_deep, f"JSON nesting deeper than {depth} at byte {8 + 5 + depth - 1}")
    ext_ok = b'{"extFields":{"k":' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"
    assert decode_json(impl, ext_ok).ext_fields == {"k": "[" * (depth - 2) + "]" * (depth - 2)}
    json_error(impl, b'{"extFields":{"k":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}}", "nesting")


def test_body_is_bytes(impl):
    cmd = decode_json(impl, b"{}", b"\x00\xffbody")
    assert type(cmd.body) is bytes and cmd.body == b"\x00\xffbody"
    assert type(decode_json(impl, b"{}").body) is bytes


def test_decode_accepts_bytes_like(impl):
    data = frame(b'{"code":5}', b"xy")
    for form in (data, bytearray(data), memoryview(data), memoryview(b"...." + data)[4:]):
        cmd = impl.frame.decode_frame(form)
        assert cmd.code == 5 and cmd.body == b"xy"
    with pytest.raises(TypeError):
        impl.frame.decode_frame("not bytes")
    with pytest.raises(TypeError):
        impl.frame.decode_frame(memoryview(data + data)[::2])  # not contiguous


# ---------------------------------------------------------------------------------------------------------------
# JSON header errors: each branch, with the byte offset


@pytest.mark.parametrize(
    "header,message",
    [
        (b"", "empty JSON header at byte 8"),
        (b" \n\t ", "empty JSON header at byte 12"),
        (b"[]", "JSON header is not an object at byte 8"),
        (b'"code"', "JSON header is not an object at byte 8"),
        (b"34", "JSON header is not an object at byte 8"),
        (b"{", "unexpected end of JSON header at byte 9"),
        (b'{"code":34', "unexpected end of JSON header at byte 18"),
        (b'{"code":', "unexpected end of JSON header at byte 16"),
        (b'{"code"', "unexpected end of JSON header at byte 15"),
        (b'{"code" 34}', "expected ':' at byte 16"),
        (b'{"code":34 "flag":0}', "expected ',' or '}' at byte 19"),
        (b'{"code":34,}', "expected a string key at byte 19"),
        (b"{code:34}", "expected a string key at byte 9"),
        (b"{'code':34}", "expected a string key at byte 9"),
        (b'{"code":34}x', "trailing data after the JSON header at byte 19"),
        (b'{"code":34}{}', "trailing data after the JSON header at byte 19"),
        (b'{"code":34}\x00', "trailing data after the JSON header at byte 19"),
        (b'{"x":NaN}', "invalid JSON value at byte 13"),
        (b'{"x":Infinity}', "invalid JSON value at byte 13"),
        (b'{"x":-Infinity}', "invalid number at byte 13"),
        (b'{"x":tru}', "invalid JSON value at byte 13"),
        (b'{"x":nul', "invalid JSON value at byte 13"),
        (b'{"x":01}', "expected ',' or '}' at byte 14"),
        (b'{"x":1.}', "expected ',' or '}' at byte 14"),
        (b'{"x":1e}', "expected ',' or '}' at byte 14"),
        (b'{"x":-}', "invalid number at byte 13"),
        (b'{"x":+1}', "invalid JSON value at byte 13"),
        (b'{"x":[1,]}', "invalid JSON value at byte 16"),
        (b'{"x":[1 2]}', "expected ',' or ']' at byte 16"),
        (b'{"x":{"a" 1}}', "expected ':' at byte 18"),
        (b'{"x":{"a":1,}}', "expected a string key at byte 20"),
        (b'{"x":"abc', "unterminated string at byte 13"),
        (b'{"x":"abc\\', "unterminated string at byte 13"),
        (b'{"x":"a\nb"}', "control character in string at byte 15"),
        (b'{"x":"a\x00b"}', "control character in string at byte 15"),
        (b'{"x":"\\x"}', "invalid escape at byte 14"),
        (b'{"x":"\\u12G4"}', "invalid escape at byte 14"),
        (b'{"x":"\\u12"}', "invalid escape at byte 14"),
        (b'{"x":"\\ud800"}', "lone surrogate at byte 14"),
        (b'{"x":"\\udc00"}', "lone surrogate at byte 14"),
        (b'{"x":"\\ud800x"}', "lone surrogate at byte 14"),
        (b'{"x":"\\ud800\\u0041"}', "lone surrogate at byte 14"),
        (b'{"x":"\\ud800\\ud800"}', "lone surrogate at byte 14"),
        (b'{"x":"\\ud800\\uZZZZ"}', "invalid escape at byte 20"),
        (b'{"x":"\\ud800\\n"}', "lone surrogate at byte 14"),
        (b'{"extFields":[]}', "'extFields' is not an object at byte 21"),
        (b'{"extFields":"a=b"}', "'extFields' is not an object at byte 21"),
        (b'{"extFields":0}', "'extFields' is not an object at byte 21"),
        (b'{"extFields":{"a":}}', "invalid JSON value at byte 26"),
        (b'{"extFields":{"a":1', "unexpected end of JSON header at byte 27"),
        (b'{"extFields":{1:"a"}}', "expected a string key at byte 22"),
    ],
)
def test_json_syntax_errors(impl, header, message):
    json_error(impl, header, message)


@pytest.mark.parametrize(
    "bad,offset",
    [
        (b"\x80", 0), (b"\xc0\x80", 0), (b"\xc1\xbf", 0), (b"\xe0\x80\x80", 0), (b"\xed\xa0\x80", 0),
        (b"\xf0\x80\x80\x80", 0), (b"\xf4\x90\x80\x80", 0), (b"\xf5\x80\x80\x80", 0), (b"\xff", 0),
        (b"\xe4\xb8", 0), (b"\xe4\xb8A", 0), (b"ok\xc3", 2), (b"\xc3\xa9\xc3", 2), (b"\xf0\x9f\x98", 0),
    ],
)
def test_invalid_utf8_everywhere(impl, bad, offset):
    # in a key, in an ext value, in a skipped value, and in a value that is decoded
    for prefix, suffix in ((b'{"', b'":1}'), (b'{"extFields":{"k":"', b'"}}'), (b'{"x":["', b'"]}'),
                           (b'{"remark":"', b'"}'), (b'{"extFields":{"', b'":null}}')):
        json_error(impl, prefix + bad + suffix, f"invalid UTF-8 at byte {8 + len(prefix) + offset}")


def test_error_classes_and_echo(impl):
    with pytest.raises(ValueError) as info:  # callers may catch ValueError or RemotingError
        impl.frame.decode_frame(frame(b'{"code":34}' + b"GARBAGE" * 20))
    assert type(info.value) is FrameError and isinstance(info.value, RemotingError)
    message = str(info.value)
    assert "near b'GARBAGE" in message and len(message) < 120  # a short echo, not the whole input


# ---------------------------------------------------------------------------------------------------------------
# Frame-level errors


def test_truncated_and_mismatched_frames(impl):
    good = frame(b'{"code":1}', b"body")
    frame_error(impl, b"", "truncated frame: 0 bytes")
    frame_error(impl, good[:3], "truncated frame: 3 bytes")
    frame_error(impl, good[:-1], f"frame length {len(good) - 4} does not match the {len(good) - 5} bytes")
    frame_error(impl, good + b"x", "does not match")
    frame_error(impl, good[:6], "does not match")


@pytest.mark.parametrize("prefix", [-1, -(2**31), -4])
def test_negative_length(impl, prefix):
    frame_error(impl, struct.pack(">i", prefix) + b"\x00" * 8, f"negative frame length {prefix}")


@pytest.mark.parametrize("total", [0, 1, 3])
def test_length_below_header_word(impl, total):
    frame_error(impl, struct.pack(">i", total) + b"\x00" * total, f"frame length {total} leaves no room")


def test_bad_header_length(impl):
    frame_error(impl, struct.pack(">iI", 8, 5) + b"{}\x00\x00", "bad header length 5 for frame length 8")
    frame_error(impl, struct.pack(">iI", 4, 1), "bad header length 1 for frame length 4")
    frame_error(impl, struct.pack(">iI", 4, 0x00FFFFFF), "bad header length 16777215")


@pytest.mark.parametrize("serialize_type", [2, 3, 0x7F, 0xFF])
def test_unknown_serialize_type(impl, serialize_type):
    frame_error(impl, frame(b"{}", serialize_type=serialize_type), f"unknown serialize type {serialize_type}")


def test_max_frame_size_boundary(impl):
    # total_length 16777212 is the largest accepted with the 16 MiB default; 16777213 is refused (PROTOCOL.md 1.2).
    header = b'{"code":11}'
    body = b"\xab" * (16777212 - 4 - len(header))
    data = frame(header, body)
    assert struct.unpack(">i", data[:4])[0] == 16777212 and len(data) == DEFAULT_MAX_FRAME_SIZE
    cmd = impl.frame.decode_frame(data)
    assert cmd.code == 11 and len(cmd.body) == len(body)
    decoder = impl.frame.FrameDecoder()
    out = []
    for i in range(0, len(data), 1 << 20):
        out += decoder.feed(data[i : i + (1 << 20)])
    assert len(out) == 1 and out[0].body == body and decoder.buffered == 0
    too_big = struct.pack(">i", 16777213) + data[4:] + b"\xab"
    frame_error(impl, too_big, "frame length 16777213 exceeds the max frame size 16777216")
    decoder = impl.frame.FrameDecoder()
    with pytest.raises(FrameError, match="exceeds the max frame size"):
        decoder.feed(too_big[:4])
    assert decoder.buffered == 0


def test_custom_max_frame_size(impl):
    data = frame(b"{}", b"x" * 10)  # 20 bytes in all
    assert impl.frame.decode_frame(data, max_frame_size=20).body == b"x" * 10
    with pytest.raises(FrameError, match="frame length 16 exceeds the max frame size 19"):
        impl.frame.decode_frame(data, max_frame_size=19)
    with pytest.raises(FrameError, match="exceeds the max frame size 19"):
        impl.frame.FrameDecoder(max_frame_size=19).feed(data[:4])
    assert impl.frame.decode_frame(data, max_frame_size=2**40).body == b"x" * 10
    assert impl.frame.FrameDecoder(max_frame_size=100).max_frame_size == 100
    for bad, error in ((7, ValueError), (-1, ValueError), ("16", TypeError), (1.5, TypeError)):
        with pytest.raises(error):
            impl.frame.FrameDecoder(max_frame_size=bad)
        with pytest.raises(error):
            impl.frame.decode_frame(data, max_frame_size=bad)


# ---------------------------------------------------------------------------------------------------------------
# ROCKETMQ header decoding


def test_rocketmq_decode_fields(impl):
    ext = rmq_entry(b"topic", b"T\xc3\xa9") + rmq_entry(b"empty", b"") + rmq_entry(b"", b"skipped")
    header = rmq_header(code=-3, language=9, version=-2, opaque=-1, flag=3, remark="oops é".encode(), ext=ext)
    cmd = impl.frame.decode_frame(frame(header, b"BODY", serialize_type=1))
    assert (cmd.code, cmd.version, cmd.opaque, cmd.flag) == (-3, -2, -1, 3)
    assert cmd.language is LanguageCode.GO and cmd.remark == "oops é" and cmd.body == b"BODY"
    # Java readStr: length 0 is null, so an empty value is a None under its key; a zero-length key is skipped.
    assert cmd.ext_fields == {"topic": "Té", "empty": None}
    assert cmd.is_response and cmd.is_oneway and cmd.serialize_type == "ROCKETMQ"


def test_rocketmq_decode_minimal_and_unknown_language(impl):
    cmd = impl.frame.decode_frame(frame(rmq_header(language=200), serialize_type=1))
    assert cmd.language is None and cmd.remark is None and cmd.ext_fields is None and cmd.body == b""
    cmd = impl.frame.decode_frame(frame(rmq_header(ext=rmq_entry(b"", b"v")), serialize_type=1))
    assert cmd.ext_fields == {}  # ext_len > 0 but its only entry had an empty key
    cmd = impl.frame.decode_frame(frame(rmq_header(remark=b"\x00\x01\n"), serialize_type=1))
    assert cmd.remark == "\x00\x01\n"  # no JSON rules here: control characters are fine


def test_rocketmq_ext_limit(impl):
    ext = b"".join(rmq_entry(b"k%d" % i, b"v") for i in range(MAX_EXT_FIELDS))
    cmd = impl.frame.decode_frame(frame(rmq_header(ext=ext), serialize_type=1))
    assert len(cmd.ext_fields) == MAX_EXT_FIELDS
    ext += rmq_entry(b"x", b"y")
    frame_error(impl, frame(rmq_header(ext=ext), serialize_type=1), f"more than {MAX_EXT_FIELDS} ext fields")


@pytest.mark.parametrize(
    "header,message",
    [
        (b"", "ROCKETMQ header of 0 bytes is shorter than 21 at byte 8"),
        (rmq_header()[:20], "ROCKETMQ header of 20 bytes is shorter than 21"),
        (rmq_header(remark_len=-1), "negative remark length -1 at byte 21"),
        (rmq_header(remark_len=1), "remark length 1 exceeds the header at byte 21"),
        (rmq_header(remark=b"abc", remark_len=4), "remark length 4 exceeds the header at byte 21"),
        (rmq_header(remark_len=2**31 - 1), "remark length 2147483647 exceeds the header"),
        (rmq_header(ext_len=-5), "negative ext fields length -5 at byte 25"),
        (rmq_header(ext_len=1), "ext fields length 1 exceeds the header at byte 25"),
        (rmq_header(remark=b"r", ext=rmq_entry(b"k", b"v"), ext_len=12), "ext fields length 12 exceeds the header at byte 26"),
        (rmq_header(ext=b"\x00"), "truncated ext field key length at byte 29"),
        (rmq_header(ext=rmq_entry(b"k", b"v", key_len=-1)), "negative ext field key length -1 at byte 29"),
        (rmq_header(ext=rmq_entry(b"k", b"v", key_len=9)), "ext field key length 9 overruns the ext fields at byte 29"),
        (rmq_header(ext=rmq_entry(b"k", b"v")[:5]), "truncated ext field value length at byte 32"),
        (rmq_header(ext=rmq_entry(b"k", b"v", value_len=-2)), "negative ext field value length -2 at byte 32"),
        (rmq_header(ext=rmq_entry(b"k", b"v", value_len=2)), "ext field value length 2 overruns the ext fields at byte 32"),
        (rmq_header() + b"\x00", "extra bytes after the ROCKETMQ header at byte 29"),
        (rmq_header(ext=rmq_entry(b"k", b"v")) + b"zz", "extra bytes after the ROCKETMQ header at byte 37"),
        (rmq_header(remark=b"a\xffb"), "invalid UTF-8 at byte 26"),
        (rmq_header(ext=rmq_entry(b"\xc3", b"v")), "invalid UTF-8 at byte 31"),
        (rmq_header(ext=rmq_entry(b"k", b"\xed\xa0\x80")), "invalid UTF-8 at byte 36"),
    ],
)
def test_rocketmq_errors(impl, header, message):
    frame_error(impl, frame(header, b"body", serialize_type=1), message)


def test_rocketmq_truncates_code_and_version(impl):
    cmd = impl.frame.RemotingCommand(200050, version=70000, serialize_type="ROCKETMQ", language=None)
    data = cmd.encode()
    assert data[8:10] == struct.pack(">H", 200050 & 0xFFFF) and data[10] == 0  # (short) cast; None -> JAVA byte
    back = impl.frame.decode_frame(data)
    assert back.code == 200050 - 3 * 65536 and back.version == 70000 - 65536 and back.language is LanguageCode.JAVA
    cmd.code, cmd.version = -1, 40000
    back = impl.frame.decode_frame(cmd.encode())
    assert back.code == -1 and back.version == 40000 - 65536


def test_rocketmq_encode_rules(impl):
    cmd = impl.frame.RemotingCommand(1, remark="", ext_fields={"b": "2", "a": "1", "n": None, None: "x", "e": ""},
                                     serialize_type="ROCKETMQ")
    data = cmd.encode()
    ext = rmq_entry(b"a", b"1") + rmq_entry(b"b", b"2") + rmq_entry(b"e", b"")
    assert data == frame(rmq_header(code=1, version=BROKER_VERSION, ext=ext), serialize_type=1)
    back = impl.frame.decode_frame(data)
    assert back.remark is None and back.ext_fields == {"a": "1", "b": "2", "e": None}
    # An empty map and a map of only None values are written as ext length 0, which decodes to None.
    for ext_fields in ({}, {"n": None}):
        cmd = impl.frame.RemotingCommand(1, ext_fields=ext_fields, serialize_type="ROCKETMQ")
        assert impl.frame.decode_frame(cmd.encode()).ext_fields is None
    with pytest.raises(ValueError, match="does not fit the int16 length"):
        impl.frame.RemotingCommand(1, ext_fields={"k" * 32768: "v"}, serialize_type="ROCKETMQ").encode()
    assert impl.frame.RemotingCommand(1, ext_fields={"k" * 32767: "v"}, serialize_type="ROCKETMQ").encode()


# ---------------------------------------------------------------------------------------------------------------
# JSON encoding rules


def test_json_encode_rules(impl):
    RC = impl.frame.RemotingCommand
    assert b"extFields" not in RC(1).encode()
    assert b',"extFields":{},' in RC(1, ext_fields={}).encode()
    assert b',"extFields":{},' in RC(1, ext_fields={"n": None, None: "v"}).encode()
    assert b'"extFields":{"A":"1","B":"2","a":"3","\xc3\xa9":"4"}' in RC(
        1, ext_fields={"é": "4", "a": "3", "B": "2", "A": "1"}).encode()
    no_language = RC(1, language=None).encode()
    assert b"language" not in no_language
    assert impl.frame.decode_frame(no_language).language is LanguageCode.JAVA  # as a Java receiver would see it
    assert b',"remark":"",' in RC(1, remark="").encode()
    assert b"remark" not in RC(1).encode()
    assert b'"code":-2147483648,' in RC(-(2**31), flag=2**31 - 1).encode()
    assert b'"flag":2147483647,' in RC(-(2**31), flag=2**31 - 1).encode()


def test_encode_header_too_large(impl):
    with pytest.raises(ValueError, match="exceeds 16777215 bytes"):
        impl.frame.RemotingCommand(1, remark="x" * HEADER_LIMIT).encode()
    with pytest.raises(ValueError, match="exceeds 16777215 bytes"):
        impl.frame.RemotingCommand(1, remark="x" * HEADER_LIMIT, serialize_type="ROCKETMQ").encode()


# ---------------------------------------------------------------------------------------------------------------
# RemotingCommand API


def test_constructor_defaults_and_normalization(impl):
    RC = impl.frame.RemotingCommand
    cmd = RC(34)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (34, LanguageCode.JAVA, BROKER_VERSION, 0, 0)
    assert cmd.remark is None and cmd.ext_fields is None and cmd.body == b"" and cmd.serialize_type == "JSON"
    cmd = RC(True, language="CPP", body=bytearray(b"ab"), serialize_type=SerializeType.ROCKETMQ)
    assert type(cmd.code) is int and cmd.code == 1 and cmd.language is LanguageCode.CPP
    assert type(cmd.body) is bytes and cmd.body == b"ab" and cmd.serialize_type == "ROCKETMQ"
    assert RC(1, language=9).language is LanguageCode.GO and RC(1, language=None).language is None
    assert RC(1, serialize_type=0).serialize_type == "JSON" and RC(1, body=None).body == b""
    assert RC(1, body=memoryview(b"xyz")).body == b"xyz"


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(code="34"), TypeError, "cannot be interpreted as an integer"),
        (dict(code=1.0), TypeError, "cannot be interpreted as an integer"),
        (dict(code=2**31), ValueError, "code must be an int32, got 2147483648"),
        (dict(code=1, version=-(2**31) - 1), ValueError, "version must be an int32"),
        (dict(code=1, opaque=2**63), ValueError, "opaque must be an int32"),
        (dict(code=1, flag=None), TypeError, "cannot be interpreted as an integer"),
        (dict(code=1, language="COBOL"), ValueError, "unknown language 'COBOL'"),
        (dict(code=1, language=99), ValueError, "unknown language 99"),
        (dict(code=1, remark=5), TypeError, "remark must be a str or None, got int"),
        (dict(code=1, ext_fields=[("a", "b")]), TypeError, "ext_fields must be a dict or None, got list"),
        (dict(code=1, body="text"), TypeError, "body must be bytes, got str"),
        (dict(code=1, body=5), TypeError, "body must be bytes, got int"),
        (dict(code=1, serialize_type="json"), ValueError, "unknown serialize type 'json'"),
        (dict(code=1, serialize_type=2), ValueError, "unknown serialize type 2"),
    ],
)
def test_constructor_validation(impl, kwargs, error, message):
    kwargs = dict(kwargs)
    code = kwargs.pop("code")
    with pytest.raises(error, match=message):
        impl.frame.RemotingCommand(code, **kwargs)


def test_encode_validates_mutated_fields(impl):
    cmd = impl.frame.RemotingCommand(1)
    cmd.code = 2**40
    with pytest.raises(ValueError, match="code must be an int32"):
        cmd.encode()
    cmd.code = 1
    cmd.ext_fields = {"k": 5}
    with pytest.raises(TypeError, match="ext_fields values must be str or None, got int"):
        cmd.encode()
    cmd.ext_fields = {5: "v"}
    with pytest.raises(TypeError, match="ext_fields keys must be str, got int"):
        cmd.encode()
    cmd.ext_fields = None
    cmd.serialize_type = "XML"
    with pytest.raises(ValueError, match="unknown serialize type"):
        cmd.encode()
    cmd.serialize_type = SerializeType.ROCKETMQ
    cmd.language = "GO"
    cmd.body = bytearray(b"b")
    back = impl.frame.decode_frame(cmd.encode())
    assert back.serialize_type == "ROCKETMQ" and back.language is LanguageCode.GO and back.body == b"b"


def test_response(impl):
    request = impl.frame.RemotingCommand(35, language="CPP", version=63, opaque=77, flag=0, remark="r",
                                         ext_fields={"clientID": "c"}, body=b"b", serialize_type="ROCKETMQ")
    response = request.response(3, remark="no", ext_fields={"x": "y"}, body=b"z")
    assert (response.code, response.flag, response.opaque, response.version) == (3, 1, 77, BROKER_VERSION)
    assert response.language is LanguageCode.JAVA and response.serialize_type == "ROCKETMQ"
    assert response.remark == "no" and response.ext_fields == {"x": "y"} and response.body == b"z"
    assert response.is_response and not response.is_oneway
    plain = request.response()
    assert plain.code == 0 and plain.remark is None and plain.ext_fields is None and plain.body == b""
    with pytest.raises(ValueError, match="code must be an int32"):
        request.response(2**31)


def test_flags(impl):
    RC = impl.frame.RemotingCommand
    assert not RC(1).is_response and not RC(1).is_oneway
    assert RC(1, flag=1).is_response and RC(1, flag=2).is_oneway and RC(1, flag=3).is_oneway
    assert RC(1, flag=-1).is_response and type(RC(1, flag=1).is_response) is bool


def test_equality_and_hash(impl):
    RC = impl.frame.RemotingCommand
    a = RC(1, ext_fields={"k": "v"}, body=b"x")
    b = RC(1, ext_fields={"k": "v"}, body=b"x")
    assert a == b and not (a != b)
    for field, value in (("code", 2), ("language", None), ("version", 1), ("opaque", 1), ("flag", 1),
                         ("remark", ""), ("ext_fields", {}), ("body", b""), ("serialize_type", "ROCKETMQ")):
        c = RC(1, ext_fields={"k": "v"}, body=b"x")
        setattr(c, field, value)
        assert a != c and not (a == c), field
    assert a != "not a command" and a != None  # noqa: E711
    with pytest.raises(TypeError):
        hash(a)


def test_repr_is_short(impl):
    cmd = impl.frame.RemotingCommand(34, remark="r" * 500, ext_fields={f"k{i}": "v" * 50 for i in range(100)},
                                     body=b"\x00" * 100000)
    text = repr(cmd)
    assert text.startswith("RemotingCommand(code=34, flag=0, opaque=0, language=JAVA, version=479")
    assert "<100000 bytes>" in text and "<100 fields>" in text and len(text) < 300
    small = repr(impl.frame.RemotingCommand(1, ext_fields={"a": "b"}, language=None))
    assert "ext_fields={'a': 'b'}" in small and "language=None" in small


def test_to_dict(impl):
    cmd = impl.frame.RemotingCommand(34, language="CPP", opaque=3, remark="r", ext_fields={"a": None}, body=b"b")
    d = cmd.to_dict()
    assert d == {"code": 34, "language": "CPP", "version": 479, "opaque": 3, "flag": 0, "remark": "r",
                 "ext_fields": {"a": None}, "body": b"b", "serialize_type": "JSON"}
    d["ext_fields"]["a"] = "changed"
    assert cmd.ext_fields == {"a": None}  # a copy
    assert impl.frame.RemotingCommand(1, language=None).to_dict()["language"] is None
    assert json.dumps({k: v for k, v in d.items() if k != "body"})


def test_module_exports(impl):
    assert set(impl.frame.__all__) == {"RemotingCommand", "FrameDecoder", "decode_frame", "AnswerTemplate", "body_digest"}


# ---------------------------------------------------------------------------------------------------------------
# FrameDecoder


def two_frames():
    return frame(b'{"code":34,"opaque":1}', b"{}") + frame(rmq_header(code=35, opaque=2), b"", serialize_type=1)


def test_decoder_partial_frames(impl):
    decoder = impl.frame.FrameDecoder()
    data = two_frames()
    assert decoder.feed(b"") == [] and decoder.buffered == 0
    assert decoder.feed(data[:3]) == [] and decoder.buffered == 3
    assert decoder.feed(data[3:10]) == [] and decoder.buffered == 10
    first_len = struct.unpack(">i", data[:4])[0] + 4
    out = decoder.feed(data[10 : first_len + 5])
    assert [c.opaque for c in out] == [1] and decoder.buffered == 5
    out = decoder.feed(data[first_len + 5 :])
    assert [(c.code, c.serialize_type) for c in out] == [(35, "ROCKETMQ")] and decoder.buffered == 0
    assert [c.opaque for c in decoder.feed(bytearray(data))] == [1, 2]
    assert [c.opaque for c in decoder.feed(memoryview(data * 3)[: len(data) * 2])] == [1, 2, 1, 2]
    with pytest.raises(TypeError):
        decoder.feed("text")
    with pytest.raises(TypeError):
        decoder.feed(memoryview(data)[::2])
    assert [c.opaque for c in decoder.feed(data)] == [1, 2]  # a TypeError does not break the stream


@pytest.mark.parametrize("prefix", [b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\x01\x00\x00\x00", b"\xff\xff\xff\xff"])
def test_decoder_refuses_huge_prefix_before_buffering(impl, prefix):
    decoder = impl.frame.FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(prefix)
    assert decoder.buffered == 0
    decoder = impl.frame.FrameDecoder()
    for i in range(3):
        assert decoder.feed(prefix[i : i + 1]) == [] and decoder.buffered == i + 1
    with pytest.raises(FrameError):
        decoder.feed(prefix[3:])
    assert decoder.buffered == 0


def test_decoder_checks_header_word_early(impl):
    decoder = impl.frame.FrameDecoder()
    bad = struct.pack(">iI", 1000, 0x02000010)  # type 2, the 1000-byte frame not yet here
    with pytest.raises(FrameError, match="unknown serialize type 2"):
        decoder.feed(bad)
    decoder = impl.frame.FrameDecoder()
    with pytest.raises(FrameError, match="bad header length 997 for frame length 1000"):
        decoder.feed(struct.pack(">iI", 1000, 997))
    assert decoder.buffered == 0


def test_decoder_poisoned(impl):
    decoder = impl.frame.FrameDecoder()
    good = two_frames()
    with pytest.raises(FrameError) as info:
        decoder.feed(good + frame(b'{"code":') + good)
    assert "unexpected end of JSON header" in str(info.value)
    assert [c.opaque for c in info.value.commands] == [1, 2]  # completed before the bad frame, in that call
    assert decoder.buffered == 0
    for chunk in (good, b"", b"\x00"):
        with pytest.raises(FrameError, match="decoder failed earlier: unexpected end of JSON header"):
            decoder.feed(chunk)
    assert decoder.buffered == 0


def test_decoder_poisoned_from_buffered_state(impl):
    decoder = impl.frame.FrameDecoder()
    data = two_frames()
    assert decoder.feed(data[:5]) == []
    with pytest.raises(FrameError) as info:
        decoder.feed(data[5:] + struct.pack(">i", -7))
    assert [c.opaque for c in info.value.commands] == [1, 2] and decoder.buffered == 0
    with pytest.raises(FrameError, match="decoder failed earlier: negative frame length -7"):
        decoder.feed(data)


def test_decoder_many_small_frames_and_compaction(impl):
    one = frame(b'{"code":1}', b"x" * 50)
    # Up to 360 KB per stream: crosses the native compaction threshold (64 KiB consumed) many times.
    for size, frames in ((1, 300), (7, 5000), (1000, 5000), (65536 + 3, 5000), (70000, 5000)):
        stream = one * frames
        decoder = impl.frame.FrameDecoder()
        out = []
        for pos in range(0, len(stream), size):
            out += decoder.feed(stream[pos : pos + size])
        assert len(out) == frames and decoder.buffered == 0, size
        assert all(c.code == 1 and c.body == b"x" * 50 for c in out)

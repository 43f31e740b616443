"""Property tests: round trips, native/twin parity on generated and mutated input, and a JSON-header oracle.

Parity here is strict: for every input both implementations return equal commands, or both raise FrameError with
the same message. Any other exception (a crash) fails the test.
"""
import importlib
import json
import os
import random
import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import load_vectors, require_native
from engine import FrameError, LanguageCode
from engine.codec import _frame_py as twin
from engine.codec.enums import LANGUAGE_BY_NAME, MAX_EXT_FIELDS

INT32 = st.integers(-(2**31), 2**31 - 1)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FUZZ = settings(max_examples=500, deadline=None)


@pytest.fixture(scope="module")
def native():
    require_native("engine.codec._frame")
    return importlib.import_module("engine.codec._frame")


def frame(header, body=b"", serialize_type=0):
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def outcome(mod, data):
    try:
        return "ok", mod.decode_frame(data).to_dict()
    except FrameError as exc:
        return "FrameError", str(exc)


def assert_parity(native, data):
    expected = outcome(twin, data)
    assert outcome(native, data) == expected, data
    return expected


# ---------------------------------------------------------------------------------------------------------------
# Round trips

command_fields = st.fixed_dictionaries(
    {
        "code": INT32,
        "language": st.none() | st.sampled_from(list(LanguageCode)),
        "version": INT32,
        "opaque": INT32,
        "flag": INT32,
        "remark": st.none() | st.text(max_size=40),
        "ext_fields": st.none() | st.dictionaries(st.text(max_size=12), st.none() | st.text(max_size=30), max_size=8),
        "body": st.binary(max_size=64),
        "serialize_type": st.sampled_from(["JSON", "ROCKETMQ"]),
    }
)


def build(mod, fields):
    fields = dict(fields)
    return mod.RemotingCommand(fields.pop("code"), **fields)


def int16(value):
    return ((value + 0x8000) & 0xFFFF) - 0x8000


def after_round_trip(fields):
    """What a receiver decodes from the encoding of ``fields`` (PROTOCOL.md 2.4, 2.5 rules)."""
    f = dict(fields)
    if f["language"] is None:
        f["language"] = LanguageCode.JAVA  # JSON omits it (Java default on decode); ROCKETMQ writes JAVA's byte
    ext = f["ext_fields"]
    if ext is not None:
        ext = {k: v for k, v in ext.items() if v is not None}  # null values are not written
    if f["serialize_type"] == "ROCKETMQ":
        f["code"], f["version"] = int16(f["code"]), int16(f["version"])
        f["remark"] = f["remark"] or None  # length 0 is null
        if ext is not None:
            ext = {k: (v or None) for k, v in ext.items() if k} if ext else None
    f["ext_fields"] = ext
    return f


@SETTINGS
@given(fields=command_fields)
def test_round_trip(impl, fields):
    data = build(impl.frame, fields).encode()
    expected = build(impl.frame, after_round_trip(fields))
    assert impl.frame.decode_frame(data) == expected
    decoder = impl.frame.FrameDecoder()
    assert decoder.feed(data[:5]) + decoder.feed(data[5:]) == [expected]


@settings(max_examples=300, deadline=None)
@given(fields=command_fields)
def test_cross_implementation_round_trip(native, fields):
    native_cmd, twin_cmd = build(native, fields), build(twin, fields)
    assert native_cmd == twin_cmd and twin_cmd == native_cmd
    assert native_cmd.to_dict() == twin_cmd.to_dict() and repr(native_cmd) == repr(twin_cmd)
    data = native_cmd.encode()
    assert twin_cmd.encode() == data  # byte-identical encoders
    assert twin.decode_frame(data) == native.decode_frame(data) == build(twin, after_round_trip(fields))
    response_fields = dict(code=fields["code"], remark=fields["remark"], ext_fields=fields["ext_fields"])
    assert native_cmd.response(**response_fields).encode() == twin_cmd.response(**response_fields).encode()


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=20))
def test_encoders_agree_on_any_code_point_including_surrogates(native, text):
    for serialize_type in ("JSON", "ROCKETMQ"):
        a = native.RemotingCommand(0, remark=text, ext_fields={text: text}, serialize_type=serialize_type)
        b = twin.RemotingCommand(0, remark=text, ext_fields={text: text}, serialize_type=serialize_type)
        assert a.encode() == b.encode()
        assert_parity(native, a.encode())


# ---------------------------------------------------------------------------------------------------------------
# JSON headers as clients could write them, against an oracle of the decoding rules

json_scalars = (
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=12)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=6
)
KNOWN = {"code", "flag", "opaque", "version", "language", "remark", "extFields"}
int_values = (
    INT32 | INT32.map(str) | INT32.map(lambda v: f"+{v}" if v >= 0 else str(v)) | st.none()
    | st.integers(2**31, 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.booleans()
    | st.text(max_size=4) | st.lists(st.integers(), max_size=2)
)
language_values = (
    st.sampled_from([m.name for m in LanguageCode]) | st.integers(-3, 20) | st.none() | st.text(max_size=6)
    | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.lists(st.integers(), max_size=1)
)
ext_values = st.none() | st.dictionaries(st.text(max_size=10), json_values, max_size=6) | json_values
members = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["code", "flag", "opaque", "version"]), int_values),
        st.tuples(st.just("language"), language_values),
        st.tuples(st.just("remark"), json_values),
        st.tuples(st.just("extFields"), ext_values),
        st.tuples(st.just("serializeTypeCurrentRPC"), st.sampled_from(["JSON", "ROCKETMQ", 1])),
        st.tuples(st.text(max_size=8).filter(lambda k: k not in KNOWN), json_values),
    ),
    max_size=10,
)
INT_STRING = re.compile(r"[+-]?[0-9]+")


def oracle(pairs, dumps):
    """The command the rules of the task give for these header members, or None when it must be a FrameError."""
    result = {"code": 0, "flag": 0, "opaque": 0, "version": 0, "language": LanguageCode.JAVA, "remark": None,
              "ext_fields": None}
    for key, value in pairs:
        if key in ("code", "flag", "opaque", "version"):
            if value is None:
                number = 0
            elif type(value) is int:
                number = value
            elif isinstance(value, str) and INT_STRING.fullmatch(value):
                number = int(value)
            else:
                return None
            if not -(2**31) <= number < 2**31:
                return None
            result[key] = number
        elif key == "language":
            if isinstance(value, str):
                result[key] = LANGUAGE_BY_NAME.get(value)
            elif value is None:
                result[key] = None
            elif type(value) is int:
                result[key] = next((m for m in LanguageCode if m.value == value), None)
            else:
                return None
        elif key == "remark":
            result[key] = value if value is None or isinstance(value, str) else dumps(value)
        elif key == "extFields":
            if value is None:
                result["ext_fields"] = None
            elif isinstance(value, dict):
                result["ext_fields"] = {
                    k: v if v is None or isinstance(v, str) else dumps(v) for k, v in value.items()
                }
            else:
                return None
    return result


@FUZZ
@given(pairs=members, ensure_ascii=st.booleans(), spaced=st.booleans(), pad=st.sampled_from(["", "\n", " \r\n\t"]))
def test_generated_json_headers(native, pairs, ensure_ascii, spaced, pad):
    separators = (", ", ": ") if spaced else (",", ":")

    def dumps(value):
        return json.dumps(value, ensure_ascii=ensure_ascii, separators=separators)

    text = pad + "{" + separators[0].join(dumps(k) + separators[1] + dumps(v) for k, v in pairs) + "}" + pad
    data = frame(text.encode("utf-8"), b"body")
    result = assert_parity(native, data)
    expected = oracle(pairs, dumps)
    if expected is None:
        assert result[0] == "FrameError", (text, result)
        return
    assert result[0] == "ok", (text, result)
    got = result[1]
    expected["language"] = expected["language"].name if expected["language"] is not None else None
    assert {k: got[k] for k in expected} == expected, text
    assert got["body"] == b"body" and got["serialize_type"] == "JSON"


# ---------------------------------------------------------------------------------------------------------------
# Mutations of real frames


def _seed_frames():
    frames = [data for _, _, data in load_vectors()]
    seeds = frames[:40] + [f for f in frames if f[8 + (struct.unpack(">I", f[4:8])[0] & 0xFFFFFF) - 1] == 10][:20]
    # ROCKETMQ frames: the vectors re-encoded in the binary header format, plus a response with a remark.
    for data in frames[:30]:
        cmd = twin.decode_frame(data)
        cmd.serialize_type = "ROCKETMQ"
        seeds.append(cmd.encode())
    seeds.append(twin.RemotingCommand(1, remark="é error", ext_fields={"a": "", "b": "x"},
                                      serialize_type="ROCKETMQ").encode())
    return seeds


SEEDS = _seed_frames()
INTERESTING = b'"\\{}[]:,0123456789eE.+-tfnu \n\r\t\x00\x1f\x7f\x80\xbf\xc0\xc3\xe2\xed\xf0\xf4\xff'


@st.composite
def mutated_frames(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    header_length = struct.unpack(">I", data[4:8])[0] & 0xFFFFFF
    serialize_type = data[4]
    rnd = random.Random(draw(st.integers(0, 2**32)))  # uniform positions: integers() would favour byte 8
    for _ in range(draw(st.integers(1, 4))):
        if len(data) <= 8:
            break
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "swap"]))
        i = rnd.randrange(8, len(data))  # damage the header and body; prefixes are handled below
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[i] = draw(st.sampled_from(INTERESTING))
        elif op == "insert":
            piece = draw(st.binary(min_size=1, max_size=4) | st.sampled_from([b'"', b"\\u", b"\\ud800", b"{", b"]"]))
            data[i:i] = piece
            if i < 8 + header_length:
                header_length += len(piece)
        elif op == "delete":
            n = min(draw(st.integers(1, 4)), len(data) - i)
            del data[i : i + n]
            if i < 8 + header_length:
                header_length -= min(n, 8 + header_length - i)
        elif op == "truncate":
            del data[i:]
            header_length = min(header_length, i - 8)
        else:
            j = rnd.randrange(8, len(data))
            data[i], data[j] = data[j], data[i]
    fix = draw(st.sampled_from(["both", "both", "both", "prefix", "none", "forge"]))
    if fix in ("both", "prefix"):
        data[0:4] = struct.pack(">i", len(data) - 4)
    if fix == "both":
        data[4:8] = struct.pack(">I", (serialize_type << 24) | header_length)
    if fix == "forge":
        data[0:4] = struct.pack(">i", draw(st.sampled_from([-1, 0, 3, 4, len(data) - 5, len(data) - 3, 2**31 - 1])))
        data[4:8] = struct.pack(">I", draw(st.integers(0, 2**32 - 1)))
    return bytes(data)


@FUZZ
@given(data=mutated_frames())
def test_mutated_frames_parity(native, data):
    assert_parity(native, data)


@FUZZ
@given(frames=st.lists(mutated_frames(), min_size=1, max_size=4), cuts=st.lists(st.integers(1, 300), max_size=20))
def test_decoder_parity_on_mutated_streams(native, frames, cuts):
    stream = b"".join(frames)
    chunks, pos = [], 0
    for size in cuts:
        chunks.append(stream[pos : pos + size])
        pos += size
    chunks.append(stream[pos:])

    def run(mod):
        decoder = mod.FrameDecoder(max_frame_size=4096)
        out = []
        try:
            for chunk in chunks:
                out += [c.to_dict() for c in decoder.feed(chunk)]
                buffered = decoder.buffered
        except FrameError as exc:
            return out + [c.to_dict() for c in exc.commands], str(exc), decoder.buffered
        return out, None, buffered

    result = run(twin)
    assert run(native) == result
    # The stream decoder agrees with decode_frame on each frame up to the first error.
    expected = []
    for data in frames:
        kind, value = outcome(twin, data)
        if kind != "ok":
            break
        expected.append(value)
    if all(outcome(twin, data)[0] == "ok" and len(data) <= 4096 for data in frames):
        assert result == (expected, None, 0)


# ---------------------------------------------------------------------------------------------------------------
# Structure-aware header fuzzing

JSON_TOKENS = [
    b"{", b"}", b"[", b"]", b":", b",", b" ", b"\n", b'"code"', b'"extFields"', b'"language"', b'"remark"',
    b'"flag"', b'"x"', b"1", b"-1", b"0", b"01", b"1.5", b"-", b"1e5", b"2147483648", b"true", b"null", b"fals",
    b'"JAVA"', b'"12"', b'"\\ud800"', b'"\\ud83d\\ude00"', b'"\\u00e9"', b'"a\\"b"', b'"\\q"', '"é"'.encode(),
    b'"\xff"', b'"\xe4\xb8"', b'"', b"\\", b"\x00",
]


@FUZZ
@given(tokens=st.lists(st.sampled_from(JSON_TOKENS), max_size=30), body=st.binary(max_size=4))
def test_json_token_soup_parity(native, tokens, body):
    assert_parity(native, frame(b"".join(tokens), body))


@FUZZ
@given(header=st.binary(max_size=60), serialize_type=st.integers(0, 3), body=st.binary(max_size=4))
def test_random_header_bytes_parity(native, header, serialize_type, body):
    assert_parity(native, frame(header, body, serialize_type))


@st.composite
def rocketmq_headers(draw):
    small = st.integers(-3, 3)
    remark = draw(st.binary(max_size=6) | st.text(max_size=4).map(str.encode))
    ext = b""
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.binary(max_size=4) | st.sampled_from([b"", b"topic", b"\xc3\xa9"]))
        value = draw(st.binary(max_size=4) | st.sampled_from([b"", b"v", b"\xed\xa0\x80"]))
        key_len = len(key) + (draw(small) if draw(st.booleans()) else 0)
        value_len = len(value) + (draw(small) if draw(st.booleans()) else 0)
        ext += struct.pack(">h", key_len) + key + struct.pack(">i", value_len) + value
    remark_len = len(remark) + (draw(small) if draw(st.booleans()) else 0)
    ext_len = len(ext) + (draw(small) if draw(st.booleans()) else 0)
    fixed = struct.pack(">hBhii", draw(st.integers(-(2**15), 2**15 - 1)), draw(st.integers(0, 255)),
                        draw(st.integers(-(2**15), 2**15 - 1)), draw(INT32), draw(INT32))
    header = fixed + struct.pack(">i", remark_len) + remark + struct.pack(">i", ext_len) + ext
    return header + draw(st.binary(max_size=2))


@FUZZ
@given(header=rocketmq_headers(), body=st.binary(max_size=4))
def test_rocketmq_header_parity(native, header, body):
    assert_parity(native, frame(header, body, 1))


def test_ext_limit_parity(native):
    for count in (MAX_EXT_FIELDS, MAX_EXT_FIELDS + 1):
        ext = ",".join(f'"k{i}":{i}' for i in range(count))
        assert_parity(native, frame(("{\"extFields\":{" + ext + "}}").encode()))

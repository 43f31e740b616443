"""Property tests (hypothesis): encode/decode round trips, every dialect of a generated heartbeat, and parity of
the native decoder with its twin on generated, mutated and random input (same result or both HeartbeatError)."""
import importlib
import json
import os
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine import ConsumeFromWhere, ConsumeType, HeartbeatError, MessageModel
from engine.codec import _heartbeat_py as twin
from engine.codec.heartbeat import encode_heartbeat

from conftest import load_vectors, strict
from test_heartbeat import CPP_BODY, DIALECTS, SPEC_SAMPLES, expected_dict, heartbeat_bodies


def _native():
    try:
        return importlib.import_module("engine.codec._heartbeat")
    except ImportError:
        if strict():
            raise
        return None


native = _native()
needs_native = pytest.mark.skipif(native is None, reason="native extension not built")
MODULES = [m for m in (native, twin) if m is not None]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# names: plain ASCII most of the time, any text (controls, quotes, non-BMP, U+2028...) otherwise; no surrogates
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
TEXT = st.one_of(st.text("abcXYZ019_%-|* .@#", max_size=12), ANY_TEXT)
OPT_TEXT = st.one_of(st.none(), TEXT)

subscriptions = st.builds(
    twin.SubscriptionData,
    topic=OPT_TEXT,
    sub_string=OPT_TEXT,
    tags=st.lists(TEXT, max_size=3),
    codes=st.lists(INT32, max_size=3),
    sub_version=INT64,
    expression_type=st.one_of(st.sampled_from(["TAG", "SQL92"]), TEXT),
    class_filter_mode=st.booleans(),
)
consumers = st.builds(
    twin.ConsumerData,
    group=OPT_TEXT,
    consume_type=st.one_of(st.none(), st.sampled_from(ConsumeType)),
    message_model=st.one_of(st.none(), st.sampled_from(MessageModel)),
    consume_from_where=st.one_of(st.none(), st.sampled_from(ConsumeFromWhere)),
    unit_mode=st.booleans(),
    subscriptions=st.lists(subscriptions, max_size=3),
)
heartbeats = st.builds(
    twin.HeartbeatData,
    client_id=OPT_TEXT,
    producers=st.lists(st.builds(twin.ProducerData, OPT_TEXT), max_size=3),
    consumers=st.lists(consumers, max_size=3),
    fingerprint=INT32,
    without_sub=st.booleans(),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)


# ---------------------------------------------------------------------------------------------------------------
# A JSON writer for dialects: objects are lists of (key, value) pairs, so order and duplicates are the test's choice


class Raw(str):
    """Already-rendered JSON text."""


def dump(value, draw, ws) -> str:
    if isinstance(value, Raw):
        return value
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return "{" + ws + ("," + ws).join(dump(k, draw, ws) + ws + ":" + ws + dump(v, draw, ws) for k, v in value) + ws + "}"
    if isinstance(value, list):
        return "[" + ws + ("," + ws).join(dump(v, draw, ws) for v in value) + ws + "]"
    if value == {}:
        return "{}"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=draw(st.booleans()))
    return json.dumps(value)


def render(draw, hb) -> bytes:
    """hb in a random client dialect: any key order, defaults omitted or null, enums by name or ordinal, numbers
    as strings, unknown keys with any JSON, escapes or raw UTF-8, whitespace, duplicate keys (last wins)."""

    def maybe_default(pairs, key, value, is_default):
        """A field equal to Java's default may be omitted or sent as null."""
        if is_default:
            how = draw(st.sampled_from(["omit", "null", "value"]))
            if how == "omit":
                return
            if how == "null":
                pairs.append((key, None))
                return
        pairs.append((key, value))

    def enum(member, cls):
        if member is None:
            return draw(st.sampled_from([None, "NO_SUCH_" + cls.__name__.upper(), len(cls) + 3, -1]))
        return draw(st.sampled_from([member.name, int(member)]))

    def number(n):
        if draw(st.booleans()):
            return n
        zeros = "0" * draw(st.integers(0, 3))
        return ("-" + zeros + str(-n)) if n < 0 else zeros + str(n)

    def junk(pairs):
        for _ in range(draw(st.integers(0, 2))):
            key = draw(st.sampled_from(["filterClassSource", "unknown", "x", ""]) | ANY_TEXT.filter(
                lambda k: k not in KNOWN_KEYS))
            pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(JSON_VALUES)))

    def shuffled(pairs):
        junk(pairs)
        return draw(st.permutations(pairs)) if pairs else {}

    def sub(s):
        pairs = []
        maybe_default(pairs, "topic", s.topic, s.topic is None)
        maybe_default(pairs, "subString", s.sub_string, s.sub_string is None)
        maybe_default(pairs, "tagsSet", list(s.tags), not s.tags)
        maybe_default(pairs, "codeSet", [number(c) for c in s.codes], not s.codes)
        pairs.append(("subVersion", number(s.sub_version)))
        maybe_default(pairs, "expressionType", s.expression_type, s.expression_type == "TAG")
        maybe_default(pairs, "classFilterMode", s.class_filter_mode, not s.class_filter_mode)
        return shuffled(pairs)

    def consumer(c):
        pairs = []
        maybe_default(pairs, "groupName", c.group, c.group is None)
        for key, member, cls in (("consumeType", c.consume_type, ConsumeType),
                                 ("messageModel", c.message_model, MessageModel),
                                 ("consumeFromWhere", c.consume_from_where, ConsumeFromWhere)):
            value = enum(member, cls)
            maybe_default(pairs, key, value, value is None)
        maybe_default(pairs, "unitMode", c.unit_mode, not c.unit_mode)
        maybe_default(pairs, "subscriptionDataSet", [sub(s) for s in c.subscriptions], not c.subscriptions)
        return shuffled(pairs)

    pairs = []
    maybe_default(pairs, "clientID", hb.client_id, hb.client_id is None)
    maybe_default(pairs, "producerDataSet",
                  [shuffled([] if p.group is None and draw(st.booleans()) else [("groupName", p.group)])
                   for p in hb.producers], not hb.producers)
    maybe_default(pairs, "consumerDataSet", [consumer(c) for c in hb.consumers], not hb.consumers)
    maybe_default(pairs, "heartbeatFingerprint", hb.fingerprint, hb.fingerprint == 0)
    maybe_default(pairs, draw(st.sampled_from(["withoutSub", "isWithoutSub"])), hb.without_sub, not hb.without_sub)
    junk(pairs)
    top = draw(st.permutations(pairs)) if pairs else {}
    real = [i for i, (k, _) in enumerate(top) if k == "clientID"] if pairs else []
    if real and draw(st.booleans()):  # an earlier duplicate key, overridden by the last occurrence
        top.insert(draw(st.integers(0, real[0])), ("clientID", draw(OPT_TEXT)))
    ws = draw(st.sampled_from(["", " ", "\n", " \t\r\n"]))
    text = draw(st.sampled_from(["", " ", "\n"])) + dump(top, draw, ws) + draw(st.sampled_from(["", "\n", " \r\n"]))
    return text.encode("utf-8")


@st.composite
def dialect_bodies(draw):
    hb = draw(heartbeats)
    return hb, render(draw, hb)


# ---------------------------------------------------------------------------------------------------------------
# Outcomes with Java's "now" for missing subVersions


def now_ms():
    return time.time_ns() // 1_000_000


def outcome(module, body):
    """('ok', to_dict with 'now' subVersions masked) or ('error', exception class, message): both builds give the
    same message (the `error` column of decode_heartbeats and the scan's bad-body reasons depend on it)."""
    t0 = now_ms()
    try:
        hb = module.decode_heartbeat(body)
    except HeartbeatError as e:
        return ("error", HeartbeatError, str(e))
    return ("ok", masked(hb.to_dict(), t0, now_ms()))


def assert_parity(body):
    results = [outcome(m, body) for m in MODULES]
    assert all(r == results[0] for r in results), (body[:200], results)
    return results[0]


# ---------------------------------------------------------------------------------------------------------------
# Round trips and dialects


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
@SETTINGS
@given(hb=heartbeats)
def test_encode_decode_round_trip(module, hb):
    body = encode_heartbeat(hb)
    decoded = module.decode_heartbeat(body)
    assert decoded == hb
    assert encode_heartbeat(decoded) == body
    assert decoded.to_dict() == expected_dict(json.loads(body))


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
@SETTINGS
@given(case=dialect_bodies())
def test_every_dialect_decodes_to_the_same_heartbeat(module, case):
    hb, body = case
    assert module.decode_heartbeat(body) == hb, body


# ---------------------------------------------------------------------------------------------------------------
# Native vs twin


def _seeds():
    bodies = [b for _, _, b in heartbeat_bodies(load_vectors())]
    return bodies + list(SPEC_SAMPLES.values()) + list(DIALECTS.values())


SEEDS = _seeds()
INTERESTING = b'"\\{}[],:-0123456789.eE+ntfu\x00\x1f\x7f\x80\xbf\xc0\xc3\xe0\xed\xf0\xf4\xff'


@st.composite
def mutated(draw):
    """A real or generated body with a few byte-level mutations."""
    if draw(st.booleans()):
        body = bytearray(draw(st.sampled_from(SEEDS)))
    else:
        body = bytearray(render(draw, draw(heartbeats)))
    for _ in range(draw(st.integers(1, 4))):
        if not body:
            break
        i = draw(st.integers(0, len(body) - 1))
        op = draw(st.sampled_from(["replace", "insert", "delete", "truncate", "duplicate", "escape"]))
        byte = draw(st.sampled_from(INTERESTING) | st.integers(0, 255))
        if op == "replace":
            body[i] = byte
        elif op == "insert":
            body.insert(i, byte)
        elif op == "delete":
            del body[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del body[i:]
        elif op == "duplicate":
            body[i:i] = body[i : i + draw(st.integers(1, 16))]
        else:
            body[i:i] = draw(st.sampled_from([b"\\u", b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b"\\", b"\\n"]))
    return bytes(body)


@needs_native
@SETTINGS
@given(body=mutated())
def test_parity_on_mutated_bodies(body):
    assert_parity(body)


@needs_native
@SETTINGS
@given(case=dialect_bodies())
def test_parity_on_generated_dialects(case):
    assert assert_parity(case[1])[0] == "ok"


KNOWN_KEYS = ["clientID", "producerDataSet", "consumerDataSet", "heartbeatFingerprint", "withoutSub", "isWithoutSub",
              "groupName", "consumeType", "messageModel", "consumeFromWhere", "unitMode", "subscriptionDataSet",
              "topic", "subString", "tagsSet", "codeSet", "subVersion", "expressionType", "classFilterMode"]
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
           | st.sampled_from(["", "1", "-7", "CONSUME_POP", "CLUSTERING", "007", "9" * 25]) | ANY_TEXT)
SHAPED = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KNOWN_KEYS) | ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


@needs_native
@SETTINGS
@given(doc=SHAPED, ensure_ascii=st.booleans())
def test_parity_on_json_shaped_like_heartbeats(doc, ensure_ascii):
    body = json.dumps(doc, ensure_ascii=ensure_ascii, allow_nan=True).encode("utf-8", "surrogatepass")
    assert_parity(body)


@needs_native
@SETTINGS
@given(body=st.binary(max_size=64) | st.text(max_size=32).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_parity_on_random_input(body):
    assert_parity(body)


def masked(d, t0, t1):
    """to_dict() with subVersions read from the clock during [t0, t1] (missing subVersion) replaced by 'now'."""
    for c in d["consumers"]:
        for s in c["subscriptions"]:
            if t0 <= s["sub_version"] <= t1:
                s["sub_version"] = "now"
    return d


@needs_native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(mutated() | st.sampled_from(SEEDS), max_size=12))
def test_batch_parity_and_rows(bodies):
    t0 = now_ms()
    a, b = native.decode_heartbeats(bodies), twin.decode_heartbeats(bodies)
    t1 = now_ms()
    assert len(a) == len(b) == len(bodies)
    for table in ("heartbeats", "producers", "consumers", "subscriptions"):
        ca, cb = getattr(a, table), getattr(b, table)
        assert list(ca) == list(cb)
        for name in ca:
            assert ca[name].dtype == cb[name].dtype, (table, name)
            if name == "sub_version":
                assert [v if not t0 <= v <= t1 else "now" for v in ca[name].tolist()] == [
                    v if not t0 <= v <= t1 else "now" for v in cb[name].tolist()]
            else:
                assert ca[name].tolist() == cb[name].tolist(), (table, name)
    for i, body in enumerate(bodies):
        expected = outcome(native, body)
        assert a.heartbeats["ok"][i] == (expected[0] == "ok")
        if expected[0] == "ok":
            assert masked(a.heartbeat(i).to_dict(), t0, t1) == expected[1]


@needs_native
def test_parity_on_cpp_trailing_newline_variants():
    for tail in (b"", b"\n", b"\r\n", b" \t", b"\n\n\n"):
        assert assert_parity(CPP_BODY.rstrip(b"\n") + tail)[0] == "ok"
    for tail in (b"\x00", b"\n}", b"\x0b", b"\x0c", b"\xc2\xa0"):
        assert assert_parity(CPP_BODY.rstrip(b"\n") + tail)[:2] == ("error", HeartbeatError)

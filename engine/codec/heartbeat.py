"""HeartbeatData helpers shared by the native decoder and its twin (pure Python, not a hot path).

- ``encode_heartbeat(hb)``: Java/fastjson-style JSON (PROTOCOL.md 4.3, 4.7).
- ``java_string_hash(s)``: Java ``String.hashCode()`` (Appendix B), used for tag codes and the V2 fingerprint.
- ``heartbeat_fingerprint(hb)``: the client-side V2 fingerprint (5.2).
- ``build_subscription(...)``: the subscription a Java client builds for an expression (FilterAPI).
- ``HeartbeatBatch``: the column layout returned by ``decode_heartbeats`` in both implementations.

The model objects are duck-typed here (attribute access only), so native and twin instances both work.
"""
import re

import numpy as np

from engine.codec.errors import HeartbeatError

__all__ = [
    "HeartbeatBatch",
    "build_subscription",
    "encode_heartbeat",
    "heartbeat_fingerprint",
    "java_string_hash",
]

# --------------------------------------------------------------------------------------------------------------
# Java String.hashCode


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: 31-polynomial over UTF-16 code units, wrapped to a signed int32.

    A non-BMP character counts as its two surrogate units; lone surrogates are hashed as the unit they are.
    ``java_string_hash("TagA") == 2598919``.
    """
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        units = s.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


# --------------------------------------------------------------------------------------------------------------
# fastjson-style encoding

# fastjson default mode (SerializeWriter#writeStringWithDoubleQuote): short escapes for \b \t \n \f \r " \,
# \u00XX for other C0 controls, and \uXXXX (uppercase hex) for U+007F..U+009F, U+2028, U+2029; the rest raw UTF-8.
_ESCAPES = {c: "\\u%04X" % c for c in list(range(0x20)) + list(range(0x7F, 0xA0)) + [0x2028, 0x2029]}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"})
_NEEDS_ESCAPE = re.compile("[\x00-\x1f\"\\\\\x7f-\x9f\u2028\u2029]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _quote(s: str, path: str) -> str:
    if not isinstance(s, str):
        raise HeartbeatError(f"{path}: cannot encode {type(s).__name__} as a JSON string")
    if _SURROGATE.search(s):
        # Java would write '?' for it; refusing keeps decode(encode(hb)) == hb.
        raise HeartbeatError(f"{path}: lone surrogate cannot be encoded as UTF-8")
    if _NEEDS_ESCAPE.search(s):
        s = s.translate(_ESCAPES)
    return '"' + s + '"'


def _bool(b) -> str:
    return "true" if b else "false"


def _enum_name(e):
    return None if e is None else e.name


def _dump_subscription(s, path: str, normalize: bool) -> str:
    # sorted: classFilterMode, codeSet, expressionType, subString, subVersion, tagsSet, topic (nulls omitted)
    out = ['{"classFilterMode":', _bool(s.class_filter_mode), ',"codeSet":[', ",".join(str(int(c)) for c in s.codes), "]"]
    if s.expression_type is not None:
        out += [',"expressionType":', _quote(s.expression_type, path + ".expressionType")]
    if s.sub_string is not None:
        out += [',"subString":', _quote(s.sub_string, path + ".subString")]
    out += [',"subVersion":', "0" if normalize else str(int(s.sub_version)), ',"tagsSet":[']
    out.append(",".join(_quote(t, f"{path}.tagsSet[{i}]") for i, t in enumerate(s.tags)))
    out.append("]")
    if s.topic is not None:
        out += [',"topic":', _quote(s.topic, path + ".topic")]
    out.append("}")
    return "".join(out)


def _dump_consumer(c, path: str, normalize: bool) -> str:
    # sorted: consumeFromWhere, consumeType, groupName, messageModel, subscriptionDataSet, unitMode
    out = []
    for key, value in (
        ("consumeFromWhere", _enum_name(c.consume_from_where)),
        ("consumeType", _enum_name(c.consume_type)),
        ("groupName", c.group),
        ("messageModel", _enum_name(c.message_model)),
    ):
        if value is not None:
            out.append(f'"{key}":' + _quote(value, f"{path}.{key}"))
    subs = ",".join(
        _dump_subscription(s, f"{path}.subscriptionDataSet[{i}]", normalize) for i, s in enumerate(c.subscriptions)
    )
    out.append('"subscriptionDataSet":[' + subs + "]")
    out.append('"unitMode":' + _bool(c.unit_mode))
    return "{" + ",".join(out) + "}"


def _dump_heartbeat(hb, normalize: bool) -> str:
    # sorted: clientID, consumerDataSet, heartbeatFingerprint, producerDataSet, withoutSub
    out = []
    client_id = "" if normalize else hb.client_id
    if client_id is not None:
        out.append('"clientID":' + _quote(client_id, "$.clientID"))
    consumers = ",".join(_dump_consumer(c, f"$.consumerDataSet[{i}]", normalize) for i, c in enumerate(hb.consumers))
    out.append('"consumerDataSet":[' + consumers + "]")
    out.append('"heartbeatFingerprint":' + ("0" if normalize else str(int(hb.fingerprint))))
    producers = ",".join(
        "{" + ("" if p.group is None else '"groupName":' + _quote(p.group, f"$.producerDataSet[{i}].groupName")) + "}"
        for i, p in enumerate(hb.producers)
    )
    out.append('"producerDataSet":[' + producers + "]")
    out.append('"withoutSub":' + ("false" if normalize else _bool(hb.without_sub)))
    return "{" + ",".join(out) + "}"


def encode_heartbeat(hb) -> bytes:
    """HeartbeatData as a Java 5.x client writes it with fastjson: keys sorted at every level, null properties
    omitted, enums by name, no whitespace, fastjson default-mode string escaping, set elements in the order held.

    Raises HeartbeatError for strings that cannot be written as UTF-8 (lone surrogates).
    """
    return _dump_heartbeat(hb, False).encode("utf-8")


def heartbeat_fingerprint(hb) -> int:
    """The V2 heartbeat fingerprint a Java 5.1.3+ client computes (PROTOCOL.md 5.2).

    The full heartbeat is written with clientID "", every subVersion 0, withoutSub false and fingerprint 0, and
    the fingerprint is the Java hash of that JSON text. Set elements are taken in the order the heartbeat holds
    them (Java takes HashSet order, so the value is only stable within one client process).
    """
    return java_string_hash(_dump_heartbeat(hb, True))


# --------------------------------------------------------------------------------------------------------------
# FilterAPI

_JAVA_TRIM = "".join(chr(c) for c in range(0x21))  # String.trim() strips every char <= U+0020


def build_subscription(topic, expression, sub_version, expression_type="TAG"):
    """The SubscriptionData a Java client builds for ``subscribe(topic, expression)`` (FilterAPI.build).

    TAG (or blank) type: an empty or ``"*"`` expression gives sub_string "*" and no tags; otherwise the expression
    is split on ``||``, each tag trimmed the Java way, empty tags dropped, and duplicates dropped (Java sets), with
    each tag's Java hash in ``codes``. Any other type (SQL92) keeps the expression as is, without tags; an empty
    expression is then a ValueError, as in Java.
    """
    from engine import SubscriptionData  # the facade's implementation (native when built)

    if expression_type is None or not expression_type.strip(_JAVA_TRIM):
        expression_type = "TAG"
    if expression_type != "TAG":
        if not expression:
            raise ValueError(f"expression can't be empty for type {expression_type}")
        return SubscriptionData(topic, expression, (), (), sub_version, expression_type, False)
    if not expression or expression == "*":
        return SubscriptionData(topic, "*", (), (), sub_version, expression_type, False)
    tags, codes = {}, {}
    for raw in expression.split("||"):
        tag = raw.strip(_JAVA_TRIM)
        if tag:
            tags.setdefault(tag, None)
            codes.setdefault(java_string_hash(tag), None)
    return SubscriptionData(topic, expression, tuple(tags), tuple(codes), sub_version, expression_type, False)


# --------------------------------------------------------------------------------------------------------------
# Batch layout

#: Column names and dtypes of each HeartbeatBatch table, in order. Object columns hold str/None (tags and codes:
#: tuples); enum columns hold the Java ordinal, -1 for unknown/missing.
HEARTBEAT_COLUMNS = (
    ("ok", np.bool_),
    ("error", object),
    ("client_id", object),
    ("fingerprint", np.int32),
    ("without_sub", np.bool_),
    ("n_producers", np.int32),
    ("n_consumers", np.int32),
)
PRODUCER_COLUMNS = (("row", np.int32), ("group", object))
CONSUMER_COLUMNS = (
    ("row", np.int32),
    ("group", object),
    ("consume_type", np.int8),
    ("message_model", np.int8),
    ("consume_from_where", np.int8),
    ("unit_mode", np.bool_),
    ("n_subscriptions", np.int32),
)
SUBSCRIPTION_COLUMNS = (
    ("consumer", np.int32),
    ("row", np.int32),
    ("topic", object),
    ("sub_string", object),
    ("expression_type", object),
    ("tags", object),
    ("codes", object),
    ("sub_version", np.int64),
    ("class_filter_mode", np.bool_),
)


def object_column(values) -> np.ndarray:
    """A 1-D object array holding ``values`` as they are (numpy would turn a list of tuples into a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


class HeartbeatBatch:
    """Heartbeats decoded into columns by ``decode_heartbeats(bodies)`` (identical in native and twin).

    Four tables, each a ``dict[str, numpy.ndarray]`` of equal-length columns:

    ``heartbeats``: one row per body, in input order: ``ok`` (bool), ``error`` (object: the HeartbeatError /
    TypeError message of a bad row, else None), ``client_id`` (object), ``fingerprint`` (int32), ``without_sub``
    (bool), ``n_producers``, ``n_consumers`` (int32). A bad row has ok=False, client_id None, zeros, and no rows
    in the other tables.

    ``producers``: ``row`` (int32 index into heartbeats), ``group`` (object).

    ``consumers``: ``row`` (int32), ``group`` (object), ``consume_type``, ``message_model``,
    ``consume_from_where`` (int8 Java ordinal, -1 when missing or unknown), ``unit_mode`` (bool),
    ``n_subscriptions`` (int32).

    ``subscriptions``: ``consumer`` (int32 index into consumers), ``row`` (int32), ``topic``, ``sub_string``,
    ``expression_type`` (object), ``tags`` (object: tuple of str), ``codes`` (object: tuple of int),
    ``sub_version`` (int64), ``class_filter_mode`` (bool).

    Child rows appear in body order and, within a body, in the order the client sent them, so the rows of one
    heartbeat (and the subscriptions of one consumer) are contiguous. ``len(batch)`` is the number of bodies.
    """

    __slots__ = ("heartbeats", "producers", "consumers", "subscriptions")

    def __init__(self, heartbeats, producers, consumers, subscriptions):
        self.heartbeats = heartbeats
        self.producers = producers
        self.consumers = consumers
        self.subscriptions = subscriptions

    def __len__(self) -> int:
        return len(self.heartbeats["ok"])

    def __repr__(self) -> str:
        return (
            f"HeartbeatBatch({len(self)} heartbeats, {int(self.heartbeats['ok'].sum())} ok, "
            f"{len(self.producers['row'])} producers, {len(self.consumers['row'])} consumers, "
            f"{len(self.subscriptions['row'])} subscriptions)"
        )

    def heartbeat(self, i: int):
        """Row ``i`` rebuilt as a HeartbeatData of the facade's implementation, or None for a bad row."""
        from engine import ConsumeFromWhere, ConsumerData, ConsumeType, HeartbeatData, MessageModel, ProducerData
        from engine import SubscriptionData

        h = self.heartbeats
        if not h["ok"][i]:
            return None
        p, c, s = self.producers, self.consumers, self.subscriptions
        p_lo, p_hi = np.searchsorted(p["row"], [i, i + 1])
        c_lo, c_hi = np.searchsorted(c["row"], [i, i + 1])
        s_lo = int(np.searchsorted(s["row"], i))

        def enum(cls, v):
            return None if v < 0 else cls(int(v))

        consumers = []
        for k in range(c_lo, c_hi):
            n = int(c["n_subscriptions"][k])
            subs = tuple(
                SubscriptionData(
                    s["topic"][j], s["sub_string"][j], s["tags"][j], s["codes"][j], int(s["sub_version"][j]),
                    s["expression_type"][j], bool(s["class_filter_mode"][j]),
                )
                for j in range(s_lo, s_lo + n)
            )
            s_lo += n
            consumers.append(
                ConsumerData(
                    c["group"][k], enum(ConsumeType, c["consume_type"][k]), enum(MessageModel, c["message_model"][k]),
                    enum(ConsumeFromWhere, c["consume_from_where"][k]), bool(c["unit_mode"][k]), subs,
                )
            )
        return HeartbeatData(
            h["client_id"][i],
            tuple(ProducerData(p["group"][k]) for k in range(p_lo, p_hi)),
            tuple(consumers),
            int(h["fingerprint"][i]),
            bool(h["without_sub"][i]),
        )

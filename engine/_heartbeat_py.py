"""Pure-Python twin of ``engine._heartbeat``: the HeartbeatData model and its JSON decoder.

Same names, inputs, outputs and error classes as the Cython module (parity tests hold them together); this one
is the readable reference. It parses with ``json.loads`` and then checks the tree against the rules of
PROTOCOL.md 4.5:

* any key order, unknown keys ignored, the last of duplicate keys wins (every occurrence is still checked);
* missing or null keys take Java's defaults (sets empty, expressionType "TAG", booleans false, fingerprint 0,
  clientID and names None, a missing subVersion the current time in ms, as Java's constructor does);
* ``isWithoutSub`` is an alias of ``withoutSub``; enums by name or ordinal (unknown -> None);
* codeSet elements and subVersion as JSON integers or numeric strings (int32 / int64 range);
* anything else, including invalid UTF-8, lone surrogate escapes and nesting deeper than MAX_DEPTH,
  raises HeartbeatError naming the JSON path or byte offset.
"""
import json
import operator
import re
import time

import numpy as np

from .enums import ConsumeFromWhere, ConsumeType, MessageModel
from .errors import HeartbeatError, echo
from .heartbeat import (
    CONSUMER_COLUMNS,
    HEARTBEAT_COLUMNS,
    PRODUCER_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    HeartbeatBatch,
    object_column,
)

__all__ = [
    "ConsumerData",
    "HeartbeatData",
    "ProducerData",
    "SubscriptionData",
    "decode_heartbeat",
    "decode_heartbeats",
]

#: Deepest nesting of arrays/objects accepted anywhere in a body (the top-level object is depth 1).
MAX_DEPTH = 64

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_CONSUME_TYPES = tuple(ConsumeType)  # by ordinal (values are 0..n-1)
_MESSAGE_MODELS = tuple(MessageModel)
_CONSUME_FROM_WHERES = tuple(ConsumeFromWhere)
_ENUM_TABLES = {
    cls: (members, {m.name: m for m in members})
    for cls, members in ((ConsumeType, _CONSUME_TYPES), (MessageModel, _MESSAGE_MODELS),
                         (ConsumeFromWhere, _CONSUME_FROM_WHERES))
}


# --------------------------------------------------------------------------------------------------------------
# Model. Immutable (__slots__, no assignment), compared and hashed by fields, equal to the native classes.


def _check_str(value, name):
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be str or None, not {type(value).__name__}")
    return value


def _check_int(value, name, lo, hi):
    value = operator.index(value)
    if not lo <= value <= hi:
        raise OverflowError(f"{name} {value} out of range [{lo}, {hi}]")
    return value


def _coerce_enum(cls, value, name):
    """None, a member, an ordinal or a name -> member or None (constructors only; the decoder maps unknown to None)."""
    if value is None or type(value) is cls:
        return value
    members, by_name = _ENUM_TABLES[cls]
    if isinstance(value, str):
        if value in by_name:
            return by_name[value]
    elif isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(members):
            return members[value]
    else:
        raise TypeError(f"{name} must be a {cls.__name__}, its name or ordinal, or None, not {type(value).__name__}")
    raise ValueError(f"{name}: {value!r} is not a {cls.__name__}")


def _check_items(values, kind, name):
    values = tuple(values)
    for v in values:
        if getattr(v, "_rmq_kind", None) != kind:
            raise TypeError(f"{name} must hold {kind} objects, not {type(v).__name__}")
    return values


def _enum_repr(e):
    return "None" if e is None else f"{type(e).__name__}.{e.name}"


class _Frozen:
    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other):
        if getattr(other, "_rmq_kind", None) != self._rmq_kind:
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash((self._rmq_kind,) + self._key())

    def __reduce__(self):
        return (type(self), self._key())


_set = object.__setattr__


class SubscriptionData(_Frozen):
    """One subscription: topic, expression (sub_string), its tags and their Java hash codes, version, type."""

    __slots__ = ("topic", "sub_string", "tags", "codes", "sub_version", "expression_type", "class_filter_mode")
    _rmq_kind = "SubscriptionData"

    def __init__(self, topic, sub_string="*", tags=(), codes=(), sub_version=0, expression_type="TAG",
                 class_filter_mode=False):
        tags = tuple(tags)
        for t in tags:
            if not isinstance(t, str):
                raise TypeError(f"tags must hold str, not {type(t).__name__}")
        _set(self, "topic", _check_str(topic, "topic"))
        _set(self, "sub_string", _check_str(sub_string, "sub_string"))
        _set(self, "tags", tags)
        _set(self, "codes", tuple(_check_int(c, "codes element", INT32_MIN, INT32_MAX) for c in codes))
        _set(self, "sub_version", _check_int(sub_version, "sub_version", INT64_MIN, INT64_MAX))
        _set(self, "expression_type", "TAG" if expression_type is None else _check_str(expression_type, "expression_type"))
        _set(self, "class_filter_mode", bool(class_filter_mode))

    def _key(self):
        return (self.topic, self.sub_string, self.tags, self.codes, self.sub_version, self.expression_type,
                self.class_filter_mode)

    def to_dict(self):
        return {
            "topic": self.topic,
            "sub_string": self.sub_string,
            "tags": list(self.tags),
            "codes": list(self.codes),
            "sub_version": self.sub_version,
            "expression_type": self.expression_type,
            "class_filter_mode": self.class_filter_mode,
        }

    def __repr__(self):
        return (f"SubscriptionData(topic={self.topic!r}, sub_string={self.sub_string!r}, tags={self.tags!r}, "
                f"codes={self.codes!r}, sub_version={self.sub_version!r}, expression_type={self.expression_type!r}, "
                f"class_filter_mode={self.class_filter_mode!r})")


class ProducerData(_Frozen):
    """A producer group of the client."""

    __slots__ = ("group",)
    _rmq_kind = "ProducerData"

    def __init__(self, group):
        _set(self, "group", _check_str(group, "group"))

    def _key(self):
        return (self.group,)

    def to_dict(self):
        return {"group": self.group}

    def __repr__(self):
        return f"ProducerData(group={self.group!r})"


class ConsumerData(_Frozen):
    """A consumer group of the client with its consume settings and subscriptions."""

    __slots__ = ("group", "consume_type", "message_model", "consume_from_where", "unit_mode", "subscriptions")
    _rmq_kind = "ConsumerData"

    def __init__(self, group, consume_type=None, message_model=None, consume_from_where=None, unit_mode=False,
                 subscriptions=()):
        _set(self, "group", _check_str(group, "group"))
        _set(self, "consume_type", _coerce_enum(ConsumeType, consume_type, "consume_type"))
        _set(self, "message_model", _coerce_enum(MessageModel, message_model, "message_model"))
        _set(self, "consume_from_where", _coerce_enum(ConsumeFromWhere, consume_from_where, "consume_from_where"))
        _set(self, "unit_mode", bool(unit_mode))
        _set(self, "subscriptions", _check_items(subscriptions, "SubscriptionData", "subscriptions"))

    def _key(self):
        return (self.group, self.consume_type, self.message_model, self.consume_from_where, self.unit_mode,
                self.subscriptions)

    def to_dict(self):
        return {
            "group": self.group,
            "consume_type": None if self.consume_type is None else self.consume_type.name,
            "message_model": None if self.message_model is None else self.message_model.name,
            "consume_from_where": None if self.consume_from_where is None else self.consume_from_where.name,
            "unit_mode": self.unit_mode,
            "subscriptions": [s.to_dict() for s in self.subscriptions],
        }

    def __repr__(self):
        return (f"ConsumerData(group={self.group!r}, consume_type={_enum_repr(self.consume_type)}, "
                f"message_model={_enum_repr(self.message_model)}, "
                f"consume_from_where={_enum_repr(self.consume_from_where)}, unit_mode={self.unit_mode!r}, "
                f"subscriptions={self.subscriptions!r})")


class HeartbeatData(_Frozen):
    """The body of a HEART_BEAT request: client id, producer and consumer groups, V2 fingerprint and flag."""

    __slots__ = ("client_id", "producers", "consumers", "fingerprint", "without_sub")
    _rmq_kind = "HeartbeatData"

    def __init__(self, client_id=None, producers=(), consumers=(), fingerprint=0, without_sub=False):
        _set(self, "client_id", _check_str(client_id, "client_id"))
        _set(self, "producers", _check_items(producers, "ProducerData", "producers"))
        _set(self, "consumers", _check_items(consumers, "ConsumerData", "consumers"))
        _set(self, "fingerprint", _check_int(fingerprint, "fingerprint", INT32_MIN, INT32_MAX))
        _set(self, "without_sub", bool(without_sub))

    def _key(self):
        return (self.client_id, self.producers, self.consumers, self.fingerprint, self.without_sub)

    def to_dict(self):
        return {
            "client_id": self.client_id,
            "producers": [p.to_dict() for p in self.producers],
            "consumers": [c.to_dict() for c in self.consumers],
            "fingerprint": self.fingerprint,
            "without_sub": self.without_sub,
        }

    def __repr__(self):
        return (f"HeartbeatData(client_id={self.client_id!r}, producers={self.producers!r}, "
                f"consumers={self.consumers!r}, fingerprint={self.fingerprint!r}, "
                f"without_sub={self.without_sub!r})")


def _new(cls, **fields):
    """An instance with already-checked fields (the decoder's path; skips the constructor's checks)."""
    obj = object.__new__(cls)
    for k, v in fields.items():
        _set(obj, k, v)
    return obj


# --------------------------------------------------------------------------------------------------------------
# JSON parsing: json.loads with hooks that keep enough to check the tree exactly.


class _Object(list):
    """A JSON object as its (key, value) pairs in document order (duplicates kept)."""


class _Int(str):
    """A JSON integer token, kept as text so range checks never build huge ints."""


class _Float(str):
    """A JSON number with a fraction or exponent, kept as text."""


class _Constant(str):
    """NaN, Infinity or -Infinity: accepted by json.loads, not JSON; rejected by _check_tree with its path."""


def _kind(value) -> str:
    if value is None:
        return "null"
    t = type(value)
    if t is bool:
        return "a boolean"
    if t is _Int or t is _Float:
        return "a number"
    if t is str:
        return "a string"
    if t is _Object:
        return "an object"
    return "an array"


def _fail(path, expected, value):
    shown = f": {echo(value)}" if isinstance(value, str) else ""
    raise HeartbeatError(f"{path}: expected {expected}, got {_kind(value)}{shown}")


def _check_tree(doc):
    """Nesting depth and lone surrogates anywhere in the document (keys and skipped values included)."""
    stack = [(doc, 1, "$")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_DEPTH and (type(node) is _Object or type(node) is list):
            raise HeartbeatError(f"{_short(path)}: nesting deeper than {MAX_DEPTH}")
        if type(node) is _Object:
            for key, value in node:
                _check_text(key, path)
                stack.append((value, depth + 1, f"{path}.{key[:32]}"))
        elif type(node) is list:
            for i, value in enumerate(node):
                stack.append((value, depth + 1, f"{path}[{i}]"))
        elif type(node) is str:
            _check_text(node, path)
        elif type(node) is _Constant:
            raise HeartbeatError(f"{_short(path)}: malformed JSON: {node} is not a JSON value")
    return doc


def _short(path):
    return path if len(path) <= 64 else path[:60] + "..."


def _check_text(s, path):
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise HeartbeatError(f"{_short(path)}: lone surrogate \\u{ord(s[e.start]):04x} in a string escape") from None


def _parse(data: bytes):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeartbeatError(f"invalid UTF-8 at byte {e.start}: {echo(data[e.start:])}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_Object, parse_int=_Int, parse_float=_Float,
                         parse_constant=_Constant)
    except json.JSONDecodeError as e:
        offset = len(text[: e.pos].encode("utf-8"))
        raise HeartbeatError(f"malformed JSON at byte {offset}: {e.msg}: {echo(data[offset:])}") from None
    except RecursionError:
        raise HeartbeatError(f"$: nesting deeper than {MAX_DEPTH}") from None
    return _check_tree(doc)


# --------------------------------------------------------------------------------------------------------------
# Field conversions (path = JSON path for messages)


def _to_str(value, path):
    if value is None or type(value) is str:
        return value
    _fail(path, "a string", value)


def _to_bool(value, path):
    if value is None:
        return False
    if type(value) is bool:
        return value
    _fail(path, "true or false", value)


def _int_text(text, path, lo, hi, what):
    """Digits (optional '-') -> int within [lo, hi]; never converts more than 19 significant digits."""
    negative = text.startswith("-")
    significant = (text[1:] if negative else text).lstrip("0") or "0"
    # more than 19 digits is beyond int64 either way, and is not converted (a stand-in magnitude of 2**63 here
    # once negated to INT64_MIN and was accepted: found by fuzzing, tests/regressions/heartbeat/)
    if len(significant) > 19:
        raise HeartbeatError(f"{path}: {echo(text)} is out of {what} range")
    value = -int(significant) if negative else int(significant)
    if not lo <= value <= hi:
        raise HeartbeatError(f"{path}: {echo(text)} is out of {what} range")
    return value


_NUMERIC = re.compile(r"-?[0-9]+")


def _to_int(value, path, lo, hi, what, numeric_string):
    t = type(value)
    if t is _Int:
        return _int_text(value, path, lo, hi, what)
    if t is str and numeric_string:
        if _NUMERIC.fullmatch(value):
            return _int_text(value, path, lo, hi, what)
        raise HeartbeatError(f"{path}: expected an integer, got a non-numeric string: {echo(value)}")
    if t is _Float:
        raise HeartbeatError(f"{path}: expected an integer, got a number with a fraction or exponent: {echo(value)}")
    _fail(path, "an integer or numeric string" if numeric_string else "an integer", value)


def _to_enum(value, path, cls):
    members, by_name = _ENUM_TABLES[cls]
    if value is None:
        return None
    t = type(value)
    if t is str:
        return by_name.get(value)
    if t is _Int:
        ordinal = _int_text(value, path, INT32_MIN, INT32_MAX, "int32")
        return members[ordinal] if 0 <= ordinal < len(members) else None
    if t is _Float:
        raise HeartbeatError(f"{path}: expected an enum name or ordinal, got a number with a fraction or exponent")
    _fail(path, f"a {cls.__name__} name or ordinal", value)


def _to_array(value, path):
    if value is None:
        return []
    if type(value) is list:
        return value
    _fail(path, "an array", value)


def _to_object(value, path):
    if type(value) is _Object:
        return value
    _fail(path, "an object", value)


class _Clock:
    """Current time in ms, read once per body and only when a subVersion is missing (Java's constructor default)."""

    __slots__ = ("ms",)

    def __init__(self):
        self.ms = None

    def now(self):
        if self.ms is None:
            self.ms = time.time_ns() // 1_000_000
        return self.ms


def _subscription(obj, path, clock):
    topic = sub_string = None
    tags = codes = ()
    sub_version = None
    expression_type = "TAG"
    class_filter_mode = False
    for key, value in _to_object(obj, path):
        p = f"{path}.{key}"
        if key == "topic":
            topic = _to_str(value, p)
        elif key == "subString":
            sub_string = _to_str(value, p)
        elif key == "tagsSet":
            tags = tuple(_to_str_item(v, f"{p}[{i}]") for i, v in enumerate(_to_array(value, p)))
        elif key == "codeSet":
            codes = tuple(
                _to_int(v, f"{p}[{i}]", INT32_MIN, INT32_MAX, "int32", True) for i, v in enumerate(_to_array(value, p))
            )
        elif key == "subVersion":
            sub_version = None if value is None else _to_int(value, p, INT64_MIN, INT64_MAX, "int64", True)
        elif key == "expressionType":
            expression_type = "TAG" if value is None else _to_str(value, p)
        elif key == "classFilterMode":
            class_filter_mode = _to_bool(value, p)
    return _new(
        SubscriptionData, topic=topic, sub_string=sub_string, tags=tags, codes=codes,
        sub_version=clock.now() if sub_version is None else sub_version,
        expression_type=expression_type, class_filter_mode=class_filter_mode,
    )


def _to_str_item(value, path):
    if type(value) is str:
        return value
    _fail(path, "a string", value)


def _consumer(obj, path, clock):
    group = consume_type = message_model = consume_from_where = None
    unit_mode = False
    subscriptions = ()
    for key, value in _to_object(obj, path):
        p = f"{path}.{key}"
        if key == "groupName":
            group = _to_str(value, p)
        elif key == "consumeType":
            consume_type = _to_enum(value, p, ConsumeType)
        elif key == "messageModel":
            message_model = _to_enum(value, p, MessageModel)
        elif key == "consumeFromWhere":
            consume_from_where = _to_enum(value, p, ConsumeFromWhere)
        elif key == "unitMode":
            unit_mode = _to_bool(value, p)
        elif key == "subscriptionDataSet":
            subscriptions = tuple(_subscription(v, f"{p}[{i}]", clock) for i, v in enumerate(_to_array(value, p)))
    return _new(
        ConsumerData, group=group, consume_type=consume_type, message_model=message_model,
        consume_from_where=consume_from_where, unit_mode=unit_mode, subscriptions=subscriptions,
    )


def _producer(obj, path):
    group = None
    for key, value in _to_object(obj, path):
        if key == "groupName":
            group = _to_str(value, f"{path}.groupName")
    return _new(ProducerData, group=group)


def _heartbeat(doc):
    if type(doc) is not _Object:
        _fail("$", "an object", doc)
    clock = _Clock()
    client_id = None
    producers = consumers = ()
    fingerprint = 0
    without_sub = False
    for key, value in doc:
        p = "$." + key
        if key == "clientID":
            client_id = _to_str(value, p)
        elif key == "producerDataSet":
            producers = tuple(_producer(v, f"{p}[{i}]") for i, v in enumerate(_to_array(value, p)))
        elif key == "consumerDataSet":
            consumers = tuple(_consumer(v, f"{p}[{i}]", clock) for i, v in enumerate(_to_array(value, p)))
        elif key == "heartbeatFingerprint":
            fingerprint = 0 if value is None else _to_int(value, p, INT32_MIN, INT32_MAX, "int32", False)
        elif key == "withoutSub" or key == "isWithoutSub":
            without_sub = _to_bool(value, p)
    return _new(
        HeartbeatData, client_id=client_id, producers=producers, consumers=consumers, fingerprint=fingerprint,
        without_sub=without_sub,
    )


def _as_bytes(body) -> bytes:
    if isinstance(body, bytes):
        return body
    try:
        view = memoryview(body)
    except TypeError:
        raise TypeError(f"expected a bytes-like body, got {type(body).__name__}") from None
    if not view.c_contiguous:
        raise TypeError(f"expected a bytes-like body, got a non-contiguous {type(body).__name__}")
    return view.tobytes()


def decode_heartbeat(body) -> HeartbeatData:
    """A HEART_BEAT body (bytes-like, UTF-8 JSON in any client dialect) -> HeartbeatData.

    Raises HeartbeatError for a malformed body (the message names the JSON path or byte offset) and TypeError
    when ``body`` is not a contiguous bytes-like object.
    """
    return _heartbeat(_parse(_as_bytes(body)))


def decode_heartbeats(bodies) -> HeartbeatBatch:
    """Decode many bodies into columns (see HeartbeatBatch for the layout). Never raises for a bad row: it gets
    ok=False and its error message, and no child rows."""
    hb_cols = {name: [] for name, _ in HEARTBEAT_COLUMNS}
    p_cols = {name: [] for name, _ in PRODUCER_COLUMNS}
    c_cols = {name: [] for name, _ in CONSUMER_COLUMNS}
    s_cols = {name: [] for name, _ in SUBSCRIPTION_COLUMNS}
    for row, body in enumerate(bodies):
        try:
            hb = decode_heartbeat(body)
        except (HeartbeatError, TypeError) as e:
            for name, value in (("ok", False), ("error", str(e)), ("client_id", None), ("fingerprint", 0),
                                ("without_sub", False), ("n_producers", 0), ("n_consumers", 0)):
                hb_cols[name].append(value)
            continue
        for name, value in (("ok", True), ("error", None), ("client_id", hb.client_id),
                            ("fingerprint", hb.fingerprint), ("without_sub", hb.without_sub),
                            ("n_producers", len(hb.producers)), ("n_consumers", len(hb.consumers))):
            hb_cols[name].append(value)
        for p in hb.producers:
            p_cols["row"].append(row)
            p_cols["group"].append(p.group)
        for c in hb.consumers:
            consumer = len(c_cols["row"])
            for name, value in (("row", row), ("group", c.group), ("consume_type", _ordinal(c.consume_type)),
                                ("message_model", _ordinal(c.message_model)),
                                ("consume_from_where", _ordinal(c.consume_from_where)),
                                ("unit_mode", c.unit_mode), ("n_subscriptions", len(c.subscriptions))):
                c_cols[name].append(value)
            for s in c.subscriptions:
                for name, value in (("consumer", consumer), ("row", row), ("topic", s.topic),
                                    ("sub_string", s.sub_string), ("expression_type", s.expression_type),
                                    ("tags", s.tags), ("codes", s.codes), ("sub_version", s.sub_version),
                                    ("class_filter_mode", s.class_filter_mode)):
                    s_cols[name].append(value)
    return HeartbeatBatch(
        _columns(hb_cols, HEARTBEAT_COLUMNS), _columns(p_cols, PRODUCER_COLUMNS),
        _columns(c_cols, CONSUMER_COLUMNS), _columns(s_cols, SUBSCRIPTION_COLUMNS),
    )


def _ordinal(member) -> int:
    return -1 if member is None else int(member)


def _columns(lists, spec):
    return {
        name: object_column(lists[name]) if dtype is object else np.array(lists[name], dtype=dtype)
        for name, dtype in spec
    }

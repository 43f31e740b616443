"""Pure-Python twin of ``engine.codec._heartbeat``: the HeartbeatData model and its JSON decoder.

Same names, inputs, outputs and error classes as the Cython module (parity tests hold them together); this one
is the readable reference. It parses with ``json.loads`` and then checks the tree against the rules of
PROTOCOL.md 4.5:

* any key order, unknown keys ignored, the last of duplicate keys wins (every occurrence is still checked);
* missing or null keys take Java's defaults (sets empty, expressionType "TAG", booleans false, fingerprint 0,
  clientID and names None, a missing subVersion the current time in ms, as Java's constructor does);
* ``isWithoutSub`` is an alias of ``withoutSub``; enums by name or ordinal (unknown -> None);
* codeSet elements and subVersion as JSON integers or numeric strings (int32 / int64 range);
* at most ``max_elements`` (DEFAULT_MAX_ELEMENTS) decoded elements per body: the tags, codes, subscriptions,
  consumers and producers the decoder builds as objects, every occurrence of a repeated key counted; past it
  HeartbeatError names the first element over the budget (the broker's maxHeartbeatElements);
* anything else, including invalid UTF-8, lone surrogate escapes and nesting deeper than MAX_DEPTH,
  raises HeartbeatError with the native decoder's message for the first error in document order (JSON path,
  problem, byte offset, echo): a rejected body is walked again by _Locator, a port of the native traversal.
"""
import json
import operator
import re
import time

import numpy as np

from engine.codec.enums import ConsumeFromWhere, ConsumeType, MessageModel
from engine.codec.errors import HeartbeatError, echo
from engine.codec.heartbeat import (
    CONSUMER_COLUMNS,
    HEARTBEAT_COLUMNS,
    PRODUCER_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    HeartbeatBatch,
    object_column,
)

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "ConsumerData",
    "HeartbeatData",
    "ProducerData",
    "SubscriptionData",
    "decode_heartbeat",
    "decode_heartbeats",
]

#: Deepest nesting of arrays/objects accepted anywhere in a body (the top-level object is depth 1).
MAX_DEPTH = 64
#: Decoded elements (tags, codes, subscriptions, consumers, producers) of one body at most, by default. Each costs
#: its bytes of the body plus at most ELEMENT_OVERHEAD_BYTES, so a body at the budget decodes to at most its size
#: plus 16 MiB, where a body of small tags decoded to ~4 times its size and one of empty subscriptions ("{},": 104
#: bytes each) to ~35 times.
#: Real clients send a few dozen (the captured vectors: 13 at most; 1,024 groups of a few subscriptions of a
#: few tags stay far below).
DEFAULT_MAX_ELEMENTS = 65_536
#: What a decoded element adds beyond its own bytes of the body, at most (the object, its strings' headers, its
#: tuple slot; measured with tracemalloc: ~210 for a subscription of three one-character strings). A body of
#: ASCII strings decodes to at most len(body) + elements x ELEMENT_OVERHEAD_BYTES; a string mixing characters
#: beyond U+FFFF with ASCII takes up to 4 bytes per body byte (Python's UCS-4 strings).
ELEMENT_OVERHEAD_BYTES = 256

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


def _max_elements(value):
    """The max_elements argument of the decoders: an int >= 1 (TypeError / ValueError as the native)."""
    if type(value) is not int:
        value = int(operator.index(value))
    if value < 1:
        raise ValueError(f"max_elements must be at least 1, got {value}")
    return value


def _too_many(max_elements):
    return f"more than {max_elements} elements (tags, codes, subscriptions, groups)"


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
    """Current time in ms, read once per body and only when a subVersion is missing (Java's constructor default);
    and the body's element budget (``left``: elements it may still decode)."""

    __slots__ = ("ms", "left")

    def __init__(self, max_elements):
        self.ms = None
        self.left = max_elements

    def take(self, items):
        """Count an array's elements against the budget (the exact place of the error is _Locator's to find)."""
        self.left -= len(items)
        if self.left < 0:
            raise HeartbeatError("too many elements")
        return items

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
            tags = tuple(_to_str_item(v, f"{p}[{i}]") for i, v in enumerate(clock.take(_to_array(value, p))))
        elif key == "codeSet":
            codes = tuple(
                _to_int(v, f"{p}[{i}]", INT32_MIN, INT32_MAX, "int32", True)
                for i, v in enumerate(clock.take(_to_array(value, p)))
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
            subscriptions = tuple(_subscription(v, f"{p}[{i}]", clock)
                                  for i, v in enumerate(clock.take(_to_array(value, p))))
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


def _heartbeat(doc, max_elements):
    if type(doc) is not _Object:
        _fail("$", "an object", doc)
    clock = _Clock(max_elements)
    client_id = None
    producers = consumers = ()
    fingerprint = 0
    without_sub = False
    for key, value in doc:
        p = "$." + key
        if key == "clientID":
            client_id = _to_str(value, p)
        elif key == "producerDataSet":
            producers = tuple(_producer(v, f"{p}[{i}]") for i, v in enumerate(clock.take(_to_array(value, p))))
        elif key == "consumerDataSet":
            consumers = tuple(_consumer(v, f"{p}[{i}]", clock) for i, v in enumerate(clock.take(_to_array(value, p))))
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


def decode_heartbeat(body, max_elements=DEFAULT_MAX_ELEMENTS) -> HeartbeatData:
    """A HEART_BEAT body (bytes-like, UTF-8 JSON in any client dialect) -> HeartbeatData.

    Raises HeartbeatError for a malformed body (the message names the JSON path or byte offset) or one of more than
    ``max_elements`` decoded elements, and TypeError when ``body`` is not a contiguous bytes-like object.
    """
    data = _as_bytes(body)
    max_elements = _max_elements(max_elements)
    try:
        return _heartbeat(_parse(data), max_elements)
    except HeartbeatError:
        located = _locate(data, max_elements)
        if located is None:   # the two walks disagree (a bug the parity tests exist to catch): keep this message
            raise
    raise HeartbeatError(located)


def decode_heartbeats(bodies, max_elements=DEFAULT_MAX_ELEMENTS) -> HeartbeatBatch:
    """Decode many bodies into columns (see HeartbeatBatch for the layout). Never raises for a bad row: it gets
    ok=False and its error message, and no child rows. ``max_elements`` bounds each body as in decode_heartbeat."""
    max_elements = _max_elements(max_elements)
    hb_cols = {name: [] for name, _ in HEARTBEAT_COLUMNS}
    p_cols = {name: [] for name, _ in PRODUCER_COLUMNS}
    c_cols = {name: [] for name, _ in CONSUMER_COLUMNS}
    s_cols = {name: [] for name, _ in SUBSCRIPTION_COLUMNS}
    for row, body in enumerate(bodies):
        try:
            hb = decode_heartbeat(body, max_elements)
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


# --------------------------------------------------------------------------------------------------------------
# Error messages. json.loads finds *that* a body is bad; the native parser says *where*, in its own words, at the
# first problem in document order. So that the `error` column and every message are the same on both builds, a
# body the fast path above rejects is walked again by _Locator: the native parser's traversal, step for step
# (pyx/codec/_heartbeat.pyx, same checks in the same order, same paths and offsets), reduced to finding the first
# error. It runs only on bad bodies; its strings are skipped by regex, so a 16 MiB body costs milliseconds.

_PATH_SLOTS = 16   # path components kept for messages (the native's PATH_SLOTS)
_KEY_MAX = 32      # an escaped key longer than 6 * _KEY_MAX bytes cannot be a known key
_PLAIN_RUN = re.compile(rb'[\x20\x21\x23-\x5b\x5d-\x7f]*')
_DIGIT_RUN = re.compile(rb'[0-9]*')
_HEX4 = re.compile(rb'[0-9a-fA-F]{4}')
_SIMPLE_ESCAPES = frozenset(b'"\\/bfnrt')
_KIND_AT = {ord('"'): "a string", ord("{"): "an object", ord("["): "an array", ord("t"): "a boolean",
            ord("f"): "a boolean", ord("n"): "null", ord("-"): "a number",
            **{c: "a number" for c in b"0123456789"}}


class _Located(Exception):
    """The first error of a body, in the native parser's words (raised as HeartbeatError by decode_heartbeat)."""


class _Locator:
    __slots__ = ("s", "n", "pos", "depth", "path", "elements", "max_elements")

    def __init__(self, s: bytes, max_elements=DEFAULT_MAX_ELEMENTS):
        self.s, self.n, self.pos, self.depth, self.path = s, len(s), 0, 0, []
        self.elements, self.max_elements = 0, max_elements

    # -- errors
    def fail(self, at, what):
        at = min(at, self.n)
        parts = ["$"]
        for c in self.path[:_PATH_SLOTS]:
            parts.append(f"[{c}]" if type(c) is int else "." + c[:32].decode("utf-8", "replace"))
        raise _Located(f"{''.join(parts)}: {what} at byte {at}: {echo(self.s[at:min(self.n, at + 32)])}")

    def syntax(self, expected):
        if self.pos >= self.n:
            self.fail(self.pos, f"malformed JSON: expected {expected}, got end of input")
        self.fail(self.pos, f"malformed JSON: expected {expected}")

    def peek(self):
        return self.s[self.pos] if self.pos < self.n else 0

    def wrong_type(self, expected):
        kind = _KIND_AT.get(self.peek())
        if kind is None:
            self.syntax("a JSON value")
        self.fail(self.pos, f"expected {expected}, got {kind}")

    # -- lexical
    def ws(self):
        s, n, i = self.s, self.n, self.pos
        while i < n and s[i] in b" \n\r\t":
            i += 1
        self.pos = i

    def string(self):
        """Validate the string at pos ('"'); move past it; return (its raw content, has escapes)."""
        s, n, i = self.s, self.n, self.pos + 1
        start, escaped = i, False
        while True:
            i = _PLAIN_RUN.match(s, i).end()
            if i >= n:
                self.fail(self.pos, "malformed JSON: unterminated string")
            c = s[i]
            if c == 0x22:
                self.pos = i + 1
                return s[start:i], escaped
            if c == 0x5C:
                escaped = True
                if i + 1 >= n:
                    self.fail(self.pos, "malformed JSON: unterminated string")
                e = s[i + 1]
                if e in _SIMPLE_ESCAPES:
                    i += 2
                    continue
                if e != 0x75:
                    self.fail(i, "malformed JSON: invalid escape")
                if i + 6 > n or not _HEX4.fullmatch(s, i + 2, i + 6):
                    self.fail(i, "malformed JSON: invalid \\uXXXX escape")
                cp = int(s[i + 2:i + 6], 16)
                if 0xD800 <= cp <= 0xDBFF:
                    if (i + 12 <= n and s[i + 6:i + 8] == b"\\u" and _HEX4.fullmatch(s, i + 8, i + 12)
                            and 0xDC00 <= int(s[i + 8:i + 12], 16) <= 0xDFFF):
                        i += 12
                        continue
                    self.fail(i, "lone surrogate in a \\u escape")
                if 0xDC00 <= cp <= 0xDFFF:
                    self.fail(i, "lone surrogate in a \\u escape")
                i += 6
                continue
            if c < 0x20:
                self.fail(i, "malformed JSON: control character in a string")
            k = _utf8_len(s, i, n)
            if k == 0:
                self.fail(i, "invalid UTF-8")
            i += k

    @staticmethod
    def unescape(raw: bytes) -> bytes:
        """The UTF-8 bytes of a validated string span with escapes."""
        return json.loads(b'"' + raw + b'"').encode("utf-8")

    def literal(self, word):
        if self.s[self.pos:self.pos + len(word)] != word:
            self.syntax("a JSON value")
        self.pos += len(word)

    def number(self):
        """Validate the number at pos, move past it; return None for a fraction/exponent, else its int value."""
        s, n, start = self.s, self.n, self.pos
        i = start + 1 if start < n and s[start] == 0x2D else start
        if i >= n or not 0x30 <= s[i] <= 0x39:
            self.pos = i
            self.syntax("a digit")
        i = i + 1 if s[i] == 0x30 else _DIGIT_RUN.match(s, i).end()   # "0" alone: "01" ends at the "1"
        int_end, real = i, False
        if i < n and s[i] == 0x2E:
            real = True
            i += 1
            if i >= n or not 0x30 <= s[i] <= 0x39:
                self.pos = i
                self.syntax("a digit")
            i = _DIGIT_RUN.match(s, i).end()
        if i < n and s[i] in b"eE":
            real = True
            i += 1
            if i < n and s[i] in b"+-":
                i += 1
            if i >= n or not 0x30 <= s[i] <= 0x39:
                self.pos = i
                self.syntax("a digit")
            i = _DIGIT_RUN.match(s, i).end()
        self.pos = i
        return None if real else _bounded_int(s[start:int_end])

    def count(self):
        """One decoded element (at its start, its index on the path), against the body's budget."""
        self.elements += 1
        if self.elements > self.max_elements:
            self.fail(self.pos, _too_many(self.max_elements))

    # -- structure
    def enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(self.pos, f"nesting deeper than {MAX_DEPTH}")

    def colon(self):
        self.ws()
        if self.peek() != 0x3A:
            self.syntax("':'")
        self.pos += 1
        self.ws()

    def next(self, close):
        """After a value: ',' -> False (at the next item), `close` -> True (consumed)."""
        self.ws()
        c = self.peek()
        if c == 0x2C:
            self.pos += 1
            self.ws()
            return False
        if c == close:
            self.pos += 1
            return True
        self.syntax("',' or '}'" if close == 0x7D else "',' or ']'")

    def open(self, opener, expected):
        """At an object/array start (or null for arrays): True = opened and non-empty, False = empty or null."""
        c = self.peek()
        if c != opener:
            if c == 0x6E and opener == 0x5B:
                self.literal(b"null")
                return False
            self.wrong_type(expected)
        self.enter()
        self.pos += 1
        self.ws()
        if self.peek() == opener + 2:   # '{' + 2 = '}', '[' + 2 = ']'
            self.pos += 1
            self.depth -= 1
            return False
        return True

    def key(self):
        """The key at pos, ':' consumed: (raw bytes for the path, the bytes compared with known keys)."""
        if self.peek() != 0x22:
            self.syntax("a string key")
        raw, escaped = self.string()
        self.colon()
        if not escaped:
            return raw, raw
        return raw, (raw if len(raw) > _KEY_MAX * 6 else self.unescape(raw))

    def members(self, expected, on_key):
        """An object at pos: on_key(name) per member, the key on the path while its value is read."""
        if self.open(0x7B, expected):
            while True:
                raw, name = self.key()
                self.path.append(raw)
                on_key(name, raw)
                self.path.pop()
                if self.next(0x7D):
                    break
            self.depth -= 1

    def items(self, item):
        """An array (or null) at pos: item() per element, its index on the path (also while ',' or ']' is read)."""
        if self.open(0x5B, "an array"):
            self.path.append(0)
            count = 0
            while True:
                self.path[-1] = count
                item()
                count += 1
                if self.next(0x5D):
                    break
            self.path.pop()
            self.depth -= 1

    # -- values
    def skip(self):
        c = self.peek()
        if c == 0x22:
            self.string()
        elif c == 0x7B:
            self.enter()
            self.pos += 1
            self.ws()
            if self.peek() == 0x7D:
                self.pos += 1
            else:
                while True:
                    if self.peek() != 0x22:
                        self.syntax("a string key")
                    self.string()
                    self.colon()
                    self.skip()
                    if self.next(0x7D):
                        break
            self.depth -= 1
        elif c == 0x5B:
            self.enter()
            self.pos += 1
            self.ws()
            if self.peek() == 0x5D:
                self.pos += 1
            else:
                while True:
                    self.skip()
                    if self.next(0x5D):
                        break
            self.depth -= 1
        elif c == 0x74:
            self.literal(b"true")
        elif c == 0x66:
            self.literal(b"false")
        elif c == 0x6E:
            self.literal(b"null")
        elif c == 0x2D or 0x30 <= c <= 0x39:
            self.number()
        else:
            self.syntax("a JSON value")

    def opt_string(self):
        c = self.peek()
        if c == 0x22:
            self.string()
        elif c == 0x6E:
            self.literal(b"null")
        else:
            self.wrong_type("a string")

    def opt_bool(self):
        c = self.peek()
        if c == 0x74:
            self.literal(b"true")
        elif c == 0x66:
            self.literal(b"false")
        elif c == 0x6E:
            self.literal(b"null")
        else:
            self.wrong_type("true or false")

    def integer(self, lo, hi, what, numeric_string):
        at, c = self.pos, self.peek()
        if c == 0x2D or 0x30 <= c <= 0x39:
            value = self.number()
            if value is None:
                self.fail(at, "expected an integer, got a number with a fraction or exponent")
        elif c == 0x22 and numeric_string:
            raw, escaped = self.string()
            text = self.unescape(raw) if escaped else raw
            if not re.fullmatch(rb"-?[0-9]+", text):
                self.fail(at, "expected an integer, got a non-numeric string")
            value = _bounded_int(text)
        else:
            self.wrong_type("an integer or numeric string" if numeric_string else "an integer")
        if not lo <= value <= hi:
            self.fail(at, f"out of {what} range")

    def enum(self):
        at, c = self.pos, self.peek()
        if c == 0x22:
            self.string()
        elif c == 0x2D or 0x30 <= c <= 0x39:
            value = self.number()
            if value is None:
                self.fail(at, "expected an enum name or ordinal, got a number with a fraction or exponent")
            if not INT32_MIN <= value <= INT32_MAX:
                self.fail(at, "out of int32 range")
        elif c == 0x6E:
            self.literal(b"null")
        else:
            self.wrong_type("an enum name or ordinal")

    def null_or_integer(self, lo, hi, what, numeric_string):
        if self.peek() == 0x6E:
            self.literal(b"null")
        else:
            self.integer(lo, hi, what, numeric_string)

    # -- the heartbeat's structure (PROTOCOL.md 4.5)
    def subscription(self):
        def on_key(name, raw):
            if name in (b"topic", b"subString", b"expressionType"):
                self._known(name)
                self.opt_string()
            elif name == b"tagsSet":
                self._known(name)
                self.items(self._tag)
            elif name == b"codeSet":
                self._known(name)
                self.items(self._code)
            elif name == b"subVersion":
                self._known(name)
                self.null_or_integer(INT64_MIN, INT64_MAX, "int64", True)
            elif name == b"classFilterMode":
                self._known(name)
                self.opt_bool()
            else:
                self.skip()
        self.count()
        self.members("an object", on_key)

    def _tag(self):
        self.count()
        if self.peek() != 0x22:
            self.wrong_type("a string")
        self.string()

    def _code(self):
        self.count()
        self.integer(INT32_MIN, INT32_MAX, "int32", True)

    def _known(self, name):
        # a known key is on the path by its name, whatever escapes spelled it
        self.path[-1] = name

    def consumer(self):
        def on_key(name, raw):
            if name == b"groupName":
                self._known(name)
                self.opt_string()
            elif name in (b"consumeType", b"messageModel", b"consumeFromWhere"):
                self._known(name)
                self.enum()
            elif name == b"unitMode":
                self._known(name)
                self.opt_bool()
            elif name == b"subscriptionDataSet":
                self._known(name)
                self.items(self.subscription)
            else:
                self.skip()
        self.count()
        self.members("an object", on_key)

    def producer(self):
        def on_key(name, raw):
            if name == b"groupName":
                self._known(name)
                self.opt_string()
            else:
                self.skip()
        self.count()
        self.members("an object", on_key)

    def heartbeat(self):
        def on_key(name, raw):
            if name == b"clientID":
                self._known(name)
                self.opt_string()
            elif name == b"consumerDataSet":
                self._known(name)
                self.items(self.consumer)
            elif name == b"producerDataSet":
                self._known(name)
                self.items(self.producer)
            elif name == b"heartbeatFingerprint":
                self._known(name)
                self.null_or_integer(INT32_MIN, INT32_MAX, "int32", False)
            elif name == b"withoutSub" or name == b"isWithoutSub":
                self.opt_bool()   # on the path as spelled (raw), as the native does
            else:
                self.skip()
        self.ws()
        if self.pos >= self.n:
            self.fail(self.pos, "malformed JSON: empty body")
        self.members("an object", on_key)
        self.ws()
        if self.pos != self.n:
            self.fail(self.pos, "malformed JSON: trailing data after the object")


def _bounded_int(text: bytes) -> int:
    """'-?[0-9]+' -> int, or a value outside int64 when it has more than 19 significant digits (never converted)."""
    negative = text[:1] == b"-"
    digits = (text[1:] if negative else text).lstrip(b"0") or b"0"
    if len(digits) > 19:
        return INT64_MIN - 1 if negative else INT64_MAX + 1
    return -int(digits) if negative else int(digits)


def _utf8_len(s: bytes, i: int, n: int) -> int:
    """Length of the valid UTF-8 sequence at s[i] (a byte >= 0x80), or 0: what Python's strict decoder accepts."""
    c = s[i]
    k = 2 if 0xC2 <= c <= 0xDF else 3 if 0xE0 <= c <= 0xEF else 4 if 0xF0 <= c <= 0xF4 else 0
    if k == 0 or i + k > n:
        return 0
    try:
        s[i:i + k].decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return k


def _locate(data: bytes, max_elements=DEFAULT_MAX_ELEMENTS):
    """The native parser's message for the first error of ``data``, or None if it finds none."""
    try:
        _Locator(data, max_elements).heartbeat()
    except _Located as e:
        return str(e)
    return None

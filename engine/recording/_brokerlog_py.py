"""Pure-Python twin of ``engine.recording._brokerlog``: the RocketMQ broker-log line parser (the reference and the fallback).

``parse_lines(lines, base_line=0)`` takes one batch of log lines (a pyarrow string/binary array, or a list of
str/bytes) and returns ``(events, stats)``: a pyarrow RecordBatch of the client-management events in the batch
(schema ``EVENT_SCHEMA``, one row per recognised line) and the per-category counts of the other lines with the
first example of each. Same inputs give the same outputs (or the same error class and message) in both builds.

A line is ``yyyy-MM-dd HH:mm:ss[,SSS] LEVEL THREAD - MESSAGE`` (logback's broker pattern, 4.x and 5.x). Its time
has no zone: ``ts_ms`` is the wall-clock time read as if it were UTC; ``to_utc_ms`` applies the log's zone.
Messages recognised (ConsumerGroupInfo / ConsumerManager / ProducerManager / ClientManageProcessor /
SubscriptionGroupManager of 4.x and 5.x) and the event kinds they become:

===================  ==========  ==================================================================================
kind                 role        message
===================  ==========  ==================================================================================
register             consumer    ``new consumer connected, group: G TYPE MODEL channel: ClientChannelInfo [...]``
register             producer    ``new producer connected, group: G channel: ClientChannelInfo [...]``
consumer_data        consumer    ``registerConsumer info changed ConsumerData [...] ADDR`` (4.x);
                                 ``[heartBeatV2 ]ClientManageProcessor: registerConsumer info changed, SDK
                                 address=ADDR, consumerData=ConsumerData [...]`` (5.x): ``sub_key`` = the member's set
sub_add              consumer    ``subscription changed, add new topic, group: G SubscriptionData [...]``
sub_change           consumer    ``subscription changed, group: G OLD: SubscriptionData [...] NEW: SubscriptionData
                                 [...]``
sub_remove           consumer    ``subscription changed, group: G remove topic T SubscriptionData [...]``
unregister           both        ``unregister a consumer[G] from consumerGroupInfo ClientChannelInfo [...]``,
                                 ``unregister a producer[G] from groupChannelTable ClientChannelInfo [...]``
group_removed        both        ``unregister consumer ok, no any connection, and remove consumer group, G``,
                                 ``unregister a producer group[G] from groupChannelTable``
closed               both        ``NETTY EVENT: remove not active channel[CCI] from ConsumerGroupInfo
                                 groupChannelTable, consumer group: G``, ``NETTY EVENT: remove channel[CCI][ADDR]
                                 from ProducerManager groupChannelTable, producer group: G``
expired              both        ``SCAN: remove expired channel from ConsumerManager consumerTable. channel=ADDR,
                                 consumerGroup=G``, ``SCAN: remove expired channel[ADDR] from ProducerManager
                                 groupChannelTable, producer group name: G`` (5.x: ``ProducerManager#scanNotActive
                                 Channel: remove expired channel[ADDR] ...``)
group_cleared        both        ``SCAN: remove expired channel from ConsumerManager consumerTable, all clear,
                                 consumerGroup=G``, ``SCAN: remove expired channel from ProducerManager
                                 groupChannelTable, all clear, group=G``
group_created        consumer    ``auto create a subscription group, SubscriptionGroupConfig [groupName=G, ...``,
                                 ``create new subscription group, SubscriptionGroupConfig{groupName=G, ...``
group_deleted        consumer    ``delete subscription group OK, subscription group:SubscriptionGroupConfig ...``
broker_start         broker      ``rocketmqHome=...`` (the first line BrokerStartup logs: the JVM starts a broker)
broker_boot          broker      ``The broker[NAME, ADDR] boot success. ...``: group = NAME, addr = ADDR
broker_stop          broker      ``Shutdown hook was invoked, N`` (the JVM stops: every channel ends)
===================  ==========  ==================================================================================

Other lines are counted, never fatal: ``other`` (a well-formed line with another message), ``continuation``
(no header: white space first, ``Caused by: `` or a Java throwable's first line such as
``java.nio.channels.ClosedChannelException: null``: the stack trace of the entry before it, one multi-line entry), ``blank``, ``unknown_format`` (no
``timestamp ... - `` header), ``invalid_utf8`` (a recognised line that is not UTF-8) and ``malformed_<kind>``
(a recognised message whose fields do not parse, e.g. a truncated line). ``examples`` keeps the first line of
each category but ``other`` (truncated to ``EXAMPLE_CHARS``). The file reader (``engine.bindings.brokerlog``) adds
``overlong_line`` (a line over its max line size, skipped) and ``bad_timestamp`` (an event stamped outside its time
window, left out), and withholds the examples of header-less lines of a file with no log line.
"""
from __future__ import annotations

import json

from engine.codec.errors import RemotingError, echo


class BrokerLogError(RemotingError, ValueError):
    """The input of the log-line parser is not a batch of lines (wrong type, broken offsets)."""


#: Most subscriptions one ConsumerData line may list (more: the line is malformed).
MAX_SUBS = 256
#: Longest example line kept per category.
EXAMPLE_CHARS = 300

#: (name, arrow type name) of the event columns, in order.
EVENT_COLUMNS = (
    ("ts_ms", "int64"), ("line", "int64"), ("kind", "string"), ("role", "string"), ("group", "string"),
    ("client_id", "string"), ("addr", "string"), ("language", "string"), ("version", "int32"),
    ("consume_type", "string"), ("message_model", "string"), ("topic", "string"), ("sub_string", "string"),
    ("expression_type", "string"), ("sub_version", "int64"), ("old_sub_string", "string"),
    ("old_expression_type", "string"), ("old_sub_version", "int64"), ("sub_key", "string"),
    ("last_update_ms", "int64"),
)
STRING_COLUMNS = tuple(n for n, t in EVENT_COLUMNS if t == "string")
INT_COLUMNS = tuple(n for n, t in EVENT_COLUMNS if t != "string")

EVENT_KINDS = ("register", "consumer_data", "sub_add", "sub_change", "sub_remove", "unregister", "group_removed",
               "closed", "expired", "group_cleared", "group_created", "group_deleted", "client_changed",
               "broker_start", "broker_boot", "broker_stop")
#: every category a non-event line is counted under
CATEGORIES = ("other", "continuation", "blank", "unknown_format", "invalid_utf8", "unknown_client_message") + tuple(
    "malformed_" + k for k in EVENT_KINDS)


def event_schema():
    import pyarrow as pa

    return pa.schema([(n, getattr(pa, t)()) for n, t in EVENT_COLUMNS])


class _Malformed(Exception):
    pass


# --- field parsers (positions into the line's bytes, the same steps as the Cython build) --------------------------


def _find(b, sub, p, e):
    i = b.find(sub, p, e)
    if i < 0:
        raise _Malformed
    return i


def _after(b, sub, p, e):
    """Position just past the first ``sub`` in b[p:e]."""
    return _find(b, sub, p, e) + len(sub)


def _expect(b, lit, p, e):
    if p + len(lit) > e or b[p:p + len(lit)] != lit:
        raise _Malformed
    return p + len(lit)


def _int(b, p, e):
    """Decimal integer b[p:e] (optional '-'), at most 18 digits."""
    neg = p < e and b[p] == 0x2D
    q = p + 1 if neg else p
    if q >= e or e - q > 18:
        raise _Malformed
    v = 0
    for i in range(q, e):
        c = b[i]
        if c < 0x30 or c > 0x39:
            raise _Malformed
        v = v * 10 + (c - 0x30)
    return -v if neg else v


def _nonempty(b, p, e):
    if e <= p:
        raise _Malformed
    return b[p:e]


def _cci(b, p, e, ev):
    """ClientChannelInfo [channel=..., clientId=C, language=L, version=V, lastUpdateTimestamp=T] at p -> end."""
    p = _expect(b, b"ClientChannelInfo [channel=", p, e)
    q = _find(b, b", clientId=", p, e)
    r = b.find(b"R:/", p, q)
    if r >= 0:
        s = b.find(b"]", r + 3, q)
        ev["addr"] = b[r + 3:(q if s < 0 else s)]
    p = q + 11
    q = _find(b, b", language=", p, e)
    ev["client_id"] = _nonempty(b, p, q)
    p = q + 11
    q = _find(b, b", version=", p, e)
    ev["language"] = b[p:q]
    p = q + 10
    q = _find(b, b", lastUpdateTimestamp=", p, e)
    ev["version"] = _int(b, p, q)
    p = q + 22
    q = _find(b, b"]", p, e)
    ev["last_update_ms"] = _int(b, p, q)
    return q + 1


def _sd(b, p, e):
    """SubscriptionData [classFilterMode=.., topic=T, subString=S, tagsSet=[..], codeSet=[..], subVersion=V,
    expressionType=E] at p -> (topic, subString, expressionType, subVersion, end)."""
    p = _expect(b, b"SubscriptionData [classFilterMode=", p, e)
    p = _find(b, b", topic=", p, e) + 8
    q = _find(b, b", subString=", p, e)
    topic = _nonempty(b, p, q)
    p = q + 12
    q = _find(b, b", tagsSet=[", p, e)
    sub = b[p:q]
    p = _find(b, b", subVersion=", q, e) + 13
    q = _find(b, b", expressionType=", p, e)
    version = _int(b, p, q)
    p = q + 17
    q = _find(b, b"]", p, e)
    return topic, sub, b[p:q], version, q + 1


def _consumer_data(b, p, e, ev):
    """ConsumerData [groupName=G, consumeType=.., messageModel=.., ..., subscriptionDataSet=[SD, SD]] at p -> end."""
    p = _expect(b, b"ConsumerData [groupName=", p, e)
    q = _find(b, b", consumeType=", p, e)
    ev["group"] = _nonempty(b, p, q)
    p = q + 14
    q = _find(b, b", messageModel=", p, e)
    ev["consume_type"] = b[p:q]
    p = q + 15
    q = _find(b, b", consumeFromWhere=", p, e)
    ev["message_model"] = b[p:q]
    p = _after(b, b", subscriptionDataSet=[", q, e)
    triples = set()
    n = 0
    if p < e and b[p] == 0x5D:  # ']'
        p += 1
    else:
        while True:
            if n == MAX_SUBS:
                raise _Malformed
            n += 1
            topic, sub, etype, _, p = _sd(b, p, e)
            triples.add((topic, etype, sub))
            if p < e and b[p] == 0x5D:
                p += 1
                break
            p = _expect(b, b", ", p, e)
    p = _expect(b, b"]", p, e)
    ev["sub_key"] = sub_key_of(triples)
    return p


def sub_key_of(triples) -> bytes:
    """Canonical text of a subscription set (engine.recording.scan_py.subscription_key): sorted distinct [topic,
    expressionType, subString] as compact JSON, here from UTF-8 bytes (byte order = code-point order)."""
    return json.dumps([[x.decode("utf-8") for x in t] for t in sorted(triples)], separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def _group_cfg(b, p, e, ev):
    p = _expect(b, b"SubscriptionGroupConfig", p, e)
    if p < e and b[p] == 0x20:
        p += 1
    if p >= e or b[p] not in (0x5B, 0x7B):  # '[' or '{'
        raise _Malformed
    p = _expect(b, b"groupName=", p + 1, e)
    q = p
    while q < e and b[q] not in (0x2C, 0x5D, 0x7D):  # , ] }
        q += 1
    ev["group"] = _nonempty(b, p, q)


def _rest_group(b, p, e, ev):
    ev["group"] = _nonempty(b, p, e)


def _m_new_consumer(b, p, e, ev):
    q = _find(b, b" channel: ", p, e)
    i2 = b.rfind(b" ", p, q)
    i1 = b.rfind(b" ", p, i2) if i2 > p else -1
    if i1 <= p:
        raise _Malformed
    ev["group"] = b[p:i1]
    ev["consume_type"] = _nonempty(b, i1 + 1, i2)
    ev["message_model"] = _nonempty(b, i2 + 1, q)
    _cci(b, q + 10, e, ev)


def _m_new_producer(b, p, e, ev):
    q = _find(b, b" channel: ", p, e)
    ev["group"] = _nonempty(b, p, q)
    _cci(b, q + 10, e, ev)


def _m_client_changed(sep_old, sep_new):
    """ConsumerGroupInfo.updateChannel: a consumer channel already in the group arrives with another client id, and
    its entry is replaced (4.x ``[BUG] consumer channel exist in broker, but clientId not equal. GROUP: G OLD: I
    NEW: I ``, 5.x ``ConsumerGroupInfo: consumer channel exists in broker, but clientId is not the same one,
    group=G, old clientChannelInfo=I, new clientChannelInfo=I``): the event is the new ClientChannelInfo."""

    def parse(b, p, e, ev):
        q = _find(b, sep_old, p, e)
        ev["group"] = _nonempty(b, p, q)
        q = _cci(b, q + len(sep_old), e, {})
        q = _expect(b, sep_new, q, e)
        _cci(b, q, e, ev)

    return parse


def _m_sub_add(b, p, e, ev):
    q = _find(b, b" SubscriptionData [", p, e)
    ev["group"] = _nonempty(b, p, q)
    ev["topic"], ev["sub_string"], ev["expression_type"], ev["sub_version"], _ = _sd(b, q + 1, e)


def _m_sub_changed(b, p, e, ev):
    q = _find(b, b" ", p, e)
    ev["group"] = _nonempty(b, p, q)
    if b.startswith(b" OLD: ", q):
        ev["kind"] = b"sub_change"
        topic, sub, etype, version, q = _sd(b, q + 6, e)
        ev["old_sub_string"], ev["old_expression_type"], ev["old_sub_version"] = sub, etype, version
        q = _expect(b, b" NEW: ", q, e)
        ev["topic"], ev["sub_string"], ev["expression_type"], ev["sub_version"], _ = _sd(b, q, e)
    elif b.startswith(b" remove topic ", q):
        ev["kind"] = b"sub_remove"
        p = q + 14
        q = _find(b, b" ", p, e)
        ev["topic"], ev["sub_string"], ev["expression_type"], ev["sub_version"], _ = _sd(b, q + 1, e)
    else:
        raise _Malformed


def _m_consumer_data_4(b, p, e, ev):
    q = _consumer_data(b, p, e, ev)
    q = _expect(b, b" ", q, e)
    ev["addr"] = _nonempty(b, q, e)


def _m_consumer_data_5(b, p, e, ev):
    q = _find(b, b", consumerData=", p, e)
    ev["addr"] = _nonempty(b, p, q)
    _consumer_data(b, q + 15, e, ev)


def _m_unregister(tail):
    def parse(b, p, e, ev):
        q = _find(b, tail, p, e)
        ev["group"] = _nonempty(b, p, q)
        _cci(b, q + len(tail), e, ev)
    return parse


def _m_producer_group_removed(b, p, e, ev):
    q = _find(b, b"] from groupChannelTable", p, e)
    if q + 24 != e:
        raise _Malformed
    ev["group"] = _nonempty(b, p, q)


def _m_netty_producer(b, p, e, ev):
    q = _cci(b, p, e, ev)
    q = _expect(b, b"][", q, e)
    tail = b"] from ProducerManager groupChannelTable, producer group: "
    r = _find(b, tail, q, e)
    ev["addr"] = _nonempty(b, q, r)
    ev["group"] = _nonempty(b, r + len(tail), e)


def _m_netty_consumer(b, p, e, ev):
    q = _cci(b, p, e, ev)
    q = _expect(b, b"] from ConsumerGroupInfo groupChannelTable, consumer group: ", q, e)
    ev["group"] = _nonempty(b, q, e)


def _m_scan_producer(b, p, e, ev):
    tail = b"] from ProducerManager groupChannelTable, producer group name: "
    q = _find(b, tail, p, e)
    ev["addr"] = _nonempty(b, p, q)
    ev["group"] = _nonempty(b, q + len(tail), e)


def _m_scan_consumer(b, p, e, ev):
    q = _find(b, b", consumerGroup=", p, e)
    ev["addr"] = _nonempty(b, p, q)
    ev["group"] = _nonempty(b, q + 16, e)


def _m_broker_boot(b, p, e, ev):
    """``The broker[NAME, ADDR] boot success. ...`` (BrokerStartup): group = the broker's name, addr = its address."""
    q = _find(b, b"] boot success", p, e)
    c = _find(b, b", ", p, q)
    ev["group"] = _nonempty(b, p, c)
    ev["addr"] = _nonempty(b, c + 2, q)


def _m_nothing(b, p, e, ev):
    pass


def _m_group_cfg(b, p, e, ev):
    _group_cfg(b, p, e, ev)


#: (message prefix, kind, role, parser(line, start of the rest, end, event)); the first matching prefix wins.
MESSAGES = (
    (b"new consumer connected, group: ", b"register", b"consumer", _m_new_consumer),
    (b"new producer connected, group: ", b"register", b"producer", _m_new_producer),
    (b"subscription changed, add new topic, group: ", b"sub_add", b"consumer", _m_sub_add),
    (b"subscription changed, group: ", b"sub_change", b"consumer", _m_sub_changed),
    (b"registerConsumer info changed ", b"consumer_data", b"consumer", _m_consumer_data_4),
    (b"ClientManageProcessor: registerConsumer info changed, SDK address=", b"consumer_data", b"consumer",
     _m_consumer_data_5),
    (b"heartBeatV2 ClientManageProcessor: registerConsumer info changed, SDK address=", b"consumer_data",
     b"consumer", _m_consumer_data_5),
    (b"unregister a consumer[", b"unregister", b"consumer", _m_unregister(b"] from consumerGroupInfo ")),
    (b"unregister a producer[", b"unregister", b"producer", _m_unregister(b"] from groupChannelTable ")),
    (b"unregister a producer group[", b"group_removed", b"producer", _m_producer_group_removed),
    (b"unregister consumer ok, no any connection, and remove consumer group, ", b"group_removed", b"consumer",
     _rest_group),
    (b"NETTY EVENT: remove channel[", b"closed", b"producer", _m_netty_producer),
    (b"NETTY EVENT: remove not active channel[", b"closed", b"consumer", _m_netty_consumer),
    (b"SCAN: remove expired channel[", b"expired", b"producer", _m_scan_producer),
    (b"ProducerManager#scanNotActiveChannel: remove expired channel[", b"expired", b"producer", _m_scan_producer),
    (b"SCAN: remove expired channel from ConsumerManager consumerTable. channel=", b"expired", b"consumer",
     _m_scan_consumer),
    (b"SCAN: remove expired channel from ConsumerManager consumerTable, all clear, consumerGroup=", b"group_cleared",
     b"consumer", _rest_group),
    (b"SCAN: remove expired channel from ProducerManager groupChannelTable, all clear, group=", b"group_cleared",
     b"producer", _rest_group),
    (b"[BUG] consumer channel exist in broker, but clientId not equal. GROUP: ", b"client_changed", b"consumer",
     _m_client_changed(b" OLD: ", b" NEW: ")),
    (b"ConsumerGroupInfo: consumer channel exists in broker, but clientId is not the same one, group=",
     b"client_changed", b"consumer", _m_client_changed(b", old clientChannelInfo=", b", new clientChannelInfo=")),
    (b"auto create a subscription group, ", b"group_created", b"consumer", _m_group_cfg),
    (b"create new subscription group, ", b"group_created", b"consumer", _m_group_cfg),
    (b"delete subscription group OK, subscription group:", b"group_deleted", b"consumer", _m_group_cfg),
    # the broker's own life (BrokerStartup): the first line of a start (MixAll.printObjectProperties of its
    # BrokerConfig, whose first field is rocketmqHome), the start done, the JVM's shutdown hook
    (b"rocketmqHome=", b"broker_start", b"broker", _m_nothing),
    (b"The broker[", b"broker_boot", b"broker", _m_broker_boot),
    (b"Shutdown hook was invoked, ", b"broker_stop", b"broker", _m_nothing),
)


# --- the line header ---------------------------------------------------------------------------------------------


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


_DIGIT_POS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18)
_SEP_POS = ((4, 0x2D), (7, 0x2D), (10, 0x20), (13, 0x3A), (16, 0x3A))


def _header(b, e):
    """(local wall-clock ms, start of the message) or None when the line has no ``timestamp ... - `` header."""
    if e < 19:
        return None
    for i in _DIGIT_POS:
        if not 0x30 <= b[i] <= 0x39:
            return None
    for i, c in _SEP_POS:
        if b[i] != c:
            return None

    def num(i, n):
        v = 0
        for k in range(i, i + n):
            v = v * 10 + b[k] - 0x30
        return v

    y, mo, d, hh, mi, ss = num(0, 4), num(5, 2), num(8, 2), num(11, 2), num(14, 2), num(17, 2)
    if not (1 <= mo <= 12 and 1 <= d <= 31 and hh <= 23 and mi <= 59 and ss <= 60):
        return None
    p, ms = 19, 0
    if p + 4 <= e and b[p] in (0x2C, 0x2E) and all(0x30 <= b[k] <= 0x39 for k in range(p + 1, p + 4)):
        ms = num(p + 1, 3)
        p += 4
    if p >= e or b[p] != 0x20:
        return None
    q = b.find(b" - ", p, e)
    if q < 0:
        return None
    return ((days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss) * 1000 + ms), q + 3


# --- the batch ---------------------------------------------------------------------------------------------------


def _lines_of(lines):
    """list of bytes of a batch of lines (pyarrow array or list of str/bytes); nulls become empty lines."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow is in the spark extra
        pa = None
    if pa is not None and isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    if pa is not None and isinstance(lines, pa.Array):
        t = lines.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            raise BrokerLogError(f"log lines must be a string or binary array, not {echo(str(t))}")
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return [b"" if v is None else v.encode("utf-8", "surrogatepass") for v in lines.to_pylist()]
        return [b"" if v is None else v for v in lines.to_pylist()]
    if not isinstance(lines, (list, tuple)):
        raise BrokerLogError(f"log lines must be a pyarrow array or a list, not {echo(type(lines).__name__)}")
    out = []
    for i, v in enumerate(lines):
        if isinstance(v, str):
            out.append(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, (bytes, bytearray, memoryview)):
            out.append(bytes(v))
        elif v is None:
            out.append(b"")
        else:
            raise BrokerLogError(f"log line {i} is a {echo(type(v).__name__)}, not str or bytes")
    return out


def _strip_eol(b):
    e = len(b)
    while e and b[e - 1] in (0x0A, 0x0D):
        e -= 1
    return e


#: texts only the client-management statements write (ClientChannelInfo.toString(), the producer / consumer tables,
#: ConsumerGroupInfo's and ClientManageProcessor's wording): a line holding one that no MESSAGES prefix matches is
#: counted as ``unknown_client_message`` (with an example), not "other"
CLIENT_NEEDLES = (b"ClientChannelInfo [", b"groupChannelTable", b"consumerTable", b"subscription changed",
                  b"registerConsumer")


def _ident(c) -> bool:
    return 0x30 <= c <= 0x39 or 0x41 <= c <= 0x5A or 0x61 <= c <= 0x7A or c in (0x5F, 0x24)


def is_continuation(b, e) -> bool:
    """A header-less line that belongs to the log entry before it: white space first (``\tat ...``, ``\t...
    N more``), ``Caused by: ``, or a Java throwable's first line (``java.nio.channels.ClosedChannelException: null``:
    a dotted class name, then the end of the line or ``:``)."""
    if b[0] in (0x20, 0x09) or b.startswith(b"Caused by: ", 0, e):
        return True
    i, dots = 0, 0
    while i < e:
        c = b[i]
        if c == 0x2E:
            if i == 0 or b[i - 1] == 0x2E:
                return False
            dots += 1
        elif not _ident(c):
            break
        i += 1
    return dots > 0 and b[i - 1] != 0x2E and (i == e or b[i] == 0x3A)


def _example(b) -> str:
    return b[:EXAMPLE_CHARS].decode("utf-8", "replace")


def parse_lines(lines, base_line: int = 0):
    """(events RecordBatch, stats) of one batch of broker-log lines; ``line`` = base_line + index in the batch.

    stats = ``{"lines": n, "events": k, "counts": {category: n}, "examples": {category: first line}}``; counts
    hold the events per kind too (``event_<kind>``)."""
    import pyarrow as pa

    if isinstance(base_line, bool) or not isinstance(base_line, int):
        raise BrokerLogError("base_line must be an int")
    data = _lines_of(lines)
    cols = {n: [] for n, _ in EVENT_COLUMNS}
    counts: dict = {}
    examples: dict = {}

    def count(cat, b):
        counts[cat] = counts.get(cat, 0) + 1
        if cat != "other" and cat not in examples:
            examples[cat] = _example(b)

    for idx, b in enumerate(data):
        e = _strip_eol(b)
        if e == 0:
            count("blank", b[:e])
            continue
        h = _header(b, e)
        if h is None:
            count("continuation" if is_continuation(b, e) else "unknown_format", b[:e])
            continue
        ts, p = h
        for prefix, kind, role, fn in MESSAGES:
            if b.startswith(prefix, p):
                break
        else:
            # not a known message: a client-management line in a form the parser does not know (another
            # version's wording) is listed with an example, the rest (pulls, store, Netty errors) is "other"
            if any(b.find(n, p, e) >= 0 for n in CLIENT_NEEDLES):
                count("unknown_client_message", b[:e])
            else:
                count("other", b)
            continue
        try:  # checked first: every field of an event is valid text
            b[:e].decode("utf-8")
        except UnicodeDecodeError:
            count("invalid_utf8", b[:e])
            continue
        ev = {"kind": kind, "role": role}
        try:
            fn(b, p + len(prefix), e, ev)
        except _Malformed:
            count("malformed_" + kind.decode(), b[:e])
            continue
        ev["ts_ms"] = ts
        ev["line"] = base_line + idx
        kname = "event_" + ev["kind"].decode()
        counts[kname] = counts.get(kname, 0) + 1
        for n in STRING_COLUMNS:
            v = ev.get(n)
            cols[n].append(None if v is None else v.decode("utf-8"))
        for n in INT_COLUMNS:
            cols[n].append(ev.get(n))
    batch = pa.RecordBatch.from_arrays([pa.array(cols[n], getattr(pa, t)()) for n, t in EVENT_COLUMNS],
                                       schema=event_schema())
    stats = {"lines": len(data), "events": batch.num_rows, "counts": dict(sorted(counts.items())),
             "examples": dict(sorted(examples.items()))}
    return batch, stats


def line_ends(data):
    """int64 numpy array of the offsets just past each b"\\n" in ``data`` (any buffer of bytes): where the lines
    of a chunk of a log file end."""
    import numpy as np

    arr = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    return (np.flatnonzero(arr == 10) + 1).astype(np.int64)


def merge_stats(a: dict, b: dict) -> dict:
    """Sum of two stats dicts (examples: the first one seen; ``damage``, the readers' damage entries: both)."""
    counts = dict(a.get("counts", {}))
    for k, v in b.get("counts", {}).items():
        counts[k] = counts.get(k, 0) + v
    examples = dict(b.get("examples", {}))
    examples.update(a.get("examples", {}))
    out = {"lines": a.get("lines", 0) + b.get("lines", 0), "events": a.get("events", 0) + b.get("events", 0),
           "counts": dict(sorted(counts.items())), "examples": dict(sorted(examples.items()))}
    damage = list(a.get("damage", [])) + list(b.get("damage", []))
    if damage:
        out["damage"] = damage
    return out

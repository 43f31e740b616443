"""The client-management lines of a RocketMQ broker's ``broker.log``, with Java's wording and fields.

Java's ConsumerManager / ConsumerGroupInfo / ProducerManager / ClientManageProcessor / SubscriptionGroupManager
log every registration change to the logger ``RocketmqBroker`` (LoggerName.BROKER_LOGGER_NAME): "new consumer
connected", "subscription changed", "registerConsumer info changed", "new producer connected", "unregister ...",
"NETTY EVENT: remove ...", "SCAN: remove expired channel ...", "auto create a subscription group". Operators watch
them and tools read them (``rmqhb scan`` of broker logs among them, :mod:`engine.recording._brokerlog`), so this broker writes
the same lines, with the same ``toString()`` texts (ClientChannelInfo, SubscriptionData, ConsumerData,
SubscriptionGroupConfig), to a logger of the same name. The wording is 4.9.x's, and 5.x's where 5.x changed it
(``clientManagementRules=5``). ``rmqhb serve`` formats lines as logback's broker pattern (``%d %p %t - %m``, with
the logger's name where Java has the thread), so one parser reads both brokers' logs.

A client decides how often these lines come (connect, subscribe, close, in a loop), so they have a budget: at most
``clientManageLogLinesPerMinute`` lines of each kind a minute; past it the lines are counted, and the next line of
the kind is preceded by one line saying how many were left out. Client-supplied texts are clipped.
"""
from __future__ import annotations

import logging
import time

from engine.codec.errors import clip

#: LoggerName.BROKER_LOGGER_NAME
LOGGER_NAME = "RocketmqBroker"
log = logging.getLogger(LOGGER_NAME)

#: longest client-supplied text (a client id, a group, a topic, an expression) written into a line
MAX_FIELD = 512
#: most subscriptions a ConsumerData text lists (the broker-log parser's own limit)
MAX_SUBS = 256


class ClientEventLog:
    """The budget: ``allow(kind, level)`` says whether a line of ``kind`` may be written now."""

    def __init__(self, per_minute: int = 6000, clock=time.monotonic, interval_s: float = 60.0):
        self.per_minute = per_minute
        self.clock = clock
        self.interval_s = interval_s
        self._windows: dict = {}  # kind -> [window start, lines written, lines left out]
        self.left_out = 0  # every line left out so far

    def allow(self, kind: str, level: int) -> bool:
        if not log.isEnabledFor(level):
            return False
        now = self.clock()
        w = self._windows.get(kind)
        if w is None or now - w[0] >= self.interval_s:
            if w is not None and w[2]:
                log.warning("client-management log budget: %d '%s' lines left out in the last %.0f s "
                            "(clientManageLogLinesPerMinute=%d)", w[2], kind, self.interval_s, self.per_minute)
            w = self._windows[kind] = [now, 0, 0]
        if w[1] >= self.per_minute:
            w[2] += 1
            self.left_out += 1
            return False
        w[1] += 1
        return True


def _text(value) -> str:
    return "null" if value is None else clip(str(value), MAX_FIELD)


def _enum(value) -> str:
    return "null" if value is None else getattr(value, "name", str(value))


def _bool(value) -> str:
    return "true" if value else "false"


def netty_channel(channel) -> str:
    """Netty's Channel.toString(): ``[id: 0x0000002a, L:/127.0.0.1:10911 - R:/127.0.0.1:58188]`` (``!`` instead
    of ``-`` once the channel is inactive); a channel that is not a connection prints as itself."""
    cid = getattr(channel, "id", None)
    remote = getattr(channel, "remote_addr", None)
    if not isinstance(cid, int) or not isinstance(remote, str):
        return _text(channel)
    local = f"{getattr(channel, 'local_ip', '') or ''}:{getattr(channel, 'local_port', 0) or 0}"
    state = "!" if getattr(channel, "closing", False) else "-"
    return f"[id: 0x{cid & 0xFFFFFFFF:08x}, L:/{local} {state} R:/{remote}]"


def client_channel_info(channel, client_id, language, version, last_update_ms: int) -> str:
    """ClientChannelInfo.toString()."""
    return (f"ClientChannelInfo [channel={netty_channel(channel)}, clientId={_text(client_id)}, "
            f"language={_enum(language)}, version={version}, lastUpdateTimestamp={last_update_ms}]")


def subscription_data(sd) -> str:
    """SubscriptionData.toString() (tagsSet and codeSet as Java prints a Set)."""
    tags = ", ".join(_text(t) for t in sd.tags)
    codes = ", ".join(str(c) for c in sd.codes)
    return (f"SubscriptionData [classFilterMode={_bool(sd.class_filter_mode)}, topic={_text(sd.topic)}, "
            f"subString={_text(sd.sub_string)}, tagsSet=[{tags}], codeSet=[{codes}], subVersion={sd.sub_version}, "
            f"expressionType={_text(sd.expression_type)}]")


def consumer_data(cd) -> str:
    """ConsumerData.toString()."""
    subs = ", ".join(subscription_data(sd) for sd in list(cd.subscriptions)[:MAX_SUBS])
    if len(cd.subscriptions) > MAX_SUBS:
        subs += ", ..."
    return (f"ConsumerData [groupName={_text(cd.group)}, consumeType={_enum(cd.consume_type)}, "
            f"messageModel={_enum(cd.message_model)}, consumeFromWhere={_enum(cd.consume_from_where)}, "
            f"unitMode={_bool(cd.unit_mode)}, subscriptionDataSet=[{subs}]]")


def subscription_group_config(sgc) -> str:
    """SubscriptionGroupConfig.toString() of 4.9.x."""
    return (f"SubscriptionGroupConfig [groupName={_text(sgc.group_name)}, consumeEnable={_bool(sgc.consume_enable)}, "
            f"consumeFromMinEnable={_bool(sgc.consume_from_min_enable)}, "
            f"consumeBroadcastEnable={_bool(sgc.consume_broadcast_enable)}, retryQueueNums={sgc.retry_queue_nums}, "
            f"retryMaxTimes={sgc.retry_max_times}, brokerId={sgc.broker_id}, "
            f"whichBrokerWhenConsumeSlowly={sgc.which_broker_when_consume_slowly}, "
            f"notifyConsumerIdsChangedEnable={_bool(sgc.notify_consumer_ids_changed_enable)}]")


class JavaLogFormatter(logging.Formatter):
    """logback's broker pattern ``yyyy-MM-dd HH:mm:ss,SSS LEVEL NAME - message`` (Java's level names: WARN; the
    logger's name where Java has the thread's)."""

    _LEVELS = {"WARNING": "WARN", "CRITICAL": "ERROR"}

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s - %(message)s")

    def format(self, record):
        original = record.levelname
        record.levelname = self._LEVELS.get(original, original)
        try:
            return super().format(record)
        finally:
            record.levelname = original

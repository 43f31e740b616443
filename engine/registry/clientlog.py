"""The client-management lines of a RocketMQ broker's ``broker.log``, with Java's wording and fields.

Java's ConsumerManager / ConsumerGroupInfo / ProducerManager / ClientManageProcessor / SubscriptionGroupManager
log every registration change to the logger ``RocketmqBroker`` (LoggerName.BROKER_LOGGER_NAME): "new consumer
connected", "subscription changed", "registerConsumer info changed", "new producer connected", "unregister ...",
"NETTY EVENT: remove ...", "SCAN: remove expired channel ...", "auto create a subscription group". Operators watch
them and tools read them (``rmqhb scan`` of broker logs among them, :mod:`engine.recording._brokerlog`), so this broker writes
the same lines, with the same ``toString()`` texts (ClientChannelInfo, SubscriptionData, ConsumerData,
SubscriptionGroupConfig), to a logger of the same name. The wording is 4.9.x's, and 5.x's where 5.x changed it
(``clientManagementRules=5``). ``rmqhb serve`` formats lines as logback's broker pattern (``%d %p %t - %m``, with
the logger's name where Java has the thread), so one parser reads both brokers' logs; with ``logFormat=java`` it
writes 4.9.8's pattern itself (:class:`JavaBrokerFormatter`: whole seconds, GMT+8, the Java thread of each task,
:class:`JavaThreads`), and with ``logDir`` a ``broker.log`` rolled as logback's appender rolls it
(:class:`BrokerLogFile`).

A client decides how often these lines come (connect, subscribe, close, in a loop) and how long they are (a
heartbeat of a million tags), so they have a budget: at most ``clientManageLogLinesPerMinute`` lines of each kind
and ``clientManageLogBytesPerMinute`` bytes of all kinds together a minute; past it the lines are counted, and the
next line of the kind is preceded by one line saying how many were left out. Client-supplied texts are clipped
(each to :data:`MAX_FIELD` characters, a printed set to its first :data:`MAX_SET_ELEMENTS` elements and
``... (N more)``) and their control characters escaped (:func:`engine.logutil.escape_text`): a client id holding
a newline cannot write a line of its own into ``broker.log``, nor an ESC reach the terminal of whoever reads it.
"""
from __future__ import annotations

import errno
import itertools
import logging
import logging.handlers
import os
import stat
import sys
import tempfile
import threading
import time

from engine.codec.enums import RequestCode
from engine.logutil import EscapingFormatter, clip, escape_text

#: LoggerName.BROKER_LOGGER_NAME
LOGGER_NAME = "RocketmqBroker"
log = logging.getLogger(LOGGER_NAME)

#: longest client-supplied text (a client id, a group, a topic, an expression) written into a line
MAX_FIELD = 512
#: most subscriptions a ConsumerData text lists (the broker-log parser's own limit)
MAX_SUBS = 256
#: most elements a printed set (tagsSet, codeSet) shows; the rest are counted: ``[a, b, ... (N more)]``
MAX_SET_ELEMENTS = 16
#: default of clientManageLogBytesPerMinute
BYTES_PER_MINUTE = 32 << 20


class ClientEventLog:
    """The budget: ``allow(kind, level)`` says whether a line of ``kind`` may be written now; the line the caller
    then writes to :data:`log` is charged to the byte budget (and escaped) by the logger's filter. ``log()`` writes
    a line of another logger within the same budget."""

    def __init__(self, per_minute: int = 6000, clock=time.monotonic, interval_s: float = 60.0,
                 bytes_per_minute: int = BYTES_PER_MINUTE):
        self.per_minute = per_minute
        self.bytes_per_minute = bytes_per_minute
        self.clock = clock
        self.interval_s = interval_s
        self._windows: dict = {}  # kind -> [window start, lines written, lines left out]
        self._bytes = [0.0, 0]  # [window start, bytes written in it], all kinds together
        self.left_out = 0  # every line left out so far
        self.bytes_written = 0  # every byte of the lines written so far

    def allow(self, kind: str, level: int, logger: logging.Logger = None) -> bool:
        if not (log if logger is None else logger).isEnabledFor(level):
            return False
        now = self.clock()
        w = self._windows.get(kind)
        if w is None or now - w[0] >= self.interval_s:
            if w is not None and w[2]:
                log.warning("client-management log budget: %d '%s' lines left out in the last %.0f s "
                            "(clientManageLogLinesPerMinute=%d, clientManageLogBytesPerMinute=%d)", w[2], kind,
                            self.interval_s, self.per_minute, self.bytes_per_minute)
            w = self._windows[kind] = [now, 0, 0]
        b = self._bytes
        if now - b[0] >= self.interval_s:
            b[0], b[1] = now, 0
        if w[1] >= self.per_minute or b[1] >= self.bytes_per_minute:
            w[2] += 1
            self.left_out += 1
            return False
        w[1] += 1
        if logger is None:
            _pending.charge = (self, kind)  # the filter charges the line the caller writes next
        return True

    def charge(self, kind: str, text: str) -> bool:
        """Count a line's bytes; False (the line is left out and counted) when they do not fit the minute's."""
        n = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
        b = self._bytes
        if b[1] + n > self.bytes_per_minute:
            w = self._windows.get(kind)
            if w is not None:
                w[1] -= 1
                w[2] += 1
            self.left_out += 1
            return False
        b[1] += n
        self.bytes_written += n
        return True

    def log(self, logger: logging.Logger, level: int, kind: str, msg: str, *args) -> bool:
        """One line of ``logger`` (not this module's) within this budget, its arguments clipped and escaped as
        client texts; True when it was written."""
        if not self.allow(kind, level, logger):
            return False
        text = msg % tuple(a if a is None or isinstance(a, (int, float)) else _text(a) for a in args)
        if not self.charge(kind, text):
            return False
        logger.log(level, "%s", text)
        return True


class _ChargeFilter(logging.Filter):
    """On :data:`log`: every line has its control characters escaped, and the line an ``allow()`` let through is
    charged to that budget's bytes (refused when they do not fit)."""

    def filter(self, record) -> bool:
        pending, _pending.charge = getattr(_pending, "charge", None), None
        text = escape_text(record.getMessage())
        record.msg, record.args = text, None
        return pending is None or pending[0].charge(pending[1], text)


_pending = threading.local()
log.addFilter(_ChargeFilter())


def _text(value) -> str:
    """A client's text in a line: control characters escaped, clipped to MAX_FIELD characters."""
    if value is None:
        return "null"
    return clip(escape_text(clip(value if isinstance(value, str) else str(value), MAX_FIELD)), MAX_FIELD)


def _enum(value) -> str:
    return "null" if value is None else _text(getattr(value, "name", value))


def _java_set(values) -> str:
    """A Set as Java prints it, ``[a, b]``, with its first MAX_SET_ELEMENTS elements and ``... (N more)``."""
    shown = ", ".join(_text(v) for v in itertools.islice(values, MAX_SET_ELEMENTS))  # no copy of a huge set
    if len(values) > MAX_SET_ELEMENTS:
        shown += f", ... ({len(values) - MAX_SET_ELEMENTS} more)"
    return f"[{shown}]"


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
    """SubscriptionData.toString() (tagsSet and codeSet as Java prints a Set, clipped: :func:`_java_set`)."""
    return (f"SubscriptionData [classFilterMode={_bool(sd.class_filter_mode)}, topic={_text(sd.topic)}, "
            f"subString={_text(sd.sub_string)}, tagsSet={_java_set(sd.tags)}, codeSet={_java_set(sd.codes)}, "
            f"subVersion={_text(sd.sub_version)}, expressionType={_text(sd.expression_type)}]")


def consumer_data(cd) -> str:
    """ConsumerData.toString()."""
    subs = ", ".join(subscription_data(sd) for sd in list(cd.subscriptions)[:MAX_SUBS])
    if len(cd.subscriptions) > MAX_SUBS:
        subs += f", ... ({len(cd.subscriptions) - MAX_SUBS} more)"
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


def perm_to_string(perm: int) -> str:
    """PermName.perm2String: ``RWX`` with ``-`` for each of read (4), write (2), inherit (1) not set."""
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-") + ("X" if perm & 1 else "-")


def topic_config(tc) -> str:
    """TopicConfig.toString() (4.9.8)."""
    return (f"TopicConfig [topicName={_text(tc.topic_name)}, readQueueNums={tc.read_queue_nums}, "
            f"writeQueueNums={tc.write_queue_nums}, perm={perm_to_string(tc.perm)}, "
            f"topicFilterType={_text(tc.topic_filter_type)}, topicSysFlag={tc.topic_sys_flag}, "
            f"order={_bool(tc.order)}]")


# ---------------------------------------------------------------------------------------------------------------
# logFormat=java: the thread names of a 4.9.8 broker's lines

_CPUS = os.cpu_count() or 1
#: BrokerController's executors of 4.9.8: ThreadFactoryImpl's prefix -> the pool's size (BrokerConfig's default
#: *ThreadPoolNums); a pool's N-th task runs on thread N while the pool grows, then they take turns
JAVA_POOLS = {
    "SendMessageThread_": min(_CPUS, 4),
    "PullMessageThread_": 16 + 2 * _CPUS,
    "HeartbeatThread_": min(32, _CPUS),
    "ClientManageThread_": 32,
    "ConsumerManageThread_": 32,
    "AdminBrokerThread_": 16,
}
#: the remoting server's channel-event thread (NettyRemotingAbstract.NettyEventExecutor, a ServiceThread named by
#: its class): ClientHousekeepingService.onChannelClose runs there
NETTY_EVENT_EXECUTOR = "NettyEventExecutor"
#: ClientHousekeepingService's single scheduled thread (ThreadFactoryImpl, no underscore): the expiry scan
CLIENT_HOUSEKEEPING_THREAD = "ClientHousekeepingScheduledThread1"
#: BrokerController.registerProcessor: the executor prefix of each request code; every
#: other code goes to the default processor, AdminBrokerProcessor, on adminBrokerExecutor
JAVA_EXECUTOR_OF_CODE = {
    **dict.fromkeys((RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
                     RequestCode.CONSUMER_SEND_MSG_BACK), "SendMessageThread_"),
    RequestCode.PULL_MESSAGE: "PullMessageThread_",
    RequestCode.HEART_BEAT: "HeartbeatThread_",
    **dict.fromkeys((RequestCode.UNREGISTER_CLIENT, RequestCode.CHECK_CLIENT_CONFIG), "ClientManageThread_"),
    **dict.fromkeys((RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.UPDATE_CONSUMER_OFFSET,
                     RequestCode.QUERY_CONSUMER_OFFSET), "ConsumerManageThread_"),
}


class JavaThreads:
    """Which thread of a 4.9.8 broker would have written a line: the broker runs one event loop, so the thread is
    a name given to each task (a request, a channel close, an expiry pass) as Java's executors would run it. A
    task's lines carry its name (:meth:`task`, per OS thread); a line outside any task carries the Python thread's
    name (``MainThread`` as Java's ``main``)."""

    def __init__(self, pools: dict = JAVA_POOLS):
        self.pools = dict(pools)
        self._tasks: dict = {}  # prefix -> tasks run so far
        self._local = threading.local()

    def draw(self, prefix: str) -> str:
        """The thread of the next task of the pool ``prefix`` (a single thread's name is itself)."""
        size = self.pools.get(prefix)
        if size is None:
            return prefix
        n = self._tasks.get(prefix, 0)
        self._tasks[prefix] = n + 1
        return f"{prefix}{n % size + 1}"

    def current(self):
        return getattr(self._local, "name", None)

    def run(self, prefix: str, fn, *args):
        """``fn(*args)`` as a task of ``prefix``: its lines carry the thread drawn for it."""
        local = self._local
        outer = getattr(local, "name", None)
        local.name = self.draw(prefix)
        try:
            return fn(*args)
        finally:
            local.name = outer

    def handler(self, code: int, handler):
        """A processor-table handler whose lines carry the thread of ``code``'s executor."""
        prefix = JAVA_EXECUTOR_OF_CODE.get(int(code), "AdminBrokerThread_")

        def run_on_java_thread(conn, cmd):
            return self.run(prefix, handler, conn, cmd)

        return run_on_java_thread


#: the broker's tasks' thread names (one loop per process)
java_threads = JavaThreads()


def java_time(created: float) -> str:
    """logback's ``%d{yyy-MM-dd HH:mm:ss,GMT+8}``: whole seconds (the comma ends the pattern: what follows is
    the zone), in GMT+8 whatever the machine's zone; ``yyy`` pads the year to three digits."""
    t = time.gmtime(int(created) + 8 * 3600)
    return f"{t.tm_year:03d}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"


class JavaLogFormatter(EscapingFormatter):
    """logback's broker pattern ``yyyy-MM-dd HH:mm:ss,SSS LEVEL NAME - message`` (Java's level names: WARN; the
    logger's name where Java has the thread's); every message's control characters escaped: one record, one line."""

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


class JavaBrokerFormatter(EscapingFormatter):
    """``logFormat=java``: the pattern of 4.9.8's ``logback_broker.xml`` appenders, ``%d{yyy-MM-dd
    HH:mm:ss,GMT+8} %p %t - %m%n`` (no milliseconds, GMT+8, Java's level names, the thread's name: the task's
    Java thread, :data:`java_threads`); every message's control characters escaped: one record, one line."""

    _LEVELS = JavaLogFormatter._LEVELS

    def __init__(self, threads: JavaThreads = None):
        super().__init__("%(message)s")
        self.threads = java_threads if threads is None else threads

    def format(self, record):
        thread = getattr(record, "java_thread", None)
        if thread is None:
            thread = self.threads.current()
            if thread is None:
                thread = "main" if record.threadName == "MainThread" else escape_text(record.threadName)
            record.java_thread = thread  # a second handler of the record prints the same thread
        level = self._LEVELS.get(record.levelname, record.levelname)
        return f"{java_time(record.created)} {level} {thread} - {super().format(record)}"


#: logback_broker.xml's RocketmqBrokerAppender: SizeBasedTriggeringPolicy maxFileSize (128MB) and
#: FixedWindowRollingPolicy maxIndex (20): broker.log rolls at this size into otherdays/broker.1.log.gz (older ones
#: shift to .2 ... .20, the 21st is deleted), so the log never holds more than about 128 MiB plus 20 compressed files
BROKER_LOG_MAX_BYTES = 128 << 20
BROKER_LOG_MAX_INDEX = 20


class BrokerLogFile(logging.handlers.RotatingFileHandler):
    """``<logDir>/broker.log`` rolled as logback's RocketmqBrokerAppender rolls it: at :data:`BROKER_LOG_MAX_BYTES`
    the file becomes ``<logDir>/otherdays/broker.1.log.gz`` (gzip, as ``%i.log.gz`` tells logback), older ones
    shift up to :data:`BROKER_LOG_MAX_INDEX` and the oldest goes. Never opened through a symlink (O_NOFOLLOW: a
    ``broker.log`` linked to another file is refused at start); a rolled file is compressed into a private temp
    file in ``otherdays`` and renamed into place, by a thread (the loop does not wait for 128 MiB of gzip; the
    next roll waits for it)."""

    def __init__(self, log_dir, max_bytes: int = BROKER_LOG_MAX_BYTES, max_index: int = BROKER_LOG_MAX_INDEX):
        self.log_dir = os.path.abspath(os.fspath(log_dir))
        self.otherdays = os.path.join(self.log_dir, "otherdays")
        os.makedirs(self.otherdays, exist_ok=True)
        self._compressing = None
        super().__init__(os.path.join(self.log_dir, "broker.log"), maxBytes=max_bytes, backupCount=max_index,
                         encoding="utf-8", delay=False)

    def _open(self):
        # O_NONBLOCK: a FIFO named broker.log fails (ENXIO) or is refused below instead of blocking the broker
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", self.baseFilename)
        return os.fdopen(fd, "a", encoding="utf-8", errors=self.errors)

    def shouldRollover(self, record) -> bool:
        # logback's SizeBasedTriggeringPolicy: the file's size before the line (the line is not formatted twice)
        if self.stream is None:
            self.stream = self._open()
        return self.stream.tell() >= self.maxBytes

    def rotation_filename(self, default_name: str) -> str:
        # RotatingFileHandler's broker.log.N -> logback's otherdays/broker.N.log.gz
        return os.path.join(self.otherdays, f"broker.{default_name.rsplit('.', 1)[1]}.log.gz")

    def doRollover(self):
        if self._compressing is not None:
            self._compressing.join()  # the previous roll's file is in place before the files shift
            self._compressing = None
        super().doRollover()

    def rotate(self, source: str, dest: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".broker-rolling-", dir=self.otherdays)
        os.close(fd)
        os.replace(source, tmp)  # the live file is free at once; the next line opens a new broker.log
        self._compressing = threading.Thread(target=_gzip_into, args=(tmp, dest), name="BrokerLogRolling",
                                             daemon=True)
        self._compressing.start()

    def close(self):
        if self._compressing is not None:
            self._compressing.join()
        super().close()


def _gzip_into(source: str, dest: str) -> None:
    """``source`` (a private temp file) gzipped into ``dest`` through another temp file renamed over it."""
    import gzip
    import shutil

    fd, tmp = tempfile.mkstemp(prefix=".broker-gz-", dir=os.path.dirname(dest))
    try:
        src_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(src_fd, "rb") as src, os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as gz:
            shutil.copyfileobj(src, gz, 1 << 20)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        os.unlink(source)
    except OSError as e:
        # not a log line: this thread must not wait for the handler's lock, which the roll holds while it joins
        sys.stderr.write(escape_text(f"rolling broker.log into {dest} failed (kept as {source}): {e}") + "\n")
        try:
            os.unlink(tmp)
        except OSError:
            pass

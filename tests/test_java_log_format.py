"""logFormat=java (issue 27 §4): broker.log as 4.9.8's logback_broker.xml writes it (``%d{yyy-MM-dd HH:mm:ss,GMT+8}
%p %t - %m%n``: whole seconds, GMT+8, the thread's name), Java's toString() of TopicConfig and
SubscriptionGroupConfig, the getConsumerGroupInfo WARN; and the broker-log scan of our own log in that format finds
what the scan of the recording of the same run finds."""
import calendar
import logging
import re
import time

import pytest

from engine.broker.config import BrokerConfig, ConfigError
from engine.broker.controller import Broker
from engine.codec.enums import RequestCode
from engine.recording.scan_py import ScanParams, scan
from engine.registry import clientlog
from engine.registry.subscription_group_manager import SubscriptionGroupConfig
from engine.registry.topic_config_manager import TopicConfig

from conftest import SHARED, require_module
from test_server import Client, hb_body, make_config, wait_until

SAMPLE = SHARED / "samples" / "rocketmq-4.9.8-broker.log"
#: the shape of every line of the real 4.9.8 broker.log that starts a record
JAVA_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (INFO|WARN|ERROR|DEBUG) (\S+) - ")


def sample_lines():
    return [line for line in SAMPLE.read_text().splitlines() if line[:1].isdigit()]


def record(level, msg, *args, created=None, thread="MainThread"):
    r = logging.LogRecord(clientlog.LOGGER_NAME, level, __file__, 1, msg, args, None)
    if created is not None:
        r.created = created
    r.threadName = thread
    return r


def epoch_of_gmt8(text: str) -> int:
    """The epoch second a GMT+8 wall-clock time stands for."""
    return calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")) - 8 * 3600


# ---------------------------------------------------------------------------------------------------------------
# the line prefix


def test_prefix_is_the_sample_logs_whatever_the_machines_zone(monkeypatch):
    """A line of the real 4.9.8 log (its ConsumerManageThread WARN) comes out byte for byte: whole seconds (the
    millisecond part of the record is dropped), GMT+8 under any local zone, WARN, the task's Java thread."""
    java = next(line for line in sample_lines() if "getConsumerGroupInfo failed" in line)
    when = java[:19]
    for tz in ("UTC", "America/New_York", "Asia/Kolkata"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        threads = clientlog.JavaThreads({"ConsumerManageThread_": 32})
        for _ in range(26):  # the pool's 27th task
            threads.draw("ConsumerManageThread_")
        fmt = clientlog.JavaBrokerFormatter(threads)
        r = record(logging.WARNING, "getConsumerGroupInfo failed, %s %s", "CID_J", "127.0.0.1:46134",
                   created=epoch_of_gmt8(when) + 0.987)
        line = threads.run("ConsumerManageThread_", fmt.format, r)
        assert line == java
    monkeypatch.delenv("TZ")
    time.tzset()


def test_every_sample_line_prefix_has_the_shape_we_write():
    """Every record of the sample has the prefix shape (date, level, one-word thread, ' - '), and so has ours; the
    default format (milliseconds, the logger's name) does not."""
    lines = sample_lines()
    assert len(lines) > 100 and all(JAVA_PREFIX.match(line) for line in lines)
    fmt = clientlog.JavaBrokerFormatter(clientlog.JavaThreads())
    ours = fmt.format(record(logging.INFO, "unregister consumer ok, no any connection, and remove consumer group, %s",
                             "CID_J"))
    m = JAVA_PREFIX.match(ours)
    assert m and m.group(2) == "INFO" and m.group(3) == "main"
    assert not JAVA_PREFIX.match(clientlog.JavaLogFormatter().format(record(logging.INFO, "x")))
    # Java's level names; a record's message and thread name escaped: one record, one line
    warn = fmt.format(record(logging.WARNING, "a\nb %s", "c\x1bd", thread="my\nthread"))
    assert warn.endswith(" WARN my\\nthread - a\\nb c\\x1bd") and "\n" not in warn
    assert " ERROR " in fmt.format(record(logging.CRITICAL, "x"))


def test_thread_names_follow_the_4_9_8_pools():
    """ThreadFactoryImpl: prefix + index from 1; a pool's N-th task on thread N until the pool is full, then
    they take turns; single threads keep their name."""
    threads = clientlog.JavaThreads({"HeartbeatThread_": 2, "ClientManageThread_": 32})
    assert [threads.draw("HeartbeatThread_") for _ in range(5)] == [
        "HeartbeatThread_1", "HeartbeatThread_2", "HeartbeatThread_1", "HeartbeatThread_2", "HeartbeatThread_1"]
    assert [threads.draw("ClientManageThread_") for _ in range(3)] == [
        "ClientManageThread_1", "ClientManageThread_2", "ClientManageThread_3"]
    assert threads.draw(clientlog.NETTY_EVENT_EXECUTOR) == "NettyEventExecutor"
    assert threads.draw(clientlog.CLIENT_HOUSEKEEPING_THREAD) == "ClientHousekeepingScheduledThread1"
    # every thread the sample's client-management lines name is one of ours (a prefix and an index, or itself)
    ours = set(clientlog.JAVA_POOLS) | {clientlog.NETTY_EVENT_EXECUTOR, clientlog.CLIENT_HOUSEKEEPING_THREAD}
    for line in sample_lines():
        thread = JAVA_PREFIX.match(line).group(3)
        if thread.startswith("NettyServerNIOSelector"):  # Netty's I/O threads: no client-management line
            continue
        assert thread in ours or re.sub(r"\d+$", "", thread) in ours, thread
    # the executor of each request code, as BrokerController.registerProcessor wires them
    of = clientlog.JAVA_EXECUTOR_OF_CODE
    assert of[RequestCode.HEART_BEAT] == "HeartbeatThread_"
    assert of[RequestCode.UNREGISTER_CLIENT] == of[RequestCode.CHECK_CLIENT_CONFIG] == "ClientManageThread_"
    assert of[RequestCode.GET_CONSUMER_LIST_BY_GROUP] == of[RequestCode.QUERY_CONSUMER_OFFSET] == \
        "ConsumerManageThread_"
    assert of[RequestCode.PULL_MESSAGE] == "PullMessageThread_"


def test_log_format_property():
    assert BrokerConfig().log_format == "rmqhb"
    assert BrokerConfig.load(None, {"logFormat": "java"}).log_format == "java"
    with pytest.raises(ConfigError, match="logFormat must be rmqhb or java"):
        BrokerConfig.load(None, {"logFormat": "logback"})


# ---------------------------------------------------------------------------------------------------------------
# Java's toString() forms


def test_topic_config_and_subscription_group_config_print_as_java():
    """TopicConfig.toString with PermName.perm2String, SubscriptionGroupConfig.toString (4.9.8): what the sample
    prints for the group; repr() stays Python's."""
    retry = TopicConfig("%RETRY%CID_J", 1, 1, perm=6)
    assert str(retry) == ("TopicConfig [topicName=%RETRY%CID_J, readQueueNums=1, writeQueueNums=1, perm=RW-, "
                          "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]")
    assert "perm=RWX" in str(TopicConfig("TBW102", 8, 8, perm=7)) and "order=true" in str(TopicConfig("o", order=True))
    assert [clientlog.perm_to_string(p) for p in range(8)] == ["---", "--X", "-W-", "-WX", "R--", "R-X", "RW-", "RWX"]
    assert repr(retry).startswith("TopicConfig(topic_name='%RETRY%CID_J'")
    [java] = [line for line in sample_lines() if "auto create a subscription group" in line]
    assert java.endswith(", " + str(SubscriptionGroupConfig("CID_J")))


# ---------------------------------------------------------------------------------------------------------------
# a broker with logFormat=java


class Lines(logging.Handler):
    def __init__(self, formatter):
        super().__init__(logging.INFO)
        self.setFormatter(formatter)
        self.lines = []

    def emit(self, r):
        self.lines.append(self.format(r))


@pytest.fixture
def java_log():
    handler = Lines(clientlog.JavaBrokerFormatter())
    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


def test_broker_lines_carry_java_threads(tmp_path, java_log):
    """Heartbeat lines on HeartbeatThread_N, unregister lines on ClientManageThread_N, a close's on
    NettyEventExecutor, the expiry scan's on ClientHousekeepingScheduledThread1; the retry topic's creation in
    Java's toString; an unknown group's consumer list: Java's WARN on ConsumerManageThread_N, within the
    client-management log budget."""
    b = Broker(make_config(tmp_path, log_format="java", client_manage_log_lines_per_minute=2)).start()
    try:
        c = Client(b.ports["main"])
        assert c.call(RequestCode.HEART_BEAT, {}, hb_body(client_id="127.0.0.1@J-1", group="CID_J",
                                                           producer="PID_J")).code == 0
        for _ in range(5):
            assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "NOPE"}).code == 1
        assert c.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "127.0.0.1@J-1", "producerGroup": "PID_J"}).code == 0
        k = Client(b.ports["main"])
        assert k.call(RequestCode.HEART_BEAT, {}, hb_body(client_id="127.0.0.1@J-2", group="CID_J",
                                                           producer="PID_J")).code == 0
        k.close()
        assert wait_until(lambda: b.call(b.registry.consumer_ids, "CID_J") == ["127.0.0.1@J-1"], 10)
        later = b.call(b.registry._clock) + b.config.channel_expired_timeout + 10_000
        assert b.call(b.scan_expired, later) == 1
    finally:
        b.stop()
    lines = java_log.lines
    assert all(JAVA_PREFIX.match(line) for line in lines)

    def threads_of(text):
        return {JAVA_PREFIX.match(line).group(3) for line in lines if text in line}

    assert {re.sub(r"\d+$", "", t) for t in threads_of("new consumer connected")} == {"HeartbeatThread_"}
    assert threads_of("create new topic TopicConfig [topicName=%RETRY%CID_J, readQueueNums=1, writeQueueNums=1, "
                      "perm=RW-, topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]")
    assert re.fullmatch(r"ClientManageThread_\d+", *threads_of("unregister a producer[PID_J]"))
    assert threads_of("NETTY EVENT: remove") == {"NettyEventExecutor"}
    assert threads_of("SCAN: remove expired channel") == {"ClientHousekeepingScheduledThread1"}
    warns = [line for line in lines if "getConsumerGroupInfo failed" in line]
    assert len(warns) == 2  # clientManageLogLinesPerMinute
    addr = c.sock.getsockname()
    assert re.fullmatch(r"\S+ \S+ WARN ConsumerManageThread_\d+ - getConsumerGroupInfo failed, NOPE "
                        + re.escape(f"{addr[0]}:{addr[1]}"), warns[0])


def test_the_warn_is_written_in_the_default_format_too(tmp_path, caplog):
    b = Broker(make_config(tmp_path)).start()
    try:
        c = Client(b.ports["main"])
        with caplog.at_level(logging.WARNING, logger=clientlog.LOGGER_NAME):
            assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G\nX"}).code == 1
    finally:
        b.stop()
    [r] = [r for r in caplog.records if "getConsumerGroupInfo failed" in r.getMessage()]
    assert r.levelno == logging.WARNING and r.name == "RocketmqBroker"
    assert r.getMessage().startswith("getConsumerGroupInfo failed, G\\nX 127.0.0.1:")


# ---------------------------------------------------------------------------------------------------------------
# the scan of our own log finds what the scan of the recording finds


EXPIRY_MS = 2000


@pytest.fixture(scope="module")
def java_run(tmp_path_factory):
    """One run, recorded and logged as broker.log in the Java format: four clients of a consumer group and two
    producer groups; one goes silent until the broker's expiry scan removes it (expiry scaled to 2 s) and comes
    back on a new connection; then one is killed and the others unregister. (recording dir, log dir, d's addr)"""
    require_module("pyarrow")
    tmp_path = tmp_path_factory.mktemp("java-run")
    logs = tmp_path / "broker-a"
    logs.mkdir()
    handler = logging.FileHandler(logs / "broker.log", encoding="utf-8")
    handler.setFormatter(clientlog.JavaBrokerFormatter())
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    rec = tmp_path / "rec"
    b = Broker(make_config(tmp_path, log_format="java", record_dir=str(rec),
                           channel_expired_timeout=EXPIRY_MS)).start()
    try:
        port = b.ports["main"]
        clients = {n: Client(port) for n in "ABCD"}

        def beat(names):
            for n in names:
                body = hb_body(client_id=f"127.0.0.1@Driver-{n}", group="CID_J", producer="PID_J")
                assert clients[n].call(RequestCode.HEART_BEAT, {}, body).code == 0

        def beat_for(names, seconds):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                beat(names)
                time.sleep(0.25)

        beat("ABCD")
        d_addr = "127.0.0.1:%d" % clients["D"].sock.getsockname()[1]
        deadline = time.monotonic() + 15
        while not b.call(b.scan_expired):  # D silent: its consumer membership expires
            assert time.monotonic() < deadline
            beat_for("ABC", 0.25)
        assert clients["D"].closed_by_peer(5)  # the broker closes an expired channel
        beat_for("ABC", 1.2)  # the return falls in a later second than the SCAN line
        clients["D"] = Client(port)
        beat_for("ABCD", 1.2)
        clients["C"].close()  # killed
        for n in "ABD":
            for ext in ({"consumerGroup": "CID_J"}, {"producerGroup": "PID_J"},
                        {"producerGroup": "CLIENT_INNER_PRODUCER"}):
                assert clients[n].call(RequestCode.UNREGISTER_CLIENT,
                                       {"clientID": f"127.0.0.1@Driver-{n}", **ext}).code == 0
        assert wait_until(lambda: not b.call(b.registry.consumer_ids, "CID_J"), 10)
    finally:
        b.stop()
        root.removeHandler(handler)
        root.setLevel(old)
        handler.close()
    return rec, logs, d_addr


def test_scan_of_our_java_format_log_finds_what_the_recording_scan_finds(java_run):
    """The local broker-log scan of the run's log (``--log-tz +08:00``, as for a Java broker's log) and the
    recording scan find the same clients, the same groups and their sizes, and the same expiry (client, address,
    group, when, connected since, returned), to the log's one-second resolution. The broker expires producers
    after Java's fixed 120 s (ProducerManager), so within the scaled expiry only the consumer membership expires:
    the recording, which has one expiry for all, lists the producer group too."""
    from engine.bindings.brokerlog import scan_local

    rec, logs, d_addr = java_run
    params = ScanParams(expiry_s=EXPIRY_MS / 1000)
    recorded = scan(rec, params)
    logged = scan_local([logs], log_tz="+08:00", params=params)
    assert logged["log"]["unattributed_events"] == {} and not logged["scan"]["corrupt"]
    # the lines' own epoch stamps (lastUpdateTimestamp) imply GMT+8, the zone the scan was told: no zone warning
    assert logged["log"]["zone_check"] == {"inferred_utc_offset_min": 480, "log_tz_offset_min": 480, "agrees": True}
    # clients and groups
    assert recorded["summary"]["clients"] == logged["summary"]["clients"] == 4

    def sizes(findings):
        return {(g["group"], g["role"]): (g["members"], g["max_members"]) for g in findings["group_sizes"]}

    assert sizes(recorded) == sizes(logged) == {("CID_J", "consumer"): (4, 4), ("PID_J", "producer"): (4, 4),
                                                ("CLIENT_INNER_PRODUCER", "producer"): (4, 4)}
    # the expiry
    [r] = recorded["expired_clients"]
    [g] = logged["expired_clients"]
    assert r["client_id"] == g["client_id"] == "127.0.0.1@Driver-D"
    assert r["addr"] == g["addr"] == d_addr
    assert r["groups"] == ["CID_J", "PID_J"] and g["groups"] == ["CID_J"] and g["roles"] == ["consumer"]

    def second(ms):
        return ms // 1000 * 1000

    assert g["connected_ms"] == second(r["connected_ms"])
    # the broker's scan removes the channel once it is silent past the expiry: the SCAN line's second is the
    # recording's last heartbeat + expiry, or the next (this test scans every 0.25 s)
    assert second(r["expired_ms"]) <= g["expired_ms"] <= second(r["expired_ms"] + 1000)
    assert g["returned_ms"] == second(r["returned_ms"])
    for key in ("flapping_clients", "inconsistent_subscriptions"):
        assert recorded[key] == logged[key] == []


@pytest.mark.spark
def test_spark_scan_of_our_java_format_log_is_the_local_scans(spark, java_run):
    """The same log scanned on Spark (``rmqhb scan``'s path): the local scan's findings."""
    require_module("pyspark")
    from engine.bindings import brokerlog as bl

    _, logs, _ = java_run
    params = ScanParams(expiry_s=EXPIRY_MS / 1000)
    on_spark = bl.scan(spark, [logs], params, log_tz="+08:00")
    local = bl.scan_local([logs], log_tz="+08:00", params=params)
    on_spark.pop("scan", None)
    local.pop("scan", None)
    assert on_spark == local
    assert [r["client_id"] for r in on_spark["expired_clients"]] == ["127.0.0.1@Driver-D"]


def test_serve_writes_the_java_pattern(tmp_path):
    """`rmqhb serve --logFormat java --logDir D`: its log lines (stderr, and D/broker.log) carry the pattern and
    the Java threads."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--logFormat", "java", "--listenPort", "0",
                             "--listenHost", "127.0.0.1", "--storePathRootDir", str(tmp_path / "store"),
                             "--logDir", str(tmp_path / "logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root),
                            env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        line = proc.stdout.readline()
        assert "boot success" in line, proc.stderr.read()
        c = Client(int(line.split("127.0.0.1:")[1].split("]")[0]))
        assert c.call(RequestCode.HEART_BEAT, {}, hb_body(client_id="127.0.0.1@S-1", group="CID_S")).code == 0
        assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "NOPE"}).code == 1
        c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [x for x in proc.stderr.read().splitlines() if x]
    assert lines and all(JAVA_PREFIX.match(x) for x in lines), lines
    threads = {JAVA_PREFIX.match(x).group(3) for x in lines if "group: CID_S" in x or "NOPE" in x}
    assert threads == {"HeartbeatThread_1", "ConsumerManageThread_1", "NettyEventExecutor"}, lines
    # logDir: the same lines in <logDir>/broker.log
    assert (tmp_path / "logs" / "broker.log").read_text(encoding="utf-8").splitlines() == lines


# ---------------------------------------------------------------------------------------------------------------
# logDir: broker.log written and rolled as logback's RocketmqBrokerAppender does


def test_broker_log_rolls_as_logback_and_scans_the_same(tmp_path, java_run):
    """The run's log written through BrokerLogFile with a small roll size: broker.log plus otherdays/broker.N.log.gz
    (gzip), at most max_index of them, no temp file left; the scan of that directory (older rolled files first)
    finds what the scan of the whole log finds."""
    import gzip

    from engine.bindings.brokerlog import scan_local

    _, logs, _ = java_run
    lines = (logs / "broker.log").read_text(encoding="utf-8").splitlines()
    out = tmp_path / "rolled"
    size = len("\n".join(lines).encode()) // 8  # about eight rolled files
    handler = clientlog.BrokerLogFile(out, max_bytes=size, max_index=50)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("test.rolled")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for line in lines:
            logger.warning("%s", line)
    finally:
        logger.removeHandler(handler)
        handler.close()
    rolled = sorted((out / "otherdays").iterdir())
    assert len(rolled) >= 6 and all(re.fullmatch(r"broker\.\d+\.log\.gz", p.name) for p in rolled)
    back = [gzip.decompress(p.read_bytes()).decode() for p in
            sorted(rolled, key=lambda p: -int(p.name.split(".")[1]))]
    assert "".join(back).splitlines() + (out / "broker.log").read_text().splitlines() == lines
    params = ScanParams(expiry_s=EXPIRY_MS / 1000)
    whole = scan_local([logs], log_tz="+08:00", params=params)
    parts = scan_local([out], log_tz="+08:00", params=params, brokers={"broker-a": str(out)})
    assert len(parts["log"]["files"]) == len(rolled) + 1  # every rolled file read, and broker.log
    for f in (whole, parts):
        f.pop("scan")
        f.pop("log")
    assert parts == whole
    # the window: past max_index the oldest goes
    small = tmp_path / "small"
    handler = clientlog.BrokerLogFile(small, max_bytes=size, max_index=3)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    try:
        for line in lines:
            logger.warning("%s", line)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert sorted(p.name for p in (small / "otherdays").iterdir()) == [f"broker.{i}.log.gz" for i in (1, 2, 3)]
    # the newest three rolls, the same as the unbounded run's .1 to .3
    assert [gzip.decompress((small / "otherdays" / f"broker.{i}.log.gz").read_bytes()) for i in (1, 2, 3)] == [
        gzip.decompress((out / "otherdays" / f"broker.{i}.log.gz").read_bytes()) for i in (1, 2, 3)]


def test_broker_log_is_never_written_through_a_symlink(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    target = tmp_path / "passwd"
    target.write_text("root:x:0:0\n")
    d = tmp_path / "logs"
    d.mkdir()
    (d / "broker.log").symlink_to(target)
    with pytest.raises(OSError):
        clientlog.BrokerLogFile(d)
    fifo = tmp_path / "fifo"  # a FIFO named broker.log is refused, not waited on
    fifo.mkdir()
    os.mkfifo(fifo / "broker.log")
    with pytest.raises(OSError):
        clientlog.BrokerLogFile(fifo)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "engine", "serve", "--logFormat", "java", "--logDir", str(d),
                           "--listenPort", "0", "--storePathRootDir", str(tmp_path / "store")], capture_output=True,
                          text=True, cwd=str(root), env=dict(os.environ, PYTHONPATH=str(root)), timeout=60)
    assert proc.returncode == 255 and "logDir" in proc.stderr and "symlink" in proc.stderr
    assert target.read_text() == "root:x:0:0\n"

"""Findings true to a real broker's history (issue 28 §1-§4): broker restarts end every channel, idle-closed clients
are expiries with their cause, clients that vanish without UNREGISTER_CLIENT are named, Java stack traces are one
multi-line entry, and the banner names the real reason of unattributed lines. Small hand-written logs in the real
4.9.8 line format (the shapes of /work/shared/samples), plus the real sample log."""
from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import strict
from engine.bindings import brokerlog as bl
from engine.bindings import report
from engine.recording import _brokerlog_py as twin
from engine.recording.scan_py import ScanParams

SAMPLE = Path(os.environ.get("ENGINE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared")) / "samples" / \
    "rocketmq-4.9.8-broker.log"

try:
    native = importlib.import_module("engine.recording._brokerlog")
except ImportError:  # pragma: no cover - not built
    native = None
if native is None and strict():
    raise RuntimeError("engine.recording._brokerlog is not built (required under CI=true / ENGINE_REQUIRE_NATIVE=1)")

T0 = int(datetime(2026, 11, 27, 8, 0, 0, tzinfo=timezone.utc).timestamp() * 1000)


def ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def cci(cid: int, port: int, client: str, lut: int, st: str = "-") -> str:
    return (f"ClientChannelInfo [channel=[id: 0x{cid:08x}, L:/10.0.0.1:10911 {st} R:/10.0.0.9:{port}], "
            f"clientId={client}, language=JAVA, version=409, lastUpdateTimestamp={lut}]")


class Log:
    """A broker.log in the stock 4.9.8 pattern (``yyyy-MM-dd HH:mm:ss LEVEL thread - message``), UTC wall clock."""

    def __init__(self):
        self.lines = []

    def add(self, ms, msg, level="INFO", thread="HeartbeatThread_1"):
        self.lines.append(f"{ts(ms)} {level} {thread} - {msg}")

    def raw(self, text):
        self.lines.append(text)

    def boot(self, ms, ready_after_s=3):
        self.add(ms, "rocketmqHome=/opt/rocketmq", thread="main")
        self.add(ms, "namesrvAddr=127.0.0.1:9876", thread="main")
        self.add(ms + ready_after_s * 1000, "The broker[broker-a, 10.0.0.1:10911] boot success. serializeType=JSON "
                                            "and name server is 127.0.0.1:9876", thread="main")

    def stop(self, ms):
        self.add(ms, "Shutdown hook was invoked, 1", thread="ShutdownHook")

    def register(self, ms, cid, port, client, group="CID_A", pgroup="PID_A"):
        c = cci(cid, port, client, ms)
        self.add(ms, f"new consumer connected, group: {group} CONSUME_PASSIVELY CLUSTERING channel: {c}")
        self.add(ms, f"new producer connected, group: CLIENT_INNER_PRODUCER channel: {c}")
        self.add(ms, f"new producer connected, group: {pgroup} channel: {c}")

    def netty_close(self, ms, cid, port, client, lut, group="CID_A", pgroup="PID_A"):
        c = cci(cid, port, client, lut, "!")
        for g in ("CLIENT_INNER_PRODUCER", pgroup):
            self.add(ms, f"NETTY EVENT: remove channel[{c}][10.0.0.9:{port}] from ProducerManager groupChannelTable, "
                         f"producer group: {g}", thread="NettyEventExecutor")
        self.add(ms, f"NETTY EVENT: remove not active channel[{c}] from ConsumerGroupInfo groupChannelTable, "
                     f"consumer group: {group}", level="WARN", thread="NettyEventExecutor")

    def scan(self, ms, port, group="CID_A", pgroup="PID_A"):
        t = "ClientHousekeepingScheduledThread1"
        for g in ("CLIENT_INNER_PRODUCER", pgroup):
            self.add(ms, f"SCAN: remove expired channel[10.0.0.9:{port}] from ProducerManager groupChannelTable, "
                         f"producer group name: {g}", level="WARN", thread=t)
        self.add(ms, f"SCAN: remove expired channel from ConsumerManager consumerTable. channel=10.0.0.9:{port}, "
                     f"consumerGroup={group}", level="WARN", thread=t)

    def unregister(self, ms, cid, port, client, group="CID_A", pgroup="PID_A"):
        c = cci(cid, port, client, ms)
        self.add(ms, f"unregister a consumer[{group}] from consumerGroupInfo {c}", thread="ClientManageThread_1")
        self.add(ms, f"unregister a producer[{pgroup}] from groupChannelTable {c}", thread="ClientManageThread_2")
        self.add(ms, f"unregister a producer[CLIENT_INNER_PRODUCER] from groupChannelTable {c}",
                 thread="ClientManageThread_3")

    def scan_findings(self, tmp_path, name="broker-a", native_parser=None):
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        (d / "broker.log").write_text("\n".join(self.lines) + "\n")
        return bl.scan_local([d], log_tz="UTC", native=native_parser)


def _size_at(f, role, group, t):
    (g,) = [g for g in f["group_sizes"] if g["role"] == role and g["group"] == group]
    n = 0
    for ms, k in g["series"]:
        if ms <= t:
            n = k
    return n


def _report_text(f) -> str:
    out = Path(tempfile.mkdtemp()) / "report"
    report.write_report(f, out, plots=False)
    return (out / "index.html").read_text()


@pytest.fixture(params=[False] + ([True] if native is not None else []), ids=lambda n: "native" if n else "twin")
def native_parser(request):
    return request.param


# --- §1 a broker restart ends every channel ------------------------------------------------------------------------


def test_a_broker_stop_and_start_end_every_membership(tmp_path, native_parser):
    log = Log()
    log.boot(T0)
    for i in range(3):
        log.register(T0 + 10_000 + i * 1000, i + 1, 40000 + i, f"10.0.0.9@c{i}")
    log.stop(T0 + 600_000)                       # clean broker stop: the shutdown hook's line
    log.boot(T0 + 2_820_000)                     # 37 minutes later the broker starts again
    log.register(T0 + 2_830_000, 9, 41000, "10.0.0.9@c0")
    log.add(T0 + 3_000_000, "start pull message", thread="PullMessageThread_1")
    f = log.scan_findings(tmp_path, native_parser=native_parser)
    # live from their registers to the stop, none while the broker is down, one after the start
    assert _size_at(f, "producer", bl.CLIENT_INNER_PRODUCER, T0 + 599_000) == 3
    assert _size_at(f, "producer", bl.CLIENT_INNER_PRODUCER, T0 + 600_000) == 0
    assert _size_at(f, "consumer", "CID_A", T0 + 2_000_000) == 0
    assert _size_at(f, "consumer", "CID_A", T0 + 2_830_000) == 1
    assert f["broker_boots"] == [
        {"broker": "broker-a", "start_ms": T0, "ready_ms": T0 + 3000, "name": "broker-a", "addr": "10.0.0.1:10911",
         "stopped_ms": None, "members_ended": 0, "clients_ended": 0},
        {"broker": "broker-a", "start_ms": T0 + 2_820_000, "ready_ms": T0 + 2_823_000, "name": "broker-a",
         "addr": "10.0.0.1:10911", "stopped_ms": T0 + 600_000, "members_ended": 9, "clients_ended": 3}]
    # a client registering again after the broker's restart is not a reconnect, nor vanished, nor expired
    assert f["flapping_clients"] == [] and f["vanished_clients"] == [] and f["expired_clients"] == []
    assert f["log"]["starts_at_boot"] == {"broker-a": True}
    html = _report_text(f)
    assert "Broker restarts" in html and ts(T0 + 600_000) in html and ts(T0 + 2_820_000) in html


def test_a_killed_broker_ends_its_memberships_at_its_next_start(tmp_path, native_parser):
    log = Log()
    log.register(T0, 1, 40000, "10.0.0.9@c0")    # the log does not start at a boot
    log.boot(T0 + 300_000)                       # no shutdown hook: kill -9 of the broker, then a start
    log.register(T0 + 320_000, 2, 40001, "10.0.0.9@c1")
    f = log.scan_findings(tmp_path, native_parser=native_parser)
    assert _size_at(f, "consumer", "CID_A", T0 + 299_000) == 1
    assert _size_at(f, "consumer", "CID_A", T0 + 300_000) == 0
    assert _size_at(f, "consumer", "CID_A", T0 + 320_000) == 1
    (b,) = f["broker_boots"]
    assert (b["start_ms"], b["ready_ms"], b["stopped_ms"], b["members_ended"], b["clients_ended"]) == (
        T0 + 300_000, T0 + 303_000, None, 3, 1)
    assert f["log"]["starts_at_boot"] == {"broker-a": False}


def test_boot_success_alone_is_a_start(tmp_path):
    log = Log()
    log.register(T0, 1, 40000, "10.0.0.9@c0")
    log.add(T0 + 60_000, "The broker[broker-b, 10.0.0.2:10911] boot success. serializeType=JSON", thread="main")
    f = log.scan_findings(tmp_path)
    assert [(b["start_ms"], b["ready_ms"], b["name"], b["addr"]) for b in f["broker_boots"]] == [
        (T0 + 60_000, T0 + 60_000, "broker-b", "10.0.0.2:10911")]
    assert _size_at(f, "consumer", "CID_A", T0 + 60_000) == 0


# --- §2 idle-closed clients are expiries with their cause ----------------------------------------------------------


def test_an_idle_closed_client_is_an_expiry_with_its_cause(tmp_path, native_parser):
    log = Log()
    log.boot(T0)
    log.register(T0 + 10_000, 1, 40000, "10.0.0.9@frozen")
    # frozen: its last heartbeat at +10 s; the idle handler closes it 120 s later, before any SCAN
    log.netty_close(T0 + 130_000, 1, 40000, "10.0.0.9@frozen", lut=T0 + 10_000)
    f = log.scan_findings(tmp_path, native_parser=native_parser)
    (r,) = f["expired_clients"]
    assert (r["client_id"], r["cause"], r["expired_ms"], r["silent_since_before_ms"], r["groups"]) == (
        "10.0.0.9@frozen", "idle_closed", T0 + 130_000, T0 + 10_000, ["CID_A", "PID_A"])
    assert f["vanished_clients"] == []
    html = _report_text(f)
    assert "closed idle by the broker" in html
    assert "removed by the broker&#x27;s SCAN" not in html and "removed by the broker's SCAN" not in html


def test_scan_expiry_keeps_its_cause_and_the_netty_lines_after_it_are_normal(tmp_path, native_parser):
    log = Log()
    log.boot(T0)
    log.register(T0 + 10_000, 1, 40000, "10.0.0.9@frozen")
    log.scan(T0 + 135_000, 40000)
    # the channel closes after the SCAN removed it: NETTY EVENT lines of members no longer in the tables
    log.netty_close(T0 + 136_000, 1, 40000, "10.0.0.9@frozen", lut=T0 + 10_000)
    f = log.scan_findings(tmp_path, native_parser=native_parser)
    (r,) = f["expired_clients"]
    assert (r["cause"], r["expired_ms"]) == ("scan", T0 + 135_000)
    assert f["log"]["unattributed_events"] == {} and f["log"]["explained_events"] == {"after_expiry": 3}
    html = _report_text(f)
    assert "PARTLY UNREADABLE" not in html and "removed by the broker" in html


# --- §3 vanished clients -------------------------------------------------------------------------------------------


def test_a_killed_client_is_named_and_a_returning_or_clean_one_is_not(tmp_path, native_parser):
    log = Log()
    log.boot(T0)
    log.register(T0 + 10_000, 1, 40000, "10.0.0.9@killed")
    log.register(T0 + 11_000, 2, 40001, "10.0.0.9@restarted")
    log.register(T0 + 12_000, 3, 40002, "10.0.0.9@clean")
    log.netty_close(T0 + 50_000, 1, 40000, "10.0.0.9@killed", lut=T0 + 41_000)        # kill -9
    log.netty_close(T0 + 51_000, 2, 40001, "10.0.0.9@restarted", lut=T0 + 41_000)     # network cut, back later
    log.register(T0 + 90_000, 4, 40003, "10.0.0.9@restarted")
    log.unregister(T0 + 95_000, 3, 40002, "10.0.0.9@clean")                           # clean shutdown
    f = log.scan_findings(tmp_path, native_parser=native_parser)
    assert f["vanished_clients"] == [{
        "broker": "broker-a", "client_id": "10.0.0.9@killed", "addr": "10.0.0.9:40000", "ended_ms": T0 + 50_000,
        "groups": ["CID_A", "PID_A"], "roles": ["consumer", "producer"], "connected_ms": T0 + 10_000,
        "last_heartbeat_ms": T0 + 41_000}]
    assert f["expired_clients"] == [] and f["summary"]["vanished_clients"] == 1
    out = Path(tempfile.mkdtemp()) / "report"
    report.write_report(f, out, plots=False)
    csv = (out / "vanished_clients.csv").read_text().splitlines()
    assert csv[0] == "broker,client_id,addr,groups,connected_utc,last_heartbeat_utc,ended_utc,ended_ms"
    assert len(csv) == 2 and csv[1].startswith("broker-a,10.0.0.9@killed,10.0.0.9:40000,CID_A;PID_A,")
    assert "Vanished clients" in (out / "index.html").read_text()


def test_the_sample_log_names_its_two_killed_clients():
    if not SAMPLE.exists():
        if strict():
            raise AssertionError(f"the 4.9.8 sample log is missing: {SAMPLE}")
        pytest.skip("the 4.9.8 sample log is not here")
    f = bl.scan_local([SAMPLE], log_tz="+08:00")
    # runs 3 (kill -9 after 5 s) and 5 (JVM killed 6 s later): named, with the groups they left
    assert [(r["client_id"], r["groups"], r["ended_ms"]) for r in f["vanished_clients"]] == [
        ("127.0.0.1@JavaDriver-21988-3435698233103", ["CID_J", "PID_J"], 1795481401000),
        ("127.0.0.1@JavaDriver-22284-3689692084208", ["CID_J", "PID_J"], 1795481656000)]
    # run 6 (frozen 140 s): the SCAN removed it, and it came back
    assert [(r["cause"], r["returned_ms"]) for r in f["expired_clients"]] == [("scan", 1795481982000)]
    assert f["log"]["unattributed_events"] == {} and f["log"]["unparseable"] == 0


# --- §4 stack traces and the banner's reason -----------------------------------------------------------------------


STACK = ["java.nio.channels.ClosedChannelException: null",
         "\tat io.netty.channel.AbstractChannel$AbstractUnsafe.newClosedChannelException(AbstractChannel.java:957)",
         "\tat io.netty.channel.AbstractChannel$AbstractUnsafe.write(AbstractChannel.java:865)",
         "Caused by: java.io.IOException: Connection reset by peer",
         "\t... 12 common frames omitted"]


def test_java_stack_traces_are_continuations_in_both_parsers():
    lines = [f"{ts(T0)} ERROR NettyServerNIOSelector_3_2 - processRequestWrapper response to /10.0.0.9:40000 failed"]
    lines += STACK + ["not a log line at all", "a.b.", "..x: y"]
    got = []
    for parse in [twin.parse_lines] + ([native.parse_lines] if native is not None else []):
        batch, stats = parse(lines)
        got.append((batch.to_pylist(), stats))
        assert stats["counts"] == {"continuation": 5, "other": 1, "unknown_format": 3}
        assert stats["examples"]["continuation"] == STACK[0]
    assert all(g == got[0] for g in got)


def test_broker_life_lines_parse_alike_in_both_parsers():
    lines = [f"{ts(T0)} INFO main - rocketmqHome=/opt/rocketmq",
             f"{ts(T0)} INFO main - The broker[broker-a, 10.0.0.1:10911] boot success. serializeType=JSON",
             f"{ts(T0)} INFO main - The broker[broker-a 10.0.0.1:10911] boot success",
             f"{ts(T0)} INFO main - The broker[broker-a, 10.0.0.1:10911] started",
             f"{ts(T0)} INFO ShutdownHook - Shutdown hook was invoked, 1"]
    got = []
    for parse in [twin.parse_lines] + ([native.parse_lines] if native is not None else []):
        batch, stats = parse(lines)
        rows = batch.to_pylist()
        assert [(r["kind"], r["role"], r["group"], r["addr"]) for r in rows] == [
            ("broker_start", "broker", None, None), ("broker_boot", "broker", "broker-a", "10.0.0.1:10911"),
            ("broker_stop", "broker", None, None)]
        assert stats["counts"]["malformed_broker_boot"] == 2
        got.append((rows, stats))
    assert all(g == got[0] for g in got)


def test_a_stack_trace_in_a_log_is_not_unreadable_input(tmp_path, native_parser):
    log = Log()
    log.boot(T0)
    log.register(T0 + 10_000, 1, 40000, "10.0.0.9@c0")
    log.add(T0 + 20_000, "processRequestWrapper response to /10.0.0.9:40000 failed", level="ERROR",
            thread="NettyServerNIOSelector_3_2")
    for line in STACK:
        log.raw(line)
    f = log.scan_findings(tmp_path, native_parser=native_parser)
    assert f["log"]["unparseable"] == 0 and f["log"]["counts"]["continuation"] == len(STACK)
    assert "PARTLY UNREADABLE" not in _report_text(f)


def test_older_files_are_asked_for_only_when_the_log_does_not_start_at_a_boot(tmp_path):
    def closes_of_unknown(log):
        log.netty_close(T0 + 100_000, 7, 40007, "10.0.0.9@unknown", lut=T0 + 95_000)
        return log

    mid = Log()
    mid.add(T0, "load exist local topic", thread="main")
    f = closes_of_unknown(mid).scan_findings(tmp_path, "broker-mid")
    assert f["log"]["unattributed_reasons"] == {"never_registered": 3}
    assert f["vanished_clients"] == []
    assert "older log files missing?" in _report_text(f)

    booted = Log()
    booted.boot(T0)
    f = closes_of_unknown(booted).scan_findings(tmp_path, "broker-boot")
    assert f["log"]["unattributed_reasons"] == {"never_registered": 3}
    html = _report_text(f)
    assert "older log files missing?" not in html and "never wrote" in html
    # what a log cannot know: the lines its broker did not write
    cannot = html[html.index("What this input cannot show"):]
    assert "lines the broker did not write" in cannot[:cannot.index("</table>")]


def test_older_files_are_asked_for_per_broker(tmp_path):
    """Two brokers: broker-a's log starts at a boot and holds close lines of members it never logged registering
    (lines it dropped), broker-b's starts mid-run. The banner asked broker-a's question about older files as soon
    as any broker's log did not start at a boot; each broker's evidence is its own."""
    a = Log()
    a.boot(T0)
    a.netty_close(T0 + 100_000, 7, 40007, "10.0.0.9@unknown", lut=T0 + 95_000)
    b = Log()
    b.register(T0 + 110_000, 8, 40008, "10.0.0.9@other")
    dirs = []
    for name, log in (("broker-a", a), ("broker-b", b)):
        d = tmp_path / name
        d.mkdir()
        (d / "broker.log").write_text("\n".join(log.lines) + "\n")
        dirs.append(d)
    f = bl.scan_local(dirs, log_tz="UTC")
    assert f["log"]["starts_at_boot"] == {"broker-a": True, "broker-b": False}
    assert f["log"]["never_registered_by_broker"] == {"broker-a": 3}
    html = _report_text(f)
    assert "3 for members whose register line the broker never wrote" in html
    assert "older log files missing?" not in html
    # broker-b with such lines too: its own 3 ask about older files, broker-a's 3 do not
    b.netty_close(T0 + 120_000, 9, 40009, "10.0.0.9@unknown2", lut=T0 + 115_000)
    (dirs[1] / "broker.log").write_text("\n".join(b.lines) + "\n")
    f = bl.scan_local(dirs, log_tz="UTC")
    assert f["log"]["never_registered_by_broker"] == {"broker-a": 3, "broker-b": 3}
    html = _report_text(f)
    assert "3 for members whose register line the broker never wrote" in html
    assert "3 for members never seen registering (older log files missing?)" in html


# --- Spark: the same findings --------------------------------------------------------------------------------------


def _history(tmp_path) -> list:
    a = Log()
    a.boot(T0)
    a.register(T0 + 10_000, 1, 40000, "10.0.0.9@frozen")
    a.register(T0 + 11_000, 2, 40001, "10.0.0.9@killed")
    a.register(T0 + 12_000, 3, 40002, "10.0.0.9@scanned")
    a.register(T0 + 13_000, 4, 40003, "10.0.0.9@stays")
    a.netty_close(T0 + 50_000, 2, 40001, "10.0.0.9@killed", lut=T0 + 41_000)
    a.add(T0 + 60_000, "processRequestWrapper response to /10.0.0.9:40001 failed", level="ERROR",
          thread="NettyServerNIOSelector_3_2")
    for line in STACK:
        a.raw(line)
    a.netty_close(T0 + 130_000, 1, 40000, "10.0.0.9@frozen", lut=T0 + 10_000)
    a.scan(T0 + 135_000, 40002)
    a.netty_close(T0 + 136_000, 3, 40002, "10.0.0.9@scanned", lut=T0 + 12_000)
    a.stop(T0 + 600_000)
    a.boot(T0 + 900_000)
    a.register(T0 + 910_000, 5, 40005, "10.0.0.9@stays")
    b = Log()
    b.netty_close(T0 + 100_000, 7, 40007, "10.0.0.9@unknown", lut=T0 + 95_000)
    b.register(T0 + 110_000, 8, 40008, "10.0.0.9@other")
    dirs = []
    for name, log in (("broker-a", a), ("broker-b", b)):
        d = tmp_path / name
        d.mkdir()
        (d / "broker.log").write_text("\n".join(log.lines) + "\n")
        dirs.append(d)
    return dirs


@pytest.mark.spark
@pytest.mark.slow
def test_spark_scan_gives_the_local_history_findings(spark, tmp_path):
    dirs = _history(tmp_path)
    ref = bl.scan_local(dirs, log_tz="UTC")
    got = bl.scan(spark, dirs, log_tz="UTC")
    got.pop("scan"), ref.pop("scan")
    assert got == ref
    assert [(r["client_id"], r["cause"]) for r in got["expired_clients"]] == [
        ("10.0.0.9@frozen", "idle_closed"), ("10.0.0.9@scanned", "scan")]
    assert [r["client_id"] for r in got["vanished_clients"]] == ["10.0.0.9@killed"]
    assert [(r["broker"], r["start_ms"], r["members_ended"]) for r in got["broker_boots"]] == [
        ("broker-a", T0, 0), ("broker-a", T0 + 900_000, 3)]
    assert got["log"]["starts_at_boot"] == {"broker-a": True, "broker-b": False}
    assert got["log"]["unattributed_reasons"] == {"never_registered": 3} and got["log"]["unparseable"] == 0


# --- captures: the same causes and vanished clients ----------------------------------------------------------------

_spec = importlib.util.spec_from_file_location("pcap_tool", Path(__file__).resolve().parents[1] / "scripts" /
                                               "pcap_tool.py")
pcap_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pcap_tool)


def _hb(client: str) -> bytes:
    subs = ('[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1,'
            '"tagsSet":[],"topic":"T"}]')
    cons = ('[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"G",'
            f'"messageModel":"CLUSTERING","subscriptionDataSet":{subs},"unitMode":false}}]')
    return (f'{{"clientID":"{client}","consumerDataSet":{cons},'
            '"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}').encode()


def history_capture(path):
    """Five consumers of G heartbeat every 30 s from 0 s: I (frozen after 60 s, the broker's idle handler closes its
    connection 120 s later: server FIN at 180 s), K (kill -9 at 70 s: the client's kernel sends FIN, no unregister),
    R (its connection reset by the client at 75 s, back on a new connection at 100 s), U (UNREGISTER_CLIENT at 65 s,
    then FIN: a clean shutdown), S (silent after 60 s, connection open: no close seen); E heartbeats until 390 s."""
    a = {c: f"10.0.9.{i + 1}:4{i}000" for i, c in enumerate("IKRUSE")}
    steps = [(T0 + s * 1000, a[c], "hb", _hb(f"{c}@1")) for s in range(0, 391, 30) for c in "IKRUSE"
             if s <= 60 or c == "E"]
    steps += [(T0 + s * 1000, "10.0.9.9:49000", "hb", _hb("R@1")) for s in range(100, 391, 30)]
    steps += [(T0 + 65_000, a["U"], "unregister", ("U@1", None, "G")), (T0 + 66_000, a["U"], "fin", "client"),
              (T0 + 70_000, a["K"], "fin", "client"), (T0 + 75_000, a["R"], "rst", "client"),
              (T0 + 180_000, a["I"], "fin", "server")]
    pcap_tool.write_script(path, sorted(steps, key=lambda x: x[0]))
    return a


def check_history_capture(f, a):
    assert [(r["client_id"], r["cause"], r["expired_ms"] - T0, r["silent_since_before_ms"] - T0)
            for r in f["expired_clients"]] == [("I@1", "idle_closed", 180_000, 60_000),
                                               ("S@1", "inferred", 180_000, 60_000)]
    assert [(r["client_id"], r["addr"], r["ended_ms"] - T0, r["how"], r["groups"]) for r in f["vanished_clients"]] == [
        ("K@1", a["K"], 70_000, "fin_by_client", ["G"])]


def test_a_capture_names_idle_closes_and_vanished_clients(tmp_path):
    from engine.bindings import pcap

    cap = tmp_path / "history.pcap"
    a = history_capture(cap)
    f = pcap.scan_local([cap])
    check_history_capture(f, a)
    html = _report_text(f)
    assert "closed idle by the broker" in html and "inferred: last heartbeat" in html
    assert "removed by the broker&#x27;s SCAN" not in html and "Vanished clients" in html
    # the words say how a capture shows them (a log's NETTY EVENT lines are not in it), and what it cannot show
    assert "a capture's FIN or RST from the broker 90 s or more after the last heartbeat" in html
    assert "the client's own FIN or RST, no UNREGISTER_CLIENT since its last heartbeat" in html
    assert "NETTY EVENT" not in html
    cannot = html[html.index("What this input cannot show"):]
    cannot = cannot[:cannot.index("</table>")]
    assert "expired_clients (SCAN)" in cannot and "retry_topic_churn" in cannot and "broker_restarts" in cannot
    assert "vanished_clients" not in cannot  # a capture shows them


@pytest.mark.spark
@pytest.mark.slow
def test_spark_capture_scan_gives_the_local_causes_and_vanished_clients(spark, tmp_path):
    from engine.bindings import pcap

    cap = tmp_path / "history.pcap"
    a = history_capture(cap)
    got, ref = pcap.scan(spark, [cap]), pcap.scan_local([cap])
    check_history_capture(got, a)
    assert got["expired_clients"] == ref["expired_clients"] and got["vanished_clients"] == ref["vanished_clients"]
    assert got["broker_boots"] == ref["broker_boots"] == []
    cap = tmp_path / "restart.pcap"
    restart_capture(cap)
    got, ref = pcap.scan(spark, [cap]), pcap.scan_local([cap])
    check_restart_capture(got)
    assert got["broker_boots"] == ref["broker_boots"] and got["group_sizes"] == ref["group_sizes"]


def test_unattributed_lines_of_members_that_left_are_told_apart_from_missing_registers(tmp_path):
    log = Log()
    log.boot(T0)
    log.register(T0 + 10_000, 1, 40000, "10.0.0.9@c0")
    log.unregister(T0 + 20_000, 1, 40000, "10.0.0.9@c0")
    log.unregister(T0 + 21_000, 1, 40000, "10.0.0.9@c0")            # the same lines again: the members left
    # a member of the known client in a group it never registered in (its register line was not written)
    c = cci(1, 40000, "10.0.0.9@c0", T0 + 22_000)
    log.add(T0 + 22_000, f"unregister a consumer[CID_OTHER] from consumerGroupInfo {c}", thread="ClientManageThread_4")
    f = log.scan_findings(tmp_path)
    assert f["log"]["unattributed_reasons"] == {"not_live": 3, "never_registered": 1}
    assert f["log"]["unattributed_events"] == {"unregister": 4}
    html = _report_text(f)
    assert "1 for members whose register line the broker never wrote" in html
    assert "3 for members that had left already" in html and "older log files missing?" not in html


def restart_capture(path):
    """Three clients heartbeat every 30 s; at 100 s the broker closes all three connections (its FINs within 1 s:
    a stop), the clients come back on new connections at 130 s. Earlier, at 45 s, the broker closed one other
    connection alone (an idle close, not a restart)."""
    a = {c: f"10.0.8.{i + 1}:4{i}000" for i, c in enumerate("ABC")}
    steps = [(T0 + s * 1000, a[c], "hb", _hb(f"{c}@1")) for s in (0, 30, 60, 90) for c in "ABC"]
    steps += [(T0 + s * 1000, f"10.0.8.{i + 1}:4{i}001", "hb", _hb(f"{c}@1")) for s in (130, 160)
              for i, c in enumerate("ABC")]
    steps += [(T0 + 0, "10.0.8.9:49000", "hb", _hb("Z@1")), (T0 + 45_000, "10.0.8.9:49000", "fin", "server")]
    steps += [(T0 + 100_000 + i * 400, a[c], "fin", "server") for i, c in enumerate("ABC")]
    pcap_tool.write_script(path, sorted(steps, key=lambda x: x[0]))


def check_restart_capture(f):
    assert [(r["stopped_ms"] - T0, r["start_ms"] - T0, r["clients_ended"]) for r in f["broker_boots"]] == [
        (100_000, 130_000, 3)]
    # no member while the broker is down: the three end at its closes, back on their new connections
    for role, group in (("consumer", "G"), ("producer", bl.CLIENT_INNER_PRODUCER)):
        assert _size_at(f, role, group, T0 + 99_000) == 3 and _size_at(f, role, group, T0 + 101_000) == 0
        assert _size_at(f, role, group, T0 + 129_000) == 0 and _size_at(f, role, group, T0 + 130_000) == 3


def test_a_capture_names_a_broker_restart(tmp_path):
    from engine.bindings import pcap

    cap = tmp_path / "restart.pcap"
    restart_capture(cap)
    f = pcap.scan_local([cap])
    check_restart_capture(f)
    html = _report_text(f)
    assert "Broker restarts" in html and ts(T0 + 100_000) in html


def crash_capture(path, *, alone=False, survivor=False, reset=False, answered=False):
    """Three clients heartbeat every 30 s on their connections from 0 s, the last at 90, 91 and 92 s; the broker's
    host dies after that (no FIN / RST of the old process: the old connections go silent) and the clients come back
    on new connections at 250, 251 and 252 s (longer than the expiry). ``alone``: only A goes silent and comes back,
    B and C go on heartbeating on their connections (a client reconnecting, no restart). ``survivor``: C's old
    connection goes on heartbeating across the silence (no restart either). ``reset``: the new host resets C's old
    connection at 200 s (answering a packet of C's there: a restart still, C's membership ends at it too).
    ``answered``: C heartbeats on its old connection at 122 s and the new host resets it (its last heartbeat to the
    old process is the one at 92 s)."""
    a = {c: f"10.0.7.{i + 1}:4{i}000" for i, c in enumerate("ABC")}
    again = {c: f"10.0.7.{i + 1}:4{i}001" for i, c in enumerate("ABC")}
    back = "A" if alone else "AB" if survivor else "ABC"
    steps = []
    for i, c in enumerate("ABC"):
        steps += [(T0 + s * 1000 + i * 1000, a[c], "hb", _hb(f"{c}@1"))
                  for s in (range(0, 91, 30) if c in back else range(0, 391, 30))]
        if c in back:
            steps += [(T0 + s * 1000 + i * 1000, again[c], "hb", _hb(f"{c}@1")) for s in range(250, 391, 30)]
    if reset:
        steps.append((T0 + 200_000, a["C"], "rst", "server"))
    if answered:
        steps += [(T0 + 122_000, a["C"], "hb", _hb("C@1")), (T0 + 122_000, a["C"], "rst", "server")]
    pcap_tool.write_script(path, sorted(steps, key=lambda x: x[0]))


CRASH_T = T0 + 92_001  # one past the old connections' last packet (C's heartbeat at 92 s)


def check_crash_capture(f):
    assert [(r["stopped_ms"] - T0, r["start_ms"] - T0, r["clients_ended"], r["seen"]) for r in f["broker_boots"]] == [
        (92_001, 250_000, 3, "new connections, none surviving")]
    # the old memberships end at the restart: not expiries (the outage is longer than the expiry), not vanished
    for role, group in (("consumer", "G"), ("producer", bl.CLIENT_INNER_PRODUCER)):
        assert _size_at(f, role, group, CRASH_T - 1) == 3 and _size_at(f, role, group, CRASH_T) == 0
        assert _size_at(f, role, group, T0 + 249_000) == 0 and _size_at(f, role, group, T0 + 252_000) == 3
    assert f["expired_clients"] == [] and f["vanished_clients"] == []
    # coming back after the restart is no reconnect (flap_min_reconnects 1: any reconnect would flag)
    assert f["flapping_clients"] == []


FLAP_ONE = ScanParams(flap_min_reconnects=1)


def test_a_capture_names_a_broker_restart_whose_closes_it_did_not_see(tmp_path):
    from engine.bindings import pcap

    for kw in ({"reset": True}, {"answered": True}):
        cap = tmp_path / f"{next(iter(kw))}.pcap"
        crash_capture(cap, **kw)
        check_crash_capture(pcap.scan_local([cap], FLAP_ONE))
    cap = tmp_path / "crash.pcap"
    crash_capture(cap)
    f = pcap.scan_local([cap], FLAP_ONE)
    check_crash_capture(f)
    html = _report_text(f)
    assert "Broker restarts" in html and ts(CRASH_T) in html and "new connections, none surviving" in html
    cannot = html[html.index("What this input cannot show"):]
    cannot = cannot[:cannot.index("</table>")]
    # a capture shows a restart without closes now; what it cannot show is a broker not back while it ran
    assert "broker_restarts" in cannot and "not back while the capture ran" in cannot
    assert "shows no stop: its clients' connections go quiet" not in cannot
    assert f["broker_boots"] == pcap.broker_restarts(pcap.read_local([cap])[1])


def test_a_client_reconnecting_alone_or_a_surviving_connection_is_no_restart(tmp_path):
    from engine.bindings import pcap

    for kw in ({"alone": True}, {"survivor": True}):
        cap = tmp_path / f"{next(iter(kw))}.pcap"
        crash_capture(cap, **kw)
        f = pcap.scan_local([cap], FLAP_ONE)
        assert f["broker_boots"] == [], kw
        # their silence is an expiry as before, and their reconnect counts (a reconnect, not a restart's)
        back = "A" if kw.get("alone") else "AB"
        assert sorted(r["client_id"] for r in f["expired_clients"]) == [f"{c}@1" for c in back], kw
        assert sorted(r["client_id"] for r in f["flapping_clients"]) == [f"{c}@1" for c in back], kw


def test_reconnects_after_a_restart_the_broker_closed_are_no_flapping(tmp_path):
    from engine.bindings import pcap

    cap = tmp_path / "restart.pcap"
    restart_capture(cap)
    f = pcap.scan_local([cap], FLAP_ONE)
    check_restart_capture(f)
    assert f["broker_boots"][0]["seen"] == "the broker closed its connections"
    assert f["flapping_clients"] == []


@pytest.mark.spark
@pytest.mark.slow
def test_spark_silent_restart_is_the_local_one(spark, tmp_path):
    from engine.bindings import pcap

    def comparable(f):
        return {k: f[k] for k in ("broker_boots", "group_sizes", "expired_clients", "vanished_clients",
                                  "flapping_clients", "heartbeat_gaps")}

    for kw in ({}, {"reset": True}, {"answered": True}, {"alone": True}, {"survivor": True}):
        cap = tmp_path / f"crash{len(kw)}{next(iter(kw), '')}.pcap"
        crash_capture(cap, **kw)
        got, ref = pcap.scan(spark, [cap], FLAP_ONE), pcap.scan_local([cap], FLAP_ONE)
        if not kw or kw.get("reset") or kw.get("answered"):
            check_crash_capture(got)
        assert comparable(got) == comparable(ref), kw
    cap = tmp_path / "restart.pcap"
    restart_capture(cap)
    got, ref = pcap.scan(spark, [cap], FLAP_ONE), pcap.scan_local([cap], FLAP_ONE)
    assert got["flapping_clients"] == ref["flapping_clients"] == []


def test_a_recording_report_says_what_it_cannot_show(tmp_path):
    from engine.recording import scan_py
    from engine.recording.synth import FleetConfig, generate

    generate(tmp_path / "rec", FleetConfig(clients=6, groups=2, days=0.02, seed=3))
    f = scan_py.scan(tmp_path / "rec")
    assert "vanished_clients" not in f and all(r["cause"] == "inferred" for r in f["expired_clients"])
    html = _report_text(f)
    assert "What this input cannot show" in html and "vanished_clients" in html and "broker_restarts" in html


# --- a log and its capture: one timeline of the same history (issue 28 §6) ------------------------------------------


def history_log(a: dict) -> Log:
    """The broker's log of history_capture's run: it started 60 s before; I idle-closed at 180 s (its last heartbeat
    120 s old), K's channel closed at 70 s (a kill: a recent heartbeat), R's at 75 s and R back at 100 s, U
    unregistered at 65 s, S removed by the SCAN at 185 s (its connection open), E live."""
    log = Log()
    log.boot(T0 - 60_000)

    def channel(c, ms, st="-"):
        return (f"ClientChannelInfo [channel=[id: 0x{ord(c):08x}, L:/10.0.0.1:10911 {st} R:/{a[c]}], clientId={c}@1, "
                f"language=JAVA, version=409, lastUpdateTimestamp={ms}]")

    def register(c, ms):
        log.add(ms, f"new consumer connected, group: G CONSUME_PASSIVELY CLUSTERING channel: {channel(c, ms)}")
        log.add(ms, f"new producer connected, group: CLIENT_INNER_PRODUCER channel: {channel(c, ms)}")

    def closed(ms, c, lut):
        log.add(ms, f"NETTY EVENT: remove channel[{channel(c, lut, '!')}][{a[c]}] from ProducerManager "
                    "groupChannelTable, producer group: CLIENT_INNER_PRODUCER", thread="NettyEventExecutor")
        log.add(ms, f"NETTY EVENT: remove not active channel[{channel(c, lut, '!')}] from ConsumerGroupInfo "
                    "groupChannelTable, consumer group: G", level="WARN", thread="NettyEventExecutor")

    for c in "IKRUSE":
        register(c, T0)
    log.add(T0 + 65_000, f"unregister a consumer[G] from consumerGroupInfo {channel('U', T0 + 60_000)}",
            thread="ClientManageThread_1")
    log.add(T0 + 65_000, f"unregister a producer[CLIENT_INNER_PRODUCER] from groupChannelTable "
                         f"{channel('U', T0 + 60_000)}", thread="ClientManageThread_1")
    closed(T0 + 70_000, "K", T0 + 60_000)
    closed(T0 + 75_000, "R", T0 + 60_000)
    a["R"] = "10.0.9.9:49000"
    register("R", T0 + 100_000)
    closed(T0 + 180_000, "I", T0 + 60_000)
    t = "ClientHousekeepingScheduledThread1"
    log.add(T0 + 185_000, f"SCAN: remove expired channel[{a['S']}] from ProducerManager groupChannelTable, producer "
                          "group name: CLIENT_INNER_PRODUCER", level="WARN", thread=t)
    log.add(T0 + 185_000, f"SCAN: remove expired channel from ConsumerManager consumerTable. channel={a['S']}, "
                          "consumerGroup=G", level="WARN", thread=t)
    return log


def _merged_history(tmp_path, spark=None):
    from engine.bindings import merge, pcap

    d = tmp_path / "broker-a"
    d.mkdir(parents=True, exist_ok=True)
    a = history_capture(tmp_path / "history.pcap")
    (d / "broker.log").write_text("\n".join(history_log(dict(a)).lines) + "\n")
    if spark is None:
        lf = bl.scan_local([d], log_tz="UTC", client_ids=True)
        cf = pcap.scan_local([tmp_path / "history.pcap"], client_ids=True)
    else:
        lf = bl.scan(spark, [d], log_tz="UTC", client_ids=True)
        cf = pcap.scan(spark, [tmp_path / "history.pcap"], client_ids=True)
    assert merge.same_broker_problem(lf, cf) is None
    return a, lf, cf, merge.merge_log_and_heartbeats(lf, cf, "broker-a")


def check_merged_history(a, lf, cf, m):
    # alone: the log knows S's SCAN (the capture infers it), both see I's idle close and K's kill
    assert [(r["client_id"], r["cause"]) for r in lf["expired_clients"]] == [("I@1", "idle_closed"), ("S@1", "scan")]
    assert [(r["client_id"], r["cause"]) for r in cf["expired_clients"]] == [("I@1", "idle_closed"),
                                                                            ("S@1", "inferred")]
    # together: each once, the log's time and cause, the capture's connection times
    assert [(r["client_id"], r["cause"], r["expired_ms"] - T0, r["source"], r["last_heartbeat_ms"] - T0)
            for r in m["expired_clients"]] == [("I@1", "idle_closed", 180_000, "capture+log", 60_000),
                                               ("S@1", "scan", 185_000, "capture+log", 60_000)]
    assert [(r["client_id"], r["addr"], r["ended_ms"] - T0, r["source"]) for r in m["vanished_clients"]] == [
        ("K@1", a["K"], 70_000, "log")]
    assert m["merged"]["expiries"] == {"both": 2, "log_only": 0, "heartbeats_only": 0}
    assert m["merged"]["clients"] == {"both": 6, "log_only": 0, "heartbeats_only": 0}
    assert [r["start_ms"] - T0 for r in m["broker_boots"]] == [-60_000]
    assert m["flapping_clients"] == [] and m["heartbeat_gaps"] == [] and m["log"]["unattributed_events"] == {}


def test_a_log_and_its_capture_tell_one_history(tmp_path):
    a, lf, cf, m = _merged_history(tmp_path)
    check_merged_history(a, lf, cf, m)
    html = _report_text(m)
    assert "Two inputs, one timeline" in html and "closed idle by the broker" in html
    assert "removed by the broker's SCAN" in html
    cannot = html[html.index("What this input cannot show"):]
    cannot = cannot[:cannot.index("</table>")]
    assert "lines the broker did not write" in cannot and "heartbeat_gaps" not in cannot  # the capture has them


@pytest.mark.spark
@pytest.mark.slow
def test_spark_merged_history_is_the_local_one(spark, tmp_path):
    local = _merged_history(tmp_path / "local")
    on_spark = _merged_history(tmp_path / "spark", spark)
    check_merged_history(*on_spark)

    def comparable(f):  # the findings, not where the files were nor the scans' timings
        f = {k: v for k, v in f.items() if k not in ("scan", "capture")}
        f["log"] = {k: v for k, v in f["log"].items() if k != "files"}
        f["merged"] = {k: v for k, v in f["merged"].items() if k != "inputs"}
        return f

    assert comparable(on_spark[3]) == comparable(local[3])

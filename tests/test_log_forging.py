"""Client data in the broker's own log and on the operator's terminal (issue 26 section 3): a client id holding
JSON-escaped newlines cannot write lines of its own into broker.log (so `rmqhb scan broker.log` cannot be made to
report a victim as flapping), terminal escapes are printed escaped, in the Java-format and in the default log, and
the scan's printed summary holds no raw ESC; a line's bytes have a budget, and a printed set is clipped whole."""
import io
import logging
import re
import sys
import time
import types

import pytest

import engine
from engine.codec.enums import RequestCode
from engine.logutil import EscapedWriter, EscapingFormatter, RateLimitedLog, escape_text
from engine.broker.controller import Broker
from engine.registry import clientlog
from engine.registry.client_registry import ClientRegistry, RegistryConfig

from test_clientlog import broker_log, Lines  # noqa: F401 (fixture)
from test_server import Client, hb_body, make_config

#: a log record's first line in either format (logFormat=rmqhb: with milliseconds; java: whole seconds)
HEADER = re.compile(r"^\d{3,4}-\d\d-\d\d \d\d:\d\d:\d\d(,\d{3})? (INFO|WARN|ERROR|DEBUG) \S+ - ")
VICTIM = "10.1.1.1@victim"


def forged_client_id(i: int) -> str:
    """A client id (under the 512 characters a line shows of it) whose JSON escapes decode to terminal escapes
    and to newlines, each followed by a whole broker.log line: the victim connecting again from another address
    (2 lines per id, 3 ids: 5 reconnects in 5 minutes, a flapping client for the scan)."""
    t0 = (int(time.time()) // 3600 - 1) * 3600  # an hour ago, at the start of a flap window
    lines = []
    for k in range(2):
        t = t0 + 60 * (2 * i + k)
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + ",000"
        lines.append(f"{ts} INFO RocketmqBroker - new producer connected, group: P channel: ClientChannelInfo "
                     f"[channel=[id: 0x0, L:/a - R:/10.1.{i}.{k}:1], clientId={VICTIM}, language=JAVA, version=1, "
                     f"lastUpdateTimestamp={t * 1000}]")
    # "\\n" is the two characters backslash and n: a JSON escape the heartbeat decoder turns into a newline
    return f"evil\\u001b]0;pwned\\u0007\\u001b[31m@{i}" + "".join("\\n" + line for line in lines)


@pytest.mark.parametrize("log_format", ["rmqhb", "java"])
def test_forged_client_id_lines_stay_one_line_each(tmp_path, broker_log, log_format):  # noqa: F811
    """Both log formats (logFormat=rmqhb, the default, and java: 4.9.8's own pattern), as rmqhb serve sets them."""
    from engine.bindings import brokerlog as bl

    if log_format == "java":
        broker_log.setFormatter(clientlog.JavaBrokerFormatter())
    b = Broker(make_config(tmp_path, client_management_rules=4, log_format=log_format)).start()
    try:
        for i in range(3):
            c = Client(b.ports["main"])
            body = hb_body(client_id=forged_client_id(i), group=f"CID_EVIL{i}", producer=f"PID_EVIL{i}")
            assert b"\\n" in body
            assert c.call(RequestCode.HEART_BEAT, {}, body).code == 0
            c.close()
    finally:
        b.stop()
    text = "\n".join(broker_log.lines) + "\n"
    assert "\x1b" not in text and "\x07" not in text
    log_lines = text.split("\n")[:-1]
    # exactly the broker's records, each one line with the log header
    assert len(log_lines) == len(broker_log.lines)
    assert all(HEADER.match(line) for line in log_lines), [x for x in log_lines if not HEADER.match(x)][:3]
    forged = [x for x in log_lines if "clientId=evil\\x1b]0;pwned\\x07\\x1b[31m@0\\n" in x]
    assert len(forged) >= 4 and all(x.count("\\n20") == 2 for x in forged)
    # per connection: the producer and consumer registrations, the subscriptions, the group, the close
    assert sum(x.split(" - ", 1)[1].startswith("new consumer connected, group: CID_EVIL") for x in log_lines) == 3
    path = tmp_path / "broker.log"
    path.write_text(text)
    f = bl.scan_local([path])
    assert f["flapping_clients"] == []
    assert VICTIM not in {e for r in f.get("expired_clients", []) for e in [r["client_id"]]}
    # the test can fail: the same lines unescaped (as before) make the victim flap
    raw = text.replace("\\n", "\n")
    path.write_text(raw)
    assert [r["client_id"] for r in bl.scan_local([path])["flapping_clients"]] == [VICTIM]


def test_client_texts_are_escaped_in_the_default_log_too(caplog):
    """Without the Java formatter (an embedder's handler): the logger itself escapes its lines."""
    reg = ClientRegistry(RegistryConfig(), clock=lambda: 1000)
    caplog.set_level(logging.INFO, logger="RocketmqBroker")
    reg.heartbeat(1, engine.decode_heartbeat(hb_body(client_id="a\\nb\\u001b[31m\\u2028c", producer="P\\rX")))
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    for r in caplog.records:
        handler.emit(r)
    out = handler.stream.getvalue()
    assert out.count("\n") == len(caplog.records) and "\x1b" not in out and "\u2028" not in out
    assert "clientId=a\\nb\\x1b[31m\\u2028c" in out and "group: P\\rX" in out


def test_rate_limited_lines_escape_their_arguments(caplog):
    log = logging.getLogger("test.escape")
    rl = RateLimitedLog(log, burst=5)
    caplog.set_level(logging.INFO, logger="test.escape")
    rl.log(logging.INFO, "k", "closing %s (%s): %s", "1.2.3.4:5", "main", "bad\nline\x1b[2J" + "x" * 2000)
    (r,) = caplog.records
    msg = r.getMessage()
    assert "\n" not in msg and "\x1b" not in msg and "bad\\nline\\x1b[2J" in msg and len(msg) < 600


def test_escaping_formatter_keeps_a_record_on_one_line():
    fmt = EscapingFormatter("%(levelname)s %(message)s")
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "id %s", ("a\nb\x9bc",), None)
    assert fmt.format(rec) == "INFO id a\\nb\\x9bc"
    assert escape_text("plain é 中") == "plain é 中"


def test_escaped_writer_for_the_terminal():
    out = io.StringIO()
    w = EscapedWriter(out, lines=True)
    print("  flapping: a\nb\x1b]0;t\x07 (G)", file=w)
    assert out.getvalue() == "  flapping: a\\nb\\x1b]0;t\\x07 (G)\n"
    out = io.StringIO()
    w = EscapedWriter(out)
    w.write("usage: rmqhb scan\n  --out DIR\x1b[31m\n")
    assert out.getvalue() == "usage: rmqhb scan\n  --out DIR\\x1b[31m\n"


def test_scan_summary_prints_no_raw_escape():
    from engine.bindings.report import print_summary

    findings = {
        "summary": {"records": 3, "clients": 1, "bad_bodies": 0, "first_ms": 0, "last_ms": 1000},
        "inconsistent_subscriptions": [],
        "flapping_clients": [{"client_id": "x\x1b]0;pwned\x07\nfake line", "groups": ["G\x1b[31m"],
                              "reconnects": 4}],
        "heartbeat_gaps": [{"client_id": "y\x1b[2J", "gap_s": 200.0, "start_ms": 0}],
        "expired_clients": [{"client_id": "z\r\n", "groups": ["G"], "expired_ms": 0}],
        "group_sizes": [],
    }
    out = io.StringIO()
    print_summary(findings, out)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "x\\x1b]0;pwned\\x07\\nfake line" in text
    assert not any(line.startswith("fake line") for line in text.split("\n"))


def test_rmqhb_scan_escapes_the_terminal(monkeypatch, capsys):
    """engine.cli.scan_main: whatever the scan prints (its errors name files and their contents) is escaped."""
    import importlib.util

    from engine import cli

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())

    def fake_scan(argv):
        print("rmqhb scan: stopped: \x1b]0;pwned\x07 in a record", file=sys.stderr)
        print("report:\x1b[31m done")
        return 0

    monkeypatch.setattr(cli, "_lazy", lambda module, func: fake_scan)
    assert cli.scan_main([]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\\x1b]0;pwned\\x07" in err and "report:\\x1b[31m done" in out


# ------------------------------------------------------------------------------------------------------------
# bytes, not only lines


def test_a_heartbeat_of_many_tags_writes_a_bounded_line(caplog):
    """tagsSet / codeSet show their first MAX_SET_ELEMENTS elements and "... (N more)" (the clip used to apply per
    tag: 1.2M tags made a 20.8 MB line)."""
    n = 20_000
    sd = types.SimpleNamespace(class_filter_mode=False, topic="T", sub_string=" || ".join(f"t{i}" for i in range(50)),
                               tags=frozenset(f"tag{i}" for i in range(n)), codes=frozenset(range(n)),
                               sub_version=1, expression_type="TAG")
    text = clientlog.subscription_data(sd)
    assert len(text) < 2000, len(text)
    assert f"... ({n - clientlog.MAX_SET_ELEMENTS} more)]" in text
    m = re.search(r"tagsSet=\[(.*?)\], codeSet", text)
    assert m.group(1).count(", ") == clientlog.MAX_SET_ELEMENTS
    # the broker-log parser still reads it
    from engine.recording import _brokerlog_py as twin

    line = f"2026-01-01 00:00:00,000 INFO RocketmqBroker - subscription changed, add new topic, group: G {text}"
    batch, stats = twin.parse_lines([line.encode()])
    assert [(e["kind"], e["topic"]) for e in batch.to_pylist()] == [("sub_add", "T")], stats


def test_client_log_bytes_have_a_budget(caplog):
    """clientManageLogBytesPerMinute: past it lines are left out and counted, whatever their count."""
    t = [0.0]
    reg = ClientRegistry(RegistryConfig(client_log_bytes_per_minute=20_000), clock=lambda: 1000)
    reg.client_log.clock = lambda: t[0]
    caplog.set_level(logging.INFO, logger="RocketmqBroker")
    for ch in range(200):
        hb = engine.decode_heartbeat(hb_body(client_id=f"x@{ch}" + "c" * 400, group=f"G{ch}"))
        reg.heartbeat(ch, hb)
    written = sum(len(r.getMessage()) for r in caplog.records)
    assert 15_000 < written <= 20_000 and reg.client_log.bytes_written == written
    assert reg.client_log.left_out > 0
    t[0] = 61.0
    caplog.clear()
    reg.heartbeat(999, engine.decode_heartbeat(hb_body(client_id="y@1", group="G999")))
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("client-management log budget: ") and "clientManageLogBytesPerMinute=20000" in m
               for m in lines)
    assert any(m.startswith("new consumer connected, group: G999") for m in lines)


def test_budgeted_lines_of_another_logger():
    """ClientEventLog.log (the gRPC session-close lines): lines and bytes budgeted, texts escaped."""
    t = [0.0]
    budget = clientlog.ClientEventLog(per_minute=5, clock=lambda: t[0], bytes_per_minute=10_000)
    other = logging.getLogger("test.other")
    other.setLevel(logging.INFO)
    records = []
    h = logging.Handler()
    h.emit = records.append
    other.addHandler(h)
    try:
        for i in range(50):
            budget.log(other, logging.INFO, "grpc_session_removed", "gRPC client %s (%s) removed: %s",
                       f"id\n{i}", "1.2.3.4:5", "expired")
        assert len(records) == 5 and budget.left_out == 45
        assert records[0].getMessage() == "gRPC client id\\n0 (1.2.3.4:5) removed: expired"
        records.clear()
        wide = clientlog.ClientEventLog(per_minute=1000, clock=lambda: t[0], bytes_per_minute=2000)
        for i in range(10):
            wide.log(other, logging.INFO, "big", "%s", "z" * 3000)  # each clipped to MAX_FIELD characters
        assert [len(r.getMessage()) for r in records] == [clientlog.MAX_FIELD] * 3 and wide.left_out == 7
    finally:
        other.removeHandler(h)


def test_config_property():
    from engine.broker.config import BrokerConfig, ConfigError

    cfg = BrokerConfig.load(None, {"clientManageLogBytesPerMinute": "1000"})
    assert cfg.client_manage_log_bytes_per_minute == 1000
    assert BrokerConfig().client_manage_log_bytes_per_minute == 32 << 20
    with pytest.raises(ConfigError):
        BrokerConfig.load(None, {"clientManageLogBytesPerMinute": "-1"})


def test_grpc_session_close_lines_have_the_budget(tmp_path, caplog):
    """gRPC session-close lines had no budget (6,000 lines in 4.5 s): they go through the client-management
    log's (clientManageLogLinesPerMinute, scaled down to 3), their client ids escaped."""
    from conftest import require_module

    require_module("grpc")
    require_module("rocketmq.grpc_protocol")
    from test_grpc_endpoint import Telemetry, free_port, md, producer_settings, sg, s

    import grpc

    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), client_manage_log_lines_per_minute=3)).start()
    caplog.set_level(logging.INFO)
    channel = grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}")
    try:
        stub = sg.MessagingServiceStub(channel)
        for i in range(8):
            cid = f"p\\n{i}"  # metadata carries no raw newline; its escape form is the client's text
            t = Telemetry(stub, md(cid))
            t.send(settings=producer_settings("TopicP"))
            t.recv()
            r = stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=md(cid))
            t.end()
            assert r.status.code == 20000
    finally:
        channel.close()
        b.stop()
    removed = [r.getMessage() for r in caplog.records if " removed: " in r.getMessage()
               and r.getMessage().startswith("gRPC client ")]
    assert len(removed) == 3, removed
    assert b.registry.client_log.left_out >= 5


def test_a_traceback_cannot_start_a_record():
    """An exception's message may hold a client's text: its lines stay inside the traceback."""
    fmt = clientlog.JavaLogFormatter()
    try:
        raise ValueError("bad id x\n2026-01-01 00:00:00,000 INFO RocketmqBroker - new producer connected\x1b[2J")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "handling %s failed", ("a\nb",), sys.exc_info())
    lines = fmt.format(rec).split("\n")
    assert lines[0].endswith(" ERROR x - handling a\\nb failed")
    assert sum(bool(HEADER.match(line)) for line in lines) == 1
    assert "  2026-01-01 00:00:00,000 INFO RocketmqBroker - new producer connected\\x1b[2J" in lines

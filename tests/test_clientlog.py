"""Java's client-management log lines (issue 18 item 4): our broker's log of a client run, read by the project's
broker-log parser (engine.recording._brokerlog and its twin), gives the same event kinds as the real RocketMQ 4.9.8 broker's
log of the same runs (/work/shared/samples); the fields parse (client id, address, group, subscriptions); the lines
have a budget a client cannot exceed."""
import importlib
import logging
import os
from pathlib import Path

import pytest

from engine import RemotingCommand
from engine.recording import _brokerlog_py as twin
from engine.registry import clientlog
from engine.broker.controller import Broker
from engine.codec.enums import RequestCode
from engine.registry.client_registry import ClientRegistry, RegistryConfig

from conftest import strict
from test_server import Client, hb_body, make_config, wait_until

SAMPLE = Path(os.environ.get("ENGINE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared")) / "samples" / \
    "rocketmq-4.9.8-broker.log"

try:
    native = importlib.import_module("engine.recording._brokerlog")
except ImportError:  # pragma: no cover - not built
    native = None
if native is None and strict():
    raise RuntimeError("engine.recording._brokerlog is not built (required under CI=true / ENGINE_REQUIRE_NATIVE=1)")
PARSERS = [twin.parse_lines] + ([native.parse_lines] if native is not None else [])


class Lines(logging.Handler):
    """Every record of the process, formatted as `rmqhb serve` writes them (logback's broker pattern)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(clientlog.JavaLogFormatter())
        self.lines = []

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture
def broker_log():
    handler = Lines()
    root = logging.getLogger()
    old_level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old_level)


def kinds(lines, parse):
    batch, stats = parse(list(lines))
    return batch.to_pylist(), stats


def client_run(b, tmp_path):
    """The sample's runs with a Java 4.9.8 client's heartbeat body (consumer CID_J on TopicTest and its retry
    topic, producers PID_J and CLIENT_INNER_PRODUCER): a clean start/stop, a kill, a client that goes silent."""
    port = b.ports["main"]
    body = hb_body(client_id="127.0.0.1@JavaDriver-1-1", group="CID_J", producer="PID_J")
    # run 1: start, a rebalance bumps the retry subscription's subVersion, clean shutdown (one unregister per group)
    c = Client(port)
    assert c.call(RequestCode.HEART_BEAT, {}, body).code == 0
    assert c.call(RequestCode.HEART_BEAT, {}, body.replace(b"1718000000001", b"1718000009999")).code == 0
    for ext in ({"consumerGroup": "CID_J"}, {"producerGroup": "PID_J"}, {"producerGroup": "CLIENT_INNER_PRODUCER"}):
        assert c.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "127.0.0.1@JavaDriver-1-1", **ext}).code == 0
    c.close()
    # run 2: killed: the connection closes without an unregister
    body2 = body.replace(b"JavaDriver-1-1", b"JavaDriver-2-2")
    k = Client(port)
    assert k.call(RequestCode.HEART_BEAT, {}, body2).code == 0
    k.close()
    assert wait_until(lambda: b.call(b.registry.consumer_ids, "CID_J") == [], 10)
    # run 3: frozen with its connection open: the expiry scan removes it
    body3 = body.replace(b"JavaDriver-1-1", b"JavaDriver-3-3")
    f = Client(port)
    assert f.call(RequestCode.HEART_BEAT, {}, body3).code == 0
    later = b.call(b.registry._clock) + b.config.channel_expired_timeout + 10_000
    assert b.call(b.scan_expired, later) == 1
    assert f.closed_by_peer(10)
    return c, k, f


@pytest.mark.parametrize("rules", [4, 5])
def test_our_broker_log_reads_as_the_java_brokers(tmp_path, broker_log, rules):
    b = Broker(make_config(tmp_path, client_management_rules=rules)).start()
    try:
        c, k, f = client_run(b, tmp_path)
    finally:
        b.stop()
    sample = [line for line in SAMPLE.read_text().split("\n")]
    for parse in PARSERS:
        java_events, _ = kinds(sample, parse)
        ours, stats = kinds(broker_log.lines, parse)
        assert not [k_ for k_ in stats["counts"] if k_.startswith("malformed_") or k_ == "invalid_utf8"], stats
        # the client-management events (the broker's own life, e.g. our boot line, is not part of the client runs)
        java_kinds = {(e["kind"], e["role"]) for e in java_events if e["role"] != "broker"}
        our_kinds = {(e["kind"], e["role"]) for e in ours if e["role"] != "broker"}
        if rules == 4:
            assert our_kinds == java_kinds
        else:  # 5.x also says when a producer group goes (close, scan)
            assert our_kinds == java_kinds | {("group_removed", "producer"), ("group_cleared", "producer")}
        # the fields: the run's client ids, its connections' addresses, groups and subscriptions
        reg = [e for e in ours if e["kind"] == "register"]
        version = RemotingCommand(RequestCode.HEART_BEAT).version  # the test client's request header version
        assert {(e["role"], e["group"], e["client_id"], e["language"], e["version"]) for e in reg} >= {
            ("consumer", "CID_J", "127.0.0.1@JavaDriver-1-1", "JAVA", version),
            ("producer", "PID_J", "127.0.0.1@JavaDriver-2-2", "JAVA", version)}
        first = reg[0]
        assert first["addr"].startswith("127.0.0.1:") and first["last_update_ms"] > 1_700_000_000_000
        subs = {(e["topic"], e["sub_string"], e["sub_version"]) for e in ours if e["kind"] == "sub_add"}
        assert subs >= {("TopicTest", "TagA || TagB", 1718000000000), ("%RETRY%CID_J", "*", 1718000000001)}
        change = [e for e in ours if e["kind"] == "sub_change"]
        assert [(e["topic"], e["old_sub_version"], e["sub_version"]) for e in change] == [
            ("%RETRY%CID_J", 1718000000001, 1718000009999)]
        data = [e for e in ours if e["kind"] == "consumer_data"]
        assert data and all(e["sub_key"] == data[0]["sub_key"] for e in data)
        assert '"TopicTest","TAG","TagA || TagB"' in data[0]["sub_key"]
        closed = [(e["role"], e["group"], e["client_id"]) for e in ours if e["kind"] == "closed"]
        assert sorted(closed) == [("consumer", "CID_J", "127.0.0.1@JavaDriver-2-2"),
                                  ("producer", "CLIENT_INNER_PRODUCER", "127.0.0.1@JavaDriver-2-2"),
                                  ("producer", "PID_J", "127.0.0.1@JavaDriver-2-2")]
        expired = sorted((e["role"], e["group"]) for e in ours if e["kind"] == "expired")
        assert expired == [("consumer", "CID_J"), ("producer", "CLIENT_INNER_PRODUCER"), ("producer", "PID_J")]
        assert [e["group"] for e in ours if e["kind"] == "group_created"] == ["CID_J"]
    # Java's level names and the logger name where Java has the thread's
    assert any(" WARN RocketmqBroker - NETTY EVENT: remove not active channel[" in line for line in broker_log.lines)
    assert any(" INFO RocketmqBroker - new consumer connected, group: CID_J CONSUME_PASSIVELY CLUSTERING channel: "
               "ClientChannelInfo [channel=[id: 0x" in line for line in broker_log.lines)


def test_client_log_lines_have_a_budget(caplog):
    """A client that connects and registers in a loop cannot make the broker log at its rate: past
    clientManageLogLinesPerMinute lines of a kind they are counted, and one line says how many were left out."""
    import engine

    t = [0.0]
    reg = ClientRegistry(RegistryConfig(client_log_lines_per_minute=3), clock=lambda: 1000)
    reg.client_log.clock = lambda: t[0]
    hb = engine.decode_heartbeat(hb_body(client_id="x@1"))
    caplog.set_level(logging.INFO, logger="RocketmqBroker")
    for ch in range(50):
        reg.heartbeat(ch, hb)
        reg.close_channel(ch)
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("new consumer connected") for m in lines) == 3
    assert sum(m.startswith("NETTY EVENT: remove not active channel") for m in lines) == 3
    assert reg.client_log.left_out > 0
    t[0] = 61.0
    caplog.clear()
    reg.heartbeat(99, hb)
    lines = [r.getMessage() for r in caplog.records]
    assert "client-management log budget: 47 'new_consumer' lines left out in the last 60 s " \
           "(clientManageLogLinesPerMinute=3, clientManageLogBytesPerMinute=33554432)" in lines
    assert any(m.startswith("new consumer connected") for m in lines)


def test_client_supplied_texts_are_clipped(caplog):
    import engine

    reg = ClientRegistry(RegistryConfig(), clock=lambda: 1000)
    long_id = "c" * 5000
    caplog.set_level(logging.INFO, logger="RocketmqBroker")
    reg.heartbeat(1, engine.decode_heartbeat(hb_body(client_id=long_id, group="G" * 100)))
    assert caplog.records and max(len(r.getMessage()) for r in caplog.records) < 3000


@pytest.mark.parametrize("rules", [4, 5])
def test_a_consumer_channel_taken_over_reads_as_client_changed(tmp_path, broker_log, rules):
    """ConsumerGroupInfo.updateChannel's ERROR line (another client id on a member's channel) in the wording of
    the rules' version: the broker-log scan reads it as the channel's hand-over to the new client id."""
    b = Broker(make_config(tmp_path, client_management_rules=rules)).start()
    try:
        c = Client(b.ports["main"])
        for cid in ("127.0.0.1@A", "127.0.0.1@B"):
            body = hb_body(client_id=cid, group="CID_J", producer="PID_J")
            assert c.call(RequestCode.HEART_BEAT, {}, body).code == 0
        c.close()
    finally:
        b.stop()
    assert any((" ERROR RocketmqBroker - [BUG] consumer channel exist in broker" if rules == 4 else
                " ERROR RocketmqBroker - ConsumerGroupInfo: consumer channel exists") in line
               for line in broker_log.lines)
    for parse in PARSERS:
        events, stats = kinds(broker_log.lines, parse)
        assert "unknown_client_message" not in stats["counts"], stats
        changed = [(e["group"], e["client_id"]) for e in events if e["kind"] == "client_changed"]
        assert changed == [("CID_J", "127.0.0.1@B")]

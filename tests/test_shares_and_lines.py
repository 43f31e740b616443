"""Shares and log lines left open by issue 26's review, each attack scaled down:

1. per-address shares count an IPv6 client by its /64 (anyone with a /64 had 2^64 "addresses"): the gRPC port's
   grpcMax*PerIp and the remoting port's maxConnectionsPerIp; a gRPC connection has its own share of sessions
   (grpcMaxSessionsPerConnection), so one connection cannot take what its address's clients share;
2. the recorder's bytes waiting for its writer have a total (recordQueueBytes), not one share per connection: a flood
   of connections is clipped (those above the average first) and a good client's records are kept whole;
3. client texts in the tryLockBatch line and the gRPC endpoint's lines are escaped and budgeted, under a plain
   logging.Formatter (an embedder's default formatter escapes nothing);
4. a .seg that is not a segment is named by its size and reason, not quoted; `segments verify` counts clipped records.
"""
import json
import logging
import time

import pytest

from engine.broker.controller import Broker, auto_create_share_key
from engine.broker.shares import share_key
from engine.codec.enums import RequestCode
from engine.recording.recorder import HeartbeatRecorder, iter_records, parse_clipped, scan_segment, verify
from engine.registry.clientlog import ClientEventLog
from engine.registry.rebalance import RebalanceLockManager
from test_recorder_share import StalledWriter
from test_server import Client, broker_factory, hb_body, make_config  # noqa: F401  (fixtures)

ESC = "\x1b"
EVIL = "10.0.0.9@evil\n2026-01-01 00:00:00 INFO forged line " + ESC + "]0;owned\x07" + ESC + "[31m"


def test_share_key_is_an_ipv4_address_or_an_ipv6_64():
    assert share_key("10.1.2.3") == "10.1.2.3"
    assert share_key("2001:db8::1") == share_key("[2001:db8::ffff:1]") == share_key("2001:db8:0:0:1::9") \
        == "2001:db8::/64"
    assert share_key("2001:db8:0:1::1") == "2001:db8:0:1::/64"
    assert share_key("fe80::1%eth0") == "fe80::/64"
    # a dual-stack listener's IPv4 clients are their IPv4 addresses, not one ::ffff:0:0/64 for all of them
    assert share_key("::ffff:10.0.0.1") == "10.0.0.1" and share_key("::ffff:10.0.0.2") == "10.0.0.2"
    assert share_key("not an address:x") == "not an address:x" and share_key("") == ""
    assert auto_create_share_key is share_key  # the topic share (autoCreateTopicsPerIp) keys alike


# ------------------------------------------------------------------------------------------ remoting per-address


class FakeConn:
    """What RemotingServer's accept bookkeeping reads of a connection (an IPv6 source address cannot be made
    over loopback here: one host's ::1 only)."""

    def __init__(self, ip, port):
        self.remote_ip, self.remote_addr = ip, f"[{ip}]:{port}"
        self.id, self.close_reason, self.rejected, self.closed = -port, None, None, None

    def close(self, reason, level=logging.INFO):
        self.closed = self.close_reason = reason


def test_max_connections_per_ip_counts_an_ipv6_64(broker_factory):  # noqa: F811
    b = broker_factory(max_connections_per_ip=2)
    server = b.server
    same64 = [FakeConn(f"2001:db8::{k}", 40000 + k) for k in range(1, 4)]
    other = FakeConn("2001:db8:0:1::1", 40010)
    v4 = Client(b.ports["main"])  # an IPv4 client counts under its own address, as before
    try:
        for conn in (*same64, other):
            b.call(server._on_connection_made, conn)
        assert [c.rejected is None for c in same64] == [True, True, False]
        assert "too many connections from 2001:db8::/64" in same64[2].rejected
        assert other.rejected is None
        per_ip = b.call(lambda: dict(server.per_ip))
        assert per_ip == {"2001:db8::/64": 2, "2001:db8:0:1::/64": 1, "127.0.0.1": 1}
        assert b.metrics.connections_rejected["max_connections_per_ip"] == 1
        b.call(server._on_connection_lost, same64[0], None)  # a connection of the /64 ends: its share is back
        fresh = FakeConn("2001:db8::77", 40077)
        b.call(server._on_connection_made, fresh)
        assert fresh.rejected is None
        assert b.call(lambda: dict(server.per_ip))["2001:db8::/64"] == 2
        for conn in (same64[1], other, fresh):
            b.call(server._on_connection_lost, conn, None)
        assert b.call(lambda: dict(server.per_ip)) == {"127.0.0.1": 1}
    finally:
        v4.close()


# ------------------------------------------------------------------------------------------ gRPC


@pytest.fixture
def gbroker(tmp_path):
    from conftest import require_module

    require_module("grpc")
    require_module("rocketmq.grpc_protocol")
    from test_grpc_endpoint import free_port

    b = Broker(make_config(tmp_path, grpc_server_port=free_port())).start()
    yield b
    b.stop()


class FakeContext:
    """A call's context as the endpoint reads it: metadata and peer (a peer of any address, IPv6 included)."""

    def __init__(self, client_id, peer):
        self._md = (("x-mq-client-id", client_id), ("x-mq-language", "JAVA"), ("x-mq-client-version", "5.0.7"))
        self._peer = peer

    def invocation_metadata(self):
        return self._md

    def peer(self):
        return self._peer


def test_grpc_shares_count_an_ipv6_64(gbroker):
    """A client with a /64 presented each of its addresses as another address and had a share per address."""
    from test_grpc_endpoint import consumer_settings

    ep = gbroker.grpc
    from engine.broker.grpc_endpoint import _BadRequest as bad_request

    ep.max_sessions_per_ip, ep.max_groups_per_ip = 2, 1

    def session(cid, peer):
        return gbroker.call(ep._session, FakeContext(cid, peer), True)

    a = session("a@1", "ipv6:[2001:db8::1]:5000")
    b = session("b@1", "ipv6:%5B2001:db8::2%5D:5001")  # grpc's peer() as some versions quote it
    assert a.ip == b.ip == "2001:db8::/64" and ep._ip_sessions["2001:db8::/64"] == 2
    with pytest.raises(bad_request, match="from this address"):
        session("c@1", "ipv6:[2001:db8::3]:5002")
    assert ep.refused["sessions_per_ip"] == 1 and "c@1" not in ep.sessions
    other = session("d@1", "ipv6:[2001:db8:0:1::1]:5003")  # another /64: another share
    assert other.ip == "2001:db8:0:1::/64"
    # groups: the /64's one group is taken by a's Settings, b (another address of the same /64) is refused
    assert gbroker.call(ep._update_settings, a, consumer_settings("GroupA", [("TopicA", "*")])) is None
    with pytest.raises(bad_request, match="too many groups from this address"):
        gbroker.call(ep._update_settings, b, consumer_settings("GroupB", [("TopicB", "*")]))
    assert ep.refused["groups_per_ip"] == 1
    assert gbroker.call(ep._update_settings, other, consumer_settings("GroupB", [("TopicB", "*")])) is None
    for s in (a, b, other):
        gbroker.call(ep.close_session, s, "test", logging.DEBUG)
    assert not ep._ip_sessions and not ep._ip_groups and not ep._ip_cost and not ep._conn_sessions


def test_one_grpc_connection_has_a_share_of_its_address_sessions(gbroker):
    """Clients behind one address (a NAT) share its grpcMaxSessionsPerIp: one connection creating sessions
    could take it all; it has grpcMaxSessionsPerConnection, and a session that ends gives its slot back."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2_grpc as sg
    from test_grpc_endpoint import Telemetry, md, producer_settings
    from test_grpc_guard import channel_to, refused_stream, start_session

    ep = gbroker.grpc
    assert ep.max_sessions_per_connection == 256  # the default: far above what an SDK multiplexes
    ep.max_sessions_per_connection = 2
    one, two = channel_to(gbroker.ports["grpc"], True), channel_to(gbroker.ports["grpc"], True)
    try:
        stub1, stub2 = sg.MessagingServiceStub(one), sg.MessagingServiceStub(two)
        kept = [start_session(stub1, f"nat@{k}", producer_settings("TopicNat")) for k in range(2)]
        assert all(answer.status.code == d.Code.OK for _, answer in kept)
        t = Telemetry(stub1, md("nat@2"))
        t.send(settings=producer_settings("TopicNat"))
        e = refused_stream(t)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "on this connection" in e.details()
        assert ep.refused["sessions_per_connection"] == 1 and "nat@2" not in ep.sessions
        # another client of the same address on its own connection is not refused
        t2, answer = start_session(stub2, "nat@3", producer_settings("TopicNat"))
        assert answer.status.code == d.Code.OK and "nat@3" in ep.sessions
        # a session of the first connection ends: the connection may create one again
        kept[0][0].end()
        from test_grpc_endpoint import wait_until

        wait_until(lambda: "nat@0" not in ep.sessions)
        t4, answer = start_session(stub1, "nat@4", producer_settings("TopicNat"))
        assert answer.status.code == d.Code.OK
        assert sorted(ep._conn_sessions.values()) == [1, 2]
        for stream in (kept[1][0], t2, t4):
            stream.end()
        wait_until(lambda: not ep.sessions)
        assert not ep._conn_sessions
    finally:
        one.close()
        two.close()


# ------------------------------------------------------------------------------------------ recorder total


def test_the_recorders_waiting_bytes_have_a_total_and_the_fair_share_clips_the_big_first(tmp_path, monkeypatch):
    """Deterministic: queue_bytes 100 kB, shares far above it, the writer stalled (nothing is given back)."""
    stalled = StalledWriter(monkeypatch)
    rec = HeartbeatRecorder(tmp_path / "rec", background=True, queue_blocks=8, block_bytes=1 << 20,
                            connection_share_bytes=1 << 30, clipped_body_bytes=64, queue_bytes=100_000)

    def body(n, tag):
        return b'{"clientID":"' + tag + b'","x":"' + b"y" * (n - 22 - len(tag)) + b'"}'

    def record(t, conn, n):
        rec.record(t, conn, f"10.0.0.{conn}:1", "JAVA", 1, body(n, b"c%d" % conn))
        return rec.waiting_bytes

    try:
        assert record(1, 1, 70_000) == 70_000  # under 3/4: whole
        assert record(2, 2, 1_000) == 71_000
        assert record(3, 1, 5_000) < 71_300  # past 3/4 and above the average: clipped
        assert record(4, 2, 10_000) < 81_300  # below the average: whole
        assert record(5, 3, 9_000) < 90_300
        before = rec.waiting_bytes
        assert record(6, 1, 5_000) == before  # above the average, its clipped record past 7/8: dropped
        assert record(7, 2, 100_000 - before - 20) == 99_980  # below the average: whole up to the total
        assert record(8, 3, 1_000) < 100_000 + 100  # past the total: size and reason only
        assert rec.clipped == {"queue_bytes": 2} and rec.dropped == {"queue_bytes": 1}
        stalled.release()
        rec.flush()
        assert rec.waiting_bytes == 0 and rec._waiting == {}  # all given back once written
    finally:
        stalled.release()
        rec.close()
    records = sorted(iter_records(tmp_path / "rec"), key=lambda r: r.recv_ms)
    assert [r.recv_ms for r in records] == [1, 2, 3, 4, 5, 7, 8]
    clipped = {r.recv_ms: parse_clipped(r.body) for r in records if parse_clipped(r.body) is not None}
    assert sorted(clipped) == [3, 8]
    assert clipped[3].reason == "queue bytes: 71000 bytes waiting, budget 100000, connection above the average 38000"
    assert clipped[3].size == 5_000 and len(clipped[3].head) == 64
    assert clipped[8].reason.startswith("queue bytes: ") and "average" not in clipped[8].reason
    assert clipped[8].size == 1_000 and clipped[8].head == b""
    report = verify(tmp_path / "rec")  # the dropped record is a data-loss marker, the clipped ones counted
    assert report.ok and [(g.records_lost, g.first_ms, g.reason) for _, g in report.data_loss] == [(1, 6, "queue_full")]
    assert report.clipped == {"queue bytes": 2}


def flood_of_connections(rec, n_conns, rounds):
    """n_conns connections each sending 30 kB heartbeats (under their 100 kB share) while a good client
    heartbeats (scaled down from N connections of 16 MiB shares filling a 64-block queue)."""
    big = b'{"clientID":"10.9.9.9@flood","x":"' + b"y" * 30_000 + b'"}'
    good = hb_body(client_id="10.0.0.1@good")
    peak = 0
    for i in range(rounds):
        for conn in range(1, n_conns + 1):
            rec.record(1_700_000_000_000 + i, conn, f"10.9.9.9:{conn}", "JAVA", 1, big)
            peak = max(peak, rec.waiting_bytes)
        rec.record(1_700_000_000_000 + i, 999, "10.0.0.1:999", "JAVA", 1, good)
    return good, peak


@pytest.mark.parametrize("queue_bytes", [200_000, 1 << 40])
def test_a_flood_of_connections_cannot_take_the_queue(tmp_path, monkeypatch, queue_bytes):
    stalled = StalledWriter(monkeypatch)
    rec = HeartbeatRecorder(tmp_path / "rec", background=True, queue_blocks=4, block_bytes=64_000,
                            connection_share_bytes=100_000, clipped_body_bytes=64, queue_bytes=queue_bytes)
    try:
        good, peak = flood_of_connections(rec, 40, 5)
        stalled.release()
        rec.flush()
    finally:
        stalled.release()
        rec.close()
    good_records = [r for r in iter_records(tmp_path / "rec") if r.conn_id == 999]
    if queue_bytes == 1 << 40:  # shares only: 40 connections x 100 kB fill the queue, the good records drop
        assert rec.dropped["queue_full"] > 0 and len(good_records) < 5 and peak > 2 * 200_000
        return
    assert not rec.dropped and [r.body for r in good_records] == [good] * 5
    assert rec.clipped["queue_bytes"] > 150 and "connection_share" not in rec.clipped
    # the bytes waiting stay within the total (clipped records past it keep their size and reason only)
    assert peak <= queue_bytes + 200 * 250, peak
    assert rec.waiting_bytes == 0
    report = verify(tmp_path / "rec")
    assert report.ok and report.clipped == {"queue bytes": rec.clipped["queue_bytes"]}


def test_the_broker_passes_record_queue_bytes(broker_factory, tmp_path):  # noqa: F811
    b = broker_factory(record_dir=str(tmp_path / "rec"), record_queue_bytes=123_456)
    assert b.recorder.queue_bytes == 123_456
    c = Client(b.ports["main"])
    try:
        assert c.call(RequestCode.HEART_BEAT, {}, hb_body(client_id="10.0.0.1@good")).code == 0
    finally:
        c.close()
    b.call(b.recorder.flush)
    assert b.recorder.waiting_bytes == 0 and b.recorder.records_written == 1


# ------------------------------------------------------------------------------------------ log lines


class Captured(logging.Handler):
    """A handler with a plain logging.Formatter, as an embedding program's default: it escapes nothing."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s - %(message)s"))
        self.lines = []

    def emit(self, record):
        self.lines.append(self.format(record))

    def text(self):
        return "\n".join(self.lines)


@pytest.fixture
def captured():
    handlers = []

    def attach(name, level=logging.DEBUG):
        h = Captured()
        logger = logging.getLogger(name)
        old = logger.level
        logger.addHandler(h)
        logger.setLevel(level)
        handlers.append((logger, h, old))
        return h

    yield attach
    for logger, h, old in handlers:
        logger.removeHandler(h)
        logger.setLevel(old)


def assert_escaped(h, records):
    text = h.text()
    assert ESC not in text and "\x07" not in text
    assert len(text.split("\n")) == records  # one line per record: nothing forged
    assert "\\n2026-01-01 00:00:00 INFO forged line" in text


def test_the_trylockbatch_line_is_escaped_and_budgeted(captured):
    h = captured("engine.registry.rebalance")
    now = [0.0]
    budget = ClientEventLog(per_minute=3, clock=lambda: now[0])
    m = RebalanceLockManager(lock_max_live_time_ms=1000, clock=lambda: now[0], client_log=budget)
    mq = ("Topic" + ESC + "[2J", "broker-a", 0)
    for i in range(10):  # each takeover of an expired lock is an INFO line
        assert m.try_lock_batch("G\n" + EVIL, [mq], f"{EVIL}{i}") == [mq]
        now[0] += 2.0
    info = [line for line in h.lines if " INFO " in line.split(" - ", 1)[0]]
    assert len(info) == 3 and budget.left_out == 6  # 9 takeovers, 3 lines of the kind a minute: 6 counted
    assert "try to lock a expired message queue, group=G\\n10.0.0.9@evil\\n2026" in info[0]
    assert_escaped(h, len(h.lines))


def test_the_broker_lock_manager_shares_the_client_log_budget(broker_factory):  # noqa: F811
    b = broker_factory()
    assert b.rebalance_lock_manager.client_log is b.registry.client_log


def test_grpc_handler_failures_are_escaped_and_budgeted(gbroker, captured, monkeypatch):
    """A client text in a failing handler's exception (its topic) reached the log raw, a traceback per call."""
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol import service_pb2_grpc as sg
    from test_grpc_endpoint import md
    from test_grpc_guard import channel_to

    h = captured("engine.grpc")
    ep = gbroker.grpc

    def boom(request):
        raise RuntimeError(f"no route for {request.topic.name}")

    monkeypatch.setattr(ep, "query_route", boom)
    channel = channel_to(gbroker.ports["grpc"])
    try:
        stub = sg.MessagingServiceStub(channel)
        req = s.QueryRouteRequest()
        req.topic.name = EVIL
        for _ in range(20):
            assert stub.QueryRoute(req, metadata=md()).status.code == d.Code.INTERNAL_ERROR
    finally:
        channel.close()
    assert ep.internal_errors == 20
    failed = [line for line in h.lines if "gRPC QueryRoute failed" in line]
    assert len(failed) == 5  # the endpoint's error budget: 5 a minute
    assert "RuntimeError: no route for 10.0.0.9@evil\\n2026-01-01" in failed[0] and "traceback: " in failed[0]
    assert_escaped(h, len(h.lines))


def test_a_restored_grpc_session_line_is_escaped_and_budgeted(gbroker, captured):
    from test_grpc_endpoint import producer_settings

    h = captured("engine.grpc")
    ep = gbroker.grpc
    budget = gbroker.registry.client_log
    until = int(time.time() * 1000) + 60_000
    cid = EVIL.strip()
    ep.dormant[cid] = (producer_settings("TopicR").SerializeToString(), None, "5.0.7", until)
    session = gbroker.call(ep._restore, FakeContext(cid, "ipv4:127.0.0.1:5000"))
    assert session is not None and ep.restored == 1
    restored = [line for line in h.lines if "restored from its Settings" in line]
    assert len(restored) == 1 and budget.bytes_written > 0
    assert_escaped(h, len(h.lines))
    gbroker.call(ep.close_session, session, "test", logging.DEBUG)


# ------------------------------------------------------------------------------------------ segments


SECRET = b"root:x:0:0:root:/root:/bin/bash\nalice:s3cr3t:1000:1000::/home/alice:/bin/sh\n"


def test_scan_segment_names_a_file_that_is_not_a_segment_by_size_only(tmp_path, capsys):
    from engine.cli import main as rmqhb

    passwd = tmp_path / "passwd"
    passwd.write_bytes(SECRET)
    rec = tmp_path / "rec"
    rec.mkdir()
    seg = rec / "hb-0000000000001-000001.seg"
    seg.symlink_to(passwd)
    scan = scan_segment(seg, check_payload=True)
    assert [d.reason for d in scan.corrupt] == [
        f"not a version-1 segment (no segment file header; {len(SECRET):,} bytes not read)"]
    for argv in (["segments", "verify", str(rec)], ["segments", "verify", str(seg), "--json"]):
        assert rmqhb(argv) == 1
        out = capsys.readouterr()
        assert "root:x" not in out.out + out.err and "s3cr3t" not in out.out + out.err
    from engine.recording import scan_py

    findings = json.dumps(scan_py.scan(rec))
    assert "root:x" not in findings and "s3cr3t" not in findings


def test_segments_verify_counts_clipped_records(tmp_path, capsys):
    from engine.cli import main as rmqhb

    rec_dir = tmp_path / "rec"
    with HeartbeatRecorder(rec_dir) as rec:
        rec.record(1, 1, "10.0.0.1:1", "JAVA", 1, hb_body(client_id="10.0.0.1@good"))
        rec.record(2, 2, "10.0.0.2:1", "JAVA", 1, b"{" + b"\x01" * 5000, error="$: malformed JSON")
        rec.record(3, 2, "10.0.0.2:1", "JAVA", 1, b"\x00" * 3)  # a NUL-led body that is no clipped record
    report = verify(rec_dir)
    assert report.ok and report.records == 3 and report.clipped == {"undecodable": 1}
    assert report.to_dict()["clipped"] == {"undecodable": 1}
    assert rmqhb(["segments", "verify", str(rec_dir)]) == 0
    out = capsys.readouterr().out
    assert "CLIPPED 1 records clipped by the recorder (1 undecodable)" in out
    assert out.rstrip().endswith("0 data-loss markers (0 records lost), 1 clipped records")
    seg = next(rec_dir.glob("*.seg"))
    assert rmqhb(["segments", "verify", str(seg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["clipped"] == {"undecodable": 1}

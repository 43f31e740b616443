"""The recorder against hostile heartbeats (issue 26 section 3), scaled down: an undecodable body is recorded
clipped (its first bytes, its size and the reason), a connection has a bounded share of the bytes waiting for the
writer (past it its records are clipped, so it cannot fill the queue and make a good client's records drop), and
the scan readers name clipped records as such, not as damage."""
import threading
import time

import pytest

from engine.codec.enums import RequestCode, ResponseCode
from engine.recording import scan_py
from engine.recording.recorder import (CLIPPED_MAGIC, HeartbeatRecorder, clip_body, iter_records, list_segments,
                                       parse_clipped, verify)
from test_server import Client, broker_factory, hb_body  # noqa: F401  (fixtures)


def test_clip_body_round_trip():
    body = b"{" + b"x" * 5000
    c = clip_body(body, "undecodable: $: malformed JSON", keep=100)
    assert c.startswith(CLIPPED_MAGIC) and len(c) < 200
    assert parse_clipped(c) == (5001, "undecodable: $: malformed JSON", body[:100])
    assert parse_clipped(body) is None and parse_clipped(b"") is None and parse_clipped(CLIPPED_MAGIC[:5]) is None
    long_reason = clip_body(b"", "r" * 1000)
    assert parse_clipped(long_reason).reason == "r" * 200
    # a heartbeat body is JSON: it never starts with the magic's NUL byte
    assert not hb_body().startswith(CLIPPED_MAGIC[:1])


def test_undecodable_bodies_are_recorded_clipped_over_remoting(broker_factory, tmp_path):  # noqa: F811
    """15 MB of garbage per heartbeat grew the recording by its size; now by ~1 KB, and the good client's
    heartbeats are recorded whole."""
    rec_dir = tmp_path / "rec"
    b = broker_factory(record_dir=str(rec_dir))
    good, bad = Client(b.ports["main"]), Client(b.ports["main"])
    garbage = b"{" + b"\x01" * 400_000
    try:
        for _ in range(5):
            r = bad.call(RequestCode.HEART_BEAT, {}, garbage)
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert good.call(RequestCode.HEART_BEAT, {}, hb_body(client_id="10.0.0.1@good")).code == 0
        b.call(b.recorder.flush)
    finally:
        good.close()
        bad.close()
    assert b.recorder.clipped == {"undecodable": 5} and not b.recorder.dropped
    assert 'rocketmq_broker_recorder_records_clipped_total{reason="undecodable"} 5' in b.render_metrics()
    size = sum(p.stat().st_size for p in list_segments(rec_dir))
    assert size < 20_000, size
    records = list(iter_records(rec_dir))
    clipped = [parse_clipped(r.body) for r in records if parse_clipped(r.body) is not None]
    assert len(records) == 10 and len(clipped) == 5
    assert {(c.size, c.head) for c in clipped} == {(len(garbage), garbage[:1024])}
    assert all(c.reason.startswith("undecodable: ") for c in clipped)
    assert [r.body for r in records if parse_clipped(r.body) is None] == [hb_body(client_id="10.0.0.1@good")] * 5
    # the reference scan names them: bad bodies, clipped, no damage
    f = scan_py.scan(rec_dir)
    assert f["summary"]["records"] == 10 and f["summary"]["bad_bodies"] == 5 and f["summary"]["clipped_bodies"] == 5
    assert f["scan"]["clipped"] == {"undecodable": 5}
    assert f["scan"]["corrupt"] == [] and f["scan"]["torn_tails"] == [] and f["scan"]["data_loss"] == []
    assert verify(rec_dir).ok


class StalledWriter:
    """Holds the recorder's writer thread until ``release()`` (a disk slower than the clients)."""

    def __init__(self, monkeypatch):
        self.go = threading.Event()
        original = HeartbeatRecorder._write_block

        def write_block(rec, *cols):
            self.go.wait(30)
            return original(rec, *cols)

        monkeypatch.setattr(HeartbeatRecorder, "_write_block", write_block)

    def release(self):
        self.go.set()


def flood(rec, share):
    """Two connections sending 60 KB heartbeats while a good client heartbeats (scaled from 15 MB bodies and a
    16 MiB share: two connections for 20 s dropped 46 of a good client's 142 records)."""
    big = b'{"clientID":"10.9.9.9@flood","x":"' + b"y" * 60_000 + b'"}'
    good = hb_body(client_id="10.0.0.1@good")
    t = 1_700_000_000_000
    for i in range(40):
        for conn in (1, 2):
            rec.record(t + i, conn, f"10.9.9.9:{conn}", "JAVA", 1, big)
        rec.record(t + i, 3, "10.0.0.1:3", "JAVA", 1, good)
    return good


@pytest.mark.parametrize("share", [100_000, 1 << 30])
def test_one_connection_cannot_take_the_queue(tmp_path, monkeypatch, share):
    stalled = StalledWriter(monkeypatch)
    rec = HeartbeatRecorder(tmp_path / "rec", background=True, queue_blocks=4, block_bytes=64_000,
                            connection_share_bytes=share, clipped_body_bytes=64)
    try:
        good = flood(rec, share)
        stalled.release()
        rec.flush()
    finally:
        stalled.release()
        rec.close()
    records = list(iter_records(tmp_path / "rec"))
    good_records = [r for r in records if r.conn_id == 3]
    if share == 1 << 30:  # no share: the floods fill the queue and the good client's records drop with them
        assert rec.dropped["queue_full"] > 0 and len(good_records) < 40
        return
    assert not rec.dropped and len(good_records) == 40 and all(r.body == good for r in good_records)
    flooded = [r for r in records if r.conn_id in (1, 2)]
    assert len(flooded) == 80
    whole = [r for r in flooded if parse_clipped(r.body) is None]
    clipped = [parse_clipped(r.body) for r in flooded if parse_clipped(r.body) is not None]
    assert len(whole) + len(clipped) == 80 and 2 <= len(whole) <= 4
    assert rec.clipped["connection_share"] == len(clipped)
    assert all(c.size > 60_000 and c.reason.startswith("connection share: ") and len(c.head) == 64 for c in clipped)
    assert rec._waiting == {}  # every byte given back once written
    f = scan_py.scan(tmp_path / "rec")
    assert f["scan"]["clipped"] == {"connection share": len(clipped)}
    assert f["summary"]["clipped_bodies"] == len(clipped) and f["scan"]["data_loss"] == []


def test_undecodable_records_are_charged_to_their_connections_share(tmp_path):
    """Records clipped as undecodable count in their connection's waiting bytes as every record does, and are
    given back with their block: 50 of them on one connection (with 5 good ones) are its share until written, and
    it is 0 after (they were given back without being charged, undercounting the connection's other bytes)."""
    rec = HeartbeatRecorder(tmp_path / "rec", background=True, block_bytes=1 << 30, block_records=10_000,
                            max_block_delay_s=3600)
    try:
        good = hb_body(client_id="10.0.0.1@good")
        for i in range(5):
            rec.record(1000 + i, 9, "1.2.3.4:5", None, 1, good)
        for i in range(50):
            rec.record(2000 + i, 9, "1.2.3.4:5", None, 1, b"{" * 3000, error=f"too deep {i}")
        clipped = [clip_body(b"{" * 3000, f"undecodable: too deep {i}", rec.clipped_body_bytes) for i in range(50)]
        assert rec.clipped["undecodable"] == 50
        assert rec._waiting == {9: 5 * len(good) + sum(map(len, clipped))} == {9: rec.waiting_bytes}
        rec.flush()
        assert rec._waiting == {} and rec.waiting_bytes == 0
    finally:
        rec.close()
    assert [parse_clipped(r.body) is not None for r in iter_records(tmp_path / "rec")] == [False] * 5 + [True] * 50


def test_share_is_given_back_when_a_block_is_dropped(tmp_path, monkeypatch):
    stalled = StalledWriter(monkeypatch)
    rec = HeartbeatRecorder(tmp_path / "rec", background=True, queue_blocks=1, block_bytes=10_000,
                            connection_share_bytes=50_000)
    try:
        for i in range(10):  # one block writing, one queued, the rest dropped: queue_full
            rec.record(1000 + i, 7, "1.2.3.4:5", None, 1, b"{" + b"z" * 20_000)
        assert rec.dropped["queue_full"] > 0
        stalled.release()
        rec.flush()
        assert rec._waiting == {}
    finally:
        stalled.release()
        rec.close()


def test_spark_reader_names_clipped_rows():
    from engine.bindings import segments as seg

    bodies = [clip_body(b"{" * 300, "undecodable: too deep"), hb_body(client_id="a@1"), b"{nope"]
    arr = seg.decode_bodies(bodies, dedupe_bodies=False)
    errors = arr.field("error").to_pylist()
    assert errors[0] == "clipped by the recorder (300 bytes): undecodable: too deep"
    assert errors[1] is None and errors[2] and not errors[2].startswith("clipped")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        HeartbeatRecorder(tmp_path, connection_share_bytes=-1)
    from engine.broker.config import BrokerConfig, ConfigError

    assert BrokerConfig().record_connection_share_bytes == 16 << 20
    assert BrokerConfig.load(None, {"recordConnectionShareBytes": "65536"}).record_connection_share_bytes == 65536
    with pytest.raises(ConfigError):
        BrokerConfig.load(None, {"recordConnectionShareBytes": "-5"})


@pytest.mark.slow
def test_spark_scan_counts_clipped_records_as_the_reference_scan(spark, tmp_path):
    """The Spark scan reads a recording with clipped records as the reference scan does: the same records, bad
    bodies and clients, no damage."""
    from engine.bindings.spark import scan

    body = hb_body(client_id="10.1.1.1@c")
    with HeartbeatRecorder(tmp_path, block_records=4) as rec:
        t = 1_700_000_000_000
        for i in range(12):
            rec.record(t + i * 30_000, 1, "10.1.1.1:1", "JAVA", 409, body)
            if i % 3 == 0:
                rec.record(t + i * 30_000 + 5, 2, "10.9.9.9:2", "JAVA", 409, b"{" + b"\x02" * 5000, error="bad")
    ref = scan_py.scan(tmp_path)
    findings = scan(spark, tmp_path)
    for key in ("records", "bad_bodies", "clients"):
        assert findings["summary"][key] == ref["summary"][key]
    assert ref["summary"]["clipped_bodies"] == 4 and ref["summary"]["bad_bodies"] == 4
    assert findings["scan"]["corrupt"] == [] and findings["scan"]["torn_tails"] == []

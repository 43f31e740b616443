"""The recorder off the heartbeat path: writes and compression on its own thread, a failing disk never fails a
heartbeat, the loss is counted and marked in the recording (gap marker), `segments verify` and the scans report it
as data loss, not as silence of the clients."""
import errno
import json
import shutil
import threading
from pathlib import Path

import pytest

from engine.recording import scan_py
from engine.codec.enums import RequestCode, ResponseCode
from engine.recording.recorder import HeartbeatRecorder, iter_records, list_segments, scan_segment, verify
from test_server import Client, broker_factory, consumer_ids, wait_until  # noqa: F401  (fixtures)

OLD_SEGMENT = Path(__file__).parent / "data" / "segment-format1-7cb6009.seg"


class FailingDisk:
    """Makes the recorder's writes fail with ENOSPC while ``on``; remembers the threads that wrote."""

    def __init__(self, monkeypatch):
        self.on = False
        self.threads = set()
        original = HeartbeatRecorder._write_all

        def write_all(rec, data):
            self.threads.add(threading.current_thread().name)
            if self.on:
                raise OSError(errno.ENOSPC, "No space left on device")
            return original(rec, data)

        monkeypatch.setattr(HeartbeatRecorder, "_write_all", write_all)


def beat(c, i, n):
    for k in range(n):
        r = c.heartbeat(client_id=f"10.0.0.{i}@rec")
        assert r.code == ResponseCode.SUCCESS, r.remark


def test_failing_disk_never_fails_a_heartbeat_and_the_loss_is_marked(broker_factory, tmp_path, monkeypatch):
    disk = FailingDisk(monkeypatch)
    rec_dir = tmp_path / "rec"
    b = broker_factory(record_dir=str(rec_dir))
    rec = b.recorder
    c = Client(b.ports["main"])
    try:
        beat(c, 1, 3)
        b.call(rec.flush)
        assert rec.records_written == 3
        disk.on = True
        beat(c, 1, 5)  # served and registered while nothing can be written
        assert consumer_ids(b, "demo_consumer_group") == ["10.0.0.1@rec"]
        b.call(rec.flush)
        assert rec.dropped["write_failed"] == 5 and rec.records_written == 3
        text = b.render_metrics()
        assert 'rocketmq_broker_recorder_records_dropped_total{reason="write_failed"} 5' in text
        disk.on = False
        # the recorder backs off for 1 s after a failure, then writes again: the loss first, as a gap marker
        assert wait_until(lambda: (beat(c, 1, 1), b.call(rec.flush), rec.gaps_written == 1)[-1], timeout=10)
        written_after = rec.records_written
        assert written_after >= 4
    finally:
        c.close()
    b.stop()
    assert disk.threads == {"recorder"}  # compression and writes never ran on the event loop's thread
    report = verify(rec_dir)
    assert report.ok
    lost = report.data_loss
    assert len(lost) == 1 and lost[0][1].reason == "write_failed"
    assert lost[0][1].records_lost == rec.dropped["write_failed"]
    assert "DATA LOSS" in report.format() and report.to_dict()["data_loss"][0]["records_lost"] >= 5
    # every record that was written reads back; the lost ones are accounted for, not invented
    records = list(iter_records(rec_dir))
    assert len(records) == rec.records_written
    findings = scan_py.scan(rec_dir)
    assert findings["scan"]["data_loss"][0]["records_lost"] == lost[0][1].records_lost


def test_full_queue_drops_blocks_without_blocking(tmp_path, monkeypatch):
    gate = threading.Event()
    original = HeartbeatRecorder._write_all

    def slow(rec, data):
        gate.wait(10)
        return original(rec, data)

    monkeypatch.setattr(HeartbeatRecorder, "_write_all", slow)
    rec = HeartbeatRecorder(tmp_path, block_records=2, background=True, queue_blocks=2)
    try:
        for i in range(20):  # 10 blocks against a writer that is stuck: the queue holds 2 (+1 being written)
            rec.record(1000 + i, 1, "10.0.0.1:1", "JAVA", 409, b"{}")
        assert rec.dropped["queue_full"] >= 10
        gate.set()
        rec.flush()
    finally:
        gate.set()
        rec.close()
    report = verify(tmp_path)
    assert sum(g.records_lost for _, g in report.data_loss) == rec.dropped["queue_full"]
    assert report.records == rec.records_written == 20 - rec.dropped["queue_full"]


def test_gap_over_lost_data_is_not_client_silence(tmp_path):
    """A client heartbeating every 30 s; 10 minutes of its records lost by the recorder. Without the marker the
    scan would report a 10-minute gap; with it, the gap is reported as over lost data."""
    body = json.dumps({"clientID": "10.1.1.1@c", "producerDataSet": [{"groupName": "P"}]}).encode()
    with HeartbeatRecorder(tmp_path / "lossy", block_records=4) as rec:
        t = 1_700_000_000_000
        for i in range(10):
            rec.record(t + i * 30_000, 1, "10.1.1.1:1", "JAVA", 409, body)
        rec.flush()
        lost_first, lost_last = t + 10 * 30_000, t + 29 * 30_000
        rec._merge_loss([20, lost_first, lost_last, "write_failed"])
        rec._write_gap()
        for i in range(30, 40):
            rec.record(t + i * 30_000, 1, "10.1.1.1:1", "JAVA", 409, body)
    shutil.copytree(tmp_path / "lossy", tmp_path / "plain")
    # the same recording without the marker (as if the loss had not been recorded)
    for p in list_segments(tmp_path / "plain"):
        data = p.read_bytes()
        gaps = scan_segment(p).gaps
        for g in sorted(gaps, key=lambda g: -g.offset):
            data = data[: g.offset] + data[g.offset + 40:]
        p.write_bytes(data)
    plain = scan_py.scan(tmp_path / "plain", gap_threshold_s=120)
    lossy = scan_py.scan(tmp_path / "lossy", gap_threshold_s=120)
    assert [g["client_id"] for g in plain["heartbeat_gaps"]] == ["10.1.1.1@c"]
    assert lossy["heartbeat_gaps"] == [] and len(lossy["gaps_over_data_loss"]) == 1
    assert lossy["scan"]["data_loss"] == [{"segment": list_segments(tmp_path / "lossy")[0].name, "offset": 
                                           scan_segment(list_segments(tmp_path / "lossy")[0]).gaps[0].offset,
                                           "records_lost": 20, "first_ms": lost_first, "last_ms": lost_last,
                                           "reason": "write_failed"}]
    assert lossy["summary"]["records_lost"] == 20
    # the 10-minute silence would also be an expiry: over lost data it is not one either
    assert [(r["client_id"], r["addr"], r["returned_ms"]) for r in plain["expired_clients"]] == [
        ("10.1.1.1@c", "10.1.1.1:1", t + 30 * 30_000)]
    assert lossy["expired_clients"] == [] and len(lossy["expired_over_data_loss"]) == 1
    assert lossy["summary"]["expired_clients"] == 0 and lossy["summary"]["expired_over_data_loss"] == 1


def test_spark_scan_reports_the_loss(spark, tmp_path):
    from engine.bindings.spark import scan

    body = json.dumps({"clientID": "10.1.1.1@c", "producerDataSet": [{"groupName": "P"}]}).encode()
    with HeartbeatRecorder(tmp_path, block_records=4) as rec:
        t = 1_700_000_000_000
        for i in range(10):
            rec.record(t + i * 30_000, 1, "10.1.1.1:1", "JAVA", 409, body)
        rec.flush()
        rec._merge_loss([20, t + 300_000, t + 870_000, "write_failed"])
        rec._write_gap()
        for i in range(30, 40):
            rec.record(t + i * 30_000, 1, "10.1.1.1:1", "JAVA", 409, body)
    findings = scan(spark, tmp_path)
    assert findings["heartbeat_gaps"] == [] and len(findings["gaps_over_data_loss"]) == 1
    assert findings["expired_clients"] == [] and len(findings["expired_over_data_loss"]) == 1
    assert findings["scan"]["data_loss"][0]["records_lost"] == 20


def test_old_format_segments_still_read(tmp_path):
    """A segment written by the recorder before gap markers existed (7cb6009) reads and verifies as before."""
    shutil.copy(OLD_SEGMENT, tmp_path / OLD_SEGMENT.name)
    report = verify(tmp_path)
    assert report.ok and report.records == 7 and report.data_loss == []
    records = list(iter_records(tmp_path))
    assert [r.recv_ms for r in records] == [1_700_000_000_000 + i * 30_000 for i in range(7)]


def test_recorder_close_is_bounded(tmp_path, monkeypatch):
    """A disk that hangs cannot hold shutdown forever."""
    hang = threading.Event()
    monkeypatch.setattr(HeartbeatRecorder, "_write_all", lambda rec, data: hang.wait(30))
    rec = HeartbeatRecorder(tmp_path, block_records=1, background=True, close_timeout_s=0.5)
    rec.record(1, 1, "a:1", "JAVA", 1, b"{}")
    import time

    t0 = time.monotonic()
    rec.close()
    assert time.monotonic() - t0 < 3
    hang.set()

"""Recorder: segment round trips, rolling, torn tails, corruption, verify CLI, kill -9 crash safety."""
import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import LanguageCode, RemotingError
from engine.recording.recorder import (
    BLOCK_HEADER_SIZE,
    FILE_HEADER_SIZE,
    HeartbeatRecorder,
    Record,
    SegmentError,
    iter_blocks,
    iter_records,
    list_segments,
    read_segment,
    scan_segment,
    segments_verify_main,
    verify,
)

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_718_000_000_000


def make_records(n, seed=0, t0=T0):
    rng = random.Random(seed)
    langs = [LanguageCode.JAVA, LanguageCode.CPP, LanguageCode.GO, None]
    out = []
    t = t0
    for i in range(n):
        t += rng.randrange(0, 50)
        conn = rng.randrange(1, 40)
        body = json.dumps({"clientID": f"10.0.0.{conn}@{conn}#{i}", "n": i, "pad": "x" * rng.randrange(0, 300)}).encode()
        out.append(Record(t, conn, f"10.0.0.{conn}:{40000 + conn}", rng.choice(langs), rng.choice([121, 63, 479]), body))
    return out


def write(directory, records, **kw):
    with HeartbeatRecorder(directory, **kw) as rec:
        for r in records:
            rec.record(*r)
    return rec


def test_round_trip_single_segment(tmp_path):
    records = make_records(1000)
    rec = write(tmp_path, records, block_records=64)
    assert rec.records_written == 1000 and rec.blocks_written == 16 and rec.segments_opened == 1
    (seg,) = list_segments(tmp_path)
    assert read_segment(seg) == records
    assert list(iter_records(tmp_path)) == records
    report = verify(tmp_path)
    assert report.ok and report.records == 1000 and report.blocks == 16 and not report.torn_tails


def test_language_forms_and_unicode(tmp_path):
    rows = [
        (T0, 1, "[::1]:5", "CPP", 1, b"{}"),
        (T0 + 1, 2, "h\u00e9:1", 9, 2, "{\"a\":\"\u4e2d\"}".encode()),
        (T0 + 2, 3, "", None, -1, b""),
        (T0 + 3, 4, b"1.2.3.4:5", "NOPE", 2**31 - 1, bytearray(b"[1]")),
    ]
    write(tmp_path, rows)
    got = list(iter_records(tmp_path))
    assert [g.language for g in got] == [LanguageCode.CPP, LanguageCode.GO, None, None]
    assert [g.remote_addr for g in got] == ["[::1]:5", "h\u00e9:1", "", "1.2.3.4:5"]
    assert [g.body for g in got] == [b"{}", "{\"a\":\"\u4e2d\"}".encode(), b"", b"[1]"]
    assert [g.version for g in got] == [1, 2, -1, 2**31 - 1]


def test_roll_by_size(tmp_path):
    records = make_records(3000, seed=1)
    rec = write(tmp_path, records, max_segment_bytes=20_000, block_records=50)
    segs = list_segments(tmp_path)
    assert rec.segments_opened == len(segs) > 3
    for s in segs[:-1]:
        # a segment is only over the limit when a single block alone is (not the case here)
        assert s.stat().st_size <= 20_000
    assert list(iter_records(tmp_path)) == records


def test_roll_by_age_uses_record_time(tmp_path):
    # 1 record per simulated minute, 10-minute segments -> a new segment every 10 records
    records = [Record(T0 + i * 60_000, 1, "a:1", LanguageCode.JAVA, 1, b"{}") for i in range(100)]
    write(tmp_path, records, max_segment_age_s=600, block_records=1)
    segs = list_segments(tmp_path)
    assert len(segs) == 10
    for i, s in enumerate(segs):
        recs = read_segment(s)
        assert [r.recv_ms for r in recs] == [T0 + (10 * i + k) * 60_000 for k in range(10)]
        assert s.name == f"hb-{T0 + 10 * i * 60_000:013d}-{i + 1:06d}.seg"


def test_flush_writes_partial_block_and_close_is_idempotent(tmp_path):
    rec = HeartbeatRecorder(tmp_path, block_records=1000, max_block_delay_s=3600)
    for r in make_records(10):
        rec.record(*r)
    assert rec.segment_path is None  # nothing written until a block is full or flushed
    rec.flush()
    assert len(list(iter_records(tmp_path))) == 10
    rec.flush()  # nothing pending: no empty block
    assert rec.blocks_written == 1
    rec.close()
    rec.close()
    with pytest.raises(ValueError):
        rec.record(*make_records(1)[0])


def test_block_delay_flushes(tmp_path):
    rec = HeartbeatRecorder(tmp_path, block_records=1000, max_block_delay_s=0.05)
    rec.record(*make_records(1)[0])
    assert not rec.flush_if_due()
    time.sleep(0.06)
    assert rec.flush_if_due()
    assert rec.blocks_written == 1
    rec.close()


def test_block_bytes_limit(tmp_path):
    recs = [Record(T0 + i, 1, "a:1", None, 1, b"x" * 1000) for i in range(100)]
    rec = write(tmp_path, recs, block_records=1000, block_bytes=10_000)
    assert rec.blocks_written == 10
    assert list(iter_records(tmp_path)) == recs


def test_record_batch_matches_record(tmp_path):
    records = make_records(2500, seed=3)
    cols = list(zip(*records))
    with HeartbeatRecorder(tmp_path / "b", block_records=300) as rec:
        rec.record_batch(
            np.array(cols[0]), np.array(cols[1]), [a.encode() for a in cols[2]],
            [255 if x is None else int(x) for x in cols[3]], np.array(cols[4]), list(cols[5]),
        )
    assert rec.blocks_written == 9
    assert list(iter_records(tmp_path / "b")) == records


def test_new_recorder_in_existing_directory_appends(tmp_path):
    a = make_records(10, seed=4)
    write(tmp_path, a)
    write(tmp_path, a)  # same first_ms: the sequence number must keep the names apart
    assert len(list_segments(tmp_path)) == 2
    assert list(iter_records(tmp_path)) == a + a


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        HeartbeatRecorder(tmp_path, block_records=0)
    with pytest.raises(ValueError):
        HeartbeatRecorder(tmp_path, max_segment_bytes=10)
    with pytest.raises(ValueError):
        HeartbeatRecorder(tmp_path, prefix="a/b")
    with pytest.raises(FileNotFoundError):
        list_segments(tmp_path / "missing")


def _three_block_segment(tmp_path, n=30):
    records = make_records(n, seed=5)
    write(tmp_path, records, block_records=n // 3)
    (seg,) = list_segments(tmp_path)
    scan = scan_segment(seg)
    assert len(scan.blocks) == 3 and scan.torn_tail is None and not scan.corrupt
    return seg, records, scan


def test_every_truncation_point_is_a_torn_tail(tmp_path):
    seg, records, scan = _three_block_segment(tmp_path)
    data = seg.read_bytes()
    ends = [FILE_HEADER_SIZE] + [b.end for b in scan.blocks]
    for cut in range(0, len(data)):
        seg.write_bytes(data[:cut])
        complete = sum(1 for e in ends[1:] if e <= cut)
        got = read_segment(seg)
        assert got == records[: complete * 10], cut
        s = scan_segment(seg, check_payload=True)
        assert not s.corrupt
        at_boundary = cut in ends or cut == 0
        assert (s.torn_tail is None) == at_boundary, cut
        if s.torn_tail:
            assert s.torn_tail.offset + s.torn_tail.length == cut
        assert verify(tmp_path).ok


def test_garbage_tail_is_torn_not_corrupt(tmp_path, capsys):
    seg, records, _ = _three_block_segment(tmp_path)
    with open(seg, "ab") as f:
        f.write(b"HBK1" + os.urandom(100))  # a fake magic, then noise
    assert read_segment(seg) == records
    s = scan_segment(seg, check_payload=True)
    assert s.torn_tail is not None and s.torn_tail.length == 104 and not s.corrupt
    assert segments_verify_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "TORN TAIL" in out and "OK:" in out


def test_zero_filled_tail(tmp_path):
    # what a power loss can leave: the file length grew but the pages are zeros
    seg, records, _ = _three_block_segment(tmp_path)
    with open(seg, "ab") as f:
        f.write(b"\0" * 4096)
    assert read_segment(seg) == records
    assert verify(tmp_path).ok and len(verify(tmp_path).torn_tails) == 1


def test_empty_and_short_segment_files(tmp_path):
    (tmp_path / "hb-0000000000001-000001.seg").write_bytes(b"")
    (tmp_path / "hb-0000000000002-000002.seg").write_bytes(b"RMQHB")
    assert list(iter_records(tmp_path)) == []
    report = verify(tmp_path)
    assert report.ok and report.records == 0 and len(report.torn_tails) == 1


@pytest.mark.parametrize("where", ["payload", "header"])
def test_corruption_in_the_middle(tmp_path, capsys, where):
    seg, records, scan = _three_block_segment(tmp_path)
    data = bytearray(seg.read_bytes())
    mid = scan.blocks[1]
    pos = mid.offset + (BLOCK_HEADER_SIZE + 3 if where == "payload" else 6)
    data[pos] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(SegmentError) as ei:
        read_segment(seg)
    assert isinstance(ei.value, RemotingError) and isinstance(ei.value, ValueError)
    assert str(mid.offset) in str(ei.value)
    # skip mode keeps the good blocks on both sides
    assert read_segment(seg, on_corrupt="skip") == records[:10] + records[20:]
    s = scan_segment(seg, check_payload=True)
    assert [(d.offset, d.length) for d in s.corrupt] == [(mid.offset, mid.end - mid.offset)]
    assert s.torn_tail is None
    report = verify(tmp_path)
    assert not report.ok and report.records == 20
    assert segments_verify_main([str(tmp_path)]) == 1
    assert "CORRUPT" in capsys.readouterr().out
    assert segments_verify_main([str(tmp_path), "--json"]) == 1
    js = json.loads(capsys.readouterr().out)
    assert js["ok"] is False and js["corrupt"][0]["offset"] == mid.offset


def test_not_a_segment_file(tmp_path):
    (tmp_path / "x-1-1.seg").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    report = verify(tmp_path)
    assert not report.ok
    with pytest.raises(SegmentError):
        read_segment(tmp_path / "x-1-1.seg")


def test_verify_main_usage(tmp_path, capsys):
    assert segments_verify_main([str(tmp_path / "nope")]) == 2
    write(tmp_path, make_records(5))
    assert segments_verify_main([str(tmp_path), "-v"]) == 0
    assert "5 records" in capsys.readouterr().out


def test_block_columns_are_arrow_ready(tmp_path):
    records = make_records(100, seed=7)
    write(tmp_path, records)
    (block,) = list(iter_blocks(list_segments(tmp_path)[0]))
    assert block.body_offsets.dtype == np.dtype("<i4") and block.body_offsets[0] == 0
    data = bytes(block.body_data)
    assert [data[a:b] for a, b in zip(block.body_offsets[:-1], block.body_offsets[1:])] == [r.body for r in records]
    assert block.recv_ms.tolist() == [r.recv_ms for r in records]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_segments_never_crash(tmp_path_factory, data):
    """Any byte damage: readers raise SegmentError or skip, never anything else; verify never raises."""
    d = tmp_path_factory.mktemp("mut")
    records = make_records(40, seed=data.draw(st.integers(0, 5)))
    write(d, records, block_records=data.draw(st.integers(1, 20)))
    (seg,) = list_segments(d)
    raw = bytearray(seg.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "zero"]))
        pos = data.draw(st.integers(0, max(0, len(raw) - 1)))
        if kind == "flip" and raw:
            raw[pos] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del raw[pos : pos + data.draw(st.integers(1, 64))]
        elif kind == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=64))
        else:
            raw[pos : pos + 8] = b"\0" * len(raw[pos : pos + 8])
    seg.write_bytes(bytes(raw))
    scan = scan_segment(seg, check_payload=True)
    good = sum(b.n_records for b in scan.blocks)
    try:
        got = read_segment(seg, on_corrupt="skip")
    except SegmentError:
        got = None
    if got is not None:
        # what survives is exactly the blocks verify calls good, in write order (CRCs rule out false positives)
        assert len(got) == good
        index = [records.index(r) for r in got]
        assert index == sorted(index)
    try:
        read_segment(seg)
    except SegmentError:
        pass
    verify(d)


# ---------------------------------------------------------------------------------------------------------------
# kill -9 while writing

WRITER = r"""
import sys, json
from engine.recording.recorder import HeartbeatRecorder
directory, seed = sys.argv[1], int(sys.argv[2])
rec = HeartbeatRecorder(directory, max_segment_bytes=200_000, block_records=97, max_block_delay_s=3600)
i = 0
while True:
    pad = "p" * ((i * 7919 + seed) % 900)
    rec.record(1_718_000_000_000 + i, i % 13, "10.1.1.1:%d" % (i % 13), 0, 479, ('{"i":%d,"pad":"%s"}' % (i, pad)).encode())
    i += 1
    if i % 97 == 0:                      # the block was written by record(); say so
        sys.stdout.write("%d\n" % i); sys.stdout.flush()
"""


def _expected_body(i, seed):
    return ('{"i":%d,"pad":"%s"}' % (i, "p" * ((i * 7919 + seed) % 900))).encode()


def kill_writer_once(directory: Path, seed: int):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(seed)], stdout=subprocess.PIPE, env=env)
    rng = random.Random(seed)
    want = rng.randrange(1, 60)
    acked = 0
    for _ in range(want):
        line = proc.stdout.readline()
        if not line:
            break
        acked = int(line)
    time.sleep(rng.random() * 0.01)  # land the kill at a random point of the next blocks
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    got = list(iter_records(directory))
    # every acknowledged block is there, in order, byte for byte; at most whole extra blocks beyond it
    assert len(got) >= acked > 0
    assert len(got) % 97 == 0
    for i, r in enumerate(got):
        assert r.recv_ms == 1_718_000_000_000 + i and r.body == _expected_body(i, seed)
    report = verify(directory)
    assert report.ok, report.format()
    return report


@pytest.mark.parametrize("seed", range(3))
def test_kill_during_writing_keeps_completed_blocks(tmp_path, seed):
    kill_writer_once(tmp_path, seed)


@pytest.mark.slow
def test_kill_loop(tmp_path):
    torn = 0
    for seed in range(120):
        d = tmp_path / str(seed)
        report = kill_writer_once(d, seed)
        torn += len(report.torn_tails)
    print(f"120 kills, {torn} torn tails seen")  # informative: a kill rarely lands inside a write()

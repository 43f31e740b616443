"""The broker-log reader against hostile files (issue 26 sections 2 and 4), scaled down: lines with no end (a .gz
and a sparse file), a file truncated while read (logrotate's copytruncate), impossible timestamps, files that are
not logs (a broker.log linked to a passwd file, a FIFO, a broken gzip). Memory stays bounded, time linear, every
such input is named as damage (count, offset, reason; never its bytes) and never costs the other files their
findings. Native and twin line cutters give the same lines and damage."""
import gzip
import importlib
import io
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import strict
from engine.bindings import brokerlog as bl

try:
    native = importlib.import_module("engine.recording._brokerlog")
except ImportError:  # pragma: no cover - not built
    native = None
if native is None and strict():
    raise RuntimeError("engine.recording._brokerlog is not built (required under CI=true / ENGINE_REQUIRE_NATIVE=1)")
CUTTERS = [False] + ([True] if native is not None else [])

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"root:x:0:0:root:/root:/bin/bash\nsvc:$6$s3cr3tSALT$hash:19000:0:99999:7:::\n"


def _good_logs(d: Path, seed=3) -> dict:
    """A generated broker log with its injected anomalies (what a scan of it must find)."""
    d.mkdir(parents=True, exist_ok=True)
    return bl.generate_broker_log(d / "broker.log", groups=3, members=4, duration_s=1800, tz_offset_min=0,
                                  seed=seed)


def _findings_of(f, broker):
    keys = ("flapping_clients", "expired_clients", "inconsistent_subscriptions", "group_sizes", "retry_topic_churn")
    return {k: [r for r in f[k] if r["broker"] == broker] for k in keys}


def _read(path, native_cut, **kw):
    r = bl.LineReader(str(path), native=native_cut, **kw)
    return [x for a in r for x in a.to_pylist()], r


def _peak(path, native_cut, **kw):
    """(lines, reader, peak bytes Python allocated while reading): a warm-up read first, so that the imports the
    first read makes (pyarrow's, pandas') are not counted."""
    warm = Path(path).with_name("warm" + "".join(Path(path).suffixes))
    with (gzip.open(warm, "wb") if str(path).endswith(".gz") else open(warm, "wb")) as f:
        f.write(b"w\n" + b"x" * (kw["max_line_bytes"] + 1) + b"\nw\nw")  # every path of the reader
    _read(warm, native_cut, **kw)
    tracemalloc.start()
    try:
        lines, r = _read(path, native_cut, **kw)
        return lines, r, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- lines without an end -----------------------------------------------------------------------------------


@pytest.mark.parametrize("native_cut", CUTTERS)
def test_gz_without_line_end_is_skipped_in_bounded_memory(tmp_path, native_cut):
    """The issue's 256 MB .gz with no line end (1.1 GB, then the whole scan aborted), at 1/16: 16 MiB of one line
    read with a 64 KiB line limit costs a few hundred KiB, and the lines after it are read."""
    path = tmp_path / "broker.log.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b"first\n")
        for _ in range(256):
            f.write(b"x" * 65536)
        f.write(b"\nafter\nlast")
    lines, r, peak = _peak(path, native_cut, chunk_bytes=65536, max_line_bytes=65536)
    assert lines == [b"first\n", b"after\n", b"last"]
    assert r.overlong == 1 and peak < 1 << 20, peak
    (d,) = r.damage
    assert d["kind"] == "overlong_line" and d["offset"] == 6 and d["bytes"] == 256 * 65536 + 1
    assert "longer than 65,536 bytes" in d["reason"] and "at byte 6" in d["reason"]


@pytest.mark.parametrize("native_cut", CUTTERS)
def test_sparse_file_without_line_end_is_skipped_in_bounded_memory(tmp_path, native_cut):
    """The issue's 3 GB sparse log (9.3 GB RSS or std::bad_alloc), at 1/48: a 64 MiB hole made by truncate, read
    with a 1 MiB line limit: bounded memory, the line after the hole read, the hole named."""
    path = tmp_path / "broker.log"
    with open(path, "wb") as f:
        f.write(b"2026-11-20 10:00:00 INFO main - before\n")
        f.truncate(64 << 20)
        f.seek(0, 2)
        f.write(b"\n2026-11-20 10:00:01 INFO main - after\n")
    lines, r, peak = _peak(path, native_cut, chunk_bytes=1 << 20, max_line_bytes=1 << 20)
    assert lines == [b"2026-11-20 10:00:00 INFO main - before\n", b"2026-11-20 10:00:01 INFO main - after\n"]
    assert peak < 8 << 20, peak  # a few reads of 1 MiB (the buffer, the line-end scan), not the 64 MiB
    (d,) = r.damage
    assert d["kind"] == "overlong_line" and d["offset"] == 39 and d["bytes"] == (64 << 20) - 39 + 1


@pytest.mark.parametrize("native_cut", CUTTERS)
def test_overlong_lines_inside_one_read_are_dropped_and_counted(tmp_path, native_cut):
    """Whole lines over the limit inside one read (the read larger than the limit) are left out of the batches;
    the lines between them keep their order, and the damage entry counts them all."""
    long = b"y" * 100 + b"\n"
    data = b"a\n" + long + b"b\n" + long + long + b"c\n" + b"z" * 300
    path = tmp_path / "broker.log"
    path.write_bytes(data)
    for chunk in (7, 64, 4096):
        lines, r = _read(path, native_cut, batch_lines=2, chunk_bytes=chunk, max_line_bytes=100)
        assert lines == [b"a\n", b"b\n", b"c\n"], chunk
        (d,) = r.damage
        assert r.overlong == 4 and d["offset"] == 2 and d["bytes"] == 3 * 101 + 300, chunk
    # a line of exactly the limit (its line end included) is read
    lines, r = _read(path, native_cut, chunk_bytes=64, max_line_bytes=101)
    assert lines == [b"a\n", long, b"b\n", long, long, b"c\n"] and r.overlong == 1


def test_bad_gz_next_to_good_log_keeps_the_good_brokers_findings(tmp_path):
    """One bad input never costs the others their findings: a .gz with no line end and a file that is not gzip
    at all beside a good broker's log; the good broker's findings are those of a scan of it alone, and each bad
    file is named as damage (count, offset, reason: no bytes of it)."""
    good = _good_logs(tmp_path / "broker-good")
    bad = tmp_path / "broker-bad"
    bad.mkdir()
    with gzip.open(bad / "broker.log.gz", "wb", compresslevel=1) as f:
        for _ in range(32):
            f.write(b"\x00" * 65536)
    (bad / "broker.1.log.gz").write_bytes(b"NOTGZIP-" + SECRET)
    f = bl.scan_local([tmp_path / "broker-good", bad], log_tz="UTC", max_line_bytes=65536)
    alone = bl.scan_local([tmp_path / "broker-good"], log_tz="UTC", max_line_bytes=65536)
    assert _findings_of(f, "broker-good") == _findings_of(alone, "broker-good")
    assert bl.compare_with_manifest(alone, good) == []
    corrupt = f["scan"]["corrupt"]
    assert [(Path(d["segment"]).name, d["kind"]) for d in corrupt] == [("broker.1.log.gz", "unreadable"),
                                                                      ("broker.log.gz", "overlong_line")]
    assert all(d["broker"] == "broker-bad" for d in corrupt)
    assert corrupt[0]["reason"] == "read failed at byte 0: not a gzip file (bad gzip header)"
    assert corrupt[1]["bytes"] == 32 * 65536 and f["log"]["unparseable_by_kind"]["overlong_line"] == 1
    text = json.dumps(f)
    assert "NOTGZIP" not in text and "root:x" not in text
    assert alone["scan"]["corrupt"] == []


# --- truncated while read ------------------------------------------------------------------------------------


_TRUNCATE = r"""
import os, sys
from engine.bindings import brokerlog as bl
path, native = sys.argv[1], sys.argv[2] == "1"
r = bl.LineReader(path, batch_lines=100, chunk_bytes=4096, native=native)
n = 0
for i, arr in enumerate(r):
    n += len(arr)
    if i == 0:
        os.truncate(path, 0)          # logrotate's copytruncate, between two reads
print(n, [(d["kind"], d["offset"], d["bytes"]) for d in r.damage])
print(r.damage[0]["reason"])
"""


@pytest.mark.parametrize("native_cut", CUTTERS)
def test_file_truncated_while_read_is_named_not_sigbus(tmp_path, native_cut):
    """The issue's SIGBUS (rc 135, the memory-mapped reader over a file logrotate truncated): the file is now
    read with read(); truncated between two reads, the reader ends where the file now ends and names it. Run in
    a child so that a crash is the child's exit status, not the test run's."""
    path = tmp_path / "broker.log"
    path.write_bytes(b"".join(b"2026-11-20 10:00:%02d INFO main - line %06d\n" % (i % 60, i) for i in range(2000)))
    size = path.stat().st_size
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _TRUNCATE, str(path), "1" if native_cut else "0"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    first, reason = proc.stdout.splitlines()
    n = 4096 // 44  # the whole lines of the first read; the line it cut is part of the damage
    assert first == str(n) + " " + str([("truncated", 44 * n, size - 44 * n)])
    assert reason == (f"the file ended at byte 4,096 of the {size:,} it had when the read began (truncated while "
                      "read: logrotate's copytruncate?)")


def test_file_grown_while_read_is_read_up_to_its_size_at_start(tmp_path):
    """What the broker appends during the read is left for the next scan: the read ends at the size the file had
    when it began (bounded time on a file that grows forever)."""
    path = tmp_path / "broker.log"
    path.write_bytes(b"a\nb\n")
    r = bl.LineReader(str(path), chunk_bytes=2)
    out = []
    for arr in r:
        out += arr.to_pylist()
        with open(path, "ab") as f:
            f.write(b"more\n" * 10)
    assert out == [b"a\n", b"b\n"] and r.damage == []


# --- times outside the window ----------------------------------------------------------------------------------


def test_events_stamped_outside_the_window_are_damage_not_events(tmp_path):
    """An event stamped in 2106, 9999, 0000 or 1999 is counted as bad_timestamp and named, not an event (a year-0
    line made the zone conversion overflow; a 2106 one stretched every span)."""
    cci = ("ClientChannelInfo [channel=[id: 0x1, L:/10.0.0.1:10911 - R:/10.0.0.7:5555], clientId=10.0.0.7@c, "
           "language=JAVA, version=409, lastUpdateTimestamp=1795400000000]")
    lines = [f"{ts} INFO main - new producer connected, group: PG channel: {cci}"
             for ts in ("2026-11-20 10:00:00", "2106-02-07 06:28:16", "9999-12-31 23:59:59", "0000-01-01 00:00:00",
                        "1999-12-31 23:59:59", "2026-11-20 10:00:05")]
    d = tmp_path / "b"
    d.mkdir()
    (d / "broker.log").write_text("\n".join(lines) + "\n")
    for native_parse in CUTTERS:
        f = bl.scan_local([d], log_tz="UTC", native=native_parse)
        assert f["log"]["events"] == 2 and f["summary"]["first_ms"] == 1795168800000
        assert f["summary"]["last_ms"] == 1795168805000
        assert f["log"]["counts"]["bad_timestamp"] == 4 and f["log"]["counts"]["event_register"] == 2
        assert f["log"]["unparseable_by_kind"] == {"bad_timestamp": 4}
        (dmg,) = f["scan"]["corrupt"]
        assert dmg["kind"] == "bad_timestamp" and dmg["reason"] == (
            "4 event line(s) stamped before 2000-01-01 00:00:00 or more than 2 days after the scan's clock left "
            "out; the first: line 2 (2106-02-07 06:28:16)")
    # the window is the scan's: 2 days past its clock
    lo, hi = bl.ts_window(1_800_000_000_000)
    assert (lo, hi) == (946_684_800_000, 1_800_000_000_000 + 2 * 86_400_000)


# --- files that are not what they claim to be -------------------------------------------------------------------


def test_log_linked_to_a_passwd_file_is_not_echoed(tmp_path):
    """A broker.log symlinked to a passwd-like file: its lines are counted as unknown_format and named by count,
    never quoted into findings.json, the report or its CSVs."""
    passwd = tmp_path / "passwd"
    passwd.write_bytes(SECRET * 3)
    d = tmp_path / "broker-x"
    d.mkdir()
    (d / "broker.log").symlink_to(passwd)
    f = bl.scan_local([d], log_tz="UTC")
    assert f["log"]["counts"] == {"unknown_format": 6}
    assert f["log"]["examples"]["unknown_format"].startswith("(not quoted: no line of the file so far has a "
                                                             "broker-log header; 6 such lines)")
    from engine.bindings.report import write_report

    out = tmp_path / "report"
    write_report(f, out, plots=False)
    texts = [json.dumps(f)] + [p.read_text(errors="replace") for p in out.iterdir() if p.is_file()]
    for t in texts:
        assert "root:" not in t and "s3cr3t" not in t


def test_examples_of_recognised_logs_are_escaped(tmp_path):
    """A log that is one (lines with the log header) keeps its examples, with control characters visible."""
    d = tmp_path / "b"
    d.mkdir()
    (d / "broker.log").write_bytes(b"2026-11-20 10:00:00 INFO main - new producer connected, group: \x1b]0;x\x07\n"
                                   b"junk \x1b[31mred\n")
    f = bl.scan_local([d], log_tz="UTC")
    ex = f["log"]["examples"]
    assert ex["malformed_register"].endswith("group: \\x1b]0;x\\x07") and ex["unknown_format"] == "junk \\x1b[31mred"
    assert all("\x1b" not in v for v in ex.values())


def test_fifo_named_broker_log_is_damage_not_a_hang(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    os.mkfifo(d / "broker.log")
    table, info = bl.read_local([d / "broker.log"], log_tz="UTC")
    assert table.num_rows == 0
    assert [(x["kind"], x["reason"]) for x in info["damage"]] == [("unreadable", "not a regular file")]


# --- native and twin cutters -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.lists(st.sampled_from([b"\n", b"\r\n", b"x", b"xxxxxxxxxx", b"\x00" * 7, b"2026-11-20 10:00:00 I t - m",
                                      b"\n\n"]), max_size=40).map(b"".join),
       chunk=st.integers(1, 64), max_line=st.integers(1, 48), gz=st.booleans())
def test_reader_native_and_twin_cut_the_same_lines(data, chunk, max_line, gz):
    """Whatever the bytes, read size and line limit: both cutters give the same lines and damage, the lines kept
    are the file's lines of at most max_line bytes, in order, and the skipped bytes are counted exactly."""
    raw = gzip.compress(data) if gz else data
    out = []
    for native_cut in CUTTERS:
        r = bl.LineReader("x.log.gz" if gz else "x.log", batch_lines=3, chunk_bytes=chunk, native=native_cut,
                          max_line_bytes=max_line, fileobj=gzip.GzipFile(fileobj=io.BytesIO(raw)) if gz
                          else io.BytesIO(raw))
        out.append(([a.to_pylist() for a in r], r.damage, r.overlong))
    assert all(o == out[0] for o in out)
    want = [ln for ln in data.splitlines(keepends=True) if len(ln) <= max_line]
    assert [x for a in out[0][0] for x in a] == want
    assert all(0 < len(a) <= 3 for a in out[0][0])
    skipped = [ln for ln in data.splitlines(keepends=True) if len(ln) > max_line]
    assert out[0][2] == len(skipped) and sum(d["bytes"] for d in out[0][1]) == sum(map(len, skipped))


def test_fuzz_harness_seeds_pass():
    """The broker-log harness (fuzz/fuzz_brokerlog.py) on its seeds (the atheris run: tests/test_fuzz_short.py)."""
    sys.path.insert(0, str(ROOT / "fuzz"))
    import fuzz_brokerlog

    seeds = fuzz_brokerlog.seeds()
    assert len(seeds) >= 5
    for s in seeds:
        fuzz_brokerlog.test_one_input(s)


def test_segment_linked_to_a_passwd_file_is_not_echoed(tmp_path):
    """The recording side of the same attack (issue 26 section 4): a .seg linked to a passwd file is named as a
    corrupt range by its size and reason in the scan's plan (what findings.json and the report show), not by its
    first bytes."""
    from engine.bindings import segments as seg

    passwd = tmp_path / "passwd"
    passwd.write_bytes(SECRET)
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "hb-0000000000001-000001.seg").symlink_to(passwd)
    plan = seg.plan_splits(rec)
    assert plan.splits == [] and len(plan.damaged) == 1
    d = plan.damaged[0]
    assert (d["kind"], d["offset"], d["bytes"]) == ("corrupt", 0, len(SECRET))
    assert d["reason"] == f"not a version-1 segment (no segment file header; {len(SECRET):,} bytes not read)"
    text = json.dumps([plan.damaged, [(p, x.reason) for p, x in plan.corrupt]])
    assert "root:x" not in text and "s3cr3t" not in text

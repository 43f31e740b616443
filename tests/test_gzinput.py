"""bindings.gzinput.BoundedGzip: a gzip input read within its budget, and a cut one read up to its cut (issue 29 s3:
a cut .log.gz / .pcap.gz gave nothing at all, because GzipFile drops what the read reaching the cut decompressed)."""
import gzip
import os
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from engine.bindings.gzinput import BoundedGzip


def read_all(path, chunk, **kw):
    out, error = bytearray(), None
    with BoundedGzip(path, **kw) as f:
        buf = bytearray(chunk)
        while True:
            try:
                n = f.readinto(buf)
            except EOFError as e:
                error = e
                break
            if not n:
                break
            out += buf[:n]
        over = f.over
    return bytes(out), error, over


@settings(max_examples=60, deadline=None)
@given(members=st.lists(st.binary(max_size=3000), min_size=1, max_size=3), padding=st.integers(0, 8),
       chunk=st.sampled_from([1, 7, 4096, 1 << 20]))
def test_whole_files_read_as_gzip_reads_them(tmp_path_factory, members, padding, chunk):
    path = tmp_path_factory.mktemp("gz") / "x.gz"
    packed = b"".join(gzip.compress(m) for m in members)
    path.write_bytes(packed + b"\0" * padding)
    data, error, over = read_all(path, chunk)
    assert error is None and not over
    assert data == gzip.decompress(packed) == b"".join(members)


@settings(max_examples=60, deadline=None)
@given(text=st.binary(min_size=1, max_size=20000), cut=st.floats(0.0, 0.999), chunk=st.sampled_from([13, 1 << 23]))
def test_a_cut_file_gives_every_byte_before_its_cut_then_eof_error(tmp_path_factory, text, cut, chunk):
    whole = gzip.compress(text)
    cut_at = int(len(whole) * cut)
    path = tmp_path_factory.mktemp("gz") / "cut.gz"
    path.write_bytes(whole[:cut_at])
    data, error, _ = read_all(path, chunk)
    # what zlib itself can decompress from the cut bytes: all of it is given, whatever the read size
    z = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        expect = z.decompress(whole[:cut_at])
    except zlib.error:
        expect = b""
    assert data == expect and text.startswith(data)
    if cut_at:
        assert isinstance(error, EOFError)


def test_a_cut_log_of_a_real_size_keeps_its_lines_in_large_reads(tmp_path):
    lines = b"".join(b"2026-11-24 00:%02d:%02d INFO line %d\n" % (i // 60 % 60, i % 60, i) for i in range(20000))
    whole = gzip.compress(lines)
    path = tmp_path / "broker.log.gz"
    path.write_bytes(whole[: len(whole) // 2])
    data, error, _ = read_all(path, 8 << 20)  # one read of the whole file: GzipFile gave b"" here
    assert isinstance(error, EOFError)
    assert len(data) > len(lines) // 3 and lines.startswith(data)


def test_not_gzip_and_empty(tmp_path):
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"this is not gzip at all\n")
    with pytest.raises(gzip.BadGzipFile):
        read_all(bad, 4096)
    empty = tmp_path / "empty.gz"
    empty.write_bytes(b"")
    assert read_all(empty, 4096) == (b"", None, False)


def test_the_budget_cuts_and_says_so(tmp_path):
    path = tmp_path / "bomb.gz"
    path.write_bytes(gzip.compress(b"\0" * 500_000))
    data, error, over = read_all(path, 65536, max_ratio=10, min_bytes=1000)
    assert error is None and over and len(data) == max(1000, 10 * os.path.getsize(path))
    data, error, over = read_all(path, 65536, max_ratio=10, min_bytes=500_000)
    assert error is None and not over and len(data) == 500_000


def test_rmqhb_scan_of_a_cut_log_gz_reports_the_lines_before_the_cut(tmp_path):
    import json
    import subprocess
    import sys

    lines = []
    for i in range(40):  # a client registers, heartbeats, leaves
        lines.append(f"2026-11-24 00:{i // 60:02d}:{i % 60:02d} INFO NettyServerCodecThread_1 - new producer "
                     f"connected, group: PID_{i} channel: ClientChannelInfo [channel=[id: 0x1, L:/127.0.0.1:10911 - "
                     f"R:/127.0.0.1:{40000 + i}], clientId=127.0.0.1@{i}, language=JAVA, version=395, "
                     f"lastUpdateTimestamp=1779554400000]")
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    d = tmp_path / "logs"
    d.mkdir()
    (d / "broker.log.gz").write_bytes(whole[: len(whole) * 3 // 4])
    r = subprocess.run([sys.executable, "-m", "engine", "scan", str(d / "broker.log.gz"), "--engine", "local",
                        "--log-tz", "+08:00", "--out", str(tmp_path / "out"), "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr
    assert r.returncode == 3, r.stderr  # damaged input, findings of what was read
    assert "DAMAGED INPUT" in r.stderr
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    (damage,) = findings["scan"]["corrupt"]
    assert "gzip stream damaged" in damage["reason"]
    # the lines before the cut were read: GzipFile's read of the whole file gave none of them
    assert 0 < findings["log"]["lines"] < 40

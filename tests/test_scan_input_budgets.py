"""Issue 26 §2, the readers' remaining gaps, each attack scaled down: a gzip bomb costs at most a budget of
decompressed bytes per file (broker logs and captures), a capture packet stamped far from its file's time is damage,
not an event. What a budget leaves unread is named (scan.corrupt) and the other inputs are read on."""
import gzip
from pathlib import Path

import pytest

from conftest import require_native

from engine.bindings import brokerlog, pcap
from engine.recording import _pcap_py as twin

require_native("engine.recording._pcap")

from test_pcap_limits import SERVER, T0, Pcap, _clients_capture, client, heartbeat, tcp  # noqa: E402
from test_pcap_parity import both  # noqa: E402

YEAR_S = 365 * 86_400
MAX_FIELD = 512  # engine.registry.clientlog.MAX_FIELD: a plot's tooltip at most


# -- capture time jumps ------------------------------------------------------------------------------------------

def test_a_packet_stamped_three_years_after_the_others_is_damage(tmp_path):
    """One packet stamped 3 years after the others (inside the sane window [2000, now + 1 day]) was read as an
    event: the capture's span grew by 3 years and its clients looked expired. It is a time jump: counted, named,
    not read; the findings are the clean capture's."""
    data = _clients_capture(stray_sec=T0 + 3 * YEAR_S)
    out = both([data])
    assert out[3]["time_jump_packets"] == 1 and out[3]["bad_time_packets"] == 0
    assert out[4][1] < (T0 + 400) * 1000
    path, clean = tmp_path / "jump.pcap", tmp_path / "clean.pcap"
    path.write_bytes(data)
    clean.write_bytes(_clients_capture())
    f, ref = pcap.scan_local([path]), pcap.scan_local([clean])
    assert f["expired_clients"] == ref["expired_clients"] == []
    assert f["capture"]["captures"][0]["last_ms"] == ref["capture"]["captures"][0]["last_ms"]
    (lim,) = f["scan"]["corrupt"]
    assert lim["kind"] == "capture_limit" and "1 packets stamped more than a day" in lim["reason"]
    # and backwards: a packet stamped 3 years before the others
    out = both([_clients_capture(stray_sec=T0 - 3 * YEAR_S)])
    assert out[3]["time_jump_packets"] == 1 and out[4][0] >= T0 * 1000


def _resumed_capture(gap_s: int, n: int = 6):
    """One client's heartbeats: n at T0 (one a second), then n more ``gap_s`` later (a clock step, a silence)."""
    p = Pcap()
    c = client(1)
    hb = heartbeat("r@1")
    p.packet(tcp(*c, *SERVER, 100, 0x02), us=T0 * 1_000_000)
    seq = 101
    for k in range(2 * n):
        t = T0 + k + (gap_s if k >= n else 0)
        p.packet(tcp(*c, *SERVER, seq, 0x18, hb), us=t * 1_000_000)
        seq += len(hb)
    return p.bytes()


def test_a_stream_at_a_new_time_is_read_after_time_jump_agree_packets():
    """A capture that really goes on at a new time (a clock step, a broker port silent for more than a day) is read
    on: TIME_JUMP_AGREE consecutive packets agreeing on the new time make it the file's time; only the ones before
    the agreeing one are damage. A capture without a jump never trips the rule."""
    out = both([_resumed_capture(2 * 86_400)])
    assert out[3]["time_jump_packets"] == twin.TIME_JUMP_AGREE - 1
    assert out[3]["heartbeats"] == 12 - (twin.TIME_JUMP_AGREE - 1)
    assert out[4][1] >= (T0 + 2 * 86_400) * 1000
    assert both([_resumed_capture(3600)])[3]["time_jump_packets"] == 0
    # scaled option: a jump of 10 s with max_time_jump_ms 5 s
    assert both([_resumed_capture(10)], max_time_jump_ms=5000)[3]["time_jump_packets"] == twin.TIME_JUMP_AGREE - 1


def test_committed_captures_have_no_time_jump():
    data_dir = Path(__file__).parent / "data"
    files = sorted(p for p in data_dir.rglob("*") if p.is_file() and p.suffix in (".pcap", ".pcapng", ".gz")
                   and pcap.is_capture_file(p))
    assert files
    for path in files:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        out = both([raw])
        assert out[0] == "error" or out[3]["time_jump_packets"] == 0, path


# -- gzip bombs ---------------------------------------------------------------------------------------------------

def _bomb(path: Path, head: bytes, mib: int, tail: bytes = b"") -> int:
    """A .gz of ``head``, ``mib`` MiB of one repeated log-like line (deflate's best case: ~1,000:1), ``tail``."""
    line = b"2023-11-14 22:13:20 INFO x - " + b"a" * 34 + b"\n"  # 64 bytes
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head)
        block = line * (1 << 14)  # 1 MiB
        for _ in range(mib):
            f.write(block)
        f.write(tail)
    return path.stat().st_size


def test_gzip_bomb_log_is_cut_at_the_budget_and_named(tmp_path, monkeypatch):
    """A .log.gz decompressing ~1,000:1 cost time in proportion to its decompressed size (3.8 MB of gzip: > 4 GB).
    Scaled: 64 MiB behind ~200 KB of gzip (~340:1) with a budget of 50:1 past 1 MiB: the reader stops at 50:1 of
    the compressed size, names the rest as damage (gzip_budget, never the file's bytes), and a good broker's log beside it keeps
    the findings of a scan of it alone."""
    from engine.bindings import gzinput

    from test_brokerlog_limits import _findings_of, _good_logs

    bad = tmp_path / "broker-bad"
    bad.mkdir()
    size = _bomb(bad / "broker.log.gz", b"2023-11-14 22:13:19 INFO first - SECRET-HEAD\n", 64, b"LAST\n")
    for native_cut in (False, True):
        r = brokerlog.LineReader(bad / "broker.log.gz", native=native_cut, chunk_bytes=1 << 20,
                                 max_gzip_ratio=50, min_gzip_bytes=1 << 20)
        lines = sum(len(a) for a in r)
        budget = gzinput.gzip_budget(size, 50, 1 << 20)
        assert budget < 16 << 20 and lines <= budget // 64 + 1
        (d,) = r.damage
        assert d["kind"] == "gzip_budget" and d["offset"] <= budget and "gzip bomb" in d["reason"]
        assert f"{budget:,} bytes" in d["reason"]
    monkeypatch.setattr(gzinput, "GZIP_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(gzinput, "GZIP_MAX_RATIO", 50)
    _good_logs(tmp_path / "broker-good")
    f = brokerlog.scan_local([tmp_path / "broker-good", bad], log_tz="UTC")
    alone = brokerlog.scan_local([tmp_path / "broker-good"], log_tz="UTC")
    assert _findings_of(f, "broker-good") == _findings_of(alone, "broker-good")
    kinds = [(d["broker"], d["kind"]) for d in f["scan"]["corrupt"]]
    assert ("broker-bad", "gzip_budget") in kinds and "SECRET" not in str(f["scan"]["corrupt"])


def test_gzip_under_its_budget_is_read_whole(tmp_path):
    """A small .gz is never cut (GZIP_MIN_BYTES), nor one compressing at a real log's ratio."""
    path = tmp_path / "broker.log.gz"
    _bomb(path, b"", 4, b"LAST\n")
    r = brokerlog.LineReader(path, max_gzip_ratio=200, min_gzip_bytes=8 << 20)
    assert sum(len(a) for a in r) == 4 * (1 << 14) + 1 and r.damage == []


def test_gzip_bomb_capture_is_cut_at_the_budget_and_named(tmp_path, monkeypatch):
    """The issue's 3.8 MB .pcap.gz of > 4 GB, scaled: a capture whose heartbeat is padded with 48 MiB of spaces
    (~100 KB of gzip) with a budget of 50:1 past 1 MiB: read up to the budget, the rest named as damage (the file listed
    under capture.damaged_files, scan.corrupt), a good capture given with it read whole."""
    from engine.bindings import gzinput

    monkeypatch.setattr(gzinput, "GZIP_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(gzinput, "GZIP_MAX_RATIO", 50)
    p = Pcap()
    p.stream(client(1), heartbeat("first@1") + heartbeat("big@1", pad=48 << 20) + heartbeat("last@1"), mss=65000)
    bomb = tmp_path / "bomb.pcap.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(p.bytes())
    assert bomb.stat().st_size * 50 < 16 << 20
    good = tmp_path / "good.pcap"
    good.write_bytes(_clients_capture())
    (cap,) = pcap.plan_captures([bomb])
    items = list(pcap.iter_capture(cap))
    res = items[-1]
    assert len(res.damaged) == 1 and "gzip bomb" in res.damaged[0]["reason"]
    assert res.stats["heartbeats"] == 1  # the first; the rest was past the budget
    f = pcap.scan_local([bomb, good])
    ref = pcap.scan_local([good])
    assert f["summary"]["records"] == ref["summary"]["records"] + 1
    assert any("gzip bomb" in str(c.get("reason")) for c in f["scan"]["corrupt"])


# -- the report's plots ---------------------------------------------------------------------------------------------

def test_plot_labels_escape_control_characters_and_markup(tmp_path, monkeypatch):
    """The plots are SVG files with client data in their labels: a control character (a BEL, an ESC), markup
    (``</text><script>``), an ampersand or U+FFFF in a client id or a group must neither reach the
    file raw nor stop it being read (an XML parse error: the image would not load at all). Every plot parses, holds
    no element but the drawing's own, and shows each label escaped (engine.logutil.escape_text, then XML)."""
    from xml.etree import ElementTree

    from engine.bindings import report
    from engine.recording import scan_py
    from engine.recording.synth import FleetConfig, generate
    from test_scan_output_safety import _hostile

    generate(tmp_path / "rec", FleetConfig(clients=30, groups=6, days=0.15, seed=5))
    f = scan_py.scan(tmp_path / "rec")
    assert f["flapping_clients"] and f["group_sizes"] and f["heartbeat_gaps"]
    # (long: a label cut for its row must not cut an escaped '&' or '<' in two)
    monkeypatch.setattr("test_scan_output_safety.CALC", "&<" * 40 + "bell\x07</text><script>alert(1)</script>&amp;\uffff")
    monkeypatch.setattr("test_scan_output_safety.SUM", "G\x1b[31m<b>&")
    report.write_report(_hostile(f), tmp_path / "report", plots=True)
    texts = []
    for name in ("group_sizes.svg", "gap_histogram.svg", "flapping_timeline.svg"):
        raw = (tmp_path / "report" / name).read_text(encoding="utf-8")
        assert not any(ch in raw for ch in "\x07\x1b\uffff")
        root = ElementTree.fromstring(raw)
        tags = {el.tag.split("}")[1] for el in root.iter()}
        assert tags <= {"svg", "title", "style", "rect", "text", "line", "path", "g"}, tags  # no script, no link
        texts += ["".join(el.itertext()) for el in root.iter() if el.tag.endswith("}text") or el.tag.endswith("}title")]
    assert any("bell\\x07</text><script>alert(1)</script>&amp;\\uffff" in t for t in texts)  # a client's row
    assert any("G\\x1b[31m<b>&" in t for t in texts)  # a group's title


def test_a_plot_file_is_bounded_by_its_pixels_not_by_its_input(tmp_path):
    """A group whose size changed 200,000 times and a client with 100,000 connects and closes: the SVG plots draw at
    most 4 points per pixel column of a series and one mark per pixel of a row, so each file stays small (the CSVs
    and findings.json hold every point) and still shows the extremes of the series."""
    from xml.etree import ElementTree

    from engine.bindings import report
    from engine.recording import scan_py
    from engine.recording.synth import FleetConfig, generate

    generate(tmp_path / "rec", FleetConfig(clients=30, groups=6, days=0.15, seed=5))
    f = scan_py.scan(tmp_path / "rec")
    first, last = f["summary"]["first_ms"], f["summary"]["last_ms"]
    g = report.chart_groups(f)[0][0][0]
    step = (last - first) / 200_000
    g["series"] = [[int(first + i * step), 1 + (i % 7) * (i % 3)] for i in range(200_000)]
    r = f["flapping_clients"][0]
    r["connect_ms"] = [int(first + i * (last - first) / 100_000) for i in range(100_000)]
    r["closes"] = [[t + 1, "closed"] for t in r["connect_ms"]]
    r["reconnects"] = 10**6  # drawn first
    # 100 KB group names and client ids (of '&<' too: a cut must not leave half an entity): every label and its
    # tooltip clipped; 30 such flapping clients made a 3 MB flapping_timeline.svg
    for i, c in enumerate(f["flapping_clients"]):
        c["client_id"] = f"c{i}" + "&<" * 50_000
    assert len(f["flapping_clients"]) >= 3
    for i, (c, _, _) in enumerate(report.chart_groups(f)[0]):
        c["group"] = f"g{i}" + "x&" * 50_000
    files = report.ReportFiles(tmp_path / "report")  # the plots alone (the CSVs hold every id whole)
    report.write_plots(f, files)
    files.commit()
    files.close()
    for name in ("group_sizes.svg", "flapping_timeline.svg"):
        path = tmp_path / "report" / name
        assert path.stat().st_size < 250_000, (name, path.stat().st_size)
        root = ElementTree.parse(path).getroot()
        labels = [t for el in root.iter() for t in (el.text, el.tail) if t]  # each label and tooltip alone
        assert max(map(len, labels)) <= MAX_FIELD + 2
        assert any(t.startswith("c0&<&<") or t.startswith("g0x&x&") for t in labels)
    panel = report._step_path([(i / 500, float(v)) for i, v in enumerate([5] * 1000 + [0] + [5] * 1000 + [9])])
    assert "V0.0" in panel and "V9.0" in panel  # a dip or a peak inside one pixel column is still drawn


def test_gap_histogram_of_huge_and_infinite_gaps_returns(tmp_path):
    """Gaps of 1e13 s and 1e13 + 0.001 s: the tick step was below the float spacing at the ticks' value, and the
    tick loop (v += step) never ended; an inf gap raised ValueError (int of NaN). The histogram is drawn at once,
    its ticks counted by index, a gap that is not finite named in the title and not drawn."""
    import time
    from xml.etree import ElementTree

    from engine.bindings import report
    from engine.recording import scan_py
    from engine.recording.synth import FleetConfig, generate

    generate(tmp_path / "rec", FleetConfig(clients=6, groups=2, days=0.05, seed=5))
    f = scan_py.scan(tmp_path / "rec")
    gap = f["heartbeat_gaps"][0] if f["heartbeat_gaps"] else {"client_id": "c", "groups": ["G"], "start_ms": 0,
                                                                "end_ms": 1}
    for n, values in enumerate(([1e13, 1e13 + 0.001], [float("inf"), 5e3], [float("inf")], [1e17, 1e17])):
        f["heartbeat_gaps"] = [dict(gap, gap_s=v) for v in values]
        out, files = tmp_path / f"h{n}", report.ReportFiles(tmp_path / f"h{n}")
        t0 = time.monotonic()
        report._gap_histogram(f, files)
        files.commit()
        files.close()
        assert time.monotonic() - t0 < 5, values
        root = ElementTree.parse(out / "gap_histogram.svg").getroot()
        text = " ".join("".join(el.itertext()) for el in root.iter())
        assert ("1 not finite, not drawn" in text) == (float("inf") in values), text
        bars = [el for el in root.iter() if el.get("class") == "bar"]
        assert sum(int("".join(b.itertext()).split()[0]) for b in bars) == sum(v < float("inf") for v in values)


def test_a_record_stamped_after_the_year_9999_does_not_end_the_scan(tmp_path, capsys):
    """A crafted segment with a heartbeat stamped in the year 10000 ended the whole scan ("failed: ValueError:
    year 10000 is out of range", exit 1): the report formats such a time as its raw value ("<ms> ms") and is
    written, plots and CSVs too."""
    from engine.bindings import cli
    from engine.recording.recorder import HeartbeatRecorder, iter_records
    from engine.recording.synth import FleetConfig, generate

    rec = tmp_path / "rec"
    generate(rec, FleetConfig(clients=6, groups=2, days=0.05, seed=5))
    r = next(iter_records(rec))
    late = 253_402_300_800_000 + 5000  # 10000-01-01 00:00:05 UTC
    with HeartbeatRecorder(rec) as w:
        w.record(late, r.conn_id, r.remote_addr, r.language, r.version, r.body)
    rc = cli.scan_main([str(rec), "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"{late} ms" in out.out and "failed" not in out.err
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert f"{late} ms" in page
    assert all((tmp_path / "out" / n).stat().st_size for n in ("group_sizes.svg", "flapping_timeline.svg"))


# -- read_broker_logs names its damage ----------------------------------------------------------------------------

@pytest.mark.spark
def test_read_broker_logs_names_its_damage(spark, tmp_path):
    """read_broker_logs left damaged lines out of its frame without naming them: with damage=True it returns a
    damage frame too, the entries the scan puts in scan.corrupt (an overlong line, a .gz that is no gzip, an event
    stamped in 2106), and the events are the local reader's; a good log gives an empty damage frame."""
    from conftest import require_module

    require_module("pyspark")
    good, bad = tmp_path / "broker-good", tmp_path / "broker-bad"
    brokerlog.generate_broker_log(good / "broker.log", groups=2, members=3, seed=4, tz_offset_min=0)
    bad.mkdir()
    cci = ("ClientChannelInfo [channel=[id: 0x1, L:/10.0.0.1:10911 - R:/10.0.0.7:5555], clientId=10.0.0.7@c, "
           "language=JAVA, version=409, lastUpdateTimestamp=1795400000000]")
    (bad / "broker.log").write_text(f"2106-02-07 06:28:16 INFO t - new producer connected, group: PG channel: {cci}\n"
                                    f"2026-11-20 10:00:00 INFO t - new producer connected, group: PG channel: {cci}\n"
                                    + "x" * 70000 + "\n")
    (bad / "broker.1.log.gz").write_bytes(b"NOTGZIP root:x:0:0:root:/root:/bin/bash\n")
    events, damage = brokerlog.read_broker_logs(spark, [good, bad], log_tz="UTC", damage=True, max_line_bytes=65536)
    got = sorted(damage.toArrow().to_pylist(), key=lambda d: (d["file"], d["kind"]))
    ref = brokerlog.scan_local([good, bad], log_tz="UTC", max_line_bytes=65536)["scan"]["corrupt"]
    want = sorted(({"broker": d["broker"], "file": d["segment"], "kind": d["kind"], "offset": d["offset"],
                    "bytes": d["bytes"], "reason": d["reason"]} for d in ref), key=lambda d: (d["file"], d["kind"]))
    assert [(Path(d["file"]).name, d["kind"]) for d in got] == [
        ("broker.1.log.gz", "unreadable"), ("broker.log", "bad_timestamp"), ("broker.log", "overlong_line")]
    assert got == want and "root:x" not in str(got)
    table, _ = brokerlog.read_local([good, bad], log_tz="UTC", max_line_bytes=65536)
    assert events.count() == table.num_rows
    assert brokerlog.read_broker_logs(spark, [good], log_tz="UTC", damage=True)[1].count() == 0


# -- the Spark task's distinct-body store --------------------------------------------------------------------------

def test_task_body_store_is_bounded_and_runs_are_the_same(tmp_path):
    """A scan task kept every distinct body of its splits (each record is at most 4 MiB, the total was not
    bounded): a client whose heartbeat differs every time made it hold the whole recording. Scaled: 600
    heartbeats of ~8 KB, each distinct, beside a steady fleet, with a 64 KiB budget: the task holds at most the
    budget plus one block's bodies at once, and its runs are those of the unbounded task (merged as Spark merges
    tasks' runs)."""
    import json as _json

    import pyarrow as pa

    from engine.bindings import segments as seg
    from engine.recording.recorder import HeartbeatRecorder
    from engine.recording.synth import FleetConfig, generate

    manifest = generate(tmp_path, FleetConfig(clients=12, groups=3, days=0.05, seed=7), block_records=256)
    with HeartbeatRecorder(tmp_path, prefix="zz", block_records=64) as rec:
        for i in range(600):
            body = _json.dumps({"clientID": "10.9.9.9@churn", "producerDataSet": [{"groupName": "PG_CHURN"}],
                                "consumerDataSet": [], "pad": f"{i:06d}" + "x" * 8000}).encode()
            rec.record(manifest["start_ms"] + 1000 * i, 77, "10.9.9.9:1", "JAVA", 1, body)
    splits = seg.plan_splits(tmp_path, target_records=2000).splits
    budget = 64 << 10
    most = chunks = 0
    for scanner in seg.scan_block_chunks(splits, max_body_bytes=budget):
        most, chunks = max(most, sum(map(len, scanner.bodies))), chunks + 1
    assert chunks > 10 and 0 < most <= budget + 64 * 8200 + 256 * 2000  # the budget, plus the block that passed it

    def rows(batches):
        return sorted(map(str, pa.Table.from_batches(batches, schema=seg.RUN_SCHEMA).to_pylist()))

    whole = seg.task_runs(splits, max_body_bytes=-1)
    assert rows(seg.task_runs(splits, max_body_bytes=budget)) == rows(whole)
    assert any("PG_CHURN" in r for r in rows(whole))
    assert seg.MAX_TASK_BODY_BYTES == 256 << 20


def _churn_capture():
    """Five clients heartbeating every 10 s for 5 minutes, one of them unregistering at 150 s and coming back, and
    a sixth whose every heartbeat is distinct (~4 KB)."""
    import struct as _struct

    p = Pcap()
    seqs = {}
    unreg_head = b'{"code":35,"extFields":{"clientID":"c1@1","producerGroup":"P"},"flag":0,"opaque":2}'
    unreg = _struct.pack(">ii", 4 + len(unreg_head), len(unreg_head)) + unreg_head
    for t in range(0, 300, 10):
        for i in range(6):
            c = client(i)
            if c not in seqs:
                p.packet(tcp(*c, *SERVER, 100, 0x02), us=(T0 + t) * 1_000_000)
                seqs[c] = 101
            data = heartbeat(f"c{i}@1", pad=4000 + t) if i == 5 else heartbeat(f"c{i}@1")
            if i == 1 and t == 150:
                data = unreg
            p.packet(tcp(*c, *SERVER, seqs[c], 0x18, data), us=(T0 + t) * 1_000_000 + i)
            seqs[c] += len(data)
    return p.bytes()


def test_capture_body_store_is_bounded_and_runs_are_the_same(tmp_path, monkeypatch):
    """The capture task's distinct-body store had no byte budget either: past max_body_bytes the records held
    become runs and the store starts again; the task's runs (an unregister and a return included) are those of
    the unbounded task."""
    import pyarrow as pa

    from engine.bindings import segments as seg
    from engine.recording.scan_py import ScanParams

    path = tmp_path / "churn.pcap"
    path.write_bytes(_churn_capture())
    (cap,) = pcap.plan_captures([path])
    calls = []
    real = seg.runs_from_ids
    monkeypatch.setattr(seg, "runs_from_ids", lambda *a, **k: calls.append(1) or real(*a, **k))

    def rows(max_body_bytes):
        calls.clear()
        out = pcap.capture_runs(cap, ScanParams(), max_body_bytes=max_body_bytes, batch_records=8,
                                chunk_bytes=4096)
        return sorted(map(str, pa.Table.from_batches(out, schema=seg.RUN_SCHEMA).to_pylist())), len(calls)

    whole, n_whole = rows(-1)
    bounded, n_bounded = rows(16 << 10)
    assert n_whole == 1 and n_bounded > 5
    assert bounded == whole
    assert sum("'role': 'producer'" in r and "c1@1" in r for r in whole) == 2  # cut at the unregister

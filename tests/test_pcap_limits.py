"""The capture reader's budgets (issue 26 §2), each attack scaled down: a capture from elsewhere is untrusted, so
whatever it says the reader's memory is bounded and its work linear, and what a budget leaves unread is named as
damage (scan.corrupt, the report's DAMAGED INPUT line) instead of being absorbed or guessed. Native and twin give the
same output (tests/test_pcap_parity.py's ``both``)."""
import gzip
import json
import random
import struct
import time
from pathlib import Path

import pytest

from conftest import require_native

from engine.bindings import pcap
from engine.recording import _pcap_py as twin

require_native("engine.recording._pcap")

from engine.recording import _pcap as native  # noqa: E402
from test_pcap_parity import both, run  # noqa: E402

SERVER = (bytes([10, 0, 0, 2]), 10911)
T0 = 1_700_000_000  # seconds: 2023
HB_HEAD = b'{"code":34,"extFields":{},"flag":0,"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":479}'


def frame(header: bytes, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def heartbeat(client_id: str, pad: int = 0) -> bytes:
    body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": "P"}], "consumerDataSet": []},
                      separators=(",", ":")).encode()
    return frame(HB_HEAD, body + b" " * pad)


def tcp(src, sport, dst, dport, seq, flags, payload=b"", ack=0):
    t = struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0, src, dst)
    return b"\0" * 12 + b"\x08\x00" + ip + t + payload


class Pcap:
    """A little pcap writer (Ethernet): packets with their own time stamps (µs)."""

    def __init__(self):
        self.out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)]
        self.us = T0 * 1_000_000

    def packet(self, data, us=None, sec=None):
        self.us += 1000
        us = self.us if us is None else us
        s = us // 1_000_000 if sec is None else sec
        self.out.append(struct.pack("<IIII", s, us % 1_000_000, len(data), len(data)) + data)

    def stream(self, client, payload: bytes, isn=1000, mss=1400, syn=True, fin=True):
        """One client's connection sending ``payload`` in segments of ``mss`` bytes."""
        if syn:
            self.packet(tcp(*client, *SERVER, isn, 0x02))
        seq = isn + 1
        for i in range(0, len(payload), mss):
            self.packet(tcp(*client, *SERVER, seq + i, 0x18, payload[i:i + mss]))
        if fin:
            self.packet(tcp(*client, *SERVER, seq + len(payload), 0x11))
            self.packet(tcp(*SERVER, *client, 9000, 0x11))

    def bytes(self) -> bytes:
        return b"".join(self.out)


def client(i):
    return (bytes([10, 1, (i >> 8) & 0xFF, i & 0xFF]), 40000 + i % 20000)


def test_large_heartbeats_pass_unbuffered_and_are_named(tmp_path):
    """The issue's 150 heartbeats of 15 MiB (> 4 GB, then `records too large for 32-bit offsets`), scaled: 30
    heartbeats of 300 KB with max_record_bytes 256 KiB. None is buffered whole (the reader holds a header, not the
    frame), each is counted as too large and named as damage with its time range; the small ones are read."""
    p = Pcap()
    big = heartbeat("big@1", pad=300_000)
    payload = b"".join([heartbeat("small@1")] + [big] * 30 + [heartbeat("small@1")])
    p.stream(client(1), payload)
    data = p.bytes()
    out = both([data], chunk=65536, max_record_bytes=256 << 10)
    rec, _, _, stats, _, times, held, _ = out
    assert stats["records_too_large"] == 30 and stats["heartbeats"] == 2 and len(rec["recv_ms"]) == 2
    assert stats["frames_bad"] == stats["discarded_bytes"] == stats["bad_lengths"] == 0
    assert set(times) == {"records_too_large"} and times["records_too_large"][0] > T0 * 1000
    # fed 64 KiB at a time: the reader never held more than a packet's worth (no 300 KB frame buffered)
    for cls in (twin.CaptureDecoder, native.CaptureDecoder):
        d = cls(max_record_bytes=256 << 10)
        most = 0
        carry = b""
        for i in range(0, len(data), 65536):
            buf = carry + data[i:i + 65536]
            used = d.feed(buf)
            carry = buf[used:]
            most = max(most, d.buffered_bytes)
        assert most < 4096, cls
    # the scan names it; the bodies that were read give their findings
    path = tmp_path / "big.pcap.gz"
    path.write_bytes(gzip.compress(data))
    f = pcap.scan_local([path], max_record_bytes=256 << 10)
    lim = [c for c in f["scan"]["corrupt"] if c["kind"] == "capture_limit"]
    assert len(lim) == 1 and lim[0]["records_lost"] == 30 and "30 heartbeat" in lim[0]["reason"]
    assert f["capture"]["limits"][0]["kind"] == "records_too_large"
    assert f["summary"]["records"] == 2


def test_batches_are_bounded_in_bytes(tmp_path):
    """The reader flushed every 16,384 records whatever their size: batches are taken at batch_bytes too."""
    p = Pcap()
    p.stream(client(1), heartbeat("a@1", pad=100_000) * 40)
    path = tmp_path / "c.pcap"
    path.write_bytes(p.bytes())
    (cap,) = pcap.plan_captures([path])
    sizes = [len(b["body_data"]) for b in pcap.iter_capture(cap, batch_bytes=1 << 20, chunk_bytes=1 << 16)
             if not isinstance(b, pcap.CaptureResult)]
    assert sum(sizes) == 40 * len(heartbeat("a@1", pad=100_000)[8 + len(HB_HEAD):])
    assert len(sizes) > 3 and max(sizes) < (1 << 20) + (1 << 16) + 200_000


def test_syn_flood_keeps_at_most_max_connections(tmp_path):
    """10^6 SYN-only connections (1.4-1.8 GB, never freed), scaled: 3,000 with max_connections 100. The table
    never holds more; the least recently touched goes, so a client heartbeating through the flood keeps its
    connection (one id, no midstream restart); the evicted open connections are named as damage."""
    p = Pcap()
    good = client(60000)
    p.packet(tcp(*good, *SERVER, 5000, 0x02))
    seq = 5001
    for i in range(3000):
        p.packet(tcp(*client(i), *SERVER, 100 + i, 0x02))
        if i % 50 == 0:
            hb = heartbeat("good@1")
            p.packet(tcp(*good, *SERVER, seq, 0x18, hb))
            seq += len(hb)
    data = p.bytes()
    out = both([data], max_connections=100)
    rec, events, _, stats, _, times, _, kept = out
    assert kept <= 100
    assert stats["connections"] == 3001 and stats["connections_evicted"] == 3001 - 100
    assert stats["midstream_connections"] == 0 and len(set(rec["conn_id"])) == 1 and len(rec["recv_ms"]) == 60
    assert set(times) == {"connections_evicted"}
    path = tmp_path / "flood.pcap"
    path.write_bytes(data)
    f = pcap.scan_local([path], max_connections=100)
    (lim,) = [c for c in f["scan"]["corrupt"] if c["kind"] == "capture_limit"]
    assert "2,901 open connections closed out" in lim["reason"]


def test_a_four_tuple_back_after_eviction_gets_a_new_id():
    p = Pcap()
    a = client(1)
    p.stream(a, heartbeat("a@1"), isn=100)
    for i in range(2, 5):  # a is dropped (the generations of max_connections dropped ones are kept)
        p.packet(tcp(*client(i), *SERVER, 100 + i, 0x02))
    p.stream(a, heartbeat("a@1"), isn=7000)
    rec = both([p.bytes()], max_connections=3)[0]
    assert len(rec["conn_id"]) == 2 and rec["conn_id"][0] != rec["conn_id"][1]


def test_buffered_bytes_of_all_connections_are_bounded():
    """Many connections each promising a large frame and sending most of it: all they buffer together stays under
    max_buffered_bytes; the largest are shed and named."""
    p = Pcap()
    for i in range(40):
        f = heartbeat(f"c{i}@1", pad=200_000)
        p.stream(client(i), f[:150_000], fin=False)
    data = p.bytes()
    out = both([data], chunk=1 << 16, max_buffered_bytes=1 << 20)
    stats, times = out[3], out[5]
    assert stats["buffers_shed"] > 0 and stats["buffer_shed_bytes"] > 0 and "buffers_shed" in times
    for cls in (twin.CaptureDecoder, native.CaptureDecoder):
        d = cls(max_buffered_bytes=1 << 20)
        carry, most = b"", 0
        for i in range(0, len(data), 1 << 16):
            buf = carry + data[i:i + (1 << 16)]
            carry = buf[d.feed(buf):]
            most = max(most, d.buffered_bytes)
        assert most <= (1 << 20) + 1500


def _pcapng(packets, tsresol=6):
    """pcapng: SHB, IDB (Ethernet, if_tsresol), EPBs of (timestamp in units, data)."""
    def block(btype, body):
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    out = [block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))]
    opt = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HH", 0, 0)
    out.append(block(1, struct.pack("<HHI", 1, 0, 262144) + opt))
    for ts, data in packets:
        pad = b"\0" * (-len(data) % 4)
        out.append(block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data)) + data + pad))
    return b"".join(out)


def _clients_capture(stray_sec=None):
    """20 clients heartbeating every 10 s for 5 minutes; ``stray_sec``: one packet stamped then among them."""
    p = Pcap()
    seqs = {}
    for t in range(0, 300, 10):
        for i in range(20):
            c = client(i)
            if c not in seqs:
                p.packet(tcp(*c, *SERVER, 100, 0x02), us=(T0 + t) * 1_000_000)
                seqs[c] = 101
            hb = heartbeat(f"c{i}@1")
            p.packet(tcp(*c, *SERVER, seqs[c], 0x18, hb), us=(T0 + t) * 1_000_000 + i)
            seqs[c] += len(hb)
        if stray_sec is not None and t == 150:
            p.packet(tcp(*client(999), *SERVER, 1, 0x10), sec=stray_sec)
    return p.bytes()


def test_a_packet_stamped_in_2106_is_damage_not_an_event(tmp_path):
    """One packet stamped in 2106 among normal ones gave 120 false expired clients and a 63.8 MB report (720,888
    axis ticks): it is counted and named, the capture's span and the findings are the clean capture's."""
    from engine.bindings.report import write_report

    data = _clients_capture(stray_sec=0xFFFFFF00)
    out = both([data])
    assert out[3]["bad_time_packets"] == 1 and out[4][1] < (T0 + 400) * 1000
    path = tmp_path / "stray.pcap"
    path.write_bytes(data)
    clean = tmp_path / "clean.pcap"
    clean.write_bytes(_clients_capture())
    f, ref = pcap.scan_local([path]), pcap.scan_local([clean])
    assert f["expired_clients"] == ref["expired_clients"] == []
    assert f["capture"]["captures"][0]["last_ms"] == ref["capture"]["captures"][0]["last_ms"]
    (lim,) = f["scan"]["corrupt"]
    assert lim["kind"] == "capture_limit" and "1 packets stamped outside" in lim["reason"]
    index = write_report(f, tmp_path / "report", plots=False)
    assert Path(index).stat().st_size < 2_000_000 and "DAMAGED INPUT" in Path(index).read_text()


def test_a_pcapng_packet_stamped_in_year_33658_is_damage(tmp_path):
    """The scan completed, then the report crashed (exit 1): the packet is not read, the report is written."""
    from engine.bindings.report import write_report

    hb = heartbeat("n@1")
    good = [((T0 + k) * 1_000_000, tcp(*client(1), *SERVER, 101 + k * len(hb), 0x18, hb)) for k in range(5)]
    stray = (1_000_000_000_000 * 1_000_000, tcp(*client(2), *SERVER, 1, 0x10))  # ~ year 33658
    huge = ((1 << 64) - 1, tcp(*client(3), *SERVER, 1, 0x10))  # past 2^62 ms: out of range
    data = _pcapng(good[:2] + [stray, huge] + good[2:])
    out = both([data])
    assert out[3]["bad_time_packets"] == 2 and out[3]["heartbeats"] == 5
    path = tmp_path / "far.pcapng"
    path.write_bytes(data)
    f = pcap.scan_local([path])
    assert f["summary"]["records"] == 5 and any("2 packets stamped" in c["reason"] for c in f["scan"]["corrupt"])
    write_report(f, tmp_path / "r", plots=False)


def test_time_window_options():
    data = _clients_capture()
    assert both([data], min_time_ms=(T0 + 100) * 1000)[3]["bad_time_packets"] > 0
    assert both([data], max_time_ms=(T0 + 100) * 1000)[3]["bad_time_packets"] > 0


@pytest.mark.parametrize("cls", [native.CaptureDecoder, twin.CaptureDecoder], ids=["native", "twin"])
def test_resync_over_oversized_header_candidates_is_linear(cls):
    """A bad frame length followed by repeated 16 MiB-looking headers cost a 16 MiB copy per candidate (180 KB of
    candidates: 133 s), scaled: 20,000 candidates (180 KB) claiming a 1 MiB header, with the 1 MiB after them. A
    candidate's header is read only up to SEARCH_HEADER_BYTES: no candidate is decoded, the search is linear."""
    hl = (1 << 20) - 64
    cand = struct.pack(">iB", hl + 40, 0) + hl.to_bytes(3, "big") + b"{"
    payload = heartbeat("a@1") + struct.pack(">i", 0x7FFFFFF0) + cand * 20_000 + b"\x7f" * (1 << 20) + heartbeat("a@1")
    p = Pcap()
    p.stream(client(1), payload)
    d = cls(max_frame_size=2 << 20)
    calls = []
    if cls is twin.CaptureDecoder:
        real = d._decode_frame
        d._decode_frame = lambda b, limit: calls.append(len(b)) or real(b, limit)
    t = time.perf_counter()
    d.feed(p.bytes())
    d.finish()
    took = time.perf_counter() - t
    assert d.stats["bad_lengths"] == 1 and d.stats["heartbeats"] == 2 and d.stats["resyncs"] == 1
    assert all(n <= twin.SEARCH_HEADER_BYTES + 8 for n in calls)
    assert took < (5 if cls is native.CaptureDecoder else 15)  # before: a 1 MiB copy and decode per candidate


def test_resync_parity_over_candidates():
    hl = 5000
    cand = struct.pack(">iB", hl + 40, 0) + hl.to_bytes(3, "big") + b"{"
    small = struct.pack(">iB", 60, 0) + (30).to_bytes(3, "big") + b'{"code":34' + b"x" * 20
    p = Pcap()
    p.stream(client(1), heartbeat("a@1") + b"\xff\xff\xff\xff" + (cand + small) * 300 + heartbeat("a@1"))
    out = both([p.bytes()])
    assert out[3]["bad_lengths"] >= 1 and out[3]["heartbeats"] >= 1


@pytest.mark.parametrize("cls", [native.CaptureDecoder, twin.CaptureDecoder], ids=["native", "twin"])
def test_one_byte_holes_out_of_order_are_linear(cls):
    """40k out-of-order one-byte holes in a 2.8 MB file took 55 s (a sort of every waiting segment per delivered
    one), scaled: 20,000 one-byte segments at every other byte, then the holes filled in order. Heaps: linear."""
    payload = heartbeat("h@1", pad=40_000)
    p = Pcap()
    c = client(1)
    p.packet(tcp(*c, *SERVER, 1000, 0x02))
    odd = list(range(1, len(payload), 2))
    random.Random(1).shuffle(odd)  # in any order (a sort of sorted keys was cheap: the were not)
    for i in odd:
        p.packet(tcp(*c, *SERVER, 1001 + i, 0x18, payload[i:i + 1]))
    for i in range(0, len(payload), 2):
        p.packet(tcp(*c, *SERVER, 1001 + i, 0x18, payload[i:i + 1]))
    data = p.bytes()
    t = time.perf_counter()
    d = cls(max_pending_segments=1 << 20, max_pending_bytes=1 << 20, reorder_window_ms=10 ** 9)
    d.feed(data)
    d.finish()
    took = time.perf_counter() - t
    assert d.stats["heartbeats"] == 1 and d.stats["holes"] == 0
    assert d.stats["segments_out_of_order"] == len(payload) // 2
    assert took < (5 if cls is native.CaptureDecoder else 15)  # before: ~30 s


def test_waiting_segments_are_bounded_in_number():
    payload = heartbeat("h@1", pad=4000)
    p = Pcap()
    c = client(1)
    p.packet(tcp(*c, *SERVER, 1000, 0x02))
    for i in range(1, len(payload), 2):
        p.packet(tcp(*c, *SERVER, 1001 + i, 0x18, payload[i:i + 1]))
    out = both([p.bytes()], max_pending_segments=100)
    assert out[3]["holes"] > 10 and len(out[2]) == out[3]["holes"]


def test_one_bad_input_never_costs_the_others_their_findings(tmp_path):
    """A gzip whose deflate data is broken (zlib.error, not an OSError) is named; the other capture is read."""
    good = tmp_path / "good.pcap"
    good.write_bytes(_clients_capture())
    raw = bytearray(gzip.compress(_clients_capture()))
    raw[len(raw) // 2: len(raw) // 2 + 64] = b"\xff" * 64
    bad = tmp_path / "bad.pcap.gz"
    bad.write_bytes(bytes(raw))
    f = pcap.scan_local([good, bad])
    ref = pcap.scan_local([good])
    assert f["summary"]["records"] >= ref["summary"]["records"]
    assert any(c["kind"] == "capture_file" and c["segment"] == "bad.pcap.gz" for c in f["scan"]["corrupt"])


def test_events_kept_are_bounded(tmp_path):
    p = Pcap()
    for i in range(500):
        p.packet(tcp(*client(i), *SERVER, 100, 0x02))
    path = tmp_path / "syn.pcap"
    path.write_bytes(p.bytes())
    (cap,) = pcap.plan_captures([path])
    *_, res = pcap.iter_capture(cap, max_events=100)
    assert len(res.events) == 100 and res.stats["events_dropped"] == 400 and "events_dropped" in res.damage_times
    f = pcap.scan_local([path], max_events=100)
    assert any("400 connection events" in c["reason"] for c in f["scan"]["corrupt"])


def test_scan_options_are_checked():
    with pytest.raises(ValueError):
        twin.CaptureDecoder(max_connections=0)
    with pytest.raises(ValueError):
        native.CaptureDecoder(max_record_bytes=5)
    assert run(twin.CaptureDecoder, [b""])[0] != "error"


@pytest.mark.slow
def test_a_syn_flood_at_the_default_budget_is_linear():
    """10^6 SYN-only connections: the evictions at the default max_connections (100,000) each take the first of
    the kept connections; in a plain dict that first live entry is found past every entry deleted before it
    (10^6 SYNs: 215 s), in an ordered dict at once. Scaled: 300,000 SYNs, native."""
    p = Pcap()
    for i in range(300_000):
        p.packet(tcp(bytes([10, (i >> 16) & 255, (i >> 8) & 255, i & 255]), 40000 + i % 20000, *SERVER, i, 0x02))
    data = p.bytes()
    d = native.CaptureDecoder()
    t = time.perf_counter()
    carry = b""
    for i in range(0, len(data), 8 << 20):
        buf = carry + data[i:i + (8 << 20)]
        carry = buf[d.feed(buf):]
        d.take()
    took = time.perf_counter() - t
    assert d.connections_kept == twin.DEFAULT_MAX_CONNECTIONS and d.stats["connections_evicted"] == 200_000
    assert took < 20  # ~3 s; before: minutes


def test_rotated_files_are_ordered_by_their_first_sane_packet(tmp_path):
    """A rotated file whose first packet is stamped in 2106 is ordered by its first packet inside the window."""
    d = tmp_path / "rotated"
    d.mkdir()
    early, late = Pcap(), Pcap()
    early.packet(tcp(*client(1), *SERVER, 1, 0x10), sec=0xFFFFFF00)
    early.packet(tcp(*client(1), *SERVER, 1, 0x10), us=T0 * 1_000_000)
    late.packet(tcp(*client(1), *SERVER, 1, 0x10), us=(T0 + 100) * 1_000_000)
    (d / "b.pcap").write_bytes(early.bytes())
    (d / "a.pcap").write_bytes(late.bytes())
    (cap,) = pcap.plan_captures([d])
    assert [Path(f).name for f in cap.files] == ["b.pcap", "a.pcap"]


def test_pcapng_interfaces_are_bounded():
    """Every pcapng interface block is kept (its link type and time resolution): a file of them grew the list
    without end. Past MAX_INTERFACES per section the file is damaged (CaptureError naming the byte)."""
    idb = struct.pack("<IIHHII", 1, 20, 1, 0, 262144, 20)
    shb = struct.pack("<IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28)
    out = both([shb + idb * (twin.MAX_INTERFACES + 1)])
    assert out[:2] == ("error", "CaptureError") and "more than 4096 pcapng interfaces" in out[2]
    assert both([shb + idb * twin.MAX_INTERFACES + shb + idb * 3])[0] != "error"  # a new section starts anew

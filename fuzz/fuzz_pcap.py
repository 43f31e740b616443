#!/usr/bin/env python3
"""Coverage-guided differential fuzzer for the capture reader (``rmqhb scan`` of pcap / pcapng files).

Every input is a capture file's bytes. It goes through both implementations (engine.recording._pcap,
engine.recording._pcap_py) with small budgets taken from the input's CRC (connections kept, segments and bytes
waiting behind a hole, buffered bytes of all connections, the largest record, the reorder window, a shard), fed in
chunks chosen from the input's CRC as a scan feeds a file (what ``feed`` leaves is given again with the next
chunk), then ``end_file`` and ``finish``:

* both give the same records, events, losses, statistics, packet span and damage times, or the same typed error
  (CaptureError: RemotingError and ValueError);
* after every feed each budget holds: buffered bytes at most max_buffered_bytes, connections kept at most
  max_connections; after ``finish`` nothing is buffered; every record's body is at most max_record_bytes;
  no packet outside the time window counts in the span.

Anything else escaping (IndexError, SystemError, MemoryError, ...) or a difference raises, and libFuzzer records
the input. Run (see FUZZING.md): ``python fuzz/fuzz_pcap.py -atheris_runs=1000000 CORPUS SEEDS``; seeds (the
beginnings of the committed captures, and small made-up ones: reordering, holes, oversized resync candidates, a
packet stamped in 2106, pcapng) from ``python fuzz/fuzz_pcap.py --seeds SEEDS``.
"""
import gzip
import os
import struct
import sys
import zlib
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzzlib  # noqa: E402

NATIVE, TWIN = fuzzlib.load("pcap", __name__ == "__main__", "engine.recording")

IMPLS = [m for m in (NATIVE, TWIN) if m is not None]
T0 = 1_700_000_000  # the seeds' time (s); the window's end is fixed so that every finding replays
MAX_TIME_MS = 1_800_000_000_000


def options_for(data):
    x = zlib.crc32(data, 11)
    return {"max_connections": 1 + x % 8, "max_pending_segments": 1 + (x >> 3) % 64,
            "max_pending_bytes": (x >> 9) % 4096, "max_buffered_bytes": (x >> 13) % 8192,
            "max_record_bytes": 12 + (x >> 18) % 2048, "reorder_window_ms": (x >> 20) % 3000,
            "shard": (1, 0) if (x >> 29) % 4 else (2, (x >> 28) & 1), "max_time_ms": MAX_TIME_MS,
            "max_time_jump_ms": 1 + zlib.crc32(data, 13) % 3000}


def verdict(mod, data, cuts, options):
    d = mod.CaptureDecoder(**options)
    carry = b""
    try:
        for chunk in fuzzlib.chunks(data, cuts):
            buf = carry + chunk
            carry = buf[d.feed(buf):]
            if d.buffered_bytes > options["max_buffered_bytes"] or d.connections_kept > options["max_connections"]:
                raise fuzzlib.Divergence(f"{mod.__name__}: budget passed: {d.buffered_bytes} buffered bytes, "
                                         f"{d.connections_kept} connections ({options})")
        d.end_file(len(carry))
        d.finish()
    except Exception as exc:  # noqa: BLE001 - check_error re-raises anything that is not a typed error
        return fuzzlib.check_error(exc), dict(d.stats)
    if d.buffered_bytes:
        raise fuzzlib.Divergence(f"{mod.__name__}: {d.buffered_bytes} bytes buffered after finish")
    rec, events, losses = d.take()
    body = rec["body_offsets"]
    if len(body) > 1 and max(b - a for a, b in zip(body[:-1], body[1:])) > options["max_record_bytes"]:
        raise fuzzlib.Divergence(f"{mod.__name__}: a record over max_record_bytes")
    span = (d.first_packet_ms, d.last_packet_ms)
    if span[0] >= 0 and not (TWIN.MIN_TIME_MS <= min(span) and max(span) <= MAX_TIME_MS):
        raise fuzzlib.Divergence(f"{mod.__name__}: span {span} outside the time window")
    return ("ok", {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in rec.items()}, events, losses,
            dict(d.stats), span, d.damage_times)


def same(kind, verdicts, data):
    if any(v != verdicts[0] for v in verdicts[1:]):
        raise fuzzlib.Divergence(f"{kind}: native {verdicts[0]!r} != twin {verdicts[-1]!r} for {data[:80]!r}")


def test_one_input(data):
    options = options_for(data)
    cuts = fuzzlib.cuts_for(data)
    same("CaptureDecoder", [verdict(mod, data, cuts, options) for mod in IMPLS], data)
    # and with the default budgets, whole
    defaults = {"max_time_ms": MAX_TIME_MS, "max_buffered_bytes": TWIN.DEFAULT_MAX_BUFFERED_BYTES,
                "max_connections": TWIN.DEFAULT_MAX_CONNECTIONS, "max_record_bytes": TWIN.DEFAULT_MAX_RECORD_BYTES}
    same("CaptureDecoder defaults", [verdict(mod, data, [len(data)], defaults) for mod in IMPLS], data)


# ---------------------------------------------------------------------------------------------------------------
# seeds

SERVER = (bytes([10, 0, 0, 2]), 10911)
HEAD = b'{"code":34,"extFields":{},"flag":0,"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":479}'


def _frame(header, body):
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def _tcp(src, sport, dst, dport, seq, flags, payload=b""):
    t = struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0, src, dst)
    return b"\0" * 12 + b"\x08\x00" + ip + t + payload


def _pcap(packets):
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)]
    for k, (sec, data) in enumerate(packets):
        out.append(struct.pack("<IIII", sec, k * 1000 % 1_000_000, len(data), len(data)) + data)
    return b"".join(out)


def _made_up():
    c = (bytes([10, 0, 0, 1]), 40001)
    hb = _frame(HEAD, b'{"clientID":"f@1","producerDataSet":[{"groupName":"P"}]}')
    unreg = _frame(b'{"code":35,"extFields":{"clientID":"f@1","producerGroup":"P"},"flag":0}', b"")
    stream = hb + unreg + hb
    seg = [(i, stream[i:i + 40]) for i in range(0, len(stream), 40)]
    plain = [(T0, _tcp(*c, *SERVER, 100, 0x02))] + [(T0, _tcp(*c, *SERVER, 101 + i, 0x18, p)) for i, p in seg]
    fins = [(T0 + 1, _tcp(*c, *SERVER, 101 + len(stream), 0x11)), (T0 + 1, _tcp(*SERVER, *c, 900, 0x11))]
    out = [_pcap(plain + fins),
           _pcap(plain[:1] + plain[1:][::-1] + fins),  # reordered
           _pcap(plain[:2] + plain[3:] + fins),  # a hole
           _pcap(plain[:3] + [(0xFFFFFF00, _tcp(*c, *SERVER, 1, 0x10))] + plain[3:]),  # a packet in 2106
           _pcap(plain[:3] + [(T0 + 3 * 365 * 86_400, plain[3][1])] + plain[3:]),  # a time jump of 3 years
           _pcap([(T0, _tcp(bytes([10, 0, 1, i]), 40000 + i, *SERVER, i, 0x02)) for i in range(12)])]  # SYNs
    hl = 3000
    cand = struct.pack(">iB", hl + 40, 0) + hl.to_bytes(3, "big") + b"{"
    junk = hb + b"\x7f\xff\xff\xff" + cand * 8 + hb
    out.append(_pcap(plain[:1] + [(T0, _tcp(*c, *SERVER, 101 + i, 0x18, junk[i:i + 200]))
                                  for i in range(0, len(junk), 200)]))
    big = _frame(HEAD, b'{"clientID":"b@1"}' + b" " * 3000)
    out.append(_pcap(plain[:1] + [(T0, _tcp(*c, *SERVER, 101 + i, 0x18, big[i:i + 500]))
                                  for i in range(0, len(big), 500)]))
    return out


def seeds():
    """The first 3 KB of each committed capture (tests/data/pcap, ungzipped), and the made-up ones."""
    data = fuzzlib.ROOT / "tests" / "data" / "pcap"
    out = []
    for p in sorted(Path(data).iterdir()) if Path(data).is_dir() else []:
        if p.suffix in (".pcap", ".pcapng", ".gz") and p.is_file():
            raw = p.read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            out.append(raw[:3072])
    return out + _made_up()


if __name__ == "__main__":
    print(f"fuzz_pcap: {fuzzlib.describe(NATIVE, TWIN)}", file=sys.stderr)
    fuzzlib.main("fuzz_pcap", test_one_input, seeds)

#!/usr/bin/env python3
"""Coverage-guided differential fuzzer for the broker-log reader: the line cutter and the line parser.

Every input is a piece of a log file. It goes through both implementations (engine.recording._brokerlog,
engine.recording._brokerlog_py):

* ``LineReader`` (engine.bindings.brokerlog) over the bytes, plain and gzipped, with the read size, batch size and
  max line size taken from the input's CRC, cutting lines with each build's ``line_ends``: the same arrays and the
  same damage, the lines kept are exactly the input's lines of at most max line size (in order), the bytes
  skipped are counted exactly, and no array is empty or larger than the batch;
* ``parse_lines`` over those lines, as a pyarrow binary array (with a base line number from the input) and as a
  list of bytes: the same events and stats, or the same typed error (BrokerLogError), in both builds;
* the same lines as a pyarrow string array when they are UTF-8.

Anything else escaping (IndexError, SystemError, MemoryError, ...) or a difference raises, and libFuzzer records
the input. Run (see FUZZING.md): ``python fuzz/fuzz_brokerlog.py -atheris_runs=1000000 CORPUS SEEDS``; seeds
(pieces of the 4.9.8 sample log and of a generated log, and damaged lines) from ``python fuzz/fuzz_brokerlog.py
--seeds SEEDS``.
"""
import gzip
import io
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzzlib  # noqa: E402

NATIVE, TWIN = fuzzlib.load("brokerlog", __name__ == "__main__", "engine.recording",
                             also=("engine.bindings.brokerlog",))

from engine.bindings import brokerlog as BL  # noqa: E402  (imported instrumented by load)
import pyarrow as pa  # noqa: E402

IMPLS = [m for m in (NATIVE, TWIN) if m is not None]


def same(kind, verdicts, data):
    if any(v != verdicts[0] for v in verdicts[1:]):
        raise fuzzlib.Divergence(f"{kind}: native {verdicts[0]!r} != twin {verdicts[-1]!r} for {data[:80]!r}")


def cut(data, native, chunk, batch, max_line, gz):
    """(arrays as lists, damage, lines skipped) of one LineReader over ``data``."""
    f = gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(data, 1))) if gz else io.BytesIO(data)
    r = BL.LineReader("fuzz.log.gz" if gz else "fuzz.log", batch_lines=batch, chunk_bytes=chunk, native=native,
                      max_line_bytes=max_line, fileobj=f)
    return [a.to_pylist() for a in r], r.damage, r.overlong


def check_cut(data, result, batch, max_line):
    arrays, damage, skipped = result
    lines = _nl_lines(data)
    want = [ln for ln in lines if len(ln) <= max_line]
    got = [x for a in arrays for x in a]
    if got != want:
        raise fuzzlib.Divergence(f"lines cut {got[:5]!r} != the input's {want[:5]!r}")
    if any(not a or len(a) > batch for a in arrays):
        raise fuzzlib.Divergence(f"an array of {[len(a) for a in arrays]} lines (batch {batch})")
    over = [ln for ln in lines if len(ln) > max_line]
    if skipped != len(over) or sum(d["bytes"] for d in damage) != sum(map(len, over)):
        raise fuzzlib.Divergence(f"skipped {skipped} lines / {damage} for {len(over)} overlong lines")


def _nl_lines(data):
    """Lines cut at b"\\n" only (splitlines also cuts at b"\\r"), line ends kept."""
    out, p = [], 0
    while p < len(data):
        q = data.find(b"\n", p)
        q = len(data) if q < 0 else q + 1
        out.append(data[p:q])
        p = q
    return out


def parse_verdict(mod, lines, base):
    try:
        batch, stats = mod.parse_lines(lines, base)
    except Exception as exc:  # noqa: BLE001 - check_error re-raises anything that is not a typed error
        return fuzzlib.check_error(exc)
    return "ok", batch.to_pylist(), stats


def test_one_input(data):
    seed = zlib.crc32(data)
    chunk = 1 + seed % 97
    batch = 1 + (seed >> 8) % 9
    max_line = 1 + (seed >> 12) % 300
    gz = (seed >> 20) % 4 == 0
    cuts = [cut(data, native, chunk, batch, max_line, gz) for native in ([True] if NATIVE else []) + [False]]
    same("LineReader", cuts, data)
    check_cut(data, cuts[0], batch, max_line)
    lines = [x for a in cuts[0][0] for x in a] if (seed >> 24) % 2 else _nl_lines(data)
    base = (seed >> 3) % 1000
    same("parse_lines(binary)", [parse_verdict(m, pa.array(lines, pa.binary()), base) for m in IMPLS], data)
    same("parse_lines(list)", [parse_verdict(m, lines, base) for m in IMPLS], data)
    try:
        text = [ln.decode("utf-8") for ln in lines]
    except UnicodeDecodeError:
        return
    same("parse_lines(string)", [parse_verdict(m, pa.array(text, pa.string()), base) for m in IMPLS], data)


def seeds():
    """Pieces of the real 4.9.8 log and of a generated one (every event kind, damaged lines), and a few lines of
    each kind the reader must survive (no line end, CR only, NUL bytes, impossible dates)."""
    import tempfile
    from pathlib import Path

    out = []
    sample = fuzzlib.shared_dir() / "samples" / "rocketmq-4.9.8-broker.log"
    if sample.exists():
        text = sample.read_bytes()
        out += [text[i:i + 3000] for i in range(0, min(len(text), 60000), 3000)]
    with tempfile.TemporaryDirectory() as d:
        BL.generate_broker_log(Path(d) / "broker.log", groups=2, members=2, duration_s=600, seed=5)
        gen = (Path(d) / "broker.log").read_bytes()
    out += [gen[i:i + 3000] for i in range(0, min(len(gen), 30000), 3000)]
    out += [b"x" * 400, b"a\rb\r\nc\n", b"\x00" * 64 + b"\n", b"9999-12-31 23:59:59 INFO t - m\n",
            b"0000-00-00 00:00:00 INFO t - new producer connected, group: \n"]
    return out


if __name__ == "__main__":
    print(f"fuzz_brokerlog: {fuzzlib.describe(NATIVE, TWIN)}", file=sys.stderr)
    fuzzlib.main("fuzz_brokerlog", test_one_input, seeds)

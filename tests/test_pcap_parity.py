"""engine._pcap (Cython) and engine._pcap_py (twin) give the same records, events, losses and statistics on every
capture, and on damaged captures the same output or the same error (class and message)."""
import gzip
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_native

require_native("engine._pcap")

from engine import _pcap as native  # noqa: E402
from engine import _pcap_py as twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pcap"
_spec = importlib.util.spec_from_file_location("pcap_tool", ROOT / "scripts" / "pcap_tool.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def _raw(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def run(cls, files, chunk=None, **kw):
    """Everything a decoder gives for files fed in chunks: (records as lists, events, losses, stats) or the error."""
    d = cls(**kw)
    try:
        for data in files:
            carry = b""
            pos = 0
            step = chunk or len(data) or 1
            while True:
                piece = data[pos:pos + step]
                pos += step
                buf = carry + piece
                if not piece:
                    d.end_file(len(buf))
                    break
                used = d.feed(buf)
                carry = buf[used:]
        d.finish()
    except ValueError as e:
        return ("error", type(e).__name__, str(e), d.stats)
    rec, events, losses = d.take()
    return ({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in rec.items()}, events, losses, d.stats)


def both(files, **kw):
    a, b = run(twin.CaptureDecoder, files, **kw), run(native.CaptureDecoder, files, **kw)
    assert a == b
    return a


CAPTURE_FILES = sorted(p for p in DATA.iterdir() if p.is_file() and p.suffix in (".pcap", ".pcapng", ".gz"))


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [None, 1000, 7])
def test_committed_captures(path, chunk):
    out = both([_raw(path)], chunk=chunk)
    assert out[0] != "error" and len(out[0]["recv_ms"]) > 0


def test_rotated_files_and_options():
    files = [_raw(p) for p in sorted((DATA / "rotated-ipv6").iterdir())]
    both(files)
    both(files, ports=[1])
    both([_raw(DATA / "lo-eth-ipv4.pcap")], reorder_window_ms=0, max_pending_bytes=300)
    both([_raw(DATA / "lo-eth-ipv4.pcap")], max_frame_size=300)  # heartbeats over the limit: searched past


def _mutations(tmp_path):
    src = DATA / "lo-eth-ipv4.pcap"
    _, _, _, link, packets = tool.read_pcap(src)
    ports = sorted({tool.tcp_parts(link, p[3])[5] for p in packets if tool.tcp_parts(link, p[3])[8]})
    outs = []
    for k, ops in enumerate([["--drop", "3"], ["--swap", "5", "--dup", "9"], ["--overlap", "2", "--late", "12:5"],
                             ["--drop", "0", "--drop", "1", "--drop", "20"], ["--size", "7", "--drop", "50"],
                             ["--size", "3", "--swap", "100", "--drop", "205", "--late", "300:40"]]):
        for port in ports[:3]:
            out = tmp_path / f"m{k}-{port}.pcap"
            args = ["mutate", str(src), str(out), "--port", str(port)]
            if "--size" not in ops:
                args += ["--size", "100"]
            tool.main(args + ops)
            outs.append(out)
    return outs


def test_mutated_captures(tmp_path):
    for path in _mutations(tmp_path):
        out = both([path.read_bytes()])
        assert out[0] != "error"
        both([path.read_bytes()], chunk=333, reorder_window_ms=0)


BASE = _raw(DATA / "lo-eth-ipv4.pcap")
BASE_NG = _raw(DATA / "lo-eth-ipv4.pcapng")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([BASE, BASE_NG]),
       st.lists(st.tuples(st.integers(0, len(BASE) - 1), st.integers(0, 255)), min_size=1, max_size=12),
       st.integers(0, len(BASE)), st.sampled_from([None, 4096]))
def test_damaged_bytes_same_output_or_same_error(data, flips, cut, chunk):
    buf = bytearray(data[:max(cut, 24)])
    for pos, val in flips:
        if pos < len(buf):
            buf[pos] = val
    both([bytes(buf)], chunk=chunk)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 200), st.sampled_from(["drop", "swap", "dup"])), max_size=6),
       st.integers(1, 300))
def test_random_segmentations(tmp_path_factory, ops, size):
    src = DATA / "lo-eth-ipv4.pcap"
    _, _, _, link, packets = tool.read_pcap(src)
    port = tool.tcp_parts(link, packets[3][3])[5]
    out = tmp_path_factory.mktemp("seg") / "m.pcap"
    args = ["mutate", str(src), str(out), "--port", str(port), "--size", str(size)]
    for i, op in ops:
        args += [f"--{op}", str(i)]
    tool.main(args)
    both([out.read_bytes()])

"""engine.recording._pcap (Cython) and engine.recording._pcap_py (twin) give the same records, events, losses and statistics on every
capture, and on damaged captures the same output or the same error (class and message)."""
import gzip
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_native

require_native("engine.recording._pcap")

from engine.recording import _pcap as native  # noqa: E402
from engine.recording import _pcap_py as twin  # noqa: E402

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
        return ("error", type(e).__name__, str(e), d.stats, (d.first_packet_ms, d.last_packet_ms), d.damage_times)
    rec, events, losses = d.take()
    return ({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in rec.items()}, events, losses, d.stats,
            (d.first_packet_ms, d.last_packet_ms), d.damage_times, d.buffered_bytes, d.connections_kept)


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


def _capture_of(frames, client=(bytes([10, 0, 0, 1]), 40001), server=(bytes([10, 0, 0, 2]), 10911), isn=1000,
                t0=0, header=True, syn_twice=False):
    """A pcap (Ethernet, IPv4) of one connection: SYN handshake, then each frame from the client in its own
    packet, answered by an ACK, then FIN from both sides."""
    import struct

    def pkt(src, sport, dst, dport, seq, ack, flags, payload=b""):
        tcp = struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0, src, dst)
        return b"\0" * 12 + b"\x08\x00" + ip + tcp + payload

    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)] if header else []
    t = [t0]

    def emit(data):
        t[0] += 1000
        out.append(struct.pack("<IIII", 1_700_000_000 + t[0] // 1_000_000, t[0] % 1_000_000, len(data), len(data)))
        out.append(data)

    cseq, sseq = isn, 9000
    emit(pkt(*client, *server, cseq, 0, 0x02))
    if syn_twice:
        emit(pkt(*client, *server, cseq, 0, 0x02))
    emit(pkt(*server, *client, sseq, cseq + 1, 0x12))
    cseq, sseq = cseq + 1, sseq + 1
    for f in frames:
        emit(pkt(*client, *server, cseq, sseq, 0x18, f))
        cseq += len(f)
        emit(pkt(*server, *client, sseq, cseq, 0x10))
    emit(pkt(*client, *server, cseq, sseq, 0x11))
    emit(pkt(*server, *client, sseq, cseq + 1, 0x11))
    return b"".join(out)


def _json_frame(header: bytes, body: bytes = b'{"clientID":"x@1"}') -> bytes:
    import struct

    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


HEADERS = [
    b'{"code":34,"extFields":{},"flag":0,"language":"JAVA","opaque":2147483647,"serializeTypeCurrentRPC":"JSON","version":479}',
    b'{"code":34,"flag":0,"language":"GO","opaque":-2147483648,"version":317}',
    b'{"code":34,"flag":0,"language":"NODE_JS","opaque":2147483648,"version":1}',  # opaque out of int32: bad
    b'{"code":34,"language":"KLINGON","version":-5}',  # unknown language: None
    b'{"code":34,"language":13,"version":1}',
    b'{"code":34,"language":99,"version":1}',
    b'{"code":34,"language":null,"version":null,"remark":null,"extFields":null}',
    b'{ "code" : 34 , "language" : "CPP" }',  # whitespace: decode_frame's path
    b'{"code":34,"remark":"caf\\u00e9","language":"PHP"}',  # an escape: decode_frame's path
    b'{"code":"34","language":"RUST"}',  # a numeric string
    b'{"code":34,"code":35,"extFields":{"clientID":"c1","consumerGroup":"g"}}',  # duplicate key: the last wins
    b'{"code":34,"flag":1}',  # a response: not a heartbeat
    b'{"code":34,"extFields":{"a":1}}',
    b'{"code":34,"version":1.5}',  # not an int32: bad
    b'{"code":34}trailing',
    b'{"code":34,}',
    b'{"code":35,"extFields":{"clientID":"c2","producerGroup":"p"}}',
    b'{"code":40,"flag":2,"extFields":{"consumerGroup":"g2"}}',
    b'{}',
    b'{"code":34,"language":"JAVA","extFields":{"k":"v","n":null}}',
    b'{"code":34,"opaque":00}',
]


@pytest.mark.parametrize("header", HEADERS, ids=range(len(HEADERS)))
def test_header_shapes(header):
    out = both([_capture_of([_json_frame(header)])])
    assert out[0] != "error"


def test_rocketmq_headers():
    import engine

    frames = [engine.RemotingCommand(34, language=lang, version=v, opaque=o, remark=r, ext_fields=e,
                                     body=b'{"clientID":"r"}', serialize_type="ROCKETMQ").encode()
              for lang, v, o, r, e in [(engine.LanguageCode.JAVA, 479, 1, None, None),
                                       (engine.LanguageCode.CPP, -3, 2, "remark", None),
                                       (engine.LanguageCode.GO, 32767, 3, None, {"a": "b"})]]
    bad = bytearray(frames[0])
    bad[10] = 200  # an unknown language byte: None
    frames.append(bytes(bad))
    out = both([_capture_of(frames)])
    assert out[0]["language"] == [0, 1, 9, 255] and out[0]["version"] == [479, -3, 32767, 479]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(HEADERS), min_size=1, max_size=6), st.lists(st.binary(max_size=40), max_size=3))
def test_header_mixtures(headers, junk):
    frames = [_json_frame(h) for h in headers] + list(junk)
    both([_capture_of(frames)])


def test_sequence_wrap_port_reuse_and_syn_retransmission():
    hb = _json_frame(HEADERS[0], b'{"clientID":"w@1"}' + b" " * 300)
    plain = both([_capture_of([hb] * 5)])
    wrapped = both([_capture_of([hb] * 5, isn=0xFFFFFE00)])  # sequence numbers wrap inside the connection
    assert wrapped[0] == plain[0] and wrapped[3]["holes"] == 0 and len(plain[0]["recv_ms"]) == 5
    # the same 4-tuple twice (the second connection after the first closed), the second SYN sent twice
    two = both([_capture_of([hb] * 2) + _capture_of([hb] * 3, header=False, t0=10_000_000, isn=777,
                                                      syn_twice=True)])
    rec, events, _, stats, (first, last) = two[:5]
    assert 0 <= first < last
    assert len(rec["recv_ms"]) == 5 and len(set(rec["conn_id"])) == 2
    assert [e[2] for e in events] == ["open", "fin", "open", "fin"]
    assert stats["connections"] == 2 and stats["holes"] == 0


@pytest.mark.parametrize("shard", [(2, 0), (2, 1), (5, 3)])
def test_shards(shard):
    both([_raw(DATA / "lo-eth-ipv4.pcap")], shard=shard)
    for bad in ((0, 0), (2, 2), (2, -1)):
        with pytest.raises(ValueError):
            twin.CaptureDecoder(shard=bad)
        with pytest.raises(ValueError):
            native.CaptureDecoder(shard=bad)

"""Packet captures -> the recorder's records (tests/data/pcap: tcpdump on loopback while scripts/pcap_drive.py ran
against `rmqhb serve --record`; README there). What the capture reader finds must be what the broker saw: the same
heartbeat records its own recorder wrote, the UNREGISTER_CLIENT requests, FIN/RST ends and NOTIFY pushes the driver
saw; and what damage does (a segment the capture missed, reordering, retransmissions) is counted exactly."""
import gzip
import importlib.util
import json
import os
import struct
import sys
from collections import Counter
from pathlib import Path

import pytest

import engine
from engine.recording._pcap_py import CaptureError
from engine.bindings import pcap
from engine.recording.recorder import iter_records

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pcap"
CAPTURES = {"lo-eth-ipv4": DATA / "lo-eth-ipv4.pcap", "any-sll-ipv4": DATA / "any-sll-ipv4.pcap.gz",
            "any-sll2-ipv6": DATA / "any-sll2-ipv6.pcap"}
DRIVEN = sorted(CAPTURES)  # made with scripts/pcap_drive.py (a manifest per client)
CAPTURES["ons-lo-ipv4"] = DATA / "ons-lo-ipv4.pcap"  # the real ali-ons client
CAPTURES["cpp-lo-ipv4"] = DATA / "cpp-lo-ipv4.pcap"  # the real C++ client (rocketmq-client-cpp), two processes

_spec = importlib.util.spec_from_file_location("pcap_tool", ROOT / "scripts" / "pcap_tool.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def manifest(name):
    return json.loads((DATA / f"{name}.json").read_text())


def records_of(paths, **kw):
    rec, results = pcap.read_local(paths, **kw)
    return list(pcap.records_iter([rec])), results


def run_tool(*argv):
    tool.main([str(a) for a in argv])


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_records_are_what_the_broker_recorded(name):
    """Every heartbeat the broker served, as its recorder wrote it: sender address, language, version, body;
    the receive time is the packet's (the recorder's clock read a moment later)."""
    got, results = records_of([CAPTURES[name]])
    want = list(iter_records(DATA / f"{name}.rec"))
    assert len(got) == len(want) > 0
    key = lambda r: (r[2], r[3], r[4], r[5])  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, want))
    by_addr = lambda rs: sorted(rs, key=lambda r: (r[2], r[0]))  # noqa: E731
    for c, b in zip(by_addr(got), by_addr(want)):
        assert 0 <= b[0] - c[0] <= 50
    # one connection id per client connection, stable over its heartbeats
    assert len({(r[1], r[2]) for r in got}) == len({r[2] for r in got}) == len({r[1] for r in got})
    st = results[0].stats
    assert st["frames_bad"] == st["bad_lengths"] == 0
    if name != "ons-lo-ipv4":
        assert st["holes"] == st["discarded_bytes"] == 0


def test_real_client_capture_with_packets_tcpdump_missed():
    """ali-ons against rmqhb serve; tcpdump missed two runs of the broker's answers: both holes are reported,
    the reader resynchronises after each, and every heartbeat and unregister of the client is found."""
    m = manifest("ons-lo-ipv4")
    got, (res,) = records_of([CAPTURES["ons-lo-ipv4"]])
    st = res.stats
    assert (st["holes"], st["hole_bytes"], st["resyncs"]) == (2, 595, 2)
    assert [(lo[2], lo[5]) for lo in res.losses] == [("s2c", 238), ("s2c", 357)]
    assert st["heartbeats"] == 3 and st["frames"] > 200
    unreg = [e for e in res.events if e[2] == "unregister"]
    assert {(e[5], e[6], e[7]) for e in unreg} == {(m["client_id"], "PID_ons_cap", None),
                                                 (m["client_id"], None, "CID_ons_cap")}
    assert [(e[2], e[4]) for e in res.events if e[2] in ("fin", "rst")] == [("fin", "client")]
    notes = [e for e in res.events if e[2] == "notify"]
    assert [e[7] for e in notes] == ["CID_ons_cap"]
    import engine as eng

    for r in got:
        hb = eng.decode_heartbeat(r[5])
        assert hb.client_id == m["client_id"]
        assert [c.group for c in hb.consumers] == ["CID_ons_cap"]


def test_real_cpp_client_capture():
    """rocketmq-client-cpp (PyPI rocketmq 0.4.4) against rmqhb serve: client A (producer + consumer) and client B
    (a second consumer of the group, joining 5 s later), each shut down after 35 s. Every heartbeat of both
    (language CPP, version 63, client id <pid>-<ip>@DEFAULT), the NOTIFY pushes of both joins and of B's leave, the
    three UNREGISTER_CLIENT requests (the C++ client sends one per group, the other group as an empty string) and
    both FINs; nothing missed."""
    m = manifest("cpp-lo-ipv4")
    a, b = m["clients"]
    got, (res,) = records_of([CAPTURES["cpp-lo-ipv4"]])
    st = res.stats
    assert (st["holes"], st["resyncs"], st["frames_bad"], st["midstream_connections"]) == (0, 0, 0, 0)
    assert (st["connections"], st["heartbeats"], st["unregisters"], st["notifies"]) == (2, 6, 3, 4)
    addr_of = {}
    for r in got:
        hb = engine.decode_heartbeat(r[5])
        who = a if hb.client_id.startswith(a["client_id_prefix"]) else b
        assert hb.client_id.startswith(who["client_id_prefix"]) and hb.client_id.endswith("@DEFAULT")
        assert addr_of.setdefault(who["name"], r[2]) == r[2]  # one connection per client process
        assert (r[3].name, r[4]) == ("CPP", 63)
        assert [(c.group, sorted((s.topic, s.sub_string) for s in c.subscriptions)) for c in hb.consumers] == [
            ("CID_cpp_cap", [("%RETRY%CID_cpp_cap", "*"), ("TopicCppCap", "TagA || TagB")])]
        assert [p.group for p in hb.producers] == (["PID_cpp_cap"] if who is a else [])
    assert Counter(r[2] for r in got) == {addr_of["A"]: 3, addr_of["B"]: 3}
    ev = [(e[2], e[3], e[4], e[6], e[7]) for e in res.events]
    A, B = addr_of["A"], addr_of["B"]
    assert ev == [("open", A, "client", None, None), ("notify", A, "server", None, "CID_cpp_cap"),
                  ("open", B, "client", None, None), ("notify", B, "server", None, "CID_cpp_cap"),
                  ("notify", A, "server", None, "CID_cpp_cap"),  # B joined
                  ("unregister", B, "client", "", "CID_cpp_cap"),
                  ("notify", A, "server", None, "CID_cpp_cap"),  # B left
                  ("fin", B, "client", None, None),
                  ("unregister", A, "client", "", "CID_cpp_cap"), ("unregister", A, "client", "PID_cpp_cap", ""),
                  ("fin", A, "client", None, None)]
    f = pcap.scan_local([CAPTURES["cpp-lo-ipv4"]])
    sizes = {g["group"]: g for g in f["group_sizes"]}
    assert sizes["CID_cpp_cap"]["max_members"] == 2 and sizes["PID_cpp_cap"]["max_members"] == 1
    assert f["inconsistent_subscriptions"] == [] and f["flapping_clients"] == [] and f["expired_clients"] == []
    assert f["capture"]["connection_ends"] == {"fin_by_client": 2}


@pytest.mark.parametrize("name", DRIVEN)
def test_what_the_clients_sent(name):
    m = manifest(name)
    got, (res,) = records_of([CAPTURES[name]])
    per_addr = Counter(r[2] for r in got)
    events = res.events
    for c in m["clients"]:
        assert per_addr[c["addr"]] == c["heartbeats"], c
        mine = [r for r in got if r[2] == c["addr"]]
        assert {(r[3].name, r[4]) for r in mine} == {(c["language"], c["version"])}
        unreg = [e for e in events if e[2] == "unregister" and e[3] == c["addr"]]
        assert len(unreg) == c["unregisters"]
        assert all(e[5] == c["client_id"] for e in unreg)
        assert sorted(g for e in unreg for g in (e[6], e[7]) if g) == (sorted(c["groups"]) if c["unregisters"] else [])
        ends = [(e[2], e[4]) for e in events if e[2] in ("fin", "rst") and e[3] == c["addr"]]
        assert ends == [("rst" if c["close"] == "rst" else "fin", "client")], c
        notified = [e for e in events if e[2] == "notify" and e[3] == c["addr"]]
        assert len(notified) == c["notifications_received"], c
        assert {e[7] for e in notified} <= set(c["groups"])
        opens = [e for e in events if e[2] == "open" and e[3] == c["addr"]]
        assert len(opens) == 1
    assert res.stats["heartbeats"] == sum(c["heartbeats"] for c in m["clients"])
    assert res.stats["unregisters"] == sum(c["unregisters"] for c in m["clients"])


def test_serializations_and_languages_present():
    m = manifest("lo-eth-ipv4")
    assert {c["serialize"] for c in m["clients"]} == {"JSON", "ROCKETMQ"}
    got, _ = records_of([CAPTURES["lo-eth-ipv4"]])
    rocketmq = [c["addr"] for c in m["clients"] if c["serialize"] == "ROCKETMQ"]
    assert sum(1 for r in got if r[2] in rocketmq) == sum(c["heartbeats"] for c in m["clients"] if c["addr"] in rocketmq)


def test_pcapng_gzip_and_rotated_files_give_the_same_records(tmp_path):
    base, _ = records_of([CAPTURES["lo-eth-ipv4"]])
    for opts in ([], ["--big-endian"], ["--nanos"]):
        out = tmp_path / f"x{len(opts)}{''.join(opts)}.pcapng"
        run_tool("pcapng", CAPTURES["lo-eth-ipv4"], out, *opts)
        assert records_of([out])[0] == base
        gz = tmp_path / (out.name + ".gz")
        gz.write_bytes(gzip.compress(out.read_bytes()))
        assert records_of([gz])[0] == base
    rot = tmp_path / "rotated"
    run_tool("split", CAPTURES["lo-eth-ipv4"], rot, "--packets", "37")
    files = sorted(rot.iterdir())
    assert len(files) == 6
    got, (res,) = records_of([rot])
    assert got == base and len(res.files) == 6
    assert res.stats["midstream_connections"] == 0  # connections carry over from file to file
    # files are read in the order of their first packet, whatever their names say
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    for k, f in enumerate(files):
        (shuffled / f"part-{(7 * k) % 6}.pcap").write_bytes(f.read_bytes())
    got, (res,) = records_of([shuffled])
    assert got == base and res.stats["midstream_connections"] == 0


def test_committed_derived_captures():
    base, _ = records_of([CAPTURES["lo-eth-ipv4"]])
    assert records_of([DATA / "lo-eth-ipv4.pcapng"])[0] == base
    rot, (res,) = records_of([DATA / "rotated-ipv6"])
    assert rot == records_of([CAPTURES["any-sll2-ipv6"]])[0] and len(res.files) > 1


# ---------------------------------------------------------------------------------------------------------------
# damage: a clean capture with one connection's client bytes cut into 100-byte segments, then changed


def _stream(path, port, size=100):
    """(frames [(start, end, code)], segments [(start, end)]) of the client->server bytes of one connection."""
    _, _, _, link, packets = tool.read_pcap(path)
    data, segs = b"", []
    for *_, raw in packets:
        parts = tool.tcp_parts(link, raw)
        if parts and parts[5] == port and parts[8]:
            for k in range(0, len(parts[8]), size):
                segs.append((len(data) + k, len(data) + min(len(parts[8]), k + size)))
            data += parts[8]
    frames, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big") + 4
        frames.append((pos, pos + n, engine.decode_frame(data[pos:pos + n]).code))
        pos += n
    assert pos == len(data)
    return frames, segs


@pytest.fixture(scope="module")
def clean():
    src = CAPTURES["lo-eth-ipv4"]
    client = manifest("lo-eth-ipv4")["clients"][0]
    port = int(client["addr"].rsplit(":", 1)[1])
    frames, segs = _stream(src, port)
    got, (res,) = records_of([src])
    return src, client, port, frames, segs, got, res


def _mutated(tmp_path, clean, *ops):
    src, _, port, *_ = clean
    out = tmp_path / "m.pcap"
    run_tool("mutate", src, out, "--port", port, "--size", 100, *ops)
    return records_of([out])


@pytest.mark.parametrize("which", ["first_of_frame", "middle_of_frame", "last_of_frame", "in_unregister"])
def test_missed_segment_resynchronizes_exactly(tmp_path, clean, which):
    src, client, port, frames, segs, base, _ = clean
    starts = {f[0] for f in frames}
    if which == "in_unregister":
        f = next(f for f in frames if f[2] == 35)
        i = next(k for k, s in enumerate(segs) if s[0] >= f[0])
    else:
        f = frames[2]
        first = next(k for k, s in enumerate(segs) if s[0] == f[0])
        last = next(k for k, s in enumerate(segs) if s[1] == f[1])
        i = {"first_of_frame": first, "middle_of_frame": first + 2, "last_of_frame": last}[which]
    a, b = segs[i]
    lost = [fr for fr in frames if fr[0] < b and fr[1] > a]
    got, (res,) = _mutated(tmp_path, clean, "--drop", i)
    st = res.stats
    assert st["holes"] == 1 and st["hole_bytes"] == b - a
    assert st["frames_cut"] == (0 if a in starts else 1)
    assert st["discarded_bytes"] == sum(e - s for s, e, _ in lost) - (b - a)
    # a frame boundary is found again when something follows the lost frames on the connection
    assert st["resyncs"] == (1 if lost[-1] != frames[-1] else 0) and st["frames_bad"] == 0
    lost_heartbeats = sum(1 for fr in lost if fr[2] == 34)
    assert len(got) == len(base) - lost_heartbeats
    # every other heartbeat of the connection is read, in order, unchanged
    mine = [r for r in base if r[2] == client["addr"]]
    kept = [r for r in got if r[2] == client["addr"]]
    hb_frames = [fr for fr in frames if fr[2] == 34]
    want = [r for r, fr in zip(mine, hb_frames) if fr not in lost]
    assert [r[5] for r in kept] == [r[5] for r in want]
    assert [r for r in got if r[2] != client["addr"]] == [r for r in base if r[2] != client["addr"]]
    unreg = [e for e in res.events if e[2] == "unregister" and e[3] == client["addr"]]
    assert len(unreg) == client["unregisters"] - sum(1 for fr in lost if fr[2] == 35)
    loss = res.losses
    assert len(loss) == 1 and loss[0][1] == client["addr"] and loss[0][2] == "c2s" and loss[0][5] == b - a


def test_two_misses_in_one_frame_and_one_across_frames(tmp_path, clean):
    src, client, port, frames, segs, base, _ = clean
    f = frames[1]
    first = next(k for k, s in enumerate(segs) if s[0] == f[0])
    nxt = next(k for k, s in enumerate(segs) if s[0] == frames[3][0])
    got, (res,) = _mutated(tmp_path, clean, "--drop", first + 1, "--drop", first + 3, "--drop", nxt - 1,
                           "--drop", nxt)
    st = res.stats
    dropped = [segs[k] for k in (first + 1, first + 3, nxt - 1, nxt)]
    assert st["holes"] == 3  # nxt - 1 and nxt are adjacent: one hole
    assert st["hole_bytes"] == sum(b - a for a, b in dropped)
    assert len(got) == len(base) - 3  # frames 1, 2 and 3
    assert st["frames_cut"] == 2  # frame 1 (both its misses: one skip to its end), frame 2
    assert st["resyncs"] == 2  # at the end of frame 1, and after the hole across frames 2 and 3


@pytest.mark.parametrize("op", ["--swap", "--dup", "--overlap", "--late"])
def test_reordering_and_retransmissions_lose_nothing(tmp_path, clean, op):
    src, client, port, frames, segs, base, _ = clean
    i = next(k for k, s in enumerate(segs) if s[0] == frames[2][0]) + 1
    arg = f"{i}:4" if op == "--late" else i
    got, (res,) = _mutated(tmp_path, clean, op, arg)
    st = res.stats
    assert got == base
    assert st["holes"] == st["discarded_bytes"] == st["frames_cut"] == 0
    if op == "--swap":
        assert st["segments_out_of_order"] == 1 and st["segments_retransmitted"] == 0
    elif op == "--dup":
        assert st["segments_retransmitted"] == 1 and st["bytes_retransmitted"] == segs[i][1] - segs[i][0]
    elif op == "--overlap":
        assert st["segments_retransmitted"] == 1
        assert st["bytes_retransmitted"] == segs[i + 1][1] - segs[i][0]
    else:
        assert st["segments_out_of_order"] >= 1


def test_reorder_window_declares_a_hole_before_the_connection_ends(tmp_path, clean):
    src, client, port, frames, segs, base, _ = clean
    i = next(k for k, s in enumerate(segs) if s[0] == frames[1][0]) + 1
    out = tmp_path / "m.pcap"
    run_tool("mutate", src, out, "--port", port, "--size", 100, "--drop", i)
    got, (res,) = records_of([out], reorder_window_ms=0)
    got2, (res2,) = records_of([out])
    assert sorted(got) == sorted(got2)  # the same loss, declared at the next packet instead of at the end
    for k in ("holes", "hole_bytes", "frames_cut", "discarded_bytes", "resyncs"):
        assert res.stats[k] == res2.stats[k] == {"holes": 1, "resyncs": 1, "frames_cut": 1}.get(k, res2.stats[k])
    # the bytes after the hole waited for the rest of the connection with the default window, not with 0
    assert 0 < res.stats["segments_out_of_order"] < res2.stats["segments_out_of_order"]
    assert len(got) == len(base) - 1


def test_capture_started_mid_connection(tmp_path, clean):
    """A capture that starts inside a connection's byte stream finds the first frame boundary."""
    src, client, port, frames, segs, base, _ = clean
    header, e, nano, link, packets = tool.read_pcap(src)
    out = tmp_path / "cut.pcap"
    mid = tmp_path / "mid.pcap"
    run_tool("mutate", src, mid, "--port", port, "--size", 100)
    _, _, _, _, pk = tool.read_pcap(mid)
    # drop everything before the second segment of the connection's third frame
    target = next(k for k, s in enumerate(segs) if s[0] == frames[2][0]) + 1
    seen, keep_from = 0, None
    for idx, (*_, raw) in enumerate(pk):
        parts = tool.tcp_parts(link, raw)
        if parts and parts[5] == port and parts[8]:
            if seen == target:
                keep_from = idx
                break
            seen += 1
    tool.write_pcap(out, header, e, pk[keep_from:])
    got, (res,) = records_of([out])
    st = res.stats
    assert st["midstream_connections"] >= 1
    mine = [r for r in got if r[2] == client["addr"]]
    assert len(mine) == client["heartbeats"] - 3
    assert st["resyncs"] == 0 and st["holes"] == 0


# ---------------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("data,where", [(b"hello world, not a capture", "not a pcap"),
                                        (b"\xd4\xc3\xb2\xa1" + b"\0" * 20 + b"\xff" * 16, "bad pcap record header"),
                                        (b"\x0a\x0d\x0d\x0a\x1c\0\0\0\x01\x02\x03\x04", "byte-order magic")])
def test_bad_files_are_typed_errors(tmp_path, data, where):
    dec = pcap.decoder_class()()
    with pytest.raises(CaptureError, match=where) as e:
        dec.feed(data)
    assert isinstance(e.value, engine.RemotingError) and isinstance(e.value, ValueError)
    p = tmp_path / "x.pcap"
    p.write_bytes(b"\xd4\xc3\xb2\xa1" + b"\0" * 20 + b"\xff" * 16)
    _, (res,) = pcap.read_local([p])
    assert res.damaged and "bad pcap record header at byte 24" in res.damaged[0]["reason"]
    t = tmp_path / "notes.txt"
    t.write_text("not a capture")
    with pytest.raises(CaptureError):
        pcap.plan_captures([t])
    with pytest.raises(FileNotFoundError):
        pcap.plan_captures([tmp_path / "nothing"])


@pytest.mark.parametrize("shards", [1, 2])
def test_two_captures_with_one_base_name_stay_two(tmp_path, shards):
    """h1/capture.pcap and h2/capture.pcap (one per broker host, as tcpdump names them) are two captures: each
    keeps its own packet statistics and damage (they were merged as shards of one, the second's truncated tail lost)."""
    raw = CAPTURES["lo-eth-ipv4"].read_bytes()
    (tmp_path / "h1").mkdir()
    (tmp_path / "h2").mkdir()
    whole, cut = tmp_path / "h1" / "capture.pcap", tmp_path / "h2" / "capture.pcap"
    whole.write_bytes(raw)
    cut.write_bytes(raw[:len(raw) // 2])
    names = sorted({c.name for c in pcap.plan_captures([whole, cut], shards)})
    assert names == ["h1/capture.pcap", "h2/capture.pcap"]
    _, results = pcap.read_local([whole, cut], shards=shards)
    by = {r.name: r for r in results}
    assert sorted(by) == names
    _, (alone,) = pcap.read_local([cut])
    assert by["h2/capture.pcap"].stats["truncated_file_tails"] == 1
    assert by["h2/capture.pcap"].stats["packets"] == alone.stats["packets"]
    assert by["h1/capture.pcap"].stats["truncated_file_tails"] == 0
    assert by["h1/capture.pcap"].files == [str(whole.resolve())] or by["h1/capture.pcap"].files == [str(whole)]
    with pytest.raises(ValueError, match="given twice"):
        pcap.plan_captures([whole, tmp_path / "h1" / ".." / "h1" / "capture.pcap"])


def test_truncated_capture_counts_its_tail(tmp_path):
    raw = CAPTURES["lo-eth-ipv4"].read_bytes()
    p = tmp_path / "cut.pcap"
    p.write_bytes(raw[:len(raw) // 2])
    got, (res,) = records_of([p])
    assert res.stats["truncated_file_tails"] == 1 and 0 < len(got) < 42
    assert not res.damaged


def test_port_filter(tmp_path):
    m = manifest("lo-eth-ipv4")
    broker_port = int(m["broker"].rsplit(":", 1)[1])
    got, (res,) = records_of([CAPTURES["lo-eth-ipv4"]], ports=[broker_port])
    assert len(got) == 42
    got, (res,) = records_of([CAPTURES["lo-eth-ipv4"]], ports=[1])
    assert got == [] and res.stats["filtered_packets"] == res.stats["tcp_packets"] > 0


def test_scan_local_findings():
    """The reference analyses over a capture: the client that subscribes differently is found."""
    f = pcap.scan_local([CAPTURES["lo-eth-ipv4"]])
    m = manifest("lo-eth-ipv4")
    assert f["summary"]["records"] == 42 and f["summary"]["clients"] == len(m["clients"])
    (inc,) = f["inconsistent_subscriptions"]
    assert inc["group"] == "CID_cap_0"
    odd = [v for v in inc["variants"] if ["TopicCap0", "TAG", "TagC"] in v["subscriptions"]]
    assert odd and odd[0]["clients"] == [m["clients"][4]["client_id"]]
    notes = {n["group"]: n["notifies"] for n in f["capture"]["notifications"]}
    assert sum(notes.values()) == sum(c["notifications_received"] for c in m["clients"])
    assert f["capture"]["unregister_count"] == sum(c["unregisters"] for c in m["clients"])
    assert f["scan"]["corrupt"] == [] and f["gaps_over_data_loss"] == []


def test_native_module_registered():
    assert "_pcap" in engine.native_modules()
    if not os.environ.get("ENGINE_NO_EXTENSIONS"):
        from conftest import require_native

        require_native("engine.recording._pcap")
        assert engine.native_modules()["_pcap"] is True
        assert pcap.decoder_class() is pcap._NativeDecoder
    else:
        assert pcap.decoder_class() is sys.modules["engine.recording._pcap_py"].CaptureDecoder


# ---------------------------------------------------------------------------------------------------------------
# a generated fleet (rmqhb generate: injected anomalies and a manifest) as the capture of the broker's port


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from engine.recording import synth

    d = tmp_path_factory.mktemp("gen")
    rec = d / "rec"
    manifest = synth.generate(rec, synth.FleetConfig(clients=40, groups=6, days=0.25, seed=3))
    cap = d / "fleet.pcap"
    run_tool("from-recording", rec, cap, "--keep-open-after", 120)
    return rec, cap, manifest


def sizes_with_closes(rec_dir, expiry_ms=120_000, keep_open=True):
    """The group-size series a capture of ``rec_dir`` written by ``pcap_tool from-recording --keep-open-after 120``
    must give, worked out from the recording alone: a connection closes (FIN) at its last heartbeat unless its
    client is then silent for more than the expiry (or for good: left open), and a member leaves at the first of
    its next heartbeat, its connection's close, and its last heartbeat + expiry (``keep_open=False``: every
    connection closes at its last heartbeat, from-recording without --keep-open-after)."""
    from collections import defaultdict

    from engine import decode_heartbeat

    records = sorted(iter_records(rec_dir), key=lambda r: (r.recv_ms, r.conn_id))
    times, last_on, client_of, obs = defaultdict(list), {}, {}, defaultdict(list)
    for r in records:
        try:
            hb = decode_heartbeat(r.body)
        except ValueError:
            continue
        if hb.client_id is None:
            continue
        times[hb.client_id].append(r.recv_ms)
        last_on[r.conn_id], client_of[r.conn_id] = r.recv_ms, hb.client_id
        for role, groups in (("producer", [p.group for p in hb.producers]),
                             ("consumer", [c.group for c in hb.consumers])):
            for g in groups:
                obs[(role, g or "", hb.client_id)].append((r.recv_ms, r.conn_id))
    close_at = {}
    for conn, t in last_on.items():
        later = [x for x in times[client_of[conn]] if x > t]
        if not keep_open or (later and later[0] - t <= expiry_ms):
            close_at[conn] = t
    deltas = defaultdict(lambda: defaultdict(int))
    for (role, group, _), o in obs.items():
        o.sort()
        for i, (t, conn) in enumerate(o):
            end = min([t + expiry_ms] + ([o[i + 1][0]] if i + 1 < len(o) else [])
                      + ([close_at[conn]] if close_at.get(conn, -1) >= t else []))
            if end > t:
                deltas[(group, role)][t] += 1
                deltas[(group, role)][end] -= 1
    out = {}
    for key, d in deltas.items():
        n, series = 0, []
        for t in sorted(d):
            if d[t]:
                n += d[t]
                series.append([t, n])
        out[key] = series
    return out


def _by_addr_conn(findings, rec_dir):
    """Capture connection ids replaced by the recording's (the same connection: the same client address)."""
    conn_of = {r.remote_addr: r.conn_id for r in iter_records(rec_dir)}
    out = dict(findings)
    out["expired_clients"] = [dict(r, conn_id=conn_of[r["addr"]]) for r in findings["expired_clients"]]
    return out


def check_fleet_capture_findings(f, ref, rec, manifest):
    """A scan of the generated fleet's capture (from-recording --keep-open-after 120) against the recording's: the
    same findings, except group sizes, where the connections the capture saw close (FIN at their last heartbeat:
    the clients that moved to another connection within the expiry) count their members out at the close, not
    at the next heartbeat elsewhere or last heartbeat + expiry (the recording's rule, and the manifest's)."""
    from engine.recording import synth

    marks = ("connect_ms", "closes")
    for k in ("inconsistent_subscriptions", "flapping_clients", "heartbeat_gaps", "expired_clients",
              "member_addresses"):
        assert [{x: v for x, v in r.items() if x not in marks} for r in f[k]] == [
            {x: v for x, v in r.items() if x not in marks} for r in ref[k]], k
    assert len(f["expired_clients"]) == len(manifest["anomalies"]["expired_clients"]) > 0
    # a capture has no clipped records (the recorder's clip): the Spark scan's summary does not name a zero count
    assert {k: v for k, v in f["summary"].items() if k != "clipped_bodies"} == {
        k: v for k, v in ref["summary"].items() if k != "clipped_bodies"}
    assert f["summary"].get("clipped_bodies", 0) == ref["summary"].get("clipped_bodies", 0) == 0
    sizes = {(g["group"], g["role"]): g["series"] for g in f["group_sizes"]}
    assert sizes == sizes_with_closes(rec)
    assert [(g["group"], g["role"], g["members"]) for g in f["group_sizes"]] == [
        (g["group"], g["role"], g["members"]) for g in ref["group_sizes"]]
    differ = [k for k, g in zip(sizes, ref["group_sizes"]) if sizes[k] != g["series"]]
    assert differ  # the recording keeps those members until their next heartbeat on the new connection
    assert all(p.startswith("group_sizes ") for p in synth.compare_with_manifest(f, manifest))
    assert synth.compare_with_manifest(dict(f, group_sizes=ref["group_sizes"]), manifest) == []


def test_generated_fleet_capture_gives_the_injected_findings(generated):
    """The capture of the generated fleet gives the recording's findings and the injected anomalies: the expired
    clients kept their connections open (no FIN), so they expire in the capture too; group sizes differ where
    the capture saw a connection close (check_fleet_capture_findings)."""
    from engine.recording import scan_py

    rec, cap, manifest = generated
    f = _by_addr_conn(pcap.scan_local([cap]), rec)
    ref = scan_py.scan(rec)
    check_fleet_capture_findings(f, ref, rec, manifest)
    inj = manifest["anomalies"]
    assert len(f["flapping_clients"]) == len(inj["flapping_clients"]) > 0
    # the flapping clients' connection marks come from the capture's TCP events: a connect at each SYN (the tool
    # writes it 1 ms before the connection's first heartbeat), a close at each client FIN (the tool's come with the
    # connection's last heartbeat); the last connection, left open by --keep-open-after (its client then silent
    # for good or for longer than the expiry), has none, as in the recording
    for got, want in zip(f["flapping_clients"], ref["flapping_clients"]):
        assert got["connect_ms"] == [t - 1 for t in want["connect_ms"]]
        assert got["closes"] == [[t, "fin_by_client"] for t, _ in want["closes"]]
        assert len(got["closes"]) == len(got["connect_ms"]) - 1
    st = f["capture"]["stats"]
    assert st["heartbeats"] == f["summary"]["records"] and st["holes"] == st["discarded_bytes"] == 0
    closed = f["capture"]["connection_ends"]["fin_by_client"]
    assert list(f["capture"]["connection_ends"]) == ["fin_by_client"] and 0 < closed < st["connections"]


def test_generated_fleet_capture_with_every_connection_closed(generated, tmp_path):
    """from-recording without --keep-open-after closes every connection (FIN) at its last heartbeat: the clients
    the recording expires (silent with, as a recording must assume, their connection open) closed cleanly in this
    capture, so none expires, and every member leaves its groups at its connection's close."""
    from engine.recording import scan_py

    rec, _, manifest = generated
    cap = tmp_path / "closed.pcap"
    run_tool("from-recording", rec, cap)
    f = pcap.scan_local([cap])
    ref = scan_py.scan(rec)
    assert len(ref["expired_clients"]) == len(manifest["anomalies"]["expired_clients"]) > 0
    assert f["expired_clients"] == [] and f["expired_over_data_loss"] == [] and f["summary"]["expired_clients"] == 0
    assert {(g["group"], g["role"]): g["series"] for g in f["group_sizes"]} == sizes_with_closes(rec, keep_open=False)
    for k in ("inconsistent_subscriptions", "heartbeat_gaps"):
        assert f[k] == ref[k], k
    assert f["capture"]["connection_ends"] == {"fin_by_client": f["capture"]["stats"]["connections"]}


def test_shards_split_the_connections_and_add_up(generated):
    rec_dir, cap, _ = generated
    inputs = [cap, CAPTURES["lo-eth-ipv4"], DATA / "rotated-ipv6"]
    whole, res1 = records_of(inputs)
    parts, res3 = records_of(inputs, shards=3)
    assert sorted(parts) == sorted(whole)
    assert [r.name for r in res3] == [r.name for r in res1]
    for a, b in zip(res1, res3):
        assert a.stats == b.stats
        assert sorted(a.events) == b.events and sorted(a.losses) == sorted(b.losses)
    assert pcap.capture_summary(res3)["notifications"] == pcap.capture_summary(res1)["notifications"]
    with pytest.raises(ValueError):
        pcap.plan_captures(inputs, 0)


@pytest.mark.parametrize("name,link", [(n, k) for n in ("lo-eth-ipv4", "any-sll2-ipv6")
                                       for k in ("raw", "ipv4", "null", "loop", "vlan") if not (k == "ipv4" and "6" in n)])
def test_other_link_layers(tmp_path, link, name):
    """Raw IP (101, 228), BSD loopback (0 in the host's order, 108 in network order), Ethernet with a VLAN tag."""
    base, (res0,) = records_of([CAPTURES[name]])
    out = tmp_path / f"{link}.pcap"
    run_tool("relink", CAPTURES[name], out, "--link", link)
    got, (res,) = records_of([out])
    assert got == base and res.events == res0.events
    assert res.stats["malformed_packets"] == res.stats["non_tcp_packets"] == 0


def test_pcapng_sections_with_different_link_types(tmp_path):
    """One pcapng file of two sections (another byte order, another link type): both read, in order."""
    a, b = tmp_path / "a.pcapng", tmp_path / "b.pcapng"
    run_tool("pcapng", CAPTURES["lo-eth-ipv4"], a)
    run_tool("pcapng", CAPTURES["any-sll2-ipv6"], b, "--big-endian", "--nanos")
    both_ = tmp_path / "both.pcapng"
    both_.write_bytes(a.read_bytes() + b.read_bytes())
    got, (res,) = records_of([both_])
    want = records_of([CAPTURES["lo-eth-ipv4"]])[0] + records_of([CAPTURES["any-sll2-ipv6"]])[0]
    assert got == want and res.stats["files"] == 1


def test_several_brokers_captures_give_per_broker_and_fleet_findings():
    """--broker NAME=PATH captures: each broker's scanned apart; rows tagged with their broker, the summary summed
    with clients counted once, the fleet view (the same fleet seen by two brokers: its groups on both, even), and one
    capture section whose rows name their broker."""
    per = {"broker-a": pcap.scan_local([DATA / "lo-eth-ipv4.pcap"], client_ids=True),
           "broker-b": pcap.scan_local([DATA / "lo-eth-ipv4.pcapng"], client_ids=True),
           "broker-c": pcap.scan_local([CAPTURES["cpp-lo-ipv4"]], client_ids=True)}
    f = pcap.combine_capture_brokers(per)
    for key in ("inconsistent_subscriptions", "flapping_clients", "heartbeat_gaps", "group_sizes", "expired_clients"):
        for b, one in per.items():
            assert [{k: v for k, v in r.items() if k != "broker"} for r in f[key] if r["broker"] == b] == one[key], key
    a_clients = per["broker-a"]["_client_ids"]
    assert a_clients == per["broker-b"]["_client_ids"] and len(a_clients) == 7
    assert f["summary"]["records"] == 42 + 42 + 6 and f["summary"]["clients"] == 7 + 2
    fleet = f["fleet"]
    assert fleet["brokers"] == ["broker-a", "broker-b", "broker-c"]
    assert fleet["per_broker"]["broker-a"] == fleet["per_broker"]["broker-b"]
    assert fleet["per_broker"]["broker-c"]["inconsistent_subscriptions"] == 0
    assert fleet["per_broker"]["broker-a"]["inconsistent_subscriptions"] == 1
    spread = {(g["group"], g["role"]): g for g in fleet["groups_on_several_brokers"]}
    assert spread and all(g["brokers"] == ["broker-a", "broker-b"] and not g["uneven"] for g in spread.values())
    cap = f["capture"]
    assert cap["brokers"] == ["broker-a", "broker-b", "broker-c"]
    assert cap["stats"]["heartbeats"] == 90 and cap["unregister_count"] == 4 + 4 + 3
    assert cap["connection_ends"] == {"fin_by_client": 6 + 6 + 2, "rst_by_client": 2}
    assert {(n["broker"], n["group"]) for n in cap["notifications"]} >= {("broker-c", "CID_cpp_cap")}
    assert sum(n["notifies"] for n in cap["notifications"]) == 13 + 13 + 4
    assert [c["broker"] for c in cap["captures"]] == ["broker-a", "broker-b", "broker-c"]
    assert f["scan"]["corrupt"] == [] and set(f["scan"]["brokers"]) == set(per)


def test_broker_option_routes_captures():
    from engine.bindings.brokerlog import input_format

    a, b = str(DATA / "lo-eth-ipv4.pcap"), str(DATA / "cpp-lo-ipv4.pcap")
    assert input_format(["--broker", f"a={a}", f"--broker=b={b}", "--out", "r"])[0] == "pcap"
    assert input_format(["--broker", f"a={a}", "--out", "r", "--log-tz", "UTC"])[0] == "broker-log"
    with pytest.raises(ValueError, match="NAME=PATH"):
        pcap.plan_brokers(["a"])
    assert pcap.plan_brokers([f"a={a}", f"a={b}"]) == {"a": [Path(a), Path(b)]}


# ---------------------------------------------------------------------------------------------------------------
# what a capture's closes and unregisters change: a client the capture saw leave is not an expired client


T0 = 1_718_000_000_000


def _body(client, producers=("CLIENT_INNER_PRODUCER",), consumer="G"):
    subs = ('[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1,'
            '"tagsSet":[],"topic":"T"}]')
    cons = (f'[{{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":'
            f'"{consumer}","messageModel":"CLUSTERING","subscriptionDataSet":{subs},"unitMode":false}}]')
    prods = ",".join(f'{{"groupName":"{p}"}}' for p in producers)
    return f'{{"clientID":"{client}","consumerDataSet":{cons},"producerDataSet":[{prods}]}}'.encode()


def closing_clients_capture(path, events=True):
    """Seven consumers of group G (every one also in CLIENT_INNER_PRODUCER, H also producer of PG) heartbeat at
    0, 30 and 60 s; then A closes its connection (client FIN, 70 s), B goes silent with its connection open, C
    sends UNREGISTER_CLIENT for G (65 s) and goes silent (connection open), D's connection is reset by the broker
    (90 s), H unregisters from G only (65 s: still a producer of PG) and goes silent; E heartbeats every 30 s until
    390 s (the capture's end), F until 300 s (its expiry, 420 s, is after the capture's end). ``events=False``:
    the heartbeats only (no close, no unregister). Returns {client: address}."""
    addrs = {c: f"10.0.1.{i + 1}:4{i}000" for i, c in enumerate("ABCDEFH")}
    steps = []
    for s in range(0, 391, 30):
        for c in "ABCDEFH":
            if s <= 60 or c == "E" or (c == "F" and s <= 300):
                steps.append((T0 + s * 1000, addrs[c], "hb",
                              _body(f"{c}@1", ("CLIENT_INNER_PRODUCER", "PG") if c == "H" else
                                    ("CLIENT_INNER_PRODUCER",))))
        if s == 60 and events:
            steps += [(T0 + 65_000, addrs["C"], "unregister", ("C@1", None, "G")),
                      (T0 + 65_000, addrs["H"], "unregister", ("H@1", None, "G")),
                      (T0 + 70_000, addrs["A"], "fin", "client"),
                      (T0 + 90_000, addrs["D"], "rst", "server")]
    tool.write_script(path, steps)
    return addrs


#: what the capture of closing_clients_capture gives (ms after T0)
CLOSING_EXPIRED = {"B@1": 60_000, "H@1": 60_000}
CLOSING_SIZES = {("G", "consumer"): [[0, 7], [65_000, 5], [70_000, 4], [90_000, 3], [180_000, 2], [420_000, 1],
                                     [510_000, 0]],
                 ("CLIENT_INNER_PRODUCER", "producer"): [[0, 7], [70_000, 6], [90_000, 5], [180_000, 2],
                                                         [420_000, 1], [510_000, 0]],
                 ("PG", "producer"): [[0, 1], [180_000, 0]]}


def check_closing_findings(f, addrs):
    """The findings of closing_clients_capture (local and Spark scans alike)."""
    assert [(r["client_id"], r["last_heartbeat_ms"] - T0, r["expired_ms"] - T0, r["returned_ms"], r["addr"])
            for r in f["expired_clients"]] == [(c, t, t + 120_000, None, addrs[c[0]])
                                               for c, t in sorted(CLOSING_EXPIRED.items())]
    sizes = {(g["group"], g["role"]): [[t - T0, n] for t, n in g["series"]] for g in f["group_sizes"]}
    assert sizes == CLOSING_SIZES
    assert f["summary"]["expired_clients"] == 2 and f["expired_over_data_loss"] == []
    assert f["capture"]["connection_ends"] == {"fin_by_client": 1, "rst_by_server": 1}
    assert f["capture"]["unregister_count"] == 2


def test_clients_that_closed_or_unregistered_are_not_expired(tmp_path):
    """A client the capture saw leave -- its connection's FIN or RST (either side), or UNREGISTER_CLIENT for each
    of its groups -- after its last heartbeat and before its expiry left then: no expired_clients row, and the
    group sizes count it out at the close / unregister. A client silent with its connection open (B), or still
    in a group it did not unregister from (H: PG), expires; one whose expiry falls after the capture's end (F)
    does not. The same heartbeats as a recording (no close events) expire A, C and D too."""
    from engine.recording.scan_py import scan_records

    cap = tmp_path / "closing.pcap"
    addrs = closing_clients_capture(cap)
    f = pcap.scan_local([cap])
    check_closing_findings(f, addrs)
    rec, _ = pcap.read_local([cap])
    as_recording = scan_records(pcap.records_iter([rec]))
    assert [(r["client_id"], r["last_heartbeat_ms"] - T0) for r in as_recording["expired_clients"]] == [
        (c + "@1", 60_000) for c in "ABCDH"]
    rsizes = {(g["group"], g["role"]): [[t - T0, n] for t, n in g["series"]] for g in as_recording["group_sizes"]}
    assert rsizes[("G", "consumer")] == [[0, 7], [180_000, 2], [420_000, 1], [510_000, 0]]
    # only what the capture saw counts: the same capture without the FIN, the RST and the unregisters expires
    # A, C and D as the recording does
    bare = tmp_path / "bare.pcap"
    closing_clients_capture(bare, events=False)
    assert [r["client_id"] for r in pcap.scan_local([bare])["expired_clients"]] == [c + "@1" for c in "ABCDH"]


def rejoining_client_capture(path, unregister_addr=None, unregister_s=65):
    """U (consumer of G, topic T) heartbeats at 0, 30 and 60 s, sends UNREGISTER_CLIENT for G at 65 s and
    heartbeats G again at 85, 115 and 145 s on the same connection (20 s after the unregister: within one run of
    the member), then goes silent with its connection open; K (consumer of G, topic T2: another subscription set)
    heartbeats every 30 s until 300 s. ``unregister_addr``: the unregister comes on another connection of U, from
    that address (opened for it and left open); ``unregister_s``: at that time. Returns {client: address}."""
    addrs = {"U": "10.0.3.1:43000", "K": "10.0.3.2:44000"}
    steps = [(T0 + s * 1000, addrs["U"], "hb", _body("U@1")) for s in (0, 30, 60, 85, 115, 145)]
    steps.append((T0 + unregister_s * 1000, unregister_addr or addrs["U"], "unregister", ("U@1", None, "G")))
    steps += [(T0 + s * 1000, addrs["K"], "hb", _body("K@1").replace(b'"topic":"T"', b'"topic":"T2"'))
              for s in range(0, 301, 30)]
    tool.write_script(path, sorted(steps, key=lambda x: x[0]))
    return addrs


#: what rejoining_client_capture gives (ms after T0): U out of G from its unregister (65 s) until its next
#: heartbeat (85 s), in CLIENT_INNER_PRODUCER throughout (not unregistered); U expires at 145 + 120 s
REJOIN_SIZES = {("G", "consumer"): [[0, 2], [65_000, 1], [85_000, 2], [265_000, 1], [420_000, 0]],
                ("CLIENT_INNER_PRODUCER", "producer"): [[0, 2], [265_000, 1], [420_000, 0]]}
REJOIN_SPANS = [(0, 65_000), (85_000, 265_000)]


#: the same with the unregister at 85 s, the millisecond of U's next heartbeat (on another connection: the order
#: of the two packets within that millisecond is not used): the unregister ends U after that heartbeat, as one at
#: or after a heartbeat does, so U is out of G from 85 s to its heartbeat at 115 s
REJOIN_AT_HEARTBEAT_SIZES = {("G", "consumer"): [[0, 2], [85_000, 1], [115_000, 2], [265_000, 1], [420_000, 0]],
                             ("CLIENT_INNER_PRODUCER", "producer"): REJOIN_SIZES[("CLIENT_INNER_PRODUCER", "producer")]}
REJOIN_AT_HEARTBEAT_SPANS = [(0, 85_000), (115_000, 265_000)]


def check_rejoin_findings(f, sizes_want=REJOIN_SIZES, spans_want=REJOIN_SPANS):
    """The findings of rejoining_client_capture (local and Spark scans alike)."""
    sizes = {(g["group"], g["role"]): [[t - T0, n] for t, n in g["series"]] for g in f["group_sizes"]}
    assert sizes == sizes_want
    assert [(r["start_ms"] - T0, r["end_ms"] - T0) for r in f["inconsistent_subscriptions"]] == spans_want
    assert [(r["client_id"], r["last_heartbeat_ms"] - T0, r["expired_ms"] - T0) for r in f["expired_clients"]] == [
        ("U@1", 145_000, 265_000)]
    assert f["capture"]["unregister_count"] == 1


def test_a_client_unregistered_then_heartbeating_again_on_its_connection(tmp_path):
    """UNREGISTER_CLIENT then a heartbeat of the same group 20 s later on the same connection (inside one run of
    the member): the member is out from the unregister to that heartbeat (group sizes, inconsistent-subscription
    spans), in every group it did not unregister from throughout; both scans alike (tests/test_pcap_spark.py)."""
    from engine.recording.scan_py import scan_records

    cap = tmp_path / "rejoin.pcap"
    rejoining_client_capture(cap)
    check_rejoin_findings(pcap.scan_local([cap]))
    # the heartbeats without the unregister: one interval, one span
    rec, _ = pcap.read_local([cap])
    plain = scan_records(pcap.records_iter([rec]))
    assert {(g["group"], g["role"]): [[t - T0, n] for t, n in g["series"]] for g in plain["group_sizes"]}[
        ("G", "consumer")] == [[0, 2], [265_000, 1], [420_000, 0]]
    assert [(r["start_ms"] - T0, r["end_ms"] - T0) for r in plain["inconsistent_subscriptions"]] == [(0, 265_000)]


#: U's connections in rejoining_client_capture(unregister_addr=...): its heartbeats' and another one, which the
#: readers of a capture read in two shards take apart (checked by shard_of)
UNREGISTER_ELSEWHERE = "10.0.3.1:43001"


def shard_of(addr, n, server="10.255.255.254:10911"):
    """The shard (of ``n``) that reads the connection of ``addr`` to pcap_tool.write_script's broker."""
    from engine.recording._pcap_py import conn_hash

    def raw(a):
        host, port = a.rsplit(":", 1)
        return bytes(int(x) for x in host.split(".")) + int(port).to_bytes(2, "big")

    lo, hi = sorted([raw(addr), raw(server)])
    return conn_hash(b"\x04" + lo + hi, 0) % n


@pytest.mark.parametrize("unregister_s", [65, 85])
def test_a_client_unregistered_on_another_connection(tmp_path, unregister_s):
    """U sends its UNREGISTER_CLIENT for G on a second connection (another shard's when read in two) and
    heartbeats G again on its first: the same findings as the unregister on the heartbeats' connection, sharded
    or not. A shard's runs with the whole capture's unregisters as cuts (capture_runs(unregisters=...), the
    Spark scan's second step) are, together, the unsharded reader's runs."""
    from engine.recording.scan_py import ScanParams

    rejoin = tmp_path / "rejoin.pcap"
    addrs = rejoining_client_capture(rejoin, UNREGISTER_ELSEWHERE, unregister_s)
    assert shard_of(addrs["U"], 2) != shard_of(UNREGISTER_ELSEWHERE, 2)
    want = (REJOIN_SIZES, REJOIN_SPANS) if unregister_s == 65 else (REJOIN_AT_HEARTBEAT_SIZES, REJOIN_AT_HEARTBEAT_SPANS)
    for shards in (1, 2):
        check_rejoin_findings(pcap.scan_local([rejoin], shards=shards), *want)

    def member_runs(batches):
        rows = [r for b in batches for r in b.to_pylist() if r["role"] in ("consumer", "producer")]
        return sorted((r["role"], r["group"], r["client_id"], r["conn_id"], r["first_ms"], r["last_ms"], r["n"])
                      for r in rows)

    params = ScanParams()
    (whole,) = pcap.plan_captures([rejoin])
    one = member_runs(pcap.capture_runs(whole, params))
    assert ("consumer", "G", "U@1") in {r[:3] for r in one} and len([r for r in one if r[1] == "G"]) == 3
    shards = pcap.plan_captures([rejoin], 2)
    _, results = pcap.read_local([rejoin])
    everywhere = pcap.unregister_times(results)
    assert member_runs(b for c in shards for b in pcap.capture_runs(c, params, unregisters=everywhere)) == one
    # without them the shard of U's heartbeats has one run of U in G over the unregister
    assert member_runs(b for c in shards for b in pcap.capture_runs(c, params)) != one


def leaving_deviators_capture(path):
    """Consumers of G: K1 and K2 (topic T) heartbeat every 30 s until 300 s; D1 heartbeats T at 0, 30, 60 s on one
    connection, closes it (client FIN, 70 s) and heartbeats T2 on a new one from 80 s to 290 s; D2 does the same
    but leaves its first connection by UNREGISTER_CLIENT for G (65 s), the connection staying open. The
    disagreement starts at 80 s, after both left their first connection. Returns {client: address}."""
    addrs = {"K1": "10.0.5.1:45000", "K2": "10.0.5.2:45000", "D1": "10.0.5.3:45000", "D1b": "10.0.5.3:45001",
             "D2": "10.0.5.4:45000", "D2b": "10.0.5.4:45001"}
    t2 = lambda b: b.replace(b'"topic":"T"', b'"topic":"T2"')  # noqa: E731
    steps = [(T0 + s * 1000, addrs[c], "hb", _body(c + "@1")) for s in range(0, 301, 30) for c in ("K1", "K2")]
    for c in ("D1", "D2"):
        steps += [(T0 + s * 1000, addrs[c], "hb", _body(c + "@1")) for s in (0, 30, 60)]
        steps += [(T0 + s * 1000, addrs[c + "b"], "hb", t2(_body(c + "@1"))) for s in range(80, 301, 30)]
    steps += [(T0 + 70_000, addrs["D1"], "fin", "client"),
              (T0 + 65_000, addrs["D2"], "unregister", ("D2@1", None, "G"))]
    tool.write_script(path, sorted(steps, key=lambda x: x[0]))
    return addrs


def check_leaving_deviators(f, addrs):
    """The findings of leaving_deviators_capture (local and Spark scans alike): one span from 80 s, D1 and D2
    deviating, each listed at its second connection's address only (the first was left before the span)."""
    (span,) = f["inconsistent_subscriptions"]
    assert (span["start_ms"] - T0, span["end_ms"] - T0) == (80_000, 410_000)
    assert [v["clients"] for v in span["variants"]] == [["K1@1", "K2@1"], ["D1@1", "D2@1"]]
    assert [(r["group"], r["client_id"], r["addrs"]) for r in f["member_addresses"]] == [
        ("G", "D1@1", [addrs["D1b"]]), ("G", "D2@1", [addrs["D2b"]])]


def test_member_addresses_end_at_the_close_or_unregister(tmp_path):
    """member_addresses of a capture use its closes and unregisters as membership does: a deviating member that
    closed a connection (FIN) or unregistered on it before the span is not listed at that address; the same
    heartbeats as a recording (nothing seen leaving) list it, its last heartbeat there being within the expiry
    of the span's start."""
    from engine.recording.scan_py import scan_records

    cap = tmp_path / "leaving.pcap"
    addrs = leaving_deviators_capture(cap)
    for shards in (1, 2):
        check_leaving_deviators(pcap.scan_local([cap], shards=shards), addrs)
    rec, _ = pcap.read_local([cap])
    plain = scan_records(pcap.records_iter([rec]))
    assert [(r["client_id"], r["addrs"]) for r in plain["member_addresses"]] == [
        ("D1@1", sorted([addrs["D1"], addrs["D1b"]])), ("D2@1", sorted([addrs["D2"], addrs["D2b"]]))]


def half_closed_capture(path):
    """D (consumer of G, topic T2) heartbeats at 0, 30 and 60 s; the broker half-closes D's connection (its FIN
    alone, 65 s) and D heartbeats again on it at 90 and 120 s (unanswered) before its own FIN (130 s); K1 and K2
    (topic T) heartbeat every 30 s until 300 s. Returns {client: address}."""
    addrs = {"D": "10.0.6.1:46000", "K1": "10.0.6.2:46000", "K2": "10.0.6.3:46000"}
    t2 = _body("D@1").replace(b'"topic":"T"', b'"topic":"T2"')
    steps = [(T0 + s * 1000, addrs["D"], "hb", t2) for s in (0, 30, 60, 90, 120)]
    steps += [(T0 + 65_000, addrs["D"], "half_close", None), (T0 + 130_000, addrs["D"], "fin", "client")]
    steps += [(T0 + s * 1000, addrs[c], "hb", _body(c + "@1")) for s in range(0, 301, 30) for c in ("K1", "K2")]
    tool.write_script(path, sorted(steps, key=lambda x: x[0]))
    return addrs


#: what half_closed_capture gives (ms after T0): D out of G at the connection's (first) FIN, 65 s; its heartbeats
#: after it on the half-closed connection count as heartbeats (member_left takes the first FIN / RST at or after
#: a heartbeat), so D is back at 90 s until 120 + 120 s
HALF_CLOSED_SIZES = [[0, 3], [65_000, 2], [90_000, 3], [240_000, 2], [420_000, 0]]
HALF_CLOSED_SPANS = [(0, 65_000), (90_000, 240_000)]


def check_half_closed_findings(f, addrs):
    sizes = {(g["group"], g["role"]): [[t - T0, n] for t, n in g["series"]] for g in f["group_sizes"]}
    assert sizes[("G", "consumer")] == HALF_CLOSED_SIZES
    assert [(r["start_ms"] - T0, r["end_ms"] - T0) for r in f["inconsistent_subscriptions"]] == HALF_CLOSED_SPANS
    assert [(r["client_id"], r["addrs"]) for r in f["member_addresses"]] == [("D@1", [addrs["D"]])]
    assert f["capture"]["connection_ends"] == {"fin_by_server": 1}


def test_heartbeats_on_a_half_closed_connection(tmp_path):
    """Heartbeats after the first FIN of their connection (the broker's, the client still sending): the member
    leaves at the FIN and is back at the next heartbeat (scan_py.member_left); a capture's runs end at their
    connection's FIN (capture_runs), as they end at an unregister, so Spark's live intervals see it too."""
    from engine.recording.scan_py import ScanParams

    cap = tmp_path / "half.pcap"
    addrs = half_closed_capture(cap)
    for shards in (1, 2):
        check_half_closed_findings(pcap.scan_local([cap], shards=shards), addrs)
    (whole,) = pcap.plan_captures([cap])
    runs = [r for b in pcap.capture_runs(whole, ScanParams()) for r in b.to_pylist()
            if r["role"] == "consumer" and r["client_id"] == "D@1"]
    assert sorted((r["first_ms"] - T0, r["last_ms"] - T0, r["n"]) for r in runs) == [(0, 60_000, 3),
                                                                                   (90_000, 120_000, 2)]


def test_a_close_at_the_expiry_or_a_capture_ending_before_it(tmp_path):
    """The close must come before the expiry: a FIN at last heartbeat + expiry or later leaves the expiry (the
    broker's scan removed the channel first); a silence cut by the capture's end before the expiry is no expiry."""
    cap = tmp_path / "late.pcap"
    a, b = "10.0.2.1:41000", "10.0.2.2:42000"
    steps = [(T0 + s * 1000, a, "hb", _body("L@1")) for s in (0, 30)]
    steps += [(T0 + s * 1000, b, "hb", _body("K@1")) for s in range(0, 301, 30)]
    steps += [(T0 + 150_000, a, "fin", "client"), (T0 + 150_001, a, "fin", "server")]
    tool.write_script(cap, steps)
    f = pcap.scan_local([cap])
    assert [(r["client_id"], r["expired_ms"] - T0) for r in f["expired_clients"]] == [("L@1", 150_000)]
    sizes = {g["group"]: [[t - T0, n] for t, n in g["series"]] for g in f["group_sizes"]}
    assert sizes["G"] == [[0, 2], [150_000, 1], [420_000, 0]]
    # the same capture cut at 200 s: L's expiry (150 s) still inside, K's silence (from 180 s) not
    steps_200 = [s for s in steps if s[0] <= T0 + 200_000]
    tool.write_script(cap, steps_200)
    assert [r["client_id"] for r in pcap.scan_local([cap])["expired_clients"]] == ["L@1"]


def test_several_brokers_closing_clients(tmp_path):
    """combine_capture_brokers over captures with closes: each broker's expired clients are its own scan's (the
    broker that saw A close, C and H unregister and D reset lists B and H; one whose capture holds the heartbeats
    only lists A, B, C, D and H), and the fleet view names the clients expired on both."""
    a, b = tmp_path / "a.pcap", tmp_path / "b.pcap"
    closing_clients_capture(a)
    closing_clients_capture(b, events=False)
    per = {"broker-a": pcap.scan_local([a], client_ids=True), "broker-b": pcap.scan_local([b], client_ids=True)}
    f = pcap.combine_capture_brokers(per)
    assert [(r["broker"], r["client_id"]) for r in f["expired_clients"]] == [
        ("broker-a", "B@1"), ("broker-a", "H@1"), ("broker-b", "A@1"), ("broker-b", "B@1"), ("broker-b", "C@1"),
        ("broker-b", "D@1"), ("broker-b", "H@1")]
    several = {r["client_id"]: r["brokers"] for r in f["fleet"]["clients_on_several_brokers"]
               if r["finding"] == "expired_clients"}
    assert several == {"B@1": ["broker-a", "broker-b"], "H@1": ["broker-a", "broker-b"]}
    sizes = {(g["broker"], g["group"], g["role"]): [[t - T0, n] for t, n in g["series"]] for g in f["group_sizes"]}
    assert sizes[("broker-a", "G", "consumer")] == CLOSING_SIZES[("G", "consumer")]
    assert sizes[("broker-b", "G", "consumer")] == [[0, 7], [180_000, 2], [420_000, 1], [510_000, 0]]
    assert f["capture"]["connection_ends"] == {"fin_by_client": 1, "rst_by_server": 1}


def hole_capture(path):
    """M and N heartbeat at 0, 30, 60 s; the capture misses their next heartbeat (90 s); M heartbeats again at
    200 s, N closes (FIN, 100 s); K heartbeats until 300 s. Returns (M's address, N's)."""
    m, n, k = "10.0.3.1:41000", "10.0.3.2:42000", "10.0.3.3:43000"
    steps = [(T0 + s * 1000, c, "hb", _body(cid)) for s in (0, 30, 60) for c, cid in ((m, "1@1"), (n, "2@1"))]
    steps += [(T0 + 90_000, m, "missed", _body("1@1")), (T0 + 90_000, n, "missed", _body("2@1")),
              (T0 + 100_000, n, "fin", "client"), (T0 + 200_000, m, "hb", _body("1@1"))]
    steps += [(T0 + s * 1000, k, "hb", _body("K@1")) for s in range(0, 301, 30)]
    tool.write_script(path, sorted(steps, key=lambda x: x[0]))
    return m, n


def test_a_hole_over_the_silence_is_no_expiry(tmp_path):
    """What the capture missed is not silence: M's heartbeat at 90 s (and its answer) are missing from the capture
    and M heartbeats again at 200 s: the 140 s without a heartbeat in the capture overlaps the hole ([60 s, 200 s]
    on M's connection), so it goes to expired_over_data_loss, not expired_clients. N's missed heartbeat is followed
    by its FIN (100 s): N left, neither list has it."""
    cap = tmp_path / "hole.pcap"
    m, n = hole_capture(cap)
    f = pcap.scan_local([cap])
    assert f["expired_clients"] == []
    over = f["expired_over_data_loss"]
    assert [(r["client_id"], r["last_heartbeat_ms"] - T0, r["returned_ms"] - T0) for r in over] == [
        ("1@1", 60_000, 200_000)]
    assert {(lo["addr"], lo["first_ms"] - T0, lo["last_ms"] - T0) for lo in f["capture"]["losses"]} == {
        (m, 60_000, 200_000), (n, 60_000, 100_000)}


def test_review_plan_captures_generator_and_file_inside_given_directory(tmp_path):
    # review: a generator of paths planned no capture at all (its names were read from the spent generator), and
    # a file given both alone and through its directory was read twice (its heartbeats counted twice)
    raw = CAPTURES["lo-eth-ipv4"].read_bytes()
    d = tmp_path / "rot"
    d.mkdir()
    (d / "a.pcap").write_bytes(raw)
    assert [c.name for c in pcap.plan_captures(p for p in [d / "a.pcap"])] == ["a.pcap"]
    with pytest.raises(pcap.CaptureError, match="given twice"):
        pcap.plan_captures([d, d / "a.pcap"])


# ---------------------------------------------------------------------------------------------------------------
# several captures: the same 4-tuple in two of them, and the time between them


def shifted_copy(src: Path, dst: Path, seconds: int) -> Path:
    """``src`` (a little-endian microsecond pcap) with every packet ``seconds`` later: the same connections, the
    same 4-tuples, another run of them."""
    raw = src.read_bytes()
    out, pos = bytearray(raw[:24]), 24
    while pos + 16 <= len(raw):
        ts, us, incl, orig = struct.unpack("<IIII", raw[pos:pos + 16])
        out += struct.pack("<IIII", ts + seconds, us, incl, orig) + raw[pos + 16:pos + 16 + incl]
        pos += 16 + incl
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(out))
    return dst


@pytest.mark.parametrize("shards", [1, 2])
def test_the_same_four_tuple_in_two_captures_is_two_connections(tmp_path, shards):
    """A later capture of the same clients on the same client ports (here: the first capture 600 s later): each
    capture's connections keep their own ids (the first capture's as read alone), so their opens and ends are not
    merged into one connection's (before, the second capture's connections took the first's ids and lost their
    opens and closes)."""
    a = CAPTURES["lo-eth-ipv4"]
    b = shifted_copy(a, tmp_path / "later" / a.name, 600)
    alone, alone_res = pcap.read_local([a])
    both, results = pcap.read_local([a, b], shards=shards)
    n = len(alone["conn_id"])
    ids_a, ids_b = set(both["conn_id"][:n].tolist()), set(both["conn_id"][n:].tolist())
    assert ids_a == set(alone["conn_id"].tolist()) and len(ids_b) == len(ids_a) and not ids_a & ids_b
    events = pcap.connection_events(results)
    assert len(events) == 2 * len(pcap.connection_events(alone_res))
    assert sorted(e.get("open", 0) - 600_000 for c, e in events.items() if c in ids_b) == sorted(
        e.get("open", 0) for e in pcap.connection_events(alone_res).values())


def test_time_no_capture_shows_is_not_client_silence(tmp_path):
    """Two captures of the same clients 600 s apart: the clients' heartbeats resume after the hole between the
    captures, which no capture shows; those 600 s gaps are reported over data loss, not as heartbeat gaps, the
    hole is named (scan.not_captured, the report's banner), and the two captures' other findings are each one's."""
    a = CAPTURES["lo-eth-ipv4"]
    b = shifted_copy(a, tmp_path / "later" / a.name, 600)
    one, two = pcap.scan_local([a]), pcap.scan_local([a, b])
    assert one["heartbeat_gaps"] == [] and one["scan"]["not_captured"] == []
    assert two["heartbeat_gaps"] == [] and len(two["gaps_over_data_loss"]) == 7
    assert two["summary"]["heartbeat_gaps"] == 0 and two["summary"]["gaps_over_data_loss"] == 7
    (hole,) = two["scan"]["not_captured"]
    cap_a, cap_b = two["capture"]["captures"]  # in the order given
    assert hole["first_ms"] == cap_a["last_ms"] + 1 and hole["last_ms"] == cap_b["first_ms"] - 1
    assert (hole["after"], hole["before"]) == (cap_a["name"], cap_b["name"])
    spans = two["inconsistent_subscriptions"]
    assert [(s["start_ms"], s["end_ms"]) for s in spans] == [
        (s["start_ms"] + d, s["end_ms"] + d) for d in (0, 600_000) for s in one["inconsistent_subscriptions"]]
    from engine.bindings.report import coverage_lines
    (note,) = coverage_lines(two)
    assert note.startswith("1 time range(s) between the captures not captured")
    assert coverage_lines(one) == [] and two["capture"]["continued"] == []  # the first run's connections all closed


def test_silence_the_captures_show_stays_a_finding_across_a_hole(tmp_path):
    """U heartbeats at 0-60 s and is silent while K heartbeats until 300 s (capture 1, its last packet K's answer's
    ACK); both heartbeat again in capture 2 from 900 s. U's silence from 60 s to 300 s, which capture 1 shows, passes the gap threshold alone: the
    gap stays a finding (``not_captured_s``: the part no capture shows). K's gap lies in the hole: reported apart."""
    addrs = {"U": "10.0.3.1:43000", "K": "10.0.3.2:44000"}
    first = [(T0 + s * 1000, addrs["U"], "hb", _body("U@1")) for s in (0, 30, 60)]
    first += [(T0 + s * 1000, addrs["K"], "hb", _body("K@1")) for s in range(0, 301, 30)]
    later = [(T0 + s * 1000, addrs[c], "hb", _body(f"{c}@1")) for s in (900, 930) for c in ("U", "K")]
    tool.write_script(tmp_path / "one.pcap", sorted(first, key=lambda x: x[0]))
    tool.write_script(tmp_path / "two.pcap", later)
    f = pcap.scan_local([tmp_path / "one.pcap", tmp_path / "two.pcap"])
    (hole,) = f["scan"]["not_captured"]
    assert (hole["first_ms"] - T0, hole["last_ms"] - T0) == (300_001, 899_999)
    (gap,) = f["heartbeat_gaps"]
    assert (gap["client_id"], gap["start_ms"] - T0, gap["end_ms"] - T0) == ("U@1", 60_000, 900_000)
    assert gap["not_captured_s"] == 599.999
    assert [(g["client_id"], g["start_ms"] - T0) for g in f["gaps_over_data_loss"]] == [("K@1", 300_000)]


def test_rotated_files_given_one_by_one_are_named(tmp_path):
    """tcpdump's rotated files given one by one (a shell glob) instead of as their directory: each file is its own
    capture, so its connections are read as new and the clients seem to reconnect at every file. The scan names
    the captures that continue another's connections and the report says to give the directory; given as the
    directory, the same files read as one capture (no flapping, nothing named)."""
    rot = tmp_path / "rotated"
    run_tool("split", CAPTURES["lo-eth-ipv4"], rot, "--packets", "37")
    files = sorted(rot.iterdir())
    whole, apart = pcap.scan_local([rot]), pcap.scan_local(files)
    assert whole["flapping_clients"] == [] and whole["capture"]["continued"] == []
    assert whole["scan"]["not_captured"] == []
    continued = apart["capture"]["continued"]
    assert [c["capture"] for c in continued] == [f.name for f in files[1:]]
    assert apart["scan"]["not_captured"] == []  # each file starts with the packet after the last one's
    assert all(c["continues"] == f.name and c["connections"] >= 1 for c, f in zip(continued, files))
    from engine.bindings.report import coverage_lines
    assert any("give their directory" in note for note in coverage_lines(apart))

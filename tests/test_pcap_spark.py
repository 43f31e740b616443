"""Packet captures on Spark: read_pcaps gives the local reader's records (the recording reader's frame), the scan
gives the reference analyses' findings plus the capture section, and `rmqhb scan CAPTURE --out DIR` writes the
report (exit 3 when the capture missed data). One shared SparkSession."""
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import require_module  # noqa: E402

require_module("pyspark")
require_module("pyarrow")

from engine.bindings import pcap  # noqa: E402
from engine.bindings import segments as seg  # noqa: E402

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pcap"
_spec = importlib.util.spec_from_file_location("pcap_tool", ROOT / "scripts" / "pcap_tool.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

INPUTS = [DATA / "lo-eth-ipv4.pcap", DATA / "any-sll-ipv4.pcap.gz", DATA / "rotated-ipv6"]


def test_read_pcaps_is_the_record_frame(spark):
    df = pcap.read_pcaps(spark, INPUTS)
    assert df.schema == pcap_struct()
    got = sorted(tuple(r) for r in df.collect())
    rec, _ = pcap.read_local(INPUTS)
    want = sorted((t, c, a, lang.name if lang is not None else None, v, b)
                  for t, c, a, lang, v, b in pcap.records_iter([rec]))
    assert [(r[0], r[1], r[2], r[3], r[4], bytes(r[5])) for r in got] == want
    assert len(got) == 42 + 20 + 24


def pcap_struct():
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(seg.RECORD_SCHEMA)


def test_events_frame(spark):
    ev = pcap.read_capture_events(spark, INPUTS).collect()
    kinds = {}
    for r in ev:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    assert kinds["unregister"] == 4 + 3 + 3 and kinds["notify"] == 13 + 8 + 8
    assert {r["capture"] for r in ev} == {"lo-eth-ipv4.pcap", "any-sll-ipv4.pcap.gz", "rotated-ipv6"}


def _comparable(f):
    keys = ("inconsistent_subscriptions", "flapping_clients", "heartbeat_gaps", "group_sizes", "expired_clients",
            "member_addresses")
    return {k: f[k] for k in keys}, {k: f["summary"][k] for k in ("records", "bad_bodies", "clients")}


def test_scan_equals_the_reference_analyses(spark):
    f = pcap.scan(spark, INPUTS)
    ref = pcap.scan_local(INPUTS)
    assert _comparable(f) == _comparable(ref)
    assert f["capture"] == ref["capture"]
    # the deviating member's address: its connection's (the capture's 4-tuple), as the local reader's
    assert f["member_addresses"] and all(r["addrs"] for r in f["member_addresses"])
    assert f["summary"]["records"] == 86
    groups = {n["group"]: n["notifies"] for n in f["capture"]["notifications"]}
    assert sum(groups.values()) == 13 + 8 + 8
    assert f["scan"]["corrupt"] == [] and f["scan"]["method"] == "pcap"


def test_scan_over_missed_data_reports_damage(spark, tmp_path):
    src = DATA / "lo-eth-ipv4.pcap"
    m = json.loads((DATA / "lo-eth-ipv4.json").read_text())
    port = int(m["clients"][0]["addr"].rsplit(":", 1)[1])
    out = tmp_path / "lossy.pcap"
    tool.main(["mutate", str(src), str(out), "--port", str(port), "--size", "100", "--drop", "10"])
    f = pcap.scan(spark, [out])
    assert f["summary"]["records"] == 41
    (loss,) = f["capture"]["losses"]
    assert loss["addr"] == m["clients"][0]["addr"] and loss["bytes"] == 100
    assert [d["kind"] for d in f["scan"]["corrupt"]] == ["capture_loss"]
    assert f["capture"]["stats"]["resyncs"] == 1

    from engine.cli import main

    rep = tmp_path / "report"
    assert main(["scan", str(out), "--out", str(rep), "--no-plots"]) == 3
    assert main(["scan", str(out), "--out", str(rep), "--no-plots", "--allow-damage"]) == 0
    saved = json.loads((rep / "findings.json").read_text())
    assert saved["capture"]["stats"]["holes"] == 1 and (rep / "index.html").is_file()


def test_rmqhb_scan_routes_captures(spark, tmp_path):
    from engine.cli import main

    rep = tmp_path / "r"
    assert main(["scan", str(DATA / "lo-eth-ipv4.pcapng"), str(DATA / "rotated-ipv6"), "--out", str(rep),
                 "--no-plots"]) == 0
    f = json.loads((rep / "findings.json").read_text())
    assert f["summary"]["records"] == 42 + 24 and f["scan"]["method"] == "pcap"
    # the two captures are two runs of the same clients seconds apart, each ending with the clients' FINs: the
    # inconsistency ends with each run (one span per capture; a recording would keep the members 120 s after
    # their last heartbeat and merge them into one)
    spans = f["inconsistent_subscriptions"]
    assert len(spans) == 2 and spans[0]["end_ms"] < spans[1]["start_ms"]
    assert all(["127.0.0.1@40004#31676"] in [v["clients"] for v in r["variants"]] for r in spans)
    assert main(["scan", str(DATA / "lo-eth-ipv4.pcap"), "--format", "pcap", "--out", str(rep), "--no-plots",
                 "--port", "1"]) == 4


def test_scan_of_a_generated_fleet_capture_finds_the_injected_anomalies(spark, tmp_path):
    """rmqhb generate's fleet (injected anomalies, manifest) as a capture of the broker's port, the expiring
    clients' connections left open (--keep-open-after 120), the others closed at their last heartbeat: the Spark
    scan gives the recording's findings but for the group sizes the closes move (tests/test_pcap.py's
    check_fleet_capture_findings), and the local scan's exactly. Every connection closed: no expired client."""
    from engine.recording import scan_py, synth
    from engine.recording.recorder import iter_records
    from test_pcap import check_fleet_capture_findings

    rec = tmp_path / "rec"
    manifest = synth.generate(rec, synth.FleetConfig(clients=40, groups=6, days=0.25, seed=3))
    cap = tmp_path / "fleet.pcap"
    tool.main(["from-recording", str(rec), str(cap), "--keep-open-after", "120"])
    f = pcap.scan(spark, [cap])
    local = pcap.scan_local([cap])
    assert _comparable(f) == _comparable(local)
    conn_of = {r.remote_addr: r.conn_id for r in iter_records(rec)}
    f["expired_clients"] = [dict(r, conn_id=conn_of[r["addr"]]) for r in f["expired_clients"]]
    check_fleet_capture_findings(f, scan_py.scan(rec), rec, manifest)
    assert f["member_addresses"] and all(r["addrs"] for r in f["member_addresses"])
    assert all({h for _, h in r["closes"]} == {"fin_by_client"} for r in f["flapping_clients"])
    assert f["summary"]["records"] == manifest["records"]
    closed = tmp_path / "closed.pcap"
    tool.main(["from-recording", str(rec), str(closed)])
    f = pcap.scan(spark, [closed])
    assert _comparable(f) == _comparable(pcap.scan_local([closed])) and f["expired_clients"] == []


def test_scan_of_clients_that_closed_or_unregistered(spark, tmp_path):
    """The closing clients of tests/test_pcap.py on Spark: the same expired clients (B, H) and group-size steps
    (at the unregisters, the FIN, the RST) as the local scan; sharded alike."""
    from test_pcap import check_closing_findings, closing_clients_capture, hole_capture

    cap = tmp_path / "closing.pcap"
    addrs = closing_clients_capture(cap)
    f = pcap.scan(spark, [cap])
    check_closing_findings(f, addrs)
    assert _comparable(f) == _comparable(pcap.scan_local([cap]))
    assert _comparable(pcap.scan(spark, [cap], shards=3)) == _comparable(f)
    # a silence over what the capture missed: expired_over_data_loss, as locally
    hole = tmp_path / "hole.pcap"
    hole_capture(hole)
    f, local = pcap.scan(spark, [hole]), pcap.scan_local([hole])
    assert _comparable(f) == _comparable(local) and f["expired_clients"] == []
    assert f["expired_over_data_loss"] == local["expired_over_data_loss"] and len(f["expired_over_data_loss"]) == 1


def test_scan_of_a_client_unregistered_then_heartbeating_again(spark, tmp_path):
    """A client that unregisters from G and heartbeats G again 20 s later on the same connection (one run of the
    member without the cut): out of G from the unregister to that heartbeat on Spark too (group sizes,
    inconsistent-subscription spans), equal to the local scan; sharded alike."""
    from test_pcap import check_rejoin_findings, rejoining_client_capture

    cap = tmp_path / "rejoin.pcap"
    rejoining_client_capture(cap)
    f = pcap.scan(spark, [cap])
    check_rejoin_findings(f)
    assert _comparable(f) == _comparable(pcap.scan_local([cap]))
    assert _comparable(pcap.scan(spark, [cap], shards=2)) == _comparable(f)


@pytest.mark.parametrize("unregister_s", [65, 85])
def test_scan_of_a_client_unregistered_on_another_connection(spark, tmp_path, unregister_s):
    """The unregister on another connection than the heartbeats' (another shard's when read in two, at 65 s or at
    the millisecond of a heartbeat, 85 s): the sharded scan cuts U's run at it as the unsharded scan and the
    local scan do (the shards' unregisters applied to every shard's runs in a second step)."""
    from test_pcap import (REJOIN_AT_HEARTBEAT_SIZES, REJOIN_AT_HEARTBEAT_SPANS, REJOIN_SIZES, REJOIN_SPANS,
                           UNREGISTER_ELSEWHERE, check_rejoin_findings, rejoining_client_capture, shard_of)

    cap = tmp_path / "rejoin.pcap"
    addrs = rejoining_client_capture(cap, UNREGISTER_ELSEWHERE, unregister_s)
    assert shard_of(addrs["U"], 2) != shard_of(UNREGISTER_ELSEWHERE, 2)
    want = (REJOIN_SIZES, REJOIN_SPANS) if unregister_s == 65 else (REJOIN_AT_HEARTBEAT_SIZES, REJOIN_AT_HEARTBEAT_SPANS)
    local = pcap.scan_local([cap])
    check_rejoin_findings(local, *want)
    for shards in (1, 2, 3):
        f = pcap.scan(spark, [cap], shards=shards)
        check_rejoin_findings(f, *want)
        assert _comparable(f) == _comparable(local), shards


def test_scan_member_addresses_end_at_the_close_or_unregister(spark, tmp_path):
    """member_addresses on Spark use the capture's closes and unregisters as the local scan does: deviating
    members that left a connection (FIN, UNREGISTER_CLIENT) before the span are not listed at it; sharded alike."""
    from test_pcap import check_leaving_deviators, leaving_deviators_capture

    cap = tmp_path / "leaving.pcap"
    addrs = leaving_deviators_capture(cap)
    local = pcap.scan_local([cap])
    for shards in (1, 2):
        f = pcap.scan(spark, [cap], shards=shards)
        check_leaving_deviators(f, addrs)
        assert _comparable(f) == _comparable(local), shards


def test_scan_of_heartbeats_on_a_half_closed_connection(spark, tmp_path):
    """Heartbeats after the broker's FIN on the same connection: the Spark scan's runs end at the FIN (capture_runs,
    merge_runs), so group sizes, spans and member addresses are the local scan's; sharded alike."""
    from test_pcap import check_half_closed_findings, half_closed_capture

    cap = tmp_path / "half.pcap"
    addrs = half_closed_capture(cap)
    local = pcap.scan_local([cap])
    for shards in (1, 2):
        f = pcap.scan(spark, [cap], shards=shards)
        check_half_closed_findings(f, addrs)
        assert _comparable(f) == _comparable(local), shards


def test_sharded_scan_equals_the_unsharded(spark):
    one = pcap.scan(spark, INPUTS)
    three = pcap.scan(spark, INPUTS, shards=3)
    assert _comparable(three) == _comparable(one)
    assert three["capture"]["stats"] == one["capture"]["stats"]
    assert three["capture"]["notifications"] == one["capture"]["notifications"]
    assert three["capture"]["unregisters"] == one["capture"]["unregisters"]
    assert three["scan"]["tasks"] == 3 * len(INPUTS) and three["scan"]["captures"] == len(INPUTS)


def test_rmqhb_scan_several_brokers_captures(spark, tmp_path):
    """`rmqhb scan --broker NAME=PATH ...` over captures: per-broker and fleet findings, as the local reference."""
    from engine.cli import main

    named = {"broker-a": [DATA / "lo-eth-ipv4.pcap"], "broker-b": [DATA / "any-sll2-ipv6.pcap"],
             "broker-c": [DATA / "cpp-lo-ipv4.pcap", DATA / "ons-lo-ipv4.pcap"]}
    rep = tmp_path / "r"
    argv = [a for b, paths in named.items() for p in paths for a in ("--broker", f"{b}={p}")]
    assert main(["scan", *argv, "--out", str(rep), "--no-plots", "--allow-damage"]) == 0
    f = json.loads((rep / "findings.json").read_text())
    ref = pcap.combine_capture_brokers({b: pcap.scan_local(paths, client_ids=True) for b, paths in named.items()})
    for key in ("inconsistent_subscriptions", "flapping_clients", "heartbeat_gaps", "group_sizes", "expired_clients",
                "fleet", "capture", "member_addresses"):
        assert f[key] == json.loads(json.dumps(ref[key])), key
    for key in ("records", "clients", "bad_bodies"):
        assert f["summary"][key] == ref["summary"][key], key
    assert f["summary"]["records"] == 42 + 24 + 6 + 3
    assert f["fleet"]["brokers"] == ["broker-a", "broker-b", "broker-c"] and f["scan"]["method"] == "pcap"
    # the ons capture's two holes (tcpdump missed answer packets) are broker-c's damage
    assert {d["broker"] for d in f["scan"]["corrupt"]} == {"broker-c"} and len(f["scan"]["corrupt"]) == 2
    assert main(["scan", str(DATA / "lo-eth-ipv4.pcap"), "--broker", f"a={DATA / 'ons-lo-ipv4.pcap'}", "--out",
                 str(rep)]) == 2


def test_scan_names_what_the_reader_budgets_left_unread(spark, tmp_path, capsys):
    """Issue 26 §2 on Spark: a packet stamped in 2106, heartbeats over max_record_bytes and a SYN flood over
    max_connections (scaled down) are named as damage the same way as the local scan (capture.limits,
    scan.corrupt), sharded too; `rmqhb scan` writes the report, one DAMAGED INPUT line, exit 3 (a pcapng packet
    stamped in year 33658 made the report crash: exit 1)."""
    from test_pcap_limits import Pcap, SERVER, _clients_capture, _pcapng, client, heartbeat, tcp

    stray = tmp_path / "stray.pcap"
    stray.write_bytes(_clients_capture(stray_sec=0xFFFFFF00))
    p = Pcap()
    p.stream(client(7000), heartbeat("big@1", pad=300_000) * 3 + heartbeat("small@1"))
    for i in range(300):
        p.packet(tcp(*client(i), *SERVER, 100 + i, 0x02))
    flood = tmp_path / "flood.pcap"
    flood.write_bytes(p.bytes())
    opts = dict(max_record_bytes=256 << 10, max_connections=50)
    for shards in (2, 1):  # each shard's reader has the budgets (so a sharded scan evicts less)
        ref = pcap.scan_local([stray, flood], shards=shards, **opts)
        f = pcap.scan(spark, [stray, flood], shards=shards, **opts)
        assert _comparable(f) == _comparable(ref)
        assert f["capture"]["limits"] == ref["capture"]["limits"]
        assert f["scan"]["corrupt"] == ref["scan"]["corrupt"]
    assert {(lim["capture"], lim["kind"]) for lim in ref["capture"]["limits"]} == {
        ("stray.pcap", "bad_time_packets"), ("flood.pcap", "records_too_large"), ("flood.pcap", "connections_evicted")}
    assert ref["expired_clients"] == []

    from engine.cli import main

    hb = heartbeat("n@1")
    far = tmp_path / "far.pcapng"
    far.write_bytes(_pcapng([((1_700_000_000 + k) * 1_000_000, tcp(*client(1), *SERVER, 101 + k * len(hb), 0x18, hb))
                             for k in range(3)] + [(10 ** 18, tcp(*client(2), *SERVER, 1, 0x10))]))
    capsys.readouterr()
    for src in (stray, far):
        rep = tmp_path / f"report-{src.stem}"
        assert main(["scan", str(src), "--out", str(rep), "--no-plots"]) == 3
        err = capsys.readouterr().err
        assert err.count("DAMAGED INPUT") == 1 and "Traceback" not in err
        assert (rep / "index.html").stat().st_size < 2_000_000

"""Synthetic recordings: realistic dialects, exact manifest, and the plain-Python reference scan finds exactly it."""
import collections
import json

import numpy as np
import pytest

import engine
from engine import LanguageCode
from engine.recording import scan_py
from engine.recording.recorder import iter_records, list_segments, verify
from engine.recording.synth import (
    MANIFEST_NAME,
    FleetConfig,
    FleetGenerator,
    compare_with_manifest,
    expected_group_sizes,
    generate,
    generate_main,
    load_manifest,
)

SMALL = FleetConfig(clients=40, groups=8, days=0.2, seed=3)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    manifest = generate(d, SMALL)
    return d, manifest, list(iter_records(d))


def test_recording_is_valid_and_ordered(small):
    d, manifest, records = small
    report = verify(d)
    assert report.ok and not report.torn_tails and report.records == manifest["records"] == len(records)
    t = np.array([r.recv_ms for r in records])
    assert np.all(np.diff(t) >= 0)
    assert manifest["start_ms"] <= t[0] and t[-1] < manifest["end_ms"]
    # ~one heartbeat per client per 30 s
    per_client = manifest["records"] / len(manifest["clients"])
    assert 0.8 * 0.2 * 2880 < per_client < 1.2 * 0.2 * 2880


def test_dialects_decode_and_match_their_captures(small):
    _, manifest, records = small
    langs = collections.Counter(r.language for r in records)
    assert set(langs) == {LanguageCode.JAVA, LanguageCode.CPP}
    kinds = collections.Counter()
    for r in records[::7]:
        hb = engine.decode_heartbeat(r.body)
        assert hb.client_id
        if r.language == LanguageCode.CPP:
            assert r.body.endswith(b"}\n") and b'"consumeType":1' in r.body and r.version == 63
            kinds["cpp"] += 1
        elif r.version == 121:  # ali-ons: its own key order, no expressionType
            assert r.body.startswith(b'{"clientID"') and b'"expressionType"' not in r.body
            assert r.body.index(b'"groupName"') < r.body.index(b'"consumeType"')
            kinds["alions"] += 1
        elif hb.without_sub:
            assert hb.fingerprint != 0 and all(not c.subscriptions for c in hb.consumers)
            kinds["light"] += 1
        else:
            assert engine.encode_heartbeat(hb) == r.body  # Java bodies are exactly what encode_heartbeat writes
            assert any(p.group == "CLIENT_INNER_PRODUCER" for p in hb.producers)
            kinds["java"] += 1
    assert min(kinds.values()) > 0 and len(kinds) == 4, kinds


def test_manifest_subscriptions_are_what_members_send(small):
    _, manifest, records = small
    groups = {g["group"]: g for g in manifest["groups"]}
    seen = {}
    for r in records[:2000]:
        hb = engine.decode_heartbeat(r.body)
        for c in hb.consumers:
            if not hb.without_sub:
                seen.setdefault(c.group, set()).add(scan_py.subscription_key(c.subscriptions))
    assert seen
    for group, keys in seen.items():
        assert json.dumps(groups[group]["subscriptions"], separators=(",", ":")) in keys


def test_manifest_lists_every_injection(small):
    _, m, _ = small
    a = m["anomalies"]
    kinds = collections.Counter(x["kind"] for x in a["inconsistent_subscriptions"])
    assert kinds == {"inconsistent": SMALL.inconsistent, "rolling_update": SMALL.rolling_updates}
    assert len(a["flapping_clients"]) == SMALL.flapping and len(a["heartbeat_gaps"]) == SMALL.gaps
    assert len(a["group_sizes"]) == SMALL.resizing
    for x in a["flapping_clients"]:
        assert x["reconnects"] == len(x["expected_reconnect_ms"]) == SMALL.flap_reconnects
    for x in a["heartbeat_gaps"]:
        assert x["gap_s"] * 1000 >= SMALL.gap_minutes[0] * 60_000
    for r in a["group_sizes"]:
        sizes = [n for _, n in r["schedule"]]
        assert sizes[1] > sizes[0] > sizes[2]  # grew, then shrank below the start
    anomalous = {x["group"] for x in a["inconsistent_subscriptions"]} | {x["group"] for x in a["group_sizes"]}
    assert not anomalous & {x["group"] for x in a["flapping_clients"] + a["heartbeat_gaps"]}


def test_reference_scan_finds_exactly_the_injections(small):
    d, m, _ = small
    f = scan_py.scan(d)
    assert compare_with_manifest(f, m) == []
    assert f["summary"]["records"] == m["records"] and f["summary"]["bad_bodies"] == 0
    assert f["summary"]["clients"] == len(m["clients"])
    rolling = [x for x in f["inconsistent_subscriptions"] if x["duration_s"] < 600]
    assert len(rolling) == SMALL.rolling_updates


def test_min_duration_drops_the_rolling_update(small):
    d, m, _ = small
    f = scan_py.scan(d, min_duration_s=600)
    assert compare_with_manifest(f, m, min_duration_s=600) == []
    assert len(f["inconsistent_subscriptions"]) == SMALL.inconsistent


def test_other_thresholds_change_the_findings(small):
    d, m, _ = small
    f = scan_py.scan(d, gap_threshold_s=24 * 3600, flap_min_reconnects=100)
    assert f["heartbeat_gaps"] == [] and f["flapping_clients"] == []
    f = scan_py.scan(d, gap_threshold_s=31)  # flapping downtime now counts too
    assert len(f["heartbeat_gaps"]) > len(m["anomalies"]["heartbeat_gaps"])


def test_compare_with_manifest_notices_differences(small):
    d, m, _ = small
    f = scan_py.scan(d)
    broken = json.loads(json.dumps(f))
    broken["heartbeat_gaps"].pop()
    broken["flapping_clients"][0]["reconnect_ms"][0] += 1
    broken["inconsistent_subscriptions"][0]["end_ms"] += 1
    broken["group_sizes"][0]["series"][3][1] += 1
    problems = compare_with_manifest(broken, m)
    assert len(problems) == 4, problems


def test_expected_group_sizes_follow_the_schedule(small):
    _, m, _ = small
    series = expected_group_sizes(m)
    for r in m["anomalies"]["group_sizes"]:
        s = series[r["group"]]
        for t, n in r["schedule"]:
            assert [k for ms, k in s if ms <= t][-1] == n


def test_deterministic(tmp_path):
    cfg = FleetConfig(clients=12, groups=3, days=0.05, seed=9, inconsistent=1, rolling_updates=0, flapping=1,
                      gaps=1, resizing=0)
    m1 = generate(tmp_path / "a", cfg)
    m2 = generate(tmp_path / "b", cfg)
    m1.pop("generation_s")
    m2.pop("generation_s")
    assert m1 == m2
    a = [p.read_bytes() for p in list_segments(tmp_path / "a")]
    b = [p.read_bytes() for p in list_segments(tmp_path / "b")]
    assert a == b


def test_segments_roll_hourly_in_record_time(tmp_path):
    m = generate(tmp_path, FleetConfig(clients=5, groups=1, days=0.25, seed=2, inconsistent=0, rolling_updates=0,
                                       flapping=0, gaps=0, resizing=0))
    segs = list_segments(tmp_path)
    assert len(segs) == 6
    assert sum(len(list(iter_records(tmp_path))) for _ in [0]) == m["records"]


def test_tiny_fleet_gets_what_fits(tmp_path):
    m = generate(tmp_path, FleetConfig(clients=2, groups=5, days=0.02, seed=1))
    assert len(m["groups"]) == 2
    assert m["anomalies"]["inconsistent_subscriptions"] == []  # no group has the 3 members an injection needs
    assert compare_with_manifest(scan_py.scan(tmp_path), m) == []


def test_bad_config():
    with pytest.raises(ValueError):
        FleetGenerator(FleetConfig(clients=0))
    with pytest.raises(ValueError):
        FleetGenerator(FleetConfig(days=0))


def test_generate_main(tmp_path, capsys):
    out = tmp_path / "rec"
    assert generate_main([str(out), "--clients", "20", "--groups", "4", "--records", "20000", "--seed", "5"]) == 0
    captured = capsys.readouterr()
    assert "generating [" in captured.err and "100.0%" in captured.err  # the progress bar
    assert "heartbeats from" in captured.out and "injected:" in captured.out
    m = load_manifest(out)
    assert (out / MANIFEST_NAME).exists() and 18_000 < m["records"] < 22_000
    assert generate_main([str(out)]) == 2  # refuses to mix recordings
    assert generate_main([str(tmp_path / "q"), "--clients", "3", "--days", "0.001", "--no-progress"]) == 0
    assert "generating" not in capsys.readouterr().err


def test_expired_clients_are_the_injected_silences(small):
    """The gap clients (silent for minutes, back on a new connection) and the resize leavers (stopped for good)
    are what the broker's channel-expiry scan removes; flapping clients (back within seconds) are not."""
    d, m, _ = small
    a = m["anomalies"]
    exp = a["expired_clients"]
    assert sorted(x["client_id"] for x in exp if x["cause"] == "gap") == sorted(x["client_id"] for x in a["heartbeat_gaps"])
    left = {c for r in a["group_sizes"] for c in r["left"]}
    assert {x["client_id"] for x in exp if x["cause"] == "left"} == left and all(x["returned_ms"] is None for x in exp
                                                                                 if x["cause"] == "left")
    assert not {x["client_id"] for x in exp} & {x["client_id"] for x in a["flapping_clients"]}
    f = scan_py.scan(d)
    assert [(r["client_id"], r["conn_id"], r["addr"], r["last_heartbeat_ms"], r["expired_ms"], r["returned_ms"])
            for r in f["expired_clients"]] == [
        (x["client_id"], x["conn_id"], x["addr"], x["last_heartbeat_ms"], x["expired_ms"], x["returned_ms"]) for x in exp]
    for r in f["expired_clients"]:
        assert r["expired_ms"] - r["last_heartbeat_ms"] == 120_000 and r["groups"]
    broken = json.loads(json.dumps(f))
    broken["expired_clients"].pop(0)
    assert [p.split(":")[0] for p in compare_with_manifest(broken, m)] == ["expired_clients"]
    # a longer expiry: only silences over it
    longer = scan_py.scan(d, expiry_s=3600, gap_threshold_s=120)
    assert all(r["expired_ms"] - r["last_heartbeat_ms"] == 3_600_000 for r in longer["expired_clients"])
    assert len(longer["expired_clients"]) < len(exp)


def test_expired_clients_definition_on_hand_made_records():
    """Concurrent connections, a move to a new connection within the expiry, a silence on the same connection,
    and the end of the recording."""
    def hb(cid):
        return json.dumps({"clientID": cid, "producerDataSet": [{"groupName": "P_" + cid[0]}]}).encode()

    t0 = 1_700_000_000_000
    recs = []
    # a: two connections at once; connection 1 stops, 2 goes on: no silence, no expiry
    recs += [(t0 + i * 30_000, 1, "10.0.0.1:1", "JAVA", 1, hb("a@1")) for i in range(5)]
    recs += [(t0 + i * 30_000 + 5, 2, "10.0.0.1:2", "JAVA", 1, hb("a@1")) for i in range(40)]
    # b: moves to a new connection 60 s after its last heartbeat (no expiry), later silent 200 s on the same one,
    # then stops
    recs += [(t0 + i * 30_000, 3, "10.0.0.2:3", "JAVA", 1, hb("b@2")) for i in range(5)]
    recs += [(t0 + 180_000 + i * 30_000, 4, "10.0.0.2:4", "JAVA", 1, hb("b@2")) for i in range(5)]
    recs += [(t0 + 500_000 + i * 30_000, 4, "10.0.0.2:4", "JAVA", 1, hb("b@2")) for i in range(5)]
    # c: stops 130 s before the recording ends (expired); d: stops 100 s before (not yet)
    end = t0 + 39 * 30_000 + 5
    recs += [(end - 130_000, 5, "10.0.0.3:5", "JAVA", 1, hb("c@3")), (end - 100_000, 6, "10.0.0.4:6", "JAVA", 1, hb("d@4"))]
    recs.sort(key=lambda r: r[0])
    f = scan_py.scan_records(recs)
    assert [(r["client_id"], r["conn_id"], r["addr"], r["connected_ms"], r["last_heartbeat_ms"], r["returned_ms"],
             r["groups"]) for r in f["expired_clients"]] == [
        ("b@2", 4, "10.0.0.2:4", t0 + 180_000, t0 + 300_000, t0 + 500_000, ["P_b"]),
        ("b@2", 4, "10.0.0.2:4", t0 + 180_000, t0 + 620_000, None, ["P_b"]),  # stopped for good
        ("c@3", 5, "10.0.0.3:5", end - 130_000, end - 130_000, None, ["P_c"])]


# --- generated broker logs (rmqhb generate --format broker-log): real addresses, rare rolling restarts -----------


def _log_addresses(root):
    import re

    for path in sorted(root.rglob("broker.log")):
        for m in re.finditer(r"R:/((\d+)\.(\d+)\.(\d+)\.(\d+)):(\d+)\], clientId=([^,]+)", path.read_text()):
            yield m


def test_generated_broker_logs_find_exactly_the_injections_at_scale(tmp_path):
    """The README's example scaled down (2 brokers, --lines sets the fleet's size, 24 h): addresses a TCP
    connection can have (octets <= 255, an ephemeral port, the client id's own host), every client restarting
    once per rolling deploy (never 3 times in the flapping window), and a scan that finds exactly the manifest: one
    flapping client per broker, not every client of the fleet."""
    from engine.bindings import brokerlog as bl
    from engine.cli import main

    out = tmp_path / "fleet-logs"
    assert main(["generate", str(out), "--format", "broker-log", "--brokers", "2", "--lines", "30000"]) == 0
    doc = bl.load_manifest(out)
    assert doc["restarts"] == 2 and all(25_000 < m["lines"] < 35_000 for m in doc["brokers"].values())
    seen = 0
    for m in _log_addresses(out):
        seen += 1
        assert all(0 <= int(m.group(k)) <= 255 for k in (2, 3, 4, 5)) and 32768 <= int(m.group(6)) <= 60999, m[0]
        assert m.group(7).split("@")[0] == m.group(1), m[0]  # the client's own host
    assert seen > 20_000
    f = bl.scan_local([out], log_tz=doc["log_tz"])
    assert bl.compare_with_generated(f, doc) == []
    assert [(r["broker"], r["client_id"]) for r in f["flapping_clients"]] == [
        ("broker-a", "10.9.0.1@flapper"), ("broker-b", "10.9.0.1@flapper")]
    assert [(r["broker"], r["group"]) for r in f["retry_topic_churn"]] == [("broker-a", "CID_G0"), ("broker-b", "CID_G0")]
    # every steady client reconnects once per deploy: its reconnects at least MIN_RESTART_INTERVAL_MS apart
    table, _ = bl.read_local([out], log_tz=doc["log_tz"])
    regs = collections.defaultdict(list)
    for ev in table.select(["broker", "kind", "role", "group", "client_id", "ts_ms"]).to_pylist():
        if ev["kind"] == "register" and ev["role"] == "consumer" and not ev["client_id"].startswith("10.9."):
            regs[(ev["broker"], ev["client_id"])].append(ev["ts_ms"])
    assert len(regs) > 100 and all(len(t) == 3 for t in regs.values())
    assert min(b - a for t in regs.values() for a, b in zip(t, t[1:])) >= bl.MIN_RESTART_INTERVAL_MS


def test_generated_broker_log_restarts_stay_rare(tmp_path, capsys):
    """--restarts more than a log's hours hold (a restart every few minutes would be flapping, not a fleet) is
    capped at max_restarts: a client restarts at most once per MIN_RESTART_INTERVAL_MS."""
    from engine.bindings import brokerlog as bl
    from engine.cli import main

    out = tmp_path / "logs"
    assert main(["generate", str(out), "--format", "broker-log", "--groups", "3", "--members", "4", "--restarts",
                 "300", "--hours", "3"]) == 0
    doc = bl.load_manifest(out)
    cap = bl.max_restarts(3 * 3600, 4)
    assert doc["restarts"] == cap == (3 * 3600_000 - 120_000 - bl.ROLLING_SPREAD_MS - 4 * bl.ROLLING_GAP_MS) // \
        bl.MIN_RESTART_INTERVAL_MS - 1 and f"{cap} rolling restarts" in capsys.readouterr().out
    f = bl.scan_local([out], log_tz=doc["log_tz"])
    assert bl.compare_with_generated(f, doc) == []
    assert [r["client_id"] for r in f["flapping_clients"]] == ["10.9.0.1@flapper"]
    assert bl.max_restarts(600, 20) == 0 and bl.groups_for_lines(1_000_000, 20, 2) > 1000


@pytest.mark.parametrize("groups,members,restarts", [(1, 1, 3), (1, 3, 2), (2, 1, 0), (3, 2, 5)])
def test_generated_broker_log_of_a_small_fleet_is_found_exactly(tmp_path, groups, members, restarts):
    """Every injection lands in a group of the fleet however small (one group: the frozen and the BROADCASTING
    member share group 0, so the frozen one is among the majority), and the scan finds exactly the manifest."""
    from engine.bindings import brokerlog as bl

    m = bl.generate_broker_log(tmp_path / "b" / "broker.log", groups=groups, members=members, restarts=restarts,
                               seed=1)
    f = bl.scan_local([tmp_path / "b"], log_tz="+08:00")
    assert bl.compare_with_manifest(f, m) == [] and m["retry_churn"] and m["inconsistent"]

"""The Spark scan: exactly the injected anomalies on the mapInArrow and pandas-UDF paths, and the same findings as
the plain-Python reference scan. One SparkSession (local[2]) for the whole module."""
import json
from xml.etree import ElementTree

import pytest

from conftest import require_module  # noqa: E402

require_module("pyspark")
require_module("pyarrow")

from engine.recording import scan_py  # noqa: E402
from engine.recording.recorder import HeartbeatRecorder, list_segments  # noqa: E402
from engine.recording.scan_py import FINDING_KEYS, ScanParams  # noqa: E402
from engine.recording.synth import FleetConfig, compare_with_manifest, generate  # noqa: E402

pytestmark = pytest.mark.spark

BAD_BODIES = [b"{not json", b'{"producerDataSet":[]}', b'{"clientID":"x","consumerDataSet":{}}']


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A small fleet with every kind of injection, plus undecodable bodies and a torn tail."""
    d = tmp_path_factory.mktemp("fleet")
    manifest = generate(d, FleetConfig(clients=40, groups=8, days=0.2, seed=3), block_records=1024)
    with HeartbeatRecorder(d, prefix="zz") as rec:
        for i, body in enumerate(BAD_BODIES):
            rec.record(manifest["start_ms"] + 90_000 + i, 90_000 + i, "10.9.9.9:1", "JAVA", 1, body)
    with open(list_segments(d)[-1], "ab") as f:
        f.write(b"HBK1 torn by a crash")
    reference = scan_py.scan(d)
    assert compare_with_manifest(reference, manifest) == []
    return d, manifest, reference


def assert_same_findings(got, want):
    for key in FINDING_KEYS:
        assert got[key] == want[key], key
    for key in ("records", "bad_bodies", "clients", "first_ms", "last_ms"):
        assert got["summary"][key] == want["summary"][key], key


@pytest.mark.parametrize("method", ["arrow", "pandas"])
def test_scan_finds_exactly_the_injections(spark, recording, method):
    from engine.bindings.spark import scan

    d, manifest, reference = recording
    findings = scan(spark, d, method=method, split_records=5000)
    assert compare_with_manifest(findings, manifest) == []
    assert_same_findings(findings, reference)
    # each flapping client's timeline marks: a connect per connection (its first one and every injected
    # reconnect), a close bound (the left connection's last heartbeat) before each following connect
    for r in findings["flapping_clients"]:
        assert set(r["reconnect_ms"]) <= set(r["connect_ms"]) and len(r["connect_ms"]) == len(r["reconnect_ms"]) + 1
        assert len(r["closes"]) == len(r["reconnect_ms"]) and {h for _, h in r["closes"]} == {"last_heartbeat"}
        assert all(a <= c < b for (c, _), a, b in zip(r["closes"], r["connect_ms"], r["connect_ms"][1:]))
    assert findings["summary"]["bad_bodies"] == len(BAD_BODIES)
    assert findings["summary"]["records"] == manifest["records"] + len(BAD_BODIES)
    assert len(findings["scan"]["torn_tails"]) == 1 and findings["scan"]["splits"] > findings["scan"]["segments"]


def test_nested_heartbeats_path(spark, recording):
    from engine.bindings.spark import scan

    d, _, reference = recording
    assert_same_findings(scan(spark, d, method="heartbeats"), reference)


def test_min_duration_and_thresholds_as_transforms(spark, recording):
    from engine.bindings.spark import heartbeat_gaps, inconsistent_subscriptions, merge_runs, read_runs

    d, manifest, _ = recording
    long_only = ScanParams(min_duration_s=600)
    runs = read_runs(spark, d, long_only).transform(merge_runs(long_only)).persist()
    spans = runs.transform(inconsistent_subscriptions(long_only)).select("group", "start_ms", "end_ms").collect()
    want = scan_py.scan(d, long_only)["inconsistent_subscriptions"]
    assert sorted((r["group"], r["start_ms"], r["end_ms"]) for r in spans) == [
        (x["group"], x["start_ms"], x["end_ms"]) for x in want]
    kinds = {x["group"]: x["kind"] for x in manifest["anomalies"]["inconsistent_subscriptions"]}
    assert {kinds[r["group"]] for r in spans} == {"inconsistent"}
    runs.unpersist()
    # a 31 s gap threshold also sees heartbeats lost while flapping; runs must be cut at that threshold too
    tight = ScanParams(gap_threshold_s=31)
    gaps = read_runs(spark, d, tight).transform(merge_runs(tight)).transform(heartbeat_gaps(tight)).collect()
    want = scan_py.scan(d, tight)["heartbeat_gaps"]
    assert len(want) > len(manifest["anomalies"]["heartbeat_gaps"])
    assert sorted((r["client_id"], r["start_ms"], r["end_ms"], list(r["groups"])) for r in gaps) == [
        (x["client_id"], x["start_ms"], x["end_ms"], x["groups"]) for x in want]


def test_data_source_and_readers(spark, recording):
    from engine.bindings import segments as seg
    from engine.bindings.spark import read_heartbeats, read_records

    d, manifest, _ = recording
    total = manifest["records"] + len(BAD_BODIES)
    df = spark.read.format("rmqhb").option("splitRecords", 4000).load(str(d))
    assert df.columns == ["recv_ms", "conn_id", "remote_addr", "language", "version", "body"]
    assert df.rdd.getNumPartitions() == len(seg.plan_splits(d, 4000).splits)
    assert df.count() == total
    assert read_records(spark, d, via="arrow").count() == total
    decoded = spark.read.format("rmqhb").option("decode", "true").load(str(d))
    assert decoded.where("error is not null").count() == 2  # and one body decodes but has no clientID
    assert decoded.where("error is null and client_id is null").count() == 1
    hb = read_heartbeats(spark, d)
    row = hb.where("without_sub").first()
    assert row["client_id"] and row["consumers"][0]["subscriptions"] == [] and row["fingerprint"] != 0
    langs = {r["language"] for r in hb.select("language").distinct().collect()}
    assert langs == {"JAVA", "CPP"}
    # the pandas-UDF decoder, flat (what the scan uses) and nested (same rows as the mapInArrow reader)
    from engine.bindings.spark import decode_pandas

    records = read_records(spark, d, via="arrow").where("conn_id < 8")
    full = records.transform(decode_pandas(full=True)).drop("recv_ms", "remote_addr", "language", "version")
    nested = hb.where("conn_id < 8").drop("recv_ms", "remote_addr", "language", "version")
    assert sorted(map(str, full.collect())) == sorted(map(str, nested.collect()))
    flat = records.transform(decode_pandas()).where("size(consumer_groups) > 0").first()
    assert len(flat["consumer_groups"]) == len(flat["consumer_sub_keys"])


def test_scan_main_writes_the_report(spark, recording, tmp_path, capsys):
    from engine.bindings.spark import scan_main

    d, manifest, reference = recording
    out = tmp_path / "report"
    # the recording ends in a torn tail: the scan completes over damaged data (exit 3, one stderr line)
    assert scan_main([str(d), "--out", str(out), "--master", "local[2]", "--split-records", "8000"]) == 3
    assert spark.range(1).count() == 1  # the test session is still alive
    captured = capsys.readouterr()
    printed = captured.out
    assert [ln for ln in captured.err.splitlines() if "DAMAGED INPUT" in ln][0].count("1 torn tails") == 1
    assert "heartbeats from 44 clients" in printed and "flapping:" in printed and str(out / "index.html") in printed
    findings = json.loads((out / "findings.json").read_text())
    assert compare_with_manifest(findings, manifest) == []
    for key in FINDING_KEYS:
        assert findings[key] == json.loads(json.dumps(reference[key]))
    # the report's addresses of the deviating members: the same connections as the reference scan's
    assert findings["member_addresses"] and findings["member_addresses"] == reference["member_addresses"]
    for name in ("inconsistent_subscriptions.csv", "flapping_clients.csv", "flapping_timeline.csv",
                 "heartbeat_gaps.csv", "group_sizes.csv"):
        assert (out / name).stat().st_size > 0
    assert len((out / "heartbeat_gaps.csv").read_text().splitlines()) == 1 + len(manifest["anomalies"]["heartbeat_gaps"])
    for name in ("group_sizes.svg", "gap_histogram.svg", "flapping_timeline.svg"):
        assert ElementTree.parse(out / name).getroot().tag == "{http://www.w3.org/2000/svg}svg"
        assert f"src='{name}'" in (out / "index.html").read_text()
    assert scan_main([str(d / "missing"), "--out", str(out)]) == 2
    assert scan_main([str(d), "--out", str(out), "--expiry", "0"]) == 2


def test_expired_clients_over_concurrent_connections(spark, tmp_path):
    """The Spark definition (from merged runs) equals the reference's on overlapping connections, a move to a
    new connection, a silence on the same connection, ties and the end of the recording; addresses included."""
    from engine.bindings.spark import scan

    def hb(cid):
        return json.dumps({"clientID": cid, "producerDataSet": [{"groupName": "P_" + cid[0]}]}).encode()

    t0 = 1_700_000_000_000
    recs = [(t0 + i * 30_000, 1, "10.0.0.1:1", hb("a@1")) for i in range(5)]
    recs += [(t0 + i * 30_000 + 5, 2, "10.0.0.1:2", hb("a@1")) for i in range(40)]
    recs += [(t0 + i * 30_000, 3, "10.0.0.2:3", hb("b@2")) for i in range(5)]
    recs += [(t0 + 180_000 + i * 30_000, 4, "10.0.0.2:4", hb("b@2")) for i in range(5)]
    recs += [(t0 + 500_000 + i * 30_000, 4, "10.0.0.2:4", hb("b@2")) for i in range(5)]
    recs += [(t0 + 900_000, 7, "10.0.0.5:7", hb("e@5")), (t0 + 900_000, 8, "10.0.0.5:8", hb("e@5"))]  # a tie
    end = t0 + 39 * 30_000 + 5
    recs += [(end - 130_000, 5, "10.0.0.3:5", hb("c@3")), (end - 100_000, 6, "10.0.0.4:6", hb("d@4"))]
    recs.sort(key=lambda r: r[0])
    with HeartbeatRecorder(tmp_path, block_records=7) as rec:
        for t, conn, addr, body in recs:
            rec.record(t, conn, addr, "JAVA", 409, body)
    want = scan_py.scan(tmp_path)["expired_clients"]
    assert [(r["client_id"], r["conn_id"]) for r in want] == [("b@2", 4), ("b@2", 4), ("e@5", 8), ("c@3", 5)]
    assert scan(spark, tmp_path, split_records=10)["expired_clients"] == want
    # the flapping rows' connection marks (every client flagged): the same from merged runs as the reference's,
    # concurrent connections (a@1: connection 1 left for 2, which it still uses) and a tie (e@5) included
    every = ScanParams(flap_min_reconnects=1)
    ref = scan_py.scan(tmp_path, every)["flapping_clients"]
    marks = {r["client_id"]: (r["connect_ms"], r["closes"]) for r in ref}
    assert marks["a@1"] == ([t0, t0 + 5], [[t0 + 4 * 30_000, "last_heartbeat"]])
    assert marks["b@2"] == ([t0, t0 + 180_000], [[t0 + 4 * 30_000, "last_heartbeat"]])
    assert marks["e@5"] == ([t0 + 900_000, t0 + 900_000], [])
    assert scan(spark, tmp_path, every, split_records=10)["flapping_clients"] == ref


def test_several_brokers_recordings_in_one_scan(spark, tmp_path):
    """`rmqhb scan DIR_A DIR_B`: the same fleet recorded by two brokers gives each broker's findings (exactly the
    injections on each), the fleet's totals and the clients found on both; the clients are counted once."""
    from engine.cli import main

    cfg = FleetConfig(clients=24, groups=6, days=0.1, seed=8)
    ma = generate(tmp_path / "broker-a", cfg)
    generate(tmp_path / "broker-b", cfg)
    out = tmp_path / "report"
    assert main(["scan", str(tmp_path / "broker-a"), str(tmp_path / "broker-b"), "--out", str(out), "--no-plots"]) == 0
    f = json.loads((out / "findings.json").read_text())
    for b in ("broker-a", "broker-b"):
        mine = {k: [r for r in f[k] if r["broker"] == b] for k in FINDING_KEYS}
        assert compare_with_manifest(mine, ma) == []
    fleet = f["fleet"]
    assert fleet["brokers"] == ["broker-a", "broker-b"] and fleet["per_broker"]["broker-a"] == fleet["per_broker"]["broker-b"]
    assert f["summary"]["clients"] == len(ma["clients"]) and f["summary"]["records"] == 2 * ma["records"]
    both = {(r["finding"], r["client_id"]) for r in fleet["clients_on_several_brokers"]}
    assert both == {("flapping_clients", x["client_id"]) for x in ma["anomalies"]["flapping_clients"]} | {
        ("expired_clients", x["client_id"]) for x in ma["anomalies"]["expired_clients"]}
    assert fleet["groups_on_several_brokers"] and not any(g["uneven"] for g in fleet["groups_on_several_brokers"])
    page = (out / "index.html").read_text()
    assert "<h2>Per broker</h2>" in page and "fleet (all brokers)" in page


def test_analysis_conf_is_restored_after_the_analyses(spark):
    """The analyses' Spark settings (shuffle partitions, no adaptive re-planning: one helper for the recording and
    the capture scan) hold inside the block only: the caller's values come back after it, an unset key unset
    again, an error included."""
    from engine.bindings.analyses import analysis_conf

    keys = ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled")
    before = {k: spark.conf.get(k, None) for k in keys}  # the session's, put back at the end
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "7")
        spark.conf.unset("spark.sql.adaptive.enabled")
        default = spark.conf.get("spark.sql.adaptive.enabled")
        with pytest.raises(RuntimeError):
            with analysis_conf(spark, 3):
                assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
                assert spark.conf.get("spark.sql.adaptive.enabled") == "false"
                raise RuntimeError("an analysis failed")
        assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
        assert spark.conf.get("spark.sql.adaptive.enabled", None) is None
        assert spark.conf.get("spark.sql.adaptive.enabled") == default
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)

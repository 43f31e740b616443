"""Broker logs on Spark: read_broker_logs gives the local reader's events, the scan gives the local analyses'
findings (two brokers, rolled files), and `rmqhb scan --input broker-log` writes the report. One SparkSession."""
import gzip
import json
import os
from pathlib import Path

import pytest

from conftest import require_module  # noqa: E402

require_module("pyspark")
require_module("pyarrow")

from engine.bindings import brokerlog as bl  # noqa: E402

pytestmark = pytest.mark.spark

SAMPLE = Path(os.environ.get("ENGINE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared")) / "samples" / \
    "rocketmq-4.9.8-broker.log"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("logs")
    ma = bl.generate_broker_log(d / "broker-a" / "broker.log", groups=3, members=4, restarts=2, seed=11)
    lines = (d / "broker-a" / "broker.log").read_bytes().splitlines(keepends=True)
    (d / "broker-a" / "broker.log.1").write_bytes(b"".join(lines[: len(lines) // 2]))
    (d / "broker-a" / "broker.log").write_bytes(b"".join(lines[len(lines) // 2:]))
    mb = bl.generate_broker_log(d / "b-logs" / "broker.log", groups=2, members=3, seed=12)
    return d, ma, mb


def _drop_timing(f):
    f = dict(f)
    f.pop("scan", None)
    return f


def test_reader_matches_local_reader(spark, fleet):
    d, _, _ = fleet
    df = bl.read_broker_logs(spark, [d / "broker-a"], log_tz="+08:00")
    got = sorted(df.toArrow().to_pylist(), key=lambda r: (r["broker"], r["seq"]))
    want, _ = bl.read_local([d / "broker-a"], log_tz="+08:00")
    assert got == sorted(want.to_pylist(), key=lambda r: (r["broker"], r["seq"]))
    assert {r["broker"] for r in got} == {"broker-a"}


def test_reader_emits_only_the_columns_asked_for(spark, fleet):
    """columns=: the tasks emit those columns only (the frame's schema is theirs, in their order), with the local
    reader's values; the scan's own columns (SCAN_COLUMNS) included; an unknown name fails before Spark runs."""
    d, _, _ = fleet
    want, _ = bl.read_local([d / "broker-a"], log_tz="+08:00")
    for cols in (list(bl.SCAN_COLUMNS), ["group", "seq", "version"]):
        df = bl.read_broker_logs(spark, [d / "broker-a"], log_tz="+08:00", columns=cols)
        assert df.columns == cols
        assert [f.dataType.simpleString() for f in df.schema.fields] == [
            {"string": "string", "int64": "bigint", "int32": "int"}[str(want.schema.field(c).type)] for c in cols]
        got = sorted(df.toArrow().to_pylist(), key=lambda r: r["seq"])
        assert got == sorted(want.select(cols).to_pylist(), key=lambda r: r["seq"])
    with pytest.raises(bl.EventColumnsError):
        bl.read_broker_logs(spark, [d / "broker-a"], log_tz="+08:00", columns=["kind", "language_code"])


def test_scan_matches_local_analyses_per_broker(spark, fleet):
    d, ma, mb = fleet
    brokers = {"broker-b": str(d / "b-logs")}
    f = bl.scan(spark, [d / "broker-a"], log_tz="+08:00", brokers=brokers)
    ref = bl.scan_local([d / "broker-a"], log_tz="+08:00", brokers=brokers)
    assert _drop_timing(f) == _drop_timing(ref)
    import engine

    # the executors use the compiled parser, unless ENGINE_NO_EXTENSIONS=1 forces the twins (the CI twin run)
    assert f["scan"]["parser"] == ("native" if engine.native_modules()["_brokerlog"] else "twin")
    flapping = sorted((r["broker"], r["client_id"]) for r in f["flapping_clients"])
    assert flapping == [("broker-a", "10.9.0.1@flapper"), ("broker-b", "10.9.0.1@flapper")]
    # (the whole findings are equal: the flapping rows' connect and close marks and the deviating members'
    # addresses too) -- and they are the injected ones, the addresses those of the odd member's register lines
    for r in f["flapping_clients"]:
        m = (ma if r["broker"] == "broker-a" else mb)["flapping"][0]
        assert (r["connect_ms"], r["closes"]) == (m["connect_ms"], m["closes"]) and len(r["closes"]) == 4
    assert {(r["broker"], r["client_id"]) for r in f["member_addresses"]} == {
        ("broker-a", "10.9.0.3@odd"), ("broker-a", "10.9.0.4@broadcast"), ("broker-b", "10.9.0.4@broadcast")}
    # (broker-b's two groups leave no room for the odd member's disagreement; the BROADCASTING one is in group 0)
    assert [r["group"] for r in mb["inconsistent"]] == ["CID_G0"]
    assert [(r["broker"], r["group"], r["adds"], r["removes"]) for r in f["retry_topic_churn"]] == [
        ("broker-a", "CID_G0", 4, 4), ("broker-b", "CID_G0", 4, 4)]
    assert all(r["addrs"] for r in f["member_addresses"])
    assert sorted((r["broker"], r["addr"], r["expired_ms"]) for r in f["expired_clients"]) == [
        ("broker-a", ma["expired"][0]["addr"], ma["expired"][0]["expired_ms"]),
        ("broker-b", mb["expired"][0]["addr"], mb["expired"][0]["expired_ms"])]
    assert f["log"]["unparseable"] == 4  # two injected damaged lines per broker


def test_scan_command_writes_the_report(spark, tmp_path):
    from engine.cli import main

    out = tmp_path / "report"
    assert main(["scan", str(SAMPLE), "--out", str(out), "--log-tz", "Asia/Shanghai", "--no-plots"]) == 0
    f = json.loads((out / "findings.json").read_text())
    assert [r["client_id"] for r in f["expired_clients"]] == ["127.0.0.1@JavaDriver-23274-3877417792690"]
    assert f["log"]["log_tz"] == "Asia/Shanghai" and f["log"]["zone_check"]["agrees"] is True
    page = (out / "index.html").read_text()
    assert "Log time zone used: <b>Asia/Shanghai</b>" in page and "127.0.0.1@JavaDriver-23274-3877417792690" in page
    assert "<h2>Expired clients</h2>" in page and "<h2>What this input cannot show</h2>" in page


def test_scan_command_over_generated_logs_finds_exactly_the_injections(spark, tmp_path):
    from engine.cli import main

    logs = tmp_path / "fleet"
    assert main(["generate", str(logs), "--format", "broker-log", "--brokers", "2", "--groups", "4", "--members",
                 "5", "--lines", "4000", "--hours", "4", "--seed", "21"]) == 0
    doc = bl.load_manifest(logs)
    out = tmp_path / "report"
    assert main(["scan", str(logs), "--out", str(out), "--log-tz", doc["log_tz"], "--no-plots"]) == 0
    f = json.loads((out / "findings.json").read_text())
    assert bl.compare_with_generated(f, doc) == []
    assert f["log"]["brokers"] == ["broker-a", "broker-b"] and f["scan"]["method"] == "broker-log"
    # fleet-wide: per-broker counts, and the injected clients (same names on both brokers) found on both
    fleet = f["fleet"]
    assert fleet["brokers"] == ["broker-a", "broker-b"]
    assert all(fleet["per_broker"][b]["expired_clients"] == 1 for b in fleet["brokers"])
    assert {(r["finding"], r["client_id"]) for r in fleet["clients_on_several_brokers"]} == {
        ("flapping_clients", "10.9.0.1@flapper"), ("expired_clients", "10.9.0.2@frozen")}


def test_scan_names_bad_inputs_and_keeps_the_good_brokers_findings(spark, tmp_path, capsys):
    """Issue 26 section 2 on Spark: a .log.gz with no line end (the issue's 256 MB, scaled with --max-line-bytes),
    a .gz that is no gzip and an event stamped in 2106 beside a good broker's log: the scan completes (exit 3,
    one DAMAGED INPUT line), the good broker's findings are those of a scan of it alone, and every bad input is
    named in findings.json as the local scan names it, without its bytes."""
    from engine.cli import main

    good, bad = tmp_path / "broker-good", tmp_path / "broker-bad"
    bl.generate_broker_log(good / "broker.log", groups=2, members=3, seed=4, tz_offset_min=0)
    bad.mkdir()
    with gzip.open(bad / "broker.log.gz", "wb", compresslevel=1) as f:
        for _ in range(32):
            f.write(b"x" * 65536)
    (bad / "broker.2.log.gz").write_bytes(b"NOTGZIP root:x:0:0:root:/root:/bin/bash\n")
    cci = ("ClientChannelInfo [channel=[id: 0x1, L:/10.0.0.1:10911 - R:/10.0.0.7:5555], clientId=10.0.0.7@c, "
           "language=JAVA, version=409, lastUpdateTimestamp=1795400000000]")
    (bad / "broker.1.log").write_text(f"2106-02-07 06:28:16 INFO t - new producer connected, group: PG channel: {cci}\n"
                                      f"2026-11-20 10:00:00 INFO t - new producer connected, group: PG channel: {cci}\n")
    out = tmp_path / "report"
    rc = main(["scan", str(good), str(bad), "--out", str(out), "--log-tz", "UTC", "--no-plots",
               "--max-line-bytes", "65536"])
    err = capsys.readouterr().err
    assert rc == 3
    (line,) = [ln for ln in err.splitlines() if "DAMAGED INPUT" in ln]
    assert line.startswith("rmqhb scan: DAMAGED INPUT: 3 corrupt ranges")
    f = json.loads((out / "findings.json").read_text())
    ref = json.loads(json.dumps(bl.scan_local([good, bad], log_tz="UTC", max_line_bytes=65536)))
    assert f["scan"]["corrupt"] == ref["scan"]["corrupt"]
    assert [(Path(d["segment"]).name, d["kind"]) for d in f["scan"]["corrupt"]] == [
        ("broker.1.log", "bad_timestamp"), ("broker.2.log.gz", "unreadable"), ("broker.log.gz", "overlong_line")]
    assert _drop_timing(f) == _drop_timing(ref)
    alone = json.loads(json.dumps(bl.scan_local([good], log_tz="UTC")))
    for k in ("flapping_clients", "expired_clients", "inconsistent_subscriptions", "group_sizes"):
        assert [r for r in f[k] if r["broker"] == "broker-good"] == alone[k], k
    assert f["log"]["unparseable_by_kind"]["overlong_line"] == 1 and f["log"]["counts"]["bad_timestamp"] == 1
    page = (out / "index.html").read_text()
    assert "DAMAGED INPUT" in page and "line(s) longer than 65,536 bytes skipped" in page
    for p in out.iterdir():
        assert "NOTGZIP" not in p.read_text(errors="replace") and "root:x" not in p.read_text(errors="replace")

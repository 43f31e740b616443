"""Broker logs on Spark: read_broker_logs gives the local reader's events, the scan gives the local analyses'
findings (two brokers, rolled files), and `rmqhb scan --input broker-log` writes the report. One SparkSession."""
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
    assert {(r["broker"], r["client_id"]) for r in f["member_addresses"]} == {("broker-a", "10.9.0.3@odd")}
    assert not mb["inconsistent"]  # (broker-b's two groups leave no room for the odd member's disagreement)
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

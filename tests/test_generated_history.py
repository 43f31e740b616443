"""Generated broker logs with a broker's history (issue 28's 'done when'): `generate_broker_log(history=True)` /
`rmqhb generate --format broker-log --history` write a log that starts at the broker's boot, a client closed by the
idle handler, a client killed, a member whose register lines the broker dropped, a Java stack trace and a broker
restart; the scan finds exactly what the manifest injects, with either parser, in this process and on Spark, and the
report says it in its words."""
import importlib
import json

import pytest

from conftest import strict
from engine.bindings import brokerlog as bl
from engine.bindings import report

try:
    native = importlib.import_module("engine.recording._brokerlog")
except ImportError:  # pragma: no cover - not built
    native = None
if native is None and strict():
    raise RuntimeError("engine.recording._brokerlog is not built (required under CI=true / ENGINE_REQUIRE_NATIVE=1)")


def _generate(d, **kw):
    return bl.generate_broker_log(d / "broker-a" / "broker.log", history=True, seed=4, **kw)


@pytest.mark.parametrize("native_parser", [False] + ([True] if native is not None else []),
                         ids=lambda n: "native" if n else "twin")
@pytest.mark.parametrize("fleet", [dict(groups=4, members=5, restarts=3), dict(groups=1, members=1),
                                   dict(groups=3, members=2, inject=False)], ids=["4x5", "1x1", "clean"])
def test_generated_history_is_found_exactly(tmp_path, native_parser, fleet):
    m = _generate(tmp_path, **fleet)
    f = bl.scan_local([tmp_path / "broker-a"], log_tz="+08:00", native=native_parser)
    assert bl.compare_with_manifest(f, m) == []
    # what the manifest holds is the history itself (a comparison of two empty lists would prove nothing)
    assert [b["stopped_ms"] is not None for b in f["broker_boots"]] == [False, True]
    assert f["broker_boots"][1]["clients_ended"] == fleet["groups"] * fleet["members"] + 2 * fleet.get("inject", True)
    assert [r["client_id"] for r in f["vanished_clients"]] == ["10.9.0.6@killed"]
    assert ("10.9.0.5@idle", "idle_closed") in [(r["client_id"], r["cause"]) for r in f["expired_clients"]]
    assert f["log"]["unattributed_reasons"] == {"never_registered": 3} and f["log"]["starts_at_boot"] == {
        "broker-a": True}
    assert f["log"]["counts"]["continuation"] >= 2 and "continuation" not in f["log"]["unparseable_by_kind"]
    # no member is live while the broker is down, and every live client is back after its start
    boot = f["broker_boots"][1]
    for g in f["group_sizes"]:
        assert _size_at(g, boot["stopped_ms"]) == 0 and all(
            n == 0 for t, n in g["series"] if boot["stopped_ms"] <= t < boot["start_ms"]), g["group"]
    (inner,) = [g for g in f["group_sizes"] if g["group"] == bl.CLIENT_INNER_PRODUCER]
    assert _size_at(inner, boot["stopped_ms"] - 1) == _size_at(inner, f["log"]["last_ms"]) == boot["clients_ended"]


def _size_at(g, t):
    n = 0
    for ms, k in g["series"]:
        if ms <= t:
            n = k
    return n


def test_a_difference_is_noticed(tmp_path):
    m = _generate(tmp_path, groups=2, members=2)
    f = bl.scan_local([tmp_path / "broker-a"], log_tz="+08:00")
    for key, change in (("vanished", lambda x: x.pop()), ("boots", lambda x: x.pop()),
                        ("causes", lambda x: x.clear())):
        wrong = json.loads(json.dumps(m))
        change(wrong[key])
        assert bl.compare_with_manifest(f, wrong), key
    # and a log without the history must not show one
    plain = bl.generate_broker_log(tmp_path / "plain" / "broker.log", groups=2, members=2, seed=4)
    assert any(p.startswith("vanished_clients") for p in bl.compare_with_manifest(f, {**plain, "counts": m["counts"]}))


def test_the_report_tells_the_generated_history(tmp_path):
    _generate(tmp_path, groups=2, members=3)
    f = bl.scan_local([tmp_path / "broker-a"], log_tz="+08:00")
    report.write_report(f, tmp_path / "r", plots=False)
    html = (tmp_path / "r" / "index.html").read_text()
    for words in ("closed idle by the broker", "removed by the broker's SCAN", "Vanished clients", "10.9.0.6@killed",
                  "Broker restarts", "3 for members whose register line the broker never wrote"):
        assert words in html, words
    assert "older log files missing?" not in html
    restarts = (tmp_path / "r" / "broker_restarts.csv").read_text().splitlines()
    assert len(restarts) == 3  # the header, the first boot, the restart
    assert "10.9.0.6@killed" in (tmp_path / "r" / "vanished_clients.csv").read_text()


def test_rmqhb_generate_history_of_two_brokers(tmp_path):
    from engine.cli import main

    out = tmp_path / "fleet-logs"
    assert main(["generate", str(out), "--format", "broker-log", "--history", "--brokers", "2", "--lines",
                 "3000", "--hours", "2"]) == 0
    doc = bl.load_manifest(out)
    f = bl.scan_local([out], log_tz=doc["log_tz"])
    assert bl.compare_with_generated(f, doc) == []
    assert [(b["broker"], b["name"]) for b in f["broker_boots"]] == [("broker-a", "broker-a")] * 2 + [
        ("broker-b", "broker-b")] * 2
    assert f["log"]["unattributed_reasons"] == {"never_registered": 6}


@pytest.mark.spark
@pytest.mark.slow
def test_spark_finds_the_generated_history_as_the_local_scan(spark, tmp_path):
    m = _generate(tmp_path, groups=4, members=5, restarts=3)
    mb = bl.generate_broker_log(tmp_path / "broker-b" / "broker.log", groups=2, members=3, history=True, seed=5,
                                broker_name="broker-b")
    dirs = [tmp_path / "broker-a", tmp_path / "broker-b"]
    ref = bl.scan_local(dirs, log_tz="+08:00")
    got = bl.scan(spark, dirs, log_tz="+08:00")
    got.pop("scan"), ref.pop("scan")
    assert got == ref
    assert bl.compare_with_manifest(got, m, "broker-a") == [] and bl.compare_with_manifest(got, mb, "broker-b") == []
    assert got["log"]["never_registered_by_broker"] == {"broker-a": 3, "broker-b": 3}

"""Issue 26 §2: the connections a capture task tracks are bounded (``--max-capture-connections``,
pcap.MAX_CAPTURE_CONNECTIONS). The reader keeps at most ``max_connections`` at once, but a long capture has
unboundedly many connections over time, and the scan kept every one's address and time span in the task, in the
summary row it sends (CAPTURE_ROLE JSON) and on the driver. Past the budget the heartbeats of further connections are
not read: counted (heartbeats_untracked) and named as damage with their time range (scan.corrupt, the DAMAGED INPUT
line), the same on the in-process and the Spark scan; at or below it the findings are the unbounded ones. Scaled down:
400 short connections, a budget of 100."""
import json

import numpy as np
import pytest

from conftest import require_native

from engine.bindings import pcap
from engine.recording.scan_py import ScanParams

require_native("engine.recording._pcap")

from test_pcap_limits import Pcap, client, heartbeat  # noqa: E402

N, BUDGET = 400, 100
ENGINES = pytest.mark.parametrize("native", [None, False], ids=["native", "twin"])


def _many_connections() -> bytes:
    """N short connections (SYN, two heartbeats, FIN both ways), one every 3 s, of 7 clients: each client
    reconnects every 21 s (flapping), so the findings are not empty."""
    p = Pcap()
    for i in range(N):
        p.us += 3_000_000
        p.stream(client(i), heartbeat(f"c{i % 7}@1") * 2, isn=100 + i)
    return p.bytes()


@pytest.fixture
def capture(tmp_path):
    path = tmp_path / "many.pcap"
    path.write_bytes(_many_connections())
    return path


@ENGINES
def test_heartbeats_of_connections_past_the_budget_are_named_not_read(capture, native):
    (cap,) = pcap.plan_captures([capture])
    *recs, res = pcap.iter_capture(cap, native=native, max_capture_connections=BUDGET, batch_records=16)
    conn = np.concatenate([r["conn_id"] for r in recs])
    recv = np.concatenate([r["recv_ms"] for r in recs])
    assert len(set(conn.tolist())) == BUDGET and len(conn) == 2 * BUDGET
    assert res.stats["heartbeats"] == 2 * N and res.stats["heartbeats_untracked"] == 2 * (N - BUDGET)
    first, last = res.damage_times["heartbeats_untracked"]
    assert first > recv.max()  # the first connections to send a heartbeat are the ones read
    assert len(res.conns) <= BUDGET + len(res.events)  # the rest are known by their events only (MAX_EVENTS)

    f = pcap.scan_local([capture], native=native, max_capture_connections=BUDGET, batch_records=16)
    assert f["summary"]["records"] == 2 * BUDGET
    (lim,) = f["capture"]["limits"]
    assert (lim["kind"], lim["count"], lim["first_ms"], lim["last_ms"]) == (
        "heartbeats_untracked", 2 * (N - BUDGET), first, last)
    (bad,) = [c for c in f["scan"]["corrupt"] if c["kind"] == "capture_limit"]
    assert bad["records_lost"] == 2 * (N - BUDGET) and "--max-capture-connections" in bad["reason"]
    from engine.bindings.report import damage_line

    assert f"{2 * (N - BUDGET):,} records lost" in damage_line(f)


@ENGINES
def test_at_the_budget_the_findings_are_the_unbounded_ones(capture, native):
    ref = pcap.scan_local([capture], native=native)
    assert ref["flapping_clients"] and ref["summary"]["records"] == 2 * N and not ref["capture"]["limits"]
    assert pcap.scan_local([capture], native=native, max_capture_connections=N, batch_records=16) == ref
    for shards in (1, 3):  # each shard tracks its share
        ref = pcap.scan_local([capture], native=native, shards=shards)
        assert pcap.scan_local([capture], native=native, shards=shards, max_capture_connections=N // shards + 20,
                               batch_records=16) == ref


def test_a_capture_tasks_summary_row_is_bounded(capture):
    """The CAPTURE_ROLE row (its JSON) carries the addresses of the connections read: at most the budget."""
    (cap,) = pcap.plan_captures([capture])

    def summary(**kw):
        out = pcap.capture_runs(cap, ScanParams(), batch_records=16, **kw)
        (row,) = [json.loads(b.column(4)[0].as_py()) for b in out if b.column(0)[0].as_py() == pcap.CAPTURE_ROLE]
        conns = {c for b in out for r, c in zip(b.column(0).to_pylist(), b.column(3).to_pylist()) if r == "client"}
        return row, conns

    row, conns = summary(max_capture_connections=BUDGET)
    assert len(row["addrs"]) == BUDGET and len(conns) == BUDGET
    assert row["stats"]["heartbeats_untracked"] == 2 * (N - BUDGET)
    row, conns = summary()
    assert len(row["addrs"]) == N and len(conns) == N


def test_the_option_is_checked_and_named(capture, tmp_path, capsys):
    from engine.cli import main

    with pytest.raises(ValueError):
        next(pcap.iter_capture(pcap.plan_captures([capture])[0], max_capture_connections=0))
    assert main(["scan", str(capture), "--out", str(tmp_path / "r0"), "--max-capture-connections", "0"]) == 2
    assert "--max-capture-connections" in capsys.readouterr().err
    rep = tmp_path / "r1"
    assert main(["scan", str(capture), "--out", str(rep), "--no-plots", "--engine", "local",
                 "--max-capture-connections", str(BUDGET)]) == 3
    err = capsys.readouterr().err
    assert err.count("DAMAGED INPUT") == 1 and f"{2 * (N - BUDGET):,} records lost" in err
    f = json.loads((rep / "findings.json").read_text())
    assert [lim["kind"] for lim in f["capture"]["limits"]] == ["heartbeats_untracked"]


@pytest.mark.spark
def test_spark_scan_tracks_what_the_local_scan_tracks(spark, capture):
    """The Spark scan reads the same connections and names the same damage as the in-process scan (sharded too:
    each shard's task has the budget), and at the budget finds what the unbounded scan finds."""
    from test_pcap_spark import _comparable

    for shards in (1, 2):
        ref = pcap.scan_local([capture], shards=shards, max_capture_connections=BUDGET)
        f = pcap.scan(spark, [capture], shards=shards, max_capture_connections=BUDGET)
        assert _comparable(f) == _comparable(ref)
        assert f["capture"] == ref["capture"] and f["scan"]["corrupt"] == ref["scan"]["corrupt"]
        untracked = sum(lim["count"] for lim in f["capture"]["limits"] if lim["kind"] == "heartbeats_untracked")
        assert f["summary"]["records"] == ref["summary"]["records"] == 2 * N - untracked
        assert f["summary"]["records"] <= 2 * BUDGET * shards and untracked
    f = pcap.scan(spark, [capture], max_capture_connections=N)
    ref = pcap.scan_local([capture])
    assert _comparable(f) == _comparable(ref) and f["capture"] == ref["capture"] and not f["capture"]["limits"]

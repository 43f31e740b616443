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


def _restarts_reference(results):
    """broker_restarts as it was: every connection checked at every server end (quadratic), the rule's reference."""
    import bisect

    out = []
    for r in results:
        ends = pcap.connection_events([r])
        server_ends = sorted({int(e["end"][0]) for e in ends.values()
                              if e.get("end") is not None and str(e["end"][1]).endswith("_by_server")})
        opens = sorted(int(e["open"]) for e in ends.values() if e.get("open") is not None)
        after = -1
        for t in server_ends:
            if t <= after:
                continue
            live = [c for c, v in r.conns.items() if int(v[1]) < t and (
                (ends.get(c) or {}).get("end") is None or int(ends[c]["end"][0]) >= t)]
            if len(live) < 2 or not all(
                    (ends.get(c) or {}).get("end") is not None
                    and int(ends[c]["end"][0]) <= t + pcap.RESTART_WINDOW_MS
                    and str(ends[c]["end"][1]).endswith("_by_server") for c in live):
                continue
            after = max(int(ends[c]["end"][0]) for c in live)
            k = bisect.bisect_right(opens, after)
            out.append({"broker": r.name, "start_ms": opens[k] if k < len(opens) else None, "ready_ms": None,
                        "name": None, "addr": None, "stopped_ms": t, "members_ended": None,
                        "clients_ended": len(live), "seen": pcap.RESTART_SEEN_CLOSES})
    return sorted(out, key=lambda x: (x["broker"], x["stopped_ms"]))


def _random_result(rng, n):
    """n connections over ~60 s, some opened, most ended by the server or the client, some clustered in 'stops';
    times on a 500 ms grid, so that ends fall on other connections' first times and at the window's edge."""
    conns, events = {}, []
    stops = sorted(rng.sample(range(0, 60_000, 500), 3))
    for c in range(n):
        first = rng.randrange(0, 60_000, 500)
        if rng.random() < 0.6:
            events.append((first, c, "open", "a", "client", None, None, None))
        last = first + rng.randrange(0, 20_000, 500)
        r = rng.random()
        if r < 0.3:
            stop = [s for s in stops if s >= first]
            end = (stop[0] if stop else last) + rng.randrange(0, 2_501, 500)
            events.append((end, c, rng.choice(["fin", "rst"]), "a", "server", None, None, None))
            last = max(last, end)
        elif r < 0.6:
            events.append((last, c, "fin", "a", rng.choice(["server", "client"]), None, None, None))
        elif r < 0.65:
            events.append((first, c, "rst", "a", "server", None, None, None))
        conns[c] = ["a", first, last]
    events.sort()
    return pcap.CaptureResult("cap", [], {}, events, [], [], (1, 0), 0, 90_000, conns)


def test_broker_restarts_are_the_rule_and_linear():
    """broker_restarts counted live connections at every server end (server ends x connections: 8,000 connections
    each reset by the server took 30 s); now sorted bounds: the same stops, in linear-log time."""
    import random
    import time

    rng = random.Random(26)
    found = 0
    for _ in range(600):
        rs = [_random_result(rng, rng.randrange(0, 12))]
        want = _restarts_reference(rs)
        assert pcap.broker_restarts(rs) == want
        found += len(want)
    assert found > 20  # the cases hold stops (35 with this seed)

    def result(*conns):  # (first, end ms or None, how, opened)
        events = sorted([(f, c, "open", "a", "client", None, None, None) for c, (f, _, _, o) in enumerate(conns) if o]
                        + [(e, c, how, "a", by, None, None, None) for c, (_, e, how, _) in enumerate(conns)
                           if e is not None for how, by in [how.split("_by_")]])
        return [pcap.CaptureResult("cap", [], {}, events, [], [], (1, 0), 0, 9_000,
                                   {c: ["a", f, e if e is not None else f] for c, (f, e, _, _) in enumerate(conns)})]

    w = pcap.RESTART_WINDOW_MS
    edges = [
        # a connection opened at the stop's millisecond is not live then
        result((0, 1000, "rst_by_server", True), (0, 1000, "rst_by_server", True), (1000, None, "", True)),
        # ... nor does its end (within the window) move the stop's end
        result((0, 1000, "rst_by_server", True), (0, 1000, "rst_by_server", True),
               (1000, 1000 + w, "fin_by_server", True), (2000, None, "", True)),
        # the window's last millisecond is in it, the one after is not
        result((0, 1000, "rst_by_server", True), (0, 1000 + w, "fin_by_server", False)),
        result((0, 1000, "rst_by_server", True), (0, 1001 + w, "fin_by_server", False)),
        # a connection that ended at its first millisecond is never live
        result((0, 1000, "rst_by_server", True), (0, 1000, "rst_by_server", True), (500, 500, "rst_by_client", True)),
    ]
    for rs in edges:
        assert pcap.broker_restarts(rs) == _restarts_reference(rs)
    assert [len(_restarts_reference(rs)) for rs in edges] == [1, 1, 1, 0, 1]
    assert _restarts_reference(edges[1])[0]["start_ms"] == 2000
    n = 20_000  # every connection reset by the server at its own time: 20,000 x 20,000 checks before
    conns = {c: ["a", 10 * c, 10 * c + 5] for c in range(n)}
    events = [(10 * c + 5, c, "rst", "a", "server", None, None, None) for c in range(n)]
    res = pcap.CaptureResult("cap", [], {}, events, [], [], (1, 0), 0, 10 * n, conns)
    t = time.perf_counter()
    assert pcap.broker_restarts([res]) == []
    assert time.perf_counter() - t < 5


def _silent_reference(results, expiry):
    """The silent restarts (their closes not seen) by their definition, every connection checked at every time that
    could begin one: the rule's reference (pcap._silent_restarts)."""
    import bisect

    w = pcap.RESTART_WINDOW_MS
    out, ended = [], {}
    for r in results:
        ends = pcap.connection_events([r])
        opens = sorted(int(e["open"]) for e in ends.values() if e.get("open") is not None)

        def parts(c):
            _, f, last, act, before = r.conns[c]
            end = (ends.get(c) or {}).get("end")
            how, e = (end[1], int(end[0])) if end is not None else ("", None)
            if how == "rst_by_server" and act is not None and act >= e - w:  # a heartbeat the reset answered
                act = before
            return f, last, act, how, e

        def survives(c, t):
            f, last, act, how, e = parts(c)
            return f < t and ((e is None and last >= t) or (e is not None and act is not None and act >= t)
                              or (how == "fin_by_server" and e >= t) or (how == "rst_by_server" and e - w <= t <= e))

        def silent(c, t):
            f, last, act, how, e = parts(c)
            return act is not None and t < act + expiry and (
                (e is None and last < t) or (how == "rst_by_server" and act < t and e > t + w))

        bounds = {x for c in r.conns for x in parts(c)[:5] if isinstance(x, int)} | set(opens)
        bounds |= {x - w for x in bounds} | {x + expiry for x in bounds}
        times = sorted({x + d for x in bounds for d in (-1, 0, 1)})
        after, done = -1, set()
        while times:
            t = times.pop(0)
            if t <= after:
                continue
            old = [c for c in r.conns if c not in done and silent(c, t)]
            k = bisect.bisect_left(opens, t)
            if len(old) < 2 or any(survives(c, t) for c in r.conns) or k == len(opens):
                continue
            done.update(old)
            ended.update((c, (t, True)) for c in old)
            after = opens[k]
            times = sorted(set(times) | {after + 1})
            out.append({"broker": r.name, "start_ms": opens[k], "ready_ms": None, "name": None, "addr": None,
                        "stopped_ms": t, "members_ended": None, "clients_ended": len(old),
                        "seen": pcap.RESTART_SEEN_SILENT})
    return out, ended


def _random_silent_result(rng, n):
    """n connections over ~60 s with heartbeats (some none), most silent at one of two 'crashes' (nothing after,
    or the new host's reset later), some going on, some ended by either side, new connections opened after."""
    conns, events = {}, []
    crashes = sorted(rng.sample(range(5_000, 60_000, 500), 2))
    for c in range(n):
        first = rng.randrange(0, 60_000, 500)
        if rng.random() < 0.7:
            events.append((first, c, "open", "a", "client", None, None, None))
        act = None if rng.random() < 0.1 else first + rng.randrange(0, 20_000, 500)
        if act is not None and rng.random() < 0.6:
            crash = [s for s in crashes if s >= first]
            act = max(first, (crash[0] if crash else act) - rng.randrange(0, 3_001, 500))
        last = first if act is None else act
        before = None if act is None or act == first else rng.randrange(first, act, 500)
        x = rng.random()
        if x < 0.25:
            how, by = rng.choice([("rst", "server"), ("rst", "server"), ("fin", "server"), ("fin", "client")])
            end = last + rng.choice([0, 500, 2_000, 2_500, 3_000, 10_000, 30_000])
            events.append((end, c, how, "a", by, None, None, None))
            if how == "rst" and rng.random() < 0.5:  # the new host's reset answering a heartbeat
                act, before = end - rng.choice([0, 500, 2_000]), act
            last = end
        conns[c] = ["a", first, last, act, before]
    events.sort()
    return pcap.CaptureResult("cap", [], {}, events, [], [], (1, 0), 0, 90_000, conns)


def test_silent_restarts_are_the_rule_and_linear():
    """A restart whose closes the capture did not see (issue 28 s1 audit): pcap._silent_restarts equals its
    definition on random connections and takes linear-log time on many."""
    import random
    import time

    rng = random.Random(28)
    found = 0
    for _ in range(400):
        rs = [_random_silent_result(rng, rng.randrange(0, 10))]
        ends = pcap.connection_events(rs)
        opens = sorted(int(e["open"]) for e in ends.values() if e.get("open") is not None)
        got = pcap._silent_restarts(rs[0], ends, opens, 120_000)
        want = _silent_reference(rs, 120_000)
        assert got == want, rs[0]
        found += len(want[0])
    assert found > 20
    # 20,000 connections, each silent at its own time and a new connection after it: 10,000 restarts checked
    n = 20_000
    conns = {c: ["a", 10 * c, 10 * c + 5, 10 * c + 5, None] for c in range(n)}
    events = [(10 * c, c, "open", "a", "client", None, None, None) for c in range(n)]
    res = pcap.CaptureResult("cap", [], {}, events, [], [], (1, 0), 0, 10 * n, conns)
    t = time.perf_counter()
    assert len(pcap.broker_restarts([res])) == n // 2 - 1  # two at a time; the last pair has no new connection
    assert time.perf_counter() - t < 5

"""The Spark tasks' work without Spark: split planning, Arrow record/heartbeat batches, per-split runs."""
import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

import engine  # noqa: E402
from engine.recorder import HeartbeatRecorder, iter_records, list_segments  # noqa: E402
from engine.bindings import segments as seg  # noqa: E402
from engine.scan_py import ScanParams, subscription_key  # noqa: E402
from engine.synth import FleetConfig, generate  # noqa: E402

BAD_BODIES = [b"{not json", b'{"producerDataSet":[]}', b"", b'{"clientID":"x","consumerDataSet":{}}', b"\xff\xfe"]


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    d = tmp_path_factory.mktemp("seg")
    manifest = generate(d, FleetConfig(clients=30, groups=6, days=0.1, seed=11), block_records=512)
    # a few bodies no decoder accepts, inside the time range, and a torn tail on the last segment
    with HeartbeatRecorder(d, prefix="zz") as rec:
        for i, b in enumerate(BAD_BODIES):
            rec.record(manifest["start_ms"] + 60_000 + i, 10_000 + i, "10.9.9.9:1", "JAVA", 1, b)
    with open(list_segments(d)[-1], "ab") as f:
        f.write(b"HBK1\x00\x01 torn")
    return d, manifest


def test_plan_cuts_blocks_into_splits(recording):
    d, manifest = recording
    plan = seg.plan_splits(d, target_records=3000)
    assert plan.n_records == manifest["records"] + len(BAD_BODIES)
    assert plan.segments == len(list_segments(d))
    assert len(plan.torn_tails) == 1 and not plan.corrupt
    for s in plan.splits:
        assert s.n_records <= 3000 or len(s.blocks) == 1
        assert all(b.offset < c.offset for b, c in zip(s.blocks, s.blocks[1:]))
    # more splits than segments: segments are cut at block boundaries
    assert len(plan.splits) > plan.segments
    assert seg.plan_splits(d, target_records=10**9).splits.__len__() == plan.segments
    with pytest.raises(ValueError):
        seg.plan_splits(d, target_records=0)


def test_record_batches_are_the_records(recording):
    d, _ = recording
    plan = seg.plan_splits(d, target_records=2000)
    rows = []
    for s in plan.splits:
        for b in seg.record_batches(s, max_rows=700):
            assert b.schema == seg.RECORD_SCHEMA and b.num_rows <= 700
            rows.extend(b.to_pylist())
    expected = list(iter_records(d))
    assert len(rows) == len(expected)
    for r, e in zip(rows, expected):
        assert (r["recv_ms"], r["conn_id"], r["remote_addr"], r["version"], r["body"]) == (
            e.recv_ms, e.conn_id, e.remote_addr, e.version, e.body)
        assert r["language"] == (e.language.name if e.language is not None else None)


def test_non_utf8_address_is_replaced(tmp_path):
    with HeartbeatRecorder(tmp_path) as rec:
        rec.record(1, 1, b"\xff:1", None, 1, b"{}")
        rec.record(2, 1, "ok:2", 1, 1, b"{}")
    (s,) = seg.plan_splits(tmp_path).splits
    (b,) = seg.record_batches(s)
    assert b.column("remote_addr").to_pylist() == ["\ufffd:1", "ok:2"]
    assert b.column("language").to_pylist() == [None, "CPP"]


def _expected_decoded(body):
    try:
        hb = engine.decode_heartbeat(body)
    except (engine.HeartbeatError, TypeError):
        return None
    d = hb.to_dict()
    return {
        "client_id": d["client_id"], "fingerprint": d["fingerprint"], "without_sub": d["without_sub"],
        "producer_groups": [p["group"] for p in d["producers"]],
        "consumers": [
            {"group": c["group"], "consume_type": c["consume_type"], "message_model": c["message_model"],
             "consume_from_where": c["consume_from_where"], "unit_mode": c["unit_mode"],
             "subscriptions": [{"topic": s["topic"], "sub_string": s["sub_string"], "expression_type": s["expression_type"],
                                "tags": list(s["tags"]), "sub_version": s["sub_version"],
                                "class_filter_mode": s["class_filter_mode"]} for s in c["subscriptions"]]}
            for c in d["consumers"]
        ],
    }


@pytest.mark.parametrize("dedupe", [True, False])
def test_decode_bodies_matches_decode_heartbeat(recording, vectors, dedupe):
    d, _ = recording
    bodies = [r.body for r in list(iter_records(d))[::37]] + BAD_BODIES
    bodies += [frame[8 + (int.from_bytes(frame[4:8], "big") & 0xFFFFFF):] for _, e, frame in vectors if e["code"] == 34]
    arr = seg.decode_bodies(bodies, dedupe_bodies=dedupe)
    assert arr.type == seg.DECODED_TYPE and len(arr) == len(bodies)
    for body, row in zip(bodies, arr.to_pylist()):
        want = _expected_decoded(body)
        if want is None:
            assert row["error"] and row["client_id"] is None and row["producer_groups"] == []
        else:
            assert row.pop("error") is None
            assert row == want


def test_heartbeat_batches(recording):
    d, _ = recording
    (s, *_) = seg.plan_splits(d).splits
    (b,) = list(seg.heartbeat_batches(s))
    assert b.schema == seg.HEARTBEAT_SCHEMA and b.num_rows == s.n_records
    rows = b.to_pylist()
    assert {r["language"] for r in rows} <= {"JAVA", "CPP"}
    assert any(r["without_sub"] for r in rows) and all(r["error"] is None for r in rows)


def _runs(d, params=ScanParams(), dedupe=True, target=4000):
    out = []
    for s in seg.plan_splits(d, target_records=target).splits:
        for b in seg.split_runs(s, params, dedupe_bodies=dedupe):
            assert b.schema == seg.RUN_SCHEMA
            out.extend(b.to_pylist())
    return out


def test_split_runs_cover_every_observation(recording):
    d, manifest = recording
    runs = _runs(d)
    stats = [r for r in runs if r["role"] == seg.STATS_ROLE]
    records = list(iter_records(d))
    assert sum(r["n"] for r in stats) == len(BAD_BODIES)
    assert min(r["first_ms"] for r in stats) == min(r.recv_ms for r in records)
    assert max(r["last_ms"] for r in stats) == max(r.recv_ms for r in records)
    # each role's run lengths add up to its observations, computed one record at a time
    want = {"client": 0, "producer": 0, "consumer": 0}
    keys = set()
    for r in records:
        try:
            hb = engine.decode_heartbeat(r.body)
        except engine.HeartbeatError:
            continue
        if hb.client_id is None:
            continue
        want["client"] += 1
        want["producer"] += len(hb.producers)
        want["consumer"] += len(hb.consumers)
        for c in hb.consumers:
            keys.add((hb.client_id, c.group, None if hb.without_sub else subscription_key(c.subscriptions)))
    got = {role: sum(r["n"] for r in runs if r["role"] == role) for role in want}
    assert got == want
    assert {(r["client_id"], r["group"], r["sub_key"]) for r in runs if r["role"] == "consumer"} == keys
    for r in runs:
        assert r["first_ms"] <= r["last_ms"] and (r["n"] >= 1 or r["role"] == seg.STATS_ROLE)
        if r["sub_key"] is not None:
            json.loads(r["sub_key"])


def test_split_runs_break_on_silence_and_connection(recording):
    d, manifest = recording
    runs = [r for r in _runs(d, target=10**9) if r["role"] == "client"]
    gap = manifest["anomalies"]["heartbeat_gaps"]
    for g in gap:
        mine = sorted((r["first_ms"], r["last_ms"], r["conn_id"]) for r in runs if r["client_id"] == g["client_id"])
        assert any(a[1] == g["expected_start_ms"] and b[0] == g["expected_end_ms"] for a, b in zip(mine, mine[1:]))
    # a tighter split threshold cuts more
    fine = [r for r in _runs(d, ScanParams(gap_threshold_s=20), target=10**9) if r["role"] == "client"]
    assert len(fine) > len(runs)


def test_split_runs_same_with_and_without_dedupe(recording):
    d, _ = recording
    key = lambda r: tuple((k, "" if v is None else v) for k, v in sorted(r.items()))  # noqa: E731
    assert sorted(map(key, _runs(d, dedupe=True))) == sorted(map(key, _runs(d, dedupe=False)))


def test_dedupe_indexes_first_seen_order():
    ids, uniq = seg.dedupe([b"a", b"b", b"a", b"c", b"b"])
    assert ids.tolist() == [0, 1, 0, 2, 1] and uniq == [b"a", b"b", b"c"]


def test_empty_split_columns():
    e = seg.SplitColumns(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.uint8),
                         np.zeros(1, np.int32), b"", np.zeros(1, np.int32), b"")
    (stats,) = seg.columns_runs(e)
    assert stats.to_pylist() == [{"role": seg.STATS_ROLE, "group": "", "client_id": "", "conn_id": 0, "sub_key": None,
                                  "first_ms": None, "last_ms": None, "n": 0}]


# ---------------------------------------------------------------------------------------------------------------
# BodyDeduper: native (engine._segment) and twin

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.recorder import SegmentError  # noqa: E402


def _dedupers():
    out = [seg.BodyDeduperPy]
    try:
        from engine._segment import BodyDeduper
    except ImportError:
        import os

        if os.environ.get("ENGINE_REQUIRE_NATIVE"):
            raise
    else:
        out.append(BodyDeduper)
    return out


DEDUPERS = _dedupers()


def _pack(bodies):
    off = np.zeros(len(bodies) + 1, np.int32)
    np.cumsum([len(b) for b in bodies], out=off[1:])
    return off, b"".join(bodies)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from([b"", b"a", b"ab", b"b", b"{}", b"x" * 40, b"\x00"])),
                max_size=60), st.integers(1, 4))
def test_deduper_parity_and_first_seen_ids(rows, chunks):
    conn = np.array([c for c, _ in rows], np.int64)
    bodies = [b for _, b in rows]
    results = []
    for cls in DEDUPERS:
        d = cls()
        ids = []
        bounds = np.linspace(0, len(rows), chunks + 1).astype(int)
        for lo, hi in zip(bounds, bounds[1:]):
            off, data = _pack(bodies[lo:hi])
            ids.extend(d.add(np.ascontiguousarray(conn[lo:hi]), off, data).tolist())
        results.append((ids, list(d.bodies)))
    want_ids, want_uniq = seg.dedupe(bodies)
    for ids, uniq in results:
        assert ids == want_ids.tolist() and uniq == want_uniq


@pytest.mark.parametrize("cls", DEDUPERS)
def test_deduper_rejects_bad_offsets(cls):
    d = cls()
    one = np.array([0], np.int64)
    with pytest.raises(SegmentError):
        d.add(one, np.array([0, 5], np.int32), b"abc")  # past the data
    with pytest.raises(SegmentError):
        d.add(np.array([0, 0], np.int64), np.array([0, 2, 1], np.int32), b"abc")  # descending
    with pytest.raises(SegmentError):
        d.add(one, np.array([-1, 1], np.int32), b"abc")
    with pytest.raises(SegmentError):
        d.add(one, np.array([0, 1, 2], np.int32), b"abc")  # count mismatch
    with pytest.raises(SegmentError):
        d.add(np.array([-3], np.int64), np.array([0, 1], np.int32), b"abc")
    assert d.add(np.array([5000], np.int64), np.array([0, 3], np.int32), b"abc").tolist() == [0]  # grows
    assert len(d) == 1


def test_read_split_ids_matches_columns(recording):
    d, _ = recording
    for s in seg.plan_splits(d, target_records=2500).splits:
        recv, conn, ids, uniq = seg.read_split_ids(s)
        cols = seg.read_split(s)
        want_ids, want_uniq = seg.dedupe(cols.bodies())
        assert ids.tolist() == want_ids.tolist() and uniq == want_uniq
        assert recv.tolist() == cols.recv_ms.tolist() and conn.tolist() == cols.conn_id.tolist()


def test_merging_runs_across_splits(recording):
    d, _ = recording
    splits = seg.plan_splits(d, target_records=1500).splits
    per_split = [b for s in splits for b in seg.split_runs(s)]
    merged = seg.merge_run_batches(per_split)
    before = pa.Table.from_batches(per_split).to_pylist()
    after = pa.Table.from_batches(merged).to_pylist()
    assert len(after) < len(before)
    for role in ("client", "producer", "consumer", seg.STATS_ROLE):
        assert sum(r["n"] for r in before if r["role"] == role) == sum(r["n"] for r in after if r["role"] == role)
    assert len([r for r in after if r["role"] == seg.STATS_ROLE]) == 1
    # maximal already: merging again changes nothing; one task's splits give the same as merging them all
    again = pa.Table.from_batches(seg.merge_run_batches(merged)).to_pylist()
    assert sorted(map(str, again)) == sorted(map(str, after))
    assert sorted(map(str, pa.Table.from_batches(seg.splits_runs(splits)).to_pylist())) == sorted(map(str, after))
    assert seg.merge_run_batches([]) == []

"""The Spark tasks' work without Spark: split planning, Arrow record/heartbeat batches, per-split runs."""
import json

import numpy as np
import pytest

from conftest import require_module, strict  # noqa: E402

pa = require_module("pyarrow")

import engine  # noqa: E402
from engine.recording.recorder import HeartbeatRecorder, iter_records, list_segments  # noqa: E402
from engine.bindings import segments as seg  # noqa: E402
from engine.recording.scan_py import ScanParams, subscription_key  # noqa: E402
from engine.recording.synth import FleetConfig, generate  # noqa: E402

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
# BodyDeduper: native (engine.recording._segment) and twin

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.recording.recorder import SegmentError  # noqa: E402


def _dedupers():
    out = [seg.BodyDeduperPy]
    try:
        from engine.recording._segment import BodyDeduper
    except ImportError:
        if strict():
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


def _rejection(call):
    """The SegmentError's message for call(), which must raise one."""
    with pytest.raises(SegmentError) as info:
        call()
    return str(info.value)


_ONE = np.array([0], np.int64)
BAD_DEDUPE = [
    (_ONE, np.array([0, 5], np.int32), b"abc"),                            # past the data
    (np.array([0, 0], np.int64), np.array([0, 2, 1], np.int32), b"abc"),   # descending
    (_ONE, np.array([-1, 1], np.int32), b"abc"),
    (_ONE, np.array([0, 1, 2], np.int32), b"abc"),                         # count mismatch
    (np.array([-3], np.int64), np.array([0, 1], np.int32), b"abc"),
]


def test_deduper_errors_are_the_same_on_both():
    """Same input, same error class and message (the scan's damage reasons do not depend on the build)."""
    messages = [[_rejection(lambda: cls().add(*args)) for args in BAD_DEDUPE] for cls in DEDUPERS]
    assert len(DEDUPERS) == 2 or not strict()
    assert all(m == messages[0] for m in messages), messages


@pytest.mark.parametrize("cls", DEDUPERS)
def test_deduper_rejects_bad_offsets(cls):
    d = cls()
    for args in BAD_DEDUPE:
        _rejection(lambda: d.add(*args))
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


# ---------------------------------------------------------------------------------------------------------------
# The scan task: BlockScanner and member_runs (native and twin), task_runs against the per-split path

from engine.recording.recorder import decompress_payload, encode_block_payload, iter_payloads  # noqa: E402


def _scanners():
    out = [seg.BlockScannerPy]
    try:
        from engine.recording._segment import BlockScanner
    except ImportError:
        if strict():
            raise
    else:
        out.append(BlockScanner)
    return out


def _member_runs_fns():
    out = [seg.member_runs_py]
    try:
        from engine.recording._segment import member_runs
    except ImportError:
        pass
    else:
        out.append(member_runs)
    return out


SCANNERS = _scanners()
MEMBER_RUNS = _member_runs_fns()


def _block(rows):
    """A decompressed block of (recv_ms, conn_id, body) rows."""
    recv = np.array([r[0] for r in rows], np.int64)
    conn = np.array([r[1] for r in rows], np.int64)
    raw = encode_block_payload(recv, conn, np.zeros(len(rows), np.int32), np.zeros(len(rows), np.uint8),
                               [b"10.0.0.1:%d" % r[1] for r in rows], [r[2] for r in rows])
    return raw, len(rows), int(recv.min()), int(recv.max())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([-(2**63), -1, 0, 7, 2**40, 2**63 - 1]),
                                   st.sampled_from([b"", b"a", b"ab", b"{}", b"x" * 40, b"\x00"])),
                         min_size=1, max_size=30), max_size=5))
def test_block_scanner_parity(blocks):
    results = []
    for cls in SCANNERS:
        sc = cls()
        for rows in blocks:
            sc.add_block(*_block(rows), where="t")
        recv, conn, ids = sc.columns()
        assert ids.dtype == np.int32 and recv.dtype == np.int64 and conn.dtype == np.int64
        assert sc.n_records == len(recv)
        results.append((recv.tolist(), conn.tolist(), ids.tolist(), list(sc.bodies)))
    rows = [r for b in blocks for r in b]
    want_ids, want_uniq = seg.dedupe([r[2] for r in rows])
    for recv, conn, ids, bodies in results:
        assert recv == [r[0] for r in rows] and conn == [r[1] for r in rows]
        assert ids == want_ids.tolist() and bodies == want_uniq


@pytest.mark.parametrize("cls", SCANNERS)
def test_block_scanner_rejects_bad_blocks_and_keeps_its_state(cls):
    raw, n, lo, hi = _block([(5, 1, b"abc"), (9, 2, b"de")])
    sc = cls()
    sc.add_block(raw, n, lo, hi)
    body_off = 24 * n + 4
    bad = [
        (raw[:-1], n, lo, hi),                                      # data region short
        (raw + b"x", n, lo, hi),                                    # trailing byte
        (raw, n + 1, lo, hi),                                       # more records than the layout holds
        (raw, 10**6, lo, hi),
        (raw[:10], n, lo, hi),                                      # shorter than the fixed columns
        (raw, n, lo, hi + 1),                                       # header times disagree
        (raw[:body_off + 4] + np.array([99], "<i4").tobytes() + raw[body_off + 8:], n, lo, hi),  # offset past
        (raw[:body_off] + np.array([1], "<i4").tobytes() + raw[body_off + 4:], n, lo, hi),       # not from 0
        (raw, -1, lo, hi),
    ]
    messages = [_rejection(lambda: sc.add_block(*args, where="seg@40")) for args in bad]
    assert all(m.startswith("seg@40: ") for m in messages)
    if len(SCANNERS) == 2:   # the same messages from the other implementation, on a scanner in the same state
        other = SCANNERS[SCANNERS.index(cls) - 1]()
        other.add_block(raw, n, lo, hi)
        assert [_rejection(lambda: other.add_block(*args, where="seg@40")) for args in bad] == messages
    else:
        assert not strict()
    recv, conn, ids = sc.columns()
    assert recv.tolist() == [5, 9] and ids.tolist() == [0, 1] and sc.bodies == [b"abc", b"de"]
    sc.add_block(*_block([(10, 2, b"de"), (11, 3, b"abc")]))
    assert sc.columns()[2].tolist() == [0, 1, 1, 0]


def test_block_scanner_empty():
    for cls in SCANNERS:
        recv, conn, ids = cls().columns()
        assert len(recv) == len(conn) == len(ids) == 0


def _tables(n_bodies, n_clients, entries, clients):
    off = np.zeros(n_bodies + 1, np.int32)
    np.cumsum([len(e) for e in entries], out=off[1:])
    member = np.array([m for e in entries for m, _ in e], np.int32)
    key = np.array([k for e in entries for _, k in e], np.int32)
    return np.array(clients, np.int32), off, member, key


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_member_runs_parity(data):
    n_clients = data.draw(st.integers(1, 3))
    n_members = data.draw(st.integers(1, 5))
    n_bodies = data.draw(st.integers(1, 4))
    clients = data.draw(st.lists(st.integers(-1, n_clients - 1), min_size=n_bodies, max_size=n_bodies))
    entries = data.draw(st.lists(st.lists(st.tuples(st.integers(0, n_members - 1), st.integers(-1, 2)), max_size=3),
                                 min_size=n_bodies, max_size=n_bodies))
    n = data.draw(st.integers(0, 25))
    steps = data.draw(st.lists(st.integers(-5, 200), min_size=n, max_size=n))
    recv = np.cumsum(np.array(steps, np.int64)) if data.draw(st.booleans()) else np.cumsum(np.abs(steps)).astype(np.int64)
    conn = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), np.int64)
    ids = np.array(data.draw(st.lists(st.integers(0, n_bodies - 1), min_size=n, max_size=n)), np.int32)
    split = data.draw(st.sampled_from([0, 50, 10**6]))
    tables = _tables(n_bodies, n_clients, entries, clients)
    results = [fn(recv, conn, ids, *tables, n_clients, n_members, split) for fn in MEMBER_RUNS]
    first = results[0]
    for r in results[1:]:
        if first is None:
            assert r is None
        else:
            assert r is not None and r[1] == first[1]
            assert [a.tolist() for a in r[0]] == [a.tolist() for a in first[0]]
            assert [a.dtype for a in r[0]] == [a.dtype for a in first[0]]
    if first is not None:
        member, _, _, lo, hi, count = first[0]
        assert first[1][0] == sum(1 for b in ids.tolist() if clients[b] < 0)
        # every observation of a good record lands in exactly one run
        assert int(count.sum()) == sum(len(entries[b]) for b in ids.tolist() if clients[b] >= 0)
        assert (lo <= hi).all()


@pytest.mark.parametrize("fn", MEMBER_RUNS)
def test_member_runs_checks_its_tables(fn):
    clients, off, member, key = _tables(2, 1, [[(0, -1)], [(1, 0)]], [0, 0])
    recv, conn, ids = np.array([1, 2], np.int64), np.array([1, 1], np.int64), np.array([0, 1], np.int32)
    assert fn(recv, conn, ids, clients, off, member, key, 1, 2, 100) is not None
    for args in [
        (recv, conn, np.array([0, 2], np.int32), clients, off, member, key, 1, 2, 100),       # body id
        (recv, conn, ids, np.array([0, 1], np.int32), off, member, key, 1, 2, 100),           # client
        (recv, conn, ids, clients, off, member, key, 1, 1, 100),                              # member
        (recv, conn, ids, clients, np.array([0, 2, 1], np.int32), member, key, 1, 2, 100),    # offsets
        (recv, conn, ids, clients, off, member, np.array([-1, -2], np.int32), 1, 2, 100),     # key
        (recv[:1], conn, ids, clients, off, member, key, 1, 2, 100),                          # lengths
        (recv, conn, ids, clients, off, member, key, 1, 2, -1),
    ]:
        with pytest.raises(ValueError):
            fn(*args)


@pytest.mark.parametrize("fn", MEMBER_RUNS)
def test_member_runs_refuses_out_of_order_clients(fn):
    clients, off, member, key = _tables(2, 1, [[(0, -1)], [(0, -1)]], [0, 0])
    conn = np.array([1, 1], np.int64)
    assert fn(np.array([5, 4], np.int64), conn, np.array([0, 0], np.int32), clients, off, member, key, 1, 1, 9) is None
    # the same instant and connection with two different bodies: the order between them is the sets' order
    assert fn(np.array([5, 5], np.int64), conn, np.array([0, 1], np.int32), clients, off, member, key, 1, 1, 9) is None
    assert fn(np.array([5, 5], np.int64), np.array([2, 1], np.int64), np.array([0, 0], np.int32), clients, off, member,
              key, 1, 1, 9) is None
    (m, c, k, first, last, n), _ = fn(np.array([5, 5], np.int64), conn, np.array([0, 0], np.int32), clients, off,
                                      member, key, 1, 1, 9)
    assert (first.tolist(), last.tolist(), n.tolist()) == ([5], [5], [2])


def _sorted_rows(batches):
    return sorted(map(str, pa.Table.from_batches(batches, schema=seg.RUN_SCHEMA).to_pylist()))


@pytest.mark.parametrize("target", [700, 10**9])
def test_task_runs_equal_the_sorted_per_split_path(recording, target):
    d, _ = recording
    splits = seg.plan_splits(d, target_records=target).splits
    want = seg.merge_run_batches([b for s in splits for b in seg.split_runs(s)])
    assert _sorted_rows(seg.task_runs(splits)) == _sorted_rows(want)
    # a task's share of the splits, and the record columns the scanner produced
    half = splits[: max(1, len(splits) // 2)]
    assert _sorted_rows(seg.task_runs(half)) == _sorted_rows(seg.merge_run_batches(
        [b for s in half for b in seg.split_runs(s)]))
    recv, conn, ids = seg.scan_blocks(half).columns()
    want_recv = np.concatenate([seg.read_split_ids(s)[0] for s in half])
    assert recv.tolist() == want_recv.tolist()


def test_task_runs_out_of_order_and_ambiguous_bodies_take_the_sorted_path(tmp_path):
    body = lambda cid, topic: json.dumps({"clientID": cid, "producerDataSet": [], "consumerDataSet": [  # noqa: E731
        {"groupName": "g", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
         "subscriptionDataSet": [{"topic": topic, "subString": "*", "expressionType": "TAG"}]}]}).encode()
    twice = json.loads(body("c2", "t1"))
    twice["consumerDataSet"].append(json.loads(body("c2", "t2"))["consumerDataSet"][0])
    with HeartbeatRecorder(tmp_path) as rec:
        # c1's second heartbeat is recorded before its first (receive times out of file order)
        rec.record(2_000, 1, "10.0.0.1:1", "JAVA", 1, body("c1", "t1"))
        rec.record(1_000, 1, "10.0.0.1:1", "JAVA", 1, body("c1", "t1"))
        rec.record(3_000, 1, "10.0.0.1:1", "JAVA", 1, body("c1", "t2"))
    splits = seg.plan_splits(tmp_path).splits
    want = seg.merge_run_batches([b for s in splits for b in seg.split_runs(s)])
    got = seg.task_runs(splits)
    assert _sorted_rows(got) == _sorted_rows(want)
    assert sum(r["n"] for r in pa.Table.from_batches(got).to_pylist() if r["role"] == "client") == 3
    d2 = tmp_path / "twice"
    with HeartbeatRecorder(d2) as rec:
        rec.record(1_000, 2, "10.0.0.2:1", "JAVA", 1, json.dumps(twice).encode())
    assert seg.entry_tables(seg._decode([json.dumps(twice).encode()])).ambiguous
    splits = seg.plan_splits(d2).splits
    assert _sorted_rows(seg.task_runs(splits)) == _sorted_rows(
        seg.merge_run_batches([b for s in splits for b in seg.split_runs(s)]))


def test_scan_blocks_skips_or_raises_on_a_corrupt_block(tmp_path):
    with HeartbeatRecorder(tmp_path, block_bytes=1) as rec:  # one block per record
        for i in range(3):
            rec.record(1_000 + i, 1, "10.0.0.1:1", "JAVA", 1, b'{"clientID":"c%d"}' % i)
    (split,) = seg.plan_splits(tmp_path).splits
    assert len(split.blocks) == 3
    path = split.path
    data = bytearray(open(path, "rb").read())
    mid = split.blocks[1]
    data[mid.offset + 40 + 2] ^= 0xFF  # payload byte: CRC mismatch
    open(path, "wb").write(bytes(data))
    assert seg.scan_blocks([split]).columns()[0].tolist() == [1_000, 1_002]
    with pytest.raises(SegmentError):
        seg.scan_blocks([split], on_corrupt="raise")
    with pytest.raises(ValueError):
        seg.scan_blocks([split], on_corrupt="ignore")
    # payloads decompress to exactly what the block header says
    for info, payload, where in iter_payloads(path, [split.blocks[0]]):
        assert len(decompress_payload(info, payload, where)) == info.raw_len

"""Segment splits as Arrow data, without Spark: what the Spark tasks run, testable on its own.

* ``plan_splits(dir)`` (``engine.bindings.plan``, pyarrow-free): walk every segment's block headers and cut them
  into splits of about ``target_records`` records, never across segments. Damage found on the way is reported in
  the plan.
* ``record_batches(split)``: the raw records of a split as Arrow record batches (bodies zero-copy from the
  decompressed blocks).
* ``heartbeat_batches(split)``: the records with their decoded heartbeats (nested Arrow columns).
* ``split_runs(split, params)``: the scan's pre-aggregation: observations of each (role, group, client) cut into
  runs (same connection, same body, no silence over the split threshold), one Arrow row per run.

Heartbeats repeat byte for byte between state changes, so each split decodes every *distinct* body once
(``dedupe=True``, the default) with the batch decoder and expands the result to all records with numpy;
``dedupe=False`` decodes every body (same results, for measuring the decoder).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from engine import compiled_module
from engine.codec.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel
from engine.recording.recorder import CLIPPED_MAGIC, SegmentError, iter_blocks, parse_clipped
from engine.recording.scan_py import ScanParams

# the plan is pyarrow-free (an in-process scan of a recording plans it without loading Arrow); its names stay here
from .plan import DEFAULT_SPLIT_RECORDS, MAX_SPLIT_RAW_BYTES, Plan, Split, plan_splits  # noqa: F401

_log = logging.getLogger(__name__)

#: Role of the statistics rows in a runs frame: ``n`` bad bodies (no client), first/last receive time. split_runs
#: emits one per split (its time range over all records); memberships() one per bad body.
STATS_ROLE = "_stats"

RECORD_SCHEMA = pa.schema([
    ("recv_ms", pa.int64()), ("conn_id", pa.int64()), ("remote_addr", pa.string()), ("language", pa.string()),
    ("version", pa.int32()), ("body", pa.binary()),
])
SUBSCRIPTION_TYPE = pa.struct([
    ("topic", pa.string()), ("sub_string", pa.string()), ("expression_type", pa.string()),
    ("tags", pa.list_(pa.string())), ("sub_version", pa.int64()), ("class_filter_mode", pa.bool_()),
])
CONSUMER_TYPE = pa.struct([
    ("group", pa.string()), ("consume_type", pa.string()), ("message_model", pa.string()),
    ("consume_from_where", pa.string()), ("unit_mode", pa.bool_()), ("subscriptions", pa.list_(SUBSCRIPTION_TYPE)),
])
#: Decoded columns of a heartbeat (``error`` is set, and the rest null or empty, for a body that fails to decode).
DECODED_FIELDS = [
    ("error", pa.string()), ("client_id", pa.string()), ("fingerprint", pa.int32()), ("without_sub", pa.bool_()),
    ("producer_groups", pa.list_(pa.string())), ("consumers", pa.list_(CONSUMER_TYPE)),
]
DECODED_TYPE = pa.struct(DECODED_FIELDS)
HEARTBEAT_SCHEMA = pa.schema([f for f in RECORD_SCHEMA if f.name != "body"] + DECODED_FIELDS)
RUN_SCHEMA = pa.schema([
    ("role", pa.string()), ("group", pa.string()), ("client_id", pa.string()), ("conn_id", pa.int64()),
    ("sub_key", pa.string()), ("first_ms", pa.int64()), ("last_ms", pa.int64()), ("n", pa.int64()),
])

_LANGUAGE_NAMES = pa.array([LanguageCode(i).name if i in LanguageCode._value2member_map_ else None for i in range(256)],
                           pa.string())
_ENUM_NAMES = {cls: pa.array([m.name for m in cls], pa.string()) for cls in (ConsumeType, MessageModel, ConsumeFromWhere)}


# ---------------------------------------------------------------------------------------------------------------
# raw records


@dataclass
class SplitColumns:
    recv_ms: np.ndarray
    conn_id: np.ndarray
    version: np.ndarray
    language: np.ndarray
    addr_offsets: np.ndarray  # int32, n + 1, from 0
    addr_data: bytes
    body_offsets: np.ndarray
    body_data: bytes

    def __len__(self):
        return len(self.recv_ms)

    def bodies(self) -> List[bytes]:
        data, off = self.body_data, self.body_offsets.tolist()
        return [data[a:b] for a, b in zip(off, off[1:])]


def _concat_offsets(parts) -> np.ndarray:
    out, base = [np.zeros(1, np.int64)], 0
    for off in parts:
        out.append(off[1:].astype(np.int64) + base)
        base += int(off[-1])
    res = np.concatenate(out)
    if res[-1] >= 2**31:
        raise ValueError("split too large for 32-bit offsets")
    return res.astype(np.int32)


def read_split(split: Split, on_corrupt: str = "skip") -> SplitColumns:
    """Decompress a split's blocks into one set of columns (a corrupt payload is skipped or raises)."""
    blocks = list(iter_blocks(split.path, blocks=split.blocks, on_corrupt=on_corrupt))
    if not blocks:
        e64, e32 = np.zeros(0, np.int64), np.zeros(1, np.int32)
        return SplitColumns(e64, e64, np.zeros(0, np.int32), np.zeros(0, np.uint8), e32, b"", e32, b"")
    return SplitColumns(
        np.concatenate([b.recv_ms for b in blocks]),
        np.concatenate([b.conn_id for b in blocks]),
        np.concatenate([b.version for b in blocks]),
        np.concatenate([b.language for b in blocks]),
        _concat_offsets([b.addr_offsets for b in blocks]),
        b"".join(bytes(b.addr_data) for b in blocks),
        _concat_offsets([b.body_offsets for b in blocks]),
        b"".join(bytes(b.body_data) for b in blocks),
    )


def _string_array(offsets: np.ndarray, data: bytes) -> pa.Array:
    n = len(offsets) - 1
    arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    try:
        arr.validate(full=True)
        return arr
    except pa.ArrowInvalid:  # not UTF-8: decode each with replacement characters
        off = offsets.tolist()
        return pa.array([data[a:b].decode("utf-8", "replace") for a, b in zip(off, off[1:])], pa.string())


def record_columns(cols: SplitColumns) -> List[pa.Array]:
    n = len(cols)
    return [
        pa.array(cols.recv_ms, pa.int64()),
        pa.array(cols.conn_id, pa.int64()),
        _string_array(cols.addr_offsets, cols.addr_data),
        _LANGUAGE_NAMES.take(pa.array(cols.language, pa.uint8())),
        pa.array(cols.version, pa.int32()),
        pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(cols.body_offsets), pa.py_buffer(cols.body_data)]),
    ]


def record_batches(split: Split, max_rows: int = 65536, on_corrupt: str = "skip") -> Iterator[pa.RecordBatch]:
    """The split's raw records (RECORD_SCHEMA), in batches of at most max_rows."""
    cols = read_split(split, on_corrupt)
    if not len(cols):
        return
    batch = pa.RecordBatch.from_arrays(record_columns(cols), schema=RECORD_SCHEMA)
    for start in range(0, len(cols), max_rows):
        yield batch.slice(start, max_rows)


# ---------------------------------------------------------------------------------------------------------------
# decoding


class BodyDeduperPy:
    """Pure-Python twin of ``engine.recording._segment.BodyDeduper``: numbers distinct bodies in first-seen order across
    ``add`` calls, checking each body against the last one of its connection before hashing it."""

    def __init__(self):
        self.bodies: List[bytes] = []
        self._index: dict = {}
        self._last: dict = {}

    def __len__(self):
        return len(self.bodies)

    def add(self, conn_index, offsets, data) -> np.ndarray:
        conn_index = np.asarray(conn_index, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int32)
        data = bytes(data)
        n = len(conn_index)
        if len(offsets) != n + 1:
            raise SegmentError(f"{len(offsets)} offsets for {n} bodies")
        if offsets[0] < 0:
            raise SegmentError("negative body offset at 0")
        down = np.flatnonzero(offsets[1:] < offsets[:-1])
        if len(down):
            raise SegmentError(f"body offsets descend at {int(down[0]) + 1}")
        if offsets[n] > len(data):
            raise SegmentError(f"body offsets end at {int(offsets[n])}, past the {len(data)} data bytes")
        neg = np.flatnonzero(conn_index < 0)
        if len(neg):
            raise SegmentError(f"negative connection index at {int(neg[0])}")
        out = np.empty(n, dtype=np.int64)
        off = offsets.tolist()
        for i, c in enumerate(conn_index.tolist()):
            body = data[off[i]:off[i + 1]]
            body_id = self._last.get(c)
            if body_id is None or self.bodies[body_id] != body:
                body_id = self._index.get(body)
                if body_id is None:
                    body_id = self._index[body] = len(self.bodies)
                    self.bodies.append(body)
                self._last[c] = body_id
            out[i] = body_id
        return out


#: The compiled deduper when in use (engine.compiled_module), else the twin.
_segment = compiled_module("_segment")
BodyDeduper = _segment.BodyDeduper if _segment is not None else BodyDeduperPy


def read_split_ids(split: Split, on_corrupt: str = "skip", deduper=None):
    """(recv_ms, conn_id, body ids, distinct bodies) of a split. Blocks are numbered and released one at a time
    (a split decompresses to hundreds of MB; only the distinct bodies are kept)."""
    d = deduper if deduper is not None else BodyDeduper()
    conn_index: dict = {}  # connection id -> small dense index for the deduper
    recv, conn, ids = [], [], []
    for b in iter_blocks(split.path, blocks=split.blocks, on_corrupt=on_corrupt):
        c = b.conn_id
        uniq, inverse = np.unique(c, return_inverse=True)
        dense_of = np.fromiter((conn_index.setdefault(x, len(conn_index)) for x in uniq.tolist()), np.int64, len(uniq))
        dense = np.ascontiguousarray(dense_of[inverse.reshape(-1)])
        ids.append(d.add(dense, np.ascontiguousarray(b.body_offsets, dtype=np.int32), b.body_data))
        recv.append(np.array(b.recv_ms))
        conn.append(np.array(c))
    if not recv:
        e = np.zeros(0, np.int64)
        return e, e, e, []
    return np.concatenate(recv), np.concatenate(conn), np.concatenate(ids), d.bodies


def dedupe(bodies: List[bytes]) -> Tuple[np.ndarray, List[bytes]]:
    """Index of each body in the list of distinct bodies (first-seen order), and that list."""
    seen: dict = {}
    ids = np.fromiter((seen.setdefault(b, len(seen)) for b in bodies), dtype=np.int64, count=len(bodies))
    return ids, list(seen)


def _decode(bodies: List[bytes]):
    """The batch decode of ``bodies``; a record the recorder clipped (engine.recording.recorder.clip_body) is a bad
    row whose error names it as clipped, with its body's size and the reason, not as malformed JSON."""
    import engine

    batch = engine.decode_heartbeats(bodies)
    errors = batch.heartbeats["error"]
    for i, body in enumerate(bodies):
        if body[:8] == CLIPPED_MAGIC:
            c = parse_clipped(body)
            if c is not None:
                errors[i] = f"clipped by the recorder ({c.size} bytes): {c.reason}"
    return batch


def _lists(counts: np.ndarray, values: pa.Array) -> pa.Array:
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _enum_names(cls, ordinals: np.ndarray) -> pa.Array:
    idx = pa.array(ordinals.astype(np.int32), pa.int32(), mask=ordinals < 0)
    return _ENUM_NAMES[cls].take(idx)


def decoded_arrays(batch) -> pa.StructArray:
    """A HeartbeatBatch as one Arrow struct column (DECODED_TYPE), without a per-row Python loop over bodies."""
    h, p, c, s = batch.heartbeats, batch.producers, batch.consumers, batch.subscriptions
    tags = s["tags"]
    tag_counts = np.fromiter(map(len, tags), dtype=np.int64, count=len(tags))
    tag_values = pa.array([t for ts in tags for t in ts], pa.string())
    subs = pa.StructArray.from_arrays(
        [pa.array(s["topic"], pa.string()), pa.array(s["sub_string"], pa.string()),
         pa.array(s["expression_type"], pa.string()), _lists(tag_counts, tag_values),
         pa.array(s["sub_version"], pa.int64()), pa.array(s["class_filter_mode"], pa.bool_())],
        fields=list(SUBSCRIPTION_TYPE),
    )
    consumers = pa.StructArray.from_arrays(
        [pa.array(c["group"], pa.string()), _enum_names(ConsumeType, c["consume_type"]),
         _enum_names(MessageModel, c["message_model"]), _enum_names(ConsumeFromWhere, c["consume_from_where"]),
         pa.array(c["unit_mode"], pa.bool_()), _lists(c["n_subscriptions"], subs)],
        fields=list(CONSUMER_TYPE),
    )
    ok = h["ok"]
    return pa.StructArray.from_arrays(
        [pa.array(h["error"], pa.string()), pa.array(h["client_id"], pa.string()),
         pa.array(h["fingerprint"], pa.int32(), mask=~ok), pa.array(h["without_sub"], pa.bool_(), mask=~ok),
         _lists(h["n_producers"], pa.array(p["group"], pa.string())), _lists(h["n_consumers"], consumers)],
        fields=[pa.field(n, t) for n, t in DECODED_FIELDS],
    )


def decode_bodies(bodies: List[bytes], dedupe_bodies: bool = True) -> pa.StructArray:
    """Decode bodies into a DECODED_TYPE struct column, decoding each distinct body once by default."""
    if not dedupe_bodies:
        return decoded_arrays(_decode(bodies))
    ids, uniq = dedupe(bodies)
    return decoded_arrays(_decode(uniq)).take(pa.array(ids))


#: What the pandas-UDF decoder returns: flat columns (pyspark converts nested pandas values one element at a
#: time in Python, so a nested result would cost more than the decoding): groups, and each consumer's
#: subscription set as its canonical key (scan_py.subscription_key; null for a V2 light heartbeat).
FLAT_DECODED_FIELDS = [
    ("error", pa.string()), ("client_id", pa.string()), ("fingerprint", pa.int32()), ("without_sub", pa.bool_()),
    ("producer_groups", pa.list_(pa.string())), ("consumer_groups", pa.list_(pa.string())),
    ("consumer_sub_keys", pa.list_(pa.string())),
]
FLAT_DECODED_TYPE = pa.struct(FLAT_DECODED_FIELDS)


def flat_decoded_frame(bodies: List[bytes], dedupe_bodies: bool = True):
    """Decode bodies into a pandas DataFrame of FLAT_DECODED_FIELDS (one row per body)."""
    import pandas as pd

    if dedupe_bodies:
        ids, uniq = dedupe(bodies)
    else:
        ids, uniq = np.arange(len(bodies)), bodies
    batch = _decode(uniq)
    h, p, c, s = batch.heartbeats, batch.producers, batch.consumers, batch.subscriptions
    n = len(batch)
    producers = [[] for _ in range(n)]
    for row, group in zip(p["row"].tolist(), p["group"]):
        producers[row].append(group)
    groups = [[] for _ in range(n)]
    keys = [[] for _ in range(n)]
    without = h["without_sub"]
    topic, etype, sstr = s["topic"], s["expression_type"], s["sub_string"]
    s_lo = 0
    for row, group, k in zip(c["row"].tolist(), c["group"], c["n_subscriptions"].tolist()):
        groups[row].append(group)
        keys[row].append(None if without[row] else subscription_key(topic[s_lo:s_lo + k], etype[s_lo:s_lo + k],
                                                                   sstr[s_lo:s_lo + k]))
        s_lo += k
    ok = h["ok"]
    fingerprint = pd.array(np.where(ok, h["fingerprint"], 0), dtype="Int32")
    fingerprint[~ok] = pd.NA
    without_sub = pd.array(h["without_sub"], dtype="boolean")
    without_sub[~ok] = pd.NA
    return pd.DataFrame({
        "error": h["error"][ids], "client_id": h["client_id"][ids], "fingerprint": fingerprint.take(ids),
        "without_sub": without_sub.take(ids), "producer_groups": object_array(producers)[ids],
        "consumer_groups": object_array(groups)[ids], "consumer_sub_keys": object_array(keys)[ids],
    })


def object_array(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def heartbeat_batches(split: Split, max_rows: int = 65536, dedupe_bodies: bool = True,
                      on_corrupt: str = "skip") -> Iterator[pa.RecordBatch]:
    """The split's records with decoded heartbeats (HEARTBEAT_SCHEMA)."""
    cols = read_split(split, on_corrupt)
    if not len(cols):
        return
    rec = record_columns(cols)[:-1]
    dec = decode_bodies(cols.bodies(), dedupe_bodies)
    batch = pa.RecordBatch.from_arrays(rec + dec.flatten(), schema=HEARTBEAT_SCHEMA)
    for start in range(0, len(cols), max_rows):
        yield batch.slice(start, max_rows)


# ---------------------------------------------------------------------------------------------------------------
# the scan's pre-aggregation


def subscription_key(topics, expression_types, sub_strings) -> str:
    """Same canonical text as engine.recording.scan_py.subscription_key, from column values."""
    triples = {(t or "", e or "TAG", x or "") for t, e, x in zip(topics, expression_types, sub_strings)}
    return json.dumps(sorted(list(t) for t in triples), separators=(",", ":"), ensure_ascii=False)


def _body_entries(batch):
    """Per distinct body: its client index, and its observations as (body, role, group, key) entry columns."""
    h, p, c, s = batch.heartbeats, batch.producers, batch.consumers, batch.subscriptions
    n = len(batch)
    valid = h["ok"] & np.array([x is not None for x in h["client_id"]], dtype=bool)
    e_body, e_role, e_group, e_key = [], [], [], []
    vidx = np.flatnonzero(valid)
    e_body.extend(vidx.tolist())
    e_role.extend(["client"] * len(vidx))
    e_group.extend([""] * len(vidx))
    e_key.extend([None] * len(vidx))
    for row, group in zip(p["row"].tolist(), p["group"]):
        if valid[row]:
            e_body.append(row)
            e_role.append("producer")
            e_group.append(group or "")
            e_key.append(None)
    s_lo = 0
    topic, etype, sstr = s["topic"], s["expression_type"], s["sub_string"]
    without = h["without_sub"]
    for row, group, k in zip(c["row"].tolist(), c["group"], c["n_subscriptions"].tolist()):
        if valid[row]:
            e_body.append(row)
            e_role.append("consumer")
            e_group.append(group or "")
            e_key.append(None if without[row] else subscription_key(topic[s_lo:s_lo + k], etype[s_lo:s_lo + k],
                                                                     sstr[s_lo:s_lo + k]))
        s_lo += k
    order = np.argsort(np.array(e_body, dtype=np.int64), kind="stable")
    return valid, n, (np.array(e_body, dtype=np.int64)[order], np.array(e_role, dtype=object)[order],
                      np.array(e_group, dtype=object)[order], np.array(e_key, dtype=object)[order])


def _stats_batch(n_bad: int, recv: np.ndarray) -> pa.RecordBatch:
    lo = int(recv.min()) if len(recv) else None
    hi = int(recv.max()) if len(recv) else None
    return pa.RecordBatch.from_arrays(
        [pa.array([STATS_ROLE]), pa.array([""]), pa.array([""]), pa.array([0], pa.int64()),
         pa.array([None], pa.string()), pa.array([lo], pa.int64()), pa.array([hi], pa.int64()),
         pa.array([n_bad], pa.int64())],
        schema=RUN_SCHEMA,
    )


def columns_runs(cols: SplitColumns, params: ScanParams = ScanParams(), dedupe_bodies: bool = True) -> List[pa.RecordBatch]:
    """Runs (RUN_SCHEMA) of one split's columns, plus its STATS_ROLE row."""
    ids, uniq = dedupe(cols.bodies())
    return runs_from_ids(cols.recv_ms, cols.conn_id, ids, uniq, params, dedupe_bodies)


def runs_from_ids(recv_ms: np.ndarray, conn_id: np.ndarray, ids: np.ndarray, uniq: List[bytes],
                  params: ScanParams = ScanParams(), dedupe_bodies: bool = True,
                  cuts: Optional[dict] = None, conn_cuts: Optional[dict] = None) -> List[pa.RecordBatch]:
    """Runs of records given as receive times, connections and ids into the list of distinct bodies.
    ``cuts``: {client_id: sorted ms} (a capture's UNREGISTER_CLIENT requests): a run of a client also ends before
    its first record after an unregister (one at or after the previous record); merge_run_batches / Spark's
    merge_runs join back the pieces of the groups the client did not unregister. ``conn_cuts``: {conn_id: ms} (a
    capture's first FIN / RST per connection): a run also ends before its connection's first record after that
    end (one at or after the previous record: heartbeats on a half-closed connection)."""
    n = len(recv_ms)
    if n == 0:
        return [_stats_batch(0, recv_ms)]
    if dedupe_bodies:
        batch = _decode(uniq)
    else:  # decode every body (the cost being measured), keep the first of each distinct one
        full = _decode([uniq[i] for i in ids.tolist()])
        first = np.zeros(len(uniq), np.int64)
        first[ids[::-1]] = np.arange(n - 1, -1, -1)
        batch = _take_batch(full, first)
    valid, _, (e_body, e_role, e_group, e_key) = _body_entries(batch)
    rec_ok = valid[ids]
    n_bad = int(n - rec_ok.sum())
    # client of each record (interned), to order records the way the scan defines: client, time, connection
    client_ids = batch.heartbeats["client_id"]
    intern: dict = {}
    body_client = np.fromiter((intern.setdefault(x, len(intern)) if v else -1 for x, v in zip(client_ids, valid)),
                              dtype=np.int64, count=len(valid))
    keep = np.flatnonzero(rec_ok)
    recv, conn, bid = recv_ms[keep], conn_id[keep], ids[keep]
    cl = body_client[bid]
    order = np.lexsort((bid, conn, recv, cl))
    recv, conn, bid, cl = recv[order], conn[order], bid[order], cl[order]
    m = len(recv)
    if m == 0:
        return [_stats_batch(n_bad, recv_ms)]
    brk = np.ones(m, dtype=bool)
    brk[1:] = (cl[1:] != cl[:-1]) | (conn[1:] != conn[:-1]) | (bid[1:] != bid[:-1]) | (
        recv[1:] - recv[:-1] > params.split_ms)
    for c, times in (cuts or {}).items():
        k = intern.get(c)
        if k is None or not len(times):
            continue
        lo, hi = np.searchsorted(cl, k, "left"), np.searchsorted(cl, k, "right")
        if hi - lo > 1:
            brk[lo + 1:hi] |= _cut_between(np.asarray(times, np.int64), recv[lo:hi - 1], recv[lo + 1:hi])
    if conn_cuts:
        brk[1:] |= _conn_cut(conn_cuts, conn[1:], recv[:-1], recv[1:])
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], m) - 1
    r_first, r_last, r_n = recv[starts], recv[ends], ends - starts + 1
    r_conn, r_body = conn[starts], bid[starts]
    # expand each record run into the observations of its body
    e_lo = np.searchsorted(e_body, r_body, side="left")
    e_cnt = np.searchsorted(e_body, r_body, side="right") - e_lo
    rep = np.repeat(np.arange(len(starts)), e_cnt)
    eix = np.arange(int(e_cnt.sum())) - np.repeat(np.cumsum(e_cnt) - e_cnt, e_cnt) + np.repeat(e_lo, e_cnt)
    client_of_body = np.array(client_ids, dtype=object)
    out = pa.RecordBatch.from_arrays(
        [pa.array(e_role[eix], pa.string()), pa.array(e_group[eix], pa.string()),
         pa.array(client_of_body[e_body[eix]], pa.string()), pa.array(r_conn[rep], pa.int64()),
         pa.array(e_key[eix], pa.string()), pa.array(r_first[rep], pa.int64()), pa.array(r_last[rep], pa.int64()),
         pa.array(r_n[rep], pa.int64())],
        schema=RUN_SCHEMA,
    )
    return [out, _stats_batch(n_bad, recv_ms)]


def _take_batch(batch, rows: np.ndarray):
    """Rows of a HeartbeatBatch (with their child rows), renumbered; used only by the no-dedupe mode."""
    from engine.codec.heartbeat import HeartbeatBatch

    h, p, c, s = batch.heartbeats, batch.producers, batch.consumers, batch.subscriptions
    new_row = np.full(len(batch), -1, np.int64)
    new_row[rows] = np.arange(len(rows))
    pk = np.flatnonzero(new_row[p["row"]] >= 0) if len(p["row"]) else np.zeros(0, np.int64)
    ck = np.flatnonzero(new_row[c["row"]] >= 0) if len(c["row"]) else np.zeros(0, np.int64)
    sk = np.flatnonzero(new_row[s["row"]] >= 0) if len(s["row"]) else np.zeros(0, np.int64)
    # keep child rows grouped by their new parent order
    pk = pk[np.argsort(new_row[p["row"][pk]], kind="stable")]
    ck = ck[np.argsort(new_row[c["row"][ck]], kind="stable")]
    sk = sk[np.argsort(new_row[s["row"][sk]], kind="stable")]
    new_consumer = np.full(len(c["row"]), -1, np.int64)
    new_consumer[ck] = np.arange(len(ck))
    hh = {k: v[rows] for k, v in h.items()}
    pp = {k: v[pk] for k, v in p.items()}
    pp["row"] = new_row[p["row"][pk]].astype(np.int32)
    cc = {k: v[ck] for k, v in c.items()}
    cc["row"] = new_row[c["row"][ck]].astype(np.int32)
    ss = {k: v[sk] for k, v in s.items()}
    ss["row"] = new_row[s["row"][sk]].astype(np.int32)
    ss["consumer"] = new_consumer[s["consumer"][sk]].astype(np.int32)
    return HeartbeatBatch(hh, pp, cc, ss)


def split_runs(split: Split, params: ScanParams = ScanParams(), dedupe_bodies: bool = True,
               on_corrupt: str = "skip") -> List[pa.RecordBatch]:
    """The scan's pre-aggregated runs of one split (RUN_SCHEMA), plus its STATS_ROLE row."""
    recv, conn, ids, uniq = read_split_ids(split, on_corrupt)
    return runs_from_ids(recv, conn, ids, uniq, params, dedupe_bodies)


def _cut_between(times: np.ndarray, prev_last: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per pair: is there a time in ``times`` (sorted) at or after ``prev_last`` and before ``first``?"""
    k = np.searchsorted(times, prev_last, "left")
    return (k < len(times)) & (times[np.minimum(k, len(times) - 1)] < first)


def _conn_cut(conn_cuts: dict, conn: np.ndarray, prev_last: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per pair (on one connection): does the connection's end (``conn_cuts``: {conn_id: ms}) fall at or after
    ``prev_last`` and before ``first``?"""
    keys = np.array(sorted(conn_cuts), np.int64)
    if not len(conn) or not len(keys):
        return np.zeros(len(conn), dtype=bool)
    ends = np.array([conn_cuts[k] for k in keys.tolist()], np.int64)
    k = np.minimum(np.searchsorted(keys, conn), len(keys) - 1)
    return (keys[k] == conn) & (ends[k] >= prev_last) & (ends[k] < first)


def merge_run_batches(batches: List[pa.RecordBatch], params: ScanParams = ScanParams(),
                      cuts: Optional[dict] = None, conn_cuts: Optional[dict] = None) -> List[pa.RecordBatch]:
    """Merge runs of consecutive splits (in time order) the way ``merge_runs`` in Spark would, so a task emits
    fewer rows. Only merges what the Spark merge merges too: neighbours in the order (member, first_ms,
    conn_id, sub_key nulls first) with the same connection and the same raw sub_key (two light runs next to
    each other carry the same set), at most the split threshold apart, and (``cuts``: {(client_id, role, group):
    sorted ms}, a capture's UNREGISTER_CLIENT requests) with no unregister of that member at or after the first
    run's last heartbeat and before the second's first (``conn_cuts``: {conn_id: ms}, a capture's first FIN / RST
    per connection: nor that connection's end). Statistics rows are summed."""
    if not batches:
        return []
    t = pa.Table.from_batches(batches, schema=RUN_SCHEMA).combine_chunks()
    role = np.array(t.column("role").to_pylist(), dtype=object)
    is_stats = role == STATS_ROLE
    out = []
    if is_stats.any():
        st = t.filter(pa.array(is_stats))
        first = [v for v in st.column("first_ms").to_pylist() if v is not None]
        last = [v for v in st.column("last_ms").to_pylist() if v is not None]
        out.append(pa.RecordBatch.from_arrays(
            [pa.array([STATS_ROLE]), pa.array([""]), pa.array([""]), pa.array([0], pa.int64()),
             pa.array([None], pa.string()), pa.array([min(first) if first else None], pa.int64()),
             pa.array([max(last) if last else None], pa.int64()),
             pa.array([sum(st.column("n").to_pylist())], pa.int64())], schema=RUN_SCHEMA))
    t = t.filter(pa.array(~is_stats))
    m = t.num_rows
    if m == 0:
        return out
    group = np.array(t.column("group").to_pylist(), dtype=object)
    client = np.array(t.column("client_id").to_pylist(), dtype=object)
    member_key = role[~is_stats] + "\x00" + group + "\x00" + client
    _, member = np.unique(member_key, return_inverse=True)
    keys = t.column("sub_key").to_pylist()
    has_key = np.array([k is not None for k in keys])
    key_rank = np.full(m, -1, np.int64)
    if has_key.any():
        _, ranks = np.unique(np.array([k for k in keys if k is not None], dtype=object), return_inverse=True)
        key_rank[has_key] = ranks.reshape(-1)
    conn = t.column("conn_id").to_numpy()
    first = t.column("first_ms").to_numpy()
    last = t.column("last_ms").to_numpy()
    n = t.column("n").to_numpy()
    order = np.lexsort((key_rank, conn, first, member.reshape(-1)))
    mem, cn, kr, fs, ls = member.reshape(-1)[order], conn[order], key_rank[order], first[order], last[order]
    joins = np.zeros(m, dtype=bool)
    joins[1:] = (mem[1:] == mem[:-1]) & (cn[1:] == cn[:-1]) & (kr[1:] == kr[:-1]) & (fs[1:] - ls[:-1] <= params.split_ms)
    if cuts:
        ro, go, co = role[~is_stats][order], group[order], client[order]
        for (c, r, g), times in cuts.items():
            at = np.flatnonzero(joins & (co == c) & (ro == r) & (go == g))
            if len(at) and len(times):
                joins[at] &= ~_cut_between(np.asarray(times, np.int64), ls[at - 1], fs[at])
    if conn_cuts:
        joins[1:] &= ~_conn_cut(conn_cuts, cn[1:], ls[:-1], fs[1:])
    starts = np.flatnonzero(~joins)
    keep = order[starts]
    merged = t.take(pa.array(keep))
    out.append(pa.RecordBatch.from_arrays(
        [merged.column("role").combine_chunks(), merged.column("group").combine_chunks(),
         merged.column("client_id").combine_chunks(), merged.column("conn_id").combine_chunks(),
         merged.column("sub_key").combine_chunks(), pa.array(np.minimum.reduceat(fs, starts), pa.int64()),
         pa.array(np.maximum.reduceat(ls, starts), pa.int64()), pa.array(np.add.reduceat(n[order], starts), pa.int64())],
        schema=RUN_SCHEMA))
    return out


def splits_runs(splits: List[Split], params: ScanParams = ScanParams(), dedupe_bodies: bool = True,
                on_corrupt: str = "skip") -> List[pa.RecordBatch]:
    """Runs of consecutive splits (one Spark task's share), merged across the splits: task_runs, or with
    dedupe_bodies=False every body decoded (split by split, then merged)."""
    if dedupe_bodies:
        return task_runs(splits, params, on_corrupt)
    batches = []
    for split in splits:
        batches.extend(split_runs(split, params, dedupe_bodies, on_corrupt))
    return merge_run_batches(batches, params)


# ---------------------------------------------------------------------------------------------------------------
# the scan task: whole blocks through the compiled scanner, one pass over the records for the member runs


class BlockScannerPy:
    """Pure-Python twin of ``engine.recording._segment.BlockScanner`` (same columns, same body ids, same errors)."""

    def __init__(self):
        self._deduper = BodyDeduperPy()
        self._conn_index: dict = {}
        self._recv, self._conn, self._ids = [], [], []

    @property
    def bodies(self) -> List[bytes]:
        return self._deduper.bodies

    @property
    def n_records(self) -> int:
        return sum(len(x) for x in self._recv)

    def add_block(self, raw, n_records: int, first_ms: int, last_ms: int, where: str = "block") -> None:
        from engine.recording.recorder import Block

        raw = bytes(raw)
        if n_records < 0 or n_records > (len(raw) - 8) // 29:
            raise SegmentError(f"{where}: block of {n_records} records needs {n_records * 29 + 8} bytes, "
                               f"payload has {len(raw)}")
        b = Block(raw, n_records, where)
        if n_records and (int(b.recv_ms.min()) != first_ms or int(b.recv_ms.max()) != last_ms):
            raise SegmentError(f"{where}: receive times disagree with the block header")
        dense = np.fromiter((self._conn_index.setdefault(c, len(self._conn_index)) for c in b.conn_id.tolist()),
                            np.int64, n_records)
        self._ids.append(self._deduper.add(dense, np.ascontiguousarray(b.body_offsets, np.int32), b.body_data))
        self._recv.append(b.recv_ms.astype(np.int64))
        self._conn.append(b.conn_id.astype(np.int64))

    def columns(self):
        if not self._recv:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32)
        return (np.concatenate(self._recv), np.concatenate(self._conn),
                np.concatenate(self._ids).astype(np.int32))


def member_runs_py(recv, conn, ids, body_client, entry_offsets, entry_member, entry_key, n_clients, n_members,
                   split_ms):
    """Pure-Python twin of ``engine.recording._segment.member_runs`` (same results, same None when out of order)."""
    n = len(recv)
    if not (len(conn) == len(ids) == n):
        raise ValueError("recv, conn and ids differ in length")
    n_bodies = len(body_client)
    if len(entry_offsets) != n_bodies + 1 or len(entry_key) != len(entry_member):
        raise ValueError("entry tables do not match the bodies")
    if n_clients < 0 or n_members < 0 or split_ms < 0:
        raise ValueError("negative table size or split_ms")
    eo = [int(x) for x in entry_offsets]
    if eo[0] != 0 or eo[-1] != len(entry_member):
        raise ValueError("entry offsets must run from 0 to the number of entries")
    for i in range(n_bodies):
        if eo[i + 1] < eo[i]:
            raise ValueError(f"entry offsets descend at {i + 1}")
        if not -1 <= body_client[i] < n_clients:
            raise ValueError(f"body {i}: client {body_client[i]} out of range")
    em, ek = [int(x) for x in entry_member], [int(x) for x in entry_key]
    for e in range(len(em)):
        if not (0 <= em[e] < n_members and ek[e] >= -1):
            raise ValueError(f"entry {e}: member or key out of range")
    for i, b in enumerate(ids.tolist() if hasattr(ids, "tolist") else ids):
        if not 0 <= b < n_bodies:
            raise ValueError(f"record {i}: body id {b} out of range")
    last_of_client: dict = {}
    open_run: dict = {}  # member -> [conn, key, first, last, n]
    out = []
    n_bad = 0
    bc = [int(x) for x in body_client]
    for t, c, b in zip(np.asarray(recv).tolist(), np.asarray(conn).tolist(), np.asarray(ids).tolist()):
        cl = bc[b]
        if cl < 0:
            n_bad += 1
            continue
        prev = last_of_client.get(cl)
        if prev is not None and (t < prev[0] or (t == prev[0] and (c < prev[1] or (c == prev[1] and b != prev[2])))):
            return None
        last_of_client[cl] = (t, c, b)
        for e in range(eo[b], eo[b + 1]):
            m, key = em[e], ek[e]
            r = open_run.get(m)
            if r is not None and r[0] == c and r[1] == key and 0 <= t - r[3] <= split_ms:
                r[3] = t
                r[4] += 1
                continue
            if r is not None:
                out.append((m, *r))
            open_run[m] = [c, key, t, t, 1]
    out.extend((m, *open_run[m]) for m in sorted(open_run))
    cols = list(zip(*out)) if out else [()] * 6
    dtypes = (np.int32, np.int64, np.int32, np.int64, np.int64, np.int64)
    runs = tuple(np.array(col, dtype=dt) for col, dt in zip(cols, dtypes))
    recv = np.asarray(recv)
    return runs, (n_bad, int(recv.min()) if n else None, int(recv.max()) if n else None)


#: The compiled scanner and run builder when in use (engine.compiled_module), else the twins.
BlockScanner, member_runs = ((_segment.BlockScanner, _segment.member_runs) if _segment is not None
                             else (BlockScannerPy, member_runs_py))


#: Bytes of distinct heartbeat bodies a scan task holds at once. A record is at most the recorder's 4 MiB, but a
#: task's distinct bodies were not bounded (a client whose heartbeat differs every time made the task keep every
#: body of its splits). Past it the task analyses the records it holds as a task of their own would, starts again
#: with an empty store and merges the runs at the end (merge_run_batches: what Spark's merge joins across tasks),
#: so memory stays bounded and the findings are the same.
MAX_TASK_BODY_BYTES = 256 << 20


def scan_blocks(splits, scanner=None, on_corrupt: str = "skip", timings: Optional[dict] = None):
    """Read, check and decompress the blocks of splits, one block at a time, into a BlockScanner (a corrupt
    block is skipped with a warning, or raises with on_corrupt="raise"). ``timings`` (a dict) gets the seconds
    spent reading files ("read"), checking and decompressing ("decompress") and scanning records ("scan")."""
    for scanner in scan_block_chunks(splits, on_corrupt, timings, max_body_bytes=-1, scanner=scanner):
        pass
    return scanner


def scan_block_chunks(splits, on_corrupt: str = "skip", timings: Optional[dict] = None,
                      max_body_bytes: Optional[int] = None, scanner=None):
    """``scan_blocks`` in chunks: yields the BlockScanner once its distinct bodies pass ``max_body_bytes``
    (default MAX_TASK_BODY_BYTES; -1: never) and goes on with a new one; the last one at the end."""
    from engine.recording.recorder import decompress_payload, iter_payloads

    if on_corrupt not in ("raise", "skip"):
        raise ValueError("on_corrupt must be 'raise' or 'skip'")
    budget = MAX_TASK_BODY_BYTES if max_body_bytes is None else int(max_body_bytes)
    scanner = scanner if scanner is not None else BlockScanner()
    held = seen = 0  # bytes of the scanner's distinct bodies, and how many of them were counted
    clock = time.perf_counter
    t_read = t_decompress = t_scan = 0.0
    for split in splits:
        payloads = iter_payloads(split.path, split.blocks)
        while True:
            t0 = clock()
            item = next(payloads, None)
            t1 = clock()
            t_read += t1 - t0
            if item is None:
                break
            info, payload, where = item
            try:
                # decompressed blocks are dropped one by one: the allocator hands the next one warm pages
                raw = decompress_payload(info, payload, where)
                t2 = clock()
                t_decompress += t2 - t1
                scanner.add_block(raw, info.n_records, info.first_ms, info.last_ms, where)
                t_scan += clock() - t2
            except SegmentError:
                if on_corrupt == "raise":
                    raise
                _log.warning("skipping corrupt block %s", where, exc_info=True)
            raw = None
            if budget >= 0:
                bodies = scanner.bodies
                if len(bodies) > seen:
                    held += sum(map(len, bodies[seen:]))
                    seen = len(bodies)
                if held > budget:
                    yield scanner
                    scanner, held, seen = BlockScanner(), 0, 0
    if timings is not None:
        for k, v in (("read", t_read), ("decompress", t_decompress), ("scan", t_scan)):
            timings[k] = timings.get(k, 0.0) + v
    yield scanner


@dataclass
class EntryTables:
    """The observations of each distinct body, as integer tables for member_runs, and the names behind them."""

    body_client: np.ndarray     # int32 per body: client index, -1 for a bad body
    entry_offsets: np.ndarray   # int32, bodies + 1
    entry_member: np.ndarray    # int32 per entry
    entry_key: np.ndarray       # int32 per entry, -1 = no subscription set
    member_role: List[str]
    member_group: List[str]
    member_client: List[str]
    keys: List[str]
    n_clients: int
    #: some body lists one member twice with different sets: the same-instant order is then the sets' order,
    #: which one pass over the records does not follow (the caller sorts instead)
    ambiguous: bool = False


def entry_tables(batch) -> EntryTables:
    """EntryTables of a HeartbeatBatch (one row per distinct body)."""
    h, p, c, s = batch.heartbeats, batch.producers, batch.consumers, batch.subscriptions
    n = len(batch)
    client_ids = h["client_id"]
    ok = h["ok"]
    clients: dict = {}
    body_client = np.full(n, -1, np.int32)
    for i, cid in enumerate(client_ids):
        if ok[i] and cid is not None:
            body_client[i] = clients.setdefault(cid, len(clients))
    members: dict = {}
    keys: dict = {}
    key_cache: dict = {}
    e_body: list = []
    e_member: list = []
    e_key: list = []
    valid = body_client >= 0
    for i in np.flatnonzero(valid).tolist():
        e_body.append(i)
        e_member.append(members.setdefault(("client", "", int(body_client[i])), len(members)))
        e_key.append(-1)
    for row, group in zip(p["row"].tolist(), p["group"]):
        if valid[row]:
            e_body.append(row)
            e_member.append(members.setdefault(("producer", group or "", int(body_client[row])), len(members)))
            e_key.append(-1)
    topic, etype, sstr = s["topic"], s["expression_type"], s["sub_string"]
    without = h["without_sub"]
    s_lo = 0
    for row, group, k in zip(c["row"].tolist(), c["group"], c["n_subscriptions"].tolist()):
        if valid[row]:
            e_body.append(row)
            e_member.append(members.setdefault(("consumer", group or "", int(body_client[row])), len(members)))
            if without[row]:
                e_key.append(-1)
            else:
                raw_key = (tuple(topic[s_lo:s_lo + k]), tuple(etype[s_lo:s_lo + k]), tuple(sstr[s_lo:s_lo + k]))
                kid = key_cache.get(raw_key)
                if kid is None:
                    kid = key_cache[raw_key] = keys.setdefault(subscription_key(*raw_key), len(keys))
                e_key.append(kid)
        s_lo += k
    e_body_a = np.array(e_body, np.int64)
    order = np.argsort(e_body_a, kind="stable")
    e_member_a = np.array(e_member, np.int32)[order]
    e_key_a = np.array(e_key, np.int32)[order]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(e_body_a, minlength=n), out=offsets[1:])
    # a member twice in one body: fine with one set (a producer group listed twice), ambiguous with two
    pair = e_body_a[order].astype(np.int64) * max(1, len(members)) + e_member_a
    ambiguous = False
    if len(pair):
        srt = np.argsort(pair, kind="stable")
        same = pair[srt][1:] == pair[srt][:-1]
        ambiguous = bool(np.any(same & (e_key_a[srt][1:] != e_key_a[srt][:-1])))
    names = list(members)
    client_names = list(clients)
    return EntryTables(body_client, offsets, e_member_a, e_key_a, [m[0] for m in names], [m[1] for m in names],
                       [client_names[m[2]] for m in names], list(keys), len(clients), ambiguous)


def task_runs(splits, params: ScanParams = ScanParams(), on_corrupt: str = "skip",
              max_body_bytes: Optional[int] = None) -> List[pa.RecordBatch]:
    """The maximal member runs of one Spark task's splits (RUN_SCHEMA) and one STATS_ROLE row.

    Every block goes through the BlockScanner (records as three columns, each distinct body kept once across
    the task's splits, at most ``max_body_bytes`` of them at once: MAX_TASK_BODY_BYTES), the distinct bodies
    through the batch decoder, and the records once through member_runs. If some client's records are out of time
    order (or a body lists a member twice with two sets), the sorted per-split path gives the runs instead (same
    result, slower)."""
    clock = time.perf_counter
    t_start = clock()
    timings: dict = {}
    parts = [_scanner_runs(scanner, params, timings)
             for scanner in scan_block_chunks(splits, on_corrupt, timings, max_body_bytes)]
    out = parts[0] if len(parts) == 1 else merge_run_batches([b for p in parts for b in p], params)
    timings["chunks"] = len(parts)
    _report_timings(timings, clock() - t_start, rows=sum(b.num_rows for b in out))
    return out


def _scanner_runs(scanner, params: ScanParams, timings: dict) -> List[pa.RecordBatch]:
    """task_runs of the records one BlockScanner holds (timings: decode and runs seconds, records, bodies added)."""
    clock = time.perf_counter
    recv, conn, ids = scanner.columns()
    bodies = scanner.bodies
    t0 = clock()
    tables = entry_tables(_decode(bodies))
    t1 = clock()
    res = None
    if not tables.ambiguous:
        res = member_runs(recv, conn, ids, tables.body_client, tables.entry_offsets, tables.entry_member,
                          tables.entry_key, tables.n_clients, len(tables.member_role), params.split_ms)
    t2 = clock()
    for k, v in (("decode", t1 - t0), ("runs", t2 - t1), ("records", len(recv)), ("bodies", len(bodies))):
        timings[k] = timings.get(k, 0) + v
    timings["sorted_path"] = timings.get("sorted_path", False) or res is None
    if res is None:
        return merge_run_batches(runs_from_ids(recv, conn, ids.astype(np.int64), bodies, params), params)
    (member, r_conn, key, first, last, count), (n_bad, lo, hi) = res
    out = []
    if len(member):
        m = pa.array(member, pa.int32())
        k = pa.array(key, pa.int32(), mask=key < 0)
        out.append(pa.RecordBatch.from_arrays(
            [pa.array(tables.member_role, pa.string()).take(m), pa.array(tables.member_group, pa.string()).take(m),
             pa.array(tables.member_client, pa.string()).take(m), pa.array(r_conn, pa.int64()),
             pa.array(tables.keys, pa.string()).take(k), pa.array(first, pa.int64()), pa.array(last, pa.int64()),
             pa.array(count, pa.int64())], schema=RUN_SCHEMA))
    out.append(pa.RecordBatch.from_arrays(
        [pa.array([STATS_ROLE]), pa.array([""]), pa.array([""]), pa.array([0], pa.int64()),
         pa.array([None], pa.string()), pa.array([lo], pa.int64()), pa.array([hi], pa.int64()),
         pa.array([n_bad], pa.int64())], schema=RUN_SCHEMA))
    timings["arrow"] = timings.get("arrow", 0.0) + clock() - t2
    return out


#: Environment variable naming a file to which every task_runs call appends its stage timings as a JSON line
#: (bench/bench_scan.py sets it; executors on the bench's machine inherit it).
TIMINGS_ENV = "RMQHB_TASK_TIMINGS"


def _report_timings(timings: dict, total: float, **extra) -> None:
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), "total": round(total, 4), **extra,
                       **{k: round(v, 4) if isinstance(v, float) else v for k, v in timings.items()}})
    with open(path, "a") as f:
        f.write(line + "\n")

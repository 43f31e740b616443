"""Packet captures on Spark: the reader (``read_pcaps``), the capture's events, and ``rmqhb scan`` over captures.

A *capture* is one pcap / pcapng file (gzip allowed) or a directory of rotated files of one capture (``tcpdump -C``
/ ``-G``: every capture file in it, in the order of their first packet's time). One Spark task per capture feeds
its files through ``engine.recording._pcap.CaptureDecoder`` (twin ``engine.recording._pcap_py``): TCP reassembly per connection,
remoting frames of both directions, resynchronisation after what the capture missed (see the twin's docstring).

Data frames::

    records  recv_ms, conn_id, remote_addr, language, version, body      read_pcaps (mapInArrow): the recording
             reader's frame (RECORD_SCHEMA), one row per HEART_BEAT request, so every recording analysis runs on it
    events   capture, ms, conn_id, kind (open, fin, rst, unregister, notify), addr (the client's), by (client or
             server), client_id, producer_group, consumer_group                read_capture_events (mapInArrow)

``scan(spark, paths)`` runs the recording scan's analyses over the records (runs pre-aggregated per task, as the
recording scan's arrow method does), with what a capture adds to them: a member leaves at its connection's FIN /
RST or its UNREGISTER_CLIENT (group sizes, inconsistent subscriptions), and a client seen leaving before its expiry
is no expired client (engine.recording.scan_py.member_left / departure); it adds ``capture``: files, packet and reassembly
statistics, unregisters, connection ends, the broker's NOTIFY_CONSUMER_IDS_CHANGED pushes per group, and what
the capture missed (each loss also listed as damage, so heartbeat gaps over it move to ``gaps_over_data_loss``).
"""
from __future__ import annotations

import bisect
import functools
import gzip
import heapq
import itertools
import json
import os
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from engine import compiled_module
from engine.bindings.gzinput import BoundedGzip
from engine.recording import _pcap_py as twin
from engine.recording._pcap_py import STAT_NAMES, CaptureError, conn_hash
from engine.recording.scan_py import FINDING_KEYS, ScanParams, deviating_members, separate_data_loss

try:
    from engine.recording._pcap import CaptureDecoder as _NativeDecoder
except ImportError:  # not built
    _NativeDecoder = None

#: first bytes of the capture formats (pcap µs / ns in both byte orders, pcapng section header)
MAGICS = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x0a\x0d\x0d\x0a")
GZIP_MAGIC = b"\x1f\x8b"
#: bytes read from a capture file at a time
CHUNK_BYTES = 8 << 20
#: records per Arrow batch a task emits (a batch of heartbeats is ~10 MB: small enough for the allocator to reuse)
BATCH_RECORDS = 16384
#: ... and at most about this many bytes of bodies and addresses (a batch's records are taken once they pass it;
#: with the reader's max_record_bytes a batch stays under 2^31 bytes, the Arrow offsets' limit, whatever the file)
BATCH_BYTES = 64 << 20
#: losses listed one by one in findings.json (all are counted)
MAX_LISTED = 200
#: events (connection opens and ends, unregisters, notifies) and losses a capture task keeps; past it the rest are
#: counted (events_dropped, named as damage with their time range), not kept
MAX_EVENTS = 500_000
#: connections with heartbeats a capture task reads (each costs its address and time span in the task, in the
#: summary it sends and on the driver for the scan's life: ~1 KB at the driver's peak); past it the heartbeats of
#: further connections are not read: counted (heartbeats_untracked) and named as damage with their time range. A
#: long capture has unboundedly many connections over time; the reader's max_connections bounds those it keeps at once
MAX_CAPTURE_CONNECTIONS = 500_000
CAPTURE_ROLE = "_capture"  # rows of a scan task that carry its capture's summary (sub_key = JSON)

EVENT_FIELDS = ("ms", "conn_id", "kind", "addr", "by", "client_id", "producer_group", "consumer_group")


def decoder_class(native: Optional[bool] = None):
    """The compiled decoder unless ENGINE_NO_EXTENSIONS is set or it is not built (native=False: the twin)."""
    if native is None:
        native = compiled_module("_pcap") is not None
    if native and _NativeDecoder is None:
        raise ImportError("engine.recording._pcap is not built")
    return _NativeDecoder if native else twin.CaptureDecoder


# ---------------------------------------------------------------------------------------------------------------
# files and captures


def _head(path: Path, n: int = 4) -> bytes:
    with open(path, "rb") as f:
        head = f.read(max(n, 2))
        if head[:2] == GZIP_MAGIC:
            try:
                with gzip.open(path, "rb") as g:
                    return g.read(n)
            except (OSError, EOFError):
                return b""
    return head[:n]


def is_capture_file(path) -> bool:
    """A pcap or pcapng file (gzipped or not), by its first bytes."""
    p = Path(path)
    try:
        return p.is_file() and _head(p) in MAGICS
    except OSError:
        return False


def _first_ms(path: Path) -> int:
    """Time of a file's first packet (ms; 0 if unknown): orders rotated files. Read by the capture reader over the
    file's first 64 KiB, so a packet stamped outside the sane window (damage) does not order the file."""
    dec = decoder_class()()
    try:
        with _open(path) as f:
            dec.feed(f.read(1 << 16))
    except (OSError, EOFError, zlib.error, ValueError):
        pass  # the packets before the damage count
    return max(dec.first_packet_ms, 0)


@dataclass
class Capture:
    name: str
    files: List[str] = field(default_factory=list)
    #: (n, i): this reader takes the connections whose 4-tuple hashes to i modulo n (see CaptureDecoder)
    shard: tuple = (1, 0)
    #: the capture's place among the inputs (its connection ids' salt, see capture_salt)
    index: int = 0


#: statistics every shard of a capture counts alike (each reads every packet): merged from one shard only
PACKET_STATS = ("files", "packets", "tcp_packets", "non_tcp_packets", "unsupported_link_packets", "ip_fragments",
                "truncated_packets", "malformed_packets", "filtered_packets", "truncated_file_tails",
                "bad_time_packets", "time_jump_packets")


def plan_captures(paths, shards: int = 1) -> List[Capture]:
    """One Capture per file given, one per directory (its capture files, oldest first); with ``shards`` > 1 each
    is read by that many tasks, each taking its share of the connections (every task reads the whole file)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)  # read twice below: a generator gave no names the second time, so zip dropped every capture
    if shards < 1:
        raise ValueError("shards must be >= 1")
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            files = [f for f in sorted(p.iterdir()) if is_capture_file(f)]
            if not files:
                raise FileNotFoundError(f"no pcap or pcapng files in {p}")
            files.sort(key=lambda f: (_first_ms(f), f.name))
            out.append(Capture(p.name, [str(f) for f in files]))
        elif p.exists():
            if not is_capture_file(p):
                raise CaptureError(f"{p}: not a pcap or pcapng file at byte 0")
            out.append(Capture(p.name, [str(p)]))
        else:
            raise FileNotFoundError(f"no such capture file or directory: {p}")
    names = unique_names([Path(p) for p in paths])
    files = [Path(f).resolve() for c in out for f in c.files]
    if len(set(files)) != len(files):  # a file given alone and inside a directory given: read (and counted) twice
        raise CaptureError("a capture file is given twice (alone and in a directory given): "
                           + ", ".join(sorted({str(f) for f in files if files.count(f) > 1})))
    return [Capture(name, c.files, (shards, i), k) for k, (c, name) in enumerate(zip(out, names))
            for i in range(shards)]


def unique_names(paths: Sequence[Path]) -> List[str]:
    """Each input's name: its base name, or as many of its last path parts as tell it from the other inputs
    (``h1/capture.pcap`` and ``h2/capture.pcap``): the name keys a capture's shards when they are merged, so two
    inputs must never share one. The same input given twice is refused."""
    real = [p.resolve() for p in paths]
    if len(set(real)) != len(real):
        raise CaptureError("a capture file or directory is given twice: "
                         + ", ".join(sorted({str(p) for p in real if real.count(p) > 1})))
    full = [Path(os.path.abspath(p)) for p in paths]  # named as given (a link keeps its own name)
    names = [p.name for p in full]
    for depth in range(2, max((len(p.parts) for p in full), default=1) + 1):
        dup = {n for n in names if names.count(n) > 1}
        if not dup:
            break
        names = ["/".join(p.parts[-depth:]) if n in dup else n for n, p in zip(names, full)]
    return names


def looks_like_captures(paths) -> bool:
    """True when every input is a capture file or a directory holding capture files (and no recording)."""
    paths = list(paths)
    for p in map(Path, paths):
        if p.is_dir():
            if any(p.glob("*.seg")) or not any(is_capture_file(f) for f in p.iterdir()):
                return False
        elif not is_capture_file(p):
            return False
    return bool(paths)


def _open(path):
    """A capture file's bytes (a gzip one's within gzinput's budget of decompressed bytes: ``over`` past it)."""
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    return BoundedGzip(path) if gz else open(path, "rb")


# ---------------------------------------------------------------------------------------------------------------
# decoding (no Spark: what the tasks run, and what the tests call)


@dataclass
class CaptureResult:
    """What one capture gave besides its records."""

    name: str
    files: List[str]
    stats: dict
    events: list
    losses: list
    damaged: list  # files whose structure broke: {"file", "offset"/"reason"}
    shard: tuple = (1, 0)
    #: the first and last time (ms) the capture shows (its first and last packet, its records and events); None:
    #: it has no packet
    first_ms: Optional[int] = None
    last_ms: Optional[int] = None
    #: {conn_id: [client address, first ms, last ms, last heartbeat / UNREGISTER_CLIENT ms or None, the one before
    #: it or None]} of the connections it shows (continued_connections, broker_restarts)
    conns: dict = field(default_factory=dict)
    #: {kind: [first ms, last ms]} of what the reader's budgets left unread (CaptureDecoder.damage_times)
    damage_times: dict = field(default_factory=dict)


def merge_shards(results: Sequence[CaptureResult]) -> List[CaptureResult]:
    """One CaptureResult per capture from its shards' (disjoint connections; packet statistics from one shard)."""
    by: dict = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    out = []
    for name, parts in by.items():
        parts.sort(key=lambda r: r.shard[1])
        if len(parts) == 1:
            out.append(parts[0])
            continue
        stats = merge_stats([r.stats for r in parts])
        for k in PACKET_STATS:
            stats[k] = parts[0].stats.get(k, 0)
        firsts = [r.first_ms for r in parts if r.first_ms is not None]
        lasts = [r.last_ms for r in parts if r.last_ms is not None]
        out.append(CaptureResult(name, parts[0].files, stats,
                                 sorted((e for r in parts for e in r.events), key=lambda e: (e[0], e[1], e[2])),
                                 sorted((lo for r in parts for lo in r.losses), key=lambda lo: (lo[3], lo[0])),
                                 parts[0].damaged, (1, 0), min(firsts, default=None), max(lasts, default=None),
                                 {c: v for r in parts for c, v in r.conns.items()},
                                 merge_damage_times([r.damage_times for r in parts])))
    return out

def merge_damage_times(parts: Sequence[dict]) -> dict:
    out: dict = {}
    for times in parts:
        for kind, (a, b) in times.items():
            t = out.setdefault(kind, [a, b])
            t[0], t[1] = min(t[0], a), max(t[1], b)
    return out


def capture_salt(index: int) -> int:
    """What the connection ids of the ``index``-th capture among the inputs are XORed with: 0 for the first (a
    capture read alone keeps the decoder's ids), a 63-bit hash of the index for the others. The decoder's id is the
    4-tuple's hash and its generation within the capture, so the same 4-tuple in two captures (a client port used
    again in a later capture of the same broker) got the same id, and the scan took two connections for one (their
    opens and closes merged). XOR keeps a capture's ids distinct and its shards' ids equal; two captures' ids meet
    only by a 63-bit collision."""
    return conn_hash(b"capture" + index.to_bytes(8, "little"), 0) if index else 0


def iter_capture(capture: Capture, *, native: Optional[bool] = None, ports=None, batch_records: int = BATCH_RECORDS,
                 chunk_bytes: int = CHUNK_BYTES, batch_bytes: int = BATCH_BYTES, max_events: int = MAX_EVENTS,
                 max_capture_connections: int = MAX_CAPTURE_CONNECTIONS, events_out: Optional[list] = None,
                 **decoder_options) -> Iterator:
    """Yields the capture's records (dicts of columns, see CaptureDecoder.take) as they come, at most
    ``batch_records`` or about ``batch_bytes`` at a time, then its CaptureResult. A file whose structure breaks is
    reported in ``damaged`` and the next file is read. Connection ids are the capture's own
    (:func:`capture_salt`). At most ``max_events`` events and losses are kept (the rest counted: events_dropped),
    and the heartbeats of at most ``max_capture_connections`` connections (the first ones to send one; the rest
    counted: heartbeats_untracked). ``events_out``: the list the events are appended to as they come (the
    result's ``events``)."""
    if max_capture_connections < 1:
        raise ValueError("max_capture_connections >= 1 required")
    dec = decoder_class(native)(ports=ports, shard=capture.shard, **decoder_options)
    events, losses, damaged = ([] if events_out is None else events_out), [], []
    dropped = [0, None, None]  # events and losses not kept: count, first ms, last ms
    untracked = [0, None, None]  # heartbeats of connections past max_capture_connections: count, first ms, last ms
    salt = capture_salt(capture.index)
    # conn_id -> [client address, first ms, last ms, last two heartbeat or unregister ms] of its records and events:
    # the connections with heartbeats (at most max_capture_connections, ``tracked``) and those with events only (at
    # most max_events)
    conns: dict = {}
    tracked: set = set()

    def seen(conn, addr, first, last, *client):  # client: its heartbeat / unregister times (the last two)
        info = conns.get(conn)
        if info is None:
            info = conns[conn] = [addr, first, last, None, None]
        else:
            info[0] = info[0] or addr
            info[1], info[2] = min(info[1], first), max(info[2], last)
        for t in client:  # the last two distinct ones: broker_restarts reads a connection's heartbeat before the
            if t is None or t == info[3] or t == info[4]:  # one a restarted host's reset answered
                continue
            if info[3] is None or t > info[3]:
                info[3], info[4] = t, info[3]
            elif info[4] is None or t > info[4]:
                info[4] = t

    def drain():
        rec, ev, lo = dec.take()
        conn = rec["conn_id"] = rec["conn_id"] ^ np.int64(salt)
        room = max(max_events - len(events) - len(losses), 0)
        if len(ev) + len(lo) > room:
            cut_ev, cut_lo = ev[room:], lo[max(room - len(ev), 0):]
            ev, lo = ev[:room], lo[:max(room - len(ev), 0)]
            times = [e[0] for e in cut_ev] + [x[4] for x in cut_lo]
            dropped[0] += len(cut_ev) + len(cut_lo)
            dropped[1] = min(times + ([dropped[1]] if dropped[1] is not None else []))
            dropped[2] = max(times + ([dropped[2]] if dropped[2] is not None else []))
        ev = [(e[0], e[1] ^ salt) + tuple(e[2:]) for e in ev]
        events.extend(ev)
        losses.extend((x[0] ^ salt,) + tuple(x[1:]) for x in lo)
        if len(conn):
            uniq, first = np.unique(conn, return_index=True)
            new = [c for _, c in sorted((i, c) for c, i in zip(uniq.tolist(), first.tolist()) if c not in tracked)]
            room = max_capture_connections - len(tracked)
            tracked.update(new[:room])  # the first to send a heartbeat
            if len(new) > room:
                keep = ~np.isin(conn, np.array(new[room:], np.int64))
                gone = rec["recv_ms"][~keep]
                untracked[0] += len(gone)
                lo_gone, hi_gone = int(gone.min()), int(gone.max())
                untracked[1] = lo_gone if untracked[1] is None else min(untracked[1], lo_gone)
                untracked[2] = hi_gone if untracked[2] is None else max(untracked[2], hi_gone)
                rec = take_records(rec, np.flatnonzero(keep))
                conn = rec["conn_id"]
        if len(conn):
            uniq, first, inverse = np.unique(conn, return_index=True, return_inverse=True)
            recv = rec["recv_ms"]
            lo_ms = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
            hi_ms = np.full(len(uniq), np.iinfo(np.int64).min, np.int64)
            np.minimum.at(lo_ms, inverse.reshape(-1), recv)
            np.maximum.at(hi_ms, inverse.reshape(-1), recv)
            below = np.full(len(uniq), np.iinfo(np.int64).min, np.int64)  # the last time before each one's last
            earlier = recv < hi_ms[inverse.reshape(-1)]
            np.maximum.at(below, inverse.reshape(-1)[earlier], recv[earlier])
            ao, ad = rec["addr_offsets"], rec["addr_data"]
            for c, i, a, b, p in zip(uniq.tolist(), first.tolist(), lo_ms.tolist(), hi_ms.tolist(), below.tolist()):
                seen(c, ad[ao[i]:ao[i + 1]].decode("utf-8", "replace"), a, b, b,
                     p if p > np.iinfo(np.int64).min else None)
        for e in ev:
            seen(e[1], e[3] or "", e[0], e[0], e[0] if e[2] == "unregister" else None)
        return rec

    for path in capture.files:
        try:
            with _open(path) as f:
                buf = bytearray(chunk_bytes)  # read into one buffer; what feed leaves (a cut record) moves to its start
                fill = 0
                while True:
                    if fill == len(buf):  # a record larger than the buffer
                        buf.extend(bytes(len(buf)))
                    with memoryview(buf) as mv:
                        n = f.readinto(mv[fill:])
                        if not n:
                            if getattr(f, "over", False):  # a gzip bomb: the rest of the file is damage
                                damaged.append({"file": path, "reason": f"at byte {f.read_bytes:,}: {f.reason()}"})
                            dec.end_file(fill)
                            break
                        fill += n
                        used = dec.feed(mv[:fill])
                    if used:
                        buf[:fill - used] = buf[used:fill]
                        fill -= used
                    if dec.pending_records >= batch_records or dec.pending_record_bytes >= batch_bytes:
                        yield drain()
        except CaptureError as e:
            damaged.append({"file": path, "reason": str(e)})
            dec.end_file(0)
        except (OSError, EOFError, zlib.error) as e:  # e.g. a gzip file cut short, or its deflate data broken
            damaged.append({"file": path, "reason": f"{type(e).__name__}: {e}"})
            dec.end_file(0)
    dec.finish()
    rec = drain()
    if len(rec["recv_ms"]):
        yield rec
    # what the capture shows: from its first packet to its last (in file order), and every record and event
    times = [t for info in conns.values() for t in info[1:3]]
    times += [t for t in (dec.first_packet_ms, dec.last_packet_ms) if t >= 0]
    times += [t for t in untracked[1:] if t is not None]
    stats = dict(dec.stats, events_dropped=dropped[0], heartbeats_untracked=untracked[0])
    damage_times = {k: list(v) for k, v in dec.damage_times.items()}
    if dropped[0]:
        damage_times["events_dropped"] = dropped[1:]
    if untracked[0]:
        damage_times["heartbeats_untracked"] = untracked[1:]
    yield CaptureResult(capture.name, list(capture.files), stats, events, losses, damaged, capture.shard,
                        min(times, default=None), max(times, default=None), conns, damage_times)


def read_local(paths, *, native: Optional[bool] = None, ports=None, shards: int = 1, **options):
    """(records as one dict of numpy columns, [CaptureResult]) of captures, without Spark."""
    parts, results = [], []
    for cap in plan_captures(paths, shards):
        for item in iter_capture(cap, native=native, ports=ports, **options):
            (results if isinstance(item, CaptureResult) else parts).append(item)
    return concat_records(parts), merge_shards(results)


def concat_records(parts) -> dict:
    if not parts:
        z = np.zeros(0, np.int64)
        return {"recv_ms": z, "conn_id": z.copy(), "version": np.zeros(0, np.int32), "language": np.zeros(0, np.uint8),
                "addr_offsets": np.zeros(1, np.int32), "addr_data": b"", "body_offsets": np.zeros(1, np.int32),
                "body_data": b""}
    if len(parts) == 1:
        return parts[0]
    from .segments import _concat_offsets

    return {"recv_ms": np.concatenate([p["recv_ms"] for p in parts]),
            "conn_id": np.concatenate([p["conn_id"] for p in parts]),
            "version": np.concatenate([p["version"] for p in parts]),
            "language": np.concatenate([p["language"] for p in parts]),
            "addr_offsets": _concat_offsets([p["addr_offsets"] for p in parts]),
            "addr_data": b"".join(p["addr_data"] for p in parts),
            "body_offsets": _concat_offsets([p["body_offsets"] for p in parts]),
            "body_data": b"".join(p["body_data"] for p in parts)}


def take_records(rec: dict, rows: np.ndarray) -> dict:
    """The records ``rows`` (ascending indices) of a record dict."""
    out = {k: rec[k][rows] for k in ("recv_ms", "conn_id", "version", "language")}
    for offsets, data in (("addr_offsets", "addr_data"), ("body_offsets", "body_data")):
        o, d = rec[offsets], rec[data]
        starts, ends = o[rows].tolist(), o[rows + 1].tolist()
        out[offsets] = np.zeros(len(rows) + 1, o.dtype)
        np.cumsum(np.subtract(ends, starts, dtype=np.int64), out=out[offsets][1:])
        out[data] = b"".join(d[a:b] for a, b in zip(starts, ends))
    return out


def split_columns(rec: dict):
    """A record dict as the recording reader's SplitColumns."""
    from .segments import SplitColumns

    return SplitColumns(rec["recv_ms"], rec["conn_id"], rec["version"], rec["language"], rec["addr_offsets"],
                        rec["addr_data"], rec["body_offsets"], rec["body_data"])


def record_batch(rec: dict):
    """A record dict as an Arrow batch of RECORD_SCHEMA (the recording reader's records)."""
    import pyarrow as pa

    from .segments import RECORD_SCHEMA, record_columns

    return pa.RecordBatch.from_arrays(record_columns(split_columns(rec)), schema=RECORD_SCHEMA)


def records_iter(rec_dicts) -> Iterator[tuple]:
    """(recv_ms, conn_id, remote_addr, language, version, body) tuples, as engine.recording.scan_py.scan_records takes."""
    from engine.codec.enums import LanguageCode

    for rec in rec_dicts:
        ao, bo, ad, bd = rec["addr_offsets"], rec["body_offsets"], rec["addr_data"], rec["body_data"]
        for i in range(len(rec["recv_ms"])):
            lang = int(rec["language"][i])
            yield (int(rec["recv_ms"][i]), int(rec["conn_id"][i]), ad[ao[i]:ao[i + 1]].decode("utf-8", "replace"),
                   LanguageCode(lang) if lang in LanguageCode._value2member_map_ else None, int(rec["version"][i]),
                   bd[bo[i]:bo[i + 1]])


# ---------------------------------------------------------------------------------------------------------------
# summaries


def merge_stats(stats: Sequence[dict]) -> dict:
    out = dict.fromkeys(STAT_NAMES, 0)
    for s in stats:
        for k, v in s.items():
            out[k] = out.get(k, 0) + v
    return out


def capture_summary(results: Sequence[CaptureResult]) -> dict:
    """The ``capture`` section of a scan's findings."""
    stats = merge_stats([r.stats for r in results])
    events = [e for r in results for e in r.events]
    losses = [(r.name,) + tuple(lo) for r in results for lo in r.losses]
    ends = Counter((e[2], e[4]) for e in events if e[2] in ("fin", "rst"))
    notify = defaultdict(list)
    for e in events:
        if e[2] == "notify":
            notify[e[7] or ""].append(e[0])
    unregisters = sorted(({"ms": e[0], "client_id": e[5], "addr": e[3], "producer_group": e[6],
                           "consumer_group": e[7]} for e in events if e[2] == "unregister"),
                         key=lambda r: (r["ms"], r["client_id"] or ""))
    return {
        "captures": [{"name": r.name, "files": r.files, "first_ms": r.first_ms, "last_ms": r.last_ms}
                     for r in results],
        "stats": stats,
        "connections_opened": sum(1 for e in events if e[2] == "open"),
        "connection_ends": {f"{kind}_by_{by}": n for (kind, by), n in sorted(ends.items())},
        "unregisters": unregisters[:MAX_LISTED],
        "unregister_count": len(unregisters),
        "notifications": [{"group": g, "notifies": len(ts), "first_ms": min(ts), "last_ms": max(ts)}
                          for g, ts in sorted(notify.items())],
        "losses": [{"capture": c, "conn_id": cid, "addr": addr, "direction": d, "first_ms": a, "last_ms": b,
                    "bytes": n} for c, cid, addr, d, a, b, n in losses[:MAX_LISTED]],
        "loss_count": len(losses),
        "damaged_files": [d for r in results for d in r.damaged],
        "continued": continued_captures(results),
        "limits": limit_damage(results),
    }


#: what each budget of the capture reader leaves unread, as the report names it (engine.recording._pcap_py's budgets)
LIMIT_REASONS = {
    "bad_time_packets": "{n:,} packets stamped outside the sane time window (before 2000 or after the scan's "
                        "time + 1 day) not read: their times are damage, not events",
    "time_jump_packets": "{n:,} packets stamped more than a day before or after the packets around them in their file "
                         "not read: their times are damage, not events",
    "records_too_large": "{n:,} heartbeat / unregister / notify frames over the reader's max_record_bytes not read",
    "connections_evicted": "{n:,} open connections closed out at the reader's max_connections (their later "
                           "packets read as new connections)",
    "buffers_shed": "{n:,} connection directions emptied at the reader's max_buffered_bytes ({b:,} bytes: holes "
                    "lost, frames cut)",
    "events_dropped": "{n:,} connection events and losses past the scan's limit of MAX_EVENTS per capture task not "
                      "kept",
    "heartbeats_untracked": "{n:,} heartbeats of connections past the scan's --max-capture-connections per capture "
                            "task not read (raise it, or give more --shards)",
}


def limit_damage(results: Sequence[CaptureResult]) -> List[dict]:
    """Per capture and budget: what the reader's budgets left unread ({capture, kind, count, bytes, first_ms,
    last_ms}; times None where unknown, as for packets whose time stamp is the damage)."""
    out = []
    for r in results:
        for kind in LIMIT_REASONS:
            n = r.stats.get(kind, 0)
            if n:
                a, b = r.damage_times.get(kind, (None, None))
                out.append({"capture": r.name, "kind": kind, "count": n,
                            "bytes": r.stats.get("buffer_shed_bytes", 0) if kind == "buffers_shed" else 0,
                            "first_ms": a, "last_ms": b})
    return out


def continued_captures(results: Sequence[CaptureResult]) -> List[dict]:
    """The captures whose connections seem to continue an earlier capture's (continued_connections), with how
    many: rotated files of one capture given one by one instead of as their directory."""
    mapping = continued_connections(results)
    if not mapping:
        return []
    owner = {c: r.name for r in results for c in r.conns}
    pairs = Counter((owner[c], owner.get(root, "?")) for c, root in mapping.items())
    return [{"capture": a, "continues": b, "connections": n} for (a, b), n in sorted(pairs.items())]


def connection_events(results: Sequence[CaptureResult]) -> dict:
    """{conn_id: {"open": ms, "end": [ms, how]}} of the connections whose SYN (``open``) or first FIN / RST the
    captures saw (``how``: ``fin_by_client``, ``rst_by_server``, ...): the flapping clients' connect and close
    marks (engine.recording.scan_py.connection_marks)."""
    out: dict = {}
    for r in results:
        for e in sorted(r.events, key=lambda x: (x[0], x[1])):
            if e[2] == "open":
                out.setdefault(e[1], {}).setdefault("open", e[0])
            elif e[2] in ("fin", "rst"):
                out.setdefault(e[1], {}).setdefault("end", [e[0], f"{e[2]}_by_{e[4]}"])
    return out


#: A broker stop in a capture: every connection open at that moment (two or more) ended by the broker's side within
#: this window (a stopping broker closes its channels; a killed one's kernel does).
RESTART_WINDOW_MS = 2_000
#: How a capture saw a broker restart (``broker_boots`` rows' ``seen``).
RESTART_SEEN_CLOSES = "the broker closed its connections"
RESTART_SEEN_SILENT = "new connections, none surviving"
#: The channel expiry a capture's restart rule takes when not given one (ScanParams.expiry_s's default): a
#: connection silent longer than this is no channel of the broker any more, so no restart ends it.
RESTART_EXPIRY_MS = 120_000


def broker_restarts(results: Sequence[CaptureResult], expiry_ms: int = RESTART_EXPIRY_MS) -> List[dict]:
    """The broker restarts a capture shows (``broker_boots`` rows, as a log's): :func:`restart_scan`'s rows."""
    return restart_scan(results, expiry_ms)[0]


def restart_scan(results: Sequence[CaptureResult], expiry_ms: int = RESTART_EXPIRY_MS) -> Tuple[List[dict], dict]:
    """(``broker_boots`` rows, {conn_id: (ms, silent)} of the connections each ended) of a capture's broker restarts,
    seen two ways (``seen``):

    * the broker closed its connections (:func:`_closed_restarts`): a time when every connection of the capture
      open then -- two or more -- was ended by the server's FIN / RST within ``RESTART_WINDOW_MS``;
    * new connections, none surviving (:func:`_silent_restarts`): its host died without a close on the wire (a
      crash, a power loss), the clients' old connections went silent (or got a reset from the new host later) and
      they came back on new ones.

    ``start_ms`` is the first connection opened after it (the broker accepting again), None if none. A broker that
    starts has no channels: its members' intervals end at those closes already (member_left), or, when silent, at
    the restart (:func:`restart_events` gives those connections that end). The driver's step, shared by the local
    and the Spark scans."""
    out, ended = [], {}
    for r in results:
        ends = connection_events([r])
        opens = sorted(int(e["open"]) for e in ends.values() if e.get("open") is not None)
        for rows, conns in (_closed_restarts(r, ends, opens), _silent_restarts(r, ends, opens, expiry_ms)):
            out += rows
            ended.update(conns)
    return sorted(out, key=lambda x: (x["broker"], x["stopped_ms"])), ended


def _holding(bounds, t) -> int:
    """How many of the intervals ([lo...], [hi...], both sorted) hold t (lo <= t <= hi; each with hi < t has lo < t)."""
    return bisect.bisect_right(bounds[0], t) - bisect.bisect_left(bounds[1], t)


def _restart_row(r, t, start, n, seen) -> dict:
    return {"broker": r.name, "start_ms": start, "ready_ms": None, "name": None, "addr": None, "stopped_ms": t,
            "members_ended": None, "clients_ended": n, "seen": seen}


def _closed_restarts(r: CaptureResult, ends: dict, opens: list) -> Tuple[List[dict], dict]:
    """Restarts seen as the broker closing every connection open then (two or more) within RESTART_WINDOW_MS."""
    out, ended = [], {}
    server_ends = sorted({int(e["end"][0]) for e in ends.values()
                          if e.get("end") is not None and str(e["end"][1]).endswith("_by_server")})
    # A connection is live at t when first < t <= its end (no end: from first on); a stop at t needs two or
    # more live and none of them "bad" (not ended by the server by t + RESTART_WINDOW_MS). Both are counted
    # as intervals of t holding t (sorted bounds, bisect): O(n log n), not server ends x connections (a
    # capture of 8,000 connections each reset by the server took 30 s)
    live, bad, by_server = ([], []), ([], []), []  # ([lo], [hi]) of the intervals; (first, end, conn) of server ends
    for c, v in r.conns.items():
        first, end = int(v[1]), (ends.get(c) or {}).get("end")
        if end is None:
            spans = [(live, float("inf")), (bad, float("inf"))]
        elif str(end[1]).endswith("_by_server"):
            spans = [(live, int(end[0])), (bad, int(end[0]) - RESTART_WINDOW_MS - 1)]
            by_server.append((first, int(end[0]), c))
        else:
            spans = [(live, int(end[0])), (bad, int(end[0]))]
        for (los, his), hi in spans:
            if first + 1 <= hi:
                los.append(first + 1)
                his.append(hi)
    for bounds in (live, bad):
        bounds[0].sort()
        bounds[1].sort()
    by_server.sort()
    firsts = [f for f, _, _ in by_server]
    last_end = list(itertools.accumulate((e for _, e, _ in by_server), max))  # of the server ends opened so far
    by_end = sorted((e, f, c) for f, e, c in by_server)  # the connections each stop ended: a pointer over these
    i = 0
    after = -1
    for t in server_ends:
        if t <= after:
            continue
        n = _holding(live, t)
        if n < 2 or _holding(bad, t):
            continue
        # every one opened before t ended by the server before t or within [t, t + window] (else it were a
        # bad live one): the last of their ends is the live ones'
        after = last_end[bisect.bisect_left(firsts, t) - 1]
        while i < len(by_end) and by_end[i][0] <= after:
            e, f, c = by_end[i]
            if e >= t and f < t:
                ended[c] = (e, False)
            i += 1
        k = bisect.bisect_right(opens, after)
        out.append(_restart_row(r, t, opens[k] if k < len(opens) else None, n, RESTART_SEEN_CLOSES))
    return out, ended


def _silent_restarts(r: CaptureResult, ends: dict, opens: list, expiry_ms: int) -> Tuple[List[dict], dict]:
    """Restarts whose closes the capture did not see (the broker's host crashed or lost power: no FIN / RST of the
    old process): a time t when two or more connections with a heartbeat (or UNREGISTER_CLIENT) less than the expiry
    before t went silent -- nothing at or after t, or only the new host's reset more than RESTART_WINDOW_MS after
    t, answering their next packet (a heartbeat it answered within RESTART_WINDOW_MS is not counted: the one before
    it is the connection's last) -- with no connection surviving across t, and a new connection (its SYN) at or
    after t. A connection survives t when it was opened before t and sent a heartbeat or UNREGISTER_CLIENT at or
    after t (not one such a reset answered), has anything at all at or after t when it did not end, or was closed
    by the server at or after t otherwise than by such a late reset (the old process alive). t is the first such time: one past the last packet before the silence (the crash itself is not on the
    wire, it came after). A client reconnecting alone is no restart (the others survive), nor is a silence the
    capture ends in (no new connection). Each connection has one silence interval and one or two survival
    intervals, counted with sorted bounds: O(n log n)."""
    out, ended = [], {}
    survive, silent = ([], []), []  # survive: ([lo], [hi]); silent: (lo, hi, conn) of the times t it is silent at
    for c, v in r.conns.items():
        first, last, active = int(v[1]), int(v[2]), (v[3] if len(v) > 3 else None)
        end = (ends.get(c) or {}).get("end")
        how, e = (str(end[1]), int(end[0])) if end is not None else ("", None)
        if how == "rst_by_server" and active is not None and active >= e - RESTART_WINDOW_MS:
            # the new host's reset answered this heartbeat: the one before it is the connection's last to the
            # old process (none: no member of its)
            active = v[4] if len(v) > 4 else None
        spans = []
        if end is None:
            spans.append((first + 1, last))
        elif active is not None:
            spans.append((first + 1, int(active)))
        if how == "fin_by_server":
            spans.append((first + 1, e))
        elif how == "rst_by_server":
            spans.append((max(first + 1, e - RESTART_WINDOW_MS), e))
        for lo, hi in spans:
            if lo <= hi:
                survive[0].append(lo)
                survive[1].append(hi)
        if active is None:  # no heartbeat: no member of the broker's to end
            continue
        if end is None:
            lo, hi = last + 1, int(active) + expiry_ms - 1
        elif how == "rst_by_server":
            lo, hi = int(active) + 1, min(int(active) + expiry_ms - 1, e - RESTART_WINDOW_MS - 1)
        else:
            continue
        if lo <= hi:
            silent.append((lo, hi, c))
    survive[0].sort()
    survive[1].sort()
    silent.sort()
    # the first t of a restart is where a silence begins, a survival ends, or just after the last restart's start
    times = sorted({lo for lo, _, _ in silent} | {hi + 1 for hi in survive[1]})
    live: list = []  # heap of (hi, conn) of the silent intervals begun by t
    i = j = 0
    after, pending = -1, None  # pending: the time just after the last restart's start
    while j < len(times) or pending is not None:
        if pending is not None and (j == len(times) or pending <= times[j]):
            t, pending = pending, None
        else:
            t = times[j]
            j += 1
        if t <= after:
            continue
        while i < len(silent) and silent[i][0] <= t:
            heapq.heappush(live, (silent[i][1], silent[i][2]))
            i += 1
        while live and live[0][0] < t:
            heapq.heappop(live)
        if len(live) < 2 or _holding(survive, t):
            continue
        k = bisect.bisect_left(opens, t)
        if k == len(opens):
            continue
        for _, c in live:
            ended[c] = (t, True)
        out.append(_restart_row(r, t, opens[k], len(live), RESTART_SEEN_SILENT))
        live, after, pending = [], opens[k], opens[k] + 1
    return out, ended


def restart_events(results: Sequence[CaptureResult], expiry_ms: int = RESTART_EXPIRY_MS) -> Tuple[dict, List[dict]]:
    """(conn_events, broker_boots) of captures, for the scans: :func:`connection_events` where each connection a
    restart ended carries ``restart`` (its ms: a client's next connection after it is no reconnect, as in a log),
    and one whose end the capture did not see (a silent restart) ends there: ``end`` = [ms, "broker_restart"] (its
    members end at the restart: not an expiry, not a vanished client)."""
    conn_events = connection_events(results)
    rows, ended = restart_scan(results, expiry_ms)
    for c, (t, silent) in ended.items():
        e = conn_events.setdefault(c, {})
        e["restart"] = t
        if silent:
            e["end"] = [t, "broker_restart"]
    return conn_events, rows


def unregister_times(results: Sequence[CaptureResult]) -> dict:
    """{(client_id, role, group): [ms, ...]} of the captures' UNREGISTER_CLIENT requests (its producerGroup for the
    producer role, its consumerGroup for the consumer role): when the broker removed those members
    (engine.recording.scan_py.member_left / departure)."""
    out: dict = defaultdict(list)
    for r in results:
        for e in r.events:
            if e[2] == "unregister" and e[5]:
                for role, group in (("producer", e[6]), ("consumer", e[7])):
                    if group:
                        out[(e[5], role, group)].append(int(e[0]))
    return {k: sorted(v) for k, v in out.items()}


def loss_damage(summary: dict) -> List[dict]:
    """What the capture missed, as damage entries of the report (scan.corrupt): heartbeat gaps over these time
    ranges are not client silence."""
    out = [{"segment": f"{lo['capture']} {lo['addr']} {lo['direction']}", "kind": "capture_loss", "offset": 0,
            "bytes": lo["bytes"], "first_ms": lo["first_ms"], "last_ms": lo["last_ms"], "records_lost": None,
            "reason": f"the capture missed {lo['bytes']} bytes of connection {lo['conn_id']}"}
           for lo in summary["losses"]]
    out += [{"segment": Path(d["file"]).name, "kind": "capture_file", "offset": 0, "bytes": 0, "first_ms": None,
             "last_ms": None, "records_lost": None, "reason": d["reason"]} for d in summary["damaged_files"]]
    out += [{"segment": lim["capture"], "kind": "capture_limit", "offset": 0, "bytes": lim["bytes"],
             "first_ms": lim["first_ms"], "last_ms": lim["last_ms"],
             "records_lost": lim["count"] if lim["kind"] in ("records_too_large", "heartbeats_untracked") else None,
             "reason": LIMIT_REASONS[lim["kind"]].format(n=lim["count"], b=lim["bytes"])}
            for lim in summary.get("limits", [])]
    return out


def continued_connections(results: Sequence[CaptureResult]) -> dict:
    """{conn_id: the id of the earlier capture's connection it seems to continue} (captures in time order): a
    capture's first connection from a client address, seen without its SYN, where that address's connection was
    open (no FIN or RST) when the earlier captures ended. That is what rotated files given one by one look like:
    each file is its own capture, so its connections are read as new ones and a client seems to reconnect at every
    file (flapping). The scan does not join them (a client address alone does not prove it is the same
    connection); it names such captures (``capture.continued``) and the report says to give their directory."""
    out: dict = {}
    open_at_end: dict = {}  # client address -> the id of its connection open at the end of the captures so far
    for r in sorted((r for r in results if r.first_ms is not None), key=lambda r: (r.first_ms, r.name)):
        opened = {e[1] for e in r.events if e[2] == "open"}
        ended = {e[1] for e in r.events if e[2] in ("fin", "rst")}
        by_addr = defaultdict(list)
        for conn, (addr, first, last, *_) in r.conns.items():
            if addr:
                by_addr[addr].append((first, last, conn))
        for addr, cs in by_addr.items():
            cs.sort()
            head, tail = cs[0][2], cs[-1][2]
            if head not in opened and addr in open_at_end:
                out[head] = open_at_end[addr]
            if tail in ended:
                open_at_end.pop(addr, None)
            else:
                open_at_end[addr] = tail
    return out


def capture_holes(summary: dict) -> List[dict]:
    """The times between the captures that none of them shows (each capture shows the time from its first packet
    to its last): what clients did then is unknown, not silence."""
    spans = sorted((c["first_ms"], c["last_ms"], c["name"]) for c in summary["captures"]
                   if c.get("first_ms") is not None)
    holes: List[dict] = []
    if not spans:
        return holes
    _, hi, name_hi = spans[0]
    for first, last, name in spans[1:]:
        if first > hi + 1:
            seconds = (first - hi - 1) / 1000
            holes.append({"first_ms": hi + 1, "last_ms": first - 1, "after": name_hi, "before": name,
                          "reason": f"no capture shows the {seconds:.3f} s between {name_hi} and {name}"})
        if last > hi:
            hi, name_hi = last, name
    return holes


def _longest_seen(start: int, end: int, holes: List[dict]) -> int:
    """The longest part of [start, end] no hole covers (ms)."""
    best, at = 0, start
    for h in holes:  # in time order, not overlapping
        if h["last_ms"] < at or h["first_ms"] > end:
            continue
        best = max(best, h["first_ms"] - at)
        at = h["last_ms"] + 1
    return max(best, end - at)


def separate_not_captured(findings: dict, holes: List[dict], params: ScanParams) -> None:
    """Time no capture shows is not client silence (engine.recording.scan_py.separate_data_loss does this for
    damage): a heartbeat gap stays a finding only where a part of it the captures show is itself longer than the
    gap threshold (the silence is proven there; ``not_captured_s`` says how much of it no capture shows), else it
    moves to ``gaps_over_data_loss``; an expiry whose wait overlaps such a time moves to
    ``expired_over_data_loss``; group size changes within a hole and an expiry after it are marked. The holes are
    listed under ``scan.not_captured``."""
    findings.setdefault("scan", {})["not_captured"] = holes
    if not holes:
        return
    kept, over = [], findings.setdefault("gaps_over_data_loss", [])
    for gap in findings.get("heartbeat_gaps", []):
        hidden = sum(max(0, min(gap["end_ms"], h["last_ms"]) - max(gap["start_ms"], h["first_ms"]) + 1) for h in holes)
        if not hidden:
            kept.append(gap)
        elif _longest_seen(gap["start_ms"], gap["end_ms"], holes) > params.gap_ms:
            kept.append(dict(gap, not_captured_s=hidden / 1000))
        else:
            over.append(gap)
    findings["heartbeat_gaps"] = kept
    if "expired_clients" in findings:
        exp_kept, exp_over = [], findings.setdefault("expired_over_data_loss", [])
        for row in findings["expired_clients"]:
            hit = any(row["last_heartbeat_ms"] <= h["last_ms"] and row["expired_ms"] >= h["first_ms"] for h in holes)
            (exp_over if hit else exp_kept).append(row)
        findings["expired_clients"] = exp_kept
    for series in findings.get("group_sizes", []):
        n = sum(1 for t, _ in series["series"]
                if any(h["first_ms"] <= t <= h["last_ms"] + params.expiry_ms for h in holes))
        if n:
            series["changes_over_data_loss"] = series.get("changes_over_data_loss", 0) + n
    summary = findings.get("summary")
    if summary is not None:
        for key in ("heartbeat_gaps", "gaps_over_data_loss", "expired_clients", "expired_over_data_loss"):
            if key in findings:
                summary[key] = len(findings[key])


# ---------------------------------------------------------------------------------------------------------------
# Spark


def _plan_ids(spark, n: int):
    return spark.range(0, n, 1, numPartitions=max(1, n))


def _records_task(plan, native, options, batches):
    for batch in batches:
        for i in batch.column(0).to_pylist():
            for item in iter_capture(plan[i], native=native, **options):
                if not isinstance(item, CaptureResult) and len(item["recv_ms"]):
                    yield record_batch(item)


def read_pcaps(spark, paths, *, native: Optional[bool] = None, ports=None, shards: int = 1, **options):
    """The heartbeat records of packet captures as the recording reader's records frame (recv_ms, conn_id,
    remote_addr, language, version, body); one task per capture (file, or directory of rotated files), or
    ``shards`` tasks per capture, each with its share of the connections."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from .segments import RECORD_SCHEMA

    plan = plan_captures(paths, shards)
    fn = functools.partial(_records_task, plan, native, dict(options, ports=ports))
    return _plan_ids(spark, len(plan)).mapInArrow(fn, from_arrow_schema(RECORD_SCHEMA))


def events_schema():
    import pyarrow as pa

    return pa.schema([("capture", pa.string()), ("ms", pa.int64()), ("conn_id", pa.int64()), ("kind", pa.string()),
                      ("addr", pa.string()), ("by", pa.string()), ("client_id", pa.string()),
                      ("producer_group", pa.string()), ("consumer_group", pa.string())])


def _events_batch(name, events):
    import pyarrow as pa

    sch = events_schema()
    cols = [[name] * len(events)] + [list(c) for c in zip(*events)] if events else [[] for _ in sch]
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(cols, sch)], schema=sch)


def _events_task(plan, native, options, batches):
    for batch in batches:
        for i in batch.column(0).to_pylist():
            for item in iter_capture(plan[i], native=native, **options):
                if isinstance(item, CaptureResult) and item.events:
                    yield _events_batch(item.name, item.events)


def read_capture_events(spark, paths, *, native: Optional[bool] = None, ports=None, shards: int = 1,
                        **options):
    """Connection opens / ends, UNREGISTER_CLIENT requests and NOTIFY_CONSUMER_IDS_CHANGED pushes of captures."""
    from pyspark.sql.pandas.types import from_arrow_schema

    plan = plan_captures(paths, shards)
    fn = functools.partial(_events_task, plan, native, dict(options, ports=ports))
    return _plan_ids(spark, len(plan)).mapInArrow(fn, from_arrow_schema(events_schema()))


def capture_runs(capture: Capture, params: ScanParams, native: Optional[bool] = None,
                 unregisters: Optional[dict] = None, max_body_bytes: Optional[int] = None, **options):
    """The scan's runs (RUN_SCHEMA) of one capture's heartbeats, its STATS_ROLE row, and a CAPTURE_ROLE row with
    the capture's summary (JSON in sub_key). Runs end at the UNREGISTER_CLIENT requests this reader saw and at
    ``unregisters`` ({(client_id, role, group): sorted ms}: the whole capture's, for a shard, see
    :func:`recut_runs`). The distinct bodies held at once are at most ``max_body_bytes``
    (segments.MAX_TASK_BODY_BYTES): past it the records held so far become runs (cut at the unregisters and
    connection ends seen so far: a later packet is not stamped before them) and the store starts again; the runs
    are merged at the end."""
    import types

    import pyarrow as pa

    from .segments import MAX_TASK_BODY_BYTES, RUN_SCHEMA, BodyDeduper, merge_run_batches, runs_from_ids

    budget = MAX_TASK_BODY_BYTES if max_body_bytes is None else int(max_body_bytes)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    seen_events: list = []  # the reader's events so far

    def cuts_of(results):
        # a member's run ends at its UNREGISTER_CLIENT (the broker removed it; a later heartbeat adds it back), as
        # in the reference scan's live intervals (engine.recording.scan_py.member_left); Spark's merge_runs keeps
        # the cut. A shard sees only its connections' unregisters: one sent on another connection of the client
        # comes with ``unregisters`` in the scan's second step (recut_runs)
        member = unregister_times(results)
        for key, times in (unregisters or {}).items():
            member[key] = sorted(set(member.get(key, ())) | {int(t) for t in times})
        client: dict = defaultdict(list)
        for (c, _, _), times in member.items():
            client[c].extend(times)
        # and at its connection's first FIN / RST (this reader's connections: it saw their ends), so that a
        # heartbeat after it on a half-closed connection starts a new run, as scan_py.member_left has it
        ends = {c: int(e["end"][0]) for c, e in connection_events(results).items() if e.get("end") is not None}
        return member, {c: sorted(set(ts)) for c, ts in client.items()}, ends

    # batch by batch: only the distinct bodies (a client repeats its heartbeat) and three columns are kept
    result, recv, conns, ids, addrs, dense_of, parts = None, [], [], [], {}, {}, []
    d = BodyDeduper()
    held = counted = 0  # bytes of the store's distinct bodies, and how many of them were counted
    for item in iter_capture(capture, native=native, events_out=seen_events, **options):
        if isinstance(item, CaptureResult):
            result = item
            continue
        conn = item["conn_id"]
        uniq, first, inverse = np.unique(conn, return_index=True, return_inverse=True)
        ao, ad = item["addr_offsets"], item["addr_data"]
        for c, i in zip(uniq.tolist(), first.tolist()):
            if c not in dense_of:
                dense_of[c] = len(dense_of)
                addrs[c] = ad[ao[i]:ao[i + 1]].decode("utf-8", "replace")
        dense = np.array([dense_of[c] for c in uniq.tolist()], np.int64)[inverse.reshape(-1)]
        ids.append(np.asarray(d.add(np.ascontiguousarray(dense), np.ascontiguousarray(item["body_offsets"], np.int32),
                                    item["body_data"]), np.int64))
        recv.append(item["recv_ms"])
        conns.append(conn)
        if budget >= 0:
            if len(d.bodies) > counted:
                held += sum(map(len, d.bodies[counted:]))
                counted = len(d.bodies)
            if held > budget:  # the records so far become runs; the store starts again
                _, client_cuts, conn_cuts = cuts_of([types.SimpleNamespace(events=seen_events)])
                parts += runs_from_ids(cat(recv), cat(conns), cat(ids), d.bodies, params, cuts=client_cuts,
                                       conn_cuts=conn_cuts)
                recv, conns, ids, dense_of, d, held, counted = [], [], [], {}, BodyDeduper(), 0, 0
    member_cuts, client_cuts, conn_cuts = cuts_of([result] if result is not None else [])
    out = merge_run_batches(parts + runs_from_ids(cat(recv), cat(conns), cat(ids), d.bodies, params,
                                                  cuts=client_cuts, conn_cuts=conn_cuts),
                            params, cuts=member_cuts, conn_cuts=conn_cuts)
    payload = json.dumps({"name": result.name, "files": result.files, "stats": result.stats,
                          "events": result.events, "losses": result.losses, "damaged": result.damaged,
                          "shard": list(result.shard), "first_ms": result.first_ms, "last_ms": result.last_ms,
                          "conns": [[c] + v for c, v in result.conns.items()],
                          "damage_times": result.damage_times,
                          "addrs": [[c, a] for c, a in addrs.items()],
                          "clients": sorted({c for b in out for r, c in zip(b.column(0).to_pylist(),
                                                                           b.column(2).to_pylist())
                                             if r == "client"})})
    out.append(pa.RecordBatch.from_arrays(
        [pa.array([CAPTURE_ROLE]), pa.array([""]), pa.array([""]), pa.array([0], pa.int64()), pa.array([payload]),
         pa.array([None], pa.int64()), pa.array([None], pa.int64()), pa.array([0], pa.int64())], schema=RUN_SCHEMA))
    return out


def departed_out(runs, rows: list, conn_events: dict, unregisters: dict, params: ScanParams) -> Tuple[list, list]:
    """(expired_clients, vanished_clients) of merged runs: the expiry rows without the clients the capture saw leave
    before the expiry, those of them that vanished (split_departed), and the rest
    (engine.recording.scan_py.departure: their connection's FIN / RST, or UNREGISTER_CLIENT for each group they had at their
    last heartbeat; those groups read from the few candidates' runs ending at that heartbeat)."""
    from pyspark.sql import functions as F

    from engine.recording.scan_py import departure, split_departed

    if not rows or not (conn_events or unregisters):
        return rows, []
    at: dict = defaultdict(set)
    if unregisters:
        for r in runs.where(F.col("role").isin("consumer", "producer")
                            & F.col("client_id").isin(sorted({x["client_id"] for x in rows}))
                            & F.col("last_ms").isin(sorted({x["last_heartbeat_ms"] for x in rows}))) \
                .select("client_id", "role", "group", "last_ms").collect():
            at[(r["client_id"], int(r["last_ms"]))].add((r["role"], r["group"]))
    left = functools.partial(departure, conn_events, unregisters, lambda c, t: at.get((c, t), set()))
    # (expired, vanished): engine.recording.scan_py.split_departed, as the local scan
    return split_departed(rows, left, conn_events, unregisters, params.expiry_ms)


def _runs_task(plan, params, native, options, batches, unregisters=None):
    for batch in batches:
        for i in batch.column(0).to_pylist():
            yield from capture_runs(plan[i], params, native, unregisters, **options)


def _recut_task(plan, params, native, options, unregisters, batches):
    return _runs_task(plan, params, native, options, batches, unregisters)


def unseen_unregisters(results: Sequence[CaptureResult], task_clients: dict) -> bool:
    """Whether a task of a sharded capture (``results``: the tasks' own, before merge_shards) has runs of a client
    (``task_clients``: {(capture, shard): client ids}) that sent an UNREGISTER_CLIENT on another task's connection:
    only then can its runs miss a cut (recut_runs checks which)."""
    by: dict = defaultdict(list)
    for r in results:
        by[r.name].append(r)
    for parts in by.values():
        seen = [{tuple(e) for e in r.events if e[2] == "unregister" and e[5]} for r in parts]
        every = set().union(*seen)
        for r, mine in zip(parts, seen):
            clients = task_clients.get((r.name, tuple(r.shard)), ())
            if any(e[5] in clients for e in every - mine):
                return True
    return False


def recut_runs(spark, plan: Sequence[Capture], runs, task_conns: dict, unregisters: dict, unregister_frame,
               params: ScanParams, native: Optional[bool], options: dict):
    """The runs of a sharded scan (``runs``: every task's, CAPTURE_ROLE rows left out) with the capture's
    UNREGISTER_CLIENT requests applied across shards. A shard reads only its connections, so the unregisters it
    sees are those sent on them: a client that unregisters a group on another connection than the one it
    heartbeats that group on (another shard's) and heartbeats it again within the split threshold gets one run
    over the unregister. The unregisters of all shards (``unregisters``, few: collected on the driver and ordered
    by packet time; ``unregister_frame``: the same as capture_cuts' second frame) are joined to the runs by
    (client, role, group): a run with one at or after its first heartbeat and before its last holds such a
    pair of heartbeats (a shard that saw the unregister cut there). Only then are the shards holding those
    runs' connections (``task_conns``: {plan index: conn ids}) read again with every unregister as a cut
    (capture_runs), and those connections' runs replaced; the cut rule is the reference scan's
    (engine.recording.scan_py.member_left, millisecond packet times: an unregister at the millisecond of a
    heartbeat ends the member after that heartbeat), so the sharded scan equals the unsharded one."""
    from pyspark.sql import functions as F

    from . import analyses as sp

    if not unregisters or unregister_frame is None:
        return runs
    members = runs.where(F.col("role").isin("consumer", "producer"))
    u = F.broadcast(unregister_frame.select("client_id", "role", "group", "cut_ms"))
    over = {int(r["conn_id"]) for r in members.join(u, ["client_id", "role", "group"]).where(
        (F.col("cut_ms") >= F.col("first_ms")) & (F.col("cut_ms") < F.col("last_ms"))).select("conn_id")
        .distinct().collect()}
    if not over:
        return runs
    again = sorted(i for i, conns in task_conns.items() if over & conns)
    fn = functools.partial(_recut_task, [plan[i] for i in again], params, native, options, unregisters)
    fresh = _plan_ids(spark, len(again)).mapInArrow(fn, sp.RUN_STRUCT)
    mine = F.col("role").isin("client", "consumer", "producer") & F.col("conn_id").isin(sorted(over))
    return runs.where(~mine).unionByName(fresh.where(mine))


def scan(spark, paths, params: ScanParams = ScanParams(), *, native: Optional[bool] = None, ports=None,
         shards: int = 1, client_ids: bool = False, **options) -> dict:
    """Every recording analysis over the heartbeats of packet captures, plus the ``capture`` section (``shards``
    tasks per capture: see read_pcaps). ``client_ids``: also list the distinct clients (``_client_ids``, for
    combining several brokers' scans: :func:`combine_capture_brokers`)."""
    from pyspark.sql import functions as F

    from . import analyses as sp

    params.validate()
    t0 = time.perf_counter()
    plan = plan_captures(paths, shards)
    fn = functools.partial(_runs_task, plan, params, native, dict(options, ports=ports))
    raw = _plan_ids(spark, len(plan)).mapInArrow(fn, sp.RUN_STRUCT).persist()
    try:
        results, addrs, task_conns, task_clients = [], {}, {}, {}
        index = {(c.name, tuple(c.shard)): i for i, c in enumerate(plan)}
        for r in raw.where(F.col("role") == CAPTURE_ROLE).select("sub_key").collect():
            p = json.loads(r["sub_key"])
            addrs.update((int(c), a) for c, a in p["addrs"])
            if shards > 1:  # for recut_runs: which tasks hold a connection
                task_conns[index[(p["name"], tuple(p["shard"]))]] = {int(c) for c, _ in p["addrs"]}
            results.append(CaptureResult(p["name"], p["files"], p["stats"], [tuple(e) for e in p["events"]],
                                         [tuple(x) for x in p["losses"]], p["damaged"], tuple(p["shard"]),
                                         p["first_ms"], p["last_ms"], {int(c): v for c, *v in p["conns"]},
                                         p["damage_times"]))
            task_clients[(p["name"], tuple(p["shard"]))] = set(p["clients"])
        unseen = unseen_unregisters(results, task_clients)
        results = merge_shards(results)
        (conn_events, boots), unregisters = restart_events(results, params.expiry_ms), unregister_times(results)
        cuts = sp.capture_cuts(spark, conn_events, unregisters)
        unregister_frame = cuts[1] if cuts is not None and unregisters else None
        runs = raw.where(F.col("role") != CAPTURE_ROLE)
        if shards > 1 and unseen:
            runs = recut_runs(spark, plan, runs, task_conns, unregisters, unregister_frame, params, native,
                              dict(options, ports=ports))
        runs = runs.transform(sp.merge_runs(params, unregister_frame, cuts[0] if cuts is not None else None)).persist()
        try:
            stats = sp._stats(runs)
            stats.pop("runs")
            with sp.analysis_conf(spark, 1):
                findings = {
                    "inconsistent_subscriptions": sp._inconsistent_records(
                        sp._rows(runs.transform(sp.inconsistent_subscriptions(params, cuts)))),
                    "flapping_clients": sp.with_connection_marks(
                        runs, sp._flapping_records(sp._rows(runs.transform(sp.flapping_clients(
                            params, sorted(c for c, e in conn_events.items() if "restart" in e))))),
                        conn_events),
                    "heartbeat_gaps": sorted(sp._rows(runs.transform(sp.heartbeat_gaps(params)).select(
                        "client_id", "groups", "start_ms", "end_ms", "gap_s")), key=lambda r: (r["client_id"], r["start_ms"])),
                }
                members = sp._rows(runs.where(F.col("role").isin("consumer", "producer"))
                                   .groupBy("group", "role").agg(F.countDistinct("client_id").alias("members")))
                findings["group_sizes"] = sp._size_records(sp._rows(runs.transform(sp.group_sizes(params, cuts))),
                                                           members)
                findings["expired_clients"], findings["vanished_clients"] = departed_out(
                    runs, sp.expired_records(runs, params, stats["last_ms"], addrs), conn_events, unregisters, params)
                findings["member_addresses"] = sp.member_address_records(
                    runs, addrs, deviating_members(findings["inconsistent_subscriptions"]), params, conn_events,
                    unregisters)
                if client_ids:
                    findings["_client_ids"] = sorted(r[0] for r in runs.where(F.col("role") == "client")
                                                     .select("client_id").distinct().collect())
        finally:
            runs.unpersist()
    finally:
        raw.unpersist()
    findings["summary"] = {**stats, **{k: len(findings[k]) for k in FINDING_KEYS}}
    findings["parameters"] = {k: getattr(params, k) for k in ScanParams.__dataclass_fields__}
    summary = capture_summary(results)
    findings["capture"] = summary
    findings["broker_boots"] = boots
    damage = loss_damage(summary)
    findings["scan"] = {"method": "pcap", "captures": len(results), "tasks": len(plan),
                        "files": sum(len(r.files) for r in results),
                        "seconds": round(time.perf_counter() - t0, 3),
                        "reader": "native" if decoder_class(native) is _NativeDecoder else "twin",
                        "torn_tails": [], "corrupt": damage}
    separate_data_loss(findings, [], damage)
    separate_not_captured(findings, capture_holes(summary), params)
    return findings


def scan_local(paths, params: ScanParams = ScanParams(), *, native: Optional[bool] = None, client_ids: bool = False,
               **options) -> dict:
    """The reference findings (engine.recording.scan_py) over captures' heartbeats, with the same ``capture`` section."""
    from engine import decode_heartbeat
    from engine.recording.scan_py import scan_records

    rec, results = read_local(paths, native=native, **options)
    conn_events, boots = restart_events(results, params.expiry_ms)
    findings = scan_records(records_iter([rec]), params, conn_events, unregister_times(results))
    if client_ids:
        ids = set()
        for body in {r[5] for r in records_iter([rec])}:
            try:
                ids.add(decode_heartbeat(body).client_id)
            except ValueError:
                continue
        findings["_client_ids"] = sorted(i for i in ids if i is not None)
    summary = capture_summary(results)
    findings["capture"] = summary
    findings["broker_boots"] = boots
    damage = loss_damage(summary)
    findings["scan"] = {"torn_tails": [], "corrupt": damage}
    separate_data_loss(findings, [], damage)
    separate_not_captured(findings, capture_holes(summary), params)
    return findings


def combine_capture_brokers(per_broker: dict) -> dict:
    """One findings dict of several brokers' capture scans (``{broker: findings}`` of :func:`scan` or
    :func:`scan_local`, with ``client_ids=True``): the recording scans' combination (engine.recording.scan_py.combine_brokers:
    every row tagged with its broker, the summary summed with clients counted once, damage per broker, ``fleet``)
    and one ``capture`` section over all of them, its rows tagged with their broker."""
    from engine.recording.scan_py import combine_brokers

    out = combine_brokers(per_broker)
    caps = {b: f["capture"] for b, f in per_broker.items()}

    def tagged(key):
        return [{"broker": b, **r} for b, c in caps.items() for r in c[key]]

    ends: Counter = Counter()
    for c in caps.values():
        ends.update(c["connection_ends"])
    unregisters = sorted(tagged("unregisters"), key=lambda r: (r["ms"], r["client_id"] or "", r["broker"]))
    out["capture"] = {
        "brokers": list(caps),
        "captures": tagged("captures"),
        "stats": merge_stats([c["stats"] for c in caps.values()]),
        "connections_opened": sum(c["connections_opened"] for c in caps.values()),
        "connection_ends": dict(sorted(ends.items())),
        "unregisters": unregisters[:MAX_LISTED],
        "unregister_count": sum(c["unregister_count"] for c in caps.values()),
        "notifications": sorted(tagged("notifications"), key=lambda r: (r["group"], r["broker"])),
        "losses": tagged("losses")[:MAX_LISTED],
        "loss_count": sum(c["loss_count"] for c in caps.values()),
        "damaged_files": tagged("damaged_files"),
        "limits": tagged("limits"),
    }
    out["scan"].update({k: sum(sc.get(k, 0) for sc in out["scan"]["brokers"].values())
                        for k in ("captures", "tasks", "files")})
    out["scan"]["reader"] = next(iter(out["scan"]["brokers"].values())).get("reader")
    return out


def plan_brokers(specs: Sequence[str]) -> dict:
    """``{broker: [paths]}`` of ``--broker NAME=PATH`` options (a NAME given again adds a capture to it)."""
    out: dict = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--broker wants NAME=PATH, not {spec!r}")
        out.setdefault(name, []).append(Path(path))
    return out


# ---------------------------------------------------------------------------------------------------------------
# rmqhb scan CAPTURE... (bindings.cli.scan_main routes captures here: --format pcap, or inputs detected as captures)


def local_capture_scan(paths, params, *, shards: int = 1, client_ids: bool = False, **kw) -> dict:
    """scan_local with scan's ``scan`` section (what `rmqhb scan` runs in this process)."""
    from .scan_engine import no_clipped_count

    t0 = time.perf_counter()
    plan = plan_captures(paths, shards)
    findings = scan_local(paths, params, shards=shards, client_ids=client_ids, **kw)
    no_clipped_count(findings)
    findings["scan"] = {"method": "pcap", "captures": len(plan) // shards, "tasks": len(plan),
                        "files": sum(len(c.files) for c in plan) // shards,
                        "seconds": round(time.perf_counter() - t0, 3),
                        "reader": "native" if decoder_class(kw.get("native")) is _NativeDecoder else "twin",
                        **findings.get("scan", {})}
    return findings


def scan_main(argv=None) -> int:
    """`rmqhb scan CAPTURE... --out REPORT_DIR [--input pcap] [--port N]`: the recording analyses over the
    heartbeats of packet captures (pcap / pcapng, .gz; a directory = rotated files of one capture), written as the
    recording scan's report plus a ``capture`` section. `rmqhb scan --broker A=a.pcap --broker B=b.pcap ...`:
    each broker's captures scanned apart, per-broker and fleet-wide findings. Exit 0; 3 when the capture missed data (listed as damage;
    --allow-damage: 0); 2 bad arguments; 4 no heartbeat in the captures."""
    import argparse
    import sys

    from .scan_engine import add_arguments as add_engine_arguments

    d = ScanParams()
    p = argparse.ArgumentParser(prog="rmqhb scan", description=scan_main.__doc__)
    p.add_argument("paths", nargs="*", type=Path, help="capture files, or directories of rotated capture files")
    p.add_argument("--broker", action="append", default=[], metavar="NAME=PATH",
                   help="a capture of broker NAME (repeatable, a NAME again adds a file): per-broker and fleet-wide "
                        "findings; without it all captures are one broker's")
    p.add_argument("--out", type=Path, required=True, help="report directory (created)")
    p.add_argument("--format", "--input", dest="format", default="pcap", choices=["pcap"], help="input kind")
    p.add_argument("--port", type=int, action="append", default=[],
                   help="read only TCP connections with this port (repeatable; default: every connection)")
    p.add_argument("--shards", type=int, default=1,
                   help="Spark tasks per capture, each reading the file and taking its share of the connections")
    p.add_argument("--reorder-window-ms", type=int, default=twin.DEFAULT_REORDER_WINDOW_MS,
                   help="capture time a hole in a connection's bytes may wait for its segment before it is lost")
    p.add_argument("--max-connections", type=int, default=twin.DEFAULT_MAX_CONNECTIONS,
                   help="connections a capture reader keeps at once; past it the least recently used one is dropped "
                        "(an open one closed out, named as damage)")
    p.add_argument("--max-record-bytes", type=int, default=twin.DEFAULT_MAX_RECORD_BYTES,
                   help="frames larger than this are not buffered; a heartbeat that large is not read (damage)")
    p.add_argument("--max-buffered-bytes", type=int, default=twin.DEFAULT_MAX_BUFFERED_BYTES,
                   help="partial frames and reordered segments a capture reader buffers, all connections together; "
                        "past it the largest are dropped (damage)")
    p.add_argument("--max-capture-connections", type=int, default=MAX_CAPTURE_CONNECTIONS,
                   help="connections with heartbeats read per capture task (each --shards task has the whole "
                        "budget); the heartbeats of further connections are not read (damage)")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    p.add_argument("--min-duration", type=float, default=d.min_duration_s)
    p.add_argument("--gap-threshold", type=float, default=d.gap_threshold_s)
    p.add_argument("--expiry", type=float, default=d.expiry_s)
    p.add_argument("--flap-window", type=float, default=d.flap_window_s)
    p.add_argument("--flap-min", type=int, default=d.flap_min_reconnects)
    p.add_argument("--twin", action="store_true", help="use the pure-Python capture reader")
    p.add_argument("--allow-damage", action="store_true", help="exit 0 when the capture missed data (default 3)")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--no-plots", action="store_true")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    try:
        params = ScanParams(args.expiry, args.gap_threshold, args.min_duration, args.flap_window,
                            args.flap_min).validate()
        brokers = plan_brokers(args.broker)
        if brokers and args.paths:
            raise ValueError("with --broker, give every capture as --broker NAME=PATH")
        if not brokers and not args.paths:
            raise ValueError("no capture given")
        for paths in (brokers.values() if brokers else [args.paths]):
            plan_captures(paths, args.shards)
        twin.CaptureDecoder(max_connections=args.max_connections, max_record_bytes=args.max_record_bytes,
                            max_buffered_bytes=args.max_buffered_bytes)  # the budgets' checks
        if args.max_capture_connections < 1:
            raise ValueError("--max-capture-connections must be at least 1")
    except (ValueError, FileNotFoundError) as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    from .report import damage_line, print_summary, write_report
    from .scan_engine import EngineError, capture_engine, run_scan

    given = brokers or {None: args.paths}
    try:  # in this process or on Spark: engine.bindings.scan_engine
        engine, what = capture_engine(args, {b: plan_captures(paths, args.shards) for b, paths in given.items()})
    except EngineError as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    kw = dict(native=False if args.twin else None, ports=args.port or None, shards=args.shards,
              reorder_window_ms=args.reorder_window_ms, max_connections=args.max_connections,
              max_record_bytes=args.max_record_bytes, max_buffered_bytes=args.max_buffered_bytes,
              max_capture_connections=args.max_capture_connections)

    def scan_with(one):  # one(paths, client_ids) -> findings
        if brokers:
            return combine_capture_brokers({b: one(paths, True) for b, paths in brokers.items()})
        return one(args.paths, False)

    findings = run_scan(args, engine=engine, what=what, app="rmqhb-scan-pcap",
                        spark_scan=lambda spark: scan_with(lambda paths, ids: scan(spark, paths, params,
                                                                                   client_ids=ids, **kw)),
                        local_scan=lambda: scan_with(lambda paths, ids: local_capture_scan(paths, params,
                                                                                           client_ids=ids, **kw)),
                        count=lambda f: (f["capture"]["stats"]["packets"], "packets"))
    cap = findings["capture"]
    st = cap["stats"]
    if findings["summary"]["records"] == 0:
        damage = findings["scan"].get("corrupt") or []  # a cut .gz: say so, not only "0 packets"
        print(f"rmqhb scan: no heartbeat in the captures ({st['packets']:,} packets, {st['frames']:,} frames)"
              + (f"; {len(damage)} damaged, e.g. {damage[0]['segment']}: {damage[0]['reason']}" if damage else ""),
              file=sys.stderr)
        write_report(findings, args.out, plots=False)
        return 4
    index = write_report(findings, args.out, plots=not args.no_plots)
    print_summary(findings, sys.stdout)
    print(f"captures: {st['packets']:,} packets, {st['connections']:,} connections, {st['frames']:,} frames, "
          f"{st['heartbeats']:,} heartbeats, {st['unregisters']:,} unregisters, {st['notifies']:,} notifications; "
          f"ends {cap['connection_ends']}; missed {st['holes']} holes ({st['hole_bytes']:,} bytes), "
          f"{st['frames_cut']} frames cut, {st['resyncs']} resyncs", file=sys.stdout)
    print(f"report: {index}")
    damage = damage_line(findings)
    if damage or cap["damaged_files"]:
        print(f"rmqhb scan: {damage or 'damaged capture files'}", file=sys.stderr)
        return 0 if args.allow_damage else 3
    return 0

"""RocketMQ broker logs on Spark: the reader (``read_broker_logs``), the analyses over the event stream, the
``rmqhb scan`` entry for logs, and a generator of realistic broker logs with injected anomalies.

Data frames::

    events   broker, file, seq, ts_ms (UTC), line, kind, role, group, client_id, addr, language, version,
             consume_type, message_model, topic, sub_string, expression_type, sub_version, old_*, sub_key,
             last_update_ms                                                           read_broker_logs (mapInArrow)
             (``columns=``: only the columns named, in that order; the scan asks for ``SCAN_COLUMNS``)

One task per log file: it opens the file (``.gz`` too), cuts it into Arrow batches of ``READER_BATCH_LINES``
lines (the scan's tasks: ``BATCH_LINES``) and parses each with the compiled line parser (``engine.recording._brokerlog``;
twin ``engine.recording._brokerlog_py``), then turns the wall-clock times into UTC with the log's zone. ``seq`` orders the
lines of one broker (older rolled files first). ``read_broker_logs``' tasks emit event rows only; the scan's also
emit one stats row per file (``STATS_KIND``), which it filters out. Spark cannot prune the output of mapInArrow,
so the tasks emit only the columns asked for (``read_broker_logs(columns=...)``): Spark's per-row cost grows with
the columns (the JVM reads every Arrow cell into a row), and the scan's 15 ``SCAN_COLUMNS`` (what
``analyze_broker`` reads; 14 when measured, before ``last_update_ms``) cost about three quarters of the CPU of all 23,
the JVM's part about 60 % (BENCHMARKS.md, broker-log section).

The analyses (``analyze_events``) run per broker (``groupBy("broker").applyInArrow``) with the definitions of
``engine.recording.scan_py`` where a log supports them:

* ``group_sizes``: a member is live from its ``register`` until its ``unregister``, ``closed`` (NETTY EVENT),
  ``expired`` (SCAN), its group's removal or the broker's stop or start (a broker that starts has no channels);
  members still live at the end of the log stay counted (no drop).
* ``broker_boots`` (for the report): every start of the broker (``start_ms``: its first startup line, else its
  ``boot success`` line; ``ready_ms``: the ``boot success`` line; ``stopped_ms``: the shutdown hook's line before it,
  if any) and the memberships its stop or start ended.
* ``vanished_clients`` (new): a client whose connection ended without an UNREGISTER_CLIENT (NETTY EVENT close with a
  recent last heartbeat: a crash, a kill, a network cut) and that did not register again; one row per connection.
* ``inconsistent_subscriptions``: a consumer member's subscription set is the one of its last ``consumer_data``
  line (ClientManageProcessor logs the member's whole ConsumerData, with its address, whenever the group's
  table changed for it); spans where live members hold two or more sets (``source: members``), plus groups whose
  table flips a topic's expression back to one it had before (``source: group_table``, from the
  ``subscription changed ... OLD: ... NEW:`` lines; the clients behind a flip are not in the line).
* ``flapping_clients``: a reconnect is a ``register`` of a client on another address than its previous one.
  Each row also carries the client's connection marks (the report's timeline): ``connect_ms``, every register on
  an address other than its previous one (its first register included), and ``closes``, ``[ms, how]`` per
  connection (address) the broker logged leaving: ``closed`` (NETTY EVENT), ``unregister`` (UNREGISTER_CLIENT) or
  ``expired`` (SCAN), the first such line of that address counted once.
* ``member_addresses`` (for the report, not a finding): per (group, client) of a deviating member (as the
  recording scan's), the remote addresses (``R:/`` of its ClientChannelInfo) of its registrations in the group live
  during the span.
* ``expired_clients`` (new): a silent client the broker dropped, one row per client and drop, with its ``cause``:
  ``scan`` (the SCAN removed its channel: no heartbeat for ``expiry``, 120 s, while the connection stayed open) or
  ``idle_closed`` (the idle handler closed its channel first: a NETTY EVENT close whose lastUpdateTimestamp is
  ``IDLE_CLOSE_MIN_MS`` or more old; ``silent_since_before_ms`` is then that last heartbeat).
* ``retry_topic_churn``: changes of a group's ``%RETRY%`` subscription itself -- removed (a member heartbeats
  without it: a BROADCASTING member in a CLUSTERING group), added back after such a removal, or another
  expression -- flagged like flapping (``flap_min_reconnects`` in one ``flap_window``). A new subVersion alone is a
  consumer instance starting (every start logs one) and an add after the group was removed is the group coming
  back: neither is churn (restarts are the flapping finding's).
* ``heartbeat_gaps``: not supported by logs (a heartbeat is not logged; only the 120 s expiry is) -- reported
  under ``unsupported`` with the reason, and the list stays empty.
"""
from __future__ import annotations

import bisect
import contextlib
import gzip
import json
import os
import re
import stat
import zlib
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from engine import compiled_module
from engine.bindings.gzinput import BoundedGzip
from engine.codec.errors import RemotingError
from engine.recording.scan_py import (CLIENT_INNER_PRODUCER, FINDING_KEYS, IDLE_CLOSE_MIN_MS, ScanParams, _inconsistent,
                            deviating_members, fleet_findings, parse_key)

try:
    from engine.recording._brokerlog import parse_lines as _parse_native
except ImportError:  # not built
    _parse_native = None
from engine.recording import _brokerlog_py as twin

#: Findings of a log scan: the recording scan's keys plus the log-only ones.
LOG_FINDING_KEYS = FINDING_KEYS + ("retry_topic_churn", "vanished_clients")
#: Analyses a broker log cannot support, and why (shown in the report).
UNSUPPORTED = {
    "heartbeat_gaps": "a broker logs no line per heartbeat: silences shorter than the channel expiry (120 s) are "
                      "invisible; longer ones appear as expired_clients",
}
#: Lines per Arrow batch handed to the parser (Spark's default maxRecordsPerBatch; SPARK.md).
BATCH_LINES = 10_000
#: The log file names a broker writes (4.x and 5.x logback configurations), rolled copies included.
LOG_NAME = re.compile(r"^(broker(_default)?)(\.(\d+))?\.log(\.(\d+))?(\.gz)?$")
EXPIRY_GROUPING_MS = 10_000  # SCAN lines of one client within the housekeeping period belong to one scan
#: (IDLE_CLOSE_MIN_MS, engine.recording.scan_py: a NETTY EVENT close whose channel's lastUpdateTimestamp, the last
#: heartbeat, is this old or older is the broker's idle handler closing a silent channel, not a kill)
#: Event kinds of the broker's own life (the JVM starts, the start is done, the JVM stops): every channel ends.
BROKER_KINDS = ("broker_start", "broker_boot", "broker_stop")


def parser(native: Optional[bool] = None):
    """The line parser in use: the compiled one unless ENGINE_NO_EXTENSIONS is set or it is not built."""
    if native is None:
        native = compiled_module("_brokerlog") is not None
    return _parse_native if native else twin.parse_lines


# ---------------------------------------------------------------------------------------------------------------
# files, brokers and zones


def _rank(path: Path) -> Tuple[int, int]:
    """Age order of one broker's files: higher roll index = older; broker.log (no index) is the newest."""
    m = LOG_NAME.match(path.name)
    idx = None
    if m:
        idx = m.group(4) or m.group(6)
    return (-(int(idx)) if idx else 0, 0 if m and m.group(2) else 1)


def is_log_file(path: Path) -> bool:
    return bool(LOG_NAME.match(path.name)) or path.name.endswith((".log", ".log.gz"))


def is_broker_log_name(name: str) -> bool:
    """A broker's log in a directory given to the scan: broker*.log* (broker.log, broker_default.log, broker.log.1,
    otherdays/broker.3.log.gz ...). A directory's other *.log files (gc.log, store.log, an application's) are not
    read; a file given by its path is read whatever its name."""
    return name.startswith("broker") and ".log" in name


def plan_files(paths: Iterable, brokers: Optional[Dict[str, str]] = None) -> List[Tuple[str, str, int]]:
    """[(broker, file, rank)] of the inputs: files, or directories holding broker logs (``otherdays/`` too).
    A file's broker is the ``--broker NAME=PATH`` whose path holds it, else its directory's name."""
    named = [(n, Path(p).resolve()) for n, p in (brokers or {}).items()]
    files: List[Path] = []
    for p in list(paths) + [p for _, p in named]:
        p = Path(p)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and is_broker_log_name(f.name))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such log file or directory: {p}")
    out, seen = [], set()
    for f in files:
        r = f.resolve()
        if r in seen:
            continue
        seen.add(r)
        broker = None
        for name, base in named:
            if r == base or base in r.parents:
                broker = name
                break
        if broker is None:
            parent = r.parent.name if r.parent.name != "otherdays" else r.parent.parent.name
            broker = parent or "broker"
        out.append((broker, str(r)))
    out.sort(key=lambda bf: (bf[0], _rank(Path(bf[1])), bf[1]))
    ranked, per = [], defaultdict(int)
    for broker, f in out:
        ranked.append((broker, f, per[broker]))
        per[broker] += 1
    return ranked


def resolve_tz(name: Optional[str] = None):
    """(tzinfo, label, source) of the log's zone: ``name`` (an IANA name, ``UTC``, or ``+08:00``), else the
    machine's zone (TZ, /etc/localtime), as the broker's JVM would have used on this machine."""
    from zoneinfo import ZoneInfo

    if name:
        m = re.fullmatch(r"(?:UTC|GMT)?([+-])(\d{1,2}):?(\d{2})?", name)
        if m:
            sign = 1 if m.group(1) == "+" else -1
            off = timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0)) * sign
            return timezone(off), name, "--log-tz"
        return ZoneInfo(name), name, "--log-tz"
    tzname = os.environ.get("TZ")
    if tzname:
        try:
            return ZoneInfo(tzname.lstrip(":")), tzname.lstrip(":"), "machine (TZ)"
        except Exception:
            pass
    try:
        link = os.path.realpath("/etc/localtime")
        key = link.split("/zoneinfo/", 1)[1]
        return ZoneInfo(key), key, "machine (/etc/localtime)"
    except Exception:
        local = datetime.now().astimezone().tzinfo
        return local, str(local), "machine"


def to_utc_ms(local_ms, tz) -> np.ndarray:
    """UTC epoch ms of wall-clock times (ms since 1970-01-01 00:00 read as UTC) in zone ``tz``; one zone
    lookup per distinct hour. An ambiguous hour (DST fall-back) takes its first occurrence (fold=0)."""
    local = np.asarray(local_ms, dtype=np.int64)
    if local.size == 0:
        return local.copy()
    hours = local // 3_600_000
    h0, h1 = int(hours.min()), int(hours.max())
    if h1 - h0 < 4096:  # a batch spans a few hours: index a small table instead of sorting
        span, inv = np.arange(h0, h1 + 1), hours - h0
    else:
        span, inv = np.unique(hours, return_inverse=True)
    offs = np.empty(len(span), dtype=np.int64)
    for i, h in enumerate(span.tolist()):
        wall = datetime(1970, 1, 1) + timedelta(hours=h)
        offs[i] = int(wall.replace(tzinfo=tz).utcoffset().total_seconds() * 1000)
    return local - offs[inv]


# ---------------------------------------------------------------------------------------------------------------
# reading files into event batches (no Spark: used by the tasks and by the tests)


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _line_ends(native: Optional[bool] = None):
    if native is None:
        native = compiled_module("_brokerlog") is not None
    if native:
        from engine.recording._brokerlog import line_ends

        return line_ends
    return twin.line_ends


#: Longest log line the reader takes, its line end included. A longer line (a file with no line end: a binary,
#: sparse or zero-filled file or a gzip of one; or a broker line listing millions of tags) is skipped up to its next
#: line end, counted (``overlong_line``) and named as damage: a file costs at most a read of ``chunk_bytes`` plus
#: this much memory, whatever it holds (``rmqhb scan --max-line-bytes``).
MAX_LINE_BYTES = 16 << 20
#: Wall-clock times a log line may carry (as written, before the zone): from 2000-01-01 to ``TS_AHEAD_MS`` past the
#: scanning machine's clock. An event line stamped outside is damage (``bad_timestamp``), never an event: one line
#: stamped in 2106 would otherwise stretch every span and axis of the report over eighty years.
TS_MIN_MS = 946_684_800_000
TS_AHEAD_MS = 2 * 86_400_000
#: What a failed read of a log file raises (the file is named as damage, the other files are read on).
READ_ERRORS = (OSError, EOFError, zlib.error)


def ts_window(now_ms: Optional[int] = None) -> Tuple[int, int]:
    """(lowest, highest) wall-clock ms a log line may carry (TS_MIN_MS, TS_AHEAD_MS)."""
    import time

    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    return TS_MIN_MS, now + TS_AHEAD_MS


def _read_error(exc) -> str:
    """Why a read failed, without the file's bytes (gzip's BadGzipFile message quotes them)."""
    if isinstance(exc, gzip.BadGzipFile):
        return "not a gzip file (bad gzip header)"
    if isinstance(exc, (EOFError, zlib.error)):
        return f"gzip stream damaged: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno:
        return f"{type(exc).__name__}: {os.strerror(exc.errno)}"
    return type(exc).__name__


class LineReader:
    """The lines of one log file (``.gz`` too) as Arrow binary arrays of up to ``batch_lines`` lines, cut from
    bounded reads (line ends found with memchr, no Python object per line); line ends are kept (the parser drops
    them), a last line without one is kept. Each read goes into a fresh buffer the arrays point into.

    Bounded whatever the file says: memory is one read of ``chunk_bytes`` plus the partial line carried over
    (at most ``max_line_bytes``), time is linear in the bytes. No memory map (a file truncated while mapped, as
    logrotate's copytruncate does, kills the process with SIGBUS): a plain file is read with read() up to the size
    it had when the read began (what is appended later is left for the next scan), and a file that shrinks under
    the reader ends where it now ends, named as damage. ``damage``: [{"kind", "offset", "bytes", "reason"}]
    (offsets into the file's bytes; a ``.gz``'s decompressed bytes), complete once the iteration ends; kinds
    ``overlong_line`` (one entry per file: the first such line, the bytes and lines skipped), ``truncated``,
    ``unreadable``, ``gzip_budget`` (a ``.gz`` read up to ``gzinput.gzip_budget`` decompressed bytes: a gzip bomb
    costs time linear in its compressed size; ``max_gzip_ratio``, ``min_gzip_bytes``). ``fileobj``: read this
    binary file object instead of opening ``path`` (fuzzing, tests)."""

    def __init__(self, path, batch_lines: int = BATCH_LINES, chunk_bytes: int = 8 << 20,
                 native: Optional[bool] = None, max_line_bytes: Optional[int] = None, fileobj=None,
                 max_gzip_ratio: Optional[int] = None, min_gzip_bytes: Optional[int] = None):
        if batch_lines < 1 or chunk_bytes < 1:
            raise ValueError("batch_lines and chunk_bytes must be positive")
        self.path = str(path)
        self.batch_lines, self.chunk_bytes = int(batch_lines), int(chunk_bytes)
        self.max_line = int(MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes)
        if self.max_line < 1:
            raise ValueError("max_line_bytes must be positive")
        self.ends_of = _line_ends(native)
        self.fileobj = fileobj
        self.gzip_budget = (max_gzip_ratio, min_gzip_bytes)
        self.damage: List[dict] = []
        self.overlong = 0          # lines skipped
        self._over_first = None    # (offset, bytes) of the first
        self._over_bytes = 0

    def _skipped(self, offset: int, length: int):
        self.overlong += 1
        self._over_bytes += int(length)
        if self._over_first is None:
            self._over_first = (int(offset), int(length))

    def _finish(self):
        if self.overlong:
            off, n = self._over_first
            self.damage.append({"kind": "overlong_line", "offset": off, "bytes": self._over_bytes,
                                "reason": f"{self.overlong:,} line(s) longer than {self.max_line:,} bytes skipped "
                                          f"({self._over_bytes:,} bytes; the first at byte {off:,}, {n:,} bytes)"})

    def __iter__(self):
        import pyarrow as pa

        limit = None  # a plain file: the size it had when the read began
        try:
            if self.fileobj is None and not stat.S_ISREG(os.stat(self.path).st_mode):
                # a FIFO or device named like a log: opening it could block or never end
                self.damage.append({"kind": "unreadable", "offset": 0, "bytes": 0, "reason": "not a regular file"})
                return
            if self.fileobj is not None:
                f = contextlib.nullcontext(self.fileobj)
            elif self.path.endswith(".gz"):
                f = BoundedGzip(self.path, *self.gzip_budget)
            else:
                f = open(self.path, "rb", buffering=0)
                limit = os.fstat(f.fileno()).st_size
        except READ_ERRORS as exc:
            self.damage.append({"kind": "unreadable", "offset": 0, "bytes": 0, "reason": _read_error(exc)})
            return
        with f as fh:
            carry = b""
            pos = 0        # offset in the file of the buffer's first byte (the carried partial line)
            skip = None    # offset of the overlong line being skipped, or None
            while True:
                n0 = len(carry)
                want = self.chunk_bytes if limit is None else min(self.chunk_bytes, limit - pos - n0)
                buf = bytearray(n0 + max(want, 0))
                buf[:n0] = carry
                view = memoryview(buf)
                got, broken = 0, None
                if want > 0:
                    try:
                        got = fh.readinto(view[n0:]) or 0
                    except READ_ERRORS as exc:
                        broken = {"kind": "unreadable", "reason": f"read failed at byte {pos + n0:,}: "
                                                                  f"{_read_error(exc)}"}
                if not got and broken is None and getattr(fh, "over", False):  # the rest: past the gzip budget
                    broken = {"kind": "gzip_budget", "reason": f"at byte {pos + n0:,}: {fh.reason()}"}
                if not got and broken is None and limit is not None and pos + n0 < limit:
                    broken = {"kind": "truncated", "reason": f"the file ended at byte {pos + n0:,} of the "
                                                             f"{limit:,} it had when the read began (truncated while "
                                                             "read: logrotate's copytruncate?)"}
                size = n0 + got
                if not got:
                    if skip is not None:
                        self._skipped(skip, pos - skip)
                    if broken is not None:  # the line being read is cut: part of the damage, not a line
                        self.damage.append({"kind": broken["kind"], "offset": pos,
                                            "bytes": (limit - pos) if limit is not None else n0,
                                            "reason": broken["reason"]})
                    elif size:
                        yield pa.array([bytes(view[:size])], pa.binary())  # the last line, without a line end
                    self._finish()
                    return
                start = 0
                if skip is not None:  # inside an overlong line: drop bytes up to its line end
                    i = buf.find(b"\n", 0, size)
                    if i < 0:
                        pos += size
                        carry = b""
                        continue
                    self._skipped(skip, pos + i + 1 - skip)
                    skip, start = None, i + 1
                ends = self.ends_of(view[start:size])
                if not len(ends):
                    if size - start > self.max_line:
                        skip, carry, pos = pos + start, b"", pos + size
                    else:
                        carry, pos = bytes(view[start:size]), pos + start
                    continue
                offs = np.concatenate(([0], ends)).astype(np.int64) + start
                tail = int(offs[-1])
                over = np.diff(offs) > self.max_line
                for k in np.flatnonzero(over).tolist():
                    self._skipped(pos + int(offs[k]), int(offs[k + 1] - offs[k]))
                if size - tail > self.max_line:
                    skip, carry, nxt = pos + tail, b"", pos + size
                else:
                    carry, nxt = bytes(view[tail:size]), pos + tail
                yield from self._arrays(pa, buf, offs, over)
                pos = nxt

    def _arrays(self, pa, buf, offs, over):
        data = pa.py_buffer(buf)
        typ, ot = (pa.binary(), np.int32) if offs[-1] < 2**31 else (pa.large_binary(), np.int64)
        n = len(offs) - 1
        for i in range(0, n, self.batch_lines):
            o = offs[i:i + self.batch_lines + 1]
            arr = pa.Array.from_buffers(typ, len(o) - 1, [None, pa.py_buffer((o - o[0]).astype(ot)),
                                                          data.slice(int(o[0]), int(o[-1] - o[0]))])
            skip = over[i:i + self.batch_lines]
            if skip.any():
                arr = arr.take(_int64s(np.flatnonzero(~skip)))
            if len(arr):
                yield arr


def line_batches(path: str, batch_lines: int = BATCH_LINES, chunk_bytes: int = 8 << 20,
                 native: Optional[bool] = None, max_line_bytes: Optional[int] = None):
    """The lines of a log file as Arrow binary arrays (``LineReader``, whose ``damage`` this drops)."""
    yield from LineReader(path, batch_lines, chunk_bytes, native, max_line_bytes)


#: line categories that carry no log header: their examples are quoted only from files recognised as broker logs
_HEADERLESS = ("unknown_format", "continuation")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # tabs (stack traces) stay


def _escape(text: str) -> str:
    """An example line with its control characters but tab visible (``\\x1b``): it reaches terminals, CSV and HTML."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _quotable(stats: dict, recognised: bool) -> Tuple[dict, bool]:
    """(stats, recognised): a file is recognised as a broker log once one of its lines has the log header
    (``yyyy-MM-dd HH:mm:ss ... - ``); until then its header-less lines are named by count and category, never
    quoted (a broker.log linked to /etc/passwd must not copy the file into the findings). Examples kept are
    escaped."""
    counts = stats.get("counts", {})
    headed = stats.get("lines", 0) - sum(counts.get(k, 0) for k in _HEADERLESS + ("blank",))
    recognised = recognised or headed > 0
    ex = {}
    for k, v in stats.get("examples", {}).items():
        if k in _HEADERLESS and not recognised:
            ex[k] = f"(not quoted: no line of the file so far has a broker-log header; {counts.get(k, 0):,} such lines)"
        else:
            ex[k] = _escape(v)
    return {**stats, "examples": ex}, recognised


# Arrow arrays to and from numpy without pa.array, Array.to_numpy, pa.scalar or RecordBatch.from_pylist: each of
# those goes through pyarrow's pandas shim, which imports pandas (0.3 CPU-s, as much as a whole small scan in this
# process). The local path of a broker log loads no pandas (tests/test_imports.py); Spark loads it anyway.

_NP_TYPES = {"int64": np.int64, "int32": np.int32, "uint64": np.uint64, "double": np.float64}


def _values(arr) -> np.ndarray:
    """The values of a fixed-width Arrow array (int64, int32, double) as a numpy array (a null reads as whatever
    its slot holds: callers filter nulls first)."""
    dtype = np.dtype(_NP_TYPES[str(arr.type)])
    buf = arr.buffers()[1]
    if buf is None or not len(arr):
        return np.empty(0, dtype)
    return np.frombuffer(buf, dtype)[arr.offset:arr.offset + len(arr)]


def _int64s(values):
    """A numpy array as an Arrow int64 array (no nulls)."""
    import pyarrow as pa

    v = np.ascontiguousarray(values, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(v), [None, pa.py_buffer(v)])


def _repeated(text: str, n: int):
    """An Arrow string array of ``n`` copies of ``text``."""
    import pyarrow as pa

    b = text.encode("utf-8")
    offs = np.arange(n + 1, dtype=np.int64) * len(b)
    typ, ot = (pa.string(), np.int32) if offs[-1] < 2**31 else (pa.large_string(), np.int64)
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offs.astype(ot)), pa.py_buffer(b * n)])


def _drop_bad_times(batch, stats: dict, window: Tuple[int, int], bad: dict):
    """(batch, stats) without the events stamped outside ``window``: counted as ``bad_timestamp`` lines, the first
    one's line number kept in ``bad``."""
    ts = _values(batch.column("ts_ms"))
    ok = (ts >= window[0]) & (ts <= window[1])
    if ok.all():
        return batch, stats
    out = np.flatnonzero(~ok)
    if "first_line" not in bad:
        bad["first_line"], bad["first_ms"] = int(batch.column("line")[int(out[0])].as_py()), int(ts[out[0]])
    bad["n"] = bad.get("n", 0) + len(out)
    counts = dict(stats["counts"])
    for kind in batch.column("kind").take(_int64s(out)).to_pylist():
        counts["event_" + kind] -= 1
        if not counts["event_" + kind]:
            del counts["event_" + kind]
    counts["bad_timestamp"] = counts.get("bad_timestamp", 0) + len(out)
    stats = {**stats, "events": stats["events"] - len(out), "counts": dict(sorted(counts.items()))}
    return batch.take(_int64s(np.flatnonzero(ok))), stats


def file_events(broker: str, path: str, rank: int, tz, *, native: Optional[bool] = None,
                batch_lines: int = BATCH_LINES, chunk_bytes: int = 8 << 20,
                columns: Optional[Tuple[str, ...]] = None, samples: bool = True,
                max_line_bytes: Optional[int] = None, window: Optional[Tuple[int, int]] = None):
    """(events RecordBatch with broker/file/seq and UTC times, stats, zone samples) per batch of one file (at most
    ``batch_lines`` lines, cut from reads of ``chunk_bytes``), then one last (empty batch, stats) with what the
    reader skipped: ``overlong_line`` lines and, in ``stats["damage"]``, the file's damage as the report's
    ``scan.corrupt`` entries (overlong lines, a file truncated while read or unreadable, events stamped outside
    ``window`` (default ``ts_window()``): ``bad_timestamp``). A file that cannot be read is damage, never an
    exception: the other files' findings stand. ``columns``: the event columns of the batches, in that order
    (default: all of ``events_schema()``; checked by the caller, see ``event_columns``); ``samples``: take the zone
    samples from the first batch (else none)."""
    import pyarrow as pa

    parse = parser(native)
    names = events_schema().names
    order = list(names if columns is None else columns)
    window = window or ts_window()
    reader = LineReader(path, batch_lines, chunk_bytes, native, max_line_bytes)
    base, first, recognised, bad = 0, True, False, {}
    for arr in reader:
        batch, stats = parse(arr, base)
        base += len(arr)
        stats, recognised = _quotable(stats, recognised)
        batch, stats = _drop_bad_times(batch, stats, window, bad)
        n = batch.num_rows
        ts = to_utc_ms(_values(batch.column("ts_ms")), tz)
        seq = (np.int64(rank) << 40) + _values(batch.column("line")).astype(np.int64)
        out = {"seq": _int64s(seq), "ts_ms": _int64s(ts)}
        for c in ("broker", "file"):  # (a column of n copies: built only when asked for)
            if c in order:
                out[c] = _repeated(broker if c == "broker" else path, n)
        for i in range(1, batch.num_columns):
            out[batch.schema.names[i]] = batch.column(i)
        zone = _zone_samples(batch) if samples and first else []  # the first batch of a file is enough
        first = False
        yield pa.RecordBatch.from_arrays([out[c] for c in order], names=order), stats, zone
    damage = list(reader.damage)
    if bad:
        damage.append({"kind": "bad_timestamp", "offset": 0, "bytes": 0,
                       "reason": f"{bad['n']:,} event line(s) stamped before {_fmt_ms(window[0])} or more than "
                                 f"{TS_AHEAD_MS // 86_400_000} days after the scan's clock left out; the first: line "
                                 f"{bad['first_line'] + 1:,} ({_fmt_ms(bad['first_ms'])})"})
    counts = {"overlong_line": reader.overlong} if reader.overlong else {}
    sch = events_schema()
    empty = pa.RecordBatch.from_arrays([pa.nulls(0, sch.field(c).type) for c in order], names=order)
    yield empty, {"lines": reader.overlong, "events": 0, "counts": counts, "examples": {},
                  "damage": [{"broker": broker, "segment": path, "first_ms": None, "last_ms": None,
                              "records_lost": None, **d} for d in damage]}, []


def _fmt_ms(ms: int) -> str:
    """A wall-clock ms as written in the line, or the raw number where no calendar date fits."""
    try:
        return _fmt_ts(ms, 0)
    except (OverflowError, ValueError):
        return f"{ms} ms"


def _zone_samples(batch) -> List[Tuple[int, int]]:
    """(lastUpdateTimestamp, wall clock - lastUpdateTimestamp) of a few lines that carry both: the broker's own
    epoch ms against the line's wall clock gives the log's UTC offset, give or take the second resolution."""
    import pyarrow.compute as pc

    sel = batch.select(["last_update_ms", "ts_ms"])
    sel = sel.filter(pc.is_valid(sel.column("last_update_ms"))).slice(0, 64)
    lut = _values(sel.column("last_update_ms")).astype(np.int64)
    ts = _values(sel.column("ts_ms")).astype(np.int64)
    return list(zip(lut.tolist(), (ts - lut).tolist()))


def events_schema():
    import pyarrow as pa

    sch = twin.event_schema()
    return pa.schema([("broker", pa.string()), ("file", pa.string()), ("seq", pa.int64())] + list(sch))


def read_local(paths, *, log_tz: Optional[str] = None, brokers: Optional[Dict[str, str]] = None,
               native: Optional[bool] = None, max_line_bytes: Optional[int] = None):
    """(events pyarrow Table, log info) of log files read in this process (the reference for the Spark reader)."""
    import pyarrow as pa

    tz, label, source = resolve_tz(log_tz)
    plan = plan_files(paths, brokers)
    window = ts_window()
    batches, stats, samples = [], {}, []
    for broker, path, rank in plan:
        for b, s, z in file_events(broker, path, rank, tz, native=native, max_line_bytes=max_line_bytes,
                                   window=window):
            batches.append(b)
            stats = twin.merge_stats(stats, s)
            samples += z
    table = pa.Table.from_batches(batches, schema=events_schema())
    return table, _log_info(plan, stats, samples, tz, label, source)


def _log_info(plan, stats, samples, tz, label, source) -> dict:
    counts = stats.get("counts", {})
    bad = {k: v for k, v in counts.items()
           if k.startswith("malformed_") or k in ("unknown_format", "invalid_utf8", "unknown_client_message",
                                                  "overlong_line", "bad_timestamp")}
    info = {"files": [f for _, f, _ in plan], "brokers": sorted({b for b, _, _ in plan}),
            "log_tz": label, "log_tz_source": source, "lines": stats.get("lines", 0),
            "events": stats.get("events", 0), "counts": counts, "unparseable": sum(bad.values()),
            "unparseable_by_kind": bad, "examples": stats.get("examples", {}),
            "damage": sorted(stats.get("damage", []), key=lambda d: (d["broker"], d["segment"], d["offset"],
                                                                      d["kind"]))}
    if samples:
        # the zone check: the offset the lines' own epoch timestamps imply, against the zone in use
        lut = int(np.median([x for x, _ in samples]))
        inferred = int(round(float(np.median([d for _, d in samples])) / 900_000)) * 15
        used = int(datetime.fromtimestamp(lut / 1000, tz).utcoffset().total_seconds() // 60)
        info["zone_check"] = {"inferred_utc_offset_min": inferred, "log_tz_offset_min": used, "agrees": inferred == used}
    return info


# ---------------------------------------------------------------------------------------------------------------
# the analyses (pure Python, per broker; the Spark scan runs this per broker)


def _window_counts(times: List[int], w: int, need: int):
    per = defaultdict(int)
    for t in times:
        per[t // w] += 1
    return sorted([k * w, n] for k, n in per.items() if n >= need)


def analyze_broker(events: List[dict], params: ScanParams = ScanParams(), log_end_ms: Optional[int] = None) -> dict:
    """Findings of one broker's events (dicts with the event columns), in (ts_ms, seq) order."""
    events = sorted(events, key=lambda e: (e["ts_ms"], e["seq"]))
    broker = events[0]["broker"] if events else ""
    end_of_log = log_end_ms if log_end_ms is not None else (events[-1]["ts_ms"] if events else 0)
    live: Dict[Tuple[str, str], Dict[str, list]] = defaultdict(dict)   # (role, group) -> client -> [start, addr, key]
    intervals: Dict[Tuple[str, str], list] = defaultdict(list)       # (role, group) -> [(s, e|None, client, key)]
    addr_client: Dict[str, str] = {}
    last_addr: Dict[str, str] = {}
    reconnects: Dict[str, List[int]] = defaultdict(list)
    connects: Dict[str, List[int]] = defaultdict(list)
    closes: Dict[str, list] = defaultdict(list)
    closed_addrs: Dict[str, set] = defaultdict(set)                   # client -> addresses whose close is counted
    member_addrs: Dict[Tuple[str, str], list] = defaultdict(list)     # (group, client) -> [(s, e|None, addr)]
    registers: Dict[str, List[int]] = defaultdict(list)
    groups_of: Dict[str, set] = defaultdict(set)
    expiries: list = []
    unattributed = defaultdict(int)
    explained = defaultdict(int)           # close / unregister lines of members already gone, and why (normal)
    reasons = defaultdict(int)             # unattributed lines by reason
    vanished: list = []
    boots: list = []
    scan_removed: set = set()              # addresses the SCAN or the idle handler removed
    ever: set = set()                      # (role, group, client) of every member that registered
    stopped: set = set()                   # addresses live when the broker stopped
    pending_stop = None
    table: Dict[Tuple[str, str], Tuple[str, str]] = {}
    seen_expr: Dict[Tuple[str, str], list] = defaultdict(list)
    flips: Dict[Tuple[str, str], list] = defaultdict(list)
    retry: Dict[str, dict] = {}
    retry_removed: set = set()  # groups whose %RETRY% subscription a member's heartbeat removed

    def end(role, group, client, t):
        st = live[(role, group)].pop(client, None)
        if st is not None:
            intervals[(role, group)].append((st[0], t, client, st[2]))
            if role == "consumer":
                member_addrs[(group, client)].append((st[0], t, st[1]))
        return st

    def close(client, addr, t, how):
        if client is not None and addr and addr not in closed_addrs[client]:
            closed_addrs[client].add(addr)
            closes[client].append([t, how])

    def end_all(t) -> Tuple[int, int]:
        # the broker stops or starts: it has no channels any more (members, clients)
        ended, clients = 0, set()
        for (role, group), members in live.items():
            for c in list(members):
                st = end(role, group, c, t)
                stopped.add(st[1])
                clients.add(c)
                ended += 1
        table.clear()      # the subscription tables live in memory: rebuilt by the next heartbeats
        last_addr.clear()  # a register after the restart is a connect, not the client's reconnect
        return ended, len(clients)

    def unmatched(kind, role, group, client, addr):
        # a close / unregister line whose member is not live: normal after the SCAN, the idle handler or the
        # broker's stop removed it; else the member's register line is not in the log (never_registered), or the
        # member had registered and left already (not_live)
        if addr in scan_removed:
            explained["after_expiry"] += 1
        elif addr in stopped:
            explained["after_broker_stop"] += 1
        else:
            unattributed[kind] += 1
            c = client if client is not None else addr_client.get(addr)
            reasons["not_live" if (role, group, c) in ever else "never_registered"] += 1

    for ev in events:
        kind, role, group, t = ev["kind"], ev["role"], ev["group"], ev["ts_ms"]
        client, addr = ev.get("client_id"), ev.get("addr")
        inherit = None
        if kind in BROKER_KINDS:
            if kind == "broker_stop":
                n, k = end_all(t)
                pending_stop = [t, n, k]
                continue
            if kind == "broker_boot" and boots and boots[-1]["ready_ms"] is None:
                boots[-1].update(ready_ms=t, name=group, addr=addr)  # the start this line completes
                continue
            n, k = end_all(t)
            stop = pending_stop or [None, 0, 0]
            boots.append({"broker": broker, "start_ms": t, "ready_ms": t if kind == "broker_boot" else None,
                          "name": group, "addr": addr, "stopped_ms": stop[0],
                          "members_ended": stop[1] + n, "clients_ended": stop[2] + k})
            pending_stop = None
            continue
        if kind == "register" and addr:
            scan_removed.discard(addr)
            stopped.discard(addr)
        if kind == "client_changed":
            # ConsumerGroupInfo.updateChannel replaced the channel's entry: the client that held this channel in
            # the group leaves it (its subscriptions stay the channel's), the new client id registers
            old = next((k for k, v in live[(role, group)].items() if addr and v[1] == addr and k != client), None)
            st = end(role, group, old, t) if old is not None else None
            inherit = st[2] if st is not None else None
            kind = "register"
        if kind == "register":
            if not (role == "producer" and group == CLIENT_INNER_PRODUCER):
                groups_of[client].add(group)
            registers[client].append(t)
            ever.add((role, group, client))
            prev = last_addr.get(client)
            if prev is not None and prev != addr:
                reconnects[client].append(t)
            if prev is None or prev != addr:
                connects[client].append(t)
                closed_addrs[client].discard(addr)
            last_addr[client] = addr
            if addr:
                addr_client[addr] = client
            cur = live[(role, group)].get(client)
            if cur is not None and cur[1] == addr:
                continue
            key = None
            if cur is not None:
                key = cur[2]
                end(role, group, client, t)
            live[(role, group)][client] = [t, addr, None if role == "producer" else (key or inherit)]
        elif kind == "consumer_data":
            c = addr_client.get(addr)
            st = live[("consumer", group)].get(c) if c else None
            if st is None:
                unmatched("consumer_data", "consumer", group, None, addr)
                continue
            if st[2] != ev["sub_key"]:
                if t > st[0]:
                    intervals[("consumer", group)].append((st[0], t, c, st[2]))
                    member_addrs[(group, c)].append((st[0], t, st[1]))
                    st[0] = t
                st[2] = ev["sub_key"]
        elif kind in ("unregister", "closed"):
            c = client
            if c is None or c not in live[(role, group)]:
                c = next((k for k, v in live[(role, group)].items() if v[1] == addr), None)
            st = end(role, group, c, t) if c is not None else None
            if st is None:
                unmatched(kind, role, group, client, addr)
            else:
                a = addr or st[1]
                close(c, a, t, kind)
                lut = ev.get("last_update_ms")
                if kind == "closed" and lut is not None and t - lut >= IDLE_CLOSE_MIN_MS:
                    # the idle handler closed a silent channel: an expiry, its last heartbeat known
                    scan_removed.add(a)
                    expiries.append((a, t, c, role, group, st[0], "idle_closed", lut))
                elif kind == "closed":
                    vanished.append((a, t, c, role, group, st[0], lut))
        elif kind == "expired":
            c = next((k for k, v in live[(role, group)].items() if v[1] == addr), None) or addr_client.get(addr)
            st = end(role, group, c, t) if c else None
            close(c, addr, t, kind)
            scan_removed.add(addr)
            expiries.append((addr, t, c, role, group, None if st is None else st[0], "scan", None))
        elif kind in ("group_removed", "group_cleared"):
            retry_removed.discard(group)
            for c in list(live[(role, group)]):
                end(role, group, c, t)
        elif kind in ("sub_add", "sub_change", "sub_remove"):
            topic = ev["topic"]
            expr = (ev["expression_type"], ev["sub_string"])
            if kind == "sub_remove":
                table.pop((group, topic), None)
            else:
                old = table.get((group, topic))
                if kind == "sub_change" and old is None:
                    old = (ev["old_expression_type"], ev["old_sub_string"])
                if old is not None and old != expr:
                    hist = seen_expr[(group, topic)]
                    if not hist:
                        hist.append(old)
                    if expr in hist:
                        flips[(group, topic)].append((t, old, expr))
                    hist.append(expr)
                table[(group, topic)] = expr
            if topic.startswith("%RETRY%"):
                # churn is the retry subscription itself changing: removed by a member's heartbeat without it,
                # added back after such a removal, or another expression. A new subVersion alone is a consumer
                # instance starting (every start logs one: a restart, not churn), and an add after the group was
                # removed is the group coming back
                if kind == "sub_remove":
                    retry_removed.add(group)
                    churn = True
                elif kind == "sub_add":
                    churn = group in retry_removed
                    retry_removed.discard(group)
                else:
                    churn = (ev["old_expression_type"], ev["old_sub_string"]) != expr
                if churn:
                    r = retry.setdefault(group, {"retry_topic": topic, "adds": 0, "changes": 0, "removes": 0,
                                                 "ms": []})
                    r[{"sub_add": "adds", "sub_change": "changes", "sub_remove": "removes"}[kind]] += 1
                    r["ms"].append(t)
    for (role, group), members in live.items():
        for c, st in members.items():
            intervals[(role, group)].append((st[0], None, c, st[2]))
            if role == "consumer":
                member_addrs[(group, c)].append((st[0], None, st[1]))

    findings = {
        "group_sizes": _sizes(intervals, broker),
        "inconsistent_subscriptions": _inconsistent_log(intervals, flips, end_of_log, params, broker),
        "flapping_clients": _flapping_log(reconnects, groups_of, params, broker, connects, closes),
        "heartbeat_gaps": [],
        "expired_clients": _expired(expiries, registers, groups_of, params, broker),
        "retry_topic_churn": _retry(retry, params, broker),
        "vanished_clients": _vanished(vanished, registers, broker),
    }
    if pending_stop is not None:  # stopped at the end of the log
        boots.append({"broker": broker, "start_ms": None, "ready_ms": None, "name": None, "addr": None,
                      "stopped_ms": pending_stop[0], "members_ended": pending_stop[1],
                      "clients_ended": pending_stop[2]})
    findings["member_addresses"] = _member_addresses_log(findings["inconsistent_subscriptions"], member_addrs, broker)
    findings["broker_boots"] = boots
    findings["_clients"] = sorted(registers)
    findings["_unattributed"] = dict(unattributed)
    findings["_reasons"] = dict(reasons)
    findings["_explained"] = dict(explained)
    # the log starts at a boot when the broker's first event is its start: nothing before it can be missing
    findings["_starts_at_boot"] = {broker: bool(events) and events[0]["kind"] in ("broker_start", "broker_boot")}
    return findings


def _sizes(intervals, broker) -> list:
    out = []
    for (role, group), ivs in sorted(intervals.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        acc: Dict[int, int] = defaultdict(int)
        for s, e, _, _ in ivs:
            if e is not None and e <= s:
                continue
            acc[s] += 1
            if e is not None:
                acc[e] -= 1
        series, total = [], 0
        for t in sorted(acc):
            if acc[t]:
                total += acc[t]
                series.append([t, total])
        out.append({"broker": broker, "group": group, "role": role, "max_members": max((n for _, n in series), default=0),
                    "members": len({c for _, _, c, _ in ivs}), "series": series})
    return out


def _inconsistent_log(intervals, flips, end_of_log, params, broker) -> list:
    closed = {k: [(s, end_of_log if e is None else e, c, key) for s, e, c, key in v] for k, v in intervals.items()}
    out = [{"broker": broker, "source": "members", **r} for r in _inconsistent(closed, params)]
    for (group, topic), fl in sorted(flips.items()):
        exprs = []
        for _, old, new in fl:
            for x in (old, new):
                if x not in exprs:
                    exprs.append(x)
        out.append({"broker": broker, "source": "group_table", "group": group, "topic": topic,
                    "start_ms": fl[0][0], "end_ms": fl[-1][0], "duration_s": (fl[-1][0] - fl[0][0]) / 1000,
                    "flips": len(fl),
                    "variants": [{"subscriptions": [[topic, et, sub]], "clients": []} for et, sub in exprs]})
    return sorted(out, key=lambda r: (r["group"], r["start_ms"], r["source"]))


def _flapping_log(reconnects, groups_of, params, broker, connects, closes) -> list:
    out = []
    for client in sorted(reconnects):
        rc = sorted(reconnects[client])
        flagged = _window_counts(rc, params.window_ms, params.flap_min_reconnects)
        if flagged:
            out.append({"broker": broker, "client_id": client, "groups": sorted(groups_of[client]),
                        "reconnects": len(rc), "max_reconnects_per_window": max(n for _, n in flagged),
                        "first_reconnect_ms": rc[0], "last_reconnect_ms": rc[-1], "windows": flagged,
                        "reconnect_ms": rc, "connect_ms": sorted(connects[client]),
                        "closes": sorted(closes[client])})
    return out


def _member_addresses_log(inconsistent, member_addrs, broker) -> list:
    """The deviating members' addresses (engine.recording.scan_py's ``member_addresses``) from their registrations: the
    address of every interval of the member in the group that overlaps the span (an open one runs to the end)."""
    out: Dict[Tuple[str, str], set] = defaultdict(set)
    for group, client, start, end in deviating_members([r for r in inconsistent if r.get("source") == "members"]):
        for a, b, addr in member_addrs.get((group, client), ()):
            if a < end and (b is None or b > start):
                out[(group, client)].update([addr] if addr else [])
    return [{"broker": broker, "group": g, "client_id": c, "addrs": sorted(x)} for (g, c), x in sorted(out.items())]


def _expired(expiries, registers, groups_of, params, broker) -> list:
    rows: list = []
    open_rows: Dict[Tuple[str, str], dict] = {}
    for addr, t, client, role, group, since, cause, lut in expiries:
        r = open_rows.get((addr, cause))
        if r is None or t - r["expired_ms"] > EXPIRY_GROUPING_MS:
            r = {"broker": broker, "client_id": client, "addr": addr, "expired_ms": t, "groups": set(),
                 "roles": set(), "connected_ms": since, "cause": cause, "_last": lut}
            open_rows[(addr, cause)] = r
            rows.append(r)
        if r["client_id"] is None:
            r["client_id"] = client
        if not (role == "producer" and group == CLIENT_INNER_PRODUCER):
            r["groups"].add(group)
        r["roles"].add(role)
        if since is not None and (r["connected_ms"] is None or since < r["connected_ms"]):
            r["connected_ms"] = since
    out = []
    for r in rows:
        regs = registers.get(r["client_id"], []) if r["client_id"] else []
        i = bisect.bisect_right(regs, r["expired_ms"])
        last = r.pop("_last")
        out.append({**r, "groups": sorted(r["groups"]), "roles": sorted(r["roles"]),
                    "silent_since_before_ms": r["expired_ms"] - params.expiry_ms if last is None else last,
                    "returned_ms": regs[i] if i < len(regs) else None})
    return sorted(out, key=lambda r: (r["expired_ms"], r["addr"]))


def _vanished(closes, registers, broker) -> list:
    """Connections that ended without an UNREGISTER_CLIENT (a NETTY EVENT close with a recent last heartbeat), of
    clients that did not register again: one row per connection (its close lines within EXPIRY_GROUPING_MS)."""
    rows: list = []
    open_rows: Dict[str, dict] = {}
    for addr, t, client, role, group, since, lut in closes:
        r = open_rows.get(addr)
        if r is None or t - r["ended_ms"] > EXPIRY_GROUPING_MS:
            r = {"broker": broker, "client_id": client, "addr": addr, "ended_ms": t, "groups": set(), "roles": set(),
                 "connected_ms": since, "last_heartbeat_ms": lut}
            open_rows[addr] = r
            rows.append(r)
        if not (role == "producer" and group == CLIENT_INNER_PRODUCER):
            r["groups"].add(group)
        r["roles"].add(role)
        if since is not None and (r["connected_ms"] is None or since < r["connected_ms"]):
            r["connected_ms"] = since
        if lut is not None and (r["last_heartbeat_ms"] is None or lut > r["last_heartbeat_ms"]):
            r["last_heartbeat_ms"] = lut
    out = []
    for r in rows:
        regs = registers.get(r["client_id"], [])
        if bisect.bisect_right(regs, r["ended_ms"]) < len(regs):
            continue  # it came back: a restart or a reconnect, not a vanished client
        out.append({**r, "groups": sorted(r["groups"]), "roles": sorted(r["roles"])})
    return sorted(out, key=lambda r: (r["ended_ms"], r["addr"]))


def _retry(retry, params, broker) -> list:
    out = []
    for group, r in sorted(retry.items()):
        ms = sorted(r["ms"])
        flagged = _window_counts(ms, params.window_ms, params.flap_min_reconnects)
        if flagged:
            out.append({"broker": broker, "group": group, "retry_topic": r["retry_topic"], "adds": r["adds"],
                        "changes": r["changes"], "removes": r["removes"], "first_ms": ms[0], "last_ms": ms[-1],
                        "max_per_window": max(n for _, n in flagged), "windows": flagged})
    return out


def combine(per_broker: List[dict], info: dict, params: ScanParams, client_ids: bool = False) -> dict:
    """One findings dict (recording-scan format + log keys) from per-broker findings and the log info.
    ``client_ids``: also list the distinct clients (``_client_ids``, for merging with a capture: bindings.merge)."""
    findings = {k: [] for k in LOG_FINDING_KEYS}
    findings["member_addresses"] = []
    findings["broker_boots"] = []
    clients, unattributed, reasons, explained, at_boot = set(), defaultdict(int), defaultdict(int), defaultdict(int), {}
    never_registered = {}  # per broker: whether its lines were dropped or an older file is missing is its own log's
    for f in per_broker:
        for k in LOG_FINDING_KEYS + ("member_addresses", "broker_boots"):
            findings[k] += f.get(k, [])
        clients.update(f["_clients"])
        for k, v in f["_unattributed"].items():
            unattributed[k] += v
        for k, v in f.get("_reasons", {}).items():
            reasons[k] += v
        for k, v in f.get("_explained", {}).items():
            explained[k] += v
        at_boot.update(f.get("_starts_at_boot", {}))
        if f.get("_reasons", {}).get("never_registered"):
            for b in f.get("_starts_at_boot", {}):
                never_registered[b] = f["_reasons"]["never_registered"]
    order = {"group_sizes": ("group", "role", "broker"), "flapping_clients": ("client_id", "broker"),
             "expired_clients": ("expired_ms", "addr", "broker"), "retry_topic_churn": ("group", "broker"),
             "vanished_clients": ("ended_ms", "addr", "broker"),
             "inconsistent_subscriptions": ("group", "start_ms", "source", "broker")}
    for k, fields in order.items():
        findings[k].sort(key=lambda r: tuple(r[x] for x in fields))
    findings["summary"] = {"records": info.get("events", 0), "bad_bodies": info.get("unparseable", 0),
                           "clients": len(clients), "first_ms": info.get("first_ms"), "last_ms": info.get("last_ms"),
                           **{k: len(findings[k]) for k in LOG_FINDING_KEYS}}
    findings["parameters"] = asdict(params)
    if len(info.get("brokers") or []) > 1:
        findings["fleet"] = fleet_findings(findings, info["brokers"])
    findings["unsupported"] = dict(UNSUPPORTED)
    findings["broker_boots"].sort(key=lambda r: (r["broker"], r["start_ms"] is None, r["start_ms"] or 0,
                                                 r["stopped_ms"] or 0))
    # unattributed_events: close / unregister / consumer_data lines no live member explains, by kind; their
    # reasons: never_registered (the member's register line is not in the log: an older file missing, or lines
    # the broker dropped) or not_live (the member had left already); explained_events: the normal lines of
    # members the SCAN, the idle handler or the broker's stop had removed before; starts_at_boot per broker, and
    # never_registered_by_broker (a broker whose log starts at a boot dropped those register lines itself)
    findings["log"] = {**info, "unattributed_events": dict(unattributed), "unattributed_reasons": dict(reasons),
                       "explained_events": dict(explained), "starts_at_boot": dict(sorted(at_boot.items())),
                       "never_registered_by_broker": dict(sorted(never_registered.items()))}
    # what could not be read (overlong lines, truncated or unreadable files, impossible times) is damage, named as
    # a recording's is: the DAMAGED INPUT banner, one stderr line, exit 3
    findings["scan"] = {"torn_tails": [], "corrupt": list(info.get("damage") or [])}
    if client_ids:
        findings["_client_ids"] = sorted(clients)
    return findings


def analyze_events(events: Iterable[dict], info: Optional[dict] = None, params: ScanParams = ScanParams(),
                   client_ids: bool = False) -> dict:
    """Findings over events of any number of brokers (the reference the Spark scan reproduces)."""
    params.validate()
    per: Dict[str, list] = defaultdict(list)
    for e in events:
        per[e["broker"]].append(e)
    info = dict(info or {})
    all_ts = [e["ts_ms"] for evs in per.values() for e in evs]
    info.setdefault("first_ms", min(all_ts) if all_ts else None)
    info.setdefault("last_ms", max(all_ts) if all_ts else None)
    info.setdefault("events", len(all_ts))
    return combine([analyze_broker(per[b], params) for b in sorted(per)], info, params, client_ids)


def scan_local(paths, *, log_tz=None, brokers=None, params: ScanParams = ScanParams(), native=None,
               max_line_bytes: Optional[int] = None, client_ids: bool = False) -> dict:
    """Read and analyse logs in this process (no Spark)."""
    table, info = read_local(paths, log_tz=log_tz, brokers=brokers, native=native, max_line_bytes=max_line_bytes)
    return analyze_events(table.to_pylist(), info, params, client_ids)


# ---------------------------------------------------------------------------------------------------------------
# generated logs with injected anomalies (tests and bench/bench_brokerlog.py)

_CCI = ("ClientChannelInfo [channel=[id: 0x{cid:08x}, L:/10.0.0.1:10911 {st} R:/{addr}], clientId={client}, "
        "language=JAVA, version=409, lastUpdateTimestamp={lut}]")
_SD = ("SubscriptionData [classFilterMode=false, topic={topic}, subString={sub}, tagsSet=[{tags}], codeSet=[], "
       "subVersion={ver}, expressionType=TAG]")


def _fmt_ts(ms: int, off_min: int) -> str:
    return (datetime(1970, 1, 1) + timedelta(milliseconds=ms + off_min * 60_000)).strftime("%Y-%m-%d %H:%M:%S")


class _LogWriter:
    def __init__(self, off_min: int):
        self.off = off_min
        self.lines: List[Tuple[int, int, str]] = []
        self.n = 0

    def add(self, ms: int, level: str, thread: str, msg: str):
        self.lines.append((ms, self.n, f"{_fmt_ts(ms, self.off)} {level} {thread} - {msg}"))
        self.n += 1

    def raw(self, ms: int, text: str):
        self.lines.append((ms, self.n, text))
        self.n += 1


def generate_broker_log(path, *, groups: int = 3, members: int = 4, restarts: int = 0, duration_s: int = 3600,
                        start_ms: int = 1_795_400_000_000, tz_offset_min: int = 480, noise: int = 1,
                        inject: bool = True, seed: int = 0, history: bool = False,
                        broker_name: str = "broker-a") -> dict:
    """Write a 4.9.8-style broker.log of a fleet (``groups`` consumer groups of ``members`` clients, each also a
    producer; every group is redeployed ``restarts`` times, rolling, each client restarting cleanly once per
    deploy: at most max_restarts) and return its manifest: the injected anomalies
    with the exact findings they must give, and the line counts per category.

    Injected (``inject``): a client of group 0 that reconnects 4 times in 4 minutes (NETTY EVENT closes, new
    address each time), a client of group 1 that freezes and is expired by SCAN, then comes back; a BROADCASTING
    member of group 0 for 5 minutes (its heartbeats remove the group's retry subscription, the others' add it back:
    retry-topic churn, and a member with another set); an extra member of group 2 (if any) with another tag for 10 minutes (its heartbeats and the others' flip the group's table),
    and damaged lines (a truncated register, an unknown format, a stack trace).

    ``history``: also a broker's history (issue 28): the log starts at the broker's boot; a client frozen until
    the broker's Netty idle handler closes its channel (an expiry, cause idle_closed); a client killed (a NETTY
    EVENT close with a recent heartbeat, never back: a vanished client); the unregister lines of a member whose
    register lines the broker dropped (unattributed, never_registered); a Java stack trace (a header-less
    exception line and a frame: continuation lines); and, after the fleet's last event, the broker stopped and
    started again, every live client registering again on a new connection (manifest ``boots``; ``broker_name``
    is the name its boot lines give)."""
    import random

    rnd = random.Random(seed)
    w = _LogWriter(tz_offset_min)
    end_ms = start_ms + duration_s * 1000
    state = {"cid": 1}
    manifest = {"flapping": [], "expired": [], "inconsistent": [], "flips": [], "retry_churn": [],
                "counts": defaultdict(int), "tz_offset_min": tz_offset_min}
    if history:
        manifest.update(vanished=[], boots=[], causes={}, unattributed={}, unattributed_reasons={})
    group_live = defaultdict(int)
    retry_version: Dict[int, int] = {}  # the group's table: its retry subscription's subVersion
    ports: Dict[str, int] = {}

    def conn(client):
        # the client's own host (its clientId's IP) and its next ephemeral port (Linux: 32768-60999)
        state["cid"] += 1
        port = ports.get(client, 32768 + rnd.randint(0, 20000)) + 1 + rnd.randint(0, 40)
        ports[client] = port = 32768 + (port - 32768) % 28232
        return {"client": client, "addr": f"{client.split('@')[0]}:{port}", "cid": state["cid"]}

    def cci(c, ms, st="-"):
        return _CCI.format(cid=c["cid"], st=st, addr=c["addr"], client=c["client"], lut=ms)

    def sd(topic, sub, ver):
        tags = ", ".join(x.strip() for x in sub.split("||")) if sub != "*" else ""
        return _SD.format(topic=topic, sub=sub, tags=tags, ver=ver)

    def _register(c, g, ms, sub="TagA || TagB", first_ever=False, broadcast=False):
        cg, pg, topic = f"CID_G{g}", f"PID_G{g}", f"Topic_G{g}"
        th = f"HeartbeatThread_{rnd.randint(1, 8)}"
        model = "BROADCASTING" if broadcast else "CLUSTERING"
        if first_ever:
            w.add(ms, "INFO", th, f"auto create a subscription group, SubscriptionGroupConfig [groupName={cg}, "
                                  "consumeEnable=true, consumeFromMinEnable=true, retryQueueNums=1]")
        w.add(ms, "INFO", th, f"new consumer connected, group: {cg} CONSUME_PASSIVELY {model} channel: {cci(c, ms)}")
        retry = sd(f"%RETRY%{cg}", "*", ms - 100)
        main = sd(topic, sub, ms - 101)
        if broadcast:  # no retry subscription (injected into a live group: its table's retry topic goes below)
            pass
        elif group_live[g] and g in retry_gone:  # a member's heartbeat without it removed it: added back
            _retry_add(c, g, ms, th, retry)
        elif group_live[g] == 0:
            w.add(ms, "INFO", th, f"subscription changed, add new topic, group: {cg} {retry}")
            w.add(ms, "INFO", th, f"subscription changed, add new topic, group: {cg} {main}")
            manifest["counts"]["event_sub_add"] += 2
        else:
            # a consumer instance that starts subscribes with subVersion = its start time: ConsumerGroupInfo logs
            # the newer version of the group's topics (as every restart in the 4.9.8 sample log; the main topic's
            # line is left out here, its expression being the flips' injection's)
            w.add(ms, "INFO", th, f"subscription changed, group: {cg} OLD: "
                                  f"{sd(f'%RETRY%{cg}', '*', retry_version.get(g, ms - 60_100))} NEW: {retry}")
            manifest["counts"]["event_sub_change"] += 1
        if not broadcast:
            retry_version[g] = ms - 100
        w.add(ms, "INFO", th, f"registerConsumer info changed ConsumerData [groupName={cg}, consumeType="
                              f"CONSUME_PASSIVELY, messageModel={model}, consumeFromWhere=CONSUME_FROM_LAST_OFFSET, "
                              f"unitMode=false, subscriptionDataSet=[{main if broadcast else retry + ', ' + main}]] "
                              f"{c['addr']}")
        w.add(ms, "INFO", th, f"new producer connected, group: CLIENT_INNER_PRODUCER channel: {cci(c, ms)}")
        w.add(ms, "INFO", th, f"new producer connected, group: {pg} channel: {cci(c, ms)}")
        manifest["counts"]["event_register"] += 3
        manifest["counts"]["event_consumer_data"] += 1
        manifest["counts"]["event_group_created"] += int(first_ever)
        group_live[g] += 1
        for _ in range(noise):
            w.add(ms + 500, "WARN", "PullMessageThread_3", f"the consumer's group info not exist, group: {cg}")
            manifest["counts"]["other"] += 1

    retry_gone: set = set()  # groups whose table's retry subscription a BROADCASTING member's heartbeat removed
    churn: Dict[int, dict] = {}

    def _churn(g, what, ms):
        r = churn.setdefault(g, {"group": f"CID_G{g}", "adds": 0, "changes": 0, "removes": 0, "ms": []})
        r[what] += 1
        r["ms"].append(ms // 1000 * 1000)  # the line's time: whole seconds (a restart's register is not)

    def _retry_add(c, g, ms, th="HeartbeatThread_4", retry=None):
        if g in retry_gone:
            retry = retry or sd(f"%RETRY%CID_G{g}", "*", retry_version.get(g, ms))
            w.add(ms, "INFO", th, f"subscription changed, add new topic, group: CID_G{g} {retry}")
            manifest["counts"]["event_sub_add"] += 1
            retry_gone.discard(g)
            _churn(g, "adds", ms)

    def _retry_remove(c, g, ms):
        if g not in retry_gone:
            w.add(ms, "WARN", "HeartbeatThread_5", f"subscription changed, group: CID_G{g} remove topic %RETRY%CID_G{g} "
                                                   f"{sd(f'%RETRY%CID_G{g}', '*', retry_version.get(g, ms))}")
            manifest["counts"]["event_sub_remove"] += 1
            retry_gone.add(g)
            _churn(g, "removes", ms)

    def _unregister(c, g, ms):
        cg, pg = f"CID_G{g}", f"PID_G{g}"
        th = f"ClientManageThread_{rnd.randint(1, 8)}"
        w.add(ms, "INFO", th, f"unregister a consumer[{cg}] from consumerGroupInfo {cci(c, ms)}")
        group_live[g] -= 1
        manifest["counts"]["event_unregister"] += 3
        if group_live[g] == 0:
            w.add(ms, "INFO", th, f"unregister consumer ok, no any connection, and remove consumer group, {cg}")
            manifest["counts"]["event_group_removed"] += 1
        w.add(ms, "INFO", th, f"unregister a producer[{pg}] from groupChannelTable {cci(c, ms)}")
        w.add(ms, "INFO", th, f"unregister a producer[CLIENT_INNER_PRODUCER] from groupChannelTable {cci(c, ms)}")

    def _closed(c, g, ms, lut=None):
        cg, pg = f"CID_G{g}", f"PID_G{g}"
        x = cci(c, ms if lut is None else lut, "!")
        w.add(ms, "INFO", "NettyEventExecutor", f"NETTY EVENT: remove channel[{x}][{c['addr']}] from ProducerManager "
                                                "groupChannelTable, producer group: CLIENT_INNER_PRODUCER")
        w.add(ms, "INFO", "NettyEventExecutor", f"NETTY EVENT: remove channel[{x}][{c['addr']}] from ProducerManager "
                                                f"groupChannelTable, producer group: {pg}")
        w.add(ms, "WARN", "NettyEventExecutor", f"NETTY EVENT: remove not active channel[{x}] from ConsumerGroupInfo "
                                                f"groupChannelTable, consumer group: {cg}")
        manifest["counts"]["event_closed"] += 3
        group_live[g] -= 1
        if group_live[g] == 0:
            w.add(ms, "INFO", "NettyEventExecutor",
                  f"unregister consumer ok, no any connection, and remove consumer group, {cg}")
            manifest["counts"]["event_group_removed"] += 1

    # the member changes are applied in time order (a group's live count decides its "remove consumer group"
    # and "add new topic" lines), whatever order the fleet and the injections are planned in
    pending: list = []

    def later(fn):
        return lambda c, g, ms, *a, **k: pending.append((ms, len(pending), fn, (c, g, ms) + a, k))

    register, unregister, closed = later(_register), later(_unregister), later(_closed)

    def _left(c, g, ms):
        group_live[g] -= 1

    created = set()
    # steady fleet: every client starts in the first minute; each group is redeployed `restarts` times, rolling
    # (its members restart cleanly one after another, ROLLING_GAP_MS apart), the deploys spread evenly over the log,
    # so a client restarts once per deploy, never often enough to flap (max_restarts)
    restarts = min(restarts, max_restarts(duration_s, members))
    manifest["restarts"] = restarts
    span = duration_s * 1000 - 120_000 - ROLLING_SPREAD_MS - members * ROLLING_GAP_MS
    step = span // (restarts + 1)
    fleet = []
    for g in range(groups):
        deploy = start_ms + 120_000 + rnd.randint(0, ROLLING_SPREAD_MS)  # the groups deploy at different times
        for m in range(members):
            n = g * members + m
            client = f"10.{16 + n // 65536}.{n // 256 % 256}.{n % 256}@{1000 + n}"
            t = start_ms + rnd.randint(0, 60_000)
            c = conn(client)
            fleet.append((g, c))
            register(c, g, t, first_ever=g not in created)
            created.add(g)
            for r in range(restarts):
                t_down = deploy + step * (r + 1) + m * ROLLING_GAP_MS + rnd.randint(0, 1000)
                unregister(c, g, t_down)
                c = conn(client)
                register(c, g, t_down + 2000)
    if inject:
        # a flapping client in group 0: 4 reconnects, 60 s apart
        g = 0
        client = "10.9.0.1@flapper"
        t = start_ms + 600_000
        c = conn(client)
        register(c, g, t)
        rc, connects, closes = [], [t], []
        for k in range(4):
            closed(c, g, t + 55_000)
            closes.append([t + 55_000, "closed"])
            c = conn(client)
            t += 60_000
            register(c, g, t)
            rc.append(t)
            connects.append(t)
        # (each restart logs its retry subscription's newer subVersion, as the sample log: not retry-topic churn)
        manifest["flapping"].append({"client_id": client, "groups": ["CID_G0", "PID_G0"], "reconnect_ms": rc,
                                     "connect_ms": connects, "closes": closes})
        # a frozen client in group 1 (or 0): expired by SCAN, back 20 s later on a new connection
        g = 1 % groups
        client = "10.9.0.2@frozen"
        t0 = start_ms + 1_200_000
        c = conn(client)
        register(c, g, t0)
        t = t0 + 130_000
        th = "ClientHousekeepingScheduledThread1"
        w.add(t, "WARN", th, f"SCAN: remove expired channel[{c['addr']}] from ProducerManager groupChannelTable, "
                             "producer group name: CLIENT_INNER_PRODUCER")
        w.add(t, "WARN", th, f"SCAN: remove expired channel[{c['addr']}] from ProducerManager groupChannelTable, "
                             f"producer group name: PID_G{g}")
        w.add(t, "WARN", th, f"SCAN: remove expired channel from ConsumerManager consumerTable. channel={c['addr']}, "
                             f"consumerGroup=CID_G{g}")
        manifest["counts"]["event_expired"] += 3
        later(_left)(c, g, t)
        addr = c["addr"]
        c = conn(client)
        register(c, g, t + 20_000)
        manifest["expired"].append({"client_id": client, "addr": addr, "expired_ms": t,
                                    "groups": [f"CID_G{g}", f"PID_G{g}"], "connected_ms": t0,
                                    "returned_ms": t + 20_000})
        # retry-topic churn: a BROADCASTING member (no retry subscription) in group 0 for 5 minutes; each of its
        # heartbeats removes %RETRY%CID_G0 from the group's table, the next CLUSTERING member's heartbeat adds it back
        g = 0
        client = "10.9.0.4@broadcast"
        t3 = start_ms + 2_400_000
        c = conn(client)
        register(c, g, t3, broadcast=True)
        for k in range(4):
            later(_retry_remove)(c, g, t3 + k * 30_000 + 1_000)
            later(_retry_add)(c, g, t3 + k * 30_000 + 11_000)
        unregister(c, g, t3 + 300_000)
        manifest["inconsistent"].append({
            "group": "CID_G0", "start_ms": t3, "end_ms": t3 + 300_000,
            "variants": [{"subscriptions": [["%RETRY%CID_G0", "TAG", "*"], ["Topic_G0", "TAG", "TagA || TagB"]],
                          "clients": sorted([c2["client"] for g2, c2 in fleet if g2 == g] + ["10.9.0.1@flapper"]
                                            + (["10.9.0.2@frozen"] if 1 % groups == g else []))},
                         {"subscriptions": [["Topic_G0", "TAG", "TagA || TagB"]], "clients": [client]}]})
        if groups >= 3:
            # an extra member of group 2 subscribing with another tag for 10 minutes
            g = 2
            client = "10.9.0.3@odd"
            t1 = start_ms + 1_800_000
            c = conn(client)
            register(c, g, t1, sub="TagC")
            cg = f"CID_G{g}"
            ab, cc = sd(f"Topic_G{g}", "TagA || TagB", 1), sd(f"Topic_G{g}", "TagC", 2)
            flips = []
            for k in range(4):  # the table follows whichever member heartbeated last
                old, new = (ab, cc) if k % 2 == 0 else (cc, ab)
                w.add(t1 + k * 30_000, "INFO", "HeartbeatThread_2",
                      f"subscription changed, group: {cg} OLD: {old} NEW: {new}")
                manifest["counts"]["event_sub_change"] += 1
                if k:
                    flips.append(t1 + k * 30_000)
            t2 = t1 + 600_000
            unregister(c, g, t2)
            others = sorted(c2["client"] for g2, c2 in fleet if g2 == g)
            manifest["inconsistent"].append({
                "group": cg, "start_ms": t1, "end_ms": t2,
                "variants": [{"subscriptions": [[f"%RETRY%{cg}", "TAG", "*"], [f"Topic_G{g}", "TAG", "TagA || TagB"]],
                              "clients": others},
                             {"subscriptions": [[f"%RETRY%{cg}", "TAG", "*"], [f"Topic_G{g}", "TAG", "TagC"]],
                              "clients": [client]}]})
            manifest["flips"].append({"group": cg, "topic": f"Topic_G{g}", "flips": len(flips),
                                      "start_ms": flips[0], "end_ms": flips[-1]})
        # damage: never fatal, counted
        t = start_ms + 900_000
        w.add(t, "INFO", "HeartbeatThread_1", "new consumer connected, group: CID_G0 CONSUME_PASSIVELY CLUSTERING "
                                              "channel: ClientChannelInfo [channel=[id: 0x1, L:/10.0.0.1:10911 - R:/10.")
        manifest["counts"]["malformed_register"] += 1
        w.raw(t, "Nov 24, 2026 8:48:06 AM org.apache.rocketmq.broker.BrokerStartup main")
        manifest["counts"]["unknown_format"] += 1
        w.add(t, "ERROR", "NettyServerNIOSelector_3_2", "processRequestWrapper response to /10.1.1.1:1 failed")
        w.raw(t, "\tat io.netty.channel.AbstractChannel.write(AbstractChannel.java:304)")
        manifest["counts"]["other"] += 1
        manifest["counts"]["continuation"] += 1
    if history:
        _history(start_ms, end_ms, groups, inject, fleet, w, manifest, conn, register, closed, later, group_live,
                 retry_gone, broker_name)
    for _, _, fn, a, k in sorted(pending, key=lambda x: x[:2]):
        fn(*a, **k)
    manifest["retry_churn"] = [churn[g] for g in sorted(churn)]
    manifest["inconsistent"].sort(key=lambda r: (r["group"], r["start_ms"]))
    w.lines.sort()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open(path, "wt") if path.name.endswith(".gz") else open(path, "w")) as f:
        for _, _, line in w.lines:
            f.write(line)
            f.write("\n")
    manifest["counts"] = dict(sorted(manifest["counts"].items()))
    manifest["lines"] = len(w.lines)
    manifest["end_ms"] = end_ms
    return manifest


def _history(start_ms, end_ms, groups, inject, fleet, w, manifest, conn, register, closed, later, group_live,
             retry_gone, name):
    """generate_broker_log's ``history`` injections (its docstring), with what the scan must find."""
    counts = manifest["counts"]
    addr = "10.0.0.1:10911"  # the L:/ address of the generated channels

    def boot(ms):
        w.add(ms, "INFO", "main", "rocketmqHome=/opt/rocketmq")
        w.add(ms + 3000, "INFO", "main", f"The broker[{name}, {addr}] boot success. serializeType=JSON and name "
                                         "server is 127.0.0.1:9876")
        counts["event_broker_start"] += 1
        counts["event_broker_boot"] += 1

    def stop(c, g, ms):  # applied in time order: the broker's tables are empty after it
        w.add(ms, "INFO", "ShutdownHook", "Shutdown hook was invoked, 1")
        counts["event_broker_stop"] += 1
        group_live.clear()
        retry_gone.clear()

    boot(start_ms - 60_000)
    manifest["boots"].append({"start_ms": start_ms - 60_000, "ready_ms": start_ms - 57_000, "name": name,
                              "addr": addr, "stopped_ms": None, "members_ended": 0, "clients_ended": 0})
    # frozen until the idle handler closes it: its lastUpdateTimestamp (its register, its last heartbeat) 130 s old
    g, client, t = 1 % groups, "10.9.0.5@idle", start_ms + 3_000_000
    c = conn(client)
    register(c, g, t)
    closed(c, g, t + 130_000, lut=t)
    manifest["expired"].append({"client_id": client, "addr": c["addr"], "expired_ms": t + 130_000,
                                "groups": [f"CID_G{g}", f"PID_G{g}"], "connected_ms": t, "returned_ms": None})
    manifest["causes"][client] = "idle_closed"
    # killed (kill -9): its channel closed 5 s after its last heartbeat, no unregister, never back
    client, t = "10.9.0.6@killed", start_ms + 3_100_000
    c = conn(client)
    register(c, 0, t)
    closed(c, 0, t + 50_000, lut=t + 45_000)
    manifest["vanished"].append({"client_id": client, "addr": c["addr"], "ended_ms": t + 50_000,
                                 "groups": ["CID_G0", "PID_G0"], "connected_ms": t, "last_heartbeat_ms": t + 45_000})
    # a Java stack trace after the failed write to it: its exception line has no header
    w.add(t + 51_000, "ERROR", "NettyServerNIOSelector_3_2", f"processRequestWrapper response to /{c['addr']} failed")
    w.raw(t + 51_000, "java.nio.channels.ClosedChannelException: null")
    w.raw(t + 51_000, "\tat io.netty.channel.AbstractChannel$AbstractUnsafe.write(AbstractChannel.java:865)")
    counts["other"] += 1
    counts["continuation"] += 2
    # a member whose register lines the broker dropped (its async appender's queue full): its unregister lines only
    client, t = "10.9.0.7@dropped", start_ms + 3_200_000
    c = conn(client)
    x = _CCI.format(cid=c["cid"], st="-", addr=c["addr"], client=client, lut=t)
    for what in ("a consumer[CID_G0] from consumerGroupInfo", "a producer[PID_G0] from groupChannelTable",
                 "a producer[CLIENT_INNER_PRODUCER] from groupChannelTable"):
        w.add(t, "INFO", "ClientManageThread_1", f"unregister {what} {x}")
    counts["event_unregister"] += 3
    manifest["unattributed"] = {"unregister": 3}
    manifest["unattributed_reasons"] = {"never_registered": 3}
    # the broker stops after the fleet's last event and starts a minute later: every live client registers again
    t_stop = max(end_ms, start_ms + 3_400_000) + 60_000
    later(stop)(None, None, t_stop)
    boot(t_stop + 60_000)
    alive = [(g, c2["client"]) for g, c2 in fleet]
    if inject:
        alive += [(0, "10.9.0.1@flapper"), (1 % groups, "10.9.0.2@frozen")]
    for k, (g, client) in enumerate(alive):
        t = t_stop + 70_000 + (k // 10) * 1000
        register(conn(client), g, t)
        for r in manifest["flapping"]:
            if r["client_id"] == client:
                r["connect_ms"].append(t)  # a connect after the restart, not a reconnect
    manifest["boots"].append({"start_ms": t_stop + 60_000, "ready_ms": t_stop + 63_000, "name": name, "addr": addr,
                              "stopped_ms": t_stop, "members_ended": 3 * len(alive), "clients_ended": len(alive)})


MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "rmqhb-synth-broker-log-manifest/1"


def compare_with_manifest(findings: dict, manifest: dict, broker: Optional[str] = None) -> List[str]:
    """Differences between a log scan's findings and what ``generate_broker_log`` injected into one broker's log
    (``broker``: only that broker's findings; None: all of them). Empty when the scan found exactly the
    injections: flapping clients, expired clients and their causes, members with different subscriptions,
    group-table flips, retry-topic churn, vanished clients, broker boots, the line counts by kind and the
    unattributed lines (the last three and vanished clients empty unless ``history`` injected them)."""
    def mine(key):
        return [r for r in findings[key] if broker is None or r.get("broker") == broker]

    problems = []

    def check(what, got, want):
        if got != want:
            problems.append(f"{what}{'' if broker is None else ' (' + broker + ')'}: found {got}, injected {want}")

    check("flapping_clients", [(r["client_id"], r["groups"], r["reconnect_ms"], r["connect_ms"], r["closes"])
                               for r in mine("flapping_clients")],
          [(x["client_id"], x["groups"], x["reconnect_ms"], x["connect_ms"], x["closes"]) for x in manifest["flapping"]])
    causes = manifest.get("causes", {})  # a broker's history (idle closes); else every expiry is the SCAN's
    check("expired_clients", [{k: r[k] for k in ("client_id", "addr", "expired_ms", "groups", "connected_ms",
                                                  "returned_ms", "cause")} for r in mine("expired_clients")],
          [{**x, "cause": causes.get(x["client_id"], "scan")} for x in manifest["expired"]])
    inc = mine("inconsistent_subscriptions")
    check("inconsistent_subscriptions (members)",
          [{k: r[k] for k in ("group", "start_ms", "end_ms", "variants")} for r in inc if r["source"] == "members"],
          manifest["inconsistent"])
    check("inconsistent_subscriptions (group table flips)",
          [{k: r[k] for k in ("group", "topic", "flips", "start_ms", "end_ms")} for r in inc
           if r["source"] == "group_table"], manifest["flips"])
    check("retry_topic_churn", [(r["group"], r["adds"], r["changes"], r["removes"], r["first_ms"], r["last_ms"])
                                for r in mine("retry_topic_churn")],
          [(x["group"], x["adds"], x["changes"], x["removes"], x["ms"][0], x["ms"][-1])
           for x in manifest.get("retry_churn", [])])
    check("heartbeat_gaps", findings["heartbeat_gaps"], [])
    # a broker's history: what a log without it must not show (vanished clients, restarts), and with it, exactly
    # what was injected
    check("vanished_clients", [{k: r[k] for k in ("client_id", "addr", "ended_ms", "groups", "connected_ms",
                                                   "last_heartbeat_ms")} for r in mine("vanished_clients")],
          manifest.get("vanished", []))
    check("broker_boots", [{k: v for k, v in r.items() if k != "broker"} for r in mine("broker_boots")],
          manifest.get("boots", []))
    if broker is None:
        check("unattributed_events", findings["log"]["unattributed_events"], manifest.get("unattributed", {}))
        check("unattributed_reasons", findings["log"]["unattributed_reasons"],
              manifest.get("unattributed_reasons", {}))
        check("line counts", findings["log"]["counts"], manifest["counts"])
    return problems


def compare_with_generated(findings: dict, doc: dict) -> List[str]:
    """``compare_with_manifest`` for every broker of an ``rmqhb generate --format broker-log`` manifest, plus
    the line counts of all of them together (a broker of one log directory is named after it)."""
    problems = []
    totals: Dict[str, Dict[str, int]] = {k: defaultdict(int) for k in ("counts", "unattributed",
                                                                       "unattributed_reasons")}
    for broker, manifest in doc["brokers"].items():
        problems += compare_with_manifest(findings, manifest, broker)
        for key, total in totals.items():
            for k, v in manifest.get(key, {}).items():
                total[k] += v
    for key, found in (("counts", "counts"), ("unattributed", "unattributed_events"),
                       ("unattributed_reasons", "unattributed_reasons")):
        want = dict(sorted(totals[key].items()))
        if dict(sorted(findings["log"][found].items())) != want:
            problems.append(f"{'line counts' if key == 'counts' else found}: found {findings['log'][found]}, "
                            f"generated {want}")
    if sorted(findings["log"]["brokers"]) != sorted(doc["brokers"]):
        problems.append(f"brokers: found {findings['log']['brokers']}, generated {sorted(doc['brokers'])}")
    return problems


#: A generated group's rolling deploy restarts its members this far apart; the groups' deploys start up to
#: ROLLING_SPREAD_MS apart.
ROLLING_GAP_MS = 30_000
ROLLING_SPREAD_MS = 600_000
#: A generated client restarts at most once per this time (a real fleet restarts rarely: a deploy, a host
#: update), so a steady client never reaches the flapping finding's 3 reconnects in a 600 s window.
MIN_RESTART_INTERVAL_MS = 1_200_000


def max_restarts(duration_s: float, members: int) -> int:
    """The most rolling deploys a generated log of ``duration_s`` holds with a client's restarts at least
    MIN_RESTART_INTERVAL_MS apart."""
    span = duration_s * 1000 - 120_000 - ROLLING_SPREAD_MS - members * ROLLING_GAP_MS
    return max(0, int(span // MIN_RESTART_INTERVAL_MS) - 1)


def groups_for_lines(target_lines: int, members: int, restarts: int, noise: int = 1) -> int:
    """Consumer groups (of ``members`` clients) that give a log of about ``target_lines`` lines: a larger fleet,
    not more restarts per client (a client's start writes ~5 + noise lines, a restart 8 + noise more)."""
    per_client = (5 + noise) + restarts * (8 + noise)
    return max(1, round(target_lines / (max(1, members) * per_client)))


def generate_main(argv=None) -> int:
    """`rmqhb generate OUT --format broker-log`: write realistic RocketMQ 4.9.8-style broker logs of a synthetic
    fleet (one directory per broker with --brokers N > 1, else OUT/broker.log) with injected anomalies (a
    flapping client, a client expired by the broker's SCAN, a member with another subscription flipping its
    group's table, retry-topic churn from a BROADCASTING member, damaged lines) and OUT/manifest.json: what a scan must find, exactly."""
    import argparse
    import sys
    import time

    p = argparse.ArgumentParser(prog="rmqhb generate", description=generate_main.__doc__)
    p.add_argument("out", type=Path, help="output directory (created)")
    p.add_argument("--format", default="broker-log", choices=["broker-log"])
    p.add_argument("--brokers", type=int, default=1, help="brokers (one log directory each when > 1)")
    p.add_argument("--groups", type=int, default=20, help="consumer groups per broker")
    p.add_argument("--members", type=int, default=20, help="clients per group")
    p.add_argument("--restarts", type=int, default=2,
                   help="rolling deploys of every group (each client restarts cleanly once per deploy; at most one "
                        "per 20 minutes of the log)")
    p.add_argument("--lines", type=int, default=None,
                   help="aim for about this many lines per broker (sets --groups: a larger fleet)")
    p.add_argument("--hours", type=float, default=24.0, help="time the log covers")
    p.add_argument("--start-ms", type=int, default=1_795_400_000_000)
    p.add_argument("--tz-offset", default="+08:00", help="zone the wall-clock times are written in (+HH:MM)")
    p.add_argument("--noise", type=int, default=1, help="unrelated lines per client start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-anomalies", action="store_true", help="a clean fleet (the manifest lists nothing)")
    p.add_argument("--history", action="store_true",
                   help="also a broker's history: the log starts at a boot, a client closed idle, a client killed, a "
                        "member whose register lines the broker dropped, a Java stack trace, and a broker restart "
                        "after the fleet's last event")
    p.add_argument("--gzip", action="store_true", help="write broker.log.gz")
    args = p.parse_args(argv)
    m = re.fullmatch(r"([+-])(\d{1,2}):?(\d{2})?", args.tz_offset)
    if not m:
        print(f"rmqhb generate: --tz-offset wants +HH:MM, not {args.tz_offset!r}", file=sys.stderr)
        return 2
    off = (int(m.group(2)) * 60 + int(m.group(3) or 0)) * (1 if m.group(1) == "+" else -1)
    if args.brokers < 1 or args.groups < 1 or args.members < 1 or args.hours * 3600 < 600 or args.restarts < 0:
        print("rmqhb generate: --brokers, --groups and --members must be >= 1, --hours >= 1/6", file=sys.stderr)
        return 2
    if args.out.exists() and (args.out / MANIFEST_NAME).exists():
        print(f"{args.out} already holds a manifest; use an empty directory", file=sys.stderr)
        return 2
    restarts = min(args.restarts, max_restarts(args.hours * 3600, args.members))
    if args.lines:
        args.groups = groups_for_lines(args.lines, args.members, restarts, args.noise)
    name = "broker.log.gz" if args.gzip else "broker.log"
    t0 = time.perf_counter()
    brokers = {}
    for k in range(args.brokers):
        broker = args.out.resolve().name if args.brokers == 1 else f"broker-{chr(ord('a') + k) if k < 26 else k}"
        path = args.out / name if args.brokers == 1 else args.out / broker / name
        mf = generate_broker_log(path, groups=args.groups, members=args.members, restarts=restarts,
                                 duration_s=int(args.hours * 3600), start_ms=args.start_ms, tz_offset_min=off,
                                 noise=args.noise, inject=not args.no_anomalies, seed=args.seed + k,
                                 history=args.history, broker_name=broker)
        mf["file"] = str(path.relative_to(args.out))
        brokers[broker] = mf
    doc = {"format": MANIFEST_FORMAT, "log_tz": args.tz_offset, "restarts": restarts, "brokers": brokers}
    (args.out / MANIFEST_NAME).write_text(json.dumps(doc, indent=1))
    lines = sum(b["lines"] for b in brokers.values())
    size = sum((args.out / b["file"]).stat().st_size for b in brokers.values())
    print(f"{lines:,} log lines of {args.brokers} broker(s) ({args.groups * args.members} clients each in "
          f"{args.groups} groups, {restarts} rolling restarts), {size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s; zone {args.tz_offset} "
          f"(scan with --log-tz {args.tz_offset}) -> {args.out / MANIFEST_NAME}")
    return 0


def load_manifest(directory) -> dict:
    return json.loads((Path(directory) / MANIFEST_NAME).read_text())


# ---------------------------------------------------------------------------------------------------------------
# Spark: reader, scan, `rmqhb scan --input broker-log`

STATS_KIND = "_stats"  # one row per file task carrying its line counts (sub_key = JSON), filtered out of events


def _stats_batch(broker: str, path: str, payload: dict, sch=None):
    import pyarrow as pa

    sch = sch or events_schema()
    values = {"broker": broker, "file": path, "kind": STATS_KIND, "role": "", "seq": 0, "ts_ms": 0, "line": 0,
              "sub_key": json.dumps(payload)}
    return pa.RecordBatch.from_arrays([pa.array([values.get(f.name)], f.type) for f in sch], schema=sch)


class EventColumnsError(RemotingError, ValueError):
    """``read_broker_logs(columns=...)`` names no column, a column twice, or one the event frame does not have."""


#: The event columns the scan's analyses read (``analyze_broker``: the broker, the order, the kind and role, the
#: member, its address, the subscription fields and the member's subscription set); the scan asks its tasks for
#: these only (``read_broker_logs(columns=SCAN_COLUMNS)``), as Spark cannot prune the output of mapInArrow.
SCAN_COLUMNS = ("broker", "seq", "ts_ms", "kind", "role", "group", "client_id", "addr", "topic", "sub_string",
                "expression_type", "old_sub_string", "old_expression_type", "sub_key", "last_update_ms")


def event_columns(columns=None) -> Tuple[str, ...]:
    """The event columns a reader task emits: all of ``events_schema()`` (None), or the ``columns`` named, in the
    order given (EventColumnsError for an unknown or repeated name, or none)."""
    names = events_schema().names
    if columns is None:
        return tuple(names)
    cols = (columns,) if isinstance(columns, str) else tuple(columns)
    unknown = [c for c in cols if c not in names]
    if unknown or not cols or len(set(cols)) != len(cols):
        raise EventColumnsError(f"columns must name distinct event columns ({', '.join(names)}); got {list(cols)!r}"
                                + (f" (unknown: {', '.join(map(str, unknown))})" if unknown else ""))
    return cols


def _frame_schema(columns: Tuple[str, ...]):
    import pyarrow as pa

    sch = events_schema()
    return pa.schema([sch.field(c) for c in columns])


#: Lines per event batch a ``read_broker_logs`` task emits, cut from reads of ``READER_CHUNK_BYTES``: Spark's
#: cost per output batch (the JVM's Arrow reader, the row iterator) is paid ~4x less often than with 10k-line
#: batches (BENCHMARKS.md, broker-log section). The scan's reader keeps ``BATCH_LINES`` (its zone samples are
#: the first batch's).
READER_BATCH_LINES = 65_536
READER_CHUNK_BYTES = 32 << 20


def _read_task(plan, tz_label, native, batches, with_stats=True, columns=None, window=None, max_line_bytes=None):
    tz = resolve_tz(tz_label)[0]
    size = {} if with_stats else {"batch_lines": READER_BATCH_LINES, "chunk_bytes": READER_CHUNK_BYTES}
    sch = _frame_schema(columns) if columns is not None else None
    for batch in batches:
        for i in batch.column(0).to_pylist():
            broker, path, rank = plan[i]
            stats, samples = {}, []
            for b, s, z in file_events(broker, path, rank, tz, native=native, columns=columns, samples=with_stats,
                                       window=window, max_line_bytes=max_line_bytes, **size):
                if with_stats:
                    stats = twin.merge_stats(stats, s)
                    samples += z[: max(0, 64 - len(samples))]
                yield b
            if with_stats:
                yield _stats_batch(broker, path, {"stats": stats, "samples": samples}, sch)


def _raw_frame(spark, plan, tz_label: str, native: Optional[bool], with_stats: bool = True,
               columns: Optional[Tuple[str, ...]] = None, max_line_bytes: Optional[int] = None, window=None):
    """The tasks' output: event rows (``columns`` of them, default all), plus (``with_stats``) one ``STATS_KIND``
    row per file for the scan (then ``kind`` and ``sub_key`` must be among the columns)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    import functools

    cols = event_columns(columns)
    n = len(plan)
    ids = spark.range(0, n, 1, numPartitions=max(1, n))
    # the time window is the driver's (one clock for every task)
    return ids.mapInArrow(functools.partial(_read_task, plan, tz_label, native, with_stats=with_stats,
                                            columns=None if cols == tuple(events_schema().names) else cols,
                                            window=window or ts_window(), max_line_bytes=max_line_bytes),
                          from_arrow_schema(_frame_schema(cols)))


def damage_schema():
    """``read_broker_logs(damage=True)``'s damage frame: one row per damage entry of a file, as ``scan`` names it in
    ``scan.corrupt`` (``file``: its ``segment``; kinds ``overlong_line``, ``truncated``, ``unreadable``,
    ``gzip_budget``, ``bad_timestamp``)."""
    import pyarrow as pa

    return pa.schema([("broker", pa.string()), ("file", pa.string()), ("kind", pa.string()), ("offset", pa.int64()),
                      ("bytes", pa.int64()), ("reason", pa.string())])


def _damage_task(plan, tz_label, native, window, max_line_bytes, batches):
    """The damage of each file of ``plan`` the batches name (read as the event tasks read it), as damage_schema rows."""
    import pyarrow as pa

    tz = resolve_tz(tz_label)[0]
    sch = damage_schema()
    for batch in batches:
        for i in batch.column(0).to_pylist():
            broker, path, rank = plan[i]
            rows = []
            for _, s, _ in file_events(broker, path, rank, tz, native=native, columns=("kind",), samples=False,
                                       window=window, max_line_bytes=max_line_bytes,
                                       batch_lines=READER_BATCH_LINES, chunk_bytes=READER_CHUNK_BYTES):
                rows += [{**{k: d.get(k) for k in sch.names}, "file": d["segment"]} for d in s.get("damage", ())]
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=sch)


def read_broker_logs(spark, paths, *, log_tz: Optional[str] = None, brokers: Optional[Dict[str, str]] = None,
                     native: Optional[bool] = None, columns: Optional[Iterable[str]] = None, damage: bool = False,
                     max_line_bytes: Optional[int] = None):
    """The client-management events of broker logs as a DataFrame (one task per file; see the module doc).
    ``paths``: log files or directories (one per broker, rolled and ``.gz`` files included); ``log_tz``: the
    logs' zone (default: this machine's); ``brokers``: {name: path} (default: a file's directory name);
    ``columns``: the event columns wanted, in that order (default: all of ``events_schema()``). Spark cannot
    prune columns out of a mapInArrow's output, so the tasks emit only these: each column left out saves Spark's
    per-row work on it (``SCAN_COLUMNS``, what the scan's analyses read, costs about three quarters of the CPU
    of all 23; BENCHMARKS.md, broker-log section). EventColumnsError for a name the frame does not have. What a
    file's reader could not use (``file_events``' damage: overlong lines, unreadable or truncated files, a gzip
    past its budget, events out of the time window) is left out of the events; ``damage=True`` returns
    ``(events, damage)``, ``damage`` a DataFrame naming it (``damage_schema``: the entries ``scan`` puts in
    ``scan.corrupt``, for the same time window; ``max_line_bytes`` as ``scan``'s). Each frame reads the files when an action runs it (persist the
    events to read them once for both: the damage frame's tasks parse the files again, emitting only damage)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    cols = event_columns(columns)
    _, label, _ = resolve_tz(log_tz)
    plan = plan_files(paths, brokers)
    # no per-file stats rows, so no filter over every row (measured: a filter's pass costs the JVM ~0.15 CPU-s
    # per million rows here)
    window = ts_window()  # the driver's clock, one for both frames
    events = _raw_frame(spark, plan, label, native, with_stats=False, columns=cols, window=window,
                        max_line_bytes=max_line_bytes)
    if not damage:
        return events
    import functools

    from pyspark.sql.pandas.types import from_arrow_schema

    ids = spark.range(0, len(plan), 1, numPartitions=max(1, len(plan)))
    return events, ids.mapInArrow(functools.partial(_damage_task, plan, label, native, window, max_line_bytes),
                                  from_arrow_schema(damage_schema()))


def _analyze_task(params: ScanParams, table):
    import pyarrow as pa

    rows = table.to_pylist()
    f = analyze_broker(rows, params) if rows else None
    return pa.table({"broker": [rows[0]["broker"] if rows else ""], "findings": [json.dumps(f)]})


def scan(spark, paths, params: ScanParams = ScanParams(), *, log_tz: Optional[str] = None,
         brokers: Optional[Dict[str, str]] = None, native: Optional[bool] = None,
         max_line_bytes: Optional[int] = None, client_ids: bool = False) -> dict:
    """Every analysis over broker logs on Spark: the recording scan's findings format plus ``expired_clients``,
    ``retry_topic_churn``, ``unsupported`` and ``log`` (files, zone, line counts by kind, examples)."""
    import functools
    import time

    from pyspark.sql import functions as F

    params.validate()
    t0 = time.perf_counter()
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tz, label, source = resolve_tz(log_tz)
    plan = plan_files(paths, brokers)
    raw = _raw_frame(spark, plan, label, native, columns=SCAN_COLUMNS, max_line_bytes=max_line_bytes).persist()
    try:
        stats, samples = {}, []
        for r in raw.where(F.col("kind") == STATS_KIND).select("sub_key").collect():
            p = json.loads(r["sub_key"])
            stats = twin.merge_stats(stats, p["stats"])
            samples += [tuple(x) for x in p["samples"]]
        events = raw.where(F.col("kind") != STATS_KIND)
        span = events.agg(F.min("ts_ms").alias("lo"), F.max("ts_ms").alias("hi")).collect()[0]
        per = events.groupBy("broker").applyInArrow(functools.partial(_analyze_task, params),
                                                    "broker string, findings string").collect()
    finally:
        raw.unpersist()
    info = _log_info(plan, stats, samples[:256], tz, label, source)
    info["first_ms"], info["last_ms"] = span["lo"], span["hi"]
    found = [json.loads(r["findings"]) for r in per if r["findings"] != "null"]
    findings = combine(found, info, params, client_ids)
    findings["scan"].update({"method": "broker-log", "files": len(plan),
                             "seconds": round(time.perf_counter() - t0, 3),
                             "parser": "native" if parser(native) is _parse_native else "twin"})
    return findings


def looks_like_logs(paths) -> bool:
    """True when every input is a broker-log file or a directory holding some and no recording segments."""
    return bool(paths) and all(path_kind(p) == "broker-log" for p in paths)


#: Input kinds of `rmqhb scan` (``--format``); ``--input`` is an alias.
INPUT_FORMATS = ("recording", "broker-log", "pcap")
_PCAP_MAGIC = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x0a\x0d\x0d\x0a")
_OPTIONS_WITHOUT_VALUE = ("--no-plots", "--no-dedupe", "--strict", "--allow-damage", "--debug", "--twin", "-h",
                          "--help", "--no-progress")


def _file_kind(f: Path) -> Optional[str]:
    if f.name.endswith(".seg"):
        return "recording"
    try:
        with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as h:
            head = h.read(4)
    except (OSError, EOFError):
        head = b""
    if head in _PCAP_MAGIC:
        return "pcap"
    if is_log_file(f):
        return "broker-log"
    return None


def path_kind(path) -> Optional[str]:
    """What one `rmqhb scan` input is: ``recording`` (a directory of ``*.seg`` segments), ``broker-log`` (a
    broker.log file or a directory holding some), ``pcap`` (a capture file, by its magic number, or a directory
    of them), or None (missing, or nothing known inside)."""
    p = Path(path)
    if p.is_dir():
        if any(p.glob("*.seg")):
            return "recording"
        kinds = set()
        for f in p.rglob("*"):
            if f.is_file():
                k = _file_kind(f) if not f.name.endswith(".json") else None
                if k == "broker-log" and is_broker_log_name(f.name):
                    return "broker-log"
                if k:
                    kinds.add(k)
        return "pcap" if kinds == {"pcap"} else None
    if p.is_file():
        return _file_kind(p)
    return None


def _paths_of(argv) -> List[str]:
    pos, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith("-") and a != "-":
            skip = "=" not in a and a not in _OPTIONS_WITHOUT_VALUE
        else:
            pos.append(a)
    return pos


def input_format(argv) -> Tuple[Optional[str], str]:
    """(kind, why) of an ``rmqhb scan`` command line: ``--format KIND`` (or its alias ``--input KIND``), else
    ``broker-log`` when --log-tz or --broker is given, else what the paths are (``path_kind``; all of one kind),
    else ``recording`` (whose parser then names what is wrong). kind None: the paths mix kinds (why says which)."""
    argv = list(argv or [])
    for i, a in enumerate(argv):
        if a in ("--format", "--input") and i + 1 < len(argv):
            return argv[i + 1], a
        if a.startswith(("--format=", "--input=")):
            return a.split("=", 1)[1], a.split("=", 1)[0]
    if any(a == "--log-tz" or a.startswith("--log-tz=") for a in argv):
        return "broker-log", "--log-tz"
    named = [a.split("=", 1)[1] if a.startswith("--broker=") else (argv[i + 1] if i + 1 < len(argv) else "")
             for i, a in enumerate(argv) if a == "--broker" or a.startswith("--broker=")]
    if named:
        # --broker NAME=PATH: captures when every named path (and every other path) is a capture, else logs
        paths = [spec.partition("=")[2] for spec in named] + _paths_of(argv)
        if paths and all(path_kind(x) == "pcap" for x in paths):
            return "pcap", "--broker (captures)"
        return "broker-log", "--broker"
    kinds = {}
    for p in _paths_of(argv):
        kinds.setdefault(path_kind(p), []).append(p)
    known = {k: v for k, v in kinds.items() if k is not None}
    if len(known) > 1:
        return None, "; ".join(f"{k}: {', '.join(v[:3])}" for k, v in sorted(known.items()))
    if len(known) == 1 and None not in kinds:
        return next(iter(known)), "detected"
    return "recording", "default"


def wants_broker_logs(argv) -> bool:
    """Whether an ``rmqhb scan`` command line is for broker logs (``--format broker-log`` or ``--input
    broker-log``, ``--log-tz``, ``--broker`` or log-file inputs)."""
    return input_format(argv)[0] == "broker-log"


def local_log_scan(paths, params, *, brokers=None, native=None, **kw) -> dict:
    """scan_local with scan's ``scan`` section (what `rmqhb scan` runs in this process)."""
    import time

    t0 = time.perf_counter()
    findings = scan_local(paths, params=params, brokers=brokers, native=native, **kw)
    findings.setdefault("scan", {}).update({
        "method": "broker-log", "files": len(plan_files(paths, brokers)),
        "seconds": round(time.perf_counter() - t0, 3),
        "parser": "native" if parser(native) is _parse_native else "twin"})
    return findings


def scan_main(argv=None) -> int:
    """`rmqhb scan PATH... --out REPORT_DIR [--format broker-log] [--log-tz ZONE] [--broker NAME=PATH]`: the
    analyses over RocketMQ broker logs on Spark, written as the recording scan's report. Exit 0; 3 when some input
    could not be read (overlong lines, a file truncated while read or unreadable, impossible times: named in
    findings.json ``scan.corrupt``, the report's banner and one stderr line; --allow-damage: 0); 2 bad arguments."""
    import argparse
    import sys

    from .scan_engine import add_arguments as add_engine_arguments

    d = ScanParams()
    p = argparse.ArgumentParser(prog="rmqhb scan", description=scan_main.__doc__)
    p.add_argument("paths", nargs="*", type=Path, help="broker.log files or directories (one per broker)")
    p.add_argument("--out", type=Path, required=True, help="report directory (created)")
    p.add_argument("--format", "--input", dest="format", default="broker-log", choices=["broker-log"],
                   help="input kind (detected when not given; --input is an alias)")
    p.add_argument("--log-tz", default=None,
                   help="zone of the logs' wall-clock times: IANA name or +HH:MM (default: this machine's zone; "
                        "5.x brokers' stock logback config writes GMT+8)")
    p.add_argument("--broker", action="append", default=[], metavar="NAME=PATH",
                   help="name the broker whose logs are under PATH (default: the directory name)")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    p.add_argument("--min-duration", type=float, default=d.min_duration_s)
    p.add_argument("--expiry", type=float, default=d.expiry_s, help="the brokers' channel expiry (s)")
    p.add_argument("--flap-window", type=float, default=d.flap_window_s)
    p.add_argument("--flap-min", type=int, default=d.flap_min_reconnects)
    p.add_argument("--twin", action="store_true", help="use the pure-Python line parser")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES,
                   help="longest log line read (bytes); a longer one is skipped and named as damage "
                        f"(default {MAX_LINE_BYTES})")
    p.add_argument("--allow-damage", action="store_true",
                   help="exit 0 when some input could not be read (default 3)")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    if args.max_line_bytes < 1:
        print("rmqhb scan: --max-line-bytes must be positive", file=sys.stderr)
        return 2
    brokers = {}
    for spec in args.broker:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            print(f"rmqhb scan: --broker wants NAME=PATH, not {spec!r}", file=sys.stderr)
            return 2
        brokers[name] = path
    if not args.paths and not brokers:
        print("rmqhb scan: no log files given", file=sys.stderr)
        return 2
    try:
        params = ScanParams(args.expiry, args.expiry, args.min_duration, args.flap_window, args.flap_min).validate()
        resolve_tz(args.log_tz)
        plan_files(args.paths, brokers)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    from .report import damage_line, print_summary, write_report
    from .scan_engine import EngineError, log_engine, run_scan

    try:  # in this process or on Spark: engine.bindings.scan_engine
        engine, what = log_engine(args, plan_files(args.paths, brokers))
    except EngineError as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    kw = dict(log_tz=args.log_tz, brokers=brokers, native=False if args.twin else None,
              max_line_bytes=args.max_line_bytes)
    findings = run_scan(args, engine=engine, what=what, app="rmqhb-scan-logs",
                        spark_scan=lambda spark: scan(spark, args.paths, params, **kw),
                        local_scan=lambda: local_log_scan(args.paths, params, **kw),
                        count=lambda f: (f["log"]["lines"], "lines"))
    log = findings["log"]
    if log["lines"] - log["unparseable"] - log["counts"].get("continuation", 0) <= 0:  # no line with a log header
        write_report(findings, args.out, plots=False)
        damage = findings["scan"].get("corrupt") or []
        print(f"rmqhb scan: nothing decodable: {log['lines']:,} lines in {len(log['files'])} files, none of them a "
              "broker log line" + (f"; {len(damage)} damaged, e.g. {damage[0]['segment']}: {damage[0]['reason']}"
                                   if damage else ""), file=sys.stderr)
        return 4
    index = write_report(findings, args.out, plots=not args.no_plots)
    print_summary(findings, sys.stdout)
    print(f"broker logs: {log['lines']:,} lines in {len(log['files'])} files of {len(log['brokers'])} broker(s), "
          f"zone {log['log_tz']} ({log['log_tz_source']}); {log['unparseable']:,} unparseable lines "
          f"{log['unparseable_by_kind'] or ''}", file=sys.stdout)
    zc = log.get("zone_check")
    if zc and not zc["agrees"]:
        print(f"warning: the lines' own timestamps imply UTC{zc['inferred_utc_offset_min'] / 60:+g}, not the "
              f"--log-tz in use (UTC{zc['log_tz_offset_min'] / 60:+g})", file=sys.stdout)
    print(f"report: {index}")
    damage = damage_line(findings)
    if damage:
        print(f"rmqhb scan: {damage}", file=sys.stderr)
        return 0 if args.allow_damage else 3
    return 0

"""Which engine runs `rmqhb scan`, and the scan's progress line.

Starting Spark costs 10-30 s and ~20 CPU-s whatever the input; every analysis also exists in-process (the local
scans the parity tests hold equal to the Spark scans: ``engine.recording.scan_py.scan`` for a recording,
``brokerlog.scan_local``, ``pcap.scan_local``). ``--engine auto`` (the default) therefore scans a small input of
one broker in this process and everything else on Spark:

* ``--master`` given, or several brokers' inputs (several recording directories, ``--broker`` naming several):
  Spark, the engine for bulk work and clusters;
* more than ``LOCAL_MAX_RECORDS`` heartbeat records (a recording, counted from its block headers) or more than
  ``LOCAL_MAX_BYTES`` of input (broker logs, captures; a ``.gz`` counts its trailer's uncompressed size, or its
  compressed size when that is larger): Spark;
* else in-process. The local scans hold their input's events in memory: these thresholds are also the budget
  of that memory; ``--engine local`` lifts it (the caller's choice) and ``--engine spark`` forces Spark.

findings.json's ``scan.engine`` and ``scan.engine_reason`` and the summary's last lines say which engine ran and
why, and how long each part took. ``ENGINE_FIELDS`` are the ``scan`` keys that describe how the scan ran (not
what it found): without them the findings of both engines are equal (tests/test_scan_engine.py).
"""
from __future__ import annotations

import os
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Tuple

#: `--engine auto`: a recording of at most this many records is scanned in this process (the local scan decodes
#: and analyses ~15,000 records/s on one core: a few seconds, against Spark's 10-30 s start)
LOCAL_MAX_RECORDS = 100_000
#: `--engine auto`: broker logs or captures of at most this many (uncompressed) bytes are scanned in this process
#: (~15 MB/s of broker log: about four seconds at most)
LOCAL_MAX_BYTES = 64 << 20
ENGINES = ("auto", "local", "spark")
#: findings.json ``scan`` keys that say how the scan ran (engine, its tasks, its timings), not what it found
ENGINE_FIELDS = ("engine", "engine_reason", "seconds", "timings", "method", "splits", "tasks", "dedupe")

#: seconds between progress lines: on a terminal (the line is redrawn) and otherwise (a plain line)
PROGRESS_TTY_S, PROGRESS_PLAIN_S = 0.5, 10.0


class EngineError(ValueError):
    """An --engine choice that cannot run (one line, exit 2)."""


def add_arguments(p) -> None:
    """--engine and --no-progress on a scan parser (every input kind's)."""
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="where the analyses run: local (this process), spark, or auto (default): in this process "
                        f"for one broker's input of at most {LOCAL_MAX_BYTES >> 20} MiB (logs, captures) or "
                        f"{LOCAL_MAX_RECORDS:,} records (a recording), without --master; else Spark")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def input_bytes(path) -> int:
    """Bytes a file holds once decompressed, as far as is cheap to know: a ``.gz``'s trailer (ISIZE, its last
    member's size modulo 4 GiB) or its own size, whichever is larger, and never more than the readers' budget of
    decompressed bytes for it (gzinput.gzip_budget: a cut or forged trailer says anything up to 4 GiB); other
    files their size."""
    from .gzinput import gzip_budget

    p = Path(path)
    size = compressed = p.stat().st_size
    if p.name.endswith(".gz") and size >= 18:
        try:
            with open(p, "rb") as f:
                f.seek(-4, os.SEEK_END)
                size = min(max(size, struct.unpack("<I", f.read(4))[0]), gzip_budget(compressed))
        except OSError:
            pass
    return size


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n / 1024:,.1f} KiB"


def choose_engine(requested: str, *, master: Optional[str], brokers: int, size: int, limit: int,
                  unit: str = "bytes", local_ok: bool = True) -> Tuple[str, str]:
    """(engine, reason) for a scan: ``size`` of the input in ``unit`` (bytes, or records for a recording) against
    ``limit``; ``brokers`` the number of brokers scanned; ``local_ok`` False when the local scan cannot take this
    input (several recording directories). EngineError: --engine local with --master, or where it cannot run."""
    shown = _mib(size) if unit == "bytes" else f"{size:,} records"
    limit_shown = _mib(limit) if unit == "bytes" else f"{limit:,} records"
    if requested == "spark":
        return "spark", "--engine spark"
    if requested == "local":
        if master:
            raise EngineError("--engine local and --master exclude each other: --master runs the scan on Spark")
        if not local_ok:
            raise EngineError(f"--engine local scans one broker's recording; {brokers} recording directories "
                              "need Spark (--engine spark or auto)")
        return "local", "--engine local"
    if master:
        return "spark", "--master given"
    if brokers > 1 or not local_ok:
        return "spark", f"{brokers} brokers' inputs"
    if size > limit:
        return "spark", f"{shown} of input, more than the in-process limit of {limit_shown}"
    return "local", f"{shown} of input, at most {limit_shown}: in this process, without starting Spark"


class InputReading:
    """How far this process has read a scan's input files: the read position of each one it has open (Linux's
    /proc/self/fdinfo, so no reader needs a hook) plus the whole size of each it opened and closed again. Sizes are
    the files' own (a .gz's compressed bytes, as its reader's position counts them)."""

    def __init__(self, files: Iterable, records: Optional[int] = None):
        self.sizes: dict = {}
        for f in files:
            try:
                self.sizes[os.path.realpath(f)] = os.stat(f).st_size
            except OSError:
                pass
        self.total = sum(self.sizes.values())
        self.records = records  # known up front (a recording's block headers), else None
        self._seen: set = set()
        self._read = 0

    def read(self) -> Optional[int]:
        """Bytes of the input read so far (never less than an earlier answer), or None where /proc is missing."""
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            return None
        now: dict = {}
        for fd in fds:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target in self.sizes:
                    with open(f"/proc/self/fdinfo/{fd}") as info:
                        pos = int(info.readline().split()[1])  # "pos:\t<offset>"
                    now[target] = max(now.get(target, 0), min(pos, self.sizes[target]))
            except (OSError, ValueError, IndexError):  # closed under us, or not a file descriptor of ours
                continue
        self._seen |= now.keys()
        n = sum(self.sizes[p] for p in self._seen - now.keys()) + sum(now.values())
        self._read = max(self._read, min(n, self.total))
        return self._read


class Progress:
    """The scan's progress on stderr: on a terminal one line redrawn every PROGRESS_TTY_S (the stage, the input,
    the elapsed time; in this process the input read of its total, the rate (records/s where the records are
    known up front, a recording's; MiB/s otherwise) and an ETA from them; on Spark the tasks done and an ETA from
    them), otherwise a plain line every PROGRESS_PLAIN_S (so a scan shorter than that prints none). Only our own
    words and numbers: no file or client text."""

    def __init__(self, what: str, enabled: bool = True, stream=None, reading: Optional[InputReading] = None):
        stream = stream if stream is not None else sys.stderr
        self.stream = getattr(stream, "_stream", stream)  # under engine.logutil.EscapedWriter: CR must pass
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.what, self.enabled = what, enabled
        self.t0 = time.perf_counter()
        self.stage, self.stage_t0 = "", self.t0
        self.parts: list = []  # (stage, seconds)
        self.spark = None
        self.reading = reading  # the input files, for the line of a scan in this process
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the ticker thread and enter() both draw
        self._thread: Optional[threading.Thread] = None
        self._width = 0

    def start(self) -> "Progress":
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="rmqhb-scan-progress", daemon=True)
            self._thread.start()
        return self

    def enter(self, stage: str) -> None:
        """Begin a part of the scan (the previous one ends)."""
        now = time.perf_counter()
        if self.stage:
            self.parts.append((self.stage, now - self.stage_t0))
        self.stage, self.stage_t0 = stage, now
        if self.tty and stage:  # (close's "" ends the last stage: the line is cleared, not redrawn)
            self._draw()

    def _spark_tasks(self) -> Optional[Tuple[int, int]]:
        """(tasks done, tasks) of Spark's active stages, or None."""
        sc = self.spark
        if sc is None:
            return None
        try:
            tracker = sc.statusTracker()
            done = total = 0
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done, total = done + info.numCompletedTasks, total + info.numTasks
            return (done, total) if total else None
        except Exception:  # the context stopping under us: no task count this time
            return None

    def _input_read(self, now: float) -> str:
        """'; read 12.0 of 64.0 MiB (19%), 2,100 records/s, ETA 13 s' for a scan in this process, or ''."""
        r = self.reading
        n = r.read() if r is not None and r.total else None
        if n is None:
            return ""
        elapsed = now - self.stage_t0
        text = f"; read {_mib(n)} of {_mib(r.total)} ({n * 100 // r.total}%)"
        if n >= r.total:
            return text + ", analysing"
        if n and elapsed > 0:
            rate = n / elapsed
            text += (f", {r.records * n / r.total / elapsed:,.0f} records/s" if r.records
                     else f", {rate / (1 << 20):,.1f} MiB/s")
            text += f", ETA {(r.total - n) / rate:,.0f} s"
        return text

    def line(self) -> str:
        now = time.perf_counter()
        text = f"rmqhb scan: {self.stage or 'starting'} ({self.what}), {now - self.t0:,.0f} s"
        text += self._input_read(now)
        tasks = self._spark_tasks()
        if tasks:
            done, total = tasks
            text += f"; Spark tasks {done}/{total}"
            elapsed = now - self.stage_t0
            if done:
                text += f", ETA {elapsed * (total - done) / done:,.0f} s (this stage)"
        return text

    def _draw(self) -> None:
        if not self.enabled:
            return
        text = self.line()
        with self._lock:
            try:
                if self.tty:
                    self.stream.write("\r" + text.ljust(self._width))
                    self._width = len(text)
                else:
                    self.stream.write(text + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                self.enabled = False

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_TTY_S if self.tty else PROGRESS_PLAIN_S):
            self._draw()

    def close(self) -> list:
        """Stop the line (a terminal's is cleared) and return the parts: [(stage, seconds)]."""
        self.enter("")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self.enabled and self.tty and self._width:
            with self._lock:
                try:
                    self.stream.write("\r" + " " * self._width + "\r")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
        return self.parts


#: the running scan's record for the closing line (``reported``): set by run_scan
_last: dict = {}
#: the input files (and records, when known) of the last engine choice (log_engine, capture_engine,
#: recording_engine), for run_scan's progress line when its caller names none
_given: dict = {}


def run_scan(args, *, engine: Tuple[str, str], what: str, spark_scan: Callable, local_scan: Callable,
             app: str, count: Optional[Callable] = None, inputs: Optional[Iterable] = None,
             records: Optional[int] = None) -> dict:
    """The findings of ``local_scan()`` or ``spark_scan(spark)`` as ``engine`` = (engine, reason) says, with a
    progress line while it runs; findings.json's ``scan`` gets ``engine`` and ``engine_reason``. ``count``:
    findings -> (number, unit) of what was read (default: the summary's records). ``inputs``: the input files
    (``records``: their records, when known up front), for the progress line (default: the engine choice's). A
    SparkSession already running (a notebook's, a test's) is used and left running."""
    name, reason = engine
    if inputs is None:
        inputs, records = _given.get("files", ()), _given.get("records")
    _given.clear()
    progress = Progress(what, enabled=not getattr(args, "no_progress", False),  # (Spark's executors read on Spark)
                        reading=InputReading(inputs, records) if name == "local" else None).start()
    try:
        if name == "local":
            progress.enter("scanning in this process")
            findings = local_scan()
        else:
            from pyspark.sql import SparkSession

            from .session import spark_session

            running = SparkSession.getActiveSession()
            if running is None:
                progress.enter("starting Spark")
            spark = running or spark_session(args.master, app, driver_memory=args.driver_memory)
            try:
                progress.spark = spark.sparkContext
                progress.enter("scanning on Spark")
                findings = spark_scan(spark)
            finally:
                progress.spark = None
                if running is None:
                    progress.enter("stopping Spark")
                    spark.stop()
    finally:
        parts = progress.close()
    findings.setdefault("scan", {}).update({"engine": name, "engine_reason": reason})
    n = count(findings) if count else ((findings.get("summary") or {}).get("records"), "records")
    _last.update(engine=name, reason=reason, what=what, parts=parts, t0=progress.t0, count=n)
    return findings


def reported(scan_main: Callable, argv) -> int:
    """``scan_main(argv)``, then (when a scan ran) one line on stdout: the engine and why, what was read and how
    long each part took (the report's writing included)."""
    _last.clear()
    status = scan_main(argv)
    if _last:
        total = time.perf_counter() - _last["t0"]
        parts = [(stage, s) for stage, s in _last["parts"] if stage]
        report = total - sum(s for _, s in parts)
        timing = ", ".join(f"{stage} {s:,.2f} s" for stage, s in parts + [("report", report)])
        n, unit = _last["count"]
        read = f"{_last['what']}, {n:,} {unit}" if n is not None else _last["what"]
        rate = f", {n / total:,.0f} {unit}/s" if n and total > 0 else ""
        print(f"engine: {_last['engine']} ({_last['reason']}); read {read} in {total:,.2f} s{rate}: {timing}",
              flush=True)
    return status


def total_bytes(files: Iterable) -> int:
    return sum(input_bytes(f) for f in files)


# ---------------------------------------------------------------------------------------------------------------
# each input kind: its engine, and its local scan with the Spark scan's ``scan`` section


def _files(n: int, kind: str, size: int, paths=()) -> str:
    """What was given: ``size`` (input_bytes) is only an estimate for .gz files, so their own bytes are shown."""
    gz = [p for p in paths if str(p).endswith(".gz")]
    if gz:
        packed = sum(os.stat(p).st_size for p in gz)
        return f"{n} {kind} file{'s' if n != 1 else ''}, {_mib(packed)} gzip" + (
            f" + {_mib(size - total_bytes(gz))}" if len(gz) < n else "")
    return f"{n} {kind} file{'s' if n != 1 else ''}, {_mib(size)}"


def log_engine(args, plan) -> Tuple[Tuple[str, str], str]:
    """((engine, reason), what was given) for broker logs: ``plan`` is brokerlog.plan_files' [(broker, path, rank)]."""
    size = total_bytes(path for _, path, _ in plan)
    engine = choose_engine(args.engine, master=args.master, brokers=len({b for b, _, _ in plan}), size=size,
                           limit=LOCAL_MAX_BYTES)
    _given.update(files=[path for _, path, _ in plan], records=None)
    return engine, _files(len(plan), "broker log", size, [path for _, path, _ in plan])


def capture_engine(args, captures: dict) -> Tuple[Tuple[str, str], str]:
    """((engine, reason), what was given) for captures: ``captures`` {broker: pcap.plan_captures(...)}."""
    files = sorted({f for plan in captures.values() for c in plan for f in c.files})
    size = total_bytes(files)
    engine = choose_engine(args.engine, master=args.master, brokers=len(captures), size=size, limit=LOCAL_MAX_BYTES)
    _given.update(files=files, records=None)
    return engine, _files(len(files), "capture", size, files)


def no_clipped_count(findings: dict) -> None:
    """The reference analyses count the records the recorder clipped (``summary.clipped_bodies``); the Spark scan's
    summary has no such count: a count of none is left out, as there (a count of some stays, and differs)."""
    if not findings["summary"].get("clipped_bodies"):
        findings["summary"].pop("clipped_bodies", None)


def recording_engine(args, plans: dict) -> Tuple[Tuple[str, str], str]:
    """((engine, reason), what was given) for recordings: ``plans`` {broker: segments.plan_splits(...)}. A
    --method other than the default names a Spark reader: Spark."""
    records = sum(p.n_records for p in plans.values())
    segments = sum(p.segments for p in plans.values())
    what = f"{len(plans)} recording{'s' if len(plans) != 1 else ''} ({segments} segments, {records:,} records)"
    _given.update(files=sorted({s.path for p in plans.values() for s in p.splits}), records=records)
    if args.engine == "auto" and getattr(args, "method", "arrow") != "arrow":
        return ("spark", f"--method {args.method}"), what
    return choose_engine(args.engine, master=args.master, brokers=len(plans), size=records,
                         limit=LOCAL_MAX_RECORDS, unit="records", local_ok=len(plans) == 1), what


def local_recording_scan(plan, params) -> dict:
    """engine.recording.scan_py.scan over one recording, with the Spark scan's ``scan`` section."""
    from engine.recording import scan_py

    t0 = time.perf_counter()
    findings = scan_py.scan(plan.directory, params)
    no_clipped_count(findings)
    findings["scan"] = {"method": "local", "splits": len(plan.splits), "segments": plan.segments, "dedupe": False,
                        "seconds": round(time.perf_counter() - t0, 3), **findings.get("scan", {})}
    return findings


def without_engine_fields(findings: dict) -> dict:
    """findings without ENGINE_FIELDS (in ``scan`` and each broker's ``scan.brokers`` entry): what both engines
    must agree on."""
    out = dict(findings)
    scan = {k: v for k, v in (out.get("scan") or {}).items() if k not in ENGINE_FIELDS}
    if isinstance(scan.get("brokers"), dict):
        scan["brokers"] = {b: {k: v for k, v in s.items() if k not in ENGINE_FIELDS}
                           for b, s in scan["brokers"].items()}
    out["scan"] = scan
    return out

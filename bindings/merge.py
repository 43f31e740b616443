"""Mixed inputs of `rmqhb scan`: each file's kind from its content, and a broker's log and its capture as one timeline.

Kinds (``file_kind``): a packet capture by its pcap / pcapng magic (a ``.gz`` decompressed just far enough to see
it), a recording by its ``*.seg`` segments, a broker log by the shape of its first lines (``yyyy-MM-dd HH:mm:ss
LEVEL thread - message``, as 4.x/5.x logback writes them) or its name (broker*.log*, *.log). ``split_inputs``
sorts the paths given (files, directories of any mix) into kinds.

A broker log and a capture of the same broker see one history from two sides. ``merge_log_and_heartbeats``
makes one findings dict of their two scans, every event once:

* from the capture (heartbeats, millisecond times): heartbeat gaps (a log has no line per heartbeat), the
  subscriptions every member sent (inconsistent subscriptions), flapping clients, the connection's times;
* from the log (the broker's own decisions): why a client was dropped (SCAN, the idle handler), the clients that
  vanished without unregistering, the broker's boots and stops, retry-topic churn, group sizes (the broker's
  membership table; a group only the capture saw keeps the capture's series);
* one expiry seen in both (same client address, the log's drop at most ``EXPIRY_MATCH_MS`` after the capture's
  inferred one) is one row: the capture's row with the log's time and cause; a capture's inferred expiry of a
  connection the log saw end otherwise (vanished) is dropped, the log having seen what the capture inferred;
* one client seen in both is one client (summary.clients counts the union of client ids).

findings["merged"] says which input gave what (``SOURCES``). A recording and a capture of one broker hold the same
heartbeats (the recorder wrote what the capture saw), and several brokers' logs cannot be paired with captures
without names: such combinations are refused with one line (``MergeRefused``), never scanned half.
"""
from __future__ import annotations

import hashlib
import re
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple

#: bytes read from a file's start to tell its kind (a .gz decompressed this far)
SNIFF_BYTES = 4096
#: a log's drop (SCAN line, idle close) is the capture's inferred expiry when it comes at most this long after it:
#: the broker's housekeeping scans every 10 s, and a log line's time has whole seconds
EXPIRY_MATCH_MS = 11_000
#: a broker log line as 4.x/5.x logback writes it (``%d{yyy-MM-dd HH:mm:ss,SSS} %p %t - %m``; the ,SSS optional)
LOG_LINE = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d{3})? +(?:INFO|WARN|ERROR|DEBUG|TRACE) ")
_PCAP_MAGIC = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x0a\x0d\x0d\x0a")
_GZIP_MAGIC = b"\x1f\x8b"
_CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz")
#: which input gives each finding of a merged scan (findings["merged"]["sources"])
SOURCES = {
    "heartbeat_gaps": "capture", "inconsistent_subscriptions": "capture (the log's where the capture saw none)",
    "flapping_clients": "capture and log, one row per client", "member_addresses": "capture and log",
    "expired_clients": "both: one row per expiry, the time and cause from the log when it saw it",
    "vanished_clients": "log and capture, one row per connection", "broker_boots": "log (the capture's where the "
    "log saw none)", "retry_topic_churn": "log", "group_sizes": "log (the capture's for groups the log lacks)",
}


class MergeRefused(ValueError):
    """Inputs whose kinds cannot be scanned together truthfully: one line naming them and what to do (exit 2)."""


def _head(path: Path) -> bytes:
    """The file's first SNIFF_BYTES, a gzip's decompressed (as far as its first 64 KiB go: a cut .gz still shows
    its kind)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except OSError:
        return b""  # unreadable: the kind then comes from the name, the reader names the damage
    if head[:2] == _GZIP_MAGIC:
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return b""
    return head[:SNIFF_BYTES]


def file_kind(path) -> Optional[str]:
    """``pcap``, ``broker-log``, ``recording`` (a segment file) or None, from the file's content first (a capture
    named .log is a capture, a log named .txt is a log), then its name."""
    p = Path(path)
    if p.name.endswith(".seg"):
        return "recording"
    head = _head(p)
    if head[:4] in _PCAP_MAGIC:
        return "pcap"
    first = next((ln for ln in head.splitlines() if ln.strip()), b"")
    if LOG_LINE.match(first):
        return "broker-log"
    from .brokerlog import is_log_file

    if is_log_file(p) and b"\0" not in head:
        return "broker-log"
    if not head and p.name.endswith(_CAPTURE_SUFFIXES):
        return "pcap"  # unreadable or cut before its header: the capture reader names the damage
    return None


def split_inputs(paths) -> Dict[str, List[Path]]:
    """{kind: [paths]} of the scan's inputs: a file by its kind (``file_kind``); a directory as a whole when it
    holds one kind (a recording: its *.seg at the top level; rotated captures), else by its files: a recording
    directory, its broker logs (broker*.log*) and its captures. Files of no known kind are left out (listed under
    None)."""
    from .brokerlog import is_broker_log_name

    out: Dict[str, List[Path]] = {}
    seen = set()
    for raw in paths:
        p = Path(raw)
        if p.resolve() in seen:
            continue
        seen.add(p.resolve())
        if not p.is_dir():
            out.setdefault(file_kind(p), []).append(p)
            continue
        kinds: Dict[Optional[str], List[Path]] = {}
        if any(p.glob("*.seg")):
            kinds["recording"] = [p]
        for f in sorted(p.rglob("*")):
            if not f.is_file() or f.suffix == ".seg" or f.name.endswith(".json"):
                continue
            k = file_kind(f)
            if k == "broker-log" and not is_broker_log_name(f.name):
                continue  # a directory's other logs (gc.log, store.log) are not the broker's
            if (k == "pcap" or k == "broker-log") and f.resolve() not in seen:
                seen.add(f.resolve())
                kinds.setdefault(k, []).append(f)
        if set(kinds) == {"broker-log"}:
            out.setdefault("broker-log", []).append(p)  # one broker's directory: named after it
        elif set(kinds) == {"pcap"}:
            out.setdefault("pcap", []).append(p)  # rotated files of one capture
        else:
            for k, fs in kinds.items():
                out.setdefault(k, []).extend(fs)
    return out


_KIND_WORDS = {"recording": "a recording", "broker-log": "a broker log", "pcap": "a packet capture"}


def mix_problem(kinds: Dict[str, List[Path]], subject: str = "the inputs mix") -> Optional[str]:
    """Why these kinds cannot be scanned together (one line naming the files and what to do), or None: broker
    logs with captures, or with one recording of the broker, are merged; a recording with a capture holds the same
    heartbeats twice; several recordings are several brokers'."""
    if "recording" not in kinds or len(kinds) < 2:
        return None

    def names(k):
        fs = kinds[k]
        return ", ".join(str(f) for f in fs[:2]) + (f" and {len(fs) - 2} more" if len(fs) > 2 else "")

    found = "; ".join(f"{_KIND_WORDS[k]} ({names(k)})" for k in ("recording", "broker-log", "pcap") if k in kinds)
    if "pcap" in kinds:
        rest = ("the log and the capture together: rmqhb scan " + " ".join(
            str(f) for k in ("broker-log", "pcap") for f in kinds.get(k, [])[:2])) if "broker-log" in kinds else \
            "the capture alone"
        return (f"{subject} input kinds ({found}): a recording and a capture of a broker hold the same heartbeats "
                f"and are not scanned together; scan the recording alone, or {rest}")
    if len(kinds["recording"]) > 1:
        return (f"{subject} input kinds ({found}): broker logs are merged with one broker's recording; scan each "
                "broker's recording and logs together, one broker at a time")
    return None


# ---------------------------------------------------------------------------------------------------------------
# one timeline from a log's findings and a capture's


def _overlaps(a0, a1, b0, b1) -> bool:
    return None not in (a0, a1, b0, b1) and a0 <= b1 and b0 <= a1


def same_broker_problem(log: dict, cap: dict) -> Optional[str]:
    """A log and a capture are taken for one broker's unless their times overlap and they share no group (two
    brokers, then: merging them would be untrue)."""
    ls, cs = log["summary"], cap["summary"]
    if not _overlaps(ls.get("first_ms"), ls.get("last_ms"), cs.get("first_ms"), cs.get("last_ms")):
        return None
    lg = {r["group"] for r in log["group_sizes"]}
    cg = {r["group"] for r in cap["group_sizes"]}
    if lg and cg and not lg & cg:
        other = "capture" if "capture" in cap else "recording"
        return (f"the broker log and the {other} cover the same time but share no group: they look like two "
                "brokers' inputs; scan them separately")
    return None


def _expiries(log_rows: list, cap_rows: list, vanished: Dict[str, int], broker: str) -> Tuple[list, int]:
    """(rows, matched): the log's expiries, each matched to the capture's inferred expiry of the same connection
    (address) when that exists (one row: the capture's, with the log's time and cause), plus the capture's
    expiries the log did not see end before them (``vanished``: {addr: the log's end of that connection})."""
    by_addr: Dict[str, list] = {}
    for r in cap_rows:
        by_addr.setdefault(r["addr"], []).append(r)
    used, out = set(), []
    for lr in log_rows:
        match = None
        for cr in by_addr.get(lr["addr"], []):
            if id(cr) not in used and \
                    cr["connected_ms"] - 1000 <= lr["expired_ms"] <= cr["expired_ms"] + EXPIRY_MATCH_MS:
                match = cr
                break
        if match is None:
            out.append({**lr, "source": "log"})
            continue
        used.add(id(match))
        # the capture's connection times (ms), the broker's drop: its time, cause and the groups it removed
        row = {**match, "broker": broker, "expired_ms": lr["expired_ms"], "cause": lr.get("cause") or "scan",
               "groups": lr.get("groups", match["groups"]), "roles": lr.get("roles"),
               "returned_ms": match.get("returned_ms") if match.get("returned_ms") is not None
               else lr.get("returned_ms"), "source": "capture+log"}
        out.append(row)
    for cr in cap_rows:
        if id(cr) in used or _ended_before(vanished.get(cr["addr"]), cr["expired_ms"]):
            continue  # matched, or the log saw this connection end (a kill) before the capture's expiry
        out.append({**cr, "broker": broker, "cause": cr.get("cause") or "inferred", "source": "capture"})
    out.sort(key=lambda r: (r["expired_ms"], r["addr"]))
    return out, len(used)


def _ended_before(ended_ms: Optional[int], expired_ms: int) -> bool:
    """Whether a connection the log saw end at ``ended_ms`` (a whole second: the end is within the next 1,000 ms)
    ended before ``expired_ms``."""
    return ended_ms is not None and ended_ms + 1000 <= expired_ms


def _by_key(log_rows: list, cap_rows: list, key, broker: str, prefer: str) -> list:
    """One row per key: ``prefer``'s row where both have one, every other row of both."""
    first, second = (cap_rows, log_rows) if prefer == "capture" else (log_rows, cap_rows)
    seen, out = set(), []
    for rows, src in ((first, prefer), (second, "log" if prefer == "capture" else "capture")):
        for r in rows:
            k = key(r)
            if k in seen:
                continue
            seen.add(k)
            out.append({**r, "broker": broker, "source": src})
    return out


def merge_log_and_heartbeats(log: dict, cap: dict, broker: str) -> dict:
    """One findings dict (the log scan's format plus the capture's sections) of broker ``broker``'s log scan
    (brokerlog.scan / scan_local with ``client_ids=True``) and its heartbeats' scan: a capture's (pcap.scan /
    scan_local with ``client_ids=True``) or a recording's (spark.scan with ``client_ids=True``, scan_py.scan plus
    ``_client_ids``; a recording sees no close: its expiries are inferred as a capture's). See the module's
    docstring for which input gives what."""
    source = "pcap" if "capture" in cap else "recording"
    out = {k: v for k, v in log.items() if not k.startswith("_")}
    vanished = _vanished(log.get("vanished_clients", []), cap.get("vanished_clients", []), broker)
    out["expired_clients"], matched = _expiries(log.get("expired_clients", []), cap.get("expired_clients", []),
                                                {r["addr"]: r["ended_ms"] for r in vanished}, broker)
    # a connection the log saw end without an unregister after the capture's expiry of it: the broker closing the
    # expired channel (its SCAN line missing: dropped INFO lines), not a vanished client
    expired_at = {r["addr"]: r["expired_ms"] for r in out["expired_clients"]}
    out["vanished_clients"] = [r for r in vanished if r["addr"] not in expired_at
                               or _ended_before(r["ended_ms"], expired_at[r["addr"]])]
    out["heartbeat_gaps"] = [{**r, "broker": broker, "source": "capture"} for r in cap.get("heartbeat_gaps", [])]
    for k in ("gaps_over_data_loss", "expired_over_data_loss"):
        if k in cap:
            out[k] = [{**r, "broker": broker} for r in cap[k]]
    # subscriptions: the capture has every member's heartbeat; the log's spans only where the capture saw none
    cap_spans = {}
    for r in cap.get("inconsistent_subscriptions", []):
        cap_spans.setdefault(r["group"], []).append((r["start_ms"], r["end_ms"]))
    out["inconsistent_subscriptions"] = [{**r, "broker": broker, "source_input": "capture"}
                                         for r in cap.get("inconsistent_subscriptions", [])] + [
        {**r, "source_input": "log"} for r in log.get("inconsistent_subscriptions", [])
        if not any(_overlaps(r["start_ms"], r["end_ms"], a, b) for a, b in cap_spans.get(r["group"], []))]
    out["inconsistent_subscriptions"].sort(key=lambda r: (r["group"], r["start_ms"]))
    out["flapping_clients"] = sorted(_by_key(log.get("flapping_clients", []), cap.get("flapping_clients", []),
                                             lambda r: r["client_id"], broker, "capture"),
                                     key=lambda r: r["client_id"])
    out["member_addresses"] = sorted(_by_key(log.get("member_addresses", []), cap.get("member_addresses", []),
                                             lambda r: (r["group"], r["client_id"]), broker, "capture"),
                                     key=lambda r: (r["group"], r["client_id"]))
    # group sizes: the broker's own table (the log) per group; a group the log never named keeps the capture's
    logged = {(r["group"], r["role"]) for r in log["group_sizes"]}
    out["group_sizes"] = [{**r, "source": "log"} for r in log["group_sizes"]] + [
        {**r, "broker": broker, "source": "capture"} for r in cap["group_sizes"]
        if (r["group"], r["role"]) not in logged]
    out["group_sizes"].sort(key=lambda r: (r["group"], r["role"]))
    boots = list(log.get("broker_boots", []))
    out["broker_boots"] = boots or [{**r, "broker": broker} for r in cap.get("broker_boots", [])]
    unsupported = dict(log.get("unsupported") or {})
    unsupported.pop("heartbeat_gaps", None)  # the capture has every heartbeat
    out["unsupported"] = unsupported
    if "capture" in cap:
        out["capture"] = cap["capture"]
    ls, cs = log["summary"], cap["summary"]
    ids_l, ids_c = set(log.get("_client_ids") or ()), set(cap.get("_client_ids") or ())
    firsts = [x for x in (ls.get("first_ms"), cs.get("first_ms")) if x is not None]
    lasts = [x for x in (ls.get("last_ms"), cs.get("last_ms")) if x is not None]
    keys = [k for k in ls if isinstance(ls[k], int) and k in out and isinstance(out[k], list)]
    out["summary"] = {**ls, "records": ls["records"] + cs["records"], "bad_bodies": ls["bad_bodies"] + cs["bad_bodies"],
                      "clients": len(ids_l | ids_c), "first_ms": min(firsts) if firsts else None,
                      "last_ms": max(lasts) if lasts else None, **{k: len(out[k]) for k in keys},
                      "heartbeat_gaps": len(out["heartbeat_gaps"]), "records_lost": cs.get("records_lost", 0)}
    for k in ("gaps_over_data_loss", "expired_over_data_loss"):
        if k in out:
            out["summary"][k] = len(out[k])
    lsc, csc = log.get("scan") or {}, cap.get("scan") or {}
    out["scan"] = {"method": f"broker-log+{source}",
                   "torn_tails": list(lsc.get("torn_tails") or []) + list(csc.get("torn_tails") or []),
                   "corrupt": list(lsc.get("corrupt") or []) + list(csc.get("corrupt") or []),
                   "data_loss": list(csc.get("data_loss") or []), "not_captured": list(csc.get("not_captured") or []),
                   "log": lsc, "capture" if source == "pcap" else "recording": csc}
    out["merged"] = {
        "broker": broker, "heartbeats_from": source,
        "inputs": {"broker-log": log["log"]["files"],
                   source: [f for c in cap["capture"]["captures"] for f in c["files"]] if source == "pcap"
                   else [str(cap.get("_directory", ""))]},
        "sources": {k: v if source == "pcap" else v.replace("capture", "recording") for k, v in SOURCES.items()},
        "log_events": ls["records"], "heartbeats": cs["records"],
        "clients": {"both": len(ids_l & ids_c), "log_only": len(ids_l - ids_c), "heartbeats_only": len(ids_c - ids_l)},
        "expiries": {"both": matched, "log_only": sum(r["source"] == "log" for r in out["expired_clients"]),
                     "heartbeats_only": sum(r["source"] == "capture" for r in out["expired_clients"])},
    }
    if source == "recording":  # the rows say which input they come from
        for k in ("expired_clients", "heartbeat_gaps", "flapping_clients", "member_addresses", "group_sizes",
                  "vanished_clients", "inconsistent_subscriptions"):
            for r in out[k]:
                for f in ("source", "source_input"):
                    if f in r:
                        r[f] = r[f].replace("capture", "recording")
    return out


def _vanished(log_rows: list, cap_rows: list, broker: str) -> list:
    """One row per connection (address) that ended without an unregister: the log's (it names the groups the
    broker removed it from), the capture's where the log has none."""
    rows = _by_key(log_rows, cap_rows, lambda r: r["addr"], broker, "log")
    rows.sort(key=lambda r: (r["ended_ms"], r["addr"]))
    return rows


def recording_client_ids(directory) -> List[str]:
    """The distinct client ids of a recording's heartbeats (each distinct body decoded once), as the Spark scan's
    ``client_ids=True`` lists them."""
    from engine import decode_heartbeat
    from engine.recording.recorder import iter_records

    ids, seen = set(), set()  # seen: 16-byte digests of the bodies decoded (a client repeats its body)
    for r in iter_records(directory):
        digest = hashlib.blake2b(r.body, digest_size=16).digest()
        if digest in seen:
            continue
        seen.add(digest)
        try:
            cid = decode_heartbeat(r.body).client_id
        except ValueError:
            continue
        if cid is not None:
            ids.add(cid)
    return sorted(ids)


def route(argv) -> Tuple[list, bool, Optional[str]]:
    """(argv, mixed, notice) for `rmqhb scan` before it dispatches on the input kind: ``mixed`` when the paths
    (files, directories) hold several kinds (scan_main merges or refuses them); else argv with ``--format KIND``
    added when the content says a kind the names do not (a capture named .log, a log named .txt), and without
    ``--log-tz`` when no input is a broker log (``notice`` says it is ignored: captures and recordings carry UTC
    epoch times). Left as given: an explicit --format, --broker, -h, or a path that does not exist (the input
    check names it)."""
    from .brokerlog import _paths_of, input_format

    argv = list(argv)
    if any(a in ("-h", "--help") or a.startswith(("--format", "--input")) for a in argv):
        return argv, False, None
    named = [(a.split("=", 1)[1] if a.startswith("--broker=") else argv[i + 1] if i + 1 < len(argv) else "")
             .partition("=")[2] for i, a in enumerate(argv) if a == "--broker" or a.startswith("--broker=")]
    if named:  # brokers' logs or brokers' captures; a broker's log with its capture: given as paths
        kinds = split_inputs([x for x in named + _paths_of(argv) if x and Path(x).exists()])
        if len([k for k in kinds if k is not None]) > 1:
            raise MergeRefused("--broker NAME=PATH names several brokers' logs or several brokers' captures; a "
                               "broker's log and its capture are scanned together when given as paths, without "
                               "--broker: rmqhb scan LOG CAPTURE --out REPORT_DIR")
        return argv, False, None
    paths = _paths_of(argv)
    if not paths or not all(Path(x).exists() for x in paths):
        return argv, False, None
    kinds = split_inputs(paths)
    known = [k for k in kinds if k is not None]
    if len(known) > 1:
        return argv, True, None
    if len(known) != 1:
        return argv, False, None
    kind, notice = known[0], None
    if kind != "broker-log":
        for i, a in enumerate(argv):
            if a == "--log-tz" and i + 1 < len(argv) or a.startswith("--log-tz="):
                del argv[i:i + (1 if "=" in a else 2)]
                what = "packet captures" if kind == "pcap" else "a recording"
                notice = f"--log-tz ignored: it is the zone of broker-log lines, and the input is {what} (UTC times)"
                break
    if None not in kinds and input_format(argv)[0] != kind:
        argv += ["--format", kind]
    return argv, False, notice


# ---------------------------------------------------------------------------------------------------------------
# rmqhb scan LOG... CAPTURE... (bindings.cli.scan_main routes inputs of several kinds here)


def scan_main(argv) -> int:
    """`rmqhb scan LOG... CAPTURE|RECORDING --out REPORT_DIR [--log-tz ZONE]`: one broker's logs and its captures
    (or its recording) as one timeline (merge_log_and_heartbeats), on the engine scan_engine chooses (their bytes
    together; a recording's records too). Exit statuses as the log and capture scans'; 2 inputs that cannot be
    merged (one line: MergeRefused)."""
    import argparse
    import sys

    from engine.recording.scan_py import ScanParams

    from . import brokerlog as bl
    from . import pcap
    from .report import damage_line, print_summary, write_report
    from .plan import DEFAULT_SPLIT_RECORDS, plan_splits
    from .inputs import input_problem
    from .scan_engine import (LOCAL_MAX_BYTES, LOCAL_MAX_RECORDS, EngineError, _files, add_arguments, choose_engine,
                              local_recording_scan, run_scan, total_bytes)

    d = ScanParams()
    p = argparse.ArgumentParser(prog="rmqhb scan", description=scan_main.__doc__)
    p.add_argument("paths", nargs="+", type=Path,
                   help="one broker's logs and its captures or its recording (files, directories)")
    p.add_argument("--out", type=Path, required=True, help="report directory (created)")
    p.add_argument("--log-tz", default=None, help="zone of the logs' wall-clock times (the captures' are UTC)")
    p.add_argument("--master", default=None)
    p.add_argument("--min-duration", type=float, default=d.min_duration_s)
    p.add_argument("--gap-threshold", type=float, default=d.gap_threshold_s)
    p.add_argument("--expiry", type=float, default=d.expiry_s)
    p.add_argument("--flap-window", type=float, default=d.flap_window_s)
    p.add_argument("--flap-min", type=int, default=d.flap_min_reconnects)
    p.add_argument("--port", type=int, action="append", default=[], help="captures: only this TCP port")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--max-line-bytes", type=int, default=bl.MAX_LINE_BYTES)
    p.add_argument("--twin", action="store_true", help="the pure-Python log parser and capture reader")
    p.add_argument("--allow-damage", action="store_true")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--debug", action="store_true")
    add_arguments(p)
    args = p.parse_args(argv)
    kinds = split_inputs(args.paths)
    try:
        unknown = kinds.pop(None, [])
        if unknown:
            raise MergeRefused(f"{unknown[0]} is no broker log, packet capture or recording")
        problem = mix_problem(kinds, f"{args.paths[0]} mixes" if len(args.paths) == 1 else "the inputs mix")
        if problem:
            raise MergeRefused(problem)
        for kind, given in kinds.items():  # each file as its kind's scan checks it: empty, no header, binary
            problem = input_problem([str(f) for f in given if not f.is_dir()], kind, explicit=True)
            if problem:
                print(f"rmqhb scan: {problem[1]}", file=sys.stderr)
                return problem[0]
        logs, caps, recs = kinds.get("broker-log", []), kinds.get("pcap", []), kinds.get("recording", [])
        rec_plan = plan_splits(recs[0], DEFAULT_SPLIT_RECORDS) if recs else None
        if rec_plan is not None and rec_plan.segments == 0:
            raise MergeRefused(f"no recording in {recs[0]} (no *.seg segment files)")
        plan = bl.plan_files(logs)
        brokers = sorted({b for b, _, _ in plan})
        if len(brokers) != 1:
            raise MergeRefused(f"a capture is merged with one broker's logs; these are {len(brokers)} brokers' "
                               f"({', '.join(brokers[:3])}): scan each broker's logs and captures apart")
        params = ScanParams(args.expiry, args.gap_threshold, args.min_duration, args.flap_window,
                            args.flap_min).validate()
        try:
            bl.resolve_tz(args.log_tz)
        except Exception:  # timedelta's range, ZoneInfo's KeyError or ValueError: as the log scan's check says
            raise MergeRefused(f"--log-tz {args.log_tz!r} is not a zone: give an IANA name (e.g. Asia/Shanghai) or "
                               "an offset from -23:59 to +23:59 (e.g. +08:00)") from None
        cap_plan = pcap.plan_captures(caps, args.shards)
    except (MergeRefused, ValueError, FileNotFoundError) as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    broker = brokers[0]
    files = [f for _, f, _ in plan] + sorted({f for c in cap_plan for f in c.files})
    size = total_bytes(files)
    try:
        engine = choose_engine(args.engine, master=args.master, brokers=1, size=size, limit=LOCAL_MAX_BYTES)
        if rec_plan is not None and args.engine == "auto" and engine[0] == "local" \
                and rec_plan.n_records > LOCAL_MAX_RECORDS:
            engine = ("spark", f"a recording of {rec_plan.n_records:,} records, more than the in-process limit of "
                               f"{LOCAL_MAX_RECORDS:,}")
    except EngineError as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    logged = total_bytes(f for _, f, _ in plan)
    what = f"{_files(len(plan), 'broker log', logged)} and " + (
        f"{_files(len(files) - len(plan), 'capture', size - logged)}" if rec_plan is None else
        f"a recording ({rec_plan.segments} segments)") + f" of {broker}"
    native = False if args.twin else None
    log_kw = dict(log_tz=args.log_tz, native=native, max_line_bytes=args.max_line_bytes, client_ids=True)
    cap_kw = dict(native=native, ports=args.port or None, shards=args.shards, client_ids=True)

    def merged(log, cap):
        zc = log["log"].get("zone_check")
        if zc and not zc["agrees"]:  # the log's times would miss the capture's: an expiry in both seen twice
            off = zc["inferred_utc_offset_min"]
            raise MergeRefused(
                f"the log lines' own timestamps imply UTC{off / 60:+g}, not the zone in use "
                f"(UTC{zc['log_tz_offset_min'] / 60:+g}, {log['log']['log_tz_source']}): its events would not line "
                f"up with the capture's; give --log-tz "
                f"{'+' if off >= 0 else '-'}{abs(off) // 60:02d}:{abs(off) % 60:02d}")
        problem = same_broker_problem(log, cap)
        if problem:
            raise MergeRefused(problem)
        return merge_log_and_heartbeats(log, cap, broker)

    def spark_heartbeats(spark):
        if rec_plan is None:
            return pcap.scan(spark, caps, params, **cap_kw)
        from .analyses import scan as recording_scan

        return {**recording_scan(spark, rec_plan.directory, params, plan=rec_plan, client_ids=True),
                "_directory": str(rec_plan.directory)}

    def local_heartbeats():
        if rec_plan is None:
            return pcap.local_capture_scan(caps, params, **cap_kw)
        return {**local_recording_scan(rec_plan, params), "_client_ids": recording_client_ids(rec_plan.directory),
                "_directory": str(rec_plan.directory)}

    try:
        findings = run_scan(
            args, engine=engine, what=what, app="rmqhb-scan-merged",
            spark_scan=lambda spark: merged(bl.scan(spark, logs, params, **log_kw), spark_heartbeats(spark)),
            local_scan=lambda: merged(bl.local_log_scan(logs, params, **log_kw), local_heartbeats()),
            count=lambda f: (f["log"]["lines"] + f["merged"]["heartbeats"], "log lines and heartbeats"),
            inputs=files + sorted({s.path for s in rec_plan.splits} if rec_plan is not None else ()))
    except MergeRefused as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return 2
    m = findings["merged"]
    if m["log_events"] == 0 and m["heartbeats"] == 0:
        write_report(findings, args.out, plots=False)
        print(f"rmqhb scan: nothing decodable: no client event in {findings['log']['lines']:,} broker-log lines and no "
              f"heartbeat in the {'capture' if m['heartbeats_from'] == 'pcap' else 'recording'}", file=sys.stderr)
        return 4
    index = write_report(findings, args.out, plots=not args.no_plots)
    print_summary(findings, sys.stdout)
    other = "capture" if m["heartbeats_from"] == "pcap" else "recording"
    print(f"merged {broker}'s broker log ({m['log_events']:,} events) and {other} ({m['heartbeats']:,} "
          f"heartbeats): clients {m['clients']['both']} in both, {m['clients']['log_only']} only in the log, "
          f"{m['clients']['heartbeats_only']} only in the {other}; expiries {m['expiries']['both']} in both, "
          f"{m['expiries']['log_only']} only in the log, {m['expiries']['heartbeats_only']} only in the {other}",
          file=sys.stdout)
    log = findings["log"]
    print(f"broker logs: {log['lines']:,} lines in {len(log['files'])} files, zone {log['log_tz']} "
          f"({log['log_tz_source']}); {log['unparseable']:,} unparseable lines", file=sys.stdout)
    print(f"report: {index}")
    damage = damage_line(findings)
    if damage or (findings.get("capture") or {}).get("damaged_files"):  # as the capture scan's exit
        print(f"rmqhb scan: {damage or 'damaged capture files'}", file=sys.stderr)
        return 0 if args.allow_damage else 3
    return 0

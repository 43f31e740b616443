"""Report writer for scan findings: findings.json, one CSV per finding, PNG plots and an index.html.

Takes the findings dict of ``engine.bindings.spark.scan`` or ``engine.scan_py.scan`` (same format); needs
matplotlib only for the plots (skipped with a note when it is missing).
"""
from __future__ import annotations

import csv
import html
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

from engine.scan_py import FINDING_KEYS

#: At most this many groups in the group-size plot, and clients in the flapping timeline.
PLOT_GROUPS = 12
PLOT_CLIENTS = 30


def utc(ms) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _subs_text(subs) -> str:
    return "; ".join(f"{t} [{e}] {x}" for t, e, x in subs)


def _write_csv(path: Path, header: List[str], rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def write_csvs(findings: dict, out: Path) -> List[str]:
    names = []
    rows = []
    for r in findings["inconsistent_subscriptions"]:
        variants = " | ".join(f"{', '.join(v['clients'])}: {_subs_text(v['subscriptions'])}" for v in r["variants"])
        rows.append([r["group"], r["start_ms"], r["end_ms"], utc(r["start_ms"]), utc(r["end_ms"]), r["duration_s"],
                     len(r["variants"]), variants])
    _write_csv(out / "inconsistent_subscriptions.csv",
               ["group", "start_ms", "end_ms", "start_utc", "end_utc", "duration_s", "n_variants", "variants"], rows)
    names.append("inconsistent_subscriptions.csv")
    _write_csv(out / "flapping_clients.csv",
               ["client_id", "groups", "reconnects", "max_reconnects_per_window", "flapping_windows",
                "first_reconnect_utc", "last_reconnect_utc"],
               [[r["client_id"], ";".join(r["groups"]), r["reconnects"], r["max_reconnects_per_window"],
                 len(r["windows"]), utc(r["first_reconnect_ms"]), utc(r["last_reconnect_ms"])]
                for r in findings["flapping_clients"]])
    _write_csv(out / "flapping_timeline.csv", ["client_id", "reconnect_ms", "reconnect_utc"],
               [[r["client_id"], t, utc(t)] for r in findings["flapping_clients"] for t in r["reconnect_ms"]])
    _write_csv(out / "heartbeat_gaps.csv",
               ["client_id", "groups", "start_ms", "end_ms", "start_utc", "end_utc", "gap_s"],
               [[r["client_id"], ";".join(r["groups"]), r["start_ms"], r["end_ms"], utc(r["start_ms"]),
                 utc(r["end_ms"]), r["gap_s"]] for r in findings["heartbeat_gaps"]])
    _write_csv(out / "group_sizes.csv", ["group", "role", "ms", "utc", "members"],
               [[g["group"], g["role"], ms, utc(ms), n] for g in findings["group_sizes"] for ms, n in g["series"]])
    names += ["flapping_clients.csv", "flapping_timeline.csv", "heartbeat_gaps.csv", "group_sizes.csv"]
    _write_csv(out / "expired_clients.csv",
               ["broker", "client_id", "addr", "groups", "connected_utc", "silent_since_before_utc", "expired_utc",
                "returned_utc", "expired_ms"],
               [[r.get("broker", ""), r["client_id"], r["addr"], ";".join(r["groups"]), utc(r["connected_ms"]),
                 utc(r["silent_since_before_ms"]), utc(r["expired_ms"]), utc(r["returned_ms"]), r["expired_ms"]]
                for r in findings.get("expired_clients", [])])
    names.append("expired_clients.csv")
    if "retry_topic_churn" in findings:
        _write_csv(out / "retry_topic_churn.csv",
                   ["broker", "group", "retry_topic", "adds", "changes", "removes", "max_per_window", "first_utc",
                    "last_utc"],
                   [[r["broker"], r["group"], r["retry_topic"], r["adds"], r["changes"], r["removes"],
                     r["max_per_window"], utc(r["first_ms"]), utc(r["last_ms"])] for r in findings["retry_topic_churn"]])
        names.append("retry_topic_churn.csv")
    log = findings.get("log")
    if log:
        _write_csv(out / "log_lines.csv", ["kind", "lines", "example"],
                   [[k, v, (log.get("examples") or {}).get(k, "")] for k, v in sorted(log.get("counts", {}).items())])
        names.append("log_lines.csv")
    return names


def _interesting_groups(findings) -> list:
    """Consumer groups whose size moved the most (ignoring the ramp-up and final expiry), then the largest."""
    scored = []
    for g in findings["group_sizes"]:
        if g["role"] != "consumer" or not g["series"]:
            continue
        inner = [n for _, n in g["series"][:-1]] or [0]
        steady = inner[len(inner) // 10:] or inner
        scored.append((max(steady) - min(steady), g["max_members"], g["group"], g))
    scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
    return [s[3] for s in scored[:PLOT_GROUPS]]


def _label(r: dict, name: str) -> str:
    return f"{r['broker']}: {name}" if r.get("broker") else name


def write_plots(findings: dict, out: Path) -> List[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError:
        return []

    def dt(ms):
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)

    names = []
    fig, ax = plt.subplots(figsize=(11, 5))
    for g in _interesting_groups(findings):
        xs = [dt(ms) for ms, _ in g["series"]]
        ys = [n for _, n in g["series"]]
        ax.step(xs, ys, where="post", label=_label(g, g["group"]), linewidth=1.2)
    ax.set_title("Consumer group sizes over time (live members)")
    ax.set_ylabel("members")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    if ax.lines:
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(out / "group_sizes.png", dpi=110)
    plt.close(fig)
    names.append("group_sizes.png")

    if "heartbeat_gaps" in (findings.get("unsupported") or {}):
        return names + _flapping_plot(findings, out, plt, mdates, dt)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    gaps = [r["gap_s"] for r in findings["heartbeat_gaps"]]
    if gaps:
        ax.hist([g / 60 for g in gaps], bins=min(40, max(5, len(gaps))), color="#c0504d")
    else:
        ax.text(0.5, 0.5, "no heartbeat gaps over the threshold", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"Heartbeat gaps over {findings['parameters']['gap_threshold_s']:g} s ({len(gaps)})")
    ax.set_xlabel("gap (minutes)")
    ax.set_ylabel("gaps")
    fig.tight_layout()
    fig.savefig(out / "gap_histogram.png", dpi=110)
    plt.close(fig)
    names.append("gap_histogram.png")
    return names + _flapping_plot(findings, out, plt, mdates, dt)


def _flapping_plot(findings, out, plt, mdates, dt) -> List[str]:
    names = []
    flapping = sorted(findings["flapping_clients"], key=lambda r: -r["reconnects"])[:PLOT_CLIENTS]
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.35 * len(flapping) + 1.5)))
    for i, r in enumerate(flapping):
        ax.plot([dt(t) for t in r["reconnect_ms"]], [i] * len(r["reconnect_ms"]), "|", markersize=12)
    ax.set_yticks(range(len(flapping)))
    ax.set_yticklabels([_label(r, r["client_id"]) for r in flapping], fontsize=7)
    if not flapping:
        ax.text(0.5, 0.5, "no flapping clients", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("Reconnects of flapping clients")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(out / "flapping_timeline.png", dpi=110)
    plt.close(fig)
    names.append("flapping_timeline.png")
    return names


def _table(header, rows, limit=50) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows[:limit])
    more = f"<p class=more>{len(rows) - limit} more rows in the CSV</p>" if len(rows) > limit else ""
    if not rows:
        return "<p>none</p>"
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def damage_line(findings: dict) -> Optional[str]:
    """One line saying what of the input could not be read, or None when it was read whole."""
    scan = findings.get("scan") or {}
    torn, corrupt, lost = scan.get("torn_tails") or [], scan.get("corrupt") or [], scan.get("data_loss") or []
    if not (torn or corrupt or lost):
        return None
    known = sum(d.get("records_lost") or 0 for d in corrupt) + sum(d["records_lost"] for d in lost)
    unknown = sum(1 for d in list(torn) + list(corrupt) if d.get("records_lost") is None)
    over = len(findings.get("gaps_over_data_loss") or [])
    return (f"DAMAGED INPUT: {len(corrupt)} corrupt ranges, {len(torn)} torn tails, {len(lost)} recorder data-loss "
            f"markers; {known:,} records lost" + (f" (+ {unknown} ranges of unknown size)" if unknown else "")
            + f"; {over} heartbeat gaps over lost data reported apart, not as client silence")


def _damage_banner(findings: dict) -> List[str]:
    line = damage_line(findings)
    if line is None:
        return []
    scan = findings.get("scan") or {}
    rows = [[d["kind"], d["segment"], d["offset"], d["bytes"], utc(d["first_ms"]) if d.get("first_ms") else "?",
             utc(d["last_ms"]) if d.get("last_ms") else "?", "?" if d.get("records_lost") is None else d["records_lost"],
             d["reason"]] for d in (scan.get("corrupt") or []) + (scan.get("torn_tails") or [])]
    rows += [["data loss", d["segment"], d["offset"], 40, utc(d["first_ms"]), utc(d["last_ms"]), d["records_lost"],
              d["reason"]] for d in scan.get("data_loss") or []]
    return ["<div style='border:2px solid #c00;background:#fee;padding:8px;margin:1em 0'><b>"
            + html.escape(line) + "</b>"
            + _table(["kind", "segment", "byte", "bytes", "from (UTC)", "to (UTC)", "records lost", "reason"], rows)
            + "</div>"]


def _keys(findings: dict) -> List[str]:
    """The finding lists present (the log scan adds retry_topic_churn)."""
    return [k for k in FINDING_KEYS + ("retry_topic_churn",) if k in findings]


def _per_broker(findings: dict) -> str:
    """Counts of each finding per broker (several brokers in one scan), the fleet's totals, and what only the
    fleet shows (``findings["fleet"]``)."""
    fleet = findings["fleet"]
    keys = [k for k in _keys(findings) if k != "heartbeat_gaps" or "heartbeat_gaps" not in (findings.get("unsupported") or {})]
    rows = [[b] + [fleet["per_broker"][b].get(k, 0) for k in keys] for b in fleet["brokers"]]
    rows.append(["fleet (all brokers)"] + [len(findings[k]) for k in keys])
    text = _table(["broker"] + keys, rows)
    several = fleet["clients_on_several_brokers"]
    if several:
        text += "<p>Clients found on several brokers:</p>" + _table(
            ["finding", "client", "brokers"], [[r["finding"], r["client_id"], ", ".join(r["brokers"])] for r in several])
    uneven = [g for g in fleet["groups_on_several_brokers"] if g["uneven"]]
    text += (f"<p>{len(fleet['groups_on_several_brokers'])} groups are seen on several brokers; "
             f"{len(uneven)} of them with a different number of members on each (members that never reached a "
             "broker, or left it):</p>")
    text += _table(["group", "role", "members per broker", "peak live per broker"],
                   [[g["group"], g["role"], ", ".join(f"{b} {n}" for b, n in g["members"].items()),
                     ", ".join(f"{b} {n}" for b, n in g["max_members"].items())] for g in uneven])
    return text


def _log_section(findings: dict) -> List[str]:
    e = html.escape
    log = findings["log"]
    parts = ["<h2>Broker logs read</h2>"]
    zc = log.get("zone_check")
    zone = (f"<p>Log time zone used: <b>{e(str(log['log_tz']))}</b> ({e(str(log['log_tz_source']))}): the lines' "
            "wall-clock times carry no zone; every time in this report is UTC.")
    if zc:
        if zc["agrees"]:
            zone += (" The brokers' own epoch timestamps in the lines agree with this zone "
                     f"(UTC{zc['inferred_utc_offset_min'] / 60:+g}).")
        else:
            zone += (f" <b style='color:#c00'>Warning: the brokers' own epoch timestamps in the lines imply "
                     f"UTC{zc['inferred_utc_offset_min'] / 60:+g}, not the zone in use (UTC"
                     f"{zc['log_tz_offset_min'] / 60:+g}): rerun with --log-tz.</b>")
    parts.append(zone + "</p>")
    parts.append(f"<p>{log['lines']:,} lines in {len(log['files'])} file(s) of {len(log['brokers'])} broker(s) "
                 f"({e(', '.join(log['brokers']))}); {log['events']:,} client-management events; "
                 f"{log['unparseable']:,} unparseable lines.</p>")
    counts = log.get("counts") or {}
    ex = log.get("examples") or {}
    events = [[k[len("event_"):], v] for k, v in counts.items() if k.startswith("event_")]
    parts.append("<h3>Events recognised</h3>" + _table(["event", "lines"], events))
    other = [[k, v, ex.get(k, "")] for k, v in counts.items() if not k.startswith("event_")]
    parts.append("<h3>Lines not turned into events, by kind</h3><p>Never fatal. <i>unknown_format</i>: no "
                 "<code>date time LEVEL thread - </code> header (a line format the parser does not know); "
                 "<i>malformed_&lt;event&gt;</i>: a known message whose fields do not parse (e.g. a truncated line); "
                 "<i>invalid_utf8</i>; <i>continuation</i>: stack traces and wrapped lines; <i>other</i>: well-formed "
                 "lines of other messages (no example kept).</p>"
                 + _table(["kind", "lines", "example (first seen)"], other))
    un = log.get("unattributed_events") or {}
    if un:
        parts.append("<p>Events the analyses could not attach to a live member (e.g. its register line is in an "
                     "older, missing file): " + e(", ".join(f"{k} {v}" for k, v in sorted(un.items()))) + "</p>")
    parts.append("<p>Files: " + e(", ".join(log["files"][:20])) + (" ..." if len(log["files"]) > 20 else "") + "</p>")
    return parts


def write_html(findings: dict, out: Path, csvs: List[str], plots: List[str]) -> Path:
    e = html.escape
    s = findings["summary"]
    p = findings["parameters"]
    log = findings.get("log")
    unsupported = findings.get("unsupported") or {}
    if log:
        what = (f"<p>{log['lines']:,} broker-log lines, {s['records']:,} client-management events "
                f"({s['bad_bodies']:,} unparseable lines) about {s['clients']:,} clients of {len(log['brokers'])} "
                f"broker(s), {e(utc(s['first_ms']))} to {e(utc(s['last_ms']))} UTC (log zone {e(str(log['log_tz']))})."
                "</p>")
    else:
        what = (f"<p>{s['records']:,} heartbeats ({s['bad_bodies']:,} undecodable) from {s['clients']:,} clients, "
                f"{e(utc(s['first_ms']))} to {e(utc(s['last_ms']))} UTC.</p>")
    parts = [
        "<!doctype html><meta charset=utf-8><title>Heartbeat scan report</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}th{background:#eee}"
        "img{max-width:100%;border:1px solid #ddd}.more{color:#777}</style>",
        "<h1>Heartbeat scan report</h1>",
        *_damage_banner(findings),
        what,
        _table(["finding", "count"], [[k, "not supported by this input" if k in unsupported else len(findings[k])]
                                      for k in _keys(findings)]),
        "<p>Parameters: " + ", ".join(f"{e(k)} = {e(str(v))}" for k, v in p.items()) + "</p>",
    ]
    if unsupported:
        parts.append("<h2>What this input cannot show</h2>" + _table(
            ["analysis", "why"], [[k, v] for k, v in sorted(unsupported.items())]))
    if findings.get("fleet"):
        parts.append("<h2>Per broker</h2>" + _per_broker(findings))
    scan = findings.get("scan")
    if scan and log:
        parts.append(f"<p>Scan: {scan.get('files')} log file(s) in {scan.get('seconds')} s, {e(str(scan.get('parser')))} "
                     "line parser.</p>")
    elif scan:
        parts.append(f"<p>Scan: method {e(str(scan.get('method')))}, {scan.get('splits')} splits over "
                     f"{scan.get('segments')} segments in {scan.get('seconds')} s; torn tails: "
                     f"{len(scan.get('torn_tails', []))}, corrupt ranges: {len(scan.get('corrupt', []))}.</p>")
    parts.append("<p>Files: " + ", ".join(f"<a href='{e(n)}'>{e(n)}</a>" for n in ["findings.json"] + csvs) + "</p>")
    if log:
        parts += _log_section(findings)
    multi = bool(log) or bool(findings.get("fleet"))  # log findings and several brokers' rows carry their broker

    def cols(*names):
        return (["broker"] if multi else []) + list(names)

    def row(r, *values):
        return ([r.get("broker", "")] if multi else []) + list(values)

    parts.append("<h2>Inconsistent subscriptions</h2><p>Consumer groups whose live members held different "
                 "subscription sets (subVersion ignored), with the span of the disagreement.</p>")
    parts.append(_table(
        cols("group", "from (UTC)", "to (UTC)", "duration s", "variants"),
        [row(r, r["group"], utc(r["start_ms"]), utc(r["end_ms"]), r["duration_s"],
             " | ".join(f"{len(v['clients'])} client(s) ({', '.join(v['clients'][:5])}"
                        f"{' ...' if len(v['clients']) > 5 else ''}): {_subs_text(v['subscriptions'])}"
                        for v in r["variants"]))
         for r in findings["inconsistent_subscriptions"] if r.get("source") != "group_table"]))
    if log:
        parts.append("<h2>Subscription flips</h2><p>Groups whose subscription table (the broker's, logged as "
                     "<code>subscription changed ... OLD: ... NEW:</code>) went back to an expression it had before: "
                     "members with different subscriptions overwriting each other at every heartbeat. The log line "
                     "does not name the client.</p>")
        parts.append(_table(
            cols("group", "topic", "flips", "from (UTC)", "to (UTC)", "expressions"),
            [row(r, r["group"], r["topic"], r["flips"], utc(r["start_ms"]), utc(r["end_ms"]),
                 " | ".join(_subs_text(v["subscriptions"]) for v in r["variants"]))
             for r in findings["inconsistent_subscriptions"] if r.get("source") == "group_table"]))
    parts.append("<h2>Expired clients</h2><p>Clients the broker's channel-expiry scan removes (SCAN): no heartbeat "
                 f"for {p['expiry_s']:g} s while the connection stayed open"
                 + (" (from the brokers' SCAN lines; silent since at most the expiry before)." if log else
                    " (a recording holds heartbeats only: a client that stopped for good is listed once the expiry has "
                    "passed, as the broker would if its connection stayed open).") + "</p>")
    parts.append(_table(
        cols("client", "address", "groups", "connected (UTC)", "silent since (UTC)", "expired (UTC)", "back (UTC)"),
        [row(r, r["client_id"], r["addr"], ", ".join(r["groups"]), utc(r["connected_ms"]),
             utc(r["silent_since_before_ms"]), utc(r["expired_ms"]), utc(r["returned_ms"]) or "never")
         for r in findings.get("expired_clients", [])]))
    if findings.get("expired_over_data_loss"):
        parts.append(f"<p>{len(findings['expired_over_data_loss'])} more silences over lost or damaged data are not "
                     "counted as expiries (findings.json: expired_over_data_loss).</p>")
    if "retry_topic_churn" in findings:
        parts.append("<h2>Retry-topic churn</h2><p>Consumer groups whose <code>%RETRY%</code> subscription was "
                     f"added, changed (subVersion) or removed {p['flap_min_reconnects']} or more times in a "
                     f"{p['flap_window_s']:g} s window: members restarting or flapping.</p>")
        parts.append(_table(
            cols("group", "retry topic", "adds", "changes", "removes", "max per window", "first (UTC)", "last (UTC)"),
            [row(r, r["group"], r["retry_topic"], r["adds"], r["changes"], r["removes"], r["max_per_window"],
                 utc(r["first_ms"]), utc(r["last_ms"])) for r in findings["retry_topic_churn"]]))
    parts.append("<h2>Group sizes</h2>")
    if "group_sizes.png" in plots:
        parts.append("<img src='group_sizes.png' alt='group sizes'>")
    parts.append(_table(cols("group", "role", "distinct members", "peak live", "changes"),
                        [row(g, g["group"], g["role"], g["members"], g["max_members"], len(g["series"]))
                         for g in findings["group_sizes"]], limit=100))
    parts.append("<h2>Heartbeat gaps</h2>")
    if "heartbeat_gaps" in unsupported:
        parts.append(f"<p><b>Not supported by this input</b>: {e(unsupported['heartbeat_gaps'])}.</p>")
    else:
        if "gap_histogram.png" in plots:
            parts.append("<img src='gap_histogram.png' alt='gap histogram'>")
        parts.append(_table(["client", "groups", "from (UTC)", "to (UTC)", "gap s"],
                            [[r["client_id"], ", ".join(r["groups"]), utc(r["start_ms"]), utc(r["end_ms"]), r["gap_s"]]
                             for r in findings["heartbeat_gaps"]]))
    parts.append("<h2>Flapping clients</h2>")
    if "flapping_timeline.png" in plots:
        parts.append("<img src='flapping_timeline.png' alt='flapping timeline'>")
    parts.append(_table(cols("client", "groups", "reconnects", "max per window", "first (UTC)", "last (UTC)"),
                        [row(r, r["client_id"], ", ".join(r["groups"]), r["reconnects"], r["max_reconnects_per_window"],
                             utc(r["first_reconnect_ms"]), utc(r["last_reconnect_ms"]))
                         for r in findings["flapping_clients"]]))
    path = out / "index.html"
    path.write_text("\n".join(parts))
    return path


def write_report(findings: dict, out, plots: bool = True) -> Path:
    """Write findings.json, CSVs, plots and index.html into ``out``; returns the index path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "findings.json").write_text(json.dumps(findings, indent=1))
    csvs = write_csvs(findings, out)
    pngs = write_plots(findings, out) if plots else []
    return write_html(findings, out, csvs, pngs)


def print_summary(findings: dict, file) -> None:
    s = findings["summary"]
    log = findings.get("log")
    what = ("client-management events", "unparseable lines") if log else ("heartbeats", "undecodable")
    print(f"{s['records']:,} {what[0]} from {s['clients']:,} clients ({s['bad_bodies']:,} {what[1]}), "
          f"{utc(s['first_ms'])} .. {utc(s['last_ms'])} UTC", file=file)
    scan = findings.get("scan") or {}
    if log and scan.get("seconds"):
        print(f"scanned in {scan['seconds']:.1f} s ({log['lines'] / max(scan['seconds'], 1e-9):,.0f} log lines/s, "
              f"{scan.get('parser')} parser)", file=file)
    elif scan.get("seconds"):
        print(f"scanned in {scan['seconds']:.1f} s ({s['records'] / max(scan['seconds'], 1e-9):,.0f} heartbeats/s, "
              f"method {scan.get('method')})", file=file)
    line = damage_line(findings)
    if line:
        print(line, file=file)
    for r in findings["inconsistent_subscriptions"][:5]:
        print(f"  inconsistent subscriptions: {_label(r, r['group'])} for {r['duration_s']:.0f} s from {utc(r['start_ms'])}, "
              f"{len(r['variants'])} variants", file=file)
    for r in findings["flapping_clients"][:5]:
        print(f"  flapping: {_label(r, r['client_id'])} ({', '.join(r['groups'])}) {r['reconnects']} reconnects", file=file)
    for r in findings["heartbeat_gaps"][:5]:
        print(f"  gap: {r['client_id']} silent {r['gap_s']:.0f} s from {utc(r['start_ms'])}", file=file)
    for r in findings.get("expired_clients", [])[:5]:
        print(f"  expired: {r['client_id']} ({', '.join(r['groups'])}) at {utc(r['expired_ms'])}"
              + (f" on {r['broker']}" if r.get("broker") else ""), file=file)
    n = {k: len(findings[k]) for k in _keys(findings)}
    gaps = "heartbeat gaps not visible" if "heartbeat_gaps" in (findings.get("unsupported") or {}) else \
        f"{n['heartbeat_gaps']} heartbeat gaps"
    print(f"findings: {n['inconsistent_subscriptions']} inconsistent-subscription spans, {n['flapping_clients']} flapping "
          f"clients, {gaps}, {n['expired_clients']} expired clients, {n['group_sizes']} group size series"
          + (f", {n['retry_topic_churn']} groups with retry-topic churn" if "retry_topic_churn" in n else ""), file=file)

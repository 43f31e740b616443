"""Report writer for scan findings: findings.json, one CSV per finding, SVG plots and an index.html.

Takes the findings dict of ``engine.bindings.analyses.scan``, ``engine.recording.scan_py.scan``, the broker-log scan or the
capture scan (same format; every ``rmqhb scan`` input kind ends here). The page is what an operator reads first:
a banner when the input was damaged or partly unreadable, one summary line per finding kind with its worst case,
then per finding what is wrong, where, since when and who -- subscription disagreements as a difference from the
group's majority, reconnect and silence timelines per client, group sizes as small multiples of the groups that
changed or have findings (every other group in one collapsed table). It is self-contained and offline: one HTML
file with inline SVG timelines, the SVG plots (drawn here, no plotting library) and CSVs beside it, no network
reference, a few lines of plain JavaScript (table sorting and filtering, opening the collapsed parts for printing)
and a print stylesheet.
"""
from __future__ import annotations

import bisect
import csv
import errno
import html
import json
import math
import os
import re
import secrets
import stat
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from engine.logutil import EscapedWriter, clip, escape_text
from engine.registry.clientlog import MAX_FIELD
from engine.recording.scan_py import CLIENT_INNER_PRODUCER, FINDING_KEYS, IDLE_CLOSE_MIN_MS

#: At most this many groups in the group-size plot (small multiples), and clients in the flapping plot.
PLOT_GROUPS = 24
PLOT_CLIENTS = 30
#: At most this many rows in an HTML table, findings drawn as cards, and group charts (the CSVs hold every row).
TABLE_ROWS = 200
CARDS = 40
MULTIPLES = 48


def utc(ms) -> str:
    if ms is None:
        return ""
    return _strftime(ms, "%Y-%m-%d %H:%M:%S.%f", 3)


def _strftime(ms, fmt: str, cut: int = 0) -> str:
    """``ms`` (epoch milliseconds, UTC) as ``fmt`` (its last ``cut`` characters cut); a time past what datetime
    holds (a crafted record stamped after the year 9999 or before 1) as its raw value, "<ms> ms", so the report
    is still written."""
    try:
        text = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime(fmt)
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"
    return text[:-cut] if cut else text


def _subs_text(subs) -> str:
    return "; ".join(f"{t} [{e}] {x}" for t, e, x in subs)


#: A cell starting with one of these is a formula to spreadsheet tools (OWASP "CSV injection"): it gets a "'".
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell from client data: a string that a spreadsheet would run as a formula gets a leading "'" (what
    spreadsheet tools advise), control characters escaped (engine.logutil.escape_text: a newline or an ESC in a
    client id stays visible text); numbers and None as they are."""
    if not isinstance(value, str):
        return value
    if value.startswith(FORMULA_START):
        value = "'" + value
    return escape_text(value)


def _write_csv(out: "ReportFiles", name: str, header: List[str], rows) -> List[int]:
    """Write the CSV (every cell through csv_cell); returns the line number (1 = the header) of every row."""
    rows = list(rows)
    with out.open(name, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([csv_cell(v) for v in r] for r in rows)
    return list(range(2, 2 + len(rows)))


# ---------------------------------------------------------------------------------------------------------------
# Subscription differences


def _expression(etype: str, expr: str) -> str:
    return expr if etype == "TAG" else f"{etype}: {expr}"


def _tags(expr: str) -> set:
    return {t.strip() for t in expr.split("||") if t.strip()}


def majority_variant(variants: list) -> Tuple[int, bool]:
    """(index of the variant held by the most members, whether another variant has as many: no majority)."""
    counts = [len(v["clients"]) for v in variants]
    best = max(range(len(counts)), key=lambda i: (counts[i], -i))
    return best, counts.count(counts[best]) > 1


def subscription_difference(majority, member) -> List[dict]:
    """What a member's subscription set ([topic, type, expression] triples) differs in from the majority's, per
    topic: subscribed by the member only, by the majority only, or with another expression (for tag expressions
    also the tags only one side has)."""
    def by_topic(subs):
        out: Dict[str, List[Tuple[str, str]]] = defaultdict(list)
        for t, e, x in subs:
            out[t].append((e, x))
        return {t: sorted(v) for t, v in out.items()}

    maj, mem = by_topic(majority), by_topic(member)
    rows = []
    for topic in sorted(set(maj) | set(mem)):
        a, b = maj.get(topic), mem.get(topic)
        if a == b:
            continue
        row = {"topic": topic, "majority": " , ".join(_expression(e, x) for e, x in a) if a else None,
               "member": " , ".join(_expression(e, x) for e, x in b) if b else None,
               "only_member_tags": [], "only_majority_tags": []}
        if a and b and len(a) == len(b) == 1 and a[0][0] == b[0][0] == "TAG" and "*" not in (a[0][1], b[0][1]):
            ta, tb = _tags(a[0][1]), _tags(b[0][1])
            row["only_member_tags"], row["only_majority_tags"] = sorted(tb - ta), sorted(ta - tb)
        rows.append(row)
    return rows


def _difference_text(d: dict) -> str:
    if d["majority"] is None:
        return f"{d['topic']} [{d['member']}] only here"
    if d["member"] is None:
        return f"{d['topic']} [{d['majority']}] missing here"
    extra = []
    if d["only_member_tags"]:
        extra.append("+" + " +".join(d["only_member_tags"]))
    if d["only_majority_tags"]:
        extra.append("-" + " -".join(d["only_majority_tags"]))
    return f"{d['topic']} [{d['member']}] instead of [{d['majority']}]" + (f" ({' '.join(extra)})" if extra else "")


def _member_spans(findings: dict) -> List[dict]:
    """The members' disagreements (not the log's subscription-table flips), each with its majority and
    deviating variants' differences."""
    out = []
    for i, r in enumerate(findings["inconsistent_subscriptions"]):
        if r.get("source") == "group_table" or not r.get("variants"):
            continue
        m, tie = majority_variant(r["variants"])
        maj = r["variants"][m]
        deviating = [{"clients": v["clients"], "subscriptions": v["subscriptions"],
                      "switched": sorted(set(v["clients"]) & set(maj["clients"])),
                      "difference": subscription_difference(maj["subscriptions"], v["subscriptions"])}
                     for k, v in enumerate(r["variants"]) if k != m]
        out.append({"row": r, "index": i, "majority": maj, "tie": tie, "deviating": deviating})
    return out


_IP = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}|\[?[0-9a-fA-F]*:[0-9a-fA-F:]+\]?")


def client_addresses(findings: dict) -> Dict[Tuple[str, str], str]:
    """{(broker, clientId): remote address(es)} the findings know (the deviating members' connections, expired
    clients' connections, captures' unregisters)."""
    out: Dict[Tuple[str, str], str] = {}
    seen: Dict[Tuple[str, str], list] = defaultdict(list)
    for r in findings.get("member_addresses") or []:  # the deviating members' connections during their spans
        key = (r.get("broker", ""), r["client_id"])
        seen[key] += [a for a in r["addrs"] if a not in seen[key]]
    out.update({k: ", ".join(v) for k, v in seen.items() if v})
    for r in findings.get("expired_clients") or []:
        if r.get("addr"):
            out.setdefault((r.get("broker", ""), r["client_id"]), r["addr"])
    for r in (findings.get("capture") or {}).get("unregisters") or []:
        if r.get("addr") and r.get("client_id"):
            out.setdefault((r.get("broker", ""), r["client_id"]), r["addr"])
    return out


def address_of(addrs: dict, broker: str, client: str) -> str:
    """The client's remote address when the findings know it, else the IP in its clientId (RocketMQ builds the
    clientId from the client's IP and instance name), marked as such."""
    a = addrs.get((broker or "", client))
    if a:
        return a
    m = _IP.search(client.split("@")[0]) or _IP.search(client)
    return f"{m.group(0)} (from clientId)" if m else ""


def write_csvs(findings: dict, out: "ReportFiles") -> List[str]:
    return _write_all_csvs(findings, out)[0]


def _write_all_csvs(findings: dict, out: "ReportFiles") -> Tuple[List[str], Dict[str, list]]:
    """Every CSV; returns the file names and, per finding list, the CSV lines of each finding (a list per
    finding: the lines its rows are on), for the report's links."""
    names, lines = [], {}
    rows = []
    for r in findings["inconsistent_subscriptions"]:
        variants = " | ".join(f"{', '.join(v['clients'])}: {_subs_text(v['subscriptions'])}" for v in r["variants"])
        rows.append([r["group"], r["start_ms"], r["end_ms"], utc(r["start_ms"]), utc(r["end_ms"]), r["duration_s"],
                     len(r["variants"]), variants])
    lines["inconsistent_subscriptions"] = [[n] for n in _write_csv(
        out, "inconsistent_subscriptions.csv",
        ["group", "start_ms", "end_ms", "start_utc", "end_utc", "duration_s", "n_variants", "variants"], rows)]
    names.append("inconsistent_subscriptions.csv")
    addrs = client_addresses(findings)
    diff_rows, diff_of = [], {}
    for s in _member_spans(findings):
        r = s["row"]
        first = len(diff_rows) + 2
        for v in s["deviating"]:
            for c in v["clients"]:
                for d in v["difference"]:
                    diff_rows.append([r.get("broker", ""), r["group"], utc(r["start_ms"]), utc(r["end_ms"]),
                                      r["duration_s"], c, address_of(addrs, r.get("broker", ""), c), d["topic"],
                                      "" if d["majority"] is None else d["majority"],
                                      "" if d["member"] is None else d["member"], " ".join(d["only_member_tags"]),
                                      " ".join(d["only_majority_tags"]), len(s["majority"]["clients"])])
        diff_of[s["index"]] = list(range(first, len(diff_rows) + 2))
    _write_csv(out, "subscription_differences.csv",
               ["broker", "group", "start_utc", "end_utc", "duration_s", "client_id", "address", "topic",
                "majority_expression", "member_expression", "tags_only_member", "tags_only_majority",
                "majority_members"], diff_rows)
    lines["subscription_differences"] = diff_of
    names.append("subscription_differences.csv")
    lines["flapping_clients"] = [[n] for n in _write_csv(
        out, "flapping_clients.csv",
        ["client_id", "groups", "reconnects", "max_reconnects_per_window", "flapping_windows",
         "first_reconnect_utc", "last_reconnect_utc"],
        [[r["client_id"], ";".join(r["groups"]), r["reconnects"], r["max_reconnects_per_window"],
          len(r["windows"]), utc(r["first_reconnect_ms"]), utc(r["last_reconnect_ms"])]
         for r in findings["flapping_clients"]])]
    _write_csv(out, "flapping_timeline.csv", ["client_id", "reconnect_ms", "reconnect_utc"],
               [[r["client_id"], t, utc(t)] for r in findings["flapping_clients"] for t in r["reconnect_ms"]])
    if any("connect_ms" in r for r in findings["flapping_clients"]):
        events = []
        for r in findings["flapping_clients"]:
            marks = [(t, "connect", "") for t in r.get("connect_ms") or []]
            marks += [(t, "close", how) for t, how in r.get("closes") or []]
            events += [[r.get("broker", ""), r["client_id"], kind, how, t, utc(t)] for t, kind, how in sorted(marks)]
        _write_csv(out, "flapping_connections.csv", ["broker", "client_id", "event", "how", "ms", "utc"], events)
    lines["heartbeat_gaps"] = [[n] for n in _write_csv(
        out, "heartbeat_gaps.csv", ["client_id", "groups", "start_ms", "end_ms", "start_utc", "end_utc", "gap_s"],
        [[r["client_id"], ";".join(r["groups"]), r["start_ms"], r["end_ms"], utc(r["start_ms"]),
          utc(r["end_ms"]), r["gap_s"]] for r in findings["heartbeat_gaps"]])]
    size_lines, n = [], 2
    for g in findings["group_sizes"]:
        size_lines.append(list(range(n, n + len(g["series"]))))
        n += len(g["series"])
    _write_csv(out, "group_sizes.csv", ["group", "role", "ms", "utc", "members"],
               [[g["group"], g["role"], ms, utc(ms), k] for g in findings["group_sizes"] for ms, k in g["series"]])
    lines["group_sizes"] = size_lines
    names += ["flapping_clients.csv", "flapping_timeline.csv"]
    if any("connect_ms" in r for r in findings["flapping_clients"]):
        names.append("flapping_connections.csv")
    names += ["heartbeat_gaps.csv", "group_sizes.csv"]
    lines["expired_clients"] = [[n] for n in _write_csv(
        out, "expired_clients.csv",
        ["broker", "client_id", "addr", "groups", "connected_utc", "silent_since_before_utc", "expired_utc",
         "returned_utc", "expired_ms", "cause"],
        [[r.get("broker", ""), r["client_id"], r["addr"], ";".join(r["groups"]), utc(r["connected_ms"]),
          utc(r["silent_since_before_ms"]), utc(r["expired_ms"]), utc(r["returned_ms"]), r["expired_ms"],
          expiry_cause(findings, r)]
         for r in findings.get("expired_clients", [])])]
    names.append("expired_clients.csv")
    if "vanished_clients" in findings:
        lines["vanished_clients"] = [[n] for n in _write_csv(
            out, "vanished_clients.csv",
            ["broker", "client_id", "addr", "groups", "connected_utc", "last_heartbeat_utc", "ended_utc", "ended_ms"],
            [[r.get("broker", ""), r["client_id"], r["addr"], ";".join(r["groups"]), utc(r["connected_ms"]),
              utc(r["last_heartbeat_ms"]), utc(r["ended_ms"]), r["ended_ms"]] for r in findings["vanished_clients"]])]
        names.append("vanished_clients.csv")
    if "broker_boots" in findings:
        _write_csv(out, "broker_restarts.csv",
                   ["broker", "stopped_utc", "start_utc", "ready_utc", "broker_name", "broker_addr", "members_ended",
                    "clients_ended", "seen"],
                   [[r["broker"], utc(r["stopped_ms"]), utc(r["start_ms"]), utc(r["ready_ms"]), r["name"] or "",
                     r["addr"] or "", r["members_ended"], r["clients_ended"], r.get("seen") or ""]
                    for r in findings["broker_boots"]])
        names.append("broker_restarts.csv")
    if "retry_topic_churn" in findings:
        lines["retry_topic_churn"] = [[n] for n in _write_csv(
            out, "retry_topic_churn.csv",
            ["broker", "group", "retry_topic", "adds", "changes", "removes", "max_per_window", "first_utc",
             "last_utc"],
            [[r["broker"], r["group"], r["retry_topic"], r["adds"], r["changes"], r["removes"],
              r["max_per_window"], utc(r["first_ms"]), utc(r["last_ms"])] for r in findings["retry_topic_churn"]])]
        names.append("retry_topic_churn.csv")
    log = findings.get("log")
    if log:
        _write_csv(out, "log_lines.csv", ["kind", "lines", "example"],
                   [[k, v, (log.get("examples") or {}).get(k, "")] for k, v in sorted(log.get("counts", {}).items())])
        names.append("log_lines.csv")
    return names, lines


# ---------------------------------------------------------------------------------------------------------------
# Which groups get a chart


def steady_range(g: dict, first_ms, last_ms, expiry_ms: int) -> Tuple[int, int]:
    """(fewest, most) live members of the group between the first expiry of the input (members of a running
    fleet showing up one heartbeat after another) and its end (every member's last interval running out)."""
    series = g["series"]
    if not series or first_ms is None or last_ms is None:
        return 0, 0
    t0 = first_ms + expiry_ms
    level = 0
    for t, n in series:
        if t > t0:
            break
        level = n
    values = {level} | {n for t, n in series if t0 < t <= last_ms}
    return min(values), max(values)


def size_range(g: dict, last_ms) -> Tuple[int, int]:
    """(fewest, most) live members of the group over the whole input, as its chart draws them: every change
    point up to the input's end (the summary states this range, so it agrees with the chart's peak)."""
    values = [n for t, n in g["series"] if last_ms is None or t <= last_ms]
    return (min(values), max(values)) if values else (0, 0)


def _steady_changed(g: dict, first_ms, last_ms, expiry_ms: int) -> bool:
    lo, hi = steady_range(g, first_ms, last_ms, expiry_ms)
    return lo != hi


def group_findings(findings: dict) -> Dict[Tuple[str, str], Dict[str, int]]:
    """{(broker, group): {finding kind: rows}} of the findings that name a group (the members' groups for the
    client findings)."""
    out: Dict[Tuple[str, str], Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in findings["inconsistent_subscriptions"]:
        kind = "subscription flips" if r.get("source") == "group_table" else "inconsistent subscriptions"
        out[(r.get("broker", ""), r["group"])][kind] += 1
    for key, kind in (("flapping_clients", "flapping members"), ("heartbeat_gaps", "heartbeat gaps"),
                      ("expired_clients", "expired members")):
        for r in findings.get(key) or []:
            for g in r["groups"]:
                out[(r.get("broker", ""), g)][kind] += 1
    for r in findings.get("retry_topic_churn") or []:
        out[(r.get("broker", ""), r["group"])]["retry-topic churn"] += 1
    return out


def chart_groups(findings: dict) -> Tuple[list, list]:
    """(groups to chart, every other group): the groups whose size changed or that have findings (those with
    findings first, then the largest change), at most MULTIPLES; each as (series dict, its findings,
    changed)."""
    s = findings["summary"]
    expiry_ms = int(float(findings["parameters"].get("expiry_s", 120)) * 1000)
    named = group_findings(findings)
    chosen, rest = [], []
    for g in findings["group_sizes"]:
        f = dict(named.get((g.get("broker", ""), g["group"])) or {})
        if g["group"] == CLIENT_INNER_PRODUCER:
            f = {}
        changed = _steady_changed(g, s.get("first_ms"), s.get("last_ms"), expiry_ms)
        (chosen if (changed or f) else rest).append((g, f, changed))
    chosen.sort(key=lambda c: (-sum(c[1].values()), -_swing(c[0]), c[0]["group"]))
    return chosen[:MULTIPLES], chosen[MULTIPLES:] + rest


def _swing(g: dict) -> int:
    ns = [n for _, n in g["series"][:-1]] or [0]
    return max(ns) - min(ns)


def _label(r: dict, name: str) -> str:
    return f"{r['broker']}: {name}" if r.get("broker") else name


def _plot_text(r: dict, name: str, limit: int = MAX_FIELD) -> str:
    """A plot's label of client data: control characters escaped (engine.logutil.escape_text), what XML cannot
    hold (a lone surrogate, U+FFFE, U+FFFF: the image would not load at all) as ``\\uXXXX``, at most ``limit``
    characters (a tooltip too: a 100 KB id would make the file as big as its input). Cut before it is
    XML-escaped, so no entity such as ``&lt;`` is cut in two."""
    text = _XML_BAD.sub(lambda m: f"\\u{ord(m.group()):04x}", escape_text(clip(_label(r, name), limit)))
    return clip(text, limit)


#: At most this many characters of a label shown in a plot (its tooltip holds up to MAX_FIELD).
PLOT_LABEL = 72


_XML_BAD = re.compile("[\ud800-\udfff\ufffe\uffff]")


# ---------------------------------------------------------------------------------------------------------------
# The plots as SVG files (for tickets and chats; the page draws its own charts). Drawn here, not by matplotlib:
# importing it alone cost 0.5-0.6 CPU-s, more than a small scan. Each file's size is bounded by its pixels, not by
# its input: at most 4 points per pixel column of a series and one mark per pixel of a client's row.

_PLOT_STYLE = ("<style>text{font:11px sans-serif;fill:#222}.t{font-size:13px}.s{font-size:10px}.ax{stroke:#444}"
               ".grid{stroke:#e4e4e4}.line{fill:none;stroke:#1f5fa8;stroke-width:1.2}.bar{fill:#c0504d}"
               ".conn{fill:#2e7d32}.close{fill:#c62828}.bound{fill:#fff;stroke:#c62828}.mark{stroke:#1f5fa8}</style>")


def _plot_svg(width: int, height: int, title: str, body: str) -> str:
    """A standalone SVG file (no script, no reference outside it); ``title`` is SVG text already."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{title}</title>{_PLOT_STYLE}'
            f'<rect width="{width}" height="{height}" fill="#fff"/>{body}</svg>')


def _nice_ticks(hi: float, n: int = 4, whole: bool = True) -> List[float]:
    """Round ticks from 0 to at least ``hi`` (1, 2 or 5 times a power of ten apart, whole numbers for counts),
    at most about n+1."""
    hi = max(hi, 1e-9)
    raw = max(hi / n, 1) if whole else hi / n
    p = 10 ** math.floor(math.log10(raw))
    step = next(m * p for m in (1, 2, 5, 10) if m * p >= raw)
    return [i * step for i in range(int(math.ceil(hi / step - 1e-9)) + 1)]


def _num(v: float) -> str:
    return f"{v:g}" if v == int(v) or abs(v) >= 1 else f"{v:.2g}"


def _y_axis(x: float, y0: float, y1: float, top: float, ticks: List[float]) -> str:
    """A value axis at ``x`` from y0 (value 0) up to y1 (value ``top``), with grid lines to the panel's right."""
    out = [f'<line x1="{x}" x2="{x}" y1="{y0}" y2="{y1}" class="ax"/>']
    for v in ticks:
        y = y0 - (y0 - y1) * v / top
        out.append(f'<text x="{x - 4}" y="{y + 4:.1f}" text-anchor="end" class="s">{_num(v)}</text>')
    return "".join(out)


def _time_ticks(axis: _Axis, y: float, n: int) -> str:
    out = [f'<line x1="{axis.x0:.1f}" x2="{axis.x1:.1f}" y1="{y}" y2="{y}" class="ax"/>']
    for x, text in axis.ticks(n):
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 3}" class="ax"/>'
                   f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle" class="s">{e(text)}</text>')
    return "".join(out)


def _step_path(points: List[Tuple[float, float]]) -> str:
    """An SVG path of a step series ((x, y) px, x ascending, each value held until the next x), with at most
    4 points per pixel column (its first, lowest, highest and last value)."""
    cols: List[list] = []
    for x, y in points:
        px = int(x)
        if cols and cols[-1][0] == px:
            c = cols[-1]
            c[3], c[4], c[5] = min(c[3], y), max(c[4], y), y
        else:
            cols.append([px, x, y, y, y, y])
    d, prev = [], None
    for px, x, first, lo, hi, last in cols:
        ys = [first] + [v for v in (lo, hi) if v not in (first, last)] + ([last] if last != first else [])
        if prev is not None:
            d.append(f"H{x:.1f}")
        for v in ys:
            d.append(f"M{x:.1f} {v:.1f}" if prev is None else f"V{v:.1f}")
            prev = v
    return "".join(d)


def _write_plot(out: "ReportFiles", name: str, svg: str) -> None:
    with out.open(name, "w") as f:
        f.write(svg)


def write_plots(findings: dict, out: "ReportFiles") -> List[str]:
    names = [_group_sizes_plot(findings, out)]
    if "heartbeat_gaps" not in (findings.get("unsupported") or {}):
        names.append(_gap_histogram(findings, out))
    return names + [_flapping_plot(findings, out)]


def _group_sizes_plot(findings: dict, out: "ReportFiles") -> str:
    """Small multiples, three a row, of the live members of the groups that changed size or have findings."""
    charted = chart_groups(findings)[0][:PLOT_GROUPS]
    s = findings["summary"]
    first, last = s.get("first_ms"), s.get("last_ms")
    cols, pw, ph, top = 3, 400, 170, 34
    rows = max(1, math.ceil(len(charted) / cols))
    width, height = cols * pw, top + rows * ph
    title = "Live members of the groups that changed size or have findings (*), UTC"
    body = [f'<text x="{width / 2}" y="20" text-anchor="middle" class="t">{title}</text>']
    if not charted:
        body.append(f'<text x="{width / 2}" y="{top + ph / 2}" text-anchor="middle">no group changed size or has '
                    "findings</text>")
    for i, (g, f, _) in enumerate(charted):
        ox, oy = (i % cols) * pw, top + (i // cols) * ph
        x0, x1, y0, y1 = ox + 44, ox + pw - 14, oy + ph - 28, oy + 22
        series = [(t, n) for t, n in g["series"] if last is None or t <= last]
        axis = _Axis(first if first is not None else (series[0][0] if series else None),
                     last if last is not None else (series[-1][0] if series else None), x0, x1)
        peak = max([n for _, n in series] or [1])
        ticks = _nice_ticks(max(peak, 1), 3)
        ytop = ticks[-1]
        name, star = f"{g['group']} ({g['role']})", " *" if f else ""
        tip = e(_plot_text(g, name) + star)
        body.append(f'<text x="{(x0 + x1) / 2}" y="{oy + 14}" text-anchor="middle" class="s"><title>{tip}</title>'
                    f"{e(_plot_text(g, name, PLOT_LABEL) + star)}</text>")
        body.append(_y_axis(x0, y0, y1, ytop, ticks) + _time_ticks(axis, y0, 4))
        if series:
            pts = [(axis.x(t), y0 - (y0 - y1) * n / ytop) for t, n in series]
            pts.append((x1, pts[-1][1]))  # the last value holds to the end of the input
            body.append(f'<path d="{_step_path(pts)}" class="line"><title>{tip}</title></path>')
    _write_plot(out, "group_sizes.svg", _plot_svg(width, height, title, "".join(body)))
    return "group_sizes.svg"


def _gap_histogram(findings: dict, out: "ReportFiles") -> str:
    gaps = [r["gap_s"] / 60 for r in findings["heartbeat_gaps"]]
    drawn = [g for g in gaps if math.isfinite(g)]  # an inf or NaN gap (crafted findings) has no bin: named, not drawn
    width, height, x0, x1, y0, y1 = 720, 400, 56, 700, 350, 40
    title = f"Heartbeat gaps over {findings['parameters']['gap_threshold_s']:g} s ({len(gaps)})"
    if len(drawn) < len(gaps):
        title += f", {len(gaps) - len(drawn)} not finite, not drawn"
    gaps = drawn
    body = [f'<text x="{width / 2}" y="22" text-anchor="middle" class="t">{e(title)}</text>',
            f'<text x="{(x0 + x1) / 2}" y="{height - 8}" text-anchor="middle">gap (minutes)</text>',
            f'<text x="14" y="{(y0 + y1) / 2}" text-anchor="middle" transform="rotate(-90 14 {(y0 + y1) / 2})">'
            "gaps</text>"]
    if not gaps:
        body.append(f'<text x="{(x0 + x1) / 2}" y="{(y0 + y1) / 2}" text-anchor="middle">no heartbeat gaps over the '
                    "threshold</text>")
        body.append(f'<line x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}" class="ax"/>')
    else:
        bins = min(40, max(5, len(gaps)))
        lo, hi = min(gaps), max(gaps)
        if hi <= lo:  # one value: a bin around it (wide enough to be a different float far from 0, too)
            pad = max(0.5, abs(lo) * 1e-9)
            lo, hi = lo - pad, hi + pad
        wbin = (hi - lo) / bins
        counts = [0] * bins
        for g in gaps:
            counts[min(bins - 1, int((g - lo) / wbin))] += 1
        ticks = _nice_ticks(max(counts), 4)
        ytop = ticks[-1]
        sx = (x1 - x0) / (hi - lo)
        for i, c in enumerate(counts):
            if c:
                a = lo + i * wbin
                h = (y0 - y1) * c / ytop
                body.append(f'<rect x="{x0 + (a - lo) * sx:.1f}" y="{y0 - h:.1f}" width="{wbin * sx:.1f}" '
                            f'height="{h:.1f}" class="bar"><title>{c} gap(s) of {_num(a)} to {_num(a + wbin)} '
                            "minutes</title></rect>")
        body.append(_y_axis(x0, y0, y1, ytop, ticks))
        body.append(f'<line x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}" class="ax"/>')
        span = hi - lo
        step = _nice_ticks(span, 6, whole=False)
        step = step[1] if len(step) > 1 else span
        first = math.ceil(lo / step)
        # by index, not by adding up: a step below the float spacing at a large value would never move v on
        for k in range(min(12, max(0, math.floor(hi / step + 1e-9) - first + 1))):
            v = (first + k) * step
            x = x0 + (v - lo) * sx
            if not x0 - 1 <= x <= x1 + 1:  # rounded out of the axis
                continue
            body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y0 + 3}" class="ax"/>'
                        f'<text x="{x:.1f}" y="{y0 + 15}" text-anchor="middle" class="s">{_num(round(v, 10))}</text>')
    _write_plot(out, "gap_histogram.svg", _plot_svg(width, height, e(title), "".join(body)))
    return "gap_histogram.svg"


def _flapping_plot(findings: dict, out: "ReportFiles") -> str:
    """One row per flapping client (the most reconnects first): its connects and closes, or its reconnects."""
    flapping = sorted(findings["flapping_clients"], key=lambda r: -r["reconnects"])[:PLOT_CLIENTS]
    marked = any("connect_ms" in r for r in flapping)
    texts = [(_plot_text(r, r["client_id"]), _plot_text(r, r["client_id"], PLOT_LABEL)) for r in flapping]
    left = min(420, 16 + 6 * max([len(t) for _, t in texts] or [10]))
    width, top, row = left + 720, 48, 22
    height = top + max(1, len(flapping)) * row + 40
    s = findings["summary"]
    axis = _Axis(s.get("first_ms"), s.get("last_ms"), left, width - 20)
    title = "Connects and closes of flapping clients" if marked else "Reconnects of flapping clients"
    body = [f'<text x="10" y="20" class="t">{title}, UTC</text>']
    if marked:
        body.append(f'<g transform="translate({width - 470} 16)" ><path d="M0 7l4-7 4 7z" class="conn"/>'
                    '<text x="12" y="7" class="s">connect</text><rect x="70" y="0" width="7" height="7" '
                    'class="close"/><text x="82" y="7" class="s">close</text><rect x="130" y="0" width="7" '
                    'height="7" class="bound"/><text x="142" y="7" class="s">last heartbeat before a close</text></g>')
    if not flapping:
        body.append(f'<text x="{(left + width) / 2}" y="{top + 14}" text-anchor="middle">no flapping clients</text>')

    def xs(times) -> List[float]:  # one mark per pixel: a row's size is bounded by the width
        seen, outx = set(), []
        for t in times:
            x = round(axis.x(t))
            if x not in seen:
                seen.add(x)
                outx.append(x)
        return outx

    for i, (r, (text, shown)) in enumerate(zip(flapping, texts)):
        y = top + i * row + row / 2
        body.append(f'<line x1="{left}" x2="{width - 20}" y1="{y}" y2="{y}" class="grid"/>'
                    f'<text x="{left - 6}" y="{y + 4}" text-anchor="end" class="s"><title>{e(text)}</title>'
                    f"{e(shown)}</text>")
        if "connect_ms" in r:
            body += [f'<path d="M{x - 4} {y - 0.5}l4-7 4 7z" class="conn"/>' for x in xs(r["connect_ms"])]
            closes = r.get("closes") or []
            body += [f'<rect x="{x - 3}" y="{y + 1}" width="6" height="6" class="close"/>'
                     for x in xs(t for t, how in closes if how != "last_heartbeat")]
            body += [f'<rect x="{x - 3}" y="{y + 1}" width="6" height="6" class="bound"/>'
                     for x in xs(t for t, how in closes if how == "last_heartbeat")]
        else:
            body += [f'<line x1="{x}" x2="{x}" y1="{y - 7}" y2="{y + 7}" class="mark"/>' for x in xs(r["reconnect_ms"])]
    body.append(_time_ticks(axis, top + max(1, len(flapping)) * row + 4, 6))
    _write_plot(out, "flapping_timeline.svg", _plot_svg(width, height, title, "".join(body)))
    return "flapping_timeline.svg"


# ---------------------------------------------------------------------------------------------------------------
# HTML pieces

e = html.escape


class Raw:
    """A table cell of ready HTML, sorted by ``key`` (its text when None)."""

    def __init__(self, markup: str, key=None):
        self.markup, self.key = markup, key


def _cell(c) -> str:
    if isinstance(c, Raw):
        key = "" if c.key is None else f" data-v='{e(str(c.key))}'"
        return f"<td{key}>{c.markup}</td>"
    if isinstance(c, bool) or c is None:
        return f"<td>{e(str(c if c is not None else ''))}</td>"
    if isinstance(c, (int, float)):
        return f"<td class=num data-v='{c}'>{e(str(c))}</td>"
    return f"<td>{e(str(c))}</td>"


def _table(header, rows, limit=TABLE_ROWS, *, id=None, csv_name=None, cls="sortable") -> str:
    """A sortable table (click a column's header) of at most ``limit`` rows, the rest named with its CSV."""
    if not rows:
        return "<p class=none>none</p>"
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows[:limit])
    more = ""
    if len(rows) > limit:
        where = f"<a href='{e(csv_name)}'>{e(csv_name)}</a>" if csv_name else "the CSV"
        more = f"<p class=more>{len(rows) - limit} more rows in {where}</p>"
    ident = f" id={id}" if id else ""
    return f"<table class='{cls}'{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _csv_link(name: str, lines) -> Raw:
    """A link to a finding's rows in a CSV file: the file, and the lines its rows are on (line 1 = header)."""
    lines = list(lines or [])
    if not lines:
        return Raw(f"<a class=csv href='{e(name)}'>{e(name)}</a>", 0)
    where = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}&ndash;{lines[-1]}"
    return Raw(f"<a class=csv href='{e(name)}' title='{e(name)}: {where} (line 1 is the header)'>{e(name)}</a> "
               f"<span class=lines>{where}</span>", lines[0])


def _dur(seconds) -> str:
    s = float(seconds or 0)
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s" if s < 600 else f"{s / 60:.0f} min"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def _n(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _short(ms) -> str:
    return utc(ms)[:16] if ms is not None else "?"


def _cid(client: str, broker: str = "") -> str:
    return f"<span class=cid>{e(client)}</span>" + (f" <span class=broker>{e(broker)}</span>" if broker else "")


class _Axis:
    """A UTC time axis from t0 to t1 (ms) drawn from x0 to x1 (px), with ticks at round times."""

    STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
             172800, 604800]

    def __init__(self, t0, t1, x0: float, x1: float):
        t0 = 0 if t0 is None else t0
        t1 = t0 + 1000 if t1 is None or t1 <= t0 else t1
        self.t0, self.t1, self.x0, self.x1 = t0, t1, x0, x1

    def x(self, t) -> float:
        t = min(max(t, self.t0), self.t1)
        return self.x0 + (t - self.t0) * (self.x1 - self.x0) / (self.t1 - self.t0)

    def ticks(self, n: int = 5) -> List[Tuple[float, str]]:
        span_s = (self.t1 - self.t0) / 1000
        step = next((s for s in self.STEPS if span_s / s <= n), self.STEPS[-1]) * 1000
        if span_s * 1000 / step > n:  # a span of years: whole weeks, still at most n ticks
            step = math.ceil(span_s / n / self.STEPS[-1]) * self.STEPS[-1] * 1000
        fmt = "%H:%M:%S" if step < 60_000 else ("%m-%d" if step >= 86_400_000 else "%H:%M")
        if fmt == "%H:%M" and span_s > 86400:
            fmt = "%m-%d %H:%M"
        if span_s > 366 * 86400:
            fmt = "%Y-%m-%d"
        out = []
        t = math.ceil(self.t0 / step) * step
        while t <= self.t1:
            out.append((self.x(t), _strftime(t, fmt)))
            t += step
        return out


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (f"<svg class=strip width={width} height={height} viewBox='0 0 {width} {height}' role=img "
            f"aria-label='{e(label)}'><title>{e(label)}</title>{body}</svg>")


def _ticks_svg(axis: _Axis, y: float, n: int = 5) -> str:
    out = [f"<line x1={axis.x0:.1f} x2={axis.x1:.1f} y1={y} y2={y} class=ax />"]
    for x, text in axis.ticks(n):
        out.append(f"<line x1={x:.1f} x2={x:.1f} y1={y} y2={y + 3} class=ax /><text x={x:.1f} y={y + 12} "
                   f"class=tick>{e(text)}</text>")
    return "".join(out)


def _bar(axis: _Axis, a, b, y, h, cls, title) -> str:
    x0, x1 = axis.x(a), axis.x(b)
    return (f"<rect x={x0:.1f} y={y} width={max(2.0, x1 - x0):.1f} height={h} class={cls}>"
            f"<title>{e(title)}</title></rect>")


def _span_strip(t0, t1, a, b, label) -> str:
    """The whole input's time axis with one span marked on it."""
    w = 420
    axis = _Axis(t0, t1, 4, w - 4)
    body = (f"<rect x=4 y=3 width={w - 8} height=12 class=bg />"
            + _bar(axis, a, b, 3, 12, "bad", f"{utc(a)} to {utc(b)} UTC") + _ticks_svg(axis, 17))
    return _svg(w, 32, body, label)


#: How a close mark was found, in words (the flapping rows' ``closes``: [ms, how]).
CLOSE_HOW = {"last_heartbeat": "closed after this, its last heartbeat (the client went on on another connection)",
             "closed": "channel closed (NETTY EVENT)", "unregister": "unregistered (UNREGISTER_CLIENT)",
             "expired": "expired (the broker's SCAN)",
             "broker_restart": "ended by the broker's restart (its host died: no close on the wire)"}


#: What ended a silent client (expired_clients' ``cause``), in the report's words.
EXPIRY_CAUSES = {"scan": "removed by the broker's SCAN",
                 "idle_closed": "closed idle by the broker (Netty idle handler)",
                 "inferred": "inferred: last heartbeat + the expiry, no close seen"}


#: What a recording (heartbeats only) cannot tell, named in its report.
RECORDING_CANNOT = {
    "vanished_clients": "a recording holds heartbeats only, no connection ends nor UNREGISTER_CLIENT: a client "
                        "killed or cut off is listed as an expired client (cause inferred), as is one that shut down "
                        "cleanly",
    "broker_restarts": "a recording holds no broker stop or start: members count as live across a restart until "
                       "their expiry"}
#: What a capture cannot show (a log shows these: a log with its capture scanned together has them).
CAPTURE_CANNOT = {
    "expired_clients (SCAN)": "the broker's channel-expiry SCAN sends nothing on the wire: a client silent with its "
                              "connection open is listed at its last heartbeat + the expiry (cause inferred); only "
                              "an idle close (the broker's FIN / RST) is seen",
    "broker_restarts": "seen as the broker ending every open connection within 2 s (RESTART_WINDOW_MS), or, when "
                       "its host died without closing them, as their going silent with new connections after and "
                       "none surviving; a broker that died and was not back while the capture ran shows no "
                       "restart: its clients' silences are expiries (cause inferred)"}
#: What a broker log cannot show besides heartbeat gaps (its ``unsupported``).
LOG_CANNOT = {
    "lines the broker did not write": "a broker under load drops INFO lines (logback's async appender): a member "
                                      "whose close or unregister line is missing stays live until the broker's next "
                                      "start (group sizes run high); one whose register line is missing is left out "
                                      "(its later lines are the unattributed events)"}
#: What heartbeats alone (a recording, a capture) cannot show.
HEARTBEATS_CANNOT = {
    "retry_topic_churn": "heartbeats carry each member's subscriptions, not the broker's subscription table: a member "
                         "without the group's %RETRY% subscription (e.g. BROADCASTING in a CLUSTERING group) is "
                         "listed under inconsistent subscriptions instead"}


def expiry_cause(findings: dict, r: dict) -> str:
    """An expiry's cause: its own, else a log's SCAN line or a recording's / capture's inference."""
    return r.get("cause") or ("scan" if findings.get("log") else "inferred")


def close_how(how: str) -> str:
    if how in CLOSE_HOW:
        return CLOSE_HOW[how]
    kind, _, by = how.partition("_by_")  # a capture's fin_by_client, rst_by_server, ...
    return f"{kind.upper()} sent by the {by}" if by else how


def _connect_mark(x: float, title: str, cls: str = "connect") -> str:
    """A connect: a stem with a triangle on top."""
    return (f"<path class='{cls}' d='M{x:.1f},18V6M{x - 4:.1f},1H{x + 4:.1f}L{x:.1f},6Z'>"
            f"<title>{e(title)}</title></path>")


def _close_mark(x: float, title: str, bound: bool) -> str:
    """A close: a stem with a square at its foot; hollow and dashed when only bounded by a last heartbeat."""
    return (f"<path class='{'closeby' if bound else 'close'}' d='M{x:.1f},3V14M{x - 3:.1f},14h6v6h-6Z'>"
            f"<title>{e(title)}</title></path>")


def _reconnect_strip(r: dict, window_ms: int) -> str:
    """The client's connects and closes (``connect_ms``, ``closes``; findings without them: one mark per reconnect)
    on its own time axis around its reconnects, its flapping windows shaded. A mark before or after the axis (the
    client's first connection, a capture's last FIN) sits at its edge, its time in its title."""
    times = r["reconnect_ms"]
    connects, closes = r.get("connect_ms"), r.get("closes")
    marked = connects is not None and closes is not None
    near = list(times) + ([c for c, _ in closes] if marked else [])
    a, b = min(near), max(near)
    pad = max((b - a) // 12, 60_000)
    w = 360
    axis = _Axis(a - pad, b + pad, 6, w - 6)
    body = [f"<rect x=6 y=3 width={w - 12} height=14 class=bg />"]
    for start, n in r.get("windows") or []:
        body.append(_bar(axis, start, start + window_ms, 3, 14, "win",
                         f"{n} reconnects in the window from {utc(start)} UTC"))

    def where(t):
        return "" if axis.t0 <= t <= axis.t1 else (" (before this axis)" if t < axis.t0 else " (after this axis)")

    if marked:
        for t in connects:
            body.append(_connect_mark(axis.x(t), f"connect {utc(t)} UTC{where(t)}"))
        for t, how in closes:
            body.append(_close_mark(axis.x(t), f"{close_how(how)}: {utc(t)} UTC{where(t)}",
                                    how == "last_heartbeat"))
        label = (f"{len(connects)} connects and {len(closes)} closes of {r['client_id']}, {len(times)} reconnects "
                 f"from {utc(a)} to {utc(b)} UTC")
    else:
        for t in times:
            x = axis.x(t)
            body.append(f"<line x1={x:.1f} x2={x:.1f} y1=2 y2=18 class=mark><title>{e(utc(t))} UTC</title></line>")
        label = f"{len(times)} reconnects of {r['client_id']}, {utc(a)} to {utc(b)} UTC"
    body.append(_ticks_svg(axis, 21, 4))
    return _svg(w, 36, "".join(body), label)


def _legend_svg(mark: str) -> str:
    return f"<svg class=legend width=12 height=21 viewBox='0 0 12 21' aria-hidden=true>{mark}</svg>"


# ---------------------------------------------------------------------------------------------------------------
# Banner and summary


def unattributed_reason(log: dict) -> str:
    """Why close / unregister lines had no live member, from the evidence: their member never registered in the
    log (an older file is missing -- unless that broker's log starts at a boot: then the broker did not write
    the register lines, as logback's AsyncAppender drops INFO lines when its queue is full), or it had left."""
    why = log.get("unattributed_reasons") or {}
    if not why:
        return " (older log files missing?)"
    parts = []
    if why.get("never_registered"):
        at_boot = log.get("starts_at_boot") or {}
        per = log.get("never_registered_by_broker")
        if per is None:  # findings without the per-broker counts: every broker's log starts at a boot, or not
            dropped = why["never_registered"] if at_boot and all(at_boot.values()) else 0
        else:
            dropped = sum(n for b, n in per.items() if at_boot.get(b))
        if dropped:
            parts.append(f"{dropped:,} for members whose register line the broker never wrote "
                         "(the log starts at a boot; logback's async appender drops INFO lines under load)")
        if why["never_registered"] - dropped:
            parts.append(f"{why['never_registered'] - dropped:,} for members never seen registering (older log "
                         "files missing?)")
    if why.get("not_live"):
        parts.append(f"{why['not_live']:,} for members that had left already (lines repeated)")
    return ": " + "; ".join(parts)


def _banner(findings: dict) -> str:
    """DAMAGED INPUT (red) when records were lost; PARTLY UNREADABLE (amber) when some input could not be used
    (undecodable bodies, unparsed log lines, capture files that broke); nothing when the input was read whole."""
    s = findings["summary"]
    log, cap = findings.get("log"), findings.get("capture")
    warn = []
    if log:
        if log.get("unparseable"):
            kinds = log.get("unparseable_by_kind") or {}
            warn.append(f"{log['unparseable']:,} of {log['lines']:,} log lines could not be parsed"
                        + (f" ({', '.join(f'{k} {v:,}' for k, v in sorted(kinds.items()))})" if kinds else "")
                        + ": see Broker logs read")
        un = log.get("unattributed_events") or {}
        if un:
            warn.append(f"{sum(un.values()):,} events could not be attached to a live member"
                        + unattributed_reason(log))
    elif s.get("bad_bodies"):
        warn.append(f"{s['bad_bodies']:,} of {s['records']:,} heartbeat bodies could not be decoded (left out)")
    if cap:
        st = cap.get("stats") or {}
        if cap.get("damaged_files"):
            warn.append(f"{len(cap['damaged_files'])} capture file(s) broke off: "
                        + ", ".join(str(d.get("file", d)) for d in cap["damaged_files"][:5]))
        bad = {k: st.get(k, 0) for k in ("truncated_packets", "malformed_packets", "frames_bad", "frames_cut")
               if st.get(k)}
        if bad:
            warn.append("capture: " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in bad.items()))
    coverage = coverage_lines(findings)
    line = damage_line(findings)
    if line is None and not warn and not coverage:
        return ""
    parts = [f"<div id=banner class='banner {'damaged' if line else 'partial'}' role=alert>"]
    if line:
        parts.append(f"<p><b>{e(line)}</b></p>")
    if warn:
        parts.append("<p><b>PARTLY UNREADABLE INPUT:</b> " + e("; ".join(warn)) + ".</p>")
    if coverage:
        parts.append("<p><b>CAPTURE COVERAGE:</b> " + e("; ".join(coverage)) + ".</p>")
    scan = findings.get("scan") or {}
    rows = [[d.get("broker", "") + (" " if d.get("broker") else "") + str(d["kind"]), d["segment"], d["offset"],
             d["bytes"], utc(d["first_ms"]) if d.get("first_ms") else "?",
             utc(d["last_ms"]) if d.get("last_ms") else "?",
             "?" if d.get("records_lost") is None else d["records_lost"], d["reason"]]
            for d in (scan.get("corrupt") or []) + (scan.get("torn_tails") or [])]
    rows += [["data loss", d["segment"], d["offset"], 40, utc(d["first_ms"]), utc(d["last_ms"]), d["records_lost"],
              d["reason"]] for d in scan.get("data_loss") or []]
    if rows:
        parts.append(_table(["kind", "segment", "byte", "bytes", "from (UTC)", "to (UTC)", "records lost", "reason"],
                            rows, limit=20))
    parts.append("</div>")
    return "".join(parts)


def _summary(findings: dict, lines: dict) -> str:
    """One line per finding kind: how many, the worst case, where its rows are."""
    unsupported = findings.get("unsupported") or {}
    rows = []

    def add(kind, anchor, count, worst, csv_name):
        link = f"<a href='{e(csv_name)}'>{e(csv_name)}</a>" if csv_name else ""
        cls = "zero" if count == 0 else "hit"
        rows.append(f"<tr class={cls}><th scope=row><a href='#{anchor}'>{e(kind)}</a></th>"
                    f"<td class=num>{count:,}</td><td>{worst}</td><td>{link}</td></tr>")

    spans = _member_spans(findings)
    if spans:
        w = max(spans, key=lambda s: (s["row"]["duration_s"], s["row"]["group"]))
        r = w["row"]
        dev = [c for v in w["deviating"] for c in v["clients"]]
        diff = next((d for v in w["deviating"] for d in v["difference"]), None)
        worst = (f"<b>{e(_label(r, r['group']))}</b>: {_n(len(dev), 'member')} ({e(', '.join(dev[:2]))}"
                 f"{' ...' if len(dev) > 2 else ''}) "
                 f"{'split evenly' if w['tie'] else 'differ' + ('s' if len(dev) == 1 else '')} from "
                 f"{len(w['majority']['clients'])} for {_dur(r['duration_s'])} from {e(_short(r['start_ms']))} UTC"
                 + (f"; {e(_difference_text(diff))}" if diff else ""))
    else:
        worst = "none: every group's members held one subscription set"
    add("Inconsistent subscriptions", "inconsistent", len(spans), worst, "subscription_differences.csv")
    flips = [r for r in findings["inconsistent_subscriptions"] if r.get("source") == "group_table"]
    if findings.get("log"):
        w = max(flips, key=lambda r: r.get("flips", 0)) if flips else None
        add("Subscription flips", "flips", len(flips),
            f"<b>{e(_label(w, w['group']))}</b> {e(str(w.get('topic', '')))}: {w.get('flips')} flips, "
            f"{e(_short(w['start_ms']))} to {e(_short(w['end_ms']))} UTC" if w else "none",
            "inconsistent_subscriptions.csv")
    fl = findings["flapping_clients"]
    if fl:
        w = max(fl, key=lambda r: (r["reconnects"], r["max_reconnects_per_window"]))
        worst = (f"<b>{e(_label(w, w['client_id']))}</b> ({e(', '.join(w['groups']))}): {w['reconnects']} reconnects, "
                 f"up to {w['max_reconnects_per_window']} per {findings['parameters']['flap_window_s']:g} s, "
                 f"{e(_short(w['first_reconnect_ms']))} to {e(_short(w['last_reconnect_ms']))} UTC")
    else:
        worst = "none"
    add("Flapping clients", "flapping", len(fl), worst, "flapping_clients.csv")
    if "heartbeat_gaps" in unsupported:
        rows.append("<tr class=na><th scope=row><a href='#gaps'>Heartbeat gaps</a></th><td>&ndash;</td>"
                    f"<td>not visible in this input: {e(unsupported['heartbeat_gaps'])}</td><td></td></tr>")
    else:
        gaps = findings["heartbeat_gaps"]
        if gaps:
            w = max(gaps, key=lambda r: r["gap_s"])
            worst = (f"<b>{e(_label(w, w['client_id']))}</b> ({e(', '.join(w['groups']))}) silent "
                     f"{_dur(w['gap_s'])} from {e(_short(w['start_ms']))} UTC")
        else:
            worst = "none"
        hidden = silences_over_data_loss(findings)
        if hidden:
            n = len({(r.get("broker"), r["client_id"]) for k in ("gaps_over_data_loss", "expired_over_data_loss")
                     for r in findings.get(k) or []})
            worst += (f"; <a href='#silences-lost'>{_n(n, 'client')} silent over {_n(len(hidden), 'lost range')}"
                      "</a> (not counted)")
        add("Heartbeat gaps", "gaps", len(gaps), worst, "heartbeat_gaps.csv")
    ex = findings.get("expired_clients") or []
    if ex:
        gone = [r for r in ex if r.get("returned_ms") is None]
        w = min(gone, key=lambda r: r["expired_ms"]) if gone else max(
            ex, key=lambda r: ((r.get("returned_ms") or 0) - r["silent_since_before_ms"]))
        worst = (f"{len(gone)} did not come back; the first: " if gone else "every one came back; the longest "
                 "away: ") + (
            f"<b>{e(_label(w, w['client_id']))}</b> ({e(', '.join(w['groups']))}) expired "
            f"{e(_short(w['expired_ms']))} UTC"
            + ("" if w.get("returned_ms") is None else
               f", back after {_dur((w['returned_ms'] - w['silent_since_before_ms']) / 1000)}"))
    else:
        worst = "none"
    add("Expired clients", "expired", len(ex), worst, "expired_clients.csv")
    if "vanished_clients" in findings:
        va = findings["vanished_clients"]
        w = va[0] if va else None
        add("Vanished clients", "vanished", len(va),
            f"the first: <b>{e(_label(w, w['client_id']))}</b> ({e(', '.join(w['groups']))}) gone "
            f"{e(_short(w['ended_ms']))} UTC without unregistering" if w else "none", "vanished_clients.csv")
    if "retry_topic_churn" in findings:
        ch = findings["retry_topic_churn"]
        w = max(ch, key=lambda r: (r["max_per_window"], r["adds"] + r["changes"] + r["removes"])) if ch else None
        add("Retry-topic churn", "churn", len(ch),
            f"<b>{e(_label(w, w['group']))}</b>: {w['adds']} adds, {w['changes']} changes, {w['removes']} removes, "
            f"up to {w['max_per_window']} per window" if w else "none", "retry_topic_churn.csv")
    charted, rest = chart_groups(findings)
    changed = [c for c in charted + rest if c[2]]
    ranges = {id(c[0]): size_range(c[0], findings["summary"].get("last_ms")) for c in changed}
    # the largest change, preferring a group that is not the fleet-wide inner producer and whose changes are not
    # around lost data (members seem to leave and rejoin there)
    around = [c for c in changed if c[0].get("changes_over_data_loss")]
    groups = ([c for c in changed if c[0]["group"] != CLIENT_INNER_PRODUCER and c not in around]
              or [c for c in changed if c[0]["group"] != CLIENT_INNER_PRODUCER] or changed)
    if changed:
        g = max(groups, key=lambda c: (ranges[id(c[0])][1] - ranges[id(c[0])][0], c[0]["group"]))[0]
        lo, hi = ranges[id(g)]
        worst = (f"{len(changed)} changed size"
                 + (f" ({len(around)} with changes around lost data, not necessarily real)" if around else "")
                 + f"; the largest change: <b>{e(_label(g, g['group']))}</b> ({e(g['role'])}) between {lo} and "
                 f"{hi} live members")
    else:
        worst = "no group changed size"
    noted = sum(1 for c in charted + rest if c[1] or c[2])
    worst += (f"; {len(charted)} charted" + (f" (of {noted} changed or with findings: at most {MULTIPLES})"
                                              if noted > len(charted) else "")
              + f", {len(rest)} in the collapsed table")
    rows.append(f"<tr class=info><th scope=row><a href='#sizes'>Group sizes</a></th>"
                f"<td class=num>{len(findings['group_sizes']):,}</td><td>{worst}</td>"
                "<td><a href='group_sizes.csv'>group_sizes.csv</a></td></tr>")
    return ("<section id=summary><h2>Summary</h2><table class=summary><thead><tr><th>finding</th><th>count</th>"
            "<th>worst case</th><th>rows</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")


# ---------------------------------------------------------------------------------------------------------------
# Finding sections


def _inconsistent_section(findings: dict, lines: dict) -> List[str]:
    s = findings["summary"]
    t0, t1 = s.get("first_ms"), s.get("last_ms")
    addrs = client_addresses(findings)
    spans = _member_spans(findings)
    parts = ["<section id=inconsistent><h2>Inconsistent subscriptions</h2><p>Consumer groups whose live members "
             "held different subscription sets (subVersion ignored): per group the majority's set and what each "
             "deviating member subscribes differently, on the input's time axis. Every row: "
             "<a href='subscription_differences.csv'>subscription_differences.csv</a> (one line per member and "
             "topic), <a href='inconsistent_subscriptions.csv'>inconsistent_subscriptions.csv</a>.</p>"]
    if not spans:
        parts.append("<p class=none>none</p>")
    for k, sp in enumerate(sorted(spans, key=lambda x: -x["row"]["duration_s"])[:CARDS]):
        r, maj = sp["row"], sp["majority"]
        broker = r.get("broker", "")
        dev = [c for v in sp["deviating"] for c in v["clients"]]
        head = (f"{_n(len(dev), 'member')} differ{'s' if len(dev) == 1 else ''} from the {len(maj['clients'])} "
                "holding the majority set"
                if not sp["tie"] else
                f"no majority: {len(maj['clients'])} members on the first set, as many on another")
        link = _csv_link("subscription_differences.csv", lines.get("subscription_differences", {}).get(sp["index"]))
        parts.append(
            f"<article class=card id=inc-{k} data-group='{e(r['group'])}'><h3>{e(r['group'])}"
            + (f" <span class=broker>on {e(broker)}</span>" if broker else "") + "</h3>"
            f"<p><b>{e(head)}</b> for <b>{_dur(r['duration_s'])}</b>: {e(utc(r['start_ms']))} to "
            f"{e(utc(r['end_ms']))} UTC. {link.markup}</p>"
            + _span_strip(t0, t1, r["start_ms"], r["end_ms"], f"{r['group']}: {utc(r['start_ms'])} to "
                          f"{utc(r['end_ms'])} UTC")
            + "<p class=majority>Majority set: " + " ".join(
                f"<code>{e(t)} [{e(_expression(et, x))}]</code>" for t, et, x in maj["subscriptions"]) + "</p>")
        for v in sp["deviating"]:
            diff_rows = []
            for d in v["difference"]:
                diff_rows.append([d["topic"], d["majority"] if d["majority"] is not None else "(not subscribed)",
                                  d["member"] if d["member"] is not None else "(not subscribed)",
                                  " ".join(d["only_member_tags"]) or ("whole topic" if d["majority"] is None else ""),
                                  " ".join(d["only_majority_tags"]) or ("whole topic" if d["member"] is None else "")])
            members = [[Raw(_cid(c)), address_of(addrs, broker, c),
                        "also held the majority set in this span" if c in v["switched"] else ""]
                       for c in v["clients"]]
            parts.append(
                f"<div class=variant><p>{_n(len(v['clients']), 'deviating member')}:</p>"
                + _table(["clientId", "address", "note"], members, limit=30, cls="members")
                + "<p>Their difference from the majority:</p>"
                + _table(["topic", "majority's expression", "their expression", "only they have",
                          "only the majority has"], diff_rows, cls="diff") + "</div>")
        parts.append(f"<details><summary>The {len(maj['clients'])} majority members</summary><p>"
                     + ", ".join(_cid(c) for c in maj["clients"][:200])
                     + (" ..." if len(maj["clients"]) > 200 else "") + "</p></details></article>")
    if len(spans) > CARDS:
        parts.append(f"<p class=more>{len(spans) - CARDS} more in subscription_differences.csv</p>")
    parts.append("</section>")
    return parts


def _flapping_section(findings: dict, lines: dict, multi: bool) -> List[str]:
    p = findings["parameters"]
    window_ms = int(float(p["flap_window_s"]) * 1000)
    fl = sorted(enumerate(findings["flapping_clients"]), key=lambda ir: -ir[1]["reconnects"])
    rows = []
    for i, r in fl:
        rows.append(([r.get("broker", "")] if multi else []) + [
            Raw(_cid(r["client_id"]), r["client_id"]), ", ".join(r["groups"]), r["reconnects"],
            r["max_reconnects_per_window"], utc(r["first_reconnect_ms"]), utc(r["last_reconnect_ms"]),
            Raw(_reconnect_strip(r, window_ms), r["first_reconnect_ms"]),
            _csv_link("flapping_clients.csv", (lines.get("flapping_clients") or [[]] * (i + 1))[i])])
    marked = any("connect_ms" in r for r in findings["flapping_clients"])
    legend = (f"{_legend_svg(_connect_mark(6, 'connect'))} a connect (a new connection), "
              f"{_legend_svg(_close_mark(6, 'close', False))} a close the input shows (channel closed, unregister, "
              f"expiry, FIN or RST: hover a mark for which), {_legend_svg(_close_mark(6, 'close', True))} the last "
              "heartbeat on a connection the client left (a recording holds heartbeats only: it closed after that), "
              "<span class='key win'></span> a flapping window" if marked else
              "one mark per reconnect (a new connection: the previous one closed), <span class='key win'></span> a "
              "flapping window")
    return ["<section id=flapping><h2>Flapping clients</h2>"
            f"<p>Clients that connected again {p['flap_min_reconnects']} or more times in a {p['flap_window_s']:g} s "
            f"window. Per client on its own time axis around its reconnects: {legend}. A mark beyond the axis (its "
            "first connection, often long before) sits at the axis's edge. Every reconnect in "
            "flapping_timeline.csv" + (", every connect and close in flapping_connections.csv" if marked else "")
            + ".</p>",
            _table((["broker"] if multi else []) + ["client", "groups", "reconnects", "max per window",
                                                    "first (UTC)", "last (UTC)",
                                                    "connects and closes over time" if marked else "reconnects over time",
                                                    "rows"],
                   rows, limit=CARDS * 2, id="flapping-table", csv_name="flapping_clients.csv"),
            "</section>"]


def _silences_section(findings: dict) -> List[str]:
    """Per client a bar per silence (heartbeat gap, expiry) on the input's time axis."""
    s = findings["summary"]
    per: Dict[Tuple[str, str], list] = defaultdict(list)
    groups: Dict[Tuple[str, str], set] = defaultdict(set)
    for r in findings["heartbeat_gaps"]:
        per[(r.get("broker", ""), r["client_id"])].append(("gap", r["start_ms"], r["end_ms"],
                                                           f"gap of {_dur(r['gap_s'])}"))
        groups[(r.get("broker", ""), r["client_id"])].update(r["groups"])
    for r in findings.get("expired_clients") or []:
        end = r.get("returned_ms") or s.get("last_ms") or r["expired_ms"]
        per[(r.get("broker", ""), r["client_id"])].append((
            "expired", r["silent_since_before_ms"], end,
            f"expired at {utc(r['expired_ms'])}, " + ("back at " + utc(r["returned_ms"]) if r.get("returned_ms")
                                                      else "not back by the end of the input")))
        groups[(r.get("broker", ""), r["client_id"])].update(r["groups"])
    for r in findings.get("gaps_over_data_loss") or []:
        key = (r.get("broker", ""), r["client_id"])
        if key in groups:  # a client with a real silence; the others are one line per lost range (below)
            per[key].append(("lost", r["start_ms"], r["end_ms"], "gap over lost data (not counted)"))
    hidden = _hidden_section(findings)
    if not per:
        return ["<section id=silences><h2>Silences per client</h2>"] + hidden + ["</section>"] if hidden else []
    w = 460
    axis = _Axis(s.get("first_ms"), s.get("last_ms"), 4, w - 4)
    rows = []
    for (broker, client), bars in sorted(per.items(), key=lambda kv: min(b[1] for b in kv[1])):
        body = [f"<rect x=4 y=2 width={w - 8} height=18 class=bg />"]
        for kind, a, b, title in bars:
            y, h = {"gap": (2, 8), "lost": (2, 8), "expired": (11, 9)}[kind]
            body.append(_bar(axis, a, b, y, h, kind, f"{title}: {utc(a)} to {utc(b)} UTC"))
        body.append(_ticks_svg(axis, 21, 5))
        longest = max(b[2] - b[1] for b in bars)
        rows.append([broker, Raw(_cid(client), client), ", ".join(sorted(groups[(broker, client)])), len(bars),
                     Raw(_dur(longest / 1000), longest), Raw(_svg(w, 36, "".join(body), f"silences of {client}"),
                                                            min(b[1] for b in bars))])
    if not any(r[0] for r in rows):
        rows = [r[1:] for r in rows]
        header = []
    else:
        header = ["broker"]
    return ["<section id=silences><h2>Silences per client</h2><p>Each client with a heartbeat gap or an expiry, a "
            "bar per silence on the input's time axis (<span class='key gap'></span> heartbeat gap, "
            "<span class='key expired'></span> from its last heartbeat to its expiry and return, "
            "<span class='key lost'></span> gap over lost data).</p>",
            _table(header + ["client", "groups", "silences", "longest", "silences over time"], rows,
                   limit=CARDS * 3, id="silences-table")] + hidden + ["</section>"]


def _hidden_section(findings: dict) -> List[str]:
    """The silences over lost data: one line per lost range with the number of clients it hides."""
    ranges = silences_over_data_loss(findings)
    if not ranges:
        return []
    multi = any(r.get("broker") for r in ranges)
    return [f"<h3 id=silences-lost>Silences over lost data</h3><p>{_n(len(ranges), 'range')} of lost or damaged "
            "input hide client silences: heartbeat gaps and expiries there are not counted as client silence "
            "(each client's row: findings.json <code>gaps_over_data_loss</code>, "
            "<code>expired_over_data_loss</code>).</p>",
            _table((["broker"] if multi else []) + ["from (UTC)", "to (UTC)", "lost", "records lost",
                                                    "clients hidden", "gaps", "expiries"],
                   [([r.get("broker", "")] if multi else [])
                    + [utc(r["first_ms"]), utc(r["last_ms"]), r["reason"],
                       "?" if r.get("records_lost") is None else r["records_lost"], r["clients"], r["gaps"],
                       r["expiries"]] for r in ranges], id="silences-lost-table", csv_name="findings.json")]


def _multiple(g: dict, f: dict, axis: _Axis, spans: list, expiries: list, last_ms) -> str:
    w, h = 300, 86
    top, bottom = 16, 58
    series = [(t, n) for t, n in g["series"] if last_ms is None or t <= last_ms]
    ymax = max([n for _, n in series] + [1])

    def y(n):
        return bottom - (bottom - top) * n / ymax

    body = [f"<rect x={axis.x0} y={top} width={axis.x1 - axis.x0:.1f} height={bottom - top} class=bg />"]
    for a, b in spans:
        body.append(_bar(axis, a, b, top, bottom - top, "badspan", f"inconsistent subscriptions {utc(a)} to {utc(b)}"))
    pts, level = [f"M{axis.x0:.1f},{y(0):.1f}"], 0
    for t, n in series:
        x = axis.x(t)
        pts.append(f"H{x:.1f}V{y(n):.1f}")
        level = n
    pts.append(f"H{axis.x1:.1f}")
    body.append(f"<path d='{''.join(pts)}' class=size />")
    for t in expiries:
        x = axis.x(t)
        body.append(f"<line x1={x:.1f} x2={x:.1f} y1={bottom} y2={bottom + 4} class=exp><title>a member expired "
                    f"{e(utc(t))} UTC</title></line>")
    body.append(f"<text x={axis.x0} y={top - 3} class='tick ylab'>max {ymax}</text>")
    body.append(_ticks_svg(axis, bottom + 5, 3))
    return _svg(w, h, "".join(body), f"live members of {g['group']} over time")


def _sizes_section(findings: dict, lines: dict, multi: bool) -> List[str]:
    s = findings["summary"]
    charted, rest = chart_groups(findings)
    index = {id(g): i for i, g in enumerate(findings["group_sizes"])}
    axis = _Axis(s.get("first_ms"), s.get("last_ms"), 6, 294)
    spans: Dict[Tuple[str, str], list] = defaultdict(list)
    for r in findings["inconsistent_subscriptions"]:
        spans[(r.get("broker", ""), r["group"])].append((r["start_ms"], r["end_ms"]))
    expiries: Dict[Tuple[str, str], list] = defaultdict(list)
    for r in findings.get("expired_clients") or []:
        for grp in r["groups"]:
            expiries[(r.get("broker", ""), grp)].append(r["expired_ms"])
    size_lines = lines.get("group_sizes") or []
    noted = sum(1 for c in charted + rest if c[1] or c[2])
    beyond = noted - len(charted)
    parts = ["<section id=sizes><h2>Group sizes</h2>",
             f"<p>{len(findings['group_sizes'])} groups. One chart per group whose number of live members changed "
             f"(after the first {float(findings['parameters'].get('expiry_s', 120)):g} s, when a running fleet's "
             f"members show up one heartbeat after another) or that has findings ({noted} groups), on the same time "
             "axis (UTC), each with its own scale; red: inconsistent subscriptions, ticks under the axis: a member "
             "expired."
             + (f" At most {MULTIPLES} are charted (the most findings first, then the largest change): the other "
                f"{beyond} head the table below." if beyond else "")
             + f" The table below (collapsed) holds the other {len(rest)} groups.</p><div class=multiples>"]
    for g, f, changed in charted:
        key = (g.get("broker", ""), g["group"])
        badges = "".join(f"<span class=badge>{n} {e(k)}</span>" for k, n in sorted(f.items()))
        if changed:
            badges += "<span class='badge info'>size changed</span>"
        if g.get("changes_over_data_loss"):
            badges += f"<span class='badge warn'>{g['changes_over_data_loss']} changes around lost data</span>"
        i = index.get(id(g))
        link = _csv_link("group_sizes.csv", size_lines[i] if i is not None and i < len(size_lines) else [])
        parts.append(f"<figure class=multiple data-group='{e(g['group'])}' data-role='{e(g['role'])}'><figcaption><b>{e(g['group'])}</b> "
                     f"<span class=muted>{e(g['role'])}{(' on ' + e(g['broker'])) if g.get('broker') else ''}, "
                     f"{g['members']} distinct, peak {g['max_members']}</span><br>{badges}</figcaption>"
                     + _multiple(g, f, axis, spans.get(key, []), expiries.get(key, []), s.get("last_ms"))
                     + f"<div class=lines>{link.markup}</div></figure>")
    parts.append("</div>")
    rows = []
    for g, f, changed in rest:
        i = index.get(id(g))
        rows.append(([g.get("broker", "")] if multi else []) + [
            g["group"], g["role"], g["members"], g["max_members"], len(g["series"]),
            ", ".join(f"{n} {k}" for k, n in sorted(f.items())) or ("size changed" if changed else ""),
            _csv_link("group_sizes.csv", size_lines[i] if i is not None and i < len(size_lines) else [])])
    parts.append(f"<details id=other-groups><summary>The other {len(rest)} groups (steady size, no findings"
                 + (", or beyond the charts above" if any(c[1] or c[2] for c in rest) else "") + ")</summary>"
                 "<p><label>Filter: <input class=filter data-t=groups-table type=search "
                 "placeholder='group, role, broker'></label></p>"
                 + _table((["broker"] if multi else []) + ["group", "role", "distinct members", "peak live",
                                                           "changes", "findings", "rows"], rows,
                          limit=max(TABLE_ROWS, 2000), id="groups-table", csv_name="group_sizes.csv")
                 + "</details></section>")
    return parts


def _broker_column(header: list, rows: list) -> Tuple[list, list]:
    """Drop the leading broker column when no row names a broker (one capture, one broker)."""
    if any(r[0] for r in rows):
        return header, rows
    return header[1:], [r[1:] for r in rows]


def _capture_section(findings: dict) -> List[str]:
    cap = findings["capture"]
    st = cap.get("stats") or {}
    parts = ["<section id=captures><h2>Packet captures read</h2>",
             "<p>" + e(", ".join((c.get("broker", "") + ": " if c.get("broker") else "") + str(c.get("name", ""))
                                for c in cap.get("captures") or [])) + f": {st.get('packets', 0):,} "
             f"packets, {st.get('connections', 0):,} TCP connections ({cap.get('connections_opened', 0):,} opened in "
             f"the capture, {st.get('midstream_connections', 0):,} already open), {st.get('frames', 0):,} RocketMQ "
             f"frames, {st.get('heartbeats', 0):,} heartbeats, {cap.get('unregister_count', 0):,} unregisters, "
             f"{st.get('notifies', 0):,} consumer-change notifications.</p>",
             "<p>Connection ends: " + e(", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in
                                                  sorted((cap.get("connection_ends") or {}).items()))) + ".</p>"]
    missed = {k: v for k, v in st.items() if v and k in ("holes", "hole_bytes", "frames_cut", "resyncs",
                                                          "truncated_packets", "malformed_packets", "frames_bad",
                                                          "discarded_bytes", "truncated_file_tails")}
    parts.append("<p>Missed by the capture: " + (e(", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in missed.items()))
                                                 if missed else "nothing") + ".</p>")
    if cap.get("losses"):
        parts.append(_table(*_broker_column(["broker", "connection", "from (UTC)", "to (UTC)", "bytes"],
                            [[x.get("broker", ""), x.get("addr", ""), utc(x.get("first_ms")), utc(x.get("last_ms")),
                              x.get("bytes", "")] for x in cap["losses"]])))
    if cap.get("notifications"):
        parts.append("<p>Consumer-change notifications the broker sent, per group:</p>" + _table(*_broker_column(
            ["broker", "group", "notifications", "first (UTC)", "last (UTC)"],
            [[n.get("broker", ""), n["group"], n["notifies"], utc(n["first_ms"]), utc(n["last_ms"])]
             for n in cap["notifications"]])))
    parts.append("</section>")
    return parts
def coverage_lines(findings: dict) -> List[str]:
    """What several captures of a scan do not show (bindings.pcap): the times between them (heartbeat gaps and
    expiries over those are reported apart), and captures that seem to continue another's connections (rotated
    files given one by one: their clients seem to reconnect at every file)."""
    out = []
    holes = (findings.get("scan") or {}).get("not_captured") or []
    if holes:
        first = holes[0]
        out.append(f"{len(holes)} time range(s) between the captures not captured (the first: "
                   f"{utc(first['first_ms'])} to {utc(first['last_ms'])}, {first['reason']}); heartbeat gaps and "
                   "expiries over them are reported apart, not as client silence")
    continued = (findings.get("capture") or {}).get("continued") or []
    if continued:
        c = continued[0]
        out.append(f"{len(continued)} capture(s) seem to continue another's connections (the first: {c['capture']} "
                   f"continues {c['connections']} of {c['continues']}): rotated files given one by one are read "
                   "as separate captures, their clients seeming to reconnect at every file; give their directory "
                   "to read them as one capture")
    return out


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


def silences_over_data_loss(findings: dict) -> List[dict]:
    """One row per range of lost or damaged input (recorder data-loss markers, corrupt ranges, torn tails, time no
    capture shows) that hides client silences: the clients whose heartbeat gap or expiry (``gaps_over_data_loss``,
    ``expired_over_data_loss``) overlaps it, counted once per range (a silence over two ranges counts in both).
    A damaged recording hides hundreds of clients behind one range: the report lists the range, not each client."""
    scan = findings.get("scan") or {}
    ranges = []
    for key, what in (("data_loss", "recorder data loss"), ("corrupt", "corrupt"), ("torn_tails", "torn tail"),
                      ("not_captured", "not captured")):
        for d in scan.get(key) or []:
            if d.get("first_ms") is not None and d.get("last_ms") is not None:
                ranges.append({"broker": d.get("broker"), "first_ms": d["first_ms"], "last_ms": d["last_ms"],
                               "kind": what, "reason": d.get("reason") or what,
                               "records_lost": d.get("records_lost"), "_clients": set(), "gaps": 0, "expiries": 0})
    ranges.sort(key=lambda r: (r["first_ms"], r["last_ms"], str(r["broker"])))
    firsts = [r["first_ms"] for r in ranges]
    reach, top = [], None  # reach[i]: the latest last_ms among ranges[0..i], to stop the walk back early
    for r in ranges:
        top = r["last_ms"] if top is None else max(top, r["last_ms"])
        reach.append(top)
    rows = [("gaps", g["start_ms"], g["end_ms"], g) for g in findings.get("gaps_over_data_loss") or []]
    rows += [("expiries", x.get("last_heartbeat_ms", x["expired_ms"]), x["expired_ms"], x)
             for x in findings.get("expired_over_data_loss") or []]
    for what, a, b, row in rows:
        i = bisect.bisect_right(firsts, b) - 1
        while i >= 0 and reach[i] >= a:
            r = ranges[i]
            if r["last_ms"] >= a and (r["broker"] is None or r["broker"] == row.get("broker")):
                r["_clients"].add((row.get("broker"), row["client_id"]))
                r[what] += 1
            i -= 1
    out = []
    for r in ranges:
        if r["_clients"]:
            r["clients"] = len(r.pop("_clients"))
            if r["broker"] is None:
                del r["broker"]
            out.append(r)
    return out


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


def _idle_close_seen(findings: dict) -> List[str]:
    """How the input shows an idle close (a log, a capture, or both merged)."""
    seen = []
    if findings.get("log"):
        seen.append("a log's NETTY EVENT close whose lastUpdateTimestamp, the last heartbeat, is the silent-since time")
    if findings.get("capture"):
        seen.append(f"a capture's FIN or RST from the broker {IDLE_CLOSE_MIN_MS // 1000} s or more after the last "
                    "heartbeat")
    return seen or ["the broker's close of the connection long after the last heartbeat"]


def _vanished_seen(findings: dict) -> str:
    """How the input shows a connection that ended without UNREGISTER_CLIENT (a log, a capture, or both)."""
    seen = []
    if findings.get("log"):
        seen.append("the broker's NETTY EVENT close came with a recent last heartbeat")
    if findings.get("capture"):
        seen.append("the client's own FIN or RST, no UNREGISTER_CLIENT since its last heartbeat")
    return "; or ".join(seen) or "its connection ended"


def expired_words(findings: dict) -> str:
    """The expired section's words, one sentence per cause its rows have."""
    causes = {expiry_cause(findings, r) for r in findings.get("expired_clients") or []}
    if not causes:
        causes = {"scan"} if findings.get("log") else {"inferred"}
    words = {"scan": "<i>removed by the broker's SCAN</i>: its channel-expiry scan removed the channel while the "
                     "connection stayed open (from the brokers' SCAN lines; silent since at most the expiry before).",
             "idle_closed": "<i>closed idle by the broker</i>: its Netty idle handler closed the silent connection "
                            f"first ({' or '.join(_idle_close_seen(findings))}).",
             "inferred": "<i>inferred</i>: the input holds heartbeats only; a client that stopped for good is listed "
                         "once its last heartbeat plus the expiry has passed with no close seen, as the broker would "
                         "drop it."}
    return " ".join(words[c] for c in ("scan", "idle_closed", "inferred") if c in causes)


def _vanished_section(findings: dict, cols, row, link) -> List[str]:
    """Clients whose connection ended without UNREGISTER_CLIENT and that did not come back, and the broker's
    restarts (a log's findings)."""
    if "vanished_clients" not in findings and "broker_boots" not in findings:
        return []
    parts = []
    if "vanished_clients" in findings:
        parts.append("<section id=vanished><h2>Vanished clients</h2><p>Clients whose connection ended without an "
                     f"UNREGISTER_CLIENT (a crash, a kill, a network cut: {_vanished_seen(findings)}) and that did "
                     "not register again: not clean shutdowns (those unregister) and not expiries (those fell silent "
                     "first).</p>")
        parts.append(_table(
            cols("client", "address", "groups left", "connected (UTC)", "last heartbeat (UTC)", "ended (UTC)",
                 "rows"),
            [row(r, Raw(_cid(r["client_id"]), r["client_id"]), r["addr"], ", ".join(r["groups"]),
                 utc(r["connected_ms"]), utc(r["last_heartbeat_ms"]), utc(r["ended_ms"]), link("vanished_clients", i))
             for i, r in enumerate(findings["vanished_clients"])],
            id="vanished-table", csv_name="vanished_clients.csv"))
        parts.append("</section>")
    if "broker_boots" in findings:
        boots = findings["broker_boots"]
        how = ("In a capture (seen): the broker closed its connections -- a time when every connection open then "
               "(two or more) was ended by the broker within 2 s -- or, when its host died without a close on "
               "the wire, new connections, none surviving -- two or more connections went silent (or only got the "
               "new host's reset later) and new ones followed, no connection going on across it: stopped is then "
               "one past their last packet (the crash itself came after it and is not on the wire). Started: the "
               "first connection after it. " if findings.get("capture") else
               "In a log: its stop is the shutdown hook's line, its start its first startup line (else its boot "
               "success line); a start with no stop logged before it (a killed broker) ends the memberships at the "
               "start: when the broker died is not in the log. ")
        parts.append("<section id=restarts><h2>Broker restarts</h2><p>A broker that stops or starts has no channels: "
                     "every membership still live ends there. " + how
                     + ("No stop or start of a broker in the input." if not boots else "") + "</p>")
        if boots:
            parts.append(_table(
                ["broker", "stopped (UTC)", "started (UTC)", "boot success (UTC)", "name, address",
                 "memberships ended", "clients", "seen"],
                [[r["broker"], utc(r["stopped_ms"]) or "", utc(r["start_ms"]) or "(not started again in the input)",
                  utc(r["ready_ms"]) or "", ", ".join(x for x in (r["name"], r["addr"]) if x),
                  "" if r["members_ended"] is None else r["members_ended"], r["clients_ended"],
                  r.get("seen") or ("its log lines" if findings.get("log") else "")] for r in boots],
                csv_name="broker_restarts.csv"))
    return parts


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
                 "<i>unknown_client_message</i>: a line carrying a client-management text (ClientChannelInfo, "
                 "subscription changed, ...) in a wording the parser does not know, so its event is missing "
                 "(another broker version's message?); "
                 "<i>invalid_utf8</i>; <i>continuation</i>: stack traces and wrapped lines; <i>other</i>: well-formed "
                 "lines of other messages (no example kept). Events: <i>client_changed</i> is a member's channel "
                 "taken over by another client id (ConsumerGroupInfo.updateChannel's error line).</p>"
                 + _table(["kind", "lines", "example (first seen)"], other))
    un = log.get("unattributed_events") or {}
    if un:
        parts.append("<p>Events the analyses could not attach to a live member" + e(unattributed_reason(log)) + ": "
                     + e(", ".join(f"{k} {v}" for k, v in sorted(un.items()))) + "</p>")
    ok = log.get("explained_events") or {}
    if ok:
        parts.append("<p>Close and unregister lines of members the broker had removed already (normal, not "
                     "counted above): " + e(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(ok.items())))
                     + ".</p>")
    parts.append("<p>Files: " + e(", ".join(log["files"][:20])) + (" ..." if len(log["files"]) > 20 else "") + "</p>")
    return parts




CSS = """
:root{--bad:#c62828;--warn:#b26a00;--ink:#1b1b1b;--muted:#666;--line:#d5d5d5}
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--ink);margin:1.5em auto;
 max-width:1280px;padding:0 1.5em}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin:1.6em 0 .4em;border-bottom:2px solid #333}
h3{font-size:1.05em;margin:.2em 0}
table{border-collapse:collapse;font-size:13px;margin:.3em 0}
td,th{border:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top}
thead th{background:#eee;position:sticky;top:0}
table.sortable thead th{cursor:pointer;user-select:none}
table.sortable thead th::after{content:' \\2195';color:#999;font-size:.8em}
th[aria-sort=ascending]::after{content:' \\25B2'!important;color:#000!important}
th[aria-sort=descending]::after{content:' \\25BC'!important;color:#000!important}
td.num{text-align:right;font-variant-numeric:tabular-nums}
table.summary{width:100%;font-size:14px}table.summary th[scope=row]{white-space:nowrap;background:#fafafa}
table.summary tr.hit td.num{color:var(--bad);font-weight:bold}table.summary tr.zero td{color:#2e7d32}
table.summary tr.na td{color:var(--muted)}
.banner{border:2px solid var(--bad);background:#fdecea;padding:.5em 1em;margin:1em 0}
.banner.partial{border-color:var(--warn);background:#fff4e0}.banner p{margin:.3em 0}
.what{color:#333}.muted,.broker,.lines,.more{color:var(--muted)}.lines{font-size:12px}
.none{color:#2e7d32}
.cid{overflow-wrap:anywhere;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
code{background:#f3f3f3;padding:0 3px;border-radius:3px;font-size:12px;margin-right:3px;display:inline-block}
.card{border:1px solid var(--line);border-left:4px solid var(--bad);padding:.5em 1em;margin:.8em 0;
 break-inside:avoid}
.variant{margin-left:1em}table.diff td:nth-child(4){color:var(--bad);font-weight:bold}
table.diff td:nth-child(5){color:#1f5fa8;font-weight:bold}
svg.strip{display:block;overflow:visible}svg .bg{fill:#f2f2f2}svg .bad,svg .expired{fill:var(--bad)}
svg .gap{fill:#ef8a17}svg .lost{fill:#9e9e9e}svg .win{fill:#ffe0b2}svg .badspan{fill:#f8c7c4}
svg .mark{stroke:#111;stroke-width:1.5}svg .connect{stroke:#2e7d32;fill:#2e7d32;stroke-width:1.5}
svg .close{stroke:var(--bad);fill:var(--bad);stroke-width:1.5}
svg .closeby{stroke:var(--bad);fill:#fff;stroke-width:1.3;stroke-dasharray:2 1.5}svg.legend{vertical-align:middle;overflow:visible}svg .ax{stroke:#888;stroke-width:1}svg .exp{stroke:var(--bad);stroke-width:2}
svg .size{fill:none;stroke:#1f5fa8;stroke-width:1.6}
svg .tick{font-size:9px;fill:#555;text-anchor:middle}svg .tick.ylab{text-anchor:start}
.key{display:inline-block;width:1.2em;height:.7em;vertical-align:middle}.key.gap{background:#ef8a17}
.key.expired{background:var(--bad)}.key.lost{background:#9e9e9e}.key.win{background:#ffe0b2}
.multiples{display:flex;flex-wrap:wrap;gap:10px}
figure.multiple{margin:0;border:1px solid var(--line);padding:4px 6px;width:300px;break-inside:avoid}
figcaption{font-size:12px;min-height:3em}
.badge{display:inline-block;background:#fdecea;color:var(--bad);border-radius:8px;padding:0 6px;font-size:11px;
 margin:1px 3px 1px 0}.badge.info{background:#e3eefa;color:#1f5fa8}.badge.warn{background:#fff4e0;color:var(--warn)}
nav.toc a{margin-right:1em}details>summary{cursor:pointer;font-weight:bold;margin:.5em 0}
@media print{
 body{margin:0;max-width:none;font-size:11px;padding:0}nav.toc,input.filter,label{display:none}
 a{color:inherit;text-decoration:none}thead th{position:static}h2{break-after:avoid}
 .card,figure.multiple,tr{break-inside:avoid}table.sortable thead th::after{content:''}
 .banner{-webkit-print-color-adjust:exact;print-color-adjust:exact}svg{print-color-adjust:exact}
 details::details-content{content-visibility:visible;display:block}
}
"""

#: The page's only script: sortable tables (click a header; data-v holds a cell's sort key), the group table's
#: filter, and every collapsed part opened for printing.
SCRIPT = """
function key(td){var v=td.hasAttribute('data-v')?td.getAttribute('data-v'):td.textContent.trim();
 return v!==''&&isFinite(v)?[0,+v]:[1,v.toLowerCase()];}
document.querySelectorAll('table.sortable thead th').forEach(function(th){th.tabIndex=0;th.onclick=function(){
 var t=th.closest('table'),b=t.tBodies[0],i=th.cellIndex,d=th.getAttribute('aria-sort')==='ascending'?-1:1;
 t.querySelectorAll('thead th').forEach(function(h){h.removeAttribute('aria-sort');});
 th.setAttribute('aria-sort',d>0?'ascending':'descending');
 Array.prototype.slice.call(b.rows).map(function(r){return [key(r.cells[i]),r];}).sort(function(x,y){
  return (x[0][0]-y[0][0]||(x[0][1]<y[0][1]?-1:x[0][1]>y[0][1]?1:0))*d;}).forEach(function(p){b.appendChild(p[1]);});};
 th.onkeydown=function(ev){if(ev.key==='Enter')th.onclick();};});
document.querySelectorAll('input.filter').forEach(function(f){f.oninput=function(){var q=f.value.toLowerCase();
 document.getElementById(f.getAttribute('data-t')).tBodies[0].querySelectorAll('tr').forEach(function(r){
  r.hidden=q!==''&&r.textContent.toLowerCase().indexOf(q)<0;});};});
window.addEventListener('beforeprint',function(){document.querySelectorAll('details:not([open])').forEach(
 function(d){d.setAttribute('open','');d.setAttribute('data-print','');});});
window.addEventListener('afterprint',function(){document.querySelectorAll('details[data-print]').forEach(
 function(d){d.removeAttribute('open');d.removeAttribute('data-print');});});
"""


def write_html(findings: dict, out: "ReportFiles", csvs: List[str], plots: List[str],
               lines: Optional[dict] = None) -> Path:
    s = findings["summary"]
    p = findings["parameters"]
    log = findings.get("log")
    cap = findings.get("capture")
    lines = lines or {}
    unsupported = findings.get("unsupported") or {}
    merged = findings.get("merged")  # a broker's log and its capture as one timeline (engine.bindings.merge)
    if merged:
        other = "packet capture" if merged["heartbeats_from"] == "pcap" else "heartbeat recording"
        kind = f"a broker log and a {other} of one broker"
        what = (f"{merged['log_events']:,} client-management events from {log['lines']:,} broker-log lines and "
                f"{merged['heartbeats']:,} heartbeats of the {other} about {s['clients']:,} clients of "
                f"{e(merged['broker'])}, {e(utc(s['first_ms']))} to {e(utc(s['last_ms']))} UTC (log zone "
                f"{e(str(log['log_tz']))}).")
    elif log:
        kind = "broker logs"
        what = (f"{log['lines']:,} broker-log lines, {s['records']:,} client-management events "
                f"({s['bad_bodies']:,} unparseable lines) about {s['clients']:,} clients of {len(log['brokers'])} "
                f"broker(s), {e(utc(s['first_ms']))} to {e(utc(s['last_ms']))} UTC (log zone {e(str(log['log_tz']))}).")
    else:
        kind = "packet captures" if cap else "heartbeat recording" + ("s" if findings.get("fleet") else "")
        what = (f"{s['records']:,} heartbeats ({s['bad_bodies']:,} undecodable) from {s['clients']:,} clients, "
                f"{e(utc(s['first_ms']))} to {e(utc(s['last_ms']))} UTC"
                + (f" ({_dur((s['last_ms'] - s['first_ms']) / 1000)})" if s.get("first_ms") is not None
                   and s.get("last_ms") is not None else "") + ".")
    multi = bool(log) or bool(findings.get("fleet"))  # log findings and several brokers' rows carry their broker

    def cols(*names):
        return (["broker"] if multi else []) + list(names)

    def row(r, *values):
        return ([r.get("broker", "")] if multi else []) + list(values)

    def link(key, i):
        got = lines.get(key) or []
        return _csv_link(f"{key}.csv", got[i] if i < len(got) else [])

    toc = [("summary", "Summary"), ("inconsistent", "Inconsistent subscriptions")]
    if log:
        toc.append(("flips", "Subscription flips"))
    toc += [("flapping", "Flapping clients"), ("silences", "Silences"), ("gaps", "Heartbeat gaps"),
            ("expired", "Expired clients")]
    if "vanished_clients" in findings:
        toc.append(("vanished", "Vanished clients"))
    if "broker_boots" in findings:
        toc.append(("restarts", "Broker restarts"))
    if "retry_topic_churn" in findings:
        toc.append(("churn", "Retry-topic churn"))
    toc += [("sizes", "Group sizes"), ("input", "Input and files")]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'><title>Heartbeat scan report</title>"
        f"<style>{CSS}</style></head><body>",
        f"<header><h1>Heartbeat scan report</h1><p class=what>Scan of {e(kind)}: {what}</p></header>",
        _banner(findings),
        _summary(findings, lines),
        "<nav class=toc>" + "".join(f"<a href='#{a}'>{e(t)}</a>" for a, t in toc) + "</nav>",
    ]
    parts += _inconsistent_section(findings, lines)
    if log:
        flips = [(i, r) for i, r in enumerate(findings["inconsistent_subscriptions"])
                 if r.get("source") == "group_table"]
        parts.append("<section id=flips><h2>Subscription flips</h2><p>Groups whose subscription table (the broker's, "
                     "logged as <code>subscription changed ... OLD: ... NEW:</code>) went back to an expression it had "
                     "before: members with different subscriptions overwriting each other at every heartbeat. The log "
                     "line does not name the client.</p>")
        parts.append(_table(
            cols("group", "topic", "flips", "from (UTC)", "to (UTC)", "expressions", "rows"),
            [row(r, r["group"], r["topic"], r["flips"], utc(r["start_ms"]), utc(r["end_ms"]),
                 " | ".join(_subs_text(v["subscriptions"]) for v in r["variants"]),
                 link("inconsistent_subscriptions", i)) for i, r in flips]) + "</section>")
    parts += _flapping_section(findings, lines, multi)
    parts += _silences_section(findings)
    parts.append("<section id=gaps><h2>Heartbeat gaps</h2>")
    if "heartbeat_gaps" in unsupported:
        parts.append(f"<p><b>Not supported by this input</b>: {e(unsupported['heartbeat_gaps'])}.</p>")
    else:
        parts.append(f"<p>Clients silent for more than {p['gap_threshold_s']:g} s between two heartbeats (any "
                     "connection, any group).</p>")
        if "gap_histogram.svg" in plots:
            parts.append("<img src='gap_histogram.svg' alt='histogram of the heartbeat gaps' class=hist "
                         "width=480>")
        gaps = sorted(enumerate(findings["heartbeat_gaps"]), key=lambda ir: -ir[1]["gap_s"])
        parts.append(_table(cols("client", "groups", "from (UTC)", "to (UTC)", "gap s", "rows"),
                            [row(r, Raw(_cid(r["client_id"]), r["client_id"]), ", ".join(r["groups"]),
                                 utc(r["start_ms"]), utc(r["end_ms"]), r["gap_s"], link("heartbeat_gaps", i))
                             for i, r in gaps], id="gaps-table", csv_name="heartbeat_gaps.csv"))
        over = findings.get("gaps_over_data_loss") or []
        if over:
            parts.append(f"<p>{len(over)} more gaps overlap lost or damaged data and are not counted as client "
                         "silence (findings.json: gaps_over_data_loss).</p>")
    parts.append("</section>")
    parts.append("<section id=expired><h2>Expired clients</h2><p>Silent clients the broker drops: no heartbeat "
                 f"for {p['expiry_s']:g} s. " + expired_words(findings) + "</p>")
    parts.append(_table(
        cols("client", "address", "groups", "connected (UTC)", "silent since (UTC)", "expired (UTC)", "cause",
             "back (UTC)", "rows"),
        [row(r, Raw(_cid(r["client_id"]), r["client_id"]), r["addr"], ", ".join(r["groups"]), utc(r["connected_ms"]),
             utc(r["silent_since_before_ms"]), utc(r["expired_ms"]),
             EXPIRY_CAUSES.get(expiry_cause(findings, r), expiry_cause(findings, r)),
             utc(r["returned_ms"]) or "never", link("expired_clients", i))
         for i, r in enumerate(findings.get("expired_clients", []))],
        id="expired-table", csv_name="expired_clients.csv"))
    if findings.get("expired_over_data_loss"):
        parts.append(f"<p>{len(findings['expired_over_data_loss'])} more silences over lost or damaged data are not "
                     "counted as expiries (findings.json: expired_over_data_loss).</p>")
    parts.append("</section>")
    parts += _vanished_section(findings, cols, row, link)
    if "retry_topic_churn" in findings:
        parts.append("<section id=churn><h2>Retry-topic churn</h2><p>Consumer groups whose <code>%RETRY%</code> "
                     "subscription itself changed (removed by a member's heartbeat without it, e.g. a BROADCASTING "
                     "member in a CLUSTERING group, added back, or another expression) "
                     f"{p['flap_min_reconnects']} or more times in a {p['flap_window_s']:g} s window. A new "
                     "subVersion alone (a consumer instance starting: a restart) is not churn; restarts are under "
                     "flapping clients.</p>")
        parts.append(_table(
            cols("group", "retry topic", "adds", "changes", "removes", "max per window", "first (UTC)", "last (UTC)",
                 "rows"),
            [row(r, r["group"], r["retry_topic"], r["adds"], r["changes"], r["removes"], r["max_per_window"],
                 utc(r["first_ms"]), utc(r["last_ms"]), link("retry_topic_churn", i))
             for i, r in enumerate(findings["retry_topic_churn"])]) + "</section>")
    parts += _sizes_section(findings, lines, multi)
    parts.append("<section id=input>")
    if findings.get("fleet"):
        parts.append("<h2>Per broker</h2>" + _per_broker(findings))
    if merged:
        parts.append("<h2>Two inputs, one timeline</h2><p>Every event once: "
                     f"clients {merged['clients']['both']} seen in both inputs, {merged['clients']['log_only']} "
                     f"only in the log, {merged['clients']['heartbeats_only']} only in the {other}; expiries "
                     f"{merged['expiries']['both']} in both (the log's time and cause, the {other}'s connection "
                     f"times), {merged['expiries']['log_only']} only in the log, "
                     f"{merged['expiries']['heartbeats_only']} only in the {other} (cause inferred).</p>")
        parts.append(_table(["finding", "from"], [[k, v] for k, v in merged["sources"].items()]))
    if log:
        parts += _log_section(findings)
    if cap:
        parts += _capture_section(findings)
    cannot = dict(unsupported)
    if not log:  # heartbeats only (with a log, the log shows these)
        cannot.update(HEARTBEATS_CANNOT)
        cannot.update(CAPTURE_CANNOT if cap else RECORDING_CANNOT)
    else:  # the group sizes are the log's, with a capture too
        cannot.update(LOG_CANNOT)
    if cannot:
        parts.append("<h2>What this input cannot show</h2>" + _table(
            ["analysis", "why"], [[k, v] for k, v in sorted(cannot.items())]))
    parts.append("<h2>Parameters and files</h2>")
    parts.append("<p>Parameters: " + ", ".join(f"{e(k)} = {e(str(v))}" for k, v in p.items()) + "</p>")
    scan = findings.get("scan")
    if scan and log:
        parts.append(f"<p>Scan: {scan.get('files')} log file(s) in {scan.get('seconds')} s, {e(str(scan.get('parser')))} "
                     "line parser.</p>")
    elif scan and scan.get("method"):
        parts.append(f"<p>Scan: method {e(str(scan.get('method')))}, {scan.get('splits')} splits over "
                     f"{scan.get('segments')} segments in {scan.get('seconds')} s; torn tails: "
                     f"{len(scan.get('torn_tails', []))}, corrupt ranges: {len(scan.get('corrupt', []))}.</p>")
    parts.append("<p>Files: " + ", ".join(f"<a href='{e(n)}'>{e(n)}</a>" for n in ["findings.json"] + csvs + plots)
                 + "</p>")
    if plots:
        parts.append("<details id=plots><summary>The plots as SVG images (for tickets and chats)</summary>"
                     + "".join(f"<p><img src='{e(n)}' alt='{e(n)}' loading=lazy></p>" for n in plots) + "</details>")
    parts.append("</section>")
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    with out.open("index.html", "w") as f:
        f.write("\n".join(parts))
    return out.path / "index.html"


# ---------------------------------------------------------------------------------------------------------------
# The report directory


class ReportOutputError(Exception):
    """The report directory cannot be written safely (a symbolic link, not a directory, a directory where a report
    file goes): one line for the operator."""


def check_report_dir(out) -> None:
    """Refuse before a scan what write_report would refuse after it: ``out`` a symbolic link or not a directory."""
    out = Path(out)
    if out.is_symlink():
        raise ReportOutputError(f"{out} is a symbolic link; give the report directory itself (a report is never "
                                "written through a link)")
    if out.exists() and not out.is_dir():
        raise ReportOutputError(f"{out} exists and is not a directory")


class ReportFiles:
    """The report's files while they are written: a fresh private directory (0700, random name) inside the report
    directory, both held open by descriptor; each file is created there with O_CREAT | O_EXCL | O_NOFOLLOW and, once
    all are written, renamed into the report directory. A name planted in the report directory (a symbolic or hard
    link to a file elsewhere) is replaced by the rename, never written through; a report directory that is itself a
    symbolic link is refused."""

    def __init__(self, path: Path):
        self.path = path
        self.names: List[str] = []
        check_report_dir(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        try:
            self.dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            check_report_dir(path)  # swapped for a link since: the same line
            raise ReportOutputError(f"cannot open the report directory {path}: {e.strerror}") from None
        self.tmp = f".rmqhb-report-{secrets.token_hex(8)}"
        try:
            os.mkdir(self.tmp, 0o700, dir_fd=self.dir_fd)
            self.tmp_fd = os.open(self.tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  dir_fd=self.dir_fd)
        except OSError as e:
            os.close(self.dir_fd)
            raise ReportOutputError(f"cannot write into the report directory {path}: {e.strerror}") from None
        st = os.fstat(self.tmp_fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:  # replaced between mkdir and open by the directory's owner
            os.close(self.tmp_fd)
            os.close(self.dir_fd)
            raise ReportOutputError(f"{path}: the private directory {self.tmp} was replaced while it was created")

    def open(self, name: str, mode: str = "w", **kw):
        """A new file ``name`` in the private directory (never an existing file, never through a link)."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                     dir_fd=self.tmp_fd)
        self.names.append(name)
        if "b" not in mode:
            kw.setdefault("encoding", "utf-8")
        return os.fdopen(fd, mode, **kw)

    #: the names of the files of the report last written into the directory: the next report removes those it
    #: does not write again (a second scan into the same --out leaves none of the first scan's plots or CSVs)
    LISTING = ".rmqhb-files"

    def _previous_names(self) -> List[str]:
        try:  # O_NONBLOCK: a FIFO planted under the listing's name must not hang the open (nor the read)
            fd = os.open(self.LISTING, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.dir_fd)
        except OSError:
            return []
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []  # not a listing this class wrote (a FIFO, a device): ignored, replaced at commit
            data = f.read(1 << 20)
        names = data.decode("utf-8", "replace").splitlines()
        # only plain names this class writes: never a path, a hidden file or the listing itself
        return [n for n in names if n and "/" not in n and not n.startswith(".")]

    def commit(self) -> None:
        """Rename every file into the report directory, in the order written (index.html last), then remove the
        previous report's files this one did not write again."""
        previous = self._previous_names()
        with self.open(self.LISTING) as f:
            f.write("".join(f"{n}\n" for n in self.names if n != self.LISTING))
        for name in self.names:
            try:
                os.rename(name, name, src_dir_fd=self.tmp_fd, dst_dir_fd=self.dir_fd)
            except OSError as e:
                why = "a directory is there" if e.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST) else e.strerror
                raise ReportOutputError(f"cannot replace {self.path / name}: {why}") from None
        for name in set(previous) - set(self.names):
            try:
                os.unlink(name, dir_fd=self.dir_fd)  # a link planted there is removed, not followed
            except OSError:
                pass

    def close(self) -> None:
        """Remove the private directory with whatever was not renamed into place."""
        for name in os.listdir(self.tmp_fd):
            try:
                os.unlink(name, dir_fd=self.tmp_fd)
            except OSError:
                pass
        os.close(self.tmp_fd)
        try:
            os.rmdir(self.tmp, dir_fd=self.dir_fd)
        except OSError:
            pass
        os.close(self.dir_fd)


def write_report(findings: dict, out, plots: bool = True) -> Path:
    """Write findings.json, CSVs, plots and index.html into ``out`` (see ReportFiles: never through a symbolic
    link; ReportOutputError when ``out`` is one); returns the index path."""
    files = ReportFiles(Path(out))
    if "gaps_over_data_loss" in findings or "expired_over_data_loss" in findings:
        findings["silences_over_data_loss"] = silences_over_data_loss(findings)
    try:
        with files.open("findings.json", "w") as f:
            f.write(json.dumps(findings, indent=1))
        csvs, lines = _write_all_csvs(findings, files)
        plotted = write_plots(findings, files) if plots else []
        index = write_html(findings, files, csvs, plotted, lines)
        files.commit()
    finally:
        files.close()
    return index


def print_summary(findings: dict, file) -> None:
    file = EscapedWriter(file, lines=True)  # client ids and groups: a newline or an ESC in one is printed escaped
    s = findings["summary"]
    log = findings.get("log")
    what = ("client-management events", "unparseable lines") if log else ("heartbeats", "undecodable")
    merged = findings.get("merged")  # a broker's log and its capture (engine.bindings.merge)
    if merged:
        what = (f"broker-log events and heartbeats ({merged['log_events']:,} + {merged['heartbeats']:,})",
                "unreadable lines or bodies")
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
    for note in coverage_lines(findings):
        print(f"CAPTURE COVERAGE: {note}", file=file)
    for r in findings["inconsistent_subscriptions"][:5]:
        print(f"  inconsistent subscriptions: {_label(r, r['group'])} for {r['duration_s']:.0f} s from {utc(r['start_ms'])}, "
              f"{len(r['variants'])} variants", file=file)
    for r in findings["flapping_clients"][:5]:
        print(f"  flapping: {_label(r, r['client_id'])} ({', '.join(r['groups'])}) {r['reconnects']} reconnects", file=file)
    for r in findings["heartbeat_gaps"][:5]:
        print(f"  gap: {r['client_id']} silent {r['gap_s']:.0f} s from {utc(r['start_ms'])}", file=file)
    for r in findings.get("expired_clients", [])[:5]:
        print(f"  expired: {r['client_id']} ({', '.join(r['groups'])}) at {utc(r['expired_ms'])}"
              + (f" on {r['broker']}" if r.get("broker") else "")
              + f" ({EXPIRY_CAUSES.get(expiry_cause(findings, r), expiry_cause(findings, r))})", file=file)
    for r in findings.get("vanished_clients", [])[:5]:
        print(f"  vanished (no unregister): {r['client_id']} ({', '.join(r['groups'])}) at {utc(r['ended_ms'])}"
              + (f" on {r['broker']}" if r.get("broker") else ""), file=file)
    for r in findings.get("broker_boots", [])[:5]:
        print(f"  broker {r['broker']} " + (f"stopped {utc(r['stopped_ms'])} " if r["stopped_ms"] else "")
              + (f"started {utc(r['start_ms'])}" if r["start_ms"] else "(not started again in the input)")
              + f", {r['clients_ended']} clients' channels ended"
              + (f" (seen: {r['seen']})" if r.get("seen") else ""), file=file)
    n = {k: len(findings[k]) for k in _keys(findings)}
    gaps = "heartbeat gaps not visible" if "heartbeat_gaps" in (findings.get("unsupported") or {}) else \
        f"{n['heartbeat_gaps']} heartbeat gaps"
    print(f"findings: {n['inconsistent_subscriptions']} inconsistent-subscription spans, {n['flapping_clients']} flapping "
          f"clients, {gaps}, {n['expired_clients']} expired clients, {n['group_sizes']} group size series"
          + (f", {n['retry_topic_churn']} groups with retry-topic churn" if "retry_topic_churn" in n else ""), file=file)

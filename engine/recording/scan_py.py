"""Plain-Python reference scan of a (small) recording: the definitions the Spark scan must reproduce exactly.

Written for clarity, one heartbeat at a time, with ``engine.decode_heartbeat`` (not the batch decoder) and
per-heartbeat intervals (not the Spark scan's runs), so agreement between the two is a real check.

Definitions (``expiry`` = the broker's channel expiry, 120 s by default):

* A heartbeat is *observed* for its client (``clientID``), for every producer group and for every consumer group
  in it. A consumer observation carries the member's *subscription set*: the distinct
  ``[topic, expressionType, subString]`` triples of its subscriptions (subVersion, tags and codes ignored, as
  RocketMQ's consumerStatus compares them). A V2 light heartbeat (``withoutSub``) carries none: the member keeps
  the set of its previous full heartbeat in that group (unknown if there was none). Bodies that fail to decode
  or have no clientID are counted and ignored. A record the recorder clipped (engine.recording.recorder.clip_body:
  a body it could not decode, or one past its connection's share) is counted with them, and apart, by reason, in
  ``summary.clipped_bodies`` / ``scan.clipped``: named as clipped, not as damage of the recording.
* Observations of one (role, group, client) are ordered by (receive time, connection id, set), and the member is
  *live* from each observation until the next one or ``expiry`` later, whichever is first. In a capture (its
  ``conn_events`` and ``unregisters``), also at most until the first FIN / RST of the observation's connection or
  the client's first UNREGISTER_CLIENT for that group at or after it (:func:`member_left`): the broker removed the
  member then; a later heartbeat adds it back (also one on that connection after its FIN, a half-closed
  connection, but not one after a broker restart the capture did not see the closes of, ``end`` =
  ``[ms, "broker_restart"]`` from bindings.pcap.restart_events: the new host reset that connection). (The Spark scan ends a member's run at such an unregister and at its connection's first FIN /
  RST, bindings.pcap.capture_runs and bindings.spark.merge_runs, for the same intervals; a capture read in shards
  applies every shard's unregisters to every shard's runs, bindings.pcap.recut_runs, as a client may unregister
  on another connection than the one it heartbeats on.)
* ``group_sizes``: per group and role, the number of live members over time, as change points.
* ``inconsistent_subscriptions``: per consumer group, the maximal spans during which live members with a known set
  hold two or more different sets; spans shorter than ``min_duration`` are dropped. Each span lists the variants
  and the clients that held them during the span.
* ``heartbeat_gaps``: per client, consecutive heartbeats (any connection, any group) more than ``gap_threshold``
  apart.
* ``flapping_clients``: a *reconnect* is a heartbeat of a client on another connection than its previous one
  (in a capture, not when a broker restart ended that previous one: ``conn_events``' ``restart``,
  bindings.pcap.restart_events); a client flaps when some window (``flap_window``, aligned to the epoch) holds
  ``flap_min_reconnects`` or more.
  Each flapping row also carries its client's connections as marks for the report's timeline (see
  :func:`connection_marks`): ``connect_ms``, the first heartbeat of each of its connections (a new connection is a
  connect), and ``closes``, ``[ms, how]`` per connection it left: ``how`` = ``last_heartbeat`` (the connection's
  last heartbeat, when the client heartbeats on another connection later: the close came after it). A capture
  scan replaces these with the capture's own TCP events where it saw them (``open``: the SYN; ``fin_by_client``,
  ``rst_by_server``, ...: the first FIN or RST).
* ``member_addresses`` (for the report, not a finding): per (group, client) of a deviating member -- one of an
  ``inconsistent_subscriptions`` span's variants after the first, which the most members hold -- the remote
  addresses of the connections of its observations in that group live during the span (``t < end`` and
  ``t + expiry > start``). In a capture an observation's connection counts only until the member left it as
  membership has it (:func:`member_left`: that connection's first FIN / RST, or the client's UNREGISTER_CLIENT
  for the group, at or after ``t``): ``t < end`` and ``min(t + expiry, left) > max(start, t)``, so an address is
  not listed for a span that starts after the member closed that connection or unregistered.
* ``expired_clients``: what the broker's channel-expiry scan (SCAN) would remove: a client whose heartbeats (any
  connection) stop for more than ``expiry`` while the recording goes on at least that long. One row per silence:
  the connection of its last heartbeat (``conn_id``, ``addr``, ``connected_ms`` = that connection's first
  heartbeat), ``last_heartbeat_ms``, ``expired_ms`` = last heartbeat + expiry (the broker's scan, every 10 s,
  removes the channel at most 10 s later), ``returned_ms`` (its next heartbeat, None if it never came back).
  A recording holds heartbeats only: a client that moved to another connection within the expiry is taken to
  have closed the first one (no expiry), and one that stopped for good is reported once the expiry has passed,
  as the broker would if its connection had stayed open (a clean UNREGISTER_CLIENT is not recorded).
  A capture knows better (:func:`departure`): a silence is no expiry when, at or after its last heartbeat and
  before last heartbeat + expiry, the capture saw that connection end (FIN / RST, either side) or the client
  unregister from every group it had at that heartbeat (CLIENT_INNER_PRODUCER aside). What it did not see changes
  nothing: the rule above (a silence must fit in the capture) and separate_data_loss (holes) still apply.
  Each row has its ``cause`` (:func:`expiry_causes`): ``inferred`` (last heartbeat + expiry, no close seen), or,
  in a capture, ``idle_closed`` when the broker closed that connection ``IDLE_CLOSE_MIN_MS`` or more after the
  last heartbeat (its Netty idle handler: ``expired_ms`` is then that close); such a close is no departure.
"""
from __future__ import annotations

import bisect
import functools
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Tuple

#: The producer group every Java client instance registers (MixAll.CLIENT_INNER_PRODUCER_GROUP); left out of the
#: group lists in client findings because every Java client has it.
CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"
#: A broker-side close of a channel this long or longer after its last heartbeat is the broker's idle handler closing
#: a silent channel (serverChannelMaxIdleTimeSeconds, 120 s): a live client heartbeats every 30 s, so a killed or
#: cut-off client's close comes at most ~30 s after its last heartbeat; 90 s = three missed heartbeats. (A broker
#: log's NETTY EVENT close line carries the channel's lastUpdateTimestamp, the last heartbeat, for the same test.)
IDLE_CLOSE_MIN_MS = 90_000
FINDING_KEYS = ("inconsistent_subscriptions", "flapping_clients", "heartbeat_gaps", "group_sizes", "expired_clients")


@dataclass(frozen=True)
class ScanParams:
    expiry_s: float = 120.0
    gap_threshold_s: float = 120.0
    min_duration_s: float = 0.0
    flap_window_s: float = 600.0
    flap_min_reconnects: int = 3

    @property
    def expiry_ms(self) -> int:
        return int(round(self.expiry_s * 1000))

    @property
    def gap_ms(self) -> int:
        return int(round(self.gap_threshold_s * 1000))

    @property
    def min_duration_ms(self) -> int:
        return int(round(self.min_duration_s * 1000))

    @property
    def window_ms(self) -> int:
        return int(round(self.flap_window_s * 1000))

    @property
    def split_ms(self) -> int:
        """Observations further apart than this start a new run (the Spark scan's pre-aggregation)."""
        return min(self.expiry_ms, self.gap_ms)

    def validate(self) -> "ScanParams":
        if self.expiry_s <= 0 or self.gap_threshold_s <= 0 or self.flap_window_s <= 0:
            raise ValueError("expiry, gap threshold and flap window must be positive")
        if self.min_duration_s < 0 or self.flap_min_reconnects < 1:
            raise ValueError("min duration must be >= 0 and flap_min_reconnects >= 1")
        return self


def subscription_key(subscriptions) -> str:
    """Canonical text of a subscription set: sorted distinct [topic, expressionType, subString] as JSON."""
    triples = {(s.topic or "", s.expression_type or "TAG", s.sub_string or "") for s in subscriptions}
    return json.dumps(sorted(list(t) for t in triples), separators=(",", ":"), ensure_ascii=False)


def parse_key(key: str) -> List[List[str]]:
    return [list(t) for t in json.loads(key)]


def _sort_key(obs):
    t, conn, key = obs
    return (t, conn, "" if key is None else "\x00" + key)  # None sorts first, like Spark's nulls-first


def scan_records(records: Iterable, params: ScanParams = ScanParams(), conn_events: Optional[dict] = None,
                 unregisters: Optional[dict] = None) -> dict:
    """Findings of the reference scan over ``(recv_ms, conn_id, remote_addr, language, version, body)`` records.
    ``conn_events``: {conn_id: {"open": ms, "end": [ms, how]}} a capture saw (see :func:`connection_marks`);
    ``unregisters``: {(client_id, role, group): [ms, ...]} its UNREGISTER_CLIENT requests (see :func:`departure`:
    a capture's closes and unregisters end members and silences before the expiry)."""
    from engine import HeartbeatError, decode_heartbeat
    from engine.recording.recorder import CLIPPED_MAGIC, parse_clipped

    params.validate()
    client_obs: Dict[str, list] = defaultdict(list)                 # client -> [(t, conn)]
    conn_addr: Dict[int, str] = {}
    member_obs: Dict[Tuple[str, str, str], list] = defaultdict(list)  # (role, group, client) -> [(t, conn, key)]
    n_records = n_bad = 0
    clipped: Dict[str, int] = defaultdict(int)  # reason kind -> records the recorder clipped
    t_min = t_max = None
    for rec in records:
        t, conn, body = int(rec[0]), int(rec[1]), rec[5]
        n_records += 1
        t_min = t if t_min is None else min(t_min, t)
        t_max = t if t_max is None else max(t_max, t)
        if body[:8] == CLIPPED_MAGIC:
            c = parse_clipped(body)
            if c is not None:
                clipped[c.reason.split(":", 1)[0]] += 1
                n_bad += 1
                continue
        try:
            hb = decode_heartbeat(body)
        except (HeartbeatError, TypeError):
            n_bad += 1
            continue
        if hb.client_id is None:
            n_bad += 1
            continue
        client_obs[hb.client_id].append((t, conn))
        conn_addr.setdefault(conn, _text(rec[2]))
        for p in hb.producers:
            member_obs[("producer", p.group or "", hb.client_id)].append((t, conn, None))
        for c in hb.consumers:
            key = None if hb.without_sub else subscription_key(c.subscriptions)
            member_obs[("consumer", c.group or "", hb.client_id)].append((t, conn, key))

    groups_of: Dict[str, set] = defaultdict(set)
    for role, group, client in member_obs:
        if not (role == "producer" and group == CLIENT_INNER_PRODUCER):
            groups_of[client].add(group)

    # live intervals with their (carried) subscription set
    intervals: Dict[Tuple[str, str], list] = defaultdict(list)  # (role, group) -> [(start, end, client, key)]
    for (role, group, client), obs in member_obs.items():
        obs.sort(key=_sort_key)
        key = None
        for i, (t, conn, k) in enumerate(obs):
            if k is not None:
                key = k
            end = t + params.expiry_ms
            if i + 1 < len(obs):
                end = min(end, obs[i + 1][0])
            left = member_left(conn_events, unregisters, client, role, group, conn, t)
            if left is not None:
                end = min(end, left)
            intervals[(role, group)].append((t, end, client, key))

    findings = {
        "inconsistent_subscriptions": _inconsistent(intervals, params),
        "flapping_clients": _flapping(client_obs, groups_of, params, conn_events),
        "heartbeat_gaps": _gaps(client_obs, groups_of, params),
        "group_sizes": _sizes(intervals),
    }
    findings["expired_clients"], vanished = split_departed(
        _expired(client_obs, groups_of, conn_addr, t_max, params), functools.partial(
            departure, conn_events, unregisters, _groups_at(member_obs)) if conn_events or unregisters else None,
        conn_events, unregisters, params.expiry_ms)
    if conn_events is not None:  # a capture: it sees connections end
        findings["vanished_clients"] = vanished
    findings["member_addresses"] = _member_addresses(findings["inconsistent_subscriptions"], member_obs, conn_addr,
                                                     params, conn_events, unregisters)
    findings["summary"] = {
        "records": n_records,
        "bad_bodies": n_bad,
        "clipped_bodies": sum(clipped.values()),
        "clients": len(client_obs),
        "first_ms": t_min,
        "last_ms": t_max,
        **{k: len(findings[k]) for k in FINDING_KEYS},
    }
    findings["parameters"] = asdict(params)
    if clipped:
        findings.setdefault("scan", {})["clipped"] = dict(sorted(clipped.items()))
    return findings


def _sweep(events):
    """[(t, delta)] -> [(t, running total after all deltas at t)] for the times where the total changes."""
    acc: Dict[int, int] = defaultdict(int)
    for t, d in events:
        acc[t] += d
    out, total = [], 0
    for t in sorted(acc):
        if acc[t]:
            total += acc[t]
            out.append((t, total))
    return out


def _sizes(intervals) -> list:
    out = []
    for (role, group), ivs in sorted(intervals.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        series = _sweep([e for s, e, _, _ in ivs if e > s for e in ((s, 1), (e, -1))])
        out.append({
            "group": group,
            "role": role,
            "max_members": max((n for _, n in series), default=0),
            "members": len({c for _, _, c, _ in ivs}),
            "series": [[t, n] for t, n in series],
        })
    return out


def _inconsistent(intervals, params: ScanParams) -> list:
    out = []
    for (role, group), ivs in sorted(intervals.items()):
        if role != "consumer":
            continue
        per_key: Dict[str, Dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for s, e, _, key in ivs:
            if key is not None and e > s:
                per_key[key][s] += 1
                per_key[key][e] -= 1
        # number of keys with live holders, at every time any count changes
        n_keys_events = []
        for key, deltas in per_key.items():
            count = 0
            for t in sorted(deltas):
                before = count > 0
                count += deltas[t]
                after = count > 0
                if before != after:
                    n_keys_events.append((t, 1 if after else -1))
        spans, start = [], None
        for t, n in _sweep(n_keys_events):
            if n >= 2 and start is None:
                start = t
            elif n < 2 and start is not None:
                spans.append((start, t))
                start = None
        for s, e in spans:
            if e - s < params.min_duration_ms:
                continue
            holders: Dict[str, set] = defaultdict(set)
            for a, b, client, key in ivs:
                if key is not None and b > a and a < e and b > s:
                    holders[key].add(client)
            variants = [{"subscriptions": parse_key(k), "clients": sorted(c)} for k, c in holders.items()]
            variants.sort(key=lambda v: (-len(v["clients"]), v["subscriptions"]))
            out.append({"group": group, "start_ms": s, "end_ms": e, "duration_s": (e - s) / 1000, "variants": variants})
    return out


def deviating_members(inconsistent) -> list:
    """(group, client, start_ms, end_ms) of every member of an inconsistent span's variants after the first (the
    variants are sorted by members, most first: the first is the majority's)."""
    return [(r["group"], c, r["start_ms"], r["end_ms"]) for r in inconsistent for v in r["variants"][1:]
            for c in v["clients"]]


def _member_addresses(inconsistent, member_obs, conn_addr, params: ScanParams, conn_events: Optional[dict] = None,
                      unregisters: Optional[dict] = None) -> list:
    conns: Dict[Tuple[str, str], set] = defaultdict(set)
    for group, client, start, end in deviating_members(inconsistent):
        for t, conn, _ in member_obs.get(("consumer", group, client), ()):
            if t < end and address_live_until(conn_events, unregisters, client, group, conn, t, params) > max(start, t):
                conns[(group, client)].add(conn)
    return [{"group": g, "client_id": c, "addrs": sorted({conn_addr[x] for x in cs if conn_addr.get(x)})}
            for (g, c), cs in sorted(conns.items())]


def _gaps(client_obs, groups_of, params: ScanParams) -> list:
    out = []
    for client in sorted(client_obs):
        times = sorted(t for t, _ in client_obs[client])
        for a, b in zip(times, times[1:]):
            if b - a > params.gap_ms:
                out.append({"client_id": client, "groups": sorted(groups_of[client]), "start_ms": a, "end_ms": b,
                            "gap_s": (b - a) / 1000})
    return out


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray, memoryview)) else str(v)


def member_left(conn_events: Optional[dict], unregisters: Optional[dict], client, role, group, conn, t):
    """When a member observed at ``t`` on ``conn`` left before its next heartbeat, as far as a capture saw: the
    first FIN / RST of that connection (either side) at or after ``t``, or the first UNREGISTER_CLIENT of that
    client for that group (producerGroup for a producer, consumerGroup for a consumer) at or after ``t``,
    whichever is first; None without such an event (a recording has none). ``t`` itself when the connection ended
    by a silent broker restart before ``t`` (a heartbeat the new host reset: no membership)."""
    out = None
    if conn_events:
        end = (conn_events.get(conn) or {}).get("end")
        if end is not None and int(end[0]) >= t:
            out = int(end[0])
        elif end is not None and end[1] == "broker_restart":  # after a silent restart: the new host reset it
            return t
    if unregisters:
        times = unregisters.get((client, role, group))
        if times:
            k = bisect.bisect_left(times, t)
            if k < len(times) and (out is None or times[k] < out):
                out = times[k]
    return out


def address_live_until(conn_events: Optional[dict], unregisters: Optional[dict], client, group, conn, t,
                       params: ScanParams) -> int:
    """Until when a consumer observed at ``t`` on ``conn`` counts at that connection's address in
    ``member_addresses``: ``expiry`` after ``t``, or when it left (:func:`member_left`: the connection's first FIN /
    RST or the client's UNREGISTER_CLIENT for ``group``, at or after ``t``) if earlier."""
    left = member_left(conn_events, unregisters, client, "consumer", group, conn, t)
    return t + params.expiry_ms if left is None else min(t + params.expiry_ms, left)


def unregistered(unregisters: Optional[dict], client, groups, t, until) -> bool:
    """True when ``client`` sent UNREGISTER_CLIENT in [t, until) for every (role, group) of ``groups`` (its
    groups at its last heartbeat, CLIENT_INNER_PRODUCER aside: a Java client does not unregister it); with no
    such group, any UNREGISTER_CLIENT of the client in that time."""
    if not unregisters:
        return False

    def within(times):
        k = bisect.bisect_left(times, t)
        return k < len(times) and times[k] < until

    need = [(r, g) for r, g in groups if not (r == "producer" and g == CLIENT_INNER_PRODUCER)]
    if need:
        return all(within(unregisters.get((client, r, g), ())) for r, g in need)
    return any(within(times) for (c, _, _), times in unregisters.items() if c == client)


def departure(conn_events: Optional[dict], unregisters: Optional[dict], groups_at, client, conn, t,
              expiry_ms: int) -> bool:
    """True when a capture saw ``client`` leave after its heartbeat at ``t`` on ``conn`` and before the expiry
    (``t + expiry``): that connection ended (first FIN / RST, either side) or the client unregistered from all of
    its groups at ``t`` (``groups_at(client, t)``: {(role, group)}). The broker removed it then; no expiry."""
    end = ((conn_events or {}).get(conn) or {}).get("end")
    if end is not None and t <= int(end[0]) < t + expiry_ms and not idle_close(end, t):
        return True
    if end is not None and end[1] == "broker_restart" and t >= int(end[0]):  # the new host reset it: no channel
        return True
    return unregistered(unregisters, client, groups_at(client, t), t, t + expiry_ms)


def idle_close(end, t) -> bool:
    """Whether a connection's first FIN / RST ``end`` ([ms, how]) is the broker's idle handler closing it after the
    client's last heartbeat at ``t``: sent by the server, ``IDLE_CLOSE_MIN_MS`` or more after ``t``."""
    return str(end[1]).endswith("_by_server") and int(end[0]) - t >= IDLE_CLOSE_MIN_MS


def expiry_causes(rows: list, conn_events: Optional[dict]) -> list:
    """expired_clients rows with their ``cause``: ``idle_closed`` where the capture saw the broker close the row's
    connection idle (:func:`idle_close`; ``expired_ms`` = that close), else ``inferred``."""
    for r in rows:
        end = ((conn_events or {}).get(r.get("conn_id")) or {}).get("end")
        if end is not None and idle_close(end, r["last_heartbeat_ms"]):
            r["cause"], r["expired_ms"] = "idle_closed", int(end[0])
        else:
            r["cause"] = "inferred"
    rows.sort(key=lambda r: (r["expired_ms"], r["client_id"], r["conn_id"]))
    return rows


def split_departed(rows: list, left, conn_events: Optional[dict], unregisters: Optional[dict], expiry_ms: int):
    """(expired_clients, vanished_clients) of a capture's silences (the expiry candidates): a silence the capture saw
    end (``left``: :func:`departure`) is no expiry; of those, a client that never came back whose connection its own
    side ended (FIN / RST by the client) with no UNREGISTER_CLIENT of it since its last heartbeat (a kill, a
    crash) is a vanished client: one row per connection (``ended_ms``, ``how``). The rest get their cause
    (:func:`expiry_causes`)."""
    kept, vanished = [], []
    for r in rows:
        t = r["last_heartbeat_ms"]
        if left is None or not left(r["client_id"], r["conn_id"], t, expiry_ms):
            kept.append(r)
            continue
        end = ((conn_events or {}).get(r["conn_id"]) or {}).get("end")
        if (r["returned_ms"] is None and end is not None and str(end[1]).endswith("_by_client")
                and t <= int(end[0]) < t + expiry_ms
                and not unregistered(unregisters, r["client_id"], (), t, int(end[0]) + 1)):
            vanished.append({"client_id": r["client_id"], "addr": r["addr"], "conn_id": r["conn_id"],
                             "groups": r["groups"], "connected_ms": r["connected_ms"], "last_heartbeat_ms": t,
                             "ended_ms": int(end[0]), "how": str(end[1])})
    vanished.sort(key=lambda r: (r["ended_ms"], r["client_id"], r["conn_id"]))
    return expiry_causes(kept, conn_events), vanished


def _groups_at(member_obs):
    by_client: Dict[str, list] = defaultdict(list)
    for (role, group, client), obs in member_obs.items():
        by_client[client].append((role, group, {o[0] for o in obs}))
    return lambda client, t: {(r, g) for r, g, ts in by_client.get(client, ()) if t in ts}


def _expired(client_obs, groups_of, conn_addr, t_end, params: ScanParams, left=None) -> list:
    out = []
    expiry = params.expiry_ms
    for client in sorted(client_obs):
        obs = sorted(client_obs[client])
        first_on: Dict[int, int] = {}
        for t, c in obs:
            first_on.setdefault(c, t)
        for i, (t, c) in enumerate(obs):
            nxt = obs[i + 1][0] if i + 1 < len(obs) else None
            if ((nxt is not None and nxt - t > expiry) or (nxt is None and t + expiry <= t_end)) and not (
                    left is not None and left(client, c, t, expiry)):
                out.append(expired_row(client, c, conn_addr.get(c), sorted(groups_of[client]), first_on[c], t, nxt,
                                       expiry))
    return sorted(out, key=lambda r: (r["expired_ms"], r["client_id"], r["conn_id"]))


def expired_row(client, conn, addr, groups, connected_ms, last_ms, returned_ms, expiry_ms) -> dict:
    """One expired_clients row of a recording (the log scan's rows have the same keys, conn_id and
    last_heartbeat_ms aside)."""
    return {"client_id": client, "addr": addr, "conn_id": conn, "groups": list(groups), "connected_ms": connected_ms,
            "last_heartbeat_ms": last_ms, "expired_ms": last_ms + expiry_ms, "silent_since_before_ms": last_ms,
            "returned_ms": returned_ms, "cause": "inferred"}


def connection_marks(conns: Dict[int, Tuple[int, int]], conn_events: Optional[dict] = None) -> Tuple[list, list]:
    """(connect_ms, closes) of a client's connections ``{conn_id: (first heartbeat, last heartbeat)}``: a connect
    per connection at its first heartbeat; a close per connection the client left -- one whose last heartbeat is
    earlier than the client's last heartbeat on any connection -- as ``[its last heartbeat, "last_heartbeat"]``
    (the connection closed after it). ``conn_events`` (a capture's {conn_id: {"open": ms, "end": [ms, how]}})
    takes the connect from the SYN and the close from the first FIN/RST where the capture saw them (a close
    seen on the wire counts even on the connection the client was last on)."""
    ev = conn_events or {}
    last = max((b for _, b in conns.values()), default=None)
    connects, closes = [], []
    for c, (a, b) in conns.items():
        e = ev.get(c) or {}
        connects.append(int(e["open"]) if e.get("open") is not None else a)
        if e.get("end") is not None:
            closes.append([int(e["end"][0]), str(e["end"][1])])
        elif b < last:
            closes.append([b, "last_heartbeat"])
    return sorted(connects), sorted(closes)


def _flapping(client_obs, groups_of, params: ScanParams, conn_events: Optional[dict] = None) -> list:
    out = []
    w = params.window_ms
    for client in sorted(client_obs):
        obs = sorted(client_obs[client])
        # a capture's connection a broker restart ended (conn_events' "restart"): the client's next one is no
        # reconnect (a broker that starts has no channels; a log's scan does not count them either)
        reconnects = [t for (t0, c0), (t, c) in zip(obs, obs[1:])
                      if c != c0 and "restart" not in ((conn_events or {}).get(c0) or {})]
        per_window: Dict[int, int] = defaultdict(int)
        for t in reconnects:
            per_window[t // w] += 1
        flagged = sorted((k * w, n) for k, n in per_window.items() if n >= params.flap_min_reconnects)
        if flagged:
            out.append({
                "client_id": client,
                "groups": sorted(groups_of[client]),
                "reconnects": len(reconnects),
                "max_reconnects_per_window": max(n for _, n in flagged),
                "first_reconnect_ms": reconnects[0],
                "last_reconnect_ms": reconnects[-1],
                "windows": [[s, n] for s, n in flagged],
                "reconnect_ms": reconnects,
            })
            conns: Dict[int, Tuple[int, int]] = {}
            for t, c in obs:
                a, b = conns.get(c, (t, t))
                conns[c] = (min(a, t), max(b, t))
            out[-1]["connect_ms"], out[-1]["closes"] = connection_marks(conns, conn_events)
    return out


def scan(directory, params: Optional[ScanParams] = None, **kw) -> dict:
    """Reference findings for a recording directory (every readable record; torn tails skipped; gaps over a
    range the recorder lost are reported apart, see :func:`separate_data_loss`)."""
    from engine.recording.recorder import damage_ranges, iter_blocks, list_segments, payloads_intact, scan_segment

    losses, damaged, records = [], [], []
    segments = list_segments(directory)
    for k, path in enumerate(segments):
        scan = scan_segment(path)
        good = payloads_intact(path, scan.blocks)
        losses.extend(g.to_dict(path.name) for g in scan.gaps)
        damaged.extend(damage_ranges(path, scan, good, [b for b in scan.blocks if b not in good],
                                     segments[k + 1] if k + 1 < len(segments) else None))
        for block in iter_blocks(path, blocks=good, on_corrupt="skip"):
            records.extend(block.records())
    findings = scan_records(records, params or ScanParams(**kw))
    findings.setdefault("scan", {}).update({"torn_tails": [d for d in damaged if d["kind"] == "torn_tail"],
                                            "corrupt": [d for d in damaged if d["kind"] == "corrupt"]})
    separate_data_loss(findings, losses, damaged)
    return findings


def separate_data_loss(findings: dict, losses: list, damaged: list = ()) -> None:
    """What the recording lost is not silence of the clients: a heartbeat gap that overlaps a range the recorder
    lost (gap markers: failed writes, a full queue) or a damaged range (corrupt, torn) moves from
    ``heartbeat_gaps`` to ``gaps_over_data_loss``; the gap markers are listed under ``scan.data_loss``."""
    ranges = [(r["first_ms"], r["last_ms"]) for r in list(losses) + list(damaged) if r.get("first_ms") is not None]
    over, kept = [], []
    for gap in findings.get("heartbeat_gaps", []):
        hit = any(gap["start_ms"] <= last and gap["end_ms"] >= first for first, last in ranges)
        (over if hit else kept).append(gap)
    findings["heartbeat_gaps"] = kept
    findings["gaps_over_data_loss"] = over
    # an expiry needs the whole expiry time of silence: lost heartbeats in it make it unknown
    exp_over, exp_kept = [], []
    for row in findings.get("expired_clients", []):
        hit = any(row["last_heartbeat_ms"] <= last and row["expired_ms"] >= first for first, last in ranges)
        (exp_over if hit else exp_kept).append(row)
    if "expired_clients" in findings:
        findings["expired_clients"] = exp_kept
        findings["expired_over_data_loss"] = exp_over
    findings.setdefault("scan", {})["data_loss"] = losses
    # members of a group seem to leave (after the expiry) and rejoin around lost data: such size changes are
    # marked, not dropped (a real change may fall there too)
    expiry_ms = int(round(float((findings.get("parameters") or {}).get("expiry_s", 120.0)) * 1000))
    for series in findings.get("group_sizes", []):
        n = sum(1 for t, _ in series["series"] if any(first <= t <= last + expiry_ms for first, last in ranges))
        if n:
            series["changes_over_data_loss"] = n
    summary = findings.get("summary")
    if summary is not None:
        summary["heartbeat_gaps"] = len(kept)
        summary["gaps_over_data_loss"] = len(over)
        if "expired_clients" in findings:
            summary["expired_clients"] = len(exp_kept)
            summary["expired_over_data_loss"] = len(exp_over)
        summary["records_lost"] = sum(loss["records_lost"] for loss in losses)


def fleet_findings(findings: dict, brokers) -> dict:
    """Fleet-wide view of the findings of several brokers (rows tagged with ``broker``): counts per broker, the
    clients flapping or expiring on several brokers (a client that froze expires everywhere at once; one that
    expires on one broker only lost its way to that broker), and the groups seen on several brokers with their
    members on each (``uneven``: not the same number everywhere, e.g. members that never reached one broker)."""
    keys = [k for k in FINDING_KEYS + ("retry_topic_churn",) if k in findings]
    per = {b: {k: sum(1 for r in findings[k] if r.get("broker") == b) for k in keys} for b in brokers}
    several = []
    for k in ("flapping_clients", "expired_clients"):
        seen: Dict[str, set] = defaultdict(set)
        for r in findings.get(k, []):
            seen[r["client_id"]].add(r.get("broker"))
        several += [{"finding": k, "client_id": c, "brokers": sorted(b)} for c, b in sorted(seen.items()) if len(b) > 1]
    groups: Dict[Tuple[str, str], dict] = defaultdict(dict)
    for g in findings.get("group_sizes", []):
        groups[(g["group"], g["role"])][g.get("broker")] = [g["members"], g["max_members"]]
    spread = []
    for (group, role), on in sorted(groups.items()):
        if len(on) > 1:
            spread.append({"group": group, "role": role, "brokers": sorted(on),
                           "members": {b: on[b][0] for b in sorted(on)}, "max_members": {b: on[b][1] for b in sorted(on)},
                           "uneven": len({v[0] for v in on.values()}) > 1})
    return {"brokers": list(brokers), "per_broker": per, "clients_on_several_brokers": several,
            "groups_on_several_brokers": spread}


def combine_brokers(per_broker: Dict[str, dict]) -> dict:
    """One findings dict of several brokers' recording scans ({broker: findings}): every row tagged with its
    broker, the summary summed (clients: distinct over all brokers when the scans list ``_client_ids``), damage
    listed per broker, and ``fleet`` (:func:`fleet_findings`)."""
    lists = FINDING_KEYS + ("gaps_over_data_loss", "expired_over_data_loss")
    out: dict = {k: [{"broker": b, **r} for b, f in per_broker.items() for r in f.get(k, [])] for k in lists}
    out["member_addresses"] = [{"broker": b, **r} for b, f in per_broker.items() for r in f.get("member_addresses", [])]
    sums = [f["summary"] for f in per_broker.values()]
    ids = [f.get("_client_ids") for f in per_broker.values()]
    firsts = [x["first_ms"] for x in sums if x.get("first_ms") is not None]
    lasts = [x["last_ms"] for x in sums if x.get("last_ms") is not None]
    out["summary"] = {
        "records": sum(x["records"] for x in sums), "bad_bodies": sum(x["bad_bodies"] for x in sums),
        "clients": len(set().union(*ids)) if all(i is not None for i in ids) else max(x["clients"] for x in sums),
        "first_ms": min(firsts) if firsts else None, "last_ms": max(lasts) if lasts else None,
        **{k: len(out[k]) for k in lists},
        "records_lost": sum(x.get("records_lost", 0) for x in sums)}
    if any("clipped_bodies" in x for x in sums):
        out["summary"]["clipped_bodies"] = sum(x.get("clipped_bodies", 0) for x in sums)
    out["parameters"] = next(iter(per_broker.values()))["parameters"]
    scan: dict = {"method": None, "brokers": {}, "seconds": 0.0}
    for b, f in per_broker.items():
        sc = dict(f.get("scan") or {})
        scan["method"] = sc.get("method")
        scan["seconds"] = round(scan["seconds"] + (sc.get("seconds") or 0), 3)
        for k in ("torn_tails", "corrupt", "data_loss"):
            scan.setdefault(k, []).extend({"broker": b, **d} for d in sc.pop(k, []) or [])
        scan["brokers"][b] = sc
    out["scan"] = scan
    out["fleet"] = fleet_findings(out, list(per_broker))
    return out

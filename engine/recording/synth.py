"""Synthetic fleet recordings: N clients in G consumer groups heartbeating every 30 s for D days, written with the
recorder much faster than real time, with injected anomalies and a manifest of exactly what was injected.

The fleet mixes the dialects real brokers see (PROTOCOL.md 4.4): Java 5.x (V1, and V2 with light bodies after
the first full one), ali-ons (Node.js, claims language JAVA) and the C++ client (enum ordinals, subVersion as a
string, trailing newline). A group's members share one dialect and one subscription set, so the only
disagreements are the injected ones:

* ``inconsistent``: one member of a group switches to another subscription set for a while, then back;
* ``rolling_update``: every member of a group moves to a new subscription set, one after the other (a brief,
  legitimate disagreement that ``--min-duration`` is meant to drop);
* ``flapping``: a client reconnects over and over (new connection and port, immediate heartbeat each time);
* ``gap``: a client goes silent for minutes, then reconnects;
* ``resize``: a group grows (new client processes join) and later shrinks (some members stop).

Generation is vectorised: each client's life is a handful of sessions (connections) and phases (body
templates); a chunk of simulated time expands them into heartbeat times with numpy, picks prebuilt body bytes,
sorts by receive time and hands whole blocks to ``HeartbeatRecorder.record_batch``.

The manifest (``manifest.json`` beside the segments) lists the fleet, every injection with the exact receive
times a correct scan must report (derived from the generated heartbeats themselves), and each client's presence
intervals (first and last heartbeat of every stretch without a silence over the expiry), from which a test can
compute the true group size at any instant independently of the scan.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from engine.codec.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel
from engine.recording.recorder import HeartbeatRecorder

#: Broker expiry of a silent channel (channelExpiredTimeout), the default gap threshold of the scan.
EXPIRY_MS = 120_000
#: Receive jitter added to every heartbeat: 0 .. JITTER_MS - 1 ms (network and scheduling noise).
JITTER_MS = 20
MANIFEST_NAME = "manifest.json"
DIALECTS = ("java", "java_v2", "alions", "cpp")
#: MQVersion ordinals the dialects report (5.x Java, ali-ons and the C++ client from the captures).
DIALECT_VERSION = {"java": 453, "java_v2": 479, "alions": 121, "cpp": 63}
DIALECT_LANGUAGE = {"java": LanguageCode.JAVA, "java_v2": LanguageCode.JAVA, "alions": LanguageCode.JAVA, "cpp": LanguageCode.CPP}
_TAGS = ["TagA", "TagB", "TagC", "order", "pay", "refund", "vip", "audit", "*"]


@dataclass
class FleetConfig:
    """What to generate. Anomaly counts are upper bounds: a small fleet gets as many as fit."""

    clients: int = 200
    groups: int = 20
    days: float = 1.0
    interval_s: float = 30.0
    start_ms: int = 1_718_000_000_000
    seed: int = 1
    inconsistent: int = 2
    rolling_updates: int = 1
    flapping: int = 3
    gaps: int = 3
    resizing: int = 2
    #: reconnects of a flapping client, and their spacing (s); tuned to exceed 3 reconnects per 10 minutes
    flap_reconnects: int = 12
    flap_spacing_s: Tuple[float, float] = (40.0, 100.0)
    gap_minutes: Tuple[float, float] = (5.0, 40.0)
    inconsistent_minutes: Tuple[float, float] = (30.0, 180.0)
    rolling_step_s: float = 20.0


@dataclass
class _Client:
    idx: int
    client_id: str
    group: int
    dialect: str
    ip: str
    process_start: int
    producer_group: Optional[str] = None
    role: str = "base"  # base | joined (resize growth)


@dataclass
class _Group:
    idx: int
    name: str
    dialect: str
    model: MessageModel
    variants: List[List[Tuple[str, str]]] = field(default_factory=list)  # [(topic, expression)] per variant
    members: List[int] = field(default_factory=list)
    anomaly: Optional[str] = None


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class _Bodies:
    """Builds the body bytes of one client state in its dialect (Java through engine.encode_heartbeat)."""

    def __init__(self):
        import engine
        from engine.codec.heartbeat import build_subscription, heartbeat_fingerprint

        self.engine = engine
        self.build_subscription = build_subscription
        self.fingerprint = heartbeat_fingerprint

    def java(self, client: _Client, group: _Group, subs, light: bool) -> bytes:
        e = self.engine
        model = group.model
        sd = []
        if model == MessageModel.CLUSTERING:
            sd.append(self.build_subscription("%RETRY%" + group.name, "*", client.process_start))
        sd.extend(self.build_subscription(t, x, v) for t, x, v in subs)
        producers = [e.ProducerData("CLIENT_INNER_PRODUCER")]
        if client.producer_group:
            producers.append(e.ProducerData(client.producer_group))
        consumer = e.ConsumerData(
            group.name, ConsumeType.CONSUME_PASSIVELY, model, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, False, tuple(sd)
        )
        hb = e.HeartbeatData(client.client_id, tuple(producers), (consumer,), 0, False)
        if client.dialect == "java_v2":
            fp = self.fingerprint(hb) or 1  # 0 would mean V1
            if light:
                consumer = e.ConsumerData(consumer.group, consumer.consume_type, consumer.message_model,
                                          consumer.consume_from_where, False, ())
                hb = e.HeartbeatData(client.client_id, tuple(producers), (consumer,), fp, True)
            else:
                hb = e.HeartbeatData(client.client_id, tuple(producers), (consumer,), fp, False)
        return e.encode_heartbeat(hb)

    def alions(self, client: _Client, group: _Group, subs) -> bytes:
        # lib/mq_client.js key order; no expressionType, no retry subscription
        sd = []
        for t, x, v in subs:
            s = self.build_subscription(t, x, v)
            sd.append({"topic": t, "subString": s.sub_string, "classFilterMode": False, "tagsSet": list(s.tags),
                       "codeSet": list(s.codes), "subVersion": v})
        doc = {
            "clientID": client.client_id,
            "consumerDataSet": [{"groupName": group.name, "consumeType": "CONSUME_PASSIVELY",
                                 "messageModel": group.model.name, "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                 "subscriptionDataSet": sd, "unitMode": False}],
            "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
        }
        return _json(doc).encode()

    def cpp(self, client: _Client, group: _Group, subs) -> bytes:
        # rocketmq-client-cpp: sorted keys, enum ordinals, subVersion as a string, codeSet zeros, "\n" at the end
        sd = []
        if group.model == MessageModel.CLUSTERING:
            sd.append({"subString": "*", "subVersion": str(client.process_start), "topic": "%RETRY%" + group.name})
        for t, x, v in subs:
            s = self.build_subscription(t, x, v)
            entry = {"subString": s.sub_string, "subVersion": str(v), "topic": t}
            if s.tags:
                entry = {"codeSet": [0] * len(s.tags), "subString": s.sub_string, "subVersion": str(v),
                         "tagsSet": list(s.tags), "topic": t}
            sd.append(entry)
        doc = {
            "clientID": client.client_id,
            "consumerDataSet": [{"consumeFromWhere": 0, "consumeType": 1, "groupName": group.name,
                                 "messageModel": int(group.model), "subscriptionDataSet": sd}],
            "producerDataSet": [{"groupName": client.producer_group}] if client.producer_group else [],
        }
        return (_json(doc) + "\n").encode()

    def body(self, client: _Client, group: _Group, subs, light: bool) -> bytes:
        if client.dialect in ("java", "java_v2"):
            return self.java(client, group, subs, light)
        if client.dialect == "alions":
            return self.alions(client, group, subs)
        return self.cpp(client, group, subs)


def subscription_key(group: _Group, variant: int) -> List[List[str]]:
    """The subscription set members of ``group`` send in ``variant``: sorted [topic, type, subString] triples."""
    out = []
    if group.model == MessageModel.CLUSTERING and group.dialect != "alions":
        out.append(["%RETRY%" + group.name, "TAG", "*"])
    for t, x in group.variants[variant]:
        out.append([t, "TAG", "*" if x in ("", "*") else x])
    return sorted(out)


class _Progress:
    """A plain stderr progress bar (carriage returns on a terminal, a line per 10% otherwise)."""

    def __init__(self, total: int, enabled: bool, label: str = "generating"):
        self.total = max(1, total)
        self.enabled = enabled
        self.label = label
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.last_print = 0.0
        self.last_decile = -1

    def update(self, done: int, records: int):
        if not self.enabled:
            return
        now = time.perf_counter()
        frac = min(1.0, done / self.total)
        decile = int(frac * 10)
        if self.tty and now - self.last_print < 0.2 and frac < 1.0:
            return
        if not self.tty and decile == self.last_decile and frac < 1.0:
            return
        self.last_print, self.last_decile = now, decile
        el = now - self.t0
        rate = records / el if el > 0 else 0.0
        eta = el * (1 - frac) / frac if frac > 0 else 0.0
        bar = "#" * int(frac * 30)
        line = f"{self.label} [{bar:<30}] {frac * 100:5.1f}% {records:,} records {rate / 1e3:,.0f}k/s ETA {eta:4.0f}s"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and frac >= 1.0:
            sys.stderr.write("\n")
        sys.stderr.flush()


class FleetGenerator:
    """Plans a fleet with anomalies (constructor) and writes it (``write``)."""

    def __init__(self, config: FleetConfig):
        if config.clients < 1 or config.groups < 1 or config.days <= 0 or config.interval_s <= 0:
            raise ValueError("clients, groups, days and interval_s must be positive")
        self.cfg = config
        self.rng = np.random.default_rng(config.seed)
        self.period = int(round(config.interval_s * 1000))
        self.start = int(config.start_ms)
        self.end = self.start + int(round(config.days * 86_400_000))
        self.span = self.end - self.start
        self.groups: List[_Group] = []
        self.clients: List[_Client] = []
        # sessions: (client, start, end, immediate, conn_id, addr); phases: (client, tau, group-variant)
        self._sessions: List[list] = []
        self._phases: List[list] = []
        self.injections: Dict[str, list] = {"inconsistent_subscriptions": [], "flapping_clients": [],
                                            "heartbeat_gaps": [], "group_sizes": []}
        self._next_port = 30000
        self._plan()

    # ------------------------------------------------------------------ planning
    def _rand_ms(self, lo: float, hi: float) -> int:
        return int(self.rng.integers(int(lo), max(int(lo) + 1, int(hi))))

    def _new_client(self, group: _Group, process_start: int, role="base") -> _Client:
        idx = len(self.clients)
        ip = f"10.{(idx >> 16) & 255}.{(idx >> 8) & 255}.{idx & 255}"
        pid = int(self.rng.integers(1000, 65000))
        if group.dialect in ("java", "java_v2"):
            cid = f"{ip}@{pid}#{int(self.rng.integers(10**12, 10**13))}"
        elif group.dialect == "alions":
            cid = f"{ip}@{pid}"
        else:
            cid = f"{pid}-{ip}@DEFAULT"
        producer = None
        if self.rng.random() < 0.3:
            producer = f"PID_{group.name[4:]}"
        c = _Client(idx, cid, group.idx, group.dialect, ip, process_start, producer, role)
        self.clients.append(c)
        group.members.append(idx)
        self._phases.append([idx, -(1 << 60), 0])
        return c

    def _session(self, client: _Client, start: int, end: int, immediate: bool = True):
        self._next_port = 30000 + (self._next_port - 29999) % 30000
        self._sessions.append([client.idx, start, end, immediate, 0, f"{client.ip}:{self._next_port}".encode()])

    def _plan(self):
        cfg, rng = self.cfg, self.rng
        n_groups = min(cfg.groups, cfg.clients)
        apps = ["orders", "payments", "stock", "billing", "search", "mail", "audit", "users", "ledger", "push"]
        for g in range(n_groups):
            r = g % 10
            dialect = "cpp" if r in (1, 6) else "alions" if r == 3 else "java_v2" if r in (4, 8) else "java"
            model = MessageModel.BROADCASTING if g % 7 == 5 else MessageModel.CLUSTERING
            name = f"CID_{apps[g % len(apps)]}_{g:03d}"
            n_topics = 1 + g % 3
            base = []
            for k in range(n_topics):
                tags = rng.choice(_TAGS, size=1 + (g + k) % 3, replace=False).tolist()
                expr = "*" if "*" in tags else " || ".join(tags)
                base.append((f"Topic_{apps[(g + k) % len(apps)]}_{k}", expr))
            variant = base[:-1] + [(base[-1][0], "TagZ || " + base[-1][1].replace("*", "TagY"))]
            if len(base) > 1 and g % 2:
                variant = base + [(f"Topic_new_{g:03d}", "*")]
            self.groups.append(_Group(g, name, dialect, model, [base, variant]))
        # base members, round-robin, starting within the first interval
        for i in range(cfg.clients):
            group = self.groups[i % n_groups]
            start = self.start + self._rand_ms(0, self.period)
            c = self._new_client(group, start)
            self._session(c, start, self.end)

        usable = [g for g in self.groups if len(g.members) >= 3]
        rng.shuffle(usable)
        take = lambda k: [usable.pop() for _ in range(min(k, len(usable)))]  # noqa: E731
        span = self.span
        margin = 2 * self.period + EXPIRY_MS + 60_000  # an injection must settle before the recording ends
        fits = lambda t: t + margin < self.end  # noqa: E731
        for g in take(cfg.inconsistent):
            m = g.members[int(rng.integers(len(g.members)))]
            dur = min(self._rand_ms(cfg.inconsistent_minutes[0] * 60e3, cfg.inconsistent_minutes[1] * 60e3), span * 0.4)
            t0 = self.start + self._rand_ms(span * 0.1, span * 0.9 - dur)
            t1 = t0 + int(dur)
            if not fits(t1):
                break
            g.anomaly = "inconsistent"
            self._phases.append([m, t0, 1])
            self._phases.append([m, t1, 0])
            self.injections["inconsistent_subscriptions"].append(
                {"kind": "inconsistent", "group": g.name, "clients": [m], "injected_ms": [t0, t1]})
        for g in take(cfg.rolling_updates):
            t0 = self.start + self._rand_ms(span * 0.1, span * 0.8)
            step = int(cfg.rolling_step_s * 1000)
            if not fits(t0 + len(g.members) * step):
                break
            g.anomaly = "rolling_update"
            for i, m in enumerate(g.members):
                self._phases.append([m, t0 + i * step, 1])
            self.injections["inconsistent_subscriptions"].append(
                {"kind": "rolling_update", "group": g.name, "clients": list(g.members),
                 "injected_ms": [t0, t0 + (len(g.members) - 1) * step]})
        for g in take(cfg.resizing):
            if not fits(self.start + int(span * 0.8) + 60_000 + EXPIRY_MS):
                break
            g.anomaly = "resize"
            base = len(g.members)
            grow = max(2, base // 2)
            t_grow = self.start + self._rand_ms(span * 0.15, span * 0.4)
            t_shrink = self.start + self._rand_ms(span * 0.55, span * 0.8)
            joined = []
            for _ in range(grow):
                s = t_grow + self._rand_ms(0, 60_000)
                c = self._new_client(g, s, role="joined")
                self._session(c, s, self.end)
                joined.append(c.idx)
            # shrink: the first half of the joiners and one original member stop for good
            leavers = joined[: grow // 2 + 1] + [g.members[0]]
            for m in leavers:
                stop = t_shrink + self._rand_ms(0, 60_000)
                for s in self._sessions:
                    if s[0] == m and s[1] <= stop < s[2]:
                        s[2] = stop
            settle_grow = t_grow + 60_000 + self.period + JITTER_MS
            settle_shrink = t_shrink + 60_000 + EXPIRY_MS + JITTER_MS
            self.injections["group_sizes"].append({
                "group": g.name, "base_members": base, "joined": [self.clients[j].client_id for j in joined],
                "left": [self.clients[m].client_id for m in leavers],
                "schedule": [[self.start + self.period + JITTER_MS, base], [settle_grow, base + grow],
                             [settle_shrink, base + grow - len(leavers)]],
                "injected_ms": [t_grow, t_shrink],
            })
        # client anomalies on members of untouched groups (so group-level expectations stay exact)
        quiet = [m for g in self.groups if g.anomaly is None for m in g.members]
        rng.shuffle(quiet)
        for _ in range(min(cfg.flapping, len(quiet))):
            if not self._flap(quiet[-1], fits):
                break
            quiet.pop()
        for _ in range(min(cfg.gaps, len(quiet))):
            if not self._gap(quiet[-1], fits):
                break
            quiet.pop()
        # connection ids in order of connection time, as a server hands them out
        self._sessions.sort(key=lambda s: (s[1], s[0]))
        for i, s in enumerate(self._sessions, start=1):
            s[4] = i

    def _split_session(self, m: int, down_from: int, up_at: int):
        """Client m loses its connection at down_from and is back on a new one at up_at."""
        for s in self._sessions:
            if s[0] == m and s[1] <= down_from < s[2]:
                end = s[2]
                s[2] = down_from
                self._session(self.clients[m], up_at, end)
                return
        raise AssertionError("no session to split")

    def _flap(self, m: int, fits) -> bool:
        cfg = self.cfg
        n = cfg.flap_reconnects
        lo, hi = cfg.flap_spacing_s
        total = n * hi * 1000
        t = self.start + self._rand_ms(self.span * 0.1, max(self.span * 0.1 + 1, self.span * 0.9 - total))
        steps = []
        for _ in range(n):
            t += self._rand_ms(lo * 1000, hi * 1000)
            steps.append((t, self._rand_ms(500, 5000)))
        if not fits(t):
            return False
        times = []
        for t, down in steps:
            self._split_session(m, t - down, t)
            times.append(t)
        self.injections["flapping_clients"].append({"client_id": self.clients[m].client_id, "client": m,
                                                   "group": self.groups[self.clients[m].group].name,
                                                   "reconnects": n, "injected_ms": times})
        return True

    def _gap(self, m: int, fits) -> bool:
        lo, hi = self.cfg.gap_minutes
        dur = self._rand_ms(lo * 60e3, hi * 60e3)
        t0 = self.start + self._rand_ms(self.span * 0.1, max(self.span * 0.1 + 1, self.span * 0.9 - dur))
        if not fits(t0 + dur):
            return False
        self._split_session(m, t0, t0 + dur)
        self.injections["heartbeat_gaps"].append({"client_id": self.clients[m].client_id, "client": m,
                                                  "group": self.groups[self.clients[m].group].name,
                                                  "injected_ms": [t0, t0 + dur]})
        return True

    # ------------------------------------------------------------------ expansion
    def _arrays(self):
        s = self._sessions
        self.s_client = np.array([x[0] for x in s], dtype=np.int64)
        self.s_start = np.array([x[1] for x in s], dtype=np.int64)
        self.s_end = np.array([x[2] for x in s], dtype=np.int64)
        self.s_immediate = np.array([x[3] for x in s], dtype=bool)
        self.s_conn = np.array([x[4] for x in s], dtype=np.int64)
        self.s_addr = [x[5] for x in s]
        self.c_anchor = np.array([c.process_start + 1000 for c in self.clients], dtype=np.int64)
        self.c_lang = np.array([int(DIALECT_LANGUAGE[c.dialect]) for c in self.clients], dtype=np.uint8)
        self.c_version = np.array([DIALECT_VERSION[c.dialect] for c in self.clients], dtype=np.int32)
        self.c_v2 = np.array([c.dialect == "java_v2" for c in self.clients], dtype=bool)
        ph = sorted(self._phases, key=lambda p: (p[0], p[1]))
        self.p_client = np.array([p[0] for p in ph], dtype=np.int64)
        self.p_tau = np.array([p[1] for p in ph], dtype=np.int64)
        self.p_variant = np.array([p[2] for p in ph], dtype=np.int64)
        # search key: client in the high bits, time offset (>= 0 after clipping) in the low 42 bits
        self.p_key = (self.p_client << 42) + np.clip(self.p_tau - self.start + (1 << 41), 0, (1 << 42) - 1)

    def _templates(self):
        """Full (and, for V2 clients, light) body bytes of every phase."""
        bodies = _Bodies()
        cache: Dict[tuple, int] = {}
        self.templates: List[bytes] = []
        full = np.empty(len(self.p_client), dtype=np.int64)
        light = np.empty(len(self.p_client), dtype=np.int64)
        for i in range(len(self.p_client)):
            c = self.clients[int(self.p_client[i])]
            g = self.groups[c.group]
            variant = int(self.p_variant[i])
            # a subscription created at the phase start (the process start for the first phase)
            version = c.process_start if self.p_tau[i] < self.start else int(self.p_tau[i])
            subs = [(t, x, version) for t, x in g.variants[variant]]
            for light_flag, out in ((False, full), (True, light)):
                if light_flag and c.dialect != "java_v2":
                    out[i] = full[i]
                    continue
                key = (c.idx, variant, version, light_flag)
                tid = cache.get(key)
                if tid is None:
                    tid = cache[key] = len(self.templates)
                    self.templates.append(bodies.body(c, g, subs, light_flag))
                out[i] = tid
        self.p_full, self.p_light = full, light

    def _expand(self, sessions: np.ndarray, c0: int, c1: int):
        """Heartbeats of the given sessions whose receive time falls in [c0, c1): (recv, session index, seq)
        sorted by receive time then client. seq identifies the heartbeat within its session for the jitter."""
        lo_nominal = c0 - JITTER_MS
        st, en = self.s_start[sessions], self.s_end[sessions]
        keep = (st < c1) & (en > lo_nominal)
        sessions, st, en = sessions[keep], st[keep], en[keep]
        imm = self.s_immediate[sessions]
        cl = self.s_client[sessions]
        anchor = self.c_anchor[cl]
        P = self.period
        first_ok = np.maximum(np.maximum(st + imm, anchor), lo_nominal)
        hi = np.minimum(en, c1)
        k_lo = -((anchor - first_ok) // P)  # ceil((first_ok - anchor) / P)
        k_hi = -((anchor - hi) // P)
        cnt = np.maximum(k_hi - k_lo, 0)
        total = int(cnt.sum())
        rep = np.repeat(np.arange(len(sessions)), cnt)
        starts = np.cumsum(cnt) - cnt
        k = np.arange(total, dtype=np.int64) - np.repeat(starts, cnt) + np.repeat(k_lo, cnt)
        nominal = anchor[rep] + k * P
        sess = sessions[rep]
        # the immediate heartbeat on a new connection (seq -1 - session, distinct from periodic k >= 0)
        imm_mask = imm & (st >= lo_nominal) & (st < c1) & (st < en)
        nominal = np.concatenate([nominal, st[imm_mask]])
        sess = np.concatenate([sess, sessions[imm_mask]])
        k = np.concatenate([k, -1 - sessions[imm_mask]])
        client = self.s_client[sess]
        jitter = ((client * 2654435761 + k * 40503 + 12345) % 1000003) % JITTER_MS
        recv = nominal + jitter
        ok = (recv >= c0) & (recv < c1)
        recv, sess, k, client = recv[ok], sess[ok], k[ok], client[ok]
        order = np.lexsort((client, recv))
        return recv[order], sess[order], k[order]

    def client_heartbeats(self, m: int) -> np.ndarray:
        """Every receive time of client m over the whole recording (used for the manifest's exact spans)."""
        recv, _, _ = self._expand(np.flatnonzero(self.s_client == m), self.start, self.end)
        return recv

    def _phase_of(self, client: np.ndarray, recv: np.ndarray) -> np.ndarray:
        key = (client << 42) + np.clip(recv - self.start + (1 << 41), 0, (1 << 42) - 1)
        return np.searchsorted(self.p_key, key, side="right") - 1

    # ------------------------------------------------------------------ writing
    def write(self, directory, *, chunk_s: float = 3600.0, progress: bool = False, block_records: int = 4096,
              max_segment_bytes: int = 64 * 1024 * 1024, max_segment_age_s: float = 3600.0, level: int = 3) -> dict:
        """Generate the recording into ``directory`` and write the manifest there; returns the manifest."""
        t_start = time.perf_counter()
        directory = Path(directory)
        self._arrays()
        self._templates()
        n_clients = len(self.clients)
        last_sess = np.full(n_clients, -1, dtype=np.int64)
        last_phase = np.full(n_clients, -1, dtype=np.int64)
        last_recv = np.full(n_clients, -1, dtype=np.int64)
        presence: List[List[List[int]]] = [[] for _ in range(n_clients)]
        all_sessions = np.arange(len(self.s_client))
        chunk = int(chunk_s * 1000)
        bar = _Progress(self.span, progress)
        total = 0
        templates = self.templates
        with HeartbeatRecorder(directory, max_segment_bytes=max_segment_bytes, max_segment_age_s=max_segment_age_s,
                               block_records=block_records, level=level) as rec:
            for c0 in range(self.start, self.end, chunk):
                c1 = min(self.end, c0 + chunk)
                recv, sess, _ = self._expand(all_sessions, c0, c1)
                if len(recv) == 0:
                    continue
                client = self.s_client[sess]
                phase = self._phase_of(client, recv)
                # V2 clients send the full body first on a connection and after a change, light ones after that
                order = np.lexsort((recv, client))
                oc, os_, op, orcv = client[order], sess[order], phase[order], recv[order]
                prev_same = np.zeros(len(order), dtype=bool)
                prev_same[1:] = (oc[1:] == oc[:-1]) & (os_[1:] == os_[:-1]) & (op[1:] == op[:-1])
                first = np.ones(len(order), dtype=bool)
                first[1:] = oc[1:] != oc[:-1]
                carried = (last_sess[oc] == os_) & (last_phase[oc] == op)
                prev_same[first] = carried[first]
                light = np.empty(len(order), dtype=bool)
                light[order] = prev_same & self.c_v2[oc]
                # presence intervals (first/last heartbeat of each stretch without a silence over the expiry)
                prev_recv = np.empty(len(order), dtype=np.int64)
                prev_recv[1:] = orcv[:-1]
                prev_recv[first] = last_recv[oc[first]]
                starts = (prev_recv < 0) | (orcv - prev_recv > EXPIRY_MS)
                for i in np.flatnonzero(starts):
                    cidx = int(oc[i])
                    if presence[cidx]:
                        presence[cidx][-1][1] = int(prev_recv[i])  # the stretch before the silence ends here
                    presence[cidx].append([int(orcv[i]), int(orcv[i])])
                last_idx = np.flatnonzero(np.append(oc[1:] != oc[:-1], True))
                for i in last_idx:
                    presence[int(oc[i])][-1][1] = int(orcv[i])
                last_sess[oc[last_idx]] = os_[last_idx]
                last_phase[oc[last_idx]] = op[last_idx]
                last_recv[oc[last_idx]] = orcv[last_idx]

                tid = np.where(light, self.p_light[phase], self.p_full[phase])
                bodies = [templates[i] for i in tid.tolist()]
                addrs = [self.s_addr[i] for i in sess.tolist()]
                rec.record_batch(recv, self.s_conn[sess], addrs, self.c_lang[client], self.c_version[client], bodies)
                total += len(recv)
                bar.update(c1 - self.start, total)
        elapsed = time.perf_counter() - t_start
        manifest = self._manifest(total, presence, elapsed, int(last_recv.max()) if n_clients else self.end)
        (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))
        return manifest

    def _expiries(self, last_recv: int) -> List[dict]:
        """The silences over the expiry of the clients whose connections an injection ended (gaps, resize
        leavers, flapping), from their generated heartbeats: what the broker's channel-expiry scan removes."""
        picked = set()
        for a in self.injections["heartbeat_gaps"] + self.injections["flapping_clients"]:
            picked.add(a["client"])
        for a in self.injections["group_sizes"]:
            picked.update(c.idx for c in self.clients if c.client_id in set(a["left"]))
        out = []
        for m in sorted(picked):
            recv, sess, _ = self._expand(np.flatnonzero(self.s_client == m), self.start, self.end)
            for i in range(len(recv)):
                t = int(recv[i])
                nxt = int(recv[i + 1]) if i + 1 < len(recv) else None
                if (nxt is not None and nxt - t > EXPIRY_MS) or (nxt is None and t + EXPIRY_MS <= last_recv):
                    conn = int(self.s_conn[sess[i]])
                    on_conn = recv[self.s_conn[sess] == conn]
                    cause = "left" if nxt is None else "gap"
                    out.append({"client_id": self.clients[m].client_id, "cause": cause, "conn_id": conn,
                                "addr": self.s_addr[sess[i]].decode(), "connected_ms": int(on_conn[0]),
                                "last_heartbeat_ms": t, "expired_ms": t + EXPIRY_MS, "returned_ms": nxt})
        return sorted(out, key=lambda r: (r["expired_ms"], r["client_id"], r["conn_id"]))

    def _manifest(self, total: int, presence, elapsed: float, last_recv: Optional[int] = None) -> dict:
        anomalies = {k: [dict(v) for v in vs] for k, vs in self.injections.items()}
        anomalies["expired_clients"] = self._expiries(self.end if last_recv is None else last_recv)
        # exact expectations, from the heartbeats actually generated
        for a in anomalies["inconsistent_subscriptions"]:
            g = next(x for x in self.groups if x.name == a["group"])
            switch = []
            for m in a["clients"]:
                taus = sorted(p[1] for p in self._phases if p[0] == m and p[1] >= self.start)
                hb = self.client_heartbeats(m)
                switch.extend(int(hb[np.searchsorted(hb, t)]) for t in taus)
            a["expected_start_ms"], a["expected_end_ms"] = min(switch), max(switch)
            a["clients"] = [self.clients[m].client_id for m in a["clients"]]
            a["subscriptions"] = subscription_key(g, 0)
            a["variant_subscriptions"] = subscription_key(g, 1)
        for a in anomalies["flapping_clients"]:
            hb = self.client_heartbeats(a.pop("client"))
            a["expected_reconnect_ms"] = [int(hb[np.searchsorted(hb, t)]) for t in a["injected_ms"]]
        for a in anomalies["heartbeat_gaps"]:
            hb = self.client_heartbeats(a.pop("client"))
            t0, t1 = a["injected_ms"]
            i = int(np.searchsorted(hb, t1))
            a["expected_start_ms"], a["expected_end_ms"] = int(hb[i - 1]), int(hb[i])
            a["gap_s"] = (a["expected_end_ms"] - a["expected_start_ms"]) / 1000
        return {
            "format": "rmqhb-synth-manifest/1",
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.cfg).items()},
            "start_ms": self.start,
            "end_ms": self.end,
            "interval_s": self.period / 1000,
            "expiry_s": EXPIRY_MS / 1000,
            "records": total,
            "generation_s": round(elapsed, 3),
            "groups": [
                {"group": g.name, "dialect": g.dialect, "message_model": g.model.name, "anomaly": g.anomaly,
                 "subscriptions": subscription_key(g, 0),
                 "members": [self.clients[m].client_id for m in g.members]}
                for g in self.groups
            ],
            "clients": [
                {"client_id": c.client_id, "group": self.groups[c.group].name, "dialect": c.dialect,
                 "language": DIALECT_LANGUAGE[c.dialect].name, "producer_group": c.producer_group,
                 "role": c.role, "presence": presence[c.idx]}
                for c in self.clients
            ],
            "anomalies": anomalies,
        }


def expected_group_sizes(manifest: dict) -> Dict[str, List[List[int]]]:
    """The true live-member series of every consumer group, from the clients' presence intervals: a member is
    live from the first heartbeat of a presence interval until ``expiry`` after its last."""
    expiry = int(manifest["expiry_s"] * 1000)
    events: Dict[str, Dict[int, int]] = {}
    for c in manifest["clients"]:
        ev = events.setdefault(c["group"], {})
        for a, b in c["presence"]:
            ev[a] = ev.get(a, 0) + 1
            ev[b + expiry] = ev.get(b + expiry, 0) - 1
    out = {}
    for group, ev in events.items():
        total, series = 0, []
        for t in sorted(ev):
            if ev[t]:
                total += ev[t]
                series.append([t, total])
        out[group] = series
    return out


def compare_with_manifest(findings: dict, manifest: dict, min_duration_s: float = 0.0) -> List[str]:
    """Differences between scan findings and what the generator injected (empty when the scan found exactly
    the injections). Assumes the scan ran with the default expiry, gap threshold and flapping window."""
    problems = []
    a = manifest["anomalies"]
    want = {(x["group"], x["expected_start_ms"], x["expected_end_ms"])
            for x in a["inconsistent_subscriptions"]
            if x["expected_end_ms"] - x["expected_start_ms"] >= min_duration_s * 1000}
    got = {(x["group"], x["start_ms"], x["end_ms"]) for x in findings["inconsistent_subscriptions"]}
    if want != got:
        problems.append(f"inconsistent_subscriptions: missing {sorted(want - got)}, unexpected {sorted(got - want)}")
    for x in a["inconsistent_subscriptions"]:
        f = next((y for y in findings["inconsistent_subscriptions"] if y["group"] == x["group"]), None)
        if f is None:
            continue
        sets = sorted(v["subscriptions"] for v in f["variants"])
        if sets != sorted([x["subscriptions"], x["variant_subscriptions"]]):
            problems.append(f"{x['group']}: variants {sets} are not the injected subscription sets")
        if x["kind"] == "inconsistent":
            holders = next((v["clients"] for v in f["variants"] if v["subscriptions"] == x["variant_subscriptions"]), [])
            if holders != x["clients"]:
                problems.append(f"{x['group']}: variant held by {holders}, injected on {x['clients']}")
    want_flap = {x["client_id"]: x for x in a["flapping_clients"]}
    got_flap = {x["client_id"]: x for x in findings["flapping_clients"]}
    if set(want_flap) != set(got_flap):
        problems.append(f"flapping_clients: missing {sorted(set(want_flap) - set(got_flap))}, "
                        f"unexpected {sorted(set(got_flap) - set(want_flap))}")
    for cid in set(want_flap) & set(got_flap):
        if got_flap[cid]["reconnect_ms"] != want_flap[cid]["expected_reconnect_ms"]:
            problems.append(f"flapping {cid}: reconnects {got_flap[cid]['reconnect_ms']} != injected "
                            f"{want_flap[cid]['expected_reconnect_ms']}")
    want_gaps = {(x["client_id"], x["expected_start_ms"], x["expected_end_ms"]) for x in a["heartbeat_gaps"]}
    got_gaps = {(x["client_id"], x["start_ms"], x["end_ms"]) for x in findings["heartbeat_gaps"]}
    if want_gaps != got_gaps:
        problems.append(f"heartbeat_gaps: missing {sorted(want_gaps - got_gaps)}, unexpected {sorted(got_gaps - want_gaps)}")
    if "expired_clients" in a:  # (manifests before the expiry finding do not list it)
        keys = ("client_id", "conn_id", "addr", "connected_ms", "last_heartbeat_ms", "expired_ms", "returned_ms")
        want_exp = [{k: x[k] for k in keys} for x in a["expired_clients"]]
        got_exp = [{k: x.get(k) for k in keys} for x in findings.get("expired_clients", [])]
        if want_exp != got_exp:
            problems.append(f"expired_clients: missing {[x for x in want_exp if x not in got_exp]}, "
                            f"unexpected {[x for x in got_exp if x not in want_exp]}")
    sizes = {g["group"]: g["series"] for g in findings["group_sizes"] if g["role"] == "consumer"}
    for group, series in expected_group_sizes(manifest).items():
        if sizes.get(group) != series:
            problems.append(f"group_sizes {group}: series differs from the clients' presence")
    for r in a["group_sizes"]:
        series = sizes.get(r["group"], [])
        for t, n in r["schedule"]:
            at = [m for ms, m in series if ms <= t]
            if not at or at[-1] != n:
                problems.append(f"group_sizes {r['group']}: {at[-1] if at else None} members at {t}, injected {n}")
    return problems


def generate(directory, config: Optional[FleetConfig] = None, **write_options) -> dict:
    """Generate a synthetic recording into ``directory``; returns the manifest (also written as manifest.json)."""
    return FleetGenerator(config or FleetConfig()).write(directory, **write_options)


def load_manifest(directory) -> dict:
    return json.loads((Path(directory) / MANIFEST_NAME).read_text())


#: options of `rmqhb generate` (either format) that take no value: what follows them is a positional
_GENERATE_FLAGS = ("--no-progress", "--gzip", "--no-anomalies", "--history", "-h", "--help")


def _output_dir(argv) -> Optional[Path]:
    """The OUT_DIR of a `rmqhb generate` command line (its first positional), before either parser reads it."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith("-") and a != "-":
            skip = "=" not in a and a not in _GENERATE_FLAGS
        else:
            return Path(a)
    return None


def generate_main(argv=None) -> int:
    """`rmqhb generate OUT_DIR [--format recording|broker-log]`: write a synthetic fleet recording (or, with
    ``--format broker-log``, RocketMQ broker logs: engine.bindings.brokerlog) with injected anomalies and a
    manifest. Exit status: 0 written; 2 bad arguments (one line, before anything is written); 1 a write failed
    (one line); 130 interrupted (Ctrl-C): what was written so far is removed, so no partial output remains."""
    argv = list(sys.argv[1:] if argv is None else argv)
    fmt = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--format"), None)
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), fmt)
    if fmt not in (None, "recording", "broker-log"):
        print(f"rmqhb generate: --format is recording or broker-log, not {fmt!r}", file=sys.stderr)
        return 2
    out = _output_dir(argv)
    if out is not None and not any(a in ("-h", "--help") for a in argv):
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            print(f"rmqhb generate: {out} exists and is not a directory; give a new or empty directory",
                  file=sys.stderr)
            return 2
        blocker = next((q for q in out.parents if q.exists() and not q.is_dir()), None)
        if blocker is not None:
            print(f"rmqhb generate: {blocker} is not a directory; cannot create {out}", file=sys.stderr)
            return 2
    if fmt == "broker-log":
        from engine.bindings.brokerlog import generate_main as broker_log_generate_main

        return _writing(out, lambda: broker_log_generate_main(argv))
    argv = [a for i, a in enumerate(argv) if not (a.startswith("--format") or (i and argv[i - 1] == "--format"))]
    d = FleetConfig()
    p = argparse.ArgumentParser(prog="rmqhb generate", description=generate_main.__doc__)
    p.add_argument("out", type=Path, help="recording directory (created)")
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--groups", type=int, default=d.groups)
    p.add_argument("--days", type=float, default=d.days)
    p.add_argument("--interval", type=float, default=d.interval_s, help="heartbeat period, seconds")
    p.add_argument("--start-ms", type=int, default=d.start_ms)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--inconsistent", type=int, default=d.inconsistent, help="groups with a deviating member")
    p.add_argument("--rolling", type=int, default=d.rolling_updates, help="groups with a rolling update")
    p.add_argument("--flapping", type=int, default=d.flapping, help="flapping clients")
    p.add_argument("--gaps", type=int, default=d.gaps, help="clients going silent for minutes")
    p.add_argument("--resizing", type=int, default=d.resizing, help="groups that grow and shrink")
    p.add_argument("--records", type=int, default=None,
                   help="aim for about this many heartbeats (sets --days from --clients and --interval)")
    p.add_argument("--block-records", type=int, default=4096)
    p.add_argument("--segment-mb", type=float, default=64.0)
    p.add_argument("--segment-age-s", type=float, default=3600.0)
    p.add_argument("--level", type=int, default=3, help="zstd level")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    problem = _bad_generate_args(args)
    if problem:
        print(f"rmqhb generate: {problem}", file=sys.stderr)
        return 2
    days = args.days
    if args.records:
        days = args.records * args.interval / args.clients / 86400
    cfg = FleetConfig(
        clients=args.clients, groups=args.groups, days=days, interval_s=args.interval, start_ms=args.start_ms,
        seed=args.seed, inconsistent=args.inconsistent, rolling_updates=args.rolling, flapping=args.flapping,
        gaps=args.gaps, resizing=args.resizing,
    )
    if args.out.exists() and any(args.out.glob("*.seg")):
        print(f"{args.out} already holds segments; use an empty directory", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    written = {}

    def write():
        written["manifest"] = FleetGenerator(cfg).write(
            args.out, progress=not args.no_progress, block_records=args.block_records,
            max_segment_bytes=int(args.segment_mb * 1024 * 1024), max_segment_age_s=args.segment_age_s,
            level=args.level,
        )
        return 0

    status = _writing(args.out, write)
    if status:
        return status
    manifest = written["manifest"]
    el = max(time.perf_counter() - t0, 1e-9)
    a = manifest["anomalies"]
    size = sum(f.stat().st_size for f in args.out.glob("*.seg"))
    print(
        f"{manifest['records']:,} heartbeats from {len(manifest['clients'])} clients in {len(manifest['groups'])} groups "
        f"over {days:g} days in {el:.1f} s ({manifest['records'] / el / 1e3:,.0f}k/s), {size / 1e6:.1f} MB of segments"
    )
    print(
        f"injected: {len(a['inconsistent_subscriptions'])} subscription disagreements, {len(a['flapping_clients'])} "
        f"flapping clients, {len(a['heartbeat_gaps'])} gaps, {len(a['group_sizes'])} resizing groups "
        f"-> {args.out / MANIFEST_NAME}"
    )
    return 0


def _bad_generate_args(args) -> Optional[str]:
    """What is wrong with a recording's `rmqhb generate` arguments (one line), or None."""
    if args.clients < 1 or args.groups < 1:
        return "--clients and --groups must be at least 1"
    if args.records is not None and args.records < 1:
        return "--records must be at least 1"
    if not args.days > 0 or not math.isfinite(args.days):
        return f"--days must be a positive number of days, not {args.days:g}"
    if not args.interval > 0 or not math.isfinite(args.interval):
        return f"--interval must be a positive number of seconds, not {args.interval:g}"
    for name in ("inconsistent", "rolling", "flapping", "gaps", "resizing"):
        if getattr(args, name) < 0:
            return f"--{name} must be 0 or more"
    if args.block_records < 1 or not args.segment_mb > 0 or not args.segment_age_s > 0:
        return "--block-records, --segment-mb and --segment-age-s must be positive"
    if not -7 <= args.level <= 22:
        return f"--level is a zstd level (-7 .. 22), not {args.level}"
    return None


def _writing(out: Optional[Path], write) -> int:
    """Run ``write()`` (which fills ``out``) so that a failure is one line and no partial output that looks
    complete is left: on Ctrl-C (status 130) or an OS error (status 1) whatever it created under ``out`` is
    removed (the directory itself when it did not exist before; an existing directory keeps only what it held)."""
    import shutil

    existed = out is not None and out.is_dir()
    before = set(out.iterdir()) if existed else set()

    def remove_partial() -> str:
        if out is None:
            return ""
        try:
            if not existed:
                shutil.rmtree(out, ignore_errors=True)
            else:
                for q in set(out.iterdir()) - before:
                    shutil.rmtree(q, ignore_errors=True) if q.is_dir() and not q.is_symlink() else q.unlink()
        except OSError:
            return f"; the partial output in {out} could not all be removed: delete it"
        return f"; the partial output in {out} was removed"

    try:
        return write()
    except KeyboardInterrupt:
        if sys.stderr.isatty():  # end the progress bar's line
            sys.stderr.write("\n")
        print(f"rmqhb generate: interrupted{remove_partial()}", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"rmqhb generate: cannot write {e.filename or out}: {e.strerror or e}{remove_partial()}",
              file=sys.stderr)
        return 1

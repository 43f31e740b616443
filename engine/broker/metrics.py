"""Counters of the broker front end and a Prometheus text endpoint (exposition format 0.0.4, stdlib only).

Counters are plain integer attributes bumped on the hot path (no locks: everything runs on the event loop).
Per-group gauges (clients and channels per consumer/producer group) are computed from the registry at scrape
time, so the heartbeat path pays nothing for them.
"""
from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections import Counter, deque

log = logging.getLogger("engine.broker.metrics")

#: connections the metrics endpoint (metricsPort) serves at once, its share of maxConnections; past it a new one
#: is closed at accept (counted in connections_refused_total{listener="metrics"})
METRICS_MAX_CONNECTIONS = 16


class Metrics:
    """Event counters; ``heartbeats_per_second`` is the rate over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 10.0, clock=time.monotonic):
        self.clock = clock
        self.window_s = window_s
        self.heartbeats = 0
        #: request code -> count; codes the broker has no processor for are counted under "other", so a client
        #: sending every int32 cannot grow this table or the /metrics page
        self.requests = Counter()
        self.frame_errors = 0
        self.heartbeat_errors = 0
        self.acl_denied = 0
        self.expired_channels = 0
        self.notifications_sent = 0
        self.connections_accepted = 0
        self.connections_closed = Counter()  # reason -> count
        self.connections_rejected = Counter()  # limit name -> count
        #: listener (remoting, metrics) -> connections refused by its share of maxConnections (the gRPC port's are
        #: closed by grpcio itself, which counts none)
        self.connections_refused = Counter()
        #: listener -> accepts that failed (out of descriptors or memory), counted, logged once a minute
        self.accept_errors = Counter()
        #: listener -> its share of maxConnections; local port -> listener name (set as the listeners start)
        self.listener_limits: dict[str, int] = {}
        self.listener_ports: dict[int, str] = {}
        #: listener -> a callable giving its open connections (read at scrape time)
        self.listener_open: dict = {}
        self.overloaded = Counter()  # executor -> requests refused with SYSTEM_BUSY
        self.queue_timeouts = Counter()  # executor -> requests answered SYSTEM_BUSY after waiting too long
        #: kind -> requests answered SYSTEM_ERROR because they could not be served (bad_request, internal_error,
        #: answer_too_large, encode_failed)
        self.request_errors = Counter()
        #: kind -> unexpected failures outside a request's own answer: dispatch_failed (that connection was closed),
        #: sweep_failed (a pass of the once-a-second connection sweep; the next still runs)
        self.internal_errors = Counter()
        self.register_broker_ok = 0
        self.register_broker_failed = 0
        #: reason -> gRPC (5.x) requests and streams refused to protect what all clients share (GrpcEndpoint.refused)
        self.grpc_refused = Counter()
        self._samples: deque = deque()  # (time, heartbeats) once per sample() call

    def sample(self) -> None:
        """Record (now, heartbeats) for the rate; the server calls it every second."""
        now = self.clock()
        self._samples.append((now, self.heartbeats))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    @property
    def heartbeats_per_second(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, h0), (t1, h1) = self._samples[0], self._samples[-1]
        return (h1 - h0) / (t1 - t0) if t1 > t0 else 0.0


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self):
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, samples) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if labels:
                lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
                self.lines.append(f"{name}{{{lab}}} {_num(value)}")
            else:
                self.lines.append(f"{name} {_num(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _num(v) -> str:
    if isinstance(v, float):
        return repr(v) if v == v else "NaN"
    return str(int(v))


def _code_samples(metrics: Metrics):
    codes = sorted(c for c in metrics.requests if c != "other")
    samples = [({"code": c}, metrics.requests[c]) for c in codes]
    if metrics.requests.get("other"):
        samples.append(({"code": "other"}, metrics.requests["other"]))
    return samples


def render(metrics: Metrics, connections: int, group_stats=None, *, max_group_series: int = 1000,
           auto_create_refused=None, recorder=None, hb_cache=None) -> str:
    """The exposition text. ``group_stats`` yields (role, group, clients, channels) for the per-group gauges, of
    which at most ``max_group_series`` are written (the most clients first; 0 = none)."""
    w = _Writer()
    p = "rocketmq_broker_"
    w.metric(p + "connections", "gauge", "Open client connections.", [({}, connections)])
    w.metric(p + "connections_accepted_total", "counter", "Connections accepted.", [({}, metrics.connections_accepted)])
    w.metric(p + "connections_closed_total", "counter", "Connections closed by the broker or the peer, by reason.",
             [({"reason": r}, n) for r, n in sorted(metrics.connections_closed.items())])
    w.metric(p + "connections_rejected_total", "counter", "Connections refused by a limit.",
             [({"limit": r}, n) for r, n in sorted(metrics.connections_rejected.items())])
    w.metric(p + "connections_refused_total", "counter",
             "Connections refused at accept because their listener's share of maxConnections was taken, by listener.",
             [({"listener": k}, n) for k, n in sorted(metrics.connections_refused.items())])
    w.metric(p + "accept_errors_total", "counter",
             "Accepts that failed (the process out of descriptors or memory), by listener.",
             [({"listener": k}, n) for k, n in sorted(metrics.accept_errors.items())])
    w.metric(p + "listener_connection_limit", "gauge", "Each listener's share of maxConnections.",
             [({"listener": k}, n) for k, n in sorted(metrics.listener_limits.items())])
    open_now = [(k, fn()) for k, fn in sorted(metrics.listener_open.items())]
    w.metric(p + "listener_connections", "gauge", "Open connections of each listener (gRPC: as grpcio's channelz sees "
             "them).", [({"listener": k}, n) for k, n in open_now if n is not None])
    w.metric(p + "heartbeats_total", "counter", "HEART_BEAT requests processed.", [({}, metrics.heartbeats)])
    w.metric(p + "heartbeats_per_second", "gauge", f"HEART_BEAT rate over the last {metrics.window_s:g} s.",
             [({}, float(metrics.heartbeats_per_second))])
    w.metric(p + "requests_total", "counter", "Requests by request code (codes the broker does not serve: other).",
             _code_samples(metrics))
    w.metric(p + "request_errors_total", "counter", "Requests answered SYSTEM_ERROR because they could not be served.",
             [({"kind": k}, n) for k, n in sorted(metrics.request_errors.items())])
    w.metric(p + "internal_errors_total", "counter", "Unexpected failures outside a request's answer, by kind.",
             [({"kind": k}, n) for k, n in sorted(metrics.internal_errors.items())])
    w.metric(p + "decode_errors_total", "counter", "Undecodable frames and heartbeat bodies.",
             [({"kind": "frame"}, metrics.frame_errors), ({"kind": "heartbeat"}, metrics.heartbeat_errors)])
    w.metric(p + "acl_denied_total", "counter", "Requests refused with NO_PERMISSION.", [({}, metrics.acl_denied)])
    w.metric(p + "overload_total", "counter", "Requests refused with SYSTEM_BUSY because an executor queue was full.",
             [({"executor": e}, n) for e, n in sorted(metrics.overloaded.items())])
    w.metric(p + "queue_timeout_total", "counter",
             "Requests answered SYSTEM_BUSY because they waited in an executor queue past its limit (fast failure).",
             [({"executor": e}, n) for e, n in sorted(metrics.queue_timeouts.items())])
    w.metric(p + "expired_channels_total", "counter", "Channels removed by the expiry scan.", [({}, metrics.expired_channels)])
    w.metric(p + "notifications_sent_total", "counter", "NOTIFY_CONSUMER_IDS_CHANGED requests sent.",
             [({}, metrics.notifications_sent)])
    w.metric(p + "register_broker_total", "counter", "REGISTER_BROKER calls to name servers, by outcome.",
             [({"result": "ok"}, metrics.register_broker_ok), ({"result": "failed"}, metrics.register_broker_failed)])
    if metrics.grpc_refused:
        w.metric(p + "grpc_refused_total", "counter", "gRPC (5.x) requests and streams refused to protect what all "
                 "clients share, by reason (another connection's client id, an address's share, Settings bytes, "
                 "a stream without Settings).", [({"reason": r}, n) for r, n in sorted(metrics.grpc_refused.items())])
    if hb_cache is not None:  # engine.broker.repeat.CacheBudget (maxHeartbeatCacheBytesTotal)
        w.metric(p + "heartbeat_cache_bytes", "gauge",
                 "Heartbeat bytes the connections keep after their reads (cached bodies, armed repeat patterns).",
                 [({}, hb_cache.used)])
        w.metric(p + "heartbeat_cache_full_total", "counter",
                 "Heartbeats that kept nothing (no cached decode, no repeat route) because maxHeartbeatCacheBytesTotal "
                 "was reached.", [({}, hb_cache.full)])
    if recorder is not None:
        w.metric(p + "recorder_records_written_total", "counter", "Heartbeats written to the recording.",
                 [({}, recorder.records_written)])
        w.metric(p + "recorder_records_dropped_total", "counter",
                 "Heartbeats not recorded (served all the same), by reason; the loss is marked in the recording.",
                 [({"reason": r}, n) for r, n in sorted(recorder.dropped.items())])
        w.metric(p + "recorder_records_clipped_total", "counter",
                 "Heartbeats recorded clipped (their first bytes, size and reason), by reason: undecodable, past "
                 "their connection's share (recordConnectionShareBytes), or past all connections' total "
                 "(recordQueueBytes, queue_bytes).",
                 [({"reason": r}, n) for r, n in sorted(recorder.clipped.items())])
        w.metric(p + "recorder_queue_blocks", "gauge", "Blocks waiting for the recorder's writer thread.",
                 [({}, recorder.queued_blocks)])
    if auto_create_refused is not None:
        w.metric(p + "auto_create_refused_total", "counter",
                 "Groups and topics not auto-created because their table is at its limit.",
                 [({"kind": k}, auto_create_refused.get(k, 0)) for k in ("group", "topic", "topic_ip_share", "topic_table")])
    stats = list(group_stats or ())
    kept = heapq.nsmallest(max_group_series, stats, key=lambda s: (-s[2], s[0], s[1])) if max_group_series > 0 else []
    clients, channels = [], []
    for role, group, n_clients, n_channels in sorted(kept, key=lambda s: (s[0], s[1])):
        clients.append(({"role": role, "group": group}, n_clients))
        channels.append(({"role": role, "group": group}, n_channels))
    w.metric(p + "group_clients", "gauge", "Distinct client ids registered in a group.", clients)
    w.metric(p + "group_channels", "gauge", "Connections registered in a group.", channels)
    w.metric(p + "group_series_dropped", "gauge",
             f"Groups left out of the per-group series (metricsMaxGroupSeries={max_group_series}).",
             [({}, len(stats) - len(kept))])
    return w.text()


class MetricsEndpoint:
    """A minimal HTTP/1.1 server on the event loop answering GET /metrics (anything else: 404). At most
    ``max_connections`` at once (its share of maxConnections): a connection past it is closed at accept and
    counted in ``metrics.connections_refused["metrics"]``."""

    def __init__(self, render_fn, host: str = "127.0.0.1", port: int = 0, *, metrics: Metrics | None = None,
                 max_connections: int | None = None):
        self.render_fn = render_fn
        self.host, self.port = host, port
        self.metrics = metrics
        self.max_connections = METRICS_MAX_CONNECTIONS if max_connections is None else max_connections
        self.active = 0  # connections being served
        self.refused = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.metrics is not None:
            self.metrics.listener_limits["metrics"] = self.max_connections
            self.metrics.listener_ports[self.port] = "metrics"
            self.metrics.listener_open["metrics"] = lambda: self.active
        log.info("metrics endpoint on http://%s:%d/metrics", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.max_connections:
            self.refused += 1
            if self.metrics is not None:
                self.metrics.connections_refused["metrics"] += 1
            writer.transport.abort()  # its descriptor back at once
            return
        self.active += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) >= 2 and parts[0] in ("GET", "HEAD") and parts[1].split("?")[0] in ("/metrics", "/"):
                body = self.render_fn().encode("utf-8")
                status, ctype = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
            else:
                body, status, ctype = b"not found\n", "404 Not Found", "text/plain"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (body if parts and parts[0] != "HEAD" else b"")
            )
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self.active -= 1
            writer.close()


# ---- the gRPC port's connections, as grpcio's channelz sees them (grpcio accepts them itself)


def _cygrpc():
    try:
        from grpc._cython import cygrpc
    except ImportError:
        return None
    return cygrpc


def channelz_server_ids() -> set[int]:
    """Ids of the gRPC servers of this process (channelz, on by default); empty when it cannot be read."""
    cygrpc = _cygrpc()
    if cygrpc is None:
        return set()
    try:
        return {int(s["ref"]["serverId"]) for s in json.loads(cygrpc.channelz_get_servers(0)).get("server", ())}
    except Exception:  # a grpcio without channelz, or another answer: the gauge is left out
        return set()


def channelz_connections(server_id: int) -> int | None:
    """Open connections of one gRPC server (channelz's server sockets, a page of 1,000 at a time); None when they
    cannot be read."""
    cygrpc = _cygrpc()
    if cygrpc is None:
        return None
    n, start = 0, 0
    try:
        while True:
            page = json.loads(cygrpc.channelz_get_server_sockets(server_id, start, 1000))
            refs = page.get("socketRef", ())
            n += len(refs)
            if page.get("end", True) or not refs:
                return n
            start = int(refs[-1]["socketId"]) + 1
    except Exception:
        return None

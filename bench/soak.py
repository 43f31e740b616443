"""Soak: N clients on their own connections heartbeating a broker every 30 s for D seconds (bench only, not CI).

The broker runs as its own process (``python -m engine serve``); the clients are bench/loadgen.py's simulated
MQClientInstances (``steady`` scenario, open loop at N/30 heartbeats/s, so each connection heartbeats every 30 s
as a Java client does), spread over several processes. Every 10 s the soak samples the broker's RSS and open file
descriptors from /proc and scrapes its metrics endpoint.

Pass criteria (issue 6): RSS flat within 5% once the fleet has settled (every sample from ``--settle`` seconds
after the last client registered to the end of the run within +-5% of the first of them: the registration storm's
transient memory, NOTIFY write buffers above all, is released in the first tens of seconds and is no leak; the
RSS right after registration and the peak are reported too); zero lost
registrations (registered channels == N at every sample once registered); zero unexpected expiries
(rocketmq_broker_expired_channels_total stays 0); every heartbeat answered; file descriptors returned once the
clients leave: back to the count before they came, except that each process's event loop may have opened libuv's
reserve descriptor (``/dev/null``, opened once per loop on its first TCP handle, kept for accept's EMFILE
handling), at most one per process.

    python bench/soak.py --clients 19900 --duration 600 --procs 4 --json soak.json

One process may hold at most ``ulimit -Hn`` descriptors; the broker needs a few for itself, so N must stay below
that limit (20000 on the machine of the recorded run, hence 19900) unless the broker runs I/O worker processes:

    python bench/soak.py --clients 20000 --duration 600 --procs 4 --io-workers 2 --json soak-w2.json
    python bench/soak.py --clients 20000 --duration 660 --procs 4 --io-workers 1 --core-connections 19744 \
        --json soak-core.json         # the core serves 19,744 itself, one worker the rest

With ``--io-workers`` the client sockets live in the workers (engine.broker.ioworker); RSS and descriptors are then the
sums over the broker process and its workers (replacements included), and each is also reported per process.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import loadgen  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pids) -> dict:
    """Open descriptors of the processes by kind (socket, pipe, anon_inode:[eventpoll], a file's path...)."""
    kinds: dict = {}
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            kind = target.split(":[")[0] if target.startswith(("socket:", "pipe:")) else target
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {"group_channels": 0}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        if name == "rocketmq_broker_connections":
            out["connections"] = int(float(value))
        elif name == "rocketmq_broker_expired_channels_total":
            out["expired"] = int(float(value))
        elif name == "rocketmq_broker_heartbeats_total":
            out["heartbeats"] = int(float(value))
        elif name.startswith("rocketmq_broker_group_channels{") and 'role="consumer"' in name:
            out["group_channels"] += int(float(value))
        elif name.startswith("rocketmq_broker_connections_closed_total{"):
            reason = re.search(r'reason="([^"]+)"', name).group(1)
            out.setdefault("closed", {})[reason] = int(float(value))
    return out


class Sampler(threading.Thread):
    def __init__(self, pid: int, metrics_port: int, every: float = 10.0):
        super().__init__(daemon=True)
        self.pid, self.port, self.every = pid, metrics_port, every
        self.samples: list[dict] = []
        self.stop = threading.Event()

    def sample(self) -> dict:
        pids = [self.pid] + loadgen.child_pids(self.pid)  # the broker and its I/O workers, if any
        per = {}
        for pid in pids:
            try:
                per[pid] = (rss_bytes(pid), fd_count(pid))
            except OSError:  # exited between the listing and the read
                pass
        s = {"t": time.monotonic(), "rss": sum(r for r, _ in per.values()), "fds": sum(f for _, f in per.values())}
        if len(per) > 1:
            s["per_process"] = {str(pid): {"rss_mb": round(r / 2**20, 1), "fds": f} for pid, (r, f) in per.items()}
        try:
            s.update(scrape(self.port))
        except OSError as e:
            s["scrape_error"] = str(e)
        self.samples.append(s)
        return s

    def run(self):
        while not self.stop.wait(self.every):
            self.sample()


PROBE_BODY = (b'{"clientID":"127.0.0.1@soak-probe","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
              b'"consumeType":"CONSUME_PASSIVELY","groupName":"CID_soak_probe","messageModel":"CLUSTERING",'
              b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*",'
              b'"subVersion":1718000000000,"tagsSet":[],"topic":"TopicSoakProbe"}],"unitMode":false}],'
              b'"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],"withoutSub":false}')


class Probe(threading.Thread):
    """One more client on its own connection, heartbeating once a second: the broker's answer time as a time
    series, independent of the load generator's own backlog (its processes share the machine)."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        import engine

        self.engine = engine
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.decoder = engine.FrameDecoder()
        self.points: list[tuple[float, float]] = []  # (monotonic send time, round trip s)
        self.stop = threading.Event()

    def call(self, opaque: int) -> float:
        cmd = self.engine.RemotingCommand(34, opaque=opaque, ext_fields={}, body=PROBE_BODY)
        t0 = time.monotonic()
        self.sock.sendall(cmd.encode())
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the probe")
            for c in self.decoder.feed(data):
                if c.is_response and c.opaque == opaque:
                    if c.code != 0:
                        raise RuntimeError(f"probe heartbeat answered {c.code} {c.remark}")
                    return time.monotonic() - t0

    def run(self):
        opaque = 0
        while not self.stop.wait(1.0):
            opaque += 1
            t = time.monotonic()
            self.points.append((t, self.call(opaque)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=19_900)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--interval", type=float, default=30.0, help="heartbeat period per client (s)")
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--io-workers", type=int, default=0, help="the broker's ioWorkers (0 = in-process socket I/O)")
    p.add_argument("--core-connections", type=int, default=0,
                   help="the broker's ioCoreConnections (with --io-workers: connections the core serves itself)")
    p.add_argument("--settle", type=float, default=60.0,
                   help="seconds after registration before the RSS baseline (the storm's buffers are released)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if args.io_workers:
        max_conn = args.clients + 1024
        if args.clients // args.procs > hard - 64:
            raise SystemExit(f"--clients/--procs needs more descriptors than one load process may hold ({hard})")
    else:
        max_conn = hard
        if args.clients > hard - 64:
            raise SystemExit(f"--clients {args.clients} needs more descriptors than one process may hold ({hard})")
    port, mport = free_port(), free_port()
    store = tempfile.mkdtemp(prefix="soak-store-")
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def raise_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    broker = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--listenPort", str(port), "--listenHost", "127.0.0.1",
         "--fastPortEnable", "false", "--storePathRootDir", store, "--maxConnections", str(max_conn),
         "--ioWorkers", str(args.io_workers), "--ioCoreConnections", str(args.core_connections),
         "--metrics-port", str(mport), "--log-level", "WARNING"],
        env=env, preexec_fn=raise_limit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = broker.stdout.readline()
        if "boot success" not in line:
            raise SystemExit(f"broker did not start: {line}{broker.stdout.read()}")
        threading.Thread(target=lambda: [None for _ in broker.stdout], daemon=True).start()  # keep the pipe drained
        sampler = Sampler(broker.pid, mport)
        base = sampler.sample()
        kinds_before = fd_kinds([broker.pid] + loadgen.child_pids(broker.pid))
        sampler.start()
        probe = Probe(port)
        probe.start()
        t0 = time.monotonic()
        res = loadgen.run("steady", "127.0.0.1", port, args.clients, procs=args.procs, duration=args.duration,
                          rate=args.clients / args.interval, groups=args.groups, consumer_share=1.0,
                          server_pid=broker.pid)
        run_s = time.monotonic() - t0
        probe.stop.set()
        probe.join(30)
        probe.sock.close()
        # clients are gone (loadgen unregistered and closed them): let the broker notice, then count again
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = sampler.sample()
            if s.get("connections") == 0 and s["fds"] <= base["fds"] + 1 + len(loadgen.child_pids(broker.pid)):
                break
            time.sleep(1)
        sampler.stop.set()
        after = sampler.samples[-1]
        procs_after = [broker.pid] + loadgen.child_pids(broker.pid)
        kinds_after = fd_kinds(procs_after)
        n_procs = len(procs_after)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()

    # the steady window: samples where every client (and the probe) was registered
    expected = args.clients + 1
    steady = [s for s in sampler.samples if s.get("group_channels") == expected]
    first, last = (steady[0], steady[-1]) if steady else (None, None)
    window = [s for s in sampler.samples if first and first["t"] <= s["t"] <= last["t"]]
    # RSS is judged from the first sample ``--settle`` s after registration (the baseline) to the end
    settled = [s for s in window if s["t"] >= first["t"] + args.settle] if first else []
    baseline = settled[0] if settled else None
    band = max((abs(s["rss"] - baseline["rss"]) / baseline["rss"] for s in settled), default=None) if baseline else None
    figures = {
        "clients": args.clients,
        "io_workers": args.io_workers,
        "duration_s": args.duration,
        "heartbeat_interval_s": args.interval,
        "run_s": round(run_s, 1),
        "loadgen": {k: v for k, v in res.items() if k != "latencies"},
        "samples_registered": len(steady),
        "registered_min": min((s.get("group_channels", 0) for s in window), default=0) - 1,
        "expired_total": max((s.get("expired", 0) for s in sampler.samples), default=0),
        "settle_s": args.settle,
        "settled_window_s": round(last["t"] - baseline["t"], 1) if baseline else None,
        "rss_mb_registered": round(first["rss"] / 2**20, 1) if first else None,
        "rss_mb_peak": round(max(s["rss"] for s in sampler.samples) / 2**20, 1),
        "rss_mb_baseline": round(baseline["rss"] / 2**20, 1) if baseline else None,
        "rss_mb_settled_min": round(min(s["rss"] for s in settled) / 2**20, 1) if settled else None,
        "rss_mb_settled_max": round(max(s["rss"] for s in settled) / 2**20, 1) if settled else None,
        "rss_mb_last": round(last["rss"] / 2**20, 1) if last else None,
        "rss_drift_pct": round(100 * (last["rss"] - baseline["rss"]) / baseline["rss"], 2) if baseline else None,
        "rss_band_pct": round(100 * band, 2) if band is not None else None,
        "rss_registered_to_last_pct": round(100 * (last["rss"] - first["rss"]) / first["rss"], 2) if first else None,
        "fds_before": base["fds"],
        "fds_peak": max(s["fds"] for s in sampler.samples),
        "fds_after": after["fds"],
        "fd_kinds_added": {k: kinds_after.get(k, 0) - kinds_before.get(k, 0)
                           for k in set(kinds_before) | set(kinds_after)
                           if kinds_after.get(k, 0) != kinds_before.get(k, 0)},
        "connections_after": after.get("connections"),
        "per_process_first": first.get("per_process") if first else None,
        "per_process_last": last.get("per_process") if last else None,
        "closed_by_reason": after.get("closed", {}),
    }
    if first:
        in_window = sorted(rt for t, rt in probe.points if first["t"] <= t <= last["t"])
        after_minute = sorted(rt for t, rt in probe.points if first["t"] + 60 <= t <= last["t"])
        for key, pts in (("probe", in_window), ("probe_after_first_minute", after_minute)):
            if pts:
                figures[key + "_ms"] = {"n": len(pts), "p50": round(1e3 * pts[len(pts) // 2], 2),
                                        "p99": round(1e3 * pts[min(len(pts) - 1, int(len(pts) * 0.99))], 2),
                                        "max": round(1e3 * pts[-1], 2)}
    figures["pass"] = bool(
        baseline and figures["rss_band_pct"] <= 5.0
        and figures["registered_min"] == args.clients
        and figures["expired_total"] == 0
        and res.get("errors", 0) == 0 and res.get("unanswered_after_drain", 0) == 0
        and all(n <= (n_procs if kind == "/dev/null" else 0) for kind, n in figures["fd_kinds_added"].items())
    )
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "samples": sampler.samples,
                                               "probe": probe.points}, indent=1))
    return 0 if figures["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

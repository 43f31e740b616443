"""gRPC heartbeats (RocketMQ 5.x clients) beside remoting heartbeats (4.x clients), one broker process, same run.

    .venv/bin/python bench/bench_grpc.py [--sessions 1000,10000] [--duration 10] [--pin 0:1] [--inflight 256]
        [--rounds 1] [--protocols grpc,remoting] [--grpc-transport native|grpcio] [--sessions-per-connection 128]
        [--rate 0] [--procs 1] [--core-frames] [--heartbeats-only] [--loop-probe] [--broker-tree DIR]
        [--out results.json]

Per session count N: one broker (`rmqhb serve` with grpcServerPort, its own process and session; with --pin
BROKER:LOAD it runs on CPU BROKER, pinned with taskset before it starts, and every load process on CPU LOAD), then,
per round, in this order against the same broker process:

* gRPC: engine.loadgen_grpc's steady scenario (`rmqhb loadgen steady --protocol grpc`) opens N sessions as the 5.x
  SDKs do: per session QueryRoute and a Telemetry stream with its Settings (half producers, half push consumers of
  one of 100 groups with a TAG subscription over the loadgen's 7 topics, created here first; at most 500 waiting
  for their Settings answer at a time), kept open,
  --sessions-per-connection of them on one HTTP/2 connection (default 128, the shape of the earlier BENCHMARKS
  rows). Then a closed loop of Heartbeat calls, --inflight in flight over all sessions (split over the connections,
  sessions in turn), with the SDKs' metadata (x-mq-client-id, x-mq-request-id, ...), plus the SDKs' QueryAssignment
  every 5 s per consumer and QueryRoute every 30 s; every answer's status is checked (OK). After a warm-up, the
  measured window reports answered heartbeats/s, latency percentiles and the broker's CPU (utime + stime of all its
  threads, grpc's pollers included, from /proc) per heartbeat. The sessions then terminate
  (NotifyClientTermination, their streams close) before the remoting run.
* remoting: engine.loadgen's steady scenario, N connections (N clients: the same 100 groups, half consumers),
  closed loop, one heartbeat in flight per connection, the same duration and CPU accounting.

With ``--rate R`` both runs are open loops offering R heartbeats/s (spread over the sessions, over the
connections): the broker then handles the same load on both protocols, whichever load generator is faster (in a
closed loop the faster one keeps the broker busier, and a busier broker handles more events per wake-up).

Both report ``broker_us_per_hb`` (the broker's CPU per answered heartbeat: the figure that does not depend on how
busy the machine is) and ``broker_cpu_pct`` (how much of its core the broker used in the window: near 100 the
broker was the bottleneck, below it the load process was).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import loadgen, loadgen_grpc  # noqa: E402

GROUPS = 100
#: Telemetry streams (sessions) per HTTP/2 connection; the Heartbeat calls in flight on a connection stay under the
#: broker's 256 streams per connection with them (a call past it would wait for a stream)
SESSIONS_PER_CONNECTION = 128


#: what a row takes from the load generator's result as it is: latency, the load generator's own pauses, and where
#: its window was (for the loop probe's PINGs)
LOADGEN_KEYS = ("p50_ms", "p99_ms", "max_ms", "loadgen_gc_max_ms", "tick_late_max_ms", "window_monotonic_s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------------
# the driver


def _per_hb(res: dict, cpu_key: str) -> None:
    if res.get("answered") and res.get(cpu_key) is not None:
        res["broker_us_per_hb"] = round(1e6 * res[cpu_key] / res["answered"], 2)
        res["broker_cpu_pct"] = round(100 * res[cpu_key] / res["seconds"], 1)


def _machine(fn):
    """``fn()`` with how busy the whole machine was meanwhile (other jobs share the cores) and the load average."""
    m0 = loadgen.machine_cpu_s()
    res = fn()
    m1 = loadgen.machine_cpu_s()
    if m0 and m1 and m1[1] > m0[1]:
        res["machine_busy_pct"] = round(100 * (m1[0] - m0[0]) / (m1[1] - m0[1]), 1)
    with open("/proc/loadavg") as f:
        res["load_average"] = " ".join(f.read().split()[:3])
    return res


def rss_bytes(pid: int) -> int | None:
    """The process's resident set (VmRSS), bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakRss:
    """The highest VmRSS of ``pid`` while the block runs, sampled every 0.2 s by a thread."""

    def __init__(self, pid: int):
        import threading

        self.pid, self.peak, self._stop = pid, rss_bytes(pid) or 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, rss_bytes(self.pid) or 0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_grpc(port: int, pid: int, n: int, duration: float, inflight: int, per_connection: int, rate: float = 0.0,
             procs: int = 1, core_frames: bool = False, heartbeats_only: bool = False) -> dict:
    # at most 500 sessions registering at a time, as before: grpcio's server cancels calls (CANCELLED) when about
    # a thousand arrive at once
    before = rss_bytes(pid)
    with PeakRss(pid) as peak:
        r = loadgen_grpc.run("steady", "127.0.0.1", port, n, procs, duration, rate, per_connection=per_connection,
                             inflight=0 if rate else inflight, groups=GROUPS, pending=500, server_pid=pid,
                             core_frames=core_frames,
                             **({"assignment_interval": 0, "route_interval": 0} if heartbeats_only else {}))
    res = {"protocol": "grpc" + (" (core frames)" if core_frames else "") + (" (heartbeats only)" if heartbeats_only
                                                                             else ""), "sessions": r["sessions"],
           "channels": r["connections"],
           "inflight": f"open loop {rate:g}/s" if rate else inflight,
           "registered_s": r["registered_s"], "seconds": r["seconds"], "answered": r["answered"],
           "errors": r["errors"] + (n - r["sessions"]), "heartbeats_per_s": r["heartbeats_per_s"],
           "broker_cpu_s": r.get("server_cpu_s"), "load_cpu_s": r.get("loadgen_cpu_s"),
           **{k: r[k] for k in LOADGEN_KEYS if k in r}}
    if r["errors_by_status"]:
        res["errors_by_status"] = r["errors_by_status"]
    if before and peak.peak and r["sessions"]:
        # what the broker grew by while holding the sessions (their streams, Settings, registry entries and the
        # connections' buffers at the peak), per session
        res["broker_rss_before_mb"] = round(before / 2**20, 1)
        res["broker_rss_peak_mb"] = round(peak.peak / 2**20, 1)
        res["rss_per_session_bytes"] = round((peak.peak - before) / r["sessions"])
    _per_hb(res, "broker_cpu_s")
    return res


class LoopProbe:
    """bench/loop_probe.py against the broker's gRPC port while the block runs (on the CPUs of this process: the
    load's, with --pin); ``into(res, window)`` adds its round trips in ``window`` (the loadgen's
    window_monotonic_s): the broker loop's own latency, apart from the load generator's."""

    def __init__(self, port: int | None):
        self.port, self.proc, self.samples = port, None, []

    def __enter__(self):
        if self.port is not None:
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "loop_probe.py"), str(self.port)],
                                         stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=30)
            self.samples = json.loads(out.strip().splitlines()[-1])["samples"] if out.strip() else []

    def into(self, res: dict, window) -> None:
        if self.proc is None:
            return
        rtts = sorted(rtt for t, rtt in self.samples if window and window[0] <= t <= window[1])
        if not rtts:
            res["loop_probe"] = "no samples in the window"
            return
        at = lambda q: round(1000 * rtts[min(len(rtts) - 1, int(q * len(rtts)))], 3)  # noqa: E731
        res.update(loop_pings=len(rtts), loop_p50_ms=at(0.5), loop_p99_ms=at(0.99),
                   loop_max_ms=round(1000 * rtts[-1], 3))


def run_remoting(port: int, pid: int, n: int, duration: float, rate: float = 0.0) -> dict:
    before = rss_bytes(pid)
    with PeakRss(pid) as peak:
        r = loadgen.run("steady", "127.0.0.1", port, n, 1, duration, rate, GROUPS, 0.5, 1, server_pid=pid)
    res = {"protocol": "remoting", "connections": r["connections"],
           "inflight": f"open loop {rate:g}/s" if rate else r["connections"],
           "registered_s": r["registered_s"], "seconds": r["seconds"], "answered": r["answered"],
           "errors": r["errors"] + r["opaque_mismatch"], "heartbeats_per_s": r["heartbeats_per_s"],
           "broker_cpu_s": r.get("server_cpu_s"), "load_cpu_s": r.get("loadgen_cpu_s"),
           **{k: r[k] for k in LOADGEN_KEYS if k in r}}
    if before and peak.peak and r["connections"]:
        # the same figure per client (a connection), when this run is the broker's first (--protocols remoting):
        # after a gRPC run the broker holds on to the heap the sessions freed
        res["broker_rss_before_mb"] = round(before / 2**20, 1)
        res["broker_rss_peak_mb"] = round(peak.peak / 2**20, 1)
        res["rss_per_session_bytes"] = round((peak.peak - before) / r["connections"])
    _per_hb(res, "broker_cpu_s")
    return res


def _wait_sessions_gone(grpc_port: int, main_port: int, timeout: float = 30.0) -> None:
    """The gRPC sessions of a finished run are removed when their streams close; give the broker that time."""
    from engine.broker.admin import AdminClient, AdminError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with AdminClient("127.0.0.1", main_port) as c:
                c.consumer_connection("GID_load_0")
        except AdminError:
            return
        time.sleep(0.2)


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _wait_fds(pid: int, limit: int, timeout: float = 30.0) -> None:
    """Until the broker holds at most ``limit`` descriptors: the connections of a finished run are closed, so the
    next run's connections have the whole connection budget (10,000 + 10,000 pass RLIMIT_NOFILE 20,000)."""
    deadline = time.monotonic() + timeout
    while _open_fds(pid) > limit and time.monotonic() < deadline:
        time.sleep(0.2)


def main(argv=None) -> int:
    from engine.broker.admin import AdminClient

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", default="1000,10000", help="session / connection counts, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--inflight", type=int, default=256, help="gRPC Heartbeat calls in flight (closed loop)")
    p.add_argument("--rounds", type=int, default=1, help="gRPC + remoting runs per session count, interleaved")
    p.add_argument("--protocols", default="grpc,remoting", help="which runs, comma-separated (grpc, remoting)")
    p.add_argument("--pin", help="BROKER_CPU:LOAD_CPU, e.g. 0:1 (taskset)")
    p.add_argument("--out", help="also write the results (JSON) here")
    p.add_argument("--grpc-transport", default="native", choices=("grpcio", "native"),
                   help="the broker's grpcTransport (native, the default: engine.http2; grpcio: grpc.aio)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="offered heartbeats/s over all sessions (gRPC) and over all connections (remoting), open "
                        "loop: both runs at the same rate (a 5.x fleet: sessions / 10); 0 = closed loops (gRPC: "
                        "--inflight; remoting: one per connection)")
    p.add_argument("--procs", type=int, default=1, help="gRPC: load processes")
    p.add_argument("--heartbeats-only", action="store_true",
                   help="gRPC: no QueryAssignment / QueryRoute beside the Heartbeats (the SDKs' periodic calls are "
                        "on by default: the broker's CPU per heartbeat then includes them)")
    p.add_argument("--core-frames", action="store_true",
                   help="gRPC: calls sent as grpc C-core sends them (rmqhb loadgen --core-frames: a WINDOW_UPDATE per "
                        "call, a flow-control PING after each read that ended calls)")
    p.add_argument("--sessions-per-connection", type=int, default=SESSIONS_PER_CONNECTION,
                   help="gRPC sessions sharing one HTTP/2 connection (default 128)")
    p.add_argument("--broker-tree", type=Path, default=ROOT,
                   help="run the broker from this tree (another revision, built in place: an A/B of the broker under "
                        "the same load generator); default: this one")
    p.add_argument("--loop-probe", action="store_true",
                   help="beside each load, PINGs on one idle HTTP/2 connection every 10 ms (bench/loop_probe.py): the "
                        "broker loop's own latency in the window (loop_p50_ms / loop_p99_ms / loop_max_ms)")
    a = p.parse_args(argv)
    pin = a.pin.split(":") if a.pin else None
    if not (a.broker_tree / "engine" / "__init__.py").is_file():
        p.error(f"--broker-tree {a.broker_tree}: no engine package there")
    results = []
    for n in (int(x) for x in a.sessions.split(",")):
        with tempfile.TemporaryDirectory() as store:
            main_port, grpc_port = _free_port(), _free_port()
            proc = subprocess.Popen([*(["taskset", "-c", pin[0]] if pin else []), sys.executable, "-m", "engine",
                                     "serve", "--listenPort", str(main_port), "--listenHost", "127.0.0.1",
                                     "--fastPortEnable", "false", "--grpcServerPort", str(grpc_port),
                                     "--grpcTransport", a.grpc_transport, "--storePathRootDir", store,
                                     # every session comes from 127.0.0.1: the per-address share must hold them
                                     "--grpcMaxSessionsPerIp", "1000000",
                                     # ... and their Settings (100,000 sessions pass the 64 MiB per address)
                                     "--grpcMaxSettingsBytesPerIp", str(1 << 30),
                                     "--grpcMaxSettingsBytesTotal", str(1 << 30),
                                     # its load uses ceil(N / sessions per connection) gRPC connections: the rest
                                     # of the descriptors stay the remoting port's (grpcMaxConnections' share is up
                                     # to half of them)
                                     "--grpcMaxConnections", str(max(1000, -(-n // a.sessions_per_connection) + 100)),
                                     "--log-level", "WARNING"],
                                    cwd=str(a.broker_tree), env=dict(os.environ, PYTHONPATH=str(a.broker_tree)),
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            mine = os.sched_getaffinity(0)
            try:
                line = proc.stdout.readline()
                if "boot success" not in line:
                    raise RuntimeError(f"the broker did not start: {line!r}")
                with AdminClient("127.0.0.1", main_port) as admin:  # a 5.x endpoint routes existing topics only
                    for k in range(7):
                        admin.update_topic(f"TopicLoad{k}", 4, 4)
                if pin:
                    os.sched_setaffinity(0, {int(c) for c in pin[1].split(",")})  # loadgen's workers fork from here
                protocols = a.protocols.split(",")
                for r in range(a.rounds):
                    runs = []
                    if "grpc" in protocols:
                        idle_fds = _open_fds(proc.pid)
                        with LoopProbe(grpc_port if a.loop_probe else None) as probe:
                            res = _machine(lambda: run_grpc(grpc_port, proc.pid, n, a.duration, a.inflight,
                                                            a.sessions_per_connection, a.rate, a.procs,
                                                            a.core_frames, a.heartbeats_only))
                        probe.into(res, res.get("window_monotonic_s"))
                        runs.append(res)
                        _wait_sessions_gone(grpc_port, main_port)
                        _wait_fds(proc.pid, idle_fds + 50)
                    if "remoting" in protocols:
                        with LoopProbe(grpc_port if a.loop_probe else None) as probe:  # one loop serves both ports
                            res = _machine(lambda: run_remoting(main_port, proc.pid, n, a.duration, a.rate))
                        probe.into(res, res.get("window_monotonic_s"))
                        runs.append(res)
                    for res in runs:
                        res.update(round=r + 1, pin=a.pin)
                        if a.broker_tree != ROOT:
                            res["broker_tree"] = str(a.broker_tree)
                        results.append(res)
                        print(json.dumps(res), flush=True)
            finally:
                os.sched_setaffinity(0, mine)
                proc.terminate()
                proc.wait(30)
    print(f"\n| protocol | sessions / connections | in flight | heartbeats/s | broker CPU per heartbeat | "
          f"broker's share of its core | machine busy | p50 / p99 ms | broker loop p99 ms (probe) | "
          f"broker RSS per session (remoting: per client) |\n"
          f"|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        print(f"| {res['protocol']} | {res.get('sessions') or res.get('connections')} | {res['inflight']} | "
              f"{res['heartbeats_per_s']:,} | {res.get('broker_us_per_hb')} us | {res.get('broker_cpu_pct')}% | "
              f"{res.get('machine_busy_pct')}% | {res.get('p50_ms')} / {res.get('p99_ms')} | "
              f"{res.get('loop_p99_ms', '-')} | {res.get('rss_per_session_bytes', '-')} |")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Server throughput and latency under the load generator (pytest-benchmark; loopback only).

    /work/venv/bin/python -m pytest bench/bench_server.py --benchmark-only -s
    BENCH_SERVER_CLIENTS=10000 BENCH_SERVER_PROCS=2 ...     bigger fleets (RLIMIT_NOFILE caps one process at 20k fds)
    BENCH_SERVER_RATES=0,20000,50000                         closed loop (0) and open-loop offered rates (heartbeats/s)
    BENCH_SERVER_DEPTH=1                                     closed loop: heartbeats in flight per connection
    BENCH_SERVER_STORM=50000 BENCH_SERVER_STORM_OPEN=19000   reconnect storm size; above the broker's fd limit
                                                             clients leave once registered (at most OPEN at a time)
    BENCH_SERVER_BROKER_ARGS="--notifyCoalesceWindowMs 100"  more `rmqhb serve` options for the broker
    BENCH_SERVER_IO_WORKERS=3 LOADGEN_SOURCE_IPS=3           the broker with I/O worker processes (sockets held by
                                                             the workers: 50k clients connected at once); loopback
                                                             clients from 127.0.0.2-4 (one address has 28k ports)

Issue 4's targets (>= 100k heartbeats/s with p99 <= 10 ms at 1k, 10k and 20k connections) are ``test_target``:
open loop at 100k/s offered, pipelined (each due connection writes BURST heartbeats in one write, as clients
sending async requests do; at one heartbeat per write a loopback round trip costs ~13 us of CPU on each side here,
so 100k/s cannot fit in 2 cores). ``test_saturation`` is the closed-loop figure (1k connections, 8 in flight).
Each case starts its own broker (and store).

    -k "test_target or test_saturation"                      1k/10k in-process, 1k/10k/20k with ioWorkers=2 and
                                                             with ioWorkers=1 + the core serving what it can
    BENCH_SERVER_TARGET_CLIENTS=1000,10000,20000  BENCH_SERVER_TARGET_IO=0,2,1c  BENCH_SERVER_BURST=8
                                                             I/O modes: N = ioWorkers=N (every socket in a worker),
                                                             Nc = ioWorkers=N, ioCoreConnections as many as the
                                                             core's descriptors allow (the workers hold the rest)
    BENCH_SERVER_TARGET_RATE=100000  BENCH_SERVER_TARGET_SECONDS=10
    BENCH_SERVER_TARGET_PROCS=0                              load processes (0: 1 for 1k, else 1 per 10k, >= 2)
    BENCH_SERVER_PIN=0:1                                     the broker (and its I/O workers) on CPU 0, the load
                                                             generator on CPU 1, as when the clients are other
                                                             machines: neither preempts the other
    BENCH_SERVER_PRIORITY=-10                                root only: autogroup nice of the broker's and this
                                                             process's sessions. With autogroup scheduling (on here)
                                                             nice only orders processes within one session, so
                                                             background jobs at nice 19 in other sessions still get
                                                             an equal share of the cores; this gives them back.
    BENCH_SERVER_LOADGEN_PRIORITY=0                          the load generator's session (default: the broker's):
                                                             above the broker's, the broker preempts its simulated
                                                             clients, as a broker on its own machine would not wait

20k connections exceed what one broker process holds (RLIMIT_NOFILE hard limit 20,000 minus the broker's reserve
of 256), so 20k runs with ioWorkers >= 1 only (with ``1c`` the core serves 19,744 of them and one worker 256). ``target_met`` in the output says whether a run met both targets;
the tests assert correctness (every answer SUCCESS to the opaque it answers, every client connected).
``broker_us_per_hb`` counts the core and its I/O workers, both over the measured window.

The broker runs in its own process and session (as a daemon would), the load generator in others. Reported in
extra_info and printed: heartbeats/s answered, p50/p99 latency as the clients see it, registration time, and CPU
per heartbeat of the broker (from /proc) and of the load generator, with how busy the whole machine was: on a
shared machine the broker's throughput is bounded by the CPU share it gets, its CPU per heartbeat is not.
"""
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = int(os.environ.get("BENCH_SERVER_CLIENTS", "1000"))
PROCS = int(os.environ.get("BENCH_SERVER_PROCS", "1"))
DURATION = float(os.environ.get("BENCH_SERVER_SECONDS", "5"))
RATES = [float(r) for r in os.environ.get("BENCH_SERVER_RATES", "0,5000").split(",")]
DEPTH = int(os.environ.get("BENCH_SERVER_DEPTH", "1"))
STORM = int(os.environ.get("BENCH_SERVER_STORM", str(CLIENTS)))
STORM_OPEN = int(os.environ.get("BENCH_SERVER_STORM_OPEN", "0"))
IO_WORKERS = os.environ.get("BENCH_SERVER_IO_WORKERS", "0")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    store = tmp_path_factory.mktemp("store")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--listenPort", str(port), "--listenHost",
                             "127.0.0.1", "--fastPortEnable", "false", "--storePathRootDir", str(store),
                             "--ioWorkers", IO_WORKERS, "--log-level", "WARNING",
                             *os.environ.get("BENCH_SERVER_BROKER_ARGS", "").split()], cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert "boot success" in proc.stdout.readline()
    yield port, proc.pid
    proc.terminate()
    proc.wait(20)


@pytest.mark.parametrize("rate", RATES)
def test_steady_heartbeats(benchmark, broker, rate):
    port, pid = broker
    res = benchmark.pedantic(loadgen.run, args=("steady", "127.0.0.1", port, CLIENTS, PROCS, DURATION, rate),
                             kwargs=dict(depth=DEPTH, server_pid=pid), rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["errors"] == 0 and res["opaque_mismatch"] == 0 and res["connections"] == CLIENTS


def test_reconnect_storm(benchmark, broker):
    port, pid = broker
    res = benchmark.pedantic(loadgen.run, args=("storm", "127.0.0.1", port, STORM, PROCS),
                             kwargs=dict(max_open=STORM_OPEN, server_pid=pid), rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["registered"] == STORM and res["opaque_mismatch"] == 0


# ---------------------------------------------------------------------------------------------------------------
# Issue 4's targets

TARGET_CLIENTS = [int(n) for n in os.environ.get("BENCH_SERVER_TARGET_CLIENTS", "1000,10000,20000").split(",")]
TARGET_IO = os.environ.get("BENCH_SERVER_TARGET_IO", "0,2,1c").split(",")
BURST = int(os.environ.get("BENCH_SERVER_BURST", "8"))
TARGET_RATE = float(os.environ.get("BENCH_SERVER_TARGET_RATE", "100000"))
TARGET_PROCS = int(os.environ.get("BENCH_SERVER_TARGET_PROCS", "0"))
TARGET_SECONDS = float(os.environ.get("BENCH_SERVER_TARGET_SECONDS", "10"))
PRIORITY = os.environ.get("BENCH_SERVER_PRIORITY")
LOADGEN_PRIORITY = os.environ.get("BENCH_SERVER_LOADGEN_PRIORITY", PRIORITY)
PIN = os.environ.get("BENCH_SERVER_PIN")  # "BROKER_CPUS:LOADGEN_CPUS", e.g. "0:1"


def _cpus(spec: str) -> set[int]:
    return {int(c) for c in spec.split(",")}
#: connections one broker process holds: RLIMIT_NOFILE (20,000 hard here) minus its reserve of 256
ONE_PROCESS_CONNECTIONS = 19_744


def _set_priority(pid, nice) -> None:
    if nice is not None:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(nice)


@contextlib.contextmanager
def _own_broker(store, io_workers=0, core_connections=0):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    pin = PIN.split(":") if PIN else None
    # the broker's affinity is set before it starts, so its threads and I/O workers inherit it
    proc = subprocess.Popen([*(["taskset", "-c", pin[0]] if pin else []), sys.executable, "-m", "engine", "serve",
                             "--listenPort", str(port), "--listenHost",
                             "127.0.0.1", "--fastPortEnable", "false", "--storePathRootDir", str(store),
                             "--ioWorkers", str(io_workers), "--ioCoreConnections", str(core_connections),
                             "--log-level", "WARNING"], cwd=str(ROOT),
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert "boot success" in proc.stdout.readline()
        _set_priority(proc.pid, PRIORITY)
        _set_priority("self", LOADGEN_PRIORITY)
        mine = os.sched_getaffinity(0)
        if pin:
            os.sched_setaffinity(0, _cpus(pin[1]))  # the load processes fork from this one
        try:
            yield port, proc.pid
        finally:
            os.sched_setaffinity(0, mine)
    finally:
        proc.terminate()
        proc.wait(30)


def _load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _measure(benchmark, pid, *args, **kw) -> dict:
    load0 = _load_average()
    res = benchmark.pedantic(loadgen.run, args=args, kwargs=dict(kw, server_pid=pid), rounds=1,
                             iterations=1)
    res.update(load_average_before=load0, load_average_after=_load_average())
    if res.get("answered") and res.get("server_cpu_s") is not None:
        res["broker_us_per_hb"] = round(1e6 * (res["server_cpu_s"] + res.get("io_workers_cpu_s", 0))
                                        / res["answered"], 2)
    return res


# in-process ("0") only where one process holds the connections, core-first ("Nc") only where it cannot
TARGET_CASES = [(n, io) for n in TARGET_CLIENTS for io in TARGET_IO
                if (io != "0" or n <= ONE_PROCESS_CONNECTIONS) and (not io.endswith("c") or n > ONE_PROCESS_CONNECTIONS)]


@pytest.mark.parametrize("clients,io", TARGET_CASES,
                         ids=[f"{n / 1000:g}k-ioWorkers{io.replace('c', '-core')}" for n, io in TARGET_CASES])
def test_target(benchmark, tmp_path, clients, io):
    """Issue 4's target: 100k heartbeats/s offered open loop in pipelined bursts, p99 <= 10 ms."""
    procs = TARGET_PROCS or (1 if clients <= 1000 else max(2, -(-clients // 10_000)))
    io_workers = int(io.rstrip("c"))
    core_connections = ONE_PROCESS_CONNECTIONS if io.endswith("c") else 0
    with _own_broker(tmp_path / "store", io_workers, core_connections) as (port, pid):
        res = _measure(benchmark, pid, "steady", "127.0.0.1", port, clients, procs, TARGET_SECONDS, TARGET_RATE,
                       burst=BURST)
    res.update(io_workers=io_workers, io_core_connections=core_connections, pin=PIN, target_met=res["heartbeats_per_s"] >= 0.995 * 100_000
               and res.get("p99_ms", float("inf")) <= 10.0)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["errors"] == 0 and res["opaque_mismatch"] == 0 and res["connections"] == clients


def test_saturation(benchmark, tmp_path):
    """Closed loop, 1k connections with 8 heartbeats in flight each: the broker's saturation throughput."""
    with _own_broker(tmp_path / "store") as (port, pid):
        res = _measure(benchmark, pid, "steady", "127.0.0.1", port, 1000, 1, TARGET_SECONDS, 0, depth=8)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["errors"] == 0 and res["opaque_mismatch"] == 0 and res["connections"] == 1000


class _NullTransport:
    """What Connection needs of a transport, doing nothing: the in-process cost without sockets."""

    def __init__(self, port):
        self.port = port

    def write(self, data):
        pass

    def get_write_buffer_size(self):
        return 0

    def get_extra_info(self, name):
        return ("10.0.0.9", self.port) if name == "peername" else ("127.0.0.1", 10911)


@pytest.mark.parametrize("route", ["repeats", "full path"])
def test_inprocess_heartbeat_path(benchmark, tmp_path, route):
    """Connection.data_received over 1,000 connections, each read 8 pipelined heartbeats that repeat the
    connection's last one: the broker's Python and native work per heartbeat without the socket syscalls, with the
    repeat route and with it turned off (every heartbeat decoded and dispatched)."""
    import asyncio

    from engine.broker.controller import Broker
    from engine.broker.config import BrokerConfig
    from engine.broker.server import Connection

    benchmark.group = "in-process heartbeat path (per read of 8, 1,000 connections per round)"
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=str(tmp_path / "store")))
    loop = asyncio.new_event_loop()
    b.loop = b.server.loop = loop
    if route != "repeats":
        b.server.repeats = False
    fleet = loadgen.make_fleet(1000, 0, 100, 0.5)
    conns, reads = [], []
    for i, c in enumerate(fleet):
        conn = Connection(b.server, "main")
        conn.connection_made(_NullTransport(1000 + i))
        conns.append(conn)
        reads.append(b"".join(c.heartbeat_frame(loadgen.OPAQUE_BASE + k) for k in range(8)))
    pairs = list(zip(conns, reads))

    def round_():
        for conn, data in pairs:
            conn.data_received(data)

    round_()
    round_()  # registered, fast path armed (and the route, when on)
    benchmark.pedantic(round_, rounds=20, iterations=1)
    per_hb_us = benchmark.stats.stats.min / 8000 * 1e6
    benchmark.extra_info["us_per_heartbeat_min"] = round(per_hb_us, 3)
    print(f"\n{route}: {per_hb_us:.2f} us per heartbeat (min round)")
    assert all((c.repeat is not None) == (route == "repeats") for c in conns)
    assert b.metrics.heartbeats == 22 * 8000
    loop.close()

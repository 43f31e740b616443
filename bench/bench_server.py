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

The broker runs in its own process and session (as a daemon would), the load generator in others. Reported in
extra_info and printed: heartbeats/s answered, p50/p99 latency as the clients see it, registration time, and CPU
per heartbeat of the broker (from /proc) and of the load generator, with how busy the whole machine was: on a
shared machine the broker's throughput is bounded by the CPU share it gets, its CPU per heartbeat is not.
"""
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


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _workers(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def _run_measured(pid, *args, **kw) -> dict:
    """loadgen.run, plus the CPU seconds the I/O worker processes used in it (the core's is server_cpu_s)."""
    workers = _workers(pid)
    before = {w: _cpu_s(w) for w in workers}
    res = loadgen.run(*args, **kw)
    if workers:
        res["io_workers_cpu_s"] = round(sum(_cpu_s(w) - c for w, c in before.items()), 3)
    return res


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
    res = benchmark.pedantic(_run_measured, args=(pid, "steady", "127.0.0.1", port, CLIENTS, PROCS, DURATION, rate),
                             kwargs=dict(depth=DEPTH, server_pid=pid), rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["errors"] == 0 and res["opaque_mismatch"] == 0 and res["connections"] == CLIENTS


def test_reconnect_storm(benchmark, broker):
    port, pid = broker
    res = benchmark.pedantic(_run_measured, args=(pid, "storm", "127.0.0.1", port, STORM, PROCS),
                             kwargs=dict(max_open=STORM_OPEN, server_pid=pid), rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["registered"] == STORM and res["opaque_mismatch"] == 0

"""Server throughput and latency under the load generator (pytest-benchmark; loopback only).

    /work/venv/bin/python -m pytest bench/bench_server.py --benchmark-only -s
    BENCH_SERVER_CLIENTS=10000 BENCH_SERVER_PROCS=1 ... for bigger fleets (RLIMIT_NOFILE caps one process near 20k)

The broker runs in its own process (as in production), the load generator in others; the figures (heartbeats/s
answered, p50/p99 latency, registration time) are stored in the benchmark's extra_info and printed.
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = int(os.environ.get("BENCH_SERVER_CLIENTS", "1000"))
PROCS = int(os.environ.get("BENCH_SERVER_PROCS", "1"))
DURATION = float(os.environ.get("BENCH_SERVER_SECONDS", "5"))


@pytest.fixture(scope="module")
def broker_port(tmp_path_factory):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    store = tmp_path_factory.mktemp("store")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--listenPort", str(port), "--listenHost",
                             "127.0.0.1", "--fastPortEnable", "false", "--storePathRootDir", str(store),
                             "--log-level", "WARNING"], cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, text=True)
    assert "boot success" in proc.stdout.readline()
    yield port
    proc.terminate()
    proc.wait(20)


@pytest.mark.parametrize("rate", [0, 5000])
def test_steady_heartbeats(benchmark, broker_port, rate):
    res = benchmark.pedantic(loadgen.run, args=("steady", "127.0.0.1", broker_port, CLIENTS, PROCS, DURATION, rate),
                             rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["errors"] == 0 and res["connections"] == CLIENTS


def test_reconnect_storm(benchmark, broker_port):
    res = benchmark.pedantic(loadgen.run, args=("storm", "127.0.0.1", broker_port, CLIENTS, PROCS), rounds=1,
                             iterations=1)
    benchmark.extra_info.update(res)
    print("\n", res)
    assert res["registered"] == CLIENTS

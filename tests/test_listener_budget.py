"""One budget of connections for every listener (issue 26 §1, descriptors): the gRPC port holds its share
(grpcMaxConnections) whatever a flood of raw HTTP/2 connections does, the metrics endpoint its 16, the remoting ports
the rest, and together they leave the descriptor reserve to the store. Refusals are counted per listener; accept
failures are counted and logged once a minute, never a traceback per accept."""
import asyncio
import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import free_ports, require_module
from engine.broker.config import BrokerConfig
from engine.broker.metrics import METRICS_MAX_CONNECTIONS, Metrics, render
from engine.broker.server import FD_RESERVE, REFUSED_HELD, install_accept_error_handler, listener_budget
from engine.codec.enums import ResponseCode
from engine.logutil import RateLimitedLog
from test_server import Client, wait_until

#: what a 5.x client sends first: the HTTP/2 connection preface and an empty SETTINGS frame
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

BROKER_LOW_FDS = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))  # serve_main raises soft to hard
from engine.broker.controller import serve_main
sys.exit(serve_main(sys.argv[2:]))
"""


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def sample(text: str, name: str, listener: str) -> int:
    m = re.search(rf'^rocketmq_broker_{name}{{listener="{listener}"}} (\d+)$', text, re.M)
    return int(m.group(1)) if m else 0


def test_the_budget_splits_max_connections_between_the_listeners():
    cfg = BrokerConfig(max_connections=200, grpc_server_port=8081, metrics_port=9100, grpc_max_connections=50)
    budget = listener_budget(cfg)
    assert budget == {"remoting": 200 - 50 - METRICS_MAX_CONNECTIONS, "grpc": 50, "metrics": METRICS_MAX_CONNECTIONS}
    # a gRPC share over half of what is left is halved: a flood there never shuts the remoting port out
    cfg.grpc_max_connections = 10_000
    assert listener_budget(cfg)["grpc"] == (200 - METRICS_MAX_CONNECTIONS) // 2
    # ports that are off take nothing from the remoting ports
    assert listener_budget(BrokerConfig(max_connections=200))["remoting"] == 200


@pytest.mark.parametrize("transport", ["grpcio", "native"])
def test_a_flood_of_raw_grpc_connections_leaves_the_other_ports_and_the_store_their_descriptors(tmp_path, transport):
    """RLIMIT_NOFILE 400 and a budget of 144 connections (gRPC 50, metrics 16, remoting 78): 300 raw connections
    to the gRPC port (preface + empty SETTINGS, more than the process has descriptors for beyond its reserve) take
    50 descriptors; the remoting port still answers a heartbeat, /metrics still answers, the store still writes.
    Then 120 remoting connections: 78 - 1 held, the rest refused and counted exactly, and the log has no line
    per refusal."""
    require_module("grpc")
    store = tmp_path / "store"
    port, grpc_port, metrics_port = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-c", BROKER_LOW_FDS, "400", "--listenPort", str(port), "--listenHost", "127.0.0.1",
         "--fastPortEnable", "false", "--storePathRootDir", str(store), "--log-level", "INFO",
         "--maxConnections", "1000", "--grpcServerPort", str(grpc_port), "--grpcMaxConnections", "50",
         "--grpcTransport", transport, "--metricsPort", str(metrics_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    flood, grpc_flood = [], []
    try:
        line = proc.stdout.readline()
        if "boot success" not in line:  # the broker's own words on why it did not start
            proc.kill()
            pytest.fail(f"the broker did not start: {line!r} {proc.stderr.read()[-2000:]!r}")
        text = scrape(metrics_port)
        budget = {k: sample(text, "listener_connection_limit", k) for k in ("remoting", "grpc", "metrics")}
        assert budget == {"remoting": 400 - FD_RESERVE - 50 - 16, "grpc": 50, "metrics": 16}, budget
        good = Client(port)
        assert good.heartbeat(client_id="10.0.0.9@good", group="good_group").code == ResponseCode.SUCCESS
        fds = lambda: len(os.listdir(f"/proc/{proc.pid}/fd"))  # noqa: E731
        base = fds()
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", grpc_port), timeout=5)
            s.sendall(H2_PREFACE)
            grpc_flood.append(s)
        time.sleep(1.0)  # grpcio's accept loop has taken (and refused) them
        held = fds() - base
        assert 45 <= held <= 50 + 2, held  # its share, not the 300 (nor every descriptor left)
        text = scrape(metrics_port)  # the gRPC port at its share, as grpcio's channelz counts it
        assert sample(text, "listener_connections", "grpc") == 50, text
        assert sample(text, "listener_connections", "remoting") == 1
        # the other ports and the store still have their descriptors
        assert good.heartbeat(client_id="10.0.0.9@good", group="group_after_grpc_flood").code == ResponseCode.SUCCESS
        path = store / "config" / "subscriptionGroup.json"
        assert wait_until(lambda: path.is_file() and "group_after_grpc_flood" in path.read_text(), timeout=10)
        assert "rocketmq_broker_heartbeats_total" in scrape(metrics_port)
        # the remoting port's share: 1 good client + 120 more, of which share - 1 are kept
        share = budget["remoting"]
        for _ in range(120):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        expected = 1 + 120 - share
        assert wait_until(lambda: sample(scrape(metrics_port), "connections_refused_total", "remoting") == expected,
                          timeout=10), scrape(metrics_port)
        assert fds() <= base + 50 + 2 + (share - 1) + REFUSED_HELD + 2
        assert good.heartbeat(client_id="10.0.0.9@good", group="good_group").code == ResponseCode.SUCCESS
        good.close()
    finally:
        for s in flood + grpc_flood:
            s.close()
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "Too many open files" not in err and "EMFILE" not in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # the refusals are counted, not logged one by one (the client log writes at most 20 lines of a kind a minute)
    assert err.count("too many connections") <= 20, err[-3000:]
    # 250 gRPC and 43 remoting refusals: the whole log is a few lines of start, the good client and the stop
    assert len(err.splitlines()) < 80, err[-3000:]


def test_the_metrics_endpoint_serves_16_connections_and_counts_the_rest(tmp_path):
    """30 connections that send nothing to /metrics: 16 are served (each until its 5 s read timeout or its close),
    the other 14 are closed at accept and counted; once they are gone /metrics answers again."""
    from engine.broker.metrics import MetricsEndpoint

    metrics = Metrics()

    async def run():
        ep = MetricsEndpoint(lambda: render(metrics, 0), metrics=metrics)
        port = await ep.start()
        loop = asyncio.get_running_loop()
        idle = []
        for _ in range(30):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            idle.append(w)
        for _ in range(100):
            if ep.active + ep.refused >= 30:
                break
            await asyncio.sleep(0.02)
        assert (ep.active, ep.refused) == (16, 14)
        for w in idle:
            w.close()
        for _ in range(100):
            if ep.active == 0:
                break
            await asyncio.sleep(0.02)
        text = await loop.run_in_executor(None, scrape, port)
        await ep.stop()
        return text

    text = asyncio.run(run())
    assert sample(text, "connections_refused_total", "metrics") == 14
    assert sample(text, "listener_connection_limit", "metrics") == METRICS_MAX_CONNECTIONS


ACCEPT_FLOOD = """
import asyncio, logging, resource, subprocess, sys
from engine.broker.metrics import Metrics
from engine.broker.server import install_accept_error_handler
from engine.logutil import RateLimitedLog

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (40, HARD))
metrics = Metrics()

class Echo(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t

async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", 0, backlog=512)
    port = server.sockets[0].getsockname()[1]
    metrics.listener_ports[port] = "remoting"
    install_accept_error_handler(loop, metrics, RateLimitedLog(logging.getLogger("t")))
    # the clients in a child process: their ends would take this process's descriptors too
    proc = subprocess.Popen([sys.executable, "-c", CLIENTS, str(port)])
    await asyncio.sleep(3.5)
    proc.kill()
    proc.wait()
    print("accept_errors", metrics.accept_errors["remoting"])

CLIENTS = '''
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(200)]
time.sleep(10)
'''
asyncio.run(main())
"""


def test_accept_failures_are_counted_and_logged_without_a_traceback():
    """asyncio's own loop (the twin of uvloop's) out of descriptors: every failed accept would log a traceback;
    with the handler they are counted per listener and logged once a minute."""
    proc = subprocess.run([sys.executable, "-c", ACCEPT_FLOOD], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = int(re.search(r"accept_errors (\d+)", proc.stdout).group(1))
    assert errors >= 2, (proc.stdout, proc.stderr[-2000:])  # asyncio retries a paused listener once a second
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("accepting a connection failed (EMFILE)") == 1, proc.stderr[-3000:]


def test_other_loop_exceptions_still_reach_the_previous_handler():
    seen = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(lambda loop, context: seen.append(context["message"]))
        metrics = Metrics()
        install_accept_error_handler(loop, metrics, RateLimitedLog(logging.getLogger("t")))
        loop.call_exception_handler({"message": "something else", "exception": ValueError("x")})
        loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                     "exception": OSError(24, "Too many open files")})
    finally:
        loop.close()
    assert seen == ["something else"]
    assert metrics.accept_errors == {"other": 1}

"""gRPC heartbeats (RocketMQ 5.x clients) beside remoting heartbeats (4.x clients), one broker process, same run.

    .venv/bin/python bench/bench_grpc.py [--sessions 1000,10000] [--duration 10] [--pin 0:1] [--inflight 256]
        [--rounds 1] [--protocols grpc,remoting] [--grpc-transport grpcio|native] [--out results.json]

Per session count N: one broker (`rmqhb serve` with grpcServerPort, its own process and session; with --pin
BROKER:LOAD it runs on CPU BROKER, pinned with taskset before it starts, and every load process on CPU LOAD), then,
per round, in this order against the same broker process:

* gRPC: a load process (this script with --client, grpc.aio) opens N sessions as the 5.x SDKs do: per session a
  Telemetry stream with its Settings (half producers of one of 100 topics, half push consumers of one of 100 groups
  with a TAG subscription), kept open, spread over ceil(N / 128) channels (each its own HTTP/2 connection). Then a
  closed loop of Heartbeat RPCs: --inflight calls in flight (at most 100 per channel: with the 128 streams the
  broker's 256 streams per connection are not exceeded), sessions in turn, each on its session's channel with its
  metadata (x-mq-client-id, ...) and its pre-serialized HeartbeatRequest; every answer's status is checked (OK). After a warm-up, the measured window reports answered
  heartbeats/s, latency percentiles and the broker's CPU (utime + stime of all its threads, grpc's pollers
  included, from /proc) per heartbeat. The sessions then end (their streams close) before the remoting run.
* remoting: engine.loadgen's steady scenario, N connections (N clients: the same 100 groups, half consumers),
  closed loop, one heartbeat in flight per connection, the same duration and CPU accounting.

Both report ``broker_us_per_hb`` (the broker's CPU per answered heartbeat: the figure that does not depend on how
busy the machine is) and ``broker_cpu_pct`` (how much of its core the broker used in the window: near 100 the
broker was the bottleneck, below it the load process was).
"""
from __future__ import annotations

import argparse
import asyncio
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

from engine import loadgen  # noqa: E402

GROUPS = 100
#: Telemetry streams per channel; the Heartbeat calls in flight on a channel stay under the broker's 256 streams per
#: connection with them (a call past it is refused with REFUSED_STREAM)
STREAMS_PER_CHANNEL = 128
CALLS_PER_CHANNEL = 100
WARMUP_S = 2.0
HEARTBEAT = "/apache.rocketmq.v2.MessagingService/Heartbeat"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentiles(lat: list) -> dict:
    if not lat:
        return {}
    lat.sort()
    pick = lambda q: round(lat[min(len(lat) - 1, int(q * (len(lat) - 1)))] * 1000, 3)  # noqa: E731
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": round(lat[-1] * 1000, 3)}


# ---------------------------------------------------------------------------------------------------------------
# the gRPC load process


async def _client(target: str, n: int, duration: float, inflight: int, broker_pid: int) -> dict:
    from grpc import aio
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s
    from rocketmq.grpc_protocol import service_pb2_grpc as sg

    n_channels = max(1, -(-n // STREAMS_PER_CHANNEL))
    inflight = min(inflight, n, n_channels * CALLS_PER_CHANNEL)
    # a local subchannel pool per channel: each channel its own connection (grpc would share one otherwise)
    channels = [aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(n_channels)]
    stubs = [sg.MessagingServiceStub(c) for c in channels]
    metadata, bodies, streams = [], [], []
    t0 = time.perf_counter()

    async def open_session(i: int) -> None:
        md = (("x-mq-client-id", f"10.1.{i // 250}.{i % 250}@{i}#grpc-bench"), ("x-mq-language", "JAVA"),
              ("x-mq-client-version", "5.0.7"), ("x-mq-protocol", "GRPC_V2"))
        g = i % GROUPS
        st = d.Settings()
        st.user_agent.language = d.Language.JAVA
        hb = s.HeartbeatRequest()
        if i % 2:
            st.client_type = hb.client_type = d.ClientType.PRODUCER
            st.publishing.topics.add(name=f"TopicBench{g}")
        else:
            st.client_type = hb.client_type = d.ClientType.PUSH_CONSUMER
            st.subscription.group.name = hb.group.name = f"GID_bench_{g}"
            e = st.subscription.subscriptions.add()
            e.topic.name = f"TopicBench{g}"
            e.expression.type = d.FilterType.TAG
            e.expression.expression = "TagA || TagB"
        call = stubs[i % n_channels].Telemetry(metadata=md)
        await call.write(s.TelemetryCommand(settings=st))
        answer = await call.read()
        if answer.status.code != d.Code.OK:
            raise RuntimeError(f"session {i}: Settings answered {answer.status}")
        metadata[i], bodies[i], streams[i] = md, hb.SerializeToString(), call

    metadata[:] = bodies[:] = streams[:] = [None] * n
    for start in range(0, n, 500):
        await asyncio.gather(*(open_session(i) for i in range(start, min(n, start + 500))))
    registered_s = time.perf_counter() - t0
    calls = [c.unary_unary(HEARTBEAT) for c in channels]  # bytes in, bytes out: no client-side protobuf work
    ok_code = d.Code.OK
    parse = s.HeartbeatResponse.FromString
    state = {"next": 0, "measuring": False, "stop": False, "answered": 0, "errors": 0}
    lat: list = []

    async def worker() -> None:
        clock = time.perf_counter
        while not state["stop"]:
            i = state["next"]
            state["next"] = i + 1 if i + 1 < n else 0
            t = clock()
            raw = await calls[i % n_channels](bodies[i], metadata=metadata[i])
            if state["measuring"]:
                lat.append(clock() - t)
                if parse(raw).status.code == ok_code:
                    state["answered"] += 1
                else:
                    state["errors"] += 1

    tasks = [asyncio.ensure_future(worker()) for _ in range(inflight)]
    await asyncio.sleep(WARMUP_S)
    cpu0, own0, w0 = loadgen.proc_cpu_s(broker_pid), time.process_time(), time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(duration)
    state["measuring"] = False
    cpu1, own1, w1 = loadgen.proc_cpu_s(broker_pid), time.process_time(), time.perf_counter()
    state["stop"] = True
    await asyncio.gather(*tasks)
    for call in streams:
        await call.done_writing()
    for c in channels:
        await c.close()
    seconds = w1 - w0
    res = {"protocol": "grpc", "sessions": n, "channels": n_channels, "inflight": inflight,
           "registered_s": round(registered_s, 3), "seconds": round(seconds, 3), "answered": state["answered"],
           "errors": state["errors"], "heartbeats_per_s": round(state["answered"] / seconds),
           "broker_cpu_s": round(cpu1 - cpu0, 3), "load_cpu_s": round(own1 - own0, 3)}
    res.update(_percentiles(lat))
    return res


def client_main(args) -> int:
    if os.environ.get("BENCH_GRPC_CLIENT_UVLOOP"):
        import uvloop
        uvloop.install()
    res = asyncio.run(_client(args.target, args.client, args.duration, args.inflight, args.broker_pid))
    print(json.dumps(res), flush=True)
    return 0


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


def run_grpc(port: int, pid: int, n: int, duration: float, inflight: int, pin_load) -> dict:
    cmd = [*(["taskset", "-c", pin_load] if pin_load else []), sys.executable, str(Path(__file__).resolve()),
           "--client", str(n), "--target", f"127.0.0.1:{port}", "--duration", str(duration),
           "--inflight", str(inflight), "--broker-pid", str(pid)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600 + duration)
    if p.returncode != 0:
        raise RuntimeError(f"gRPC load process failed: {p.stderr[-2000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    _per_hb(res, "broker_cpu_s")
    return res


def run_remoting(port: int, pid: int, n: int, duration: float) -> dict:
    r = loadgen.run("steady", "127.0.0.1", port, n, 1, duration, 0.0, GROUPS, 0.5, 1, server_pid=pid)
    res = {"protocol": "remoting", "connections": r["connections"], "inflight": r["connections"],
           "registered_s": r["registered_s"], "seconds": r["seconds"], "answered": r["answered"],
           "errors": r["errors"] + r["opaque_mismatch"], "heartbeats_per_s": r["heartbeats_per_s"],
           "broker_cpu_s": r.get("server_cpu_s"), "load_cpu_s": r.get("loadgen_cpu_s"),
           **{k: r[k] for k in ("p50_ms", "p99_ms", "max_ms") if k in r}}
    _per_hb(res, "broker_cpu_s")
    return res


def _wait_sessions_gone(grpc_port: int, main_port: int, timeout: float = 30.0) -> None:
    """The gRPC sessions of a finished run are removed when their streams close; give the broker that time."""
    from engine.broker.admin import AdminClient, AdminError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with AdminClient("127.0.0.1", main_port) as c:
                c.consumer_connection("GID_bench_0")
        except AdminError:
            return
        time.sleep(0.2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", default="1000,10000", help="session / connection counts, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--inflight", type=int, default=256, help="gRPC Heartbeat calls in flight (closed loop)")
    p.add_argument("--rounds", type=int, default=1, help="gRPC + remoting runs per session count, interleaved")
    p.add_argument("--protocols", default="grpc,remoting", help="which runs, comma-separated (grpc, remoting)")
    p.add_argument("--pin", help="BROKER_CPU:LOAD_CPU, e.g. 0:1 (taskset)")
    p.add_argument("--out", help="also write the results (JSON) here")
    p.add_argument("--grpc-transport", default="grpcio", choices=("grpcio", "native"),
                   help="the broker's grpcTransport (grpcio: grpc.aio; native: engine.http2)")
    # the load process
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--broker-pid", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.client:
        return client_main(a)
    pin = a.pin.split(":") if a.pin else None
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
                                     # its load uses ceil(N / 128) gRPC connections: the rest of the descriptors
                                     # stay the remoting port's (grpcMaxConnections' share is up to half of them)
                                     "--grpcMaxConnections", "1000", "--log-level", "WARNING"],
                                    cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            mine = os.sched_getaffinity(0)
            try:
                line = proc.stdout.readline()
                if "boot success" not in line:
                    raise RuntimeError(f"the broker did not start: {line!r}")
                if pin:
                    os.sched_setaffinity(0, {int(c) for c in pin[1].split(",")})  # loadgen's workers fork from here
                protocols = a.protocols.split(",")
                for r in range(a.rounds):
                    runs = []
                    if "grpc" in protocols:
                        runs.append(_machine(lambda: run_grpc(grpc_port, proc.pid, n, a.duration, a.inflight,
                                                              pin and pin[1])))
                        _wait_sessions_gone(grpc_port, main_port)
                    if "remoting" in protocols:
                        runs.append(_machine(lambda: run_remoting(main_port, proc.pid, n, a.duration)))
                    for res in runs:
                        res.update(round=r + 1, pin=a.pin)
                        results.append(res)
                        print(json.dumps(res), flush=True)
            finally:
                os.sched_setaffinity(0, mine)
                proc.terminate()
                proc.wait(30)
    print(f"\n| protocol | sessions / connections | in flight | heartbeats/s | broker CPU per heartbeat | "
          f"broker's share of its core | machine busy | p50 / p99 ms |\n|---|---|---|---|---|---|---|---|")
    for res in results:
        print(f"| {res['protocol']} | {res.get('sessions') or res.get('connections')} | {res['inflight']} | "
              f"{res['heartbeats_per_s']:,} | {res.get('broker_us_per_hb')} us | {res.get('broker_cpu_pct')}% | "
              f"{res.get('machine_busy_pct')}% | {res.get('p50_ms')} / {res.get('p99_ms')} |")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load generator: thousands of simulated RocketMQ clients, each on its own connection, heartbeating a broker.

Each simulated client is the client side of MQClientInstance's heartbeat: a producer table and a consumer
table, ``prepareHeartbeatData`` (clientID, CLIENT_INNER_PRODUCER plus its producer groups, its consumers with
their subscriptions and the %RETRY% subscription of a CLUSTERING group), sent to every broker of its broker
table (masters only when it has no consumers), and UNREGISTER_CLIENT per group on shutdown. Frames are
pre-encoded with the engine's own encoder, so they are byte-for-byte what a Java 5.x client sends.

Scenarios (``python bench/loadgen.py --help``):

* ``steady``: N connections register, then heartbeat for D seconds. ``--rate R`` is an open-loop offered load
  (R heartbeats/s spread over the connections, the way a fleet's 30 s timers are spread); ``--rate 0`` is closed
  loop (each connection sends its next heartbeat when the previous one is answered: the saturation throughput).
  Reports heartbeats/s answered and latency percentiles.
* ``storm``: N clients connect at once and send their first heartbeat; reports the time until every one of them
  is registered (answered SUCCESS).

The process raises RLIMIT_NOFILE to its hard limit; with ``--procs P`` the clients are split over P processes.
Only loopback addresses are accepted as targets.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.heartbeat import build_subscription  # noqa: E402

CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------------------------------------------------------
# The client side of MQClientInstance


class SimClient:
    """One MQClientInstance: producer/consumer tables and its broker table (brokerName -> {brokerId: addr})."""

    def __init__(self, index: int, producers=(), consumers=(), ip="10.0.0.1"):
        self.client_id = f"{ip}@{40000 + index}#{index * 7919}"
        self.producer_table = list(producers)
        #: consumer table: (group, message model, [(topic, expression)])
        self.consumer_table = list(consumers)
        self.broker_addr_table: dict[str, dict[int, str]] = {}
        self.sub_version = int(time.time() * 1000)

    def prepare_heartbeat_data(self):
        producers = [engine.ProducerData(CLIENT_INNER_PRODUCER)] + [engine.ProducerData(g) for g in self.producer_table]
        consumers = []
        for group, model, subs in self.consumer_table:
            subscriptions = [build_subscription(t, e, self.sub_version) for t, e in subs]
            if model == engine.MessageModel.CLUSTERING:
                subscriptions.append(build_subscription(f"%RETRY%{group}", "*", self.sub_version))
            consumers.append(engine.ConsumerData(
                group, consume_type=engine.ConsumeType.CONSUME_PASSIVELY, message_model=model,
                consume_from_where=engine.ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, unit_mode=False,
                subscriptions=tuple(subscriptions)))
        return engine.HeartbeatData(client_id=self.client_id, producers=tuple(producers), consumers=tuple(consumers))

    def heartbeat_targets(self) -> list[str]:
        """sendHeartbeatToAllBroker: every address, or masters only when the heartbeat has no consumers."""
        out = []
        for table in self.broker_addr_table.values():
            for broker_id, addr in table.items():
                if broker_id != 0 and not self.consumer_table:
                    continue
                out.append(addr)
        return out

    def heartbeat_frame(self, opaque: int) -> bytes:
        body = engine.encode_heartbeat(self.prepare_heartbeat_data())
        return engine.RemotingCommand(engine.RequestCode.HEART_BEAT, opaque=opaque, ext_fields={}, body=body).encode()

    def unregister_frames(self, opaque: int) -> list[bytes]:
        """MQClientInstance.unregisterClient: one UNREGISTER_CLIENT per group."""
        frames = []
        for g in self.producer_table:
            frames.append(engine.RemotingCommand(engine.RequestCode.UNREGISTER_CLIENT, opaque=opaque,
                                                 ext_fields={"clientID": self.client_id, "producerGroup": g}).encode())
        for g, _, _ in self.consumer_table:
            frames.append(engine.RemotingCommand(engine.RequestCode.UNREGISTER_CLIENT, opaque=opaque,
                                                 ext_fields={"clientID": self.client_id, "consumerGroup": g}).encode())
        return frames


def make_fleet(n: int, offset: int, groups: int, consumer_share: float) -> list[SimClient]:
    """n clients: a share are push consumers of one of ``groups`` groups (CLUSTERING), the rest producers."""
    fleet = []
    for i in range(offset, offset + n):
        g = i % groups
        if (i % 100) < consumer_share * 100:
            c = SimClient(i, consumers=[(f"CID_load_{g}", engine.MessageModel.CLUSTERING,
                                         [(f"TopicLoad{g % 7}", "TagA || TagB")])])
        else:
            c = SimClient(i, producers=[f"PID_load_{g}"])
        fleet.append(c)
    return fleet


# ---------------------------------------------------------------------------------------------------------------
# Connections


class LoadConn(asyncio.Protocol):
    """A client connection: sends pre-encoded frames, counts responses (FIFO: one connection is answered in order)."""

    __slots__ = ("frame", "transport", "sent", "buf", "lat", "pending", "stats", "closed", "ok", "on_answer")

    def __init__(self, frame: bytes, stats: dict, lat: list, on_answer=None):
        self.frame = frame
        self.transport = None
        self.buf = bytearray()
        self.lat = lat
        self.pending: list = []  # send times, oldest first
        self.stats = stats
        self.closed = asyncio.get_running_loop().create_future()
        self.ok = 0
        self.on_answer = on_answer

    def connection_made(self, transport):
        self.transport = transport

    def send(self, now: float, data: bytes | None = None) -> None:
        self.pending.append(now)
        self.transport.write(data or self.frame)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        now = time.perf_counter()
        answered = 0
        while n - pos >= 8:
            length = int.from_bytes(buf[pos:pos + 4], "big")
            if n - pos - 4 < length:
                break
            # response code: the header is JSON starting {"code":N
            hl = int.from_bytes(buf[pos + 4:pos + 8], "big") & 0xFFFFFF
            head = bytes(buf[pos + 8:pos + 8 + hl])
            pos += 4 + length
            if b'"flag":1' not in head:  # a request from the broker (NOTIFY_CONSUMER_IDS_CHANGED), not an answer
                self.stats["notifies"] += 1
                continue
            if head.startswith(b'{"code":0,'):
                self.ok += 1
            else:
                self.stats["errors"] += 1
            answered += 1
            if self.pending:
                self.lat.append(now - self.pending.pop(0))
        if pos:
            del buf[:pos]
        if answered:
            self.stats["answered"] += answered
            if self.on_answer is not None:
                self.on_answer(self, answered)

    def connection_lost(self, exc):
        self.stats["lost"] += 1
        if not self.closed.done():
            self.closed.set_result(exc)


async def _connect_all(loop, host, port, frames, stats, lat, on_answer=None, concurrency=512):
    conns = [None] * len(frames)
    sem = asyncio.Semaphore(concurrency)

    async def one(i):
        async with sem:
            for attempt in range(20):
                try:
                    _, c = await loop.create_connection(lambda: LoadConn(frames[i], stats, lat, on_answer), host, port)
                    conns[i] = c
                    return
                except OSError:
                    stats["connect_retries"] += 1
                    await asyncio.sleep(0.05 * (attempt + 1))
            stats["connect_failed"] += 1

    await asyncio.gather(*(one(i) for i in range(len(frames))))
    return [c for c in conns if c is not None]


def _percentiles(lat: list) -> dict:
    if not lat:
        return {}
    s = sorted(lat)

    def q(p):
        return s[min(len(s) - 1, int(p * len(s)))] * 1000

    return {"p50_ms": round(q(0.50), 3), "p90_ms": round(q(0.90), 3), "p99_ms": round(q(0.99), 3),
            "max_ms": round(s[-1] * 1000, 3)}


# ---------------------------------------------------------------------------------------------------------------
# Scenarios (one process)


async def steady(host, port, n, offset, duration, rate, groups, consumer_share, warmup=1.0) -> dict:
    loop = asyncio.get_running_loop()
    fleet = make_fleet(n, offset, groups, consumer_share)
    addr = f"{host}:{port}"
    for c in fleet:
        c.broker_addr_table = {"broker-a": {0: addr}}
    frames = [c.heartbeat_frame(i + 1) for i, c in enumerate(fleet)]
    stats = {"answered": 0, "errors": 0, "lost": 0, "connect_retries": 0, "connect_failed": 0, "notifies": 0}
    lat: list = []
    closed_loop = rate <= 0
    measuring = {"on": False}

    def resend(conn, answered):  # closed loop: keep exactly one heartbeat in flight per connection
        if measuring["on"] is not None:
            now = time.perf_counter()
            for _ in range(answered):
                conn.send(now)

    conns = await _connect_all(loop, host, port, frames, stats, lat, resend if closed_loop else None)
    # registration round: every client's first heartbeat
    t0 = time.perf_counter()
    for c in conns:
        c.send(t0)
    while stats["answered"] < len(conns) and time.perf_counter() - t0 < 60:
        await asyncio.sleep(0.01)
    registered_s = time.perf_counter() - t0
    if not closed_loop:
        measuring["on"] = None
    await asyncio.sleep(warmup)
    lat.clear()
    a0, e0, t_start = stats["answered"], stats["errors"], time.perf_counter()
    if closed_loop:
        await asyncio.sleep(duration)
        measuring["on"] = None
    else:
        # open loop: every millisecond send the heartbeats due, round-robin over the connections
        i = 0
        sent = 0
        start = time.perf_counter()
        while True:
            now = time.perf_counter()
            elapsed = now - start
            if elapsed >= duration:
                break
            due = int(elapsed * rate) - sent
            for _ in range(due):
                conns[i].send(now)
                i += 1
                if i == len(conns):
                    i = 0
            sent += max(0, due)
            await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - t_start
    answered = stats["answered"] - a0
    # drain what is in flight so shutdown is clean
    t1 = time.perf_counter()
    while any(c.pending for c in conns) and time.perf_counter() - t1 < 10:
        await asyncio.sleep(0.01)
    # shutdown: UNREGISTER_CLIENT per group, then close
    for i, (c, sim) in enumerate(zip(conns, fleet)):
        for f in sim.unregister_frames(1_000_000 + i):
            c.send(time.perf_counter(), f)
    t2 = time.perf_counter()
    while any(c.pending for c in conns) and time.perf_counter() - t2 < 10:
        await asyncio.sleep(0.01)
    for c in conns:
        c.transport.close()
    return {"connections": len(conns), "registered_s": round(registered_s, 3), "answered": answered,
            "seconds": round(elapsed, 3), "errors": stats["errors"] - e0, "lost": stats["lost"],
            "connect_failed": stats["connect_failed"], "latencies": lat}


async def storm(host, port, n, offset, groups, consumer_share) -> dict:
    """All clients connect at once and heartbeat; time until every one is registered."""
    loop = asyncio.get_running_loop()
    fleet = make_fleet(n, offset, groups, consumer_share)
    frames = [c.heartbeat_frame(i + 1) for i, c in enumerate(fleet)]
    stats = {"answered": 0, "errors": 0, "lost": 0, "connect_retries": 0, "connect_failed": 0, "notifies": 0}
    lat: list = []
    t0 = time.perf_counter()

    def first(conn, answered):
        pass

    sem = asyncio.Semaphore(2048)
    conns = []

    async def one(i):
        async with sem:
            for attempt in range(50):
                try:
                    _, c = await loop.create_connection(lambda: LoadConn(frames[i], stats, lat, first), host, port)
                    c.send(time.perf_counter())
                    conns.append(c)
                    return
                except OSError:
                    stats["connect_retries"] += 1
                    await asyncio.sleep(0.02 * (attempt + 1))
            stats["connect_failed"] += 1

    await asyncio.gather(*(one(i) for i in range(n)))
    while stats["answered"] < len(conns) and time.perf_counter() - t0 < 120:
        await asyncio.sleep(0.005)
    total = time.perf_counter() - t0
    ok = sum(c.ok for c in conns)
    for c in conns:
        c.transport.close()
    return {"clients": n, "registered": ok, "seconds": round(total, 3), "errors": stats["errors"],
            "connect_retries": stats["connect_retries"], "connect_failed": stats["connect_failed"], "latencies": lat}


# ---------------------------------------------------------------------------------------------------------------
# Multi-process driver


def _worker(args: dict, out):
    raise_nofile()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args["scenario"] == "steady":
        res = asyncio.run(steady(args["host"], args["port"], args["n"], args["offset"], args["duration"],
                                 args["rate"], args["groups"], args["consumer_share"]))
    else:
        res = asyncio.run(storm(args["host"], args["port"], args["n"], args["offset"], args["groups"],
                                args["consumer_share"]))
    out.put(res)


def run(scenario: str, host: str, port: int, clients: int, procs: int = 1, duration: float = 5.0,
        rate: float = 0.0, groups: int = 100, consumer_share: float = 0.5) -> dict:
    """Run a scenario over ``procs`` processes and merge their results."""
    if not ipaddress.ip_address(host).is_loopback:
        raise SystemExit("loadgen only targets loopback addresses")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    ps, off = [], 0
    for i, n in enumerate(per):
        a = dict(scenario=scenario, host=host, port=port, n=n, offset=off, duration=duration,
                 rate=rate / procs, groups=groups, consumer_share=consumer_share)
        off += n
        p = ctx.Process(target=_worker, args=(a, q), daemon=True)
        p.start()
        ps.append(p)
    results = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(10)
    lat = [x for r in results for x in r.pop("latencies")]
    merged = {"scenario": scenario, "procs": procs}
    if scenario == "steady":
        seconds = max(r["seconds"] for r in results)
        merged.update(connections=sum(r["connections"] for r in results),
                      registered_s=max(r["registered_s"] for r in results),
                      answered=sum(r["answered"] for r in results), seconds=seconds,
                      heartbeats_per_s=round(sum(r["answered"] for r in results) / seconds) if seconds else 0,
                      offered_rate=rate or "closed-loop", errors=sum(r["errors"] for r in results),
                      connect_failed=sum(r["connect_failed"] for r in results))
    else:
        merged.update(clients=sum(r["clients"] for r in results), registered=sum(r["registered"] for r in results),
                      seconds=max(r["seconds"] for r in results), errors=sum(r["errors"] for r in results),
                      connect_failed=sum(r["connect_failed"] for r in results))
    merged.update(_percentiles(lat))
    return merged


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=["steady", "storm"])
    p.add_argument("--broker", default="127.0.0.1:10911", help="broker address (loopback only)")
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=0.0, help="offered heartbeats/s (0 = closed loop)")
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--consumer-share", type=float, default=0.5)
    a = p.parse_args(argv)
    host, _, port = a.broker.rpartition(":")
    res = run(a.scenario, host, int(port), a.clients, a.procs, a.duration, a.rate, a.groups, a.consumer_share)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The connection protocol in process: native (engine.broker._protocol) against the twin (PyConnection).

    .venv/bin/python -m pytest bench/bench_protocol.py --benchmark-only --benchmark-columns=min,median \\
        --benchmark-group-by=group
    BENCH_PROTOCOL_CONNECTIONS=20000                         connections (default 20,000)

No sockets: each connection is a protocol object on a fake transport, fed one heartbeat per ``data_received`` (one
heartbeat per read, loadgen ``--burst 1``), round after round over every connection, through a broker's real
processors and registry. ``vary``: each client's heartbeat in its other HashSet orders in turn (loadgen ``--vary``),
so reads alternate between the repeat route and the full path; ``same``: the same bytes every time (the repeat
route). What this leaves out, and what the loadgen figures in BENCHMARKS.md include: the event loop, the
socket calls and the kernel. One round (every connection once) per benchmark round; the figure per heartbeat is
the round's time divided by the connections.
"""
import asyncio
import gc
import os
import tempfile
import tracemalloc

import pytest

from engine import loadgen
from engine.broker import server as server_mod
from engine.broker.config import BrokerConfig
from engine.broker.controller import Broker

N = int(os.environ.get("BENCH_PROTOCOL_CONNECTIONS", 20000))


class _Transport:
    __slots__ = ("peer",)

    def __init__(self, i):
        self.peer = ("127.0.0.1", 10000 + i % 50000)

    def get_extra_info(self, name):
        return self.peer

    def write(self, data):
        pass

    def get_write_buffer_size(self):
        return 0

    def close(self):
        pass

    abort = close

    def pause_reading(self):
        pass

    resume_reading = pause_reading


_FLEET = None


def _fleet():
    global _FLEET
    if _FLEET is None:
        fleet = loadgen.make_fleet(N, 0, 100, 0.5)
        _FLEET = [[loadgen.FrameTemplate(f, c.sub_version) for f in c.heartbeat_variants(loadgen.OPAQUE_BASE)]
                  for c in fleet]
    return _FLEET


def _implementations():
    out = [pytest.param(server_mod.PyConnection, id="twin")]
    if server_mod.NativeConnection is not None:
        out.insert(0, pytest.param(server_mod.NativeConnection, id="native"))
    return out


@pytest.mark.parametrize("shape", ["vary", "same"])
@pytest.mark.parametrize("cls", _implementations())
def test_one_heartbeat_per_read(benchmark, cls, shape):
    benchmark.group = f"{N} connections, one heartbeat per read, {shape}"
    variants = _fleet()
    loop = asyncio.new_event_loop()
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=tempfile.mkdtemp(prefix="bench-protocol-")))
    b.loop = b.server.loop = loop
    srv = b.server
    srv.repeats = True  # as `rmqhb serve` without ACL and recorder
    srv.max_connections = N + 1
    srv.connection_class = cls
    conns = []
    for i in range(N):
        c = srv.new_connection("main")
        c.connection_made(_Transport(i))
        conns.append(c)
    state = {"seq": 0}

    def frames():
        seq = state["seq"]
        state["seq"] = seq + 1
        pick = seq if shape == "vary" else 0
        return ([v[pick % len(v)].build(seq) for v in variants],), {}

    def one_round(frames):
        for c, f in zip(conns, frames):
            c.data_received(f)

    for _ in range(3):  # registration, then the first arming of each connection
        one_round(frames()[0][0])
    gc.collect()
    gc.freeze()  # as `rmqhb serve` does after start-up: the collector does not walk the registry every time
    try:
        benchmark.pedantic(one_round, setup=frames, rounds=int(os.environ.get("BENCH_PROTOCOL_ROUNDS", 8)))
    finally:
        gc.unfreeze()
        loop.close()
    m = b.metrics
    assert m.heartbeat_errors == 0 and not m.request_errors and not any(c.closing for c in conns)
    assert m.heartbeats == N * (3 + benchmark.stats.stats.rounds)
    benchmark.extra_info["us_per_heartbeat_min"] = round(benchmark.stats.stats.min / N * 1e6, 3)
    benchmark.extra_info["us_per_heartbeat_median"] = round(benchmark.stats.stats.median / N * 1e6, 3)


# ------------------------------------------------------------------------------------------------ memory


def connection_bytes(cls, repeats: bool, n: int, heartbeats: int = 4) -> float:
    """Traced bytes per connection (protocol object, its decoder and route, the registry's state for it) after
    ``heartbeats`` identical heartbeats on each of ``n`` connections, with the repeat route on or off."""
    variants = _fleet()[:n]
    loop = asyncio.new_event_loop()
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=tempfile.mkdtemp(prefix="bench-protocol-")))
    b.loop = b.server.loop = loop
    srv = b.server
    srv.repeats = repeats
    srv.max_connections = n + 1
    srv.connection_class = cls
    transports = [_Transport(i) for i in range(n)]
    frames = [[v[0].build(seq) for v in variants] for seq in range(heartbeats)]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        conns = []
        for t in transports:
            c = srv.new_connection("main")
            c.connection_made(t)
            conns.append(c)
        for batch in frames:
            for c, f in zip(conns, batch):
                c.data_received(f)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        loop.close()
    assert all((c.repeat is not None) == repeats for c in conns), "every connection armed (or none)"
    return used / n


@pytest.mark.parametrize("cls", _implementations())
def test_armed_connection_bytes(benchmark, cls):
    """Issue 15: an armed connection costs <= 0.5 KB over the same connection without the repeat route (its frame
    pattern, its route's armed answer and the registry's token), measured with tracemalloc."""
    benchmark.group = "memory per connection (repeat route on - off)"
    n = min(N, 5000)
    on, off = benchmark.pedantic(lambda: (connection_bytes(cls, True, n), connection_bytes(cls, False, n)),
                                 rounds=1, iterations=1)
    benchmark.extra_info.update(connections=n, bytes_armed=round(on), bytes_unarmed=round(off),
                                armed_overhead=round(on - off))
    print(f"\n{cls.__name__}: {on:.0f} B armed, {off:.0f} B without the route: {on - off:.0f} B overhead")
    assert on - off <= 512


# ------------------------------------------------------------------------------------------------ consumer lists


@pytest.mark.parametrize("members", [1_000, 10_000], ids=["1k", "10k"])
@pytest.mark.parametrize("cls", _implementations())
def test_consumer_list_ask(benchmark, cls, members):
    """GET_CONSUMER_LIST_BY_GROUP of a group of ``members`` consumers, through a connection's ``data_received``
    (inline dispatch, the processor, the answer's encoding and write): after a change in a group every member asks
    for this list, so a change costs the broker ``members`` of these. The figure is one ask."""
    import engine
    from engine.codec.enums import RequestCode

    benchmark.group = f"consumer list of a group of {members}"
    loop = asyncio.new_event_loop()
    b = Broker(BrokerConfig(listen_port=0, store_path_root_dir=tempfile.mkdtemp(prefix="bench-protocol-")))
    b.loop = b.server.loop = loop
    b.server.connection_class = cls
    reg = b.registry
    sub = (engine.SubscriptionData("T_list"),)
    for i in range(members):
        hb = engine.HeartbeatData(f"10.1.{i // 250}.{i % 250}@{i}#9876543210", (), (engine.ConsumerData(
            "G_list", engine.ConsumeType.CONSUME_PASSIVELY, engine.MessageModel.CLUSTERING,
            engine.ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, False, sub),))
        reg.heartbeat(("member", i), hb, engine.LanguageCode.JAVA, 479)
    conn = b.server.new_connection("main")
    conn.connection_made(_Transport(0))
    ask = engine.RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, opaque=7,
                                 ext_fields={"consumerGroup": "G_list"}).encode()
    try:
        benchmark.pedantic(conn.data_received, args=(ask,), rounds=30, warmup_rounds=1)
    finally:
        loop.close()
    assert b.metrics.requests[RequestCode.GET_CONSUMER_LIST_BY_GROUP] == 31 and not b.metrics.request_errors
    assert len(reg.consumer_ids("G_list")) == members

"""CPU per call of the native gRPC transport in process (issue 30's prepared path): a real broker's endpoint, stand-in
sockets, one call per read fed to ``H2Connection.data_received`` on the broker's loop, timed with
``time.thread_time``.

    .venv/bin/python bench/bench_prepared.py [--method Heartbeat|QueryRoute|QueryAssignment] [--connections 1]
        [--calls 20000]

``--connections N`` takes N connections (each its own session and HPACK state) in turn, one call each per pass:
with thousands, each read finds its connection's state cold. Every answer after a connection's first is a repeat
(Heartbeat) or a kept answer (QueryRoute / QueryAssignment); the run checks that they were. Run it in a checkout
of an older commit (with its extensions built) for a before figure.

With Heartbeat, the same run then times the remoting port's repeat route the same way on the same broker: N
remoting connections (the broker's own connection class, as `rmqhb serve`), one repeated heartbeat each per pass,
and prints the ratio.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="Heartbeat", choices=("Heartbeat", "QueryRoute", "QueryAssignment"))
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--calls", type=int, default=20000)
    a = p.parse_args(argv)
    logging.disable(logging.WARNING)
    from engine.broker.config import BrokerConfig
    from engine.broker.controller import Broker
    from engine.http2 import _frames_py as F
    from bench_h2frames import _Transport  # the stand-in socket of the bench suite's transport row
    from engine.http2 import server
    from engine.http2 import HpackEncoder
    from engine.registry.topic_config_manager import TopicConfig
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s

    if a.method == "Heartbeat":
        message = s.HeartbeatRequest(client_type=d.ClientType.PRODUCER).SerializeToString()
    elif a.method == "QueryRoute":
        r = s.QueryRouteRequest()
        r.topic.name = "BenchT"
        r.endpoints.addresses.add(host="127.0.0.1", port=8081)
        message = r.SerializeToString()
    else:
        r = s.QueryAssignmentRequest()
        r.topic.name, r.group.name = "BenchT", "BenchG"
        r.endpoints.addresses.add(host="127.0.0.1", port=8081)
        message = r.SerializeToString()
    body = b"\0" + len(message).to_bytes(4, "big") + message
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = tempfile.TemporaryDirectory()
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=store.name,
                            grpc_server_port=port, grpc_transport="native", grpc_max_sessions_per_ip=1 << 30,
                            grpc_max_sessions_per_connection=1 << 30, grpc_max_settings_bytes_per_ip=1 << 30,
                            grpc_max_settings_bytes_total=1 << 30)).start()
    ep = b.grpc
    n = max(1, a.connections)
    passes = max(1, a.calls // n)
    out = {}

    async def run():
        b.registry.update_topic_config(TopicConfig("BenchT", read_queue_nums=4, write_queue_nums=4, perm=6))
        conns, reads = [], []
        for k in range(n):
            client_id = f"bench@prepared@{k}"

            class Ctx:
                def invocation_metadata(self):
                    return (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"),
                            ("x-mq-client-version", "5.1.2"))

                def peer(self):
                    return "ipv4:127.0.0.1:40000"
            settings = d.Settings(client_type=d.ClientType.PRODUCER)
            settings.publishing.topics.add(name="BenchT")
            ep._update_settings(ep._session(Ctx(), create=True), settings)
            conn = server.H2Connection(ep._server)
            conn.connection_made(_Transport())
            conn.data_received(F.PREFACE + F.settings() + F.settings(ack=True))
            hpack = HpackEncoder()
            headers = [(b":method", b"POST"), (b":scheme", b"http"),
                       (b":path", f"/apache.rocketmq.v2.MessagingService/{a.method}".encode()),
                       (b":authority", b"127.0.0.1:8081"), (b"te", b"trailers"),
                       (b"content-type", b"application/grpc"), (b"grpc-timeout", b"2999m"),
                       (b"x-mq-client-id", client_id.encode()), (b"x-mq-language", b"PYTHON"),
                       (b"x-mq-client-version", b"5.1.2"), (b"x-mq-protocol", b"v2"),
                       (b"user-agent", b"grpc-python/1.85.3 grpc-c/52.0.0 (linux; chttp2)")]
            reads.append([F.frame(F.HEADERS, F.FLAG_END_HEADERS, 1 + 2 * r, hpack.encode(headers))
                          + F.frame(F.DATA, F.FLAG_END_STREAM, 1 + 2 * r, body) for r in range(passes + 1)])
            conns.append(conn)
        for k in range(n):  # the first call: arms the repeat, keeps the answer
            conns[k].data_received(reads[k][0])
        before = ep.heartbeat_repeats + getattr(ep, "answer_cache_hits", 0)
        t0 = time.thread_time()
        for r in range(1, passes + 1):
            for k in range(n):
                conn = conns[k]
                conn.data_received(reads[k][r])
                conn.send_window = 1 << 30  # the stand-in client sends no WINDOW_UPDATE
        out["us"] = (time.thread_time() - t0) / (n * passes) * 1e6
        out["prepared"] = ep.heartbeat_repeats + getattr(ep, "answer_cache_hits", 0) - before
        for conn in conns:
            conn.connection_lost(None)
        if a.method == "Heartbeat":
            out["remoting_us"] = remoting(n, passes)

    def remoting(n, passes):
        """The remoting repeat route timed as above: each connection's one heartbeat, the same bytes every pass."""
        from bench_protocol import _Transport as RemotingTransport
        from engine import loadgen

        srv = b.server
        srv.repeats, srv.max_connections = True, srv.max_connections + n  # as `rmqhb serve` without ACL, recorder
        fleet = loadgen.make_fleet(n, 0, 100, 0.0)  # producers, as the 5.x sessions above
        frames = [loadgen.FrameTemplate(c.heartbeat_variants(loadgen.OPAQUE_BASE)[0], c.sub_version) for c in fleet]
        conns = []
        for k in range(n):
            conn = srv.new_connection("main")
            conn.connection_made(RemotingTransport(k))
            conns.append(conn)
        reads = [[f.build(r) for r in range(3)] for f in frames]  # opaques differ; the repeat route skips them
        for r in range(2):  # registration, then the arming
            for k in range(n):
                conns[k].data_received(reads[k][r])
        before = b.metrics.heartbeats
        t0 = time.thread_time()
        for _ in range(passes):
            for k in range(n):
                conns[k].data_received(reads[k][2])
        us = (time.thread_time() - t0) / (n * passes) * 1e6
        assert b.metrics.heartbeats - before == n * passes and b.metrics.heartbeat_errors == 0
        assert all(c.repeat is not None for c in conns), "every remoting connection armed"
        for conn in conns:
            conn.connection_lost(None)
        return us

    try:
        asyncio.run_coroutine_threadsafe(run(), b.loop).result()
    finally:
        b.stop()
        store.cleanup()
    print(f"{a.method}, {n} connection(s), {n * passes} calls: {out['us']:.2f} us per call "
          f"({out['prepared']} answered as repeats or kept answers)")
    if "remoting_us" in out:
        print(f"remoting heartbeat, {n} connection(s), {n * passes} calls: {out['remoting_us']:.2f} us per call "
              f"(repeat route); 5.x / remoting: {out['us'] / out['remoting_us']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

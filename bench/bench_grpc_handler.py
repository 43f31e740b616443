"""CPU of the gRPC Heartbeat handler alone (this endpoint's code, no grpc transport), in-process, per call.

    .venv/bin/python bench/bench_grpc_handler.py [--sessions 1000] [--rounds 30] [--root DIR]

Starts a Broker with grpcServerPort, registers N sessions from Settings on its loop (half producers of one of 100
topics, half push consumers of one of 100 groups with a TAG subscription), then, on the loop, awaits the servicer's
``Heartbeat`` once per session per round with a stand-in call context (the metadata a 5.x client sends) and prints
the handler's CPU per call (``time.thread_time``), min and median over the rounds; every answer is checked OK.
``--root`` runs another checkout of this repository (e.g. a ``git archive`` of an older commit, with the built
extensions copied in) to compare; before the Heartbeat handler took bytes it is given the parsed request.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path


class _Context:
    def __init__(self, client_id: str):
        self._md = (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"), ("x-mq-client-version", "5.1.2"),
                    ("x-mq-protocol", "v2"), ("x-mq-date-time", "20261126T141200Z"),
                    ("x-mq-request-id", "f122a1e0-dbcf-4ca4-9db7-221903354be7"),
                    ("user-agent", "grpc-python/1.85.3 grpc-c/52.0.0 (linux; chttp2)"))

    def invocation_metadata(self):
        return self._md

    def peer(self):
        return "ipv4:127.0.0.1:40000"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    a = p.parse_args(argv)
    sys.path.insert(0, a.root)
    logging.disable(logging.WARNING)
    from engine.broker import grpc_endpoint as ge
    from engine.broker.controller import Broker
    from engine.broker.config import BrokerConfig
    from rocketmq.grpc_protocol import definition_pb2 as d
    from rocketmq.grpc_protocol import service_pb2 as s

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = tempfile.TemporaryDirectory()
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=store.name,
                            grpc_server_port=port)).start()
    ep = b.grpc
    servicer = ge._Servicer(ep)
    raw = hasattr(ge, "_client_id")  # the handler takes the serialized request
    contexts, requests = [], []

    async def setup():
        for i in range(a.sessions):
            ctx = _Context(f"bench@{i}@0@x")
            st = d.Settings(client_type=d.ClientType.PUSH_CONSUMER if i % 2 else d.ClientType.PRODUCER)
            if i % 2:
                st.subscription.group.name = f"G{i % 100}"
                e = st.subscription.subscriptions.add()
                e.topic.name, e.expression.type, e.expression.expression = f"T{i % 100}", d.FilterType.TAG, "TagA"
                req = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER, group=d.Resource(name=f"G{i % 100}"))
            else:
                st.publishing.topics.add(name=f"T{i % 100}")
                req = s.HeartbeatRequest(client_type=d.ClientType.PRODUCER)
            assert ep._update_settings(ep._session(ctx, create=True), st) is None
            contexts.append(ctx)
            requests.append(req.SerializeToString() if raw else req)

    async def run():
        per_call = []
        for _ in range(a.rounds):
            t0 = time.thread_time()
            for req, ctx in zip(requests, contexts):
                answer = await servicer.Heartbeat(req, ctx)
            per_call.append((time.thread_time() - t0) / a.sessions * 1e6)
            answer = s.HeartbeatResponse.FromString(answer) if raw else answer
            assert answer.status.code == d.Code.OK, answer
        return per_call

    try:
        asyncio.run_coroutine_threadsafe(setup(), b.loop).result()
        per_call = asyncio.run_coroutine_threadsafe(run(), b.loop).result()
    finally:
        b.stop()
        store.cleanup()
    print(f"{a.root}: Heartbeat handler CPU per call, {a.sessions} sessions, {a.rounds} rounds: "
          f"min {min(per_call):.2f} us, median {statistics.median(per_call):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

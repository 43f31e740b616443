"""Capture the requests of the official RocketMQ 5.x Python client as protobuf text (tests/data/grpc).

    python scripts/grpc_capture.py [--python tests/interop/.v5/bin/python] [--out tests/data/grpc/python-5.1.2.txtpb]

Starts a broker with a gRPC endpoint whose ``on_request`` hook keeps every request, runs tests/interop/v5_driver.py
(a producer, a push consumer, a simple consumer with one receive) with the 5.x client's own venv (the interop test
creates tests/interop/.v5), waits for two heartbeat rounds, shuts the clients down and writes what the broker got.
"""
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

from engine.broker.controller import Broker  # noqa: E402
from engine.broker.config import BrokerConfig  # noqa: E402
from engine.broker.grpc_endpoint import format_capture  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=str(ROOT / "tests/interop/.v5/bin/python"))
    ap.add_argument("--out", default=str(ROOT / "tests/data/grpc/python-5.1.2.txtpb"))
    ap.add_argument("--wait", type=float, default=22.0, help="seconds the clients run (heartbeats every 10 s)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=tmp + "/store",
                                     grpc_server_port=port)).start()
        broker.grpc.on_request = lambda method, md, req: entries.append((method, md, req))
        spec = {"endpoint": f"127.0.0.1:{port}", "producerTopics": ["TopicCapture"],
                "pushConsumers": [{"group": "GID_CAPTURE_PUSH", "topic": "TopicCapture", "expr": "TagA || TagB"}],
                "simpleConsumers": [{"group": "GID_CAPTURE_SIMPLE", "topic": "TopicCapture", "expr": "*"}],
                "receive": True}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["HOME"] = tmp
        proc = subprocess.Popen([args.python, str(ROOT / "tests/interop/v5_driver.py"), json.dumps(spec)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        print(proc.stdout.readline().strip(), file=sys.stderr)
        time.sleep(args.wait)
        proc.stdin.write("close\n")
        proc.stdin.flush()
        proc.wait(120)
        broker.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(format_capture(entries))
    print(f"{len(entries)} requests -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Drive `rmqhb serve` with a small simulated fleet for packet-capture test data (tests/data/pcap/README.md).

Each client is bench/loadgen.py's SimClient (the client side of MQClientInstance's heartbeat) on its own TCP
connection: it sends ``--heartbeats`` heartbeats (one at a time, each answered before the next, ``--interval`` s
apart per round), then, depending on its index, unregisters every group and closes (FIN), closes without
unregistering (FIN), or resets the connection (RST, SO_LINGER 0). Some clients use the ROCKETMQ binary header,
some announce other languages and versions. A manifest (JSON) says what each client sent and what it received,
so tests compare what the capture reader finds with what the broker saw.
"""
from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import engine  # noqa: E402

try:  # the load generator's simulated client (engine/loadgen.py; bench/loadgen.py before it moved)
    from engine.loadgen import SimClient
except ImportError:
    from loadgen import SimClient

LANGS = [(engine.LanguageCode.JAVA, 479), (engine.LanguageCode.GO, 317), (engine.LanguageCode.CPP, 395),
         (engine.LanguageCode.JAVA, 409)]


def read_frame(sock) -> bytes:
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    head = exact(4)
    (n,) = struct.unpack(">i", head)
    return head + exact(n)


class Client:
    def __init__(self, index: int, family, addr, groups: int):
        g = index % groups
        if index % 3 != 2:
            subs = [(f"TopicCap{g}", "TagA || TagB")]
            if index == 4:  # a member of CID_cap_0 whose subscription differs from the others'
                subs = [(f"TopicCap{g}", "TagC")]
            self.sim = SimClient(index, consumers=[(f"CID_cap_{g}", engine.MessageModel.CLUSTERING, subs)],
                                 ip="127.0.0.1")
        else:
            self.sim = SimClient(index, producers=[f"PID_cap_{g}"], ip="127.0.0.1")
        self.index = index
        self.language, self.version = LANGS[index % len(LANGS)]
        self.serialize = "ROCKETMQ" if index % 5 == 3 else "JSON"
        self.close_kind = ("unregister", "fin", "rst")[index % 3] if index % 3 != 2 else ("unregister", "rst")[index % 2]
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.connect(addr)
        host, port = self.sock.getsockname()[:2]
        self.local = f"{host}:{port}"  # as the broker's transport reports the peer (and the recorder writes it)
        self.opaque = index * 1000
        self.sent = {"heartbeats": 0, "unregisters": 0}
        self.notifications = 0

    def request(self, cmd) -> None:
        self.opaque += 1
        cmd.opaque = self.opaque
        self.sock.sendall(cmd.encode())
        while True:
            f = engine.decode_frame(read_frame(self.sock))
            if f.is_response and f.opaque == self.opaque:
                return
            if f.code == engine.RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                self.notifications += 1

    def heartbeat(self) -> None:
        body = engine.encode_heartbeat(self.sim.prepare_heartbeat_data())
        self.request(engine.RemotingCommand(engine.RequestCode.HEART_BEAT, language=self.language, version=self.version,
                                            ext_fields={}, body=body, serialize_type=self.serialize))
        self.sent["heartbeats"] += 1

    def close(self) -> None:
        if self.close_kind == "unregister":
            for frame in self.sim.unregister_frames(0):
                self.request(engine.decode_frame(frame))
                self.sent["unregisters"] += 1
        if self.close_kind == "rst":
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:  # read what the broker pushed (NOTIFY): unread data at close makes the kernel send RST, not FIN
            self.sock.settimeout(0.05)
            try:
                while True:
                    if engine.decode_frame(read_frame(self.sock)).code == engine.RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                        self.notifications += 1
            except (socket.timeout, ConnectionError):
                pass
        self.sock.close()

    def manifest(self) -> dict:
        return {"client_id": self.sim.client_id, "addr": self.local, "language": self.language.name,
                "version": self.version, "serialize": self.serialize, "close": self.close_kind,
                "groups": [g for g, _, _ in self.sim.consumer_table] + list(self.sim.producer_table),
                "role": "consumer" if self.sim.consumer_table else "producer", **self.sent,
                "notifications_received": self.notifications}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", default="127.0.0.1:10911")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--heartbeats", type=int, default=5)
    p.add_argument("--interval", type=float, default=0.05, help="seconds between rounds of heartbeats")
    p.add_argument("--manifest", type=Path, required=True)
    args = p.parse_args(argv)
    host, _, port = args.broker.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    clients = []
    for i in range(args.clients):  # members join one by one: the broker notifies the group's earlier members
        c = Client(i, family, (host, int(port)), args.groups)
        c.heartbeat()
        clients.append(c)
        time.sleep(args.interval)
    for _ in range(args.heartbeats - 1):
        for c in clients:
            c.heartbeat()
        time.sleep(args.interval)
    for c in clients:
        c.close()
        time.sleep(args.interval / 2)
    time.sleep(0.3)  # let the last FIN/RST and answers reach the capture
    args.manifest.write_text(json.dumps({"broker": args.broker, "clients": [c.manifest() for c in clients]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

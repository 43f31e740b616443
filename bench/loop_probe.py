"""The broker event loop's own latency, apart from the load generator: PING round trips on one idle HTTP/2
connection to the broker's gRPC port, one every 10 ms, for as long as it runs.

    .venv/bin/python bench/loop_probe.py PORT [--seconds 600]

A PING is answered by the broker's loop with no handler, no registry and no Python object of a session: its round
trip is the time the loop took to get to the read (plus two loopback hops, ~0.1 ms). Ends on SIGTERM / SIGINT or
after ``--seconds``; then prints one JSON line: ``{"samples": [[time.monotonic() at the send, rtt_s], ...]}``
(``bench_grpc.py --loop-probe`` keeps those in its measured window: CLOCK_MONOTONIC is the machine's, the same in
every process). The gRPC port answers PINGs under either protocol's load, since both ports are served by one loop.
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import struct
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
INTERVAL_S = 0.010  # 100 PINGs a second: half the broker's control-frame budget (200 a second)


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop


class Probe:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(PREFACE + SETTINGS)
        self.buf = b""

    def _frame(self):
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    head, payload, self.buf = self.buf[:9], self.buf[9:9 + n], self.buf[9 + n:]
                    return head[3], head[4], payload
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the probe's connection")
            self.buf += data

    def ping(self, k: int) -> float:
        """One PING's round trip, seconds (the broker's SETTINGS are acknowledged on the way)."""
        payload = struct.pack(">Q", k)
        t0 = time.perf_counter()
        self.sock.sendall(b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + payload)
        while True:
            ftype, flags, data = self._frame()
            if ftype == 4 and not flags & 1:
                self.sock.sendall(SETTINGS_ACK)
            elif ftype == 6 and flags & 1 and data == payload:
                return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("--seconds", type=float, default=600.0)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    samples = []
    try:
        probe = Probe(a.port)
        end = time.monotonic() + a.seconds
        k = 0
        while time.monotonic() < end:
            k += 1
            t = time.monotonic()
            samples.append((round(t, 6), round(probe.ping(k), 7)))
            time.sleep(INTERVAL_S)
    except _Stop:
        pass
    except OSError as e:
        print(f"loop_probe: {e}", file=sys.stderr)
        print(json.dumps({"samples": samples, "error": str(e)}), flush=True)
        return 1
    print(json.dumps({"samples": samples}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

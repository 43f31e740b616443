"""Make the packet captures of tests/data/pcap (run as root: tcpdump captures on loopback).

For each scenario: start `rmqhb serve --record <name>.rec` on a free port (fresh store; the broker records every
heartbeat it serves, to compare the capture's records with), start tcpdump on that port, drive the broker
with scripts/pcap_drive.py (bench/loadgen.py's simulated clients), stop tcpdump, stop the broker. Each capture
gets a manifest (``<name>.json``: what every client sent, received and how it closed). The derived captures
(pcapng, rotated files, injected loss / reordering) are written by scripts/pcap_tool.py from these.

    .venv/bin/python scripts/make_pcap_captures.py tests/data/pcap [NAME...]

``ons-lo-ipv4`` needs ali-ons: ``npm ci`` with tests/interop/node's lockfile in $ONS_NODE_DIR (default
tests/interop/.node, where the interop tests install it). ``cpp-lo-ipv4`` needs the C++ client (PyPI rocketmq
0.4.4, bundling Apache rocketmq-client-cpp's librocketmq.so) in $CPP_CLIENT_DIR (default tests/interop/.cpp, where
the interop tests ``pip install --target`` it).
"""
from __future__ import annotations

import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

SCENARIOS = {
    # name: (tcpdump interface + link type args, listen host, client count, heartbeats each)
    "lo-eth-ipv4": (["-i", "lo"], "127.0.0.1", 7, 6),
    "any-sll-ipv4": (["-i", "any", "-y", "LINUX_SLL"], "127.0.0.1", 5, 4),
    "any-sll2-ipv6": (["-i", "any", "-y", "LINUX_SLL2"], "::1", 6, 4),
    # the real Node.js client (npm ali-ons 3.12.0, tests/interop/ons_driver.js): a producer and a consumer of one
    # client instance, 35 s (its first and second heartbeats), then closed (UNREGISTER_CLIENT, FIN)
    "ons-lo-ipv4": (["-i", "lo"], "127.0.0.1", 0, 0),
    # the real C++ client (PyPI rocketmq 0.4.4 = rocketmq-client-cpp, tests/interop/cpp_driver.py): two client
    # processes, the first a producer and a consumer, the second a consumer of the same group joining 5 s later
    # (NOTIFY_CONSUMER_IDS_CHANGED to the first); 35 s, then each shut down (UNREGISTER_CLIENT, FIN)
    "cpp-lo-ipv4": (["-i", "lo"], "127.0.0.1", 0, 0),
}
#: where ali-ons is installed (npm ci in tests/interop/node's lockfile), for the ons-lo-ipv4 capture
ONS_NODE_DIR = Path(os.environ.get("ONS_NODE_DIR", ROOT / "tests" / "interop" / ".node"))
#: where the C++ client is installed (pip install --target, rocketmq==0.4.4), for the cpp-lo-ipv4 capture
CPP_CLIENT_DIR = Path(os.environ.get("CPP_CLIENT_DIR", ROOT / "tests" / "interop" / ".cpp"))


def free_port(host: str) -> int:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"broker did not listen on {host}:{port}")


def drive_ons(host: str, port: int, manifest: Path) -> None:
    """ali-ons: one producer and one consumer (TagA) in one client instance, the broker as its name server."""
    import json

    spec = {"nameSrv": f"{host}:{port}", "producerGroup": "PID_ons_cap",
            "consumers": [{"group": "CID_ons_cap", "topic": "TopicOnsCap", "expr": "TagA"}]}
    env = dict(os.environ, ONS_NODE_DIR=str(ONS_NODE_DIR))
    p = subprocess.Popen(["node", str(ROOT / "tests" / "interop" / "ons_driver.js"), json.dumps(spec)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready = p.stdout.readline().strip()
    if not ready.startswith("READY"):
        p.kill()
        raise RuntimeError(f"ali-ons did not start: {ready!r}")
    time.sleep(35)
    p.stdin.write("close\n")
    p.stdin.flush()
    closed = p.stdout.readline().strip()
    p.wait(30)
    manifest.write_text(json.dumps({"broker": f"{host}:{port}", "client": "ali-ons 3.12.0", "spec": spec,
                                    "client_id": ready.split(" ", 1)[1], "closed": closed == "CLOSED"}, indent=1))


def drive_cpp(host: str, port: int, manifest: Path) -> None:
    """rocketmq-client-cpp: client A (producer PID_cpp_cap + consumer CID_cpp_cap) and, 5 s later, client B (a
    second consumer of CID_cpp_cap, other process); both heartbeat, B is shut down after 35 s, then A."""
    import json

    spec_a = {"nameSrv": f"{host}:{port}", "producerGroup": "PID_cpp_cap",
              "consumers": [{"group": "CID_cpp_cap", "topic": "TopicCppCap", "expr": "TagA || TagB"}]}
    spec_b = {"nameSrv": f"{host}:{port}",
              "consumers": [{"group": "CID_cpp_cap", "topic": "TopicCppCap", "expr": "TagA || TagB"}]}
    procs = []
    with tempfile.TemporaryDirectory() as home:  # the library writes its logs under $HOME/logs/rocketmq-cpp
        env = dict(os.environ, PYTHONPATH=str(CPP_CLIENT_DIR), HOME=home)
        try:
            for spec in (spec_a, spec_b):
                p = subprocess.Popen([PY, str(ROOT / "tests" / "interop" / "cpp_driver.py"), json.dumps(spec)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
                procs.append(p)
                ready = p.stdout.readline().strip()
                if ready != "READY":
                    raise RuntimeError(f"the C++ client did not start: {ready!r}")
                if spec is spec_a:
                    time.sleep(5)
            time.sleep(35)
            closed = []
            for p in reversed(procs):  # B first, then A
                p.stdin.write("close\n")
                p.stdin.flush()
                # rocketmq-client-cpp 0.4.4 sometimes aborts inside shutdown() after it has unregistered
                line = p.stdout.readline().strip()
                p.wait(60)
                closed.append({"pid": p.pid, "said": line, "exit": p.returncode})
                time.sleep(2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    manifest.write_text(json.dumps({
        "broker": f"{host}:{port}", "client": "rocketmq-client-cpp (PyPI rocketmq 0.4.4)",
        "clients": [{"name": n, "pid": p.pid, "client_id_prefix": f"{p.pid}-", "spec": s}
                    for n, p, s in zip("AB", procs, (spec_a, spec_b))],
        "shutdown_order": ["B", "A"], "closed": closed}, indent=1))


def capture(name: str, out: Path) -> None:
    dump_args, host, clients, heartbeats = SCENARIOS[name]
    port = free_port(host)
    with tempfile.TemporaryDirectory() as store:
        record = out / f"{name}.rec"  # what the broker itself recorded (its recorder), to compare with
        shutil.rmtree(record, ignore_errors=True)
        broker = subprocess.Popen([PY, "-m", "engine", "serve", "--listenPort", str(port), "--listenHost", host,
                                   "--fastPortEnable", "false", "--storePathRootDir", store, "--log-level", "WARNING",
                                   "--record", str(record)], cwd=ROOT)
        try:
            # the broker's own connection check must not be in the capture: wait before tcpdump starts
            wait_port(host, port)
            pcap = out / f"{name}.pcap"
            dump = subprocess.Popen(["tcpdump", "--immediate-mode", "-U", "-s", "0", "-w", str(pcap), *dump_args, f"tcp port {port}"],
                                    stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            if name.startswith("ons-"):
                drive_ons(host, port, out / f"{name}.json")
            elif name.startswith("cpp-"):
                drive_cpp(host, port, out / f"{name}.json")
            else:
                subprocess.run([PY, str(ROOT / "scripts" / "pcap_drive.py"), "--broker",
                                f"[{host}]:{port}" if ":" in host else f"{host}:{port}", "--clients", str(clients),
                                "--heartbeats", str(heartbeats), "--manifest", str(out / f"{name}.json")], check=True)
            time.sleep(0.5)
            dump.send_signal(signal.SIGINT)
            dump.wait(10)
        finally:
            broker.send_signal(signal.SIGINT)
            try:
                broker.wait(10)
            except subprocess.TimeoutExpired:
                broker.kill()
    if name == "any-sll-ipv4":  # stored gzipped: the reader takes .gz captures
        with open(pcap, "rb") as f, gzip.open(str(pcap) + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        os.unlink(pcap)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else ROOT / "tests" / "data" / "pcap")
    out.mkdir(parents=True, exist_ok=True)
    for name in (argv[1:] or SCENARIOS):
        capture(name, out)
        print(f"captured {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

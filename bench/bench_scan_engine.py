"""`rmqhb scan` end to end, in this process (`--engine local`) and on Spark (`--engine spark`): the wall time and
the CPU seconds of the whole command (a subprocess: interpreter start, imports, scan, report), on a small generated
broker log, a small recording and the test captures. The in-process engine's target: well under a second of wall
time for such an input on an idle machine; Spark's start alone costs 10-30 s.

Run::

    .venv/bin/python bench/bench_scan_engine.py [--rounds 3] [--engines local,spark]
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PCAP = ROOT / "tests" / "data" / "pcap"


def inputs(d: Path) -> dict:
    from engine.bindings import brokerlog as bl
    from engine.recording.synth import FleetConfig, FleetGenerator

    bl.generate_broker_log(d / "logs" / "broker.log", groups=3, members=4, restarts=1, seed=1)
    FleetGenerator(FleetConfig(clients=20, groups=4, days=0.1, seed=2)).write(d / "rec")
    return {"broker log": [d / "logs", "--log-tz", "UTC"], "recording": [d / "rec"],
            "captures": [PCAP / "lo-eth-ipv4.pcap", PCAP / "any-sll-ipv4.pcap.gz", PCAP / "rotated-ipv6"]}


def run(argv, out: Path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "engine", "scan", *map(str, argv), "--out", str(out), "--no-plots",
                        "--no-progress"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if p.returncode not in (0, 3):
        raise SystemExit(f"scan failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return wall, cpu, p.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="local,spark")
    a = ap.parse_args()
    os.environ.pop("RMQHB_DEBUG", None)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for kind, argv in inputs(d).items():
            for engine in a.engines.split(","):
                rounds = [run([*argv, "--engine", engine], d / f"out-{kind}-{engine}-{i}")
                          for i in range(a.rounds if engine == "local" else 1)]
                wall, cpu, line = min(rounds)
                print(f"{kind:>10} {engine:>5}: wall {wall:6.2f} s  CPU {cpu:6.2f} s  (best of {len(rounds)})")
                print(f"{'':>18}{line}")


if __name__ == "__main__":
    main()

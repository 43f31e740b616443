"""Before/after runs of the load generator against brokers from two source trees, interleaved.

    # a "before" tree: this tree's engine/ with the front-end files of an older revision
    mkdir -p /tmp/before && cp -r engine /tmp/before/
    for f in server processors broker; do git show f51fa34:engine/$f.py > /tmp/before/engine/$f.py; done
    python bench/compare_server.py --trees /tmp/before,. --reps 2 --out results.jsonl \\
        --scenario '1k closed d1={"scenario":"steady","clients":1000,"duration":5}' \\
        --scenario '19k open 20k/s={"scenario":"steady","clients":19000,"procs":2,"duration":5,"rate":20000}' \\
        --scenario 'storm 19k={"scenario":"storm","clients":19000,"procs":2}'

Every run starts a fresh broker (own process and session, fresh store) from the tree, runs one loadgen scenario
(keyword arguments of :func:`loadgen.run`) with the broker's pid for CPU accounting, records the broker's RSS, the
load average and the result as one JSON line, and stops the broker. Trees alternate within each repetition so a
change in the machine's load hits both alike. Extra broker properties: ``name={...}|--notifyCoalesceWindowMs 100``.
``--pin`` runs each broker on CPU 0 and the load generator (its worker processes too) on CPU 1, as the figures in
BENCHMARKS.md that say "pinned".
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import loadgen  # noqa: E402


def start_broker(tree: str, extra=(), cpu: int | None = None):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    store = tempfile.mkdtemp(prefix="compare-store-")
    cmd = [sys.executable, "-m", "engine", "serve", "--listenPort", str(port), "--listenHost", "127.0.0.1",
           "--fastPortEnable", "false", "--storePathRootDir", store, "--log-level", "WARNING", *extra]
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    proc = subprocess.Popen(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), stdout=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=pin)
    line = proc.stdout.readline()
    if "boot success" not in line:
        proc.kill()
        raise RuntimeError(f"broker from {tree} did not start: {line!r}")
    return proc, port, store


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def parse_scenario(text: str):
    name, _, rest = text.partition("=")
    spec, _, extra = rest.partition("|")
    return name, json.loads(spec), extra.split()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="comma-separated source trees (the first is 'before')")
    p.add_argument("--scenario", action="append", required=True, help='NAME={"scenario": ...}[|--prop value ...]')
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--out", default="-", help="JSON lines file (appended), - for stdout only")
    p.add_argument("--pin", action="store_true", help="broker on CPU 0, load generator on CPU 1")
    a = p.parse_args(argv)
    if a.pin:
        os.sched_setaffinity(0, {1})  # this process runs the load generator; its workers inherit the mask
    trees = [str(Path(t).resolve()) for t in a.trees.split(",")]
    out = open(a.out, "a") if a.out != "-" else None
    for name, spec, extra in map(parse_scenario, a.scenario):
        for rep in range(a.reps):
            for i, tree in enumerate(trees):
                proc, port, store = start_broker(tree, extra, 0 if a.pin else None)
                load = open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else ""
                try:
                    res = loadgen.run(host="127.0.0.1", port=port, server_pid=proc.pid, **spec)
                    res["broker_rss_mb"] = rss_mb(proc.pid)
                finally:
                    proc.terminate()
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                    shutil.rmtree(store, ignore_errors=True)
                rec = {"name": name, "tree": tree, "label": "before" if i == 0 and len(trees) > 1 else "after",
                       "rep": rep, "loadavg": load, "when": time.strftime("%H:%M:%S"), "broker_args": extra, **res}
                line = json.dumps(rec)
                print(line, flush=True)
                if out is not None:
                    out.write(line + "\n")
                    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

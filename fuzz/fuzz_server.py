"""Long run of the wire-level fuzzer (fuzz/wire.py) against one live broker.

    .venv/bin/python fuzz/fuzz_server.py --minutes 15 [--examples-per-round 200] [--steps 40] [--io-workers 2]
        [--max-frame-size BYTES] [--rss-growth-mb 256]

Runs the state machine in rounds (each round a fresh hypothesis run of ``--examples-per-round`` examples) until the
time is up, then checks that the broker let go of everything (connections, partial frames) and that the process
(the broker runs in it) did not keep growing: its RSS after the last round may exceed the RSS after the second
round (hypothesis and the allocator have warmed up by then) by at most ``--rss-growth-mb``. Prints one line per
round on stderr and one JSON line at the end: rounds, examples, requests by code, frame errors, connections the
broker closed, log lines, RSS per round, findings. A finding stops the run with the failing sequence (hypothesis
prints it shrunk) and exit status 1.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hypothesis import HealthCheck, settings  # noqa: E402

import wire  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--examples-per-round", type=int, default=200)
    p.add_argument("--steps", type=int, default=40, help="stateful steps per example at most")
    p.add_argument("--io-workers", type=int, default=0, help="ioWorkers of the broker (0: sockets on its loop)")
    p.add_argument("--max-frame-size", type=int, default=wire.BROKER_SETTINGS["max_frame_size"])
    p.add_argument("--rss-growth-mb", type=float, default=256.0)
    a = p.parse_args(argv)
    started = time.monotonic()
    rounds = 0
    rss_mb: list = []
    with tempfile.TemporaryDirectory(prefix="wire-fuzz-") as store:
        fixture = wire.BrokerFixture(store, io_workers=a.io_workers, max_frame_size=a.max_frame_size)
        try:
            while time.monotonic() - started < a.minutes * 60:
                machine = wire.make_machine(fixture)
                machine.TestCase.settings = settings(max_examples=a.examples_per_round,
                                                     stateful_step_count=a.steps, deadline=None, database=None,
                                                     suppress_health_check=list(HealthCheck))
                try:
                    machine.TestCase().runTest()
                except Exception as e:  # a finding: hypothesis has printed the shrunk sequence
                    print(json.dumps({"finding": f"{type(e).__name__}: {e}"[:2000], "rounds": rounds}))
                    return 1
                rounds += 1
                rss_mb.append(round(wire.rss_bytes() / 2**20, 1))
                m = fixture.broker.metrics
                print(f"round {rounds}: {time.monotonic() - started:.0f} s, requests {sum(m.requests.values())}, "
                      f"frame errors {m.frame_errors}, closed {sum(m.connections_closed.values())}, "
                      f"RSS {rss_mb[-1]} MiB", file=sys.stderr, flush=True)
            wire.settle(fixture)
            m = fixture.broker.metrics
            findings = []
            if len(rss_mb) > 2 and rss_mb[-1] - rss_mb[1] > a.rss_growth_mb:
                findings.append(f"RSS grew from {rss_mb[1]} MiB after round 2 to {rss_mb[-1]} MiB")
            print(json.dumps({
                "minutes": round((time.monotonic() - started) / 60, 1), "rounds": rounds,
                "examples": rounds * a.examples_per_round, "max_steps_per_example": a.steps,
                "io_workers": a.io_workers, "max_frame_size": a.max_frame_size,
                "requests": sum(m.requests.values()), "requests_by_code": {str(k): v for k, v in m.requests.items()},
                "frame_errors": m.frame_errors, "heartbeat_errors": m.heartbeat_errors,
                "request_errors": dict(m.request_errors), "connections_accepted": m.connections_accepted,
                "connections_closed": dict(m.connections_closed),
                "log_lines": {f"{k[0]}:{k[1]}": n for k, n in fixture.errors.counts.items()},
                "rss_mb_per_round": rss_mb, "findings": findings,
            }))
            if findings:
                return 1
        finally:
            fixture.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

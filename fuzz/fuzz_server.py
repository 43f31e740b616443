"""Long run of the wire-level fuzzer (fuzz/wire.py) against one live broker.

    .venv/bin/python fuzz/fuzz_server.py --minutes 15 [--examples-per-round 200] [--steps 40]

Runs the state machine in rounds (each round a fresh hypothesis run of ``--examples-per-round`` examples) until the
time is up, then checks that the broker let go of everything (connections, partial frames) and prints one JSON
line: rounds, examples, steps bound, frames sent per kind, answers, connections the broker closed, findings.
A finding stops the run with the failing sequence (hypothesis prints it shrunk) and exit status 1.
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
    a = p.parse_args(argv)
    started = time.monotonic()
    rounds = 0
    with tempfile.TemporaryDirectory(prefix="wire-fuzz-") as store:
        fixture = wire.BrokerFixture(store)
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
                m = fixture.broker.metrics
                print(f"round {rounds}: {time.monotonic() - started:.0f} s, requests {sum(m.requests.values())}, "
                      f"frame errors {m.frame_errors}, closed {sum(m.connections_closed.values())}",
                      file=sys.stderr, flush=True)
            wire.settle(fixture)
            m = fixture.broker.metrics
            print(json.dumps({
                "minutes": round((time.monotonic() - started) / 60, 1), "rounds": rounds,
                "examples": rounds * a.examples_per_round, "max_steps_per_example": a.steps,
                "requests": sum(m.requests.values()), "requests_by_code": {str(k): v for k, v in m.requests.items()},
                "frame_errors": m.frame_errors, "heartbeat_errors": m.heartbeat_errors,
                "request_errors": dict(m.request_errors), "connections_accepted": m.connections_accepted,
                "connections_closed": dict(m.connections_closed),
                "log_lines": {f"{k[0]}:{k[1]}": n for k, n in fixture.errors.counts.items()},
                "findings": [],
            }))
        finally:
            fixture.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

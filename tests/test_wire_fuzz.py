"""A short run of the wire-level fuzzer (fuzz/wire.py) against a live broker: random sequences of valid, truncated
and mutated frames of every request code over several connections, with the invariants checked after every step.
ENGINE_WIRE_FUZZ_EXAMPLES sets the number of runs (fuzz/fuzz_server.py runs it for as long as asked)."""
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from conftest import ROOT

sys.path.insert(0, str(ROOT / "fuzz"))
import wire  # noqa: E402


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    f = wire.BrokerFixture(str(tmp_path_factory.mktemp("wire-fuzz")))
    yield f
    f.stop()


def test_wire_fuzz(fixture):
    machine = wire.make_machine(fixture)
    examples = int(os.environ.get("ENGINE_WIRE_FUZZ_EXAMPLES", "150"))
    machine.TestCase.settings = settings(max_examples=examples, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck))
    rss = wire.rss_bytes()
    machine.TestCase().runTest()
    wire.settle(fixture)
    assert fixture.broker.metrics.request_errors.get("internal_error", 0) == 0
    print(f"RSS {rss >> 20} -> {wire.rss_bytes() >> 20} MiB")
    # what clients cause is logged at a bounded rate: thousands of bad frames, a few hundred lines at most
    logged = sum(n for (name, level), n in fixture.errors.counts.items() if level != "DEBUG")
    assert logged < 400, fixture.errors.counts


def test_wire_fuzz_through_io_workers(tmp_path):
    """The same machine with every socket held by two I/O worker processes (ioWorkers=2): the relay path."""
    # the default 16 MiB frame limit here, the fixture's 256 KiB in the other run
    f = wire.BrokerFixture(str(tmp_path / "store"), io_workers=2, max_frame_size=16 * 1024 * 1024)
    try:
        machine = wire.make_machine(f)
        examples = int(os.environ.get("ENGINE_WIRE_FUZZ_EXAMPLES", "150")) // 3
        machine.TestCase.settings = settings(max_examples=examples, stateful_step_count=25, deadline=None,
                                             suppress_health_check=list(HealthCheck))
        machine.TestCase().runTest()
        wire.settle(f)
        assert f.broker.metrics.request_errors.get("internal_error", 0) == 0
    finally:
        f.stop()

"""`rmqhb loadgen`, both protocols: Ctrl-C after the measurement (while the result is merged, which on a long run
sorts millions of latencies, printed and written) still prints and writes what was measured and exits 130; a second
Ctrl-C there gives the counters at once. The merge is slowed here (a patched _percentiles) so the Ctrl-C lands in it."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port, require_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli_errors import _interrupt_when  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: rmqhb whose merge announces itself on stderr, then takes 3 s (as a long run's millions of latencies do)
SLOW_MERGE = """import sys, time
from engine import cli, loadgen
real = loadgen._percentiles
def slow(lat):
    sys.stderr.write("[merging]\\n"); sys.stderr.flush(); time.sleep(3)
    return real(lat)
loadgen._percentiles = slow
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker with a remoting and a native gRPC port, routing the gRPC load generator's topics."""
    from engine.broker.config import BrokerConfig
    from engine.broker.controller import Broker
    from engine.registry.topic_config_manager import TopicConfig

    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", fast_port_enable=False,
                            store_path_root_dir=str(tmp_path_factory.mktemp("store")),
                            grpc_server_port=free_port(), grpc_transport="native")).start()
    for k in range(7):
        b.call(b.registry.update_topic_config, TopicConfig(f"TopicLoad{k}", 4, 4))
    yield b
    b.stop()


def _command(broker, protocol: str, out: Path) -> list:
    if protocol == "grpc":
        require_module("rocketmq.grpc_protocol")
        port = broker.ports["grpc"]
    else:
        port = broker.ports["main"]
    return [sys.executable, "-c", SLOW_MERGE, "loadgen", "steady", "--protocol", protocol, "--broker",
            f"127.0.0.1:{port}", "--clients", "8", "--groups", "2", "--duration", "1", "--quiet", "--out", str(out)]


def _merging(err) -> bool:
    return any("[merging]" in ln for ln in err)


@pytest.mark.parametrize("protocol", ["remoting", "grpc"])
def test_ctrl_c_during_the_merge_still_prints_and_writes_the_result(broker, tmp_path, protocol):
    out = tmp_path / "res.json"
    p, stdout, stderr, seconds = _interrupt_when(_command(broker, protocol, out), _merging, cwd=ROOT, timeout=120)
    assert p.returncode == 130 and "Traceback" not in stderr, stderr
    res = json.loads(stdout)
    assert json.loads(out.read_text()) == res
    # the finished measurement, merged: latencies, timeline, the window's answers
    assert res["answered"] > 0 and res["p50_ms"] > 0 and "timeline" in res and "interrupted" not in res
    assert res["connections"] == (1 if protocol == "grpc" else 8)
    assert stderr.strip().splitlines()[-1].startswith("rmqhb loadgen: interrupted after the run (")
    assert seconds < 10


def test_a_second_ctrl_c_during_the_merge_gives_the_counters_at_once(broker, tmp_path):
    out = tmp_path / "res.json"
    p = subprocess.Popen(_command(broker, "remoting", out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        err = []
        while not _merging(err):
            line = p.stderr.readline()
            assert line and time.monotonic() < deadline, "".join(err)
            err.append(line)
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in stderr, stderr
    assert seconds < 2.5  # the 3 s merge was not waited for
    res = json.loads(stdout)
    assert res["interrupted"] is True and res["answered"] > 0 and res["sent"] >= res["answered"]
    assert stderr.strip().splitlines() == ["rmqhb loadgen: interrupted twice after the run (partial result above: "
                                           "the counters only)"]
    assert not out.exists()

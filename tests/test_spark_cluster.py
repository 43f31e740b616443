"""The scan on a real Spark standalone cluster: a master and two workers started from the installed pyspark's own
jars on 127.0.0.1, `rmqhb scan --master spark://...` gives the same findings as `local[2]`, and the executors run
the compiled engine, not the twins."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, require_module  # noqa: E402

pyspark = require_module("pyspark")
from engine.recording.scan_py import FINDING_KEYS  # noqa: E402
from engine.recording.synth import FleetConfig, compare_with_manifest, generate  # noqa: E402

pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
RMQHB = [sys.executable, "-m", "engine"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp):
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOG_DIR=str(tmp / "logs"),
               SPARK_WORKER_DIR=str(tmp / "work"), SPARK_NO_DAEMONIZE="1")
    # the daemons' own JVMs: small heaps, quick start
    env["SPARK_DAEMON_JAVA_OPTS"] = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dspark.ui.enabled=false"
    env["SPARK_DAEMON_MEMORY"] = "256m"
    return env


def _wait_for_log(proc, log_path, needle, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{needle!r}: daemon exited: {log_path.read_text(errors='replace')[-3000:]}")
        if needle in log_path.read_text(errors="replace"):
            return
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} not seen in {timeout} s: {log_path.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """spark://127.0.0.1:PORT with two workers of one core each."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    env = _env(tmp)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = _free_port()
    procs = []

    def start(name, *args):
        log_path = tmp / f"{name}.log"
        f = open(log_path, "wb")
        p = subprocess.Popen([spark_class, *args], env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append((p, f))
        return p, log_path

    try:
        master, mlog = start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                             str(port), "--webui-port", str(_free_port()))
        _wait_for_log(master, mlog, "I have been elected leader")
        url = f"spark://127.0.0.1:{port}"
        for i in range(2):
            w, wlog = start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                            "--cores", "1", "--memory", "1500m", "--webui-port", str(_free_port()),
                            "--work-dir", str(tmp / f"work{i}"))
            _wait_for_log(w, wlog, "Successfully registered with master")
        yield url, env
    finally:
        for p, f in procs:
            if p.poll() is None:
                p.terminate()
        for p, f in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
            f.close()


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster-fleet")
    manifest = generate(d, FleetConfig(clients=40, groups=8, days=0.2, seed=5), block_records=1024)
    return d, manifest


PROBE = """
import json, sys
from engine.bindings.spark import spark_session
spark = spark_session(sys.argv[1], "rmqhb-probe", driver_memory="1g",
                      conf={"spark.executor.memory": "1g", "spark.cores.max": "2"})

def where(_):
    import os, socket, engine, engine.recording._segment
    yield json.dumps({"modules": engine.native_modules(), "segment": engine.recording._segment.__file__, "pid": os.getpid()})

rows = spark.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()
print("PROBE " + json.dumps([json.loads(r) for r in rows]))
spark.stop()
"""


def test_executors_load_the_compiled_engine(cluster):
    if os.environ.get("ENGINE_NO_EXTENSIONS"):
        pytest.skip("the twin run (ENGINE_NO_EXTENSIONS=1) forces the twins on executors too")
    url, env = cluster
    p = subprocess.run([sys.executable, "-c", PROBE, url], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, p.stderr[-3000:]
    rows = json.loads(line[len("PROBE "):])
    assert len(rows) == 4
    for row in rows:
        assert all(row["modules"].values()), row  # every compiled module, not a twin
        assert row["segment"].endswith(".so")


def test_cluster_scan_matches_local(cluster, recording, tmp_path):
    url, env = cluster
    d, manifest = recording
    outs = {}
    for name, master in (("local", "local[2]"), ("cluster", url)):
        out = tmp_path / name
        p = subprocess.run([*RMQHB, "scan", str(d), "--out", str(out), "--master", master, "--no-plots",
                            "--driver-memory", "1g"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{name}: {p.stderr[-3000:]}"
        outs[name] = json.loads((out / "findings.json").read_text())
    assert compare_with_manifest(outs["cluster"], manifest) == []
    for key in FINDING_KEYS:
        assert outs["cluster"][key] == outs["local"][key], key
    for key in ("records", "bad_bodies", "clients", "first_ms", "last_ms"):
        assert outs["cluster"]["summary"][key] == outs["local"]["summary"][key], key


def _scan_both(url, env, tmp_path, args):
    """`rmqhb scan ARGS --out DIR` on local[2] and on the cluster: (findings, stdout) of each."""
    outs = {}
    for name, master in (("local", "local[2]"), ("cluster", url)):
        out = tmp_path / name
        p = subprocess.run([*RMQHB, "scan", *args, "--out", str(out), "--master", master, "--no-plots",
                            "--driver-memory", "1g"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{name}: {p.stderr[-3000:]}"
        outs[name] = json.loads((out / "findings.json").read_text())
    return outs


def _without_timing(f):
    return {k: v for k, v in f.items() if k != "scan"}, {k: v for k, v in f["scan"].items() if k != "seconds"}


def test_cluster_broker_log_scan_matches_local(cluster, tmp_path):
    """Issue 14: the broker-log scan on the standalone cluster (two brokers' generated logs, one rolled file) gives
    local[2]'s findings, and they are exactly the generator's injected anomalies."""
    from engine.bindings import brokerlog as bl

    url, env = cluster
    logs = tmp_path / "logs"
    assert bl.generate_main([str(logs), "--brokers", "2", "--groups", "3", "--members", "4", "--lines", "3000",
                             "--hours", "3", "--seed", "7"]) == 0
    doc = bl.load_manifest(logs)
    lines = (logs / "broker-a" / "broker.log").read_bytes().splitlines(keepends=True)
    (logs / "broker-a" / "broker.log.1").write_bytes(b"".join(lines[: len(lines) // 2]))
    (logs / "broker-a" / "broker.log").write_bytes(b"".join(lines[len(lines) // 2:]))
    outs = _scan_both(url, env, tmp_path, [str(logs / "broker-a"), str(logs / "broker-b"), "--log-tz",
                                           doc["log_tz"]])
    assert _without_timing(outs["cluster"]) == _without_timing(outs["local"])
    assert bl.compare_with_generated(outs["cluster"], doc) == []
    f = outs["cluster"]
    assert f["scan"]["method"] == "broker-log" and f["log"]["brokers"] == ["broker-a", "broker-b"]
    assert f["scan"]["files"] == 3 and len(f["expired_clients"]) == 2 and len(f["flapping_clients"]) == 2
    if not os.environ.get("ENGINE_NO_EXTENSIONS"):
        assert f["scan"]["parser"] == "native"


def test_cluster_capture_scan_matches_local(cluster, tmp_path):
    """Issue 14: the capture scan on the standalone cluster (the tcpdump captures of tests/data/pcap: Ethernet,
    gzipped SLL, rotated SLL2/IPv6 files, the real ali-ons client; two shards per capture) gives local[2]'s
    findings and capture section."""
    url, env = cluster
    data = ROOT / "tests" / "data" / "pcap"
    inputs = [data / "lo-eth-ipv4.pcap", data / "any-sll-ipv4.pcap.gz", data / "rotated-ipv6"]
    outs = _scan_both(url, env, tmp_path, [*map(str, inputs), "--shards", "2"])
    assert _without_timing(outs["cluster"]) == _without_timing(outs["local"])
    f = outs["cluster"]
    assert f["scan"]["method"] == "pcap" and f["scan"]["tasks"] == 2 * len(inputs)
    assert f["summary"]["records"] == 42 + 20 + 24 and f["scan"]["corrupt"] == []
    assert sum(n["notifies"] for n in f["capture"]["notifications"]) == 13 + 8 + 8
    # each capture is a separate run of the same clients that ends in FINs: one disagreement span per capture
    # (a member leaves at its FIN, c997f62; the expiry no longer bridges the runs)
    assert [x["group"] for x in f["inconsistent_subscriptions"]] == ["CID_cap_0"] * len(inputs)
    if not os.environ.get("ENGINE_NO_EXTENSIONS"):
        assert f["scan"]["reader"] == "native"

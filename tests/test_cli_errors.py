"""Issue 29 §3: every user mistake is one line of our own with the status the README documents, found before any
work; Ctrl-C ends a command within a second or two with one line and status 130 and no half-written output that
looks complete. Each case runs `rmqhb` as a user does (a subprocess, real files); none may print a Python
traceback (only --debug shows one)."""
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_module

SAMPLE_LOG_LINE = ("2024-06-10 12:00:00 INFO NettyServerCodecThread_1 - NETTY SERVER PIPELINE: channelActive, "
                   "the channel[10.0.0.1:50000]\n")


def rmqhb(*args, env=None, timeout=120, cwd=None):
    e = {k: v for k, v in os.environ.items() if k != "RMQHB_DEBUG"}
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "engine", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=e, cwd=cwd)
    p.seconds = time.monotonic() - t0
    return p


def one_line(p) -> str:
    """The stderr of a refused command: exactly one non-empty line, ours, no traceback."""
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture
def fake_java(tmp_path):
    """A JAVA_HOME whose java records that it ran: a command refused before any work never reaches it."""
    home = tmp_path / "fakejava"
    (home / "bin").mkdir(parents=True)
    marker = tmp_path / "java-ran"
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\ntouch {marker}\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    java.chmod(0o755)
    return home, marker


def a_recording(directory: Path) -> Path:
    from engine.recording.synth import FleetConfig, FleetGenerator

    FleetGenerator(FleetConfig(clients=4, groups=2, days=0.01, inconsistent=0, rolling_updates=0, flapping=0,
                               gaps=0, resizing=0)).write(directory)
    return directory


# ---------------------------------------------------------------------------------------------------------------
# rmqhb itself


def test_help_lists_every_command_with_a_line():
    from engine.cli import COMMANDS

    p = rmqhb("--help")
    assert p.returncode == 0 and p.stderr == ""
    for name in COMMANDS:
        line = next(ln for ln in p.stdout.splitlines() if ln.strip().startswith(name + " "))
        assert len(line.split(None, 1)[1]) > 20, line  # a description, not a bare name
    bare = rmqhb()
    assert bare.returncode == 2 and bare.stdout == "" and all(name in bare.stderr for name in COMMANDS)
    assert "Traceback" not in bare.stderr


def test_unknown_command_is_named():
    p = rmqhb("bogus")
    assert p.returncode == 2 and "unknown command 'bogus'" in one_line(p) and "rmqhb --help" in p.stderr


def test_scan_help_names_every_input_kind_and_their_options():
    p = rmqhb("scan", "-h")
    assert p.returncode == 0
    for word in ("recording", "broker-log", "pcap", "--port", "--shards", "--log-tz", "--broker", "130"):
        assert word in p.stdout, word


def test_unexpected_error_is_one_line_and_debug_shows_the_stack(monkeypatch, capsys):
    from engine import cli

    def boom(argv):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "demo", boom)
    monkeypatch.delenv("RMQHB_DEBUG", raising=False)
    assert cli.main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "rmqhb demo: failed: RuntimeError: disk on fire (--debug shows where)"
    with pytest.raises(RuntimeError):
        cli.main(["demo", "--debug"])
    monkeypatch.delenv("RMQHB_DEBUG", raising=False)


# ---------------------------------------------------------------------------------------------------------------
# rmqhb scan: refused before any work (no JVM: the fake java never runs)


def _scan_cases(tmp: Path):
    (tmp / "empty.log").write_bytes(b"")
    (tmp / "empty.pcap").write_bytes(b"")
    (tmp / "text.pcap").write_text("not a capture\n")
    (tmp / "binary.log").write_bytes(bytes(range(256)) * 64)
    (tmp / "notes.txt").write_text("hello\n")
    (tmp / "emptydir").mkdir()
    (tmp / "otherlogs").mkdir()
    (tmp / "otherlogs" / "gc.log").write_text(SAMPLE_LOG_LINE)  # not broker*.log*
    rec = a_recording(tmp / "rec")
    segs = [rec / "hb-1-000001.seg", rec / "hb-2-000002.seg"]  # two segments of one recording, given as files
    for s in segs:
        s.write_bytes(next(rec.glob("hb-17*.seg")).read_bytes())
    mixed = a_recording(tmp / "mixed")  # a recording and a capture: the same heartbeats twice, refused (merge.py)
    (mixed / "broker.pcap").write_bytes((Path(__file__).parent / "data" / "pcap" / "cpp-lo-ipv4.pcap").read_bytes())
    (tmp / "afile").write_text("x")
    (tmp / "link").symlink_to(tmp / "emptydir")
    good_log = tmp / "broker.log"
    good_log.write_text(SAMPLE_LOG_LINE)
    (tmp / "logsdir").mkdir()
    (tmp / "logsdir" / "broker.log").write_text(SAMPLE_LOG_LINE)
    out = tmp / "out"
    return [
        # (argv, exit status, words of the one line)
        (["nonexistent.log", "--out", out], 2, "no such file or directory: nonexistent.log"),
        (["empty.log", "--out", out], 4, "empty.log is empty"),
        (["empty.pcap", "--out", out], 4, "empty.pcap is empty"),
        (["text.pcap", "--out", out], 4, "text.pcap is not a packet capture"),
        (["binary.log", "--out", out], 4, "binary.log is not a broker log (binary data"),
        (["notes.txt", "--out", out], 2, "notes.txt is a file"),
        (["emptydir", "--out", out], 2, "emptydir holds no recording"),
        (["otherlogs", "--out", out], 2, "otherlogs holds no recording"),
        ([*segs[:2], "--out", out], 2, f"are segments of one recording: give its directory ({rec})"),
        (["mixed", "--out", out], 2, "mixed mixes input kinds"),
        (["rec", "--out", "afile"], 2, "--out afile exists and is not a directory"),
        (["rec", "--out", "link"], 2, "--out link is a symbolic link"),
        (["logsdir", "--format", "pcap", "--out", out], 2, "logsdir holds no packet capture"),
        ([good_log, "--log-tz", "+25:00", "--out", out], 2, "--log-tz '+25:00' is not a zone"),
        ([good_log, "--log-tz", "Mars/Olympus", "--out", out], 2, "--log-tz 'Mars/Olympus' is not a zone"),
    ]


def test_scan_mistakes_are_one_line_before_any_work(tmp_path, fake_java):
    home, marker = fake_java
    for argv, status, words in _scan_cases(tmp_path):
        p = rmqhb("scan", *argv, env={"JAVA_HOME": str(home)}, cwd=tmp_path)
        line = one_line(p)
        assert (p.returncode, line.startswith("rmqhb scan: "), words in line) == (status, True, True), (argv, line)
        assert not marker.exists(), argv  # found before Java (and Spark) were asked for anything
        assert not (tmp_path / "out").exists(), argv


def test_scan_takes_a_segment_file_as_the_recording_of_that_file(tmp_path):
    """`rmqhb scan x.seg`: the recording of that one file, as a directory holding only it would be (a broker
    log or a capture is scanned from its file too)."""
    require_module("pyarrow")
    from engine.bindings.scan_engine import without_engine_fields

    rec = a_recording(tmp_path / "rec")
    seg = sorted(rec.glob("*.seg"))[-1]
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / seg.name).write_bytes(seg.read_bytes())
    found = {}
    for name, path in (("file", seg), ("dir", tmp_path / "alone")):
        p = rmqhb("scan", path, "--out", tmp_path / name, "--no-plots", "--no-progress")
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "read 1 recording (1 segments" in p.stdout.splitlines()[-1], p.stdout
        findings = without_engine_fields(json.loads((tmp_path / name / "findings.json").read_text()))
        findings.pop("generated_at", None)
        found[name] = findings
    assert found["file"]["summary"]["records"] > 0
    assert json.dumps(found["file"], sort_keys=True).replace(str(seg), "X").replace(str(tmp_path / "alone"), "X") \
        == json.dumps(found["dir"], sort_keys=True).replace(str(tmp_path / "alone" / seg.name), "X") \
        .replace(str(tmp_path / "alone"), "X")


def test_scan_without_a_usable_java_says_so_before_spark(tmp_path, fake_java):
    home, marker = fake_java
    rec = a_recording(tmp_path / "rec")
    # --engine spark: a small input is scanned in this process by default, without Java
    p = rmqhb("scan", rec, "--out", tmp_path / "out", "--engine", "spark", "--no-progress",
              env={"JAVA_HOME": str(tmp_path / "nowhere")})
    line = one_line(p)
    assert p.returncode == 2 and f"JAVA_HOME={tmp_path / 'nowhere'} has no bin/java" in line
    assert "Java 17" in line and "JAVA_HOME" in line
    p = rmqhb("scan", rec, "--out", tmp_path / "out", "--engine", "spark", "--no-progress",
              env={"JAVA_HOME": str(home)})
    line = one_line(p)
    assert p.returncode == 2 and "is Java 11" in line and "Java 17" in line and marker.exists()
    assert not (tmp_path / "out").exists()


def test_a_directory_of_broker_logs_means_broker_logs(tmp_path):
    from engine.bindings.brokerlog import path_kind, plan_files

    d = tmp_path / "broker-a"
    (d / "otherdays").mkdir(parents=True)
    for name in ("broker.log", "broker_default.log", "broker.log.1", "gc.log", "store.log", "app.log.gz"):
        (d / name).write_text(SAMPLE_LOG_LINE)
    with gzip.open(d / "otherdays" / "broker.3.log.gz", "wt") as f:
        f.write(SAMPLE_LOG_LINE)
    assert sorted(Path(f).name for _, f, _ in plan_files([d])) == ["broker.3.log.gz", "broker.log", "broker.log.1",
                                                                   "broker_default.log"]
    assert path_kind(d) == "broker-log"
    assert [Path(f).name for _, f, _ in plan_files([d / "gc.log"])] == ["gc.log"]  # a file given: read as named
    other = tmp_path / "other"
    other.mkdir()
    (other / "gc.log").write_text(SAMPLE_LOG_LINE)
    assert path_kind(other) is None and plan_files([other]) == []


def test_demo_without_a_usable_java_says_so_before_any_work(tmp_path):
    require_module("pyspark")
    p = rmqhb("demo", "--work", tmp_path / "work", env={"JAVA_HOME": str(tmp_path / "nowhere")})
    line = one_line(p)
    assert p.returncode == 2 and line.startswith("rmqhb demo: JAVA_HOME=") and "--no-spark" in line
    assert p.stdout == "" and not (tmp_path / "work").exists()


# ---------------------------------------------------------------------------------------------------------------
# rmqhb segments verify


def test_segments_verify_takes_a_file_and_names_what_is_wrong(tmp_path):
    rec = a_recording(tmp_path / "rec")
    seg = next(rec.glob("*.seg"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.log").write_text("x")
    for path, words in ((tmp_path / "nope", "no such file or directory"), (tmp_path / "empty", "no recording in"),
                        (tmp_path / "x.log", "neither a recording directory nor a segment file")):
        p = rmqhb("segments", "verify", path)
        assert p.returncode == 2 and words in one_line(p), path
    one, whole = rmqhb("segments", "verify", seg), rmqhb("segments", "verify", rec)
    assert one.returncode == whole.returncode == 0 and one.stdout == whole.stdout  # one segment: the same report
    assert one.stdout.startswith("OK: 1 segments")


# ---------------------------------------------------------------------------------------------------------------
# rmqhb generate


def test_generate_mistakes_are_one_line_and_write_nothing(tmp_path):
    (tmp_path / "afile").write_text("mine\n")
    cases = [(["g1", "--clients", "0"], "--clients and --groups must be at least 1"),
             (["g2", "--days", "-1"], "--days must be a positive number of days, not -1"),
             (["g3", "--interval", "0"], "--interval must be a positive"),
             (["g4", "--gaps", "-2"], "--gaps must be 0 or more"),
             (["afile"], "afile exists and is not a directory"),
             (["afile/sub"], "afile is not a directory; cannot create afile/sub"),
             (["afile", "--format", "broker-log"], "afile exists and is not a directory"),
             (["g5", "--format", "csv"], "--format is recording or broker-log, not 'csv'")]
    for argv, words in cases:
        p = rmqhb("generate", *argv, cwd=tmp_path)
        line = one_line(p)
        assert p.returncode == 2 and line.startswith("rmqhb generate: ") and words in line, (argv, line)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile"] and (tmp_path / "afile").read_text() == "mine\n"


def _interrupt_when(cmd, ready, env=None, cwd=None, timeout=120):
    """Run cmd in its own process group, wait until ready(stderr lines so far) is true, then send SIGINT to the
    group as a terminal's Ctrl-C does; returns (process, stdout, stderr, seconds from SIGINT to exit)."""
    import threading

    e = {k: v for k, v in os.environ.items() if k != "RMQHB_DEBUG"}
    e.update(env or {})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=cwd,
                         start_new_session=True)
    err, out = [], []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
               for f, into in ((p.stderr, err), (p.stdout, out))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    try:
        while not ready(list(err)):
            assert p.poll() is None, f"exited before it was ready: {''.join(err)}"
            assert time.monotonic() < deadline, "".join(err)
            time.sleep(0.05)
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=30)
        seconds = time.monotonic() - t0
        for t in readers:
            t.join(10)
        return p, "".join(out), "".join(err), seconds
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_generate_interrupted_leaves_no_partial_recording(tmp_path):
    for out, existed in ((tmp_path / "new", False), (tmp_path / "existing", True)):
        if existed:
            out.mkdir()
            (out / "keep.txt").write_text("mine\n")
        p, stdout, stderr, seconds = _interrupt_when(
            [sys.executable, "-m", "engine", "generate", str(out), "--clients", "3000", "--days", "30"],
            lambda err: any("generating [" in ln and " 0 records" not in ln for ln in err))
        assert p.returncode == 130 and seconds < 5, stderr
        assert "Traceback" not in stderr and stdout == ""
        last = stderr.strip().splitlines()[-1]
        assert last == f"rmqhb generate: interrupted; the partial output in {out} was removed"
        assert (sorted(x.name for x in out.iterdir()) == ["keep.txt"]) if existed else not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# rmqhb loadgen


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_loadgen_needs_a_broker_and_fails_fast_without_a_connection():
    p = rmqhb("loadgen", "steady")
    assert p.returncode == 2 and "--broker" in p.stderr and "Traceback" not in p.stderr
    port = _closed_port()
    p = rmqhb("loadgen", "steady", "--broker", f"127.0.0.1:{port}", "--duration", "30")
    line = one_line(p)
    assert p.returncode == 1 and f"cannot connect to 127.0.0.1:{port}" in line and p.stdout == ""
    assert p.seconds < 10  # not the whole --duration of "sent 0"


@pytest.fixture
def live_broker(tmp_path):
    from engine.broker.config import BrokerConfig
    from engine.broker.controller import Broker

    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                            fast_port_enable=False)).start()
    yield b
    b.stop()


def test_loadgen_interrupted_prints_the_partial_result(live_broker, tmp_path):
    port = live_broker.ports["main"]

    def answering(err):
        return any(ln.startswith("loadgen steady") and " answered 0 " not in ln for ln in err)

    p, stdout, stderr, seconds = _interrupt_when(
        [sys.executable, "-m", "engine", "loadgen", "steady", "--broker", f"127.0.0.1:{port}", "--clients", "20",
         "--rate", "100", "--duration", "60"], answering)
    assert p.returncode == 130 and seconds < 5, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("rmqhb loadgen: interrupted after ")
    res = json.loads(stdout)
    assert res["interrupted"] is True and res["answered"] > 0 and res["target"] == f"127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------------------------
# rmqhb serve: a port in use


def _listening():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    return s


def test_serve_with_the_metrics_port_in_use_is_one_error_line(tmp_path):
    taken = _listening()
    port = taken.getsockname()[1]
    try:
        p = rmqhb("serve", "--listenPort", _closed_port(), "--storePathRootDir", tmp_path / "store",
                  "--metrics-port", port, "--fastPortEnable", "false", timeout=60)
    finally:
        taken.close()
    assert p.returncode == 255
    errors = [ln for ln in p.stderr.splitlines() if " ERROR " in ln]
    assert len(errors) == 1 and errors[0].endswith(
        f"broker failed to start: metricsPort {port}: cannot bind 127.0.0.1:{port}: address already in use")
    assert "Task was destroyed" not in p.stderr and "Traceback" not in p.stderr


def test_serve_with_the_grpc_port_in_use_is_one_error_line(tmp_path):
    require_module("grpc")
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        p = rmqhb("serve", "--listenPort", _closed_port(), "--storePathRootDir", tmp_path / "store",
                  "--grpcServerPort", port, "--fastPortEnable", "false", timeout=60)
    finally:
        taken.close()
    assert p.returncode == 255
    errors = [ln for ln in p.stderr.splitlines() if " ERROR " in ln]
    assert len(errors) == 1 and f"grpcServerPort {port}: cannot bind 0.0.0.0:{port}: the port is in use" in errors[0]
    assert "add_port.cc" not in p.stderr and "GRPC_VERBOSITY" not in p.stderr and "..." not in errors[0]
    assert "Task was destroyed" not in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------------------------
# the report: a second scan into the same --out


def test_a_second_report_into_the_same_directory_leaves_no_stale_files(tmp_path):
    from engine.bindings.brokerlog import generate_broker_log, scan_local
    from engine.bindings.report import write_report

    generate_broker_log(tmp_path / "logs" / "broker.log", groups=2, members=3)
    findings = scan_local([tmp_path / "logs"], log_tz="UTC")
    out = tmp_path / "report"
    write_report(findings, out, plots=True)
    first = {p.name for p in out.iterdir()}
    assert any(n.endswith(".svg") for n in first)
    (out / "mine.svg").write_text("not the report's")  # a file the report never wrote is left alone
    write_report(findings, out, plots=False)
    second = {p.name for p in out.iterdir()}
    assert not any(n.endswith(".svg") for n in second - {"mine.svg"}) and "mine.svg" in second
    assert {n for n in first if not n.endswith(".svg")} <= second


# ---------------------------------------------------------------------------------------------------------------
# Spark (slow: a JVM each)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["jvm-starting", "spark-running"])
def test_scan_interrupted_while_spark_runs_is_one_line_and_130(tmp_path, when):
    require_module("pyspark")
    rec = a_recording(tmp_path / "rec")
    out = tmp_path / "out"
    tmp = tmp_path / "tmp"  # the scan's private directory goes here (mkdtemp): Spark's block manager shows it is up
    tmp.mkdir()

    def ready(err):
        if when == "jvm-starting":  # the JVM prints its incubator-module warning as it starts
            return any("WARNING" in ln or "jdk" in ln for ln in err)
        return any(tmp.glob("rmqhb-spark-*/blockmgr-*"))

    p, stdout, stderr, seconds = _interrupt_when(
        [sys.executable, "-m", "engine", "scan", str(rec), "--out", str(out), "--no-plots",
         "--engine", "spark"], ready,
        env={"TMPDIR": str(tmp)}, timeout=300)
    assert p.returncode == 130 and seconds < 5, stderr
    assert "Traceback" not in stderr and "py4j" not in stderr and "Exception" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "rmqhb scan: interrupted"
    assert not out.exists() or not any(out.iterdir())  # no report that looks complete
    deadline = time.monotonic() + 5
    while _alive_in_group(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive_in_group(p.pid) == []  # the JVM and its Python workers ended with it
    assert list(tmp.iterdir()) == []  # the private directory removed


def _alive_in_group(pgid: int) -> list:
    """Processes of process group pgid that are not zombies (Linux /proc)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append((pid, stat[:80]))
    return alive


@pytest.mark.slow
def test_scan_of_a_cut_gzip_names_the_damage(tmp_path):
    """A cut .log.gz and a cut .pcap.gz: no traceback, the damaged file named (stderr and findings.json), the
    documented status (3: scanned over damage; 4: nothing decodable)."""
    require_module("pyspark")
    from engine.bindings.brokerlog import generate_broker_log

    generate_broker_log(tmp_path / "full.log", groups=20, members=10, restarts=2)
    data = gzip.compress((tmp_path / "full.log").read_bytes())
    (tmp_path / "trunc.log.gz").write_bytes(data[: len(data) // 2])
    capture = Path(__file__).parent / "data" / "pcap" / "any-sll2-ipv6.pcap"
    data = gzip.compress(capture.read_bytes())
    (tmp_path / "trunc.pcap.gz").write_bytes(data[: len(data) * 6 // 10])
    for name, extra in (("trunc.log.gz", ["--log-tz", "UTC"]), ("trunc.pcap.gz", [])):
        out = tmp_path / f"out-{name}"
        p = rmqhb("scan", tmp_path / name, "--out", out, "--no-plots", *extra, timeout=600)
        assert p.returncode in (3, 4) and "Traceback" not in p.stderr, p.stderr
        corrupt = json.loads((out / "findings.json").read_text())["scan"]["corrupt"]
        assert [Path(c["segment"]).name for c in corrupt] == [name]
        assert name in p.stderr or "DAMAGED INPUT" in p.stderr

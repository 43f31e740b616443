"""`rmqhb scan --engine local|spark|auto` (engine.bindings.scan_engine): which engine auto picks and why, the
progress line, and the same findings.json from both engines for every input kind (recording, broker logs,
captures; one broker and several), through the scan's command-line entry. Speed is measured in bench/, not here."""
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module  # noqa: E402

from engine.bindings import scan_engine as se  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PCAP = ROOT / "tests" / "data" / "pcap"


# ---------------------------------------------------------------------------------------------------------------
# the choice


def test_auto_scans_one_small_broker_in_process_and_everything_else_on_spark():
    kb = 1 << 10
    assert se.choose_engine("auto", master=None, brokers=1, size=30 * kb, limit=64 << 20)[0] == "local"
    assert se.choose_engine("auto", master=None, brokers=1, size=64 << 20, limit=64 << 20)[0] == "local"
    engine, why = se.choose_engine("auto", master=None, brokers=1, size=(64 << 20) + 1, limit=64 << 20)
    assert engine == "spark" and "more than the in-process limit of 64.0 MiB" in why
    assert se.choose_engine("auto", master="spark://h:7077", brokers=1, size=1, limit=10) == ("spark", "--master given")
    assert se.choose_engine("auto", master=None, brokers=2, size=1, limit=10) == ("spark", "2 brokers' inputs")
    engine, why = se.choose_engine("auto", master=None, brokers=1, size=100_001, limit=se.LOCAL_MAX_RECORDS,
                                   unit="records")
    assert engine == "spark" and "100,001 records" in why
    # forced: either engine, whatever the size; local with --master, or over several recordings, is refused
    assert se.choose_engine("local", master=None, brokers=3, size=1 << 40, limit=1) == ("local", "--engine local")
    assert se.choose_engine("spark", master=None, brokers=1, size=1, limit=10) == ("spark", "--engine spark")
    with pytest.raises(se.EngineError, match="--master"):
        se.choose_engine("local", master="local[2]", brokers=1, size=1, limit=10)
    with pytest.raises(se.EngineError, match="2 recording directories need Spark"):
        se.choose_engine("local", master=None, brokers=2, size=1, limit=10, unit="records", local_ok=False)


def test_a_gz_counts_its_uncompressed_size(tmp_path):
    import gzip

    plain = tmp_path / "broker.log"
    plain.write_bytes(b"x" * 100_000)
    packed = tmp_path / "broker.log.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert packed.stat().st_size < 1000
    assert se.input_bytes(plain) == se.input_bytes(packed) == 100_000
    cut = tmp_path / "cut.log.gz"  # a cut .gz: its last 4 bytes are no trailer; at least its own size counts
    cut.write_bytes(packed.read_bytes()[:-8])
    assert se.input_bytes(cut) >= cut.stat().st_size


# ---------------------------------------------------------------------------------------------------------------
# the progress line


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_is_a_redrawn_line_on_a_terminal_and_plain_lines_otherwise(monkeypatch):
    import time

    monkeypatch.setattr(se, "PROGRESS_TTY_S", 0.02)
    monkeypatch.setattr(se, "PROGRESS_PLAIN_S", 0.05)
    for tty in (True, False):
        stream = _Stream(tty)
        p = se.Progress("1 broker log file, 1.0 KiB", stream=stream).start()
        p.enter("reading")
        time.sleep(0.3)
        p.enter("analysing")
        time.sleep(0.2)
        parts = p.close()
        assert [stage for stage, _ in parts] == ["reading", "analysing"] and all(s > 0.1 for _, s in parts)
        text = stream.getvalue()
        assert "rmqhb scan: reading (1 broker log file, 1.0 KiB)" in text and "analysing" in text
        if tty:  # redrawn in place, then cleared: no line of its own remains
            assert "\r" in text and "\n" not in text and text.endswith("\r")
        else:
            assert "\r" not in text and text.count("\n") >= 3
    quiet = _Stream(True)
    p = se.Progress("x", enabled=False, stream=quiet).start()
    p.enter("reading")
    p.close()
    assert quiet.getvalue() == ""


def test_progress_in_this_process_shows_the_input_read_its_rate_and_an_eta(tmp_path):
    """In this process the line says how much of the input is read (the read position of each input file the
    process has open, the whole of each it closed again), the rate (records/s when the records are known up front,
    else MiB/s) and an ETA; the reading never goes back."""
    import time

    assert os.path.isdir("/proc/self/fdinfo")  # Linux: where the scan shows it
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"x" * 300_000)
    b.write_bytes(b"y" * 100_000)
    p = se.Progress("2 files", stream=_Stream(True), reading=se.InputReading([a, b]))
    p.enter("scanning in this process")
    assert p.line().endswith("; read 0.0 KiB of 390.6 KiB (0%)")
    with open(a, "rb", buffering=0) as f:
        f.read(200_000)
        time.sleep(0.05)
        line = p.line()
    assert "; read 195.3 KiB of 390.6 KiB (50%), " in line and " MiB/s, ETA " in line, line
    assert "; read 293.0 KiB of 390.6 KiB (75%)" in p.line()  # a closed: whole
    with open(b, "rb", buffering=0) as f:
        f.seek(50_000)
        assert "; read 341.8 KiB of 390.6 KiB (87%)" in p.line()
        f.read()
        assert p.line().endswith("; read 390.6 KiB of 390.6 KiB (100%), analysing")
    with open(a, "rb", buffering=0) as f:  # a file read again (a second pass) from its start: never less than before
        assert p.line().endswith("(100%), analysing")
    p.close()
    p = se.Progress("a recording", stream=_Stream(False), reading=se.InputReading([a], records=3_000))
    p.enter("scanning in this process")
    with open(a, "rb", buffering=0) as f:
        f.read(150_000)
        time.sleep(0.05)
        line = p.line()
    assert "(50%), " in line and " records/s, ETA " in line and "MiB/s" not in line, line
    p.close()


def test_the_scan_draws_its_progress_on_a_terminal(tmp_path):
    """`rmqhb scan` with stderr on a terminal: the in-process scan's line names the input's size read of its total
    (its files reached run_scan), and is cleared at the end; stdout keeps the summary."""
    import pty

    require_module("pyarrow")
    from engine.bindings import brokerlog as bl

    bl.generate_broker_log(tmp_path / "logs" / "broker.log", groups=2, members=3, seed=3)
    total = se._mib((tmp_path / "logs" / "broker.log").stat().st_size)
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "engine", "scan", str(tmp_path / "logs"), "--out", str(tmp_path / "out"),
                          "--log-tz", "UTC", "--no-plots"], stdout=subprocess.PIPE, stderr=follower,
                         env={k: v for k, v in os.environ.items() if k != "RMQHB_DEBUG"})
    os.close(follower)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read().decode()
    assert p.wait(60) == 0, err
    os.close(leader)
    text = err.decode()
    assert f"rmqhb scan: scanning in this process (1 broker log file, {total}), 0 s; read " in text, text
    assert f" of {total} (" in text and text.endswith("\r") and "Traceback" not in text
    assert out.splitlines()[-1].startswith("engine: local (")


# ---------------------------------------------------------------------------------------------------------------
# both engines, every input kind: the same findings.json


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from engine.bindings import brokerlog as bl
    from engine.recording.synth import FleetConfig, FleetGenerator

    d = tmp_path_factory.mktemp("inputs")
    FleetGenerator(FleetConfig(clients=12, groups=3, days=0.05, seed=5)).write(d / "rec-a")
    FleetGenerator(FleetConfig(clients=6, groups=2, days=0.05, seed=6)).write(d / "rec-b")
    bl.generate_broker_log(d / "broker-a" / "broker.log", groups=3, members=4, restarts=1, seed=11)
    bl.generate_broker_log(d / "b-logs" / "broker.log", groups=2, members=3, seed=12)
    captures = [PCAP / "lo-eth-ipv4.pcap", PCAP / "any-sll-ipv4.pcap.gz", PCAP / "rotated-ipv6"]
    # damaged inputs: 64 bytes XORed in the middle of a segment; a log with an overlong line and a cut .log.gz; a
    # cut .pcap.gz
    FleetGenerator(FleetConfig(clients=12, groups=3, days=0.05, seed=7)).write(d / "rec-bad", block_records=256)
    seg = max((d / "rec-bad").glob("*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(seg.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    seg.write_bytes(bytes(data))
    lines = (d / "broker-a" / "broker.log").read_bytes().splitlines(keepends=True)
    (d / "long").mkdir()
    (d / "long" / "broker.log").write_bytes(b"".join(lines[:50]) + b"x" * 10_000 + b"\n" + b"".join(lines[50:]))
    packed = gzip.compress((d / "broker-a" / "broker.log").read_bytes())
    (d / "cut").mkdir()
    (d / "cut" / "broker.log.gz").write_bytes(packed[: len(packed) // 2])
    packed = gzip.compress((PCAP / "any-sll2-ipv6.pcap").read_bytes())
    (d / "cut.pcap.gz").write_bytes(packed[: len(packed) * 6 // 10])
    return {
        "recording": [d / "rec-a"],
        "recordings of two brokers": [d / "rec-a", d / "rec-b"],
        "broker log": [d / "broker-a", "--log-tz", "+08:00"],
        "broker logs of two brokers": [d / "broker-a", "--broker", f"broker-b={d / 'b-logs'}", "--log-tz", "+08:00"],
        "captures": captures,
        "captures of two brokers": ["--broker", f"a={captures[0]}", "--broker", f"b={captures[2]}"],
        "damaged recording": [d / "rec-bad"],
        "broker log with an overlong line": [d / "long", "--log-tz", "UTC", "--max-line-bytes", "4096"],
        "cut broker log .gz": [d / "cut", "--log-tz", "UTC"],
        "cut capture .gz": [d / "cut.pcap.gz"],
    }


def _scan(argv, engine, out):
    from engine.bindings.spark import scan_main

    status = scan_main([*map(str, argv), "--out", str(out), "--no-plots", "--no-progress", "--engine", engine])
    return status, json.loads((out / "findings.json").read_text())


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["recording", "broker log", "broker logs of two brokers", "captures",
                                  "captures of two brokers", "damaged recording", "broker log with an overlong line",
                                  "cut broker log .gz", "cut capture .gz"])
def test_both_engines_write_the_same_findings(spark, inputs, kind, tmp_path, capsys):
    """`rmqhb scan ... --engine local` and `--engine spark` (the running test session): findings.json equal but
    for the fields that say how the scan ran (scan_engine.ENGINE_FIELDS), which say which engine ran and why."""
    argv = inputs[kind]
    got = {}
    for engine in ("local", "spark"):
        status, findings = _scan(argv, engine, tmp_path / engine)
        assert findings["scan"]["engine"] == engine and findings["scan"]["engine_reason"] == f"--engine {engine}"
        got[engine] = (status, se.without_engine_fields(findings))
    assert got["local"] == got["spark"]
    status, findings = got["local"]
    damaged = kind.startswith(("damaged", "cut")) or "overlong" in kind
    assert (status in (3, 4) if damaged else status == 0) and bool(findings["scan"]["corrupt"]) == damaged


@pytest.mark.spark
def test_auto_picks_local_for_a_small_input_and_spark_for_several_recordings(spark, inputs, tmp_path, capsys):
    status, findings = _scan(inputs["broker log"], "auto", tmp_path / "log")
    assert findings["scan"]["engine"] == "local" and "at most 64.0 MiB" in findings["scan"]["engine_reason"]
    argv = inputs["recordings of two brokers"]
    status, findings = _scan(argv, "auto", tmp_path / "two")
    assert findings["scan"]["engine"] == "spark" and findings["scan"]["engine_reason"] == "2 brokers' inputs"
    from engine.bindings.spark import scan_main

    capsys.readouterr()
    assert scan_main([*map(str, argv), "--out", str(tmp_path / "x"), "--engine", "local"]) == 2
    assert "2 recording directories need Spark" in capsys.readouterr().err


def test_a_small_broker_log_scans_in_process_from_the_command_line(tmp_path):
    """`python -m engine scan broker.log` (no --engine: auto): scanned in this process -- no JVM starts (its
    incubator warning never shows) -- and the closing line says which engine ran, why, what was read and how long
    each part took."""
    require_module("pyspark")
    from engine.bindings import brokerlog as bl

    bl.generate_broker_log(tmp_path / "logs" / "broker.log", groups=2, members=3, seed=3)
    p = subprocess.run([sys.executable, "-m", "engine", "scan", str(tmp_path / "logs"), "--out", str(tmp_path / "out"),
                        "--log-tz", "UTC", "--no-plots"], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "RMQHB_DEBUG"})
    assert p.returncode == 0, p.stderr
    assert "jdk.incubator" not in p.stderr and "Traceback" not in p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("engine: local (") and "read 1 broker log file" in last and "report " in last, last
    scan = json.loads((tmp_path / "out" / "findings.json").read_text())["scan"]
    assert scan["engine"] == "local" and "without starting Spark" in scan["engine_reason"]

"""What the scan writes and what it reads from its environment (issue 26 section 4).

- CSV injection: client data that a spreadsheet would run as a formula (a cell starting with = + - @, tab or CR)
  gets a leading "'" in every CSV the report writes, and control characters are escaped.
- The report directory: symbolic (and hard) links planted in it are replaced, never written through; a report
  directory that is itself a symbolic link is refused with one line, before the scan runs.
- The Spark JVM's log4j2 configuration (and Spark's local files) live in a private directory made per process
  (mkdtemp, 0700), never at a fixed name in the shared temp directory another user could plant.
"""
import csv
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module

require_module("pyarrow")

from engine.bindings import brokerlog as bl  # noqa: E402
from engine.bindings.report import FORMULA_START, ReportOutputError, csv_cell, write_report  # noqa: E402
from engine.recording import scan_py  # noqa: E402
from engine.recording.synth import FleetConfig, generate  # noqa: E402

#: every CSV the report can write
ALL_CSVS = {"inconsistent_subscriptions.csv", "subscription_differences.csv", "flapping_clients.csv",
            "flapping_timeline.csv", "flapping_connections.csv", "heartbeat_gaps.csv", "group_sizes.csv",
            "expired_clients.csv", "retry_topic_churn.csv", "log_lines.csv", "vanished_clients.csv",
            "broker_restarts.csv"}
REPORT_FILES = ["findings.json", "index.html", "group_sizes.svg", "gap_histogram.svg", "flapping_timeline.svg",
                *sorted(ALL_CSVS)]
CALC = "+cmd|' /C calc'!A0"  # the ids
SUM = "@SUM(1+1)*cmd|' /C calc'!A0"


def test_csv_cell_neutralises_formulas_and_escapes_control_characters():
    for lead in FORMULA_START:
        assert csv_cell(lead + "x").startswith("'")
    assert csv_cell(CALC) == "'" + CALC and csv_cell(SUM) == "'" + SUM
    assert csv_cell("=1+1") == "'=1+1" and csv_cell("-2+3") == "'-2+3"
    assert csv_cell("\t=1") == "'\\t=1" and csv_cell("\r=1") == "'\\r=1"
    assert csv_cell("a\x1b]0;owned\x07b\nc") == "a\\x1b]0;owned\\x07b\\nc"
    assert csv_cell("x\x00y\u2028\x85\x7f") == "x\\x00y\\u2028\\x85\\x7f"
    # ordinary values as they were; numbers are not text
    assert csv_cell("10.9.0.2@frozen") == "10.9.0.2@frozen" and csv_cell("CID_G1") == "CID_G1"
    assert csv_cell(-5) == -5 and csv_cell(1.5) == 1.5 and csv_cell(None) is None


def _hostile(findings: dict) -> dict:
    """The findings with every client id, group, topic, expression, broker, address and log example replaced by a
    hostile value (the same value everywhere it occurs, so the report's joins still hold)."""
    kinds = {"client_id": CALC, "clients": CALC, "group": SUM, "groups": SUM, "topic": "=HYPERLINK(\"x\")",
             "retry_topic": "=HYPERLINK(\"r\")", "broker": "-2+3\x1b[31m", "addr": "\r=1+1 ", "addrs": "\t=1+1 "}
    mapping = {}

    def collect(x, key=None):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "subscriptions" and isinstance(v, list):
                    for t, _, expr in v:
                        mapping.setdefault(t, kinds["topic"] + t)
                        mapping.setdefault(expr, "-" + expr + "\n=cmd")
                elif k == "examples" and isinstance(v, dict):
                    for e in v.values():
                        mapping.setdefault(e, "=cmd\x1b[2J" + e)
                else:
                    collect(v, k)
        elif isinstance(x, list):
            for v in x:
                collect(v, key)
        elif isinstance(x, str) and key in kinds and x:
            mapping.setdefault(x, kinds[key] + x)

    def apply(x):
        if isinstance(x, dict):
            return {apply(k): apply(v) for k, v in x.items()}  # per-broker tables are keyed by name
        if isinstance(x, list):
            return [apply(v) for v in x]
        if isinstance(x, tuple):
            return tuple(apply(v) for v in x)
        return mapping.get(x, x) if isinstance(x, str) else x

    collect(findings)
    return apply(findings)


@pytest.fixture(scope="module")
def hostile_reports(tmp_path_factory):
    """Reports of a recording's findings and two brokers' log findings, every name in them hostile: between them
    every CSV the report writes."""
    d = tmp_path_factory.mktemp("hostile")
    generate(d / "rec", FleetConfig(clients=30, groups=6, days=0.15, seed=5))
    bl.generate_broker_log(d / "logs" / "broker-a" / "broker.log", groups=3, members=4, restarts=1, seed=2)
    bl.generate_broker_log(d / "logs" / "broker-b" / "broker.log", groups=3, members=3, seed=3)
    # broker-c: a boot, a client killed (NETTY EVENT close, a recent heartbeat), a restart: vanished_clients.csv and
    # broker_restarts.csv get rows too
    cci = ("ClientChannelInfo [channel=[id: 0x0000000a, L:/10.0.0.1:10911 - R:/10.0.0.9:40000], clientId=10.0.0.9@k, "
           "language=JAVA, version=409, lastUpdateTimestamp=1795481286000]")
    (d / "logs" / "broker-c").mkdir()
    (d / "logs" / "broker-c" / "broker.log").write_text("\n".join([
        "2026-11-24 08:47:00 INFO main - rocketmqHome=/opt/rocketmq",
        "2026-11-24 08:47:03 INFO main - The broker[broker-c, 10.0.0.1:10911] boot success. serializeType=JSON",
        f"2026-11-24 08:48:06 INFO HeartbeatThread_1 - new producer connected, group: PID_K channel: {cci}",
        f"2026-11-24 08:48:10 INFO NettyEventExecutor - NETTY EVENT: remove channel[{cci}][10.0.0.9:40000] from "
        "ProducerManager groupChannelTable, producer group: PID_K",
        "2026-11-24 08:50:00 INFO ShutdownHook - Shutdown hook was invoked, 1",
        "2026-11-24 08:51:00 INFO main - rocketmqHome=/opt/rocketmq"]) + "\n")
    outs = []
    for name, f in (("rec", scan_py.scan(d / "rec")), ("log", bl.scan_local([d / "logs"], log_tz="+08:00"))):
        write_report(_hostile(f), d / f"report-{name}", plots=False)
        outs.append(d / f"report-{name}")
    return outs


def test_every_csv_neutralises_hostile_names(hostile_reports):
    rows_seen = {}
    for out in hostile_reports:
        for path in out.glob("*.csv"):
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
            for row in rows[1:]:
                for cell in row:
                    assert not cell.startswith(FORMULA_START), (path.name, cell)
                    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in cell), (path.name, cell)
            text = path.read_text(encoding="utf-8")
            assert "\x1b" not in text and "\r=" not in text
            hits = sum(cell.startswith("'") for row in rows[1:] for cell in row)
            rows_seen[path.name] = rows_seen.get(path.name, 0) + hits
    assert set(rows_seen) == ALL_CSVS
    assert all(rows_seen.values()), rows_seen  # every CSV had hostile cells to neutralise
    rec, log = hostile_reports
    gaps = (rec / "heartbeat_gaps.csv").read_text(encoding="utf-8")
    assert f"'{CALC}" in gaps and f"'{SUM}" in gaps
    assert f"'{CALC}" in (log / "expired_clients.csv").read_text(encoding="utf-8")
    assert "'=cmd\\x1b[2J" in (log / "log_lines.csv").read_text(encoding="utf-8")


def test_log_scan_of_a_hostile_client_id_writes_it_neutralised(tmp_path):
    """End to end: the issue's ids in a broker log reach expired_clients.csv and flapping_clients.csv as text."""
    m = bl.generate_broker_log(tmp_path / "b" / "broker.log", groups=2, members=2, seed=1)
    log = tmp_path / "b" / "broker.log"
    frozen = m["expired"][0]["client_id"]
    log.write_text(log.read_text().replace(frozen, CALC + "@frozen").replace("10.9.0.1@flapper", SUM + "@flapper"))
    out = tmp_path / "report"
    write_report(bl.scan_local([tmp_path / "b"], log_tz="+08:00"), out, plots=False)
    with open(out / "expired_clients.csv", newline="") as f:
        expired = [r["client_id"] for r in csv.DictReader(f)]
    assert expired and set(expired) == {"'" + CALC + "@frozen"}
    with open(out / "flapping_clients.csv", newline="") as f:
        assert "'" + SUM + "@flapper" in [r["client_id"] for r in csv.DictReader(f)]


# ---------------------------------------------------------------------------------------------------------------
# The report directory


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    d = tmp_path_factory.mktemp("rec")
    generate(d / "rec", FleetConfig(clients=20, groups=4, days=0.1, seed=3))
    return scan_py.scan(d / "rec")


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return victim


def _no_private_dir_left(out: Path):
    assert not [p for p in out.iterdir() if p.name.startswith(".rmqhb-report-")]


def test_planted_symlinks_in_the_report_directory_are_replaced_not_followed(tmp_path, findings):
    victim = _victim(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    for name in REPORT_FILES:
        (out / name).symlink_to(victim)
    (out / "dangling.csv").symlink_to(tmp_path / "outside" / "created.txt")
    index = write_report(findings, out, plots=True)
    assert victim.read_text() == "precious\n"
    assert index == out / "index.html" and "Heartbeat scan report" in index.read_text()
    written = [n for n in REPORT_FILES if os.path.lexists(out / n) and not (out / n).is_symlink()]
    assert {"findings.json", "index.html", "heartbeat_gaps.csv", "expired_clients.csv", "group_sizes.svg"} \
        <= set(written)
    for n in written:
        st = os.lstat(out / n)
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
    assert not (tmp_path / "outside" / "created.txt").exists()
    _no_private_dir_left(out)


def test_a_fifo_planted_as_the_files_listing_is_ignored_without_a_hang(tmp_path, findings):
    """``mkfifo OUT/.rmqhb-files``: reading the previous report's listing blocked for ever on the FIFO's open.
    Now it is not read (not a regular file: not a listing this scan wrote) and the report replaces it."""
    import threading
    out = tmp_path / "report"
    out.mkdir()
    fifo = out / ".rmqhb-files"
    os.mkfifo(fifo)
    (out / "stale.csv").write_text("kept: the FIFO names nothing\n")
    result = {}
    worker = threading.Thread(target=lambda: result.update(index=write_report(findings, out, plots=False)),
                              daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # release the blocked open before failing (a writer end opened once)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail("the report hung on a FIFO planted as its files listing")
    assert result["index"] == out / "index.html"
    st = os.lstat(fifo)
    assert stat.S_ISREG(st.st_mode) and "index.html" in fifo.read_text().splitlines()
    assert (out / "stale.csv").exists()
    _no_private_dir_left(out)


def test_a_planted_hard_link_is_replaced_not_written(tmp_path, findings):
    victim = _victim(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    os.link(victim, out / "expired_clients.csv")
    os.link(victim, out / "index.html")
    write_report(findings, out, plots=False)
    assert victim.read_text() == "precious\n" and os.stat(victim).st_nlink == 1
    assert (out / "expired_clients.csv").read_text().startswith("broker,client_id,addr")


def test_a_report_directory_that_is_a_symlink_is_refused(tmp_path, findings):
    target = tmp_path / "elsewhere"
    target.mkdir()
    out = tmp_path / "report"
    out.symlink_to(target)
    with pytest.raises(ReportOutputError, match="is a symbolic link"):
        write_report(findings, out, plots=False)
    assert list(target.iterdir()) == []
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(ReportOutputError, match="not a directory"):
        write_report(findings, a_file, plots=False)
    assert a_file.read_text() == "x"


def test_a_directory_where_a_report_file_goes_is_one_error_and_no_leftovers(tmp_path, findings):
    out = tmp_path / "report"
    (out / "index.html").mkdir(parents=True)
    with pytest.raises(ReportOutputError, match="index.html: a directory is there"):
        write_report(findings, out, plots=False)
    _no_private_dir_left(out)


def test_a_new_report_directory_is_created_with_ordinary_permissions(tmp_path, findings):
    out = tmp_path / "a" / "b" / "report"
    old = os.umask(0o022)
    try:
        write_report(findings, out, plots=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(out / "index.html").st_mode) == 0o644
    _no_private_dir_left(out)
    write_report(findings, out, plots=False)  # again over the earlier report: replaced
    _no_private_dir_left(out)


def test_rmqhb_scan_refuses_a_symlinked_out_in_one_line_before_scanning(tmp_path):
    require_module("pyspark")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "report").symlink_to(target)
    for args in ([str(tmp_path / "no-such-recording"), "--out", str(tmp_path / "report")],
                 [str(tmp_path / "broker.log"), "--log-tz", "+08:00", f"--out={tmp_path / 'report'}"]):
        r = subprocess.run([sys.executable, "-m", "engine", "scan", *args], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "is a symbolic link" in lines[0], (args, r.stderr)
    assert list(target.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# The Spark JVM's configuration and temporary files


def test_log4j2_config_is_private_and_a_planted_file_at_the_old_path_is_never_used(tmp_path, monkeypatch):
    from engine.bindings import session as sp

    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(shared))
    monkeypatch.setattr(sp, "_private", {})
    evil = tmp_path / "evil.properties"
    evil.write_text(sp._LOG4J2)
    old = shared / f"rmqhb-log4j2-{os.getuid()}.properties"
    old.symlink_to(evil)  # content matches: the old code used it
    path = Path(sp._log4j2_file())
    assert path != old and not path.is_symlink() and path.read_text() == sp._LOG4J2
    d = path.parent
    st = os.lstat(d)
    assert d.parent == shared and d.name.startswith("rmqhb-spark-") and stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Path(sp._log4j2_file()) == path and sp.private_dir() == str(d)  # one per process
    assert evil.read_text() == sp._LOG4J2 and old.is_symlink()


def test_the_private_directory_is_removed_at_exit(tmp_path):
    require_module("pyspark")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", "from engine.bindings import session; print(session._log4j2_file())"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.parent.parent == tmp_path and not path.parent.exists()


@pytest.mark.slow
def test_spark_session_uses_the_private_directory(spark):
    from engine.bindings.session import private_dir

    conf = spark.sparkContext.getConf()
    private = private_dir()
    assert f"-Dlog4j2.configurationFile=file:{private}/log4j2.properties" in conf.get("spark.driver.extraJavaOptions")
    assert f"-Djava.io.tmpdir={private}" in conf.get("spark.driver.extraJavaOptions")
    assert conf.get("spark.local.dir") == private
    assert spark.sparkContext._jvm.java.lang.System.getProperty("java.io.tmpdir") == private
    df = spark.range(10)
    assert df.groupBy((df.id % 3).alias("k")).count().count() == 3  # a shuffle works
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700


@pytest.mark.slow
def test_rmqhb_scan_into_a_directory_of_planted_symlinks_writes_safely(spark, tmp_path, capsys):
    from engine.bindings.spark import scan_main

    generate(tmp_path / "rec", FleetConfig(clients=20, groups=4, days=0.1, seed=3))
    victim = _victim(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    for name in REPORT_FILES:
        (out / name).symlink_to(victim)
    assert scan_main([str(tmp_path / "rec"), "--out", str(out), "--master", "local[2]"]) in (0, 3)
    assert victim.read_text() == "precious\n"
    assert f"report: {out / 'index.html'}" in capsys.readouterr().out
    for name in ("findings.json", "index.html", "expired_clients.csv", "heartbeat_gaps.csv", "group_sizes.svg"):
        assert stat.S_ISREG(os.lstat(out / name).st_mode), name
    _no_private_dir_left(out)

"""A broker's log and its capture scanned together (issue 28 s6), each input's kind from its content, --log-tz for
logs only, and mixed directories (issue 29 s3): engine.bindings.merge.

The run: test_java_log_format's java_run (a real broker of this project writing broker.log in 4.9.8's Java format
and recording every heartbeat: four clients, D silent until the SCAN removes it and back on a new connection, C
killed, A, B, D unregistering), and its capture (scripts/pcap_tool.py from-recording: every heartbeat on its
connection, the connections left open as the clients went silent with them open)."""
import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from engine.recording.scan_py import ScanParams

from conftest import require_module
from test_java_log_format import EXPIRY_MS, java_run  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("pcap_tool", ROOT / "scripts" / "pcap_tool.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

#: the run's scale: the expiry is 2 s (EXPIRY_MS), D's silence ~3 s, the others heartbeat every 0.25 s
PARAMS = ScanParams(expiry_s=EXPIRY_MS / 1000, gap_threshold_s=1.5)
OPTIONS = ["--expiry", str(EXPIRY_MS / 1000), "--gap-threshold", "1.5", "--no-plots"]


@pytest.fixture(scope="module")
def run(java_run, tmp_path_factory):  # noqa: F811
    """(log file, capture file, D's first address) of one run."""
    rec, logs, d_addr = java_run
    cap = tmp_path_factory.mktemp("capture") / "fleet.pcap"
    tool.main(["from-recording", str(rec), str(cap), "--keep-open-after", "1"])
    return logs / "broker.log", cap, d_addr


def _recording_scans(log, rec, spark=None):
    """(log findings, recording findings, merged) of the run's log and its recording, as `rmqhb scan` runs them."""
    from engine.bindings import merge
    from engine.bindings import segments as seg
    from engine.bindings.brokerlog import local_log_scan
    from engine.bindings.scan_engine import local_recording_scan

    plan = seg.plan_splits(rec)
    if spark is None:
        lf = local_log_scan([log], PARAMS, log_tz="+08:00", client_ids=True)
        rf = {**local_recording_scan(plan, PARAMS), "_client_ids": merge.recording_client_ids(rec),
              "_directory": str(rec)}
    else:
        from engine.bindings import brokerlog
        from engine.bindings.spark import scan

        lf = brokerlog.scan(spark, [log], PARAMS, log_tz="+08:00", client_ids=True)
        rf = {**scan(spark, rec, PARAMS, plan=plan, client_ids=True), "_directory": str(rec)}
    return lf, rf, merge.merge_log_and_heartbeats(lf, rf, "broker-a")


def _scans(log, cap, spark=None):
    from engine.bindings import brokerlog, merge, pcap

    if spark is None:  # as `rmqhb scan --engine local` runs them (the Spark scans' ``scan`` sections)
        from engine.bindings.brokerlog import local_log_scan
        from engine.bindings.pcap import local_capture_scan

        lf = local_log_scan([log], PARAMS, log_tz="+08:00", client_ids=True)
        cf = local_capture_scan([cap], PARAMS, client_ids=True)
    else:
        lf = brokerlog.scan(spark, [log], PARAMS, log_tz="+08:00", client_ids=True)
        cf = pcap.scan(spark, [cap], PARAMS, client_ids=True)
    return lf, cf, merge.merge_log_and_heartbeats(lf, cf, "broker-a")


def test_file_kind_is_the_content_not_the_name(tmp_path, run):
    from engine.bindings.merge import file_kind

    log, cap, _ = run
    (tmp_path / "capture.log").write_bytes(cap.read_bytes())
    (tmp_path / "notes.txt").write_bytes(log.read_bytes())
    (tmp_path / "c.pcap.gz").write_bytes(gzip.compress(cap.read_bytes()))
    whole = gzip.compress(cap.read_bytes())
    (tmp_path / "cut.pcap.gz").write_bytes(whole[:len(whole) // 3])  # a cut .gz still shows its header
    (tmp_path / "l.gz").write_bytes(gzip.compress(log.read_bytes()))
    (tmp_path / "x.seg").write_bytes(b"")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 8)
    assert {f.name: file_kind(f) for f in sorted(tmp_path.iterdir())} == {
        "blob.bin": None, "c.pcap.gz": "pcap", "capture.log": "pcap", "cut.pcap.gz": "pcap", "l.gz": "broker-log",
        "notes.txt": "broker-log", "x.seg": "recording"}


def test_a_log_and_its_capture_are_one_timeline(run):
    """Each event once: D's expiry seen in both is one row (the log's time, cause and group, the capture's
    connection times in ms); C's kill from the log; D's gap from the capture (the log has none); four clients."""
    log, cap, d_addr = run
    lf, cf, m = _scans(log, cap)
    # what each input gives alone
    assert [r["addr"] for r in lf["expired_clients"]] == [r["addr"] for r in cf["expired_clients"]] == [d_addr]
    assert lf["heartbeat_gaps"] == [] and "heartbeat_gaps" in lf["unsupported"]
    assert [r["client_id"] for r in cf["heartbeat_gaps"]] == ["127.0.0.1@Driver-D"]
    assert [r["client_id"] for r in lf["vanished_clients"]] == ["127.0.0.1@Driver-C"] and not cf["vanished_clients"]
    # together
    [x] = m["expired_clients"]
    [lx], [cx] = lf["expired_clients"], cf["expired_clients"]
    assert (x["addr"], x["cause"], x["source"]) == (d_addr, "scan", "capture+log")
    assert x["expired_ms"] == lx["expired_ms"] and x["groups"] == lx["groups"] == ["CID_J"]
    assert x["connected_ms"] == cx["connected_ms"] and x["last_heartbeat_ms"] == cx["last_heartbeat_ms"]
    assert [r["client_id"] for r in m["vanished_clients"]] == ["127.0.0.1@Driver-C"]
    assert m["heartbeat_gaps"] == [{**cf["heartbeat_gaps"][0], "broker": "broker-a", "source": "capture"}]
    assert "heartbeat_gaps" not in m["unsupported"]
    assert m["summary"]["clients"] == 4 and m["merged"]["clients"] == {"both": 4, "log_only": 0, "heartbeats_only": 0}
    assert m["merged"]["expiries"] == {"both": 1, "log_only": 0, "heartbeats_only": 0}
    assert m["summary"]["records"] == lf["summary"]["records"] + cf["summary"]["records"]
    assert m["summary"]["expired_clients"] == 1 and m["summary"]["heartbeat_gaps"] == 1
    assert m["group_sizes"] == [{**r, "source": "log"} for r in lf["group_sizes"]]
    assert m["broker_boots"] == lf["broker_boots"] and m["capture"] == cf["capture"] and m["log"] == lf["log"]


def test_a_log_and_the_recording_of_one_run_are_one_timeline(run, java_run):  # noqa: F811
    """This broker's recording and its Java-format log (the pair test_java_log_format compares): as with the
    capture, D's expiry once (the log's time and cause, the recording's connection times), C's kill from the log
    (the recording, heartbeats only, cannot see it), D's gap from the recording, four clients."""
    log, _, d_addr = run
    lf, rf, m = _recording_scans(log, java_run[0])
    [x] = m["expired_clients"]
    assert (x["addr"], x["cause"], x["source"]) == (d_addr, "scan", "recording+log")
    assert x["connected_ms"] == rf["expired_clients"][0]["connected_ms"]
    assert [r["client_id"] for r in m["vanished_clients"]] == ["127.0.0.1@Driver-C"]
    assert [(r["client_id"], r["source"]) for r in m["heartbeat_gaps"]] == [("127.0.0.1@Driver-D", "recording")]
    assert m["summary"]["clients"] == 4 and "capture" not in m and m["merged"]["heartbeats_from"] == "recording"
    assert m["merged"]["expiries"] == {"both": 1, "log_only": 0, "heartbeats_only": 0}


def test_an_expiry_whose_scan_line_the_log_lost_keeps_the_captures_inference(run, tmp_path):
    """The log without D's SCAN line (a broker dropping INFO lines under load): the log sees only D's channel
    close (D came back: no vanished client) and no expiry; the capture's expiry stays (cause inferred), once;
    C's kill stays."""
    log, cap, d_addr = run
    cut = tmp_path / "broker-a" / "broker.log"
    cut.parent.mkdir()
    cut.write_text("".join(ln for ln in log.read_text().splitlines(True) if "SCAN: remove expired" not in ln))
    lf, cf, m = _scans(cut, cap)
    assert lf["expired_clients"] == [] and [r["client_id"] for r in lf["vanished_clients"]] == ["127.0.0.1@Driver-C"]
    [x] = m["expired_clients"]
    assert (x["addr"], x["cause"], x["source"]) == (d_addr, "inferred", "capture")
    assert [r["client_id"] for r in m["vanished_clients"]] == ["127.0.0.1@Driver-C"]
    assert m["merged"]["expiries"] == {"both": 0, "log_only": 0, "heartbeats_only": 1}


def _cli(argv, capsys):
    from engine.cli import main

    status = main(["scan", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def test_rmqhb_scan_log_and_capture(run, tmp_path, capsys):
    """`rmqhb scan broker.log fleet.pcap --log-tz ...`: one report of both (it parsed the capture as log lines)."""
    log, cap, d_addr = run
    status, out, err = _cli([log, cap, "--log-tz", "+08:00", "--out", tmp_path / "r", "--engine", "local",
                             *OPTIONS], capsys)
    assert status == 0, err
    f = json.loads((tmp_path / "r" / "findings.json").read_text())
    assert f["scan"]["method"] == "broker-log+pcap" and f["log"]["unparseable"] == 0
    assert f["merged"]["inputs"] == {"broker-log": [str(log.resolve())], "pcap": [str(cap)]}
    assert [(r["addr"], r["cause"]) for r in f["expired_clients"]] == [(d_addr, "scan")]
    assert "merged broker-a's broker log" in out and "expiries 1 in both" in out
    assert "Two inputs, one timeline" in (tmp_path / "r" / "index.html").read_text()


def test_log_tz_with_only_a_capture_is_ignored_with_one_line(run, tmp_path, capsys):
    """`rmqhb scan fleet.pcap --log-tz ...` scans the capture (it found nothing) and says the zone is unused."""
    _, cap, _ = run
    status, out, err = _cli([cap, "--log-tz", "+08:00", "--out", tmp_path / "r", "--engine", "local", *OPTIONS],
                            capsys)
    assert status == 0, err
    assert err.strip() == ("rmqhb scan: --log-tz ignored: it is the zone of broker-log lines, and the input is "
                           "packet captures (UTC times)")
    f = json.loads((tmp_path / "r" / "findings.json").read_text())
    assert f["scan"]["method"] == "pcap" and f["summary"]["records"] > 0 and len(f["expired_clients"]) == 1


def test_mixed_directories(run, java_run, tmp_path, capsys):  # noqa: F811
    """A directory of a broker log and a capture is scanned whole (the log's zone given); with a recording too it
    is refused with one line naming the files and what to do (a recording and a capture hold the same
    heartbeats); a recording with its broker's log is scanned whole again."""
    log, cap, _ = run
    rec = java_run[0]
    d = tmp_path / "broker-a"
    d.mkdir()
    shutil.copy(log, d / "broker.log")
    shutil.copy(cap, d / "tcpdump.out")  # a capture whatever its name
    status, out, err = _cli([d, "--log-tz", "+08:00", "--out", tmp_path / "r", "--engine", "local", *OPTIONS],
                            capsys)
    assert status == 0, err
    f = json.loads((tmp_path / "r" / "findings.json").read_text())
    assert f["merged"]["expiries"]["both"] == 1 and f["merged"]["broker"] == "broker-a"
    for seg in rec.glob("*.seg"):
        shutil.copy(seg, d / seg.name)
    status, out, err = _cli([d, "--out", tmp_path / "r2", *OPTIONS], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "r2").exists()
    assert "a recording" in err and "tcpdump.out" in err and "broker.log" in err and "same heartbeats" in err
    (d / "tcpdump.out").unlink()  # the recording and the log of one run: one timeline as with a capture
    status, out, err = _cli([d, "--log-tz", "+08:00", "--out", tmp_path / "r3", "--engine", "local", *OPTIONS],
                            capsys)
    assert status == 0, err
    f = json.loads((tmp_path / "r3" / "findings.json").read_text())
    assert f["merged"]["heartbeats_from"] == "recording" and f["scan"]["method"] == "broker-log+recording"
    assert f["merged"]["expiries"] == {"both": 1, "log_only": 0, "heartbeats_only": 0}
    assert "merged broker-a's broker log" in out and "only in the recording" in out


def test_a_log_and_a_capture_of_two_brokers_are_refused(run):
    """Overlapping times and no group in common: two brokers' inputs, not merged."""
    from engine.bindings import merge

    log, cap, _ = run
    lf, cf, _ = _scans(log, cap)
    for r in cf["group_sizes"]:
        r["group"] = "OTHER_" + r["group"]
    assert "look like two brokers" in merge.same_broker_problem(lf, cf)
    assert merge.same_broker_problem(*_scans(log, cap)[:2]) is None


@pytest.mark.slow
@pytest.mark.spark
def test_spark_merged_scan_is_the_local_one(spark, run):
    """The same log and capture on Spark: the merged findings equal the local merge's (scan timings aside)."""
    require_module("pyspark")
    from engine.bindings.scan_engine import ENGINE_FIELDS, without_engine_fields

    log, cap, _ = run
    on_spark, local = _scans(log, cap, spark)[2], _scans(log, cap)[2]

    def comparable(f):
        f = without_engine_fields(f)
        for k in ("log", "capture"):
            f["scan"][k] = {x: v for x, v in f["scan"][k].items() if x not in ENGINE_FIELDS}
        return f

    assert comparable(on_spark) == comparable(local)


@pytest.mark.slow
@pytest.mark.spark
def test_spark_merged_recording_scan_is_the_local_one(spark, run, java_run):  # noqa: F811
    """The log and the recording on Spark: the local merge's findings (scan timings aside)."""
    require_module("pyspark")
    from engine.bindings.scan_engine import ENGINE_FIELDS, without_engine_fields

    log, _, _ = run
    on_spark, local = _recording_scans(log, java_run[0], spark)[2], _recording_scans(log, java_run[0])[2]

    def comparable(f):
        f = without_engine_fields(f)
        for k in ("log", "recording"):
            f["scan"][k] = {x: v for x, v in f["scan"][k].items() if x not in ENGINE_FIELDS}
        return f

    assert comparable(on_spark) == comparable(local)


def test_a_log_in_another_zone_than_given_is_refused_not_doubled(run, tmp_path, capsys):
    """The log's zone wrong (UTC instead of its GMT+8): its events would miss the capture's by 8 h and D's expiry
    would be two; the scan says which zone its lines imply, in one line, and writes no report."""
    log, cap, _ = run
    status, out, err = _cli([log, cap, "--log-tz", "UTC", "--out", tmp_path / "r", "--engine", "local", *OPTIONS],
                            capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    assert "imply UTC+8" in err and "give --log-tz +08:00" in err


def test_broker_names_over_a_log_and_a_capture_are_refused(run, tmp_path, capsys):
    """--broker a=LOG --broker a=CAPTURE: the capture was read as log lines; now one line saying how to merge."""
    log, cap, _ = run
    status, out, err = _cli(["--broker", f"a={log}", "--broker", f"a={cap}", "--out", tmp_path / "r"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "rmqhb scan LOG CAPTURE" in err


def test_a_connection_the_log_saw_end_decides_against_the_captures_inference(run):
    """A kill the capture did not see (no FIN/RST in it: the capture stops, a filter): the capture infers C
    expired at its last heartbeat + the expiry; the log saw C's channel close before that: C is a vanished
    client, not an expiry. And a close the log saw after the capture's expiry of it (the broker closing an
    expired channel whose SCAN line it dropped) is that expiry, not a vanished client."""
    from engine.bindings import merge

    log, cap, _ = run
    lf, cf, _ = _scans(log, cap)
    [c] = lf["vanished_clients"]
    inferred = {"client_id": c["client_id"], "addr": c["addr"], "conn_id": 7, "groups": c["groups"],
                "connected_ms": c["connected_ms"], "last_heartbeat_ms": c["last_heartbeat_ms"],
                "expired_ms": c["last_heartbeat_ms"] + EXPIRY_MS, "silent_since_before_ms": c["last_heartbeat_ms"],
                "returned_ms": None, "cause": "inferred"}
    m = merge.merge_log_and_heartbeats(lf, {**cf, "expired_clients": cf["expired_clients"] + [inferred]}, "broker-a")
    assert [r["client_id"] for r in m["expired_clients"]] == ["127.0.0.1@Driver-D"]
    assert [r["client_id"] for r in m["vanished_clients"]] == ["127.0.0.1@Driver-C"]
    early = {**inferred, "expired_ms": c["ended_ms"] - 5000, "last_heartbeat_ms": c["ended_ms"] - 7000}
    m = merge.merge_log_and_heartbeats(lf, {**cf, "expired_clients": cf["expired_clients"] + [early]}, "broker-a")
    assert sorted((r["client_id"], r["cause"]) for r in m["expired_clients"]) == [
        ("127.0.0.1@Driver-C", "inferred"), ("127.0.0.1@Driver-D", "scan")]
    assert m["vanished_clients"] == []


def test_the_merged_findings_say_which_input_gave_what(run, java_run):  # noqa: F811
    """findings.json ``merged.sources`` names the capture or the recording, and every row its input."""
    from engine.bindings.merge import SOURCES

    log, cap, _ = run
    m = _scans(log, cap)[2]
    assert m["merged"]["sources"] == SOURCES and m["merged"]["heartbeats_from"] == "pcap"
    r = _recording_scans(log, java_run[0])[2]
    assert "recording" in r["merged"]["sources"]["heartbeat_gaps"]
    assert not any("capture" in v for v in r["merged"]["sources"].values())
    for f, words in ((m, {"capture", "log", "capture+log"}), (r, {"recording", "log", "recording+log"})):
        got = {x["source"] for k in ("expired_clients", "heartbeat_gaps", "vanished_clients", "group_sizes")
               for x in f[k]}
        assert got and got <= words, got


def test_each_file_of_a_mix_is_checked_as_its_kind(run, tmp_path, capsys):
    """An empty capture beside a log: the capture scan's one line and exit 4, before any work, as when given
    alone; a capture cut in its middle: scanned, with the exit status and damage of the capture scan alone."""
    log, cap, _ = run
    (tmp_path / "empty.pcap").write_bytes(b"")
    status, out, err = _cli([log, tmp_path / "empty.pcap", "--log-tz", "+08:00", "--out", tmp_path / "r"], capsys)
    assert (status, err.strip()) == (4, f"rmqhb scan: {tmp_path / 'empty.pcap'} is empty: nothing to scan")
    data = cap.read_bytes()
    (tmp_path / "cut.pcap").write_bytes(data[:len(data) * 2 // 3])
    alone = _cli([tmp_path / "cut.pcap", "--out", tmp_path / "a", "--engine", "local", *OPTIONS], capsys)[0]
    status, out, err = _cli([log, tmp_path / "cut.pcap", "--log-tz", "+08:00", "--out", tmp_path / "r",
                             "--engine", "local", *OPTIONS], capsys)
    assert status == alone, err
    f = json.loads((tmp_path / "r" / "findings.json").read_text())
    g = json.loads((tmp_path / "a" / "findings.json").read_text())
    assert f["capture"] == g["capture"] and 0 < f["merged"]["heartbeats"] == g["summary"]["records"]
    assert f["scan"]["corrupt"] == g["scan"]["corrupt"]

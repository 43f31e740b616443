"""Damage is reported, never absorbed: a damaged recording is scanned into findings that name the damage, with a
non-zero exit, a banner and one stderr line; gaps over lost data are not client silence; clear one-line errors."""
import json
import os

import pytest

from conftest import require_module

require_module("pyspark")

from engine import cli

from engine.recording import scan_py  # noqa: E402
from engine.recording.recorder import list_segments, scan_segment, verify  # noqa: E402
from engine.recording.synth import FleetConfig, compare_with_manifest, generate  # noqa: E402


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A generated recording with 64 bytes XORed in the middle of one segment (the issue's reproduction)."""
    d = tmp_path_factory.mktemp("damaged")
    manifest = generate(d, FleetConfig(clients=40, groups=8, days=0.2, seed=11), block_records=512)
    seg = max(list_segments(d), key=lambda p: p.stat().st_size)
    data = bytearray(seg.read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + 64):
        data[i] ^= 0x5A
    seg.write_bytes(bytes(data))
    assert not verify(d).ok
    return d, manifest


def run(spark, argv, capsys):
    from engine.bindings.spark import scan_main

    rc = scan_main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_damaged_recording_exits_3_and_names_the_damage(spark, damaged, tmp_path, capsys):
    d, manifest = damaged
    out = tmp_path / "report"
    rc, stdout, stderr = run(spark, [str(d), "--out", str(out), "--no-plots"], capsys)
    assert rc == 3
    lines = [ln for ln in stderr.splitlines() if ln.startswith("rmqhb scan: DAMAGED INPUT")]
    assert len(lines) == 1 and "1 corrupt ranges" in lines[0]
    findings = json.loads((out / "findings.json").read_text())
    corrupt = findings["scan"]["corrupt"]
    assert len(corrupt) == 1
    c = corrupt[0]
    assert c["first_ms"] is not None and c["last_ms"] >= c["first_ms"]
    assert c["records_lost"] is None or c["records_lost"] > 0
    # no invented silence: every reported gap is an injected one; gaps over the damaged range are apart
    injected = {(g["client_id"], g["expected_start_ms"], g["expected_end_ms"])
                for g in manifest["anomalies"]["heartbeat_gaps"]}
    assert {(g["client_id"], g["start_ms"], g["end_ms"]) for g in findings["heartbeat_gaps"]} <= injected
    for g in findings["gaps_over_data_loss"]:
        assert g["start_ms"] <= c["last_ms"] and g["end_ms"] >= c["first_ms"]
    html = (out / "index.html").read_text()
    assert "DAMAGED INPUT" in html and c["reason"] in html
    # the same findings as the reference scan, which accounts for damage the same way
    reference = scan_py.scan(d)
    assert reference["scan"]["corrupt"] == corrupt
    for key in ("heartbeat_gaps", "gaps_over_data_loss", "inconsistent_subscriptions", "flapping_clients",
                "group_sizes"):
        assert findings[key] == json.loads(json.dumps(reference[key])), key
    # membership changes around the lost block are marked as such, not presented as plain group changes
    assert any(g.get("changes_over_data_loss") for g in findings["group_sizes"])


def test_allow_damage_and_strict(spark, damaged, tmp_path, capsys):
    d, _ = damaged
    rc, _, stderr = run(spark, [str(d), "--out", str(tmp_path / "a"), "--no-plots", "--allow-damage"], capsys)
    assert rc == 0 and "DAMAGED INPUT" in stderr
    rc, stdout, stderr = run(spark, [str(d), "--out", str(tmp_path / "s"), "--no-plots", "--strict"], capsys)
    assert rc == 5
    assert stderr.count("\n") == 1 and "--strict: the recording is damaged" in stderr
    assert "Traceback" not in stderr and "at org.apache" not in stderr


def test_clean_recording_exits_0(spark, tmp_path, capsys):
    d = tmp_path / "clean"
    manifest = generate(d, FleetConfig(clients=20, groups=4, days=0.1, seed=2), block_records=512)
    rc, _, stderr = run(spark, [str(d), "--out", str(tmp_path / "r"), "--no-plots"], capsys)
    assert rc == 0 and "DAMAGED" not in stderr
    assert compare_with_manifest(json.loads((tmp_path / "r" / "findings.json").read_text()), manifest) == []


def test_empty_and_garbage_directories_are_errors(spark, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, stderr = run(spark, [str(empty), "--out", str(tmp_path / "o1")], capsys)
    assert rc == 2 and stderr.strip() == (f"rmqhb scan: {empty} holds no recording (*.seg), broker log "
                                          "(broker*.log*) or packet capture (.pcap, .pcapng)")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "hb-0000000000001-000001.seg").write_bytes(os.urandom(4096))
    rc, _, stderr = run(spark, [str(garbage), "--out", str(tmp_path / "o2"), "--no-plots"], capsys)
    assert rc == 4 and "nothing decodable" in stderr and "Traceback" not in stderr


def test_missing_spark_extra_is_one_line(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    assert cli.main(["scan", "/nonexistent", "--out", "/tmp/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing: pyarrow" in err and "[spark]" in err

"""Summaries that agree with their own charts, and no noise findings (issue 28 §5): the summary's size range is the
chart's whole range; retry-topic churn is the retry subscription itself changing, not consumers restarting;
silences over lost data are one line per lost range with the clients it hides."""
import json
import re

import pytest

from engine.bindings import brokerlog as bl
from engine.bindings import report
from engine.recording import scan_py
from engine.recording.recorder import list_segments, verify
from engine.recording.synth import FleetConfig, generate

T0 = 1_795_400_000_000


class _Log:
    """A 4.9.8 broker.log written line by line (the generator's formats), in UTC."""

    def __init__(self):
        self.w = bl._LogWriter(0)
        self.cid = 0

    def conn(self, client, port):
        self.cid += 1
        return {"client": client, "addr": f"{client.split('@')[0]}:{port}", "cid": self.cid}

    def cci(self, c, ms):
        return bl._CCI.format(cid=c["cid"], st="-", addr=c["addr"], client=c["client"], lut=ms)

    def sd(self, topic, ver):
        return bl._SD.format(topic=topic, sub="*", tags="", ver=ver)

    def register(self, c, ms, group="CID_A", model="CLUSTERING"):
        self.w.add(ms, "INFO", "HeartbeatThread_1", f"new consumer connected, group: {group} CONSUME_PASSIVELY {model} "
                                                    f"channel: {self.cci(c, ms)}")

    def unregister(self, c, ms, group="CID_A"):
        self.w.add(ms, "INFO", "ClientManageThread_1",
                   f"unregister a consumer[{group}] from consumerGroupInfo {self.cci(c, ms)}")

    def sub(self, ms, text, level="INFO"):
        self.w.add(ms, level, "HeartbeatThread_2", f"subscription changed, {text}")

    def write(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for _, _, line in sorted(self.w.lines)))


@pytest.fixture(params=[False, True] if bl._parse_native is not None else [False], ids=lambda n: f"native={n}")
def native(request):
    return request.param


def test_summary_states_the_range_its_chart_shows(tmp_path, native):
    """A short log whose peak is in its first 120 s: the summary said 'between 0 and 3' under a chart peaking at 5
    (it skipped the first expiry of the input); it states the chart's range now."""
    log = _Log()
    clients = [log.conn(f"10.3.0.{k}@{k}", 40000 + k) for k in range(5)]
    for k, c in enumerate(clients):
        log.register(c, T0 + k * 1000)
    for k, c in enumerate(clients[:2]):
        log.unregister(c, T0 + 30_000 + k * 1000)  # the peak of 5 lasts 30 s, inside the first 120 s
    for k, c in enumerate(clients[2:]):
        log.unregister(c, T0 + 300_000 + k * 60_000)
    log.write(tmp_path / "b" / "broker.log")
    f = bl.scan_local([tmp_path / "b"], log_tz="+00:00", native=native)
    (g,) = [g for g in f["group_sizes"] if g["group"] == "CID_A"]
    assert g["max_members"] == 5 and [n for _, n in g["series"]] == [1, 2, 3, 4, 5, 4, 3, 2, 1, 0]
    assert report.size_range(g, f["summary"]["last_ms"]) == (0, 5)
    assert report.steady_range(g, f["summary"]["first_ms"], f["summary"]["last_ms"], 120_000) == (0, 3)
    report.write_report(f, tmp_path / "r", plots=False)
    html = (tmp_path / "r" / "index.html").read_text()
    summary = html[html.index("<section id=summary>"):html.index("</section>")]
    assert "between 0 and 5 live members" in summary and "between 0 and 3" not in summary


def _restarts_and_churn(tmp_path, native, churn: bool):
    """Group CID_A: five members; three restart within ten minutes (each new instance logs the retry topic's newer
    subVersion, as 4.9.8 does); with ``churn``, a BROADCASTING member's heartbeats remove the retry subscription
    and the others' add it back, four times in two minutes."""
    log = _Log()
    members = [log.conn(f"10.3.1.{k}@{k}", 41000 + k) for k in range(5)]
    ver = T0 - 100
    log.sub(T0, f"add new topic, group: CID_A {log.sd('%RETRY%CID_A', ver)}")
    for k, c in enumerate(members):
        log.register(c, T0 + k * 1000)
    for k, c in enumerate(members[:3]):  # a rolling restart: 3 reconnects in 10 min, no subscription change
        t = T0 + 600_000 + k * 120_000
        log.unregister(c, t)
        c2 = log.conn(c["client"], 42000 + k)
        log.register(c2, t + 2000)
        log.sub(t + 2000, f"group: CID_A OLD: {log.sd('%RETRY%CID_A', ver)} NEW: {log.sd('%RETRY%CID_A', t + 1900)}")
        ver = t + 1900
    if churn:
        b = log.conn("10.3.1.9@broadcast", 43000)
        t = T0 + 1_800_000
        log.register(b, t, model="BROADCASTING")
        for k in range(4):
            log.sub(t + k * 30_000 + 1000, f"group: CID_A remove topic %RETRY%CID_A {log.sd('%RETRY%CID_A', ver)}",
                    "WARN")
            log.sub(t + k * 30_000 + 11_000, f"add new topic, group: CID_A {log.sd('%RETRY%CID_A', ver)}")
        log.unregister(b, t + 300_000)
    log.write(tmp_path / "b" / "broker.log")
    return bl.scan_local([tmp_path / "b"], log_tz="+00:00", native=native)


def test_restarting_members_are_not_retry_topic_churn(tmp_path, native):
    f = _restarts_and_churn(tmp_path, native, churn=False)
    assert f["log"]["counts"]["event_sub_change"] == 3
    assert f["retry_topic_churn"] == []


def test_retry_subscription_removed_and_added_back_is_churn(tmp_path, native):
    f = _restarts_and_churn(tmp_path, native, churn=True)
    (r,) = f["retry_topic_churn"]
    t = T0 + 1_800_000
    assert (r["group"], r["retry_topic"], r["adds"], r["changes"], r["removes"]) == ("CID_A", "%RETRY%CID_A", 4, 0, 4)
    assert r["first_ms"] == t + 1000 and r["last_ms"] == t + 90_000 + 11_000 and r["max_per_window"] >= 3
    # the same over the events the Spark scan's tasks analyse (SCAN_COLUMNS only, analyze_events per broker)
    table, info = bl.read_local([tmp_path / "b"], log_tz="+00:00", native=native)
    narrow = bl.analyze_events(table.select(list(bl.SCAN_COLUMNS)).to_pylist(), info)
    assert narrow["retry_topic_churn"] == f["retry_topic_churn"]


def test_silences_over_lost_data_are_one_line_per_range(tmp_path):
    """A damaged recording hides many clients' heartbeats behind one range: findings.json and the report list the
    range once with the number of clients it hides; the per-client rows stay in gaps_over_data_loss."""
    d = tmp_path / "rec"
    generate(d, FleetConfig(clients=60, groups=6, days=0.1, seed=5), block_records=1024)
    seg = max(list_segments(d), key=lambda p: p.stat().st_size)
    data = bytearray(seg.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    seg.write_bytes(bytes(data))
    assert not verify(d).ok
    f = scan_py.scan(d)
    (corrupt,) = f["scan"]["corrupt"]
    hidden = {r["client_id"] for k in ("gaps_over_data_loss", "expired_over_data_loss") for r in f.get(k) or []}
    assert len(hidden) >= 20  # one damaged block hides most of the fleet
    report.write_report(f, tmp_path / "r", plots=False)
    written = json.loads((tmp_path / "r" / "findings.json").read_text())
    (row,) = written["silences_over_data_loss"]
    assert (row["first_ms"], row["last_ms"], row["kind"]) == (corrupt["first_ms"], corrupt["last_ms"], "corrupt")
    assert row["clients"] == len(hidden)
    assert row["gaps"] == len(f["gaps_over_data_loss"]) and row["expiries"] == len(f.get("expired_over_data_loss", []))
    html = (tmp_path / "r" / "index.html").read_text()
    lost = html[html.index("id=silences-lost-table"):]
    lost = lost[:lost.index("</table>")]
    assert lost.count("<tr>") == 2  # the header and one range
    # no row per hidden client in the per-client silences (those with a real silence only)
    real = {r["client_id"] for k in ("heartbeat_gaps", "expired_clients") for r in f.get(k) or []}
    silences = html[html.index("<section id=silences>"):]
    silences = silences[:silences.index("</section>")]
    for client in hidden - real:
        assert client not in silences
    summary = html[html.index("<section id=summary>"):html.index("</section>")]
    assert re.search(rf"{len(hidden)} clients silent over 1 lost range", summary)


def test_grouping_counts_a_client_once_per_range_and_matches_the_broker():
    findings = {"scan": {"data_loss": [{"broker": "a", "first_ms": 100, "last_ms": 200, "records_lost": 7},
                                       {"broker": "b", "first_ms": 100, "last_ms": 200, "records_lost": 3},
                                       {"broker": "a", "first_ms": 900, "last_ms": 950, "records_lost": 1}]},
                "gaps_over_data_loss": [
                    {"broker": "a", "client_id": "c1", "start_ms": 50, "end_ms": 150},
                    {"broker": "a", "client_id": "c1", "start_ms": 180, "end_ms": 300},   # same client, same range
                    {"broker": "a", "client_id": "c2", "start_ms": 150, "end_ms": 920},   # two ranges
                    {"broker": "b", "client_id": "c1", "start_ms": 120, "end_ms": 130}],
                "expired_over_data_loss": [{"broker": "a", "client_id": "c3", "last_heartbeat_ms": 10,
                                            "expired_ms": 130}]}
    rows = report.silences_over_data_loss(findings)
    assert [(r["broker"], r["first_ms"], r["clients"], r["gaps"], r["expiries"], r["records_lost"]) for r in rows] == [
        ("a", 100, 3, 3, 1, 7), ("b", 100, 1, 1, 0, 3), ("a", 900, 1, 1, 0, 1)]

"""The HTML report shows the log scan's findings (expired clients, retry-topic churn, subscription flips, per
broker), what the log could not support, the zone used and the unparsed line kinds with examples; and the
recording scan's expired clients. The report is self-contained (no network references)."""
import html
import re

import pytest

from conftest import require_module

require_module("pyarrow")

from engine.recording import scan_py  # noqa: E402
from engine.bindings import brokerlog as bl  # noqa: E402
from engine.bindings.report import write_report  # noqa: E402
from engine.recording.synth import FleetConfig, generate  # noqa: E402


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def _section(page: str, title: str) -> str:
    """The HTML from an <h2>title</h2> to the next <h2>."""
    start = page.index(f"<h2>{title}</h2>")
    end = page.find("<h2>", start + 4)
    return page[start:end if end > 0 else len(page)]


def _self_contained(page: str):
    refs = re.findall(r"""(?:src|href)=['"]([^'"]+)""", page)
    assert refs and all(not re.match(r"[a-z]+:", r) and "/" not in r for r in refs), refs
    assert "http://" not in page and "https://" not in page


@pytest.fixture(scope="module")
def log_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("logs")
    ma = bl.generate_broker_log(d / "broker-a" / "broker.log", groups=3, members=4, restarts=1, seed=2)
    mb = bl.generate_broker_log(d / "broker-b" / "broker.log", groups=3, members=3, seed=3)
    f = bl.scan_local([d], log_tz="+08:00")
    out = d / "report"
    index = write_report(f, out, plots=True)
    return f, index.read_text(), ma, mb, out


def test_log_report_expired_clients(log_report):
    f, page, ma, mb, _ = log_report
    sec = _text(_section(page, "Expired clients"))
    for broker, m in (("broker-a", ma), ("broker-b", mb)):
        x = m["expired"][0]
        assert re.search(rf"{broker}\s+{re.escape(x['client_id'])}\s+{re.escape(x['addr'])}\s+CID_G1, PID_G1", sec), sec
    assert "from the brokers' SCAN lines" in sec


def test_log_report_churn_flips_and_per_broker(log_report):
    f, page, ma, mb, _ = log_report
    churn = _text(_section(page, "Retry-topic churn"))
    # the BROADCASTING member's heartbeats remove the retry subscription, the others' add it back (adds, changes,
    # removes, max per window); the restarts' newer subVersions are not churn
    assert re.search(r"broker-a CID_G0 %RETRY%CID_G0 4 0 4 8 ", churn), churn
    flips = _text(_section(page, "Subscription flips"))
    assert re.search(r"broker-b\s+CID_G2\s+Topic_G2\s+3\s", flips) and "TagA || TagB" in flips and "TagC" in flips
    # members with another subscription: in the inconsistent table with their clients, not the flips
    inc = _text(_section(page, "Inconsistent subscriptions"))
    assert "10.9.0.3@odd" in inc and "Topic_G2" in inc
    per = _text(_section(page, "Per broker"))
    # inconsistent (members: the odd and the BROADCASTING one, + flips), flapping, group sizes, expired, churn
    assert re.search(r"broker-a 3 1 \d+ 1 1 broker-b 3 1 \d+ 1 1 fleet \(all brokers\) 6 2 \d+ 2 2 ", per), per
    assert "10.9.0.1@flapper" in per  # the same client flaps on both brokers


def test_log_report_zone_unsupported_and_unparsed_lines(log_report):
    f, page, _, _, out = log_report
    logs = _text(_section(page, "Broker logs read"))
    assert "Log time zone used: +08:00 (--log-tz)" in logs and "agree with this zone (UTC+8)" in logs
    assert re.search(r"malformed_register\s+2\s+\S", logs) and re.search(r"unknown_format\s+2\s+Nov 24, 2026", logs)
    assert re.search(r"continuation\s+2\s+at io\.netty", logs)
    cannot = _text(_section(page, "What this input cannot show"))
    assert "heartbeat_gaps" in cannot and "invisible" in cannot
    assert "Not supported by this input" in _text(_section(page, "Heartbeat gaps"))
    assert not (out / "gap_histogram.svg").exists()
    assert (out / "expired_clients.csv").read_text().count("10.9.0.2@frozen") == 2
    assert "unknown_format,2,Nov 24, 2026" in (out / "log_lines.csv").read_text().replace('"', "")
    _self_contained(page)


def test_log_report_flags_a_wrong_zone(tmp_path):
    bl.generate_broker_log(tmp_path / "b" / "broker.log", groups=2, members=2, seed=1)
    f = bl.scan_local([tmp_path / "b"], log_tz="UTC")
    page = write_report(f, tmp_path / "r", plots=False).read_text()
    assert "imply UTC+8, not the zone in use (UTC+0)" in _text(_section(page, "Broker logs read"))


def test_recording_report_lists_expired_clients(tmp_path):
    m = generate(tmp_path / "rec", FleetConfig(clients=30, groups=6, days=0.15, seed=5))
    f = scan_py.scan(tmp_path / "rec")
    page = write_report(f, tmp_path / "r", plots=True).read_text()
    sec = _text(_section(page, "Expired clients"))
    want = m["anomalies"]["expired_clients"]
    assert want and all(x["client_id"] in sec and x["addr"] in sec for x in want)
    assert sec.count("never") == sum(x["returned_ms"] is None for x in want)
    assert "Broker logs read" not in page and "Per broker" not in page and "Retry-topic churn" not in page
    assert "<img src='gap_histogram.svg'" in page
    _self_contained(page)


def test_subscription_difference_per_topic():
    from engine.bindings.report import majority_variant, subscription_difference

    majority = [["%RETRY%G", "TAG", "*"], ["A", "TAG", "t1 || t2"], ["B", "TAG", "*"], ["C", "SQL92", "a > 1"]]
    member = [["%RETRY%G", "TAG", "*"], ["A", "TAG", "t2 || t3"], ["B", "TAG", "x"], ["D", "TAG", "*"]]
    d = {r["topic"]: r for r in subscription_difference(majority, member)}
    assert sorted(d) == ["A", "B", "C", "D"]  # the same retry subscription is no difference
    assert (d["A"]["only_member_tags"], d["A"]["only_majority_tags"]) == (["t3"], ["t1"])
    assert (d["B"]["majority"], d["B"]["member"], d["B"]["only_member_tags"]) == ("*", "x", [])  # '*' is every tag
    assert (d["C"]["majority"], d["C"]["member"]) == ("SQL92: a > 1", None)
    assert (d["D"]["majority"], d["D"]["member"]) == (None, "*")
    assert subscription_difference(majority, majority) == []
    assert majority_variant([{"clients": ["a"]}, {"clients": ["b", "c"]}]) == (1, False)
    assert majority_variant([{"clients": ["a", "d"]}, {"clients": ["b", "c"]}]) == (0, True)


def test_recording_report_summary_first_and_differences_csv(tmp_path):
    import csv

    m = generate(tmp_path / "rec", FleetConfig(clients=30, groups=6, days=0.15, seed=5))
    f = scan_py.scan(tmp_path / "rec")
    page = write_report(f, tmp_path / "r", plots=False).read_text()
    assert page.index("<h2>Summary</h2>") < page.index("<h2>Inconsistent subscriptions</h2>")
    assert "id=banner" not in page  # read whole: no banner
    summary = _text(_section(page, "Summary"))
    assert re.search(rf"Inconsistent subscriptions {len(f['inconsistent_subscriptions'])} ", summary), summary
    rows = list(csv.DictReader(open(tmp_path / "r" / "subscription_differences.csv")))
    for inj in m["anomalies"]["inconsistent_subscriptions"]:
        if inj["kind"] != "inconsistent":
            continue
        base = {t: x for t, _, x in inj["subscriptions"]}
        other = {t: x for t, _, x in inj["variant_subscriptions"]}
        want = {(inj["clients"][0], t, base.get(t, ""), other.get(t, "")) for t in set(base) | set(other)
                if base.get(t) != other.get(t)}
        got = {(r["client_id"], r["topic"], r["majority_expression"], r["member_expression"]) for r in rows
               if r["group"] == inj["group"]}
        assert want and got == want
        # the member's address: its connection's (ip:port, from the recording), not the IP of its clientId
        (ip,) = re.findall(r"\d+\.\d+\.\d+\.\d+", inj["clients"][0])
        assert {r["address"] for r in rows if r["group"] == inj["group"]} == {
            a for x in f["member_addresses"] if x["client_id"] == inj["clients"][0] for a in x["addrs"]}
        assert all(re.fullmatch(rf"{re.escape(ip)}:\d+", r["address"]) for r in rows if r["group"] == inj["group"])
    _self_contained(page)


def test_partly_unreadable_banner(tmp_path):
    import json as _json

    from engine.recording.recorder import HeartbeatRecorder

    body = _json.dumps({"clientID": "10.0.0.1@x", "producerDataSet": [{"groupName": "P"}]}).encode()
    with HeartbeatRecorder(tmp_path / "rec") as rec:
        for i in range(5):
            rec.record(1_700_000_000_000 + i * 30_000, 1, "10.0.0.1:1", "JAVA", 409, body)
        rec.record(1_700_000_000_000 + 5 * 30_000, 1, "10.0.0.1:1", "JAVA", 409, b"{not json")
    f = scan_py.scan(tmp_path / "rec")
    assert f["summary"]["bad_bodies"] == 1
    page = write_report(f, tmp_path / "r", plots=False).read_text()
    assert "PARTLY UNREADABLE INPUT:</b> 1 of 6 heartbeat bodies could not be decoded" in page
    assert "DAMAGED INPUT" not in page
    assert page.index("id=banner") < page.index("<h2>Summary</h2>")


def test_connection_marks():
    """A connect per connection at its first heartbeat; a close bound per connection the client left (its last
    heartbeat earlier than the client's last); a capture's SYN and FIN/RST where it saw them."""
    from engine.recording.scan_py import connection_marks

    conns = {1: (100, 400), 2: (200, 900), 3: (500, 900)}  # 1 left; 2 and 3 concurrent to the end
    assert connection_marks(conns) == ([100, 200, 500], [[400, "last_heartbeat"]])
    assert connection_marks({7: (5, 5), 8: (5, 5)}) == ([5, 5], [])  # a tie: neither was left
    ev = {1: {"open": 99, "end": [401, "fin_by_client"]}, 3: {"end": [950, "rst_by_server"]}}
    assert connection_marks(conns, ev) == ([99, 200, 500], [[401, "fin_by_client"], [950, "rst_by_server"]])


def test_log_report_connects_and_closes_csv(log_report):
    import csv

    f, page, ma, mb, out = log_report
    rows = list(csv.DictReader(open(out / "flapping_connections.csv")))
    for broker, m in (("broker-a", ma), ("broker-b", mb)):
        (want,) = m["flapping"]
        mine = [r for r in rows if r["broker"] == broker and r["client_id"] == want["client_id"]]
        assert [int(r["ms"]) for r in mine if r["event"] == "connect"] == want["connect_ms"]
        assert [[int(r["ms"]), r["how"]] for r in mine if r["event"] == "close"] == want["closes"]
    sec = _section(page, "Flapping clients")
    table = sec[sec.index("id=flapping-table"):]
    assert table.count("class='connect'") == 2 * 5 and table.count("class='close'") == 2 * 4
    assert "channel closed (NETTY EVENT)" in sec and "flapping_connections.csv" in sec

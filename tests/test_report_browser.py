"""The scan report in a real browser (issue 17): Debian's headless Chromium driven through chromedriver
(selenium) opens the report of a generated recording with known anomalies (its manifest) and checks what an
operator sees: no console errors, the summary, every injected anomaly (group, member, difference) visible, the
reconnect and silence timelines, the small multiples of the groups that changed, the collapsed table of the other
groups and its filter, sorting a table, the print stylesheet; the broker-log and capture reports render the same
way. Saves screenshots in the test's tmp dir (scripts/report_screenshot.py writes docs/report.png).

Needs ``chromium`` and ``chromedriver`` (``apt-get install chromium chromium-driver``; scripts/dev.sh test installs
them) or ENGINE_CHROMIUM / ENGINE_CHROMEDRIVER; under CI=true / ENGINE_STRICT=1 a missing browser fails."""
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, require_module, strict

require_module("selenium")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from engine.recording import scan_py  # noqa: E402
from engine.bindings.report import utc as scan_py_utc  # noqa: E402
from engine.bindings.report import write_report  # noqa: E402
from engine.recording.synth import FleetConfig, generate  # noqa: E402

pytestmark = pytest.mark.browser


def browser_paths():
    """(chromium, chromedriver): ENGINE_CHROMIUM / ENGINE_CHROMEDRIVER, else found on PATH."""
    env = os.environ.get("ENGINE_CHROMIUM")
    chrome = shutil.which(env) if env else next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which(os.environ.get("ENGINE_CHROMEDRIVER") or "chromedriver")
    return chrome, driver


def start_browser(width=1300, height=1000):
    chrome, driver = browser_paths()
    if not chrome or not driver:
        msg = (f"the report's browser test needs chromium and chromedriver (found {chrome!r}, {driver!r}): "
               "apt-get install chromium chromium-driver (scripts/dev.sh test installs them as root)")
        if strict():
            pytest.fail(msg + " -- required under CI=true / ENGINE_STRICT=1")
        pytest.skip(msg)
    o = Options()
    o.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--lang=en-US"):
        o.add_argument(arg)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=o)


@pytest.fixture(scope="module")
def browser():
    d = start_browser()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def recording_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    m = generate(tmp / "rec", FleetConfig(clients=64, groups=8, days=0.25, seed=17))
    a = m["anomalies"]
    kinds = {x["kind"] for x in a["inconsistent_subscriptions"]}
    # the fleet holds every kind of injection, or the test would prove less than it says
    assert kinds == {"inconsistent", "rolling_update"} and a["flapping_clients"] and a["heartbeat_gaps"]
    assert a["group_sizes"] and a["expired_clients"]
    f = scan_py.scan(tmp / "rec")
    index = write_report(f, tmp / "report", plots=True)
    return m, f, index


def _open(browser, index: Path):
    browser.get(index.as_uri())
    browser.get_log("browser")  # (a fresh page: earlier pages' entries out of the way)
    browser.refresh()
    assert browser.find_element(By.TAG_NAME, "h1").text == "Heartbeat scan report"


def _severe(browser):
    return [x for x in browser.get_log("browser") if x["level"] == "SEVERE"]


def _visible(el) -> str:
    assert el.is_displayed(), el.get_attribute("outerHTML")[:300]
    return el.text


def test_summary_first_and_no_console_errors(browser, recording_report):
    m, f, index = recording_report
    _open(browser, index)
    assert _severe(browser) == []
    summary = browser.find_element(By.ID, "summary")
    # the summary is the first thing under the header (no banner: the recording was read whole)
    assert browser.find_elements(By.ID, "banner") == []
    assert summary.location["y"] < 250, summary.location
    rows = {r.find_element(By.TAG_NAME, "th").text: r.find_elements(By.TAG_NAME, "td")
            for r in summary.find_elements(By.CSS_SELECTOR, "tbody tr")}
    a = m["anomalies"]
    assert rows["Inconsistent subscriptions"][0].text == str(len(a["inconsistent_subscriptions"]))
    assert rows["Flapping clients"][0].text == str(len(a["flapping_clients"]))
    assert rows["Heartbeat gaps"][0].text == str(len(a["heartbeat_gaps"]))
    assert rows["Expired clients"][0].text == str(len(a["expired_clients"]))
    # the worst cases: the longest disagreement, the client with most reconnects, the longest gap
    longest = max(f["inconsistent_subscriptions"], key=lambda r: r["duration_s"])
    assert longest["group"] in _visible(rows["Inconsistent subscriptions"][1])
    worst_gap = max(a["heartbeat_gaps"], key=lambda g: g["gap_s"])
    assert worst_gap["client_id"] in _visible(rows["Heartbeat gaps"][1])
    most = max(a["flapping_clients"], key=lambda x: x["reconnects"])["reconnects"]
    assert f"{most} reconnects" in _visible(rows["Flapping clients"][1])
    for kind in ("Inconsistent subscriptions", "Flapping clients", "Heartbeat gaps", "Expired clients"):
        link = rows[kind][2].find_element(By.TAG_NAME, "a")
        assert link.get_attribute("href").endswith(".csv") and (index.parent / link.text).is_file()
    browser.save_screenshot(str(index.parent / "summary.png"))


def test_every_injected_disagreement_is_shown_as_a_difference(browser, recording_report):
    m, f, index = recording_report
    _open(browser, index)
    for inj in m["anomalies"]["inconsistent_subscriptions"]:
        card = browser.find_element(By.CSS_SELECTOR, f"article.card[data-group='{inj['group']}']")
        text = _visible(card)
        assert inj["group"] in text
        base = {t: x for t, _, x in inj["subscriptions"]}
        other = {t: x for t, _, x in inj["variant_subscriptions"]}
        changed = [t for t in sorted(set(base) | set(other)) if base.get(t) != other.get(t)]
        assert changed
        diff_rows = card.find_elements(By.CSS_SELECTOR, "table.diff tbody tr")
        shown = {r.find_elements(By.TAG_NAME, "td")[0].text: [c.text for c in r.find_elements(By.TAG_NAME, "td")]
                 for r in diff_rows}
        assert sorted(shown) == changed, (shown, changed)
        for t in changed:
            _, maj_expr, their_expr, only_theirs, only_majority = shown[t]
            want = (base.get(t, "(not subscribed)"), other.get(t, "(not subscribed)"))
            if inj["kind"] == "inconsistent":  # one member deviates: the majority holds the group's set
                assert (maj_expr, their_expr) == want
                if t in base and t in other and "*" not in (base[t], other[t]):
                    extra = set(other[t].split(" || ")) - set(base[t].split(" || "))
                    assert set(only_theirs.split()) == extra, (only_theirs, extra)
                elif t not in base:
                    assert only_theirs == "whole topic"
            else:  # a rolling update: every member moves, the majority may be either set
                assert {maj_expr, their_expr} == set(want)
        members = [r.find_elements(By.TAG_NAME, "td") for r in card.find_elements(By.CSS_SELECTOR, "table.members tbody tr")]
        shown_members = {_visible(c[0]) for c in members}
        if inj["kind"] == "inconsistent":
            assert shown_members == set(inj["clients"])
            (cells,) = members
            (ip,) = re.findall(r"\d+\.\d+\.\d+\.\d+", inj["clients"][0])
            assert re.fullmatch(rf"{re.escape(ip)}:\d+", _visible(cells[1]))  # its connection's address
        else:
            assert shown_members and shown_members <= set(inj["clients"])
        # the span on the timeline strip, and its times in words
        strip = card.find_element(By.CSS_SELECTOR, "svg.strip rect.bad")
        assert strip.is_displayed() and float(strip.get_attribute("width")) >= 2
        assert "UTC" in text


def test_flapping_silences_expiries_and_group_sizes(browser, recording_report):
    m, f, index = recording_report
    _open(browser, index)
    a = m["anomalies"]
    table = browser.find_element(By.ID, "flapping-table")
    flapping = {r["client_id"]: r for r in f["flapping_clients"]}
    for inj in a["flapping_clients"]:
        (row,) = [r for r in table.find_elements(By.CSS_SELECTOR, "tbody tr") if inj["client_id"] in r.text]
        assert inj["group"] in _visible(row)
        # one connect mark per connection (its first one and each injected reconnect), one close mark per
        # connection it left (a recording bounds the close by the connection's last heartbeat): distinct shapes
        connects = row.find_elements(By.CSS_SELECTOR, "svg path.connect")
        closes = row.find_elements(By.CSS_SELECTOR, "svg path.closeby")
        assert len(connects) == len(inj["expected_reconnect_ms"]) + 1 == len(flapping[inj["client_id"]]["connect_ms"])
        assert len(closes) == len(inj["expected_reconnect_ms"]) and not row.find_elements(By.CSS_SELECTOR, "svg path.close")
        assert all(x.is_displayed() for x in connects + closes)
        titles = {x.find_element(By.TAG_NAME, "title").get_attribute("textContent") for x in connects}
        assert {f"connect {scan_py_utc(t)} UTC" for t in inj["expected_reconnect_ms"]} <= titles, titles
        assert browser.execute_script("return getComputedStyle(arguments[0]).stroke", connects[0]) != \
            browser.execute_script("return getComputedStyle(arguments[0]).stroke", closes[0])
    legend = _visible(browser.find_element(By.CSS_SELECTOR, "#flapping > p"))
    assert "a connect" in legend and "a close the input shows" in legend and "last heartbeat" in legend
    assert len(browser.find_elements(By.CSS_SELECTOR, "#flapping > p svg.legend")) == 3
    silences = browser.find_element(By.ID, "silences-table")
    for inj in a["heartbeat_gaps"]:
        (row,) = [r for r in silences.find_elements(By.CSS_SELECTOR, "tbody tr") if inj["client_id"] in r.text]
        assert row.find_elements(By.CSS_SELECTOR, "svg rect.gap")[0].is_displayed()
        assert inj["client_id"] in _visible(browser.find_element(By.ID, "gaps-table"))
    expired = _visible(browser.find_element(By.ID, "expired-table"))
    assert all(x["client_id"] in expired for x in a["expired_clients"])
    # small multiples: each resized group and each group with a disagreement has its chart
    charted = {_visible(fig.find_element(By.TAG_NAME, "b")) for fig in browser.find_elements(By.CSS_SELECTOR, "figure.multiple")}
    want = {g["group"] for g in a["group_sizes"]} | {x["group"] for x in a["inconsistent_subscriptions"]}
    assert want <= charted, (want, charted)
    # every other group: in one table, collapsed until opened, filterable
    others = browser.find_element(By.ID, "groups-table")
    assert not others.is_displayed()
    browser.find_element(By.CSS_SELECTOR, "#other-groups > summary").click()
    assert others.is_displayed()
    rows = others.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert rows and not charted & {r.find_elements(By.TAG_NAME, "td")[0].text for r in rows}
    name = rows[-1].find_elements(By.TAG_NAME, "td")[0].text
    box = browser.find_element(By.CSS_SELECTOR, "input.filter[data-t='groups-table']")
    box.send_keys(name)
    left = [r for r in others.find_elements(By.CSS_SELECTOR, "tbody tr") if r.is_displayed()]
    assert left and all(name in r.text for r in left) and len(left) < len(rows)
    box.clear()
    box.send_keys(" ")  # a key event: the filter runs again, and a blank filter matches every row
    assert _severe(browser) == []


def test_sorting_a_table(browser, recording_report):
    m, f, index = recording_report
    _open(browser, index)
    table = browser.find_element(By.ID, "expired-table")
    headers = [h.text.strip() for h in table.find_elements(By.CSS_SELECTOR, "thead th")]

    def column(name):
        i = headers.index(name)
        return [r.find_elements(By.TAG_NAME, "td")[i].text for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]

    th = table.find_elements(By.CSS_SELECTOR, "thead th")[headers.index("client")]
    th.click()
    assert column("client") == sorted(column("client"), key=str.lower) and th.get_attribute("aria-sort") == "ascending"
    th.click()
    assert column("client") == sorted(column("client"), key=str.lower, reverse=True)
    assert th.get_attribute("aria-sort") == "descending"
    # numbers sort as numbers (the gap table's seconds), not as text
    gaps = browser.find_element(By.ID, "gaps-table")
    hs = [h.text.strip() for h in gaps.find_elements(By.CSS_SELECTOR, "thead th")]
    gaps.find_elements(By.CSS_SELECTOR, "thead th")[hs.index("gap s")].click()
    values = [float(r.find_elements(By.TAG_NAME, "td")[hs.index("gap s")].text)
              for r in gaps.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert values == sorted(values) and len(values) == len(m["anomalies"]["heartbeat_gaps"])
    assert _severe(browser) == []


def test_print_stylesheet_and_screenshot(browser, recording_report, tmp_path):
    m, f, index = recording_report
    _open(browser, index)
    nav = browser.find_element(By.CSS_SELECTOR, "nav.toc")
    assert nav.is_displayed()
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        assert not nav.is_displayed()  # the print stylesheet drops what only works on screen
        pdf = browser.print_page()  # prints (base64 PDF) without an error
        assert len(pdf) > 10_000
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1300, min(height + 50, 8000))
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    browser.set_window_size(1300, 1000)
    # self-contained: every reference is a file beside the page, and the images shown are loaded
    refs = browser.execute_script("return Array.prototype.map.call(document.querySelectorAll('[src],[href]'), "
                                  "function(x){return x.getAttribute('src')||x.getAttribute('href')})")
    assert refs and all(not re.match(r"[a-z]+:|//|/", r) and (r.startswith("#") or (index.parent / r).is_file())
                        for r in refs), refs
    hist = browser.find_element(By.CSS_SELECTOR, "img[src='gap_histogram.svg']")
    assert hist.is_displayed() and browser.execute_script("return arguments[0].naturalWidth", hist) > 100


def test_broker_log_and_capture_reports_render_the_same_way(browser, tmp_path):
    from engine.bindings import brokerlog as bl
    from engine.bindings import pcap

    bl.generate_broker_log(tmp_path / "logs" / "broker-a" / "broker.log", groups=3, members=4, restarts=1, seed=2)
    f = bl.scan_local([tmp_path / "logs"], log_tz="+08:00")
    index = write_report(f, tmp_path / "log-report", plots=True)
    _open(browser, index)
    assert _severe(browser) == []
    # damaged lines: the banner says the input was partly unreadable, above the summary
    banner = browser.find_element(By.ID, "banner")
    assert "PARTLY UNREADABLE" in _visible(banner) and "could not be parsed" in banner.text
    assert banner.location["y"] < browser.find_element(By.ID, "summary").location["y"]
    for title in ("Summary", "Inconsistent subscriptions", "Subscription flips", "Flapping clients",
                  "Expired clients", "Retry-topic churn", "Group sizes", "Broker logs read",
                  "What this input cannot show"):
        assert any(h.text == title for h in browser.find_elements(By.TAG_NAME, "h2") if h.is_displayed()), title
    card = browser.find_element(By.CSS_SELECTOR, "article.card[data-group='CID_G2']")
    assert "10.9.0.3@odd" in _visible(card) and "TagC" in card.text
    # the deviating member's address: its channel's remote address from the register line, not its clientId's IP
    (cells,) = [r.find_elements(By.TAG_NAME, "td") for r in card.find_elements(By.CSS_SELECTOR, "table.members tbody tr")]
    assert [x["addrs"] for x in f["member_addresses"] if x["client_id"] == "10.9.0.3@odd"] == [[cells[1].text]]
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+:\d+", cells[1].text) and "(from clientId)" not in card.text
    # the flapping client's channel closes (NETTY EVENT) drawn as closes seen in the log, its registers as connects
    (row,) = [r for r in browser.find_elements(By.CSS_SELECTOR, "#flapping-table tbody tr") if "flapper" in r.text]
    assert len(row.find_elements(By.CSS_SELECTOR, "svg path.connect")) == 5
    closes = row.find_elements(By.CSS_SELECTOR, "svg path.close")
    assert len(closes) == 4 and all("NETTY EVENT" in x.find_element(By.TAG_NAME, "title").get_attribute("textContent")
                                    for x in closes)
    browser.save_screenshot(str(tmp_path / "log-report.png"))

    data = ROOT / "tests" / "data" / "pcap"
    f = pcap.scan_local([data / "lo-eth-ipv4.pcap", data / "rotated-ipv6"])
    index = write_report(f, tmp_path / "pcap-report", plots=True)
    _open(browser, index)
    assert _severe(browser) == []
    # two captures of other times: the time between them is named (CAPTURE COVERAGE), nothing is damaged
    (banner,) = browser.find_elements(By.ID, "banner")
    assert "CAPTURE COVERAGE" in _visible(banner) and "not captured" in banner.text
    assert "DAMAGED INPUT" not in banner.text and "PARTLY UNREADABLE" not in banner.text
    for title in ("Summary", "Inconsistent subscriptions", "Group sizes", "Packet captures read"):
        assert any(h.text == title for h in browser.find_elements(By.TAG_NAME, "h2") if h.is_displayed()), title
    assert "heartbeats" in _visible(browser.find_element(By.ID, "captures"))
    browser.save_screenshot(str(tmp_path / "pcap-report.png"))

    # a capture that missed bytes of a connection: the DAMAGED INPUT banner names it
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("pcap_tool", ROOT / "scripts" / "pcap_tool.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    m = json.loads((data / "lo-eth-ipv4.json").read_text())
    port = int(m["clients"][0]["addr"].rsplit(":", 1)[1])
    tool.main(["mutate", str(data / "lo-eth-ipv4.pcap"), str(tmp_path / "lossy.pcap"), "--port", str(port),
               "--size", "100", "--drop", "10"])
    f = pcap.scan_local([tmp_path / "lossy.pcap"])
    index = write_report(f, tmp_path / "lossy-report", plots=True)
    _open(browser, index)
    assert _severe(browser) == []
    banner = _visible(browser.find_element(By.ID, "banner"))
    assert "DAMAGED INPUT" in banner and "the capture missed 100 bytes" in banner
    assert m["clients"][0]["addr"] in _visible(browser.find_element(By.ID, "captures"))


def test_a_large_fleet_caps_the_small_multiples_and_tables_the_rest(browser, tmp_path):
    """The issue's own example at its scale: `rmqhb demo`'s fleet shape (2,000 clients in 100 groups: 191 group
    series with the producer groups) and more groups with changes or findings than the report charts. The summary
    says how many are charted and how many are in the table; there are exactly min(groups changed or with findings,
    MULTIPLES) small multiples (the groups with the most findings first), and the collapsed table holds every other
    group, the ones beyond the cap first. Groups and their findings are counted here from findings.json, not with
    the report's own functions."""
    from engine.bindings.report import MULTIPLES
    from engine.recording.scan_py import CLIENT_INNER_PRODUCER

    cfg = FleetConfig(clients=2000, groups=100, days=0.03, seed=4, inconsistent=12, flapping=14, gaps=14, resizing=12)
    generate(tmp_path / "rec", cfg)
    f = scan_py.scan(tmp_path / "rec")
    index = write_report(f, tmp_path / "report", plots=False)
    series = {(g["group"], g["role"]): g for g in f["group_sizes"]}
    assert len(series) == len(f["group_sizes"]) == 191
    findings_of = {}
    for r in f["inconsistent_subscriptions"]:
        findings_of[r["group"]] = findings_of.get(r["group"], 0) + 1
    for key in ("flapping_clients", "heartbeat_gaps", "expired_clients"):
        for r in f[key]:
            for grp in r["groups"]:
                findings_of[grp] = findings_of.get(grp, 0) + 1
    first, last, expiry = f["summary"]["first_ms"], f["summary"]["last_ms"], 120_000

    def resized(g):  # its live-member count after the fleet's first expiry, up to the end of the input
        before = [n for t, n in g["series"] if t <= first + expiry]
        levels = set(before[-1:]) | {n for t, n in g["series"] if first + expiry < t <= last}
        return len(levels) > 1

    noted = {k for k, g in series.items() if resized(g) or (findings_of.get(k[0]) and k[0] != CLIENT_INNER_PRODUCER)}
    assert len(noted) > MULTIPLES  # the cap is exercised

    _open(browser, index)
    assert _severe(browser) == []
    summary = _visible(browser.find_element(By.ID, "summary"))
    assert (f"{MULTIPLES} charted (of {len(noted)} changed or with findings: at most {MULTIPLES}), "
            f"{len(series) - MULTIPLES} in the collapsed table") in summary, summary
    figures = browser.find_elements(By.CSS_SELECTOR, "#sizes figure.multiple")
    charted = [(x.get_attribute("data-group"), x.get_attribute("data-role")) for x in figures]
    assert len(charted) == len(set(charted)) == MULTIPLES and set(charted) <= noted
    assert all(x.is_displayed() for x in figures[:3])
    beyond = noted - set(charted)
    score = lambda k: findings_of.get(k[0], 0) if k[0] != CLIENT_INNER_PRODUCER else 0  # noqa: E731
    assert min(map(score, charted)) >= max(map(score, beyond))  # the most findings are charted
    para = _visible(browser.find_element(By.CSS_SELECTOR, "#sizes > p"))
    assert f"or that has findings ({len(noted)} groups)" in para and f"At most {MULTIPLES} are charted" in para
    assert f"the other {len(beyond)} head the table below" in para
    assert f"holds the other {len(series) - MULTIPLES} groups" in para
    # the rest: one collapsed table, the groups beyond the cap first (with what they have), then the steady ones
    table = browser.find_element(By.ID, "groups-table")
    assert not table.is_displayed()
    browser.find_element(By.CSS_SELECTOR, "#other-groups > summary").click()
    rows = [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
    listed = [(r[0], r[1]) for r in rows]
    assert len(listed) == len(set(listed)) == len(series) - MULTIPLES
    assert set(listed) | set(charted) == set(series) and not set(listed) & set(charted)
    assert set(listed[:len(beyond)]) == beyond and all(r[5] for r in rows[:len(beyond)])
    assert not any(r[5] for r in rows[len(beyond):])
    assert _severe(browser) == []

"""Issue 26 §2, the readers' remaining gaps, each attack scaled down: a gzip bomb costs at most a budget of
decompressed bytes per file (broker logs and captures), a capture packet stamped far from its file's time is damage,
not an event. What a budget leaves unread is named (scan.corrupt) and the other inputs are read on."""
import gzip
from pathlib import Path

from conftest import require_native

from engine.bindings import brokerlog, pcap
from engine.recording import _pcap_py as twin

require_native("engine.recording._pcap")

from test_pcap_limits import SERVER, T0, Pcap, _clients_capture, client, heartbeat, tcp  # noqa: E402
from test_pcap_parity import both  # noqa: E402

YEAR_S = 365 * 86_400


# -- capture time jumps ------------------------------------------------------------------------------------------

def test_a_packet_stamped_three_years_after_the_others_is_damage(tmp_path):
    """One packet stamped 3 years after the others (inside the sane window [2000, now + 1 day]) was read as an
    event: the capture's span grew by 3 years and its clients looked expired. It is a time jump: counted, named,
    not read; the findings are the clean capture's."""
    data = _clients_capture(stray_sec=T0 + 3 * YEAR_S)
    out = both([data])
    assert out[3]["time_jump_packets"] == 1 and out[3]["bad_time_packets"] == 0
    assert out[4][1] < (T0 + 400) * 1000
    path, clean = tmp_path / "jump.pcap", tmp_path / "clean.pcap"
    path.write_bytes(data)
    clean.write_bytes(_clients_capture())
    f, ref = pcap.scan_local([path]), pcap.scan_local([clean])
    assert f["expired_clients"] == ref["expired_clients"] == []
    assert f["capture"]["captures"][0]["last_ms"] == ref["capture"]["captures"][0]["last_ms"]
    (lim,) = f["scan"]["corrupt"]
    assert lim["kind"] == "capture_limit" and "1 packets stamped more than a day" in lim["reason"]
    # and backwards: a packet stamped 3 years before the others
    out = both([_clients_capture(stray_sec=T0 - 3 * YEAR_S)])
    assert out[3]["time_jump_packets"] == 1 and out[4][0] >= T0 * 1000


def _resumed_capture(gap_s: int, n: int = 6):
    """One client's heartbeats: n at T0 (one a second), then n more ``gap_s`` later (a clock step, a silence)."""
    p = Pcap()
    c = client(1)
    hb = heartbeat("r@1")
    p.packet(tcp(*c, *SERVER, 100, 0x02), us=T0 * 1_000_000)
    seq = 101
    for k in range(2 * n):
        t = T0 + k + (gap_s if k >= n else 0)
        p.packet(tcp(*c, *SERVER, seq, 0x18, hb), us=t * 1_000_000)
        seq += len(hb)
    return p.bytes()


def test_a_stream_at_a_new_time_is_read_after_time_jump_agree_packets():
    """A capture that really goes on at a new time (a clock step, a broker port silent for more than a day) is read
    on: TIME_JUMP_AGREE consecutive packets agreeing on the new time make it the file's time; only the ones before
    the agreeing one are damage. A capture without a jump never trips the rule."""
    out = both([_resumed_capture(2 * 86_400)])
    assert out[3]["time_jump_packets"] == twin.TIME_JUMP_AGREE - 1
    assert out[3]["heartbeats"] == 12 - (twin.TIME_JUMP_AGREE - 1)
    assert out[4][1] >= (T0 + 2 * 86_400) * 1000
    assert both([_resumed_capture(3600)])[3]["time_jump_packets"] == 0
    # scaled option: a jump of 10 s with max_time_jump_ms 5 s
    assert both([_resumed_capture(10)], max_time_jump_ms=5000)[3]["time_jump_packets"] == twin.TIME_JUMP_AGREE - 1


def test_committed_captures_have_no_time_jump():
    data_dir = Path(__file__).parent / "data"
    files = sorted(p for p in data_dir.rglob("*") if p.is_file() and p.suffix in (".pcap", ".pcapng", ".gz")
                   and pcap.is_capture_file(p))
    assert files
    for path in files:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        out = both([raw])
        assert out[0] == "error" or out[3]["time_jump_packets"] == 0, path

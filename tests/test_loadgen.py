"""The load generator's answer check (bench/loadgen.py): a read of answers is checked with one comparison when it
holds only SUCCESS answers to the expected opaques; anything else must still be counted exactly, frame by frame."""
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

import engine
from engine.codec.enums import RequestCode, ResponseCode

from engine import loadgen


class Sink:
    def __init__(self):
        self.written = []
        self.closing = False

    def write(self, data):
        self.written.append(data)

    def is_closing(self):
        return self.closing


def answer(seq, code=ResponseCode.SUCCESS, ext=None):
    req = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=loadgen.OPAQUE_BASE + seq)
    return req.response(code, ext_fields={"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"}
                        if ext is None else ext).encode()


def notify():
    return engine.RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=5, flag=2,
                                  ext_fields={"consumerGroup": "g"}).encode()


async def _conn(sent):
    client = loadgen.SimClient(1, producers=["PID_x"])
    stats, lat = loadgen._new_stats(), []
    conn = loadgen.LoadConn(loadgen.FrameTemplate(client.heartbeat_frame(loadgen.OPAQUE_BASE)), stats, lat)
    conn.connection_made(Sink())
    conn.send(0.0, count=sent)
    return conn, stats, lat


def test_a_burst_is_one_write_of_frames_with_consecutive_opaques():
    async def main():
        conn, stats, _ = await _conn(8)
        frames = engine.FrameDecoder().feed(conn.transport.written[0])
        assert [f.opaque for f in frames] == [loadgen.OPAQUE_BASE + i for i in range(8)]
        assert all(f.code == RequestCode.HEART_BEAT for f in frames) and stats["sent"] == 8
        # a connection the server has closed (a broker past its connection budget closes at accept) sends nothing
        conn.transport.closing = True
        conn.send(0.0)
        assert len(conn.transport.written) == 1 and stats["sent"] == 8

    asyncio.run(main())


@pytest.mark.parametrize("split", [None, 3, 57])
def test_answers_are_counted_exactly_whichever_path_checks_them(split, monkeypatch):
    parsed = []
    real_parse = loadgen.LoadConn._parse
    monkeypatch.setattr(loadgen.LoadConn, "_parse", lambda self, data, now: (parsed.append(data),
                                                                           real_parse(self, data, now))[1])

    async def main():
        conn, stats, lat = await _conn(40)
        reads = [answer(0),  # parsed: learns the answer's shape
                 b"".join(answer(i) for i in range(1, 9)),  # the one-comparison path
                 b"".join(answer(i) for i in (9, 10, 99, 12)),  # a wrong opaque among them
                 b"".join([answer(13), answer(14, ResponseCode.SYSTEM_BUSY, ext={}), answer(15)]),
                 b"".join([answer(16), notify(), answer(17)]),
                 b"".join(answer(i) for i in range(18, 40))]
        for data in reads:
            if split is None:
                conn.data_received(data)
            else:  # arbitrary read boundaries: partial frames wait in the buffer
                for k in range(0, len(data), split):
                    conn.data_received(data[k:k + split])
        assert conn.answer is not None
        assert stats["answered"] == 40 and len(lat) == 40 and not conn.pending
        assert stats["opaque_mismatch"] == 1
        assert stats["errors"] == 1 and stats["ok"] == 39
        assert stats["notifies"] == 1
        assert conn.buf == b""
        if split is None:  # the reads of SUCCESS answers only, after the first, took the one-comparison path
            assert len(parsed) == 4


    asyncio.run(main())


# ---------------------------------------------------------------------------------------------------------------
# --vary: the bytes a Java client sends over time


def test_variants_are_the_same_registration_in_other_set_orders():
    client = loadgen.SimClient(3, producers=["PID_a", "PID_b"],
                               consumers=[("CID_x", engine.MessageModel.CLUSTERING, [("T1", "TagA || TagB"),
                                                                                      ("T2", "*")])])
    frames = client.heartbeat_variants(loadgen.OPAQUE_BASE)
    assert len(frames) == len(set(frames)) == 8
    decoded = [engine.decode_heartbeat(engine.decode_frame(f).body) for f in frames]

    def as_sets(hb):
        return (hb.client_id, frozenset(p.group for p in hb.producers),
                frozenset((c.group, frozenset((s.topic, s.sub_string, frozenset(s.tags), frozenset(s.codes),
                                               s.sub_version) for s in c.subscriptions)) for c in hb.consumers))

    assert len({as_sets(hb) for hb in decoded}) == 1   # one registration
    assert decoded[0] == client.prepare_heartbeat_data()  # the client's usual order first


def test_vary_and_subversion_every_rewrite_what_is_sent():
    client = loadgen.SimClient(4, consumers=[("CID_y", engine.MessageModel.CLUSTERING, [("T", "TagA || TagB")])])
    templates, variants = loadgen._templates([client], True, 3)

    async def main():
        stats, lat = loadgen._new_stats(), []
        conn = loadgen.LoadConn(templates[0], stats, lat, variants=variants[0], sub_every=3)
        conn.connection_made(Sink())
        conn.send(0.0, count=7)
        return engine.FrameDecoder().feed(conn.transport.written[0])

    frames = asyncio.run(main())
    assert [f.opaque for f in frames] == [loadgen.OPAQUE_BASE + i for i in range(7)]
    bodies = [f.body for f in frames]
    assert len(set(bodies[:len(variants[0])])) == min(7, len(variants[0]))  # the orders in turn
    versions = [{s.sub_version for c in engine.decode_heartbeat(b).consumers for s in c.subscriptions}
                for b in bodies]
    assert all(len(v) == 1 for v in versions)
    base = client.sub_version
    assert [v.pop() - base for v in versions] == [0, 0, 0, 1, 1, 1, 2]   # every 3rd heartbeat a newer one


# ---------------------------------------------------------------------------------------------------------------
# `rmqhb loadgen` against a live broker


@pytest.fixture
def live_broker(tmp_path):
    from engine.broker.controller import Broker
    from engine.broker.config import BrokerConfig

    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                            fast_port_enable=False)).start()
    yield b
    b.stop()


def _run_cli(args, cwd):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "engine", "loadgen", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_rmqhb_loadgen_steady_varied_bytes(live_broker, tmp_path):
    """Open loop with the Java client's varying bytes and subVersion changes: every heartbeat answered SUCCESS,
    reordered sets change nothing (no NOTIFY after the registration round), the JSON result, its per-second
    timeline, the progress line and the SVG plot; the clients are registered and unregister at the end."""
    port = live_broker.ports["main"]
    out, svg = tmp_path / "res.json", tmp_path / "lat.svg"
    proc = _run_cli(["steady", "--broker", f"127.0.0.1:{port}", "--clients", "40", "--groups", "4", "--rate", "400",
                     "--duration", "3", "--vary", "--subversion-every", "4", "--out", str(out), "--plot", str(svg),
                     "--server-pid", str(os.getpid())],  # the broker runs in this process
                    tmp_path)
    res = json.loads(out.read_text())
    assert res == json.loads(proc.stdout)
    assert res["connections"] == 40 and res["errors"] == 0 and res["opaque_mismatch"] == 0
    assert res["answered"] >= 1000 and res["unanswered_after_drain"] == 0
    assert res["vary"] == {"set_orders": True, "subversion_every": 4}
    assert res["target"] == f"127.0.0.1:{port}"
    assert len(res["timeline"]) >= 2 and all(r["answered"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in res["timeline"])
    assert "loadgen steady" in proc.stderr and "answered" in proc.stderr
    text = svg.read_text()
    assert text.startswith("<svg") and "<polyline" in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert res["unregistered_connections"] == 40
    # reordered sets and newer subVersions are no membership change: the consumer groups were notified during
    # registration only, so the window saw no NOTIFY at all
    assert res["notifies"] == 0
    # the broker's CPU in the window, and the kernel's share of it
    assert res["server_cpu_s"] > 0 and 0 <= res["server_sys_s"] <= res["server_cpu_s"]
    assert 0 <= res["server_sys_us_per_hb"] <= res["server_us_per_hb"]


def test_process_cpu_split_matches_the_process_times():
    t = os.times()
    user, system = loadgen.proc_cpu_split_s(os.getpid())
    assert abs(user - t.user) < 0.05 and abs(system - t.system) < 0.05
    assert abs(loadgen.proc_cpu_s(os.getpid()) - (user + system)) < 0.05
    assert loadgen.proc_cpu_split_s(2 ** 22 + 1) is None  # beyond pid_max: no such process


def test_rmqhb_loadgen_storm(live_broker, tmp_path):
    port = live_broker.ports["main"]
    proc = _run_cli(["storm", "--broker", f"127.0.0.1:{port}", "--clients", "60", "--quiet"], tmp_path)
    res = json.loads(proc.stdout)
    assert res["registered"] == 60 and res["errors"] == 0 and res["unanswered"] == 0
    assert proc.stderr == ""


def test_rmqhb_loadgen_rejects_a_bad_broker_address(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "engine", "loadgen", "steady", "--broker", "nohost"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr


def test_output_files_are_never_written_through_a_symbolic_link(tmp_path):
    """write_output (--out, --plot of both load generators): a new file 0644, an existing one replaced; a symbolic
    link (planted after the check before the run) is refused and its target untouched; a FIFO is refused at once
    (no hang), so is a directory."""
    path = tmp_path / "res.json"
    loadgen.write_output(str(path), "first")
    loadgen.write_output(str(path), "second")
    assert path.read_text() == "second" and path.stat().st_mode & 0o777 == 0o644 & ~_umask()
    target = tmp_path / "precious"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert "is a symbolic link" in loadgen.check_output(str(link))
    with pytest.raises(loadgen.OutputError, match="is a symbolic link"):
        loadgen.write_output(str(link), "overwritten")
    assert target.read_text() == "keep"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        assert loadgen.check_output(str(path)) == f"{path} exists and is not a regular file"
        with pytest.raises(loadgen.OutputError):
            loadgen.write_output(str(path), "x")
    assert loadgen.check_output(str(tmp_path / "new.svg")) is None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_rmqhb_loadgen_refuses_an_output_link_before_the_run(tmp_path, option):
    """--out / --plot a symbolic link: one line, exit status 2, before any connection; the target untouched."""
    import subprocess

    target = tmp_path / "precious"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    proc = subprocess.run([sys.executable, "-m", "engine", "loadgen", "steady", "--broker", "127.0.0.1:1", option,
                           str(link)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"rmqhb loadgen: {link} is a symbolic link; give the file itself (an output "
                                        "file is never written through a link)"]
    assert target.read_text() == "keep"


@pytest.mark.parametrize("protocol", ["remoting", "grpc"])
@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_rmqhb_loadgen_refuses_an_output_in_a_missing_directory_before_the_run(tmp_path, option, protocol):
    """--out / --plot in a directory that does not exist: one line, exit status 2, before any connection (the
    broker address here has nothing listening: a check after the run, or after the probe, would exit 1)."""
    import subprocess

    path = tmp_path / "nodir" / "res.json"
    proc = subprocess.run([sys.executable, "-m", "engine", "loadgen", "steady", "--protocol", protocol, "--broker",
                           "127.0.0.1:1", option, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [f"rmqhb loadgen: cannot write {path}: no such directory {path.parent}"]
    assert not path.parent.exists()
    # a file where the directory should be
    (tmp_path / "file").write_text("x")
    assert loadgen.check_output(str(tmp_path / "file" / "res.json")).startswith(f"cannot write {tmp_path}/file/")
    assert loadgen.check_output(str(tmp_path / "res.json")) is None
    assert loadgen.check_output("res.json") is None or not os.access(".", os.W_OK)


@pytest.mark.parametrize("res, title", [
    ({"scenario": "storm", "protocol": "grpc", "clients": 300, "connections": 38},
     "rmqhb loadgen storm against h:1: 300 clients on 38 connections"),
    ({"scenario": "steady", "protocol": "grpc", "sessions": 24, "connections": 3},
     "rmqhb loadgen steady against h:1: 24 clients on 3 connections"),
    ({"scenario": "steady", "connections": 40}, "rmqhb loadgen steady against h:1: 40 clients"),
    ({"scenario": "storm", "clients": 60}, "rmqhb loadgen storm against h:1: 60 clients"),
    ({"scenario": "storm", "protocol": "grpc", "clients": 0, "connections": 0},
     "rmqhb loadgen storm against h:1: 0 clients on 0 connections")])
def test_plot_title_counts_the_clients_of_each_protocols_result(res, title):
    """The SVG's title gives the clients (a gRPC result's sessions or clients, not its connections, which carry
    several sessions each)."""
    svg = loadgen.plot_svg({**res, "target": "h:1", "timeline": []})
    assert f'font-size="14">{title}</text>' in svg


@pytest.mark.parametrize("option, value", [("--rate", "inf"), ("--rate", "nan"), ("--rate=-inf", None),
                                           ("--duration", "inf"), ("--duration", "nan")])
def test_rmqhb_loadgen_refuses_a_rate_or_duration_that_is_not_finite(option, value):
    """--rate inf would make every tick's backlog endless, --duration inf a run without end: one line, exit 2,
    before any connection (nothing listens at the address given)."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "engine", "loadgen", "steady", "--broker", "127.0.0.1:1", option]
                          + ([value] if value else []), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("rmqhb loadgen: error: --duration and --rate take finite numbers (not "
                                            "inf or nan)")


def test_an_offered_rate_beyond_the_process_ends_within_its_duration(live_broker, tmp_path):
    """--rate 1e9 on 2 connections: every 1 ms tick is due a million heartbeats more than it can send. Each tick
    sends for at most TICK_SEND_BUDGET_S, so the clock is checked and the run ends after its duration (plus the
    warm-up, the drain); what was offered and not sent is counted, not queued in memory. Before, the first tick's
    backlog was sent in one go and every later tick's was larger: the run never ended."""
    import resource
    import subprocess
    import threading

    port = live_broker.ports["main"]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "loadgen", "steady", "--broker", f"127.0.0.1:{port}",
                             "--clients", "2", "--groups", "2", "--rate", "1e9", "--duration", "1", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # before, it grew without end: stopped at 2 GiB (MemoryError) so as not to take the machine
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)))
    killer = threading.Timer(60, proc.kill)  # before: it never ends
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak memory
    finally:
        killer.cancel()
    seconds = time.monotonic() - t0
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close(), proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    res = json.loads(stdout)
    assert seconds < 30, seconds  # registration, 2 s warm-up, 1 s window, the drain of what was sent
    assert 0.9 <= res["seconds"] < 1.5
    assert res["sent"] > 0 and res["answered"] > 0 and res["errors"] == 0
    assert res["offered_not_sent"] > 0.9 * 1e9 * res["seconds"] - res["sent"]
    # the memory it took stays small (the write buffers are bounded: MAX_WRITE_BUFFER per connection)
    assert usage.ru_maxrss < 1 << 19  # KiB: under 512 MiB


def test_an_open_loop_skips_a_connection_the_broker_does_not_read(monkeypatch):
    """A broker that answers the registration and then stops reading: the open loop's writes pile up in the
    connections' write buffers; past MAX_WRITE_BUFFER (256 KiB here) a connection is skipped and its due heartbeats
    counted in offered_not_sent instead of queued in memory without end."""
    monkeypatch.setattr(loadgen, "MAX_WRITE_BUFFER", 256 << 10)
    monkeypatch.setattr(loadgen, "WARMUP_LIMIT_S", 0.3)  # the answers never catch up here
    monkeypatch.setattr(loadgen, "DRAIN_GRACE_S", 0.3)
    conns, buffered = [], []
    real_connect_all = loadgen._connect_all

    async def connect_all(*args, **kw):
        conns.extend(await real_connect_all(*args, **kw))
        return conns

    monkeypatch.setattr(loadgen, "_connect_all", connect_all)

    class Deaf(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.data = transport, b""

        def data_received(self, data):
            self.data += data
            frame = engine.FrameDecoder().feed(self.data)
            if frame:  # the registration heartbeat: answered, then nothing is read any more
                self.transport.write(answer(frame[0].opaque - loadgen.OPAQUE_BASE))
                self.transport.pause_reading()

    async def main():
        server = await asyncio.get_running_loop().create_server(Deaf, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def watch():
            while True:
                buffered.extend(c.transport.get_write_buffer_size() for c in conns if not c.transport.is_closing())
                await asyncio.sleep(0.01)

        watcher = asyncio.get_running_loop().create_task(watch())
        res = await loadgen.steady("127.0.0.1", port, 2, 0, 0.5, 400_000, 1, 0.0, warmup=0.1)
        watcher.cancel()
        server.close()
        return res

    res = asyncio.run(main())
    frame_size = max(len(c.template.build(0)) for c in conns)
    assert res["offered_not_sent"] > 0 and res["answered"] == 0
    # the write that crossed the budget, and the UNREGISTER_CLIENT sent at the end whatever the buffer holds
    assert buffered and max(buffered) <= (256 << 10) + 2 * frame_size
    assert res["unanswered_after_drain"] > 0 and res["unregistered_connections"] == 0

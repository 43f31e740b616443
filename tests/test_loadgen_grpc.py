"""`rmqhb loadgen --protocol grpc` (engine.loadgen_grpc): simulated RocketMQ 5.x SDK sessions against this broker's
gRPC port on both transports (grpcio and native): the sessions register and are listed, their Heartbeats,
QueryRoute, QueryAssignment and NotifyClientTermination calls are what the broker saw, the repeat path takes the
repeats and not the --vary bytes; its HTTP/2 client honours a server's SETTINGS and flow control; the errors a user
meets are one line and an exit status; Ctrl-C gives a partial result; bench/bench_grpc.py runs on it."""
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import free_port, require_module

require_module("grpc")
require_module("rocketmq.grpc_protocol")

from engine import loadgen_grpc as LG  # noqa: E402
from engine.broker.admin import AdminClient, AdminError  # noqa: E402
from engine.broker.controller import Broker  # noqa: E402
from engine.http2 import HpackDecoder, HpackEncoder  # noqa: E402
from engine.http2 import frames as F  # noqa: E402
from engine.registry.topic_config_manager import TopicConfig  # noqa: E402
from test_cli_errors import _closed_port, _interrupt_when, one_line, rmqhb  # noqa: E402
from test_server import make_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]



def start_broker(tmp_path, transport, **kw):
    b = Broker(make_config(tmp_path, grpc_server_port=free_port(), grpc_transport=transport,
                           fast_port_enable=False, **kw)).start()
    for k in range(7):
        b.call(b.registry.update_topic_config, TopicConfig(f"TopicLoad{k}", 4, 4))
    return b


@pytest.fixture(params=["grpcio", "native"])
def gbroker(request, tmp_path):
    b = start_broker(tmp_path, request.param)
    yield b
    b.stop()


def loadgen(*args, timeout=120):
    p = rmqhb("loadgen", *args, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return p


def wait_until(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
    return value


def consumers(b, group):
    try:
        with AdminClient("127.0.0.1", b.ports["main"]) as c:
            return c.consumer_connection(group)
    except AdminError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# against the broker, both transports


def test_sessions_register_and_every_call_is_what_the_broker_saw(gbroker, tmp_path):
    """24 sessions, 8 per HTTP/2 connection, closed loop: the broker holds 24 sessions while the run goes (its
    consumer groups list the 5.x consumers with their SDK languages), every Heartbeat, Settings, QueryRoute,
    QueryAssignment and NotifyClientTermination the result counts was received by the broker (on_request sees each
    request) with its own client id and request id, all answered OK; afterwards no session is left."""
    b = gbroker
    seen = []
    b.grpc.on_request = lambda method, metadata, request: seen.append((method, dict(metadata)))
    out, svg = tmp_path / "res.json", tmp_path / "plot.svg"
    cmd = [sys.executable, "-m", "engine", "loadgen", "steady", "--protocol", "grpc",
           "--broker", f"127.0.0.1:{b.ports['grpc']}", "--clients", "24", "--sessions-per-connection", "8",
           "--groups", "4", "--duration", "2", "--assignment-interval", "0.5", "--route-interval", "1",
           "--server-pid", str(os.getpid()), "--out", str(out), "--plot", str(svg)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(b.grpc.sessions) == 24)
        group = wait_until(lambda: consumers(b, "GID_load_0"))
        langs = {c["language"] for c in group["connectionSet"]}
        assert len(group["connectionSet"]) >= 2 and langs <= {"JAVA", "GO", "PYTHON", "CPP", "DOTNET"}
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "loadgen grpc steady" in stderr
    res = json.loads(out.read_text())
    assert res == json.loads(stdout)
    assert (res["protocol"], res["sessions"], res["connections"], res["sessions_per_connection"]) == ("grpc", 24, 3, 8)
    assert res["errors"] == 0 and res["errors_by_status"] == {} and res["goaways"] == res["connections_lost"] == 0
    assert res["answered"] == res["sent"] > 100 and res["unanswered_after_drain"] == 0
    assert res["terminated_sessions"] == 24 and res["p99_ms"] >= res["p50_ms"] > 0
    assert res["server_cpu_s"] > 0 and res["server_us_per_hb"] > 0 and len(res["timeline"]) >= 1
    assert svg.read_text().startswith("<svg") and "24 clients" in svg.read_text()
    wait_until(lambda: len(b.grpc.sessions) == 0)
    # the broker saw exactly the calls the result counts, each answered OK
    by_method = Counter(m for m, _ in seen)
    calls = res["calls"]
    by_method["QueryRoute"] -= 4  # the probe's before the run: the route of each of the fleet's 4 topics
    for method in ("Heartbeat", "QueryRoute", "QueryAssignment", "NotifyClientTermination"):
        assert calls[method]["sent"] == calls[method]["ok"] == by_method[method], (method, calls, by_method)
    assert calls["Telemetry"]["sent"] == calls["Telemetry"]["ok"] == by_method["Telemetry"] == 24
    assert calls["QueryAssignment"]["sent"] > 0 and calls["QueryRoute"]["sent"] > 24  # periodic ones beside the first
    assert calls["NotifyClientTermination"]["sent"] == 24
    # the SDKs' metadata: 24 client ids, a fresh request id per call, the date
    ids = {md["x-mq-client-id"] for _, md in seen}
    assert len(ids) == 24 + 4 and sum(i.endswith("@probe") for i in ids) == 4
    assert len({md["x-mq-request-id"] for m, md in seen if m != "Telemetry"}) == \
        sum(1 for m, _ in seen if m != "Telemetry")
    assert all(md["x-mq-protocol"] == "v2" and len(md["x-mq-date-time"]) == 16 for _, md in seen)
    assert b.grpc.bad_requests == 0 and b.grpc.internal_errors == 0


def test_repeats_take_the_repeat_path_and_varied_bytes_do_not(gbroker):
    """Open loop at a fixed rate: without --vary a session's later Heartbeats are the bytes of its first and the
    broker answers most from its repeat path; with --vary (two field orders in turn) none is a repeat, and every
    one is answered OK all the same. Then a storm: every session registered."""
    b = gbroker
    port = b.ports["grpc"]
    base = ["steady", "--protocol", "grpc", "--broker", f"127.0.0.1:{port}", "--clients", "16", "--rate", "400",
            "--duration", "1.5", "--quiet"]
    repeats0 = b.grpc.heartbeat_repeats
    res = json.loads(loadgen(*base).stdout)
    plain = b.grpc.heartbeat_repeats - repeats0
    assert res["errors"] == 0 and res["offered_rate"] == 400
    assert 400 <= res["answered"] <= 800 and "tick_late_p99_ms" in res
    assert plain >= 0.5 * res["calls"]["Heartbeat"]["sent"]
    repeats0 = b.grpc.heartbeat_repeats
    res = json.loads(loadgen(*base, "--vary").stdout)
    assert res["errors"] == 0 and res["vary"] == {"field_orders": True} and res["answered"] >= 400
    assert res["calls"]["Heartbeat"]["ok"] == res["calls"]["Heartbeat"]["sent"]
    assert b.grpc.heartbeat_repeats == repeats0
    p = loadgen("storm", "--protocol", "grpc", "--broker", f"127.0.0.1:{port}", "--clients", "40", "--quiet")
    res = json.loads(p.stdout)
    assert p.returncode == 0 and p.stderr == ""
    assert (res["registered"], res["unanswered"], res["errors"], res["connections"]) == (40, 0, 0, 5)
    wait_until(lambda: len(b.grpc.sessions) == 0)


def test_core_frames_send_calls_as_grpc_core_does(tmp_path, monkeypatch):
    """--core-frames: each unary call's new stream gets a WINDOW_UPDATE between its HEADERS and DATA, and a read
    that ended calls is followed by a flow-control PING (one in flight per connection), as the Python 5.x SDK's
    grpc C-core sends them; the native broker still answers the calls on its prepared path."""
    from engine.http2 import _frames_py
    from engine.http2 import server as H

    # what the clients wrote, read again from each read the broker got (the frame loop is compiled: it is watched
    # from outside): per unary call, the WINDOW_UPDATEs of its stream between its HEADERS and DATA; the PINGs
    pings, updated, handled = [], [], []
    readers = {}
    received, start = H.H2Connection.data_received, H.H2Connection._start

    def watching(self, data):
        reader, seen = readers.get(id(self)), data
        if reader is None:  # the connection's first read: the preface, then frames
            reader = readers[id(self)] = _frames_py.FrameReader(1 << 24)
            seen = data[len(H.F.PREFACE):]
        frames = reader.feed(seen)
        for i, (ftype, flags, sid, payload) in enumerate(frames):
            if ftype == H.F.PING and not flags & H.F.FLAG_ACK:
                pings.append(payload)
            elif ftype == H.F.HEADERS and not flags & H.F.FLAG_END_STREAM:
                rest = frames[i + 1:]
                n = next((k for k, f in enumerate(rest) if f[2] == sid and f[0] == H.F.DATA), None)
                # a unary call (its DATA ends the stream) whole in this read: a Telemetry stream's or a call split
                # over reads are not counted
                if n is not None and rest[n][1] & H.F.FLAG_END_STREAM:
                    updated.append(sum(1 for f in rest[:n] if f[0] == H.F.WINDOW_UPDATE and f[2] == sid))
        return received(self, data)

    def counting_start(self, call, request):
        handled.append(call.method.path.rsplit(b"/", 1)[1])
        return start(self, call, request)
    monkeypatch.setattr(H.H2Connection, "data_received", watching)
    monkeypatch.setattr(H.H2Connection, "_start", counting_start)
    b = start_broker(tmp_path, "native")
    try:
        repeats = b.grpc.heartbeat_repeats
        res = json.loads(loadgen("steady", "--protocol", "grpc", "--broker", f"127.0.0.1:{b.ports['grpc']}",
                                 "--clients", "8", "--sessions-per-connection", "1", "--rate", "80", "--duration",
                                 "1.5", "--core-frames", "--quiet").stdout)
        assert res["errors"] == 0 and res["core_frames"] is True and res["answered"] >= 80
        assert b.grpc.heartbeat_repeats - repeats >= res["answered"] // 2
        # the prepared path answered them: a Heartbeat handler ran only for each session's first (8), the route
        # and assignment handlers only before their answers were kept
        assert handled.count(b"Heartbeat") <= 8 and len(handled) < res["answered"] // 4
        # every call of the run: HEADERS, its stream's WINDOW_UPDATE, DATA (the probe before it sends plain calls)
        assert updated.count(1) >= res["answered"] and updated.count(0) <= 7 and set(updated) == {0, 1}
        assert pings.count(b"rmqhbbdp") >= res["answered"] // 2
    finally:
        b.stop()


def test_inflight_takes_the_sessions_in_turn_over_all_connections(tmp_path):
    """--inflight 3 over 16 sessions on 8 connections: every session heartbeats (not only those of 3
    connections), and a two-process storm registers all."""
    b = start_broker(tmp_path, "native")
    try:
        beats = Counter()
        b.grpc.on_request = lambda method, md, request: beats.update(
            [dict(md)["x-mq-client-id"]] if method == "Heartbeat" else [])
        where = f"127.0.0.1:{b.ports['grpc']}"
        p = loadgen("steady", "--protocol", "grpc", "--broker", where, "--clients", "16", "--sessions-per-connection",
                    "2", "--inflight", "3", "--duration", "1", "--quiet")
        res = json.loads(p.stdout)
        assert p.returncode == 0 and res["errors"] == 0 and res["inflight"] == 3 and res["connections"] == 8
        assert len(beats) == 16 and min(beats.values()) >= res["calls"]["Heartbeat"]["sent"] // 16 - 1
        p = loadgen("storm", "--protocol", "grpc", "--broker", where, "--clients", "40", "--procs", "2", "--quiet")
        res = json.loads(p.stdout)
        assert (res["procs"], res["registered"], res["connections"], res["errors"]) == (2, 40, 6, 0)
        assert res["calls"]["Telemetry"] == {"sent": 40, "ok": 40}
    finally:
        b.stop()


def test_a_broker_that_stops_during_the_run(gbroker):
    """The broker stops (GOAWAY to every connection): the run ends early with its result and one line, status 1."""
    b = gbroker
    cmd = [sys.executable, "-m", "engine", "loadgen", "steady", "--protocol", "grpc",
           "--broker", f"127.0.0.1:{b.ports['grpc']}", "--clients", "16", "--duration", "60", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(b.grpc.sessions) == 16)
        time.sleep(3)  # past the warm-up: the window is open
        t0 = time.monotonic()
        b.stop()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and time.monotonic() - t0 < 20, stderr
    assert "Traceback" not in stderr
    res = json.loads(stdout)
    assert res["answered"] > 0 and res["goaways"] + res["connections_lost"] == res["connections"] == 2
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"rmqhb loadgen: 127.0.0.1:{b.ports['grpc']} ended 2 of 2 connections during the run")


def test_tls(tmp_path):
    """--tls against a TLS port (native transport): sessions register and heartbeat; the same port in plaintext, and
    --tls against a plaintext port, are refused in one line."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    b = start_broker(tmp_path, "native", grpc_tls_cert_path=str(cert), grpc_tls_key_path=str(key))
    try:
        where = f"127.0.0.1:{b.ports['grpc']}"
        p = loadgen("steady", "--protocol", "grpc", "--broker", where, "--tls", "--clients", "8", "--duration", "1",
                    "--quiet")
        res = json.loads(p.stdout)
        assert p.returncode == 0 and res["tls"] is True and res["sessions"] == 8 and res["errors"] == 0
        assert res["answered"] > 0
        p = loadgen("steady", "--protocol", "grpc", "--broker", where, "--clients", "8", "--duration", "1")
        assert p.returncode == 1 and p.stdout == ""
        assert one_line(p).startswith(f"rmqhb loadgen: {where} closed the connection before any HTTP/2 frame")
    finally:
        b.stop()
    b = start_broker(tmp_path / "plain", "native")
    try:
        where = f"127.0.0.1:{b.ports['grpc']}"
        p = loadgen("steady", "--protocol", "grpc", "--broker", where, "--tls", "--clients", "8", "--duration", "1")
        assert p.returncode == 1
        assert one_line(p).startswith(f"rmqhb loadgen: {where} TLS handshake failed")
    finally:
        b.stop()


def test_acl_signed_calls(tmp_path):
    """aclEnable: with --access-key (its secret from $RMQHB_SECRET_KEY) every call is signed as the SDKs sign and
    the fleet registers; without it the probe says the endpoint refused; a secret on the command line is refused."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: loadgen\n    secretKey: loadgen-secret-1\n    admin: false\n"
                   "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: SUB\n")
    b = start_broker(tmp_path, "native", acl_enable=True, acl_file=str(acl))
    try:
        where = f"127.0.0.1:{b.ports['grpc']}"
        args = ["steady", "--protocol", "grpc", "--broker", where, "--clients", "8", "--duration", "1", "--quiet"]
        p = rmqhb("loadgen", *args, "--access-key", "loadgen", env={"RMQHB_SECRET_KEY": "loadgen-secret-1"})
        res = json.loads(p.stdout)
        assert p.returncode == 0 and res["sessions"] == 8 and res["errors"] == 0 and res["answered"] > 0
        assert res["errors_by_status"] == {} and b.grpc.acl_denied == 0
        p = rmqhb("loadgen", *args)
        assert p.returncode == 1 and p.stdout == ""
        assert one_line(p) == f"rmqhb loadgen: {where} answered QueryRoute of TopicLoad0: code UNAUTHORIZED (an ACL: " \
            "sign the calls with --access-key)"
        p = rmqhb("loadgen", *args, "--access-key", "loadgen", "--secret-key", "loadgen-secret-1")
        assert p.returncode == 2 and "--secret-key is not accepted" in p.stderr and "Traceback" not in p.stderr
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------------------------------
# errors a user meets: one line, exit status 1 (2 for the command line), before any work


def _serve_once(answer: bytes):
    """A TCP server that answers every connection with ``answer`` once it has read something, then closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def run():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                    conn.sendall(answer)
                    time.sleep(0.2)
                except OSError:
                    pass

    threading.Thread(target=run, daemon=True).start()
    return srv


def test_errors_are_one_line_before_the_run(tmp_path):
    b = start_broker(tmp_path, "native")
    servers = []
    try:
        p = rmqhb("loadgen", "steady", "--protocol", "grpc")
        assert p.returncode == 2 and "--broker" in p.stderr and "Traceback" not in p.stderr
        p = rmqhb("loadgen", "steady", "--protocol", "grpc", "--broker", "127.0.0.1:1", "--sessions-per-connection",
                  "0")
        assert p.returncode == 2 and "--sessions-per-connection" in p.stderr
        cases = []
        port = _closed_port()
        cases.append((f"127.0.0.1:{port}", [], f"cannot connect to 127.0.0.1:{port}: "))
        cases.append((f"127.0.0.1:{b.ports['main']}", [],  # the remoting port
                      f"127.0.0.1:{b.ports['main']} closed the connection before any HTTP/2 frame: no gRPC (HTTP/2) "
                      "port, or it refused the connection (a remoting port? use --protocol remoting; a TLS port? "
                      "add --tls)"))
        cases.append((f"127.0.0.1:{b.ports['grpc']}", ["--topic-prefix", "Missing", "--topics", "2"],
                      f"127.0.0.1:{b.ports['grpc']} has no topic Missing0, Missing1: "))
        http1 = _serve_once(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        goaway = _serve_once(F.settings(((F.SETTINGS_MAX_CONCURRENT_STREAMS, 100),))
                             + F.goaway(0, F.ENHANCE_YOUR_CALM, b"too many connections\x1b[31m"))
        servers += [http1, goaway]
        where = f"127.0.0.1:{http1.getsockname()[1]}"
        cases.append((where, [], f"{where} answered HTTP/1.x, not HTTP/2: no gRPC port"))
        where = f"127.0.0.1:{goaway.getsockname()[1]}"
        cases.append((where, [], f"{where} answered GOAWAY ENHANCE_YOUR_CALM (too many connections\\x1b[31m)"))
        for broker, extra, expected in cases:
            p = rmqhb("loadgen", "steady", "--protocol", "grpc", "--broker", broker, "--duration", "30", *extra)
            line = one_line(p)
            assert p.returncode == 1 and p.stdout == "" and p.seconds < 15, (broker, p.stderr)
            assert line.startswith(f"rmqhb loadgen: {expected}"), line
        assert b.grpc.sessions == {}
    finally:
        for s in servers:
            s.close()
        b.stop()


def test_ctrl_c_prints_the_partial_result(tmp_path):
    b = start_broker(tmp_path, "native")
    try:
        def answering(err):
            return any(ln.startswith("loadgen grpc steady") and " answered 0 " not in ln for ln in err)

        p, stdout, stderr, seconds = _interrupt_when(
            [sys.executable, "-m", "engine", "loadgen", "steady", "--protocol", "grpc", "--broker",
             f"127.0.0.1:{b.ports['grpc']}", "--clients", "16", "--rate", "200", "--duration", "60"], answering)
        assert p.returncode == 130 and seconds < 5, stderr
        assert "Traceback" not in stderr
        assert stderr.strip().splitlines()[-1].startswith("rmqhb loadgen: interrupted after ")
        res = json.loads(stdout)
        assert res["interrupted"] is True and res["protocol"] == "grpc" and res["answered"] > 0
        assert res["sessions"] == 16 and res["target"] == f"127.0.0.1:{b.ports['grpc']}"
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------------------------------
# the HTTP/2 client against a strict little server: SETTINGS, flow control, PING


class StrictServer(asyncio.Protocol):
    """Announces 2 concurrent streams and 16-byte stream windows, pings, answers each call 20 ms later with an OK
    HeartbeatResponse; records what the client did."""

    max_streams = 2

    def __init__(self, ok: bytes, answer=None):
        self.ok = ok
        self.open, self.max_open, self.data_sizes, self.pongs, self.errors = set(), 0, [], 0, []
        self.requests = {}
        self.resets = []
        self.answer_data = answer  # the DATA frames' payloads of an answer (default: the OK message in one frame)
        self.refuse = set()  # stream ids answered RST_STREAM REFUSED_STREAM
        self.goaways = []  # the error codes of the client's GOAWAY frames

    def connection_made(self, transport):
        self.t = transport
        self.preface = b""
        self.reader = F.FrameReader()
        self.dec, self.enc = HpackDecoder(), HpackEncoder()
        transport.write(F.settings(((F.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_streams),
                                    (F.SETTINGS_INITIAL_WINDOW_SIZE, 16)))
                        + F.ping(b"pingpong"))

    def data_received(self, data):
        if self.preface is not None:
            self.preface += data
            if len(self.preface) < 24:
                return
            assert self.preface[:24] == F.PREFACE
            data, self.preface = self.preface[24:], None
        for ftype, flags, sid, payload in self.reader.feed(data):
            if ftype == F.HEADERS:
                headers = dict(self.dec.decode(payload))
                assert headers[b":path"] == LG.PATHS[LG.HEARTBEAT] and headers[b"te"] == b"trailers"
                if sid in self.refuse:
                    self.t.write(F.rst_stream(sid, F.REFUSED_STREAM))
                    continue
                self.open.add(sid)
                self.max_open = max(self.max_open, len(self.open))
                self.requests[sid] = b""
            elif ftype == F.DATA:
                if sid in self.refuse:
                    continue
                self.data_sizes.append(len(payload))
                self.requests[sid] += payload
                if payload:  # the client may send again what it was given
                    self.t.write(F.window_update(sid, len(payload)) + F.window_update(0, len(payload)))
                if flags & F.FLAG_END_STREAM:
                    asyncio.get_running_loop().call_later(0.02, self.answer, sid)
            elif ftype == F.PING and flags & F.FLAG_ACK:
                self.pongs += payload == b"pingpong"
            elif ftype == F.RST_STREAM:
                self.resets.append((sid, F.u32(payload)))
            elif ftype == F.GOAWAY:
                self.goaways.append(F.u32(payload, 4))

    def answer(self, sid):
        self.open.discard(sid)
        data = self.answer_data or [LG.grpc_message(self.ok)]
        self.t.write(F.frame(F.HEADERS, F.FLAG_END_HEADERS, sid,
                             self.enc.encode([(b":status", b"200"), (b"content-type", b"application/grpc")]))
                     + b"".join(F.frame(F.DATA, 0, sid, d) for d in data)
                     + F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, sid,
                               self.enc.encode([(b"grpc-status", b"0")])))


def _heartbeats(ok, answer=None, calls=10, refuse=(), server_class=None):
    """``calls`` Heartbeats of one session over one connection to a StrictServer (or ``server_class``):
    (runner, server)."""
    async def main():
        loop = asyncio.get_running_loop()
        srv_proto = (server_class or StrictServer)(ok, answer)
        srv_proto.refuse = set(refuse)
        server = await loop.create_server(lambda: srv_proto, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        runner = LG.Runner("127.0.0.1", port, None, "t")
        conn = await LG.connect(runner)
        assert isinstance(conn, LG.GrpcConn)
        [session] = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", port, False)
        session.conn = conn
        for _ in range(calls):
            runner.heartbeat(session, time.perf_counter())
        runner.flush()
        deadline = time.monotonic() + 10
        stats = runner.stats
        while stats["answered"] + stats["not_sent"] + stats["hb_ended_unanswered"] < calls \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        conn.close()
        server.close()
        return runner, srv_proto

    return asyncio.run(main())


def _ok_answer():
    d, s = LG.load_protocol()
    return s.HeartbeatResponse(status=d.Status(code=d.Code.OK)).SerializeToString()


def test_the_client_honours_the_servers_settings_and_windows():
    runner, srv = _heartbeats(_ok_answer())
    assert runner.stats["answered"] == runner.stats["ok"] == 10 and runner.stats["errors"] == 0
    assert srv.max_open == 2  # never more streams than the server's SETTINGS_MAX_CONCURRENT_STREAMS
    assert max(srv.data_sizes) == 16 and len(srv.requests) == 10  # DATA held to the 16-byte stream window
    body = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", 1, False)[0].heartbeats[0]
    assert all(r == body for r in srv.requests.values())  # whole, in order, however it was split
    assert srv.pongs == 1  # its PING was answered


def test_a_refused_stream_is_sent_again_once():
    """RST_STREAM REFUSED_STREAM (the call was not processed): sent again once, as grpc clients retry it; refused
    again, it counts as an error."""
    runner, srv = _heartbeats(_ok_answer(), calls=4, refuse={1, 3})
    assert runner.stats["refused_retries"] == 2 and runner.stats["ok"] == 4 and runner.stats["errors"] == 0
    assert len(srv.requests) == 4 and all(sid > 3 for sid in srv.requests)
    runner, srv = _heartbeats(_ok_answer(), calls=1, refuse={1, 3})
    assert runner.stats["refused_retries"] == 1 and runner.stats["ok"] == 0
    assert dict(runner.errors_by_status) == {"Heartbeat: RST_STREAM REFUSED_STREAM": 1}


class _Transport:
    """What GrpcConn uses of an asyncio transport, writing nowhere."""

    def __init__(self):
        self.closing = False
        self.written = 0

    def write(self, data):
        self.written += len(data)

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    abort = close

    def get_write_buffer_size(self):
        return 0


def test_mutated_server_bytes_never_escape_the_client():
    """300 mutated server conversations (SETTINGS, an answer over HEADERS / DATA / trailers, PING, WINDOW_UPDATE,
    RST_STREAM, GOAWAY; bits flipped, bytes cut, duplicated or inserted, split at random points) fed to a
    connection with calls open: nothing escapes data_received, every call ends or stays counted."""
    import random

    rng = random.Random(30)
    enc = HpackEncoder()
    ok = LG.grpc_message(_ok_answer())
    stream = (F.settings(((F.SETTINGS_MAX_CONCURRENT_STREAMS, 8), (F.SETTINGS_INITIAL_WINDOW_SIZE, 100),
                          (F.SETTINGS_HEADER_TABLE_SIZE, 256)))
              + F.settings(ack=True) + F.ping(b"12345678") + F.window_update(0, 1000) + F.window_update(1, 50)
              + F.frame(F.HEADERS, F.FLAG_END_HEADERS, 1, enc.encode([(b":status", b"200"),
                                                                       (b"content-type", b"application/grpc")]))
              + F.frame(F.DATA, 0, 1, ok[:4]) + F.frame(F.DATA, F.FLAG_PADDED, 1, b"\x02" + ok[4:] + b"\0\0")
              + F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, 1,
                        enc.encode([(b"grpc-status", b"0"), (b"grpc-message", b"fine")]))
              + F.rst_stream(3, F.REFUSED_STREAM) + F.rst_stream(5, F.CANCEL)
              + F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, 7, enc.encode([(b"grpc-status", b"14")]))
              + F.goaway(9, F.NO_ERROR, b"bye"))

    def mutate(data):
        data = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op, i = rng.randrange(4), rng.randrange(len(data))
            if op == 0:
                data[i] ^= 1 << rng.randrange(8)
            elif op == 1:
                del data[i:i + rng.randint(1, 12)]
            elif op == 2:
                data[i:i] = data[i:i + rng.randint(1, 40)]
            else:
                data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        return bytes(data)

    async def main():
        [session] = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", 1, False)
        ended = 0
        for k in range(300):
            runner = LG.Runner("127.0.0.1", 1, None, "t")
            conn = LG.GrpcConn(runner, b"127.0.0.1:1", b"http")
            conn.connection_made(_Transport())
            session.conn = conn
            for _ in range(6):
                runner.heartbeat(session, time.perf_counter())
            data = mutate(stream) if k else stream
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 6))))
            for a, b in zip([0] + cuts, cuts + [len(data)]):
                conn.data_received(data[a:b])
            conn.connection_lost(None)
            assert not conn.streams and not conn.waiting
            assert runner.hb_outstanding == 0 and (runner.stats["answered"] + runner.stats["not_sent"]
                                                 + runner.stats["hb_ended_unanswered"]) == 6
            ended += runner.stats["ok"]
        return ended

    assert asyncio.run(main()) > 0  # the unmutated conversation's answer, and some mutated ones, read OK


def test_a_server_that_reads_nothing_cannot_grow_the_clients_memory(monkeypatch):
    """Past MAX_WRITE_BUFFER unread bytes on a connection, calls are counted not sent instead of buffered."""
    monkeypatch.setattr(LG, "MAX_WRITE_BUFFER", 256 << 10)

    kept = []

    class Deaf(asyncio.Protocol):
        def connection_made(self, transport):
            kept.append(transport)  # paused, nothing else holds it
            transport.write(F.settings(((F.SETTINGS_MAX_CONCURRENT_STREAMS, 1 << 20),))
                            + F.window_update(0, (1 << 30)))
            transport.pause_reading()  # reads nothing more (the client's SETTINGS may be unread too)

    async def main():
        loop = asyncio.get_running_loop()
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # the kernel holds little of it
        listener.bind(("127.0.0.1", 0))
        server = await loop.create_server(Deaf, sock=listener)
        port = listener.getsockname()[1]
        runner = LG.Runner("127.0.0.1", port, None, "t")
        conn = await LG.connect(runner)
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
        [session] = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", port, False)
        session.conn = conn
        for k in range(60_000):  # ~20 MB of requests
            runner.heartbeat(session, time.perf_counter())
            if k % 200 == 0:
                runner.flush()
                await asyncio.sleep(0)
        runner.flush()
        held = conn.transport.get_write_buffer_size()
        conn.transport.abort()
        server.close()
        return runner, held

    runner, held = asyncio.run(main())
    assert held <= (256 << 10) + 200 * 400  # the limit and one batch of calls
    assert runner.errors_by_status["Heartbeat: not sent: the server does not read"] > 50_000


def test_answers_split_over_frames_and_bad_answers():
    """An answer split into 3-byte DATA frames is read whole; a unary call answered with two messages, or with a
    message declared past 4 MiB, is cancelled (RST_STREAM CANCEL) and counted by what was wrong."""
    ok = LG.grpc_message(_ok_answer())
    runner, srv = _heartbeats(_ok_answer(), [ok[i:i + 3] for i in range(0, len(ok), 3)], calls=3)
    assert runner.stats["answered"] == runner.stats["ok"] == 3 and runner.stats["errors"] == 0
    runner, srv = _heartbeats(_ok_answer(), [ok + ok], calls=2)
    assert runner.stats["answered"] == 2 and runner.stats["ok"] == 0
    assert dict(runner.errors_by_status) == {"Heartbeat: grpc-status UNKNOWN": 2}
    assert [code for _, code in srv.resets] == [F.CANCEL, F.CANCEL]
    runner, srv = _heartbeats(_ok_answer(), [b"\x00" + (LG.MAX_MESSAGE + 1).to_bytes(4, "big") + b"x" * 100],
                              calls=2)
    assert dict(runner.errors_by_status) == {"Heartbeat: grpc-status RESOURCE_EXHAUSTED": 2}
    assert [code for _, code in srv.resets] == [F.CANCEL, F.CANCEL]


def test_a_budget_of_the_broker_is_counted_by_status(tmp_path):
    """grpcMaxSessionsPerConnection 4 and 8 sessions per connection: 4 sessions register, the others' Telemetry
    streams end RESOURCE_EXHAUSTED, counted in errors_by_status; the run itself is done (status 0)."""
    b = start_broker(tmp_path, "native", grpc_max_sessions_per_connection=4)
    try:
        p = loadgen("steady", "--protocol", "grpc", "--broker", f"127.0.0.1:{b.ports['grpc']}", "--clients", "8",
                    "--duration", "1", "--quiet")
        res = json.loads(p.stdout)
        assert p.returncode == 0 and res["sessions"] == 4 and res["errors"] == 0  # none in the window
        assert res["errors_by_status"] == {"Telemetry: grpc-status RESOURCE_EXHAUSTED": 4}
        assert res["calls"]["Telemetry"] == {"sent": 8, "ok": 4} and res["answered"] > 0
        assert b.grpc.refused["sessions_per_connection"] == 4
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------------------------------
# bench/bench_grpc.py on it


def test_bench_grpc_runs_on_the_load_generator(tmp_path):
    """A small bench run (~15 s): both rows, no error, the broker's CPU per heartbeat of each, and the loop probe's
    PINGs within each row's window."""
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_grpc.py"), "--sessions", "40", "--duration", "1",
                        "--inflight", "16", "--grpc-transport", "native", "--loop-probe", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["protocol"] for r in rows] == ["grpc", "remoting"]
    grpc_row, remoting = rows
    assert grpc_row["sessions"] == 40 and grpc_row["channels"] == 1 and grpc_row["errors"] == 0
    assert remoting["connections"] == 40 and remoting["errors"] == 0
    assert grpc_row["broker_us_per_hb"] > 0 and remoting["broker_us_per_hb"] > 0
    assert "| grpc | 40 | 16 |" in p.stdout and "| remoting | 40 | 40 |" in p.stdout
    for row in rows:  # ~100 PINGs a second, only those sent within the row's window
        start, end = row["window_monotonic_s"]
        assert 0.9 <= end - start and 20 <= row["loop_pings"] <= 100 * (end - start) + 1
        assert 0 < row["loop_p50_ms"] <= row["loop_p99_ms"] <= row["loop_max_ms"]


class ContinuationFlood(StrictServer):
    """Answers a call with HEADERS without END_HEADERS, then 100,000 empty CONTINUATION frames (9 bytes each,
    none with END_HEADERS): no byte counts against the header list size."""

    def answer(self, sid):
        self.open.discard(sid)
        if not self.t.is_closing():
            self.t.write(F.frame(F.HEADERS, 0, sid, self.enc.encode([(b":status", b"200")]))
                         + F.frame(F.CONTINUATION, 0, sid) * 100_000)


def test_a_continuation_flood_ends_the_connection():
    """Empty CONTINUATION frames without END_HEADERS: past MAX_CONTINUATIONS of one header block the client ends the
    connection (GOAWAY ENHANCE_YOUR_CALM), counted once; the call on it ends as an error. Up to the limit a block is
    read: 32 CONTINUATION frames (some empty) carry an answer's headers."""
    runner, srv = _heartbeats(_ok_answer(), calls=1, server_class=ContinuationFlood)
    assert srv.goaways == [F.ENHANCE_YOUR_CALM]
    assert runner.stats["answered"] == 0 and runner.stats["hb_ended_unanswered"] == 1  # no status was read
    assert dict(runner.errors_by_status) == {"connection: HTTP/2 protocol error": 1,
                                             "Heartbeat: connection lost": 1}

    async def main(continuations):
        runner = LG.Runner("127.0.0.1", 1, None, "t")
        conn = LG.GrpcConn(runner, b"127.0.0.1:1", b"http")
        conn.connection_made(_Transport())
        [session] = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", 1, False)
        session.conn = conn
        runner.heartbeat(session, time.perf_counter())
        block = HpackEncoder().encode([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                       (b"grpc-status", b"0")])
        frames = [F.frame(F.CONTINUATION, 0, 1)] * (continuations - 1) + [
            F.frame(F.CONTINUATION, F.FLAG_END_HEADERS, 1, block)]
        conn.data_received(F.settings() + F.frame(F.HEADERS, F.FLAG_END_STREAM, 1) + b"".join(frames))
        return runner, conn

    runner, conn = asyncio.run(main(LG.MAX_CONTINUATIONS))
    assert not conn.transport.closing and runner.stats["answered"] == 1
    assert dict(runner.errors_by_status) == {"Heartbeat: no answer message": 1}  # read: trailers without a message
    runner, conn = asyncio.run(main(LG.MAX_CONTINUATIONS + 1))
    assert conn.transport.closing and runner.errors_by_status["connection: HTTP/2 protocol error"] == 1


def test_a_compressed_answer_is_cancelled():
    """A message with the compressed flag set (we asked for no grpc-encoding) is not read as the answer: the call is
    cancelled (RST_STREAM CANCEL) and counted INTERNAL, as grpc clients say."""
    msg = _ok_answer()
    runner, srv = _heartbeats(msg, [b"\x01" + len(msg).to_bytes(4, "big") + msg], calls=2)
    assert runner.stats["answered"] == 2 and runner.stats["ok"] == 0
    assert dict(runner.errors_by_status) == {"Heartbeat: grpc-status INTERNAL": 2}
    assert [code for _, code in srv.resets] == [F.CANCEL, F.CANCEL]


def test_the_receive_windows_reopen_by_what_was_read_whole():
    """DATA on a Telemetry stream (padded, messages split over frames): the windows get back exactly what was read as
    whole messages, a partial one is held until the stream ends, and then given back too."""
    d, s = LG.load_protocol()
    cmd = LG.grpc_message(s.TelemetryCommand(status=d.Status(code=d.Code.OK)).SerializeToString())

    async def main():
        runner = LG.Runner("127.0.0.1", 1, None, "t")
        conn = LG.GrpcConn(runner, b"127.0.0.1:1", b"http")
        conn.connection_made(_Transport())
        [session] = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", 1, False)
        session.conn = conn
        runner.register(session, time.perf_counter())  # QueryRoute on stream 1, Telemetry on stream 3
        conn.data_received(F.settings())
        stream = session.telemetry
        data = cmd * 3 + cmd[:4]  # three whole commands and the first 4 bytes of a fourth
        frames = [F.frame(F.DATA, F.FLAG_PADDED, 3, b"\x03" + data[:7] + b"\0\0\0"),
                  F.frame(F.DATA, 0, 3, data[7:len(cmd) + 2]), F.frame(F.DATA, 0, 3, data[len(cmd) + 2:])]
        conn.data_received(b"".join(frames))
        received = sum(len(f) - 9 for f in frames)
        assert runner.stats["settings_ok"] == 1 and runner.stats["errors"] == 0
        assert conn.recv_used == stream.recv_used == received - 4  # the partial command is held
        assert stream.reader.buffered == 4
        conn.data_received(F.rst_stream(3, F.CANCEL))
        assert conn.recv_used == received and 3 not in conn.streams

    asyncio.run(main())


class Silent(StrictServer):
    """Takes calls on one stream at a time and never answers them."""

    max_streams = 1

    def answer(self, sid):
        pass


def test_calls_a_server_never_answers_end_at_their_deadline(monkeypatch):
    """A server allowing one stream that never answers (deadline 0.3 s here, the SDKs' 3 s): MAX_WAITING (3 here)
    calls wait for the stream, the others are counted not sent; at the deadline the sent call is reset (RST_STREAM
    CANCEL) and it and the waiting ones end DEADLINE_EXCEEDED, none left held; the waiting ones are never sent."""
    monkeypatch.setattr(LG, "DEADLINE_S", 0.3)
    monkeypatch.setattr(LG, "DEADLINE_SWEEP_S", 0.05)
    monkeypatch.setattr(LG, "MAX_WAITING", 3)
    t0 = time.monotonic()
    runner, srv = _heartbeats(_ok_answer(), calls=10, server_class=Silent)
    assert time.monotonic() - t0 < 5
    assert runner.stats["hb_ended_unanswered"] == 4 and runner.stats["not_sent"] == 6 and runner.hb_outstanding == 0
    assert runner.stats["answered"] == 0 and not runner.lat  # unanswered: errors, no latency
    assert dict(runner.errors_by_status) == {"Heartbeat: grpc-status DEADLINE_EXCEEDED": 4,
                                             "Heartbeat: not sent: no stream free": 6}
    assert list(srv.requests) == [1] and srv.resets == [(1, F.CANCEL)]


def test_output_links_are_refused(tmp_path, capsys):
    """--protocol grpc shares the remoting load generator's output writer: --out / --plot a symbolic link is one line
    and exit status 2 before the run; one planted during the run is refused when the result is written (one line,
    status 1), its target untouched either way."""
    import argparse

    target = tmp_path / "precious"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    for option in ("--out", "--plot"):
        p = rmqhb("loadgen", "steady", "--protocol", "grpc", "--broker", "127.0.0.1:1", option, str(link))
        assert p.returncode == 2 and p.stdout == ""
        assert one_line(p) == f"rmqhb loadgen: {link} is a symbolic link; give the file itself (an output file is " \
            "never written through a link)"
    out = tmp_path / "res.json"
    a = argparse.Namespace(out=str(out), plot=str(link))
    assert LG.L.write_outputs(a, "{}", {"timeline": []}) == 1
    assert capsys.readouterr().err == f"rmqhb loadgen: {link} is a symbolic link; give the file itself (an output " \
        "file is never written through a link)\n"
    assert out.read_text() == "{}\n" and target.read_text() == "keep"


def test_the_deadline_sweep_looks_only_at_connections_with_calls():
    """The deadline sweep is linear in the calls in flight, not in the connections (a sweep over 9,800 idle ones
    paused the load generator ~10 ms, then sent the heartbeats due meanwhile as one burst): a connection is in
    ``busy`` while a unary call of it is in flight or waiting for a stream, and only those are swept."""
    runner, _ = _heartbeats(_ok_answer(), calls=3)
    assert runner.stats["answered"] == 3 and not runner.busy  # every call ended: none left to sweep

    class Conn:
        def __init__(self, unary):
            self.unary, self.waiting, self.swept = unary, (), 0

        def expire(self, now):
            self.swept += 1
            self.unary = 0  # its call ended at its deadline
            return False

    class Loop:
        def call_later(self, delay, fn, *args):
            return None

    idle = [Conn(0) for _ in range(1000)]
    calling = Conn(1)
    runner = LG.Runner("127.0.0.1", 1, None, "t")
    runner.watched.update(idle + [calling])
    runner.busy.add(calling)
    runner._expire(Loop())
    assert calling.swept == 1 and not any(c.swept for c in idle)
    assert not runner.busy  # it has no call left: no longer swept


def test_the_probe_names_an_endpoint_that_never_answers(monkeypatch):
    """An HTTP/2 server that sends its SETTINGS and then answers nothing: the probe's QueryRoute ends at its deadline
    (0.3 s here), said in one line instead of waiting out the probe's timeout."""
    monkeypatch.setattr(LG, "DEADLINE_S", 0.3)
    monkeypatch.setattr(LG, "DEADLINE_SWEEP_S", 0.05)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def drain(conn):  # reads every request, answers none
        with conn:
            try:
                while conn.recv(4096):
                    pass
            except OSError:  # reset by the client
                pass

    def run():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(F.settings())
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    threading.Thread(target=run, daemon=True).start()
    try:
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        why = LG.probe("127.0.0.1", port, False, "T", 1, timeout=10)
        assert why == f"127.0.0.1:{port} did not answer QueryRoute within the SDKs' 0.3 s deadline"
        assert time.monotonic() - t0 < 5
    finally:
        srv.close()


# ---------------------------------------------------------------------------------------------------------------
# review 20c: processes, registration, bounded counters and buffers


def test_more_processes_than_connections_end_with_the_run(tmp_path):
    """--procs 2 with one connection: the processes are no more than the connections (a process without any
    connection never took part in the window's barrier: the run waited 900 s for it)."""
    b = start_broker(tmp_path, "native")
    try:
        t0 = time.monotonic()
        p = loadgen("steady", "--protocol", "grpc", "--broker", f"127.0.0.1:{b.ports['grpc']}", "--clients", "1",
                    "--procs", "2", "--duration", "1", "--quiet", timeout=60)
        assert p.returncode == 0 and time.monotonic() - t0 < 40, p.stderr
        res = json.loads(p.stdout)
        assert res["procs"] == 1 and res["sessions"] == 1 and res["answered"] > 0
    finally:
        b.stop()


class _SettingsThenClose(asyncio.Protocol):
    """An HTTP/2 server that sends its SETTINGS, then closes the connection as soon as the client writes."""

    def connection_made(self, transport):
        self.t = transport
        transport.write(F.settings(()))

    def data_received(self, data):
        self.t.close()


def _steady_args(port, n, offset, **kw):
    a = dict(scenario="steady", host="127.0.0.1", port=port, n=n, offset=offset, duration=1.0, rate=0.0,
             per_connection=8, depth=1, inflight=0, groups=7, topics=7, topic_prefix="TopicLoad",
             consumer_share=0.5, pending=64, assignment_interval=5.0, route_interval=30.0, vary=False, tls=False,
             server_pid=None, warmup=0.5, token="t20c", credentials=None, index=0, core_frames=False)
    a.update(kw)
    return a


def test_a_process_that_lost_every_connection_still_passes_the_barriers(tmp_path):
    """Two processes (threads here, one barrier): one's endpoint ends its only connection, the other measures;
    the first still waits at each barrier with the other, and both end."""
    import threading

    b = start_broker(tmp_path, "native")
    barrier = threading.Barrier(2)
    results, errors = [None, None], []

    def serve_closing(ready, port_box):
        async def main():
            server = await asyncio.get_running_loop().create_server(_SettingsThenClose, "127.0.0.1", 0)
            port_box.append(server.sockets[0].getsockname()[1])
            ready.set()
            await asyncio.sleep(60)
        try:
            asyncio.run(main())
        except Exception:
            pass

    ready, port_box = threading.Event(), []
    threading.Thread(target=serve_closing, args=(ready, port_box), daemon=True).start()
    ready.wait(10)

    def worker(k, a):
        try:
            results[k] = asyncio.run(LG.steady(a, barrier))
        except BaseException as e:  # noqa: BLE001 (the test reports it)
            errors.append(repr(e))

    # warm-up 1.5 s: the first process sees its connections gone (checked each second) before the window opens
    threads = [threading.Thread(target=worker, args=(0, _steady_args(port_box[0], 2, 0, warmup=1.5)), daemon=True),
               threading.Thread(target=worker, args=(1, _steady_args(b.ports["grpc"], 2, 2, index=1, warmup=1.5)),
                                daemon=True)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        stuck = [t.is_alive() for t in threads]
        barrier.abort()  # frees a process left waiting (the code before: the measuring one, for 900 s)
        assert not any(stuck) and not errors, (stuck, errors)
        assert results[0]["sessions"] == 0 and results[1]["sessions"] == 2 and results[1]["answered"] > 0
    finally:
        b.stop()


class Endpoint(asyncio.Protocol):
    """A 5.x endpoint in a few lines: QueryRoute, Settings and every unary call answered OK, except on connections
    after the first ``tame`` ones (the load generator's pre-run check), where Heartbeat (or Settings) is answered
    per ``mode``."""

    mode, tame, max_streams, conns = "ok", 1, 1000, 0

    def connection_made(self, t):
        type(self).conns += 1
        self.hostile = type(self).conns > self.tame
        self.t, self.buf, self.preface = t, b"", False
        self.reader = F.FrameReader(1 << 20)
        self.dec, self.enc = HpackDecoder(65536, 1 << 20), HpackEncoder()
        self.paths, self.fired = {}, False
        t.write(F.settings(((F.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_streams),
                            (F.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 30))) + F.window_update(0, 1 << 30))

    def answer(self, sid, body, status=0):
        out = F.frame(F.HEADERS, F.FLAG_END_HEADERS, sid,
                      self.enc.encode([(b":status", b"200"), (b"content-type", b"application/grpc")]))
        if body is not None:
            out += F.frame(F.DATA, 0, sid, body)
        self.t.write(out + F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, sid,
                                   self.enc.encode([(b"grpc-status", str(status).encode())])))

    def data_received(self, data):
        if not self.preface:
            self.buf += data
            if len(self.buf) < 24:
                return
            data, self.preface = self.buf[24:], True
        for ftype, flags, sid, payload in self.reader.feed(data):
            if ftype == F.SETTINGS and not flags & F.FLAG_ACK:
                self.t.write(F.settings(ack=True))
            elif ftype == F.HEADERS:
                self.paths[sid] = dict(self.dec.decode(payload))[b":path"].decode().rsplit("/", 1)[1]
            elif ftype == F.DATA and payload:
                self.on_call(sid, self.paths.get(sid))
            if self.t.is_closing():
                return

    def on_call(self, sid, path):
        d, s = LG.load_protocol()
        msg = lambda m: LG.grpc_message(m.SerializeToString())  # noqa: E731
        if path == "Telemetry":
            if self.hostile and self.mode == "nosettingsanswer":
                return
            c = s.TelemetryCommand(status=d.Status(code=d.Code.OK))
            c.settings.request_timeout.seconds = 3
            self.t.write(F.frame(F.HEADERS, F.FLAG_END_HEADERS, sid, self.enc.encode(
                [(b":status", b"200"), (b"content-type", b"application/grpc")])) + F.frame(F.DATA, 0, sid, msg(c)))
        elif path != "Heartbeat" or not self.hostile or self.mode in ("ok", "nosettingsanswer"):
            cls = {"Heartbeat": s.HeartbeatResponse, "QueryAssignment": s.QueryAssignmentResponse,
                   "QueryRoute": s.QueryRouteResponse,
                   "NotifyClientTermination": s.NotifyClientTerminationResponse}[path]
            self.answer(sid, msg(cls(status=d.Status(code=d.Code.OK))))
        else:
            self.hostile_heartbeat(sid)

    def hostile_heartbeat(self, sid):
        raise NotImplementedError(self.mode)


def _serve(cls, **attrs):
    """``cls`` (an Endpoint) with ``attrs`` served on a thread of its own: its port."""
    import threading

    srv = type("Served", (cls,), dict(attrs, conns=0))
    ready, box = threading.Event(), []

    def run():
        async def main():
            server = await asyncio.get_running_loop().create_server(srv, "127.0.0.1", 0)
            box.append(server.sockets[0].getsockname()[1])
            ready.set()
            await asyncio.sleep(120)
        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10)
    return box[0]


def test_settings_never_answered_end_registration_and_fail_the_run(monkeypatch, capsys):
    """Settings never answered: registration gives up once none came for REGISTER_STALL_S (it waited 120 s), the
    sessions count as errors, and a run in which no session registered exits 1 with one line (it exited 0)."""
    monkeypatch.setattr(LG, "REGISTER_STALL_S", 0.5)
    port = _serve(Endpoint, mode="nosettingsanswer")
    t0 = time.monotonic()
    status = LG.main(["steady", "--broker", f"127.0.0.1:{port}", "--clients", "4", "--duration", "1", "--quiet",
                      "--topics", "1"])
    out, err = capsys.readouterr()
    assert status == 1 and time.monotonic() - t0 < 20, err
    res = json.loads(out)
    assert res["sessions"] == 0 and res["errors_by_status"]["Telemetry: Settings not answered"] == 4
    assert err.strip().splitlines()[-1].startswith(f"rmqhb loadgen: no session registered at 127.0.0.1:{port}")


def test_sessions_past_the_servers_concurrent_streams_are_refused_up_front(capsys):
    """Each session's Telemetry stream holds a stream for good: sessions per connection plus one unary call past
    the server's SETTINGS_MAX_CONCURRENT_STREAMS is refused before the run, one line, exit 2 (every Heartbeat
    ended DEADLINE_EXCEEDED)."""
    port = _serve(Endpoint, max_streams=8)
    status = LG.main(["steady", "--broker", f"127.0.0.1:{port}", "--clients", "8", "--sessions-per-connection",
                      "8", "--duration", "1", "--quiet", "--topics", "1"])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    [line] = err.strip().splitlines()
    assert line.startswith("rmqhb loadgen: --sessions-per-connection 8: 127.0.0.1:") and line.endswith("at most 7")
    status = LG.main(["steady", "--broker", f"127.0.0.1:{port}", "--clients", "8", "--sessions-per-connection",
                      "7", "--duration", "1", "--quiet", "--topics", "1"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert json.loads(out)["sessions"] == 8


def _conversation(calls: int):
    """A connection over a transport writing nowhere, with ``calls`` Heartbeats of one session sent: (runner,
    conn)."""
    runner = LG.Runner("127.0.0.1", 1, None, "t")
    conn = LG.GrpcConn(runner, b"127.0.0.1:1", b"http")
    conn.connection_made(_Transport())
    [session] = LG.make_sessions(1, 0, "t", 1, 1, 1.0, "T", "127.0.0.1", 1, False)
    session.conn = conn
    conn.data_received(F.settings(((F.SETTINGS_MAX_CONCURRENT_STREAMS, 1 << 20),)))
    for _ in range(calls):
        runner.heartbeat(session, time.perf_counter())
    return runner, conn


def test_codes_the_server_chooses_are_bounded_keys():
    """RST_STREAM codes, grpc-status values and RocketMQ status codes we do not know count under one key each
    (OTHER), the known ones by name: 3 x 300 random codes made 900 keys (224,055 in a 3 s run)."""
    import random

    rng = random.Random(3)
    d, s = LG.load_protocol()
    enc = HpackEncoder()
    frames = [F.rst_stream(1, F.INTERNAL_ERROR)]
    for k in range(1, 900):
        sid = 2 * k + 1
        if k < 300:
            frames.append(F.rst_stream(sid, rng.randrange(100, 1 << 32)))
        elif k < 600:
            frames.append(F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, sid, enc.encode(
                [(b":status", b"200"), (b"grpc-status", str(rng.randrange(17, 1000)).encode())])))
        else:
            body = LG.grpc_message(s.HeartbeatResponse(status=d.Status(code=rng.randrange(100000, 1 << 31)))
                                   .SerializeToString())
            frames.append(F.frame(F.HEADERS, F.FLAG_END_HEADERS, sid, enc.encode([(b":status", b"200")]))
                          + F.frame(F.DATA, 0, sid, body)
                          + F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM, sid,
                                    enc.encode([(b"grpc-status", b"0")])))

    async def main():
        runner, conn = _conversation(900)
        conn.data_received(b"".join(frames))
        conn.connection_lost(None)
        return runner

    runner = asyncio.run(main())
    assert runner.stats["errors"] == 900
    assert dict(runner.errors_by_status) == {"Heartbeat: RST_STREAM INTERNAL_ERROR": 1,
                                             "Heartbeat: RST_STREAM OTHER": 299, "Heartbeat: grpc-status OTHER": 300,
                                             "Heartbeat: code OTHER": 300}


class _CloseAtHeartbeat(Endpoint):
    def hostile_heartbeat(self, sid):
        self.t.close()


def test_a_run_ended_before_its_window_reports_no_warm_up_latency(capsys):
    """The endpoint closes every connection at its first Heartbeat, before the window opens: the window is empty
    (no latency, no timeline rate from the warm-up's answers: p99 2 ms and 4e10 answers/s before), and the
    Heartbeats ended by the loss count as errors, not as answered."""
    port = _serve(_CloseAtHeartbeat, mode="close")
    status = LG.main(["steady", "--broker", f"127.0.0.1:{port}", "--clients", "8", "--duration", "1", "--quiet",
                      "--topics", "1"])
    out, err = capsys.readouterr()
    assert status == 1, err
    res = json.loads(out)
    assert res["answered"] == 0 and res.get("p99_ms") is None and res.get("ended_unanswered", 0) == 0
    assert all(row["answered_per_s"] == 0 for row in res["timeline"]), res["timeline"]
    assert res["errors_by_status"]["Heartbeat: connection lost"] >= 1


def test_heartbeats_ended_without_an_answer_are_errors_not_answers():
    """RST_STREAM, GOAWAY and the connection's loss end calls the server never answered: errors without a latency
    (they were 'answered', their latencies measured); an answer read is answered."""
    enc = HpackEncoder()
    ok = LG.grpc_message(_ok_answer())

    async def main():
        runner, conn = _conversation(4)
        conn.data_received(F.frame(F.HEADERS, F.FLAG_END_HEADERS, 1, enc.encode([(b":status", b"200")]))
                           + F.frame(F.DATA, 0, 1, ok) + F.frame(F.HEADERS, F.FLAG_END_HEADERS | F.FLAG_END_STREAM,
                                                                 1, enc.encode([(b"grpc-status", b"0")]))
                           + F.rst_stream(3, F.INTERNAL_ERROR) + F.goaway(5, F.NO_ERROR))
        conn.connection_lost(None)
        return runner

    runner = asyncio.run(main())
    stats = runner.stats
    assert stats["answered"] == stats["ok"] == 1 and len(runner.lat) == 1
    assert stats["hb_ended_unanswered"] == 3 and stats["errors"] == 3
    assert dict(runner.errors_by_status) == {"Heartbeat: RST_STREAM INTERNAL_ERROR": 1,
                                             "Heartbeat: GOAWAY NO_ERROR": 1, "connection: GOAWAY NO_ERROR": 1,
                                             "Heartbeat: connection lost": 1}


def test_data_past_our_windows_is_a_flow_control_error(monkeypatch):
    """A server ignoring the windows we announced (scaled down: 64 KiB streams, 192 KiB connection): DATA past a
    stream's or the connection's window ends the connection (GOAWAY FLOW_CONTROL_ERROR, counted), partial
    messages never complete so nothing reopens the windows (mode bloat: 176 MB held before, 550 MB at --depth 4)."""
    monkeypatch.setattr(LG, "MAX_MESSAGE", 1 << 20)
    monkeypatch.setattr(LG, "STREAM_WINDOW", (64 << 10) + 5)
    monkeypatch.setattr(LG, "CONNECTION_WINDOW", 192 << 10)
    enc = HpackEncoder()

    def partial(sid, size):  # an answer declaring 1 MiB, ``size`` bytes of it sent
        head = b"\x00" + (1 << 20).to_bytes(4, "big")
        body = head + b"x" * (size - len(head))
        return (F.frame(F.HEADERS, F.FLAG_END_HEADERS, sid, enc.encode([(b":status", b"200")]))
                + b"".join(F.frame(F.DATA, 0, sid, body[i:i + 16384]) for i in range(0, len(body), 16384)))

    async def main(data, calls):
        runner, conn = _conversation(calls)
        conn.data_received(data)
        written = conn.transport.written
        closing = conn.transport.closing
        conn.connection_lost(None)
        return runner, closing, written

    # within the windows: held, the connection lives
    runner, closing, _ = asyncio.run(main(partial(1, (64 << 10) + 5) + partial(3, 60000), 2))
    assert not closing and runner.stats["errors"] == 2 and "connection: HTTP/2 protocol error" not in \
        runner.errors_by_status
    # one byte past a stream's window
    runner, closing, _ = asyncio.run(main(partial(1, (64 << 10) + 6), 1))
    assert closing and runner.errors_by_status["connection: HTTP/2 protocol error"] == 1
    # each stream within its window, the connection's passed
    runner, closing, _ = asyncio.run(main(b"".join(partial(sid, 60000) for sid in (1, 3, 5, 7)), 4))
    assert closing and runner.errors_by_status["connection: HTTP/2 protocol error"] == 1


def test_a_server_flooding_pings_and_reading_nothing_is_closed(monkeypatch):
    """A server that stops reading and floods PINGs: our ACKs pile up unread; past twice MAX_WRITE_BUFFER (64 KiB
    here) the connection is closed, counted (the ACKs grew the write buffer without bound: 594-761 MB)."""
    monkeypatch.setattr(LG, "MAX_WRITE_BUFFER", 64 << 10)
    seen = []

    class Flood(asyncio.Protocol):
        def connection_made(self, transport):
            self.t = transport
            transport.write(F.settings(()))
            transport.pause_reading()
            asyncio.get_running_loop().create_task(self.flood())

        async def flood(self):
            burst = F.ping(b"12345678") * 4096
            for _ in range(50):  # 200,000 PINGs, 3.4 MB of ACKs
                if self.t.is_closing():
                    return
                self.t.write(burst)
                await asyncio.sleep(0.005)

    async def main():
        loop = asyncio.get_running_loop()
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        listener.bind(("127.0.0.1", 0))
        server = await loop.create_server(Flood, sock=listener)
        runner = LG.Runner("127.0.0.1", listener.getsockname()[1], None, "t")
        conn = await LG.connect(runner)
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
        deadline = time.monotonic() + 10
        while not conn.lost and time.monotonic() < deadline:
            seen.append(conn.transport.get_write_buffer_size())
            await asyncio.sleep(0.005)
        lost = conn.lost
        conn.transport.abort()
        server.close()
        return runner, lost

    runner, lost = asyncio.run(main())
    assert lost and runner.errors_by_status["connection: the server does not read (write buffer)"] == 1
    assert runner.stats["connections_lost"] == 1
    assert max(seen) <= (128 << 10) + (256 << 10)  # the budget and one read's ACKs


@pytest.mark.parametrize("option", [("--rate", "inf"), ("--rate", "nan"), ("--rate", "1e12"),
                                    ("--assignment-interval", "nan"), ("--route-interval", "inf"),
                                    ("--duration", "inf"), ("--consumer-share", "nan")])
def test_numbers_that_are_not_finite_are_refused_up_front(option, capsys):
    """inf and nan passed the option checks (--rate inf failed after registering with a child's traceback,
    exit 1; nan a ValueError; --assignment-interval nan turned QueryAssignment off): refused, exit 2."""
    with pytest.raises(SystemExit) as e:
        LG.main(["steady", "--broker", "127.0.0.1:1", "--clients", "1", *option])
    assert e.value.code == 2
    assert "finite numbers" in capsys.readouterr().err


def test_an_offered_rate_past_what_the_loop_sends_still_ends_at_the_duration():
    """--rate 10,000,000 (the bound) on one process: each pass sends at most MAX_TICK_CALLS of a kind, so the run
    ends at its duration, behind the offered rate (each pass's backlog grew faster than it was sent: --rate 1e9
    --duration 1 never ended)."""
    import threading

    port = _serve(Endpoint, tame=0)
    box = []
    args = _steady_args(port, 2, 0, rate=1e7, duration=0.5, warmup=0.2, topics=1)
    t = threading.Thread(target=lambda: box.append(asyncio.run(LG.steady(args))), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(40)
    assert not t.is_alive() and time.monotonic() - t0 < 20
    [res] = box
    assert 0 < res["sent"] < 0.5e7 and res["sessions"] == 2


def test_tls_against_a_port_that_cuts_the_handshake_says_so(monkeypatch):
    """--tls against a port that takes the TCP connection, then closes it at the ClientHello (or never answers
    it): the TLS handshake failed, said so (it said "cannot connect" though TCP connected)."""
    import threading

    monkeypatch.setattr(LG, "HANDSHAKE_TIMEOUT_S", 0.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    held, mode = [], ["close"]

    def accept():
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            if mode == ["close"]:
                c.recv(100)
                c.close()
            held.append(c)

    threading.Thread(target=accept, daemon=True).start()
    try:
        why = LG.probe("127.0.0.1", port, True, "TopicLoad", 1)
        assert why == (f"127.0.0.1:{port} TLS handshake failed (the connection was closed by the server): a "
                       "plaintext port? (drop --tls)"), why
        mode[0] = "hold"
        why = LG.probe("127.0.0.1", port, True, "TopicLoad", 1)
        assert why.startswith(f"127.0.0.1:{port} TLS handshake failed (the connection was not answered within "
                              "0.5 s)"), why
    finally:
        listener.close()
        for c in held:
            c.close()


def test_registration_gives_each_stalled_batch_its_own_wait(monkeypatch):
    """--pending 2 against an endpoint answering no Settings: each batch of 2 waits REGISTER_STALL_S, is counted
    unanswered, and the next batch is sent and waits in turn (not counted at once, unsent-for-long); the whole
    stays within REGISTER_LIMIT_S."""
    monkeypatch.setattr(LG, "REGISTER_STALL_S", 0.3)
    monkeypatch.setattr(LG, "REGISTER_LIMIT_S", 5.0)
    port = _serve(Endpoint, mode="nosettingsanswer", tame=0)

    async def main():
        runner = LG.Runner("127.0.0.1", port, None, "t")
        sessions = LG.make_sessions(6, 0, "t", 1, 1, 0.0, "TopicLoad", "127.0.0.1", port, False)
        await LG.connect_all(runner, sessions, 8)
        t0 = time.perf_counter()
        await LG.register_all(runner, sessions, 2)
        return runner, time.perf_counter() - t0

    runner, took = asyncio.run(main())
    assert runner.unanswered == 6 and runner.unsettled == 0
    assert runner.errors_by_status["Telemetry: Settings not answered"] == 6
    assert 0.9 <= took < 3  # three batches, 0.3 s each

"""Faults at the server that tests/test_server.py does not cover yet (it has garbage frames, a 2 GiB prefix, a
slowloris trickle, a disconnect mid-frame, expiry, the per-IP limit and the write-stall / write-buffer bounds
signalled synthetically).

Here: negative length prefixes, a prefix over a configured max frame size, garbage right after a valid frame,
a reset (RST) mid-frame, half-closed and silent (half-open) connections, a flood of connections past
maxConnections, and a real client that pipelines requests and never reads the answers. Each time the bad
connection is closed with one logged reason, a well-behaved client on another connection keeps its answers and
its registration, and afterwards nothing of the bad clients remains (registry, connection table, per-IP counts).
"""
import logging
import socket
import struct
import threading
import time

import pytest

import engine
from engine.codec.enums import RequestCode, ResponseCode
from test_server import Client, broker_factory, consumer_ids, hb_body, wait_until  # noqa: F401  (fixture)

GROUP = "demo_consumer_group"


def closing_reasons(caplog, addr=None):
    out = []
    for r in caplog.records:
        m = r.getMessage()
        if m.startswith("closing ") and (addr is None or m.startswith(f"closing {addr} ")):
            out.append(m.split(": ", 1)[1])
    return out


def addr_of(client):
    host, port = client.sock.getsockname()[:2]
    return f"{host}:{port}"


def nothing_left_but(b, good_ids):
    """Only the good clients are registered, and the server tracks only live connections."""
    assert wait_until(lambda: sorted(consumer_ids(b, GROUP)) == sorted(good_ids)), consumer_ids(b, GROUP)
    conns = b.call(lambda: list(b.server.connections))
    assert all(not c.closing for c in conns)
    per_ip = b.call(lambda: dict(b.server.per_ip))
    assert sum(per_ip.values()) == len(conns), (per_ip, conns)
    b.call(b.registry.check_invariants)


@pytest.fixture
def setup(broker_factory, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="engine.broker.server")

    def make(**kw):
        b = broker_factory(**kw)
        good = Client(b.ports["main"])
        assert good.heartbeat(client_id="good@1").code == 0
        return b, good

    return make


def still_served(good):
    r = good.heartbeat(client_id="good@1")
    assert r.code == 0
    r = good.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})
    assert r.code == 0 and b'"good@1"' in r.body


@pytest.mark.parametrize("prefix", [b"\x80\x00\x00\x00", b"\xff\xff\xff\xff", b"\xff\xff\xff\xf0"])
def test_negative_length_prefix(setup, caplog, prefix):
    b, good = setup()
    bad = Client(b.ports["main"])
    assert bad.heartbeat(client_id="bad@1").code == 0
    bad.sock.sendall(prefix + b"\x00\x00\x00\x10" + b"x" * 16)
    assert bad.closed_by_peer()
    reasons = closing_reasons(caplog, addr_of(bad))
    assert len(reasons) == 1 and reasons[0].startswith("undecodable frame: negative frame length"), reasons
    still_served(good)
    nothing_left_but(b, ["good@1"])


def test_prefix_over_the_configured_max_frame_size_is_refused_before_buffering(setup, caplog):
    b, good = setup(max_frame_size=64 * 1024)
    bad = Client(b.ports["main"])
    assert bad.heartbeat(client_id="bad@1").code == 0
    bad.sock.sendall(struct.pack(">i", 64 * 1024) + b"\x00\x00\x00\x10")  # +4 for the prefix: one byte over
    assert bad.closed_by_peer()  # closed on the prefix alone: nothing of the announced frame was awaited
    assert closing_reasons(caplog, addr_of(bad)) == [
        "undecodable frame: frame length 65536 exceeds the max frame size 65536"]
    ok = Client(b.ports["main"])  # just under the limit is fine
    body = hb_body(client_id="big@1")
    r = ok.call(RequestCode.HEART_BEAT, {"pad": "p" * (64 * 1024 - 400 - len(body))}, body)
    assert r.code == 0
    still_served(good)
    ok.close()
    nothing_left_but(b, ["good@1"])


def test_garbage_right_after_a_valid_frame(setup, caplog):
    b, good = setup()
    bad = Client(b.ports["main"])
    valid = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=5, ext_fields={}, body=hb_body(client_id="bad@1"))
    bad.sock.sendall(valid.encode() + b"\x00\x00\x00\x0c\x05GARBAGE!!!!")
    assert bad.closed_by_peer()
    reasons = closing_reasons(caplog, addr_of(bad))
    assert len(reasons) == 1 and reasons[0].startswith("undecodable frame: bad header length"), reasons
    still_served(good)
    nothing_left_but(b, ["good@1"])  # whatever the valid frame did is undone when its connection closed
    assert b.metrics.frame_errors == 1


def test_reset_mid_frame(setup):
    b, good = setup()
    bad = Client(b.ports["main"])
    assert bad.heartbeat(client_id="bad@1").code == 0
    frame = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=9, ext_fields={}, body=hb_body()).encode()
    bad.sock.sendall(frame[: len(frame) // 2])
    bad.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    bad.sock.close()  # RST instead of FIN
    still_served(good)
    nothing_left_but(b, ["good@1"])


def test_half_closed_connection_is_closed_and_forgotten(setup):
    """The client shuts its sending side (FIN) but keeps reading: the server treats EOF as the end."""
    b, good = setup()
    bad = Client(b.ports["main"])
    assert bad.heartbeat(client_id="half@1").code == 0
    bad.sock.shutdown(socket.SHUT_WR)
    assert bad.closed_by_peer()
    still_served(good)
    nothing_left_but(b, ["good@1"])


def test_silent_half_open_connection_is_closed_when_idle(setup, caplog):
    """A client that vanished without FIN (its socket stays open, nothing arrives) is closed by the idle check
    (serverChannelMaxIdleTimeSeconds) and its registration goes with it; the good client heartbeats on."""
    b, good = setup(server_channel_max_idle_time_seconds=2)
    ghost = Client(b.ports["main"])
    assert ghost.heartbeat(client_id="ghost@1").code == 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and "ghost@1" in consumer_ids(b, GROUP):
        still_served(good)  # keeps the good connection busy
        time.sleep(0.3)
    assert "ghost@1" not in consumer_ids(b, GROUP)
    assert ghost.closed_by_peer(2)
    reasons = closing_reasons(caplog, addr_of(ghost))
    assert len(reasons) == 1 and reasons[0].startswith("idle for"), reasons
    nothing_left_but(b, ["good@1"])


def test_connection_flood_beyond_max_connections(setup, caplog):
    b, good = setup(max_connections=20)
    accepted, flood = [], []
    for i in range(60):
        flood.append(Client(b.ports["main"]))
    busy = served = 0
    for i, c in enumerate(flood):
        r = c.call(RequestCode.HEART_BEAT, {}, hb_body(client_id=f"flood{i}@1"))
        if r.code == 0:
            served += 1
            accepted.append(c)
        else:
            assert r.code == ResponseCode.SYSTEM_BUSY and "maxConnections=20" in r.remark, r.remark
            busy += 1
            assert c.closed_by_peer()
    assert served == 19 and busy == 41  # the good client holds the 20th slot
    assert b.metrics.connections_rejected["max_connections"] == 41
    still_served(good)
    assert b.metrics.connections_closed["limit"] == 41
    # one log line per closed connection, but at most 20 a minute per reason (a flood cannot flood the log)
    assert sum(r.startswith("too many connections") for r in closing_reasons(caplog)) == 20
    for c in accepted:
        c.close()
    nothing_left_but(b, ["good@1"])
    late = Client(b.ports["main"])  # slots are given back
    assert late.heartbeat(client_id="late@1").code == 0
    late.close()
    nothing_left_but(b, ["good@1"])


def test_client_that_never_reads_keeps_the_server_buffer_bounded(setup, caplog):
    """A real client pipelines requests with large answers and never reads. The kernel buffers fill, the
    transport pauses writing, the server stops reading that connection; its write buffer stays under
    maxWriteBufferBytes (+ one read's answers) and it is closed after writeStallTimeoutMs."""
    bound = 256 * 1024
    b, good = setup(max_write_buffer_bytes=bound, write_stall_timeout_ms=1500)
    for i in range(40):  # a big GET_CONSUMER_CONNECTION_LIST answer: many clients in the group
        c = Client(b.ports["main"])
        assert c.heartbeat(client_id=f"member-{i:03d}-" + "m" * 60).code == 0
    lazy = socket.socket()
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    lazy.connect(("127.0.0.1", b.ports["main"]))
    req = engine.RemotingCommand(RequestCode.GET_CONSUMER_CONNECTION_LIST, ext_fields={"consumerGroup": GROUP})
    one = req.encode()
    stop = threading.Event()

    def pump():
        try:
            while not stop.is_set():
                lazy.sendall(one * 64)
        except OSError:
            pass

    threading.Thread(target=pump, daemon=True).start()
    worst = 0
    conn = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        conns = b.call(lambda: [c for c in b.server.connections if c.remote_port == lazy.getsockname()[1]])
        if conns:
            conn = conns[0]
        if conn is not None:
            size = b.call(lambda: conn.transport.get_write_buffer_size() if conn.transport else 0)
            worst = max(worst, size)
            if conn.closing:
                break
        still_served(good)
        time.sleep(0.05)
    stop.set()
    assert conn is not None and conn.closing, "the client that never reads was not disconnected"
    assert conn.close_reason.startswith("client does not read its responses"), conn.close_reason
    assert worst <= bound + 256 * 1024, worst  # one read's batch of answers may go past the bound once
    lazy.close()
    still_served(good)
    assert b.metrics.connections_closed["write_buffer"] == 1

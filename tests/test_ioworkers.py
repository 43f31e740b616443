"""The broker with ioWorkers=2: client sockets live in I/O worker processes (engine.broker.ioworker), the broker logic in
the core. Everything a client sees must be the same as with in-process I/O.

Part of the coverage re-runs tests of test_server.py and test_faults.py unchanged: they are imported below and
pick up this module's ``broker_defaults``: test_server's ``broker_factory`` starts every broker with ioWorkers=2
(pytest resolves fixtures from the module that collects the test). The rest is what only workers have: which worker holds which
connection, kill -9 of a worker, more connections than one worker's descriptor limit, the link protocol.
"""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import engine
from engine.broker.controller import Broker
from engine.codec.enums import RequestCode, ResponseCode
from engine.broker.ioworker import HEADER, IOWorkerPool, VirtualTransport

import test_faults
import test_server
from test_server import Client, broker, broker_factory, consumer_ids, hb_body, make_config, wait_until  # noqa: F401  (fixtures)

GROUP = "demo_consumer_group"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def broker_defaults():
    return {"io_workers": 2}


def test_the_reused_tests_run_against_workers(broker):
    assert broker.server.io_pool is not None and len(broker.server.io_pool.workers) == 2


# ---- the in-process tests, unchanged, against ioWorkers=2 ----------------------------------------------------
test_heartbeat_v1_response = test_server.test_heartbeat_v1_response
test_fast_port_is_main_minus_two_and_serves_the_same = test_server.test_fast_port_is_main_minus_two_and_serves_the_same
test_consumer_list_notify_unregister_and_close = test_server.test_consumer_list_notify_unregister_and_close
test_faults_are_cut_off_and_others_keep_being_served = test_server.test_faults_are_cut_off_and_others_keep_being_served
test_connection_limits = test_server.test_connection_limits
test_write_buffer_bound = test_server.test_write_buffer_bound
test_acl_refuses_unsigned_and_wrongly_signed = test_server.test_acl_refuses_unsigned_and_wrongly_signed
test_negative_length_prefix = test_faults.test_negative_length_prefix
test_garbage_right_after_a_valid_frame = test_faults.test_garbage_right_after_a_valid_frame
test_reset_mid_frame = test_faults.test_reset_mid_frame
test_half_closed_connection_is_closed_and_forgotten = test_faults.test_half_closed_connection_is_closed_and_forgotten
test_client_that_never_reads_keeps_the_server_buffer_bounded = \
    test_faults.test_client_that_never_reads_keeps_the_server_buffer_bounded
setup = test_faults.setup  # the fixture test_faults' tests use (built on this module's broker_factory)


# ---- helpers ---------------------------------------------------------------------------------------------------


def worker_of(b, client):
    """Index of the I/O worker holding the client's connection."""
    port = client.sock.getsockname()[1]

    def find():
        for w in b.server.io_pool.workers:
            for vt in w.conns.values():
                if vt.conn.remote_port == port:
                    return w.index
        return None

    return b.call(find)


def closing_reasons(caplog, client):
    return [m.split(": ", 1)[1] for m in (r.getMessage() for r in caplog.records)
            if m.startswith(f"closing {client.addr} ")]


# ---- answers ---------------------------------------------------------------------------------------------------


def test_connections_are_held_by_workers_not_the_core(broker):
    b = broker
    clients = [Client(b.ports["main"]) for _ in range(4)] + [Client(b.ports["fast"]) for _ in range(2)]
    for i, c in enumerate(clients):
        assert c.heartbeat(client_id=f"c{i}@1").code == 0
    conns = b.call(lambda: list(b.server.connections))
    assert len(conns) == 6 and all(isinstance(c.transport, VirtualTransport) for c in conns)
    assert sorted(c.port_name for c in conns) == ["fast"] * 2 + ["main"] * 4
    # least-loaded hand-off: 3 and 3
    assert sorted(s["connections"] for s in b.call(b.server.io_pool.stats)) == [3, 3]
    # the core keeps no client descriptor: every socket it accepted was closed after the hand-off (this process
    # holds only the clients' own ends, whose peers are the broker's ports)
    client_ends = {c.sock.getsockname() for c in clients}
    server_ends = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.family == socket.AF_INET and s.getpeername() in client_ends:
                server_ends.append(s.getsockname())
        except OSError:
            pass
        finally:
            s.close()
    assert server_ends == []
    conn = conns[0]
    assert conn.remote_ip == "127.0.0.1" and conn.local_ip == "127.0.0.1"
    text = b.render_metrics()
    assert 'rocketmq_broker_io_worker_connections{worker="0"} 3' in text
    assert 'rocketmq_broker_io_worker_connections{worker="1"} 3' in text
    assert "rocketmq_broker_connections 6" in text


def test_heartbeat_v2_answers(broker_factory):
    broker = broker_factory(client_management_rules=5)  # heartbeat V2 is a 5.x rule (tests/test_rules.py)
    c = Client(broker.ports["main"])
    v2 = {"IS_SUPPORT_HEART_BEAT_V2": "true"}
    body = hb_body(client_id="v2@1").replace(b'"heartbeatFingerprint":0', b'"heartbeatFingerprint":77')
    answer = {"IS_SUPPORT_HEART_BEAT_V2": "true"}
    r = c.call(RequestCode.HEART_BEAT, v2, body)
    assert r.code == 0 and r.ext_fields == {**answer, "IS_SUB_CHANGE": "false"}  # first fingerprint: no change
    lite = body.replace(b'"withoutSub":false', b'"withoutSub":true')
    r = c.call(RequestCode.HEART_BEAT, v2, lite)
    assert r.code == 0 and r.ext_fields == {**answer, "IS_SUB_CHANGE": "false"}
    changed = body.replace(b'"heartbeatFingerprint":77', b'"heartbeatFingerprint":78')
    r = c.call(RequestCode.HEART_BEAT, v2, changed)
    assert r.code == 0 and r.ext_fields == {**answer, "IS_SUB_CHANGE": "true"}
    assert consumer_ids(broker, GROUP) == ["v2@1"]


def test_member_on_one_worker_is_notified_of_a_join_on_the_other(broker):
    b = broker
    a = Client(b.ports["main"])
    assert a.heartbeat(client_id="a@1").code == 0
    a.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)  # its own join
    other = Client(b.ports["main"])
    assert worker_of(b, a) != worker_of(b, other)
    assert other.heartbeat(client_id="b@1").code == 0
    n = a.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert n.flag == 2 and n.ext_fields == {"consumerGroup": GROUP}
    other.close()  # the leave on worker B is notified on worker A too
    n = a.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert n.ext_fields == {"consumerGroup": GROUP}
    assert wait_until(lambda: consumer_ids(b, GROUP) == ["a@1"])


def test_faults_on_a_worker_leave_a_client_on_the_same_worker_served(broker_factory, caplog):
    """Garbage, a 2 GiB prefix, a disconnect mid-frame and a slowloris trickle, each on the worker that also holds
    the good client: one logged reason per bad connection, the good client keeps its answers."""
    caplog.set_level(logging.INFO, logger="engine.broker.server")
    b = broker_factory(incomplete_frame_timeout_ms=500)
    port = b.ports["main"]
    good = Client(port)
    assert good.heartbeat(client_id="good@1").code == 0
    filler = Client(port)  # a client on the other worker: the bad ones must share the good one's worker
    frame = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=9, ext_fields={}, body=hb_body()).encode()

    def bad_client():
        """A new connection on the good client's worker: the hand-off goes to the least-loaded worker, which
        depends on how far the closes of earlier connections got (a loaded machine), so connect until one lands
        there and close the others."""
        home = worker_of(b, good)
        others = []
        for _ in range(8):
            c = Client(port)
            assert wait_until(lambda: worker_of(b, c) is not None)
            if worker_of(b, c) == home:
                break
            others.append(c)
        else:
            pytest.fail("no new connection was handed to the good client's worker")
        for o in others:
            o.close()
        c.addr = "%s:%d" % c.sock.getsockname()[:2]
        return c

    garbage = bad_client()
    garbage.sock.sendall(b"\x00\x00\x00\x10\x07garbage-garbage!")
    assert garbage.closed_by_peer()
    assert good.heartbeat(client_id="good@1").code == 0
    wait_until(lambda: len(b.server.connections) <= 3)
    huge = bad_client()
    huge.sock.sendall(b"\x7f\xff\xff\xf0\x00\x00\x00\x10")
    assert huge.closed_by_peer()
    wait_until(lambda: len(b.server.connections) <= 3)
    midframe = bad_client()
    assert midframe.heartbeat(client_id="mid@1").code == 0
    midframe.sock.sendall(frame[:20])
    midframe.close()
    assert wait_until(lambda: "mid@1" not in consumer_ids(b, GROUP))
    wait_until(lambda: len(b.server.connections) <= 2)
    trickle = bad_client()
    for i in range(12):
        try:
            trickle.sock.sendall(frame[i:i + 1])
        except OSError:
            break
        time.sleep(0.1)
    assert trickle.closed_by_peer(3)
    assert good.heartbeat(client_id="good@1").code == 0
    assert [r.split(":")[0].split(" (")[0] for r in closing_reasons(caplog, garbage)] == ["undecodable frame"]
    assert [r.split(":")[0] for r in closing_reasons(caplog, huge)] == ["undecodable frame"]
    assert closing_reasons(caplog, midframe) == []  # the peer closed it: nothing to blame it for
    reasons = closing_reasons(caplog, trickle)
    assert len(reasons) == 1 and reasons[0].startswith("incomplete frame"), reasons
    assert b.metrics.frame_errors == 2
    assert wait_until(lambda: consumer_ids(b, GROUP) == ["good@1"])
    filler.close()


# ---- kill -9 of a worker ---------------------------------------------------------------------------------------


def test_killed_worker_loses_its_clients_and_is_replaced(broker, caplog):
    caplog.set_level(logging.INFO, logger="engine.broker.ioworker")
    b = broker
    clients = [Client(b.ports["main"]) for _ in range(6)]
    for i, c in enumerate(clients):
        assert c.heartbeat(client_id=f"k{i}@1").code == 0
    victim = b.server.io_pool.workers[0]
    on_victim = [c for c in clients if worker_of(b, c) == 0]
    survivors = [c for c in clients if c not in on_victim]
    assert len(on_victim) == 3
    os.kill(victim.pid, signal.SIGKILL)
    for c in on_victim:
        assert c.closed_by_peer()  # the kernel closed the sockets with the process
    survivor_ids = sorted(f"k{clients.index(c)}@1" for c in survivors)
    assert wait_until(lambda: sorted(consumer_ids(b, GROUP)) == survivor_ids)  # unregistered at once, no expiry
    # the other members are told
    for c in survivors:
        c.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    died = [r for r in caplog.records if "died" in r.getMessage()]
    assert len(died) == 1 and "3 connections lost" in died[0].getMessage()
    assert wait_until(lambda: b.server.io_pool.workers[0].pid != victim.pid and b.server.io_pool.workers[0].capacity)
    assert victim.proc.poll() is not None or wait_until(lambda: victim.proc.poll() is not None)
    fresh = [Client(b.ports["main"]) for _ in range(4)]
    for i, c in enumerate(fresh):
        assert c.heartbeat(client_id=f"new{i}@1").code == 0
    assert 0 in {worker_of(b, c) for c in fresh}  # the replacement serves new connections
    for c in survivors:
        assert c.heartbeat(client_id=f"k{clients.index(c)}@1").code == 0
    assert len(b.call(lambda: list(b.server.connections))) == 7
    assert "rocketmq_broker_io_worker_replacements_total 1" in b.render_metrics()
    b.call(b.registry.check_invariants)


# ---- more connections than one worker's descriptor limit -------------------------------------------------------


def test_connections_beyond_one_workers_descriptor_limit(broker_factory, monkeypatch):
    """Workers with a soft RLIMIT_NOFILE of 300 hold 268 connections each; three hold 800 connections, all
    answered; one more than they can hold together is refused with SYSTEM_BUSY, as the in-process limit does."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2000:
        pytest.skip("the test process needs ~1700 descriptors for its own client ends")
    monkeypatch.setenv("ENGINE_IOWORKER_NOFILE", "300")
    b = broker_factory(io_workers=3, fast_port_enable=False)
    pool = b.server.io_pool
    assert [w.capacity for w in pool.workers] == [268] * 3 and b.server.max_connections == 804
    port = b.ports["main"]
    socks = []
    for i in range(800):
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    frames = [engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=i, ext_fields={},
                                     body=hb_body(client_id=f"many{i}@1")).encode() for i in range(800)]
    for s, f in zip(socks, frames):
        s.sendall(f)
    for i, s in enumerate(socks):
        dec, got = engine.FrameDecoder(), []
        while not any(c.is_response for c in got):
            data = s.recv(65536)
            assert data, f"connection {i} closed"
            got += dec.feed(data)
        (r,) = [c for c in got if c.is_response]
        assert r.code == 0 and r.opaque == i
    stats = b.call(pool.stats)
    assert sum(s["connections"] for s in stats) == 800 and max(s["connections"] for s in stats) <= 268
    assert len(consumer_ids(b, GROUP)) == 800
    extra = [Client(port) for _ in range(5)]  # 805 > 804
    answers = [c.call(RequestCode.HEART_BEAT, {}, hb_body(client_id=f"extra{i}@1")) for i, c in enumerate(extra)]
    assert [a.code for a in answers].count(ResponseCode.SYSTEM_BUSY) == 1
    busy = next(a for a in answers if a.code == ResponseCode.SYSTEM_BUSY)
    assert "too many connections" in busy.remark
    for s in socks:
        s.close()
    for c in extra:
        c.close()
    assert wait_until(lambda: consumer_ids(b, GROUP) == [], timeout=10)
    assert wait_until(lambda: sum(s["connections"] for s in b.call(pool.stats)) == 0)


def test_core_serves_its_share_in_process_and_workers_the_rest(broker_factory):
    """ioCoreConnections=3: the first three connections are served by the core itself (no relay), the rest by
    the worker; a group spread over both is one group (NOTIFY reaches every member), and a slot the core frees
    is taken by the next connection."""
    b = broker_factory(io_workers=1, io_core_connections=3, fast_port_enable=False)
    pool = b.server.io_pool
    port = b.ports["main"]
    clients = []
    for i in range(5):
        clients.append(Client(port))
        assert clients[-1].heartbeat(client_id=f"c{i}@1").code == 0
    assert b.call(pool.core_count) == 3 and b.call(lambda: len(pool.workers[0].conns)) == 2
    assert b.server.max_connections == pool.workers[0].capacity + 3
    assert sorted(consumer_ids(b, GROUP)) == [f"c{i}@1" for i in range(5)]
    # the last join notified every earlier member, in-process and relayed alike
    for c in clients[:4]:
        n = c.read(pred=lambda x: x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
        assert n.ext_fields == {"consumerGroup": GROUP}
    metrics = b.call(b.render_metrics)
    assert "rocketmq_broker_io_worker_core_connections 3" in metrics
    clients[0].close()  # a core connection
    assert wait_until(lambda: b.call(pool.core_count) == 2)
    late = Client(port)
    assert late.heartbeat(client_id="late@1").code == 0
    assert b.call(pool.core_count) == 3 and b.call(lambda: len(pool.workers[0].conns)) == 2
    for c in clients[1:] + [late]:
        c.close()
    assert wait_until(lambda: consumer_ids(b, GROUP) == [] and b.call(pool.core_count) == 0)


def test_core_connections_are_capped_by_the_core_descriptor_limit(broker_factory):
    from engine.broker.server import connection_capacity

    b = broker_factory(io_workers=1, io_core_connections=10**9, fast_port_enable=False)
    assert b.server.io_pool.core_connections == connection_capacity(10**9) < 10**9


# ---- lifecycle --------------------------------------------------------------------------------------------------


def test_graceful_stop_closes_clients_and_reaps_workers(tmp_path):
    b = Broker(make_config(tmp_path, io_workers=2)).start()
    procs = [w.proc for w in b.server.io_pool.workers]
    c = Client(b.ports["main"])
    assert c.heartbeat(client_id="bye@1").code == 0
    b.stop()
    assert c.closed_by_peer()
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", b.ports["main"]), timeout=2)


def _children(pid):
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _serve(tmp_path, *extra):
    props = tmp_path / "broker.properties"
    props.write_text(f"brokerName=broker-w\nstorePathRootDir={tmp_path / 'store'}\nflushConsumerOffsetInterval=600000\n"
                     "ioWorkers=2\n")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "-c", str(props), "--listenPort", "0",
                             "--listenHost", "127.0.0.1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = proc.stdout.readline()
    assert "boot success" in line, proc.stderr.read()
    return proc, int(line.split("127.0.0.1:")[1].split("]")[0])


def test_serve_sigterm_with_workers_persists_state(tmp_path):
    proc, port = _serve(tmp_path)
    try:
        workers = _children(proc.pid)
        assert len(workers) == 2
        c = Client(port)
        assert c.heartbeat().code == 0
        assert c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == 0
        r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": "TopicTest",
                                                        "queueId": "1", "commitOffset": "4321"})
        assert r.code == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert c.closed_by_peer()
        for pid in workers:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    offsets = json.loads((tmp_path / "store" / "config" / "consumerOffset.json").read_text())
    assert "4321" in json.dumps(offsets)


def test_workers_exit_when_the_core_dies(tmp_path):
    proc, port = _serve(tmp_path)
    try:
        workers = _children(proc.pid)
        c = Client(port)
        assert c.heartbeat().code == 0
        proc.kill()
        proc.wait(10)
        assert c.closed_by_peer()  # the worker holding it saw EOF on its link and closed its sockets

        def gone():
            return all(not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
                       for pid in workers)

        assert wait_until(gone, 10)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_io_workers_config_is_validated_and_printed(tmp_path):
    from engine.broker.config import BrokerConfig, ConfigError

    with pytest.raises(ConfigError, match="ioWorkers must be >= 0"):
        BrokerConfig.load(overrides={"ioWorkers": "-1"})
    assert BrokerConfig.load(overrides={"ioWorkers": "3"}).io_workers == 3
    assert ("ioWorkers", "0") in BrokerConfig().to_properties()
    with pytest.raises(ConfigError, match="ioCoreConnections must be >= 0"):
        BrokerConfig.load(overrides={"ioCoreConnections": "-1"})
    assert BrokerConfig.load(overrides={"ioCoreConnections": "19000"}).io_core_connections == 19000


# ---- the link protocol -----------------------------------------------------------------------------------------


def test_records_split_across_reads_and_descriptors_ride_with_their_records():
    """Drive two link ends directly: records of every size split at every boundary arrive whole and in order,
    and more descriptors than one sendmsg may carry reach the worker side in the order of their NEW records."""
    import asyncio

    from engine.broker.ioworker import NEW, WRITE, _Link

    loop = asyncio.new_event_loop()
    a, bsock = socket.socketpair()
    got, fds_in_order = [], []
    link_b = None

    def on_record(kind, cid, payload):
        got.append((kind, cid, bytes(payload)))
        if kind == NEW:
            fds_in_order.append((cid, link_b.fdq.popleft()))

    link_a = _Link(loop, a, lambda *x: None, lambda e: None)
    link_b = _Link(loop, bsock, on_record, lambda e: None, recv_fds=True)
    sent, opened = [], []
    for i in range(600):
        payload = os.urandom(i * 37 % 5000)
        link_a.record(WRITE, i, payload)
        sent.append((WRITE, i, payload))
        if i % 2 == 0:  # a descriptor whose identity the receiver can check: a pipe end named by its inode
            r, w = os.pipe()
            opened.append((i, os.fstat(r).st_ino))
            os.close(w)
            link_a.record_fd(NEW, 10_000 + i, b"meta", r)
            sent.append((NEW, 10_000 + i, b"meta"))

    async def pump():
        while len(got) < len(sent):
            await asyncio.sleep(0.01)

    loop.run_until_complete(asyncio.wait_for(pump(), 10))
    assert got == sent
    assert [os.fstat(fd).st_ino for _, fd in fds_in_order] == [ino for _, ino in opened]
    assert len(fds_in_order) == 300 > 253
    for _, fd in fds_in_order:
        os.close(fd)
    link_a.close()
    link_b.close()
    loop.close()
    assert HEADER.size == 13


def test_a_worker_that_cannot_start_fails_the_broker_start(tmp_path, monkeypatch):
    """A worker that exits before its HELLO fails the start (no half-started broker), and the ports are closed."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    b = Broker(make_config(tmp_path, io_workers=2))
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        b.start()

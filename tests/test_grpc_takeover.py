"""A 5.x client whose connection died without a close (a NAT dropping it, a host gone) comes back on a new
connection: the server's keepalive ping finds the dead connection, and the session of a connection silent for
grpcSessionTakeoverSilenceMs may be taken over by the client's new connection (its address and shares move with
it); before that the new connection is refused. A terminated session's stream ends after grpcSettingsTimeoutMs.
Scaled down: lower silences, keepalive times and timeouts."""
import socket
import threading
import time

import pytest

from conftest import require_module
from engine.broker.controller import Broker

grpc = require_module("grpc")
require_module("rocketmq.grpc_protocol")
from rocketmq.grpc_protocol import definition_pb2 as d  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as s  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as sg  # noqa: E402

import engine.broker.grpc_endpoint as ge  # noqa: E402
from test_grpc_endpoint import Telemetry, consumer_settings, consumers, free_port, md, wait_until  # noqa: E402
from test_grpc_endpoint import grpc_transport  # noqa: E402,F401  (fixture: every test on both transports)
from test_grpc_guard import Relay, channel_to, refused_stream, start_session  # noqa: E402
from test_server import make_config  # noqa: E402

Code = d.Code


class FreezingRelay(Relay):
    """A Relay (from 127.0.0.2) that, once frozen, forwards nothing more either way and closes nothing: to both
    ends the connection is alive and silent, as one a NAT dropped."""

    def __init__(self, port):
        self.frozen = threading.Event()
        self.sockets = []  # kept open for ever
        super().__init__(port)

    def _accept(self):
        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target), source_address=(self.source, 0))
            self.sockets += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    def _pipe(self, x, y):
        try:
            while (data := x.recv(65536)) and not self.frozen.is_set():
                y.sendall(data)
        except OSError:
            return
        threading.Event().wait()  # frozen (or one end closed): nothing forwarded, nothing closed

    def close(self):
        super().close()
        for sock in self.sockets:
            sock.close()


def heartbeat(stub, client_id, group):
    hb = s.HeartbeatRequest(client_type=d.ClientType.PUSH_CONSUMER)
    hb.group.name = group
    return stub.Heartbeat(hb, metadata=md(client_id), timeout=5).status.code


@pytest.fixture
def relay_broker(tmp_path, request):
    def start(**config):
        b = Broker(make_config(tmp_path, grpc_server_port=free_port(), **config)).start()
        relay = FreezingRelay(b.ports["grpc"])
        request.addfinalizer(b.stop)
        request.addfinalizer(relay.close)
        return b, relay
    return start


def test_a_silent_connections_session_is_taken_over_by_its_clients_new_connection(relay_broker):
    """The client's first connection (through the relay, from 127.0.0.2) goes silent without a close; the client
    reconnects directly (127.0.0.1) with the same id. Within grpcSessionTakeoverSilenceMs its new connection is
    refused (Heartbeat FORBIDDEN, Telemetry PERMISSION_DENIED); after it, its Telemetry takes the session over,
    its Heartbeat registers, and the session's address and per-address shares are the new connection's."""
    silence = 1.5
    b, relay = relay_broker(grpc_session_takeover_silence_ms=int(silence * 1000))
    ep = b.grpc
    far = sg.MessagingServiceStub(channel_to(relay.port, own_connection=True))
    old, answer = start_session(far, "back@1", consumer_settings("GroupBack", [("TopicBack", "*")]))
    assert answer.status.code == Code.OK
    assert heartbeat(far, "back@1", "GroupBack") == Code.OK
    assert ep.sessions["back@1"].remote_addr.startswith("127.0.0.2:")
    relay.frozen.set()
    silent_since = time.monotonic()
    near = sg.MessagingServiceStub(channel_to(b.ports["grpc"], own_connection=True))
    # before the silence interval: refused
    assert heartbeat(near, "back@1", "GroupBack") == Code.FORBIDDEN
    t = Telemetry(near, md("back@1"))
    t.send(settings=consumer_settings("GroupBack", [("TopicBack", "*")]))
    assert refused_stream(t).code() == grpc.StatusCode.PERMISSION_DENIED
    assert time.monotonic() - silent_since < silence  # (the refusals above came within the interval)
    assert ep.refused["foreign_client_id"] == 2 and ep.takeovers == 0
    # after it: taken over
    time.sleep(silence + 0.2 - (time.monotonic() - silent_since))
    new, answer = start_session(near, "back@1", consumer_settings("GroupBack", [("TopicBack", "*")]))
    assert answer.status.code == Code.OK
    assert heartbeat(near, "back@1", "GroupBack") == Code.OK
    assert ep.takeovers == 1 and ep.refused["foreign_client_id"] == 2
    session = ep.sessions["back@1"]
    # the address moved (the registry's too), and with it the address's and the connection's shares
    assert session.remote_addr.startswith("127.0.0.1:") and session.ip == "127.0.0.1"
    assert session.stream.peer == session.peer and ge.peer_address(session.peer) == session.remote_addr
    assert [c["clientAddr"] for c in consumers(b, "GroupBack")["connectionSet"]] == [session.remote_addr]
    assert b.call(lambda: (dict(ep._ip_sessions), set(ep._ip_groups), set(ep._ip_cost), dict(ep._conn_sessions))) \
        == ({"127.0.0.1": 1}, {"127.0.0.1"}, {"127.0.0.1"}, {session.peer: 1})
    # the new connection owns it now: the new stream serves it
    new.send(settings=consumer_settings("GroupBack", [("TopicBack", "TagB")]))
    assert new.recv().status.code == Code.OK
    new.end()
    wait_until(lambda: "back@1" not in ep.sessions, timeout=5)
    assert b.call(lambda: (dict(ep._ip_sessions), ep._ip_groups, dict(ep._ip_cost), ep.settings_cost,
                           dict(ep._conn_sessions))) == ({}, {}, {}, 0, {})


def test_a_heartbeat_takes_over_a_silent_session_too(relay_broker):
    b, relay = relay_broker(grpc_session_takeover_silence_ms=500)
    far = sg.MessagingServiceStub(channel_to(relay.port, own_connection=True))
    old, answer = start_session(far, "hb@1", consumer_settings("GroupHb", [("TopicHb", "*")]))
    assert answer.status.code == Code.OK
    relay.frozen.set()
    near = sg.MessagingServiceStub(channel_to(b.ports["grpc"], own_connection=True))
    assert heartbeat(near, "hb@1", "GroupHb") == Code.FORBIDDEN
    time.sleep(0.7)
    assert heartbeat(near, "hb@1", "GroupHb") == Code.OK
    assert b.grpc.takeovers == 1 and "hb@1" in b.grpc.sessions
    t, answer = start_session(near, "hb@1", consumer_settings("GroupHb", [("TopicHb", "*")]))
    assert answer.status.code == Code.OK
    assert b.grpc.sessions["hb@1"].remote_addr.startswith("127.0.0.1:")


def test_a_takeover_that_does_not_fit_the_new_address_is_refused(relay_broker):
    """The shares move with a taken-over session, checked as a new session's: into an address at its
    grpcMaxSessionsPerIp the takeover ends RESOURCE_EXHAUSTED and the session keeps its old address's shares."""
    b, relay = relay_broker(grpc_session_takeover_silence_ms=300)
    ep = b.grpc
    near = sg.MessagingServiceStub(channel_to(b.ports["grpc"], own_connection=True))
    other, answer = start_session(near, "other@1", consumer_settings("GroupOther", [("TopicO", "*")]))
    assert answer.status.code == Code.OK
    far = sg.MessagingServiceStub(channel_to(relay.port, own_connection=True))
    _, answer = start_session(far, "mv@1", consumer_settings("GroupMv", [("TopicMv", "*")]))
    assert answer.status.code == Code.OK
    ep.max_sessions_per_ip = 1
    relay.frozen.set()
    time.sleep(0.5)
    t = Telemetry(near, md("mv@1"))
    t.send(settings=consumer_settings("GroupMv", [("TopicMv", "*")]))
    assert refused_stream(t).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ep.refused["sessions_per_ip"] == 1
    session = ep.sessions["mv@1"]
    assert session.ip == "127.0.0.2" and b.call(lambda: dict(ep._ip_sessions)) == {"127.0.0.1": 1, "127.0.0.2": 1}


def test_keepalive_ends_the_session_of_a_connection_that_died_silently(relay_broker, monkeypatch):
    """The server's keepalive ping is not answered through the frozen relay: the connection is closed, its stream
    ends and its session is removed (with the takeover silence far away); a live idle connection answers the pings
    and keeps its session."""
    monkeypatch.setattr(ge, "KEEPALIVE_TIME_MS", 300)
    monkeypatch.setattr(ge, "KEEPALIVE_TIMEOUT_MS", 300)
    b, relay = relay_broker()
    far = sg.MessagingServiceStub(channel_to(relay.port, own_connection=True))
    near = sg.MessagingServiceStub(channel_to(b.ports["grpc"], own_connection=True))
    _, answer = start_session(far, "dead@1", consumer_settings("GroupDead", [("TopicDead", "*")]))
    assert answer.status.code == Code.OK
    live, answer = start_session(near, "live@1", consumer_settings("GroupLive", [("TopicLive", "*")]))
    assert answer.status.code == Code.OK
    relay.frozen.set()
    wait_until(lambda: "dead@1" not in b.grpc.sessions, timeout=10)
    assert consumers(b, "GroupDead") is None
    time.sleep(1.0)  # several keepalive rounds: the live connection answers them
    assert "live@1" in b.grpc.sessions
    live.send(settings=consumer_settings("GroupLive", [("TopicLive", "*")]))
    assert live.recv().status.code == Code.OK
    # the client comes back at once on a new connection
    t, answer = start_session(near, "dead@1", consumer_settings("GroupDead", [("TopicDead", "*")]))
    assert answer.status.code == Code.OK and b.grpc.takeovers == 0


def test_clients_own_keepalive_pings_are_accepted(relay_broker, monkeypatch):
    """A client pinging as often as MIN_CLIENT_PING_INTERVAL_MS allows (grpc-java's and grpc-go's 10 s, scaled
    down) keeps its connection: no GOAWAY for too many pings ends its stream."""
    monkeypatch.setattr(ge, "MIN_CLIENT_PING_INTERVAL_MS", 100)
    b, _ = relay_broker()
    channel = grpc.insecure_channel(f"127.0.0.1:{b.ports['grpc']}", options=[
        ("grpc.keepalive_time_ms", 150), ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)])
    states = []
    channel.subscribe(states.append)
    stub = sg.MessagingServiceStub(channel)
    t, answer = start_session(stub, "pinger@1", consumer_settings("GroupPing", [("TopicPing", "*")]))
    assert answer.status.code == Code.OK
    time.sleep(6.0)  # grpcio's client pings once a second at most: grpcio's GOAWAY comes after its 3rd strike
    t.send(settings=consumer_settings("GroupPing", [("TopicPing", "*")]))
    assert t.recv().status.code == Code.OK
    assert "pinger@1" in b.grpc.sessions
    assert states[-1] == grpc.ChannelConnectivity.READY and states.count(grpc.ChannelConnectivity.READY) == 1
    channel.close()


def test_a_terminated_sessions_stream_ends_after_the_settings_timeout(relay_broker):
    """After NotifyClientTermination the stream is the client's to close; one it leaves open ends after
    grpcSettingsTimeoutMs (it was kept for channelExpiredTimeout)."""
    b, _ = relay_broker(grpc_settings_timeout_ms=500)
    stub = sg.MessagingServiceStub(channel_to(b.ports["grpc"]))
    t, answer = start_session(stub, "bye@1", consumer_settings("GroupBye", [("TopicBye", "*")]))
    assert answer.status.code == Code.OK
    term = s.NotifyClientTerminationRequest()
    term.group.name = "GroupBye"
    assert stub.NotifyClientTermination(term, metadata=md("bye@1")).status.code == Code.OK
    assert not t.call.done()  # left to the client at first
    wait_until(t.call.done, timeout=5)
    assert list(t.call) == [] and "bye@1" not in b.grpc.sessions
    # Settings again on a terminated session's stream make it a session again, and it is not ended then
    t2, answer = start_session(stub, "again@1", consumer_settings("GroupBye", [("TopicBye", "*")]))
    term.group.name = "GroupBye"
    assert stub.NotifyClientTermination(term, metadata=md("again@1")).status.code == Code.OK
    t2.send(settings=consumer_settings("GroupBye", [("TopicBye", "*")]))
    assert t2.recv().status.code == Code.OK
    time.sleep(1.0)
    assert not t2.call.done() and "again@1" in b.grpc.sessions
    t2.end()

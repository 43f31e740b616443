"""The official 5.x clients over TLS (issue 30: "TLS where the 5.x SDKs use it"): the Python client 5.1.2
(``tls_enable=True``) and the Node.js client 1.0.8 (``sslEnabled: true``) against a broker whose gRPC port speaks TLS
only (grpcTlsCertPath / grpcTlsKeyPath), on both transports. Each client's producer and push consumer register, are
listed, heartbeat (the repeat path), and leave at their shutdown. The port takes no plaintext (test_grpc_endpoint's
test_tls_with_alpn_h2), so a client listed here spoke TLS; the clients check the broker's certificate against the
roots they are given (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, read by grpc's C core and by grpc-js), here the test's
self-signed certificate, and a client that does not trust it never starts.
"""
import subprocess

import pytest

import test_grpc_interop as gi
import test_interop as ti
from test_interop import drivers  # noqa: F401  (fixtures)
from conftest import free_port, require_module
from test_grpc_interop import connections, grpc_transport, start_v5, v5_python, write_topics  # noqa: F401
from test_grpc_node_interop import start_v5_node, v5_node_dir  # noqa: F401

pytestmark = pytest.mark.interop


def self_signed(tmp_path, name):
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""
    cert, key = tmp_path / f"{name}-cert.pem", tmp_path / f"{name}-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", f"/CN=rmqhb-{name}", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_broker(tmp_path, monkeypatch):
    """A broker whose gRPC port is TLS only, with a certificate for 127.0.0.1 that the clients started by the test
    trust (and only they: the variable is the test's)."""
    require_module("grpc")
    cert, key = self_signed(tmp_path, "broker")
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(cert))
    write_topics(tmp_path / "store")
    b = gi.BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                     grpc_server_port=free_port(), grpc_tls_cert_path=str(cert), grpc_tls_key_path=str(key))
    from engine.broker.controller import Broker

    broker = Broker(b).start()
    yield broker
    broker.stop()


def _registers_over_tls(broker, d, group, topic, language):
    producer_id, push_id = d.ready_line.split()[1:]
    assert ti.wait_for(lambda: connections(broker, group) == [(push_id, language)])
    assert ti.wait_for(lambda: connections(broker, topic, producer=True) == [(producer_id, language)])
    # their second Heartbeat on (10 s apart in the clients, shortened here) is answered on the repeat path
    assert ti.wait_for(lambda: broker.grpc.heartbeat_repeats >= 2, timeout=60)
    assert d.close() == 0
    assert connections(broker, group) is None and connections(broker, topic, producer=True) is None
    assert ti.wait_for(lambda: broker.grpc.sessions == {})
    assert broker.grpc.internal_errors == 0


def test_the_python_5x_client_over_tls(v5_python, drivers, tls_broker, tmp_path):  # noqa: F811
    d = start_v5(v5_python, drivers, tls_broker, tmp_path / "scratch", tls=True, heartbeatSeconds=2,
                 producerTopics=["TopicV5"], pushConsumers=[{"group": "GID_V5_TLS", "topic": "TopicV5", "expr": "*"}])
    _registers_over_tls(tls_broker, d, "GID_V5_TLS", "TopicV5", "PYTHON")


def test_the_node_5x_client_over_tls(v5_node_dir, drivers, tls_broker, tmp_path):  # noqa: F811
    d = start_v5_node(v5_node_dir, drivers, tls_broker, tmp_path / "scratch", tls=True, heartbeatIntervalMs=2000,
                      producerTopics=["TopicNode"],
                      pushConsumers=[{"group": "GID_NODE_TLS", "topic": "TopicNode", "expr": "*"}])
    _registers_over_tls(tls_broker, d, "GID_NODE_TLS", "TopicNode", "HTTP")


def test_a_client_that_does_not_trust_the_certificate_never_registers(v5_python, drivers, tls_broker, tmp_path,  # noqa
                                                                      monkeypatch):
    """The same Python client trusting another certificate: its handshakes fail their certificate check (its log
    says so), so nothing registers while it runs and heartbeats (the broker counts no error of its own)."""
    import time

    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(self_signed(tmp_path, "other")[0]))
    d = start_v5(v5_python, drivers, tls_broker, tmp_path / "scratch", may_fail=True, tls=True, heartbeatSeconds=1,
                 producerTopics=["TopicV5"], pushConsumers=[{"group": "GID_V5_TLS", "topic": "TopicV5", "expr": "*"}])
    logs = tmp_path / "scratch" / "logs"
    assert ti.wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in "".join(
        p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file()), timeout=60)
    time.sleep(3)  # a few more of its heartbeats
    assert tls_broker.grpc.sessions == {} and connections(tls_broker, "GID_V5_TLS") is None
    assert connections(tls_broker, "TopicV5", producer=True) is None
    assert tls_broker.grpc.internal_errors == 0
    d.close()

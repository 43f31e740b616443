"""The official RocketMQ 5.x Python client (PyPI rocketmq-python-client 5.1.2, gRPC) against the broker's gRPC
endpoint (grpcServerPort): a producer, a push consumer and a simple consumer start, are listed with language PYTHON
next to 4.x clients, and are gone after their shutdown.

The test installs the client itself, pinned with its whole dependency tree (tests/interop/v5/requirements.txt),
into a venv of its own, tests/interop/.v5 (gitignored): the 5.x client's top-level package is ``rocketmq``, the
same name as PyPI ``rocketmq`` 0.4.4 (the 4.x C++ client of test_interop, pip --target tests/interop/.cpp, run with
PYTHONPATH pointing there), so the two never share an interpreter's path. Outside CI a registry that cannot be
reached skips; under ``CI=true`` / ``ENGINE_REQUIRE_PEERS=1`` any install failure fails the test.
"""
import json
import os
import subprocess
import sys
import types

import pytest

import test_interop as ti
from test_interop import cpp_dir, drivers  # noqa: F401  (fixtures)
from conftest import free_port, require_module
from engine.broker.admin import AdminClient, AdminError
from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig

pytestmark = pytest.mark.interop

#: the transport of the gRPC port of the brokers this module starts (set by the grpc_transport fixture)
TRANSPORT = {"name": "grpcio"}
_BrokerConfig = BrokerConfig


@pytest.fixture(autouse=True, params=["grpcio", "native"])
def grpc_transport(request, monkeypatch):
    """Every test on both transports of the gRPC port (grpcTransport): grpcio's and engine.http2's (issue 30)."""
    monkeypatch.setitem(TRANSPORT, "name", request.param)
    monkeypatch.setattr(sys.modules[__name__], "BrokerConfig",
                        lambda **kw: _BrokerConfig(**{"grpc_transport": request.param, **kw}))
    return request.param


V5_DIR = ti.HERE / ".v5"
V5_REQUIREMENTS = ti.HERE / "v5" / "requirements.txt"
V5_VERSION = "5.1.2"


def _v5_python():
    return V5_DIR / "bin" / "python"


def _installed_v5_version():
    try:
        p = subprocess.run([str(_v5_python()), "-c", "import importlib.metadata as m; "
                            "print(m.version('rocketmq-python-client'))"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return p.stdout.strip() if p.returncode == 0 else None


@pytest.fixture(scope="session")
def v5_python():
    """The interpreter of tests/interop/.v5, with the pinned 5.x client installed (installed here when missing)."""
    req = V5_REQUIREMENTS.read_bytes()
    stamp = V5_DIR / ".requirements-installed"
    if not stamp.is_file() or stamp.read_bytes() != req or _installed_v5_version() != V5_VERSION:
        if not _v5_python().is_file():
            ti._install([sys.executable, "-m", "venv", "--clear", str(V5_DIR)], "python -m venv tests/interop/.v5")
        ti._install([str(_v5_python()), "-m", "pip", "install", "-q", "-r", str(V5_REQUIREMENTS)],
                    f"pip rocketmq-python-client=={V5_VERSION} (tests/interop/v5/requirements.txt)", timeout=600)
        stamp.write_bytes(req)
    assert _installed_v5_version() == V5_VERSION
    return _v5_python()



#: the topics the clients of these tests use (of both the Python and the Node files): a 5.x client's route query for
#: an unknown topic is TOPIC_NOT_FOUND (as from the proxy, whose name server routes only created topics), so they are
#: created before the broker starts, as an operator creates them for a 5.x cluster
TOPICS = ("TopicV5", "TopicMixed", "TopicAcl", "TopicRestart", "TopicNode", "TopicNodeS", "TopicMixedNode",
          "TopicNodeRestart")


def write_topics(store):
    """``store``'s config/topics.json with TOPICS (4 queues each), read by the broker at its start."""
    from engine.registry.topic_config_manager import TopicConfig

    config = store / "config"
    config.mkdir(parents=True, exist_ok=True)
    table = {t: TopicConfig(t, 4, 4).to_dict() for t in TOPICS}
    (config / "topics.json").write_text(json.dumps({"topicConfigTable": table}))


@pytest.fixture
def gbroker(tmp_path):
    require_module("grpc")  # the broker's grpc extra (its own interpreter): a failure under CI, never a skip
    write_topics(tmp_path / "store")
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                            grpc_server_port=free_port())).start()
    yield b
    b.stop()


def start_v5(v5_python, drivers, broker, scratch, may_fail=False, **spec):  # noqa: F811
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HOME"] = str(scratch)
    spec = dict(spec, endpoint=f"127.0.0.1:{broker.ports['grpc']}")
    d = ti.Driver([str(v5_python), str(ti.HERE / "v5_driver.py"), json.dumps(spec)], env, may_fail)
    drivers.append(d)
    return d


def connections(broker, group, producer=False, **kw):
    try:
        with AdminClient("127.0.0.1", broker.ports["main"], **kw) as c:
            body = c.producer_connection(group) if producer else c.consumer_connection(group)
    except AdminError:
        return None
    return sorted((x["clientId"], x["language"]) for x in body.get("connectionSet") or [])


def test_producer_push_and_simple_consumer_register_are_listed_and_leave(v5_python, drivers, gbroker,  # noqa: F811
                                                                         tmp_path):
    d = start_v5(v5_python, drivers, gbroker, tmp_path / "scratch", producerTopics=["TopicV5"],
                 pushConsumers=[{"group": "GID_V5_PUSH", "topic": "TopicV5", "expr": "TagA || TagB"}],
                 simpleConsumers=[{"group": "GID_V5_SIMPLE", "topic": "TopicV5"}], receive=True)
    producer_id, push_id, simple_id = d.ready_line.split()[1:]
    assert ti.wait_for(lambda: connections(gbroker, "GID_V5_PUSH") == [(push_id, "PYTHON")])
    assert ti.wait_for(lambda: connections(gbroker, "GID_V5_SIMPLE") == [(simple_id, "PYTHON")])
    # the proxy's producer group of a 5.x producer is its topic
    assert ti.wait_for(lambda: connections(gbroker, "TopicV5", producer=True) == [(producer_id, "PYTHON")])
    # as a user lists them: rmqhb consumerConnection over the remoting port
    rc, out, err = ti.admin_cli("consumerConnection", "-g", "GID_V5_PUSH", "-b",
                                f"127.0.0.1:{gbroker.ports['main']}", "--json")
    assert rc == 0, err
    body = json.loads(out)
    assert body["consumeType"] == "CONSUME_PASSIVELY"
    assert body["subscriptionTable"]["TopicV5"]["tagsSet"] == ["TagA", "TagB"]
    # the simple consumer's receive is answered "no new message" after its long poll (no message store)
    assert d._expect("RECEIVED", 60) == "RECEIVED 0"
    assert d.close() == 0
    # NotifyClientTermination at shutdown: every registration is gone at once
    assert connections(gbroker, "GID_V5_PUSH") is None and connections(gbroker, "GID_V5_SIMPLE") is None
    assert connections(gbroker, "TopicV5", producer=True) is None
    assert ti.wait_for(lambda: gbroker.grpc.sessions == {})


def test_a_mixed_group_of_a_5x_python_and_a_4x_cpp_consumer_is_listed_whole(v5_python, cpp_dir, drivers,  # noqa
                                                                              gbroker, tmp_path):
    cpp = ti.start_cpp(cpp_dir, drivers, gbroker.ports["main"], tmp_path / "cpp",
                       consumers=[{"group": "GID_MIXED", "topic": "TopicMixed", "expr": "*"}])
    v5 = start_v5(v5_python, drivers, gbroker, tmp_path / "v5",
                  pushConsumers=[{"group": "GID_MIXED", "topic": "TopicMixed", "expr": "*"}])
    v5_id = v5.ready_line.split()[1]
    assert ti.wait_for(lambda: sorted(lang for _, lang in connections(gbroker, "GID_MIXED") or []) == ["CPP", "PYTHON"])
    assert (v5_id, "PYTHON") in connections(gbroker, "GID_MIXED")
    assert v5.close() == 0
    assert [lang for _, lang in connections(gbroker, "GID_MIXED")] == ["CPP"]
    cpp.close(tolerate_crash=True)
    assert ti.wait_for(lambda: connections(gbroker, "GID_MIXED") is None)


def test_the_two_rocketmq_packages_stay_apart(v5_python, cpp_dir):  # noqa: F811
    """The 4.x C++ client (PYTHONPATH=tests/interop/.cpp under the broker's interpreter, which has the 5.x client's
    generated modules through the grpc extra) and the 5.x client (its own venv) each import their own package."""
    code = "import rocketmq; print(rocketmq.__file__)"
    cpp = subprocess.run([sys.executable, "-c", code + "; import rocketmq.client"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=str(cpp_dir)))
    assert cpp.returncode == 0, cpp.stderr
    assert cpp.stdout.strip().startswith(str(cpp_dir))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    v5 = subprocess.run([str(v5_python), "-c", code + "; import rocketmq.v5.producer"], capture_output=True,
                        text=True, timeout=60, env=env)
    assert v5.returncode == 0, v5.stderr
    assert v5.stdout.strip().startswith(str(V5_DIR))


ACL = """\
accounts:
- accessKey: rocketmq2
  secretKey: "12345678"
  admin: true
- accessKey: v5ak
  secretKey: v5-secret
  defaultTopicPerm: DENY
  defaultGroupPerm: DENY
  topicPerms:
  - TopicAcl=PUB|SUB
  groupPerms:
  - GID_ACL=SUB
"""
ADMIN = {"access_key": "rocketmq2", "secret_key": "12345678"}


@pytest.fixture
def acl_gbroker(tmp_path):
    require_module("grpc")
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    write_topics(tmp_path / "store")
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"),
                            grpc_server_port=free_port(), acl_enable=True, acl_file=str(acl))).start()
    yield b
    b.stop()


def test_signed_clients_are_checked_against_plain_acl(v5_python, drivers, acl_gbroker, tmp_path):  # noqa: F811
    """aclEnable: the real 5.x client with Credentials(AK, SK) signs every call (MQv2-HMAC-SHA1 over
    x-mq-date-time) and is let in by the plain_acl.yml account; with a wrong secret its start fails on the broker's
    UNAUTHORIZED (40100) and nothing registers."""
    spec = dict(producerTopics=["TopicAcl"], pushConsumers=[{"group": "GID_ACL", "topic": "TopicAcl", "expr": "*"}],
                accessKey="v5ak")
    d = start_v5(v5_python, drivers, acl_gbroker, tmp_path / "good", secretKey="v5-secret", **spec)
    producer_id, push_id = d.ready_line.split()[1:]
    assert ti.wait_for(lambda: connections(acl_gbroker, "GID_ACL", **ADMIN) == [(push_id, "PYTHON")])
    assert ti.wait_for(lambda: connections(acl_gbroker, "TopicAcl", True, **ADMIN) == [(producer_id, "PYTHON")])
    assert d.close() == 0
    assert connections(acl_gbroker, "GID_ACL", **ADMIN) is None
    assert acl_gbroker.grpc.acl_denied == 0
    bad = start_v5(v5_python, drivers, acl_gbroker, tmp_path / "bad", may_fail=True, secretKey="not-the-secret",
                   **spec)
    assert bad.ready_line.startswith("FAILED")
    log = (tmp_path / "bad" / "logs" / "rocketmq_python" / "rocketmq_client.log").read_text()
    assert "40100, Check signature failed for accessKey='v5ak'" in log
    assert acl_gbroker.grpc.acl_denied > 0 and acl_gbroker.grpc.sessions == {}
    assert connections(acl_gbroker, "GID_ACL", **ADMIN) is None
    assert connections(acl_gbroker, "TopicAcl", True, **ADMIN) is None


def _serve(store, main_port, grpc_port, log_file):
    """`rmqhb serve` with the gRPC endpoint, as its own process (SIGTERM: a graceful stop), its log to log_file."""
    if not (store / "config" / "topics.json").exists():
        write_topics(store)
    with open(log_file, "a") as err:
        proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--listenPort", str(main_port),
                                 "--listenHost", "127.0.0.1", "--fastPortEnable", "false", "--grpcServerPort",
                                 str(grpc_port), "--grpcTransport", TRANSPORT["name"], "--storePathRootDir", str(store), "--log-level", "WARNING"],
                                cwd=str(ti.ROOT), env=dict(os.environ, PYTHONPATH=str(ti.ROOT)), stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if "boot success" not in line:
        proc.kill()
        raise AssertionError(f"rmqhb serve did not start: {line!r}")
    return proc


def test_clients_are_listed_again_after_a_broker_restart(v5_python, drivers, tmp_path):  # noqa: F811
    """The broker process stops (SIGTERM) and starts again on the same ports and store: the running 5.x clients
    (producer, push and simple consumer) are listed again at their first heartbeat once their channels have
    reconnected (every 10 s; the Python client does not send its Settings again by itself before 300 s: the broker
    registers them from the Settings its graceful stop saved), and are gone after their shutdown."""
    require_module("grpc")
    broker = types.SimpleNamespace(ports={"main": free_port(), "grpc": free_port()})
    store = tmp_path / "store"
    log_file = tmp_path / "broker.log"
    proc = _serve(store, broker.ports["main"], broker.ports["grpc"], log_file)
    try:
        d = start_v5(v5_python, drivers, broker, tmp_path / "scratch", producerTopics=["TopicRestart"],
                     pushConsumers=[{"group": "GID_RESTART_PUSH", "topic": "TopicRestart", "expr": "TagA"}],
                     simpleConsumers=[{"group": "GID_RESTART_SIMPLE", "topic": "TopicRestart"}])
        producer_id, push_id, simple_id = d.ready_line.split()[1:]

        def listed():
            return (connections(broker, "GID_RESTART_PUSH") == [(push_id, "PYTHON")]
                    and connections(broker, "GID_RESTART_SIMPLE") == [(simple_id, "PYTHON")]
                    and connections(broker, "TopicRestart", producer=True) == [(producer_id, "PYTHON")])

        assert ti.wait_for(listed)
        proc.terminate()
        assert proc.wait(60) == 0
        with pytest.raises(OSError):  # the broker is down
            connections(broker, "GID_RESTART_PUSH")
        proc = _serve(store, broker.ports["main"], broker.ports["grpc"], log_file)
        # within a heartbeat interval of the client's channel reconnecting: grpc's reconnect backoff (1 s, x1.6 per
        # failed attempt, jittered, at most 120 s) grows while the broker is down, longer on a loaded machine
        assert ti.wait_for(listed, timeout=150), log_file.read_text()[-3000:]
        assert d.close() == 0
        assert ti.wait_for(lambda: connections(broker, "GID_RESTART_PUSH") is None
                           and connections(broker, "GID_RESTART_SIMPLE") is None
                           and connections(broker, "TopicRestart", producer=True) is None)
    finally:
        proc.terminate()
        proc.wait(60)

"""The official RocketMQ 5.x Node.js client (npm rocketmq-client-nodejs 1.0.8, apache/rocketmq-clients nodejs/, gRPC)
against the broker's gRPC endpoint (grpcServerPort): a producer, a push consumer and a simple consumer start, are
listed with their groups and subscriptions next to 4.x and Python 5.x clients of the same group, and are gone after
their shutdown.

Language: this client sends ``x-mq-language: HTTP`` on every call (BaseClient.getRequestMetadata, with a FIXME: the
proxy's ``LanguageCode.valueOf`` rejected the ``nodejs`` it sent before), and ``NODE_JS`` only inside its Settings'
user agent. The proxy lists a channel with ``LanguageCode.valueOf(ctx.getLanguage())`` (ClientActivity), so a real
RocketMQ 5.x proxy lists these clients as HTTP, and so does this broker; the tests check both values.

The test installs the client itself, with its whole dependency tree pinned by the lockfile in tests/interop/v5node
(`npm ci` into tests/interop/.v5node, gitignored). Outside CI a registry that cannot be reached skips; under
``CI=true`` / ``ENGINE_REQUIRE_PEERS=1`` any install failure fails the test.
"""
import json
import os
import types

import pytest

import test_interop as ti
from test_interop import drivers, ons_dir  # noqa: F401  (fixtures)
from conftest import require_module
from test_grpc_interop import (ADMIN, _serve, acl_gbroker, connections, free_port, gbroker,  # noqa: F401
                               grpc_transport, start_v5, v5_python)

pytestmark = pytest.mark.interop

V5_NODE_DIR = ti.HERE / ".v5node"
V5_NODE_LOCK_DIR = ti.HERE / "v5node"  # package.json + package-lock.json: the client and its tree, pinned
V5_NODE_PACKAGE = "rocketmq-client-nodejs"
V5_NODE_VERSION = "1.0.8"


def _installed_v5_node_version():
    try:
        return json.loads((V5_NODE_DIR / "node_modules" / V5_NODE_PACKAGE / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="session")
def v5_node_dir():
    """tests/interop/.v5node with the pinned client installed (installed here, `npm ci`, when missing or stale)."""
    lock = (V5_NODE_LOCK_DIR / "package-lock.json").read_bytes()
    stamp = V5_NODE_DIR / ".lock-installed"
    if _installed_v5_node_version() != V5_NODE_VERSION or not stamp.is_file() or stamp.read_bytes() != lock:
        V5_NODE_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            (V5_NODE_DIR / name).write_bytes((V5_NODE_LOCK_DIR / name).read_bytes())
        # npm ci installs exactly the lockfile's tree (versions and integrity hashes), or fails
        ti._install(["npm", "ci", "--no-audit", "--no-fund"],
                    f"npm ci ({V5_NODE_PACKAGE} {V5_NODE_VERSION}, lockfile)", cwd=V5_NODE_DIR)
        stamp.write_bytes(lock)
    assert _installed_v5_node_version() == V5_NODE_VERSION
    return V5_NODE_DIR


def start_v5_node(v5_node_dir, drivers, broker, scratch, may_fail=False, **spec):  # noqa: F811
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, V5_NODE_DIR=str(v5_node_dir), HOME=str(scratch))
    spec = dict(spec, endpoint=f"127.0.0.1:{broker.ports['grpc']}")
    d = ti.Driver(["node", str(ti.HERE / "v5_node_driver.js"), json.dumps(spec)], env, may_fail)
    drivers.append(d)
    return d


def admin_json(broker, *args):
    rc, out, err = ti.admin_cli(*args, "-b", f"127.0.0.1:{broker.ports['main']}", "--json")
    assert rc == 0, err
    return json.loads(out)


def test_lockfile_pins_the_node_5x_client_and_its_whole_tree():
    pkg = json.loads((V5_NODE_LOCK_DIR / "package.json").read_text())
    lock = json.loads((V5_NODE_LOCK_DIR / "package-lock.json").read_text())
    assert pkg["dependencies"] == {V5_NODE_PACKAGE: V5_NODE_VERSION}
    packages = {k: v for k, v in lock["packages"].items() if k}
    assert packages[f"node_modules/{V5_NODE_PACKAGE}"]["version"] == V5_NODE_VERSION
    assert len(packages) > 1
    assert all(v.get("version") and v.get("integrity", "").startswith("sha512-") for v in packages.values())


def test_node_producer_push_and_simple_consumer_are_listed_and_leave(v5_node_dir, drivers, gbroker,  # noqa: F811
                                                                     tmp_path):
    d = start_v5_node(v5_node_dir, drivers, gbroker, tmp_path / "scratch", producerTopics=["TopicNode"],
                      pushConsumers=[{"group": "GID_NODE_PUSH", "topic": "TopicNode", "expr": "TagA || TagB"}],
                      simpleConsumers=[{"group": "GID_NODE_SIMPLE", "topic": "TopicNodeS", "expr": "TagC"}],
                      receive=True)
    producer_id, push_id, simple_id = d.ready_line.split()[1:]
    assert len({producer_id, push_id, simple_id}) == 3
    assert ti.wait_for(lambda: connections(gbroker, "GID_NODE_PUSH") == [(push_id, "HTTP")])
    assert ti.wait_for(lambda: connections(gbroker, "GID_NODE_SIMPLE") == [(simple_id, "HTTP")])
    # the proxy's producer group of a 5.x producer is its topic
    assert ti.wait_for(lambda: connections(gbroker, "TopicNode", producer=True) == [(producer_id, "HTTP")])
    # what the client sent: x-mq-language HTTP, its user agent NODE_JS and its package version
    from rocketmq.grpc_protocol import definition_pb2
    for cid in (producer_id, push_id, simple_id):
        s = gbroker.grpc.sessions[cid]
        assert s.language.name == "HTTP" and s.sdk_version == V5_NODE_VERSION
        assert s.settings.user_agent.language == definition_pb2.Language.NODE_JS
        assert s.settings.user_agent.version == V5_NODE_VERSION
    # as a user lists them: rmqhb consumerConnection over the remoting port
    push = admin_json(gbroker, "consumerConnection", "-g", "GID_NODE_PUSH")
    assert push["consumeType"] == "CONSUME_PASSIVELY" and push["messageModel"] == "CLUSTERING"
    assert [c["language"] for c in push["connectionSet"]] == ["HTTP"]
    assert push["subscriptionTable"]["TopicNode"]["subString"] == "TagA || TagB"
    assert push["subscriptionTable"]["TopicNode"]["tagsSet"] == ["TagA", "TagB"]
    simple = admin_json(gbroker, "consumerConnection", "-g", "GID_NODE_SIMPLE")
    assert simple["consumeType"] == "CONSUME_ACTIVELY"
    assert list(simple["subscriptionTable"]) == ["TopicNodeS"]
    assert simple["subscriptionTable"]["TopicNodeS"]["tagsSet"] == ["TagC"]
    # the simple consumer's receive is answered "no new message" after its long poll (no message store)
    assert d._expect("RECEIVED", 60) == "RECEIVED 0"
    # every 10 s each client sends the same HeartbeatRequest: from its second one on, the broker's repeat path
    assert ti.wait_for(lambda: gbroker.grpc.heartbeat_repeats >= 3, timeout=60)
    assert d.close() == 0
    # NotifyClientTermination at shutdown: every registration is gone at once
    assert connections(gbroker, "GID_NODE_PUSH") is None and connections(gbroker, "GID_NODE_SIMPLE") is None
    assert connections(gbroker, "TopicNode", producer=True) is None
    assert ti.wait_for(lambda: gbroker.grpc.sessions == {})
    log = (tmp_path / "scratch" / "logs" / "rocketmq" / "rocketmq_client_nodejs.log").read_text()
    assert "Shutdown the rocketmq client successfully" in log
    assert " ERROR " not in log, log[-3000:]


def test_a_mixed_group_of_node_5x_python_5x_and_ali_ons_4x_is_listed_whole(v5_node_dir, v5_python, ons_dir,  # noqa
                                                                            drivers, gbroker, tmp_path):
    """One consumer group, three clients of two generations: the Node.js and the Python 5.x client over gRPC, ali-ons
    (4.x remoting) on the main port; each leaves the listing when it shuts down."""
    group, topic = "GID_MIXED_NODE", "TopicMixedNode"
    ons = ti.start_ons(ons_dir, drivers, gbroker.ports["main"], consumers=[{"group": group, "topic": topic,
                                                                            "expr": "*"}])
    ons_id = ons.ready_line.split()[1]
    node = start_v5_node(v5_node_dir, drivers, gbroker, tmp_path / "node",
                         pushConsumers=[{"group": group, "topic": topic, "expr": "*"}])
    node_id = node.ready_line.split()[1]
    py = start_v5(v5_python, drivers, gbroker, tmp_path / "py", pushConsumers=[{"group": group, "topic": topic,
                                                                                 "expr": "*"}])
    py_id = py.ready_line.split()[1]
    assert ti.wait_for(lambda: {cid for cid, _ in connections(gbroker, group) or []} == {ons_id, node_id, py_id})
    listed = dict(connections(gbroker, group))
    assert listed[node_id] == "HTTP" and listed[py_id] == "PYTHON" and listed[ons_id] == "JAVA"
    assert node.close() == 0
    assert sorted(cid for cid, _ in connections(gbroker, group)) == sorted([ons_id, py_id])
    assert py.close() == 0
    assert [cid for cid, _ in connections(gbroker, group)] == [ons_id]
    ons.close()
    assert ti.wait_for(lambda: connections(gbroker, group) is None)


def test_node_signed_clients_are_checked_against_plain_acl(v5_node_dir, drivers, acl_gbroker, tmp_path):  # noqa
    """aclEnable: the Node.js client with sessionCredentials signs every call (MQv2-HMAC-SHA1 over x-mq-date-time)
    and is let in by the plain_acl.yml account; with a wrong secret its start fails and nothing registers."""
    spec = dict(producerTopics=["TopicAcl"], pushConsumers=[{"group": "GID_ACL", "topic": "TopicAcl", "expr": "*"}],
                accessKey="v5ak")
    d = start_v5_node(v5_node_dir, drivers, acl_gbroker, tmp_path / "good", secretKey="v5-secret", **spec)
    producer_id, push_id = d.ready_line.split()[1:]
    assert ti.wait_for(lambda: connections(acl_gbroker, "GID_ACL", **ADMIN) == [(push_id, "HTTP")])
    assert ti.wait_for(lambda: connections(acl_gbroker, "TopicAcl", True, **ADMIN) == [(producer_id, "HTTP")])
    assert d.close() == 0
    assert connections(acl_gbroker, "GID_ACL", **ADMIN) is None
    assert acl_gbroker.grpc.acl_denied == 0
    bad = start_v5_node(v5_node_dir, drivers, acl_gbroker, tmp_path / "bad", may_fail=True,
                        secretKey="not-the-secret", **spec)
    assert bad.ready_line.startswith("FAILED")
    log = (tmp_path / "bad" / "logs" / "rocketmq" / "rocketmq_client_nodejs.log").read_text()
    assert "Check signature failed for accessKey='v5ak'" in log, log[-3000:]
    assert acl_gbroker.grpc.acl_denied > 0 and acl_gbroker.grpc.sessions == {}
    assert connections(acl_gbroker, "GID_ACL", **ADMIN) is None
    assert connections(acl_gbroker, "TopicAcl", True, **ADMIN) is None


def test_node_clients_are_listed_again_after_a_broker_restart(v5_node_dir, drivers, tmp_path):  # noqa: F811
    """The `rmqhb serve` process stops (SIGTERM) and starts again on the same ports and store: the running Node.js
    clients (producer, push and simple consumer) are listed again, and are gone after their shutdown. Unlike the
    Python client, this one renews its Telemetry stream when the stream ends and sends its Settings on the new one
    (TelemetrySession.refresh), so it registers itself again once its channel reconnects, whether or not its next
    heartbeat finds the Settings the broker's graceful stop saved."""
    require_module("grpc")
    broker = types.SimpleNamespace(ports={"main": free_port(), "grpc": free_port()})
    store = tmp_path / "store"
    log_file = tmp_path / "broker.log"
    proc = _serve(store, broker.ports["main"], broker.ports["grpc"], log_file)
    try:
        d = start_v5_node(v5_node_dir, drivers, broker, tmp_path / "scratch", producerTopics=["TopicNodeRestart"],
                          pushConsumers=[{"group": "GID_NODE_RESTART_PUSH", "topic": "TopicNodeRestart",
                                          "expr": "TagA"}],
                          simpleConsumers=[{"group": "GID_NODE_RESTART_SIMPLE", "topic": "TopicNodeRestart"}])
        producer_id, push_id, simple_id = d.ready_line.split()[1:]

        def listed():
            return (connections(broker, "GID_NODE_RESTART_PUSH") == [(push_id, "HTTP")]
                    and connections(broker, "GID_NODE_RESTART_SIMPLE") == [(simple_id, "HTTP")]
                    and connections(broker, "TopicNodeRestart", producer=True) == [(producer_id, "HTTP")])

        assert ti.wait_for(listed)
        proc.terminate()
        assert proc.wait(60) == 0
        with pytest.raises(OSError):  # the broker is down
            connections(broker, "GID_NODE_RESTART_PUSH")
        proc = _serve(store, broker.ports["main"], broker.ports["grpc"], log_file)
        assert ti.wait_for(listed, timeout=150), log_file.read_text()[-3000:]
        assert d.close() == 0
        assert ti.wait_for(lambda: connections(broker, "GID_NODE_RESTART_PUSH") is None
                           and connections(broker, "GID_NODE_RESTART_SIMPLE") is None
                           and connections(broker, "TopicNodeRestart", producer=True) is None)
    finally:
        proc.terminate()
        proc.wait(60)

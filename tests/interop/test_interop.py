"""Real RocketMQ clients against the broker: npm ali-ons 3.12.0 and the C++ client (PyPI rocketmq 0.4.4).

The test setup installs both itself, pinned: ali-ons and every package it depends on from the lockfile in
tests/interop/node (`npm ci` into tests/interop/.node) and rocketmq==0.4.4 (pip --target into tests/interop/.cpp);
both folders are gitignored. Outside CI a registry that cannot be reached skips the tests; under ``CI=true`` (or
``ENGINE_REQUIRE_PEERS=1``, which `scripts/dev.sh test` sets) any install failure fails them: the real-client evidence is never silently missing. Each client runs in its own process,
uses the broker as its name server (127.0.0.1), and is checked over the wire with the admin commands.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.broker.admin import AdminClient, AdminError
from engine.broker.controller import Broker
from engine.broker.config import BrokerConfig
from engine.codec.enums import RequestCode

pytestmark = pytest.mark.interop

HERE = Path(__file__).resolve().parent
NODE_DIR = HERE / ".node"
CPP_DIR = HERE / ".cpp"
ROOT = HERE.parents[1]
_NETWORK_ERRORS = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|network|NewConnectionError|"
    r"Temporary failure in name resolution|Name or service not known|Max retries exceeded|Network is unreachable",
    re.I,
)


LOCK_DIR = HERE / "node"  # package.json + package-lock.json: ali-ons 3.12.0 and its dependency tree, pinned
ONS_VERSION = "3.12.0"
CPP_VERSION = "0.4.4"


def peers_required() -> bool:
    """Under CI (or ENGINE_REQUIRE_PEERS=1) a real client that cannot be installed fails the run."""
    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("ENGINE_REQUIRE_PEERS", "") not in ("", "0"))


def _unavailable(message):
    if peers_required():
        pytest.fail(f"{message} (CI=true: the real clients are required)")
    pytest.skip(message)


def _install(cmd, what, timeout=300, cwd=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        _unavailable(f"{what}: package registry did not answer within {timeout} s")
    except OSError as e:  # npm or node not installed
        _unavailable(f"{what}: {e}")
    if p.returncode != 0:
        out = p.stdout + p.stderr
        if _NETWORK_ERRORS.search(out):
            _unavailable(f"{what}: package registry unreachable ({_NETWORK_ERRORS.search(out).group(0)})")
        pytest.fail(f"{what} failed to install:\n{out[-2000:]}")


def _installed_ons_version():
    try:
        return json.loads((NODE_DIR / "node_modules" / "ali-ons" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="session")
def ons_dir():
    lock = (LOCK_DIR / "package-lock.json").read_bytes()
    stamp = NODE_DIR / ".lock-installed"
    if _installed_ons_version() != ONS_VERSION or not stamp.is_file() or stamp.read_bytes() != lock:
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            (NODE_DIR / name).write_bytes((LOCK_DIR / name).read_bytes())
        # npm ci installs exactly the lockfile's tree (versions and integrity hashes), or fails
        _install(["npm", "ci", "--no-audit", "--no-fund"], f"npm ci (ali-ons {ONS_VERSION}, lockfile)", cwd=NODE_DIR)
        stamp.write_bytes(lock)
    assert _installed_ons_version() == ONS_VERSION
    return NODE_DIR


@pytest.fixture(scope="session")
def cpp_dir():
    if not (CPP_DIR / "rocketmq" / "librocketmq.so").is_file() or _installed_cpp_version() != CPP_VERSION:
        _install([sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--no-deps", "--target", str(CPP_DIR),
                  f"rocketmq=={CPP_VERSION}"], f"pip rocketmq=={CPP_VERSION}")
    assert _installed_cpp_version() == CPP_VERSION
    return CPP_DIR


def _installed_cpp_version():
    for meta in CPP_DIR.glob("rocketmq-*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


class Driver:
    """A client process speaking the READY/close/CLOSED line protocol of the drivers."""

    def __init__(self, argv, env, may_fail=False):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.ready_line = self._expect("READY", 90, may_fail)

    def _expect(self, word, timeout, may_fail=False):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith(word):
                return line.strip()
            if line.startswith("FAILED"):
                if may_fail:
                    self.proc.wait(30)
                    return line.strip()
                break
        self.proc.kill()
        raise AssertionError(f"driver did not say {word}: {self.proc.stderr.read()[-3000:]}")

    def close(self, timeout=60, tolerate_crash=False):
        if self.proc.poll() is not None:
            return self.proc.returncode
        """Ask the client to shut down. rocketmq-client-cpp 0.4.4 sometimes aborts inside shutdown() (an uncaught
        boost::thread_interrupted in its own threads) after it has unregistered; with tolerate_crash the test
        then relies on what the broker saw, not on the process exiting cleanly."""
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        if tolerate_crash:
            self.proc.wait(timeout)
            return self.proc.returncode
        self._expect("CLOSED", timeout)
        self.proc.wait(timeout)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def drivers():
    started = []
    yield started
    for d in started:
        d.kill()


def start_ons(ons_dir, drivers, port, may_fail=False, **spec):
    env = dict(os.environ, ONS_NODE_DIR=str(ons_dir))
    spec = dict(spec, nameSrv=f"127.0.0.1:{port}")
    d = Driver(["node", str(HERE / "ons_driver.js"), json.dumps(spec)], env, may_fail)
    drivers.append(d)
    return d


def start_cpp(cpp_dir, drivers, port, scratch, **spec):
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(cpp_dir), HOME=str(scratch))
    spec = dict(spec, nameSrv=f"127.0.0.1:{port}")
    d = Driver([sys.executable, str(HERE / "cpp_driver.py"), json.dumps(spec)], env)
    drivers.append(d)
    return d


@pytest.fixture
def broker(tmp_path):
    started = []

    def make(**kw):
        cfg = BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path / "store"), **kw)
        b = Broker(cfg).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def admin_cli(*args):
    """The rmqhb admin commands, run as a user would (python -m engine ...)."""
    p = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=30,
                       cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return p.returncode, p.stdout, p.stderr


def consumer_connection(port, group, **kw):
    try:
        with AdminClient("127.0.0.1", port, **kw) as c:
            return c.consumer_connection(group)
    except AdminError:
        return None


def wait_for(fn, timeout=20.0, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def client_ids(port, group, **kw):
    cc = consumer_connection(port, group, **kw)
    return sorted(c["clientId"] for c in (cc or {}).get("connectionSet") or [])


@pytest.mark.parametrize("io_workers", [0, 2], ids=["in-process", "ioWorkers=2"])
def test_ali_ons_registers_is_listed_and_unregisters(broker, ons_dir, drivers, io_workers):
    b = broker(io_workers=io_workers)
    port = b.ports["main"]
    d = start_ons(ons_dir, drivers, port, producerGroup="PID_IT_ONS",
                  consumers=[{"group": "CID_IT_ONS", "topic": "TopicIT", "expr": "TagA || TagB"}])
    client_id = d.ready_line.split()[1]
    assert wait_for(lambda: client_ids(port, "CID_IT_ONS") == [client_id])
    rc, out, err = admin_cli("consumerConnection", "-g", "CID_IT_ONS", "-b", f"127.0.0.1:{port}", "--json")
    assert rc == 0, err
    cc = json.loads(out)
    (conn,) = cc["connectionSet"]
    assert conn["clientId"] == client_id and conn["language"] == "JAVA" and conn["version"] == 121
    assert cc["subscriptionTable"]["TopicIT"]["subString"] == "TagA || TagB"
    assert cc["messageModel"] == "CLUSTERING" and cc["consumeType"] == "CONSUME_PASSIVELY"
    rc, out, err = admin_cli("producerConnection", "-g", "PID_IT_ONS", "-t", "TopicIT", "-b", f"127.0.0.1:{port}")
    assert rc == 0, err
    assert out.split()[:2] == ["0001", client_id] and "V3_4_9" in out
    d.close()
    assert wait_for(lambda: consumer_connection(port, "CID_IT_ONS") is None)
    rc, out, err = admin_cli("producerConnection", "-g", "PID_IT_ONS", "-t", "TopicIT", "-b", f"127.0.0.1:{port}")
    assert rc == 1 and "the producer group[PID_IT_ONS] not exist" in err


@pytest.mark.parametrize("io_workers", [0, 2], ids=["in-process", "ioWorkers=2"])
def test_cpp_client_requeries_consumer_list_on_notify(broker, ons_dir, cpp_dir, drivers, tmp_path, io_workers):
    b = broker(io_workers=io_workers)
    port = b.ports["main"]
    calls = []  # (time, remote address) of every GET_CONSUMER_LIST_BY_GROUP
    handler, executor = b.server.table[RequestCode.GET_CONSUMER_LIST_BY_GROUP]

    def spy(conn, cmd):
        calls.append((time.monotonic(), conn.remote_addr))
        return handler(conn, cmd)

    b.server.table[RequestCode.GET_CONSUMER_LIST_BY_GROUP] = (spy, executor)
    unregisters = []
    u_handler, u_executor = b.server.table[RequestCode.UNREGISTER_CLIENT]

    def u_spy(conn, cmd):
        unregisters.append(dict(cmd.ext_fields or {}))
        return u_handler(conn, cmd)

    b.server.table[RequestCode.UNREGISTER_CLIENT] = (u_spy, u_executor)
    cpp = start_cpp(cpp_dir, drivers, port, tmp_path / "home", producerGroup="PID_IT_CPP",
                    consumers=[{"group": "CID_IT_MIX", "topic": "TopicIT", "expr": "*"}])
    cpp_pid = cpp.proc.pid
    cc = wait_for(lambda: consumer_connection(port, "CID_IT_MIX"))
    (conn,) = cc["connectionSet"]
    assert conn["clientId"].startswith(f"{cpp_pid}-") and conn["language"] == "CPP"
    cpp_addr = conn["clientAddr"]
    assert wait_for(lambda: any(a == cpp_addr for _, a in calls))  # its first rebalance
    time.sleep(1.0)
    notified_before = b.metrics.notifications_sent
    t_join = time.monotonic()
    ons = start_ons(ons_dir, drivers, port, consumers=[{"group": "CID_IT_MIX", "topic": "TopicIT", "expr": "*"}])
    ons_id = ons.ready_line.split()[1]
    assert wait_for(lambda: ons_id in client_ids(port, "CID_IT_MIX"))
    assert b.metrics.notifications_sent >= notified_before + 2  # NOTIFY to both members of the group
    # the C++ client answers the NOTIFY by asking for the consumer list again, right away
    assert wait_for(lambda: any(t > t_join and a == cpp_addr for t, a in calls), timeout=5)
    first = min(t for t, a in calls if t > t_join and a == cpp_addr)
    assert first - t_join < 5
    r = AdminClient("127.0.0.1", port).invoke(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CID_IT_MIX"})
    assert sorted(json.loads(r.body)["consumerIdList"]) == sorted([conn["clientId"], ons_id])
    # the C++ client is listed as a producer too (all roles on one connection)
    rc, out, err = admin_cli("producerConnection", "-g", "PID_IT_CPP", "-t", "TopicIT", "-b", f"127.0.0.1:{port}")
    assert rc == 0 and conn["clientId"] in out and "CPP" in out, err
    ons.close()
    assert wait_for(lambda: client_ids(port, "CID_IT_MIX") == [conn["clientId"]])
    cpp.close(tolerate_crash=True)
    # the C++ client sends UNREGISTER_CLIENT for its groups on shutdown (producer and consumer group fields)
    assert any(u.get("clientID") == conn["clientId"] and u.get("consumerGroup") == "CID_IT_MIX" for u in unregisters)
    assert any(u.get("clientID") == ons_id for u in unregisters)
    assert wait_for(lambda: consumer_connection(port, "CID_IT_MIX") is None)
    rc, out, err = admin_cli("producerConnection", "-g", "PID_IT_CPP", "-t", "TopicIT", "-b", f"127.0.0.1:{port}")
    assert rc == 1


def test_acl_real_clients_right_and_wrong_credentials(broker, ons_dir, cpp_dir, drivers, tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    admin: false\n"
                   "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: SUB\n")  # unset: DENY
    b = broker(acl_enable=True, acl_file=str(acl))
    port = b.ports["main"]
    creds = {"access_key": "RocketMQ", "secret_key": "12345678"}
    ok_ons = start_ons(ons_dir, drivers, port, accessKey="RocketMQ", secretKey="12345678",
                       consumers=[{"group": "CID_ACL_ONS", "topic": "TopicACL", "expr": "*"}])
    ok_cpp = start_cpp(cpp_dir, drivers, port, tmp_path / "home1", accessKey="RocketMQ", secretKey="12345678",
                       consumers=[{"group": "CID_ACL_CPP", "topic": "TopicACL", "expr": "*"}])
    assert wait_for(lambda: len(client_ids(port, "CID_ACL_ONS", **creds)) == 1)
    assert wait_for(lambda: len(client_ids(port, "CID_ACL_CPP", **creds)) == 1)
    denied_before = b.metrics.acl_denied
    bad_ons = start_ons(ons_dir, drivers, port, may_fail=True, accessKey="RocketMQ", secretKey="wrong-secret",
                        consumers=[{"group": "CID_ACL_BAD", "topic": "TopicACL", "expr": "*"}])
    # ali-ons refuses to start: its first rebalance gets NO_PERMISSION (code 16) with the broker's reason
    assert bad_ons.ready_line == "FAILED MQPushConsumer occurred an error Check signature failed for accessKey='RocketMQ'"
    bad_cpp = start_cpp(cpp_dir, drivers, port, tmp_path / "home2", accessKey="RocketMQ", secretKey="wrong-secret",
                        consumers=[{"group": "CID_ACL_BAD", "topic": "TopicACL", "expr": "*"}])
    # their heartbeats are refused (NO_PERMISSION) and register nothing
    assert wait_for(lambda: b.metrics.acl_denied >= denied_before + 2)
    time.sleep(1.0)
    assert consumer_connection(port, "CID_ACL_BAD", **creds) is None
    # an unsigned admin query is refused too
    with pytest.raises(AdminError, match="CODE: 16"):
        with AdminClient("127.0.0.1", port) as c:
            c.consumer_connection("CID_ACL_ONS")
    for d in (bad_ons, ok_ons):
        d.close()
    for d in (bad_cpp, ok_cpp):
        d.close(tolerate_crash=True)
    assert wait_for(lambda: consumer_connection(port, "CID_ACL_ONS", **creds) is None)
    assert wait_for(lambda: consumer_connection(port, "CID_ACL_CPP", **creds) is None)

"""The broker against untrusted clients: no request stops a queue or returns Python internals, requests decoded
before a bad frame are served, partial frames and refused connections have budgets, metrics labels are bounded."""
import json
import logging
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time

import pytest

import engine
from engine.codec.enums import RequestCode, ResponseCode
from engine.broker.processors import NAMESRV_TABLE, PROCESSOR_TABLE
from engine.broker.server import FD_RESERVE, REFUSED_HELD
from test_server import Client, broker, broker_factory, hb_body, wait_until  # noqa: F401  (fixtures)

#: what a remark must never contain: Python's own words for its failures
INTERNALS = re.compile(r"Traceback|[A-Z][a-z]+Error\b|Exception\b|object has no attribute|unsupported operand|"
                       r"NoneType|not subscriptable|invalid literal|unhashable|positional argument|codec can't")
#: every ext field a processor reads
FIELDS = ("consumerGroup", "producerGroup", "clientID", "topic", "queueId", "commitOffset", "queueOffset",
          "suspendTimeoutMillis", "sysFlag", "setZeroIfNotFound", "maxMsgNums", "subscription", "subVersion")
CODES = sorted({int(c) for c, _, _ in PROCESSOR_TABLE + NAMESRV_TABLE})


#: ext fields every request of the bad_requests() builders also carries (the ACL run sets its AccessKey here)
EXTRA_EXT: dict = {}


def json_frame(code, opaque, ext=None, body=b"", flag=0):
    """A JSON-header request written the way a non-Java client may: UTF-8 as is, no escapes."""
    header = {"code": code, "flag": flag, "language": "JAVA", "opaque": opaque, "serializeTypeCurrentRPC": "JSON",
              "version": 479}
    if EXTRA_EXT:
        ext = {**(ext or {}), **EXTRA_EXT}
    if ext is not None:
        header["extFields"] = ext
    h = json.dumps(header, ensure_ascii=False).encode()
    return struct.pack(">II", 4 + len(h) + len(body), len(h)) + h + body


def rocketmq_frame(code, opaque, ext: dict, body=b""):
    """A ROCKETMQ binary header whose ext values are raw bytes (possibly not UTF-8)."""
    ext = {**ext, **{k.encode(): v.encode() for k, v in EXTRA_EXT.items()}}
    ext_bytes = b"".join(struct.pack(">H", len(k)) + k + struct.pack(">I", len(v)) + v for k, v in ext.items())
    h = struct.pack(">hbhii", code, 0, 479, opaque, 0) + struct.pack(">i", 0) + struct.pack(">i", len(ext_bytes)) + ext_bytes
    return struct.pack(">I", 4 + len(h) + len(body)) + bytes([1]) + len(h).to_bytes(3, "big") + h + body


def assert_clean_answer(resp):
    assert resp.is_response
    assert resp.remark is None or (len(resp.remark) <= 512 and not INTERNALS.search(resp.remark)), resp.remark


def bad_requests():
    """(name, frame builder(opaque)) for every registered code: missing, empty, huge, wrongly typed, non-UTF-8."""
    huge = "\u0080" * 200_000
    variants = {
        "no extFields": lambda code, o: json_frame(code, o),
        "empty extFields": lambda code, o: json_frame(code, o, {}),
        "empty values": lambda code, o: json_frame(code, o, {f: "" for f in FIELDS}),
        "huge values": lambda code, o: json_frame(code, o, {f: huge for f in FIELDS}),
        "wrong types": lambda code, o: json_frame(code, o, {f: v for f, v in zip(FIELDS, (
            "x", "y", "z", "t", "1_0", "\uff11\uff12", "99999999999999999999999", " 5", "-", "+", "0x10", "1e3",
            "NaN"))}),
        "numbers as JSON": lambda code, o: json_frame(code, o, {f: 7 for f in FIELDS}),
        "non-UTF-8 ext": lambda code, o: rocketmq_frame(code, o, {f.encode(): b"\xff\xfe\x80" for f in FIELDS}),
        "garbage body": lambda code, o: json_frame(code, o, {"consumerGroup": "g", "topic": "t"}, b"\xff{[\x00"),
        "wrong JSON body": lambda code, o: json_frame(code, o, {"consumerGroup": "g"},
                                                      b'{"mqSet":5,"consumerDataSet":"x","clientID":[]}'),
        "huge body": lambda code, o: json_frame(code, o, {"consumerGroup": "g"}, b"[" * 500_000),
        "non-UTF-8 body": lambda code, o: json_frame(code, o, {}, b'{"clientID":"\xff\xfe"}'),
        "wrongly typed body fields": lambda code, o: json_frame(code, o, {"consumerGroup": "g"}, json.dumps({
            "subscriptionData": {"expressionType": "SQL92", "subString": ["a"]}, "consumerGroup": [],
            "clientId": {}, "mqSet": [{"topic": 1, "brokerName": None, "queueId": "x"}]}).encode()),
        "scalar body fields": lambda code, o: json_frame(code, o, {"consumerGroup": "g"}, json.dumps({
            "subscriptionData": {"expressionType": 5, "subString": 5}, "clientID": 5}).encode()),
    }
    return variants


def well_behaved(c):
    """A real client's routine: heartbeat, consumer list, offset query, route query -- all answered."""
    assert c.heartbeat(client_id="10.0.0.9@good", group="good_group").code == ResponseCode.SUCCESS
    r = c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "good_group"})
    assert r.code == ResponseCode.SUCCESS and b"10.0.0.9@good" in r.body
    r = c.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "good_group", "topic": "TopicTest", "queueId": "0"})
    assert r.is_response
    assert c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == ResponseCode.SUCCESS


#: ACL run: "guard" may do anything from 127.0.0.1 unsigned (its requests reach the processors); "user" must
#: sign (its bad requests, with a wrong signature, go through the signature check over their odd fields)
GUARD_ACL_YML = """\
accounts:
  - accessKey: guard
    secretKey: guard-secret-1
    whiteRemoteAddress: 127.0.0.1
    admin: true
  - accessKey: user
    secretKey: user-secret-1
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""


class GuardClient(Client):
    """The well-behaved client of the ACL run: every request names the white-listed account."""

    def send(self, code, ext=None, body=b"", **kw):
        return super().send(code, {**(ext or {}), "AccessKey": "guard"}, body, **kw)


@pytest.mark.parametrize("mode", ["default", "enablePropertyFilter", "aclEnable"])
def test_every_code_with_bad_fields_and_bodies(broker_factory, caplog, monkeypatch, tmp_path, mode):
    """Every registered request code with missing, empty, huge, wrongly typed and non-UTF-8 ext fields and bodies,
    over a real socket: each is answered cleanly or its connection is closed; no traceback is logged; a
    well-behaved client on another connection is answered throughout. With enablePropertyFilter the filter
    expressions of CHECK_CLIENT_CONFIG bodies reach the SQL92 compiler too; with aclEnable each request also goes
    through the ACL check (resources, signature) first."""
    kw, client, extras = {}, Client, [{}]
    if mode == "enablePropertyFilter":
        kw["enable_property_filter"] = True
    elif mode == "aclEnable":
        acl = tmp_path / "plain_acl.yml"
        acl.write_text(GUARD_ACL_YML)
        kw.update(acl_enable=True, acl_file=str(acl))
        client, extras = GuardClient, [{"AccessKey": "guard"}, {"AccessKey": "user", "Signature": "x"}]
    broker = broker_factory(**kw)
    caplog.set_level(logging.INFO)
    good = client(broker.ports["main"])
    try:
        well_behaved(good)
        opaque = 1000
        for name, build in bad_requests().items():
            c = Client(broker.ports["main"])
            try:
                for code in CODES:
                    for extra in extras:
                        monkeypatch.setattr(sys.modules[__name__], "EXTRA_EXT", extra)
                        opaque += 1
                        try:
                            c.sock.sendall(build(code, opaque))
                            resp = c.read(timeout=10, pred=lambda m, o=opaque: m.is_response and m.opaque == o)
                        except (ConnectionError, OSError):
                            # the broker may close a connection whose frame it cannot decode; start a new one
                            c.close()
                            c = Client(broker.ports["main"])
                            continue
                        assert_clean_answer(resp)
            finally:
                c.close()
            well_behaved(good)
    finally:
        good.close()
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert tracebacks == []
    assert broker.metrics.request_errors.get("internal_error", 0) == 0
    assert broker.metrics.request_errors["bad_request"] > 50  # the bad requests did reach the processors
    if mode == "aclEnable":
        assert broker.metrics.acl_denied >= len(CODES) * len(bad_requests()) // 2  # and the signature check


def test_oversized_echo_does_not_stop_the_queues(broker):
    """A group name of 3 million U+0080 characters (6 MB on the wire, 18 MB once JSON-escaped) in 38 and 203, and
    a topic as long in 105: answered with a short remark, and the consumer-manage and admin queues keep serving."""
    name = "\u0080" * 3_000_000
    bad, good = Client(broker.ports["main"]), Client(broker.ports["main"])
    try:
        good.heartbeat(client_id="10.0.0.9@good", group="good_group")
        for code, field in ((RequestCode.GET_CONSUMER_LIST_BY_GROUP, "consumerGroup"),
                            (RequestCode.GET_CONSUMER_CONNECTION_LIST, "consumerGroup"),
                            (RequestCode.GET_PRODUCER_CONNECTION_LIST, "producerGroup"),
                            (RequestCode.GET_ROUTEINFO_BY_TOPIC, "topic")):
            frame = json_frame(int(code), 77, {field: name})
            assert 6_000_000 < len(frame) < 16 * 1024 * 1024
            bad.sock.sendall(frame)
            resp = bad.read(timeout=30, pred=lambda m: m.is_response and m.opaque == 77)
            assert_clean_answer(resp)
            assert resp.code != ResponseCode.SUCCESS
        for _ in range(3):  # the queues still drain
            well_behaved(good)
            r = good.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "good_group"})
            assert r.code == ResponseCode.SUCCESS
    finally:
        bad.close()
        good.close()


def test_handler_failures_become_short_answers_logged_once(broker, caplog):
    """A processor bug or an answer over the frame limit: SYSTEM_ERROR naming the request, no exception text,
    counted; one log line per kind, not one per request; the queue keeps draining."""
    caplog.set_level(logging.INFO)
    server = broker.server

    def buggy(conn, cmd):
        return None + "x"

    def huge(conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, body=b"x" * (17 * 1024 * 1024))

    def unencodable(conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"k": object()})

    queue = server.executor("consumer_manage")
    broker.call(server.register_processor, 7001, buggy, queue)
    broker.call(server.register_processor, 7002, huge, queue)
    broker.call(server.register_processor, 7003, unencodable, server.executor("inline"))
    c = Client(broker.ports["main"])
    try:
        for _ in range(20):
            for code, text in ((7001, "internal error"), (7002, "larger than the frame limit"),
                               (7003, "could not be encoded")):
                r = c.call(code, {})
                assert r.code == ResponseCode.SYSTEM_ERROR
                assert r.remark.startswith(f"request code {code} failed: ") and text in r.remark
                assert_clean_answer(r)
        well_behaved(c)
    finally:
        c.close()
    errors = broker.metrics.request_errors
    assert (errors["internal_error"], errors["answer_too_large"], errors["encode_failed"]) == (20, 20, 20)
    lines = [r for r in caplog.records if r.name == "engine.broker.server" and "failed (" in r.getMessage()]
    assert len(lines) == 3  # one per kind within the rate-limit interval
    assert sum(1 for r in lines if r.exc_info) == 1  # the bug's traceback, once


def test_failure_outside_the_handlers_closes_the_connection_logged_once(broker, caplog):
    """A bug outside the handlers' guard (here: in dispatch itself) while a read's requests are dispatched: the
    answers made before it go out, the connection is closed and counted, one traceback a minute is logged (not
    asyncio's traceback per read), and other clients are served."""
    caplog.set_level(logging.INFO)
    server = broker.server
    real = server.dispatch

    def dispatch(conn, cmd):
        if cmd.code == 7100:
            raise RuntimeError("bug")
        real(conn, cmd)

    broker.call(setattr, server, "dispatch", dispatch)
    heartbeat = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=1,
                                       body=hb_body(client_id="10.0.0.3@c", group="g")).encode()
    for _ in range(5):
        c = Client(broker.ports["main"])
        try:
            c.sock.sendall(heartbeat + engine.RemotingCommand(7100, opaque=2).encode())
            assert c.read(pred=lambda m: m.is_response and m.opaque == 1).code == ResponseCode.SUCCESS
            assert c.closed_by_peer(timeout=5)
        finally:
            c.close()
    good = Client(broker.ports["main"])
    try:
        well_behaved(good)
    finally:
        good.close()
    assert broker.metrics.internal_errors["dispatch_failed"] == 5
    assert broker.metrics.connections_closed["internal_error"] == 5
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1 and tracebacks[0].name == "engine.broker.server"


def test_a_failing_sweep_pass_does_not_stop_the_connection_limits(broker_factory, caplog):
    """The once-a-second sweep enforces the slowloris and idle limits: a pass that fails (here: the metrics
    sample raises every time) is logged once a minute and the next pass still runs."""
    caplog.set_level(logging.INFO)
    broker = broker_factory(incomplete_frame_timeout_ms=1000)
    failures = []

    def sample():
        failures.append(1)
        raise RuntimeError("bug")

    broker.call(setattr, broker.metrics, "sample", sample)
    assert wait_until(lambda: failures)
    c = Client(broker.ports["main"])
    try:
        c.sock.sendall(struct.pack(">I", 100))  # a frame that never completes
        assert c.closed_by_peer(timeout=8)
    finally:
        c.close()
    assert broker.metrics.connections_closed["incomplete_frame"] == 1
    assert broker.metrics.internal_errors["sweep_failed"] >= 2
    assert 'rocketmq_broker_internal_errors_total{kind="sweep_failed"}' in broker.render_metrics()
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1 and tracebacks[0].name == "engine.broker.server"


def test_filter_check_with_wrongly_typed_fields(broker_factory, caplog):
    """CHECK_CLIENT_CONFIG under enablePropertyFilter with a subscriptionData whose fields have the wrong JSON
    types: scalars are read as fastjson reads them into a String field, objects and arrays are a short
    SYSTEM_ERROR naming the field; never an internal error."""
    caplog.set_level(logging.INFO)
    broker = broker_factory(enable_property_filter=True)
    c = Client(broker.ports["main"])

    def check(sd):
        return c.call(RequestCode.CHECK_CLIENT_CONFIG, {}, json.dumps({"subscriptionData": sd}).encode())

    try:
        assert check({"expressionType": "SQL92", "subString": "a > 5"}).code == ResponseCode.SUCCESS
        assert check({"expressionType": "SQL92", "subString": 5}).code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert check({"expressionType": "SQL92", "subString": True}).code == ResponseCode.SUCCESS  # "true"
        assert check({"expressionType": 5, "subString": "a > 5"}).code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        for sd, field in (({"expressionType": "SQL92", "subString": ["a"]}, "subscriptionData.subString"),
                          ({"expressionType": "SQL92", "subString": {"a": 1}}, "subscriptionData.subString"),
                          ({"expressionType": ["SQL92"], "subString": "a > 5"}, "subscriptionData.expressionType"),
                          ("SQL92", "subscriptionData")):
            r = check(sd)
            assert r.code == ResponseCode.SYSTEM_ERROR and field + " is not" in r.remark, r.remark
            assert_clean_answer(r)
        assert check(None).code == ResponseCode.SUCCESS
        well_behaved(c)
    finally:
        c.close()
    assert broker.metrics.request_errors.get("internal_error", 0) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_request_without_ext_fields_is_a_short_error(broker, caplog):
    caplog.set_level(logging.INFO)
    c = Client(broker.ports["main"])
    try:
        for code in (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
                     RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.UNREGISTER_CLIENT,
                     RequestCode.GET_MAX_OFFSET, RequestCode.GET_CONSUMER_CONNECTION_LIST):
            r = c.call(code, None)
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert re.fullmatch(r"the custom field <\w+> is null", r.remark), r.remark
        r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, None)  # the name server's answer for a null topic
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        c.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("text", ["1_0", "\uff11", " 5", "5 ", "2147483648", "-2147483649", "", "0x1", "+-1"])
def test_int_fields_parse_as_java(broker, text):
    c = Client(broker.ports["main"])
    try:
        r = c.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "t", "queueId": text})
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueId" in r.remark
        r = c.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "t", "queueId": "+3"})
        # parsed (Integer.parseInt accepts a leading '+'): never committed, answered as 4.9.8 does (the default
        # clientManagementRules=4: offset 0)
        assert r.code == ResponseCode.SUCCESS and r.ext_fields == {"offset": "0"}
    finally:
        c.close()


def test_requests_before_a_bad_frame_are_processed(broker):
    """An offset commit and a bad frame in one read: the commit is kept (as Netty hands completed frames to the
    processors before it closes), the connection is closed."""
    setup = Client(broker.ports["main"])
    setup.heartbeat(client_id="10.0.0.1@a", group="offset_group")
    assert setup.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == ResponseCode.SUCCESS
    c = Client(broker.ports["main"])
    commit = engine.RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, opaque=5, ext_fields={
        "consumerGroup": "offset_group", "topic": "TopicTest", "queueId": "2", "commitOffset": "4242"}).encode()
    heartbeat = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=6,
                                       body=hb_body(client_id="10.0.0.2@b", group="offset_group")).encode()
    garbage = struct.pack(">II", 12, 0x05FFFFFF) + b"\x00" * 8  # serialize type 5 does not exist
    c.sock.sendall(commit + heartbeat + garbage)
    assert c.closed_by_peer(timeout=5)
    q = setup.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "offset_group", "topic": "TopicTest",
                                                      "queueId": "2"})
    assert q.code == ResponseCode.SUCCESS and q.ext_fields["offset"] == "4242"
    assert broker.metrics.frame_errors == 1
    setup.close()


def test_partial_frames_have_a_budget(broker_factory):
    broker = broker_factory(max_partial_frame_bytes_total=1024 * 1024)
    server = broker.server
    head = struct.pack(">II", 4 + 16 + 900_000, 16)  # a 900 KB frame, sent 400 KB at a time
    clients = [Client(broker.ports["main"]) for _ in range(3)]
    try:
        for c in clients[:2]:
            c.sock.sendall(head + b"{" + b" " * 399_991)
        assert wait_until(lambda: server.partial_bytes >= 800_000)
        clients[2].sock.sendall(head + b"{" + b" " * 399_991)  # 1.2 MB in partial frames: this one is closed
        assert clients[2].closed_by_peer(timeout=5)
        assert broker.metrics.connections_closed["partial_budget"] == 1
        assert not clients[0].closed_by_peer(timeout=0.2) and not clients[1].closed_by_peer(timeout=0.2)
        good = Client(broker.ports["main"])
        well_behaved(good)
        good.close()
        for c in clients:
            c.close()
        assert wait_until(lambda: server.partial_bytes == 0 and not server.partial)
    finally:
        for c in clients:
            c.close()


def test_unknown_codes_share_one_metrics_label(broker):
    c = Client(broker.ports["main"])
    try:
        for code in range(5000, 5300):
            assert c.call(code, {}).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        well_behaved(c)
    finally:
        c.close()
    text = broker.render_metrics()
    assert 'rocketmq_broker_requests_total{code="other"} 300' in text
    assert "code=\"5001\"" not in text
    assert len(broker.metrics.requests) < 20


# ---------------------------------------------------------------------------------------------------------- fds

BROKER_LOW_FDS = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))  # serve_main raises soft to hard
from engine.broker.controller import serve_main
sys.exit(serve_main(sys.argv[2:]))
"""


def test_refused_connections_leave_the_descriptor_reserve(tmp_path):
    """RLIMIT_NOFILE 400 (144 connections): a flood of 1,500 connections is refused without taking the
    descriptors kept for the broker's files; the store still writes, a connected client is still served."""
    store = tmp_path / "store"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", BROKER_LOW_FDS, "400", "--listenPort", str(port), "--listenHost", "127.0.0.1",
         "--fastPortEnable", "false", "--storePathRootDir", str(store), "--log-level", "INFO"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    flood = []
    try:
        assert "boot success" in proc.stdout.readline()
        good = Client(port)
        well_behaved(good)
        fds = lambda: len(os.listdir(f"/proc/{proc.pid}/fd"))  # noqa: E731
        base = most = fds()
        for i in range(1500):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
            if i % 50 == 0:
                most = max(most, fds())
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # while the refused connections would be held
            most = max(most, fds())
            time.sleep(0.05)
        # what the broker held before the flood (its own files, one client) + the other 143 connections + at most
        # REFUSED_HELD refusals held open: the rest of the reserve stays free for the store
        assert most <= base + 143 + REFUSED_HELD + 2, (base, most)  # +2: sockets accepted, not yet closed
        assert 400 - most >= FD_RESERVE - REFUSED_HELD - base - 2  # the reserve, less the broker's own files
        # while the flood is held: a new group's config must reach the disk (the store needs descriptors)
        assert good.heartbeat(client_id="10.0.0.9@good", group="group_after_flood").code == ResponseCode.SUCCESS
        path = store / "config" / "subscriptionGroup.json"
        assert wait_until(lambda: path.is_file() and "group_after_flood" in path.read_text(), timeout=10)
        well_behaved(good)
        good.close()
    finally:
        for s in flood:
            s.close()
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "Too many open files" not in err and "EMFILE" not in err, err[-3000:]


def test_large_json_bodies_are_refused_before_parsing(broker):
    """A 4 MB lock-batch body of tiny arrays would hold the loop for a second: refused by size, at once."""
    c = Client(broker.ports["main"])
    try:
        body = b'{"consumerGroup":"g","clientId":"c","mqSet":[' + b"[]," * 1_400_000 + b"[]]}"
        r = c.call(RequestCode.LOCK_BATCH_MQ, {}, body)
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "LockBatchRequestBody is larger than 2097152 bytes"
        well_behaved(c)
    finally:
        c.close()

"""Answers of the client-management and admin processors as the seeds' broker gives them, under each
``clientManagementRules`` (README: "Conformance with the seeds' broker"): QUERY_CONSUMER_OFFSET of a queue with no
committed offset (4.9.8's and 5.x's ConsumerManageProcessor), GET_PRODUCER_CONNECTION_LIST of a producer group
emptied by a close, the expiry scan or an unregister (4.9.8's ProducerManager keeps the group after the first two,
5.x removes it), and the ext fields Java's response headers put on the answers. Driven through the remoting
protocol, as a client does."""
import json

import pytest

import engine
from engine.broker.admin import producer_connection_main
from engine.codec.enums import RequestCode, ResponseCode
from engine.registry import producer_manager
from engine.registry.client_registry import ClientRegistry, RegistryConfig
from engine.registry.store import SubscriptionGroupConfig, TopicConfig
from test_server import Client, broker_factory, hb_body, wait_until  # noqa: F401  (fixtures)

RULES = [4, 5]
QUERY_NOT_FOUND = 22


def _query(c, queue_id="0", **extra):
    return c.call(RequestCode.QUERY_CONSUMER_OFFSET,
                  {"consumerGroup": "offset_group", "topic": "OffsetTopic", "queueId": queue_id, **extra})


@pytest.mark.parametrize("rules", RULES)
def test_query_consumer_offset_of_a_queue_with_no_committed_offset(broker_factory, rules):
    """4.9.8: SUCCESS, offset 0 (the queue's min offset is 0 and offset 0 is not on disk, always so without a
    message store) whatever setZeroIfNotFound says (4.9.8 has no such field); 5.x: QUERY_NOT_FOUND (offset 0 is
    not in memory), with its own remark when setZeroIfNotFound is false (Boolean.parseBoolean: anything but "true"
    in any case, "" and "0" too)."""
    broker = broker_factory(client_management_rules=rules)
    c = Client(broker.ports["main"])
    try:
        for extra in ({}, {"setZeroIfNotFound": "false"}, {"setZeroIfNotFound": "FALSE"},
                      {"setZeroIfNotFound": "true"}, {"setZeroIfNotFound": "TRUE"}, {"setZeroIfNotFound": ""},
                      {"setZeroIfNotFound": "0"}):
            for serialize_type in ("JSON", "ROCKETMQ"):
                r = c.call(RequestCode.QUERY_CONSUMER_OFFSET,
                           {"consumerGroup": "offset_group", "topic": "OffsetTopic", "queueId": "3", **extra},
                           serialize_type=serialize_type)
                if rules == 4:
                    assert (r.code, r.remark, r.ext_fields) == (ResponseCode.SUCCESS, None, {"offset": "0"})
                elif (extra.get("setZeroIfNotFound", "true").lower() != "true"  # "", "0": parseBoolean false
                      # ... but ROCKETMQ's readStr decodes an empty value as null: the field is absent
                      and not (serialize_type == "ROCKETMQ" and extra["setZeroIfNotFound"] == "")):
                    assert (r.code, r.remark) == (QUERY_NOT_FOUND,
                                                  "Not found, do not set to zero, maybe this group boot first")
                else:
                    assert (r.code, r.remark) == (QUERY_NOT_FOUND,
                                                  "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
                if rules == 5 and serialize_type == "JSON":
                    # createResponseCommand(QueryConsumerOffsetResponseHeader.class): an empty extFields map
                    assert r.ext_fields == {}
        # a committed offset is answered under both, and only that queue's
        broker.call(broker.registry.update_subscription_group_config, SubscriptionGroupConfig("offset_group"))
        broker.call(broker.registry.update_topic_config, TopicConfig("OffsetTopic", read_queue_nums=4,
                                                                     write_queue_nums=4))
        r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "offset_group", "topic": "OffsetTopic",
                                                        "queueId": "1", "commitOffset": "42"})
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        r = _query(c, "1")
        assert (r.code, r.ext_fields) == (ResponseCode.SUCCESS, {"offset": "42"})
        r = _query(c, "2")
        assert r.code == (ResponseCode.SUCCESS if rules == 4 else QUERY_NOT_FOUND)
    finally:
        c.close()


def _producer_connection(c, group):
    return c.call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group})


def _assert_kept_empty(r, rules, group):
    if rules == 4:
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        assert json.loads(r.body) == {"connectionSet": []}
    else:
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")


@pytest.mark.parametrize("rules", RULES)
def test_producer_connection_of_a_group_whose_last_member_left(broker_factory, capsys, rules):
    """A producer group whose last member's connection closed (kill -9) or expired: 4.9.8 keeps the empty group
    (SUCCESS, no connection; `producerConnection` exits 0), 5.x removes it ("not exist", exit 1). After an
    UNREGISTER_CLIENT both remove it; a new member makes it live again."""
    broker = broker_factory(client_management_rules=rules)
    port = broker.ports["main"]
    addr = f"127.0.0.1:{port}"
    admin = Client(port)
    killed, frozen, leaving = Client(port), Client(port), Client(port)
    try:
        assert killed.heartbeat(client_id="10.0.0.1@killed", producer="pg_killed").code == 0
        assert frozen.heartbeat(client_id="10.0.0.2@frozen", producer="pg_frozen").code == 0
        assert leaving.heartbeat(client_id="10.0.0.3@leaving", producer="pg_leaving").code == 0
        r = _producer_connection(admin, "pg_killed")
        assert r.code == 0 and [x["clientId"] for x in json.loads(r.body)["connectionSet"]] == ["10.0.0.1@killed"]

        killed.close()  # the connection closes: doChannelCloseEvent
        assert wait_until(lambda: broker.call(broker.registry.producer_channels, "pg_killed") == [])
        _assert_kept_empty(_producer_connection(admin, "pg_killed"), rules, "pg_killed")
        capsys.readouterr()
        assert producer_connection_main(["-g", "pg_killed", "-t", "T", "-b", addr]) == (0 if rules == 4 else 1)
        out, err = capsys.readouterr()
        assert (out, err) == ("", "") if rules == 4 else "the producer group[pg_killed] not exist" in err

        # UNREGISTER_CLIENT of the group's last member: removed under both (4.9.8's unregisterProducer)
        r = leaving.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "10.0.0.3@leaving", "producerGroup": "pg_leaving"})
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        r = _producer_connection(leaving, "pg_leaving")
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "the producer group[pg_leaving] not exist")
        # an unregister naming a kept empty group changes nothing (4.9.8 skips an empty group)
        r = leaving.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "10.0.0.3@leaving", "producerGroup": "pg_killed"})
        assert r.code == 0
        _assert_kept_empty(_producer_connection(leaving, "pg_killed"), rules, "pg_killed")

        # a new member: the group is live again, and kept again when it leaves
        again = Client(port)
        assert again.heartbeat(client_id="10.0.0.4@again", producer="pg_killed").code == 0
        r = _producer_connection(leaving, "pg_killed")
        assert r.code == 0 and [x["clientId"] for x in json.loads(r.body)["connectionSet"]] == ["10.0.0.4@again"]
        again.close()
        assert wait_until(lambda: broker.call(broker.registry.producer_channels, "pg_killed") == [])
        _assert_kept_empty(_producer_connection(leaving, "pg_killed"), rules, "pg_killed")
        # never seen: "not exist" under both
        r = _producer_connection(leaving, "pg_never")
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "the producer group[pg_never] not exist")

        # the expiry scan (the producer timeout is a fixed 120 s; the scan is run 121 s ahead, so every client
        # expires): the frozen client's connection is closed, its group kept empty under 4.x rules
        later = broker.call(broker.registry._clock) + 121_000
        assert broker.call(broker.scan_expired, later) >= 1
        assert frozen.closed_by_peer()
        fresh = Client(port)
        _assert_kept_empty(_producer_connection(fresh, "pg_frozen"), rules, "pg_frozen")
        fresh.close()
        broker.call(broker.registry.check_invariants)
    finally:
        for c in (admin, killed, frozen, leaving):
            c.close()


def _producer_hb(client_id, *groups):
    body = json.dumps({"clientID": client_id, "consumerDataSet": [],
                       "producerDataSet": [{"groupName": g} for g in groups]}).encode()
    return engine.decode_heartbeat(body)


@pytest.mark.parametrize("rules", RULES)
def test_kept_empty_producer_groups_are_bounded(monkeypatch, rules):
    """4.9.8 keeps every emptied producer group name for ever; here at most maxRegisteredGroups names
    (RegistryConfig.max_groups) and EMPTY_PRODUCER_GROUPS_MAX_BYTES, the oldest forgotten first (answered as
    5.x: not exist). A client chooses the names: a flood of connect, register, close stays within both."""
    reg = ClientRegistry(RegistryConfig(client_management_rules=rules, max_groups=3), clock=lambda: 1000)
    for i in range(6):
        assert reg.heartbeat(i, _producer_hb(f"c@{i}", f"pg{i}")).code == 0
        assert reg.close_channel(i) is True
        reg.check_invariants()
    kept = [g for g in (f"pg{i}" for i in range(6)) if reg.producer_connection(g) is not None]
    assert kept == (["pg3", "pg4", "pg5"] if rules == 4 else [])
    assert all(reg.producer_connection(g).to_dict() == {"connectionSet": []} for g in kept)
    assert reg.producer_groups() == []  # an empty group is not a live one: it takes no group budget
    # the bytes: a long name pushes the oldest out; one larger than the budget is not kept at all
    monkeypatch.setattr(producer_manager, "EMPTY_PRODUCER_GROUPS_MAX_BYTES", 2000)
    long_name = "L" * 1000
    reg.heartbeat(10, _producer_hb("c@10", long_name))
    reg.close_channel(10)
    kept = ["pg4", "pg5", long_name] if rules == 4 else []  # 212 + 212 + 1209 bytes: the name count decides
    assert list(reg.producers.emptied) == kept
    reg.heartbeat(11, _producer_hb("c@11", "M" * 500))  # 709 bytes: pg4 and pg5 make room
    reg.close_channel(11)
    kept = [long_name, "M" * 500] if rules == 4 else []
    assert list(reg.producers.emptied) == kept
    reg.heartbeat(12, _producer_hb("c@12", "H" * 5000))  # larger than the budget: not kept, nothing forgotten
    reg.close_channel(12)
    assert reg.producer_connection("H" * 5000) is None and list(reg.producers.emptied) == kept
    reg.check_invariants()
    assert reg.producers.emptied_bytes == (sum(reg.producers.emptied.values()) if rules == 4 else 0)


@pytest.mark.parametrize("rules", RULES)
def test_native_and_twin_close_keep_the_same_empty_groups(rules):
    """The native close (engine.registry._rules) and the Python one keep the same emptied groups."""
    from test_registry_rules import native_model, pair

    (native, _), (twin, _) = pair(RegistryConfig(client_management_rules=rules))
    for reg in (native, twin):
        for i in range(3):
            reg.heartbeat(i, native_model(_producer_hb(f"c@{i}", "shared", f"own{i}")))
        reg.close_channel(1)
        reg.close_channel(0)
        reg.unregister(2, "c@2", "own2")
        reg.close_channel(2)
        reg.check_invariants()
    assert native.close_channel.__self__ is native._rules  # the C close ran
    assert list(native.producers.emptied.items()) == list(twin.producers.emptied.items())
    assert list(twin.producers.emptied) == (["own1", "own0", "shared"] if rules == 4 else [])


def _lock_body(group="lock_group", client_id="10.0.0.1@lock"):
    return json.dumps({"consumerGroup": group, "clientId": client_id,
                       "mqSet": [{"topic": "LockTopic", "brokerName": "b", "queueId": 0}]}).encode()


#: (request code, ext fields, body, answer's code, remark, ext fields) as 4.9.8's and 5.x's processors give them
#: for these requests: a processor whose answer is createResponseCommand(XxxResponseHeader.class) carries an
#: extFields map (empty when the header has no value), createResponseCommand(null) none at all
ANSWERS = [
    (RequestCode.UNREGISTER_CLIENT, {"clientID": "10.0.0.1@gone", "producerGroup": "p", "consumerGroup": "c"}, b"",
     ResponseCode.SUCCESS, None, {}),
    # with the body a client sends (4.9.8 decodes a missing body as null: a NullPointerException, SYSTEM_ERROR)
    (RequestCode.CHECK_CLIENT_CONFIG, {}, json.dumps({
        "clientId": "10.0.0.1@check", "group": "check_group", "subscriptionData": {
            "classFilterMode": False, "topic": "T", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1,
            "expressionType": "TAG"}}).encode(), ResponseCode.SUCCESS, None, None),
    # without a body: 4.9.8's NullPointerException is a SYSTEM_ERROR (its remark is Java's exception text; ours
    # is our own)
    (RequestCode.CHECK_CLIENT_CONFIG, {}, b"", ResponseCode.SYSTEM_ERROR,
     "CheckClientRequestBody: the request has no body", None),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "nobody"}, b"",
     ResponseCode.SYSTEM_ERROR, "no consumer for this group, nobody", {}),
    (RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "nobody"}, b"",
     ResponseCode.CONSUMER_NOT_ONLINE, "the consumer group[nobody] not online", None),
    (RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "nobody"}, b"",
     ResponseCode.SYSTEM_ERROR, "the producer group[nobody] not exist", None),
    (RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"}, b"", ResponseCode.SUCCESS, None, {"offset": "0"}),
    (RequestCode.GET_MIN_OFFSET, {"topic": "T", "queueId": "0"}, b"", ResponseCode.SUCCESS, None, {"offset": "0"}),
    (RequestCode.LOCK_BATCH_MQ, {}, _lock_body(), ResponseCode.SUCCESS, None, None),
    (RequestCode.UNLOCK_BATCH_MQ, {}, _lock_body(), ResponseCode.SUCCESS, None, None),
]


@pytest.mark.parametrize("rules", RULES)
def test_answers_carry_javas_response_headers(broker_factory, rules):
    """Code, remark and extFields of each admin and client-management answer (JSON, where an empty extFields map
    and none differ on the wire), the same under both rules for these requests."""
    broker = broker_factory(client_management_rules=rules)
    c = Client(broker.ports["main"])
    try:
        for code, ext, body, want_code, want_remark, want_ext in ANSWERS:
            r = c.call(code, ext, body)
            assert (r.code, r.remark, r.ext_fields) == (want_code, want_remark, want_ext), code
        r = c.call(RequestCode.LOCK_BATCH_MQ, {}, _lock_body())
        assert json.loads(r.body) == {"lockOKMQSet": [{"brokerName": "b", "queueId": 0, "topic": "LockTopic"}]}
        assert c.heartbeat(client_id="10.0.0.1@member").code == 0
        r = c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "demo_consumer_group"})
        assert (r.code, r.remark, r.ext_fields) == (ResponseCode.SUCCESS, None, {})
        assert json.loads(r.body) == {"consumerIdList": ["10.0.0.1@member"]}
        # an offset commit for a group and topic the broker does not know: 4.9.8 commits it; 5.3+ refuses it
        r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "unknown_group", "topic": "UnknownTopic",
                                                        "queueId": "0", "commitOffset": "7"})
        if rules == 4:
            assert (r.code, r.remark, r.ext_fields) == (ResponseCode.SUCCESS, None, {})
            r = c.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "unknown_group", "topic": "UnknownTopic",
                                                           "queueId": "0"})
            assert (r.code, r.ext_fields) == (ResponseCode.SUCCESS, {"offset": "7"})
        else:
            assert (r.code, r.remark, r.ext_fields) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                                        "Group unknown_group not exist!", {})
    finally:
        c.close()


def test_offset_commits_of_unknown_groups_stay_within_the_offset_budget(broker_factory):
    """Under 4.x rules any group's and topic's offset is committed (4.9.8): the offset table's budget
    (maxConsumerOffsetEntries) bounds what clients can add that way."""
    broker = broker_factory(client_management_rules=4, max_consumer_offset_entries=3)
    c = Client(broker.ports["main"])
    try:
        answers = [c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": f"g{i}", "topic": "T", "queueId": "0",
                                                              "commitOffset": "1"}) for i in range(5)]
        assert [r.code for r in answers] == [0, 0, 0, ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_ERROR]
        assert answers[3].remark == "the consumer offset table is full (maxConsumerOffsetEntries=3)"
        r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g0", "topic": "T", "queueId": "0",
                                                        "commitOffset": "9"})
        assert r.code == 0  # a committed one still moves
        assert broker.call(lambda: broker.registry.store.offsets.entries) == 3
    finally:
        c.close()


#: request codes 4.9.8's BrokerController serves (its processors' tables and AdminBrokerProcessor's switch) that
#: this broker does not: docs/conformance.md lists them, and why; a code served one day fails here until the row
#: is updated
NOT_SERVED_4_9_8 = {
    # messages: no message store
    12: "QUERY_MESSAGE", 32: "GET_EARLIEST_MSG_STORETIME", 29: "SEARCH_OFFSET_BY_TIMESTAMP", 33: "VIEW_MESSAGE_BY_ID",
    36: "CONSUMER_SEND_MSG_BACK", 37: "END_TRANSACTION", 324: "SEND_REPLY_MESSAGE", 325: "SEND_REPLY_MESSAGE_V2",
    303: "QUERY_CONSUME_TIME_SPAN", 306: "CLEAN_EXPIRED_CONSUMEQUEUE", 308: "QUERY_CORRECTION_OFFSET",
    314: "CLONE_GROUP_OFFSET", 316: "CLEAN_UNUSED_TOPIC", 321: "QUERY_CONSUME_QUEUE", 323: "RESUME_CHECK_HALF_MESSAGE",
    329: "DELETE_EXPIRED_COMMITLOG",
    # tables, stats and configuration read or changed through the admin tools
    21: "GET_ALL_TOPIC_CONFIG", 25: "UPDATE_BROKER_CONFIG", 26: "GET_BROKER_CONFIG", 28: "GET_BROKER_RUNTIME_INFO",
    43: "GET_ALL_CONSUMER_OFFSET", 45: "GET_ALL_DELAY_OFFSET", 200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    201: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG", 202: "GET_TOPIC_STATS_INFO", 207: "DELETE_SUBSCRIPTIONGROUP",
    208: "GET_CONSUME_STATS", 215: "DELETE_TOPIC_IN_BROKER", 222: "INVOKE_BROKER_TO_RESET_OFFSET",
    223: "INVOKE_BROKER_TO_GET_CONSUMER_STATUS", 300: "QUERY_TOPIC_CONSUME_BY_WHO", 305: "GET_SYSTEM_TOPIC_LIST_FROM_BROKER",
    307: "GET_CONSUMER_RUNNING_INFO", 309: "CONSUME_MESSAGE_DIRECTLY", 315: "VIEW_BROKER_STATS_DATA",
    317: "GET_BROKER_CONSUME_STATS", 328: "GET_ALL_PRODUCER_INFO",
    50: "UPDATE_AND_CREATE_ACL_CONFIG", 51: "DELETE_ACL_CONFIG", 52: "GET_BROKER_CLUSTER_ACL_INFO",
    53: "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG",
}


@pytest.mark.parametrize("rules", RULES)
def test_requests_4_9_8_serves_and_this_broker_does_not(broker_factory, rules):
    """Each is answered as 4.9.8 answers a code it has no processor for (AdminBrokerProcessor's default:
    REQUEST_CODE_NOT_SUPPORTED ' request type N not supported', no extFields), and the connection goes on."""
    broker = broker_factory(client_management_rules=rules)
    c = Client(broker.ports["main"])
    try:
        for code, name in NOT_SERVED_4_9_8.items():
            r = c.call(code, {"topic": "T", "consumerGroup": "G", "queueId": "0"})
            assert (r.code, r.remark, r.ext_fields) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                                        f" request type {code} not supported", None), name
        assert c.heartbeat(client_id="10.0.0.1@after").code == ResponseCode.SUCCESS
    finally:
        c.close()

"""A heartbeat without subVersion: Java stamps the decode time on every heartbeat, so the broker's subscription
follows the latest heartbeat (the decoded-body cache and the repeat route must not freeze the first time)."""
import json
import time

from engine.codec.enums import RequestCode, ResponseCode
from test_server import Client, broker, broker_factory  # noqa: F401  (fixtures)

NO_SUB_VERSION = json.dumps({
    "clientID": "10.0.0.5@nosub", "producerDataSet": [],
    "consumerDataSet": [{"groupName": "nosub_group", "consumeType": "CONSUME_PASSIVELY",
                         "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                         "subscriptionDataSet": [{"topic": "TopicTest", "subString": "*", "tagsSet": [],
                                                  "codeSet": []}]}]}).encode()


def sub_version(c):
    r = c.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "nosub_group"})
    assert r.code == ResponseCode.SUCCESS
    return json.loads(r.body)["subscriptionTable"]["TopicTest"]["subVersion"]


def test_missing_sub_version_takes_each_heartbeats_time(broker):
    c = Client(broker.ports["main"])
    try:
        seen = []
        for _ in range(3):
            before = int(time.time() * 1000)
            assert c.call(RequestCode.HEART_BEAT, {}, NO_SUB_VERSION).code == ResponseCode.SUCCESS
            seen.append(sub_version(c))
            assert seen[-1] >= before
            time.sleep(0.01)
        assert seen[0] < seen[1] < seen[2]
        assert broker.server.repeats  # the route is on, yet this body is never armed
        assert not any(conn.repeat for conn in broker.server.connections)
    finally:
        c.close()

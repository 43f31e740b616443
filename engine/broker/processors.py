"""Request processors of the broker front end: ClientManageProcessor, ConsumerManageProcessor, the parts of
AdminBrokerProcessor and PullMessageProcessor that clients need, and the name-server route answers of a
standalone broker.

Each handler is ``handler(conn, cmd) -> RemotingCommand | None`` (None: no answer now; a held PULL_MESSAGE is
answered later by a timer). Answers are built with ``cmd.response`` so they carry the request's opaque, the
response flag, the request's serialize type and version 479. The broker wires them into the processor table in
:mod:`engine.broker.controller`.
"""
from __future__ import annotations

import json
import logging
import struct
import time

from engine import AnswerTemplate, RemotingCommand, decode_heartbeat
from engine.codec.enums import FLAG_ONEWAY, RequestCode, ResponseCode
from engine.codec.errors import HeartbeatError, RemotingError, clip, echo
from engine.registry import clientlog as jl

log = logging.getLogger("engine.broker.processors")

QUERY_NOT_FOUND = 22  # ResponseCode.QUERY_NOT_FOUND
#: longest client-supplied name a remark echoes (RocketMQ names are at most 255 characters)
MAX_ECHOED_NAME = 255
# an Enum member lookup costs ~0.2 us: too much per heartbeat
_SUCCESS = int(ResponseCode.SUCCESS)
_HEART_BEAT = int(RequestCode.HEART_BEAT)


class RequestError(RemotingError, ValueError):
    """A request lacks a required ext field or carries an unparsable one (answered SYSTEM_ERROR)."""


def _required(cmd, name: str) -> str:
    """A @CFNotNull custom-header field. Java skips the check when a request has no extFields at all and its
    handler then fails on the null field (SYSTEM_ERROR with an exception text); here both cases are the same
    SYSTEM_ERROR with the field's name."""
    ext = cmd.ext_fields
    value = None if ext is None else ext.get(name)
    if value is None:
        raise RequestError(f"the custom field <{name}> is null")
    return value if type(value) is str else str(value)


def _optional(cmd, name: str):
    ext = cmd.ext_fields
    value = None if ext is None else ext.get(name)
    return value if value is None or type(value) is str else str(value)


_INT_BOUNDS = {32: (-(1 << 31), (1 << 31) - 1), 64: (-(1 << 63), (1 << 63) - 1)}


def _int_field(cmd, name: str, required: bool = True, default=None, bits: int = 32) -> int | None:
    """An int (bits=32) or long (bits=64) header field, parsed as Integer.parseInt / Long.parseLong do: an
    optional sign and ASCII digits, in range (no spaces, underscores or other scripts' digits)."""
    text = _required(cmd, name) if required else _optional(cmd, name)
    if text is None:
        return default
    digits = text[1:] if text[:1] in ("-", "+") else text
    if not (digits.isascii() and digits.isdigit()):
        raise RequestError(f"the custom field <{name}> is not a number: {echo(text)}")
    value = int(text)
    lo, hi = _INT_BOUNDS[bits]
    if not lo <= value <= hi:
        raise RequestError(f"the custom field <{name}> is out of range: {echo(text)}")
    return value


def _name(value) -> str:
    """A client's group or topic name echoed in a remark, clipped (the answer must stay small)."""
    return clip(str(value), MAX_ECHOED_NAME)


#: smallest group whose encoded consumer list is kept for the next ask (BrokerConfig.consumer_list_cache_bytes)
CONSUMER_LIST_CACHE_MIN = 64

#: largest JSON request body parsed (on the event loop): a lock batch of 10,000 queues is ~0.7 MB; a 16 MB body
#: of tiny arrays would take ~3 s of the loop to parse
MAX_JSON_BODY = 2 * 1024 * 1024


def _json_object(body: bytes, what: str) -> dict:
    """A request body that must be a JSON object; anything else is a RequestError naming the body. (json's C
    scanner guards its own recursion: a deeply nested body raises RecursionError, caught here, in linear time.)"""
    if len(body) > MAX_JSON_BODY:
        raise RequestError(f"{what} is larger than {MAX_JSON_BODY} bytes")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RequestError(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise RequestError(f"{what} is not a JSON object")
    return doc


def _lock_batch_body(body, what: str):
    """(consumerGroup, clientId, [(topic, brokerName, queueId), ...]) of a Lock/UnlockBatchRequestBody."""
    req = _json_object(body or b"{}", what)
    group, client_id, mq_set = req.get("consumerGroup"), req.get("clientId"), req.get("mqSet")
    if mq_set is None:
        mq_set = []
    if not isinstance(group, str) or not isinstance(client_id, str):
        raise RequestError(f"{what}: consumerGroup and clientId must be strings")
    if not isinstance(mq_set, list):
        raise RequestError(f"{what}: mqSet is not a list")
    mqs = []
    for i, mq in enumerate(mq_set):
        if not isinstance(mq, dict):
            raise RequestError(f"{what}: mqSet[{i}] is not an object")
        topic, broker_name, queue_id = mq.get("topic"), mq.get("brokerName"), mq.get("queueId")
        # fastjson turns a numeric string into the int field as well
        if isinstance(queue_id, str) and queue_id.strip().lstrip("-").isdigit() and queue_id.isascii():
            queue_id = int(queue_id)
        if (not isinstance(topic, str) or not isinstance(broker_name, str) or type(queue_id) is not int
                or not -2**31 <= queue_id < 2**31):
            raise RequestError(f"{what}: mqSet[{i}] needs a topic, a brokerName and an int queueId")
        mqs.append((topic, broker_name, queue_id))
    return group, client_id, mqs


def _fastjson_string(value, what: str):
    """A String bean field as fastjson fills it: null, a string, or a scalar's text (5 -> "5", true -> "true");
    an object or array is a RequestError (never handed to the filter compiler as a Python list)."""
    if value is None or type(value) is str:
        return value
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) in (int, float):
        return json.dumps(value)
    raise RequestError(f"{what} is not a string")


def _check_client_body(body) -> dict:
    """A CheckClientRequestBody with the fields CHECK_CLIENT_CONFIG reads typed: subscriptionData an object (or
    null), its expressionType and subString strings (or null)."""
    what = "CheckClientRequestBody"
    doc = _json_object(body, what)
    sd = doc.get("subscriptionData")
    if sd is None:
        return {}
    if not isinstance(sd, dict):
        raise RequestError(f"{what}: subscriptionData is not an object")
    return {"subscriptionData": {
        "expressionType": _fastjson_string(sd.get("expressionType"), f"{what}: subscriptionData.expressionType"),
        "subString": _fastjson_string(sd.get("subString"), f"{what}: subscriptionData.subString")}}


def _mq_json(mq) -> dict:
    """A MessageQueue as fastjson writes it (keys sorted)."""
    topic, broker_name, queue_id = mq
    return {"brokerName": broker_name, "queueId": queue_id, "topic": topic}


def _json_body(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# Sentinel opaques for locating the opaque in an encoded answer: every byte of their big-endian int32 form and the
# first and last digit of their decimal form differ, so two encodings differ exactly in the opaque's bytes.
_SENTINELS = (0x12345678, 0x23456789)
_CHECK_OPAQUES = (0, 1, 7, 10, -1, -10, 99999, 1_000_000_000, -2_147_483_648, 2_147_483_647)
_INT32 = struct.Struct(">i")


def answer_template(encode, template=AnswerTemplate) -> AnswerTemplate | None:
    """``encode(opaque) -> frame`` for a body-less answer; its template, or None if the layout is not recognised.

    ``template`` is the class (the facade's implementation by default; tests pass each one)."""
    a, b = encode(_SENTINELS[0]), encode(_SENTINELS[1])
    if len(a) != len(b) or a == b or len(a) < 12 or a[:4] != (len(a) - 4).to_bytes(4, "big"):
        return None
    i = 0
    while a[i] == b[i]:
        i += 1
    j = len(a)
    while a[j - 1] == b[j - 1]:
        j -= 1
    if i < 8:
        return None
    slot = a[i:j]
    if slot == b"%d" % _SENTINELS[0] and int.from_bytes(a[5:8], "big") == len(a) - 8:
        tpl = template(a[:i], a[j:], a[4])
    elif slot == _INT32.pack(_SENTINELS[0]):
        tpl = template(a[:i], a[j:], None)
    else:
        return None
    for opaque in _CHECK_OPAQUES:
        if tpl.frame(opaque) != encode(opaque):
            return None
    return tpl


class HeartbeatRepeat:
    """A connection's heartbeat that its client keeps sending unchanged: the connection's decoder hands back only
    the opaque of each repeat (see FrameDecoder.arm_repeat), the registry refreshes the slot on the token of the
    fast-path arming, and the answer comes from the template. :meth:`answer` returns None once the token no longer
    holds; the connection then hands the request to the full path."""

    __slots__ = ("registry", "metrics", "token", "template", "serialize_type")

    def __init__(self, processors, token, template, serialize_type):
        self.registry, self.metrics = processors.registry, processors.metrics
        self.token, self.template, self.serialize_type = token, template, serialize_type

    def answer(self, conn, opaque):
        if self.registry.heartbeat_repeat(self.token) is None:
            return None
        metrics = self.metrics
        metrics.requests[_HEART_BEAT] += 1
        metrics.heartbeats += 1
        conn.serialize_type = self.serialize_type
        return self.template.frame(opaque)


class Processors:
    """The handlers, bound to one broker (registry, config, metrics, addresses, recorder).

    A handler returns a RemotingCommand, or an already encoded frame (bytes) for answers served from a template.
    """

    def __init__(self, broker):
        self.broker = broker
        self.registry = broker.registry
        self.config = broker.config
        self.metrics = broker.metrics
        #: (serialize type, IS_SUB_CHANGE, with ext fields) of a SUCCESS heartbeat answer -> AnswerTemplate or False
        self._hb_answers: dict = {}
        #: group -> (client ids, encoded consumer list) of large groups (consumerListCacheBytes), oldest first
        self._consumer_lists: dict = {}
        self._consumer_lists_bytes = 0

    # ------------------------------------------------------------------ ClientManageProcessor
    def heart_beat(self, conn, cmd):
        body = cmd.body
        recorder = self.broker.recorder
        self.metrics.heartbeats += 1
        # a client sends the same body every 30 s: decoding is pure, so an identical body reuses the decoded
        # (immutable) HeartbeatData of this connection's previous heartbeat (and the registry, seeing the same
        # object, skips hashing it)
        route = conn.route
        if body == route.body:
            hb = route.hb
            kept = True
        else:
            try:
                hb = decode_heartbeat(body, self.config.max_heartbeat_elements)  # the decode's size bounded
            except HeartbeatError as e:
                if recorder is not None:  # recorded clipped, with its size and the reason
                    recorder.record(int(time.time() * 1000), conn.id, conn.remote_addr, cmd.language, cmd.version,
                                    body, error=str(e))
                self.metrics.heartbeat_errors += 1
                self.broker.server.client_log.log(logging.INFO, "bad_heartbeat", "bad heartbeat from %s: %s",
                                                 conn.remote_addr, e)
                return cmd.response(ResponseCode.SYSTEM_ERROR, remark=str(e))
            if hb.consumers and body.count(b'"subVersion"') < sum(len(cd.subscriptions) for cd in hb.consumers):
                # a subscription without subVersion: Java stamps the decode time on it at every heartbeat (a
                # newer subVersion replaces the subscription), so such a body is decoded every time: no cached
                # decode, no repeat route
                route.keep_norepeat(body)
                kept = False
            else:
                # cached within maxHeartbeatCacheBytesTotal; past it this heartbeat keeps nothing (not offered)
                kept = route.keep(body, hb)
        if recorder is not None:
            recorder.record(int(time.time() * 1000), conn.id, conn.remote_addr, cmd.language, cmd.version, body)
        result = self.registry.heartbeat(conn, hb, cmd.language, cmd.version)
        tpl = self._template(cmd, result)
        if tpl:
            # a candidate only where the route is on (there the connection's decoder watches heartbeats), and never
            # for a oneway heartbeat: its repeats would be answered from the template (a repeat's frame equals the
            # armed one but for the opaque, so the route armed on an answered heartbeat takes no oneway frame)
            if (kept and conn.decoder.watch_code is not None and not cmd.flag & FLAG_ONEWAY
                    and body != route.norepeat):
                token = self.registry.repeat_token(conn, hb, cmd.language, cmd.version)
                if token is not None:
                    repeat_tpl = self._template(cmd, token[-1])  # token[-1]: the result a repeat gets
                    if repeat_tpl:  # the connection arms its decoder once the read is done
                        route.offer(HeartbeatRepeat(self, token, repeat_tpl, cmd.serialize_type), cmd)
            return tpl.frame(cmd.opaque)
        return cmd.response(result.code, remark=result.remark, ext_fields=result.ext_fields)

    def _template(self, cmd, result):
        """SUCCESS answers differ only in IS_SUB_CHANGE (and the opaque): the encoded template, or False."""
        if result.code != _SUCCESS or result.remark is not None:
            return False
        key = (cmd.serialize_type, result.is_sub_change, result.v2_fields)
        tpl = self._hb_answers.get(key)
        if tpl is None:
            tpl = self._hb_answers[key] = self._answer_template(cmd, result) or False
        return tpl

    @staticmethod
    def _answer_template(cmd, result) -> AnswerTemplate | None:
        code, remark, ext, serialize_type = result.code, result.remark, result.ext_fields, cmd.serialize_type

        def encode(opaque):
            request = RemotingCommand(RequestCode.HEART_BEAT, opaque=opaque, serialize_type=serialize_type)
            return request.response(code, remark=remark, ext_fields=ext).encode()

        return answer_template(encode)

    def unregister_client(self, conn, cmd):
        client_id = _required(cmd, "clientID")
        code, remark = self.registry.unregister(conn, client_id, _optional(cmd, "producerGroup"),
                                                _optional(cmd, "consumerGroup"), cmd.language, cmd.version)
        return cmd.response(code, remark=remark, ext_fields={} if code == ResponseCode.SUCCESS else None)

    def check_client_config(self, conn, cmd):
        if not cmd.body:  # Java decodes a missing body as null: a NullPointerException, SYSTEM_ERROR (own remark)
            raise RequestError("CheckClientRequestBody: the request has no body")
        code, remark = self.registry.check_client_config(_check_client_body(cmd.body))
        return cmd.response(code, remark=remark)

    # ------------------------------------------------------------------ ConsumerManageProcessor
    def get_consumer_list_by_group(self, conn, cmd):
        group = _required(cmd, "consumerGroup")
        ids = self.registry.consumer_ids(group)
        if ids:
            return cmd.response(ResponseCode.SUCCESS, ext_fields={}, body=self._consumer_list_body(group, ids))
        # ConsumerManageProcessor.getConsumerListByGroup's WARN (Java's broker.log), within the client-management
        # log's budget: any client may ask for any group
        registry = self.registry
        if registry.client_log.allow("consumer_list_failed", logging.WARNING):
            if registry.consumer_group_info(group) is None:
                jl.log.warning("getConsumerGroupInfo failed, %s %s", jl._text(group), jl._text(conn.remote_addr))
            else:  # a group without members (Java keeps none: it is removed with its last channel)
                jl.log.warning("getAllClientId failed, %s %s", jl._text(group), jl._text(conn.remote_addr))
        # the error answer carries the (empty) GetConsumerListByGroupResponseHeader too, as Java's does
        return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"no consumer for this group, {_name(group)}",
                            ext_fields={})

    def _consumer_list_body(self, group: str, ids: list) -> bytes:
        """The ConsumerListBody of ``ids``; for a group of CONSUMER_LIST_CACHE_MIN or more members the encoding
        is kept (within consumerListCacheBytes) and reused while the group's list is the same: after a change
        every member asks for it (NOTIFY_CONSUMER_IDS_CHANGED), and encoding a 10k list costs ~1.5 ms."""
        limit = self.config.consumer_list_cache_bytes
        if len(ids) < CONSUMER_LIST_CACHE_MIN or not limit:
            return _json_body({"consumerIdList": list(ids)})
        cache = self._consumer_lists
        kept = cache.pop(group, None)
        if kept is not None:
            if kept[0] == ids:
                cache[group] = kept  # the newest again
                return kept[1]
            self._consumer_lists_bytes -= 2 * len(kept[1])
        body = _json_body({"consumerIdList": list(ids)})
        cost = 2 * len(body)  # the ids kept to compare with are about as large as their encoding
        if cost <= limit:
            while self._consumer_lists_bytes + cost > limit:  # the oldest kept lists make room
                self._consumer_lists_bytes -= 2 * len(cache.pop(next(iter(cache)))[1])
            cache[group] = (ids, body)
            self._consumer_lists_bytes += cost
        return body

    def update_consumer_offset(self, conn, cmd):
        group = _required(cmd, "consumerGroup")
        topic = _required(cmd, "topic")
        queue_id = _int_field(cmd, "queueId")
        offset = _int_field(cmd, "commitOffset", bits=64)
        code, remark = self.registry.update_consumer_offset(conn.remote_addr, group, topic, queue_id, offset)
        return cmd.response(code, remark=remark, ext_fields={})

    def query_consumer_offset(self, conn, cmd):
        group = _required(cmd, "consumerGroup")
        topic = _required(cmd, "topic")
        queue_id = _int_field(cmd, "queueId")
        offset = self.registry.query_consumer_offset(group, topic, queue_id)
        if offset is not None and offset >= 0:
            return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
        # no message store: every queue is empty (min offset 0, offset 0 neither on disk nor in memory). 4.9.8 then
        # answers offset 0 (minOffset <= 0 && !checkInDiskByConsumeOffset(0)) and has no setZeroIfNotFound; 5.x
        # answers offset 0 only when offset 0 is in memory (checkInMemByConsumeOffset), so never here. The answer
        # carries the (empty) QueryConsumerOffsetResponseHeader as Java's does.
        if self.config.client_management_rules == 4:
            return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
        set_zero = _optional(cmd, "setZeroIfNotFound")  # Boolean.parseBoolean: any value but "true" (any case) is false
        if set_zero is not None and set_zero.lower() != "true":
            return cmd.response(QUERY_NOT_FOUND, remark="Not found, do not set to zero, maybe this group boot first",
                                ext_fields={})
        return cmd.response(QUERY_NOT_FOUND, remark="Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
                            ext_fields={})

    # ------------------------------------------------------------------ AdminBrokerProcessor (the parts clients use)
    def get_consumer_connection_list(self, conn, cmd):
        group = _required(cmd, "consumerGroup")
        info = self.registry.consumer_connection(group)
        if info is None:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, remark=f"the consumer group[{_name(group)}] not online")
        return cmd.response(ResponseCode.SUCCESS, body=_json_body(info.to_dict()))

    def get_producer_connection_list(self, conn, cmd):
        group = _required(cmd, "producerGroup")
        info = self.registry.producer_connection(group)
        if info is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"the producer group[{_name(group)}] not exist")
        return cmd.response(ResponseCode.SUCCESS, body=_json_body(info.to_dict()))

    def get_max_offset(self, conn, cmd):
        # no message store: every queue is empty, so its max (and min) offset is 0
        _required(cmd, "topic")
        _int_field(cmd, "queueId")
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})

    get_min_offset = get_max_offset

    def lock_batch_mq(self, conn, cmd):
        """AdminBrokerProcessor.lockBatchMQ: the queues of mqSet this client now owns (RebalanceLockManager)."""
        group, client_id, mqs = _lock_batch_body(cmd.body, "LockBatchRequestBody")
        locked = self.broker.rebalance_lock_manager.try_lock_batch(group, mqs, client_id)
        return cmd.response(ResponseCode.SUCCESS, body=_json_body({"lockOKMQSet": [_mq_json(mq) for mq in locked]}))

    def unlock_batch_mq(self, conn, cmd):
        """AdminBrokerProcessor.unlockBatchMQ: release the caller's locks of mqSet (others' locks stay)."""
        group, client_id, mqs = _lock_batch_body(cmd.body, "UnlockBatchRequestBody")
        self.broker.rebalance_lock_manager.unlock_batch(group, mqs, client_id)
        return cmd.response(ResponseCode.SUCCESS)

    def update_and_create_topic(self, conn, cmd):
        """AdminBrokerProcessor.updateAndCreateTopic (4.9.8): CreateTopicRequestHeader's @CFNotNull fields, the
        topic's checks, then the TopicConfig is put, written and registered (Broker.update_and_create_topic)."""
        from engine.registry.topic_config_manager import TopicConfig

        topic = _required(cmd, "topic")
        _required(cmd, "defaultTopic")
        read_queue_nums = _int_field(cmd, "readQueueNums")
        write_queue_nums = _int_field(cmd, "writeQueueNums")
        perm = _int_field(cmd, "perm")
        filter_type = _required(cmd, "topicFilterType")
        sys_flag = _int_field(cmd, "topicSysFlag", required=False, default=0)
        _required(cmd, "order")  # Boolean.parseBoolean: any text; 4.9.8 does not set it on the config
        if filter_type not in ("SINGLE_TAG", "MULTI_TAG"):  # TopicFilterType.valueOf
            raise RequestError(f"No enum constant org.apache.rocketmq.common.TopicFilterType.{_name(filter_type)}")
        tc = TopicConfig(topic, read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums, perm=perm,
                         topic_filter_type=filter_type, topic_sys_flag=sys_flag)
        refused = self.broker.update_and_create_topic(tc, conn.remote_addr)
        if refused is not None:
            return cmd.response(refused[0], remark=refused[1])
        return cmd.response(ResponseCode.SUCCESS)

    # ------------------------------------------------------------------ SendMessageProcessor (no store)
    def send_message(self, conn, cmd):
        """No message store, so no send succeeds; but as 4.9.8's msgCheck does before storing, a send of a topic
        this broker lacks creates it from its default topic (TBW102) and registers it with the name servers: the
        way a topic comes to exist behind a name server, so its consumers find this broker. Then the answer is the
        one every send had before: REQUEST_CODE_NOT_SUPPORTED (or Java's refusal of the topic)."""
        v2 = cmd.code != RequestCode.SEND_MESSAGE  # SendMessageRequestHeaderV2's one-letter names
        topic = _required(cmd, "b" if v2 else "topic")
        default_topic = _required(cmd, "c" if v2 else "defaultTopic")
        queue_nums = _int_field(cmd, "d" if v2 else "defaultTopicQueueNums")
        unit_mode = (_optional(cmd, "k" if v2 else "unitMode") or "").lower() == "true"
        refused = self.broker.msg_check(topic, default_topic, queue_nums, unit_mode, conn.remote_addr,
                                         conn.remote_ip)
        if refused is not None:
            return cmd.response(refused[0], remark=refused[1])
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark=f" request type {cmd.code} not supported")

    # ------------------------------------------------------------------ PullMessageProcessor (no store)
    def pull_message(self, conn, cmd):
        """Hold the pull like long polling does, then answer PULL_NOT_FOUND: clients wait instead of spinning."""
        if conn.closing:  # queued before its connection closed: nothing to hold, no one to answer
            return None
        queue_offset = _int_field(cmd, "queueOffset", required=False, default=0, bits=64)
        suspend = _int_field(cmd, "suspendTimeoutMillis", required=False, default=0, bits=64)
        sys_flag = _int_field(cmd, "sysFlag", required=False, default=0)
        response = cmd.response(
            ResponseCode.PULL_NOT_FOUND,
            remark="no new message",
            ext_fields={"suggestWhichBrokerId": "0", "nextBeginOffset": str(max(0, queue_offset)),
                        "minOffset": "0", "maxOffset": "0"},
        )
        # PullSysFlag bit 1 (FLAG_SUSPEND) asks for long polling; without it the seed answers at once
        if not (sys_flag & 0x2) or not self.config.long_polling_enable:
            return response
        if len(conn.held_pulls) >= self.config.max_inflight_per_connection:
            return cmd.response(ResponseCode.SYSTEM_BUSY, remark="[OVERLOAD]system busy, start flow control for a while")
        delay = min(max(suspend, 0), self.config.pull_max_suspend_millis) / 1000.0
        if delay <= 0:
            delay = self.broker.config.pull_max_suspend_millis / 1000.0
        data = response.encode()
        key = (cmd.opaque, id(cmd))

        def answer():
            conn.held_pulls.pop(key, None)
            conn.send(data)

        conn.held_pulls[key] = self.broker.loop.call_later(delay, answer)
        return None

    # ------------------------------------------------------------------ name server (standalone broker)
    def get_route_info_by_topic(self, conn, cmd):
        # no extFields: the name server finds no route for a null topic (TOPIC_NOT_EXIST, not an error)
        topic = _required(cmd, "topic") if cmd.ext_fields is not None else None
        tc = self.broker.ensure_topic(topic, conn.remote_ip) if topic else None
        if tc is None:
            # DefaultRequestProcessor.getRouteInfoByTopic's remark, FAQUrl.suggestTodo(APPLY_TOPIC_URL) included
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST,
                                remark=f"No topic route info in name server for the topic: {_name(topic or '')}"
                                "\nSee http://rocketmq.apache.org/docs/faq/ for further details.")
        addr = self.broker.advertised_addr(conn)
        name = self.config.broker_name
        route = {
            "brokerDatas": [{
                "brokerAddrs": {"0": addr},
                "brokerName": name,
                "cluster": self.config.broker_cluster_name,
                "enableActingMaster": False,
            }],
            "filterServerTable": {},
            "queueDatas": [{  # RouteInfoManager.createAndUpdateQueueData: the topic's config as registered
                "brokerName": name,
                "perm": tc.perm,
                "readQueueNums": tc.read_queue_nums,
                "topicSysFlag": tc.topic_sys_flag,
                "writeQueueNums": tc.write_queue_nums,
            }],
        }
        return cmd.response(ResponseCode.SUCCESS, body=_json_body(route))

    def get_broker_cluster_info(self, conn, cmd):
        name = self.config.broker_name
        addr = self.broker.advertised_addr(conn)
        info = {
            "brokerAddrTable": {name: {"brokerAddrs": {"0": addr}, "brokerName": name,
                                       "cluster": self.config.broker_cluster_name, "enableActingMaster": False}},
            "clusterAddrTable": {self.config.broker_cluster_name: [name]},
        }
        return cmd.response(ResponseCode.SUCCESS, body=_json_body(info))


#: (request code, handler name, executor) as BrokerController.registerProcessor wires them; every code is
#: registered on the main and the fast port (one table serves both here).
#:
#: Java runs HEART_BEAT, UNREGISTER_CLIENT and GET_CONSUMER_LIST_BY_GROUP on thread pools of their own; here they
#: run inline, in the read that decoded them (the native protocol dispatches them in Cython): each is bounded work
#: on the registry (a client's memberships are budgeted; a consumer list is one pass over the group), a queue would
#: only add its hop, and inline a connection's heartbeats, unregisters and consumer lists are served in the order
#: sent (Java's separate pools do not promise that either). A read's answers are one write, flushed early past
#: RemotingServer.out_flush_bytes.
PROCESSOR_TABLE = (
    (RequestCode.HEART_BEAT, "heart_beat", "inline"),
    (RequestCode.UNREGISTER_CLIENT, "unregister_client", "inline"),
    (RequestCode.CHECK_CLIENT_CONFIG, "check_client_config", "client_manage"),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, "get_consumer_list_by_group", "inline"),
    (RequestCode.UPDATE_CONSUMER_OFFSET, "update_consumer_offset", "consumer_manage"),
    (RequestCode.QUERY_CONSUMER_OFFSET, "query_consumer_offset", "consumer_manage"),
    (RequestCode.PULL_MESSAGE, "pull_message", "pull"),
    (RequestCode.SEND_MESSAGE, "send_message", "admin"),
    (RequestCode.SEND_MESSAGE_V2, "send_message", "admin"),
    (RequestCode.SEND_BATCH_MESSAGE, "send_message", "admin"),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, "update_and_create_topic", "admin"),
    (RequestCode.GET_CONSUMER_CONNECTION_LIST, "get_consumer_connection_list", "admin"),
    (RequestCode.GET_PRODUCER_CONNECTION_LIST, "get_producer_connection_list", "admin"),
    (RequestCode.GET_MAX_OFFSET, "get_max_offset", "admin"),
    (RequestCode.GET_MIN_OFFSET, "get_min_offset", "admin"),
    (RequestCode.LOCK_BATCH_MQ, "lock_batch_mq", "admin"),
    (RequestCode.UNLOCK_BATCH_MQ, "unlock_batch_mq", "admin"),
)

#: Name-server codes a standalone broker answers (no namesrvAddr configured).
NAMESRV_TABLE = (
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, "get_route_info_by_topic", "admin"),
    (RequestCode.GET_BROKER_CLUSTER_INFO, "get_broker_cluster_info", "admin"),
)

"""TopicConfigManager (org.apache.rocketmq.broker.topic.TopicConfigManager): the topic table, ``topics.json``.

:class:`TopicConfig` with the Java defaults and keys, the PermName and TopicSysFlag bits, and the manager: explicit
put/delete (UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER; written at once), the retry topics a heartbeat creates
(createTopicInSendMessageBackMethod; a derivable change, written within a second) within the store's auto-create
budget (``autoCreateMaxTopics``), the system topics a broker registers at start (:meth:`add_system_topics`), and
isOrderTopic. Each created topic is reported to the store's ``on_topic_created`` hook (the broker registers it with
the name servers at once).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from engine.registry.config_manager import INT32_MAX, INT32_MIN, KeyedConfigManager, StoreError, _get, _or_empty, _str_map
from engine.registry.clientlog import topic_config as _java_text

log = logging.getLogger("engine.registry.store")

__all__ = ["AUTO_CREATE_TOPIC_KEY_TOPIC", "FLAG_UNIT", "FLAG_UNIT_SUB", "PERM_INHERIT", "PERM_PRIORITY", "PERM_READ",
           "PERM_WRITE", "TopicConfig", "TopicConfigManager", "system_topic_configs"]

#: PermName bits (C/constant/PermName.java).
PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1
#: TopicSysFlag bits (C/sysflag/TopicSysFlag.java).
FLAG_UNIT, FLAG_UNIT_SUB = 1, 2
#: TopicValidator's names of the topics a broker creates at start.
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
RMQ_SYS_SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
RMQ_SYS_BENCHMARK_TOPIC = "BenchmarkTest"
RMQ_SYS_OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
RMQ_SYS_SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_TOPIC_QUEUE_NUM = 18  # TopicConfigManager (4.9.8)
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"  # MixAll


@dataclass
class TopicConfig:
    """TopicConfig with the Java defaults (16 queues, perm READ|WRITE, SINGLE_TAG). ``to_dict`` uses Java keys."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict = field(default_factory=dict)

    def __str__(self) -> str:
        """TopicConfig.toString(), as Java's log lines print it (``perm=RW-``); repr() stays Python's."""
        return _java_text(self)

    def to_dict(self) -> dict:
        return {
            "attributes": dict(self.attributes),
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_dict(cls, d, path="$") -> "TopicConfig":
        if not isinstance(d, dict):
            raise StoreError(f"{path}: expected an object")
        name = _get(d, "topicName", str, None, path)
        if not name:
            raise StoreError(f"{path}.topicName: missing")
        return cls(
            topic_name=name,
            read_queue_nums=_get(d, "readQueueNums", int, 16, path, INT32_MIN, INT32_MAX),
            write_queue_nums=_get(d, "writeQueueNums", int, 16, path, INT32_MIN, INT32_MAX),
            perm=_get(d, "perm", int, PERM_READ | PERM_WRITE, path, INT32_MIN, INT32_MAX),
            topic_filter_type=_get(d, "topicFilterType", str, "SINGLE_TAG", path),
            topic_sys_flag=_get(d, "topicSysFlag", int, 0, path, INT32_MIN, INT32_MAX),
            order=_get(d, "order", bool, False, path),
            attributes=_str_map(_or_empty(d.get("attributes")), f"{path}.attributes"),
        )



def system_topic_configs(*, cluster_name: str, broker_name: str, auto_create_topic_enable: bool = True,
                         default_topic_queue_nums: int = 8, cluster_topic_enable: bool = True,
                         broker_topic_enable: bool = True, trace_topic_enable: bool = False,
                         msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC") -> list[TopicConfig]:
    """The topics 4.9.8's TopicConfigManager constructor puts in its table, in its order, with its queue counts and
    perms (TopicConfig's defaults elsewhere: 16 queues, perm 6, topicSysFlag 0). A producer of a topic with no route
    asks the name server for TBW102's route to find a broker that may create the topic; the cluster-name and
    broker-name topics let a client address a cluster or one broker (readable/writable only with their switches)."""
    inherit_rw = PERM_INHERIT | PERM_READ | PERM_WRITE
    out = [TopicConfig(RMQ_SYS_SELF_TEST_TOPIC, 1, 1)]
    if auto_create_topic_enable:
        out.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, default_topic_queue_nums, default_topic_queue_nums,
                               perm=inherit_rw))
    out.append(TopicConfig(RMQ_SYS_BENCHMARK_TOPIC, 1024, 1024))
    out.append(TopicConfig(cluster_name, perm=inherit_rw if cluster_topic_enable else PERM_INHERIT))
    out.append(TopicConfig(broker_name, 1, 1, perm=inherit_rw if broker_topic_enable else PERM_INHERIT))
    out.append(TopicConfig(RMQ_SYS_OFFSET_MOVED_EVENT, 1, 1))
    out.append(TopicConfig(RMQ_SYS_SCHEDULE_TOPIC, SCHEDULE_TOPIC_QUEUE_NUM, SCHEDULE_TOPIC_QUEUE_NUM))
    if trace_topic_enable:
        out.append(TopicConfig(msg_trace_topic_name, 1, 1))
    out.append(TopicConfig(f"{cluster_name}_{REPLY_TOPIC_POSTFIX}", 1, 1))
    return out


class TopicConfigManager(KeyedConfigManager):
    """The topic table (TopicConfigManager): ``topics.json``."""

    FILE_NAME, TABLE_KEY, KEY_ATTR = "topics.json", "topicConfigTable", "topic_name"

    def __init__(self, store):
        super().__init__(store)
        #: names of the start topics (add_system_topics): the auto-create budget does not count them
        self.start_topics: set = set()

    def start_topic_count(self) -> int:
        """Start topics in the table (an admin may have deleted some)."""
        return sum(1 for name in self.start_topics if name in self.table)

    def put(self, config, derivable: bool = False):
        old = super().put(config, derivable)
        if old is None:
            self._store.topic_created(config.topic_name)
        return old

    def add_system_topics(self, configs) -> list[str]:
        """Put the broker's start-up topics (:func:`system_topic_configs`) that the loaded table lacks. Java puts
        them in the table before it loads ``topics.json``, whose entries then replace them: the same outcome. They
        are not written by themselves (Java writes them with the next change of the table), are not auto-created
        (the auto-create budget does not apply) and are not reported to ``on_topic_created`` (the broker registers
        them at start). Returns the names added."""
        added = []
        # Java puts them in order into one map: a later one of the same name (a broker named as its cluster)
        # replaces the earlier one
        for tc in {tc.topic_name: tc for tc in configs}.values():
            self.start_topics.add(tc.topic_name)
            if tc.topic_name and tc.topic_name not in self.table:
                self.table[tc.topic_name] = tc
                added.append(tc.topic_name)
        return added

    def _item_from_json(self, key, value, path):
        return TopicConfig.from_dict(value, path)

    def is_order_topic(self, topic: str) -> bool:
        tc = self.table.get(topic)
        return tc is not None and tc.order

    def create_topic_in_send_message_method(self, topic: str, default_topic: str, remote_address: str,
                                            client_default_topic_queue_nums: int, topic_sys_flag: int,
                                            auto_create_topic_enable: bool = True) -> TopicConfig | None:
        """createTopicInSendMessageMethod: a producer's first send of ``topic`` (routed to this broker through the
        default topic, TBW102) creates it from the default topic when that one has the inherit perm:
        min(client's defaultTopicQueueNums, the default topic's write queues) queues, its perm without inherit,
        its filter type. Returns the topic's config, or None (no default topic, no inherit perm, or the auto-create
        budget reached). Java writes the table at once; here it is a derivable change (the next send creates the
        topic again) and, as every created topic, it is registered with the name servers at once."""
        tc = self.table.get(topic)
        if tc is not None:
            return tc
        default = self.table.get(default_topic)
        if default is None:
            self._store._refusal_log.log(logging.WARNING, "send_default_topic", "Create new topic failed, because the "
                                    "default topic[%s] not exist. producer:[%s]", default_topic,
                                    remote_address)
            return None
        if default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not auto_create_topic_enable:
            # Java sets TBW102's perm in its table: a TBW102 from topics.json creates nothing then
            default = self.table[default_topic] = replace(default, perm=PERM_READ | PERM_WRITE)
        if not default.perm & PERM_INHERIT:
            self._store._refusal_log.log(logging.WARNING, "send_default_topic", "Create new topic failed, because the "
                                    "default topic[%s] has no perm [%d] producer:[%s]", default_topic,
                                    default.perm, remote_address)
            return None
        if not self._store.may_auto_create(self, topic):
            return None
        n = max(0, min(client_default_topic_queue_nums, default.write_queue_nums))
        tc = TopicConfig(topic, read_queue_nums=n, write_queue_nums=n, perm=default.perm & ~PERM_INHERIT,
                         topic_filter_type=default.topic_filter_type, topic_sys_flag=topic_sys_flag)
        self.table[topic] = tc
        log.info("Create new topic by default topic:[%s] config:[%s] producer:[%s]", default_topic, tc,
                 remote_address)
        self._changed(derivable=True)
        self._store.topic_created(topic)
        return tc

    def create_topic_in_send_message_back_method(self, topic: str, queue_nums: int, perm: int, is_order: bool,
                                                 topic_sys_flag: int) -> tuple[TopicConfig, bool]:
        """createTopicInSendMessageBackMethod: an existing topic only gets its order flag adjusted.

        Returns ``(config, changed)`` where ``changed`` says whether the table was modified (created or updated);
        ``(None, False)`` when the table is at its auto-create limit (:meth:`Store.may_auto_create`).
        """
        tc = self.table.get(topic)
        if tc is not None:
            if is_order is not None and tc.order != is_order:  # None (4.x): the order flag is left alone
                # replaced, not changed in place: a queued write's snapshot (a shallow copy of the table, encoded
                # later on the writer thread) keeps the config object as it was
                tc = self.table[topic] = replace(tc, order=is_order)
                self._changed(derivable=True)  # the next heartbeat sets it again
                return tc, True
            return tc, False
        if not self._store.may_auto_create(self, topic):
            return None, False
        tc = TopicConfig(topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm,
                         topic_sys_flag=topic_sys_flag, order=bool(is_order))
        self.table[topic] = tc
        log.info("create new topic %s", tc)
        self._changed(derivable=True)  # a retry topic: the next heartbeat of the group creates it again
        self._store.topic_created(topic)
        return tc, True

"""TopicConfigManager (engine.registry.topic_config_manager) on its own: the topic table, its writes and its budget.

The manager works through a :class:`engine.registry.store.Store` (its file, when it is written, the auto-create budget);
these tests drive the manager's own methods, not the registry's rules that call them.
"""
import json
import logging

import pytest

import engine.registry.store
from engine.registry.config_manager import StoreError
from engine.registry.store import Store
from engine.registry.topic_config_manager import (
    FLAG_UNIT_SUB,
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
    TopicConfigManager,
)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def on_disk(tmp_path):
    path = tmp_path / "config" / "topics.json"
    return json.loads(path.read_text())["topicConfigTable"] if path.exists() else {}


def test_the_old_import_path_names_the_same_objects():
    assert engine.registry.store.TopicConfigManager is TopicConfigManager and engine.registry.store.TopicConfig is TopicConfig
    assert engine.registry.store.PERM_READ == PERM_READ and engine.registry.store.StoreError is StoreError
    assert isinstance(Store().topics, TopicConfigManager)


def test_put_replace_delete_bump_the_version_and_are_written_at_once(tmp_path):
    store = Store(tmp_path)
    topics = store.topics
    v0 = topics.data_version.counter
    assert topics.put(TopicConfig("T", read_queue_nums=4)) is None
    assert on_disk(tmp_path)["T"]["readQueueNums"] == 4  # acknowledged: on disk on return
    old = topics.put(TopicConfig("T", read_queue_nums=8))
    assert old.read_queue_nums == 4 and topics.get("T").read_queue_nums == 8
    assert on_disk(tmp_path)["T"]["readQueueNums"] == 8
    assert topics.contains("T") and not topics.contains("U") and topics.get("U") is None
    assert topics.delete("T").read_queue_nums == 8
    assert "T" not in on_disk(tmp_path)
    v = topics.data_version.counter
    assert v == v0 + 3
    assert topics.delete("T") is None and topics.data_version.counter == v  # nothing removed: no new version
    assert store.pending_config_writes == 0


def test_created_topics_are_reported_once_and_a_failing_hook_is_logged(tmp_path, caplog):
    store = Store(tmp_path)
    created = []
    store.on_topic_created = created.append
    store.topics.put(TopicConfig("A"))
    store.topics.put(TopicConfig("A", perm=PERM_READ))  # a replacement is not a creation
    store.topics.create_topic_in_send_message_back_method("%RETRY%G", 1, PERM_READ | PERM_WRITE, False, 0)
    store.topics.create_topic_in_send_message_back_method("%RETRY%G", 1, PERM_READ | PERM_WRITE, False, 0)
    assert created == ["A", "%RETRY%G"]

    def broken(topic):
        raise RuntimeError("name server down")

    store.on_topic_created = broken
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        store.topics.put(TopicConfig("B"))  # the change stands; the hook's failure is not the caller's
    assert store.topics.contains("B") and "on_topic_created hook failed for B" in caplog.text


def test_retry_topic_creation_and_the_order_flag():
    store = Store()
    topics = store.topics
    tc, changed = topics.create_topic_in_send_message_back_method("%RETRY%G", 3, PERM_READ | PERM_WRITE, True,
                                                                  FLAG_UNIT_SUB)
    assert changed and (tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag, tc.order) == (
        3, 3, PERM_READ | PERM_WRITE, FLAG_UNIT_SUB, True)
    assert topics.is_order_topic("%RETRY%G") and not topics.is_order_topic("missing")
    # an existing topic keeps its queues; only the order flag follows, and None (4.x rules) leaves it alone
    same, changed = topics.create_topic_in_send_message_back_method("%RETRY%G", 9, PERM_READ, True, 0)
    assert same is tc and not changed
    assert topics.create_topic_in_send_message_back_method("%RETRY%G", 9, PERM_READ, None, 0) == (tc, False)
    flipped, changed = topics.create_topic_in_send_message_back_method("%RETRY%G", 9, PERM_READ, False, 0)
    assert changed and flipped.order is False and flipped.read_queue_nums == 3
    # replaced, not changed in place: a queued write's snapshot keeps the object it saw
    assert tc.order is True and topics.get("%RETRY%G") is flipped


def test_retry_topics_are_derivable_writes(tmp_path):
    clock = FakeClock()
    store = Store(tmp_path, clock=clock)
    store.topics.create_topic_in_send_message_back_method("%RETRY%G", 1, PERM_READ | PERM_WRITE, False, 0)
    assert on_disk(tmp_path) == {} and store.pending_config_writes == 1
    assert store.persist_due() == 0
    clock.now += 1.0
    assert store.persist_due() == 1
    assert "%RETRY%G" in on_disk(tmp_path) and store.pending_config_writes == 0
    # a put marked derivable (a topic auto-created on a route query) waits the same way
    store.topics.put(TopicConfig("ROUTED"), derivable=True)
    assert "ROUTED" not in on_disk(tmp_path)
    store.persist()
    assert "ROUTED" in on_disk(tmp_path)


def test_auto_creation_stops_at_the_budget_explicit_puts_do_not(caplog):
    store = Store(auto_create_max_topics=2)
    topics = store.topics
    mk = topics.create_topic_in_send_message_back_method
    assert mk("%RETRY%A", 1, 6, False, 0)[1] and mk("%RETRY%B", 1, 6, False, 0)[1]
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        assert mk("%RETRY%C", 1, 6, False, 0) == (None, False)
        assert mk("%RETRY%D", 1, 6, False, 0) == (None, False)
    assert store.auto_create_refused["topic"] == 2 and not topics.contains("%RETRY%C")
    assert caplog.text.count("not auto-creating topic") == 1  # rate-limited
    # an existing topic still has its order flag set at the limit; the admin is not limited
    assert mk("%RETRY%A", 1, 6, True, 0)[1] is True
    topics.put(TopicConfig("ADMIN"))
    assert len(topics.table) == 3 and store.at_auto_create_limit(topics)


def test_persistence_round_trip(tmp_path):
    store = Store(tmp_path)
    configs = [TopicConfig("T1", 8, 4, PERM_READ, "MULTI_TAG", FLAG_UNIT_SUB, True, {"+message.type": "FIFO"}),
               TopicConfig("T2")]
    for c in configs:
        store.topics.put(c)
    version = store.topics.data_version.counter
    doc = store.topics.to_document()
    assert doc["topicConfigTable"]["T1"] == {
        "attributes": {"+message.type": "FIFO"}, "order": True, "perm": PERM_READ, "readQueueNums": 8,
        "topicFilterType": "MULTI_TAG", "topicName": "T1", "topicSysFlag": FLAG_UNIT_SUB, "writeQueueNums": 4}
    restarted = Store(tmp_path)
    assert restarted.topics.table == {c.topic_name: c for c in configs}
    assert restarted.topics.data_version.counter == version


@pytest.mark.parametrize("entry", [{"topicName": "T", "writeQueueNums": "16"}, {"topicName": 7},
                                   {"topicName": "T", "topicSysFlag": 1 << 31}, []])
def test_a_malformed_entry_is_a_store_error_naming_its_path(tmp_path, entry):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {"T": entry}}))
    with pytest.raises(StoreError, match=r"topics.json and its backup are unusable.*topicConfigTable\['T'\]"):
        Store(tmp_path)
    assert issubclass(StoreError, ValueError)
    assert Store(tmp_path, recover_corrupt=True).topics.table == {}

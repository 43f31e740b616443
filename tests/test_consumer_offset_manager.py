"""ConsumerOffsetManager (engine.registry.consumer_offset_manager) on its own: commit, query, removal, the limits of what
may be committed (the registry's checks and int64), when the table is written, and the file's shape."""
import json
import logging

import pytest

import engine.registry.store
from engine.registry.consumer_offset_manager import QUERY_NOT_FOUND, ConsumerOffsetManager
from engine.codec.enums import ResponseCode
from engine.registry.client_registry import ClientRegistry
from engine.registry.store import Store, StoreError, SubscriptionGroupConfig, TopicConfig


def on_disk(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_old_import_path_names_the_same_objects():
    assert engine.registry.store.ConsumerOffsetManager is ConsumerOffsetManager and engine.registry.store.QUERY_NOT_FOUND == 22
    assert isinstance(Store().offsets, ConsumerOffsetManager)


def test_commit_and_query_per_group_topic_and_queue(caplog):
    offsets = Store().offsets
    assert offsets.query_offset("G", "T", 0) == -1
    offsets.commit_offset("10.0.0.1:5", "G", "T", 0, 5)
    offsets.commit_offset("10.0.0.1:5", "G", "T", 1, 6)
    offsets.commit_offset("10.0.0.2:5", "H", "T", 0, 9)
    assert offsets.query_offset("G", "T", 0) == 5 and offsets.query_offset("G", "T", 1) == 6
    assert offsets.query_offset("G", "T", 2) == -1 and offsets.query_offset("H", "T", 0) == 9
    assert offsets.query_offset("G", "U", 0) == -1
    with caplog.at_level(logging.DEBUG, logger="engine.registry.store"):
        offsets.commit_offset("10.0.0.1:5", "G", "T", 0, 3)  # a lower offset is taken (a reset), and logged
    assert offsets.query_offset("G", "T", 0) == 3
    assert "update consumer offset less than store" in caplog.text and "storeOffset=5" in caplog.text
    offsets_copy = offsets.offsets("G", "T")
    assert offsets_copy == {0: 3, 1: 6}
    offsets_copy[0] = 100  # a copy: the table is not changed through it
    assert offsets.query_offset("G", "T", 0) == 3 and offsets.offsets("X", "T") == {}


def test_remove_by_group_and_topic():
    offsets = Store().offsets
    for group, topic in [("G", "T"), ("G", "U"), ("H", "T"), ("G", "a@b")]:  # '@' in a topic: the last '@' splits
        offsets.commit_offset("h", group, topic, 0, 1)
    offsets.dirty = False
    assert offsets.remove("G", "T") == 1 and offsets.dirty
    assert offsets.remove("X") == 0
    assert offsets.remove("G") == 2
    assert list(offsets.table) == ["T@H"]


def test_the_registry_commits_only_for_known_groups_and_topics():
    reg = ClientRegistry(store=Store())
    assert reg.update_consumer_offset("h", "G", "T", 0, 1) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                                                "Group G not exist!")
    reg.update_subscription_group_config(SubscriptionGroupConfig("G"))
    assert reg.update_consumer_offset("h", "G", "T", 0, 1) == (ResponseCode.TOPIC_NOT_EXIST, "Topic T not exist!")
    reg.update_topic_config(TopicConfig("T"))
    assert reg.update_consumer_offset("h", "G", "T", None, 1) == (ResponseCode.SYSTEM_ERROR,
                                                                   "QueueId is null, topic is T")
    assert reg.update_consumer_offset("h", "G", "T", 0, None) == (ResponseCode.SYSTEM_ERROR,
                                                                   "Offset is null, topic is T")
    assert reg.store.offsets.table == {}
    assert reg.update_consumer_offset("h", "G", "T", 0, (1 << 63) - 1) == (ResponseCode.SUCCESS, None)
    assert reg.query_consumer_offset("G", "T", 0) == (1 << 63) - 1


def test_commits_mark_the_table_dirty_and_the_timer_writes_it(tmp_path):
    store = Store(tmp_path)
    offsets = store.offsets
    offsets.commit_offset("h", "G", "T", 0, 5)
    assert offsets.dirty and on_disk(tmp_path) is None  # not written per commit
    assert store.pending_config_writes == 0  # offsets are not config writes
    v = offsets.data_version.counter
    store.persist_offsets(background=False)
    assert not offsets.dirty and offsets.data_version.counter == v + 1
    assert on_disk(tmp_path)["offsetTable"] == {"T@G": {"0": 5}}
    store.persist_offsets(background=False)  # nothing changed: no write, no new version
    assert offsets.data_version.counter == v + 1


def test_a_snapshot_is_the_table_at_the_write():
    offsets = Store().offsets
    offsets.commit_offset("h", "G", "T", 0, 5)
    snapshot = offsets.snapshot()
    offsets.commit_offset("h", "G", "T", 0, 6)  # the queue map is updated in place
    assert json.loads(offsets.encode_snapshot(snapshot))["offsetTable"] == {"T@G": {"0": 5}}


def test_persistence_round_trip_with_int64_bounds(tmp_path):
    store = Store(tmp_path)
    lo, hi = -(1 << 63), (1 << 63) - 1
    store.offsets.commit_offset("h", "G", "T", 0, hi)
    store.offsets.commit_offset("h", "G", "T", 7, lo)
    store.offsets.commit_offset("h", "G", "%RETRY%G", 0, 0)
    store.persist()
    doc = on_disk(tmp_path)
    assert doc["offsetTable"] == {"%RETRY%G@G": {"0": 0}, "T@G": {"0": hi, "7": lo}}
    restarted = Store(tmp_path).offsets
    assert restarted.table == store.offsets.table and not restarted.dirty
    assert restarted.data_version.counter == store.offsets.data_version.counter


def test_a_failed_write_stays_owed(tmp_path, monkeypatch, caplog):
    store = Store(tmp_path)
    store.offsets.commit_offset("h", "G", "T", 0, 1)

    def full(path, data, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(engine.registry.store, "atomic_write", full)
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        store.persist_offsets(background=False)
    assert store.offsets.dirty and "No space left on device" in caplog.text
    monkeypatch.undo()
    store.persist_offsets(background=False)
    assert not store.offsets.dirty and on_disk(tmp_path)["offsetTable"] == {"T@G": {"0": 1}}


@pytest.mark.parametrize("table", [{"T@G": {"0": 1 << 63}}, {"T@G": {"0": True}}, {"T@G": []}, {"TG": {}},
                                   {"T@G": {"q": 1}}])
def test_a_malformed_offset_table_stops_the_load_unless_recovering(tmp_path, table):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": table}))
    with pytest.raises(StoreError, match=r"offsetTable\['T"):
        Store(tmp_path)
    assert Store(tmp_path, recover_corrupt=True).offsets.table == {}


# ----------------------------------------------------------------------------------------- the entry budget


def test_new_offsets_stop_at_the_entry_budget_updates_do_not(caplog):
    """A client chooses the queue id (any int32) of each commit: without a budget the offset table, and the
    consumerOffset.json written every 5 s, grew by one entry per new queue id of every known group and topic."""
    store = Store(max_offset_entries=3)
    reg = ClientRegistry(store=store)
    reg.update_subscription_group_config(SubscriptionGroupConfig("G"))
    reg.update_topic_config(TopicConfig("T"))
    for q in range(3):
        assert reg.update_consumer_offset("h", "G", "T", q, 10) == (ResponseCode.SUCCESS, None)
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        code, remark = reg.update_consumer_offset("h", "G", "T", 2 ** 31 - 1, 10)
        assert reg.update_consumer_offset("h", "G", "T", 3, 10)[0] == ResponseCode.SYSTEM_ERROR
    assert code == ResponseCode.SYSTEM_ERROR and "maxConsumerOffsetEntries=3" in remark
    assert store.offsets.entries == 3 and store.offsets.refused == 2
    assert store.offsets.query_offset("G", "T", 2 ** 31 - 1) == -1
    assert caplog.text.count("consumer offset table holds 3 entries") == 1  # rate-limited
    # a committed queue still moves at the budget; a removal makes room
    assert reg.update_consumer_offset("h", "G", "T", 0, 11) == (ResponseCode.SUCCESS, None)
    assert store.offsets.query_offset("G", "T", 0) == 11
    assert store.offsets.remove("G", "T") == 1 and store.offsets.entries == 0
    assert reg.update_consumer_offset("h", "G", "T", 5, 1) == (ResponseCode.SUCCESS, None)


def test_the_budget_counts_loaded_entries(tmp_path):
    store = Store(tmp_path)
    for q in range(4):
        store.offsets.commit_offset("h", "G", "T", q, q)
    store.offsets.commit_offset("h", "G", "U", 0, 0)
    store.persist()
    loaded = Store(tmp_path, max_offset_entries=5).offsets
    assert loaded.entries == 5 and loaded.commit_offset("h", "G", "T", 9, 1) is False
    assert loaded.commit_offset("h", "G", "T", 3, 1) is True  # an existing entry
    assert Store(tmp_path).offsets.commit_offset("h", "G", "T", 9, 1) is True  # 0: no limit (library default)


def test_the_broker_limits_offsets_by_default():
    from engine.broker.config import BrokerConfig

    assert BrokerConfig().max_consumer_offset_entries == 1_000_000

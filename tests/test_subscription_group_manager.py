"""SubscriptionGroupManager (engine.registry.subscription_group_manager) on its own: system groups, explicit changes,
findSubscriptionGroupConfig's auto-creation and its budget, and the file."""
import json
import logging

import pytest

import engine.registry.store
from engine.registry.config_manager import StoreError
from engine.registry.store import Store
from engine.registry.subscription_group_manager import (
    GROUP_MAX_LENGTH,
    SYSTEM_CONSUMER_GROUPS,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    validate_group,
)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def on_disk(tmp_path):
    path = tmp_path / "config" / "subscriptionGroup.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_old_import_path_names_the_same_objects():
    assert engine.registry.store.SubscriptionGroupManager is SubscriptionGroupManager
    assert engine.registry.store.SubscriptionGroupConfig is SubscriptionGroupConfig
    assert engine.registry.store.validate_group is validate_group and engine.registry.store.SYSTEM_CONSUMER_GROUPS is SYSTEM_CONSUMER_GROUPS
    assert isinstance(Store().groups, SubscriptionGroupManager)


def test_system_groups_exist_from_the_start_and_a_file_overrides_them(tmp_path):
    assert set(Store().groups.table) == set(SYSTEM_CONSUMER_GROUPS)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "subscriptionGroup.json").write_text(json.dumps({"subscriptionGroupTable": {
        "TOOLS_CONSUMER": {"groupName": "TOOLS_CONSUMER", "consumeEnable": False},
        "G": {"groupName": "G", "retryMaxTimes": 3}}}))
    groups = Store(tmp_path).groups
    assert set(groups.table) == set(SYSTEM_CONSUMER_GROUPS) | {"G"}
    assert groups.get("TOOLS_CONSUMER").consume_enable is False  # Java: init() first, then the file over it
    assert groups.get("G").retry_max_times == 3 and groups.get("SELF_TEST_C_GROUP").consume_enable is True


def test_put_and_delete_are_written_at_once(tmp_path):
    store = Store(tmp_path)
    v0 = store.groups.data_version.counter
    assert store.groups.put(SubscriptionGroupConfig("G", retry_queue_nums=2)) is None
    doc = on_disk(tmp_path)
    assert doc["subscriptionGroupTable"]["G"]["retryQueueNums"] == 2 and doc["forbiddenTable"] == {}
    assert store.groups.put(SubscriptionGroupConfig("G")).retry_queue_nums == 2
    assert store.groups.delete("G").group_name == "G"
    assert "G" not in on_disk(tmp_path)["subscriptionGroupTable"]
    assert store.groups.delete("G") is None
    assert store.groups.data_version.counter == v0 + 3 and store.pending_config_writes == 0


def test_find_returns_existing_groups_and_creates_only_when_allowed():
    groups = Store().groups
    groups.put(SubscriptionGroupConfig("KNOWN"))
    assert groups.find("KNOWN", False, False) == (groups.get("KNOWN"), False)
    assert groups.find("NEW", False, False) == (None, False) and not groups.contains("NEW")
    config, created = groups.find("NEW", True, False)
    assert created and config == SubscriptionGroupConfig("NEW") and groups.get("NEW") is config
    assert groups.find("NEW", True, False) == (config, False)
    # a CID_RMQ_SYS_ group is created with enableCreateSysGroup even when auto-creation is off
    assert groups.find("CID_RMQ_SYS_X", False, False) == (None, False)
    assert groups.find("CID_RMQ_SYS_X", False, True)[1] is True
    assert groups.find("OTHER", False, True) == (None, False)


@pytest.mark.parametrize("name", ["a b", "x" * (GROUP_MAX_LENGTH + 1), "", "é", "CID_RMQ_SYS_a b"])
def test_find_never_creates_an_invalid_name(name):
    groups = Store().groups
    assert groups.find(name, True, True) == (None, False)
    assert set(groups.table) == set(SYSTEM_CONSUMER_GROUPS)


def test_validate_group_messages():
    assert validate_group("G") == (True, "")
    assert validate_group(" ") == (False, "The specified group is blank.")
    assert "illegal characters" in validate_group("a/b")[1]
    assert validate_group("x" * 121)[1].endswith("is longer than group max length: 120")


def test_auto_created_groups_are_derivable_writes(tmp_path):
    clock = FakeClock()
    store = Store(tmp_path, clock=clock)
    store.groups.find("AUTO", True, False)
    assert on_disk(tmp_path) is None and store.pending_config_writes == 1
    clock.now += 1.0
    assert store.persist_due() == 1
    assert "AUTO" in on_disk(tmp_path)["subscriptionGroupTable"]


def test_auto_creation_stops_at_the_budget_system_groups_count(caplog):
    limit = len(SYSTEM_CONSUMER_GROUPS) + 2
    store = Store(auto_create_max_groups=limit)
    groups = store.groups
    assert groups.find("A", True, False)[1] and groups.find("B", True, False)[1]
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        assert groups.find("C", True, False) == (None, False)
        assert groups.find("CID_RMQ_SYS_D", False, True) == (None, False)
    assert store.auto_create_refused["group"] == 2 and store.auto_create_refused["topic"] == 0
    assert "not auto-creating group C" in caplog.text and "autoCreateMaxSubscriptionGroups" in caplog.text
    assert groups.find("A", True, False)[0] is not None  # existing groups are still found
    groups.put(SubscriptionGroupConfig("ADMIN"))  # explicit changes are not limited
    assert len(groups.table) == limit + 1


def test_persistence_round_trip(tmp_path):
    store = Store(tmp_path)
    full = SubscriptionGroupConfig("G", consume_enable=False, consume_broadcast_enable=False,
                                   consume_message_orderly=True, retry_queue_nums=4, retry_max_times=2,
                                   group_retry_policy={"type": "EXPONENTIAL", "exponentialRetryPolicy": {
                                       "initial": 1000, "max": 60000, "multiplier": 2}},
                                   broker_id=1, which_broker_when_consume_slowly=0,
                                   notify_consumer_ids_changed_enable=False, group_sys_flag=1,
                                   consume_timeout_minute=5, subscription_data_set=[{"topic": "T"}],
                                   attributes={"k": "v"})
    store.groups.put(full)
    store.groups.find("AUTO", True, False)
    store.persist()
    restarted = Store(tmp_path).groups
    assert restarted.get("G") == full and restarted.get("AUTO") == SubscriptionGroupConfig("AUTO")
    assert restarted.data_version.counter == store.groups.data_version.counter
    assert "subscriptionDataSet" not in on_disk(tmp_path)["subscriptionGroupTable"]["AUTO"]  # nulls omitted


@pytest.mark.parametrize("entry", [{"groupName": "G", "retryQueueNums": 1.5}, {"groupName": "G",
                                   "subscriptionDataSet": {}}, {"consumeEnable": True},
                                   {"groupName": "G", "groupRetryPolicy": "x"}])
def test_a_malformed_entry_stops_the_load(tmp_path, entry):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "subscriptionGroup.json").write_text(json.dumps({"subscriptionGroupTable": {"G": entry}}))
    with pytest.raises(StoreError, match=r"subscriptionGroupTable\['G'\]"):
        Store(tmp_path)
    assert set(Store(tmp_path, recover_corrupt=True).groups.table) == set(SYSTEM_CONSUMER_GROUPS)

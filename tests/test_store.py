"""engine.registry.store: Java file layout and shapes, atomic writes with a .bak, fallback on corrupt files, offsets."""
import json
import logging
import os

import pytest
from test_registry_model import hb

from engine.registry.client_registry import ClientRegistry
from engine.registry.store import (
    SYSTEM_CONSUMER_GROUPS,
    Store,
    StoreError,
    SubscriptionGroupConfig,
    TopicConfig,
    atomic_write,
    validate_group,
)


def config_file(tmp_path, name):
    return tmp_path / "config" / name


# ---------------------------------------------------------------------------------------------------- atomic write


def test_atomic_write_keeps_the_previous_version_as_bak(tmp_path):
    p = tmp_path / "f.json"
    bak = tmp_path / "f.json.bak"
    atomic_write(p, b"one")
    # a first write: the backup is a copy of it (its own inode), so damage to the file still leaves a version
    assert p.read_bytes() == b"one" and bak.read_bytes() == b"one" and not os.path.samefile(p, bak)
    atomic_write(p, b"two")
    atomic_write(p, b"three")
    assert p.read_bytes() == b"three"
    assert bak.read_bytes() == b"two" and not os.path.samefile(p, bak)
    assert sorted(os.listdir(tmp_path)) == ["f.json", "f.json.bak"]  # no temp files left


def test_atomic_write_backup_modes(tmp_path):
    p, bak = tmp_path / "f.json", tmp_path / "f.json.bak"
    atomic_write(p, b"one")
    atomic_write(p, b"two", backup="keep")  # the current file was bad: it must not become the backup
    assert p.read_bytes() == b"two" and bak.read_bytes() == b"one"
    atomic_write(p, b"three", backup="new")  # nothing usable on disk: the new version is its own backup
    assert p.read_bytes() == b"three" and bak.read_bytes() == b"three"
    p.unlink()
    atomic_write(p, b"four")  # a lost file beside a backup: the backup stays
    assert p.read_bytes() == b"four" and bak.read_bytes() == b"three"
    with pytest.raises(ValueError):
        atomic_write(p, b"five", backup="link")


def test_a_failed_write_leaves_the_current_file_whole(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    atomic_write(p, b"good")
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(src).endswith(".json.tmp"):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        atomic_write(p, b"new")
    assert p.read_bytes() == b"good"


def test_backup_by_copy_where_links_are_not_supported(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    atomic_write(p, b"one")

    def no_link(*a):
        raise OSError("links not supported")

    monkeypatch.setattr(os, "link", no_link)
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two" and (tmp_path / "f.json.bak").read_bytes() == b"one"


# ---------------------------------------------------------------------------------------------------- layout


def test_files_have_java_names_and_shapes(tmp_path):
    store = Store(tmp_path)
    reg = ClientRegistry(store=store)
    reg.heartbeat(1, hb(consumers=[("CID_G", ["T"])]))
    reg.update_topic_config(TopicConfig("T", read_queue_nums=4, write_queue_nums=4))
    assert reg.update_consumer_offset("h", "CID_G", "T", 3, 42)[0] == 0
    store.persist()
    topics = json.loads(config_file(tmp_path, "topics.json").read_text())
    assert topics["topicConfigTable"]["%RETRY%CID_G"] == {
        "attributes": {}, "order": False, "perm": 6, "readQueueNums": 1, "topicFilterType": "SINGLE_TAG",
        "topicName": "%RETRY%CID_G", "topicSysFlag": 0, "writeQueueNums": 1}
    assert set(topics["dataVersion"]) == {"counter", "stateVersion", "timestamp"}
    groups = json.loads(config_file(tmp_path, "subscriptionGroup.json").read_text())
    g = groups["subscriptionGroupTable"]["CID_G"]
    assert g["groupName"] == "CID_G" and g["retryQueueNums"] == 1 and g["notifyConsumerIdsChangedEnable"] is True
    assert g["groupRetryPolicy"] == {"type": "CUSTOMIZED"} and "subscriptionDataSet" not in g
    assert set(SYSTEM_CONSUMER_GROUPS) <= set(groups["subscriptionGroupTable"])
    offsets = json.loads(config_file(tmp_path, "consumerOffset.json").read_text())
    assert offsets["offsetTable"] == {"T@CID_G": {"3": 42}}


def test_state_survives_a_restart(tmp_path):
    reg = ClientRegistry(store=Store(tmp_path))
    reg.heartbeat(1, hb(consumers=[("G", ["OrderT"])]))
    reg.update_topic_config(TopicConfig("OrderT", order=True))
    reg.update_subscription_group_config(SubscriptionGroupConfig("G", retry_queue_nums=2,
                                                                 notify_consumer_ids_changed_enable=False))
    reg.update_consumer_offset("h", "G", "OrderT", 0, 7)
    reg.persist()
    store = Store(tmp_path)
    assert store.topics.get("OrderT").order is True
    assert store.topics.get("%RETRY%G").read_queue_nums == 1
    assert store.groups.get("G").retry_queue_nums == 2
    assert store.groups.get("G").notify_consumer_ids_changed_enable is False
    assert store.offsets.query_offset("G", "OrderT", 0) == 7
    assert store.topics.data_version.counter >= 2


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def count_writes(monkeypatch):
    """Record the path of every atomic_write the store makes."""
    import engine.registry.store

    written = []
    real = engine.registry.store.atomic_write

    def counting(path, data, **kw):
        written.append(path.name)
        return real(path, data, **kw)

    monkeypatch.setattr(engine.registry.store, "atomic_write", counting)
    return written


def table(tmp_path, name, key):
    path = config_file(tmp_path, name)
    return json.loads(path.read_text())[key] if path.exists() else {}


def test_explicit_config_changes_are_written_at_once_offsets_on_persist(tmp_path):
    store = Store(tmp_path)
    reg = ClientRegistry(store=store)
    reg.update_subscription_group_config(SubscriptionGroupConfig("G"))
    assert "G" in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
    reg.update_topic_config(TopicConfig("T"))
    assert "T" in table(tmp_path, "topics.json", "topicConfigTable")
    reg.update_consumer_offset("h", "G", "T", 0, 1)
    assert not config_file(tmp_path, "consumerOffset.json").exists()
    reg.persist_offsets()
    assert config_file(tmp_path, "consumerOffset.json").exists()
    mtime = config_file(tmp_path, "consumerOffset.json").stat().st_mtime_ns
    reg.persist_offsets()  # nothing changed: no write
    assert config_file(tmp_path, "consumerOffset.json").stat().st_mtime_ns == mtime
    assert store.pending_config_writes == 0


def test_auto_created_groups_and_retry_topics_are_written_once_per_interval(tmp_path, monkeypatch):
    clock = FakeClock()
    written = count_writes(monkeypatch)
    store = Store(tmp_path, clock=clock)
    reg = ClientRegistry(store=store)
    for i in range(1000):  # a storm of new groups within one interval: no write yet
        assert reg.heartbeat(i, hb(client_id=f"10.0.0.1@{i}", consumers=[(f"G{i}", ["T"])])).code == 0
    assert written == [] and store.pending_config_writes == 2
    assert reg.persist_due() == 0  # not due yet
    reg.update_subscription_group_config(SubscriptionGroupConfig("ADMIN"))  # written with the groups so far
    reg.heartbeat(1000, hb(client_id="10.0.0.1@1000", consumers=[("LATE", ["T"])]))
    restarted = Store(tmp_path)  # what a kill now leaves: the admin change, not the entries made after it
    assert {"ADMIN", "G999"} <= set(restarted.groups.table) and not restarted.groups.contains("LATE")
    assert not restarted.topics.contains("%RETRY%G0")  # the retry topics were not written yet: derivable
    del written[:]
    clock.now += 1.0
    assert reg.persist_due() == 2  # one write per file takes all
    assert sorted(written) == ["subscriptionGroup.json", "topics.json"]
    assert {f"G{i}" for i in range(1000)} | {"LATE"} <= set(table(tmp_path, "subscriptionGroup.json",
                                                                   "subscriptionGroupTable"))
    assert {f"%RETRY%G{i}" for i in range(1000)} <= set(table(tmp_path, "topics.json", "topicConfigTable"))
    assert reg.persist_due() == 0 and store.pending_config_writes == 0
    # a storm spread over 10 s: at most one write per file per second, written lazily by the next change
    del written[:]
    for i in range(1000, 2000):
        clock.now += 0.01
        reg.heartbeat(i, hb(client_id=f"10.0.0.1@{i}", consumers=[(f"G{i}", ["T"])]))
    assert 2 * 8 <= len(written) <= 2 * 10, written
    store.persist()  # shutdown takes the rest
    assert set(Store(tmp_path).groups.table) >= {f"G{i}" for i in range(2000)}


def test_an_explicit_change_also_writes_the_pending_derivable_ones(tmp_path):
    clock = FakeClock()
    store = Store(tmp_path, clock=clock)
    reg = ClientRegistry(store=store)
    reg.heartbeat(1, hb(consumers=[("AUTO", ["T"])]))
    assert "AUTO" not in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
    reg.update_subscription_group_config(SubscriptionGroupConfig("ADMIN"))  # acknowledged: on disk on return
    groups = table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
    assert {"ADMIN", "AUTO"} <= set(groups)
    assert store.pending_config_writes == 1  # the retry topic still waits
    reg.update_topic_config(TopicConfig("Explicit"))
    assert store.pending_config_writes == 0
    assert {"Explicit", "%RETRY%AUTO"} <= set(table(tmp_path, "topics.json", "topicConfigTable"))


def test_derivable_writes_at_once_when_the_delay_is_zero(tmp_path):
    store = Store(tmp_path, derivable_write_delay_s=0)
    ClientRegistry(store=store).heartbeat(1, hb(consumers=[("G", ["T"])]))
    assert "G" in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
    assert store.pending_config_writes == 0


def test_broker_writes_auto_created_groups_within_two_seconds_and_at_shutdown(tmp_path):
    import asyncio

    import engine

    async def main():
        cfg = engine.BrokerConfig(listen_port=0, store_path_root_dir=str(tmp_path))
        broker = engine.Broker(cfg)
        await broker.start_async()
        try:
            broker.registry.heartbeat(1, hb(consumers=[("TICKED", ["T"])]))
            assert "TICKED" not in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
            for _ in range(40):  # the broker's 1 s tick writes it once the 1 s delay has passed
                await asyncio.sleep(0.1)
                if "TICKED" in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable"):
                    break
            assert "TICKED" in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
            broker.registry.heartbeat(2, hb(client_id="10.0.0.1@2", consumers=[("AT_STOP", ["T"])]))
        finally:
            await broker.stop_async()
        assert "AT_STOP" in table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")
        assert "%RETRY%AT_STOP" in table(tmp_path, "topics.json", "topicConfigTable")

    asyncio.run(main())


def test_deferred_config_writes(tmp_path):
    store = Store(tmp_path, sync_config_writes=False)
    ClientRegistry(store=store).heartbeat(1, hb(consumers=[("G", ["T"])]))
    assert not config_file(tmp_path, "topics.json").exists()
    store.persist()
    assert Store(tmp_path).topics.contains("%RETRY%G")


def test_in_memory_store_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = Store(None)
    ClientRegistry(store=store).heartbeat(1, hb(consumers=[("G", ["T"])]))
    store.persist()
    assert os.listdir(tmp_path) == []


def fail_temp_files(monkeypatch):
    """Make every ``*.tmp`` open fail as on a read-only file system; returns the real open."""
    real_open = open

    def failing_open(path, *a, **kw):
        if str(path).endswith(".tmp"):
            raise OSError("read-only file system")
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", failing_open)
    return real_open


def test_unwritable_store_keeps_serving_and_retries(tmp_path, monkeypatch, caplog):
    store = Store(tmp_path, derivable_write_delay_s=0)  # the heartbeat's group is written in the request
    real_open = fail_temp_files(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        reg = ClientRegistry(store=store)
        assert reg.heartbeat(1, hb(consumers=[("G", ["T"])])).code == 0
    assert "persisting" in caplog.text and reg.consumer_ids("G") == ["10.0.0.1@1"]
    assert store.pending_config_writes == 2
    monkeypatch.setattr("builtins.open", real_open)
    store.persist()
    assert Store(tmp_path).groups.contains("G") and store.pending_config_writes == 0


def test_a_failed_deferred_write_is_retried_at_persist(tmp_path, monkeypatch, caplog):
    clock = FakeClock()
    store = Store(tmp_path, clock=clock)
    reg = ClientRegistry(store=store)
    reg.heartbeat(1, hb(consumers=[("G", ["T"])]))
    real_open = fail_temp_files(monkeypatch)
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        assert store.persist_due() == 2
    assert "persisting" in caplog.text and store.pending_config_writes == 2
    assert store.persist_due() == 0  # not retried every second: persist() (shutdown) or the next change does
    monkeypatch.setattr("builtins.open", real_open)
    store.persist()
    assert Store(tmp_path).groups.contains("G") and store.pending_config_writes == 0


# ---------------------------------------------------------------------------------------------------- corruption


def write_good_then(tmp_path, damage):
    """Two good generations of topics.json (so .bak exists), then ``damage`` applied to the main file."""
    store = Store(tmp_path)
    store.topics.put(TopicConfig("A"))
    store.topics.put(TopicConfig("B"))
    path = config_file(tmp_path, "topics.json")
    damage(path)
    return path


@pytest.mark.parametrize("damage", [
    lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),  # torn write
    lambda p: p.write_bytes(b"\x00" * 64),
    lambda p: p.write_text(""),
    lambda p: p.write_text('{"topicConfigTable": {"X": {"topicName": "X", "perm": "six"}}}'),
    lambda p: p.write_text('{"topicConfigTable": []}'),
    lambda p: p.write_text("[1, 2]"),
    lambda p: p.unlink(),
])
def test_corrupt_file_falls_back_to_the_backup(tmp_path, caplog, damage):
    write_good_then(tmp_path, damage)
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        store = Store(tmp_path)
    assert set(store.topics.table) == {"A"}  # the previous generation
    assert "loaded the backup" in caplog.text


def test_both_corrupt_stop_the_load_and_are_never_overwritten(tmp_path):
    path = write_good_then(tmp_path, lambda p: p.write_text("{"))
    path.with_name("topics.json.bak").write_text("not json")
    with pytest.raises(StoreError, match="topics.json and its backup are unusable.*storeRecoverCorruptFiles"):
        Store(tmp_path)
    assert path.read_text() == "{" and path.with_name("topics.json.bak").read_text() == "not json"


def test_recovery_moves_both_aside_and_starts_empty(tmp_path, caplog):
    path = write_good_then(tmp_path, lambda p: p.write_text("{"))
    path.with_name("topics.json.bak").write_text("not json")
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        store = Store(tmp_path, recover_corrupt=True)
    assert store.topics.table == {}
    aside = sorted(p.name for p in path.parent.iterdir() if ".corrupt-" in p.name)
    assert sorted(n.split(".corrupt-")[0] for n in aside) == ["topics.json", "topics.json.bak"]
    assert {(path.parent / n).read_text() for n in aside} == {"{", "not json"}
    assert any(r.levelno == logging.ERROR and "moved aside" in r.getMessage() for r in caplog.records)
    store.topics.put(TopicConfig("New"))
    assert set(Store(tmp_path).topics.table) == {"New"}


@pytest.mark.parametrize("name", ["topics.json", "subscriptionGroup.json", "consumerOffset.json"])
@pytest.mark.parametrize("damage", ["corrupt", "empty main", "truncated"])
def test_every_store_file_stops_start_up_when_all_copies_are_bad(tmp_path, name, damage):
    store = Store(tmp_path)
    store.topics.put(TopicConfig("T1"))
    store.groups.put(SubscriptionGroupConfig("G1"))
    store.offsets.commit_offset("h", "G1", "T1", 0, 5)
    store.persist()
    store.topics.put(TopicConfig("T2"))  # a second generation: each file has a .bak
    store.groups.put(SubscriptionGroupConfig("G2"))
    store.offsets.commit_offset("h", "G1", "T1", 0, 6)
    store.persist()
    for p in (config_file(tmp_path, name), config_file(tmp_path, name + ".bak")):
        data = p.read_bytes()
        if damage == "empty main" and not p.name.endswith(".bak"):
            p.write_bytes(b"")  # the main file emptied, the backup corrupt: the backup's data must be kept
        else:
            p.write_bytes(b"\xff" + data[1:] if damage != "truncated" else data[: len(data) // 2])
    before = {p.name: p.read_bytes() for p in (tmp_path / "config").iterdir()}
    with pytest.raises(StoreError, match=name.replace(".", "\\.")):
        Store(tmp_path)
    assert {p.name: p.read_bytes() for p in (tmp_path / "config").iterdir()} == before  # nothing touched


def test_a_corrupt_file_does_not_overwrite_the_good_backup(tmp_path):
    path = write_good_then(tmp_path, lambda p: p.write_text("garbage"))
    store = Store(tmp_path)
    store.topics.put(TopicConfig("C"))
    assert json.loads(path.with_name("topics.json.bak").read_text())["topicConfigTable"].keys() == {"A"}
    assert set(Store(tmp_path).topics.table) == {"A", "C"}


def test_fresh_directory_loads_silently(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        store = Store(tmp_path / "new")
    assert caplog.text == "" and store.offsets.table == {}
    assert set(SYSTEM_CONSUMER_GROUPS) <= set(store.groups.table)


def test_java_files_with_bare_numeric_keys_load(tmp_path):
    # what a Java broker writes (fastjson pretty format, Map<Integer, Long> with bare keys)
    (tmp_path / "config").mkdir()
    config_file(tmp_path, "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"TopicTest@CID_G":{0:12,1:3,2:-1},\n\t\t"%RETRY%CID_G@CID_G":{0:0}\n\t}\n}')
    store = Store(tmp_path)
    assert store.offsets.query_offset("CID_G", "TopicTest", 1) == 3
    assert store.offsets.query_offset("CID_G", "%RETRY%CID_G", 0) == 0


@pytest.mark.parametrize("text", [
    '{"offsetTable": {"nokey": {"0": 1}}}',
    '{"offsetTable": {"T@G": {"x": 1}}}',
    '{"offsetTable": {"T@G": {"0": "1"}}}',
    '{"offsetTable": {"T@G": {"0": 99999999999999999999}}}',
])
def test_bad_offset_files_are_corrupt(tmp_path, text, caplog):
    (tmp_path / "config").mkdir()
    config_file(tmp_path, "consumerOffset.json").write_text(text)
    with pytest.raises(StoreError, match="consumerOffset.json and its backup are unusable"):
        Store(tmp_path)
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        store = Store(tmp_path, recover_corrupt=True)
    assert store.offsets.table == {} and "unusable" in caplog.text


# ---------------------------------------------------------------------------------------------------- models


def test_config_round_trips():
    tc = TopicConfig("T", 8, 4, 6, "SINGLE_TAG", 2, True, {"+message.type": "NORMAL"})
    assert TopicConfig.from_dict(tc.to_dict()) == tc
    sg = SubscriptionGroupConfig("G", retry_queue_nums=3, subscription_data_set=[{"topic": "T"}])
    assert SubscriptionGroupConfig.from_dict(sg.to_dict()) == sg
    assert list(sg.to_dict()) == sorted(sg.to_dict())  # fastjson order


@pytest.mark.parametrize("bad", [{"readQueueNums": 1}, {"topicName": "T", "order": 1},
                                 {"topicName": "T", "readQueueNums": True}, {"topicName": "T", "attributes": {"a": 1}},
                                 {"topicName": "T", "perm": 1 << 40}])
def test_topic_config_type_errors(bad):
    with pytest.raises(StoreError):
        TopicConfig.from_dict(bad)


@pytest.mark.parametrize("name,ok", [("G", True), ("%RETRY%G", True), ("a|b-c_d", True), ("x" * 120, True),
                                     ("x" * 121, False), ("", False), ("  ", False), ("a b", False),
                                     ("é", False), (None, False)])
def test_validate_group(name, ok):
    assert validate_group(name)[0] is ok


def test_offsets_table_operations(tmp_path):
    store = Store(tmp_path)
    store.offsets.commit_offset("h", "G", "T", 0, 5)
    store.offsets.commit_offset("h", "G", "T", 1, 6)
    store.offsets.commit_offset("h", "G", "U", 0, 1)
    store.offsets.commit_offset("h", "H", "T", 0, 9)
    assert store.offsets.offsets("G", "T") == {0: 5, 1: 6}
    assert store.offsets.remove("G", "T") == 1
    assert store.offsets.remove("G") == 1
    assert store.offsets.query_offset("H", "T", 0) == 9 and store.offsets.query_offset("G", "U", 0) == -1


# ------------------------------------------------------------------------------------- background writes (broker)


def _block_writer(store):
    """Occupy the store's writer thread until the returned event is set."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()
    if store._writer is None:
        store._writer = ThreadPoolExecutor(1, thread_name_prefix="store-writer")
    store._writer.submit(gate.wait, 10)
    return gate


def test_background_writes_land_in_order_and_never_replace_a_later_version(tmp_path):
    clock = FakeClock()
    store = Store(tmp_path, clock=clock, background_writes=True)
    reg = ClientRegistry(store=store)
    gate = _block_writer(store)
    reg.heartbeat(0, hb(client_id="10.0.0.1@0", consumers=[("AUTO", ["T"])]))  # derivable: auto-created
    clock.now += 1.0
    assert reg.persist_due() == 2  # encoded now, queued behind the blocked writer
    assert not config_file(tmp_path, "subscriptionGroup.json").exists() and store.pending_config_writes == 2
    reg.update_subscription_group_config(SubscriptionGroupConfig("ADMIN"))  # explicit: written in the call
    assert set(table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")) >= {"AUTO", "ADMIN"}
    gate.set()
    store.flush()
    # the queued (older) document was skipped: ADMIN is still there, and the file is the newer version
    assert set(table(tmp_path, "subscriptionGroup.json", "subscriptionGroupTable")) >= {"AUTO", "ADMIN"}
    assert "%RETRY%AUTO" in table(tmp_path, "topics.json", "topicConfigTable")
    assert store.pending_config_writes == 0
    store.close()


def test_a_failed_background_write_is_retried_and_shutdown_drains(tmp_path, monkeypatch, caplog):
    import engine.registry.store

    clock = FakeClock()
    store = Store(tmp_path, clock=clock, background_writes=True)
    reg = ClientRegistry(store=store)
    reg.update_topic_config(TopicConfig("T"))  # offsets are kept for existing topics only
    real, failing = engine.registry.store.atomic_write, [True]

    def flaky(path, data, **kw):
        if failing[0]:
            raise OSError(28, "No space left on device")
        real(path, data, **kw)

    monkeypatch.setattr(engine.registry.store, "atomic_write", flaky)
    reg.heartbeat(0, hb(client_id="10.0.0.1@0", consumers=[("AUTO", ["T"])]))
    assert reg.update_consumer_offset("h", "AUTO", "T", 0, 7)[0] == 0
    clock.now += 1.0
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        reg.persist_due()
        reg.persist_offsets()
        store.flush()
    assert "No space left on device" in caplog.text
    assert store.pending_config_writes == 2 and store.offsets.dirty  # still owed, nothing raised into the loop
    failing[0] = False
    gate = _block_writer(store)
    reg.persist_offsets()  # queued behind the gate
    gate.set()
    store.persist()  # shutdown: waits for the queue, then writes what is left
    store.close()
    restarted = Store(tmp_path)
    assert restarted.groups.contains("AUTO") and restarted.offsets.query_offset("AUTO", "T", 0) == 7
    assert store.pending_config_writes == 0 and not store.offsets.dirty


def test_a_failed_offsets_write_at_shutdown_is_logged_and_stays_owed(tmp_path, monkeypatch, caplog):
    # the synchronous write (persist at shutdown) takes the same path as the timer's: logged, not raised
    import engine.registry.store

    store = Store(tmp_path)
    reg = ClientRegistry(store=store)
    reg.update_topic_config(TopicConfig("T"))
    reg.heartbeat(0, hb(client_id="10.0.0.1@0", consumers=[("AUTO", ["T"])]))
    reg.update_consumer_offset("h", "AUTO", "T", 0, 9)

    def full(path, data, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(engine.registry.store, "atomic_write", full)
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        store.persist()
    assert "consumerOffset.json" in caplog.text and store.offsets.dirty
    monkeypatch.undo()
    store.persist()
    assert Store(tmp_path).offsets.query_offset("AUTO", "T", 0) == 9 and not store.offsets.dirty


def test_the_event_loop_is_not_blocked_by_a_slow_disk(tmp_path, monkeypatch):
    """The broker's tick with a write due: fsync takes 0.3 s in the writer thread, a 10 ms loop timer still fires
    on time."""
    import asyncio
    import time

    import engine.registry.store

    real_fsync = os.fsync

    def slow_fsync(fd):
        time.sleep(0.3)
        real_fsync(fd)

    monkeypatch.setattr(engine.registry.store.os, "fsync", slow_fsync)
    clock = FakeClock()
    store = Store(tmp_path, clock=clock, background_writes=True)
    reg = ClientRegistry(store=store)
    reg.heartbeat(0, hb(client_id="10.0.0.1@0", consumers=[("AUTO", ["T"])]))
    clock.now += 1.0

    async def main():
        t0 = time.monotonic()
        assert reg.persist_due() == 2
        returned = time.monotonic() - t0
        t1 = time.monotonic()
        await asyncio.sleep(0.01)
        return returned, time.monotonic() - t1

    returned, timer = asyncio.run(main())
    assert returned < 0.1 and timer < 0.1, (returned, timer)
    store.close()  # waits for the slow writes
    assert Store(tmp_path).groups.contains("AUTO")


def test_all_copies_empty_start_empty_as_java_does(tmp_path, caplog):
    """Nothing to keep: empty (or NUL-only) copies start with an empty table and an error, as Java's loadBak."""
    write_good_then(tmp_path, lambda p: p.write_bytes(b""))
    config_file(tmp_path, "topics.json.bak").write_bytes(b"\x00\x00 \n")
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        store = Store(tmp_path)
    assert store.topics.table == {} and "empty or missing" in caplog.text


def test_broker_does_not_start_over_unusable_store_files(tmp_path, caplog):
    """`rmqhb serve` on a store whose topics.json and .bak both hold unusable data: exit 253 with the reason; with
    storeRecoverCorruptFiles=true it moves them aside and serves."""
    from engine.broker.controller import Broker, serve_main
    from engine.broker.config import BrokerConfig

    path = write_good_then(tmp_path, lambda p: p.write_text("{broken"))
    path.with_name("topics.json.bak").write_text("[also broken")
    args = ["--listenPort", "0", "--listenHost", "127.0.0.1", "--storePathRootDir", str(tmp_path), "--log-level",
            "ERROR"]
    with caplog.at_level(logging.ERROR):
        assert serve_main(args) == 253  # mqbroker: initialize() failed, System.exit(-3)
    assert any("broker failed to start" in r.getMessage() and "topics.json and its backup are unusable"
               in r.getMessage() for r in caplog.records)
    assert path.read_text() == "{broken"  # untouched
    b = Broker(BrokerConfig(listen_port=0, listen_host="127.0.0.1", store_path_root_dir=str(tmp_path),
                            store_recover_corrupt_files=True)).start()
    try:
        assert not path.exists() and any(".corrupt-" in p.name for p in path.parent.iterdir())
    finally:
        b.stop()

"""Growth a client can cause has a budget: per-group metric series, auto-created groups and topics; and the config
documents are encoded off the event loop."""
import json
import re
import threading

import pytest

from engine.codec.enums import RequestCode, ResponseCode
from engine.registry.store import SYSTEM_CONSUMER_GROUPS, _JsonFile
from test_server import Client, broker_factory, wait_until  # noqa: F401  (fixtures)


def group_lines(text, metric):
    return [ln for ln in text.splitlines() if ln.startswith(f"rocketmq_broker_{metric}{{")]


def test_per_group_series_are_capped(broker_factory):
    broker = broker_factory(metrics_max_group_series=5)
    clients = [Client(broker.ports["main"]) for _ in range(12)]
    try:
        for i, c in enumerate(clients):
            # group g0 gets 3 members, the others one: g0 must be among the series kept
            assert c.heartbeat(client_id=f"10.0.0.{i}@c", group=f"g{min(i, 9) if i > 2 else 0}",
                               producer=f"p{i}").code == ResponseCode.SUCCESS
        text = broker.call(broker.render_metrics)
        total = len(broker.call(broker.registry.group_stats))
    finally:
        for c in clients:
            c.close()
    series = group_lines(text, "group_clients")
    assert len(series) == 5 and len(group_lines(text, "group_channels")) == 5
    assert 'rocketmq_broker_group_clients{role="consumer",group="g0"} 3' in series
    assert total > 5
    assert f"rocketmq_broker_group_series_dropped {total - 5}" in text
    # the refusal counters are there from the start, at 0, for dashboards and alerts
    assert 'rocketmq_broker_auto_create_refused_total{kind="group"} 0' in text
    assert 'rocketmq_broker_auto_create_refused_total{kind="topic"} 0' in text


@pytest.mark.parametrize("rules", [4, 5])
def test_auto_created_groups_are_limited(broker_factory, rules):
    limit = len(SYSTEM_CONSUMER_GROUPS) + 2
    broker = broker_factory(auto_create_max_subscription_groups=limit, client_management_rules=rules)
    c = Client(broker.ports["main"])
    try:
        for i in range(4):
            assert c.heartbeat(client_id=f"10.0.0.{i}@c", group=f"auto_{i}").code == ResponseCode.SUCCESS
        store = broker.registry.store
        assert broker.call(lambda: sorted(g for g in store.groups.table if g.startswith("auto_"))) == \
            ["auto_0", "auto_1"]
        # a group that could not be created is treated as one with no config: not registered (5.x rules), or
        # registered without config and without retry topic (4.x rules: its memberships go with its connection)
        r = c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "auto_3"})
        assert r.code == (ResponseCode.SYSTEM_ERROR if rules == 5 else ResponseCode.SUCCESS)
        assert broker.call(broker.registry.topic_config, "%RETRY%auto_3") is None
        assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "auto_1"}).code == ResponseCode.SUCCESS
        # its offsets: 5.3+ commits none for a group that does not exist (nothing is added to the offset table);
        # 4.9 commits them as any group's (the offset table's own budget, maxConsumerOffsetEntries, bounds them)
        r = c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "auto_3", "topic": "%RETRY%auto_1",
                                                         "queueId": "0", "commitOffset": "5"})
        if rules == 5:
            assert (r.code, r.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "Group auto_3 not exist!")
        else:
            assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        assert 'rocketmq_broker_auto_create_refused_total{kind="group"}' in broker.render_metrics()
        # a group created explicitly is not limited
        from engine.registry.store import SubscriptionGroupConfig

        broker.call(broker.registry.update_subscription_group_config, SubscriptionGroupConfig("explicit_group"))
        assert c.heartbeat(client_id="10.0.0.9@c", group="explicit_group").code == ResponseCode.SUCCESS
        assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                      {"consumerGroup": "explicit_group"}).code == ResponseCode.SUCCESS
    finally:
        c.close()


def test_auto_created_topics_are_limited(broker_factory):
    broker = broker_factory(auto_create_max_topics=1)  # the first heartbeat's retry topic fills it
    c = Client(broker.ports["main"])
    try:
        assert c.heartbeat(client_id="10.0.0.1@c", group="tg").code == ResponseCode.SUCCESS
        topics = broker.call(lambda: sorted(set(broker.registry.store.topics.table)
                                            - broker.registry.store.topics.start_topics))
        assert topics == ["%RETRY%tg"]  # the start topics (TBW102, ...) are not counted
        r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NewTopic"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert r.remark == ("No topic route info in name server for the topic: NewTopic"
                            "\nSee http://rocketmq.apache.org/docs/faq/ for further details.")
        # a second group registers (its consumer is served) though its retry topic cannot be created
        assert c.heartbeat(client_id="10.0.0.2@c", group="tg2").code == ResponseCode.SUCCESS
        assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "tg2"}).code == ResponseCode.SUCCESS
        assert broker.call(lambda: "%RETRY%tg2" in broker.registry.store.topics.table) is False
        text = broker.render_metrics()
        assert re.search(r'rocketmq_broker_auto_create_refused_total\{kind="topic"\} [1-9]', text)
    finally:
        c.close()


def test_config_documents_are_encoded_off_the_event_loop(broker_factory, monkeypatch):
    """The timed writes of subscriptionGroup.json / topics.json run json.dumps on the store's writer thread,
    never on the event loop (whatever method does the encoding: the store module's json is what is watched)."""
    import engine.registry.store

    threads = []

    class RecordingJson:
        def __getattr__(self, name):
            return getattr(json, name)

        @staticmethod
        def dumps(*args, **kwargs):
            threads.append(threading.current_thread().name)
            return json.dumps(*args, **kwargs)

    monkeypatch.setattr(engine.registry.store, "json", RecordingJson())
    broker = broker_factory()
    c = Client(broker.ports["main"])
    try:
        for i in range(200):
            assert c.heartbeat(client_id=f"10.0.1.{i}@c", group=f"many_{i}").code == ResponseCode.SUCCESS
        groups = broker.registry.store.groups.file.path
        topics = broker.registry.store.topics.file.path
        assert wait_until(lambda: groups.is_file() and '"many_199"' in groups.read_text(), timeout=10)
        assert wait_until(lambda: topics.is_file() and '"%RETRY%many_199"' in topics.read_text(), timeout=10)
        doc = json.loads(groups.read_text())
        assert {f"many_{i}" for i in range(200)} <= set(doc["subscriptionGroupTable"])
        assert doc["subscriptionGroupTable"]["many_7"]["groupName"] == "many_7"
        doc = json.loads(topics.read_text())
        assert {f"%RETRY%many_{i}" for i in range(200)} <= set(doc["topicConfigTable"])
    finally:
        c.close()
    loop_thread = broker._thread.name
    assert threads and loop_thread not in threads
    assert all(t.startswith("store-writer") for t in threads), threads


def test_snapshot_is_the_state_at_the_write(tmp_path):
    """The snapshot is taken when the write is queued: later changes wait for their own write."""
    from engine.registry.store import Store

    store = Store(tmp_path, background_writes=True, derivable_write_delay_s=0)
    gate = threading.Event()
    store._writer = None
    try:
        from concurrent.futures import ThreadPoolExecutor

        store._writer = ThreadPoolExecutor(1, thread_name_prefix="store-writer")
        store._writer.submit(gate.wait)  # hold the writer so the snapshot is encoded after later changes
        store.groups.find("first_group", True, True)
        store.groups.find("second_group", True, True)
        store.offsets.commit_offset("h", "first_group", "t", 0, 5)
        store.persist_offsets()
        store.offsets.commit_offset("h", "first_group", "t", 0, 6)  # after the snapshot: not in that write
        gate.set()
        store.flush()
        offsets = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
        assert offsets["offsetTable"] == {"t@first_group": {"0": 5}}
        store.persist()
        offsets = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
        assert offsets["offsetTable"] == {"t@first_group": {"0": 6}}
        groups = json.loads((tmp_path / "config" / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
        assert {"first_group", "second_group"} <= set(groups)
    finally:
        store.close()


def test_refused_groups_leave_no_fingerprint(caplog):
    """Past the auto-create limit a heartbeat of a new group leaves nothing behind: Java's fingerprint table
    (kept for every group ever seen) would otherwise still grow with each new group name."""
    from engine.codec.enums import LanguageCode
    from engine.registry.client_registry import ClientRegistry, RegistryConfig
    from engine.registry.store import Store
    from test_registry_model import hb

    limit = len(SYSTEM_CONSUMER_GROUPS) + 2
    reg = ClientRegistry(RegistryConfig(), clock=lambda: 0, store=Store(None, auto_create_max_groups=limit))
    for i in range(500):
        fingerprint = 7 if i % 2 else 0  # V2 and V1 heartbeats both record one
        reg.heartbeat(i % 20, hb(f"10.0.0.1@{i}", consumers=[(f"G{i}", ["T"])], fingerprint=fingerprint),
                      LanguageCode.JAVA, 479)
    assert len(reg.store.groups.table) == limit
    assert reg.fingerprint("G0") == 0 and reg.fingerprint("G1") == 7  # created: kept as Java keeps them
    assert all(reg.fingerprint(f"G{i}") is None for i in range(2, 500))
    assert len(reg._fingerprints) == 2
    reg.check_invariants()
    # every refusal counted, one log line for all of them (rate-limited per kind)
    assert reg.store.auto_create_refused == {"group": 498}
    assert sum("not auto-creating group" in r.getMessage() for r in caplog.records) == 1


def test_a_known_group_does_not_consult_the_limits(monkeypatch):
    """The steady path: repeated heartbeats of existing groups (V1, V2 full and light) never look at the limits."""
    from engine.codec.enums import LanguageCode
    from engine.registry.client_registry import ClientRegistry, RegistryConfig
    from engine.registry.store import Store
    from test_registry_model import hb

    limit = len(SYSTEM_CONSUMER_GROUPS) + 1
    reg = ClientRegistry(RegistryConfig(), clock=lambda: 0,
                         store=Store(None, auto_create_max_groups=limit, auto_create_max_topics=1))
    for fingerprint in (0, 7):
        assert reg.heartbeat(1, hb("10.0.0.1@1", consumers=[("G", ["T"])], fingerprint=fingerprint),
                             LanguageCode.JAVA, 479).code == ResponseCode.SUCCESS

    def untouched(*args):
        raise AssertionError("limit consulted")

    monkeypatch.setattr(reg.store, "may_auto_create", untouched)
    monkeypatch.setattr(reg.store, "at_auto_create_limit", untouched)
    for _ in range(3):
        for fingerprint, light in ((0, False), (7, False), (7, True)):
            body = hb("10.0.0.1@1", consumers=[("G", [] if light else ["T"])], fingerprint=fingerprint,
                      without_sub=light)
            assert reg.heartbeat(1, body, LanguageCode.JAVA, 479).code == ResponseCode.SUCCESS
    assert reg.consumer_connection("G") is not None


def test_a_queued_snapshot_keeps_the_topic_as_it_was(tmp_path):
    """A retry topic's order flag changed after a write was queued (snapshot taken, encoding not yet run) is not
    in that write's document: the config object is replaced, not changed under the snapshot."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.registry.store import PERM_READ, PERM_WRITE, Store

    now = [0.0]
    store = Store(tmp_path, background_writes=True, derivable_write_delay_s=1.0, clock=lambda: now[0])
    gate = threading.Event()
    store._writer = ThreadPoolExecutor(1, thread_name_prefix="store-writer")
    try:
        store._writer.submit(gate.wait)
        store.topics.create_topic_in_send_message_back_method("%RETRY%g", 1, PERM_READ | PERM_WRITE, False, 0)
        now[0] = 2.0
        assert store.persist_due() == 1  # queued behind the gate: snapshot taken, not encoded yet
        tc, changed = store.topics.create_topic_in_send_message_back_method("%RETRY%g", 1, PERM_READ | PERM_WRITE,
                                                                           True, 0)
        assert changed and tc.order and store.topics.is_order_topic("%RETRY%g")
        gate.set()
        store.flush()
        doc = json.loads((tmp_path / "config" / "topics.json").read_text())
        assert doc["topicConfigTable"]["%RETRY%g"]["order"] is False
        store.persist()
        doc = json.loads((tmp_path / "config" / "topics.json").read_text())
        assert doc["topicConfigTable"]["%RETRY%g"]["order"] is True
    finally:
        gate.set()
        store.close()


def test_a_failed_encode_on_the_writer_leaves_the_file_dirty(tmp_path, monkeypatch, caplog):
    """Any failure of a background write (not only OSError) is logged and the file stays dirty, so the next
    write carries the change; on the writer thread an exception would otherwise vanish in its future."""
    from engine.registry.store import Store

    now = [0.0]
    store = Store(tmp_path, background_writes=True, derivable_write_delay_s=1.0, clock=lambda: now[0])
    fail = [True]
    encode = store.groups.encode_snapshot

    def flaky(snapshot):
        if fail.pop() if fail else False:
            raise ValueError("cannot encode")
        return encode(snapshot)

    monkeypatch.setattr(store.groups, "encode_snapshot", flaky)
    try:
        store.groups.find("late_group", True, True)
        now[0] = 2.0
        assert store.persist_due() == 1
        store.flush()
        assert not (tmp_path / "config" / "subscriptionGroup.json").exists()
        assert store.pending_config_writes == 1
        assert any("subscriptionGroup.json" in r.getMessage() for r in caplog.records)
        store.persist()
        doc = json.loads((tmp_path / "config" / "subscriptionGroup.json").read_text())
        assert "late_group" in doc["subscriptionGroupTable"]
        assert store.pending_config_writes == 0
    finally:
        store.close()

"""Growth a client can cause has a budget: per-group metric series, auto-created groups and topics; and the config
documents are encoded off the event loop."""
import json
import re
import threading

import pytest

from engine.enums import RequestCode, ResponseCode
from engine.store import SYSTEM_CONSUMER_GROUPS, _JsonFile
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


def test_auto_created_groups_are_limited(broker_factory):
    limit = len(SYSTEM_CONSUMER_GROUPS) + 2
    broker = broker_factory(auto_create_max_subscription_groups=limit)
    c = Client(broker.ports["main"])
    try:
        for i in range(4):
            assert c.heartbeat(client_id=f"10.0.0.{i}@c", group=f"auto_{i}").code == ResponseCode.SUCCESS
        store = broker.registry.store
        assert broker.call(lambda: sorted(g for g in store.groups.table if g.startswith("auto_"))) == \
            ["auto_0", "auto_1"]
        # a group that could not be created is treated as one with no config: not registered
        r = c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "auto_3"})
        assert r.code == ResponseCode.SYSTEM_ERROR
        assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "auto_1"}).code == ResponseCode.SUCCESS
        assert 'rocketmq_broker_auto_create_refused_total{kind="group"}' in broker.render_metrics()
        # a group created explicitly is not limited
        from engine.store import SubscriptionGroupConfig

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
        topics = broker.call(lambda: sorted(broker.registry.store.topics.table))
        assert topics == ["%RETRY%tg"]
        r = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NewTopic"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert r.remark == "No topic route info in name server for the topic: NewTopic"
        # a second group registers (its consumer is served) though its retry topic cannot be created
        assert c.heartbeat(client_id="10.0.0.2@c", group="tg2").code == ResponseCode.SUCCESS
        assert c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "tg2"}).code == ResponseCode.SUCCESS
        assert broker.call(lambda: "%RETRY%tg2" in broker.registry.store.topics.table) is False
        text = broker.render_metrics()
        assert re.search(r'rocketmq_broker_auto_create_refused_total\{kind="topic"\} [1-9]', text)
    finally:
        c.close()


def test_config_documents_are_encoded_off_the_event_loop(broker_factory, monkeypatch):
    threads = []
    encode = _JsonFile.encode

    def recording(document):
        threads.append(threading.current_thread().name)
        return encode(document)

    monkeypatch.setattr(_JsonFile, "encode", staticmethod(recording))
    broker = broker_factory()
    c = Client(broker.ports["main"])
    try:
        for i in range(200):
            assert c.heartbeat(client_id=f"10.0.1.{i}@c", group=f"many_{i}").code == ResponseCode.SUCCESS
        path = broker.registry.store.groups.file.path
        assert wait_until(lambda: path.is_file() and '"many_199"' in path.read_text(), timeout=10)
        doc = json.loads(path.read_text())
        assert {f"many_{i}" for i in range(200)} <= set(doc["subscriptionGroupTable"])
    finally:
        c.close()
    loop_thread = broker._thread.name
    assert threads and loop_thread not in threads
    assert all(t.startswith("store-writer") for t in threads), threads


def test_snapshot_is_the_state_at_the_write(tmp_path):
    """The snapshot is taken when the write is queued: later changes wait for their own write."""
    from engine.store import Store

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

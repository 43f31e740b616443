"""Replay of every HEART_BEAT and UNREGISTER_CLIENT the real clients sent (shared/vectors/*), one channel per
captured connection: the registry ends with the groups, channels and subscriptions those clients had, then is
empty after their unregisters and connection closes (ali-ons never unregisters CLIENT_INNER_PRODUCER: only the
close removes it)."""
import json

import pytest

import engine
from engine.codec.enums import MessageModel
from engine.registry.client_registry import ClientRegistry, ConsumerGroupEvent


def expected_tables(frames):
    """What the clients registered, computed from index.json's parsed bodies (last heartbeat per connection)."""
    last = {}
    for client, entry, _ in frames:
        if entry["code"] == 34:
            last[(client, entry["conn"])] = entry["body_json"]
    consumers, producers = {}, {}
    for channel, body in last.items():
        for cd in body.get("consumerDataSet") or []:
            model = cd.get("messageModel")
            model = MessageModel[model] if isinstance(model, str) else MessageModel(model)
            subs = {s["topic"]: s["subString"] for s in cd.get("subscriptionDataSet") or []}
            consumers[cd["groupName"]] = (channel, body["clientID"], subs, model)
        for pd in body.get("producerDataSet") or []:
            producers.setdefault(pd["groupName"], set()).add((channel, body["clientID"]))
    return consumers, producers


def replay(frames, decode_frame, decode_heartbeat, registry, codes=(34, 35)):
    """Feed the frames with the given request codes to the registry, in capture order; returns how many."""
    done = 0
    for client, entry, raw in frames:
        if entry["code"] not in codes:
            continue
        cmd = decode_frame(raw)
        channel = (client, entry["conn"])
        if entry["code"] == 34:
            result = registry.heartbeat(channel, decode_heartbeat(cmd.body), cmd.language, cmd.version)
            assert result.code == 0 and result.ext_fields["IS_SUB_CHANGE"] == "true"
        else:
            ext = cmd.ext_fields
            code, _ = registry.unregister(channel, ext.get("clientID"), ext.get("producerGroup"),
                                          ext.get("consumerGroup"), cmd.language, cmd.version)
            assert code == 0
        registry.check_invariants()
        done += 1
    return done


def in_order(vectors):
    return sorted(vectors, key=lambda v: (v[0], v[1]["seq"]))


def check_registered(reg, frames):
    consumers, producers = expected_tables(frames)
    assert sorted(reg.consumer_groups()) == sorted(consumers)
    for group, (channel, client_id, subs, model) in consumers.items():
        info = reg.consumer_group_info(group)
        assert [c.channel for c in info.channels] == [channel]
        assert info.client_ids == [client_id]
        assert {t: s.sub_string for t, s in info.subscription_table.items()} == subs
        assert info.message_model is model
        assert reg.topic_consumed_by(next(iter(subs))) >= {group}
    assert sorted(reg.producer_groups()) == sorted(producers)
    for group, members in producers.items():
        assert {(c.channel, c.client_id) for c in reg.producer_channels(group)} == members
    return consumers, producers


def test_replay_registers_then_unregisters_then_closes(vectors):
    frames = in_order(vectors)
    events = []
    reg = ClientRegistry(listener=events.append)
    assert replay(frames, engine.decode_frame, engine.decode_heartbeat, reg, codes=(34,)) > 0
    consumers, _ = check_registered(reg, frames)
    # what the real broker answers these clients
    assert reg.consumer_ids("CID_AliOnsCluster") == ["192.0.2.2@9987"]
    assert reg.consumer_ids("CID_CppCluster") == ["12098-127.0.0.1@DEFAULT"]
    assert reg.topic_config("%RETRY%CID_AliOnsCluster").perm == 6
    assert reg.channel_info(("cpp-rocketmq-0.4.4", 2)).language is engine.LanguageCode.CPP
    changed = {e.group for e in events if e.kind is ConsumerGroupEvent.CHANGE}
    assert changed == {g for g, (_, _, _, model) in consumers.items() if model is MessageModel.CLUSTERING}

    reg2 = ClientRegistry()
    replay(frames, engine.decode_frame, engine.decode_heartbeat, reg2)
    # after the unregisters only ali-ons' inner producer (never unregistered) is left, on its connection
    assert reg2.consumer_groups() == []
    assert reg2.producer_groups() == ["CLIENT_INNER_PRODUCER"]
    assert [c.channel for c in reg2.producer_channels("CLIENT_INNER_PRODUCER")] == [("ali-ons", 4)]
    channels = {(client, entry["conn"]) for client, entry, _ in frames if entry["code"] in (34, 35)}
    for channel in sorted(channels):
        reg2.close_channel(channel)
    assert reg2.groups() == [] and reg2.channel_count == 0
    reg2.check_invariants()
    assert reg2.stats()["interned_strings"] == 0


def test_replay_with_each_decoder_gives_the_same_tables(vectors, impl):
    frames = in_order(vectors)
    reg = ClientRegistry()
    replay(frames, impl.frame.decode_frame, impl.heartbeat.decode_heartbeat, reg, codes=(34,))
    check_registered(reg, frames)


@pytest.mark.parametrize("client", ["ali-ons", "cpp-rocketmq-0.4.4"])
def test_repeated_capture_heartbeats_use_the_fast_path(vectors, client):
    """Each captured heartbeat replayed many times (a client every 30 s): answers and tables stay the same."""
    frames = [v for v in in_order(vectors) if v[0] == client and v[1]["code"] == 34]
    reg = ClientRegistry()
    for _, entry, raw in frames:
        cmd = engine.decode_frame(raw)
        channel = (client, entry["conn"])
        for _ in range(3):
            assert reg.heartbeat(channel, engine.decode_heartbeat(cmd.body), cmd.language, cmd.version).code == 0
        assert reg.channel_table.armed(reg.channel_table.find(channel)), "a repeated capture heartbeat must arm the fast path"
    check_registered(reg, frames)


def _canonical(body_json):
    """A heartbeat body with its sets sorted: what the Java client means, whatever HashSet order it sent."""
    def subs(cd):
        return sorted(json.dumps(s, sort_keys=True) for s in cd.get("subscriptionDataSet") or [])
    return (body_json.get("clientID"),
            sorted((cd["groupName"], json.dumps({k: v for k, v in cd.items() if k != "subscriptionDataSet"},
                                                sort_keys=True), subs(cd)) for cd in body_json.get("consumerDataSet") or []),
            sorted(pd["groupName"] for pd in body_json.get("producerDataSet") or []))


def test_java_reordered_sets_change_nothing(tmp_path, vectors):
    """The Java client sends the same registration with its sets in another HashSet order: no CHANGE (no NOTIFY),
    no config write, the same registry state."""
    from engine.registry.store import Store

    java = [(c, e, raw) for c, e, raw in in_order(vectors) if c == "java-rocketmq-4.9.8" and e["code"] == 34]
    pairs = []
    for conn in {e["conn"] for _, e, _ in java}:
        beats = [(e, raw) for _, e, raw in java if e["conn"] == conn]
        for (e1, r1), (e2, r2) in zip(beats, beats[1:]):
            b1, b2 = engine.decode_frame(r1).body, engine.decode_frame(r2).body
            if b1 != b2 and _canonical(e1["body_json"]) == _canonical(e2["body_json"]):
                pairs.append((conn, r1, r2))
    assert pairs, "the Java capture has heartbeats whose sets are only reordered"
    for conn, r1, r2 in pairs:
        events = []
        store = Store(tmp_path / f"store{conn}-{len(events)}", derivable_write_delay_s=0)
        reg = ClientRegistry(listener=events.append, store=store, events={ConsumerGroupEvent.CHANGE})
        writes = []
        original = store._write
        store._write = lambda manager, background=False: (writes.append(manager), original(manager, background))
        c1, c2 = engine.decode_frame(r1), engine.decode_frame(r2)
        reg.heartbeat(("java", conn), engine.decode_heartbeat(c1.body), c1.language, c1.version)
        state = {g: sorted(reg.consumer_group_info(g).subscriptions) for g in reg.consumer_groups()}
        events.clear()
        writes.clear()
        reg.heartbeat(("java", conn), engine.decode_heartbeat(c2.body), c2.language, c2.version)
        assert events == [] and writes == []
        # the scan's view: members listing the same subscriptions in another order are consistent
        from engine.recording.scan_py import subscription_key

        keys = [{cd.group: subscription_key(cd.subscriptions) for cd in engine.decode_heartbeat(c.body).consumers}
                for c in (c1, c2)]
        assert keys[0] == keys[1]
        assert {g: sorted(reg.consumer_group_info(g).subscriptions) for g in reg.consumer_groups()} == state
        reg.check_invariants()

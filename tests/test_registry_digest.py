"""The fast path's heartbeat digest (engine.registry._digest native, engine.registry._digest_py twin): same value in both, and it
changes with every field the registration rules read and only with those."""
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_registry_model import heartbeats

import engine
from engine.codec.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def base(**over):
    sub = dict(topic="T", sub_string="TagA || TagB", tags=("TagA", "TagB"), codes=(2598919, 2598920),
               sub_version=1718000000000, expression_type="TAG", class_filter_mode=False)
    sub.update(over.pop("sub", {}))
    cons = dict(group="G", consume_type=ConsumeType.CONSUME_PASSIVELY, message_model=MessageModel.CLUSTERING,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, unit_mode=False,
                subscriptions=(engine.SubscriptionData(**sub),))
    cons.update(over.pop("consumer", {}))
    hb = dict(client_id="10.0.0.1@1", producers=(engine.ProducerData("P"),), consumers=(engine.ConsumerData(**cons),),
              fingerprint=0, without_sub=False)
    hb.update(over)
    return engine.HeartbeatData(**hb)


def test_vector_heartbeats_same_digest_in_both(pair, vectors):
    native, twin_ = pair
    seen = set()
    for _, entry, raw in vectors:
        if entry["code"] != 34:
            continue
        cmd = engine.decode_frame(raw)
        hb = native.heartbeat.decode_heartbeat(cmd.body)
        d = native.digest.heartbeat_digest(hb, cmd.language, cmd.version)
        assert d == twin_.digest.heartbeat_digest(twin_.heartbeat.decode_heartbeat(cmd.body), cmd.language,
                                                  cmd.version)
        assert -(1 << 63) <= d < (1 << 63)
        seen.add(d)
    assert len(seen) > 1


@SETTINGS
@given(hb=heartbeats, language=st.sampled_from([None, *LanguageCode]), version=st.integers(-(1 << 63), (1 << 63) - 1))
def test_native_and_twin_agree(pair, hb, language, version):
    native, twin_ = pair
    assert native.digest.heartbeat_digest(hb, language, version) == twin_.digest.heartbeat_digest(hb, language,
                                                                                                 version)


@pytest.mark.parametrize("change", [
    dict(client_id="10.0.0.1@2"), dict(client_id=None), dict(fingerprint=7), dict(without_sub=True),
    dict(producers=()), dict(producers=(engine.ProducerData("Q"),)),
    dict(producers=(engine.ProducerData("P"), engine.ProducerData("P"))),
    dict(consumers=()), dict(consumer=dict(group="H")), dict(consumer=dict(consume_type=None)),
    dict(consumer=dict(consume_type=ConsumeType.CONSUME_ACTIVELY)),
    dict(consumer=dict(message_model=MessageModel.BROADCASTING)),
    dict(consumer=dict(consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)),
    dict(consumer=dict(unit_mode=True)), dict(consumer=dict(subscriptions=())),
    dict(sub=dict(topic="U")), dict(sub=dict(sub_version=1718000000001)), dict(sub=dict(sub_version=-1)),
])
def test_digest_changes_with_every_field_the_rules_read(impl, change):
    d = impl.digest.heartbeat_digest
    assert d(base(), LanguageCode.JAVA, 479) != d(base(**change), LanguageCode.JAVA, 479)


@pytest.mark.parametrize("change", [
    dict(sub=dict(sub_string="TagC")), dict(sub=dict(tags=("TagC",))), dict(sub=dict(codes=(0, 0))),
    dict(sub=dict(expression_type="SQL92")), dict(sub=dict(class_filter_mode=True)),
])
def test_digest_ignores_what_update_subscription_ignores(impl, change):
    d = impl.digest.heartbeat_digest
    assert d(base(), LanguageCode.JAVA, 479) == d(base(**change), LanguageCode.JAVA, 479)


def test_request_language_and_version_are_part_of_it(impl):
    d = impl.digest.heartbeat_digest
    values = {d(base(), lang, ver) for lang in (None, LanguageCode.JAVA, LanguageCode.CPP) for ver in (0, 63, 479)}
    assert len(values) == 9


def test_structure_is_length_prefixed(impl):
    d = impl.digest.heartbeat_digest
    two = engine.ConsumerData("G", subscriptions=(engine.SubscriptionData("T"), engine.SubscriptionData("U")))
    split = (engine.ConsumerData("G", subscriptions=(engine.SubscriptionData("T"),)),
             engine.ConsumerData("G", subscriptions=(engine.SubscriptionData("U"),)))
    assert d(engine.HeartbeatData("c", (), (two,)), None, 0) != d(engine.HeartbeatData("c", (), split), None, 0)


def test_any_object_with_the_attributes(pair):
    ns = types.SimpleNamespace
    hb = ns(client_id="c", fingerprint=0, without_sub=False, producers=[ns(group="P")],
            consumers=[ns(group="G", consume_type=ConsumeType.CONSUME_PASSIVELY, message_model=None,
                          consume_from_where=None, unit_mode=False, subscriptions=[ns(topic="T", sub_version=3)])])
    assert pair[0].digest.heartbeat_digest(hb, None, 0) == pair[1].digest.heartbeat_digest(hb, None, 0)


@pytest.mark.parametrize("version", [1 << 63, -(1 << 63) - 1])
def test_out_of_range_ints_same_error(impl, version):
    with pytest.raises(OverflowError, match="too large to convert"):
        impl.digest.heartbeat_digest(base(), None, version)


def _subs(*topics, version=1):
    return tuple(engine.SubscriptionData(t, sub_version=version) for t in topics)


def _reordered(hb):
    """The same registration in another set order (what a Java client's HashSet does between heartbeats)."""
    return engine.HeartbeatData(
        hb.client_id, hb.producers[::-1],
        tuple(engine.ConsumerData(c.group, c.consume_type, c.message_model, c.consume_from_where, c.unit_mode,
                                  c.subscriptions[::-1]) for c in hb.consumers[::-1]),
        hb.fingerprint, hb.without_sub)


def test_reordered_sets_give_the_same_digest(impl):
    d = impl.digest.heartbeat_digest
    many = tuple(f"T{i}" for i in range(40))   # past the native module's pairwise check (a Python set there)
    hb = engine.HeartbeatData("c", (engine.ProducerData("P"), engine.ProducerData("CLIENT_INNER_PRODUCER")), (
        engine.ConsumerData("G1", subscriptions=_subs("T", "%RETRY%G1", "U")),
        engine.ConsumerData("G2", subscriptions=_subs(*many)),
    ))
    assert d(hb, None, 0) == d(_reordered(hb), None, 0)


def test_duplicates_keep_their_order_in_the_digest(impl):
    """Two consumers of one group, or two subscriptions of one topic: which one wins depends on their order, so
    their order stays in the digest (a reordered heartbeat of that shape takes the full path)."""
    d = impl.digest.heartbeat_digest
    g1 = engine.ConsumerData("G", subscriptions=_subs("T"))
    g2 = engine.ConsumerData("G", subscriptions=_subs("U"))
    assert d(engine.HeartbeatData("c", (), (g1, g2)), None, 0) != d(engine.HeartbeatData("c", (), (g2, g1)), None, 0)
    a = engine.ConsumerData("G", subscriptions=(engine.SubscriptionData("T", sub_version=1),
                                                engine.SubscriptionData("T", sub_version=2)))
    b = engine.ConsumerData("G", subscriptions=a.subscriptions[::-1])
    assert d(engine.HeartbeatData("c", (), (a,)), None, 0) != d(engine.HeartbeatData("c", (), (b,)), None, 0)


@SETTINGS
@given(hb=heartbeats)
def test_reordering_any_heartbeat_without_duplicates_keeps_the_digest(pair, hb):
    for impl in pair:
        d = impl.digest.heartbeat_digest
        groups = [c.group for c in hb.consumers]
        topics_unique = all(len({s.topic for s in c.subscriptions}) == len(c.subscriptions) for c in hb.consumers)
        if len(set(groups)) == len(groups) and topics_unique:
            assert d(hb, None, 0) == d(_reordered(hb), None, 0)


@pytest.mark.parametrize("duplicate", [False, True])
@pytest.mark.parametrize("size", [15, 16, 17, 40])
def test_sets_on_both_sides_of_the_native_small_set_limit(pair, size, duplicate):
    """The native module checks up to 16 keys pairwise in C arrays and larger sets with a Python set."""
    topics = [f"T{i}" for i in range(size)]
    groups = [f"G{i}" for i in range(size)]
    if duplicate:
        topics[-1], groups[-1] = topics[0], groups[0]
    hb = engine.HeartbeatData("c", (), tuple(engine.ConsumerData(g, subscriptions=_subs(*topics)) for g in groups))
    native, twin = (impl.digest.heartbeat_digest for impl in pair)
    assert native(hb, None, 0) == twin(hb, None, 0)
    assert native(_reordered(hb), None, 0) == twin(_reordered(hb), None, 0)
    assert (native(hb, None, 0) == native(_reordered(hb), None, 0)) is not duplicate

"""The fast path's heartbeat digest (engine._digest native, engine._digest_py twin): same value in both, and it
changes with every field the registration rules read and only with those."""
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_registry_model import heartbeats

import engine
from engine.enums import ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel

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

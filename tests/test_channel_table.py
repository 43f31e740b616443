"""The registry's channel table (engine.registry._channel_table native, engine.registry._channel_table_py twin): slot
allocation and budget, columns, memberships and member arrays, own times and infos, the expiry scan, errors, and
parity (the same operation sequences give the same results and the same errors, message included)."""
import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_native
from engine.registry._channel_table_py import ChannelTableError, INLINE, NO_LANGUAGE

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
SHIFT = 60_000  # producer timeout 120 s - consumer timeout 60 s


def module(name):
    if name == "native":
        require_native()
        return importlib.import_module("engine.registry._channel_table")
    return importlib.import_module("engine.registry._channel_table_py")


@pytest.fixture(params=["native", "twin"])
def ct(request):
    return module(request.param)


def test_native_shares_the_twin_error_class():
    native = module("native")
    assert native.ChannelTableError is ChannelTableError
    assert issubclass(ChannelTableError, ValueError)
    assert native.INLINE == INLINE and native.NO_LANGUAGE == NO_LANGUAGE


def test_open_close_reuses_slots(ct):
    t = ct.ChannelTable(capacity=2)
    a, b, c = object(), object(), object()
    assert [t.open(a, 5), t.open(b), t.open(c)] == [0, 1, 2]
    assert t.capacity == 3 and t.top == 3 and len(t) == 3
    assert t.find(b) == 1 and t.channel(1) is b and t.addr(0) == 5
    assert t.client(0) == (-1, NO_LANGUAGE, 0)
    t.close(1)
    assert t.find(b) is None and len(t) == 2
    with pytest.raises(ChannelTableError, match="slot 1 is not in use"):
        t.channel(1)
    d = object()
    assert t.open(d) == 1 and t.top == 3  # the freed slot first
    with pytest.raises(ChannelTableError, match="already open"):
        t.open(d)
    t.check()


class Colliding:
    """A channel whose hash collides with every other one's: lookups go by == among the whole probe run."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 7

    def __eq__(self, other):
        return isinstance(other, Colliding) and other.name == self.name


def test_channel_index_by_equality_collisions_and_removal_order(ct):
    """Channels are found by hash and ==, as a dict finds keys (an equal key of another identity finds the slot),
    across growth of the index and removals in any order (native: backward-shift deletion in linear probing)."""
    import random

    rnd = random.Random(5)
    t = ct.ChannelTable(capacity=1)
    keys = [i * (1 << 20) for i in range(300)] + [("conn", i) for i in range(300)] + [Colliding(i) for i in range(60)]
    slots = {}
    for k in keys:
        slots[repr(k) if isinstance(k, Colliding) else k] = t.open(k)
    for _ in range(3):
        order = list(keys)
        rnd.shuffle(order)
        for k in order[: len(order) // 2]:
            key = repr(k) if isinstance(k, Colliding) else k
            twin = Colliding(k.name) if isinstance(k, Colliding) else (k if isinstance(k, int) else tuple(k))
            assert t.find(twin) == slots[key]
            t.close(slots.pop(key))
            assert t.find(twin) is None
        t.check()
        for k in order[: len(order) // 2]:
            slots[repr(k) if isinstance(k, Colliding) else k] = t.open(k)
        t.check()
    assert len(t) == len(keys) and sorted(s for _, s in t.items()) == sorted(slots.values())
    for k in keys:
        assert t.find(Colliding(k.name) if isinstance(k, Colliding) else k) == slots[repr(k) if isinstance(k, Colliding) else k]
    with pytest.raises(ChannelTableError, match="already open"):
        t.open(Colliding(3))


def test_channel_index_survives_eq_that_changes_the_table(ct):
    """A channel's __eq__ that closes a slot while a lookup probes (user code runs inside the probe): the lookup
    restarts and still answers right, as a dict lookup does; the table stays consistent."""
    t = ct.ChannelTable(capacity=4)
    victims = []

    class Meddler(Colliding):
        __hash__ = Colliding.__hash__

        def __eq__(self, other):
            if victims:
                t.close(victims.pop())
            return super().__eq__(other)

    a, b = Meddler("a"), Meddler("b")
    sa, sb = t.open(a), t.open(b)
    c = Colliding("c")
    sc = t.open(c)
    victims.append(sb)
    assert t.find(Colliding("c")) == sc and not victims  # b was closed during the probe
    assert t.find(b) is None and t.find(a) == sa
    t.check()


def test_a_channel_finaliser_that_closes_its_slot_again_meets_a_free_slot(ct):
    """close() releases the channel after every state change: a channel whose __del__ closes its own slot again
    (user code run by the table's release) gets ChannelTableError there, and the table stays consistent (the
    native close used to loop for ever in its index)."""
    t = ct.ChannelTable(capacity=2)
    errors = []

    class Finalised:
        def __del__(self):
            try:
                t.close(self.slot)
            except ChannelTableError as e:
                errors.append(str(e))

    ch = Finalised()
    ch.slot = t.open(ch)
    other = t.open("other")
    del ch  # the table holds the last reference
    t.close(0)
    assert errors == ["slot 0 is not in use"]
    assert len(t) == 1 and t.find("other") == other and t.open("new") == 0
    t.check()


def test_channel_hash_errors_propagate_and_change_nothing(ct):
    class Unhashable:
        def __hash__(self):
            raise RuntimeError("no hash")

    t = ct.ChannelTable(capacity=2)
    t.open("x")
    with pytest.raises(RuntimeError, match="no hash"):
        t.open(Unhashable())
    with pytest.raises(TypeError):
        t.open([])
    assert len(t) == 1 and t.top == 1
    t.check()


def test_budget(ct):
    t = ct.ChannelTable(capacity=2, max_slots=3)
    for i in range(3):
        t.open(i)
    with pytest.raises(ChannelTableError, match=r"the channel table is full \(3 slots\)"):
        t.open(3)
    assert len(t) == 3 and t.find(3) is None
    t.close(t.find(0))
    assert t.open(3) == 0
    with pytest.raises(ChannelTableError, match="max_slots"):
        ct.ChannelTable(max_slots=0)
    with pytest.raises(ChannelTableError, match="capacity"):
        ct.ChannelTable(capacity=0)


def test_members_swap_remove_and_positions(ct):
    t = ct.ChannelTable(capacity=4, producer_shift=SHIFT)
    slots = [t.open(i) for i in range(4)]
    for s in slots:
        assert t.add_member(s, 6) == s
    assert t.group_slots(6) == [0, 1, 2, 3] and t.group_channels(6) == (0, 1, 2, 3)
    assert t.remove_member(1, 6) == -1
    assert t.group_slots(6) == [0, 3, 2] and t.mem_pos(3, 6) == 1
    assert t.remove_member(1, 6) == -2  # not a member any more
    with pytest.raises(ChannelTableError, match="already a member"):
        t.add_member(0, 6)
    with pytest.raises(ChannelTableError, match="still has 1 memberships"):
        t.close(0)
    assert t.group_size(6) == 3 and t.group_size(10**6) == 0 and t.group_slots(8) == []
    t.check()


def test_overflow_memberships_keep_order(ct):
    t = ct.ChannelTable(capacity=1, producer_shift=SHIFT)
    s = t.open("ch")
    keys = [2, 5, 8, 11, 14, 17, 20]
    for k in keys:
        t.add_member(s, k)
    assert t.mem_keys(s) == keys and t.nmem(s) == 7 and t.kinds(s) == 3 and t.live(s)
    t.remove_member(s, 5)  # an inline key goes: the first overflow key moves inline
    assert t.mem_keys(s) == [2, 8, 11, 14, 17, 20]
    t.remove_member(s, 20)
    t.remove_member(s, 2)
    assert t.mem_keys(s) == [8, 11, 14, 17] and t.kinds(s) == 3
    for k in (8, 14):
        t.remove_member(s, k)
    assert t.kinds(s) == 2  # 11 and 17 are producer keys
    for k in (11, 17):
        t.remove_member(s, k)
    assert not t.live(s) and t.kinds(s) == 0
    t.close(s)
    t.check()


def test_membership_count_and_client_slot_column(ct):
    """The table counts every slot's memberships (the registry's max_memberships budget) and holds ProducerManager's
    clientChannelTable (pool id -> slot, -1 none), grown past its first 64 entries; an entry outlives its slot's
    close (the registry drops it first)."""
    t = ct.ChannelTable(capacity=4)
    a, b = t.open("a"), t.open("b")
    for k in range(6):  # overflow memberships count too
        t.add_member(a, k)
    t.add_member(b, 1)
    assert t.memberships == 7
    t.remove_member(a, 5)
    assert t.remove_member(a, 5) == -2 and t.memberships == 6
    assert t.client_slots_capacity() == 64 and t.client_slots_nbytes() == 256
    assert t.client_slot(3) == -1 and t.set_client_slot(3, a) == -1 and t.set_client_slot(3, b) == a
    assert t.set_client_slot(1000, a) == -1 and t.client_slots_capacity() == 1001
    assert t.client_slot_items() == [(3, b), (1000, a)]
    assert not t.drop_client_slot(3, only_slot=a) and t.drop_client_slot(3, only_slot=b)
    assert not t.drop_client_slot(3) and not t.drop_client_slot(-1) and not t.drop_client_slot(1 << 40)
    assert t.client_slot(3) == -1 and t.client_slot(1 << 70) == -1
    with pytest.raises(ChannelTableError, match="client id must be in"):
        t.set_client_slot(1 << 31, a)
    with pytest.raises(ChannelTableError, match="is not in use"):
        t.set_client_slot(1, 3)
    for k in range(5):
        t.remove_member(a, k)
    t.close(a)
    assert t.client_slot(1000) == a  # the table does not clear it
    assert t.memberships == 1
    t.check()


def test_scan_key_and_refresh(ct):
    t = ct.ChannelTable(capacity=1, producer_shift=SHIFT)
    s = t.open("ch")
    t.add_member(s, 0)  # consumer
    t.add_member(s, 3)  # producer
    assert t.refresh(s, [0, 3], 1_000) == 1
    assert t.last(s) == 1_000 and t.oldest(s) == 1_000  # min(1000, 1000 + shift)
    assert t.refresh(s, [3], 5_000) == 0  # the consumer membership keeps its own time
    assert t.member_time(s, 0) == 1_000 and t.member_time(s, 3) == 5_000 and t.lag_items(s) == [(0, 1_000)]
    assert t.oldest(s) == 1_000
    assert t.expired_keys(s, 62_000, 60_000, 120_000) == [0]
    assert t.scan(61_001, 60_000) == [s] and t.scan(61_000, 60_000) == []
    assert t.refresh(s, [0, 3], 7_000) == 2  # all refreshed, the own time dropped
    assert t.lag_items(s) == [] and t.oldest(s) == 7_000
    t.remove_member(s, 0)
    assert t.oldest(s) == 7_000 + SHIFT  # a producer-only slot
    t.touch(s, 9_000)
    assert t.oldest(s) == 9_000 + SHIFT and t.last(s) == 9_000
    with pytest.raises(ChannelTableError, match="not a member of key 0"):
        t.refresh(s, [0], 1)
    t.check()


def test_member_info(ct):
    t = ct.ChannelTable(capacity=1)
    s = t.open("ch")
    t.set_client(s, 7, 0, 479)
    t.add_member(s, 4)
    assert t.member_info(s, 4) == (7, 0, 479)
    assert t.set_member_info(s, 4, 9, 0, 479) == -1
    assert t.member_info(s, 4) == (9, 0, 479) and t.info_cids(s) == [9]
    assert t.set_member_info(s, 4, 10, 1, 1) == 9
    assert t.set_member_info(s, 4, 7, 0, 479) == 10  # equal to the slot's: the own info goes
    assert t.info_cids(s) == []
    t.set_member_info(s, 4, 11, 0, 479)
    assert t.remove_member(s, 4) == 11  # handed back for the caller to release
    with pytest.raises(ChannelTableError, match="language"):
        t.set_client(s, 1, 256, 0)
    t.check()


def test_fast_path_columns(ct):
    t = ct.ChannelTable(capacity=1)
    s = t.open("ch")
    token = ("hb", 0, 1)
    t.arm(s, -5, token, 12)
    assert (t.fkey(s), t.armed_by(s), t.armed(s)) == (-5, token, 12)
    t.add_member(s, 0)
    assert t.armed(s) == 0  # a membership change disarms
    t.arm(s, 1, token, 13)
    t.disarm(s)
    assert t.armed(s) == 0
    with pytest.raises(ChannelTableError, match="fkey must fit in int64"):
        t.arm(s, 1 << 63, token, 1)


@pytest.mark.parametrize("now,timeout", [(INT64_MAX, 0), (INT64_MIN, 0), (0, INT64_MAX), (INT64_MAX, INT64_MAX),
                                         (-1, 0), (10, 14)])
def test_scan_exact_at_extremes(ct, now, timeout):
    t = ct.ChannelTable(capacity=8)
    times = [INT64_MIN, INT64_MAX, 0, -5, INT64_MIN + 1]
    for i, v in enumerate(times):
        s = t.open(i)
        t.add_member(s, 0)
        t.touch(s, v)
    t.open("dead")
    expected = [i for i, v in enumerate(times) if now - v > timeout]
    assert t.scan(now, timeout) == expected
    with pytest.raises(ChannelTableError, match="timeout must be >= 0"):
        t.scan(0, -1)


def test_check_and_own_times_at_extremes(ct):
    """check() holds at the int64 edges (the native check once wrapped last + producer_shift around) and when the
    clock goes back (an own time kept by refresh may then be after the slot's last)."""
    t = ct.ChannelTable(capacity=1, producer_shift=SHIFT)
    s = t.open("ch")
    t.add_member(s, 1)
    t.touch(s, INT64_MAX)
    assert t.oldest(s) == INT64_MAX
    t.check()
    t.add_member(s, 0)
    assert t.refresh(s, [], INT64_MIN) == 0 and sorted(t.lag_items(s)) == [(0, INT64_MAX), (1, INT64_MAX)]
    t.check()
    t.arm(s, 1, "tok", 5)
    t.touch(s, 0)  # the fast path refreshes every membership: the own times go
    assert t.lag_items(s) == [] and t.oldest(s) == 0 and t.member_time(s, 0) == 0
    t.check()


def test_refresh_leaving_memberships_out_disarms(ct):
    t = ct.ChannelTable(capacity=1, producer_shift=SHIFT)
    s = t.open("ch")
    t.add_member(s, 0)
    t.add_member(s, 2)
    t.arm(s, 1, "tok", 5)
    assert t.refresh(s, [0, 2], 10) == 1 and t.armed(s) == 5  # all refreshed: still armed
    assert t.refresh(s, [0], 20) == 0 and t.armed(s) == 0 and t.lag_items(s) == [(2, 10)]
    t.check()


def test_scan_blocks(ct):
    """Hits at block edges and many hits in one block (the native scan tests blocks of 2048 slots at once)."""
    t = ct.ChannelTable(capacity=16)
    n = 5000
    edges = {0, 511, 512, 2047, 2048, 4095, 4096, 4999}
    for i in range(n):
        s = t.open(i)
        t.add_member(s, 0)
        t.touch(s, 0 if i in edges or 1500 <= i < 2100 else 100)
    t.remove_member(3000, 0)  # not live: never a hit
    t.touch(2500, 0)
    expected = sorted(edges | set(range(1500, 2100)) | {2500})
    assert t.scan(50, 10) == expected
    assert t.scan(10, 10) == [] and t.scan(11, 10) == expected
    oldest, live = t.columns()
    assert oldest.dtype == np.int64 and live.dtype == np.uint8 and len(oldest) == n
    assert live.tolist() == [0 if i == 3000 else 1 for i in range(n)]


# ------------------------------------------------------------------------------------------------ parity

SLOTS = st.one_of(st.integers(0, 1), st.integers(-1, 9))  # few slots often: many memberships on one slot
KEYS = st.one_of(st.integers(0, 2), st.integers(0, 9))  # few keys often: long member arrays
TIMES = st.one_of(st.integers(-10, 200_000), st.sampled_from([INT64_MIN, INT64_MAX]))
OPS = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 11), st.integers(-3, 3)),
    st.tuples(st.just("open"), st.integers(0, 11), st.integers(-3, 3)),  # twice: tables fill up
    st.tuples(st.just("close"), SLOTS),
    # memberships weigh more: slots with overflow memberships (more than INLINE) need many adds on one slot
    *[st.tuples(st.just("add_member"), SLOTS, KEYS)] * 6,
    *[st.tuples(st.just("remove_member"), SLOTS, KEYS)] * 3,
    st.tuples(st.just("refresh"), SLOTS, st.lists(KEYS, max_size=4), TIMES),
    st.tuples(st.just("touch"), SLOTS, TIMES),
    st.tuples(st.just("set_client"), SLOTS, st.integers(-2, 5), st.sampled_from([0, 1, 255, 256]), st.integers(-1, 3)),
    st.tuples(st.just("set_member_info"), SLOTS, KEYS, st.integers(-1, 5), st.sampled_from([0, 1, 300]),
              st.integers(0, 2)),
    st.tuples(st.just("arm"), SLOTS, st.integers(-3, 3), st.integers(0, 5)),
    st.tuples(st.just("disarm"), SLOTS),
    st.tuples(st.just("set_addr"), SLOTS, st.integers(-5, 5)),
    st.tuples(st.just("scan"), TIMES, st.sampled_from([-1, 0, 1000, 60_000, INT64_MAX])),
    st.tuples(st.just("expired_keys"), SLOTS, TIMES, st.sampled_from([0, 60_000]), st.sampled_from([0, 120_000])),
    st.tuples(st.just("mem_pos"), SLOTS, KEYS),
    st.tuples(st.just("mem_keys"), SLOTS),
    st.tuples(st.just("member_time"), SLOTS, KEYS),
    st.tuples(st.just("member_info"), SLOTS, KEYS),
    st.tuples(st.just("group_slots"), KEYS),
    st.tuples(st.just("group_channels"), KEYS),
    st.tuples(st.just("channel"), SLOTS),
    st.tuples(st.just("in_use"), st.integers(-2, 12)),
    st.tuples(st.just("find"), st.integers(0, 11)),
    # the clientChannelTable column: pool ids past its first 64 entries grow it
    *[st.tuples(st.just("set_client_slot"), st.one_of(st.integers(-1, 3), st.sampled_from([63, 64, 200])), SLOTS)] * 2,
    st.tuples(st.just("drop_client_slot"), st.one_of(st.integers(-1, 3), st.sampled_from([64, 200, 2 ** 40])),
              st.one_of(st.integers(-2, 9), st.just(2 ** 40))),
    st.tuples(st.just("client_slot"), st.one_of(st.integers(-1, 3), st.sampled_from([64, 200, 2 ** 70]))),
)


def apply(table, op):
    name, *args = op
    if name == "open":
        args = ((args[0],), args[1])  # channels are tuples: hashable, compared by value
    elif name == "arm":
        args = (args[0], args[1], ("token", args[1]), args[2])
    elif name == "find":
        args = ((args[0],),)
    try:
        return "ok", getattr(table, name)(*args)
    except (ChannelTableError, OverflowError) as e:
        return type(e).__name__, str(e)


def snapshot(table):
    out = {"len": len(table), "top": table.top, "registered": table.registered_count(),
           "memberships": table.memberships, "client_slots": table.client_slot_items(),
           "client_slots_capacity": table.client_slots_capacity()}
    slots = {}
    assert table.items() == sorted(table.items(), key=lambda item: item[1])
    for channel, slot in sorted(table.items()):
        slots[channel] = (slot, table.client(slot), table.addr(slot), table.last(slot), table.oldest(slot),
                          table.live(slot), table.nmem(slot), table.kinds(slot), table.armed(slot), table.fkey(slot),
                          table.armed_by(slot), table.mem_keys(slot), sorted(table.lag_items(slot)),
                          sorted(table.info_cids(slot)))
    out["slots"] = slots
    out["groups"] = [table.group_slots(k) for k in range(10)]
    oldest, live = table.columns()
    out["columns"] = (oldest.tolist(), live.tolist())
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=20, max_size=150), capacity=st.integers(1, 4), max_slots=st.integers(1, 12))
def test_parity_operation_sequences(ops, capacity, max_slots):
    native, twin = module("native"), module("twin")
    tables = [m.ChannelTable(capacity=capacity, max_slots=max_slots, producer_shift=SHIFT) for m in (native, twin)]
    for op in ops:
        got = [apply(t, op) for t in tables]
        assert got[0] == got[1], op
    for t in tables:
        t.check()
    assert snapshot(tables[0]) == snapshot(tables[1])


ODD_ARGS = [0, 1, -1, True, 1.0, 1.5, "0", None, b"\x01", np.int64(1), np.int32(0), 2 ** 70, -(2 ** 70), 2 ** 31,
            2 ** 63, -(2 ** 63) - 1]
ARG_CALLS = [  # (method, how the odd value is placed among otherwise valid arguments)
    *[(m, lambda v: (v,)) for m in ("client", "addr", "last", "oldest", "live", "nmem", "kinds", "armed", "fkey",
                                     "armed_by", "channel", "in_use", "mem_keys", "lag_items", "info_cids", "disarm",
                                     "close", "group_size", "group_slots", "group_channels")],
    *[(m, lambda v: (v, 0)) for m in ("mem_pos", "member_time", "member_info", "add_member", "remove_member",
                                       "touch", "set_addr")],
    *[(m, lambda v: (0, v)) for m in ("mem_pos", "member_time", "member_info", "add_member", "remove_member",
                                       "touch", "set_addr")],
    ("set_client", lambda v: (v, 1, 1, 1)), ("set_client", lambda v: (0, v, 1, 1)),
    ("set_client", lambda v: (0, 1, v, 1)), ("set_client", lambda v: (0, 1, 1, v)),
    ("set_member_info", lambda v: (0, 3, v, 1, 1)), ("set_member_info", lambda v: (0, 3, 1, 1, v)),
    ("refresh", lambda v: (0, [v], 5)), ("refresh", lambda v: (0, [0, 3], v)), ("refresh", lambda v: (v, [], 5)),
    ("arm", lambda v: (0, v, "tok", 1)), ("arm", lambda v: (0, 1, "tok", v)),
    ("scan", lambda v: (v, 0)), ("scan", lambda v: (0, v)),
    ("expired_keys", lambda v: (0, v, 0, 0)), ("expired_keys", lambda v: (0, 0, 0, v)),
    ("open", lambda v: ("new", v)),
    ("set_client_slot", lambda v: (v, 0)), ("set_client_slot", lambda v: (1, v)),
    ("drop_client_slot", lambda v: (v, -1)), ("drop_client_slot", lambda v: (1, v)), ("client_slot", lambda v: (v,)),
]


@pytest.mark.parametrize("name,place", ARG_CALLS)
def test_argument_errors_are_the_same_in_both(name, place):
    """Every int argument is taken as operator.index takes it (ints, bools, numpy integers); anything else is a
    ChannelTableError, and out-of-range values the same error, in the native table and its twin alike (the twin
    once took "0" and 1.5 through int())."""
    native, twin = module("native"), module("twin")
    for v in ODD_ARGS:
        got = []
        for m in (native, twin):
            t = m.ChannelTable(capacity=4, producer_shift=SHIFT)
            s = t.open("a")
            t.add_member(s, 0)
            t.add_member(s, 3)
            try:
                got.append(("ok", getattr(t, name)(*place(v)), snapshot(t)))
            except ChannelTableError as e:
                got.append(("ChannelTableError", str(e), snapshot(t)))
        assert got[0] == got[1], (name, v)
        if not isinstance(v, (int, np.integer)):
            assert got[0][0] == "ChannelTableError", (name, v)  # never int()'s truncation or parsing


def test_long_member_arrays_grow_and_shrink(ct):
    """Member arrays past their first allocations keep every member (growth copies them)."""
    t = ct.ChannelTable(capacity=8)
    slots = [t.open(i) for i in range(100)]
    for s in slots:
        t.add_member(s, 2)
        if s % 3 == 0:
            t.add_member(s, 0)
    assert t.group_slots(2) == slots and t.group_channels(2) == tuple(range(100))
    assert t.group_slots(0) == slots[::3]
    for s in slots[:50]:
        t.remove_member(s, 2)
    assert sorted(t.group_slots(2)) == slots[50:]
    for s in slots[50:]:
        t.remove_member(s, 2)
    assert t.group_slots(2) == [] and t.group_size(2) == 0
    t.add_member(0, 2)  # an emptied key is used again
    assert t.group_slots(2) == [0]
    t.check()


# ------------------------------------------------------------------------------------------------ addresses

@pytest.mark.parametrize("text,packed", [
    ("10.0.0.7:53412", 1 << 48 | 10 << 40 | 7 << 16 | 53412),
    ("0.0.0.0:0", 1 << 48),
    ("255.255.255.255:65535", 1 << 48 | 0xFFFFFFFF << 16 | 65535),
    ("256.0.0.1:1", 0), ("1.2.3.4:65536", 0), ("01.2.3.4:5", 0), ("1.2.3.4:05", 0), ("1.2.3.4:", 0),
    ("1.2.3:4", 0), ("1.2.3.4.5:6", 0), ("1.2.3.4:5:6", 0), ("1.2.3.4:5.6", 0), ("[::1]:5000", 0),
    ("host-a:1", 0), ("", 0), ("1.2.3.4", 0), (":1", 0), ("1..3.4:5", 0), ("+1.2.3.4:5", 0),
    ("1.2.3.\u0664:5", 0), ("1.2.3.4:100000", 0), ("1.2.3.4:00", 0),
    # past Python's int() digit limit (4300): 0, not a ValueError from the twin
    ("1.2.3.4:" + "1" * 5000, 0), ("1" * 5000 + ".2.3.4:5", 0), ("1.2.3." + "9" * 4301 + ":5", 0),
    ("1.2.3.4:000001", 0), ("1.2.3.0255:1", 0),
])
def test_pack_ipv4(ct, text, packed):
    assert ct.pack_ipv4(text) == packed


def test_pack_ipv4_refuses_other_types(ct):
    with pytest.raises(ChannelTableError, match="addr must be a str, not bytes"):
        ct.pack_ipv4(b"1.2.3.4:5")


@settings(max_examples=3000, deadline=None)
@given(text=st.one_of(
    st.text(alphabet="0123456789.:a \u0664", max_size=24),
    st.builds(lambda a, b, c, d, p: f"{a}.{b}.{c}.{d}:{p}", *[st.integers(0, 300)] * 4, st.integers(0, 70000)),
    st.builds(lambda parts, p: ".".join(parts) + ":" + p, st.lists(st.text("0123456789", max_size=4), max_size=5),
              st.text("0123456789", max_size=7)),
    # fields of thousands of digits (the twin once raised int()'s 4300-digit ValueError where native gave 0)
    st.builds(lambda parts, i, n, d: ".".join(parts[:i] + [d * n] + parts[i + 1:]) + ":1",
              st.just(["1", "2", "3", "4"]), st.integers(0, 3), st.integers(4000, 6000), st.sampled_from("019")),
    st.builds(lambda n, d: "1.2.3.4:" + d * n, st.integers(4000, 6000), st.sampled_from("019")),
))
def test_pack_ipv4_parity(text):
    native, twin = module("native"), module("twin")
    packed = twin.pack_ipv4(text)
    assert native.pack_ipv4(text) == packed
    if packed:  # a packed value is the exact text again
        v = packed
        assert f"{(v >> 40) & 255}.{(v >> 32) & 255}.{(v >> 24) & 255}.{(v >> 16) & 255}:{v & 0xFFFF}" == text

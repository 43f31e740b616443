"""The registry's string pool (engine.registry._intern native, engine.registry._intern_py twin): ids are stable while
referenced, freed at zero references, reused, and bounded; both give the same ids, strings and errors for the same
calls."""
import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_native

names = st.text(alphabet=st.sampled_from("ab@#.é中\U0001f600\ud800"), min_size=0, max_size=6)


def module(name):
    if name == "native":
        require_native()
        return importlib.import_module("engine.registry._intern")
    return importlib.import_module("engine.registry._intern_py")


@pytest.fixture(params=["native", "twin"])
def StringPool(request):
    return module(request.param).StringPool


@pytest.mark.parametrize("impl", ["native", "twin"])
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), names), max_size=200), capacity=st.integers(1, 40))
def test_pool_matches_a_refcounted_dict(impl, ops, capacity):
    pool = module(impl).StringPool(capacity)
    refs, ids = {}, {}
    peak = 0
    for add, s in ops:
        if add:
            e = pool.intern(s)
            assert ids.setdefault(s, e) == e
            refs[s] = refs.get(s, 0) + 1
        elif s in refs:
            pool.release(ids[s])
            refs[s] -= 1
            if not refs[s]:
                del refs[s], ids[s]
                assert pool.lookup(s) == -1
        peak = max(peak, len(refs))
        for name, e in ids.items():
            assert pool.get(e) == name and pool.refs(e) == refs[name]
    pool.check()
    assert len(pool) == len(refs)
    assert pool.high_water <= peak  # freed ids are reused before new ones are handed out


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 (the comparison is of the error)
        return (type(exc).__name__, str(exc))


class Name(str):
    """A str subclass whose own hash would split one string into two ids: pooled as a str."""

    def __hash__(self):
        return 7


ids_ = st.one_of(st.integers(-3, 40), st.sampled_from([1 << 70, -(1 << 70), 1 << 63, True, 1.0, "1", None]))
op = st.one_of(st.tuples(st.just("intern"), names), st.tuples(st.just("lookup"), names),
               st.tuples(st.sampled_from(["intern", "lookup"]), names.map(Name)),
               st.tuples(st.sampled_from(["acquire", "release", "get", "refs"]), ids_))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=300), capacity=st.integers(1, 40))
def test_native_and_twin_agree_call_by_call(ops, capacity):
    native, twin = module("native").StringPool(capacity), module("twin").StringPool(capacity)
    for name, arg in ops:
        assert outcome(getattr(native, name), arg) == outcome(getattr(twin, name), arg), (name, arg)
        assert (len(native), native.high_water) == (len(twin), twin.high_water)
    native.check()
    twin.check()


def test_ids_are_reused_and_memory_stays_bounded(StringPool):
    pool = StringPool(16)
    for round_ in range(50):
        ids = [pool.intern(f"client-{round_}-{i}@host#{i * 7919}") for i in range(100)]
        for e in ids:
            pool.release(e)
    assert len(pool) == 0
    assert pool.high_water == 100  # each round reuses the ids the previous one freed
    pool.check()
    assert pool.nbytes() < 100 * 64 + 8192  # arena compacted, index rebuilt without tombstones


def test_arena_compaction_keeps_every_live_string(StringPool):
    pool = StringPool(16)
    keep = {pool.intern(f"kept-{i}-" + "x" * 40): f"kept-{i}-" + "x" * 40 for i in range(50)}
    for round_ in range(20):  # garbage passes half of the arena many times over
        for e in [pool.intern(f"gone-{round_}-{i}-" + "y" * 60) for i in range(200)]:
            pool.release(e)
    for e, s in keep.items():
        assert pool.get(e) == s and pool.lookup(s) == e
    pool.check()


def test_errors_on_dead_and_unknown_ids(StringPool):
    pool = StringPool()
    e = pool.intern("x")
    pool.release(e)
    for op_ in (pool.get, pool.release, pool.acquire):
        for bad in (e, -1, 10**6):
            with pytest.raises(KeyError, match="is not live"):
                op_(bad)
    assert pool.refs(-1) == 0 and pool.refs(10**6) == 0


def test_lone_surrogates_do_not_break_interning(StringPool):
    pool = StringPool()
    e = pool.intern("a\ud800b")
    assert pool.get(e) == "a\ud800b" and pool.lookup("a\ud800b") == e
    assert pool.lookup("a\ud801b") == -1


def test_a_str_subclass_is_pooled_as_a_str(StringPool):
    pool = StringPool()
    e = pool.intern("host-a:1")
    assert pool.intern(Name("host-a:1")) == e and pool.lookup(Name("host-a:1")) == e and pool.refs(e) == 2
    assert type(pool.get(e)) is str


@pytest.mark.parametrize("bad", [None, b"x", 1])
def test_only_str_is_interned(StringPool, bad):
    pool = StringPool()
    for op_ in (pool.intern, pool.lookup):
        with pytest.raises(TypeError):
            op_(bad)
    assert len(pool) == 0

"""engine.registry.intern.StringPool: ids are stable while referenced, freed at zero references, reused, and bounded."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.registry.intern import StringPool

names = st.text(alphabet=st.sampled_from("ab@#.é中\U0001f600"), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), names), max_size=200), capacity=st.integers(1, 40))
def test_pool_matches_a_refcounted_dict(ops, capacity):
    pool = StringPool(capacity)
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


def test_ids_are_reused_and_memory_stays_bounded():
    pool = StringPool(16)
    for round_ in range(50):
        ids = [pool.intern(f"client-{round_}-{i}@host#{i * 7919}") for i in range(100)]
        for e in ids:
            pool.release(e)
    assert len(pool) == 0
    assert pool.high_water == 100  # each round reuses the ids the previous one freed
    pool.check()
    assert pool.nbytes() < 100 * 64 + 8192  # arena compacted, index rebuilt without tombstones


def test_errors_on_dead_ids():
    pool = StringPool()
    e = pool.intern("x")
    pool.release(e)
    for op in (pool.get, pool.release, pool.acquire):
        with pytest.raises(KeyError):
            op(e)


def test_lone_surrogates_do_not_break_interning():
    pool = StringPool()
    e = pool.intern("a\ud800b")
    assert pool.get(e) == "a\ud800b" and pool.lookup("a\ud800b") == e

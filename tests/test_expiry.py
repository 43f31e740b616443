"""The expiry scan (engine.registry._expiry native, engine.registry._expiry_py twin): exact rule, edge values, errors, parity."""
import numpy as np
import pytest

import engine.registry._expiry_py as _expiry_py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def reference(last_update, live, now, timeout):
    """The rule in exact integer arithmetic: live and now - last_update > timeout."""
    return [i for i, (t, lv) in enumerate(zip(last_update.tolist(), live.tolist())) if lv and now - t > timeout]


def cols(values, live=None):
    lu = np.array(values, dtype=np.int64)
    lv = np.ones(len(values), np.uint8) if live is None else np.array(live, dtype=np.uint8)
    return lu, lv


def test_strictly_greater_than_timeout(impl):
    lu, lv = cols([0, 1, 2, 1000])
    # now - t: 120001, 120000, 119999, 119001
    assert impl.expiry.scan_expired(lu, lv, 120_001, 120_000).tolist() == [0]
    assert impl.expiry.scan_expired(lu, lv, 120_002, 120_000).tolist() == [0, 1]


def test_result_is_ascending_int64_array(impl):
    lu, lv = cols([5, 0, 5, 0, 0])
    out = impl.expiry.scan_expired(lu, lv, 100, 10)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.ndim == 1
    assert out.tolist() == [0, 1, 2, 3, 4]


def test_dead_slots_are_skipped(impl):
    lu, lv = cols([0, 0, 0, 0], live=[0, 1, 0, 255])
    assert impl.expiry.scan_expired(lu, lv, 10**6, 0).tolist() == [1, 3]


def test_empty_and_none_expired(impl):
    lu, lv = cols([])
    assert impl.expiry.scan_expired(lu, lv, 0, 0).tolist() == []
    lu, lv = cols([100, 200])
    assert impl.expiry.scan_expired(lu, lv, 150, 0).tolist() == [0]
    assert impl.expiry.scan_expired(lu, lv, 50, 0).tolist() == []


def test_future_timestamps_never_expire(impl):
    lu, lv = cols([1_000, 2_000])
    assert impl.expiry.scan_expired(lu, lv, 500, 0).tolist() == []


@pytest.mark.parametrize("now,timeout", [(INT64_MAX, 0), (INT64_MIN, 0), (0, INT64_MAX), (INT64_MAX, INT64_MAX),
                                         (-1, 0), (10, 14)])
def test_extreme_values_do_not_overflow(impl, now, timeout):
    lu, lv = cols([INT64_MIN, INT64_MAX, 0, -5, INT64_MIN + 1])
    assert impl.expiry.scan_expired(lu, lv, now, timeout).tolist() == reference(lu, lv, now, timeout)


def test_many_results_grow_the_buffer(impl):
    n = 100_003
    lu = np.zeros(n, np.int64)
    lv = np.ones(n, np.uint8)
    lu[::7] = 10**9  # fresh
    out = impl.expiry.scan_expired(lu, lv, 10**6, 1000)
    expected = np.flatnonzero(lu == 0)
    assert np.array_equal(out, expected)


def test_non_contiguous_and_read_only_views(impl):
    lu = np.arange(20, dtype=np.int64)[::2]
    lv = np.ones(20, np.uint8)[::2]
    assert impl.expiry.scan_expired(lu, lv, 15, 10).tolist() == [0, 1, 2]  # 15 - 4 > 10
    lu = np.zeros(3, np.int64)
    lu.flags.writeable = False
    lv = np.ones(3, np.uint8)
    lv.flags.writeable = False
    assert impl.expiry.scan_expired(lu, lv, 5, 1).tolist() == [0, 1, 2]


@pytest.mark.parametrize("args,message", [
    ((np.zeros(3, np.int32), np.zeros(3, np.uint8), 0, 1), "last_update must be a 1-D int64 array"),
    ((np.zeros((2, 2), np.int64), np.zeros(4, np.uint8), 0, 1), "last_update must be a 1-D int64 array"),
    ((np.zeros(3, np.int64), np.zeros(3, np.bool_), 0, 1), "live must be a 1-D uint8 array"),
    ((np.zeros(3, np.int64), np.zeros(2, np.uint8), 0, 1), "last_update has 3 slots but live has 2"),
    ((np.zeros(3, np.int64), np.zeros(3, np.uint8), 0, -1), "timeout must be >= 0"),
])
def test_bad_input_same_error(impl, args, message):
    with pytest.raises(_expiry_py.ExpiryScanError, match=message):  # typed, and a ValueError
        impl.expiry.scan_expired(*args)


@pytest.mark.parametrize("now,timeout", [(1 << 63, 0), (0, 1 << 63), (-(1 << 63) - 1, 0)])
def test_out_of_range_scalars(impl, now, timeout):
    lu, lv = cols([0])
    with pytest.raises(OverflowError):
        impl.expiry.scan_expired(lu, lv, now, timeout)


int64s = st.integers(INT64_MIN, INT64_MAX)
small_times = st.integers(-1000, 1000)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(0, 64), wide=st.booleans())
def test_native_and_twin_agree_with_the_rule(pair, data, n, wide):
    values = int64s if wide else small_times
    lu = data.draw(hnp.arrays(np.int64, n, elements=values))
    lv = data.draw(hnp.arrays(np.uint8, n, elements=st.integers(0, 255)))
    now = data.draw(values)
    timeout = data.draw(st.integers(0, INT64_MAX) if wide else st.integers(0, 500))
    out = pair[0].expiry.scan_expired(lu, lv, now, timeout)
    assert out.tolist() == reference(lu, lv, now, timeout)
    assert out.tolist() == pair[1].expiry.scan_expired(lu, lv, now, timeout).tolist()


def test_monotonic_ms_is_the_monotonic_clock_in_whole_ms(impl):
    import time

    clock = impl.expiry.monotonic_ms
    before = time.monotonic_ns() // 1_000_000
    got = clock()
    after = time.monotonic_ns() // 1_000_000
    assert type(got) is int and before <= got <= after


def test_review_scalar_arguments_accepted_and_refused_alike():
    # review: the native took a str now as TypeError while the twin's int() parsed it, a float was truncated by
    # both, and a timeout below int64 was OverflowError native but ValueError twin
    import numpy as _np

    from engine.registry import _expiry as _native
    from engine.registry import _expiry_py as _twin

    lu = _np.array([0, 5], dtype=_np.int64)
    lv = _np.ones(2, _np.uint8)
    cases = [(10, 1), (_np.int64(10), _np.int32(1)), (True, 0), ("10", 1), (10.7, 1), (10, 1.5), (None, 1),
             (10, -(1 << 64)), (1 << 63, 0), (10, 1 << 63), (10, -1)]
    for now, timeout in cases:
        got = []
        for mod in (_native, _twin):
            try:
                got.append(("ok", mod.scan_expired(lu, lv, now, timeout).tolist()))
            except Exception as exc:  # noqa: BLE001 - compared between implementations
                got.append((type(exc).__name__, str(exc)))
        assert got[0] == got[1], (now, timeout, got)
        if isinstance(now, (str, float)) or isinstance(timeout, (str, float)) or now is None:
            assert got[0][0] == "TypeError", (now, timeout, got)

"""Pure-Python twin of ``engine.registry._expiry``: the expiry scan over the registry's timestamp column.

``scan_expired(last_update, live, now, timeout)`` returns, as a numpy int64 array in ascending order, every slot
``i`` with ``live[i] != 0`` and ``now - last_update[i] > timeout`` (ClientHousekeepingService's test, PROTOCOL.md
6.6.6 and pitfall 9: strictly greater). The difference is exact for any int64 values: a slot whose timestamp is
not older than ``now`` never expires, and an older one is compared as the unsigned distance, so no subtraction
overflows (the native module computes the same thing in C).

``monotonic_ms()`` is the registry's default clock (the scan's ``now``): CLOCK_MONOTONIC in whole milliseconds,
read once per heartbeat, so the native module reads it without the interpreter's float round trip.
"""
import operator
import time

import numpy as np

from engine.codec.errors import RemotingError

__all__ = ["ExpiryScanError", "scan_expired", "check_columns", "check_scalars", "monotonic_ms"]


class ExpiryScanError(RemotingError, ValueError):
    """Columns the expiry scan cannot take (dtype, rank, lengths) or a negative timeout."""


def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in whole milliseconds (``time.monotonic_ns() // 1_000_000``)."""
    return time.monotonic_ns() // 1_000_000


def check_columns(last_update, live, timeout):
    """Validate the inputs both implementations accept; returns (last_update, live) as numpy views.

    Shared by the twin and the native module so that both raise the same error, with the same message, on the
    same input: ExpiryScanError (a ValueError) for a wrong dtype, rank or length, or a negative timeout.
    """
    lu = np.asarray(last_update)
    lv = np.asarray(live)
    if lu.dtype != np.int64 or lu.ndim != 1:
        raise ExpiryScanError(f"last_update must be a 1-D int64 array, not {lu.ndim}-D {lu.dtype}")
    if lv.dtype != np.uint8 or lv.ndim != 1:
        raise ExpiryScanError(f"live must be a 1-D uint8 array, not {lv.ndim}-D {lv.dtype}")
    if lu.shape[0] != lv.shape[0]:
        raise ExpiryScanError(f"last_update has {lu.shape[0]} slots but live has {lv.shape[0]}")
    if timeout < 0:
        raise ExpiryScanError(f"timeout must be >= 0, not {timeout}")
    return lu, lv


def check_scalars(now, timeout):
    """``now`` and ``timeout`` as Python ints, shared by both implementations so they accept and refuse alike:
    ints, bools and numpy integers (operator.index; a float, str or None is TypeError), OverflowError outside int64."""
    now = operator.index(now)
    timeout = operator.index(timeout)
    if not -(1 << 63) <= now < (1 << 63) or not -(1 << 63) <= timeout < (1 << 63):
        raise OverflowError("now and timeout must fit in int64")
    return now, timeout


def scan_expired(last_update, live, now, timeout):
    """Slots that are live and whose last update is more than ``timeout`` ms before ``now`` (ascending int64)."""
    now, timeout = check_scalars(now, timeout)
    lu, lv = check_columns(last_update, live, timeout)
    # int64 subtraction wraps; for last_update < now the wrapped value read as uint64 is the exact distance
    with np.errstate(over="ignore"):
        distance = (np.int64(now) - lu).view(np.uint64)
    expired = (lv != 0) & (lu < now) & (distance > np.uint64(timeout))
    return np.flatnonzero(expired).astype(np.int64, copy=False)

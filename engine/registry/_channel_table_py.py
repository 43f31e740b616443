"""Pure-Python twin of ``engine.registry._channel_table``: the registry's channel table.

One slot per open channel, in flat columns: the latest heartbeat time (``last``), the scan key (``oldest``: the
oldest membership time, producer memberships shifted by ``producer_shift`` so that one column serves both
timeouts), the channel's own client id / language / version (interned ids, the registry's
:class:`engine.registry._intern_py.StringPool`), its remote address (a packed IPv4 address, ``-(pool id + 1)`` or 0),
the live flag (has memberships), the membership count and kinds, and the fast path's digest, arming tick and
token. A membership is a key ``gid * 2 + kind`` (kind 0 consumer, 1 producer); a slot keeps up to :data:`INLINE`
of them inline as (key, position in the group's member array), more in an overflow dict. Each key has a member
array of slots, removed from by swapping the last member in (so a group lists its members in insertion order until
one leaves). A membership's own older time (when a later heartbeat on the channel left it out) and its own
client info (when it differs from the slot's) are side tables; few slots have them.

The table does the bookkeeping only: interning, reference counts, RocketMQ's rules and events are the registry's
and the managers'. It never calls back. Every misuse (a slot not in use, a key already a member, a full table)
raises :class:`ChannelTableError` with the same message in both implementations; a failed call changes nothing.

Budget: the columns start at ``capacity`` slots and grow by half when full, up to ``max_slots`` slots; opening a
channel beyond that raises ``ChannelTableError`` (the broker's connection budgets keep it far below).
"""
from __future__ import annotations

import operator

import numpy as np

from engine.codec.errors import RemotingError

__all__ = ["ChannelTable", "ChannelTableError", "INLINE", "MAX_MEMBERSHIPS", "MAX_SLOTS", "NO_LANGUAGE", "pack_ipv4"]

#: memberships kept inline per slot; more go to an overflow dict
INLINE = 4
#: the default (and largest) slot budget
MAX_SLOTS = 1 << 30
#: language column value of a slot with no language
NO_LANGUAGE = 255
#: memberships one slot can hold (the nmem column is 16 bits); the registry refuses a heartbeat that would pass it
MAX_MEMBERSHIPS = 65535
_MAX_MEMBERSHIPS = MAX_MEMBERSHIPS
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class ChannelTableError(RemotingError, ValueError):
    """Misuse of the channel table (a slot not in use, a membership twice, a full table, a bad argument)."""


def _as_int(name, value):
    """``operator.index(value)``: an int (bool and numpy integers too); a float, str or anything else is a
    ChannelTableError, in both implementations (``int()`` would take "7" and truncate 1.5)."""
    if type(value) is int:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise ChannelTableError(f"{name} must be an int, not {type(value).__name__}") from None


def _int64(name, value):
    value = _as_int(name, value)
    if not _I64_MIN <= value <= _I64_MAX:
        raise ChannelTableError(f"{name} must fit in int64, not {value}")
    return value


def pack_ipv4(addr: str) -> int:
    """The address column's value of ``a.b.c.d:port``: ``1 << 48 | a << 40 | b << 32 | c << 24 | d << 16 | port``;
    0 when the text is not exactly that form (decimal fields without leading zeros, each <= 255, port <= 65535,
    ASCII digits only), so that every packed value unpacks to the very text it came from."""
    if not isinstance(addr, str):
        raise ChannelTableError(f"addr must be a str, not {type(addr).__name__}")
    host, sep, port = addr.rpartition(":")
    parts = host.split(".")
    if not sep or len(parts) != 4:
        return 0
    packed = 1 << 48
    for shift, text in zip((40, 32, 24, 16), parts):
        # the length first: int() of more than 4300 digits raises (native: at most 5 digits a field)
        if len(text) > 3 or not (text.isascii() and text.isdigit()) or str(int(text)) != text or int(text) > 255:
            return 0  # also refuses "010" and "+1", which would not round-trip
        packed |= int(text) << shift
    if len(port) > 5 or not (port.isascii() and port.isdigit()) or str(int(port)) != port or int(port) > 65535:
        return 0
    return packed | int(port)


class ChannelTable:
    """Slots of open channels with their columns and memberships (see the module docstring). Not thread-safe."""

    _COLUMNS = (
        ("_last", np.int64, 1),
        ("_oldest", np.int64, 1),
        ("_cid", np.int32, 1),
        ("_lang", np.uint8, 1),
        ("_ver", np.int32, 1),
        ("_addr", np.int64, 1),
        ("_live", np.uint8, 1),
        ("_used", np.uint8, 1),
        ("_nmem", np.uint16, 1),
        ("_kinds", np.uint8, 1),
        ("_fkey", np.int64, 1),
        ("_armed", np.int64, 1),
        ("_mkey", np.int32, INLINE),
        ("_mpos", np.int32, INLINE),
    )

    def __init__(self, capacity: int = 1024, max_slots: int = MAX_SLOTS, producer_shift: int = 0):
        capacity, max_slots = _as_int("capacity", capacity), _as_int("max_slots", max_slots)
        if not 1 <= max_slots <= MAX_SLOTS:
            raise ChannelTableError(f"max_slots must be in [1, {MAX_SLOTS}], not {max_slots}")
        if capacity < 1:
            raise ChannelTableError(f"capacity must be >= 1, not {capacity}")
        producer_shift = _int64("producer_shift", producer_shift)
        if not -(1 << 40) <= producer_shift <= 1 << 40:
            raise ChannelTableError(f"producer_shift must be within +-2**40 ms, not {producer_shift}")
        self.max_slots = max_slots
        self.producer_shift = producer_shift
        # scan-key offset of a fully fresh slot by membership kinds (bit 0 consumer, bit 1 producer)
        self._fresh_off = (0, 0, producer_shift, min(0, producer_shift))
        self._slot_of: dict = {}  # channel -> slot of every open channel (native: a C hash index)
        self._channels: list = []
        self._armed_by: list = []
        self._free: list = []
        self._top = 0
        self._cap = 0
        self._overflow: dict = {}  # slot -> {key: pos} beyond the inline memberships
        self._lag: dict = {}  # slot -> {key: own older time}
        self._info: dict = {}  # slot -> {key: (cid, language, version)} when != the slot's own
        self._members: list = []  # key -> int32 array of member slots (None: never used)
        self._msize: list = []  # key -> member count
        self._memberships = 0  # memberships held by all slots
        #: ProducerManager's clientChannelTable: pool id -> slot, -1 when none (native: a C int32 column)
        self._cslot = np.full(64, -1, np.int32)
        self._mv_cslot = memoryview(self._cslot)
        self._grow(min(capacity, max_slots))

    # ------------------------------------------------------------------------------------------------ storage
    def _grow(self, cap: int) -> None:
        for name, dtype, width in self._COLUMNS:
            arr = np.zeros(cap * width, dtype)
            if name == "_mkey":
                arr.fill(-1)
            if self._cap:
                arr[:self._cap * width] = getattr(self, name)[:self._cap * width]
            setattr(self, name, arr)
            setattr(self, "_mv" + name, memoryview(arr))
        self._channels.extend([None] * (cap - self._cap))
        self._armed_by.extend([None] * (cap - self._cap))
        self._cap = cap

    def _slot(self, slot) -> int:
        slot = _as_int("slot", slot)
        if not 0 <= slot < self._top or not self._mv_used[slot]:
            raise ChannelTableError(f"slot {slot} is not in use")
        return slot

    @staticmethod
    def _key(key) -> int:
        key = _as_int("membership key", key)
        if not 0 <= key < 1 << 31:
            raise ChannelTableError(f"membership key must be in [0, 2**31), not {key}")
        return key

    # ------------------------------------------------------------------------------------------------ channels
    def open(self, channel, addr: int = 0) -> int:
        """A slot for a new channel (``addr``: the address column's value); the columns start empty."""
        addr = _int64("addr", addr)
        if channel in self._slot_of:
            raise ChannelTableError("the channel is already open")
        if self._free:
            slot = self._free.pop()
        else:
            if self._top == self._cap:
                if self._cap >= self.max_slots:
                    raise ChannelTableError(f"the channel table is full ({self.max_slots} slots)")
                self._grow(min(self.max_slots, self._cap + max(1, self._cap // 2)))
            slot = self._top
            self._top += 1
        self._slot_of[channel] = slot
        self._channels[slot] = channel
        self._mv_used[slot] = 1
        self._mv_cid[slot] = -1
        self._mv_lang[slot] = NO_LANGUAGE
        self._mv_ver[slot] = 0
        self._mv_addr[slot] = addr
        self._mv_last[slot] = 0
        self._mv_oldest[slot] = 0
        self._mv_fkey[slot] = 0
        self._mv_armed[slot] = 0
        return slot

    def find(self, channel):
        """The channel's slot, or None when it is not open."""
        return self._slot_of.get(channel)

    def items(self) -> list:
        """``(channel, slot)`` of every open channel, by slot."""
        return sorted(self._slot_of.items(), key=lambda item: item[1])

    def in_use(self, slot: int) -> bool:
        """Whether ``slot`` is the slot of an open channel (any int; only a non-int raises)."""
        slot = _as_int("slot", slot)
        return 0 <= slot < self._top and bool(self._mv_used[slot])

    def channel(self, slot: int):
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._channels[slot]
        return self._channels[self._slot(slot)]

    def close(self, slot: int) -> None:
        """Free the slot of a channel whose memberships are all removed; its channel is forgotten."""
        slot = self._slot(slot)
        if self._mv_nmem[slot]:
            raise ChannelTableError(f"slot {slot} still has {self._mv_nmem[slot]} memberships")
        # every state change first; the channel and token are released last (the locals): a channel's __del__
        # that re-enters the table then sees the slot free
        channel, token = self._channels[slot], self._armed_by[slot]
        del self._slot_of[channel]
        self._channels[slot] = None
        self._armed_by[slot] = None
        self._mv_used[slot] = 0
        self._mv_cid[slot] = -1
        self._mv_addr[slot] = 0
        self._mv_armed[slot] = 0
        self._mv_kinds[slot] = 0
        self._free.append(slot)
        del channel, token

    # ------------------------------------------------------------------------------------------------ columns
    def client(self, slot: int) -> tuple:
        """The slot's own ``(client id, language, version)``."""
        if not (type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]):
            slot = self._slot(slot)
        return self._mv_cid[slot], self._mv_lang[slot], self._mv_ver[slot]

    def set_client(self, slot: int, cid: int, language: int, version: int) -> None:
        slot = self._slot(slot)
        cid, language, version = (_as_int("client id", cid), _as_int("language", language),
                                  _as_int("version", version))
        if not -1 <= cid < 1 << 31:
            raise ChannelTableError(f"client id must be in [-1, 2**31), not {cid}")
        if not 0 <= language <= 255:
            raise ChannelTableError(f"language must be in [0, 255], not {language}")
        if not -(1 << 31) <= version < 1 << 31:
            raise ChannelTableError(f"version must fit in int32, not {version}")
        self._mv_cid[slot], self._mv_lang[slot], self._mv_ver[slot] = cid, language, version

    def addr(self, slot: int) -> int:
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._mv_addr[slot]
        return self._mv_addr[self._slot(slot)]

    def set_addr(self, slot: int, addr: int) -> None:
        slot = self._slot(slot)
        self._mv_addr[slot] = _int64("addr", addr)

    def last(self, slot: int) -> int:
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._mv_last[slot]
        return self._mv_last[self._slot(slot)]

    def oldest(self, slot: int) -> int:
        return self._mv_oldest[self._slot(slot)]

    def live(self, slot: int) -> bool:
        return bool(self._mv_live[self._slot(slot)])

    def nmem(self, slot: int) -> int:
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._mv_nmem[slot]
        return self._mv_nmem[self._slot(slot)]

    def kinds(self, slot: int) -> int:
        """Bit 0: the slot has a consumer membership, bit 1: a producer one."""
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._mv_kinds[slot]
        return self._mv_kinds[self._slot(slot)]

    def touch(self, slot: int, now: int) -> None:
        """Every membership of the slot refreshed at ``now`` (the fast path): own older times kept by
        :meth:`refresh` go (the registry never arms a slot that keeps any: refresh disarms when it keeps some)."""
        if not (type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]):
            slot = self._slot(slot)
        if not (type(now) is int and _I64_MIN <= now <= _I64_MAX):
            now = _int64("now", now)
        if self._lag and slot in self._lag:
            del self._lag[slot]
        self._mv_last[slot] = now
        t = now + self._fresh_off[self._mv_kinds[slot]]
        self._mv_oldest[slot] = t if _I64_MIN <= t <= _I64_MAX else self._sat(t)

    @staticmethod
    def _sat(v: int) -> int:
        return _I64_MAX if v > _I64_MAX else _I64_MIN if v < _I64_MIN else v

    # ------------------------------------------------------------------------------------------------ fast path
    def armed(self, slot: int) -> int:
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._mv_armed[slot]
        return self._mv_armed[self._slot(slot)]

    def fkey(self, slot: int) -> int:
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._mv_fkey[slot]
        return self._mv_fkey[self._slot(slot)]

    def armed_by(self, slot: int):
        if type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]:
            return self._armed_by[slot]
        return self._armed_by[self._slot(slot)]

    def arm(self, slot: int, fkey: int, by, armed: int) -> None:
        """Arm the fast path: the digest of the heartbeat it may repeat, its token object, the arming tick."""
        slot = self._slot(slot)
        fkey, armed = _int64("fkey", fkey), _int64("armed", armed)
        self._mv_fkey[slot] = fkey
        self._armed_by[slot] = by
        self._mv_armed[slot] = armed

    def disarm(self, slot: int) -> None:
        self._mv_armed[self._slot(slot)] = 0

    # ------------------------------------------------------------------------------------------------ memberships
    def _find(self, slot: int, key: int) -> int:
        base = slot * INLINE
        mkey = self._mv_mkey
        for i in range(min(self._mv_nmem[slot], INLINE)):
            if mkey[base + i] == key:
                return self._mv_mpos[base + i]
        over = self._overflow.get(slot)
        if over is not None:
            return over.get(key, -1)
        return -1

    def mem_pos(self, slot: int, key: int) -> int:
        """Position of ``slot`` in the member array of ``key``, or -1 when it is not a member."""
        # an int slot in use and a key in range skip the validators (which raise the errors for anything else)
        if not (type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]):
            slot = self._slot(slot)
        if not (type(key) is int and 0 <= key < 1 << 31):
            key = self._key(key)
        return self._find(slot, key)

    def mem_keys(self, slot: int) -> list:
        """The slot's membership keys: the inline ones in order, then the overflow ones."""
        slot = self._slot(slot)
        return self._keys(slot)

    def _keys(self, slot: int) -> list:
        n = self._mv_nmem[slot]
        base = slot * INLINE
        keys = [self._mv_mkey[base + i] for i in range(min(n, INLINE))]
        if n > INLINE:
            keys.extend(self._overflow[slot])
        return keys

    def add_member(self, slot: int, key: int) -> int:
        """Make ``slot`` a member of ``key`` (appended to its member array); returns its position. Disarms."""
        if not (type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]):
            slot = self._slot(slot)
        if not (type(key) is int and 0 <= key < 1 << 31):
            key = self._key(key)
        if self._find(slot, key) >= 0:
            raise ChannelTableError(f"slot {slot} is already a member of key {key}")
        n = self._mv_nmem[slot]
        if n >= _MAX_MEMBERSHIPS:
            raise ChannelTableError(f"slot {slot} has {n} memberships, the most a slot can hold")
        while len(self._members) <= key:
            self._members.append(None)
            self._msize.append(0)
        arr = self._members[key]
        pos = self._msize[key]
        if arr is None:
            arr = self._members[key] = np.empty(4, np.int32)
        elif pos == len(arr):
            grown = np.empty(2 * len(arr), np.int32)
            grown[:pos] = arr
            arr = self._members[key] = grown
        arr[pos] = slot
        self._msize[key] = pos + 1
        if n < INLINE:
            self._mv_mkey[slot * INLINE + n] = key
            self._mv_mpos[slot * INLINE + n] = pos
        else:
            self._overflow.setdefault(slot, {})[key] = pos
        # the new membership's time is the slot's last: the scan key takes it in
        t = self._sat(self._mv_last[slot] + (self.producer_shift if key & 1 else 0))
        if n == 0 or t < self._mv_oldest[slot]:
            self._mv_oldest[slot] = t
        self._mv_nmem[slot] = n + 1
        self._mv_live[slot] = 1
        self._mv_kinds[slot] |= 1 << (key & 1)
        self._mv_armed[slot] = 0
        self._memberships += 1
        return pos

    def _set_pos(self, slot: int, key: int, pos: int) -> None:
        base = slot * INLINE
        mkey = self._mv_mkey
        for i in range(min(self._mv_nmem[slot], INLINE)):
            if mkey[base + i] == key:
                self._mv_mpos[base + i] = pos
                return
        self._overflow[slot][key] = pos

    def remove_member(self, slot: int, key: int) -> int:
        """Remove ``slot`` from ``key`` (the last member of the array takes its place). Returns -2 when it was not a
        member, else the client id of the membership's own client info that went with it (the caller releases
        it), -1 when it had none. The membership's own time goes too; the slot is disarmed and its scan key
        recomputed (an emptied slot is no longer live)."""
        slot, key = self._slot(slot), self._key(key)
        pos = self._find(slot, key)
        if pos < 0:
            return -2
        arr = self._members[key]
        last = self._msize[key] - 1
        self._msize[key] = last
        if pos != last:
            moved = int(arr[last])
            arr[pos] = moved
            self._set_pos(moved, key, pos)
        if last == 0:  # an emptied key gives its array back, as the native table does
            self._members[key] = None
        n = self._mv_nmem[slot]
        base = slot * INLINE
        mkey, mpos = self._mv_mkey, self._mv_mpos
        inline = min(n, INLINE)
        for i in range(inline):
            if mkey[base + i] == key:
                for j in range(i, inline - 1):  # keep the inline keys compact and in order
                    mkey[base + j] = mkey[base + j + 1]
                    mpos[base + j] = mpos[base + j + 1]
                over = self._overflow.get(slot)
                if over:
                    k = next(iter(over))
                    mkey[base + inline - 1] = k
                    mpos[base + inline - 1] = over.pop(k)
                    if not over:
                        del self._overflow[slot]
                else:
                    mkey[base + inline - 1] = -1
                break
        else:
            over = self._overflow[slot]
            del over[key]
            if not over:
                del self._overflow[slot]
        n -= 1
        self._mv_nmem[slot] = n
        self._memberships -= 1
        self._mv_armed[slot] = 0
        kinds = 0
        for k in self._keys(slot):
            kinds |= 1 << (k & 1)
        self._mv_kinds[slot] = kinds
        lag = self._lag.get(slot)
        if lag is not None:
            lag.pop(key, None)
            if not lag:
                del self._lag[slot]
        released = -1
        info = self._info.get(slot)
        if info is not None and key in info:
            released = info.pop(key)[0]
            if not info:
                del self._info[slot]
        if n == 0:
            self._mv_live[slot] = 0
        elif slot not in self._lag:  # every membership at the slot's last: the scan key by kinds, no walk
            self._mv_oldest[slot] = self._sat(int(self._mv_last[slot]) + self._fresh_off[kinds & 3])
        else:
            self._recompute_oldest(slot)
        return released

    def _time(self, slot: int, key: int) -> int:
        lag = self._lag.get(slot)
        if lag is not None:
            t = lag.get(key)
            if t is not None:
                return t
        return self._mv_last[slot]

    def member_time(self, slot: int, key: int) -> int:
        """The membership's time: its own older time when a later heartbeat left it out, else the slot's last."""
        slot, key = self._slot(slot), self._key(key)
        if self._find(slot, key) < 0:
            raise ChannelTableError(f"slot {slot} is not a member of key {key}")
        return self._time(slot, key)

    def _recompute_oldest(self, slot: int) -> None:
        shift = self.producer_shift
        self._mv_oldest[slot] = self._sat(min(self._time(slot, k) + (shift if k & 1 else 0) for k in self._keys(slot)))

    def member_info(self, slot: int, key: int) -> tuple:
        """``(client id, language, version)`` of the membership: its own when set, else the slot's."""
        if not (type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]):
            slot = self._slot(slot)
        if not (type(key) is int and 0 <= key < 1 << 31):
            key = self._key(key)
        info = self._info.get(slot)
        if info is not None:
            t = info.get(key)
            if t is not None:
                return t
        return self._mv_cid[slot], self._mv_lang[slot], self._mv_ver[slot]

    def set_member_info(self, slot: int, key: int, cid: int, language: int, version: int) -> int:
        """Make the membership's client info ``(cid, language, version)``: kept as its own when it differs from the
        slot's, dropped when equal. Returns the client id of the own info it replaced (-1: none); the caller
        takes a reference on ``cid`` when it differs from the slot's and releases the returned one."""
        slot, key = self._slot(slot), self._key(key)
        cid, language, version = (_as_int("client id", cid), _as_int("language", language),
                                  _as_int("version", version))
        if self._find(slot, key) < 0:
            raise ChannelTableError(f"slot {slot} is not a member of key {key}")
        if not 0 <= cid < 1 << 31 or not 0 <= language <= 255 or not -(1 << 31) <= version < 1 << 31:
            raise ChannelTableError(f"bad client info ({cid}, {language}, {version})")
        info = self._info.get(slot)
        old = info.get(key) if info is not None else None
        released = -1 if old is None else old[0]
        if (cid, language, version) == (self._mv_cid[slot], self._mv_lang[slot], self._mv_ver[slot]):
            if old is not None:
                del info[key]
                if not info:
                    del self._info[slot]
            return released
        self._info.setdefault(slot, {})[key] = (cid, language, version)
        return released

    def info_cids(self, slot: int) -> list:
        """Client ids held by the slot's own membership infos (reference checks)."""
        return [t[0] for t in self._info.get(self._slot(slot), {}).values()]

    def refresh(self, slot: int, keys, now: int) -> int:
        """A heartbeat at ``now`` refreshed the memberships ``keys`` of the slot; the others keep their own older
        time. Returns 1 when it refreshed all of them and no own time was kept before, 2 when it refreshed all of
        them and dropped own times, 0 when some were left out (their own times are now kept; the slot is disarmed,
        so that a repeat of an earlier heartbeat that named them goes the full way and refreshes them)."""
        if not (type(slot) is int and 0 <= slot < self._top and self._mv_used[slot]):
            slot = self._slot(slot)
        if not (type(now) is int and _I64_MIN <= now <= _I64_MAX):
            now = _int64("now", now)
        checked = set()
        for k in keys:
            checked.add(k if type(k) is int and 0 <= k < 1 << 31 else self._key(k))
        keys = checked
        for k in keys:
            if self._find(slot, k) < 0:
                raise ChannelTableError(f"slot {slot} is not a member of key {k}")
        lag = self._lag.get(slot)
        if len(keys) == self._mv_nmem[slot]:
            self._mv_last[slot] = now
            self._mv_oldest[slot] = self._sat(now + self._fresh_off[self._mv_kinds[slot]])
            if lag is not None:
                del self._lag[slot]
                return 2
            return 1
        old_last = self._mv_last[slot]
        lag = self._lag.setdefault(slot, {})
        for key in self._keys(slot):
            if key in keys:
                lag.pop(key, None)
            elif key not in lag:
                lag[key] = old_last
        if not lag:
            del self._lag[slot]
        self._mv_last[slot] = now
        # the fast path repeats a heartbeat that covered every membership; it must not refresh the ones left out
        self._mv_armed[slot] = 0
        self._recompute_oldest(slot)
        return 0

    def lag_items(self, slot: int) -> list:
        """``(key, own time)`` of the slot's memberships that keep their own time (checks)."""
        return list(self._lag.get(self._slot(slot), {}).items())

    # ------------------------------------------------------------------------------------------------ groups
    def group_size(self, key: int) -> int:
        key = self._key(key)
        return self._msize[key] if key < len(self._msize) else 0

    def group_slots(self, key: int) -> list:
        """The member slots of ``key`` in member-array order."""
        key = self._key(key)
        if key >= len(self._msize) or not self._msize[key]:
            return []
        return self._members[key][:self._msize[key]].tolist()

    def group_channels(self, key: int) -> tuple:
        """The channels of the member slots of ``key`` in member-array order."""
        channels = self._channels
        return tuple([channels[s] for s in self.group_slots(key)])

    # ------------------------------------------------------------------------------------------------ client slots
    # ProducerManager's clientChannelTable: client id (pool id) -> the slot last registered for it, -1 when none. An
    # int32 column indexed by pool id, grown by doubling and never shrunk; the table keeps no pool reference and does
    # not clear an entry when its slot closes (the registry's rules do both)
    @property
    def memberships(self) -> int:
        """Memberships held by all slots (the registry's max_memberships budget)."""
        return self._memberships

    def client_slot(self, cid) -> int:
        """The clientChannelTable entry of pool id ``cid`` (any int): its slot, -1 when none."""
        cid = _as_int("client id", cid)
        return self._mv_cslot[cid] if 0 <= cid < len(self._cslot) else -1

    def set_client_slot(self, cid, slot) -> int:
        """Point the entry of pool id ``cid`` at ``slot`` (in use); returns the entry it replaced (-1: none, the
        caller then takes a pool reference for it)."""
        slot = self._slot(slot)
        cid = _as_int("client id", cid)
        if not 0 <= cid < 1 << 31:
            raise ChannelTableError(f"client id must be in [0, 2**31), not {cid}")
        if cid >= len(self._cslot):
            grown = np.full(max(cid + 1, 2 * len(self._cslot)), -1, np.int32)
            grown[:len(self._cslot)] = self._cslot
            self._cslot = grown
            self._mv_cslot = memoryview(grown)
        old = self._mv_cslot[cid]
        self._mv_cslot[cid] = slot
        return old

    def drop_client_slot(self, cid, only_slot=-1) -> bool:
        """Clear the entry of pool id ``cid`` (any int) when it has one and, with ``only_slot`` >= 0, it points at
        that slot; whether it was cleared (the caller then drops the entry's pool reference)."""
        cid, only_slot = _as_int("client id", cid), _as_int("slot", only_slot)
        if not 0 <= cid < len(self._cslot):
            return False
        cur = self._mv_cslot[cid]
        if cur >= 0 and (only_slot < 0 or cur == only_slot):
            self._mv_cslot[cid] = -1
            return True
        return False

    def client_slot_items(self) -> list:
        """``(pool id, slot)`` of every clientChannelTable entry, by pool id."""
        return [(int(i), int(self._cslot[i])) for i in np.flatnonzero(self._cslot >= 0)]

    def client_slots_nbytes(self) -> int:
        """Bytes of the clientChannelTable column (at its capacity; not in :meth:`nbytes`)."""
        return self._cslot.nbytes

    def client_slots_capacity(self) -> int:
        return len(self._cslot)

    # ------------------------------------------------------------------------------------------------ expiry
    def scan(self, now: int, timeout: int) -> list:
        """Live slots whose scan key is more than ``timeout`` ms before ``now`` (exact for any int64), ascending.
        The scan key saturates at the int64 ends, so a producer membership within ``producer_shift`` of them can be
        expired (``expired_keys``) and not found here; registry clocks (ms since an epoch) never come near."""
        now, timeout = _int64("now", now), _int64("timeout", timeout)
        if timeout < 0:
            raise ChannelTableError(f"timeout must be >= 0, not {timeout}")
        top = self._top
        lu = self._oldest[:top]
        with np.errstate(over="ignore"):
            distance = (np.int64(now) - lu).view(np.uint64)
        hit = (self._live[:top] != 0) & (lu < now) & (distance > np.uint64(timeout))
        return np.flatnonzero(hit).tolist()

    def expired_keys(self, slot: int, now: int, timeout: int, producer_timeout: int) -> list:
        """The slot's membership keys whose own time is more than their kind's timeout before ``now``."""
        slot = self._slot(slot)
        now = _int64("now", now)
        timeouts = (_int64("timeout", timeout), _int64("producer_timeout", producer_timeout))
        return [k for k in self._keys(slot) if now - self._time(slot, k) > timeouts[k & 1]]

    def columns(self) -> tuple:
        """Copies of the scan columns ``(oldest int64, live uint8)`` over the slots handed out (tests)."""
        return self._oldest[:self._top].copy(), self._live[:self._top].copy()

    # ------------------------------------------------------------------------------------------------ stats
    def __len__(self) -> int:
        return len(self._slot_of)

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def top(self) -> int:
        """Slots handed out so far (in use + free)."""
        return self._top

    def registered_count(self) -> int:
        """Slots with memberships."""
        return int(np.count_nonzero(self._live[:self._top]))

    def nbytes(self) -> int:
        """Bytes of this implementation's flat arrays: the numpy columns and member arrays (the free list and the
        channel -> slot dict are Python objects, not included). The native table also counts its free list and
        channel index, which are C arrays there, so the two differ by design."""
        total = sum(getattr(self, name).nbytes for name, _, _ in self._COLUMNS)
        return total + sum(a.nbytes for a in self._members if a is not None)

    def check(self) -> None:
        """Verify the table's invariants; raises AssertionError on the first violation."""
        assert len(self._slot_of) + len(self._free) == self._top, "slots leak"
        free = set(self._free)
        assert len(free) == len(self._free)
        for channel, slot in self._slot_of.items():
            assert self._channels[slot] is channel and slot not in free and self._mv_used[slot]
        for slot in free:
            assert self._channels[slot] is None and not self._mv_used[slot] and not self._mv_live[slot]
            assert not self._mv_nmem[slot] and not self._mv_armed[slot]
            assert slot not in self._lag and slot not in self._info and slot not in self._overflow
        count = [0] * len(self._msize)
        for slot in self._slot_of.values():
            keys = self._keys(slot)
            assert len(keys) == len(set(keys)) == self._mv_nmem[slot]
            assert bool(self._mv_live[slot]) == bool(keys)
            kinds = 0
            for k in keys:
                kinds |= 1 << (k & 1)
                pos = self._find(slot, k)
                assert 0 <= pos < self._msize[k] and self._members[k][pos] == slot
                count[k] += 1
            assert kinds == self._mv_kinds[slot]
            if keys:
                shift = self.producer_shift
                assert self._mv_oldest[slot] == self._sat(min(self._time(slot, k) + (shift if k & 1 else 0)
                                                              for k in keys))
            for k in self._lag.get(slot, {}):
                assert k in keys  # t may be after last: the registry's clock can go back
            for k in self._info.get(slot, {}):
                assert k in keys
            assert len(self._overflow.get(slot, ())) == max(0, len(keys) - INLINE)
        assert count == self._msize, "member arrays and memberships disagree"
        assert self._memberships == sum(self._msize), "membership count"

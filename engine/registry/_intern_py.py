"""Interning of the registry's per-client strings (client ids, remote addresses) into small integer ids.

A :class:`StringPool` keeps each distinct live string once, as UTF-8 in one byte arena, with an open-addressing
hash index over flat numpy arrays: about 30 bytes of bookkeeping per string plus its bytes, against ~170 for a
Python ``str`` held in a ``dict``. Ids are reference counted; an id whose count drops to zero is freed at once
(its index entry becomes a tombstone, its bytes arena garbage) and reused by the next new string, so ids of
departed clients do not accumulate: ``len(pool)`` is the number of strings currently referenced. The arena is
compacted and the index rebuilt when garbage or tombstones pass half of them.

Lookups compare the cached Python hash of the ``str`` first and the bytes only on a hash match, so interning a
known string costs one probe plus one comparison.
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = ["StringPool"]

_EMPTY = -1
_TOMBSTONE = -2


class StringPool:
    """Reference-counted string ids over flat arrays. Not thread-safe."""

    __slots__ = ("_arena", "_off", "_len", "_hash", "_refs", "_index", "_mv_off", "_mv_len", "_mv_hash", "_mv_refs",
                 "_mv_index", "_top", "_free", "_live", "_tombstones", "_garbage")

    def __init__(self, capacity: int = 64):
        capacity = max(16, int(capacity))
        self._arena = bytearray()
        self._top = 0  # ids handed out so far (high-water mark)
        self._free: list[int] = []  # freed ids, reused last-in first-out
        self._live = 0
        self._tombstones = 0
        self._garbage = 0  # arena bytes of freed strings
        self._alloc_ids(capacity)
        self._alloc_index(self._index_size(capacity))

    # -------------------------------------------------------------------------------------------------- storage
    def _alloc_ids(self, capacity: int) -> None:
        old = self._top
        off = np.zeros(capacity, np.uint32)  # the arena stays below 4 GiB (compacted at half garbage)
        length = np.full(capacity, -1, np.int32)
        hashes = np.zeros(capacity, np.int32)  # low 32 bits of the str hash: a filter before comparing bytes
        refs = np.zeros(capacity, np.int32)
        if old:
            off[:old] = self._off[:old]
            length[:old] = self._len[:old]
            hashes[:old] = self._hash[:old]
            refs[:old] = self._refs[:old]
        self._off, self._len, self._hash, self._refs = off, length, hashes, refs
        self._mv_off, self._mv_len = memoryview(off), memoryview(length)
        self._mv_hash, self._mv_refs = memoryview(hashes), memoryview(refs)

    @staticmethod
    def _index_size(n: int) -> int:
        """Power of two holding ``n`` entries at load <= 1/2."""
        return 1 << max(4, (2 * n - 1).bit_length())

    @staticmethod
    def _h32(h: int) -> int:
        h &= 0xFFFFFFFF
        return h - (1 << 32) if h >> 31 else h

    def _alloc_index(self, size: int) -> None:
        index = np.full(size, _EMPTY, np.int32)
        mask = size - 1
        hashes = self._mv_hash
        for i in range(self._top):
            if self._mv_len[i] >= 0:
                j = hashes[i] & mask
                while index[j] != _EMPTY:
                    j = (j + 1) & mask
                index[j] = i
        self._index = index
        self._mv_index = memoryview(index)
        self._tombstones = 0

    def _compact_arena(self) -> None:
        arena = bytearray()
        mv_off, mv_len = self._mv_off, self._mv_len
        old = self._arena
        for i in range(self._top):
            n = mv_len[i]
            if n >= 0:
                start = mv_off[i]
                mv_off[i] = len(arena)
                arena += old[start:start + n]
        self._arena = arena
        self._garbage = 0

    # -------------------------------------------------------------------------------------------------- lookup
    def _find(self, s: str, data: bytes, h: int) -> tuple[int, int]:
        """(id or -1, index position where ``s`` is or would be inserted)."""
        index = self._mv_index
        mask = len(index) - 1
        hashes, lengths, offsets, arena = self._mv_hash, self._mv_len, self._mv_off, self._arena
        n = len(data)
        h = self._h32(h)
        j = h & mask
        insert_at = -1
        while True:
            e = index[j]
            if e == _EMPTY:
                return -1, (insert_at if insert_at >= 0 else j)
            if e == _TOMBSTONE:
                if insert_at < 0:
                    insert_at = j
            elif hashes[e] == h and lengths[e] == n:
                start = offsets[e]
                if arena[start:start + n] == data:
                    return e, j
            j = (j + 1) & mask

    @staticmethod
    def _encode(s: str) -> bytes:
        if not isinstance(s, str):
            raise TypeError(f"a string pool holds str, not {type(s).__name__}")
        # lone surrogates cannot come from a valid UTF-8 body, but must never make interning fail; a str subclass is
        # encoded (and hashed, _str_hash) as a str
        return str.encode(s, "utf-8", "surrogatepass")

    @staticmethod
    def _str_hash(s: str) -> int:
        return hash(s) if type(s) is str else str.__hash__(s)

    def lookup(self, s: str) -> int:
        """The id of ``s``, or -1 if it is not interned (no reference taken)."""
        return self._find(s, self._encode(s), self._str_hash(s))[0]

    def intern(self, s: str) -> int:
        """The id of ``s``, interning it if needed; takes one reference."""
        data = self._encode(s)
        h = self._str_hash(s)
        e, j = self._find(s, data, h)
        if e >= 0:
            self._mv_refs[e] += 1
            return e
        if len(data) > 0x7FFFFFFF:  # a length is an int32
            raise MemoryError("string too long for the string pool (2 GiB)")
        if len(self._arena) + len(data) >= 1 << 32:  # before an id is taken: a refusal leaves no trace
            self._compact_arena()
            if len(self._arena) + len(data) >= 1 << 32:
                raise MemoryError("string pool arena is full (4 GiB)")
        if self._free:
            e = self._free.pop()
        else:
            if self._top == len(self._off):
                self._alloc_ids(len(self._off) * 2)
            e = self._top
            self._top += 1
        self._mv_off[e] = len(self._arena)
        self._arena += data
        self._mv_len[e] = len(data)
        self._mv_hash[e] = self._h32(h)
        self._mv_refs[e] = 1
        if self._mv_index[j] == _TOMBSTONE:
            self._tombstones -= 1
        self._mv_index[j] = e
        self._live += 1
        if (self._live + self._tombstones) * 10 > len(self._index) * 7:
            # rebuild at load <= 1/2 once live strings and tombstones fill 70 %: grows, and drops tombstones
            self._alloc_index(self._index_size(self._live))
        return e

    def _live_id(self, e: int) -> int:
        e = operator.index(e)
        if not 0 <= e < self._top or self._mv_refs[e] <= 0:
            raise KeyError(f"string id {e} is not live")
        return e

    def acquire(self, e: int) -> int:
        """Take one more reference on a live id; returns it."""
        e = self._live_id(e)
        self._mv_refs[e] += 1
        return e

    def release(self, e: int) -> None:
        """Drop one reference; the string is freed when none is left."""
        e = self._live_id(e)
        refs = self._mv_refs[e] - 1
        self._mv_refs[e] = refs
        if refs:
            return
        index = self._mv_index
        mask = len(index) - 1
        j = self._mv_hash[e] & mask
        while index[j] != e:
            j = (j + 1) & mask
        index[j] = _TOMBSTONE
        self._tombstones += 1
        self._garbage += self._mv_len[e]
        self._mv_len[e] = -1
        self._free.append(e)
        self._live -= 1
        if self._garbage > 4096 and self._garbage * 2 > len(self._arena):
            self._compact_arena()

    def get(self, e: int) -> str:
        """The string of a live id."""
        e = self._live_id(e)
        n = self._mv_len[e]
        start = self._mv_off[e]
        return self._arena[start:start + n].decode("utf-8", "surrogatepass")

    def refs(self, e: int) -> int:
        e = operator.index(e)
        return self._mv_refs[e] if 0 <= e < self._top else 0

    # -------------------------------------------------------------------------------------------------- stats
    def __len__(self) -> int:
        return self._live

    @property
    def high_water(self) -> int:
        """Ids handed out so far (live + free); bounded by the peak number of live strings."""
        return self._top

    def nbytes(self) -> int:
        """Bytes held by the arrays and the arena."""
        return (self._off.nbytes + self._len.nbytes + self._hash.nbytes + self._refs.nbytes + self._index.nbytes
                + len(self._arena))

    def check(self) -> None:
        """Verify the internal invariants (tests): every live id indexed once, refs positive, counts right."""
        live = [i for i in range(self._top) if self._mv_len[i] >= 0]
        assert len(live) == self._live, (len(live), self._live)
        assert all(self._mv_refs[i] > 0 for i in live)
        assert sorted(self._free) == sorted(i for i in range(self._top) if self._mv_len[i] < 0)
        indexed = [int(e) for e in self._index if e >= 0]
        assert sorted(indexed) == live
        assert int(np.sum(self._index == _TOMBSTONE)) == self._tombstones
        for i in live:
            s = self.get(i)
            assert self.lookup(s) == i

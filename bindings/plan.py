"""A recording cut into splits by its block headers, and the damage found on the way (``plan_splits``): what the
engine choice counts, what the Spark tasks read, what --strict checks. Pure Python (no Arrow): `rmqhb scan` of a
small recording plans it and scans it in this process without loading pyarrow; ``engine.bindings.segments`` keeps
these names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

from engine.recording.recorder import BlockInfo, Damage, damage_ranges, list_segments, payloads_intact, scan_segment

#: Bodies of one split must fit Arrow's int32 offsets; the planner also caps a split's raw bytes.
MAX_SPLIT_RAW_BYTES = 1 << 30
DEFAULT_SPLIT_RECORDS = 262_144


@dataclass(frozen=True)
class Split:
    """A contiguous run of blocks of one segment."""

    index: int
    path: str
    blocks: Tuple[BlockInfo, ...]
    n_records: int
    first_ms: int
    last_ms: int


@dataclass
class Plan:
    directory: str
    splits: List[Split] = field(default_factory=list)
    segments: int = 0
    torn_tails: List[Tuple[str, Damage]] = field(default_factory=list)
    corrupt: List[Tuple[str, Damage]] = field(default_factory=list)
    data_loss: List[dict] = field(default_factory=list)  # the segments' gap markers (Gap.to_dict)
    #: time ranges the damage covers (torn tails, corrupt ranges), as far as the good blocks around them tell:
    #: {"segment", "kind", "offset", "bytes", "first_ms", "last_ms", "records_lost" (None: unknown), "reason"}
    damaged: List[dict] = field(default_factory=list)

    @property
    def n_records(self) -> int:
        return sum(s.n_records for s in self.splits)

    def damage_summary(self) -> dict:
        return {"torn_tails": [d for d in self.damaged if d["kind"] == "torn_tail"],
                "corrupt": [d for d in self.damaged if d["kind"] == "corrupt"]}

    @property
    def is_damaged(self) -> bool:
        return bool(self.damaged or self.data_loss)


def plan_splits(directory, target_records: int = DEFAULT_SPLIT_RECORDS) -> Plan:
    """Cut a recording into splits by block headers; every block's payload CRC is checked here too (one read of
    the compressed bytes, no decompression), so a damaged block is named in the plan's damage and never reaches
    a task, where it could only be skipped silently. The tasks still check CRCs and decompression."""
    if target_records < 1:
        raise ValueError("target_records must be positive")
    plan = Plan(str(directory))
    segments = list_segments(directory)
    for k, path in enumerate(segments):
        plan.segments += 1
        scan = scan_segment(path)
        scan.corrupt = [_unquoted(d) for d in scan.corrupt]
        good = payloads_intact(path, scan.blocks)
        bad = [b for b in scan.blocks if b not in good]
        if scan.torn_tail is not None:
            plan.torn_tails.append((str(path), scan.torn_tail))
        plan.corrupt.extend((str(path), d) for d in scan.corrupt)
        plan.data_loss.extend(g.to_dict(path.name) for g in scan.gaps)
        plan.damaged.extend(damage_ranges(path, scan, good, bad, segments[k + 1] if k + 1 < len(segments) else None))
        cur: List[BlockInfo] = []
        n = raw = 0
        for b in good:
            if cur and (n + b.n_records > target_records or raw + b.raw_len > MAX_SPLIT_RAW_BYTES):
                plan.splits.append(_split(len(plan.splits), path, cur))
                cur, n, raw = [], 0, 0
            cur.append(b)
            n += b.n_records
            raw += b.raw_len
        if cur:
            plan.splits.append(_split(len(plan.splits), path, cur))
    return plan


def _unquoted(d: Damage) -> Damage:
    """A file that is not a segment is named by its size and reason, never by its bytes (a ``.seg`` linked to
    /etc/passwd must not copy its first bytes into findings.json and the report): the recorder's reason quotes
    them."""
    if d.reason.startswith("not a version-") and ": starts " in d.reason:
        return Damage(d.offset, d.length, d.reason.split(": starts ", 1)[0] + " (no segment file header; "
                                                                           f"{d.length:,} bytes not read)")
    return d


def _split(index, path, blocks) -> Split:
    return Split(index, str(path), tuple(blocks), sum(b.n_records for b in blocks),
                 min(b.first_ms for b in blocks), max(b.last_ms for b in blocks))

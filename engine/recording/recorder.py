"""Heartbeat recorder: append-only segment files of zstd-compressed, self-describing blocks.

A recording is a directory of segment files ``<prefix>-<first_ms>-<seq>.seg`` (names sort in time order).

Segment file layout (all integers little-endian)::

    file header   16 bytes   magic b"RMQHBSEG", u16 format version (1), u16 header size (16), u32 reserved (0)
    block*        40-byte block header + payload

    block header  magic b"HBK1" | u32 n_records | u32 raw_len | u32 comp_len | i64 first_ms | i64 last_ms
                  | u32 crc32(payload) | u32 crc32(the 36 header bytes before it)
    payload       exactly one zstd frame of raw_len bytes once decompressed

    gap marker    magic b"HBG1" | u32 records lost | u32 reason (1 write failed, 2 queue full) | u32 0
                  | i64 first_ms | i64 last_ms | u32 0 | u32 crc32(the 36 header bytes before it)   (no payload)

A gap marker says that the recorder lost records (receive times first_ms..last_ms) because its writes failed or
its queue was full; it is written before the next block once the disk takes writes again. Readers report it as
data loss, never as silence of the clients (added in format version 1 without a version bump: a reader from before
the marker sees 40 bytes it cannot parse, i.e. damage, which is what the loss is; every segment without a marker
reads as before).

The decompressed block is columnar, so a reader turns it into numpy / Arrow columns without a per-record loop::

    recv_ms i64[n] | conn_id i64[n] | version i32[n] | addr_off i32[n+1] | body_off i32[n+1] | language u8[n]
    | address bytes (addr_off[n]) | body bytes (body_off[n])

(``first_ms``/``last_ms`` are the min/max receive time in the block, for pruning; ``language`` is the
LanguageCode ordinal, 255 when unknown.) Each block is written with one ``write`` call on an unbuffered file, so
a process killed at any point leaves every completed block intact; what a crash can leave is a *torn tail*
(a short header, a short payload, or garbage after the last good block), which readers report and skip. Damage
followed by a good block is *corruption in the middle*: `verify` flags it, readers raise or skip it on request.
Both header and payload carry CRC32s, and a reader resynchronises on the next block magic whose header CRC holds.

With ``background=True`` (the broker's recorder) compression and writes run on the recorder's own thread behind a
bounded queue: recording never blocks the event loop and never fails a heartbeat. A failed write or a full queue
drops that block's records (counted in ``dropped``, logged at most once a minute per reason), the recorder backs
off (1 s doubling to 30 s) and resumes when writes succeed again, writing a gap marker for what was lost.

A *clipped record* keeps a heartbeat's time, connection and address but only the first bytes of its body, with the
body's size and the reason (see :func:`clip_body`): the broker's recorder clips a body it could not decode (a client
sending 15 MB of garbage costs the recording ~1 KB), and, in background mode, a body that would take its
connection past its share of the bytes waiting for the writer (``connection_share_bytes``: one connection cannot
take the queue) or the bytes of all connections past ``queue_bytes`` (from 3/4 of it on, a connection at or
above the average of what waits is clipped first, past 7/8 its records are dropped and marked as a gap: many
connections cannot take the queue either). Its body starts with :data:`CLIPPED_MAGIC`, a NUL byte no heartbeat (JSON) starts with, so a
reader from before it reads an undecodable body (what it is); the scans name it as clipped (:func:`parse_clipped`),
not as damage.
"""
from __future__ import annotations

import argparse
import logging
import mmap
import os
import queue
import re
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, List, NamedTuple, Optional, Sequence

import numpy as np
import zstandard

from engine.codec.enums import LanguageCode
from engine.codec.errors import RemotingError, echo
from engine.logutil import RateLimitedLog

log = logging.getLogger(__name__)

FILE_MAGIC = b"RMQHBSEG"
FORMAT_VERSION = 1
FILE_HEADER = struct.Struct("<8sHHI")
FILE_HEADER_SIZE = FILE_HEADER.size  # 16
BLOCK_MAGIC = b"HBK1"
GAP_MAGIC = b"HBG1"
GAP_REASONS = {1: "write_failed", 2: "queue_full"}
#: A clipped record's body: magic | u32 the body's size | u16 reason length | reason (UTF-8) | the body's first bytes
CLIPPED_MAGIC = b"\x00HBCLIP1"
_CLIPPED_HEAD = struct.Struct("<8sIH")
#: bytes of a clipped body kept (recordClippedBodyBytes' default)
CLIPPED_BODY_BYTES = 1024
#: most reason bytes kept in a clipped record
MAX_CLIP_REASON = 200
BLOCK_HEADER = struct.Struct("<4sIIIqqII")
BLOCK_HEADER_SIZE = BLOCK_HEADER.size  # 40
_HEADER_CRC_SPAN = BLOCK_HEADER_SIZE - 4
#: Fixed bytes per record in a decompressed block (recv_ms, conn_id, version, two offsets, language) ...
RECORD_FIXED_BYTES = 8 + 8 + 4 + 4 + 4 + 1
#: ... plus the two extra trailing offsets.
BLOCK_FIXED_BYTES = 8
#: Bounds that keep int32 offsets and one block's memory sane; a header claiming more is corrupt.
MAX_BLOCK_RAW_BYTES = 256 * 1024 * 1024
MAX_BLOCK_RECORDS = 1 << 22
UNKNOWN_LANGUAGE = 255
SEGMENT_SUFFIX = ".seg"
_SEGMENT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<first>\d+)-(?P<seq>\d+)\.seg$")


class SegmentError(RemotingError, ValueError):
    """A segment file or block is malformed; the message names the file and the byte offset."""


class Record(NamedTuple):
    """One recorded heartbeat, as the broker received it."""

    recv_ms: int
    conn_id: int
    remote_addr: str
    language: Optional[LanguageCode]
    version: int
    body: bytes


@dataclass(frozen=True)
class BlockInfo:
    """Where a block is (offset of its header) and what its header says."""

    offset: int
    n_records: int
    raw_len: int
    comp_len: int
    first_ms: int
    last_ms: int
    payload_crc: int

    @property
    def end(self) -> int:
        return self.offset + BLOCK_HEADER_SIZE + self.comp_len


@dataclass(frozen=True)
class Damage:
    """A byte range a reader had to skip: [offset, offset + length)."""

    offset: int
    length: int
    reason: str


@dataclass(frozen=True)
class Gap:
    """A gap marker: the recorder lost ``records_lost`` records received between first_ms and last_ms."""

    offset: int
    records_lost: int
    first_ms: int
    last_ms: int
    reason: str

    def to_dict(self, segment: str) -> dict:
        return {"segment": segment, "offset": self.offset, "records_lost": self.records_lost,
                "first_ms": self.first_ms, "last_ms": self.last_ms, "reason": self.reason}


@dataclass
class SegmentScan:
    """The result of walking one segment: its good blocks, a torn tail (if any) and corruption in the middle."""

    path: Path
    size: int
    blocks: List[BlockInfo] = field(default_factory=list)
    torn_tail: Optional[Damage] = None
    corrupt: List[Damage] = field(default_factory=list)
    gaps: List[Gap] = field(default_factory=list)
    #: records the recorder clipped, by the kind of reason (``undecodable``, ``connection share``, ``queue bytes``):
    #: counted when the payloads are checked (``check_payload``)
    clipped: Counter = field(default_factory=Counter)

    @property
    def n_records(self) -> int:
        return sum(b.n_records for b in self.blocks)


# ---------------------------------------------------------------------------------------------------------------
# Block encoding


def _language_ordinal(language) -> int:
    if language is None:
        return UNKNOWN_LANGUAGE
    if isinstance(language, str):
        member = LanguageCode.__members__.get(language)
        return UNKNOWN_LANGUAGE if member is None else int(member)
    value = int(language)
    return value if 0 <= value < UNKNOWN_LANGUAGE else UNKNOWN_LANGUAGE


def _offsets(lengths: np.ndarray, what: str) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    if out[-1] > MAX_BLOCK_RAW_BYTES:
        raise ValueError(f"block too large: {what} total {int(out[-1])} bytes > {MAX_BLOCK_RAW_BYTES}")
    return out.astype("<i4")


def encode_block_payload(recv_ms, conn_id, version, language, addrs: Sequence[bytes], bodies: Sequence[bytes]) -> bytes:
    """The uncompressed columnar payload of one block (see the module docstring)."""
    n = len(bodies)
    if not (len(recv_ms) == len(conn_id) == len(version) == len(language) == len(addrs) == n):
        raise ValueError("record columns differ in length")
    if n == 0 or n > MAX_BLOCK_RECORDS:
        raise ValueError(f"a block holds 1..{MAX_BLOCK_RECORDS} records, got {n}")
    addr_off = _offsets(np.fromiter(map(len, addrs), dtype=np.int64, count=n), "addresses")
    body_off = _offsets(np.fromiter(map(len, bodies), dtype=np.int64, count=n), "bodies")
    return b"".join(
        (
            np.ascontiguousarray(recv_ms, dtype="<i8").tobytes(),
            np.ascontiguousarray(conn_id, dtype="<i8").tobytes(),
            np.ascontiguousarray(version, dtype="<i4").tobytes(),
            addr_off.tobytes(),
            body_off.tobytes(),
            np.ascontiguousarray(language, dtype=np.uint8).tobytes(),
            b"".join(addrs),
            b"".join(bodies),
        )
    )


def encode_block(raw: bytes, n_records: int, first_ms: int, last_ms: int, compressor) -> bytes:
    """Header + one zstd frame for an encoded payload."""
    if len(raw) > MAX_BLOCK_RAW_BYTES:
        raise ValueError(f"block too large: {len(raw)} bytes > {MAX_BLOCK_RAW_BYTES}")
    payload = compressor.compress(raw)
    head = struct.pack("<4sIIIqq", BLOCK_MAGIC, n_records, len(raw), len(payload), first_ms, last_ms)
    head += struct.pack("<I", zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


class Clipped(NamedTuple):
    """What a clipped record says about the body it replaced."""

    size: int
    reason: str
    head: bytes


def clip_body(body, reason: str, keep: int = CLIPPED_BODY_BYTES) -> bytes:
    """The body of a clipped record: ``body``'s size (bytes past 4 GiB counted as 0xFFFFFFFF), the reason, and
    its first ``keep`` bytes."""
    why = reason.encode("utf-8", "replace")[:MAX_CLIP_REASON]
    return _CLIPPED_HEAD.pack(CLIPPED_MAGIC, min(len(body), 0xFFFFFFFF), len(why)) + why + bytes(body[: max(0, keep)])


def parse_clipped(body) -> Optional[Clipped]:
    """The clipped record's size, reason and kept bytes, or None when ``body`` is not a clipped record's."""
    if len(body) < _CLIPPED_HEAD.size or bytes(body[:8]) != CLIPPED_MAGIC:
        return None
    _, size, n = _CLIPPED_HEAD.unpack_from(body, 0)
    start = _CLIPPED_HEAD.size
    return Clipped(size, bytes(body[start : start + n]).decode("utf-8", "replace"), bytes(body[start + n :]))


def encode_gap(records_lost: int, first_ms: int, last_ms: int, reason: str) -> bytes:
    """A gap marker (see the module docstring)."""
    code = next(c for c, r in GAP_REASONS.items() if r == reason)
    head = struct.pack("<4sIIIqqI", GAP_MAGIC, min(records_lost, 0xFFFFFFFF), code, 0, first_ms, last_ms, 0)
    return head + struct.pack("<I", zlib.crc32(head))


def _parse_gap(buf, offset: int) -> Optional[Gap]:
    magic, n, code, zero, first_ms, last_ms, zero2, header_crc = BLOCK_HEADER.unpack_from(buf, offset)
    if magic != GAP_MAGIC or zlib.crc32(buf[offset : offset + _HEADER_CRC_SPAN]) != header_crc:
        return None
    return Gap(offset, n, first_ms, last_ms, GAP_REASONS.get(code, f"reason {code}"))


def _parse_block_header(buf, offset: int) -> Optional[BlockInfo]:
    """The block header at offset, or None when its magic or CRC or its bounds are wrong."""
    magic, n, raw_len, comp_len, first_ms, last_ms, payload_crc, header_crc = BLOCK_HEADER.unpack_from(buf, offset)
    if magic != BLOCK_MAGIC:
        return None
    if zlib.crc32(buf[offset : offset + _HEADER_CRC_SPAN]) != header_crc:
        return None
    if not (0 < n <= MAX_BLOCK_RECORDS and raw_len <= MAX_BLOCK_RAW_BYTES and n * RECORD_FIXED_BYTES + BLOCK_FIXED_BYTES <= raw_len):
        return None
    return BlockInfo(offset, n, raw_len, comp_len, first_ms, last_ms, payload_crc)


# ---------------------------------------------------------------------------------------------------------------
# Decoded blocks


class Block:
    """One decoded block: numpy columns plus the address and body byte regions with their int32 offsets.

    ``body_offsets``/``body_data`` (and the address pair) are exactly an Arrow BinaryArray's offsets and data
    buffers, so a reader can hand them to Arrow without copying.
    """

    __slots__ = ("recv_ms", "conn_id", "version", "language", "addr_offsets", "addr_data", "body_offsets", "body_data", "raw")

    def __init__(self, raw: bytes, n: int, where: str):
        fixed = n * RECORD_FIXED_BYTES + BLOCK_FIXED_BYTES
        if len(raw) < fixed:
            raise SegmentError(f"{where}: block of {n} records needs {fixed} bytes, payload has {len(raw)}")
        pos = 0
        self.raw = raw
        self.recv_ms = np.frombuffer(raw, "<i8", n, pos)
        pos += 8 * n
        self.conn_id = np.frombuffer(raw, "<i8", n, pos)
        pos += 8 * n
        self.version = np.frombuffer(raw, "<i4", n, pos)
        pos += 4 * n
        self.addr_offsets = np.frombuffer(raw, "<i4", n + 1, pos)
        pos += 4 * (n + 1)
        self.body_offsets = np.frombuffer(raw, "<i4", n + 1, pos)
        pos += 4 * (n + 1)
        self.language = np.frombuffer(raw, np.uint8, n, pos)
        pos += n
        for name, off in (("address", self.addr_offsets), ("body", self.body_offsets)):
            if off[0] != 0 or (n and np.any(off[1:] < off[:-1])):
                raise SegmentError(f"{where}: {name} offsets are not ascending from 0")
        addr_len = int(self.addr_offsets[-1])
        body_len = int(self.body_offsets[-1])
        if pos + addr_len + body_len != len(raw):
            raise SegmentError(
                f"{where}: columns need {pos + addr_len + body_len} bytes, payload has {len(raw)}"
            )
        mv = memoryview(raw)
        self.addr_data = mv[pos : pos + addr_len]
        self.body_data = mv[pos + addr_len :]

    def __len__(self) -> int:
        return len(self.recv_ms)

    def bodies(self) -> List[bytes]:
        """Each record's body as its own bytes object."""
        data = bytes(self.body_data)
        off = self.body_offsets.tolist()
        return [data[off[i] : off[i + 1]] for i in range(len(off) - 1)]

    def remote_addrs(self) -> List[str]:
        data = bytes(self.addr_data)
        off = self.addr_offsets.tolist()
        cache = {}
        out = []
        for i in range(len(off) - 1):
            raw = data[off[i] : off[i + 1]]
            text = cache.get(raw)
            if text is None:
                text = cache[raw] = raw.decode("utf-8", "replace")
            out.append(text)
        return out

    def records(self) -> List[Record]:
        langs = [LanguageCode(x) if x in LanguageCode._value2member_map_ else None for x in self.language.tolist()]
        return [
            Record(t, c, a, lang, v, b)
            for t, c, a, lang, v, b in zip(
                self.recv_ms.tolist(), self.conn_id.tolist(), self.remote_addrs(), langs, self.version.tolist(), self.bodies()
            )
        ]


_DECOMPRESSOR = zstandard.ZstdDecompressor()


def decode_block(info: BlockInfo, payload, where: str, check_crc: bool = True) -> Block:
    """Check the payload CRC, decompress the zstd frame, and validate the columnar layout."""
    block = Block(decompress_payload(info, payload, where, check_crc), info.n_records, where)
    if len(block) and (int(block.recv_ms.min()) != info.first_ms or int(block.recv_ms.max()) != info.last_ms):
        raise SegmentError(f"{where}: receive times disagree with the block header")
    return block


def decompress_payload(info: BlockInfo, payload, where: str, check_crc: bool = True) -> bytes:
    """Check the payload CRC and decompress the zstd frame to exactly ``raw_len`` bytes (the columnar layout is
    not checked here: Block, or engine.recording._segment.BlockScanner, does that)."""
    if len(payload) != info.comp_len:
        raise SegmentError(f"{where}: payload truncated ({len(payload)} of {info.comp_len} bytes)")
    if check_crc and zlib.crc32(payload) != info.payload_crc:
        raise SegmentError(f"{where}: payload CRC mismatch")
    try:
        params = zstandard.get_frame_parameters(payload)
        if params.content_size != info.raw_len:
            raise SegmentError(f"{where}: zstd frame declares {params.content_size} bytes, header says {info.raw_len}")
        raw = _DECOMPRESSOR.decompress(payload, max_output_size=info.raw_len)
    except zstandard.ZstdError as exc:
        raise SegmentError(f"{where}: zstd: {exc}; payload starts {echo(bytes(payload[:16]))}") from None
    if len(raw) != info.raw_len:
        raise SegmentError(f"{where}: decompressed {len(raw)} bytes, header says {info.raw_len}")
    return raw


def iter_payloads(path, blocks: Iterable[BlockInfo]) -> Iterator[tuple]:
    """(block info, compressed payload, where) of the given blocks of one segment, read in file order."""
    path = Path(path)
    with open(path, "rb") as f:
        for info in blocks:
            f.seek(info.offset + BLOCK_HEADER_SIZE)
            yield info, f.read(info.comp_len), f"{path}@{info.offset}"


# ---------------------------------------------------------------------------------------------------------------
# Walking a segment


def _find_next_block(buf, start: int, size: int) -> Optional[BlockInfo]:
    """Resynchronise: the next offset >= start holding a block header with a valid CRC that fits in the file."""
    pos = start
    while True:
        pos = buf.find(BLOCK_MAGIC, pos, size)
        if pos < 0 or pos + BLOCK_HEADER_SIZE > size:
            return None
        info = _parse_block_header(buf, pos)
        if info is not None and info.end <= size:
            return info
        pos += 1


def scan_segment(path, *, check_payload: bool = False) -> SegmentScan:
    """Walk a segment's block headers (and, with check_payload, decompress and validate every block).

    Never raises for damaged content: damage is reported in the result (``torn_tail`` for anything after the
    last good block, ``corrupt`` for damage followed by a good block). Raises OSError if the file can't be read.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        scan = SegmentScan(path, size)
        if size < FILE_HEADER_SIZE:
            if size:
                scan.torn_tail = Damage(0, size, "file header truncated")
            return scan
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            magic, version, header_size, _ = FILE_HEADER.unpack_from(buf, 0)
            if magic != FILE_MAGIC or version != FORMAT_VERSION or header_size != FILE_HEADER_SIZE:
                # named by its size and reason only: a .seg linked to another file (/etc/passwd) is not quoted
                scan.corrupt.append(Damage(0, size, f"not a version-{FORMAT_VERSION} segment (no segment file header; "
                                                    f"{size:,} bytes not read)"))
                return scan
            pos = FILE_HEADER_SIZE
            pending: Optional[Damage] = None  # damage not yet known to be in the middle
            while pos < size:
                info = None
                reason = None
                if size - pos < BLOCK_HEADER_SIZE:
                    reason = "block header truncated"
                elif buf[pos : pos + 4] == GAP_MAGIC and (gap := _parse_gap(buf, pos)) is not None:
                    scan.gaps.append(gap)
                    pos += BLOCK_HEADER_SIZE
                    continue
                else:
                    info = _parse_block_header(buf, pos)
                    if info is None:
                        reason = "bad block header (magic, CRC or bounds)"
                    elif info.end > size:
                        reason = f"block payload truncated ({size - pos - BLOCK_HEADER_SIZE} of {info.comp_len} bytes)"
                        info = None
                    elif check_payload:
                        try:
                            _count_clipped(decode_block(info, buf[pos + BLOCK_HEADER_SIZE : info.end],
                                                        f"{path.name}@{pos}"), scan.clipped)
                        except SegmentError as exc:
                            reason = str(exc).split(": ", 1)[-1]
                            info = None
                if info is not None:
                    scan.blocks.append(info)
                    pos = info.end
                    continue
                start = pos + 1
                if scan.blocks and not check_payload and scan.blocks[-1].end == pos:
                    # the previous block was only header-checked: its payload may be what got shortened or
                    # lengthened, so the next real header can sit inside it; look from its payload on
                    start = scan.blocks[-1].offset + BLOCK_HEADER_SIZE
                nxt = _find_next_block(buf, start, size)
                while nxt is not None and check_payload:
                    try:
                        decode_block(nxt, buf[nxt.offset + BLOCK_HEADER_SIZE : nxt.end], f"{path.name}@{nxt.offset}")
                        break
                    except SegmentError:
                        nxt = _find_next_block(buf, nxt.offset + 1, size)
                if nxt is not None and nxt.offset < pos:
                    prev = scan.blocks.pop()  # overlapped by a later header: its payload cannot be intact
                    pos, reason = prev.offset, "block overlaps the next block header"
                if nxt is None:
                    pending = Damage(pos, size - pos, reason)
                    break
                scan.corrupt.append(Damage(pos, nxt.offset - pos, reason))
                pos = nxt.offset
            scan.torn_tail = pending
    return scan


def _count_clipped(block: Block, counts: Counter) -> None:
    """Count the block's clipped records by the kind of their reason (the text before its ':', as the scans do).
    Only records whose body starts with a NUL byte (never a heartbeat's JSON) are parsed."""
    starts = block.body_offsets[:-1]
    lengths = block.body_offsets[1:] - starts
    data = np.frombuffer(block.body_data, np.uint8)
    candidates = starts[lengths >= _CLIPPED_HEAD.size]
    for start in candidates[data[candidates] == 0].tolist():
        c = parse_clipped(block.body_data[start : start + _CLIPPED_HEAD.size + MAX_CLIP_REASON])
        if c is not None:
            counts[c.reason.split(":", 1)[0]] += 1


def payloads_intact(path, blocks) -> List[BlockInfo]:
    """The blocks whose compressed payload matches its header's CRC32."""
    out = []
    with open(path, "rb") as f:
        for b in blocks:
            f.seek(b.offset + BLOCK_HEADER_SIZE)
            if zlib.crc32(f.read(b.comp_len)) == b.payload_crc:
                out.append(b)
    return out


def damage_ranges(path, scan, good, bad, next_segment) -> List[dict]:
    """Each damaged range of a segment with the time span it covers: exact for a block whose payload failed its
    CRC (its header holds), else between the good blocks around it (records lost unknown)."""
    name = Path(path).name
    out = [{"segment": name, "kind": "corrupt", "offset": b.offset, "bytes": BLOCK_HEADER_SIZE + b.comp_len,
            "first_ms": b.first_ms, "last_ms": b.last_ms, "records_lost": b.n_records,
            "reason": "payload CRC mismatch"} for b in bad]

    def around(offset):
        before = [b for b in good if b.offset < offset]
        after = [b for b in good if b.offset > offset]
        first = max(b.last_ms for b in before) if before else (min(b.first_ms for b in after) if after else None)
        last = min(b.first_ms for b in after) if after else None
        return first, last

    for d in scan.corrupt:
        first, last = around(d.offset)
        out.append({"segment": name, "kind": "corrupt", "offset": d.offset, "bytes": d.length, "first_ms": first,
                    "last_ms": last if last is not None else first, "records_lost": None, "reason": d.reason})
    if scan.torn_tail is not None:
        d = scan.torn_tail
        first, _ = around(d.offset)
        last = None
        if next_segment is not None:  # the tail lost what came before the next segment's first block
            nxt = scan_segment(next_segment).blocks
            last = nxt[0].first_ms if nxt else None
        out.append({"segment": name, "kind": "torn_tail", "offset": d.offset, "bytes": d.length, "first_ms": first,
                    "last_ms": last if last is not None else first, "records_lost": None, "reason": d.reason})
    return sorted(out, key=lambda x: x["offset"])


def iter_blocks(path, *, blocks: Optional[Iterable[BlockInfo]] = None, on_corrupt: str = "raise") -> Iterator[Block]:
    """Decoded blocks of one segment in file order.

    ``blocks`` restricts reading to those block headers (a split planned with scan_segment); otherwise the
    segment is walked. A torn tail is logged and skipped. Damage in the middle raises SegmentError when
    on_corrupt="raise", or is logged and skipped with on_corrupt="skip".
    """
    if on_corrupt not in ("raise", "skip"):
        raise ValueError("on_corrupt must be 'raise' or 'skip'")
    path = Path(path)
    if blocks is None:
        scan = scan_segment(path)
        if scan.corrupt:
            d = scan.corrupt[0]
            msg = f"{path}: corrupt at byte {d.offset} ({d.length} bytes): {d.reason}"
            if on_corrupt == "raise":
                raise SegmentError(msg)
            log.warning("skipping %s", msg)
        if scan.torn_tail is not None:
            t = scan.torn_tail
            log.warning("%s: torn tail at byte %d (%d bytes, %s), skipped", path, t.offset, t.length, t.reason)
        blocks = scan.blocks
    with open(path, "rb") as f:
        for info in blocks:
            f.seek(info.offset + BLOCK_HEADER_SIZE)
            payload = f.read(info.comp_len)
            try:
                yield decode_block(info, payload, f"{path}@{info.offset}")
            except SegmentError:
                if on_corrupt == "raise":
                    raise
                log.warning("skipping corrupt block %s@%d", path, info.offset, exc_info=True)


def list_segments(directory) -> List[Path]:
    """Segment files of a recording directory, in name (= time) order; a segment file given instead of its
    directory is the recording of that one file (`rmqhb scan x.seg`)."""
    directory = Path(directory)
    if directory.name.endswith(SEGMENT_SUFFIX) and directory.is_file():
        return [directory]
    if not directory.is_dir():
        raise FileNotFoundError(f"no recording directory {directory}")

    def key(p: Path):
        m = _SEGMENT_NAME.match(p.name)
        return (int(m["first"]), int(m["seq"]), p.name) if m else (0, 0, p.name)

    return sorted((p for p in directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX) and p.is_file()), key=key)


def read_segment(path, *, on_corrupt: str = "raise") -> List[Record]:
    """Every readable record of one segment (torn tail skipped with a warning)."""
    out: List[Record] = []
    for block in iter_blocks(path, on_corrupt=on_corrupt):
        out.extend(block.records())
    return out


def iter_records(directory, *, on_corrupt: str = "raise") -> Iterator[Record]:
    """Every readable record of a recording directory, segment by segment."""
    for path in list_segments(directory):
        for block in iter_blocks(path, on_corrupt=on_corrupt):
            yield from block.records()


# ---------------------------------------------------------------------------------------------------------------
# Writer


class HeartbeatRecorder:
    """Append heartbeats to segment files in ``directory``.

    Records are buffered in memory and written one block (one zstd frame) at a time: when ``block_records``
    records or ``block_bytes`` body bytes are pending, on ``flush()``/``close()``, and (checked on each record)
    when the oldest pending record waited ``max_block_delay_s`` of wall time. A server should also call
    ``flush_if_due()`` from a timer so a quiet period does not hold records back.

    A segment rolls before a block that would take it past ``max_segment_bytes``, or when the block's newest
    receive time is ``max_segment_age_s`` or more after the segment's first (record time, so a synthetic
    recording rolls like a live one). ``fsync=True`` makes each written block durable against power loss; a
    killed process never loses a completed block either way. Call it from one thread.

    ``background=True``: blocks are compressed and written by the recorder's own thread, through a queue of at
    most ``queue_blocks`` blocks; nothing the disk does reaches the caller (see the module docstring). ``flush()``
    then waits until what was queued is written (or dropped); ``close()`` waits at most ``close_timeout_s``.
    Each connection then has a share of the body bytes waiting (pending and queued): a record that would take
    its connection past ``connection_share_bytes`` is recorded clipped (``clipped["connection_share"]``), so one
    connection cannot fill the queue and make the others' records drop. All connections together have
    ``queue_bytes`` (``clipped["queue_bytes"]`` past it): N connections have N shares, so the queue's bytes are
    bounded by this budget, not by N; once 3/4 of it waits, a record that would take its connection to or above
    the average of the connections waiting is clipped, and past 7/8 dropped (``dropped["queue_bytes"]``, a gap
    marker in the recording), so a flood of connections is clipped and dropped before the others.

    ``record(..., error=REASON)``: a body the broker could not decode is recorded clipped to
    ``clipped_body_bytes`` (with its size and the reason; ``clipped["undecodable"]``).
    """

    def __init__(
        self,
        directory,
        max_segment_bytes: int = 256 * 1024 * 1024,
        max_segment_age_s: float = 3600.0,
        block_records: int = 4096,
        *,
        block_bytes: int = 4 * 1024 * 1024,
        max_block_delay_s: float = 1.0,
        level: int = 3,
        fsync: bool = False,
        prefix: str = "hb",
        background: bool = False,
        queue_blocks: int = 64,
        close_timeout_s: float = 30.0,
        connection_share_bytes: int = 16 * 1024 * 1024,
        clipped_body_bytes: int = CLIPPED_BODY_BYTES,
        queue_bytes: int = 256 * 1024 * 1024,
    ):
        if max_segment_bytes < FILE_HEADER_SIZE + BLOCK_HEADER_SIZE:
            raise ValueError("max_segment_bytes too small")
        if not (1 <= block_records <= MAX_BLOCK_RECORDS):
            raise ValueError(f"block_records must be in 1..{MAX_BLOCK_RECORDS}")
        if max_segment_age_s <= 0 or block_bytes <= 0:
            raise ValueError("max_segment_age_s and block_bytes must be positive")
        if connection_share_bytes < 0 or clipped_body_bytes < 0 or queue_bytes < 0:
            raise ValueError("connection_share_bytes, clipped_body_bytes and queue_bytes must be >= 0")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError("prefix may hold letters, digits, '_' and '.' only")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_segment_bytes = int(max_segment_bytes)
        self.max_segment_age_ms = int(max_segment_age_s * 1000)
        self.block_records = int(block_records)
        self.block_bytes = int(block_bytes)
        self.max_block_delay_s = max_block_delay_s
        self.fsync = fsync
        self.prefix = prefix
        self._compressor = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
        self._file = None
        self._segment_path: Optional[Path] = None
        self._segment_size = 0
        self._segment_first_ms = 0
        self._seq = 0
        self._addr_cache: dict = {}
        self.connection_share_bytes = int(connection_share_bytes)
        self.clipped_body_bytes = int(clipped_body_bytes)
        self.queue_bytes = int(queue_bytes)
        #: reason -> records recorded clipped (undecodable, connection_share, queue_bytes)
        self.clipped: Counter = Counter()
        #: connection -> body bytes waiting for the writer (pending and queued; background mode), and their sum,
        #: under _share_lock
        self._waiting: dict = {}
        self.waiting_bytes = 0
        self._share_lock = threading.Lock()
        self._reset_pending()
        self.closed = False
        #: Totals since construction.
        self.records_written = 0
        self.blocks_written = 0
        self.segments_opened = 0
        self.bytes_written = 0
        #: reason -> records dropped (write_failed, queue_full, closed)
        self.dropped: Counter = Counter()
        self.gaps_written = 0
        self._loss: Optional[list] = None  # [records, first_ms, last_ms, reason] lost since the last good write
        self._loss_lock = threading.Lock()
        self._retry_at = 0.0
        self._backoff_s = 0.0
        self._log = RateLimitedLog(log)
        self.close_timeout_s = close_timeout_s
        self._queue: Optional[queue.Queue] = None
        self._thread: Optional[threading.Thread] = None
        if background:
            if queue_blocks < 1:
                raise ValueError("queue_blocks must be positive")
            self._queue = queue.Queue(maxsize=queue_blocks)
            self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
            self._thread.start()

    # -- pending block --
    def _reset_pending(self):
        self._p_recv: list = []
        self._p_conn: list = []
        self._p_addr: list = []
        self._p_lang: list = []
        self._p_ver: list = []
        self._p_body: list = []
        self._p_bytes = 0
        self._p_since = 0.0
        self._p_share: dict = {}  # connection -> body bytes of the pending block

    def record(self, recv_ms: int, conn_id: int, remote_addr, language, version: int, body,
               error: Optional[str] = None) -> None:
        """Buffer one heartbeat (receive time in ms, connection id, 'ip:port', LanguageCode/ordinal/name/None,
        MQVersion ordinal, raw body bytes). ``error``: why the body could not be decoded; it is recorded clipped."""
        if self.closed:
            if self._queue is not None:  # the broker's recorder: a late heartbeat is dropped, never an error
                self.dropped["closed"] += 1
                return
            raise ValueError("recorder is closed")
        if not self._p_body:
            self._p_since = time.monotonic()
        addr = self._addr_cache.get(remote_addr)
        if addr is None:
            addr = remote_addr.encode("utf-8") if isinstance(remote_addr, str) else bytes(remote_addr or b"")
            if len(self._addr_cache) > 65536:
                self._addr_cache.clear()
            self._addr_cache[remote_addr] = addr
        if body is None:
            body = b""
        if error is not None:
            body = clip_body(body, f"undecodable: {error}", self.clipped_body_bytes)
            self.clipped["undecodable"] += 1
            if self._queue is not None:
                self._charge(conn_id, len(body))  # released with its block as every record's
        elif self._queue is not None:
            body = self._within_share(conn_id, body, recv_ms)
            if body is None:
                return
        else:
            body = bytes(body)
        if self._queue is not None:
            self._p_share[conn_id] = self._p_share.get(conn_id, 0) + len(body)
        self._p_recv.append(recv_ms)
        self._p_conn.append(conn_id)
        self._p_addr.append(addr)
        self._p_lang.append(_language_ordinal(language))
        self._p_ver.append(version)
        self._p_body.append(body)
        self._p_bytes += len(body)
        if (
            len(self._p_body) >= self.block_records
            or self._p_bytes >= self.block_bytes
            or time.monotonic() - self._p_since >= self.max_block_delay_s
        ):
            self._write_pending()

    def _within_share(self, conn_id: int, body, recv_ms: int) -> Optional[bytes]:
        """``body``, its clipped record, or None (dropped: counted, and marked as a gap in the recording).

        Clipped: past its connection's connection_share_bytes; past queue_bytes for all connections; from 3/4 of
        queue_bytes on, when its connection is at or above the connections' average of what waits. A clipped
        record of such a connection that would take what waits past 7/8 of queue_bytes is dropped instead, so
        the last eighth stays for the connections below the average (a good client among a flood of
        connections); theirs keep their size and reason only past queue_bytes."""
        n = len(body)
        budget = self.queue_bytes
        with self._share_lock:
            waiting, total = self._waiting.get(conn_id, 0), self.waiting_bytes
            k = len(self._waiting) + (conn_id not in self._waiting)  # connections waiting, this one included
            above = (waiting + n) * k >= total + n  # at or above their average once this record waits
            why = None
            if waiting + n > self.connection_share_bytes:
                kind, why = "connection_share", (f"connection share: {waiting} bytes waiting, share "
                                                 f"{self.connection_share_bytes}")
            elif total + n > budget or (above and 4 * (total + n) > 3 * budget):
                kind, why = "queue_bytes", f"queue bytes: {total} bytes waiting, budget {budget}"
                if above:
                    why += f", connection above the average {(total + n) // k}"
            if why is None:
                self._waiting[conn_id] = waiting + n
                self.waiting_bytes = total + n
                return bytes(body)
        keep = self.clipped_body_bytes
        head = _CLIPPED_HEAD.size + min(len(why), MAX_CLIP_REASON)  # the reason is ASCII
        if above and 4 * (total + n) > 3 * budget:
            if 8 * (total + head) > 7 * budget:
                with self._loss_lock:  # the writer thread merges losses too
                    self.dropped["queue_bytes"] += 1
                    self._merge_loss([1, recv_ms, recv_ms, "queue_full"])
                self._log.log(logging.WARNING, "queue_bytes_drop", "recorder: a heartbeat of %d bytes from "
                              "connection %d dropped (%s): %d dropped so far", n, conn_id, why,
                              self.dropped["queue_bytes"])
                return None
            if 8 * (total + head + keep) > 7 * budget:
                keep = 0
        elif total + head + keep > budget:
            keep = 0  # the budget is spent: its size and reason only
        self.clipped[kind] += 1
        self._log.log(logging.WARNING, kind, "recorder: a heartbeat of %d bytes from connection %d recorded "
                      "clipped (%s)", n, conn_id, why)
        clipped = clip_body(body, why, keep)
        self._charge(conn_id, len(clipped))
        return clipped

    def _charge(self, conn_id: int, n: int) -> None:
        with self._share_lock:
            self._waiting[conn_id] = self._waiting.get(conn_id, 0) + n
            self.waiting_bytes += n

    def _release(self, share: dict) -> None:
        """The writer is done with a block (written or dropped): its connections' bytes no longer wait."""
        if not share:
            return
        with self._share_lock:
            for conn_id, n in share.items():
                left = self._waiting.get(conn_id, 0) - n
                self.waiting_bytes -= n + min(0, left)
                if left > 0:
                    self._waiting[conn_id] = left
                else:
                    self._waiting.pop(conn_id, None)

    def record_batch(self, recv_ms, conn_id, remote_addrs: Sequence[bytes], language, version, bodies: Sequence[bytes]) -> None:
        """Write many records at once (columns: numpy arrays or sequences; addresses as bytes). Pending
        single records are written first, so the order is kept. Used by the synthetic generator."""
        if self.closed:
            raise ValueError("recorder is closed")
        self._write_pending()
        recv_ms = np.asarray(recv_ms, dtype=np.int64)
        conn_id = np.asarray(conn_id, dtype=np.int64)
        language = np.asarray(language, dtype=np.uint8)
        version = np.asarray(version, dtype=np.int32)
        n = len(bodies)
        if not (len(recv_ms) == len(conn_id) == len(language) == len(version) == len(remote_addrs) == n):
            raise ValueError("record columns differ in length")
        start = 0
        while start < n:
            stop = min(n, start + self.block_records)
            # keep blocks under block_bytes too (a few huge bodies must not make one huge block)
            nbytes = 0
            for i in range(start, stop):
                nbytes += len(bodies[i])
                if nbytes >= self.block_bytes:
                    stop = i + 1
                    break
            self._submit((
                recv_ms[start:stop], conn_id[start:stop], version[start:stop], language[start:stop],
                remote_addrs[start:stop], bodies[start:stop],
            ))
            start = stop

    def flush_if_due(self) -> bool:
        """Write the pending block if its oldest record waited max_block_delay_s; True if something was written."""
        if self._p_body and time.monotonic() - self._p_since >= self.max_block_delay_s:
            self._write_pending()
            return True
        return False

    def flush(self) -> None:
        """Write the pending block (if any) to the operating system (and to disk with fsync=True); in background
        mode, wait until every queued block is written or dropped."""
        self._write_pending()
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._write_pending()
        finally:
            self.closed = True
            if self._thread is not None:
                # the writer drains the queue, then stops; a disk that hangs cannot hold shutdown forever
                try:
                    self._queue.put(None, timeout=self.close_timeout_s)
                except queue.Full:
                    pass
                self._thread.join(self.close_timeout_s)
                if self._thread.is_alive():
                    log.error("recorder: writes still pending after %.0f s at close; leaving them", self.close_timeout_s)
                    return
            self._close_segment()

    @property
    def queued_blocks(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def segment_path(self) -> Optional[Path]:
        """The segment being written, if one is open."""
        return self._segment_path

    def _write_pending(self):
        if not self._p_body:
            return
        try:
            self._submit((
                np.array(self._p_recv, dtype=np.int64), np.array(self._p_conn, dtype=np.int64),
                np.array(self._p_ver, dtype=np.int32), np.array(self._p_lang, dtype=np.uint8),
                self._p_addr, self._p_body, self._p_share,
            ))
        finally:
            self._reset_pending()

    def _submit(self, cols) -> None:
        """Write a block now (foreground) or hand it to the writer thread; a full queue drops it."""
        if self._queue is None:
            self._write_block(*cols[:6])
            return
        try:
            self._queue.put_nowait(cols)
        except queue.Full:
            self._lost(cols, "queue_full")
            self._release(cols[6] if len(cols) > 6 else None)

    # -- the writer thread (background mode) --
    def _run(self) -> None:
        q = self._queue
        while True:
            cols = q.get()
            try:
                if cols is None:
                    return
                if time.monotonic() < self._retry_at:
                    self._lost(cols, "write_failed")  # backing off after a failure
                    continue
                try:
                    if self._loss is not None:
                        self._write_gap()
                    self._write_block(*cols[:6])
                    self._backoff_s = 0.0
                except OSError as e:
                    self._lost(cols, "write_failed", e)
                    self._backoff_s = min(30.0, max(1.0, self._backoff_s * 2))
                    self._retry_at = time.monotonic() + self._backoff_s
                    try:  # the next attempt starts a new segment: this one may end in a torn block
                        self._close_segment()
                    except OSError:
                        self._file = None
                        self._segment_path = None
                except Exception:  # a bug must not stop the writer: the block is lost, said once a minute
                    self._lost(cols, "write_failed")
                    self._log.log(logging.ERROR, "bug", "recorder: writing a block failed", exc_info=True)
            finally:
                if cols is not None:
                    self._release(cols[6] if len(cols) > 6 else None)
                q.task_done()

    def _lost(self, cols, reason: str, error: Optional[BaseException] = None) -> None:
        recv_ms, bodies = cols[0], cols[5]
        n, first, last = len(bodies), int(np.min(recv_ms)), int(np.max(recv_ms))
        with self._loss_lock:  # the loop (queue full) and the writer (write failed) both record losses
            self.dropped[reason] += n
            self._merge_loss([n, first, last, reason])
        self._log.log(logging.WARNING, reason, "recorder: %d records dropped (%s%s); %d dropped so far",
                      n, reason, f": {error}" if error else "", sum(self.dropped.values()))

    def _merge_loss(self, loss: list) -> None:
        if self._loss is None:
            self._loss = loss
        else:
            cur = self._loss
            cur[0] += loss[0]
            cur[1], cur[2] = min(cur[1], loss[1]), max(cur[2], loss[2])

    def _write_gap(self) -> None:
        with self._loss_lock:
            loss, self._loss = self._loss, None
        n, first, last, reason = loss
        try:
            data = encode_gap(n, first, last, reason)
            if self._file is None:
                self._open_segment(first)
            self._write_all(data)
        except OSError:
            with self._loss_lock:
                self._merge_loss(loss)
            raise
        self._segment_size += len(data)
        self.gaps_written += 1
        log.warning("recorder: writing again; %d records lost between %d and %d ms (%s), marked in %s",
                    n, first, last, reason, self._segment_path)

    def _write_block(self, recv_ms, conn_id, version, language, addrs, bodies):
        first_ms = int(recv_ms.min())
        last_ms = int(recv_ms.max())
        raw = encode_block_payload(recv_ms, conn_id, version, language, addrs, bodies)
        data = encode_block(raw, len(bodies), first_ms, last_ms, self._compressor)
        if self._file is not None and (
            (self._segment_size + len(data) > self.max_segment_bytes and self._segment_size > FILE_HEADER_SIZE)
            or last_ms - self._segment_first_ms >= self.max_segment_age_ms
        ):
            self._close_segment()
        if self._file is None:
            self._open_segment(first_ms)
        self._write_all(data)
        self._segment_size += len(data)
        self.records_written += len(bodies)
        self.blocks_written += 1
        if self.fsync:
            os.fsync(self._file.fileno())

    def _write_all(self, data: bytes):
        view = memoryview(data)
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError(f"short write to {self._segment_path}")
            self.bytes_written += n
            view = view[n:]

    def _open_segment(self, first_ms: int):
        while True:
            self._seq += 1
            path = self.directory / f"{self.prefix}-{max(first_ms, 0):013d}-{self._seq:06d}{SEGMENT_SUFFIX}"
            try:
                # unbuffered: each block goes to the OS in one write, so a killed process loses no complete block
                self._file = open(path, "xb", buffering=0)
                break
            except FileExistsError:
                continue
        self._segment_path = path
        self._segment_first_ms = first_ms
        self._segment_size = 0
        self.segments_opened += 1
        self._write_all(FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, FILE_HEADER_SIZE, 0))
        self._segment_size = FILE_HEADER_SIZE
        if self.fsync:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _close_segment(self):
        if self._file is not None:
            try:
                if self.fsync:
                    os.fsync(self._file.fileno())
            finally:
                self._file.close()
                self._file = None
                self._segment_path = None


# ---------------------------------------------------------------------------------------------------------------
# verify


@dataclass
class VerifyReport:
    """What `verify` found in a recording directory."""

    directory: Path
    segments: List[SegmentScan] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(s.n_records for s in self.segments)

    @property
    def blocks(self) -> int:
        return sum(len(s.blocks) for s in self.segments)

    @property
    def torn_tails(self) -> List[SegmentScan]:
        return [s for s in self.segments if s.torn_tail is not None]

    @property
    def corrupt(self) -> List[SegmentScan]:
        return [s for s in self.segments if s.corrupt]

    @property
    def clipped(self) -> Counter:
        """Records the recorder clipped (kept their time, connection, address, size and reason), by reason kind."""
        return sum((s.clipped for s in self.segments), Counter())

    @property
    def data_loss(self) -> List[tuple]:
        """(segment, Gap) for every gap marker: records the recorder lost (failed writes, a full queue)."""
        return [(s, g) for s in self.segments for g in s.gaps]

    @property
    def ok(self) -> bool:
        """True unless some segment is damaged in the middle (torn tails are expected after a crash; gap
        markers are recorded losses, reported apart)."""
        return not self.corrupt

    def to_dict(self) -> dict:
        return {
            "directory": str(self.directory),
            "ok": self.ok,
            "segments": len(self.segments),
            "blocks": self.blocks,
            "records": self.records,
            "torn_tails": [
                {"segment": s.path.name, "offset": s.torn_tail.offset, "bytes": s.torn_tail.length, "reason": s.torn_tail.reason}
                for s in self.torn_tails
            ],
            "corrupt": [
                {"segment": s.path.name, "offset": d.offset, "bytes": d.length, "reason": d.reason}
                for s in self.corrupt
                for d in s.corrupt
            ],
            "data_loss": [g.to_dict(s.path.name) for s, g in self.data_loss],
            "clipped": dict(sorted(self.clipped.items())),
        }

    def format(self, verbose: bool = False) -> str:
        lines = []
        if verbose:
            for s in self.segments:
                span = ""
                if s.blocks:
                    span = f"  {min(b.first_ms for b in s.blocks)}..{max(b.last_ms for b in s.blocks)} ms"
                lines.append(f"{s.path.name}: {s.size} bytes, {len(s.blocks)} blocks, {s.n_records} records{span}")
        for s in self.torn_tails:
            t = s.torn_tail
            lines.append(f"TORN TAIL {s.path.name} at byte {t.offset}: {t.length} bytes skipped ({t.reason})")
        for s in self.corrupt:
            for d in s.corrupt:
                lines.append(f"CORRUPT {s.path.name} at byte {d.offset}: {d.length} bytes ({d.reason})")
        for s, g in self.data_loss:
            lines.append(f"DATA LOSS {s.path.name} at byte {g.offset}: {g.records_lost} records received between "
                         f"{g.first_ms} and {g.last_ms} ms were not recorded ({g.reason})")
        clipped = self.clipped
        if clipped:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(clipped.items()))
            lines.append(f"CLIPPED {sum(clipped.values())} records clipped by the recorder ({kinds}): their time, "
                         f"connection, address, size and reason kept, not their whole body")
        status = "OK" if self.ok else "CORRUPT"
        lost = sum(g.records_lost for _, g in self.data_loss)
        lines.append(
            f"{status}: {len(self.segments)} segments, {self.blocks} blocks, {self.records} records, "
            f"{len(self.torn_tails)} torn tails, {sum(len(s.corrupt) for s in self.segments)} corrupt ranges, "
            f"{len(self.data_loss)} data-loss markers ({lost} records lost), {sum(clipped.values())} clipped records"
        )
        return "\n".join(lines)


def verify(directory) -> VerifyReport:
    """Walk every segment of a recording, decompressing and validating every block."""
    report = VerifyReport(Path(directory))
    for path in list_segments(directory):
        report.segments.append(scan_segment(path, check_payload=True))
    return report


def segments_verify_main(argv=None) -> int:
    """`rmqhb segments verify DIR`: check a recording. Exit 0 when readable (torn tails are reported but
    expected after a crash), 1 when a segment is damaged in the middle, 2 when DIR is not a directory."""
    p = argparse.ArgumentParser(prog="rmqhb segments verify", description=segments_verify_main.__doc__)
    p.add_argument("directory", type=Path)
    p.add_argument("-v", "--verbose", action="store_true", help="one line per segment")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if not args.directory.is_dir():
        print(f"not a directory: {args.directory}", file=sys.stderr)
        return 2
    report = verify(args.directory)
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format(verbose=args.verbose))
    return 0 if report.ok else 1

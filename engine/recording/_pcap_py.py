"""Pure-Python twin of ``engine.recording._pcap``: RocketMQ remoting traffic from packet captures (pcap, pcapng).

The readable reference; the Cython module follows it step by step and must give the same records, events,
losses, statistics and errors for every input (tests/test_pcap_parity.py).

``CaptureDecoder`` takes capture files as bytes (``feed`` as much as is at hand, ``end_file`` at each file's end,
``finish`` at the end of the input) and keeps its TCP state across files, so rotated files of one capture are fed
one after the other. Per packet: the link layer (Ethernet with VLAN tags, Linux cooked SLL and SLL2, raw IP, BSD
loopback), IPv4 / IPv6 (extension headers skipped; fragments counted, not reassembled), TCP. Per connection (the
4-tuple; a new SYN after a close starts a new connection) and direction:

* **Reassembly** by sequence number: in-order data is appended; a segment wholly before the next expected byte is
  a retransmission (counted, dropped); one that overlaps it gives its new tail; a segment past it waits (out of
  order, counted) until the hole before it fills. A hole still open after ``reorder_window_ms`` of capture time,
  with more than ``max_pending_bytes`` waiting, at the connection's end or at the end of the input is *lost*: the
  capture missed those bytes (``holes``, ``hole_bytes``; its time range goes to ``losses``).
* **Frames**: length prefix, header word, header (``engine.decode_frame``). After a loss the frame the hole cut
  is dropped (``frames_cut``) and reading resumes at the *next plausible frame boundary*: the end of the cut frame
  when its length prefix was seen, else the first offset whose length prefix, header word and whole header
  decode (``resyncs``); every received byte not read as a frame on the way is counted (``discarded_bytes``). A
  connection whose start was not captured is read the same way from its first byte. A length prefix or header
  word that cannot be a frame (bigger than ``max_frame_size``, header longer than the frame) also starts a
  search (``bad_lengths``); a frame whose header does not decode is counted (``frames_bad``) and skipped.
* **Records**: every HEART_BEAT (34) request becomes the record the broker's recorder writes: receive time = the
  time of the packet that completed the frame (ms), connection id (a 63-bit FNV-1a hash of the 4-tuple and
  the connection's generation), the sender's ``ip:port``, the header's language (ordinal, 255 unknown) and
  version, the raw body.
* **Events**: UNREGISTER_CLIENT (35) requests (clientID, producer / consumer group), the broker's
  NOTIFY_CONSUMER_IDS_CHANGED (40) pushes (consumer group), connection opens (SYN) and ends (the first FIN or
  RST of a connection, and who sent it).

A capture file that is not pcap / pcapng or whose record structure is broken raises ``CaptureError`` (a
``RemotingError`` and ``ValueError``) naming the byte offset; what was read before it stays.

**Budgets** (a capture from elsewhere is untrusted: whatever it says, memory is bounded and the work linear; what
a budget leaves unread is counted, and ``damage_times`` holds the time range of each kind, so the scan names it):

* a packet stamped outside ``[min_time_ms, max_time_ms]`` (default 2000-01-01 to now + 1 day) is not read
  (``bad_time_packets``): its time is damage, not an event;
* a packet stamped more than ``max_time_jump_ms`` (default 1 day) before or after the packet read before it in the
  same file is a *time jump* (one packet stamped three years after the others would stretch the capture's span and
  make every client's heartbeats look stopped): it is not read (``time_jump_packets``) unless ``TIME_JUMP_AGREE``
  consecutive packets agree on the new time (within ``max_time_jump_ms`` of each other), as after a clock step or
  a capture silent for more than a day: the packet that makes them agree is read and becomes the file's time, the
  ones before it stay damage. A capture file is monotonic up to small reordering, so it never trips this but
  after a silence of more than a day (its first ``TIME_JUMP_AGREE - 1`` packets after it are named as damage);
* a frame of more than ``max_record_bytes`` is not buffered: its header is read (``MAX_HEADER_BYTES`` at most) and
  its bytes passed; a HEART_BEAT, UNREGISTER_CLIENT or NOTIFY that large is counted (``records_too_large``), not
  read; a resynchronisation candidate's header is read only up to ``SEARCH_HEADER_BYTES`` (each candidate costs a
  bounded decode, so a search is linear);
* at most ``max_pending_segments`` segments wait behind a hole (as ``max_pending_bytes``: past it the hole is
  lost); the waiting segments are kept in heaps, so reordering costs O(log n) per segment;
* at most ``max_connections`` connections are kept (closed ones included): past it the one touched least recently
  is dropped; an open one is closed out as at the end of the input (``connections_evicted``: its later packets
  start a new, midstream connection);
* all connections' buffered bytes (partial frames and waiting segments) together at most ``max_buffered_bytes``:
  past it the directions holding the most are emptied until half of it is left (``buffers_shed``,
  ``buffer_shed_bytes``; their holes are lost and their cut frames counted, as after a loss).
"""
from __future__ import annotations

import heapq
import socket
import struct
import time
from collections import OrderedDict

import numpy as np

from engine.codec.enums import DEFAULT_MAX_FRAME_SIZE, LanguageCode
from engine.codec.errors import FrameError, RemotingError

__all__ = ["CaptureDecoder", "CaptureError", "STAT_NAMES", "EVENT_KINDS", "conn_hash", "DEFAULT_REORDER_WINDOW_MS",
           "DEFAULT_MAX_PENDING_BYTES", "MAX_PACKET_BYTES", "DEFAULT_MAX_PENDING_SEGMENTS", "DEFAULT_MAX_RECORD_BYTES",
           "DEFAULT_MAX_CONNECTIONS", "DEFAULT_MAX_BUFFERED_BYTES", "MIN_TIME_MS", "MAX_TIME_AHEAD_MS",
           "MAX_TIME_JUMP_MS", "TIME_JUMP_AGREE",
           "MAX_HEADER_BYTES", "SEARCH_HEADER_BYTES", "DAMAGE_KINDS", "MAX_INTERFACES"]


class CaptureError(RemotingError, ValueError):
    """A capture file is not pcap / pcapng, or its record structure is broken (the message names the offset)."""


#: a hole in a direction's byte stream is declared lost once the bytes after it waited this long (capture time)
DEFAULT_REORDER_WINDOW_MS = 2000
#: ... or once this many bytes wait behind it
DEFAULT_MAX_PENDING_BYTES = 4 << 20
#: a pcap record or pcapng block larger than this is taken for damage
MAX_PACKET_BYTES = 16 << 20
#: ... or once this many segments wait behind it
DEFAULT_MAX_PENDING_SEGMENTS = 4096
#: a frame larger than this is not buffered (a heartbeat, unregister or notify that large is not read)
DEFAULT_MAX_RECORD_BYTES = 4 << 20
#: connections kept at once (closed ones included); past it the least recently touched one is dropped
DEFAULT_MAX_CONNECTIONS = 100_000
#: partial frames and waiting segments of all connections together
DEFAULT_MAX_BUFFERED_BYTES = 256 << 20
#: packets stamped before this (2000-01-01 UTC) or more than MAX_TIME_AHEAD_MS after the reader's start are damage
MIN_TIME_MS = 946_684_800_000
MAX_TIME_AHEAD_MS = 86_400_000
#: a packet stamped this much before or after the previous packet of its file is a time jump (damage) ...
MAX_TIME_JUMP_MS = 86_400_000
#: ... unless this many consecutive packets agree on the new time (a clock step, a silence of more than a day)
TIME_JUMP_AGREE = 4
#: the longest header read of a frame too large to buffer; the longest a resynchronisation candidate may have
MAX_HEADER_BYTES = 64 << 10
SEARCH_HEADER_BYTES = 4096
#: pcapng interfaces per section (each interface block is kept: a file of them would grow the list without end)
MAX_INTERFACES = 4096
#: the budgets' damage, each with the time range it covers (CaptureDecoder.damage_times)
DAMAGE_KINDS = ("records_too_large", "connections_evicted", "buffers_shed")

STAT_NAMES = (
    "files", "packets", "tcp_packets", "non_tcp_packets", "unsupported_link_packets", "ip_fragments",
    "truncated_packets", "malformed_packets", "filtered_packets", "connections", "midstream_connections",
    "segments_retransmitted", "bytes_retransmitted", "segments_out_of_order", "packets_after_close",
    "holes", "hole_bytes", "frames_cut", "discarded_bytes", "resyncs", "bad_lengths", "frames",
    "frames_bad", "heartbeats", "unregisters", "notifies", "tail_bytes", "truncated_file_tails",
    "bad_time_packets", "records_too_large", "connections_evicted", "buffers_shed", "buffer_shed_bytes",
    "time_jump_packets",
)
EVENT_KINDS = ("open", "fin", "rst", "unregister", "notify")

_LANG_BY_ORDINAL = {int(m): m for m in LanguageCode}
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = (1 << 64) - 1

# link types
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

_SEARCH_NO, _SEARCH_YES, _SEARCH_MORE = 0, 1, 2


def conn_hash(key: bytes, generation: int) -> int:
    """Connection id: FNV-1a 64 over the canonical 4-tuple key and the generation byte, top bit cleared."""
    h = _FNV_OFFSET
    for b in key:
        h = ((h ^ b) * _FNV_PRIME) & _M64
    for b in generation.to_bytes(4, "little"):
        h = ((h ^ b) * _FNV_PRIME) & _M64
    return h & 0x7FFFFFFFFFFFFFFF


def _language_ordinal(language) -> int:
    return 255 if language is None else int(language)


class _Dir:
    """One direction of a connection: reassembly and framing state."""

    __slots__ = ("init", "nxt", "buf", "sync", "skip_to", "passing", "pending", "keys", "data_keys", "times",
                 "pending_bytes", "hole_since", "last_ms", "searching_after_loss")

    def __init__(self):
        self.init = False
        self.nxt = 0
        self.buf = bytearray()
        self.sync = False
        self.skip_to = -1
        self.passing = False  # the bytes up to skip_to are a frame read by its header (not discarded)
        self.pending = {}  # abs seq -> (data, ms)
        # heaps over pending: its keys, its keys with data, (ms, key) (entries of replaced segments are stale)
        self.keys, self.data_keys, self.times = [], [], []
        self.pending_bytes = 0
        self.hole_since = -1
        self.last_ms = -1
        self.searching_after_loss = False


class _Flow:
    __slots__ = ("key", "conn_id", "gen", "addr", "dirs", "client", "syn_isn", "closed", "fin", "ended", "data_seen",
                 "touched", "placed")

    def __init__(self, key, conn_id, gen, addr_a, addr_b, tick):
        self.key = key
        self.conn_id = conn_id
        self.gen = gen
        self.touched = self.placed = tick  # the packet count at its last packet, and when it took its dict place
        self.addr = (addr_a, addr_b)
        self.dirs = (_Dir(), _Dir())
        self.client = -1  # side index of the client (0 = A, 1 = B), -1 unknown
        self.syn_isn = -1
        self.closed = False
        self.fin = [False, False]
        self.ended = False
        self.data_seen = False


def _addr_text(family, ip: bytes, port: int) -> str:
    # what the broker's asyncio transport reports (peername), as the recorder writes it: "ip:port"
    return f"{socket.inet_ntop(family, ip)}:{port}"


class CaptureDecoder:
    """Capture files -> heartbeat records, events, losses (see the module docstring)."""

    def __init__(self, ports=None, max_frame_size=DEFAULT_MAX_FRAME_SIZE,
                 reorder_window_ms=DEFAULT_REORDER_WINDOW_MS, max_pending_bytes=DEFAULT_MAX_PENDING_BYTES,
                 shard=(1, 0), max_pending_segments=DEFAULT_MAX_PENDING_SEGMENTS,
                 max_record_bytes=DEFAULT_MAX_RECORD_BYTES, max_connections=DEFAULT_MAX_CONNECTIONS,
                 max_buffered_bytes=DEFAULT_MAX_BUFFERED_BYTES, min_time_ms=MIN_TIME_MS, max_time_ms=None,
                 max_time_jump_ms=MAX_TIME_JUMP_MS):
        """``shard=(n, i)``: read only the connections whose 4-tuple hashes to i modulo n (n readers of one
        capture split its connections between them; packet-level statistics are the same in each). The budgets:
        see the module docstring (``max_time_ms`` None: now + MAX_TIME_AHEAD_MS)."""
        import engine

        n, i = (int(x) for x in shard)
        if not (n >= 1 and 0 <= i < n):
            raise ValueError("shard must be (n, i) with n >= 1 and 0 <= i < n")
        self.shard = (n, i)
        self._decode_frame = engine.decode_frame
        self.ports = frozenset(int(p) for p in ports) if ports else None
        if max_frame_size < 12 or reorder_window_ms < 0 or max_pending_bytes < 0:
            raise ValueError("max_frame_size >= 12, reorder_window_ms >= 0 and max_pending_bytes >= 0 required")
        self.max_frame_size = int(max_frame_size)
        self.reorder_window_ms = int(reorder_window_ms)
        self.max_pending_bytes = int(max_pending_bytes)
        self.max_pending_segments = int(max_pending_segments)
        self.max_record_bytes = int(max_record_bytes)
        self.max_connections = int(max_connections)
        self.max_buffered_bytes = int(max_buffered_bytes)
        self.min_time_ms = int(min_time_ms)
        self.max_time_ms = int(time.time() * 1000) + MAX_TIME_AHEAD_MS if max_time_ms is None else int(max_time_ms)
        self.max_time_jump_ms = int(max_time_jump_ms)
        if self.max_pending_segments < 1 or self.max_record_bytes < 12 or self.max_connections < 1 \
                or self.max_buffered_bytes < 0 or self.max_time_jump_ms < 1:
            raise ValueError("max_pending_segments >= 1, max_record_bytes >= 12, max_connections >= 1, "
                             "max_buffered_bytes >= 0 and max_time_jump_ms >= 1 required")
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        #: {kind of DAMAGE_KINDS: [first ms, last ms]} of what the budgets left unread
        self.damage_times = {}
        # key -> _Flow, in the order of their places (see _make_room); ordered dicts: taking the first entry again
        # and again is O(1) (a dict's first live entry is found past every deleted one before it)
        self._flows = OrderedDict()
        self._generation = OrderedDict()  # key -> generation of its dropped connection (max_connections keys)
        self._tick = 0  # TCP packets read: the connections' clock of use
        self._held = 0  # buffered bytes of all connections (partial frames, waiting segments)
        #: the capture time (ms) of the first and the last packet read, in file order (-1: none yet)
        self.first_packet_ms = self.last_packet_ms = -1
        self._file_offset = 0
        self._fmt = 0  # 0: expect a file header, 1: pcap, 2: pcapng
        self._reset_file()
        self._reset_out()

    # -- output --
    def _reset_out(self):
        self._recv, self._conn, self._ver, self._lang = [], [], [], []
        self._addrs, self._bodies = [], []
        self._record_bytes = 0
        self._events = []
        self._losses = []

    @property
    def pending_records(self) -> int:
        """Records produced and not yet taken."""
        return len(self._recv)

    @property
    def buffered_bytes(self) -> int:
        """Partial frames and waiting segments of all connections (max_buffered_bytes bounds it)."""
        return self._held

    @property
    def connections_kept(self) -> int:
        """Connections held (max_connections bounds it)."""
        return len(self._flows)

    @property
    def pending_record_bytes(self) -> int:
        """Bytes of the records produced and not yet taken (bodies and addresses)."""
        return self._record_bytes

    def take(self):
        """(records, events, losses) produced since the last take. records: dict of columns (recv_ms, conn_id,
        version, language, addr_offsets, addr_data, body_offsets, body_data: numpy arrays and bytes, the layout of
        a recording block); events: tuples
        (ms, conn_id, kind, addr, by, client_id, producer_group, consumer_group); losses: tuples (conn_id, addr,
        direction 'c2s'/'s2c'/'?', first_ms, last_ms, bytes)."""
        addr_off, body_off = [0], [0]
        for a in self._addrs:
            addr_off.append(addr_off[-1] + len(a))
        for b in self._bodies:
            body_off.append(body_off[-1] + len(b))
        rec = {"recv_ms": np.array(self._recv, np.int64), "conn_id": np.array(self._conn, np.int64),
               "version": np.array(self._ver, np.int32), "language": np.array(self._lang, np.uint8),
               "addr_offsets": np.array(addr_off, np.int32), "addr_data": b"".join(self._addrs),
               "body_offsets": np.array(body_off, np.int32), "body_data": b"".join(self._bodies)}
        out = (rec, self._events, self._losses)
        self._reset_out()
        return out

    # -- file level --
    def _reset_file(self):
        self._fmt = 0
        self._file_offset = 0
        self._be = False
        self._nano = False
        self._link = 0
        self._snaplen = 0
        self._ifaces = []  # pcapng: (link type, ts units per second as (kind, value))
        self._time_ms = -1  # the file's time: its last packet read (-1: none yet)
        self._jump_ms = -1  # the last time jump's time, and how many consecutive jumps agree with it
        self._jumps = 0

    def feed(self, data) -> int:
        """Read the complete records (pcap) or blocks (pcapng) at the start of ``data`` (the file's bytes from
        where the last feed stopped); returns how many bytes were used. Raises CaptureError on broken structure."""
        data = bytes(data)
        n = len(data)
        pos = 0
        if self._fmt == 0:
            if n < 4:
                return 0
            magic = data[:4]
            if magic in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"):
                if n < 24:
                    return 0
                self._be = magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d")
                self._nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
                e = ">" if self._be else "<"
                self._snaplen, link = struct.unpack_from(e + "II", data, 16)
                self._link = link & 0xFFFF
                self._fmt = 1
                self.stats["files"] += 1
                pos = 24
            elif magic == b"\x0a\x0d\x0d\x0a":
                self._fmt = 2
                self.stats["files"] += 1
            else:
                raise CaptureError(f"not a pcap or pcapng file (starts {data[:8].hex()}) at byte 0")
        if self._fmt == 1:
            pos = self._feed_pcap(data, pos, n)
        else:
            pos = self._feed_pcapng(data, pos, n)
        self._file_offset += pos
        return pos

    def _feed_pcap(self, data, pos, n):
        e = ">" if self._be else "<"
        frac_limit = 1_000_000_000 if self._nano else 1_000_000
        limit = max(self._snaplen, 262144)
        while n - pos >= 16:
            sec, frac, incl, orig = struct.unpack_from(e + "IIII", data, pos)
            if incl > limit or incl > MAX_PACKET_BYTES or frac >= frac_limit:
                raise CaptureError(f"bad pcap record header at byte {self._file_offset + pos}")
            if n - pos - 16 < incl:
                break
            ms = sec * 1000 + (frac // 1_000_000 if self._nano else frac // 1000)
            self._packet(self._link, data, pos + 16, pos + 16 + incl, orig, ms)
            pos += 16 + incl
        return pos

    def _feed_pcapng(self, data, pos, n):
        while n - pos >= 12:
            if self._fmt == 2 and data[pos:pos + 4] == b"\x0a\x0d\x0d\x0a":
                bom = data[pos + 8:pos + 12]
                if bom == b"\x1a\x2b\x3c\x4d":
                    self._be = True
                elif bom == b"\x4d\x3c\x2b\x1a":
                    self._be = False
                else:
                    raise CaptureError(f"bad pcapng byte-order magic at byte {self._file_offset + pos}")
            e = ">" if self._be else "<"
            btype, blen = struct.unpack_from(e + "II", data, pos)
            if blen < 12 or blen % 4 or blen > MAX_PACKET_BYTES:
                raise CaptureError(f"bad pcapng block length {blen} at byte {self._file_offset + pos}")
            if n - pos < blen:
                break
            (trail,) = struct.unpack_from(e + "I", data, pos + blen - 4)
            if trail != blen:
                raise CaptureError(f"pcapng block lengths differ at byte {self._file_offset + pos}")
            body, end = pos + 8, pos + blen - 4
            if btype == 0x0A0D0D0A:
                self._ifaces = []
            elif btype == 1:  # interface description
                if end - body < 8:
                    raise CaptureError(f"short pcapng interface block at byte {self._file_offset + pos}")
                if len(self._ifaces) >= MAX_INTERFACES:
                    raise CaptureError(f"more than {MAX_INTERFACES} pcapng interfaces at byte {self._file_offset + pos}")
                (link,) = struct.unpack_from(e + "H", data, body)
                res = self._tsresol(data, body + 8, end, e)
                if (res & 0x80 and res & 0x7F > 63) or (not res & 0x80 and res > 18):
                    raise CaptureError(f"bad pcapng time stamp resolution at byte {self._file_offset + pos}")
                self._ifaces.append((link, res))
            elif btype == 6 or btype == 2:  # enhanced / obsolete packet block
                if end - body < 20:
                    raise CaptureError(f"short pcapng packet block at byte {self._file_offset + pos}")
                if btype == 6:
                    iface, hi, lo, cap, orig = struct.unpack_from(e + "IIIII", data, body)
                else:
                    iface, _, hi, lo, cap, orig = struct.unpack_from(e + "HHIIII", data, body)
                if iface >= len(self._ifaces) or cap > end - body - 20:
                    raise CaptureError(f"bad pcapng packet block at byte {self._file_offset + pos}")
                link, res = self._ifaces[iface]
                ms = _ts_ms((hi << 32) | lo, res)  # -1 (out of range): a bad time stamp, counted by _packet
                self._packet(link, data, body + 20, body + 20 + cap, orig, ms)
            elif btype == 3:  # simple packet block: no time stamp; counted, not read
                self.stats["packets"] += 1
                self.stats["malformed_packets"] += 1
            pos += blen
        return pos

    @staticmethod
    def _tsresol(data, pos, end, e):
        while end - pos >= 4:
            code, length = struct.unpack_from(e + "HH", data, pos)
            if code == 0:
                break
            if code == 9 and length >= 1:
                return data[pos + 4]
            pos += 4 + length + (-length % 4)
        return 6

    def end_file(self, leftover: int = 0) -> None:
        """The current file ended with ``leftover`` bytes feed could not use (a record cut by the end of the
        file: counted); the next feed starts a new file (flows carry over)."""
        if self._fmt == 0 and leftover:
            raise CaptureError(f"not a pcap or pcapng file ({leftover} bytes) at byte 0")
        if leftover:
            self.stats["truncated_file_tails"] += 1
        self._reset_file()

    def finish(self) -> None:
        """End of the input: holes still open are lost, partial frames left are counted (tail_bytes)."""
        for flow in self._flows.values():
            for d in (0, 1):
                self._close_dir(flow, d, flow.dirs[d].last_ms)

    def _close_dir(self, flow, d, ms):
        """A direction's end: waiting segments are lost, a partial frame left is counted (tail_bytes)."""
        st = flow.dirs[d]
        while st.pending:
            self._declare_hole(flow, d, st, ms)
        if st.buf:
            self.stats["tail_bytes"] += len(st.buf)
            self._held -= len(st.buf)
            st.buf.clear()

    # -- packet level --
    def _in_time(self, ms) -> bool:
        """Whether a packet stamped ``ms`` follows its file's time (see the module docstring: time jumps)."""
        if self._time_ms < 0 or abs(ms - self._time_ms) <= self.max_time_jump_ms:
            self._time_ms, self._jumps = ms, 0
            return True
        if self._jumps and abs(ms - self._jump_ms) <= self.max_time_jump_ms:
            self._jumps += 1
        else:
            self._jumps = 1
        self._jump_ms = ms
        if self._jumps >= TIME_JUMP_AGREE:  # a stream at the new time: it is the file's time now
            self._time_ms, self._jumps = ms, 0
            return True
        return False

    def _packet(self, link, data, pos, end, orig_len, ms):
        st = self.stats
        st["packets"] += 1
        if ms < self.min_time_ms or ms > self.max_time_ms:  # a clock no capture had: damage, not an event
            st["bad_time_packets"] += 1
            return
        if not self._in_time(ms):
            st["time_jump_packets"] += 1
            return
        if self.first_packet_ms < 0:
            self.first_packet_ms = ms
        self.last_packet_ms = ms
        if link == LINKTYPE_ETHERNET:
            if end - pos < 14:
                st["malformed_packets"] += 1
                return
            etype = (data[pos + 12] << 8) | data[pos + 13]
            pos += 14
            for _ in range(2):
                if etype in (0x8100, 0x88A8) and end - pos >= 4:
                    etype = (data[pos + 2] << 8) | data[pos + 3]
                    pos += 4
        elif link == LINKTYPE_LINUX_SLL:
            if end - pos < 16:
                st["malformed_packets"] += 1
                return
            etype = (data[pos + 14] << 8) | data[pos + 15]
            pos += 16
        elif link == LINKTYPE_LINUX_SLL2:
            if end - pos < 20:
                st["malformed_packets"] += 1
                return
            etype = (data[pos] << 8) | data[pos + 1]
            pos += 20
        elif link in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6):
            if end - pos < 1:
                st["malformed_packets"] += 1
                return
            v = data[pos] >> 4
            etype = 0x0800 if v == 4 else 0x86DD if v == 6 else 0
        elif link in (LINKTYPE_NULL, LINKTYPE_LOOP):
            if end - pos < 4:
                st["malformed_packets"] += 1
                return
            fam_le = int.from_bytes(data[pos:pos + 4], "little")
            fam_be = int.from_bytes(data[pos:pos + 4], "big")
            fam = fam_be if link == LINKTYPE_LOOP else (fam_le if fam_le < 65536 else fam_be)
            etype = 0x0800 if fam == 2 else 0x86DD if fam in (10, 24, 28, 30) else 0
            pos += 4
        else:
            st["unsupported_link_packets"] += 1
            return
        if etype == 0x0800:
            if end - pos < 20 or data[pos] >> 4 != 4:
                st["malformed_packets"] += 1
                return
            ihl = (data[pos] & 15) * 4
            total = (data[pos + 2] << 8) | data[pos + 3]
            if total == 0:  # a segmentation-offload packet captured on its sender: the capture says the length
                total = end - pos
            if ihl < 20 or total < ihl:
                st["malformed_packets"] += 1
                return
            frag = ((data[pos + 6] << 8) | data[pos + 7]) & 0x3FFF
            proto = data[pos + 9]
            if proto != 6:
                st["non_tcp_packets"] += 1
                return
            if frag:
                st["ip_fragments"] += 1
                return
            if end - pos < ihl:
                st["malformed_packets"] += 1
                return
            family, src, dst = socket.AF_INET, data[pos + 12:pos + 16], data[pos + 16:pos + 20]
            ip_end = pos + total
            pos += ihl
        elif etype == 0x86DD:
            if end - pos < 40 or data[pos] >> 4 != 6:
                st["malformed_packets"] += 1
                return
            plen = (data[pos + 4] << 8) | data[pos + 5]
            nh = data[pos + 6]
            family, src, dst = socket.AF_INET6, data[pos + 8:pos + 24], data[pos + 24:pos + 40]
            ip_end = pos + 40 + plen if plen else end
            pos += 40
            while nh in (0, 43, 60, 51, 44):
                if nh == 44:
                    st["ip_fragments"] += 1
                    return
                if end - pos < 8:
                    st["malformed_packets"] += 1
                    return
                hlen = (data[pos + 1] + 2) * 4 if nh == 51 else (data[pos + 1] + 1) * 8
                nh = data[pos]
                pos += hlen
            if nh != 6:
                st["non_tcp_packets"] += 1
                return
        else:
            st["non_tcp_packets"] += 1
            return
        if end - pos < 20:
            st["malformed_packets"] += 1
            return
        sport = (data[pos] << 8) | data[pos + 1]
        dport = (data[pos + 2] << 8) | data[pos + 3]
        seq = int.from_bytes(data[pos + 4:pos + 8], "big")
        doff = (data[pos + 12] >> 4) * 4
        flags = data[pos + 13]
        if doff < 20 or end - pos < doff or ip_end - pos < doff:
            st["malformed_packets"] += 1
            return
        st["tcp_packets"] += 1
        if self.ports is not None and sport not in self.ports and dport not in self.ports:
            st["filtered_packets"] += 1
            return
        payload_len = ip_end - pos - doff  # what the sender sent
        have = min(end, ip_end) - pos - doff  # what the capture holds
        if have < payload_len:
            st["truncated_packets"] += 1
        self._segment(family, src, sport, dst, dport, seq, flags, data[pos + doff:pos + doff + max(have, 0)],
                      payload_len, ms)

    # -- connection level --
    def _flow(self, family, src, sport, dst, dport, flags, seq, ms):
        a = src + sport.to_bytes(2, "big")
        b = dst + dport.to_bytes(2, "big")
        fam = b"\x04" if family == socket.AF_INET else b"\x06"
        if a <= b:
            key, side = fam + a + b, 0
        else:
            key, side = fam + b + a, 1
        if self.shard[0] > 1 and conn_hash(key, 0) % self.shard[0] != self.shard[1]:
            return None, side  # another reader's connection
        self._tick += 1
        old = flow = self._flows.get(key)
        syn_only = (flags & 0x12) == 0x02
        if flow is not None and syn_only and (flow.closed or flow.data_seen or (flow.syn_isn not in (-1, seq))):
            flow = None  # a new connection on the same 4-tuple
        if flow is None:
            if old is not None:
                gen = old.gen + 1
                self._held -= self._held_by(old)
                del self._flows[key]
            else:
                gen = self._generation.pop(key, -1) + 1
                if len(self._flows) >= self.max_connections:
                    self._make_room(ms)
            if side == 0:
                aa, ab = _addr_text(family, src, sport), _addr_text(family, dst, dport)
            else:
                aa, ab = _addr_text(family, dst, dport), _addr_text(family, src, sport)
            flow = _Flow(key, conn_hash(key, gen), gen, aa, ab, self._tick)
            self._flows[key] = flow
            self.stats["connections"] += 1
        flow.touched = self._tick
        return flow, side

    @staticmethod
    def _held_by(flow):
        return sum(len(d.buf) + d.pending_bytes for d in flow.dirs)

    def _make_room(self, ms):
        """Drop the connection touched least recently (max_connections): the dict keeps the connections in the
        order they took their place; one touched since it took its place moves to the end (each move follows a
        packet: amortised O(1)), the first one not touched since goes. An open one is closed out as at the end of
        the input; its generation is kept (a bounded number of them) so that its 4-tuple's next connection gets a
        new id."""
        flows = self._flows
        while True:
            key, flow = flows.popitem(last=False)
            if flow.touched > flow.placed:
                flow.placed = self._tick
                flows[key] = flow
                continue
            break
        if not flow.closed:
            self.stats["connections_evicted"] += 1
            self._damage("connections_evicted", ms)
            for d in (0, 1):
                self._close_dir(flow, d, flow.dirs[d].last_ms)
        self._generation[key] = flow.gen
        if len(self._generation) > self.max_connections:
            self._generation.popitem(last=False)

    def _damage(self, kind, ms):
        """The time range of what a budget left unread (ms < 0: unknown)."""
        if ms < 0:
            return
        t = self.damage_times.get(kind)
        if t is None:
            self.damage_times[kind] = [ms, ms]
        else:
            t[0], t[1] = min(t[0], ms), max(t[1], ms)

    def _segment(self, family, src, sport, dst, dport, seq, flags, payload, payload_len, ms):
        flow, side = self._flow(family, src, sport, dst, dport, flags, seq, ms)
        if flow is None:
            return
        st = flow.dirs[side]
        stats = self.stats
        if flow.closed:
            if payload_len:
                stats["packets_after_close"] += 1
            return
        if flags & 0x02:  # SYN
            if not (flags & 0x10):
                flow.client = side
                if flow.syn_isn < 0:  # not again for a retransmitted SYN
                    self._event(ms, flow, "open", side)
                flow.syn_isn = seq
            elif flow.client < 0:
                flow.client = 1 - side
            if not st.init or (not flow.data_seen and not st.buf and not st.pending):
                st.init = True
                st.nxt = seq + 1
                st.sync = True
            seq += 1
        if not st.init:
            if payload_len or flags & 0x01:
                st.init = True
                st.nxt = seq
                st.sync = False
                if not flow.data_seen:
                    stats["midstream_connections"] += 1
            else:
                if flags & 0x04:
                    self._end(flow, side, ms, "rst")
                return
        # 32-bit sequence number -> absolute, near the next expected byte
        d = (seq - st.nxt) & 0xFFFFFFFF
        if d >= 0x80000000:
            d -= 0x100000000
        aseq = st.nxt + d
        if payload_len:
            flow.data_seen = True
            self._data(flow, side, st, aseq, payload, payload_len, ms)
        elif st.nxt < aseq < st.nxt + 0x40000000:
            # a packet without data whose sequence number is past the next expected byte (a FIN, an ACK): the
            # bytes before it were sent and the capture missed them
            self._pending_put(st, aseq, b"", ms)
        if st.pending and self._overdue(st, ms):
            self._expire(flow, side, st, ms)
        if flags & 0x04:
            self._end(flow, side, ms, "rst")
        elif flags & 0x01:
            flow.fin[side] = True
            if not flow.ended:
                self._end(flow, side, ms, "fin")
            if flow.fin[0] and flow.fin[1]:
                self._close(flow, ms)
        if self._held > self.max_buffered_bytes:
            self._shed(ms)

    def _data(self, flow, side, st, aseq, payload, payload_len, ms):
        stats = self.stats
        have = len(payload)
        end = aseq + payload_len
        if end <= st.nxt:
            stats["segments_retransmitted"] += 1
            stats["bytes_retransmitted"] += payload_len
        elif aseq <= st.nxt:
            if aseq < st.nxt:
                stats["segments_retransmitted"] += 1
                stats["bytes_retransmitted"] += st.nxt - aseq
            cut = st.nxt - aseq
            if have > cut:
                self._deliver(flow, side, st, payload[cut:], ms)
            if have < payload_len:  # the capture cut the packet: the rest is lost
                self._declare_hole(flow, side, st, ms, end)
            self._drain(flow, side, st, ms)
        else:
            stats["segments_out_of_order"] += 1
            self._pending_put(st, aseq, payload, ms)

    def _overdue(self, st, ms):
        return (st.pending_bytes > self.max_pending_bytes or len(st.pending) > self.max_pending_segments
                or ms - st.hole_since > self.reorder_window_ms)

    def _expire(self, flow, side, st, ms):
        """Holes whose waiting bytes waited too long (or are too many) are lost."""
        while st.pending and self._overdue(st, ms):
            self._declare_hole(flow, side, st, ms)

    def _pending_put(self, st, aseq, data, ms):
        old = st.pending.get(aseq)
        if old is None or len(old[0]) < len(data):
            if old is None:
                heapq.heappush(st.keys, aseq)
            if data and (old is None or not old[0]):
                heapq.heappush(st.data_keys, aseq)
            grow = len(data) - (len(old[0]) if old is not None else 0)
            st.pending_bytes += grow
            self._held += grow
            st.pending[aseq] = (data, ms)
            if len(st.times) > 2 * len(st.pending) + 16:  # stale entries of replaced segments
                st.times = [(v[1], k) for k, v in st.pending.items()]
                heapq.heapify(st.times)
            else:
                heapq.heappush(st.times, (ms, aseq))
        if st.hole_since < 0:
            st.hole_since = ms

    def _pop_pending(self, st):
        """The waiting segment with the lowest sequence number: (first, data, ms)."""
        first = heapq.heappop(st.keys)
        data, t = st.pending.pop(first)
        if st.data_keys and st.data_keys[0] == first:
            heapq.heappop(st.data_keys)
        st.pending_bytes -= len(data)
        self._held -= len(data)
        if not st.pending:
            st.hole_since = -1
            st.times.clear()
        return first, data, t

    def _drain(self, flow, side, st, ms):
        """Deliver the waiting segments that now follow on; a frame they complete gets the later of ``ms`` and
        their own packet time (``ms`` < 0: their own time: the bytes after a lost hole)."""
        while st.keys and st.keys[0] <= st.nxt:  # delivering adds no waiting segment
            first, data, t = self._pop_pending(st)
            if ms > t:
                t = ms
            end = first + len(data)
            if end > st.nxt:
                cut = st.nxt - first
                if cut:
                    self.stats["segments_retransmitted"] += 1
                    self.stats["bytes_retransmitted"] += cut
                self._deliver(flow, side, st, data[cut:], t)
            elif data:
                self.stats["segments_retransmitted"] += 1
                self.stats["bytes_retransmitted"] += len(data)

    def _cut_buffer(self, st, gap_end):
        """What a loss before ``gap_end`` does to the bytes buffered: a frame being read is cut (when its length
        was seen, reading resumes at its end); bytes read while searching are discarded."""
        stats = self.stats
        buf = st.buf
        if st.sync:
            if buf:
                stats["frames_cut"] += 1
                stats["discarded_bytes"] += len(buf)
                if len(buf) >= 4:
                    frame_end = st.nxt - len(buf) + 4 + int.from_bytes(buf[:4], "big")
                    if frame_end > gap_end:
                        st.skip_to = frame_end
        else:
            stats["discarded_bytes"] += len(buf)
        self._held -= len(buf)
        buf.clear()
        st.passing = False  # the rest of a frame passed by its header is discarded
        if st.skip_to >= 0 and st.skip_to <= gap_end:
            st.skip_to = -1
        st.sync = False
        st.searching_after_loss = True

    def _declare_hole(self, flow, side, st, ms, missing_end=-1):
        """The bytes from nxt to the first waiting segment (or missing_end) are lost."""
        stats = self.stats
        if missing_end >= 0:
            gap_end = missing_end
        else:  # up to the first waiting data; empty markers (FIN, ACK positions) before it are inside the gap
            gap_end = st.data_keys[0] if st.data_keys else max(st.pending)
        first_after = st.pending[gap_end][1] if gap_end in st.pending else max(ms, 0)
        stats["holes"] += 1
        stats["hole_bytes"] += gap_end - st.nxt
        self._losses.append((flow.conn_id, flow.addr[flow.client] if flow.client >= 0 else flow.addr[side],
                             "?" if flow.client < 0 else ("c2s" if side == flow.client else "s2c"),
                             st.last_ms if st.last_ms >= 0 else first_after, first_after, gap_end - st.nxt))
        self._cut_buffer(st, gap_end)
        st.nxt = gap_end
        if not st.pending:
            st.hole_since = -1
        self._drain(flow, side, st, -1)
        if st.pending:  # the earliest packet time of what still waits
            times, pending = st.times, st.pending
            while times and (times[0][1] not in pending or pending[times[0][1]][1] != times[0][0]):
                heapq.heappop(times)
            st.hole_since = times[0][0]

    def _shed(self, ms):
        """All connections buffer more than max_buffered_bytes: the directions holding the most are emptied
        (their holes lost, their buffered frames cut) until half of it is left."""
        stats = self.stats
        held = sorted(((len(st.buf) + st.pending_bytes, i, side, flow) for i, flow in enumerate(self._flows.values())
                       for side, st in enumerate(flow.dirs) if st.buf or st.pending_bytes),
                      key=lambda x: (-x[0], x[1], x[2]))
        for n, _, side, flow in held:
            if self._held <= self.max_buffered_bytes // 2:
                break
            st = flow.dirs[side]
            before = self._held
            while st.pending:
                self._declare_hole(flow, side, st, ms)
            if st.buf:
                self._cut_buffer(st, st.nxt)
            stats["buffers_shed"] += 1
            stats["buffer_shed_bytes"] += before - self._held
            self._damage("buffers_shed", ms)

    def _deliver(self, flow, side, st, data, ms):
        n = len(data)
        if st.skip_to >= 0:
            if st.nxt + n <= st.skip_to:
                if not st.passing:
                    self.stats["discarded_bytes"] += n
                st.nxt += n
                st.last_ms = ms
                return
            cut = st.skip_to - st.nxt
            if not st.passing:
                self.stats["discarded_bytes"] += cut
            data = data[cut:]
            st.nxt += cut
            n -= cut
            st.skip_to = -1
            st.passing = False
        before = len(st.buf)
        st.buf += data
        st.nxt += n
        st.last_ms = ms
        self._frames(flow, side, st, ms)
        self._held += len(st.buf) - before

    def _frames(self, flow, side, st, ms):
        buf = st.buf
        n = len(buf)
        pos = 0
        limit = self.max_frame_size
        while True:
            if not st.sync:
                i, status = self._search(buf, pos, n)
                self.stats["discarded_bytes"] += i - pos
                pos = i
                if status != _SEARCH_YES:
                    break
                st.sync = True
                if st.searching_after_loss:
                    self.stats["resyncs"] += 1
                st.searching_after_loss = False
            if n - pos < 4:
                break
            total = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            if total < 4 or total + 4 > limit:
                self._bad_length(st)
                continue
            if n - pos < 8:
                break
            hl = ((buf[pos + 5] << 16) | (buf[pos + 6] << 8) | buf[pos + 7])
            if buf[pos + 4] > 1 or hl > total - 4:
                self._bad_length(st)
                continue
            if 4 + total > self.max_record_bytes:  # not buffered: its header says what it is, its bytes pass
                if hl <= MAX_HEADER_BYTES and n - pos < 8 + hl:
                    break
                self._large_frame(buf, pos, hl, ms)
                if n - pos >= 4 + total:
                    pos += 4 + total
                else:
                    st.skip_to = st.nxt - (n - pos) + 4 + total
                    st.passing = True
                    pos = n
                    break
                continue
            if n - pos < 4 + total:
                break
            self._frame(flow, side, bytes(buf[pos:pos + 4 + total]), ms)
            pos += 4 + total
        if pos:
            del buf[:pos]

    def _large_frame(self, buf, pos, hl, ms):
        """A frame over max_record_bytes: counted; a request of HEART_BEAT / UNREGISTER_CLIENT or a NOTIFY this
        large is a record the budget leaves unread (damage); one whose header is over MAX_HEADER_BYTES or does not
        decode is a bad frame."""
        stats = self.stats
        stats["frames"] += 1
        cmd = None
        if hl <= MAX_HEADER_BYTES:
            try:
                cmd = self._decode_frame((4 + hl).to_bytes(4, "big") + bytes(buf[pos + 4:pos + 8 + hl]),
                                         self.max_frame_size)
            except FrameError:
                cmd = None
        if cmd is None:
            stats["frames_bad"] += 1
        elif not cmd.flag & 1 and cmd.code in (34, 35, 40):
            stats["records_too_large"] += 1
            self._damage("records_too_large", ms)

    def _bad_length(self, st):
        self.stats["bad_lengths"] += 1
        st.sync = False
        st.searching_after_loss = True

    def _search(self, buf, pos, n):
        """(offset, status) of the first plausible frame start at or after pos: YES (its header decodes), MORE
        (it might be one, more bytes needed), or (n, NO). A candidate's header is read only up to
        SEARCH_HEADER_BYTES: each costs a bounded decode."""
        limit = self.max_frame_size
        for i in range(pos, n):
            avail = n - i
            if avail < 4:
                if buf[i] == 0 or limit > 0x1000000:
                    return i, _SEARCH_MORE
                continue
            total = int.from_bytes(buf[i:i + 4], "big", signed=True)
            if total < 4 or total + 4 > limit:
                continue
            if avail < 5:
                return i, _SEARCH_MORE
            stype = buf[i + 4]
            if stype > 1:
                continue
            if avail < 8:
                return i, _SEARCH_MORE
            hl = (buf[i + 5] << 16) | (buf[i + 6] << 8) | buf[i + 7]
            if hl > total - 4 or (stype == 0 and hl < 2) or (stype == 1 and hl < 21) or hl > SEARCH_HEADER_BYTES:
                continue
            if stype == 0 and avail >= 9 and buf[i + 8] != 0x7B:
                continue
            if avail < 8 + hl:
                return i, _SEARCH_MORE
            try:
                self._decode_frame((4 + hl).to_bytes(4, "big") + bytes(buf[i + 4:i + 8 + hl]), limit)
            except FrameError:
                continue
            return i, _SEARCH_YES
        return n, _SEARCH_NO

    def _frame(self, flow, side, frame, ms):
        stats = self.stats
        stats["frames"] += 1
        try:
            cmd = self._decode_frame(frame, self.max_frame_size)
        except FrameError:
            stats["frames_bad"] += 1
            return
        if cmd.flag & 1:
            return
        code = cmd.code
        if code == 34:
            stats["heartbeats"] += 1
            flow.client = side
            self._recv.append(ms)
            self._conn.append(flow.conn_id)
            self._ver.append(cmd.version)
            self._lang.append(_language_ordinal(cmd.language))
            self._addrs.append(flow.addr[side].encode())
            self._bodies.append(cmd.body)
            self._record_bytes += len(self._addrs[-1]) + len(cmd.body)
        elif code == 35:
            stats["unregisters"] += 1
            flow.client = side
            ext = cmd.ext_fields or {}
            self._events.append((ms, flow.conn_id, "unregister", flow.addr[side], "client", ext.get("clientID"),
                                 ext.get("producerGroup"), ext.get("consumerGroup")))
        elif code == 40:
            stats["notifies"] += 1
            if flow.client < 0:
                flow.client = 1 - side
            ext = cmd.ext_fields or {}
            self._events.append((ms, flow.conn_id, "notify", flow.addr[1 - side], "server", None, None,
                                 ext.get("consumerGroup")))

    def _event(self, ms, flow, kind, side):
        client = flow.client if flow.client >= 0 else side
        by = "client" if side == client else "server"
        self._events.append((ms, flow.conn_id, kind, flow.addr[client], by, None, None, None))

    def _end(self, flow, side, ms, kind):
        if not flow.ended:
            flow.ended = True
            if flow.client < 0:  # unknown roles: the side with the higher port is taken for the client
                pa, pb = flow.addr[0].rsplit(":", 1)[1], flow.addr[1].rsplit(":", 1)[1]
                client = 0 if int(pa) > int(pb) else 1
            else:
                client = flow.client
            self._events.append((ms, flow.conn_id, kind, flow.addr[client], "client" if side == client else "server",
                                 None, None, None))
        if kind == "rst":
            self._close(flow, ms)

    def _close(self, flow, ms):
        """Both FINs or a RST: waiting segments are lost, partial frames are counted, later packets ignored."""
        for d in (0, 1):
            self._close_dir(flow, d, ms)
        flow.closed = True


def _ts_ms(ts: int, res: int) -> int:
    """Milliseconds of a pcapng time stamp in units of if_tsresol, -1 when out of range."""
    if res & 0x80:
        t = (ts * 1000) >> (res & 0x7F)
    elif res >= 3:
        t = ts // (10 ** (res - 3))
    else:
        t = ts * (10 ** (3 - res))
    return t if t < 2 ** 62 else -1

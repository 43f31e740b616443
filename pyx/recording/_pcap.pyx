# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""RocketMQ remoting traffic from packet captures (pcap, pcapng): the compiled reader.

Follows ``engine.recording._pcap_py`` (the readable twin, which documents the rules) step by step and gives the same
records, events, losses, statistics and errors. What is native here: the capture records, link / IP / TCP headers,
the per-direction byte buffers and the frame loop in C; a frame whose header is a JSON header of the usual shape
(no whitespace, no escapes, ASCII) or a ROCKETMQ header without remark and ext fields is read without a Python
object, and a heartbeat's body is copied straight from the packet into the output buffer. Anything else (other
header shapes, UNREGISTER_CLIENT / NOTIFY frames, resynchronisation candidates) goes through
``engine.decode_frame``, as in the twin.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdlib cimport free, llabs, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

import socket

import numpy as np

from engine.recording._pcap_py import (CaptureError, DEFAULT_MAX_PENDING_BYTES, DEFAULT_REORDER_WINDOW_MS, MAX_PACKET_BYTES,
                             STAT_NAMES, DEFAULT_MAX_PENDING_SEGMENTS, DEFAULT_MAX_RECORD_BYTES,
                             DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_BUFFERED_BYTES, MIN_TIME_MS, MAX_TIME_AHEAD_MS,
                             MAX_HEADER_BYTES, SEARCH_HEADER_BYTES, MAX_INTERFACES, MAX_TIME_JUMP_MS,
                             TIME_JUMP_AGREE)
import heapq
import time
from collections import OrderedDict
from engine.codec.enums import DEFAULT_MAX_FRAME_SIZE
from engine.codec.errors import FrameError

# stat indexes: the order of STAT_NAMES
cdef enum:
    S_FILES, S_PACKETS, S_TCP, S_NON_TCP, S_UNSUPPORTED_LINK, S_FRAGMENTS, S_TRUNCATED, S_MALFORMED, S_FILTERED,
    S_CONNECTIONS, S_MIDSTREAM, S_RETRANS, S_RETRANS_BYTES, S_OOO, S_AFTER_CLOSE, S_HOLES, S_HOLE_BYTES,
    S_FRAMES_CUT, S_DISCARDED, S_RESYNCS, S_BAD_LENGTHS, S_FRAMES, S_FRAMES_BAD, S_HEARTBEATS, S_UNREGISTERS,
    S_NOTIFIES, S_TAIL_BYTES, S_TRUNCATED_TAILS, S_BAD_TIME, S_RECORDS_TOO_LARGE, S_EVICTED, S_SHED, S_SHED_BYTES,
    S_TIME_JUMP, N_STATS

assert N_STATS == len(STAT_NAMES)

cdef enum:
    SEARCH_NO = 0
    SEARCH_YES = 1
    SEARCH_MORE = 2

cdef uint64_t FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t FNV_PRIME = 0x100000001B3ULL
cdef long long C_MAX_HEADER_BYTES = MAX_HEADER_BYTES
cdef long long C_SEARCH_HEADER_BYTES = SEARCH_HEADER_BYTES
cdef long long C_TIME_JUMP_AGREE = TIME_JUMP_AGREE



cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int buf_reserve(Buf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t need = b.n + extra
    cdef Py_ssize_t cap
    cdef char* q
    if need <= b.cap:
        return 0
    cap = b.cap * 2 if b.cap else 4096
    while cap < need:
        cap *= 2
    q = <char*>realloc(b.p, cap)
    if q == NULL:
        raise MemoryError()
    b.p = q
    b.cap = cap
    return 0


cdef inline int buf_put(Buf* b, const void* src, Py_ssize_t n) except -1:
    if b.n + n > b.cap:
        buf_reserve(b, n)
    memcpy(b.p + b.n, src, n)
    b.n += n
    return 0


cdef inline uint32_t be32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint32_t rd32(const unsigned char* p, bint big) noexcept nogil:
    if big:
        return be32(p)
    return (<uint32_t>p[3] << 24) | (<uint32_t>p[2] << 16) | (<uint32_t>p[1] << 8) | p[0]


cdef inline uint32_t rd16(const unsigned char* p, bint big) noexcept nogil:
    if big:
        return (<uint32_t>p[0] << 8) | p[1]
    return (<uint32_t>p[1] << 8) | p[0]


cdef uint64_t conn_hash_c(const unsigned char* key, Py_ssize_t n, uint32_t generation) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ key[i]) * FNV_PRIME
    for i in range(4):
        h = (h ^ ((generation >> (8 * i)) & 0xFF)) * FNV_PRIME
    return h & 0x7FFFFFFFFFFFFFFFULL


# ---------------------------------------------------------------------------------------------------------------
# the usual JSON header, read without Python objects (1: read, fields set; 0: not sure, ask decode_frame)

cdef inline Py_ssize_t json_str_end(const unsigned char* h, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """h[i] is just after an opening quote: the index of the closing quote, or -1 (escape, control, non-ASCII)."""
    cdef unsigned char c
    while i < n:
        c = h[i]
        if c == 0x22:
            return i
        if c < 0x20 or c > 0x7E or c == 0x5C:
            return -1
        i += 1
    return -1


cdef inline bint key_is(const unsigned char* h, Py_ssize_t a, Py_ssize_t b, const char* name, Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t k
    if b - a != m:
        return False
    for k in range(m):
        if h[a + k] != <unsigned char>name[k]:
            return False
    return True


cdef int fast_json(const unsigned char* h, Py_ssize_t n, int* code, int* flag, int* lang, int* version) noexcept nogil:
    cdef Py_ssize_t i = 1, ks, ke, vs, ve, k
    cdef int kind  # 0 string, 1 int, 2 null, 3 object
    cdef int which  # 0 other, 1 code, 2 flag, 3 opaque, 4 version, 5 language, 6 remark, 7 extFields
    cdef long long v
    cdef bint neg
    cdef int members
    if n < 2 or h[0] != 0x7B:
        return 0
    code[0] = 0
    flag[0] = 0
    version[0] = 0
    lang[0] = 0
    if h[1] == 0x7D:
        return 1 if n == 2 else 0
    while True:
        if i >= n or h[i] != 0x22:
            return 0
        ks = i + 1
        ke = json_str_end(h, ks, n)
        if ke < 0:
            return 0
        i = ke + 1
        if i >= n or h[i] != 0x3A:
            return 0
        i += 1
        if i >= n:
            return 0
        which = 0
        k = ke - ks
        if k == 4:
            if key_is(h, ks, ke, "code", 4):
                which = 1
            elif key_is(h, ks, ke, "flag", 4):
                which = 2
        elif k == 6:
            if key_is(h, ks, ke, "opaque", 6):
                which = 3
            elif key_is(h, ks, ke, "remark", 6):
                which = 6
        elif k == 7:
            if key_is(h, ks, ke, "version", 7):
                which = 4
        elif k == 8:
            if key_is(h, ks, ke, "language", 8):
                which = 5
        elif k == 9:
            if key_is(h, ks, ke, "extFields", 9):
                which = 7
        v = 0
        if h[i] == 0x22:
            kind = 0
            vs = i + 1
            ve = json_str_end(h, vs, n)
            if ve < 0:
                return 0
            i = ve + 1
        elif h[i] == 0x2D or (h[i] >= 0x30 and h[i] <= 0x39):
            kind = 1
            neg = h[i] == 0x2D
            if neg:
                i += 1
            if i >= n or h[i] < 0x30 or h[i] > 0x39:
                return 0
            if h[i] == 0x30:
                i += 1
            else:
                k = 0
                while i < n and h[i] >= 0x30 and h[i] <= 0x39:
                    v = v * 10 + (h[i] - 0x30)
                    i += 1
                    k += 1
                    if k > 10:
                        return 0
                if v > 2147483647 + (1 if neg else 0):  # int32, as decode_frame requires
                    return 0
            if i < n and (h[i] == 0x2E or h[i] == 0x65 or h[i] == 0x45):
                return 0
            if neg:
                v = -v
        elif h[i] == 0x6E:
            if i + 4 > n or h[i + 1] != 0x75 or h[i + 2] != 0x6C or h[i + 3] != 0x6C:
                return 0
            kind = 2
            i += 4
        elif h[i] == 0x7B and which == 7:
            kind = 3
            i += 1
            if i < n and h[i] == 0x7D:
                i += 1
            else:
                members = 0
                while True:
                    members += 1
                    if members > 64 or i >= n or h[i] != 0x22:
                        return 0
                    ve = json_str_end(h, i + 1, n)
                    if ve < 0:
                        return 0
                    i = ve + 1
                    if i >= n or h[i] != 0x3A:
                        return 0
                    i += 1
                    if i < n and h[i] == 0x22:
                        ve = json_str_end(h, i + 1, n)
                        if ve < 0:
                            return 0
                        i = ve + 1
                    elif i + 4 <= n and h[i] == 0x6E and h[i + 1] == 0x75 and h[i + 2] == 0x6C and h[i + 3] == 0x6C:
                        i += 4
                    else:
                        return 0
                    if i < n and h[i] == 0x2C:
                        i += 1
                        continue
                    if i < n and h[i] == 0x7D:
                        i += 1
                        break
                    return 0
        else:
            return 0
        if which >= 1 and which <= 4:
            if kind == 1:
                if which == 1:
                    code[0] = <int>v
                elif which == 2:
                    flag[0] = <int>v
                elif which == 4:
                    version[0] = <int>v
            elif kind == 2:
                if which == 1:
                    code[0] = 0
                elif which == 2:
                    flag[0] = 0
                elif which == 4:
                    version[0] = 0
            else:
                return 0
        elif which == 5:
            if kind == 0:
                lang[0] = lang_of(h, vs, ve)
            elif kind == 1:
                lang[0] = <int>v if 0 <= v <= 13 else 255
            elif kind == 2:
                lang[0] = 255
            else:
                return 0
        elif which == 7:
            if kind != 2 and kind != 3:
                return 0
        if i >= n:
            return 0
        if h[i] == 0x2C:
            i += 1
            continue
        if h[i] == 0x7D:
            return 1 if i + 1 == n else 0
        return 0


cdef int lang_of(const unsigned char* h, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """LanguageCode ordinal of a name, 255 for an unknown one (engine.codec.enums.LANGUAGE_BY_NAME)."""
    if key_is(h, a, b, "JAVA", 4):
        return 0
    if key_is(h, a, b, "CPP", 3):
        return 1
    if key_is(h, a, b, "DOTNET", 6):
        return 2
    if key_is(h, a, b, "PYTHON", 6):
        return 3
    if key_is(h, a, b, "DELPHI", 6):
        return 4
    if key_is(h, a, b, "ERLANG", 6):
        return 5
    if key_is(h, a, b, "RUBY", 4):
        return 6
    if key_is(h, a, b, "OTHER", 5):
        return 7
    if key_is(h, a, b, "HTTP", 4):
        return 8
    if key_is(h, a, b, "GO", 2):
        return 9
    if key_is(h, a, b, "PHP", 3):
        return 10
    if key_is(h, a, b, "OMS", 3):
        return 11
    if key_is(h, a, b, "RUST", 4):
        return 12
    if key_is(h, a, b, "NODE_JS", 7):
        return 13
    return 255


# ---------------------------------------------------------------------------------------------------------------
# connections


@cython.final
cdef class _Dir:
    cdef bint init, sync, searching_after_loss, passing
    cdef long long nxt, skip_to, hole_since, last_ms, pending_bytes
    cdef Buf buf
    cdef dict pending
    cdef list keys, data_keys, times  # heaps over pending (see the twin)

    def __cinit__(self):
        self.skip_to = -1
        self.hole_since = -1
        self.last_ms = -1
        self.pending = {}
        self.keys = []
        self.data_keys = []
        self.times = []

    def __dealloc__(self):
        free(self.buf.p)


@cython.final
cdef class _Flow:
    cdef bytes key
    cdef long long conn_id
    cdef tuple addr
    cdef bytes addr0, addr1
    cdef _Dir d0, d1
    cdef int client
    cdef long long syn_isn, gen, touched, placed
    cdef bint closed, fin0, fin1, ended, data_seen


cdef long long held_by(_Flow flow):
    return flow.d0.buf.n + flow.d0.pending_bytes + flow.d1.buf.n + flow.d1.pending_bytes


cdef str addr_text(int family, bytes ip, int port):
    return f"{socket.inet_ntop(family, ip)}:{port}"


cdef class CaptureDecoder:
    """Capture files -> heartbeat records, events, losses (see ``engine.recording._pcap_py``)."""

    cdef object _decode_frame
    cdef readonly object ports
    cdef bint _has_ports
    cdef unsigned char _port_set[8192]
    cdef readonly long long max_frame_size, reorder_window_ms, max_pending_bytes, max_pending_segments
    cdef readonly long long max_record_bytes, max_connections, max_buffered_bytes, min_time_ms, max_time_ms
    cdef readonly long long max_time_jump_ms
    cdef long long _time_ms, _jump_ms, _jumps  # time jumps (see the twin's _in_time)
    cdef readonly dict damage_times
    cdef long long _tick, _held
    cdef uint64_t _shard_n, _shard_i
    cdef long long st[N_STATS]
    cdef object _flows, _generation  # OrderedDict (see the twin)
    # the last connection looked up (a steady fleet's packets come in runs of one connection's request, ACK,
    # answer, ACK): its key is compared with memcmp before building a key object for the dict
    cdef unsigned char _last_key[37]
    cdef int _last_klen
    cdef object _last_flow
    cdef long long _file_offset
    cdef int _fmt
    cdef bint _be, _nano
    cdef int _link
    cdef uint32_t _snaplen
    cdef list _ifaces
    # output
    cdef Buf o_recv, o_conn, o_ver, o_lang, o_addr_off, o_addr, o_body_off, o_body
    cdef Py_ssize_t o_n
    cdef list _events, _losses
    #: the capture time (ms) of the first and the last packet read, in file order (-1: none yet)
    cdef readonly long long first_packet_ms, last_packet_ms

    def __init__(self, ports=None, max_frame_size=DEFAULT_MAX_FRAME_SIZE,
                 reorder_window_ms=DEFAULT_REORDER_WINDOW_MS, max_pending_bytes=DEFAULT_MAX_PENDING_BYTES,
                 shard=(1, 0), max_pending_segments=DEFAULT_MAX_PENDING_SEGMENTS,
                 max_record_bytes=DEFAULT_MAX_RECORD_BYTES, max_connections=DEFAULT_MAX_CONNECTIONS,
                 max_buffered_bytes=DEFAULT_MAX_BUFFERED_BYTES, min_time_ms=MIN_TIME_MS, max_time_ms=None,
                 max_time_jump_ms=MAX_TIME_JUMP_MS):
        import engine

        n, i = (int(x) for x in shard)
        if not (n >= 1 and 0 <= i < n):
            raise ValueError("shard must be (n, i) with n >= 1 and 0 <= i < n")
        self._shard_n = n
        self._shard_i = i
        self._decode_frame = engine.decode_frame
        self.ports = frozenset(int(p) for p in ports) if ports else None
        if max_frame_size < 12 or reorder_window_ms < 0 or max_pending_bytes < 0:
            raise ValueError("max_frame_size >= 12, reorder_window_ms >= 0 and max_pending_bytes >= 0 required")
        self._has_ports = self.ports is not None
        for p in (self.ports or ()):
            if 0 <= p < 65536:
                self._port_set[p >> 3] |= 1 << (p & 7)
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
        self.damage_times = {}
        self._flows = OrderedDict()
        self._generation = OrderedDict()
        self.first_packet_ms = self.last_packet_ms = -1
        self._reset_file()
        self._reset_out()

    def __dealloc__(self):
        free(self.o_recv.p)
        free(self.o_conn.p)
        free(self.o_ver.p)
        free(self.o_lang.p)
        free(self.o_addr_off.p)
        free(self.o_addr.p)
        free(self.o_body_off.p)
        free(self.o_body.p)

    @property
    def shard(self):
        return (int(self._shard_n), int(self._shard_i))

    @property
    def stats(self):
        return {name: self.st[i] for i, name in enumerate(STAT_NAMES)}

    # -- output --
    cdef _reset_out(self):
        cdef int32_t zero = 0
        self.o_recv.n = self.o_conn.n = self.o_ver.n = self.o_lang.n = 0
        self.o_addr_off.n = self.o_addr.n = self.o_body_off.n = self.o_body.n = 0
        buf_put(&self.o_addr_off, &zero, 4)
        buf_put(&self.o_body_off, &zero, 4)
        self.o_n = 0
        self._events = []
        self._losses = []

    def take(self):
        """(records, events, losses) produced since the last take (see the twin)."""
        n = self.o_n
        if self.o_body.n >= 2 ** 31 or self.o_addr.n >= 2 ** 31:
            raise ValueError("records too large for 32-bit offsets: take() more often")
        rec = {
            "recv_ms": np.frombuffer(PyBytes_FromStringAndSize(self.o_recv.p, self.o_recv.n), np.int64),
            "conn_id": np.frombuffer(PyBytes_FromStringAndSize(self.o_conn.p, self.o_conn.n), np.int64),
            "version": np.frombuffer(PyBytes_FromStringAndSize(self.o_ver.p, self.o_ver.n), np.int32),
            "language": np.frombuffer(PyBytes_FromStringAndSize(self.o_lang.p, self.o_lang.n), np.uint8),
            "addr_offsets": np.frombuffer(PyBytes_FromStringAndSize(self.o_addr_off.p, self.o_addr_off.n), np.int32),
            "addr_data": PyBytes_FromStringAndSize(self.o_addr.p, self.o_addr.n),
            "body_offsets": np.frombuffer(PyBytes_FromStringAndSize(self.o_body_off.p, self.o_body_off.n), np.int32),
            "body_data": PyBytes_FromStringAndSize(self.o_body.p, self.o_body.n),
        }
        out = (rec, self._events, self._losses)
        self._reset_out()
        return out

    @property
    def pending_records(self):
        """Records produced and not yet taken."""
        return self.o_n

    @property
    def buffered_bytes(self):
        """Partial frames and waiting segments of all connections (max_buffered_bytes bounds it)."""
        return self._held

    @property
    def connections_kept(self):
        """Connections held (max_connections bounds it)."""
        return len(self._flows)

    @property
    def pending_record_bytes(self):
        """Bytes of the records produced and not yet taken (bodies and addresses)."""
        return self.o_body.n + self.o_addr.n

    # -- file level --
    cdef _reset_file(self):
        self._fmt = 0
        self._file_offset = 0
        self._be = False
        self._nano = False
        self._link = 0
        self._snaplen = 0
        self._ifaces = []
        self._time_ms = -1
        self._jump_ms = -1
        self._jumps = 0

    def feed(self, data):
        """Read the complete records (pcap) or blocks (pcapng) at the start of ``data``; returns the bytes used."""
        cdef const unsigned char[::1] view = data
        cdef Py_ssize_t n = view.shape[0]
        cdef Py_ssize_t pos = 0
        cdef const unsigned char* p
        if n == 0:
            return 0
        p = &view[0]
        if self._fmt == 0:
            if n < 4:
                return 0
            m = bytes(p[:4])
            if m in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"):
                if n < 24:
                    return 0
                self._be = m in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d")
                self._nano = m in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
                self._snaplen = rd32(p + 16, self._be)
                self._link = rd32(p + 20, self._be) & 0xFFFF
                self._fmt = 1
                self.st[S_FILES] += 1
                pos = 24
            elif m == b"\x0a\x0d\x0d\x0a":
                self._fmt = 2
                self.st[S_FILES] += 1
            else:
                raise CaptureError(f"not a pcap or pcapng file (starts {bytes(p[:min(n, 8)]).hex()}) at byte 0")
        if self._fmt == 1:
            pos = self._feed_pcap(p, pos, n)
        else:
            pos = self._feed_pcapng(p, pos, n)
        self._file_offset += pos
        return pos

    cdef Py_ssize_t _feed_pcap(self, const unsigned char* p, Py_ssize_t pos, Py_ssize_t n) except -1:
        cdef bint big = self._be
        cdef uint32_t sec, frac, incl, orig
        cdef uint32_t frac_limit = 1000000000 if self._nano else 1000000
        cdef uint32_t limit = self._snaplen if self._snaplen > 262144 else 262144
        cdef long long ms
        while n - pos >= 16:
            sec = rd32(p + pos, big)
            frac = rd32(p + pos + 4, big)
            incl = rd32(p + pos + 8, big)
            orig = rd32(p + pos + 12, big)
            if incl > limit or incl > MAX_PACKET_BYTES or frac >= frac_limit:
                raise CaptureError(f"bad pcap record header at byte {self._file_offset + pos}")
            if n - pos - 16 < incl:
                break
            ms = <long long>sec * 1000 + (frac // 1000000 if self._nano else frac // 1000)
            self._packet(self._link, p, pos + 16, pos + 16 + incl, orig, ms)
            pos += 16 + incl
        return pos

    cdef Py_ssize_t _feed_pcapng(self, const unsigned char* p, Py_ssize_t pos, Py_ssize_t n) except -1:
        cdef uint32_t btype, blen, iface, hi, lo, cap, orig
        cdef Py_ssize_t body, end
        cdef bint big
        cdef long long ms
        cdef int res
        while n - pos >= 12:
            if p[pos] == 0x0A and p[pos + 1] == 0x0D and p[pos + 2] == 0x0D and p[pos + 3] == 0x0A:
                if p[pos + 8] == 0x1A and p[pos + 9] == 0x2B and p[pos + 10] == 0x3C and p[pos + 11] == 0x4D:
                    self._be = True
                elif p[pos + 8] == 0x4D and p[pos + 9] == 0x3C and p[pos + 10] == 0x2B and p[pos + 11] == 0x1A:
                    self._be = False
                else:
                    raise CaptureError(f"bad pcapng byte-order magic at byte {self._file_offset + pos}")
            big = self._be
            btype = rd32(p + pos, big)
            blen = rd32(p + pos + 4, big)
            if blen < 12 or blen % 4 or blen > MAX_PACKET_BYTES:
                raise CaptureError(f"bad pcapng block length {blen} at byte {self._file_offset + pos}")
            if n - pos < blen:
                break
            if rd32(p + pos + blen - 4, big) != blen:
                raise CaptureError(f"pcapng block lengths differ at byte {self._file_offset + pos}")
            body = pos + 8
            end = pos + blen - 4
            if btype == 0x0A0D0D0A:
                self._ifaces = []
            elif btype == 1:
                if end - body < 8:
                    raise CaptureError(f"short pcapng interface block at byte {self._file_offset + pos}")
                if len(self._ifaces) >= MAX_INTERFACES:
                    raise CaptureError(f"more than {MAX_INTERFACES} pcapng interfaces at byte {self._file_offset + pos}")
                res = self._tsresol(p, body + 8, end, big)
                if (res & 0x80 and res & 0x7F > 63) or (not res & 0x80 and res > 18):
                    raise CaptureError(f"bad pcapng time stamp resolution at byte {self._file_offset + pos}")
                self._ifaces.append((<int>rd16(p + body, big), res))
            elif btype == 6 or btype == 2:
                if end - body < 20:
                    raise CaptureError(f"short pcapng packet block at byte {self._file_offset + pos}")
                if btype == 6:
                    iface = rd32(p + body, big)
                    hi = rd32(p + body + 4, big)
                    lo = rd32(p + body + 8, big)
                    cap = rd32(p + body + 12, big)
                    orig = rd32(p + body + 16, big)
                else:
                    iface = rd16(p + body, big)
                    hi = rd32(p + body + 4, big)
                    lo = rd32(p + body + 8, big)
                    cap = rd32(p + body + 12, big)
                    orig = rd32(p + body + 16, big)
                if iface >= <uint32_t>len(self._ifaces) or cap > end - body - 20:
                    raise CaptureError(f"bad pcapng packet block at byte {self._file_offset + pos}")
                link, res = self._ifaces[iface]
                ms = ts_ms((<uint64_t>hi << 32) | lo, res)  # -1 (out of range): a bad time stamp (_packet)
                self._packet(link, p, body + 20, body + 20 + cap, orig, ms)
            elif btype == 3:
                self.st[S_PACKETS] += 1
                self.st[S_MALFORMED] += 1
            pos += blen
        return pos

    cdef int _tsresol(self, const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, bint big):
        cdef uint32_t code, length
        while end - pos >= 4:
            code = rd16(p + pos, big)
            length = rd16(p + pos + 2, big)
            if code == 0:
                break
            if code == 9 and length >= 1:
                return p[pos + 4]
            pos += 4 + length + ((4 - length % 4) % 4)
        return 6

    def end_file(self, leftover=0):
        """The current file ended with ``leftover`` unused bytes (counted); the next feed starts a new file."""
        if self._fmt == 0 and leftover:
            raise CaptureError(f"not a pcap or pcapng file ({leftover} bytes) at byte 0")
        if leftover:
            self.st[S_TRUNCATED_TAILS] += 1
        self._reset_file()

    def finish(self):
        """End of the input: holes still open are lost, partial frames left are counted (tail_bytes)."""
        cdef _Flow flow
        cdef _Dir d
        for flow in self._flows.values():
            self._close_dir(flow, 0, flow.d0.last_ms)
            self._close_dir(flow, 1, flow.d1.last_ms)

    # -- packet level --
    cdef inline bint _in_time(self, long long ms):
        if self._time_ms < 0 or llabs(ms - self._time_ms) <= self.max_time_jump_ms:
            self._time_ms = ms
            self._jumps = 0
            return True
        if self._jumps and llabs(ms - self._jump_ms) <= self.max_time_jump_ms:
            self._jumps += 1
        else:
            self._jumps = 1
        self._jump_ms = ms
        if self._jumps >= C_TIME_JUMP_AGREE:  # a stream at the new time: it is the file's time now
            self._time_ms = ms
            self._jumps = 0
            return True
        return False

    cdef int _packet(self, int link, const unsigned char* data, Py_ssize_t pos, Py_ssize_t end, uint32_t orig_len,
                     long long ms) except -1:
        cdef long long* st = self.st
        cdef unsigned int etype, fam_le, fam_be, fam, v
        cdef Py_ssize_t ihl, total, ip_end, plen, hlen, doff, payload_len, have
        cdef int family, nh, frag, proto, k, alen
        cdef unsigned int sport, dport, flags
        cdef uint32_t seq
        st[S_PACKETS] += 1
        if ms < self.min_time_ms or ms > self.max_time_ms:
            st[S_BAD_TIME] += 1
            return 0
        if not self._in_time(ms):
            st[S_TIME_JUMP] += 1
            return 0
        if self.first_packet_ms < 0:
            self.first_packet_ms = ms
        self.last_packet_ms = ms
        if link == 1:
            if end - pos < 14:
                st[S_MALFORMED] += 1
                return 0
            etype = (data[pos + 12] << 8) | data[pos + 13]
            pos += 14
            for k in range(2):
                if (etype == 0x8100 or etype == 0x88A8) and end - pos >= 4:
                    etype = (data[pos + 2] << 8) | data[pos + 3]
                    pos += 4
        elif link == 113:
            if end - pos < 16:
                st[S_MALFORMED] += 1
                return 0
            etype = (data[pos + 14] << 8) | data[pos + 15]
            pos += 16
        elif link == 276:
            if end - pos < 20:
                st[S_MALFORMED] += 1
                return 0
            etype = (data[pos] << 8) | data[pos + 1]
            pos += 20
        elif link == 101 or link == 228 or link == 229:
            if end - pos < 1:
                st[S_MALFORMED] += 1
                return 0
            v = data[pos] >> 4
            etype = 0x0800 if v == 4 else (0x86DD if v == 6 else 0)
        elif link == 0 or link == 108:
            if end - pos < 4:
                st[S_MALFORMED] += 1
                return 0
            fam_le = rd32(data + pos, False)
            fam_be = be32(data + pos)
            fam = fam_be if link == 108 else (fam_le if fam_le < 65536 else fam_be)
            etype = 0x0800 if fam == 2 else (0x86DD if (fam == 10 or fam == 24 or fam == 28 or fam == 30) else 0)
            pos += 4
        else:
            st[S_UNSUPPORTED_LINK] += 1
            return 0
        if etype == 0x0800:
            if end - pos < 20 or data[pos] >> 4 != 4:
                st[S_MALFORMED] += 1
                return 0
            ihl = (data[pos] & 15) * 4
            total = (data[pos + 2] << 8) | data[pos + 3]
            if total == 0:
                total = end - pos
            if ihl < 20 or total < ihl:
                st[S_MALFORMED] += 1
                return 0
            frag = ((data[pos + 6] << 8) | data[pos + 7]) & 0x3FFF
            proto = data[pos + 9]
            if proto != 6:
                st[S_NON_TCP] += 1
                return 0
            if frag:
                st[S_FRAGMENTS] += 1
                return 0
            if end - pos < ihl:
                st[S_MALFORMED] += 1
                return 0
            family = 4
            alen = 4
            ip_end = pos + total
            k = pos + 12  # src, then dst at k + 4
            pos += ihl
        elif etype == 0x86DD:
            if end - pos < 40 or data[pos] >> 4 != 6:
                st[S_MALFORMED] += 1
                return 0
            plen = (data[pos + 4] << 8) | data[pos + 5]
            nh = data[pos + 6]
            family = 6
            alen = 16
            k = pos + 8
            ip_end = pos + 40 + plen if plen else end
            pos += 40
            while nh == 0 or nh == 43 or nh == 60 or nh == 51 or nh == 44:
                if nh == 44:
                    st[S_FRAGMENTS] += 1
                    return 0
                if end - pos < 8:
                    st[S_MALFORMED] += 1
                    return 0
                hlen = (data[pos + 1] + 2) * 4 if nh == 51 else (data[pos + 1] + 1) * 8
                nh = data[pos]
                pos += hlen
            if nh != 6:
                st[S_NON_TCP] += 1
                return 0
        else:
            st[S_NON_TCP] += 1
            return 0
        if end - pos < 20:
            st[S_MALFORMED] += 1
            return 0
        sport = (data[pos] << 8) | data[pos + 1]
        dport = (data[pos + 2] << 8) | data[pos + 3]
        seq = be32(data + pos + 4)
        doff = (data[pos + 12] >> 4) * 4
        flags = data[pos + 13]
        if doff < 20 or end - pos < doff or ip_end - pos < doff:
            st[S_MALFORMED] += 1
            return 0
        st[S_TCP] += 1
        if self._has_ports and not (self._port_set[sport >> 3] & (1 << (sport & 7))) \
                and not (self._port_set[dport >> 3] & (1 << (dport & 7))):
            st[S_FILTERED] += 1
            return 0
        payload_len = ip_end - pos - doff
        have = (end if end < ip_end else ip_end) - pos - doff
        if have < payload_len:
            st[S_TRUNCATED] += 1
        if have < 0:
            have = 0
        self._segment(family, data + k, sport, data + k + alen, dport, alen, seq, flags, data + pos + doff, have,
                      payload_len, ms)
        return 0

    # -- connection level --
    cdef _Flow _flow(self, int family, const unsigned char* src, unsigned int sport, const unsigned char* dst,
                     unsigned int dport, int alen, unsigned int flags, uint32_t seq, long long ms, int* side_out):
        cdef unsigned char a[18]
        cdef unsigned char b[18]
        cdef unsigned char key[37]
        cdef int cmp = 0, i, side
        cdef _Flow flow
        memcpy(a, src, alen)
        a[alen] = sport >> 8
        a[alen + 1] = sport & 0xFF
        memcpy(b, dst, alen)
        b[alen] = dport >> 8
        b[alen + 1] = dport & 0xFF
        for i in range(alen + 2):
            if a[i] != b[i]:
                cmp = -1 if a[i] < b[i] else 1
                break
        key[0] = 4 if family == 4 else 6
        if cmp <= 0:
            side = 0
            memcpy(key + 1, a, alen + 2)
            memcpy(key + 3 + alen, b, alen + 2)
        else:
            side = 1
            memcpy(key + 1, b, alen + 2)
            memcpy(key + 3 + alen, a, alen + 2)
        side_out[0] = side
        cdef int klen = 1 + 2 * (alen + 2)
        if self._shard_n > 1 and conn_hash_c(key, klen, 0) % self._shard_n != self._shard_i:
            return None
        self._tick += 1
        if klen == self._last_klen and memcmp(key, self._last_key, klen) == 0:
            flow = <_Flow>self._last_flow
            if not ((flags & 0x12) == 0x02 and (flow.closed or flow.data_seen
                                                or (flow.syn_isn != -1 and flow.syn_isn != seq))):
                flow.touched = self._tick
                return flow
        kb = PyBytes_FromStringAndSize(<char*>key, klen)
        found = self._flows.get(kb)
        if found is not None:
            flow = <_Flow>found
            if not ((flags & 0x12) == 0x02 and (flow.closed or flow.data_seen
                                                or (flow.syn_isn != -1 and flow.syn_isn != seq))):
                memcpy(self._last_key, key, klen)
                self._last_klen = klen
                self._last_flow = flow
                flow.touched = self._tick
                return flow
            gen = flow.gen + 1
            self._held -= held_by(flow)
            del self._flows[kb]
        else:
            gen = self._generation.pop(kb, -1) + 1
            if len(self._flows) >= self.max_connections:
                self._make_room(ms)
        fam = socket.AF_INET if family == 4 else socket.AF_INET6
        flow = _Flow.__new__(_Flow)
        flow.key = kb
        flow.conn_id = <long long>conn_hash_c(key, 1 + 2 * (alen + 2), <uint32_t>gen)
        if side == 0:
            aa = addr_text(fam, bytes(src[:alen]), sport)
            ab = addr_text(fam, bytes(dst[:alen]), dport)
        else:
            aa = addr_text(fam, bytes(dst[:alen]), dport)
            ab = addr_text(fam, bytes(src[:alen]), sport)
        flow.addr = (aa, ab)
        flow.addr0 = aa.encode()
        flow.addr1 = ab.encode()
        flow.d0 = _Dir()
        flow.d1 = _Dir()
        flow.client = -1
        flow.syn_isn = -1
        flow.gen = gen
        flow.touched = flow.placed = self._tick
        self._flows[kb] = flow
        self.st[S_CONNECTIONS] += 1
        memcpy(self._last_key, key, klen)
        self._last_klen = klen
        self._last_flow = flow
        return flow

    cdef _make_room(self, long long ms):
        """Drop the connection touched least recently (see the twin)."""
        cdef _Flow flow
        flows = self._flows
        while True:
            key, f = flows.popitem(last=False)
            flow = <_Flow>f
            if flow.touched > flow.placed:
                flow.placed = self._tick
                flows[key] = flow
                continue
            break
        if flow is self._last_flow:
            self._last_flow = None
            self._last_klen = 0
        if not flow.closed:
            self.st[S_EVICTED] += 1
            self._damage("connections_evicted", ms)
            self._close_dir(flow, 0, flow.d0.last_ms)
            self._close_dir(flow, 1, flow.d1.last_ms)
        self._generation[key] = flow.gen
        if len(self._generation) > self.max_connections:
            self._generation.popitem(last=False)

    cdef _damage(self, str kind, long long ms):
        if ms < 0:
            return
        t = self.damage_times.get(kind)
        if t is None:
            self.damage_times[kind] = [ms, ms]
        else:
            t[0], t[1] = min(t[0], ms), max(t[1], ms)

    cdef int _segment(self, int family, const unsigned char* src, unsigned int sport, const unsigned char* dst,
                      unsigned int dport, int alen, uint32_t seq32, unsigned int flags, const unsigned char* payload,
                      Py_ssize_t have, Py_ssize_t payload_len, long long ms) except -1:
        cdef int side
        cdef _Flow flow = self._flow(family, src, sport, dst, dport, alen, flags, seq32, ms, &side)
        if flow is None:
            return 0
        cdef _Dir d = flow.d0 if side == 0 else flow.d1
        cdef long long* st = self.st
        cdef long long seq = seq32
        cdef long long dd, aseq
        if flow.closed:
            if payload_len:
                st[S_AFTER_CLOSE] += 1
            return 0
        if flags & 0x02:
            if not (flags & 0x10):
                flow.client = side
                if flow.syn_isn < 0:
                    self._event(ms, flow, "open", side)
                flow.syn_isn = seq32
            elif flow.client < 0:
                flow.client = 1 - side
            if not d.init or (not flow.data_seen and not d.buf.n and not d.pending):
                d.init = True
                d.nxt = seq + 1
                d.sync = True
            seq += 1
        if not d.init:
            if payload_len or flags & 0x01:
                d.init = True
                d.nxt = seq
                d.sync = False
                if not flow.data_seen:
                    st[S_MIDSTREAM] += 1
            else:
                if flags & 0x04:
                    self._end(flow, side, ms, "rst")
                return 0
        dd = (seq - d.nxt) & 0xFFFFFFFF
        if dd >= 0x80000000:
            dd -= 0x100000000
        aseq = d.nxt + dd
        if payload_len:
            flow.data_seen = True
            self._data(flow, side, d, aseq, payload, have, payload_len, ms)
        elif d.nxt < aseq < d.nxt + 0x40000000:
            self._pending_put(d, aseq, b"", ms)
        if d.pending and self._overdue(d, ms):
            self._expire(flow, side, d, ms)
        if flags & 0x04:
            self._end(flow, side, ms, "rst")
        elif flags & 0x01:
            if side == 0:
                flow.fin0 = True
            else:
                flow.fin1 = True
            if not flow.ended:
                self._end(flow, side, ms, "fin")
            if flow.fin0 and flow.fin1:
                self._close(flow, ms)
        if self._held > self.max_buffered_bytes:
            self._shed(ms)
        return 0

    cdef int _data(self, _Flow flow, int side, _Dir d, long long aseq, const unsigned char* payload, Py_ssize_t have,
                   Py_ssize_t payload_len, long long ms) except -1:
        cdef long long end = aseq + payload_len
        cdef long long cut
        if end <= d.nxt:
            self.st[S_RETRANS] += 1
            self.st[S_RETRANS_BYTES] += payload_len
        elif aseq <= d.nxt:
            if aseq < d.nxt:
                self.st[S_RETRANS] += 1
                self.st[S_RETRANS_BYTES] += d.nxt - aseq
            cut = d.nxt - aseq
            if have > cut:
                self._deliver(flow, side, d, payload + cut, have - cut, ms)
            if have < payload_len:
                self._declare_hole(flow, side, d, ms, end)
            if d.pending:
                self._drain(flow, side, d, ms)
        else:
            self.st[S_OOO] += 1
            self._pending_put(d, aseq, PyBytes_FromStringAndSize(<const char*>payload, have), ms)
        return 0

    cdef bint _overdue(self, _Dir d, long long ms):
        return (d.pending_bytes > self.max_pending_bytes or len(d.pending) > self.max_pending_segments
                or ms - d.hole_since > self.reorder_window_ms)

    cdef _expire(self, _Flow flow, int side, _Dir d, long long ms):
        while d.pending and self._overdue(d, ms):
            self._declare_hole(flow, side, d, ms, -1)

    cdef _pending_put(self, _Dir d, long long aseq, bytes data, long long ms):
        cdef Py_ssize_t grow
        old = d.pending.get(aseq)
        if old is None or len(old[0]) < len(data):
            if old is None:
                heapq.heappush(d.keys, aseq)
            if len(data) and (old is None or not len(old[0])):
                heapq.heappush(d.data_keys, aseq)
            grow = len(data) - (len(old[0]) if old is not None else 0)
            d.pending_bytes += grow
            self._held += grow
            d.pending[aseq] = (data, ms)
            if len(d.times) > 2 * len(d.pending) + 16:
                d.times = [(v[1], k) for k, v in d.pending.items()]
                heapq.heapify(d.times)
            else:
                heapq.heappush(d.times, (ms, aseq))
        if d.hole_since < 0:
            d.hole_since = ms

    cdef int _drain(self, _Flow flow, int side, _Dir d, long long ms) except -1:
        cdef long long first, t, end, cut
        cdef bytes data
        while d.keys and <long long>d.keys[0] <= d.nxt:
            first = heapq.heappop(d.keys)
            data, t = d.pending.pop(first)
            if d.data_keys and <long long>d.data_keys[0] == first:
                heapq.heappop(d.data_keys)
            d.pending_bytes -= len(data)
            self._held -= len(data)
            if not d.pending:
                d.hole_since = -1
                d.times.clear()
            if ms > t:
                t = ms
            end = first + len(data)
            if end > d.nxt:
                cut = d.nxt - first
                if cut:
                    self.st[S_RETRANS] += 1
                    self.st[S_RETRANS_BYTES] += cut
                self._deliver(flow, side, d, <const unsigned char*>PyBytes_AS_STRING(data) + cut, len(data) - cut, t)
            elif len(data):
                self.st[S_RETRANS] += 1
                self.st[S_RETRANS_BYTES] += len(data)
        return 0

    cdef _cut_buffer(self, _Dir d, long long gap_end):
        cdef long long frame_end
        if d.sync:
            if d.buf.n:
                self.st[S_FRAMES_CUT] += 1
                self.st[S_DISCARDED] += d.buf.n
                if d.buf.n >= 4:
                    frame_end = d.nxt - d.buf.n + 4 + be32(<const unsigned char*>d.buf.p)
                    if frame_end > gap_end:
                        d.skip_to = frame_end
        else:
            self.st[S_DISCARDED] += d.buf.n
        self._held -= d.buf.n
        d.buf.n = 0
        d.passing = False
        if d.skip_to >= 0 and d.skip_to <= gap_end:
            d.skip_to = -1
        d.sync = False
        d.searching_after_loss = True

    cdef int _declare_hole(self, _Flow flow, int side, _Dir d, long long ms, long long missing_end) except -1:
        cdef long long gap_end
        cdef long long first_after
        if missing_end >= 0:
            gap_end = missing_end
        else:
            gap_end = d.data_keys[0] if d.data_keys else max(d.pending)
        entry = d.pending.get(gap_end)
        first_after = entry[1] if entry is not None else (ms if ms > 0 else 0)
        self.st[S_HOLES] += 1
        self.st[S_HOLE_BYTES] += gap_end - d.nxt
        self._losses.append((flow.conn_id, flow.addr[flow.client] if flow.client >= 0 else flow.addr[side],
                             "?" if flow.client < 0 else ("c2s" if side == flow.client else "s2c"),
                             d.last_ms if d.last_ms >= 0 else first_after, first_after, gap_end - d.nxt))
        self._cut_buffer(d, gap_end)
        d.nxt = gap_end
        if not d.pending:
            d.hole_since = -1
        self._drain(flow, side, d, -1)
        if d.pending:
            times = d.times
            pending = d.pending
            while times and (times[0][1] not in pending or pending[times[0][1]][1] != times[0][0]):
                heapq.heappop(times)
            d.hole_since = times[0][0]
        return 0

    cdef _shed(self, long long ms):
        cdef _Flow flow
        cdef _Dir d
        cdef long long before
        held = []
        for i, f in enumerate(self._flows.values()):
            flow = <_Flow>f
            if flow.d0.buf.n or flow.d0.pending_bytes:
                held.append((flow.d0.buf.n + flow.d0.pending_bytes, i, 0, flow))
            if flow.d1.buf.n or flow.d1.pending_bytes:
                held.append((flow.d1.buf.n + flow.d1.pending_bytes, i, 1, flow))
        held.sort(key=lambda x: (-x[0], x[1], x[2]))
        for _, _, side, f in held:
            if self._held <= self.max_buffered_bytes // 2:
                break
            flow = <_Flow>f
            d = flow.d0 if side == 0 else flow.d1
            before = self._held
            while d.pending:
                self._declare_hole(flow, side, d, ms, -1)
            if d.buf.n:
                self._cut_buffer(d, d.nxt)
            self.st[S_SHED] += 1
            self.st[S_SHED_BYTES] += before - self._held
            self._damage("buffers_shed", ms)

    cdef _close_dir(self, _Flow flow, int side, long long ms):
        cdef _Dir d = flow.d0 if side == 0 else flow.d1
        while d.pending:
            self._declare_hole(flow, side, d, ms, -1)
        if d.buf.n:
            self.st[S_TAIL_BYTES] += d.buf.n
            self._held -= d.buf.n
            d.buf.n = 0

    cdef int _deliver(self, _Flow flow, int side, _Dir d, const unsigned char* data, Py_ssize_t n,
                      long long ms) except -1:
        cdef long long cut
        cdef Py_ssize_t used, before
        if d.skip_to >= 0:
            if d.nxt + n <= d.skip_to:
                if not d.passing:
                    self.st[S_DISCARDED] += n
                d.nxt += n
                d.last_ms = ms
                return 0
            cut = d.skip_to - d.nxt
            if not d.passing:
                self.st[S_DISCARDED] += cut
            data += cut
            d.nxt += cut
            n -= cut
            d.skip_to = -1
            d.passing = False
        d.nxt += n
        d.last_ms = ms
        before = d.buf.n
        if d.buf.n == 0 and d.sync:
            # the common case: whole frames straight from the packet, only a partial tail is buffered
            used = self._frames(flow, side, d, data, n, ms)
            if used < n:
                buf_put(&d.buf, data + used, n - used)
            self._held += d.buf.n - before
            return 0
        buf_put(&d.buf, data, n)
        used = self._frames(flow, side, d, <const unsigned char*>d.buf.p, d.buf.n, ms)
        if used:
            if used < d.buf.n:
                memmove(d.buf.p, d.buf.p + used, d.buf.n - used)
            d.buf.n -= used
        self._held += d.buf.n - before
        return 0

    cdef Py_ssize_t _frames(self, _Flow flow, int side, _Dir d, const unsigned char* buf, Py_ssize_t n,
                            long long ms) except -1:
        cdef Py_ssize_t pos = 0, i
        cdef long long total, hl
        cdef long long limit = self.max_frame_size
        cdef int status
        while True:
            if not d.sync:
                status = self._search(buf, pos, n, &i)
                self.st[S_DISCARDED] += i - pos
                pos = i
                if status != SEARCH_YES:
                    break
                d.sync = True
                if d.searching_after_loss:
                    self.st[S_RESYNCS] += 1
                d.searching_after_loss = False
            if n - pos < 4:
                break
            total = <int32_t>be32(buf + pos)
            if total < 4 or total + 4 > limit:
                self.st[S_BAD_LENGTHS] += 1
                d.sync = False
                d.searching_after_loss = True
                continue
            if n - pos < 8:
                break
            hl = (buf[pos + 5] << 16) | (buf[pos + 6] << 8) | buf[pos + 7]
            if buf[pos + 4] > 1 or hl > total - 4:
                self.st[S_BAD_LENGTHS] += 1
                d.sync = False
                d.searching_after_loss = True
                continue
            if 4 + total > self.max_record_bytes:  # not buffered: its header says what it is, its bytes pass
                if hl <= C_MAX_HEADER_BYTES and n - pos < 8 + hl:
                    break
                self._large_frame(buf + pos, hl, ms)
                if n - pos >= 4 + total:
                    pos += 4 + total
                else:
                    d.skip_to = d.nxt - (n - pos) + 4 + total
                    d.passing = True
                    pos = n
                    break
                continue
            if n - pos < 4 + total:
                break
            self._frame(flow, side, buf + pos, 4 + total, ms)
            pos += 4 + total
        return pos

    cdef int _large_frame(self, const unsigned char* f, long long hl, long long ms) except -1:
        cdef int code = 0, flag = 0, lang = 0, version = 0
        cdef bint ok = False
        self.st[S_FRAMES] += 1
        if hl <= C_MAX_HEADER_BYTES:
            if f[4] == 0 and fast_json(f + 8, hl, &code, &flag, &lang, &version):
                ok = True
            elif f[4] == 1 and hl == 21 and be32(f + 21) == 0 and be32(f + 25) == 0:
                ok = True
                code = <short>((f[8] << 8) | f[9])
                flag = <int32_t>be32(f + 17)
            else:
                head = (4 + hl).to_bytes(4, "big") + PyBytes_FromStringAndSize(<const char*>f + 4, 4 + hl)
                try:
                    cmd = self._decode_frame(head, self.max_frame_size)
                    code = cmd.code
                    flag = cmd.flag
                    ok = True
                except FrameError:
                    pass
        if not ok:
            self.st[S_FRAMES_BAD] += 1
        elif not flag & 1 and (code == 34 or code == 35 or code == 40):
            self.st[S_RECORDS_TOO_LARGE] += 1
            self._damage("records_too_large", ms)
        return 0

    cdef int _search(self, const unsigned char* buf, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t* at) except -1:
        cdef long long limit = self.max_frame_size
        cdef Py_ssize_t i, avail
        cdef long long total, hl
        cdef int stype, code, flag, lang, version
        for i in range(pos, n):
            avail = n - i
            if avail < 4:
                if buf[i] == 0 or limit > 0x1000000:
                    at[0] = i
                    return SEARCH_MORE
                continue
            total = <int32_t>be32(buf + i)
            if total < 4 or total + 4 > limit:
                continue
            if avail < 5:
                at[0] = i
                return SEARCH_MORE
            stype = buf[i + 4]
            if stype > 1:
                continue
            if avail < 8:
                at[0] = i
                return SEARCH_MORE
            hl = (buf[i + 5] << 16) | (buf[i + 6] << 8) | buf[i + 7]
            if hl > total - 4 or (stype == 0 and hl < 2) or (stype == 1 and hl < 21) or hl > C_SEARCH_HEADER_BYTES:
                continue
            if stype == 0 and avail >= 9 and buf[i + 8] != 0x7B:
                continue
            if avail < 8 + hl:
                at[0] = i
                return SEARCH_MORE
            if stype == 0 and fast_json(buf + i + 8, hl, &code, &flag, &lang, &version):
                at[0] = i
                return SEARCH_YES
            if stype == 1 and hl == 21 and be32(buf + i + 21) == 0 and be32(buf + i + 25) == 0:
                at[0] = i
                return SEARCH_YES
            head = (4 + hl).to_bytes(4, "big") + PyBytes_FromStringAndSize(<const char*>buf + i + 4, 4 + hl)
            try:
                self._decode_frame(head, limit)
            except FrameError:
                continue
            at[0] = i
            return SEARCH_YES
        at[0] = n
        return SEARCH_NO

    cdef int _frame(self, _Flow flow, int side, const unsigned char* f, Py_ssize_t n, long long ms) except -1:
        cdef long long* st = self.st
        cdef Py_ssize_t hl = (f[5] << 16) | (f[6] << 8) | f[7]
        cdef int code = 0, flag = 0, lang = 0, version = 0
        cdef bint ok = False
        cdef int64_t v64
        cdef int32_t v32, off
        cdef uint8_t l8
        cdef bytes ab
        st[S_FRAMES] += 1
        if f[4] == 0:
            ok = fast_json(f + 8, hl, &code, &flag, &lang, &version)
        elif hl == 21 and be32(f + 21) == 0 and be32(f + 25) == 0:
            ok = True
            code = <short>((f[8] << 8) | f[9])
            lang = f[10] if f[10] <= 13 else 255
            version = <short>((f[11] << 8) | f[12])
            flag = <int32_t>be32(f + 17)
        if ok and (flag & 1 or (code != 34 and code != 35 and code != 40)):
            return 0
        if ok and code == 34:
            st[S_HEARTBEATS] += 1
            flow.client = side
            v64 = ms
            buf_put(&self.o_recv, &v64, 8)
            v64 = flow.conn_id
            buf_put(&self.o_conn, &v64, 8)
            v32 = version
            buf_put(&self.o_ver, &v32, 4)
            l8 = <uint8_t>lang
            buf_put(&self.o_lang, &l8, 1)
            ab = flow.addr0 if side == 0 else flow.addr1
            buf_put(&self.o_addr, PyBytes_AS_STRING(ab), PyBytes_GET_SIZE(ab))
            off = <int32_t>self.o_addr.n
            buf_put(&self.o_addr_off, &off, 4)
            buf_put(&self.o_body, f + 8 + hl, n - 8 - hl)
            off = <int32_t>self.o_body.n
            buf_put(&self.o_body_off, &off, 4)
            self.o_n += 1
            return 0
        try:
            cmd = self._decode_frame(PyBytes_FromStringAndSize(<const char*>f, n), self.max_frame_size)
        except FrameError:
            st[S_FRAMES_BAD] += 1
            return 0
        if cmd.flag & 1:
            return 0
        code = cmd.code
        if code == 34:
            st[S_HEARTBEATS] += 1
            flow.client = side
            v64 = ms
            buf_put(&self.o_recv, &v64, 8)
            v64 = flow.conn_id
            buf_put(&self.o_conn, &v64, 8)
            v32 = cmd.version
            buf_put(&self.o_ver, &v32, 4)
            l8 = 255 if cmd.language is None else int(cmd.language)
            buf_put(&self.o_lang, &l8, 1)
            ab = flow.addr0 if side == 0 else flow.addr1
            buf_put(&self.o_addr, PyBytes_AS_STRING(ab), PyBytes_GET_SIZE(ab))
            off = <int32_t>self.o_addr.n
            buf_put(&self.o_addr_off, &off, 4)
            body = cmd.body
            buf_put(&self.o_body, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body))
            off = <int32_t>self.o_body.n
            buf_put(&self.o_body_off, &off, 4)
            self.o_n += 1
        elif code == 35:
            st[S_UNREGISTERS] += 1
            flow.client = side
            ext = cmd.ext_fields or {}
            self._events.append((ms, flow.conn_id, "unregister", flow.addr[side], "client", ext.get("clientID"),
                                 ext.get("producerGroup"), ext.get("consumerGroup")))
        elif code == 40:
            st[S_NOTIFIES] += 1
            if flow.client < 0:
                flow.client = 1 - side
            ext = cmd.ext_fields or {}
            self._events.append((ms, flow.conn_id, "notify", flow.addr[1 - side], "server", None, None,
                                 ext.get("consumerGroup")))
        return 0

    cdef _event(self, long long ms, _Flow flow, str kind, int side):
        cdef int client = flow.client if flow.client >= 0 else side
        self._events.append((ms, flow.conn_id, kind, flow.addr[client], "client" if side == client else "server",
                             None, None, None))

    cdef _end(self, _Flow flow, int side, long long ms, str kind):
        cdef int client
        if not flow.ended:
            flow.ended = True
            if flow.client < 0:
                pa = int(flow.addr[0].rsplit(":", 1)[1])
                pb = int(flow.addr[1].rsplit(":", 1)[1])
                client = 0 if pa > pb else 1
            else:
                client = flow.client
            self._events.append((ms, flow.conn_id, kind, flow.addr[client], "client" if side == client else "server",
                                 None, None, None))
        if kind == "rst":
            self._close(flow, ms)

    cdef _close(self, _Flow flow, long long ms):
        cdef _Dir d
        for side in (0, 1):
            self._close_dir(flow, side, ms)
            d = flow.d0 if side == 0 else flow.d1
            free(d.buf.p)  # a closed connection keeps only its identity (late packets are ignored)
            d.buf.p = NULL
            d.buf.cap = 0
        flow.closed = True


cdef long long ts_ms(uint64_t ts, int res) except? -2:
    """Milliseconds of a pcapng time stamp in units of if_tsresol, -1 when out of range."""
    if res == 6:
        return <long long>(ts // 1000)
    if res == 9:
        return <long long>(ts // 1000000)
    cdef object t = ts
    if res & 0x80:
        t = (t * 1000) >> (res & 0x7F)
    elif res >= 3:
        t = t // (10 ** (res - 3))
    else:
        t = t * (10 ** (3 - res))
    return t if t < 2 ** 62 else -1

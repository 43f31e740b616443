"""RFC 7541 HPACK, the header compression of HTTP/2: pure-Python twin of ``engine.http2._hpack`` (pyx/http2/).

Both give the same output or raise the same ``HpackError`` (message included) for the same input; the facade
``engine.http2`` picks one. Everything a peer sends is untrusted, so decoding is linear in the block and bounded:

* integers: at most ``MAX_INTEGER`` (2^31 - 1) and ``MAX_INTEGER_BYTES`` continuation bytes after the prefix;
* the dynamic table: at most ``max_table_size`` (our SETTINGS_HEADER_TABLE_SIZE) bytes as RFC 7541 4.1 counts them
  (name + value + 32 per entry); a size update above it, or after the block's first field, is an error;
* the header list: past ``max_header_list_size`` (name + value + 32 per field, RFC 7540 6.5.2) the decoder stops
  with an error (the connection ends: the table is not kept in sync past it), so a block's output never costs
  more than that budget whatever the references it repeats;
* Huffman strings (RFC 7541 5.2): EOS inside a string, padding longer than 7 bits or not all ones are errors.

Decoding errors name the byte offset in the block where the faulty representation starts and never echo it.
"""
from collections import deque

from engine.codec.errors import RemotingError
from engine.http2._frames_py import header_value, scan_request_headers

__all__ = ["HpackDecoder", "HpackEncoder", "HpackError", "DEFAULT_MAX_TABLE_SIZE", "DEFAULT_MAX_HEADER_LIST_SIZE"]


class HpackError(RemotingError, ValueError):
    """A malformed or over-budget header block: a COMPRESSION_ERROR (RFC 7540 4.3), the connection ends with GOAWAY.
    One class for both builds (the native module raises this one)."""


#: RFC 7540 6.5.2 SETTINGS_HEADER_TABLE_SIZE default, and the header list budget our SETTINGS announce by default
DEFAULT_MAX_TABLE_SIZE = 4096
DEFAULT_MAX_HEADER_LIST_SIZE = 16384
#: RFC 7541 4.1: the per-entry overhead of the table size (and of the header list size, RFC 7540 6.5.2)
ENTRY_OVERHEAD = 32
#: the largest integer a peer may send (a length, an index, a table size)
MAX_INTEGER = 2**31 - 1
#: continuation bytes after an integer's prefix: 5 carry 35 bits, more than MAX_INTEGER needs; more is an attack
MAX_INTEGER_BYTES = 5

#: RFC 7541 Appendix A: the static table, indexes 1..61
STATIC_TABLE = (
    (b':authority', b''),
    (b':method', b'GET'),
    (b':method', b'POST'),
    (b':path', b'/'),
    (b':path', b'/index.html'),
    (b':scheme', b'http'),
    (b':scheme', b'https'),
    (b':status', b'200'),
    (b':status', b'204'),
    (b':status', b'206'),
    (b':status', b'304'),
    (b':status', b'400'),
    (b':status', b'404'),
    (b':status', b'500'),
    (b'accept-charset', b''),
    (b'accept-encoding', b'gzip, deflate'),
    (b'accept-language', b''),
    (b'accept-ranges', b''),
    (b'accept', b''),
    (b'access-control-allow-origin', b''),
    (b'age', b''),
    (b'allow', b''),
    (b'authorization', b''),
    (b'cache-control', b''),
    (b'content-disposition', b''),
    (b'content-encoding', b''),
    (b'content-language', b''),
    (b'content-length', b''),
    (b'content-location', b''),
    (b'content-range', b''),
    (b'content-type', b''),
    (b'cookie', b''),
    (b'date', b''),
    (b'etag', b''),
    (b'expect', b''),
    (b'expires', b''),
    (b'from', b''),
    (b'host', b''),
    (b'if-match', b''),
    (b'if-modified-since', b''),
    (b'if-none-match', b''),
    (b'if-range', b''),
    (b'if-unmodified-since', b''),
    (b'last-modified', b''),
    (b'link', b''),
    (b'location', b''),
    (b'max-forwards', b''),
    (b'proxy-authenticate', b''),
    (b'proxy-authorization', b''),
    (b'range', b''),
    (b'referer', b''),
    (b'refresh', b''),
    (b'retry-after', b''),
    (b'server', b''),
    (b'set-cookie', b''),
    (b'strict-transport-security', b''),
    (b'transfer-encoding', b''),
    (b'user-agent', b''),
    (b'vary', b''),
    (b'via', b''),
    (b'www-authenticate', b''),
)

#: RFC 7541 Appendix B: (code, bit length) of symbols 0..255, then EOS (256)
HUFFMAN_CODES = (
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28),
    (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28),
    (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10),
    (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6),
    (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7),
    (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5),
    (0x25, 6), (0x26, 6), (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6), (0x76, 7),
    (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14),
    (0x1ffd, 13), (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22), (0x7fffda, 23),
    (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23),
    (0x7fffe2, 23), (0x7fffe3, 23), (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22),
    (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22),
    (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23),
    (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21),
    (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), (0x3fffea, 22), (0x3fffeb, 22),
    (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27),
    (0x7ffffe9, 27), (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), (0x3fffffff, 30),
)


def _huffman_tree():
    """The code tree: node 0 is the root; a child is an internal node (>= 0) or a symbol s as -1 - s."""
    nodes = [[None, None]]
    for sym, (code, length) in enumerate(HUFFMAN_CODES):
        node = 0
        for i in range(length - 1, 0, -1):
            bit = (code >> i) & 1
            if nodes[node][bit] is None:
                nodes.append([None, None])
                nodes[node][bit] = len(nodes) - 1
            node = nodes[node][bit]
        nodes[node][code & 1] = -1 - sym
    return nodes


def _huffman_fsm():
    """A 4-bit decoding automaton over the tree's 256 internal nodes (a nibble completes at most one symbol: the
    shortest code has 5 bits). HUFFMAN_FSM[state * 16 + nibble] is -1 when the nibble reaches EOS, else the next
    state | (symbol + 1) << 8 (symbol + 1 == 0: none). HUFFMAN_END[state]: 0 when a string may end there (the bits
    since the last symbol are 0-7 ones), 1 when they are 8 or more ones, 2 when they are not all ones."""
    nodes = _huffman_tree()
    assert len(nodes) == 256
    fsm = []
    for state in range(256):
        for nibble in range(16):
            node, sym = state, -1
            for i in (3, 2, 1, 0):
                child = nodes[node][(nibble >> i) & 1]
                if child >= 0:
                    node = child
                    continue
                if child == -257:  # EOS
                    node = -1
                    break
                assert sym < 0
                sym, node = -1 - child, 0
            fsm.append(-1 if node < 0 else node | ((sym + 1) << 8))
    end = [2] * 256
    node, depth = 0, 0
    while node >= 0:  # the all-ones path from the root towards EOS (30 ones)
        end[node] = 0 if depth <= 7 else 1
        node, depth = nodes[node][1], depth + 1
    return tuple(fsm), tuple(end)


HUFFMAN_FSM, HUFFMAN_END = _huffman_fsm()
_STATIC_FIELDS = {}
_STATIC_NAMES = {}
for _i, (_name, _value) in enumerate(STATIC_TABLE, 1):
    _STATIC_FIELDS.setdefault((_name, _value), _i)
    _STATIC_NAMES.setdefault(_name, _i)
del _i, _name, _value
#: fields the encoder never indexes (RFC 7541 7.1.3: credentials; a 5.x client's ACL signature changes every call),
#: and fields whose values change from one message to the next (indexing them would only churn the table)
NEVER_INDEXED = frozenset((b"authorization", b"proxy-authorization"))
NOT_INDEXED = frozenset((b"grpc-message", b"grpc-timeout", b"grpc-status-details-bin", b"content-length"))


def huffman_decode(data, start=0):
    """The symbols of a Huffman-coded string (``start``: its offset in the block, for the error message)."""
    fsm = HUFFMAN_FSM
    state = 0
    out = bytearray()
    for byte in data:
        e = fsm[(state << 4) | (byte >> 4)]
        if e < 0:
            raise HpackError(f"hpack: EOS inside a Huffman string at byte {start}")
        if e > 255:
            out.append((e >> 8) - 1)
        e = fsm[((e & 255) << 4) | (byte & 15)]
        if e < 0:
            raise HpackError(f"hpack: EOS inside a Huffman string at byte {start}")
        if e > 255:
            out.append((e >> 8) - 1)
        state = e & 255
    end = HUFFMAN_END[state]
    if end:
        raise HpackError(f"hpack: Huffman padding {'longer than 7 bits' if end == 1 else 'not all ones'} "
                         f"at byte {start}")
    return bytes(out)


def huffman_length(data):
    """Bytes of ``data`` Huffman-coded."""
    return (sum(HUFFMAN_CODES[b][1] for b in data) + 7) >> 3


def huffman_encode(data):
    out = bytearray()
    acc = bits = 0
    codes = HUFFMAN_CODES
    for b in data:
        code, length = codes[b]
        acc = (acc << length) | code
        bits += length
        while bits >= 8:
            bits -= 8
            out.append((acc >> bits) & 255)
        acc &= (1 << bits) - 1
    if bits:  # pad with the most significant bits of EOS (ones)
        out.append(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) & 255)
    return bytes(out)


def _read_int(block, pos, prefix_bits):
    """(value, position after it) of the integer whose first byte is block[pos] (RFC 7541 5.1)."""
    limit = (1 << prefix_bits) - 1
    value = block[pos] & limit
    start = pos
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    end = len(block)
    for _ in range(MAX_INTEGER_BYTES):
        if pos >= end:
            raise HpackError(f"hpack: integer cut short at byte {start}")
        b = block[pos]
        pos += 1
        value += (b & 127) << shift
        if value > MAX_INTEGER:
            raise HpackError(f"hpack: integer over 2^31-1 at byte {start}")
        if not b & 128:
            return value, pos
        shift += 7
    raise HpackError(f"hpack: integer longer than {MAX_INTEGER_BYTES + 1} bytes at byte {start}")


def _read_string(block, pos):
    """(bytes, position after it) of the string literal at block[pos] (RFC 7541 5.2)."""
    if pos >= len(block):
        raise HpackError(f"hpack: string missing at byte {pos}")
    huffman = block[pos] & 128
    n, start = _read_int(block, pos, 7)
    if n > len(block) - start:
        raise HpackError(f"hpack: string of {n} bytes past the block's end at byte {pos}")
    data = block[start : start + n]
    return (huffman_decode(data, pos) if huffman else data), start + n


class HpackDecoder:
    """The decoding context of one connection (RFC 7541 2.2): its dynamic table lives across header blocks, so
    blocks are decoded in the order they arrive. After an HpackError the connection ends: the table's state is
    then unspecified."""

    def __init__(self, max_table_size: int = DEFAULT_MAX_TABLE_SIZE,
                 max_header_list_size: int = DEFAULT_MAX_HEADER_LIST_SIZE):
        if max_table_size < 0 or max_header_list_size < 0:
            raise ValueError("hpack: table and header list sizes must be >= 0")
        self.max_table_size = max_table_size  # what a peer's size update may ask for at most
        self.max_header_list_size = max_header_list_size
        self.table_size_limit = max_table_size  # the size the peer's last update chose
        self.table_size = 0  # bytes in the table (RFC 7541 4.1)
        self._entries = deque()  # newest first: dynamic index 62 is _entries[0]

    @property
    def entries(self):
        """The dynamic table, newest first, as (name, value) pairs."""
        return list(self._entries)

    def _evict(self, limit):
        entries = self._entries
        while self.table_size > limit:
            name, value = entries.pop()
            self.table_size -= len(name) + len(value) + ENTRY_OVERHEAD

    def _add(self, name, value):
        size = len(name) + len(value) + ENTRY_OVERHEAD
        if size > self.table_size_limit:  # RFC 7541 4.4: an entry larger than the table empties it
            self._entries.clear()
            self.table_size = 0
            return
        self._evict(self.table_size_limit - size)
        self._entries.appendleft((name, value))
        self.table_size += size

    def _field(self, index, pos):
        if index == 0:
            raise HpackError(f"hpack: index 0 at byte {pos}")
        if index <= 61:
            return STATIC_TABLE[index - 1]
        if index - 62 >= len(self._entries):
            raise HpackError(f"hpack: index {index} past the table ({61 + len(self._entries)} entries) at byte {pos}")
        return self._entries[index - 62]

    def decode_unary(self, block, max_metadata: int) -> tuple:
        """``(fields, path, client_id)``: decode's fields; the :path when the list passes what a unary call's
        prepared path needs (engine.http2._frames_py.scan_request_headers' fields: a POST, a gRPC content-type, no
        grpc-encoding but identity, well-formed grpc-timeouts, its size within ``max_metadata``), else None; the first
        x-mq-client-id value (None without one). (The compiled build reads these from sizes and kinds it keeps beside
        the table's entries, without touching the fields.)"""
        fields = self.decode(block)
        size, path, content_type, encoding, _, bad = scan_request_headers(fields)
        if (bad or size > max_metadata or content_type is None or not content_type.startswith(b"application/grpc")
                or encoding not in (None, b"identity")):
            path = None
        return fields, path, header_value(fields, b"x-mq-client-id")

    def decode(self, block) -> list:
        """The (name, value) fields of one complete header block (HEADERS + CONTINUATION payloads joined)."""
        if not isinstance(block, bytes):
            block = bytes(block)
        out = []
        list_size = 0
        budget = self.max_header_list_size
        pos = 0
        end = len(block)
        while pos < end:
            start = pos
            b = block[pos]
            if b & 128:  # indexed field (6.1)
                index, pos = _read_int(block, pos, 7)
                name, value = self._field(index, start)
            elif b & 32 and not b & 64:  # dynamic table size update (6.3)
                if out:
                    raise HpackError(f"hpack: table size update after a header field at byte {start}")
                size, pos = _read_int(block, pos, 5)
                if size > self.max_table_size:
                    raise HpackError(f"hpack: table size update to {size} over the limit {self.max_table_size} "
                                     f"at byte {start}")
                self.table_size_limit = size
                self._evict(size)
                continue
            else:  # literal (6.2): with incremental indexing (01), without (0000) or never indexed (0001)
                index, pos = _read_int(block, pos, 6 if b & 64 else 4)
                if index:
                    name = self._field(index, start)[0]
                else:
                    name, pos = _read_string(block, pos)
                value, pos = _read_string(block, pos)
                if b & 64:
                    self._add(name, value)
            list_size += len(name) + len(value) + ENTRY_OVERHEAD
            if list_size > budget:
                raise HpackError(f"hpack: header list over {budget} bytes at byte {start}")
            out.append((name, value))
        return out


def _write_int(out, first, prefix_bits, value):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        out.append(first | value)
        return
    out.append(first | limit)
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)


def _write_string(out, data):
    n = huffman_length(data)
    if data and n <= len(data):  # Huffman unless longer (ties too, as RFC 7541 C.4 / C.6 do)
        _write_int(out, 128, 7, n)
        out += huffman_encode(data)
    else:
        _write_int(out, 0, 7, len(data))
        out += data


class HpackEncoder:
    """The encoding context of one connection. Fields of the static table are indexed; other fields are literals
    with incremental indexing (later repeats are one byte), except credentials (never indexed) and fields whose
    values vary per message (NOT_INDEXED: without indexing). Strings are Huffman-coded unless that is longer."""

    def __init__(self, max_table_size: int = DEFAULT_MAX_TABLE_SIZE):
        if max_table_size < 0:
            raise ValueError("hpack: table size must be >= 0")
        self.max_table_size = max_table_size  # the most we keep, whatever the peer allows
        self.table_size_limit = min(DEFAULT_MAX_TABLE_SIZE, max_table_size)
        self.table_size = 0
        self._entries = deque()  # newest first, as the peer's decoder holds them
        self._inserted = 0  # entries ever added: entry number k is at dynamic index 62 + _inserted - 1 - k
        self._fields = {}  # (name, value) -> number of its newest entry
        self._names = {}  # name -> number of its newest entry
        # the peer starts at 4096 (RFC 7540 6.5.2): a smaller table of ours is announced in the first block
        self._pending = (self.table_size_limit, self.table_size_limit) if max_table_size < 4096 else None

    @property
    def entries(self):
        """The dynamic table as the peer's decoder holds it, newest first."""
        return list(self._entries)

    def set_max_table_size(self, n: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: our table shrinks now if needed, and the next block starts with the
        size update(s) (RFC 7541 4.2: the smallest size since the last block, then the final one)."""
        if n < 0:
            raise ValueError("hpack: table size must be >= 0")
        size = min(n, self.max_table_size)
        if self._pending is None and size == self.table_size_limit:
            return
        low = size if self._pending is None else min(self._pending[0], size)
        self._pending = (low, size)
        self.table_size_limit = size
        self._evict(size)

    def _evict(self, limit):
        entries = self._entries
        while self.table_size > limit:
            name, value = entries.pop()
            number = self._inserted - len(entries) - 1
            if self._fields.get((name, value)) == number:
                del self._fields[(name, value)]
            if self._names.get(name) == number:
                del self._names[name]
            self.table_size -= len(name) + len(value) + ENTRY_OVERHEAD

    def _add(self, name, value, size):
        self._evict(self.table_size_limit - size)
        self._entries.appendleft((name, value))
        self._fields[(name, value)] = self._names[name] = self._inserted
        self._inserted += 1
        self.table_size += size

    def encode(self, headers) -> bytes:
        """One header block for ``headers``, a sequence of (name, value) bytes pairs (names lowercase, as HTTP/2
        wants them: the encoder does not check)."""
        out = bytearray()
        if self._pending is not None:
            low, size = self._pending
            if low < size:
                _write_int(out, 32, 5, low)
            _write_int(out, 32, 5, size)
            self._pending = None
        for name, value in headers:
            if not isinstance(name, bytes) or not isinstance(value, bytes):
                raise TypeError("hpack: header names and values must be bytes")
            index = _STATIC_FIELDS.get((name, value))
            if index is not None:
                _write_int(out, 128, 7, index)
                continue
            number = self._fields.get((name, value))
            if number is not None:
                _write_int(out, 128, 7, 62 + self._inserted - 1 - number)
                continue
            index = _STATIC_NAMES.get(name)
            if index is None:
                number = self._names.get(name)
                index = 0 if number is None else 62 + self._inserted - 1 - number
            size = len(name) + len(value) + ENTRY_OVERHEAD
            if name in NEVER_INDEXED:
                _write_int(out, 16, 4, index)
            elif name in NOT_INDEXED or size > self.table_size_limit:
                _write_int(out, 0, 4, index)
            else:
                _write_int(out, 64, 6, index)
                self._add(name, value, size)
            if not index:
                _write_string(out, name)
            _write_string(out, value)
        return bytes(out)

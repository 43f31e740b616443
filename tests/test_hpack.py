"""RFC 7541 HPACK (engine.http2): the RFC's Appendix C examples, round trips, native/twin parity, the bounds a hostile
peer runs into, and interop with real grpc C-core blocks and the `hpack` package (a reference decoder, tests only)."""
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_module, require_native
from engine.http2 import _frames_py, _hpack_py
from engine.http2._hpack_py import HpackError

ROOT = Path(__file__).resolve().parents[1]
GRPC_BLOCKS = json.loads((Path(__file__).parent / "data" / "hpack" / "grpc_c_core_blocks.json").read_text())
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def h(text):
    return bytes.fromhex(text.replace(" ", ""))


def literal(name, value, first=0x40, huffman=False):
    """A literal field with a new name (first: 0x40 incremental indexing, 0x00 without, 0x10 never indexed)."""
    out = bytearray([first])
    for s in (name, value):
        data = _hpack_py.huffman_encode(s) if huffman and s is value else s
        _hpack_py._write_int(out, 0x80 if huffman and s is value else 0, 7, len(data))
        out += data
    return bytes(out)


# ---------------------------------------------------------------------------------------------------------------
# RFC 7541 Appendix C


def test_rfc7541_c1_integers():
    out = bytearray()
    _hpack_py._write_int(out, 0, 5, 10)
    assert out == h("0a") and _hpack_py._read_int(out, 0, 5) == (10, 1)
    out = bytearray()
    _hpack_py._write_int(out, 0, 5, 1337)
    assert out == h("1f9a0a") and _hpack_py._read_int(out, 0, 5) == (1337, 3)
    out = bytearray()
    _hpack_py._write_int(out, 0, 8, 42)
    assert out == h("2a") and _hpack_py._read_int(out, 0, 8) == (42, 1)


def test_huffman_code_is_the_rfcs():
    """RFC 7541 Appendix B: a complete prefix code (Kraft sum 1, 256 internal nodes), sampled codes, EOS 30 ones;
    every byte value encodes and decodes back."""
    codes = _hpack_py.HUFFMAN_CODES
    assert len(codes) == 257 and sum(2.0 ** -n for _, n in codes) == 1.0
    assert codes[ord("0")] == (0x0, 5) and codes[ord(" ")] == (0x14, 6) and codes[ord("a")] == (0x3, 5)
    assert codes[0] == (0x1FF8, 13) and codes[255] == (0x3FFFFEE, 26) and codes[256] == (0x3FFFFFFF, 30)
    assert len(_hpack_py._huffman_tree()) == 256
    every = bytes(range(256)) * 2
    assert _hpack_py.huffman_decode(_hpack_py.huffman_encode(every)) == every
    assert len(_hpack_py.huffman_encode(every)) == _hpack_py.huffman_length(every)


C2 = [  # (block, fields, dynamic table after it)
    ("400a637573746f6d2d6b65790d637573746f6d2d686561646572", [(b"custom-key", b"custom-header")],
     [(b"custom-key", b"custom-header")]),
    ("040c2f73616d706c652f70617468", [(b":path", b"/sample/path")], []),
    ("100870617373776f726406736563726574", [(b"password", b"secret")], []),
    ("82", [(b":method", b"GET")], []),
]
REQUESTS = [
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
     (b"cache-control", b"no-cache")],
    [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"), (b":authority", b"www.example.com"),
     (b"custom-key", b"custom-value")],
]
REQUEST_TABLES = [([(b":authority", b"www.example.com")], 57),
                  ([(b"cache-control", b"no-cache"), (b":authority", b"www.example.com")], 110),
                  ([(b"custom-key", b"custom-value"), (b"cache-control", b"no-cache"),
                    (b":authority", b"www.example.com")], 164)]
C3 = ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
      "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"]
C4 = ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
      "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"]
DATE1, DATE2 = b"Mon, 21 Oct 2013 20:13:21 GMT", b"Mon, 21 Oct 2013 20:13:22 GMT"
LOCATION = (b"location", b"https://www.example.com")
COOKIE = (b"set-cookie", b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")
RESPONSES = [
    [(b":status", b"302"), (b"cache-control", b"private"), (b"date", DATE1), LOCATION],
    [(b":status", b"307"), (b"cache-control", b"private"), (b"date", DATE1), LOCATION],
    [(b":status", b"200"), (b"cache-control", b"private"), (b"date", DATE2), LOCATION,
     (b"content-encoding", b"gzip"), COOKIE],
]
RESPONSE_TABLES = [([LOCATION, (b"date", DATE1), (b"cache-control", b"private"), (b":status", b"302")], 222),
                   ([(b":status", b"307"), LOCATION, (b"date", DATE1), (b"cache-control", b"private")], 222),
                   ([COOKIE, (b"content-encoding", b"gzip"), (b"date", DATE2)], 215)]
C5 = ["4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f"
      "7777772e6578616d706c652e636f6d",
      "4803333037c1c0bf",
      "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b48514b"
      "425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31"]
C6 = ["488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
      "4883640effc1c0bf",
      "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27"
      "087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007"]


def test_rfc7541_c2_literal_and_indexed_fields(impl):
    for block, fields, table in C2:
        d = impl.hpack.HpackDecoder()  # each C.2 example starts from an empty table
        assert d.decode(h(block)) == fields
        assert d.entries == table
        assert d.table_size == sum(len(n) + len(v) + 32 for n, v in table)


@pytest.mark.parametrize("blocks", [C3, C4], ids=["C3-raw", "C4-huffman"])
def test_rfc7541_requests_one_connection(impl, blocks):
    d = impl.hpack.HpackDecoder()
    for block, fields, (table, size) in zip(blocks, REQUESTS, REQUEST_TABLES):
        assert d.decode(h(block)) == fields
        assert (d.entries, d.table_size) == (table, size)


@pytest.mark.parametrize("blocks", [C5, C6], ids=["C5-raw", "C6-huffman"])
def test_rfc7541_responses_with_eviction(impl, blocks):
    d = impl.hpack.HpackDecoder(max_table_size=256)
    for block, fields, (table, size) in zip(blocks, RESPONSES, RESPONSE_TABLES):
        assert d.decode(h(block)) == fields
        assert (d.entries, d.table_size) == (table, size)


def test_encoder_reproduces_c4_and_c6(impl):
    """The encoder's choices (static index, incremental indexing, Huffman where shorter) are the RFC's."""
    e = impl.hpack.HpackEncoder()
    for block, fields in zip(C4, REQUESTS):
        assert e.encode(fields).hex() == block
    assert (e.entries, e.table_size) == REQUEST_TABLES[-1]
    e = impl.hpack.HpackEncoder(max_table_size=256)
    # our table is smaller than the peer's initial 4096: the first block says so (size update 256: 3f e1 01)
    assert e.encode(RESPONSES[0]).hex() == "3fe101" + C6[0]
    for block, fields in zip(C6[1:], RESPONSES[1:]):
        assert e.encode(fields).hex() == block
    assert (e.entries, e.table_size) == RESPONSE_TABLES[-1]


# ---------------------------------------------------------------------------------------------------------------
# the encoder's policy and table size updates


def test_encoder_indexes_repeated_grpc_fields(impl):
    e, d = impl.hpack.HpackEncoder(), impl.hpack.HpackDecoder()
    response = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0"), (b"grpc-message", b"")]
    first = e.encode(response), e.encode(trailers)
    again = e.encode(response), e.encode(trailers)
    assert [d.decode(b) for b in first + again] == [response, trailers, response, trailers]
    assert again[0] == h("88bf")  # :status 200 static, content-type from the table
    assert again[1][:2] == h("be 00")  # grpc-status indexed; grpc-message a literal without indexing, again
    assert (b"grpc-message", b"") not in e.entries and e.entries == d.entries
    signed = e.encode([(b"authorization", b"MQv2-HMAC-SHA1 Credential=ak, Signature=00")])
    assert signed[0] & 0xF0 == 0x10 and d.decode(signed) and e.entries == d.entries  # never indexed


def test_encoder_size_updates(impl):
    e, d = impl.hpack.HpackEncoder(), impl.hpack.HpackDecoder()
    fields = [(b"x-mq-client-id", b"10.0.0.7@1"), (b"content-type", b"application/grpc")]
    assert d.decode(e.encode(fields)) == fields and d.table_size == e.table_size > 0
    e.set_max_table_size(4096)  # unchanged: nothing to signal
    assert e.encode([]) == b""
    e.set_max_table_size(0)  # shrink then grow before the next block: the smallest, then the final size
    e.set_max_table_size(100)
    assert e.entries == [] and e.table_size == 0
    block = e.encode(fields)
    assert block[:3] == h("20 3f45")  # 0 then 100 (31 + 69)
    assert d.decode(block) == fields and d.table_size_limit == 100 and d.entries == e.entries
    e.set_max_table_size(1 << 20)  # more than our own 4096: we keep 4096
    assert e.encode([])[:3] == h("3fe11f") and e.table_size_limit == 4096
    small = impl.hpack.HpackEncoder(max_table_size=0)  # a table of nothing: announced, nothing indexed
    block = small.encode(fields)
    assert block[0] == 0x20 and small.entries == []
    assert impl.hpack.HpackDecoder().decode(block) == fields


# ---------------------------------------------------------------------------------------------------------------
# bounds: what a hostile peer runs into


def errors(impl, block, **kw):
    with pytest.raises(HpackError) as exc:
        impl.hpack.HpackDecoder(**kw).decode(block)
    return str(exc.value)


def test_table_size_update_bounds(impl):
    assert errors(impl, h("3fe21f")) == "hpack: table size update to 4097 over the limit 4096 at byte 0"
    assert errors(impl, h("3fe101"), max_table_size=255) == "hpack: table size update to 256 over the limit 255 at byte 0"
    assert errors(impl, h("82 20")) == "hpack: table size update after a header field at byte 1"
    d = impl.hpack.HpackDecoder(max_table_size=4096)
    assert d.decode(h("3fe11f")) == [] and d.table_size_limit == 4096
    # the attack: a block of size updates churning the table is one linear pass; afterwards the table keeps to the
    # last size asked for
    d.decode(h(C4[0]) + h(C4[1]))
    assert d.table_size == 110
    storm = (h("20") + h("3fe11f")) * 20000 + h("3f21")  # 40,000 updates, then 64
    t0 = time.perf_counter()
    assert d.decode(storm) == [] and d.table_size_limit == 64 and d.entries == []
    assert time.perf_counter() - t0 < 2.0
    first, second = (b"a", b"x" * 20), (b"b", b"y" * 20)  # 53 bytes each: the second evicts the first
    assert d.decode(literal(*first) + literal(*second)) == [first, second]
    assert d.entries == [second] and d.table_size == 53


def test_dynamic_table_never_passes_its_size(impl):
    d = impl.hpack.HpackDecoder(max_table_size=200)
    d.decode(h("3f a9 01"))  # size update 200
    for i in range(50):
        value = bytes([97 + i % 26]) * (i % 90)
        assert d.decode(h("40 01 6b") + bytes([len(value)]) + value) == [(b"k", value)]
        assert d.table_size <= 200 and d.table_size == sum(len(n) + len(v) + 32 for n, v in d.entries)
    d.decode(literal(b"k", b"y" * 200))  # an entry larger than the table empties it (RFC 7541 4.4)
    assert d.entries == [] and d.table_size == 0


def test_header_list_size_budget(impl):
    name, value = b"x-big", b"v" * 1000
    add = literal(name, value)
    one = len(name) + len(value) + 32
    assert impl.hpack.HpackDecoder(max_header_list_size=one).decode(add) == [(name, value)]  # exactly the budget
    assert errors(impl, add, max_header_list_size=one - 1) == f"hpack: header list over {one - 1} bytes at byte 0"
    # a small block naming a big entry again and again: stopped at the budget, not after the block
    amplify = add + h("be") * 5000
    assert errors(impl, amplify, max_header_list_size=16384) == (
        f"hpack: header list over 16384 bytes at byte {len(add) + 14}")  # the 16th field
    ok = impl.hpack.HpackDecoder(max_header_list_size=16 * one)
    assert len(ok.decode(add + h("be") * 15)) == 16


def test_integer_bounds(impl):
    assert errors(impl, h("ff 80 80 80 80 80 00")) == "hpack: integer longer than 6 bytes at byte 0"
    assert errors(impl, h("ff 81 80 80 80 08")) == "hpack: integer over 2^31-1 at byte 0"  # 127 + 1 + 2^31
    assert errors(impl, h("ff 80 80 80")) == "hpack: integer cut short at byte 0"
    # 2^31 - 1 itself is an integer: as a string length it runs past the block
    assert errors(impl, h("40 7f 80 ff ff ff 07") + b"abc") == (
        "hpack: string of 2147483647 bytes past the block's end at byte 1")
    assert errors(impl, h("40 05") + b"abc") == "hpack: string of 5 bytes past the block's end at byte 1"
    assert errors(impl, h("40 01 61")) == "hpack: string missing at byte 3"


def test_index_bounds(impl):
    assert errors(impl, h("80")) == "hpack: index 0 at byte 0"
    assert errors(impl, h("82 be")) == "hpack: index 62 past the table (61 entries) at byte 1"
    assert errors(impl, h("7e 01 61")) == "hpack: index 62 past the table (61 entries) at byte 0"
    assert impl.hpack.HpackDecoder().decode(h("bd")) == [(b"www-authenticate", b"")]  # 61: the last static entry


def test_huffman_eos_and_padding(impl):
    assert impl.hpack.HpackDecoder().decode(h("04 81 1f")) == [(b":path", b"a")]  # 'a' (00011) + 111
    assert errors(impl, h("04 84 ff ff ff ff")) == "hpack: EOS inside a Huffman string at byte 1"
    assert errors(impl, h("04 82 1f ff")) == "hpack: Huffman padding longer than 7 bits at byte 1"
    assert errors(impl, h("04 81 18")) == "hpack: Huffman padding not all ones at byte 1"  # 'a' + 000
    assert errors(impl, h("04 81 fe")) == "hpack: Huffman padding not all ones at byte 1"  # 1111111 0
    assert impl.hpack.HpackDecoder().decode(h("04 80")) == [(b":path", b"")]  # an empty Huffman string


def test_decoding_is_linear_and_bounded_by_the_block(impl):
    """A 64 KB hostile block (Huffman strings of the shortest codes, references to a big entry) costs at most a
    few times its size in memory and linear time, within the default budgets."""
    rng = __import__("random").Random(7)
    d = impl.hpack.HpackDecoder(max_header_list_size=1 << 30)
    text = bytes(rng.choice(b"012aceiost") for _ in range(8000))  # 5-bit codes: the most symbols per byte
    block = literal(b"a", text, first=0x00, huffman=True)
    assert len(block) < 5100
    tracemalloc.start()
    t0 = time.perf_counter()
    out = d.decode(block * 12)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(out) == 12 and len(out[0][1]) == 8000
    assert peak < 4 * len(block * 12) + 200_000 and elapsed < 2.0
    d = impl.hpack.HpackDecoder()
    many = literal(b"a", b"v" * 4000) + h("be") * 30000
    tracemalloc.start()
    with pytest.raises(HpackError):
        d.decode(many)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100_000  # stopped at the header list budget: 4 fields, not 30,000 references


def test_one_error_class_for_both_builds():
    require_native()
    from engine.http2 import _hpack

    assert _hpack.HpackError is HpackError and issubclass(HpackError, ValueError)


@pytest.mark.parametrize("no_ext", ["", "1"])
def test_facade_picks_native_unless_no_extensions(no_ext):
    if not no_ext:
        require_native()
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_NO_EXTENSIONS"}
    if no_ext:
        env["ENGINE_NO_EXTENSIONS"] = "1"
    out = subprocess.run([sys.executable, "-c", "import engine.http2 as m; print(m.HpackDecoder.__module__, "
                          "m.HpackEncoder.__module__, m.NATIVE_HPACK)"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    want = "engine.http2._hpack_py" if no_ext else "engine.http2._hpack"
    assert out == [want, want, str(not no_ext)]


# ---------------------------------------------------------------------------------------------------------------
# real grpc C-core blocks (tests/data/hpack/grpc_c_core_blocks.json)


@pytest.mark.parametrize("kind", ["requests", "responses"])
def test_real_grpc_c_core_blocks(impl, kind):
    d = impl.hpack.HpackDecoder()
    decoded = [d.decode(h(b)) for b in GRPC_BLOCKS[kind]]
    if kind == "requests":
        assert all((b":path", b"/apache.rocketmq.v2.MessagingService/Heartbeat") in f for f in decoded)
        assert all(len(f) == 17 for f in decoded) and decoded[0][-1][0] == b"authorization"
    else:
        assert decoded[-1][-1] == (b"grpc-message", b"topic 'T%251' not found: 100%25")
    hpack = require_module("hpack")
    ref = hpack.Decoder()
    assert decoded == [[tuple(f) for f in ref.decode(h(b), raw=True)] for b in GRPC_BLOCKS[kind]]


# ---------------------------------------------------------------------------------------------------------------
# round trips and parity under hypothesis

NAMES = [b":status", b"content-type", b"grpc-status", b"grpc-message", b"x-mq-client-id", b"authorization",
         b"user-agent", b":path", b"te", b"grpc-timeout", b"cookie"]
VALUES = [b"200", b"application/grpc", b"0", b"", b"trailers", b"/apache.rocketmq.v2.MessagingService/Heartbeat"]
field = st.tuples(st.sampled_from(NAMES) | st.binary(min_size=1, max_size=12),
                  st.sampled_from(VALUES) | st.binary(max_size=60))
header_lists = st.lists(st.lists(field, max_size=12), min_size=1, max_size=6)
resizes = st.lists(st.none() | st.integers(0, 5000), min_size=6, max_size=6)


def run_encoder(mod, lists, sizes, cap):
    e = mod.HpackEncoder(max_table_size=cap)
    out = []
    for fields, size in zip(lists, sizes):
        if size is not None:
            e.set_max_table_size(size)
        out.append((e.encode(fields), e.entries, e.table_size))
    return out


@SETTINGS
@given(lists=header_lists, sizes=resizes, cap=st.sampled_from([0, 64, 256, 4096, 8192]))
def test_round_trip(lists, sizes, cap):
    mods = [_hpack_py]
    try:
        from engine.http2 import _hpack
        mods.append(_hpack)
    except ImportError:
        require_native()
    for enc in mods:
        blocks = run_encoder(enc, lists, sizes, cap)
        for dec in mods:
            d = dec.HpackDecoder(max_table_size=max(cap, 4096), max_header_list_size=1 << 20)
            for fields, (block, entries, size) in zip(lists, blocks):
                assert d.decode(block) == fields
                assert d.entries == entries and d.table_size == size


@SETTINGS
@given(lists=header_lists, sizes=resizes, cap=st.sampled_from([0, 100, 4096]))
def test_native_encoder_matches_twin(lists, sizes, cap):
    require_native()
    from engine.http2 import _hpack

    assert run_encoder(_hpack, lists, sizes, cap) == run_encoder(_hpack_py, lists, sizes, cap)


def verdicts(mod, blocks, **kw):
    """What one decoder makes of a connection's blocks: each block's fields and table, up to the first error."""
    d = mod.HpackDecoder(**kw)
    out = []
    for block in blocks:
        try:
            out.append(("ok", d.decode(block), d.entries, d.table_size, d.table_size_limit))
        except HpackError as exc:
            out.append(("HpackError", str(exc)))
            break
    return out


def same_verdicts(blocks, **kw):
    from engine.http2 import _hpack

    native, twin = verdicts(_hpack, blocks, **kw), verdicts(_hpack_py, blocks, **kw)
    assert native == twin
    return twin


budgets = st.fixed_dictionaries({"max_table_size": st.sampled_from([0, 64, 256, 4096]),
                                 "max_header_list_size": st.sampled_from([0, 100, 1000, 16384])})


@SETTINGS
@given(blocks=st.lists(st.binary(max_size=200), min_size=1, max_size=4), kw=budgets)
def test_parity_on_random_bytes(blocks, kw):
    require_native()
    same_verdicts(blocks, **kw)
    same_unary_verdicts(blocks, 100, **kw)


VALID = [h(b) for b in C3 + C4 + C5 + C6] + [h(b) for b in GRPC_BLOCKS["requests"] + GRPC_BLOCKS["responses"]]
TOKENS = [h("80"), h("20"), h("3fe11f"), h("3fe21f"), h("ff80808080808000"), h("ff"), h("7f"), h("40"), h("00"),
          h("10"), h("84ffffffff"), h("811f"), h("8118"), h("be"), h("bf")]


@st.composite
def mutated(draw, data):
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["byte", "bit", "token", "delete", "truncate", "duplicate"]))
        if op == "byte" and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif op == "bit" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "token":
            data[i:i] = draw(st.sampled_from(TOKENS))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[i:]
        else:
            data[i:i] = data[i : i + draw(st.integers(1, 16))]
    return bytes(data)


@SETTINGS
@given(data=st.data(), kw=budgets)
def test_parity_on_mutated_valid_blocks(data, kw):
    require_native()
    start = data.draw(st.integers(0, len(VALID) - 1))
    blocks = VALID[start : start + data.draw(st.integers(1, 3))]
    k = data.draw(st.integers(0, len(blocks) - 1))
    blocks[k] = data.draw(mutated(blocks[k]))
    same_verdicts(blocks, **kw)
    same_verdicts(blocks)  # and with the default budgets
    same_unary_verdicts(blocks, 8192, **kw)


# ---------------------------------------------------------------------------------------------------------------
# interop with the `hpack` package (a reference implementation, used in tests only)


@SETTINGS
@given(lists=header_lists, sizes=resizes, huffman=st.booleans())
def test_interop_with_the_hpack_package(impl, lists, sizes, huffman):
    hpack = require_module("hpack")
    # their encoder -> our decoder (size updates, Huffman or not, never-indexed fields)
    enc, d = hpack.Encoder(), impl.hpack.HpackDecoder(max_header_list_size=1 << 20)
    for fields, size in zip(lists, sizes):
        if size is not None:
            enc.header_table_size = min(size, 4096)
        tuples = [hpack.NeverIndexedHeaderTuple(n, v) if n == b"authorization" else (n, v) for n, v in fields]
        assert d.decode(enc.encode(tuples, huffman=huffman)) == fields
    # our encoder -> their decoder
    e, ref = impl.hpack.HpackEncoder(), hpack.Decoder(max_header_list_size=1 << 20)
    for fields, size in zip(lists, sizes):
        if size is not None:
            e.set_max_table_size(size)
            ref.max_allowed_table_size = min(size, 4096)
        assert [tuple(f) for f in ref.decode(e.encode(fields), raw=True)] == fields


# ---------------------------------------------------------------------------------------------------------------
# decode_unary: the fields, and what the gRPC transport's prepared path reads of them (the compiled build keeps
# each table entry's size and kind beside it and reads those, not the fields)

REQUEST_NAMES = [b":method", b":path", b"content-type", b"grpc-timeout", b"grpc-encoding", b"x-mq-client-id", b"te",
                 b":authority", b"x-mq-client-ids", b"content-typ"]
REQUEST_VALUES = [b"POST", b"GET", b"post", b"/svc/M", b"application/grpc", b"application/grpc+proto",
                  b"application/grp", b"text/plain", b"1S", b"99999999m", b"123456789S", b"S", b"1x", b"-1S", b"1\xb9S",
                  b"identity", b"gzip", b"client@1", b""]
request_lists = st.lists(st.lists(st.tuples(st.sampled_from(REQUEST_NAMES),
                                            st.sampled_from(REQUEST_VALUES) | st.binary(max_size=12)),
                                  max_size=10), min_size=1, max_size=5)


def unary_verdicts(mod, blocks, max_metadata, **kw):
    d = mod.HpackDecoder(**kw)
    out = []
    for block in blocks:
        try:
            out.append(("ok", d.decode_unary(block, max_metadata), d.entries, d.table_size))
        except HpackError as exc:
            out.append(("HpackError", str(exc)))
            break
    return out


def same_unary_verdicts(blocks, max_metadata, **kw):
    from engine.http2 import _hpack

    twin = unary_verdicts(_hpack_py, blocks, max_metadata, **kw)
    assert unary_verdicts(_hpack, blocks, max_metadata, **kw) == twin
    assert [v[0] for v in twin] == [v[0] for v in verdicts(_hpack_py, blocks, **kw)]  # the same blocks decode
    return twin


def test_decode_unary_reads_what_the_prepared_path_needs(impl):
    enc = impl.hpack.HpackEncoder()
    d = impl.hpack.HpackDecoder()
    base = [(b":method", b"POST"), (b":path", b"/svc/M"), (b"content-type", b"application/grpc"),
            (b"grpc-timeout", b"2999m"), (b"x-mq-client-id", b"c1"), (b"x-mq-client-id", b"c2")]
    for _ in range(2):  # literals, then indexed fields of the dynamic table
        assert d.decode_unary(enc.encode(base), 8192) == (base, b"/svc/M", b"c1")
    for extra in ([(b":method", b"GET")], [(b"grpc-timeout", b"1x")], [(b"content-type", b"text/plain")],
                  [(b"grpc-encoding", b"gzip")]):
        fields, path, client_id = d.decode_unary(enc.encode(base + extra), 8192)
        assert fields == base + extra and path is None and client_id == b"c1"
    assert d.decode_unary(enc.encode(base + [(b"grpc-encoding", b"identity")]), 8192)[1] == b"/svc/M"
    assert d.decode_unary(enc.encode(base), 100)[1] is None  # the list past max_metadata
    assert d.decode_unary(enc.encode(base[2:]), 8192) == (base[2:], None, b"c1")


@SETTINGS
@given(lists=request_lists, sizes=resizes, cap=st.sampled_from([0, 64, 256, 4096]),
       max_metadata=st.sampled_from([0, 120, 400, 8192]))
def test_decode_unary_parity(lists, sizes, cap, max_metadata):
    require_native()
    blocks = [b for b, _, _ in run_encoder(_hpack_py, lists, sizes, cap)]
    twin = same_unary_verdicts(blocks, max_metadata, max_table_size=4096, max_header_list_size=1 << 20)
    for fields, verdict in zip(lists, twin):  # the twin is decode and the frame layer's rules
        size, path, content_type, encoding, _, bad = _frames_py.scan_request_headers(fields)
        ok = (not bad and size <= max_metadata and content_type is not None
              and content_type.startswith(b"application/grpc") and encoding in (None, b"identity"))
        assert verdict[1] == (fields, path if ok else None, _frames_py.header_value(fields, b"x-mq-client-id"))


def _lit(first: int, name: bytes | None, value: bytes) -> bytes:
    """A literal field without Huffman: ``first`` its prefix byte (an indexed name's index in it), ``name`` None
    for an indexed name."""
    out = bytes([first])
    if name is not None:
        out += bytes([len(name)]) + name
    return out + bytes([len(value)]) + value


def test_decode_unary_keeps_entries_evicted_by_the_same_block(impl):
    """The compiled scan records the table's tuples without taking a reference; an entry evicted later in the same
    block (by a new entry or a size update) must stay what the field read. Run under scripts/sanitize.sh this is a
    use-after-free check."""
    d, ref = impl.hpack.HpackDecoder(), impl.hpack.HpackDecoder()
    blocks = [
        b"\x3f\x45" + _lit(0x40, b"a", b"x" * 30),  # table size 100; ("a", x*30) is 63 bytes
        # indexed "a", then ("b", y*30) evicts it
        b"\xbe" + _lit(0x40, b"b", b"y" * 30),
        # a literal not indexed named by entry 62 ("b"), then ("c", w*30) evicts "b"; then a size update-free
        # literal never indexed with a new name
        _lit(0x0F, None, b"z")[:1] + b"\x2f" + _lit(0, None, b"z")[1:] + _lit(0x40, b"c", b"w" * 30)
        + _lit(0x10, b"x-mq-client-id", b"c9"),
    ]
    for block in blocks:
        expect = ref.decode(block)
        assert d.decode_unary(block, 8192) == (expect, None, b"c9" if b"c9" in block else None)
        assert d.entries == ref.entries and d.table_size == ref.table_size
    assert expect == [(b"b", b"z"), (b"c", b"w" * 30), (b"x-mq-client-id", b"c9")]


def test_decode_unary_reads_literals_not_indexed(impl):
    """grpc C-core sends the SDK's metadata as literals without indexing: the :path and the client id are read from
    those too (a Huffman-coded value, a raw one, an indexed name, a new name, never indexed)."""
    d = impl.hpack.HpackDecoder()
    huffman_path = _hpack_py.huffman_encode(b"/svc/M")
    block = (b"\x83"  # :method POST
             + b"\x04" + bytes([0x80 | len(huffman_path)]) + huffman_path  # :path, indexed name, Huffman value
             + _lit(0x0F, None, b"")[:1] + b"\x10" + bytes([16]) + b"application/grpc"  # content-type (31)
             + _lit(0x00, b"x-mq-client-id", b"c1") + _lit(0x10, b"x-mq-client-id", b"c2")
             + _lit(0x00, b"grpc-timeout", b"3S"))
    fields = [(b":method", b"POST"), (b":path", b"/svc/M"), (b"content-type", b"application/grpc"),
              (b"x-mq-client-id", b"c1"), (b"x-mq-client-id", b"c2"), (b"grpc-timeout", b"3S")]
    assert d.decode_unary(block, 8192) == (fields, b"/svc/M", b"c1")
    assert d.entries == []
    # the same literals with a bad timeout, or past max_metadata: no path; the client id all the same
    bad = block[:-3] + b"\x02" + b"3x"
    assert d.decode_unary(bad, 8192) == (fields[:-1] + [(b"grpc-timeout", b"3x")], None, b"c1")
    assert d.decode_unary(block, 100) == (fields, None, b"c1")


def test_shared_header_names_are_bounded():
    """The compiled decoder shares one object per distinct header name across connections (interned): a peer sending
    ever new names does not grow that pool past its bound (4,096 strings of at most 256 bytes)."""
    require_native()
    from engine.http2 import _hpack

    enc = _hpack_py.HpackEncoder()
    blocks = [enc.encode([(b"n%0248d" % k, b"v")]) for k in range(12000)]  # 249-byte names: ~3.4 MiB unbounded
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for block in blocks:
            _hpack.HpackDecoder(max_table_size=0).decode(block)  # nothing in the table: only the pool could keep it
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 2 << 20

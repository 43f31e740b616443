#!/usr/bin/env python3
"""Coverage-guided differential fuzzer for HPACK (RFC 7541), the header compression of the native HTTP/2 server.

Every input is the header blocks of one connection: cut into blocks at points taken from the input's CRC (the whole
input as one block 3 times in 8), decoded in order by one decoder of each implementation (engine.http2._hpack,
engine.http2._hpack_py), with budgets from the CRC (max_table_size 0-4096, max_header_list_size 0-16384), then
whole with the default budgets:

* both give the same fields, dynamic table and table size after each block, or the same HpackError (a RemotingError
  and ValueError, message word for word, at most 512 characters); decode_unary (max_metadata from the CRC) gives
  decode's fields or error and the same :path and client id in both;
* after each block the budgets hold: table size <= the last size update <= max_table_size, the table size is its
  entries' (name + value + 32 each), the header list is within max_header_list_size;
* the fields decoded go through both encoders (table size and a peer's SETTINGS_HEADER_TABLE_SIZE from the CRC): the
  same bytes, the same table, and the twin decodes them back to the same fields and table.

Anything else escaping (IndexError, SystemError, MemoryError, ...) or a difference raises, and libFuzzer records
the input. Run (see FUZZING.md): ``python fuzz/fuzz_hpack.py -atheris_runs=1000000 CORPUS SEEDS``; seeds (RFC 7541
Appendix C, the grpc C-core blocks of tests/data/hpack, hostile made-up ones) from
``python fuzz/fuzz_hpack.py --seeds SEEDS``.
"""
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzzlib  # noqa: E402

NATIVE, TWIN = fuzzlib.load("hpack", __name__ == "__main__", "engine.http2")

IMPLS = [m for m in (NATIVE, TWIN) if m is not None]


def options_for(data):
    x = zlib.crc32(data, 23)
    return {"max_table_size": (0, 64, 256, 4096)[x % 4], "max_header_list_size": (0, 200, 4096, 16384)[(x >> 2) % 4]}


def verdict(mod, blocks, options, max_metadata=None):
    """Each block's fields, table and sizes, up to the first error; with ``max_metadata``, decode_unary's verdict
    (decoded by a second decoder: the same fields, or the same error) beside each."""
    d = mod.HpackDecoder(**options)
    u = None if max_metadata is None else mod.HpackDecoder(**options)
    out = []
    for block in blocks:
        unary = None
        if u is not None:
            try:
                unary = u.decode_unary(block, max_metadata)
            except Exception as exc:  # noqa: BLE001 - check_error re-raises anything that is not a typed error
                unary = fuzzlib.check_error(exc)
        try:
            fields = d.decode(block)
        except Exception as exc:  # noqa: BLE001 - check_error re-raises anything that is not a typed error
            out.append(fuzzlib.check_error(exc))
            if u is not None and unary != out[-1]:
                raise fuzzlib.Divergence(f"{mod.__name__}: decode_unary {unary!r:.200} != decode {out[-1]!r:.200}")
            return out
        if u is not None:
            if not isinstance(unary, tuple) or unary[0] != fields:
                raise fuzzlib.Divergence(f"{mod.__name__}: decode_unary {unary!r:.200} != decode {fields!r:.200}")
            out.append(("unary", unary[1], unary[2]))
        entries = d.entries
        if not (d.table_size <= d.table_size_limit <= options["max_table_size"]
                and d.table_size == sum(len(n) + len(v) + 32 for n, v in entries)):
            raise fuzzlib.Divergence(f"{mod.__name__}: table of {d.table_size} bytes ({len(entries)} entries) "
                                     f"over {d.table_size_limit} / {options}")
        if sum(len(n) + len(v) + 32 for n, v in fields) > options["max_header_list_size"]:
            raise fuzzlib.Divergence(f"{mod.__name__}: header list over {options['max_header_list_size']}")
        out.append(("ok", fields, entries, d.table_size, d.table_size_limit))
    return out


def same(kind, verdicts, data):
    if any(v != verdicts[0] for v in verdicts[1:]):
        raise fuzzlib.Divergence(f"{kind}: native {verdicts[0]!r:.400} != twin {verdicts[-1]!r:.400} "
                                 f"for {data[:80]!r}")


def encode_all(mod, lists, cap, peer):
    e = mod.HpackEncoder(max_table_size=cap)
    out = []
    for k, fields in enumerate(lists):
        if k == 1:
            e.set_max_table_size(peer)
        out.append((e.encode(fields), e.entries, e.table_size))
    return out


def check_encoders(lists, data):
    x = zlib.crc32(data, 29)
    cap, peer = (0, 100, 4096, 8192)[x % 4], (0, 50, 4096, 65536)[(x >> 2) % 4]
    encoded = [encode_all(mod, lists, cap, peer) for mod in IMPLS]
    same("HpackEncoder", encoded, data)
    d = TWIN.HpackDecoder(max_table_size=8192, max_header_list_size=1 << 30)
    for fields, (block, entries, size) in zip(lists, encoded[-1]):
        if d.decode(block) != fields or d.entries != entries or d.table_size != size:
            raise fuzzlib.Divergence(f"encoder round trip: {fields!r:.200} -> {block[:80]!r}")


def test_one_input(data):
    blocks = list(fuzzlib.chunks(data, fuzzlib.cuts_for(data, 5))) or [b""]
    options = options_for(data)
    max_metadata = (0, 100, 16384)[zlib.crc32(data, 31) % 3]
    same("HpackDecoder", [verdict(mod, blocks, options, max_metadata) for mod in IMPLS], data)
    defaults = {"max_table_size": TWIN.DEFAULT_MAX_TABLE_SIZE,
                "max_header_list_size": TWIN.DEFAULT_MAX_HEADER_LIST_SIZE}
    whole = [verdict(mod, [data], defaults) for mod in IMPLS]
    same("HpackDecoder defaults", whole, data)
    lists = [v[1] for v in whole[-1] if v[0] == "ok"]
    if lists:
        check_encoders(lists + [lists[0]], data)


# ---------------------------------------------------------------------------------------------------------------
# seeds


def seeds():
    """RFC 7541 Appendix C blocks (one by one and each example's blocks joined), the grpc C-core blocks, and
    hostile made-up ones."""
    rfc = [["400a637573746f6d2d6b65790d637573746f6d2d686561646572", "040c2f73616d706c652f70617468",
            "100870617373776f726406736563726574", "82"],
           ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
            "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"],
           ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
            "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"],
           ["488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82"
            "ae43d3", "4883640effc1c0bf"]]
    out = []
    for example in rfc:
        blocks = [bytes.fromhex(b) for b in example]
        out += blocks + [b"".join(blocks)]
    grpc = fuzzlib.ROOT / "tests" / "data" / "hpack" / "grpc_c_core_blocks.json"
    if grpc.is_file():
        d = json.loads(grpc.read_text())
        for kind in ("requests", "responses"):
            blocks = [bytes.fromhex(b) for b in d[kind]]
            out += blocks + [b"".join(blocks)]
    big = b"\x40\x05x-big\x7f\xe9\x06" + b"v" * 1000
    out += [bytes.fromhex("3fe11f20") * 8 + bytes.fromhex("3fe21f"),  # size update storm, then one over the limit
            bytes.fromhex("82203fe11f"),  # a size update after a field
            big + b"\xbe" * 40,  # a big entry referenced past the header list budget
            bytes.fromhex("ff808080808000"), bytes.fromhex("ff818080800840"),  # long and large integers
            bytes.fromhex("0484ffffffff"), bytes.fromhex("04821fff"), bytes.fromhex("048118"),  # EOS, padding
            bytes.fromhex("80"), bytes.fromhex("be"), bytes.fromhex("7e0161")]  # index 0, past the table
    return out


if __name__ == "__main__":
    print(f"fuzz_hpack: {fuzzlib.describe(NATIVE, TWIN)}", file=sys.stderr)
    fuzzlib.main("fuzz_hpack", test_one_input, seeds)

"""Every real-client frame in ../shared/vectors decodes, in both implementations, to what index.json says.

index.json holds the header as the client wrote it (values not yet stringified); a broker sees ext values the
Java way, so numbers and booleans are compared as String.valueOf gives them.
"""
import json
import random
import struct
from itertools import groupby

import pytest

from engine import LanguageCode


def java_string(value):
    """String.valueOf of a JSON scalar as fastjson hands it to a Map<String, String>."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise AssertionError(f"unexpected ext value {value!r} in index.json")


def check_against_index(client, entry, data, cmd):
    where = f"{client} {entry['file']}"
    header = entry["header"]
    assert cmd.code == header["code"] == entry["code"], where
    assert cmd.language is LanguageCode[header["language"]], where
    assert cmd.version == header["version"], where
    assert cmd.opaque == header["opaque"], where
    assert cmd.flag == header["flag"], where
    assert cmd.remark == header.get("remark"), where
    if "extFields" in header:
        assert cmd.ext_fields == {k: java_string(v) for k, v in header["extFields"].items()}, where
    else:
        assert cmd.ext_fields is None, where
    assert cmd.serialize_type == entry["serialize_type"], where
    assert len(cmd.body) == entry["body_len"], where
    header_len = struct.unpack(">I", data[4:8])[0] & 0xFFFFFF
    assert header_len == entry["header_len"], where
    assert cmd.body == data[8 + header_len :], where
    if "body_json" in entry:
        assert json.loads(cmd.body) == entry["body_json"], where


def chunked(data, rng, max_size):
    pos = 0
    while pos < len(data):
        size = rng.randint(1, max_size)
        yield data[pos : pos + size]
        pos += size


def test_vectors_cover_every_client_and_the_quirks(vectors):
    clients = {client for client, _, _ in vectors}
    assert clients == {"ali-ons", "cpp-rocketmq-0.4.4", "java-rocketmq-4.9.8"}
    # the Java client: a plain heartbeat has no extFields at all, opaques start at 0
    java = [e for c, e, _ in vectors if c == "java-rocketmq-4.9.8"]
    assert any(e["code"] == 34 and "extFields" not in e["header"] for e in java)
    assert min(e["header"]["opaque"] for e in java) == 0
    ext_values = [v for _, e, _ in vectors for v in (e["header"].get("extFields") or {}).values()]
    assert any(isinstance(v, bool) for v in ext_values) and any(type(v) is int for v in ext_values)
    assert any(data[8 + e["header_len"] - 1 : 8 + e["header_len"]] == b"\n" for _, e, data in vectors)


def test_every_vector_decodes(impl, vectors):
    for client, entry, data in vectors:
        check_against_index(client, entry, data, impl.frame.decode_frame(data))


def test_every_vector_through_decoder_random_chunks(impl, vectors):
    rng = random.Random(20240601)
    for client, entry, data in vectors:
        expected = impl.frame.decode_frame(data)
        decoder = impl.frame.FrameDecoder()
        out = []
        for chunk in chunked(data, rng, max(1, len(data) // 3)):
            out += decoder.feed(chunk)
        assert out == [expected] and decoder.buffered == 0, f"{client} {entry['file']}"
        check_against_index(client, entry, data, out[0])


def test_every_vector_one_byte_at_a_time(impl, vectors):
    for client, entry, data in vectors[::7]:
        decoder = impl.frame.FrameDecoder()
        out = []
        for i in range(len(data)):
            out += decoder.feed(data[i : i + 1])
            assert decoder.buffered == (i + 1) % len(data)
        assert len(out) == 1
        check_against_index(client, entry, data, out[0])


@pytest.mark.parametrize("how", ["1-byte", "random", "mtu", "whole"])
def test_captures_concatenated(impl, vectors, how):
    rng = random.Random(how)
    for client, group in groupby(vectors, key=lambda v: v[0]):
        group = list(group)
        stream = b"".join(data for _, _, data in group)
        if how == "1-byte":
            chunks = (stream[i : i + 1] for i in range(len(stream)))
        elif how == "random":
            chunks = chunked(stream, rng, 3000)
        elif how == "mtu":
            chunks = (stream[i : i + 1500] for i in range(0, len(stream), 1500))
        else:
            chunks = [stream]
        decoder = impl.frame.FrameDecoder()
        out = []
        for chunk in chunks:
            out += decoder.feed(chunk)
        assert decoder.buffered == 0 and len(out) == len(group), client
        for (client_, entry, data), cmd in zip(group, out):
            check_against_index(client_, entry, data, cmd)


def test_vectors_reencode(impl, vectors):
    """decode -> encode -> decode is stable in JSON; in ROCKETMQ it keeps every field that format can hold."""
    for client, entry, data in vectors:
        cmd = impl.frame.decode_frame(data)
        again = impl.frame.decode_frame(cmd.encode())
        assert again == cmd, f"{client} {entry['file']}"
        cmd.serialize_type = "ROCKETMQ"
        binary = impl.frame.decode_frame(cmd.encode())
        assert (binary.code, binary.language, binary.version, binary.opaque, binary.flag, binary.body) == (
            cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.body)
        # ROCKETMQ: "" decodes to None (Java readStr), and no entries at all to None.
        expected_ext = {k: (v or None) for k, v in (cmd.ext_fields or {}).items() if v is not None} or None
        assert binary.ext_fields == expected_ext and binary.remark == (cmd.remark or None)

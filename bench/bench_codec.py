"""Frame + header decode and heartbeat body decode, per heartbeat, side by side in one run.

Contenders: the Cython module, its pure-Python twin, an orjson-based decoder (to dicts), and msgspec decoding
into typed Structs (the best Python library alternatives). Run:

    .venv/bin/python -m pytest bench/bench_codec.py --benchmark-only --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,ops

Reference figures measured here (issue 2): Java RocketMQ 5.x RemotingCommand.decode ~1.5 us, fastjson
HeartbeatData.decode ~9.6 us. Targets: frame + header <= 0.5 us, body into typed data <= 1.5 us.
"""
import struct
from typing import Optional, Union

import msgspec
import orjson
import pytest

from engine.codec import _frame, _frame_py, _heartbeat, _heartbeat_py
from engine.codec.vectors import JAVA_HEARTBEAT_BODY as JAVA_BODY
from engine.codec.vectors import load_vectors

# The Java 5.x push-consumer heartbeat of PROTOCOL.md 4.4 (686 bytes) with its 5.2+ request header.
JAVA_HEADER = b'{"code":34,"extFields":{},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}'


def _frame_of(header: bytes, body: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def _samples():
    """(name, whole frame) of one heartbeat per dialect: Java (spec example), ali-ons, C++ (real captures)."""
    out = [("java", _frame_of(JAVA_HEADER, JAVA_BODY))]
    for client, entry, frame in load_vectors():
        if entry["code"] == 34 and client not in {n for n, _ in out}:
            out.append((client, frame))
    return out


SAMPLES = _samples()
IDS = [n for n, _ in SAMPLES]


# --- the library alternatives -------------------------------------------------------------------------------
class Header(msgspec.Struct, omit_defaults=True):
    code: int = 0
    language: Union[str, int, None] = None
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: Optional[str] = None
    extFields: Optional[dict] = None
    serializeTypeCurrentRPC: Optional[str] = None


class Subscription(msgspec.Struct):
    topic: str
    subString: str = "*"
    tagsSet: list = []
    codeSet: list = []
    subVersion: Union[int, str] = 0
    expressionType: str = "TAG"
    classFilterMode: bool = False


class Consumer(msgspec.Struct):
    groupName: str
    consumeType: Union[str, int, None] = None
    messageModel: Union[str, int, None] = None
    consumeFromWhere: Union[str, int, None] = None
    unitMode: bool = False
    subscriptionDataSet: list[Subscription] = []


class Producer(msgspec.Struct):
    groupName: str


class Heartbeat(msgspec.Struct):
    clientID: Optional[str] = None
    producerDataSet: list[Producer] = []
    consumerDataSet: list[Consumer] = []
    heartbeatFingerprint: int = 0
    withoutSub: bool = False


_header_decoder = msgspec.json.Decoder(Header)
_heartbeat_decoder = msgspec.json.Decoder(Heartbeat)
_unpack = struct.Struct(">II").unpack_from


def orjson_frame(frame):
    total, word = _unpack(frame)
    hlen = word & 0xFFFFFF
    return orjson.loads(frame[8 : 8 + hlen]), frame[8 + hlen :]


def msgspec_frame(frame):
    total, word = _unpack(frame)
    hlen = word & 0xFFFFFF
    return _header_decoder.decode(frame[8 : 8 + hlen]), frame[8 + hlen :]


FRAME_DECODERS = {
    "native": _frame.decode_frame,
    "twin": _frame_py.decode_frame,
    "orjson": orjson_frame,
    "msgspec": msgspec_frame,
}
BODY_DECODERS = {
    "native": _heartbeat.decode_heartbeat,
    "twin": _heartbeat_py.decode_heartbeat,
    "orjson": orjson.loads,
    "msgspec": _heartbeat_decoder.decode,
}


@pytest.mark.parametrize("impl", list(FRAME_DECODERS))
@pytest.mark.parametrize("name,frame", SAMPLES, ids=IDS)
def test_frame_header(benchmark, impl, name, frame):
    benchmark.group = f"frame+header {name}"
    decode = FRAME_DECODERS[impl]
    result = benchmark(decode, frame)
    assert result is not None


@pytest.mark.parametrize("impl", list(BODY_DECODERS))
@pytest.mark.parametrize("name,frame", SAMPLES, ids=IDS)
def test_heartbeat_body(benchmark, impl, name, frame):
    benchmark.group = f"body {name}"
    hlen = _unpack(frame)[1] & 0xFFFFFF
    body = frame[8 + hlen :]
    decode = BODY_DECODERS[impl]
    result = benchmark(decode, body)
    assert result is not None


@pytest.mark.parametrize("impl", ["native", "twin"])
def test_response_encode(benchmark, impl):
    """Encoding the 5.1.3+ heartbeat response (PROTOCOL.md A.2): the server does this per heartbeat."""
    benchmark.group = "encode heartbeat response"
    mod = _frame if impl == "native" else _frame_py
    request = mod.decode_frame(SAMPLES[0][1])
    ext = {"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"}
    out = benchmark(lambda: request.response(0, ext_fields=ext).encode())
    assert out[:4] == b"\x00\x00\x00\xaa"


def _burst(mod, frame, n=8):
    """n copies of ``frame`` with consecutive opaques (a client's pipelined heartbeats), re-encoded by ``mod``."""
    cmd = mod.decode_frame(frame)
    out = []
    for i in range(n):
        cmd.opaque = 1_000_000_000 + i
        out.append(cmd.encode())
    return b"".join(out)


@pytest.mark.parametrize("impl", ["native", "native-armed", "twin", "twin-armed", "msgspec"])
@pytest.mark.parametrize("name,frame", SAMPLES, ids=IDS)
def test_repeated_heartbeat_stream(benchmark, impl, name, frame):
    """A read of 8 heartbeats that repeat the connection's last one: decoded in full, or (armed) each handed back
    as its opaque (FrameDecoder.arm_repeat, the broker's route for repeats). Figures are per read of 8; msgspec
    decodes each frame's header (it cannot skip a repeat)."""
    benchmark.group = f"read of 8 repeated heartbeats {name}"
    mod = _frame_py if impl.startswith("twin") else _frame
    data = _burst(mod, frame)
    if impl == "msgspec":
        frames = [data[i:i + len(data) // 8] for i in range(0, len(data), len(data) // 8)]
        out = benchmark(lambda: [msgspec_frame(f) for f in frames])
        assert len(out) == 8
        return
    decoder = mod.FrameDecoder()
    if impl.endswith("armed"):
        assert decoder.arm_repeat(data[:len(data) // 8])
    out = benchmark(decoder.feed, data)
    assert len(out) == 8 and (type(out[0]) is int) == impl.endswith("armed")


def _reordered_reads(mod, frame, n=8):
    """n heartbeats of the one registration of ``frame``, each with its sets in another order (as a Java client
    writes them, HashSet order), with consecutive opaques; and the frame they repeat."""
    import json
    import random

    rnd = random.Random(5)

    def shuffled(v):
        if isinstance(v, dict):
            return {k: shuffled(x) for k, x in v.items()}
        if isinstance(v, list):
            v = [shuffled(x) for x in v]
            rnd.shuffle(v)
            return v
        return v

    cmd = mod.decode_frame(frame)
    value = json.loads(cmd.body)
    out = []
    for i in range(n):
        cmd.opaque = 1_000_000_000 + i
        cmd.body = json.dumps(shuffled(value), separators=(",", ":")).encode()
        out.append(cmd.encode())
    return b"".join(out), out[0]


@pytest.mark.parametrize("impl", ["native-sets", "twin-sets", "native-full", "msgspec"])
def test_reordered_heartbeat_stream(benchmark, impl):
    """A read of 8 heartbeats of one registration in other set orders (the Java heartbeat of PROTOCOL.md 4.4: a
    producer, a consumer with two subscriptions and their tags): handed back as opaques by a decoder armed with
    sets=True (the broker's route: header memcmp + body_digest), or what a route comparing bytes does with them,
    decoded in full (frame + heartbeat body, native), or msgspec decoding each header and body into Structs.
    Figures are per read of 8."""
    benchmark.group = "read of 8 heartbeats in other set orders (java)"
    mod = _frame_py if impl.startswith("twin") else _frame
    data, first = _reordered_reads(mod, SAMPLES[0][1])
    frames = []
    off = 0
    while off < len(data):
        size = int.from_bytes(data[off:off + 4], "big") + 4
        frames.append(data[off:off + size])
        off += size
    assert len(set(f[-700:] for f in frames)) > 4  # other bytes
    if impl == "msgspec":
        out = benchmark(lambda: [(h, _heartbeat_decoder.decode(b)) for h, b in map(msgspec_frame, frames)])
        assert len(out) == 8
        return
    if impl == "native-full":
        def full():
            return [_heartbeat.decode_heartbeat(c.body) for c in decoder.feed(data)]

        decoder = _frame.FrameDecoder()
        out = benchmark(full)
        assert len(out) == 8
        return
    decoder = mod.FrameDecoder()
    assert decoder.arm_repeat(first, sets=True)
    out = benchmark(decoder.feed, data)
    assert out == list(range(1_000_000_000, 1_000_000_008))

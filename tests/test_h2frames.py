"""The HTTP/2 frame layer and gRPC message framing (engine.http2._frames, native, against its twin _frames_py): the
same frames, messages, bytes or error for any input however it is split, the budgets (SETTINGS_MAX_FRAME_SIZE, the
message size) enforced before bytes are held, linear work, and the facade's choice."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_native
from engine.http2 import _frames_py as P
from engine.http2._frames_py import FrameError

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def native():
    require_native()
    from engine.http2 import _frames

    return _frames


@pytest.fixture(params=["native", "twin"])
def impl(request):
    return native() if request.param == "native" else P


def outcome(fn, *args):
    """What a call gives: ("ok", result) or (error class, code, message)."""
    try:
        return ("ok", fn(*args))
    except FrameError as e:
        return ("FrameError", e.code, str(e))
    except Exception as e:  # noqa: BLE001 - the serializers' struct errors must match too
        return (type(e).__name__, str(e))


def split(data, cuts):
    out, pos = [], 0
    for n in cuts:
        if pos >= len(data):
            break
        out.append(data[pos:pos + n])
        pos += n
    if pos < len(data):
        out.append(data[pos:])
    return out


def read_frames(mod, chunks, limit):
    """Per chunk: the frames (or the error, then the end) and the bytes kept."""
    r = mod.FrameReader(limit)
    out = []
    for chunk in chunks:
        try:
            out.append(("ok", r.feed(chunk), r.buffered))
        except FrameError as e:
            out.append(("FrameError", e.code, str(e), r.buffered))
            break
    return out


def read_messages(mod, chunks, limit):
    r = mod.MessageReader(limit)
    return [(r.feed(chunk), r.error, r.error_length, r.buffered) for chunk in chunks]


# ---------------------------------------------------------------------------------------------------------------
# strategies

head = st.tuples(st.integers(0, 40), st.integers(0, 12), st.integers(0, 255), st.integers(0, 2**32 - 1))


@st.composite
def frame_streams(draw):
    """Frames with lengths around the limits, maybe a raw header declaring a big length, maybe garbage."""
    parts = []
    for length, ftype, flags, sid in draw(st.lists(head, max_size=8)):
        payload = draw(st.binary(min_size=length, max_size=length))
        parts.append(P.frame(ftype, flags, sid, payload))
        if draw(st.integers(0, 9)) == 0:
            n = draw(st.sampled_from([16_385, 1 << 20, (1 << 24) - 1, 41, 64]))
            parts.append(n.to_bytes(3, "big") + draw(st.binary(min_size=6, max_size=6)))
    parts.append(draw(st.binary(max_size=20)))
    return b"".join(parts)


@st.composite
def message_streams(draw):
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        body = draw(st.binary(max_size=40))
        flag = draw(st.sampled_from([0, 0, 0, 0, 1, 2, 255]))
        length = len(body) if draw(st.integers(0, 4)) else draw(st.sampled_from([41, 1 << 20, 2**32 - 1]))
        parts.append(bytes((flag,)) + length.to_bytes(4, "big") + body)
    parts.append(draw(st.binary(max_size=8)))
    return b"".join(parts)


cuts = st.lists(st.integers(1, 64), max_size=20)


# ---------------------------------------------------------------------------------------------------------------
# parity, hypothesis


@SETTINGS
@given(data=frame_streams(), cuts=cuts, limit=st.sampled_from([0, 8, 40, 16_384, (1 << 24) - 1]),
       kind=st.sampled_from([bytes, bytearray, memoryview]))
def test_frame_reader_parity_for_any_split(data, cuts, limit, kind):
    chunks = [kind(c) for c in split(data, cuts)]
    got = read_frames(native(), chunks, limit)
    assert got == read_frames(P, chunks, limit)
    # the split does not matter: the frames are those of the whole input, or the same error (a feed that raises
    # gives none of its frames: the connection ends)
    whole = read_frames(P, [data], limit)
    frames = [f for step in got if step[0] == "ok" for f in step[1]]
    if whole and whole[-1][0] == "FrameError":
        assert got[-1][:3] == whole[-1][:3]
    else:
        assert frames == [f for step in whole for f in step[1]]
    assert all(type(f[3]) is bytes for f in frames)


@SETTINGS
@given(data=message_streams(), cuts=cuts, limit=st.sampled_from([0, 10, 40, 4 << 20]))
def test_message_reader_parity_for_any_split(data, cuts, limit):
    chunks = split(data, cuts)
    got = read_messages(native(), chunks, limit)
    assert got == read_messages(P, chunks, limit)
    whole = read_messages(P, [data] if data else [], limit)
    assert [m for step in got for m in step[0]] == [m for step in whole for m in step[0]]
    if whole:
        assert got[-1][1:3] == whole[-1][1:3]


u8, u32 = st.integers(-2, 300), st.integers(-2, 2**32 + 2)
payloads = st.binary(max_size=64) | st.sampled_from([b"x" * (1 << 24)])


@SETTINGS
@given(ftype=u8, flags=u8, sid=u32, payload=payloads, code=u32, ack=st.booleans(),
       pairs=st.lists(st.tuples(st.integers(-1, 70_000), u32), max_size=4))
def test_serializers_parity(ftype, flags, sid, payload, code, ack, pairs):
    n = native()
    calls = [("frame", (ftype, flags, sid, payload)), ("settings", (pairs, ack)), ("ping", (payload[:8], ack)),
             ("goaway", (sid, code, payload[:30])), ("rst_stream", (sid, code)), ("window_update", (sid, code)),
             ("data_message", (sid, payload)), ("unary_answer", (sid, payload[:9], payload[:40], payload[3:9], ack)),
             ("parse_settings", (payload[:40],)), ("u32", (payload[:12], ftype % 13))]
    for name, args in calls:
        assert outcome(getattr(n, name), *args) == outcome(getattr(P, name), *args), name


header_names = st.sampled_from([b":path", b":method", b":scheme", b"content-type", b"grpc-timeout", b"grpc-encoding",
                                b"te", b"grpc-accept-encoding", b"x-mq-client-id", b"x-bin", b"x-a-bin", b"\xc3-bin",
                                b"", b":", b"user-agent", b"\xff\xfe"])
header_values = st.sampled_from([b"POST", b"GET", b"application/grpc", b"1S", b"2999m", b"99999999n",
                                 b"123456789S", b"S", b"", b"1x", b"\xd9\xa1S", b"AAE", b"AA=", b"!!", b"\xff"])
headers = st.lists(st.tuples(header_names, header_values | st.binary(max_size=12)), max_size=12)
grpc_headers = st.lists(st.sampled_from([(b":method", b"POST"), (b":method", b"GET"), (b":path", b"/S/M"),
                                         (b"content-type", b"application/grpc"),
                                         (b"content-type", b"application/grpc+proto"), (b"content-type", b"text/x"),
                                         (b"grpc-encoding", b"identity"), (b"grpc-encoding", b"gzip"),
                                         (b"grpc-timeout", b"1S"), (b"grpc-timeout", b"1x"), (b"te", b"trailers")]),
                        max_size=8) | headers


@SETTINGS
@given(hs=grpc_headers)
def test_request_header_readers_parity(hs):
    n = native()
    assert n.scan_request_headers(hs) == P.scan_request_headers(hs)
    assert n.invocation_metadata(hs) == P.invocation_metadata(hs)
    for name in (b"x-mq-client-id", b":path", b"", b"absent"):
        # the first value of that name, as the metadata (decoded) lists it first (the twin's, which the twin HPACK
        # decoder's decode_unary uses; the compiled decoder keeps it as a kind of the table's entries)
        assert P.header_value(hs, name) == next((v for k, v in hs if k == name), None)
    for _, value in hs:
        a, b = n.parse_timeout(value), P.parse_timeout(value)
        assert a == b and type(a) is type(b)


# ---------------------------------------------------------------------------------------------------------------
# behaviour, both builds


def test_frames_round_trip(impl):
    data = (impl.frame(P.HEADERS, 4, 1, b"hdr") + impl.ping(b"12345678")
            + impl.goaway(7, 11, b"dbg") + impl.settings([(4, 1 << 20), (3, 100)]) + impl.settings(ack=True)
            + impl.rst_stream(3, 8) + impl.window_update(0, 5) + impl.data_message(5, b"msg"))
    frames = impl.FrameReader().feed(data)
    assert frames == [(1, 4, 1, b"hdr"), (6, 0, 0, b"12345678"), (7, 0, 0, bytes.fromhex("000000070000000b") + b"dbg"),
                      (4, 0, 0, bytes.fromhex("000400100000 000300000064".replace(" ", ""))), (4, 1, 0, b""),
                      (3, 0, 3, b"\0\0\0\x08"), (8, 0, 0, b"\0\0\0\x05"), (0, 0, 5, b"\0\0\0\0\x03msg")]
    assert impl.parse_settings(frames[3][3]) == [(4, 1 << 20), (3, 100)]
    assert impl.u32(frames[2][3], 4) == 11


@pytest.mark.parametrize("rst", [True, False])
def test_unary_answer_is_the_frames_of_an_answer(impl, rst):
    got = impl.FrameReader().feed(impl.unary_answer(9, b"\x88", b"answer", b"\x00trailers", rst))
    want = [(1, 4, 9, b"\x88"), (0, 0, 9, b"\0\0\0\0\x06answer"), (1, 5, 9, b"\x00trailers")]
    assert got == want + ([(3, 0, 9, b"\0\0\0\0")] if rst else [])


def test_a_frame_past_the_limit_is_refused_on_its_header(impl):
    r = impl.FrameReader(16_384)
    assert r.feed(P.frame(0, 0, 1, b"x" * 16_384)) == [(0, 0, 1, b"x" * 16_384)]
    with pytest.raises(FrameError) as e:
        r.feed(b"\x00\x40\x01\x00\x00\x00\x00\x00\x01")  # 16,385 bytes declared, none sent
    assert e.value.code == P.FRAME_SIZE_ERROR and r.buffered == 0
    assert str(e.value) == "frame of 16385 bytes past SETTINGS_MAX_FRAME_SIZE 16384"


def test_a_message_past_the_budget_is_refused_on_its_prefix(impl):
    r = impl.MessageReader(100)
    assert r.feed(b"\0\0\0\0\x02ok\0\0\0\0\x65") == [b"ok"]  # 101 declared: past 100, nothing of it held
    assert (r.error, r.error_length, r.buffered) == (P.MESSAGE_TOO_LARGE, 101, 0)
    assert r.feed(b"\0\0\0\0\x01x") == []
    c = impl.MessageReader(100)
    assert c.feed(b"\x01\0\0\0\x01x") == [] and (c.error, c.error_length) == (P.MESSAGE_COMPRESSED, 1)


@pytest.mark.parametrize("reader", ["frames", "messages"])
def test_a_byte_at_a_time_is_linear(impl, reader):
    """256 KiB fed a byte at a time: the partial frame / message grows in place (a copy per byte would be 32 GiB of
    copying); within a few seconds even on a loaded machine, and the same bytes come out."""
    n = 256 << 10
    if reader == "frames":
        r, data = impl.FrameReader(n), P.frame(0, 0, 1, b"z" * n)
    else:
        r, data = impl.MessageReader(n), b"\0" + n.to_bytes(4, "big") + b"z" * n
    t0 = time.process_time()
    out = []
    for i in range(len(data)):
        out += r.feed(data[i:i + 1])
    assert time.process_time() - t0 < 10
    assert out == ([(0, 0, 1, b"z" * n)] if reader == "frames" else [b"z" * n]) and r.buffered == 0


def test_one_error_class_for_both_builds():
    assert native().FrameError is FrameError


@pytest.mark.parametrize("no_ext", ["", "1"])
def test_facade_picks_native_unless_no_extensions(no_ext):
    if not no_ext:
        native()
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_NO_EXTENSIONS"}
    if no_ext:
        env["ENGINE_NO_EXTENSIONS"] = "1"
    out = subprocess.run([sys.executable, "-c", "from engine.http2 import frames as m; print(m.FrameReader.__module__, "
                          "m.MessageReader.__module__, m.unary_answer.__module__, m.NATIVE_FRAMES)"], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    want = "engine.http2._frames_py" if no_ext else "engine.http2._frames"
    assert out == [want, want, want, str(not no_ext)]

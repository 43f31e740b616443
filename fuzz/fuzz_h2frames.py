#!/usr/bin/env python3
"""Coverage-guided differential fuzzer for the HTTP/2 frame layer and gRPC message framing of the native 5.x
transport: engine.http2._frames (native) against engine.http2._frames_py (twin).

Every input is read four ways, by both implementations, with budgets from the input's CRC:

* as the bytes of a connection after its preface: cut into chunks (fuzzlib.cuts_for) fed to a FrameReader
  (SETTINGS_MAX_FRAME_SIZE 0, 16, 16384 or 2^24-1): after each chunk the same frames and bytes kept, or the same
  FrameError (code, message); no payload past the limit, never more than one frame's worth kept. Each frame goes
  back through both serializers to its own bytes, and a SETTINGS payload parses the same (or fails the same);
* as one stream's DATA payloads: the same cuts fed to a MessageReader (grpcMaxMessageBytes 0, 10, 100 or 4 MiB):
  the same messages, error, error_length and bytes kept; no message past the budget, never more than one message
  (and its prefix) kept;
* as a request's header list (lines ``name:value``): the same scan_request_headers, invocation_metadata and
  parse_timeout of every value;
* as the pieces of a unary answer: unary_answer and data_message give the same bytes, which read back as the frames
  they stand for.

Anything else escaping, or a difference, raises and libFuzzer records the input. Run (see FUZZING.md):
``python fuzz/fuzz_h2frames.py -atheris_runs=1000000 CORPUS SEEDS``; seeds (a grpc client's connection: SETTINGS,
WINDOW_UPDATE, the grpc C-core request header blocks of tests/data/hpack with their DATA, PING, RST_STREAM,
CONTINUATION; gRPC message streams; hostile made-up ones) from ``python fuzz/fuzz_h2frames.py --seeds SEEDS``.
"""
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzzlib  # noqa: E402

NATIVE, TWIN = fuzzlib.load("frames", __name__ == "__main__", "engine.http2")

IMPLS = [m for m in (NATIVE, TWIN) if m is not None]
FRAME_LIMITS = (0, 16, 16_384, (1 << 24) - 1)
MESSAGE_LIMITS = (0, 10, 100, 4 << 20)


def error(exc):
    """A FrameError is an answer (its code too); anything else is a crash."""
    if isinstance(exc, TWIN.FrameError):
        return fuzzlib.check_error(exc) + (exc.code,)
    raise exc


def same(kind, verdicts, data):
    if any(v != verdicts[0] for v in verdicts[1:]):
        raise fuzzlib.Divergence(f"{kind}: native {verdicts[0]!r:.400} != twin {verdicts[-1]!r:.400} "
                                 f"for {data[:80]!r}")


def read_frames(mod, pieces, limit):
    r = mod.FrameReader(limit)
    out = []
    for piece in pieces:
        try:
            frames = r.feed(piece)
        except Exception as exc:  # noqa: BLE001 - error() re-raises anything that is not a FrameError
            out.append(error(exc) + (r.buffered,))
            return out
        if any(len(f[3]) > limit or type(f[3]) is not bytes for f in frames) or r.buffered >= 9 + limit:
            raise fuzzlib.Divergence(f"{mod.__name__}: a frame past {limit} or {r.buffered} bytes kept")
        out.append(("ok", frames, r.buffered))
    return out


def read_messages(mod, pieces, limit):
    r = mod.MessageReader(limit)
    out = []
    for piece in pieces:
        messages = r.feed(piece)
        if any(len(m) > limit or type(m) is not bytes for m in messages) or r.buffered > 5 + limit:
            raise fuzzlib.Divergence(f"{mod.__name__}: a message past {limit} or {r.buffered} bytes kept")
        out.append((messages, r.error, r.error_length, r.buffered))
    return out


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001
        return error(exc)


def check_frames(frames, data):
    for ftype, flags, sid, payload in frames:
        raw = [m.frame(ftype, flags, sid, payload) for m in IMPLS]
        same("frame", raw, data)
        if TWIN.FrameReader((1 << 24) - 1).feed(raw[0]) != [(ftype, flags, sid, payload)]:
            raise fuzzlib.Divergence(f"frame round trip: {(ftype, flags, sid)} {payload[:40]!r}")
        if ftype == TWIN.SETTINGS:
            parsed = [outcome(m.parse_settings, payload) for m in IMPLS]
            same("parse_settings", parsed, data)
            if parsed[0][0] == "ok":
                again = [m.settings(parsed[0][1], bool(flags & 1)) for m in IMPLS]
                same("settings", again + ([raw[0]] if flags in (0, 1) and not sid else []), data)


def header_list(data):
    out = []
    for line in data.split(b"\n")[:64]:
        cut = line.find(b":", 1)
        out.append((line, b"") if cut < 0 else (line[:cut], line[cut + 1:]))
    return out


def test_one_input(data):
    x = zlib.crc32(data, 31)
    pieces = list(fuzzlib.chunks(data, fuzzlib.cuts_for(data, 7))) or [b""]
    limit = FRAME_LIMITS[x % 4]
    verdicts = [read_frames(m, pieces, limit) for m in IMPLS]
    same("FrameReader", verdicts, data)
    check_frames([f for step in verdicts[-1] if step[0] == "ok" for f in step[1]], data)

    budget = MESSAGE_LIMITS[(x >> 2) % 4]
    same("MessageReader", [read_messages(m, pieces, budget) for m in IMPLS], data)

    headers = header_list(data)
    same("scan_request_headers", [outcome(m.scan_request_headers, headers) for m in IMPLS], data)
    same("invocation_metadata", [outcome(m.invocation_metadata, headers) for m in IMPLS], data)
    for _, value in headers[:8]:
        same("parse_timeout", [repr(m.parse_timeout(value)) for m in IMPLS], data)

    sid, a, b = x >> 1 & 0x7FFFFFFF, (x >> 8) % (len(data) + 1), (x >> 16) % (len(data) + 1)
    a, b = min(a, b), max(a, b)
    answers = [m.unary_answer(sid, data[:a], data[a:b], data[b:], bool(x & 1)) for m in IMPLS]
    same("unary_answer", answers, data)
    want = [(1, 4, sid, data[:a]), (0, 0, sid, b"\0" + (b - a).to_bytes(4, "big") + data[a:b]), (1, 5, sid, data[b:])]
    if TWIN.FrameReader((1 << 24) - 1).feed(answers[0]) != want + ([(3, 0, sid, b"\0" * 4)] if x & 1 else []):
        raise fuzzlib.Divergence("unary_answer does not read back as its frames")
    same("data_message", [m.data_message(sid, data) for m in IMPLS], data)


# ---------------------------------------------------------------------------------------------------------------
# seeds


def seeds():
    """A grpc client's connection after its preface (the grpc C-core request blocks of tests/data/hpack with their
    DATA), gRPC message streams, request header lists, and hostile made-up frames."""
    t = TWIN
    out = []
    conversation = [t.settings([(t.SETTINGS_ENABLE_PUSH, 0), (t.SETTINGS_INITIAL_WINDOW_SIZE, 4 << 20),
                                (t.SETTINGS_MAX_HEADER_LIST_SIZE, 16 << 10)]), t.window_update(0, 4 << 20),
                    t.settings(ack=True)]
    blocks = fuzzlib.ROOT / "tests" / "data" / "hpack" / "grpc_c_core_blocks.json"
    if blocks.is_file():
        requests = [bytes.fromhex(b) for b in json.loads(blocks.read_text())["requests"]]
        for i, block in enumerate(requests[:6]):
            sid = 1 + 2 * i
            conversation += [t.frame(t.HEADERS, t.FLAG_END_HEADERS, sid, block),
                             t.frame(t.DATA, t.FLAG_END_STREAM, sid, b"\0\0\0\0\x04\x08\x01\x12\x00"),
                             t.ping(b"%08d" % i)]
        out.append(t.frame(t.HEADERS, 0, 1, requests[0][:10])
                   + t.frame(t.CONTINUATION, t.FLAG_END_HEADERS, 1, requests[0][10:]))
    conversation += [t.rst_stream(3, t.CANCEL), t.goaway(11, t.NO_ERROR, b"bye")]
    out.append(b"".join(conversation))
    out += conversation[:4]
    message = b"\x0a\x03abc\x12\x02xy"
    out += [b"\0" + len(message).to_bytes(4, "big") + message,
            (b"\0\0\0\0\0" + b"\0" + len(message).to_bytes(4, "big") + message) * 3,
            b"\x01\0\0\0\x02ab",  # compressed flag
            b"\0\xff\xff\xff\xff",  # 4 GiB declared
            b"\0\0\x40\x01\x00\x00\x00\x00\x01",  # 16,385 bytes declared on a DATA frame
            b"\xff\xff\xff\x09\xff\xff\xff\xff\xff",  # 2^24-1 bytes declared, every bit set
            b"\0\0\0\x04\0\0\0\0\x01" * 20,  # empty SETTINGS ... wrong frame lengths in a row
            t.frame(t.SETTINGS, 0, 0, b"\0\1\0\0" * 3),  # a SETTINGS length not a multiple of 6
            b":method:POST\n:path:/apache.rocketmq.v2.MessagingService/Heartbeat\ncontent-type:application/grpc\n"
            b"grpc-timeout:2999m\nte:trailers\nx-mq-client-id:host@1@0@x\nx-trace-bin:AAEC\nx-a-bin:!!\n"
            b"grpc-encoding:gzip\ngrpc-timeout:123456789S\n\xc3\xa9:\xff\xfe"]
    return out


if __name__ == "__main__":
    print(f"fuzz_h2frames: {fuzzlib.describe(NATIVE, TWIN)}", file=sys.stderr)
    fuzzlib.main("fuzz_h2frames", test_one_input, seeds)

#!/usr/bin/env python3
"""Coverage-guided differential fuzzer for the frame codec: decode_frame and the streaming FrameDecoder.

Every input goes through both implementations (engine.codec._frame, engine.codec._frame_py) three ways:

* ``decode_frame(data)``, and again with a small max frame size taken from the input (the oversize branch);
* a FrameDecoder fed the input in chunks chosen from the input's CRC (whole, 1-byte, small and larger chunks),
  then one more feed after a failure (a failed decoder must stay failed); and the same again with the decoder
  armed on the input's first frame (``arm_repeat``: later copies of it come back as their opaques);
* for every decoded command: ``encode()`` (byte-identical across implementations) and decoding that encoding
  again (what we write must be readable by us).

Each step must end in a result or a typed error (FrameError: RemotingError and ValueError); native and twin must
give the same commands or the same error message. Anything else raises, and libFuzzer records the input.

Run (see FUZZING.md): ``python fuzz/fuzz_frame.py -atheris_runs=5000000 -timeout=10 CORPUS SEEDS``; seeds from
``python fuzz/fuzz_frame.py --seeds SEEDS``. For coverage of the Cython module build it with
``-fsanitize=fuzzer-no-link`` (scripts/sanitize.sh fuzz-build) and LD_PRELOAD atheris' sanitizer+libFuzzer runtime.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzzlib  # noqa: E402

NATIVE, TWIN = fuzzlib.load("frame", __name__ == "__main__")

from engine.codec.enums import DEFAULT_MAX_FRAME_SIZE  # noqa: E402

IMPLS = [m for m in (NATIVE, TWIN) if m is not None]


def command_view(cmd):
    """A decoded command as plain data; repr is included because it echoes untrusted fields."""
    d = cmd.to_dict()
    d["body"] = bytes(d["body"])
    return d, repr(cmd)


def decode_verdict(mod, data, limit):
    try:
        cmd = mod.decode_frame(data, limit)
    except Exception as exc:  # noqa: BLE001 - check_error re-raises anything that is not a typed error
        return fuzzlib.check_error(exc), None
    return ("ok", command_view(cmd)), cmd


def item_view(item):
    """A feed() result: a command, or the opaque of a repeat of the armed frame."""
    return item if type(item) is int else command_view(item)


def stream_verdict(mod, data, cuts, limit, arm=None):
    """What a FrameDecoder makes of the stream: per feed, the commands or the error (with its partial commands).
    With ``arm``, the decoder is first armed on that frame: repeats of it come back as their opaques."""
    decoder = mod.FrameDecoder(limit)
    out = [] if arm is None else [("armed", decoder.arm_repeat(arm))]
    for chunk in fuzzlib.chunks(data, cuts):
        try:
            commands = decoder.feed(chunk)
        except Exception as exc:  # noqa: BLE001
            verdict = fuzzlib.check_error(exc)
            partial = [item_view(c) for c in getattr(exc, "commands", [])]
            out.append((verdict, partial, decoder.buffered))
            try:  # a failed decoder stays failed: the connection is to be closed
                decoder.feed(b"\x00\x00\x00\x08")
            except Exception as again:  # noqa: BLE001
                out.append(fuzzlib.check_error(again))
            else:
                raise fuzzlib.Divergence(f"{mod.__name__}: FrameDecoder accepted input after failing")
            return out
        out.append(([item_view(c) for c in commands], decoder.buffered))
    return out


def check_encode(cmds):
    """Every decoded command re-encodes identically in both implementations, and that encoding decodes."""
    frames = []
    for cmd in cmds:
        try:
            frames.append(("ok", cmd.encode()))
        except Exception as exc:  # noqa: BLE001
            frames.append(fuzzlib.check_error(exc))
    if len(set(frames)) > 1:
        raise fuzzlib.Divergence(f"encode() differs: {frames}")
    if frames and frames[0][0] == "ok":
        again = [decode_verdict(mod, frames[0][1], DEFAULT_MAX_FRAME_SIZE)[0] for mod in IMPLS]
        if again[0][0] != "ok":
            raise fuzzlib.Divergence(f"our own encoding does not decode: {again[0]}")
        if any(v != again[0] for v in again):
            raise fuzzlib.Divergence(f"re-decode differs: {again}")


def same(kind, verdicts, data):
    if any(v != verdicts[0] for v in verdicts[1:]):
        raise fuzzlib.Divergence(f"{kind}: native {verdicts[0]!r} != twin {verdicts[1]!r} for {data[:80]!r}")


def test_one_input(data):
    # decode_frame with the default limit, and with a small limit (8..263 bytes) taken from the input
    results = [decode_verdict(mod, data, DEFAULT_MAX_FRAME_SIZE) for mod in IMPLS]
    same("decode_frame", [v for v, _ in results], data)
    small = 8 + (data[-1] if data else 0)
    same("decode_frame(max_frame_size)", [decode_verdict(mod, data, small)[0] for mod in IMPLS], data)
    decoded = [cmd for _, cmd in results if cmd is not None]
    if decoded:
        check_encode(decoded)
    # the same bytes as a stream, chunked as the input's CRC says
    cuts = fuzzlib.cuts_for(data)
    limit = DEFAULT_MAX_FRAME_SIZE if fuzzlib.zlib.crc32(data, 7) % 4 else small
    same("FrameDecoder", [stream_verdict(mod, data, cuts, limit) for mod in IMPLS], data)
    # armed on the input's first frame (when its length says it is whole), so later copies are repeats
    first = 4 + int.from_bytes(data[:4], "big") if len(data) >= 8 else 0
    if 8 <= first <= len(data):
        same("FrameDecoder armed", [stream_verdict(mod, data, cuts, limit, data[:first]) for mod in IMPLS], data)


def seeds():
    """The real frames, each alone and a few back to back (streams), so mutations start from real bytes; and real
    frames followed by copies with other opaques (repeats, for the armed decoder)."""
    frames = fuzzlib.vector_frames()
    streams = [b"".join(frames[i : i + 3]) for i in range(0, len(frames), 17)]
    repeats = []
    for frame in frames[::7]:
        pattern = TWIN.repeat_pattern(frame, TWIN.decode_frame)
        if pattern is not None:
            repeats.append(frame + b"".join(TWIN.repeat_frame(pattern, o) for o in (0, -5, 2**31 - 1)))
    return frames + streams + repeats


if __name__ == "__main__":
    print(f"fuzz_frame: {fuzzlib.describe(NATIVE, TWIN)}", file=sys.stderr)
    fuzzlib.main("fuzz_frame", test_one_input, seeds)

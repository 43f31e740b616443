#!/usr/bin/env python3
"""Coverage-guided differential fuzzer for the heartbeat decoder (HEART_BEAT bodies, any client dialect).

Every input goes through both implementations (engine.codec._heartbeat, engine.codec._heartbeat_py):

* ``decode_heartbeat(data)``: the decoded HeartbeatData (as to_dict, with subVersions read from the clock
  masked, since a missing subVersion is Java's "now") or a HeartbeatError; native and twin must agree, on the
  error's class and message (as in tests/test_heartbeat_parity.py);
* for a decoded heartbeat: encode_heartbeat() must decode back to an equal heartbeat, and heartbeat_fingerprint()
  must be a Java int (the registry calls both on every heartbeat);
* for one input in eight: ``decode_heartbeats([data, data[:n]])`` (the batch path) must give the same rows in both;
* for one input in four: ``decode_heartbeat(data, max_elements)`` with a small element budget (1-16): the same
  result or the same error (the first element over the budget, as maxHeartbeatElements refuses it) in both;
* ``body_digest(data)`` (the repeat route's digest of a heartbeat body, engine.codec._frame / _frame_py): the same
  value or None in both.

Anything but a result or a typed error raises, and libFuzzer records the input.

Run (see FUZZING.md): ``python fuzz/fuzz_heartbeat.py -atheris_runs=5000000 -timeout=10 CORPUS SEEDS``; seeds
from ``python fuzz/fuzz_heartbeat.py --seeds SEEDS``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzzlib  # noqa: E402

NATIVE, TWIN = fuzzlib.load("heartbeat", __name__ == "__main__")
FRAME_NATIVE, FRAME_TWIN = fuzzlib.implementations("frame")

from engine.codec.heartbeat import encode_heartbeat, heartbeat_fingerprint  # noqa: E402

IMPLS = [m for m in (NATIVE, TWIN) if m is not None]
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def now_ms():
    return time.time_ns() // 1_000_000


def masked(d, t0, t1):
    """to_dict() with subVersions that came from the clock (read during [t0, t1]) replaced by "now"."""
    for c in d["consumers"]:
        for s in c["subscriptions"]:
            if t0 <= s["sub_version"] <= t1:
                s["sub_version"] = "now"
    return d


def verdict(mod, data, max_elements=None):
    t0 = now_ms()
    try:
        hb = mod.decode_heartbeat(data) if max_elements is None else mod.decode_heartbeat(data, max_elements)
    except Exception as exc:  # noqa: BLE001 - check_error re-raises anything that is not a typed error
        # class and message must agree (the twin re-walks a rejected body as the native parser does)
        return fuzzlib.check_error(exc), None
    repr(hb)  # echoes untrusted strings: must work for anything decoded (not compared: it shows raw subVersions)
    return ("ok", masked(hb.to_dict(), t0, now_ms())), hb


def check_round_trip(hb):
    """What the registry does with every decoded heartbeat must not fail, and encode must be decodable."""
    fp = heartbeat_fingerprint(hb)
    if not (type(fp) is int and INT32_MIN <= fp <= INT32_MAX):
        raise fuzzlib.Divergence(f"fingerprint {fp!r} is not a Java int")
    try:
        body = encode_heartbeat(hb)
    except Exception as exc:  # noqa: BLE001 - a typed refusal (a string UTF-8 cannot carry) is an answer
        fuzzlib.check_error(exc)
        return
    for mod in IMPLS:
        again = mod.decode_heartbeat(body)  # any error here is a finding: we must read what we write
        if again != hb:
            raise fuzzlib.Divergence(f"{mod.__name__}: encode/decode round trip changed {hb!r} into {again!r}")


def batch_rows(mod, bodies):
    t0 = now_ms()
    batch = mod.decode_heartbeats(bodies)
    t1 = now_ms()
    rows = []
    for table in ("heartbeats", "producers", "consumers", "subscriptions"):
        cols = getattr(batch, table)
        for name in sorted(cols):
            values = cols[name].tolist()
            if name == "sub_version":
                values = ["now" if t0 <= v <= t1 else v for v in values]
            rows.append((table, name, str(cols[name].dtype), values))
    return rows


def test_one_input(data):
    results = [verdict(mod, data) for mod in IMPLS]
    verdicts = [v for v, _ in results]
    if any(v != verdicts[0] for v in verdicts[1:]):
        raise fuzzlib.Divergence(f"native {verdicts[0]!r} != twin {verdicts[1]!r} for {data[:80]!r}")
    hb = results[0][1]
    if hb is not None:
        check_round_trip(hb)
    if FRAME_NATIVE is not None and FRAME_NATIVE.body_digest(data) != FRAME_TWIN.body_digest(data):
        raise fuzzlib.Divergence(f"body_digest differs for {data[:80]!r}")
    crc = fuzzlib.zlib.crc32(data)
    if len(IMPLS) == 2 and crc % 4 == 1:
        small = [verdict(mod, data, 1 + (crc >> 8) % 16)[0] for mod in IMPLS]
        if small[0] != small[1]:
            raise fuzzlib.Divergence(f"with max_elements: native {small[0]!r} != twin {small[1]!r} for {data[:80]!r}")
    if len(IMPLS) == 2 and crc % 8 == 0:
        bodies = [data, data[: len(data) // 2]]
        a, b = (batch_rows(mod, bodies) for mod in IMPLS)
        if a != b:
            raise fuzzlib.Divergence(f"decode_heartbeats differs for {data[:80]!r}")


def seeds():
    """The captured bodies (ali-ons, C++), each also as the Java client writes it (fastjson, sorted keys) and
    pretty-printed with escaped non-ASCII (the Go/pretty dialects), so mutations start from every dialect."""
    import json

    out = []
    for body in fuzzlib.heartbeat_bodies():
        out.append(body)
        out.append(encode_heartbeat(TWIN.decode_heartbeat(body)))
        out.append(json.dumps(json.loads(body), indent=2, ensure_ascii=True).encode())
    return out


if __name__ == "__main__":
    print(f"fuzz_heartbeat: {fuzzlib.describe(NATIVE, TWIN)}", file=sys.stderr)
    fuzzlib.main("fuzz_heartbeat", test_one_input, seeds)

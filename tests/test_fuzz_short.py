"""The short fuzz run of CI, the replay of every input the fuzzers ever flagged, and hypothesis strategies that
mutate real frames through the whole receive path.

* atheris: each harness (fuzz/fuzz_frame.py, fuzz/fuzz_heartbeat.py) runs a few thousand coverage-guided inputs
  from the real-client seeds in a subprocess (fixed libFuzzer seed, so a failure replays); the long runs and
  their figures are in FUZZING.md;
* regressions: every file under tests/regressions/<harness>/ goes through that harness' checks;
* hypothesis: real frames mutated at one layer (length prefix, header word, header, heartbeat body, with lengths
  fixed up or not) streamed in random chunks into FrameDecoder, each HEART_BEAT body into decode_heartbeat, as
  the server does: native and twin must end each step the same way, and only in typed errors.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import load_vectors, native_available, require_module, require_native
from engine import FrameError, HeartbeatError
from engine.codec import _frame_py, _heartbeat_py

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "fuzz"
REGRESSIONS = Path(__file__).resolve().parent / "regressions"
sys.path.insert(0, str(FUZZ))

import fuzz_brokerlog  # noqa: E402
import fuzz_frame  # noqa: E402  (imported as modules: no atheris instrumentation, native vs twin as built)
import fuzz_h2frames  # noqa: E402
import fuzz_heartbeat  # noqa: E402
import fuzz_hpack  # noqa: E402
import fuzz_pcap  # noqa: E402

HARNESSES = {"frame": fuzz_frame, "heartbeat": fuzz_heartbeat, "brokerlog": fuzz_brokerlog, "pcap": fuzz_pcap,
             "hpack": fuzz_hpack, "h2frames": fuzz_h2frames}
#: Executions per harness in the CI run: a few seconds each at the instrumented rate.
CI_RUNS = {"frame": 8000, "heartbeat": 12000, "brokerlog": 3000, "pcap": 3000, "hpack": 8000, "h2frames": 8000}
#: The twin each harness' Python coverage must include.
TWINS = {"frame": "engine.codec._frame_py", "heartbeat": "engine.codec._heartbeat_py",
         "brokerlog": "engine.recording._brokerlog_py", "pcap": "engine.recording._pcap_py",
         "hpack": "engine.http2._hpack_py", "h2frames": "engine.http2._frames_py"}




# ---------------------------------------------------------------------------------------------------------------
# atheris, short


@pytest.mark.parametrize("name", list(HARNESSES))
def test_atheris_short_run(name, tmp_path):
    require_native()
    require_module("atheris")  # the fuzz extra: pip install -e ".[fuzz]"
    script = str(FUZZ / f"fuzz_{name}.py")
    seeds, corpus = tmp_path / "seeds", tmp_path / "corpus"
    corpus.mkdir()
    env = dict(os.environ, ENGINE_FUZZ_REQUIRE_NATIVE="1", ENGINE_FUZZ_PY_COVERAGE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, script, "--seeds", str(seeds)], check=True, env=env, capture_output=True)
    assert len(list(seeds.iterdir())) >= 5
    runs = CI_RUNS[name]
    # no -timeout here: libFuzzer's per-input alarm (every timeout/2+1 s) can fire during interpreter shutdown
    # and kill a finished run with SIGALRM; the subprocess timeout bounds a hang instead
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, script, f"-atheris_runs={runs}", "-seed=1", "-max_total_time=60",
         "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/", str(corpus), str(seeds)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    elapsed = time.monotonic() - t0
    out = proc.stderr + proc.stdout
    artifacts = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-"))]
    assert proc.returncode == 0 and not artifacts, f"fuzz finding {artifacts}:\n{out[-4000:]}"
    assert f"fuzz_{name}: native " in out, out[:2000]  # the differential ran against the built native module
    # the twin's branches guide mutation too: atheris instrumented its module
    assert f"INFO: Instrumenting {TWINS[name]}" in out, out[:2000]
    assert "Done " in out, out[-2000:]
    print(f"fuzz_{name}: {runs} runs in {elapsed:.1f} s")


# ---------------------------------------------------------------------------------------------------------------
# regressions and seeds, replayed through the harness checks


def regression_files(name):
    d = REGRESSIONS / name
    return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")) if d.is_dir() else []


@pytest.mark.parametrize("name", list(HARNESSES))
def test_regressions_replay(name):
    files = regression_files(name)
    assert files, f"no regression inputs under {REGRESSIONS / name}"
    for path in files:
        HARNESSES[name].test_one_input(path.read_bytes())


@pytest.mark.parametrize("name", list(HARNESSES))
def test_seeds_pass_the_harness(name):
    seeds = HARNESSES[name].seeds()
    assert len(seeds) >= 5
    for data in seeds:
        HARNESSES[name].test_one_input(data)


# ---------------------------------------------------------------------------------------------------------------
# hypothesis: mutated real frames through the receive path

VECTORS = [frame for _, _, frame in load_vectors()]
HEARTBEAT_FRAMES = [f for f in VECTORS if _frame_py.decode_frame(f).code == 34]
OTHER_FRAMES = [f for f in VECTORS if _frame_py.decode_frame(f).code != 34][:40]
TOKENS = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"-", b"0", b"1e400", b"null", b"true", b"\\u", b"\\ud800",
          b"\x00", b"\x7f", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b'"clientID"',
          b'"subscriptionDataSet"', b'"codeSet"', b'"subVersion"', b'"consumeType"', b'"extFields"']
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutate(draw, data, max_ops=3):
    data = bytearray(data)
    for _ in range(draw(st.integers(1, max_ops))):
        if not data:
            data += draw(st.sampled_from(TOKENS))
            continue
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["byte", "token", "delete", "truncate", "duplicate"]))
        if op == "byte":
            data[i] = draw(st.integers(0, 255))
        elif op == "token":
            data[i:i] = draw(st.sampled_from(TOKENS))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[i:]
        else:
            data[i:i] = data[i : i + draw(st.integers(1, 32))]
    return bytes(data)


@st.composite
def mutated_frame(draw):
    """One real frame mutated at one layer; lengths fixed up (so the damage reaches that layer) or left as is."""
    frame = draw(st.sampled_from(HEARTBEAT_FRAMES) if draw(st.integers(0, 3)) else st.sampled_from(OTHER_FRAMES))
    header_len = int.from_bytes(frame[4:8], "big") & 0xFFFFFF
    word_hi = frame[4]
    header, body = frame[8 : 8 + header_len], frame[8 + header_len :]
    layer = draw(st.sampled_from(["body", "body", "header", "raw", "word", "prefix", "none"]))
    if layer == "raw":
        return draw(mutate(frame))
    if layer == "body":
        body = draw(mutate(body))
    elif layer == "header":
        header = draw(mutate(header))
    elif layer == "word":
        word_hi = draw(st.sampled_from([0, 1, 2, 0x7F, 0xFF]))
    total = 4 + len(header) + len(body)
    if layer == "prefix":
        total = draw(st.sampled_from([-1, -(2**31), 0, 3, 4, total - 1, total + 1, 2**31 - 1, 16 * 2**20]))
    word = (word_hi << 24) | len(header)
    return total.to_bytes(4, "big", signed=True) + word.to_bytes(4, "big") + header + body


@st.composite
def streams(draw):
    frames = draw(st.lists(mutated_frame() | st.sampled_from(HEARTBEAT_FRAMES), min_size=1, max_size=3))
    tail = draw(st.sampled_from([b"", b"", b"\x00", b"\x00\x00\x00\x04", b"garbage after a valid frame"]))
    return b"".join(frames) + tail


def receive_path(frame_mod, hb_mod, stream, cuts):
    """What the server makes of a connection's bytes: per command, the decoded heartbeat or error; then the
    stream error, if any. Anything but FrameError / HeartbeatError propagates and fails the test."""
    decoder = frame_mod.FrameDecoder()
    out = []

    def handle(commands):
        for cmd in commands:
            if cmd.code != 34:
                out.append(("command", cmd.code, cmd.opaque, bytes(cmd.body)))
                continue
            try:
                hb = hb_mod.decode_heartbeat(cmd.body)
            except HeartbeatError as exc:
                assert len(str(exc)) <= 512
                out.append(("HeartbeatError",))
            else:
                out.append(("heartbeat", hb.to_dict()))

    off = 0
    for n in cuts + [len(stream)]:
        chunk, off = stream[off : off + n], off + n
        if not chunk:
            break
        try:
            commands = decoder.feed(chunk)
        except FrameError as exc:
            handle(exc.commands)
            out.append(("FrameError", str(exc)))
            return out
        handle(commands)
    return out


def masked(result, t0, t1):
    for item in result:
        if item[0] == "heartbeat":
            fuzz_heartbeat.masked(item[1], t0, t1)
    return result


@SETTINGS
@given(stream=streams(), cuts=st.lists(st.integers(1, 200), max_size=12))
def test_receive_path_parity_on_mutated_real_frames(stream, cuts):
    require_native()
    from engine.codec import _frame, _heartbeat

    t0 = fuzz_heartbeat.now_ms()
    native = receive_path(_frame, _heartbeat, stream, cuts)
    twin = receive_path(_frame_py, _heartbeat_py, stream, cuts)
    t1 = fuzz_heartbeat.now_ms()
    assert masked(native, t0, t1) == masked(twin, t0, t1)


@SETTINGS
@given(data=mutated_frame())
def test_frame_harness_checks_on_mutated_real_frames(data):
    require_native()
    fuzz_frame.test_one_input(data)


@SETTINGS
@given(data=st.sampled_from(HEARTBEAT_FRAMES).flatmap(
    lambda f: mutate(_frame_py.decode_frame(f).body, max_ops=4)))
def test_heartbeat_harness_checks_on_mutated_real_bodies(data):
    require_native()
    fuzz_heartbeat.test_one_input(data)

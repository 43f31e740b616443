"""Shared pieces of the atheris harnesses: the two implementations, verdicts, the seed corpus, the runner.

A verdict is what one implementation makes of one input: ``("ok", <plain data>)`` or ``(<error class name>,
<message>)``. Only engine.RemotingError subclasses that are also ValueError count as an answer; anything else that
escapes (TypeError, IndexError, SystemError, RecursionError, MemoryError, ...) propagates and is a crash. The two
implementations must give equal verdicts, messages included (the parity contract of the codec tests).

Kept free of pytest so that the harnesses, tests/test_fuzz_short.py and the regression replay share one oracle.
"""
import contextlib
import importlib
import os
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: Longest error message accepted: a location, a reason and a short echo (engine.codec.errors.MAX_ECHO) of the input.
MAX_MESSAGE = 512


class Divergence(AssertionError):
    """Native and twin disagree, or an invariant broke: a finding, like a crash."""


def shared_dir() -> Path:
    env = os.environ.get("ENGINE_SHARED_DIR")
    return Path(env) if env else ROOT.parent / "shared"


def implementations(kind, package="engine.codec"):
    """(native, twin) modules of one hot path (``<package>._<kind>`` and ``<package>._<kind>_py``, e.g. "frame"
    or "heartbeat" in engine.codec, "pcap" in engine.recording); native is None if not built.

    ENGINE_FUZZ_REQUIRE_NATIVE=1 makes a missing native module an error rather than a twin-only run.
    """
    twin = importlib.import_module(f"{package}._{kind}_py")
    try:
        native = importlib.import_module(f"{package}._{kind}")
    except ImportError:
        if os.environ.get("ENGINE_FUZZ_REQUIRE_NATIVE"):
            raise
        native = None
    return native, twin


def fuzzing(argv):
    """True unless the command line asks for --seeds or --replay (no fuzzing, nothing to instrument)."""
    return not (len(argv) >= 2 and argv[1] in ("--seeds", "--replay"))


def python_coverage(atheris, fuzzing):
    """The context to import the engine in. When fuzzing, atheris instruments the engine's Python: the twins
    (engine.codec._frame_py, engine.codec._heartbeat_py) and the Python they call (engine.codec.heartbeat, engine.codec.errors), so the
    twin's branches and comparisons guide mutation next to a sancov-instrumented native build (fuzz/long_run.sh).
    atheris' include matches the top-level package, so all of ``engine`` that the harness imports is instrumented.
    ENGINE_FUZZ_PY_COVERAGE=0 leaves the guidance to the native build and runs the twin uninstrumented (needed
    under ASan: atheris' Python instrumentation with the ASan runtime ran the frame harness ten times slower and
    grew RSS by ~40 KB per input); the twin still runs on every input for the differential.
    Imported as a module (replay, tests): no instrumentation."""
    if atheris is None or not fuzzing or os.environ.get("ENGINE_FUZZ_PY_COVERAGE", "1") == "0":
        return contextlib.nullcontext()
    return atheris.instrument_imports(include=["engine"])


def load(kind, main, package="engine.codec", also=()):
    """(native, twin) modules of one hot path, the engine imported under atheris' instrumentation of its Python
    when ``main`` (the harness runs as a fuzzer, not --seeds/--replay, not imported by tests). ``also``: more
    modules the harness drives (e.g. engine.bindings.brokerlog), imported under the same instrumentation."""
    try:
        import atheris  # before the instrumented imports
    except ImportError:  # replaying inputs (--replay, tests/test_fuzz_short.py) works without it
        atheris = None
    with python_coverage(atheris, main and fuzzing(sys.argv)):
        import engine  # noqa: F401  (the facade imports the twins and the Python they call: all instrumented)

        for name in also:
            importlib.import_module(name)
        return implementations(kind, package)


def check_error(exc):
    """A typed decoding error is an answer; re-raise anything else as the crash it is."""
    from engine.codec.errors import RemotingError

    if isinstance(exc, RemotingError) and isinstance(exc, ValueError):
        message = str(exc)
        if len(message) > MAX_MESSAGE:  # errors say where and echo a short prefix, never the input
            raise Divergence(f"{type(exc).__name__} message of {len(message)} chars: {message[:200]!r}...")
        return type(exc).__name__, message
    raise exc


def cuts_for(data, salt=0):
    """Deterministic chunk boundaries for a stream (a function of the input, so every finding replays exactly).

    By a CRC of the data: the whole input at once (3 in 8), 1-byte feeds (1 in 8, inputs up to 128 bytes: it is
    the costly case), chunks of 1-7 bytes (2 in 8) or of 1-97 bytes (the rest).
    """
    seed = zlib.crc32(data, salt)
    mode = seed % 8
    if mode < 3:
        return [len(data)]
    if mode == 3 and len(data) <= 128:
        return [1] * len(data)
    out, total, x = [], 0, seed | 1
    while total < len(data):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF  # small LCG: reproducible without `random` state
        step = 1 + (x >> 8) % (7 if mode < 6 else 97)
        out.append(step)
        total += step
    return out


def chunks(data, cuts):
    off = 0
    for n in cuts:
        if off >= len(data):
            break
        yield data[off : off + n]
        off += n


# ---------------------------------------------------------------------------------------------------------------
# Seed corpus from the real-client captures


def vector_frames():
    """Every captured whole frame (length prefix included) from ../shared/vectors."""
    from engine.codec.vectors import load_vectors

    return [frame for _, _, frame in load_vectors(shared_dir() / "vectors")]


def heartbeat_bodies():
    """The bodies of every captured HEART_BEAT (code 34) frame, decoded with the twin."""
    from engine.codec import _frame_py

    out = []
    for frame in vector_frames():
        cmd = _frame_py.decode_frame(frame)
        if cmd.code == 34 and cmd.body:
            out.append(bytes(cmd.body))
    return out


def write_seeds(directory, items):
    """Write ``items`` (bytes) as seed files named by content hash; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for data in items:
        (directory / f"seed-{zlib.crc32(data):08x}-{len(data)}").write_bytes(data)
    return directory


# ---------------------------------------------------------------------------------------------------------------
# Runner


def describe(native, twin):
    """One line saying which builds are under test (written to stderr at start)."""
    if native is None:
        return f"twin only ({twin.__file__}); native module not importable"
    instrumented = "uninstrumented"
    try:
        with open(native.__file__, "rb") as f:
            blob = f.read()
        if b"__sanitizer_cov_8bit_counters_init" in blob or b"__sanitizer_cov_trace_pc_guard" in blob:
            instrumented = "sancov-instrumented"
        if b"__asan_init" in blob:
            instrumented += "+ASan"
        if b"__ubsan_handle" in blob:
            instrumented += "+UBSan"
    except OSError:
        pass
    return f"native {native.__file__} ({instrumented}) vs twin {twin.__file__}"


def replay(test_one_input, paths):
    """Run the harness over files or directories of inputs without atheris (regression replay)."""
    n = 0
    for p in paths:
        p = Path(p)
        for f in sorted(p.iterdir()) if p.is_dir() else [p]:
            if f.is_file():
                test_one_input(f.read_bytes())
                n += 1
    return n


def main(name, test_one_input, seeds):
    """Command line of a harness.

    ``fuzz_x.py --seeds DIR``       write the seed corpus (from ../shared/vectors) into DIR and exit
    ``fuzz_x.py --replay PATH...``  run every input in the files/directories once, no fuzzing
    ``fuzz_x.py [libFuzzer args]``  fuzz (atheris); e.g. ``-atheris_runs=5000000 CORPUS_DIR SEED_DIR``
    """
    argv = sys.argv
    if len(argv) >= 3 and argv[1] == "--seeds":
        items = seeds()
        write_seeds(argv[2], items)
        print(f"{name}: {len(items)} seeds written to {argv[2]}")
        return
    if len(argv) >= 2 and argv[1] == "--replay":
        t0 = time.monotonic()
        n = replay(test_one_input, argv[2:])
        print(f"{name}: replayed {n} inputs in {time.monotonic() - t0:.1f} s, no finding")
        return
    import atheris  # fuzzing needs it (pip install -e ".[fuzz]")

    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()

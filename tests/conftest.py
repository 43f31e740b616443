"""Shared fixtures: the real-client vectors, and both implementations (native and twin) of every hot path."""
import importlib
import json
import itertools
import os
import random
import socket
import types
from pathlib import Path

import pytest

from engine.codec.vectors import load_vectors as _load_vectors

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ENGINE_SHARED_DIR", ROOT.parent / "shared"))
VECTORS = SHARED / "vectors"

#: Hot-path modules as (native, twin) pairs; the facade picks one of each, the parity tests use both.
HOT_PATHS = {"frame": ("engine.codec._frame", "engine.codec._frame_py"), "heartbeat": ("engine.codec._heartbeat", "engine.codec._heartbeat_py"),
             "expiry": ("engine.registry._expiry", "engine.registry._expiry_py"), "digest": ("engine.registry._digest", "engine.registry._digest_py"),
             "hpack": ("engine.http2._hpack", "engine.http2._hpack_py"),
             "h2core": ("engine.http2._core", "engine.http2._core_py"),
             "grpc_repeat": ("engine.broker._grpc_repeat", "engine.broker.grpc_repeat")}


def load_vectors():
    """Every captured frame: list of (client, index entry, raw frame bytes)."""
    return _load_vectors(VECTORS)


def _port_counter():
    """Ports below the kernel's ephemeral range (ip_local_port_range), from a random start: a connection's local
    port is never taken from there, so a port found free stays free until the broker binds it (a port the kernel
    picked for a bind to 0 could be given to a test client's connection meanwhile: EADDRINUSE, a flaky start)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 12000)
    start = random.randrange(10000, low)
    return itertools.chain(range(start, low), itertools.cycle(range(10000, low)))


_PORTS = _port_counter()


def free_ports(n: int) -> list:
    """``n`` distinct ports free on 127.0.0.1 now, none handed out before in this run (until the range wraps)."""
    out = []
    for port in _PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
        if len(out) == n:
            return out


def free_port() -> int:
    """A port free on 127.0.0.1 for a broker to bind (see free_ports)."""
    return free_ports(1)[0]


def native_available() -> bool:
    try:
        for native, _ in HOT_PATHS.values():
            importlib.import_module(native)
        return True
    except ImportError:
        return False


def strict() -> bool:
    """Under CI (CI=true), ENGINE_REQUIRE_NATIVE=1 or ENGINE_STRICT=1 (scripts/dev.sh test sets it for both runs) a
    missing build or dependency fails a test instead of skipping it: no skip may hide what CI must prove."""
    return (bool(os.environ.get("ENGINE_REQUIRE_NATIVE")) or bool(os.environ.get("ENGINE_STRICT"))
            or os.environ.get("CI", "").lower() == "true")


def require_native(what: str = "native extensions") -> None:
    """Skip when the compiled modules are not built -- or fail, when strict()."""
    if not native_available():
        if strict():
            pytest.fail(f"{what}: not built (required under CI=true / ENGINE_REQUIRE_NATIVE=1)")
        pytest.skip(f"{what}: not built", allow_module_level=True)


def require_module(name: str):
    """The imported module, or a skip -- a failure when strict() -- if it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if strict():
            pytest.fail(f"{name} is not installed (required under CI=true / ENGINE_REQUIRE_NATIVE=1): {e}")
        pytest.skip(f"{name} is not installed", allow_module_level=True)


@pytest.fixture(params=["native", "twin"])
def impl(request):
    """A namespace with `.frame`, `.heartbeat`, `.expiry` and `.digest` modules of one implementation."""
    if request.param == "native":
        require_native()
    which = 0 if request.param == "native" else 1
    return types.SimpleNamespace(
        name=request.param, **{k: importlib.import_module(v[which]) for k, v in HOT_PATHS.items()}
    )


@pytest.fixture
def pair():
    """(native, twin): namespaces of both implementations, for parity tests (which need two different ones)."""
    require_native()
    native, twin = (types.SimpleNamespace(**{k: importlib.import_module(v[i]) for k, v in HOT_PATHS.items()})
                    for i in (0, 1))
    assert native.frame is not twin.frame
    return native, twin


@pytest.fixture(scope="session")
def vectors():
    v = load_vectors()
    assert v, f"no vectors found under {VECTORS}"
    return v


@pytest.fixture
def broker_defaults():
    """Config every broker of test_server's ``broker_factory`` starts with; a module overrides it (test_ioworkers:
    the same tests against ioWorkers=2)."""
    return {}


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every Spark test module (SPARK.md: ~25 s to start; share it), stopped at
    the end of the run."""
    require_module("pyspark")
    from engine.bindings.spark import spark_session

    session = spark_session("local[2]", "rmqhb-tests", test=True)
    yield session
    session.stop()

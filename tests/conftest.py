"""Shared fixtures: the real-client vectors, and both implementations (native and twin) of every hot path."""
import importlib
import json
import os
import types
from pathlib import Path

import pytest

from engine.vectors import load_vectors as _load_vectors

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ENGINE_SHARED_DIR", ROOT.parent / "shared"))
VECTORS = SHARED / "vectors"

#: Hot-path modules as (native, twin) pairs; the facade picks one of each, the parity tests use both.
HOT_PATHS = {"frame": ("engine._frame", "engine._frame_py"), "heartbeat": ("engine._heartbeat", "engine._heartbeat_py"),
             "expiry": ("engine._expiry", "engine._expiry_py"), "digest": ("engine._digest", "engine._digest_py")}


def load_vectors():
    """Every captured frame: list of (client, index entry, raw frame bytes)."""
    return _load_vectors(VECTORS)


def native_available() -> bool:
    try:
        for native, _ in HOT_PATHS.values():
            importlib.import_module(native)
        return True
    except ImportError:
        return False


@pytest.fixture(params=["native", "twin"])
def impl(request):
    """A namespace with `.frame` and `.heartbeat` modules of one implementation."""
    if request.param == "native" and not native_available():
        if os.environ.get("ENGINE_REQUIRE_NATIVE"):
            pytest.fail("native extensions are required (ENGINE_REQUIRE_NATIVE=1) but not built")
        pytest.skip("native extensions not built")
    which = 0 if request.param == "native" else 1
    return types.SimpleNamespace(
        name=request.param, **{k: importlib.import_module(v[which]) for k, v in HOT_PATHS.items()}
    )


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

"""The facade's native/twin switch: engine.NATIVE and ENGINE_NO_EXTENSIONS=1."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, native_available

PROBE = ("import engine; print(engine.NATIVE, engine.RemotingCommand.__module__, "
         "engine.HeartbeatData.__module__, engine.decode_frame.__module__)")


def _probe(**env):
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout.split()
    return out


def test_no_extensions_forces_the_twins():
    native, cmd_mod, hb_mod, fn_mod = _probe(ENGINE_NO_EXTENSIONS="1")
    assert native == "False"
    assert (cmd_mod, hb_mod, fn_mod) == ("engine._frame_py", "engine._heartbeat_py", "engine._frame_py")


def test_native_in_use_when_built():
    if not native_available():
        if os.environ.get("ENGINE_REQUIRE_NATIVE"):
            pytest.fail("native extensions are required (ENGINE_REQUIRE_NATIVE=1) but not built")
        pytest.skip("native extensions not built")
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_NO_EXTENSIONS"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "engine._frame", "engine._heartbeat", "engine._frame"]


def test_twin_facade_decodes_a_real_frame(vectors):
    """The pure-Python fallback is a complete implementation, not a stub: a whole capture decodes through it."""
    client, entry, frame = next(v for v in vectors if v[1]["code"] == 34)
    code = ("import sys, engine; cmd = engine.decode_frame(sys.stdin.buffer.read()); "
            "hb = engine.decode_heartbeat(cmd.body); print(engine.NATIVE, cmd.code, hb.client_id)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, input=frame, capture_output=True,
                         env={**os.environ, "ENGINE_NO_EXTENSIONS": "1"}, check=True).stdout.decode().split()
    assert out == ["False", "34", entry["body_json"]["clientID"]]

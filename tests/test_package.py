"""The facade's native/twin switch: engine.NATIVE and ENGINE_NO_EXTENSIONS=1."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, require_native

PROBE = ("import engine; print(engine.NATIVE, engine.RemotingCommand.__module__, "
         "engine.HeartbeatData.__module__, engine.decode_frame.__module__)")


def _probe(**env):
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout.split()
    return out


def test_no_extensions_forces_the_twins():
    native, cmd_mod, hb_mod, fn_mod = _probe(ENGINE_NO_EXTENSIONS="1")
    assert native == "False"
    assert (cmd_mod, hb_mod, fn_mod) == ("engine.codec._frame_py", "engine.codec._heartbeat_py", "engine.codec._frame_py")


def test_native_in_use_when_built():
    require_native()
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_NO_EXTENSIONS"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "engine.codec._frame", "engine.codec._heartbeat", "engine.codec._frame"]


def test_twin_facade_decodes_a_real_frame(vectors):
    """The pure-Python fallback is a complete implementation, not a stub: a whole capture decodes through it."""
    client, entry, frame = next(v for v in vectors if v[1]["code"] == 34)
    code = ("import sys, engine; cmd = engine.decode_frame(sys.stdin.buffer.read()); "
            "hb = engine.decode_heartbeat(cmd.body); print(engine.NATIVE, cmd.code, hb.client_id)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, input=frame, capture_output=True,
                         env={**os.environ, "ENGINE_NO_EXTENSIONS": "1"}, check=True).stdout.decode().split()
    assert out == ["False", "34", entry["body_json"]["clientID"]]


# Every compiled module counts: a build where one module fell back to its twin is not "native".
MODULES_PROBE = (
    "import json, engine, engine.registry.client_registry as r, engine.bindings.segments as s, "
    "engine.broker.server as srv; "
    "print(json.dumps({'native': engine.NATIVE, 'modules': engine.native_modules(), "
    "'registry': r.IMPLEMENTATION, 'scanner': s.BlockScanner.__module__, 'deduper': s.BodyDeduper.__module__, "
    "'connection': srv.Connection.__name__}))"
)
BLOCK_DIGEST = (
    # a meta-path finder that refuses engine.registry._digest, as a build that did not compile it would
    "import sys\n"
    "class Refuse:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'engine.registry._digest':\n"
    "            raise ImportError('not built')\n"
    "sys.meta_path.insert(0, Refuse())\n"
)


def _modules_probe(prelude="", **env):
    import json

    full_env = {k: v for k, v in os.environ.items() if k != "ENGINE_NO_EXTENSIONS"}
    full_env.update(env)
    out = subprocess.run([sys.executable, "-c", prelude + MODULES_PROBE], cwd=ROOT, env=full_env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_native_modules_report_what_each_user_loads():
    require_native()
    got = _modules_probe()
    assert got["modules"] == {m: True for m in ("_frame", "_heartbeat", "_expiry", "_digest", "_channel_table",
                                                "_intern", "_rules", "_segment", "_brokerlog", "_pcap", "_hpack",
                                                "_frames", "_core", "_protocol", "_grpc_repeat")}
    assert got["connection"] == "NativeConnection"
    assert got["native"] is True
    assert got["registry"] == {"expiry": "native", "digest": "native", "channel_table": "native", "intern": "native",
                               "rules": "native"}
    assert (got["scanner"], got["deduper"]) == ("engine.recording._segment", "engine.recording._segment")


def test_one_missing_module_makes_native_false():
    require_native()
    got = _modules_probe(BLOCK_DIGEST)
    assert got["modules"]["_digest"] is False and got["registry"]["digest"] == "twin"
    assert got["modules"]["_frame"] is True and got["modules"]["_expiry"] is True
    assert got["native"] is False


def test_no_extensions_reports_every_module_as_twin():
    got = _modules_probe(ENGINE_NO_EXTENSIONS="1")
    assert got["native"] is False and not any(got["modules"].values())
    assert got["registry"] == {"expiry": "twin", "digest": "twin", "channel_table": "twin", "intern": "twin",
                               "rules": "twin"}
    assert got["scanner"] == got["deduper"] == "engine.bindings.segments"
    assert got["connection"] == "PyConnection"

"""The interop peers' install policy: pinned versions, and no silent skip under CI."""
import subprocess

import pytest

import test_interop as ti

pytestmark = pytest.mark.interop


def test_lockfile_pins_ali_ons_and_its_whole_tree():
    import json

    pkg = json.loads((ti.LOCK_DIR / "package.json").read_text())
    lock = json.loads((ti.LOCK_DIR / "package-lock.json").read_text())
    assert pkg["dependencies"] == {"ali-ons": ti.ONS_VERSION}
    packages = {k: v for k, v in lock["packages"].items() if k}
    assert packages["node_modules/ali-ons"]["version"] == ti.ONS_VERSION
    # every transitive dependency has an exact version and an integrity hash: `npm ci` installs exactly this
    assert len(packages) > 1
    assert all(v.get("version") and v.get("integrity", "").startswith("sha512-") for v in packages.values())


@pytest.mark.parametrize("env", [{"CI": "true"}, {"ENGINE_REQUIRE_PEERS": "1"}])
def test_unreachable_registry_fails_when_peers_are_required(monkeypatch, env):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("ENGINE_REQUIRE_PEERS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def unreachable(*a, **kw):
        return subprocess.CompletedProcess(a, 1, "", "npm ERR! code ENOTFOUND registry.npmjs.org")

    monkeypatch.setattr(ti.subprocess, "run", unreachable)
    with pytest.raises(pytest.fail.Exception, match="required"):
        ti._install(["npm", "ci"], "npm ci")


def test_unreachable_registry_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("ENGINE_REQUIRE_PEERS", "0")
    monkeypatch.setattr(ti.subprocess, "run",
                        lambda *a, **kw: subprocess.CompletedProcess(a, 1, "", "getaddrinfo EAI_AGAIN"))
    with pytest.raises(pytest.skip.Exception):
        ti._install(["npm", "ci"], "npm ci")


def test_missing_tool_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")

    def missing(*a, **kw):
        raise FileNotFoundError(2, "No such file or directory: 'npm'")

    monkeypatch.setattr(ti.subprocess, "run", missing)
    with pytest.raises(pytest.fail.Exception):
        ti._install(["npm", "ci"], "npm ci")

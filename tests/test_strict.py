"""No skip hides a missing dependency in CI: under CI=true / ENGINE_STRICT=1 / ENGINE_REQUIRE_NATIVE=1 the test
helpers fail where they would skip elsewhere."""
import pytest

import conftest


@pytest.mark.parametrize("env", [{"CI": "true"}, {"ENGINE_STRICT": "1"}, {"ENGINE_REQUIRE_NATIVE": "1"}])
def test_missing_dependency_fails_when_strict(monkeypatch, env):
    for k in ("CI", "ENGINE_STRICT", "ENGINE_REQUIRE_NATIVE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(pytest.fail.Exception):
        conftest.require_module("no_such_module_for_rmqhb")
    monkeypatch.setattr(conftest, "native_available", lambda: False)
    with pytest.raises(pytest.fail.Exception):
        conftest.require_native()


def test_missing_dependency_skips_otherwise(monkeypatch):
    for k in ("CI", "ENGINE_STRICT", "ENGINE_REQUIRE_NATIVE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(pytest.skip.Exception):
        conftest.require_module("no_such_module_for_rmqhb")
    monkeypatch.setattr(conftest, "native_available", lambda: False)
    with pytest.raises(pytest.skip.Exception):
        conftest.require_native()

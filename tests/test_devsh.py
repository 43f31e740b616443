"""scripts/dev.sh (issue 29 §2): a set-up that does only what changed, the browser only for the runs that need it,
and a pyproject that builds without deprecation noise. The plan is read from `dev.sh <command> --dry-run`."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, strict

ENV = {k: v for k, v in os.environ.items() if k not in ("ENGINE_VENV", "ENGINE_EXTRAS", "DEVSH_DRY_RUN",
                                                       "ENGINE_NO_EXTENSIONS")}


def _plan(tree: Path, venv: Path, *args, **env) -> dict:
    out = subprocess.run(["bash", "scripts/dev.sh", *args[:1], "--dry-run", *args[1:]], cwd=tree,
                         env={**ENV, "ENGINE_VENV": str(venv), **env}, capture_output=True, text=True, check=True)
    return dict(line.split(": ", 1) for line in out.stdout.splitlines())


@pytest.fixture
def tree(tmp_path):
    """What dev.sh reads, copied: the tests change sources without touching the checkout."""
    t = tmp_path / "tree"
    for name in ("scripts/dev.sh", "pyproject.toml", "setup.py", "tests/test_report_browser.py",
                 "tests/test_package.py"):
        (t / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, t / name)
    shutil.copytree(ROOT / "pyx", t / "pyx", ignore=shutil.ignore_patterns("*.c", "__pycache__"))
    return t


@pytest.fixture
def venv(tmp_path):
    v = tmp_path / "venv"
    (v / "bin").mkdir(parents=True)
    (v / "bin" / "python").symlink_to(sys.executable)
    return v


def _stamp(tree, venv, extras):
    """The stamp dev.sh writes after a set-up of these extras (its hashes from the dry run's 'stamp' line)."""
    words = _plan(tree, venv, "setup")["stamp"].split()
    hashes = dict(zip(words[::2], words[1::2]))
    (venv / ".rmqhb-setup").write_text(f"package {hashes['package']}\nsources {hashes['sources']}\n"
                                       f"setup.py {hashes['setup.py']}\nextras {extras}\n")


def test_fresh_venv_installs_and_builds(tree, tmp_path):
    plan = _plan(tree, tmp_path / "none", "demo")
    assert plan["venv"].startswith("create")
    assert plan["package"].startswith("install") and plan["extras"] == "spark"  # the demo runs no other extra
    assert plan["build"] == "changed"  # every module: none is built yet
    assert _plan(tree, tmp_path / "none", "test")["extras"] == "test,bench,spark,fuzz,grpc"


def test_nothing_changed_means_no_install_and_no_build(tree, venv):
    _stamp(tree, venv, "test,bench,spark,fuzz,grpc")
    for command in ("setup", "demo", "test"):
        plan = _plan(tree, venv, command)
        assert (plan["venv"], plan["package"], plan["build"]) == (f"keep {venv}", "keep", "none"), command


def test_a_changed_pyx_builds_in_place_only(tree, venv):
    _stamp(tree, venv, "test,bench,spark,fuzz,grpc")
    src = next(tree.glob("pyx/*/*.pyx"))
    src.write_text(src.read_text() + "\n# changed\n")
    plan = _plan(tree, venv, "setup")
    assert (plan["package"], plan["build"]) == ("keep", "changed")


def test_a_changed_pxd_builds_too(tree, venv):
    _stamp(tree, venv, "spark")
    pxd = next(tree.glob("pyx/engine/**/*.pxd"))
    pxd.write_text(pxd.read_text() + "\n")
    assert _plan(tree, venv, "demo")["build"] == "changed"


def test_a_changed_setup_py_or_pyproject_reinstalls(tree, venv):
    _stamp(tree, venv, "spark")
    (tree / "setup.py").write_text((tree / "setup.py").read_text() + "\n")
    plan = _plan(tree, venv, "demo")
    assert plan["package"].startswith("install") and plan["build"] == "all"  # compile flags may have changed
    _stamp(tree, venv, "spark")
    (tree / "pyproject.toml").write_text((tree / "pyproject.toml").read_text() + "\n")
    plan = _plan(tree, venv, "demo")
    assert plan["package"].startswith("install") and plan["build"] == "none"


def test_a_missing_extra_installs_without_a_build(tree, venv):
    """After the demo (spark only), the test run adds the other extras and keeps spark; nothing is compiled."""
    _stamp(tree, venv, "spark")
    plan = _plan(tree, venv, "test")
    assert plan["package"] == "install (extras missing: test bench fuzz grpc)"
    assert plan["extras"] == "spark,test,bench,fuzz,grpc" and plan["build"] == "none"
    assert _plan(tree, venv, "demo")["package"] == "keep"


@pytest.mark.parametrize("args, needed", [
    ((), True),                                              # the whole suite
    (("-k", "frame"), True),                                 # still the whole tree, filtered
    (("tests",), True),
    (("tests/test_report_browser.py::test_x", "-x"), True),
    (("tests/test_package.py",), False),
    (("-m", "not slow", "tests/test_package.py"), False),
])
def test_browser_only_for_runs_that_include_its_test(tree, venv, args, needed):
    _stamp(tree, venv, "test,bench,spark,fuzz,grpc")
    browser = _plan(tree, venv, "test", *args)["browser"]
    assert browser.startswith("needed") == needed, browser
    assert _plan(tree, venv, "demo")["browser"] == "not needed"
    assert _plan(tree, venv, "setup")["browser"] == "not needed"


def test_pyproject_applies_without_a_deprecation_warning():
    """The `license = {text = ...}` table printed setuptools' deprecation block at every build step."""
    code = ("from setuptools.dist import Distribution\n"
            "from setuptools.config.pyprojecttoml import apply_configuration\n"
            "d = apply_configuration(Distribution(), 'pyproject.toml')\n"
            "print(d.metadata.license_expression)\n")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Apache-2.0"]


def test_second_setup_of_this_venv_costs_seconds():
    """The venv running these tests, set up by `dev.sh test` (CI): a second `dev.sh setup` installs and builds
    nothing. Outside such a run (a venv without the stamp, sources being edited) there is nothing to check."""
    venv = Path(sys.prefix)
    plan = _plan(ROOT, venv, "setup")
    if (plan["package"], plan["build"]) != ("keep", "none"):
        if strict() and os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"dev.sh set up {venv} but plans again: {plan}")
        pytest.skip(f"{venv} not set up by this checkout's dev.sh: {plan}")
    t0 = time.monotonic()
    out = subprocess.run(["bash", "scripts/dev.sh", "setup"], cwd=ROOT, env={**ENV, "ENGINE_VENV": str(venv)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["engine.NATIVE = True"]  # no step ran: no pip, no build
    assert time.monotonic() - t0 < 30

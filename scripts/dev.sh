#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/dev.sh demo   set up .venv (core + the spark extra), build, and run the main job (rmqhb demo)
#   bash scripts/dev.sh test   set up .venv (every extra), build, and run the test suite (what CI runs)
#   bash scripts/dev.sh setup  only set up .venv (every extra) and build
# `dev.sh <command> --dry-run [args]` (or DEVSH_DRY_RUN=1) prints the set-up plan and changes nothing.
#
# The set-up does only what changed since the last one: a stamp in the venv ($VENV/.rmqhb-setup) holds hashes of
# pyproject.toml + setup.py ("package") and of the Cython sources pyx/** ("sources"), and the extras installed.
# - package step (fresh venv, pyproject.toml/setup.py changed, an extra missing): pip install -e of the package and
#   its dependencies with ENGINE_NO_EXTENSIONS=1, i.e. metadata only, no compiling (seconds when nothing is new);
# - build step (no stamp, sources or setup.py changed, or engine.NATIVE false): setup.py build_ext --inplace, which
#   compiles only the modules whose .pyx/.pxd are newer than their .so (all of them on a fresh checkout);
# - nothing changed: neither runs, the call costs the engine.NATIVE check (about a second).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ENGINE_VENV:-.venv}
STAMP="$VENV/.rmqhb-setup"
LOG="$VENV/rmqhb-setup.log"
ALL_EXTRAS=test,bench,spark,fuzz,grpc
BROWSER_TEST=tests/test_report_browser.py

cmd=${1:-test}
shift || true
DRY=${DEVSH_DRY_RUN:-}
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
case "$cmd" in
  demo) EXTRAS=${ENGINE_EXTRAS:-spark} ;;  # rmqhb demo runs the core, the broker and the Spark scan only
  test|setup) EXTRAS=${ENGINE_EXTRAS:-$ALL_EXTRAS} ;;
  *) echo "usage: $0 {demo|test|setup} [--dry-run] [args]" >&2; exit 2 ;;
esac

step() { echo "== $*"; }

# sha256 over the names and contents of the files given (sorted), one hex digest
hash_files() { local f; for f in "$@"; do printf '%s\0' "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1; }
PACKAGE_HASH=$(hash_files pyproject.toml setup.py)
mapfile -t SOURCES < <(find pyx -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' \) | LC_ALL=C sort)
SOURCES_HASH=$(hash_files "${SOURCES[@]}")
SETUP_PY_HASH=$(hash_files setup.py)

stamp_get() { [ -f "$STAMP" ] && sed -n "s/^$1 //p" "$STAMP" || true; }
OLD_PACKAGE=$(stamp_get package)
OLD_SOURCES=$(stamp_get sources)
OLD_SETUP_PY=$(stamp_get setup.py)
OLD_EXTRAS=$(stamp_get extras)

# the extras wanted that the stamp does not list (all of them when the package step reinstalls from a new pyproject)
missing_extras() {
  local e have=",$OLD_EXTRAS,"
  [ "$OLD_PACKAGE" = "$PACKAGE_HASH" ] || have=",,"
  for e in ${EXTRAS//,/ }; do case "$have" in *",$e,"*) ;; *) printf '%s ' "$e" ;; esac; done
}
MISSING=$(missing_extras)

PLAN_VENV=keep; PLAN_PACKAGE=keep; PLAN_BUILD=none
[ -x "$VENV/bin/python" ] || PLAN_VENV=create
if [ "$PLAN_VENV" = create ] || [ "$OLD_PACKAGE" != "$PACKAGE_HASH" ] || [ -n "$MISSING" ]; then PLAN_PACKAGE=install; fi
# no stamp: the modules whose .so is missing or older than its sources (all of them on a fresh checkout)
if [ -z "$OLD_SOURCES" ]; then PLAN_BUILD=changed
elif [ "$OLD_SETUP_PY" != "$SETUP_PY_HASH" ]; then PLAN_BUILD=all  # compile flags may have changed: every module
elif [ "$OLD_SOURCES" != "$SOURCES_HASH" ]; then PLAN_BUILD=changed; fi  # only the modules whose sources are newer
# the extras the venv will hold: the stamp's (when the package is the same) and the ones asked for
if [ "$OLD_PACKAGE" = "$PACKAGE_HASH" ] && [ -n "$OLD_EXTRAS" ]; then
  INSTALL_EXTRAS=$(printf '%s\n' ${OLD_EXTRAS//,/ } ${EXTRAS//,/ } | awk '!seen[$0]++' | paste -sd, -)
else
  INSTALL_EXTRAS=$EXTRAS
fi

# pip and the build print everything into $LOG; the terminal gets what is being fetched, built and installed
# (not the hundreds of "Requirement already satisfied" lines). On a failure the log's tail is shown.
run_logged() {
  local rc
  echo "\$ $*" >>"$LOG"
  set +e
  PYTHONUNBUFFERED=1 "$@" 2>&1 | tee -a "$LOG" | grep --line-buffered -E \
    '^(Collecting|  Downloading|Successfully installed|Installing collected|  Building|Building|ERROR|error:)|^Compiling |Cythonizing|^building .* extension|Error'
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "scripts/dev.sh: '$*' failed (exit $rc); the last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit "$rc"
  fi
}

setup() {
  if [ "$PLAN_VENV" = create ]; then
    step "creating the virtual environment $VENV"
    python3 -m venv "$VENV"
  fi
  : >"$LOG"
  if [ "$PLAN_PACKAGE" = install ]; then
    # the build tools live in the venv (no isolated build environment per call): the in-place build uses them
    step "pip, setuptools, Cython, numpy (the build tools)"
    run_logged "$VENV/bin/python" -m pip install --upgrade pip
    run_logged "$VENV/bin/python" -m pip install "setuptools>=77" wheel "Cython>=3.0" "numpy>=1.26"
    step "installing the package (editable) with the extras $INSTALL_EXTRAS"
    run_logged env ENGINE_NO_EXTENSIONS=1 "$VENV/bin/python" -m pip install --no-build-isolation -e ".[$INSTALL_EXTRAS]"
    # a new package stamp: the build below decides from the sources alone
    write_stamp "$PACKAGE_HASH" "$OLD_SOURCES" "$OLD_SETUP_PY" "$INSTALL_EXTRAS"
  fi
  if [ "$PLAN_BUILD" != none ]; then build; fi
  # A build that silently fell back to the pure-Python twins is a failure; one more build when the in-place
  # modules went missing since the stamp (a clean checkout, git clean).
  if ! native_check 2>/dev/null; then
    [ "$PLAN_BUILD" = none ] || { native_check; exit 1; }
    PLAN_BUILD=changed
    build
    native_check || exit 1
  fi
  write_stamp "$PACKAGE_HASH" "$SOURCES_HASH" "$SETUP_PY_HASH" "$INSTALL_EXTRAS"
}

build() {
  local force=()
  [ "$PLAN_BUILD" = all ] && force=(--force)
  step "building the Cython extensions in place (${PLAN_BUILD} modules; the compiler's output is in $LOG)"
  run_logged env -u ENGINE_NO_EXTENSIONS -u ENGINE_BUILD_ONLY \
    "$VENV/bin/python" setup.py build_ext --inplace --parallel "$(nproc 2>/dev/null || echo 2)" "${force[@]}"
}

native_check() {
  env -u ENGINE_NO_EXTENSIONS "$VENV/bin/python" -c "import engine, sys; print('engine.NATIVE =', engine.NATIVE); sys.exit(0 if engine.NATIVE else 1)"
}

write_stamp() { printf 'package %s\nsources %s\nsetup.py %s\nextras %s\n' "$@" >"$STAMP"; }

# The report's browser test (tests/test_report_browser.py) drives Debian's chromium through chromedriver
# (selenium, in the test extra). Needed when pytest's arguments name no path (the whole suite) or a path that
# holds that file; installed then when missing (apt-get, as root or through passwordless sudo).
# ENGINE_CHROMIUM / ENGINE_CHROMEDRIVER name other binaries. Without them the test fails under ENGINE_STRICT=1.
browser_needed() {
  local a p paths=0 target
  target=$(realpath "$BROWSER_TEST")
  for a in "$@"; do
    case "$a" in -*) continue ;; esac
    p=${a%%::*}
    [ -e "$p" ] || continue  # an option's value (-k expr, -m "not slow"), not a path
    paths=1
    p=$(realpath "$p")
    case "$target" in "$p" | "$p"/*) return 0 ;; esac
  done
  [ "$paths" = 0 ]
}

browser_present() {
  command -v "${ENGINE_CHROMIUM:-chromium}" >/dev/null 2>&1 && command -v "${ENGINE_CHROMEDRIVER:-chromedriver}" >/dev/null 2>&1
}

ensure_browser() {
  local chrome=${ENGINE_CHROMIUM:-chromium} driver=${ENGINE_CHROMEDRIVER:-chromedriver}
  if browser_present; then return 0; fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
      echo "scripts/dev.sh: $chrome / $driver not found, needed by $BROWSER_TEST; install them as" \
           "root (apt-get install -y chromium chromium-driver) or set ENGINE_CHROMIUM and ENGINE_CHROMEDRIVER" >&2
      exit 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/dev.sh: $chrome / $driver not found and no apt-get here: install Chromium and its chromedriver," \
         "or set ENGINE_CHROMIUM and ENGINE_CHROMEDRIVER ($BROWSER_TEST)" >&2
    exit 1
  fi
  step "installing chromium and chromium-driver ($BROWSER_TEST)"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver
}

if [ -n "$DRY" ]; then
  browser="not needed"
  if [ "$cmd" = test ] && browser_needed "$@"; then
    if browser_present; then browser="needed, present"; else browser="needed, install"; fi
  fi
  echo "venv: $PLAN_VENV $VENV"
  echo "package: $PLAN_PACKAGE${MISSING:+ (extras missing: ${MISSING% })}"
  echo "extras: $INSTALL_EXTRAS"
  echo "build: $PLAN_BUILD"
  echo "browser: $browser"
  echo "stamp: package $PACKAGE_HASH sources $SOURCES_HASH setup.py $SETUP_PY_HASH"
  exit 0
fi

case "$cmd" in
  setup) setup ;;
  demo)
    setup
    step "rmqhb demo $*"
    "$VENV/bin/rmqhb" demo "$@"
    ;;
  test)
    setup
    if browser_needed "$@"; then ensure_browser; fi
    export ENGINE_REQUIRE_NATIVE=1
    # a missing build or test dependency fails a test instead of skipping it (tests/conftest.py strict())
    export ENGINE_STRICT=1
    # the real clients (tests/interop) are pinned and required: an install failure fails the run, never a skip
    export ENGINE_REQUIRE_PEERS=${ENGINE_REQUIRE_PEERS:-1}
    # Slow tests (long fuzz/kill loops, soak) are for `-m slow` runs, not CI.
    step "the test suite (native)"
    set +e
    "$VENV/bin/python" -m pytest -m "not slow" "$@"
    rc=$?
    # The same suite again on the pure-Python twins (ENGINE_NO_EXTENSIONS=1: the facade, registry, server and
    # scan all run the twins; parity tests still compare both). Left out, because the implementation choice
    # does not reach them: the real-client interop tests (they test the broker's behaviour, already proven
    # natively, and take ~2 min), the Spark standalone cluster (~2 min, asserts compiled executors) and the
    # report in a browser (the report writer is plain Python either way).
    step "the twin run (ENGINE_NO_EXTENSIONS=1)"
    ENGINE_NO_EXTENSIONS=1 ENGINE_REQUIRE_NATIVE= "$VENV/bin/python" -m pytest -m "not slow" \
      --ignore=tests/interop --ignore=tests/test_spark_cluster.py --ignore="$BROWSER_TEST" "$@"
    twin_rc=$?
    set -e
    # pytest exit 5 = no tests collected: that is a failure for us, not a pass.
    if [ $rc -ne 0 ]; then exit $rc; fi
    exit $twin_rc
    ;;
esac

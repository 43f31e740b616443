#!/usr/bin/env bash
# Native modules under AddressSanitizer + UndefinedBehaviorSanitizer, built in a private copy of the tree so the
# normal in-place build is never clobbered (see FUZZING.md).
#
#   bash scripts/sanitize.sh [test] [pytest args]   gcc ASan/UBSan build in build/sanitize/tree, then the codec
#                                                    suites (tests/test_frame*, tests/test_heartbeat*), the short
#                                                    fuzz run (tests/test_fuzz_short.py), the channel table, the string pool, the rules,
#                                                    registry, protocol parity, repeat, HPACK, HTTP/2 frame and
#                                                    connection core suites under it
#   bash scripts/sanitize.sh fuzz-build              clang build with ASan/UBSan *and* libFuzzer coverage
#                                                    (-fsanitize=...,fuzzer-no-link) in build/fuzz/tree, for the
#                                                    long atheris runs; prints the environment to run them with
#   bash scripts/sanitize.sh fuzz-env                only print that environment (after fuzz-build)
#
# Environment: PYTHON (default /work/venv/bin/python, else .venv/bin/python), ENGINE_SHARED_DIR (the captures,
# default ../shared), CLANG (default clang-14, else clang).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x /work/venv/bin/python ]; then PYTHON=/work/venv/bin/python; else PYTHON=$ROOT/.venv/bin/python; fi
fi
export ENGINE_SHARED_DIR=${ENGINE_SHARED_DIR:-$(cd "$ROOT/.." && pwd)/shared}

# Copy the sources (not the built .so/.c) into $1 and build every native module there with $2 as -fsanitize.
build_copy() {
  local tree=$1 sanitize=$2
  mkdir -p "$tree"
  # rsync would be nicer; tar keeps the dependency list to coreutils+tar
  tar -C "$ROOT" --exclude='*.so' --exclude='*.c' --exclude='__pycache__' --exclude='.hypothesis' \
    -cf - setup.py pyproject.toml README.md engine bindings pyx tests fuzz | tar -C "$tree" -xf -
  # -fno-sanitize-recover: a UBSan finding aborts the process (a failed run), whatever UBSAN_OPTIONS says
  if ! (cd "$tree" && CFLAGS="-fno-sanitize-recover=all ${CFLAGS:-}" ENGINE_SANITIZE="$sanitize" \
          "$PYTHON" setup.py build_ext --inplace \
          --build-temp "$tree/build/temp" >"$tree/build.log" 2>&1); then
    tail -30 "$tree/build.log" >&2
    echo "sanitized build failed (log: $tree/build.log)" >&2
    exit 1
  fi
  for m in codec/_frame codec/_heartbeat registry/_expiry registry/_digest registry/_channel_table registry/_intern \
      registry/_rules broker/_protocol http2/_hpack http2/_frames http2/_core; do
    ls "$tree"/engine/$m.*.so >/dev/null 2>&1 || { echo "sanitized build of engine/$m failed" >&2; exit 1; }
  done
}

runtime_gcc() {  # the ASan runtime gcc linked against: CPython itself is not instrumented, so it must come first
  gcc -print-file-name=libasan.so
}

case "${1:-test}" in
  test)
    shift || true
    TREE=$ROOT/build/sanitize/tree
    rm -rf "$TREE"
    CC=${CC:-gcc} build_copy "$TREE" "address,undefined"
    ASAN_LIB=$(runtime_gcc)
    UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
    nm -D "$TREE"/engine/codec/_frame.*.so | grep __asan_report >/dev/null \
      || { echo "engine.codec._frame is not ASan-instrumented" >&2; exit 1; }
    echo "sanitized build in $TREE; runtime $ASAN_LIB $UBSAN_LIB"
    cd "$TREE"
    # detect_leaks=0: CPython's own allocations at exit are not leaks we can act on. halt_on_error and
    # UBSan's abort make any finding fail the run instead of scrolling by.
    export LD_PRELOAD="$ASAN_LIB $UBSAN_LIB"
    # reports go to files as well: pytest captures a test's stderr, and an abort loses what it captured
    rm -f "$TREE"/sanitizer.*
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1
    export ASAN_OPTIONS=$ASAN_OPTIONS:log_path=$TREE/sanitizer.asan
    export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$TREE/sanitizer.ubsan
    export PYTHONMALLOC=malloc  # let ASan see every Python-level allocation too (no pymalloc arenas)
    export ENGINE_REQUIRE_NATIVE=1 ENGINE_FUZZ_REQUIRE_NATIVE=1
    # -p no:cacheprovider: the copy is throwaway; tests run from the copy so `engine` is the sanitized build
    set +e
    "$PYTHON" -m pytest -p no:cacheprovider -q -m "not slow" \
      tests/test_frame.py tests/test_frame_parity.py tests/test_frame_vectors.py \
      tests/test_heartbeat.py tests/test_heartbeat_parity.py tests/test_fuzz_short.py \
      tests/test_channel_table.py tests/test_registry_intern.py tests/test_registry_rules.py tests/test_registry.py tests/test_protocol_parity.py tests/test_repeat.py tests/test_hpack.py tests/test_h2frames.py \
      tests/test_http2_core_parity.py tests/test_http2_prepared.py "$@"
    rc=$?
    set -e
    if ls "$TREE"/sanitizer.* >/dev/null 2>&1; then
      cat "$TREE"/sanitizer.* >&2
      echo "sanitizer reports above (files $TREE/sanitizer.*)" >&2
      exit 1
    fi
    echo "no sanitizer report"
    exit $rc
    ;;
  fuzz-build|fuzz-env)
    TREE=$ROOT/build/fuzz/tree
    CLANG=${CLANG:-$(command -v clang-14 || command -v clang)}
    ATHERIS_DIR=$("$PYTHON" -c "import atheris; print(atheris.path())")
    if [ "$1" = fuzz-build ]; then
      rm -rf "$TREE"
      CC=$CLANG LDSHARED="$CLANG -shared" build_copy "$TREE" "address,undefined,fuzzer-no-link"
      nm "$TREE"/engine/codec/_frame.*.so | grep __sanitizer_cov >/dev/null \
        || { echo "no sancov instrumentation" >&2; exit 1; }
      echo "# fuzz build in $TREE; run the harnesses with:" >&2
    fi
    # atheris ships an ASan runtime with libFuzzer linked in; preloaded, it provides the coverage callbacks
    # the instrumented modules need and the sanitizer checks.
    echo "export PYTHONPATH=$TREE LD_PRELOAD=$ATHERIS_DIR/asan_with_fuzzer.so"
    echo "export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1"
    echo "export ENGINE_FUZZ_REQUIRE_NATIVE=1 ENGINE_FUZZ_PY_COVERAGE=0"
    ;;
  *) echo "usage: $0 {test [pytest args]|fuzz-build|fuzz-env}" >&2; exit 2 ;;
esac

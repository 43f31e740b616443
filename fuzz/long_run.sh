#!/usr/bin/env bash
# Long differential fuzz runs guided by the coverage of both sides: the native module (clang sancov) and the
# pure-Python twin (atheris' bytecode instrumentation, fuzzlib.python_coverage). See FUZZING.md, section 1.
#
#   bash fuzz/long_run.sh build                      snapshot of the committed sources (git archive HEAD) in
#                                                    build/fuzz/long-tree, _frame and _heartbeat built with clang
#                                                    -fsanitize=undefined,fuzzer-no-link, seed corpora written
#   bash fuzz/long_run.sh run HARNESS SECONDS [JOB]  fuzz HARNESS (frame|heartbeat) for SECONDS under nice 19;
#                                                    several JOBs of one harness share its corpus directory
#                                                    (libFuzzer reloads it), each logs to long-HARNESS-JOB.log
#
# Why UBSan and not ASan here: atheris' Python instrumentation under the ASan runtime ran the frame harness ten
# times slower (170 against 1,660 inputs/s) with RSS growing by ~40 KB per input, so a 10M-input run would not
# fit; the ASan long run stays the one recorded with ENGINE_FUZZ_PY_COVERAGE=0 (scripts/sanitize.sh fuzz-build).
# The snapshot keeps the fuzzed build apart from the in-place one, which other work rebuilds while this runs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-/work/venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=$ROOT/.venv/bin/python
CLANG=${CLANG:-$(command -v clang-14 || command -v clang)}
TREE=${LONG_TREE:-$ROOT/build/fuzz/long-tree}  # another tree for a restart while runs use this one
OUT=$ROOT/build/fuzz

case "${1:-}" in
  build)
    rm -rf "$TREE"
    mkdir -p "$TREE"
    git archive HEAD setup.py pyproject.toml README.md engine pyx fuzz | tar -C "$TREE" -xf -
    git rev-parse HEAD >"$TREE/COMMIT"
    (cd "$TREE" && CC=$CLANG LDSHARED="$CLANG -shared" CFLAGS="-fno-sanitize-recover=all" \
       ENGINE_SANITIZE="undefined,fuzzer-no-link" ENGINE_BUILD_ONLY=_frame,_heartbeat \
       "$PYTHON" setup.py build_ext --inplace --build-temp "$TREE/build/temp" >"$TREE/build.log" 2>&1) \
      || { tail -30 "$TREE/build.log" >&2; exit 1; }
    nm "$TREE"/engine/codec/_frame.*.so | grep -q __sanitizer_cov || { echo "no sancov instrumentation" >&2; exit 1; }
    for h in frame heartbeat; do
      ENGINE_SHARED_DIR=${ENGINE_SHARED_DIR:-$(cd "$ROOT/.." && pwd)/shared} PYTHONPATH=$TREE \
        "$PYTHON" "$TREE/fuzz/fuzz_$h.py" --seeds "$TREE/seeds-$h"
    done
    (cd "$TREE" && sha256sum engine/codec/_frame_py.py engine/codec/_heartbeat_py.py engine/codec/heartbeat.py pyx/codec/_frame.pyx \
       pyx/codec/_heartbeat.pyx) >"$TREE/SOURCES.sha256"
    echo "built $TREE at $(cat "$TREE/COMMIT")"
    ;;
  run)
    h=$2 seconds=$3 job=${4:-0}
    ATHERIS_DIR=$("$PYTHON" -c "import atheris; print(atheris.path())")
    # atheris' UBSan runtime with libFuzzer linked in supplies the sancov callbacks of the native build
    export PYTHONPATH=$TREE LD_PRELOAD=$ATHERIS_DIR/ubsan_with_fuzzer.so
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    export ENGINE_FUZZ_REQUIRE_NATIVE=1 ENGINE_FUZZ_PY_COVERAGE=1
    export ENGINE_SHARED_DIR=${ENGINE_SHARED_DIR:-$(cd "$ROOT/.." && pwd)/shared}
    export PATH=$(dirname "$PYTHON"):$PATH  # -merge re-runs the script through its #! line
    corpus=$OUT/long2-corpus-$h artifacts=$OUT/long2-artifacts-$h
    mkdir -p "$corpus" "$artifacts"
    start=$(date +%s)
    set +e
    nice -n 19 "$PYTHON" "$TREE/fuzz/fuzz_$h.py" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "$TREE/seeds-$h" >"$OUT/long-$h-$job.log" 2>&1
    rc=$?
    echo "EXIT rc=$rc elapsed=$(( $(date +%s) - start ))s" >>"$OUT/long-$h-$job.log"
    exit $rc
    ;;
  *) echo "usage: $0 build | run frame|heartbeat SECONDS [JOB]" >&2; exit 2 ;;
esac

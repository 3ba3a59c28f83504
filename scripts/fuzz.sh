#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; tests/fuzz/) and runs each for SECONDS on
# its committed seed corpus (tests/fuzz/corpus/<target>/, read only; new inputs go to a work
# folder). One line per target: time, executions, corpus size. Exits non-zero on a crash, hang,
# leak or sanitizer report, leaving the reproducer and the log in the work folder.
#   scripts/fuzz.sh [SECONDS] [TARGET...]   (default: 60 s, every target; a target is e.g. config)
# Environment: SPECDEC_FUZZ_BUILD_DIR (build-fuzz), SPECDEC_FUZZ_WORK (/tmp/specdec-fuzz),
# CXX_FUZZ (clang++-14 or clang++), SPECDEC_FUZZ_NO_BUILD=1 to use the targets already built (CI
# builds them with its ASan/UBSan suite), SPECDEC_FUZZ_JOBS (1): how many targets run at once.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SPECDEC_FUZZ_BUILD_DIR:-$root/build-fuzz}"
work="${SPECDEC_FUZZ_WORK:-/tmp/specdec-fuzz}"
targets=("$@")
if ((${#targets[@]} == 0)); then
  for d in "$root"/tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi

if [ "${SPECDEC_FUZZ_NO_BUILD:-0}" != 1 ]; then
  cxx="${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++)}"
  launcher=()
  if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja > /dev/null; then launcher+=(-G Ninja); fi
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    "${launcher[@]}" -DSPECDEC_FUZZ=ON -DSPECDEC_TESTS=OFF -DSPECDEC_CUDA=OFF > /dev/null
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
fuzz_one() {  # fuzz_one TARGET: runs it and prints its line; fails on a finding
  local t="$1" log start elapsed execs corp rc=0
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  log="$work/$t/fuzz.log"
  start=$(date +%s)
  "$build/fuzz_$t" "$work/$t/corpus" "$root/tests/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" > "$log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" = 0 ]; then
    echo "fuzz $t: ${elapsed} s, ${execs:-?} executions, corpus ${corp:-?} (files/bytes), no findings"
  else
    echo "fuzz $t: FAILED (exit $rc) after ${elapsed} s; log $log, reproducer in $work/$t/artifacts/"
    grep -m5 -E 'ERROR|runtime error|deadly signal|timeout|out-of-memory' "$log" || true
    return 1
  fi
}

# Up to SPECDEC_FUZZ_JOBS targets at once; every target runs, and any finding fails the script.
jobs_max="${SPECDEC_FUZZ_JOBS:-1}"
status=0
pids=()
for t in "${targets[@]}"; do
  if ((${#pids[@]} >= jobs_max)); then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$t" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status

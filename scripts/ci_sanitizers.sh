#!/usr/bin/env bash
# CI's sanitizer stages, run by scripts/test.sh after the release suite when CI=true:
# 1. asan: one clang build with ASan + UBSan (-O1) of the library, the command, every CPU test
#    binary and the libFuzzer targets (SPECDEC_FUZZ: the parser sources also carry libFuzzer's
#    coverage). Runs every CPU test, minus the end-to-end identity suites (SpecIdentity,
#    EngineIdentity, DraftInstances) and all but the deepest sampled instance of the EAGLE-3 and
#    DFlash ones, and one of each pair of the longest engine tests that differ only in the method
#    or the caller (the seeded rejection mode with the draft model, the CLI's policy replay, the
#    n-gram window batches, DFlash's untapped neighbours, long pauses): they repeat, for minutes
#    under ASan, the kernels and engine paths the kept Engine/Generator/PrefixSharing,
#    WindowReplay and Eagle3Engine/DflashEngine tests already cover.
# 2. fuzz: each libFuzzer target of stage 1's build for SPECDEC_CI_FUZZ_SECONDS (30) on its
#    committed corpus, as many at once as there are cores.
# 3. tsan: ThreadSanitizer (gcc, -O1) over the threaded tests only: the public Engine's
#    (tests/api; its loop runs on a thread of its own, callers on theirs, and the kernels on the
#    thread pool) and the thread pool's own (tests/core). Only those two binaries are built.
#    tests/engine drives the internal core on the calling thread, so its only other threads are
#    the pool's, which the Engine tests run too. Left out there: the engine tests whose cost is
#    the model's arithmetic (seeded rejection mode under eight mixes of load, the policy replay),
#    several minutes under TSan on the threads every other Engine test crosses; the release and
#    ASan stages run them.
# Each stage prints its time. SPECDEC_CI_STAGES (default "asan fuzz tsan") picks stages; fuzz
# builds its own targets when stage 1 did not run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="$(nproc)"
stages="${SPECDEC_CI_STAGES:-asan fuzz tsan}"
skip='SpecIdentity|EngineIdentity|DraftInstances|Eagle3Identity\.SameTokensAsPlain/(d[1-8]_|d10_greedy)|DflashIdentity\.SameTokensAsPlain/(fixed_|cut_d3_|cut_d7_greedy)'
skip+='|Engine\.SeededRejectionModeReproducesUnderAnyLoadWithTheDraftModel|Cli\.BenchReplaysThePolicyAgainstTheBestSchedule'
skip+='|WindowReplay\.ReplayedBatchesOfNgramWindowsGiveThePlainTokens|PausedTaps\.AnUntappedRowLeavesItsNeighboursTapsAlone/dflash'
skip+='|LazyTaps\.LongPausesStayBounded'
# -O1 and line tables only: the sanitizers' reports need file and line, not variables, and full
# debug information costs a good part of the compile time.
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECDEC_CUDA=OFF -DSPECDEC_PCH=ON)
if command -v ccache > /dev/null; then common+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# ccache: paths relative to the checkout (any clone shares the cache), precompiled headers allowed.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
clang="$(command -v clang++-14 || command -v clang++ || true)"

configure() {  # configure BUILD_DIR CMAKE_ARGS...: Ninja for a new build folder when present
  local build="$1"
  shift
  local generator=()
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja > /dev/null; then generator=(-G Ninja); fi
  cmake -S "$root" -B "$build" "${generator[@]}" "${common[@]}" "$@" > /dev/null
}

timed() {  # timed NAME COMMAND...: runs the command and prints how long it took
  local name="$1" start
  shift
  start=$(date +%s)
  "$@"
  echo "stage $name: $(($(date +%s) - start)) s"
}

asan() {
  local build="$root/build-asan"
  [ -n "$clang" ] || { echo "the ASan/UBSan stage needs clang (scripts/deps.sh installs clang-14 when CI=true)" >&2; return 1; }
  configure "$build" -DCMAKE_CXX_COMPILER="$clang" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    -DSPECDEC_FUZZ=ON -DSPECDEC_TESTS=ON
  cmake --build "$build" -j"$jobs"
  # Leaks are reported at exit; a sanitizer report fails the test.
  # SPECDEC_SANITIZED: the server test does not judge RSS growth (ASan's quarantine holds frees).
  (cd "$build" && SPECDEC_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --output-on-failure -LE gpu -E "$skip" -j"$jobs")
}

fuzz() {
  if [ -x "$root/build-asan/fuzz_config" ]; then
    SPECDEC_FUZZ_BUILD_DIR="$root/build-asan" SPECDEC_FUZZ_NO_BUILD=1 SPECDEC_FUZZ_JOBS="$jobs" \
      "$root/scripts/fuzz.sh" "${SPECDEC_CI_FUZZ_SECONDS:-30}"
  else
    SPECDEC_FUZZ_JOBS="$jobs" "$root/scripts/fuzz.sh" "${SPECDEC_CI_FUZZ_SECONDS:-30}"
  fi
}

tsan() {
  local build="$root/build-tsan"
  configure "$build" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
    -DSPECDEC_TSAN=ON -DSPECDEC_TESTS=ON -DSPECDEC_SERVER=OFF
  cmake --build "$build" -j"$jobs" --target test_api test_core
  (cd "$build" && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --output-on-failure -R '^(Engine|EngineLogprobs|EngineQueue|Generator|Session|BrokenModel|DraftModel|ThreadPool)\.' \
      -E '^Engine\.(SeededRejectionModeReproducesUnderAnyLoad|ReplaysThePolicyAgainstTheBestSchedule)' -j"$jobs")
}

for stage in $stages; do
  timed "$stage" "$stage"
done

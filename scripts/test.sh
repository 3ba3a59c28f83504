#!/usr/bin/env bash
# Installs what is missing, builds specdec with its tests and runs the whole CPU test suite.
# GPU tests (ctest label "gpu") run only where a CUDA device is present: scripts/test.sh --gpu.
# In CI (CI=true) it then runs the sanitizer stages too (scripts/ci_sanitizers.sh): the
# ASan/UBSan suite, ThreadSanitizer over the engine's threaded tests, and short fuzz runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SPECDEC_BUILD_DIR:-$root/build-test}"
"$root/scripts/deps.sh"
stage_start=$(date +%s)
# Ninja and ccache when present (a CI that keeps ccache's folder between runs rebuilds only what
# changed); paths relative to the checkout, so that any clone of it shares the cache.
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja > /dev/null; then generator=(-G Ninja); fi
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
# The CUDA backend is compiled wherever the toolkit is, device or not (for the H200 only, to keep
# it short), so that a change that breaks it fails here rather than on the GPU host.
cmake -S "$root" -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_TESTS=ON \
  ${SPECDEC_CMAKE_ARGS:-} > /dev/null
cmake --build "$build" -j"$(nproc)"
echo "stage release build: $(($(date +%s) - stage_start)) s"
cd "$build"
if [ "${1:-}" = "--gpu" ]; then
  ctest --output-on-failure -L gpu
  exit 0
fi
stage_start=$(date +%s)
if ! ctest --output-on-failure -LE gpu -j"$(nproc)"; then
  # The failed tests once more, alone and verbose, so that their output ends the log (a log cut
  # to its tail still shows why) and a failure that does not repeat shows as one; the run fails
  # whatever the second attempt does.
  echo "--- the failed tests again, alone (this run fails either way) ---"
  ctest --rerun-failed -V || true
  exit 1
fi
# The engine's identity and tap tests once more on a backend that records and replays its calls
# as a GPU's does (tests/engine/recording_backend.h): the replayed decode steps and windows, which
# only a recording backend runs, checked where there is no GPU.
SPECDEC_TEST_RECORD=1 ctest --output-on-failure -LE gpu -R 'Identity|MixedBatch|Taps' -j"$(nproc)"
# The engine tests once more with every engine launching its steps ahead of the previous commit
# (EngineOptions::overlap, a GPU's default; the CPU's calls run as they come, so it is off there).
SPECDEC_TEST_OVERLAP=1 ctest --output-on-failure -LE gpu -R 'Identity|Engine|Taps|DraftInstances|KvBudget|MetaUpload|ModelLaunch|PrefixSharing|PromptLogprobs|WindowReplay' -j"$(nproc)"
echo "stage release tests: $(($(date +%s) - stage_start)) s"
if [ "${CI:-}" = true ]; then
  "$root/scripts/ci_sanitizers.sh"
fi

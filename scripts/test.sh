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
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_TESTS=ON ${SPECDEC_CMAKE_ARGS:-} > /dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
if [ "${1:-}" = "--gpu" ]; then
  ctest --output-on-failure -L gpu
  exit 0
fi
ctest --output-on-failure -LE gpu -j"$(nproc)"
echo "stage release suite: $(($(date +%s) - stage_start)) s"
if [ "${CI:-}" = true ]; then
  "$root/scripts/ci_sanitizers.sh"
fi

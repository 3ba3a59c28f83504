#!/usr/bin/env bash
# Builds specdec with the CUDA backend (if not built yet), then the kernel benchmark, and runs it.
# Usage: tools/gpu/build_and_bench.sh [JSON_OUT]   (SPECDEC_BUILD_DIR overrides build-cuda)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${SPECDEC_BUILD_DIR:-$root/build-cuda}
out=${1:-$build/bench_kernels.json}
if [ ! -f "$build/libspecdec.a" ]; then
  cmake -S "$root" -B "$build" -DSPECDEC_CUDA=ON
  cmake --build "$build" --target specdec -j "$(nproc)"
fi
cmake -S "$root/tools/gpu" -B "$build/tools-gpu" -DSPECDEC_BUILD_DIR="$build" -DSPECDEC_ROOT="$root"
cmake --build "$build/tools-gpu" -j "$(nproc)"
"$build/tools-gpu/bench_kernels" "$out"

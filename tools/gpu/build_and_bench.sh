#!/usr/bin/env bash
# Builds the kernel benchmark against specdec with the CUDA backend and runs it.
# Usage: tools/gpu/build_and_bench.sh [JSON_OUT [--quick|--linears|--gemm-kernels|--skinny|--ordered|--profile|--attention B [invariant]]]
#   SPECDEC_BUILD_DIR  specdec build folder (default build-cuda); built first if it has no library
#   SELF_CONTAINED=1   build core + backend inside tools/gpu instead (also builds and runs test_gpu)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${SPECDEC_BUILD_DIR:-$root/build-cuda}
out=${1:-$build/bench_kernels.json}
jobs=$(nproc)
if [ "${SELF_CONTAINED:-0}" = 1 ]; then
  tools="$build/tools-gpu-self"
  cmake -S "$root/tools/gpu" -B "$tools" -DSPECDEC_GPU_SELF_CONTAINED=ON -DSPECDEC_ROOT="$root"
  cmake --build "$tools" -j "$jobs"
  "$tools/test_gpu"
else
  if [ ! -f "$build/libspecdec.a" ]; then
    cmake -S "$root" -B "$build" -DSPECDEC_CUDA=ON
    cmake --build "$build" --target specdec -j "$jobs"
  fi
  tools="$build/tools-gpu"
  cmake -S "$root/tools/gpu" -B "$tools" -DSPECDEC_BUILD_DIR="$build" -DSPECDEC_ROOT="$root"
  cmake --build "$tools" -j "$jobs"
fi
"$tools/bench_kernels" "$out" "${@:2}"

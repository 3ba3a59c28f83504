#!/usr/bin/env bash
# Everything specdec measures on the GPU host, in one go, logs under OUT_DIR:
#   stage "test":  build with CUDA, GPU kernel tests, parity and engine identity tests on the GPU,
#                  the kernel benchmark, and `specdec bench` with the bundled models (batch-invariant
#                  and fast kernels);
#   stage "8b":    a Llama-3.1-8B-shaped checkpoint and `specdec bench` on it.
# Usage: tools/gpu/run_gpu_suite.sh test|8b OUT_DIR [DEPS_PREFIX]
# DEPS_PREFIX holds the headers and static libraries of the Debian packages specdec builds with
# (nlohmann-json, CLI11, PCRE2, GoogleTest) when the host has no package manager.
set -uo pipefail
stage=$1
dest=$2
deps=${3:-}
out=/tmp/specdec-gpu-logs  # logs gather here; DEST gets one archive, refreshed after every step
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-gpu
cd "$root"
run() {  # run NAME CMD...: log to OUT/NAME.log, keep going on failure
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  tail -n 25 "$out/$name.log"
  tar czf "$dest/logs.tar.gz" -C "$out" . 2>/dev/null
  return 0
}
configure() {
  local prefix=()
  [ -n "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$deps")
  run configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_CUDA=ON "${prefix[@]}"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
if [ "$stage" = all ]; then
  # Everything within one call, most important first; the 8B checkpoint is written meanwhile.
  configure
  run build cmake --build "$build" -j"$(nproc)"
  (python3 tools/gpu/make_llama8b_shape.py /tmp/llama8b > "$out/make_8b.log" 2>&1) &
  maker=$!
  run test_gpu "$build/test_gpu"
  export SPECDEC_TEST_DEVICE=cuda
  run parity_gpu "$build/test_model" --gtest_filter='*Parity*'
  run identity_gpu "$build/test_engine"
  unset SPECDEC_TEST_DEVICE
  run bench_bundled_invariant "$build/specdec" bench --device cuda --draft ngram --draft models/draft --json
  wait $maker
  tail -3 "$out/make_8b.log"
  run bench_8b_decode "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1,8,32,64,128 --prompt-tokens 512 --new-tokens 32 --max-rows 128 --kv-memory 40 --json
  run bench_bundled_fast "$build/specdec" bench --device cuda --fast-gpu --draft ngram --draft models/draft --json
  run bench_8b_prefill "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1 --prompt-tokens 2048 --new-tokens 8 --max-batch-tokens 2048 --kv-memory 8 --json
  run bench_8b_invariant "$build/specdec" bench --model /tmp/llama8b --device cuda \
    --batch-sizes 1,8 --prompt-tokens 512 --new-tokens 16 --kv-memory 8 --json
  run bench_kernels env SPECDEC_BUILD_DIR="$build" tools/gpu/build_and_bench.sh "$out/bench_kernels.json"
elif [ "$stage" = final ]; then
  # The short re-run after fixes: tests, then the headline benchmarks.
  configure
  run build cmake --build "$build" -j"$(nproc)" --target specdec_cli test_gpu test_model test_engine
  (python3 tools/gpu/make_llama8b_shape.py /tmp/llama8b > "$out/make_8b.log" 2>&1) &
  maker=$!
  run test_gpu "$build/test_gpu"
  export SPECDEC_TEST_DEVICE=cuda
  run parity_gpu "$build/test_model" --gtest_filter='*Parity*'
  run identity_gpu "$build/test_engine"
  unset SPECDEC_TEST_DEVICE
  run bench_bundled_invariant "$build/specdec" bench --device cuda --draft ngram --draft models/draft --json
  wait $maker
  run bench_8b_decode "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1,8,32,64,128 --prompt-tokens 512 --new-tokens 32 --max-rows 128 --kv-memory 40 --json
  run bench_8b_prefill "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1 --prompt-tokens 2048 --new-tokens 8 --max-batch-tokens 2048 --kv-memory 8 --json
elif [ "$stage" = batched ]; then
  configure
  run build cmake --build "$build" -j"$(nproc)" --target specdec_cli test_gpu
  (python3 tools/gpu/make_llama8b_shape.py /tmp/llama8b > "$out/make_8b.log" 2>&1) &
  maker=$!
  run test_gpu "$build/test_gpu"
  wait $maker
  run bench_8b_decode "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1,8,32,64,128 --prompt-tokens 512 --new-tokens 32 --max-rows 128 --kv-memory 40 --json
  run bench_8b_invariant "$build/specdec" bench --model /tmp/llama8b --device cuda \
    --batch-sizes 1,8 --prompt-tokens 512 --new-tokens 16 --kv-memory 8 --json
elif [ "$stage" = test ]; then
  configure
  run build cmake --build "$build" -j"$(nproc)"
  run test_gpu "$build/test_gpu"
  export SPECDEC_TEST_DEVICE=cuda
  run parity_gpu "$build/test_model" --gtest_filter='*Parity*'
  run identity_gpu "$build/test_engine"
  unset SPECDEC_TEST_DEVICE
  run bench_kernels env SPECDEC_BUILD_DIR="$build" tools/gpu/build_and_bench.sh "$out/bench_kernels.json"
  run bench_bundled_invariant "$build/specdec" bench --device cuda --draft ngram --draft models/draft --json
  run bench_bundled_fast "$build/specdec" bench --device cuda --fast-gpu --draft ngram --draft models/draft --json
elif [ "$stage" = 8b ]; then
  run make_8b python3 tools/gpu/make_llama8b_shape.py /tmp/llama8b
  run bench_8b_decode "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1,8,32,64,128 --prompt-tokens 512 --new-tokens 64 --max-rows 128 --kv-memory 40 --json
  run bench_8b_prefill "$build/specdec" bench --model /tmp/llama8b --device cuda --fast-gpu \
    --batch-sizes 1 --prompt-tokens 2048 --new-tokens 16 --max-batch-tokens 2048 --kv-memory 8 --json
  run bench_8b_invariant "$build/specdec" bench --model /tmp/llama8b --device cuda \
    --batch-sizes 1,8 --prompt-tokens 512 --new-tokens 32 --kv-memory 8 --json
fi

#!/usr/bin/env bash
# Everything specdec measures on the GPU host, logs gathered into OUT_DIR/logs.tar.gz (refreshed
# after every step, so a run cut short still returns what it did). Stages, each one call:
#   all      build, GPU tests, parity and identity on the GPU, every benchmark (most important first)
#   final    build, GPU tests, parity and identity, bundled and 8B headline benchmarks (greedy
#            and sampled decode)
#   batched  build, kernel tests, 8B decode at batch 1..128 (fast and batch-invariant)
#   test     build, GPU tests, parity and identity, kernel benchmark, bundled benchmarks
#   spec     build, GPU tests, parity and identity, the bundled models' speculative benchmark
#   8b       the 8B-shaped checkpoint and its benchmarks (needs a build from an earlier stage)
#   perf     build, GPU kernel tests, 8B decode at batch 1..128, kernel benchmark, parity and
#            identity, bundled benchmarks (the decode-speed work's loop, most telling first)
#   launch   build, GPU kernel tests, the quick kernel benchmark with overlapped launches on
#            and off (twice each, alternating), 8B decode, parity and identity
#   ab       build, GPU kernel tests, then for the environment switch named by SPECDEC_AB_VAR
#            (default SPECDEC_CUDA_EARLY_WEIGHTS) at each of SPECDEC_AB_VALUES (default
#            "1 0 1 0"), in turn: the quick kernel benchmark and 8B engine decode at batch 1 and 8;
#            then parity and identity
#   matrix   as ab, for each set of environment assignments in SPECDEC_MATRIX (sets separated by
#            ';', e.g. "A=0 B=0;A=1 B=0"); then GPU tests and the bundled speculative benchmark
# Usage: tools/gpu/run_gpu_suite.sh STAGE OUT_DIR [DEPS_PREFIX]
# DEPS_PREFIX holds the headers and static libraries of the Debian packages specdec builds with
# (nlohmann-json, CLI11, PCRE2, utf8proc, GoogleTest) when the host has no package manager:
# tools/gpu/pack_deps.sh makes it on a Debian machine.
set -uo pipefail
stage=$1
dest=$2
deps=${3:-}
out=/tmp/specdec-gpu-logs
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-gpu
model8b=/tmp/llama8b
cd "$root"

run() {  # run NAME CMD...: log to OUT/NAME.log, keep going on failure
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  echo "=== $name: exit $? in $((SECONDS - t0)) s"
  tail -n 25 "$out/$name.log"
  tar czf "$dest/logs.tar.gz" -C "$out" . 2>/dev/null
  return 0
}

build() {  # build [TARGET...]
  local prefix=()
  [ -n "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$deps")
  run configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_CUDA=ON "${prefix[@]}"
  local targets=()
  (($#)) && targets=(--target "$@")
  run build cmake --build "$build" -j"$(nproc)" "${targets[@]}"
}

make_8b_in_background() {
  (python3 tools/gpu/make_llama8b_shape.py "$model8b" > "$out/make_8b.log" 2>&1) &
  maker=$!
}

gpu_tests() {
  run test_gpu "$build/test_gpu"
  export SPECDEC_TEST_DEVICE=cuda
  run parity_gpu "$build/test_model"
  run identity_gpu "$build/test_engine"
  unset SPECDEC_TEST_DEVICE
}

bench_bundled() {  # bench_bundled NAME [--fast-gpu]
  local name=$1
  shift
  run "$name" "$build/specdec" bench --device cuda "$@" --draft ngram --draft models/draft --json
}

bench_8b_decode() {  # bench_8b_decode NEW_TOKENS
  run bench_8b_decode "$build/specdec" bench --model "$model8b" --device cuda --fast-gpu \
    --batch-sizes 1,8,32,64,128 --prompt-tokens 512 --new-tokens "$1" --max-rows 128 --kv-memory 40 --json
}

bench_8b_decode_sampled() {  # tokens drawn on the device: temperature 0.8, top-p 0.9
  run bench_8b_decode_sampled "$build/specdec" bench --model "$model8b" --device cuda --fast-gpu \
    --batch-sizes 1,8,32,64,128 --prompt-tokens 512 --new-tokens 32 --max-rows 128 --kv-memory 40 \
    --temperature 0.8 --top-p 0.9 --seed 7 --json
}

bench_8b_prefill() {
  run bench_8b_prefill "$build/specdec" bench --model "$model8b" --device cuda --fast-gpu \
    --batch-sizes 1 --prompt-tokens 2048 --new-tokens 8 --max-batch-tokens 2048 --kv-memory 8 --json
}

bench_8b_invariant() {
  run bench_8b_invariant "$build/specdec" bench --model "$model8b" --device cuda \
    --batch-sizes 1,8 --prompt-tokens 512 --new-tokens 16 --kv-memory 8 --json
}

# bench_with_env NAME ASSIGNMENTS BATCHES NEW_TOKENS MAX_ROWS KV_GIB: the quick kernel benchmark
# and 8B engine decode with the environment assignments (space-separated VAR=VALUE) set.
bench_with_env() {
  local name=$1 set=$2
  # shellcheck disable=SC2086 # the set is a list of assignments for env
  run "quick_$name" env $set SPECDEC_BUILD_DIR="$build" tools/gpu/build_and_bench.sh "$out/quick_$name.json" --quick
  # shellcheck disable=SC2086
  run "decode_$name" env $set "$build/specdec" bench --model "$model8b" --device cuda --fast-gpu \
    --batch-sizes "$3" --prompt-tokens 512 --new-tokens "$4" --max-rows "$5" --kv-memory "$6"
}

bench_kernels() {
  run bench_kernels env SPECDEC_BUILD_DIR="$build" tools/gpu/build_and_bench.sh "$out/bench_kernels.json"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
case "$stage" in
  all)
    build
    make_8b_in_background
    gpu_tests
    bench_bundled bench_bundled_invariant
    wait "$maker"
    bench_8b_decode 32
    bench_bundled bench_bundled_fast --fast-gpu
    bench_8b_prefill
    bench_8b_invariant
    bench_kernels
    ;;
  final)
    build specdec_cli test_gpu test_model test_engine
    make_8b_in_background
    gpu_tests
    bench_bundled bench_bundled_invariant
    wait "$maker"
    bench_8b_decode 32
    bench_8b_decode_sampled
    bench_8b_prefill
    ;;
  batched)
    build specdec_cli test_gpu
    make_8b_in_background
    run test_gpu "$build/test_gpu"
    wait "$maker"
    bench_8b_decode 32
    bench_8b_invariant
    ;;
  test)
    build
    gpu_tests
    bench_kernels
    bench_bundled bench_bundled_invariant
    bench_bundled bench_bundled_fast --fast-gpu
    ;;
  perf)
    build specdec_cli test_gpu test_model test_engine
    make_8b_in_background
    run test_gpu "$build/test_gpu"
    wait "$maker"
    bench_8b_decode 32
    bench_kernels
    gpu_tests
    bench_bundled bench_bundled_invariant
    ;;
  launch)
    build specdec_cli test_gpu test_model test_engine
    make_8b_in_background
    run test_gpu "$build/test_gpu"
    for pdl in 1 0 1 0; do
      run "quick_pdl$pdl" env SPECDEC_CUDA_PDL="$pdl" SPECDEC_BUILD_DIR="$build" \
        tools/gpu/build_and_bench.sh "$out/quick_pdl$pdl.json" --quick
    done
    wait "$maker"
    bench_8b_decode 32
    gpu_tests
    ;;
  ab)
    var=${SPECDEC_AB_VAR:-SPECDEC_CUDA_EARLY_WEIGHTS}
    build specdec_cli test_gpu test_model test_engine
    make_8b_in_background
    run test_gpu "$build/test_gpu"
    wait "$maker"
    for v in ${SPECDEC_AB_VALUES:-1 0 1 0}; do
      bench_with_env "${var}_$v" "$var=$v" 1,8 64 8 8
    done
    gpu_tests
    ;;
  matrix)
    build specdec_cli test_gpu test_model test_engine
    make_8b_in_background
    run test_gpu "$build/test_gpu"
    wait "$maker"
    IFS=';' read -ra sets <<< "${SPECDEC_MATRIX:-}"
    i=0
    for set in "${sets[@]}"; do
      i=$((i + 1))
      echo "$i: $set" >> "$out/matrix.txt"
      bench_with_env "$i" "$set" 1,8,32,64 32 64 24
    done
    gpu_tests
    bench_bundled bench_bundled_invariant
    ;;
  spec)
    build specdec_cli test_gpu test_model test_engine
    gpu_tests
    bench_bundled bench_bundled_invariant
    ;;
  8b)
    run make_8b python3 tools/gpu/make_llama8b_shape.py "$model8b"
    bench_8b_decode 64
    bench_8b_prefill
    bench_8b_invariant
    ;;
  *)
    echo "unknown stage '$stage' (all, final, batched, test, perf, launch, ab, matrix, spec or 8b)" >&2
    exit 2
    ;;
esac

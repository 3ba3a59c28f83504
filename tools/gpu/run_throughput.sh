#!/usr/bin/env bash
# The throughput measurements in one call on the GPU host, most wanted first, so that a call cut
# short still brings the figures that matter: build, then the 8B shape's decode at batch 1 to 256
# (512-token prompts, 128 new tokens) in both modes and the prefill of one 2,048-token prompt in
# both, the bundled speculative suite (the four methods at batch 1 and 8), the engine's identity
# tests on the GPU, the GPU kernel tests, the bench's input checks on the bundled model, and 64
# rows of 2,048-token prompts.
# Logs go to OUT_DIR/logs.tar.gz, refreshed after every step; a summary is printed last.
# DEPS is either the unpacked tools/gpu/pack_deps.sh archive (the build's Debian dependencies) or
# the unpacked tools/gpu/pack_prebuilt.sh archive (binaries built elsewhere from this commit: no
# build here; it falls back to building when they cannot run).
# Usage: tools/gpu/run_throughput.sh OUT_DIR [DEPS [SECONDS [STEPS]]]: SECONDS (default 570,
# under a ten-minute call) bounds the whole run; a step that would start with less than 15 s left
# is skipped, and a step's limit is cut to what is left. STEPS, comma-separated, picks the steps
# after the build and their order (default: all, in the order above): decode, prefill_2048,
# spec_suite, identity_gpu, test_gpu, check_context, check_no_room, rows64_2048_fast.
set -uo pipefail
dest=$1
deps=${2:-}
budget=${3:-570}
all_steps=decode,prefill_2048,spec_suite,identity_gpu,test_gpu,check_context,check_no_room,rows64_2048_fast
steps=${4:-$all_steps}
prebuilt=false
[ -n "$deps" ] && [ -x "$deps/bin/specdec" ] && prebuilt=true
out=/tmp/specdec-throughput
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-gpu
model8b=/tmp/llama8b
cd "$root"

run() {  # run NAME SECONDS CMD...: log to OUT/NAME.log, stop it after SECONDS, keep going on failure
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if ((left < 15)); then
    echo "=== $name: skipped, $left s left" | tee "$out/$name.log"
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "=== $name: exit $? in $((SECONDS - t0)) s"
  tail -n 12 "$out/$name.log"
  tar czf "$dest/logs.tar.gz" -C "$out" . 2>/dev/null
  return 0
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
date -u > "$out/date.txt"
maker=
if [[ ",$steps," =~ ,(decode|prefill_2048|rows64_2048_fast), ]]; then
  (python3 tools/gpu/make_llama8b_shape.py "$model8b" > "$out/make_8b.log" 2>&1) &
  maker=$!
fi

# Prebuilt binaries (pack_prebuilt.sh): their libraries first on the search path, then the
# host's CUDA libraries; the source folder they were built in pointed at this checkout.
use_prebuilt() {
  local pre=$1 src
  [ -f "$pre/manifest.txt" ] || return 1
  cat "$pre/manifest.txt"
  echo "this checkout: $(git rev-parse HEAD 2> /dev/null || echo unknown)"
  src=$(sed -n 's/^source //p' "$pre/manifest.txt")
  if [ "$src" != "$root" ]; then
    if [ ! -e "$src" ]; then
      mkdir -p "$(dirname "$src")" && ln -s "$root" "$src" || return 1
    elif [ "$(cd "$src" && pwd -P)" != "$(pwd -P)" ]; then
      echo "the binaries read $src, which is another folder than this checkout"
      return 1
    fi
  fi
  local cuda_lib
  cuda_lib=$(dirname "$(command -v nvcc 2> /dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
  export LD_LIBRARY_PATH="$pre/lib:$cuda_lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  if (cd "$pre/bin" && ldd specdec test_engine test_gpu) | grep "not found"; then return 1; fi
  "$pre/bin/specdec" --help > /dev/null || return 1
  spec=$pre/bin/specdec
  tests=$pre/bin
}
spec=
if $prebuilt; then
  library_path=${LD_LIBRARY_PATH:-}
  if use_prebuilt "$deps" > "$out/prebuilt.log" 2>&1; then
    echo "=== prebuilt binaries: $spec"
  else
    echo "=== prebuilt binaries unusable, building here"
    export LD_LIBRARY_PATH=$library_path
  fi
  cat "$out/prebuilt.log"
fi
if [ -z "$spec" ]; then
  prefix=()
  [ -n "$deps" ] && ! $prebuilt && prefix=(-DCMAKE_PREFIX_PATH="$deps")
  run configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_CUDA=ON "${prefix[@]}"
  run build 300 cmake --build "$build" -j"$(nproc)" --target specdec_cli test_gpu test_engine
  spec=$build/specdec
  tests=$build
fi

wait_for_model() {
  while [ -n "$maker" ] && kill -0 "$maker" 2>/dev/null && ((SECONDS < budget - 60)); do sleep 2; done
  [ -n "$maker" ] && tail -n 3 "$out/make_8b.log"
  maker=
}

IFS=, read -r -a order <<< "$steps"
for step in "${order[@]}"; do
  case $step in
    decode)
      wait_for_model
      run decode 150 "$spec" bench --model "$model8b" --device cuda --modes fast,invariant \
        --batch-sizes 1,8,32,64,128,256 --prompt-tokens 512 --new-tokens 128 --json ;;
    prefill_2048)
      wait_for_model
      run prefill_2048 60 "$spec" bench --model "$model8b" --device cuda --modes fast,invariant \
        --batch-sizes 1 --prompt-tokens 2048 --new-tokens 8 --json ;;
    spec_suite)  # the bundled speculative suite, the four methods at batch 1 and 8 (issue 23)
      run spec_suite 130 "$spec" bench --device cuda --skip-plain --draft models/eagle3 \
        --draft models/dflash --draft models/draft --draft ngram --repeats 2 --json ;;
    identity_gpu) run identity_gpu 150 env SPECDEC_TEST_DEVICE=cuda "$tests/test_engine" ;;
    test_gpu) run test_gpu 100 "$tests/test_gpu" ;;
    # Input checks on the bundled model (context 2048): a prompt past the context fails at once; a
    # prompt that leaves no room for a decode step says so instead of printing 0 tok/s.
    check_context) run check_context 30 bash -c "time $spec bench --device cuda --prompt-tokens 5000" ;;
    check_no_room)
      run check_no_room 60 "$spec" bench --device cuda --batch-sizes 1 --prompt-tokens 2047 --new-tokens 8 ;;
    rows64_2048_fast)
      wait_for_model
      run rows64_2048_fast 120 "$spec" bench --model "$model8b" --device cuda --fast-gpu \
        --batch-sizes 1,8,64 --prompt-tokens 2048 --new-tokens 8 --json ;;
    *) echo "=== unknown step $step (known: $all_steps)" ;;
  esac
done

echo "=== summary"
cat "$out/gpu.txt"
grep -h -E "^\[  (PASSED|FAILED)|tests? ran" "$out"/test_gpu.log "$out"/identity_gpu.log 2>/dev/null
for f in decode prefill_2048 check_context check_no_room rows64_2048_fast; do
  echo "--- $f"
  grep -v "^{" "$out/$f.log" 2>/dev/null | grep -E "^(mode|fast|invariant|cpu|specdec|error|real|measured|.*decode not)" | head -20
done
echo "--- spec_suite"
grep -E "^(speculative|complete|edit|quote|free|batch|error)" "$out/spec_suite.log" 2>/dev/null | head -48
tar czf "$dest/logs.tar.gz" -C "$out" .

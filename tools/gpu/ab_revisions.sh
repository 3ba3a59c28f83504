#!/usr/bin/env bash
# A change to the engine's choices (the depth policy, a drafter's rule) measured against the code
# before it on the GPU host, in one call: both trees built, then the same `specdec bench` run
# with each binary in turn, alternating, so that both see the same machine minutes.
#
# Usage: tools/gpu/ab_revisions.sh BEFORE_TARBALL OUT_DIR DEPS_PREFIX [ROUNDS] -- BENCH_ARGS...
#   BEFORE_TARBALL  the earlier tree's sources, made where the history is:
#                   git archive REV -- CMakeLists.txt src include | xz > before.tar.xz
#   OUT_DIR         gets build logs and before_N.txt / after_N.txt, one per bench invocation
#   DEPS_PREFIX     the build's Debian dependencies (tools/gpu/pack_deps.sh), or "" where installed
#   ROUNDS          invocations of each binary (default 2)
# Example: tools/gpu/ab_revisions.sh before.tar.xz out /tmp/deps 2 -- --device cuda --skip-plain
#          --draft models/dflash --draft models/eagle3 --batch-sizes 1,8 --repeats 2
set -uo pipefail
before_src=$1
dest=$2
deps=$3
shift 3
rounds=2
if [ "${1:-}" != "--" ]; then
  rounds=$1
  shift
fi
[ "${1:-}" = "--" ] || { echo "usage: $0 BEFORE_TARBALL OUT_DIR DEPS_PREFIX [ROUNDS] -- BENCH_ARGS..." >&2; exit 2; }
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dest" /tmp/specdec-before
tar xJf "$before_src" -C /tmp/specdec-before || { echo "cannot unpack $before_src" >&2; exit 1; }
prefix=()
[ -n "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$deps")
configure() {  # configure SRC BUILD TESTS
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_CUDA=ON -DSPECDEC_TESTS="$3" "${prefix[@]}"
}
configure "$root" "$root/build-gpu" ON > "$dest/configure_after.log" 2>&1 || { tail -20 "$dest/configure_after.log"; exit 1; }
configure /tmp/specdec-before /tmp/specdec-before/build OFF > "$dest/configure_before.log" 2>&1 ||
  { tail -20 "$dest/configure_before.log"; exit 1; }
jobs=$(nproc)
# Both builds at once, the cores split between them: neither waits for the other's link.
cmake --build /tmp/specdec-before/build -j$((jobs / 2)) --target specdec_cli > "$dest/build_before.log" 2>&1 &
before_pid=$!
cmake --build "$root/build-gpu" -j$((jobs - jobs / 2)) --target specdec_cli > "$dest/build_after.log" 2>&1 ||
  { grep -m5 -A8 error "$dest/build_after.log"; exit 1; }
wait $before_pid || { grep -m5 -A8 error "$dest/build_before.log"; exit 1; }
before=/tmp/specdec-before/build/specdec
after=$root/build-gpu/specdec
for i in $(seq 1 "$rounds"); do
  for side in before after; do
    bin=$before
    [ $side = after ] && bin=$after
    (cd "$root" && "$bin" bench "$@") > "$dest/${side}_$i.txt" 2>&1
    echo "$side $i: rc $?"
  done
done

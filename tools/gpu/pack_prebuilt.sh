#!/usr/bin/env bash
# Builds specdec with the CUDA backend on this machine (compiling needs no GPU) and packs what a
# GPU host runs: specdec, test_engine and test_gpu, stripped, with the shared libraries they load
# beyond glibc, the C++ runtime and the CUDA toolkit's, and a manifest (commit, source folder).
# With it, run_throughput.sh skips the host's own build, a few minutes of every call on a fresh
# host. The binaries read the bundled models, the prompt suite and the tests' fixtures under the
# source folder they were built in; run_throughput.sh points that path at its own checkout, which
# must be the same commit (it prints the manifest).
# Usage: tools/gpu/pack_prebuilt.sh OUT.tar.xz [BUILD_DIR]   (default BUILD_DIR: build-cuda)
# On the GPU host: mkdir -p /tmp/pre && tar xJf OUT.tar.xz -C /tmp/pre, then
# tools/gpu/run_throughput.sh OUT_DIR /tmp/pre [SECONDS [STEPS]].
set -euo pipefail
out="${1:?usage: tools/gpu/pack_prebuilt.sh OUT.tar.xz [BUILD_DIR]}"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${2:-$root/build-cuda}
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja > /dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_CUDA=ON -DSPECDEC_TESTS=ON \
  > /dev/null
cmake --build "$build" -j"$(nproc)" --target specdec_cli test_engine test_gpu

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
binaries=(specdec test_engine test_gpu)
for b in "${binaries[@]}"; do strip -o "$stage/bin/$b" "$build/$b"; done
# The host has its own glibc, C++ runtime and CUDA libraries (newer ones serve these binaries);
# the Debian libraries (PCRE2, utf8proc, cpp-httplib and what it loads) it may lack.
(cd "$build" && ldd "${binaries[@]}") | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case $name in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) ;;
      libcuda.so* | libcudart.so* | libcublas*.so* | libnccl.so*) ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
dirty=""
git -C "$root" diff --quiet HEAD -- || dirty=" (with uncommitted changes)"
{
  echo "commit $(git -C "$root" rev-parse HEAD)$dirty"
  echo "source $root"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(c++ --version | head -1)"
} > "$stage/manifest.txt"
# One dictionary larger than the three binaries together: they share the CUDA kernels' image.
tar cf - -C "$stage" . | xz --lzma2=preset=9,dict=256MiB > "$out"
echo "wrote $out ($(du -h "$out" | cut -f1)): $(tr '\n' ' ' < "$stage/manifest.txt")"
ls "$stage/lib"

#!/usr/bin/env bash
# Packs the headers, static libraries and CMake package files of the Debian packages specdec
# builds with (nlohmann-json, CLI11, PCRE2, utf8proc, GoogleTest) into one archive, for a GPU host
# that has a compiler, CMake and CUDA but no package manager. Unpacked there into a folder, that
# folder is the DEPS argument of run_gpu_suite.sh and run_throughput.sh (CMAKE_PREFIX_PATH): the
# libraries are static, so the binaries built with it need nothing of these packages at run time.
# The HTTP server (cpp-httplib, a shared library with TLS) is left out: a build with this prefix
# has every command but `serve`.
# Usage (on a Debian 12 machine with scripts/deps.sh's packages): tools/gpu/pack_deps.sh OUT.tar.xz
# On the GPU host: mkdir -p /tmp/deps && tar xJf OUT.tar.xz -C /tmp/deps
set -euo pipefail
out="${1:?usage: tools/gpu/pack_deps.sh OUT.tar.xz}"
arch=$(gcc -print-multiarch)
lib=/usr/lib/$arch
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/include" "$stage/lib/$arch/cmake" "$stage/share/cmake"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock "$stage/include/"
cp /usr/include/pcre2.h /usr/include/utf8proc.h "$stage/include/"
for a in libpcre2-8.a libutf8proc.a libgtest.a libgtest_main.a libgmock.a libgmock_main.a; do
  cp "$lib/$a" "$stage/lib/$arch/"
done
cp -r "$lib/cmake/GTest" "$stage/lib/$arch/cmake/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$stage/share/cmake/"
tar cJf "$out" -C "$stage" .
echo "wrote $out ($(du -h "$out" | cut -f1))"

#!/usr/bin/env bash
# Installs the Debian 12 packages specdec builds with, when any is missing. Sourced by the
# quick-start and test scripts; safe to run again.
set -euo pipefail
# cpp-httplib: the HTTP server; its header includes the TLS, zlib and brotli headers that
# Debian built it with. nodejs, npm and curl: the server's end-to-end test (it installs the
# official openai client with npm).
SPECDEC_PACKAGES=(build-essential cmake pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev
  libgtest-dev libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev curl)
# CI also builds the sanitizer stages and libFuzzer targets (scripts/ci_sanitizers.sh) with clang and
# its runtime, and builds with Ninja and ccache (scripts/test.sh uses them when present).
if [ "${CI:-}" = true ]; then SPECDEC_PACKAGES+=(clang-14 libclang-rt-14-dev ninja-build ccache); fi
missing=()
for p in "${SPECDEC_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node may come from elsewhere than Debian (with its own npm): only the commands matter.
command -v node > /dev/null || missing+=(nodejs)
command -v npm > /dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

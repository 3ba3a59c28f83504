#!/usr/bin/env bash
# Installs what is missing, builds specdec and generates with the bundled target model.
# Usage: scripts/quickstart.sh [extra `specdec generate` flags]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_TESTS=OFF > /dev/null
cmake --build "$root/build" -j"$(nproc)" --target specdec_cli
"$root/build/specdec" generate --prompt "def fibonacci(n):" --max-tokens 64 --temperature 0 --draft ngram "$@"

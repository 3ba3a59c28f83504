#!/usr/bin/env bash
# Serving load on a GPU: starts `specdec serve --device cuda` on MODEL_DIR (with the n-gram
# drafter loaded) and runs `specdec bench-serve` at concurrency 1, 16, 64 and 256 (twice as many
# requests as clients, at least 32), plain
# (speculative "none") and with n-gram drafts, writing one JSON report per run into OUT_DIR
# (plus the server's log). Usage: bench/serve_gpu.sh MODEL_DIR OUT_DIR [SPECDEC_BINARY]
# Extra server flags may be given in SPECDEC_SERVE_FLAGS (e.g. "--kv-memory 40").
set -euo pipefail
model="${1:?usage: serve_gpu.sh MODEL_DIR OUT_DIR [SPECDEC_BINARY]}"
out="${2:?usage: serve_gpu.sh MODEL_DIR OUT_DIR [SPECDEC_BINARY]}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${3:-$root/build/specdec}"
mkdir -p "$out"
# GET a path of the server to stdout, failing unless it answers 200: curl where it is installed,
# else Python's standard library (a GPU host may have no curl).
http_get() {
  if command -v curl > /dev/null; then
    curl -sf "$1"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2> /dev/null
  fi
}
# shellcheck disable=SC2086
"$bin" serve --device cuda --model "$model" --port 0 --max-rows 256 --max-queue 1024 --max-batch-tokens 4096 \
  --draft ngram ${SPECDEC_SERVE_FLAGS:-} 2> "$out/server.log" &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 1200); do
  port="$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/server.log" | head -1)"
  if [ -n "$port" ] && http_get "http://127.0.0.1:$port/health" > /dev/null; then break; fi
  kill -0 "$server" 2>/dev/null || { cat "$out/server.log"; exit 1; }
  sleep 0.25
done
url="http://127.0.0.1:$port"
# One short warm-up (first kernels, first pages), not recorded.
"$bin" bench-serve --url "$url" -n 4 -c 4 --max-tokens 16 > /dev/null
for spec in none ngram; do
  for c in 1 16 64 256; do
    n=$((c * 2 < 32 ? 32 : c * 2))
    echo "== speculative $spec, concurrency $c, $n requests"
    "$bin" bench-serve --url "$url" -n "$n" -c "$c" --max-tokens 128 --speculative "$spec" \
      --label "gpu c=$c spec=$spec" --json "$out/serve_c${c}_${spec}.json"
  done
done
http_get "$url/metrics" > "$out/metrics.txt" || true

#!/usr/bin/env bash
# End-to-end test of `specdec serve` on a free loopback port: the official `openai` Node client
# (installed with npm into a cache under the build folder) drives completions and chat, streamed
# and not, n=2, stop strings, seed and logprobs (with echo, the prompt's too), and compares texts
# with `specdec generate`; curl checks every error status and vLLM's prompt_logprobs; then 64
# concurrent streaming clients with random disconnects (nine rounds: solo-equal texts, KV back
# to zero, flat RSS over the last five) and identity through HTTP.
# Usage: serve_openai.sh SPECDEC_BINARY SOURCE_DIR CACHE_DIR
set -euo pipefail
bin="$1"
src="$2"
cache="$3"
here="$src/tests/server"
mkdir -p "$cache"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The openai package, once per build folder (offline afterwards); three tries, since a registry
# that drops one connection is not a failure of the server under test.
for try in 1 2 3; do
  [ -d "$cache/node_modules/openai" ] && break
  (cd "$cache" && npm install --no-audit --no-fund --silent openai@4 > "$cache/npm.log" 2>&1) && break
  cat "$cache/npm.log"
  echo "serve_openai: npm could not install the openai package (try $try of 3)" >&2
  [ "$try" = 3 ] && exit 1
  sleep 10
done

# start_server NAME FLAGS...: starts `specdec serve` on a free port; sets PORT and PID.
start_server() {
  local name="$1"
  shift
  "$bin" serve --device cpu --port 0 "$@" 2> "$work/$name.log" &
  PID=$!
  pids+=("$PID")
  PORT=""
  for _ in $(seq 1 600); do
    PORT="$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/$name.log" | head -1)"
    if [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then return 0; fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/$name.log" >&2
  echo "serve_openai: the server '$name' did not come up" >&2
  exit 1
}

fail=0
# check_status NAME WANT_STATUS WANT_PARAM CURL_ARGS...: one request, its status and error.param.
check_status() {
  local name="$1" want="$2" param="$3"
  shift 3
  local got
  got="$(curl -s -o "$work/body.json" -w '%{http_code}' "$@")"
  local seen
  seen="$(node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
    if(!b.error||typeof b.error.message!=="string"||!("type" in b.error)||!("code" in b.error))process.exit(2);
    console.log(b.error.param===null?"null":b.error.param)' "$work/body.json" 2>/dev/null || echo "NOT-OPENAI-ERROR-JSON")"
  if [ "$got" != "$want" ] || [ "$seen" != "$param" ]; then
    echo "FAIL $name: status $got (want $want), error.param '$seen' (want '$param'): $(head -c 300 "$work/body.json")"
    fail=1
  else
    echo "ok   $name: $got $param"
  fi
}

start_server main --api-key sk-test --draft ngram --draft "$src/models/draft" --max-body-bytes 65536
main_port="$PORT"
main_pid="$PID"
base="http://127.0.0.1:$main_port"
auth=(-H "Authorization: Bearer sk-test" -H "Content-Type: application/json")

# --- the official client -------------------------------------------------------------------------
NODE_PATH="$cache/node_modules" node "$here/openai_client.cjs" "$base" sk-test "$bin" "$src" || fail=1

# --- every error status --------------------------------------------------------------------------
check_status "400 bad temperature" 400 temperature "${auth[@]}" -d '{"prompt":"a","temperature":5}' "$base/v1/completions"
check_status "400 bad max_tokens" 400 max_tokens "${auth[@]}" -d '{"prompt":"a","max_tokens":"x"}' "$base/v1/completions"
check_status "400 bad top_logprobs" 400 top_logprobs "${auth[@]}" \
  -d '{"messages":[{"role":"user","content":"a"}],"logprobs":true,"top_logprobs":50}' "$base/v1/chat/completions"
check_status "400 negative prompt_logprobs" 400 prompt_logprobs "${auth[@]}" -d '{"prompt":"a","prompt_logprobs":-1}' \
  "$base/v1/completions"
check_status "400 prompt_logprobs beyond 20" 400 prompt_logprobs "${auth[@]}" -d '{"prompt":"a","prompt_logprobs":21}' \
  "$base/v1/completions"
check_status "400 bad logit_bias" 400 logit_bias "${auth[@]}" -d '{"prompt":"a","logit_bias":{"a":1}}' "$base/v1/completions"
check_status "400 bad messages" 400 messages "${auth[@]}" -d '{"messages":[]}' "$base/v1/chat/completions"
check_status "400 bad stop" 400 stop "${auth[@]}" -d '{"prompt":"a","stop":[1]}' "$base/v1/completions"
check_status "400 bad n" 400 n "${auth[@]}" -d '{"prompt":"a","n":0}' "$base/v1/completions"
check_status "400 not json" 400 null "${auth[@]}" -d '{"prompt":' "$base/v1/completions"
check_status "400 beyond the context" 400 max_tokens "${auth[@]}" -d '{"prompt":"a b c","max_tokens":2047}' \
  "$base/v1/completions"
check_status "401 without the key" 401 null -H "Content-Type: application/json" -d '{"prompt":"a"}' \
  "$base/v1/completions"
check_status "401 with a wrong key" 401 null -H "Authorization: Bearer nope" -d '{"prompt":"a"}' "$base/v1/completions"
check_status "404 unknown route" 404 null "${auth[@]}" "$base/v1/nothing"
check_status "404 unknown model" 404 model "${auth[@]}" -d '{"prompt":"a","model":"gpt-9"}' "$base/v1/completions"
head -c 100000 /dev/zero | tr '\0' 'a' | sed 's/^/{"prompt":"/; s/$/"}/' > "$work/big.json"
check_status "413 body too large" 413 null "${auth[@]}" --data-binary "@$work/big.json" "$base/v1/completions"

# --- vLLM's prompt_logprobs through curl: null first, then the prompt token and its top N, the
# same numbers as the echoed prompt's logprobs of the same request ----------------------------------
code=$(curl -s -o "$work/prompt_logprobs.json" -w '%{http_code}' "${auth[@]}" \
  -d '{"prompt":"def main():\n    return 1\n","max_tokens":2,"temperature":0,"prompt_logprobs":2,"echo":true,"logprobs":1}' \
  "$base/v1/completions")
if [ "$code" = 200 ] && node -e '
  const assert = require("assert");
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const c = r.choices[0], pl = c.prompt_logprobs, lp = c.logprobs;
  assert.strictEqual(pl.length, r.usage.prompt_tokens);
  assert.strictEqual(pl[0], null);
  for (let i = 1; i < pl.length; i++) {
    const entries = Object.entries(pl[i]);
    assert.ok(entries.length >= 2 && entries.length <= 3, JSON.stringify(pl[i]));
    const own = entries.find(([, v]) => v.decoded_token === lp.tokens[i]);
    assert.ok(own, "position " + i + " lacks its own token");
    assert.ok(Math.abs(own[1].logprob - lp.token_logprobs[i]) < 1e-6);
    for (const [id, v] of entries) {
      assert.ok(/^[0-9]+$/.test(id) && v.logprob <= 0 && Number.isInteger(v.rank) && v.rank >= 1);
      if (v.rank === 1) assert.ok(entries.every(([, w]) => w.logprob <= v.logprob + 1e-6));
    }
  }' "$work/prompt_logprobs.json"; then
  echo "ok   prompt_logprobs through curl"
else
  echo "FAIL prompt_logprobs through curl: status $code: $(head -c 300 "$work/prompt_logprobs.json")"
  fail=1
fi

# --- 64 concurrent streaming clients, disconnects, identity through HTTP -----------------------
node "$here/concurrent_streams.cjs" "$base" sk-test "$main_pid" || fail=1

# --- 256 clients connecting at once, three rounds: every one is answered (the accept queue holds
# the burst; with httplib's queue of 5, some rounds lost dozens of clients to failed reads) ----------
start_server burst --max-rows 64 --max-queue 512
for round in 1 2 3; do
  "$bin" bench-serve --url "http://127.0.0.1:$PORT" -n 256 -c 256 --max-tokens 2 --json "$work/burst.json" \
    > "$work/burst.txt" 2>&1
  if node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.exit(r.completed === 256 && r.errors === 0 ? 0 : 1)' "$work/burst.json" 2> /dev/null; then
    echo "ok   256 clients connecting at once all complete (round $round)"
  else
    echo "FAIL 256 clients connecting at once, round $round: $(grep -E 'completed|failed|refused' "$work/burst.txt" | tr '\n' ' ')"
    fail=1
  fi
done

# --- 429: one row and no waiting place ----------------------------------------------------------
start_server busy --max-rows 1 --max-queue 0
busy="http://127.0.0.1:$PORT"
curl -sN -H "Content-Type: application/json" \
  -d '{"prompt":"def f(x):","max_tokens":400,"ignore_eos":true,"stream":true}' "$busy/v1/completions" \
  > "$work/long.txt" &
long=$!
pids+=("$long")
for _ in $(seq 1 300); do grep -q '"text"' "$work/long.txt" 2>/dev/null && break; sleep 0.05; done
check_status "429 queue full" 429 null -H "Content-Type: application/json" -d '{"prompt":"a","max_tokens":2}' \
  "$busy/v1/completions"
kill "$long" 2>/dev/null || true
# The disconnected stream frees its row: the server takes requests again.
for _ in $(seq 1 100); do
  code="$(curl -s -o /dev/null -w '%{http_code}' -H "Content-Type: application/json" \
    -d '{"prompt":"a","max_tokens":2}' "$busy/v1/completions")"
  [ "$code" = 200 ] && break
  sleep 0.1
done
if [ "$code" != 200 ]; then
  echo "FAIL after the disconnect the busy server still answers $code"
  fail=1
else
  echo "ok   a disconnect frees the row: 200"
fi

exit "$fail"

// 64 concurrent streaming clients against `specdec serve`, a quarter of them hanging up after a
// few chunks, over four warm-up rounds and four measured ones: every stream that completes equals its solo, plain (speculative
// "none") output; afterwards no request is running or waiting and no KV block is held
// (/metrics); the server's RSS, less the KV blocks it pages in for the first time, stays flat from
// round to round. Along the way, identity through
// HTTP: the same text whatever else is in the batch, with or without speculation (none, ngram,
// draft), and with or without a prefix-cache hit.
// Usage: node concurrent_streams.cjs BASE_URL API_KEY SERVER_PID
'use strict';
const assert = require('assert');
const fs = require('fs');

const [base, key, pid] = process.argv.slice(2);
const H = { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' };
// Rounds 0-3 bring what the server keeps at the highest a burst needs (allocator arenas, forward
// buffers, the thread pool) to their peaks, which come in one step or two at an earlier or a later
// round depending on how the rows overlap; rounds 4-8 are measured.
const kClients = 64, kRounds = 9, kWarm = 4, kTokens = 24;

// A header no earlier request has sent (the first request is a prefix-cache miss), shared by
// every prompt (the later ones hit it), then a tail of each prompt's own.
const header = '# case 5e1d: utilities for the inventory service\nimport json\nimport os\nfrom typing import Dict, List\n\n';
const tails = ['def load_items(path):\n', 'def save_items(path, items):\n', 'class Item:\n    def __init__(self,',
  'def total_price(items):\n', 'def find_item(items, name):\n', 'def group_by_kind(items):\n',
  'def cheapest(items, n):\n', 'def validate(item):\n'];
const prompts = tails.map(t => header + t);
const methods = ['none', 'ngram', 'draft'];

function body(p, t, method, stream) {
  return { prompt: prompts[p], max_tokens: kTokens, temperature: t ? 0.8 : 0, seed: 1000 + p, stream,
    speculative: { method } };
}

async function metrics() {
  const text = await (await fetch(base + '/metrics')).text();
  const get = name => {
    const m = text.match(new RegExp('^' + name + '\\{[^}]*\\} ([0-9.e+-]+)$', 'm'));
    assert.ok(m, 'no ' + name + ' in /metrics');
    return Number(m[1]);
  };
  return { running: get('specdec:num_requests_running'), waiting: get('specdec:num_requests_waiting'),
    used: get('specdec:kv_cache_blocks_used'), hits: get('specdec:prefix_cache_hits_total'),
    touched: get('specdec:kv_cache_touched_bytes'), oneOff: get('specdec:one_off_iterations_total') };
}

async function whole(b) {
  const r = await fetch(base + '/v1/completions', { method: 'POST', headers: H, body: JSON.stringify(b) });
  const j = await r.json();
  assert.strictEqual(r.status, 200, JSON.stringify(j));
  return j.choices[0].text;
}

// Streams one completion; hangs up after `abortAfter` chunks when it is set.
async function stream(b, abortAfter) {
  const ctrl = new AbortController();
  const r = await fetch(base + '/v1/completions', { method: 'POST', headers: H, body: JSON.stringify(b),
    signal: ctrl.signal });
  assert.strictEqual(r.status, 200);
  const decoder = new TextDecoder();
  let buf = '', text = '', chunks = 0, done = false;
  try {
    for await (const part of r.body) {
      buf += decoder.decode(part, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at);
        buf = buf.slice(at + 2);
        if (!ev.startsWith('data: ')) continue;
        if (ev === 'data: [DONE]') { done = true; continue; }
        const j = JSON.parse(ev.slice(6));
        assert.ok(!j.error, JSON.stringify(j));
        text += j.choices[0].text;
        if (abortAfter && ++chunks >= abortAfter) { ctrl.abort(); return { aborted: true }; }
      }
    }
  } catch (e) {
    if (e.name === 'AbortError') return { aborted: true };
    throw e;
  }
  assert.ok(done, 'the stream ended without [DONE]');
  return { text };
}

function rss() {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]) * 1024;
}

async function settle() {
  const deadline = Date.now() + 20000;
  let m;
  do {
    m = await metrics();
    if (m.running === 0 && m.waiting === 0 && m.used === 0) return m;
    await new Promise(r => setTimeout(r, 50));
  } while (Date.now() < deadline);
  assert.fail('the engine did not drain: ' + JSON.stringify(m));
}

let failures = 0;
function expect(cond, what) {
  if (!cond) { failures++; console.log('FAIL ' + what); }
}

(async () => {
  const t0 = Date.now();
  // Solo references, plain decoding. The very first one is a prefix-cache miss.
  const before = await metrics();
  const solo = {};
  for (let t = 0; t < 2; t++)
    for (let p = 0; p < prompts.length; p++) {
      solo[`${p}/${t}`] = await whole(body(p, t, 'none', false));
      if (p === 0 && t === 0) expect((await metrics()).hits === before.hits, 'the first request hit the prefix cache');
    }
  // With a prefix-cache hit (the whole prompt cached now) and every speculation: the same text.
  for (const method of methods)
    for (let t = 0; t < 2; t++) {
      const hits = (await metrics()).hits;
      const got = await whole(body(0, t, method, false));
      expect((await metrics()).hits > hits, `no prefix-cache hit for prompt 0 (${method})`);
      expect(got === solo[`0/${t}`], `prefix hit + ${method} at t=${t}: ${JSON.stringify(got)} vs ${JSON.stringify(solo[`0/${t}`])}`);
    }
  console.log(`solo references and prefix-hit identity: ${(Date.now() - t0) / 1000} s`);

  // A deterministic choice of who hangs up, and when.
  let seed = 12345;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  const sizes = [], touched = [];
  for (let round = 0; round < kRounds; round++) {
    const t1 = Date.now();
    const jobs = [];
    for (let c = 0; c < kClients; c++) {
      const p = c % prompts.length, t = (c >> 3) & 1, method = methods[c % 3];
      const abortAfter = rand() < 0.25 ? 1 + Math.floor(rand() * 3) : 0;
      jobs.push(stream(body(p, t, method, true), abortAfter).then(r => ({ r, p, t, method })));
    }
    const results = await Promise.all(jobs);
    let completed = 0, aborted = 0;
    for (const { r, p, t, method } of results) {
      if (r.aborted) { aborted++; continue; }
      completed++;
      expect(r.text === solo[`${p}/${t}`], `round ${round}: prompt ${p} t=${t} ${method} in a batch of ${kClients}: ` +
        `${JSON.stringify(r.text)} vs solo ${JSON.stringify(solo[`${p}/${t}`])}`);
    }
    const settled = await settle();
    touched.push(settled.touched);
    sizes.push(rss());
    console.log(`round ${round}: ${completed} completed, ${aborted} hung up, KV back to 0, ` +
      `RSS ${(sizes[round] / 1048576).toFixed(1)} MiB (KV blocks ever handed out ${(touched[round] / 1048576).toFixed(1)} MiB), ` +
      `${(Date.now() - t1) / 1000} s, ${settled.oneOff} one-off iterations so far`);
  }
  // Flat over the measured rounds, less the KV blocks handed out for the first time (the KV pools
  // are allocated untouched, and a round that holds more blocks at once than any before, or caches
  // new blocks while free ones remain, pages in more of them: bounded by the pools, no leak): the
  // last holds no more than the first plus allocator slack, where a leak of a few tens of KiB a
  // request would exceed it. The server gives the heap's free pages back each time its engine
  // goes idle, so what stays is what it holds. Held requests and KV are checked exactly above.
  // Under AddressSanitizer freed memory waits in its quarantine (256 MiB by default), so RSS
  // grows there by design: the sanitizer stage reports the figure instead of judging it.
  const kvGrowth = touched[kRounds - 1] - touched[kWarm];
  const growth = sizes[kRounds - 1] - sizes[kWarm] - kvGrowth;
  const measured = `rounds ${kWarm}-${kRounds - 1}`;
  if (process.env.SPECDEC_SANITIZED === '1') {
    console.log(`RSS moved by ${(growth / 1048576).toFixed(1)} MiB over ${measured} (sanitized build: not judged)`);
  } else {
    expect(growth <= Math.max(8 << 20, 0.05 * sizes[kWarm]),
      `RSS grew by ${(growth / 1048576).toFixed(1)} MiB over ${measured} beside ${(kvGrowth / 1048576).toFixed(1)} MiB of KV blocks`);
  }
  if (failures) process.exitCode = 1;
  console.log(`concurrent streams: ${failures} failures`);
})().catch(e => { console.log('FAIL ' + (e.stack || e)); process.exitCode = 1; });

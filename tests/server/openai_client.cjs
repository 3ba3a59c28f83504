// The official `openai` Node client against `specdec serve`: completions and chat, streamed and
// not, n=2, stop strings, seed, logprobs (with echo, the prompt's too) and logit_bias. Texts are compared with
// `specdec generate` for the same request (its own process, its own engine).
// Usage: node openai_client.cjs BASE_URL API_KEY SPECDEC_BINARY SOURCE_DIR
'use strict';
const OpenAI = require('openai');
const { execFileSync } = require('child_process');
const assert = require('assert');

const [base, key, bin, src] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 120000 });
const H = { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' };

function generate(prompt, args) {
  const out = execFileSync(bin, ['generate', '--device', 'cpu', '--json', '--prompt', prompt, ...args], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return JSON.parse(out);
}

async function post(path, body) {
  const r = await fetch(base + path, { method: 'POST', headers: H, body: JSON.stringify(body) });
  return r.json();
}

async function collect(stream) {
  const texts = {}, finish = {}, logprobs = {};
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const piece = c.delta ? c.delta.content || '' : c.text || '';
      texts[c.index] = (texts[c.index] || '') + piece;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
      if (c.logprobs && c.logprobs.content) logprobs[c.index] = (logprobs[c.index] || []).concat(c.logprobs.content);
    }
  }
  return { texts, finish, logprobs, usage };
}

let passed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log('ok   ' + name);
  } catch (e) {
    console.log('FAIL ' + name + ': ' + (e && e.stack ? e.stack : e));
    process.exitCode = 1;
  }
}

const code = 'def parse_args(argv=None):\n    parser = argparse.ArgumentParser(description=';

(async () => {
  let greedyText = '';
  await check('completions: greedy text equals generate, streamed equals whole', async () => {
    const ref = generate(code, ['--temperature', '0', '--max-tokens', '32']);
    const whole = await client.completions.create({ model: 'target', prompt: code, max_tokens: 32, temperature: 0 });
    assert.strictEqual(whole.object, 'text_completion');
    assert.strictEqual(whole.choices[0].text, ref.text);
    assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
    assert.strictEqual(whole.usage.completion_tokens, ref.tokens.length);
    const s = await collect(await client.completions.create({
      prompt: code, max_tokens: 32, temperature: 0, stream: true, stream_options: { include_usage: true } }));
    assert.strictEqual(s.texts[0], ref.text);
    assert.strictEqual(s.finish[0], whole.choices[0].finish_reason);
    assert.deepStrictEqual(s.usage, whole.usage);
    greedyText = ref.text;
  });

  await check('completions: seed and n=2 equal generate with seed and seed + 1, streamed too', async () => {
    const args = ['--temperature', '0.9', '--max-tokens', '24'];
    const a = generate(code, [...args, '--seed', '11']), b = generate(code, [...args, '--seed', '12']);
    const r = await client.completions.create({ prompt: code, max_tokens: 24, temperature: 0.9, seed: 11, n: 2 });
    assert.strictEqual(r.choices.length, 2);
    assert.strictEqual(r.choices[0].text, a.text);
    assert.strictEqual(r.choices[1].text, b.text);
    assert.notStrictEqual(a.text, b.text);
    const s = await collect(await client.completions.create({
      prompt: code, max_tokens: 24, temperature: 0.9, seed: 11, n: 2, stream: true }));
    assert.strictEqual(s.texts[0], a.text);
    assert.strictEqual(s.texts[1], b.text);
  });

  await check('completions: stop strings end the text before them, as generate --stop does', async () => {
    assert.ok(greedyText.length > 12, 'the greedy text is too short to cut: ' + JSON.stringify(greedyText));
    const stop = greedyText.slice(8, 11);
    const want = greedyText.slice(0, greedyText.indexOf(stop));
    const ref = generate(code, ['--temperature', '0', '--max-tokens', '32', '--stop', stop]);
    assert.strictEqual(ref.text, want);
    const r = await client.completions.create({ prompt: code, max_tokens: 32, temperature: 0, stop: [stop, 'zzzz'] });
    assert.strictEqual(r.choices[0].text, want);
    assert.strictEqual(r.choices[0].finish_reason, 'stop');
    const s = await collect(await client.completions.create({
      prompt: code, max_tokens: 32, temperature: 0, stop, stream: true }));
    assert.strictEqual(s.texts[0], want);
    assert.strictEqual(s.finish[0], 'stop');
  });

  await check('chat: the template renders the prompt and the reply stops at its end of turn', async () => {
    const messages = [{ role: 'user', content: 'Write a Python function that reverses a list.' }];
    const rendered = '<|im_start|>user\n' + messages[0].content + '<|im_end|>\n<|im_start|>assistant\n';
    const ref = generate(rendered, ['--temperature', '0', '--max-tokens', '96']);
    const imEnd = (await post('/tokenize', { content: '<|im_end|>' })).tokens;
    assert.strictEqual(imEnd.length, 1);
    const at = ref.tokens.indexOf(imEnd[0]);
    const tokens = at < 0 ? ref.tokens : ref.tokens.slice(0, at);
    const want = (await post('/detokenize', { tokens })).content;
    const r = await client.chat.completions.create({ model: 'target', messages, max_tokens: 96, temperature: 0 });
    assert.strictEqual(r.object, 'chat.completion');
    assert.strictEqual(r.choices[0].message.role, 'assistant');
    assert.strictEqual(r.choices[0].message.content, want);
    assert.strictEqual(r.choices[0].finish_reason, at < 0 && ref.finish_reason === 'length' ? 'length' : 'stop');
    assert.strictEqual(r.usage.completion_tokens, tokens.length);
    if (at < 0) console.log('note: the model did not close its turn within 96 tokens');
    const s = await collect(await client.chat.completions.create({ messages, max_tokens: 96, temperature: 0, stream: true }));
    assert.strictEqual(s.texts[0], want);
  });

  await check('chat: logprobs and top_logprobs, streamed equal to whole', async () => {
    const messages = [{ role: 'user', content: 'Name three sorting algorithms.' }];
    const req = { messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 3 };
    const r = await client.chat.completions.create(req);
    const content = r.choices[0].logprobs.content;
    assert.strictEqual(content.length, r.usage.completion_tokens);
    let bytes = [];
    for (const t of content) {
      assert.ok(t.logprob <= 0);
      assert.strictEqual(t.top_logprobs.length, 3);
      assert.strictEqual(t.top_logprobs[0].token, t.token);  // greedy takes the most likely
      assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6);
      for (let i = 1; i < 3; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
      bytes = bytes.concat(t.bytes);
    }
    assert.strictEqual(Buffer.from(bytes).toString('utf8'), r.choices[0].message.content);
    const s = await collect(await client.chat.completions.create({ ...req, stream: true }));
    assert.strictEqual(s.texts[0], r.choices[0].message.content);
    assert.strictEqual(s.logprobs[0].length, content.length);
    for (let i = 0; i < content.length; i++) {
      assert.strictEqual(s.logprobs[0][i].token, content[i].token);
      assert.ok(Math.abs(s.logprobs[0][i].logprob - content[i].logprob) < 1e-4);
    }
  });

  await check('completions: logprobs shape; logit_bias bans the greedy token for the runner-up', async () => {
    const r = await client.completions.create({ prompt: code, max_tokens: 12, temperature: 0, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    assert.strictEqual(lp.tokens.length, r.usage.completion_tokens);
    assert.strictEqual(lp.token_logprobs.length, lp.tokens.length);
    assert.strictEqual(lp.top_logprobs.length, lp.tokens.length);
    assert.strictEqual(lp.text_offset[0], 0);
    for (let i = 1; i < lp.text_offset.length; i++) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    assert.strictEqual(lp.tokens.join(''), r.choices[0].text);
    // The first position's two most likely tokens, by id.
    const first = (await post('/v1/completions', { prompt: code, max_tokens: 1, temperature: 0, logprobs: 2 }))
      .choices[0].logprobs;
    const ranked = Object.entries(first.top_logprobs[0]).sort((x, y) => y[1] - x[1]).map(e => e[0]);
    const best = (await post('/tokenize', { content: ranked[0] })).tokens;
    assert.strictEqual(best.length, 1, 'the greedy piece ' + JSON.stringify(ranked[0]) + ' is not one token alone');
    const bestId = best[0];
    const biased = await client.completions.create({
      prompt: code, max_tokens: 12, temperature: 0, logit_bias: { [bestId]: -100 }, logprobs: 1 });
    assert.strictEqual(biased.choices[0].logprobs.tokens[0], ranked[1]);
  });

  await check('completions: echo with logprobs scores the prompt; streamed equals whole', async () => {
    const req = { prompt: code, max_tokens: 8, temperature: 0, logprobs: 2 };
    const plain = (await client.completions.create(req)).choices[0].logprobs;
    const r = await client.completions.create({ ...req, echo: true });
    const text = r.choices[0].text, lp = r.choices[0].logprobs;
    const promptTokens = r.usage.prompt_tokens;
    assert.ok(text.startsWith(code));
    assert.strictEqual(lp.tokens.length, promptTokens + r.usage.completion_tokens);
    assert.strictEqual(lp.tokens.join(''), text);
    // The first prompt token has no context: null, as OpenAI writes it.
    assert.strictEqual(lp.token_logprobs[0], null);
    assert.strictEqual(lp.top_logprobs[0], null);
    let offset = 0;
    for (let i = 0; i < lp.tokens.length; i++) {
      assert.strictEqual(lp.text_offset[i], offset);
      offset += Buffer.byteLength(lp.tokens[i]);
      if (i === 0) continue;
      assert.ok(lp.token_logprobs[i] <= 0);
      const top = Object.values(lp.top_logprobs[i]);
      assert.ok(top.length >= 1 && top.length <= 2);
      assert.ok(Math.max(...top) >= lp.token_logprobs[i] - 1e-6);
    }
    // The completion's part is what the request without echo gave.
    assert.deepStrictEqual(lp.tokens.slice(promptTokens), plain.tokens);
    for (let i = 0; i < plain.tokens.length; i++)
      assert.ok(Math.abs(lp.token_logprobs[promptTokens + i] - plain.token_logprobs[i]) < 1e-4);
    // Scoring prompt + completion as a prompt gives the completion's logprobs (the token ids
    // through /tokenize, so that no re-tokenization intervenes).
    const promptIds = (await post('/tokenize', { content: code })).tokens;
    assert.strictEqual(promptIds.length, promptTokens);
    const completionIds = [];
    for (const piece of plain.tokens) completionIds.push(...(await post('/tokenize', { content: piece })).tokens);
    assert.strictEqual(completionIds.length, plain.tokens.length, 'a completion piece is not one token alone');
    const scored = await client.completions.create({
      prompt: promptIds.concat(completionIds), max_tokens: 1, temperature: 0, logprobs: 2, echo: true });
    const slp = scored.choices[0].logprobs;
    for (let i = 0; i < plain.tokens.length; i++) {
      assert.strictEqual(slp.tokens[promptTokens + i], plain.tokens[i]);
      assert.ok(Math.abs(slp.token_logprobs[promptTokens + i] - plain.token_logprobs[i]) < 1e-4,
        `token ${i}: scored ${slp.token_logprobs[promptTokens + i]}, generated ${plain.token_logprobs[i]}`);
    }
    // Streamed: the echo chunk carries the prompt's logprobs, then the tokens follow.
    const stream = await client.completions.create({ ...req, echo: true, stream: true });
    let streamed = '';
    const tokens = [], values = [], offsets = [];
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        streamed += c.text || '';
        if (!c.logprobs) continue;
        tokens.push(...c.logprobs.tokens);
        values.push(...c.logprobs.token_logprobs);
        offsets.push(...c.logprobs.text_offset);
      }
    }
    assert.strictEqual(streamed, text);
    assert.deepStrictEqual(tokens, lp.tokens);
    assert.deepStrictEqual(offsets, lp.text_offset);
    assert.strictEqual(values[0], null);
    for (let i = 1; i < values.length; i++) assert.ok(Math.abs(values[i] - lp.token_logprobs[i]) < 1e-4);
  });

  console.log(`openai client: ${passed} checks passed`);
})();

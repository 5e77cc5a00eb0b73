// `strand serve` against requests that used to crash it, hang it or leak its slots (issue 11).
// Servers are started by tests/server_robust_test.sh, which passes:
//   POISON_URL  scripted model whose token 99 embeds as NaN
//   POOL_URL    random tiny model, --kv-blocks 64 (1024 positions), --max-seqs 2, --max-queue 0
//   CONN_URL    random tiny model, --max-connections 20, --idle-timeout 2
//   MAIN_URL    random tiny model, --stall-timeout 3, API key from $STRAND_API_KEY (main-key)
//   HOST_URL    the same started with --host localhost, the key from a file, the default
//               --stall-timeout (60 s)
// Prints TAP lines.
import OpenAI from 'openai';
import net from 'node:net';

import { attempt, check, done, sleep } from './tap.mjs';
const user = (content) => [{ role: 'user', content }];
const MAIN = process.env.MAIN_URL, POOL = process.env.POOL_URL, CONN = process.env.CONN_URL;
const POISON = process.env.POISON_URL, HOST = process.env.HOST_URL;
const KEY = 'main-key';
const auth = { Authorization: 'Bearer ' + KEY };

async function raw(base, path, { method = 'POST', body, headers = {}, signal } = {}) {
  const r = await fetch(base + path, { method, body, signal, headers: { 'Content-Type': 'application/json', ...headers } });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}
async function metric(base, name) {
  const t = await (await fetch(base + '/metrics')).text();
  const m = t.match(new RegExp('^' + name.replace(/[{}"]/g, (c) => '\\' + c) + ' (\\S+)$', 'm'));
  return m ? Number(m[1]) : NaN;
}
async function idle(base, ms = 8000) {
  const t0 = Date.now();
  let s = {};
  while (Date.now() - t0 < ms) {
    s = { running: await metric(base, 'strand_running_sequences'), waiting: await metric(base, 'strand_queue_depth'),
      blocks: await metric(base, 'strand_kv_blocks_used'), preparing: await metric(base, 'strand_preparing_requests') };
    if (s.running === 0 && s.waiting === 0 && s.blocks === 0 && s.preparing === 0) return s;
    await sleep(50);
  }
  return s;
}
// an SSE body's events, as parsed JSON (or the string [DONE])
function events(text) {
  return text.split('\n\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).map((d) => d === '[DONE]' ? d : JSON.parse(d));
}

const main = new OpenAI({ baseURL: MAIN + '/v1', apiKey: KEY, maxRetries: 0 });

// ---- 1. runs of whitespace in the output (used to overflow the text splitter's buffer) ----
await attempt('whitespace runs', async () => {
  for (const [tok, what] of [[198, 'newline'], [56940, '128-space']]) {
    const r = await main.chat.completions.create({ model: 'random', messages: user('x'), max_tokens: 1500,
      logit_bias: { [tok]: 100 }, temperature: 0, reasoning_effort: 'high' });
    const s = await main.chat.completions.create({ model: 'random', messages: user('x'), max_tokens: 1500,
      logit_bias: { [tok]: 100 }, temperature: 0, stream: true, reasoning_effort: 'none' });
    let n2 = 0;
    for await (const c of s) n2++;
    check(r.usage.completion_tokens === 1500 && r.choices[0].message.content === '' && n2 > 0,
      `1,500 forced ${what} tokens inside the reasoning and the content: the server answers (content trimmed to '')`, r.usage);
  }
  const h = await raw(MAIN, '/health', { method: 'GET' });
  check(h.status === 200, 'the server is alive after them');
});

// ---- 2. a KV pool smaller than a context ----
await attempt('admission', async () => {
  const pool = new OpenAI({ baseURL: POOL + '/v1', apiKey: 'x', maxRetries: 0 });
  const models = await pool.models.list();
  check(models.data[0].max_model_len === 1024, 'a pool of 64 x 16 positions caps max_model_len at 1024', models.data[0]);
  const t0 = Date.now();
  const [a, b] = await Promise.all([
    pool.chat.completions.create({ model: 'random', messages: user('no max_tokens'), ignore_eos: true, reasoning_effort: 'none' }),
    (async () => { await sleep(50); return pool.chat.completions.create({ model: 'random', messages: user('after'), max_tokens: 4 }); })(),
  ]);
  check(a.choices[0].finish_reason === 'length' && a.usage.prompt_tokens + a.usage.completion_tokens === 1024 &&
    b.usage.completion_tokens === 4, 'a chat without max_tokens runs to the pool\'s end; the request behind it completes',
    { a: a.usage, b: b.usage, ms: Date.now() - t0 });
  // a cancelled request behind a waiting one leaves the queue at once
  const ctl = new AbortController();
  const long = pool.chat.completions.create({ model: 'random', messages: user('fill'), ignore_eos: true, reasoning_effort: 'none' });
  await sleep(100);
  const queued = raw(POOL, '/v1/chat/completions', { signal: ctl.signal,
    body: JSON.stringify({ messages: user('queued'), max_tokens: 2 }) }).catch(() => 'aborted');
  await sleep(100);
  const w1 = await metric(POOL, 'strand_queue_depth');
  ctl.abort();
  await queued;
  let w2 = -1;
  for (let i = 0; i < 20 && w2 !== 0; i++) { await sleep(25); w2 = await metric(POOL, 'strand_queue_depth'); }
  check(w1 === 1 && w2 === 0, 'a queued request whose client leaves is dropped from the queue at once', { w1, w2 });
  await long;
  const s = await idle(POOL);
  check(s.running === 0 && s.blocks === 0, 'the pool is empty afterwards', s);
  const one = await pool.chat.completions.create({ model: 'random', messages: user('alone'), max_tokens: 2 });
  check(one.usage.completion_tokens === 2, '--max-queue 0: an idle server takes a request');
});

// ---- 3. idle connections ----
async function openIdle(base, count) {
  const u = new URL(base);
  const socks = [];
  await Promise.all(Array.from({ length: count }, () => new Promise((res) => {
    const s = net.connect(Number(u.port), u.hostname, () => res());
    s.on('error', () => res());
    s.on('close', () => { s.closedAt = Date.now(); });
    socks.push(s);
  })));
  return socks;
}
// a GET on a connection of its own (fetch would reuse a kept-alive one): the status, 0 when
// the server closes without answering, -1 when it does not answer within 5 s
function freshGet(base, path) {
  return new Promise((res) => {
    const u = new URL(base);
    let text = '', settled = false;
    const end = (v) => { if (!settled) { settled = true; s.destroy(); res(v); } };
    const s = net.connect(Number(u.port), u.hostname, () => s.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
    s.on('data', (d) => { text += d; });
    s.on('end', () => { const m = text.match(/^HTTP\/1\.1 (\d+)/); end(m ? Number(m[1]) : 0); });
    s.on('error', () => end(0));
    setTimeout(() => end(-1), 5000);
  });
}
// a GET /health written on an open socket: the status, 0 when the server has closed it unanswered
function getOn(s) {
  return new Promise((res) => {
    let text = '', settled = false;
    const end = (v) => { if (!settled) { settled = true; s.destroy(); res(v); } };
    if (s.destroyed || s.closedAt) return end(0);
    s.on('data', (d) => { text += d; const m = text.match(/^HTTP\/1\.1 (\d+)/); if (m) end(Number(m[1])); });
    s.on('close', () => end(0));
    s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
  });
}
await attempt('idle connections', async () => {
  const [unused] = await openIdle(MAIN, 1);
  const opened = Date.now();
  const many = await openIdle(MAIN, 1100);
  const h = await freshGet(MAIN, '/health');
  check(h === 200, '1,100 idle connections: a new connection is still answered', h);
  const conns = await metric(MAIN, 'strand_open_connections');
  check(conns >= 1100, 'the server counts them (strand_open_connections)', conns);
  many.forEach((s) => s.destroy());
  const few = await openIdle(CONN, 25);
  const full = await raw(CONN, '/health', { method: 'GET' });
  const fresh = await freshGet(CONN, '/health');
  check(full.status === 503 && full.json && full.json.error && full.json.error.code === 'too_many_connections' && fresh === 503,
    'past --max-connections 20: 503 with an error, not silence', { full, fresh });
  await sleep(2600);
  const closed = few.filter((s) => s.destroyed || s.closedAt).length;
  const again = await freshGet(CONN, '/health');
  check(closed === 25 && again === 200, 'connections that send no request are closed after --idle-timeout 2; the server answers again',
    { closed, again });
  few.forEach((s) => s.destroy());
  // Node's fetch keeps a connection that never carried a response (so never saw the Keep-Alive
  // hint) for 4 s, and opens such ones (a fetch aborted after its request went out reconnects):
  // the default --idle-timeout 5 must outlast that, or its next request races the close
  await sleep(4200 - (Date.now() - opened));
  const late = await getOn(unused);
  check(late === 200, 'a connection unused for 4.2 s (Node\'s fetch keeps one 4 s) is answered under the default --idle-timeout 5', late);
});

// ---- 3b. header blocks near the limit (64 KiB) ----
// a request's head (and `body` bytes of spaces behind it) on a connection of its own: the status,
// 0 when the server closes without answering, -1 when it does not answer within 5 s; the body;
// the socket's error
function rawExchange(base, head, body = 0) {
  return new Promise((res) => {
    const u = new URL(base);
    let text = '', err = null, settled = false;
    const end = (timedOut) => {
      if (settled) return;
      settled = true;
      s.destroy();
      const m = text.match(/^HTTP\/1\.1 (\d+)/);
      res({ status: timedOut === true ? -1 : m ? Number(m[1]) : 0, body: text.slice(text.indexOf('\r\n\r\n') + 4), err });
    };
    const s = net.connect(Number(u.port), u.hostname, () => {
      s.write(head);
      const chunk = Buffer.alloc(65536, 32);
      let left = body;
      const pump = () => {
        while (left > 0) {
          const k = Math.min(left, chunk.length);
          left -= k;
          if (!s.write(chunk.subarray(0, k))) { s.once('drain', pump); return; }
        }
      };
      pump();
    });
    s.on('data', (d) => { text += d; });
    s.on('end', end);
    s.on('close', end);
    s.on('error', (e) => { err = e.code; end(); });
    setTimeout(() => end(true), 5000);
  });
}
// a GET /health with an X-A header of n bytes
const headerGet = async (base, n) =>
  ({ n, ...await rawExchange(base, `GET /health HTTP/1.1\r\nHost: x\r\nX-A: ${'a'.repeat(n)}\r\nConnection: close\r\n\r\n`) });
await attempt('header blocks near the limit', async () => {
  // libmicrohttpd 0.9.75 kept such headers in its connection's pool and closed, unanswered, a
  // request that left too little room for the reply (an X-A of 65,096-65,279 bytes did)
  const sizes = [];
  for (let n = 60000; n <= 86000; n += 37) sizes.push(n);
  const got = [];
  for (let i = 0; i < sizes.length; i += 16) got.push(...await Promise.all(sizes.slice(i, i + 16).map((n) => headerGet(MAIN, n))));
  const unanswered = got.filter((g) => g.status !== 200 && g.status !== 431).map((g) => [g.n, g.status]);
  check(unanswered.length === 0, `X-A headers of 60,000 to 86,000 bytes (${got.length} sizes): every one answered 200 or 431`, unanswered.slice(0, 12));
  const small = got.filter((g) => g.n <= 64000), large = got.filter((g) => g.n >= 66000);
  check(small.every((g) => g.status === 200) && large.every((g) => g.status === 431),
    'up to 64,000 bytes 200, from 66,000 bytes 431', got.filter((g) => (g.n <= 64000) !== (g.status === 200)).map((g) => [g.n, g.status]).slice(0, 12));
  const ours = got.find((g) => g.status === 431 && g.n < 70000);
  let code = null;
  try { code = JSON.parse(ours.body).error.code; } catch { /* reported below */ }
  check(code === 'request_header_fields_too_large', 'the 431 names the problem (an OpenAI-shaped error)', ours && ours.body);
  const h = await freshGet(MAIN, '/health');
  check(h === 200, 'the server answers as before', h);
});
// a POST with an X-A header of n bytes and a body of `body` bytes sent behind it
const headerPost = (base, n, body) => rawExchange(base, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n` +
  `X-A: ${'a'.repeat(n)}\r\nContent-Type: application/json\r\nContent-Length: ${body}\r\n\r\n`, body);
await attempt('too large a header block before a body', async () => {
  // the 431 is written and the connection closed before the body is read: closed with bytes
  // unread, a socket resets the connection, and the client lost the 431 (29 of 40 with a
  // 2 MB body); the server now reads and drops what follows (a lingering close)
  const got = [];
  for (let i = 0; i < 3; i++) got.push(...await Promise.all(Array.from({ length: 8 }, () => headerPost(MAIN, 70000, 2000000))));
  const lost = got.filter((g) => g.status !== 431);
  check(lost.length === 0, `a POST with 70,000 bytes of headers and a 2 MB body gets its 431 (${got.length} of them)`, lost.slice(0, 8));
  const h = await freshGet(MAIN, '/health');
  check(h === 200, 'the server answers as before', h);
});

// ---- 4. non-streaming disconnects ----
await attempt('non-streaming disconnect', async () => {
  const before = await metric(MAIN, 'strand_client_disconnects_total');
  const ctl = new AbortController();
  const p = raw(MAIN, '/v1/chat/completions', { signal: ctl.signal, headers: auth,
    body: JSON.stringify({ messages: user('long'), max_tokens: 30000, ignore_eos: true, reasoning_effort: 'none' }) }).catch(() => 'aborted');
  await sleep(300);
  const running = await metric(MAIN, 'strand_running_sequences');
  const t0 = Date.now();
  ctl.abort();
  await p;
  const s = await idle(MAIN, 3000);
  const after = await metric(MAIN, 'strand_client_disconnects_total');
  check(running === 1 && s.running === 0 && s.blocks === 0 && after === before + 1,
    'a non-streaming client that goes away frees its slot and blocks at once', { running, s, ms: Date.now() - t0, before, after });
  // the openai client's timeout and retries: every attempt is cancelled when abandoned
  const impatient = new OpenAI({ baseURL: MAIN + '/v1', apiKey: KEY, maxRetries: 2, timeout: 400 });
  let failed = false;
  try {
    await impatient.chat.completions.create({ model: 'random', messages: user('slow'), max_tokens: 30000, ignore_eos: true });
  } catch { failed = true; }
  const s2 = await idle(MAIN, 3000);
  check(failed && s2.running === 0 && s2.blocks === 0, 'timeout + retry (3 attempts): nothing keeps running', s2);
});

// ---- 5. slow readers: paused, not cancelled; stalled ones time out ----
await attempt('slow readers', async () => {
  const body = JSON.stringify({ messages: user('read me slowly'), max_tokens: 4000, ignore_eos: true, stream: true,
    logprobs: true, top_logprobs: 20, reasoning_effort: 'none', stream_options: { include_usage: true } });
  // on HOST, whose stall timeout (60 s) is far beyond the time from the writes blocking to the
  // pause being seen: on a slow sanitizer build that took MAIN's 3 s and cut the stream
  const r = await fetch(HOST + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json', ...auth }, body });
  const reader = r.body.getReader();
  await reader.read();
  // the socket buffers fill first (megabytes: seconds on a sanitizer build)
  let paused = 0;
  for (let i = 0; i < 1200 && paused !== 1; i++) { await sleep(50); paused = await metric(HOST, 'strand_paused_sequences'); }
  await sleep(500);
  const stillRunning = await metric(HOST, 'strand_running_sequences');
  let text = '';
  const dec = new TextDecoder();
  for (;;) { const { value, done } = await reader.read(); if (done) break; text += dec.decode(value, { stream: true }); }
  const ev = events(text);
  const usage = ev.filter((e) => e !== '[DONE]' && e.usage).map((e) => e.usage)[0];
  const fin = ev.filter((e) => e !== '[DONE]' && e.choices && e.choices[0] && e.choices[0].finish_reason).map((e) => e.choices[0].finish_reason)[0];
  check(paused === 1 && stillRunning === 1 && usage && usage.completion_tokens === 4000 && fin === 'length' && !ev.some((e) => e !== '[DONE]' && e.error),
    'a client that stops reading pauses its sequence; read later, the stream is whole', { paused, stillRunning, usage, fin });
  // one that never reads again is cancelled after MAIN's --stall-timeout 3
  const err0 = await metric(MAIN, 'strand_generations_total{finish="error"}');
  const body2 = body.replace('"max_tokens":4000', '"max_tokens":20000');
  const r2 = await fetch(MAIN + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json', ...auth }, body: body2 });
  const rd2 = r2.body.getReader();
  await rd2.read();
  const t0 = Date.now();
  let err1 = err0;
  while (Date.now() - t0 < 60000 && err1 === err0) { await sleep(200); err1 = await metric(MAIN, 'strand_generations_total{finish="error"}'); }
  const s = await idle(MAIN, 3000);
  check(err1 === err0 + 1 && Date.now() - t0 >= 2500 && s.running === 0 && s.blocks === 0,
    'a stream whose client reads nothing for --stall-timeout 3 s is cancelled: slot and blocks free', { err0, err1, ms: Date.now() - t0, s });
  rd2.cancel().catch(() => {});
});

// ---- 6. non-finite logits ----
await attempt('NaN logits', async () => {
  const good = fetch(POISON + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: [9707, 11], max_tokens: 30, ignore_eos: true, logprobs: 2 }) }).then((x) => x.json());
  const bad = await raw(POISON, '/v1/completions', { body: JSON.stringify({ prompt: [9707, 99, 11], max_tokens: 5, logprobs: 2 }) });
  check(bad.status >= 500 && bad.json && bad.json.error && /non-finite logits/.test(bad.json.error.message),
    'non-streaming: a sequence with NaN logits gets a 500-class error naming them', bad);
  const s = await raw(POISON, '/v1/chat/completions', { body: JSON.stringify({ messages: user('x'), max_tokens: 5, stream: true,
    logit_bias: { 99: 100 } }) });
  const ev = events(s.text);
  const fin = ev.find((e) => e !== '[DONE]' && e.choices && e.choices[0] && e.choices[0].finish_reason);
  const er = ev.find((e) => e !== '[DONE]' && e.error);
  check(fin && fin.choices[0].finish_reason === 'error' && er && /non-finite/.test(er.error.message) && ev[ev.length - 1] === '[DONE]',
    'streaming: finish_reason "error", an error event with the message, then [DONE]', ev.slice(-3));
  const g = await good;
  const lp = g.choices[0].logprobs;
  check(g.usage.completion_tokens === 30 && lp.tokens.length === 30 && lp.token_logprobs.length === 30 && lp.text_offset.length === 30,
    'a sequence alongside it completes; its logprob arrays have one entry per token', g.usage);
});

// ---- 7. huge prompts do not hold up /health ----
await attempt('huge prompts', async () => {
  // 20 MB without a space: one pre-token piece, the tokenizer's worst case
  const big = JSON.stringify({ prompt: 'x'.repeat(20 << 20) });
  const t0 = Date.now();
  let pending = 6;
  const reqs = Array.from({ length: 6 }, () => raw(MAIN, '/v1/completions', { body: big, headers: auth }).finally(() => pending--));
  let worst = 0, polls = 0;
  while ((pending > 0 || polls < 5) && Date.now() - t0 < 30000) { /* until every prompt is answered */
    const h0 = Date.now();
    const h = await raw(MAIN, '/health', { method: 'GET' });
    worst = Math.max(worst, Date.now() - h0);
    if (h.status !== 200) worst = 1e9;
    polls++;
    await sleep(30);
  }
  const res = await Promise.all(reqs);
  const all400 = res.every((r) => r.status === 400 && r.json.error.code === 'context_length_exceeded');
  check(all400 && Date.now() - t0 < 10000, 'six 20 MB prompts over the context: 400 context_length_exceeded', res.map((r) => r.status));
  // the HTTP threads still receive the 120 MB of bodies (seconds before, when they tokenized)
  check(worst < 2000, `/health answers while they are tokenized (slowest ${worst} ms)`, worst);
});

// ---- 9. smaller results ----
await attempt('echo and text_offset', async () => {
  const s = await main.completions.create({ model: 'random', prompt: 'Echo me', max_tokens: 5, temperature: 0, echo: true, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text || '';
  const plain = await main.completions.create({ model: 'random', prompt: 'Echo me', max_tokens: 5, temperature: 0 });
  check(text === 'Echo me' + plain.choices[0].text, 'streaming completions honour echo', { text });
  const full = await main.completions.create({ model: 'random', prompt: [9707, 11], max_tokens: 40, temperature: 1, seed: 9, logprobs: 1 });
  const offs = full.choices[0].logprobs.text_offset;
  let ok = !/^[\x00-\x7f]*$/.test(full.choices[0].text), checked = 0;
  for (const k of [10, 20, 30]) {
    const pre = (await main.completions.create({ model: 'random', prompt: [9707, 11], max_tokens: k, temperature: 1, seed: 9 })).choices[0].text;
    if (pre.endsWith('\ufffd')) continue;
    ok = ok && offs[k] === Array.from(pre).length;
    checked++;
  }
  check(ok && checked >= 2, 'logprobs.text_offset counts characters of the text, not bytes', { offs: offs.slice(0, 12), checked });
});

await attempt('request shapes', async () => {
  const late = await raw(MAIN, '/v1/chat/completions', { headers: auth, body: JSON.stringify({ messages: [
    { role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }, { role: 'system', content: 'late' }, { role: 'user', content: 'x' }] }) });
  check(late.status === 400 && /System message must be at the beginning/.test(late.json.error.message),
    'a system message after the first turn goes to the template, whose error is a 400', late.json);
  const fn = await raw(MAIN, '/v1/chat/completions', { headers: auth, body: JSON.stringify({ messages: user('x'), functions: [{ name: 'f' }] }) });
  check(fn.status === 400 && fn.json.error.param === 'functions' && /tools/.test(fn.json.error.message), 'legacy functions: a 400 pointing to tools', fn.json);
  const nul = await raw(MAIN, '/v1/chat/completions', { headers: auth, body: '{"messages":[{"role":"user","content":"a\\u0000b"}]}' });
  check(nul.status === 400 && !/JSON_/.test(nul.text), 'a NUL in the JSON: 400 without library flag names', nul.json);
  const lower = await raw(MAIN, '/v1/models', { method: 'GET', headers: { Authorization: 'bearer ' + KEY } });
  const none = await raw(MAIN, '/v1/models', { method: 'GET' });
  check(lower.status === 200 && none.status === 401, 'the key from $STRAND_API_KEY; the scheme "bearer" in any case', { lower: lower.status, none: none.status });
  const host = await raw(HOST, '/health', { method: 'GET' });
  check(host.status === 200, '--host localhost listens', host.status);
});

const s = await idle(MAIN);
check(s.running === 0 && s.blocks === 0 && s.waiting === 0, 'at the end: nothing running, no blocks held', s);
done();

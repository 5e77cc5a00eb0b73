// A request-level property test of `strand serve`: random sequences of valid requests with
// random parameters, streams read whole, read slowly or dropped, clients that leave early,
// malformed bodies, garbage on raw sockets and half-sent requests, from several clients at
// once. Properties: every answer is a success of the right shape or an OpenAI error object
// with a known status; afterwards the server answers, with no running sequence, nothing
// queued or being prepared and no KV block in use.
// Env: URL (a server of a random tiny model named "random"), SEED, SECONDS, CLIENTS.
import net from 'node:net';
import { check, done, sleep } from './tap.mjs';

const URL_ = process.env.URL;
let seed = Number(process.env.SEED || 1234567) >>> 0;
const SECONDS = Number(process.env.SECONDS || 20), CLIENTS = Number(process.env.CLIENTS || 6);
function rnd() { // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
const STATUSES = new Set([200, 400, 401, 404, 405, 413, 429, 431, 499, 500, 503]);
const bad = [];
const counts = {};
const count = (k) => { counts[k] = (counts[k] || 0) + 1; };
const isError = (j) => j && j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string';

function randomChat() {
  const body = { model: 'random', messages: [{ role: 'user', content: pick(['hi', 'tell me a story', 'x'.repeat(int(1, 300)), '日本語の文', '🎉'.repeat(5)]) }] };
  if (rnd() < 0.3) body.messages.unshift({ role: pick(['system', 'developer']), content: 'be brief' });
  if (rnd() < 0.1) body.messages.push({ role: 'assistant', content: 'ok' }, { role: pick(['user', 'system']), content: 'more' });
  body.max_tokens = rnd() < 0.1 ? undefined : int(1, 60);
  if (rnd() < 0.5) body.temperature = rnd() * 1.5;
  if (rnd() < 0.3) body.top_p = 0.5 + rnd() * 0.5;
  if (rnd() < 0.3) body.seed = int(0, 1000);
  if (rnd() < 0.3) { body.logprobs = true; body.top_logprobs = int(0, 20); }
  if (rnd() < 0.3) body.stop = [pick(['a', 'the', '\n', '  ', '</think>', '。'])];
  if (rnd() < 0.2) body.logit_bias = { [pick([198, 220, 56940, 151668, 151667, 271])]: pick([5, 50, 100]) };
  if (rnd() < 0.5) body.reasoning_effort = pick(['none', 'low', 'high']);
  if (rnd() < 0.2) body.ignore_eos = true;
  if (rnd() < 0.15) body.n = int(1, 5); /* 5 is over the server's 4 sequences: a 400 */
  if (rnd() < 0.5) { body.stream = true; if (rnd() < 0.5) body.stream_options = { include_usage: true }; }
  return ['/v1/chat/completions', body];
}
function randomCompletion() {
  const body = { model: 'random', prompt: rnd() < 0.5 ? pick(['Once', 'a b c', '']) : Array.from({ length: int(0, 8) }, () => int(0, 160000)) };
  body.max_tokens = int(0, 40);
  if (rnd() < 0.3) body.logprobs = int(0, 5);
  if (rnd() < 0.3) body.echo = true;
  if (rnd() < 0.15) body.n = int(1, 3);
  if (rnd() < 0.5) body.stream = true;
  return ['/v1/completions', body];
}
// a valid body with one field broken
function mutate([path, body]) {
  const keys = Object.keys(body);
  const k = pick(keys);
  body[k] = pick([null, 'x', -1, 1e309 === Infinity ? 1e308 : 0, [], {}, true, 'a'.repeat(2000), [[[[]]]]]);
  return [path, body];
}

const HANG_MS = 45000; /* no request of this storm takes this long unless the server hung it */
async function httpRequest(path, text, { readMode = 'all', abortMs = 0 } = {}) {
  const ctl = new AbortController();
  let timer = null, hung = false;
  if (abortMs) timer = setTimeout(() => ctl.abort(), abortMs);
  const hang = setTimeout(() => { hung = true; ctl.abort(); }, HANG_MS);
  const started = Date.now();
  try {
    const r = await fetch(URL_ + path, { method: 'POST', body: text, signal: ctl.signal, headers: { 'Content-Type': 'application/json' } });
    if (!STATUSES.has(r.status)) bad.push({ what: 'status', status: r.status, path });
    count('status ' + r.status);
    const sse = (r.headers.get('content-type') || '').includes('event-stream');
    if (!sse) {
      const t = await r.text();
      let j = null;
      try { j = JSON.parse(t); } catch { bad.push({ what: 'not JSON', status: r.status, t: t.slice(0, 200) }); return; }
      if (r.status !== 200 && !isError(j)) bad.push({ what: 'error shape', status: r.status, j });
      if (r.status === 200 && !(j.choices && j.choices.length >= 1 && j.choices.every((c, i) => c.index === i) && j.usage))
        bad.push({ what: 'success shape', j });
      return;
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let text2 = '', chunks = 0;
    const slowUntil = Date.now() + 2000; /* slow for two seconds, then at full speed */
    for (;;) {
      if (readMode === 'drop' && chunks >= 2) { reader.cancel().catch(() => {}); count('dropped stream'); return; }
      if (readMode === 'slow' && chunks % 4 === 3 && Date.now() < slowUntil) await sleep(int(50, 400));
      const { value, done } = await reader.read();
      if (done) break;
      text2 += dec.decode(value, { stream: true });
      chunks++;
    }
    const evs = text2.split('\n\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
    if (evs[evs.length - 1] !== '[DONE]') bad.push({ what: 'stream end', tail: text2.slice(-200) });
    for (const e of evs.slice(0, -1)) {
      let j;
      try { j = JSON.parse(e); } catch { bad.push({ what: 'event not JSON', e: e.slice(0, 200) }); break; }
      if (!j.error && !j.choices) bad.push({ what: 'event shape', j });
    }
    count('stream read ' + readMode);
  } catch (e) {
    if (hung) {
      bad.push({ what: 'hung', ms: Date.now() - started, path, body: text.slice(0, 300) });
    } else if (!ctl.signal.aborted) {
      const c = e && e.cause;
      bad.push({ what: 'fetch failed', at: new Date().toISOString(), err: String(e).slice(0, 200), cause: c ? `${c.code || ''} ${c.message || c}`.slice(0, 200) : null, socket: c && c.socket ? c.socket : null, path, ms: Date.now() - started, body: text.slice(0, 120) });
    }
    else count('aborted');
  } finally {
    if (timer) clearTimeout(timer);
    clearTimeout(hang);
  }
}

function rawSocket(bytes, { closeMs = 50 } = {}) {
  return new Promise((res) => {
    const u = new URL(URL_);
    const s = net.connect(Number(u.port), u.hostname, () => {
      s.write(bytes);
      setTimeout(() => { s.destroy(); res(); }, closeMs);
    });
    s.on('data', () => {});
    s.on('error', () => res());
  });
}

const garbage = () => Buffer.from(Array.from({ length: int(1, 2000) }, () => int(0, 255)));
const ops = [
  async () => { const [p, b] = randomChat(); await httpRequest(p, JSON.stringify(b), { readMode: pick(['all', 'all', 'slow', 'drop']) }); },
  async () => { const [p, b] = randomChat(); await httpRequest(p, JSON.stringify(b), { abortMs: int(1, 300) }); },
  async () => { const [p, b] = randomCompletion(); await httpRequest(p, JSON.stringify(b)); },
  async () => { const [p, b] = mutate(rnd() < 0.5 ? randomChat() : randomCompletion()); await httpRequest(p, JSON.stringify(b)); },
  async () => { await httpRequest(pick(['/v1/chat/completions', '/v1/completions']), garbage().toString('latin1')); },
  async () => { await httpRequest('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'word '.repeat(int(5000, 20000)) }] })); },
  async () => { await rawSocket(garbage(), { closeMs: int(0, 100) }); count('garbage socket'); },
  async () => { await rawSocket('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"messages":', { closeMs: int(0, 200) }); count('half request'); },
  async () => { await rawSocket('GET /health HTTP/1.1\r\nHost: x\r\nX-A: ' + 'a'.repeat(int(100, 100000)) + '\r\n\r\n', { closeMs: 100 }); count('big header'); },
  async () => { const r = await fetch(URL_ + pick(['/health', '/metrics', '/v1/models', '/nope'])); await r.text(); count('get ' + r.status); },
];

const t0 = Date.now();
console.log(`# chaos: seed ${seed}, ${SECONDS} s, ${CLIENTS} clients`);
await Promise.all(Array.from({ length: CLIENTS }, async () => {
  while (Date.now() - t0 < SECONDS * 1000) {
    try { await pick(ops)(); } catch (e) { bad.push({ what: 'op threw', err: String(e).slice(0, 200) }); }
  }
}));
console.log('# ' + JSON.stringify(counts));
check(bad.length === 0, `every answer of ${Object.values(counts).reduce((a, b) => a + b, 0)} operations is a success or an OpenAI error of a known status`, bad.slice(0, 5));

async function metric(name) {
  const t = await (await fetch(URL_ + '/metrics')).text();
  const m = t.match(new RegExp('^' + name + ' (\\S+)$', 'm'));
  return m ? Number(m[1]) : NaN;
}
let st = {};
for (let i = 0; i < 200; i++) {
  st = { running: await metric('strand_running_sequences'), waiting: await metric('strand_queue_depth'),
    blocks: await metric('strand_kv_blocks_used'), preparing: await metric('strand_preparing_requests') };
  if (st.running === 0 && st.waiting === 0 && st.blocks === 0 && st.preparing === 0) break;
  await sleep(50);
}
check(st.running === 0 && st.waiting === 0 && st.blocks === 0 && st.preparing === 0,
  'afterwards: no sequence running, nothing queued or being prepared, no KV block in use', st);
const h = await fetch(URL_ + '/health');
const r = await fetch(URL_ + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ messages: [{ role: 'user', content: 'still there?' }], max_tokens: 3 }) });
const j = await r.json();
check(h.status === 200 && r.status === 200 && j.usage.completion_tokens === 3, 'and it still answers', { h: h.status, r: r.status });
done();

// End-to-end tests of `strand serve` with the official OpenAI client (npm "openai").
// Servers are started by tests/server_e2e_test.sh, which passes their URLs:
//   SCRIPTED_URL  a scripted model (deterministic reasoning and tool-call text), --api-key test-key
//   RANDOM_URL    a random tiny model, --ctx 256, --max-seqs 16, --max-body-mb 1
//   SMALL_URL     a random tiny model with --max-seqs 1 --max-queue 1 --keepalive 0.2
//   SMALL_PID     its process id (stopped at the end to see an error inside a stream)
//   VISION_URL    a random tiny model with a vision tower (strand synth --vision)
//   IMAGES        a folder of PNG files (tiny-vl's)
// Prints TAP lines ("ok N - ..." / "not ok N - ..."), counted by tests/run.sh.
import OpenAI from 'openai';
import fs from 'node:fs';

import { attempt, check, done, sleep } from './tap.mjs';

const scripted = new OpenAI({ baseURL: process.env.SCRIPTED_URL + '/v1', apiKey: 'test-key', maxRetries: 0 });
const random = new OpenAI({ baseURL: process.env.RANDOM_URL + '/v1', apiKey: 'unused', maxRetries: 0 });
const small = new OpenAI({ baseURL: process.env.SMALL_URL + '/v1', apiKey: 'unused', maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];
const weatherTool = [{ type: 'function', function: { name: 'get_weather', description: 'Weather forecast',
  parameters: { type: 'object', properties: { days: { type: 'integer' } }, required: ['days'] } } }];

async function raw(base, path, { method = 'POST', body, headers = {} } = {}) {
  const r = await fetch(base + path, { method, body, headers: { 'Content-Type': 'application/json', ...headers } });
  let json = null;
  const text = await r.text();
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}
const isError = (j) => j && j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string' &&
  'param' in j.error && 'code' in j.error;

async function metric(base, name) {
  const r = await fetch(base + '/metrics');
  const t = await r.text();
  const m = t.match(new RegExp('^' + name + ' (\\S+)$', 'm'));
  return m ? Number(m[1]) : NaN;
}

// ---- images (data URLs through the official client) ----
const vision = new OpenAI({ baseURL: process.env.VISION_URL + '/v1', apiKey: 'unused', maxRetries: 0 });
const dataUrl = (f) => 'data:image/png;base64,' + fs.readFileSync(process.env.IMAGES + '/' + f).toString('base64');
const imagePart = (f) => ({ type: 'image_url', image_url: { url: dataUrl(f), detail: 'auto' } });
async function status400(fn) {
  try { await fn(); return { status: 200 }; } catch (e) { return { status: e.status, message: e.error && e.error.message }; }
}
await attempt('images', async () => {
  const two = [{ role: 'user', content: [{ type: 'text', text: 'Compare' }, imagePart('img0.png'), imagePart('img2.png')] }];
  const a = await vision.chat.completions.create({ model: 'vision', messages: two, max_tokens: 6, temperature: 0,
    reasoning_effort: 'none' });
  const b = await vision.chat.completions.create({ model: 'vision', messages: two, max_tokens: 6, temperature: 0,
    reasoning_effort: 'none' });
  const t = await vision.chat.completions.create({ model: 'vision', messages: user('Compare'), max_tokens: 6,
    temperature: 0, reasoning_effort: 'none' });
  // img0 (64x48) takes 4 image tokens and img2 (37x150) 5, each with its start and end marks
  check(b.usage.prompt_tokens_details.cached_tokens > 0 && a.usage.prompt_tokens_details.cached_tokens === 0,
    'the same images again: the prefix cache holds them (keyed by their pixels)', { a: a.usage, b: b.usage });
  check(a.choices[0].finish_reason === 'length' && a.usage.completion_tokens === 6 &&
    a.usage.prompt_tokens === t.usage.prompt_tokens + 4 + 5 + 2 * 2 && a.choices[0].message.content === b.choices[0].message.content &&
    a.choices[0].message.content !== t.choices[0].message.content,
    'two images in one message: answered, the prompt grew by their 9 image tokens and marks, greedy repeats', { a: a.usage, t: t.usage });
  const turns = [two[0], { role: 'assistant', content: a.choices[0].message.content },
    { role: 'user', content: [imagePart('img1.png'), { type: 'text', text: 'And this one?' }] }];
  const c = await vision.chat.completions.create({ model: 'vision', messages: turns, max_tokens: 4, reasoning_effort: 'none' });
  check(c.choices[0].finish_reason === 'length' && c.usage.prompt_tokens > a.usage.prompt_tokens + 6,
    'an image in a later turn: answered', c.usage);
  const s = await vision.chat.completions.create({ model: 'vision', messages: two, max_tokens: 6, temperature: 0,
    reasoning_effort: 'none', stream: true });
  let text = '';
  for await (const ch of s) text += ch.choices[0] && ch.choices[0].delta.content ? ch.choices[0].delta.content : '';
  check(text === a.choices[0].message.content, 'streamed, the same text', { text, want: a.choices[0].message.content });
  const bad = await status400(() => vision.chat.completions.create({ model: 'vision', messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'data:image/png;base64,' + Buffer.from('not a png').toString('base64') } }] }] }));
  check(bad.status === 400 && /image 1/.test(bad.message), 'a corrupt image: 400 naming it', bad);
  const remote = await status400(() => vision.chat.completions.create({ model: 'vision', messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } }] }] }));
  check(remote.status === 400 && /not fetched/.test(remote.message), 'an http URL: 400, never fetched', remote);
  const sys = await status400(() => vision.chat.completions.create({ model: 'vision', messages: [
    { role: 'system', content: [imagePart('img0.png')] }, { role: 'user', content: 'hi' }] }));
  check(sys.status === 400 && /user messages/.test(sys.message), 'an image in a system message: 400', sys);
  const textOnly = await status400(() => random.chat.completions.create({ model: 'random', messages: [{ role: 'user',
    content: [imagePart('img0.png')] }] }));
  check(textOnly.status === 400 && /takes no images/.test(textOnly.message), 'a text-only model refuses images with a 400', textOnly);
});

// ---- the scripted model: reasoning and tool calls ----
await attempt('non-streaming chat with reasoning', async () => {
  const r = await scripted.chat.completions.create({ model: 'scripted', messages: user('What is 2+2?'), temperature: 0 });
  const m = r.choices[0].message;
  check(r.object === 'chat.completion' && r.id.startsWith('chatcmpl-') && m.role === 'assistant', 'non-streaming chat: completion object');
  check(m.reasoning_content === 'Let me think about it.' && m.content === 'The answer is four',
    'reasoning_content and content are split at </think>', m);
  check(r.choices[0].finish_reason === 'stop', 'finish_reason stop at eos');
  const u = r.usage;
  check(u.prompt_tokens > 0 && u.completion_tokens === 12 && u.total_tokens === u.prompt_tokens + 12 &&
    u.completion_tokens_details.reasoning_tokens === 7 && u.prompt_tokens_details.cached_tokens === 0,
    'usage: prompt, completion, reasoning and cached token counts', u);
});

await attempt('streaming chat with reasoning', async () => {
  const s = await scripted.chat.completions.create({ model: 'scripted', messages: user('What is 2+2?'), stream: true,
    stream_options: { include_usage: true } });
  let reasoning = '', content = '', first = null, finish = null, usage = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    if (c.object !== 'chat.completion.chunk') throw new Error('bad object ' + c.object);
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    if (first === null) first = d;
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) content += d.content;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  check(first && first.role === 'assistant', 'stream: the role comes in the first delta', first);
  check(reasoning === 'Let me think about it.' && content === 'The answer is four', 'stream: reasoning and content deltas', { reasoning, content });
  check(finish === 'stop' && usage && usage.completion_tokens === 12 && usage.completion_tokens_details.reasoning_tokens === 7,
    'stream: finish_reason chunk, then the usage chunk (include_usage)', { finish, usage });
});

await attempt('thinking off', async () => {
  const r = await scripted.chat.completions.create({ model: 'scripted', messages: user('hi'), reasoning_effort: 'none' });
  const m = r.choices[0].message;
  check(!m.reasoning_content && m.content.startsWith('<tool_call>{"name":"get_weather"'),
    'reasoning_effort none: no reasoning; without tools the tool-call text stays content', m);
  const r2 = await scripted.chat.completions.create({ model: 'scripted', messages: user('hi'),
    chat_template_kwargs: { enable_thinking: false } });
  check(r2.choices[0].message.content === m.content, 'chat_template_kwargs.enable_thinking=false does the same');
});

await attempt('tool call', async () => {
  const r = await scripted.chat.completions.create({ model: 'scripted', messages: user('Weather for 3 days?'),
    tools: weatherTool, reasoning_effort: 'none' });
  const c = r.choices[0];
  const tc = c.message.tool_calls;
  check(c.finish_reason === 'tool_calls' && tc && tc.length === 1 && tc[0].type === 'function' &&
    tc[0].function.name === 'get_weather' && JSON.stringify(JSON.parse(tc[0].function.arguments)) === '{"days":3}' &&
    tc[0].id.startsWith('call_') && c.message.content === null, 'a tool call is parsed into tool_calls', c);
  // send the call and its result back: the template must accept the round trip
  const r2 = await scripted.chat.completions.create({ model: 'scripted', messages: [
    ...user('Weather for 3 days?'), c.message, { role: 'tool', tool_call_id: tc[0].id, content: '{"forecast":"sunny"}' }],
    tools: weatherTool, reasoning_effort: 'none' });
  check(r2.choices.length === 1, 'assistant tool_calls and a tool result render through the template');
});

await attempt('tool call streaming', async () => {
  const s = await scripted.chat.completions.create({ model: 'scripted', messages: user('Weather?'), tools: weatherTool,
    reasoning_effort: 'none', stream: true });
  const calls = [];
  let finish = null, content = '';
  for await (const ch of s) {
    const d = ch.choices[0]?.delta || {};
    if (d.content) content += d.content;
    for (const t of d.tool_calls || []) {
      calls[t.index] = calls[t.index] || { name: '', arguments: '' };
      if (t.function?.name) calls[t.index].name += t.function.name;
      if (t.function?.arguments) calls[t.index].arguments += t.function.arguments;
    }
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
  }
  check(finish === 'tool_calls' && calls.length === 1 && calls[0].name === 'get_weather' &&
    JSON.parse(calls[0].arguments).days === 3 && content === '', 'stream: the tool call arrives as tool_calls deltas', { calls, finish, content });
});

await attempt('authentication', async () => {
  const bad = new OpenAI({ baseURL: process.env.SCRIPTED_URL + '/v1', apiKey: 'wrong', maxRetries: 0 });
  let status = 0, err = null;
  try { await bad.chat.completions.create({ model: 'scripted', messages: user('x') }); } catch (e) { status = e.status; err = e.error; }
  check(status === 401 && err && err.type === 'authentication_error', 'a wrong API key gets 401 with an error object', { status, err });
  const r = await raw(process.env.SCRIPTED_URL, '/v1/models', { method: 'GET' });
  check(r.status === 401 && isError(r.json), 'no API key gets 401');
  const h = await raw(process.env.SCRIPTED_URL, '/health', { method: 'GET' });
  check(h.status === 200 && h.json.status === 'ready', '/health needs no key and reports ready', h.json);
});

// ---- the random model ----
const R = process.env.RANDOM_URL;
await attempt('models', async () => {
  const list = await random.models.list();
  check(list.data.length === 1 && list.data[0].id === 'random' && list.data[0].object === 'model', 'GET /v1/models lists the model', list.data);
  const one = await random.models.retrieve('random');
  check(one.id === 'random', 'GET /v1/models/{id}');
});

await attempt('logprobs', async () => {
  const r = await random.chat.completions.create({ model: 'random', messages: user('Tell me'), max_tokens: 6,
    logprobs: true, top_logprobs: 5, reasoning_effort: 'none', temperature: 0 });
  const lp = r.choices[0].logprobs.content;
  let ok = lp.length === 6;
  for (const e of lp) {
    ok = ok && typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes) && e.top_logprobs.length === 5;
    for (let i = 1; i < e.top_logprobs.length; i++) ok = ok && e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob;
    ok = ok && Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6; // greedy: the chosen token is the best one
  }
  check(ok, 'logprobs with top_logprobs=5: one entry per token, 5 sorted alternatives, greedy = best', lp[0]);
  const s = await random.chat.completions.create({ model: 'random', messages: user('Tell me'), max_tokens: 4,
    logprobs: true, top_logprobs: 2, stream: true, reasoning_effort: 'none', temperature: 0 });
  let entries = 0;
  for await (const c of s) for (const e of c.choices[0]?.logprobs?.content || []) entries += e.top_logprobs.length === 2;
  check(entries === 4, 'stream: per-token logprobs in the chunks', entries);
});

await attempt('prefix cache', async () => {
  const messages = [{ role: 'system', content: 'You answer questions about rivers, briefly and with care. ' + 'Rivers. '.repeat(12) },
    { role: 'user', content: 'Which river is the longest, and by how much?' }];
  const ask = (m, extra = {}) => random.chat.completions.create({ model: 'random', messages: m, max_tokens: 8,
    logprobs: true, top_logprobs: 3, reasoning_effort: 'none', temperature: 0, ...extra });
  const a = await ask(messages), b = await ask(messages);
  check(a.usage.prompt_tokens_details.cached_tokens === 0 && b.usage.prompt_tokens_details.cached_tokens >= 32 &&
    b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens,
    'the same chat again: most of its prompt comes from the cache (cached_tokens)', [a.usage, b.usage]);
  check(a.choices[0].message.content === b.choices[0].message.content &&
    JSON.stringify(a.choices[0].logprobs) === JSON.stringify(b.choices[0].logprobs),
    'and its reply and logprobs are those of the cold request');
  const next = [...messages, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: 'And the second?' }];
  const c = await ask(next, { stream: true, stream_options: { include_usage: true } });
  let usage = null;
  for await (const ch of c) if (ch.usage) usage = ch.usage;
  check(usage && usage.prompt_tokens_details.cached_tokens >= 32, 'the next turn (streamed) reuses the conversation so far', usage);
  check(await metric(process.env.RANDOM_URL, 'strand_prefix_hit_tokens_total') >= 64, 'metrics: strand_prefix_hit_tokens_total');
});

await attempt('n choices', async () => {
  const r = await random.chat.completions.create({ model: 'random', messages: user('Name three colours'), n: 3,
    max_tokens: 6, temperature: 0, reasoning_effort: 'none', logprobs: true, top_logprobs: 2 });
  const one = await random.chat.completions.create({ model: 'random', messages: user('Name three colours'),
    max_tokens: 6, temperature: 0, reasoning_effort: 'none', logprobs: true, top_logprobs: 2 });
  check(r.choices.length === 3 && r.choices.every((c, i) => c.index === i && c.message.content === one.choices[0].message.content &&
    c.logprobs.content.length === 6 && c.finish_reason === 'length') && r.usage.completion_tokens === 18 &&
    r.usage.prompt_tokens === one.usage.prompt_tokens,
    'n=3 greedy: three choices (index 0..2) equal to the single reply, completion tokens summed', r.usage);
  const seeded = (n) => random.chat.completions.create({ model: 'random', messages: user('Pick one'), n, max_tokens: 8,
    temperature: 1, seed: 42, reasoning_effort: 'none' });
  const a = await seeded(3), b = await seeded(3);
  check(JSON.stringify(a.choices.map((c) => c.message.content)) === JSON.stringify(b.choices.map((c) => c.message.content)) &&
    new Set(a.choices.map((c) => c.message.content)).size > 1,
    'n=3 with a seed: each choice its own stream, the same on a second request', a.choices.map((c) => c.message.content));
  const s = await random.chat.completions.create({ model: 'random', messages: user('Stream two'), n: 2, max_tokens: 5,
    temperature: 0, reasoning_effort: 'none', stream: true, stream_options: { include_usage: true } });
  const text = ['', ''], fin = [null, null];
  let usage = null, bad = 0;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.index !== 0 && ch.index !== 1) bad++;
      else {
        text[ch.index] += ch.delta.content || '';
        if (ch.finish_reason) fin[ch.index] = ch.finish_reason;
      }
    }
  }
  check(!bad && text[0] === text[1] && text[0].length > 0 && fin[0] === 'length' && fin[1] === 'length' && usage.completion_tokens === 10,
    'streamed n=2: chunks of index 0 and 1, each with its finish reason, usage summed', { text, fin, usage });
  const cp = await random.completions.create({ model: 'random', prompt: 'Once upon', n: 2, best_of: 2, max_tokens: 4, temperature: 0 });
  check(cp.choices.length === 2 && cp.choices[0].text === cp.choices[1].text && cp.choices[1].index === 1,
    'completions: n=2 with best_of=2', cp.choices);
  const args = { model: 'random', prompt: 'Once upon a time', max_tokens: 6, temperature: 1, seed: 7 };
  const all = await random.completions.create({ ...args, n: 4, logprobs: 0 });
  const sums = all.choices.map((c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0));
  const bestIdx = sums.indexOf(Math.max(...sums));
  const best = await random.completions.create({ ...args, n: 1, best_of: 4 });
  check(best.choices.length === 1 && best.choices[0].index === 0 && best.choices[0].text === all.choices[bestIdx].text &&
    best.usage.completion_tokens === 24,
    'completions: best_of=4 returns the likeliest of the 4 choices (the same 4 as n=4 with the seed), usage counts all 4',
    { sums, best: best.choices[0].text, want: all.choices[bestIdx].text });
});

await attempt('max_tokens and stop', async () => {
  const r = await random.chat.completions.create({ model: 'random', messages: user('Go'), max_tokens: 7,
    reasoning_effort: 'none', temperature: 0 });
  check(r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 7, 'max_tokens ends with finish_reason length', r.usage);
  const full = (await random.chat.completions.create({ model: 'random', messages: user('Go'), max_tokens: 40,
    reasoning_effort: 'none', temperature: 0 })).choices[0].message.content;
  const cps = Array.from(full);
  const stop = cps.slice(12, 16).join('');
  const at = full.indexOf(stop);
  const r2 = await random.chat.completions.create({ model: 'random', messages: user('Go'), max_tokens: 40,
    reasoning_effort: 'none', temperature: 0, stop: [stop, 'never-appears'] });
  check(cps.length > 20 && r2.choices[0].finish_reason === 'stop' && r2.choices[0].message.content === full.slice(0, at),
    'a stop string ends the text before it (not emitted), finish_reason stop', { stop, got: r2.choices[0].message.content });
  const r3 = await random.chat.completions.create({ model: 'random', messages: user('Go'), max_completion_tokens: 3,
    reasoning_effort: 'none' });
  check(r3.usage.completion_tokens === 3, 'max_completion_tokens is honoured');
});

await attempt('completions', async () => {
  const r = await random.completions.create({ model: 'random', prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  check(r.object === 'text_completion' && typeof r.choices[0].text === 'string' && r.usage.completion_tokens === 5,
    'POST /v1/completions with a text prompt', r.choices[0]);
  const ids = await random.completions.create({ model: 'random', prompt: [9707, 11, 1879], max_tokens: 3, temperature: 0, logprobs: 2 });
  check(ids.usage.prompt_tokens === 3 && ids.choices[0].logprobs.tokens.length === 3 && ids.choices[0].logprobs.top_logprobs[0] &&
    Object.keys(ids.choices[0].logprobs.top_logprobs[0]).length >= 1, 'POST /v1/completions with token ids and logprobs', ids.choices[0].logprobs);
  const s = await random.completions.create({ model: 'random', prompt: 'Once upon a time', max_tokens: 5, temperature: 0, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text || '';
  check(text === r.choices[0].text, 'streamed completion equals the non-streamed one');
});

await attempt('16 concurrent streams', async () => {
  const one = async (i) => {
    const s = await random.chat.completions.create({ model: 'random', messages: user('Story number ' + i), max_tokens: 12,
      temperature: 1, seed: 1000 + i, reasoning_effort: i % 2 ? 'none' : 'high', stream: true });
    let content = '', reasoning = '';
    for await (const c of s) {
      content += c.choices[0]?.delta?.content || '';
      reasoning += c.choices[0]?.delta?.reasoning_content || '';
    }
    return reasoning + '</think>' + content; // chunk boundaries depend on timing; the text must not
  };
  const together = await Promise.all(Array.from({ length: 16 }, (_, i) => one(i)));
  const alone = [];
  for (let i = 0; i < 16; i++) alone.push(await one(i));
  const same = together.every((t, i) => t === alone[i]);
  const distinct = new Set(together).size;
  check(same && distinct > 8, '16 concurrent seeded streams each match their solo output', { distinct, a: together[3], b: alone[3] });
});

await attempt('disconnect', async () => {
  const before = await metric(R, 'strand_client_disconnects_total');
  const ctl = new AbortController();
  const s = await random.chat.completions.create({ model: 'random', messages: user('Long story'), max_tokens: 200,
    reasoning_effort: 'none', stream: true, ignore_eos: true }, { signal: ctl.signal });
  let got = 0;
  try {
    for await (const c of s) { if (++got === 3) ctl.abort(); }
  } catch { /* aborted */ }
  let running = -1, after = before, blocks = -1;
  for (let i = 0; i < 40; i++) {
    await sleep(50);
    running = await metric(R, 'strand_running_sequences');
    after = await metric(R, 'strand_client_disconnects_total');
    blocks = await metric(R, 'strand_kv_blocks_used');
    if (running === 0 && after > before) break;
  }
  check(got >= 3 && running === 0 && after === before + 1 && blocks === 0,
    'a client that disconnects mid-stream cancels its sequence: slot and KV blocks free (seen in /metrics)', { got, running, before, after, blocks });
});

await attempt('malformed requests', async () => {
  const cases = [
    ['invalid JSON', '/v1/chat/completions', '{"messages": [', 400],
    ['body not an object', '/v1/chat/completions', '[1,2]', 400],
    ['messages missing', '/v1/chat/completions', '{"model":"random"}', 400],
    ['messages of the wrong type', '/v1/chat/completions', '{"messages":"hi"}', 400],
    ['unknown role', '/v1/chat/completions', '{"messages":[{"role":"wizard","content":"x"}]}', 400],
    ['content of the wrong type', '/v1/chat/completions', '{"messages":[{"role":"user","content":5}]}', 400],
    ['temperature out of range', '/v1/chat/completions', '{"messages":[{"role":"user","content":"x"}],"temperature":5}', 400],
    ['max_tokens not an integer', '/v1/chat/completions', '{"messages":[{"role":"user","content":"x"}],"max_tokens":"many"}', 400],
    ['top_logprobs without logprobs', '/v1/chat/completions', '{"messages":[{"role":"user","content":"x"}],"top_logprobs":3}', 400],
    ['top_logprobs over 20', '/v1/chat/completions', '{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}', 400],
    ['n over 16', '/v1/chat/completions', '{"messages":[{"role":"user","content":"x"}],"n":17}', 400],
    ['best_of under n', '/v1/completions', '{"prompt":"x","n":3,"best_of":2}', 400],
    ['best_of over n with stream', '/v1/completions', '{"prompt":"x","n":1,"best_of":2,"stream":true}', 400],
    ['logit_bias key not a token id', '/v1/chat/completions', '{"messages":[{"role":"user","content":"x"}],"logit_bias":{"abc":1}}', 400],
    ['JSON nested too deep', '/v1/chat/completions', '{"messages":' + '['.repeat(100) + ']'.repeat(100) + '}', 400],
    ['prompt over the context', '/v1/chat/completions', JSON.stringify({ messages: user('word '.repeat(400)) }), 400],
    ['completion prompt missing', '/v1/completions', '{"max_tokens":3}', 400],
    ['unknown model', '/v1/chat/completions', '{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}', 404],
    ['unknown route', '/v1/embeddings', '{}', 404],
    ['body over the limit', '/v1/chat/completions', JSON.stringify({ messages: user('x'.repeat(1.5 * 1024 * 1024)) }), 413],
  ];
  for (const [what, path, body, status] of cases) {
    const r = await raw(R, path, { body });
    check(r.status === status && isError(r.json), `${what}: ${status} with an OpenAI error object`, { status: r.status, body: r.text.slice(0, 200) });
  }
  const ctx = await raw(R, '/v1/chat/completions', { body: JSON.stringify({ messages: user('word '.repeat(400)) }) });
  check(ctx.json?.error?.code === 'context_length_exceeded', 'the context error says context_length_exceeded', ctx.json);
  const big = await raw(R, '/v1/models', { method: 'GET', headers: { 'X-Padding': 'a'.repeat(100000) } });
  check(big.status === 431, 'headers over the per-connection limit: 431', big.status);
  const g = await raw(R, '/v1/chat/completions', { method: 'GET' });
  check(g.status === 405 && isError(g.json), 'GET on a POST route: 405');
  const h = await raw(R, '/health', { method: 'GET' });
  const ok = await random.chat.completions.create({ model: 'random', messages: user('still there?'), max_tokens: 2 });
  check(h.status === 200 && ok.choices.length === 1, 'the server keeps serving after the bad requests');
});

// ---- a one-sequence server: queueing, keep-alive, busy, error inside a stream ----
const S = process.env.SMALL_URL;
await attempt('queue, keep-alive, busy', async () => {
  const long = await fetch(S + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: user('first'), max_tokens: 30000, stream: true, reasoning_effort: 'none', ignore_eos: true }) });
  const reader1 = long.body.getReader();
  await reader1.read();
  // the second request waits in the queue; its stream gets keep-alive comments meanwhile
  const ctl = new AbortController();
  const queued = fetch(S + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ctl.signal,
    body: JSON.stringify({ messages: user('second'), max_tokens: 2, stream: true }) });
  await sleep(100);
  const busy = await raw(S, '/v1/chat/completions', { body: JSON.stringify({ messages: user('third'), max_tokens: 2 }) });
  check(busy.status === 429 && isError(busy.json) && busy.json.error.code === 'queue_full', 'a full queue answers 429 with an error object', busy);
  const q = await queued;
  const reader2 = q.body.getReader();
  let early = '';
  for (let i = 0; i < 3 && !early.includes(': keep-alive'); i++) early += new TextDecoder().decode((await reader2.read()).value);
  check(early.includes(': keep-alive\n\n'), 'a queued stream receives SSE keep-alive comments while it waits', early.slice(0, 300));
  reader1.cancel();
  let rest = '';
  for (;;) { const { value, done } = await reader2.read(); if (done) break; rest += new TextDecoder().decode(value); }
  check(rest.includes('"finish_reason":"length"') && rest.trimEnd().endsWith('data: [DONE]'), 'the queued request runs when the slot frees', rest.slice(-200));
});

await attempt('grammar (GBNF)', async () => {
  const grammar = 'root ::= "The answer is " ("yes" | "no") "."';
  const req = { model: 'random', messages: user('answer'), max_tokens: 60, seed: 7, reasoning_effort: 'none', grammar };
  const r = await random.chat.completions.create(req);
  const text = r.choices[0].message.content;
  check(/^The answer is (yes|no)\.$/.test(text) && r.choices[0].finish_reason === 'stop',
    'grammar: the reply is a sentence of the GBNF grammar and ends with it (finish stop)', r.choices[0]);
  const s = await random.chat.completions.create({ ...req, stream: true });
  let streamed = '';
  for await (const c of s) streamed += c.choices[0]?.delta?.content ?? '';
  check(streamed === text, 'streamed, the same sentence', { streamed, text });
  const c = await random.completions.create({ model: 'random', prompt: 'Numbers:', max_tokens: 12, seed: 3,
    grammar: 'root ::= [0-9]+ (", " [0-9]+)*' });
  check(/^[0-9]+(, [0-9]+)*(, ?)?$/.test(c.choices[0].text), 'completions: the text stays inside the grammar (a list of numbers)', c.choices[0]);
  let status = 0, msg = '';
  try { await random.chat.completions.create({ ...req, grammar: 'root ::= item' }); } catch (e) { status = e.status; msg = String(e.message); }
  check(status === 400 && msg.includes('never defined'), 'a grammar with an undefined rule: 400 naming the rule', { status, msg });
  status = 0;
  try { await random.chat.completions.create({ ...req, response_format: { type: 'json_object' } }); } catch (e) { status = e.status; msg = String(e.message); }
  check(status === 400 && msg.includes('grammar'), 'a grammar beside a JSON response_format: 400', { status, msg });
});

await attempt('response_format json_object', async () => {
  const req = { model: 'random', messages: user('give json'), max_tokens: 200, seed: 2, reasoning_effort: 'none',
    response_format: { type: 'json_object' } };
  const r = await random.chat.completions.create(req);
  const text = r.choices[0].message.content;
  let obj = null;
  try { obj = JSON.parse(text); } catch { /* not JSON */ }
  check(r.choices[0].finish_reason === 'stop' && obj !== null && typeof obj === 'object' && !Array.isArray(obj),
    'response_format json_object: the reply is one JSON object and ends with it (finish stop)', { text, fin: r.choices[0].finish_reason });
  const s = await random.chat.completions.create({ ...req, stream: true });
  let streamed = '', fin = null;
  for await (const c of s) { streamed += c.choices[0]?.delta?.content ?? ''; fin = c.choices[0]?.finish_reason ?? fin; }
  check(streamed === text && fin === 'stop', 'streamed, the same JSON object', { streamed, fin });
  const cut = await random.chat.completions.create({ ...req, seed: 3, max_tokens: 40 });
  check(cut.choices[0].finish_reason === 'length' && cut.choices[0].message.content.startsWith('{'),
    'cut by max_tokens: finish length, the reply an object begun', cut.choices[0]);
  const schema = { type: 'object', properties: { answer: { type: 'integer', minimum: 0, maximum: 9 }, ok: { type: 'boolean' },
    tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 2 } }, required: ['answer', 'ok'], additionalProperties: false };
  const sreq = { model: 'random', messages: user('answer'), max_tokens: 200, seed: 4, reasoning_effort: 'none',
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } } };
  let valid = 0, n = 0;
  for (const seed of [4, 5, 6]) {
    const sr = await random.chat.completions.create({ ...sreq, seed });
    let o = null;
    try { o = JSON.parse(sr.choices[0].message.content); } catch { /* not JSON */ }
    n++;
    if (sr.choices[0].finish_reason === 'stop' && o && Number.isInteger(o.answer) && o.answer >= 0 && o.answer <= 9 &&
        typeof o.ok === 'boolean' && Object.keys(o).every((k) => ['answer', 'ok', 'tags'].includes(k)) &&
        (o.tags === undefined || (o.tags.length <= 2 && o.tags.every((t) => t === 'a' || t === 'b')))) valid++;
    else console.log('# not valid:', sr.choices[0]);
  }
  check(valid === n, `response_format json_schema (strict): ${valid} of ${n} replies satisfy the schema and end with it`);
  const ss = await random.chat.completions.create({ ...sreq, stream: true });
  let st = '';
  for await (const c of ss) st += c.choices[0]?.delta?.content ?? '';
  const one = await random.chat.completions.create(sreq);
  check(st === one.choices[0].message.content, 'streamed, the same reply', { st, one: one.choices[0].message.content });
  const bad = await raw(R, '/v1/chat/completions', { body: JSON.stringify({ ...req, response_format: { type: 'json_schema',
    json_schema: { name: 'x', strict: true, schema: { type: 'string', pattern: '(?=a)b' } } } }) });
  check(bad.status === 400 && isError(bad.json) && bad.json.error.param === 'response_format' && /'pattern'/.test(bad.json.error.message),
    'a strict schema with a keyword strand cannot follow: a 400 naming the keyword', bad.json);
  const preq = { model: 'random', messages: user('code'), max_tokens: 60, seed: 9, reasoning_effort: 'none',
    response_format: { type: 'json_schema', json_schema: { name: 'code', strict: true, schema: { type: 'object',
      properties: { code: { type: 'string', pattern: '^[A-Z]{2}-[0-9]{2}$' } }, required: ['code'], additionalProperties: false } } } };
  const pr = await random.chat.completions.create(preq);
  let po = null;
  try { po = JSON.parse(pr.choices[0].message.content); } catch { /* not JSON */ }
  check(pr.choices[0].finish_reason === 'stop' && po && /^[A-Z]{2}-[0-9]{2}$/.test(po.code),
    'a string with a pattern: the reply\'s string matches it', pr.choices[0]);
});

await attempt('tool_choice forces a call', async () => {
  // the vision server: a random tiny model with a full context (the tools' prompt is long)
  // parameters a random model closes quickly (a free text value would run to max_tokens: test_grammar covers those)
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {
      metric: { type: 'boolean' }, days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['metric', 'days'] } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { enum: ['utc', 'local'] } } } } },
  ];
  const req = { model: 'vision', messages: user('weather?'), tools, tool_choice: 'required', max_tokens: 200, seed: 1, reasoning_effort: 'none' };
  let good = 0, n = 0;
  for (const seed of [1, 2, 3]) {
    const r = await vision.chat.completions.create({ ...req, seed });
    const c = r.choices[0], call = c.message.tool_calls && c.message.tool_calls[0];
    n++;
    let args = null;
    try { args = JSON.parse(call.function.arguments); } catch { /* not JSON */ }
    if (c.finish_reason === 'tool_calls' && call && args &&
        ((call.function.name === 'get_weather' && typeof args.metric === 'boolean' && Number.isInteger(args.days) && args.days >= 1 && args.days <= 7) ||
         (call.function.name === 'get_time' && (args.zone === undefined || args.zone === 'utc' || args.zone === 'local')))) good++;
    else console.log('# not a valid call:', JSON.stringify(c).slice(0, 400));
  }
  check(good === n, `tool_choice "required": ${good} of ${n} replies are one call of an offered tool with valid arguments (finish tool_calls)`);
  const named = await vision.chat.completions.create({ ...req, tool_choice: { type: 'function', function: { name: 'get_time' } } });
  const nc = named.choices[0].message.tool_calls;
  check(named.choices[0].finish_reason === 'tool_calls' && nc && nc.length === 1 && nc[0].function.name === 'get_time',
    'tool_choice naming get_time: a call of get_time', named.choices[0]);
  const s = await vision.chat.completions.create({ ...req, stream: true });
  let name = '', fin = null;
  for await (const c of s) {
    const d = c.choices[0]?.delta;
    if (d?.tool_calls) name += d.tool_calls[0].function?.name ?? '';
    fin = c.choices[0]?.finish_reason ?? fin;
  }
  check(['get_weather', 'get_time'].includes(name) && fin === 'tool_calls', 'streamed, the call arrives as a tool_calls delta', { name, fin });
  const bad = await raw(process.env.VISION_URL, '/v1/chat/completions', { body: JSON.stringify({ ...req, tool_choice: { type: 'function', function: { name: 'nope' } } }) });
  check(bad.status === 400 && isError(bad.json) && bad.json.error.param === 'tool_choice', 'a tool_choice naming no offered tool: a 400', bad.json);
});

await attempt('error inside a stream', async () => {
  const r = await fetch(S + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: user('doomed'), max_tokens: 20000, stream: true, reasoning_effort: 'none', ignore_eos: true }) });
  const reader = r.body.getReader();
  await reader.read();
  process.kill(Number(process.env.SMALL_PID), 'SIGTERM');
  let text = '';
  for (;;) { const { value, done } = await reader.read(); if (done) break; text += new TextDecoder().decode(value); }
  const lines = text.trim().split('\n\n');
  const errLine = lines.find((l) => l.startsWith('data: {"error"'));
  check(r.status === 200 && errLine && isError(JSON.parse(errLine.slice(6))) && lines[lines.length - 1] === 'data: [DONE]',
    'an error after the stream started arrives as an error event, then [DONE]', lines.slice(-2));
});

done();

// TAP lines for the end-to-end scripts ("ok N - ..." / "not ok N - ..."), counted by
// tests/run.sh, and the small helpers they share.
let n = 0;

export function check(cond, what, detail) {
  n++;
  console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${what}${!cond && detail !== undefined ? ' :: ' + JSON.stringify(detail).slice(0, 800) : ''}`);
  return cond;
}

// run a group of checks; an exception is one failed check
export async function attempt(what, fn) {
  try { await fn(); } catch (e) { check(false, what, String(e && e.stack || e)); }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function done() { console.log(`# ${n} checks`); }

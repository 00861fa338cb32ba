// Shared by the four scripts: the client (only baseURL and apiKey set, as a user would), the
// arguments, and the one JSON line each prints.
//
// Usage: node SCRIPT.mjs BASE_URL MODEL   (the key comes from OPENAI_API_KEY, default "caller-key")
// Prints {"api", "stream", "text", "status", "headers": {"x-hedgerow-winner", ...}} on stdout and
// exits 0; on any error prints it on stderr and exits 1 (2 for bad arguments).
import OpenAI from 'openai';

const HEADERS = ['x-hedgerow-winner', 'x-hedgerow-hedged', 'x-hedgerow-request-id', 'content-type'];

export function setup() {
  const [baseURL, model] = process.argv.slice(2);
  if (!baseURL || !model) {
    console.error('usage: node SCRIPT.mjs BASE_URL MODEL (key in OPENAI_API_KEY)');
    process.exit(2);
  }
  const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'caller-key' });
  return { client, model };
}

export function report(api, stream, text, response) {
  const headers = {};
  for (const name of HEADERS) headers[name] = response.headers.get(name);
  console.log(JSON.stringify({ api, stream, text, status: response.status, headers }));
}

export async function run(main) {
  try {
    await main();
  } catch (err) {
    const status = err && err.status !== undefined ? ` (HTTP ${err.status})` : '';
    console.error(`${err && err.constructor ? err.constructor.name : 'Error'}${status}: ${err && err.message}`);
    process.exit(1);
  }
}

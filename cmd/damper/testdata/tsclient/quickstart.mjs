// The README's offline quick start: the official TypeScript SDK, pointed
// at a damper proxy, makes one call and prints who answered it.
// Usage: QUICKSTART_CLIENT_KEY=... node quickstart.mjs
// (QUICKSTART_PROXY_URL, when set, is where the proxy is.)
import Anthropic from '@anthropic-ai/sdk';

const baseURL = process.env.QUICKSTART_PROXY_URL || 'http://127.0.0.1:8787';
const client = new Anthropic({ baseURL, apiKey: process.env.QUICKSTART_CLIENT_KEY });
const { data: msg, response } = await client.messages
  .create({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'Hi' }] })
  .withResponse();
const h = (name) => response.headers.get(name);
console.log(`${msg.content[0].text} (answered by ${h('damper-backend')} after ${h('damper-attempts')} attempts)`);

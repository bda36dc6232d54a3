// The official TypeScript SDK, pointed at a damper proxy with fallback
// backends, makes the calls named on the command line and prints one JSON
// line per call: the answer's text and the Damper-* headers.
// Usage: node fallback.mjs <proxy base URL> <call>...
//
// A call is "plain", "stream", or "until:<text>:<n>": plain calls, at most
// n, until one's text is <text>.
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, ...calls] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: process.env.ANTHROPIC_API_KEY, maxRetries: 0 });

const params = {
  model: 'claude-sonnet-4-6',
  max_tokens: 64,
  messages: [{ role: 'user', content: 'Explain retry storms' }],
};

async function run(call) {
  const result = { call };
  try {
    if (call === 'stream') {
      const { data: stream, response } = await client.messages.create({ ...params, stream: true }).withResponse();
      result.attempts = response.headers.get('damper-attempts');
      let text = '';
      for await (const ev of stream) {
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
        if (ev.type === 'message_stop') result.stop = true;
      }
      result.text = text;
    } else {
      const { data: msg, response } = await client.messages.create(params).withResponse();
      result.attempts = response.headers.get('damper-attempts');
      result.outcome = response.headers.get('damper-outcome');
      result.text = msg.content.map((b) => b.text).join('');
    }
    result.ok = true;
  } catch (err) {
    result.ok = false;
    result.error = err.constructor.name;
    result.status = err.status ?? 0;
    result.message = String(err.message).slice(0, 300);
  }
  return result;
}

for (const call of calls) {
  const until = call.match(/^until:(.*):(\d+)$/);
  if (!until) {
    process.stdout.write(JSON.stringify(await run(call)) + '\n');
    continue;
  }
  let made = 0;
  let last;
  do {
    last = await run('plain');
    made++;
  } while (last.text !== until[1] && made < Number(until[2]));
  process.stdout.write(JSON.stringify({ ...last, call, made }) + '\n');
}

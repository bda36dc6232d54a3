// The official TypeScript SDK, pointed at a damper proxy, runs each case
// named on the command line and prints one JSON line per case: what the
// SDK returned or threw. Usage: node client.mjs <proxy base URL> <case>...
//
// A case is a scenario of the fake API behind the proxy; its name says
// whether the call streams ("stream-" prefix) or not.
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, ...cases] = process.argv.slice(2);
const apiKey = process.env.ANTHROPIC_API_KEY;

const client = new Anthropic({ baseURL, apiKey }); // the SDK's own two retries left on

const params = {
  model: 'claude-sonnet-4-6',
  max_tokens: 64,
  messages: [{ role: 'user', content: 'Explain retry storms' }],
};

async function run(name) {
  const headers = { 'X-Dampertest-Scenario': name };
  const result = { case: name };
  try {
    if (name.startsWith('stream-')) {
      const { data: stream, response } = await client.messages
        .create({ ...params, stream: true }, { headers })
        .withResponse();
      result.attempts = response.headers.get('damper-attempts');
      let text = '';
      try {
        for await (const ev of stream) {
          if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
          if (ev.type === 'message_stop') result.stop = true;
        }
      } finally {
        result.text = text;
      }
    } else {
      const { data: msg, response } = await client.messages.create(params, { headers }).withResponse();
      result.attempts = response.headers.get('damper-attempts');
      result.text = msg.content.map((b) => b.text).join('');
    }
    result.ok = true;
  } catch (err) {
    result.ok = false;
    result.error = err.constructor.name;
    result.status = err.status ?? 0;
    result.type = err.error?.error?.type ?? err.type ?? '';
    result.code = err.error?.error?.details?.error_code ?? '';
    result.attempts ??= err.headers?.get?.('damper-attempts') ?? null;
    result.outcome = err.headers?.get?.('damper-outcome') ?? null;
  }
  return result;
}

for (const name of cases) {
  process.stdout.write(JSON.stringify(await run(name)) + '\n');
}

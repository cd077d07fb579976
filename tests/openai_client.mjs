// The official `openai` npm client against `replay serve` (started by
// tests/cli_openai_client.sh): chat and completions, streamed and not.
// Prints "N passed, N failed".
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'sekrit' });
let pass = 0, fail = 0;
const check = (name, ok, detail = '') => {
  if (ok) pass++; else { fail++; console.log(`FAIL: ${name} ${detail}`); }
};

try {
  const models = await client.models.list();
  check('models.list', models.data.length === 1 && models.data[0].id === model, JSON.stringify(models.data));

  const c = await client.completions.create({ model, prompt: 'Hello', max_tokens: 5, temperature: 0 });
  check('completions', c.object === 'text_completion' && c.choices.length === 1 &&
        c.choices[0].finish_reason === 'length' && c.usage.completion_tokens === 5, JSON.stringify(c));

  const chat = await client.chat.completions.create({
    model, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi!' }],
    max_tokens: 4, seed: 7, temperature: 0.8,
  });
  check('chat', chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant' &&
        typeof chat.choices[0].message.content === 'string' && chat.usage.total_tokens > 4, JSON.stringify(chat));

  let text = '', chunks = 0, usage = null, finish = null;
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Count to three.' }], max_tokens: 6, stream: true,
    stream_options: { include_usage: true }, seed: 1,
  });
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      text += choice.delta?.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check('chat stream', chunks >= 6 && finish === 'length' && usage && usage.completion_tokens === 6,
        `chunks ${chunks} finish ${finish} usage ${JSON.stringify(usage)}`);

  let ctext = '', cfinish = null;
  const cstream = await client.completions.create({ model, prompt: [9707, 1879], max_tokens: 5, stream: true });
  for await (const ch of cstream) {
    for (const choice of ch.choices) { ctext += choice.text; if (choice.finish_reason) cfinish = choice.finish_reason; }
  }
  check('completions stream', cfinish === 'length', `finish ${cfinish}`);

  const seeded = async () => (await client.completions.create({ model, prompt: 'x', max_tokens: 8, seed: 42 })).choices[0].text;
  check('same seed, same text', (await seeded()) === (await seeded()));

  try {
    await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], temperature: -1 });
    check('bad temperature raises', false);
  } catch (e) {
    check('bad temperature raises 400', e.status === 400 && /temperature/.test(e.message), `${e.status} ${e.message}`);
  }
  try {
    await client.chat.completions.create({ model: 'other', messages: [{ role: 'user', content: 'x' }] });
    check('unknown model raises', false);
  } catch (e) {
    check('unknown model raises 404', e.status === 404, `${e.status}`);
  }
  try {
    await new OpenAI({ baseURL, apiKey: 'wrong' }).models.list();
    check('wrong key raises', false);
  } catch (e) {
    check('wrong key raises 401', e.status === 401, `${e.status}`);
  }
} catch (e) {
  check('client run', false, e.stack);
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);

// The official `openai` npm client against `replay serve` (started by
// tests/cli_server_openai.sh): completions and chat, streamed and not,
// logprobs and top logprobs, n, stop (include_stop_str_in_output), usage (with
// prompt_tokens_details.cached_tokens), models.retrieve, logit_bias, min_tokens, prompt logprobs (echo with
// logprobs, vLLM's prompt_logprobs, checked against greedy decoding), parameters refused by name, and
// the client's error classes for a bad request, an unknown model and a wrong API key; tools:
// refused without the parser flags, and (TOOLS=on, a server with --enable-auto-tool-choice
// --tool-call-parser hermes --reasoning-parser qwen3) the answers' shapes, streamed and not, and a
// tool-calling conversation sent back. The random model writes no call, so the client never sees
// tool_calls here (tests/test_server.c scripts those).
// Usage: [CACHE=off | TOOLS=on] node server_openai.mjs BASE_URL MODEL API_KEY (CACHE=off: a server
// with --disable-prefix-caching; the test stops after the prefix cache's checks)
import OpenAI from 'openai';

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
let failures = 0, passes = 0;
function check(name, cond, detail) {
  if (cond) passes++;
  else { failures++; console.log(`FAIL: ${name}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`); }
}
async function expectError(name, fn, status, cls) {
  try { await fn(); check(name, false, 'no error'); }
  catch (e) { check(name, e instanceof cls && e.status === status, { status: e.status, name: e.constructor.name, message: e.message }); }
}

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
                 parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const toolHistory = [{ role: 'user', content: 'Weather in Oslo?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function',
    function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
  { role: 'tool', tool_call_id: 'call_abc', content: '-3 C' }];
if (process.env.TOOLS === 'on') {
  let t = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Oslo?' }],
                                                tools, max_tokens: 4, ignore_eos: true });
  const msg = t.choices[0].message;
  check('tools: message', msg.role === 'assistant' && 'reasoning_content' in msg && msg.tool_calls === undefined &&
        typeof msg.content === 'string', msg);
  check('tools: finish', t.choices[0].finish_reason === 'length', t.choices[0]);
  let streamed = '', fin = null, roles = 0;
  for await (const ch of await client.chat.completions.create({ model, tools, tool_choice: 'auto', max_tokens: 4,
      ignore_eos: true, stream: true, messages: [{ role: 'user', content: 'Weather in Oslo?' }] })) {
    for (const choice of ch.choices) {
      if (choice.delta.role) roles++;
      streamed += (choice.delta.content ?? '') + (choice.delta.reasoning_content ?? '');
      check('tools, streamed: no tool_calls', choice.delta.tool_calls === undefined, choice.delta);
      if (choice.finish_reason) fin = choice.finish_reason;
    }
  }
  check('tools, streamed: role and finish', roles === 1 && fin === 'length', { roles, fin });
  t = await client.chat.completions.create({ model, messages: toolHistory, tools, max_tokens: 2 });
  check('tools: the round trip answered', t.choices.length === 1 && t.usage.prompt_tokens > 20, t);
  // forced calls: the answer held to the calls' JSON (thinking off: the constraint starts at once)
  const wtools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
      properties: { city: { enum: ['Oslo', 'Paris'] } }, required: ['city'], additionalProperties: false } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {},
      additionalProperties: false } } }];
  const forced = { model, messages: [{ role: 'user', content: 'Weather?' }], tools: wtools, max_tokens: 48,
                   chat_template_kwargs: { enable_thinking: false } };
  const named = { type: 'function', function: { name: 'get_weather' } };
  t = await client.chat.completions.create({ ...forced, tool_choice: named });
  let fc = t.choices[0];
  check('named tool_choice', fc.finish_reason === 'tool_calls' && fc.message.content === null &&
        fc.message.tool_calls.length === 1 && fc.message.tool_calls[0].function.name === 'get_weather' &&
        ['Oslo', 'Paris'].includes(JSON.parse(fc.message.tool_calls[0].function.arguments).city) &&
        fc.message.tool_calls[0].id.length > 0, fc);
  let fname = null, fargs = '', ffin = null;
  for await (const ch of await client.chat.completions.create({ ...forced, tool_choice: named, stream: true })) {
    for (const choice of ch.choices) {
      for (const tc of choice.delta.tool_calls ?? []) {
        if (tc.function?.name) fname = tc.function.name;
        fargs += tc.function?.arguments ?? '';
      }
      if (choice.finish_reason) ffin = choice.finish_reason;
    }
  }
  check('named tool_choice streamed', fname === 'get_weather' && ffin === 'tool_calls' &&
        ['Oslo', 'Paris'].includes(JSON.parse(fargs).city), { fname, fargs, ffin });
  t = await client.chat.completions.create({ ...forced, tool_choice: 'required', parallel_tool_calls: false, seed: 3 });
  fc = t.choices[0];
  check('required tool_choice, one call', fc.finish_reason === 'tool_calls' && fc.message.tool_calls.length === 1 &&
        ['get_weather', 'get_time'].includes(fc.message.tool_calls[0].function.name) &&
        typeof JSON.parse(fc.message.tool_calls[0].function.arguments) === 'object', fc);
  await expectError('tool_choice required with response_format', () => client.chat.completions.create({ ...forced,
                    tool_choice: 'required', response_format: { type: 'json_object' } }), 400, OpenAI.BadRequestError);
  // structured output after the thinking (vLLM's rule with a reasoning parser): thinking off in the
  // template (its prompt closes </think>), the answer is a choice at once; thinking on, the random
  // model thinks freely (it never writes </think>) until max_tokens
  const pick = { model, messages: [{ role: 'user', content: 'Pick one' }], guided_choice: ['yes', 'no way'] };
  t = await client.chat.completions.create({ ...pick, max_tokens: 8,
                                            chat_template_kwargs: { enable_thinking: false } });
  check('choice with thinking off', ['yes', 'no way'].includes(t.choices[0].message.content) &&
        t.choices[0].finish_reason === 'stop', t.choices[0]);
  t = await client.chat.completions.create({ ...pick, max_tokens: 8, seed: 1 });
  check('choice after free thinking', t.choices[0].finish_reason === 'length' &&
        t.usage.completion_tokens === 8, t.choices[0]);
  console.log(`${passes} passed, ${failures} failed`);
  process.exit(failures ? 1 : 0);
}

// models
const models = await client.models.list();
check('models.list', models.data.length === 1 && models.data[0].id === model, models.data);
const one = await client.models.retrieve(model);
check('models.retrieve', one.id === model && one.object === 'model', one);
await expectError('models.retrieve of another model', () => client.models.retrieve('gpt-4'), 404,
                  OpenAI.NotFoundError);

// completions, not streamed
let c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
                                          ignore_eos: true, logprobs: 0 });
check('completion object', c.object === 'text_completion' && c.choices.length === 1, c);
check('completion length', c.choices[0].finish_reason === 'length' && c.usage.completion_tokens === 8, c.usage);
check('completion logprobs', c.choices[0].logprobs.token_logprobs.length === 8, c.choices[0].logprobs);
const greedy = c.choices[0].text;

// include_stop_str_in_output (vLLM's): a stop string from the greedy text, kept in the answer or not
const at = [...greedy].findIndex((ch, i) => i >= 2 && /[A-Za-z]/.test(ch));
if (at > 0) {
  const stop = [...greedy][at];
  const cut = greedy.indexOf(stop);
  for (const keep of [false, true]) {
    const s = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
                                               ignore_eos: true, stop, include_stop_str_in_output: keep });
    check(`include_stop_str_in_output ${keep}`, s.choices[0].text === greedy.slice(0, cut + (keep ? stop.length : 0)) &&
          s.choices[0].finish_reason === 'stop', { greedy, stop, got: s.choices[0].text });
  }
} else console.log(`note: no letter in the greedy text ${JSON.stringify(greedy)}; include_stop_str_in_output not checked`);
// a parameter replay does not implement is a 400 naming it, never ignored
for (const [name, extra] of [['min_tokens', { min_tokens: 4 }], ['logit_bias', { logit_bias: { '999999': 10 } }],
                             ['best_of', { best_of: 2 }], ['made_up_field', { made_up_field: 1 }]]) {
  try {
    await client.completions.create({ model, prompt: 'x', max_tokens: 1, ...extra });
    check(`${name} refused`, false, 'no error');
  } catch (e) {
    check(`${name} refused`, e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === name,
          { status: e.status, param: e.param, message: e.message });
  }
}

let cr;
// logit_bias (OpenAI's): +100 makes greedy write the token (9707 is "Hello"), -100 bans it
c = await client.completions.create({ model, prompt: 'x', max_tokens: 3, temperature: 0, ignore_eos: true,
                                      logit_bias: { '9707': 100 } });
check('logit_bias +100', c.choices[0].text === 'HelloHelloHello', c.choices[0]);
c = await client.completions.create({ model, prompt: 'x', max_tokens: 1, temperature: 0,
                                      logit_bias: { '9707': 100, '1879': 100 } });
const helloWon = c.choices[0].text === 'Hello';
check('logit_bias: one of two at +100', helloWon || c.choices[0].text === ' world', c.choices[0]);
cr = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 1,
  temperature: 0, logit_bias: helloWon ? { '9707': -100, '1879': 100 } : { '9707': 100, '1879': -100 } });
check('logit_bias -100 (chat)', cr.choices[0].message.content === (helloWon ? ' world' : 'Hello'), cr.choices[0]);
// min_tokens (vLLM's): EOS made certain ends the answer at once, not before min_tokens
c = await client.completions.create({ model, prompt: 'x', max_tokens: 10, logit_bias: { '151645': 100 } });
check('EOS biased', c.usage.completion_tokens === 1 && c.choices[0].finish_reason === 'stop', c);
c = await client.completions.create({ model, prompt: 'x', max_tokens: 10, min_tokens: 5, logit_bias: { '151645': 100 } });
check('min_tokens 5', c.usage.completion_tokens === 6 && c.choices[0].finish_reason === 'stop', c);
cr = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], min_tokens: 3,
                                          logit_bias: { '151645': 100 } });
check('min_tokens 3 (chat)', cr.usage.completion_tokens === 4 && cr.choices[0].finish_reason === 'stop', cr);
// prompt logprobs: echo with logprobs, and vLLM's prompt_logprobs, whose most likely token at position i is what
// greedy decoding of the first i tokens makes
const P = [9707, 1879, 374, 264, 1273];
c = await client.completions.create({ model, prompt: P, max_tokens: 1, temperature: 0, echo: true, logprobs: 1,
                                      prompt_logprobs: 1 });
const elp = c.choices[0].logprobs, plp = c.choices[0].prompt_logprobs;
check('echo logprobs: the prompt first', elp.tokens.length === P.length + 1 && elp.token_logprobs[0] === null &&
      elp.top_logprobs[0] === null && c.choices[0].text.startsWith('Hello world'), elp);
check('prompt_logprobs shape', Array.isArray(plp) && plp.length === P.length && plp[0] === null, plp);
for (let i = 1; i < P.length && Array.isArray(plp); i++) {
  const mine = plp[i][String(P[i])];
  check(`prompt_logprobs[${i}]: the prompt token, as echo has it`, mine && mine.rank >= 1 &&
        mine.logprob === elp.token_logprobs[i], { entry: plp[i], echo: elp.token_logprobs[i] });
  const best = Object.values(plp[i]).find(e => e.rank === 1);
  const ref = await client.completions.create({ model, prompt: P.slice(0, i), max_tokens: 1, temperature: 0,
                                                logprobs: 0, ignore_eos: true });
  const rl = ref.choices[0].logprobs;
  check(`prompt_logprobs[${i}]: the most likely = greedy decoding`, best && best.decoded_token === rl.tokens[0] &&
        Math.abs(best.logprob - rl.token_logprobs[0]) < 1e-4, { best, greedy: rl });
}
cr = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 1,
                                          prompt_logprobs: 0 });
check('chat prompt_logprobs', cr.prompt_logprobs.length === cr.usage.prompt_tokens && cr.prompt_logprobs[0] === null,
      cr.prompt_logprobs);
await expectError('prompt_logprobs streamed', () => client.completions.create({ model, prompt: 'x', stream: true,
                  prompt_logprobs: 1 }), 400, OpenAI.BadRequestError);

// completions, streamed: the same greedy text, usage at the end
let text = '', chunks = 0, usage = null, finish = null;
for await (const ch of await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8,
    temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } })) {
  if (ch.usage) usage = ch.usage;
  for (const choice of ch.choices) { text += choice.text; chunks++; if (choice.finish_reason) finish = choice.finish_reason; }
}
check('streamed completion = greedy', text === greedy, { text, greedy });
check('streamed completion chunks', chunks === 8 && finish === 'length', { chunks, finish });
check('streamed completion usage', usage && usage.completion_tokens === 8 && usage.prompt_tokens > 0, usage);

// n and seed: choices 0 and 1 differ in seed; the same request again is the same
c = await client.completions.create({ model, prompt: [9707, 1879], max_tokens: 6, n: 2, seed: 5, ignore_eos: true });
const c2 = await client.completions.create({ model, prompt: [9707, 1879], max_tokens: 6, n: 2, seed: 5, ignore_eos: true });
check('n choices', c.choices.length === 2 && c.choices[1].index === 1, c.choices);
check('seeded n is reproducible', c.choices.map(x => x.text).join('|') === c2.choices.map(x => x.text).join('|'));

// stop: the text up to the stop string, finish_reason stop
const stop = greedy.length > 4 ? greedy.slice(2, 4) : null;
if (stop) {
  c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
                                        ignore_eos: true, stop: [stop] });
  check('stop string', c.choices[0].finish_reason === 'stop' && greedy.startsWith(c.choices[0].text) &&
        !c.choices[0].text.includes(stop), { text: c.choices[0].text, stop, greedy });
}

// chat, not streamed
const messages = [{ role: 'system', content: 'You are brief.' }, { role: 'user', content: 'Hello!' }];
let r = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true });
check('chat object', r.object === 'chat.completion' && r.choices[0].message.role === 'assistant', r);
check('chat usage', r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 6, r.usage);
check('chat logprobs', r.choices[0].logprobs.content.length === r.usage.completion_tokens, r.choices[0].logprobs);
const chatGreedy = r.choices[0].message.content;

// chat, streamed: the role first, then content, the same greedy text
let role = null, content = '';
usage = null;
finish = null;
const stream = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
for await (const ch of stream) {
  if (ch.usage) usage = ch.usage;
  for (const choice of ch.choices) {
    if (choice.delta.role) role = choice.delta.role;
    if (choice.delta.content) content += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
check('streamed chat role', role === 'assistant');
check('streamed chat = greedy', content === chatGreedy, { content, chatGreedy });
check('streamed chat finish', finish === 'length' || finish === 'stop', finish);
check('streamed chat usage', usage && usage.total_tokens === usage.prompt_tokens + usage.completion_tokens, usage);

// a stream the client abandons halfway (the server aborts it)
const s2 = await client.chat.completions.create({ model, messages, max_tokens: 400, ignore_eos: true, stream: true });
let got = 0;
for await (const ch of s2) { if (++got === 3) break; }
check('abandoned stream', got === 3);

// content parts, max_completion_tokens
r = await client.chat.completions.create({ model, max_completion_tokens: 3, ignore_eos: true,
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }, { type: 'text', text: ' there' }] }] });
check('content parts', r.usage.completion_tokens === 3, r.usage);

// top logprobs (chat: logprobs + top_logprobs; completions: logprobs = N), greedy: the first alternative is
// the chosen token with the same logprob, the list is sorted descending
function sortedDesc(xs) { return xs.every((x, i) => i === 0 || x <= xs[i - 1]); }
r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, ignore_eos: true,
                                          logprobs: true, top_logprobs: 5 });
const content5 = r.choices[0].logprobs.content;
check('chat top_logprobs shape', content5.length === 4 && content5.every(e => e.top_logprobs.length === 5 &&
      e.top_logprobs.every(t => typeof t.token === 'string' && typeof t.logprob === 'number' && t.logprob <= 0 &&
                                Array.isArray(t.bytes))), content5);
check('chat top_logprobs[0] = chosen (greedy)', content5.every(e => e.top_logprobs[0].token === e.token &&
      e.top_logprobs[0].logprob === e.logprob), content5);
check('chat top_logprobs sorted', content5.every(e => sortedDesc(e.top_logprobs.map(t => t.logprob))), content5);
let streamedTop = [];
for await (const ch of await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0,
    ignore_eos: true, stream: true, logprobs: true, top_logprobs: 5 })) {
  for (const choice of ch.choices) if (choice.logprobs) streamedTop.push(...choice.logprobs.content);
}
check('streamed chat top_logprobs = not streamed', JSON.stringify(streamedTop) === JSON.stringify(content5),
      { streamedTop, content5 });
c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, temperature: 0,
                                     ignore_eos: true, logprobs: 3 });
const clp = c.choices[0].logprobs;
check('completion top_logprobs shape', clp.top_logprobs.length === 4 && clp.tokens.length === 4 &&
      clp.top_logprobs.every(o => Object.keys(o).length >= 1 && Object.keys(o).length <= 4), clp);
// (a JS object reorders integer-like keys such as "1": compare by key, not by position)
check('completion top_logprobs: chosen is the most likely (greedy)', clp.top_logprobs.every((o, i) =>
      o[clp.tokens[i]] === clp.token_logprobs[i] && Math.max(...Object.values(o)) === clp.token_logprobs[i]), clp);
await expectError('top_logprobs 21', () => client.chat.completions.create({ model, messages, logprobs: true,
                  top_logprobs: 21 }), 400, OpenAI.BadRequestError);
await expectError('top_logprobs without logprobs', () => client.chat.completions.create({ model, messages,
                  top_logprobs: 2 }), 400, OpenAI.BadRequestError);

// the prefix cache: a prompt of 40 ids (two full pages of 16) sent twice finds its whole pages cached the
// second time (never its last token), streamed and not; with CACHE=off (--disable-prefix-caching) nothing is
const cacheOn = process.env.CACHE !== 'off';
const longPrompt = Array.from({ length: 40 }, (_, i) => 7000 + i);
c = await client.completions.create({ model, prompt: longPrompt, max_tokens: 2, ignore_eos: true });
check('cached_tokens on a first prompt', c.usage.prompt_tokens_details?.cached_tokens === 0, c.usage);
c = await client.completions.create({ model, prompt: longPrompt, max_tokens: 2, ignore_eos: true });
check('cached_tokens on a repeated prompt', c.usage.prompt_tokens_details?.cached_tokens === (cacheOn ? 32 : 0),
      c.usage);
usage = null;
for await (const ch of await client.completions.create({ model, prompt: longPrompt, max_tokens: 2, ignore_eos: true,
    stream: true, stream_options: { include_usage: true } })) if (ch.usage) usage = ch.usage;
check('streamed cached_tokens', usage?.prompt_tokens_details?.cached_tokens === (cacheOn ? 32 : 0), usage);
const longChat = [{ role: 'system', content: 'You answer in one short line, politely, and never mention the ' +
                   'weather, the time of day or anything else that changes.' }, { role: 'user', content: 'Hi!' }];
await client.chat.completions.create({ model, messages: longChat, max_tokens: 2 });
r = await client.chat.completions.create({ model, messages: longChat, max_tokens: 2 });
const chatCached = r.usage.prompt_tokens_details?.cached_tokens;
check('chat cached_tokens', cacheOn ? chatCached >= 16 && chatCached < r.usage.prompt_tokens : chatCached === 0,
      r.usage);
if (process.env.CACHE === 'off') {
  console.log(`${passes} passed, ${failures} failed`);
  process.exit(failures ? 1 : 0);
}

// structured output (docs/structured.md): a JSON schema through response_format, vLLM's
// structured_outputs (compact whitespace, n = 3, each choice its own matcher) and guided_* fields,
// streamed and not; a bad schema or two constraints is a 400 naming the field. The random model
// fills whatever whitespace is allowed, so the checks that need a complete output ask for compact JSON.
const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 6 },
  n: { type: 'integer', minimum: 1, maximum: 99 }, ok: { type: 'boolean' } }, required: ['name', 'n', 'ok'] };
const valid = (o) => Object.keys(o).join() === 'name,n,ok' && typeof o.name === 'string' &&
  [...o.name].length <= 6 && Number.isInteger(o.n) && o.n >= 1 && o.n <= 99 && typeof o.ok === 'boolean';
const parsed = (text) => { try { return JSON.parse(text); } catch { return null; } };
r = await client.chat.completions.create({ model, messages, max_tokens: 200, seed: 3, n: 3,
  structured_outputs: { json: schema, disable_any_whitespace: true } });
for (const ch of r.choices)
  check('structured_outputs json: valid', ch.finish_reason === 'stop' && valid(parsed(ch.message.content) ?? {}), ch);
const cs = await client.completions.create({ model, prompt: 'JSON:', max_tokens: 200, seed: 4,
  response_format: { type: 'json_schema', json_schema: { name: 'thing', schema, strict: true } },
  structured_outputs: { disable_any_whitespace: true } });
check('completions response_format json_schema: valid',
      cs.choices[0].finish_reason === 'stop' && valid(parsed(cs.choices[0].text) ?? {}), cs.choices[0]);
let enumText = '', enumFin = null;
for await (const ch of await client.chat.completions.create({ model, messages, max_tokens: 300, seed: 5, stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 'c', schema: { type: 'object',
      properties: { c: { enum: ['x', 'y'] } }, required: ['c'] } } } })) {
  for (const choice of ch.choices) {
    enumText += choice.delta.content ?? '';
    if (choice.finish_reason) enumFin = choice.finish_reason;
  }
}
const enumObj = enumFin === 'stop' ? parsed(enumText) : null;
check('streamed response_format json_schema (any whitespace)', enumFin === 'length' ||
      (enumObj && ['x', 'y'].includes(enumObj.c) && Object.keys(enumObj).length === 1), { enumText, enumFin });
r = await client.chat.completions.create({ model, messages, max_tokens: 8, seed: 6, guided_choice: ['yes', 'no way'] });
check('guided_choice', ['yes', 'no way'].includes(r.choices[0].message.content) &&
      r.choices[0].finish_reason === 'stop', r.choices[0]);
let regexText = '';
for await (const ch of await client.completions.create({ model, prompt: 'Code:', max_tokens: 16, seed: 7,
    stream: true, guided_regex: '[0-9]{3}-[a-z]{2}' })) regexText += ch.choices[0]?.text ?? '';
check('streamed guided_regex', /^[0-9]{3}-[a-z]{2}$/.test(regexText), regexText);
r = await client.chat.completions.create({ model, messages, max_tokens: 4, response_format: { type: 'text' } });
check('response_format text', typeof r.choices[0].message.content === 'string', r.choices[0]);
for (const [name, param, extra] of [
  ['unsupported keyword', 'response_format', { response_format: { type: 'json_schema', json_schema: { name: 'x',
    schema: { type: 'object', patternProperties: { a: {} } } } } }],
  ['bad regex', 'guided_regex', { guided_regex: '(a)\\1' }],
  ['two constraints', 'guided_json', { response_format: { type: 'json_object' }, guided_json: schema }],
  ['guided_whitespace_pattern', 'guided_whitespace_pattern', { guided_json: schema, guided_whitespace_pattern: ' *' }],
  ['unknown response_format type', 'response_format', { response_format: { type: 'xml' } }]]) {
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 4, ...extra });
    check(`structured ${name} refused`, false, 'no error');
  } catch (e) {
    check(`structured ${name} refused`, e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === param,
          { status: e.status, param: e.param, message: e.message });
    if (name === 'unsupported keyword') check('bad schema message', /patternProperties/.test(e.message), e.message);
  }
}

// errors through the client's classes
await expectError('bad request', () => client.completions.create({ model, prompt: 'x', temperature: -1 }), 400,
                  OpenAI.BadRequestError);
await expectError('unknown model', () => client.chat.completions.create({ model: 'nope', messages }), 404,
                  OpenAI.NotFoundError);
await expectError('tools without --enable-auto-tool-choice', () => client.chat.completions.create({ model,
                  messages: toolHistory, tools }), 400, OpenAI.BadRequestError);
r = await client.chat.completions.create({ model, messages: toolHistory, tools, tool_choice: 'none', max_tokens: 2 });
check('tool_choice none without the flags', r.choices[0].message.tool_calls === undefined &&
      !('reasoning_content' in r.choices[0].message), r.choices[0]);
const wrong = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
await expectError('wrong key', () => wrong.models.list(), 401, OpenAI.AuthenticationError);

console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);

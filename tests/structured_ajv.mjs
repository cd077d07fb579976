// Validates tests/test_structured_generate.c's outputs (structured_generations.json)
// against their schemas (tests/fixtures/structured/schemas.json) with ajv, a validator
// independent of replay's grammar compiler: every output must parse as JSON and be
// valid. An output ajv refuses only for a format that replay enforces by its own
// (looser) regex (docs/structured.md: a date's day is 01-31 whatever the month, a time
// may have second 60, a practical email) is counted as such and listed; anything else
// fails. Run by tests/cli_structured_ajv.sh: node structured_ajv.mjs AJV_DIR SCHEMAS GENERATIONS
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const [ajvDir, schemasPath, gensPath] = process.argv.slice(2);
const require = createRequire(join(resolve(ajvDir), 'package.json'));
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats').default;

const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
// replay's formats (src/structured/json_schema.c), for telling a format difference apart
const replayFormats = new Ajv2020({ strict: false });
addFormats(replayFormats);
const dateRe = '[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])';
const timeRe = '([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])';
replayFormats.addFormat('date', new RegExp(`^${dateRe}$`));
replayFormats.addFormat('time', new RegExp(`^${timeRe}$`));
replayFormats.addFormat('date-time', new RegExp(`^${dateRe}[Tt]${timeRe}$`));
replayFormats.addFormat('email', /^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)+$/);

const schemas = new Map(JSON.parse(readFileSync(schemasPath, 'utf8')).schemas.map((s) => [s.name, s.schema]));
const gens = JSON.parse(readFileSync(gensPath, 'utf8'));
const strict = new Map(), loose = new Map();
let valid = 0, formatOnly = 0, failed = 0;
const formatCases = [];
for (const g of gens) {
  const schema = schemas.get(g.schema);
  if (!schema) { console.log(`FAIL: no schema ${g.schema}`); failed++; continue; }
  if (!strict.has(g.schema)) {
    strict.set(g.schema, ajv.compile(schema));
    loose.set(g.schema, replayFormats.compile(schema));
  }
  let value;
  try { value = JSON.parse(g.text); } catch (e) {
    console.log(`FAIL: ${g.schema}: not JSON (${e.message}): ${g.text}`);
    failed++;
    continue;
  }
  const check = strict.get(g.schema);
  if (check(value)) { valid++; continue; }
  // the two validators differ only in those formats: valid by replay's, refused for a format
  if (loose.get(g.schema)(value)) {
    formatOnly++;
    formatCases.push(`${g.schema}: ${g.text}`);
    continue;
  }
  console.log(`FAIL: ${g.schema}: ${g.text}: ${ajv.errorsText(check.errors)}`);
  failed++;
}
console.log(`ajv: ${gens.length} generations over ${strict.size} schemas: ${valid} valid, ` +
  `${formatOnly} refused only for a format replay enforces more loosely, ${failed} failed`);
for (const c of formatCases.slice(0, 10)) console.log(`  format: ${c}`);
process.exit(failed || gens.length < 1000 ? 1 : 0);

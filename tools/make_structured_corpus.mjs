// Writes the structured-output schema corpus, tests/fixtures/structured/schemas.json:
// JSON schemas covering every keyword replay enforces (docs/structured.md), each with
// instances (hand-written ones, and variants made by mutating the valid ones: a
// required key dropped, a bound crossed, a wrong type, an extra property, a proper
// prefix, pretty-printed whitespace), each labelled by ajv (draft 2020-12, with
// ajv-formats), an independent validator. tests/test_structured_corpus.c checks that
// replay's matcher gives every instance ajv's label.
//
// Where replay's documented semantics differ from JSON Schema's (docs/structured.md:
// properties in schema order; no extra keys where `properties` is given and
// `additionalProperties` is absent; formats as replay's regexes), the instance goes to
// the schema's "differs" list with the reason and the verdict replay must give, which
// the test checks too; nothing is dropped silently.
//
// Run: node tools/make_structured_corpus.mjs [OUT]  (installs ajv into .cache/npm-ajv/ first
// if needed: npm install --prefix .cache/npm-ajv ajv@8.17.1 ajv-formats@3.0.1, or run
// tests/cli_structured_ajv.sh once). The C tests read the committed file and need no npm;
// tests/cli_structured_ajv.sh checks that the file is what this script writes.
import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(join(root, '.cache/npm-ajv/package.json'));
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats').default;
const ajvVersion = require('ajv/package.json').version;
const formatsVersion = require('ajv-formats/package.json').version;

// one for the schemas as written, one for replay's reading of them ($id may repeat)
const newAjv = () => {
  const a = new Ajv2020({ strict: false, allErrors: false });
  addFormats(a);
  return a;
};
const ajv = newAjv(), ajvAddl = newAjv(), ajvType = newAjv();

// ---- the schemas: [name, schema, valid instances, invalid instances, differs] ----
// differs: [value or {text}, reason, replay's verdict] for instances where replay's
// semantics knowingly differ from ajv's.
const S = [];
const add = (name, schema, valid, invalid = [], differs = []) => S.push({ name, schema, valid, invalid, differs });

// every type alone, and unions
add('type-null', { type: 'null' }, [null], [0, false, '', []]);
add('type-boolean', { type: 'boolean' }, [true, false], [null, 0, 'true']);
add('type-integer', { type: 'integer' }, [0, -7, 123456789], [1.5, '1', null]);
add('type-number', { type: 'number' }, [0, -1.25, 3e-7, 42], ['1', null, true]);
add('type-string', { type: 'string' }, ['', 'hello', 'tab\there "q" \\ é ✓'], [1, null, ['a']]);
add('type-array', { type: 'array' }, [[], [1, 'a', null, { b: [true] }]], [{}, 'x']);
add('type-object', { type: 'object' }, [{}, { a: 1, b: [null], c: { d: 'e' } }], [[], 'x', 1]);
add('type-any', {}, [null, 1, 'x', [1], { a: { b: [] } }], []);
add('union-string-null', { type: ['string', 'null'] }, ['x', null], [1, false]);
add('union-int-bool', { type: ['integer', 'boolean'] }, [3, true], [1.5, 'x', null]);
add('union-number-string-array', { type: ['number', 'string', 'array'] }, [1.5, 'x', [1]], [null, {}]);
add('union-object-null', { type: ['object', 'null'], properties: { a: { type: 'integer' } } }, [{ a: 1 }, null, {}],
    [1, { a: 'x' }]);
add('union-all-seven', { type: ['null', 'boolean', 'integer', 'number', 'string', 'array', 'object'] },
    [null, true, 1, 2.5, 's', [], {}], []);

// objects
add('obj-required', {
  type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' } }, required: ['name', 'age'],
}, [{ name: 'Ann', age: 30 }], [{ name: 'Ann' }, { age: 3 }]);
add('obj-optional', {
  type: 'object', properties: { a: { type: 'integer' }, b: { type: 'string' }, c: { type: 'boolean' } },
}, [{}, { a: 1 }, { b: 'x' }, { a: 1, c: true }, { a: 1, b: 'x', c: false }], [{ a: 'x' }]);
add('obj-mixed-required', {
  type: 'object', properties: { id: { type: 'integer' }, note: { type: 'string' }, tag: { type: 'string' } },
  required: ['id', 'tag'],
}, [{ id: 1, tag: 't' }, { id: 2, note: 'n', tag: 't' }], [{ id: 1 }, { note: 'n', tag: 't' }]);
add('obj-addl-false', {
  type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false,
}, [{ a: 1 }], [{ a: 1, b: 2 }, {}]);
add('obj-addl-true', {
  type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: true,
}, [{ a: 1 }, { a: 1, b: 2, c: 'x' }], [{ a: 'x' }]);
add('obj-addl-schema', {
  type: 'object', properties: { a: { type: 'integer' } }, additionalProperties: { type: 'string' },
}, [{ a: 1 }, { a: 1, x: 'y' }, { x: 'y', z: '' }], [{ a: 1, x: 2 }]);
add('obj-addl-only', { type: 'object', additionalProperties: { type: 'integer' } }, [{}, { x: 1, y: 2 }],
    [{ x: 'a' }, { x: 1.5 }]);
add('obj-addl-false-empty', { type: 'object', additionalProperties: false }, [{}], [{ a: 1 }]);
add('obj-required-not-declared', { type: 'object', required: ['x'] }, [{ x: 1 }, { x: { y: [] } }], [{}]);
add('obj-no-type', { properties: { a: { type: 'string' } }, required: ['a'] }, [{ a: 'x' }], [{ a: 1 }]);
add('obj-nested', {
  type: 'object', properties: {
    user: { type: 'object', properties: { name: { type: 'string' }, tags: { type: 'array', items: { type: 'string' } } },
      required: ['name'] },
    ok: { type: 'boolean' },
  }, required: ['user', 'ok'],
}, [{ user: { name: 'a' }, ok: true }, { user: { name: 'b', tags: ['x', 'y'] }, ok: false }],
[{ user: {}, ok: true }, { user: { name: 'a' }, ok: 1 }]);
add('obj-unicode-values', {
  type: 'object', properties: { text: { type: 'string' } }, required: ['text'],
}, [{ text: 'naïve café ✓ 𝄞' }, { text: 'line\nbreak' }], [{ text: 5 }]);
add('obj-many-props', {
  type: 'object',
  properties: Object.fromEntries('abcdefghij'.split('').map((k, i) => [k, { type: i % 2 ? 'string' : 'integer' }])),
  required: ['a', 'c', 'e', 'g', 'i'],
}, [{ a: 1, c: 2, e: 3, g: 4, i: 5 }, { a: 1, b: 'x', c: 2, d: 'y', e: 3, f: 'z', g: 4, h: 'w', i: 5, j: 'v' }],
[{ a: 1, c: 2, e: 3, g: 4 }]);

// enum and const
add('enum-strings', { enum: ['red', 'green', 'blue'] }, ['red', 'blue'], ['Red', 'yellow', 1]);
add('enum-mixed', { enum: [1, 'one', null, true, [1, 2], { a: 1 }] }, [1, 'one', null, true, [1, 2], { a: 1 }],
    [2, false, [2, 1], { a: 2 }]);
add('enum-typed', { type: 'string', enum: ['a', 'b', 1] }, ['a', 'b'], [1, 'c']);
add('const-string', { const: 'fixed' }, ['fixed'], ['Fixed', 'fixe']);
add('const-number', { const: 42 }, [42], [41, 43, '42']);
add('const-object', { const: { k: [1, 'x'], n: null } }, [{ k: [1, 'x'], n: null }], [{ k: [1, 'x'] }]);
add('obj-enum-props', {
  type: 'object', properties: { kind: { const: 'circle' }, size: { enum: ['s', 'm', 'l'] } }, required: ['kind', 'size'],
}, [{ kind: 'circle', size: 'm' }], [{ kind: 'square', size: 'm' }, { kind: 'circle', size: 'xl' }]);

// arrays
add('arr-items-int', { type: 'array', items: { type: 'integer' } }, [[], [1, 2, 3]], [[1, 'a'], [1.5]]);
add('arr-min', { type: 'array', items: { type: 'integer' }, minItems: 2 }, [[1, 2], [1, 2, 3, 4, 5, 6]], [[], [1]]);
add('arr-max', { type: 'array', items: { type: 'string' }, maxItems: 3 }, [[], ['a', 'b', 'c']], [['a', 'b', 'c', 'd']]);
add('arr-min-max', { type: 'array', items: { type: 'boolean' }, minItems: 1, maxItems: 2 }, [[true], [true, false]],
    [[], [true, true, true]]);
add('arr-exact', { type: 'array', items: { type: 'integer' }, minItems: 3, maxItems: 3 }, [[1, 2, 3]], [[1, 2], [1, 2, 3, 4]]);
add('arr-long-bounds', { type: 'array', items: { type: 'integer' }, minItems: 5, maxItems: 12 },
    [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]], [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]);
add('arr-of-objects', {
  type: 'array', items: { type: 'object', properties: { id: { type: 'integer' }, v: { type: 'string' } }, required: ['id'] },
  maxItems: 4,
}, [[], [{ id: 1 }, { id: 2, v: 'x' }]], [[{ v: 'x' }], [{ id: 'a' }]]);
add('arr-nested', { type: 'array', items: { type: 'array', items: { type: 'number' }, maxItems: 2 } },
    [[], [[], [1, 2.5]], [[0]]], [[[1, 2, 3]], [1]]);
add('arr-no-items', { type: 'array', maxItems: 2 }, [[], [null, { a: 1 }]], [[1, 2, 3]]);
add('tuple-prefix', { type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }] },
    [['a', 1], ['a'], [], ['a', 1, true, null]], [[1, 'a'], ['a', 'b']]);
add('tuple-closed', { type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }], items: false },
    [['a', 1], ['a'], []], [['a', 1, 2]]);
add('tuple-closed-min', {
  type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }, { type: 'boolean' }], items: false, minItems: 3,
}, [['a', 1, true]], [['a', 1], ['a', 1, true, false]]);
add('tuple-rest', { type: 'array', prefixItems: [{ const: 'head' }], items: { type: 'integer' } },
    [['head'], ['head', 1, 2]], [['tail'], ['head', 'x']]);
add('tuple-rest-max', { type: 'array', prefixItems: [{ type: 'integer' }], items: { type: 'string' }, maxItems: 3 },
    [[1], [1, 'a', 'b']], [[1, 'a', 'b', 'c'], ['a']]);

// strings
add('str-min', { type: 'string', minLength: 3 }, ['abc', 'abcdef', 'é✓𝄞'], ['', 'ab']);
add('str-max', { type: 'string', maxLength: 4 }, ['', 'abcd', '✓✓✓✓'], ['abcde']);
add('str-min-max', { type: 'string', minLength: 2, maxLength: 5 }, ['ab', 'abcde'], ['a', 'abcdef']);
add('str-exact', { type: 'string', minLength: 6, maxLength: 6 }, ['abcdef', 'a"b\\cd'], ['abcde', 'abcdefg']);
add('str-long', { type: 'string', minLength: 10, maxLength: 40 }, ['0123456789', 'x'.repeat(40)], ['x'.repeat(9), 'x'.repeat(41)]);
add('str-escapes-bounds', { type: 'string', maxLength: 3 }, ['\n\t"', '\u0001'], ['\n\n\n\n']);
add('pattern-anchored', { type: 'string', pattern: '^[a-z]+$' }, ['abc', 'z'], ['', 'aBc', 'ab1']);
add('pattern-digits', { type: 'string', pattern: '^[0-9]{3}-[0-9]{4}$' }, ['555-1234'], ['5551234', '55-1234', '555-12345']);
add('pattern-search', { type: 'string', pattern: 'ab+c' }, ['abc', 'xxabbbcyy'], ['ac', 'abx']);
add('pattern-prefix', { type: 'string', pattern: '^id_' }, ['id_', 'id_42 x'], ['xid_', 'ID_']);
add('pattern-suffix', { type: 'string', pattern: '\\.json$' }, ['a.json', '.json'], ['a.json5', 'ajson']);
add('pattern-alt', { type: 'string', pattern: '^(cat|dog)s?$' }, ['cat', 'dogs'], ['cats!', 'bird']);
add('pattern-class', { type: 'string', pattern: '^\\w+\\s\\d+$' }, ['abc 12', 'a_b 0'], ['abc12', 'abc  12']);
add('pattern-in-object', {
  type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]{2}[0-9]{2}$' } }, required: ['code'],
}, [{ code: 'AB12' }], [{ code: 'ab12' }, { code: 'AB123' }]);

// formats
add('format-date', { type: 'string', format: 'date' }, ['2024-02-29', '1999-12-31', '2000-01-01'],
    ['2024-13-01', '2024-1-01', '24-01-01', '2024-01-32'],
    [['2023-02-30', 'format date: replay checks a day of 01-31, not the month\'s length', true],
      ['2023-04-31', 'format date: replay checks a day of 01-31, not the month\'s length', true]]);
add('format-time', { type: 'string', format: 'time' }, ['12:34:56Z', '23:59:59.123+02:00', '00:00:00z'],
    ['24:00:00Z', '12:60:00Z', '1:02:03Z', '12:34:56'],
    [['12:34:60Z', 'format time: replay takes second 60 at any time, RFC 3339 only at the end of a UTC day', true]]);
add('format-date-time', { type: 'string', format: 'date-time' }, ['2024-05-06T07:08:09Z', '2024-05-06t07:08:09.5+01:30'],
    ['2024-05-06T07:08Z', '2024-05-06'],
    [['2024-05-06 07:08:09Z', 'format date-time: replay takes T or t between date and time, RFC 3339 also a space', false]]);
add('format-uuid', { type: 'string', format: 'uuid' }, ['123e4567-e89b-12d3-a456-426614174000', 'AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE'],
    ['123e4567e89b12d3a456426614174000', '123e4567-e89b-12d3-a456-42661417400', 'g23e4567-e89b-12d3-a456-426614174000']);
add('format-email', { type: 'string', format: 'email' }, ['a@b.co', 'first.last+tag@example.org'],
    ['a@b', '@b.co', 'a b@c.de', 'a@@b.co'],
    [['a..b@c.de', 'format email: replay\'s practical local@domain.tld allows dots anywhere in the local part', true],
      ['a@-b.co', 'format email: replay\'s domain labels may start or end with a hyphen', true]]);
add('format-ipv4', { type: 'string', format: 'ipv4' }, ['127.0.0.1', '255.255.255.255', '10.0.0.0'],
    ['256.0.0.1', '1.2.3', '01.2.3.4', '1.2.3.4.5']);
add('format-in-object', {
  type: 'object', properties: { id: { type: 'string', format: 'uuid' }, when: { type: 'string', format: 'date' },
    mail: { type: 'string', format: 'email' } }, required: ['id', 'when'],
}, [{ id: '00000000-0000-0000-0000-000000000000', when: '2020-02-02' },
  { id: '00000000-0000-0000-0000-000000000000', when: '2020-02-02', mail: 'x@y.zz' }],
[{ id: 'x', when: '2020-02-02' }, { id: '00000000-0000-0000-0000-000000000000', when: 'today' }]);

// integer and number bounds
const intRanges = [[0, 9], [0, 120], [1, 100], [-5, 5], [-100, -10], [10, 19], [7, 7], [0, 1000000], [-999, 999],
  [1900, 2100], [123, 4567], [-1, 0]];
for (const [lo, hi] of intRanges)
  add(`int-range-${lo}-${hi}`, { type: 'integer', minimum: lo, maximum: hi },
    [lo, hi, Math.floor((lo + hi) / 2)], [lo - 1, hi + 1, lo - 10, hi * 10 + 1 === hi ? hi + 2 : hi * 10 + 1]);
add('int-min-only', { type: 'integer', minimum: 18 }, [18, 19, 1000000], [17, 0, -18]);
add('int-max-only', { type: 'integer', maximum: -3 }, [-3, -4, -123456], [-2, 0, 5]);
add('int-exclusive', { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10 }, [1, 9], [0, 10, -1]);
add('int-exclusive-neg', { type: 'integer', exclusiveMinimum: -10, maximum: -1 }, [-9, -1], [-10, 0]);
add('num-range', { type: 'number', minimum: 0, maximum: 10 }, [0, 10, 5.5, 0.001, 9.999], [10.5, 11, -0.5]);
add('num-min-only', { type: 'number', minimum: 2 }, [2, 2.5, 100.25], [1.99, 0, -3]);
add('num-max-only', { type: 'number', minimum: 0, maximum: 100 }, [0, 99.9, 100], [100.1, 101]);
add('num-exclusive', { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1 }, [0.5, 0.001, 0.999], [0, 1, 1.5]);
add('int-in-object', {
  type: 'object', properties: { x: { type: 'integer', minimum: 0, maximum: 9 }, y: { type: 'integer', minimum: -9, maximum: 0 } },
  required: ['x', 'y'],
}, [{ x: 0, y: 0 }, { x: 9, y: -9 }], [{ x: 10, y: 0 }, { x: 0, y: 1 }]);

// anyOf, oneOf, allOf
add('anyof-types', { anyOf: [{ type: 'string', maxLength: 3 }, { type: 'integer', minimum: 0 }] }, ['abc', 5],
    ['abcd', -1, null]);
add('anyof-objects', {
  anyOf: [
    { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] },
    { type: 'object', properties: { b: { type: 'string' } }, required: ['b'] },
  ],
}, [{ a: 1 }, { b: 'x' }], [{ c: 1 }, { a: 'x' }, {}]);
add('anyof-siblings', { type: 'object', properties: { k: { type: 'string' } }, anyOf: [{ required: ['k'] }, {}] },
    [{ k: 'x' }, {}], [{ k: 1 }]);
add('anyof-null', { anyOf: [{ type: 'null' }, { type: 'array', items: { type: 'integer' }, maxItems: 2 }] },
    [null, [], [1, 2]], [[1, 2, 3], 0]);
add('oneof-types', { oneOf: [{ type: 'string' }, { type: 'integer' }, { type: 'null' }] }, ['x', 3, null], [1.5, true]);
add('oneof-tagged', {
  oneOf: [
    { type: 'object', properties: { kind: { const: 'a' }, x: { type: 'integer' } }, required: ['kind', 'x'] },
    { type: 'object', properties: { kind: { const: 'b' }, y: { type: 'string' } }, required: ['kind', 'y'] },
  ],
}, [{ kind: 'a', x: 1 }, { kind: 'b', y: 's' }], [{ kind: 'a', y: 's' }, { kind: 'c', x: 1 }]);
add('oneof-enums', { oneOf: [{ enum: ['x', 'y'] }, { enum: [1, 2] }] }, ['x', 2], ['z', 3]);
add('allof-merge', {
  allOf: [
    { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] },
    { properties: { b: { type: 'string' } }, required: ['b'] },
  ],
}, [{ a: 1, b: 'x' }], [{ a: 1 }, { b: 'x' }]);
add('allof-bounds', { allOf: [{ type: 'integer', minimum: 0 }, { maximum: 50 }, { minimum: 10 }] }, [10, 50, 25],
    [9, 51, 'x']);
add('allof-string', { allOf: [{ type: 'string' }, { minLength: 2 }, { maxLength: 4 }] }, ['ab', 'abcd'], ['a', 'abcde']);
add('allof-same-prop', {
  allOf: [
    { type: 'object', properties: { n: { type: 'integer', minimum: 0 } }, required: ['n'] },
    { type: 'object', properties: { n: { maximum: 5 } } },
  ],
}, [{ n: 0 }, { n: 5 }], [{ n: 6 }, { n: -1 }]);

// $ref and $defs, recursive ones
add('ref-simple', {
  $defs: { pos: { type: 'integer', minimum: 1 } }, type: 'object',
  properties: { a: { $ref: '#/$defs/pos' }, b: { $ref: '#/$defs/pos' } }, required: ['a', 'b'],
}, [{ a: 1, b: 99 }], [{ a: 0, b: 1 }]);
add('ref-definitions', {
  definitions: { name: { type: 'string', minLength: 1 } }, type: 'array', items: { $ref: '#/definitions/name' },
}, [[], ['a', 'bc']], [[''], [1]]);
add('ref-chain', {
  $defs: { a: { $ref: '#/$defs/b' }, b: { $ref: '#/$defs/c' }, c: { enum: ['x', 'y'] } }, $ref: '#/$defs/a',
}, ['x', 'y'], ['z']);
add('ref-root-recursive-list', {
  type: 'object', properties: { v: { type: 'integer' }, next: { anyOf: [{ $ref: '#' }, { type: 'null' }] } },
  required: ['v', 'next'],
}, [{ v: 1, next: null }, { v: 1, next: { v: 2, next: { v: 3, next: null } } }],
[{ v: 1 }, { v: 1, next: { v: 'x', next: null } }]);
add('ref-tree', {
  $defs: {
    node: { type: 'object', properties: { name: { type: 'string' }, children: { type: 'array', items: { $ref: '#/$defs/node' } } },
      required: ['name'] },
  },
  $ref: '#/$defs/node',
}, [{ name: 'r' }, { name: 'r', children: [{ name: 'a' }, { name: 'b', children: [{ name: 'c', children: [] }] }] }],
[{ name: 'r', children: [{}] }, { children: [] }]);
add('ref-json-value', {
  $defs: {
    value: { anyOf: [{ type: 'null' }, { type: 'boolean' }, { type: 'number' }, { type: 'string' },
      { type: 'array', items: { $ref: '#/$defs/value' } }, { type: 'object', additionalProperties: { $ref: '#/$defs/value' } }] },
  },
  $ref: '#/$defs/value',
}, [null, [1, { a: [true, 'x'] }], { a: { b: { c: [] } } }], []);
add('ref-expr', {
  $defs: {
    expr: { anyOf: [{ type: 'integer' }, {
      type: 'object', properties: { op: { enum: ['+', '*'] }, args: { type: 'array', items: { $ref: '#/$defs/expr' }, minItems: 2, maxItems: 2 } },
      required: ['op', 'args'] }] },
  },
  $ref: '#/$defs/expr',
}, [1, { op: '+', args: [1, { op: '*', args: [2, 3] }] }], [{ op: '-', args: [1, 2] }, { op: '+', args: [1] }, 'x']);
add('ref-mutual', {
  $defs: {
    a: { type: 'object', properties: { b: { $ref: '#/$defs/b' } } },
    b: { type: 'array', items: { $ref: '#/$defs/a' }, maxItems: 2 },
  },
  $ref: '#/$defs/a',
}, [{}, { b: [] }, { b: [{}, { b: [{}] }] }], [{ b: [1] }, { b: [{}, {}, {}] }]);
add('ref-filesystem', {
  $defs: {
    entry: { oneOf: [
      { type: 'object', properties: { type: { const: 'file' }, name: { type: 'string' }, size: { type: 'integer', minimum: 0 } },
        required: ['type', 'name', 'size'] },
      { type: 'object', properties: { type: { const: 'dir' }, name: { type: 'string' }, entries: { type: 'array', items: { $ref: '#/$defs/entry' } } },
        required: ['type', 'name', 'entries'] },
    ] },
  },
  $ref: '#/$defs/entry',
}, [{ type: 'file', name: 'a', size: 1 }, { type: 'dir', name: 'd', entries: [{ type: 'file', name: 'f', size: 0 }, { type: 'dir', name: 'e', entries: [] }] }],
[{ type: 'file', name: 'a' }, { type: 'dir', name: 'd', entries: [{ type: 'file', name: 'f', size: -1 }] }]);

// deep nesting
let deep = { type: 'integer', minimum: 0, maximum: 9 }, deepValue = 5;
for (let i = 0; i < 12; i++) {
  deep = i % 2 ? { type: 'array', items: deep, minItems: 1, maxItems: 1 }
               : { type: 'object', properties: { [`k${i}`]: deep }, required: [`k${i}`] };
  deepValue = i % 2 ? [deepValue] : { [`k${i}`]: deepValue };
}
add('deep-12', deep, [deepValue], []);
add('deep-arrays', { type: 'array', items: { type: 'array', items: { type: 'array', items: { type: 'array', items: { type: 'string', maxLength: 1 } } } } },
    [[], [[[['a']]]], [[[], [[]]]]], [[[[['ab']]]], [[[1]]]]);
add('deep-mixed', {
  type: 'object', properties: {
    a: { type: 'object', properties: {
      b: { type: 'array', items: { type: 'object', properties: {
        c: { type: 'object', properties: { d: { type: 'array', prefixItems: [{ type: 'boolean' }, { enum: ['x', 'y'] }], items: false } },
          required: ['d'] } }, required: ['c'] } } }, required: ['b'] } },
  required: ['a'],
}, [{ a: { b: [] } }, { a: { b: [{ c: { d: [true, 'x'] } }] } }], [{ a: { b: [{ c: { d: [true, 'z'] } }] } }, { a: {} }]);

// realistic ones
add('order-record', {
  type: 'object', properties: {
    id: { type: 'string', format: 'uuid' }, email: { type: 'string', format: 'email' }, placed: { type: 'string', format: 'date' },
    status: { enum: ['new', 'paid', 'shipped'] }, total: { type: 'integer', minimum: 0, maximum: 100000 },
    items: { type: 'array', minItems: 1, maxItems: 5, items: { type: 'object',
      properties: { sku: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{3}$' }, qty: { type: 'integer', minimum: 1, maximum: 99 } },
      required: ['sku', 'qty'] } },
    note: { type: ['string', 'null'], maxLength: 20 },
  },
  required: ['id', 'email', 'placed', 'status', 'total', 'items'],
}, [{ id: '123e4567-e89b-12d3-a456-426614174000', email: 'a@b.co', placed: '2024-01-02', status: 'paid', total: 1999,
  items: [{ sku: 'ABC-123', qty: 2 }] },
{ id: '123e4567-e89b-12d3-a456-426614174000', email: 'a@b.co', placed: '2024-01-02', status: 'new', total: 0,
  items: [{ sku: 'ABC-123', qty: 2 }, { sku: 'XYZ-999', qty: 99 }], note: null }],
[{ id: '123e4567-e89b-12d3-a456-426614174000', email: 'a@b.co', placed: '2024-01-02', status: 'lost', total: 1, items: [{ sku: 'ABC-123', qty: 2 }] }]);
add('tool-call', {
  type: 'object', properties: { name: { enum: ['get_weather', 'search'] },
    arguments: { type: 'object', properties: { city: { type: 'string', minLength: 1 }, unit: { enum: ['c', 'f'] } }, required: ['city'] } },
  required: ['name', 'arguments'], additionalProperties: false,
}, [{ name: 'search', arguments: { city: 'Oslo' } }, { name: 'get_weather', arguments: { city: 'Rome', unit: 'c' } }],
[{ name: 'search', arguments: { city: '' } }, { name: 'fly', arguments: { city: 'x' } }]);
add('annotations', {
  $schema: 'https://json-schema.org/draft/2020-12/schema', $id: 'https://example.com/a', title: 'T', description: 'D',
  $comment: 'c', type: 'object', properties: { a: { type: 'integer', default: 1, examples: [2], deprecated: false, readOnly: true } },
  required: ['a'],
}, [{ a: 3 }], [{ a: 'x' }]);
add('list-of-unions', { type: 'array', items: { type: ['integer', 'string', 'null'] }, maxItems: 6 },
    [[1, 'a', null], []], [[1.5], [true]]);
add('nullable-fields', {
  type: 'object', properties: { a: { type: ['integer', 'null'], minimum: 0, maximum: 3 }, b: { anyOf: [{ type: 'string', format: 'date' }, { type: 'null' }] } },
  required: ['a', 'b'],
}, [{ a: null, b: null }, { a: 3, b: '2020-01-01' }], [{ a: 4, b: null }, { a: null, b: 'x' }]);
add('matrix', { type: 'array', items: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 9 }, minItems: 2, maxItems: 2 }, minItems: 2, maxItems: 2 },
    [[[1, 2], [3, 4]]], [[[1, 2]], [[1, 2], [3, 10]]]);
add('key-escapes', {
  type: 'object', properties: { 'with space': { type: 'integer' }, 'dash-key': { type: 'string' }, 'ünï': { type: 'boolean' } },
  required: ['with space'],
}, [{ 'with space': 1 }, { 'with space': 1, 'dash-key': 'x', 'ünï': true }], [{ 'dash-key': 'x' }]);
add('semver', { type: 'string', pattern: '^[0-9]+\\.[0-9]+\\.[0-9]+(-[a-z0-9.]+)?$' }, ['1.2.3', '10.0.0-rc.1'], ['1.2', 'v1.2.3']);
add('hex-color', { type: 'string', pattern: '^#[0-9a-fA-F]{6}$' }, ['#00ff7F'], ['#00ff7', '00ff7f', '#00ff7fa']);
add('percent', { type: 'number', minimum: 0, maximum: 100 }, [0, 50.5, 100], [-1, 100.01]);
add('bool-or-const', { anyOf: [{ type: 'boolean' }, { const: 'auto' }] }, [true, 'auto'], ['Auto', 1]);
add('event-log', {
  type: 'object', properties: {
    events: { type: 'array', maxItems: 3, items: { type: 'object', properties: {
      at: { type: 'string', format: 'date-time' }, level: { enum: ['info', 'warn', 'error'] }, msg: { type: 'string', maxLength: 30 } },
      required: ['at', 'level', 'msg'], additionalProperties: false } },
  },
  required: ['events'],
}, [{ events: [] }, { events: [{ at: '2024-01-01T00:00:00Z', level: 'warn', msg: 'disk' }] }],
[{ events: [{ at: '2024-01-01', level: 'warn', msg: 'disk' }] }]);

// ---- instances ----------------------------------------------------------------------

// the variants of one value: at every node, its type's mutations
function mutate(v) {
  const out = [];
  const here = [];
  if (v === null) here.push(0, 'null');
  else if (typeof v === 'boolean') here.push(!v, null);
  else if (typeof v === 'number') {
    here.push(v + 1, v - 1, -v - 1, v * 10 + 3, v + 0.5, String(v));
  } else if (typeof v === 'string') here.push('', v + 'x', v + v + v, v.slice(1), 7);
  else if (Array.isArray(v)) {
    here.push({});
    if (v.length) here.push(v.slice(0, -1), [...v, v[v.length - 1]]);
    here.push([...v, null]);
    v.forEach((x, i) => { for (const m of mutate(x)) out.push(v.map((y, j) => (j === i ? m : y))); });
  } else {
    here.push([]);
    const keys = Object.keys(v);
    for (const k of keys) here.push(Object.fromEntries(keys.filter((x) => x !== k).map((x) => [x, v[x]])));
    here.push({ ...v, extra: 1 });
    for (const k of keys) for (const m of mutate(v[k])) out.push(Object.fromEntries(keys.map((x) => [x, x === k ? m : v[x]])));
  }
  return [...here, ...out];
}

// a deterministic pick of n of a list
function pick(list, n, seed) {
  const a = list.slice();
  let s = seed;
  for (let i = a.length - 1; i > 0; i--) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 1;
    const j = s % (i + 1);
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a.slice(0, n);
}

// Replay's reading of a schema, for ajv (docs/structured.md, JSON Schema):
// addl: additionalProperties false wherever an object schema has properties and no
// additionalProperties (for allOf, whose branches replay merges first,
// unevaluatedProperties false on the parent); type: a schema without type has the
// type its keywords imply.
const OBJ_KEYS = ['properties', 'required', 'additionalProperties'];
const ARR_KEYS = ['items', 'prefixItems', 'minItems', 'maxItems'];
const STR_KEYS = ['minLength', 'maxLength', 'pattern', 'format'];
const NUM_KEYS = ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum'];
function replaySchema(s, how, inAllOf = false) {
  if (Array.isArray(s)) return s.map((x) => replaySchema(x, how, inAllOf));
  if (!s || typeof s !== 'object') return s;
  const out = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === 'properties' || k === '$defs' || k === 'definitions')
      out[k] = Object.fromEntries(Object.entries(v).map(([n, x]) => [n, replaySchema(x, how)]));
    else if (k === 'const' || k === 'enum') out[k] = v;
    else if (k === 'allOf') out[k] = v.map((x) => replaySchema(x, how, true));
    else out[k] = replaySchema(v, how);
  }
  if (how === 'addl') {
    if (s.allOf && !s.additionalProperties && [s, ...s.allOf].some((x) => x.properties) &&
        !s.allOf.some((x) => 'additionalProperties' in x))
      out.unevaluatedProperties = false;
    else if (s.properties && !('additionalProperties' in s) && !inAllOf) out.additionalProperties = false;
  }
  if (how === 'type' && !('type' in s) && !s.$ref && !s.anyOf && !s.oneOf && !s.allOf && !('enum' in s) && !('const' in s)) {
    const has = (keys) => keys.some((k) => k in s);
    const types = [has(OBJ_KEYS) && 'object', has(ARR_KEYS) && 'array', has(STR_KEYS) && 'string',
      has(NUM_KEYS) && 'number'].filter(Boolean);
    if (types.length) out.type = types;
  }
  return out;
}
const REASONS = {
  addl: 'additionalProperties absent where properties is given: replay allows no other keys (docs/structured.md)',
  type: 'no type: replay takes the type the keywords imply (properties: an object), JSON Schema any type (docs/structured.md)',
};

// whether an enum or const anywhere in s holds an array or an object
function hasStructuredConst(s) {
  if (Array.isArray(s)) return s.some(hasStructuredConst);
  if (!s || typeof s !== 'object') return false;
  for (const [k, v] of Object.entries(s)) {
    if (k === 'const' && v && typeof v === 'object') return true;
    if (k === 'enum' && Array.isArray(v) && v.some((x) => x && typeof x === 'object')) return true;
    if (k !== 'const' && k !== 'enum' && hasStructuredConst(v)) return true;
  }
  return false;
}

const corpus = [];
let nValid = 0, nInvalid = 0, nDiffers = 0;
S.forEach((entry, si) => {
  const validate = ajv.compile(entry.schema);
  const readings = [['addl', ajvAddl.compile(replaySchema(entry.schema, 'addl'))],
    ['type', ajvType.compile(replaySchema(entry.schema, 'type'))]];
  const seen = new Set();
  const instances = [], differs = [];
  const label = (text, why) => {
    if (seen.has(text)) return;
    seen.add(text);
    let value, json = true;
    try { value = JSON.parse(text); } catch { json = false; }
    const ok = json && validate(value);
    const known = entry.differs.find(([x]) => JSON.stringify(x) === text);
    if (known) {
      differs.push({ text, ajv: ok, replay: known[2], reason: known[1] });
      return;
    }
    for (const [how, check] of readings)
      if (json && ok && !check(value)) {
        differs.push({ text, ajv: ok, replay: false, reason: REASONS[how] });
        return;
      }
    instances.push({ text, valid: ok, ...(why ? { note: why } : {}) });
  };
  for (const v of entry.valid) label(JSON.stringify(v), 'hand-written, valid');
  for (const v of entry.invalid) label(JSON.stringify(v), 'hand-written, invalid');
  for (const [v] of entry.differs) label(JSON.stringify(v));
  const variants = [];
  for (const v of entry.valid) for (const m of mutate(v)) variants.push(JSON.stringify(m));
  for (const t of pick([...new Set(variants)], 24, si + 1)) label(t, 'mutated');
  const structuredConst = hasStructuredConst(entry.schema);
  for (const v of entry.valid.slice(0, 2)) {
    const t = JSON.stringify(v), pretty = JSON.stringify(v, null, 2);
    if (structuredConst && pretty !== t && !seen.has(pretty)) {
      seen.add(pretty);
      differs.push({ text: pretty, ajv: validate(v), replay: false,
        reason: 'an enum or const value that is an array or object is matched as its compact JSON text (docs/structured.md)' });
    } else label(pretty, 'pretty-printed');
    if (t.length > 1) label(t.slice(0, -1), 'a proper prefix');
    const lead = ' ' + t;
    if (!seen.has(lead)) {
      seen.add(lead);
      differs.push({ text: lead, ajv: validate(v), replay: false,
        reason: 'whitespace before the value: JSON allows it, replay\'s output starts with the value (docs/structured.md, Whitespace)' });
    }
  }
  // properties in another order than the schema's: valid for ajv, not for replay
  const v0 = entry.valid.find((v) => v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length > 1);
  if (v0 && entry.schema.properties) {
    const t = JSON.stringify(Object.fromEntries(Object.entries(v0).reverse()));
    if (!seen.has(t)) {
      seen.add(t);
      const ok = validate(JSON.parse(t));
      if (ok) differs.push({ text: t, ajv: true, replay: false, reason: 'properties out of schema order: replay emits and accepts them in the order properties lists them (docs/structured.md, Known limits)' });
      else instances.push({ text: t, valid: false, note: 'properties reversed' });
    }
  }
  nValid += instances.filter((i) => i.valid).length;
  nInvalid += instances.filter((i) => !i.valid).length;
  nDiffers += differs.length;
  corpus.push({ name: entry.name, schema: entry.schema, instances, differs });
});

const out = {
  about: 'JSON schemas with instances labelled by ajv (tools/make_structured_corpus.mjs; do not edit by hand)',
  labelled_by: `ajv ${ajvVersion} (Ajv2020, strict false) with ajv-formats ${formatsVersion}`,
  schemas: corpus,
};
// the path to write: the fixture, or (tests/cli_structured_ajv.sh) the first argument
const path = process.argv[2] || join(root, 'tests/fixtures/structured/schemas.json');
// one line a schema and one an instance: small, and diffs read by instance
const J = JSON.stringify;
const list = (xs) => (xs.length ? `[\n${xs.map((x) => `    ${J(x)}`).join(',\n')}\n   ]` : '[]');
const text = `{"about": ${J(out.about)},\n "labelled_by": ${J(out.labelled_by)},\n "schemas": [\n` +
  out.schemas.map((c) => `  {"name": ${J(c.name)},\n   "schema": ${J(c.schema)},\n   "instances": ${list(c.instances)},\n` +
    `   "differs": ${list(c.differs)}}`).join(',\n') + '\n ]\n}\n';
if (J(JSON.parse(text)) !== J(out)) throw new Error('the corpus text does not read back');
writeFileSync(path, text);
console.log(`${corpus.length} schemas, ${nValid} valid and ${nInvalid} invalid instances, ${nDiffers} where replay differs: ${path}`);

/* The Jinja2 subset interpreter (src/template) against jinja2's semantics
 * with transformers' settings: every construct, whitespace control and
 * trim_blocks/lstrip_blocks, Python's printing of values, tojson exactly as
 * json.dumps, errors with the template's line, and the limits. Expectations
 * are written from jinja2's and Python's documented behaviour.
 *
 * Then the real templates: every model template fetched into
 * .cache/tokenizers compiles; Qwen3's and Llama 3's render the conversations
 * of tests/fixtures/tokenizer/chat.json exactly as transformers did; and
 * every fixture file under tests/fixtures/templates/rendered/ (written by
 * tools/make_template_fixtures.py with jinja2 and transformers) renders
 * byte for byte. A new fixture file is picked up without code changes. */
#include <dirent.h>
#include <jansson.h>
#include <time.h>

#include "template/template.h"
#include "test_util.h"

/* Renders src with vars (JSON text, or NULL for none); returns the status
 * and the text or the error message in *out (malloc'd). */
static int render(const char *src, const char *vars_json, char **out) {
    rp_err err = {0};
    rp_template *t = rp_template_compile(src, strlen(src), &err);
    if (!t) {
        *out = strdup(err.msg);
        return -100; /* a compile error */
    }
    json_t *vars = NULL;
    if (vars_json) {
        json_error_t je;
        vars = json_loads(vars_json, 0, &je);
        if (!vars) fail_msg("bad test vars %s: %s", vars_json, je.text);
    }
    char *text = NULL;
    size_t len;
    int rc = rp_template_render(t, vars, 0, &text, &len, &err);
    json_decref(vars);
    rp_template_free(t);
    *out = rc == 0 ? text : strdup(err.msg);
    return rc;
}

typedef struct ok_case {
    const char *src, *vars, *want;
} ok_case;

static void run_ok(const ok_case *cases, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        char *out;
        int rc = render(cases[i].src, cases[i].vars, &out);
        if (rc != 0 || strcmp(out, cases[i].want)) {
            fprintf(stderr, "case %zu: %s\n  vars: %s\n  want: [%s]\n  got (rc %d): [%s]\n", i, cases[i].src,
                    cases[i].vars ? cases[i].vars : "-", cases[i].want, rc, out);
            bad++;
        }
        free(out);
    }
    assert_int_equal(bad, 0);
}

static void test_expressions(void **state) {
    (void)state;
    static const ok_case cases[] = {
        {"Hello {{ name }}!", "{\"name\": \"W\"}", "Hello W!"},
        {"[{{ missing }}]", NULL, "[]"},
        {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }}", NULL, "7 9 5"},
        {"{{ 7 / 2 }} {{ 6 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }}", NULL, "3.5 3.0 3 -4 2 -2"},
        {"{{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ 2 ** -1 }}", NULL, "1024 64 0.5"},
        {"{{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ -1.5 % 1 }}", NULL, "3.0 1.5 0.5"},
        {"{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 100.0 * 3 }} {{ 1e16 }} {{ 123456789012345.0 }}", NULL,
         "1.0 0.30000000000000004 1e+20 1.5e-07 300.0 1e+16 123456789012345.0"},
        {"{{ 0.0001 }} {{ 0.00001 }} {{ -2.5 }} {{ 1_000 }} {{ 0x1F }} {{ 3 + 0.5 }} {{ true + 1 }}", NULL,
         "0.0001 1e-05 -2.5 1000 31 3.5 2"},
        {"{{ 'a' ~ 1 ~ none ~ true ~ 2.0 ~ x }}", NULL, "a1NoneTrue2.0"},
        {"{{ [1, 'a', none, true, 1.5] }}", NULL, "[1, 'a', None, True, 1.5]"},
        {"{{ {'a': 1, 'b': [2, {'c': none}]} }}", NULL, "{'a': 1, 'b': [2, {'c': None}]}"},
        {"{{ (1, 2) }} {{ (1,) }} {{ () }}", NULL, "(1, 2) (1,) ()"},
        {"{{ [\"it's\", 'a\"b', 'x\\ny', 'tab\\t', 'b\\\\s', 'é'] }}", NULL,
         "[\"it's\", 'a\"b', 'x\\ny', 'tab\\t', 'b\\\\s', 'é']"},
        {"{{ msgs }}", "{\"msgs\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "[{'role': 'user', 'content': 'hi'}]"},
        {"{{ none }} {{ true }} {{ False }} {{ None }}", NULL, "None True False None"},
        {"{{ 'a' 'b' }} {{ \"q\\\"\" }} {{ '\\u00e9\\x41\\101' }} {{ '\\d' }}", NULL, "ab q\" éAA \\d"},
        {"{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][5:] }}", NULL,
         "el olleh [3, 4] [1, 3] []"},
        {"{{ 'héllo'[1] }} {{ 'abc'[-1] }} {{ 'héllo'[1:3] }} {{ [1,2,3,4,5][4:0:-2] }} {{ [1,2,3][:-1] }}", NULL,
         "é c él [5, 3] [1, 2]"},
        {"{{ m[::-1] }}", "{\"m\": [1, 2, 3]}", "[3, 2, 1]"},
        {"{{ 'y' if x else 'n' }}|{{ 'y' if x }}|{{ 'a' if 0 else 'b' if 1 else 'c' }}", "{\"x\": 0}", "n||b"},
        {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}",
         NULL, "True False True True True True"},
        {"{{ 'ab' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 'a' }} {{ none == none }} {{ x == none }}", NULL,
         "True True True True False"},
        {"{{ 0 or 'x' }} {{ 1 and [] }} {{ not none }} {{ not 0 and 2 }} {{ '' or 0 or none }}", NULL,
         "x [] True 2 None"},
        {"{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ l[0] }} {{ l[-1] }} {{ l.1 }}|{{ l[9] }}|{{ d.zz }}|",
         "{\"d\": {\"a\": 1, \"b\": {\"c\": \"deep\"}}, \"l\": [\"x\", \"y\"]}", "1 1 deep deep x y y|||"},
        {"{{ d['items'] }} {{ d.items is callable }}", "{\"d\": {\"items\": 5}}", "5 True"},
        {"{{ -3 | abs }} {{ - 2 + 5 }} {{ -(2 + 5) }} {{ +3 }}", NULL, "3 3 -7 3"},
        {"{{ 'x' * 3 }} {{ 2 * 'ab' }} {{ [0] * 2 }} {{ [1, 2] + [3] }} {{ 'a' + 'b' }}", NULL, "xxx abab [0, 0] [1, 2, 3] ab"},
        {"{{ x is defined }},{{ y is undefined }},{{ none is none }},{{ 'a' is string }},{{ 1 is number }},"
         "{{ true is number }},{{ true is integer }},{{ 1.0 is float }},{{ {} is mapping }},{{ [] is iterable }},"
         "{{ 'x' is sequence }},{{ false is boolean }},{{ true is true }},{{ 0 is false }},{{ 3 is odd }},"
         "{{ 4 is even }},{{ 9 is divisibleby 3 }},{{ 1 is not none }},{{ 2 is integer }},{{ 1 is boolean }}",
         "{\"x\": 1}",
         "True,True,True,True,True,True,False,True,True,True,True,True,True,False,True,True,True,True,True,False"},
        {"{{ 1 is eq 1 }} {{ 'a' is equalto 'b' }} {{ 3 is gt 2 }} {{ 'a' is in ['a'] }} {{ x is not defined }}", NULL,
         "True False True True True"},
        {"{{ not x is defined }} {{ x is defined or 1 }}", NULL, "True 1"},
        {"{{ range(3) }} {{ range(1, 7, 2) }} {{ range(3, 0, -1) }}", NULL, "[0, 1, 2] [1, 3, 5] [3, 2, 1]"},
        {"{{ dict(a=1) }} {{ namespace(a=1).a }}", NULL, "{'a': 1} 1"},
        {"{{ strftime_now('%Y-%m-%d') }}", NULL, "1970-01-01"},
        {"{{ {1: 'a', true: 'b'} }}", NULL, "{1: 'b'}"},
        {"{{ x if x is defined else 'dflt' }}", "{\"x\": \"\"}", ""},
    };
    run_ok(cases, sizeof cases / sizeof cases[0]);
}

static void test_filters_and_methods(void **state) {
    (void)state;
    #define ITEMS "{\"items\": [{\"n\": \"a\", \"t\": 1}, {\"n\": \"b\"}, {\"n\": \"c\", \"t\": 0}]}"
    static const ok_case cases[] = {
        {"[{{ '  a b \\n' | trim }}] [{{ 'xxaxx' | trim('x') }}]", NULL, "[a b] [a]"},
        {"{{ [1,2,3] | length }},{{ 'héllo' | length }},{{ {'a':1} | count }},{{ x | length }}", NULL, "3,5,1,0"},
        {"{{ 'Hello' | upper }} {{ 'Hello' | lower }} {{ 'hello world-wide (x' | title }} {{ 'hELLO wORLD' | capitalize }}",
         NULL, "HELLO hello Hello World-Wide (X Hello world"},
        {"{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ ''.split() }}", NULL,
         "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] []"},
        {"{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.startswith('b') }}", NULL,
         "True True False"},
        {"[{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'xay'.lstrip('x') }}|{{ 'xay'.rstrip('y') }}|{{ '  a '.lstrip() }}|{{ ' a '.strip() }}]",
         NULL, "[x|ay|xa|a |a]"},
        {"{{ 'aaa' | replace('a', 'b', 2) }} {{ 'hello'.replace('l', 'L') }} {{ 'ab'.replace('', '-') }}", NULL,
         "bba heLLo -a-b-"},
        {"{{ 'A b'.upper() }} {{ 'A b'.lower() }} {{ 'hello world'.title() }} {{ 'abc'.find('c') }} {{ 'aXbX'.count('X') }}",
         NULL, "A B a b Hello World 2 2"},
        {"{{ '-'.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }}", NULL, "a-b ['a', 'b', 'c']"},
        {"{{ items | selectattr('t', 'defined') | map(attribute='n') | join(',') }}", ITEMS, "a,c"},
        {"{{ items | rejectattr('t') | map(attribute='n') | list }}", ITEMS, "['b', 'c']"},
        {"{{ (items | selectattr('t', 'equalto', 1) | first).n }} {{ items | map(attribute='t', default=9) | list }}",
         ITEMS, "a [1, 9, 0]"},
        {"{{ items | selectattr('t') | list | length }} {{ [1, 0, 2] | select | list }} {{ [1, 2, 3] | reject('odd') | list }}",
         ITEMS, "1 [1, 2] [2]"},
        {"{{ [3,1,2] | first }}{{ [3,1,2] | last }}{{ 'xyz' | first }}{{ [] | first }}", NULL, "32x"},
        {"{{ x | default('d') }} {{ '' | default('e', true) }} {{ '' | d('f') }}| {{ none | default('n') }}", NULL,
         "d e | None"},
        {"{{ 5 | string ~ 'x' }} {{ '42' | int + 1 }} {{ '3.5' | float }} {{ 'x' | int }} {{ 3.9 | int }} {{ ' 7 ' | int }}",
         NULL, "5x 43 3.5 0 3 7"},
        {"{{ '4.7' | int }} {{ 'x' | float }} {{ 2 | float }} {{ true | int }}", NULL, "4 0.0 2.0 1"},
        {"{{ 'ab' | list }} {{ {'k': 1} | list }}", NULL, "['a', 'b'] ['k']"},
        {"{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 5 | round }} {{ 2.1 | round(0, 'ceil') }}", NULL,
         "2.0 4.0 2.67 5 3.0"},
        {"{{ [1, 2, 1, 'A', 'a'] | unique | list }}", NULL, "[1, 2, 'A']"},
        {"{{ {'b': 1, 'a': 2} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value') }}", NULL,
         "[('a', 2), ('b', 1)] [('b', 1), ('a', 2)]"},
        {"{{ {'a': 1}.items() | list }} {{ d.get('x', 'no') }} {{ d.get('a') }} {{ d.get('zz') }}", "{\"d\": {\"a\": 1}}",
         "[('a', 1)] no 1 None"},
        {"{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{% endfor %}",
         "{\"d\": {\"a\": 1, \"b\": 2}}", "a=1;b=2;ab"},
        {"{{ d.keys() | list }} {{ d.values() | list }} {{ x | items | list }}", "{\"d\": {\"a\": 1, \"b\": 2}}",
         "['a', 'b'] [1, 2] []"},
        {"{{ 'a<b&\"' | e }} {{ '<' | safe }} {{ 5 | safe }}", NULL, "a&lt;b&amp;&#34; < 5"},
        {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(1, blank=true) }}", NULL,
         "a\n  b\n\n  c|  a\n  b|a\n \n b"},
        {"{{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ items | sort(attribute='n', reverse=true) | map(attribute='n') | join }}",
         ITEMS, "['A', 'b', 'c'] [3, 2, 1] cba"},
        {"{{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }} {{ [1, 2, 3] | sum }}",
         NULL, "[3, 2, 1] cba 13 6"},
        {"{{ ['a', 'b'] | map('upper') | join }} {{ [' a', 'b '] | map('trim') | list }}", NULL, "AB ['a', 'b']"},
        {"{{ [1, 2] | join(', ') }} {{ items | join('-', attribute='n') }}", ITEMS, "1, 2 a-b-c"},
    };
    run_ok(cases, sizeof cases / sizeof cases[0]);
}

static void test_tojson(void **state) {
    (void)state;
    static const ok_case cases[] = {
        {"{{ d | tojson }}", "{\"d\": {\"a\": [1, 2.5, \"é\\\"\\n\", null, true], \"b\": {}, \"c\": []}}",
         "{\"a\": [1, 2.5, \"é\\\"\\n\", null, true], \"b\": {}, \"c\": []}"},
        {"{{ d | tojson(indent=2) }}", "{\"d\": {\"a\": [1, {\"x\": []}], \"b\": \"c\"}}",
         "{\n  \"a\": [\n    1,\n    {\n      \"x\": []\n    }\n  ],\n  \"b\": \"c\"\n}"},
        {"{{ 'a' | tojson }} {{ 1.0 | tojson }} {{ 1e-5 | tojson }} {{ none | tojson }} {{ 3 | tojson }} {{ false | tojson }}",
         NULL, "\"a\" 1.0 1e-05 null 3 false"},
        {"{{ 'é😀' | tojson(true) }} {{ 'é😀' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}", NULL,
         "\"\\u00e9\\ud83d\\ude00\" \"é😀\" \"\\u00e9\""},
        {"{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [1, {'a': 2}] | tojson(separators=(',', ':')) }}", NULL,
         "{\"a\": 2, \"b\": 1} [1,{\"a\":2}]"},
        {"{{ '\\x01\\x7f\\t\\b\\f\\r/' | tojson }}", NULL, "\"\\u0001\x7f\\t\\b\\f\\r/\""},
        {"{{ (1, 2) | tojson }} {{ {1: 'a', true: 'b', none: 'c', 2.5: 'd'} | tojson }}", NULL,
         "[1, 2] {\"1\": \"b\", \"null\": \"c\", \"2.5\": \"d\"}"},
        {"{{ [1] | tojson(indent='\\t') }} {{ [] | tojson(indent=2) }} {{ [1, [2]] | tojson(indent=0) }}", NULL,
         "[\n\t1\n] [] [\n1,\n[\n2\n]\n]"},
        {"{{ v | tojson }}", "{\"v\": [3.0, 1e16, -0.0, 123.456, 1.7976931348623157e308, 5e-324, 0.1]}",
         "[3.0, 1e+16, -0.0, 123.456, 1.7976931348623157e+308, 5e-324, 0.1]"},
        {"{{ t | tojson(indent=4) }}",
         "{\"t\": {\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"q\": {\"type\": \"string\"}}, \"required\": [\"q\"]}}}}",
         "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get\",\n        \"parameters\": {\n"
         "            \"type\": \"object\",\n            \"properties\": {\n                \"q\": {\n"
         "                    \"type\": \"string\"\n                }\n            },\n            \"required\": [\n"
         "                \"q\"\n            ]\n        }\n    }\n}"},
        {"{{ {'k': 'v'} | tojson(separators=(',', ': '), indent=1) }}", NULL, "{\n \"k\": \"v\"\n}"},
    };
    run_ok(cases, sizeof cases / sizeof cases[0]);
}

static void test_statements(void **state) {
    (void)state;
    static const ok_case cases[] = {
        {"{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
         "{{ loop.last }}{{ loop.length }}|{% endfor %}",
         NULL, "103TrueFalse3|212FalseFalse3|321FalseTrue3|"},
        {"{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", NULL, "-2,1-3,2-,"},
        {"{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", NULL, "1,3,5,7,9"},
        {"{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [0] if x %}x{% else %}none{% endfor %}", NULL,
         "emptynone"},
        {"{% set c = 0 %}{% for x in [1,2] %}{% set c = c + x %}{{ c }}{% endfor %}{{ c }}", NULL, "120"},
        {"{% set ns = namespace(c=0, s='') %}{% for x in [1,2] %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }}", NULL, "3"},
        {"{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
         NULL, "013"},
        {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c }}", NULL, "12(3, 4)"},
        {"{% set x %}hi {{ 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}", NULL, "[hi 1]ABC"},
        {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet() }}",
         NULL, "Hi a! Hi b? Hi !"},
        {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}", NULL,
         "<b>bold</b>"},
        {"{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1,2]) %}[{{ item }}]{% endcall %}",
         NULL, "[1][2]"},
        {"{% filter upper %}abc{{ 'd' }}{% endfilter %}", NULL, "ABCD"},
        {"{% raw %}{{ x }}{% if %}{% endraw %}", NULL, "{{ x }}{% if %}"},
        {"a{# c {{ x }} #}b", NULL, "ab"},
        {"{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}many{% endif %}", "{\"x\": 2}", "two"},
        {"{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", "{\"x\": 5}", "many"},
        {"{% generation %}g{% endgeneration %}", NULL, "g"},
        {"{% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{% endfor %}", NULL, "aba"},
        {"{% for a in [1,2] %}{% set outer = loop %}{% for b in [1] %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}",
         NULL, "1121"},
        {"{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{% for c in 'ab' %}{{ c }}.{% endfor %}", NULL, "xya.b."},
        {"{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", NULL, "G"},
        {"{% if true %}{% set inner = 1 %}{% endif %}{{ inner }}", NULL, "1"},
        {"{% for m in msgs %}{{ m.role }}:{{ m.content }};{% endfor %}",
         "{\"msgs\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
         "user:hi;assistant:yo;"},
        {"{% set ns = namespace(items=[]) %}{% set ns.items = ns.items + [1] %}{{ ns.items }}", NULL, "[1]"},
        {"{{ bos_token }}{% if add_generation_prompt %}<gen>{% endif %}", "{\"bos_token\": \"<s>\", \"add_generation_prompt\": true}",
         "<s><gen>"},
        {"{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}", NULL, "321"},
    };
    run_ok(cases, sizeof cases / sizeof cases[0]);
}

static void test_whitespace(void **state) {
    (void)state;
    static const ok_case cases[] = {
        {"{% if true %}\nyes\n{% endif %}\nno", NULL, "yes\nno"},
        {"  {% if true %}x{% endif %}", NULL, "x"},
        {"a\n    {% if true %}\n    b\n    {% endif %}\nc", NULL, "a\n    b\nc"},
        {"{{ 'x' }}\ny", NULL, "x\ny"},
        {"  {{ 'x' }}", NULL, "  x"},
        {"a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc"},
        {"a\n{{- 'b' -}}\nc", NULL, "abc"},
        {"x {# c #}\ny", NULL, "x y"},
        {"{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}", NULL, "  1\n  2\n"},
        {"a\n", NULL, "a"},
        {"a\n\n", NULL, "a\n"},
        {"{% if true %}  \nx{% endif %}", NULL, "  \nx"},
        {"  {%+ if true %}x{% endif %}", NULL, "  x"},
        {"a\r\nb\rc", NULL, "a\nb\nc"},
        {"{% for i in [1,2] -%}\n  {{ i }}\n{%- endfor %}", NULL, "12"},
        {"x\n  {# comment #}\ny", NULL, "x\ny"},
        {"{{ 'a' }}  {% if true %}b{% endif %}", NULL, "a  b"},
        {"\t{% set x = 1 %}\n{{ x }}", NULL, "1"},
        {"{%- if true %}\n\n{% endif -%}\n\nz", NULL, "\nz"},
        {"{{ {'a': {'b': 1}}['a'] }}", NULL, "{'b': 1}"},
        {"{% raw -%}   x   {%- endraw %}\ny", NULL, "xy"},
        {"{% raw %}\na\n   {% endraw %}b", NULL, "\na\nb"},
    };
    run_ok(cases, sizeof cases / sizeof cases[0]);
}

typedef struct err_case {
    const char *src, *vars;
    int rc;          /* -100 compile error, RP_ERR, RP_TEMPLATE_RAISED */
    const char *has; /* the message contains this */
} err_case;

static void test_errors(void **state) {
    (void)state;
    char deep[2100];
    int n = snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 1000; i++) deep[n++] = ')';
    snprintf(deep + n, sizeof deep - (size_t)n, " }}");
    const err_case cases[] = {
        {"{% if x %}", NULL, -100, "line 1"},
        {"a\n{{ x | nosuch }}", NULL, -100, "line 2: no filter 'nosuch'"},
        {"\n\n{{ x | wordwrap }}", NULL, -100, "line 3: replay does not support the filter 'wordwrap'"},
        {"{{ x is nosuch }}", NULL, -100, "no test named 'nosuch'"},
        {"{% include 'x' %}", NULL, -100, "'{% include %}' is not supported"},
        {"{% extends 'x' %}", NULL, -100, "extends"},
        {"{% do x %}", NULL, -100, "'{% do %}' is not supported"},
        {"x\n{% for a in b %}\n{% endif %}", NULL, -100, "line 3: unexpected 'endif'"},
        {"{% endfor %}", NULL, -100, "unexpected 'endfor'"},
        {"{{ x", NULL, -100, "not closed"},
        {"{{ 'abc }}", NULL, -100, "unterminated string"},
        {"{% break %}", NULL, -100, "outside a for loop"},
        {"{{ f(*args) }}", NULL, -100, "not supported"},
        {"{% for x in y recursive %}{% endfor %}", NULL, -100, "recursive"},
        {"{{ 1 + }}", NULL, -100, "expected an expression"},
        {"{% if x %}{% else %}{% else %}{% endif %}", NULL, -100, "unexpected 'else'"},
        {deep, NULL, -100, "nested more than"},
        {"\xff", NULL, -100, "UTF-8"},
        {"a\n{{ x.y }}", NULL, RP_ERR, "line 2: 'x' is undefined"},
        {"{{ d.a.b }}", "{\"d\": {}}", RP_ERR, "'dict object' has no attribute 'a'"},
        {"{{ raise_exception('bad role: ' ~ r) }}", "{\"r\": \"x\"}", RP_TEMPLATE_RAISED, "bad role: x"},
        {"{{ [1].append(2) }}", NULL, RP_ERR, "access to attribute 'append' of 'list' object is unsafe."},
        {"{% set d = {} %}{{ d.update({'a': 1}) }}", NULL, RP_ERR, "unsafe"},
        {"{% for x in range(200000) %}{% endfor %}", NULL, RP_ERR, "Range too big"},
        {"{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, RP_ERR, "nested more than 64"},
        {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, RP_ERR,
         "larger than"},
        {"{{ 1 / 0 }}", NULL, RP_ERR, "division by zero"},
        {"{{ 1 + 'a' }}", NULL, RP_ERR, "unsupported operand"},
        {"{{ 'a' + 1 }}", NULL, RP_ERR, "can only concatenate str"},
        {"{{ x | tojson }}", NULL, RP_ERR, "Object of type Undefined is not JSON serializable"},
        {"{{ x + 1 }}", NULL, RP_ERR, "'x' is undefined"},
        {"{{ x.startswith('a') }}", NULL, RP_ERR, "'x' is undefined"},
        {"{{ 'a'.format(1) }}", NULL, RP_ERR, "format"},
        {"{{ none.x }}", NULL, RP_OK, ""},
        {"{{ 5() }}", NULL, RP_ERR, "not callable"},
        {"{% set a, b = [1] %}", NULL, RP_ERR, "not enough values to unpack"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, RP_ERR, "more than"},
        {"{{ 9223372036854775807 + 1 }}", NULL, RP_ERR, "integer overflow"},
        {"{{ 1 < 'a' }}", NULL, RP_ERR, "not supported between"},
        {"{% set ns = namespace() %}{{ ns.x }}{% set x = 1 %}{% set x.y = 2 %}", NULL, RP_ERR, "non-namespace"},
        {"{{ messages[0]['content'] }}", "{\"messages\": []}", RP_ERR, "'list object' has no element 0"},
        {"{{ messages[0]['content'] }}", "{}", RP_ERR, "'messages' is undefined"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = render(cases[i].src, cases[i].vars, &out);
        if (rc != cases[i].rc || !strstr(out, cases[i].has)) {
            fprintf(stderr, "error case %zu: %.80s\n  want rc %d with '%s'\n  got rc %d: %s\n", i, cases[i].src,
                    cases[i].rc, cases[i].has, rc, out);
            bad++;
        }
        free(out);
    }
    assert_int_equal(bad, 0);
}

/* ---- real templates ------------------------------------------------------ */

static char *real_template(const char *name, rp_template_source *src) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/%s", test_source_dir(), name);
    rp_err err = {0};
    if (rp_template_source_load(dir, 0, src, &err)) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    return src->source;
}

/* Every template that scripts/fetch-tokenizers.sh fetches compiles. */
static void test_real_templates_compile(void **state) {
    (void)state;
    static const char *const names[] = {"qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        rp_template_source src;
        real_template(names[i], &src);
        rp_err err = {0};
        rp_template *t = rp_template_compile(src.source, src.source_len, &err);
        if (!t) fail_msg("%s: %s", names[i], err.msg);
        rp_template_free(t);
        rp_template_source_free(&src);
    }
}

/* The conversations transformers rendered for tests/test_chat_template.c,
 * now through the interpreter with the models' own templates. */
static void test_real_templates_chat_fixtures(void **state) {
    (void)state;
    rp_template_source qs, ls;
    real_template("qwen3", &qs);
    real_template("llama3", &ls);
    rp_err err = {0};
    rp_template *qwen3 = rp_template_compile(qs.source, qs.source_len, &err);
    assert_non_null(qwen3);
    rp_template *llama3 = rp_template_compile(ls.source, ls.source_len, &err);
    assert_non_null(llama3);
    char path[4096];
    test_path(path, sizeof path, "tests/fixtures/tokenizer/chat.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) fail_msg("%s: %s", path, je.text);
    json_t *c;
    size_t i, bad = 0, n = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        int is_qwen = !strcmp(json_string_value(json_object_get(c, "tokenizer")), "qwen3");
        rp_template_source *s = is_qwen ? &qs : &ls;
        json_t *vars = json_object();
        json_object_set(vars, "messages", json_object_get(c, "messages"));
        json_object_set(vars, "add_generation_prompt", json_object_get(c, "add_generation_prompt"));
        json_object_set_new(vars, "bos_token", s->bos_token ? json_string(s->bos_token) : json_null());
        json_object_set_new(vars, "eos_token", s->eos_token ? json_string(s->eos_token) : json_null());
        json_object_set_new(vars, "tools", json_null());
        json_object_set_new(vars, "documents", json_null());
        json_t *et = json_object_get(c, "enable_thinking");
        if (et && !json_is_null(et)) json_object_set(vars, "enable_thinking", et);
        char *out;
        int rc = rp_template_render(is_qwen ? qwen3 : llama3, vars, -1, &out, NULL, &err);
        if (rc) fail_msg("case %zu: %s", i, err.msg);
        const char *want = json_string_value(json_object_get(c, "text"));
        if (strcmp(out, want) && bad++ < 3) fprintf(stderr, "case %zu differs:\n--- replay\n%s\n--- transformers\n%s\n", i, out, want);
        free(out);
        json_decref(vars);
        n++;
    }
    fprintf(stderr, "%zu chat.json conversations rendered, %zu mismatches\n", n, bad);
    assert_true(n > 100);
    assert_int_equal(bad, 0);
    json_decref(root);
    rp_template_free(qwen3);
    rp_template_free(llama3);
    rp_template_source_free(&qs);
    rp_template_source_free(&ls);
}

/* One fixture file of tools/make_template_fixtures.py: {"template": source,
 * "now_s": seconds, "cases": [{"vars": {...}, "text": "..."} or {"vars":
 * {...}, "error": "...", "raised": bool}]}. Returns the mismatches. */
static size_t check_fixture_file(const char *path, size_t *n_cases) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!root) fail_msg("%s: line %d: %s", path, je.line, je.text);
    const char *src = json_string_value(json_object_get(root, "template"));
    if (!src) fail_msg("%s: no \"template\"", path);
    rp_err err = {0};
    rp_template *t = rp_template_compile(src, json_string_length(json_object_get(root, "template")), &err);
    if (!t) fail_msg("%s: %s", path, err.msg);
    int64_t now_s = json_integer_value(json_object_get(root, "now_s"));
    size_t i, bad = 0;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        char *out = NULL;
        size_t len = 0;
        int rc = rp_template_render(t, json_object_get(c, "vars"), now_s, &out, &len, &err);
        json_t *want = json_object_get(c, "text");
        const char *why = NULL;
        if (want) {
            if (rc) why = err.msg;
            else if (len != json_string_length(want) || memcmp(out, json_string_value(want), len)) why = "text differs";
        } else {
            int raised = json_is_true(json_object_get(c, "raised"));
            const char *msg = json_string_value(json_object_get(c, "error"));
            if (rc == 0) why = "rendered, but jinja2 failed";
            else if (raised && (rc != RP_TEMPLATE_RAISED || strcmp(err.msg, msg ? msg : ""))) why = "not the same raise_exception";
            else if (!raised && rc == RP_TEMPLATE_RAISED) why = "raised, but jinja2 failed otherwise";
        }
        if (why && bad++ < 3) {
            fprintf(stderr, "%s case %zu: %s\n--- replay (rc %d)\n%s\n--- jinja2\n%s\n", path, i, why, rc,
                    rc ? err.msg : out, want ? json_string_value(want) : json_string_value(json_object_get(c, "error")));
        }
        free(out);
    }
    *n_cases = i;
    rp_template_free(t);
    json_decref(root);
    return bad;
}

static void test_fixture_files(void **state) {
    (void)state;
    char dir[4096];
    test_path(dir, sizeof dir, "tests/fixtures/templates/rendered");
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "NOTE: no template fixtures in %s yet: run tools/make_template_fixtures.py on a machine with "
                        "jinja2 and transformers (docs/templates.md) to compare with transformers byte for byte\n", dir);
        return;
    }
    struct dirent *e;
    size_t files = 0, total = 0, bad = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t n = 0, b = check_fixture_file(path, &n);
        fprintf(stderr, "%s: %zu cases, %zu mismatches\n", e->d_name, n, b);
        files++;
        total += n;
        bad += b;
    }
    closedir(d);
    fprintf(stderr, "%zu fixture files, %zu cases, %zu mismatches\n", files, total, bad);
    assert_int_equal(bad, 0);
}

/* The templates written for the fixtures (tests/fixtures/templates/NAME.jinja) compile. */
static void test_corpus_compiles(void **state) {
    (void)state;
    char dir[4096];
    test_path(dir, sizeof dir, "tests/fixtures/templates");
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        char *src = test_read_file(path, &len);
        rp_err err = {0};
        rp_template *t = rp_template_compile(src, len, &err);
        if (!t) fail_msg("%s: %s", e->d_name, err.msg);
        rp_template_free(t);
        free(src);
        n++;
    }
    closedir(d);
    assert_true(n >= 1);
}

/* Mutated templates (bytes deleted, duplicated or replaced by Jinja's
 * delimiters and operators) must compile or fail cleanly, and render or
 * fail cleanly: never crash, never hang (run under ASan too). */
static void test_mutations_never_crash(void **state) {
    (void)state;
    static const char *const names[] = {"qwen3", "deepseek_v3", "gemma3"};
    static const char *const pieces[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-", "(", ")", "[", "]", "'", "\"",
                                         "|", ".", ",", ":", "\\", " if ", " for ", "endfor", "endif", "~", "*",
                                         "loop.", "ns.", "range(9)", "\n", "é", "\xf0\x9f\x98\x80"};
    const char *vars_json =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi é\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\", "
        "\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"content\": \"r\"}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"add_generation_prompt\": true, "
        "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
    json_t *vars = json_loads(vars_json, 0, NULL);
    assert_non_null(vars);
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    int compiled = 0, rendered = 0, total = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        rp_template_source src;
        real_template(names[k], &src);
        for (int iter = 0; iter < 300; iter++) {
            char *m = malloc(src.source_len + 64);
            size_t n = src.source_len;
            memcpy(m, src.source, n);
            for (int edits = 1 + (int)(rng % 3); edits > 0; edits--) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                size_t at = (size_t)(rng >> 33) % (n + 1);
                int op = (int)((rng >> 20) % 3);
                const char *p = pieces[(rng >> 40) % (sizeof pieces / sizeof pieces[0])];
                size_t pl = strlen(p);
                if (op == 0 && at < n) { /* delete a few bytes */
                    size_t d = 1 + (rng >> 50) % 8;
                    if (d > n - at) d = n - at;
                    memmove(m + at, m + at + d, n - at - d);
                    n -= d;
                } else if (n + pl < src.source_len + 64) { /* insert a piece */
                    memmove(m + at + pl, m + at, n - at);
                    memcpy(m + at, p, pl);
                    n += pl;
                }
            }
            rp_err err = {0};
            rp_template *t = rp_template_compile(m, n, &err);
            total++;
            if (t) {
                compiled++;
                char *out = NULL;
                if (rp_template_render(t, vars, 0, &out, NULL, &err) == 0) rendered++;
                free(out);
                rp_template_free(t);
            } else {
                assert_true(strstr(err.msg, "chat template") == err.msg);
            }
            free(m);
        }
        rp_template_source_free(&src);
    }
    fprintf(stderr, "%d mutated templates: %d compiled, %d rendered\n", total, compiled, rendered);
    json_decref(vars);
}

int main(void) {
    /* strftime_now formats local time; the fixtures were made in UTC */
    setenv("TZ", "UTC", 1);
    tzset();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_filters_and_methods),
        cmocka_unit_test(test_tojson),
        cmocka_unit_test(test_statements),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_real_templates_compile),
        cmocka_unit_test(test_real_templates_chat_fixtures),
        cmocka_unit_test(test_corpus_compiles),
        cmocka_unit_test(test_fixture_files),
        cmocka_unit_test(test_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

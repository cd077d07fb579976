#!/usr/bin/env python3
"""Reference renders for replay's chat template interpreter (src/template),
made with jinja2 exactly as transformers runs chat templates.

For every template -- the real ones that scripts/fetch-tokenizers.sh puts in
.cache/tokenizers/NAME/tokenizer_config.json, and the corpus written for this
purpose in tests/fixtures/templates/*.jinja -- it generates seeded random
conversations (system message or not, multi-turn, tool calls with arguments
of every JSON type, parallel calls, tool results, unicode, empty content,
reasoning, content as a list of parts, add_generation_prompt on and off,
enable_thinking absent/true/false, and some malformed conversations that
make templates raise) and writes, per template,

  OUT/NAME.json  {"meta": {...}, "name": NAME, "template": source,
                  "now_s": N, "cases": [{"vars": {...}, "text": "..."} |
                  {"vars": {...}, "error": "...", "raised": bool}]}

"vars" is exactly what the template is rendered with (messages, tools,
documents, add_generation_prompt, bos_token, eos_token, extra keywords);
"raised" says the error came from the template's raise_exception (replay must
then give the same message), otherwise any other render error. tests/test_template.c
renders every case of every file in OUT and compares byte for byte; a new
file needs no code change there.

The environment is transformers' own compiled template
(transformers.utils.chat_template_utils._compile_jinja_template:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, loopcontrols]) with its tojson, raise_exception
and strftime_now), with datetime pinned to now_s (UTC) so that strftime_now
is reproducible. Where transformers also has render_jinja_template (the
function apply_chat_template calls), each case is rendered through it too and
the agreement is counted in meta.

Run where jinja2 and transformers are installed (no network needed), from the
repository root after scripts/fetch-tokenizers.sh:
  python3 tools/make_template_fixtures.py --out tests/fixtures/templates/rendered
"""
import argparse
import datetime as _dt
import json
import os
import random
import string
import sys
import zlib

SEED = 20250401
NOW_S = 1721995200  # 26 Jul 2024 12:00 UTC; the C test renders with TZ=UTC
REAL = ["qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3"]

# ---- the environment ----------------------------------------------------------


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls.fromtimestamp(NOW_S, tz or _dt.timezone.utc).replace(tzinfo=None)


def make_replica():
    """transformers' environment rebuilt from its definition, for machines
    without transformers (--replica): only to check replay while developing;
    the committed fixtures come from transformers itself."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' AssistantTracker, without the mask
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return _FixedDatetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    def render(source, v):
        return env.from_string(source).render(**v)

    return render, None, {"jinja2_version": jinja2.__version__, "environment": "replica"}, jinja2


def make_renderer():
    """(render(source, vars) -> str, render_tf(source, vars) or None, description, jinja2)."""
    import jinja2
    from transformers.utils import chat_template_utils as ctu

    # strftime_now calls datetime.now(): pin it, whichever way the module imported it
    if isinstance(ctu.datetime, type):
        ctu.datetime = _FixedDatetime
    else:
        class _Mod:
            datetime = _FixedDatetime
            timezone = _dt.timezone
        ctu.datetime = _Mod
    tf_render = getattr(ctu, "render_jinja_template", None)

    def render(source, v):
        return ctu._compile_jinja_template(source).render(**v)

    def render_tf(source, v):
        v = dict(v)
        messages, tools, documents = v.pop("messages"), v.pop("tools"), v.pop("documents")
        agp = v.pop("add_generation_prompt")
        out, _ = tf_render(conversations=[messages], tools=tools, documents=documents, chat_template=source,
                           add_generation_prompt=agp, **v)
        return out[0]

    import transformers
    desc = {"jinja2_version": jinja2.__version__, "transformers_version": transformers.__version__}
    return render, (render_tf if tf_render else None), desc, jinja2


# ---- random conversations -----------------------------------------------------

TEXTS = [
    "Hello!", "What is 2+2?", "Tell me a joke about cats.", "", " ", "  padded both sides  ", "multi\nline\n\ntext\n",
    "trailing newline\n", "\n\nleading newlines", "tabs\tand\r\ncarriage returns", "quotes ' \" and \\ backslashes",
    "unicode: é ü ß Ω 中文 日本語 한국어 עברית العربية", "emoji 😀👍🏽🇫🇷 and zero width \u200b joiner \u200d",
    "{\"looks\": \"like json\", \"n\": [1, 2]}", "<b>html</b> & entities &amp; <tool_call>", "{{ not a template }} {% x %}",
    "a" * 300, "Résumé of naïve café", "line one\u2028line two", "control \x01 char", "</think> inside text",
]
REASONING = ["", "Let me think.\nStep 1.", "\nthinking with newlines\n", "short"]
NAMES = ["get_weather", "search", "calculator", "lookup_user", "send_email", "run_code"]


def rand_scalar(r):
    return r.choice([
        "Paris", "", "é中😀", "with \"quotes\" and \\", "line\nbreak", 0, 1, -7, 42, 2**53, -2**31, 0.0, 1.0, -0.0, 0.1, 2.5,
        -3.75, 1e-7, 1e20, 123456.789, 1.7976931348623157e308, 5e-324, True, False, None,
    ])


def rand_value(r, depth=0):
    k = r.random()
    if depth < 2 and k < 0.15:
        return [rand_value(r, depth + 1) for _ in range(r.randint(0, 3))]
    if depth < 2 and k < 0.3:
        return {r.choice(["a", "b", "key", "ключ", "x y", "n"]) + str(i): rand_value(r, depth + 1) for i in range(r.randint(0, 3))}
    return rand_scalar(r)


def rand_args(r):
    return {f"arg_{i}_{r.choice(['city', 'q', 'n', 'flag', 'items', 'opts'])}": rand_value(r) for i in range(r.randint(0, 4))}


def rand_id(r):
    return "".join(r.choice(string.ascii_letters + string.digits) for _ in range(9))


def rand_tool(r, name):
    props = {p: {"type": r.choice(["string", "integer", "number", "boolean", "array", "object"]),
                 "description": r.choice(["", "the " + p, "naïve ünïcode"])}
             for p in r.sample(["city", "q", "n", "flag", "items", "opts"], r.randint(0, 3))}
    fn = {"name": name, "description": r.choice(["", "Does " + name, "Gets the weather, in °C"]),
          "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}
    if r.random() < 0.2:
        fn["return"] = {"type": "string"}
    return {"type": "function", "function": fn}


def rand_content(r, gemma_parts):
    if gemma_parts and r.random() < 0.3:
        return [{"type": "text", "text": r.choice(TEXTS)} for _ in range(r.randint(1, 2))]
    return r.choice(TEXTS)


def conversation(r, name):
    """One random conversation and its render variables."""
    gemma = name == "gemma3"
    msgs = []
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": rand_content(r, gemma)})
    tools = [rand_tool(r, n) for n in r.sample(NAMES, r.randint(1, 3))] if r.random() < 0.4 else None
    for turn in range(r.randint(1, 4)):
        user = r.choice(TEXTS)
        if name == "qwen3" and r.random() < 0.1:
            user = "<tool_response>\n" + user + "\n</tool_response>"
        msgs.append({"role": "user", "content": rand_content(r, gemma) if gemma else user})
        last = turn == 3 or r.random() < 0.3
        if last and r.random() < 0.6:
            break
        # Gemma 3's template has no tool turns: there they would only make it raise
        if r.random() < (0.03 if gemma else 0.35):
            calls = []
            for _ in range(r.randint(1, 3) if r.random() < 0.3 else 1):
                args = rand_args(r)
                if r.random() < 0.3:
                    args = json.dumps(args, ensure_ascii=r.random() < 0.5)  # OpenAI sends a JSON string
                calls.append({"id": rand_id(r), "type": "function",
                              "function": {"name": r.choice(NAMES), "arguments": args}})
            # content None is what OpenAI clients send; Qwen3's template needs a string
            none_share = 0.1 if name == "qwen3" else 0.5
            content = None if r.random() < none_share else r.choice(["", "Let me check."])
            msg = {"role": "assistant", "content": content, "tool_calls": calls}
            msgs.append(msg)
            for c in calls:
                res = r.choice(["{\"ok\": true}", "21 degrees", "", "résultat ✓", "line\nbreak"])
                tm = {"role": "tool", "tool_call_id": c["id"], "content": res}
                if r.random() < 0.3:
                    tm["name"] = c["function"]["name"]
                msgs.append(tm)
        reply = r.choice(TEXTS)
        if name == "qwen3" and r.random() < 0.3:
            reply = "<think>\n" + r.choice(REASONING) + "\n</think>\n\n" + reply
        msg = {"role": "assistant", "content": rand_content(r, gemma) if gemma else reply}
        if r.random() < 0.15:
            msg["reasoning_content"] = r.choice(REASONING)
        msgs.append(msg)
    # now and then a conversation templates should refuse
    k = r.random()
    if k < 0.04:
        msgs.insert(0, {"role": "assistant", "content": "out of order"})
    elif k < 0.07:
        msgs.append({"role": "user", "content": "two users in a row"})
        msgs.append({"role": "user", "content": "second"})
    elif k < 0.09:
        msgs = []
    v = {"messages": msgs, "tools": tools, "documents": None, "add_generation_prompt": r.random() < 0.6}
    et = r.random()
    if et < 0.33:
        v["enable_thinking"] = True
    elif et < 0.66:
        v["enable_thinking"] = False
    return v


# ---- templates ----------------------------------------------------------------


def token_text(t):
    if isinstance(t, dict):
        return t.get("content")
    return t


def load_templates(root, tokenizers):
    out = []
    for name in REAL:
        path = os.path.join(tokenizers, name, "tokenizer_config.json")
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/fetch-tokenizers.sh")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        tmpl = cfg.get("chat_template")
        if isinstance(tmpl, list):
            tmpl = next(t["template"] for t in tmpl if t.get("name") == "default")
        out.append((name, tmpl, token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token"))))
    corpus = os.path.join(root, "tests", "fixtures", "templates")
    for fn in sorted(os.listdir(corpus)):
        if fn.endswith(".jinja"):
            with open(os.path.join(corpus, fn), encoding="utf-8", newline="") as f:
                out.append((fn[:-6], f.read(), "<|begin_of_text|>", "</s>"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/templates/rendered")
    ap.add_argument("--tokenizers", default=".cache/tokenizers")
    ap.add_argument("--cases", type=int, default=300, help="conversations per template (default 300)")
    ap.add_argument("--replica", action="store_true",
                    help="without transformers: rebuild its environment on jinja2 (development only)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    render, render_tf, desc, jinja2 = make_replica() if args.replica else make_renderer()
    os.makedirs(args.out, exist_ok=True)
    for name, source, bos, eos in load_templates(root, args.tokenizers):
        r = random.Random(SEED ^ zlib.crc32(name.encode()))
        cases, agree, errors = [], 0, 0
        for _ in range(args.cases):
            v = conversation(r, name)
            if bos is not None:
                v["bos_token"] = bos
            if eos is not None:
                v["eos_token"] = eos
            try:
                text = render(source, v)
                case = {"vars": v, "text": text}
            except Exception as e:  # noqa: BLE001 -- every failure is a fixture
                raised = type(e) is jinja2.exceptions.TemplateError
                case = {"vars": v, "error": str(e) if raised else f"{type(e).__name__}: {e}", "raised": raised}
                errors += 1
            if render_tf is not None and "text" in case:
                try:
                    agree += render_tf(source, v) == case["text"]
                except Exception:  # noqa: BLE001
                    pass
            cases.append(case)
        meta = dict(desc, generator="tools/make_template_fixtures.py", seed=SEED, count=len(cases), errors=errors,
                    transformers_render_agreement=agree if render_tf else None)
        path = os.path.join(args.out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "name": name, "template": source, "now_s": NOW_S, "cases": cases}, f,
                      ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{path}: {len(cases)} cases, {errors} errors, agreement with render_jinja_template: {meta['transformers_render_agreement']}")


if __name__ == "__main__":
    main()

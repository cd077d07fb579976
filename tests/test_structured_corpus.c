/* The schema corpus (tests/fixtures/structured/schemas.json, written by
 * tools/make_structured_corpus.mjs): every schema compiles, and the matcher
 * over single bytes (what `replay check-output` does) gives every instance
 * the label ajv gave it: it accepts every valid instance and refuses every
 * invalid one, whitespace allowed (and, for the instances with no whitespace
 * outside strings, compact too). The instances where replay's documented
 * semantics differ from JSON Schema's (the fixture's "differs", each with
 * its reason) get the verdict the fixture says replay gives, so the list of
 * differences stays true. All mismatches are listed before the test fails. */
#include <jansson.h>

#include "structured/structured.h"
#include "test_util.h"

static rp_svocab *byte_vocab(void) {
    static char bytes[256];
    const char *ptrs[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, ptrs[i] = &bytes[i], lens[i] = 1;
    rp_err err;
    rp_svocab *v = rp_svocab_new(256, ptrs, lens, NULL, NULL, 0, &err);
    if (!v) fail_msg("%s", err.msg);
    return v;
}

/* Whether the whole text is in g's language. */
static int accepts(rp_sgrammar *g, const char *text, size_t len) {
    rp_err err;
    rp_smatcher *m = rp_smatcher_new(g, &err);
    if (!m) fail_msg("%s", err.msg);
    int ok = 1;
    for (size_t i = 0; ok && i < len; i++) ok = rp_smatcher_accept_bytes(m, text + i, 1) == 0;
    ok = ok && rp_smatcher_is_accepting(m);
    rp_smatcher_free(m);
    return ok;
}

/* No JSON whitespace outside strings. */
static int is_compact(const char *s, size_t len) {
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (in_str) {
            if (s[i] == '\\') i++;
            else if (s[i] == '"') in_str = 0;
        } else if (s[i] == '"') in_str = 1;
        else if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') return 0;
    }
    return 1;
}

static void test_corpus(void **state) {
    (void)state;
    char path[1024];
    test_path(path, sizeof path, "tests/fixtures/structured/schemas.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) fail_msg("%s: %s", path, je.text);
    json_t *schemas = json_object_get(root, "schemas");
    assert_true(json_is_array(schemas));
    assert_true(json_array_size(schemas) >= 100);
    rp_svocab *v = byte_vocab();
    int bad = 0, checked = 0, n_valid = 0, n_invalid = 0, n_differs = 0, n_compact = 0;
    size_t i;
    json_t *s;
    json_array_foreach(schemas, i, s) {
        const char *name = json_string_value(json_object_get(s, "name"));
        char *text = json_dumps(json_object_get(s, "schema"), JSON_COMPACT | JSON_ENCODE_ANY);
        rp_err err = {0};
        rp_sopts any = {.allow_whitespace = 1}, compact = {.allow_whitespace = 0};
        rp_sgrammar *g = rp_sgrammar_compile(v, RP_SKIND_JSON_SCHEMA, text, strlen(text), &any, &err);
        rp_sgrammar *gc = g ? rp_sgrammar_compile(v, RP_SKIND_JSON_SCHEMA, text, strlen(text), &compact, &err) : NULL;
        if (!g || !gc) {
            print_error("schema %s does not compile: %s\n", name, err.msg);
            bad++;
            rp_sgrammar_release(g);
            free(text);
            continue;
        }
        for (int list = 0; list < 2; list++) {
            json_t *insts = json_object_get(s, list ? "differs" : "instances");
            size_t k;
            json_t *inst;
            json_array_foreach(insts, k, inst) {
                const char *t = json_string_value(json_object_get(inst, "text"));
                const size_t tl = json_string_length(json_object_get(inst, "text"));
                const int want = json_is_true(json_object_get(inst, list ? "replay" : "valid"));
                const int got = accepts(g, t, tl);
                checked++;
                n_differs += list;
                if (!list) n_valid += want, n_invalid += !want;
                if (got != want) {
                    print_error("%s: %s %s, expected %s%s%s\n", name, t, got ? "accepted" : "refused",
                                want ? "valid" : "invalid", list ? ": " : "",
                                list ? json_string_value(json_object_get(inst, "reason")) : "");
                    bad++;
                }
                if (is_compact(t, tl)) {
                    n_compact++;
                    if (accepts(gc, t, tl) != want) {
                        print_error("%s (compact): %s %s, expected %s\n", name, t, want ? "refused" : "accepted",
                                    want ? "valid" : "invalid");
                        bad++;
                    }
                } else if (accepts(gc, t, tl)) {
                    print_error("%s (compact): %s has whitespace but is accepted\n", name, t);
                    bad++;
                }
            }
        }
        rp_sgrammar_release(gc);
        rp_sgrammar_release(g);
        free(text);
    }
    print_message("%zu schemas, %d instances (%d valid, %d invalid, %d where replay differs), %d also compact\n",
                  json_array_size(schemas), checked, n_valid, n_invalid, n_differs, n_compact);
    rp_svocab_free(v);
    json_decref(root);
    if (bad) fail_msg("%d mismatches", bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

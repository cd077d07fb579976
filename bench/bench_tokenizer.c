/* Tokenizer benchmark: time to load tokenizer.json and to encode a large text
 * (the ~10 MB text tools/make_tokenizer_fixtures.py --bench writes), the
 * numbers bench/RESULTS.md compares with Hugging Face tokenizers on the same
 * machine. Optionally checks the ids against HF's (an int32 file).
 *
 *   bench/build_tokenizer_bench.sh && build-bench/bench_tokenizer \
 *       .cache/tokenizers/qwen3 bench.txt [hf_ids.bin]                     */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "util/log.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_DIR TEXT_FILE [HF_IDS_INT32_FILE]\n", argv[0]);
        return 2;
    }
    size_t len;
    char *text = slurp(argv[2], &len);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    rp_err err = {{0}};
    double load_s[5], enc_s[3];
    rp_tokenizer *t = NULL;
    for (int i = 0; i < 5; i++) {
        double t0 = rp_now_s();
        rp_tokenizer *x = rp_tokenizer_load(argv[1], &err);
        load_s[i] = rp_now_s() - t0;
        if (!x) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        if (t) rp_tokenizer_free(t);
        t = x;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        free(ids);
        double t0 = rp_now_s();
        if (rp_tokenizer_encode(t, text, len, &ids, &n, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        enc_s[i] = rp_now_s() - t0;
    }
    qsort(load_s, 5, sizeof *load_s, cmp_double);
    qsort(enc_s, 3, sizeof *enc_s, cmp_double);
    printf("{\"tokenizer\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"load_s_median\": %.4f, "
           "\"load_s_min\": %.4f, \"encode_s_median\": %.4f, \"encode_s_min\": %.4f, \"encode_MB_s\": %.1f",
           argv[1], len, n, load_s[2], load_s[0], enc_s[1], enc_s[0], len / enc_s[1] / 1e6);
    int rc = 0;
    if (argc > 3) {
        size_t hl;
        char *hf = slurp(argv[3], &hl);
        if (!hf) {
            fprintf(stderr, "cannot read %s\n", argv[3]);
            return 1;
        }
        size_t hn = hl / sizeof(int32_t), first = (size_t)-1;
        const int32_t *h = (const int32_t *)hf;
        for (size_t i = 0; i < (hn < n ? hn : n); i++)
            if (h[i] != ids[i]) {
                first = i;
                break;
            }
        int same = hn == n && first == (size_t)-1;
        printf(", \"hf_tokens\": %zu, \"ids_identical\": %s, \"first_diff\": %lld", hn, same ? "true" : "false",
               first == (size_t)-1 ? -1LL : (long long)first);
        rc = same ? 0 : 3;
        free(hf);
    }
    printf("}\n");
    free(ids);
    free(text);
    rp_tokenizer_free(t);
    return rc;
}

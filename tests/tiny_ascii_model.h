/* The tiny model directory the structured-output engine tests run on: a
 * 1-layer Qwen3 config.json and a byte-level BPE tokenizer.json over
 * GPT-2's alphabet for the printable bytes (space is "Ġ"), the caller's
 * extra tokens, and a special <|end|> (the model's EOS), no merges:
 * encoding gives single characters, generation any token. */
#ifndef RP_TEST_TINY_ASCII_MODEL_H
#define RP_TEST_TINY_ASCII_MODEL_H

#include <jansson.h>
#include <stdio.h>
#include <unistd.h>

#include "test_util.h"

/* Writes DIR/tokenizer.json and DIR/config.json of vocab_size ids: the 94
 * printable characters, "Ġ", then extra[0..n_extra) in order; <|end|>'s id
 * is returned. */
static inline int tiny_ascii_model_write(const char *dir, int vocab_size, const char *const *extra, size_t n_extra) {
    json_t *vocab = json_object();
    int id = 0;
    char ch[2] = {0};
    for (int b = 0x21; b <= 0x7e; b++) {
        ch[0] = (char)b;
        json_object_set_new(vocab, ch, json_integer(id++));
    }
    json_object_set_new(vocab, "\xc4\xa0", json_integer(id++)); /* U+0120, byte-level space */
    for (size_t i = 0; i < n_extra; i++) json_object_set_new(vocab, extra[i], json_integer(id++));
    const int end_id = id;
    json_t *tok = json_pack(
        "{s:s, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s}, "
        "s:{s:s, s:n, s:n, s:o, s:[]}}",
        "version", "1.0", "added_tokens", "id", end_id, "content", "<|end|>", "single_word", 0, "lstrip", 0, "rstrip",
        0, "normalized", 0, "special", 1, "normalizer", "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 0, "post_processor", "decoder", "type", "ByteLevel", "model", "type", "BPE",
        "dropout", "unk_token", "vocab", vocab, "merges");
    assert_non_null(tok);
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(tok, path, 0), 0);
    json_decref(tok);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": %d, \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
            "\"num_key_value_heads\": 1, \"head_dim\": 32, \"tie_word_embeddings\": false, \"eos_token_id\": %d}",
            vocab_size, end_id);
    fclose(f);
    return end_id;
}

/* Removes what tiny_ascii_model_write wrote, and DIR. */
static inline void tiny_ascii_model_remove(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
}

#endif

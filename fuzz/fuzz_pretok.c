/*
 * fuzz_pretok.c: libFuzzer target, differential, for the pre-tokenizer's hand-written match of
 * the GPT-4-style split (tok_pretok.c, ascii_scan): on any text, the pieces it makes must be
 * exactly the pieces PCRE2 alone makes with the same pattern.
 *
 * Input: the first byte picks the pattern (even: \p{N} as Qwen's, odd: \p{N}{1,3} as Llama
 * 3's); the rest is the text, repaired to valid UTF-8 as the encoder repairs it (each invalid
 * sequence read as U+FFFD). Invariants checked: the same number of pieces, each with the same
 * offset, length and matched flag. Memory: two pre-tokenizers built once; the text and the
 * ranges on the heap per input. Threads: libFuzzer's one.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static const char *const SPLITS[2] = {
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
    "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false}",
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
    "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false}",
};

/* The pre-tokenizer of SPLITS[k], with or without the hand-written match. */
static tok_pretok_t build(int k, bool fast)
{
    tj_doc_t doc;
    char err[256];
    check(kvr_tj_parse(SPLITS[k], strlen(SPLITS[k]), false, &doc, err, sizeof err) == KVR_OK);
    tok_pretok_t pt;
    check(kvr_tok_pretok_build(doc.root, &pt, err, sizeof err) == KVR_OK);
    kvr_tj_free(&doc);
    check(pt.n == 1 && pt.splits[0].ascii_scan == (k ? 3 : 1)); /* the pattern is recognized */
    if (!fast)
        pt.splits[0].ascii_scan = 0;
    return pt;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tok_pretok_t fast[2], slow[2];
    static pcre2_match_data *md;
    static pcre2_match_context *mc;
    static bool ready;
    if (!ready) {
        for (int k = 0; k < 2; k++) {
            fast[k] = build(k, true);
            slow[k] = build(k, false);
        }
        md = pcre2_match_data_create(16, NULL);
        mc = pcre2_match_context_create(NULL);
        pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
        check(md != NULL && mc != NULL && js != NULL);
        pcre2_jit_stack_assign(mc, NULL, js);
        ready = true;
    }
    if (size == 0)
        return 0;
    int k = data[0] & 1;
    size_t n = size - 1;
    unsigned char *text = malloc(3 * n + 1);
    check(text != NULL);
    size_t tn = kvr_tok_utf8_lossy(data + 1, n, text);
    tok_ranges_t a = {0}, b = {0}, tmp = {0};
    check(kvr_tok_pretok_run(&fast[k], (const char *)text, tn, md, mc, &a, &tmp) == KVR_OK);
    check(kvr_tok_pretok_run(&slow[k], (const char *)text, tn, md, mc, &b, &tmp) == KVR_OK);
    check(a.n == b.n);
    for (size_t i = 0; i < a.n; i++)
        check(a.r[i].off == b.r[i].off && a.r[i].len == b.r[i].len);
    free(a.r);
    free(b.r);
    free(tmp.r);
    free(text);
    return 0;
}

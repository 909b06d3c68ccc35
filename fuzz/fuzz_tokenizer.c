/*
 * fuzz_tokenizer.c: libFuzzer target for the tokenizer (src/tokenizer): a tokenizer.json
 * loaded from untrusted bytes, then text encoded with it.
 *
 * Input: the tokenizer.json bytes, a NUL, then the text (any bytes, invalid UTF-8 included);
 * without a NUL the whole input is both. Invariants checked: a refused load gives a negative
 * status and a message; a loaded tokenizer encodes every text (KVR_OK), the same ids twice
 * and with a fresh scratch (kvr_tok_encode_r), a short cap gives KVR_ETOOBIG with the same
 * count and the same first ids, every id is below the vocabulary size, and the text's bytes
 * encode as their U+FFFD repair does. ASan and the leak checker see every allocation freed.
 * Memory: the ids on the heap, freed each run. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* The U+FFFD repair of s, independently: each byte that does not start a valid sequence
 * (checked with a table of ranges) or a maximal prefix of one becomes EF BF BD. */
static size_t repair(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t need = c < 0x80                 ? 1
                      : c >= 0xC2 && c <= 0xDF ? 2
                      : c >= 0xE0 && c <= 0xEF ? 3
                      : c >= 0xF0 && c <= 0xF4 ? 4
                                               : 0;
        size_t k = 1;
        if (need > 1) {
            for (; k < need && i + k < n; k++) {
                uint8_t lo = 0x80, hi = 0xBF;
                if (k == 1 && c == 0xE0)
                    lo = 0xA0;
                if (k == 1 && c == 0xED)
                    hi = 0x9F;
                if (k == 1 && c == 0xF0)
                    lo = 0x90;
                if (k == 1 && c == 0xF4)
                    hi = 0x8F;
                if (s[i + k] < lo || s[i + k] > hi)
                    break;
            }
        }
        if (need != 0 && k == need) {
            memcpy(out + o, s + i, need);
            o += need;
            i += need;
        } else {
            out[o++] = 0xEF;
            out[o++] = 0xBF;
            out[o++] = 0xBD;
            i += need == 0 ? 1 : k;
        }
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : (const char *)data;
    size_t tlen = nul ? size - jlen - 1 : size;
    int st = 1;
    char err[256] = "";
    kvr_tok_t *t = kvr_tok_load_mem((const char *)data, jlen, NULL, 0, &st, err, sizeof err);
    if (t == NULL) {
        check(st < 0 && err[0] != 0);
        return 0;
    }
    check(st == 0);
    size_t cap = 4 * tlen + 8, n = 0, n2 = 0, n3 = 0;
    uint32_t *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
    uint8_t *fixed = malloc(3 * tlen + 1);
    check(a != NULL && b != NULL && fixed != NULL);
    for (int special = 0; special < 2; special++) {
        check(kvr_tok_encode(t, text, tlen, special, a, cap, &n) == KVR_OK);
        check(n <= cap);
        for (size_t i = 0; i < n; i++)
            check(a[i] < kvr_tok_vocab_size(t));
        check(kvr_tok_encode(t, text, tlen, special, b, cap, &n2) == KVR_OK);
        check(n2 == n && memcmp(a, b, n * sizeof *a) == 0);
        kvr_tok_scratch_t *sc = kvr_tok_scratch_new(t);
        check(sc != NULL);
        check(kvr_tok_encode_r(t, sc, text, tlen, special, b, cap, &n2) == KVR_OK);
        check(n2 == n && memcmp(a, b, n * sizeof *a) == 0);
        kvr_tok_scratch_free(sc);
        if (n > 0) {
            check(kvr_tok_encode(t, text, tlen, special, b, n - 1, &n3) == KVR_ETOOBIG);
            check(n3 == n && memcmp(a, b, (n - 1) * sizeof *a) == 0);
        }
        size_t flen = repair((const uint8_t *)text, tlen, fixed);
        check(kvr_tok_encode(t, (const char *)fixed, flen, special, b, cap, &n2) == KVR_OK);
        check(n2 == n && memcmp(a, b, n * sizeof *a) == 0);
    }
    free(a);
    free(b);
    free(fixed);
    kvr_tok_free(t);
    return 0;
}

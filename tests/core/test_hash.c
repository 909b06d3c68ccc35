/*
 * test_hash.c: block and sequence hashing (core/hash.c) against the reference vectors
 * (docs/wire-formats.md, section 4) and the golden file $KVR_TEST_DATA/hash-vectors.json, which is read
 * through the wire decoder (wire/hash_req.c) exactly as `kvrouter hash` reads a line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <yajl/yajl_parse.h>

#include "kvrouter.h"
#include "wire/hash_req.h"

#define U64(x) UINT64_C(x)

static const uint32_t TOKENS_0_7[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/* Little-endian bytes of tokens (the hash input layout, on any host). */
static void le32_bytes(unsigned char *out, const uint32_t *tokens, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            out[4 * i + (size_t)k] = (unsigned char)(tokens[i] >> (8 * k));
}

static uint64_t lbh0_with(const char *lora, const char *ns)
{
    kvr_hash_opts_t o = {0};
    if (lora != NULL) {
        o.lora_name = lora;
        o.lora_name_len = strlen(lora);
    }
    if (ns != NULL) {
        o.cache_namespace = ns;
        o.cache_namespace_len = strlen(ns);
    }
    uint64_t lbh[2];
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, &o, lbh, 2), 2);
    return lbh[0];
}

static uint64_t seed_with(const char *lora, const char *ns)
{
    kvr_hash_opts_t o = {0};
    if (lora != NULL) {
        o.lora_name = lora;
        o.lora_name_len = strlen(lora);
    }
    if (ns != NULL) {
        o.cache_namespace = ns;
        o.cache_namespace_len = strlen(ns);
    }
    return kvr_hash_seed(&o);
}

/* ---- docs/wire-formats.md, section 4 ---------------------------------------------------------------- */

static void test_xxh3_primitive(void **state)
{
    (void)state;
    assert_int_equal(kvr_xxh3("test data", 9, 1337), U64(13226331709069118873));
}

static void test_plain_blocks_and_chain(void **state)
{
    (void)state;
    uint64_t lbh[2], seq[2];
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, NULL, lbh, 2), 2);
    assert_int_equal(lbh[0], U64(9143094415614847814));
    assert_int_equal(lbh[1], U64(12124091508212882195));
    kvr_hash_chain(lbh, 2, seq);
    assert_int_equal(seq[0], U64(9143094415614847814));
    assert_int_equal(seq[1], U64(9510318385840434533));
    assert_int_equal(kvr_hash_chain_next(seq[0], lbh[1]), seq[1]);
    assert_int_equal(kvr_hash_seed(NULL), KVR_HASH_SEED);
    assert_int_equal(seed_with(NULL, NULL), KVR_HASH_SEED);
}

static void test_salts(void **state)
{
    (void)state;
    assert_int_equal(seed_with("adapter-a", NULL), U64(8842669519798868182));
    assert_int_equal(lbh0_with("adapter-a", NULL), U64(6665157333201000639));
    assert_int_equal(seed_with(NULL, "tenant-a"), U64(1948188790972764086));
    assert_int_equal(lbh0_with(NULL, "tenant-a"), U64(17009624042690211646));
    assert_int_equal(seed_with("adapter-a", "tenant-a"), U64(10790858310771630931));
    assert_int_equal(lbh0_with("adapter-a", "tenant-a"), U64(8269515957840517240));
    /* empty strings are absent */
    assert_int_equal(seed_with("", ""), KVR_HASH_SEED);
    assert_int_equal(lbh0_with("", NULL), U64(9143094415614847814));
}

static void test_mm_hash(void **state)
{
    (void)state;
    const uint32_t tokens[2] = {0, 1};
    const uint64_t h42 = 42;
    kvr_block_mm_t mm = {.block = 0, .hashes = &h42, .n_hashes = 1};
    kvr_hash_opts_t o = {.mm = &mm, .n_mm = 1};
    uint64_t lbh;
    assert_int_equal(kvr_hash_blocks(tokens, 2, 2, &o, &lbh, 1), 1);
    assert_int_equal(lbh, U64(6100948656312251355));
    /* an entry with no hashes is the plain hash */
    mm.n_hashes = 0;
    uint64_t plain, ref;
    assert_int_equal(kvr_hash_blocks(tokens, 2, 2, &o, &plain, 1), 1);
    assert_int_equal(kvr_hash_blocks(tokens, 2, 2, NULL, &ref, 1), 1);
    assert_int_equal(plain, ref);
}

static void test_eagle(void **state)
{
    (void)state;
    const uint32_t tokens[6] = {0, 1, 2, 3, 4, 5};
    kvr_hash_opts_t o = {.is_eagle = true};
    uint64_t lbh[3] = {0, 0, 0};
    assert_int_equal(kvr_hash_n_blocks(6, 2, true), 2);
    assert_int_equal(kvr_hash_blocks(tokens, 6, 2, &o, lbh, 3), 2);
    assert_int_equal(lbh[0], U64(11646242937812223497));
    assert_int_equal(lbh[1], U64(9948816348502404300));
    assert_int_equal(lbh[2], 0); /* untouched */
    /* the windows are [0,1,2] and [2,3,4] hashed plainly */
    unsigned char w[12];
    le32_bytes(w, tokens, 3);
    assert_int_equal(lbh[0], kvr_xxh3(w, 12, KVR_HASH_SEED));
    le32_bytes(w, tokens + 2, 3);
    assert_int_equal(lbh[1], kvr_xxh3(w, 12, KVR_HASH_SEED));
}

static void test_pad_value(void **state)
{
    (void)state;
    assert_int_equal(kvr_mm_pad_value(0), 1000000u);
    assert_int_equal(kvr_mm_pad_value((U64(1) << 30) | 0xCAFE), 1051966u);
    assert_int_equal(kvr_mm_pad_value(UINT64_MAX), 1000000u + ((1u << 30) - 1));
}

/* ---- further properties ------------------------------------------------------------------- */

static void test_mm_order_and_duplicates(void **state)
{
    (void)state;
    const uint32_t tokens[4] = {7, 8, 9, 10};
    const uint64_t sorted[4] = {1, 5, U64(10754394637803157173), UINT64_MAX};
    const uint64_t shuffled[4] = {UINT64_MAX, 5, U64(10754394637803157173), 1};
    kvr_block_mm_t mm = {.block = 1, .hashes = sorted, .n_hashes = 4};
    kvr_hash_opts_t o = {.mm = &mm, .n_mm = 1};
    uint64_t a[2], b[2];
    assert_int_equal(kvr_hash_blocks(tokens, 4, 2, &o, a, 2), 2);
    mm.hashes = shuffled;
    assert_int_equal(kvr_hash_blocks(tokens, 4, 2, &o, b, 2), 2);
    assert_int_equal(a[0], b[0]);
    assert_int_equal(a[1], b[1]);
    /* block 0 has no mm entry; block 1 is tokens || sorted LE u64 */
    unsigned char bytes[8 + 32];
    le32_bytes(bytes, tokens, 2);
    assert_int_equal(a[0], kvr_xxh3(bytes, 8, KVR_HASH_SEED));
    le32_bytes(bytes, tokens + 2, 2);
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 8; k++)
            bytes[8 + 8 * i + k] = (unsigned char)(sorted[i] >> (8 * k));
    assert_int_equal(a[1], kvr_xxh3(bytes, sizeof bytes, KVR_HASH_SEED));

    /* duplicates are kept (hashed twice), in any position */
    const uint64_t dup_sorted[3] = {3, 3, 9};
    const uint64_t dup_shuffled[3] = {3, 9, 3};
    const uint64_t nodup[2] = {3, 9};
    uint64_t d1[2], d2[2], d3[2];
    mm.hashes = dup_sorted;
    mm.n_hashes = 3;
    assert_int_equal(kvr_hash_blocks(tokens, 4, 2, &o, d1, 2), 2);
    mm.hashes = dup_shuffled;
    assert_int_equal(kvr_hash_blocks(tokens, 4, 2, &o, d2, 2), 2);
    mm.hashes = nodup;
    mm.n_hashes = 2;
    assert_int_equal(kvr_hash_blocks(tokens, 4, 2, &o, d3, 2), 2);
    assert_int_equal(d1[1], d2[1]);
    assert_true(d1[1] != d3[1]);
}

static void test_invalid_args(void **state)
{
    (void)state;
    uint64_t lbh[4];
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 0, NULL, lbh, 4), KVR_EINVAL);
    assert_int_equal(kvr_hash_n_blocks(8, 0, false), 0);
    assert_int_equal(kvr_hash_blocks(NULL, 8, 4, NULL, lbh, 4), KVR_EINVAL);
    assert_int_equal(kvr_hash_blocks(NULL, 0, 4, NULL, NULL, 0), 0);
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, NULL, NULL, 4), KVR_EINVAL);
    /* capacity too small */
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, NULL, lbh, 1), KVR_ETOOBIG);
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 1, NULL, lbh, 4), KVR_ETOOBIG);
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, NULL, lbh, 2), 2);
    /* unsorted or repeated mm entries, NULL hashes */
    const uint64_t h = 1;
    kvr_block_mm_t mm[2] = {{.block = 1, .hashes = &h, .n_hashes = 1},
                            {.block = 0, .hashes = &h, .n_hashes = 1}};
    kvr_hash_opts_t o = {.mm = mm, .n_mm = 2};
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, &o, lbh, 4), KVR_EINVAL);
    mm[1].block = 1;
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, &o, lbh, 4), KVR_EINVAL);
    mm[1].block = 2; /* past the last complete block: ignored */
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, &o, lbh, 4), 2);
    mm[0].hashes = NULL;
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, &o, lbh, 4), KVR_EINVAL);
    o.mm = NULL;
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, &o, lbh, 4), KVR_EINVAL);
}

static void test_partial_block(void **state)
{
    (void)state;
    uint64_t full[2], part[2] = {0, 0};
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 8, 4, NULL, full, 2), 2);
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 7, 4, NULL, part, 2), 1);
    assert_int_equal(part[0], full[0]);
    assert_int_equal(part[1], 0);
    assert_int_equal(kvr_hash_blocks(TOKENS_0_7, 3, 4, NULL, part, 2), 0);
    assert_int_equal(kvr_hash_n_blocks(7, 4, false), 1);
    /* Eagle: the last window needs one token past the block */
    assert_int_equal(kvr_hash_n_blocks(8, 4, true), 1);
    assert_int_equal(kvr_hash_n_blocks(9, 4, true), 2);
    assert_int_equal(kvr_hash_n_blocks(0, 4, true), 0);
    assert_int_equal(kvr_hash_n_blocks(1, 1, true), 0);
}

static void test_chain_aliasing(void **state)
{
    (void)state;
    uint64_t lbh[5], seq[5], inplace[5];
    const uint32_t tokens[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
    assert_int_equal(kvr_hash_blocks(tokens, 20, 4, NULL, lbh, 5), 5);
    kvr_hash_chain(lbh, 5, seq);
    memcpy(inplace, lbh, sizeof lbh);
    kvr_hash_chain(inplace, 5, inplace);
    assert_memory_equal(seq, inplace, sizeof seq);
    uint64_t prev = lbh[0];
    for (int i = 1; i < 5; i++) {
        prev = kvr_hash_chain_next(prev, lbh[i]);
        assert_int_equal(seq[i], prev);
    }
    kvr_hash_chain(lbh, 0, NULL); /* n = 0 touches nothing */
}

/* ---- the golden file ---------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            char *p = realloc(buf, cap + 1);
            assert_non_null(p);
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Splits the "cases" array of the golden file into the byte ranges of its objects. A string-
 * and escape-aware brace matcher: enough for this trusted file, and it keeps each case's
 * exact text so the decoder sees what an engine-parity run would send. */
typedef struct span {
    size_t start, len;
} span_t;

static size_t split_cases(const char *s, size_t n, span_t *out, size_t cap)
{
    const char *cases = strstr(s, "\"cases\"");
    assert_non_null(cases);
    size_t i = (size_t)(cases - s) + 7;
    while (i < n && s[i] != '[')
        i++;
    i++;
    size_t count = 0, depth = 0, start = 0;
    bool in_str = false;
    for (; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            if (depth++ == 0)
                start = i;
        } else if (c == '}' || c == ']') {
            if (depth == 0)
                break; /* end of "cases" */
            if (--depth == 0) {
                assert_true(count < cap);
                out[count++] = (span_t){start, i + 1 - start};
            }
        }
    }
    return count;
}

/* The expected fields of one case, read with yajl (numbers as text: the seeds exceed i64). */
typedef struct expect {
    int depth;
    int key;  /* 0 other, 1 local_block_hashes, 2 sequence_hashes, 3 seed */
    uint64_t lbh[512], seq[512];
    size_t n_lbh, n_seq;
    uint64_t seed;
    bool have_seed, bad;
} expect_t;

static bool text_u64(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

static int ex_string(void *ctx, const unsigned char *s, size_t n)
{
    expect_t *e = ctx;
    if (e->depth == 2 && (e->key == 1 || e->key == 2)) {
        uint64_t *arr = e->key == 1 ? e->lbh : e->seq;
        size_t *cnt = e->key == 1 ? &e->n_lbh : &e->n_seq;
        if (*cnt >= 512 || !text_u64((const char *)s, n, &arr[*cnt]))
            e->bad = true;
        else
            (*cnt)++;
    }
    return 1;
}

static int ex_number(void *ctx, const char *s, size_t n)
{
    expect_t *e = ctx;
    if (e->depth == 1 && e->key == 3) {
        e->have_seed = text_u64(s, n, &e->seed);
        e->bad |= !e->have_seed;
    }
    return 1;
}

static int ex_key(void *ctx, const unsigned char *s, size_t n)
{
    expect_t *e = ctx;
    if (e->depth != 1)
        return 1;
    e->key = 0;
    if (n == 18 && memcmp(s, "local_block_hashes", n) == 0)
        e->key = 1;
    else if (n == 15 && memcmp(s, "sequence_hashes", n) == 0)
        e->key = 2;
    else if (n == 4 && memcmp(s, "seed", n) == 0)
        e->key = 3;
    return 1;
}

static int ex_open(void *ctx)
{
    ((expect_t *)ctx)->depth++;
    return 1;
}

static int ex_close(void *ctx)
{
    ((expect_t *)ctx)->depth--;
    return 1;
}

static const yajl_callbacks EXPECT_CB = {
    .yajl_number = ex_number,
    .yajl_string = ex_string,
    .yajl_start_map = ex_open,
    .yajl_map_key = ex_key,
    .yajl_end_map = ex_close,
    .yajl_start_array = ex_open,
    .yajl_end_array = ex_close,
};

static void parse_expect(const char *text, size_t len, expect_t *e)
{
    memset(e, 0, sizeof *e);
    yajl_handle h = yajl_alloc(&EXPECT_CB, NULL, e);
    assert_non_null(h);
    yajl_status st = yajl_parse(h, (const unsigned char *)text, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    yajl_free(h);
    assert_int_equal(st, yajl_status_ok);
    assert_false(e->bad);
}

static void test_golden_file(void **state)
{
    (void)state;
    const char *dir = getenv("KVR_TEST_DATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/hash-vectors.json", dir != NULL ? dir : "tests/data");
    size_t len = 0;
    char *text = read_file(path, &len);
    if (text == NULL)
        fail_msg("cannot read %s (set KVR_TEST_DATA)", path);

    static span_t spans[1024];
    size_t n_cases = split_cases(text, len, spans, 1024);
    assert_int_equal(n_cases, 60);

    kvr_hash_req_t req;
    kvr_hash_req_init(&req);
    static expect_t ex;
    uint64_t lbh[512], seq[512];
    size_t failures = 0, with_mm = 0, with_eagle = 0, with_salt = 0;
    for (size_t c = 0; c < n_cases; c++) {
        const char *ct = text + spans[c].start;
        parse_expect(ct, spans[c].len, &ex);
        int st = kvr_hash_req_parse(&req, ct, spans[c].len);
        if (st != KVR_OK) {
            print_error("case %zu: decoder: %s\n", c, req.err);
            failures++;
            continue;
        }
        with_mm += req.opts.n_mm > 0;
        with_eagle += req.opts.is_eagle;
        with_salt += kvr_hash_seed(&req.opts) != KVR_HASH_SEED;
        long n = kvr_hash_blocks(req.tokens, req.n_tokens, req.block_size, &req.opts, lbh, 512);
        if (n < 0) {
            print_error("case %zu: kvr_hash_blocks: %s\n", c, kvr_strerror((int)n));
            failures++;
            continue;
        }
        kvr_hash_chain(lbh, (size_t)n, seq);
        bool ok = (size_t)n == ex.n_lbh && (size_t)n == ex.n_seq &&
                  memcmp(lbh, ex.lbh, (size_t)n * 8) == 0 && memcmp(seq, ex.seq, (size_t)n * 8) == 0;
        if (ex.have_seed && kvr_hash_seed(&req.opts) != ex.seed) {
            print_error("case %zu: seed %llu, expected %llu\n", c,
                        (unsigned long long)kvr_hash_seed(&req.opts),
                        (unsigned long long)ex.seed);
            ok = false;
        }
        if (!ok) {
            print_error("case %zu: hashes differ (%ld blocks, expected %zu)\n", c, n, ex.n_lbh);
            failures++;
        }
    }
    kvr_hash_req_deinit(&req);
    free(text);
    print_message("hash-vectors.json: %zu cases, %zu with mm, %zu Eagle, %zu salted, %zu failed\n",
                  n_cases, with_mm, with_eagle, with_salt, failures);
    assert_int_equal(failures, 0);
    /* the file exercises every feature */
    assert_true(with_mm > 0 && with_eagle > 0 && with_salt > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh3_primitive),
        cmocka_unit_test(test_plain_blocks_and_chain),
        cmocka_unit_test(test_salts),
        cmocka_unit_test(test_mm_hash),
        cmocka_unit_test(test_eagle),
        cmocka_unit_test(test_pad_value),
        cmocka_unit_test(test_mm_order_and_duplicates),
        cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_partial_block),
        cmocka_unit_test(test_chain_aliasing),
        cmocka_unit_test(test_golden_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

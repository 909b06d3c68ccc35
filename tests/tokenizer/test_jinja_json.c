/*
 * test_jinja_json.c: the request's JSON read into template values (src/tokenizer/jinja_json.c):
 * whatever the one-pass reader takes, it reads exactly as yajl's tree does (the same kinds,
 * bytes, numbers, member order, repeated keys), and what it does not take leaves the arena as
 * it was, so yajl decides. Fixed cases for every edge (escapes, \u0000 and surrogates,
 * comments, \v and \f, number ranges and forms, nesting at and past 128, invalid UTF-8), then
 * random documents and random mutations of them.
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
#include "kvrouter/status.h"
#include "tokenizer/jinja.h"

/* 1: the reader took it (and agrees with yajl), 0: it passed it on; -1: they disagree. */
static int compare(const char *json, size_t len)
{
    struct jarena a, b;
    ja_init(&a, (size_t)1 << 28);
    ja_init(&b, (size_t)1 << 28);
    (void)ja_alloc(&a, 100); /* something held before: a refusal must leave it as it was */
    struct jarena before = a;
    struct jv va, vb;
    char err[256] = "";
    int ra = jv_from_json_text(&a, json, len, &va);
    int rb = jv_from_json_yajl(&b, json, len, &vb, err, sizeof err);
    int res = ra == KVR_OK ? 1 : 0;
    if (ra == KVR_OK && (rb != KVR_OK || !jv_same(va, vb))) {
        printf("the reader took '%.*s' as yajl does not (%s)\n", (int)(len < 200 ? len : 200), json,
               rb != KVR_OK ? err : "another value");
        res = -1;
    } else if (ra != KVR_OK && (a.head != before.head || a.total != before.total)) {
        printf("the reader passed on '%.*s' but kept arena memory\n", (int)(len < 200 ? len : 200),
               json);
        res = -1;
    } else if (ra != KVR_OK && ra != KVR_EPARSE) {
        res = -1;
    }
    ja_free(&a);
    ja_free(&b);
    return res;
}

#define TAKEN(s) assert_int_equal(compare((s), sizeof(s) - 1), 1)
#define PASSED(s) assert_int_equal(compare((s), sizeof(s) - 1), 0)

static void test_fixed(void **state)
{
    (void)state;
    TAKEN("[{\"role\":\"user\",\"content\":\"Hello\"}]");
    TAKEN(" [ ] ");
    TAKEN("{}");
    TAKEN("\"\"");
    TAKEN("[true,false,null,0,-0,7,-12,9223372036854775807,-9223372036854775807]");
    TAKEN("[1.5,-0.0,1e5,1E+5,2.5e-3,0.1,1e308]");
    TAKEN("{\"a\":1,\"b\":[1,{\"c\":\"d\"}],\"a\":2}"); /* the first place, the last value */
    TAKEN("\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t\"");
    TAKEN("\"\\u0041\\u00e9\\u4e2d\\u007f\\u0080\\u07ff\\u0800\\uffff\\uFFFD\"");
    TAKEN("\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x91\x8b \x7f\"");
    TAKEN("\"a long string of plain text over eight bytes a step, then an escape \\n and more\"");
    TAKEN("\t\n\r [1]\r\n");
    PASSED("\"\\ud83d\\ude00\""); /* a surrogate pair: yajl's reading */
    PASSED("\"\\ud800\"");        /* a lone surrogate */
    PASSED("\"\\udc00x\"");
    PASSED("\"a\\u0000b\"");       /* yajl keeps the NUL, the tree's strlen cuts there */
    PASSED("[1 /* a comment */]"); /* yajl_tree allows comments */
    PASSED("[1,\v2]");
    PASSED("[1,\f2]");
    PASSED("9223372036854775808");
    PASSED("-9223372036854775808");
    PASSED("1e400");
    PASSED("1e-400");
    PASSED("01");
    PASSED("1.");
    PASSED(".5");
    PASSED("-");
    PASSED("+1");
    PASSED("[1,]");
    PASSED("{\"a\":1,}");
    PASSED("{\"a\" 1}");
    PASSED("[1] x");
    PASSED("");
    PASSED("  ");
    PASSED("tru");
    PASSED("\"\xff\"");             /* invalid UTF-8 */
    PASSED("\"\xc0\x80\"");         /* overlong */
    PASSED("\"\xed\xa0\x80\"");     /* a surrogate in UTF-8 */
    PASSED("\"\xf4\x90\x80\x80\""); /* past U+10FFFF */
    PASSED("\"a\x01\"");            /* a raw control */
    PASSED("\"\\x\"");
    PASSED("\"\\u12\"");
    PASSED("\"\\u12g4\"");
    PASSED("\"unterminated");
    assert_int_equal(compare("[1,\0 2]", 7), 0);
    /* nesting: 128 levels under the root are taken, deeper is yajl's error */
    char deep[600];
    for (int d = 127; d <= 130; d++) {
        size_t o = 0;
        for (int i = 0; i < d; i++)
            deep[o++] = '[';
        deep[o++] = '1';
        for (int i = 0; i < d; i++)
            deep[o++] = ']';
        assert_int_equal(compare(deep, o), d <= 128 ? 1 : 0);
    }
    /* more open containers than the reader's stack holds on the C stack */
    char *wide = malloc(20000);
    size_t o = 0;
    wide[o++] = '[';
    for (int i = 0; i < 400; i++)
        o += (size_t)sprintf(wide + o, "%s{\"k%d\":[%d,\"v\"]}", i ? "," : "", i % 7, i);
    wide[o++] = ']';
    assert_int_equal(compare(wide, o), 1);
    free(wide);
}

/* ---- random documents and mutations ------------------------------------------------------- */

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A document being written: generation stops nesting past DOC_SOFT bytes, so it fits. */
#define DOC_SOFT 8192
typedef struct out {
    char p[DOC_SOFT * 4];
    size_t n;
} out_t;

static void puts_(out_t *o, const char *s)
{
    size_t n = strlen(s);
    assert_true(o->n + n <= sizeof o->p);
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void ws(out_t *o, uint64_t *x)
{
    static const char *const w[] = {"", "", "", " ", "\n", "\t", "\r\n  "};
    puts_(o, w[rnd(x) % 7]);
}

static void gen_string(out_t *o, uint64_t *x)
{
    static const char *const parts[] = {"plain ",
                                        "text that runs past eight bytes ",
                                        "\\\"",
                                        "\\\\",
                                        "\\/",
                                        "\\n",
                                        "\\t",
                                        "\\b",
                                        "\\f",
                                        "\\r",
                                        "\\u00e9",
                                        "\\u4E2D",
                                        "\\u0001",
                                        "\\ud83d\\ude00",
                                        "\\u0000",
                                        "\xc3\xa9",
                                        "\xe4\xb8\xad",
                                        "\xf0\x9f\x91\x8b",
                                        "<|im_start|>",
                                        "{}[],:",
                                        "'"};
    puts_(o, "\"");
    for (size_t i = 0, n = rnd(x) % 6; i < n; i++)
        puts_(o, parts[rnd(x) % (sizeof parts / sizeof parts[0])]);
    puts_(o, "\"");
}

static void gen(out_t *o, uint64_t *x, int depth)
{
    char num[64];
    switch (depth > 4 || o->n > DOC_SOFT ? rnd(x) % 5 : rnd(x) % 8) {
    case 0:
        gen_string(o, x);
        return;
    case 1: {
        static const char *const lit[] = {"true", "false", "null"};
        puts_(o, lit[rnd(x) % 3]);
        return;
    }
    case 2:
        snprintf(num, sizeof num, "%lld",
                 (long long)(rnd(x) >> (rnd(x) % 64)) * (rnd(x) % 2 ? 1 : -1));
        puts_(o, num);
        return;
    case 3:
        snprintf(num, sizeof num, "%.*g", (int)(1 + rnd(x) % 17),
                 (double)(int64_t)rnd(x) / (double)(1 + rnd(x) % 100000));
        puts_(o, num);
        return;
    case 4: {
        static const char *const nums[] = {"0",
                                           "-0",
                                           "1e5",
                                           "1.0",
                                           "2E-3",
                                           "-1.5e+10",
                                           "1e308",
                                           "9223372036854775807",
                                           "9223372036854775808"};
        puts_(o, nums[rnd(x) % 9]);
        return;
    }
    case 5:
    case 6: {
        puts_(o, "[");
        for (size_t i = 0, n = rnd(x) % 5; i < n; i++) {
            if (i)
                puts_(o, ",");
            ws(o, x);
            gen(o, x, depth + 1);
            ws(o, x);
        }
        puts_(o, "]");
        return;
    }
    default: {
        puts_(o, "{");
        for (size_t i = 0, n = rnd(x) % 5; i < n; i++) {
            if (i)
                puts_(o, ",");
            ws(o, x);
            if (rnd(x) % 4 == 0) { /* repeated keys */
                puts_(o, "\"k\"");
            } else {
                gen_string(o, x);
            }
            ws(o, x);
            puts_(o, ":");
            ws(o, x);
            gen(o, x, depth + 1);
        }
        puts_(o, "}");
        return;
    }
    }
}

static int random_seed(unsigned long seed, int steps)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
    static out_t o;
    int failures = 0, taken = 0;
    for (int step = 0; step < steps && failures == 0; step++) {
        o.n = 0;
        ws(&o, &x);
        gen(&o, &x, 0);
        ws(&o, &x);
        int r = compare(o.p, o.n);
        failures += r < 0;
        taken += r > 0;
        for (int m = 0; m < 3 && failures == 0 && o.n > 0; m++) { /* a byte changed */
            size_t at = rnd(&x) % o.n;
            char keep = o.p[at];
            static const char bytes[] = "\"\\{}[]:,0-.eu \x01\x7f\xc3\xff/\v";
            o.p[at] = bytes[rnd(&x) % (sizeof bytes - 1)];
            failures += compare(o.p, o.n) < 0;
            o.p[at] = keep;
        }
    }
    if (failures == 0 && steps >= 100 && taken < steps / 4) {
        printf("seed %lu: the reader took only %d of %d documents\n", seed, taken, steps);
        failures++;
    }
    return failures;
}

static void test_random(void **state)
{
    (void)state;
    kvr_model_plan_t plan = {.seeds = 20, .seeds_asan = 4, .steps = 500, .steps_one = 20000};
    assert_int_equal(kvr_model_drive(&plan, random_seed), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

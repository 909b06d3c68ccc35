/*
 * test_json_writer.c: the JSON builder (wire/json_writer.c): automatic commas, string
 * escaping and UTF-8 repair, exact integers, shortest round-trip doubles, sticky misuse
 * errors, the OpenAI error body, and buffer reuse across reset. Every document produced is
 * also parsed back with yajl_tree as an independent check that it is valid JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <yajl/yajl_tree.h>

#include "wire/json_writer.h"

/* The finished document, checked to be valid JSON by an independent parser. */
static const char *doc(kvr_json_writer_t *w)
{
    const char *data;
    size_t len;
    int st = kvr_json_writer_finish(w, &data, &len);
    if (st != KVR_OK)
        fail_msg("finish: %d", st);
    assert_int_equal(strlen(data), len);
    char err[256];
    yajl_val v = yajl_tree_parse(data, err, sizeof err);
    if (v == NULL)
        fail_msg("not JSON: %s (%s)", data, err);
    yajl_tree_free(v);
    return data;
}

static const char *one_string(kvr_json_writer_t *w, const char *s, size_t n)
{
    kvr_json_writer_reset(w);
    kvr_json_begin_array(w);
    kvr_json_string_n(w, s, n);
    kvr_json_end_array(w);
    return doc(w);
}

/* Significant digits of a number's text (leading zeros and exponent excluded). */
static int sig_digits(const char *s)
{
    int n = 0, leading = 1;
    for (; *s != '\0' && *s != 'e'; s++) {
        if (*s < '0' || *s > '9' || (leading && *s == '0'))
            continue;
        leading = 0;
        n++;
    }
    return n;
}

static const char *one_double(kvr_json_writer_t *w, double v)
{
    kvr_json_writer_reset(w);
    kvr_json_double(w, v);
    return doc(w);
}

static void test_structure(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "a");
    kvr_json_u64(&w, 1);
    kvr_json_key(&w, "b");
    kvr_json_begin_array(&w);
    kvr_json_null(&w);
    kvr_json_bool(&w, true);
    kvr_json_bool(&w, false);
    kvr_json_begin_object(&w);
    kvr_json_end_object(&w);
    kvr_json_begin_array(&w);
    kvr_json_end_array(&w);
    kvr_json_string(&w, "x");
    kvr_json_string(&w, NULL);
    kvr_json_end_array(&w);
    kvr_json_key(&w, "c");
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "d");
    kvr_json_i64(&w, -5);
    kvr_json_end_object(&w);
    assert_int_equal(kvr_json_end_object(&w), KVR_OK);
    assert_string_equal(doc(&w),
                        "{\"a\":1,\"b\":[null,true,false,{},[],\"x\",null],\"c\":{\"d\":-5}}");

    /* scalars at the top level */
    kvr_json_writer_reset(&w);
    kvr_json_string(&w, "top");
    assert_string_equal(doc(&w), "\"top\"");
    kvr_json_writer_deinit(&w);
    kvr_json_writer_deinit(NULL);
}

static void test_integers(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_begin_array(&w);
    kvr_json_u64(&w, 0);
    kvr_json_u64(&w, UINT64_MAX);
    kvr_json_i64(&w, INT64_MIN);
    kvr_json_i64(&w, INT64_MAX);
    kvr_json_i64(&w, 0);
    kvr_json_i64(&w, -1);
    kvr_json_u64(&w, 4294967295u);
    kvr_json_end_array(&w);
    assert_string_equal(doc(&w), "[0,18446744073709551615,-9223372036854775808,"
                                 "9223372036854775807,0,-1,4294967295]");
    kvr_json_writer_deinit(&w);
}

static void test_doubles(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    assert_string_equal(one_double(&w, 0.1), "0.1");
    assert_string_equal(one_double(&w, 0.5), "0.5");
    assert_string_equal(one_double(&w, 100.0), "100");
    assert_string_equal(one_double(&w, -2.25), "-2.25");
    assert_string_equal(one_double(&w, 0.0), "0");
    assert_string_equal(one_double(&w, -0.0), "-0");
    assert_string_equal(one_double(&w, 1e300), "1e+300");
    assert_string_equal(one_double(&w, 5e-324), "5e-324");
    assert_string_equal(one_double(&w, 2.2250738585072014e-308), "2.2250738585072014e-308");
    assert_string_equal(one_double(&w, 123456789012345.0), "123456789012345");
    assert_string_equal(one_double(&w, 1.7976931348623157e308), "1.7976931348623157e+308");
    assert_string_equal(one_double(&w, 0.1 + 0.2), "0.30000000000000004");
    assert_string_equal(one_double(&w, 1.0 / 3.0), "0.3333333333333333");
    assert_string_equal(one_double(&w, 9007199254740993.0), "9007199254740992");
    assert_string_equal(one_double(&w, NAN), "null");
    assert_string_equal(one_double(&w, INFINITY), "null");
    assert_string_equal(one_double(&w, -INFINITY), "null");

    /* every finite double reads back exactly (random bit patterns, fixed seed) */
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double v;
        memcpy(&v, &x, sizeof v);
        if (!isfinite(v))
            continue;
        const char *s = one_double(&w, v);
        if (strtod(s, NULL) != v)
            fail_msg("%s does not read back as %a", s, v);
        assert_true(strlen(s) <= 24);
        int k = sig_digits(s);
        if (k > 1) {  /* and one digit fewer does not */
            char shorter[400];
            snprintf(shorter, sizeof shorter, "%.*g", k - 1, v);
            if (strtod(shorter, NULL) == v)
                fail_msg("%s is not the shortest: %s reads back too", s, shorter);
        }
    }
    kvr_json_writer_deinit(&w);
}

static void test_escaping(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    assert_string_equal(one_string(&w, "a\"b\\c/d", 7), "[\"a\\\"b\\\\c/d\"]");
    assert_string_equal(one_string(&w, "\n\t\r\b\f", 5), "[\"\\n\\t\\r\\b\\f\"]");
    assert_string_equal(one_string(&w, "\x01\x1f\x7f", 3), "[\"\\u0001\\u001f\x7f\"]");
    assert_string_equal(one_string(&w, "a\0b", 3), "[\"a\\u0000b\"]");
    assert_string_equal(one_string(&w, "", 0), "[\"\"]");
    /* valid UTF-8 passes through: 2, 3 and 4 byte forms, U+FFFF, U+10FFFF */
    const char *ok = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbf\xf4\x8f\xbf\xbf";
    char want[64];
    snprintf(want, sizeof want, "[\"%s\"]", ok);
    assert_string_equal(one_string(&w, ok, strlen(ok)), want);
    /* invalid UTF-8: one U+FFFD per offending byte */
    assert_string_equal(one_string(&w, "a\x80z", 3), "[\"a\xef\xbf\xbdz\"]");
    assert_string_equal(one_string(&w, "\xc0\x80", 2), "[\"\xef\xbf\xbd\xef\xbf\xbd\"]");
    assert_string_equal(one_string(&w, "\xed\xa0\x80", 3),
                        "[\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"]");          /* surrogate */
    assert_string_equal(one_string(&w, "\xf4\x90\x80\x80", 4),
                        "[\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"]"); /* > 10FFFF */
    assert_string_equal(one_string(&w, "\xe2\x82", 2), "[\"\xef\xbf\xbd\xef\xbf\xbd\"]");
    assert_string_equal(one_string(&w, "\xff", 1), "[\"\xef\xbf\xbd\"]");
    assert_string_equal(one_string(&w, "\xe0\x80\xaf", 3),
                        "[\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"]");          /* overlong */

    /* keys are escaped the same way */
    kvr_json_writer_reset(&w);
    kvr_json_begin_object(&w);
    kvr_json_key_n(&w, "k\"\n\xff", 4);
    kvr_json_u64(&w, 1);
    kvr_json_end_object(&w);
    assert_string_equal(doc(&w), "{\"k\\\"\\n\xef\xbf\xbd\":1}");

    /* every byte value, alone and in runs, gives valid JSON */
    char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    one_string(&w, all, sizeof all);
    kvr_json_writer_deinit(&w);
}

static void expect_misuse(kvr_json_writer_t *w)
{
    assert_int_equal(kvr_json_writer_status(w), KVR_EINVAL);
    assert_int_equal(kvr_json_u64(w, 1), KVR_EINVAL);  /* sticky */
    assert_int_equal(kvr_json_writer_finish(w, NULL, NULL), KVR_EINVAL);
}

static void test_misuse(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);

    kvr_json_begin_object(&w);
    kvr_json_u64(&w, 1);  /* value without a key */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_begin_array(&w);
    kvr_json_key(&w, "k");  /* key in an array */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_begin_array(&w);
    kvr_json_end_object(&w);  /* mismatched end */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_end_array(&w);  /* end with nothing open */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "k");
    kvr_json_end_object(&w);  /* key without a value */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "k");
    kvr_json_key(&w, "k2");  /* two keys */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_u64(&w, 1);
    kvr_json_u64(&w, 2);  /* second top-level value */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    kvr_json_key(&w, "k");  /* key at the top level */
    expect_misuse(&w);

    kvr_json_writer_reset(&w);
    for (int i = 0; i < KVR_JSON_MAX_DEPTH; i++)
        assert_int_equal(kvr_json_begin_array(&w), KVR_OK);
    kvr_json_begin_array(&w);  /* one too deep */
    expect_misuse(&w);

    /* incomplete documents do not finish */
    kvr_json_writer_reset(&w);
    assert_int_equal(kvr_json_writer_finish(&w, NULL, NULL), KVR_EINVAL);
    kvr_json_writer_reset(&w);
    kvr_json_begin_array(&w);
    assert_int_equal(kvr_json_writer_finish(&w, NULL, NULL), KVR_EINVAL);

    /* reset clears the error */
    kvr_json_writer_reset(&w);
    kvr_json_null(&w);
    assert_string_equal(doc(&w), "null");
    kvr_json_writer_deinit(&w);
}

static void test_error_body(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_error(&w, "tokens[3]: not an integer in [0, 4294967295]", "invalid_request_error",
                   400);
    assert_string_equal(doc(&w), "{\"error\":{\"message\":\"tokens[3]: not an integer in "
                                 "[0, 4294967295]\",\"type\":\"invalid_request_error\","
                                 "\"code\":400}}");
    kvr_json_writer_reset(&w);
    kvr_json_error(&w, "say \"hi\"\n", NULL, 503);
    assert_string_equal(doc(&w), "{\"error\":{\"message\":\"say \\\"hi\\\"\\n\",\"type\":null,"
                                 "\"code\":503}}");
    kvr_json_writer_deinit(&w);
}

static void test_reuse(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    /* a large document, then small ones: the buffer is kept and not moved */
    kvr_json_begin_array(&w);
    for (uint64_t i = 0; i < 100000; i++)
        kvr_json_u64(&w, i * 7919);
    kvr_json_end_array(&w);
    const char *big = doc(&w);
    assert_true(strlen(big) > 500000);
    for (int round = 0; round < 3; round++) {
        kvr_json_writer_reset(&w);
        kvr_json_begin_object(&w);
        kvr_json_key(&w, "n");
        kvr_json_u64(&w, (uint64_t)round);
        kvr_json_end_object(&w);
        const char *small = doc(&w);
        assert_ptr_equal(small, big);
        char want[32];
        snprintf(want, sizeof want, "{\"n\":%d}", round);
        assert_string_equal(small, want);
    }
    kvr_json_writer_deinit(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_integers),
        cmocka_unit_test(test_doubles),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_error_body),
        cmocka_unit_test(test_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

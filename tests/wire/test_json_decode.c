/*
 * test_json_decode.c: the shared JSON decoding plumbing (wire/json_decode.c): exact integers
 * from number text (fractions, exponents, "-0", u64 overflow, ranges), finite doubles (long
 * text through the scratch buffer), the strict UTF-8 and control-character checks, clipped
 * user text, the first-error-wins record, and yajl error messages with their byte offsets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/json_decode.h"

static bool u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    return kvr_jd_parse_u64(s, strlen(s), lo, hi, out);
}

static void test_integers(void **state)
{
    (void)state;
    uint64_t v = 1;
    bool neg = true;
    assert_true(kvr_jd_parse_int("-0", 2, &v, &neg));
    assert_int_equal(v, 0);
    assert_false(neg);
    assert_true(kvr_jd_parse_int("-12", 3, &v, &neg));
    assert_int_equal(v, 12);
    assert_true(neg);
    assert_true(u64("0", 0, UINT64_MAX, &v));
    assert_true(u64("-0", 0, 0, &v));
    assert_int_equal(v, 0);
    assert_true(u64("18446744073709551615", 0, UINT64_MAX, &v));
    assert_true(v == UINT64_MAX);
    assert_false(u64("18446744073709551616", 0, UINT64_MAX, &v));
    assert_false(u64("99999999999999999999", 0, UINT64_MAX, &v));
    assert_false(u64("1.0", 0, UINT64_MAX, &v));
    assert_false(u64("1e3", 0, UINT64_MAX, &v));
    assert_false(u64("1E3", 0, UINT64_MAX, &v));
    assert_false(u64("-1", 0, UINT64_MAX, &v));
    assert_false(u64("-", 0, UINT64_MAX, &v));
    assert_false(u64("", 0, UINT64_MAX, &v));
    assert_true(u64("4294967295", 0, UINT32_MAX, &v));
    assert_false(u64("4294967296", 0, UINT32_MAX, &v));
    assert_false(u64("0", 1, 10, &v));
    assert_true(u64("10", 1, 10, &v));
    assert_false(u64("11", 1, 10, &v));
}

static void test_doubles(void **state)
{
    (void)state;
    char *scratch = NULL;
    size_t cap = 0;
    double x = 0;
    assert_int_equal(kvr_jd_parse_double("0.5", 3, &scratch, &cap, &x), KVR_OK);
    assert_true(x == 0.5);
    assert_int_equal(kvr_jd_parse_double("-1e3", 4, &scratch, &cap, &x), KVR_OK);
    assert_true(x == -1000.0);
    assert_int_equal(kvr_jd_parse_double("1e400", 5, &scratch, &cap, &x), KVR_EINVAL);
    assert_int_equal(kvr_jd_parse_double("-1e400", 6, &scratch, &cap, &x), KVR_EINVAL);
    assert_null(scratch);  /* short text never touches the scratch */
    char longnum[200];
    memset(longnum, '0', sizeof longnum);
    longnum[0] = '1';
    longnum[1] = '.';
    assert_int_equal(kvr_jd_parse_double(longnum, sizeof longnum, &scratch, &cap, &x), KVR_OK);
    assert_true(x == 1.0);
    assert_non_null(scratch);
    assert_true(cap >= sizeof longnum + 1);
    /* only the given bytes are read: "2.5" out of "2.5junk" */
    assert_int_equal(kvr_jd_parse_double("2.5junk", 3, &scratch, &cap, &x), KVR_OK);
    assert_true(x == 2.5);
    free(scratch);
}

static const char *problem(const char *s, size_t n)
{
    return kvr_jd_text_problem((const unsigned char *)s, n);
}

static void test_text(void **state)
{
    (void)state;
    assert_null(problem("plain", 5));
    assert_null(problem("", 0));
    assert_null(problem("caf\xc3\xa9", 5));
    assert_null(problem("\xf4\x8f\xbf\xbf", 4));               /* U+10FFFF */
    assert_string_equal(problem("a\tb", 3), "contains a control character");
    assert_string_equal(problem("a\x7f", 2), "contains a control character");
    assert_string_equal(problem("\xc0\x80", 2), "is not valid UTF-8");  /* overlong NUL */
    assert_string_equal(problem("\xed\xa0\x80", 3), "is not valid UTF-8");  /* surrogate */
    assert_string_equal(problem("\xf4\x90\x80\x80", 4), "is not valid UTF-8");  /* > 10FFFF */
    /* a control character wins even after invalid UTF-8 */
    assert_string_equal(problem("\xc0\x80\x01", 3), "contains a control character");
    assert_true(kvr_jd_utf8_ok((const unsigned char *)"a\tb", 3));
    assert_false(kvr_jd_utf8_ok((const unsigned char *)"\xc0\x80", 2));
    assert_true(kvr_jd_blank(" \t\r\n", 4));
    assert_true(kvr_jd_blank(NULL, 0));
    assert_false(kvr_jd_blank(" x", 2));
}

static void test_clip(void **state)
{
    (void)state;
    char out[KVR_JD_CLIP_BYTES];
    kvr_jd_clip(out, sizeof out, (const unsigned char *)"a\"b\\c\n\xc3\xa9", 8);
    assert_string_equal(out, "a?b?c???");
    char forty[41];
    memset(forty, 'x', 40);
    forty[40] = '\0';
    kvr_jd_clip(out, sizeof out, (const unsigned char *)forty, 40);
    assert_string_equal(out, forty);
    char longer[60];
    memset(longer, 'y', sizeof longer);
    kvr_jd_clip(out, sizeof out, (const unsigned char *)longer, sizeof longer);
    assert_int_equal(strlen(out), 40);
    assert_string_equal(out + 37, "...");
    char tiny[4];
    kvr_jd_clip(tiny, sizeof tiny, (const unsigned char *)"abcdef", 6);
    assert_string_equal(tiny, "abc");
}

static void test_fail(void **state)
{
    (void)state;
    int status = KVR_OK;
    char err[16] = "";
    assert_int_equal(kvr_jd_fail(&status, err, sizeof err, KVR_EINVAL, "first %d", 1), 0);
    assert_int_equal(status, KVR_EINVAL);
    assert_string_equal(err, "first 1");
    kvr_jd_fail(&status, err, sizeof err, KVR_ENOMEM, "second");
    assert_int_equal(status, KVR_EINVAL);
    assert_string_equal(err, "first 1");
    status = KVR_OK;
    kvr_jd_fail(&status, err, sizeof err, KVR_EPARSE, "a message longer than the buffer");
    assert_int_equal(strlen(err), sizeof err - 1);
    status = KVR_OK;
    kvr_jd_fail(&status, NULL, 0, KVR_EPARSE, "nowhere");
    assert_int_equal(status, KVR_EPARSE);
}

/* Parses text in one piece (or two, split at cut) and returns kvr_jd_yajl_finish's result. */
static yajl_status run(const char *text, size_t cut, char *msg, size_t msg_len)
{
    static const yajl_callbacks none;
    kvr_yajl_arena_t a;
    kvr_yajl_arena_init(&a);
    yajl_handle h = kvr_jd_yajl_open(&a, &none, NULL);
    assert_non_null(h);
    size_t len = strlen(text);
    yajl_status st = yajl_status_ok;
    size_t base = 0;
    if (cut > 0 && cut < len) {
        st = yajl_parse(h, (const unsigned char *)text, cut);
        base = cut;
    }
    if (st == yajl_status_ok)
        st = yajl_parse(h, (const unsigned char *)text + base, len - base);
    st = kvr_jd_yajl_finish(h, st, base, len, msg, msg_len);
    yajl_free(h);
    kvr_yajl_arena_deinit(&a);
    return st;
}

static void test_yajl_messages(void **state)
{
    (void)state;
    char msg[KVR_JD_MSG_BYTES];
    assert_int_equal(run("{\"a\": [1, 2]}", 0, msg, sizeof msg), yajl_status_ok);
    assert_string_equal(msg, "");
    assert_int_equal(run("{\"a\" 1}", 0, msg, sizeof msg), yajl_status_error);
    assert_string_equal(msg, "invalid JSON at byte 6: parse error: object key and value must "
                             "be separated by a colon (':')");
    assert_int_equal(run("[1, 2", 0, msg, sizeof msg), yajl_status_error);
    assert_string_equal(msg, "invalid JSON at byte 5: parse error: premature EOF");
    assert_int_equal(run("[1] x", 0, msg, sizeof msg), yajl_status_error);
    assert_string_equal(msg, "invalid JSON at byte 5: parse error: trailing garbage");
    /* the same offset when the text came in two pieces (the last one starting at base) */
    assert_int_equal(run("[1, 2, @]", 0, msg, sizeof msg), yajl_status_error);
    assert_string_equal(msg, "invalid JSON at byte 8: lexical error: invalid char in json text.");
    assert_int_equal(run("[1, 2, @]", 4, msg, sizeof msg), yajl_status_error);
    assert_string_equal(msg, "invalid JSON at byte 8: lexical error: invalid char in json text.");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integers), cmocka_unit_test(test_doubles),
        cmocka_unit_test(test_text),     cmocka_unit_test(test_clip),
        cmocka_unit_test(test_fail),     cmocka_unit_test(test_yajl_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

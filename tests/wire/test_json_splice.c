/*
 * test_json_splice.c: the member splicer (wire/json_splice.c): objects with and without the
 * dropped member, whitespace, strings holding braces, quotes and escapes, nested objects,
 * escaped keys, and refusals of everything that is not exactly one valid object (truncated,
 * malformed, arrays, trailing bytes, too deep, bad UTF-8), which must write nothing. Every
 * success is parsed back with yajl_tree as an independent check that it is valid JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <yajl/yajl_tree.h>

#include "wire/json_splice.h"

#define MEMBER "\"nvext\":{\"worker_id\":{\"decode_worker_id\":7}}"

static char out[1 << 16];

/* The splice of in (drop "nvext", add MEMBER), checked to be valid JSON. */
static const char *ok(const char *in)
{
    size_t n = 12345;
    int rc = kvr_json_splice(in, strlen(in), "nvext", MEMBER, strlen(MEMBER), out, sizeof out - 1,
                             &n);
    if (rc != KVR_OK)
        fail_msg("refused %s: %d", in, rc);
    assert_true(n <= KVR_JSON_SPLICE_OUT_BYTES(strlen(in), strlen(MEMBER)));
    out[n] = '\0';
    char err[256];
    yajl_val v = yajl_tree_parse(out, err, sizeof err);
    if (v == NULL)
        fail_msg("not JSON: %s (%s)", out, err);
    static const char *path[] = {"nvext", "worker_id", "decode_worker_id", NULL};
    yajl_val id = yajl_tree_get(v, path, yajl_t_number);
    assert_non_null(id);
    assert_int_equal(YAJL_GET_INTEGER(id), 7);
    yajl_tree_free(v);
    return out;
}

static void refused_n(const char *in, size_t len)
{
    size_t n = 12345;
    memset(out, 'x', 64);
    int rc = kvr_json_splice(in, len, "nvext", MEMBER, strlen(MEMBER), out, sizeof out, &n);
    if (rc != KVR_EPARSE)
        fail_msg("accepted %.*s: %d", (int)len, in, rc);
    assert_int_equal(n, 0);
    for (int i = 0; i < 64; i++)
        assert_int_equal(out[i], 'x'); /* nothing written */
}

static void refused(const char *in) { refused_n(in, strlen(in)); }

static void test_plain(void **state)
{
    (void)state;
    assert_string_equal(ok("{\"a\":1}"), "{\"a\":1," MEMBER "}");
    assert_string_equal(ok("{}"), "{" MEMBER "}");
    assert_string_equal(ok("{ }"), "{ " MEMBER "}");
    /* inner whitespace kept byte for byte, outer dropped */
    assert_string_equal(ok("  {\"a\" : 1 ,\n \"b\":[1, 2]\t}\r\n"),
                        "{\"a\" : 1 ,\n \"b\":[1, 2]\t," MEMBER "}");
    assert_string_equal(ok("{\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"hi\"}]}"),
                        "{\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"hi\"}]," MEMBER
                        "}");
}

static void test_drop_existing(void **state)
{
    (void)state;
    assert_string_equal(ok("{\"a\":1,\"nvext\":{\"x\":2},\"b\":2}"),
                        "{\"a\":1,\"b\":2," MEMBER "}");
    assert_string_equal(ok("{\"nvext\":null}"), "{" MEMBER "}");
    assert_string_equal(ok("{\"nvext\":1, \"nvext\" : 2}"), "{" MEMBER "}");
    assert_string_equal(ok("{ \"nvext\":1 , \"a\" : [ ] }"), "{\"a\" : [ ]," MEMBER "}");
    /* escaped keys read as a parser reads them */
    assert_string_equal(ok("{\"nv\\u0065xt\":1,\"a\":2}"), "{\"a\":2," MEMBER "}");
    /* a nested nvext is not the top-level one: untouched */
    assert_string_equal(ok("{\"a\":{\"nvext\":1}}"), "{\"a\":{\"nvext\":1}," MEMBER "}");
    /* nvext inside a string value is not a key */
    assert_string_equal(ok("{\"a\":\"\\\"nvext\\\":1\"}"), "{\"a\":\"\\\"nvext\\\":1\"," MEMBER "}");
    /* near misses are kept */
    assert_string_equal(ok("{\"nvextx\":1,\"nvex\":2}"), "{\"nvextx\":1,\"nvex\":2," MEMBER "}");
}

static void test_strings(void **state)
{
    (void)state;
    assert_string_equal(ok("{\"t\":\"}{][\"}"), "{\"t\":\"}{][\"," MEMBER "}");
    assert_string_equal(ok("{\"t\":\"a\\\"}\\\\\"}"), "{\"t\":\"a\\\"}\\\\\"," MEMBER "}");
    assert_string_equal(ok("{\"t\":\"\\u00e9\\n\\/\"}"), "{\"t\":\"\\u00e9\\n\\/\"," MEMBER "}");
    assert_string_equal(ok("{\"t\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}"),
                        "{\"t\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"," MEMBER "}");
}

/* {"a":[[...]]} with the arrays `arrays` deep */
static const char *nested(int arrays)
{
    static char b[1024];
    size_t o = (size_t)snprintf(b, sizeof b, "{\"a\":");
    for (int i = 0; i < arrays; i++)
        b[o++] = '[';
    for (int i = 0; i < arrays; i++)
        b[o++] = ']';
    b[o++] = '}';
    b[o] = '\0';
    return b;
}

static void test_nested_and_values(void **state)
{
    (void)state;
    ok("{\"a\":{\"b\":{\"c\":[1,{\"d\":[]},\"}\"]}},\"e\":-0.5e+3,\"f\":true,\"g\":false,"
       "\"h\":null,\"i\":0,\"j\":1E9,\"k\":-12}");
    ok(nested(KVR_JSON_SPLICE_MAX_DEPTH - 1));     /* the object itself is one level */
    refused(nested(KVR_JSON_SPLICE_MAX_DEPTH));
    refused(nested(200));
}

static void test_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", " ", "{", "}", "{\"a\":1", "{\"a\":1,", "{\"a\":", "{\"a\"", "{\"a", "[1]",
        "\"s\"", "1", "null", "{\"a\":1}{}", "{\"a\":1} x", "{\"a\":1,}", "{,\"a\":1}",
        "{\"a\" 1}", "{a:1}", "{'a':1}", "{\"a\":01}", "{\"a\":-}", "{\"a\":1.}",
        "{\"a\":.5}", "{\"a\":1e}", "{\"a\":+1}", "{\"a\":tru}", "{\"a\":truex}",
        "{\"a\":nul}", "{\"a\":[1,]}", "{\"a\":[1 2]}", "{\"a\":{\"b\"}}", "{\"a\":\"x}",
        "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":\"\t\"}",
        "{\"a\":\"\xc3\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}",
        "{\"a\":\"x\\\"}", "{\"a\":1}}", "{\"a\":[}", "{\"a\":1 \"b\":2}", "{\"a\":NaN}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(bad[i]);
    refused_n("{\"a\":1}\0", 8);
    refused_n("{\"a\":\"\0\"}", 8);
}

static void test_args(void **state)
{
    (void)state;
    const char *in = "{\"a\":1}";
    size_t n = 99, need = KVR_JSON_SPLICE_OUT_BYTES(strlen(in), strlen(MEMBER));
    assert_int_equal(kvr_json_splice(in, strlen(in), "nvext", MEMBER, strlen(MEMBER), out,
                                     need - 1, &n),
                     KVR_EINVAL);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_json_splice(in, strlen(in), "nvext", MEMBER, strlen(MEMBER), NULL, 0, &n),
                     KVR_EINVAL);
    assert_int_equal(kvr_json_splice(in, strlen(in), "nvext", MEMBER, strlen(MEMBER), out, need,
                                     &n),
                     KVR_OK);
    /* no drop name: an existing nvext stays (the caller asked for nothing to go) */
    in = "{\"nvext\":1}";
    assert_int_equal(kvr_json_splice(in, strlen(in), NULL, "\"x\":2", 5, out, sizeof out, &n),
                     KVR_OK);
    assert_int_equal(n, strlen("{\"nvext\":1,\"x\":2}"));
    assert_memory_equal(out, "{\"nvext\":1,\"x\":2}", n);
    /* an empty member adds nothing: the object without the dropped members */
    assert_int_equal(kvr_json_splice(in, strlen(in), "nvext", "", 0, out, sizeof out, &n),
                     KVR_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(out, "{}", 2);
    in = "{\"a\":1}";
    assert_int_equal(kvr_json_splice(in, strlen(in), "nvext", "", 0, out, sizeof out, &n), KVR_OK);
    assert_memory_equal(out, "{\"a\":1}", n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),          cmocka_unit_test(test_drop_existing),
        cmocka_unit_test(test_strings),        cmocka_unit_test(test_nested_and_values),
        cmocka_unit_test(test_refused),        cmocka_unit_test(test_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_tokenize_answer.c: a worker's /tokenize answer read for its ids (wire/tokenize_answer.c):
 * vLLM's and SGLang's shapes, any valid formatting (the fast scanner and the slow path agree),
 * the limit (KVR_ETOOBIG naming "tokens:"), and every malformed answer refused with a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/tokenize_answer.h"

static uint32_t *buf;
static size_t cap;

static int dec(const char *s, size_t max, size_t *n, char *err)
{
    return kvr_tokenize_answer_decode(s, strlen(s), max, &buf, &cap, n, err, 160);
}

static void test_shapes(void **st)
{
    (void)st;
    size_t n;
    char err[160];
    /* vLLM */
    assert_int_equal(dec("{\"count\":3,\"max_model_len\":4096,\"tokens\":[1,22,333],"
                         "\"token_strs\":null}",
                         100, &n, err),
                     KVR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(buf[2], 333);
    /* SGLang, whitespace everywhere, the largest id */
    assert_int_equal(dec(" {\n \"tokens\" : [ 4294967295 ,\t0 ] , \"count\": 2 }\n", 100, &n, err),
                     KVR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(buf[0], 4294967295u);
    assert_int_equal(buf[1], 0);
    assert_int_equal(dec("{\"tokens\":[]}", 100, &n, err), KVR_OK);
    assert_int_equal(n, 0);
    /* other members may hold anything valid, nested */
    assert_int_equal(
        dec("{\"x\":{\"tokens\":\"no\"},\"tokens\":[7],\"y\":[[1.5e3,null]]}", 100, &n, err),
        KVR_OK);
    assert_int_equal(n, 1);
    assert_int_equal(buf[0], 7);
    /* an escaped key is the same key */
    assert_int_equal(dec("{\"tok\\u0065ns\":[9]}", 100, &n, err), KVR_OK);
    assert_int_equal(buf[0], 9);
}

static void test_limit(void **st)
{
    (void)st;
    size_t n;
    char err[160];
    assert_int_equal(dec("{\"tokens\":[1,2,3]}", 3, &n, err), KVR_OK);
    assert_int_equal(dec("{\"tokens\":[1,2,3,4]}", 3, &n, err), KVR_ETOOBIG);
    assert_memory_equal(err, "tokens:", 7);
    assert_int_equal(dec("{\"tokens\":[1, 2, 3 ,4]}", 3, &n, err), KVR_ETOOBIG);
}

static void test_refused(void **st)
{
    (void)st;
    const char *bad[] = {
        "",
        "[1,2]",
        "{\"tokens\":[1,2]",
        "{\"tokens\":[1,2]} x",
        "{\"count\":2}",
        "{\"tokens\":\"1,2\"}",
        "{\"tokens\":[1,-2]}",
        "{\"tokens\":[1.0]}",
        "{\"tokens\":[1e3]}",
        "{\"tokens\":[01]}",
        "{\"tokens\":[4294967296]}",
        "{\"tokens\":[1,]}",
        "{\"tokens\":[1 2]}",
        "{\"tokens\":[null]}",
        "{\"tokens\":[1],\"tokens\":[2]}",
        "{\"tokens\":[1],}",
        "{\"a\":\"\x01\",\"tokens\":[1]}",
        "{\"a\":\"\xff\",\"tokens\":[1]}",
        "{tokens:[1]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = 99;
        char err[160] = "";
        int rc = dec(bad[i], 100, &n, err);
        if (rc != KVR_EPARSE)
            fail_msg("%s: %s", bad[i], kvr_strerror(rc));
        assert_true(strlen(err) > 0);
        (void)n;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(buf);
    return rc;
}

/*
 * test_http_head.c: the request-head scanner (wire/http_head.c): CRLF and bare-LF heads, a
 * body after the head, a head fed one byte at a time, CRs between the LFs, a leading LF, and
 * a stream with no end yet (everything consumed, not done).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wire/http_head.h"

/* The head's length in s fed whole, or 0 when it has no end. */
static size_t end_whole(const char *s)
{
    kvr_http_head_t h = KVR_HTTP_HEAD_INIT;
    bool done;
    size_t n = kvr_http_head_scan(&h, (const uint8_t *)s, strlen(s), &done);
    return done ? n : 0;
}

/* The same, fed one byte at a time. */
static size_t end_bytewise(const char *s)
{
    kvr_http_head_t h = KVR_HTTP_HEAD_INIT;
    for (size_t i = 0; s[i] != '\0'; i++) {
        bool done;
        size_t n = kvr_http_head_scan(&h, (const uint8_t *)s + i, 1, &done);
        assert_int_equal(n, 1);
        if (done)
            return i + 1;
    }
    return 0;
}

static void test_ends(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t end;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27},
        {"GET / HTTP/1.1\r\nHost: x\r\n\r\n{\"a\":1}", 27},
        {"GET / HTTP/1.0\nA: b\n\nbody", 21},
        {"GET / HTTP/1.1\r\nA: b\n\r\n", 23},
        {"GET / HTTP/1.1\r\nA: b\r\n\r\r\n", 25},
        {"\nGET / HTTP/1.1\r\n\r\n", 19},
        {"\r\n\r\n", 4},
        {"GET / HTTP/1.1\r\nHost: x\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: x\r\n\r", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(end_whole(cases[i].in), cases[i].end);
        assert_int_equal(end_bytewise(cases[i].in), cases[i].end);
    }
}

static void test_unfinished_consumes_all(void **state)
{
    (void)state;
    kvr_http_head_t h = KVR_HTTP_HEAD_INIT;
    bool done = true;
    const char *s = "POST /v1/route HTTP/1.1\r\nX-Big: aaaaaaaa";
    assert_int_equal(kvr_http_head_scan(&h, (const uint8_t *)s, strlen(s), &done), strlen(s));
    assert_false(done);
    assert_int_equal(kvr_http_head_scan(&h, (const uint8_t *)"\r\n\r\nxy", 6, &done), 4);
    assert_true(done);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ends),
        cmocka_unit_test(test_unfinished_consumes_all),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

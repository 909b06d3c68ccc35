/*
 * test_client.c: http/client.h without a server: a request's head, the endpoint's parse, and
 * responses read from a socketpair (whole by Content-Length, until close, cut at a maximum,
 * in pieces; a head that is not HTTP; a header looked up without case).
 * Threads: one (the peer's bytes are written before they are read). Cost: milliseconds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "http/client.h"
#include "kvrouter.h"

/* fds[0] reads what was written to fds[1]; closed after writing when close_after. */
static void peer(int fds[2], const char *bytes, bool close_after)
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    size_t n = strlen(bytes);
    assert_true(kvr_http_send_all(fds[1], bytes, n));
    if (close_after) {
        close(fds[1]);
        fds[1] = -1;
    }
}

static void done(int fds[2], kvr_http_resp_t *r)
{
    close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    kvr_http_resp_free(r);
}

static void test_head(void **state)
{
    (void)state;
    char h[256];
    size_t n = kvr_http_head(h, sizeof h, "POST", "/v1/completions", "127.0.0.1",
                             "application/json", 12, false);
    assert_string_equal(h, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Content-Type: application/json\r\nContent-Length: 12\r\n\r\n");
    assert_int_equal(n, strlen(h));
    n = kvr_http_head(h, sizeof h, "GET", "/ready", "h:1", NULL, 0, true);
    assert_string_equal(h, "GET /ready HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\n\r\n");
    assert_int_equal(kvr_http_head(h, 8, "GET", "/ready", "h", NULL, 0, true), 0);
}

static void test_target(void **state)
{
    (void)state;
    kvr_http_target_t t;
    char err[200];
    assert_int_equal(kvr_http_target_parse("http://[::1]:8080/base/", &t, err, sizeof err),
                     KVR_OK);
    assert_string_equal(t.host, "::1");
    assert_string_equal(t.host_hdr, "[::1]:8080");
    assert_string_equal(t.base_path, "/base");
    assert_int_equal(t.port, 8080);
    assert_int_not_equal(kvr_http_target_parse("ftp://x", &t, err, sizeof err), KVR_OK);
}

static void test_whole_by_length(void **state)
{
    (void)state;
    int fds[2];
    kvr_http_resp_t r = {0};
    peer(fds, "HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\nX-A:  b \r\n\r\nhelloEXTRA", false);
    assert_int_equal(kvr_http_read_whole(fds[0], &r, 1 << 20, 1000), KVR_OK);
    assert_int_equal(r.status, 404);
    assert_string_equal(r.buf + r.body_at, "hello");
    size_t n;
    const char *v = kvr_http_header(&r, "x-a", &n);
    assert_non_null(v);
    assert_int_equal(n, 1);
    assert_memory_equal(v, "b", 1);
    assert_null(kvr_http_header(&r, "X-Missing", &n));
    done(fds, &r);
}

static void test_until_close_and_cut(void **state)
{
    (void)state;
    int fds[2];
    kvr_http_resp_t r = {0};
    peer(fds, "HTTP/1.0 200 OK\r\n\r\nline1\nline2\n", true);
    assert_int_equal(kvr_http_read_whole(fds[0], &r, 1 << 20, 1000), KVR_OK);
    assert_string_equal(r.buf + r.body_at, "line1\nline2\n");
    assert_true(r.closed);
    assert_false(r.truncated);
    done(fds, &r);
    peer(fds, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789", false);
    assert_int_equal(kvr_http_read_whole(fds[0], &r, 4, 1000), KVR_OK);
    assert_true(r.truncated);
    assert_string_equal(r.buf + r.body_at, "0123");
    done(fds, &r);
}

static void test_short_and_bad(void **state)
{
    (void)state;
    int fds[2];
    kvr_http_resp_t r = {0};
    peer(fds, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", true);
    assert_int_equal(kvr_http_read_whole(fds[0], &r, 1 << 20, 1000), KVR_EIO);
    assert_true(r.closed);
    done(fds, &r);
    peer(fds, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", false);
    assert_int_equal(kvr_http_read_whole(fds[0], &r, 1 << 20, 50), KVR_EIO); /* timed out */
    assert_false(r.closed);
    done(fds, &r);
    peer(fds, "SSH-2.0-OpenSSH\r\n\r\n", true);
    assert_int_equal(kvr_http_read_whole(fds[0], &r, 1 << 20, 1000), KVR_EPARSE);
    done(fds, &r);
}

static void test_pieces_and_reuse(void **state)
{
    (void)state;
    int fds[2];
    kvr_http_resp_t r = {0};
    peer(fds, "HTTP/1.1 200 OK\r\n", false);
    assert_int_equal(kvr_http_recv(fds[0], &r), KVR_OK);
    assert_int_equal(r.body_at, 0);
    assert_int_equal(r.status, 0);
    assert_true(kvr_http_send_all(fds[1], "\r\ndata: x\n\n", 11));
    assert_int_equal(kvr_http_recv(fds[0], &r), KVR_OK);
    assert_int_equal(r.status, 200);
    assert_non_null(kvr_http_find(r.buf + r.body_at, r.len - r.body_at, "data: "));
    kvr_http_resp_reset(&r);
    assert_int_equal(r.len, 0);
    assert_int_equal(r.body_at, 0);
    assert_true(kvr_http_send_all(fds[1], "HTTP/1.1 503 X\r\n\r\n", 18));
    assert_int_equal(kvr_http_recv(fds[0], &r), KVR_OK);
    assert_int_equal(r.status, 503);
    done(fds, &r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head),
        cmocka_unit_test(test_target),
        cmocka_unit_test(test_whole_by_length),
        cmocka_unit_test(test_until_close_and_cut),
        cmocka_unit_test(test_short_and_bad),
        cmocka_unit_test(test_pieces_and_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

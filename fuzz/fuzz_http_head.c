/*
 * fuzz_http_head.c: libFuzzer target for the request-head scanner (wire/http_head.c), which
 * reads bytes from any client before evhttp does. Byte 0 seeds the split of the rest into
 * pieces (1 to 16 bytes each); the pieces are fed one by one.
 *
 * Invariants checked: the end found in pieces equals the end found in one call and the end a
 * naive search finds (the first LF whose preceding non-CR byte is a LF); no piece reports
 * more bytes than it holds.
 * Memory: stack only. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "wire/http_head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* The head's length by definition, or 0 when it does not end in p. */
static size_t naive(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n')
            continue;
        size_t j = i;
        while (j > 0 && p[j - 1] == '\r')
            j--;
        if (j > 0 && p[j - 1] == '\n')
            return i + 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned seed = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    kvr_http_head_t whole = KVR_HTTP_HEAD_INIT;
    bool done_whole;
    size_t used = kvr_http_head_scan(&whole, p, n, &done_whole);
    size_t expect = naive(p, n);
    check(done_whole == (expect != 0));
    check(done_whole ? used == expect : used == n);
    kvr_http_head_t h = KVR_HTTP_HEAD_INIT;
    size_t at = 0, end = 0;
    while (at < n && end == 0) {
        seed = seed * 1103515245u + 12345u;
        size_t len = 1 + (seed >> 16) % 16;
        if (len > n - at)
            len = n - at;
        bool done;
        size_t k = kvr_http_head_scan(&h, p + at, len, &done);
        check(k <= len && (done || k == len));
        at += k;
        if (done)
            end = at;
    }
    check(end == expect);
    return 0;
}

/*
 * http_head.c: see http_head.h. A three-state scanner; memchr-free because a head is short
 * (it is bounded by http_max_header_bytes) and every byte's state matters.
 */
#include "wire/http_head.h"

size_t kvr_http_head_scan(kvr_http_head_t *h, const uint8_t *p, size_t n, bool *done)
{
    *done = false;
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = p[i];
        if (ch == '\n') {
            if (h->eol != 0) {
                *done = true;
                h->eol = 0;
                return i + 1;
            }
            h->eol = 1;
        } else if (ch == '\r') {
            if (h->eol == 1)
                h->eol = 2;
        } else {
            h->eol = 0;
        }
    }
    return n;
}

/*
 * http_head.h: finds where an HTTP/1.x request head (request line and headers) ends in a byte
 * stream that arrives in pieces. The head ends at its first empty line: a LF preceded, after
 * any CRs, by another LF ("\n\n", "\r\n\r\n", "\n\r\n"); a LF first in the stream does not end
 * it. The connection guard (http/http_guard.c) uses it to bound a head's size and time before
 * evhttp parses it.
 * Invariants: feeding a stream in any split gives the same end as feeding it whole.
 * Memory: none (the state is one byte). Threads: any. Cost: O(bytes scanned).
 */
#ifndef KVR_WIRE_HTTP_HEAD_H
#define KVR_WIRE_HTTP_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_http_head {
    uint8_t eol; /* 0 inside a line, 1 just after a LF, 2 after a LF and CRs */
} kvr_http_head_t;

#define KVR_HTTP_HEAD_INIT {0}

/* Scans p[0..n): returns how many bytes belong to the head (all n unless it ends among them,
 * then up to and including its final LF, with *done set). */
size_t kvr_http_head_scan(kvr_http_head_t *h, const uint8_t *p, size_t n, bool *done);

#endif

/*
 * http_guard.h: the limits every client connection of an evhttp server lives under, and the
 * listening socket that feeds it. libevent 2.1's evhttp has no connection cap, no deadline
 * for a request's head or body (a client sending one byte a minute holds its connection and
 * buffers forever), answers its own errors with HTML pages, and retries a failed accept() at
 * once and logs each failure (out of file descriptors, that spins a core and writes hundreds
 * of MB of log). The guard closes those gaps from outside evhttp:
 *   - it owns the listener: an accept() failure pauses it 100 ms, counted and logged with a
 *     rate limit, while open connections go on being served;
 *   - each connection's bufferevent (made here: evhttp_set_bevcb) has a callback on its input
 *     buffer that sees every byte as it arrives: it finds the end of each request head,
 *     refuses a head above max_header_bytes with 431, and keeps one deadline per connection: the head must arrive within
 *     header_timeout_ms (408), the body within body_timeout_ms of the head (408), and a
 *     kept-alive connection may sit idle between requests for idle_timeout_ms (then closed);
 *   - beyond max_connections a new connection is answered 503 and closed;
 *   - an answer evhttp writes on its own (a malformed request, a body over the limit, a method
 *     it does not allow) is replaced by the same status with a JSON body in the OpenAI error
 *     shape;
 *   - drain (graceful shutdown) closes the listener and the idle connections, and closes each
 *     busy one once its answer is complete.
 * Requests reach the handler given to kvr_http_guard_new, which replaces evhttp's gencb.
 * Invariants: open == the connections accepted and not yet released (evhttp freed the
 * connection and the 100 ms sweep saw it); a connection is in exactly one
 * phase (fresh, idle, head, body, busy, refused, closing); a deadline is pending in every
 * phase but busy, refused-after-answer and closing.
 * Threads: the loop's thread only. Cost: O(1) per callback; the head's bytes are scanned once
 * (at most max_header_bytes per request), the body's are moved by evbuffer chain, not copied.
 */
#ifndef KVR_HTTP_GUARD_H
#define KVR_HTTP_GUARD_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evhttp;
struct evhttp_request;
struct kvr_prom;

typedef struct kvr_http_limits {
    uint32_t max_connections;  /* open at once; beyond: 503 and close */
    uint64_t max_header_bytes; /* request line + headers; beyond: 431 and close */
    uint64_t max_body_bytes;   /* named in the 413 that replaces evhttp's page */
    uint64_t header_timeout_ms; /* from the first byte of a request (or the accept) to its head */
    uint64_t body_timeout_ms;   /* from the head to the end of the body */
    uint64_t idle_timeout_ms;   /* a kept-alive connection between requests */
    const char *methods;        /* named in the 501 for others ("GET and POST"); NULL: "GET,
                                   POST and DELETE" */
} kvr_http_limits_t;

typedef struct kvr_http_guard_stats {
    uint64_t open;             /* connections now */
    uint64_t accepted;         /* connections ever */
    uint64_t refused;          /* answered 503: over max_connections or draining */
    uint64_t accept_errors;    /* accept() failures (EMFILE, ENFILE, ...) */
    uint64_t header_too_large; /* 431 */
    uint64_t body_too_large;   /* 413 */
    uint64_t timeout_header, timeout_body, timeout_idle;
    uint64_t rewritten;        /* evhttp's own error pages answered in JSON instead */
} kvr_http_guard_stats_t;

typedef struct kvr_http_guard kvr_http_guard_t;
typedef void (*kvr_http_handler_fn)(struct evhttp_request *req, void *arg);

/* Sets http's gencb (to handler), bevcb, header size limit and body size limit. name labels
 * the log lines and metrics ("client", "admin"). NULL when out of memory. */
kvr_http_guard_t *kvr_http_guard_new(struct event_base *base, struct evhttp *http,
                                     const char *name, const kvr_http_limits_t *lim,
                                     kvr_http_handler_fn handler, void *arg);
/* Listens on host:port (port 0: any free one; *bound receives it). KVR_OK, KVR_EINVAL (host
 * does not resolve), KVR_EIO (cannot listen) or KVR_EFULL (more than 16 guards listening). */
int kvr_http_guard_listen(kvr_http_guard_t *g, const char *host, uint16_t port,
                          uint16_t *bound);
/* Graceful shutdown: stop listening, close idle connections now and busy ones once their
 * answer is out. */
void kvr_http_guard_drain(kvr_http_guard_t *g);
/* Connections with a request being answered. */
uint64_t kvr_http_guard_busy(const kvr_http_guard_t *g);
void kvr_http_guard_stats(const kvr_http_guard_t *g, kvr_http_guard_stats_t *out);
/* Appends the guard's families, labelled listener="<name>". Families are written once per
 * call: call kvr_http_guard_metrics_all with every guard of a server. */
void kvr_http_guard_metrics_all(kvr_http_guard_t *const *gs, size_t n, struct kvr_prom *p);
/* Checks the invariants above (and the fd table against the connection list): KVR_OK or
 * KVR_EINVAL. O(connections + largest fd); the sweep asserts it in debug builds. */
int kvr_http_guard_verify(const kvr_http_guard_t *g);
/* Frees the guard and what it still holds; call after evhttp_free. */
void kvr_http_guard_free(kvr_http_guard_t *g);

#endif

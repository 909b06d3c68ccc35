/*
 * peer_fetch.h: a joining replica's index snapshot fetched off the serving loop
 * (peer_fetch.c). The peers are asked in order, on a thread of its own, until one answers 200
 * with a snapshot; the bytes are handed back on the loop. Meanwhile the router serves, cold, so
 * two replicas started together never wait on each other (each answers the other's request at
 * once: a router that is itself loading refuses to hand on its snapshot, 503).
 * Ownership: a fetch owns copies of the urls and the token, its thread, its eventfd and event.
 * done gets the body (malloc'd, the callee's) or NULL. After done, or once the fetch is
 * abandoned, it frees itself (an abandoned fetch's thread finishes alone and frees it; it
 * never touches the loop again). Threads: start, done and abandon on the loop's thread.
 * Cost: one thread and one HTTP GET per peer asked, at start-up.
 */
#ifndef KVR_CLUSTER_PEER_FETCH_H
#define KVR_CLUSTER_PEER_FETCH_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
typedef struct kvr_peer_fetch kvr_peer_fetch_t;

/* On the loop: body (len bytes, from url) of the first peer that gave a snapshot, or NULL when
 * none did (each failure logged). */
typedef void (*kvr_peer_fetch_done_fn)(void *arg, const char *url, uint8_t *body, size_t len);

typedef struct kvr_peer_fetch_config {
    struct event_base *base;
    const char *const *urls; /* asked in this order */
    size_t n_urls;
    const char *bearer;      /* "" = none */
    uint64_t timeout_ms;     /* per peer */
    size_t max_bytes;
    kvr_peer_fetch_done_fn done;
    void *arg;
} kvr_peer_fetch_config_t;

/* NULL with *status when it cannot start (out of memory, no thread). */
kvr_peer_fetch_t *kvr_peer_fetch_start(const kvr_peer_fetch_config_t *c, int *status);
/* The loop stops caring (shutdown): done is never called; the thread frees it when it ends. */
void kvr_peer_fetch_abandon(kvr_peer_fetch_t *f);

#endif

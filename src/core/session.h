/*
 * session.h: sticky sessions. A session (a client's conversation or agent run, named by the
 * client) is bound to the worker rank that served its first request; its later requests prefer
 * that rank while it is alive and not busy (the selector's "preferred" rule), and are routed
 * as any other request (then rebound) when it is not. A binding lives session_ttl_ms after its
 * last request, or until the client closes it; the table holds at most max_sessions and evicts
 * the least recently used binding beyond that (counted).
 *
 * Invariants: every live binding is in the hash table and on the recency list exactly once;
 * the list runs from most to least recently used, so last_ms never increases along it;
 * n_live <= max_sessions. kvr_sessions_verify checks all three.
 * Ownership: the table copies session ids (at most KVR_SESSION_MAX_ID bytes). Threads: one
 * owner (the router's thread); no locks. Memory: grows by doubling to max_sessions slots of
 * ~170 bytes plus a table of 16-byte entries at most half full; freed by kvr_sessions_free.
 * Cost: lookup, bind, close O(1) expected (one xxh3 of the id, one probe sequence); expire
 * O(expired).
 */
#ifndef KVR_CORE_SESSION_H
#define KVR_CORE_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/router.h"

#define KVR_SESSION_MAX_ID 128

typedef struct kvr_sessions kvr_sessions_t;

typedef struct kvr_sessions_config {
    uint64_t ttl_ms;     /* a binding's life after its session's last request; > 0 */
    size_t max_sessions; /* bindings held at most; > 0 */
} kvr_sessions_config_t;

typedef kvr_session_stats_t kvr_sessions_stats_t; /* kvrouter/router.h */

/* NULL with *status KVR_EINVAL (a zero setting) or KVR_ENOMEM. */
kvr_sessions_t *kvr_sessions_new(const kvr_sessions_config_t *cfg, int *status);
void kvr_sessions_free(kvr_sessions_t *s);

/* The rank the session is bound to, if it is bound and not expired at now_ms. */
bool kvr_sessions_lookup(const kvr_sessions_t *s, const char *id, size_t len, uint64_t now_ms,
                         kvr_worker_t *out);
/* After a routed request of the session: binds it to w (or keeps / moves its binding), makes
 * it the most recently used, counts hit / rebind / bind. Evicts the least recently used
 * binding when the table is full. KVR_OK; KVR_EINVAL (len 0 or > KVR_SESSION_MAX_ID);
 * KVR_ENOMEM (nothing changed). */
int kvr_sessions_bind(kvr_sessions_t *s, const char *id, size_t len, kvr_worker_t w,
                      uint64_t now_ms);
/* Ends the session's binding; false if it had none. */
bool kvr_sessions_close(kvr_sessions_t *s, const char *id, size_t len);
/* Drops the bindings idle for ttl_ms or more at now_ms. */
void kvr_sessions_expire(kvr_sessions_t *s, uint64_t now_ms);

void kvr_sessions_stats(const kvr_sessions_t *s, kvr_sessions_stats_t *out);
/* KVR_OK or KVR_EINVAL with msg naming the broken invariant. */
int kvr_sessions_verify(const kvr_sessions_t *s, char *msg, size_t msg_len);

#endif

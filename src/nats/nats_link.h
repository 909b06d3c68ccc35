/*
 * nats_link.h: the router's connection to NATS (nats.c, Debian libnats-dev): core publish /
 * subscribe, and JetStream key-value buckets for presence (entries kept alive by a heartbeat)
 * and discovery (buckets watched for puts and deletes).
 *
 *   connection  started in the background and retried forever with backoff (reconnect_wait_ms,
 *               doubling to 8x, with jitter): a router with an unreachable NATS still starts
 *               and routes with what it knows. Subscriptions survive reconnects (nats.c
 *               re-subscribes); what was published while disconnected is buffered up to 8 MiB
 *               by nats.c and then dropped (counted: publish_errors).
 *   echo        off: a subscription never receives what this connection published.
 *   delivery    every callback (a message, a bucket entry, a state change) runs on the owner's
 *               event loop, in arrival order per subscription: nats.c's threads copy what they
 *               get into one inbox (a mutex-protected list) and wake the loop (event_active).
 *   buckets     created on first use (file storage, history 1, max age = the TTL), or bound
 *               when they already exist. Blocking JetStream calls never run on the loop: one
 *               "kv" thread puts the kept entries (at once, then every period) and deletes
 *               dropped ones; one thread per watched bucket waits on its watcher and recreates
 *               it after a reconnect (the server may have restarted and lost the consumer).
 *               The bucket's max age only cleans storage: an entry's liveness is judged by
 *               whoever watches it, from when it last saw a put (a watcher sees no event when
 *               the server ages an entry out).
 *
 * Ownership: the link owns the nats.c objects, its threads and the inbox; callers' strings and
 * buffers are copied. kvr_nats_free stops the threads, performs the deletes still queued (up
 * to 2 s), closes the connection and waits for nats.c's threads to end (nats_CloseAndWait):
 * one link per process.
 * Threads: kvr_nats_* calls come from the owner thread, except kvr_nats_publish and
 * kvr_nats_stats (any thread). Callbacks run on the owner's loop (cfg.base); with no base,
 * subscriptions and watches are refused (a heartbeat-only client: `kvrouter register`).
 * Cost: a delivery is one allocation and copy of the message; a publish is nats.c's buffered
 * write (no system call on the caller's thread).
 */
#ifndef KVR_NET_NATS_LINK_H
#define KVR_NET_NATS_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nats/nats_auth.h"

struct event_base;

typedef struct kvr_nats kvr_nats_t;

typedef enum kvr_nats_state {
    KVR_NATS_CONNECTING = 0, /* never connected yet */
    KVR_NATS_CONNECTED,
    KVR_NATS_DISCONNECTED, /* was connected; reconnecting */
} kvr_nats_state_t;

const char *kvr_nats_state_name(kvr_nats_state_t s);

typedef struct kvr_nats_config {
    const char *url;            /* nats://host:port, or a comma-separated list */
    const char *name;           /* the connection's name as the server shows it */
    struct event_base *base;    /* where callbacks run; NULL: publish and keep entries only */
    uint64_t reconnect_wait_ms; /* the first backoff (0 = 250) */
    kvr_nats_auth_t auth;       /* credentials and TLS (nats_auth.h); zero = none */
} kvr_nats_config_t;

/* Starts connecting; NULL with *status (KVR_EINVAL: err names the setting; KVR_ENOMEM;
 * KVR_EIO: nats.c refused the options). An unreachable server is not an error. */
kvr_nats_t *kvr_nats_new(const kvr_nats_config_t *cfg, int *status, char *err, size_t err_len);
void kvr_nats_free(kvr_nats_t *n);

/* Told of each state change, on the loop. At most 4 listeners (KVR_EFULL). */
typedef void (*kvr_nats_state_fn)(void *arg, kvr_nats_state_t st);
int kvr_nats_on_state(kvr_nats_t *n, kvr_nats_state_fn fn, void *arg);
kvr_nats_state_t kvr_nats_state(const kvr_nats_t *n);

/* A message, on the loop (data valid during the call; reply "" when none). */
typedef void (*kvr_nats_msg_fn)(void *arg, const char *subject, const char *reply,
                                const uint8_t *data, size_t len);
/* KVR_OK; KVR_EINVAL (no loop, bad subject); KVR_EIO (nats.c refused: the message in the
 * log). Works while disconnected (nats.c subscribes once connected). */
int kvr_nats_subscribe(kvr_nats_t *n, const char *subject, kvr_nats_msg_fn fn, void *arg);
/* Publishes (reply may be NULL). KVR_OK, or KVR_EIO (counted in publish_errors). */
int kvr_nats_publish(kvr_nats_t *n, const char *subject, const char *reply, const void *data,
                     size_t len);
/* The server's max_payload (1 MiB until connected). */
size_t kvr_nats_max_payload(kvr_nats_t *n);

/* ---- key-value buckets ---- */

typedef enum kvr_kv_op {
    KVR_KV_PUT = 1,
    KVR_KV_DELETE, /* deleted or purged */
    KVR_KV_CAUGHT_UP, /* every entry present when the watch (re)started was delivered */
} kvr_kv_op_t;

/* An entry change, on the loop (key "" and val NULL for CAUGHT_UP). */
typedef void (*kvr_nats_kv_fn)(void *arg, kvr_kv_op_t op, const char *key, const uint8_t *val,
                               size_t len);
/* Watches every key of bucket (created with ttl_ms as its max age if missing). */
int kvr_nats_kv_watch(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms, kvr_nats_kv_fn fn,
                      void *arg);
/* Puts key = val now and every period_ms until kvr_nats_kv_drop (or free, which drops it);
 * a later call with the same bucket and key replaces the value. */
int kvr_nats_kv_keep(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms, const char *key,
                     const void *val, size_t len, uint64_t period_ms);
/* Stops keeping key and deletes it (on the kv thread, soon). */
int kvr_nats_kv_drop(kvr_nats_t *n, const char *bucket, const char *key);

/* One entry of a listing, on the caller's thread: age_ms since it was last written (by the
 * server's clock against this host's). */
typedef void (*kvr_nats_entry_fn)(void *arg, const char *key, const void *val, size_t len,
                                  uint64_t age_ms);
/* Lists bucket's entries now, blocking (start-up only: it waits up to wait_ms for the
 * connection). KVR_OK (an empty or missing bucket lists nothing); KVR_EIO (not connected in
 * time, or the bucket unreadable); KVR_EINVAL. */
int kvr_nats_kv_list(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms, uint64_t wait_ms,
                     kvr_nats_entry_fn fn, void *arg);

typedef struct kvr_nats_stats {
    kvr_nats_state_t state;
    uint64_t in_msgs, in_bytes, out_msgs, out_bytes, reconnects; /* nats.c's counters */
    uint64_t disconnects, publish_errors;
    uint64_t kv_puts, kv_put_errors, kv_deletes, kv_entries_seen, kv_watch_restarts;
    uint64_t inbox_dropped; /* deliveries dropped: the inbox held 65,536 (loop stalled) */
} kvr_nats_stats_t;
void kvr_nats_stats(kvr_nats_t *n, kvr_nats_stats_t *out);

#endif

/*
 * remote_indexer.h: `serve --remote-indexer URL`: the router's overlaps come from another
 * indexer (a `kvrouter indexer`, a router with serve_indexer, or the reference's indexer)
 * instead of a local index. It is the scheduler's overlap source (kvrouter/sched.h): for each
 * placement it POSTs the prompt's local block hashes to URL/query_by_hash (model_name: the
 * request's model, else remote_indexer_model) and hands the scores back as the request's
 * matches (device tier; the answer's tokens divided by this router's block size).
 *
 * A failure (connection refused or reset, a non-200 answer, an answer that does not read, a
 * block-size mismatch) or no answer within remote_indexer_timeout_ms degrades that one
 * decision to zero overlap: counted by cause in /metrics, logged with a rate limit, and shown
 * as "remote: unreachable" in /health and GET /v1/workers until an answer comes again.
 * A 404 (the indexer has no partition for the model: nothing registered or recorded for it
 * yet, or an approximate partition dropped once its decisions expired) is an answer of zero
 * overlap, not a failure: counted apart (unknown_partition) and logged with the rate limit.
 *
 * Connections: up to 16 keep-alive connections, one request in flight on each; lookups beyond
 * wait in FIFO order (their deadline runs from the placement). An answer's head is bounded
 * (16 KiB) and its body by what an answer about this router's ranks and the prompt's blocks
 * can be: a larger one is refused as it arrives (cause "answer"), never buffered.
 * A late answer after its deadline is read and dropped (its connection stays usable); an
 * answer that never comes is ended by the connection's own timeout (10x the deadline, at
 * least 1 s).
 * Over NATS (url "nats"): the same body is a request on <ns>.indexer.query (answered by a
 * router with serve_indexer, indexer/ix_serve.h) with the reply subject
 * <ns>.indexer.reply.<this router's random id>.<sequence>, so an answer finds its lookup by
 * its subject; no answer before the deadline is a timeout (also with no responder at all).
 * Approximate mode (record_decisions; use_kv_events false): the indexer's index holds the
 * routers' decisions, not the engines' events. After each booked decision the router writes
 * it there, POST URL/record_routing_decision {instance_id, dp_rank, model_name, local_hashes,
 * sequence_hashes} on a connection of its own (queued, at most 1024 waiting; beyond, dropped
 * and counted), or over NATS a message on <ns>.indexer.record. Not recorded = counted in
 * kvr_remote_indexer_records_failed_total and logged with a rate limit; the routing itself
 * never waits for it.
 * Threads: the HTTP thread only. Ownership: borrows the base and the API server; free it
 * before the scheduler (lookups in flight are dropped without a callback).
 */
#ifndef KVR_NET_REMOTE_INDEXER_H
#define KVR_NET_REMOTE_INDEXER_H

#include <stddef.h>
#include <stdint.h>

#include "kvrouter/sched.h"
#include "fleet/fleet.h"
#include "http/http.h"

struct event_base;

typedef struct kvr_remote_ix_config {
    struct event_base *base;
    kvr_http_host_t *host; /* its service: metrics, detail line */
    kvr_sched_t *sched;    /* set as its overlap source */
    const char *url;       /* http://host:port[/base], or "nats" */
    struct kvr_nats *nats; /* url "nats": the link, and the fleet's namespace */
    const char *ns;
    uint64_t timeout_ms;
    uint32_t block_size;       /* what the router hashes with */
    const char *default_model; /* model_name for requests without one ("default" if NULL) */
    size_t max_connections;    /* 0 = 16 */
    bool record_decisions;     /* approximate mode: each decision is written to the indexer */
    const char *bearer;        /* sent with each lookup (the indexer's api key); NULL = none;
                                  copied */
    const char *record_bearer; /* sent with each decision (its admin key); NULL = none; copied */
} kvr_remote_ix_config_t;

typedef struct kvr_remote_ix_stats {
    uint64_t lookups, answered, timeouts, failed_connect, failed_status, failed_answer;
    uint64_t late_answers; /* came after their deadline: dropped */
    uint64_t resent;       /* sent again once: the connection closed before any answer */
    uint64_t unknown_partition; /* answered 404: no index for the model there (zero overlap) */
    uint64_t waiting;      /* gauge: lookups waiting for a connection */
    uint64_t in_flight;    /* gauge */
    bool reachable;        /* the last lookup was answered */
    uint64_t records, records_ok, records_failed; /* approximate mode: decisions sent */
} kvr_remote_ix_stats_t;

typedef struct kvr_remote_ix kvr_remote_ix_t;

/* NULL with err naming the setting (remote_indexer: a bad url). */
kvr_remote_ix_t *kvr_remote_ix_new(const kvr_remote_ix_config_t *cfg, int *status, char *err,
                                   size_t err_len);
void kvr_remote_ix_free(kvr_remote_ix_t *x);
void kvr_remote_ix_stats(const kvr_remote_ix_t *x, kvr_remote_ix_stats_t *out);

#endif

/*
 * indexer_server.h: the standalone KV indexer (`kvrouter indexer`): one prefix index per
 * (model_name, routing_group) partition, each fed by its workers' ZeroMQ KV events through its
 * own ingest thread (gap replay, restart detection and per-rank states as in `serve`), and the
 * reference indexer's HTTP API on one event loop:
 *   POST /register      201 {"status":"ok"}; 400 malformed, a block size other than the
 *                       partition's (both named), or no room for a new partition (the cap
 *                       named: --max-partitions, --max-total-pairs); 409 the (instance_id,
 *                       dp_rank) is registered
 *   POST /unregister    200; 404 not registered (no routing_group: every group; no dp_rank:
 *                       every rank)
 *   GET  /workers       [?model_name=&routing_group=] the registrations (with their replay
 *                       endpoints when they have one) and their listeners
 *   POST /query, POST /query_by_hash, GET /dump, POST /record_routing_decision  indexer/ix_api.h
 *   POST /register_peer, POST /deregister_peer, GET /peers
 *   GET  /v1/index/partitions, GET /v1/index/snapshot   binary snapshots for peers
 *   GET  /health        "OK"; after a start with peers, then lines "index: <origin>",
 *                       "registrations: <what the peer's gave>", "stale: <N ranks>" while
 *                       ranks of the recovered index have no registration here
 *   GET  /ready, GET /metrics, POST /reopen_logs
 * The block size of a partition is fixed by its first registration.
 *
 * Access (http/access.h's checks and keys, as `serve`): open: /health, /ready; admin (the admin
 * key; with only an api key, that one): every route that changes something (/register,
 * /unregister, /record_routing_decision, /register_peer, /deregister_peer, /reopen_logs);
 * peer (the peer key or the admin key): the index copies /dump, /v1/index/partitions,
 * /v1/index/snapshot; client (the api key or the admin key): everything else (queries,
 * /workers, /peers, /metrics), GET /workers also with the peer key (a recovering peer reads
 * the registrations with it). No key file: every route is open. A refusal is a 401 in
 * serve's JSON shape, counted (kvr_indexer_unauthorized_total) and logged with a rate limit.
 *
 * Partitions and memory: each partition's index keeps at most max_pairs pairs (LRU beyond);
 * a new partition reserves min(max_pairs, what is left of max_total_pairs) and is refused
 * when fewer than 1024 pairs are left or max_partitions exist, so the pairs of all partitions
 * together never exceed max_total_pairs. A partition with no registration and nothing in its
 * index (its recorded decisions expired, its last rank unregistered) is dropped within a
 * second and gives its reservation back.
 *
 * Start-up (kvr_indexer_new): the --workers registrations (their SUB sockets connect, so live
 * events queue), then with peers the first peer whose index reads whole is applied, with its
 * registrations: they are read (GET /workers, indexer/ix_peer_regs.h) and subscribed before
 * its index is fetched, so their events queue too, and a rank with a replay socket resumes
 * from the snapshot's cursor (a replay of what came after it); an instance --workers names
 * in a partition is not taken from the peer there. Then the partitions' ingest threads start
 * (applying the queued events over the index: stores and removals already reflected are
 * idempotent), then the listener opens. Ready only then. Registrations that cannot be had
 * (an older peer, an error) do not stop the start: it is logged, and every rank of the
 * recovered index no registration here follows is counted as stale (kvr_indexer_stale_ranks,
 * /health) until one does. A peer's answers are bounded by what they can legitimately be
 * (indexer_server.c).
 *
 * Threads: the loop's thread owns the registry and answers every request (an index reader);
 * each partition's ingest thread is its index's only writer. Ownership: the server owns its
 * partitions, ingest threads and listener; base is borrowed.
 */
#ifndef KVR_NET_INDEXER_SERVER_H
#define KVR_NET_INDEXER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

struct event_base;

#define KVR_INDEXER_MAX_PEERS 64
#define KVR_INDEXER_DEFAULT_PARTITIONS 64
#define KVR_INDEXER_MAX_PARTITIONS 4096
#define KVR_INDEXER_DEFAULT_TOTAL_PAIRS ((size_t)64 << 20)
#define KVR_INDEXER_MIN_PAIRS 1024 /* the least a partition's index keeps */

/* One --workers registration. */
typedef struct kvr_indexer_worker {
    uint64_t instance_id;
    uint32_t dp_rank;
    char endpoint[256];
} kvr_indexer_worker_t;

typedef struct kvr_indexer_config {
    const char *bind;       /* "127.0.0.1" when NULL */
    uint16_t port;          /* 0 = any free port */
    uint32_t block_size;    /* for the --workers registrations */
    const char *model_name; /* their partition ("default") */
    const char *routing_group;
    const kvr_indexer_worker_t *workers;
    size_t n_workers;
    const char *const *peers; /* recovered from at start (index and registrations), and
                                 listed by GET /peers */
    size_t n_peers;
    uint64_t peer_timeout_ms; /* each GET of a peer's at start; 0 = 10000 */
    size_t max_pairs;         /* per partition; 0 = KVR_INDEX_DEFAULT_MAX_PAIRS, or
                                 max_total_pairs when that is less */
    size_t max_total_pairs;   /* every partition together; 0 = KVR_INDEXER_DEFAULT_TOTAL_PAIRS */
    size_t max_partitions;    /* 0 = KVR_INDEXER_DEFAULT_PARTITIONS */
    const char *api_key_file; /* client calls' token; NULL = none (http/access.h) */
    const char *admin_key_file; /* the token of calls that change something; NULL = none */
    const char *peer_key_file;  /* accepted for the index copies, and sent to --peers */
    uint64_t decision_ttl_ms; /* recorded routing decisions (approximate mode); 0 = 120000 */
    kvr_http_limits_t limits; /* 0 fields take the router's defaults */
} kvr_indexer_config_t;

typedef struct kvr_indexer kvr_indexer_t;

/* NULL with err set (naming the flag or the peer) when start-up fails: a bad combination
 * of max_pairs, max_total_pairs and max_partitions, an unreadable key file, a listener. */
kvr_indexer_t *kvr_indexer_new(struct event_base *base, const kvr_indexer_config_t *cfg, char *err,
                               size_t err_len);
void kvr_indexer_free(kvr_indexer_t *x);
uint16_t kvr_indexer_port(const kvr_indexer_t *x);
/* Where the index came from ("cold", or "peer URL: N events"). */
const char *kvr_indexer_origin(const kvr_indexer_t *x);
/* What the peers' registrations gave at start ("" without peers). */
const char *kvr_indexer_registrations(const kvr_indexer_t *x);
void kvr_indexer_drain(kvr_indexer_t *x);
uint64_t kvr_indexer_busy(const kvr_indexer_t *x);

#endif

/*
 * load.h (private to the tree; not installed): the load tracker (core/load.c).
 *
 * In-flight requests per worker rank and the load they put on it (reference 4.2 to 4.5): the
 * prompt blocks they hold (refcounted per worker, so a shared prefix counts once), the output
 * blocks they grew, the prefill tokens not yet answered by a first token, and their number.
 * The router projects, for an incoming request, each candidate's load if it were chosen.
 *
 * One thread (the event loop) owns a tracker; nothing here locks. Time is passed in
 * (milliseconds, any monotonic origin); randomness (hashes for output blocks, and for prompt
 * blocks with assume_kv_reuse off) comes from cfg.seed, so runs are reproducible.
 *
 * Request ids are byte strings of 1..KVR_LOAD_MAX_ID_BYTES bytes (copied; not NUL-terminated).
 * Lifecycle policy: a duplicate live id is rejected (KVR_EEXIST, counted, nothing changes: S24);
 * first_token / output_block / free_request on an unknown or already freed id return
 * KVR_ENOTFOUND, change nothing and are counted (S25); each request is released exactly once,
 * by free_request, by expiry, or by remove_worker, whichever comes first.
 * For its caller the tracker also keeps a tag on each prompt block (that of the request that
 * first held it) and a mark on each request (kvr_load_admit_tagged): the router's positions in
 * its ranks' prefill streams.
 *
 * Invariants (kvr_load_verify recomputes them): every rank's load is the sum of its live
 * requests'; a block's refcount is the number of live requests of its rank holding it.
 * Ownership: the tracker copies ids and hashes in; views handed out live until the next change.
 * Threads: one owner thread, no locks. Cost: add/free O(prompt blocks), by handle O(1) lookups,
 * projection O(log prompt blocks) per rank.
 */
#ifndef KVR_CORE_LOAD_H
#define KVR_CORE_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/router.h"

#define KVR_LOAD_DEFAULT_BLOCK_SIZE 16u
#define KVR_LOAD_DEFAULT_EXPIRY_MS 300000u         /* 5 min backstop (S12), see load.c */
#define KVR_LOAD_DEFAULT_CHECK_INTERVAL_MS 60000u  /* sweep at most once a minute from add */
#define KVR_LOAD_DEFAULT_MAX_REQUESTS 65536u
#define KVR_LOAD_MAX_REQUESTS (1u << 24)
#define KVR_LOAD_MAX_EXPIRY_MS (UINT64_C(1) << 52)

typedef struct kvr_load_config {
    /* public */
    uint32_t block_size;        /* tokens per block, > 0: a request has <= isl / block_size hashes */
    bool track_active_blocks;   /* default true; false: prompt hashes are ignored (prefill pools) */
    bool track_output_blocks;   /* default false; requires track_active_blocks */
    bool assume_kv_reuse;       /* default true; false: prompt blocks get random hashes (no dedup) */
    bool track_prefill_tokens;  /* default true; false: prefill tokens are not counted */
    uint64_t expiry_ms;         /* 1..KVR_LOAD_MAX_EXPIRY_MS: requests this old are stale */
    uint64_t check_interval_ms; /* <= expiry_ms: add() sweeps stale requests at most this often */
    uint32_t max_requests;      /* 1..KVR_LOAD_MAX_REQUESTS live requests; past it add() fails */
    uint64_t seed;              /* random hashes and the request-id hash seed */
    uint32_t max_peer_requests; /* 0..KVR_LOAD_MAX_REQUESTS: requests admitted with .peer (other
                                   replicas' bookings) get this budget of their own, and
                                   max_requests is then the local requests' alone, so peers can
                                   never crowd local requests out; 0 = one shared budget */
    uint64_t max_peer_blocks;   /* prompt blocks of .peer requests held at most (their memory);
                                   0 = no bound */
} kvr_load_config_t;

/* Fills cfg with the defaults above (track_active_blocks, assume_kv_reuse and
 * track_prefill_tokens on, track_output_blocks off, seed 0). */
void kvr_load_config_init(kvr_load_config_t *cfg);
/* KVR_OK, or KVR_EINVAL with the offending field's name in *field (when field is non-NULL):
 * "block_size", "track_output_blocks", "expiry_ms", "check_interval_ms", "max_requests". */
int kvr_load_config_validate(const kvr_load_config_t *cfg, const char **field);

/* cfg NULL = defaults. Returns NULL and sets *status (KVR_EINVAL, KVR_ENOMEM) on failure. */
kvr_load_t *kvr_load_new(const kvr_load_config_t *cfg, int *status);
void kvr_load_free(kvr_load_t *lt);

/* Admits a request. May first free stale requests (at most every check_interval_ms).
 * KVR_OK; KVR_EINVAL (empty or too long id, seq NULL with n_seq > 0, n_seq > isl/block_size;
 * nothing counted); KVR_ETOOBIG (n_seq >= 2^31); KVR_EEXIST (live id: counted, state untouched); KVR_EFULL (max_requests
 * live: counted); KVR_ENOMEM. On any error nothing changes. */
int kvr_load_add(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms);
/* kvr_load_add that also hands back the request's handle (KVR_REQ_HANDLE_NONE on error). */
int kvr_load_admit(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms,
                   kvr_req_handle_t *handle);
/* kvr_load_admit that also keeps two values of the caller's (kvr_load_admit keeps 0s): tag on
 * each prompt block the request is the first live request of its worker to hold (a block
 * keeps it while any request holds it; kvr_load_block_tag), and mark on the request
 * (kvr_load_mark). */
int kvr_load_admit_tagged(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms,
                          uint32_t tag, uint64_t mark, kvr_req_handle_t *handle);
/* The tag of block hash held on worker: KVR_OK, or KVR_ENOTFOUND when no live request of the
 * worker holds it. O(1). */
int kvr_load_block_tag(const kvr_load_t *lt, kvr_worker_t worker, uint64_t hash, uint32_t *tag);
/* A live request's worker and mark, found by id (id != NULL) or by handle. KVR_OK, or
 * KVR_ENOTFOUND (not counted: a query). */
int kvr_load_mark(const kvr_load_t *lt, const char *id, size_t id_len, kvr_req_handle_t h,
                  kvr_worker_t *worker, uint64_t *mark);
/* The first output token: the request's prefill tokens leave its worker's load. Repeats are
 * KVR_OK no-ops. KVR_ENOTFOUND (counted) for an unknown id. */
int kvr_load_first_token(kvr_load_t *lt, const char *id, size_t id_len, uint64_t now_ms);
/* One more output block (with track_output_blocks; otherwise a KVR_OK no-op). decay_fraction:
 * NAN = absent; else in [0, 1] (KVR_ERANGE otherwise) and every block held by this request
 * alone, this one included, then weighs decay_fraction (4.3). KVR_ENOTFOUND (counted). */
int kvr_load_output_block(kvr_load_t *lt, const char *id, size_t id_len, double decay_fraction,
                          uint64_t now_ms);
/* Releases everything the request holds. KVR_ENOTFOUND (counted, a no-op) if unknown. */
int kvr_load_free_request(kvr_load_t *lt, const char *id, size_t id_len, uint64_t now_ms);
/* The same three calls by handle: O(1), no id hashing. A stale handle is an unknown id. */
int kvr_load_first_token_h(kvr_load_t *lt, kvr_req_handle_t h, uint64_t now_ms);
int kvr_load_output_block_h(kvr_load_t *lt, kvr_req_handle_t h, double decay_fraction,
                            uint64_t now_ms);
int kvr_load_free_h(kvr_load_t *lt, kvr_req_handle_t h, uint64_t now_ms);
/* The id of the live request h names (not counted when stale: KVR_ENOTFOUND); *id points into
 * the tracker, valid until the request is freed. */
int kvr_load_handle_id(const kvr_load_t *lt, kvr_req_handle_t h, const char **id, size_t *id_len);
/* The first min(cap, its prompt blocks) block hashes of a live request into out (*n of them);
 * KVR_ENOTFOUND for a stale handle. */
int kvr_load_prompt_h(const kvr_load_t *lt, kvr_req_handle_t h, uint64_t *out, size_t cap,
                      size_t *n);
/* A live request's handle, found by id (id != NULL) or by handle (then the same, when it is
 * live). KVR_ENOTFOUND when none is live. */
int kvr_load_request_handle(const kvr_load_t *lt, const char *id, size_t id_len, kvr_req_handle_t h,
                            kvr_req_handle_t *handle);
/* Frees requests added expiry_ms or more before now_ms (counted). Returns how many. */
size_t kvr_load_expire(kvr_load_t *lt, uint64_t now_ms);
/* When the oldest live request becomes stale (UINT64_MAX when none): a timer for expire(). */
uint64_t kvr_load_next_expiry(const kvr_load_t *lt);
/* Drops every request of every rank of worker_id (counted). *n_dropped (may be NULL) = how
 * many. KVR_ENOWORKER (a no-op) when no rank of it has a request. */
int kvr_load_remove_worker(kvr_load_t *lt, uint64_t worker_id, size_t *n_dropped);

/* A worker rank's current load; all zero for a rank with no request. */
typedef struct kvr_load_snapshot {
    /* read-only */
    uint64_t active_blocks;          /* round(sum of block weights) */
    uint64_t active_prefill_tokens;
    uint64_t unique_blocks;          /* distinct blocks held, whatever their weight */
    uint32_t active_requests;
} kvr_load_snapshot_t;
void kvr_load_snapshot(const kvr_load_t *lt, kvr_worker_t worker, kvr_load_snapshot_t *out);

/* An incoming request, as projected. seq must be chained sequence hashes (kvr_hash_prompt):
 * the overlap is then found by binary search (see load.c). Ignored without track_active_blocks. */
typedef struct kvr_load_query {
    /* public */
    const uint64_t *seq;
    size_t n_seq;
    uint64_t isl_tokens;
    kvr_load_opt_t assume_kv_reuse; /* off: no leading block counts as already active */
} kvr_load_query_t;

/* Projects the query onto each of p[0..n) (no allocation; O(log n_seq) probes per worker).
 * KVR_OK, or KVR_EINVAL (NULL arguments) with nothing written. */
int kvr_load_project(const kvr_load_t *lt, const kvr_load_query_t *q, kvr_load_projection_t *p,
                     size_t n);
/* The same for one worker. */
int kvr_load_project_one(const kvr_load_t *lt, const kvr_load_query_t *q,
                         kvr_load_projection_t *p);

/* What the tracker holds for one live request. */
typedef struct kvr_load_request_info {
    /* read-only */
    kvr_worker_t worker;
    uint64_t started_ms;        /* max(now at add, start of the previous live request) */
    uint64_t prefill_tokens;    /* counted on the worker; 0 after the first token */
    uint32_t n_prompt_blocks;
    uint32_t n_output_blocks;
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
} kvr_load_request_info_t;
/* KVR_OK or KVR_ENOTFOUND (not counted: a query). */
int kvr_load_request_info(const kvr_load_t *lt, const char *id, size_t id_len,
                          kvr_load_request_info_t *out);

/* One live request as kvr_load_foreach shows it (valid during the callback only). */
typedef struct kvr_load_request_view {
    /* read-only */
    const char *id;
    size_t id_len;
    kvr_req_handle_t handle;
    kvr_load_request_info_t info;
    const uint64_t *prompt_hashes; /* info.n_prompt_blocks of them (random ones for a request
                                      admitted with assume_kv_reuse off) */
} kvr_load_request_view_t;
/* Returns 0 to go on, anything else to stop (kvr_load_foreach returns it). */
typedef int (*kvr_load_visit_fn)(void *arg, const kvr_load_request_view_t *v);
/* Shows each live request, oldest first (a snapshot for a peer replica). KVR_OK, fn's nonzero
 * value, KVR_EINVAL or KVR_ENOMEM (one scratch array of the longest prompt's hashes).
 * fn must not change the tracker. O(live requests + their blocks). */
int kvr_load_foreach(const kvr_load_t *lt, kvr_load_visit_fn fn, void *arg);

/* Counters; monotonic unless marked as a gauge. */
typedef struct kvr_load_stats {
    /* read-only */
    uint64_t adds, frees, first_tokens, output_blocks;
    uint64_t duplicates;       /* adds rejected: the id is live */
    uint64_t full;             /* adds rejected: max_requests live */
    uint64_t peer_full;        /* peers' adds rejected: max_peer_requests live, or their blocks
                                  would pass max_peer_blocks */
    uint64_t unknown_frees;    /* free_request of an unknown id */
    uint64_t unknown_marks;    /* first_token / output_block of an unknown id */
    uint64_t expired;          /* requests freed by expiry */
    uint64_t workers_removed;  /* worker ranks dropped by remove_worker */
    uint64_t requests_dropped; /* requests freed by remove_worker */
    uint64_t live_requests;    /* gauge */
    uint64_t unique_blocks;    /* gauge: (worker rank, block) pairs held */
    uint64_t workers;          /* gauge: worker ranks with a live request */
    uint64_t active_prefill_tokens; /* gauge: over all workers */
    uint64_t bytes;            /* gauge: memory owned by the tracker */
    uint64_t max_requests;     /* the cap */
    uint64_t peer_requests;    /* gauge: live requests admitted with .peer */
    uint64_t max_peer_requests; /* their cap (0 = they share max_requests) */
    uint64_t peer_blocks;      /* gauge: prompt blocks those hold */
} kvr_load_stats_t;
void kvr_load_stats(const kvr_load_t *lt, kvr_load_stats_t *out);

/* Checks every invariant (recomputes all loads from the live requests). KVR_OK, or KVR_EINVAL
 * with a description in msg (may be NULL), or KVR_ENOMEM. O(everything held); for tests. */
int kvr_load_verify(const kvr_load_t *lt, char *msg, size_t msg_len);

#endif /* KVR_CORE_LOAD_H */

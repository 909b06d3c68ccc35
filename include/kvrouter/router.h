/*
 * router.h: the routing decision, composed from the core modules: the worker registry, block
 * hashing, the prefix index (read side), the load tracker, the selector and, in approximate
 * mode, the routing-decision recorder. No I/O (but getrandom(2) for the ids it generates and
 * a seed 0), no clock (time is passed in), no threads of its own: `kvrouter serve` calls it from its HTTP thread; a simulator can call it
 * in virtual time.
 *
 * Ownership: the router borrows the index (created and written by the caller's ingest thread;
 * in approximate mode the router's thread is the index's only writer) and owns everything else.
 * Threads: one thread calls every function. Hot path (kvr_router_route): no allocation once
 * its scratch has grown to the largest prompt and the worker count.
 * Cost of a route: O(prompt blocks) hashing and lookup, O(ranks) candidates and selection.
 * Disaggregated fleets: workers have roles; a route chooses within one pool (kvr_pool_t: the
 * prefill workers, or the others), and the legs' settings are kvr_route_req_prefill_leg /
 * _decode_leg.
 *
 * Embedding, in order (examples/embed.c does each step):
 *   kvr_config_defaults + kvr_config_set     the settings, validated by name
 *   kvr_index_new (kvrouter/index.h)         the prefix index; kvr_index_apply feeds it the
 *                                            engines' KV events (from any one thread)
 *   kvr_router_new, kvr_router_add_worker    the router over it, its workers
 *   kvr_router_route                         one decision (and booking) per request
 *   kvr_router_first_token / _output_block / _free_request   the request's lifecycle
 *   kvr_router_tick                          now and then: expiries
 *   kvr_router_free, kvr_index_free
 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/config.h"
#include "kvrouter/hash.h"
#include "kvrouter/index.h"
#include "kvrouter/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_MAX_TAINTS 8
#define KVR_TAINT_BYTES 64
#define KVR_ADDR_BYTES 256
#define KVR_MODEL_BYTES 256  /* a model name, with its NUL */
#define KVR_LORAS_BYTES 1024 /* a worker's adapters, ';'-separated, with the NUL */
#define KVR_MAX_DP_SIZE 256

/* ---- bookings: the load tracker's vocabulary (core/load.c) ---- */

#define KVR_LOAD_MAX_ID_BYTES 256u /* a request id: 1 to 256 bytes */

typedef struct kvr_load kvr_load_t; /* the load tracker (opaque here) */

/* A per-request setting that overrides the tracker's configuration, or leaves it (0). */
typedef enum kvr_load_opt { KVR_LOAD_CONFIG = 0, KVR_LOAD_ON, KVR_LOAD_OFF } kvr_load_opt_t;

/* A request being admitted on a worker (a booking). Borrowed for the call. */
typedef struct kvr_load_request {
    /* public */
    const char *id;
    size_t id_len;
    kvr_worker_t worker;
    const uint64_t *seq;            /* the prompt's sequence hashes; NULL/0 when not tracked */
    size_t n_seq;
    uint64_t isl_tokens;            /* prompt length in tokens */
    uint64_t cached_tokens;         /* cached on this worker: prefill = isl - min(cached, isl) */
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
    uint32_t block_size;                 /* of its prompt's blocks; 0 = the tracker's */
    kvr_load_opt_t assume_kv_reuse;      /* off: its blocks never dedup with others' */
    kvr_load_opt_t track_prefill_tokens; /* off: its prompt is not counted as prefill load */
    bool peer;                           /* another replica's booking (max_peer_requests) */
} kvr_load_request_t;

/* Names a live request without its id: (generation << 32 | slot), never 0. Once the request
 * is freed (or expires, or its worker is removed) the slot's generation changes, so a stale
 * handle never names a later request: the _h calls answer KVR_ENOTFOUND for it. */
typedef uint64_t kvr_req_handle_t;
#define KVR_REQ_HANDLE_NONE UINT64_C(0)

/* One candidate: the caller fills worker and cached_tokens; the tracker fills the rest. */
typedef struct kvr_load_projection {
    /* public (in) */
    kvr_worker_t worker;
    uint64_t cached_tokens;             /* the query's cached tokens on this worker (5.2) */
    /* read-only (out) */
    uint64_t potential_prefill_tokens;  /* active_prefill_tokens + isl - min(cached, isl) */
    uint64_t potential_decode_blocks;   /* active_blocks + n_seq - overlap_blocks */
    uint64_t active_prefill_tokens;
    uint64_t active_blocks;
    uint64_t overlap_blocks;            /* leading query blocks already active on the worker */
    uint32_t active_requests;
} kvr_load_projection_t;

/* ---- per-request selection settings (core/select.c) ---- */

/* Per-request override (reference 5.6): each field applies only when its has_ flag is set.
 * overlap_score_weight is the deprecated spelling: non-zero sets prefill_load_scale, zero sets
 * both prefill_load_scale and overlap_score_credit to 0; it takes precedence. assume_kv_reuse
 * and track_prefill_tokens also change what the load tracker books, so the router resolves them
 * itself (what the selector is told). */
typedef struct kvr_select_override {
    /* public */
    bool has_overlap_score_credit, has_prefill_load_scale, has_temperature;
    bool has_shared_cache_multiplier, has_overlap_score_weight;
    double overlap_score_credit, prefill_load_scale, temperature;
    double shared_cache_multiplier, overlap_score_weight;
} kvr_select_override_t;

/* A preferred taint and its weight (any finite value; negative weights repel). */
typedef struct kvr_taint_weight {
    /* public */
    const char *taint;
    double weight;
} kvr_taint_weight_t;

/* What a worker does in a disaggregated fleet. A prefill worker computes prompts' KV and
 * hands it to a decode worker; it never serves a whole request. "both" (the default) serves
 * whole requests and, in a fleet with prefill workers, is part of the decode pool. */
typedef enum kvr_worker_role {
    KVR_ROLE_BOTH = 0,
    KVR_ROLE_PREFILL,
    KVR_ROLE_DECODE,
} kvr_worker_role_t;

const char *kvr_worker_role_name(kvr_worker_role_t role);
/* "prefill", "decode", "both": KVR_OK; else KVR_EINVAL. */
int kvr_worker_role_parse(const char *s, size_t len, kvr_worker_role_t *out);

/* A worker as operators describe it (command line or POST /v1/workers). */
typedef struct kvr_worker_spec {
    /* public */
    uint64_t worker_id;
    char url[KVR_ADDR_BYTES];    /* OpenAI-compatible base URL, probed on /health; "" = none */
    char events[KVR_ADDR_BYTES]; /* ZMQ PUB address; "" = no KV events from this worker */
    char replay[KVR_ADDR_BYTES]; /* ZMQ ROUTER replay address; "" = none */
    uint32_t dp_size;            /* data-parallel ranks, >= 1 */
    uint32_t dp_start;           /* first rank */
    char taints[KVR_MAX_TAINTS][KVR_TAINT_BYTES];
    size_t n_taints;
    uint64_t max_num_batched_tokens; /* 0 = unknown */
    uint64_t total_kv_blocks;        /* 0 = unknown */
    bool eagle; /* the engine runs Eagle speculative decoding: a block's hash covers its tokens
                   and the next block's first (the reference's is_eagle); every worker of a
                   model must agree, and its requests are hashed the same way */
    /* The model pool: requests naming a model go only to its workers (a worker without a
     * model serves any). Every worker of a model has the same block size and Eagle setting. */
    char model[KVR_MODEL_BYTES]; /* "" = any */
    uint32_t block_size;         /* its engine's block size; 0 = the router's block_size */
    char loras[KVR_LORAS_BYTES]; /* LoRA adapters it serves, ';'-separated; "" = none known */
    kvr_worker_role_t role;
    /* A prefill worker of the bootstrap convention (SGLang): where decode workers fetch the
     * KV it computed. port 0 = none (the pull convention, vLLM's); host "" = the url's. */
    char bootstrap_host[KVR_ADDR_BYTES];
    uint32_t bootstrap_port;
    /* A folder with its model's tokenizer.json (and tokenizer_config.json): the front end
     * loads it (off the serving thread) and tokenizes the model's prompts in process, as
     * --tokenizer MODEL=DIR does. "" = none. Must lie under allowed_tokenizer_dirs. */
    char tokenizer[KVR_ADDR_BYTES];
} kvr_worker_spec_t;

/* Parses "id=7,url=http://h:8001,events=tcp://h:5557,replay=tcp://h:5558,dp_size=2,
 * taints=a;b,eagle=true,model=llama,block_size=32,loras=sql;chat,role=prefill,
 * bootstrap_port=8998,bootstrap_host=h" (only id required). err names the key and problem. */
int kvr_worker_spec_parse(const char *text, kvr_worker_spec_t *out, char *err, size_t err_len);
/* Range and consistency checks (dp_size, lengths); err names the field. */
int kvr_worker_spec_validate(const kvr_worker_spec_t *w, char *err, size_t err_len);

/* What the index knows of one rank, as the ingest side reports it. */
typedef enum kvr_rank_state {
    KVR_RANK_NO_EVENTS = 0, /* no KV events received (or none configured) */
    KVR_RANK_EXACT,         /* every batch applied in order */
    KVR_RANK_RECOVERING,    /* replaying a gap */
    KVR_RANK_DEGRADED,      /* state was dropped; partial knowledge */
    KVR_RANK_ERROR,         /* events unusable (block size mismatch): never a silent 0 overlap */
    KVR_RANK_UNREACHABLE,   /* its events connection was lost: the engine is gone or cut off
                               (what the index holds of it is what it had) */
} kvr_rank_state_t;

const char *kvr_rank_state_name(kvr_rank_state_t s);

typedef struct kvr_rank_status {
    /* public */
    kvr_rank_state_t state;
    bool started;
    uint64_t last_seq;
    uint64_t batches, replayed, gaps, gaps_lost, restarts, undecodable, duplicates;
    uint64_t events_applied, events_rejected, blocks_stored, blocks_removed;
    uint64_t block_size_mismatches;
    uint32_t engine_block_size; /* the last mismatching size seen; 0 = none */
    uint64_t index_blocks;      /* blocks the index holds for this rank (any tier) */
    uint64_t disconnects;       /* events connections lost */
    uint64_t rank_out_of_range; /* batches naming a dp_rank outside the worker's, refused */
    uint64_t eagle_mismatches;  /* stored events whose Eagle windowing differs from the
                                   worker's eagle setting (applied; requests will not match) */
} kvr_rank_status_t;

typedef struct kvr_router kvr_router_t;

/* cfg is copied; ix is borrowed (may be NULL only in round-robin/random/least-loaded modes). */
kvr_router_t *kvr_router_new(const kvr_router_config_t *cfg, kvr_index_t *ix, int *status,
                             char *err, size_t err_len);
void kvr_router_free(kvr_router_t *r);

int kvr_router_add_worker(kvr_router_t *r, const kvr_worker_spec_t *w, char *err, size_t err_len);
/* Forgets the worker and frees its in-flight requests. KVR_ENOTFOUND if unknown. */
int kvr_router_remove_worker(kvr_router_t *r, uint64_t worker_id);
const kvr_worker_spec_t *kvr_router_worker(const kvr_router_t *r, uint64_t worker_id);
/* Worker ids in registration order; returns the count (fills at most cap). */
size_t kvr_router_worker_ids(const kvr_router_t *r, uint64_t *ids, size_t cap);
/* Health: fenced workers are never picked. */
int kvr_router_set_fenced(kvr_router_t *r, uint64_t worker_id, bool fenced);
/* Sets a worker's KV-cache size in the router's blocks (learnt after registration, from the
 * engine's /metrics): its spec's total_kv_blocks and, in approximate mode, every rank's cache
 * model. KVR_ENOTFOUND, KVR_EINVAL (0 blocks), KVR_ENOMEM. */
int kvr_router_set_capacity(kvr_router_t *r, uint64_t worker_id, uint64_t blocks);
bool kvr_router_fenced(const kvr_router_t *r, uint64_t worker_id);
/* Whether name is a LoRA adapter some worker declares (loras=) and no worker's model: a
 * request naming it as its model (as vLLM's OpenAI server takes adapters) is an adapter
 * request, routed to the workers serving it and hashed with it as the lora_name. */
bool kvr_router_is_adapter(const kvr_router_t *r, const char *name, size_t len);
/* The adapters a worker's engine lists (its /v1/models entries with a parent), ';'-separated:
 * routed to as if registered (loras=), kept apart from the registration. KVR_ENOTFOUND if
 * the worker is unknown; a list longer than KVR_LORAS_BYTES keeps the whole names that fit. */
int kvr_router_set_learned_loras(kvr_router_t *r, uint64_t worker_id, const char *loras);
const char *kvr_router_learned_loras(const kvr_router_t *r, uint64_t worker_id);
/* Sticky sessions' counters (core/session.c; all 0 with sessions off). */
typedef struct kvr_session_stats {
    /* read-only */
    uint64_t live;    /* gauge */
    uint64_t hits;    /* requests that went to their session's bound rank */
    uint64_t rebinds; /* requests of a bound session that went elsewhere (rank gone/busy) */
    uint64_t binds;   /* sessions bound for the first time */
    uint64_t closed, expired, evicted;
} kvr_session_stats_t;
void kvr_router_session_stats(const kvr_router_t *r, kvr_session_stats_t *out);
/* Busy thresholds of one model, changed at run time (the reference's POST /busy_threshold):
 * a rank of a worker serving the model is busy past them, instead of past the settings'
 * active_prefill_tokens_threshold and active_decode_blocks_threshold (its other busy settings
 * still apply). */
typedef struct kvr_busy_threshold {
    /* public */
    bool has_prefill_tokens;
    double prefill_tokens; /* active_prefill_tokens_threshold: prefill tokens in flight, >= 0 */
    bool has_decode_frac;
    double decode_frac; /* active_decode_blocks_threshold: of total_kv_blocks, >= 0 */
} kvr_busy_threshold_t;
#define KVR_BUSY_MAX_MODELS 64
/* Applies set's given fields to model's thresholds (the first change starts from the
 * settings'); *now: the model's thresholds in force afterwards (set NULL: read only). KVR_OK;
 * KVR_EINVAL (a value not finite or < 0: nothing changes); KVR_EFULL past
 * KVR_BUSY_MAX_MODELS models. */
int kvr_router_busy_threshold(kvr_router_t *r, const char *model, size_t model_len,
                              const kvr_busy_threshold_t *set, kvr_busy_threshold_t *now);
/* The models with their own thresholds: their names and thresholds, at most cap; the count. */
size_t kvr_router_busy_models(const kvr_router_t *r, const char **models,
                              kvr_busy_threshold_t *th, size_t cap);
/* The breakdown of the last cache-aware decision, per rank, while explaining is on (off by
 * default: no cost on the hot path; `serve` turns it on with log level debug). */
typedef struct kvr_rank_explain {
    /* read-only */
    kvr_worker_t worker;
    const char *why;       /* "eligible", or the filter or load that excluded it (static) */
    double overlap_blocks; /* effective cached blocks credited */
    double prefill_blocks; /* adjusted prefill blocks (with the step wait's and memory's) */
    double decode_blocks;  /* decode load, blocks */
    double step_wait_blocks; /* the step under way's price (locality): in prefill_blocks,
                                a tenth of it where the floor holds (docs/sim.md) */
    double memory_blocks;  /* of prefill_blocks: KV memory booked past 90% (locality) */
    double cost;           /* what the pick compared */
} kvr_rank_explain_t;
void kvr_router_set_explain(kvr_router_t *r, bool on);
/* Ranks of the last decision (0 when off, or after a load-only pick); at most cap written.
 * Valid until the next decision. */
size_t kvr_router_last_explain(const kvr_router_t *r, kvr_rank_explain_t *out, size_t cap);
/* Workers registered and not fenced (min_initial_workers counts these). */
size_t kvr_router_n_ready(const kvr_router_t *r);
/* The prefill pool's lifecycle: pending (no prefill worker ever registered: an aggregated
 * fleet), active (one is registered and not fenced), unavailable (every prefill worker is gone
 * or fenced; active again when one returns). */
typedef enum kvr_disagg_state {
    KVR_DISAGG_PENDING = 0,
    KVR_DISAGG_ACTIVE,
    KVR_DISAGG_UNAVAILABLE,
} kvr_disagg_state_t;
const char *kvr_disagg_state_name(kvr_disagg_state_t s);
kvr_disagg_state_t kvr_router_disagg_state(const kvr_router_t *r);
/* Workers of a role registered (ready_only: and not fenced). */
size_t kvr_router_n_role(const kvr_router_t *r, kvr_worker_role_t role, bool ready_only);
int kvr_router_set_rank_status(kvr_router_t *r, kvr_worker_t w, const kvr_rank_status_t *st);
int kvr_router_rank_status(const kvr_router_t *r, kvr_worker_t w, kvr_rank_status_t *out);

/* The workers a route chooses among. In a fleet without prefill workers KVR_POOL_SERVE is
 * every worker and KVR_POOL_PREFILL finds none (KVR_ENOWORKER). */
typedef enum kvr_pool {
    KVR_POOL_SERVE = 0, /* workers that run whole requests or decode: roles both and decode */
    KVR_POOL_PREFILL,   /* the prefill pool: role prefill */
} kvr_pool_t;

/* One routing request (the decoded body of POST /v1/route). Borrowed for the call. */
typedef struct kvr_route_req {
    /* public */
    const uint32_t *tokens;
    size_t n_tokens;
    const char *request_id; /* NULL = the router names it */
    size_t request_id_len;
    bool update_state;      /* false: only look (no booking) */
    uint64_t now_us;        /* the time on the step clocks' scale (kvr_router_worker_step);
                               0 = now_ms * 1000 */
    const char *model;      /* the model pool; NULL or "" = any worker */
    size_t model_len;
    const char *lora_name; /* also: only workers serving the adapter (lora_policy) */
    size_t lora_name_len;
    const char *cache_namespace;
    size_t cache_namespace_len;
    const kvr_block_mm_t *mm; /* multimodal objects per block (hashed into those blocks, as */
    size_t n_mm;              /* the engines do), ascending by block; NULL / 0 = none */
    bool has_allowed;
    const uint64_t *allowed_ids;
    size_t n_allowed;
    /* Workers already tried (a retry after a failed attempt, as h2o's balancers take the
     * tried set): none of their ranks is picked, as if outside allowed_ids (a pinned one is
     * refused as one outside them is; a session's is not taken). Any order, repeats allowed;
     * meant to be short (each rank scans it). NULL with n_exclude > 0: KVR_EINVAL. */
    const uint64_t *exclude_ids;
    size_t n_exclude;
    bool has_pinned;
    kvr_worker_t pinned;
    double priority_jump;
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
    kvr_pool_t pool;
    bool no_active_blocks; /* book without the prompt's blocks in the worker's active set (a
                              prefill pool's track_active_blocks = false: its blocks leave for
                              a decode worker) */
    const char *const *required_taints;
    size_t n_required;
    const kvr_taint_weight_t *preferred_taints;
    size_t n_preferred;
    const kvr_select_override_t *ovr;
    bool has_assume_kv_reuse, assume_kv_reuse;
    bool has_track_prefill_tokens, track_prefill_tokens;
    /* Sticky session (session_ttl_secs > 0): the rank the session is bound to is preferred
     * (taken when eligible); a booked request binds the session to its rank, and with
     * session_close ends it. NULL = none. At most 128 bytes (longer: KVR_EINVAL). */
    const char *session_id;
    size_t session_id_len;
    bool session_close;
    /* Optional: the prompt's hashes, from kvr_router_hash on this router with the same
     * tokens, lora_name and cache_namespace. The route then does not hash again (a queued
     * request is hashed once, however many times it is tried); tokens may be NULL, n_tokens
     * still gives the prompt's length and n_hashed must be its block count. */
    bool hashed;
    const uint64_t *block_hashes, *seq_hashes;
    size_t n_hashed;
    /* Optional: the prompt's overlaps found elsewhere (a remote indexer's answer). The route
     * takes them instead of looking its own index up (a rank not in the registry is
     * skipped); n_matches 0 = no rank holds any of the prompt. */
    bool has_matches;
    const kvr_match_t *matches;
    size_t n_matches;
} kvr_route_req_t;

/* The reference's PrefillRouter settings for the legs of a disaggregated request, applied to
 * q: prefill: the prefill pool, no active blocks, no session (a session binds to its decode
 * worker); decode: the serving pool with overlap credit 0 (ovr replaced), assume_kv_reuse and
 * track_prefill_tokens off. */
void kvr_route_req_prefill_leg(kvr_route_req_t *q);
void kvr_route_req_decode_leg(kvr_route_req_t *q);

/* Conditional disaggregation (the router's disagg_policy): whether q, in a fleet whose
 * prefill pool is active, skips its remote prefill and is served by a decode worker alone.
 * isl: the decode pool's best placement (as an aggregated request: cache credited) leaves
 * fewer than disagg_isl_threshold new tokens and under 70% of the prompt; load: every prefill
 * worker is busy (the busy thresholds). Looks only (no booking). */
typedef enum kvr_disagg_bypass {
    KVR_BYPASS_NONE = 0,
    KVR_BYPASS_ISL,
    KVR_BYPASS_LOAD,
} kvr_disagg_bypass_t;
kvr_disagg_bypass_t kvr_router_disagg_bypass(kvr_router_t *r, const kvr_route_req_t *q,
                                             uint64_t now_ms);

/* Blocks of q's prompt as the router hashes it (its model's block size; Eagle: one token
 * fewer). */
size_t kvr_router_n_blocks(const kvr_router_t *r, const kvr_route_req_t *q);

/* Where each part of the decision's time went (for /metrics), measured with the clock given
 * to kvr_router_set_clock (all 0 without one: the library reads no clock itself). */
typedef struct kvr_route_timing {
    /* read-only */
    uint64_t hash_ns, lookup_ns, select_ns, total_ns;
} kvr_route_timing_t;

typedef struct kvr_route_res {
    /* read-only */
    char request_id[KVR_LOAD_MAX_ID_BYTES + 1];
    kvr_worker_t worker;
    uint32_t overlap_blocks;      /* round(effective overlap blocks) */
    uint64_t cached_tokens;
    uint32_t device_blocks;
    uint32_t predicted_blocks;    /* further blocks credited because requests in flight on the
                                     worker are computing them and this request will find them
                                     computed when admitted (router_inflight_credit_weight);
                                     its KV events had not reported them */
    uint32_t block_size; /* of the chosen worker's model */
    bool approximate;              /* the rank is routed approximately (set_rank_approximate):
                                      cached_tokens is what the router sent it */
    uint64_t events_cached_tokens; /* what its KV events say it holds (= cached_tokens unless
                                      approximate) */
    kvr_route_timing_t timing;
    const char *error_field;      /* KVR_EINVAL: what was wrong */
    kvr_req_handle_t handle;      /* the booking (update_state): for the _h lifecycle calls */
} kvr_route_res_t;

/* Decides (and, with update_state, books) a worker. Returns KVR_OK; KVR_EINVAL (bad request,
 * res->error_field says why); KVR_ETOOBIG (prompt over router_max_prompt_tokens);
 * KVR_ENOWORKER (no worker can serve: 503); KVR_EBUSY (every eligible rank is busy: queue
 * or 429); KVR_ENOTALLOWED (pinned worker outside the filters); KVR_EEXIST (request id
 * already in flight); KVR_EFULL (too many requests in flight). */
int kvr_router_route(kvr_router_t *r, const kvr_route_req_t *req, uint64_t now_ms,
                     kvr_route_res_t *res);

/* One of the rank's engine steps ended at now_us (microseconds, any monotonic origin the
 * caller keeps for kvr_route_req_t.now_us): its streamed tokens arrived, or the simulator
 * ended a step. The locality policy prices the time a busy rank's running step has left
 * (core/stepclock.h). KVR_ENOTFOUND if the rank is not registered. */
int kvr_router_worker_step(kvr_router_t *r, kvr_worker_t w, uint64_t now_us);
/* A streamed token of one request arrived from the rank at now_us; *seen is the request's own
 * counter (0 before its first token). The rank's step ends are inferred from which requests
 * get tokens (core/stepclock.h). KVR_ENOTFOUND if the rank is not registered. */
int kvr_router_worker_token(kvr_router_t *r, kvr_worker_t w, uint64_t *seen, uint64_t now_us);
/* What a rank's step clock has learnt of its engine's steps (weighted means, ms). */
typedef struct kvr_step_model {
    uint64_t steps;            /* steps measured */
    double mean_ms;            /* their mean length (0 while none is) */
    uint64_t decode_steps;     /* of those, the steps that computed no prompt token */
    double decode_ms;          /* their mean length (0 while none is) */
    uint64_t prefill_steps;    /* the others */
    bool has_slope;            /* a line is fitted to the prefill steps' lengths: */
    double prefill_ms_per_1k;  /* its slope, ms per 1,000 prompt tokens (0 without) */
} kvr_step_model_t;
/* The rank's step model (core/stepclock.h). KVR_ENOTFOUND if the rank is not registered. */
int kvr_router_step_model(const kvr_router_t *r, kvr_worker_t w, kvr_step_model_t *out);

/* Request lifecycle. KVR_ENOTFOUND for unknown ids (counted, harmless). */
int kvr_router_first_token(kvr_router_t *r, const char *id, size_t id_len, uint64_t now_ms);
int kvr_router_output_block(kvr_router_t *r, const char *id, size_t id_len, double decay_fraction,
                            uint64_t now_ms);
int kvr_router_free_request(kvr_router_t *r, const char *id, size_t id_len, uint64_t now_ms);
/* The same calls by the handle the route returned: O(1), no id hashing (kvrouter.h). */
int kvr_router_first_token_h(kvr_router_t *r, kvr_req_handle_t h, uint64_t now_ms);
int kvr_router_output_block_h(kvr_router_t *r, kvr_req_handle_t h, double decay_fraction,
                              uint64_t now_ms);
int kvr_router_free_h(kvr_router_t *r, kvr_req_handle_t h, uint64_t now_ms);
/* What the last booking kvr_router_route made admitted into the load tracker (replica sync
 * publishes it): NULL when the last route booked nothing. Its id points into that route's
 * res and its hashes into the router's scratch: valid until the next route, while res lives. */
const kvr_load_request_t *kvr_router_last_booking(const kvr_router_t *r);
/* Admits a booking decided elsewhere (a peer replica's) into the load tracker only (no index,
 * no session, no decision counted). KVR_OK with *handle; KVR_ENOWORKER when its rank is not
 * one of this router's; the tracker's errors (KVR_EEXIST for a live id, KVR_EINVAL, ...). */
int kvr_router_admit(kvr_router_t *r, const kvr_load_request_t *lr, uint64_t now_ms,
                     kvr_req_handle_t *handle);
/* Hashes q's prompt as a route would (block hashes and chained sequence hashes, cap each):
 * the block count, KVR_ETOOBIG when cap is short, KVR_EINVAL. Pure: any thread. */
long kvr_router_hash(const kvr_router_t *r, const kvr_route_req_t *q, uint64_t *block_hashes,
                     uint64_t *seq_hashes, size_t cap);
/* Periodic upkeep: expires stale requests and (approximate mode) stale decisions. */
void kvr_router_tick(kvr_router_t *r, uint64_t now_ms);
/* kv mode: routes one rank approximately (on) while its KV events cannot be trusted, or by
 * its events again (off). While on, its overlap is what the router itself sent it (recorded as
 * approximate mode records, with router_ttl_secs and its KV-cache size) and its events go on
 * feeding the index (kvr_route_res_t.events_cached_tokens reads them, so agreement can be
 * judged); off drops what was recorded. KVR_ENOWORKER (no such rank), KVR_EINVAL (not kv mode
 * with an index), KVR_ENOMEM. */
int kvr_router_set_rank_approximate(kvr_router_t *r, kvr_worker_t w, bool on);
bool kvr_router_rank_approximate(const kvr_router_t *r, kvr_worker_t w);

/* Approximate mode, decisions recorded elsewhere (a remote indexer): a router without a local
 * index hands each booked decision (its prompt's local block hashes and their chained
 * sequence hashes, valid during the call) to the sink, on the router's thread. */
typedef struct kvr_decision {
    /* read-only */
    kvr_worker_t worker;
    const uint64_t *lbh, *seq;
    size_t n;
    const char *model; /* the request's model; NULL when it named none */
    size_t model_len;
    uint64_t capacity_blocks; /* the rank's KV cache (its spec's total_kv_blocks); 0 unknown */
} kvr_decision_t;
typedef void (*kvr_decision_fn)(void *arg, const kvr_decision_t *d);
typedef struct kvr_decision_sink {
    /* public */
    kvr_decision_fn fn;
    void *arg;
} kvr_decision_sink_t;
/* sink NULL: none. */
void kvr_router_set_decision_sink(kvr_router_t *r, const kvr_decision_sink_t *sink);
/* Approximate mode: records another router's decision in this router's index, as its own are
 * (TTL, size bound). The caller checked that seq chains from lbh. KVR_OK; KVR_ENOTFOUND when
 * this router records no decisions (not approximate, or no local index); the recorder's
 * errors. */
int kvr_router_record(kvr_router_t *r, kvr_worker_t w, const uint64_t *lbh, const uint64_t *seq,
                      size_t n, uint64_t now_ms);

/* Per rank: what the index says of a prompt (POST /v1/query), every known rank listed. */
typedef struct kvr_rank_score {
    /* read-only */
    kvr_worker_t worker;
    uint32_t device_blocks, host_blocks, disk_blocks;
    uint64_t cached_tokens;    /* what the rank's events report (the tiers, weighted) */
    uint32_t predicted_blocks; /* further blocks requests in flight there are computing, that a
                                  request booked now would find computed when admitted */
} kvr_rank_score_t;

/* Scores (and loads) cover every registered rank; out arrays hold kvr_router_n_ranks(). */
size_t kvr_router_n_ranks(const kvr_router_t *r);
int kvr_router_query(kvr_router_t *r, const kvr_route_req_t *req, kvr_rank_score_t *out,
                     size_t cap, size_t *n);
int kvr_router_loads(kvr_router_t *r, const kvr_route_req_t *req, kvr_load_projection_t *out,
                     size_t cap, size_t *n);

typedef struct kvr_router_stats {
    /* read-only */
    uint64_t routed, rejected_busy, rejected_noworker, rejected_invalid, rejected_duplicate;
    uint64_t rejected_full, rejected_too_big, queries;
    uint64_t hash_ns, lookup_ns, select_ns; /* totals */
    /* bookings credited with blocks in flight (and those blocks); of them, confirmed by the
     * rank's events, expired unconfirmed (30 s), still watched */
    uint64_t inflight_credited, inflight_credited_blocks;
    uint64_t inflight_confirmed, inflight_expired, inflight_watched;
    /* refused because no worker serves the request's model or adapter (a client's error,
     * answered 404; not in rejected_noworker) */
    uint64_t rejected_nomodel;
} kvr_router_stats_t;
void kvr_router_stats(const kvr_router_t *r, kvr_router_stats_t *out);
/* A monotonic clock in nanoseconds (any origin), the caller's. */
typedef uint64_t (*kvr_clock_fn)(void);
/* The clock kvr_route_timing_t is measured with; NULL (the default) = no timings. The router
 * never decides by it. */
void kvr_router_set_clock(kvr_router_t *r, kvr_clock_fn now_ns);
const kvr_load_t *kvr_router_load(const kvr_router_t *r);
/* The configuration in effect: the caller's, with kvr_config_resolve applied. */
const kvr_router_config_t *kvr_router_config(const kvr_router_t *r);
/* The index the router reads: NULL without one (non-KV modes, overlap_score_credit 0). In
 * approximate mode the router itself writes it, on the router's thread. */
kvr_index_t *kvr_router_index(kvr_router_t *r);

#ifdef __cplusplus
}
#endif
#endif /* KVR_ROUTER_H */

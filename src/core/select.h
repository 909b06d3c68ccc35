/*
 * select.h (private to the tree; not installed): worker selection, reference 5.2-5.5 and 5.8
 * (core/select.c): hard filters, each candidate's cost under the selection policy
 * (core/policy.h), and the pick; the busy test of one rank.
 *
 * Invariants: select.c states them (every cost that reaches a pick is >= 0 or +Inf).
 * Ownership: nothing allocated; every array is the caller's. Threads: any thread, each with
 * its own rng. Cost: O(candidates x taints) per call.
 */
#ifndef KVR_CORE_SELECT_H
#define KVR_CORE_SELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/rng.h"
#include "kvrouter/router.h"

/* The prompt tokens a millisecond of step wait costs at step_wait_weight 1: the wait is priced
 * in tokens, then in the request's blocks, so the price does not move with the block size. */
#define KVR_SELECT_STEP_WAIT_TOKENS 16.0

/* Every knob of the cost function, with the reference defaults (kvr_select_config_default).
 * Validation (kvr_select_config_validate) names the first bad field. */
typedef struct kvr_select_config {
    /* public */
    double overlap_score_credit;         /* 1.0; finite >= 0 (values above 1 are allowed) */
    double overlap_score_credit_decay;   /* 0.0; finite >= 0 */
    double prefill_load_scale;           /* 1.0; finite >= 0 */
    double decode_active_request_weight; /* 0.0; finite >= 0 */
    double host_cache_hit_weight;        /* 0.75; [0, 1] */
    double disk_cache_hit_weight;        /* 0.25; [0, 1] (disk and external tiers) */
    double shared_cache_multiplier;      /* 0.0; [0, 1] */
    double temperature;                  /* 0.0 (router_temperature); finite >= 0 */
    double step_wait_weight;             /* 0.0 (router_step_wait_weight); finite >= 0;
                                            locality policy: a ms of step wait costs this
                                            x KVR_SELECT_STEP_WAIT_TOKENS prompt tokens */
    double inflight_credit_weight;       /* 0.0 (router_inflight_credit_weight); [0, 1]:
                                            credit per predicted_blocks block */
    kvr_select_policy_t policy;          /* router_selection_policy */
    bool decode_pool;                    /* workers are a decode pool (5.4 special case) */
} kvr_select_config_t;

/* One (worker_id, dp_rank) the router may pick, with the numbers it gathered for this prompt. */
typedef struct kvr_select_candidate {
    /* public */
    kvr_worker_t worker;
    uint32_t device_blocks;            /* leading prompt blocks cached on the device */
    uint32_t host_blocks;              /* further blocks in host memory (extension) */
    uint32_t disk_blocks;              /* further blocks on disk or external storage */
    uint32_t shared_blocks;            /* shared-pool hits at positions >= device_blocks */
    uint32_t predicted_blocks;         /* further blocks that requests in flight on the rank
                                          are computing and its events have not reported, and
                                          that this request will find computed when admitted
                                          (core/router.c) */
    uint64_t active_prefill_tokens;    /* tracker: prefill tokens in flight now */
    uint64_t potential_prefill_tokens; /* tracker: active + this prompt's uncached tokens (4.5) */
    uint64_t potential_decode_blocks;  /* tracker: active blocks + this prompt's new ones */
    uint32_t active_requests;
    double step_wait_ms;               /* its engine step under way: time left (stepclock.h) */
    uint64_t capacity_blocks;          /* its KV cache (spec's total_kv_blocks); 0: unknown */
    const char *const *taints;         /* the worker's taints */
    size_t n_taints;
    bool has_load;                     /* false: the tracker knows nothing (loads read as 0) */
    bool fenced;                       /* dead or deregistered: never picked */
    bool unfit;                        /* another model, or lacks the adapter: never picked */
    bool busy;                         /* over a busy threshold (kvr_busy): never picked */
    bool queue_busy;                   /* over the queue threshold: may be picked, but while
                                          every eligible rank is, the request waits (KVR_EBUSY) */
} kvr_select_candidate_t;

typedef struct kvr_select_request {
    /* public */
    uint64_t isl_tokens;               /* prompt length; 0 is allowed (load-based pick) */
    uint64_t request_blocks;           /* 0 = ceil(isl_tokens / block_size) */
    uint32_t block_size;               /* > 0 */
    bool track_prefill_tokens;         /* router_track_prefill_tokens after the override */
    bool has_pinned;                   /* pinned: that rank or an error, never another */
    kvr_worker_t pinned;
    bool has_preferred;                /* preferred (session affinity): that rank if eligible */
    kvr_worker_t preferred;
    bool has_allowed;                  /* false: every worker id is allowed */
    const uint64_t *allowed_ids;       /* ascending (repeats allowed) */
    size_t n_allowed;
    const uint64_t *exclude_ids;       /* worker ids tried already: never picked; any order */
    size_t n_exclude;
    const char *const *required_taints;/* a worker must carry all of them */
    size_t n_required;
    const kvr_taint_weight_t *preferred_taints;
    size_t n_preferred;
    const kvr_select_override_t *ovr;  /* NULL = none */
    const kvr_select_candidate_t *cands;
    size_t n_cands;
} kvr_select_request_t;

/* Why a candidate was (not) eligible, in the order the filters are applied. */
typedef enum kvr_select_why {
    KVR_SELECT_ELIGIBLE = 0,
    KVR_SELECT_FENCED = 1,        /* dead or deregistered */
    KVR_SELECT_NOT_ALLOWED = 2,   /* not in allowed_ids */
    KVR_SELECT_MISSING_TAINT = 3, /* lacks a required taint */
    KVR_SELECT_BUSY = 4,          /* eligible but for load */
    KVR_SELECT_NOT_PINNED = 5,    /* eligible, but another rank is pinned or preferred */
    KVR_SELECT_OTHER_MODEL = 6,   /* serves another model, or lacks the request's adapter */
    KVR_SELECT_EXCLUDED = 7,      /* in exclude_ids (tried already) */
} kvr_select_why_t;

const char *kvr_select_why_name(kvr_select_why_t why);

/* Per-candidate breakdown of a decision (every term is computed, eligible or not). */
typedef struct kvr_select_explain {
    /* read-only */
    kvr_select_why_t why;
    double effective_overlap_blocks; /* device + host_w * host + disk_w * disk
                                        + inflight_w * predicted */
    uint64_t cached_tokens;          /* round(effective_overlap_blocks * block_size) */
    double raw_prefill_blocks;       /* prefill tokens (tracker + prompt) / block_size */
    double decay;                    /* device-credit decay in (0, 1] */
    double overlap_credit_blocks;    /* of which inflight_credit_blocks: */
    double inflight_credit_blocks;   /* the predicted blocks' part (decayed like the device's) */
    double adjusted_prefill_blocks;  /* max(raw - credit, 0) (locality: with the step wait,
                                        floored, + the memory's; policy_locality.c) */
    double step_wait_blocks;         /* policies that price it: step_wait_weight x the
                                        candidate's wait x KVR_SELECT_STEP_WAIT_TOKENS / bs */
    double held_share;               /* the most of the prompt an eligible candidate holds
                                        (every tier, or in flight), [0, 1]: the same for all */
    double memory_blocks;            /* locality: blocks booked past 90% of the KV cache,
                                        times 1 - held_share (policy_locality.c) */
    double prefill_cost;             /* prefill_load_scale * adjusted (default policy) */
    double decode_cost_blocks;
    double active_request_cost;
    double logit;                    /* unbiased cost */
    double preferred_weight;         /* sum of preferred-taint weights the worker carries */
    double bias;                     /* tanh(preferred_weight) */
    double cost;                     /* logit * exp(-bias): what the pick compares */
    double probability;              /* of being picked by this call */
} kvr_select_explain_t;

typedef struct kvr_select_result {
    /* read-only */
    size_t index;                    /* into cands; SIZE_MAX when nothing was picked */
    kvr_worker_t worker;
    double cost;                     /* biased cost; the unbiased logit for pinned/preferred */
    double effective_overlap_blocks;
    uint64_t cached_tokens;
    uint64_t request_blocks;
    size_t n_eligible;               /* candidates passing every filter */
    size_t n_busy;                   /* candidates excluded only for load */
    size_t n_queue_busy;             /* eligible candidates over the queue threshold */
    const char *field;               /* KVR_EINVAL: the offending field */
} kvr_select_result_t;

void kvr_select_config_default(kvr_select_config_t *cfg);
/* KVR_OK, or KVR_EINVAL naming the field (NaN, Inf, negative, out of range) in *field. */
int kvr_select_config_validate(const kvr_select_config_t *cfg, const char **field);
int kvr_select_override_validate(const kvr_select_override_t *ovr, const char **field);
/* out = base with ovr applied (ovr may be NULL); both validated, out only written on KVR_OK. */
int kvr_select_config_merge(const kvr_select_config_t *base, const kvr_select_override_t *ovr,
                            kvr_select_config_t *out, const char **field);

/* Picks a candidate. cfg NULL = defaults; explain NULL or req->n_cands entries (caller-owned).
 * Returns KVR_OK; KVR_ENOTALLOWED (pinned rank outside allowed_ids or missing a required
 * taint); KVR_ENOWORKER (nothing eligible even ignoring load; pinned rank absent or fenced);
 * KVR_EBUSY (something would be eligible but for load; or the pinned rank is busy);
 * KVR_EINVAL (out->field names it). No allocation; O(n_cands) for bounded taint lists. */
int kvr_select(const kvr_select_config_t *cfg, const kvr_select_request_t *req, kvr_rng_t *rng,
               kvr_select_result_t *out, kvr_select_explain_t *explain);

/* Busy test of one rank (reference 5.8; with prefill_frac = router_queue_threshold it is
 * 5.7's "busy for queueing"). A rank is busy if ANY set threshold is exceeded. */
#define KVR_DEFAULT_MAX_BATCHED_TOKENS 10000000u

typedef struct kvr_busy_thresholds {
    /* public */
    bool has_prefill_tokens;    /* active_prefill_tokens_threshold (absolute) */
    uint64_t prefill_tokens;
    bool has_prefill_frac;      /* active_prefill_tokens_threshold_frac: finite >= 0 */
    double prefill_frac;        /* of max_num_batched_tokens */
    bool has_decode_frac;       /* active_decode_blocks_threshold: finite >= 0 */
    double decode_frac;         /* of total_kv_blocks */
} kvr_busy_thresholds_t;

typedef struct kvr_busy_load {
    /* public */
    uint64_t active_prefill_tokens;
    uint64_t max_num_batched_tokens; /* 0 = unknown: KVR_DEFAULT_MAX_BATCHED_TOKENS */
    uint64_t used_blocks;            /* worker-published kv_used_blocks or tracked decode blocks */
    uint64_t total_kv_blocks;        /* 0 = unknown: the decode test is skipped */
} kvr_busy_load_t;

int kvr_busy_thresholds_validate(const kvr_busy_thresholds_t *t, const char **field);
bool kvr_busy(const kvr_busy_thresholds_t *t, const kvr_busy_load_t *load);

#endif /* KVR_CORE_SELECT_H */

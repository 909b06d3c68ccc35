/*
 * policy.h (private to the tree; not installed): the router's policies as a table, one file
 * each (core/policy_<name>.c), as h2o's balancers are. Two kinds:
 *
 *   scorers   the cache-aware policies of the kv and approx modes (router_selection_policy):
 *             the selector (core/select.c) filters the candidates, computes each one's prefill
 *             terms, then asks the scorer for its cost (logit), and picks the cheapest or
 *             samples by temperature. dynamo, lmetric, locality.
 *   pickers   the load-only modes (router_mode): the router filters the ranks, then the picker
 *             chooses one of the eligible ones. round_robin, random, least_loaded.
 *
 * Invariants: a policy is a constant (no state of its own: round robin's position and the rng
 * are the router's, handed in); a scorer sets prefill_cost and logit and leaves every other
 * term as the selector computed it; a picker returns an eligible index or SIZE_MAX, and draws
 * from the rng the same number of times whatever it finds (the random picker: once per call),
 * so a seed gives the same decisions.
 * Ownership: static tables. Threads: any. Cost: a scorer O(1); a picker O(candidates).
 */
#ifndef KVR_CORE_POLICY_H
#define KVR_CORE_POLICY_H

#include <stdbool.h>
#include <stddef.h>

#include "base/rng.h"
#include "core/select.h"
#include "kvrouter/config.h"

/* What a picker sees: the ranks, and which of them it may pick. */
typedef struct kvr_pick_view {
    const kvr_select_candidate_t *cands;
    size_t n_cands;
    size_t n_eligible;                           /* how many eligible() accepts; may be 0 */
    bool (*eligible)(const void *ctx, size_t i); /* passes every filter and is not busy */
    const void *ctx;
    kvr_rng_t *rng;
    uint64_t turn; /* decisions made so far (round robin's position) */
} kvr_pick_view_t;

typedef struct kvr_policy {
    const char *name;
    /* Scorers: t's prefill terms (effective overlap, raw prefill, credit, adjusted prefill),
     * decode cost and active-request cost are computed (and the step wait's price in blocks,
     * when uses_step_wait); sets prefill_cost and logit. NULL for pickers. */
    void (*score)(const kvr_select_config_t *k, const kvr_select_candidate_t *c,
                  kvr_select_explain_t *t);
    bool decode_pool_rule; /* scorers: the 5.4 decode-pool case (select.c) comes first */
    bool uses_step_wait;   /* scorers: reads the candidates' step_wait_ms */
    /* Pickers: the index chosen among the eligible, SIZE_MAX when none is. Called once per
     * decision, eligible or not. NULL for scorers. */
    size_t (*pick)(const kvr_pick_view_t *v);
} kvr_policy_t;

extern const kvr_policy_t kvr_policy_dynamo;
extern const kvr_policy_t kvr_policy_lmetric;
extern const kvr_policy_t kvr_policy_locality;
extern const kvr_policy_t kvr_policy_round_robin;
extern const kvr_policy_t kvr_policy_random;
extern const kvr_policy_t kvr_policy_least_loaded;
extern const kvr_policy_t kvr_policy_direct;

/* The scorer of a selection policy; NULL for a value outside the enum. */
const kvr_policy_t *kvr_policy_scorer(kvr_select_policy_t p);
/* The picker of a load-only router mode; NULL for the cache-aware modes (kv, approx: the
 * selector decides with the scorer) and values outside the enum. */
const kvr_policy_t *kvr_policy_picker(kvr_router_mode_t mode);
/* The least-loaded pick (least_loaded's and direct's): the eligible candidate with the least
 * potential prefill tokens plus active requests, the first on a tie; SIZE_MAX when none. */
size_t kvr_pick_least_loaded(const kvr_pick_view_t *v);
/* Pickers' helper: the index of the n-th (from 0) eligible candidate; SIZE_MAX past the last. */
size_t kvr_pick_nth(const kvr_pick_view_t *v, uint64_t n);

#endif /* KVR_CORE_POLICY_H */

/*
 * policy_least_loaded.c: the eligible rank with the least potential prefill tokens plus
 * active requests; the first such rank on a tie. No cache awareness.
 * Invariants: no rng draw. Threads: any. Cost: O(candidates).
 */
#include <stdint.h>

#include "core/policy.h"

static uint64_t load_of(const kvr_select_candidate_t *c)
{
    return c->potential_prefill_tokens + c->active_requests;
}

size_t kvr_pick_least_loaded(const kvr_pick_view_t *v)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < v->n_cands; i++)
        if (v->eligible(v->ctx, i) &&
            (best == SIZE_MAX || load_of(&v->cands[i]) < load_of(&v->cands[best])))
            best = i;
    return best;
}

const kvr_policy_t kvr_policy_least_loaded = {.name = "least_loaded",
                                               .pick = kvr_pick_least_loaded};

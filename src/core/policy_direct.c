/*
 * policy_direct.c: direct mode, for a gateway that picks workers itself: every request names its
 * worker (router.c refuses one that does not), so the filters leave that worker's ranks; of
 * them, the one with the least potential prefill tokens plus active requests (the first on a
 * tie). The router only books, tracks and proxies.
 * Invariants: no rng draw. Threads: any. Cost: O(candidates).
 */
#include <stdint.h>

#include "core/policy.h"

static uint64_t load_of(const kvr_select_candidate_t *c)
{
    return c->potential_prefill_tokens + c->active_requests;
}

static size_t pick(const kvr_pick_view_t *v)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < v->n_cands; i++)
        if (v->eligible(v->ctx, i) &&
            (best == SIZE_MAX || load_of(&v->cands[i]) < load_of(&v->cands[best])))
            best = i;
    return best;
}

const kvr_policy_t kvr_policy_direct = {.name = "direct", .pick = pick};

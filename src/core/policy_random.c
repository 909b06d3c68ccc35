/*
 * policy_random.c: an eligible rank uniformly at random (one draw, modulo the count of
 * eligible ranks, as the router always drew it). No cache awareness.
 * Invariants: exactly one rng draw per call, eligible ranks or not (seeded runs repeat).
 * Threads: any, with its own rng. Cost: O(candidates).
 */
#include <stdint.h>

#include "core/policy.h"

static size_t pick(const kvr_pick_view_t *v)
{
    uint64_t draw = kvr_rng_next(v->rng);
    return v->n_eligible > 0 ? kvr_pick_nth(v, draw % v->n_eligible) : SIZE_MAX;
}

const kvr_policy_t kvr_policy_random = {.name = "random", .pick = pick};

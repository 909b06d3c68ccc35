/*
 * policy_round_robin.c: the eligible ranks in turn: the (turn mod eligible)-th, where turn
 * counts the router's decisions. No cache awareness.
 * Invariants: no rng draw. Threads: any. Cost: O(candidates).
 */
#include <stdint.h>

#include "core/policy.h"

static size_t pick(const kvr_pick_view_t *v)
{
    return v->n_eligible > 0 ? kvr_pick_nth(v, v->turn % v->n_eligible) : SIZE_MAX;
}

const kvr_policy_t kvr_policy_round_robin = {.name = "round_robin", .pick = pick};

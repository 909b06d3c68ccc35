/*
 * policy.c: the policy table (policy.h): which policy a selection policy or a router mode
 * names. The policies themselves are in policy_<name>.c.
 *
 * Invariants: every value of kvr_select_policy_t has a scorer and every load-only value of
 * kvr_router_mode_t a picker (asserted by the table's size). Threads: any. Cost: O(1).
 */
#include "core/policy.h"

#include <stdint.h>

static const kvr_policy_t *const SCORERS[] = {
    [KVR_SELECT_POLICY_DYNAMO] = &kvr_policy_dynamo,
    [KVR_SELECT_POLICY_LMETRIC] = &kvr_policy_lmetric,
    [KVR_SELECT_POLICY_LOCALITY] = &kvr_policy_locality,
};
_Static_assert(sizeof SCORERS / sizeof SCORERS[0] == KVR_SELECT_POLICY_LOCALITY + 1,
               "a scorer per selection policy");

static const kvr_policy_t *const PICKERS[] = {
    [KVR_MODE_KV] = NULL,
    [KVR_MODE_ROUND_ROBIN] = &kvr_policy_round_robin,
    [KVR_MODE_RANDOM] = &kvr_policy_random,
    [KVR_MODE_LEAST_LOADED] = &kvr_policy_least_loaded,
    [KVR_MODE_APPROX] = NULL,
    [KVR_MODE_DIRECT] = &kvr_policy_direct,
};
_Static_assert(sizeof PICKERS / sizeof PICKERS[0] == KVR_MODE_DIRECT + 1,
               "an entry per router mode");

const kvr_policy_t *kvr_policy_scorer(kvr_select_policy_t p)
{
    return (unsigned)p < sizeof SCORERS / sizeof SCORERS[0] ? SCORERS[p] : NULL;
}

const kvr_policy_t *kvr_policy_picker(kvr_router_mode_t mode)
{
    return (unsigned)mode < sizeof PICKERS / sizeof PICKERS[0] ? PICKERS[mode] : NULL;
}

size_t kvr_pick_nth(const kvr_pick_view_t *v, uint64_t n)
{
    uint64_t seen = 0;
    for (size_t i = 0; i < v->n_cands; i++)
        if (v->eligible(v->ctx, i) && seen++ == n)
            return i;
    return SIZE_MAX;
}

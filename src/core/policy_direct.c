/*
 * policy_direct.c: direct mode, for a gateway that picks workers itself: every request names its
 * worker (router.c refuses one that does not), so the filters leave that worker's ranks; of
 * them, the least loaded (kvr_pick_least_loaded). The router only books, tracks and proxies.
 * Invariants: no rng draw. Threads: any. Cost: O(candidates).
 */
#include "core/policy.h"

const kvr_policy_t kvr_policy_direct = {.name = "direct", .pick = kvr_pick_least_loaded};

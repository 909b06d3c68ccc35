/*
 * policy_dynamo.c: the reference's cost (Dynamo's KV router, 5.4), the default scorer:
 *   logit = prefill_load_scale * adjusted prefill + potential decode blocks
 *           + decode_active_request_weight * active requests
 * Invariants: terms >= 0 in, logit >= 0 out (+Inf on overflow). Threads: any. Cost: O(1).
 */
#include "core/policy.h"

static void score(const kvr_select_config_t *k, const kvr_select_candidate_t *c,
                  kvr_select_explain_t *t)
{
    (void)c;
    t->prefill_cost = k->prefill_load_scale * t->adjusted_prefill_blocks;
    t->logit = t->prefill_cost + t->decode_cost_blocks + t->active_request_cost;
}

const kvr_policy_t kvr_policy_dynamo = {
    .name = "dynamo", .score = score, .decode_pool_rule = true, .uses_step_wait = false};

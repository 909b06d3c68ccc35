/*
 * policy_lmetric.c: the product cost: logit = adjusted prefill * (potential decode + 1), so
 * a rank with little decode work takes more prefill and the reverse. The decode-pool case of
 * the reference does not apply to it. Where nothing is prefilled (a disaggregated request's
 * decode leg, or prefill not tracked), the product is 0 on every rank and the reference's pick
 * is a random one; here the decode work decides then.
 * Invariants: terms >= 0 in, logit >= 0 out (+Inf on overflow). Threads: any. Cost: O(1).
 */
#include "core/policy.h"

static void score(const kvr_select_config_t *k, const kvr_select_candidate_t *c,
                  kvr_select_explain_t *t)
{
    (void)k;
    (void)c;
    t->prefill_cost = t->adjusted_prefill_blocks;
    if (t->raw_prefill_blocks <= 0) {
        t->logit = t->decode_cost_blocks;
        return;
    }
    t->logit = t->adjusted_prefill_blocks * (t->decode_cost_blocks + 1.0);
}

const kvr_policy_t kvr_policy_lmetric = {
    .name = "lmetric", .score = score, .decode_pool_rule = false, .uses_step_wait = false};

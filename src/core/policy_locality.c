/*
 * policy_locality.c: lmetric with cached blocks credited twice, the router's default
 * (docs/sim.md has the figures). A cached block counts twice: it saves its prefill now and
 * keeps its prefix where the next request with it will look; but the prefill term never falls
 * below a tenth of what the worker really has to prefill plus one block, so among workers
 * that all hold most of the prompt the load still decides. The engine step under way delays
 * the prefill by the same time whatever the prompt: its wait is priced in blocks
 * (step_wait_weight per ms).
 * Invariants: terms >= 0 in, logit >= 0 out (+Inf on overflow). Threads: any. Cost: O(1).
 */
#include <math.h>

#include "core/policy.h"

static void score(const kvr_select_config_t *k, const kvr_select_candidate_t *c,
                  kvr_select_explain_t *t)
{
    double real = t->adjusted_prefill_blocks;
    t->step_wait_blocks = k->step_wait_weight * c->step_wait_ms;
    t->adjusted_prefill_blocks =
        fmax(t->raw_prefill_blocks - 2.0 * t->overlap_credit_blocks, 0.1 * real + 1.0) +
        t->step_wait_blocks;
    t->prefill_cost = t->adjusted_prefill_blocks;
    t->logit = t->adjusted_prefill_blocks * (t->decode_cost_blocks + 1.0);
}

const kvr_policy_t kvr_policy_locality = {
    .name = "locality", .score = score, .decode_pool_rule = true, .uses_step_wait = true};

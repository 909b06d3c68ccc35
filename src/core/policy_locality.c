/*
 * policy_locality.c: lmetric with cached blocks credited twice, the router's default
 * (docs/sim.md has the figures). A cached block counts twice: it saves its prefill now and
 * keeps its prefix where the next request with it will look; but the prefill term never falls
 * below a tenth of what the worker really has to prefill plus one block, so among workers
 * that all hold most of the prompt the load still decides. The engine step under way delays
 * the prefill by the same time whatever the prompt: its wait is priced in blocks
 * (step_wait_weight per ms). A block another request is computing on the worker now (in
 * flight, not reported yet) counts once: it spares this prompt its prefill, but the prefill
 * computing it is still the worker's load (raw counts it), so a burst on a new prefix goes
 * where that prefix is being computed only when waiting there costs no more than computing
 * it elsewhere. Counted twice, such blocks would hide the load of that prefill and pile the
 * burst up behind it (measured with `kvrouter sim` on a fanout trace of 4 requests/s, 300 s,
 * at --rate-scale 6 and 7.5: p50 1.43x and 1.27x the clairvoyant oracle's, against 1.23x and
 * 1.12x counted once).
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
        fmax(t->raw_prefill_blocks - 2.0 * t->overlap_credit_blocks + t->inflight_credit_blocks,
             0.1 * real + 1.0) +
        t->step_wait_blocks;
    t->prefill_cost = t->adjusted_prefill_blocks;
    t->logit = t->adjusted_prefill_blocks * (t->decode_cost_blocks + 1.0);
}

const kvr_policy_t kvr_policy_locality = {
    .name = "locality", .score = score, .decode_pool_rule = true, .uses_step_wait = true};

/*
 * policy_locality.c: lmetric with cached blocks credited twice, the router's default
 * (docs/sim.md has the figures). A cached block counts twice: it saves its prefill now and
 * keeps its prefix where the next request with it will look; but the prefill term never falls
 * below a tenth of what the worker really has to prefill plus one block, so among workers
 * that all hold most of the prompt the load still decides. The engine step under way delays
 * the prefill by the same time whatever the prompt: its wait is priced in blocks
 * (step_wait_weight blocks of 16 tokens per ms, priced by the selector: as tokens, so the
 * price does not change with the block size; at 64-token blocks one block per ms spread
 * agent's and fanout's traffic: agent's TTFT p90 69-78 ms against lmetric's 54-60, fanout's
 * hits 0.32-0.33 against 0.44-0.56 priced as tokens; docs/sim.md, "Other block sizes"). The
 * wait is time, as the prefill is, so it is added before the floor and scaled with it: added
 * after it, a worker holding the whole prompt had its prefill counted a tenth and its wait in
 * full, and a step of a few tens of ms sent requests away from their cache (agent with
 * 2,048-token chunks: TTFT p90 60-70 ms against 56-61; docs/sim.md, "The wait and the
 * floor"). A block in flight (another request on the worker is computing
 * it; credited only when this request will find it computed, core/router.c) counts one and a
 * half times (INFLIGHT_AGAIN): once because it spares this prompt its prefill, and half again
 * because its prefix stays where the next request with it looks, but the prefill computing it
 * still stands between this request and its first token (raw counts it), for part of a step
 * or more. Measured with `kvrouter sim` over 18 fanout runs (seeds 1-3, Poisson and Gamma CV 3
 * arrivals, 4 to 16 requests/s, three loads each; docs/sim.md, "Choosing the half") with 0,
 * 0.25, 0.5, 0.75 and 1 again: 0.25 and 0.5 hold TTFT p90 and p99 best, 0.5 with more hits
 * (1.23x those of the previous credit, against 1.07x) and a lower ITL; 1 (counting it twice,
 * as a cached block) hits most but piles bursts behind the prefill computing them.
 * KV memory: an engine admits a request only when its blocks fit, and past that preempts
 * running requests to grow the others; the prefill and decode terms see neither. So the
 * blocks booked on a rank with this prompt (potential decode blocks) beyond MEMORY_LINE of its
 * KV cache are added to the prefill term, MEMORY_WEIGHT each, times the share of the prompt
 * no eligible rank holds (held_share): a prompt needs its blocks resident wherever it goes,
 * so for one a rank holds, moving it to a rank with room costs a recompute the prefill term
 * already weighs; in overload, where every rank is past the line, the full term traded held
 * prefixes for differences in queued load (on `agent` with caches of 4,096 blocks, TTFT p50
 * 78 ms -> 15 s). The router books prompt blocks, not the output's growth, hence a line below
 * the whole cache. Measured with `kvrouter sim` (docs/sim.md, "KV memory near full") on two
 * traces synthesized from the conversation trace near the fleet's capacity: lines 0.8, 0.9
 * and 1 (0.9 had the lowest TTFT p90 at the four loads tried), weights 1 and 2 (within noise
 * of each other; 1 kept the tail under lmetric's and dynamo's more often); the generated
 * workloads never book past the line at 16,384 blocks and are unchanged. Unknown capacity
 * (0): no term.
 * Invariants: terms >= 0 in, logit >= 0 out (+Inf on overflow). Threads: any. Cost: O(1).
 */
#include <math.h>

#include "core/policy.h"

#define INFLIGHT_AGAIN 0.5 /* in-flight blocks count 1 + this; cached ones twice */
#define MEMORY_LINE 0.9    /* of a rank's KV cache: booked blocks beyond it are priced */
#define MEMORY_WEIGHT 1.0  /* prefill blocks per booked block beyond the line */

/* Booked blocks (with this prompt's) beyond MEMORY_LINE of the rank's cache, weighted, times
 * the share of the prompt no eligible rank holds. */
static double memory_blocks(const kvr_select_candidate_t *c, const kvr_select_explain_t *t)
{
    if (c->capacity_blocks == 0)
        return 0;
    double over = fmax(t->decode_cost_blocks - MEMORY_LINE * (double)c->capacity_blocks, 0.0);
    return MEMORY_WEIGHT * over * (1.0 - t->held_share);
}

static void score(const kvr_select_config_t *k, const kvr_select_candidate_t *c,
                  kvr_select_explain_t *t)
{
    /* the wait is time like the prefill: inside the floor, scaled with it */
    double real = t->adjusted_prefill_blocks + t->step_wait_blocks;
    t->adjusted_prefill_blocks =
        fmax(t->raw_prefill_blocks + t->step_wait_blocks - 2.0 * t->overlap_credit_blocks +
                 (1.0 - INFLIGHT_AGAIN) * t->inflight_credit_blocks,
             0.1 * real + 1.0);
    t->memory_blocks = memory_blocks(c, t);
    t->adjusted_prefill_blocks += t->memory_blocks;
    t->prefill_cost = t->adjusted_prefill_blocks;
    t->logit = t->adjusted_prefill_blocks * (t->decode_cost_blocks + 1.0);
}

const kvr_policy_t kvr_policy_locality = {
    .name = "locality", .score = score, .decode_pool_rule = true, .uses_step_wait = true};

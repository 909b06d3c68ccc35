/*
 * test_select.c: the selector: the cost function term by term (Dynamo's cost, with its worked
 * example), the filters and their status codes, pinned and preferred ranks, the pick
 * (uniform ties, softmax), per-request overrides and config validation (S22, S23), and the
 * busy test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "base/rng.h"
#include "core/select.h"
#include "kvrouter.h"

#define BS 16u
#define EPS 1e-9

static void assert_near(double a, double b)
{
    if (!(fabs(a - b) <= EPS * fmax(1.0, fabs(b)))) {
        fprintf(stderr, "expected %.17g, got %.17g\n", b, a);
        fail();
    }
}

/* A candidate as the router would fill it for a prompt of isl tokens: potential prefill =
 * active + uncached prompt tokens (4.5). */
static kvr_select_candidate_t cand(uint64_t id, uint32_t device, uint64_t active,
                                   uint64_t decode, uint64_t isl)
{
    uint64_t cached = (uint64_t)device * BS;
    return (kvr_select_candidate_t){
        .worker = {id, 0},
        .device_blocks = device,
        .active_prefill_tokens = active,
        .potential_prefill_tokens = active + isl - (cached < isl ? cached : isl),
        .potential_decode_blocks = decode,
        .has_load = true,
    };
}

static kvr_select_request_t request(uint64_t isl, const kvr_select_candidate_t *c, size_t n)
{
    return (kvr_select_request_t){
        .isl_tokens = isl, .block_size = BS, .track_prefill_tokens = true, .cands = c, .n_cands = n};
}

static kvr_select_config_t defaults(void)
{
    kvr_select_config_t cfg;
    kvr_select_config_default(&cfg);
    return cfg;
}

/* The locality cost with the step wait priced at weight (blocks of 16 tokens per ms). */
static kvr_select_config_t locality_waits(double weight)
{
    kvr_select_config_t cfg = defaults();
    cfg.policy = KVR_SELECT_POLICY_LOCALITY;
    cfg.step_wait_weight = weight;
    return cfg;
}

static int run(const kvr_select_config_t *cfg, const kvr_select_request_t *rq,
               kvr_select_result_t *out, kvr_select_explain_t *ex, uint64_t seed)
{
    kvr_rng_t rng;
    kvr_rng_seed(&rng, seed);
    return kvr_select(cfg, rq, &rng, out, ex);
}

/* ---- the cost function ---- */

/* Reference 5.4 docs: W1 8 + 10 = 18, W2 5 + 5 = 10 (chosen), W3 2 + 9 = 11. */
static void test_worked_example(void **s)
{
    (void)s;
    uint64_t isl = 10 * BS;
    kvr_select_candidate_t c[3] = {cand(1, 2, 0, 10, isl), cand(2, 5, 0, 5, isl),
                                   cand(3, 8, 0, 9, isl)};
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_result_t r;
    kvr_select_explain_t ex[3];
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 18);
    assert_near(ex[1].cost, 10);
    assert_near(ex[2].cost, 11);
    assert_near(ex[0].prefill_cost, 8);
    assert_near(ex[2].prefill_cost, 2);
    assert_int_equal(r.index, 1);
    assert_int_equal(r.worker.worker_id, 2);
    assert_near(r.cost, 10);
    assert_near(r.effective_overlap_blocks, 5);
    assert_int_equal(r.cached_tokens, 5 * BS);
    assert_int_equal(r.request_blocks, 10);
    assert_int_equal(r.n_eligible, 3);
    assert_near(ex[1].probability, 1);
    assert_near(ex[0].probability, 0);
}

/* Every term with non-default knobs, checked against the formulas by hand. */
static void test_each_term(void **s)
{
    (void)s;
    kvr_select_config_t cfg = defaults();
    cfg.prefill_load_scale = 2.0;
    cfg.decode_active_request_weight = 0.5;
    cfg.shared_cache_multiplier = 0.5;
    cfg.overlap_score_credit = 0.8;
    uint64_t isl = 20 * BS;
    kvr_select_candidate_t c = cand(7, 4, 3 * BS, 30, isl);
    c.host_blocks = 4;
    c.disk_blocks = 2;
    c.shared_blocks = 2;
    c.active_requests = 6;
    kvr_select_request_t rq = request(isl, &c, 1);
    kvr_select_explain_t ex;
    kvr_select_result_t r;
    assert_int_equal(run(&cfg, &rq, &r, &ex, 1), KVR_OK);
    double eff = 4 + 0.75 * 4 + 0.25 * 2; /* 7.5 */
    assert_near(ex.effective_overlap_blocks, eff);
    assert_int_equal(ex.cached_tokens, 120); /* 7.5 * 16 */
    /* raw = potential (active 48 + uncached 320 - 64) + cached 120 = 424 tokens */
    assert_near(ex.raw_prefill_blocks, 424.0 / BS);
    assert_near(ex.decay, 1);
    double credit = 0.8 * 4 + 0.75 * 4 + 0.25 * 2 + 0.5 * 2;
    assert_near(ex.overlap_credit_blocks, credit);
    assert_near(ex.adjusted_prefill_blocks, 424.0 / BS - credit);
    assert_near(ex.prefill_cost, 2 * (424.0 / BS - credit));
    assert_near(ex.decode_cost_blocks, 30);
    assert_near(ex.active_request_cost, 3);
    double logit = 2 * (424.0 / BS - credit) + 30 + 3;
    assert_near(ex.logit, logit);
    assert_near(ex.bias, 0);
    assert_near(ex.cost, logit);
    assert_near(r.cost, logit);
    assert_int_equal(r.cached_tokens, 120);

    /* adjusted prefill never goes negative */
    cfg.overlap_score_credit = 50;
    assert_int_equal(run(&cfg, &rq, &r, &ex, 1), KVR_OK);
    assert_near(ex.adjusted_prefill_blocks, 0);
    assert_near(ex.cost, 33);

    /* prefill tracking off: only decode and requests count */
    rq.track_prefill_tokens = false;
    cfg = defaults();
    assert_int_equal(run(&cfg, &rq, &r, &ex, 1), KVR_OK);
    assert_near(ex.raw_prefill_blocks, 0);
    assert_near(ex.cost, 30);

    /* no tracker load: the raw prefill is the prompt alone */
    rq.track_prefill_tokens = true;
    c.has_load = false;
    c.host_blocks = c.disk_blocks = c.shared_blocks = 0;
    assert_int_equal(run(&cfg, &rq, &r, &ex, 1), KVR_OK);
    assert_near(ex.raw_prefill_blocks, 20);
    assert_near(ex.adjusted_prefill_blocks, 16);
}

static void test_tier_weights(void **s)
{
    (void)s;
    uint64_t isl = 16 * BS;
    /* same device overlap; B also has 8 host blocks, C 8 disk blocks */
    kvr_select_candidate_t c[3] = {cand(1, 4, 0, 0, isl), cand(2, 4, 0, 0, isl),
                                   cand(3, 4, 0, 0, isl)};
    c[1].host_blocks = 8;
    c[2].disk_blocks = 8;
    for (int i = 1; i < 3; i++) { /* the tracker projects the lower-tier hits as cached */
        uint64_t cached = (uint64_t)(i == 1 ? (4 + 6) * BS : (4 + 2) * BS);
        c[i].potential_prefill_tokens = isl - cached;
    }
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[1].effective_overlap_blocks, 4 + 0.75 * 8);
    assert_near(ex[2].effective_overlap_blocks, 4 + 0.25 * 8);
    assert_near(ex[0].cost, 12);
    assert_near(ex[1].cost, 16 - 4 - 6);
    assert_near(ex[2].cost, 16 - 4 - 2);
    assert_int_equal(r.index, 1);

    /* weights 0: lower tiers are worth nothing; weights 1: as good as the device (the
     * tracker's projection follows the same cached tokens) */
    kvr_select_config_t cfg = defaults();
    cfg.host_cache_hit_weight = 0;
    cfg.disk_cache_hit_weight = 1;
    c[1].potential_prefill_tokens = isl - 4 * BS;
    c[2].potential_prefill_tokens = isl - 12 * BS;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[1].effective_overlap_blocks, 4);
    assert_near(ex[2].effective_overlap_blocks, 12);
    assert_near(ex[1].cost, 12);
    assert_near(ex[2].cost, 4);
    assert_int_equal(r.index, 2);
}

/* credit_decay shrinks the device credit of ranks busier than the least busy eligible one. */
static void test_credit_decay(void **s)
{
    (void)s;
    uint64_t isl = 10 * BS;
    kvr_select_candidate_t c[2] = {cand(1, 8, 10 * BS, 0, isl), cand(2, 0, 2 * BS, 0, isl)};
    kvr_select_request_t rq = request(isl, c, 2);
    kvr_select_explain_t ex[2];
    kvr_select_result_t r;
    /* no decay: A 10 + 10 - 8 = 12, B 2 + 10 = 12 -> the tie is broken at random */
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 12);
    assert_near(ex[1].cost, 12);
    kvr_select_config_t cfg = defaults();
    cfg.overlap_score_credit_decay = 1.0;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    /* A is 8 blocks above the minimum over a 10-block request: decay = 1 / (1 + 0.8) */
    assert_near(ex[0].decay, 1 / 1.8);
    assert_near(ex[1].decay, 1);
    assert_near(ex[0].overlap_credit_blocks, 8 / 1.8);
    assert_near(ex[0].cost, 20 - 8 / 1.8);
    assert_int_equal(r.index, 1);
    /* the minimum is over eligible ranks only: fence B and A has nothing to decay against */
    c[1].fenced = true;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].decay, 1);
    /* no decay without prefill tracking */
    c[1].fenced = false;
    rq.track_prefill_tokens = false;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].decay, 1);
}

static void test_preferred_taints_bias(void **s)
{
    (void)s;
    uint64_t isl = 10 * BS;
    const char *gpu_a[] = {"h100", "zone-a"}, *gpu_b[] = {"a100"};
    kvr_select_candidate_t c[2] = {cand(1, 0, 0, 5, isl), cand(2, 0, 0, 5, isl)};
    c[0].taints = gpu_a;
    c[0].n_taints = 2;
    c[1].taints = gpu_b;
    c[1].n_taints = 1;
    kvr_taint_weight_t pref[] = {{"h100", 0.5}, {"zone-a", 0.25}, {"absent", 9}};
    kvr_select_request_t rq = request(isl, c, 2);
    rq.preferred_taints = pref;
    rq.n_preferred = 3;
    kvr_select_explain_t ex[2];
    kvr_select_result_t r;
    for (uint64_t seed = 0; seed < 20; seed++) {
        assert_int_equal(run(NULL, &rq, &r, ex, seed), KVR_OK);
        assert_int_equal(r.index, 0);
    }
    assert_near(ex[0].preferred_weight, 0.75);
    assert_near(ex[0].bias, tanh(0.75));
    assert_near(ex[0].logit, 15);
    assert_near(ex[0].cost, 15 * exp(-tanh(0.75)));
    assert_near(ex[1].cost, 15);
    assert_near(r.cost, 15 * exp(-tanh(0.75)));
    /* a huge weight saturates at e^-1 */
    pref[0].weight = 1e9;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 15 * exp(-1.0));
    /* negative weights repel */
    pref[0].weight = -2;
    pref[1].weight = 0;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 15 * exp(-tanh(-2.0)));
    assert_int_equal(r.index, 1);
    /* a preference is not a filter: the only candidate lacking it is still picked */
    pref[0].weight = 1;
    rq.n_cands = 2;
    c[0].fenced = true;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 1);
    /* a NaN weight is rejected, naming the field */
    pref[0].weight = NAN;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_EINVAL);
    assert_string_equal(r.field, "preferred_taints");
}

static void test_required_taints_filter(void **s)
{
    (void)s;
    uint64_t isl = 4 * BS;
    const char *t0[] = {"gpu", "fp8"}, *t1[] = {"gpu"}, *t2[] = {"fp8", "gpu", "zone-a"};
    kvr_select_candidate_t c[3] = {cand(1, 0, 0, 9, isl), cand(2, 0, 0, 1, isl),
                                   cand(3, 0, 0, 5, isl)};
    c[0].taints = t0;
    c[0].n_taints = 2;
    c[1].taints = t1;
    c[1].n_taints = 1;
    c[2].taints = t2;
    c[2].n_taints = 3;
    const char *req[] = {"fp8", "gpu"};
    kvr_select_request_t rq = request(isl, c, 3);
    rq.required_taints = req;
    rq.n_required = 2;
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 2); /* the cheapest (index 1) lacks fp8 */
    assert_int_equal(ex[1].why, KVR_SELECT_MISSING_TAINT);
    assert_string_equal(kvr_select_why_name(ex[1].why), "missing_required_taint");
    assert_int_equal(ex[0].why, KVR_SELECT_ELIGIBLE);
    assert_int_equal(r.n_eligible, 2);
    const char *none[] = {"tpu"};
    rq.required_taints = none;
    rq.n_required = 1;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOWORKER);
    assert_int_equal(r.index, SIZE_MAX);
}

static void test_allowed_ids(void **s)
{
    (void)s;
    uint64_t isl = 4 * BS;
    kvr_select_candidate_t c[4] = {cand(10, 0, 0, 1, isl), cand(20, 0, 0, 2, isl),
                                   cand(30, 0, 0, 3, isl), cand(40, 0, 0, 4, isl)};
    c[3].worker.dp_rank = 1;
    uint64_t allowed[] = {5, 30, 30, 40};
    kvr_select_request_t rq = request(isl, c, 4);
    rq.has_allowed = true;
    rq.allowed_ids = allowed;
    rq.n_allowed = 4;
    kvr_select_explain_t ex[4];
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.worker.worker_id, 30);
    assert_int_equal(ex[0].why, KVR_SELECT_NOT_ALLOWED);
    assert_int_equal(ex[1].why, KVR_SELECT_NOT_ALLOWED);
    assert_int_equal(ex[3].why, KVR_SELECT_ELIGIBLE);
    /* an empty set that is present allows nothing */
    rq.n_allowed = 0;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOWORKER);
    /* the set must be sorted: we binary-search it */
    uint64_t unsorted[] = {40, 30};
    rq.allowed_ids = unsorted;
    rq.n_allowed = 2;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_EINVAL);
    assert_string_equal(r.field, "allowed_worker_ids");
}

static void test_pinned_worker(void **s)
{
    (void)s;
    uint64_t isl = 4 * BS;
    kvr_select_candidate_t c[3] = {cand(1, 0, 0, 1, isl), cand(2, 0, 0, 50, isl),
                                   cand(2, 0, 0, 60, isl)};
    c[2].worker.dp_rank = 1;
    const char *tt[] = {"x"};
    c[1].taints = tt;
    c[1].n_taints = 1;
    kvr_taint_weight_t pref[] = {{"x", 1.0}};
    kvr_select_request_t rq = request(isl, c, 3);
    rq.preferred_taints = pref;
    rq.n_preferred = 1;
    rq.has_pinned = true;
    rq.pinned = (kvr_worker_t){2, 0};
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    /* allowed: returned although far from the cheapest, with its unbiased logit */
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 1);
    assert_near(r.cost, 54);
    assert_true(ex[1].cost < 54);
    assert_int_equal(ex[0].why, KVR_SELECT_NOT_PINNED);
    assert_near(ex[1].probability, 1);
    /* the other rank of the same worker */
    rq.pinned.dp_rank = 1;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 2);
    /* not in the allowed set */
    uint64_t allowed[] = {1};
    rq.has_allowed = true;
    rq.allowed_ids = allowed;
    rq.n_allowed = 1;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOTALLOWED);
    assert_int_equal(r.index, SIZE_MAX);
    rq.has_allowed = false;
    /* busy: never rerouted */
    c[2].busy = true;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_EBUSY);
    /* nonexistent worker, or rank out of range */
    rq.pinned = (kvr_worker_t){99, 0};
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOWORKER);
    rq.pinned = (kvr_worker_t){1, 3};
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOWORKER);
    /* fenced (dead) */
    c[0].fenced = true;
    rq.pinned = (kvr_worker_t){1, 0};
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOWORKER);
    /* lacking a required taint */
    c[0].fenced = false;
    const char *req[] = {"x"};
    rq.required_taints = req;
    rq.n_required = 1;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOTALLOWED);
}

static void test_preferred_worker(void **s)
{
    (void)s;
    uint64_t isl = 4 * BS;
    kvr_select_candidate_t c[2] = {cand(1, 0, 0, 1, isl), cand(2, 0, 0, 50, isl)};
    kvr_select_request_t rq = request(isl, c, 2);
    rq.has_preferred = true;
    rq.preferred = (kvr_worker_t){2, 0};
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_OK);
    assert_int_equal(r.index, 1);
    /* not eligible: an ordinary pick, no error */
    c[1].busy = true;
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_OK);
    assert_int_equal(r.index, 0);
    rq.preferred = (kvr_worker_t){7, 0};
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_OK);
    assert_int_equal(r.index, 0);
}

static void test_busy_and_no_worker(void **s)
{
    (void)s;
    uint64_t isl = 4 * BS;
    kvr_select_candidate_t c[3] = {cand(1, 0, 0, 1, isl), cand(2, 0, 0, 2, isl),
                                   cand(3, 0, 0, 3, isl)};
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    /* the cheapest is busy: the next one */
    c[0].busy = true;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 1);
    assert_int_equal(ex[0].why, KVR_SELECT_BUSY);
    assert_int_equal(r.n_busy, 1);
    /* all busy */
    c[1].busy = c[2].busy = true;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_EBUSY);
    assert_int_equal(r.n_busy, 3);
    assert_int_equal(r.index, SIZE_MAX);
    /* busy or fenced: still busy (something would be eligible but for load) */
    c[0].fenced = true;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_EBUSY);
    assert_int_equal(ex[0].why, KVR_SELECT_FENCED);
    /* nothing eligible even ignoring load */
    c[1].fenced = c[2].fenced = true;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_ENOWORKER);
    rq.n_cands = 0;
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_ENOWORKER);
}

/* The queue threshold only decides whether a request waits (reference 5.7): a rank over it
 * stays a candidate while another eligible rank is under it; the request waits (KVR_EBUSY)
 * only when every eligible rank is over it, or when it is pinned to one that is. */
static void test_queue_threshold_only_decides_waiting(void **s)
{
    (void)s;
    uint64_t isl = 4 * BS;
    kvr_select_candidate_t c[3] = {cand(1, 0, 0, 1, isl), cand(2, 0, 0, 2, isl),
                                   cand(3, 0, 0, 3, isl)};
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_result_t r;
    c[0].queue_busy = true; /* the cheapest is over the queue threshold, the others are not */
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_OK);
    assert_int_equal(r.index, 0);
    assert_int_equal(r.n_queue_busy, 1);
    c[1].queue_busy = true;
    c[2].fenced = true; /* every eligible rank over it: wait */
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_EBUSY);
    c[2].fenced = false;
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_OK);
    assert_int_equal(r.index, 0);
    /* pinned to a rank over it: wait for that rank; to one under it: go */
    rq.has_pinned = true;
    rq.pinned = (kvr_worker_t){1, 0};
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_EBUSY);
    rq.pinned = (kvr_worker_t){3, 0};
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_OK);
    assert_int_equal(r.index, 2);
}

/* S22: an empty or sub-block prompt has no overlap; the pick is by load, nothing divides by 0. */
static void test_zero_length_prompt(void **s)
{
    (void)s;
    kvr_select_config_t cfg = defaults();
    cfg.overlap_score_credit_decay = 2.0;
    for (uint64_t isl = 0; isl < BS; isl += BS - 1) {
        kvr_select_candidate_t c[3] = {cand(1, 0, 40, 7, isl), cand(2, 0, 0, 3, isl),
                                       cand(3, 0, 16, 4, isl)};
        c[2].has_load = false;
        kvr_select_request_t rq = request(isl, c, 3);
        kvr_select_explain_t ex[3];
        kvr_select_result_t r;
        assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
        for (int i = 0; i < 3; i++) {
            assert_true(isfinite(ex[i].cost));
            assert_true(isfinite(ex[i].decay));
            assert_near(ex[i].effective_overlap_blocks, 0);
        }
        assert_int_equal(r.request_blocks, isl == 0 ? 0 : 1);
        assert_int_equal(r.index, 1);
        assert_int_equal(r.cached_tokens, 0);
    }
}

static void test_lmetric_and_decode_pool(void **s)
{
    (void)s;
    uint64_t isl = 10 * BS;
    kvr_select_candidate_t c[2] = {cand(1, 2, 0, 3, isl), cand(2, 6, 0, 20, isl)};
    kvr_select_request_t rq = request(isl, c, 2);
    kvr_select_explain_t ex[2];
    kvr_select_result_t r;
    kvr_select_config_t cfg = defaults();
    cfg.policy = KVR_SELECT_POLICY_LMETRIC;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 8 * 4);
    assert_near(ex[1].cost, 4 * 21);
    assert_int_equal(r.index, 0);
    /* nothing to prefill (a decode leg: prefill not tracked): the product would be 0 on both
     * ranks and the pick random; the decode work decides, every time */
    rq.track_prefill_tokens = false;
    kvr_select_candidate_t busy = c[0];
    c[0] = c[1];
    c[1] = busy; /* the lighter rank second, so a first-wins tie would miss it */
    for (uint64_t seed = 1; seed <= 20; seed++) { /* the tie-break's draws differ */
        assert_int_equal(run(&cfg, &rq, &r, ex, seed), KVR_OK);
        assert_near(ex[0].cost, 20);
        assert_near(ex[1].cost, 3);
        assert_int_equal(r.index, 1);
    }
    c[1] = c[0];
    c[0] = busy;
    rq.track_prefill_tokens = true;
    /* decode pool: max(0, decode - credit) + requests, when prefill is not tracked */
    cfg = defaults();
    cfg.decode_pool = true;
    rq.track_prefill_tokens = false;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 1);
    assert_near(ex[1].cost, 14);
    cfg.overlap_score_credit = 0; /* no credit: the ordinary formula */
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[1].cost, 20);
}

/* Locality: the time a worker's running engine step has left is priced at step_wait_weight
 * blocks of 16 tokens per ms on top of its prefill term; the other policies ignore it. */
static void test_step_wait(void **s)
{
    (void)s;
    uint64_t isl = 10 * BS;
    /* equal caches and loads; worker 1 has just begun a 30 ms step, worker 2's ends in 2 ms */
    kvr_select_candidate_t c[2] = {cand(1, 0, 0, 9, isl), cand(2, 0, 0, 9, isl)};
    c[0].step_wait_ms = 30;
    c[1].step_wait_ms = 2;
    kvr_select_request_t rq = request(isl, c, 2);
    kvr_select_explain_t ex[2];
    kvr_select_result_t r;
    kvr_select_config_t cfg = locality_waits(1);
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].step_wait_blocks, 30);
    assert_near(ex[0].cost, (10 + 30) * 10);
    assert_near(ex[1].cost, (10 + 2) * 10);
    assert_int_equal(r.index, 1);
    /* it is weighed against the prefill: 25 more queued blocks on worker 2 outweigh 28 ms at
     * a weight of 0.5 blocks per ms (14 blocks), not at 1 (28) */
    c[1] = cand(2, 0, 25 * BS, 9, isl);
    c[1].step_wait_ms = 2;
    cfg.step_wait_weight = 0.5;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 0);
    cfg.step_wait_weight = 1;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_int_equal(r.index, 1);
    /* weight 0, and the reference's cost: no wait term */
    cfg.step_wait_weight = 0;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 10 * 10);
    cfg = defaults();
    cfg.step_wait_weight = 1;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].step_wait_blocks, 0);
    assert_near(ex[0].cost, 10 + 9);
    /* the wait is priced as tokens (16 a ms at weight 1), so the decision does not change
     * with the block size: 28 ms more wait on worker 1 against 30 blocks of 16 more queued on
     * worker 2 picks worker 1 at 16-token blocks (400 against 420) and at 64-token blocks
     * (100 against 105; priced per block, the wait would cost 30 blocks of 64 and worker 2
     * would win) */
    cfg.policy = KVR_SELECT_POLICY_LOCALITY;
    c[0] = cand(1, 0, 0, 9, isl);
    c[0].step_wait_ms = 30;
    c[1] = cand(2, 0, 30 * BS, 9, isl);
    c[1].step_wait_ms = 2;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, (10 + 30) * 10);
    assert_near(ex[1].cost, (40 + 2) * 10);
    assert_int_equal(r.index, 0);
    rq.block_size = 4 * BS;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].step_wait_blocks, 7.5);
    assert_near(ex[1].step_wait_blocks, 0.5);
    assert_near(ex[0].cost, (2.5 + 7.5) * 10);
    assert_near(ex[1].cost, (10 + 0.5) * 10);
    assert_int_equal(r.index, 0);
}

/* Locality: the step wait is time like the prefill, so it goes inside the floor: a worker
 * holding the whole prompt has its wait scaled with its prefill (a tenth), and keeps the
 * request against one holding 30% of it with no wait. Added after the floor, the 45 ms would
 * count in full (46 x 10 = 460 against 400) and send the prompt away from its cache. */
static void test_step_wait_in_floor(void **s)
{
    (void)s;
    uint64_t isl = 100 * BS;
    kvr_select_candidate_t c[2] = {cand(1, 100, 0, 9, isl), cand(2, 30, 0, 9, isl)};
    c[0].step_wait_ms = 45;
    kvr_select_request_t rq = request(isl, c, 2);
    kvr_select_explain_t ex[2];
    kvr_select_result_t r;
    kvr_select_config_t cfg = locality_waits(1);
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    /* worker 1: max(100 + 45 - 200, (0 + 45) / 10 + 1) = 5.5; worker 2: max(100 - 60, 8) */
    assert_near(ex[0].step_wait_blocks, 45);
    assert_near(ex[0].adjusted_prefill_blocks, 5.5);
    assert_near(ex[0].cost, 5.5 * 10);
    assert_near(ex[1].cost, 40 * 10);
    assert_int_equal(r.index, 0);
    /* where the holder's wait outweighs the whole prefill it saves, it moves: the floor
     * never hides more than the credit */
    c[0].step_wait_ms = 150;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].adjusted_prefill_blocks, 50);
    assert_int_equal(r.index, 1);
}

/* Locality: the blocks booked on a rank with this prompt beyond 90% of its KV cache are
 * added to its prefill term, one each (an engine queues or preempts past its memory), times
 * the share of the prompt no eligible candidate holds; below the line, with the capacity
 * unknown, and under the other policies nothing changes. */
static void test_memory_line(void **s)
{
    (void)s;
    uint64_t isl = 100 * BS;
    /* both KV caches hold 1,000 blocks; with this prompt worker 1 would be booked to 950,
     * worker 2 (30 more blocks of prefill queued) to 900 */
    kvr_select_candidate_t c[2] = {cand(1, 0, 0, 950, isl), cand(2, 0, 30 * BS, 900, isl)};
    c[0].capacity_blocks = 1000;
    c[1].capacity_blocks = 1000;
    kvr_select_request_t rq = request(isl, c, 2);
    kvr_select_explain_t ex[2];
    kvr_select_result_t r;
    kvr_select_config_t cfg = defaults();
    cfg.policy = KVR_SELECT_POLICY_LOCALITY;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].memory_blocks, 50);
    assert_near(ex[0].cost, (100 + 50) * 951.0);
    assert_near(ex[1].memory_blocks, 0); /* on the line */
    assert_near(ex[1].cost, 130 * 901.0);
    assert_int_equal(r.index, 1);
    /* a third candidate holds 80 of the prompt's 100 blocks (with 500 blocks of prefill
     * queued, it is not picked): the term counts the 20% no candidate holds */
    kvr_select_candidate_t c3[3] = {c[0], c[1], cand(3, 80, 500 * BS, 520, isl)};
    kvr_select_request_t rq3 = request(isl, c3, 3);
    kvr_select_explain_t ex3[3];
    assert_int_equal(run(&cfg, &rq3, &r, ex3, 1), KVR_OK);
    assert_near(ex3[0].held_share, 0.8);
    assert_near(ex3[0].memory_blocks, 50 * 0.2);
    assert_int_equal(r.index, 0); /* (100 + 10) x 951 < 130 x 901 */
    /* excluded, it holds nothing this decision can use: the whole term again */
    uint64_t three = 3;
    rq3.exclude_ids = &three;
    rq3.n_exclude = 1;
    assert_int_equal(run(&cfg, &rq3, &r, ex3, 1), KVR_OK);
    assert_near(ex3[0].held_share, 0);
    assert_int_equal(r.index, 1);
    /* capacity unknown: no memory term, and the shorter queue wins (100 x 951 < 130 x 901) */
    c[0].capacity_blocks = 0;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].memory_blocks, 0);
    assert_near(ex[0].cost, 100 * 951.0);
    assert_int_equal(r.index, 0);
    /* below the line: the same */
    c[0].capacity_blocks = 2000;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].memory_blocks, 0);
    assert_int_equal(r.index, 0);
    /* lmetric has no memory term */
    c[0].capacity_blocks = 1000;
    cfg.policy = KVR_SELECT_POLICY_LMETRIC;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].memory_blocks, 0);
    assert_int_equal(r.index, 0);
}

/* ---- picking ---- */

/* Ties at temperature 0 are broken uniformly: every tied candidate is picked about equally
 * often over many seeds (chi-square with 4 degrees of freedom, loose bound), others never. */
static void test_ties_uniform(void **s)
{
    (void)s;
    uint64_t isl = 8 * BS;
    kvr_select_candidate_t c[7];
    for (int i = 0; i < 7; i++)
        c[i] = cand((uint64_t)i + 1, 0, 0, 5, isl);
    c[2].potential_decode_blocks = 6; /* worse */
    c[5].potential_decode_blocks = 9; /* worse */
    kvr_select_request_t rq = request(isl, c, 7);
    enum { DRAWS = 50000 };
    unsigned counts[7] = {0};
    kvr_rng_t rng;
    kvr_rng_seed(&rng, 42);
    for (int d = 0; d < DRAWS; d++) {
        kvr_select_result_t r;
        assert_int_equal(kvr_select(NULL, &rq, &rng, &r, NULL), KVR_OK);
        counts[r.index]++;
    }
    assert_int_equal(counts[2], 0);
    assert_int_equal(counts[5], 0);
    double expect = DRAWS / 5.0, chi2 = 0;
    for (int i = 0; i < 7; i++) {
        if (i == 2 || i == 5)
            continue;
        assert_true(counts[i] > 0);
        assert_true(fabs(counts[i] - expect) < 0.05 * expect);
        chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    }
    printf("ties: chi2 %.2f over 5 tied candidates\n", chi2);
    assert_true(chi2 < 30); /* p ~ 5e-6 for 4 degrees of freedom */
    /* one fresh rng per draw, seeded 0, 1, 2, ...: seeding adds no bias either */
    memset(counts, 0, sizeof counts);
    for (int d = 0; d < DRAWS; d++) {
        kvr_select_result_t r;
        assert_int_equal(run(NULL, &rq, &r, NULL, (uint64_t)d), KVR_OK);
        counts[r.index]++;
    }
    chi2 = 0;
    for (int i = 0; i < 7; i++)
        if (i != 2 && i != 5)
            chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    printf("ties, seed per draw: chi2 %.2f\n", chi2);
    assert_int_equal(counts[2] + counts[5], 0);
    assert_true(chi2 < 30);
    /* the explain array says the same */
    kvr_select_explain_t ex[7];
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, ex, 3), KVR_OK);
    assert_near(ex[0].probability, 0.2);
    assert_near(ex[2].probability, 0);
}

/* Same seed, same picks. */
static void test_deterministic_given_seed(void **s)
{
    (void)s;
    uint64_t isl = 8 * BS;
    kvr_select_candidate_t c[4];
    for (int i = 0; i < 4; i++)
        c[i] = cand((uint64_t)i + 1, (uint32_t)i, 0, 5, isl);
    kvr_select_request_t rq = request(isl, c, 4);
    kvr_select_config_t cfg = defaults();
    cfg.temperature = 0.7;
    kvr_rng_t a, b;
    kvr_rng_seed(&a, 9);
    kvr_rng_seed(&b, 9);
    for (int i = 0; i < 1000; i++) {
        kvr_select_result_t ra, rb;
        assert_int_equal(kvr_select(&cfg, &rq, &a, &ra, NULL), KVR_OK);
        assert_int_equal(kvr_select(&cfg, &rq, &b, &rb, NULL), KVR_OK);
        assert_int_equal(ra.index, rb.index);
    }
}

static void sample(const kvr_select_config_t *cfg, const kvr_select_request_t *rq, int draws,
                   unsigned *counts)
{
    kvr_rng_t rng;
    kvr_rng_seed(&rng, 7);
    for (int d = 0; d < draws; d++) {
        kvr_select_result_t r;
        assert_int_equal(kvr_select(cfg, rq, &rng, &r, NULL), KVR_OK);
        counts[r.index]++;
    }
}

static void test_softmax_temperature(void **s)
{
    (void)s;
    uint64_t isl = 8 * BS;
    /* costs 10, 11, 12 (decode blocks 2, 3, 4 over 8 prefill blocks) */
    kvr_select_candidate_t c[3] = {cand(1, 0, 0, 2, isl), cand(2, 0, 0, 3, isl),
                                   cand(3, 0, 0, 4, isl)};
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_config_t cfg = defaults();
    cfg.temperature = 1.0;
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    double w[3] = {1, exp(-0.5), exp(-1)}, sum = w[0] + w[1] + w[2];
    for (int i = 0; i < 3; i++)
        assert_near(ex[i].probability, w[i] / sum);
    enum { DRAWS = 60000 };
    unsigned counts[3] = {0};
    sample(&cfg, &rq, DRAWS, counts);
    assert_true(counts[0] > counts[1] && counts[1] > counts[2] && counts[2] > 0);
    for (int i = 0; i < 3; i++)
        assert_true(fabs(counts[i] - DRAWS * w[i] / sum) < 0.03 * DRAWS);
    /* a large temperature is near uniform */
    cfg.temperature = 1e6;
    unsigned flat[3] = {0};
    sample(&cfg, &rq, DRAWS, flat);
    for (int i = 0; i < 3; i++)
        assert_true(fabs(flat[i] - DRAWS / 3.0) < 0.02 * DRAWS);
    /* equal costs: uniform */
    c[1].potential_decode_blocks = c[2].potential_decode_blocks = 2;
    cfg.temperature = 0.5;
    unsigned eq[3] = {0};
    sample(&cfg, &rq, DRAWS, eq);
    for (int i = 0; i < 3; i++)
        assert_true(fabs(eq[i] - DRAWS / 3.0) < 0.02 * DRAWS);
    /* a tiny temperature behaves like the minimum */
    c[1].potential_decode_blocks = 3;
    c[2].potential_decode_blocks = 4;
    cfg.temperature = 1e-300;
    unsigned cold[3] = {0};
    sample(&cfg, &rq, 1000, cold);
    assert_int_equal(cold[0], 1000);
    /* busy candidates take no share */
    cfg.temperature = 1.0;
    c[0].busy = true;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].probability, 0);
    assert_near(ex[1].probability + ex[2].probability, 1);
    assert_true(r.index != 0);
}

/* An overflowing cost (+Inf) gets no share unless every cost is infinite. */
static void test_softmax_infinite_costs(void **s)
{
    (void)s;
    uint64_t isl = 8 * BS;
    kvr_select_candidate_t c[3] = {cand(1, 0, 0, 2, isl), cand(2, 0, 0, 3, isl),
                                   cand(3, 0, 0, 4, isl)};
    c[2].active_requests = 10;
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_config_t cfg = defaults();
    cfg.temperature = 2.0;
    cfg.decode_active_request_weight = 1e308;
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_true(isinf(ex[2].cost));
    assert_near(ex[2].probability, 0);
    assert_near(ex[0].probability + ex[1].probability, 1);
    for (uint64_t seed = 0; seed < 200; seed++) {
        assert_int_equal(run(&cfg, &rq, &r, NULL, seed), KVR_OK);
        assert_true(r.index != 2);
    }
    for (int i = 0; i < 3; i++)
        c[i].active_requests = 10;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    for (int i = 0; i < 3; i++)
        assert_near(ex[i].probability, 1.0 / 3);
    cfg.temperature = 0;
    assert_int_equal(run(&cfg, &rq, &r, ex, 1), KVR_OK);
    assert_true(r.index < 3);
}

/* ---- configuration ---- */

static void test_config_validation_names_fields(void **s)
{
    (void)s;
    kvr_select_config_t cfg = defaults();
    const char *field = "x";
    assert_int_equal(kvr_select_config_validate(&cfg, &field), KVR_OK);
    assert_null(field);
    assert_near(cfg.overlap_score_credit, 1.0);
    assert_near(cfg.prefill_load_scale, 1.0);
    assert_near(cfg.host_cache_hit_weight, 0.75);
    assert_near(cfg.disk_cache_hit_weight, 0.25);
    assert_near(cfg.temperature, 0);
    struct {
        size_t off;
        const char *name;
        bool unit;
    } fields[] = {
        {offsetof(kvr_select_config_t, overlap_score_credit), "overlap_score_credit", false},
        {offsetof(kvr_select_config_t, overlap_score_credit_decay), "overlap_score_credit_decay",
         false},
        {offsetof(kvr_select_config_t, prefill_load_scale), "prefill_load_scale", false},
        {offsetof(kvr_select_config_t, decode_active_request_weight),
         "decode_active_request_weight", false},
        {offsetof(kvr_select_config_t, host_cache_hit_weight), "host_cache_hit_weight", true},
        {offsetof(kvr_select_config_t, disk_cache_hit_weight), "disk_cache_hit_weight", true},
        {offsetof(kvr_select_config_t, shared_cache_multiplier), "shared_cache_multiplier", true},
        {offsetof(kvr_select_config_t, temperature), "router_temperature", false},
        {offsetof(kvr_select_config_t, step_wait_weight), "router_step_wait_weight", false},
    };
    const double bad[] = {NAN, -1, INFINITY, -INFINITY, -1e-300};
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            kvr_select_config_t c = defaults();
            memcpy((char *)&c + fields[f].off, &bad[b], sizeof(double));
            assert_int_equal(kvr_select_config_validate(&c, &field), KVR_EINVAL);
            assert_string_equal(field, fields[f].name);
            /* kvr_select refuses it too, naming the field */
            kvr_select_candidate_t one = cand(1, 0, 0, 0, 0);
            kvr_select_request_t rq = request(0, &one, 1);
            kvr_select_result_t r;
            assert_int_equal(run(&c, &rq, &r, NULL, 1), KVR_EINVAL);
            assert_string_equal(r.field, fields[f].name);
        }
        kvr_select_config_t c = defaults();
        double above = 1.5;
        memcpy((char *)&c + fields[f].off, &above, sizeof(double));
        assert_int_equal(kvr_select_config_validate(&c, &field),
                         fields[f].unit ? KVR_EINVAL : KVR_OK);
    }
    cfg.policy = (kvr_select_policy_t)7;
    assert_int_equal(kvr_select_config_validate(&cfg, &field), KVR_EINVAL);
    assert_string_equal(field, "router_selection_policy");
    /* block size 0 is refused by name */
    kvr_select_candidate_t one = cand(1, 0, 0, 0, 0);
    kvr_select_request_t rq = request(0, &one, 1);
    rq.block_size = 0;
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_EINVAL);
    assert_string_equal(r.field, "block_size");
}

static void test_override(void **s)
{
    (void)s;
    kvr_select_config_t base = defaults(), out;
    const char *field;
    /* a dynamo-cost weight under a policy without it: refused naming both; 1 changes nothing */
    for (int p = KVR_SELECT_POLICY_LMETRIC; p <= KVR_SELECT_POLICY_LOCALITY; p++) {
        kvr_select_config_t other = base;
        other.policy = (kvr_select_policy_t)p;
        kvr_select_override_t w = {.has_prefill_load_scale = true, .prefill_load_scale = 2};
        assert_int_equal(kvr_select_config_merge(&other, &w, &out, &field), KVR_EINVAL);
        assert_non_null(strstr(field, "config_override.prefill_load_scale"));
        assert_non_null(strstr(field, p == KVR_SELECT_POLICY_LOCALITY ? "locality" : "lmetric"));
        w = (kvr_select_override_t){.has_overlap_score_weight = true, .overlap_score_weight = 3};
        assert_int_equal(kvr_select_config_merge(&other, &w, &out, &field), KVR_EINVAL);
        assert_non_null(strstr(field, "config_override.overlap_score_weight"));
        w = (kvr_select_override_t){.has_prefill_load_scale = true, .prefill_load_scale = 1};
        assert_int_equal(kvr_select_config_merge(&other, &w, &out, &field), KVR_OK);
        other.policy = KVR_SELECT_POLICY_DYNAMO;
        w.prefill_load_scale = 2;
        assert_int_equal(kvr_select_config_merge(&other, &w, &out, &field), KVR_OK);
    }
    kvr_select_override_t o = {.has_temperature = true, .temperature = 0.5,
                               .has_overlap_score_credit = true, .overlap_score_credit = 0.25};
    assert_int_equal(kvr_select_config_merge(&base, &o, &out, &field), KVR_OK);
    assert_near(out.temperature, 0.5);
    assert_near(out.overlap_score_credit, 0.25);
    assert_near(out.prefill_load_scale, 1.0);
    /* unset fields keep the config */
    o = (kvr_select_override_t){.prefill_load_scale = NAN};
    assert_int_equal(kvr_select_config_merge(&base, &o, &out, &field), KVR_OK);
    assert_near(out.prefill_load_scale, 1.0);
    /* bad values name the field and leave out untouched */
    struct {
        kvr_select_override_t o;
        const char *name;
    } bad[] = {
        {{.has_overlap_score_credit = true, .overlap_score_credit = NAN}, "overlap_score_credit"},
        {{.has_prefill_load_scale = true, .prefill_load_scale = -1}, "prefill_load_scale"},
        {{.has_temperature = true, .temperature = INFINITY}, "router_temperature"},
        {{.has_temperature = true, .temperature = NAN}, "router_temperature"},
        {{.has_shared_cache_multiplier = true, .shared_cache_multiplier = 1.5},
         "shared_cache_multiplier"},
        {{.has_overlap_score_weight = true, .overlap_score_weight = -2}, "overlap_score_weight"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = base;
        out.temperature = 123;
        assert_int_equal(kvr_select_override_validate(&bad[i].o, &field), KVR_EINVAL);
        assert_string_equal(field, bad[i].name);
        assert_int_equal(kvr_select_config_merge(&base, &bad[i].o, &out, &field), KVR_EINVAL);
        assert_string_equal(field, bad[i].name);
        assert_near(out.temperature, 123);
        kvr_select_candidate_t one = cand(1, 0, 0, 0, 0);
        kvr_select_request_t rq = request(0, &one, 1);
        rq.ovr = &bad[i].o;
        kvr_select_result_t r;
        assert_int_equal(run(NULL, &rq, &r, NULL, 1), KVR_EINVAL);
        assert_string_equal(r.field, bad[i].name);
    }
    /* deprecated overlap_score_weight: non-zero = scale, zero = no prefill term and no credit */
    o = (kvr_select_override_t){.has_overlap_score_weight = true, .overlap_score_weight = 3,
                                .has_prefill_load_scale = true, .prefill_load_scale = 0.5};
    assert_int_equal(kvr_select_config_merge(&base, &o, &out, &field), KVR_OK);
    assert_near(out.prefill_load_scale, 3);
    assert_near(out.overlap_score_credit, 1);
    o.overlap_score_weight = 0;
    assert_int_equal(kvr_select_config_merge(&base, &o, &out, &field), KVR_OK);
    assert_near(out.prefill_load_scale, 0);
    assert_near(out.overlap_score_credit, 0);
    /* the override reaches the cost: worked example with credit 0 -> pure load */
    uint64_t isl = 10 * BS;
    kvr_select_candidate_t c[3] = {cand(1, 2, 0, 10, isl), cand(2, 5, 0, 5, isl),
                                   cand(3, 8, 0, 9, isl)};
    kvr_select_request_t rq = request(isl, c, 3);
    kvr_select_override_t no_credit = {.has_overlap_score_credit = true,
                                       .overlap_score_credit = 0};
    rq.ovr = &no_credit;
    kvr_select_explain_t ex[3];
    kvr_select_result_t r;
    assert_int_equal(run(NULL, &rq, &r, ex, 1), KVR_OK);
    assert_near(ex[0].cost, 20);
    assert_near(ex[1].cost, 15);
    assert_near(ex[2].cost, 19);
}

static void test_busy_thresholds(void **s)
{
    (void)s;
    kvr_busy_thresholds_t t = {0};
    kvr_busy_load_t l = {.active_prefill_tokens = 1000000, .used_blocks = 100,
                         .total_kv_blocks = 100};
    assert_false(kvr_busy(&t, &l)); /* no threshold set: never busy */
    t.has_prefill_tokens = true;
    t.prefill_tokens = 1000000;
    assert_false(kvr_busy(&t, &l)); /* strictly above */
    l.active_prefill_tokens++;
    assert_true(kvr_busy(&t, &l));
    t = (kvr_busy_thresholds_t){.has_prefill_frac = true, .prefill_frac = 0.5};
    l = (kvr_busy_load_t){.active_prefill_tokens = 4096, .max_num_batched_tokens = 8192};
    assert_false(kvr_busy(&t, &l));
    l.active_prefill_tokens = 4097;
    assert_true(kvr_busy(&t, &l));
    t.prefill_frac = 0.50001; /* floor(4096.08) = 4096 */
    assert_true(kvr_busy(&t, &l));
    l.max_num_batched_tokens = 0; /* unknown: 10M */
    assert_false(kvr_busy(&t, &l));
    l.active_prefill_tokens = KVR_DEFAULT_MAX_BATCHED_TOKENS;
    assert_true(kvr_busy(&t, &l));
    t = (kvr_busy_thresholds_t){.has_decode_frac = true, .decode_frac = 0.9};
    l = (kvr_busy_load_t){.used_blocks = 90, .total_kv_blocks = 100};
    assert_false(kvr_busy(&t, &l));
    l.used_blocks = 91;
    assert_true(kvr_busy(&t, &l));
    l.total_kv_blocks = 0; /* unknown: skipped */
    assert_false(kvr_busy(&t, &l));
    const char *field;
    t.decode_frac = NAN;
    assert_int_equal(kvr_busy_thresholds_validate(&t, &field), KVR_EINVAL);
    assert_string_equal(field, "active_decode_blocks_threshold");
    t = (kvr_busy_thresholds_t){.has_prefill_frac = true, .prefill_frac = -1};
    assert_int_equal(kvr_busy_thresholds_validate(&t, &field), KVR_EINVAL);
    assert_string_equal(field, "active_prefill_tokens_threshold_frac");
}

static void test_rng_below(void **s)
{
    (void)s;
    kvr_rng_t rng;
    kvr_rng_seed(&rng, 5);
    unsigned counts[3] = {0};
    for (int i = 0; i < 30000; i++)
        counts[kvr_rng_below(&rng, 3)]++;
    for (int i = 0; i < 3; i++)
        assert_true(fabs(counts[i] - 10000.0) < 500);
    assert_int_equal(kvr_rng_below(&rng, 0), 0);
    assert_int_equal(kvr_rng_below(&rng, 1), 0);
    for (int i = 0; i < 1000; i++) {
        double u = kvr_rng_uniform(&rng);
        assert_true(u >= 0 && u < 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_each_term),
        cmocka_unit_test(test_tier_weights),
        cmocka_unit_test(test_credit_decay),
        cmocka_unit_test(test_preferred_taints_bias),
        cmocka_unit_test(test_required_taints_filter),
        cmocka_unit_test(test_allowed_ids),
        cmocka_unit_test(test_pinned_worker),
        cmocka_unit_test(test_preferred_worker),
        cmocka_unit_test(test_busy_and_no_worker),
        cmocka_unit_test(test_queue_threshold_only_decides_waiting),
        cmocka_unit_test(test_zero_length_prompt),
        cmocka_unit_test(test_lmetric_and_decode_pool),
        cmocka_unit_test(test_step_wait),
        cmocka_unit_test(test_step_wait_in_floor),
        cmocka_unit_test(test_memory_line),
        cmocka_unit_test(test_ties_uniform),
        cmocka_unit_test(test_deterministic_given_seed),
        cmocka_unit_test(test_softmax_temperature),
        cmocka_unit_test(test_softmax_infinite_costs),
        cmocka_unit_test(test_config_validation_names_fields),
        cmocka_unit_test(test_override),
        cmocka_unit_test(test_busy_thresholds),
        cmocka_unit_test(test_rng_below),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

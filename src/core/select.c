/*
 * select.c: worker selection (as Dynamo's KV router selects): hard filters, the cost ("logit") of
 * each candidate, and the pick. Inputs are plain numbers and strings the router gathered from
 * the prefix index and the load tracker; nothing here knows where they came from.
 *
 *   effective_overlap = device + host_w * host + disk_w * disk        cached = round(eff * bs)
 *   raw_prefill       = track ? (has_load ? potential_prefill + cached : isl) / bs : 0
 *   decay             = 1 / (1 + credit_decay * (active - min_active) / bs / request_blocks)
 *   credit            = overlap_credit * decay * device + host_w * host + disk_w * disk
 *                       + shared_mult * shared
 *   adjusted          = max(raw_prefill - credit, 0)
 *   logit             = the policy's (core/policy_<name>.c): dynamo, the reference's,
 *                       scale * adjusted + potential_decode + request_w * active_requests;
 *                       lmetric adjusted * (potential_decode + 1); locality the same with
 *                       adjusted = max(raw_prefill + wait - 2 credit, (adjusted + wait) / 10 + 1)
 *                       + max(potential_decode - 0.9 capacity, 0) x (1 - held_share),
 *                       wait = step_wait_weight * step_wait_ms * 16 / bs
 *                       (capacity known; held_share: the most of the prompt an eligible
 *                       candidate holds, cached or in flight)
 *   cost              = logit * exp(-tanh(sum of preferred-taint weights present))
 *
 * Pick: temperature 0 takes a minimum cost, ties broken uniformly (reservoir sampling: the
 * k-th tie replaces the pick with probability 1/k). Temperature T > 0 samples
 * p_i ~ exp(-(c_i - c_min) / ((c_max - c_min) T)) with one uniform draw.
 *
 * Invariants: every config that reaches the cost function has passed validation, so no term
 * is NaN and every cost is >= 0 (+Inf only on overflow). Candidates with an infinite cost get
 * probability 0 under softmax unless every cost is infinite (then the pick is uniform); the
 * reference divides by max(|c_min|, |c_max|) here, which gives NaN for an infinite c_max.
 * Choices where the reference drifts or is loose are listed at kvr_select().
 *
 * Memory: none allocated; the explain array is the caller's. Threads: none of its own; any
 * thread, each with its own rng. Cost: O(N (R + P) T) per call, for N candidates, R required
 * and P preferred taints, T taints per worker: at most four passes over the candidates
 * (eligibility, cost and extremes, softmax sum, softmax draw), recomputing rather than storing
 * the costs when there is no explain array.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "core/select.h"

#include "core/policy.h"

/* ---- config ---- */

void kvr_select_config_default(kvr_select_config_t *cfg)
{
    *cfg = (kvr_select_config_t){
        .overlap_score_credit = 1.0,
        .overlap_score_credit_decay = 0.0,
        .prefill_load_scale = 1.0,
        .decode_active_request_weight = 0.0,
        .host_cache_hit_weight = 0.75,
        .disk_cache_hit_weight = 0.25,
        .shared_cache_multiplier = 0.0,
        .temperature = 0.0,
        .step_wait_weight = 0.0,
        .inflight_credit_weight = 0.0,
        .policy = KVR_SELECT_POLICY_DYNAMO,
        .decode_pool = false,
    };
}

/* NaN fails every comparison, so these reject it too.
 * overlap_score_credit > 1 is accepted (newer reference docs; config.rs@0243c51b rejected it):
 * the adjusted prefill is clamped at 0, so a large credit only makes cached ranks stickier,
 * never a negative or NaN cost; prefill_load_scale is the knob for the prefill term's weight. */
static bool finite_nonneg(double x) { return isfinite(x) && x >= 0; }
static bool unit(double x) { return x >= 0 && x <= 1; }

int kvr_select_config_validate(const kvr_select_config_t *cfg, const char **field)
{
    const char *dummy;
    if (field == NULL)
        field = &dummy;
    *field = NULL;
    if (cfg == NULL)
        return KVR_OK;
    const struct {
        bool ok;
        const char *name;
    } checks[] = {
        {finite_nonneg(cfg->overlap_score_credit), "overlap_score_credit"},
        {finite_nonneg(cfg->overlap_score_credit_decay), "overlap_score_credit_decay"},
        {finite_nonneg(cfg->prefill_load_scale), "prefill_load_scale"},
        {finite_nonneg(cfg->decode_active_request_weight), "decode_active_request_weight"},
        {unit(cfg->host_cache_hit_weight), "host_cache_hit_weight"},
        {unit(cfg->disk_cache_hit_weight), "disk_cache_hit_weight"},
        {unit(cfg->shared_cache_multiplier), "shared_cache_multiplier"},
        {finite_nonneg(cfg->temperature), "router_temperature"},
        {finite_nonneg(cfg->step_wait_weight), "router_step_wait_weight"},
        {unit(cfg->inflight_credit_weight), "router_inflight_credit_weight"},
        {kvr_policy_scorer(cfg->policy) != NULL, "router_selection_policy"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (!checks[i].ok) {
            *field = checks[i].name;
            return KVR_EINVAL;
        }
    return KVR_OK;
}

int kvr_select_override_validate(const kvr_select_override_t *ovr, const char **field)
{
    const char *dummy;
    if (field == NULL)
        field = &dummy;
    *field = NULL;
    if (ovr == NULL)
        return KVR_OK;
    const struct {
        bool bad;
        const char *name;
    } checks[] = {
        {ovr->has_overlap_score_credit && !finite_nonneg(ovr->overlap_score_credit),
         "overlap_score_credit"},
        {ovr->has_prefill_load_scale && !finite_nonneg(ovr->prefill_load_scale),
         "prefill_load_scale"},
        {ovr->has_temperature && !finite_nonneg(ovr->temperature), "router_temperature"},
        {ovr->has_shared_cache_multiplier && !unit(ovr->shared_cache_multiplier),
         "shared_cache_multiplier"},
        {ovr->has_overlap_score_weight && !finite_nonneg(ovr->overlap_score_weight),
         "overlap_score_weight"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].bad) {
            *field = checks[i].name;
            return KVR_EINVAL;
        }
    return KVR_OK;
}

static void apply_override(kvr_select_config_t *c, const kvr_select_override_t *o)
{
    if (o->has_overlap_score_credit)
        c->overlap_score_credit = o->overlap_score_credit;
    if (o->has_prefill_load_scale)
        c->prefill_load_scale = o->prefill_load_scale;
    if (o->has_temperature)
        c->temperature = o->temperature;
    if (o->has_shared_cache_multiplier)
        c->shared_cache_multiplier = o->shared_cache_multiplier;
    if (o->has_overlap_score_weight) {
        c->prefill_load_scale = o->overlap_score_weight;
        if (o->overlap_score_weight == 0)
            c->overlap_score_credit = 0;
    }
}

/* A request's dynamo-cost weight under a policy without that term: the message naming both
 * (static), or NULL. */
static const char *foreign_weight(kvr_select_policy_t policy, const kvr_select_override_t *o)
{
    if (o == NULL || policy == KVR_SELECT_POLICY_DYNAMO)
        return NULL;
    bool loc = policy == KVR_SELECT_POLICY_LOCALITY;
    if (o->has_overlap_score_weight && o->overlap_score_weight != 0 &&
        o->overlap_score_weight != 1)
        return loc ? "config_override.overlap_score_weight: a weight of the dynamo cost, which "
                     "router_selection_policy locality does not have (0 or 1 only)"
                   : "config_override.overlap_score_weight: a weight of the dynamo cost, which "
                     "router_selection_policy lmetric does not have (0 or 1 only)";
    if (o->has_prefill_load_scale && o->prefill_load_scale != 1)
        return loc ? "config_override.prefill_load_scale: a weight of the dynamo cost, which "
                     "router_selection_policy locality does not have"
                   : "config_override.prefill_load_scale: a weight of the dynamo cost, which "
                     "router_selection_policy lmetric does not have";
    return NULL;
}

int kvr_select_config_merge(const kvr_select_config_t *base, const kvr_select_override_t *ovr,
                            kvr_select_config_t *out, const char **field)
{
    kvr_select_config_t c;
    if (base == NULL)
        kvr_select_config_default(&c);
    else
        c = *base;
    int rc = kvr_select_config_validate(&c, field);
    if (rc == KVR_OK)
        rc = kvr_select_override_validate(ovr, field);
    const char *foreign = rc == KVR_OK ? foreign_weight(c.policy, ovr) : NULL;
    if (foreign != NULL) {
        if (field != NULL)
            *field = foreign;
        rc = KVR_EINVAL;
    }
    if (rc != KVR_OK)
        return rc;
    if (ovr != NULL)
        apply_override(&c, ovr);
    rc = kvr_select_config_validate(&c, field);
    if (rc == KVR_OK && out != NULL)
        *out = c;
    return rc;
}

/* ---- busy (5.8) ---- */

int kvr_busy_thresholds_validate(const kvr_busy_thresholds_t *t, const char **field)
{
    const char *dummy;
    if (field == NULL)
        field = &dummy;
    *field = NULL;
    if (t == NULL)
        return KVR_OK;
    if (t->has_prefill_frac && !finite_nonneg(t->prefill_frac)) {
        *field = "active_prefill_tokens_threshold_frac";
        return KVR_EINVAL;
    }
    if (t->has_decode_frac && !finite_nonneg(t->decode_frac)) {
        *field = "active_decode_blocks_threshold";
        return KVR_EINVAL;
    }
    return KVR_OK;
}

bool kvr_busy(const kvr_busy_thresholds_t *t, const kvr_busy_load_t *load)
{
    if (t == NULL || load == NULL)
        return false;
    double prefill = (double)load->active_prefill_tokens;
    if (t->has_prefill_tokens && load->active_prefill_tokens > t->prefill_tokens)
        return true;
    if (t->has_prefill_frac) {
        uint64_t max = load->max_num_batched_tokens ? load->max_num_batched_tokens
                                                    : KVR_DEFAULT_MAX_BATCHED_TOKENS;
        /* an integer exceeds x iff it exceeds floor(x): 5.7's and 5.8's forms agree */
        if (prefill > floor(t->prefill_frac * (double)max))
            return true;
    }
    if (t->has_decode_frac && load->total_kv_blocks > 0 &&
        (double)load->used_blocks > t->decode_frac * (double)load->total_kv_blocks)
        return true;
    return false;
}

/* ---- filters ---- */

const char *kvr_select_why_name(kvr_select_why_t why)
{
    switch (why) {
    case KVR_SELECT_ELIGIBLE:
        return "eligible";
    case KVR_SELECT_FENCED:
        return "fenced";
    case KVR_SELECT_NOT_ALLOWED:
        return "not_allowed";
    case KVR_SELECT_OTHER_MODEL:
        return "other_model_or_adapter";
    case KVR_SELECT_MISSING_TAINT:
        return "missing_required_taint";
    case KVR_SELECT_BUSY:
        return "busy";
    case KVR_SELECT_NOT_PINNED:
        return "not_pinned";
    case KVR_SELECT_EXCLUDED:
        return "excluded";
    }
    return "unknown";
}

typedef struct ctx {
    kvr_select_config_t cfg; /* merged with the request's override */
    const kvr_policy_t *scorer; /* cfg.policy's (core/policy_<name>.c) */
    const kvr_select_request_t *req;
    kvr_select_explain_t *explain; /* caller's, or NULL */
    double bs;
    double request_blocks;   /* >= 1 for the decay's division (S22) */
    double min_active;       /* over eligible candidates */
    double held_share;       /* the most of the prompt an eligible candidate holds, [0, 1] */
} ctx_t;

static bool id_allowed(const kvr_select_request_t *r, uint64_t id)
{
    if (!r->has_allowed)
        return true;
    size_t lo = 0, hi = r->n_allowed;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->allowed_ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->n_allowed && r->allowed_ids[lo] == id;
}

static bool id_excluded(const kvr_select_request_t *r, uint64_t id)
{
    for (size_t i = 0; i < r->n_exclude; i++)
        if (r->exclude_ids[i] == id)
            return true;
    return false;
}

static bool has_taint(const kvr_select_candidate_t *c, const char *taint)
{
    for (size_t i = 0; i < c->n_taints; i++)
        if (c->taints[i] != NULL && strcmp(c->taints[i], taint) == 0)
            return true;
    return false;
}

static kvr_select_why_t filter(const kvr_select_request_t *r, const kvr_select_candidate_t *c)
{
    if (c->fenced)
        return KVR_SELECT_FENCED;
    if (c->unfit)
        return KVR_SELECT_OTHER_MODEL;
    if (!id_allowed(r, c->worker.worker_id))
        return KVR_SELECT_NOT_ALLOWED;
    if (id_excluded(r, c->worker.worker_id))
        return KVR_SELECT_EXCLUDED;
    for (size_t i = 0; i < r->n_required; i++)
        if (!has_taint(c, r->required_taints[i]))
            return KVR_SELECT_MISSING_TAINT;
    return c->busy ? KVR_SELECT_BUSY : KVR_SELECT_ELIGIBLE;
}

/* ---- cost ---- */

static double active_prefill(const kvr_select_candidate_t *c)
{
    return c->has_load ? (double)c->active_prefill_tokens : 0.0;
}

static uint64_t round_tokens(double x)
{
    double r = round(x);
    return r >= 0x1.0p64 ? UINT64_MAX : (uint64_t)r;
}

static double preferred_weight(const kvr_select_request_t *r, const kvr_select_candidate_t *c)
{
    double sum = 0;
    for (size_t i = 0; i < r->n_preferred; i++)
        if (has_taint(c, r->preferred_taints[i].taint))
            sum += r->preferred_taints[i].weight;
    return sum;
}

/* Prefill side: effective overlap, raw prefill, decay, credit, adjusted. */
static void prefill_terms(const ctx_t *x, const kvr_select_candidate_t *c, kvr_select_explain_t *t)
{
    const kvr_select_config_t *k = &x->cfg;
    double host = k->host_cache_hit_weight * c->host_blocks;
    double disk = k->disk_cache_hit_weight * c->disk_blocks;
    double inflight = k->inflight_credit_weight * c->predicted_blocks;
    t->effective_overlap_blocks = c->device_blocks + host + disk + inflight;
    t->cached_tokens = round_tokens(t->effective_overlap_blocks * x->bs);
    double raw_tokens = 0;
    if (x->req->track_prefill_tokens)
        raw_tokens = c->has_load ? (double)c->potential_prefill_tokens + (double)t->cached_tokens
                                 : (double)x->req->isl_tokens;
    t->raw_prefill_blocks = raw_tokens / x->bs;
    t->decay = 1.0;
    if (x->req->track_prefill_tokens && k->overlap_score_credit_decay > 0) {
        double above = fmax(active_prefill(c) - x->min_active, 0.0);
        t->decay = 1.0 / (1.0 + k->overlap_score_credit_decay * (above / x->bs / x->request_blocks));
    }
    t->inflight_credit_blocks = k->overlap_score_credit * t->decay * inflight;
    t->overlap_credit_blocks = k->overlap_score_credit * t->decay * (c->device_blocks + inflight) +
                               host + disk +
                               k->shared_cache_multiplier * c->shared_blocks;
    t->adjusted_prefill_blocks = fmax(t->raw_prefill_blocks - t->overlap_credit_blocks, 0.0);
}

static void cost_terms(const ctx_t *x, const kvr_select_candidate_t *c, kvr_select_explain_t *t)
{
    const kvr_select_config_t *k = &x->cfg;
    prefill_terms(x, c, t);
    /* a millisecond of wait is priced as prompt tokens, so the price in blocks does not
     * change with the block size (where a block is 64 tokens, 4 times fewer blocks) */
    t->step_wait_blocks = x->scorer->uses_step_wait ? k->step_wait_weight * c->step_wait_ms *
                                                          KVR_SELECT_STEP_WAIT_TOKENS / x->bs
                                                    : 0.0;
    t->held_share = x->held_share;
    t->memory_blocks = 0;
    t->decode_cost_blocks = (double)c->potential_decode_blocks;
    t->active_request_cost = k->decode_active_request_weight * c->active_requests;
    if (x->scorer->decode_pool_rule && k->decode_pool && !x->req->track_prefill_tokens &&
        k->overlap_score_credit > 0) {
        /* 5.4: a decode pool told no prefill is coming prices decode blocks, less cached */
        t->prefill_cost = 0;
        t->logit = fmax(t->decode_cost_blocks - t->overlap_credit_blocks, 0.0) +
                   t->active_request_cost;
    } else {
        x->scorer->score(k, c, t);
    }
    t->preferred_weight = preferred_weight(x->req, c);
    t->bias = tanh(t->preferred_weight);
    t->cost = t->logit * exp(-t->bias);
    t->probability = 0;
    assert(t->cost >= 0); /* validated config: no NaN, nothing negative (+Inf on overflow) */
}

/* Eligibility and cost of candidate i, from the explain array when there is one. */
static bool scored(const ctx_t *x, size_t i, double *cost)
{
    if (x->explain != NULL) {
        *cost = x->explain[i].cost;
        return x->explain[i].why == KVR_SELECT_ELIGIBLE;
    }
    const kvr_select_candidate_t *c = &x->req->cands[i];
    if (filter(x->req, c) != KVR_SELECT_ELIGIBLE)
        return false;
    kvr_select_explain_t t;
    cost_terms(x, c, &t);
    *cost = t.cost;
    return true;
}

/* ---- picking ---- */

/* Temperature 0: a minimum, ties uniformly at random (reservoir sampling). */
static size_t pick_min(const ctx_t *x, kvr_rng_t *rng)
{
    size_t pick = SIZE_MAX, ties = 0;
    double best = INFINITY;
    for (size_t i = 0; i < x->req->n_cands; i++) {
        double c;
        if (!scored(x, i, &c))
            continue;
        if (pick == SIZE_MAX || c < best) {
            best = c;
            pick = i;
            ties = 1;
        } else if (c == best && kvr_rng_below(rng, ++ties) == 0) {
            pick = i;
        }
    }
    if (x->explain != NULL)
        for (size_t i = 0; i < x->req->n_cands; i++)
            if (x->explain[i].why == KVR_SELECT_ELIGIBLE && x->explain[i].cost == best)
                x->explain[i].probability = 1.0 / (double)ties;
    return pick;
}

/* Softmax weights: min-max normalised over the finite costs; infinite costs weigh 0 unless
 * every cost is infinite (then all weigh 1). */
typedef struct softmax {
    double lo, hi; /* over finite costs */
    bool any_finite;
    double t;
} softmax_t;

static double softmax_weight(const softmax_t *s, double cost)
{
    if (!s->any_finite)
        return 1.0;
    if (!isfinite(cost))
        return 0.0;
    double range = s->hi - s->lo;
    if (!(range > 0))
        return 1.0;
    return exp(-((cost - s->lo) / range) / s->t);
}

static softmax_t softmax_prepare(const ctx_t *x)
{
    softmax_t s = {.lo = INFINITY, .hi = -INFINITY, .t = x->cfg.temperature};
    for (size_t i = 0; i < x->req->n_cands; i++) {
        double c;
        if (scored(x, i, &c) && isfinite(c)) {
            s.lo = fmin(s.lo, c);
            s.hi = fmax(s.hi, c);
            s.any_finite = true;
        }
    }
    return s;
}

/* Temperature > 0: one uniform draw against the cumulative weights. */
static size_t pick_softmax(const ctx_t *x, kvr_rng_t *rng)
{
    softmax_t s = softmax_prepare(x);
    double sum = 0;
    for (size_t i = 0; i < x->req->n_cands; i++) {
        double c;
        if (scored(x, i, &c))
            sum += softmax_weight(&s, c);
    }
    double target = kvr_rng_uniform(rng) * sum, cum = 0;
    size_t pick = SIZE_MAX, last = SIZE_MAX;
    for (size_t i = 0; i < x->req->n_cands; i++) {
        double c;
        if (!scored(x, i, &c))
            continue;
        double w = softmax_weight(&s, c);
        if (x->explain != NULL)
            x->explain[i].probability = w / sum;
        if (w <= 0)
            continue;
        cum += w;
        last = i;
        if (pick == SIZE_MAX && target < cum)
            pick = i;
        if (pick != SIZE_MAX && x->explain == NULL)
            break;
    }
    return pick != SIZE_MAX ? pick : last; /* rounding can leave target == sum */
}

/* ---- the call ---- */

static int bad(kvr_select_result_t *out, const char *field)
{
    out->field = field;
    return KVR_EINVAL;
}

static int check_request(const kvr_select_request_t *r, kvr_select_result_t *out)
{
    if (r->block_size == 0)
        return bad(out, "block_size");
    if (r->n_cands > 0 && r->cands == NULL)
        return bad(out, "candidates");
    if (r->n_allowed > 0 && r->allowed_ids == NULL)
        return bad(out, "allowed_worker_ids");
    for (size_t i = 1; i < r->n_allowed; i++)
        if (r->allowed_ids[i] < r->allowed_ids[i - 1])
            return bad(out, "allowed_worker_ids");
    if (r->n_exclude > 0 && r->exclude_ids == NULL)
        return bad(out, "exclude_ids");
    if (r->n_required > 0 && r->required_taints == NULL)
        return bad(out, "required_taints");
    for (size_t i = 0; i < r->n_required; i++)
        if (r->required_taints[i] == NULL)
            return bad(out, "required_taints");
    if (r->n_preferred > 0 && r->preferred_taints == NULL)
        return bad(out, "preferred_taints");
    for (size_t i = 0; i < r->n_preferred; i++)
        if (r->preferred_taints[i].taint == NULL || !isfinite(r->preferred_taints[i].weight))
            return bad(out, "preferred_taints");
    for (size_t i = 0; i < r->n_cands; i++)
        if (r->cands[i].n_taints > 0 && r->cands[i].taints == NULL)
            return bad(out, "taints");
    return KVR_OK;
}

/* The share of the prompt candidate c holds: cached in any tier, or credited in flight. */
static double held_share(const ctx_t *x, const kvr_select_candidate_t *c)
{
    double held = (double)c->device_blocks + c->host_blocks + c->disk_blocks + c->predicted_blocks;
    return fmin(held / x->request_blocks, 1.0);
}

/* Pass 1: filters, counts, the least active prefill among eligible candidates and the most of
 * the prompt one holds. */
static void eligibility_pass(ctx_t *x, kvr_select_result_t *out)
{
    bool any = false;
    x->min_active = 0;
    x->held_share = 0;
    for (size_t i = 0; i < x->req->n_cands; i++) {
        const kvr_select_candidate_t *c = &x->req->cands[i];
        kvr_select_why_t why = filter(x->req, c);
        if (x->explain != NULL)
            x->explain[i].why = why;
        if (why == KVR_SELECT_BUSY)
            out->n_busy++;
        if (why != KVR_SELECT_ELIGIBLE)
            continue;
        out->n_eligible++;
        out->n_queue_busy += c->queue_busy;
        double a = active_prefill(c);
        x->min_active = any ? fmin(x->min_active, a) : a;
        x->held_share = fmax(x->held_share, held_share(x, c));
        any = true;
    }
}

/* Pass 2 (explain only): every term of every candidate. */
static void explain_pass(const ctx_t *x)
{
    for (size_t i = 0; i < x->req->n_cands; i++) {
        kvr_select_why_t why = x->explain[i].why;
        cost_terms(x, &x->req->cands[i], &x->explain[i]);
        x->explain[i].why = why;
    }
}

static size_t find_rank(const kvr_select_request_t *r, kvr_worker_t w)
{
    for (size_t i = 0; i < r->n_cands; i++)
        if (r->cands[i].worker.worker_id == w.worker_id && r->cands[i].worker.dp_rank == w.dp_rank)
            return i;
    return SIZE_MAX;
}

/* Status of a pinned rank: in the allowed set, present, alive, tainted as required, idle. */
static int pinned_status(const kvr_select_request_t *r, size_t *idx)
{
    if (!id_allowed(r, r->pinned.worker_id))
        return KVR_ENOTALLOWED;
    *idx = find_rank(r, r->pinned);
    if (*idx == SIZE_MAX)
        return KVR_ENOWORKER;
    switch (filter(r, &r->cands[*idx])) {
    case KVR_SELECT_FENCED:
        return KVR_ENOWORKER;
    case KVR_SELECT_MISSING_TAINT:
    case KVR_SELECT_NOT_ALLOWED:
    case KVR_SELECT_EXCLUDED:
    case KVR_SELECT_OTHER_MODEL:
        return KVR_ENOTALLOWED;
    case KVR_SELECT_BUSY:
        return KVR_EBUSY;
    default:
        return r->cands[*idx].queue_busy ? KVR_EBUSY : KVR_OK; /* it waits for that rank */
    }
}

/* The rank the request insists on (pinned) or prefers (when eligible); SIZE_MAX if none. */
static int direct_pick(const ctx_t *x, size_t *idx)
{
    const kvr_select_request_t *r = x->req;
    *idx = SIZE_MAX;
    if (r->has_pinned)
        return pinned_status(r, idx);
    if (r->has_preferred) {
        size_t i = find_rank(r, r->preferred);
        if (i != SIZE_MAX && filter(r, &r->cands[i]) == KVR_SELECT_ELIGIBLE)
            *idx = i;
    }
    return KVR_OK;
}

static void fill_result(const ctx_t *x, size_t idx, bool unbiased, kvr_select_result_t *out)
{
    kvr_select_explain_t t;
    cost_terms(x, &x->req->cands[idx], &t);
    out->index = idx;
    out->worker = x->req->cands[idx].worker;
    out->cost = unbiased ? t.logit : t.cost;
    out->effective_overlap_blocks = t.effective_overlap_blocks;
    out->cached_tokens = t.cached_tokens;
}

static void mark_direct(const ctx_t *x, size_t idx)
{
    if (x->explain == NULL)
        return;
    for (size_t i = 0; i < x->req->n_cands; i++)
        if (x->explain[i].why == KVR_SELECT_ELIGIBLE && i != idx)
            x->explain[i].why = KVR_SELECT_NOT_PINNED;
    x->explain[idx].probability = 1.0;
}

/*
 * Choices where the reference drifts or is loose:
 *  - busy is per rank: a busy rank is never picked (the reference drops a worker only when all
 *    its ranks are busy, and may then pick one of its busy ranks);
 *  - the queue threshold (queue_busy) only decides whether a request waits, as the reference's
 *    does: while any eligible rank is under it, every eligible rank may be picked;
 *  - a pinned rank lacking a required taint is KVR_ENOTALLOWED, like one outside allowed_ids;
 *  - request_blocks 0 (empty prompt) divides the decay as 1;
 *  - a softmax draw never lands on a zero-probability candidate (strict < on the cumulative).
 */
int kvr_select(const kvr_select_config_t *cfg, const kvr_select_request_t *req, kvr_rng_t *rng,
               kvr_select_result_t *out, kvr_select_explain_t *explain)
{
    kvr_select_result_t dummy;
    if (out == NULL)
        out = &dummy;
    *out = (kvr_select_result_t){.index = SIZE_MAX};
    if (req == NULL || rng == NULL)
        return bad(out, req == NULL ? "request" : "rng");
    ctx_t x = {.req = req, .explain = explain, .bs = req->block_size};
    int rc = kvr_select_config_merge(cfg, req->ovr, &x.cfg, &out->field);
    if (rc == KVR_OK)
        rc = check_request(req, out);
    if (rc != KVR_OK)
        return rc;
    x.scorer = kvr_policy_scorer(x.cfg.policy); /* validated: never NULL */
    uint64_t blocks = req->request_blocks;
    if (blocks == 0)
        blocks = req->isl_tokens / req->block_size + (req->isl_tokens % req->block_size != 0);
    out->request_blocks = blocks;
    x.request_blocks = blocks > 0 ? (double)blocks : 1.0;

    eligibility_pass(&x, out);
    if (explain != NULL)
        explain_pass(&x);
    if (!req->has_pinned && out->n_eligible > 0 && out->n_queue_busy == out->n_eligible)
        return KVR_EBUSY; /* the queue (5.7): wait while every eligible rank is over it */
    size_t idx;
    rc = direct_pick(&x, &idx);
    if (rc != KVR_OK)
        return rc;
    if (idx != SIZE_MAX) {
        mark_direct(&x, idx);
        fill_result(&x, idx, true, out);
        return KVR_OK;
    }
    if (out->n_eligible == 0)
        return out->n_busy > 0 ? KVR_EBUSY : KVR_ENOWORKER;
    idx = x.cfg.temperature > 0 ? pick_softmax(&x, rng) : pick_min(&x, rng);
    assert(idx < req->n_cands && filter(req, &req->cands[idx]) == KVR_SELECT_ELIGIBLE);
    fill_result(&x, idx, false, out);
    return KVR_OK;
}

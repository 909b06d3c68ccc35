/*
 * sim.c: the virtual-time simulator (see sim.h for the model and the event order).
 *
 * State of a run: the router (which owns the load tracker and selector), the prefix index it
 * borrows (KV and approximate modes), the optional router queue, one engine per worker, a heap
 * of the step ends in flight (one per busy worker, ordered by (time, worker)), the list of
 * workers to start at the end of the current instant, and one record per request.
 * Invariants: a worker is in the heap iff its engine is in a step; a request is in at most one
 * of: the router queue, one engine; its record's outcome is PENDING until it finishes or is
 * dropped, and each request is released from the router exactly once (free_request at its
 * last token, or never booked). Memory: all allocated at the start of a run except the
 * engines' per-request buffers, the index, and the KV-event block scratch (grows to the
 * largest event). Threads: one.
 */
#include "sim/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "core/load.h"
#include "core/queue.h"
#include "kvrouter/router.h"
#include "kvrouter.h"

typedef struct sim sim_t;

typedef struct sim_worker {
    sim_t *s;
    uint32_t idx;
    kvr_engine_t *e;
    bool in_step;
    bool kicked;      /* in the start list of the current instant */
    uint64_t placed;  /* requests routed here */
} sim_worker_t;

/* A timed event: a worker's step ends (kind 0), request i's KV arrives at worker w (kind 1,
 * disaggregated), a held prefill is released (kind 2), worker w's oldest KV-event batch in
 * flight reaches the index (kind 3, with a link model). */
typedef struct step_end {
    double t;
    uint32_t kind;
    uint32_t w;
    size_t i;
} step_end_t;

#define PF_BIT ((uintptr_t)1 << (sizeof(uintptr_t) * 8 - 1)) /* engine user: a prefill leg */

struct sim {
    const kvr_sim_config_t *cfg;
    const kvr_sim_input_t *in;
    kvr_sim_result_t *res;
    kvr_sim_record_t *rec;
    kvr_router_t *r;
    kvr_index_t *ix;
    kvr_evlink_t *link; /* KV events' way to the index; NULL = instant */
    kvr_queue_t *q;
    bool feed_index;          /* KV mode: engine events go into the index */
    uint32_t bs;
    uint32_t max_model_len;
    sim_worker_t *w;
    step_end_t *heap;
    size_t n_heap;
    uint32_t *kick;
    size_t n_done; /* requests finished (the progress callback's count) */
    size_t n_kick;
    kvr_rank_score_t *scores; /* one per worker */
    double *oracle_t;         /* one per worker: the oracle's probes (first token time, */
    uint32_t *oracle_cached;  /* cached prompt tokens) */
    uint32_t *tok;            /* one prompt at a time */
    size_t tok_cap;
    kvr_block_t *blocks;      /* KV-event conversion scratch */
    size_t cap_blocks;
    double now;
    int status;               /* first hard error: stops the run */
    char *err;
    size_t err_len;
};

static int set_err(sim_t *s, int status, const char *msg)
{
    if (s->status == KVR_OK) {
        s->status = status;
        if (s->err != NULL && s->err_len > 0)
            snprintf(s->err, s->err_len, "%s", msg);
    }
    return status;
}

static uint64_t now_ms(const sim_t *s) { return (uint64_t)floor(s->now); }
/* the step clocks' scale (kvr_router_worker_step): +1 so that time 0 is not "unset" */
static uint64_t now_us(const sim_t *s) { return (uint64_t)floor(s->now * 1000.0) + 1; }

static size_t req_id(size_t i, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "r%zu", i);
    return n > 0 ? (size_t)n : 0;
}

/* The id of request i's prefill leg. */
static size_t pf_id(size_t i, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "r%zup", i);
    return n > 0 ? (size_t)n : 0;
}

/* ---- config -------------------------------------------------------------------------------- */

void kvr_sim_config_default(kvr_sim_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_workers = 8;
    kvr_engine_config_default(&cfg->engine);
    kvr_config_defaults(&cfg->router);
    cfg->router.block_size = cfg->engine.block_size;
    cfg->router.router_request_expiry_ms = UINT64_C(1000000000000); /* the field's maximum */
    cfg->seed = 1;
    cfg->kv_bytes_per_block = (uint64_t)2 << 20;
    cfg->kv_transfer_gbps = 100.0;
}

int kvr_sim_config_validate(const kvr_sim_config_t *cfg, char *err, size_t err_len)
{
    if (cfg == NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "config: missing");
        return KVR_EINVAL;
    }
    if (cfg->n_workers < 1 || cfg->n_workers > KVR_SIM_MAX_WORKERS) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "workers: must be in [1, %u]", KVR_SIM_MAX_WORKERS);
        return KVR_EINVAL;
    }
    const char *why = NULL;
    if (cfg->n_prefill >= cfg->n_workers)
        why = "prefill-workers: leaves no decode worker";
    else if (cfg->n_prefill > 0 && cfg->oracle)
        why = "oracle: aggregated fleets only (no prefill workers)";
    else if (!(cfg->oracle_affinity >= 0 && cfg->oracle_affinity <= 10))
        why = "oracle affinity: must be in [0, 10]";
    else if (cfg->n_prefill > 0 && cfg->router.router_queue_threshold.set)
        why = "prefill-workers: the router queue is not modelled with disaggregation";
    else if (cfg->n_prefill > 0 && !(cfg->kv_transfer_gbps > 0 && isfinite(cfg->kv_transfer_gbps)))
        why = "kv-transfer-gbps: must be a finite number > 0";
    if (why == NULL)
        why = kvr_evlink_config_check(&cfg->link);
    if (why != NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s", why);
        return KVR_EINVAL;
    }
    int rc = kvr_engine_config_validate(&cfg->engine, err, err_len);
    if (rc == KVR_OK)
        rc = kvr_config_validate(&cfg->router, err, err_len);
    if (rc == KVR_OK && cfg->router.block_size != cfg->engine.block_size) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "block_size: the router's (%u) must equal the engines' (%u)",
                     (unsigned)cfg->router.block_size, (unsigned)cfg->engine.block_size);
        rc = KVR_EINVAL;
    }
    return rc;
}

static int validate_input(const kvr_sim_input_t *in, char *err, size_t err_len)
{
    const char *why = NULL;
    size_t bad = 0;
    if (in == NULL || (in->n > 0 && (in->reqs == NULL || in->tokens == NULL)))
        why = "input: requests or tokens callback missing";
    for (size_t i = 0; why == NULL && i < in->n; i++) {
        const kvr_sim_request_t *r = &in->reqs[i];
        bad = i;
        if (!isfinite(r->arrival_ms) || r->arrival_ms < 0)
            why = "arrival_ms: must be a finite number >= 0";
        else if (i > 0 && r->arrival_ms < in->reqs[i - 1].arrival_ms)
            why = "arrival_ms: goes back";
        else if (r->n_tokens == 0)
            why = "n_tokens: must be >= 1";
        else if (r->max_tokens == 0)
            why = "max_tokens: must be >= 1";
    }
    if (why == NULL)
        return KVR_OK;
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "request %zu: %s", bad, why);
    return KVR_EINVAL;
}

/* ---- step-end heap ------------------------------------------------------------------------- */

static bool before(const step_end_t *a, const step_end_t *b)
{
    if (a->t != b->t)
        return a->t < b->t;
    if (a->kind != b->kind)
        return a->kind < b->kind;
    return a->w < b->w || (a->w == b->w && a->i < b->i);
}

static void heap_push(sim_t *s, step_end_t x)
{
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&x, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = x;
}

static step_end_t heap_pop(sim_t *s)
{
    step_end_t top = s->heap[0];
    step_end_t x = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!before(&s->heap[c], &x))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n > 0)
        s->heap[i] = x;
    return top;
}

/* ---- engine callbacks ---------------------------------------------------------------------- */

static bool grow_blocks(sim_t *s, size_t n)
{
    if (n <= s->cap_blocks)
        return true;
    size_t cap = s->cap_blocks ? s->cap_blocks : 64;
    while (cap < n)
        cap *= 2;
    kvr_block_t *b = realloc(s->blocks, cap * sizeof *b);
    if (b == NULL)
        return false;
    s->blocks = b;
    s->cap_blocks = cap;
    return true;
}

static void apply_event(sim_t *s, const kvr_event_t *e)
{
    s->res->index_events++;
    if (kvr_index_apply(s->ix, e) != KVR_OK)
        s->res->index_errors++;
}

/* KV events of worker k into the index (KV mode only): at once, or through the link model. */
static void on_kv_event(void *ctx, const kvr_kvcache_event_t *ev)
{
    sim_worker_t *k = ctx;
    sim_t *s = k->s;
    if (!s->feed_index)
        return;
    kvr_event_t e = {.worker = {k->idx, 0}, .tier = KVR_TIER_DEVICE};
    switch (ev->kind) {
    case KVR_KVC_STORED:
        if (!grow_blocks(s, ev->n_hashes)) {
            set_err(s, KVR_ENOMEM, "out of memory (KV event)");
            return;
        }
        for (size_t i = 0; i < ev->n_hashes; i++) {
            s->blocks[i].ext = ev->hashes[i];
            (void)kvr_hash_blocks(ev->tokens + i * s->bs, s->bs, s->bs, NULL, &s->blocks[i].lbh, 1);
        }
        e.kind = KVR_EV_STORED;
        e.has_parent = ev->has_parent;
        e.parent_ext = ev->parent;
        e.blocks = s->blocks;
        e.n_blocks = ev->n_hashes;
        break;
    case KVR_KVC_REMOVED:
        e.kind = KVR_EV_REMOVED;
        e.removed = ev->hashes;
        e.n_removed = ev->n_hashes;
        break;
    default:
        e.kind = KVR_EV_CLEARED;
        break;
    }
    if (s->link == NULL) {
        apply_event(s, &e);
        return;
    }
    double at;
    bool first;
    if (kvr_evlink_push(s->link, k->idx, s->now, &e, &at, &first) != KVR_OK) {
        set_err(s, KVR_ENOMEM, "out of memory (KV event in flight)");
        return;
    }
    if (first) /* one delivery per worker in the heap: its oldest batch in flight */
        heap_push(s, (step_end_t){at, 3, k->idx, 0});
}

/* Worker w's oldest KV-event batch in flight reaches the index. */
static void deliver_event(sim_t *s, uint32_t w)
{
    kvr_event_t e;
    double next;
    if (kvr_evlink_pop(s->link, w, &e, &next) != KVR_OK)
        return;
    apply_event(s, &e);
    if (next < INFINITY)
        heap_push(s, (step_end_t){next, 3, w, 0});
}

/* Output tokens of worker k: the request lifecycle into the router and the record. */
static void prefilled(sim_t *s, size_t i, const kvr_engine_output_t *o);

static void on_output(void *ctx, const kvr_engine_output_t *o)
{
    sim_worker_t *k = ctx;
    sim_t *s = k->s;
    if ((uintptr_t)o->user & PF_BIT) {
        prefilled(s, (size_t)((uintptr_t)o->user & ~PF_BIT), o);
        return;
    }
    size_t i = (size_t)(uintptr_t)o->user;
    kvr_sim_record_t *rc = &s->rec[i];
    char id[32];
    size_t idl = req_id(i, id, sizeof id);
    uint64_t t = now_ms(s);
    if (o->first) {
        rc->first_ms = s->now;
        if (rc->prefill_worker < 0) /* disaggregated: the prefill worker's hits */
            rc->cached_tokens = o->cached_tokens;
        (void)kvr_router_first_token(s->r, id, idl, t);
    }
    if (o->n_output % s->bs == 0)
        (void)kvr_router_output_block(s->r, id, idl, NAN, t);
    rc->n_output = o->n_output;
    if (o->finish != KVR_ENGINE_RUNNING) {
        rc->finish_ms = s->now;
        rc->outcome = KVR_SIM_DONE;
        (void)kvr_router_free_request(s->r, id, idl, t);
        if (s->in->progress != NULL)
            s->in->progress(s->in->progress_arg, ++s->n_done, s->in->n, s->now);
    }
}

/* ---- placing requests ---------------------------------------------------------------------- */

static void kick(sim_t *s, sim_worker_t *k)
{
    if (!k->in_step && !k->kicked) {
        k->kicked = true;
        s->kick[s->n_kick++] = k->idx;
    }
}

static void drop(sim_t *s, size_t i, kvr_sim_outcome_t why, int status)
{
    s->rec[i].outcome = why;
    s->rec[i].status = status;
    if (why == KVR_SIM_EXPIRED)
        s->res->expired++;
    else
        s->res->rejected++;
}

/* ---- the clairvoyant placement (cfg.oracle) -------------------------------------------------- */

typedef struct probe {
    const void *user; /* the probe request's */
    bool first;
    uint32_t cached; /* its prompt tokens the copy found cached */
} probe_t;

static void probe_out(void *ctx, const kvr_engine_output_t *o)
{
    probe_t *p = ctx;
    if (o->user == p->user && o->first) {
        p->first = true;
        p->cached = o->cached_tokens;
    }
}

/* When worker w's step in flight ends (it is in a step). */
static double step_end_at(const sim_t *s, uint32_t w)
{
    for (size_t j = 0; j < s->n_heap; j++)
        if (s->heap[j].kind == 0 && s->heap[j].w == w)
            return s->heap[j].t;
    return s->now;
}

/* The time request i (prompt in s->tok) would get its first token on worker w had nothing
 * arrived after it: a copy of w's engine run forward. INFINITY when w would refuse it; *cached
 * the prompt tokens found cached there. */
static int probe_first_token(sim_t *s, uint32_t w, size_t i, double *t, uint32_t *cached)
{
    const kvr_sim_request_t *rq = &s->in->reqs[i];
    int st;
    kvr_engine_t *c = kvr_engine_clone(s->w[w].e, &st);
    if (c == NULL)
        return st;
    probe_t p = {.user = &p};
    kvr_engine_request_t er = {.id = i,
                               .tokens = s->tok,
                               .n_tokens = rq->n_tokens,
                               .max_tokens = rq->max_tokens,
                               .user = (void *)p.user};
    *t = INFINITY;
    st = kvr_engine_add(c, &er);
    if (st != KVR_OK) {
        kvr_engine_free(c);
        return st == KVR_ENOMEM ? st : KVR_OK;
    }
    double now = s->now;
    if (kvr_engine_in_step(c)) {
        now = step_end_at(s, w);
        (void)kvr_engine_step_end(c, probe_out, &p);
    }
    while (!p.first) {
        kvr_engine_step_t step;
        if (kvr_engine_step_begin(c, &step) != KVR_OK || step.idle)
            break; /* it cannot be scheduled without a departure that never comes */
        now += step.duration_ms;
        (void)kvr_engine_step_end(c, probe_out, &p);
    }
    if (p.first)
        *t = now;
    *cached = p.cached;
    kvr_engine_free(c);
    return KVR_OK;
}

/* The worker where request i gets its first token soonest (ties: fewer placed, then lower
 * index); with oracle_affinity, of those within that fraction of the soonest, the one caching
 * most of the prompt (ties: the sooner). s->oracle_t / oracle_cached are the probes'. */
static int oracle_pick(sim_t *s, size_t i, uint32_t *best)
{
    double best_t = INFINITY;
    *best = 0;
    for (uint32_t w = 0; w < s->cfg->n_workers; w++) {
        double t = INFINITY;
        int rc = probe_first_token(s, w, i, &t, &s->oracle_cached[w]);
        if (rc != KVR_OK)
            return rc;
        s->oracle_t[w] = t;
        if (t < best_t || (t == best_t && s->w[w].placed < s->w[*best].placed)) {
            best_t = t;
            *best = w;
        }
    }
    if (s->cfg->oracle_affinity > 0 && isfinite(best_t)) {
        double bound = s->now + (best_t - s->now) * (1.0 + s->cfg->oracle_affinity);
        for (uint32_t w = 0; w < s->cfg->n_workers; w++) {
            bool near = s->oracle_t[w] <= bound;
            if (near && (s->oracle_cached[w] > s->oracle_cached[*best] ||
                         (s->oracle_cached[w] == s->oracle_cached[*best] &&
                          s->oracle_t[w] < s->oracle_t[*best])))
                *best = w;
        }
    }
    return KVR_OK;
}

/* Routes request i and hands it to its engine. KVR_OK (placed); KVR_EBUSY (nothing changed:
 * every eligible worker is busy); any other refusal is recorded as rejected and returned;
 * hard errors (the tokens callback, out of memory) also set s->status. */
static int place(sim_t *s, size_t i)
{
    const kvr_sim_request_t *rq = &s->in->reqs[i];
    int rc = s->in->tokens(s->in->ud, i, s->tok, s->tok_cap);
    if (rc != KVR_OK)
        return set_err(s, rc, "the tokens callback failed");
    char id[32];
    size_t idl = req_id(i, id, sizeof id);
    char sid[24];
    kvr_route_req_t q = {.tokens = s->tok,
                         .n_tokens = rq->n_tokens,
                         .request_id = id,
                         .request_id_len = idl,
                         .update_state = true,
                         .now_us = now_us(s)};
    bool pf = s->cfg->n_prefill > 0;
    if (pf && kvr_router_disagg_bypass(s->r, &q, now_ms(s)) != KVR_BYPASS_NONE) {
        pf = false; /* conditional disaggregation: a decode worker prefills it */
        s->res->bypassed++;
    }
    if (pf) { /* the prefill leg first */
        idl = pf_id(i, id, sizeof id);
        q.request_id_len = idl;
        kvr_route_req_prefill_leg(&q);
    }
    if (rq->session != 0 && !pf) {
        q.session_id = sid;
        q.session_id_len =
            (size_t)snprintf(sid, sizeof sid, "s%llu", (unsigned long long)rq->session);
    }
    if (s->cfg->oracle) {
        uint32_t w;
        rc = oracle_pick(s, i, &w);
        if (rc != KVR_OK)
            return set_err(s, rc, "out of memory (oracle)");
        q.has_pinned = true;
        q.pinned = (kvr_worker_t){w, 0};
    }
    uint64_t best = 0;
    if (s->feed_index) { /* diagnostics: what the best-cached worker had (an extra lookup) */
        size_t n_sc = 0;
        if (kvr_router_query(s->r, &q, s->scores, s->cfg->n_workers, &n_sc) == KVR_OK)
            for (size_t k = 0; k < n_sc; k++)
                best = s->scores[k].cached_tokens > best ? s->scores[k].cached_tokens : best;
    }
    kvr_route_res_t res;
    rc = kvr_router_route(s->r, &q, now_ms(s), &res);
    if (rc == KVR_EBUSY)
        return rc;
    if (rc == KVR_ENOMEM)
        return set_err(s, rc, "out of memory (router)");
    if (rc != KVR_OK) {
        drop(s, i, KVR_SIM_REJECTED, rc);
        return rc;
    }
    uint32_t w = (uint32_t)res.worker.worker_id;
    sim_worker_t *k = &s->w[w];
    kvr_engine_request_t er = {.id = i,
                               .tokens = s->tok,
                               .n_tokens = rq->n_tokens,
                               .max_tokens = pf ? 1 : rq->max_tokens,
                               .user = (void *)((uintptr_t)i | (pf ? PF_BIT : 0)),
                               .hold_kv = pf};
    rc = kvr_engine_add(k->e, &er);
    if (rc != KVR_OK) {
        (void)kvr_router_free_request(s->r, id, idl, now_ms(s));
        if (rc == KVR_ENOMEM)
            return set_err(s, rc, "out of memory (engine)");
        drop(s, i, KVR_SIM_REJECTED, rc);
        return rc;
    }
    kvr_sim_record_t *r = &s->rec[i];
    if (pf)
        r->prefill_worker = (int32_t)w;
    else
        r->worker = (int32_t)w;
    r->routed_ms = s->now;
    r->predicted_cached_tokens = res.cached_tokens;
    r->best_cached_tokens = best;
    k->placed++;
    kick(s, k);
    return KVR_OK;
}

/* Request i's prefill token is out (disaggregated): the prefill booking ends, the decode leg
 * is routed, and the KV starts its way there. */
static void prefilled(sim_t *s, size_t i, const kvr_engine_output_t *o)
{
    char id[32];
    size_t idl = pf_id(i, id, sizeof id);
    uint64_t t = now_ms(s);
    (void)kvr_router_first_token(s->r, id, idl, t);
    (void)kvr_router_free_request(s->r, id, idl, t);
    kvr_sim_record_t *rc = &s->rec[i];
    rc->prefilled_ms = s->now;
    rc->cached_tokens = o->cached_tokens;
    const kvr_sim_request_t *rq = &s->in->reqs[i];
    int st = s->in->tokens(s->in->ud, i, s->tok, s->tok_cap);
    if (st != KVR_OK) {
        set_err(s, st, "the tokens callback failed");
        return;
    }
    idl = req_id(i, id, sizeof id);
    kvr_route_req_t q = {.tokens = s->tok,
                         .n_tokens = rq->n_tokens,
                         .request_id = id,
                         .request_id_len = idl,
                         .update_state = true,
                         .now_us = now_us(s)};
    char sid[24];
    if (rq->session != 0) {
        q.session_id = sid;
        q.session_id_len =
            (size_t)snprintf(sid, sizeof sid, "s%llu", (unsigned long long)rq->session);
    }
    kvr_route_req_decode_leg(&q);
    kvr_route_res_t res;
    st = kvr_router_route(s->r, &q, t, &res);
    if (st != KVR_OK) { /* nowhere to decode: the held KV is freed with the request */
        heap_push(s, (step_end_t){s->now, 2, (uint32_t)rc->prefill_worker, i}); /* freed */
        if (st == KVR_ENOMEM)
            set_err(s, st, "out of memory (router)");
        else
            drop(s, i, KVR_SIM_REJECTED, st);
        return;
    }
    rc->worker = (int32_t)res.worker.worker_id;
    s->w[rc->worker].placed++;
    double ms = (double)o->kv_blocks * (double)s->cfg->kv_bytes_per_block * 8.0 /
                (s->cfg->kv_transfer_gbps * 1e9) * 1e3;
    s->res->transfer_ms += ms;
    heap_push(s, (step_end_t){s->now + ms, 1, (uint32_t)rc->worker, i});
}

/* Request i's KV arrived at its decode worker: freed on the prefill worker, admitted there
 * with it. */
static void kv_arrived(sim_t *s, uint32_t w, size_t i)
{
    kvr_sim_record_t *rc = &s->rec[i];
    (void)kvr_engine_release_held(s->w[rc->prefill_worker].e, i);
    s->res->transfers++;
    const kvr_sim_request_t *rq = &s->in->reqs[i];
    int st = s->in->tokens(s->in->ud, i, s->tok, s->tok_cap);
    if (st != KVR_OK) {
        set_err(s, st, "the tokens callback failed");
        return;
    }
    kvr_engine_request_t er = {.id = i,
                               .tokens = s->tok,
                               .n_tokens = rq->n_tokens,
                               .max_tokens = rq->max_tokens,
                               .user = (void *)(uintptr_t)i,
                               .kv_loaded = true};
    st = kvr_engine_add(s->w[w].e, &er);
    if (st != KVR_OK) {
        char id[32];
        size_t idl = req_id(i, id, sizeof id);
        (void)kvr_router_free_request(s->r, id, idl, now_ms(s));
        if (st == KVR_ENOMEM)
            set_err(s, st, "out of memory (engine)");
        else
            drop(s, i, KVR_SIM_REJECTED, st);
        return;
    }
    kick(s, &s->w[w]);
}

static void enqueue(sim_t *s, size_t i)
{
    const kvr_sim_request_t *rq = &s->in->reqs[i];
    kvr_queue_item_t it = {.isl_tokens = rq->n_tokens,
                           .cost_tokens = rq->n_tokens,
                           .timeout_ms = s->cfg->router.router_queue_timeout_ms,
                           .user = (void *)(uintptr_t)i};
    int rc = kvr_queue_push(s->q, &it, now_ms(s), NULL);
    if (rc != KVR_OK) {
        drop(s, i, KVR_SIM_REJECTED, rc);
        return;
    }
    s->res->queued++;
}

static void arrive(sim_t *s, size_t i)
{
    const kvr_sim_request_t *rq = &s->in->reqs[i];
    if ((uint64_t)rq->n_tokens + rq->max_tokens > s->max_model_len) {
        s->rec[i].outcome = KVR_SIM_TOO_LONG;
        s->res->too_long++;
        return;
    }
    if (s->q != NULL && kvr_queue_len(s->q) > 0) { /* arrivals do not overtake a backlog */
        enqueue(s, i);
        return;
    }
    int rc = place(s, i);
    if (rc == KVR_EBUSY) {
        if (s->q != NULL)
            enqueue(s, i);
        else
            drop(s, i, KVR_SIM_REJECTED, rc);
    }
}

/* Places queued requests while the head can be placed (load went down). */
static void dispatch(sim_t *s)
{
    kvr_queue_entry_t e;
    while (s->status == KVR_OK && kvr_queue_peek(s->q, &e) == KVR_OK) {
        size_t i = (size_t)(uintptr_t)e.item.user;
        if (place(s, i) == KVR_EBUSY)
            return;
        (void)kvr_queue_pop(s->q, &e);
    }
}

static void expire(sim_t *s)
{
    kvr_queue_entry_t e;
    while (kvr_queue_expire(s->q, now_ms(s), &e) == KVR_OK)
        drop(s, (size_t)(uintptr_t)e.item.user, KVR_SIM_EXPIRED, KVR_EBUSY);
}

/* ---- steps --------------------------------------------------------------------------------- */

static void end_step(sim_t *s, uint32_t w)
{
    sim_worker_t *k = &s->w[w];
    k->in_step = false;
    (void)kvr_engine_step_end(k->e, on_output, k);
    (void)kvr_router_worker_step(s->r, (kvr_worker_t){w, 0}, now_us(s)); /* its tokens are out */
    kick(s, k);
}

static void begin_steps(sim_t *s)
{
    for (size_t j = 0; j < s->n_kick; j++) {
        sim_worker_t *k = &s->w[s->kick[j]];
        k->kicked = false;
        if (k->in_step || !kvr_engine_has_work(k->e))
            continue;
        kvr_engine_step_t st;
        if (kvr_engine_step_begin(k->e, &st) != KVR_OK || st.idle)
            continue; /* work it cannot schedule now; a later arrival or end kicks it again */
        k->in_step = true;
        s->res->steps++;
        s->res->preemptions += st.n_preempted;
        heap_push(s, (step_end_t){s->now + st.duration_ms, 0, k->idx, 0});
    }
    s->n_kick = 0;
}

/* ---- setup and teardown -------------------------------------------------------------------- */

static uint64_t mix_seed(uint64_t x)
{
    x = kvr_splitmix64(&x);
    return x ? x : 1; /* the router reads seed 0 as "random" */
}

static int setup(sim_t *s)
{
    const kvr_sim_config_t *c = s->cfg;
    char e[256] = "";
    int rc = KVR_OK;
    kvr_router_mode_t mode = c->router.router_mode;
    if (mode == KVR_MODE_KV || mode == KVR_MODE_APPROX) {
        kvr_index_config_t ic = {.max_pairs = c->router.index_max_pairs,
                                 .max_workers = c->n_workers,
                                 .sync = KVR_SYNC_NONE};
        s->ix = kvr_index_new(&ic, &rc);
        if (s->ix == NULL)
            return set_err(s, rc, "index: cannot create");
    }
    s->feed_index = mode == KVR_MODE_KV;
    if (s->feed_index && kvr_evlink_config_active(&c->link)) {
        kvr_evlink_config_t lc = c->link;
        lc.seed = mix_seed(c->seed ^ UINT64_C(0x6c696e6b)); /* its own stream */
        if ((s->link = kvr_evlink_new(c->n_workers, &lc, &rc, NULL)) == NULL)
            return set_err(s, rc, "event link: cannot create");
    }
    kvr_router_config_t rcfg = c->router;
    rcfg.seed = mix_seed(c->seed);
    rcfg.max_workers = c->n_workers > rcfg.max_workers ? c->n_workers : rcfg.max_workers;
    s->r = kvr_router_new(&rcfg, s->ix, &rc, e, sizeof e);
    if (s->r == NULL)
        return set_err(s, rc, e[0] ? e : "router: cannot create");
    if (c->router.router_queue_threshold.set) {
        uint64_t cap = c->router.router_queue_max_requests;
        kvr_queue_config_t qc = {.capacity = cap < 2 ? 2 : cap > KVR_QUEUE_MAX_CAPACITY
                                                               ? KVR_QUEUE_MAX_CAPACITY
                                                               : (size_t)cap,
                                 .max_pending_isl_tokens = c->router.router_queue_max_isl_tokens,
                                 .order = c->router.router_queue_policy};
        s->q = kvr_queue_new(&qc, &rc);
        if (s->q == NULL)
            return set_err(s, rc, "router queue: cannot create");
    }
    s->w = calloc(c->n_workers, sizeof *s->w);
    /* steps and event deliveries (one each per worker), transfers and releases */
    s->heap = calloc((size_t)2 * c->n_workers + 2 * s->in->n + 1, sizeof *s->heap);
    s->kick = calloc(c->n_workers, sizeof *s->kick);
    s->scores = calloc(c->n_workers, sizeof *s->scores);
    s->oracle_t = calloc(c->n_workers, sizeof *s->oracle_t);
    s->oracle_cached = calloc(c->n_workers, sizeof *s->oracle_cached);
    if (s->w == NULL || s->heap == NULL || s->kick == NULL || s->scores == NULL ||
        s->oracle_t == NULL || s->oracle_cached == NULL)
        return set_err(s, KVR_ENOMEM, "out of memory");
    for (uint32_t w = 0; w < c->n_workers; w++) {
        sim_worker_t *k = &s->w[w];
        k->s = s;
        k->idx = w;
        k->e = kvr_engine_new(&c->engine, on_kv_event, k, &rc);
        if (k->e == NULL)
            return set_err(s, rc, "engine: cannot create");
        kvr_worker_spec_t spec;
        memset(&spec, 0, sizeof spec);
        spec.worker_id = w;
        spec.dp_size = 1;
        spec.max_num_batched_tokens = c->engine.max_num_batched_tokens;
        spec.total_kv_blocks = c->engine.num_gpu_blocks;
        spec.role = c->n_prefill == 0 ? KVR_ROLE_BOTH
                    : w < c->n_prefill ? KVR_ROLE_PREFILL
                                       : KVR_ROLE_DECODE;
        rc = kvr_router_add_worker(s->r, &spec, e, sizeof e);
        if (rc != KVR_OK)
            return set_err(s, rc, e);
    }
    s->max_model_len = kvr_engine_config(s->w[0].e)->max_model_len;
    s->bs = c->engine.block_size;
    size_t longest = 1;
    for (size_t i = 0; i < s->in->n; i++)
        if (s->in->reqs[i].n_tokens > longest)
            longest = s->in->reqs[i].n_tokens;
    s->tok_cap = longest;
    s->tok = malloc(longest * sizeof *s->tok);
    if (s->tok == NULL)
        return set_err(s, KVR_ENOMEM, "out of memory");
    for (size_t i = 0; i < s->in->n; i++)
        s->rec[i] = (kvr_sim_record_t){.outcome = KVR_SIM_PENDING,
                                       .worker = -1,
                                       .arrival_ms = s->in->reqs[i].arrival_ms,
                                       .routed_ms = NAN,
                                       .first_ms = NAN,
                                       .finish_ms = NAN,
                                       .best_cached_tokens = 0,
                                       .prefill_worker = -1,
                                       .prefilled_ms = NAN};
    return KVR_OK;
}

static void teardown(sim_t *s)
{
    if (s->w != NULL)
        for (uint32_t w = 0; w < s->cfg->n_workers; w++)
            kvr_engine_free(s->w[w].e);
    free(s->w);
    free(s->heap);
    free(s->kick);
    free(s->scores);
    free(s->oracle_t);
    free(s->oracle_cached);
    free(s->tok);
    free(s->blocks);
    kvr_queue_free(s->q);
    kvr_evlink_free(s->link);
    kvr_router_free(s->r);
    kvr_index_free(s->ix);
}

/* ---- the loop and the summary -------------------------------------------------------------- */

static void run_loop(sim_t *s)
{
    const kvr_sim_input_t *in = s->in;
    size_t next = 0;
    uint64_t next_tick = 1000;
    while (s->status == KVR_OK) {
        double ta = next < in->n ? in->reqs[next].arrival_ms : INFINITY;
        double ts = s->n_heap > 0 ? s->heap[0].t : INFINITY;
        double tq = INFINITY;
        if (s->q != NULL && kvr_queue_len(s->q) > 0) {
            uint64_t d = kvr_queue_next_deadline(s->q);
            if (d != UINT64_MAX)
                tq = (double)d;
        }
        double t = fmin(ta, fmin(ts, tq));
        if (t == INFINITY)
            break;
        if (t > s->now)
            s->now = t;
        bool ended = false;
        while (s->n_heap > 0 && s->heap[0].t <= s->now) {
            step_end_t x = heap_pop(s);
            if (x.kind == 0)
                end_step(s, x.w);
            else if (x.kind == 1)
                kv_arrived(s, x.w, x.i);
            else if (x.kind == 3)
                deliver_event(s, x.w);
            else /* a held prefill whose request found no decode worker */
                (void)kvr_engine_release_held(s->w[x.w].e, x.i);
            ended = true;
        }
        if (s->q != NULL && ended)
            dispatch(s);
        if (s->q != NULL)
            expire(s);
        while (s->status == KVR_OK && next < in->n && in->reqs[next].arrival_ms <= s->now)
            arrive(s, next++);
        begin_steps(s);
        if (now_ms(s) >= next_tick) {
            kvr_router_tick(s->r, now_ms(s));
            next_tick = now_ms(s) + 1000;
        }
    }
}

static void summarize(sim_t *s, double *buf)
{
    kvr_sim_result_t *res = s->res;
    size_t n = s->in->n, k;
    for (size_t i = 0; i < n; i++) {
        kvr_sim_record_t *r = &s->rec[i];
        if (r->outcome == KVR_SIM_PENDING) /* work an engine never scheduled */
            drop(s, i, KVR_SIM_REJECTED, KVR_EBUSY);
        if (r->outcome != KVR_SIM_DONE)
            continue;
        res->requests++;
        res->prompt_tokens += s->in->reqs[i].n_tokens;
        res->cached_tokens += r->cached_tokens;
        res->predicted_cached_tokens += r->predicted_cached_tokens;
        res->best_cached_tokens += r->best_cached_tokens;
    }
    if (s->link != NULL) {
        kvr_evlink_stats_t ls;
        kvr_evlink_stats(s->link, &ls);
        res->event_batches = ls.batches;
        res->events_lost = ls.lost;
        uint64_t delivered = res->index_events;
        res->event_delay_ms = delivered > 0 ? ls.delay_sum_ms / (double)delivered : 0;
    }
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (s->rec[i].outcome == KVR_SIM_DONE)
            buf[k++] = s->rec[i].first_ms - s->rec[i].arrival_ms;
    res->ttft_mean_ms = kvr_stats_mean(buf, k);
    res->ttft_ms = kvr_stats_pcts(buf, k);
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (s->rec[i].outcome == KVR_SIM_DONE)
            buf[k++] = s->rec[i].finish_ms - s->rec[i].arrival_ms;
    res->e2e_ms = kvr_stats_pcts(buf, k);
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (s->rec[i].outcome == KVR_SIM_DONE)
            buf[k++] = s->rec[i].routed_ms - s->rec[i].arrival_ms;
    res->queue_ms = kvr_stats_pcts(buf, k);
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (s->rec[i].outcome == KVR_SIM_DONE && s->rec[i].n_output >= 2)
            buf[k++] = (s->rec[i].finish_ms - s->rec[i].first_ms) / (s->rec[i].n_output - 1);
    res->itl_ms = kvr_stats_pcts(buf, k);
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (s->rec[i].outcome == KVR_SIM_DONE && s->rec[i].prefill_worker >= 0)
            buf[k++] = s->rec[i].prefilled_ms - s->rec[i].arrival_ms;
    res->prefill_ms = kvr_stats_pcts(buf, k);
    res->hit_ratio =
        res->prompt_tokens ? (double)res->cached_tokens / (double)res->prompt_tokens : 0.0;
    uint64_t placed = 0;
    for (uint32_t w = 0; w < s->cfg->n_workers; w++) {
        placed += s->w[w].placed;
        if (s->w[w].placed > res->max_worker_requests)
            res->max_worker_requests = s->w[w].placed;
    }
    res->max_worker_share = placed ? (double)res->max_worker_requests / (double)placed : 0.0;
    res->virtual_ms = s->now;
    kvr_load_stats_t ls;
    kvr_load_stats(kvr_router_load(s->r), &ls);
    res->router_live_at_end = ls.live_requests;
    res->router_unknown_ids = ls.unknown_frees + ls.unknown_marks;
}

int kvr_sim_run(const kvr_sim_config_t *cfg, const kvr_sim_input_t *in, kvr_sim_result_t *out,
                kvr_sim_record_t *records, char *err, size_t err_len)
{
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    if (out == NULL)
        return KVR_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = kvr_sim_config_validate(cfg, err, err_len);
    if (rc == KVR_OK)
        rc = validate_input(in, err, err_len);
    if (rc != KVR_OK)
        return rc;
    sim_t s = {.cfg = cfg, .in = in, .res = out, .rec = records, .err = err, .err_len = err_len};
    kvr_sim_record_t *own = NULL;
    double *buf = malloc((in->n ? in->n : 1) * sizeof *buf);
    if (records == NULL)
        s.rec = own = malloc((in->n ? in->n : 1) * sizeof *own);
    if (buf == NULL || s.rec == NULL)
        set_err(&s, KVR_ENOMEM, "out of memory");
    if (s.status == KVR_OK && setup(&s) == KVR_OK)
        run_loop(&s);
    if (s.status == KVR_OK)
        summarize(&s, buf);
    teardown(&s);
    free(buf);
    free(own);
    if (s.status != KVR_OK) {
        kvr_sim_result_t zero = {0};
        *out = zero;
    }
    return s.status;
}

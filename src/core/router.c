/*
 * router.c: the routing decision (see router.h): hash, look up, project load, decide (through
 * the policy table, core/policy.h), book; the request lifecycle. The workers and their ranks
 * are the registry's (core/registry.h). A booking also takes its place in its rank's prefill
 * stream (core/stepclock.h), which decides the blocks in flight a later request is credited
 * with (inflight_ready).
 *
 * Invariants: the registry's (its rank table lists every registered rank); per-request fields
 * of the rank table are rewritten by every route before use; a decision names an eligible
 * rank of the table (asserted); picker is set exactly in the load-only modes. The load tracker
 * holds requests only for registered workers (removal frees them).
 * Ownership: the router owns its registry, load tracker, sessions, recorder and scratch; it
 * borrows the index. Threads: one (the caller's; see router.h). Cost: router.h's (hashing and
 * lookup O(prompt blocks), candidates and decision O(ranks)); add / remove worker O(ranks).
 * Time: the router reads no clock. Decisions take now_ms from the caller; where a decision's
 * time went (kvr_route_timing_t) is measured with the caller's clock (kvr_router_set_clock),
 * never used to decide.
 * Memory: the registry and rank table grow with workers; the hashing and lookup scratch grows
 * to the largest prompt seen (bounded by router_max_prompt_tokens). No allocation per route
 * once warm.
 */
#include "kvrouter/router.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/grow.h"
#include "core/approx.h"
#include "core/inflight.h"
#include "core/overlay.h"
#include "core/endpoint.h"
#include "core/load.h"
#include "core/policy.h"
#include "core/registry.h"
#include "core/select.h"
#include "core/session.h"
#include "core/stepclock.h"

struct kvr_router {
    kvr_router_config_t cfg;
    kvr_index_t *ix;
    kvr_approx_t *approx;
    kvr_overlay_t *ov; /* kv mode: ranks routed approximately (core/overlay.h); NULL: none yet */
    kvr_inflight_t watch; /* in-flight credits until their events confirm them */
    kvr_decision_sink_t sink; /* approximate mode without a local index: decisions go there */
    kvr_load_t *load;
    kvr_sessions_t *sessions; /* NULL: session_ttl_secs 0 */
    kvr_select_config_t sel;
    kvr_busy_thresholds_t busy, queue_busy;
    struct {
        char model[KVR_MODEL_BYTES];
        kvr_busy_thresholds_t th;
    } busy_by_model[KVR_BUSY_MAX_MODELS]; /* run-time overrides (kvr_router_busy_threshold) */
    size_t n_busy_models;
    bool explain_on;               /* keep the last decision's breakdown (kvr_router_set_explain) */
    kvr_select_explain_t *explain; /* per rank of the last cache-aware decision */
    size_t cap_explain, n_explain;
    kvr_rng_t rng;
    const kvr_policy_t *picker; /* the load-only modes' (policy.h); NULL: the selector picks */

    kvr_registry_t reg;  /* workers, ranks, pools (core/registry.h) */
    kvr_pool_hash_t cur; /* the request being routed: how its prompt is hashed */

    uint64_t *lbh, *seq;               /* hashing scratch (cap_blocks) */
    const uint64_t *cur_lbh, *cur_seq; /* the request being routed: the scratch or its own */
    size_t cap_blocks;
    kvr_lookup_t lk;
    uint64_t rr;
    kvr_router_stats_t st;
    kvr_load_request_t last; /* the last booking (replica sync); last.id NULL = none */
    kvr_clock_fn clock;      /* the caller's, for kvr_route_timing_t; NULL = none */
};

/* The caller's clock, for the timings only (none: they read 0). */
static uint64_t clock_ns(const kvr_router_t *r) { return r->clock != NULL ? r->clock() : 0; }

/* seed 0: a random one (getrandom(2); the router reads no clock). */
static uint64_t seed_of(uint64_t seed)
{
    if (seed == 0 && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = 1; /* no random source: a fixed stream rather than no router */
    return seed;
}

/* ---------------------------------------------------------------------------------------- */
/* Worker specs */

/* ---------------------------------------------------------------------------------------- */
/* Rank table */

/* ---------------------------------------------------------------------------------------- */
/* Creation */

static int setup_select(kvr_router_t *r, char *err, size_t err_len)
{
    const kvr_router_config_t *c = &r->cfg;
    kvr_select_config_default(&r->sel);
    r->sel.overlap_score_credit = c->overlap_score_credit;
    r->sel.overlap_score_credit_decay = c->overlap_score_credit_decay;
    r->sel.prefill_load_scale = c->prefill_load_scale;
    r->sel.decode_active_request_weight = c->decode_active_request_weight;
    r->sel.host_cache_hit_weight = c->host_cache_hit_weight;
    r->sel.disk_cache_hit_weight = c->disk_cache_hit_weight;
    r->sel.temperature = c->router_temperature;
    r->sel.step_wait_weight = c->router_step_wait_weight;
    r->sel.inflight_credit_weight = c->router_inflight_credit_weight;
    r->sel.policy = c->router_selection_policy;
    const char *field = NULL;
    if (kvr_select_config_validate(&r->sel, &field) != KVR_OK) {
        snprintf(err, err_len, "%s: invalid", field ? field : "selector");
        return KVR_EINVAL;
    }
    r->busy = (kvr_busy_thresholds_t){
        .has_prefill_tokens = c->active_prefill_tokens_threshold.set,
        .prefill_tokens = (uint64_t)c->active_prefill_tokens_threshold.v,
        .has_prefill_frac = c->active_prefill_tokens_threshold_frac.set,
        .prefill_frac = c->active_prefill_tokens_threshold_frac.v,
        .has_decode_frac = c->active_decode_blocks_threshold.set,
        .decode_frac = c->active_decode_blocks_threshold.v,
    };
    r->queue_busy = (kvr_busy_thresholds_t){
        .has_prefill_frac = c->router_queue_threshold.set,
        .prefill_frac = c->router_queue_threshold.v,
    };
    return KVR_OK;
}

static int setup_load(kvr_router_t *r, char *err, size_t err_len)
{
    const kvr_router_config_t *c = &r->cfg;
    kvr_load_config_t lc;
    kvr_load_config_init(&lc);
    lc.block_size = c->block_size;
    lc.track_active_blocks = c->router_track_active_blocks;
    lc.track_output_blocks = c->router_track_output_blocks;
    lc.assume_kv_reuse = c->router_assume_kv_reuse;
    lc.track_prefill_tokens = c->router_track_prefill_tokens;
    lc.expiry_ms = c->router_request_expiry_ms;
    if (lc.check_interval_ms > lc.expiry_ms)
        lc.check_interval_ms = lc.expiry_ms;
    lc.max_requests = (uint32_t)(c->router_max_requests > KVR_LOAD_MAX_REQUESTS
                                     ? KVR_LOAD_MAX_REQUESTS
                                     : c->router_max_requests);
    if (c->router_replica_sync) /* peers' bookings get a budget of their own */
        lc.max_peer_requests = (uint32_t)(c->router_sync_max_peer_requests > KVR_LOAD_MAX_REQUESTS
                                              ? KVR_LOAD_MAX_REQUESTS
                                              : c->router_sync_max_peer_requests);
    if (c->router_replica_sync)
        lc.max_peer_blocks = c->router_sync_max_peer_blocks;
    lc.seed = c->seed;
    const char *field = NULL;
    int st;
    if (kvr_load_config_validate(&lc, &field) != KVR_OK ||
        (r->load = kvr_load_new(&lc, &st)) == NULL) {
        snprintf(err, err_len, "load tracker: %s", field ? field : "out of memory");
        return KVR_EINVAL;
    }
    return KVR_OK;
}

kvr_router_t *kvr_router_new(const kvr_router_config_t *cfg, kvr_index_t *ix, int *status,
                             char *err, size_t err_len)
{
    int dummy;
    char ebuf[8];
    if (status == NULL)
        status = &dummy;
    if (err == NULL) {
        err = ebuf;
        err_len = sizeof ebuf;
    }
    if (cfg == NULL) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_router_config_t rc_cfg = *cfg; /* the derived settings applied (config.h) */
    kvr_config_resolve(&rc_cfg, NULL, 0);
    if (kvr_config_validate(&rc_cfg, err, err_len) != KVR_OK) {
        *status = KVR_EINVAL;
        return NULL;
    }
    bool needs_index = kvr_config_uses_index(&rc_cfg);
    if (needs_index && ix == NULL) {
        snprintf(err, err_len, "router_mode: needs a prefix index");
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_router_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    r->cfg = rc_cfg;
    kvr_registry_init(&r->reg, rc_cfg.block_size);
    r->ix = needs_index ? ix : NULL; /* credit 0: overlaps are 0, as with no indexer */
    kvr_rng_seed(&r->rng, seed_of(cfg->seed));
    r->picker = kvr_policy_picker(rc_cfg.router_mode);
    assert((r->picker != NULL) ==
           (rc_cfg.router_mode != KVR_MODE_KV && rc_cfg.router_mode != KVR_MODE_APPROX));
    kvr_lookup_init(&r->lk);
    kvr_inflight_init(&r->watch);
    int rc = setup_select(r, err, err_len);
    if (rc == KVR_OK)
        rc = setup_load(r, err, err_len);
    if (rc == KVR_OK && r->cfg.router_mode == KVR_MODE_APPROX && r->ix != NULL) {
        kvr_approx_config_t ac = {.ttl_ms = (uint64_t)(cfg->router_ttl_secs * 1000.0),
                                  .max_tree_size =
                                      rc_cfg.router_max_tree_size < rc_cfg.index_max_pairs
                                          ? rc_cfg.router_max_tree_size
                                          : rc_cfg.index_max_pairs,
                                  .prune_target_ratio = rc_cfg.router_prune_target_ratio};
        int st;
        r->approx = kvr_approx_new(ix, &ac, &st);
        if (r->approx == NULL) {
            snprintf(err, err_len, "router_max_tree_size: the index budget is smaller");
            rc = st;
        }
    }
    if (rc == KVR_OK && rc_cfg.session_ttl_secs > 0) {
        kvr_sessions_config_t sc = {.ttl_ms = rc_cfg.session_ttl_secs * 1000,
                                    .max_sessions = (size_t)rc_cfg.session_max};
        r->sessions = kvr_sessions_new(&sc, &rc);
    }
    if (rc == KVR_OK)
        rc = kvr_registry_rebuild(&r->reg);
    if (rc != KVR_OK) {
        kvr_router_free(r);
        *status = rc;
        return NULL;
    }
    *status = KVR_OK;
    return r;
}

void kvr_router_free(kvr_router_t *r)
{
    if (r == NULL)
        return;
    kvr_registry_deinit(&r->reg);
    free(r->lbh);
    free(r->seq);
    kvr_lookup_deinit(&r->lk);
    kvr_inflight_deinit(&r->watch);
    kvr_approx_free(r->approx);
    kvr_overlay_free(r->ov);
    kvr_sessions_free(r->sessions);
    kvr_load_free(r->load);
    free(r->explain);
    free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Registry */

static int check_endpoints(const kvr_router_t *r, const kvr_worker_spec_t *w, char *err,
                           size_t err_len)
{
    kvr_endpoint_policy_t pol = {.ipc_dirs = r->cfg.allowed_ipc_dirs,
                                 .hosts = r->cfg.allowed_worker_hosts};
    char e[KVR_ADDR_BYTES + 160];
    int rc = KVR_OK;
    if (w->url[0] != '\0')
        rc = kvr_endpoint_check_url(w->url, &pol, e, sizeof e);
    if (rc == KVR_OK && w->events[0] != '\0')
        rc = kvr_endpoint_check_zmq("events", w->events, &pol, e, sizeof e);
    if (rc == KVR_OK && w->replay[0] != '\0')
        rc = kvr_endpoint_check_zmq("replay", w->replay, &pol, e, sizeof e);
    if (rc == KVR_OK && w->tokenizer[0] != '\0')
        rc = kvr_endpoint_check_dir("tokenizer", w->tokenizer, "allowed_tokenizer_dirs",
                                    r->cfg.allowed_tokenizer_dirs, e, sizeof e);
    if (rc != KVR_OK)
        snprintf(err, err_len, "worker %llu %s", (unsigned long long)w->worker_id, e);
    return rc;
}

int kvr_router_add_worker(kvr_router_t *r, const kvr_worker_spec_t *w, char *err, size_t err_len)
{
    char ebuf[8];
    if (err == NULL) {
        err = ebuf;
        err_len = sizeof ebuf;
    }
    int rc = kvr_worker_spec_validate(w, err, err_len);
    if (rc == KVR_OK)
        rc = check_endpoints(r, w, err, err_len);
    if (rc != KVR_OK)
        return rc;
    /* a fraction of the engine's batch budget needs the budget: vLLM and SGLang do not
     * publish it, and a guessed one would make the setting silently do nothing */
    if ((r->busy.has_prefill_frac || r->queue_busy.has_prefill_frac) &&
        w->max_num_batched_tokens == 0) {
        snprintf(err, err_len,
                 "worker %llu: max_num_batched_tokens= is required with %s (the threshold is a "
                 "fraction of the engine's --max-num-batched-tokens)",
                 (unsigned long long)w->worker_id,
                 r->queue_busy.has_prefill_frac ? "router_queue_threshold"
                                                : "active_prefill_tokens_threshold_frac");
        return KVR_EINVAL;
    }
    if (kvr_registry_find(&r->reg, w->worker_id) >= 0) {
        snprintf(err, err_len, "worker %llu already registered", (unsigned long long)w->worker_id);
        return KVR_EEXIST;
    }
    if ((rc = kvr_registry_check_pool(&r->reg, w, err, err_len)) != KVR_OK)
        return rc;
    if (r->reg.n_ranks + w->dp_size > r->cfg.max_workers) {
        snprintf(err, err_len, "max_workers: %u ranks already registered", r->cfg.max_workers);
        return KVR_EFULL;
    }
    /* its cache size first, so that a failure leaves nothing registered (a bound on a rank
     * with no decisions recorded is harmless if a later step fails) */
    for (uint32_t d = 0; r->approx != NULL && w->total_kv_blocks > 0 && d < w->dp_size; d++)
        if (kvr_approx_set_capacity(r->approx, (kvr_worker_t){w->worker_id, w->dp_start + d},
                                    w->total_kv_blocks) != KVR_OK)
            return KVR_ENOMEM;
    return kvr_registry_add(&r->reg, w);
}

int kvr_router_remove_worker(kvr_router_t *r, uint64_t worker_id)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    if (i < 0)
        return KVR_ENOTFOUND;
    int rc = kvr_registry_remove(&r->reg, (size_t)i);
    size_t dropped = 0;
    (void)kvr_load_remove_worker(r->load, worker_id, &dropped);
    if (r->approx != NULL)
        (void)kvr_approx_remove_worker(r->approx, worker_id);
    if (r->ov != NULL)
        kvr_overlay_remove_worker(r->ov, worker_id);
    kvr_inflight_forget(&r->watch, worker_id);
    return rc;
}

const kvr_worker_spec_t *kvr_router_worker(const kvr_router_t *r, uint64_t worker_id)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    return i < 0 ? NULL : &r->reg.w[i].spec;
}

size_t kvr_router_worker_ids(const kvr_router_t *r, uint64_t *ids, size_t cap)
{
    for (size_t i = 0; i < r->reg.n_w && i < cap; i++)
        ids[i] = r->reg.w[i].spec.worker_id;
    return r->reg.n_w;
}

int kvr_router_set_fenced(kvr_router_t *r, uint64_t worker_id, bool fenced)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    if (i < 0)
        return KVR_ENOTFOUND;
    r->reg.w[i].fenced = fenced;
    return KVR_OK;
}

int kvr_router_set_capacity(kvr_router_t *r, uint64_t worker_id, uint64_t blocks)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    if (i < 0)
        return KVR_ENOTFOUND;
    if (blocks == 0)
        return KVR_EINVAL;
    kvr_worker_spec_t *w = &r->reg.w[i].spec;
    for (uint32_t d = 0; r->approx != NULL && d < w->dp_size; d++)
        if (kvr_approx_set_capacity(r->approx, (kvr_worker_t){w->worker_id, w->dp_start + d},
                                    blocks) != KVR_OK)
            return KVR_ENOMEM;
    for (uint32_t d = 0; r->ov != NULL && d < w->dp_size; d++)
        kvr_overlay_set_capacity(r->ov, (kvr_worker_t){w->worker_id, w->dp_start + d}, blocks);
    w->total_kv_blocks = blocks;
    return KVR_OK;
}

bool kvr_router_fenced(const kvr_router_t *r, uint64_t worker_id)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    return i >= 0 && r->reg.w[i].fenced;
}

void kvr_router_session_stats(const kvr_router_t *r, kvr_session_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (r->sessions != NULL)
        kvr_sessions_stats(r->sessions, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Model pools: which workers serve a request, and how its prompt is hashed */

int kvr_router_set_learned_loras(kvr_router_t *r, uint64_t worker_id, const char *loras)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    if (i < 0)
        return KVR_ENOTFOUND;
    kvr_registry_set_learned(&r->reg, (size_t)i, loras);
    return KVR_OK;
}

const char *kvr_router_learned_loras(const kvr_router_t *r, uint64_t worker_id)
{
    long i = kvr_registry_find(&r->reg, worker_id);
    return i < 0 ? "" : r->reg.w[i].learned;
}

bool kvr_router_is_adapter(const kvr_router_t *r, const char *name, size_t len)
{
    return kvr_registry_is_adapter(&r->reg, name, len);
}

void kvr_route_req_prefill_leg(kvr_route_req_t *q)
{
    q->pool = KVR_POOL_PREFILL;
    q->no_active_blocks = true;
    q->session_id = NULL;
    q->session_id_len = 0;
    q->session_close = false;
}

void kvr_route_req_decode_leg(kvr_route_req_t *q)
{
    static const kvr_select_override_t decode = {.has_overlap_score_credit = true,
                                                 .overlap_score_credit = 0.0};
    q->pool = KVR_POOL_SERVE;
    q->ovr = &decode;
    q->has_assume_kv_reuse = true;
    q->assume_kv_reuse = false;
    q->has_track_prefill_tokens = true;
    q->track_prefill_tokens = false;
}

kvr_disagg_bypass_t kvr_router_disagg_bypass(kvr_router_t *r, const kvr_route_req_t *q,
                                             uint64_t now_ms)
{
    kvr_disagg_policy_t pol = r->cfg.disagg_policy;
    if (pol == KVR_DISAGG_ALWAYS)
        return KVR_BYPASS_NONE;
    kvr_route_req_t look = *q;
    look.update_state = false;
    look.request_id = NULL;
    look.request_id_len = 0;
    look.pool = KVR_POOL_SERVE;
    kvr_route_res_t res;
    if ((pol == KVR_DISAGG_ISL || pol == KVR_DISAGG_ISL_OR_LOAD) &&
        kvr_router_route(r, &look, now_ms, &res) == KVR_OK) {
        uint64_t n = q->n_tokens, eff = n > res.cached_tokens ? n - res.cached_tokens : 0;
        if (eff < r->cfg.disagg_isl_threshold && (double)eff < 0.7 * (double)n)
            return KVR_BYPASS_ISL;
    }
    if (pol == KVR_DISAGG_LOAD || pol == KVR_DISAGG_ISL_OR_LOAD) {
        kvr_route_req_t pf = look;
        kvr_route_req_prefill_leg(&pf);
        int rc = kvr_router_route(r, &pf, now_ms, &res);
        if (rc == KVR_EBUSY)
            return KVR_BYPASS_LOAD;
        if (rc == KVR_OK && r->cfg.disagg_load_threshold.set) {
            kvr_load_snapshot_t ls;
            kvr_load_snapshot(r->load, res.worker, &ls);
            /* busy, and a decode worker can take it (the serving pool's look succeeds) */
            if ((double)ls.active_prefill_tokens >= r->cfg.disagg_load_threshold.v &&
                kvr_router_route(r, &look, now_ms, &res) == KVR_OK)
                return KVR_BYPASS_LOAD;
        }
    }
    return KVR_BYPASS_NONE;
}

size_t kvr_router_n_blocks(const kvr_router_t *r, const kvr_route_req_t *q)
{
    kvr_pool_hash_t p = kvr_registry_pool_of(&r->reg, q);
    return kvr_hash_n_blocks(q->n_tokens, p.bs, p.eagle);
}

kvr_disagg_state_t kvr_router_disagg_state(const kvr_router_t *r)
{
    if (r->reg.n_prefill > 0 && kvr_router_n_role(r, KVR_ROLE_PREFILL, true) > 0)
        return KVR_DISAGG_ACTIVE;
    return r->reg.prefill_seen ? KVR_DISAGG_UNAVAILABLE : KVR_DISAGG_PENDING;
}

size_t kvr_router_n_role(const kvr_router_t *r, kvr_worker_role_t role, bool ready_only)
{
    return kvr_registry_n_role(&r->reg, role, ready_only);
}

size_t kvr_router_n_ready(const kvr_router_t *r) { return kvr_registry_n_ready(&r->reg); }

int kvr_router_set_rank_status(kvr_router_t *r, kvr_worker_t w, const kvr_rank_status_t *st)
{
    kvr_rank_status_t *rs = kvr_registry_rank_status(&r->reg, w);
    if (rs == NULL)
        return KVR_ENOTFOUND;
    *rs = *st;
    return KVR_OK;
}

int kvr_router_rank_status(const kvr_router_t *r, kvr_worker_t w, kvr_rank_status_t *out)
{
    const kvr_rank_status_t *rs = kvr_registry_rank_status(&r->reg, w);
    if (rs == NULL)
        return KVR_ENOTFOUND;
    *out = *rs;
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Per-request work */

/* Both hashing scratch arrays hold n; cap_blocks is what both hold (kvr_grow leaves an
 * array as it was when it cannot grow it). */
static int reserve_hash_scratch(kvr_router_t *r, size_t n)
{
    size_t ca = r->cap_blocks, cb = r->cap_blocks;
    int rc = kvr_grow((void **)&r->lbh, &ca, n, SIZE_MAX, sizeof *r->lbh);
    if (rc == KVR_OK)
        rc = kvr_grow((void **)&r->seq, &cb, n, SIZE_MAX, sizeof *r->seq);
    r->cap_blocks = ca < cb ? ca : cb;
    return rc;
}

static long hash_into(const kvr_route_req_t *q, const kvr_pool_hash_t *p, uint64_t *lbh, uint64_t *seq,
                      size_t cap)
{
    kvr_hash_opts_t o = {.lora_name = p->lora,
                         .lora_name_len = p->lora_len,
                         .cache_namespace = q->cache_namespace,
                         .cache_namespace_len = q->cache_namespace_len,
                         .is_eagle = p->eagle,
                         .mm = q->mm,
                         .n_mm = q->n_mm};
    return kvr_hash_prompt(q->tokens, q->n_tokens, p->bs, &o, lbh, seq, cap);
}

/* Points r->cur_lbh / r->cur_seq at the prompt's hashes (the request's own when it brings
 * them, else hashed into the scratch); returns the block count or a status. */
static long hash_prompt(kvr_router_t *r, const kvr_route_req_t *q)
{
    size_t n = kvr_hash_n_blocks(q->n_tokens, r->cur.bs, r->cur.eagle); /* resolve_pool's */
    /* hashes made before the model's settings were known (a request queued while no
     * worker was registered) are remade from the tokens */
    if (q->hashed && (q->n_hashed == n || q->tokens == NULL)) {
        if (q->n_hashed != n || (n > 0 && (q->block_hashes == NULL || q->seq_hashes == NULL)))
            return KVR_EINVAL;
        r->cur_lbh = q->block_hashes;
        r->cur_seq = q->seq_hashes;
        return (long)n;
    }
    if (q->n_tokens > 0 && q->tokens == NULL)
        return KVR_EINVAL;
    if (n == 0) {
        r->cur_lbh = r->cur_seq = NULL; /* shorter than a block: nothing to hash */
        return 0;
    }
    int rc = reserve_hash_scratch(r, n);
    if (rc != KVR_OK)
        return rc;
    r->cur_lbh = r->lbh; /* after the growth: it may have moved them */
    r->cur_seq = r->seq;
    return hash_into(q, &r->cur, r->lbh, r->seq, r->cap_blocks);
}

long kvr_router_hash(const kvr_router_t *r, const kvr_route_req_t *q, uint64_t *block_hashes,
                     uint64_t *seq_hashes, size_t cap)
{
    if (q->n_tokens > 0 && q->tokens == NULL)
        return KVR_EINVAL;
    kvr_pool_hash_t p = kvr_registry_pool_of(&r->reg, q);
    return hash_into(q, &p, block_hashes, seq_hashes, cap);
}

/* Writes matches' tiers into the candidates of the ranks they name. */
static void apply_matches(kvr_router_t *r, const kvr_match_t *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        long k = kvr_registry_rank(&r->reg, m[i].worker);
        if (k < 0)
            continue; /* a rank the registry no longer has */
        r->reg.cands[k].device_blocks = m[i].device_blocks;
        r->reg.cands[k].host_blocks = m[i].host_blocks;
        r->reg.cands[k].disk_blocks = m[i].disk_blocks;
    }
}

/* The ranks routed approximately: their overlap is what the overlay recorded of the router's
 * own decisions, not what their events say (r->lk keeps that, for events_cached_tokens). */
static int overlay_overlap(kvr_router_t *r, size_t n_blocks)
{
    for (size_t i = 0; i < kvr_overlay_n(r->ov); i++) {
        long k = kvr_registry_rank(&r->reg, kvr_overlay_rank(r->ov, i));
        if (k >= 0)
            r->reg.cands[k].device_blocks = r->reg.cands[k].host_blocks =
                r->reg.cands[k].disk_blocks = 0;
    }
    int rc;
    const kvr_lookup_t *lk = kvr_overlay_lookup(r->ov, r->cur_seq, n_blocks, &rc);
    if (lk == NULL)
        return rc;
    for (size_t i = 0; i < lk->n_matches; i++) {
        long k = kvr_overlay_has(r->ov, lk->matches[i].worker)
                     ? kvr_registry_rank(&r->reg, lk->matches[i].worker)
                     : -1;
        if (k >= 0)
            r->reg.cands[k].device_blocks = lk->matches[i].device_blocks;
    }
    return KVR_OK;
}

/* Looks the prompt up (or takes the request's own matches) and writes each rank's tiers into
 * cands. */
static int fill_overlap(kvr_router_t *r, const kvr_route_req_t *q, size_t n_blocks,
                        bool read_index)
{
    for (size_t i = 0; i < r->reg.n_ranks; i++) {
        kvr_select_candidate_t *c = &r->reg.cands[i];
        c->device_blocks = c->host_blocks = c->disk_blocks = c->shared_blocks = 0;
        c->fenced = r->reg.w[r->reg.rank_widx[i]].fenced;
        c->unfit = !r->reg.all_fit && !r->reg.wfit[r->reg.rank_widx[i]];
    }
    if (n_blocks == 0 || !read_index)
        return KVR_OK;
    if (q->has_matches) {
        apply_matches(r, q->matches, q->n_matches);
        return KVR_OK;
    }
    if (r->ix == NULL)
        return KVR_OK;
    int rc = kvr_index_lookup(r->ix, r->cur_seq, n_blocks, &r->lk);
    if (rc != KVR_OK)
        return rc;
    apply_matches(r, r->lk.matches, r->lk.n_matches);
    return r->ov != NULL && kvr_overlay_n(r->ov) > 0 ? overlay_overlap(r, n_blocks) : KVR_OK;
}

static uint64_t tokens_of_tiers(const kvr_router_t *r, uint32_t device, uint32_t host,
                                uint32_t disk)
{
    double eff = device + r->sel.host_cache_hit_weight * host +
                 r->sel.disk_cache_hit_weight * disk;
    return (uint64_t)llround(eff * r->cur.bs);
}

static uint64_t cached_tokens_of(const kvr_router_t *r, const kvr_select_candidate_t *c)
{
    return tokens_of_tiers(r, c->device_blocks, c->host_blocks, c->disk_blocks);
}

/* What w's KV events say it holds of the prompt just looked up (r->lk), for a rank routed
 * approximately. */
static uint64_t events_cached_tokens(const kvr_router_t *r, kvr_worker_t w)
{
    for (size_t i = 0; i < r->lk.n_matches; i++) {
        const kvr_match_t *m = &r->lk.matches[i];
        if (m->worker.worker_id == w.worker_id && m->worker.dp_rank == w.dp_rank)
            return tokens_of_tiers(r, m->device_blocks, m->host_blocks, m->disk_blocks);
    }
    return 0;
}

/* A request's override of a load setting (kvr_load_opt_t). */
static kvr_load_opt_t load_opt(bool has, bool on)
{
    return !has ? KVR_LOAD_CONFIG : on ? KVR_LOAD_ON : KVR_LOAD_OFF;
}

/* A model's run-time override of the busy thresholds, or NULL. */
static kvr_busy_thresholds_t *busy_override(kvr_router_t *r, const char *model)
{
    for (size_t i = 0; i < r->n_busy_models; i++)
        if (strcmp(r->busy_by_model[i].model, model) == 0)
            return &r->busy_by_model[i].th;
    return NULL;
}

/* The busy thresholds of a worker serving model: its run-time override, else the settings'. */
static const kvr_busy_thresholds_t *busy_of(kvr_router_t *r, const char *model)
{
    const kvr_busy_thresholds_t *t = r->n_busy_models > 0 ? busy_override(r, model) : NULL;
    return t != NULL ? t : &r->busy;
}

static void threshold_out(const kvr_busy_thresholds_t *t, kvr_busy_threshold_t *out)
{
    *out = (kvr_busy_threshold_t){.has_prefill_tokens = t->has_prefill_tokens,
                                  .prefill_tokens = (double)t->prefill_tokens,
                                  .has_decode_frac = t->has_decode_frac,
                                  .decode_frac = t->decode_frac};
}

static bool nonneg(double v) { return isfinite(v) && v >= 0; }

int kvr_router_busy_threshold(kvr_router_t *r, const char *model, size_t model_len,
                              const kvr_busy_threshold_t *set, kvr_busy_threshold_t *now)
{
    if (model_len >= KVR_MODEL_BYTES || (model_len > 0 && model == NULL))
        return KVR_EINVAL;
    char name[KVR_MODEL_BYTES];
    memcpy(name, model != NULL ? model : "", model_len);
    name[model_len] = '\0';
    bool change = set != NULL && (set->has_prefill_tokens || set->has_decode_frac);
    if (change && ((set->has_prefill_tokens && !nonneg(set->prefill_tokens)) ||
                   (set->has_decode_frac && !nonneg(set->decode_frac))))
        return KVR_EINVAL;
    kvr_busy_thresholds_t *t = busy_override(r, name);
    if (change && t == NULL) {
        if (r->n_busy_models == KVR_BUSY_MAX_MODELS)
            return KVR_EFULL;
        size_t k = r->n_busy_models++;
        memcpy(r->busy_by_model[k].model, name, model_len + 1);
        r->busy_by_model[k].th = r->busy;
        t = &r->busy_by_model[k].th;
    }
    if (change && set->has_prefill_tokens) {
        t->has_prefill_tokens = true;
        t->prefill_tokens = (uint64_t)set->prefill_tokens;
    }
    if (change && set->has_decode_frac) {
        t->has_decode_frac = true;
        t->decode_frac = set->decode_frac;
    }
    const kvr_busy_thresholds_t *cur = t != NULL ? t : &r->busy;
    if (now != NULL)
        threshold_out(cur, now);
    return KVR_OK;
}

size_t kvr_router_busy_models(const kvr_router_t *r, const char **models,
                              kvr_busy_threshold_t *th, size_t cap)
{
    for (size_t i = 0; i < r->n_busy_models && i < cap; i++) {
        models[i] = r->busy_by_model[i].model;
        threshold_out(&r->busy_by_model[i].th, &th[i]);
    }
    return r->n_busy_models;
}

/* The prompt blocks past what rank c's events report (every tier) that requests in flight on
 * it hold (p->overlap_blocks: the tracker's longest prefix of this prompt among its live
 * requests): being computed now, or computed and not reported yet. A live request's blocks
 * are its engine's until it ends (never evicted while it runs), so the credit lasts as long
 * as the booking and stops counting each block the moment the events report it (it is then
 * in device_blocks). */
static uint32_t inflight_blocks(const kvr_select_candidate_t *c, const kvr_load_projection_t *p)
{
    uint64_t reported = (uint64_t)c->device_blocks + c->host_blocks + c->disk_blocks;
    return p->overlap_blocks > reported ? (uint32_t)(p->overlap_blocks - reported) : 0;
}

/* Of the blocks held in flight on rank k (inflight_blocks), those this prompt finds cached
 * when the rank's engine admits it. The live booking that first held them (the block's tag:
 * the low 32 bits of the rank's stream position of that booking's prompt token 0,
 * core/stepclock.h) computes them in booking order, a chunk a step; this request is admitted
 * in the step its own place in the stream reaches, and finds cached only what the steps
 * before that one computed: a block computed in that same step is computed by this request
 * again (an engine matches its prefix cache only when it admits a request). So a burst on a
 * new prefix arriving before the booking computing it has begun gets nothing (it would be
 * batched with it); arriving while its last chunk is under way, all of it; a long prefix
 * being computed a chunk a step, what the chunks before its own step hold. The positions
 * compare modulo 2^32 (a booking 2^31 tokens back reads as not begun: no credit). */
static uint32_t inflight_ready(kvr_router_t *r, size_t k, const kvr_select_candidate_t *c,
                               const kvr_load_projection_t *p)
{
    uint32_t held = inflight_blocks(c, p);
    if (held == 0)
        return 0;
    uint64_t reported = (uint64_t)c->device_blocks + c->host_blocks + c->disk_blocks;
    uint32_t tag;
    if (kvr_load_block_tag(r->load, c->worker, r->cur_seq[reported], &tag) != KVR_OK)
        return held; /* cannot happen: the tracker holds the prefix it reported */
    uint64_t before =
        kvr_stepclock_computed_before(kvr_registry_clock(&r->reg, k), p->active_requests > 0);
    int32_t computed = (int32_t)((uint32_t)before - tag); /* its prompt tokens by then */
    uint64_t lo = reported * r->cur.bs, hi = (reported + held) * r->cur.bs;
    if (computed <= 0 || (uint64_t)computed <= lo)
        return 0;
    uint64_t got = (uint64_t)computed < hi ? (uint64_t)computed : hi;
    return (uint32_t)((got - lo) / r->cur.bs);
}

/* Projects every rank's load with this prompt and marks busy ranks. */
static int fill_loads(kvr_router_t *r, const kvr_route_req_t *rq, size_t n_blocks, uint64_t isl,
                      bool read_index)
{
    for (size_t i = 0; i < r->reg.n_ranks; i++) {
        r->reg.proj[i].worker = r->reg.cands[i].worker;
        r->reg.proj[i].cached_tokens = cached_tokens_of(r, &r->reg.cands[i]);
    }
    bool track = r->cfg.router_track_active_blocks && !rq->no_active_blocks;
    kvr_load_query_t q = {.seq = track ? r->cur_seq : NULL,
                          .n_seq = track ? n_blocks : 0,
                          .isl_tokens = isl,
                          .assume_kv_reuse =
                              load_opt(rq->has_assume_kv_reuse, rq->assume_kv_reuse)};
    int rc = kvr_load_project(r->load, &q, r->reg.proj, r->reg.n_ranks);
    if (rc != KVR_OK)
        return rc;
    for (size_t i = 0; i < r->reg.n_ranks; i++) {
        kvr_select_candidate_t *c = &r->reg.cands[i];
        const kvr_load_projection_t *p = &r->reg.proj[i];
        const kvr_worker_spec_t *s = &r->reg.w[r->reg.rank_widx[i]].spec;
        c->active_prefill_tokens = p->active_prefill_tokens;
        c->potential_prefill_tokens = p->potential_prefill_tokens;
        /* no index (overlap_score_credit 0, load-only modes): nothing is credited as cached,
         * in flight or not */
        c->predicted_blocks = read_index && r->ix != NULL ? inflight_ready(r, i, c, p) : 0;
        if (c->predicted_blocks > 0) { /* the credited blocks are not prefilled again */
            uint64_t left = p->potential_prefill_tokens - p->active_prefill_tokens;
            uint64_t credit = (uint64_t)llround(r->sel.inflight_credit_weight *
                                                c->predicted_blocks * r->cur.bs);
            c->potential_prefill_tokens -= credit < left ? credit : left;
        }
        c->potential_decode_blocks = p->potential_decode_blocks;
        c->capacity_blocks = s->total_kv_blocks;
        c->active_requests = p->active_requests;
        c->has_load = true;
        kvr_busy_load_t bl = {.active_prefill_tokens = p->active_prefill_tokens,
                              .max_num_batched_tokens = s->max_num_batched_tokens,
                              .used_blocks = p->active_blocks,
                              .total_kv_blocks = s->total_kv_blocks};
        c->busy = kvr_busy(busy_of(r, s->model), &bl);
        c->queue_busy = kvr_busy(&r->queue_busy, &bl);
    }
    return KVR_OK;
}

/* The time each busy rank's running engine step has left (an idle rank starts at once).
 * Only the locality cost reads it, and only with a weight: otherwise the field keeps the 0 of
 * rebuild_ranks (the policy and weight are fixed for the router's life). */
static void fill_step_waits(kvr_router_t *r, uint64_t now_us)
{
    if (!kvr_policy_scorer(r->sel.policy)->uses_step_wait || r->sel.step_wait_weight == 0)
        return;
    for (size_t k = 0; k < r->reg.n_ranks; k++) {
        kvr_select_candidate_t *c = &r->reg.cands[k];
        c->step_wait_ms =
            c->active_requests > 0 ? kvr_stepclock_wait_ms(kvr_registry_clock(&r->reg, k), now_us) : 0.0;
    }
}

int kvr_router_worker_step(kvr_router_t *r, kvr_worker_t w, uint64_t now_us)
{
    long k = kvr_registry_rank(&r->reg, w);
    if (k < 0)
        return KVR_ENOTFOUND;
    kvr_stepclock_end(kvr_registry_clock(&r->reg, (size_t)k), now_us);
    return KVR_OK;
}

int kvr_router_worker_token(kvr_router_t *r, kvr_worker_t w, uint64_t *seen, uint64_t now_us)
{
    long k = kvr_registry_rank(&r->reg, w);
    if (k < 0)
        return KVR_ENOTFOUND;
    kvr_stepclock_token(kvr_registry_clock(&r->reg, (size_t)k), seen, now_us);
    return KVR_OK;
}

int kvr_router_step_model(const kvr_router_t *r, kvr_worker_t w, kvr_step_model_t *out)
{
    long k = kvr_registry_rank(&r->reg, w);
    if (k < 0)
        return KVR_ENOTFOUND;
    const kvr_stepclock_t *c = kvr_registry_clock(&r->reg, (size_t)k);
    double slope = 0;
    *out = (kvr_step_model_t){.steps = c->steps,
                              .mean_ms = c->mean_us / 1000.0,
                              .decode_steps = c->decode_steps,
                              .decode_ms = c->decode_us / 1000.0,
                              .prefill_steps = c->prefill_steps,
                              .has_slope = kvr_stepclock_slope(c, &slope)};
    out->prefill_ms_per_1k = out->has_slope ? slope : 0; /* us per token = ms per 1,000 */
    return KVR_OK;
}

static bool sorted_contains(const uint64_t *a, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && a[lo] == x;
}

static bool has_taints(const kvr_select_candidate_t *c, const kvr_route_req_t *q)
{
    for (size_t i = 0; i < q->n_required; i++) {
        bool found = false;
        for (size_t t = 0; t < c->n_taints && !found; t++)
            found = strcmp(c->taints[t], q->required_taints[i]) == 0;
        if (!found)
            return false;
    }
    return true;
}

/* A load-only picker's filters (the selector's, without costs): alive, serving the request's
 * model, carrying its taints, allowed, the pinned rank if any. Busy is the caller's test. */
typedef struct pick_ctx {
    const kvr_router_t *r;
    const kvr_route_req_t *q;
} pick_ctx_t;

static bool excluded(const kvr_route_req_t *q, uint64_t id)
{
    for (size_t i = 0; i < q->n_exclude; i++)
        if (q->exclude_ids[i] == id)
            return true;
    return false;
}

static bool passes_filters(const kvr_router_t *r, const kvr_route_req_t *q, size_t i)
{
    const kvr_select_candidate_t *c = &r->reg.cands[i];
    return !c->fenced && !c->unfit && has_taints(c, q) &&
           (!q->has_allowed ||
            sorted_contains(q->allowed_ids, q->n_allowed, c->worker.worker_id)) &&
           !excluded(q, c->worker.worker_id);
}

static bool pick_eligible(const void *ctx, size_t i)
{
    const pick_ctx_t *x = ctx;
    const kvr_select_candidate_t *c = &x->r->reg.cands[i];
    return passes_filters(x->r, x->q, i) && !c->busy &&
           (!x->q->has_pinned || (c->worker.worker_id == x->q->pinned.worker_id &&
                                  c->worker.dp_rank == x->q->pinned.dp_rank));
}

/* The preferred rank's index when it may be taken (eligible, not busy, nothing pinned). */
static size_t preferred_index(const kvr_router_t *r, const kvr_route_req_t *q,
                              const kvr_worker_t *pref, size_t best)
{
    for (size_t i = 0; pref != NULL && i < r->reg.n_ranks; i++) {
        const kvr_select_candidate_t *c = &r->reg.cands[i];
        if (c->worker.worker_id == pref->worker_id && c->worker.dp_rank == pref->dp_rank &&
            passes_filters(r, q, i) && !c->busy && !q->has_pinned)
            best = i;
    }
    return best;
}

/* The load-only modes (r->picker): the same filters as the selector's, then the picker's
 * choice among the eligible ranks; a preferred rank (a session's) is taken when it passes them
 * and is not busy. */
static int pick_simple(kvr_router_t *r, const kvr_route_req_t *q, const kvr_worker_t *pref,
                       kvr_select_result_t *out)
{
    pick_ctx_t x = {r, q};
    size_t n_ok = 0, n_busy = 0, n_qbusy = 0;
    for (size_t i = 0; i < r->reg.n_ranks; i++) {
        const kvr_select_candidate_t *c = &r->reg.cands[i];
        bool pinned_ok = !q->has_pinned || (c->worker.worker_id == q->pinned.worker_id &&
                                            c->worker.dp_rank == q->pinned.dp_rank);
        if (!passes_filters(r, q, i) || !pinned_ok)
            continue;
        if (c->busy) {
            n_busy++;
            continue;
        }
        n_ok++;
        n_qbusy += c->queue_busy;
    }
    kvr_pick_view_t v = {.cands = r->reg.cands,
                         .n_cands = r->reg.n_ranks,
                         .n_eligible = n_ok,
                         .eligible = pick_eligible,
                         .ctx = &x,
                         .rng = &r->rng,
                         .turn = r->rr};
    size_t best = r->picker->pick(&v); /* always called: the random picker draws once */
    assert(best == SIZE_MAX || pick_eligible(&x, best));
    out->n_eligible = n_ok;
    out->n_busy = n_busy;
    out->n_queue_busy = n_qbusy;
    if (n_ok > 0 && n_qbusy == n_ok)
        return KVR_EBUSY; /* the queue: wait while every eligible rank is over its threshold */
    best = preferred_index(r, q, pref, best);
    if (best == SIZE_MAX)
        return n_busy > 0 ? KVR_EBUSY : KVR_ENOWORKER;
    r->rr++;
    out->index = best;
    out->worker = r->reg.cands[best].worker;
    out->cached_tokens = 0;
    out->effective_overlap_blocks = 0;
    return KVR_OK;
}

/* The rank q's session is bound to, if any (NULL: none). */
static const kvr_worker_t *session_rank(const kvr_router_t *r, const kvr_route_req_t *q,
                                        uint64_t now_ms, kvr_worker_t *buf)
{
    if (r->sessions == NULL || q->session_id == NULL || q->session_id_len == 0)
        return NULL;
    return kvr_sessions_lookup(r->sessions, q->session_id, q->session_id_len, now_ms, buf) ? buf
                                                                                           : NULL;
}

/* Direct mode: a request must name its worker (pinned, or an allowed list of one). */
static bool names_worker(const kvr_route_req_t *q)
{
    return q->has_pinned || (q->has_allowed && q->n_allowed == 1);
}

static int decide(kvr_router_t *r, const kvr_route_req_t *q, uint64_t now_ms,
                  kvr_select_result_t *out)
{
    if (r->cfg.router_mode == KVR_MODE_DIRECT && !names_worker(q)) {
        out->field = "router_mode direct: the request names no worker (pinned_worker in "
                     "/v1/route; x-worker-instance-id or nvext.backend_instance_id through the "
                     "front end, and x-prefill-instance-id or nvext.prefill_worker_id for a "
                     "disaggregated request's prefill)";
        return KVR_EINVAL;
    }
    kvr_worker_t buf;
    const kvr_worker_t *pref = session_rank(r, q, now_ms, &buf);
    if (r->picker != NULL)
        return pick_simple(r, q, pref, out);
    kvr_select_request_t sr = {
        .isl_tokens = q->n_tokens,
        .request_blocks = 0,
        .block_size = r->cur.bs,
        .track_prefill_tokens = q->has_track_prefill_tokens ? q->track_prefill_tokens
                                                            : r->cfg.router_track_prefill_tokens,
        .has_pinned = q->has_pinned,
        .pinned = q->pinned,
        .has_allowed = q->has_allowed,
        .allowed_ids = q->allowed_ids,
        .n_allowed = q->n_allowed,
        .exclude_ids = q->exclude_ids,
        .n_exclude = q->n_exclude,
        .required_taints = q->required_taints,
        .n_required = q->n_required,
        .preferred_taints = q->preferred_taints,
        .n_preferred = q->n_preferred,
        .has_preferred = pref != NULL,
        .preferred = pref != NULL ? *pref : (kvr_worker_t){0, 0},
        .ovr = q->ovr,
        .cands = r->reg.cands,
        .n_cands = r->reg.n_ranks,
    };
    kvr_select_explain_t *ex = NULL;
    r->n_explain = 0;
    if (r->explain_on && r->reg.n_ranks > 0) {
        if (r->cap_explain < r->reg.n_ranks) { /* only while explaining, as the fleet grows */
            kvr_select_explain_t *e = realloc(r->explain, r->reg.n_ranks * sizeof *e);
            if (e != NULL) {
                r->explain = e;
                r->cap_explain = r->reg.n_ranks;
            }
        }
        ex = r->cap_explain >= r->reg.n_ranks ? r->explain : NULL;
    }
    int rc = kvr_select(&r->sel, &sr, &r->rng, out, ex);
    if (ex != NULL)
        r->n_explain = r->reg.n_ranks;
    return rc;
}

void kvr_router_set_explain(kvr_router_t *r, bool on)
{
    r->explain_on = on;
    r->n_explain = 0;
}

size_t kvr_router_last_explain(const kvr_router_t *r, kvr_rank_explain_t *out, size_t cap)
{
    for (size_t i = 0; i < r->n_explain && i < cap; i++) {
        const kvr_select_explain_t *e = &r->explain[i];
        out[i] = (kvr_rank_explain_t){.worker = r->reg.cands[i].worker,
                                      .why = kvr_select_why_name(e->why),
                                      .overlap_blocks = e->effective_overlap_blocks,
                                      .prefill_blocks = e->adjusted_prefill_blocks,
                                      .decode_blocks = e->decode_cost_blocks,
                                      .step_wait_blocks = e->step_wait_blocks,
                                      .memory_blocks = e->memory_blocks,
                                      .cost = e->cost};
    }
    return r->n_explain;
}

/* "kvr-" and 128 random bits in hex: an id the router hands out cannot be guessed, so a
 * client cannot free or mark another client's booking through the lifecycle calls. One
 * getrandom(2) call (the kernel's CSPRNG; ~0.3 us, no allocation). */
static int new_request_id(char *out, size_t cap, size_t *len)
{
    uint64_t b[2];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        return KVR_EIO;
    *len = (size_t)snprintf(out, cap, "kvr-%016llx%016llx", (unsigned long long)b[0],
                            (unsigned long long)b[1]);
    return KVR_OK;
}

/* A booking's place in its rank's prefill stream (core/stepclock.h): its uncached prompt
 * tokens take the next positions. tag (the low 32 bits of the position of its prompt's token
 * 0) goes on the blocks it is the first to hold, end on the booking (its first token proves
 * the stream computed up to there). */
typedef struct stream {
    kvr_stepclock_t *clock;
    uint64_t tokens, end;
    uint32_t tag, chunk;
    bool idle; /* the rank had nothing in flight */
} stream_t;

static stream_t stream_place(kvr_router_t *r, size_t k, uint64_t isl, uint64_t cached,
                             kvr_load_opt_t prefill, bool idle)
{
    const kvr_worker_spec_t *s = &r->reg.w[r->reg.rank_widx[k]].spec;
    stream_t at = {.clock = kvr_registry_clock(&r->reg, k), .idle = idle};
    if (prefill == KVR_LOAD_OFF ||
        (prefill == KVR_LOAD_CONFIG && !r->cfg.router_track_prefill_tokens))
        isl = cached = 0; /* its prompt is not prefilled there (a decode leg: its KV arrives) */
    uint64_t chunk = s->max_num_batched_tokens;
    at.chunk = chunk == 0           ? KVR_STEPCLOCK_DEFAULT_CHUNK
               : chunk > UINT32_MAX ? UINT32_MAX
                                    : (uint32_t)chunk;
    cached = cached < isl ? cached : isl;
    at.tokens = isl - cached;
    at.tag = (uint32_t)(at.clock->booked - cached);
    at.end = at.clock->booked + at.tokens;
    return at;
}

/* A request's first token: its rank's stream is computed up to its end. */
static void stream_prefilled(kvr_router_t *r, const char *id, size_t id_len, kvr_req_handle_t h)
{
    kvr_worker_t w;
    uint64_t end;
    if (kvr_load_mark(r->load, id, id_len, h, &w, &end) != KVR_OK)
        return;
    long k = kvr_registry_rank(&r->reg, w);
    if (k >= 0)
        kvr_stepclock_prefilled(kvr_registry_clock(&r->reg, (size_t)k), end);
}

static int book(kvr_router_t *r, const kvr_route_req_t *q, size_t n_blocks, uint64_t now_ms,
                const stream_t *at, kvr_route_res_t *res)
{
    size_t id_len = q->request_id_len;
    if (q->request_id != NULL) {
        if (id_len == 0 || id_len > KVR_LOAD_MAX_ID_BYTES) {
            res->error_field = "request_id: must be 1 to 256 bytes";
            return KVR_EINVAL;
        }
        memcpy(res->request_id, q->request_id, id_len);
        res->request_id[id_len] = '\0';
    } else {
        int rc = new_request_id(res->request_id, sizeof res->request_id, &id_len);
        if (rc != KVR_OK) {
            res->error_field = "request_id: the system's random source failed";
            return rc;
        }
    }
    if (!q->update_state)
        return KVR_OK;
    kvr_load_request_t lr = {
        .id = res->request_id,
        .id_len = id_len,
        .worker = res->worker,
        .seq = r->cfg.router_track_active_blocks && !q->no_active_blocks ? r->cur_seq : NULL,
        .n_seq = r->cfg.router_track_active_blocks && !q->no_active_blocks ? n_blocks : 0,
        .isl_tokens = q->n_tokens,
        .cached_tokens = res->cached_tokens,
        .has_expected_output_tokens = q->has_expected_output_tokens,
        .expected_output_tokens = q->expected_output_tokens,
        .block_size = r->cur.bs,
        .assume_kv_reuse = load_opt(q->has_assume_kv_reuse, q->assume_kv_reuse),
        .track_prefill_tokens = load_opt(q->has_track_prefill_tokens, q->track_prefill_tokens)};
    int rc = kvr_load_admit_tagged(r->load, &lr, now_ms, at->tag, at->end, &res->handle);
    if (rc == KVR_OK)
        (void)kvr_stepclock_book(at->clock, at->tokens, at->idle, at->chunk);
    r->last = rc == KVR_OK ? lr : (kvr_load_request_t){0};
    if (rc == KVR_OK && r->approx != NULL && n_blocks > 0)
        rc = kvr_approx_begin(r->approx, res->handle, res->worker, r->cur_lbh, r->cur_seq, n_blocks,
                              now_ms);
    else if (rc == KVR_OK && r->ov != NULL && n_blocks > 0 && kvr_overlay_has(r->ov, res->worker))
        rc = kvr_approx_begin(kvr_overlay_approx(r->ov), res->handle, res->worker, r->cur_lbh,
                              r->cur_seq, n_blocks, now_ms);
    else if (rc == KVR_OK && r->sink.fn != NULL && n_blocks > 0) {
        const kvr_worker_spec_t *ws = kvr_router_worker(r, res->worker.worker_id);
        r->sink.fn(r->sink.arg, &(kvr_decision_t){.worker = res->worker,
                                                  .lbh = r->cur_lbh,
                                                  .seq = r->cur_seq,
                                                  .n = n_blocks,
                                                  .model = q->model,
                                                  .model_len = q->model_len,
                                                  .capacity_blocks = ws ? ws->total_kv_blocks : 0});
    }
    return rc;
}

/* A booked request of a session: binds it to its rank, or ends it when asked. */
static void session_after(kvr_router_t *r, const kvr_route_req_t *q, kvr_worker_t w,
                          uint64_t now_ms)
{
    if (r->sessions == NULL || q->session_id == NULL || q->session_id_len == 0)
        return;
    if (q->session_close)
        (void)kvr_sessions_close(r->sessions, q->session_id, q->session_id_len);
    else /* KVR_ENOMEM leaves the session unbound: its next request routes afresh */
        (void)kvr_sessions_bind(r->sessions, q->session_id, q->session_id_len, w, now_ms);
}

static void count_reject(kvr_router_t *r, int rc)
{
    switch (rc) {
    case KVR_EBUSY:
        r->st.rejected_busy++;
        break;
    case KVR_ENOWORKER:
    case KVR_ENOTALLOWED:
        r->st.rejected_noworker++;
        break;
    case KVR_ENOMODEL:
        r->st.rejected_nomodel++;
        break;
    case KVR_EEXIST:
        r->st.rejected_duplicate++;
        break;
    case KVR_EFULL:
        r->st.rejected_full++;
        break;
    case KVR_ETOOBIG:
        r->st.rejected_too_big++;
        break;
    default:
        r->st.rejected_invalid++;
        break;
    }
}

/* A booking credited with blocks in flight on its rank: counted, and watched until the rank's
 * events report the deepest of them (core/inflight.h). */
static void credit_watched(kvr_router_t *r, const kvr_select_candidate_t *c,
                           kvr_req_handle_t booking, uint64_t now_ms)
{
    r->st.inflight_credited++;
    r->st.inflight_credited_blocks += c->predicted_blocks;
    uint32_t depth = c->device_blocks + c->host_blocks + c->disk_blocks + c->predicted_blocks;
    kvr_inflight_watch(&r->watch, booking, c->worker, depth, now_ms);
}

int kvr_router_route(kvr_router_t *r, const kvr_route_req_t *q, uint64_t now_ms,
                     kvr_route_res_t *res)
{
    memset(res, 0, sizeof *res);
    r->last.id = NULL;
    uint64_t t0 = clock_ns(r);
    int rc = KVR_OK;
    if (q->n_tokens > r->cfg.router_max_prompt_tokens) {
        res->error_field = "tokens: longer than router_max_prompt_tokens";
        rc = KVR_ETOOBIG;
    } else if (q->session_id_len > KVR_SESSION_MAX_ID) {
        res->error_field = "session_id: longer than 128 bytes";
        rc = KVR_EINVAL;
    } else if (q->n_exclude > 0 && q->exclude_ids == NULL) {
        res->error_field = "exclude_ids: NULL with n_exclude > 0";
        rc = KVR_EINVAL;
    } else {
        rc = kvr_registry_resolve(&r->reg, q, r->cfg.lora_strict, &r->cur, &res->error_field);
    }
    long n_blocks = rc == KVR_OK ? hash_prompt(r, q) : 0;
    if (n_blocks < 0)
        rc = (int)n_blocks;
    uint64_t t1 = clock_ns(r);
    if (rc == KVR_OK)
        rc = fill_overlap(r, q, (size_t)n_blocks, r->picker == NULL);
    uint64_t t2 = clock_ns(r);
    uint64_t now_us = q->now_us ? q->now_us : now_ms * 1000;
    if (rc == KVR_OK) {
        rc = fill_loads(r, q, (size_t)n_blocks, q->n_tokens, r->picker == NULL);
        fill_step_waits(r, now_us);
    }
    kvr_select_result_t sel = {0};
    if (rc == KVR_OK) {
        rc = decide(r, q, now_ms, &sel);
        if (rc == KVR_EINVAL)
            res->error_field = sel.field;
        assert(rc != KVR_OK || (sel.index < r->reg.n_ranks && !r->reg.cands[sel.index].fenced &&
                                !r->reg.cands[sel.index].busy));
    }
    uint64_t t3 = clock_ns(r);
    if (rc == KVR_OK) {
        const kvr_select_candidate_t *c = &r->reg.cands[sel.index];
        res->worker = sel.worker;
        res->device_blocks = c->device_blocks;
        res->predicted_blocks = c->predicted_blocks;
        res->cached_tokens = sel.cached_tokens;
        res->overlap_blocks = (uint32_t)llround(sel.effective_overlap_blocks);
        res->block_size = r->cur.bs;
        if (r->picker != NULL) /* load-only: nothing is credited as cached */
            res->cached_tokens = 0;
        res->approximate = r->ov != NULL && kvr_overlay_has(r->ov, sel.worker);
        res->events_cached_tokens = res->approximate && n_blocks > 0 && !q->has_matches
                                        ? events_cached_tokens(r, sel.worker)
                                        : res->cached_tokens;
        bool idle = c->active_requests == 0;
        stream_t at =
            stream_place(r, sel.index, q->n_tokens, res->cached_tokens,
                         load_opt(q->has_track_prefill_tokens, q->track_prefill_tokens), idle);
        rc = book(r, q, (size_t)n_blocks, now_ms, &at, res);
        if (rc == KVR_OK && q->update_state && c->predicted_blocks > 0)
            credit_watched(r, c, res->handle, now_ms);
        if (rc == KVR_OK && q->update_state)
            session_after(r, q, res->worker, now_ms);
        if (rc == KVR_OK && q->update_state && idle) /* its engine starts a step now */
            kvr_stepclock_wake(kvr_registry_clock(&r->reg, sel.index), now_us);
    }
    res->timing = (kvr_route_timing_t){t1 - t0, t2 - t1, t3 - t2, clock_ns(r) - t0};
    r->st.hash_ns += res->timing.hash_ns;
    r->st.lookup_ns += res->timing.lookup_ns;
    r->st.select_ns += res->timing.select_ns;
    if (rc == KVR_OK)
        r->st.routed++;
    else
        count_reject(r, rc);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle, upkeep, introspection */

/* Approximate mode: a request's life as its worker's modelled cache sees it (core/approx.c):
 * the first token says its engine admitted it and holds its blocks; an output block fills the
 * cache as it fills the engine's; the end frees its blocks into the LRU. */
typedef enum { APPROX_START, APPROX_OUTPUT, APPROX_END } approx_step_t;

static void approx_step(kvr_router_t *r, const char *id, size_t id_len, kvr_req_handle_t h,
                        approx_step_t step, uint64_t now_ms)
{
    kvr_req_handle_t key;
    kvr_approx_t *ap = r->approx != NULL ? r->approx
                       : r->ov != NULL   ? kvr_overlay_approx(r->ov)
                                         : NULL;
    if (ap == NULL || kvr_load_request_handle(r->load, id, id_len, h, &key) != KVR_OK)
        return;
    if (step == APPROX_START) /* KVR_ENOTFOUND for a request the model never began: ignored */
        (void)kvr_approx_start(ap, key, now_ms);
    else if (step == APPROX_OUTPUT)
        (void)kvr_approx_output(ap, key);
    else
        (void)kvr_approx_end(ap, key, now_ms);
}

int kvr_router_first_token(kvr_router_t *r, const char *id, size_t id_len, uint64_t now_ms)
{
    approx_step(r, id, id_len, 0, APPROX_START, now_ms);
    stream_prefilled(r, id, id_len, 0);
    return kvr_load_first_token(r->load, id, id_len, now_ms);
}

int kvr_router_output_block(kvr_router_t *r, const char *id, size_t id_len, double decay_fraction,
                            uint64_t now_ms)
{
    approx_step(r, id, id_len, 0, APPROX_OUTPUT, now_ms);
    return kvr_load_output_block(r->load, id, id_len, decay_fraction, now_ms);
}

int kvr_router_free_request(kvr_router_t *r, const char *id, size_t id_len, uint64_t now_ms)
{
    approx_step(r, id, id_len, 0, APPROX_END, now_ms);
    return kvr_load_free_request(r->load, id, id_len, now_ms);
}

int kvr_router_first_token_h(kvr_router_t *r, kvr_req_handle_t h, uint64_t now_ms)
{
    approx_step(r, NULL, 0, h, APPROX_START, now_ms);
    stream_prefilled(r, NULL, 0, h);
    return kvr_load_first_token_h(r->load, h, now_ms);
}

int kvr_router_output_block_h(kvr_router_t *r, kvr_req_handle_t h, double decay_fraction,
                              uint64_t now_ms)
{
    approx_step(r, NULL, 0, h, APPROX_OUTPUT, now_ms);
    return kvr_load_output_block_h(r->load, h, decay_fraction, now_ms);
}

int kvr_router_free_h(kvr_router_t *r, kvr_req_handle_t h, uint64_t now_ms)
{
    approx_step(r, NULL, 0, h, APPROX_END, now_ms);
    return kvr_load_free_h(r->load, h, now_ms);
}

const kvr_load_request_t *kvr_router_last_booking(const kvr_router_t *r)
{
    return r->last.id != NULL ? &r->last : NULL;
}

int kvr_router_admit(kvr_router_t *r, const kvr_load_request_t *lr, uint64_t now_ms,
                     kvr_req_handle_t *handle)
{
    if (r == NULL || lr == NULL || handle == NULL)
        return KVR_EINVAL;
    *handle = KVR_REQ_HANDLE_NONE;
    const kvr_worker_spec_t *w = kvr_router_worker(r, lr->worker.worker_id);
    if (w == NULL || lr->worker.dp_rank < w->dp_start ||
        lr->worker.dp_rank - w->dp_start >= w->dp_size)
        return KVR_ENOWORKER;
    kvr_load_request_t own = *lr;
    if (!r->cfg.router_track_active_blocks)
        own.seq = NULL, own.n_seq = 0;
    long k = kvr_registry_rank(&r->reg, lr->worker);
    if (k < 0) /* registered rank of a registered worker: cannot happen */
        return kvr_load_admit(r->load, &own, now_ms, handle);
    kvr_load_snapshot_t now;
    kvr_load_snapshot(r->load, lr->worker, &now);
    stream_t at = stream_place(r, (size_t)k, lr->isl_tokens, lr->cached_tokens,
                               lr->track_prefill_tokens, now.active_requests == 0);
    int rc = kvr_load_admit_tagged(r->load, &own, now_ms, at.tag, at.end, handle);
    if (rc == KVR_OK)
        (void)kvr_stepclock_book(at.clock, at.tokens, at.idle, at.chunk);
    return rc;
}

void kvr_router_tick(kvr_router_t *r, uint64_t now_ms)
{
    (void)kvr_load_expire(r->load, now_ms);
    kvr_inflight_check(&r->watch, r->ix, r->load, now_ms);
    kvr_sessions_expire(r->sessions, now_ms);
    if (r->approx != NULL)
        (void)kvr_approx_expire(r->approx, now_ms);
    if (r->ov != NULL)
        (void)kvr_approx_expire(kvr_overlay_approx(r->ov), now_ms);
}

int kvr_router_set_rank_approximate(kvr_router_t *r, kvr_worker_t w, bool on)
{
    const kvr_worker_spec_t *sp = kvr_router_worker(r, w.worker_id);
    if (sp == NULL || w.dp_rank < sp->dp_start || w.dp_rank - sp->dp_start >= sp->dp_size)
        return KVR_ENOWORKER;
    if (r->cfg.router_mode != KVR_MODE_KV || r->ix == NULL)
        return KVR_EINVAL; /* approximate mode, load-only modes, no index: nothing to fall from */
    if (r->ov == NULL && !on)
        return KVR_OK;
    if (r->ov == NULL) {
        kvr_approx_config_t ac = {.ttl_ms = (uint64_t)(r->cfg.router_ttl_secs * 1000.0),
                                  .max_tree_size = r->cfg.router_max_tree_size <
                                                           r->cfg.index_max_pairs
                                                       ? r->cfg.router_max_tree_size
                                                       : r->cfg.index_max_pairs,
                                  .prune_target_ratio = r->cfg.router_prune_target_ratio};
        int st;
        if ((r->ov = kvr_overlay_new(&ac, r->cfg.index_max_pairs, r->cfg.max_workers, &st)) ==
            NULL)
            return st;
    }
    return kvr_overlay_set(r->ov, w, on, sp->total_kv_blocks);
}

bool kvr_router_rank_approximate(const kvr_router_t *r, kvr_worker_t w)
{
    return r->ov != NULL && kvr_overlay_has(r->ov, w);
}

void kvr_router_set_clock(kvr_router_t *r, kvr_clock_fn now_ns) { r->clock = now_ns; }

void kvr_router_set_decision_sink(kvr_router_t *r, const kvr_decision_sink_t *sink)
{
    r->sink = sink != NULL ? *sink : (kvr_decision_sink_t){0};
}

int kvr_router_record(kvr_router_t *r, kvr_worker_t w, const uint64_t *lbh, const uint64_t *seq,
                      size_t n, uint64_t now_ms)
{
    if (r->approx == NULL)
        return KVR_ENOTFOUND;
    return kvr_approx_record(r->approx, w, lbh, seq, n, now_ms);
}

size_t kvr_router_n_ranks(const kvr_router_t *r) { return r->reg.n_ranks; }

int kvr_router_query(kvr_router_t *r, const kvr_route_req_t *q, kvr_rank_score_t *out,
                     size_t cap, size_t *n)
{
    *n = 0;
    if (q->n_tokens > r->cfg.router_max_prompt_tokens)
        return KVR_ETOOBIG;
    const char *field;
    int prc = kvr_registry_resolve(&r->reg, q, r->cfg.lora_strict, &r->cur, &field);
    if (prc != KVR_OK)
        return prc;
    long n_blocks = hash_prompt(r, q);
    if (n_blocks < 0)
        return (int)n_blocks;
    int rc = fill_overlap(r, q, (size_t)n_blocks, true); /* a query always reads the index */
    if (rc == KVR_OK) /* the loads, for the blocks in flight */
        rc = fill_loads(r, q, (size_t)n_blocks, q->n_tokens, true);
    if (rc != KVR_OK)
        return rc;
    r->st.queries++;
    for (size_t i = 0; i < r->reg.n_ranks && i < cap; i++) {
        const kvr_select_candidate_t *c = &r->reg.cands[i];
        out[i] = (kvr_rank_score_t){c->worker,           c->device_blocks,
                                    c->host_blocks,      c->disk_blocks,
                                    cached_tokens_of(r, c), c->predicted_blocks};
    }
    *n = r->reg.n_ranks < cap ? r->reg.n_ranks : cap;
    return KVR_OK;
}

int kvr_router_loads(kvr_router_t *r, const kvr_route_req_t *q, kvr_load_projection_t *out,
                     size_t cap, size_t *n)
{
    *n = 0;
    if (q->n_tokens > r->cfg.router_max_prompt_tokens)
        return KVR_ETOOBIG;
    const char *field;
    int rc = kvr_registry_resolve(&r->reg, q, r->cfg.lora_strict, &r->cur, &field);
    if (rc != KVR_OK)
        return rc;
    long n_blocks = hash_prompt(r, q);
    if (n_blocks < 0)
        return (int)n_blocks;
    rc = fill_overlap(r, q, (size_t)n_blocks, r->picker == NULL);
    if (rc == KVR_OK)
        rc = fill_loads(r, q, (size_t)n_blocks, q->n_tokens, r->picker == NULL);
    if (rc != KVR_OK)
        return rc;
    *n = r->reg.n_ranks < cap ? r->reg.n_ranks : cap;
    memcpy(out, r->reg.proj, *n * sizeof *out);
    return KVR_OK;
}

void kvr_router_stats(const kvr_router_t *r, kvr_router_stats_t *out)
{
    *out = r->st;
    out->inflight_confirmed = r->watch.confirmed;
    out->inflight_expired = r->watch.expired;
    out->inflight_watched = r->watch.n;
}
const kvr_load_t *kvr_router_load(const kvr_router_t *r) { return r->load; }
const kvr_router_config_t *kvr_router_config(const kvr_router_t *r) { return &r->cfg; }
kvr_index_t *kvr_router_index(kvr_router_t *r) { return r->ix; }

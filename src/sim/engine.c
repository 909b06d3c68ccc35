/*
 * engine.c: the simulated engine's scheduler and timing model (see engine.h for the model).
 *
 *   requests  one heap object per live request: its token buffer (prompt + room for every
 *             output), its block sequence hashes (computed lazily, block by block, as blocks
 *             fill), its KV block table (sim/kvcache.h), its counters.
 *   by id     open addressing (id -> request), load <= 1/2, backward-shift deletion.
 *   running   an array in admission order (preemption takes the last one).
 *   waiting   a ring buffer deque: new requests at the back, preempted ones at the front.
 *
 * Invariants (kvr_engine_verify): every live request is in exactly one of running / waiting
 * and in the id table; running <= max_num_seqs; waiting requests hold no blocks and have
 * nothing computed; a running request holds blocks for at least its computed tokens and its
 * committed blocks are exactly the full computed ones; the cache's own invariants hold with
 * the running requests' tables as its sequences.
 * Threads: one. Memory: as engine.h says; the ring and the running array are sized at creation.
 */
#include "sim/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/oatab.h"
#include "kvrouter.h"

typedef enum { REQ_WAITING = 0, REQ_RUNNING, REQ_HELD } req_state_t;

typedef struct eng_req {
    uint64_t id;
    void *user;
    uint32_t *tokens;      /* prompt + outputs; capacity n_prompt + max_tokens */
    uint32_t n_prompt;
    uint32_t n_tokens;     /* known tokens: prompt + outputs so far */
    uint32_t max_tokens;
    uint32_t n_output;
    uint64_t *hashes;      /* sequence hashes of full blocks [0, n_hashed) */
    uint32_t n_hashed;
    uint32_t n_computed;   /* tokens whose KV is computed */
    uint32_t n_sched;      /* tokens scheduled in the current step */
    int64_t cached_tokens; /* -1 until first admission */
    bool cancelled;        /* cancelled during a step that scheduled it: freed at step_end */
    bool hold_kv;          /* finished: blocks kept until released (REQ_HELD) */
    bool kv_loaded;        /* the prompt's KV arrives with it (cleared by a preemption) */
    uint32_t held_at;      /* REQ_HELD: its index in held */
    uint64_t prompt_key;   /* seeds the generated tokens */
    req_state_t state;
    kvr_kvcache_seq_t seq;
} eng_req_t;

struct kvr_engine {
    kvr_engine_config_t cfg;
    kvr_kvcache_t *cache;

    eng_req_t **running;   /* capacity max_num_seqs */
    uint32_t n_running;

    eng_req_t **ring;      /* waiting deque, capacity ring_cap (power of two) */
    uint32_t ring_cap, ring_head, n_waiting;

    eng_req_t **held; /* finished hold_kv requests (REQ_HELD), unordered */
    uint32_t n_held, cap_held;

    eng_req_t **by_id;     /* open addressing; NULL = empty */
    size_t id_cap, n_live; /* n_live: running + waiting + held */

    bool in_step;
    kvr_engine_stats_t st;
};

/* ---- config ---------------------------------------------------------------------------- */

void kvr_engine_timing_default(kvr_engine_timing_t *t)
{
    t->prefill_a = 4.209989e-07;
    t->prefill_b = 1.518344e-02;
    t->prefill_c = 16.50142;
    t->decode_a = -25.74;
    t->decode_b = 54.01;
    t->decode_c = 5.74;
    t->decode_min_ms = 1.0;
}

void kvr_engine_config_default(kvr_engine_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->num_gpu_blocks = 16384;
    cfg->block_size = 16;
    cfg->max_num_seqs = 256;
    cfg->max_num_batched_tokens = 8192;
    cfg->max_model_len = 0;
    cfg->max_waiting = 65536;
    cfg->enable_chunked_prefill = true;
    cfg->enable_prefix_caching = true;
    cfg->seed = 0;
    cfg->vocab_size = 32000;
    kvr_engine_timing_default(&cfg->timing);
}

static uint64_t capacity_tokens(const kvr_engine_config_t *cfg)
{
    return (uint64_t)cfg->num_gpu_blocks * cfg->block_size;
}

static uint32_t effective_max_model_len(const kvr_engine_config_t *cfg)
{
    if (cfg->max_model_len)
        return cfg->max_model_len;
    uint64_t cap = capacity_tokens(cfg);
    return cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
}

static int bad(char *err, size_t err_len, const char *msg)
{
    if (err && err_len)
        snprintf(err, err_len, "%s", msg);
    return KVR_EINVAL;
}

static bool finite_nonneg(double v) { return isfinite(v) && v >= 0; }

static int validate_timing(const kvr_engine_timing_t *t, char *err, size_t err_len)
{
    if (!finite_nonneg(t->prefill_a) || !finite_nonneg(t->prefill_b) ||
        !finite_nonneg(t->prefill_c))
        return bad(err, err_len, "prefill timing coefficients: must be finite and >= 0");
    if (!isfinite(t->decode_a) || !isfinite(t->decode_b) || !isfinite(t->decode_c))
        return bad(err, err_len, "decode timing coefficients: must be finite");
    if (!isfinite(t->decode_min_ms) || t->decode_min_ms <= 0)
        return bad(err, err_len, "decode_min_ms: must be a finite number > 0");
    return KVR_OK;
}

int kvr_engine_config_validate(const kvr_engine_config_t *cfg, char *err, size_t err_len)
{
    if (!cfg)
        return bad(err, err_len, "config: missing");
    if (cfg->num_gpu_blocks == 0)
        return bad(err, err_len, "num_gpu_blocks: must be >= 1");
    if (cfg->block_size == 0)
        return bad(err, err_len, "block_size: must be >= 1");
    if (cfg->max_num_seqs == 0)
        return bad(err, err_len, "max_num_seqs: must be >= 1");
    if (cfg->max_num_batched_tokens == 0)
        return bad(err, err_len, "max_num_batched_tokens: must be >= 1");
    if (cfg->max_waiting == 0)
        return bad(err, err_len, "max_waiting: must be >= 1");
    if (cfg->vocab_size <= KVR_ENGINE_FIRST_GEN_TOKEN)
        return bad(err, err_len, "vocab_size: must be > 256");
    uint32_t mml = effective_max_model_len(cfg);
    if (mml < 2)
        return bad(err, err_len, "max_model_len: must be >= 2");
    if ((uint64_t)mml > capacity_tokens(cfg))
        return bad(err, err_len,
                   "max_model_len: larger than the KV cache (num_gpu_blocks * block_size)");
    if (!cfg->enable_chunked_prefill && cfg->max_num_batched_tokens < mml)
        return bad(err, err_len,
                   "max_num_batched_tokens: must be >= max_model_len without chunked prefill");
    return validate_timing(&cfg->timing, err, err_len);
}

/* ---- id table ---------------------------------------------------------------------------- */

#define ID_HOME(c, e) kvr_mix64((*(e))->id)
#define ID_EMPTY(e) (*(e) == NULL)
#define ID_CLEAR(e) (*(e) = NULL)
typedef eng_req_t *req_ptr_t; /* the table's entry: a request, NULL = empty */
KVR_OATAB_DEFINE(idt, kvr_engine_t, req_ptr_t, ID_HOME, ID_EMPTY, ID_CLEAR)

static bool id_is(const kvr_engine_t *e, const req_ptr_t *r, const void *key)
{
    (void)e;
    return (*r)->id == *(const uint64_t *)key;
}

static eng_req_t **id_entry(const kvr_engine_t *e, uint64_t id)
{
    return idt_find(e, e->by_id, e->id_cap - 1, kvr_mix64(id), id_is, &id);
}

static eng_req_t *id_get(const kvr_engine_t *e, uint64_t id)
{
    eng_req_t **r = id_entry(e, id);
    return r == NULL ? NULL : *r;
}

static int id_grow(kvr_engine_t *e)
{
    size_t mask = e->id_cap - 1;
    int rc = idt_rehash(e, &e->by_id, &mask, e->id_cap * 2);
    e->id_cap = mask + 1;
    return rc;
}

/* The id must be absent (callers look it up first); room reserved. */
static void id_put(kvr_engine_t *e, eng_req_t *r)
{
    e->by_id[idt_free_slot(e->by_id, e->id_cap - 1, kvr_mix64(r->id))] = r;
}

static void id_remove(kvr_engine_t *e, uint64_t id)
{
    eng_req_t **r = id_entry(e, id);
    if (r == NULL)
        return;
    idt_remove_at(e, e->by_id, e->id_cap - 1, (size_t)(r - e->by_id));
    e->n_live--;
}

/* ---- waiting deque ------------------------------------------------------------------------ */

static eng_req_t *wq_at(const kvr_engine_t *e, uint32_t k)
{
    return e->ring[(e->ring_head + k) & (e->ring_cap - 1)];
}

static void wq_push_back(kvr_engine_t *e, eng_req_t *r)
{
    e->ring[(e->ring_head + e->n_waiting) & (e->ring_cap - 1)] = r;
    e->n_waiting++;
}

static void wq_push_front(kvr_engine_t *e, eng_req_t *r)
{
    e->ring_head = (e->ring_head - 1) & (e->ring_cap - 1);
    e->ring[e->ring_head] = r;
    e->n_waiting++;
}

static void wq_pop_front(kvr_engine_t *e)
{
    e->ring_head = (e->ring_head + 1) & (e->ring_cap - 1);
    e->n_waiting--;
}

static void wq_remove(kvr_engine_t *e, const eng_req_t *r)
{
    uint32_t k = 0;
    while (k < e->n_waiting && wq_at(e, k) != r)
        k++;
    if (k == e->n_waiting)
        return;
    for (; k + 1 < e->n_waiting; k++)
        e->ring[(e->ring_head + k) & (e->ring_cap - 1)] = wq_at(e, k + 1);
    e->n_waiting--;
}

static void running_remove_at(kvr_engine_t *e, uint32_t k)
{
    memmove(&e->running[k], &e->running[k + 1], (e->n_running - k - 1) * sizeof e->running[0]);
    e->n_running--;
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* The end of a constructor: e with *status KVR_OK, or e freed and NULL with *status st. */
static kvr_engine_t *made(kvr_engine_t *e, int st, int *status)
{
    if (status)
        *status = st;
    if (st == KVR_OK)
        return e;
    kvr_engine_free(e);
    return NULL;
}

kvr_engine_t *kvr_engine_new(const kvr_engine_config_t *cfg, kvr_kvcache_sink_fn sink,
                             void *sink_ctx, int *status)
{
    int st = kvr_engine_config_validate(cfg, NULL, 0);
    kvr_engine_t *e = NULL;
    if (st != KVR_OK)
        goto fail;
    st = KVR_ENOMEM;
    e = calloc(1, sizeof *e);
    if (!e)
        goto fail;
    e->cfg = *cfg;
    e->cfg.max_model_len = effective_max_model_len(cfg);
    kvr_kvcache_config_t kcfg = {.num_blocks = cfg->num_gpu_blocks,
                                 .block_size = cfg->block_size,
                                 .prefix_caching = cfg->enable_prefix_caching};
    e->cache = kvr_kvcache_new(&kcfg, sink, sink_ctx, &st);
    if (!e->cache)
        goto fail;
    st = KVR_ENOMEM;
    e->running = calloc(cfg->max_num_seqs, sizeof *e->running);
    e->ring_cap = pow2_at_least((uint64_t)cfg->max_waiting + cfg->max_num_seqs);
    e->ring = calloc(e->ring_cap, sizeof *e->ring);
    e->id_cap = 64;
    e->by_id = calloc(e->id_cap, sizeof *e->by_id);
    if (!e->running || !e->ring || !e->by_id)
        goto fail;
    st = KVR_OK;
fail:
    return made(e, st, status);
}

static void req_free(kvr_engine_t *e, eng_req_t *r)
{
    kvr_kvcache_release(e->cache, &r->seq);
    kvr_kvcache_seq_deinit(&r->seq);
    free(r->tokens);
    free(r->hashes);
    free(r);
}

void kvr_engine_free(kvr_engine_t *e)
{
    if (!e)
        return;
    if (e->by_id) {
        for (size_t i = 0; i < e->id_cap; i++)
            if (e->by_id[i])
                req_free(e, e->by_id[i]);
    }
    free(e->by_id);
    free(e->held);
    free(e->ring);
    free(e->running);
    kvr_kvcache_free(e->cache);
    free(e);
}

/* ---- cloning ----------------------------------------------------------------------------- */

/* A deep copy of request r: its buffers and its block table (the same block ids). */
static eng_req_t *req_clone(const kvr_engine_t *e, const eng_req_t *r)
{
    uint32_t total = r->n_prompt + r->max_tokens;
    eng_req_t *c = malloc(sizeof *c);
    if (c == NULL)
        return NULL;
    *c = *r;
    c->tokens = malloc((size_t)total * sizeof *c->tokens);
    c->hashes = malloc(((size_t)total / e->cfg.block_size + 1) * sizeof *c->hashes);
    c->seq.blocks = r->seq.cap ? malloc((size_t)r->seq.cap * sizeof *c->seq.blocks) : NULL;
    if (c->tokens == NULL || c->hashes == NULL || (r->seq.cap && c->seq.blocks == NULL)) {
        free(c->tokens);
        free(c->hashes);
        free(c->seq.blocks);
        free(c);
        return NULL;
    }
    memcpy(c->tokens, r->tokens, (size_t)r->n_tokens * sizeof *c->tokens);
    memcpy(c->hashes, r->hashes, (size_t)r->n_hashed * sizeof *c->hashes);
    if (r->seq.n_blocks)
        memcpy(c->seq.blocks, r->seq.blocks, (size_t)r->seq.n_blocks * sizeof *c->seq.blocks);
    return c;
}

/* src's copy in dst of a live request of src (same slot of the id table). */
static eng_req_t *mapped(const kvr_engine_t *src, const kvr_engine_t *dst, const eng_req_t *r)
{
    return dst->by_id[id_entry(src, r->id) - src->by_id];
}

kvr_engine_t *kvr_engine_clone(const kvr_engine_t *src, int *status)
{
    int st = KVR_ENOMEM;
    kvr_engine_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        goto fail;
    e->cfg = src->cfg;
    e->cache = kvr_kvcache_clone(src->cache, &st);
    e->ring_cap = src->ring_cap;
    e->id_cap = src->id_cap;
    e->cap_held = src->cap_held;
    e->running = calloc(src->cfg.max_num_seqs, sizeof *e->running);
    e->ring = calloc(e->ring_cap, sizeof *e->ring);
    e->by_id = calloc(e->id_cap, sizeof *e->by_id);
    e->held = e->cap_held ? calloc(e->cap_held, sizeof *e->held) : NULL;
    st = KVR_ENOMEM;
    if (!e->cache || !e->running || !e->ring || !e->by_id || (e->cap_held && !e->held))
        goto fail;
    for (size_t i = 0; i < src->id_cap; i++)
        if (src->by_id[i] != NULL && (e->by_id[i] = req_clone(src, src->by_id[i])) == NULL)
            goto fail;
    for (uint32_t k = 0; k < src->n_running; k++)
        e->running[k] = mapped(src, e, src->running[k]);
    for (uint32_t k = 0; k < src->n_waiting; k++) {
        uint32_t at = (src->ring_head + k) & (src->ring_cap - 1);
        e->ring[at] = mapped(src, e, src->ring[at]);
    }
    for (uint32_t k = 0; k < src->n_held; k++)
        e->held[k] = mapped(src, e, src->held[k]);
    e->n_running = src->n_running;
    e->ring_head = src->ring_head;
    e->n_waiting = src->n_waiting;
    e->n_held = src->n_held;
    e->n_live = src->n_live;
    e->in_step = src->in_step;
    e->st = src->st;
    st = KVR_OK;
fail:
    return made(e, st, status);
}

/* ---- requests ---------------------------------------------------------------------------- */

int kvr_engine_add(kvr_engine_t *e, const kvr_engine_request_t *req)
{
    if (!req || !req->tokens || req->n_tokens == 0 || req->max_tokens == 0)
        return KVR_EINVAL;
    if ((uint64_t)req->n_tokens + req->max_tokens > e->cfg.max_model_len)
        return KVR_ETOOBIG;
    if (id_get(e, req->id))
        return KVR_EEXIST;
    if (e->n_waiting >= e->cfg.max_waiting)
        return KVR_EQUEUEFULL;
    if ((e->n_live + 1) * 2 > e->id_cap && id_grow(e) != KVR_OK)
        return KVR_ENOMEM;

    eng_req_t *r = calloc(1, sizeof *r);
    uint32_t total = req->n_tokens + req->max_tokens;
    if (r) {
        r->tokens = malloc((size_t)total * sizeof *r->tokens);
        r->hashes = malloc(((size_t)total / e->cfg.block_size + 1) * sizeof *r->hashes);
    }
    if (!r || !r->tokens || !r->hashes) {
        if (r) {
            free(r->tokens);
            free(r->hashes);
        }
        free(r);
        return KVR_ENOMEM;
    }
    memcpy(r->tokens, req->tokens, (size_t)req->n_tokens * sizeof *r->tokens);
    r->id = req->id;
    r->user = req->user;
    r->n_prompt = r->n_tokens = req->n_tokens;
    r->max_tokens = req->max_tokens;
    r->cached_tokens = -1;
    r->prompt_key = kvr_xxh3(r->tokens, (size_t)r->n_prompt * sizeof *r->tokens, e->cfg.seed);
    kvr_kvcache_seq_init(&r->seq);
    r->seq.lora_name = req->lora_name;
    r->hold_kv = req->hold_kv;
    r->kv_loaded = req->kv_loaded;
    r->state = REQ_WAITING;
    id_put(e, r);
    e->n_live++;
    wq_push_back(e, r);
    return KVR_OK;
}

int kvr_engine_cancel(kvr_engine_t *e, uint64_t id)
{
    eng_req_t *r = id_get(e, id);
    if (!r)
        return KVR_ENOTFOUND;
    if (r->n_sched > 0) { /* in the current step: its KV is being computed */
        r->cancelled = true;
        return KVR_OK;
    }
    if (r->state == REQ_HELD) {
        return kvr_engine_release_held(e, id);
    } else if (r->state == REQ_WAITING) {
        wq_remove(e, r);
    } else {
        for (uint32_t k = 0; k < e->n_running; k++)
            if (e->running[k] == r) {
                running_remove_at(e, k);
                break;
            }
    }
    id_remove(e, id);
    req_free(e, r);
    e->st.requests_cancelled++;
    return KVR_OK;
}

static void held_remove(kvr_engine_t *e, eng_req_t *r)
{
    eng_req_t *last = e->held[--e->n_held];
    e->held[r->held_at] = last;
    last->held_at = r->held_at;
    e->st.held_blocks -= r->seq.n_blocks;
}

int kvr_engine_release_held(kvr_engine_t *e, uint64_t id)
{
    eng_req_t *r = id_get(e, id);
    if (!r)
        return KVR_ENOTFOUND;
    if (r->state != REQ_HELD)
        return KVR_EINVAL;
    held_remove(e, r);
    id_remove(e, id);
    req_free(e, r);
    e->st.held_released++;
    return KVR_OK;
}

size_t kvr_engine_held_blocks(const kvr_engine_t *e, uint64_t id, const uint32_t **ids)
{
    const eng_req_t *r = id_get(e, id);
    if (!r || r->state != REQ_HELD) {
        *ids = NULL;
        return 0;
    }
    *ids = r->seq.blocks;
    return r->seq.n_blocks;
}

/* A finished hold_kv request keeps its blocks: false when there is no room to track it (it
 * is then freed as any finished request). */
static bool hold(kvr_engine_t *e, eng_req_t *r)
{
    if (e->n_held == e->cap_held) {
        uint32_t cap = e->cap_held ? e->cap_held * 2 : 64;
        eng_req_t **h = realloc(e->held, (size_t)cap * sizeof *h);
        if (!h)
            return false;
        e->held = h;
        e->cap_held = cap;
    }
    r->state = REQ_HELD;
    r->held_at = e->n_held;
    e->held[e->n_held++] = r;
    e->st.held_blocks += r->seq.n_blocks;
    return true;
}

/* Sequence hashes of the request's full blocks up to n_full (from its known tokens). */
static void ensure_hashed(kvr_engine_t *e, eng_req_t *r, uint32_t n_full)
{
    uint32_t bs = e->cfg.block_size;
    for (uint32_t b = r->n_hashed; b < n_full; b++) {
        uint64_t lbh;
        kvr_hash_opts_t o = {.lora_name = r->seq.lora_name,
                             .lora_name_len = r->seq.lora_name ? strlen(r->seq.lora_name) : 0};
        kvr_hash_blocks(&r->tokens[(size_t)b * bs], bs, bs, &o, &lbh, 1);
        r->hashes[b] = b == 0 ? lbh : kvr_hash_chain_next(r->hashes[b - 1], lbh);
    }
    if (n_full > r->n_hashed)
        r->n_hashed = n_full;
}

static uint32_t generate_token(const kvr_engine_t *e, const eng_req_t *r)
{
    uint64_t x = kvr_mix64(r->prompt_key ^ ((uint64_t)(r->n_output + 1) * UINT64_C(0x9E3779B97F4A7C15)));
    uint32_t span = e->cfg.vocab_size - KVR_ENGINE_FIRST_GEN_TOKEN;
    return KVR_ENGINE_FIRST_GEN_TOKEN + (uint32_t)(x % span);
}

/* ---- scheduling -------------------------------------------------------------------------- */

static void preempt(kvr_engine_t *e, eng_req_t *r)
{
    kvr_kvcache_release(e->cache, &r->seq);
    r->n_computed = 0;
    r->n_sched = 0;
    r->kv_loaded = false; /* the transferred KV is gone: recomputed on readmission */
    r->state = REQ_WAITING;
    wq_push_front(e, r);
    e->st.preemptions++;
}

/* Tokens to schedule for r now, given the budget; 0 = not this step. */
static uint32_t tokens_to_schedule(const kvr_engine_t *e, const eng_req_t *r, uint32_t computed,
                                   uint32_t budget)
{
    uint32_t n_new = r->n_tokens - computed;
    if (n_new <= budget)
        return n_new;
    return e->cfg.enable_chunked_prefill ? budget : 0;
}

/* Running requests, in order; preempts from the back when blocks run out. */
static uint32_t schedule_running(kvr_engine_t *e, uint32_t *budget, kvr_engine_step_t *step)
{
    uint32_t i = 0;
    while (i < e->n_running && *budget > 0) {
        eng_req_t *r = e->running[i];
        uint32_t n_new = tokens_to_schedule(e, r, r->n_computed, *budget);
        if (n_new == 0)
            break; /* budget left is too small for a whole prefill (no chunking) */
        bool self_preempted = false;
        while (kvr_kvcache_allocate(e->cache, &r->seq, NULL, 0,
                                    (uint64_t)r->n_computed + n_new) != KVR_OK) {
            eng_req_t *victim = e->running[e->n_running - 1];
            e->n_running--;
            preempt(e, victim);
            step->n_preempted++;
            if (victim == r) {
                self_preempted = true;
                break;
            }
        }
        if (self_preempted)
            break;
        r->n_sched = n_new;
        *budget -= n_new;
        i++;
    }
    return i;
}

/* True when r cannot be admitted now whatever the prefix cache holds: even with the most
 * hits possible its first chunk needs more new blocks than the free queue has. Exact (it
 * never refuses what allocate would accept) and O(1), so an overloaded engine does not
 * re-match a long blocked prompt against the cache on every step. */
static bool cannot_fit(const kvr_engine_t *e, const eng_req_t *r, uint32_t budget)
{
    uint32_t bs = e->cfg.block_size;
    uint32_t max_hit = e->cfg.enable_prefix_caching ? (r->n_tokens - 1) / bs : 0;
    uint32_t rest = r->n_tokens - max_hit * bs; /* >= 1 */
    uint32_t n_new = rest <= budget || r->kv_loaded ? rest : budget; /* loaded: all blocks */
    uint64_t new_blocks = ((uint64_t)n_new + bs - 1) / bs;
    return new_blocks > kvr_kvcache_n_free(e->cache);
}

/* Admits waiting requests FCFS while budget, seats and blocks allow. */
static void schedule_waiting(kvr_engine_t *e, uint32_t *budget)
{
    uint32_t bs = e->cfg.block_size;
    while (e->n_waiting > 0 && *budget > 0 && e->n_running < e->cfg.max_num_seqs) {
        eng_req_t *r = wq_at(e, 0);
        if (cannot_fit(e, r, *budget))
            break;
        uint32_t n_full = r->n_tokens / bs;
        size_t n_hit = 0;
        if (e->cfg.enable_prefix_caching) {
            ensure_hashed(e, r, n_full);
            n_hit = kvr_kvcache_match(e->cache, r->hashes, n_full);
            size_t max_hit = (r->n_tokens - 1) / bs; /* one token is always computed */
            if (n_hit > max_hit)
                n_hit = max_hit;
        }
        uint32_t computed = (uint32_t)n_hit * bs;
        uint32_t hit = computed;
        if (r->kv_loaded) /* the transferred KV: all but the last prompt token */
            computed = r->n_tokens - 1;
        uint32_t n_new = tokens_to_schedule(e, r, computed, *budget);
        if (n_new == 0)
            break;
        if (kvr_kvcache_allocate(e->cache, &r->seq, r->hashes, n_hit,
                                 (uint64_t)computed + n_new) != KVR_OK)
            break;
        if (r->kv_loaded) { /* its blocks are in the cache now: committed, STORED */
            kvr_kvcache_commit(e->cache, &r->seq, r->hashes, r->tokens, computed / bs);
            e->st.kv_loaded_requests++;
            e->st.kv_loaded_tokens += computed - hit;
        }
        if (r->cached_tokens < 0) {
            r->cached_tokens = hit;
            e->st.prefix_queries_tokens += r->n_prompt;
            e->st.prefix_hits_tokens += hit < r->n_prompt ? hit : r->n_prompt;
        }
        r->n_computed = computed;
        r->n_sched = n_new;
        *budget -= n_new;
        wq_pop_front(e);
        r->state = REQ_RUNNING;
        e->running[e->n_running++] = r;
    }
}

static double step_duration_ms(const kvr_engine_t *e, const kvr_engine_step_t *step)
{
    const kvr_engine_timing_t *t = &e->cfg.timing;
    double u = kvr_kvcache_usage(e->cache);
    double dec = t->decode_a * u * u + t->decode_b * u + t->decode_c;
    if (!(dec >= t->decode_min_ms))
        dec = t->decode_min_ms;
    if (step->n_prefill_tokens == 0)
        return dec;
    double n = step->n_prefill_tokens;
    double pre = t->prefill_a * n * n + t->prefill_b * n + t->prefill_c;
    return (step->n_decode > 0 && dec > pre) ? dec : pre;
}

int kvr_engine_step_begin(kvr_engine_t *e, kvr_engine_step_t *step)
{
    memset(step, 0, sizeof *step);
    if (e->in_step)
        return KVR_EBUSY;
    uint32_t budget = e->cfg.max_num_batched_tokens;
    schedule_running(e, &budget, step);
    if (step->n_preempted == 0)
        schedule_waiting(e, &budget);
    uint32_t n = 0;
    for (uint32_t k = 0; k < e->n_running; k++) {
        const eng_req_t *r = e->running[k];
        if (r->n_sched == 0)
            continue;
        n++;
        bool decode = (r->n_output > 0 || r->kv_loaded) && r->n_sched == 1 &&
                      r->n_computed + 1 == r->n_tokens;
        if (decode)
            step->n_decode++;
        else
            step->n_prefill_tokens += r->n_sched;
    }
    step->n_scheduled = n;
    if (n == 0) {
        step->idle = true;
        return KVR_OK;
    }
    step->duration_ms = step_duration_ms(e, step);
    e->in_step = true;
    return KVR_OK;
}

/* Applies r's scheduled tokens; true when r finished (the caller frees it). */
static bool apply_one(kvr_engine_t *e, eng_req_t *r, kvr_engine_output_fn cb, void *ctx)
{
    uint32_t bs = e->cfg.block_size;
    r->n_computed += r->n_sched;
    r->n_sched = 0;
    uint32_t n_full = r->n_computed / bs;
    if (e->cfg.enable_prefix_caching)
        ensure_hashed(e, r, n_full);
    kvr_kvcache_commit(e->cache, &r->seq, r->hashes, r->tokens, n_full);
    if (r->n_computed < r->n_tokens)
        return false; /* a prefill chunk: nothing sampled */
    uint32_t tok = generate_token(e, r);
    r->tokens[r->n_tokens++] = tok;
    r->n_output++;
    e->st.generation_tokens++;
    if (r->n_output == 1)
        e->st.prompt_tokens += r->n_prompt;
    kvr_engine_output_t out = {
        .id = r->id,
        .user = r->user,
        .token = tok,
        .n_output = r->n_output,
        .prompt_tokens = r->n_prompt,
        .cached_tokens = r->cached_tokens > 0 ? (uint32_t)r->cached_tokens : 0,
        .first = r->n_output == 1,
        .finish = r->n_output >= r->max_tokens ? KVR_ENGINE_FINISHED_LENGTH : KVR_ENGINE_RUNNING,
        .kv_blocks = r->seq.n_blocks,
    };
    if (out.finish != KVR_ENGINE_RUNNING && r->hold_kv)
        (void)hold(e, r); /* before the output: its reader may ask for the held blocks */
    if (cb)
        cb(ctx, &out);
    return out.finish != KVR_ENGINE_RUNNING;
}

int kvr_engine_step_end(kvr_engine_t *e, kvr_engine_output_fn cb, void *ctx)
{
    if (!e->in_step)
        return KVR_EINVAL;
    e->in_step = false;
    uint32_t keep = 0;
    for (uint32_t k = 0; k < e->n_running; k++) {
        eng_req_t *r = e->running[k];
        if (r->cancelled) {
            id_remove(e, r->id);
            req_free(e, r);
            e->st.requests_cancelled++;
            continue;
        }
        if (r->n_sched > 0 && apply_one(e, r, cb, ctx)) {
            e->st.requests_finished++;
            if (r->state == REQ_HELD)
                continue;
            id_remove(e, r->id);
            req_free(e, r);
            continue;
        }
        e->running[keep++] = r;
    }
    e->n_running = keep;
    e->st.steps++;
    return KVR_OK;
}

bool kvr_engine_has_work(const kvr_engine_t *e) { return e->n_running + e->n_waiting > 0; }
bool kvr_engine_in_step(const kvr_engine_t *e) { return e->in_step; }

int kvr_engine_reset_prefix_cache(kvr_engine_t *e)
{
    if (e->in_step || e->n_running > 0 || e->n_held > 0)
        return KVR_EBUSY;
    return kvr_kvcache_reset(e->cache);
}

void kvr_engine_get_stats(const kvr_engine_t *e, kvr_engine_stats_t *out)
{
    *out = e->st;
    out->running = e->n_running;
    out->waiting = e->n_waiting;
    out->held = e->n_held;
    out->kv_usage = kvr_kvcache_usage(e->cache);
    kvr_kvcache_get_stats(e->cache, &out->cache);
}

const kvr_kvcache_t *kvr_engine_cache(const kvr_engine_t *e) { return e->cache; }
const kvr_engine_config_t *kvr_engine_config(const kvr_engine_t *e) { return &e->cfg; }

/* ---- verify ------------------------------------------------------------------------------ */

static int verify_req(const kvr_engine_t *e, const eng_req_t *r)
{
    uint32_t bs = e->cfg.block_size;
    if (id_get(e, r->id) != r)
        return KVR_EINVAL;
    if (r->n_tokens != r->n_prompt + r->n_output || r->n_output > r->max_tokens)
        return KVR_EINVAL;
    if (r->n_computed > r->n_tokens || r->n_hashed > r->n_tokens / bs)
        return KVR_EINVAL;
    if (r->state == REQ_WAITING)
        return (r->seq.n_blocks == 0 && r->n_computed == 0) ? KVR_OK : KVR_EINVAL;
    if ((uint64_t)r->seq.n_blocks * bs < r->n_computed)
        return KVR_EINVAL;
    if (!e->in_step && r->seq.n_full != r->n_computed / bs)
        return KVR_EINVAL;
    return KVR_OK;
}

int kvr_engine_verify(const kvr_engine_t *e)
{
    if (e->n_running > e->cfg.max_num_seqs ||
        e->n_live != (size_t)e->n_running + e->n_waiting + e->n_held)
        return KVR_EINVAL;
    const kvr_kvcache_seq_t **seqs = NULL;
    size_t n_seqs = (size_t)e->n_running + e->n_held;
    if (n_seqs) {
        seqs = malloc(n_seqs * sizeof *seqs);
        if (!seqs)
            return KVR_ENOMEM;
    }
    int st = KVR_OK;
    for (uint32_t k = 0; k < e->n_running && st == KVR_OK; k++) {
        if (e->running[k]->state != REQ_RUNNING)
            st = KVR_EINVAL;
        else
            st = verify_req(e, e->running[k]);
        seqs[k] = &e->running[k]->seq;
    }
    for (uint32_t k = 0; k < e->n_waiting && st == KVR_OK; k++) {
        const eng_req_t *r = wq_at(e, k);
        st = r->state == REQ_WAITING ? verify_req(e, r) : KVR_EINVAL;
    }
    uint64_t held_blocks = 0;
    for (uint32_t k = 0; k < e->n_held && st == KVR_OK; k++) {
        const eng_req_t *r = e->held[k];
        if (r->state != REQ_HELD || r->held_at != k || id_get(e, r->id) != r)
            st = KVR_EINVAL;
        held_blocks += r->seq.n_blocks;
        seqs[e->n_running + k] = &r->seq;
    }
    if (st == KVR_OK && held_blocks != e->st.held_blocks)
        st = KVR_EINVAL;
    if (st == KVR_OK)
        st = kvr_kvcache_verify(e->cache, (const kvr_kvcache_seq_t *const *)seqs, n_seqs);
    free(seqs);
    return st;
}

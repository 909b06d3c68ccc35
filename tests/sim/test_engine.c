/*
 * test_engine.c: the simulated engine (sim/engine.c): scheduling, prefix caching, chunked
 * prefill, preemption, cancellation, the timing model, determinism, and that its KV events,
 * applied to a real prefix index, give exactly the blocks its cache holds.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim/engine.h"
#include "kvrouter.h"

/* ---- harness: events into a real prefix index, outputs recorded ---------------------- */

#define MAX_OUT 200000

typedef struct harness {
    kvr_engine_t *e;
    kvr_index_t *ix;
    uint32_t bs;
    uint64_t n_stored, n_removed, n_cleared;
    kvr_engine_output_t out[MAX_OUT];
    size_t n_out;
    double total_ms;
    uint64_t steps, preempted;
    const char *last_lora; /* of the last STORED event */
} harness_t;

static const kvr_worker_t W = {7, 0};

static void sink(void *ctx, const kvr_kvcache_event_t *ev)
{
    harness_t *h = ctx;
    if (ev->kind == KVR_KVC_STORED) {
        kvr_block_t *blocks = calloc(ev->n_hashes, sizeof *blocks);
        assert_non_null(blocks);
        kvr_hash_opts_t o = {.lora_name = ev->lora_name,
                             .lora_name_len = ev->lora_name ? strlen(ev->lora_name) : 0};
        h->last_lora = ev->lora_name;
        for (size_t i = 0; i < ev->n_hashes; i++) {
            blocks[i].ext = ev->hashes[i];
            assert_int_equal(
                kvr_hash_blocks(ev->tokens + i * h->bs, h->bs, h->bs, &o, &blocks[i].lbh, 1), 1);
        }
        kvr_event_t e = {.kind = KVR_EV_STORED, .worker = W, .has_parent = ev->has_parent,
                         .parent_ext = ev->parent, .blocks = blocks, .n_blocks = ev->n_hashes};
        assert_int_equal(kvr_index_apply(h->ix, &e), KVR_OK);
        free(blocks);
        h->n_stored += ev->n_hashes;
    } else if (ev->kind == KVR_KVC_REMOVED) {
        kvr_event_t e = {.kind = KVR_EV_REMOVED, .worker = W, .removed = ev->hashes,
                         .n_removed = ev->n_hashes};
        assert_int_equal(kvr_index_apply(h->ix, &e), KVR_OK);
        h->n_removed += ev->n_hashes;
    } else {
        kvr_event_t e = {.kind = KVR_EV_CLEARED, .worker = W};
        assert_int_equal(kvr_index_apply(h->ix, &e), KVR_OK);
        h->n_cleared++;
    }
}

static void on_out(void *ctx, const kvr_engine_output_t *o)
{
    harness_t *h = ctx;
    if (h->n_out < MAX_OUT)
        h->out[h->n_out++] = *o;
}

static harness_t *harness_new(const kvr_engine_config_t *cfg)
{
    harness_t *h = calloc(1, sizeof *h);
    assert_non_null(h);
    int st;
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    h->ix = kvr_index_new(&ic, &st);
    assert_non_null(h->ix);
    h->bs = cfg->block_size;
    h->e = kvr_engine_new(cfg, sink, h, &st);
    assert_int_equal(st, KVR_OK);
    assert_non_null(h->e);
    return h;
}

static void harness_free(harness_t *h)
{
    kvr_engine_free(h->e);
    kvr_index_free(h->ix);
    free(h);
}

/* The index, fed only by the engine's events, holds exactly the cache's hashes. */
static void check_faithful(harness_t *h)
{
    const kvr_kvcache_t *kc = kvr_engine_cache(h->e);
    size_t n = kvr_kvcache_cached_hashes(kc, NULL, 0);
    uint64_t *hs = calloc(n + 1, sizeof *hs);
    assert_non_null(hs);
    assert_int_equal(kvr_kvcache_cached_hashes(kc, hs, n), n);
    for (size_t i = 0; i < n; i++)
        assert_true(kvr_index_holds(h->ix, W, hs[i]) != 0);
    assert_int_equal(kvr_index_worker_pairs(h->ix, W), n);
    free(hs);
}

/* One step: begin, end, verify. Returns false when idle. */
static bool step(harness_t *h, kvr_engine_step_t *s)
{
    kvr_engine_step_t local;
    if (!s)
        s = &local;
    assert_int_equal(kvr_engine_step_begin(h->e, s), KVR_OK);
    if (s->idle)
        return false;
    assert_int_equal(kvr_engine_verify(h->e), KVR_OK);
    assert_int_equal(kvr_engine_step_end(h->e, on_out, h), KVR_OK);
    assert_int_equal(kvr_engine_verify(h->e), KVR_OK);
    h->total_ms += s->duration_ms;
    h->steps++;
    h->preempted += s->n_preempted;
    return true;
}

static void run_to_idle(harness_t *h)
{
    for (int guard = 0; guard < 1000000 && step(h, NULL); guard++)
        ;
    assert_false(kvr_engine_has_work(h->e));
}

static uint32_t *make_prompt(uint32_t n, uint32_t salt)
{
    uint32_t *t = malloc(n * sizeof *t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = (i * 2654435761u + salt * 40503u) % 30000u + 1u;
    return t;
}

static void add(harness_t *h, uint64_t id, const uint32_t *toks, uint32_t n, uint32_t max_tokens)
{
    kvr_engine_request_t r = {.id = id, .tokens = toks, .n_tokens = n, .max_tokens = max_tokens};
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_OK);
}

static double prefill_ms(double n)
{
    return 4.209989e-07 * n * n + 1.518344e-02 * n + 16.50142;
}

static const kvr_engine_output_t *last_of(const harness_t *h, uint64_t id)
{
    const kvr_engine_output_t *o = NULL;
    for (size_t i = 0; i < h->n_out; i++)
        if (h->out[i].id == id)
            o = &h->out[i];
    return o;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_config_errors(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    char err[200];
    kvr_engine_config_default(&c);
    assert_int_equal(kvr_engine_config_validate(&c, err, sizeof err), KVR_OK);
    c.block_size = 0;
    assert_int_equal(kvr_engine_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "block_size"));
    kvr_engine_config_default(&c);
    c.max_model_len = c.num_gpu_blocks * c.block_size + 1;
    assert_int_equal(kvr_engine_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "max_model_len"));
    kvr_engine_config_default(&c);
    c.enable_chunked_prefill = false;
    c.max_model_len = 16384;
    assert_int_equal(kvr_engine_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "max_num_batched_tokens"));
    kvr_engine_config_default(&c);
    c.timing.prefill_b = NAN;
    assert_int_equal(kvr_engine_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "prefill"));
    kvr_engine_config_default(&c);
    c.max_num_seqs = 0;
    int st;
    assert_null(kvr_engine_new(&c, NULL, NULL, &st));
    assert_int_equal(st, KVR_EINVAL);
}

static void test_request_errors(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    c.num_gpu_blocks = 64;
    c.max_waiting = 2;
    harness_t *h = harness_new(&c);
    uint32_t *p = make_prompt(1024, 1);
    kvr_engine_request_t r = {.id = 1, .tokens = p, .n_tokens = 0, .max_tokens = 4};
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_EINVAL);
    r.n_tokens = 10;
    r.max_tokens = 0;
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_EINVAL);
    r.n_tokens = 1024; /* capacity = 64 * 16 = 1024 = max_model_len */
    r.max_tokens = 1;
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_ETOOBIG);
    r.n_tokens = 1000;
    r.max_tokens = 24;
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_OK);
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_EEXIST);
    r.id = 2;
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_OK);
    r.id = 3;
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_EQUEUEFULL);
    assert_int_equal(kvr_engine_cancel(h->e, 99), KVR_ENOTFOUND);
    run_to_idle(h);
    free(p);
    harness_free(h);
}

/* One request: a prefill step then one decode step per further token; blocks released and
 * cached when it ends; timing follows the polynomials. */
static void test_single_request(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    harness_t *h = harness_new(&c);
    uint32_t *p = make_prompt(100, 2);
    add(h, 1, p, 100, 5);
    kvr_engine_step_t s;
    assert_true(step(h, &s));
    assert_int_equal(s.n_prefill_tokens, 100);
    assert_int_equal(s.n_decode, 0);
    assert_true(fabs(s.duration_ms - prefill_ms(100)) < 1e-9);
    assert_int_equal(h->n_out, 1);
    assert_true(h->out[0].first);
    assert_int_equal(h->out[0].cached_tokens, 0);
    assert_int_equal(h->out[0].prompt_tokens, 100);
    for (int i = 2; i <= 5; i++) {
        assert_true(step(h, &s));
        assert_int_equal(s.n_decode, 1);
        assert_int_equal(s.n_prefill_tokens, 0);
        /* 101..104 tokens computed fit in 7 blocks: u = 7 / 16384 */
        double u = 7.0 / 16384.0;
        assert_true(fabs(s.duration_ms - (-25.74 * u * u + 54.01 * u + 5.74)) < 1e-9);
        assert_int_equal(h->out[h->n_out - 1].n_output, i);
    }
    assert_int_equal(h->out[h->n_out - 1].finish, KVR_ENGINE_FINISHED_LENGTH);
    assert_false(kvr_engine_has_work(h->e));
    kvr_engine_stats_t st;
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.cache.n_active, 0);
    /* 100 prompt + 4 computed outputs = 104 tokens = 6 full blocks cached */
    assert_int_equal(st.cache.n_cached, 6);
    assert_int_equal(st.requests_finished, 1);
    assert_int_equal(st.generation_tokens, 5);
    check_faithful(h);
    free(p);
    harness_free(h);
}

/* The same prompt again hits the cache (all but the partial last block), prefills only the
 * rest, so its step is shorter, and generates the same tokens. */
static void test_prefix_hit_shortens_prefill(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    harness_t *h = harness_new(&c);
    uint32_t *p = make_prompt(1000, 3);
    add(h, 1, p, 1000, 3);
    kvr_engine_step_t s1, s2;
    assert_true(step(h, &s1));
    run_to_idle(h);
    size_t first_run = h->n_out;
    add(h, 2, p, 1000, 3);
    assert_true(step(h, &s2));
    assert_int_equal(h->out[first_run].cached_tokens, 992); /* 62 blocks of 16 */
    assert_int_equal(s2.n_prefill_tokens, 8);
    assert_true(fabs(s1.duration_ms - prefill_ms(1000)) < 1e-9);
    assert_true(fabs(s2.duration_ms - prefill_ms(8)) < 1e-9); /* 32.1 ms -> 16.6 ms */
    run_to_idle(h);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(h->out[i].token, h->out[first_run + i].token);
    /* a block-aligned prompt fully cached still computes its last block's last token */
    uint32_t *q = make_prompt(64, 4);
    add(h, 3, q, 64, 1);
    run_to_idle(h);
    add(h, 4, q, 64, 1);
    kvr_engine_step_t s3;
    assert_true(step(h, &s3));
    assert_int_equal(s3.n_prefill_tokens, 16);
    assert_int_equal(last_of(h, 4)->cached_tokens, 48);
    kvr_engine_stats_t st;
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.prefix_queries_tokens, 1000 + 1000 + 64 + 64);
    assert_int_equal(st.prefix_hits_tokens, 992 + 48);
    check_faithful(h);
    free(p);
    free(q);
    harness_free(h);
}

/* A prompt longer than the token budget is prefilled in chunks; running decodes go first. */
/* A LoRA adapter's blocks are its own: the same prompt under an adapter does not hit the base
 * model's cache (nor another adapter's), hits its own, and its stored events name it. */
static void test_lora_blocks_are_their_own(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    harness_t *h = harness_new(&c);
    uint32_t *p = make_prompt(1000, 5);
    add(h, 1, p, 1000, 1);
    run_to_idle(h);
    assert_null(h->last_lora);
    static const char sql[] = "sql";
    kvr_engine_request_t r = {
        .id = 2, .tokens = p, .n_tokens = 1000, .max_tokens = 1, .lora_name = sql};
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_OK);
    run_to_idle(h);
    assert_int_equal(last_of(h, 2)->cached_tokens, 0);
    assert_string_equal(h->last_lora, "sql");
    r.id = 3;
    assert_int_equal(kvr_engine_add(h->e, &r), KVR_OK);
    run_to_idle(h);
    assert_int_equal(last_of(h, 3)->cached_tokens, 992);
    check_faithful(h);
    free(p);
    harness_free(h);
}

static void test_chunked_prefill(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    harness_t *h = harness_new(&c);
    uint32_t *p = make_prompt(20000, 5);
    uint32_t *q = make_prompt(50, 6);
    add(h, 1, q, 50, 10);
    assert_true(step(h, NULL)); /* q prefilled */
    add(h, 2, p, 20000, 2);
    kvr_engine_step_t s;
    assert_true(step(h, &s));
    assert_int_equal(s.n_decode, 1);
    assert_int_equal(s.n_prefill_tokens, 8191);
    assert_true(step(h, &s));
    assert_int_equal(s.n_prefill_tokens, 8191);
    assert_null(last_of(h, 2));
    assert_true(step(h, &s));
    assert_int_equal(s.n_prefill_tokens, 20000 - 2 * 8191);
    assert_non_null(last_of(h, 2));
    assert_true(last_of(h, 2)->first);
    run_to_idle(h);
    check_faithful(h);
    free(p);
    free(q);
    /* without chunking, a prompt waits until it fits the budget whole */
    kvr_engine_config_default(&c);
    c.enable_chunked_prefill = false;
    c.num_gpu_blocks = 1024;
    c.max_model_len = 8192;
    harness_t *h2 = harness_new(&c);
    uint32_t *a = make_prompt(5000, 7), *b = make_prompt(5000, 8);
    add(h2, 1, a, 5000, 2);
    add(h2, 2, b, 5000, 2);
    assert_true(step(h2, &s));
    assert_int_equal(s.n_prefill_tokens, 5000);
    assert_int_equal(s.n_scheduled, 1);
    run_to_idle(h2);
    free(a);
    free(b);
    harness_free(h2);
    harness_free(h);
}

static void test_max_num_seqs(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    c.max_num_seqs = 3;
    harness_t *h = harness_new(&c);
    uint32_t *p[6];
    for (int i = 0; i < 6; i++) {
        p[i] = make_prompt(40, 10 + i);
        add(h, i + 1, p[i], 40, 4);
    }
    kvr_engine_step_t s;
    assert_true(step(h, &s));
    assert_int_equal(s.n_scheduled, 3);
    kvr_engine_stats_t st;
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.running, 3);
    assert_int_equal(st.waiting, 3);
    run_to_idle(h);
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.requests_finished, 6);
    for (int i = 0; i < 6; i++)
        free(p[i]);
    harness_free(h);
}

/* Outputs of one request under memory pressure (preempted and recomputed) are the same as
 * without pressure. */
static void test_preemption(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    c.block_size = 4;
    c.num_gpu_blocks = 24;
    c.max_model_len = 96;
    harness_t *h = harness_new(&c);
    uint32_t *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = make_prompt(20, 20 + i);
        add(h, i + 1, p[i], 20, 40);
    }
    run_to_idle(h);
    assert_true(h->preempted > 0);
    kvr_engine_stats_t st;
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.requests_finished, 4);
    assert_int_equal(st.preemptions, h->preempted);
    assert_int_equal(st.cache.n_active, 0);
    check_faithful(h);
    /* the same requests one at a time: identical token streams */
    kvr_engine_config_default(&c);
    harness_t *ref = harness_new(&c);
    for (int i = 0; i < 4; i++) {
        add(ref, i + 1, p[i], 20, 40);
        run_to_idle(ref);
    }
    assert_int_equal(ref->preempted, 0);
    for (uint64_t id = 1; id <= 4; id++) {
        uint32_t a[40], b[40];
        size_t na = 0, nb = 0;
        for (size_t i = 0; i < h->n_out; i++)
            if (h->out[i].id == id)
                a[na++] = h->out[i].token;
        for (size_t i = 0; i < ref->n_out; i++)
            if (ref->out[i].id == id)
                b[nb++] = ref->out[i].token;
        assert_int_equal(na, 40);
        assert_int_equal(nb, 40);
        assert_memory_equal(a, b, sizeof a);
    }
    for (int i = 0; i < 4; i++)
        free(p[i]);
    harness_free(ref);
    harness_free(h);
}

/* Cancelling frees the request's blocks whether it waits, runs, or is in the current step. */
static void test_cancel(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    c.max_num_seqs = 1;
    harness_t *h = harness_new(&c);
    uint32_t *p = make_prompt(200, 30), *q = make_prompt(200, 31);
    add(h, 1, p, 200, 100);
    add(h, 2, q, 200, 100);
    assert_true(step(h, NULL));
    assert_int_equal(kvr_engine_cancel(h->e, 2), KVR_OK); /* waiting */
    kvr_engine_stats_t st;
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.waiting, 0);
    assert_true(st.cache.n_active > 0);
    /* running, scheduled in the current step */
    kvr_engine_step_t s;
    assert_int_equal(kvr_engine_step_begin(h->e, &s), KVR_OK);
    assert_int_equal(kvr_engine_cancel(h->e, 1), KVR_OK);
    /* a request added during a step waits for the next one */
    add(h, 3, q, 200, 2);
    size_t before = h->n_out;
    assert_int_equal(kvr_engine_step_end(h->e, on_out, h), KVR_OK);
    assert_int_equal(h->n_out, before); /* no output for the cancelled request */
    assert_int_equal(kvr_engine_verify(h->e), KVR_OK);
    kvr_engine_get_stats(h->e, &st);
    assert_int_equal(st.cache.n_active, 0);
    assert_int_equal(st.requests_cancelled, 2);
    assert_int_equal(st.waiting, 1);
    assert_int_equal(kvr_engine_cancel(h->e, 1), KVR_ENOTFOUND);
    run_to_idle(h);
    assert_non_null(last_of(h, 3));
    check_faithful(h);
    free(p);
    free(q);
    harness_free(h);
}

/* Random workload: invariants after every step, the index fed by events equals the cache,
 * and a second run with the same seed gives the same outputs and durations. */
typedef struct run_summary {
    uint64_t digest;
    double total_ms;
    uint64_t preempted, stored, removed;
} run_summary_t;

/* A tiny engine under pressure: 64 blocks of 4 tokens, 8 sequences, 48 tokens a step. */
static kvr_engine_config_t tight_config(uint64_t seed)
{
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    c.block_size = 4;
    c.num_gpu_blocks = 64;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 48;
    c.seed = seed;
    return c;
}

static run_summary_t random_run(uint64_t seed, uint32_t n_requests, bool check_each)
{
    kvr_engine_config_t c = tight_config(seed);
    harness_t *h = harness_new(&c);
    uint64_t x = seed * 2 + 1;
    uint32_t *prefixes[4];
    for (int i = 0; i < 4; i++)
        prefixes[i] = make_prompt(64, 100 + i);
    uint32_t prompt[96];
    uint32_t added = 0;
    uint64_t next_id = 1;
    for (int guard = 0; guard < 200000; guard++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(x >> 33);
        if (added < n_requests && r % 3 == 0) {
            uint32_t shared = (r >> 4) % 40, len = shared + 1 + (r >> 10) % 40;
            memcpy(prompt, prefixes[(r >> 2) % 4], shared * sizeof *prompt);
            for (uint32_t i = shared; i < len; i++)
                prompt[i] = (uint32_t)((x >> 20) + i * 7919u) % 30000u + 1u;
            kvr_engine_request_t rq = {.id = next_id++, .tokens = prompt, .n_tokens = len,
                                       .max_tokens = 1 + (r >> 16) % 24};
            assert_int_equal(kvr_engine_add(h->e, &rq), KVR_OK);
            added++;
        } else if (r % 17 == 1 && next_id > 1) {
            (void)kvr_engine_cancel(h->e, 1 + (r >> 8) % (next_id - 1));
        } else if (!step(h, NULL) && added == n_requests) {
            break;
        }
        if (check_each)
            check_faithful(h);
    }
    run_to_idle(h);
    check_faithful(h);
    run_summary_t s = {.total_ms = h->total_ms, .preempted = h->preempted,
                       .stored = h->n_stored, .removed = h->n_removed};
    uint64_t d = 1469598103934665603ull;
    for (size_t i = 0; i < h->n_out; i++) {
        d = (d ^ h->out[i].id) * 1099511628211ull;
        d = (d ^ h->out[i].token) * 1099511628211ull;
        d = (d ^ h->out[i].cached_tokens) * 1099511628211ull;
    }
    s.digest = d;
    for (int i = 0; i < 4; i++)
        free(prefixes[i]);
    harness_free(h);
    return s;
}

/* Disaggregation: a prefill engine's hold_kv request keeps its blocks after its one token
 * (in use, not evictable, not resettable) until released; a decode engine's kv_loaded
 * request commits the transferred prompt blocks (STORED, so its index learns them), computes
 * only the last prompt token in a step costed as a decode, and generates what an aggregated
 * engine generates. */
static void test_disagg_hold_and_load(void **state)
{
    (void)state;
    kvr_engine_config_t c;
    kvr_engine_config_default(&c);
    harness_t *pf = harness_new(&c), *dc = harness_new(&c), *ag = harness_new(&c);
    uint32_t *p = make_prompt(1000, 9); /* 62 full blocks + 8 tokens */
    kvr_engine_request_t r = {
        .id = 1, .tokens = p, .n_tokens = 1000, .max_tokens = 1, .hold_kv = true};
    assert_int_equal(kvr_engine_add(pf->e, &r), KVR_OK);
    run_to_idle(pf);
    assert_int_equal(pf->n_out, 1);
    assert_int_equal(pf->out[0].kv_blocks, 63);
    kvr_engine_stats_t st;
    kvr_engine_get_stats(pf->e, &st);
    assert_int_equal(st.held, 1);
    assert_int_equal(st.held_blocks, 63);
    assert_int_equal(st.cache.n_active, 63);
    assert_int_equal(kvr_engine_reset_prefix_cache(pf->e), KVR_EBUSY);
    assert_int_equal(kvr_engine_release_held(pf->e, 2), KVR_ENOTFOUND);
    assert_int_equal(kvr_engine_release_held(pf->e, 1), KVR_OK);
    assert_int_equal(kvr_engine_release_held(pf->e, 1), KVR_ENOTFOUND);
    assert_int_equal(kvr_engine_verify(pf->e), KVR_OK);
    kvr_engine_get_stats(pf->e, &st);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.held_blocks, 0);
    assert_int_equal(st.cache.n_active, 0);
    assert_int_equal(st.held_released, 1);
    check_faithful(pf);
    /* a held request is cancelled like a live one */
    r.id = 3;
    assert_int_equal(kvr_engine_add(pf->e, &r), KVR_OK);
    assert_int_equal(kvr_engine_release_held(pf->e, 3), KVR_EINVAL); /* still waiting */
    run_to_idle(pf);
    assert_int_equal(kvr_engine_cancel(pf->e, 3), KVR_OK);
    kvr_engine_get_stats(pf->e, &st);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.cache.n_active, 0);
    assert_int_equal(kvr_engine_verify(pf->e), KVR_OK);

    kvr_engine_request_t d = {
        .id = 5, .tokens = p, .n_tokens = 1000, .max_tokens = 4, .kv_loaded = true};
    assert_int_equal(kvr_engine_add(dc->e, &d), KVR_OK);
    kvr_engine_step_t s;
    assert_true(step(dc, &s));
    assert_int_equal(s.n_prefill_tokens, 0);
    assert_int_equal(s.n_decode, 1);
    assert_true(s.duration_ms < 10.0); /* a decode step, not prefill(1000) = 32 ms */
    assert_int_equal(dc->n_out, 1);
    assert_int_equal(dc->out[0].cached_tokens, 0); /* none of it was in its own cache */
    assert_int_equal(dc->n_stored, 62);
    run_to_idle(dc);
    kvr_engine_get_stats(dc->e, &st);
    assert_int_equal(st.kv_loaded_requests, 1);
    assert_int_equal(st.kv_loaded_tokens, 999);
    check_faithful(dc);
    add(ag, 6, p, 1000, 4);
    run_to_idle(ag);
    assert_int_equal(ag->n_out, 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(ag->out[i].token, dc->out[i].token);
    /* the decode engine's cache now answers the prompt as the prefill engine's did */
    add(dc, 7, p, 1000, 1);
    run_to_idle(dc);
    assert_int_equal(last_of(dc, 7)->cached_tokens, 992);
    free(p);
    harness_free(pf);
    harness_free(dc);
    harness_free(ag);
}

static void test_random_workloads(void **state)
{
    (void)state;
    const char *scale = getenv("KVR_TEST_SCALE");
    int seeds = scale && strcmp(scale, "asan") == 0 ? 10 : 40;
    uint64_t preempted = 0, removed = 0;
    for (int sd = 1; sd <= seeds; sd++) {
        run_summary_t a = random_run((uint64_t)sd, 120, true);
        run_summary_t b = random_run((uint64_t)sd, 120, false);
        if (a.digest != b.digest || a.total_ms != b.total_ms) {
            fprintf(stderr, "seed %d: runs differ\n", sd);
            fail();
        }
        preempted += a.preempted;
        removed += a.removed;
    }
    assert_true(preempted > 0); /* the workload exercises preemption and eviction */
    assert_true(removed > 0);
    assert_true(random_run(1, 120, false).digest != random_run(2, 120, false).digest);
}

/* A clone (kvr_engine_clone), taken between steps or in the middle of one, does exactly what
 * its original does from then on: the same outputs, step times, preemptions and cache, over
 * random workloads with shared prefixes, cancellations, preemption and eviction. */
typedef struct outlog {
    kvr_engine_output_t out[4096];
    size_t n;
} outlog_t;

static void log_out(void *ctx, const kvr_engine_output_t *o)
{
    outlog_t *l = ctx;
    assert_true(l->n < 4096);
    l->out[l->n++] = *o;
}

static void same_step(kvr_engine_t *a, kvr_engine_t *b, outlog_t *la, outlog_t *lb)
{
    la->n = lb->n = 0;
    assert_int_equal(kvr_engine_step_end(a, log_out, la), KVR_OK);
    assert_int_equal(kvr_engine_step_end(b, log_out, lb), KVR_OK);
    assert_int_equal(la->n, lb->n);
    for (size_t i = 0; i < la->n; i++) {
        const kvr_engine_output_t *x = &la->out[i], *y = &lb->out[i];
        assert_int_equal(x->id, y->id);
        assert_int_equal(x->token, y->token);
        assert_int_equal(x->n_output, y->n_output);
        assert_int_equal(x->cached_tokens, y->cached_tokens);
        assert_int_equal(x->first, y->first);
        assert_int_equal(x->finish, y->finish);
    }
}

static void test_clone_runs_alike(void **state)
{
    (void)state;
    static outlog_t la, lb;
    kvr_engine_config_t c = tight_config(0);
    uint64_t compared_steps = 0, preempted = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) {
        harness_t *h = harness_new(&c);
        kvr_engine_t *b = NULL;
        uint64_t x = seed * 2 + 1, next_id = 1;
        uint32_t prefix[64], prompt[96];
        for (uint32_t i = 0; i < 64; i++)
            prefix[i] = i * 31u + 7u;
        int clone_at = 20 + (int)(seed * 13 % 60);
        for (int op = 0; op < 600; op++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(x >> 33);
            if (op == clone_at) { /* between steps, or (odd seeds) in the middle of one */
                kvr_engine_step_t st;
                bool mid = seed % 2 == 1 && kvr_engine_step_begin(h->e, &st) == KVR_OK && !st.idle;
                int rc;
                b = kvr_engine_clone(h->e, &rc);
                assert_non_null(b);
                assert_int_equal(kvr_engine_verify(b), KVR_OK);
                if (mid)
                    same_step(h->e, b, &la, &lb);
            }
            if (r % 3 == 0) {
                uint32_t shared = (r >> 4) % 40, len = shared + 1 + (r >> 10) % 40;
                memcpy(prompt, prefix, shared * sizeof *prompt);
                for (uint32_t i = shared; i < len; i++)
                    prompt[i] = (uint32_t)((x >> 20) + i * 7919u) % 30000u + 1u;
                kvr_engine_request_t rq = {.id = next_id++,
                                           .tokens = prompt,
                                           .n_tokens = len,
                                           .max_tokens = 1 + (r >> 16) % 24};
                int ra = kvr_engine_add(h->e, &rq);
                if (b != NULL)
                    assert_int_equal(kvr_engine_add(b, &rq), ra);
            } else if (r % 17 == 1 && next_id > 1) {
                uint64_t id = 1 + (r >> 8) % (next_id - 1);
                int ra = kvr_engine_cancel(h->e, id);
                if (b != NULL)
                    assert_int_equal(kvr_engine_cancel(b, id), ra);
            } else {
                kvr_engine_step_t sa, sb;
                assert_int_equal(kvr_engine_step_begin(h->e, &sa), KVR_OK);
                if (b == NULL) {
                    if (!sa.idle)
                        assert_int_equal(kvr_engine_step_end(h->e, NULL, NULL), KVR_OK);
                    continue;
                }
                assert_int_equal(kvr_engine_step_begin(b, &sb), KVR_OK);
                assert_int_equal(sa.idle, sb.idle);
                assert_true(sa.duration_ms == sb.duration_ms);
                assert_int_equal(sa.n_preempted, sb.n_preempted);
                preempted += sa.n_preempted;
                if (!sa.idle) {
                    same_step(h->e, b, &la, &lb);
                    compared_steps++;
                }
            }
        }
        assert_non_null(b);
        assert_int_equal(kvr_engine_verify(b), KVR_OK);
        kvr_engine_stats_t xa, xb;
        kvr_engine_get_stats(h->e, &xa);
        kvr_engine_get_stats(b, &xb);
        assert_int_equal(xa.cache.n_cached, xb.cache.n_cached);
        assert_int_equal(xa.cache.removed_blocks, xb.cache.removed_blocks);
        kvr_engine_free(b);
        harness_free(h);
    }
    assert_true(compared_steps > 1000);
    assert_true(preempted > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_single_request),
        cmocka_unit_test(test_prefix_hit_shortens_prefill),
        cmocka_unit_test(test_lora_blocks_are_their_own),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_max_num_seqs),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_disagg_hold_and_load),
        cmocka_unit_test(test_random_workloads),
        cmocka_unit_test(test_clone_runs_alike),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

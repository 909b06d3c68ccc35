/*
 * test_exclude.c: the tried set (kvr_route_req_t.exclude_ids): a caller retrying after a failed
 * attempt names the workers it tried, and no rank of theirs is picked, in every router mode,
 * by the selector itself, and by the scheduler for a queued request (whose copy keeps its own
 * list).
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

#include "base/rng.h"
#include "core/select.h"
#include "kvrouter/sched.h"

#define BS 16

typedef struct fx {
    kvr_index_t *ix;
    kvr_router_t *r;
    kvr_router_config_t cfg;
} fx_t;

static uint32_t toks[1024];

static void prompt(uint32_t base, size_t n)
{
    for (size_t i = 0; i < n; i++)
        toks[i] = base * 100000u + (uint32_t)i;
}

static void set(fx_t *f, const char *k, const char *v)
{
    char err[200];
    if (kvr_config_set(&f->cfg, k, v, err, sizeof err) != KVR_OK)
        fail_msg("%s=%s: %s", k, v, err);
}

static void add_worker(fx_t *f, uint64_t id)
{
    char err[200], text[64];
    kvr_worker_spec_t w;
    snprintf(text, sizeof text, "id=%llu", (unsigned long long)id);
    assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f->r, &w, err, sizeof err), KVR_OK);
}

/* A router in mode (NULL: the default) over workers 1..n. */
static void make(fx_t *f, const char *mode, int n)
{
    kvr_config_defaults(&f->cfg);
    set(f, "seed", "42");
    if (mode != NULL)
        set(f, "router_mode", mode);
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    int st;
    char err[200];
    f->ix = kvr_index_new(&ic, &st);
    assert_non_null(f->ix);
    f->r = kvr_router_new(&f->cfg, f->ix, &st, err, sizeof err);
    if (f->r == NULL)
        fail_msg("router: %s", err);
    for (int id = 1; id <= n; id++)
        add_worker(f, (uint64_t)id);
}

static void unmake(fx_t *f)
{
    kvr_router_free(f->r);
    kvr_index_free(f->ix);
}

/* The engine of worker id holds the first n_blocks of the current prompt. */
static void engine_stores(fx_t *f, uint64_t id, size_t n_blocks)
{
    uint64_t lbh[64], seq[64];
    assert_int_equal(kvr_hash_prompt(toks, n_blocks * BS, BS, NULL, lbh, seq, 64), (long)n_blocks);
    kvr_block_t b[64];
    for (size_t i = 0; i < n_blocks; i++)
        b[i] = (kvr_block_t){.ext = seq[i] ^ id, .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = {id, 0}, .blocks = b, .n_blocks = n_blocks};
    assert_int_equal(kvr_index_apply(f->ix, &ev), KVR_OK);
}

static int route_ex(fx_t *f, const uint64_t *ex, size_t n_ex, bool update, kvr_route_res_t *res)
{
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = 64,
                         .update_state = update,
                         .exclude_ids = ex,
                         .n_exclude = n_ex};
    return kvr_router_route(f->r, &q, 1000, res);
}

/* kv mode: the worker holding the prefix wins, unless it was tried; then the others. */
static void test_kv_mode_skips_tried(void **st)
{
    (void)st;
    fx_t f;
    make(&f, NULL, 3);
    prompt(1, 64);
    engine_stores(&f, 2, 4);
    kvr_route_res_t res;
    assert_int_equal(route_ex(&f, NULL, 0, false, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 2);
    assert_int_equal(res.device_blocks, 4);
    uint64_t tried[] = {2};
    for (int i = 0; i < 20; i++) {
        assert_int_equal(route_ex(&f, tried, 1, true, &res), KVR_OK);
        assert_int_not_equal(res.worker.worker_id, 2);
    }
    uint64_t all[] = {3, 1, 2, 2}; /* any order, repeats */
    assert_int_equal(route_ex(&f, all, 4, false, &res), KVR_ENOWORKER);
    /* a pinned rank that was tried is refused, as one outside allowed_ids */
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = 64,
                         .exclude_ids = tried,
                         .n_exclude = 1,
                         .has_pinned = true,
                         .pinned = {2, 0}};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_ENOTALLOWED);
    q.pinned = (kvr_worker_t){3, 0};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 3);
    assert_int_equal(route_ex(&f, NULL, 1, false, &res), KVR_EINVAL);
    assert_non_null(strstr(res.error_field, "exclude_ids"));
    unmake(&f);
}

/* The load-only modes filter the tried workers out before their pick. */
static void test_load_only_modes_skip_tried(void **st)
{
    (void)st;
    const char *modes[] = {"round-robin", "random", "least-loaded"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        fx_t f;
        make(&f, modes[m], 4);
        prompt(2, 64);
        uint64_t tried[] = {4, 1};
        bool seen[5] = {false};
        for (int i = 0; i < 24; i++) {
            kvr_route_res_t res;
            assert_int_equal(route_ex(&f, tried, 2, true, &res), KVR_OK);
            uint64_t id = res.worker.worker_id;
            assert_true(id == 2 || id == 3);
            seen[id] = true;
        }
        if (strcmp(modes[m], "least-loaded") != 0) /* the others spread over both */
            assert_true(seen[2] && seen[3]);
        kvr_route_res_t res;
        uint64_t all[] = {1, 2, 3, 4};
        assert_int_equal(route_ex(&f, all, 4, false, &res), KVR_ENOWORKER);
        unmake(&f);
    }
}

/* An empty tried set changes nothing: the same seed gives the same decisions. */
static void test_empty_set_is_no_set(void **st)
{
    (void)st;
    fx_t a, b;
    make(&a, "random", 5);
    make(&b, "random", 5);
    prompt(3, 64);
    uint64_t none[1] = {99};
    for (int i = 0; i < 30; i++) {
        kvr_route_res_t ra, rb;
        assert_int_equal(route_ex(&a, NULL, 0, true, &ra), KVR_OK);
        assert_int_equal(route_ex(&b, none, 1, true, &rb), KVR_OK); /* 99: no such worker */
        assert_int_equal(ra.worker.worker_id, rb.worker.worker_id);
    }
    unmake(&a);
    unmake(&b);
}

/* The selector on its own: a tried candidate is explained as excluded. */
static void test_selector_explains_excluded(void **st)
{
    (void)st;
    kvr_select_candidate_t c[3];
    for (int i = 0; i < 3; i++)
        c[i] = (kvr_select_candidate_t){.worker = {(uint64_t)i + 1, 0}, .has_load = true};
    c[1].device_blocks = 4; /* the best, but tried */
    uint64_t tried[] = {2};
    kvr_select_request_t req = {.isl_tokens = 64,
                                .block_size = BS,
                                .track_prefill_tokens = true,
                                .exclude_ids = tried,
                                .n_exclude = 1,
                                .cands = c,
                                .n_cands = 3};
    kvr_rng_t rng;
    kvr_rng_seed(&rng, 1);
    kvr_select_result_t out;
    kvr_select_explain_t ex[3];
    assert_int_equal(kvr_select(NULL, &req, &rng, &out, ex), KVR_OK);
    assert_int_not_equal(out.worker.worker_id, 2);
    assert_int_equal(out.n_eligible, 2);
    assert_int_equal(ex[1].why, KVR_SELECT_EXCLUDED);
    assert_string_equal(kvr_select_why_name(KVR_SELECT_EXCLUDED), "excluded");
    req.has_pinned = true;
    req.pinned = (kvr_worker_t){2, 0};
    assert_int_equal(kvr_select(NULL, &req, &rng, &out, NULL), KVR_ENOTALLOWED);
    req.has_pinned = false;
    req.exclude_ids = NULL;
    assert_int_equal(kvr_select(NULL, &req, &rng, &out, NULL), KVR_EINVAL);
    assert_string_equal(out.field, "exclude_ids");
}

static void on_done(void *arg, int rc, const kvr_route_res_t *res)
{
    kvr_route_res_t *out = arg;
    assert_int_equal(rc, KVR_OK);
    *out = *res;
}

/* The scheduler: a request queued with copy keeps its own copy of the tried set (the caller's
 * array may be gone by the dispatch), and the dispatch honours it. */
static void test_sched_copies_tried(void **st)
{
    (void)st;
    fx_t f;
    make(&f, NULL, 0);
    set(&f, "min_initial_workers", "3");
    kvr_sched_config_t sc;
    kvr_sched_config_from(&sc, &f.cfg);
    int rc;
    kvr_sched_t *s = kvr_sched_new(f.r, &sc, &rc, NULL);
    assert_non_null(s);
    prompt(4, 64);
    uint64_t *tried = malloc(2 * sizeof *tried);
    tried[0] = 1;
    tried[1] = 2;
    kvr_route_req_t q = {
        .tokens = toks, .n_tokens = 64, .update_state = true, .exclude_ids = tried, .n_exclude = 2};
    kvr_route_res_t res, done = {0};
    kvr_ticket_t t;
    kvr_place_t p = {.q = &q, .copy = true, .done = on_done, .arg = &done};
    assert_int_equal(kvr_sched_place(s, &p, 1000, &res, &t), KVR_OK);
    assert_true(t != 0);     /* waits for its workers */
    tried[0] = tried[1] = 3; /* the caller's array changes (then goes) */
    free(tried);
    for (uint64_t id = 1; id <= 3; id++)
        add_worker(&f, id);
    kvr_sched_tick(s, 1100);
    assert_int_equal(done.worker.worker_id, 3);
    char msg[200];
    assert_int_equal(kvr_sched_verify(s, msg, sizeof msg), KVR_OK);
    /* placed at once, the same */
    uint64_t again[] = {3, 2};
    q.exclude_ids = again;
    kvr_place_t now = {.q = &q};
    assert_int_equal(kvr_sched_place(s, &now, 1200, &res, &t), KVR_OK);
    assert_int_equal(t, 0);
    assert_int_equal(res.worker.worker_id, 1);
    kvr_sched_free(s);
    unmake(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_mode_skips_tried),
        cmocka_unit_test(test_load_only_modes_skip_tried),
        cmocka_unit_test(test_empty_set_is_no_set),
        cmocka_unit_test(test_selector_explains_excluded),
        cmocka_unit_test(test_sched_copies_tried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_router.c: the routing decision end to end in one process: worker specs, the cache-aware
 * pick (the worker holding the prefix wins; load breaks ties; load outweighs a small overlap),
 * booking and freeing, busy ranks, filters, approximate mode learning from its own decisions,
 * the non-KV modes, and /v1/query's every-rank listing.
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

#include "core/load.h"
#include "kvrouter/router.h"

#define BS 16

typedef struct fx {
    kvr_index_t *ix;
    kvr_router_t *r;
    kvr_router_config_t cfg;
} fx_t;

static uint32_t toks[4096];

static void prompt(uint32_t base, size_t n)
{
    for (size_t i = 0; i < n; i++)
        toks[i] = base * 100000u + (uint32_t)i;
}

/* A router of three workers (ids 1-3, each spec "id=N" + extra) in mode (NULL: the default),
 * with one more setting (name NULL: none). */
static void make_spec(fx_t *f, const char *mode, const char *name, const char *value,
                      const char *extra)
{
    kvr_config_defaults(&f->cfg);
    char err[200];
    assert_int_equal(kvr_config_set(&f->cfg, "seed", "42", err, sizeof err), KVR_OK);
    if (mode != NULL)
        assert_int_equal(kvr_config_set(&f->cfg, "router_mode", mode, err, sizeof err), KVR_OK);
    if (name != NULL)
        assert_int_equal(kvr_config_set(&f->cfg, name, value, err, sizeof err), KVR_OK);
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    int st;
    f->ix = kvr_index_new(&ic, &st);
    assert_non_null(f->ix);
    f->r = kvr_router_new(&f->cfg, f->ix, &st, err, sizeof err);
    if (f->r == NULL)
        fail_msg("router: %s", err);
    for (uint64_t id = 1; id <= 3; id++) {
        kvr_worker_spec_t w;
        char text[128];
        snprintf(text, sizeof text, "id=%llu%s", (unsigned long long)id, extra);
        assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
        assert_int_equal(kvr_router_add_worker(f->r, &w, err, sizeof err), KVR_OK);
    }
}

static void make_set(fx_t *f, const char *mode, const char *name, const char *value)
{
    make_spec(f, mode, name, value, "");
}

static void make(fx_t *f, const char *mode) { make_set(f, mode, NULL, NULL); }

static void unmake(fx_t *f)
{
    kvr_router_free(f->r);
    kvr_index_free(f->ix);
}

/* The engine of worker id reports it holds the first n_blocks of the current prompt. */
static void engine_stores(fx_t *f, uint64_t id, size_t n_blocks)
{
    uint64_t lbh[256], seq[256];
    long n = kvr_hash_prompt(toks, n_blocks * BS, BS, NULL, lbh, seq, 256);
    assert_int_equal(n, (long)n_blocks);
    kvr_block_t b[256];
    for (size_t i = 0; i < n_blocks; i++)
        b[i] = (kvr_block_t){.ext = seq[i] ^ id, .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = {id, 0}, .blocks = b, .n_blocks = n_blocks};
    assert_int_equal(kvr_index_apply(f->ix, &ev), KVR_OK);
}

static int route(fx_t *f, size_t n_tokens, bool update, kvr_route_res_t *res)
{
    kvr_route_req_t q = {.tokens = toks, .n_tokens = n_tokens, .update_state = update};
    return kvr_router_route(f->r, &q, 1000, res);
}

static void test_worker_spec_parsing(void **s)
{
    (void)s;
    kvr_worker_spec_t w;
    char err[200];
    assert_int_equal(kvr_worker_spec_parse("id=7,url=http://127.0.0.1:8001,events=tcp://127.0.0.1:5557,"
                                           "replay=tcp://127.0.0.1:5558,dp_size=2,taints=gpu;zone-a",
                                           &w, err, sizeof err),
                     KVR_OK);
    assert_int_equal(w.worker_id, 7);
    assert_string_equal(w.events, "tcp://127.0.0.1:5557");
    assert_int_equal(w.dp_size, 2);
    assert_int_equal(w.n_taints, 2);
    assert_string_equal(w.taints[1], "zone-a");
    assert_int_equal(kvr_worker_spec_parse("url=http://x", &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "id is required"));
    assert_int_equal(kvr_worker_spec_parse("id=-3", &w, err, sizeof err), KVR_EINVAL);
    assert_int_equal(kvr_worker_spec_parse("id=3,dp_size=0", &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "dp_size"));
    assert_int_equal(kvr_worker_spec_parse("id=3,colour=blue", &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "unknown key 'colour'"));
    assert_int_equal(kvr_worker_spec_parse("id=3,url=ftp://x", &w, err, sizeof err), KVR_EINVAL);
    assert_false(w.eagle);
    assert_int_equal(kvr_worker_spec_parse("id=3,eagle=true", &w, err, sizeof err), KVR_OK);
    assert_true(w.eagle);
    assert_int_equal(kvr_worker_spec_parse("id=3,eagle=yes", &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "eagle"));
}

/* A prompt shorter than one block, as the first request a router ever sees, routes. */
static void test_short_prompt_on_a_fresh_router(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(1, 8);
    kvr_route_res_t res;
    assert_int_equal(route(&f, BS - 1, true, &res), KVR_OK);
    assert_int_equal(res.overlap_blocks, 0);
    assert_int_equal(kvr_router_free_request(f.r, res.request_id, strlen(res.request_id), 1001),
                     KVR_OK);
    unmake(&f);
}

/* Ids the router hands out are "kvr-" and 128 random bits: never sequential, never repeated,
 * so a client cannot name (and free) another client's booking. */
static void test_generated_ids_unguessable(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(1, 8);
    enum { N = 200 };
    static char ids[N][48];
    for (int i = 0; i < N; i++) {
        kvr_route_res_t res;
        assert_int_equal(route(&f, BS * 2, true, &res), KVR_OK);
        assert_int_equal(strlen(res.request_id), 4 + 32);
        assert_memory_equal(res.request_id, "kvr-", 4);
        for (size_t k = 4; k < 36; k++)
            assert_non_null(strchr("0123456789abcdef", res.request_id[k]));
        for (int j = 0; j < i; j++)
            assert_string_not_equal(ids[j], res.request_id);
        memcpy(ids[i], res.request_id, 37); /* "kvr-" + 32 hex + NUL, checked above */
    }
    /* random bits: each hex digit position takes more than one value over 200 ids */
    for (size_t k = 4; k < 36; k++) {
        bool varied = false;
        for (int i = 1; i < N && !varied; i++)
            varied = ids[i][k] != ids[0][k];
        assert_true(varied);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(kvr_router_free_request(f.r, ids[i], strlen(ids[i]), 1001), KVR_OK);
    unmake(&f);
}

static void test_prefix_holder_wins(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(1, 1024);
    engine_stores(&f, 2, 64); /* worker 2 holds the whole 1K-token prompt */
    engine_stores(&f, 3, 8);
    kvr_route_res_t res;
    assert_int_equal(route(&f, 1024, false, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 2);
    assert_int_equal(res.overlap_blocks, 64);
    assert_int_equal(res.cached_tokens, 1024);
    /* an unrelated prompt: no overlap anywhere, all idle: any of the three */
    prompt(9, 1024);
    assert_int_equal(route(&f, 1024, false, &res), KVR_OK);
    assert_int_equal(res.overlap_blocks, 0);
    unmake(&f);
}

/* Worker roles: the prefill pool is the prefill workers, the serving pool the others; each
 * route stays in its pool, a pool without workers is KVR_ENOWORKER naming it, a prefill
 * booking without active blocks holds none, and a bootstrap port needs role=prefill. */
static void test_roles_split_pools(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL); /* workers 1..3, role both */
    char err[200];
    kvr_worker_spec_t w;
    assert_int_equal(
        kvr_worker_spec_parse("id=3,role=decode,bootstrap_port=8998", &w, err, sizeof err),
        KVR_EINVAL);
    assert_non_null(strstr(err, "bootstrap_port"));
    assert_int_equal(kvr_worker_spec_parse("id=3,role=middle", &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "role"));
    prompt(4, 512);
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 512, .pool = KVR_POOL_PREFILL};
    kvr_route_res_t res;
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_ENOWORKER);
    assert_non_null(strstr(res.error_field, "prefill"));
    for (uint64_t id = 10; id <= 11; id++) {
        char text[80];
        snprintf(text, sizeof text, "id=%llu,role=prefill%s", (unsigned long long)id,
                 id == 11 ? ",bootstrap_port=8998" : "");
        assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
        assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    }
    assert_int_equal(kvr_router_n_role(f.r, KVR_ROLE_PREFILL, true), 2);
    assert_int_equal(kvr_router_n_role(f.r, KVR_ROLE_BOTH, true), 3);
    engine_stores(&f, 10, 32); /* the prefill worker 10 holds the prompt */
    q.update_state = true;
    q.no_active_blocks = true;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
        assert_true(res.worker.worker_id == 10 || res.worker.worker_id == 11);
    }
    kvr_load_snapshot_t snap;
    kvr_load_snapshot(kvr_router_load(f.r), (kvr_worker_t){10, 0}, &snap);
    assert_int_equal(snap.active_blocks, 0);
    assert_true(snap.active_requests > 0);
    /* the serving pool never picks a prefill worker, even the one holding the prompt */
    kvr_route_req_t d = {.tokens = toks, .n_tokens = 512, .update_state = true};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(kvr_router_route(f.r, &d, 1000, &res), KVR_OK);
        assert_true(res.worker.worker_id >= 1 && res.worker.worker_id <= 3);
    }
    assert_int_equal(kvr_router_set_fenced(f.r, 10, true), KVR_OK);
    assert_int_equal(kvr_router_n_role(f.r, KVR_ROLE_PREFILL, true), 1);
    assert_int_equal(kvr_router_n_role(f.r, KVR_ROLE_PREFILL, false), 2);
    unmake(&f);
}

/* Conditional disaggregation: isl keeps a prompt the serving pool already caches (few new
 * tokens, under 70% of the prompt) local; load keeps it local when every prefill worker is
 * busy; always never does. */
static void test_disagg_bypass(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL); /* 1..3 serve */
    char err[200];
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse("id=10,role=prefill", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_disagg_state(f.r), KVR_DISAGG_ACTIVE);
    prompt(7, 512);
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 512};
    assert_int_equal(kvr_router_disagg_bypass(f.r, &q, 1000), KVR_BYPASS_NONE); /* always */
    kvr_router_free(f.r);
    kvr_config_set(&f.cfg, "disagg_policy", "isl-or-load", err, sizeof err);
    kvr_config_set(&f.cfg, "active_prefill_tokens_threshold", "100", err, sizeof err);
    int st;
    f.r = kvr_router_new(&f.cfg, f.ix, &st, err, sizeof err);
    assert_non_null(f.r);
    for (uint64_t id = 1; id <= 3; id++) {
        char text[32];
        snprintf(text, sizeof text, "id=%llu", (unsigned long long)id);
        assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
        assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    }
    assert_int_equal(kvr_worker_spec_parse("id=10,role=prefill", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_disagg_bypass(f.r, &q, 1000), KVR_BYPASS_NONE); /* cold, idle */
    engine_stores(&f, 2, 31); /* a serving worker holds 496 of the 512 tokens */
    assert_int_equal(kvr_router_disagg_bypass(f.r, &q, 1000), KVR_BYPASS_ISL);
    prompt(8, 512); /* a new prompt, the prefill worker busy */
    kvr_route_req_t busy = {.tokens = toks, .n_tokens = 512, .update_state = true};
    kvr_route_req_prefill_leg(&busy);
    kvr_route_res_t res;
    assert_int_equal(kvr_router_route(f.r, &busy, 1000, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 10);
    prompt(9, 512);
    assert_int_equal(kvr_router_disagg_bypass(f.r, &q, 1000), KVR_BYPASS_LOAD);
    /* disagg_load_threshold: busy by the prefill worker's tokens in flight alone */
    kvr_router_free(f.r);
    kvr_config_defaults(&f.cfg);
    kvr_config_set(&f.cfg, "disagg_policy", "load", err, sizeof err);
    kvr_config_set(&f.cfg, "disagg_load_threshold", "1000", err, sizeof err);
    f.r = kvr_router_new(&f.cfg, f.ix, &st, err, sizeof err);
    assert_non_null(f.r);
    assert_int_equal(kvr_worker_spec_parse("id=10,role=prefill", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_worker_spec_parse("id=1", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    busy.request_id = "b1";
    busy.request_id_len = 2;
    assert_int_equal(kvr_router_route(f.r, &busy, 1000, &res), KVR_OK); /* 512 in flight */
    assert_int_equal(kvr_router_disagg_bypass(f.r, &q, 1000), KVR_BYPASS_NONE);
    busy.request_id = "b2";
    assert_int_equal(kvr_router_route(f.r, &busy, 1000, &res), KVR_OK); /* 1024 */
    assert_int_equal(kvr_router_disagg_bypass(f.r, &q, 1000), KVR_BYPASS_LOAD);
    unmake(&f);
}

static void test_booking_spreads_load_and_free_releases(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    uint64_t seen[4] = {0};
    kvr_route_res_t res;
    /* three different cold prompts, booked: each lands on a different idle worker */
    for (uint32_t p = 0; p < 3; p++) {
        prompt(100 + p, 512);
        assert_int_equal(route(&f, 512, true, &res), KVR_OK);
        seen[res.worker.worker_id]++;
        kvr_load_snapshot_t snap;
        kvr_load_snapshot(kvr_router_load(f.r), res.worker, &snap);
        assert_int_equal(snap.active_prefill_tokens, 512);
    }
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 1);
    assert_int_equal(seen[3], 1);
    assert_int_equal(kvr_router_free_request(f.r, res.request_id, strlen(res.request_id), 2000),
                     KVR_OK);
    assert_int_equal(kvr_router_free_request(f.r, res.request_id, strlen(res.request_id), 2000),
                     KVR_ENOTFOUND);
    kvr_load_snapshot_t snap;
    kvr_load_snapshot(kvr_router_load(f.r), res.worker, &snap);
    assert_int_equal(snap.active_requests, 0);
    /* a caller-named duplicate in flight is refused */
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 64, .update_state = true,
                         .request_id = "abc", .request_id_len = 3};
    assert_int_equal(kvr_router_route(f.r, &q, 3000, &res), KVR_OK);
    assert_string_equal(res.request_id, "abc");
    assert_int_equal(kvr_router_route(f.r, &q, 3000, &res), KVR_EEXIST);
    kvr_router_stats_t st;
    kvr_router_stats(f.r, &st);
    assert_int_equal(st.rejected_duplicate, 1);
    unmake(&f);
}

/* The decode pool's per-request overrides reach the booking: with assume_kv_reuse and
 * track_prefill_tokens both off, two requests with the same prompt on one worker hold their
 * blocks twice and count no prefill; with the configuration's defaults, once and all of it. */
static void test_load_overrides_reach_the_booking(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(7, 256); /* 16 blocks */
    kvr_route_res_t res;
    for (unsigned k = 0; k < 2; k++) {
        char id[16];
        snprintf(id, sizeof id, "d%u", k);
        kvr_route_req_t q = {.tokens = toks,
                             .n_tokens = 256,
                             .update_state = true,
                             .has_pinned = true,
                             .pinned = {1, 0},
                             .request_id = id,
                             .request_id_len = strlen(id),
                             .has_assume_kv_reuse = true,
                             .assume_kv_reuse = false,
                             .has_track_prefill_tokens = true,
                             .track_prefill_tokens = false};
        assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
        assert_int_equal(res.worker.worker_id, 1);
    }
    kvr_load_snapshot_t snap;
    kvr_load_snapshot(kvr_router_load(f.r), (kvr_worker_t){1, 0}, &snap);
    assert_int_equal(snap.active_requests, 2);
    assert_int_equal(snap.active_prefill_tokens, 0);
    assert_int_equal(snap.unique_blocks, 32);
    /* a third one under the defaults dedups against neither (their hashes are private) and
     * counts its whole prompt as prefill */
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = 256,
                         .update_state = true,
                         .has_pinned = true,
                         .pinned = {1, 0},
                         .request_id = "a",
                         .request_id_len = 1};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    kvr_load_snapshot(kvr_router_load(f.r), (kvr_worker_t){1, 0}, &snap);
    assert_int_equal(snap.active_prefill_tokens, 256);
    assert_int_equal(snap.unique_blocks, 48);
    /* a fourth under the defaults shares the third's blocks; once a step of worker 1 has ended
     * (the third's prefill is under way), it is credited with them (the third is computing
     * them: router_inflight_credit_weight 1), so it adds no prefill */
    q.request_id = "b";
    assert_int_equal(kvr_router_worker_step(f.r, (kvr_worker_t){1, 0}, 1001000), KVR_OK);
    assert_int_equal(kvr_router_route(f.r, &q, 1001, &res), KVR_OK);
    assert_int_equal(res.cached_tokens, 256);
    kvr_load_snapshot(kvr_router_load(f.r), (kvr_worker_t){1, 0}, &snap);
    assert_int_equal(snap.unique_blocks, 48);
    assert_int_equal(snap.active_prefill_tokens, 256);
    /* the projection of a no-reuse query sees no overlap where a default one sees 16 blocks */
    kvr_load_query_t lq = {.seq = NULL, .n_seq = 0, .isl_tokens = 256};
    uint64_t lbh[16], seq[16];
    assert_int_equal(kvr_hash_prompt(toks, 256, BS, NULL, lbh, seq, 16), 16);
    lq.seq = seq;
    lq.n_seq = 16;
    kvr_load_projection_t p = {.worker = {1, 0}};
    assert_int_equal(kvr_load_project_one(kvr_router_load(f.r), &lq, &p), KVR_OK);
    assert_int_equal(p.overlap_blocks, 16);
    lq.assume_kv_reuse = KVR_LOAD_OFF;
    assert_int_equal(kvr_load_project_one(kvr_router_load(f.r), &lq, &p), KVR_OK);
    assert_int_equal(p.overlap_blocks, 0);
    char msg[200];
    assert_int_equal(kvr_load_verify(kvr_router_load(f.r), msg, sizeof msg), KVR_OK);
    unmake(&f);
}

/* The queue threshold decides only whether a request waits (reference 5.7): worker 1 is over
 * it (128 prefill tokens > 0.1 x 1000) but holds the prompt's prefix, worker 2 is idle: the
 * request is not queued and goes to worker 1, the cheaper one. (It went to worker 2 when the
 * threshold removed busy ranks from the candidates.) */
/* A burst on a new prefix: the second request finds the worker computing it. Worker 1 is
 * prefilling prompt 7 (routed, no KV event yet); worker 2 a short other prompt; worker 3 is
 * excluded. Without the in-flight credit the second request of prompt 7 goes to worker 2 (less
 * load); with it, to worker 1, credited with the 16 blocks it is computing (predicted, not
 * device); once worker 1's events report them, they are device blocks and nothing is
 * predicted any more (never counted twice); the booking ending ends the credit. */
static void burst_second(const char *weight, uint64_t want, uint32_t want_predicted,
                         bool stored)
{
    fx_t f;
    make_set(&f, NULL, "router_inflight_credit_weight", weight);
    uint64_t ex[1] = {3};
    prompt(9, 64); /* 4 blocks, another prompt, on worker 2 */
    kvr_route_res_t res;
    kvr_route_req_t c = {.tokens = toks, .n_tokens = 64, .update_state = true,
                         .has_pinned = true, .pinned = {2, 0}, .request_id = "c",
                         .request_id_len = 1};
    assert_int_equal(kvr_router_route(f.r, &c, 1000, &res), KVR_OK);
    prompt(7, 256); /* 16 blocks */
    kvr_route_req_t a = {.tokens = toks, .n_tokens = 256, .update_state = true,
                         .has_pinned = true, .pinned = {1, 0}, .request_id = "a",
                         .request_id_len = 1};
    assert_int_equal(kvr_router_route(f.r, &a, 1000, &res), KVR_OK);
    kvr_route_req_t b = {.tokens = toks, .n_tokens = 256, .update_state = true,
                         .exclude_ids = ex, .n_exclude = 1, .request_id = "b",
                         .request_id_len = 1};
    kvr_rank_score_t sc[3];
    size_t n;
    assert_int_equal(kvr_router_query(f.r, &b, sc, 3, &n), KVR_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(sc[i].device_blocks, 0);
        assert_int_equal(sc[i].predicted_blocks, sc[i].worker.worker_id == 1 ? 16 : 0);
    }
    assert_int_equal(kvr_router_route(f.r, &b, 1000, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, want);
    assert_int_equal(res.device_blocks, 0);
    assert_int_equal(res.predicted_blocks, want_predicted);
    kvr_router_stats_t st;
    kvr_router_stats(f.r, &st);
    assert_int_equal(st.inflight_credited, want_predicted > 0 ? 1 : 0);
    assert_int_equal(st.inflight_credited_blocks, want_predicted);
    assert_int_equal(st.inflight_watched, want_predicted > 0 ? 1 : 0);
    if (stored) {
        engine_stores(&f, 1, 16);
        assert_int_equal(kvr_router_query(f.r, &b, sc, 3, &n), KVR_OK);
        for (size_t i = 0; i < n; i++)
            if (sc[i].worker.worker_id == 1) {
                assert_int_equal(sc[i].device_blocks, 16);
                assert_int_equal(sc[i].predicted_blocks, 0);
            }
    }
    kvr_router_tick(f.r, 1000 + 29999); /* inside the window: only a report settles it */
    kvr_router_stats(f.r, &st);
    assert_int_equal(st.inflight_confirmed, stored && want_predicted > 0 ? 1 : 0);
    assert_int_equal(st.inflight_expired, 0);
    kvr_router_tick(f.r, 1000 + 29999 + 1000); /* the next check (once a second), past 30 s */
    kvr_router_stats(f.r, &st);
    assert_int_equal(st.inflight_expired, !stored && want_predicted > 0 ? 1 : 0);
    assert_int_equal(st.inflight_watched, 0);
    unmake(&f);
}

static void test_burst_finds_the_prefix_in_flight(void **s)
{
    (void)s;
    burst_second("0", 2, 0, true);
    burst_second("1", 1, 16, true);  /* its events come: confirmed */
    burst_second("1", 1, 16, false); /* they never do: expired after 30 s */
}

/* The predicted blocks of worker id's rank for the current prompt's first n_tokens. */
static uint32_t predicted_on(fx_t *f, uint64_t id, size_t n_tokens)
{
    kvr_route_req_t q = {.tokens = toks, .n_tokens = n_tokens};
    kvr_rank_score_t sc[3];
    size_t n;
    assert_int_equal(kvr_router_query(f->r, &q, sc, 3, &n), KVR_OK);
    for (size_t i = 0; i < n; i++)
        if (sc[i].worker.worker_id == id)
            return sc[i].predicted_blocks;
    fail_msg("no rank of worker %llu", (unsigned long long)id);
    return 0;
}

static void book_on(fx_t *f, uint64_t id, size_t n_tokens, const char *rid, uint64_t now_ms)
{
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = n_tokens,
                         .update_state = true,
                         .has_pinned = true,
                         .pinned = {id, 0},
                         .request_id = rid,
                         .request_id_len = strlen(rid)};
    kvr_route_res_t res;
    assert_int_equal(kvr_router_route(f->r, &q, now_ms, &res), KVR_OK);
}

/* A burst on a new prefix is credited only with what its admission will find computed. Worker
 * 2 runs a step for a short prompt when prompt 7 (1024 tokens) is booked there: its prefill
 * waits for that step, so a second request with prompt 7 would be batched with it and compute
 * it again: no credit, and it goes to an idle worker. Once that step has ended (the prefill is
 * under way, in one step of at most 8192 tokens, the chunk assumed when the worker does not
 * say), the same request is credited with all 64 blocks and joins it. */
static void test_burst_waits_for_the_prefill_to_begin(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(9, 64);
    book_on(&f, 2, 64, "c", 1000); /* worker 2 was idle: its step begins now */
    prompt(7, 1024);
    book_on(&f, 2, 1024, "a", 1001); /* behind c's step */
    assert_int_equal(predicted_on(&f, 2, 1024), 0);
    kvr_route_res_t res;
    kvr_route_req_t b = {.tokens = toks,
                         .n_tokens = 1024,
                         .update_state = true,
                         .request_id = "b",
                         .request_id_len = 1};
    assert_int_equal(kvr_router_route(f.r, &b, 1002, &res), KVR_OK);
    assert_int_not_equal(res.worker.worker_id, 2);
    assert_int_equal(res.predicted_blocks, 0);
    assert_int_equal(kvr_router_free_request(f.r, "b", 1, 1002), KVR_OK);
    /* c's step ends: a's prefill is the step under way */
    assert_int_equal(kvr_router_worker_step(f.r, (kvr_worker_t){2, 0}, 1010 * 1000), KVR_OK);
    assert_int_equal(predicted_on(&f, 2, 1024), 64);
    assert_int_equal(kvr_router_route(f.r, &b, 1011, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 2);
    assert_int_equal(res.predicted_blocks, 64);
    assert_int_equal(res.cached_tokens, 1024);
    unmake(&f);
}

/* With a chunk of 128 tokens (max_num_batched_tokens on the worker), a 500-token prompt is
 * computed over four steps: a request with its prefix booked behind it waits for the three
 * whole chunks the stream ahead of it fills and finds those cached (24 blocks), not the last
 * chunk, which the engine computes in the step that admits it (beside it, so computed twice).
 * When the prompt's first token comes, all of it is computed: the 31 full blocks. */
/* KV memory near full: worker 1 has finished prefilling an 85-block prompt, worker 2 is still
 * prefilling a 25-block one. A 10-block prompt costs (10) x (95 + 1) on worker 1 against
 * (25 + 10) x (35 + 1) on worker 2 by prefill and decode alone; with both caches registered at
 * 100 blocks, worker 1 would be booked 5 blocks past 90% of its cache, which count as prefill
 * (15 x 96 > 35 x 36): the request goes to worker 2. Without a registered capacity, to 1;
 * and to 1 when a rank holds the prompt (the memory term counts what no rank holds). */
static uint64_t memory_pick(const char *extra, bool held)
{
    fx_t f;
    make_spec(&f, NULL, NULL, NULL, extra);
    kvr_route_res_t res;
    uint64_t ex[1] = {3};
    prompt(1, 85 * BS);
    kvr_route_req_t a1 = {.tokens = toks, .n_tokens = 85 * BS, .update_state = true,
                          .has_pinned = true, .pinned = {1, 0}, .request_id = "a1",
                          .request_id_len = 2};
    assert_int_equal(kvr_router_route(f.r, &a1, 1000, &res), KVR_OK);
    assert_int_equal(kvr_router_first_token(f.r, "a1", 2, 1001), KVR_OK);
    prompt(2, 25 * BS);
    kvr_route_req_t a2 = {.tokens = toks, .n_tokens = 25 * BS, .update_state = true,
                          .has_pinned = true, .pinned = {2, 0}, .request_id = "a2",
                          .request_id_len = 2};
    assert_int_equal(kvr_router_route(f.r, &a2, 1001, &res), KVR_OK);
    if (held) { /* worker 3 prefilling 200 blocks, but holding the whole next prompt */
        prompt(4, 200 * BS);
        kvr_route_req_t a3 = {.tokens = toks, .n_tokens = 200 * BS, .update_state = true,
                              .has_pinned = true, .pinned = {3, 0}, .request_id = "a3",
                              .request_id_len = 2};
        assert_int_equal(kvr_router_route(f.r, &a3, 1001, &res), KVR_OK);
    }
    prompt(3, 10 * BS);
    if (held)
        engine_stores(&f, 3, 10);
    kvr_route_req_t b = {.tokens = toks, .n_tokens = 10 * BS, .update_state = true,
                         .exclude_ids = ex, .n_exclude = held ? 0 : 1, .request_id = "b",
                         .request_id_len = 1};
    assert_int_equal(kvr_router_route(f.r, &b, 1002, &res), KVR_OK);
    uint64_t got = res.worker.worker_id;
    unmake(&f);
    return got;
}

static void test_memory_near_full_steers(void **s)
{
    (void)s;
    assert_int_equal(memory_pick(",total_kv_blocks=100", false), 2);
    assert_int_equal(memory_pick(",total_kv_blocks=1000", false), 1); /* far below the line */
    assert_int_equal(memory_pick("", false), 1);                      /* capacity unknown */
    /* the whole prompt cached on worker 3, eligible but busy: the memory term counts the
     * share of the prompt no rank holds, none, and worker 1's shorter queue wins again */
    assert_int_equal(memory_pick(",total_kv_blocks=100", true), 1);
}

static void test_burst_credit_a_chunk_at_a_time(void **s)
{
    (void)s;
    fx_t f;
    make_spec(&f, NULL, NULL, NULL, ",max_num_batched_tokens=128");
    prompt(9, 64);
    book_on(&f, 2, 64, "c", 1000);
    prompt(7, 500);
    book_on(&f, 2, 500, "a", 1001);
    assert_int_equal(predicted_on(&f, 2, 500), 24);
    assert_int_equal(kvr_router_worker_step(f.r, (kvr_worker_t){2, 0}, 1010 * 1000), KVR_OK);
    assert_int_equal(predicted_on(&f, 2, 500), 24); /* c's step ended: the same steps remain */
    assert_int_equal(kvr_router_first_token(f.r, "a", 1, 1100), KVR_OK);
    assert_int_equal(predicted_on(&f, 2, 500), 31);
    unmake(&f);
}

static void test_queue_threshold_does_not_filter(void **s)
{
    (void)s;
    fx_t f;
    kvr_config_defaults(&f.cfg);
    char err[200];
    assert_int_equal(kvr_config_set(&f.cfg, "seed", "42", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_set(&f.cfg, "router_queue_threshold", "0.1", err, sizeof err),
                     KVR_OK);
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    int st;
    f.ix = kvr_index_new(&ic, &st);
    f.r = kvr_router_new(&f.cfg, f.ix, &st, err, sizeof err);
    if (f.r == NULL)
        fail_msg("router: %s", err);
    for (uint64_t id = 1; id <= 2; id++) {
        kvr_worker_spec_t w;
        char text[64];
        snprintf(text, sizeof text, "id=%llu,max_num_batched_tokens=1000", (unsigned long long)id);
        assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
        assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    }
    prompt(3, 128);
    kvr_route_res_t res;
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = 128,
                         .update_state = true,
                         .has_pinned = true,
                         .pinned = {1, 0}};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    prompt(4, 1024);
    engine_stores(&f, 1, 64);
    q = (kvr_route_req_t){.tokens = toks, .n_tokens = 1024, .update_state = false};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 1);
    /* both over it: the request waits */
    prompt(5, 256);
    q = (kvr_route_req_t){.tokens = toks,
                          .n_tokens = 256,
                          .update_state = true,
                          .has_pinned = true,
                          .pinned = {2, 0}};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    prompt(4, 1024);
    q = (kvr_route_req_t){.tokens = toks, .n_tokens = 1024, .update_state = false};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_EBUSY);
    unmake(&f);
}

/* Sticky sessions: a session's later requests go to the rank of its first while that rank is
 * eligible, even where load alone would pick another; a fenced rank is left (and the session
 * rebound); close ends the binding; queries never bind. */
static void test_sticky_sessions(void **s)
{
    (void)s;
    fx_t f;
    make_set(&f, NULL, "session_ttl_secs", "300"); /* off by default, as the reference's */
    kvr_route_res_t res;
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = 512,
                         .update_state = true,
                         .session_id = "conv-1",
                         .session_id_len = 6};
    prompt(300, 512);
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    uint64_t bound = res.worker.worker_id;
    /* unrelated prompts of the same session: load says "another worker", the session says
     * "the same one" */
    for (uint32_t k = 1; k <= 3; k++) {
        prompt(300 + k, 512);
        assert_int_equal(kvr_router_route(f.r, &q, 1000 + k, &res), KVR_OK);
        assert_int_equal(res.worker.worker_id, bound);
    }
    /* without the session the same prompt goes elsewhere (the bound worker is loaded) */
    kvr_route_req_t plain = q;
    plain.session_id = NULL;
    plain.session_id_len = 0;
    prompt(310, 512);
    assert_int_equal(kvr_router_route(f.r, &plain, 1010, &res), KVR_OK);
    assert_true(res.worker.worker_id != bound);
    kvr_session_stats_t ss;
    kvr_router_session_stats(f.r, &ss);
    assert_true(ss.binds == 1 && ss.hits == 3 && ss.live == 1);
    /* the bound worker fenced: routed elsewhere and rebound */
    assert_int_equal(kvr_router_set_fenced(f.r, bound, true), KVR_OK);
    prompt(320, 512);
    assert_int_equal(kvr_router_route(f.r, &q, 1020, &res), KVR_OK);
    uint64_t moved = res.worker.worker_id;
    assert_true(moved != bound);
    kvr_router_session_stats(f.r, &ss);
    assert_int_equal(ss.rebinds, 1);
    assert_int_equal(kvr_router_set_fenced(f.r, bound, false), KVR_OK);
    prompt(321, 512);
    assert_int_equal(kvr_router_route(f.r, &q, 1021, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, moved); /* it stays where it was rebound */
    /* close: the request still goes there; the binding ends */
    q.session_close = true;
    prompt(322, 512);
    assert_int_equal(kvr_router_route(f.r, &q, 1022, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, moved);
    kvr_router_session_stats(f.r, &ss);
    assert_true(ss.closed == 1 && ss.live == 0);
    /* a query (update_state false) never binds; an id over 128 bytes is refused, named */
    q.session_close = false;
    q.update_state = false;
    assert_int_equal(kvr_router_route(f.r, &q, 1023, &res), KVR_OK);
    kvr_router_session_stats(f.r, &ss);
    assert_int_equal(ss.live, 0);
    char longid[200];
    memset(longid, 'x', sizeof longid);
    q.session_id = longid;
    q.session_id_len = sizeof longid;
    assert_int_equal(kvr_router_route(f.r, &q, 1024, &res), KVR_EINVAL);
    assert_non_null(strstr(res.error_field, "session_id"));
    /* expiry: session_ttl_secs (300 s) after its last request */
    q = (kvr_route_req_t){.tokens = toks,
                          .n_tokens = 512,
                          .update_state = true,
                          .session_id = "conv-2",
                          .session_id_len = 6};
    assert_int_equal(kvr_router_route(f.r, &q, 2000, &res), KVR_OK);
    kvr_router_tick(f.r, 2000 + 299999);
    kvr_router_session_stats(f.r, &ss);
    assert_int_equal(ss.live, 1);
    kvr_router_tick(f.r, 2000 + 300000);
    kvr_router_session_stats(f.r, &ss);
    assert_true(ss.live == 0 && ss.expired == 1);
    unmake(&f);
}

static void add(fx_t *f, const char *text)
{
    kvr_worker_spec_t w;
    char err[200];
    if (kvr_worker_spec_parse(text, &w, err, sizeof err) != KVR_OK)
        fail_msg("%s: %s", text, err);
    if (kvr_router_add_worker(f->r, &w, err, sizeof err) != KVR_OK)
        fail_msg("%s: %s", text, err);
}

/* Model pools: a request naming a model goes only to that model's workers, hashed with that
 * model's block size (so an engine with 32-token blocks matches); an unknown model is
 * KVR_ENOMODEL; a model's workers must agree on block size; LoRA adapters narrow the pool to
 * the workers declaring them (any worker of the model when none does, unless lora_strict). */
static void test_model_pools_and_adapters(void **s)
{
    (void)s;
    fx_t f;
    kvr_config_defaults(&f.cfg);
    char err[200];
    assert_int_equal(kvr_config_set(&f.cfg, "seed", "42", err, sizeof err), KVR_OK);
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    int st;
    f.ix = kvr_index_new(&ic, &st);
    f.r = kvr_router_new(&f.cfg, f.ix, &st, err, sizeof err);
    assert_non_null(f.r);
    add(&f, "id=1,model=a");
    add(&f, "id=2,model=b,block_size=32");
    add(&f, "id=3,model=a,loras=sql;chat");
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse("id=4,model=b", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "model 'b' is served with block_size 32"));
    prompt(9, 256);
    kvr_route_res_t res;
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 256, .model = "b", .model_len = 1};
    assert_int_equal(kvr_router_n_blocks(f.r, &q), 8); /* 256 / 32 */
    /* worker 2's engine holds the prompt's first 8 blocks of 32 tokens */
    uint64_t lbh[8], seq[8];
    assert_int_equal(kvr_hash_prompt(toks, 256, 32, NULL, lbh, seq, 8), 8);
    kvr_block_t b[8];
    for (size_t i = 0; i < 8; i++)
        b[i] = (kvr_block_t){.ext = seq[i] ^ 2, .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = {2, 0}, .blocks = b, .n_blocks = 8};
    assert_int_equal(kvr_index_apply(f.ix, &ev), KVR_OK);
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 2);
    assert_int_equal(res.device_blocks, 8);
    assert_int_equal(res.block_size, 32);
    for (int k = 0; k < 6; k++) { /* model a never reaches worker 2 */
        q = (kvr_route_req_t){.tokens = toks, .n_tokens = 256, .model = "a", .model_len = 1};
        assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
        assert_true(res.worker.worker_id == 1 || res.worker.worker_id == 3);
        assert_int_equal(res.block_size, 16);
    }
    q.model = "c";
    kvr_router_stats_t before, after;
    kvr_router_stats(f.r, &before);
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_ENOMODEL);
    assert_non_null(strstr(res.error_field, "model"));
    kvr_router_stats(f.r, &after); /* a client's wrong model, not a fleet without workers */
    assert_int_equal(after.rejected_nomodel, before.rejected_nomodel + 1);
    assert_int_equal(after.rejected_noworker, before.rejected_noworker);
    /* adapters: declared by worker 3 only */
    q = (kvr_route_req_t){.tokens = toks,
                          .n_tokens = 256,
                          .model = "a",
                          .model_len = 1,
                          .lora_name = "sql",
                          .lora_name_len = 3};
    for (int k = 0; k < 6; k++) {
        assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
        assert_int_equal(res.worker.worker_id, 3);
    }
    /* the adapter named as the model (as vLLM takes it) */
    assert_true(kvr_router_is_adapter(f.r, "chat", 4));
    assert_false(kvr_router_is_adapter(f.r, "a", 1));
    assert_false(kvr_router_is_adapter(f.r, "nope", 4));
    q = (kvr_route_req_t){.tokens = toks,
                          .n_tokens = 256,
                          .model = "chat",
                          .model_len = 4,
                          .lora_name = "chat",
                          .lora_name_len = 4};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 3);
    /* adapters an engine lists (learned) count as declared, kept apart from the registration */
    assert_int_equal(kvr_router_set_learned_loras(f.r, 1, "tuned"), KVR_OK);
    assert_string_equal(kvr_router_learned_loras(f.r, 1), "tuned");
    q = (kvr_route_req_t){.tokens = toks,
                          .n_tokens = 256,
                          .model = "a",
                          .model_len = 1,
                          .lora_name = "tuned",
                          .lora_name_len = 5};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
        assert_int_equal(res.worker.worker_id, 1);
    }
    assert_int_equal(kvr_router_set_learned_loras(f.r, 99, "x"), KVR_ENOTFOUND);
    /* an adapter nobody declares: any worker of the model, unless lora_strict */
    q = (kvr_route_req_t){.tokens = toks,
                          .n_tokens = 256,
                          .model = "a",
                          .model_len = 1,
                          .lora_name = "new",
                          .lora_name_len = 3};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_OK);
    assert_true(res.worker.worker_id == 1 || res.worker.worker_id == 3);
    unmake(&f);
    kvr_config_defaults(&f.cfg);
    assert_int_equal(kvr_config_set(&f.cfg, "lora_strict", "true", err, sizeof err), KVR_OK);
    f.ix = kvr_index_new(&ic, &st);
    f.r = kvr_router_new(&f.cfg, f.ix, &st, err, sizeof err);
    add(&f, "id=1,model=a,loras=sql");
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_ENOMODEL);
    assert_non_null(strstr(res.error_field, "lora_name"));
    unmake(&f);
}

static void test_busy_and_filters(void **s)
{
    (void)s;
    fx_t f;
    kvr_config_defaults(&f.cfg);
    make(&f, NULL);
    kvr_router_free(f.r);
    char err[200];
    assert_int_equal(kvr_config_set(&f.cfg, "active_prefill_tokens_threshold", "1000", err, sizeof err),
                     KVR_OK);
    int st;
    f.r = kvr_router_new(&f.cfg, f.ix, &st, err, sizeof err);
    assert_non_null(f.r);
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse("id=1,taints=gpu", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_worker_spec_parse("id=2", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_EEXIST);
    kvr_route_res_t res;
    prompt(5, 2048);
    /* two 2K-token prompts make both workers busy (> 1000 prefill tokens) */
    assert_int_equal(route(&f, 2048, true, &res), KVR_OK);
    prompt(6, 2048);
    assert_int_equal(route(&f, 2048, true, &res), KVR_OK);
    prompt(7, 64);
    assert_int_equal(route(&f, 64, true, &res), KVR_EBUSY);
    /* required taint: only worker 1 qualifies */
    const char *req_t[] = {"gpu"};
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 64, .required_taints = req_t, .n_required = 1};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_EBUSY);
    const char *no_t[] = {"tpu"};
    q.required_taints = no_t;
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_ENOWORKER);
    /* fencing both: nothing can serve */
    kvr_router_set_fenced(f.r, 1, true);
    kvr_router_set_fenced(f.r, 2, true);
    assert_int_equal(route(&f, 64, false, &res), KVR_ENOWORKER);
    /* too long */
    q = (kvr_route_req_t){.tokens = toks, .n_tokens = 3000000};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &res), KVR_ETOOBIG);
    unmake(&f);
}

static void sink_capacity(void *arg, const kvr_decision_t *d)
{
    *(uint64_t *)arg = d->capacity_blocks;
}

static void test_approx_mode_learns_from_decisions(void **s)
{
    (void)s;
    fx_t f;
    make(&f, "approx");
    prompt(3, 800);
    kvr_route_res_t a, b;
    assert_int_equal(route(&f, 800, true, &a), KVR_OK);
    kvr_router_free_request(f.r, a.request_id, strlen(a.request_id), 1500);
    /* the same prompt again: its blocks are now recorded on the first worker */
    assert_int_equal(route(&f, 800, false, &b), KVR_OK);
    assert_int_equal(b.worker.worker_id, a.worker.worker_id);
    assert_int_equal(b.overlap_blocks, 50);
    /* after the TTL (120 s) the decision is forgotten */
    kvr_router_tick(f.r, 1000 + 121000);
    kvr_rank_score_t sc[8];
    size_t n;
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 800};
    assert_int_equal(kvr_router_query(f.r, &q, sc, 8, &n), KVR_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sc[i].device_blocks, 0);
    unmake(&f);
}

/* Device blocks of the current prompt (first n_tokens) on worker id. */
static uint32_t held_by(fx_t *f, size_t n_tokens, uint64_t id)
{
    kvr_rank_score_t sc[8];
    size_t n;
    kvr_route_req_t q = {.tokens = toks, .n_tokens = n_tokens};
    assert_int_equal(kvr_router_query(f->r, &q, sc, 8, &n), KVR_OK);
    for (size_t i = 0; i < n; i++)
        if (sc[i].worker.worker_id == id)
            return sc[i].device_blocks;
    return 0;
}

/* Approximate mode with a known cache size: the router's request lifecycle drives the model
 * (routed: recorded; first token: held; free: back in the LRU), so a running request's blocks
 * outlive newer decisions and a finished one's age out in the order they were freed. */
static void test_approx_mode_follows_requests(void **s)
{
    (void)s;
    fx_t f;
    make(&f, "approx");
    assert_int_equal(kvr_router_set_capacity(f.r, 1, 60), KVR_OK);
    kvr_route_req_t q = {.tokens = toks,
                         .n_tokens = 800,
                         .update_state = true,
                         .has_pinned = true,
                         .pinned = {1, 0}};
    kvr_route_res_t a, b, c;
    prompt(21, 800);
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &a), KVR_OK);
    assert_int_equal(kvr_router_first_token_h(f.r, a.handle, 1100), KVR_OK);
    prompt(22, 800);
    assert_int_equal(kvr_router_route(f.r, &q, 1200, &b), KVR_OK);
    /* 100 blocks on a 60-block cache: A runs (held), so B's deepest 40 went */
    assert_int_equal(held_by(&f, 800, 1), 10);
    prompt(21, 800);
    assert_int_equal(held_by(&f, 800, 1), 50);
    /* A ends: its blocks go back in the LRU behind B's; C then evicts B's 10 and A's 40 */
    assert_int_equal(kvr_router_free_h(f.r, a.handle, 1300), KVR_OK);
    prompt(23, 800);
    assert_int_equal(kvr_router_route(f.r, &q, 1400, &c), KVR_OK);
    assert_int_equal(held_by(&f, 800, 1), 50);
    prompt(22, 800);
    assert_int_equal(held_by(&f, 800, 1), 0);
    prompt(21, 800);
    assert_int_equal(held_by(&f, 800, 1), 10);
    unmake(&f);
    /* a router without a local index hands its decisions on with the rank's cache size */
    kvr_config_defaults(&f.cfg);
    char err[200];
    assert_int_equal(kvr_config_set(&f.cfg, "router_mode", "approx", err, sizeof err), KVR_OK);
    assert_int_equal(
        kvr_config_set(&f.cfg, "remote_indexer", "http://127.0.0.1:1", err, sizeof err), KVR_OK);
    int st;
    f.r = kvr_router_new(&f.cfg, NULL, &st, err, sizeof err);
    if (f.r == NULL)
        fail_msg("router: %s", err);
    f.ix = NULL;
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse("id=4,num_blocks=123", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    uint64_t got = 0;
    kvr_router_set_decision_sink(f.r, &(kvr_decision_sink_t){.fn = sink_capacity, .arg = &got});
    q.pinned = (kvr_worker_t){4, 0};
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &a), KVR_OK);
    assert_int_equal(got, 123);
    unmake(&f);
}

/* One running request on each of the three workers, worker 2's a block longer (more load),
 * and 30 ms engine steps from 1 s to 2 s, each worker's first beginning at its routing: at
 * 2.01 s worker 1's step has just begun, worker 3's is half done, worker 2's ends in 1 ms. */
/* kv mode, one rank routed approximately (its events found wrong): its overlap is what the
 * router sent it, the others' and its own events are untouched (events_cached_tokens reads
 * them), and switching back drops what was recorded. */
static void test_rank_approximate(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(31, 800);
    engine_stores(&f, 3, 20); /* worker 3's events say it holds 20 blocks */
    kvr_worker_t two = {2, 0}, three = {3, 0};
    assert_int_equal(kvr_router_set_rank_approximate(f.r, (kvr_worker_t){9, 0}, true),
                     KVR_ENOWORKER);
    assert_int_equal(kvr_router_set_rank_approximate(f.r, three, true), KVR_OK);
    assert_true(kvr_router_rank_approximate(f.r, three));
    assert_false(kvr_router_rank_approximate(f.r, two));
    assert_int_equal(held_by(&f, 800, 3), 0); /* routed on decisions: none yet */
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 800, .update_state = true,
                         .has_pinned = true, .pinned = three};
    kvr_route_res_t a, b;
    assert_int_equal(kvr_router_route(f.r, &q, 1000, &a), KVR_OK);
    assert_true(a.approximate);
    assert_int_equal(a.cached_tokens, 0);
    assert_int_equal(a.events_cached_tokens, 20 * BS); /* what its events say */
    assert_int_equal(held_by(&f, 800, 3), 50);         /* the decision is recorded */
    assert_int_equal(kvr_router_route(f.r, &q, 1100, &b), KVR_OK);
    assert_int_equal(b.cached_tokens, 50 * BS);
    assert_int_equal(b.events_cached_tokens, 20 * BS);
    /* another rank stays on its events: nothing recorded there */
    q.pinned = two;
    kvr_route_res_t c;
    assert_int_equal(kvr_router_route(f.r, &q, 1200, &c), KVR_OK);
    assert_false(c.approximate);
    assert_int_equal(held_by(&f, 800, 2), 0);
    /* back on its events: what was recorded goes */
    assert_int_equal(kvr_router_set_rank_approximate(f.r, three, false), KVR_OK);
    assert_false(kvr_router_rank_approximate(f.r, three));
    assert_int_equal(held_by(&f, 800, 3), 20);
    /* removing the worker unlists it */
    assert_int_equal(kvr_router_set_rank_approximate(f.r, three, true), KVR_OK);
    assert_int_equal(kvr_router_remove_worker(f.r, 3), KVR_OK);
    assert_false(kvr_router_rank_approximate(f.r, three));
    unmake(&f);
    /* approximate mode itself: nothing to fall back from */
    make(&f, "approx");
    assert_int_equal(kvr_router_set_rank_approximate(f.r, two, true), KVR_EINVAL);
    unmake(&f);
}

static void busy_fleet(fx_t *f)
{
    static const uint64_t phase[4] = {0, 0, 29000, 15000};
    for (uint64_t id = 1; id <= 3; id++) {
        uint64_t first_end = 1020000 - phase[id];
        prompt(50 + (uint32_t)id, id == 2 ? 528 : 512);
        kvr_route_req_t q = {.tokens = toks,
                             .n_tokens = id == 2 ? 528 : 512,
                             .update_state = true,
                             .has_pinned = true,
                             .pinned = {id, 0},
                             .now_us = first_end - 30000};
        kvr_route_res_t res;
        assert_int_equal(kvr_router_route(f->r, &q, (first_end - 30000) / 1000, &res), KVR_OK);
        assert_int_equal(kvr_router_first_token_h(f->r, res.handle, first_end / 1000), KVR_OK);
        for (uint64_t t = first_end; t <= 2010000; t += 30000)
            assert_int_equal(kvr_router_worker_step(f->r, (kvr_worker_t){id, 0}, t), KVR_OK);
    }
}

/* The locality cost hears of each worker's engine steps and sends a request where the running
 * step ends soonest; a worker that sat idle starts its step when work arrives. */
static void test_step_clock_steers(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    kvr_step_model_t m;
    assert_int_equal(kvr_router_worker_step(f.r, (kvr_worker_t){9, 0}, 1), KVR_ENOTFOUND);
    assert_int_equal(kvr_router_step_model(f.r, (kvr_worker_t){9, 0}, &m), KVR_ENOTFOUND);
    busy_fleet(&f);
    assert_int_equal(kvr_router_step_model(f.r, (kvr_worker_t){1, 0}, &m), KVR_OK);
    assert_int_equal(m.steps, 34);
    assert_true(fabs(m.mean_ms - 30.0) < 1e-9);
    prompt(60, 512);
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 512, .now_us = 2010000};
    kvr_route_res_t res;
    assert_int_equal(kvr_router_route(f.r, &q, 2010, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 2);
    unmake(&f);
    /* without the term a lighter worker wins */
    make_set(&f, NULL, "router_step_wait_weight", "0");
    busy_fleet(&f);
    prompt(60, 512);
    assert_int_equal(kvr_router_route(f.r, &q, 2010, &res), KVR_OK);
    assert_int_not_equal(res.worker.worker_id, 2);
    unmake(&f);
    /* an idle worker's step starts with its work: 30 ms steps until 1.03 s, idle, a request
     * routed to it at 1.5 s, its step's tokens at 1.52 s: a 20 ms step, not 490 ms */
    make(&f, NULL);
    assert_int_equal(kvr_router_worker_step(f.r, (kvr_worker_t){1, 0}, 1000000), KVR_OK);
    assert_int_equal(kvr_router_worker_step(f.r, (kvr_worker_t){1, 0}, 1030000), KVR_OK);
    prompt(80, 512);
    kvr_route_req_t b = {.tokens = toks,
                         .n_tokens = 512,
                         .update_state = true,
                         .has_pinned = true,
                         .pinned = {1, 0}};
    assert_int_equal(kvr_router_route(f.r, &b, 1500, &res), KVR_OK);
    uint64_t seen = 0;
    assert_int_equal(kvr_router_worker_token(f.r, (kvr_worker_t){1, 0}, &seen, 1520000), KVR_OK);
    assert_int_equal(kvr_router_step_model(f.r, (kvr_worker_t){1, 0}, &m), KVR_OK);
    assert_int_equal(m.steps, 2);
    assert_true(fabs(m.mean_ms - 29.0) < 1e-9); /* 30 + (20 - 30) / 10 */
    unmake(&f);
}

static void test_round_robin_cycles(void **s)
{
    (void)s;
    fx_t f;
    make(&f, "round-robin");
    kvr_route_res_t res;
    uint64_t order[6];
    prompt(1, 64);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(route(&f, 64, false, &res), KVR_OK);
        order[i] = res.worker.worker_id;
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(order[i], order[i + 3]);
    assert_true(order[0] != order[1] && order[1] != order[2] && order[0] != order[2]);
    unmake(&f);
}

/* Direct mode: a request must name its worker (pinned, or an allowed list of one), and goes
 * there; one that names none, or several, is refused with the setting named. */
static void test_direct_mode(void **s)
{
    (void)s;
    fx_t f;
    make(&f, "direct");
    kvr_route_res_t res;
    prompt(7, 64);
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 64, .update_state = true};
    assert_int_equal(kvr_router_route(f.r, &q, 1, &res), KVR_EINVAL);
    assert_non_null(strstr(res.error_field, "router_mode direct"));
    q.has_pinned = true;
    q.pinned = (kvr_worker_t){2, 0};
    for (int i = 0; i < 3; i++) { /* loaded or not, it stays where it was sent */
        assert_int_equal(kvr_router_route(f.r, &q, 2 + i, &res), KVR_OK);
        assert_int_equal(res.worker.worker_id, 2);
    }
    uint64_t one = 3, two[] = {1, 3};
    q.has_pinned = false;
    q.has_allowed = true;
    q.allowed_ids = &one;
    q.n_allowed = 1;
    assert_int_equal(kvr_router_route(f.r, &q, 10, &res), KVR_OK);
    assert_int_equal(res.worker.worker_id, 3);
    q.allowed_ids = two;
    q.n_allowed = 2;
    assert_int_equal(kvr_router_route(f.r, &q, 11, &res), KVR_EINVAL);
    assert_non_null(strstr(res.error_field, "names no worker"));
    unmake(&f);
}

static void test_query_lists_every_rank(void **s)
{
    (void)s;
    fx_t f;
    make(&f, NULL);
    prompt(4, 160);
    engine_stores(&f, 3, 10);
    kvr_rank_score_t sc[8];
    size_t n;
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 160};
    assert_int_equal(kvr_router_query(f.r, &q, sc, 8, &n), KVR_OK);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        uint32_t want = sc[i].worker.worker_id == 3 ? 10 : 0;
        assert_int_equal(sc[i].device_blocks, want);
        assert_int_equal(sc[i].cached_tokens, want * BS);
    }
    /* removing a worker drops it from the listing */
    assert_int_equal(kvr_router_remove_worker(f.r, 3), KVR_OK);
    assert_int_equal(kvr_router_query(f.r, &q, sc, 8, &n), KVR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(kvr_router_remove_worker(f.r, 3), KVR_ENOTFOUND);
    unmake(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_spec_parsing),
        cmocka_unit_test(test_short_prompt_on_a_fresh_router),
        cmocka_unit_test(test_generated_ids_unguessable),
        cmocka_unit_test(test_prefix_holder_wins),
        cmocka_unit_test(test_booking_spreads_load_and_free_releases),
        cmocka_unit_test(test_roles_split_pools),
        cmocka_unit_test(test_disagg_bypass),
        cmocka_unit_test(test_load_overrides_reach_the_booking),
        cmocka_unit_test(test_burst_finds_the_prefix_in_flight),
        cmocka_unit_test(test_burst_waits_for_the_prefill_to_begin),
        cmocka_unit_test(test_burst_credit_a_chunk_at_a_time),
        cmocka_unit_test(test_memory_near_full_steers),
        cmocka_unit_test(test_queue_threshold_does_not_filter),
        cmocka_unit_test(test_sticky_sessions),
        cmocka_unit_test(test_model_pools_and_adapters),
        cmocka_unit_test(test_busy_and_filters),
        cmocka_unit_test(test_approx_mode_learns_from_decisions),
        cmocka_unit_test(test_approx_mode_follows_requests),
        cmocka_unit_test(test_rank_approximate),
        cmocka_unit_test(test_step_clock_steers),
        cmocka_unit_test(test_round_robin_cycles),
        cmocka_unit_test(test_direct_mode),
        cmocka_unit_test(test_query_lists_every_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_load.c: the load tracker, one behaviour per test, each asserting what a router user
 * relies on: shared prefixes count once per worker, first tokens drop prefill load, frees and
 * expiry release everything exactly once, bad lifecycles are counted no-ops, projections add
 * exactly the blocks a worker does not already hold, a full drain leaves zero load, and a
 * block keeps the tag of the request that first held it.
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

#include "core/load.h"
#include "kvrouter.h"

#define BS 16

typedef struct prompt {
    uint64_t seq[64];
    size_t n;
} prompt_t;

/* A prompt whose first `shared` blocks are common to every prompt with the same family, and
 * whose other blocks are its own (chained sequence hashes, as the router computes them). */
static prompt_t mkprompt(uint64_t family, size_t shared, uint64_t own, size_t n)
{
    uint64_t lbh[64];
    prompt_t p = {.n = n};
    for (size_t i = 0; i < n; i++)
        lbh[i] = i < shared ? family * 1000 + i : own * 100000 + i;
    kvr_hash_chain(lbh, n, p.seq);
    return p;
}

static kvr_load_config_t defaults(void)
{
    kvr_load_config_t cfg;
    kvr_load_config_init(&cfg);
    cfg.block_size = BS;
    return cfg;
}

static kvr_load_t *mk(const kvr_load_config_t *cfg)
{
    int st;
    kvr_load_t *lt = kvr_load_new(cfg, &st);
    assert_int_equal(st, KVR_OK);
    assert_non_null(lt);
    return lt;
}

static void verify(const kvr_load_t *lt)
{
    char msg[256] = "";
    int rc = kvr_load_verify(lt, msg, sizeof msg);
    if (rc != KVR_OK)
        fail_msg("verify: %s", msg);
}

static int add(kvr_load_t *lt, const char *id, kvr_worker_t w, const prompt_t *p,
               uint64_t cached, uint64_t now)
{
    kvr_load_request_t rq = {.id = id,
                             .id_len = strlen(id),
                             .worker = w,
                             .seq = p ? p->seq : NULL,
                             .n_seq = p ? p->n : 0,
                             .isl_tokens = p ? p->n * BS + 3 : 100,
                             .cached_tokens = cached};
    int rc = kvr_load_add(lt, &rq, now);
    verify(lt);
    return rc;
}

static int fin(kvr_load_t *lt, const char *id)
{
    int rc = kvr_load_free_request(lt, id, strlen(id), 0);
    verify(lt);
    return rc;
}

static kvr_load_snapshot_t snap(const kvr_load_t *lt, kvr_worker_t w)
{
    kvr_load_snapshot_t s;
    kvr_load_snapshot(lt, w, &s);
    return s;
}

static void assert_same_info(const kvr_load_request_info_t *a, const kvr_load_request_info_t *b)
{
    assert_int_equal(a->worker.worker_id, b->worker.worker_id);
    assert_int_equal(a->worker.dp_rank, b->worker.dp_rank);
    assert_int_equal(a->started_ms, b->started_ms);
    assert_int_equal(a->prefill_tokens, b->prefill_tokens);
    assert_int_equal(a->n_prompt_blocks, b->n_prompt_blocks);
    assert_int_equal(a->n_output_blocks, b->n_output_blocks);
    assert_int_equal(a->has_expected_output_tokens, b->has_expected_output_tokens);
    assert_int_equal(a->expected_output_tokens, b->expected_output_tokens);
}

static void assert_same_projection(const kvr_load_projection_t *a, const kvr_load_projection_t *b)
{
    assert_int_equal(a->potential_prefill_tokens, b->potential_prefill_tokens);
    assert_int_equal(a->potential_decode_blocks, b->potential_decode_blocks);
    assert_int_equal(a->active_prefill_tokens, b->active_prefill_tokens);
    assert_int_equal(a->active_blocks, b->active_blocks);
    assert_int_equal(a->overlap_blocks, b->overlap_blocks);
    assert_int_equal(a->active_requests, b->active_requests);
}

static const kvr_worker_t W1 = {1, 0}, W2 = {2, 0}, W1R1 = {1, 1}, W3 = {3, 0};

static void assert_zero(const kvr_load_t *lt, kvr_worker_t w)
{
    kvr_load_snapshot_t s = snap(lt, w);
    assert_int_equal(s.active_blocks, 0);
    assert_int_equal(s.active_prefill_tokens, 0);
    assert_int_equal(s.active_requests, 0);
    assert_int_equal(s.unique_blocks, 0);
}

static void test_shared_prefix_counts_once(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(7, 10, 1, 15), b = mkprompt(7, 10, 2, 13);
    assert_int_equal(add(lt, "a", W1, &a, 0, 10), KVR_OK);
    assert_int_equal(add(lt, "b", W1, &b, 0, 10), KVR_OK);
    /* 10 shared + 5 + 3 own */
    assert_int_equal(snap(lt, W1).active_blocks, 18);
    assert_int_equal(snap(lt, W1).active_requests, 2);
    /* the same prompt on another rank of the same worker is not shared */
    assert_int_equal(add(lt, "c", W1R1, &a, 0, 10), KVR_OK);
    assert_int_equal(snap(lt, W1R1).active_blocks, 15);
    assert_int_equal(snap(lt, W1).active_blocks, 18);
    /* freeing one of the sharers keeps the prefix booked for the other */
    assert_int_equal(fin(lt, "a"), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 13);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.unique_blocks, 13 + 15);
    assert_int_equal(st.live_requests, 2);
    assert_int_equal(st.workers, 2);
    kvr_load_free(lt);
}

static void test_no_kv_reuse_never_dedups(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.assume_kv_reuse = false;
    cfg.seed = 42;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(7, 10, 1, 10);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "b", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 20);
    kvr_load_query_t q = {.seq = a.seq, .n_seq = a.n, .isl_tokens = a.n * BS};
    kvr_load_projection_t p = {.worker = W1};
    assert_int_equal(kvr_load_project_one(lt, &q, &p), KVR_OK);
    assert_int_equal(p.overlap_blocks, 0);
    assert_int_equal(p.potential_decode_blocks, 30);
    assert_int_equal(fin(lt, "a"), KVR_OK);
    assert_int_equal(fin(lt, "b"), KVR_OK);
    assert_zero(lt, W1);
    kvr_load_free(lt);
}

static void test_first_token_drops_prefill(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 8); /* isl = 8 * 16 + 3 = 131 */
    assert_int_equal(add(lt, "a", W1, &a, 48, 0), KVR_OK);
    assert_int_equal(add(lt, "b", W1, &a, 500, 0), KVR_OK); /* cached > isl: nothing to prefill */
    assert_int_equal(snap(lt, W1).active_prefill_tokens, 131 - 48);
    assert_int_equal(kvr_load_first_token(lt, "a", 1, 5), KVR_OK);
    verify(lt);
    assert_int_equal(snap(lt, W1).active_prefill_tokens, 0);
    /* blocks stay booked until the request ends */
    assert_int_equal(snap(lt, W1).active_blocks, 8);
    /* a repeated first token is a no-op */
    assert_int_equal(kvr_load_first_token(lt, "a", 1, 6), KVR_OK);
    assert_int_equal(snap(lt, W1).active_prefill_tokens, 0);
    kvr_load_request_info_t info;
    assert_int_equal(kvr_load_request_info(lt, "a", 1, &info), KVR_OK);
    assert_int_equal(info.prefill_tokens, 0);
    assert_int_equal(info.n_prompt_blocks, 8);
    kvr_load_free(lt);
}

static void test_prefill_not_tracked(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.track_prefill_tokens = false;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 8);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(snap(lt, W1).active_prefill_tokens, 0);
    assert_int_equal(snap(lt, W1).active_blocks, 8);
    kvr_load_free(lt);
}

static void test_active_blocks_not_tracked(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.track_active_blocks = false;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 8);
    assert_int_equal(add(lt, "a", W1, NULL, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "b", W1, &a, 0, 0), KVR_OK); /* hashes ignored */
    assert_int_equal(snap(lt, W1).active_blocks, 0);
    assert_int_equal(snap(lt, W1).active_requests, 2);
    kvr_load_query_t q = {.seq = a.seq, .n_seq = a.n, .isl_tokens = 131};
    kvr_load_projection_t p = {.worker = W1, .cached_tokens = 31};
    assert_int_equal(kvr_load_project_one(lt, &q, &p), KVR_OK);
    assert_int_equal(p.potential_decode_blocks, 0);
    assert_int_equal(p.potential_prefill_tokens, 100 + 131 + 100);
    kvr_load_free(lt);
}

static void test_unknown_and_double_free_are_counted_noops(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 4);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(fin(lt, "nope"), KVR_ENOTFOUND);
    assert_int_equal(snap(lt, W1).active_blocks, 4);
    assert_int_equal(fin(lt, "a"), KVR_OK);
    assert_int_equal(fin(lt, "a"), KVR_ENOTFOUND); /* double free */
    assert_int_equal(kvr_load_first_token(lt, "a", 1, 0), KVR_ENOTFOUND);
    assert_int_equal(kvr_load_output_block(lt, "a", 1, NAN, 0), KVR_ENOTFOUND);
    verify(lt);
    assert_zero(lt, W1);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.frees, 1);
    assert_int_equal(st.unknown_frees, 2);
    assert_int_equal(st.unknown_marks, 2);
    assert_int_equal(st.live_requests, 0);
    kvr_load_free(lt);
}

static void test_duplicate_id_rejected_first_unchanged(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 6), b = mkprompt(2, 0, 2, 9);
    kvr_load_request_t rq = {.id = "dup", .id_len = 3, .worker = W1, .seq = a.seq, .n_seq = a.n,
                             .isl_tokens = 100, .cached_tokens = 20,
                             .has_expected_output_tokens = true, .expected_output_tokens = 77};
    assert_int_equal(kvr_load_add(lt, &rq, 1000), KVR_OK);
    kvr_load_request_info_t before, after;
    assert_int_equal(kvr_load_request_info(lt, "dup", 3, &before), KVR_OK);
    kvr_load_request_t again = {.id = "dup", .id_len = 3, .worker = W2, .seq = b.seq,
                                .n_seq = b.n, .isl_tokens = 200};
    assert_int_equal(kvr_load_add(lt, &again, 2000), KVR_EEXIST);
    verify(lt);
    assert_int_equal(kvr_load_request_info(lt, "dup", 3, &after), KVR_OK);
    assert_same_info(&before, &after);
    assert_int_equal(after.worker.worker_id, 1);
    assert_int_equal(after.started_ms, 1000);
    assert_int_equal(after.expected_output_tokens, 77);
    assert_zero(lt, W2);
    assert_int_equal(snap(lt, W1).active_blocks, 6);
    assert_int_equal(snap(lt, W1).active_prefill_tokens, 80);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.duplicates, 1);
    assert_int_equal(st.adds, 1);
    /* the id is free again once the first request ends */
    assert_int_equal(fin(lt, "dup"), KVR_OK);
    assert_int_equal(kvr_load_add(lt, &again, 3000), KVR_OK);
    assert_int_equal(snap(lt, W2).active_blocks, 9);
    kvr_load_free(lt);
}

static void test_full_drain_is_exactly_zero(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.track_output_blocks = true;
    kvr_load_t *lt = mk(&cfg);
    const kvr_worker_t ws[4] = {W1, W1R1, W2, W3};
    char id[32];
    for (int i = 0; i < 200; i++) {
        prompt_t p = mkprompt((uint64_t)(i % 3), (size_t)(i % 11), (uint64_t)i, 12);
        snprintf(id, sizeof id, "req-%d", i);
        assert_int_equal(add(lt, id, ws[i % 4], &p, (uint64_t)(i * 7), (uint64_t)i), KVR_OK);
        if (i % 2 == 0)
            assert_int_equal(kvr_load_first_token(lt, id, strlen(id), (uint64_t)i), KVR_OK);
        for (int k = 0; k < i % 5; k++)
            assert_int_equal(kvr_load_output_block(lt, id, strlen(id),
                                                   k % 2 ? NAN : 1.0 / (k + 3), (uint64_t)i),
                             KVR_OK);
    }
    verify(lt);
    for (int i = 199; i >= 0; i--) {
        snprintf(id, sizeof id, "req-%d", i);
        assert_int_equal(kvr_load_free_request(lt, id, strlen(id), 500), KVR_OK);
    }
    verify(lt);
    for (int i = 0; i < 4; i++)
        assert_zero(lt, ws[i]);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.live_requests, 0);
    assert_int_equal(st.unique_blocks, 0);
    assert_int_equal(st.workers, 0);
    assert_int_equal(st.active_prefill_tokens, 0);
    assert_int_equal(st.adds, 200);
    assert_int_equal(st.frees, 200);
    kvr_load_free(lt);
}

static void test_expiry_frees_stale_requests(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.expiry_ms = 1000;
    cfg.check_interval_ms = 100;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 4), b = mkprompt(2, 0, 2, 4);
    assert_int_equal(add(lt, "old", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "new", W1, &b, 0, 500), KVR_OK);
    assert_int_equal(kvr_load_next_expiry(lt), 1000);
    assert_int_equal(kvr_load_expire(lt, 999), 0);
    assert_int_equal(kvr_load_expire(lt, 1000), 1);
    verify(lt);
    assert_int_equal(snap(lt, W1).active_blocks, 4);
    assert_int_equal(kvr_load_next_expiry(lt), 1500);
    /* the stale request is gone for good: its late free is a counted no-op */
    assert_int_equal(fin(lt, "old"), KVR_ENOTFOUND);
    /* add() sweeps too, at most every check interval */
    assert_int_equal(add(lt, "x", W2, &a, 0, 1450), KVR_OK); /* sweeps: "new" is 950 ms old */
    assert_int_equal(snap(lt, W1).active_requests, 1);
    assert_int_equal(add(lt, "y", W2, &b, 0, 1520), KVR_OK); /* 70 ms since the last sweep */
    assert_int_equal(snap(lt, W1).active_requests, 1);       /* stale, not yet swept */
    assert_int_equal(add(lt, "z", W2, &b, 0, 1550), KVR_OK); /* sweeps: "new" is 1050 ms old */
    assert_zero(lt, W1);
    /* a clock that steps back never reorders: the request starts with the newest */
    assert_int_equal(add(lt, "back", W3, &a, 0, 1200), KVR_OK);
    kvr_load_request_info_t info;
    assert_int_equal(kvr_load_request_info(lt, "back", 4, &info), KVR_OK);
    assert_int_equal(info.started_ms, 1550);
    assert_int_equal(kvr_load_expire(lt, 2449), 0);
    assert_int_equal(kvr_load_expire(lt, 10000), 4);
    verify(lt);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.expired, 6);
    assert_int_equal(st.live_requests, 0);
    assert_zero(lt, W2);
    assert_zero(lt, W3);
    assert_int_equal(kvr_load_next_expiry(lt), UINT64_MAX);
    kvr_load_free(lt);
}

static void test_output_blocks_and_decay(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.track_output_blocks = true;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(5, 2, 1, 4), b = mkprompt(5, 2, 2, 4);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "b", W1, &b, 0, 0), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 6); /* 2 shared + 2 + 2 */
    assert_int_equal(kvr_load_output_block(lt, "a", 1, NAN, 1), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 7);
    /* a's exclusive blocks (2 prompt suffix + 1 output + this one) now weigh 0.25 each;
     * the 2 shared blocks and b's 2 keep weight 1: 4 + 4 * 0.25 = 5 */
    assert_int_equal(kvr_load_output_block(lt, "a", 1, 0.25, 2), KVR_OK);
    verify(lt);
    assert_int_equal(snap(lt, W1).active_blocks, 5);
    assert_int_equal(snap(lt, W1).unique_blocks, 8);
    /* decay 0: a's exclusive blocks weigh nothing; 4 + 0 = 4 */
    assert_int_equal(kvr_load_output_block(lt, "a", 1, 0.0, 3), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 4);
    /* halves round up: 4 + 6 * 0.25 = 5.5 -> 6 */
    assert_int_equal(kvr_load_output_block(lt, "a", 1, 0.25, 4), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 6);
    /* out-of-range decay changes nothing */
    assert_int_equal(kvr_load_output_block(lt, "a", 1, 1.5, 5), KVR_ERANGE);
    assert_int_equal(kvr_load_output_block(lt, "a", 1, -0.1, 5), KVR_ERANGE);
    assert_int_equal(kvr_load_output_block(lt, "a", 1, INFINITY, 5), KVR_ERANGE);
    kvr_load_request_info_t info;
    assert_int_equal(kvr_load_request_info(lt, "a", 1, &info), KVR_OK);
    assert_int_equal(info.n_output_blocks, 4);
    /* once a ends, b's suffix is still 1.0 and the shared prefix goes back to b alone */
    assert_int_equal(fin(lt, "a"), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 4);
    assert_int_equal(fin(lt, "b"), KVR_OK);
    assert_zero(lt, W1);
    kvr_load_free(lt);
}

static void test_output_blocks_off_is_noop(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults(); /* track_output_blocks off */
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 3);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(kvr_load_output_block(lt, "a", 1, 0.5, 0), KVR_OK);
    verify(lt);
    assert_int_equal(snap(lt, W1).active_blocks, 3);
    kvr_load_free(lt);
}

static void test_projection(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(9, 6, 1, 8);  /* W1: 8 blocks, 6 shared with q */
    prompt_t c = mkprompt(9, 10, 3, 10); /* W2: all of q's 10 blocks */
    prompt_t d = mkprompt(4, 0, 4, 5);  /* W3: nothing in common */
    assert_int_equal(add(lt, "a", W1, &a, 16, 0), KVR_OK);
    assert_int_equal(add(lt, "c", W2, &c, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "d", W3, &d, 0, 0), KVR_OK);
    prompt_t q = mkprompt(9, 10, 99, 10);
    kvr_load_query_t qq = {.seq = q.seq, .n_seq = q.n, .isl_tokens = 170};
    kvr_load_projection_t p[5] = {
        {.worker = W1, .cached_tokens = 96}, {.worker = W2, .cached_tokens = 500},
        {.worker = W3}, {.worker = W1R1, .cached_tokens = 10}, {.worker = {77, 3}}};
    assert_int_equal(kvr_load_project(lt, &qq, p, 5), KVR_OK);
    /* W1: 8 active blocks, 6 overlap -> 8 + 4; prefill (131 - 16) + (170 - 96) */
    assert_int_equal(p[0].overlap_blocks, 6);
    assert_int_equal(p[0].potential_decode_blocks, 12);
    assert_int_equal(p[0].potential_prefill_tokens, 115 + 74);
    assert_int_equal(p[0].active_requests, 1);
    /* W2 holds all of q: no additional block; cached > isl means no prefill */
    assert_int_equal(p[1].overlap_blocks, 10);
    assert_int_equal(p[1].potential_decode_blocks, 10);
    assert_int_equal(p[1].potential_prefill_tokens, 163);
    assert_int_equal(p[2].overlap_blocks, 0);
    assert_int_equal(p[2].potential_decode_blocks, 15);
    /* ranks without requests project from zero */
    assert_int_equal(p[3].potential_decode_blocks, 10);
    assert_int_equal(p[3].potential_prefill_tokens, 160);
    assert_int_equal(p[3].active_requests, 0);
    assert_int_equal(p[4].potential_decode_blocks, 10);
    assert_int_equal(p[4].potential_prefill_tokens, 170);
    /* the single-worker call agrees */
    for (int i = 0; i < 5; i++) {
        kvr_load_projection_t one = {.worker = p[i].worker, .cached_tokens = p[i].cached_tokens};
        assert_int_equal(kvr_load_project_one(lt, &qq, &one), KVR_OK);
        assert_same_projection(&one, &p[i]);
    }
    /* after the first token only the blocks remain */
    assert_int_equal(kvr_load_first_token(lt, "a", 1, 1), KVR_OK);
    assert_int_equal(kvr_load_project_one(lt, &qq, &p[0]), KVR_OK);
    assert_int_equal(p[0].potential_prefill_tokens, 74);
    /* an empty query and bad arguments */
    kvr_load_query_t empty = {.isl_tokens = 0};
    assert_int_equal(kvr_load_project_one(lt, &empty, &p[0]), KVR_OK);
    assert_int_equal(p[0].potential_decode_blocks, 8);
    assert_int_equal(p[0].potential_prefill_tokens, 0);
    kvr_load_query_t bad = {.seq = NULL, .n_seq = 3};
    assert_int_equal(kvr_load_project(lt, &bad, p, 1), KVR_EINVAL);
    assert_int_equal(kvr_load_project(lt, &qq, NULL, 1), KVR_EINVAL);
    assert_int_equal(kvr_load_project(lt, &qq, NULL, 0), KVR_OK);
    kvr_load_free(lt);
}

static void test_remove_worker(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 4, 1, 6), b = mkprompt(1, 4, 2, 6);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "b", W1R1, &b, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "c", W1, &b, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "d", W2, &a, 0, 0), KVR_OK);
    size_t dropped = 0;
    assert_int_equal(kvr_load_remove_worker(lt, 1, &dropped), KVR_OK);
    verify(lt);
    assert_int_equal(dropped, 3);
    assert_zero(lt, W1);
    assert_zero(lt, W1R1);
    assert_int_equal(snap(lt, W2).active_blocks, 6);
    /* frees from the removed worker's streams arrive late: counted no-ops */
    assert_int_equal(fin(lt, "a"), KVR_ENOTFOUND);
    assert_int_equal(kvr_load_remove_worker(lt, 1, &dropped), KVR_ENOWORKER);
    assert_int_equal(dropped, 0);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.workers_removed, 2);
    assert_int_equal(st.requests_dropped, 3);
    assert_int_equal(st.unknown_frees, 1);
    assert_int_equal(st.live_requests, 1);
    /* the worker can come back */
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(snap(lt, W1).active_blocks, 6);
    kvr_load_free(lt);
}

static void test_max_requests(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.max_requests = 3;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 2);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "b", W2, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "c", W3, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "d", W1, &a, 0, 0), KVR_EFULL);
    assert_int_equal(snap(lt, W1).active_requests, 1);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.full, 1);
    assert_int_equal(st.max_requests, 3);
    assert_int_equal(fin(lt, "b"), KVR_OK);
    assert_int_equal(add(lt, "d", W1, &a, 0, 0), KVR_OK);
    kvr_load_free(lt);
}

static int add_peer(kvr_load_t *lt, const char *id, const prompt_t *p)
{
    kvr_load_request_t rq = {.id = id, .id_len = strlen(id), .worker = W2, .seq = p->seq,
                             .n_seq = p->n, .isl_tokens = p->n * BS, .peer = true};
    int rc = kvr_load_add(lt, &rq, 0);
    verify(lt);
    return rc;
}

/* With a peer budget, other replicas' bookings fill their own and never the local one: a
 * flood of forged peer adds cannot make a replica refuse its own clients. */
static void test_peer_budget(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.max_requests = 2;
    cfg.max_peer_requests = 3;
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 2);
    char id[16];
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof id, "p%d", i);
        assert_int_equal(add_peer(lt, id, &a), KVR_OK);
    }
    assert_int_equal(add_peer(lt, "p3", &a), KVR_EFULL);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_OK); /* local: its own budget */
    assert_int_equal(add(lt, "b", W1, &a, 0, 0), KVR_OK);
    assert_int_equal(add(lt, "c", W1, &a, 0, 0), KVR_EFULL);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.peer_full, 1);
    assert_int_equal(st.full, 1);
    assert_int_equal(st.peer_requests, 3);
    assert_int_equal(st.live_requests, 5);
    assert_int_equal(fin(lt, "p1"), KVR_OK); /* a peer's free makes room for peers only */
    assert_int_equal(add(lt, "c", W1, &a, 0, 0), KVR_EFULL);
    assert_int_equal(add_peer(lt, "p3", &a), KVR_OK);
    assert_int_equal(fin(lt, "a"), KVR_OK);
    assert_int_equal(add(lt, "c", W1, &a, 0, 0), KVR_OK);
    kvr_load_free(lt);
    /* their blocks are bounded too: 2 requests of 2 blocks fit in 5, a third does not */
    cfg.max_peer_blocks = 5;
    lt = mk(&cfg);
    prompt_t b = mkprompt(2, 0, 1, 2);
    assert_int_equal(add_peer(lt, "p0", &a), KVR_OK);
    assert_int_equal(add_peer(lt, "p1", &b), KVR_OK);
    assert_int_equal(add_peer(lt, "p2", &a), KVR_EFULL);
    kvr_load_stats(lt, &st);
    assert_int_equal(st.peer_blocks, 2 * a.n);
    assert_int_equal(fin(lt, "p0"), KVR_OK);
    assert_int_equal(add_peer(lt, "p2", &a), KVR_OK);
    kvr_load_free(lt);
    cfg.max_peer_blocks = 0;
    /* without a peer budget they share max_requests, as before */
    cfg.max_peer_requests = 0;
    lt = mk(&cfg);
    assert_int_equal(add_peer(lt, "p0", &a), KVR_OK);
    assert_int_equal(add_peer(lt, "p1", &a), KVR_OK);
    assert_int_equal(add(lt, "a", W1, &a, 0, 0), KVR_EFULL);
    kvr_load_free(lt);
    cfg.max_peer_requests = KVR_LOAD_MAX_REQUESTS + 1;
    const char *field;
    assert_int_equal(kvr_load_config_validate(&cfg, &field), KVR_EINVAL);
    assert_string_equal(field, "max_peer_requests");
}

static void test_bad_arguments_change_nothing(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    prompt_t a = mkprompt(1, 0, 1, 4);
    char longid[KVR_LOAD_MAX_ID_BYTES + 1];
    memset(longid, 'x', sizeof longid);
    kvr_load_request_t rq = {.id = longid, .id_len = sizeof longid, .worker = W1,
                             .seq = a.seq, .n_seq = a.n, .isl_tokens = 64};
    assert_int_equal(kvr_load_add(lt, &rq, 0), KVR_EINVAL);
    rq.id_len = 0;
    assert_int_equal(kvr_load_add(lt, &rq, 0), KVR_EINVAL);
    rq.id_len = KVR_LOAD_MAX_ID_BYTES; /* the longest id is fine */
    rq.isl_tokens = 63;                /* 4 hashes need 64 tokens of block size 16 */
    assert_int_equal(kvr_load_add(lt, &rq, 0), KVR_EINVAL);
    rq.isl_tokens = 64;
    rq.seq = NULL;
    assert_int_equal(kvr_load_add(lt, &rq, 0), KVR_EINVAL);
    assert_int_equal(kvr_load_add(lt, NULL, 0), KVR_EINVAL);
    verify(lt);
    assert_zero(lt, W1);
    rq.seq = a.seq;
    assert_int_equal(kvr_load_add(lt, &rq, 0), KVR_OK);
    assert_int_equal(kvr_load_free_request(lt, longid, 0, 0), KVR_EINVAL);
    assert_int_equal(kvr_load_first_token(lt, NULL, 3, 0), KVR_EINVAL);
    /* ids are bytes: a NUL inside is part of the id */
    kvr_load_request_t nul = {.id = "a\0b", .id_len = 3, .worker = W2, .isl_tokens = 5};
    assert_int_equal(kvr_load_add(lt, &nul, 0), KVR_OK);
    assert_int_equal(kvr_load_free_request(lt, "a\0c", 3, 0), KVR_ENOTFOUND);
    assert_int_equal(kvr_load_free_request(lt, "a\0b", 3, 0), KVR_OK);
    kvr_load_stats_t st;
    kvr_load_stats(lt, &st);
    assert_int_equal(st.adds, 2);
    assert_int_equal(st.live_requests, 1);
    assert_int_equal(kvr_load_free_request(lt, longid, KVR_LOAD_MAX_ID_BYTES, 0), KVR_OK);
    verify(lt);
    kvr_load_free(lt);
    kvr_load_free(NULL);
}

static void expect_field(kvr_load_config_t cfg, const char *want)
{
    const char *field = NULL;
    assert_int_equal(kvr_load_config_validate(&cfg, &field), KVR_EINVAL);
    assert_non_null(field);
    assert_string_equal(field, want);
    int st = KVR_OK;
    assert_null(kvr_load_new(&cfg, &st));
    assert_int_equal(st, KVR_EINVAL);
}

static void test_config_validation(void **state)
{
    (void)state;
    kvr_load_config_t ok = defaults();
    const char *field = "untouched";
    assert_int_equal(kvr_load_config_validate(&ok, &field), KVR_OK);
    assert_null(field);
    assert_int_equal(kvr_load_config_validate(NULL, NULL), KVR_OK);
    assert_int_equal(ok.expiry_ms, 300000);
    assert_int_equal(ok.check_interval_ms, 60000);
    assert_true(ok.track_active_blocks && ok.assume_kv_reuse && ok.track_prefill_tokens);
    assert_false(ok.track_output_blocks);
    kvr_load_config_t c = ok;
    c.block_size = 0;
    expect_field(c, "block_size");
    c = ok;
    c.track_active_blocks = false;
    c.track_output_blocks = true;
    expect_field(c, "track_output_blocks");
    c = ok;
    c.expiry_ms = 0;
    expect_field(c, "expiry_ms");
    c.expiry_ms = KVR_LOAD_MAX_EXPIRY_MS + 1;
    expect_field(c, "expiry_ms");
    c = ok;
    c.check_interval_ms = c.expiry_ms + 1;
    expect_field(c, "check_interval_ms");
    c = ok;
    c.max_requests = 0;
    expect_field(c, "max_requests");
    c.max_requests = KVR_LOAD_MAX_REQUESTS + 1;
    expect_field(c, "max_requests");
    /* NULL config: defaults */
    int st;
    kvr_load_t *lt = kvr_load_new(NULL, &st);
    assert_non_null(lt);
    kvr_load_stats_t s;
    kvr_load_stats(lt, &s);
    assert_int_equal(s.max_requests, KVR_LOAD_DEFAULT_MAX_REQUESTS);
    kvr_load_free(lt);
}

/* After a warm-up, a steady stream of requests does not grow the tracker. */
static void test_steady_state_memory_is_flat(void **state)
{
    (void)state;
    kvr_load_config_t cfg = defaults();
    cfg.track_output_blocks = true;
    kvr_load_t *lt = mk(&cfg);
    char id[32];
    uint64_t bytes_after_warmup = 0;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 100; i++) {
            prompt_t p = mkprompt((uint64_t)(i % 4), 20, (uint64_t)(round * 1000 + i), 40);
            snprintf(id, sizeof id, "r%d-%d", round, i);
            kvr_load_request_t rq = {.id = id, .id_len = strlen(id), .worker = {(uint64_t)(i % 8), 0},
                                     .seq = p.seq, .n_seq = p.n, .isl_tokens = 40 * BS};
            assert_int_equal(kvr_load_add(lt, &rq, (uint64_t)round), KVR_OK);
            for (int k = 0; k < 10; k++)
                assert_int_equal(kvr_load_output_block(lt, id, strlen(id), 0.5, 0), KVR_OK);
        }
        for (int i = 0; i < 100; i++) {
            snprintf(id, sizeof id, "r%d-%d", round, i);
            assert_int_equal(kvr_load_free_request(lt, id, strlen(id), 0), KVR_OK);
        }
        kvr_load_stats_t st;
        kvr_load_stats(lt, &st);
        if (round == 1)
            bytes_after_warmup = st.bytes;
        if (round > 1)
            assert_int_equal(st.bytes, bytes_after_warmup);
    }
    verify(lt);
    kvr_load_free(lt);
}

/* Tags and marks: a prompt block keeps the tag of the live request that first held it (the
 * router's stream position of the request computing it), whoever shares it later, until no
 * request holds it; a request keeps its mark (its stream end), found by id or by handle. */
static void test_tags_and_marks(void **s)
{
    (void)s;
    kvr_load_config_t cfg = defaults();
    kvr_load_t *lt = mk(&cfg);
    kvr_worker_t w = {1, 0};
    prompt_t a = mkprompt(7, 4, 1, 4), b = mkprompt(7, 4, 2, 6); /* b extends a by 2 blocks */
    kvr_load_request_t ra = {
        .id = "a", .id_len = 1, .worker = w, .seq = a.seq, .n_seq = a.n, .isl_tokens = 64};
    kvr_load_request_t rb = {
        .id = "b", .id_len = 1, .worker = w, .seq = b.seq, .n_seq = b.n, .isl_tokens = 96};
    kvr_req_handle_t ha, hb;
    assert_int_equal(kvr_load_admit_tagged(lt, &ra, 1, 100, 164, &ha), KVR_OK);
    assert_int_equal(kvr_load_admit_tagged(lt, &rb, 1, 200, 296, &hb), KVR_OK);
    uint32_t tag;
    for (size_t i = 0; i < b.n; i++) {
        assert_int_equal(kvr_load_block_tag(lt, w, b.seq[i], &tag), KVR_OK);
        assert_int_equal(tag, i < 4 ? 100 : 200);
    }
    assert_int_equal(kvr_load_block_tag(lt, (kvr_worker_t){2, 0}, b.seq[0], &tag),
                     KVR_ENOTFOUND); /* held on worker 1 only */
    kvr_worker_t got;
    uint64_t mark;
    assert_int_equal(kvr_load_mark(lt, "a", 1, 0, &got, &mark), KVR_OK);
    assert_int_equal(mark, 164);
    assert_true(got.worker_id == 1 && got.dp_rank == 0);
    assert_int_equal(kvr_load_mark(lt, NULL, 0, hb, &got, &mark), KVR_OK);
    assert_int_equal(mark, 296);
    assert_int_equal(kvr_load_free_h(lt, ha, 2), KVR_OK);
    assert_int_equal(kvr_load_mark(lt, NULL, 0, ha, &got, &mark), KVR_ENOTFOUND); /* stale */
    assert_int_equal(kvr_load_mark(lt, "a", 1, 0, &got, &mark), KVR_ENOTFOUND);
    assert_int_equal(kvr_load_block_tag(lt, w, b.seq[0], &tag), KVR_OK);
    assert_int_equal(tag, 100); /* b still holds it: the tag stays */
    assert_int_equal(kvr_load_free_h(lt, hb, 2), KVR_OK);
    assert_int_equal(kvr_load_block_tag(lt, w, b.seq[0], &tag), KVR_ENOTFOUND);
    /* the next request to hold the block tags it anew */
    assert_int_equal(kvr_load_admit_tagged(lt, &rb, 3, 300, 396, &hb), KVR_OK);
    assert_int_equal(kvr_load_block_tag(lt, w, b.seq[0], &tag), KVR_OK);
    assert_int_equal(tag, 300);
    verify(lt);
    kvr_load_free(lt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_prefix_counts_once),
        cmocka_unit_test(test_no_kv_reuse_never_dedups),
        cmocka_unit_test(test_first_token_drops_prefill),
        cmocka_unit_test(test_prefill_not_tracked),
        cmocka_unit_test(test_active_blocks_not_tracked),
        cmocka_unit_test(test_unknown_and_double_free_are_counted_noops),
        cmocka_unit_test(test_duplicate_id_rejected_first_unchanged),
        cmocka_unit_test(test_full_drain_is_exactly_zero),
        cmocka_unit_test(test_expiry_frees_stale_requests),
        cmocka_unit_test(test_output_blocks_and_decay),
        cmocka_unit_test(test_output_blocks_off_is_noop),
        cmocka_unit_test(test_projection),
        cmocka_unit_test(test_remove_worker),
        cmocka_unit_test(test_max_requests),
        cmocka_unit_test(test_peer_budget),
        cmocka_unit_test(test_bad_arguments_change_nothing),
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_steady_state_memory_is_flat),
        cmocka_unit_test(test_tags_and_marks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_approx.c: approximate mode: routing decisions become overlap, expire after the TTL,
 * and the recorded size is pruned (deepest blocks of the oldest decisions first); with a rank's
 * capacity known, its least recently recorded blocks are evicted past it (deepest first within
 * a decision), a re-recorded prefix moves to the back, other ranks are untouched, a capacity
 * set late trims at once, and a removed rank starts empty; a model-based run checks that a
 * bounded rank never holds more than its capacity and holds exactly the blocks an LRU of its
 * decisions would; and a model-based run of requests in flight (kvr_approx_begin, _output,
 * _end) against the engine's own block pool checks that the model caches exactly the prompt
 * blocks the engine does.
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
#include "core/approx.h"
#include "core/load.h"
#include "kvrouter.h"

#include "sim/kvcache.h"

typedef struct prompt {
    uint64_t lbh[32], seq[32];
    size_t n;
} prompt_t;

static prompt_t mk(uint64_t base, size_t n)
{
    prompt_t p = {.n = n};
    for (size_t i = 0; i < n; i++)
        p.lbh[i] = base * 1000 + i;
    kvr_hash_chain(p.lbh, n, p.seq);
    return p;
}

static uint32_t dev(kvr_index_t *ix, const prompt_t *p, kvr_worker_t w)
{
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    assert_int_equal(kvr_index_lookup(ix, p->seq, p->n, &lk), KVR_OK);
    uint32_t d = 0;
    for (size_t i = 0; i < lk.n_matches; i++)
        if (lk.matches[i].worker.worker_id == w.worker_id &&
            lk.matches[i].worker.dp_rank == w.dp_rank)
            d = lk.matches[i].device_blocks;
    kvr_lookup_deinit(&lk);
    return d;
}

static kvr_index_t *mkindex(void)
{
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE};
    int st;
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    assert_non_null(ix);
    return ix;
}

static void test_decisions_expire_after_ttl(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    kvr_approx_config_t cfg = {.ttl_ms = 1000};
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, &cfg, &st);
    assert_non_null(ap);
    kvr_worker_t w = {7, 0};
    prompt_t p = mk(1, 8);
    assert_int_equal(kvr_approx_record(ap, w, p.lbh, p.seq, p.n, 10000), KVR_OK);
    assert_int_equal(dev(ix, &p, w), 8);
    assert_int_equal(kvr_approx_size(ap), 8);
    assert_int_equal(kvr_approx_next_expiry(ap), 11000);
    assert_int_equal(kvr_approx_expire(ap, 10999), 0);
    assert_int_equal(dev(ix, &p, w), 8);
    /* a second decision sharing the first 4 blocks refreshes them */
    prompt_t q = mk(1, 4);
    assert_int_equal(kvr_approx_record(ap, w, q.lbh, q.seq, q.n, 10500), KVR_OK);
    assert_int_equal(kvr_approx_expire(ap, 11000), 4);
    assert_int_equal(dev(ix, &p, w), 4);
    assert_int_equal(kvr_approx_expire(ap, 11500), 4);
    assert_int_equal(dev(ix, &p, w), 0);
    assert_int_equal(kvr_approx_size(ap), 0);
    kvr_index_stats_t xs;
    kvr_index_stats(ix, &xs);
    assert_int_equal(xs.pairs, 0);
    assert_int_equal(xs.err_block_not_found, 0);
    kvr_approx_free(ap);
    kvr_index_free(ix);
}

static void test_size_pruning_keeps_prefixes(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    kvr_approx_config_t cfg = {.ttl_ms = 60000, .max_tree_size = 20, .prune_target_ratio = 0.5};
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, &cfg, &st);
    assert_non_null(ap);
    kvr_worker_t w = {1, 0};
    prompt_t a = mk(1, 10), b = mk(2, 10), c = mk(3, 6);
    assert_int_equal(kvr_approx_record(ap, w, a.lbh, a.seq, a.n, 1000), KVR_OK);
    assert_int_equal(kvr_approx_record(ap, w, b.lbh, b.seq, b.n, 2000), KVR_OK);
    assert_int_equal(kvr_approx_size(ap), 20);
    /* 6 more blocks: prune first, to min(10, 20 - 6) = 10 entries: all of a goes */
    assert_int_equal(kvr_approx_record(ap, w, c.lbh, c.seq, c.n, 3000), KVR_OK);
    assert_true(kvr_approx_size(ap) <= 20);
    assert_int_equal(dev(ix, &a, w), 0);
    assert_int_equal(dev(ix, &b, w), 10);
    assert_int_equal(dev(ix, &c, w), 6);
    kvr_index_stats_t xs;
    kvr_index_stats(ix, &xs);
    assert_int_equal(xs.pairs, kvr_approx_size(ap));
    /* with equal expiries the deepest blocks go first: b keeps a prefix */
    prompt_t d = mk(4, 12);
    assert_int_equal(kvr_approx_record(ap, w, d.lbh, d.seq, d.n, 3000), KVR_OK);
    assert_true(kvr_approx_size(ap) <= 20);
    uint32_t kept_b = dev(ix, &b, w);
    assert_true(kept_b < 10);
    kvr_approx_free(ap);
    kvr_index_free(ix);
}

static void test_remove_worker_and_validation(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, NULL, &st);
    assert_non_null(ap);
    prompt_t p = mk(1, 5);
    assert_int_equal(kvr_approx_record(ap, (kvr_worker_t){1, 0}, p.lbh, p.seq, p.n, 0), KVR_OK);
    assert_int_equal(kvr_approx_record(ap, (kvr_worker_t){2, 0}, p.lbh, p.seq, p.n, 0), KVR_OK);
    assert_int_equal(kvr_approx_remove_worker(ap, 1), KVR_OK);
    assert_int_equal(kvr_approx_size(ap), 5);
    assert_int_equal(dev(ix, &p, (kvr_worker_t){1, 0}), 0);
    assert_int_equal(dev(ix, &p, (kvr_worker_t){2, 0}), 5);
    assert_int_equal(kvr_approx_expire(ap, 120000), 5);
    kvr_approx_free(ap);

    const char *field = NULL;
    kvr_approx_config_t bad = {.prune_target_ratio = NAN};
    assert_int_equal(kvr_approx_config_validate(&bad, &field), KVR_EINVAL);
    assert_string_equal(field, "router_prune_target_ratio");
    bad.prune_target_ratio = 1.5;
    assert_int_equal(kvr_approx_config_validate(&bad, &field), KVR_EINVAL);
    bad.prune_target_ratio = -0.1;
    assert_int_equal(kvr_approx_config_validate(&bad, &field), KVR_EINVAL);
    assert_null(kvr_approx_new(ix, &bad, &st));
    assert_int_equal(st, KVR_EINVAL);
    /* an index smaller than the tracker's size would evict behind its back */
    kvr_index_config_t small = {.sync = KVR_SYNC_NONE, .max_pairs = 100};
    kvr_index_t *ix2 = kvr_index_new(&small, &st);
    kvr_approx_config_t big = {.max_tree_size = 1000};
    assert_null(kvr_approx_new(ix2, &big, &st));
    assert_int_equal(st, KVR_ERANGE);
    kvr_index_free(ix2);
    kvr_index_free(ix);
}

static void test_capacity_evicts_lru(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    kvr_approx_config_t cfg = {.ttl_ms = 1000000};
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, &cfg, &st);
    assert_non_null(ap);
    kvr_worker_t w = {7, 0}, v = {7, 1};
    assert_int_equal(kvr_approx_set_capacity(ap, w, 10), KVR_OK);
    prompt_t a = mk(1, 8), b = mk(2, 8), c = mk(3, 3);
    assert_int_equal(kvr_approx_record(ap, w, a.lbh, a.seq, a.n, 1), KVR_OK);
    assert_int_equal(kvr_approx_record(ap, v, b.lbh, b.seq, b.n, 1), KVR_OK); /* unbounded */
    assert_int_equal(kvr_approx_record(ap, w, b.lbh, b.seq, b.n, 2), KVR_OK);
    /* 16 on w, capacity 10: a's 6 deepest blocks go, its first 2 stay */
    assert_int_equal(dev(ix, &a, w), 2);
    assert_int_equal(dev(ix, &b, w), 8);
    assert_int_equal(dev(ix, &b, v), 8);
    assert_int_equal(kvr_approx_evicted(ap), 6);
    /* a's prefix recorded again moves to the back: c then evicts b's deepest, not a's */
    prompt_t a2 = mk(1, 2);
    assert_int_equal(kvr_approx_record(ap, w, a2.lbh, a2.seq, a2.n, 3), KVR_OK);
    assert_int_equal(kvr_approx_record(ap, w, c.lbh, c.seq, c.n, 4), KVR_OK);
    assert_int_equal(dev(ix, &a, w), 2);
    assert_int_equal(dev(ix, &b, w), 5);
    assert_int_equal(dev(ix, &c, w), 3);
    /* a capacity set late trims at once; 0 lifts the bound */
    assert_int_equal(kvr_approx_set_capacity(ap, v, 4), KVR_OK);
    assert_int_equal(dev(ix, &b, v), 4);
    /* a removed rank starts empty, its bound kept */
    assert_int_equal(kvr_approx_remove_rank(ap, w), KVR_OK);
    assert_int_equal(dev(ix, &b, w), 0);
    assert_int_equal(kvr_approx_record(ap, w, a.lbh, a.seq, a.n, 5), KVR_OK);
    assert_int_equal(kvr_approx_record(ap, w, c.lbh, c.seq, c.n, 6), KVR_OK);
    assert_int_equal(dev(ix, &a, w), 7);
    assert_int_equal(dev(ix, &c, w), 3);
    kvr_approx_free(ap);
    kvr_index_free(ix);
}

/* Model: a bounded rank's recorded blocks equal an LRU list of its decisions' blocks (touched
 * deepest first within a decision), over random prompts sharing prefixes. */
static void test_capacity_model(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    kvr_approx_config_t cfg = {.ttl_ms = UINT64_C(1) << 40};
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, &cfg, &st);
    kvr_worker_t w = {1, 0};
    const size_t cap = 37;
    assert_int_equal(kvr_approx_set_capacity(ap, w, cap), KVR_OK);
    uint64_t lru[4096]; /* seq hashes, least recent first */
    size_t n_lru = 0;
    kvr_rng_t rng;
    kvr_rng_seed(&rng, 42);
    for (int step = 0; step < 3000; step++) {
        prompt_t p = mk(1 + kvr_rng_below(&rng, 6), 1 + (size_t)kvr_rng_below(&rng, 20));
        assert_int_equal(kvr_approx_record(ap, w, p.lbh, p.seq, p.n, (uint64_t)step), KVR_OK);
        for (size_t i = p.n; i-- > 0;) {
            for (size_t k = 0; k < n_lru; k++)
                if (lru[k] == p.seq[i]) {
                    memmove(lru + k, lru + k + 1, (n_lru - k - 1) * sizeof *lru);
                    n_lru--;
                    break;
                }
            lru[n_lru++] = p.seq[i];
        }
        while (n_lru > cap) {
            memmove(lru, lru + 1, (n_lru - 1) * sizeof *lru);
            n_lru--;
        }
        assert_int_equal(kvr_approx_size(ap), n_lru);
        assert_true(kvr_approx_size(ap) <= cap);
        if (step % 97 == 0) {
            kvr_index_stats_t xs;
            kvr_index_stats(ix, &xs);
            assert_int_equal(xs.pairs, n_lru);
        }
    }
    kvr_approx_free(ap);
    kvr_index_free(ix);
}

/* ---- the model of requests in flight against the engine's block pool (sim/kvcache.h) ---- */

#define EBS 4                                /* tokens per block */
#define ECAP 64                              /* the engine's blocks, and the rank's capacity */
#define EMAXOUT 6                            /* output blocks a request fills at most */
#define ESLOTS 5                             /* requests in flight at most */
#define OUT_TAG (UINT64_C(0x80000000) << 32) /* output hashes: this high half, a counter */
#define IS_OUT(h) ((h) >> 32 == OUT_TAG >> 32)
#define EFAMILIES 8 /* prompts are prefixes of these chains */
#define EMAXLEN 24

typedef struct ereq {
    bool live;
    uint64_t key;
    prompt_t p;
    uint64_t hashes[32 + EMAXOUT]; /* the prompt's, then its outputs' */
    size_t n_out;
    kvr_kvcache_seq_t kseq;
} ereq_t;

/* The engine's cached prompt blocks equal the model's: as deep a prefix of every family's
 * chain (the engine's cache is prefix-closed: a chain's blocks are freed deepest first, and a
 * shared block only when its last holder ends), and as many blocks. */
static void same_cache(kvr_kvcache_t *kc, kvr_approx_t *ap, kvr_index_t *ix, kvr_worker_t w)
{
    uint64_t hs[ECAP];
    size_t n = kvr_kvcache_cached_hashes(kc, hs, ECAP), prompts = 0;
    assert_true(n <= ECAP);
    for (size_t i = 0; i < n; i++)
        prompts += !IS_OUT(hs[i]);
    assert_int_equal(kvr_approx_size(ap), prompts);
    size_t deep = 0;
    for (uint64_t f = 1; f <= EFAMILIES; f++) {
        prompt_t p = mk(f, EMAXLEN);
        size_t d = kvr_kvcache_match(kc, p.seq, p.n);
        assert_int_equal(dev(ix, &p, w), d);
        deep += d;
    }
    assert_int_equal(deep, prompts);
}

static bool engine_admit(kvr_kvcache_t *kc, ereq_t *r)
{
    size_t hit = kvr_kvcache_match(kc, r->p.seq, r->p.n);
    uint64_t toks = r->p.n * EBS;
    if (kvr_kvcache_blocks_needed(kc, &r->kseq, r->p.seq, hit, toks) > kvr_kvcache_n_free(kc))
        return false; /* an engine would queue it */
    static uint32_t tokens[(32 + EMAXOUT) * EBS];
    assert_int_equal(kvr_kvcache_allocate(kc, &r->kseq, r->p.seq, hit, toks), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &r->kseq, r->p.seq, tokens, r->p.n), KVR_OK);
    return true;
}

static bool engine_output(kvr_kvcache_t *kc, ereq_t *r, uint64_t out_hash)
{
    size_t n = r->p.n + r->n_out;
    memcpy(r->hashes, r->p.seq, r->p.n * sizeof *r->hashes);
    r->hashes[n] = out_hash;
    if (kvr_kvcache_blocks_needed(kc, &r->kseq, r->hashes, 0, (n + 1) * EBS) >
        kvr_kvcache_n_free(kc))
        return false; /* an engine would preempt */
    static uint32_t tokens[(32 + EMAXOUT) * EBS];
    assert_int_equal(kvr_kvcache_allocate(kc, &r->kseq, r->hashes, 0, (n + 1) * EBS), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &r->kseq, r->hashes, tokens, n + 1), KVR_OK);
    r->n_out++;
    return true;
}

static void test_requests_match_engine_cache(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    kvr_approx_config_t cfg = {.ttl_ms = UINT64_C(1) << 40};
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, &cfg, &st);
    kvr_kvcache_config_t kcfg = {.num_blocks = ECAP, .block_size = EBS, .prefix_caching = true};
    kvr_kvcache_t *kc = kvr_kvcache_new(&kcfg, NULL, NULL, &st);
    assert_non_null(kc);
    kvr_worker_t w = {3, 0};
    assert_int_equal(kvr_approx_set_capacity(ap, w, ECAP), KVR_OK);
    for (uint64_t f = 1; f <= EFAMILIES; f++) { /* no prompt hash looks like an output's */
        prompt_t p = mk(f, EMAXLEN);
        for (size_t i = 0; i < p.n; i++)
            assert_false(IS_OUT(p.seq[i]));
    }
    ereq_t rq[ESLOTS] = {0};
    for (size_t i = 0; i < ESLOTS; i++)
        kvr_kvcache_seq_init(&rq[i].kseq);
    kvr_rng_t rng;
    kvr_rng_seed(&rng, 7);
    uint64_t gen = 0, outs = 0, admitted = 0, evicted_before = 0;
    for (uint64_t step = 1; step <= 20000; step++) {
        ereq_t *r = &rq[kvr_rng_below(&rng, ESLOTS)];
        if (!r->live) { /* a new request: prompts of one family share prefixes */
            r->p = mk(1 + kvr_rng_below(&rng, EFAMILIES), 1 + (size_t)kvr_rng_below(&rng, EMAXLEN));
            r->n_out = 0;
            if (engine_admit(kc, r)) {
                r->key = (++gen << 32) | (uint64_t)(r - rq);
                r->live = true;
                admitted++;
                assert_int_equal(kvr_approx_begin(ap, r->key, w, r->p.lbh, r->p.seq, r->p.n, step),
                                 KVR_OK);
                assert_int_equal(kvr_approx_start(ap, r->key, step), KVR_OK);
            }
        } else if (r->n_out < EMAXOUT && kvr_rng_below(&rng, 3) != 0) {
            if (engine_output(kc, r, OUT_TAG | ++outs))
                assert_int_equal(kvr_approx_output(ap, r->key), KVR_OK);
        } else {
            kvr_kvcache_release(kc, &r->kseq);
            assert_int_equal(kvr_approx_end(ap, r->key, step), KVR_OK);
            assert_int_equal(kvr_approx_end(ap, r->key, step), KVR_ENOTFOUND);
            r->live = false;
        }
        same_cache(kc, ap, ix, w);
        if (step % 53 == 0) {
            char msg[256] = "";
            if (kvr_approx_verify(ap, msg, sizeof msg) != KVR_OK)
                fail_msg("step %llu: %s", (unsigned long long)step, msg);
        }
        if (step == 10000)
            evicted_before = kvr_approx_evicted(ap);
    }
    /* the run did what it is for: many requests, outputs and evictions */
    assert_true(admitted > 2000);
    assert_true(outs > 2000);
    assert_true(kvr_approx_evicted(ap) > evicted_before + 1000);
    for (size_t i = 0; i < ESLOTS; i++) {
        kvr_kvcache_release(kc, &rq[i].kseq);
        kvr_kvcache_seq_deinit(&rq[i].kseq);
    }
    kvr_kvcache_free(kc);
    kvr_approx_free(ap);
    kvr_index_free(ix);
}

static void verified(kvr_approx_t *ap)
{
    char msg[256] = "";
    if (kvr_approx_verify(ap, msg, sizeof msg) != KVR_OK)
        fail_msg("%s", msg);
}

/* Requests in flight: held blocks outlive the capacity, an unstarted request holds nothing, a
 * reused slot ends its old request, a removed rank forgets its requests. */
static void test_requests_in_flight(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex();
    kvr_approx_config_t cfg = {.ttl_ms = 1000000};
    int st;
    kvr_approx_t *ap = kvr_approx_new(ix, &cfg, &st);
    kvr_worker_t w = {5, 0};
    assert_int_equal(kvr_approx_set_capacity(ap, w, 10), KVR_OK);
    prompt_t a = mk(1, 8), b = mk(2, 8), c = mk(3, 4);
    uint64_t ka = UINT64_C(1) << 32 | 1, kb = UINT64_C(1) << 32 | 2, kc = UINT64_C(1) << 32 | 3;
    assert_int_equal(kvr_approx_begin(ap, 0, w, a.lbh, a.seq, a.n, 1), KVR_EINVAL);
    assert_int_equal(kvr_approx_output(ap, ka), KVR_ENOTFOUND);
    assert_int_equal(kvr_approx_begin(ap, ka, w, a.lbh, a.seq, a.n, 1), KVR_OK);
    assert_int_equal(kvr_approx_start(ap, ka, 2), KVR_OK);
    assert_int_equal(kvr_approx_begin(ap, kb, w, b.lbh, b.seq, b.n, 3), KVR_OK);
    assert_int_equal(kvr_approx_start(ap, kb, 4), KVR_OK);
    /* 16 blocks held on a capacity of 10: an engine holds what it runs */
    assert_int_equal(dev(ix, &a, w), 8);
    assert_int_equal(dev(ix, &b, w), 8);
    assert_int_equal(kvr_approx_output(ap, ka), KVR_OK);
    verified(ap);
    /* a ends: its output and then its deepest blocks go first, down to the capacity (b's 8
     * are held, so 2 - 1 output = a's first block stays) */
    assert_int_equal(kvr_approx_end(ap, ka, 5), KVR_OK);
    assert_int_equal(kvr_approx_end(ap, ka, 5), KVR_ENOTFOUND);
    assert_int_equal(dev(ix, &a, w), 2);
    assert_int_equal(dev(ix, &b, w), 8);
    verified(ap);
    /* a routed request that never started holds nothing: c's blocks and a's go before b's */
    assert_int_equal(kvr_approx_begin(ap, kc, w, c.lbh, c.seq, c.n, 6), KVR_OK);
    assert_int_equal(dev(ix, &b, w), 8);
    assert_int_equal(dev(ix, &c, w) + dev(ix, &a, w), 2);
    verified(ap);
    /* the slot of b reused by a new request: b ends first, its blocks now evictable */
    uint64_t kb2 = UINT64_C(2) << 32 | 2;
    assert_int_equal(kvr_approx_begin(ap, kb2, w, c.lbh, c.seq, c.n, 7), KVR_OK);
    assert_int_equal(kvr_approx_output(ap, kb), KVR_ENOTFOUND);
    assert_int_equal(kvr_approx_start(ap, kb2, 8), KVR_OK);
    assert_int_equal(kvr_approx_size(ap), 10);
    assert_int_equal(dev(ix, &c, w), 4);
    verified(ap);
    /* a removed rank forgets its requests in flight */
    assert_int_equal(kvr_approx_remove_rank(ap, w), KVR_OK);
    assert_int_equal(kvr_approx_end(ap, kb2, 9), KVR_ENOTFOUND);
    assert_int_equal(kvr_approx_size(ap), 0);
    verified(ap);
    kvr_approx_free(ap);
    kvr_index_free(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_evicts_lru),
        cmocka_unit_test(test_capacity_model),
        cmocka_unit_test(test_requests_match_engine_cache),
        cmocka_unit_test(test_requests_in_flight),
        cmocka_unit_test(test_decisions_expire_after_ttl),
        cmocka_unit_test(test_size_pruning_keeps_prefixes),
        cmocka_unit_test(test_remove_worker_and_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_index.c: unit tests of the prefix index: what a router user relies on, one behaviour
 * per test (scores per worker, error atomicity, counters, tiers, eviction order, dump).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"

static const kvr_worker_t W1 = {1, 0}, W1R1 = {1, 1}, W2 = {2, 0}, W3 = {3, 0};

/* A prompt: lbh[i] = base + i, so prompts with the same base share their prefix. */
typedef struct prompt {
    uint64_t lbh[64], seq[64];
    size_t n;
} prompt_t;

static prompt_t mk(uint64_t base, size_t n, size_t diverge_at)
{
    prompt_t p = {.n = n};
    for (size_t i = 0; i < n; i++)
        p.lbh[i] = i < diverge_at ? base * 1000 + i : base * 1000 + i + 500000;
    kvr_hash_chain(p.lbh, n, p.seq);
    return p;
}

/* Stores blocks [from, to) of p for w, engine hash = seq (the mocker's convention). */
static int store(kvr_index_t *ix, kvr_worker_t w, const prompt_t *p, size_t from, size_t to,
                 kvr_tier_t tier)
{
    kvr_block_t b[64];
    for (size_t i = from; i < to; i++)
        b[i - from] = (kvr_block_t){.ext = p->seq[i], .lbh = p->lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED,
                      .worker = w,
                      .tier = tier,
                      .has_parent = from > 0,
                      .parent_ext = from > 0 ? p->seq[from - 1] : 0,
                      .blocks = b,
                      .n_blocks = to - from};
    return kvr_index_apply(ix, &ev);
}

static int remove_blocks(kvr_index_t *ix, kvr_worker_t w, const uint64_t *ext, size_t n,
                         kvr_tier_t tier)
{
    kvr_event_t ev = {.kind = KVR_EV_REMOVED, .worker = w, .tier = tier, .removed = ext, .n_removed = n};
    return kvr_index_apply(ix, &ev);
}

static const kvr_match_t *find(const kvr_lookup_t *lk, kvr_worker_t w)
{
    for (size_t i = 0; i < lk->n_matches; i++)
        if (lk->matches[i].worker.worker_id == w.worker_id &&
            lk->matches[i].worker.dp_rank == w.dp_rank)
            return &lk->matches[i];
    return NULL;
}

static uint32_t dev(kvr_index_t *ix, const prompt_t *p, kvr_worker_t w)
{
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    assert_int_equal(kvr_index_lookup(ix, p->seq, p->n, &lk), KVR_OK);
    const kvr_match_t *m = find(&lk, w);
    uint32_t d = m ? m->device_blocks : 0;
    kvr_lookup_deinit(&lk);
    return d;
}

static void verify(kvr_index_t *ix)
{
    char msg[256] = "";
    int rc = kvr_index_verify(ix, msg, sizeof msg);
    if (rc != KVR_OK)
        fail_msg("verify: %s", msg);
}

static kvr_index_t *mkindex(size_t max_pairs)
{
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE, .max_pairs = max_pairs};
    int st;
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    assert_non_null(ix);
    assert_int_equal(st, KVR_OK);
    return ix;
}

static void test_prefix_per_worker(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 10, 10);
    assert_int_equal(store(ix, W1, &p, 0, 10, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W2, &p, 0, 4, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W3, &p, 0, 1, KVR_TIER_DEVICE), KVR_OK);
    verify(ix);
    assert_int_equal(dev(ix, &p, W1), 10);
    assert_int_equal(dev(ix, &p, W2), 4);
    assert_int_equal(dev(ix, &p, W3), 1);
    /* a prompt diverging after 6 blocks */
    prompt_t q = mk(1, 12, 6);
    assert_int_equal(dev(ix, &q, W1), 6);
    assert_int_equal(dev(ix, &q, W2), 4);
    /* a miss: nobody listed */
    prompt_t miss = mk(2, 5, 5);
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    assert_int_equal(kvr_index_lookup(ix, miss.seq, miss.n, &lk), KVR_OK);
    assert_int_equal(lk.n_matches, 0);
    /* empty prompt */
    assert_int_equal(kvr_index_lookup(ix, NULL, 0, &lk), KVR_OK);
    assert_int_equal(lk.n_matches, 0);
    kvr_lookup_deinit(&lk);
    kvr_index_free(ix);
}

static void test_unknown_parent_applies_nothing(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 6, 6);
    assert_int_equal(store(ix, W1, &p, 0, 2, KVR_TIER_DEVICE), KVR_OK);
    /* blocks 3..5 under block 2's hash, which W1 never stored */
    assert_int_equal(store(ix, W1, &p, 3, 6, KVR_TIER_DEVICE), KVR_EPARENT);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.pairs, 2);
    assert_int_equal(st.err_parent_not_found, 1);
    /* another worker's block is not this worker's parent */
    assert_int_equal(store(ix, W2, &p, 2, 4, KVR_TIER_DEVICE), KVR_EPARENT);
    kvr_index_stats(ix, &st);
    assert_int_equal(st.pairs, 2);
    assert_int_equal(kvr_index_worker_pairs(ix, W2), 0);
    verify(ix);
    kvr_index_free(ix);
}

static void test_repeated_hash_rejected(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 4, 4);
    assert_int_equal(store(ix, W1, &p, 0, 2, KVR_TIER_DEVICE), KVR_OK);
    kvr_block_t b[2] = {{.ext = 77, .lbh = 5}, {.ext = 77, .lbh = 6}};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = W1, .blocks = b, .n_blocks = 2};
    assert_int_equal(kvr_index_apply(ix, &ev), KVR_EBLOCKSEQ);
    /* self reference: a block carrying its parent's hash */
    kvr_block_t c = {.ext = p.seq[1], .lbh = 9};
    kvr_event_t ev2 = {.kind = KVR_EV_STORED, .worker = W1, .has_parent = true,
                       .parent_ext = p.seq[1], .blocks = &c, .n_blocks = 1};
    assert_int_equal(kvr_index_apply(ix, &ev2), KVR_EBLOCKSEQ);
    /* the worker's other blocks are kept */
    assert_int_equal(dev(ix, &p, W1), 2);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.err_invalid_sequence, 2);
    assert_int_equal(st.pairs, 2);
    verify(ix);
    kvr_index_free(ix);
}

static void test_duplicate_store_and_unknown_remove_counted(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 4, 4);
    assert_int_equal(store(ix, W1, &p, 0, 4, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W1, &p, 0, 4, KVR_TIER_DEVICE), KVR_OK);
    uint64_t bad[3] = {p.seq[3], 12345, 999};
    assert_int_equal(remove_blocks(ix, W1, bad, 3, KVR_TIER_DEVICE), KVR_OK);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.warn_duplicate_store, 4);
    assert_int_equal(st.err_block_not_found, 2);
    assert_int_equal(st.pairs, 3); /* the known one went, the rest of the batch applied */
    assert_int_equal(dev(ix, &p, W1), 3);
    /* removal from a worker the index never saw: counted, no worker created */
    assert_int_equal(remove_blocks(ix, W3, bad, 1, KVR_TIER_DEVICE), KVR_OK);
    kvr_index_stats(ix, &st);
    assert_int_equal(st.workers, 1);
    verify(ix);
    kvr_index_free(ix);
}

/* S20: forced 64-bit collisions. Another worker's different prompt whose first block hashes
 * (sequence and engine hash) collide with this one's: the worst outcome is a match that is
 * not real (a sub-optimal route); removing the colliding worker's blocks never touches the
 * first worker's, and the structure stays valid throughout. */
static void test_forced_collisions_are_advisory(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 4, 4), q = mk(2, 4, 4);
    q.seq[0] = p.seq[0]; /* the collision */
    assert_int_equal(store(ix, W1, &p, 0, 4, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W2, &q, 0, 4, KVR_TIER_DEVICE), KVR_OK);
    verify(ix);
    assert_int_equal(dev(ix, &p, W1), 4);
    /* advisory: at most the colliding block matches falsely, and the colliding worker's own
     * prefix may be found short (its first block is bound to the other prefix): at worst a
     * worse pick, never a wrong worker's blocks beyond the collision */
    assert_true(dev(ix, &p, W2) <= 1);
    assert_true(dev(ix, &q, W2) <= 4);
    assert_true(dev(ix, &q, W1) <= 1);
    assert_int_equal(remove_blocks(ix, W2, q.seq, 4, KVR_TIER_DEVICE), KVR_OK);
    verify(ix);
    assert_int_equal(dev(ix, &p, W1), 4); /* no cross-worker leak */
    assert_int_equal(dev(ix, &p, W2), 0);
    assert_int_equal(dev(ix, &q, W2), 0);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.pairs, 4);
    kvr_index_free(ix);
}

static void test_mid_chain_remove_and_restore(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 8, 8);
    assert_int_equal(store(ix, W1, &p, 0, 8, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(remove_blocks(ix, W1, &p.seq[3], 1, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(dev(ix, &p, W1), 3); /* the hole stops the prefix */
    verify(ix);
    /* the engine stores block 3 again: blocks 4..7 (still cached) count again */
    assert_int_equal(store(ix, W1, &p, 3, 4, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(dev(ix, &p, W1), 8);
    verify(ix);
    kvr_index_free(ix);
}

static void test_clear_only_emitting_rank_and_remove_worker(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 5, 5);
    assert_int_equal(store(ix, W1, &p, 0, 5, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W1R1, &p, 0, 5, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W2, &p, 0, 5, KVR_TIER_DEVICE), KVR_OK);
    kvr_event_t clr = {.kind = KVR_EV_CLEARED, .worker = W1};
    assert_int_equal(kvr_index_apply(ix, &clr), KVR_OK);
    assert_int_equal(dev(ix, &p, W1), 0);
    assert_int_equal(dev(ix, &p, W1R1), 5);
    verify(ix);
    assert_int_equal(kvr_index_remove_worker(ix, 1), KVR_OK);
    assert_int_equal(dev(ix, &p, W1R1), 0);
    assert_int_equal(dev(ix, &p, W2), 5);
    assert_int_equal(kvr_index_remove_worker(ix, 1), KVR_ENOWORKER);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.pairs, 5);
    assert_int_equal(st.workers, 1);
    verify(ix);
    kvr_index_free(ix);
}

/* The standalone indexer unregisters one (instance, dp_rank) at a time: the other ranks of the
 * worker keep what they hold, and the removed rank's slot is free again. */
static void test_remove_one_rank(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 5, 5);
    assert_int_equal(store(ix, W1, &p, 0, 5, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W1R1, &p, 0, 3, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(kvr_index_remove_rank(ix, W1R1), KVR_OK);
    assert_int_equal(dev(ix, &p, W1R1), 0);
    assert_int_equal(dev(ix, &p, W1), 5);
    assert_int_equal(kvr_index_remove_rank(ix, W1R1), KVR_ENOWORKER);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.pairs, 5);
    assert_int_equal(st.workers, 1);
    verify(ix);
    assert_int_equal(store(ix, W1R1, &p, 0, 2, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(dev(ix, &p, W1R1), 2);
    verify(ix);
    kvr_index_free(ix);
}

static void test_lower_tiers_extend_device_prefix(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 10, 10);
    /* device 0..3, host 0..6 (overlapping the device part), disk 6..8 */
    assert_int_equal(store(ix, W1, &p, 0, 4, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W1, &p, 0, 7, KVR_TIER_HOST), KVR_OK);
    assert_int_equal(store(ix, W1, &p, 7, 9, KVR_TIER_DISK), KVR_OK);
    /* a host-only worker */
    assert_int_equal(store(ix, W2, &p, 0, 3, KVR_TIER_HOST), KVR_OK);
    verify(ix);
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    assert_int_equal(kvr_index_lookup(ix, p.seq, p.n, &lk), KVR_OK);
    const kvr_match_t *m = find(&lk, W1);
    assert_non_null(m);
    assert_int_equal(m->device_blocks, 4);
    assert_int_equal(m->host_blocks, 3);
    assert_int_equal(m->disk_blocks, 2);
    m = find(&lk, W2);
    assert_non_null(m);
    assert_int_equal(m->device_blocks, 0);
    assert_int_equal(m->host_blocks, 3);
    assert_int_equal(m->disk_blocks, 0);
    /* evicting block 2 from the device leaves it in host memory */
    assert_int_equal(remove_blocks(ix, W1, &p.seq[2], 1, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(kvr_index_lookup(ix, p.seq, p.n, &lk), KVR_OK);
    m = find(&lk, W1);
    assert_int_equal(m->device_blocks, 2);
    assert_int_equal(m->host_blocks, 5);
    assert_int_equal(kvr_index_holds(ix, W1, p.seq[2]), 1u << KVR_TIER_HOST);
    kvr_lookup_deinit(&lk);
    verify(ix);
    kvr_index_free(ix);
}

static void test_engine_hashes_differ_per_worker(void **s)
{
    (void)s;
    /* vLLM without a fixed PYTHONHASHSEED: same content, different engine hashes */
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 6, 6);
    for (int w = 0; w < 3; w++) {
        kvr_worker_t wk = {(uint64_t)w + 10, 0};
        kvr_block_t b[6];
        for (int i = 0; i < 6; i++)
            b[i] = (kvr_block_t){.ext = (uint64_t)w * 1000000 + (uint64_t)i + 1, .lbh = p.lbh[i]};
        kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = wk, .blocks = b, .n_blocks = 6};
        assert_int_equal(kvr_index_apply(ix, &ev), KVR_OK);
    }
    verify(ix);
    for (int w = 0; w < 3; w++)
        assert_int_equal(dev(ix, &p, (kvr_worker_t){(uint64_t)w + 10, 0}), 6);
    /* each worker removes by its own hash */
    uint64_t r = 2000000 + 4;
    assert_int_equal(remove_blocks(ix, (kvr_worker_t){12, 0}, &r, 1, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(dev(ix, &p, (kvr_worker_t){12, 0}), 3);
    assert_int_equal(dev(ix, &p, (kvr_worker_t){11, 0}), 6);
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    assert_int_equal(st.nodes, 6);
    verify(ix);
    kvr_index_free(ix);
}

static size_t n_evicted;
static void count_evict(void *ud, kvr_worker_t w, uint64_t ext, unsigned tiers)
{
    (void)ud;
    (void)w;
    (void)ext;
    (void)tiers;
    n_evicted++;
}

static void test_budget_evicts_cold_leaves_first(void **s)
{
    (void)s;
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE, .max_pairs = 40, .on_evict = count_evict};
    int st;
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    assert_non_null(ix);
    n_evicted = 0;
    /* a shared 8-block system prompt, then conversations of 4 blocks each */
    prompt_t conv[12];
    for (int c = 0; c < 12; c++) {
        conv[c] = mk(1, 12, 8);
        for (size_t i = 8; i < 12; i++)
            conv[c].lbh[i] += (uint64_t)c * 100;
        kvr_hash_chain(conv[c].lbh, 12, conv[c].seq);
    }
    for (int c = 0; c < 6; c++)
        assert_int_equal(store(ix, W1, &conv[c], c == 0 ? 0 : 8, 12, KVR_TIER_DEVICE), KVR_OK);
    /* 8 + 6*4 = 32 pairs; keep conversation 0 hot */
    assert_int_equal(dev(ix, &conv[0], W1), 12);
    for (int c = 6; c < 12; c++) {
        assert_int_equal(store(ix, W1, &conv[c], 8, 12, KVR_TIER_DEVICE), KVR_OK);
        assert_int_equal(dev(ix, &conv[0], W1), 12);
        kvr_index_stats_t sst;
        kvr_index_stats(ix, &sst);
        assert_true(sst.pairs <= 40);
        verify(ix);
    }
    assert_true(n_evicted > 0);
    /* the shared prefix and the hot conversation survived; the newest one too */
    assert_int_equal(dev(ix, &conv[0], W1), 12);
    assert_int_equal(dev(ix, &conv[11], W1), 12);
    kvr_index_stats_t sst;
    kvr_index_stats(ix, &sst);
    assert_int_equal(sst.evicted_pairs, n_evicted);
    kvr_index_free(ix);
}

static int replay(void *ud, const kvr_event_t *ev) { return kvr_index_apply(ud, ev); }

static void test_dump_replays_to_same_index(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 9, 9), q = mk(1, 9, 5);
    assert_int_equal(store(ix, W1, &p, 0, 9, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W2, &q, 0, 9, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W2, &q, 0, 9, KVR_TIER_HOST), KVR_OK);
    assert_int_equal(remove_blocks(ix, W1, &p.seq[4], 1, KVR_TIER_DEVICE), KVR_OK); /* a hole */
    kvr_index_t *copy = mkindex(0);
    assert_int_equal(kvr_index_dump(ix, replay, copy), KVR_OK);
    verify(copy);
    kvr_index_stats_t a, b;
    kvr_index_stats(ix, &a);
    kvr_index_stats(copy, &b);
    assert_int_equal(a.pairs, b.pairs);
    assert_int_equal(a.nodes, b.nodes);
    assert_int_equal(dev(copy, &p, W1), 4);
    assert_int_equal(dev(copy, &q, W2), 9);
    /* the hole is reproduced: restoring block 4 brings back 5..8 */
    assert_int_equal(store(copy, W1, &p, 4, 5, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(dev(copy, &p, W1), 9);
    for (int i = 0; i < 9; i++)
        assert_int_equal(kvr_index_holds(copy, W2, q.seq[i]), kvr_index_holds(ix, W2, q.seq[i]));
    kvr_index_free(copy);
    kvr_index_free(ix);
}

static void test_config_and_args_validated(void **s)
{
    (void)s;
    int st;
    kvr_index_config_t cfg = {.max_workers = 70000};
    assert_null(kvr_index_new(&cfg, &st));
    assert_int_equal(st, KVR_ERANGE);
    cfg = (kvr_index_config_t){.sync = (kvr_index_sync_t)9};
    assert_null(kvr_index_new(&cfg, &st));
    assert_int_equal(st, KVR_EINVAL);
    kvr_index_t *ix = mkindex(0);
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = W1, .tier = (kvr_tier_t)7};
    assert_int_equal(kvr_index_apply(ix, &ev), KVR_EINVAL);
    ev = (kvr_event_t){.kind = (kvr_event_kind_t)5, .worker = W1};
    assert_int_equal(kvr_index_apply(ix, &ev), KVR_EINVAL);
    ev = (kvr_event_t){.kind = KVR_EV_STORED, .worker = W1, .blocks = NULL, .n_blocks = 3};
    assert_int_equal(kvr_index_apply(ix, &ev), KVR_EINVAL);
    kvr_index_free(ix);
    kvr_index_free(NULL);
}

static void test_worker_slots_exhausted(void **s)
{
    (void)s;
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE, .max_workers = 2};
    int st;
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    prompt_t p = mk(1, 2, 2);
    assert_int_equal(store(ix, W1, &p, 0, 2, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W2, &p, 0, 2, KVR_TIER_DEVICE), KVR_OK);
    assert_int_equal(store(ix, W3, &p, 0, 2, KVR_TIER_DEVICE), KVR_EFULL);
    kvr_index_stats_t sst;
    kvr_index_stats(ix, &sst);
    assert_int_equal(sst.err_capacity, 1);
    /* a removed worker's slot is reused */
    assert_int_equal(kvr_index_remove_worker(ix, 1), KVR_OK);
    assert_int_equal(store(ix, W3, &p, 0, 2, KVR_TIER_DEVICE), KVR_OK);
    verify(ix);
    kvr_index_free(ix);
}

static void test_many_holders_overflow(void **s)
{
    (void)s;
    kvr_index_t *ix = mkindex(0);
    prompt_t p = mk(1, 8, 8);
    for (uint64_t w = 0; w < 300; w++)
        assert_int_equal(store(ix, (kvr_worker_t){w, 0}, &p, 0, 1 + w % 8, KVR_TIER_DEVICE),
                         KVR_OK);
    verify(ix);
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    assert_int_equal(kvr_index_lookup(ix, p.seq, p.n, &lk), KVR_OK);
    assert_int_equal(lk.n_matches, 300);
    assert_int_equal(lk.max_depth, 8);
    for (size_t i = 0; i < lk.n_matches; i++)
        assert_int_equal(lk.matches[i].device_blocks, 1 + lk.matches[i].worker.worker_id % 8);
    kvr_lookup_deinit(&lk);
    for (uint64_t w = 0; w < 300; w += 2)
        assert_int_equal(kvr_index_remove_worker(ix, w), KVR_OK);
    verify(ix);
    kvr_index_free(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_per_worker),
        cmocka_unit_test(test_remove_one_rank),
        cmocka_unit_test(test_unknown_parent_applies_nothing),
        cmocka_unit_test(test_repeated_hash_rejected),
        cmocka_unit_test(test_duplicate_store_and_unknown_remove_counted),
        cmocka_unit_test(test_forced_collisions_are_advisory),
        cmocka_unit_test(test_mid_chain_remove_and_restore),
        cmocka_unit_test(test_clear_only_emitting_rank_and_remove_worker),
        cmocka_unit_test(test_lower_tiers_extend_device_prefix),
        cmocka_unit_test(test_engine_hashes_differ_per_worker),
        cmocka_unit_test(test_budget_evicts_cold_leaves_first),
        cmocka_unit_test(test_dump_replays_to_same_index),
        cmocka_unit_test(test_config_and_args_validated),
        cmocka_unit_test(test_worker_slots_exhausted),
        cmocka_unit_test(test_many_holders_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

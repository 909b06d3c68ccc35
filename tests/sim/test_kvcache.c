/*
 * test_kvcache.c: the simulated engine's paged KV cache, one behaviour per test, each asserting
 * what the engine and the router rely on: a released prefix is hit again; eviction takes plain
 * blocks first, then the least recently released chain from its leaf; events describe exactly
 * the prefix table's changes (STORED runs with their parent and tokens, one REMOVED per
 * allocation, CLEARED); concurrent identical prefixes end up in one block with one STORED; a
 * refused allocation or reset changes nothing; without prefix caching nothing is cached.
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

#include "sim/kvcache.h"

#define MAX_EV 64
#define MAX_EV_H 64
#define MAX_EV_T 512

typedef struct evrec {
    kvr_kvcache_event_kind_t kind;
    uint64_t h[MAX_EV_H];
    size_t n;
    bool has_parent;
    uint64_t parent;
    uint32_t tok[MAX_EV_T];
} evrec_t;

typedef struct evlog {
    evrec_t ev[MAX_EV];
    size_t n;
    uint32_t bs;
} evlog_t;

static void sink(void *ctx, const kvr_kvcache_event_t *ev)
{
    evlog_t *lg = ctx;
    assert_true(lg->n < MAX_EV);
    assert_true(ev->n_hashes <= MAX_EV_H);
    evrec_t *r = &lg->ev[lg->n++];
    memset(r, 0, sizeof *r);
    r->kind = ev->kind;
    r->n = ev->n_hashes;
    if (ev->n_hashes > 0)
        memcpy(r->h, ev->hashes, ev->n_hashes * sizeof *r->h);
    r->has_parent = ev->has_parent;
    r->parent = ev->parent;
    if (ev->kind == KVR_KVC_STORED) {
        assert_true(ev->n_hashes * lg->bs <= MAX_EV_T);
        memcpy(r->tok, ev->tokens, ev->n_hashes * lg->bs * sizeof *r->tok);
    }
}

static kvr_kvcache_t *mk(uint32_t num_blocks, uint32_t bs, bool pc, evlog_t *lg)
{
    kvr_kvcache_config_t cfg = {.num_blocks = num_blocks, .block_size = bs, .prefix_caching = pc};
    memset(lg, 0, sizeof *lg);
    lg->bs = bs;
    int st = -100;
    kvr_kvcache_t *kc = kvr_kvcache_new(&cfg, sink, lg, &st);
    assert_int_equal(st, KVR_OK);
    assert_non_null(kc);
    return kc;
}

static void verify(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *const *seqs, size_t n)
{
    char msg[256] = "";
    int rc = kvr_kvcache_verify_msg(kc, seqs, n, msg, sizeof msg);
    if (rc != KVR_OK)
        fail_msg("verify: %s", msg);
    assert_int_equal(kvr_kvcache_verify(kc, NULL, 0), KVR_OK);
}

static kvr_kvcache_stats_t stats(const kvr_kvcache_t *kc)
{
    kvr_kvcache_stats_t s;
    memset(&s, 0xAB, sizeof s);
    kvr_kvcache_get_stats(kc, &s);
    return s;
}

/* Tokens of a sequence: base + position, so each block's tokens are recognisable. */
static void fill_tokens(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

static void assert_blocks(const kvr_kvcache_seq_t *s, const uint32_t *want, uint32_t n)
{
    assert_int_equal(s->n_blocks, n);
    for (uint32_t i = 0; i < n; i++)
        if (s->blocks[i] != want[i])
            fail_msg("position %u: block %u, expected %u", i, s->blocks[i], want[i]);
}

static void assert_stored(const evrec_t *e, const uint64_t *h, size_t n, bool has_parent,
                          uint64_t parent, const uint32_t *tok, uint32_t bs)
{
    assert_int_equal(e->kind, KVR_KVC_STORED);
    assert_int_equal(e->n, n);
    for (size_t i = 0; i < n; i++)
        assert_true(e->h[i] == h[i]);
    assert_int_equal(e->has_parent, has_parent);
    if (has_parent)
        assert_true(e->parent == parent);
    assert_memory_equal(e->tok, tok, n * bs * sizeof *tok);
}

static void assert_removed(const evrec_t *e, const uint64_t *h, size_t n)
{
    assert_int_equal(e->kind, KVR_KVC_REMOVED);
    assert_int_equal(e->n, n);
    for (size_t i = 0; i < n; i++)
        if (e->h[i] != h[i])
            fail_msg("removed[%zu] = %llu, expected %llu", i, (unsigned long long)e->h[i],
                     (unsigned long long)h[i]);
}

/* ---- tests ---- */

static void test_config_errors(void **state)
{
    (void)state;
    int st = 0;
    kvr_kvcache_config_t cfg = {.num_blocks = 0, .block_size = 16, .prefix_caching = true};
    assert_null(kvr_kvcache_new(&cfg, NULL, NULL, &st));
    assert_int_equal(st, KVR_EINVAL);
    cfg = (kvr_kvcache_config_t){.num_blocks = 8, .block_size = 0, .prefix_caching = true};
    st = 0;
    assert_null(kvr_kvcache_new(&cfg, NULL, NULL, &st));
    assert_int_equal(st, KVR_EINVAL);
    cfg = (kvr_kvcache_config_t){.num_blocks = UINT32_MAX, .block_size = 1};
    st = 0;
    assert_null(kvr_kvcache_new(&cfg, NULL, NULL, &st));
    assert_int_equal(st, KVR_EINVAL);
    st = 0;
    assert_null(kvr_kvcache_new(NULL, NULL, NULL, &st));
    assert_int_equal(st, KVR_EINVAL);
    assert_null(kvr_kvcache_new(NULL, NULL, NULL, NULL)); /* status optional */
    kvr_kvcache_free(NULL);
    kvr_kvcache_seq_deinit(NULL);

    /* a valid cache without a sink: everything works, no events go anywhere */
    cfg = (kvr_kvcache_config_t){.num_blocks = 1, .block_size = 1, .prefix_caching = true};
    kvr_kvcache_t *kc = kvr_kvcache_new(&cfg, NULL, NULL, &st);
    assert_non_null(kc);
    assert_int_equal(st, KVR_OK);
    assert_int_equal(kvr_kvcache_block_size(kc), 1);
    kvr_kvcache_stats_t s = stats(kc);
    assert_int_equal(s.num_blocks, 1);
    assert_int_equal(s.n_free_queue, 1);
    assert_int_equal(s.n_active, 0);
    assert_int_equal(s.n_cached, 0);
    assert_true(s.stored_blocks == 0 && s.removed_blocks == 0 && s.dedup_blocks == 0 &&
                s.resets == 0 && s.cleared_blocks == 0);
    kvr_kvcache_seq_t q;
    kvr_kvcache_seq_init(&q);
    uint64_t h = 7;
    uint32_t t = 3;
    assert_int_equal(kvr_kvcache_allocate(kc, &q, NULL, 0, 1), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &q, &h, &t, 1), KVR_OK);
    assert_true(kvr_kvcache_usage(kc) == 1.0);
    kvr_kvcache_release(kc, &q);
    assert_true(kvr_kvcache_usage(kc) == 0.0);
    assert_int_equal(kvr_kvcache_match(kc, &h, 1), 1);
    kvr_kvcache_seq_deinit(&q);
    kvr_kvcache_free(kc);
}

/* A released sequence's committed prefix is found and reused by the next one (hash 0 too). */
static void test_hit_after_release(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(8, 4, true, &lg);
    const uint64_t h[4] = {0, 11, 22, 33}; /* 0 is a legal hash */
    uint32_t tok[16];
    fill_tokens(tok, 16, 100);
    kvr_kvcache_seq_t a, b;
    kvr_kvcache_seq_init(&a);
    kvr_kvcache_seq_init(&b);
    const kvr_kvcache_seq_t *seqs[2] = {&a, &b};

    assert_int_equal(kvr_kvcache_match(kc, h, 4), 0);
    assert_int_equal(kvr_kvcache_allocate(kc, &a, h, 0, 10), KVR_OK); /* 3 blocks */
    assert_blocks(&a, (const uint32_t[]){0, 1, 2}, 3);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 2), KVR_OK);
    assert_int_equal(a.n_full, 2);
    assert_int_equal(kvr_kvcache_match(kc, h, 4), 2);
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 12), KVR_OK); /* no new block */
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 3), KVR_OK);
    verify(kc, seqs, 2);
    kvr_kvcache_release(kc, &a);
    assert_int_equal(a.n_blocks, 0);
    assert_int_equal(a.n_full, 0);
    verify(kc, seqs, 2);

    kvr_kvcache_stats_t s = stats(kc);
    assert_int_equal(s.n_cached, 3);
    assert_int_equal(s.n_active, 0);
    assert_int_equal(s.n_free_queue, 8);
    assert_int_equal(kvr_kvcache_match(kc, h, 4), 3);
    /* leading blocks only: the count stops at the first miss */
    assert_int_equal(kvr_kvcache_match(kc, (const uint64_t[]){0, 44, 11}, 3), 1);
    assert_int_equal(kvr_kvcache_match(kc, (const uint64_t[]){44, 0}, 2), 0);

    /* b: 13 tokens, 3 blocks hit, 1 new block */
    assert_int_equal(kvr_kvcache_blocks_needed(kc, &b, h, 3, 13), 4); /* 3 queued hits + 1 */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, h, 3, 13), KVR_OK);
    assert_blocks(&b, (const uint32_t[]){0, 1, 2, 3}, 4);
    assert_int_equal(b.n_full, 3);
    s = stats(kc);
    assert_int_equal(s.n_active, 4);
    assert_int_equal(s.n_free_queue, 4);
    assert_int_equal(s.n_cached, 3);
    verify(kc, seqs, 2);

    /* a hits the same blocks while b holds them: shared, refcount 2 */
    assert_int_equal(kvr_kvcache_blocks_needed(kc, &a, h, 2, 9), 1); /* active hits are free */
    assert_int_equal(kvr_kvcache_allocate(kc, &a, h, 2, 9), KVR_OK);
    assert_blocks(&a, (const uint32_t[]){0, 1, 4}, 3);
    verify(kc, seqs, 2);
    kvr_kvcache_release(kc, &b);
    s = stats(kc);
    assert_int_equal(s.n_active, 3); /* blocks 0, 1 still held by a, 4 */
    verify(kc, seqs, 2);
    kvr_kvcache_release(kc, &a);
    verify(kc, seqs, 2);
    assert_int_equal(stats(kc).n_active, 0);
    assert_int_equal(lg.n, 2); /* the two commits; no eviction happened */
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_seq_deinit(&b);
    kvr_kvcache_free(kc);
}

/* Plain blocks are reused first; then cached chains in release order, each from its leaf. */
static void test_eviction_order(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(6, 1, true, &lg);
    const uint64_t ha[2] = {0xA1, 0xA2}, hb[2] = {0xB1, 0xB2}, hd[2] = {0xD1, 0xD2};
    const uint32_t tok[2] = {1, 2};
    kvr_kvcache_seq_t a, b, c, d;
    kvr_kvcache_seq_init(&a);
    kvr_kvcache_seq_init(&b);
    kvr_kvcache_seq_init(&c);
    kvr_kvcache_seq_init(&d);
    const kvr_kvcache_seq_t *seqs[4] = {&a, &b, &c, &d};

    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 2), KVR_OK);
    assert_int_equal(kvr_kvcache_allocate(kc, &b, NULL, 0, 2), KVR_OK);
    assert_blocks(&a, (const uint32_t[]){0, 1}, 2);
    assert_blocks(&b, (const uint32_t[]){2, 3}, 2);
    assert_int_equal(kvr_kvcache_commit(kc, &a, ha, tok, 2), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &b, hb, tok, 2), KVR_OK);
    /* a released before b: a's chain is the least recently used */
    kvr_kvcache_release(kc, &a);
    kvr_kvcache_release(kc, &b);
    /* d: one committed block and a partial one; the partial one goes to the head */
    assert_int_equal(kvr_kvcache_allocate(kc, &d, NULL, 0, 2), KVR_OK);
    assert_blocks(&d, (const uint32_t[]){4, 5}, 2);
    assert_int_equal(kvr_kvcache_commit(kc, &d, hd, tok, 1), KVR_OK);
    kvr_kvcache_release(kc, &d);
    verify(kc, seqs, 4);
    /* queue now: 5 (plain), 1 (A2), 0 (A1), 3 (B2), 2 (B1), 4 (D1) */
    size_t n0 = lg.n;

    /* one block: the plain one, nothing evicted */
    assert_int_equal(kvr_kvcache_allocate(kc, &c, NULL, 0, 1), KVR_OK);
    assert_blocks(&c, (const uint32_t[]){5}, 1);
    assert_int_equal(lg.n, n0);
    assert_int_equal(stats(kc).removed_blocks, 0);

    /* three more: a's chain leaf first, then b's leaf: one REMOVED event for the call */
    assert_int_equal(kvr_kvcache_allocate(kc, &c, NULL, 0, 4), KVR_OK);
    assert_blocks(&c, (const uint32_t[]){5, 1, 0, 3}, 4);
    assert_int_equal(lg.n, n0 + 1);
    assert_removed(&lg.ev[n0], (const uint64_t[]){0xA2, 0xA1, 0xB2}, 3);
    assert_int_equal(kvr_kvcache_match(kc, ha, 2), 0);
    assert_int_equal(kvr_kvcache_match(kc, hb, 2), 1); /* B1 survives its leaf */
    kvr_kvcache_stats_t s = stats(kc);
    assert_int_equal(s.removed_blocks, 3);
    assert_int_equal(s.n_cached, 2); /* B1, D1 */
    verify(kc, seqs, 4);

    /* a hit refreshes: b hits B1 and releases it, so D1 is now the older one */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, hb, 1, 1), KVR_OK);
    assert_blocks(&b, (const uint32_t[]){2}, 1);
    kvr_kvcache_release(kc, &b);
    assert_int_equal(kvr_kvcache_allocate(kc, &c, NULL, 0, 5), KVR_OK);
    assert_int_equal(lg.n, n0 + 2);
    assert_removed(&lg.ev[n0 + 1], (const uint64_t[]){0xD1}, 1);
    assert_int_equal(kvr_kvcache_match(kc, hb, 1), 1);
    assert_int_equal(kvr_kvcache_match(kc, hd, 1), 0);
    verify(kc, seqs, 4);

    kvr_kvcache_release(kc, &c);
    verify(kc, seqs, 4);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_seq_deinit(&b);
    kvr_kvcache_seq_deinit(&c);
    kvr_kvcache_seq_deinit(&d);
    kvr_kvcache_free(kc);
}

/* STORED runs carry their parent and their tokens; a shared block between two runs splits them
 * and is still the second run's parent; CLEARED after reset. */
static void test_events(void **state)
{
    (void)state;
    evlog_t lg;
    const uint32_t bs = 2;
    kvr_kvcache_t *kc = mk(16, bs, true, &lg);
    const uint64_t h[4] = {10, 20, 30, 40};
    uint32_t tok[8];
    fill_tokens(tok, 8, 500);
    kvr_kvcache_seq_t a, x, y;
    kvr_kvcache_seq_init(&a);
    kvr_kvcache_seq_init(&x);
    kvr_kvcache_seq_init(&y);
    const kvr_kvcache_seq_t *seqs[3] = {&a, &x, &y};

    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 8), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 2), KVR_OK);
    assert_int_equal(lg.n, 1);
    assert_stored(&lg.ev[0], h, 2, false, 0, tok, bs);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 2), KVR_OK); /* nothing new */
    assert_int_equal(lg.n, 1);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 4), KVR_OK);
    assert_int_equal(lg.n, 2);
    assert_stored(&lg.ev[1], h + 2, 2, true, 20, tok + 4, bs);

    /* y holds (y0, C); x holds (x0, C, x2): hashes are opaque to the cache */
    const uint64_t hy[2] = {77, 99}, hx[3] = {55, 99, 66};
    uint32_t ty[4], tx[6];
    fill_tokens(ty, 4, 900);
    fill_tokens(tx, 6, 700);
    assert_int_equal(kvr_kvcache_allocate(kc, &y, NULL, 0, 4), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &y, hy, ty, 2), KVR_OK);
    assert_int_equal(kvr_kvcache_allocate(kc, &x, NULL, 0, 6), KVR_OK);
    size_t n0 = lg.n;
    assert_int_equal(kvr_kvcache_commit(kc, &x, hx, tx, 3), KVR_OK);
    assert_int_equal(lg.n, n0 + 2);
    assert_stored(&lg.ev[n0], hx, 1, false, 0, tx, bs);
    assert_stored(&lg.ev[n0 + 1], hx + 2, 1, true, 99, tx + 4, bs);
    assert_int_equal(x.blocks[1], y.blocks[1]);
    assert_int_equal(stats(kc).dedup_blocks, 1);
    verify(kc, seqs, 3);

    /* the event stream replays to the table's hashes */
    kvr_kvcache_stats_t s = stats(kc);
    assert_int_equal(s.stored_blocks, 8); /* a: 4, y: 2, x: 2 (one shared) */
    assert_int_equal(s.n_cached, 8);

    /* reset: refused while anything is active, then CLEARED */
    n0 = lg.n;
    assert_int_equal(kvr_kvcache_reset(kc), KVR_EBUSY);
    assert_int_equal(lg.n, n0);
    kvr_kvcache_release(kc, &a);
    kvr_kvcache_release(kc, &x);
    kvr_kvcache_release(kc, &y);
    assert_int_equal(kvr_kvcache_reset(kc), KVR_OK);
    assert_int_equal(lg.n, n0 + 1);
    assert_int_equal(lg.ev[n0].kind, KVR_KVC_CLEARED);
    assert_int_equal(lg.ev[n0].n, 0);
    s = stats(kc);
    assert_int_equal(s.n_cached, 0);
    assert_int_equal(s.resets, 1);
    assert_int_equal(s.cleared_blocks, 8);
    assert_int_equal(s.n_free_queue, 16);
    assert_int_equal(kvr_kvcache_cached_hashes(kc, NULL, 0), 0);
    assert_int_equal(kvr_kvcache_match(kc, h, 4), 0);
    verify(kc, seqs, 3);
    /* after a reset nothing is evicted (nothing is cached) */
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 32), KVR_OK);
    assert_int_equal(lg.n, n0 + 1);
    kvr_kvcache_release(kc, &a);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_seq_deinit(&x);
    kvr_kvcache_seq_deinit(&y);
    kvr_kvcache_free(kc);
}

/* Two requests prefill the same prompt at once: one STORED, then the second shares the first's
 * blocks and its own copies are the next blocks handed out. */
static void test_dedup(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(10, 4, true, &lg);
    const uint64_t h[3] = {1, 2, 3};
    uint32_t tok[12];
    fill_tokens(tok, 12, 40);
    kvr_kvcache_seq_t a, b, c;
    kvr_kvcache_seq_init(&a);
    kvr_kvcache_seq_init(&b);
    kvr_kvcache_seq_init(&c);
    const kvr_kvcache_seq_t *seqs[3] = {&a, &b, &c};

    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 13), KVR_OK); /* 0..3 */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, NULL, 0, 13), KVR_OK); /* 4..7 */
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 3), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &b, h, tok, 3), KVR_OK);
    assert_int_equal(lg.n, 1);
    assert_stored(&lg.ev[0], h, 3, false, 0, tok, 4);
    assert_blocks(&b, (const uint32_t[]){0, 1, 2, 7}, 4);
    assert_int_equal(b.n_full, 3);
    kvr_kvcache_stats_t s = stats(kc);
    assert_int_equal(s.dedup_blocks, 3);
    assert_int_equal(s.stored_blocks, 3);
    assert_int_equal(s.n_cached, 3);
    assert_int_equal(s.n_active, 5);     /* 0, 1, 2 shared; 3 and 7 partial */
    assert_int_equal(s.n_free_queue, 5); /* 6, 5, 4 at the head, then 8, 9 */
    verify(kc, seqs, 3);

    assert_int_equal(kvr_kvcache_allocate(kc, &c, NULL, 0, 16), KVR_OK);
    assert_blocks(&c, (const uint32_t[]){6, 5, 4, 8}, 4);
    assert_int_equal(lg.n, 1); /* the duplicates were never cached: nothing evicted */
    kvr_kvcache_release(kc, &c);

    kvr_kvcache_release(kc, &a);
    verify(kc, seqs, 3);
    assert_int_equal(kvr_kvcache_match(kc, h, 3), 3);
    kvr_kvcache_release(kc, &b);
    verify(kc, seqs, 3);
    s = stats(kc);
    assert_int_equal(s.n_active, 0);
    assert_int_equal(s.n_cached, 3);
    assert_int_equal(s.n_free_queue, 10);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_seq_deinit(&b);
    kvr_kvcache_seq_deinit(&c);
    kvr_kvcache_free(kc);
}

/* Everything observable about a cache, to compare before and after a refused call. */
typedef struct snap {
    kvr_kvcache_stats_t st;
    uint64_t cached[64];
    size_t n_cached;
    size_t n_events;
} snap_t;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static snap_t take_snap(const kvr_kvcache_t *kc, const evlog_t *lg)
{
    snap_t s;
    memset(&s, 0, sizeof s);
    s.st = stats(kc);
    s.n_cached = kvr_kvcache_cached_hashes(kc, s.cached, 64);
    assert_true(s.n_cached <= 64);
    qsort(s.cached, s.n_cached, sizeof *s.cached, cmp_u64);
    s.n_events = lg->n;
    return s;
}

static void assert_snap_equal(const snap_t *a, const snap_t *b)
{
    assert_memory_equal(&a->st, &b->st, sizeof a->st);
    assert_int_equal(a->n_cached, b->n_cached);
    assert_memory_equal(a->cached, b->cached, a->n_cached * sizeof *a->cached);
    assert_int_equal(a->n_events, b->n_events);
}

/* Builds: 2 cached blocks (h[0..2), in the queue after 2 plain ones), 2 plain free blocks. */
static kvr_kvcache_t *mk_ebusy(evlog_t *lg, const uint64_t *h, const uint32_t *tok)
{
    kvr_kvcache_t *kc = mk(4, 4, true, lg);
    kvr_kvcache_seq_t a;
    kvr_kvcache_seq_init(&a);
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 8), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 2), KVR_OK);
    kvr_kvcache_release(kc, &a);
    kvr_kvcache_seq_deinit(&a);
    return kc;
}

/* A refused allocation changes nothing: not the counters, the table, the events, the queue
 * order (the next allocation gets the same blocks as in a twin cache that was never refused),
 * nor the sequence. */
static void test_ebusy_changes_nothing(void **state)
{
    (void)state;
    const uint64_t h[2] = {5, 6};
    uint32_t tok[8];
    fill_tokens(tok, 8, 1);
    evlog_t lg, lg2;
    kvr_kvcache_t *kc = mk_ebusy(&lg, h, tok);
    kvr_kvcache_t *twin = mk_ebusy(&lg2, h, tok);
    kvr_kvcache_seq_t d, t;
    kvr_kvcache_seq_init(&d);
    kvr_kvcache_seq_init(&t);
    const kvr_kvcache_seq_t *seqs[1] = {&d};

    /* 2 queued hits + 3 new = 5 > 4 in the queue */
    assert_int_equal(kvr_kvcache_blocks_needed(kc, &d, h, 2, 20), 5);
    assert_int_equal(kvr_kvcache_n_free(kc), 4);
    snap_t before = take_snap(kc, &lg);
    assert_int_equal(kvr_kvcache_allocate(kc, &d, h, 2, 20), KVR_EBUSY);
    assert_int_equal(d.n_blocks, 0);
    assert_int_equal(d.n_full, 0);
    assert_null(d.blocks); /* not even the table grew */
    /* without the hits: 5 new blocks > 4 in the queue; and a length no cache could hold */
    assert_int_equal(kvr_kvcache_allocate(kc, &d, NULL, 0, 17), KVR_EBUSY);
    assert_int_equal(kvr_kvcache_allocate(kc, &d, NULL, 0, UINT64_MAX), KVR_EBUSY);
    snap_t after = take_snap(kc, &lg);
    assert_snap_equal(&before, &after);
    verify(kc, seqs, 1);

    /* at the limit it fits: 2 hits + 2 new = 4 */
    assert_int_equal(kvr_kvcache_blocks_needed(kc, &d, h, 2, 16), 4);
    assert_int_equal(kvr_kvcache_allocate(kc, &d, h, 2, 16), KVR_OK);
    assert_int_equal(kvr_kvcache_allocate(twin, &t, h, 2, 16), KVR_OK);
    assert_int_equal(d.n_blocks, 4);
    assert_memory_equal(d.blocks, t.blocks, 4 * sizeof *d.blocks);
    verify(kc, seqs, 1);

    /* growing a sequence that holds everything: refused, sequence unchanged */
    before = take_snap(kc, &lg);
    uint32_t held[4];
    memcpy(held, d.blocks, sizeof held);
    assert_int_equal(kvr_kvcache_blocks_needed(kc, &d, NULL, 0, 17), 1);
    assert_int_equal(kvr_kvcache_allocate(kc, &d, NULL, 0, 17), KVR_EBUSY);
    assert_int_equal(d.n_blocks, 4);
    assert_int_equal(d.n_full, 2);
    assert_memory_equal(d.blocks, held, sizeof held);
    after = take_snap(kc, &lg);
    assert_snap_equal(&before, &after);
    verify(kc, seqs, 1);
    /* shrinking is not a thing: fewer tokens than held is a no-op */
    assert_int_equal(kvr_kvcache_allocate(kc, &d, NULL, 0, 1), KVR_OK);
    assert_int_equal(d.n_blocks, 4);

    kvr_kvcache_release(kc, &d);
    kvr_kvcache_release(twin, &t);
    kvr_kvcache_seq_deinit(&d);
    kvr_kvcache_seq_deinit(&t);
    kvr_kvcache_free(kc);
    kvr_kvcache_free(twin);
}

static void test_reset_busy(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(4, 1, true, &lg);
    const uint64_t h[2] = {1, 2};
    const uint32_t tok[2] = {1, 2};
    kvr_kvcache_seq_t a;
    kvr_kvcache_seq_init(&a);
    const kvr_kvcache_seq_t *seqs[1] = {&a};
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 2), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 1), KVR_OK);
    snap_t before = take_snap(kc, &lg);
    assert_int_equal(kvr_kvcache_reset(kc), KVR_EBUSY);
    snap_t after = take_snap(kc, &lg);
    assert_snap_equal(&before, &after);
    assert_int_equal(kvr_kvcache_match(kc, h, 2), 1);
    verify(kc, seqs, 1);
    kvr_kvcache_release(kc, &a);
    assert_int_equal(kvr_kvcache_reset(kc), KVR_OK);
    assert_int_equal(lg.ev[lg.n - 1].kind, KVR_KVC_CLEARED);
    assert_int_equal(kvr_kvcache_reset(kc), KVR_OK); /* an empty cache resets too */
    assert_int_equal(lg.ev[lg.n - 1].kind, KVR_KVC_CLEARED);
    assert_int_equal(stats(kc).resets, 2);
    verify(kc, seqs, 1);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_free(kc);
}

/* Without prefix caching: commit only moves n_full, nothing is cached, nothing is emitted,
 * released blocks are plain (head), and a hit is invalid. */
static void test_no_prefix_caching(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(4, 2, false, &lg);
    const uint64_t h[2] = {1, 2};
    uint32_t tok[4];
    fill_tokens(tok, 4, 1);
    kvr_kvcache_seq_t a, b;
    kvr_kvcache_seq_init(&a);
    kvr_kvcache_seq_init(&b);
    const kvr_kvcache_seq_t *seqs[2] = {&a, &b};
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 4), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 2), KVR_OK);
    assert_int_equal(a.n_full, 2);
    assert_int_equal(kvr_kvcache_match(kc, h, 2), 0);
    assert_int_equal(kvr_kvcache_allocate(kc, &b, NULL, 0, 4), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &b, h, tok, 2), KVR_OK);
    assert_int_equal(b.blocks[0], 2); /* no dedup */
    verify(kc, seqs, 2);
    kvr_kvcache_release(kc, &a);
    kvr_kvcache_release(kc, &b);
    assert_int_equal(kvr_kvcache_allocate(kc, &b, h, 1, 4), KVR_EINVAL);
    assert_int_equal(kvr_kvcache_allocate(kc, &b, NULL, 0, 2), KVR_OK);
    assert_int_equal(b.blocks[0], 2); /* b released last: its first block heads the queue */
    kvr_kvcache_release(kc, &b);
    assert_int_equal(kvr_kvcache_reset(kc), KVR_OK);
    kvr_kvcache_stats_t s = stats(kc);
    assert_int_equal(s.stored_blocks, 0);
    assert_int_equal(s.n_cached, 0);
    assert_int_equal(s.dedup_blocks, 0);
    assert_int_equal(lg.n, 0);
    verify(kc, seqs, 2);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_seq_deinit(&b);
    kvr_kvcache_free(kc);
}

/* Bad arguments are refused with nothing changed. */
static void test_invalid_args(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(16, 2, true, &lg);
    const uint64_t h[4] = {1, 2, 3, 4};
    uint32_t tok[16];
    fill_tokens(tok, 16, 1);
    kvr_kvcache_seq_t a, b;
    kvr_kvcache_seq_init(&a);
    kvr_kvcache_seq_init(&b);
    const kvr_kvcache_seq_t *seqs[2] = {&a, &b};
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 4), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &a, h, tok, 2), KVR_OK);
    kvr_kvcache_release(kc, &a);
    snap_t before = take_snap(kc, &lg);

    assert_int_equal(kvr_kvcache_allocate(kc, &b, h, 3, 8), KVR_EINVAL);   /* h[2] not cached */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, h, 2, 3), KVR_EINVAL);   /* 2 full > 3 tok */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, NULL, 1, 3), KVR_EINVAL);
    assert_int_equal(kvr_kvcache_allocate(kc, &b, (const uint64_t[]){1, 1}, 2, 8), KVR_EINVAL);
    assert_int_equal(kvr_kvcache_allocate(NULL, &b, NULL, 0, 3), KVR_EINVAL);
    assert_int_equal(kvr_kvcache_allocate(kc, NULL, NULL, 0, 3), KVR_EINVAL);
    assert_true(kvr_kvcache_blocks_needed(kc, &b, h, 3, 8) == UINT64_MAX);
    assert_int_equal(b.n_blocks, 0);
    assert_int_equal(kvr_kvcache_allocate(kc, &b, h, 2, 4), KVR_OK); /* exactly covered */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, h, 1, 8), KVR_EINVAL); /* blocks held */
    assert_int_equal(kvr_kvcache_commit(kc, &b, h, tok, 1), KVR_EINVAL);  /* below n_full */
    assert_int_equal(kvr_kvcache_commit(kc, &b, h, tok, 3), KVR_EINVAL);  /* beyond held */
    assert_int_equal(kvr_kvcache_commit(kc, &b, h, tok, 2), KVR_OK);      /* no-op */
    assert_int_equal(kvr_kvcache_allocate(kc, &b, NULL, 0, 8), KVR_OK);
    assert_int_equal(kvr_kvcache_commit(kc, &b, NULL, tok, 3), KVR_EINVAL);
    assert_int_equal(kvr_kvcache_commit(kc, &b, h, NULL, 3), KVR_EINVAL);
    /* a hash repeated inside the sequence: against a committed block, inside the range */
    assert_int_equal(kvr_kvcache_commit(kc, &b, (const uint64_t[]){1, 2, 1, 9}, tok, 3),
                     KVR_EINVAL);
    assert_int_equal(kvr_kvcache_commit(kc, &b, (const uint64_t[]){1, 2, 8, 8}, tok, 4),
                     KVR_EINVAL);
    assert_int_equal(b.n_full, 2);
    assert_int_equal(b.n_blocks, 4);
    verify(kc, seqs, 2);
    snap_t after = take_snap(kc, &lg);
    before.st.n_active = after.st.n_active; /* b holds its blocks */
    before.st.n_free_queue = after.st.n_free_queue;
    assert_snap_equal(&before, &after);
    assert_int_equal(kvr_kvcache_match(kc, (const uint64_t[]){8}, 1), 0);
    /* the same commit with distinct hashes goes through */
    assert_int_equal(kvr_kvcache_commit(kc, &b, (const uint64_t[]){1, 2, 8, 9}, tok, 4),
                     KVR_OK);
    assert_int_equal(lg.ev[lg.n - 1].n, 2);
    verify(kc, seqs, 2);
    kvr_kvcache_release(kc, &b);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_seq_deinit(&b);
    kvr_kvcache_free(kc);
}

/* A sequence's table grows past its first capacity in steps, keeping its blocks in order. */
static void test_seq_growth(void **state)
{
    (void)state;
    evlog_t lg;
    kvr_kvcache_t *kc = mk(100, 3, true, &lg);
    kvr_kvcache_seq_t a;
    kvr_kvcache_seq_init(&a);
    const kvr_kvcache_seq_t *seqs[1] = {&a};
    for (uint64_t t = 1; t <= 300; t += 7) {
        assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, t), KVR_OK);
        assert_int_equal(a.n_blocks, (t + 2) / 3);
        for (uint32_t i = 0; i < a.n_blocks; i++)
            assert_int_equal(a.blocks[i], i);
        verify(kc, seqs, 1);
    }
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 300), KVR_OK);
    assert_int_equal(a.n_blocks, 100);
    assert_true(kvr_kvcache_usage(kc) == 1.0);
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 301), KVR_EBUSY);
    kvr_kvcache_release(kc, &a);
    /* every block was plain: they come back at the head, first block first */
    assert_int_equal(kvr_kvcache_allocate(kc, &a, NULL, 0, 1), KVR_OK);
    assert_int_equal(a.blocks[0], 0);
    kvr_kvcache_release(kc, &a);
    kvr_kvcache_seq_deinit(&a);
    kvr_kvcache_free(kc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_hit_after_release),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_dedup),
        cmocka_unit_test(test_ebusy_changes_nothing),
        cmocka_unit_test(test_reset_busy),
        cmocka_unit_test(test_no_prefix_caching),
        cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_seq_growth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

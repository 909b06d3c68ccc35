/*
 * bench_hashtab.c: `kvrouter bench hashtab`: the load tracker's block table on the tree's own
 * table template (base/oatab.h) against what Debian ships: Concurrency Kit's ck_hs
 * (libck-dev) and uthash (uthash-dev). The evidence for keeping our own (oatab.h's comment).
 *
 * Workload (the load tracker's, per request admitted and freed): keys are (worker slot,
 * 64-bit block hash) with a 32-bit refcount and weight, L live keys (--pairs, 1M; 100K with
 * --quick) over 16 worker slots. Each round: a find that hits, a find that misses, an insert
 * of a new key and the delete of a random live one, so L stays constant. Entries for ck_hs
 * and uthash come from one preallocated pool (no malloc per insert, the fairest setting for
 * them); ck_hs stores pointers to them with a cached-hash mode off, uthash links them through
 * its intrusive handle. Memory: the table's bytes per live key, entries included.
 * Figures: ns per operation (median of --runs), bytes per key.
 */
#include <ck_hs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "bench.h"
#include "base/oatab.h"

typedef struct blk {
    uint64_t hash;
    uint32_t wslot;
    uint32_t refs;   /* 0 = empty (oatab) */
    uint32_t weight;
    uint32_t pad_;
} blk_t;

static size_t bhash(uint32_t wslot, uint64_t h) { return (size_t)kvr_mix64(h + kvr_mix64(wslot + 1)); }

/* ---- ours ---- */

typedef struct ours {
    blk_t *t;
    size_t mask, n;
} ours_t;

#define B_HOME(c, e) bhash((e)->wslot, (e)->hash)
#define B_EMPTY(e) ((e)->refs == 0)
#define B_CLEAR(e) ((e)->refs = 0)
KVR_OATAB_DEFINE(bt, ours_t, blk_t, B_HOME, B_EMPTY, B_CLEAR)

static bool b_match(const ours_t *o, const blk_t *e, const void *k)
{
    (void)o;
    const blk_t *q = k;
    return e->hash == q->hash && e->wslot == q->wslot;
}

static blk_t *ours_find(ours_t *o, const blk_t *k)
{
    return bt_find(o, o->t, o->mask, bhash(k->wslot, k->hash), b_match, k);
}

static bool ours_insert(ours_t *o, const blk_t *k)
{
    if (2 * (o->n + 1) > o->mask + 1 && bt_rehash(o, &o->t, &o->mask, 2 * (o->mask + 1)) != KVR_OK)
        return false;
    o->t[bt_free_slot(o->t, o->mask, bhash(k->wslot, k->hash))] = *k;
    o->n++;
    return true;
}

static void ours_delete(ours_t *o, const blk_t *k)
{
    blk_t *e = ours_find(o, k);
    if (e != NULL) {
        bt_remove_at(o, o->t, o->mask, (size_t)(e - o->t));
        o->n--;
    }
}

/* ---- ck_hs ---- */

static void *ck_malloc(size_t n) { return malloc(n); }
static void ck_free(void *p, size_t n, bool defer)
{
    (void)n;
    (void)defer;
    free(p);
}
static struct ck_malloc CK_ALLOC = {.malloc = ck_malloc, .free = ck_free};

static unsigned long ck_hash(const void *k, unsigned long seed)
{
    const blk_t *b = k;
    return (unsigned long)(bhash(b->wslot, b->hash) ^ seed);
}

static bool ck_cmp(const void *a, const void *b)
{
    const blk_t *x = a, *y = b;
    return x->hash == y->hash && x->wslot == y->wslot;
}

/* ---- uthash ---- */

typedef struct ublk {
    struct {
        uint64_t hash;
        uint32_t wslot;
        uint32_t pad_;
    } key;
    uint32_t refs, weight;
    UT_hash_handle hh;
} ublk_t;

/* ---- the workload ---- */

enum { IMPL_OURS, IMPL_CK, IMPL_UT, N_IMPL };
static const char *const NAMES[N_IMPL] = {"oatab", "ck_hs", "uthash"};

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 7, 0},        {"table", KVR_BENCH_STR, 6, 0},
    {"keys", KVR_BENCH_INT, 8, 0},         {"runs", KVR_BENCH_INT, 4, 0},
    {"find_hit_ns", KVR_BENCH_NUM, 11, 1}, {"find_miss_ns", KVR_BENCH_NUM, 12, 1},
    {"insert_ns", KVR_BENCH_NUM, 9, 1},    {"delete_ns", KVR_BENCH_NUM, 9, 1},
    {"bytes_per_key", KVR_BENCH_NUM, 13, 1},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

typedef struct state {
    size_t live, rounds;
    blk_t *keys;       /* the live keys (the model), live of them */
    blk_t *pool;       /* ck_hs's entries */
    ublk_t *upool;     /* uthash's entries */
    size_t pool_next;
    kvr_bench_rng_t rng;
} state_t;

static blk_t new_key(state_t *s)
{
    return (blk_t){.hash = kvr_bench_rng_next(&s->rng), .wslot = (uint32_t)(kvr_bench_rng_below(&s->rng, 16)),
                   .refs = 1, .weight = 1u << 30};
}

/* Times one implementation: ns per op [hit, miss, insert, delete]; bytes per key. */
static bool run_impl(state_t *s, int impl, double ns[4], double *bytes)
{
    ours_t o = {0};
    ck_hs_t hs;
    ublk_t *uh = NULL;
    size_t cap = 16;
    while (cap < 2 * s->live)
        cap *= 2;
    if (impl == IMPL_OURS && bt_rehash(&o, &o.t, &o.mask, cap) != KVR_OK)
        return false;
    if (impl == IMPL_CK &&
        !ck_hs_init(&hs, CK_HS_MODE_SPMC | CK_HS_MODE_OBJECT, ck_hash, ck_cmp, &CK_ALLOC, cap, 7))
        return false;
    s->pool_next = 0;
    for (size_t i = 0; i < s->live; i++) { /* fill */
        blk_t k = s->keys[i];
        if (impl == IMPL_OURS) {
            ours_insert(&o, &k);
        } else if (impl == IMPL_CK) {
            blk_t *e = &s->pool[s->pool_next++];
            *e = k;
            ck_hs_put(&hs, CK_HS_HASH(&hs, ck_hash, e), e);
        } else {
            ublk_t *e = &s->upool[s->pool_next++];
            memset(e, 0, sizeof *e);
            e->key.hash = k.hash;
            e->key.wslot = k.wslot;
            HASH_ADD(hh, uh, key, sizeof e->key, e);
        }
    }
    uint64_t t[4] = {0};
    size_t found = 0;
    for (size_t r = 0; r < s->rounds; r++) {
        blk_t hit = s->keys[kvr_bench_rng_below(&s->rng, s->live)];
        blk_t miss = new_key(s);
        size_t victim = kvr_bench_rng_below(&s->rng, s->live);
        blk_t del = s->keys[victim];
        blk_t add = new_key(s);
        s->keys[victim] = add;
        uint64_t t0 = kvr_bench_now_ns();
        if (impl == IMPL_OURS) {
            found += ours_find(&o, &hit) != NULL;
            uint64_t t1 = kvr_bench_now_ns();
            found += ours_find(&o, &miss) != NULL;
            uint64_t t2 = kvr_bench_now_ns();
            ours_insert(&o, &add);
            uint64_t t3 = kvr_bench_now_ns();
            ours_delete(&o, &del);
            uint64_t t4 = kvr_bench_now_ns();
            t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, t[3] += t4 - t3;
        } else if (impl == IMPL_CK) {
            found += ck_hs_get(&hs, CK_HS_HASH(&hs, ck_hash, &hit), &hit) != NULL;
            uint64_t t1 = kvr_bench_now_ns();
            found += ck_hs_get(&hs, CK_HS_HASH(&hs, ck_hash, &miss), &miss) != NULL;
            uint64_t t2 = kvr_bench_now_ns();
            blk_t *e = &s->pool[s->pool_next++];
            *e = add;
            ck_hs_put(&hs, CK_HS_HASH(&hs, ck_hash, e), e);
            uint64_t t3 = kvr_bench_now_ns();
            ck_hs_remove(&hs, CK_HS_HASH(&hs, ck_hash, &del), &del);
            uint64_t t4 = kvr_bench_now_ns();
            t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, t[3] += t4 - t3;
        } else {
            ublk_t *e;
            ublk_t q = {0};
            q.key.hash = hit.hash, q.key.wslot = hit.wslot;
            HASH_FIND(hh, uh, &q.key, sizeof q.key, e);
            found += e != NULL;
            uint64_t t1 = kvr_bench_now_ns();
            q.key.hash = miss.hash, q.key.wslot = miss.wslot;
            HASH_FIND(hh, uh, &q.key, sizeof q.key, e);
            found += e != NULL;
            uint64_t t2 = kvr_bench_now_ns();
            e = &s->upool[s->pool_next++];
            memset(e, 0, sizeof *e);
            e->key.hash = add.hash, e->key.wslot = add.wslot;
            HASH_ADD(hh, uh, key, sizeof e->key, e);
            uint64_t t3 = kvr_bench_now_ns();
            q.key.hash = del.hash, q.key.wslot = del.wslot;
            HASH_FIND(hh, uh, &q.key, sizeof q.key, e);
            if (e != NULL)
                HASH_DEL(uh, e);
            uint64_t t4 = kvr_bench_now_ns();
            t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, t[3] += t4 - t3;
        }
    }
    for (int i = 0; i < 4; i++)
        ns[i] = (double)t[i] / (double)s->rounds - kvr_bench_timer_overhead_ns();
    if (impl == IMPL_OURS) {
        *bytes = (double)((o.mask + 1) * sizeof(blk_t)) / (double)s->live;
        free(o.t);
    } else if (impl == IMPL_CK) {
        /* the slot array (a pointer a slot) plus the entries themselves */
        *bytes = (double)(ck_hs_count(&hs) * sizeof(blk_t)) / (double)s->live +
                 (double)(cap * sizeof(void *)) / (double)s->live;
        ck_hs_destroy(&hs);
    } else {
        *bytes = (double)(HASH_COUNT(uh) * sizeof(ublk_t) +
                          (uh ? uh->hh.tbl->num_buckets * sizeof(UT_hash_bucket) : 0)) /
                 (double)s->live;
        HASH_CLEAR(hh, uh);
    }
    return found >= s->rounds; /* every hit found (misses are 64-bit random: never) */
}

int kvr_bench_hashtab(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_pairs = {1, {1000000}}, quick_pairs = {1, {100000}};
    const kvr_bench_list_t *pairs = kvr_bench_pick(&o->pairs, o->quick ? &quick_pairs : &def_pairs);
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t pi = 0; pi < pairs->n; pi++) {
        state_t s = {.live = pairs->v[pi], .rounds = o->quick ? 200000 : 1000000};
        s.keys = malloc(s.live * sizeof *s.keys);
        s.pool = malloc((s.live + s.rounds) * sizeof *s.pool); /* never reused while live */
        s.upool = malloc((s.live + s.rounds) * sizeof *s.upool);
        if (s.keys == NULL || s.pool == NULL || s.upool == NULL) {
            free(s.keys), free(s.pool), free(s.upool);
            fprintf(stderr, "kvrouter bench hashtab: out of memory\n");
            return 1;
        }
        for (int impl = 0; impl < N_IMPL; impl++) {
            double med[4][16], bytes = 0;
            unsigned runs = o->runs > 16 ? 16 : o->runs;
            for (unsigned r = 0; r < runs; r++) {
                kvr_bench_rng_seed(&s.rng, o->seed + r);
                for (size_t i = 0; i < s.live; i++)
                    s.keys[i] = new_key(&s);
                double ns[4];
                if (!run_impl(&s, impl, ns, &bytes)) {
                    fprintf(stderr, "kvrouter bench hashtab: %s failed\n", NAMES[impl]);
                    free(s.keys), free(s.pool), free(s.upool);
                    return 1;
                }
                for (int k = 0; k < 4; k++)
                    med[k][r] = ns[k];
            }
            kvr_bench_row_t row;
            kvr_bench_row_init(&row, COLS, N_COLS);
            kvr_bench_set_str(&row, "bench", "hashtab");
            kvr_bench_set_str(&row, "table", NAMES[impl]);
            kvr_bench_set_int(&row, "keys", (int64_t)s.live);
            kvr_bench_set_int(&row, "runs", runs);
            kvr_bench_set_num(&row, "find_hit_ns", kvr_bench_median(med[0], runs));
            kvr_bench_set_num(&row, "find_miss_ns", kvr_bench_median(med[1], runs));
            kvr_bench_set_num(&row, "insert_ns", kvr_bench_median(med[2], runs));
            kvr_bench_set_num(&row, "delete_ns", kvr_bench_median(med[3], runs));
            kvr_bench_set_num(&row, "bytes_per_key", bytes);
            kvr_bench_print_row(o, &row);
        }
        free(s.keys), free(s.pool), free(s.upool);
    }
    return 0;
}

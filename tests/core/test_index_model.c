/*
 * test_index_model.c: model-based randomized test of the prefix index.
 *
 * A naive model (per worker: which prefix paths it holds, at which tiers, under which engine
 * hash) and the real index receive the same random operations: stores (chains, with parents
 * held or not, repeated hashes, hashes moving between prefixes), removals (known and unknown,
 * per tier), clears, worker removals, budget evictions (reported by the index, checked to be
 * leaves, then applied to the model) and lookups. Every lookup and every return code is
 * compared, kvr_index_verify() runs after every operation, and a dump replayed into an empty
 * index must hold exactly the model's pairs. On failure the seed and step are printed;
 * KVR_TEST_SEED=<seed> reruns one seed (tests/common/model_driver.h).
 *
 * Paths live in a complete 4-ary tree of depth 6: path id 0 is the root, child(id, sym) =
 * 4 * id + sym + 1. Engine hashes are path + 8192 * variant, so a worker's hash can equal the
 * canonical one (variant 0), be its own (variant w + 1), or name another path (rebinding).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model_driver.h"

#include "kvrouter.h"

#define ALPHA 4
#define DEPTH 6
#define N_PATHS 5461 /* (4^7 - 1) / 3 */
#define N_EXT (8192 * 16)
#define N_WORKERS 6    /* the usual fleet */
#define MAX_WORKERS 72 /* a wide fleet: blocks with more holders than fit inline or scan fast */
#define NONE 0xFFFF

typedef struct mworker {
    uint16_t ext_to_path[N_EXT];
    uint8_t tiers[N_PATHS];
    uint32_t ext[N_PATHS];
} mworker_t;

typedef struct model {
    mworker_t w[MAX_WORKERS];
    int nw; /* workers of this seed: N_WORKERS or MAX_WORKERS */
    kvr_index_t *ix;
    uint64_t rng;
    unsigned long seed, step;
    char why[512];
    int failed;
} model_t;

static kvr_worker_t WORKERS[MAX_WORKERS] = {
    {11, 0}, {11, 1}, {22, 0}, {33, 0}, {33, 1}, {44, 0},
};

/* The wide fleet's other workers: ids 100.., two ranks for every other one. */
static void workers_init(void)
{
    for (int i = N_WORKERS; i < MAX_WORKERS; i++)
        WORKERS[i] =
            (kvr_worker_t){.worker_id = 100 + (uint64_t)(i / 2) * 2 + (uint64_t)(i % 4 == 3),
                           .dp_rank = (uint32_t)(i % 2)};
}

/* coverage of the run, so the test fails if it stops exercising a behaviour */
static struct {
    unsigned long evicted, rebound, parent_missing, invalid, dup, lookups_hit, lower_hits, holes,
        wide_hits;
} cov;

static uint64_t rnd(model_t *m)
{
    uint64_t z = (m->rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static unsigned below(model_t *m, unsigned n) { return (unsigned)(rnd(m) % n); }

static int path_depth(unsigned p)
{
    int d = 0;
    while (p != 0) {
        p = (p - 1) / ALPHA;
        d++;
    }
    return d;
}

static unsigned path_parent(unsigned p) { return (p - 1) / ALPHA; }
static unsigned path_sym(unsigned p) { return (p - 1) % ALPHA; }
static uint64_t sym_lbh(unsigned sym) { return UINT64_C(0xA5A5A5A5) * (sym + 1) + 7; }

/* Positions of path p from the root: out[0] is the depth-1 ancestor. */
static int path_positions(unsigned p, unsigned *out)
{
    int d = path_depth(p);
    for (int i = d - 1; i >= 0; i--) {
        out[i] = p;
        p = path_parent(p);
    }
    return d;
}

#define CHECK(m, cond, ...)                                                                 \
    do {                                                                                    \
        if (!(cond) && !(m)->failed) {                                                      \
            (m)->failed = 1;                                                                \
            snprintf((m)->why, sizeof (m)->why, __VA_ARGS__);                               \
        }                                                                                   \
    } while (0)

static void model_drop(mworker_t *w, unsigned p)
{
    w->ext_to_path[w->ext[p]] = NONE;
    w->tiers[p] = 0;
}

static void on_evict(void *ud, kvr_worker_t worker, uint64_t ext, unsigned tiers)
{
    model_t *m = ud;
    int wi = -1;
    for (int i = 0; i < m->nw; i++)
        if (WORKERS[i].worker_id == worker.worker_id && WORKERS[i].dp_rank == worker.dp_rank)
            wi = i;
    CHECK(m, wi >= 0 && ext < N_EXT, "evicted an unknown worker or hash");
    if (m->failed)
        return;
    mworker_t *w = &m->w[wi];
    unsigned p = w->ext_to_path[ext];
    CHECK(m, p != NONE && w->tiers[p] == tiers, "evicted pair (w%d, ext %llu) not in model", wi,
          (unsigned long long)ext);
    if (m->failed)
        return;
    /* leaf-first: nobody may hold a longer prefix through this one */
    for (int o = 0; o < m->nw; o++)
        for (unsigned c = 1; c < N_PATHS; c++) {
            if (m->w[o].tiers[c] == 0 || path_depth(c) <= path_depth(p))
                continue;
            unsigned a = c;
            while (path_depth(a) > path_depth(p))
                a = path_parent(a);
            CHECK(m, a != p, "evicted path %u is not a leaf (w%d holds %u)", p, o, c);
        }
    model_drop(w, p);
}

/* ---- operations ---- */

static uint32_t pick_ext(model_t *m, int wi, unsigned p)
{
    unsigned r = below(m, 100);
    if (r < 65)
        return p;
    if (r < 90)
        return p + 8192u * (unsigned)(wi % N_WORKERS + 1);
    if (r < 95)
        return below(m, N_PATHS) + 8192u * 15; /* may name another path: rebinding */
    return p + 8192u * (7 + below(m, 8));
}

static void op_store(model_t *m)
{
    int wi = (int)below(m, m->nw);
    mworker_t *w = &m->w[wi];
    kvr_tier_t tier = below(m, 4) == 0 ? (kvr_tier_t)(1 + below(m, 3)) : KVR_TIER_DEVICE;
    /* parent: root, a held path (by its hash), or an unknown hash */
    unsigned parent = 0;
    bool has_parent = false, parent_known = true;
    uint64_t parent_ext = 0;
    unsigned r = below(m, 10);
    if (r < 6) {
        unsigned cand = 1 + below(m, N_PATHS - 1);
        for (unsigned k = 0; k < N_PATHS && w->tiers[cand] == 0; k++)
            cand = cand % (N_PATHS - 1) + 1;
        if (w->tiers[cand] != 0 && path_depth(cand) < DEPTH) {
            parent = cand;
            has_parent = true;
            parent_ext = w->ext[cand];
        }
    } else if (r == 6) {
        has_parent = true;
        parent_known = false;
        parent_ext = N_EXT + below(m, 1000); /* never a model hash */
    }
    int room = DEPTH - path_depth(parent);
    int n = 1 + (int)below(m, (unsigned)(room < 4 ? room : 4));
    kvr_block_t blocks[8];
    unsigned paths[8];
    unsigned cur = parent;
    for (int i = 0; i < n; i++) {
        unsigned sym = below(m, ALPHA);
        cur = cur * ALPHA + sym + 1;
        paths[i] = cur;
        blocks[i].lbh = sym_lbh(sym);
        blocks[i].ext = pick_ext(m, wi, cur);
    }
    bool dup = below(m, 30) == 0 && n >= 2;
    if (dup)
        blocks[n - 1].ext = blocks[0].ext;
    bool self = below(m, 40) == 0 && has_parent && parent_known;
    if (self)
        blocks[0].ext = parent_ext;

    bool repeated = false;
    for (int i = 0; i < n; i++) {
        if (has_parent && blocks[i].ext == parent_ext)
            repeated = true;
        for (int j = i + 1; j < n; j++)
            if (blocks[i].ext == blocks[j].ext)
                repeated = true;
    }
    int expect = repeated ? KVR_EBLOCKSEQ : (has_parent && !parent_known) ? KVR_EPARENT : KVR_OK;
    if (expect == KVR_OK) {
        for (int i = 0; i < n; i++) {
            unsigned p = paths[i];
            uint32_t e = (uint32_t)blocks[i].ext;
            unsigned prev = w->ext_to_path[e];
            if (prev != NONE && prev != p)
                model_drop(w, prev);
            if (w->tiers[p] != 0 && w->ext[p] != e)
                w->ext_to_path[w->ext[p]] = NONE;
            w->ext[p] = e;
            w->ext_to_path[e] = (uint16_t)p;
            w->tiers[p] |= (uint8_t)(1u << tier);
        }
    }
    kvr_event_t ev = {.kind = KVR_EV_STORED,
                      .worker = WORKERS[wi],
                      .tier = tier,
                      .has_parent = has_parent,
                      .parent_ext = parent_ext,
                      .blocks = blocks,
                      .n_blocks = (size_t)n};
    int rc = kvr_index_apply(m->ix, &ev);
    CHECK(m, rc == expect, "store w%d: rc %s, expected %s", wi, kvr_status_name(rc),
          kvr_status_name(expect));
}

static void op_remove(model_t *m)
{
    int wi = (int)below(m, m->nw);
    mworker_t *w = &m->w[wi];
    kvr_tier_t tier = below(m, 4) == 0 ? (kvr_tier_t)(1 + below(m, 3)) : KVR_TIER_DEVICE;
    uint64_t hashes[6];
    int n = 1 + (int)below(m, 5);
    for (int i = 0; i < n; i++) {
        unsigned p = 1 + below(m, N_PATHS - 1);
        for (unsigned k = 0; k < 64 && w->tiers[p] == 0; k++)
            p = 1 + below(m, N_PATHS - 1);
        hashes[i] = w->tiers[p] != 0 && below(m, 8) != 0 ? w->ext[p] : N_EXT + below(m, 50);
    }
    for (int i = 0; i < n; i++) {
        if (hashes[i] >= N_EXT)
            continue;
        unsigned p = w->ext_to_path[hashes[i]];
        if (p == NONE || !(w->tiers[p] & (1u << tier)))
            continue;
        w->tiers[p] &= (uint8_t) ~(1u << tier);
        if (w->tiers[p] == 0)
            model_drop(w, p);
    }
    kvr_event_t ev = {.kind = KVR_EV_REMOVED,
                      .worker = WORKERS[wi],
                      .tier = tier,
                      .removed = hashes,
                      .n_removed = (size_t)n};
    int rc = kvr_index_apply(m->ix, &ev);
    CHECK(m, rc == KVR_OK, "remove w%d: rc %s", wi, kvr_status_name(rc));
}

static void op_clear(model_t *m)
{
    int wi = (int)below(m, m->nw);
    for (unsigned p = 1; p < N_PATHS; p++)
        if (m->w[wi].tiers[p])
            model_drop(&m->w[wi], p);
    kvr_event_t ev = {.kind = KVR_EV_CLEARED, .worker = WORKERS[wi]};
    int rc = kvr_index_apply(m->ix, &ev);
    CHECK(m, rc == KVR_OK, "clear w%d: rc %s", wi, kvr_status_name(rc));
}

static void op_remove_worker(model_t *m)
{
    uint64_t id = WORKERS[below(m, m->nw)].worker_id;
    bool any = false;
    for (int wi = 0; wi < m->nw; wi++) {
        if (WORKERS[wi].worker_id != id)
            continue;
        for (unsigned p = 1; p < N_PATHS; p++)
            if (m->w[wi].tiers[p])
                model_drop(&m->w[wi], p);
        any = true;
    }
    int rc = kvr_index_remove_worker(m->ix, id);
    /* the index knows a worker once it stored something; an unknown id is KVR_ENOWORKER */
    CHECK(m, any && (rc == KVR_OK || rc == KVR_ENOWORKER), "remove worker %llu: rc %s",
          (unsigned long long)id, kvr_status_name(rc));
}

static void expect_for(const model_t *m, int wi, const unsigned *pos, int d, uint32_t out[3])
{
    const mworker_t *w = &m->w[wi];
    int k = 0;
    while (k < d && (w->tiers[pos[k]] & 1))
        k++;
    int h = k;
    while (h < d && (w->tiers[pos[h]] & 2))
        h++;
    int s = h;
    while (s < d && (w->tiers[pos[s]] & 0xC))
        s++;
    out[0] = (uint32_t)k;
    out[1] = (uint32_t)(h - k);
    out[2] = (uint32_t)(s - h);
}

static void check_lookup(model_t *m, kvr_index_t *ix, kvr_lookup_t *lk, unsigned p)
{
    unsigned pos[DEPTH];
    int d = path_positions(p, pos);
    uint64_t lbh[DEPTH], seq[DEPTH];
    for (int i = 0; i < d; i++)
        lbh[i] = sym_lbh(path_sym(pos[i]));
    kvr_hash_chain(lbh, (size_t)d, seq);
    int rc = kvr_index_lookup(ix, seq, (size_t)d, lk);
    CHECK(m, rc == KVR_OK, "lookup rc %s", kvr_status_name(rc));
    if (lk->n_matches > 0)
        cov.lookups_hit++;
    if (lk->n_matches > 40)
        cov.wide_hits++; /* a first block with over 40 holders: the position table's regime */
    for (size_t k = 0; k < lk->n_matches; k++)
        if (lk->matches[k].host_blocks + lk->matches[k].disk_blocks > 0)
            cov.lower_hits++;
    for (int wi = 0; wi < m->nw; wi++) {
        uint32_t want[3];
        expect_for(m, wi, pos, d, want);
        uint32_t got[3] = {0, 0, 0};
        int seen = 0;
        for (size_t k = 0; k < lk->n_matches; k++) {
            const kvr_match_t *mt = &lk->matches[k];
            if (mt->worker.worker_id == WORKERS[wi].worker_id &&
                mt->worker.dp_rank == WORKERS[wi].dp_rank) {
                got[0] = mt->device_blocks;
                got[1] = mt->host_blocks;
                got[2] = mt->disk_blocks;
                seen++;
            }
        }
        CHECK(m, seen <= 1, "worker w%d listed %d times", wi, seen);
        CHECK(m, memcmp(got, want, sizeof got) == 0,
              "lookup path %u (depth %d) w%d: got %u/%u/%u, model %u/%u/%u", p, d, wi, got[0],
              got[1], got[2], want[0], want[1], want[2]);
    }
}

static void op_lookup(model_t *m, kvr_lookup_t *lk)
{
    unsigned p = 1 + below(m, N_PATHS - 1);
    check_lookup(m, m->ix, lk, p);
}

static int replay_into(void *ud, const kvr_event_t *ev)
{
    return kvr_index_apply(ud, ev) == KVR_OK ? 0 : 1;
}

static void check_dump(model_t *m, kvr_lookup_t *lk)
{
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE, .max_pairs = 1 << 20};
    int st;
    kvr_index_t *copy = kvr_index_new(&cfg, &st);
    CHECK(m, copy != NULL, "new: %s", kvr_status_name(st));
    if (copy == NULL)
        return;
    int rc = kvr_index_dump(m->ix, replay_into, copy);
    CHECK(m, rc == 0, "dump replay failed (%d)", rc);
    char msg[256];
    CHECK(m, kvr_index_verify(copy, msg, sizeof msg) == KVR_OK, "replayed index: %s", msg);
    size_t pairs = 0;
    for (int wi = 0; wi < m->nw && !m->failed; wi++)
        for (unsigned p = 1; p < N_PATHS; p++) {
            if (m->w[wi].tiers[p] == 0)
                continue;
            pairs++;
            unsigned t = kvr_index_holds(copy, WORKERS[wi], m->w[wi].ext[p]);
            CHECK(m, t == m->w[wi].tiers[p], "replay: w%d path %u tiers %u, model %u", wi, p, t,
                  m->w[wi].tiers[p]);
        }
    kvr_index_stats_t s;
    kvr_index_stats(copy, &s);
    CHECK(m, s.pairs == pairs, "replay holds %llu pairs, model %zu", (unsigned long long)s.pairs,
          pairs);
    for (int i = 0; i < 50 && !m->failed; i++)
        check_lookup(m, copy, lk, 1 + below(m, N_PATHS - 1));
    kvr_index_free(copy);
}

static int run_seed(unsigned long seed, int steps, kvr_index_sync_t sync)
{
    model_t *m = calloc(1, sizeof *m);
    assert_non_null(m);
    workers_init();
    /* every fourth seed (with the large budget) runs a wide fleet, so blocks gather more
     * holders than the index keeps inline or scans (its position tables) */
    m->nw = seed % 4 == 3 ? MAX_WORKERS : N_WORKERS;
    for (int i = 0; i < m->nw; i++)
        memset(m->w[i].ext_to_path, 0xFF, sizeof m->w[i].ext_to_path);
    m->seed = seed;
    m->rng = seed * 7919 + 1;
    /* half the seeds run under a small budget so eviction is exercised */
    size_t budget = (seed % 2 == 0) ? 30 + below(m, 200) : 1 << 20;
    kvr_index_config_t cfg = {.sync = sync,
                              .max_pairs = budget,
                              .max_workers = MAX_WORKERS + 8,
                              .on_evict = on_evict,
                              .on_evict_ud = m};
    int st;
    m->ix = kvr_index_new(&cfg, &st);
    assert_non_null(m->ix);
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    char msg[256];
    for (m->step = 0; m->step < (unsigned long)steps && !m->failed; m->step++) {
        unsigned r = below(m, 100);
        if (r < 45)
            op_store(m);
        else if (r < 70)
            op_remove(m);
        else if (r < 72)
            op_clear(m);
        else if (r < 73)
            op_remove_worker(m);
        else
            op_lookup(m, &lk);
        if (!m->failed && kvr_index_verify(m->ix, msg, sizeof msg) != KVR_OK) {
            m->failed = 1;
            snprintf(m->why, sizeof m->why, "verify: %s", msg);
        }
        if (!m->failed && m->step % 500 == 499)
            check_dump(m, &lk);
    }
    kvr_index_stats_t fin;
    kvr_index_stats(m->ix, &fin);
    cov.evicted += fin.evicted_pairs;
    cov.rebound += fin.warn_ext_rebound;
    cov.parent_missing += fin.err_parent_not_found;
    cov.invalid += fin.err_invalid_sequence;
    cov.dup += fin.warn_duplicate_store;
    int failed = m->failed;
    if (failed)
        fprintf(stderr, "model test FAILED: seed %lu step %lu sync %d: %s\n", seed, m->step - 1,
                (int)sync, m->why);
    kvr_lookup_deinit(&lk);
    kvr_index_free(m->ix);
    free(m);
    return failed;
}

/* Every third seed runs the index with RCU readers (a rerun of one seed keeps its mode). */
static int run_one(unsigned long seed, int steps)
{
    return run_seed(seed, steps, seed % 3 == 0 ? KVR_SYNC_RCU : KVR_SYNC_NONE);
}

static void test_model_random(void **state)
{
    (void)state;
    static const kvr_model_plan_t plan = {
        .seeds = 200, .seeds_asan = 30, .steps = 3000, .steps_one = 20000};
    assert_int_equal(kvr_model_drive(&plan, run_one), 0);
    if (kvr_test_seed(&(unsigned long){0}))
        return; /* one seed: the coverage bounds are for the whole sweep */
    printf("coverage: evicted %lu rebound %lu parent_missing %lu invalid %lu dup %lu "
           "lookups_hit %lu lower_hits %lu wide_hits %lu\n",
           cov.evicted, cov.rebound, cov.parent_missing, cov.invalid, cov.dup, cov.lookups_hit,
           cov.lower_hits, cov.wide_hits);
    assert_true(cov.evicted > 100);
    assert_true(cov.rebound > 10);
    assert_true(cov.parent_missing > 10);
    assert_true(cov.invalid > 10);
    assert_true(cov.dup > 10);
    assert_true(cov.lookups_hit > 1000);
    assert_true(cov.lower_hits > 100);
    assert_true(cov.wide_hits > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

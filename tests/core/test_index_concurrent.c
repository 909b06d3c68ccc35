/*
 * test_index_concurrent.c: lookups while another thread applies events.
 *
 * A writer thread churns prefixes (stores, removals, clears, worker removals, table growth and
 * shrinkage, holder arrays growing past their inline room, budget eviction) while reader
 * threads look up two kinds of prompts:
 *   - stable prompts, whose nodes the writer never touches: every answer must be exact;
 *   - churned prompts: answers may be in either state but must be sane (known workers, depths
 *     within the prompt, each worker listed once), and nothing may crash (run under ASan too).
 * Both KVR_SYNC_RCU and KVR_SYNC_RWLOCK are exercised.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <cmocka.h>

#include "kvrouter.h"

#define STABLE 16
#define STABLE_DEPTH 40
#define CHURN 64
#define CHURN_DEPTH 24
#define STABLE_WORKERS 4
#define CHURN_WORKERS 40

typedef struct shared {
    kvr_index_t *ix;
    uint64_t stable_lbh[STABLE][STABLE_DEPTH], stable_seq[STABLE][STABLE_DEPTH];
    uint64_t churn_lbh[CHURN][CHURN_DEPTH], churn_seq[CHURN][CHURN_DEPTH];
    _Atomic int stop;
    bool check_stable; /* false when budget eviction may legitimately take stable blocks */
    _Atomic unsigned long lookups, bad, writes;
    unsigned long writer_ops;
    char why[256];
} shared_t;

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* stable prompt p is held by worker w (id 100 + w) for depth stable_depth(p, w) */
static uint32_t stable_depth(int p, int w) { return (uint32_t)((p * 7 + w * 13) % STABLE_DEPTH); }

static int store_chain(kvr_index_t *ix, kvr_worker_t w, const uint64_t *lbh,
                       const uint64_t *seq, size_t from, size_t to)
{
    kvr_block_t b[64];
    for (size_t i = from; i < to; i++)
        b[i - from] = (kvr_block_t){.ext = seq[i], .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED,
                      .worker = w,
                      .has_parent = from > 0,
                      .parent_ext = from > 0 ? seq[from - 1] : 0,
                      .blocks = b,
                      .n_blocks = to - from};
    return kvr_index_apply(ix, &ev);
}

static void *writer(void *arg)
{
    shared_t *sh = arg;
    uint64_t rng = 42;
    for (unsigned long op = 0; op < sh->writer_ops && !atomic_load(&sh->stop); op++) {
        kvr_worker_t w = {1000 + rnd(&rng) % CHURN_WORKERS, (uint32_t)(rnd(&rng) % 2)};
        int c = (int)(rnd(&rng) % CHURN);
        unsigned r = (unsigned)(rnd(&rng) % 100);
        if (r < 55) {
            size_t to = 1 + rnd(&rng) % CHURN_DEPTH;
            (void)store_chain(sh->ix, w, sh->churn_lbh[c], sh->churn_seq[c], 0, to);
        } else if (r < 90) {
            uint64_t ext[4];
            for (int k = 0; k < 4; k++)
                ext[k] = sh->churn_seq[c][rnd(&rng) % CHURN_DEPTH];
            kvr_event_t ev = {.kind = KVR_EV_REMOVED, .worker = w, .removed = ext, .n_removed = 4};
            (void)kvr_index_apply(sh->ix, &ev);
        } else if (r < 99) {
            kvr_event_t ev = {.kind = KVR_EV_CLEARED, .worker = w};
            (void)kvr_index_apply(sh->ix, &ev);
        } else {
            (void)kvr_index_remove_worker(sh->ix, w.worker_id);
        }
        atomic_fetch_add(&sh->writes, 1);
    }
    atomic_store(&sh->stop, 1);
    return NULL;
}

static void *reader(void *arg)
{
    shared_t *sh = arg;
    kvr_index_reader_register();
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    uint64_t rng = (uint64_t)(uintptr_t)&lk;
    while (!atomic_load(&sh->stop)) {
        if (rnd(&rng) % 2 == 0) {
            int p = (int)(rnd(&rng) % STABLE);
            if (kvr_index_lookup(sh->ix, sh->stable_seq[p], STABLE_DEPTH, &lk) != KVR_OK)
                atomic_fetch_add(&sh->bad, 1);
            for (int w = 0; w < STABLE_WORKERS; w++) {
                uint32_t got = 0;
                for (size_t k = 0; k < lk.n_matches; k++)
                    if (lk.matches[k].worker.worker_id == 100 + (uint64_t)w)
                        got = lk.matches[k].device_blocks;
                if (sh->check_stable && got != stable_depth(p, w)) {
                    atomic_fetch_add(&sh->bad, 1);
                    snprintf(sh->why, sizeof sh->why, "stable prompt %d worker %d: %u, want %u",
                             p, w, got, stable_depth(p, w));
                }
            }
            if (lk.n_matches > STABLE_WORKERS)
                atomic_fetch_add(&sh->bad, 1);
        } else {
            int c = (int)(rnd(&rng) % CHURN);
            if (kvr_index_lookup(sh->ix, sh->churn_seq[c], CHURN_DEPTH, &lk) != KVR_OK)
                atomic_fetch_add(&sh->bad, 1);
            for (size_t k = 0; k < lk.n_matches; k++) {
                const kvr_match_t *m = &lk.matches[k];
                bool known = m->worker.worker_id >= 1000 &&
                             m->worker.worker_id < 1000 + CHURN_WORKERS && m->worker.dp_rank < 2;
                if (!known || m->device_blocks > CHURN_DEPTH) {
                    atomic_fetch_add(&sh->bad, 1);
                    snprintf(sh->why, sizeof sh->why, "churn prompt %d: worker %llu/%u depth %u",
                             c, (unsigned long long)m->worker.worker_id, m->worker.dp_rank,
                             m->device_blocks);
                }
                for (size_t j = k + 1; j < lk.n_matches; j++)
                    if (lk.matches[j].worker.worker_id == m->worker.worker_id &&
                        lk.matches[j].worker.dp_rank == m->worker.dp_rank)
                        atomic_fetch_add(&sh->bad, 1);
            }
        }
        atomic_fetch_add(&sh->lookups, 1);
    }
    kvr_lookup_deinit(&lk);
    kvr_index_reader_unregister();
    return NULL;
}

static void run(kvr_index_sync_t sync, unsigned long ops, size_t budget)
{
    shared_t *sh = calloc(1, sizeof *sh);
    assert_non_null(sh);
    kvr_index_config_t cfg = {.sync = sync, .max_pairs = budget};
    sh->check_stable = budget == 0;
    int st;
    sh->ix = kvr_index_new(&cfg, &st);
    assert_non_null(sh->ix);
    sh->writer_ops = ops;
    for (int p = 0; p < STABLE; p++) {
        for (int i = 0; i < STABLE_DEPTH; i++)
            sh->stable_lbh[p][i] = (uint64_t)p * 100000 + (uint64_t)i + 1;
        kvr_hash_chain(sh->stable_lbh[p], STABLE_DEPTH, sh->stable_seq[p]);
    }
    for (int c = 0; c < CHURN; c++) {
        /* churned prompts share a first block, so a hot node gets many holders */
        for (int i = 0; i < CHURN_DEPTH; i++)
            sh->churn_lbh[c][i] = i == 0 ? 777 : (uint64_t)c * 100000 + (uint64_t)i + 50000000;
        kvr_hash_chain(sh->churn_lbh[c], CHURN_DEPTH, sh->churn_seq[c]);
    }
    for (int p = 0; p < STABLE; p++)
        for (int w = 0; w < STABLE_WORKERS; w++)
            if (stable_depth(p, w) > 0)
                assert_int_equal(store_chain(sh->ix, (kvr_worker_t){100 + (uint64_t)w, 0},
                                             sh->stable_lbh[p], sh->stable_seq[p], 0,
                                             stable_depth(p, w)),
                                 KVR_OK);
    pthread_t wt, rt[2];
    assert_int_equal(pthread_create(&rt[0], NULL, reader, sh), 0);
    assert_int_equal(pthread_create(&rt[1], NULL, reader, sh), 0);
    assert_int_equal(pthread_create(&wt, NULL, writer, sh), 0);
    pthread_join(wt, NULL);
    pthread_join(rt[0], NULL);
    pthread_join(rt[1], NULL);
    char msg[256] = "";
    int vrc = kvr_index_verify(sh->ix, msg, sizeof msg);
    if (vrc != KVR_OK)
        fail_msg("verify: %s", msg);
    kvr_index_stats_t s;
    kvr_index_stats(sh->ix, &s);
    printf("sync %d: %lu writes, %lu lookups, %llu evicted pairs, %lu bad\n", (int)sync,
           atomic_load(&sh->writes), atomic_load(&sh->lookups),
           (unsigned long long)s.evicted_pairs, atomic_load(&sh->bad));
    if (atomic_load(&sh->bad) != 0)
        fail_msg("%lu bad lookups; last: %s", atomic_load(&sh->bad), sh->why);
    assert_true(atomic_load(&sh->lookups) > 100);
    kvr_index_free(sh->ix);
    free(sh);
}

static unsigned long ops(void)
{
    const char *s = getenv("KVR_TEST_SCALE");
    return (s != NULL && strcmp(s, "asan") == 0) ? 30000 : 100000;
}

static void test_rcu(void **s)
{
    (void)s;
    run(KVR_SYNC_RCU, ops(), 0);
}

static void test_rcu_with_eviction(void **s)
{
    (void)s;
    run(KVR_SYNC_RCU, ops(), 5000); /* the churn crosses the budget: eviction under readers */
}

static void test_rwlock(void **s)
{
    (void)s;
    run(KVR_SYNC_RWLOCK, ops(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rcu),
        cmocka_unit_test(test_rcu_with_eviction),
        cmocka_unit_test(test_rwlock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_tokcache.c: the tokenize cache (frontend/tokcache.c) against a model: an array of entries
 * in recency order, evicted from the old end to stay within the token budget. Random puts
 * (new keys, replaced keys, oversized entries) and gets; after every step the ids returned,
 * the counters and kvr_tokcache_verify must agree with the model. KVR_TEST_SEED reruns a seed.
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
#include "frontend/tokcache.h"
#include "kvrouter.h"

#define MAX_MODEL 64
#define KEYS 24

typedef struct mentry {
    unsigned key;
    size_t n;
    uint32_t first; /* ids are first, first+1, ... */
} mentry_t;

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static XXH128_hash_t key_of(unsigned k)
{
    return XXH3_128bits(&k, sizeof k);
}

static uint64_t cost(size_t n) { return n ? n : 1; }

/* model: m[0] most recent */
static int model_find(const mentry_t *m, int n, unsigned key)
{
    for (int i = 0; i < n; i++)
        if (m[i].key == key)
            return i;
    return -1;
}

static int run_seed(unsigned long seed, int steps)
{
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    uint64_t cap = 20 + rnd() % 200;
    kvr_tokcache_t c;
    kvr_tokcache_init(&c, cap);
    mentry_t m[MAX_MODEL];
    int n = 0;
    uint64_t hits = 0, misses = 0;
    uint32_t ids[512];
    for (int step = 0; step < steps; step++) {
        unsigned key = (unsigned)(rnd() % KEYS);
        int at = model_find(m, n, key);
        if (rnd() % 2) { /* get */
            size_t got_n = 0;
            const uint32_t *got = kvr_tokcache_get(&c, key_of(key), &got_n);
            if ((got != NULL) != (at >= 0)) {
                printf("seed %lu step %d: get %u found=%d, model %d\n", seed, step, key,
                       got != NULL, at);
                kvr_tokcache_deinit(&c);
                return 1;
            }
            if (at >= 0) {
                hits++;
                mentry_t e = m[at];
                if (got_n != e.n || (e.n && (got[0] != e.first || got[e.n - 1] != e.first + e.n - 1))) {
                    printf("seed %lu step %d: get %u wrong ids\n", seed, step, key);
                    kvr_tokcache_deinit(&c);
                    return 1;
                }
                memmove(m + 1, m, (size_t)at * sizeof *m);
                m[0] = e;
            } else {
                misses++;
            }
        } else { /* put */
            size_t len = rnd() % 8 == 0 ? (size_t)(cap + 1 + rnd() % 50) : (size_t)(rnd() % 40);
            if (len > sizeof ids / sizeof ids[0])
                len = sizeof ids / sizeof ids[0];
            uint32_t first = (uint32_t)rnd();
            for (size_t i = 0; i < len; i++)
                ids[i] = first + (uint32_t)i;
            kvr_tokcache_put(&c, key_of(key), ids, len);
            if (cost(len) <= cap) {
                if (at >= 0) {
                    memmove(m + at, m + at + 1, (size_t)(n - at - 1) * sizeof *m);
                    n--;
                }
                uint64_t used = cost(len);
                for (int i = 0; i < n; i++)
                    used += cost(m[i].n);
                while (n > 0 && used > cap)
                    used -= cost(m[--n].n);
                memmove(m + 1, m, (size_t)n * sizeof *m);
                m[0] = (mentry_t){key, len, first};
                n++;
            }
        }
        uint64_t tokens = 0;
        for (int i = 0; i < n; i++)
            tokens += cost(m[i].n);
        if (kvr_tokcache_verify(&c) != KVR_OK || c.n_entries != (size_t)n || c.tokens != tokens ||
            c.hits != hits || c.misses != misses) {
            printf("seed %lu step %d: entries %zu/%d tokens %llu/%llu hits %llu/%llu verify %d\n",
                   seed, step, c.n_entries, n, (unsigned long long)c.tokens,
                   (unsigned long long)tokens, (unsigned long long)c.hits,
                   (unsigned long long)hits, kvr_tokcache_verify(&c));
            kvr_tokcache_deinit(&c);
            return 1;
        }
    }
    kvr_tokcache_deinit(&c);
    return 0;
}

static void test_model(void **state)
{
    (void)state;
    static const kvr_model_plan_t plan = {
        .seeds = 100, .seeds_asan = 20, .steps = 3000, .steps_one = 20000};
    assert_int_equal(kvr_model_drive(&plan, run_seed), 0);
}

static void test_zero_budget_keeps_nothing(void **state)
{
    (void)state;
    kvr_tokcache_t c;
    kvr_tokcache_init(&c, 0);
    uint32_t ids[3] = {1, 2, 3};
    kvr_tokcache_put(&c, key_of(1), ids, 3);
    size_t n;
    assert_null(kvr_tokcache_get(&c, key_of(1), &n));
    assert_int_equal(c.n_entries, 0);
    assert_int_equal(kvr_tokcache_verify(&c), KVR_OK);
    kvr_tokcache_deinit(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_budget_keeps_nothing),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_oatab.c: the one open-addressing table template (base/oatab.h), model-tested once for
 * every instance in the tree: random inserts, finds, removals and rehashes against a plain
 * list, with a good hash and with a deliberately bad one (8 homes: long clusters, wrap-around
 * at the array's end, every backward-shift case). After every step: the table verifies (each
 * entry reachable from its home), holds exactly the model's keys with their values, and finds
 * no key the model lacks. KVR_TEST_SEED reruns one seed (tests/common/model_driver.h).
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
#include "base/oatab.h"

typedef struct ent {
    uint64_t key;
    uint32_t val;
    uint32_t used;
} ent_t;

typedef struct tctx {
    bool bad_hash;
} tctx_t;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    return x;
}

static uint64_t home_of(const tctx_t *c, uint64_t key) { return c->bad_hash ? key % 8 : mix(key); }

#define E_HOME(c, e) home_of((c), (e)->key)
#define E_EMPTY(e) ((e)->used == 0)
#define E_CLEAR(e) ((e)->used = 0)
KVR_OATAB_DEFINE(tt, tctx_t, ent_t, E_HOME, E_EMPTY, E_CLEAR)

static bool key_is(const tctx_t *c, const ent_t *e, const void *k)
{
    (void)c;
    return e->key == *(const uint64_t *)k;
}

typedef struct model {
    uint64_t keys[600];
    uint32_t vals[600];
    size_t n;
} model_t;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int run(unsigned long seed, int steps)
{
    tctx_t c = {.bad_hash = seed % 2 == 0};
    ent_t *t = NULL;
    size_t mask = 0, live = 0;
    if (tt_rehash(&c, &t, &mask, 8) != KVR_OK)
        return 1;
    model_t *m = calloc(1, sizeof *m);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    int fails = 0;
    for (int step = 0; step < steps && fails == 0; step++) {
        unsigned op = (unsigned)(rng_next(&s) % 10);
        uint64_t key = rng_next(&s) % 700; /* a small space: hits and misses both */
        ent_t *e = tt_find(&c, t, mask, (size_t)home_of(&c, key), key_is, &key);
        size_t mi = m->n;
        for (size_t i = 0; i < m->n; i++)
            if (m->keys[i] == key)
                mi = i;
        if ((e != NULL) != (mi < m->n)) {
            printf("seed %lu step %d: key %llu found %d, model %d\n", seed, step,
                   (unsigned long long)key, e != NULL, mi < m->n);
            fails++;
            break;
        }
        if (e != NULL && e->val != m->vals[mi]) {
            printf("seed %lu step %d: key %llu value %u, model %u\n", seed, step,
                   (unsigned long long)key, e->val, m->vals[mi]);
            fails++;
        }
        if (op < 5 && e == NULL && m->n < 600) { /* insert, growing at half full */
            if (2 * (live + 1) > mask + 1 && tt_rehash(&c, &t, &mask, 2 * (mask + 1)) != KVR_OK)
                break;
            uint32_t v = (uint32_t)rng_next(&s);
            t[tt_free_slot(t, mask, (size_t)home_of(&c, key))] = (ent_t){key, v, 1};
            live++;
            m->keys[m->n] = key;
            m->vals[m->n++] = v;
        } else if (op < 9 && e != NULL) { /* remove */
            tt_remove_at(&c, t, mask, (size_t)(e - t));
            live--;
            m->keys[mi] = m->keys[m->n - 1];
            m->vals[mi] = m->vals[--m->n];
        } else if (op == 9 && rng_next(&s) % 8 == 0) { /* rehash: to the smallest half-full size, or twice it */
            size_t cap = 8;
            while (cap < 2 * live)
                cap *= 2;
            if (tt_rehash(&c, &t, &mask, cap * (1 + rng_next(&s) % 2)) != KVR_OK)
                break;
        }
        size_t n = 0;
        if (!tt_verify(&c, t, mask, &n) || n != live || live != m->n) {
            printf("seed %lu step %d: verify failed (live %zu, counted %zu, model %zu)\n", seed,
                   step, live, n, m->n);
            fails++;
        }
        for (size_t i = 0; i < m->n && fails == 0; i++) {
            ent_t *f = tt_find(&c, t, mask, (size_t)home_of(&c, m->keys[i]), key_is, &m->keys[i]);
            if (f == NULL || f->val != m->vals[i]) {
                printf("seed %lu step %d: key %llu lost\n", seed, step,
                       (unsigned long long)m->keys[i]);
                fails++;
            }
        }
    }
    free(t);
    free(m);
    return fails;
}

static void test_model(void **st)
{
    (void)st;
    kvr_model_plan_t plan = {.seeds = 40, .seeds_asan = 8, .steps = 3000, .steps_one = 50000,
                             .max_failures = 3};
    assert_int_equal(kvr_model_drive(&plan, run), 0);
}

/* Removal at the array's end, with the cluster wrapping to index 0. */
static void test_wraparound(void **st)
{
    (void)st;
    tctx_t c = {.bad_hash = false};
    ent_t *t = NULL;
    size_t mask = 0, n;
    assert_int_equal(tt_rehash(&c, &t, &mask, 8), KVR_OK);
    /* three keys whose home is the last index: at 7, 0, 1 */
    uint64_t keys[3];
    size_t k = 0;
    for (uint64_t key = 0; k < 3; key++)
        if ((mix(key) & 7) == 7)
            keys[k++] = key;
    for (int i = 0; i < 3; i++)
        t[tt_free_slot(t, mask, (size_t)mix(keys[i]))] = (ent_t){keys[i], (uint32_t)i, 1};
    assert_true(t[7].used && t[0].used && t[1].used);
    tt_remove_at(&c, t, mask, 7);
    assert_true(tt_verify(&c, t, mask, &n));
    assert_int_equal(n, 2);
    assert_non_null(tt_find(&c, t, mask, (size_t)mix(keys[2]), key_is, &keys[2]));
    assert_true(t[7].used && t[0].used && !t[1].used); /* both shifted back by one */
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wraparound),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

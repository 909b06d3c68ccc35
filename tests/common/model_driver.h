/*
 * model_driver.h: the driver every model-based randomized test shares (the real structure and
 * a simple model take the same random operations and are compared after each step).
 *   - One seed variable for every test, C and Python: KVR_TEST_SEED=<n> reruns seed n alone,
 *     with more steps; a failing seed prints the line that reruns it.
 *   - KVR_TEST_SCALE=asan (set by `make test-asan`) runs fewer seeds: sanitizers are ~10x slower.
 * Header-only (static inline): each test is one executable. Threads: the test's one.
 */
#ifndef KVR_TESTS_MODEL_DRIVER_H
#define KVR_TESTS_MODEL_DRIVER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs one seed for steps operations; returns the number of failures (0: the seed passed). */
typedef int (*kvr_model_seed_fn)(unsigned long seed, int steps);

typedef struct kvr_model_plan {
    int seeds;        /* seeds 1..seeds in a normal run */
    int seeds_asan;   /* under KVR_TEST_SCALE=asan */
    int steps;        /* per seed */
    int steps_one;    /* for the one seed of KVR_TEST_SEED */
    int max_failures; /* stop after this many failing seeds (0: run them all) */
} kvr_model_plan_t;

/* True (and *seed set) when KVR_TEST_SEED names one seed. */
static inline bool kvr_test_seed(unsigned long *seed)
{
    const char *s = getenv("KVR_TEST_SEED");
    if (s == NULL || *s == '\0')
        return false;
    *seed = strtoul(s, NULL, 0);
    return true;
}

static inline bool kvr_test_scale_asan(void)
{
    const char *s = getenv("KVR_TEST_SCALE");
    return s != NULL && strcmp(s, "asan") == 0;
}

/* Runs the plan; returns the number of failing seeds. */
static inline int kvr_model_drive(const kvr_model_plan_t *plan, kvr_model_seed_fn run)
{
    unsigned long one;
    if (kvr_test_seed(&one)) {
        int f = run(one, plan->steps_one);
        if (f != 0)
            printf("seed %lu failed (KVR_TEST_SEED=%lu reruns it)\n", one, one);
        return f != 0;
    }
    int seeds = kvr_test_scale_asan() ? plan->seeds_asan : plan->seeds, failed = 0;
    for (int s = 1; s <= seeds; s++) {
        if (run((unsigned long)s, plan->steps) != 0) {
            failed++;
            printf("seed %d failed (KVR_TEST_SEED=%d reruns it)\n", s, s);
            if (plan->max_failures > 0 && failed >= plan->max_failures)
                break;
        }
    }
    return failed;
}

#endif

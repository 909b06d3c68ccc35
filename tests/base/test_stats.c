/*
 * test_stats.c: order statistics (base/stats.c): nearest-rank percentiles at the edges (no
 * samples, one sample, exact ranks such as p90 of 10), the heap sort against qsort on random,
 * sorted, reversed and repetitive input, and the mean.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/stats.h"

static void test_nearest_rank(void **state)
{
    (void)state;
    double v[10] = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
    kvr_pcts_t p = kvr_stats_pcts(v, 10);
    assert_true(p.p50 == 5.0);
    assert_true(p.p90 == 9.0); /* ceil(0.9 * 10) = 9, not 10 from rounding error */
    assert_true(p.p99 == 10.0);
    assert_true(kvr_stats_pct_sorted(v, 10, 0.0) == 1.0);
    assert_true(kvr_stats_pct_sorted(v, 10, 1.0) == 10.0);
    assert_true(kvr_stats_pct_sorted(v, 10, 0.11) == 2.0);

    double one = 42.0;
    p = kvr_stats_pcts(&one, 1);
    assert_true(p.p50 == 42.0 && p.p90 == 42.0 && p.p99 == 42.0);

    p = kvr_stats_pcts(NULL, 0);
    assert_true(isnan(p.p50) && isnan(p.p90) && isnan(p.p99));
    assert_true(isnan(kvr_stats_mean(NULL, 0)));

    double h[100];
    for (int i = 0; i < 100; i++)
        h[i] = 100 - i; /* 1..100 */
    p = kvr_stats_pcts(h, 100);
    assert_true(p.p50 == 50.0 && p.p90 == 90.0 && p.p99 == 99.0);
    assert_true(kvr_stats_mean(h, 100) == 50.5);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_sort(void **state)
{
    (void)state;
    unsigned seed = 12345;
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(round % 50) * 7 + 1;
        double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        assert_non_null(a);
        assert_non_null(b);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            switch (round % 4) {
            case 0: a[i] = (double)(seed >> 8) / 16.0; break;
            case 1: a[i] = (double)i; break;            /* sorted */
            case 2: a[i] = (double)(n - i); break;      /* reversed */
            default: a[i] = (double)((seed >> 16) % 3); /* many repeats */
            }
            b[i] = a[i];
        }
        kvr_stats_sort(a, n);
        qsort(b, n, sizeof *b, cmp);
        for (size_t i = 0; i < n; i++)
            if (a[i] != b[i])
                fail_msg("round %d: position %zu: %g != %g", round, i, a[i], b[i]);
        free(a);
        free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nearest_rank),
        cmocka_unit_test(test_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

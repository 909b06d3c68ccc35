/*
 * stats.c: see stats.h.
 */
#include "base/stats.h"

#include <math.h>

#include "base/sort.h"

void kvr_stats_sort(double *v, size_t n)
{
    kvr_sort_double(v, n);
}

double kvr_stats_pct_sorted(const double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    /* rank = ceil(p n), computed so that 0.9 * 10 is 9, not 9.000000000000002 -> 10 */
    double r = p * (double)n;
    size_t rank = (size_t)ceil(r - 1e-9 * (r > 1.0 ? r : 1.0));
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

kvr_pcts_t kvr_stats_pcts(double *v, size_t n)
{
    kvr_stats_sort(v, n);
    kvr_pcts_t out = {kvr_stats_pct_sorted(v, n, 0.50), kvr_stats_pct_sorted(v, n, 0.90),
                      kvr_stats_pct_sorted(v, n, 0.99)};
    return out;
}

double kvr_stats_mean(const double *v, size_t n)
{
    if (n == 0)
        return NAN;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    return sum / (double)n;
}

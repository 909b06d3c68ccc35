/*
 * stats.h: order statistics of latency samples, shared by `kvrouter replay` (measured
 * latencies) and `kvrouter sim` (virtual-time latencies), so both report the same
 * percentile definition: nearest rank (the smallest sample with at least p of the samples at
 * or below it; no interpolation), the definition of data/traces/STATS.md.
 *
 * Pure functions, any thread; no allocation (the sort is an in-place heap sort, O(n log n)
 * worst case, O(n) for input already sorted). NaN samples are not allowed (callers leave
 * absent values out).
 */
#ifndef KVR_CORE_STATS_H
#define KVR_CORE_STATS_H

#include <stddef.h>

/* The three percentiles every report prints; NAN each when there are no samples. */
typedef struct kvr_pcts {
    double p50, p90, p99;
} kvr_pcts_t;

/* Sorts v[0..n) ascending in place. */
void kvr_stats_sort(double *v, size_t n);
/* Nearest-rank percentile, p in [0, 1], of v[0..n) sorted ascending; NAN when n is 0. */
double kvr_stats_pct_sorted(const double *v, size_t n, double p);
/* Sorts v[0..n) and returns its p50, p90 and p99. */
kvr_pcts_t kvr_stats_pcts(double *v, size_t n);
/* Arithmetic mean; NAN when n is 0. */
double kvr_stats_mean(const double *v, size_t n);

#endif /* KVR_CORE_STATS_H */

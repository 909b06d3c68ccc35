/*
 * sort.h: in-place sorting that never allocates (glibc's qsort may), O(n log n) worst case,
 * O(n) for input already sorted. Pure functions, any thread.
 */
#ifndef KVR_SORT_H
#define KVR_SORT_H

#include <stddef.h>
#include <stdint.h>

/* Sorts a[0..n) ascending (heap sort; equal values kept). */
void kvr_sort_u64(uint64_t *a, size_t n);
/* The same for doubles (no NaN). */
void kvr_sort_double(double *a, size_t n);

#endif

/*
 * sort.c: see sort.h.
 */
#include "core/sort.h"

static void sift_down(uint64_t *a, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && a[child + 1] > a[child])
            child++;
        if (a[root] >= a[child])
            return;
        uint64_t t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

void kvr_sort_u64(uint64_t *a, size_t n)
{
    size_t i = 1;
    while (i < n && a[i - 1] <= a[i])
        i++;
    if (i >= n)
        return;
    for (size_t k = n / 2; k-- > 0;)
        sift_down(a, k, n);
    for (size_t end = n; end-- > 1;) {
        uint64_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift_down(a, 0, end);
    }
}

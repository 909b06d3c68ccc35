/*
 * sort.c: see sort.h. One heap sort, instantiated per element type by a macro, so the u64 and
 * double sorts cannot drift apart.
 */
#include "base/sort.h"

#define KVR_DEFINE_HEAP_SORT(name, T)                                                      \
    static void name##_sift_down(T *a, size_t root, size_t n)                              \
    {                                                                                      \
        for (;;) {                                                                         \
            size_t child = 2 * root + 1;                                                   \
            if (child >= n)                                                                \
                return;                                                                    \
            if (child + 1 < n && a[child + 1] > a[child])                                  \
                child++;                                                                   \
            if (a[root] >= a[child])                                                       \
                return;                                                                    \
            T t = a[root];                                                                 \
            a[root] = a[child];                                                            \
            a[child] = t;                                                                  \
            root = child;                                                                  \
        }                                                                                  \
    }                                                                                      \
    void name(T *a, size_t n)                                                              \
    {                                                                                      \
        size_t i = 1;                                                                      \
        while (i < n && a[i - 1] <= a[i])                                                  \
            i++;                                                                           \
        if (i >= n)                                                                        \
            return;                                                                        \
        for (size_t k = n / 2; k-- > 0;)                                                   \
            name##_sift_down(a, k, n);                                                     \
        for (size_t end = n; end-- > 1;) {                                                 \
            T t = a[0];                                                                    \
            a[0] = a[end];                                                                 \
            a[end] = t;                                                                    \
            name##_sift_down(a, 0, end);                                                   \
        }                                                                                  \
    }

KVR_DEFINE_HEAP_SORT(kvr_sort_u64, uint64_t)
KVR_DEFINE_HEAP_SORT(kvr_sort_double, double)

/*
 * test_dec.c: base/dec.h against snprintf("%llu"): every power of ten and its neighbours,
 * the type's limits, and a million random values of every width.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/dec.h"

static void same(uint64_t v)
{
    char want[32], got[32];
    snprintf(want, sizeof want, "%llu", (unsigned long long)v);
    char *e = kvr_dec_u64(got, v);
    *e = '\0';
    if (strcmp(want, got) != 0)
        fail_msg("%s written as %s", want, got);
    char buf[KVR_DEC_U64_MAX + 1];
    char *p = kvr_dec_u64_back(v, buf + sizeof buf);
    if ((size_t)(buf + sizeof buf - p) != strlen(want) || memcmp(p, want, strlen(want)) != 0)
        fail_msg("%s written back as %.*s", want, (int)(buf + sizeof buf - p), p);
}

static void test_edges(void **state)
{
    (void)state;
    same(0);
    same(UINT64_MAX);
    same(UINT64_MAX - 1);
    for (uint64_t p = 1; p <= UINT64_MAX / 10; p *= 10) {
        same(p - 1);
        same(p);
        same(p + 1);
    }
}

static void test_random(void **state)
{
    (void)state;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        same(x >> (x % 64)); /* every width */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_edges), cmocka_unit_test(test_random)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

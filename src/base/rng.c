/*
 * rng.c: see rng.h.
 */
#include "base/rng.h"

void kvr_rng_seed(kvr_rng_t *rng, uint64_t seed) { rng->state = seed; }

uint64_t kvr_rng_next(kvr_rng_t *rng) { return kvr_splitmix64(&rng->state); }

double kvr_rng_uniform(kvr_rng_t *rng) { return (double)(kvr_rng_next(rng) >> 11) * 0x1.0p-53; }

uint64_t kvr_rng_below(kvr_rng_t *rng, uint64_t n)
{
    if (n == 0)
        return 0;
    uint64_t reject_below = (0 - n) % n; /* 2^64 mod n: the incomplete last bucket */
    for (;;) {
        uint64_t r = kvr_rng_next(rng);
        if (r >= reject_below)
            return r % n;
    }
}

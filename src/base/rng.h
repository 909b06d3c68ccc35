/*
 * rng.h: the tree's seeded generator, splitmix64 (Steele, Lea and Flood), so every random
 * choice is reproducible from a seed. kvr_splitmix64 is the step on a bare state, for code
 * that keeps one in a uint64_t; kvr_rng_t wraps it.
 *
 * Invariants: any state is valid; the sequence for a seed never changes (tests and figures
 * depend on it). Ownership: the caller's. Threads: one state per thread. Cost: O(1) per draw
 * (kvr_rng_below: expected < 2 draws).
 */
#ifndef KVR_BASE_RNG_H
#define KVR_BASE_RNG_H

#include <stdint.h>

typedef struct kvr_rng {
    uint64_t state;
} kvr_rng_t;

/* Advances *state and returns the next output (inline: hot loops call it per token). */
static inline uint64_t kvr_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

void kvr_rng_seed(kvr_rng_t *rng, uint64_t seed);
uint64_t kvr_rng_next(kvr_rng_t *rng);
/* Uniform in [0, 1), 53 bits. */
double kvr_rng_uniform(kvr_rng_t *rng);
/* Uniform in [0, n), unbiased; 0 when n is 0. */
uint64_t kvr_rng_below(kvr_rng_t *rng, uint64_t n);

#endif /* KVR_BASE_RNG_H */

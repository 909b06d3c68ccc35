/*
 * u64map.h: a map from 64-bit keys to 64-bit values, a base/oatab.h instance (linear probing,
 * backward-shift deletion, at most half full). For tools that intern or count hashes (`kvrouter
 * trace gen` and `trace synth`); the router's hot tables are their own instances.
 * Ownership: the map owns its array. Threads: one. Cost: O(1) expected per get; growth
 * doubles the array.
 */
#ifndef KVR_CORE_U64MAP_H
#define KVR_CORE_U64MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_u64map_ent {
    uint64_t key, val;
    uint8_t used;
} kvr_u64map_ent_t;

typedef struct kvr_u64map {
    kvr_u64map_ent_t *t;
    size_t mask, n;
} kvr_u64map_t;

/* KVR_OK or KVR_ENOMEM. */
int kvr_u64map_init(kvr_u64map_t *m);
void kvr_u64map_deinit(kvr_u64map_t *m);
/* The value of key, made 0 when absent (*created says so); NULL when out of memory. The
 * pointer is valid until the next get. */
uint64_t *kvr_u64map_get(kvr_u64map_t *m, uint64_t key, bool *created);
/* The value of key, or NULL when absent. */
const uint64_t *kvr_u64map_find(const kvr_u64map_t *m, uint64_t key);

#endif

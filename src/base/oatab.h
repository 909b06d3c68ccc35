/*
 * oatab.h: the tree's one open-addressing hash table, as a typed template: every
 * single-threaded table in core (the load tracker's requests, workers and blocks, approximate
 * mode's decisions, the simulated engine's KV cache and request ids) is an instance.
 *
 * Scheme: linear probing over a power-of-two array of the caller's entry type, deletion by
 * backward shift (no tombstones, so a miss stops at the first empty entry and lookups never
 * degrade with churn). The caller keeps the table at most half full (or 3/4, its choice) and
 * calls rehash to grow before it inserts; insertion itself never fails.
 *
 * Why our own and not a Debian library: `kvrouter bench hashtab` runs the load tracker's block
 * pattern (find-or-insert, then delete, of (worker slot, hash) keys; 1M live) on this table,
 * Concurrency Kit's ck_hs (libck-dev) and uthash (uthash-dev). Figures and the choice are in
 * docs/architecture.md ("Hash tables"). In short: the entries live inline in one array (no
 * per-entry allocation as with uthash, no pointer-per-slot indirection as with ck_hs, which
 * stores pointers and needs the key in a separate object), which is what keeps add / free
 * allocation-free and the tables' memory a fixed 16 to 24 bytes an entry. The prefix index's
 * table (index.c) is not an instance: it is read concurrently under RCU and has its own
 * tagged slots; cds_lfht (liburcu) was weighed for it there.
 *
 * Use: KVR_OATAB_DEFINE(prefix, ctx_t, entry_t, HOME, IS_EMPTY, CLEAR) defines
 *   size_t prefix_free_slot(const entry_t *t, size_t mask, size_t home)
 *   entry_t *prefix_find(const ctx_t *c, entry_t *t, size_t mask, size_t home,
 *                        bool (*match)(const ctx_t *, const entry_t *, const void *key),
 *                        const void *key)
 *   void prefix_remove_at(const ctx_t *c, entry_t *t, size_t mask, size_t i)
 *   int prefix_rehash(const ctx_t *c, entry_t **t, size_t *mask, size_t cap)
 *   bool prefix_verify(const ctx_t *c, const entry_t *t, size_t mask, size_t *n_live)
 * where HOME(c, e) is the entry's full hash (masked here), IS_EMPTY(e) tells an empty entry
 * and CLEAR(e) makes one. Invariant (prefix_verify): every live entry is reachable from its
 * home, i.e. no empty entry lies between its home and its position.
 * Threads: none; the caller's (one thread per table). Cost: find, insert and remove O(1)
 * expected at load <= 1/2; rehash O(capacity).
 */
#ifndef KVR_CORE_OATAB_H
#define KVR_CORE_OATAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvrouter/status.h"

/* The tables' hash finalizer (MurmurHash3's fmix64): a full-avalanche mix of a 64-bit key,
 * so that keys differing in a few bits land in unrelated homes. */
static inline uint64_t kvr_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

/* Backward shift: may the entry at j (home h) move into the hole at i? */
static inline bool kvr_oatab_movable(size_t i, size_t j, size_t h)
{
    return (i <= j) ? (h <= i || h > j) : (h <= i && h > j);
}

#define KVR_OATAB_DEFINE(P, C, E, HOME, IS_EMPTY, CLEAR)                                        \
    __attribute__((unused)) static inline size_t P##_free_slot(const E *t, size_t mask,         \
                                                               size_t home)                     \
    {                                                                                           \
        size_t i = home & mask;                                                                 \
        while (!IS_EMPTY(&t[i]))                                                                \
            i = (i + 1) & mask;                                                                 \
        return i;                                                                               \
    }                                                                                           \
                                                                                                \
    __attribute__((unused)) static inline E *P##_find(                                          \
        const C *c, E *t, size_t mask, size_t home,                                             \
        bool (*match)(const C *, const E *, const void *), const void *k)                       \
    {                                                                                           \
        for (size_t i = home & mask; !IS_EMPTY(&t[i]); i = (i + 1) & mask)                      \
            if (match(c, (const E *)&t[i], k))                                                  \
                return &t[i];                                                                   \
        return NULL;                                                                            \
    }                                                                                           \
                                                                                                \
    __attribute__((unused)) static inline void P##_remove_at(const C *c, E *t, size_t mask,     \
                                                             size_t i)                          \
    {                                                                                           \
        (void)c;                                                                                \
        CLEAR(&t[i]);                                                                           \
        for (size_t j = (i + 1) & mask; !IS_EMPTY(&t[j]); j = (j + 1) & mask) {                 \
            if (kvr_oatab_movable(i, j, (size_t)(HOME(c, &t[j])) & mask)) {                     \
                t[i] = t[j];                                                                    \
                CLEAR(&t[j]);                                                                   \
                i = j;                                                                          \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
                                                                                                \
    __attribute__((unused)) static inline int P##_rehash(const C *c, E **t, size_t *mask,       \
                                                         size_t cap)                            \
    {                                                                                           \
        (void)c;                                                                                \
        E *n = malloc(cap * sizeof *n);                                                         \
        if (n == NULL)                                                                          \
            return KVR_ENOMEM;                                                                  \
        for (size_t i = 0; i < cap; i++)                                                        \
            CLEAR(&n[i]);                                                                       \
        for (size_t i = 0; *t != NULL && i <= *mask; i++)                                       \
            if (!IS_EMPTY(&(*t)[i]))                                                            \
                n[P##_free_slot((const E *)n, cap - 1, (size_t)(HOME(c, &(*t)[i])))] = (*t)[i]; \
        free(*t);                                                                               \
        *t = n;                                                                                 \
        *mask = cap - 1;                                                                        \
        return KVR_OK;                                                                          \
    }                                                                                           \
                                                                                                \
    __attribute__((unused)) static inline bool P##_verify(const C *c, const E *t, size_t mask,  \
                                                          size_t *n_live)                       \
    {                                                                                           \
        (void)c;                                                                                \
        size_t n = 0;                                                                           \
        for (size_t i = 0; i <= mask; i++) {                                                    \
            if (IS_EMPTY(&t[i]))                                                                \
                continue;                                                                       \
            n++;                                                                                \
            for (size_t j = (size_t)(HOME(c, &t[i])) & mask; j != i; j = (j + 1) & mask)        \
                if (IS_EMPTY(&t[j]))                                                            \
                    return false;                                                               \
        }                                                                                       \
        *n_live = n;                                                                            \
        return true;                                                                            \
    }

#endif

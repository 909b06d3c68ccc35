/*
 * fuzz_index.c: libFuzzer target driving the prefix index with operations decoded from the
 * input bytes (stores with known, unknown and repeated hashes, removals per tier, clears,
 * worker removals, lookups, dumps), under a budget small enough that eviction runs. After every
 * operation kvr_index_verify() must hold; lookups must stay within the prompt; a dump replayed
 * into an empty index must verify and hold as many pairs. Small hash spaces make collisions,
 * rebinding and holes common. The model-based test (tests/core/test_index_model.c) checks the
 * answers themselves; this target searches for inputs that break invariants or memory safety.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvrouter.h"

typedef struct cursor {
    const uint8_t *p;
    size_t n;
} cursor_t;

static unsigned take(cursor_t *c, unsigned mod)
{
    if (c->n == 0)
        return 0;
    unsigned v = *c->p++;
    c->n--;
    return mod ? v % mod : v;
}

static void check(kvr_index_t *ix)
{
    char msg[256];
    if (kvr_index_verify(ix, msg, sizeof msg) != KVR_OK) {
        fprintf(stderr, "verify: %s\n", msg);
        abort();
    }
}

static int replay(void *ud, const kvr_event_t *ev)
{
    return kvr_index_apply(ud, ev) == KVR_OK ? 0 : 1;
}

static uint64_t lbh_of(unsigned sym) { return 0x1000 + sym; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cursor_t c = {data, size};
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE, .max_workers = 8,
                              .max_pairs = 8 + take(&c, 64)};
    int st;
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    if (ix == NULL)
        abort();
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    for (int ops = 0; c.n > 0 && ops < 400; ops++) {
        kvr_worker_t w = {take(&c, 4), take(&c, 2)};
        unsigned op = take(&c, 8);
        kvr_tier_t tier = take(&c, 4) == 0 ? (kvr_tier_t)take(&c, 4) : KVR_TIER_DEVICE;
        if (op < 4) {
            kvr_block_t b[6];
            size_t n = 1 + take(&c, 6);
            for (size_t i = 0; i < n; i++)
                b[i] = (kvr_block_t){.ext = take(&c, 48), .lbh = lbh_of(take(&c, 3))};
            bool hp = take(&c, 2);
            kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = w, .tier = tier,
                              .has_parent = hp, .parent_ext = take(&c, 48), .blocks = b,
                              .n_blocks = n};
            (void)kvr_index_apply(ix, &ev);
        } else if (op == 4) {
            uint64_t r[4];
            size_t n = 1 + take(&c, 4);
            for (size_t i = 0; i < n; i++)
                r[i] = take(&c, 48);
            kvr_event_t ev = {.kind = KVR_EV_REMOVED, .worker = w, .tier = tier, .removed = r,
                              .n_removed = n};
            (void)kvr_index_apply(ix, &ev);
        } else if (op == 5) {
            kvr_event_t ev = {.kind = take(&c, 4) == 0 ? KVR_EV_CLEARED : KVR_EV_REMOVED,
                              .worker = w};
            (void)kvr_index_apply(ix, &ev);
            if (take(&c, 8) == 0)
                (void)kvr_index_remove_worker(ix, w.worker_id);
        } else if (op == 6) {
            uint64_t lbh[8], seq[8];
            size_t n = 1 + take(&c, 8);
            for (size_t i = 0; i < n; i++)
                lbh[i] = lbh_of(take(&c, 3));
            kvr_hash_chain(lbh, n, seq);
            if (kvr_index_lookup(ix, seq, n, &lk) != KVR_OK)
                abort();
            for (size_t i = 0; i < lk.n_matches; i++) {
                const kvr_match_t *m = &lk.matches[i];
                if ((size_t)m->device_blocks + m->host_blocks + m->disk_blocks > n)
                    abort();
            }
        } else {
            kvr_index_config_t big = {.sync = KVR_SYNC_NONE, .max_workers = 8};
            kvr_index_t *copy = kvr_index_new(&big, &st);
            if (copy == NULL || kvr_index_dump(ix, replay, copy) != 0)
                abort();
            check(copy);
            kvr_index_stats_t a, b;
            kvr_index_stats(ix, &a);
            kvr_index_stats(copy, &b);
            if (a.pairs != b.pairs)
                abort();
            kvr_index_free(copy);
        }
        check(ix);
    }
    kvr_lookup_deinit(&lk);
    kvr_index_free(ix);
    return 0;
}

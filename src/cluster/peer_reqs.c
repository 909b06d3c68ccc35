/*
 * peer_reqs.c: see peer_reqs.h. An instance of oatab.h; removals during a scan are done in
 * two phases (collect the keys, then remove each by lookup), since a backward shift can move
 * a later entry into the slot just looked at.
 */
#include "cluster/peer_reqs.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/grow.h"
#include "base/oatab.h"
#include "base/verify.h"

#define MIN_CAP 64u
#define ORIGIN_SLOTS (2u * KVR_PEER_REQS_MAX_ORIGINS) /* fixed: at most half full */

typedef struct pr_entry {
    uint64_t key; /* the id's hash */
    uint64_t origin;
    kvr_req_handle_t h; /* 0 = empty */
} pr_entry_t;

typedef struct po_entry {
    uint64_t origin;
    size_t n; /* its entries; 0 = empty slot */
} po_entry_t;

struct kvr_peer_reqs {
    pr_entry_t *t;
    size_t mask, n, cursor;
    uint64_t seed;
    po_entry_t origins[ORIGIN_SLOTS]; /* entries per origin, for those that have any */
    size_t n_origins;
};

#define PR_HOME(c, e) kvr_mix64((e)->key)
#define PR_EMPTY(e) ((e)->h == KVR_REQ_HANDLE_NONE)
#define PR_CLEAR(e) ((e)->h = KVR_REQ_HANDLE_NONE)
KVR_OATAB_DEFINE(prt, kvr_peer_reqs_t, pr_entry_t, PR_HOME, PR_EMPTY, PR_CLEAR)
#define PO_HOME(c, e) kvr_mix64((e)->origin)
#define PO_EMPTY(e) ((e)->n == 0)
#define PO_CLEAR(e) ((e)->n = 0)
KVR_OATAB_DEFINE(pot, kvr_peer_reqs_t, po_entry_t, PO_HOME, PO_EMPTY, PO_CLEAR)

static bool origin_is(const kvr_peer_reqs_t *t, const po_entry_t *e, const void *k)
{
    (void)t;
    return e->origin == *(const uint64_t *)k;
}

static po_entry_t *origin_find(const kvr_peer_reqs_t *t, uint64_t origin)
{
    return pot_find(t, (po_entry_t *)t->origins, ORIGIN_SLOTS - 1, kvr_mix64(origin), origin_is,
                    &origin);
}

/* One more entry of origin: KVR_EFULL when it is new and KVR_PEER_REQS_MAX_ORIGINS have some. */
static int origin_add(kvr_peer_reqs_t *t, uint64_t origin)
{
    po_entry_t *e = origin_find(t, origin);
    if (e == NULL) {
        if (t->n_origins == KVR_PEER_REQS_MAX_ORIGINS)
            return KVR_EFULL;
        e = &t->origins[pot_free_slot(t->origins, ORIGIN_SLOTS - 1, kvr_mix64(origin))];
        e->origin = origin;
        t->n_origins++;
    }
    e->n++;
    return KVR_OK;
}

static void origin_drop(kvr_peer_reqs_t *t, uint64_t origin)
{
    po_entry_t *e = origin_find(t, origin);
    if (e == NULL)
        return; /* cannot be: every entry's origin is counted (verify checks it) */
    if (--e->n == 0) {
        pot_remove_at(t, t->origins, ORIGIN_SLOTS - 1, (size_t)(e - t->origins));
        t->n_origins--;
    }
}

static bool key_is(const kvr_peer_reqs_t *t, const pr_entry_t *e, const void *k)
{
    (void)t;
    return e->key == *(const uint64_t *)k;
}

static uint64_t key_of(const kvr_peer_reqs_t *t, const char *id, size_t len)
{
    return XXH3_64bits_withSeed(id, len, t->seed);
}

static pr_entry_t *find(const kvr_peer_reqs_t *t, uint64_t key)
{
    return prt_find(t, t->t, t->mask, kvr_mix64(key), key_is, &key);
}

kvr_peer_reqs_t *kvr_peer_reqs_new(uint64_t seed)
{
    kvr_peer_reqs_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->seed = seed;
    t->mask = MIN_CAP - 1;
    if ((t->t = calloc(MIN_CAP, sizeof *t->t)) == NULL) {
        free(t);
        return NULL;
    }
    return t;
}

void kvr_peer_reqs_free(kvr_peer_reqs_t *t)
{
    if (t == NULL)
        return;
    free(t->t);
    free(t);
}

int kvr_peer_reqs_put(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t origin,
                      kvr_req_handle_t h)
{
    if (h == KVR_REQ_HANDLE_NONE)
        return KVR_EINVAL;
    uint64_t key = key_of(t, id, id_len);
    pr_entry_t *e = find(t, key);
    if (e != NULL && e->origin != origin) { /* replaced: counted under its new origin */
        if (origin_add(t, origin) != KVR_OK)
            return KVR_EFULL;
        origin_drop(t, e->origin);
    } else if (e == NULL) {
        if ((t->n + 1) * 2 > t->mask + 1 && prt_rehash(t, &t->t, &t->mask, (t->mask + 1) * 2))
            return KVR_ENOMEM;
        if (origin_add(t, origin) != KVR_OK)
            return KVR_EFULL;
        e = &t->t[prt_free_slot(t->t, t->mask, kvr_mix64(key))];
        t->n++;
    }
    *e = (pr_entry_t){.key = key, .origin = origin, .h = h};
    return KVR_OK;
}

static bool take_key(kvr_peer_reqs_t *t, uint64_t key, uint64_t *origin, kvr_req_handle_t *h)
{
    pr_entry_t *e = find(t, key);
    if (e == NULL)
        return false;
    if (origin != NULL)
        *origin = e->origin;
    if (h != NULL)
        *h = e->h;
    origin_drop(t, e->origin);
    prt_remove_at(t, t->t, t->mask, (size_t)(e - t->t));
    t->n--;
    return true;
}

bool kvr_peer_reqs_take(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t *origin,
                        kvr_req_handle_t *h)
{
    return take_key(t, key_of(t, id, id_len), origin, h);
}

bool kvr_peer_reqs_take_from(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t origin,
                             kvr_req_handle_t *h)
{
    const pr_entry_t *e = find(t, key_of(t, id, id_len));
    return e != NULL && e->origin == origin && take_key(t, e->key, NULL, h);
}

bool kvr_peer_reqs_get(const kvr_peer_reqs_t *t, const char *id, size_t id_len,
                       uint64_t *origin, kvr_req_handle_t *h)
{
    const pr_entry_t *e = find(t, key_of(t, id, id_len));
    if (e != NULL && origin != NULL)
        *origin = e->origin;
    if (e != NULL && h != NULL)
        *h = e->h;
    return e != NULL;
}

/* Removes the entries with the collected keys, telling fn each handle. */
static size_t take_keys(kvr_peer_reqs_t *t, const uint64_t *keys, size_t n,
                        void (*fn)(void *arg, kvr_req_handle_t h), void *arg)
{
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        kvr_req_handle_t h;
        if (take_key(t, keys[i], NULL, &h)) {
            done++;
            if (fn != NULL)
                fn(arg, h);
        }
    }
    return done;
}

size_t kvr_peer_reqs_take_origin(kvr_peer_reqs_t *t, uint64_t origin,
                                 void (*fn)(void *arg, kvr_req_handle_t h), void *arg,
                                 int *status)
{
    uint64_t *keys = NULL;
    size_t n = 0, cap = 0;
    *status = KVR_OK;
    for (size_t i = 0; i <= t->mask; i++) {
        const pr_entry_t *e = &t->t[i];
        if (PR_EMPTY(e) || (origin != 0 && e->origin != origin))
            continue;
        if (kvr_grow((void **)&keys, &cap, n + 1, SIZE_MAX / 8, sizeof *keys) != KVR_OK) {
            free(keys);
            *status = KVR_ENOMEM;
            return 0;
        }
        keys[n++] = e->key;
    }
    size_t done = take_keys(t, keys, n, fn, arg);
    free(keys);
    return done;
}

size_t kvr_peer_reqs_sweep(kvr_peer_reqs_t *t, bool (*live)(void *arg, kvr_req_handle_t h),
                           void *arg, size_t budget)
{
    uint64_t keys[256];
    size_t n = 0, i = t->cursor & t->mask;
    for (size_t seen = 0; seen < budget && seen <= t->mask && n < 256; seen++) {
        const pr_entry_t *e = &t->t[i];
        if (!PR_EMPTY(e) && !live(arg, e->h))
            keys[n++] = e->key;
        i = (i + 1) & t->mask;
    }
    t->cursor = i;
    return take_keys(t, keys, n, NULL, NULL);
}

size_t kvr_peer_reqs_count(const kvr_peer_reqs_t *t) { return t->n; }

size_t kvr_peer_reqs_origin_count(const kvr_peer_reqs_t *t, uint64_t origin)
{
    const po_entry_t *e = origin_find(t, origin);
    return e != NULL ? e->n : 0;
}

size_t kvr_peer_reqs_origins(const kvr_peer_reqs_t *t) { return t->n_origins; }

/* Every origin's count is the number of its entries, and they add up to n. */
static int verify_origins(const kvr_peer_reqs_t *t, char *msg, size_t msg_len)
{
    size_t live = 0, sum = 0;
    if (!pot_verify(t, t->origins, ORIGIN_SLOTS - 1, &live))
        KVR_VERIFY_FAIL("an origin is not reachable from its home");
    if (live != t->n_origins || live > KVR_PEER_REQS_MAX_ORIGINS)
        KVR_VERIFY_FAIL("%zu origins, count says %zu (cap %u)", live, t->n_origins,
                        KVR_PEER_REQS_MAX_ORIGINS);
    for (size_t i = 0; i < ORIGIN_SLOTS; i++) {
        const po_entry_t *o = &t->origins[i];
        if (PO_EMPTY(o))
            continue;
        size_t n = 0;
        for (size_t j = 0; j <= t->mask; j++)
            n += !PR_EMPTY(&t->t[j]) && t->t[j].origin == o->origin;
        if (n != o->n)
            KVR_VERIFY_FAIL("origin %016llx: %zu entries, count says %zu",
                            (unsigned long long)o->origin, n, o->n);
        sum += n;
    }
    if (sum != t->n)
        KVR_VERIFY_FAIL("origins count %zu entries of %zu", sum, t->n);
    return KVR_OK;
}

int kvr_peer_reqs_verify(const kvr_peer_reqs_t *t, char *msg, size_t msg_len)
{
    size_t live = 0;
    if (!prt_verify(t, t->t, t->mask, &live))
        KVR_VERIFY_FAIL("an entry is not reachable from its home");
    if (live != t->n)
        KVR_VERIFY_FAIL("%zu entries, count says %zu", live, t->n);
    if (t->n * 2 > t->mask + 1)
        KVR_VERIFY_FAIL("%zu entries in %zu slots: more than half full", t->n, t->mask + 1);
    return verify_origins(t, msg, msg_len);
}

/*
 * peer_reqs.c: see peer_reqs.h. An instance of oatab.h; removals during a scan are done in
 * two phases (collect the keys, then remove each by lookup), since a backward shift can move
 * a later entry into the slot just looked at.
 */
#include "core/peer_reqs.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/grow.h"
#include "core/oatab.h"
#include "core/verify.h"

#define MIN_CAP 64u

typedef struct pr_entry {
    uint64_t key; /* the id's hash */
    uint64_t origin;
    kvr_req_handle_t h; /* 0 = empty */
} pr_entry_t;

struct kvr_peer_reqs {
    pr_entry_t *t;
    size_t mask, n, cursor;
    uint64_t seed;
};

#define PR_HOME(c, e) kvr_mix64((e)->key)
#define PR_EMPTY(e) ((e)->h == KVR_REQ_HANDLE_NONE)
#define PR_CLEAR(e) ((e)->h = KVR_REQ_HANDLE_NONE)
KVR_OATAB_DEFINE(prt, kvr_peer_reqs_t, pr_entry_t, PR_HOME, PR_EMPTY, PR_CLEAR)

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
    if (e == NULL) {
        if ((t->n + 1) * 2 > t->mask + 1 && prt_rehash(t, &t->t, &t->mask, (t->mask + 1) * 2))
            return KVR_ENOMEM;
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
    prt_remove_at(t, t->t, t->mask, (size_t)(e - t->t));
    t->n--;
    return true;
}

bool kvr_peer_reqs_take(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t *origin,
                        kvr_req_handle_t *h)
{
    return take_key(t, key_of(t, id, id_len), origin, h);
}

bool kvr_peer_reqs_get(const kvr_peer_reqs_t *t, const char *id, size_t id_len,
                       uint64_t *origin)
{
    const pr_entry_t *e = find(t, key_of(t, id, id_len));
    if (e != NULL && origin != NULL)
        *origin = e->origin;
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

int kvr_peer_reqs_verify(const kvr_peer_reqs_t *t, char *msg, size_t msg_len)
{
    size_t live = 0;
    if (!prt_verify(t, t->t, t->mask, &live))
        KVR_VERIFY_FAIL("an entry is not reachable from its home");
    if (live != t->n)
        KVR_VERIFY_FAIL("%zu entries, count says %zu", live, t->n);
    if (t->n * 2 > t->mask + 1)
        KVR_VERIFY_FAIL("%zu entries in %zu slots: more than half full", t->n, t->mask + 1);
    return KVR_OK;
}

/*
 * session.c: sticky sessions (see session.h). Bindings live in a slot array (grown by
 * kvr_grow, reused through a free list) threaded on a doubly linked recency list; a
 * base/oatab.h table maps the id's xxh3 to its slot.
 * Invariants, ownership, threads and cost: session.h states them (kvr_sessions_verify checks
 * them; debug builds assert n_live <= max_sessions after every bind).
 */
#include "core/session.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/grow.h"
#include "base/oatab.h"
#include "base/verify.h"

#define NONE UINT32_MAX

typedef struct sess {
    uint64_t h;       /* xxh3 of the id */
    uint64_t last_ms; /* the session's last request */
    kvr_worker_t w;
    uint32_t prev, next; /* recency list (most recent first); next also links free slots */
    uint16_t len;
    bool live;
    char id[KVR_SESSION_MAX_ID];
} sess_t;

typedef struct tent {
    uint64_t h;
    uint32_t slot; /* NONE: empty */
} tent_t;

struct kvr_sessions {
    kvr_sessions_config_t cfg;
    sess_t *s;
    size_t cap, n_used; /* slots allocated; slots ever handed out (the rest never used) */
    uint32_t free_head;
    uint32_t head, tail; /* most and least recently used */
    tent_t *t;
    size_t mask;
    size_t n_live;
    kvr_sessions_stats_t st;
};

#define S_HOME(c, e) ((e)->h)
#define S_EMPTY(e) ((e)->slot == NONE)
#define S_CLEAR(e) ((e)->slot = NONE)
KVR_OATAB_DEFINE(st, kvr_sessions_t, tent_t, S_HOME, S_EMPTY, S_CLEAR)

typedef struct skey {
    const char *id;
    size_t len;
    uint64_t h;
} skey_t;

static bool smatch(const kvr_sessions_t *s, const tent_t *e, const void *key)
{
    const skey_t *k = key;
    const sess_t *x = &s->s[e->slot];
    return e->h == k->h && x->len == k->len && memcmp(x->id, k->id, k->len) == 0;
}

static tent_t *sfind(const kvr_sessions_t *s, const char *id, size_t len)
{
    skey_t k = {id, len, kvr_mix64(XXH3_64bits(id, len))};
    return st_find(s, s->t, s->mask, k.h, smatch, &k);
}

kvr_sessions_t *kvr_sessions_new(const kvr_sessions_config_t *cfg, int *status)
{
    int dummy;
    status = status ? status : &dummy;
    if (cfg == NULL || cfg->ttl_ms == 0 || cfg->max_sessions == 0 ||
        cfg->max_sessions > (size_t)1 << 30) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_sessions_t *s = calloc(1, sizeof *s);
    if (s == NULL || st_rehash(s, &s->t, &s->mask, 16) != KVR_OK) {
        free(s);
        *status = KVR_ENOMEM;
        return NULL;
    }
    s->cfg = *cfg;
    s->free_head = s->head = s->tail = NONE;
    *status = KVR_OK;
    return s;
}

void kvr_sessions_free(kvr_sessions_t *s)
{
    if (s == NULL)
        return;
    free(s->s);
    free(s->t);
    free(s);
}

/* ---- the recency list ---- */

static void unlink_slot(kvr_sessions_t *s, uint32_t i)
{
    sess_t *x = &s->s[i];
    if (x->prev != NONE)
        s->s[x->prev].next = x->next;
    else
        s->head = x->next;
    if (x->next != NONE)
        s->s[x->next].prev = x->prev;
    else
        s->tail = x->prev;
}

static void push_front(kvr_sessions_t *s, uint32_t i)
{
    sess_t *x = &s->s[i];
    x->prev = NONE;
    x->next = s->head;
    if (s->head != NONE)
        s->s[s->head].prev = i;
    s->head = i;
    if (s->tail == NONE)
        s->tail = i;
}

/* Drops a live binding: off the list and the table, its slot to the free list. */
static void drop(kvr_sessions_t *s, uint32_t i)
{
    sess_t *x = &s->s[i];
    skey_t k = {x->id, x->len, x->h};
    tent_t *e = st_find(s, s->t, s->mask, x->h, smatch, &k);
    if (e != NULL)
        st_remove_at(s, s->t, s->mask, (size_t)(e - s->t));
    unlink_slot(s, i);
    x->live = false;
    x->next = s->free_head;
    s->free_head = i;
    s->n_live--;
}

/* ---- operations ---- */

bool kvr_sessions_lookup(const kvr_sessions_t *s, const char *id, size_t len, uint64_t now_ms,
                         kvr_worker_t *out)
{
    if (s == NULL || len == 0 || len > KVR_SESSION_MAX_ID)
        return false;
    const tent_t *e = sfind(s, id, len);
    if (e == NULL)
        return false;
    const sess_t *x = &s->s[e->slot];
    if (now_ms >= x->last_ms && now_ms - x->last_ms >= s->cfg.ttl_ms)
        return false; /* idle past its ttl: the next expire drops it */
    *out = x->w;
    return true;
}

/* A slot for a new binding: a free one, a new one, or the least recently used one's (then
 * counted as evicted). Everything that can fail is done first: on KVR_ENOMEM nothing changed. */
static int take_slot(kvr_sessions_t *s, uint32_t *out)
{
    bool evict = s->n_live >= s->cfg.max_sessions;
    size_t after = s->n_live + (evict ? 0 : 1);
    if (after * 2 > s->mask + 1 && st_rehash(s, &s->t, &s->mask, (s->mask + 1) * 2) != KVR_OK)
        return KVR_ENOMEM;
    if (!evict && s->free_head == NONE && s->n_used == s->cap &&
        kvr_grow((void **)&s->s, &s->cap, s->n_used + 1, s->cfg.max_sessions, sizeof *s->s) !=
            KVR_OK)
        return KVR_ENOMEM;
    if (evict) {
        drop(s, s->tail);
        s->st.evicted++;
    }
    if (s->free_head != NONE) {
        *out = s->free_head;
        s->free_head = s->s[*out].next;
        return KVR_OK;
    }
    *out = (uint32_t)s->n_used++;
    return KVR_OK;
}

int kvr_sessions_bind(kvr_sessions_t *s, const char *id, size_t len, kvr_worker_t w,
                      uint64_t now_ms)
{
    if (s == NULL || id == NULL || len == 0 || len > KVR_SESSION_MAX_ID)
        return KVR_EINVAL;
    tent_t *e = sfind(s, id, len);
    if (e != NULL) {
        sess_t *x = &s->s[e->slot];
        bool same = x->w.worker_id == w.worker_id && x->w.dp_rank == w.dp_rank;
        bool fresh = now_ms < x->last_ms || now_ms - x->last_ms < s->cfg.ttl_ms;
        if (same && fresh)
            s->st.hits++;
        else if (fresh)
            s->st.rebinds++;
        else
            s->st.binds++; /* expired, not yet dropped: a new binding */
        x->w = w;
        x->last_ms = now_ms > x->last_ms ? now_ms : x->last_ms;
        unlink_slot(s, e->slot);
        push_front(s, e->slot);
        return KVR_OK;
    }
    uint32_t i;
    int rc = take_slot(s, &i);
    if (rc != KVR_OK)
        return rc;
    uint64_t h = kvr_mix64(XXH3_64bits(id, len));
    sess_t *x = &s->s[i];
    x->h = h;
    x->last_ms = now_ms;
    x->w = w;
    x->len = (uint16_t)len;
    x->live = true;
    memcpy(x->id, id, len);
    s->t[st_free_slot(s->t, s->mask, h)] = (tent_t){.h = h, .slot = i};
    push_front(s, i);
    s->n_live++;
    s->st.binds++;
    assert(s->n_live <= s->cfg.max_sessions); /* the LRU evicted one to make room */
    return KVR_OK;
}

bool kvr_sessions_close(kvr_sessions_t *s, const char *id, size_t len)
{
    if (s == NULL || len == 0 || len > KVR_SESSION_MAX_ID)
        return false;
    tent_t *e = sfind(s, id, len);
    if (e == NULL)
        return false;
    drop(s, e->slot);
    s->st.closed++;
    return true;
}

void kvr_sessions_expire(kvr_sessions_t *s, uint64_t now_ms)
{
    if (s == NULL)
        return;
    while (s->tail != NONE) {
        const sess_t *x = &s->s[s->tail];
        if (now_ms < x->last_ms || now_ms - x->last_ms < s->cfg.ttl_ms)
            break; /* the oldest is fresh: so is everything before it */
        drop(s, s->tail);
        s->st.expired++;
    }
}

void kvr_sessions_stats(const kvr_sessions_t *s, kvr_sessions_stats_t *out)
{
    *out = s->st;
    out->live = s->n_live;
}

int kvr_sessions_verify(const kvr_sessions_t *s, char *msg, size_t msg_len)
{
    size_t n = 0, in_table = 0;
    uint64_t newer = UINT64_MAX;
    uint32_t prev = NONE;
    for (uint32_t i = s->head; i != NONE; prev = i, i = s->s[i].next) {
        const sess_t *x = &s->s[i];
        if (i >= s->n_used || !x->live || x->prev != prev || ++n > s->n_live)
            KVR_VERIFY_FAIL("recency list broken at slot %u", i);
        if (x->last_ms > newer)
            KVR_VERIFY_FAIL("slot %u used after the one before it on the recency list", i);
        newer = x->last_ms;
        const tent_t *e = sfind(s, x->id, x->len);
        if (e == NULL || e->slot != i)
            KVR_VERIFY_FAIL("slot %u not found by its id", i);
    }
    if (prev != s->tail || n != s->n_live)
        KVR_VERIFY_FAIL("recency list holds %zu of %zu live bindings", n, s->n_live);
    if (!st_verify(s, s->t, s->mask, &in_table) || in_table != s->n_live)
        KVR_VERIFY_FAIL("table holds %zu entries for %zu live bindings", in_table, s->n_live);
    if (s->n_live > s->cfg.max_sessions)
        KVR_VERIFY_FAIL("%zu live bindings > max_sessions %zu", s->n_live, s->cfg.max_sessions);
    return KVR_OK;
}

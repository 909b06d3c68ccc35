/*
 * tokcache.c: see tokcache.h. Chained buckets (doubled when entries reach their count) and a
 * doubly linked LRU list.
 */
#include "frontend/tokcache.h"

#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"

struct kvr_tokcache_entry {
    XXH128_hash_t key;
    uint32_t *tokens;
    size_t n;
    kvr_tokcache_entry_t *hnext;
    kvr_tokcache_entry_t *prev, *next; /* LRU order, most recent first */
};

static uint64_t tc_cost(size_t n) { return n ? n : 1; }

static kvr_tokcache_entry_t **tc_slot(kvr_tokcache_t *c, XXH128_hash_t k)
{
    kvr_tokcache_entry_t **s = &c->buckets[k.low64 & (c->n_buckets - 1)];
    while (*s != NULL && !XXH128_isEqual((*s)->key, k))
        s = &(*s)->hnext;
    return s;
}

static void tc_unlink_lru(kvr_tokcache_t *c, kvr_tokcache_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void tc_push_front(kvr_tokcache_t *c, kvr_tokcache_entry_t *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (c->tail == NULL)
        c->tail = e;
}

static void tc_remove(kvr_tokcache_t *c, kvr_tokcache_entry_t *e)
{
    kvr_tokcache_entry_t **s = tc_slot(c, e->key);
    if (*s == e)
        *s = e->hnext;
    tc_unlink_lru(c, e);
    c->tokens -= tc_cost(e->n);
    c->n_entries--;
    free(e->tokens);
    free(e);
}

const uint32_t *kvr_tokcache_get(kvr_tokcache_t *c, XXH128_hash_t k, size_t *n)
{
    kvr_tokcache_entry_t *e = c->n_buckets ? *tc_slot(c, k) : NULL;
    if (e == NULL) {
        c->misses++;
        return NULL;
    }
    c->hits++;
    tc_unlink_lru(c, e);
    tc_push_front(c, e);
    *n = e->n;
    return e->tokens;
}

static bool tc_grow(kvr_tokcache_t *c)
{
    size_t nb = c->n_buckets ? c->n_buckets * 2 : 256;
    kvr_tokcache_entry_t **b = calloc(nb, sizeof *b);
    if (b == NULL)
        return false;
    for (size_t i = 0; i < c->n_buckets; i++) {
        kvr_tokcache_entry_t *e = c->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->hnext;
            size_t j = e->key.low64 & (nb - 1);
            e->hnext = b[j];
            b[j] = e;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = nb;
    return true;
}

void kvr_tokcache_put(kvr_tokcache_t *c, XXH128_hash_t k, const uint32_t *t, size_t n)
{
    if (tc_cost(n) > c->cap_tokens)
        return;
    if ((c->n_buckets == 0 || c->n_entries >= c->n_buckets) && !tc_grow(c))
        return;
    kvr_tokcache_entry_t *old = *tc_slot(c, k);
    if (old != NULL)
        tc_remove(c, old);
    while (c->tail != NULL && c->tokens + tc_cost(n) > c->cap_tokens) {
        tc_remove(c, c->tail);
        c->evictions++;
    }
    kvr_tokcache_entry_t *e = calloc(1, sizeof *e);
    uint32_t *copy = malloc(tc_cost(n) * sizeof *copy);
    if (e == NULL || copy == NULL) {
        free(e);
        free(copy);
        return;
    }
    if (n)
        memcpy(copy, t, n * sizeof *copy);
    e->key = k;
    e->tokens = copy;
    e->n = n;
    kvr_tokcache_entry_t **s = tc_slot(c, k);
    e->hnext = *s;
    *s = e;
    tc_push_front(c, e);
    c->tokens += tc_cost(n);
    c->n_entries++;
    c->inserts++;
}

void kvr_tokcache_init(kvr_tokcache_t *c, uint64_t cap_tokens)
{
    memset(c, 0, sizeof *c);
    c->cap_tokens = cap_tokens;
}

void kvr_tokcache_deinit(kvr_tokcache_t *c)
{
    while (c->head != NULL)
        tc_remove(c, c->head);
    free(c->buckets);
    c->buckets = NULL;
    c->n_buckets = 0;
}

int kvr_tokcache_verify(const kvr_tokcache_t *c)
{
    size_t n = 0, chained = 0;
    uint64_t tokens = 0;
    const kvr_tokcache_entry_t *prev = NULL;
    for (const kvr_tokcache_entry_t *e = c->head; e != NULL; prev = e, e = e->next) {
        if (e->prev != prev || ++n > c->n_entries)
            return KVR_EINVAL;
        tokens += tc_cost(e->n);
        const kvr_tokcache_entry_t *b = c->buckets[e->key.low64 & (c->n_buckets - 1)];
        while (b != NULL && b != e)
            b = b->hnext;
        if (b == NULL)
            return KVR_EINVAL;
    }
    for (size_t i = 0; i < c->n_buckets; i++)
        for (const kvr_tokcache_entry_t *b = c->buckets[i]; b != NULL; b = b->hnext)
            chained++;
    if (prev != c->tail || n != c->n_entries || chained != n || tokens != c->tokens ||
        tokens > c->cap_tokens)
        return KVR_EINVAL;
    return KVR_OK;
}

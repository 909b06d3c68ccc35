/*
 * u64map.c: see u64map.h.
 */
#include "base/u64map.h"

#include <stdlib.h>

#include "base/oatab.h"
#include "kvrouter/status.h"

#define M_HOME(c, e) kvr_mix64((e)->key)
#define M_EMPTY(e) (!(e)->used)
#define M_CLEAR(e) ((e)->used = 0)
KVR_OATAB_DEFINE(um, kvr_u64map_t, kvr_u64map_ent_t, M_HOME, M_EMPTY, M_CLEAR)

static bool match(const kvr_u64map_t *m, const kvr_u64map_ent_t *e, const void *key)
{
    (void)m;
    return e->key == *(const uint64_t *)key;
}

int kvr_u64map_init(kvr_u64map_t *m)
{
    m->t = calloc(1024, sizeof *m->t);
    m->mask = 1023;
    m->n = 0;
    return m->t != NULL ? KVR_OK : KVR_ENOMEM;
}

void kvr_u64map_deinit(kvr_u64map_t *m)
{
    free(m->t);
    m->t = NULL;
    m->mask = m->n = 0;
}

uint64_t *kvr_u64map_get(kvr_u64map_t *m, uint64_t key, bool *created)
{
    *created = false;
    kvr_u64map_ent_t *e = um_find(m, m->t, m->mask, kvr_mix64(key), match, &key);
    if (e != NULL)
        return &e->val;
    if ((m->n + 1) * 2 > m->mask + 1 && um_rehash(m, &m->t, &m->mask, (m->mask + 1) * 2) != KVR_OK)
        return NULL;
    size_t i = um_free_slot(m->t, m->mask, kvr_mix64(key));
    m->t[i] = (kvr_u64map_ent_t){.key = key, .used = 1};
    m->n++;
    *created = true;
    return &m->t[i].val;
}

const uint64_t *kvr_u64map_find(const kvr_u64map_t *m, uint64_t key)
{
    kvr_u64map_ent_t *e = um_find(m, m->t, m->mask, kvr_mix64(key), match, &key);
    return e != NULL ? &e->val : NULL;
}

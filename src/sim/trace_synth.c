/*
 * trace_synth.c: a scaled trace with a given trace's prefix-tree shape (contract in
 * trace_synth.h).
 *
 * Invariants: `counts` holds, per source id, how many rows reach it; a new shared block's id
 * is the interned chained hash of (copy, stretched position, source block), so equal source
 * prefixes in one copy give equal new prefixes; tail blocks get ids nothing else has.
 * Memory: the count table (one entry per distinct source id), the intern table (one per new
 * id), the builder. Threads: the caller's.
 */
#include "sim/trace_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "base/oatab.h"
#include "base/u64map.h"
#include "sim/trace_gen.h"

typedef struct synth {
    const kvr_synth_config_t *cfg;
    kvr_u64map_t counts, ids;
    uint64_t next_id, next_fresh;
    uint64_t *out_ids;
    size_t cap_out;
} synth_t;

/* The dense id of a new block named by its chained hash h. */
static int new_id(synth_t *s, uint64_t h, uint64_t *id)
{
    bool created;
    uint64_t *v = kvr_u64map_get(&s->ids, h, &created);
    if (v == NULL)
        return KVR_ENOMEM;
    if (created)
        *v = s->next_id++;
    *id = *v;
    return KVR_OK;
}

static int count_ids(synth_t *s, const kvr_trace_t *src)
{
    for (size_t i = 0; i < src->n_ids; i++) {
        bool created;
        uint64_t *v = kvr_u64map_get(&s->counts, src->ids[i], &created);
        if (v == NULL)
            return KVR_ENOMEM;
        (*v)++;
    }
    return KVR_OK;
}

static uint64_t count_of(synth_t *s, uint64_t id)
{
    const uint64_t *v = kvr_u64map_find(&s->counts, id);
    return v ? *v : 0;
}

/* One new row from source row r, copy c. */
static int synth_row(synth_t *s, const kvr_trace_row_t *r, uint32_t c, uint64_t t_ms,
                     kvr_trace_builder_t *b)
{
    uint32_t d = 0;
    while (d < r->n_hash_ids && count_of(s, r->hash_ids[d]) >= 2)
        d++;
    double ps = s->cfg->prefix_scale, qs = s->cfg->prompt_scale;
    size_t nd = (size_t)llround(d * ps), nu = (size_t)llround((r->n_hash_ids - d) * qs);
    if (nd + nu == 0)
        nu = 1;
    if ((nd + nu) * KVR_TRACE_BLOCK_TOKENS > KVR_TRACE_MAX_INPUT)
        return KVR_ERANGE;
    if (kvr_grow((void **)&s->out_ids, &s->cap_out, nd + nu, SIZE_MAX, sizeof *s->out_ids) !=
        KVR_OK)
        return KVR_ENOMEM;
    uint64_t h = kvr_mix64(s->cfg->seed ^ ((uint64_t)c << 32) ^ UINT64_C(0x51a7));
    for (size_t j = 0; j < nd; j++) {
        size_t from = (size_t)floor((double)j / ps);
        from = from < d ? from : d - 1;
        h = kvr_mix64(h ^ kvr_mix64(r->hash_ids[from] + j));
        int rc = new_id(s, h, &s->out_ids[j]);
        if (rc != KVR_OK)
            return rc;
    }
    for (size_t j = nd; j < nd + nu; j++) {
        int rc = new_id(s, kvr_mix64(~s->next_fresh++ ^ UINT64_C(0x7a11)), &s->out_ids[j]);
        if (rc != KVR_OK)
            return rc;
    }
    uint32_t fill = r->input_length - (r->n_hash_ids - 1) * KVR_TRACE_BLOCK_TOKENS;
    uint32_t len = (uint32_t)(nd + nu - 1) * KVR_TRACE_BLOCK_TOKENS + fill;
    kvr_trace_builder_add(b, t_ms, len, r->output_length, s->out_ids, (uint32_t)(nd + nu));
    return b->oom ? KVR_ENOMEM : KVR_OK;
}

static int check(const kvr_synth_config_t *c, char *err, size_t err_len)
{
    const char *bad = !(c->rate_scale > 0 && c->rate_scale <= 1e6)        ? "rate_scale"
                      : c->users_scale < 1 || c->users_scale > 100000     ? "users_scale"
                      : !(c->prompt_scale > 0 && c->prompt_scale <= 1000) ? "prompt_scale"
                      : !(c->prefix_scale > 0 && c->prefix_scale <= 1000) ? "prefix_scale"
                                                                          : NULL;
    if (bad != NULL) {
        snprintf(err, err_len, "%s: out of range", bad);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

int kvr_trace_synth(const kvr_trace_t *src, const kvr_synth_config_t *cfg, kvr_trace_t *out,
                    char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    if (err_len > 0)
        err[0] = '\0';
    int rc = check(cfg, err, err_len);
    if (rc != KVR_OK)
        return rc;
    synth_t s = {.cfg = cfg};
    kvr_trace_builder_t b;
    kvr_trace_builder_init(&b);
    rc = kvr_u64map_init(&s.counts);
    if (rc == KVR_OK)
        rc = kvr_u64map_init(&s.ids);
    if (rc == KVR_OK)
        rc = count_ids(&s, src);
    for (size_t i = 0; i < src->n_rows && rc == KVR_OK; i++) {
        const kvr_trace_row_t *r = &src->rows[i];
        uint64_t gap = i + 1 < src->n_rows ? src->rows[i + 1].timestamp_ms - r->timestamp_ms : 0;
        for (uint32_t c = 0; c < cfg->users_scale && rc == KVR_OK; c++) {
            double t = (double)r->timestamp_ms + (double)gap * c / cfg->users_scale;
            rc = synth_row(&s, r, c, (uint64_t)llround(t / cfg->rate_scale), &b);
        }
        if (rc == KVR_ERANGE)
            snprintf(err, err_len, "row %zu: its scaled prompt is longer than %u tokens", i + 1,
                     KVR_TRACE_MAX_INPUT);
    }
    if (rc == KVR_OK)
        rc = kvr_trace_builder_finish(&b, cfg->max_rows, out);
    if (rc != KVR_OK && err[0] == '\0')
        snprintf(err, err_len, "%s", kvr_strerror(rc));
    kvr_trace_builder_deinit(&b);
    kvr_u64map_deinit(&s.counts);
    kvr_u64map_deinit(&s.ids);
    free(s.out_ids);
    return rc;
}

/*
 * evlink.c: the simulated event link (see evlink.h for the model).
 *
 *   per worker   a FIFO (a growable array used as a queue, compacted when its head passes
 *                half) of batches in flight, each with its publication and delivery times
 *                and its own copy of the blocks or removed hashes (a new batch is delivered no
 *                earlier than the newest in flight, so none overtakes another); `taken` the
 *                arrays of the batch last popped (freed at the next pop).
 *
 * Randomness: one splitmix64 stream (core rng) from the seed, drawn in publication order, so
 * a run is a function of its inputs. Threads: one.
 */
#include "sim/evlink.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "base/rng.h"
#include "base/verify.h"

typedef struct lev {
    double pub_ms, at_ms;
    kvr_event_t e; /* blocks / removed point into the copies below */
    kvr_block_t *blocks;
    uint64_t *removed;
} lev_t;

typedef struct wq {
    lev_t *q;
    size_t head, n, cap;
    lev_t taken;
} wq_t;

struct kvr_evlink {
    kvr_evlink_config_t cfg;
    kvr_rng_t rng;
    wq_t *w;
    uint32_t n_workers;
    kvr_evlink_stats_t st;
};

bool kvr_evlink_config_active(const kvr_evlink_config_t *cfg)
{
    return cfg != NULL && (cfg->delay_ms > 0 || cfg->loss > 0);
}

const char *kvr_evlink_config_check(const kvr_evlink_config_t *c)
{
    if (!(c->delay_ms >= 0 && isfinite(c->delay_ms)))
        return "event-delay-ms: must be a finite number >= 0";
    if (!(c->jitter_ms >= 0 && c->jitter_ms <= c->delay_ms))
        return "event-jitter-ms: must be in [0, event-delay-ms]";
    if (!(c->loss >= 0 && c->loss < 1))
        return "event-loss: must be in [0, 1)";
    if (!(c->replay_ms >= 0 && isfinite(c->replay_ms)))
        return "event-replay-ms: must be a finite number >= 0";
    return NULL;
}

kvr_evlink_t *kvr_evlink_new(uint32_t n_workers, const kvr_evlink_config_t *cfg, int *status,
                             const char **field)
{
    const char *why = cfg == NULL ? "config: missing" : kvr_evlink_config_check(cfg);
    if (field != NULL)
        *field = why;
    if (why != NULL || n_workers == 0) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_evlink_t *l = calloc(1, sizeof *l);
    if (l != NULL && (l->w = calloc(n_workers, sizeof *l->w)) == NULL) {
        free(l);
        l = NULL;
    }
    if (l == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    l->cfg = *cfg;
    l->n_workers = n_workers;
    kvr_rng_seed(&l->rng, cfg->seed);
    *status = KVR_OK;
    return l;
}

static void lev_free(lev_t *v)
{
    free(v->blocks);
    free(v->removed);
    v->blocks = NULL;
    v->removed = NULL;
}

void kvr_evlink_free(kvr_evlink_t *l)
{
    if (l == NULL)
        return;
    for (uint32_t i = 0; i < l->n_workers; i++) {
        wq_t *w = &l->w[i];
        for (size_t k = 0; k < w->n; k++)
            lev_free(&w->q[w->head + k]);
        lev_free(&w->taken);
        free(w->q);
    }
    free(l->w);
    free(l);
}

/* A uniform double in [0, 1). */
static double unit(kvr_evlink_t *l) { return (double)(kvr_rng_next(&l->rng) >> 11) * 0x1.0p-53; }

/* A deep copy of e into v. */
static int copy_event(lev_t *v, const kvr_event_t *e)
{
    v->e = *e;
    v->blocks = NULL;
    v->removed = NULL;
    if (e->kind == KVR_EV_STORED && e->n_blocks > 0) {
        if ((v->blocks = malloc(e->n_blocks * sizeof *v->blocks)) == NULL)
            return KVR_ENOMEM;
        memcpy(v->blocks, e->blocks, e->n_blocks * sizeof *v->blocks);
    }
    if (e->kind == KVR_EV_REMOVED && e->n_removed > 0) {
        if ((v->removed = malloc(e->n_removed * sizeof *v->removed)) == NULL)
            return KVR_ENOMEM;
        memcpy(v->removed, e->removed, e->n_removed * sizeof *v->removed);
    }
    v->e.blocks = v->blocks;
    v->e.removed = v->removed;
    return KVR_OK;
}

/* When a batch published at now_ms arrives (draws its jitter and its loss). */
static double delivery(kvr_evlink_t *l, double now_ms)
{
    double d = l->cfg.delay_ms + l->cfg.jitter_ms * (2.0 * unit(l) - 1.0);
    double at = now_ms + (d > 0 ? d : 0);
    if (l->cfg.loss > 0 && unit(l) < l->cfg.loss) {
        l->st.lost++;
        at = fmax(at, now_ms + l->cfg.replay_ms);
    }
    return at;
}

int kvr_evlink_push(kvr_evlink_t *l, uint32_t w, double now_ms, const kvr_event_t *e,
                    double *deliver_ms, bool *was_empty)
{
    wq_t *q = &l->w[w];
    if (q->head > 0 && q->head * 2 >= q->cap) { /* compact: the live part to the front */
        memmove(q->q, q->q + q->head, q->n * sizeof *q->q);
        q->head = 0;
    }
    if (kvr_grow((void **)&q->q, &q->cap, q->head + q->n + 1, SIZE_MAX, sizeof *q->q) != KVR_OK)
        return KVR_ENOMEM;
    lev_t v;
    if (copy_event(&v, e) != KVR_OK) {
        lev_free(&v);
        return KVR_ENOMEM;
    }
    double at = delivery(l, now_ms);
    double newest = q->n > 0 ? q->q[q->head + q->n - 1].at_ms : 0;
    if (at < newest)
        at = newest; /* in order: never before the batch published before it */
    v.pub_ms = now_ms;
    v.at_ms = at;
    *was_empty = q->n == 0;
    q->q[q->head + q->n++] = v;
    l->st.batches++;
    *deliver_ms = at;
    return KVR_OK;
}

int kvr_evlink_pop(kvr_evlink_t *l, uint32_t w, kvr_event_t *out, double *next_ms)
{
    wq_t *q = &l->w[w];
    lev_free(&q->taken);
    if (q->n == 0) {
        *next_ms = INFINITY;
        return KVR_ENOTFOUND;
    }
    q->taken = q->q[q->head++];
    q->n--;
    if (q->n == 0)
        q->head = 0;
    l->st.delay_sum_ms += q->taken.at_ms - q->taken.pub_ms;
    *out = q->taken.e;
    *next_ms = q->n > 0 ? q->q[q->head].at_ms : INFINITY;
    return KVR_OK;
}

void kvr_evlink_stats(const kvr_evlink_t *l, kvr_evlink_stats_t *out)
{
    *out = l != NULL ? l->st : (kvr_evlink_stats_t){0};
}

int kvr_evlink_verify(const kvr_evlink_t *l, char *msg, size_t msg_len)
{
    for (uint32_t i = 0; i < l->n_workers; i++) {
        const wq_t *q = &l->w[i];
        if (q->head + q->n > q->cap)
            KVR_VERIFY_FAIL("evlink: worker %u: queue past its array", i);
        for (size_t k = 0; k < q->n; k++) {
            const lev_t *v = &q->q[q->head + k];
            if (v->at_ms < v->pub_ms)
                KVR_VERIFY_FAIL("evlink: worker %u: a batch arrives before it is published", i);
            if (k > 0 && v->at_ms < q->q[q->head + k - 1].at_ms)
                KVR_VERIFY_FAIL("evlink: worker %u: batch %zu overtakes the one before", i, k);
        }
    }
    return KVR_OK;
}

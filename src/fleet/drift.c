/*
 * drift.c: per-rank agreement of predicted and reported cached tokens (drift.h has the rules).
 * Each rank has a ring of its last `window` judged samples (one byte each: agreed or not, and
 * the signed error kept beside it for the window's means); counts are kept incrementally, so
 * an observation is O(1) once its rank is found.
 * Threads: one. Memory: per rank a record and 9 x window bytes.
 */
#include "fleet/drift.h"

#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "base/verify.h"

typedef struct drank {
    kvr_worker_t w;
    uint8_t *agree;   /* ring of window entries: 1 = agreed */
    int64_t *err;     /* ring: reported - predicted */
    uint32_t pos, n, agreeing;
    uint32_t fresh;   /* judged samples since the last flag, still or restart */
    int64_t err_sum;
    uint64_t abs_sum;
    bool drifting;
    uint64_t since_ms;
    uint64_t compared, agreed, unjudged, flagged, recovered;
    kvr_drift_tokens_t tokens; /* every sample's, judged or not */
} drank_t;

struct kvr_drift {
    kvr_drift_config_t cfg;
    drank_t *r;
    size_t n, cap;
    kvr_hist_t h_err;
    kvr_drift_tokens_t tokens; /* every rank's, removed workers' included */
};

static const double ERR_BUCKETS[] = {0, 16, 64, 256, 1024, 4096, 16384, 65536};

kvr_drift_t *kvr_drift_new(const kvr_drift_config_t *cfg)
{
    if (cfg == NULL || cfg->window == 0 || cfg->window > 1024 || !(cfg->min_accuracy >= 0) ||
        cfg->min_accuracy > 1)
        return NULL;
    kvr_drift_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    d->cfg = *cfg;
    kvr_hist_init(&d->h_err, ERR_BUCKETS, sizeof ERR_BUCKETS / sizeof ERR_BUCKETS[0]);
    return d;
}

static void rank_free(drank_t *r)
{
    free(r->agree);
    free(r->err);
}

void kvr_drift_free(kvr_drift_t *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n; i++)
        rank_free(&d->r[i]);
    free(d->r);
    free(d);
}

static drank_t *find(const kvr_drift_t *d, kvr_worker_t w)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->r[i].w.worker_id == w.worker_id && d->r[i].w.dp_rank == w.dp_rank)
            return &d->r[i];
    return NULL;
}

static drank_t *find_or_add(kvr_drift_t *d, kvr_worker_t w)
{
    drank_t *r = find(d, w);
    if (r != NULL)
        return r;
    if (kvr_grow((void **)&d->r, &d->cap, d->n + 1, SIZE_MAX, sizeof *d->r) != KVR_OK)
        return NULL;
    r = &d->r[d->n];
    memset(r, 0, sizeof *r);
    r->w = w;
    r->agree = calloc(d->cfg.window, 1);
    r->err = calloc(d->cfg.window, sizeof *r->err);
    if (r->agree == NULL || r->err == NULL) {
        rank_free(r);
        return NULL;
    }
    d->n++;
    return r;
}

static void clear_window(drank_t *r)
{
    r->pos = r->n = r->agreeing = r->fresh = 0;
    r->err_sum = 0;
    r->abs_sum = 0;
}

static void push(const kvr_drift_t *d, drank_t *r, bool agree, int64_t err)
{
    uint32_t win = d->cfg.window;
    if (r->n == win) { /* the oldest leaves */
        r->agreeing -= r->agree[r->pos];
        r->err_sum -= r->err[r->pos];
        r->abs_sum -= (uint64_t)llabs(r->err[r->pos]);
    } else {
        r->n++;
    }
    r->agree[r->pos] = agree ? 1 : 0;
    r->err[r->pos] = err;
    r->agreeing += agree ? 1 : 0;
    r->err_sum += err;
    r->abs_sum += (uint64_t)llabs(err);
    r->pos = (r->pos + 1) % win;
    r->fresh++;
}

/* The window agrees well enough (meaningful only when it is full). */
static bool trusted(const kvr_drift_t *d, const drank_t *r)
{
    return (double)r->agreeing >= d->cfg.min_accuracy * (double)r->n - 1e-9;
}

static void add_tokens(kvr_drift_tokens_t *t, const kvr_drift_sample_t *s)
{
    t->prompt += s->prompt_tokens;
    t->predicted_cached += s->predicted;
    t->reported_cached += s->reported;
}

kvr_drift_change_t kvr_drift_observe(kvr_drift_t *d, const kvr_drift_sample_t *s)
{
    drank_t *r = find_or_add(d, s->w);
    if (r == NULL)
        return KVR_DRIFT_SAME;
    add_tokens(&r->tokens, s);
    add_tokens(&d->tokens, s);
    uint32_t bs = s->block_size ? s->block_size : 1;
    if (s->prompt_tokens == 0 || (s->prompt_tokens - 1) / bs == 0) {
        r->unjudged++;
        return KVR_DRIFT_SAME;
    }
    int64_t err = (int64_t)s->reported - (int64_t)s->predicted;
    bool agree = (uint64_t)llabs(err) <= bs;
    push(d, r, agree, err);
    r->compared++;
    r->agreed += agree ? 1 : 0;
    kvr_hist_observe(&d->h_err, (double)llabs(err));
    if (r->n < d->cfg.window)
        return KVR_DRIFT_SAME;
    bool ok = trusted(d, r);
    if (!r->drifting) {
        if (ok)
            return KVR_DRIFT_SAME;
        r->drifting = true;
        r->since_ms = s->now_ms ? s->now_ms : 1;
        r->flagged++;
        r->fresh = 0;
        return KVR_DRIFT_FLAGGED;
    }
    if (ok) {
        r->drifting = false;
        r->since_ms = 0;
        r->recovered++;
        return KVR_DRIFT_RECOVERED;
    }
    if (r->fresh >= d->cfg.window) {
        r->fresh = 0;
        return KVR_DRIFT_STILL;
    }
    return KVR_DRIFT_SAME;
}

void kvr_drift_restart(kvr_drift_t *d, kvr_worker_t w)
{
    drank_t *r = find(d, w);
    if (r != NULL)
        clear_window(r);
}

void kvr_drift_remove_worker(kvr_drift_t *d, uint64_t worker_id)
{
    size_t k = 0;
    for (size_t i = 0; i < d->n; i++) {
        if (d->r[i].w.worker_id == worker_id)
            rank_free(&d->r[i]);
        else
            d->r[k++] = d->r[i];
    }
    d->n = k;
}

bool kvr_drift_view(const kvr_drift_t *d, kvr_worker_t w, kvr_drift_view_t *out)
{
    memset(out, 0, sizeof *out);
    out->accuracy = 1;
    const drank_t *r = d != NULL ? find(d, w) : NULL;
    if (r == NULL)
        return false;
    out->window_samples = r->n;
    out->window_agreeing = r->agreeing;
    if (r->n > 0) {
        out->accuracy = (double)r->agreeing / (double)r->n;
        out->mean_abs_error = (double)r->abs_sum / (double)r->n;
        out->mean_error = (double)r->err_sum / (double)r->n;
    }
    out->drifting = r->drifting;
    out->drifting_since_ms = r->since_ms;
    out->compared = r->compared;
    out->agreed = r->agreed;
    out->unjudged = r->unjudged;
    out->flagged = r->flagged;
    out->recovered = r->recovered;
    out->tokens = r->tokens;
    return true;
}

kvr_drift_tokens_t kvr_drift_tokens(const kvr_drift_t *d) { return d->tokens; }

const kvr_hist_t *kvr_drift_error_hist(const kvr_drift_t *d) { return &d->h_err; }

int kvr_drift_verify(const kvr_drift_t *d, char *msg, size_t msg_len)
{
    for (size_t i = 0; i < d->n; i++) {
        const drank_t *r = &d->r[i];
        if (r->n > d->cfg.window || r->agreeing > r->n || r->pos >= d->cfg.window)
            KVR_VERIFY_FAIL("drift: worker %llu rank %u: window counts out of range",
                            (unsigned long long)r->w.worker_id, r->w.dp_rank);
        uint32_t a = 0;
        int64_t e = 0;
        uint64_t ab = 0;
        for (uint32_t k = 0; k < r->n; k++) { /* the filled entries end just before pos */
            uint32_t at = (r->pos + d->cfg.window - 1 - k) % d->cfg.window;
            a += r->agree[at];
            e += r->err[at];
            ab += (uint64_t)llabs(r->err[at]);
        }
        if (a != r->agreeing || e != r->err_sum || ab != r->abs_sum)
            KVR_VERIFY_FAIL("drift: worker %llu rank %u: window sums differ from its ring",
                            (unsigned long long)r->w.worker_id, r->w.dp_rank);
        if (r->drifting != (r->since_ms != 0))
            KVR_VERIFY_FAIL("drift: worker %llu rank %u: drifting without a start time",
                            (unsigned long long)r->w.worker_id, r->w.dp_rank);
        for (size_t j = 0; j < i; j++)
            if (d->r[j].w.worker_id == r->w.worker_id && d->r[j].w.dp_rank == r->w.dp_rank)
                KVR_VERIFY_FAIL("drift: worker %llu rank %u listed twice",
                                (unsigned long long)r->w.worker_id, r->w.dp_rank);
    }
    return KVR_OK;
}

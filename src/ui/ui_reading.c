/*
 * ui_reading.c: see ui_reading.h.
 */
#include "ui/ui_reading.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wire/prom_read.h"

/* Adds count at bound le (kept ascending; a bound past KVR_UI_HIST_MAX is dropped). */
static void hist_add(kvr_ui_hist_t *h, double le, double count)
{
    size_t i = 0;
    while (i < h->n && h->le[i] < le)
        i++;
    if (i < h->n && h->le[i] == le) {
        h->cum[i] += count;
        return;
    }
    if (h->n == KVR_UI_HIST_MAX)
        return;
    memmove(&h->le[i + 1], &h->le[i], (h->n - i) * sizeof h->le[0]);
    memmove(&h->cum[i + 1], &h->cum[i], (h->n - i) * sizeof h->cum[0]);
    h->le[i] = le;
    h->cum[i] = count;
    h->n++;
}

static void bucket(kvr_ui_hist_t *h, const kvr_prom_line_t *l)
{
    char le[32];
    if (!kvr_prom_line_label(l, "le", le, sizeof le))
        return;
    char *end;
    double b = strtod(le, &end);
    if (*end == '\0' && !isnan(b))
        hist_add(h, b, l->value);
}

static bool label_is(const kvr_prom_line_t *l, const char *name, const char *value)
{
    char v[32];
    return kvr_prom_line_label(l, name, v, sizeof v) && strcmp(v, value) == 0;
}

static int pool_of(const kvr_prom_line_t *l)
{
    return label_is(l, "pool", "prefill")  ? KVR_UI_POOL_PREFILL
           : label_is(l, "pool", "decode") ? KVR_UI_POOL_DECODE
                                           : -1;
}

/* The router's own families (api/, fleet/). */
static bool read_router(kvr_ui_reading_t *o, const kvr_prom_line_t *l)
{
    int pool;
    if (kvr_prom_line_is(l, "kvr_routes_total")) {
        if (label_is(l, "result", "ok"))
            o->routes_ok += l->value;
        else if (label_is(l, "result", "busy"))
            o->routes_busy += l->value;
        else
            o->routes_refused += l->value;
    } else if (kvr_prom_line_is(l, "kvr_requests_in_flight")) {
        o->in_flight = l->value;
    } else if (kvr_prom_line_is(l, "kvr_queue_pending")) {
        o->has_queue = true;
        o->queue_pending = l->value;
    } else if (kvr_prom_line_is(l, "kvr_queue_rejected_total")) {
        o->queue_rejected += l->value;
    } else if (kvr_prom_line_is(l, "kvr_queue_expired_total")) {
        o->queue_expired += l->value;
    } else if (kvr_prom_line_is(l, "kvr_pool_routed_total") && (pool = pool_of(l)) >= 0) {
        o->pool_routed[pool] += l->value;
    } else if (kvr_prom_line_is(l, "kvr_pool_prompt_tokens_total") && (pool = pool_of(l)) >= 0) {
        o->pool_prompt[pool] += l->value;
    } else if (kvr_prom_line_is(l, "kvr_pool_cached_tokens_total") && (pool = pool_of(l)) >= 0) {
        o->pool_cached[pool] += l->value;
    } else if (kvr_prom_line_is(l, "kvr_prediction_tokens_total")) {
        o->has_prediction = true;
        if (label_is(l, "kind", "prompt"))
            o->pred_prompt += l->value;
        else if (label_is(l, "kind", "reported_cached"))
            o->pred_reported_cached += l->value;
    } else if (kvr_prom_line_is(l, "kvr_kv_events_applied_total")) {
        o->has_events = true;
        o->kv_events_applied += l->value;
    } else if (kvr_prom_line_is(l, "kvr_kv_gaps_total")) {
        o->kv_gaps += l->value;
    } else {
        return false;
    }
    return true;
}

/* The front end's and replica sync's families (frontend/, cluster/). */
static void read_services(kvr_ui_reading_t *o, const kvr_prom_line_t *l)
{
    if (kvr_prom_line_is(l, "kvr_frontend_time_to_first_token_seconds_bucket")) {
        bucket(&o->ttft, l);
    } else if (kvr_prom_line_is(l, "kvr_frontend_inter_token_latency_seconds_bucket")) {
        bucket(&o->itl, l);
    } else if (kvr_prom_line_is(l, "kvr_frontend_replies_total")) {
        o->has_frontend = true;
        if (label_is(l, "class", "5xx"))
            o->fe_5xx += l->value;
    } else if (kvr_prom_line_is(l, "kvr_sync_lag_seconds_bucket")) {
        o->has_sync = true;
        bucket(&o->sync_lag, l);
    } else if (kvr_prom_line_is(l, "kvr_replicas_peers")) {
        o->has_peers = true;
        o->peers = l->value;
    } else if (kvr_prom_line_is(l, "kvr_sync_applied_events_total")) {
        o->sync_applied += l->value;
    } else if (kvr_prom_line_is(l, "kvr_sync_lost_batches_total")) {
        o->sync_lost += l->value;
    }
}

void kvr_ui_reading_parse(const char *text, size_t len, uint64_t t_ms, kvr_ui_reading_t *out)
{
    memset(out, 0, sizeof *out);
    out->t_ms = t_ms;
    kvr_prom_reader_t r;
    kvr_prom_reader_init(&r, text, len);
    kvr_prom_line_t l;
    while (kvr_prom_reader_next(&r, &l))
        if (!read_router(out, &l))
            read_services(out, &l);
    out->skipped = r.skipped;
}

double kvr_ui_hist_quantile(const kvr_ui_hist_t *later, const kvr_ui_hist_t *earlier, double q)
{
    const size_t n = later->n;
    if (n < 2 || !isinf(later->le[n - 1]) || (earlier != NULL && earlier->n != 0 && earlier->n != n))
        return NAN;
    double cum[KVR_UI_HIST_MAX];
    for (size_t i = 0; i < n; i++) {
        bool same = earlier == NULL || earlier->n == 0 || earlier->le[i] == later->le[i];
        if (!same)
            return NAN;
        cum[i] = later->cum[i] - (earlier != NULL && earlier->n != 0 ? earlier->cum[i] : 0);
    }
    double total = cum[n - 1];
    if (!(total > 0))
        return NAN;
    if (q < 0)
        return -INFINITY;
    if (q > 1)
        return INFINITY;
    double rank = q * total;
    size_t b = 0;
    while (b < n - 1 && cum[b] < rank)
        b++;
    if (b == n - 1)
        return later->le[n - 2];
    if (b == 0 && later->le[0] <= 0)
        return later->le[0];
    double start = b == 0 ? 0 : later->le[b - 1];
    double below = b == 0 ? 0 : cum[b - 1];
    double count = cum[b] - below;
    if (!(count > 0))
        return later->le[b];
    return start + (later->le[b] - start) * ((rank - below) / count);
}

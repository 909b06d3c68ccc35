/*
 * ui_history.c: see ui_history.h.
 */
#include "ui/ui_history.h"

#include <math.h>
#include <string.h>

#include "base/verify.h"
#include "kvrouter/status.h"

void kvr_ui_history_init(kvr_ui_history_t *h) { memset(h, 0, sizeof *h); }

/* The reading `back` before the latest (0 = the latest); back < n_readings. */
static const kvr_ui_reading_t *reading(const kvr_ui_history_t *h, size_t back)
{
    const size_t cap = KVR_UI_RATIO_S + 1;
    return &h->readings[(h->rhead + cap - 1 - back) % cap];
}

static double rate(double now, double before, double dt_s)
{
    double d = now - before;
    return d >= 0 && dt_s > 0 ? d / dt_s : NAN; /* a counter never goes back */
}

static double ratio(double num, double den) { return den > 0 ? num / den : NAN; }

static double ms(double seconds) { return seconds * 1e3; }

/* Requests refused so far: every result but ok and busy, and for busy, with a queue, those the
 * queue refused (full) or dropped (expired), as a queued request's retries are counted busy
 * again and again; without a queue, busy is a refusal (429). */
static double refused(const kvr_ui_reading_t *r)
{
    return r->routes_refused +
           (r->has_queue ? r->queue_rejected + r->queue_expired : r->routes_busy);
}

/* The point of the latest reading r, with prev the one before it and win the oldest in the
 * ratio window. */
static void compute(kvr_ui_point_t *p, const kvr_ui_reading_t *r, const kvr_ui_reading_t *prev,
                    const kvr_ui_reading_t *win)
{
    const double dt = (double)(r->t_ms - prev->t_ms) / 1e3;
    memset(p, 0, sizeof *p);
    p->t_ms = r->t_ms;
    p->decisions_per_s = rate(r->routes_ok, prev->routes_ok, dt);
    p->refusals_per_s = rate(refused(r), refused(prev), dt);
    p->in_flight = r->in_flight;
    p->queue_pending = r->has_queue ? r->queue_pending : NAN;
    double prompt = 0, cached = 0;
    for (int k = 0; k < KVR_UI_POOLS; k++) {
        p->pool_seen[k] = r->pool_routed[k] > 0;
        p->pool_decisions_per_s[k] = rate(r->pool_routed[k], prev->pool_routed[k], dt);
        double pp = r->pool_prompt[k] - win->pool_prompt[k];
        double pc = r->pool_cached[k] - win->pool_cached[k];
        p->pool_hit_predicted[k] = ratio(pc, pp);
        prompt += pp;
        cached += pc;
    }
    p->hit_predicted = ratio(cached, prompt);
    p->hit_reported = r->has_prediction ? ratio(r->pred_reported_cached - win->pred_reported_cached,
                                                r->pred_prompt - win->pred_prompt)
                                        : NAN;
    p->ttft_p50_ms = ms(kvr_ui_hist_quantile(&r->ttft, &win->ttft, 0.5));
    p->ttft_p99_ms = ms(kvr_ui_hist_quantile(&r->ttft, &win->ttft, 0.99));
    p->itl_p50_ms = ms(kvr_ui_hist_quantile(&r->itl, &win->itl, 0.5));
    p->itl_p99_ms = ms(kvr_ui_hist_quantile(&r->itl, &win->itl, 0.99));
    p->errors_per_s = r->has_frontend ? rate(r->fe_5xx, prev->fe_5xx, dt) : NAN;
    p->kv_events_per_s = r->has_events ? rate(r->kv_events_applied, prev->kv_events_applied, dt)
                                       : NAN;
    p->kv_gaps = r->has_events ? r->kv_gaps - prev->kv_gaps : NAN;
    p->has_replicas = r->has_peers || r->has_sync;
    p->peers = r->has_peers ? r->peers : NAN;
    p->sync_lag_p50_ms = p->sync_lag_p99_ms = p->sync_events_per_s = p->sync_lost = NAN;
    if (r->has_sync) {
        p->sync_lag_p50_ms = ms(kvr_ui_hist_quantile(&r->sync_lag, &win->sync_lag, 0.5));
        p->sync_lag_p99_ms = ms(kvr_ui_hist_quantile(&r->sync_lag, &win->sync_lag, 0.99));
        p->sync_events_per_s = rate(r->sync_applied, prev->sync_applied, dt);
        p->sync_lost = r->sync_lost - prev->sync_lost;
    }
}

bool kvr_ui_history_add(kvr_ui_history_t *h, const kvr_ui_reading_t *r)
{
    const size_t cap = KVR_UI_RATIO_S + 1;
    if (h->n_readings > 0 && r->t_ms <= reading(h, 0)->t_ms)
        return false;
    h->readings[h->rhead] = *r;
    h->rhead = (h->rhead + 1) % cap;
    if (h->n_readings < cap)
        h->n_readings++;
    if (h->n_readings < 2)
        return true;
    kvr_ui_point_t *p;
    if (h->n_points < KVR_UI_POINTS) {
        p = &h->points[(h->head + h->n_points) % KVR_UI_POINTS];
        h->n_points++;
    } else {
        p = &h->points[h->head];
        h->head = (h->head + 1) % KVR_UI_POINTS;
    }
    compute(p, reading(h, 0), reading(h, 1), reading(h, h->n_readings - 1));
    return true;
}

const kvr_ui_point_t *kvr_ui_history_point(const kvr_ui_history_t *h, size_t i)
{
    return &h->points[(h->head + i) % KVR_UI_POINTS];
}

int kvr_ui_history_verify(const kvr_ui_history_t *h, char *msg, size_t msg_len)
{
    if (h->n_points > KVR_UI_POINTS || h->head >= KVR_UI_POINTS)
        KVR_VERIFY_FAIL("%zu points, head %zu (at most %d)", h->n_points, h->head, KVR_UI_POINTS);
    if (h->n_readings > KVR_UI_RATIO_S + 1 || h->rhead > KVR_UI_RATIO_S)
        KVR_VERIFY_FAIL("%zu readings, head %zu", h->n_readings, h->rhead);
    for (size_t i = 1; i < h->n_points; i++)
        if (kvr_ui_history_point(h, i)->t_ms <= kvr_ui_history_point(h, i - 1)->t_ms)
            KVR_VERIFY_FAIL("point %zu at %llu ms, not after the one before", i,
                            (unsigned long long)kvr_ui_history_point(h, i)->t_ms);
    return KVR_OK;
}

/*
 * test_ui_history.c: the live view's numbers (ui/ui_reading.h, ui/ui_history.h): what a
 * reading takes from an exposition text the router's writer made (summed over labels, absent
 * families absent), rates over the last second, ratios and quantiles over the last ten, the
 * quantile as Prometheus's histogram_quantile computes it, null (NaN) where nothing is known,
 * and the ring's bound and order.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter/status.h"
#include "ui/ui_history.h"
#include "ui/ui_reading.h"
#include "wire/prom.h"

static const double BOUNDS[] = {0.1, 0.5, 1};

static void hist(kvr_ui_hist_t *h, double a, double b, double c, double inf)
{
    const double le[] = {0.1, 0.5, 1, INFINITY}, cum[] = {a, b, c, inf};
    h->n = 4;
    memcpy(h->le, le, sizeof le);
    memcpy(h->cum, cum, sizeof cum);
}

static void test_quantile_as_prometheus(void **state)
{
    (void)state;
    kvr_ui_hist_t later, earlier;
    hist(&later, 2, 6, 8, 10);
    /* rank 5 falls in (0.1, 0.5], 3 of its 4: 0.1 + 0.4 * 3/4 */
    assert_true(fabs(kvr_ui_hist_quantile(&later, NULL, 0.5) - 0.4) < 1e-12);
    /* rank 1 in the first bucket, from 0: 0.1 * 1/2 */
    assert_true(fabs(kvr_ui_hist_quantile(&later, NULL, 0.1) - 0.05) < 1e-12);
    /* rank 9.9 in the +Inf bucket: the highest finite bound */
    assert_true(kvr_ui_hist_quantile(&later, NULL, 0.99) == 1);
    /* between two readings: only the observations in between (0, 0, 2, 2: all in (0.5, 1]) */
    hist(&earlier, 2, 6, 6, 8);
    assert_true(fabs(kvr_ui_hist_quantile(&later, &earlier, 0.5) - 0.75) < 1e-12);
    /* nothing in between, no buckets, different bounds: unknown */
    assert_true(isnan(kvr_ui_hist_quantile(&later, &later, 0.5)));
    kvr_ui_hist_t none = {0};
    assert_true(isnan(kvr_ui_hist_quantile(&none, NULL, 0.5)));
    earlier.le[1] = 0.25;
    assert_true(isnan(kvr_ui_hist_quantile(&later, &earlier, 0.5)));
}

/* An exposition as the router writes it: two models' TTFT histograms, pools, routes. */
static void exposition(kvr_prom_t *p, double ok, double prompt, double cached, uint64_t fast)
{
    kvr_prom_reset(p);
    const kvr_prom_by_t routes[] = {{"ok", ok}, {"busy", 3}, {"no_worker", 2}};
    kvr_prom_by_label(p, "kvr_routes_total", "counter", "R.", "result", routes, 3);
    const kvr_prom_by_t pr[] = {{"prefill", 0}, {"decode", prompt}};
    kvr_prom_by_label(p, "kvr_pool_prompt_tokens_total", "counter", "P.", "pool", pr, 2);
    const kvr_prom_by_t ca[] = {{"prefill", 0}, {"decode", cached}};
    kvr_prom_by_label(p, "kvr_pool_cached_tokens_total", "counter", "C.", "pool", ca, 2);
    const kvr_prom_by_t ro[] = {{"prefill", 0}, {"decode", ok}};
    kvr_prom_by_label(p, "kvr_pool_routed_total", "counter", "P.", "pool", ro, 2);
    kvr_prom_family(p, "kvr_frontend_time_to_first_token_seconds", "histogram", "T.");
    const uint64_t a[] = {fast, fast, fast}, b[] = {0, 0, 4};
    kvr_prom_label_t m1 = {"model", "a"}, m2 = {"model", "b"};
    kvr_prom_histogram(p, "kvr_frontend_time_to_first_token_seconds", &m1, 1, BOUNDS, a, 3, fast,
                       0);
    kvr_prom_histogram(p, "kvr_frontend_time_to_first_token_seconds", &m2, 1, BOUNDS, b, 3, 4, 0);
    const kvr_prom_by_t cls[] = {{"2xx", ok}, {"5xx", 1}};
    kvr_prom_by_label(p, "kvr_frontend_replies_total", "counter", "F.", "class", cls, 2);
}

static void test_reading_sums_labels(void **state)
{
    (void)state;
    kvr_prom_t p;
    kvr_prom_init(&p);
    exposition(&p, 10, 1000, 250, 6);
    kvr_ui_reading_t r;
    kvr_ui_reading_parse(p.buf, p.len, 5000, &r);
    assert_int_equal(r.t_ms, 5000);
    assert_true(r.routes_ok == 10 && r.routes_busy == 3 && r.routes_refused == 2);
    assert_true(r.pool_prompt[KVR_UI_POOL_DECODE] == 1000);
    assert_true(r.pool_cached[KVR_UI_POOL_DECODE] == 250);
    assert_true(r.pool_routed[KVR_UI_POOL_PREFILL] == 0);
    assert_true(r.has_frontend && r.fe_5xx == 1);
    /* both models' buckets summed by le: 6+0, 6+0, 6+4, +Inf 6+4 */
    assert_int_equal(r.ttft.n, 4);
    assert_true(r.ttft.cum[0] == 6 && r.ttft.cum[2] == 10 && isinf(r.ttft.le[3]));
    /* families the text lacks read as absent */
    assert_false(r.has_queue);
    assert_false(r.has_events);
    assert_false(r.has_sync);
    assert_false(r.has_prediction);
    assert_int_equal(r.skipped, 0);
    kvr_prom_deinit(&p);
}

static void test_rates_ratios_and_nulls(void **state)
{
    (void)state;
    kvr_prom_t p;
    kvr_prom_init(&p);
    kvr_ui_history_t *h = calloc(1, sizeof *h);
    kvr_ui_history_init(h);
    kvr_ui_reading_t r;
    /* 12 readings a second apart: 5 decisions a second, 100 prompt tokens each second of
     * which 10 cached for the first 6 s, then 90 */
    double ok = 0, prompt = 0, cached = 0;
    for (int i = 0; i < 12; i++) {
        exposition(&p, ok, prompt, cached, (uint64_t)i);
        kvr_ui_reading_parse(p.buf, p.len, 1000 + 1000 * (uint64_t)i, &r);
        assert_true(kvr_ui_history_add(h, &r));
        ok += 5;
        prompt += 100;
        cached += i < 6 ? 10 : 90;
    }
    assert_int_equal(h->n_points, 11);
    const kvr_ui_point_t *last = kvr_ui_history_point(h, 10);
    assert_int_equal(last->t_ms, 12000);
    assert_true(fabs(last->decisions_per_s - 5) < 1e-9);
    /* refusals do not change: 0 a second; one 5xx in total: 0 a second */
    assert_true(last->refusals_per_s == 0 && last->errors_per_s == 0);
    /* over the last 10 s (readings 1..11): the tokens of seconds 1..10, 5 * 10 + 5 * 90 of
     * 1,000 cached */
    assert_true(fabs(last->hit_predicted - 0.5) < 1e-9);
    assert_true(last->pool_seen[KVR_UI_POOL_DECODE] && !last->pool_seen[KVR_UI_POOL_PREFILL]);
    assert_true(fabs(last->pool_hit_predicted[KVR_UI_POOL_DECODE] - 0.5) < 1e-9);
    /* model a's fast answers (10 in the window, all <= 0.1 s) and none of model b's: p50 in
     * the first bucket, 0.1 * 5/10 */
    assert_true(fabs(last->ttft_p50_ms - 50) < 1e-9);
    /* unknown: no queue, no events, no engine reports, no ITL, no NATS */
    assert_true(isnan(last->queue_pending) && isnan(last->kv_events_per_s));
    assert_true(isnan(last->kv_gaps) && isnan(last->hit_reported));
    assert_true(isnan(last->itl_p50_ms) && !last->has_replicas);
    /* the first point: rates against the first reading; a reading not later is dropped */
    assert_true(fabs(kvr_ui_history_point(h, 0)->decisions_per_s - 5) < 1e-9);
    assert_false(kvr_ui_history_add(h, &r));
    char msg[200];
    assert_int_equal(kvr_ui_history_verify(h, msg, sizeof msg), KVR_OK);
    free(h);
    kvr_prom_deinit(&p);
}

/* Refusals a second between two readings of the text made by fmt from (busy, rejected,
 * expired) at 1 s and then at 2 s. */
static double refusals(const char *fmt, const double a[3], const double b[3])
{
    kvr_ui_history_t *h = calloc(1, sizeof *h);
    kvr_ui_history_init(h);
    kvr_ui_reading_t r;
    char text[1024];
    snprintf(text, sizeof text, fmt, a[0], a[1], a[2]);
    kvr_ui_reading_parse(text, strlen(text), 1000, &r);
    kvr_ui_history_add(h, &r);
    snprintf(text, sizeof text, fmt, b[0], b[1], b[2]);
    kvr_ui_reading_parse(text, strlen(text), 2000, &r);
    kvr_ui_history_add(h, &r);
    double v = kvr_ui_history_point(h, 0)->refusals_per_s;
    free(h);
    return v;
}

static void test_refusals_with_and_without_a_queue(void **state)
{
    (void)state;
    const char *routes = "kvr_routes_total{result=\"busy\"} %g\n"
                         "kvr_routes_total{result=\"no_worker\"} 2\n"
                         "kvr_queue_rejected_total %g\nkvr_queue_expired_total %g\n";
    char queued[512];
    snprintf(queued, sizeof queued, "%skvr_queue_pending 4\n", routes);
    const double a[3] = {3, 0, 0}, b[3] = {100, 1, 1};
    /* without a queue, every busy answer was a 429: 97 a second */
    assert_true(fabs(refusals(routes, a, b) - 97) < 1e-9);
    /* with one, busy is a queued request tried again: only the queue's refusals count */
    assert_true(fabs(refusals(queued, a, b) - 2) < 1e-9);
}

static void test_replicas_without_sync(void **state)
{
    (void)state;
    /* NATS replicas seen, replica sync off: the replicas are known, their sync figures not */
    const char *text = "# TYPE kvr_replicas_peers gauge\nkvr_replicas_peers 2\n";
    kvr_ui_history_t *h = calloc(1, sizeof *h);
    kvr_ui_history_init(h);
    kvr_ui_reading_t r;
    for (uint64_t t = 1000; t <= 2000; t += 1000) {
        kvr_ui_reading_parse(text, strlen(text), t, &r);
        assert_true(kvr_ui_history_add(h, &r));
    }
    const kvr_ui_point_t *p = kvr_ui_history_point(h, 0);
    assert_true(p->has_replicas && p->peers == 2);
    assert_true(isnan(p->sync_lag_p50_ms) && isnan(p->sync_events_per_s) && isnan(p->sync_lost));
    free(h);
}

static void test_ring_keeps_ten_minutes_in_order(void **state)
{
    (void)state;
    kvr_ui_history_t *h = calloc(1, sizeof *h);
    kvr_ui_history_init(h);
    kvr_ui_reading_t r;
    memset(&r, 0, sizeof r);
    for (uint64_t i = 0; i < KVR_UI_POINTS + 101; i++) {
        r.t_ms = 1000 * (i + 1);
        r.routes_ok = (double)i;
        assert_true(kvr_ui_history_add(h, &r));
    }
    assert_int_equal(h->n_points, KVR_UI_POINTS);
    /* the oldest kept is reading 101's point, the newest the last reading's */
    assert_int_equal(kvr_ui_history_point(h, 0)->t_ms, 102000);
    assert_int_equal(kvr_ui_history_point(h, KVR_UI_POINTS - 1)->t_ms,
                     1000 * (KVR_UI_POINTS + 101));
    char msg[200];
    assert_int_equal(kvr_ui_history_verify(h, msg, sizeof msg), KVR_OK);
    /* a point out of order is caught */
    h->points[(h->head + 5) % KVR_UI_POINTS].t_ms = 1;
    assert_int_equal(kvr_ui_history_verify(h, msg, sizeof msg), KVR_EINVAL);
    assert_non_null(strstr(msg, "not after"));
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantile_as_prometheus),
        cmocka_unit_test(test_reading_sums_labels),
        cmocka_unit_test(test_rates_ratios_and_nulls),
        cmocka_unit_test(test_refusals_with_and_without_a_queue),
        cmocka_unit_test(test_replicas_without_sync),
        cmocka_unit_test(test_ring_keeps_ten_minutes_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

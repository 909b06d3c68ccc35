/*
 * test_prom.c: /metrics text a Prometheus server accepts: HELP/TYPE per family, escaped
 * label values, integral counters printed exactly, NaN/Inf spelled as the format wants, and
 * cumulative histogram buckets ending with +Inf = count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "wire/prom.h"

static void test_family_and_samples(void **s)
{
    (void)s;
    kvr_prom_t p;
    kvr_prom_init(&p);
    kvr_prom_family(&p, "kvr_events_total", "counter", "Events applied.\nBy kind.");
    kvr_prom_label_t l[] = {{"kind", "stored"}, {"worker", "a\"b\\c\nd"}};
    kvr_prom_sample(&p, "kvr_events_total", l, 2, 9007199254740991.0);
    kvr_prom_sample(&p, "kvr_events_total", NULL, 0, 0.25);
    kvr_prom_sample(&p, "kvr_events_total", NULL, 0, NAN);
    kvr_prom_sample(&p, "kvr_events_total", NULL, 0, -INFINITY);
    assert_string_equal(p.buf,
                        "# HELP kvr_events_total Events applied.\\nBy kind.\n"
                        "# TYPE kvr_events_total counter\n"
                        "kvr_events_total{kind=\"stored\",worker=\"a\\\"b\\\\c\\nd\"} 9007199254740991\n"
                        "kvr_events_total 0.25\n"
                        "kvr_events_total NaN\n"
                        "kvr_events_total -Inf\n");
    kvr_prom_reset(&p);
    assert_int_equal(p.len, 0);
    kvr_prom_deinit(&p);
}

static void test_histogram_is_cumulative(void **s)
{
    (void)s;
    static const double b[] = {0.01, 0.1, 1};
    kvr_hist_t h;
    kvr_hist_init(&h, b, 3);
    double obs[] = {0.005, 0.05, 0.05, 0.5, 7};
    for (int i = 0; i < 5; i++)
        kvr_hist_observe(&h, obs[i]);
    kvr_prom_t p;
    kvr_prom_init(&p);
    kvr_prom_label_t l[] = {{"stage", "lookup"}};
    kvr_prom_hist(&p, "kvr_route_ms", l, 1, &h);
    assert_string_equal(p.buf,
                        "kvr_route_ms_bucket{stage=\"lookup\",le=\"0.01\"} 1\n"
                        "kvr_route_ms_bucket{stage=\"lookup\",le=\"0.1\"} 3\n"
                        "kvr_route_ms_bucket{stage=\"lookup\",le=\"1\"} 4\n"
                        "kvr_route_ms_bucket{stage=\"lookup\",le=\"+Inf\"} 5\n"
                        "kvr_route_ms_sum{stage=\"lookup\"} 7.605\n"
                        "kvr_route_ms_count{stage=\"lookup\"} 5\n");
    kvr_prom_deinit(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_family_and_samples),
        cmocka_unit_test(test_histogram_is_cumulative),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_prom_read.c: the Prometheus text reader (wire/prom_read.h) on what the router's
 * writer (wire/prom.h) writes, and on lines it must pass over: names, labels with every
 * escape, values in every spelling, timestamps, comments, malformed lines counted and skipped.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wire/prom.h"
#include "wire/prom_read.h"

static void test_reads_back_what_the_writer_wrote(void **state)
{
    (void)state;
    kvr_prom_t p;
    kvr_prom_init(&p);
    kvr_prom_counter(&p, "kvr_a_total", "A.", 42);
    kvr_prom_label_t l[] = {{"pool", "de\"co\\de\nx"}, {"le", "+Inf"}};
    kvr_prom_family(&p, "kvr_b", "gauge", "B.");
    kvr_prom_sample(&p, "kvr_b", l, 2, 0.25);
    kvr_prom_reader_t r;
    kvr_prom_reader_init(&r, p.buf, p.len);
    kvr_prom_line_t line;
    assert_true(kvr_prom_reader_next(&r, &line));
    assert_true(kvr_prom_line_is(&line, "kvr_a_total"));
    assert_false(kvr_prom_line_is(&line, "kvr_a"));
    assert_true(line.value == 42);
    char v[64];
    assert_false(kvr_prom_line_label(&line, "pool", v, sizeof v));
    assert_true(kvr_prom_reader_next(&r, &line));
    assert_true(kvr_prom_line_is(&line, "kvr_b"));
    assert_true(line.value == 0.25);
    assert_true(kvr_prom_line_label(&line, "pool", v, sizeof v));
    assert_string_equal(v, "de\"co\\de\nx");
    assert_true(kvr_prom_line_label(&line, "le", v, sizeof v));
    assert_string_equal(v, "+Inf");
    assert_false(kvr_prom_line_label(&line, "p", v, sizeof v));
    assert_false(kvr_prom_line_label(&line, "pool", v, 4)); /* does not fit */
    assert_false(kvr_prom_reader_next(&r, &line));
    assert_int_equal(r.skipped, 0);
    kvr_prom_deinit(&p);
}

static void test_values_timestamps_and_blank_lines(void **state)
{
    (void)state;
    const char *text = "\n# HELP x y\n  \nx_nan NaN\nx_inf +Inf 1700000000000\r\n"
                       "x_neg{a=\"}\"} -1.5e3\n\tx_tab 7";
    kvr_prom_reader_t r;
    kvr_prom_reader_init(&r, text, strlen(text));
    kvr_prom_line_t l;
    assert_true(kvr_prom_reader_next(&r, &l));
    assert_true(isnan(l.value));
    assert_true(kvr_prom_reader_next(&r, &l));
    assert_true(isinf(l.value) && l.value > 0);
    assert_true(kvr_prom_reader_next(&r, &l));
    assert_true(kvr_prom_line_is(&l, "x_neg"));
    assert_true(l.value == -1500);
    char v[8];
    assert_true(kvr_prom_line_label(&l, "a", v, sizeof v));
    assert_string_equal(v, "}"); /* a brace inside a quoted value does not close the labels */
    assert_true(kvr_prom_reader_next(&r, &l));
    assert_true(l.value == 7);
    assert_false(kvr_prom_reader_next(&r, &l));
    assert_int_equal(r.skipped, 0);
}

static void test_malformed_lines_skipped_and_counted(void **state)
{
    (void)state;
    const char *text = "1bad 1\n"             /* a name cannot start with a digit */
                       "open{a=\"x\" 1\n"     /* braces never closed */
                       "esc{a=\"\\q\"} 1\n"   /* an escape the format does not have */
                       "noval\n"              /* no value */
                       "word 12abc\n"         /* not a number */
                       "glued{a=\"b\"}1\n"    /* no space before the value */
                       "good{a=\"b\"} 3\n";
    kvr_prom_reader_t r;
    kvr_prom_reader_init(&r, text, strlen(text));
    kvr_prom_line_t l;
    assert_true(kvr_prom_reader_next(&r, &l));
    assert_true(kvr_prom_line_is(&l, "good"));
    assert_true(l.value == 3);
    assert_false(kvr_prom_reader_next(&r, &l));
    assert_int_equal(r.skipped, 6);
    /* NULL text: nothing to read */
    kvr_prom_reader_init(&r, NULL, 10);
    assert_false(kvr_prom_reader_next(&r, &l));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_back_what_the_writer_wrote),
        cmocka_unit_test(test_values_timestamps_and_blank_lines),
        cmocka_unit_test(test_malformed_lines_skipped_and_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

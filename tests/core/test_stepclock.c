/*
 * test_stepclock.c: a rank's step clock (core/stepclock.c): the time a running step has left,
 * the weighted mean of step lengths, the streamed tokens of one step taken as one end however
 * spread, idle time never taken for a step, and time running backwards ignored; the prefill
 * stream: what a request booked now finds computed when its engine admits it.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/stepclock.h"

#define MS 1000u

static void test_wait_left_in_the_step(void **s)
{
    (void)s;
    kvr_stepclock_t c = {0};
    assert_true(kvr_stepclock_verify(&c));
    assert_true(kvr_stepclock_wait_ms(&c, 5 * MS) == 0); /* nothing known: no wait */
    kvr_stepclock_end(&c, 100 * MS);
    assert_int_equal(c.steps, 0); /* one end alone measures nothing */
    kvr_stepclock_end(&c, 120 * MS);
    assert_int_equal(c.steps, 1);
    assert_true(c.mean_us == 20 * MS);
    assert_true(kvr_stepclock_wait_ms(&c, 125 * MS) == 15.0);
    assert_true(kvr_stepclock_wait_ms(&c, 140 * MS) == 0);    /* overdue: ends any moment */
    assert_true(kvr_stepclock_wait_ms(&c, 119 * MS) == 20.0); /* asked before the end */
    /* a 40 ms step moves the mean a tenth of the way */
    kvr_stepclock_end(&c, 160 * MS);
    assert_true(c.mean_us == 22 * MS);
    assert_true(kvr_stepclock_verify(&c));
}

static void test_one_step_many_tokens(void **s)
{
    (void)s;
    /* steps of 24 ms; each of 21 running requests gets one token per step, reaching the router
     * 250 us after the one before (5 ms from first to last): the tokens of one step are one
     * end, at its first token, and the mean is the step's length, not the tokens' spacing */
    kvr_stepclock_t c = {0};
    uint64_t seen[21] = {0};
    uint64_t t = 1000 * MS;
    for (int step = 0; step < 60; step++, t += 24 * MS)
        for (size_t r = 0; r < 21; r++)
            kvr_stepclock_token(&c, &seen[r], t + r * 250);
    assert_int_equal(c.ends, 59); /* the first burst's end is not known to be one */
    assert_int_equal(c.steps, 58);
    assert_true(c.mean_us > 23.99 * MS && c.mean_us < 24.01 * MS);
    uint64_t last = t - 24 * MS;
    assert_int_equal(c.last_us, last);
    double w = kvr_stepclock_wait_ms(&c, last + 10 * MS);
    assert_true(w > 13.99 && w < 14.01);
    /* a new request's first token, alone and late (more than half a step after the end):
     * a step of its own */
    uint64_t fresh = 0;
    kvr_stepclock_token(&c, &fresh, last + 20 * MS);
    assert_int_equal(c.ends, 60);
    assert_int_equal(c.last_us, last + 20 * MS);
    /* one alone, early: part of the step that just ended */
    uint64_t other = 0;
    kvr_stepclock_token(&c, &other, last + 22 * MS);
    assert_int_equal(c.ends, 60);
    /* a single running request: each of its tokens is a step */
    kvr_stepclock_t one = {0};
    uint64_t r1 = 0;
    for (uint64_t k = 0; k < 10; k++)
        kvr_stepclock_token(&one, &r1, 5000 * MS + k * 7 * MS);
    assert_int_equal(one.steps, 8);
    assert_true(one.mean_us == 7 * MS);
    assert_true(kvr_stepclock_verify(&c) && kvr_stepclock_verify(&one));
}

static void test_idle_is_not_a_step(void **s)
{
    (void)s;
    kvr_stepclock_t c = {0};
    kvr_stepclock_end(&c, 100 * MS);
    kvr_stepclock_end(&c, 130 * MS);
    assert_true(c.mean_us == 30 * MS);
    /* idle from 130 ms; work arrives at 900 ms and its step ends at 920 ms */
    kvr_stepclock_wake(&c, 900 * MS);
    kvr_stepclock_end(&c, 920 * MS);
    assert_true(c.mean_us == 29 * MS); /* 30 + (20 - 30) / 10, not the 790 ms since 130 */
    /* an idle time the router did not see begin, longer than any step: only moves the clock */
    kvr_stepclock_end(&c, 920 * MS + KVR_STEPCLOCK_MAX_US + 1);
    assert_int_equal(c.steps, 2);
    assert_true(c.mean_us == 29 * MS);
    assert_int_equal(c.last_us, 920 * MS + KVR_STEPCLOCK_MAX_US + 1);
    /* a time from the past changes nothing */
    kvr_stepclock_t before = c;
    kvr_stepclock_end(&c, 50 * MS);
    kvr_stepclock_wake(&c, 50 * MS);
    assert_memory_equal(&c, &before, sizeof c);
    assert_true(kvr_stepclock_verify(&c));
}

/* An idle rank starts a step for a booking at once: a request booked while that step runs
 * finds its tokens computed when admitted (after the step). One booked on a busy rank waits
 * for the step under way: a request booked right behind it is admitted in the same step and
 * finds none of it. */
static void test_stream_first_step(void **s)
{
    (void)s;
    kvr_stepclock_t c = {0};
    assert_int_equal(kvr_stepclock_book(&c, 6000, true, 8192), 0);
    kvr_stepclock_wake(&c, 10 * MS);
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 6000);
    assert_int_equal(kvr_stepclock_book(&c, 60, false, 8192), 6000);
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 6000);
    kvr_stepclock_end(&c, 130 * MS); /* its step ends: the 6000 are computed */
    assert_int_equal(c.done, 6000);
    /* busy: another 6000 booked now wait for the step under way (the 60, which began
     * before them), and a request booked behind them is batched with them */
    assert_int_equal(kvr_stepclock_book(&c, 6000, false, 8192), 6060);
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 6060);
    kvr_stepclock_end(&c, 170 * MS); /* the 60's step; the 6000's begins */
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 12060);
    assert_true(kvr_stepclock_verify(&c));
}

/* A prompt longer than a chunk is computed a chunk a step: a request booked behind it finds
 * what the steps before its own computed; a long stream ahead fills whole steps first. */
static void test_stream_chunks(void **s)
{
    (void)s;
    kvr_stepclock_t c = {0};
    (void)kvr_stepclock_book(&c, 20000, true, 8192);
    kvr_stepclock_wake(&c, 10 * MS);
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 16384); /* 2 steps, then its */
    kvr_stepclock_end(&c, 180 * MS);
    assert_int_equal(c.done, 8192);
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 16384);
    kvr_stepclock_end(&c, 350 * MS);
    assert_int_equal(kvr_stepclock_computed_before(&c, true), 20000);
    assert_int_equal(kvr_stepclock_computed_before(&c, false), 16384); /* no step under way */
    /* its first token proves all of it computed, whatever the steps seen */
    kvr_stepclock_prefilled(&c, 20000);
    assert_int_equal(c.done, 20000);
    kvr_stepclock_prefilled(&c, 25000); /* past the stream: not a position of this rank */
    assert_int_equal(c.done, 20000);
    /* a booking on an idle rank: all booked before is computed */
    (void)kvr_stepclock_book(&c, 100, false, 8192);
    assert_int_equal(kvr_stepclock_book(&c, 100, true, 8192), 20100);
    assert_int_equal(c.done, 20100);
    assert_true(kvr_stepclock_verify(&c));
}

/* A step's length grows with the prompt tokens it computes: after decode steps of 10 ms and
 * prefill steps of 1,000 and 3,000 tokens (16 ms + 20 us a token: 36 and 76 ms), the step
 * computing a 6,000-token prompt is expected to last 136 ms, so a request arriving 1 ms into
 * it waits 135, not the mean of all steps less 1; a decode step is expected to last 10. */
static void decode_steps(kvr_stepclock_t *c, uint64_t *t, int n, uint64_t ms)
{
    for (int i = 0; i < n; i++) {
        *t += ms * MS;
        kvr_stepclock_end(c, *t);
    }
}

static void test_step_length_follows_its_prefill(void **s)
{
    (void)s;
    kvr_stepclock_t c = {0};
    uint64_t t = 10 * MS;
    (void)kvr_stepclock_book(&c, 1000, true, 8192);
    kvr_stepclock_wake(&c, t);
    t += 36 * MS;
    kvr_stepclock_end(&c, t); /* the 1,000 tokens' step */
    decode_steps(&c, &t, 5, 10);
    (void)kvr_stepclock_book(&c, 3000, false, 8192); /* waits for the decode step under way */
    decode_steps(&c, &t, 1, 10);
    t += 76 * MS;
    kvr_stepclock_end(&c, t); /* the 3,000 tokens' step */
    decode_steps(&c, &t, 5, 10);
    assert_int_equal(c.decode_steps, 11);
    assert_int_equal(c.prefill_steps, 2);
    assert_true(fabs(kvr_stepclock_wait_ms(&c, t + 1 * MS) - 9.0) < 1e-6); /* decode: 10 ms */
    double mean = c.mean_us / 1000.0;
    (void)kvr_stepclock_book(&c, 6000, false, 8192);
    decode_steps(&c, &t, 1, 10); /* the 6,000 tokens' step begins */
    double w = kvr_stepclock_wait_ms(&c, t + 1 * MS);
    assert_true(fabs(w - 135.0) < 1e-6);
    assert_true(w > 4.0 * (mean - 1.0)); /* one mean of all steps said a quarter of it */
    /* prefill steps of one size fit no slope: their mean length stands for every size (decode
     * steps of 15 ms: one under a quarter of the mean would be taken for the same step's end) */
    kvr_stepclock_t same = {0};
    uint64_t u = 10 * MS;
    for (int i = 0; i < 3; i++) {
        (void)kvr_stepclock_book(&same, 2000, i == 0, 8192);
        if (i == 0)
            kvr_stepclock_wake(&same, u);
        else
            decode_steps(&same, &u, 1, 15);
        u += 50 * MS;
        kvr_stepclock_end(&same, u);
    }
    (void)kvr_stepclock_book(&same, 8000, false, 8192);
    decode_steps(&same, &u, 1, 15);
    assert_true(fabs(kvr_stepclock_wait_ms(&same, u) - 50.0) < 1e-6);
    assert_true(kvr_stepclock_verify(&c) && kvr_stepclock_verify(&same));
}

static void test_verify_catches(void **s)
{
    (void)s;
    kvr_stepclock_t c = {.last_us = 1, .mean_us = 5}; /* a mean with no step */
    assert_false(kvr_stepclock_verify(&c));
    c = (kvr_stepclock_t){.last_us = 1, .ends = 4, .mean_us = -1, .steps = 3};
    assert_false(kvr_stepclock_verify(&c));
    c = (kvr_stepclock_t){.booked = 10, .done = 11}; /* computed past the stream */
    assert_false(kvr_stepclock_verify(&c));
    c = (kvr_stepclock_t){.booked = 10, .done = 5, .base = 6};
    assert_false(kvr_stepclock_verify(&c));
    c = (kvr_stepclock_t){.ends = 2, .steps = 2, .decode_steps = 2, .prefill_steps = 1};
    assert_false(kvr_stepclock_verify(&c)); /* more steps modelled than measured */
    c = (kvr_stepclock_t){.ends = 1, .steps = 1, .pf_us = 5}; /* a length with no step */
    assert_false(kvr_stepclock_verify(&c));
    c = (kvr_stepclock_t){.ends = 1, .steps = 1, .prefill_steps = 1, .pf_nn = NAN};
    assert_false(kvr_stepclock_verify(&c));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_left_in_the_step), cmocka_unit_test(test_one_step_many_tokens),
        cmocka_unit_test(test_idle_is_not_a_step),    cmocka_unit_test(test_stream_first_step),
        cmocka_unit_test(test_stream_chunks),         cmocka_unit_test(test_step_length_follows_its_prefill),
        cmocka_unit_test(test_verify_catches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

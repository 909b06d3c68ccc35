/*
 * stepclock.c: a rank's step clock and prefill stream (see stepclock.h).
 * Invariants (kvr_stepclock_verify): the means are finite and >= 0, and 0 until a step of
 * their kind is measured; steps <= ends; the model's steps <= steps; a predicted wait is in
 * [0, the expected length of the step under way]; base <= done <= booked, avail <=
 * booked. Debug builds assert them after every end and booking. Ownership: the caller's
 * struct, no allocation. Threads: the caller's lock. Cost: O(1).
 */
#include "core/stepclock.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>

#define NEWEST_WEIGHT 0.1

/* The stream position the step under way computes up to: a chunk of what it could see. */
static uint64_t running_end(const kvr_stepclock_t *c)
{
    return c->base + c->chunk < c->avail ? c->base + c->chunk : c->avail;
}

/* The model's means: the plain mean of the first 1 / NEWEST_WEIGHT samples, then weight
 * NEWEST_WEIGHT on the newest (n: the samples before x), so that the first sample, often the
 * least typical (a rank's first step batches whatever arrived before it began), does not
 * hold most of the weight for dozens of steps, as with weight 1 on it. */
static double weighted(double mean, uint64_t n, double x)
{
    double w = 1.0 / ((double)n + 1.0);
    return mean + (w > NEWEST_WEIGHT ? w : NEWEST_WEIGHT) * (x - mean);
}

/* A step that computed n prompt tokens lasted d us: the step length model learns from it. */
static void learn_length(kvr_stepclock_t *c, uint64_t n, double d)
{
    if (n == 0) {
        c->decode_us = weighted(c->decode_us, c->decode_steps++, d);
        return;
    }
    double x = (double)n;
    c->pf_n = weighted(c->pf_n, c->prefill_steps, x);
    c->pf_us = weighted(c->pf_us, c->prefill_steps, d);
    c->pf_nn = weighted(c->pf_nn, c->prefill_steps, x * x);
    c->pf_nus = weighted(c->pf_nus, c->prefill_steps, x * d);
    c->prefill_steps++;
}

bool kvr_stepclock_slope(const kvr_stepclock_t *c, double *us_per_token)
{
    double var = c->pf_nn - c->pf_n * c->pf_n;
    if (c->prefill_steps == 0 || !(var > KVR_STEPCLOCK_MIN_SPREAD * KVR_STEPCLOCK_MIN_SPREAD))
        return false;
    double slope = (c->pf_nus - c->pf_n * c->pf_us) / var;
    if (!(slope > 0)) /* longer prefills are not slower in this sample: no slope to trust */
        return false;
    *us_per_token = slope;
    return true;
}

/* The model's length of a step computing n > 0 prompt tokens (a prefill step measured): the
 * fitted line, else the prefill steps' mean length. */
static double prefill_length(const kvr_stepclock_t *c, uint64_t n)
{
    double slope;
    if (!kvr_stepclock_slope(c, &slope))
        return c->pf_us;
    double at = c->pf_us + slope * ((double)n - c->pf_n);
    return at > 0 ? at : 0;
}

/* The expected length of the step under way, in us (0: nothing measured yet). */
static double running_length(const kvr_stepclock_t *c)
{
    uint64_t n = running_end(c) - c->base;
    if (n == 0 && c->decode_steps > 0)
        return c->decode_us;
    if (n > 0 && c->prefill_steps > 0)
        return prefill_length(c, n);
    return c->mean_us;
}

void kvr_stepclock_end(kvr_stepclock_t *c, uint64_t now_us)
{
    double same = c->mean_us / 4 > KVR_STEPCLOCK_SAME_US ? c->mean_us / 4 : KVR_STEPCLOCK_SAME_US;
    if (c->last_us != 0 && (double)now_us < (double)c->last_us + same)
        return; /* the same step's tokens, or a time from the past */
    uint64_t step = running_end(c);
    if (c->last_us != 0 && now_us - c->last_us <= KVR_STEPCLOCK_MAX_US) {
        double d = (double)(now_us - c->last_us);
        c->mean_us = c->steps == 0 ? d : c->mean_us + NEWEST_WEIGHT * (d - c->mean_us);
        c->steps++;
        learn_length(c, (step > c->done ? step : c->done) - c->base, d);
    }
    c->last_us = now_us;
    c->ends++;
    if (step > c->done)
        c->done = step; /* the step computed up to a chunk of what it could see */
    c->base = c->done;  /* the next one begins */
    c->avail = c->booked;
    assert(kvr_stepclock_verify(c));
}

void kvr_stepclock_token(kvr_stepclock_t *c, uint64_t *seen, uint64_t now_us)
{
    uint64_t current = c->ends + 1; /* 0 stays "no token yet" */
    bool again = *seen == current;  /* its second token since the last end */
    bool late = *seen == 0 && c->steps > 0 && /* a step measured: last_us is set */
                (double)now_us > (double)c->last_us + c->mean_us / 2;
    if (again || late)
        kvr_stepclock_end(c, now_us);
    *seen = c->ends + 1;
}

void kvr_stepclock_wake(kvr_stepclock_t *c, uint64_t now_us)
{
    if (now_us > c->last_us)
        c->last_us = now_us;
    c->base = c->done;
    c->avail = c->booked;
}

uint64_t kvr_stepclock_book(kvr_stepclock_t *c, uint64_t tokens, bool idle, uint32_t chunk)
{
    if (idle) /* nothing in flight: all booked before is computed, no step is under way */
        c->done = c->base = c->avail = c->booked;
    c->chunk = chunk;
    uint64_t at = c->booked;
    c->booked += tokens;
    assert(kvr_stepclock_verify(c));
    return at;
}

void kvr_stepclock_prefilled(kvr_stepclock_t *c, uint64_t end)
{
    if (end > c->done && end <= c->booked)
        c->done = end;
}

uint64_t kvr_stepclock_computed_before(const kvr_stepclock_t *c, bool busy)
{
    uint64_t done = c->done;
    if (busy) { /* the step under way computes up to a chunk of what it could see */
        uint64_t step = running_end(c);
        done = step > done ? step : done;
    }
    if (c->chunk == 0)
        return done;
    /* every later step fills its chunk with the stream ahead, oldest first */
    return done + (c->booked - done) / c->chunk * c->chunk;
}

double kvr_stepclock_wait_ms(const kvr_stepclock_t *c, uint64_t now_us)
{
    if (c->steps == 0)
        return 0;
    double since = now_us > c->last_us ? (double)(now_us - c->last_us) : 0; /* coarser clock */
    double length = running_length(c);
    double left = length - since;
    assert(left <= length);
    return left > 0 ? left / 1000.0 : 0;
}

bool kvr_stepclock_verify(const kvr_stepclock_t *c)
{
    double m[] = {c->mean_us, c->decode_us, c->pf_n, c->pf_us, c->pf_nn, c->pf_nus};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (!isfinite(m[i]) || m[i] < 0)
            return false;
    if (c->decode_steps + c->prefill_steps > c->steps || (c->decode_steps == 0 && c->decode_us != 0) ||
        (c->prefill_steps == 0 && c->pf_us != 0))
        return false;
    return c->steps <= c->ends && (c->steps > 0 || c->mean_us == 0) && c->base <= c->done &&
           c->done <= c->booked && c->avail <= c->booked;
}

/*
 * stepclock.c: a rank's step clock and prefill stream (see stepclock.h).
 * Invariants (kvr_stepclock_verify): the mean is finite and >= 0, and 0 until a step is
 * measured; steps <= ends; a predicted wait is in [0, mean]; base <= done <= booked, avail <=
 * booked. Debug builds assert them after every end and booking. Ownership: the caller's
 * struct, no allocation. Threads: the caller's lock. Cost: O(1).
 */
#include "core/stepclock.h"

#include <assert.h>
#include <math.h>

#define NEWEST_WEIGHT 0.1

void kvr_stepclock_end(kvr_stepclock_t *c, uint64_t now_us)
{
    double same = c->mean_us / 4 > KVR_STEPCLOCK_SAME_US ? c->mean_us / 4 : KVR_STEPCLOCK_SAME_US;
    if (c->last_us != 0 && (double)now_us < (double)c->last_us + same)
        return; /* the same step's tokens, or a time from the past */
    if (c->last_us != 0 && now_us - c->last_us <= KVR_STEPCLOCK_MAX_US) {
        double d = (double)(now_us - c->last_us);
        c->mean_us = c->steps == 0 ? d : c->mean_us + NEWEST_WEIGHT * (d - c->mean_us);
        c->steps++;
    }
    c->last_us = now_us;
    c->ends++;
    uint64_t step = c->base + c->chunk < c->avail ? c->base + c->chunk : c->avail;
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
        uint64_t step = c->base + c->chunk < c->avail ? c->base + c->chunk : c->avail;
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
    double left = c->mean_us - since;
    assert(left <= c->mean_us);
    return left > 0 ? left / 1000.0 : 0;
}

bool kvr_stepclock_verify(const kvr_stepclock_t *c)
{
    if (!isfinite(c->mean_us) || c->mean_us < 0)
        return false;
    return c->steps <= c->ends && (c->steps > 0 || c->mean_us == 0) && c->base <= c->done &&
           c->done <= c->booked && c->avail <= c->booked;
}

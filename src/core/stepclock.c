/*
 * stepclock.c: a rank's step clock (see stepclock.h).
 * Invariants (kvr_stepclock_verify): the mean is finite and >= 0, and 0 until a step is
 * measured; steps <= ends; a predicted wait is in [0, mean]. Debug builds assert them after
 * every end. Ownership: the caller's struct, no allocation. Threads: the caller's lock.
 * Cost: O(1).
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
    return c->steps <= c->ends && (c->steps > 0 || c->mean_us == 0);
}

/*
 * fe_disagg.h: disaggregated prefill/decode as a LEG PLANNER that decorates the front end's
 * request state machine (frontend.c), the way nginx's upstream keepalive module decorates
 * the peer get/free of an upstream: the machine runs legs (place, send, relay, retry) and
 * asks the planner at four hook sites what the legs are:
 *
 *   fe_plan_first   the ids are known: the first leg (p->leg), or a refusal;
 *   fe_plan_placed  a leg was booked: send its call, or go on to the next leg (bootstrap),
 *                   or place it again, or fall back to aggregated;
 *   fe_plan_ended   a leg ended (not placed, retries spent, failed, broke, answered, or its
 *                   call ended after its client left): the machine's own handling (GO), the
 *                   next leg (fallback to aggregated included), the leg's answer as the
 *                   client's, or a refusal;
 *   fe_plan_release p ends, fails or loses its client: the planner's own background calls
 *                   and the KV a prefill left behind.
 *
 * The planner never fails, answers or finishes a request itself: it returns a verdict and the
 * machine acts on it. Its one event outside the hooks (a bootstrap prefill call failing under
 * its decode call) goes back through fe->leg_lost, the machine's callback. An aggregated
 * request (p->dis NULL) costs the planner a test a hook; its decode-pool counters are kept.
 * Invariants, ownership, threads and cost: see fe_disagg.c.
 */
#ifndef KVR_FRONTEND_FE_DISAGG_H
#define KVR_FRONTEND_FE_DISAGG_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/http.h>

#include "frontend/fe_ctx.h"
#include "frontend/fe_req.h"

/* What the machine does next with p. */
typedef enum fe_step {
    FE_STEP_GO = 0, /* as for an aggregated request: route the leg (first), send its call
                       (placed), or the machine's own handling of how it ended (ended) */
    FE_STEP_NEXT,   /* the leg is over (its booking freed): p->leg is the next one, placed
                       from the timer with fresh attempts (a fallback to aggregated included) */
    FE_STEP_RETRY,  /* p->leg placed again from the timer (route.tried, last_fail say why) */
    FE_STEP_REPLY,  /* the leg's whole answer is the client's: relayed, then p finishes */
    FE_STEP_FINISH, /* p finishes (its client has left) */
    FE_STEP_FAIL,   /* p is answered status and msg, and finishes */
} fe_step_t;

typedef struct fe_verdict {
    fe_step_t step;
    int status;    /* FE_STEP_FAIL */
    char msg[512]; /* FE_STEP_FAIL */
} fe_verdict_t;

/* How a leg ended. */
typedef enum fe_end {
    FE_END_UNPLACED, /* its placement failed (rc) */
    FE_END_SPENT,    /* its retries are spent, or its pinned worker failed (route.last_fail) */
    FE_END_FAILED,   /* its call failed before its first byte (to be retried, booking freed) */
    FE_END_BROKEN,   /* its call broke after its first byte, or went silent (kind) */
    FE_END_ANSWERED, /* its call's whole answer (up, code) */
    FE_END_ORPHANED, /* its call ended after its client left (up, code; 0: failed) */
} fe_end_t;

typedef struct fe_leg_end {
    fe_end_t how;
    int rc;                    /* UNPLACED: the placement's status */
    up_kind_t kind;            /* BROKEN */
    struct evhttp_request *up; /* ANSWERED, ORPHANED */
    int code;                  /* ANSWERED, ORPHANED */
} fe_leg_end_t;

/* Why the planner lets go of p's calls. */
typedef enum fe_rel {
    FE_REL_END,    /* p ends: a bootstrap prefill call runs to its end on its own; p's part
                      goes back to the pool */
    FE_REL_CANCEL, /* p fails or its client left: its bootstrap prefill call is cancelled
                      (it would wait for a decode that won't come), and a pulled prefill's KV
                      no decode worker got is released */
    FE_REL_DETACH, /* its client leaves while its call goes on (leg.keep): what a release call
                      needs of the client's body is kept */
} fe_rel_t;

/* ---- the hooks ---------------------------------------------------------------------------- */
void fe_plan_first(fe_req_t *p, fe_verdict_t *v);
void fe_plan_placed(fe_req_t *p, const kvr_route_res_t *res, fe_verdict_t *v);
void fe_plan_ended_dis(fe_req_t *p, const fe_leg_end_t *e, fe_verdict_t *v);
static inline void fe_plan_ended(fe_req_t *p, const fe_leg_end_t *e, fe_verdict_t *v)
{
    if (p->dis == NULL) {
        v->step = FE_STEP_GO; /* one leg: the machine's own handling */
        return;
    }
    fe_plan_ended_dis(p, e, v);
}
void fe_plan_release(fe_req_t *p, fe_rel_t why);

/* ---- queries -------------------------------------------------------------------------------- */
/* The prefill worker that served (or serves) p; NULL: none (the answer names it). */
const kvr_worker_t *fe_plan_prefill_worker(const fe_req_t *p);

/* ---- the planner's lifecycle ------------------------------------------------------------- */
/* lost: the machine's callback for a leg lost outside the hooks (its call dropped, its
 * booking freed, p placed again from its timer). */
int fe_disagg_init(kvr_frontend_t *fe, fe_leg_lost_fn lost);
void fe_disagg_free(kvr_frontend_t *fe);
/* The pool state, checked from the tick (transitions logged and counted). */
kvr_disagg_state_t fe_disagg_tick(kvr_frontend_t *fe);
void fe_disagg_metrics(const kvr_frontend_t *fe, struct kvr_prom *pr);
/* A worker left: background calls booked on it have nothing left to release. */
void fe_disagg_worker_removed(kvr_frontend_t *fe, uint64_t worker_id);
/* Asserts the planner's invariants on p (fe_req_verify calls it). */
void fe_disagg_verify(const fe_req_t *p);

#endif

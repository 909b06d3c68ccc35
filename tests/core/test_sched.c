/*
 * test_sched.c: the scheduler (kvrouter/sched.h) over a real router and index.
 *   - lifecycle by handle: O(1) calls, a stale handle misses and never names a later request;
 *   - the queue: busy -> queued, a load change dispatches at once (counted as an event), the
 *     backlog is not overtaken, cancel never calls back, expiry answers KVR_EBUSY;
 *   - a copied request outlives the caller's buffers; a queued request keeps its hashes (its
 *     overlap is found when dispatched, with no tokens);
 *   - a callback that frees a booking re-enters: the running pass places the next one;
 *   - observers see local and peer events; a peer's free applies by id;
 *   - an overlap source (a remote indexer): a placement waits for its answer, a failure
 *     routes with zero overlap, a cancel is never called back, a busy fleet queues it;
 *   - a model test: random places, lifecycle calls, cancels and ticks against a model of the
 *     bookings and the queue. After every step: kvr_sched_verify, the router holds exactly the
 *     model's bookings, every ticket is answered once (never after a cancel), and the queue
 *     is work-conserving (a request waits only while every worker is busy).
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

#include "common/model_driver.h"
#include "core/load.h"
#include "kvrouter/sched.h"

#define BS 16
#define MAXT 4096

typedef struct fx {
    kvr_index_t *ix;
    kvr_router_t *r;
    kvr_sched_t *s;
    kvr_router_config_t cfg;
} fx_t;

static uint32_t toks[MAXT];

static void prompt(uint32_t *t, uint32_t base, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base * 100000u + (uint32_t)i;
}

static void set(fx_t *f, const char *k, const char *v)
{
    char err[200];
    if (kvr_config_set(&f->cfg, k, v, err, sizeof err) != KVR_OK)
        fail_msg("%s=%s: %s", k, v, err);
}

/* n_workers workers; busy past 1000 prefill tokens; the queue on unless queue is false. */
static void make(fx_t *f, int n_workers, bool queue)
{
    kvr_config_defaults(&f->cfg);
    set(f, "seed", "7");
    set(f, "active_prefill_tokens_threshold", "1000");
    if (queue) {
        set(f, "router_queue_threshold", "1.0"); /* of max_num_batched_tokens=1000 */
        set(f, "router_queue_timeout_ms", "500");
        set(f, "router_queue_max_requests", "64");
    }
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    int st;
    f->ix = kvr_index_new(&ic, &st);
    assert_non_null(f->ix);
    char err[200];
    f->r = kvr_router_new(&f->cfg, f->ix, &st, err, sizeof err);
    if (f->r == NULL)
        fail_msg("router: %s", err);
    for (int id = 1; id <= n_workers; id++) {
        kvr_worker_spec_t w;
        char text[64];
        snprintf(text, sizeof text, "id=%d,max_num_batched_tokens=1000", id);
        assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
        assert_int_equal(kvr_router_add_worker(f->r, &w, err, sizeof err), KVR_OK);
    }
    kvr_sched_config_t sc;
    kvr_sched_config_from(&sc, &f->cfg);
    const char *field;
    f->s = kvr_sched_new(f->r, &sc, &st, &field);
    if (f->s == NULL)
        fail_msg("scheduler: %s (%s)", kvr_strerror(st), field ? field : "-");
}

static void unmake(fx_t *f)
{
    char msg[200];
    if (kvr_sched_verify(f->s, msg, sizeof msg) != KVR_OK)
        fail_msg("verify: %s", msg);
    kvr_sched_free(f->s);
    kvr_router_free(f->r);
    kvr_index_free(f->ix);
}

static uint64_t live(const fx_t *f)
{
    kvr_load_stats_t ls;
    kvr_load_stats(kvr_router_load(f->r), &ls);
    return ls.live_requests;
}

/* What a queued placement was told. */
typedef struct outcome {
    int calls, rc;
    bool expired;
    kvr_route_res_t res;
    fx_t *f;
    bool release_self; /* the client left as it was placed: freed from the callback */
} outcome_t;

static void on_done(void *arg, int rc, const kvr_route_res_t *res)
{
    outcome_t *o = arg;
    o->calls++;
    o->rc = rc;
    o->expired = res == NULL;
    if (res != NULL)
        o->res = *res;
    if (o->release_self && rc == KVR_OK) /* re-enters the running dispatch pass */
        assert_int_equal(kvr_sched_release(o->f->s, res->handle, 1000), KVR_OK);
}

static int place(fx_t *f, const uint32_t *t, size_t n, outcome_t *o, kvr_route_res_t *res,
                 kvr_ticket_t *ticket)
{
    kvr_route_req_t q = {.tokens = t, .n_tokens = n, .update_state = true};
    kvr_place_t p = {.q = &q, .copy = true, .done = o ? on_done : NULL, .arg = o};
    return kvr_sched_place(f->s, &p, 1000, res, ticket);
}

static void test_lifecycle_by_handle(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 2, false);
    kvr_route_res_t a, b;
    kvr_ticket_t t;
    prompt(toks, 1, 64);
    assert_int_equal(place(&f, toks, 64, NULL, &a, &t), KVR_OK);
    assert_int_equal(t, 0);
    assert_true(a.handle != KVR_REQ_HANDLE_NONE);
    assert_int_equal(kvr_sched_first_token(f.s, a.handle, 1000), KVR_OK);
    assert_int_equal(kvr_sched_output_block(f.s, a.handle, 0.5, 1000), KVR_OK);
    assert_int_equal(kvr_sched_output_block(f.s, a.handle, 1.5, 1000), KVR_ERANGE);
    assert_int_equal(kvr_sched_release(f.s, a.handle, 1000), KVR_OK);
    assert_int_equal(live(&f), 0);
    /* the slot is reused by the next booking: the old handle must not name it */
    assert_int_equal(place(&f, toks, 64, NULL, &b, &t), KVR_OK);
    assert_true(b.handle != a.handle);
    assert_int_equal(kvr_sched_release(f.s, a.handle, 1000), KVR_ENOTFOUND);
    assert_int_equal(kvr_sched_first_token(f.s, a.handle, 1000), KVR_ENOTFOUND);
    assert_int_equal(live(&f), 1);
    assert_int_equal(kvr_sched_release(f.s, KVR_REQ_HANDLE_NONE, 1000), KVR_EINVAL);
    /* by id, as the JSON API and a peer do */
    kvr_sched_event_t ev = {.kind = KVR_SCHED_FREE,
                            .id = b.request_id,
                            .id_len = strlen(b.request_id),
                            .decay_fraction = NAN};
    assert_int_equal(kvr_sched_apply(f.s, &ev, 1000), KVR_OK);
    assert_int_equal(kvr_sched_apply(f.s, &ev, 1000), KVR_ENOTFOUND);
    assert_int_equal(live(&f), 0);
    /* no queue: busy is an answer, not a wait */
    outcome_t o = {0};
    prompt(toks, 2, 2048);
    assert_int_equal(place(&f, toks, 2048, &o, &a, &t), KVR_OK);
    assert_int_equal(place(&f, toks, 2048, &o, &a, &t), KVR_OK);
    assert_int_equal(place(&f, toks, 64, &o, &a, &t), KVR_EBUSY);
    assert_int_equal(t, 0);
    assert_int_equal(o.calls, 0);
    unmake(&f);
}

static void test_queue_dispatches_on_a_load_change(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 2, true);
    kvr_route_res_t a, b, res;
    kvr_ticket_t t, tc, td;
    static uint32_t big[2][2048];
    prompt(big[0], 1, 2048);
    prompt(big[1], 2, 2048);
    assert_int_equal(place(&f, big[0], 2048, NULL, &a, &t), KVR_OK);
    assert_int_equal(place(&f, big[1], 2048, NULL, &b, &t), KVR_OK);
    outcome_t c = {.f = &f}, d = {.f = &f};
    prompt(toks, 3, 64);
    assert_int_equal(place(&f, toks, 64, &c, &res, &tc), KVR_OK);
    assert_true(tc != 0);
    assert_int_equal(place(&f, toks, 32, &d, &res, &td), KVR_OK);
    assert_true(td != 0);
    assert_int_equal(kvr_sched_queued(f.s), 2);
    /* a tick with nothing changed lets nothing go */
    kvr_sched_tick(f.s, 1010);
    assert_int_equal(c.calls + d.calls, 0);
    /* a's first token: its worker is no longer busy; both go, c first (fcfs) */
    assert_int_equal(kvr_sched_first_token(f.s, a.handle, 1020), KVR_OK);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.rc, KVR_OK);
    assert_int_equal(d.calls, 1);
    assert_int_equal(c.res.worker.worker_id, a.worker.worker_id);
    assert_true(c.res.handle != KVR_REQ_HANDLE_NONE && d.res.handle != c.res.handle);
    kvr_sched_stats_t ss;
    kvr_sched_stats(f.s, &ss);
    assert_int_equal(ss.dispatched[KVR_SCHED_BY_EVENT], 2);
    assert_int_equal(ss.dispatched[KVR_SCHED_BY_TICK], 0);
    assert_int_equal(live(&f), 4);
    /* a stale ticket cannot cancel anything */
    assert_false(kvr_sched_cancel(f.s, tc));
    unmake(&f);
}

static void test_backlog_cancel_and_expiry(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 1, true);
    kvr_route_res_t a, res;
    kvr_ticket_t t, t1, t2;
    prompt(toks, 1, 2048);
    assert_int_equal(place(&f, toks, 2048, NULL, &a, &t), KVR_OK);
    outcome_t o1 = {.f = &f}, o2 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o1, &res, &t1), KVR_OK);
    assert_int_equal(place(&f, toks, 64, &o2, &res, &t2), KVR_OK);
    assert_true(t1 != 0 && t2 != 0 && t1 != t2);
    assert_true(kvr_sched_cancel(f.s, t1));
    assert_false(kvr_sched_cancel(f.s, t1));
    /* a request that may not wait (no callback) is told busy, never queued */
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 64, .update_state = true};
    kvr_place_t p = {.q = &q};
    assert_int_equal(kvr_sched_place(f.s, &p, 1000, &res, &t), KVR_EBUSY);
    assert_int_equal(t, 0);
    /* past router_queue_timeout_ms (500): answered KVR_EBUSY with no decision */
    kvr_sched_tick(f.s, 1400);
    assert_int_equal(o2.calls, 0);
    kvr_sched_tick(f.s, 1600);
    assert_int_equal(o2.calls, 1);
    assert_true(o2.expired);
    assert_int_equal(o2.rc, KVR_EBUSY);
    assert_int_equal(o1.calls, 0); /* cancelled: never called */
    kvr_sched_stats_t ss;
    kvr_sched_stats(f.s, &ss);
    assert_int_equal(ss.queue.cancelled, 1);
    assert_int_equal(ss.queue.expired, 1);
    assert_int_equal(kvr_sched_queued(f.s), 0);
    unmake(&f);
}

/* A scheduler that holds requests for min_initial_workers ready, waiting at most wait_ms. */
static void make_waiting(fx_t *f, const char *min, const char *wait_ms)
{
    make(f, 0, false);
    kvr_sched_free(f->s);
    set(f, "min_initial_workers", min);
    set(f, "min_initial_workers_wait_ms", wait_ms);
    kvr_sched_config_t sc;
    kvr_sched_config_from(&sc, &f->cfg);
    int rc;
    f->s = kvr_sched_new(f->r, &sc, &rc, NULL);
    assert_non_null(f->s);
}

/* min_initial_workers: before that many workers are ready, requests that may wait do (the
 * router is starting and its workers register); the wait ends for good once they are, and a
 * request that waits past the start-up window (min_initial_workers_wait_ms from the first
 * call) is told KVR_ENOWORKER with no decision; one arriving after the window never waits. */
static void test_start_up_wait(void **st)
{
    (void)st;
    fx_t f;
    make_waiting(&f, "2", "300");
    prompt(toks, 3, 64);
    outcome_t a = {.f = &f}, b = {.f = &f};
    kvr_route_res_t res;
    kvr_ticket_t ta, tb, t;
    assert_int_equal(place(&f, toks, 64, &a, &res, &ta), KVR_OK);
    assert_true(ta != 0); /* waiting, not refused */
    /* one who may not wait is answered at once */
    assert_int_equal(place(&f, toks, 64, NULL, &res, &t), KVR_ENOWORKER);
    char err[200];
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse("id=1", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    kvr_sched_tick(f.s, 1100);
    assert_int_equal(a.calls, 0); /* one of two: still waiting */
    kvr_sched_tick(f.s, 1400);    /* past the wait: no worker for it */
    assert_int_equal(a.calls, 1);
    assert_true(a.expired);
    assert_int_equal(a.rc, KVR_ENOWORKER);
    /* the window is over: a request arriving now does not wait again; it is routed to the
     * one worker ready, at once */
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 64, .update_state = true};
    kvr_place_t pb = {.q = &q, .copy = true, .done = on_done, .arg = &b};
    assert_int_equal(kvr_sched_place(f.s, &pb, 1400, &res, &tb), KVR_OK);
    assert_int_equal(tb, 0);
    assert_int_equal(b.calls, 0);
    assert_int_equal(res.worker.worker_id, 1);
    assert_true(kvr_sched_warm(f.s));
    assert_int_equal(kvr_worker_spec_parse("id=2", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    assert_int_equal(live(&f), 1);
    /* once warm, never again: with every worker gone a request is refused at once */
    assert_int_equal(kvr_router_remove_worker(f.r, 1), KVR_OK);
    assert_int_equal(kvr_router_remove_worker(f.r, 2), KVR_OK);
    outcome_t c = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &c, &res, &t), KVR_ENOWORKER);
    assert_int_equal(t, 0);
    assert_int_equal(c.calls, 0);
    unmake(&f);
}

/* Load that went down behind the scheduler's back (a free straight to the router): an
 * arrival still queues behind the backlog, and the next dispatch places the backlog first. */
/* The start-up window runs from the scheduler's first call, not from each request's arrival:
 * a request that arrives late in it waits only for what is left; the ready workers reaching
 * min_initial_workers place the waiting ones at once. */
static void test_start_up_window(void **st)
{
    (void)st;
    fx_t f;
    make_waiting(&f, "1", "300");
    kvr_sched_tick(f.s, 1000); /* the router's first tick: the window is [1000, 1300) */
    prompt(toks, 4, 64);
    outcome_t a = {.f = &f}, b = {.f = &f};
    kvr_route_res_t res;
    kvr_ticket_t ta, tb;
    kvr_route_req_t q = {.tokens = toks, .n_tokens = 64, .update_state = true};
    kvr_place_t pa = {.q = &q, .copy = true, .done = on_done, .arg = &a};
    assert_int_equal(kvr_sched_place(f.s, &pa, 1250, &res, &ta), KVR_OK);
    assert_true(ta != 0);
    kvr_sched_tick(f.s, 1299);
    assert_int_equal(a.calls, 0);
    kvr_sched_tick(f.s, 1300); /* 50 ms after it came, not 300 */
    assert_int_equal(a.calls, 1);
    assert_int_equal(a.rc, KVR_ENOWORKER);
    unmake(&f);
    /* and a worker registering inside the window places the waiting request */
    make_waiting(&f, "1", "300");
    kvr_place_t pb = {.q = &q, .copy = true, .done = on_done, .arg = &b};
    assert_int_equal(kvr_sched_place(f.s, &pb, 1000, &res, &tb), KVR_OK);
    assert_true(tb != 0);
    char err[200];
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse("id=5", &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_router_add_worker(f.r, &w, err, sizeof err), KVR_OK);
    kvr_sched_tick(f.s, 1100);
    assert_int_equal(b.calls, 1);
    assert_int_equal(b.rc, KVR_OK);
    unmake(&f);
}

static void test_arrivals_do_not_overtake(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 1, true);
    kvr_route_res_t a, res;
    kvr_ticket_t t, t1, t2;
    prompt(toks, 1, 2048);
    assert_int_equal(place(&f, toks, 2048, NULL, &a, &t), KVR_OK);
    outcome_t o1 = {.f = &f}, o2 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o1, &res, &t1), KVR_OK);
    assert_true(t1 != 0);
    assert_int_equal(kvr_router_free_h(f.r, a.handle, 1000), KVR_OK); /* not through f.s */
    assert_int_equal(o1.calls, 0);
    assert_int_equal(place(&f, toks, 64, &o2, &res, &t2), KVR_OK); /* the worker is free... */
    assert_true(t2 != 0);                                         /* ...but o1 waits first */
    assert_int_equal(kvr_sched_queued(f.s), 2);
    kvr_sched_tick(f.s, 1010); /* the tick catches the change nobody reported */
    assert_int_equal(o1.calls, 1);
    assert_int_equal(o2.calls, 1);
    assert_int_equal(o1.rc, KVR_OK);
    assert_int_equal(o2.rc, KVR_OK);
    assert_true(o1.res.handle != o2.res.handle);
    kvr_sched_stats_t ss;
    kvr_sched_stats(f.s, &ss);
    assert_int_equal(ss.dispatched[KVR_SCHED_BY_TICK], 2);
    unmake(&f);
}

/* A request that brings its own hashes and asks to be copied: the hashes are copied too. */
static void test_own_hashes_copied(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 1, true);
    kvr_route_res_t a, res;
    kvr_ticket_t t;
    prompt(toks, 1, 2048);
    assert_int_equal(place(&f, toks, 2048, NULL, &a, &t), KVR_OK);
    static uint32_t mine[64];
    prompt(mine, 5, 64);
    uint64_t lbh[4], seq[4];
    kvr_route_req_t h = {.tokens = mine, .n_tokens = 64};
    assert_int_equal(kvr_router_hash(f.r, &h, lbh, seq, 4), 4);
    kvr_block_t blk[4]; /* the engine holds the prompt: the placement must find all 4 */
    for (int i = 0; i < 4; i++)
        blk[i] = (kvr_block_t){.ext = seq[i] ^ 77, .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = a.worker, .blocks = blk, .n_blocks = 4};
    assert_int_equal(kvr_index_apply(f.ix, &ev), KVR_OK);
    kvr_route_req_t q = {.n_tokens = 64, .update_state = true, .hashed = true,
                         .block_hashes = lbh, .seq_hashes = seq, .n_hashed = 4};
    outcome_t o = {.f = &f};
    kvr_place_t p = {.q = &q, .copy = true, .done = on_done, .arg = &o};
    assert_int_equal(kvr_sched_place(f.s, &p, 1000, &res, &t), KVR_OK);
    assert_true(t != 0);
    memset(lbh, 0, sizeof lbh); /* the caller's arrays are gone */
    memset(seq, 0, sizeof seq);
    assert_int_equal(kvr_sched_release(f.s, a.handle, 1000), KVR_OK);
    assert_int_equal(o.calls, 1);
    assert_int_equal(o.rc, KVR_OK);
    assert_int_equal(o.res.overlap_blocks, 4); /* the prompt's hashes, not the zeros */
    assert_int_equal(kvr_sched_release(f.s, o.res.handle, 1000), KVR_OK);
    kvr_route_req_t bad = q;
    bad.block_hashes = NULL;
    assert_int_equal(place(&f, toks, 2048, NULL, &a, &t), KVR_OK);
    p.q = &bad;
    assert_int_equal(kvr_sched_place(f.s, &p, 1000, &res, &t), KVR_EINVAL);
    unmake(&f);
}

/* A copied request's strings survive the caller; its hashes find the cached prefix. */
static void test_copy_and_hashes_survive(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 2, true);
    static uint32_t big[2][2048], mine[256];
    prompt(big[0], 1, 2048);
    prompt(big[1], 2, 2048);
    kvr_route_res_t a, b, res;
    kvr_ticket_t t;
    assert_int_equal(place(&f, big[0], 2048, NULL, &a, &t), KVR_OK);
    assert_int_equal(place(&f, big[1], 2048, NULL, &b, &t), KVR_OK);
    /* the engine of b's worker holds mine's first 8 blocks */
    prompt(mine, 9, 256);
    uint64_t lbh[16], seq[16];
    assert_int_equal(kvr_hash_prompt(mine, 8 * BS, BS, NULL, lbh, seq, 16), 8);
    kvr_block_t blk[8];
    for (int i = 0; i < 8; i++)
        blk[i] = (kvr_block_t){.ext = seq[i] ^ 77, .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = b.worker, .blocks = blk, .n_blocks = 8};
    assert_int_equal(kvr_index_apply(f.ix, &ev), KVR_OK);
    char id[32];
    strcpy(id, "req-copied");
    kvr_route_req_t q = {.tokens = mine,
                         .n_tokens = 256,
                         .update_state = true,
                         .request_id = id,
                         .request_id_len = strlen(id)};
    outcome_t o = {.f = &f};
    kvr_place_t p = {.q = &q, .copy = true, .done = on_done, .arg = &o};
    assert_int_equal(kvr_sched_place(f.s, &p, 1000, &res, &t), KVR_OK);
    assert_true(t != 0);
    memset(id, 'x', sizeof id - 1); /* the caller's buffers are gone */
    memset(mine, 0, sizeof mine);
    /* b's worker frees up: the queued request goes there, its 8 cached blocks found from the
     * hashes it was queued with */
    assert_int_equal(kvr_sched_first_token(f.s, b.handle, 1000), KVR_OK);
    assert_int_equal(o.calls, 1);
    assert_int_equal(o.rc, KVR_OK);
    assert_string_equal(o.res.request_id, "req-copied");
    assert_int_equal(o.res.worker.worker_id, b.worker.worker_id);
    assert_int_equal(o.res.overlap_blocks, 8);
    unmake(&f);
}

/* A callback that frees its booking re-enters the running pass: the next one is placed. */
static void test_reentrant_release(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 1, true);
    static uint32_t big[4][2048];
    for (int i = 0; i < 4; i++)
        prompt(big[i], (uint32_t)i + 1, 2048);
    kvr_route_res_t a, res;
    kvr_ticket_t t;
    assert_int_equal(place(&f, big[0], 2048, NULL, &a, &t), KVR_OK);
    outcome_t o1 = {.f = &f, .release_self = true}, o2 = {.f = &f}, o3 = {.f = &f};
    assert_int_equal(place(&f, big[1], 2048, &o1, &res, &t), KVR_OK);
    assert_int_equal(place(&f, big[2], 2048, &o2, &res, &t), KVR_OK);
    assert_int_equal(place(&f, big[3], 2048, &o3, &res, &t), KVR_OK);
    assert_int_equal(kvr_sched_queued(f.s), 3);
    /* a leaves: o1 is placed and freed from its callback, so o2 follows in the same call;
     * o2's prefill then keeps the worker busy and o3 waits */
    assert_int_equal(kvr_sched_release(f.s, a.handle, 1000), KVR_OK);
    assert_int_equal(o1.calls, 1);
    assert_int_equal(o2.calls, 1);
    assert_int_equal(o3.calls, 0);
    assert_int_equal(live(&f), 1);
    kvr_sched_stats_t ss;
    kvr_sched_stats(f.s, &ss);
    assert_int_equal(ss.dispatched[KVR_SCHED_BY_EVENT], 2);
    assert_int_equal(kvr_sched_first_token(f.s, o2.res.handle, 1000), KVR_OK);
    assert_int_equal(o3.calls, 1);
    unmake(&f);
}

typedef struct seen {
    int n[4][2];
} seen_t;

static void on_event(void *arg, const kvr_sched_event_t *ev)
{
    seen_t *s = arg;
    s->n[ev->kind][ev->origin]++;
}

static void test_observers_and_peer_events(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 2, false);
    seen_t seen = {0};
    assert_int_equal(kvr_sched_observe(f.s, on_event, &seen), KVR_OK);
    kvr_route_res_t a;
    kvr_ticket_t t;
    prompt(toks, 1, 64);
    assert_int_equal(place(&f, toks, 64, NULL, &a, &t), KVR_OK);
    assert_int_equal(kvr_sched_first_token(f.s, a.handle, 1000), KVR_OK);
    kvr_sched_event_t ev = {.kind = KVR_SCHED_FREE,
                            .origin = KVR_SCHED_ORIGIN_PEER,
                            .id = a.request_id,
                            .id_len = strlen(a.request_id),
                            .decay_fraction = NAN};
    assert_int_equal(kvr_sched_apply(f.s, &ev, 1000), KVR_OK);
    assert_int_equal(seen.n[KVR_SCHED_ROUTED][KVR_SCHED_ORIGIN_LOCAL], 1);
    assert_int_equal(seen.n[KVR_SCHED_FIRST_TOKEN][KVR_SCHED_ORIGIN_LOCAL], 1);
    assert_int_equal(seen.n[KVR_SCHED_FREE][KVR_SCHED_ORIGIN_PEER], 1);
    kvr_sched_stats_t ss;
    kvr_sched_stats(f.s, &ss);
    assert_int_equal(ss.applied[KVR_SCHED_ORIGIN_LOCAL], 1);
    assert_int_equal(ss.applied[KVR_SCHED_ORIGIN_PEER], 1);
    /* ROUTED is told, never applied; a bad origin is refused */
    ev.kind = KVR_SCHED_ROUTED;
    assert_int_equal(kvr_sched_apply(f.s, &ev, 1000), KVR_EINVAL);
    ev.kind = KVR_SCHED_FREE;
    ev.origin = (kvr_sched_origin_t)7;
    assert_int_equal(kvr_sched_apply(f.s, &ev, 1000), KVR_EINVAL);
    kvr_sched_unobserve(f.s, on_event, &seen);
    assert_int_equal(place(&f, toks, 64, NULL, &a, &t), KVR_OK);
    assert_int_equal(seen.n[KVR_SCHED_ROUTED][KVR_SCHED_ORIGIN_LOCAL], 1);
    for (int i = 0; i < KVR_SCHED_MAX_OBSERVERS; i++)
        assert_int_equal(kvr_sched_observe(f.s, on_event, &seen), KVR_OK);
    assert_int_equal(kvr_sched_observe(f.s, on_event, &seen), KVR_EFULL);
    unmake(&f);
}

/* What replica sync sees and does: a local booking's event carries what the tracker
 * admitted (its hashes), lifecycle events by handle carry the id (even a free's), and a
 * peer's booking admitted on another router carries the same load there; foreach shows it. */
typedef struct synced {
    char id[KVR_LOAD_MAX_ID_BYTES + 1];
    kvr_load_request_t booking;
    uint64_t seq[64];
    int frees_with_id;
} synced_t;

static void on_sync_event(void *arg, const kvr_sched_event_t *ev)
{
    synced_t *s = arg;
    if (ev->origin != KVR_SCHED_ORIGIN_LOCAL)
        return;
    if (ev->kind == KVR_SCHED_ROUTED) {
        assert_non_null(ev->booking);
        s->booking = *ev->booking;
        assert_true(ev->booking->n_seq <= 64);
        memcpy(s->seq, ev->booking->seq, ev->booking->n_seq * sizeof s->seq[0]);
        s->booking.seq = s->seq;
        memcpy(s->id, ev->id, ev->id_len);
        s->id[ev->id_len] = '\0';
        s->booking.id = s->id;
    } else if (ev->kind == KVR_SCHED_FREE && ev->id != NULL &&
               ev->id_len == strlen(s->id) && memcmp(ev->id, s->id, ev->id_len) == 0) {
        s->frees_with_id++;
    }
}

static int count_visit(void *arg, const kvr_load_request_view_t *v)
{
    synced_t *s = arg;
    assert_int_equal(v->id_len, strlen(s->id));
    assert_memory_equal(v->id, s->id, v->id_len);
    assert_int_equal(v->info.n_prompt_blocks, s->booking.n_seq);
    assert_memory_equal(v->prompt_hashes, s->seq, s->booking.n_seq * sizeof s->seq[0]);
    return 0;
}

static void test_peer_admits(void **st)
{
    (void)st;
    fx_t a, b;
    make(&a, 2, false);
    make(&b, 2, false);
    synced_t sy = {0};
    assert_int_equal(kvr_sched_observe_named(a.s, on_sync_event, &sy), KVR_OK);
    kvr_route_res_t res;
    kvr_ticket_t t;
    prompt(toks, 3, 64);
    assert_int_equal(place(&a, toks, 64, NULL, &res, &t), KVR_OK);
    assert_int_equal(sy.booking.n_seq, 4);
    assert_string_equal(sy.id, res.request_id);
    /* the booking admitted on b: the same load on the same rank */
    kvr_req_handle_t h;
    assert_int_equal(kvr_sched_admit_peer(b.s, &sy.booking, 1000, &h), KVR_OK);
    kvr_load_snapshot_t la, lb;
    kvr_load_snapshot(kvr_router_load(a.r), res.worker, &la);
    kvr_load_snapshot(kvr_router_load(b.r), res.worker, &lb);
    assert_true(la.active_blocks == lb.active_blocks && la.active_prefill_tokens ==
                lb.active_prefill_tokens && la.active_requests == lb.active_requests);
    assert_int_equal(kvr_sched_admit_peer(b.s, &sy.booking, 1000, &h), KVR_EEXIST);
    assert_int_equal(kvr_load_foreach(kvr_router_load(b.r), count_visit, &sy), KVR_OK);
    /* a rank b does not have */
    kvr_load_request_t other = sy.booking;
    other.worker.worker_id = 99;
    other.id = "x";
    other.id_len = 1;
    assert_int_equal(kvr_sched_admit_peer(b.s, &other, 1000, &h), KVR_ENOWORKER);
    /* a free by handle tells the observers the id */
    assert_int_equal(kvr_sched_release(a.s, res.handle, 1000), KVR_OK);
    assert_int_equal(sy.frees_with_id, 1);
    const char *id;
    size_t len;
    assert_int_equal(kvr_load_handle_id(kvr_router_load(a.r), res.handle, &id, &len),
                     KVR_ENOTFOUND);
    kvr_sched_unobserve(a.s, on_sync_event, &sy);
    unmake(&a);
    unmake(&b);
}

/* ---------------------------------------------------------------------------------------- */
/* Model test */

#define M_TICKETS 4096

typedef struct model {
    fx_t f;
    uint64_t rng, now;
    kvr_req_handle_t booked[256];
    size_t n_booked;
    kvr_ticket_t queued[128];
    outcome_t *qo[128];
    size_t n_queued;
    outcome_t outs[M_TICKETS];
    size_t n_outs;
    int failures;
} model_t;

static uint64_t rnd(model_t *m)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

#define CHECK(m, cond, ...)      \
    do {                         \
        if (!(cond)) {           \
            printf(__VA_ARGS__); \
            printf("\n");        \
            (m)->failures++;     \
        }                        \
    } while (0)

/* Collects outcomes that arrived since the last step: placed ones become bookings. */
static void collect(model_t *m)
{
    for (size_t i = 0; i < m->n_queued;) {
        outcome_t *o = m->qo[i];
        if (o->calls == 0) {
            i++;
            continue;
        }
        CHECK(m, o->calls == 1, "a ticket was answered %d times", o->calls);
        if (o->rc == KVR_OK && !o->expired && m->n_booked < 256)
            m->booked[m->n_booked++] = o->res.handle;
        else if (o->rc == KVR_OK && !o->expired)
            (void)kvr_sched_release(m->f.s, o->res.handle, m->now);
        m->queued[i] = m->queued[m->n_queued - 1];
        m->qo[i] = m->qo[--m->n_queued];
    }
}

static void step(model_t *m)
{
    fx_t *f = &m->f;
    unsigned op = (unsigned)(rnd(m) % 10);
    if (op < 4 && m->n_outs < M_TICKETS && m->n_queued < 128) {
        size_t n = 16 + (size_t)(rnd(m) % 1200);
        prompt(toks, (uint32_t)(rnd(m) % 8), n);
        outcome_t *o = &m->outs[m->n_outs++];
        *o = (outcome_t){.f = f};
        kvr_route_res_t res;
        kvr_ticket_t t;
        int rc = place(f, toks, n, o, &res, &t);
        if (rc == KVR_OK && t == 0 && m->n_booked < 256)
            m->booked[m->n_booked++] = res.handle;
        else if (rc == KVR_OK && t == 0)
            (void)kvr_sched_release(f->s, res.handle, m->now);
        else if (rc == KVR_OK) {
            m->queued[m->n_queued] = t;
            m->qo[m->n_queued++] = o;
        } else
            CHECK(m, rc == KVR_EQUEUEFULL, "place: %s", kvr_strerror(rc));
    } else if (op < 6 && m->n_booked > 0) {
        size_t i = (size_t)(rnd(m) % m->n_booked);
        CHECK(m, kvr_sched_first_token(f->s, m->booked[i], m->now) == KVR_OK, "first token");
    } else if (op < 8 && m->n_booked > 0) {
        size_t i = (size_t)(rnd(m) % m->n_booked);
        kvr_req_handle_t h = m->booked[i];
        m->booked[i] = m->booked[--m->n_booked];
        CHECK(m, kvr_sched_release(f->s, h, m->now) == KVR_OK, "release");
        CHECK(m, kvr_sched_release(f->s, h, m->now) == KVR_ENOTFOUND, "stale release");
    } else if (op < 9 && m->n_queued > 0) {
        size_t i = (size_t)(rnd(m) % m->n_queued);
        outcome_t *o = m->qo[i];
        if (o->calls == 0) {
            CHECK(m, kvr_sched_cancel(f->s, m->queued[i]), "cancel of a waiting ticket");
            m->queued[i] = m->queued[m->n_queued - 1];
            m->qo[i] = m->qo[--m->n_queued];
            o->calls = -1000; /* any callback now shows up as a count above -1000 */
        }
    } else {
        m->now += rnd(m) % 300;
        kvr_sched_tick(f->s, m->now);
    }
    collect(m);
}

static void check(model_t *m)
{
    char msg[200];
    CHECK(m, kvr_sched_verify(m->f.s, msg, sizeof msg) == KVR_OK, "verify: %s", msg);
    CHECK(m, live(&m->f) == m->n_booked, "router holds %llu bookings, the model %zu",
          (unsigned long long)live(&m->f), m->n_booked);
    CHECK(m, kvr_sched_queued(m->f.s) == m->n_queued, "queue holds %zu, the model %zu",
          kvr_sched_queued(m->f.s), m->n_queued);
    for (size_t i = 0; i < m->n_outs; i++)
        CHECK(m, m->outs[i].calls <= 1 && (m->outs[i].calls >= 0 || m->outs[i].calls == -1000),
              "ticket %zu answered after a cancel or twice (%d)", i, m->outs[i].calls);
    if (m->n_queued > 0) { /* work-conserving: something waits only while all are busy */
        prompt(toks, 99, 16);
        kvr_route_req_t q = {.tokens = toks, .n_tokens = 16};
        kvr_route_res_t res;
        int rc = kvr_router_route(m->f.r, &q, m->now, &res);
        CHECK(m, rc == KVR_EBUSY, "%zu wait while a worker is free (%s)", m->n_queued,
              kvr_strerror(rc));
    }
}

static int run_seed(unsigned long seed, int steps)
{
    model_t *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    m->now = 1000;
    make(&m->f, 3, true);
    for (int i = 0; i < steps && m->failures == 0; i++) {
        step(m);
        check(m);
        if (m->failures)
            printf("seed %lu: step %d\n", seed, i);
    }
    int failures = m->failures;
    if (getenv("KVR_SCHED_TRACE") != NULL) {
        kvr_sched_stats_t ss;
        kvr_sched_stats(m->f.s, &ss);
        printf("seed %lu: enqueued %llu dispatched %llu+%llu expired %llu cancelled %llu "
               "rejected %llu\n",
               seed, (unsigned long long)ss.queue.enqueued, (unsigned long long)ss.dispatched[0],
               (unsigned long long)ss.dispatched[1], (unsigned long long)ss.queue.expired,
               (unsigned long long)ss.queue.cancelled, (unsigned long long)ss.queue.rejected);
    }
    unmake(&m->f);
    free(m);
    return failures;
}

/* ---- an asynchronous overlap source (a remote indexer's contract) ---- */

typedef struct fake_src {
    int lookups;
    size_t n_hashed;
    kvr_overlap_done_fn done[8];
    void *ctx[8];
    int refuse; /* lookup returns this when non-zero */
} fake_src_t;

static int fake_lookup(void *arg, const kvr_route_req_t *q, kvr_overlap_done_fn done, void *ctx)
{
    fake_src_t *fs = arg;
    if (fs->refuse)
        return fs->refuse;
    assert_true(q->hashed);
    fs->n_hashed = q->n_hashed;
    fs->done[fs->lookups] = done;
    fs->ctx[fs->lookups++] = ctx;
    return KVR_OK;
}

/* With a source, a placement that may wait returns a ticket and is routed only when the source
 * answers, with its matches; a failed answer routes with zero overlap; a cancelled one is
 * dropped when the answer comes (never called back); a busy fleet queues the answered one;
 * a placement without a callback, or a refused lookup, routes at once. */
static void test_overlap_source(void **st)
{
    (void)st;
    fx_t f;
    make(&f, 3, true);
    fake_src_t fs = {0};
    kvr_overlap_source_t src = {fake_lookup, &fs};
    kvr_sched_set_overlap_source(f.s, &src);
    assert_true(kvr_sched_has_overlap_source(f.s));
    kvr_route_res_t res;
    kvr_ticket_t t;
    outcome_t o = {.f = &f};
    prompt(toks, 5, 64);
    assert_int_equal(place(&f, toks, 64, &o, &res, &t), KVR_OK);
    assert_true(t != 0);
    assert_int_equal(fs.lookups, 1);
    assert_int_equal(fs.n_hashed, 4);
    assert_int_equal(kvr_sched_awaiting(f.s), 1);
    assert_int_equal(o.calls, 0);
    assert_int_equal(live(&f), 0);
    /* worker 3 holds 3 of the 4 blocks: the decision follows the source */
    kvr_match_t m[2] = {{.worker = {3, 0}, .device_blocks = 3},
                        {.worker = {99, 0}, .device_blocks = 4}};
    fs.done[0](fs.ctx[0], KVR_OK, m, 2, 1001);
    assert_int_equal(o.calls, 1);
    assert_int_equal(o.rc, KVR_OK);
    assert_int_equal(o.res.worker.worker_id, 3);
    assert_int_equal(o.res.device_blocks, 3);
    assert_int_equal(kvr_sched_awaiting(f.s), 0);
    assert_int_equal(live(&f), 1);
    /* a failed lookup: zero overlap, still routed */
    outcome_t o2 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o2, &res, &t), KVR_OK);
    fs.done[1](fs.ctx[1], KVR_EIO, NULL, 0, 1002);
    assert_int_equal(o2.calls, 1);
    assert_int_equal(o2.rc, KVR_OK);
    assert_int_equal(o2.res.device_blocks, 0);
    /* cancelled while waiting: never called back, freed when the answer comes */
    outcome_t o3 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o3, &res, &t), KVR_OK);
    assert_true(kvr_sched_cancel(f.s, t));
    assert_false(kvr_sched_cancel(f.s, t));
    fs.done[2](fs.ctx[2], KVR_OK, m, 1, 1003);
    assert_int_equal(o3.calls, 0);
    assert_int_equal(kvr_sched_awaiting(f.s), 0);
    assert_int_equal(live(&f), 2);
    /* without a callback, or when the source refuses: routed at once (no index match) */
    assert_int_equal(place(&f, toks, 64, NULL, &res, &t), KVR_OK);
    assert_int_equal(t, 0);
    fs.refuse = KVR_ENOMEM;
    outcome_t o4 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o4, &res, &t), KVR_OK);
    assert_int_equal(t, 0);
    assert_int_equal(o4.calls, 0);
    fs.refuse = 0;
    assert_int_equal(live(&f), 4);
    /* busy everywhere: the answered request joins the queue, then goes on a load change */
    static uint32_t big[3][2048];
    kvr_route_res_t held[3];
    kvr_sched_set_overlap_source(f.s, NULL);
    for (int i = 0; i < 3; i++) {
        prompt(big[i], 10 + (uint32_t)i, 2048);
        assert_int_equal(place(&f, big[i], 2048, NULL, &held[i], &t), KVR_OK);
    }
    kvr_sched_set_overlap_source(f.s, &src);
    outcome_t o5 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o5, &res, &t), KVR_OK);
    fs.done[3](fs.ctx[3], KVR_OK, m, 1, 1004);
    assert_int_equal(o5.calls, 0);
    assert_int_equal(kvr_sched_queued(f.s), 1);
    assert_int_equal(kvr_sched_first_token(f.s, held[2].handle, 1005), KVR_OK);
    assert_int_equal(o5.calls, 1);
    assert_int_equal(o5.rc, KVR_OK);
    /* a request left waiting when the scheduler goes is freed with it (no callback) */
    outcome_t o6 = {.f = &f};
    assert_int_equal(place(&f, toks, 64, &o6, &res, &t), KVR_OK);
    assert_int_equal(kvr_sched_awaiting(f.s), 1);
    unmake(&f);
    assert_int_equal(o6.calls, 0);
}

static void test_model(void **st)
{
    (void)st;
    kvr_model_plan_t plan = {
        .seeds = 40, .seeds_asan = 8, .steps = 1500, .steps_one = 20000, .max_failures = 3};
    assert_int_equal(kvr_model_drive(&plan, run_seed), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle_by_handle),
        cmocka_unit_test(test_queue_dispatches_on_a_load_change),
        cmocka_unit_test(test_backlog_cancel_and_expiry),
        cmocka_unit_test(test_arrivals_do_not_overtake),
        cmocka_unit_test(test_start_up_wait),
        cmocka_unit_test(test_start_up_window),
        cmocka_unit_test(test_own_hashes_copied),
        cmocka_unit_test(test_copy_and_hashes_survive),
        cmocka_unit_test(test_reentrant_release),
        cmocka_unit_test(test_observers_and_peer_events),
        cmocka_unit_test(test_peer_admits),
        cmocka_unit_test(test_overlap_source),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_fleet.c: the fleet (fleet/fleet.h) over a real router and scheduler, its workers'
 * /health and /metrics served by a real HTTP server (libevent) on a loopback port in the same
 * loop:
 *   - membership: an added worker is in the router and probed; a removal takes it out of both
 *     and tells every observer once, in order; an unknown id is KVR_ENOWORKER and tells none;
 *     a refused registration leaves nothing behind; kvr_fleet_verify holds after each step;
 *   - health: health_failures failed probes in a row fence a worker (never picked), a 200
 *     readmits it; a suspicion fences after one failed probe, without waiting for the others;
 *     an explicit fence is undone by the next healthy probe;
 *   - capacity: a worker registered without its KV-cache size learns it from its /metrics
 *     (vLLM's cache_config_info), counted as learnt; one whose /metrics lacks it is counted
 *     as not exposed, and the fleet stops asking after three tries;
 *   - what the API shows: the index state by mode, the index origin, the wait messages.
 * Every wait polls an observable condition under a bound (no fixed sleeps).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "fleet/fleet.h"

/* ---- a worker: /health answers health_code, /metrics answers metrics -------------------- */

typedef struct worker_srv {
    struct evhttp *http;
    uint16_t port;
    int health_code;
    const char *metrics;
    unsigned health_calls, metrics_calls;
} worker_srv_t;

static void on_worker(struct evhttp_request *req, void *arg)
{
    worker_srv_t *w = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    struct evbuffer *out = evbuffer_new();
    if (strcmp(path, "/health") == 0) {
        w->health_calls++;
        evhttp_send_reply(req, w->health_code, NULL, out);
    } else if (strcmp(path, "/metrics") == 0) {
        w->metrics_calls++;
        evbuffer_add_printf(out, "%s", w->metrics);
        evhttp_send_reply(req, 200, NULL, out);
    } else {
        evhttp_send_reply(req, 404, NULL, out);
    }
    evbuffer_free(out);
}

static void worker_start(struct event_base *base, worker_srv_t *w)
{
    w->http = evhttp_new(base);
    assert_non_null(w->http);
    evhttp_set_gencb(w->http, on_worker, w);
    struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(w->http, "127.0.0.1", 0);
    assert_non_null(s);
    struct sockaddr_storage ss;
    ev_socklen_t len = sizeof ss;
    assert_int_equal(getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&ss, &len), 0);
    w->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (w->health_code == 0)
        w->health_code = 200;
}

/* ---- the fixture -------------------------------------------------------------------------- */

typedef struct fx {
    struct event_base *base;
    kvr_index_t *ix;
    kvr_router_t *r;
    kvr_sched_t *s;
    kvr_fleet_t *f;
    kvr_router_config_t cfg;
    worker_srv_t w;
    uint64_t removed[8];
    int n_removed, order[8], n_order, n_added;
    uint64_t added_last;
} fx_t;

static void set(fx_t *f, const char *k, const char *v)
{
    char err[200];
    if (kvr_config_set(&f->cfg, k, v, err, sizeof err) != KVR_OK)
        fail_msg("%s=%s: %s", k, v, err);
}

static void make(fx_t *f, const char *health_failures)
{
    memset(f, 0, sizeof *f);
    kvr_config_defaults(&f->cfg);
    set(f, "health_interval_ms", "50");
    set(f, "health_failures", health_failures);
    f->base = event_base_new();
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    int st;
    char err[200];
    f->ix = kvr_index_new(&ic, &st);
    assert_non_null(f->ix);
    f->r = kvr_router_new(&f->cfg, f->ix, &st, err, sizeof err);
    assert_non_null(f->r);
    kvr_sched_config_t sc;
    kvr_sched_config_from(&sc, &f->cfg);
    const char *field;
    f->s = kvr_sched_new(f->r, &sc, &st, &field);
    assert_non_null(f->s);
    f->f = kvr_fleet_new(f->base, f->s, NULL, &f->cfg, &st, err, sizeof err);
    assert_non_null(f->f);
    worker_start(f->base, &f->w);
}

static void destroy(fx_t *f)
{
    kvr_fleet_free(f->f);
    evhttp_free(f->w.http);
    kvr_sched_free(f->s);
    kvr_router_free(f->r);
    kvr_index_free(f->ix);
    event_base_free(f->base);
}

static void check(fx_t *f)
{
    char msg[200] = "";
    if (kvr_fleet_verify(f->f, msg, sizeof msg) != KVR_OK)
        fail_msg("kvr_fleet_verify: %s", msg);
}

static int add(fx_t *f, uint64_t id, const char *extra)
{
    char text[256], err[200];
    snprintf(text, sizeof text, "id=%llu,url=http://127.0.0.1:%u%s", (unsigned long long)id,
             f->w.port, extra);
    kvr_worker_spec_t w;
    assert_int_equal(kvr_worker_spec_parse(text, &w, err, sizeof err), KVR_OK);
    int rc = kvr_fleet_add_worker(f->f, &w, err, sizeof err);
    check(f);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs the loop until cond(f, arg) holds; fails after 10 s. */
static void run_until(fx_t *f, bool (*cond)(fx_t *, uint64_t), uint64_t arg, const char *what)
{
    double t0 = now_s();
    while (!cond(f, arg)) {
        if (now_s() - t0 > 10.0)
            fail_msg("waited 10 s for: %s", what);
        event_base_loop(f->base, EVLOOP_ONCE);
    }
}

static bool is_fenced(fx_t *f, uint64_t id) { return kvr_router_fenced(f->r, id); }
static bool not_fenced(fx_t *f, uint64_t id) { return !kvr_router_fenced(f->r, id); }
static bool health_calls_at_least(fx_t *f, uint64_t n) { return f->w.health_calls >= n; }

static void on_removed_a(void *arg, uint64_t id)
{
    fx_t *f = arg;
    f->removed[f->n_removed++] = id;
    f->order[f->n_order++] = 1;
}

static void on_removed_b(void *arg, uint64_t id)
{
    fx_t *f = (fx_t *)((char *)arg - offsetof(fx_t, order));
    (void)id;
    f->order[f->n_order++] = 2;
}

static void on_added(void *arg, const kvr_worker_spec_t *w)
{
    fx_t *f = arg;
    assert_non_null(kvr_router_worker(f->r, w->worker_id)); /* told after, not before */
    f->n_added++;
    f->added_last = w->worker_id;
}

/* ---- membership -------------------------------------------------------------------------- */

static void test_membership(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "3");
    kvr_fleet_observer_t oa = {.added = on_added, .removed = on_removed_a, .arg = &f};
    kvr_fleet_observer_t ob = {.removed = on_removed_b, .arg = &f.order};
    assert_int_equal(kvr_fleet_observe(f.f, &oa), KVR_OK);
    assert_int_equal(kvr_fleet_observe(f.f, &ob), KVR_OK);
    assert_int_equal(add(&f, 1, ""), KVR_OK);
    assert_int_equal(add(&f, 2, ""), KVR_OK);
    assert_non_null(kvr_router_worker(f.r, 1));
    assert_int_equal(f.n_added, 2);
    assert_int_equal(f.added_last, 2);
    assert_int_equal(add(&f, 1, ""), KVR_EEXIST); /* refused: nothing changes, nobody told */
    assert_int_equal(f.n_added, 2);
    run_until(&f, health_calls_at_least, 2, "both workers probed");

    assert_int_equal(kvr_fleet_remove_worker(f.f, 1), KVR_OK);
    check(&f);
    assert_null(kvr_router_worker(f.r, 1));
    assert_int_equal(f.n_removed, 1);
    assert_int_equal(f.removed[0], 1);
    assert_int_equal(f.n_order, 2);
    assert_int_equal(f.order[0], 1); /* in the order they observed */
    assert_int_equal(f.order[1], 2);

    assert_int_equal(kvr_fleet_remove_worker(f.f, 1), KVR_ENOWORKER);
    assert_int_equal(kvr_fleet_remove_worker(f.f, 77), KVR_ENOWORKER);
    assert_int_equal(f.n_removed, 1); /* told of nothing */

    kvr_fleet_unobserve(f.f, &f);
    assert_int_equal(kvr_fleet_remove_worker(f.f, 2), KVR_OK);
    assert_int_equal(f.n_removed, 1);
    assert_int_equal(f.n_order, 3);
    check(&f);
    destroy(&f);
}

static void test_observers_bounded(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "3");
    for (int i = 0; i < KVR_FLEET_MAX_OBSERVERS; i++) {
        kvr_fleet_observer_t o = {.removed = on_removed_b, .arg = (char *)&f + i};
        assert_int_equal(kvr_fleet_observe(f.f, &o), KVR_OK);
    }
    kvr_fleet_observer_t o = {.removed = on_removed_b, .arg = &f.w};
    assert_int_equal(kvr_fleet_observe(f.f, &o), KVR_EFULL);
    destroy(&f);
}

/* ---- health ------------------------------------------------------------------------------ */

static void test_fence_and_readmit(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "3");
    assert_int_equal(add(&f, 5, ""), KVR_OK);
    run_until(&f, health_calls_at_least, 1, "a first probe");
    assert_false(kvr_router_fenced(f.r, 5));
    f.w.health_code = 503;
    unsigned before = f.w.health_calls;
    run_until(&f, is_fenced, 5, "fenced after failed probes");
    assert_true(f.w.health_calls - before >= 3); /* health_failures of them */
    assert_int_equal(kvr_router_n_ready(f.r), 0);
    f.w.health_code = 200;
    run_until(&f, not_fenced, 5, "readmitted by a healthy probe");
    assert_int_equal(kvr_router_n_ready(f.r), 1);
    check(&f);

    kvr_fleet_fence(f.f, 5, "told so by a test");
    assert_true(kvr_router_fenced(f.r, 5));
    run_until(&f, not_fenced, 5, "readmitted after an explicit fence");
    kvr_fleet_fence(f.f, 99, "unknown"); /* ignored */
    destroy(&f);
}

static void test_suspect_fences_at_once(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "1000"); /* periodic probes alone would take 50 s */
    assert_int_equal(add(&f, 3, ""), KVR_OK); /* not probed before the loop's tick */
    f.w.health_code = 500;
    kvr_fleet_suspect(f.f, 3, "a request could not connect"); /* probes it now */
    run_until(&f, is_fenced, 3, "fenced on suspicion");
    assert_true(f.w.health_calls <= 2);
    f.w.health_code = 200;
    run_until(&f, not_fenced, 3, "readmitted");
    destroy(&f);
}

/* ---- capacity from /metrics --------------------------------------------------------------- */

static bool fetches_at_least(fx_t *f, uint64_t n)
{
    uint64_t c[3];
    kvr_fleet_capacity_fetches(f->f, c);
    return c[0] + c[1] + c[2] >= n;
}

static void test_capacity_learnt(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "3");
    f.w.metrics = "vllm:cache_config_info{block_size=\"16\",engine=\"0\","
                  "num_gpu_blocks=\"27000\"} 1.0\n";
    assert_int_equal(add(&f, 4, ""), KVR_OK); /* no num_blocks */
    run_until(&f, fetches_at_least, 1, "a capacity fetch");
    uint64_t c[3];
    kvr_fleet_capacity_fetches(f.f, c);
    assert_int_equal(c[0], 1);
    uint32_t bs = f.cfg.block_size;
    assert_int_equal(kvr_router_worker(f.r, 4)->total_kv_blocks, 27000u * 16u / bs);
    destroy(&f);
}

static void test_capacity_not_exposed_gives_up(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "3");
    f.w.metrics = "vllm:num_requests_running{engine=\"0\"} 2.0\n";
    assert_int_equal(add(&f, 6, ""), KVR_OK);
    run_until(&f, fetches_at_least, 3, "three capacity fetches");
    unsigned calls = f.w.metrics_calls;
    run_until(&f, health_calls_at_least, f.w.health_calls + 4, "more healthy probes");
    assert_int_equal(f.w.metrics_calls, calls); /* it stopped asking */
    uint64_t c[3];
    kvr_fleet_capacity_fetches(f.f, c);
    assert_int_equal(c[1], 3);
    assert_int_equal(kvr_router_worker(f.r, 6)->total_kv_blocks, 0);
    destroy(&f);
}

/* ---- what the API shows ------------------------------------------------------------------- */

static void test_shown_states(void **state)
{
    (void)state;
    fx_t f;
    make(&f, "3");
    assert_int_equal(add(&f, 8, ",num_blocks=100"), KVR_OK);
    const kvr_worker_spec_t *sp = kvr_router_worker(f.r, 8);
    kvr_rank_status_t st = {0};
    /* no ingest thread, kv mode: a worker without an events endpoint */
    assert_string_equal(kvr_fleet_index_state(f.f, sp, &st), "no_events");
    assert_string_equal(kvr_fleet_index_origin(f.f), "");
    kvr_fleet_set_index_origin(f.f, "cold: only events received since start");
    assert_string_equal(kvr_fleet_index_origin(f.f), "cold: only events received since start");
    char msg[300];
    assert_int_equal(kvr_fleet_wait_failed(f.r, KVR_EBUSY, msg, sizeof msg), 429);
    assert_non_null(strstr(msg, "router_queue_timeout_ms"));
    assert_int_equal(kvr_fleet_wait_failed(f.r, KVR_ENOWORKER, msg, sizeof msg), 503);
    assert_non_null(strstr(msg, "min_initial_workers"));
    destroy(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_membership),
        cmocka_unit_test(test_observers_bounded),
        cmocka_unit_test(test_fence_and_readmit),
        cmocka_unit_test(test_suspect_fences_at_once),
        cmocka_unit_test(test_capacity_learnt),
        cmocka_unit_test(test_capacity_not_exposed_gives_up),
        cmocka_unit_test(test_shown_states),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_host.c: the HTTP host (http/host.h) and the reply family (http/reply.h), over real
 * loopback connections (a libevent client in the same loop):
 *   - dispatch: services are asked in the order added, the first to answer wins, a removed
 *     one is asked no more, and nobody's path is a 404 naming the method and path;
 *   - access: with an api key, a request without it is a 401 with the Bearer challenge in
 *     OpenAI's shape, counted; with it, the service answers;
 *   - what the host gathers: every reply >= 400 through the shared context is counted in
 *     kvr_http_errors_total, services' families follow in order, details and readiness are
 *     asked of each service;
 *   - the reply styles: the router API's and OpenAI's error bodies, the counts by class;
 *   - kvr_http_host_verify holds throughout; the services table is bounded.
 * Every wait polls an observable condition under a bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "http/host.h"
#include "wire/prom.h"

typedef struct answer {
    bool done;
    int code;
    char body[2048];
    char challenge[64];
} answer_t;

typedef struct fx {
    struct event_base *base;
    kvr_http_host_t *h;
    kvr_router_config_t cfg;
    char log[4][16]; /* which service was asked, in order */
    int n_log;
    bool b_ready;
} fx_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_answer(struct evhttp_request *req, void *arg)
{
    answer_t *a = arg;
    a->done = true;
    if (req == NULL)
        return;
    a->code = evhttp_request_get_response_code(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    if (n >= sizeof a->body)
        n = sizeof a->body - 1;
    evbuffer_remove(in, a->body, n);
    a->body[n] = '\0';
    const char *c = evhttp_find_header(evhttp_request_get_input_headers(req), "WWW-Authenticate");
    snprintf(a->challenge, sizeof a->challenge, "%s", c ? c : "");
}

/* One request to the host's client port; the loop runs until its answer (10 s at most). */
static void call(fx_t *f, enum evhttp_cmd_type m, const char *path, const char *auth, answer_t *a)
{
    memset(a, 0, sizeof *a);
    struct evhttp_connection *c =
        evhttp_connection_base_new(f->base, NULL, "127.0.0.1", kvr_http_host_port(f->h));
    assert_non_null(c);
    struct evhttp_request *req = evhttp_request_new(on_answer, a);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", "127.0.0.1");
    if (auth != NULL)
        evhttp_add_header(evhttp_request_get_output_headers(req), "Authorization", auth);
    assert_int_equal(evhttp_make_request(c, req, m, path), 0);
    double t0 = now_s();
    while (!a->done) {
        if (now_s() - t0 > 10.0)
            fail_msg("no answer to %s in 10 s", path);
        event_base_loop(f->base, EVLOOP_ONCE);
    }
    evhttp_connection_free(c);
}

static void note(fx_t *f, const char *who)
{
    if (f->n_log < 4)
        snprintf(f->log[f->n_log++], sizeof f->log[0], "%s", who);
}

/* A answers /a; B answers /a and /b. */
static fx_t *the_fx;

static bool svc_a(void *arg, struct evhttp_request *req, const char *path, bool get, bool post)
{
    fx_t *f = arg;
    note(f, "a");
    if (strcmp(path, "/a") != 0)
        return false;
    kvr_reply_body(kvr_http_host_reply(f->h), req, 200, "text/plain", "from a", 6);
    return true;
}

static bool svc_b(void *arg, struct evhttp_request *req, const char *path, bool get, bool post)
{
    fx_t *f = the_fx;
    (void)arg;
    note(f, "b");
    if (strcmp(path, "/a") != 0 && strcmp(path, "/b") != 0)
        return false;
    kvr_reply_error(kvr_http_host_reply(f->h), req, 409, "conflict_error", "b says %s", path);
    return true;
}

static void metrics_a(void *arg, struct kvr_prom *p)
{
    (void)arg;
    kvr_prom_counter(p, "test_a_total", "A's.", 1);
}

static void metrics_b(void *arg, struct kvr_prom *p)
{
    (void)arg;
    kvr_prom_counter(p, "test_b_total", "B's.", 2);
}

static bool detail_b(void *arg, const char **k, const char **v)
{
    (void)arg;
    *k = "b_state";
    *v = "fine";
    return true;
}

static bool ready_b(void *arg, const char **why)
{
    (void)arg;
    *why = "b is warming up";
    return the_fx->b_ready;
}

static void make(fx_t *f, const char *key_file)
{
    memset(f, 0, sizeof *f);
    the_fx = f;
    kvr_config_defaults(&f->cfg);
    char err[300];
    assert_int_equal(kvr_config_set(&f->cfg, "http_port", "0", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_set(&f->cfg, "bind", "127.0.0.1", err, sizeof err), KVR_OK);
    if (key_file != NULL)
        assert_int_equal(kvr_config_set(&f->cfg, "api_key_file", key_file, err, sizeof err),
                         KVR_OK);
    f->base = event_base_new();
    int st;
    f->h = kvr_http_host_new(f->base, &f->cfg, &st, err, sizeof err);
    if (f->h == NULL)
        fail_msg("host: %s", err);
    assert_true(kvr_http_host_port(f->h) != 0);
    assert_int_equal(kvr_http_host_admin_port(f->h), 0);
    kvr_http_service_t a = {.handle = svc_a, .metrics = metrics_a, .arg = f};
    kvr_http_service_t b = {.handle = svc_b, .metrics = metrics_b, .detail = detail_b,
                            .ready = ready_b, .arg = &f->log};
    assert_int_equal(kvr_http_host_add_service(f->h, &a), KVR_OK);
    assert_int_equal(kvr_http_host_add_service(f->h, &b), KVR_OK);
    char msg[200] = "";
    if (kvr_http_host_verify(f->h, msg, sizeof msg) != KVR_OK)
        fail_msg("verify: %s", msg);
}

static void destroy(fx_t *f)
{
    kvr_http_host_free(f->h);
    event_base_free(f->base);
}

static void test_dispatch_in_order(void **state)
{
    (void)state;
    fx_t f;
    make(&f, NULL);
    answer_t a;
    call(&f, EVHTTP_REQ_GET, "/a", NULL, &a);
    assert_int_equal(a.code, 200);
    assert_string_equal(a.body, "from a");
    assert_int_equal(f.n_log, 1); /* B never asked */

    f.n_log = 0;
    call(&f, EVHTTP_REQ_POST, "/b", NULL, &a);
    assert_int_equal(a.code, 409);
    assert_non_null(strstr(a.body, "\"message\":\"b says /b\""));
    assert_non_null(strstr(a.body, "\"type\":\"conflict_error\""));
    assert_int_equal(f.n_log, 2);
    assert_string_equal(f.log[0], "a");
    assert_string_equal(f.log[1], "b");

    call(&f, EVHTTP_REQ_DELETE, "/nowhere", NULL, &a);
    assert_int_equal(a.code, 404);
    assert_non_null(strstr(a.body, "no endpoint DELETE /nowhere"));

    kvr_http_host_remove_service(f.h, &f); /* A */
    f.n_log = 0;
    call(&f, EVHTTP_REQ_GET, "/a", NULL, &a);
    assert_int_equal(a.code, 409); /* B's now */
    assert_int_equal(f.n_log, 1);
    destroy(&f);
}

static void test_gathers_metrics_details_ready(void **state)
{
    (void)state;
    fx_t f;
    make(&f, NULL);
    answer_t a;
    call(&f, EVHTTP_REQ_GET, "/b", NULL, &a);   /* 409 */
    call(&f, EVHTTP_REQ_GET, "/zzz", NULL, &a); /* 404 */
    call(&f, EVHTTP_REQ_GET, "/a", NULL, &a);   /* 200 */
    kvr_prom_t p;
    kvr_prom_init(&p);
    kvr_http_host_metrics(f.h, &p);
    kvr_http_host_services_metrics(f.h, &p);
    assert_non_null(strstr(p.buf, "kvr_http_errors_total 2\n"));
    assert_non_null(strstr(p.buf, "kvr_http_unauthorized_total 0\n"));
    const char *ta = strstr(p.buf, "test_a_total 1"), *tb = strstr(p.buf, "test_b_total 2");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_true(ta < tb); /* in the order added */
    kvr_prom_deinit(&p);

    const char *why = NULL;
    assert_false(kvr_http_host_ready(f.h, &why));
    assert_string_equal(why, "b is warming up");
    f.b_ready = true;
    assert_true(kvr_http_host_ready(f.h, &why));
    destroy(&f);
}

static void count_detail(void *arg, const char *k, const char *v)
{
    int *n = arg;
    assert_string_equal(k, "b_state");
    assert_string_equal(v, "fine");
    (*n)++;
}

static void test_details(void **state)
{
    (void)state;
    fx_t f;
    make(&f, NULL);
    int n = 0;
    kvr_http_host_details(f.h, count_detail, &n);
    assert_int_equal(n, 1);
    destroy(&f);
}

static void test_access_key(void **state)
{
    (void)state;
    char path[] = "/tmp/kvr_test_host_keyXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "sekrit\n", 7), 7);
    close(fd);
    fx_t f;
    make(&f, path);
    answer_t a;
    call(&f, EVHTTP_REQ_GET, "/a", NULL, &a);
    assert_int_equal(a.code, 401);
    assert_string_equal(a.challenge, "Bearer");
    assert_non_null(strstr(a.body, "invalid_api_key"));
    assert_int_equal(f.n_log, 0); /* no service was asked */
    call(&f, EVHTTP_REQ_GET, "/a", "Bearer wrong", &a);
    assert_int_equal(a.code, 401);
    call(&f, EVHTTP_REQ_GET, "/a", "Bearer sekrit", &a);
    assert_int_equal(a.code, 200);
    kvr_prom_t p;
    kvr_prom_init(&p);
    kvr_http_host_metrics(f.h, &p);
    assert_non_null(strstr(p.buf, "kvr_http_unauthorized_total 2\n"));
    kvr_prom_deinit(&p);
    destroy(&f);
    unlink(path);
}

static void test_services_bounded(void **state)
{
    (void)state;
    fx_t f;
    make(&f, NULL);
    static char args[KVR_HTTP_MAX_SERVICES];
    for (int i = 2; i < KVR_HTTP_MAX_SERVICES; i++) {
        kvr_http_service_t s = {.arg = &args[i]};
        assert_int_equal(kvr_http_host_add_service(f.h, &s), KVR_OK);
    }
    kvr_http_service_t s = {.arg = &args[0]};
    assert_int_equal(kvr_http_host_add_service(f.h, &s), KVR_EFULL);
    answer_t a;
    call(&f, EVHTTP_REQ_GET, "/nothing", NULL, &a); /* services without handle are skipped */
    assert_int_equal(a.code, 404);
    destroy(&f);
}

/* The styles, on a request answered through a second context. */
static void test_reply_styles(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_writer_reset(&w);
    kvr_reply_api.error(&w, "bad thing", "invalid_request_error", 400);
    const char *out;
    size_t len;
    assert_int_equal(kvr_json_writer_finish(&w, &out, &len), KVR_OK);
    assert_string_equal(out, "{\"error\":{\"message\":\"bad thing\",\"type\":"
                             "\"invalid_request_error\",\"code\":400}}");
    kvr_json_writer_reset(&w);
    kvr_reply_openai.error(&w, "bad thing", NULL, 400);
    assert_int_equal(kvr_json_writer_finish(&w, &out, &len), KVR_OK);
    assert_non_null(strstr(out, "\"param\":null"));
    assert_non_null(strstr(out, "\"message\":\"bad thing\""));
    kvr_json_writer_deinit(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch_in_order),
        cmocka_unit_test(test_gathers_metrics_details_ready),
        cmocka_unit_test(test_details),
        cmocka_unit_test(test_access_key),
        cmocka_unit_test(test_services_bounded),
        cmocka_unit_test(test_reply_styles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * host.c: see host.h.
 * Invariants: every request is answered once: by the access check, by one service, or by the
 * 404; n_guards <= 2; services[0..n_services) are distinct by arg.
 * Threads: the loop's thread. Cost: no allocation per request.
 */
#include "http/host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/http.h>

#include <assert.h>

#include "base/verify.h"
#include "kvrouter.h"
#include "http/access.h"
#include "http/http_guard.h"
#include "wire/openai.h"
#include "wire/prom.h"

struct kvr_http_host {
    struct event_base *base;
    struct evhttp *http, *admin_http; /* the client port; the admin listener (or NULL) */
    kvr_http_guard_t *guards[2];      /* their connection limits: client, admin */
    size_t n_guards;
    uint16_t port, admin_port;
    kvr_access_t access;
    kvr_router_config_t cfg;
    uint64_t requests, unauthorized; /* all; answered 401 */
    kvr_json_writer_t w;
    kvr_reply_t reply;
    kvr_http_service_t services[KVR_HTTP_MAX_SERVICES];
    size_t n_services;
};

/* Whether req is a browser opening a page (Sec-Fetch-Mode: navigate) or a client that says
 * nothing of it (curl, an old browser); not a page's own fetch(), which must get a plain 401
 * (challenged, a browser holds the fetch while it asks for credentials). */
static bool navigation(struct evhttp_request *req)
{
    const char *m = evhttp_find_header(evhttp_request_get_input_headers(req), "Sec-Fetch-Mode");
    return m == NULL || strcmp(m, "navigate") == 0;
}

/* 401 in OpenAI's shape (code "invalid_api_key") with the Bearer challenge, and for read calls
 * opened as a page the Basic one too: a browser opening /ui then asks for the key (as the
 * password) and sends it again with the page's own requests. */
static void reply_unauthorized(kvr_http_host_t *h, struct evhttp_request *req,
                               kvr_access_class_t cls, const char *msg)
{
    h->unauthorized++;
    kvr_json_writer_reset(&h->w);
    (void)kvr_oai_encode_auth_error(&h->w, msg);
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    evhttp_add_header(out, "WWW-Authenticate", "Bearer");
    if (cls == KVR_ACCESS_READ && navigation(req))
        evhttp_add_header(out, "WWW-Authenticate", "Basic realm=\"kvrouter\", charset=\"UTF-8\"");
    kvr_reply_writer(&h->reply, req, 401);
}

static void serve(kvr_http_host_t *h, struct evhttp_request *req, bool on_admin)
{
    h->requests++;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    const char *uri = evhttp_request_get_uri(req);
    const struct evhttp_uri *parsed = evhttp_request_get_evhttp_uri(req);
    const char *path = parsed ? evhttp_uri_get_path(parsed) : uri;
    if (path == NULL)
        path = "/";
    bool get = m == EVHTTP_REQ_GET, post = m == EVHTTP_REQ_POST, del = m == EVHTTP_REQ_DELETE;
    char why[200];
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    kvr_access_class_t cls = kvr_access_class(path, get, post, del);
    int verdict = kvr_access_check(&h->access, cls, on_admin, auth, why, sizeof why);
    if (verdict == 401) {
        reply_unauthorized(h, req, cls, why);
        return;
    }
    if (verdict != 0) {
        kvr_reply_error(&h->reply, req, verdict, "not_found_error", "%s", why);
        return;
    }
    for (size_t i = 0; i < h->n_services; i++)
        if (h->services[i].handle != NULL &&
            h->services[i].handle(h->services[i].arg, req, path, get, post))
            return;
    kvr_reply_error(&h->reply, req, 404, "not_found_error", "no endpoint %s %s",
                    get    ? "GET"
                    : post ? "POST"
                    : del  ? "DELETE"
                           : "?",
                    path);
}

static void on_request(struct evhttp_request *req, void *arg) { serve(arg, req, false); }
static void on_admin_request(struct evhttp_request *req, void *arg) { serve(arg, req, true); }

/* One listener: an evhttp under a guard (http_guard.h) listening on host:port. */
static int open_listener(kvr_http_host_t *h, const char *name, const char *host, uint16_t port,
                         kvr_http_handler_fn fn, struct evhttp **http, uint16_t *bound)
{
    const kvr_router_config_t *c = &h->cfg;
    kvr_http_limits_t lim = {.max_connections = c->http_max_connections,
                             .max_header_bytes = c->http_max_header_bytes,
                             .max_body_bytes = c->http_max_body_bytes,
                             .header_timeout_ms = c->http_header_timeout_ms,
                             .body_timeout_ms = c->http_body_timeout_ms,
                             .idle_timeout_ms = c->http_idle_timeout_ms};
    *http = evhttp_new(h->base);
    if (*http == NULL)
        return KVR_ENOMEM;
    evhttp_set_allowed_methods(*http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE);
    kvr_http_guard_t *g = kvr_http_guard_new(h->base, *http, name, &lim, fn, h);
    if (g == NULL)
        return KVR_ENOMEM;
    h->guards[h->n_guards++] = g;
    return kvr_http_guard_listen(g, host, port, bound);
}

static int open_listeners(kvr_http_host_t *h, char *err, size_t err_len)
{
    const kvr_router_config_t *cfg = &h->cfg;
    /* evhttp's header parsing is quadratic in the header's size (a 40 MB header held the HTTP
     * thread for 7 s): the guard refuses a head at http_max_header_bytes */
    int rc = open_listener(h, "client", cfg->bind, (uint16_t)cfg->http_port, on_request,
                           &h->http, &h->port);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "http_port: cannot listen on %s:%u (in use, or a bad address)",
                 cfg->bind, cfg->http_port);
        return rc;
    }
    if (!cfg->admin_port.set)
        return KVR_OK;
    rc = open_listener(h, "admin", cfg->admin_bind, (uint16_t)cfg->admin_port.v,
                       on_admin_request, &h->admin_http, &h->admin_port);
    if (rc != KVR_OK)
        snprintf(err, err_len, "admin_port: cannot listen on %s:%u (in use, or a bad address)",
                 cfg->admin_bind, (unsigned)cfg->admin_port.v);
    return rc;
}

kvr_http_host_t *kvr_http_host_new(struct event_base *base, const kvr_router_config_t *cfg,
                                   int *status, char *err, size_t err_len)
{
    kvr_http_host_t *h = calloc(1, sizeof *h);
    if (h == NULL) {
        snprintf(err, err_len, "out of memory");
        *status = KVR_ENOMEM;
        return NULL;
    }
    h->base = base;
    h->cfg = *cfg;
    kvr_json_writer_init(&h->w);
    int rc = kvr_reply_init(&h->reply, &h->w, &kvr_reply_api);
    if (rc != KVR_OK)
        snprintf(err, err_len, "out of memory");
    if (rc == KVR_OK)
        rc = kvr_access_init(&h->access, cfg, err, err_len);
    if (rc == KVR_OK) {
        rc = open_listeners(h, err, err_len);
        if (rc != KVR_OK && rc != KVR_ENOMEM)
            rc = KVR_EIO;
    }
    if (rc != KVR_OK) {
        kvr_http_host_free(h);
        *status = rc;
        return NULL;
    }
    *status = KVR_OK;
    return h;
}

void kvr_http_host_free(kvr_http_host_t *h)
{
    if (h == NULL)
        return;
    if (h->http)
        evhttp_free(h->http); /* its connections' filters still use their guard */
    if (h->admin_http)
        evhttp_free(h->admin_http);
    for (size_t i = 0; i < h->n_guards; i++)
        kvr_http_guard_free(h->guards[i]);
    kvr_reply_deinit(&h->reply);
    kvr_json_writer_deinit(&h->w);
    free(h);
}

uint16_t kvr_http_host_port(const kvr_http_host_t *h) { return h->port; }
uint16_t kvr_http_host_admin_port(const kvr_http_host_t *h) { return h->admin_port; }

void kvr_http_host_drain(kvr_http_host_t *h)
{
    for (size_t i = 0; i < h->n_guards; i++)
        kvr_http_guard_drain(h->guards[i]);
}

uint64_t kvr_http_host_busy(const kvr_http_host_t *h)
{
    uint64_t n = 0;
    for (size_t i = 0; i < h->n_guards; i++)
        n += kvr_http_guard_busy(h->guards[i]);
    return n;
}

int kvr_http_host_add_service(kvr_http_host_t *h, const kvr_http_service_t *svc)
{
    if (h->n_services == KVR_HTTP_MAX_SERVICES)
        return KVR_EFULL;
    h->services[h->n_services++] = *svc;
    assert(kvr_http_host_verify(h, NULL, 0) == KVR_OK);
    return KVR_OK;
}

int kvr_http_host_verify(const kvr_http_host_t *h, char *msg, size_t msg_len)
{
    if (h->n_guards > 2 || h->n_services > KVR_HTTP_MAX_SERVICES)
        KVR_VERIFY_FAIL("%zu listeners, %zu services", h->n_guards, h->n_services);
    if ((h->http != NULL) + (h->admin_http != NULL) != (int)h->n_guards)
        KVR_VERIFY_FAIL("%zu guards for %d listeners", h->n_guards,
                        (h->http != NULL) + (h->admin_http != NULL));
    for (size_t i = 0; i < h->n_services; i++)
        for (size_t j = 0; j < i; j++)
            if (h->services[i].arg == h->services[j].arg)
                KVR_VERIFY_FAIL("services %zu and %zu share their arg", j, i);
    for (size_t i = 0; i < h->n_guards; i++)
        if (kvr_http_guard_verify(h->guards[i]) != KVR_OK)
            KVR_VERIFY_FAIL("the %s listener's guard", i == 0 ? "client" : "admin");
    return KVR_OK;
}

void kvr_http_host_remove_service(kvr_http_host_t *h, void *arg)
{
    for (size_t i = 0; i < h->n_services; i++)
        if (h->services[i].arg == arg) {
            memmove(&h->services[i], &h->services[i + 1],
                    (h->n_services - i - 1) * sizeof h->services[0]);
            h->n_services--;
            return;
        }
}

kvr_reply_t *kvr_http_host_reply(kvr_http_host_t *h) { return &h->reply; }

void kvr_http_host_metrics(kvr_http_host_t *h, struct kvr_prom *p)
{
    kvr_prom_counter(p, "kvr_http_errors_total", "HTTP replies with status >= 400.",
                     (double)kvr_reply_errors(&h->reply));
    kvr_prom_counter(
        p, "kvr_http_unauthorized_total",
        "Requests answered 401: API key missing or wrong (api_key_file, admin_key_file).",
        (double)h->unauthorized);
    kvr_http_guard_metrics_all(h->guards, h->n_guards, p);
}

void kvr_http_host_services_metrics(kvr_http_host_t *h, struct kvr_prom *p)
{
    for (size_t i = 0; i < h->n_services; i++)
        if (h->services[i].metrics != NULL)
            h->services[i].metrics(h->services[i].arg, p);
}

void kvr_http_host_exposition(kvr_http_host_t *h, struct kvr_prom *p)
{
    kvr_http_host_metrics(h, p);
    kvr_http_host_services_metrics(h, p);
}

void kvr_http_host_details(const kvr_http_host_t *h,
                           void (*fn)(void *arg, const char *key, const char *value), void *arg)
{
    const char *k, *v;
    for (size_t i = 0; i < h->n_services; i++)
        if (h->services[i].detail != NULL && h->services[i].detail(h->services[i].arg, &k, &v))
            fn(arg, k, v);
}

bool kvr_http_host_ready(const kvr_http_host_t *h, const char **why)
{
    for (size_t i = 0; i < h->n_services; i++)
        if (h->services[i].ready != NULL && !h->services[i].ready(h->services[i].arg, why))
            return false;
    return true;
}

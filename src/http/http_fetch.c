/*
 * http_fetch.c: see http_fetch.h.
 *
 * A private event base runs one evhttp request to its end (answer, error or timeout); the
 * body is copied out as it arrives and refused past its bound (max_bytes for a 200, else
 * KVR_HTTP_FETCH_MAX_ERROR_BYTES), or as soon as a 200's first bytes are not the magic: the
 * loop stops there and the connection is dropped unread. Nothing outlives the call.
 */
#include "http/http_fetch.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/endpoint.h"
#include "base/grow.h"
#include "kvrouter.h"

#define KVR_STR_(x) #x
#define KVR_STR(x) KVR_STR_(x)

typedef struct fetch {
    const kvr_http_fetch_t *q;
    struct event_base *base;
    uint8_t *body;
    size_t len, cap, max;
    int status;
    bool done, too_big, bad_magic;
} fetch_t;

/* Stops the loop: the answer is refused (the connection is dropped with what is unread). */
static void refuse(fetch_t *f, struct evbuffer *in)
{
    evbuffer_drain(in, evbuffer_get_length(in));
    event_base_loopbreak(f->base);
}

/* The status line and headers are in: the body's bound follows from the status. */
static int on_header(struct evhttp_request *req, void *arg)
{
    fetch_t *f = arg;
    f->status = evhttp_request_get_response_code(req);
    f->max = f->status == 200 ? f->q->max_bytes : KVR_HTTP_FETCH_MAX_ERROR_BYTES;
    const char *cl = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Length");
    char *end;
    unsigned long long n = cl != NULL ? strtoull(cl, &end, 10) : 0;
    if (cl != NULL && *end == '\0' && n > f->max) {
        f->too_big = true;
        event_base_loopbreak(f->base);
        return -1; /* evhttp drops the connection */
    }
    return 0;
}

static bool magic_ok(const fetch_t *f)
{
    const kvr_http_fetch_t *q = f->q;
    size_t n = f->len < q->magic_len ? f->len : q->magic_len;
    return q->magic == NULL || f->status != 200 || memcmp(f->body, q->magic, n) == 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    fetch_t *f = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    if (f->too_big || f->bad_magic) {
        refuse(f, in);
        return;
    }
    if (f->len + n > f->max ||
        kvr_grow((void **)&f->body, &f->cap, f->len + n, f->max, 1) != KVR_OK) {
        f->too_big = true;
        refuse(f, in);
        return;
    }
    evbuffer_remove(in, f->body + f->len, n);
    f->len += n;
    if (!magic_ok(f)) {
        f->bad_magic = true;
        refuse(f, in);
    }
}

static void on_done(struct evhttp_request *req, void *arg)
{
    fetch_t *f = arg;
    if (req != NULL && evhttp_request_get_response_code(req) != 0) {
        f->status = evhttp_request_get_response_code(req);
        if (f->max == 0) /* no header callback ran (an answer without a body) */
            f->max = f->status == 200 ? f->q->max_bytes : KVR_HTTP_FETCH_MAX_ERROR_BYTES;
        on_chunk(req, f);
    }
    f->done = true;
    event_base_loopbreak(f->base);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

int kvr_http_fetch(const kvr_http_fetch_t *q, uint8_t **body, size_t *len, int *status,
                   char *err, size_t err_len)
{
    *body = NULL;
    *len = 0;
    *status = 0;
    kvr_url_t u;
    char path[600];
    if (kvr_endpoint_parse_url(q->url, NULL, &u, err, err_len) != KVR_OK)
        return KVR_EINVAL;
    snprintf(path, sizeof path, "%s%s", u.base_path, q->path);
    fetch_t f = {.q = q};
    struct evhttp_connection *conn = NULL;
    struct evhttp_request *req = NULL;
    int rc = KVR_ENOMEM;
    if ((f.base = event_base_new()) != NULL &&
        (conn = evhttp_connection_base_new(f.base, NULL, u.host, u.port)) != NULL &&
        (req = evhttp_request_new(on_done, &f)) != NULL) {
        evhttp_connection_set_timeout(conn, (int)((q->timeout_ms + 999) / 1000));
        evhttp_connection_set_max_headers_size(conn, KVR_HTTP_FETCH_MAX_HEADER_BYTES);
        evhttp_request_set_header_cb(req, on_header);
        evhttp_request_set_chunked_cb(req, on_chunk);
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "Host", u.host_hdr);
        if (q->bearer != NULL && q->bearer[0] != '\0') {
            char auth[600];
            snprintf(auth, sizeof auth, "Bearer %s", q->bearer);
            evhttp_add_header(h, "Authorization", auth);
        }
        if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, path) == 0) {
            req = NULL; /* owned by the connection now */
            struct timeval tv = {(time_t)(q->timeout_ms / 1000),
                                 (suseconds_t)(q->timeout_ms % 1000) * 1000};
            struct event *deadline = evtimer_new(f.base, on_deadline, f.base);
            if (deadline != NULL)
                evtimer_add(deadline, &tv);
            event_base_dispatch(f.base);
            if (deadline != NULL)
                event_free(deadline);
            rc = KVR_OK;
        }
    }
    if (req != NULL)
        evhttp_request_free(req);
    if (conn != NULL)
        evhttp_connection_free(conn);
    if (f.base != NULL)
        event_base_free(f.base);
    if (rc != KVR_OK) {
    } else if (f.too_big) {
        snprintf(err, err_len, "GET %s%s: the answer (status %d) is larger than %zu bytes; "
                 "refused unread", q->url, q->path, f.status, f.max);
        rc = KVR_ETOOBIG;
    } else if (f.bad_magic) {
        snprintf(err, err_len, "GET %s%s: the answer does not start as expected (not the "
                 "format asked for); refused unread", q->url, q->path);
        rc = KVR_EPARSE;
    } else if (!f.done || f.status == 0) {
        snprintf(err, err_len, "GET %s%s: %s", q->url, q->path,
                 f.done ? "no answer (connection refused or reset, or headers over the "
                          "cap of " KVR_STR(KVR_HTTP_FETCH_MAX_HEADER_BYTES) " bytes)"
                        : "timed out");
        rc = KVR_EIO;
    } else if (f.len < q->magic_len && q->magic != NULL && f.status == 200) {
        snprintf(err, err_len, "GET %s%s: the answer is shorter than its header", q->url,
                 q->path);
        rc = KVR_EPARSE;
    }
    if (rc != KVR_OK) {
        free(f.body);
        return rc;
    }
    *body = f.body;
    *len = f.len;
    *status = f.status;
    return KVR_OK;
}

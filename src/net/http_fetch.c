/*
 * http_fetch.c: see http_fetch.h.
 *
 * A private event base runs one evhttp request to its end (answer, error or timeout); the
 * body is copied out as it arrives and refused past max_bytes. Nothing outlives the call.
 */
#include "net/http_fetch.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/endpoint.h"
#include "core/grow.h"
#include "kvrouter.h"

typedef struct fetch {
    struct event_base *base;
    uint8_t *body;
    size_t len, cap, max;
    int status;
    bool done, too_big;
} fetch_t;

static void on_chunk(struct evhttp_request *req, void *arg)
{
    fetch_t *f = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    if (f->too_big || f->len + n > f->max ||
        kvr_grow((void **)&f->body, &f->cap, f->len + n, f->max, 1) != KVR_OK) {
        f->too_big = true;
        evbuffer_drain(in, n);
        return;
    }
    evbuffer_remove(in, f->body + f->len, n);
    f->len += n;
}

static void on_done(struct evhttp_request *req, void *arg)
{
    fetch_t *f = arg;
    if (req != NULL) {
        on_chunk(req, f);
        f->status = evhttp_request_get_response_code(req);
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
    fetch_t f = {.max = q->max_bytes};
    struct evhttp_connection *conn = NULL;
    struct evhttp_request *req = NULL;
    int rc = KVR_ENOMEM;
    if ((f.base = event_base_new()) != NULL &&
        (conn = evhttp_connection_base_new(f.base, NULL, u.host, u.port)) != NULL &&
        (req = evhttp_request_new(on_done, &f)) != NULL) {
        evhttp_connection_set_timeout(conn, (int)((q->timeout_ms + 999) / 1000));
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
    if (rc == KVR_OK && (!f.done || f.status == 0)) {
        snprintf(err, err_len, "GET %s%s: %s", q->url, q->path,
                 f.done ? "no answer (connection refused or reset)" : "timed out");
        rc = KVR_EIO;
    } else if (rc == KVR_OK && f.too_big) {
        snprintf(err, err_len, "GET %s%s: the answer is larger than %zu bytes", q->url, q->path,
                 q->max_bytes);
        rc = KVR_ETOOBIG;
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

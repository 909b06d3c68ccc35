/*
 * mocker_server.c: the mocker's HTTP side (mocker_server.h): its error replies (counted by
 * status) and listeners; replies go through http/reply.h (m->rep).
 * Invariants: every error reply is counted once in m->http_errors.
 * Ownership: nothing kept; the listener is the caller's. Threads: the loop thread only.
 * Cost: a reply copies its body once (http/reply.h).
 */
#include "mocker/mocker_server.h"

#include <stdarg.h>
#include <stdio.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvrouter.h"
#include "wire/json_writer.h"
#include "wire/openai.h"

void mk_count_error(kvr_mocker_t *m, int code)
{
    int k = code == 400 ? 0 : code == 404 ? 1 : code == 413 ? 2 : code == 500 ? 3
            : code == 503 ? 4 : 5;
    m->http_errors[k]++;
}

void mk_reply_error(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mk_count_error(m, code);
    kvr_reply_error(&m->rep, req, code, NULL, "%s", msg);
}

int mk_listen(kvr_mocker_t *m, const char *what, uint16_t port, size_t max_body,
              void (*cb)(struct evhttp_request *, void *), void *arg, struct evhttp **http,
              struct evhttp_bound_socket **bs, char *err, size_t err_len)
{
    if (!(*http = evhttp_new(m->base)))
        return KVR_ENOMEM;
    evhttp_set_max_body_size(*http, (ev_ssize_t)max_body);
    evhttp_set_gencb(*http, cb, arg);
    if (!(*bs = evhttp_bind_socket_with_handle(*http, m->cfg.host, port))) {
        snprintf(err, err_len, "%s: cannot listen on %s:%u (in use, or a bad address)", what,
                 m->cfg.host, port);
        return KVR_EIO;
    }
    return KVR_OK;
}

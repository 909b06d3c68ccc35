/*
 * http_guard.c: see http_guard.h.
 *
 * Written by hand: libevent 2.1 (Debian's) has no hook for these limits (2.2's
 * evhttp_set_max_connections and evhttp_set_errorcb are not packaged), and no other Debian
 * HTTP server library fits the event loop the router, the front end and the probes share.
 * A connection: the socket bufferevent evhttp uses, with one reference of ours (so its memory
 * outlives evhttp's bufferevent_free, which clears its callbacks and closes its socket) and a
 * callback on its input and output buffers; a conn_t holds both. A 100 ms sweep releases the
 * connections evhttp has freed (callbacks cleared). Connections are found from a request by
 * their fd (by_fd, grown on demand), checked against the bufferevent pointer.
 * (A bufferevent_filter would give a free hook, but with 2.1's evhttp the answer of a kept-alive
 * connection's second request stays in the filter: evhttp adds it before enabling writes.)
 * Closing a connection ourselves: the answer (if any) is sent straight to the socket (a few
 * hundred bytes into an empty send buffer), the write side is shut, and an EOF is raised on
 * the bufferevent, deferred to the loop, so evhttp frees the connection as if the client had
 * left. An evhttp error page is replaced the same way: nothing else is pending on the
 * connection when evhttp writes one.
 */
#include "http/http_guard.h"

#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kvrouter.h"
#include "base/log.h"
#include "wire/http_head.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"

/* Reads and writes of up to 4 MiB per call: libevent's 16 KiB default turns a 128K-token
 * prompt (about 900 KB of JSON) into dozens of loop iterations. */
#define MAX_IO ((size_t)4 << 20)
#define ACCEPT_PAUSE_MS 100
#define SWEEP_MS 100

typedef enum phase {
    P_FRESH,   /* accepted, no byte yet: the head deadline runs from the accept */
    P_IDLE,    /* between requests of a kept-alive connection */
    P_HEAD,    /* reading a request's line and headers */
    P_BODY,    /* head complete, body being read */
    P_BUSY,    /* the request is with the handler */
    P_REFUSED, /* over the cap: answered 503 at the next loop turn */
    P_CLOSING, /* we answered and are closing; input is dropped */
} phase_t;

typedef struct conn {
    kvr_http_guard_t *g;
    struct bufferevent *bev; /* evhttp's; one reference is ours */
    struct event *timer;
    size_t slot;          /* index in g->conns */
    phase_t phase;
    int fd;               /* registered in g->by_fd; -1 before */
    kvr_http_head_t head; /* where the current request's head ends (wire/http_head.h) */
    bool replacing;       /* evhttp's own answer is being dropped (ours was sent instead) */
    uint64_t head_bytes;
} conn_t;

struct kvr_http_guard {
    struct event_base *base;
    struct evhttp *http;
    char name[16];
    kvr_http_limits_t lim;
    kvr_http_handler_fn handler;
    void *arg;
    struct evconnlistener *listener; /* owned by evhttp once bound */
    struct evhttp_bound_socket *bound;
    struct event *resume; /* re-enables the listener after an accept failure */
    struct event *sweep;  /* releases the connections evhttp freed */
    conn_t **by_fd;
    size_t by_fd_cap;
    conn_t **conns;       /* every connection not yet released */
    size_t n_conns, cap_conns;
    uint64_t busy;
    bool draining;
    kvr_http_guard_stats_t st;
    kvr_ratelimit_t rl_accept, rl_limits;
};

static void arm(conn_t *c, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(c->timer, &tv);
}

static void register_fd(conn_t *c)
{
    kvr_http_guard_t *g = c->g;
    if (c->fd >= 0)
        return;
    int fd = (int)bufferevent_getfd(c->bev);
    if (fd < 0)
        return;
    if ((size_t)fd >= g->by_fd_cap) {
        size_t cap = g->by_fd_cap ? g->by_fd_cap : 256;
        while (cap <= (size_t)fd)
            cap *= 2;
        conn_t **t = realloc(g->by_fd, cap * sizeof *t);
        if (t == NULL)
            return; /* found by no request: still limited by its deadline */
        memset(t + g->by_fd_cap, 0, (cap - g->by_fd_cap) * sizeof *t);
        g->by_fd = t;
        g->by_fd_cap = cap;
    }
    g->by_fd[fd] = c;
    c->fd = fd;
}

static conn_t *conn_of_bev(kvr_http_guard_t *g, struct bufferevent *bev)
{
    if (bev == NULL)
        return NULL;
    int fd = (int)bufferevent_getfd(bev);
    if (fd < 0 || (size_t)fd >= g->by_fd_cap)
        return NULL;
    conn_t *c = g->by_fd[fd];
    return c != NULL && c->bev == bev ? c : NULL;
}

static conn_t *conn_of(kvr_http_guard_t *g, struct evhttp_request *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    return evcon ? conn_of_bev(g, evhttp_connection_get_bufferevent(evcon)) : NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Answers of our own */

static const char *reason(int code)
{
    switch (code) {
    case 400: return "Bad Request";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return code >= 500 ? "Internal Server Error" : "Bad Request";
    }
}

/* A complete HTTP/1.1 answer with a JSON error body and Connection: close, into out. */
static void error_answer(struct evbuffer *out, int code, const char *message)
{
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_oai_encode_error(&w, message, NULL, code);
    const char *body = NULL;
    size_t len = 0;
    if (kvr_json_writer_finish(&w, &body, &len) != KVR_OK) {
        body = "{\"error\":{\"message\":\"error\",\"type\":null,\"param\":null,\"code\":500}}";
        len = strlen(body);
    }
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                        code, reason(code), len);
    evbuffer_add(out, body, len);
    kvr_json_writer_deinit(&w);
}

/* Sends the answer (code 0: none) on the socket, shuts its write side and has evhttp free the
 * connection at the next loop turn. */
static void close_conn(conn_t *c, int code, const char *message)
{
    if (c->phase == P_CLOSING)
        return;
    c->phase = P_CLOSING;
    event_del(c->timer);
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd >= 0 && code != 0) {
        struct evbuffer *b = evbuffer_new();
        if (b != NULL) {
            error_answer(b, code, message);
            (void)evbuffer_write(b, fd); /* best effort: the client may not be reading */
            evbuffer_free(b);
        }
    }
    if (fd >= 0)
        (void)shutdown(fd, SHUT_WR);
    bufferevent_disable(c->bev, EV_READ);
    bufferevent_trigger_event(c->bev, BEV_EVENT_EOF | BEV_EVENT_READING,
                              BEV_TRIG_DEFER_CALLBACKS);
}

/* ---------------------------------------------------------------------------------------- */
/* Phases and deadlines */

static void enter_idle(conn_t *c)
{
    c->phase = P_IDLE;
    arm(c, c->g->lim.idle_timeout_ms);
}

static void enter_head(conn_t *c, bool rearm)
{
    c->phase = P_HEAD;
    c->head = (kvr_http_head_t)KVR_HTTP_HEAD_INIT;
    c->head_bytes = 0;
    if (rearm)
        arm(c, c->g->lim.header_timeout_ms);
}

static void release(conn_t *c)
{
    kvr_http_guard_t *g = c->g;
    if (c->fd >= 0 && (size_t)c->fd < g->by_fd_cap && g->by_fd[c->fd] == c)
        g->by_fd[c->fd] = NULL;
    if (c->phase == P_BUSY && g->busy > 0)
        g->busy--;
    g->conns[c->slot] = g->conns[--g->n_conns];
    g->conns[c->slot]->slot = c->slot;
    event_free(c->timer);
    bufferevent_decref(c->bev);
    g->st.open--;
    free(c);
}

/* evhttp freed the connection (bufferevent_free clears the callbacks). */
static bool released_by_evhttp(const conn_t *c)
{
    bufferevent_data_cb r, w;
    bufferevent_event_cb e;
    void *arg;
    bufferevent_getcb(c->bev, &r, &w, &e, &arg);
    return r == NULL && w == NULL && e == NULL;
}

/* A deadline passed: logged (rate-limited), answered code (0: closed silently). */
static void late(conn_t *c, const char *what, const char *setting, uint64_t ms, int code)
{
    char msg[160];
    snprintf(msg, sizeof msg, "the request %s did not arrive within %llu ms (%s)", what,
             (unsigned long long)ms, setting);
    kvr_log_limited(&c->g->rl_limits, KVR_LOG_WARN, "%s listener: %s; connection closed",
                    c->g->name, msg);
    close_conn(c, code, msg);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_t *c = arg;
    kvr_http_guard_t *g = c->g;
    if (released_by_evhttp(c)) {
        release(c);
        return;
    }
    register_fd(c);
    char msg[160];
    switch (c->phase) {
    case P_REFUSED:
        if (g->draining)
            snprintf(msg, sizeof msg, "the router is shutting down");
        else
            snprintf(msg, sizeof msg, "too many connections (http_max_connections=%u)",
                     g->lim.max_connections);
        close_conn(c, 503, msg);
        return;
    case P_FRESH:
    case P_HEAD:
        g->st.timeout_header++;
        late(c, "head", "http_header_timeout_ms", g->lim.header_timeout_ms,
             c->phase == P_HEAD ? 408 : 0);
        return;
    case P_BODY:
        g->st.timeout_body++;
        late(c, "body", "http_body_timeout_ms", g->lim.body_timeout_ms, 408);
        return;
    case P_IDLE:
        g->st.timeout_idle++;
        close_conn(c, 0, NULL);
        return;
    case P_BUSY:
    case P_CLOSING:
        return;
    }
}

/* Scans src from byte from on for the end of the head. Returns the bytes scanned, *done set
 * when the end is among them. */
static size_t scan_head(conn_t *c, struct evbuffer *src, size_t from, bool *done)
{
    struct evbuffer_ptr at;
    *done = false;
    if (evbuffer_ptr_set(src, &at, from, EVBUFFER_PTR_SET) != 0)
        return 0;
    struct evbuffer_iovec v[16];
    int n = evbuffer_peek(src, -1, &at, v, 16);
    size_t used = 0;
    for (int i = 0; i < n && i < 16 && !*done; i++)
        used += kvr_http_head_scan(&c->head, v[i].iov_base, v[i].iov_len, done);
    return used;
}

/* Bytes arrived on the connection (before evhttp reads them). */
static void on_input(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    conn_t *c = arg;
    kvr_http_guard_t *g = c->g;
    if (info->n_added == 0)
        return;
    register_fd(c);
    if (c->phase == P_CLOSING || c->phase == P_REFUSED) {
        evbuffer_drain(buf, evbuffer_get_length(buf)); /* never parsed */
        return;
    }
    if (c->phase == P_FRESH)
        enter_head(c, false); /* the deadline from the accept stands */
    else if (c->phase == P_IDLE)
        enter_head(c, true);
    if (c->phase != P_HEAD)
        return;
    size_t len = evbuffer_get_length(buf);
    bool done;
    size_t head = scan_head(c, buf, len - info->n_added, &done);
    c->head_bytes += head;
    if (c->head_bytes > g->lim.max_header_bytes) {
        g->st.header_too_large++;
        char msg[160];
        snprintf(msg, sizeof msg,
                 "request line and headers larger than %llu bytes (http_max_header_bytes)",
                 (unsigned long long)g->lim.max_header_bytes);
        kvr_log_limited(&g->rl_limits, KVR_LOG_WARN, "%s listener: %s", g->name, msg);
        close_conn(c, 431, msg);
        evbuffer_drain(buf, len);
        return;
    }
    if (done) {
        c->phase = P_BODY;
        arm(c, g->lim.body_timeout_ms);
    }
}

/* The status of an answer starting src, or 0 if src does not start one. */
static int answer_status(struct evbuffer *src)
{
    if (evbuffer_get_length(src) < 12)
        return 0;
    const char *p = (const char *)evbuffer_pullup(src, 12);
    if (p == NULL || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
        return 0;
    int code = 0;
    for (int i = 9; i < 12; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        code = code * 10 + (p[i] - '0');
    }
    return code;
}

static void evhttp_error_message(const kvr_http_guard_t *g, int code, char *msg, size_t cap)
{
    if (code == 413)
        snprintf(msg, cap, "request body larger than %llu bytes (http_max_body_bytes)",
                 (unsigned long long)g->lim.max_body_bytes);
    else if (code == 405 || code == 501)
        snprintf(msg, cap, "method not allowed (%s are served)",
                 g->lim.methods ? g->lim.methods : "GET, POST and DELETE");
    else if (code == 400)
        snprintf(msg, cap, "malformed HTTP request");
    else
        snprintf(msg, cap, "the request could not be served (HTTP %d)", code);
}

/* evhttp wrote to the connection. Outside a request given to the handler, that is evhttp
 * answering on its own (an HTML error page, or 100 Continue): the page is dropped and the
 * same status is sent in JSON. */
static void on_output(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    conn_t *c = arg;
    kvr_http_guard_t *g = c->g;
    if (info->n_added == 0 || c->phase == P_BUSY)
        return;
    if (c->replacing) {
        evbuffer_drain(buf, evbuffer_get_length(buf));
        return;
    }
    int code = answer_status(buf);
    if (code < 200)
        return; /* 100 Continue, or not the start of an answer */
    char msg[160];
    evhttp_error_message(g, code, msg, sizeof msg);
    g->st.rewritten++;
    if (code == 413)
        g->st.body_too_large++;
    c->replacing = true;
    evbuffer_drain(buf, evbuffer_get_length(buf));
    close_conn(c, code, msg);
}

int kvr_http_guard_verify(const kvr_http_guard_t *g)
{
    if (g->st.open != g->n_conns || g->n_conns > g->cap_conns)
        return KVR_EINVAL;
    uint64_t busy = 0;
    for (size_t i = 0; i < g->n_conns; i++) {
        const conn_t *c = g->conns[i];
        if (c->slot != i || c->g != g || c->phase > P_CLOSING)
            return KVR_EINVAL;
        if (c->fd >= 0 && ((size_t)c->fd >= g->by_fd_cap))
            return KVR_EINVAL;
        busy += c->phase == P_BUSY;
    }
    for (size_t fd = 0; fd < g->by_fd_cap; fd++) {
        const conn_t *c = g->by_fd[fd];
        if (c != NULL && (c->fd != (int)fd || c->slot >= g->n_conns || g->conns[c->slot] != c))
            return KVR_EINVAL;
    }
    return busy == g->busy ? KVR_OK : KVR_EINVAL;
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_http_guard_t *g = arg;
    for (size_t i = 0; i < g->n_conns;) {
        conn_t *c = g->conns[i];
        if (released_by_evhttp(c))
            release(c); /* the last one moved into slot i */
        else
            i++;
    }
    assert(kvr_http_guard_verify(g) == KVR_OK);
}

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
    kvr_http_guard_t *g = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return NULL;
    bufferevent_set_max_single_read(bev, MAX_IO);
    bufferevent_set_max_single_write(bev, MAX_IO);
    if (g->n_conns == g->cap_conns) {
        size_t cap = g->cap_conns ? g->cap_conns * 2 : 64;
        conn_t **t = realloc(g->conns, cap * sizeof *t);
        if (t == NULL)
            return bev; /* unguarded, but served: evhttp's own limits still apply */
        g->conns = t;
        g->cap_conns = cap;
    }
    conn_t *c = calloc(1, sizeof *c);
    struct event *t = c ? evtimer_new(base, on_timer, c) : NULL;
    if (t == NULL || evbuffer_add_cb(bufferevent_get_input(bev), on_input, c) == NULL ||
        evbuffer_add_cb(bufferevent_get_output(bev), on_output, c) == NULL) {
        if (t != NULL)
            event_free(t);
        free(c);
        bufferevent_free(bev); /* its buffers' callbacks may point at c */
        return NULL;           /* evhttp then makes its own */
    }
    bufferevent_incref(bev);
    c->g = g;
    c->bev = bev;
    c->timer = t;
    c->fd = -1;
    c->slot = g->n_conns;
    g->conns[g->n_conns++] = c;
    g->st.open++;
    g->st.accepted++;
    if (g->draining || g->st.open > g->lim.max_connections) {
        g->st.refused++;
        kvr_log_limited(&g->rl_limits, KVR_LOG_WARN,
                        "%s listener: connection refused (%llu open, http_max_connections=%u%s)",
                        g->name, (unsigned long long)g->st.open, g->lim.max_connections,
                        g->draining ? ", shutting down" : "");
        c->phase = P_REFUSED;
        arm(c, 0); /* evhttp gives the bufferevent its socket after this returns */
    } else {
        c->phase = P_FRESH;
        arm(c, g->lim.header_timeout_ms);
    }
    return bev;
}

/* ---------------------------------------------------------------------------------------- */
/* Requests */

static void on_complete(struct evhttp_request *req, void *arg)
{
    kvr_http_guard_t *g = arg;
    conn_t *c = conn_of(g, req);
    if (c == NULL || c->phase != P_BUSY)
        return;
    if (g->busy > 0)
        g->busy--;
    if (g->draining) { /* close once the answer is out */
        close_conn(c, 0, NULL);
        return;
    }
    enter_idle(c);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    kvr_http_guard_t *g = arg;
    conn_t *c = conn_of(g, req);
    if (c != NULL && (c->phase == P_CLOSING || c->phase == P_REFUSED))
        return; /* the connection is being closed; evhttp frees the request with it */
    if (c != NULL) {
        if (c->phase != P_BUSY)
            g->busy++;
        c->phase = P_BUSY;
        event_del(c->timer);
        evhttp_request_set_on_complete_cb(req, on_complete, g);
    }
    g->handler(req, g->arg);
}

/* ---------------------------------------------------------------------------------------- */
/* The listener */

/* The guards listening, found by listener: the error callback gets the argument evhttp gave
 * its listener, not ours. Touched on the loop's thread only. */
#define MAX_LISTENING 16
static kvr_http_guard_t *listening[MAX_LISTENING];

static kvr_http_guard_t *guard_of(const struct evconnlistener *l)
{
    for (size_t i = 0; i < MAX_LISTENING; i++)
        if (listening[i] != NULL && listening[i]->listener == l)
            return listening[i];
    return NULL;
}

static void set_listening(kvr_http_guard_t *g, bool on)
{
    for (size_t i = 0; i < MAX_LISTENING; i++) {
        if (on ? listening[i] == NULL : listening[i] == g) {
            listening[i] = on ? g : NULL;
            return;
        }
    }
}

/* accept() failed (EMFILE/ENFILE: out of file descriptors). libevent would retry at once and
 * log each failure; the listener pauses instead, and the connections wait in the backlog. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    (void)arg;
    int e = EVUTIL_SOCKET_ERROR();
    kvr_http_guard_t *g = guard_of(l);
    if (g == NULL) {
        evconnlistener_disable(l); /* cannot happen: every guarded listener is registered */
        return;
    }
    g->st.accept_errors++;
    kvr_log_limited(&g->rl_accept, KVR_LOG_ERROR,
                    "%s listener: cannot accept a connection: %s (%llu so far); pausing %d ms%s",
                    g->name, evutil_socket_error_to_string(e),
                    (unsigned long long)g->st.accept_errors, ACCEPT_PAUSE_MS,
                    e == EMFILE || e == ENFILE ? " (raise the file-descriptor limit)" : "");
    evconnlistener_disable(l);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    event_add(g->resume, &tv);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_http_guard_t *g = arg;
    if (g->listener != NULL && !g->draining)
        evconnlistener_enable(g->listener);
}

int kvr_http_guard_listen(kvr_http_guard_t *g, const char *host, uint16_t port, uint16_t *bound)
{
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC,
                                    .ai_socktype = SOCK_STREAM,
                                    .ai_flags = EVUTIL_AI_PASSIVE};
    struct evutil_addrinfo *ai = NULL;
    char ports[8];
    snprintf(ports, sizeof ports, "%u", port);
    if (evutil_getaddrinfo(host, ports, &hints, &ai) != 0 || ai == NULL)
        return KVR_EINVAL;
    struct evconnlistener *l = evconnlistener_new_bind(
        g->base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        -1, ai->ai_addr, (int)ai->ai_addrlen);
    evutil_freeaddrinfo(ai);
    if (l == NULL)
        return KVR_EIO;
    g->bound = evhttp_bind_listener(g->http, l);
    if (g->bound == NULL) {
        evconnlistener_free(l);
        return KVR_ENOMEM;
    }
    g->listener = l;
    set_listening(g, true);
    if (guard_of(l) != g) {
        evhttp_del_accept_socket(g->http, g->bound);
        g->bound = NULL;
        g->listener = NULL;
        return KVR_EFULL;
    }
    evconnlistener_set_error_cb(l, on_accept_error); /* after evhttp set its accept cb */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    *bound = port;
    if (getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&ss, &sl) == 0)
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Life */

kvr_http_guard_t *kvr_http_guard_new(struct event_base *base, struct evhttp *http,
                                     const char *name, const kvr_http_limits_t *lim,
                                     kvr_http_handler_fn handler, void *arg)
{
    kvr_http_guard_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->resume = evtimer_new(base, on_resume, g);
    g->sweep = event_new(base, -1, EV_PERSIST, on_sweep, g);
    struct timeval tv = {0, SWEEP_MS * 1000};
    if (g->resume == NULL || g->sweep == NULL || event_add(g->sweep, &tv) != 0) {
        if (g->resume != NULL)
            event_free(g->resume);
        if (g->sweep != NULL)
            event_free(g->sweep);
        free(g);
        return NULL;
    }
    g->base = base;
    g->http = http;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->lim = *lim;
    g->handler = handler;
    g->arg = arg;
    g->rl_accept = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);
    g->rl_limits = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    evhttp_set_gencb(http, on_request, g);
    evhttp_set_bevcb(http, make_bev, g);
    evhttp_set_max_body_size(http, (ev_ssize_t)lim->max_body_bytes);
    /* the guard refuses a head at max_header_bytes; evhttp's own limit (which counts the
     * header lines only, and would answer with an HTML page) is a backstop above it */
    evhttp_set_max_headers_size(http, (ev_ssize_t)(lim->max_header_bytes + 4096));
    return g;
}

void kvr_http_guard_drain(kvr_http_guard_t *g)
{
    if (g->draining)
        return;
    g->draining = true;
    if (g->bound != NULL) {
        evhttp_del_accept_socket(g->http, g->bound); /* frees the listener: refused at once */
        set_listening(g, false);
        g->bound = NULL;
        g->listener = NULL;
    }
    for (size_t i = 0; i < g->n_conns; i++) {
        conn_t *c = g->conns[i];
        if (released_by_evhttp(c))
            continue;
        if (c->phase == P_IDLE || c->phase == P_FRESH)
            close_conn(c, 0, NULL); /* the others close in on_complete */
    }
}

uint64_t kvr_http_guard_busy(const kvr_http_guard_t *g) { return g->busy; }

void kvr_http_guard_stats(const kvr_http_guard_t *g, kvr_http_guard_stats_t *out)
{
    *out = g->st;
}

static void family(kvr_http_guard_t *const *gs, size_t n, kvr_prom_t *p, const char *name,
                   const char *type, const char *help, size_t off)
{
    kvr_prom_family(p, name, type, help);
    for (size_t i = 0; i < n; i++) {
        kvr_http_guard_stats_t st = gs[i]->st;
        uint64_t v;
        memcpy(&v, (const char *)&st + off, sizeof v);
        kvr_prom_label_t l = {"listener", gs[i]->name};
        kvr_prom_sample(p, name, &l, 1, (double)v);
    }
}

static void timeouts(kvr_http_guard_t *const *gs, size_t n, kvr_prom_t *p)
{
    const char *name = "kvr_http_timeouts_total";
    kvr_prom_family(p, name, "counter",
                    "Connections closed by a deadline: phase=header (http_header_timeout_ms, "
                    "408), body (http_body_timeout_ms, 408), idle (http_idle_timeout_ms).");
    for (size_t i = 0; i < n; i++) {
        const kvr_http_guard_stats_t *st = &gs[i]->st;
        const char *phases[] = {"header", "body", "idle"};
        uint64_t v[] = {st->timeout_header, st->timeout_body, st->timeout_idle};
        for (int k = 0; k < 3; k++) {
            kvr_prom_label_t l[2] = {{"listener", gs[i]->name}, {"phase", phases[k]}};
            kvr_prom_sample(p, name, l, 2, (double)v[k]);
        }
    }
}

void kvr_http_guard_metrics_all(kvr_http_guard_t *const *gs, size_t n, kvr_prom_t *p)
{
#define F(name, type, help, field) \
    family(gs, n, p, name, type, help, offsetof(kvr_http_guard_stats_t, field))
    F("kvr_http_connections", "gauge", "Client connections open.", open);
    F("kvr_http_connections_accepted_total", "counter", "Client connections accepted.",
      accepted);
    F("kvr_http_connections_refused_total", "counter",
      "Connections answered 503 and closed: over http_max_connections, or shutting down.",
      refused);
    F("kvr_http_accept_errors_total", "counter",
      "accept() failures (out of file descriptors, ...); the listener pauses 100 ms after each.",
      accept_errors);
    F("kvr_http_header_too_large_total", "counter",
      "Requests refused with 431: head above http_max_header_bytes.", header_too_large);
    F("kvr_http_body_too_large_total", "counter",
      "Requests refused with 413: body above http_max_body_bytes.", body_too_large);
    F("kvr_http_rewritten_errors_total", "counter",
      "Errors evhttp answered on its own (malformed request, body too large, method), sent "
      "as JSON.", rewritten);
#undef F
    timeouts(gs, n, p);
}

void kvr_http_guard_free(kvr_http_guard_t *g)
{
    if (g == NULL)
        return;
    set_listening(g, false);
    on_sweep(-1, 0, g); /* evhttp_free freed every connection */
    event_free(g->resume);
    event_free(g->sweep);
    free(g->conns);
    free(g->by_fd);
    free(g);
}

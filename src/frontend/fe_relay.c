/*
 * fe_relay.c: relaying a worker's streamed answer to the client (see frontend_int.h): the
 * upstream bytes are cut into whole SSE events, each counted (tokens, output blocks for the
 * router), given the worker's nvext when the client asked, and handed to the client's
 * connection; a client that stops reading is aborted once its unread bytes pass
 * frontend_max_client_buffer_bytes. Threads: the HTTP thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "frontend/frontend_int.h"

static const char *find_bytes(const char *h, size_t hn, const char *needle, size_t nn)
{
    if (nn == 0 || hn < nn)
        return NULL;
    const char *end = h + hn - nn + 1;
    for (const char *p = h; p < end;) {
        const char *q = memchr(p, needle[0], (size_t)(end - p));
        if (q == NULL)
            return NULL;
        if (memcmp(q, needle, nn) == 0)
            return q;
        p = q + 1;
    }
    return NULL;
}

/* Whether the chunk's "choices" array is non-empty (it carries a token). */
static bool has_choices(const char *j, size_t n)
{
    const char *k = find_bytes(j, n, "\"choices\"", 9);
    if (k == NULL)
        return false;
    size_t i = kvr_json_skip_ws(j, n, (size_t)(k - j) + 9);
    if (i >= n || j[i] != ':')
        return false;
    i = kvr_json_skip_ws(j, n, i + 1);
    if (i >= n || j[i] != '[')
        return false;
    i = kvr_json_skip_ws(j, n, i + 1);
    return i < n && j[i] != ']';
}

/* Length of the first complete event in b[0..n) (through its blank line), 0 when none. */
static size_t sse_event_len(const char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(b + i, '\n', n - i);
        if (nl == NULL)
            return 0;
        size_t j = (size_t)(nl - b) + 1;
        if (j < n && b[j] == '\n')
            return j + 1;
        if (j + 1 < n && b[j] == '\r' && b[j + 1] == '\n')
            return j + 2;
        i = j;
    }
    return 0;
}

/* One complete event: counted, and copied to out (with the worker's nvext when asked). */
static void relay_event(fe_req_t *p, const char *ev, size_t len, struct evbuffer *out)
{
    kvr_frontend_t *fe = p->fe;
    fe->st.stream_events++;
    const char *nl = memchr(ev, '\n', len);
    size_t l1 = (size_t)(nl - ev), tail = len - l1;
    size_t le = l1 > 0 && ev[l1 - 1] == '\r' ? l1 - 1 : l1;
    bool single = tail == 2 || (tail == 3 && ev[l1 + 1] == '\r');
    if (!single || le < 5 || memcmp(ev, "data:", 5) != 0) {
        evbuffer_add(out, ev, len); /* comments, named events, multi-line data: as they are */
        return;
    }
    size_t off = le > 5 && ev[5] == ' ' ? 6 : 5;
    const char *d = ev + off;
    size_t dl = le - off;
    if (dl == 0 || d[0] != '{') { /* [DONE] and the like */
        evbuffer_add(out, ev, len);
        return;
    }
    bool error = dl >= 8 && memcmp(d, "{\"error\"", 8) == 0;
    if (!error && has_choices(d, dl))
        fe_mark_token(p);
    if (p->want_worker && !error) {
        evbuffer_add(out, KVR_OAI_SSE_PREFIX, sizeof KVR_OAI_SSE_PREFIX - 1);
        if (fe_inject_worker(p, d, dl, out)) {
            evbuffer_add(out, KVR_OAI_SSE_SUFFIX, sizeof KVR_OAI_SSE_SUFFIX - 1);
            return;
        }
        fe->st.inject_failed++;
        evbuffer_add(out, d, dl);
        evbuffer_add(out, KVR_OAI_SSE_SUFFIX, sizeof KVR_OAI_SSE_SUFFIX - 1);
        return;
    }
    evbuffer_add(out, ev, len);
}

/* Bytes handed to libevent for the client and not yet written to its socket. */
size_t fe_client_backlog(const fe_req_t *p)
{
    if (p->client == NULL || p->client_conn == NULL)
        return 0;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(p->client_conn);
    return bev != NULL ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

/* A client that does not read what it asked for is aborted like one that left, but not from
 * here: relay runs inside the upstream request's own callbacks, where the request cannot be
 * cancelled. retry_ev (made before the upstream call) continues in on_retry. */
static void check_client_backlog(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    size_t pending = fe_client_backlog(p);
    if (p->slow_abort || pending <= fe->cfg.frontend_max_client_buffer_bytes ||
        p->retry_ev == NULL)
        return;
    p->slow_abort = true;
    fe->st.slow_client_aborts++;
    kvr_log_limited(&fe->rl_slow, KVR_LOG_WARN, "request %.*s on worker %llu: the client does "
                    "not read its stream (%zu bytes pending > frontend_max_client_buffer_bytes "
                    "%llu): aborted", (int)p->rid_len, p->rid,
                    (unsigned long long)p->worker.worker_id, pending,
                    (unsigned long long)fe->cfg.frontend_max_client_buffer_bytes);
    static const struct timeval now = {0, 0};
    (void)evtimer_add(p->retry_ev, &now);
}

/* The deferred abort of a slow client, from the timer: closing its connection runs
 * on_client_close (upstream cancelled, booking freed, p freed). */
void fe_abort_slow_client(fe_req_t *p)
{
    if (p->client != NULL && p->client_conn != NULL) {
        evhttp_connection_free(p->client_conn);
        return;
    }
    fe_req_finish(p);
}

/* Forwards the complete events held (all of it when final). */
void fe_relay(fe_req_t *p, bool final)
{
    kvr_frontend_t *fe = p->fe;
    struct evbuffer *out = fe->out;
    evbuffer_drain(out, evbuffer_get_length(out));
    size_t avail = evbuffer_get_length(p->sse);
    if (avail > 0) {
        const char *b = (const char *)evbuffer_pullup(p->sse, -1);
        size_t off = 0, l;
        while (off < avail && (l = sse_event_len(b + off, avail - off)) > 0) {
            relay_event(p, b + off, l, out);
            off += l;
        }
        if (off < avail && (final || avail - off > FE_SSE_MAX_PENDING)) {
            evbuffer_add(out, b + off, avail - off);
            fe->st.sse_raw++;
            off = avail;
        }
        evbuffer_drain(p->sse, off);
    }
    if (evbuffer_get_length(out) > 0 && p->client != NULL) {
        fe_start_reply(p);
        evhttp_send_reply_chunk(p->client, out);
        if (!final)
            check_client_backlog(p);
    }
}

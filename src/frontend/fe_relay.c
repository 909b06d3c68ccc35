/*
 * fe_relay.c: a worker's streamed answer cut for the client (fe_relay.h): the upstream bytes
 * are cut into whole SSE events, each counted (and its token reported through the caller's
 * on_token, in order), given the worker's nvext when the client asked, and appended to the
 * caller's buffer; the state machine sends it and watches the client's backlog. An event with
 * a usage member gives the engine's report of cached prompt tokens (p->up.cached).
 * Invariants: only whole events leave p->up.sse, but at the stream's end or past
 * FE_SSE_MAX_PENDING bytes without an event end (forwarded raw, counted). Ownership: nothing
 * kept. Threads: the HTTP thread. Cost: one pass over the bytes; a copy into out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "frontend/fe_body.h"
#include "frontend/fe_relay.h"
#include "wire/oai_usage.h"

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
static void relay_event(fe_req_t *p, const char *ev, size_t len, struct evbuffer *out,
                        void (*on_token)(fe_req_t *p))
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
        on_token(p);
    uint64_t cached;
    if (!error && find_bytes(d, dl, "\"usage\"", 7) != NULL &&
        kvr_oai_usage_cached_tokens(d, dl, &cached)) { /* the engine's report (the last wins) */
        p->up.has_cached = true;
        p->up.cached = cached;
    }
    if (p->client.want_worker && !error) {
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

void fe_relay_events(fe_req_t *p, bool final, struct evbuffer *out,
                     void (*on_token)(fe_req_t *p))
{
    kvr_frontend_t *fe = p->fe;
    size_t avail = evbuffer_get_length(p->up.sse);
    if (avail == 0)
        return;
    const char *b = (const char *)evbuffer_pullup(p->up.sse, -1);
    size_t off = 0, l;
    while (off < avail && (l = sse_event_len(b + off, avail - off)) > 0) {
        relay_event(p, b + off, l, out, on_token);
        off += l;
    }
    if (off < avail && (final || avail - off > FE_SSE_MAX_PENDING)) {
        evbuffer_add(out, b + off, avail - off);
        fe->st.sse_raw++;
        off = avail;
    }
    evbuffer_drain(p->up.sse, off);
}

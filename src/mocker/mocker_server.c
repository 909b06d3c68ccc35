/*
 * mocker_server.c: the simulated engine's process (see mocker_server.h for what it serves).
 *
 *   ranks     one per data-parallel rank: an engine, a KV-event encoder and publisher, a step
 *             timer. A rank runs at most one step at a time (stepping); it begins the next
 *             step right after delivering the last one, until its engine has no work.
 *   requests  one mreq per HTTP request admitted to an engine, the engine's `user` pointer;
 *             freed when the engine reports its last token, or when the client goes away
 *             (the connection's close callback cancels it in the engine first).
 * Invariant: every live mreq is live in its rank's engine and has the connection's close
 * callback pointing at it; nothing else points at it.
 * Memory: the request path reuses the server's decoder, token and text buffers, JSON writer
 * and chunk buffer; per request, one mreq (and for non-streaming, its text buffer).
 */
#include "mocker/mocker_server.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/namelist.h"
#include "kvrouter.h"
#include "http/http_conn.h"
#include "events/kv_publisher.h"
#include "base/log.h"
#include "wire/json_splice.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"
#include "wire/toytok.h"

#include "mocker/mocker_int.h"

#define MAX_BODY_BYTES ((size_t)256 << 20)
#define REPLAY_POLL_US 10000 /* backstop; requests are answered on arrival (on_replay_ready) */
#define SWEEP_US 50000
#define MOCKER_VERSION "kvrouter-mocker 0.1.0"

static const double TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                     0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
static const double E2E_BOUNDS[] = {0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
                                    20.0, 30.0, 40.0, 50.0, 60.0, 120.0};
#define N_TTFT (sizeof TTFT_BOUNDS / sizeof TTFT_BOUNDS[0])
#define N_E2E (sizeof E2E_BOUNDS / sizeof E2E_BOUNDS[0])

/* ---- engine hashes: a bijection of the sequence hash ----------------------------------- */

#define MIX_C1 UINT64_C(0xff51afd7ed558ccd)
#define MIX_C2 UINT64_C(0xc4ceb9fe1a85ec53)
#define MIX_SALT UINT64_C(0x6b7650d1e2f3a4c5)

static uint64_t mul_inverse(uint64_t c)
{
    uint64_t x = c; /* Newton's iteration doubles the correct low bits each round */
    for (int i = 0; i < 6; i++)
        x *= 2 - c * x;
    return x;
}

uint64_t kvr_mocker_engine_hash(uint64_t h)
{
    h ^= MIX_SALT;
    h ^= h >> 33;
    h *= MIX_C1;
    h ^= h >> 33;
    h *= MIX_C2;
    h ^= h >> 33;
    return h;
}

uint64_t kvr_mocker_seq_hash(uint64_t h)
{
    h ^= h >> 33;
    h *= mul_inverse(MIX_C2);
    h ^= h >> 33;
    h *= mul_inverse(MIX_C1);
    h ^= h >> 33;
    return h ^ MIX_SALT;
}

/* ---- config ---------------------------------------------------------------------------- */

void kvr_mocker_config_default(kvr_mocker_config_t *c)
{
    memset(c, 0, sizeof *c);
    kvr_engine_config_default(&c->engine);
    snprintf(c->host, sizeof c->host, "0.0.0.0");
    c->port = 8000;
    snprintf(c->model, sizeof c->model, "kvrouter-mocker");
    c->dp_size = 1;
    c->speedup = 1.0;
    kvr_kv_events_config_default(&c->events);
    c->event_format = KVR_KV_FMT_VLLM_ARRAY;
    c->kv_bytes_per_block = (uint64_t)2 << 20;
    c->kv_transfer_gbps = 100.0;
    c->kv_hold_timeout_s = 30.0;
    c->kv_wait_timeout_s = 30.0;
    snprintf(c->kv_host, sizeof c->kv_host, "127.0.0.1");
}

int kvr_mocker_config_validate(const kvr_mocker_config_t *c, char *err, size_t err_len)
{
    if (!isfinite(c->speedup) || c->speedup <= 0) {
        snprintf(err, err_len, "speedup: must be a finite number > 0");
        return KVR_EINVAL;
    }
    if (c->dp_size < 1 || c->dp_size > KVR_MOCKER_MAX_DP) {
        snprintf(err, err_len, "data-parallel-size: must be in [1, %d]", KVR_MOCKER_MAX_DP);
        return KVR_EINVAL;
    }
    if (c->model[0] == '\0') {
        snprintf(err, err_len, "model: must not be empty");
        return KVR_EINVAL;
    }
    if (c->event_format != KVR_KV_FMT_VLLM_ARRAY && c->event_format != KVR_KV_FMT_VLLM_MAP) {
        snprintf(err, err_len, "event-format: must be array or map");
        return KVR_EINVAL;
    }
    if ((unsigned)c->role > KVR_MOCKER_DECODE || (unsigned)c->kv_transfer > KVR_MOCKER_BOOTSTRAP) {
        snprintf(err, err_len, "role: prefill, decode or both; kv-transfer: pull or bootstrap");
        return KVR_EINVAL;
    }
    if (!isfinite(c->kv_transfer_gbps) || c->kv_transfer_gbps <= 0) {
        snprintf(err, err_len, "kv-transfer-gbps: must be a finite number > 0");
        return KVR_EINVAL;
    }
    if (!isfinite(c->kv_hold_timeout_s) || c->kv_hold_timeout_s <= 0 ||
        !isfinite(c->kv_wait_timeout_s) || c->kv_wait_timeout_s <= 0) {
        snprintf(err, err_len, "kv-hold-timeout / kv-wait-timeout: must be finite numbers > 0");
        return KVR_EINVAL;
    }
    if (c->kv_host[0] == '\0' || strpbrk(c->kv_host, " /\\\"") != NULL) {
        snprintf(err, err_len, "kv-host: a host name or address (no space, slash or quote)");
        return KVR_EINVAL;
    }
    size_t n = 0, len;
    const char *cur = c->loras, *l;
    while (kvr_namelist_next(&cur, &l, &len)) {
        if (len == 0 || len >= 256 || ++n > MAX_LORAS ||
            (len == strlen(c->model) && memcmp(l, c->model, len) == 0)) {
            snprintf(err, err_len,
                     "lora-modules: at most %d names of 1 to 255 bytes, none the model's",
                     MAX_LORAS);
            return KVR_EINVAL;
        }
    }
    return kvr_engine_config_validate(&c->engine, err, err_len);
}

/* ---- time ------------------------------------------------------------------------------ */

uint64_t mk_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- KV events: engine -> encoder -> publisher ------------------------------------------ */

static bool scratch_fit(rank_t *rk, size_t n)
{
    if (n <= rk->scratch_cap)
        return true;
    size_t cap = rk->scratch_cap ? rk->scratch_cap : 64;
    while (cap < n)
        cap *= 2;
    uint64_t *p = realloc(rk->scratch, cap * sizeof *p);
    if (!p)
        return false;
    rk->scratch = p;
    rk->scratch_cap = cap;
    return true;
}

static void on_kv_event(void *ctx, const kvr_kvcache_event_t *ev)
{
    rank_t *rk = ctx;
    if (!rk->enc)
        return;
    int st = KVR_OK;
    if (!rk->batch_open) {
        st = kvr_kv_enc_begin_batch(rk->enc, wall_s(), true, rk->idx);
        rk->batch_open = st == KVR_OK;
    }
    if (st == KVR_OK && ev->kind != KVR_KVC_CLEARED && !scratch_fit(rk, ev->n_hashes))
        st = KVR_ENOMEM;
    if (st == KVR_OK) {
        for (size_t i = 0; ev->kind != KVR_KVC_CLEARED && i < ev->n_hashes; i++)
            rk->scratch[i] = kvr_mocker_engine_hash(ev->hashes[i]);
        uint32_t bs = rk->m->cfg.engine.block_size;
        if (ev->kind == KVR_KVC_STORED) {
            kvr_kv_enc_stored_t s = {.hashes = rk->scratch,
                                     .n_hashes = ev->n_hashes,
                                     .has_parent = ev->has_parent,
                                     .parent = kvr_mocker_engine_hash(ev->parent),
                                     .tokens = ev->tokens,
                                     .n_tokens = ev->n_hashes * bs,
                                     .block_size = bs,
                                     .medium = "GPU",
                                     .lora_name = ev->lora_name};
            st = kvr_kv_enc_add_stored(rk->enc, &s);
        } else if (ev->kind == KVR_KVC_REMOVED) {
            kvr_kv_enc_removed_t r = {.hashes = rk->scratch, .n_hashes = ev->n_hashes,
                                      .medium = "GPU"};
            st = kvr_kv_enc_add_removed(rk->enc, &r);
        } else {
            st = kvr_kv_enc_add_cleared(rk->enc);
        }
    }
    if (st != KVR_OK) {
        rk->encode_errors++;
        kvr_log_limited(&rk->m->rl_events, KVR_LOG_ERROR,
                        "rank %u: a KV event could not be encoded (%s); subscribers will miss it",
                        rk->idx, kvr_strerror(st));
    }
}

/* Publishes the events gathered since the last flush as one batch. */
static void flush_events(rank_t *rk)
{
    if (!rk->batch_open)
        return;
    rk->batch_open = false;
    const uint8_t *bytes;
    size_t len;
    if (kvr_kv_enc_n_events(rk->enc) == 0 || kvr_kv_enc_end_batch(rk->enc, &bytes, &len) != KVR_OK)
        return;
    uint32_t every = rk->m->cfg.drop_batches_every;
    if (every && (kvr_kv_pub_next_seq(rk->pub) + 1) % every == 0)
        kvr_kv_pub_drop_next(rk->pub, 1);
    int st = kvr_kv_pub_publish(rk->pub, bytes, len, NULL);
    if (st != KVR_OK) {
        rk->publish_errors++;
        kvr_log_limited(&rk->m->rl_events, KVR_LOG_WARN, "rank %u: KV event batch not sent: %s",
                        rk->idx, kvr_strerror(st));
    }
}


/* A replay request is answered as soon as it arrives, not on the next tick: a router that
 * holds live batches while it recovers a gap falls behind by every millisecond this waits.
 * ZMQ_FD is edge-triggered, so the socket is served until it has nothing readable left; past
 * a bound the rest is left for the next loop turn (event_active), so a flood of requests
 * cannot hold the engine's steps. */
static void on_replay_ready(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rank_t *rk = arg;
    for (int i = 0; i < 16; i++) {
        kvr_kv_pub_poll_replay(rk->pub);
        if (!kvr_kv_pub_replay_readable(rk->pub))
            return;
    }
    event_active(rk->replay_ev, EV_READ, 0);
}

/* The backstop: continues answers that wait for a peer at its HWM (and re-checks the socket,
 * since a send can consume the edge ZMQ_FD would have signalled). */
static void on_replay_tick(evutil_socket_t fd, short what, void *arg)
{
    kvr_mocker_t *m = arg;
    for (uint32_t r = 0; r < m->cfg.dp_size; r++)
        if (m->ranks[r].replay_ev)
            on_replay_ready(fd, what, &m->ranks[r]);
}

/* ---- replies ----------------------------------------------------------------------------- */

static void count_error(kvr_mocker_t *m, int code)
{
    int k = code == 400 ? 0 : code == 404 ? 1 : code == 413 ? 2 : code == 500 ? 3
            : code == 503 ? 4 : 5;
    m->http_errors[k]++;
}

void mk_reply_body(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *ctype,
                   const char *body, size_t len)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", ctype);
    evbuffer_drain(m->out, evbuffer_get_length(m->out));
    evbuffer_add(m->out, body, len);
    evhttp_send_reply(req, code, NULL, m->out);
}

void mk_reply_json(kvr_mocker_t *m, struct evhttp_request *req, int code)
{
    const char *body;
    size_t len;
    if (kvr_json_writer_finish(&m->w, &body, &len) != KVR_OK) {
        evhttp_send_error(req, 500, "response encoding failed");
        return;
    }
    mk_reply_body(m, req, code, "application/json", body, len);
}

void mk_reply_error(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    count_error(m, code);
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_error(&m->w, msg, NULL, code);
    mk_reply_json(m, req, code);
}

static const char *body_of(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    *len = evbuffer_get_length(b);
    /* pullup makes the body contiguous (one copy only when it arrived in pieces) */
    const char *p = (const char *)evbuffer_pullup(b, -1);
    return p ? p : "";
}

/* ---- the token stream ---------------------------------------------------------------------- */

void mk_mreq_free(mreq_t *q)
{
    if (q->text)
        evbuffer_free(q->text);
    if (q->xfer_timer)
        event_free(q->xfer_timer);
    if (q->fetch_conn) /* the fetch, if still pending, is cancelled with it */
        evhttp_connection_free(q->fetch_conn);
    free(q->tokens);
    free(q);
}

/* The request leaves the server: no callback may reach it any more. */
static void mreq_detach(mreq_t *q)
{
    evhttp_connection_set_closecb(q->conn, NULL, NULL);
    q->rk->n_live--;
    if (q->stream)
        return;
    if (q->prev)
        q->prev->next = q->next;
    else
        q->m->waiting_whole = q->next;
    if (q->next)
        q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

/* Non-streaming clients are probed for a close libevent does not watch (http/http_conn.h);
 * closing a gone one's connection runs its close callback, which cancels the request. */
static void on_sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    kvr_mocker_t *m = arg;
    mreq_t *next;
    for (mreq_t *q = m->waiting_whole; q; q = next) {
        next = q->next;
        if (kvr_http_client_gone(q->conn))
            evhttp_connection_free(q->conn);
    }
    mk_kv_sweep(m, mk_mono_ns());
}

static void fill_response(const mreq_t *q, kvr_oai_response_t *r)
{
    memset(r, 0, sizeof *r);
    r->chat = q->chat;
    r->id = q->rid;
    r->created = q->created;
    r->model = q->m->cfg.model;
    if (q->want_worker) {
        r->has_worker = true;
        r->worker.prefill_dp_rank = r->worker.decode_dp_rank = q->rk->idx;
    }
}

/* Appends one SSE event holding the writer's JSON to the chunk buffer. */
static void add_sse(kvr_mocker_t *m)
{
    const char *json;
    size_t len;
    if (kvr_json_writer_finish(&m->w, &json, &len) != KVR_OK)
        return;
    evbuffer_add(m->out, KVR_OAI_SSE_PREFIX, sizeof KVR_OAI_SSE_PREFIX - 1);
    evbuffer_add(m->out, json, len);
    evbuffer_add(m->out, KVR_OAI_SSE_SUFFIX, sizeof KVR_OAI_SSE_SUFFIX - 1);
}

/* One token's chunk; the last token's chunk, the usage chunk and [DONE] leave in one write. */
static void stream_token(mreq_t *q, const kvr_engine_output_t *o, const char *piece, size_t plen)
{
    kvr_mocker_t *m = q->m;
    kvr_oai_response_t r;
    fill_response(q, &r);
    r.text = piece;
    r.text_len = plen;
    r.first_chunk = o->first;
    bool last = o->finish != KVR_ENGINE_RUNNING;
    r.finish_reason = last ? "length" : NULL;
    evbuffer_drain(m->out, evbuffer_get_length(m->out));
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_chunk(&m->w, &r);
    add_sse(m);
    if (last && q->include_usage) {
        r.usage = (kvr_oai_usage_t){.prompt_tokens = o->prompt_tokens,
                                    .completion_tokens = o->n_output,
                                    .cached_tokens = o->cached_tokens};
        kvr_json_writer_reset(&m->w);
        kvr_oai_encode_usage_chunk(&m->w, &r);
        add_sse(m);
    }
    if (last)
        evbuffer_add(m->out, KVR_OAI_SSE_DONE, sizeof KVR_OAI_SSE_DONE - 1);
    evhttp_send_reply_chunk(q->req, m->out);
    if (last)
        evhttp_send_reply_end(q->req);
}

/* The whole answer; member (a prefill's "kv_transfer_params":{...}, or "") is added to it. */
static void finish_whole(mreq_t *q, const kvr_engine_output_t *o, const char *member)
{
    kvr_mocker_t *m = q->m;
    kvr_oai_response_t r;
    fill_response(q, &r);
    size_t tlen = evbuffer_get_length(q->text);
    r.text = (const char *)evbuffer_pullup(q->text, -1);
    r.text_len = tlen;
    r.finish_reason = "length";
    r.usage = (kvr_oai_usage_t){.prompt_tokens = o->prompt_tokens,
                                .completion_tokens = o->n_output,
                                .cached_tokens = o->cached_tokens};
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_response(&m->w, &r);
    const char *j;
    size_t jl, ml = strlen(member), n = 0;
    if (ml == 0 || kvr_json_writer_finish(&m->w, &j, &jl) != KVR_OK) {
        mk_reply_json(m, q->req, 200);
        return;
    }
    size_t cap = KVR_JSON_SPLICE_OUT_BYTES(jl, ml);
    char *buf = malloc(cap);
    if (buf != NULL && kvr_json_splice(j, jl, NULL, member, ml, buf, cap, &n) == KVR_OK)
        mk_reply_body(m, q->req, 200, "application/json", buf, n);
    else
        mk_reply_body(m, q->req, 200, "application/json", j, jl);
    free(buf);
}

static void on_output(void *ctx, const kvr_engine_output_t *o)
{
    mreq_t *q = o->user;
    kvr_mocker_t *m = q->m;
    char piece[KVR_TOYTOK_MAX_PIECE + 1];
    size_t plen = kvr_toytok_piece(o->token, piece);
    uint64_t now = mk_mono_ns();
    bool last = o->finish != KVR_ENGINE_RUNNING;
    if (o->first)
        kvr_hist_observe(&m->h_ttft, (double)(now - q->arrival_ns) * 1e-9);
    char *member = NULL;
    if (last) {
        kvr_hist_observe(&m->h_e2e, (double)(now - q->arrival_ns) * 1e-9);
        mreq_detach(q); /* before the last send: a failing write must not reach q */
        if (q->hold)
            member = mk_kv_held(q, o);
    }
    if (q->stream)
        stream_token(q, o, piece, plen);
    else {
        evbuffer_add(q->text, piece, plen);
        if (last)
            finish_whole(q, o, member != NULL ? member : "");
    }
    free(member);
    if (last)
        mk_mreq_free(q);
}

/* ---- stepping ---------------------------------------------------------------------------- */

static void kick(rank_t *rk);

static void on_step_done(evutil_socket_t fd, short what, void *arg)
{
    rank_t *rk = arg;
    uint64_t now = mk_mono_ns();
    if (now > rk->step_due_ns)
        rk->lag_s += (double)(now - rk->step_due_ns) * 1e-9;
    kvr_engine_step_end(rk->eng, on_output, rk);
    flush_events(rk);
    rk->stepping = false;
    kick(rk);
}

/* A step due this soon runs at once (from the loop, after pending I/O) instead of through a
 * timer: re-arming a timerfd costs more than a step of a few microseconds. The schedule
 * carries on from the due time, not from when the step ran, so early runs do not add up. */
#define RUN_NOW_NS 20000u

static void kick(rank_t *rk)
{
    if (rk->stepping || !kvr_engine_has_work(rk->eng))
        return;
    kvr_engine_step_t s;
    if (kvr_engine_step_begin(rk->eng, &s) != KVR_OK || s.idle) {
        flush_events(rk);
        return;
    }
    rk->stepping = true;
    double us = s.duration_ms * 1000.0 / rk->m->cfg.speedup;
    if (us > 3.6e9)
        us = 3.6e9;
    uint64_t ns = (uint64_t)(us * 1000.0), now = mk_mono_ns();
    uint64_t start = rk->step_due_ns > now ? rk->step_due_ns : now;
    rk->step_due_ns = start + ns;
    if (rk->step_due_ns <= now + RUN_NOW_NS) {
        event_active(rk->timer, EV_TIMEOUT, 1);
        return;
    }
    uint64_t wait = rk->step_due_ns - now;
    struct timeval tv = {.tv_sec = (time_t)(wait / 1000000000u),
                         .tv_usec = (suseconds_t)((wait % 1000000000u) / 1000u)};
    event_add(rk->timer, &tv);
}

/* ---- requests ---------------------------------------------------------------------------- */

static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    mreq_t *q = arg;
    if (q->phase == MQ_ENGINE)
        (void)kvr_engine_cancel(q->rk->eng, q->id);
    q->m->requests_disconnected++;
    kvr_http_release_orphan(q->req); /* http/http_conn.h */
    mreq_detach(q);
    q->req = NULL;
    if (!mk_kv_client_gone(q)) /* a fetch in flight keeps q until it ends */
        mk_mreq_free(q);
}

static bool fit_tokens(kvr_mocker_t *m, size_t n)
{
    if (n <= m->toks_cap)
        return true;
    uint32_t *p = realloc(m->toks, n * sizeof *p);
    if (!p)
        return false;
    m->toks = p;
    m->toks_cap = n;
    return true;
}

/* The prompt's token ids (tokenizing text and chat with the toy tokenizer). */
static int prompt_tokens(kvr_mocker_t *m, const kvr_oai_request_t *rq, const uint32_t **toks,
                         size_t *n)
{
    const char *text = rq->text;
    size_t len = rq->text_len;
    if (rq->prompt_kind == KVR_OAI_PROMPT_TOKENS) {
        *toks = rq->tokens;
        *n = rq->n_tokens;
        return KVR_OK;
    }
    if (rq->prompt_kind == KVR_OAI_PROMPT_MESSAGES) {
        len = kvr_oai_render_chat(rq->messages, rq->n_messages, NULL, 0);
        if (len + 1 > m->chat_cap) {
            char *p = realloc(m->chat, len + 1);
            if (!p)
                return KVR_ENOMEM;
            m->chat = p;
            m->chat_cap = len + 1;
        }
        kvr_oai_render_chat(rq->messages, rq->n_messages, m->chat, m->chat_cap);
        text = m->chat;
    }
    if (!fit_tokens(m, len + 1))
        return KVR_ENOMEM;
    int st = kvr_toytok_encode(text, len, m->cfg.engine.vocab_size, m->toks, m->toks_cap, n);
    *toks = m->toks;
    return st;
}

/* A rank from the request's headers or nvext, else the least loaded (ties rotate). */
static int pick_rank(kvr_mocker_t *m, struct evhttp_request *req, const kvr_oai_request_t *rq,
                     rank_t **out)
{
    struct evkeyvalq *h = evhttp_request_get_input_headers(req);
    const char *v = evhttp_find_header(h, "x-data-parallel-rank");
    if (!v)
        v = evhttp_find_header(h, "x-dp-rank");
    long long want = -1;
    if (v) {
        char *end;
        want = strtoll(v, &end, 10);
        if (end == v || *end != '\0' || want < 0)
            return KVR_EINVAL;
    } else if (rq->has_nvext && rq->nvext.has_dp_rank) {
        want = rq->nvext.dp_rank;
    }
    if (want >= 0) {
        if (want >= (long long)m->cfg.dp_size)
            return KVR_ERANGE;
        *out = &m->ranks[want];
        return KVR_OK;
    }
    rank_t *best = NULL;
    for (uint32_t k = 0; k < m->cfg.dp_size; k++) {
        rank_t *rk = &m->ranks[(m->rr + k) % m->cfg.dp_size];
        if (!best || rk->n_live < best->n_live)
            best = rk;
    }
    m->rr = (m->rr + 1) % m->cfg.dp_size;
    *out = best;
    return KVR_OK;
}

/* vLLM's defaults and checks of the output length against max_model_len. */
static bool check_lengths(kvr_mocker_t *m, struct evhttp_request *req,
                          const kvr_oai_request_t *rq, size_t n_prompt, uint32_t *max_tokens)
{
    uint32_t mml = kvr_engine_config(m->ranks[0].eng)->max_model_len;
    if (n_prompt == 0) {
        mk_reply_error(m, req, 400, "the prompt is empty after tokenization");
        return false;
    }
    if (n_prompt >= mml) {
        mk_reply_error(m, req, 400,
                       "This model's maximum context length is %u tokens. However, your request "
                       "has %zu input tokens. Please reduce the length of the input.",
                       mml, n_prompt);
        return false;
    }
    uint64_t room = mml - n_prompt;
    if (!rq->has_max_tokens) {
        *max_tokens = rq->endpoint == KVR_OAI_CHAT ? (uint32_t)room : (room < 16 ? (uint32_t)room : 16);
        return true;
    }
    if (rq->max_tokens > room) {
        mk_reply_error(m, req, 400,
                       "'max_tokens' or 'max_completion_tokens' is too large: %u. This model's "
                       "maximum context length is %u tokens and your request has %zu input tokens "
                       "(%u > %u - %zu).",
                       rq->max_tokens, mml, n_prompt, rq->max_tokens, mml, n_prompt);
        return false;
    }
    *max_tokens = rq->max_tokens;
    return true;
}

/* The adapter a request names as its model (NULL: the base model). */
static const char *adapter_of(const kvr_mocker_t *m, const kvr_oai_request_t *rq)
{
    for (size_t i = 0; rq->model != NULL && i < m->n_lora; i++)
        if (strcmp(rq->model, m->lora[i]) == 0)
            return m->lora[i];
    return NULL;
}

static bool check_model(kvr_mocker_t *m, struct evhttp_request *req, const kvr_oai_request_t *rq)
{
    if (!rq->model || strcmp(rq->model, m->cfg.model) == 0 || adapter_of(m, rq) != NULL)
        return true;
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(rq->model_len < 100 ? rq->model_len : 100),
             rq->model);
    mk_reply_error(m, req, 404, "The model `%s` does not exist.", name);
    return false;
}

static mreq_t *mreq_new(kvr_mocker_t *m, struct evhttp_request *req, const kvr_oai_request_t *rq,
                        rank_t *rk, size_t n_prompt)
{
    mreq_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->m = m;
    q->rk = rk;
    q->id = ++m->next_id;
    q->req = req;
    q->conn = evhttp_request_get_connection(req);
    q->chat = rq->endpoint == KVR_OAI_CHAT;
    q->stream = rq->stream;
    q->include_usage = rq->include_usage;
    q->want_worker = rq->has_nvext && rq->nvext.want_worker_id;
    q->prompt_tokens = (uint32_t)n_prompt;
    q->created = (uint64_t)time(NULL);
    q->arrival_ns = mk_mono_ns();
    kvr_oai_make_id(q->rid, q->chat, q->id);
    if (!q->stream && !(q->text = evbuffer_new())) {
        free(q);
        return NULL;
    }
    return q;
}

static void start_stream(mreq_t *q)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(q->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_send_reply_start(q->req, 200, "OK");
}

/* Queues q in its rank's engine: KVR_OK or the engine's refusal (see refusal()). */
static int engine_add(mreq_t *q, const uint32_t *toks, uint32_t n, uint32_t max_tokens,
                      const char *lora, bool kv_loaded)
{
    kvr_engine_request_t er = {.id = q->id,
                               .tokens = toks,
                               .n_tokens = n,
                               .max_tokens = max_tokens,
                               .user = q,
                               .lora_name = lora,
                               .hold_kv = q->hold,
                               .kv_loaded = kv_loaded};
    return kvr_engine_add(q->rk->eng, &er);
}

static void refusal(kvr_mocker_t *m, struct evhttp_request *req, int st)
{
    if (st == KVR_EQUEUEFULL)
        mk_reply_error(m, req, 503, "the engine's waiting queue is full (%u requests)",
                       m->cfg.engine.max_waiting);
    else
        mk_reply_error(m, req, st == KVR_ETOOBIG ? 400 : 500, "request rejected: %s",
                       kvr_strerror(st));
}

/* q's client is watched for a disconnect from here on (and counted in its rank). */
static void watch(mreq_t *q)
{
    kvr_mocker_t *m = q->m;
    q->rk->n_live++;
    evhttp_connection_set_closecb(q->conn, on_client_close, q);
    if (!q->stream) {
        q->next = m->waiting_whole;
        if (q->next)
            q->next->prev = q;
        m->waiting_whole = q;
    }
    if (q->stream)
        start_stream(q);
}

int mk_admit(mreq_t *q, bool kv_loaded)
{
    q->phase = MQ_ENGINE;
    int st = engine_add(q, q->tokens, q->n_tokens, q->max_tokens, q->lora, kv_loaded);
    if (st != KVR_OK) {
        mk_fail(q,
                st == KVR_EQUEUEFULL ? 503
                : st == KVR_ETOOBIG  ? 400
                                     : 500,
                "request rejected: %s", kvr_strerror(st));
        return st;
    }
    free(q->tokens);
    q->tokens = NULL;
    kick(q->rk);
    return KVR_OK;
}

void mk_fail(mreq_t *q, int code, const char *fmt, ...)
{
    kvr_mocker_t *m = q->m;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (q->stream) { /* the stream has begun: an error event ends it, as vLLM's does */
        evbuffer_drain(m->out, evbuffer_get_length(m->out));
        kvr_json_writer_reset(&m->w);
        kvr_oai_encode_error(&m->w, msg, NULL, code);
        add_sse(m);
        evbuffer_add(m->out, KVR_OAI_SSE_DONE, sizeof KVR_OAI_SSE_DONE - 1);
        count_error(m, code);
        mreq_detach(q);
        evhttp_send_reply_chunk(q->req, m->out);
        evhttp_send_reply_end(q->req);
    } else {
        mreq_detach(q);
        mk_reply_error(m, q->req, code, "%s", msg);
    }
    mk_mreq_free(q);
}

/* What a disaggregated role does with a request: hold its KV (prefill), fetch it first
 * (decode), or neither. False after answering an error. */
static bool disagg_plan(kvr_mocker_t *m, struct evhttp_request *req, const char *body, size_t blen,
                        kvr_disagg_req_t *d, bool *hold, bool *fetch)
{
    *hold = *fetch = false;
    memset(d, 0, sizeof *d);
    if (m->cfg.role == KVR_MOCKER_BOTH)
        return true;
    char err[200];
    if (kvr_disagg_parse_req(body, blen, d, err, sizeof err) != KVR_OK) {
        mk_reply_error(m, req, 400, "%s", err);
        return false;
    }
    bool pull = m->cfg.kv_transfer == KVR_MOCKER_PULL;
    if (m->cfg.role == KVR_MOCKER_PREFILL) {
        if (!pull && !d->has_room) { /* SGLang's prefill server refuses it */
            mk_reply_error(m, req, 400,
                           "bootstrap_room: missing (a prefill worker serves only "
                           "requests a router pairs with a decode worker)");
            return false;
        }
        *hold = pull ? d->kvt == KVR_KVT_OBJECT && d->do_remote_decode : true;
        return true;
    }
    if (!pull) {
        *fetch = d->has_room;
        if (*fetch && d->bootstrap_host[0] == '\0') {
            mk_reply_error(m, req, 400, "bootstrap_host: missing with bootstrap_room");
            return false;
        }
        return true;
    }
    *fetch = kvr_disagg_pull_ready(d);
    if (!*fetch && d->kvt == KVR_KVT_OBJECT && d->do_remote_prefill) {
        m->kv.transfers_invalid++; /* as vLLM: "will not utilize KVTransfer", recomputed */
        kvr_log_limited(&m->rl_kv, KVR_LOG_WARN,
                        "kv_transfer_params without remote_host, remote_port, remote_request_id "
                        "or remote_engine_id: the prompt is recomputed");
    }
    return true;
}

static void h_generate(kvr_mocker_t *m, struct evhttp_request *req, kvr_oai_endpoint_t ep)
{
    size_t blen;
    const char *body = body_of(req, &blen);
    kvr_oai_request_t rq;
    int st = kvr_oai_decode(m->dec, ep, body, blen, &rq);
    if (st != KVR_OK) {
        mk_reply_error(m, req, kvr_oai_http_status(st), "%s", kvr_oai_decoder_error(m->dec));
        return;
    }
    if (!check_model(m, req, &rq))
        return;
    const uint32_t *toks;
    size_t n;
    if ((st = prompt_tokens(m, &rq, &toks, &n)) != KVR_OK) {
        mk_reply_error(m, req, 500, "tokenization failed: %s", kvr_strerror(st));
        return;
    }
    uint32_t max_tokens;
    if (!check_lengths(m, req, &rq, n, &max_tokens))
        return;
    kvr_disagg_req_t d;
    bool hold, fetch;
    if (!disagg_plan(m, req, body, blen, &d, &hold, &fetch))
        return;
    rank_t *rk;
    if ((st = pick_rank(m, req, &rq, &rk)) != KVR_OK) {
        mk_reply_error(m, req, 400, "data parallel rank: must be an integer in [0, %u]",
                       m->cfg.dp_size - 1);
        return;
    }
    if (hold && d.has_room &&
        !evhttp_find_header(evhttp_request_get_input_headers(req), "x-data-parallel-rank"))
        rk = &m->ranks[d.bootstrap_room % m->cfg.dp_size]; /* SGLang's follow_bootstrap_room */
    mreq_t *q = mreq_new(m, req, &rq, rk, n);
    if (!q) {
        mk_reply_error(m, req, 500, "out of memory");
        return;
    }
    q->hold = hold;
    q->by_room = hold && d.has_room;
    q->room = d.bootstrap_room;
    if (hold)
        max_tokens = 1; /* a prefill worker computes the prompt and its first token only */
    if (fetch) {
        q->tokens = malloc(n * sizeof *q->tokens);
        if (!q->tokens) {
            mk_mreq_free(q);
            mk_reply_error(m, req, 500, "out of memory");
            return;
        }
        memcpy(q->tokens, toks, n * sizeof *toks);
        q->n_tokens = (uint32_t)n;
        q->max_tokens = max_tokens;
        q->lora = adapter_of(m, &rq);
        q->phase = MQ_FETCH;
        watch(q);
        mk_kv_fetch(q, &d);
        return;
    }
    if ((st = engine_add(q, toks, (uint32_t)n, max_tokens, adapter_of(m, &rq), false)) != KVR_OK) {
        mk_mreq_free(q);
        refusal(m, req, st);
        return;
    }
    watch(q);
    kick(rk);
}

static void h_tokenize(kvr_mocker_t *m, struct evhttp_request *req)
{
    size_t blen;
    const char *body = body_of(req, &blen);
    kvr_oai_request_t rq;
    int st = kvr_oai_decode(m->dec, KVR_OAI_TOKENIZE, body, blen, &rq);
    if (st != KVR_OK) {
        mk_reply_error(m, req, kvr_oai_http_status(st), "%s", kvr_oai_decoder_error(m->dec));
        return;
    }
    if (!check_model(m, req, &rq))
        return;
    const uint32_t *toks;
    size_t n;
    if ((st = prompt_tokens(m, &rq, &toks, &n)) != KVR_OK) {
        mk_reply_error(m, req, 500, "tokenization failed: %s", kvr_strerror(st));
        return;
    }
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_tokenize(&m->w, toks, n, kvr_engine_config(m->ranks[0].eng)->max_model_len);
    mk_reply_json(m, req, 200);
}

static void h_models(kvr_mocker_t *m, struct evhttp_request *req)
{
    kvr_oai_model_t md[1 + MAX_LORAS];
    uint64_t now = (uint64_t)time(NULL), mml = kvr_engine_config(m->ranks[0].eng)->max_model_len;
    md[0] = (kvr_oai_model_t){m->cfg.model, now, "kvrouter", mml, NULL};
    for (size_t i = 0; i < m->n_lora; i++) /* as vLLM lists its LoRA modules */
        md[1 + i] = (kvr_oai_model_t){m->lora[i], now, "kvrouter", mml, m->cfg.model};
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_models(&m->w, md, 1 + m->n_lora);
    mk_reply_json(m, req, 200);
}

static void h_reset(kvr_mocker_t *m, struct evhttp_request *req)
{
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        if (kvr_engine_in_step(m->ranks[r].eng) ||
            kvr_engine_reset_prefix_cache(m->ranks[r].eng) != KVR_OK) {
            mk_reply_error(m, req, 409, "rank %u has requests running; the prefix cache is kept",
                           r);
            return;
        }
        flush_events(&m->ranks[r]);
    }
    mk_reply_body(m, req, 200, "application/json", "{\"reset\":true}", 14);
}

/* GET /debug/kv_blocks: the engine hashes each rank's prefix cache holds, as its KV events
 * describe them (what a subscriber that saw every event must hold). */
static void h_kv_blocks(kvr_mocker_t *m, struct evhttp_request *req)
{
    kvr_json_writer_reset(&m->w);
    kvr_json_begin_object(&m->w);
    kvr_json_key(&m->w, "ranks");
    kvr_json_begin_array(&m->w);
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        const kvr_kvcache_t *kc = kvr_engine_cache(m->ranks[r].eng);
        size_t n = kvr_kvcache_cached_hashes(kc, NULL, 0);
        uint64_t *hs = malloc((n + 1) * sizeof *hs);
        if (!hs) {
            mk_reply_error(m, req, 500, "out of memory");
            return;
        }
        kvr_kvcache_cached_hashes(kc, hs, n);
        kvr_json_begin_object(&m->w);
        kvr_json_key(&m->w, "dp_rank");
        kvr_json_u64(&m->w, r);
        kvr_json_key(&m->w, "block_hashes");
        kvr_json_begin_array(&m->w);
        for (size_t i = 0; i < n; i++)
            kvr_json_u64(&m->w, kvr_mocker_engine_hash(hs[i]));
        kvr_json_end_array(&m->w);
        kvr_json_end_object(&m->w);
        free(hs);
    }
    kvr_json_end_array(&m->w);
    kvr_json_end_object(&m->w);
    mk_reply_json(m, req, 200);
}

/* ---- /metrics ------------------------------------------------------------------------------ */

static void metric_per_rank(kvr_mocker_t *m, const char *name, const char *type,
                            const char *help, const double *v)
{
    const char *suffix = strcmp(type, "counter") == 0 ? "_total" : "";
    char full[160];
    snprintf(full, sizeof full, "%s%s", name, suffix);
    kvr_prom_family(&m->prom, full, type, help); /* HELP and TYPE name the samples, as vLLM's */
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        char eng[16];
        snprintf(eng, sizeof eng, "%u", r);
        kvr_prom_label_t l[] = {{"model_name", m->cfg.model}, {"engine", eng}};
        kvr_prom_sample(&m->prom, full, l, 2, v[r]);
    }
}

enum {
    MF_RUNNING,
    MF_WAITING,
    MF_KV_USAGE,
    MF_GPU_USAGE,
    MF_PREFIX_Q,
    MF_PREFIX_H,
    MF_HIT_RATE,
    MF_PROMPT,
    MF_GEN,
    MF_PREEMPT,
    MF_SUCCESS,
    MF_CANCELLED,
    MF_STEPS,
    MF_LAG,
    MF_CACHED,
    MF_ACTIVE,
    MF_STORED,
    MF_REMOVED,
    MF_PUBLISHED,
    MF_DROPPED,
    MF_ENC_ERR,
    MF_PUB_ERR,
    MF_REPLAY_REQ,
    MF_REPLAYED,
    MF_REPLAY_TRUNC,
    MF_REPLAY_INVALID,
    MF_REPLAY_SEND_ERR,
    MF_SUBSCRIBERS,
    MF_HELD,
    MF_HELD_BLOCKS,
    MF_KV_LOADED,
    MF_KV_LOADED_TOK,
    MF_COUNT
};

static const struct {
    const char *name, *type, *help;
} MF[MF_COUNT] = {
    [MF_RUNNING] = {"vllm:num_requests_running", "gauge", "Requests in the running batch"},
    [MF_WAITING] = {"vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled"},
    [MF_KV_USAGE] = {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage (1 = 100%)"},
    [MF_GPU_USAGE] = {"vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (older name)"},
    [MF_PREFIX_Q] = {"vllm:prefix_cache_queries", "counter", "Prompt tokens looked up"},
    [MF_PREFIX_H] = {"vllm:prefix_cache_hits", "counter", "Prompt tokens found cached"},
    [MF_HIT_RATE] = {"vllm:gpu_prefix_cache_hit_rate", "gauge", "hits / queries since start"},
    [MF_PROMPT] = {"vllm:prompt_tokens", "counter", "Prompt tokens of finished prefills"},
    [MF_GEN] = {"vllm:generation_tokens", "counter", "Generated tokens"},
    [MF_PREEMPT] = {"vllm:num_preemptions", "counter", "Requests preempted (recompute)"},
    [MF_SUCCESS] = {"vllm:request_success", "counter", "Requests finished"},
    [MF_CANCELLED] = {"kvr_mocker_requests_cancelled", "counter", "Requests cancelled"},
    [MF_STEPS] = {"kvr_mocker_steps", "counter", "Engine steps run"},
    [MF_LAG] = {"kvr_mocker_step_lag_seconds", "counter",
                "Real time beyond the modelled step times (the machine could not keep up)"},
    [MF_CACHED] = {"kvr_mocker_blocks_cached", "gauge", "Blocks in the prefix cache"},
    [MF_ACTIVE] = {"kvr_mocker_blocks_active", "gauge", "Blocks held by requests"},
    [MF_STORED] = {"kvr_mocker_blocks_stored", "counter", "Blocks that entered the cache"},
    [MF_REMOVED] = {"kvr_mocker_blocks_removed", "counter", "Blocks evicted from the cache"},
    [MF_PUBLISHED] = {"kvr_mocker_kv_event_batches_published", "counter", "KV event batches"},
    [MF_DROPPED] = {"kvr_mocker_kv_event_batches_dropped", "counter",
                    "Batches numbered but not sent (--kv-events-drop-every fault injection)"},
    [MF_ENC_ERR] = {"kvr_mocker_kv_event_encode_errors", "counter", "KV events not encoded"},
    [MF_PUB_ERR] = {"kvr_mocker_kv_event_publish_errors", "counter", "Batches ZMQ refused"},
    [MF_REPLAY_REQ] = {"kvr_mocker_replay_requests", "counter", "Valid replay requests received"},
    [MF_REPLAYED] = {"kvr_mocker_replayed_batches", "counter", "Batches sent by replay"},
    [MF_REPLAY_TRUNC] = {"kvr_mocker_replay_truncated", "counter",
                         "Replay requests older than the buffer"},
    [MF_REPLAY_INVALID] = {"kvr_mocker_replay_invalid_requests", "counter",
                           "Malformed replay requests"},
    [MF_REPLAY_SEND_ERR] = {"kvr_mocker_replay_send_errors", "counter",
                            "Replay answers abandoned (the subscriber went away)"},
    [MF_SUBSCRIBERS] = {"kvr_mocker_kv_event_subscribers", "gauge",
                        "Subscriptions that have reached the KV-event publisher"},
    [MF_HELD] = {"kvr_mocker_kv_held_requests", "gauge",
                 "Finished prefills whose KV is held for a decode worker"},
    [MF_HELD_BLOCKS] = {"kvr_mocker_kv_held_blocks", "gauge", "Blocks those prefills hold"},
    [MF_KV_LOADED] = {"kvr_mocker_kv_loaded_requests", "counter",
                      "Requests admitted with their KV transferred from a prefill worker"},
    [MF_KV_LOADED_TOK] = {"kvr_mocker_kv_loaded_tokens", "counter",
                          "Prompt tokens those requests did not compute"},
};

static double metric_value(const rank_t *rk, int f, const kvr_engine_stats_t *s,
                           const kvr_kv_pub_stats_t *p)
{
    switch (f) {
    case MF_RUNNING: return s->running;
    case MF_WAITING: return s->waiting;
    case MF_KV_USAGE:
    case MF_GPU_USAGE: return s->kv_usage;
    case MF_PREFIX_Q: return (double)s->prefix_queries_tokens;
    case MF_PREFIX_H: return (double)s->prefix_hits_tokens;
    case MF_HIT_RATE:
        return s->prefix_queries_tokens
                   ? (double)s->prefix_hits_tokens / (double)s->prefix_queries_tokens : 0;
    case MF_PROMPT: return (double)s->prompt_tokens;
    case MF_GEN: return (double)s->generation_tokens;
    case MF_PREEMPT: return (double)s->preemptions;
    case MF_SUCCESS: return (double)s->requests_finished;
    case MF_CANCELLED: return (double)s->requests_cancelled;
    case MF_STEPS: return (double)s->steps;
    case MF_LAG: return rk->lag_s;
    case MF_CACHED: return s->cache.n_cached;
    case MF_ACTIVE: return s->cache.n_active;
    case MF_STORED: return (double)s->cache.stored_blocks;
    case MF_REMOVED: return (double)s->cache.removed_blocks;
    case MF_PUBLISHED: return (double)p->published;
    case MF_DROPPED: return (double)p->dropped;
    case MF_REPLAY_SEND_ERR: return (double)p->replay_send_errors;
    case MF_ENC_ERR: return (double)rk->encode_errors;
    case MF_PUB_ERR: return (double)rk->publish_errors;
    case MF_REPLAY_REQ: return (double)p->replay_requests;
    case MF_REPLAYED: return (double)p->replayed_batches;
    case MF_REPLAY_TRUNC: return (double)p->replay_truncated;
    case MF_REPLAY_INVALID: return (double)p->invalid_requests;
    case MF_SUBSCRIBERS: return (double)p->subscribers;
    case MF_HELD:
        return s->held;
    case MF_HELD_BLOCKS:
        return (double)s->held_blocks;
    case MF_KV_LOADED:
        return (double)s->kv_loaded_requests;
    case MF_KV_LOADED_TOK:
        return (double)s->kv_loaded_tokens;
    default: return 0;
    }
}

static void h_metrics(kvr_mocker_t *m, struct evhttp_request *req)
{
    kvr_prom_reset(&m->prom);
    kvr_engine_stats_t st[KVR_MOCKER_MAX_DP];
    kvr_kv_pub_stats_t ps[KVR_MOCKER_MAX_DP];
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        kvr_engine_get_stats(m->ranks[r].eng, &st[r]);
        memset(&ps[r], 0, sizeof ps[r]);
        if (m->ranks[r].pub) {
            kvr_kv_pub_poll_subscriptions(m->ranks[r].pub);
            kvr_kv_pub_get_stats(m->ranks[r].pub, &ps[r]);
        }
    }
    double v[KVR_MOCKER_MAX_DP];
    for (int f = 0; f < MF_COUNT; f++) {
        for (uint32_t r = 0; r < m->cfg.dp_size; r++)
            v[r] = metric_value(&m->ranks[r], f, &st[r], &ps[r]);
        metric_per_rank(m, MF[f].name, MF[f].type, MF[f].help, v);
    }
    /* vLLM's info gauge of its cache config, one line per engine core: a router learns the
     * cache size from it (num_gpu_blocks of block_size tokens) */
    kvr_prom_family(&m->prom, "vllm:cache_config_info", "gauge",
                    "Information of the LLMEngine CacheConfig");
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        char bs[16], nb[16], en[16];
        snprintf(bs, sizeof bs, "%u", m->cfg.engine.block_size);
        snprintf(nb, sizeof nb, "%u", m->cfg.engine.num_gpu_blocks);
        snprintf(en, sizeof en, "%u", r);
        kvr_prom_label_t cl[] = {
            {"block_size", bs},
            {"enable_prefix_caching", m->cfg.engine.enable_prefix_caching ? "True" : "False"},
            {"engine", en},
            {"num_gpu_blocks", nb}};
        kvr_prom_sample(&m->prom, "vllm:cache_config_info", cl, 4, 1.0);
    }
    kvr_prom_label_t l[] = {{"model_name", m->cfg.model}};
    kvr_prom_family(&m->prom, "vllm:time_to_first_token_seconds", "histogram",
                    "Time to first token (real time, arrival to first token sent)");
    kvr_prom_hist(&m->prom, "vllm:time_to_first_token_seconds", l, 1, &m->h_ttft);
    kvr_prom_family(&m->prom, "vllm:e2e_request_latency_seconds", "histogram",
                    "Request latency (real time)");
    kvr_prom_hist(&m->prom, "vllm:e2e_request_latency_seconds", l, 1, &m->h_e2e);
    kvr_prom_family(&m->prom, "kvr_mocker_http_errors_total", "counter", "Error replies by status");
    static const char *codes[] = {"400", "404", "413", "500", "503", "other"};
    for (int k = 0; k < 6; k++) {
        kvr_prom_label_t cl[] = {{"code", codes[k]}};
        kvr_prom_sample(&m->prom, "kvr_mocker_http_errors_total", cl, 1,
                        (double)m->http_errors[k]);
    }
    kvr_prom_family(&m->prom, "kvr_mocker_requests_disconnected_total", "counter",
                    "Requests whose client went away before the end (cancelled)");
    kvr_prom_sample(&m->prom, "kvr_mocker_requests_disconnected_total", NULL, 0,
                    (double)m->requests_disconnected);
    mk_kv_metrics(m);
    mk_reply_body(m, req, 200, "text/plain; version=0.0.4", m->prom.buf ? m->prom.buf : "",
                  m->prom.len);
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static void on_request(struct evhttp_request *req, void *arg)
{
    kvr_mocker_t *m = arg;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *path = u ? evhttp_uri_get_path(u) : NULL;
    if (!path)
        path = "/";
    bool post = cmd == EVHTTP_REQ_POST, get = cmd == EVHTTP_REQ_GET;
    if (post && strcmp(path, "/v1/completions") == 0)
        h_generate(m, req, KVR_OAI_COMPLETIONS);
    else if (post && strcmp(path, "/v1/chat/completions") == 0)
        h_generate(m, req, KVR_OAI_CHAT);
    else if (post && strcmp(path, "/tokenize") == 0)
        h_tokenize(m, req);
    else if (get && strcmp(path, "/v1/models") == 0)
        h_models(m, req);
    else if (get && strcmp(path, "/health") == 0)
        mk_reply_body(m, req, 200, "text/plain", "", 0);
    else if (get && strcmp(path, "/metrics") == 0)
        h_metrics(m, req);
    else if (get && strcmp(path, "/version") == 0)
        mk_reply_body(m, req, 200, "application/json", "{\"version\":\"" MOCKER_VERSION "\"}",
                      sizeof "{\"version\":\"" MOCKER_VERSION "\"}" - 1);
    else if (get && strcmp(path, "/debug/kv_blocks") == 0)
        h_kv_blocks(m, req);
    else if (post && strcmp(path, "/reset_prefix_cache") == 0)
        h_reset(m, req);
    else if (post && strcmp(path, "/kv/pull") == 0)
        mk_h_pull(m, req);
    else
        mk_reply_error(m, req, 404, "no route for %s %s",
                       post  ? "POST"
                       : get ? "GET"
                             : "this",
                       path);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static int rank_init(kvr_mocker_t *m, uint32_t idx, void *zmq_ctx, char *err, size_t err_len)
{
    rank_t *rk = &m->ranks[idx];
    rk->m = m;
    rk->idx = idx;
    int st;
    kvr_engine_config_t ec = m->cfg.engine;
    ec.seed = m->cfg.engine.seed + idx;
    rk->eng = kvr_engine_new(&ec, on_kv_event, rk, &st);
    if (!rk->eng) {
        snprintf(err, err_len, "engine of rank %u: %s", idx, kvr_strerror(st));
        return st;
    }
    rk->timer = evtimer_new(m->base, on_step_done, rk);
    if (!rk->timer)
        return KVR_ENOMEM;
    if (!m->cfg.events.enabled)
        return KVR_OK;
    kvr_kv_enc_config_t encc = {.format = m->cfg.event_format};
    if (!(rk->enc = kvr_kv_enc_new(&encc, &st)))
        return st;
    char ep[KVR_KVCFG_ADDR_BYTES + 16], rep[KVR_KVCFG_ADDR_BYTES + 16] = "";
    if ((st = kvr_kv_pub_endpoint_for_rank(m->cfg.events.endpoint, idx, ep, sizeof ep)) !=
            KVR_OK ||
        (m->cfg.events.replay_endpoint[0] &&
         (st = kvr_kv_pub_endpoint_for_rank(m->cfg.events.replay_endpoint, idx, rep,
                                            sizeof rep)) != KVR_OK)) {
        snprintf(err, err_len, "kv-events-config: no endpoint for rank %u (%s)", idx,
                 kvr_strerror(st));
        return KVR_EINVAL;
    }
    kvr_kv_pub_config_t pc = {.endpoint = ep,
                              .replay_endpoint = rep[0] ? rep : NULL,
                              .topic = m->cfg.events.topic,
                              .buffer_steps = m->cfg.events.buffer_steps,
                              .hwm = (int)(m->cfg.events.hwm > INT32_MAX ? INT32_MAX
                                                                         : m->cfg.events.hwm)};
    if (!(rk->pub = kvr_kv_pub_new(zmq_ctx, &pc, &st, err, err_len)))
        return st;
    int fd = kvr_kv_pub_replay_fd(rk->pub);
    if (fd >= 0) {
        rk->replay_ev = event_new(m->base, fd, EV_READ | EV_PERSIST, on_replay_ready, rk);
        if (!rk->replay_ev || event_add(rk->replay_ev, NULL) != 0)
            return KVR_ENOMEM;
    }
    return KVR_OK;
}

static int http_init(kvr_mocker_t *m, char *err, size_t err_len)
{
    if (!(m->http = evhttp_new(m->base)))
        return KVR_ENOMEM;
    evhttp_set_max_body_size(m->http, MAX_BODY_BYTES);
    evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(m->http, on_request, m);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(m->http, m->cfg.host,
                                                                    m->cfg.port);
    if (!bs) {
        snprintf(err, err_len, "port: cannot listen on %s:%u (in use, or a bad address)",
                 m->cfg.host, m->cfg.port);
        return KVR_EIO;
    }
    /* Small SSE writes must not wait for the client's delayed ACK (Nagle): accepted
     * sockets inherit the flag on Linux. vLLM's server sets it too. */
    int one = 1;
    (void)setsockopt(evhttp_bound_socket_get_fd(bs), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    m->port = kvr_http_bound_port(bs);
    return KVR_OK;
}

kvr_mocker_t *kvr_mocker_new(struct event_base *base, void *zmq_ctx,
                             const kvr_mocker_config_t *cfg, int *status, char *err,
                             size_t err_len)
{
    int st = kvr_mocker_config_validate(cfg, err, err_len);
    kvr_mocker_t *m = NULL;
    if (st != KVR_OK)
        goto fail;
    st = KVR_ENOMEM;
    snprintf(err, err_len, "out of memory");
    if (!(m = calloc(1, sizeof *m)))
        goto fail;
    m->cfg = *cfg;
    const char *cur = cfg->loras, *l;
    size_t len;
    while (m->n_lora < MAX_LORAS && kvr_namelist_next(&cur, &l, &len)) { /* validated */
        memcpy(m->lora[m->n_lora], l, len);
        m->lora[m->n_lora++][len] = '\0';
    }
    m->base = base;
    m->rl_events = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    m->rl_kv = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    kvr_json_writer_init(&m->w);
    kvr_prom_init(&m->prom);
    kvr_hist_init(&m->h_ttft, TTFT_BOUNDS, N_TTFT);
    kvr_hist_init(&m->h_e2e, E2E_BOUNDS, N_E2E);
    if (!(m->dec = kvr_oai_decoder_new(NULL)) || !(m->out = evbuffer_new()))
        goto fail;
    for (uint32_t r = 0; r < cfg->dp_size; r++)
        if ((st = rank_init(m, r, zmq_ctx, err, err_len)) != KVR_OK)
            goto fail;
    if (cfg->events.enabled && cfg->events.replay_endpoint[0]) {
        struct timeval tv = {0, REPLAY_POLL_US};
        m->replay_tick = event_new(base, -1, EV_PERSIST, on_replay_tick, m);
        if (!m->replay_tick || event_add(m->replay_tick, &tv) != 0) {
            st = KVR_ENOMEM;
            goto fail;
        }
    }
    struct timeval sweep = {0, SWEEP_US};
    m->sweep_tick = event_new(base, -1, EV_PERSIST, on_sweep_tick, m);
    if (!m->sweep_tick || event_add(m->sweep_tick, &sweep) != 0) {
        st = KVR_ENOMEM;
        goto fail;
    }
    if ((st = http_init(m, err, err_len)) != KVR_OK || (st = mk_kv_init(m, err, err_len)) != KVR_OK)
        goto fail;
    *status = KVR_OK;
    err[0] = '\0';
    return m;
fail:
    kvr_mocker_free(m);
    *status = st;
    return NULL;
}

void kvr_mocker_free(kvr_mocker_t *m)
{
    if (!m)
        return;
    if (m->http)
        evhttp_free(m->http); /* closes connections: their close callbacks free requests */
    mk_kv_free(m);
    if (m->replay_tick)
        event_free(m->replay_tick);
    if (m->sweep_tick)
        event_free(m->sweep_tick);
    for (uint32_t r = 0; r < KVR_MOCKER_MAX_DP; r++) {
        rank_t *rk = &m->ranks[r];
        if (rk->timer)
            event_free(rk->timer);
        if (rk->replay_ev)
            event_free(rk->replay_ev);
        kvr_engine_free(rk->eng);
        kvr_kv_pub_free(rk->pub);
        kvr_kv_enc_free(rk->enc);
        free(rk->scratch);
    }
    kvr_oai_decoder_free(m->dec);
    if (m->out)
        evbuffer_free(m->out);
    kvr_json_writer_deinit(&m->w);
    kvr_prom_deinit(&m->prom);
    free(m->toks);
    free(m->chat);
    free(m);
}

uint16_t kvr_mocker_port(const kvr_mocker_t *m) { return m->port; }
uint16_t kvr_mocker_bootstrap_port(const kvr_mocker_t *m) { return m->boot_port; }

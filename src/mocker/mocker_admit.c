/*
 * mocker_admit.c: the mocker's requests (mocker_admit.h): admission, the token stream, the
 * client's disconnect, and a decode request's return from its KV fetch (kv_done).
 * Invariants: see mocker_admit.h; besides, a request leaves m (mreq_detach: no callback may
 * reach it) before its last write, so a failing write cannot reach a freed request.
 * Ownership: one mreq per admitted request, freed here only (mreq_free, which also frees
 * what its KV fetch holds). Threads: the loop thread only.
 * Cost: per token one SSE chunk (or an append to the request's text); the last token's
 * chunk, the usage chunk and [DONE] leave in one write.
 */
#include "mocker/mocker_admit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/rng.h"
#include "http/http.h"
#include "kvrouter.h"
#include "mocker/mocker_kv.h"
#include "mocker/mocker_rank.h"
#include "mocker/mocker_server.h"
#include "wire/chat_conv.h"
#include "wire/json_splice.h"
#include "wire/toytok.h"

/* ---- the token stream ---------------------------------------------------------------------- */

static void mreq_free(mreq_t *q)
{
    if (q->text)
        evbuffer_free(q->text);
    mk_kv_release(q);
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
void mk_admit_sweep(kvr_mocker_t *m)
{
    mreq_t *next;
    for (mreq_t *q = m->waiting_whole; q; q = next) {
        next = q->next;
        if (kvr_http_client_gone(q->conn))
            evhttp_connection_free(q->conn);
    }
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
        kvr_reply_writer(&m->rep, q->req, 200);
        return;
    }
    size_t cap = KVR_JSON_SPLICE_OUT_BYTES(jl, ml);
    char *buf = malloc(cap);
    if (buf != NULL && kvr_json_splice(j, jl, NULL, member, ml, buf, cap, &n) == KVR_OK)
        kvr_reply_body(&m->rep, q->req, 200, "application/json", buf, n);
    else
        kvr_reply_body(&m->rep, q->req, 200, "application/json", j, jl);
    free(buf);
}

void mk_admit_on_output(void *ctx, const kvr_engine_output_t *o)
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
        mreq_free(q);
}

static void fail(mreq_t *q, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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
        mreq_free(q);
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

/* A text or chat prompt's ids with the model's own tokenizer and chat template, as vLLM makes
 * them (wire/chat_conv.h, tokenizer/model.h). KVR_OK; else err says why (the template raised,
 * what the conversation builder does not model). */
static int real_tokens(kvr_mocker_t *m, const kvr_oai_request_t *rq, const char *body,
                       size_t blen, size_t *n, char *err, size_t errlen)
{
    kvr_chat_conv_t cv;
    int st = kvr_chat_conv_build(&m->conv_w, body, blen, rq, &cv);
    if (st != KVR_OK || cv.unsupported != NULL) {
        snprintf(err, errlen, "%s", st != KVR_OK ? kvr_strerror(st) : cv.unsupported);
        return st != KVR_OK ? st : KVR_EINVAL;
    }
    kvr_tokmodel_input_t in = {.text = rq->text, .text_len = rq->text_len,
                               .add_special = cv.add_special,
                               .continue_final = cv.continue_final,
                               .final = cv.final,
                               .final_len = cv.final_len};
    if (rq->prompt_kind == KVR_OAI_PROMPT_MESSAGES)
        in.chat = (struct kvr_tmpl_input){.messages = cv.messages,
                                          .messages_len = cv.messages_len,
                                          .tools = cv.tools,
                                          .tools_len = cv.tools_len,
                                          .kwargs = cv.kwargs,
                                          .kwargs_len = cv.kwargs_len,
                                          .add_generation_prompt = cv.add_generation_prompt};
    if (!fit_tokens(m, 4096))
        return KVR_ENOMEM;
    st = kvr_tokmodel_ids(m->tok, m->tok_s, &in, m->toks, m->toks_cap, n, NULL, NULL, err,
                          errlen);
    if (st == KVR_ETOOBIG && *n > m->toks_cap) {
        if (!fit_tokens(m, *n))
            return KVR_ENOMEM;
        st = kvr_tokmodel_ids(m->tok, m->tok_s, &in, m->toks, m->toks_cap, n, NULL, NULL, err,
                              errlen);
    }
    return st;
}

/* The prompt's token ids: given, or text and chats tokenized (the model's tokenizer with
 * --tokenizer, else the toy tokenizer). */
static int prompt_tokens(kvr_mocker_t *m, const kvr_oai_request_t *rq, const char *body,
                         size_t blen, const uint32_t **toks, size_t *n, char *err,
                         size_t errlen)
{
    kvr_oai_request_t as_given;
    if (m->cfg.ignore_token_data && rq->nvext.has_token_data && rq->given_kind != 0 &&
        rq->given_kind != KVR_OAI_PROMPT_TOKENS) { /* vLLM: nvext is not read */
        as_given = *rq;
        as_given.prompt_kind = (kvr_oai_prompt_kind_t)rq->given_kind;
        rq = &as_given;
    }
    const char *text = rq->text;
    size_t len = rq->text_len;
    if (rq->prompt_kind == KVR_OAI_PROMPT_TOKENS) {
        *toks = rq->tokens;
        *n = rq->n_tokens;
        return KVR_OK;
    }
    if (m->tok != NULL) {
        int st = real_tokens(m, rq, body, blen, n, err, errlen);
        *toks = m->toks; /* after: it may have grown */
        return st;
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
    if (st != KVR_OK)
        snprintf(err, errlen, "%s", kvr_strerror(st));
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
        *max_tokens = rq->endpoint == KVR_OAI_CHAT ? (uint32_t)room
                      : room < 16                   ? (uint32_t)room
                                                    : 16;
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

/* A request's body, decoded, and its prompt's token ids (borrowed from m's buffers). */
typedef struct prompt {
    const char *body;
    size_t blen;
    kvr_oai_request_t rq;
    const uint32_t *toks;
    size_t n;
} prompt_t;

/* Decodes req's body as an ep request of a model served here, and its prompt's token ids.
 * False after answering an error. */
static bool decode_prompt(kvr_mocker_t *m, struct evhttp_request *req, kvr_oai_endpoint_t ep,
                          prompt_t *p)
{
    p->body = kvr_http_body(req, &p->blen);
    int st = kvr_oai_decode(m->dec, ep, p->body, p->blen, &p->rq);
    if (st != KVR_OK) {
        mk_reply_error(m, req, kvr_oai_http_status(st), "%s", kvr_oai_decoder_error(m->dec));
        return false;
    }
    if (!check_model(m, req, &p->rq))
        return false;
    char why[400] = "";
    if ((st = prompt_tokens(m, &p->rq, p->body, p->blen, &p->toks, &p->n, why, sizeof why)) !=
        KVR_OK) {
        /* vLLM answers a template's refusal (raise_exception) 400 */
        mk_reply_error(m, req, st == KVR_ENOMEM ? 500 : 400, "tokenization failed: %s", why);
        return false;
    }
    return true;
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
    kvr_oai_make_id(q->rid, q->chat, kvr_splitmix64(&m->id_state)); /* distinct in a process */
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

/* Adds q (MQ_FETCH or MQ_XFER, its request copied in q) to its engine: KVR_OK, or the
 * engine's refusal (answered to the client, q freed). */
static int admit(mreq_t *q, bool kv_loaded)
{
    q->phase = MQ_ENGINE;
    int st = engine_add(q, q->tokens, q->n_tokens, q->max_tokens, q->lora, kv_loaded);
    if (st != KVR_OK) {
        fail(q,
                st == KVR_EQUEUEFULL ? 503
                : st == KVR_ETOOBIG  ? 400
                                     : 500,
                "request rejected: %s", kvr_strerror(st));
        return st;
    }
    free(q->tokens);
    q->tokens = NULL;
    mk_rank_kick(q->rk);
    return KVR_OK;
}

/* Ends q's answer with an error (an error event on a stream, else the status) and frees q. */
static void fail(mreq_t *q, int code, const char *fmt, ...)
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
        mk_count_error(m, code);
        mreq_detach(q);
        evhttp_send_reply_chunk(q->req, m->out);
        evhttp_send_reply_end(q->req);
    } else {
        mreq_detach(q);
        mk_reply_error(m, q->req, code, "%s", msg);
    }
    mreq_free(q);
}

/* A decode request's KV read is over (mocker_kv.h): admit it with its KV, recompute, fail
 * or free it. */
static void on_kv_done(mreq_t *q, mk_kv_outcome_t how, const char *why)
{
    switch (how) {
    case MK_KV_LOADED:
        (void)admit(q, true);
        return;
    case MK_KV_FAILED:
        if (q->m->cfg.kv_load_recompute)
            (void)admit(q, false);
        else
            fail(q, 500, "KV transfer from prefill worker %s failed: %s", q->peer, why);
        return;
    case MK_KV_ERROR:
        fail(q, 500, "%s", why);
        return;
    case MK_KV_ABANDONED:
        mreq_free(q);
        return;
    }
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

/* The rank a request goes to (a prefill holding for a bootstrap room follows the room, as
 * SGLang's follow_bootstrap_room, unless a header names the rank). NULL after answering. */
static rank_t *choose_rank(kvr_mocker_t *m, struct evhttp_request *req,
                           const kvr_oai_request_t *rq, bool hold, const kvr_disagg_req_t *d)
{
    rank_t *rk;
    if (pick_rank(m, req, rq, &rk) != KVR_OK) {
        mk_reply_error(m, req, 400, "data parallel rank: must be an integer in [0, %u]",
                       m->cfg.dp_size - 1);
        return NULL;
    }
    if (hold && d->has_room &&
        !evhttp_find_header(evhttp_request_get_input_headers(req), "x-data-parallel-rank"))
        rk = &m->ranks[d->bootstrap_room % m->cfg.dp_size];
    return rk;
}

/* A decode worker's request whose KV is fetched first (mocker_kv.h): its engine request is
 * copied into q, admitted when the fetch ends (on_kv_done). */
static void start_fetch(mreq_t *q, const uint32_t *toks, size_t n, uint32_t max_tokens,
                        const char *lora, const kvr_disagg_req_t *d)
{
    q->tokens = malloc(n * sizeof *q->tokens);
    if (!q->tokens) {
        struct evhttp_request *req = q->req;
        kvr_mocker_t *m = q->m;
        mreq_free(q);
        mk_reply_error(m, req, 500, "out of memory");
        return;
    }
    memcpy(q->tokens, toks, n * sizeof *toks);
    q->n_tokens = (uint32_t)n;
    q->max_tokens = max_tokens;
    q->lora = lora;
    q->phase = MQ_FETCH;
    watch(q);
    mk_kv_fetch(q, d, on_kv_done);
}

void mk_admit_generate(kvr_mocker_t *m, struct evhttp_request *req, kvr_oai_endpoint_t ep)
{
    prompt_t p;
    if (!decode_prompt(m, req, ep, &p))
        return;
    const kvr_oai_request_t *rq = &p.rq;
    uint32_t max_tokens;
    if (!check_lengths(m, req, rq, p.n, &max_tokens))
        return;
    kvr_disagg_req_t d;
    bool hold, fetch;
    if (!disagg_plan(m, req, p.body, p.blen, &d, &hold, &fetch))
        return;
    rank_t *rk = choose_rank(m, req, rq, hold, &d);
    if (!rk)
        return;
    int st;
    mreq_t *q = mreq_new(m, req, rq, rk, p.n);
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
        start_fetch(q, p.toks, p.n, max_tokens, adapter_of(m, rq), &d);
        return;
    }
    st = engine_add(q, p.toks, (uint32_t)p.n, max_tokens, adapter_of(m, rq), false);
    if (st != KVR_OK) {
        mreq_free(q);
        refusal(m, req, st);
        return;
    }
    watch(q);
    mk_rank_kick(rk);
}

void mk_admit_tokenize(kvr_mocker_t *m, struct evhttp_request *req)
{
    prompt_t p;
    if (!decode_prompt(m, req, KVR_OAI_TOKENIZE, &p))
        return;
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_tokenize(&m->w, p.toks, p.n, kvr_engine_config(m->ranks[0].eng)->max_model_len);
    kvr_reply_writer(&m->rep, req, 200);
}

/*
 * fe_tokenize.c: the front end's token ids for a text or chat prompt, from a worker's
 * POST /tokenize (round-robin over the registered, unfenced workers with a url; a failed one
 * is retried on the next), cached by (model, prompt) in frontend/tokcache.c. The answer is read
 * by wire/tokenize_answer.c. Threads: the HTTP thread, like the whole front end.
 * Cost: one /tokenize round trip per cache miss; a hit costs one XXH3-128 of the prompt.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "frontend/frontend_int.h"
#include "wire/tokenize_answer.h"

/* The next tokenizer: round-robin over the registered, unfenced workers with a url not yet
 * tried for this request. */
static upool_t *pick_tokenizer(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    if (n > FE_MAX_WORKERS)
        n = FE_MAX_WORKERS;
    for (size_t k = 0; k < n; k++) {
        uint64_t id = ids[(fe->tok_rr + k) % n];
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, id);
        bool tried = false;
        for (unsigned i = 0; i < p->n_tok_tried && !tried; i++)
            tried = p->tok_tried[i] == id;
        if (sp == NULL || sp->url[0] == '\0' || tried || kvr_router_fenced(fe->r, id))
            continue;
        upool_t *u = fe_pool_for(fe, sp);
        if (u == NULL || u->bad_url)
            continue;
        fe->tok_rr += k + 1;
        return u;
    }
    return NULL;
}

/* u failed p's /tokenize (a 5xx or an answer that does not read): counted as an upstream
 * protocol error and a failure of u, and p tries the next worker (fe_start_tokenize answers
 * 503 naming why when none is left). */
static void tok_worker_failed(fe_req_t *p, upool_t *u, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tok_worker_failed(fe_req_t *p, upool_t *u, const char *fmt, ...)
{
    kvr_frontend_t *fe = p->fe;
    fe_up_count_error(fe, UPK_PROTOCOL, u->worker_id, true);
    fe_worker_failed(fe, u, UPK_PROTOCOL);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->last_fail, sizeof p->last_fail, fmt, ap);
    va_end(ap);
    fe_schedule_retry(p);
}

static void on_tok_done(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    kvr_frontend_t *fe = p->fe;
    p->up = NULL;
    fe_pool_release(p->uc);
    p->uc = NULL;
    upool_t *u = p->up_pool;
    int code = up != NULL ? evhttp_request_get_response_code(up) : 0;
    if (up == NULL || code == 0) {
        up_kind_t kind = up != NULL ? UPK_CONNECT : p->up_err_set ? p->up_err : UPK_EOF;
        fe_up_count_error(fe, kind, u->worker_id, true);
        fe_worker_failed(fe, u, kind);
        snprintf(p->last_fail, sizeof p->last_fail, "/tokenize failed with %s on worker %llu",
                 UPK_NAMES[kind], (unsigned long long)u->worker_id);
        fe_schedule_retry(p);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    size_t len = evbuffer_get_length(in);
    const char *b = len ? (const char *)evbuffer_pullup(in, -1) : "";
    if (code >= 500) { /* the worker's own failure: another one may tokenize it */
        tok_worker_failed(p, u, "/tokenize answered %d on worker %llu", code,
                          (unsigned long long)u->worker_id);
        return;
    }
    if (code != 200) { /* the worker's verdict on the prompt (too long, unknown model...) */
        u->consecutive_failures = 0;
        struct evhttp_request *c = fe_client_take(p);
        if (c != NULL) {
            const char *ct =
                evhttp_find_header(evhttp_request_get_input_headers(up), "Content-Type");
            fe_send_body(fe, c, code, ct ? ct : "application/json", b, len);
        }
        fe_req_finish(p);
        return;
    }
    size_t n_ids = 0;
    char why[160];
    int st = kvr_tokenize_answer_decode(b, len, fe->max_tokens, &fe->tok_ids, &fe->tok_cap, &n_ids,
                                        why, sizeof why);
    if (st == KVR_ETOOBIG) { /* the prompt is over the limit: the client's problem */
        fe_req_fail(p, 413, "prompt longer than router_max_prompt_tokens (%llu tokens)",
                    (unsigned long long)fe->cfg.router_max_prompt_tokens);
        return;
    }
    if (st == KVR_ENOMEM) {
        fe_req_fail(p, 500, "out of memory");
        return;
    }
    if (st != KVR_OK) { /* a broken worker: counted, and another one tries */
        kvr_log_limited(&fe->rl_proto, KVR_LOG_WARN, "worker %llu: bad /tokenize answer: %s",
                        (unsigned long long)u->worker_id, why);
        tok_worker_failed(p, u, "worker %llu answered /tokenize with %s",
                          (unsigned long long)u->worker_id, why);
        return;
    }
    u->consecutive_failures = 0;
    if (!fe_set_tokens(p, fe->tok_ids, n_ids)) {
        fe_req_fail(p, 500, "out of memory");
        return;
    }
    kvr_tokcache_put(&fe->cache, p->tok_key, fe->tok_ids, n_ids);
    p->phase = PH_START;
    fe_ids_ready(p);
}

void fe_start_tokenize(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    if (p->n_tok_tried >= 1 + fe->cfg.frontend_max_retries) {
        fe_req_fail(p, 503, "no worker could tokenize the prompt (%s)", p->last_fail);
        return;
    }
    upool_t *u = pick_tokenizer(p);
    if (u == NULL) {
        if (p->n_tok_tried > 0)
            fe_req_fail(p, 503, "no worker could tokenize the prompt (%s)", p->last_fail);
        else
            fe_req_fail(p, 503, "no worker with a url can tokenize the prompt");
        return;
    }
    p->tok_tried[p->n_tok_tried++] = u->worker_id;
    upconn_t *uc = fe_ensure_retry_ev(p) ? fe_pool_acquire(fe, u, fe->cfg.frontend_upstream_timeout_ms) : NULL;
    struct evhttp_request *up = uc ? evhttp_request_new(on_tok_done, p) : NULL;
    if (up == NULL) {
        fe_pool_release(uc);
        fe_req_fail(p, 500, "out of memory");
        return;
    }
    evhttp_request_set_error_cb(up, fe_on_up_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(up);
    evhttp_add_header(h, "Host", u->loc.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    fe_add_upstream_auth(p, h);
    evbuffer_add(evhttp_request_get_output_buffer(up), p->tok_body, p->tok_body_len);
    char path[KVR_ADDR_BYTES + 16];
    snprintf(path, sizeof path, "%s/tokenize", u->loc.base_path);
    p->phase = PH_TOKENIZE;
    p->up_pool = u;
    p->up_err_set = p->got_headers = false;
    p->up = up;
    p->uc = uc;
    fe->st.tokenize_calls++;
    /* a whole answer is buffered: bounded (lifted in on_up_header for an event stream) */
    evhttp_connection_set_max_body_size(uc->conn, (ev_ssize_t)fe->cfg.frontend_max_answer_bytes);
    if (evhttp_make_request(uc->conn, up, EVHTTP_REQ_POST, path) != 0 && p->up == up) {
        p->up = NULL;
        fe_pool_release(p->uc);
        p->uc = NULL;
        snprintf(p->last_fail, sizeof p->last_fail, "cannot connect to worker %llu",
                 (unsigned long long)u->worker_id);
        fe_schedule_retry(p);
    }
}

/* The /tokenize body and the cache key of a text or chat prompt. */
bool fe_tokenize_body(fe_req_t *p, const kvr_oai_request_t *rq)
{
    kvr_json_writer_t *w = &p->fe->w;
    XXH3_state_t *st = XXH3_createState();
    if (st == NULL)
        return false;
    XXH3_128bits_reset(st);
    uint8_t tag = (uint8_t)rq->prompt_kind;
    XXH3_128bits_update(st, &tag, 1);
    uint64_t ml = rq->model ? rq->model_len : 0;
    XXH3_128bits_update(st, &ml, sizeof ml);
    if (ml)
        XXH3_128bits_update(st, rq->model, ml);
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    if (rq->model != NULL) {
        kvr_json_key(w, "model");
        kvr_json_string_n(w, rq->model, rq->model_len);
    }
    if (rq->prompt_kind == KVR_OAI_PROMPT_TEXT) {
        kvr_json_key(w, "prompt");
        kvr_json_string_n(w, rq->text, rq->text_len);
        uint64_t tl = rq->text_len;
        XXH3_128bits_update(st, &tl, sizeof tl);
        XXH3_128bits_update(st, rq->text, rq->text_len);
    } else {
        kvr_json_key(w, "messages");
        kvr_json_begin_array(w);
        for (size_t i = 0; i < rq->n_messages; i++) {
            const kvr_oai_message_t *m = &rq->messages[i];
            kvr_json_begin_object(w);
            kvr_json_key(w, "role");
            kvr_json_string_n(w, m->role, m->role_len);
            kvr_json_key(w, "content");
            kvr_json_string_n(w, m->content, m->content_len);
            kvr_json_end_object(w);
            uint64_t l[2] = {m->role_len, m->content_len};
            XXH3_128bits_update(st, l, sizeof l);
            XXH3_128bits_update(st, m->role, m->role_len);
            XXH3_128bits_update(st, m->content, m->content_len);
        }
        kvr_json_end_array(w);
    }
    kvr_json_end_object(w);
    p->tok_key = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    const char *j;
    size_t jl;
    if (kvr_json_writer_finish(w, &j, &jl) != KVR_OK || (p->tok_body = malloc(jl)) == NULL)
        return false;
    memcpy(p->tok_body, j, jl);
    p->tok_body_len = jl;
    return true;
}

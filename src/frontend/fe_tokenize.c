/*
 * fe_tokenize.c: the front end's token ids for a text or chat prompt, from a worker's
 * POST /tokenize (round-robin over the registered, unfenced workers with a url; a failed one
 * is retried on the next, by the state machine from its timer), cached by (model, prompt) in
 * frontend/tokcache.c. The answer is read by wire/tokenize_answer.c.
 * Invariants: each fe_tokenize_start ends in exactly one call of its done callback (maybe
 * before it returns); p->up holds the call in between; a worker is asked once a request.
 * Ownership: the ids handed to done are fe->tok_ids (scratch, valid until the next answer is
 * read); the cache keeps its own copy. Threads: the HTTP thread, like the whole front end.
 * Cost: one /tokenize round trip per cache miss; a hit costs one XXH3-128 of the prompt.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "frontend/fe_models.h"
#include "frontend/fe_tokenize.h"
#include "wire/tokenize_answer.h"

/* The request's model, or NULL when it named none. */
static const char *model_of(const fe_req_t *p)
{
    return p->prompt.model != NULL && p->prompt.model[0] != '\0' ? p->prompt.model : NULL;
}

/* The next tokenizer: round-robin over the registered, unfenced workers with a url that serve
 * the request's model (its tokenizer) and were not tried for this request yet. */
static upool_t *pick_tokenizer(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    const char *model = model_of(p);
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    if (n > FE_MAX_WORKERS)
        n = FE_MAX_WORKERS;
    for (size_t k = 0; k < n; k++) {
        uint64_t id = ids[(fe->tok_rr + k) % n];
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, id);
        bool tried = false;
        for (unsigned i = 0; i < p->prompt.n_tok_tried && !tried; i++)
            tried = p->prompt.tok_tried[i] == id;
        if (sp == NULL || sp->url[0] == '\0' || tried || kvr_router_fenced(fe->r, id) ||
            !fe_models_serves(fe, sp, model))
            continue;
        upool_t *u = fe_pool_for(fe, sp);
        if (u == NULL || u->bad_url)
            continue;
        fe->tok_rr += k + 1;
        return u;
    }
    return NULL;
}

static void tok_again(fe_req_t *p, fe_tok_done_fn done)
{
    fe_tok_result_t r = {.st = FE_TOK_AGAIN};
    done(p, &r);
}

static void tok_fail(fe_req_t *p, fe_tok_done_fn done, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void tok_fail(fe_req_t *p, fe_tok_done_fn done, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fe_tok_result_t r = {.st = FE_TOK_FAIL, .status = status, .body = msg, .len = strlen(msg)};
    done(p, &r);
}

/* u failed p's /tokenize (a 5xx or an answer that does not read): counted as an upstream
 * protocol error and a failure of u, and p tries the next worker (fe_tokenize_start answers
 * 503 naming why when none is left). */
static void tok_worker_failed(fe_req_t *p, fe_tok_done_fn done, upool_t *u, const char *fmt,
                              ...) __attribute__((format(printf, 4, 5)));
static void tok_worker_failed(fe_req_t *p, fe_tok_done_fn done, upool_t *u, const char *fmt,
                              ...)
{
    kvr_frontend_t *fe = p->fe;
    fe_up_count_error(fe, UPK_PROTOCOL, u->worker_id, true);
    fe_worker_failed(fe, u, UPK_PROTOCOL);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->route.last_fail, sizeof p->route.last_fail, fmt, ap);
    va_end(ap);
    tok_again(p, done);
}

/* The call's end, as libevent reports it (arg: the request; done: the callback
 * fe_tokenize_start was given, kept in p->prompt.tok_done). */
static void on_tok_done(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    kvr_frontend_t *fe = p->fe;
    fe_tok_done_fn done = p->prompt.tok_done;
    p->up.req = NULL;
    fe_pool_release(p->up.uc);
    p->up.uc = NULL;
    upool_t *u = p->up.pool;
    int code = up != NULL ? evhttp_request_get_response_code(up) : 0;
    if (up == NULL || code == 0) {
        up_kind_t kind = up != NULL ? UPK_CONNECT : p->up.err_set ? p->up.err : UPK_EOF;
        fe_up_count_error(fe, kind, u->worker_id, true);
        fe_worker_failed(fe, u, kind);
        snprintf(p->route.last_fail, sizeof p->route.last_fail,
                 "/tokenize failed with %s on worker %llu", UPK_NAMES[kind],
                 (unsigned long long)u->worker_id);
        tok_again(p, done);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    size_t len = evbuffer_get_length(in);
    const char *b = len ? (const char *)evbuffer_pullup(in, -1) : "";
    if (code >= 500) { /* the worker's own failure: another one may tokenize it */
        tok_worker_failed(p, done, u, "/tokenize answered %d on worker %llu", code,
                          (unsigned long long)u->worker_id);
        return;
    }
    if (code != 200) { /* the worker's verdict on the prompt (too long, unknown model...) */
        u->consecutive_failures = 0;
        const char *ct = evhttp_find_header(evhttp_request_get_input_headers(up), "Content-Type");
        fe_tok_result_t r = {.st = FE_TOK_ANSWER, .status = code,
                             .ctype = ct ? ct : "application/json", .body = b, .len = len};
        done(p, &r);
        return;
    }
    size_t n_ids = 0;
    char why[160];
    int st = kvr_tokenize_answer_decode(b, len, fe->max_tokens, &fe->tok_ids, &fe->tok_cap, &n_ids,
                                        why, sizeof why);
    if (st == KVR_ETOOBIG) { /* the prompt is over the limit: the client's problem */
        tok_fail(p, done, 413, "prompt longer than router_max_prompt_tokens (%llu tokens)",
                 (unsigned long long)fe->cfg.router_max_prompt_tokens);
        return;
    }
    if (st == KVR_ENOMEM) {
        tok_fail(p, done, 500, "out of memory");
        return;
    }
    if (st != KVR_OK) { /* a broken worker: counted, and another one tries */
        kvr_log_limited(&fe->rl_proto, KVR_LOG_WARN, "worker %llu: bad /tokenize answer: %s",
                        (unsigned long long)u->worker_id, why);
        tok_worker_failed(p, done, u, "worker %llu answered /tokenize with %s",
                          (unsigned long long)u->worker_id, why);
        return;
    }
    u->consecutive_failures = 0;
    kvr_tokcache_put(&fe->cache, p->prompt.tok_key, fe->tok_ids, n_ids);
    fe_tok_result_t r = {.st = FE_TOK_IDS, .ids = fe->tok_ids, .n = n_ids};
    done(p, &r);
}

/* No worker to ask at all: 404 for a model none serves (naming those served), else 503 with
 * why (none registered, none with a url, all fenced). */
static void fail_no_tokenizer(fe_req_t *p, fe_tok_done_fn done)
{
    kvr_frontend_t *fe = p->fe;
    const char *model = model_of(p);
    char why[600];
    if (model != NULL && !fe_models_served(fe, model) && kvr_router_worker_ids(fe->r, NULL, 0)) {
        fe_models_names(fe, why, sizeof why);
        tok_fail(p, done, 404, "The model `%s` does not exist%s%s", model,
                 why[0] ? "; the workers serve: " : "", why);
        return;
    }
    fe_models_why_none(fe, model, why, sizeof why);
    tok_fail(p, done, 503, "no worker can tokenize the prompt: %s", why);
}

void fe_tokenize_start(fe_req_t *p, fe_tok_done_fn done)
{
    kvr_frontend_t *fe = p->fe;
    if (p->prompt.n_tok_tried >= 1 + fe->cfg.frontend_max_retries) {
        tok_fail(p, done, 503, "no worker could tokenize the prompt (%s)", p->route.last_fail);
        return;
    }
    upool_t *u = pick_tokenizer(p);
    if (u == NULL) {
        if (p->prompt.n_tok_tried > 0)
            tok_fail(p, done, 503, "no worker could tokenize the prompt (%s)",
                     p->route.last_fail);
        else
            fail_no_tokenizer(p, done);
        return;
    }
    p->prompt.tok_tried[p->prompt.n_tok_tried++] = u->worker_id;
    upconn_t *uc = fe_pool_acquire(fe, u, fe->cfg.frontend_upstream_timeout_ms);
    struct evhttp_request *up = uc ? evhttp_request_new(on_tok_done, p) : NULL;
    if (up == NULL) {
        fe_pool_release(uc);
        tok_fail(p, done, 500, "out of memory");
        return;
    }
    evhttp_request_set_error_cb(up, fe_on_up_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(up);
    evhttp_add_header(h, "Host", u->loc.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    fe_up_add_auth(fe, p->client.auth, h);
    evbuffer_add(evhttp_request_get_output_buffer(up), p->prompt.tok_body,
                 p->prompt.tok_body_len);
    char path[KVR_ADDR_BYTES + 16];
    snprintf(path, sizeof path, "%s/tokenize", u->loc.base_path);
    p->prompt.tok_done = done;
    p->up.pool = u;
    p->up.err_set = p->up.got_headers = false;
    p->up.req = up;
    p->up.uc = uc;
    fe->st.tokenize_calls++;
    /* a whole answer is buffered: bounded */
    evhttp_connection_set_max_body_size(uc->conn, (ev_ssize_t)fe->cfg.frontend_max_answer_bytes);
    if (evhttp_make_request(uc->conn, up, EVHTTP_REQ_POST, path) != 0 && p->up.req == up) {
        p->up.req = NULL;
        fe_pool_release(p->up.uc);
        p->up.uc = NULL;
        snprintf(p->route.last_fail, sizeof p->route.last_fail, "cannot connect to worker %llu",
                 (unsigned long long)u->worker_id);
        tok_again(p, done);
    }
}

/* The members of a chat body that change its prompt: vLLM's /tokenize takes them all. */
static const char *const CHAT_MEMBERS[] = {"messages",      "tools",
                                           "chat_template_kwargs", "add_generation_prompt",
                                           "add_special_tokens",   "continue_final_message",
                                           "chat_template",        "documents"};

/* The /tokenize body and the cache key of a text or chat prompt: the model, then the text
 * (decoded) or the chat body's prompt-making members as the client wrote them (the engine
 * reads them as it reads the chat request); the key is the body's XXH3-128, seeded with the
 * prompt's kind. */
bool fe_tokenize_body(fe_req_t *p, const kvr_oai_request_t *rq, const char *body, size_t len)
{
    kvr_json_writer_t *w = &p->fe->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    if (rq->model != NULL) {
        kvr_json_key(w, "model");
        kvr_json_string_n(w, rq->model, rq->model_len);
    }
    if (rq->prompt_kind == KVR_OAI_PROMPT_TEXT) {
        kvr_json_key(w, "prompt");
        kvr_json_string_n(w, rq->text, rq->text_len);
    }
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, body, len, kvr_json_skip_ws(body, len, 0), KVR_JSON_LENIENT);
    bool chat = rq->prompt_kind == KVR_OAI_PROMPT_MESSAGES;
    while (kvr_json_object_next(&it, &m) == 1) {
        for (size_t k = 0; k < sizeof CHAT_MEMBERS / sizeof CHAT_MEMBERS[0]; k++) {
            if ((chat || k == 4) && kvr_json_key_is(body, &m, CHAT_MEMBERS[k])) {
                kvr_json_key(w, CHAT_MEMBERS[k]);
                kvr_json_raw(w, body + m.val, m.val_end - m.val);
                break;
            }
        }
    }
    kvr_json_end_object(w);
    const char *j;
    size_t jl;
    if (kvr_json_writer_finish(w, &j, &jl) != KVR_OK || (p->prompt.tok_body = malloc(jl)) == NULL)
        return false;
    memcpy(p->prompt.tok_body, j, jl);
    p->prompt.tok_body_len = jl;
    p->prompt.tok_key = XXH3_128bits_withSeed(j, jl, (XXH64_hash_t)rq->prompt_kind);
    return true;
}

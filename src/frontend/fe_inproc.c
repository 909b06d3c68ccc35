/*
 * fe_inproc.c: in-process tokenization for the front end (fe_inproc.h): the models of the
 * tokenizers setting and of registrations, their probes against a worker's /tokenize, and
 * their counters.
 * Invariants: fe->tms[0..n_tms) are loaded models with distinct names; a model has at most one
 * load pending (fe->tok_pend) and none once loaded; a model's probe is
 * in flight (probe != NULL) at most once; a model is used here only when its state allows it
 * (usable()). Ownership: the front end owns the models, their scratch and the probes; a probe's
 * connection is its own (freed with it: no callback after). Threads: the HTTP thread; a
 * registration's tokenizer is loaded on a job thread (http/offloop.h) that touches only its
 * fe_tokpend, and is abandoned, never waited for, when the front end goes.
 * Cost: a prompt costs a render (chats) and an encode, no allocation once the buffers have
 * grown, but the template's output (one malloc a chat); a conversation's earlier messages come
 * from the model scratch's segment cache (tokenizer.h), counted in /metrics; a probe two calls
 * of a few hundred bytes per model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/clock.h"
#include "frontend/fe_inproc.h"
#include "base/grow.h"
#include "http/http.h"
#include "kvrouter/router.h"
#include "tokenizer/model.h"
#include "wire/chat_conv.h"
#include "wire/tokenize_answer.h"

/* What a model's probe found. */
typedef enum probe_state {
    PROBE_WAITING,     /* no worker with a url yet */
    PROBE_RUNNING,     /* asking one */
    PROBE_SAME,        /* the worker's ids equal ours */
    PROBE_DIFFERENT,   /* they differ (note says where) */
    PROBE_NO_TOKENIZE, /* the worker has no /tokenize (nothing to compare) */
    PROBE_OFF,         /* tokenizer_check = off */
} probe_state_t;
static const char *const PROBE_NAMES[] = {"waiting",   "running",     "same",
                                          "different", "no_tokenize", "off"};
#define N_PROBE_STATES 6

typedef struct probe probe_t;

struct fe_tokmodel {
    char name[KVR_MODEL_BYTES];
    char dir[1024];
    kvr_tokmodel_t *m;
    kvr_tokmodel_scratch_t *s;
    probe_state_t state;
    char note[320]; /* the probe's finding, for the log and a refusal */
    probe_t *probe;
    size_t bytes; /* kvr_tokmodel_bytes */
};

/* A tokenizer folder named by a registration, loading off the loop (fe->tok_pend). The job's
 * thread writes m, status and why, and reads only dir. */
struct fe_tokpend {
    kvr_frontend_t *fe;
    char name[KVR_MODEL_BYTES];
    char dir[KVR_ADDR_BYTES];
    kvr_offloop_t *job;
    kvr_tokmodel_t *m;
    int status;
    char why[512];
};

/* The text probe: scripts, digits, whitespace runs, contractions, special-token text. */
static const char PROBE_TEXT[] =
    "Hello  world! It's 2026-11-28, 12345 tokens\t\tlater:\n\n  caf\xc3\xa9 na\xc3\xafve "
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c \xd0\x9f\xd1\x80\xd0\xb8"
    "\xd0\xb2\xd0\xb5\xd1\x82 \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd <|im_start|> <s> [INST]   ";
/* The chat probe: a system prompt and two turns, as the tokenize body's messages. */
static const char PROBE_MESSAGES[] =
    "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
    "{\"role\":\"user\",\"content\":\"What is 2+2? Answer briefly.\"},"
    "{\"role\":\"assistant\",\"content\":\"4.\"},"
    "{\"role\":\"user\",\"content\":\"And in words, \\u00e9l\\u00e8ve?\"}]";

struct probe {
    kvr_frontend_t *fe;
    fe_tokmodel_t *tm;
    uint64_t worker_id;
    struct evhttp_connection *conn;
    char host_hdr[320];
    char path[KVR_ADDR_BYTES + 16];
    int step; /* 0: the text probe, 1: the chat probe */
};

/* ---------------------------------------------------------------------------------------- */
/* Loading */

static bool usable(const kvr_frontend_t *fe, const fe_tokmodel_t *tm)
{
    switch (tm->state) {
    case PROBE_SAME:
    case PROBE_NO_TOKENIZE:
    case PROBE_OFF:
        return true;
    case PROBE_DIFFERENT:
        return fe->cfg.tokenizer_check == KVR_TOKCHECK_WARN;
    default:
        return false;
    }
}

/* A loaded model m named name from dir, appended to fe->tms (m and its scratch are the front
 * end's from here; freed here on failure). */
static int add_model(kvr_frontend_t *fe, const char *name, size_t name_len, const char *dir,
                     kvr_tokmodel_t *m, char *err, size_t errlen)
{
    fe_tokmodel_t *tm = calloc(1, sizeof *tm);
    if (tm == NULL ||
        kvr_grow((void **)&fe->tms, &fe->cap_tms, fe->n_tms + 1, SIZE_MAX, sizeof *fe->tms) !=
            KVR_OK ||
        (tm->s = kvr_tokmodel_scratch_new(m)) == NULL) {
        free(tm);
        kvr_tokmodel_free(m);
        snprintf(err, errlen, "out of memory");
        return KVR_ENOMEM;
    }
    memcpy(tm->name, name, name_len);
    snprintf(tm->dir, sizeof tm->dir, "%s", dir);
    tm->m = m;
    tm->bytes = kvr_tokmodel_bytes(m);
    tm->state = fe->cfg.tokenizer_check == KVR_TOKCHECK_OFF ? PROBE_OFF : PROBE_WAITING;
    fe->tms[fe->n_tms++] = tm;
    kvr_log(KVR_LOG_INFO, "tokenizer: model %s from %s (%zu MB, vocabulary %zu%s)%s", tm->name,
            tm->dir, tm->bytes >> 20, kvr_tok_vocab_size(kvr_tokmodel_tok(m)),
            kvr_tokmodel_has_chat(m) ? ", chat template" : ", no chat template",
            tm->state == PROBE_OFF ? "" : "; checked against the first worker's /tokenize");
    return KVR_OK;
}

/* One "MODEL=DIR" entry (len bytes at e) of the tokenizers setting, loaded now (start-up). */
static int load_one(kvr_frontend_t *fe, const char *e, size_t len, char *err, size_t errlen)
{
    const char *eq = memchr(e, '=', len);
    size_t ml = (size_t)(eq - e), dl = len - ml - 1;
    char dir[1024];
    if (ml >= KVR_MODEL_BYTES || dl >= sizeof dir) {
        snprintf(err, errlen, "tokenizers: '%.*s': the model name or folder is too long",
                 (int)len, e);
        return KVR_EINVAL;
    }
    memcpy(dir, eq + 1, dl);
    dir[dl] = '\0';
    int st;
    char why[512];
    kvr_tokmodel_t *m = kvr_tokmodel_load(dir, &st, why, sizeof why);
    if (m == NULL) {
        snprintf(err, errlen, "tokenizers: model %.*s: %s", (int)ml, e, why);
        return st;
    }
    return add_model(fe, e, ml, dir, m, err, errlen);
}

static const double TOKENIZE_BUCKETS[] = {1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                                          2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2, 0.1};

int fe_inproc_init(kvr_frontend_t *fe, char *err, size_t errlen)
{
    kvr_json_writer_init(&fe->conv_w);
    kvr_hist_init(&fe->h_tokenize, TOKENIZE_BUCKETS,
                  sizeof TOKENIZE_BUCKETS / sizeof TOKENIZE_BUCKETS[0]);
    fe->rl_tok = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    const char *v = fe->cfg.tokenizers;
    size_t n = *v != '\0';
    for (const char *q = v; *q; q++)
        n += *q == ',';
    if (n == 0)
        return KVR_OK;
    while (*v != '\0') {
        const char *end = strchr(v, ',');
        size_t len = end != NULL ? (size_t)(end - v) : strlen(v);
        int rc = load_one(fe, v, len, err, errlen);
        if (rc != KVR_OK)
            return rc;
        v += len + (end != NULL);
    }
    return KVR_OK;
}

static void probe_free(probe_t *pr)
{
    if (pr == NULL)
        return;
    pr->tm->probe = NULL;
    if (pr->conn != NULL)
        evhttp_connection_free(pr->conn);
    free(pr);
}

void fe_inproc_free(kvr_frontend_t *fe)
{
    for (size_t i = 0; i < fe->n_tok_pend; i++) /* never waited for: they end alone */
        kvr_offloop_abandon(fe->tok_pend[i]->job);
    free(fe->tok_pend);
    fe->tok_pend = NULL;
    fe->n_tok_pend = fe->cap_tok_pend = 0;
    for (size_t i = 0; i < fe->n_tms; i++) {
        probe_free(fe->tms[i]->probe);
        kvr_tokmodel_scratch_free(fe->tms[i]->s);
        kvr_tokmodel_free(fe->tms[i]->m);
        free(fe->tms[i]);
    }
    free(fe->tms);
    fe->tms = NULL;
    fe->n_tms = fe->cap_tms = 0;
    kvr_json_writer_deinit(&fe->conv_w);
}

static fe_tokmodel_t *find(kvr_frontend_t *fe, const char *model, size_t len)
{
    for (size_t i = 0; i < fe->n_tms; i++)
        if (strlen(fe->tms[i]->name) == len && memcmp(fe->tms[i]->name, model, len) == 0)
            return fe->tms[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Encoding */

/* fe->tok_ids holding at least n ids. */
static bool fit_ids(kvr_frontend_t *fe, size_t n)
{
    if (n <= fe->tok_cap)
        return true;
    uint32_t *p = realloc(fe->tok_ids, n * sizeof *p);
    if (p == NULL)
        return false;
    fe->tok_ids = p;
    fe->tok_cap = n;
    return true;
}

/* The ids of in into fe->tok_ids: KVR_OK with *n, or the model's status with msg. */
static int encode(kvr_frontend_t *fe, fe_tokmodel_t *tm, const kvr_tokmodel_input_t *in,
                  size_t *n, char *msg, size_t msglen)
{
    size_t cap = fe->max_tokens + 1;
    if (!fit_ids(fe, cap < 4096 ? cap : 4096))
        return KVR_ENOMEM;
    int rc = kvr_tokmodel_ids(tm->m, tm->s, in, fe->tok_ids, fe->tok_cap, n, NULL, NULL, msg,
                              msglen);
    if (rc == KVR_ETOOBIG && *n > fe->tok_cap && *n <= fe->max_tokens) { /* grow, once */
        if (!fit_ids(fe, *n))
            return KVR_ENOMEM;
        rc = kvr_tokmodel_ids(tm->m, tm->s, in, fe->tok_ids, fe->tok_cap, n, NULL, NULL, msg,
                              msglen);
    }
    return rc;
}

static fe_inproc_status_t declined(kvr_frontend_t *fe, int why)
{
    fe->tok_declined[why]++;
    return FE_INPROC_DECLINED;
}

fe_inproc_status_t fe_inproc_ids(kvr_frontend_t *fe, const kvr_oai_request_t *rq,
                                 const char *body, size_t len, size_t *n, int *status,
                                 char *msg, size_t msglen)
{
    fe_tokmodel_t *tm = rq->model != NULL ? find(fe, rq->model, rq->model_len) : NULL;
    if (tm == NULL)
        return FE_INPROC_DECLINED;
    if (!usable(fe, tm))
        return declined(fe, tm->state == PROBE_DIFFERENT ? FE_TOKD_REFUSED : FE_TOKD_PENDING);
    bool chat = rq->prompt_kind == KVR_OAI_PROMPT_MESSAGES;
    if (chat && !kvr_tokmodel_has_chat(tm->m))
        return declined(fe, FE_TOKD_NO_TEMPLATE);
    uint64_t t0 = kvr_now_ns();
    kvr_chat_conv_t cv;
    int rc = kvr_chat_conv_build(&fe->conv_w, body, len, rq, &cv);
    if (rc == KVR_OK && cv.unsupported != NULL) {
        kvr_log_limited(&fe->rl_tok, KVR_LOG_INFO,
                        "tokenizer: model %s: a request with %s is tokenized by a worker",
                        tm->name, cv.unsupported);
        return declined(fe, FE_TOKD_UNSUPPORTED);
    }
    if (rc != KVR_OK) {
        *status = 500;
        snprintf(msg, msglen, "%s", kvr_strerror(rc));
        return FE_INPROC_FAIL;
    }
    kvr_tokmodel_input_t in = {.text = rq->text, .text_len = rq->text_len,
                               .add_special = cv.add_special,
                               .continue_final = cv.continue_final,
                               .final = cv.final,
                               .final_len = cv.final_len};
    if (chat)
        in.chat = (struct kvr_tmpl_input){.messages = cv.messages,
                                          .messages_len = cv.messages_len,
                                          .tools = cv.tools,
                                          .tools_len = cv.tools_len,
                                          .kwargs = cv.kwargs,
                                          .kwargs_len = cv.kwargs_len,
                                          .add_generation_prompt = cv.add_generation_prompt};
    char why[400] = "";
    rc = encode(fe, tm, &in, n, why, sizeof why);
    if (rc == KVR_OK) {
        kvr_hist_observe(&fe->h_tokenize, (double)(kvr_now_ns() - t0) / 1e9);
        fe->tok_path[FE_TOKP_INPROC]++;
        fe->tok_tokens += *n;
        return FE_INPROC_IDS;
    }
    if (rc == KVR_ETOOBIG && *n > fe->max_tokens) {
        *status = 413;
        snprintf(msg, msglen, "prompt longer than router_max_prompt_tokens (%llu tokens)",
                 (unsigned long long)fe->cfg.router_max_prompt_tokens);
    } else {
        /* the template refused the conversation (raise_exception, a limit): the engine
         * answers such a request 400 with the same message */
        *status = rc == KVR_ENOMEM ? 500 : 400;
        snprintf(msg, msglen, "chat template: %s", why);
    }
    return FE_INPROC_FAIL;
}

/* ---------------------------------------------------------------------------------------- */
/* The probe */

/* Our ids for the probe of this step into fe->tok_ids; false when we cannot make them. */
static bool our_probe_ids(kvr_frontend_t *fe, fe_tokmodel_t *tm, int step, size_t *n)
{
    kvr_tokmodel_input_t in = {.text = PROBE_TEXT, .text_len = sizeof PROBE_TEXT - 1,
                               .add_special = -1};
    if (step == 1)
        in.chat = (struct kvr_tmpl_input){.messages = PROBE_MESSAGES,
                                          .messages_len = sizeof PROBE_MESSAGES - 1,
                                          .add_generation_prompt = true};
    char why[400];
    return encode(fe, tm, &in, n, why, sizeof why) == KVR_OK;
}

static void probe_done(probe_t *pr, probe_state_t st)
{
    fe_tokmodel_t *tm = pr->tm;
    kvr_frontend_t *fe = pr->fe;
    tm->state = st;
    if (st == PROBE_SAME)
        kvr_log(KVR_LOG_INFO, "tokenizer: model %s: same ids as worker %llu's /tokenize on the "
                "probes; prompts are tokenized in the router", tm->name,
                (unsigned long long)pr->worker_id);
    else if (st == PROBE_NO_TOKENIZE)
        kvr_log(KVR_LOG_WARN, "tokenizer: model %s: %s; prompts are tokenized in the router, "
                "unchecked", tm->name, tm->note);
    else if (st == PROBE_DIFFERENT)
        kvr_log(fe->cfg.tokenizer_check == KVR_TOKCHECK_WARN ? KVR_LOG_WARN : KVR_LOG_ERROR,
                "tokenizer: model %s differs from worker %llu's /tokenize: %s; %s", tm->name,
                (unsigned long long)pr->worker_id, tm->note,
                fe->cfg.tokenizer_check == KVR_TOKCHECK_WARN
                    ? "tokenizer_check = warn: tokenized in the router all the same"
                    : "its prompts go to the workers' /tokenize (tokenizer_check = refuse)");
    else if (st == PROBE_WAITING)
        kvr_log_limited(&fe->rl_tok, KVR_LOG_WARN,
                        "tokenizer: model %s: the probe of worker %llu failed (%s); the next "
                        "worker registered is asked", tm->name,
                        (unsigned long long)pr->worker_id, tm->note);
    probe_free(pr);
}

static void probe_send(probe_t *pr);

/* Compares the worker's answer with ours: the first differing position in the note. */
static void probe_compare(probe_t *pr, const char *b, size_t len)
{
    kvr_frontend_t *fe = pr->fe;
    fe_tokmodel_t *tm = pr->tm;
    uint32_t *theirs = NULL;
    size_t cap = 0, nt = 0, no = 0;
    char why[160];
    if (kvr_tokenize_answer_decode(b, len, 1u << 16, &theirs, &cap, &nt, why, sizeof why) !=
        KVR_OK) {
        snprintf(tm->note, sizeof tm->note, "its /tokenize answer does not read: %s", why);
        free(theirs);
        probe_done(pr, PROBE_WAITING);
        return;
    }
    if (!our_probe_ids(fe, tm, pr->step, &no)) {
        snprintf(tm->note, sizeof tm->note, "the %s probe does not tokenize here",
                 pr->step ? "chat" : "text");
        free(theirs);
        probe_done(pr, PROBE_DIFFERENT);
        return;
    }
    size_t i = 0;
    while (i < no && i < nt && fe->tok_ids[i] == theirs[i])
        i++;
    if (i < no || i < nt) {
        snprintf(tm->note, sizeof tm->note,
                 "the %s probe differs at token %zu of %zu (router %lld, worker %lld; %zu "
                 "worker ids)", pr->step ? "chat" : "text", i, no,
                 i < no ? (long long)fe->tok_ids[i] : -1LL, i < nt ? (long long)theirs[i] : -1LL,
                 nt);
        free(theirs);
        probe_done(pr, PROBE_DIFFERENT);
        return;
    }
    free(theirs);
    if (pr->step == 0 && kvr_tokmodel_has_chat(tm->m)) {
        pr->step = 1;
        probe_send(pr);
        return;
    }
    probe_done(pr, PROBE_SAME);
}

static void on_probe(struct evhttp_request *up, void *arg)
{
    probe_t *pr = arg;
    int code = up != NULL ? evhttp_request_get_response_code(up) : 0;
    if (code == 404 || code == 405 || code == 501) {
        snprintf(pr->tm->note, sizeof pr->tm->note,
                 "worker %llu has no /tokenize (it answered %d)",
                 (unsigned long long)pr->worker_id, code);
        probe_done(pr, PROBE_NO_TOKENIZE);
        return;
    }
    if (code != 200) {
        snprintf(pr->tm->note, sizeof pr->tm->note, "%s %d", code ? "it answered" : "no answer",
                 code);
        probe_done(pr, PROBE_WAITING);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    size_t len = evbuffer_get_length(in);
    probe_compare(pr, len ? (const char *)evbuffer_pullup(in, -1) : "", len);
}

/* The step's POST /tokenize, as the front end sends a prompt's. */
static void probe_send(probe_t *pr)
{
    kvr_frontend_t *fe = pr->fe;
    struct evhttp_request *up = evhttp_request_new(on_probe, pr);
    if (up == NULL) {
        snprintf(pr->tm->note, sizeof pr->tm->note, "out of memory");
        probe_done(pr, PROBE_WAITING);
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(up);
    evhttp_add_header(h, "Host", pr->host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    fe_up_add_auth(fe, NULL, h);
    kvr_json_writer_t *w = &fe->conv_w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "model");
    kvr_json_string(w, pr->tm->name);
    if (pr->step == 0) {
        kvr_json_key(w, "prompt");
        kvr_json_string_n(w, PROBE_TEXT, sizeof PROBE_TEXT - 1);
    } else {
        kvr_json_key(w, "messages");
        kvr_json_raw(w, PROBE_MESSAGES, sizeof PROBE_MESSAGES - 1);
        kvr_json_key(w, "add_generation_prompt");
        kvr_json_bool(w, true);
    }
    kvr_json_end_object(w);
    const char *j;
    size_t jl;
    if (kvr_json_writer_finish(w, &j, &jl) != KVR_OK ||
        evbuffer_add(evhttp_request_get_output_buffer(up), j, jl) != 0 ||
        evhttp_make_request(pr->conn, up, EVHTTP_REQ_POST, pr->path) != 0) {
        snprintf(pr->tm->note, sizeof pr->tm->note, "cannot send the probe");
        probe_done(pr, PROBE_WAITING);
    }
}

/* Probes tm's tokenizer against worker w's /tokenize (w serves tm's model and has a url). */
static void probe_start(kvr_frontend_t *fe, fe_tokmodel_t *tm, const kvr_worker_spec_t *w)
{
    if (tm->state != PROBE_WAITING || tm->probe != NULL)
        return;
    upool_t *u = fe_pool_for(fe, w);
    probe_t *pr = u != NULL && !u->bad_url ? calloc(1, sizeof *pr) : NULL;
    if (pr == NULL)
        return;
    struct timeval tv = {.tv_sec = 10};
    *pr = (probe_t){.fe = fe, .tm = tm, .worker_id = w->worker_id,
                    .conn = fe_new_conn(fe, u, &tv)};
    snprintf(pr->host_hdr, sizeof pr->host_hdr, "%s", u->loc.host_hdr);
    snprintf(pr->path, sizeof pr->path, "%s/tokenize", u->loc.base_path);
    tm->probe = pr;
    tm->state = PROBE_RUNNING;
    if (pr->conn == NULL) {
        snprintf(tm->note, sizeof tm->note, "out of memory");
        probe_done(pr, PROBE_WAITING);
        return;
    }
    probe_send(pr);
}

/* ---------------------------------------------------------------------------------------- */
/* Tokenizers named by registrations, loaded off the loop (http/offloop.h) */

static struct fe_tokpend *pending(kvr_frontend_t *fe, const char *model)
{
    for (size_t i = 0; i < fe->n_tok_pend; i++)
        if (strcmp(fe->tok_pend[i]->name, model) == 0)
            return fe->tok_pend[i];
    return NULL;
}

/* The first registered worker of tm's model with a url probes it. */
static void probe_registered(kvr_frontend_t *fe, fe_tokmodel_t *tm)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    for (size_t i = 0; i < n && i < FE_MAX_WORKERS && tm->state == PROBE_WAITING; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp != NULL && sp->url[0] != '\0' && strcmp(sp->model, tm->name) == 0)
            probe_start(fe, tm, sp);
    }
}

/* On the load's thread. */
static void load_work(void *arg)
{
    struct fe_tokpend *pd = arg;
    pd->m = kvr_tokmodel_load(pd->dir, &pd->status, pd->why, sizeof pd->why);
}

/* The front end went first (shutdown): what was loaded goes with the job. */
static void load_drop(void *arg)
{
    struct fe_tokpend *pd = arg;
    kvr_tokmodel_free(pd->m);
    free(pd);
}

/* On the loop: the model joins the front end's, and is probed. */
static void load_done(void *arg)
{
    struct fe_tokpend *pd = arg;
    kvr_frontend_t *fe = pd->fe;
    for (size_t i = 0; i < fe->n_tok_pend; i++)
        if (fe->tok_pend[i] == pd) {
            fe->tok_pend[i] = fe->tok_pend[--fe->n_tok_pend];
            break;
        }
    char err[600];
    kvr_tokmodel_t *m = pd->m;
    if (m == NULL) {
        fe->tok_loads[1]++;
        kvr_log(KVR_LOG_ERROR, "tokenizer: model %s: %s from a worker registration could not "
                "be loaded (%s: %s); its prompts go to the workers' /tokenize", pd->name,
                pd->dir, kvr_strerror(pd->status), pd->why);
    } else if (find(fe, pd->name, strlen(pd->name)) != NULL) {
        kvr_tokmodel_free(m); /* the tokenizers setting named it meanwhile: that one stays */
    } else if (add_model(fe, pd->name, strlen(pd->name), pd->dir, m, err, sizeof err) != KVR_OK) {
        fe->tok_loads[1]++;
        kvr_log(KVR_LOG_ERROR, "tokenizer: model %s: %s", pd->name, err);
    } else {
        fe->tok_loads[0]++;
        probe_registered(fe, fe->tms[fe->n_tms - 1]);
    }
    free(pd);
}

/* w names a tokenizer folder for its model, which has none yet: loaded off the loop. */
static void load_named(kvr_frontend_t *fe, const kvr_worker_spec_t *w)
{
    if (pending(fe, w->model) != NULL)
        return;
    struct fe_tokpend *pd = calloc(1, sizeof *pd);
    int st = KVR_ENOMEM;
    if (pd != NULL && kvr_grow((void **)&fe->tok_pend, &fe->cap_tok_pend, fe->n_tok_pend + 1,
                               SIZE_MAX, sizeof *fe->tok_pend) == KVR_OK) {
        *pd = (struct fe_tokpend){.fe = fe};
        snprintf(pd->name, sizeof pd->name, "%s", w->model);
        snprintf(pd->dir, sizeof pd->dir, "%s", w->tokenizer);
        kvr_offloop_job_t job = {.work = load_work, .done = load_done, .drop = load_drop,
                                 .arg = pd};
        pd->job = kvr_offloop_start(fe->base, &job, &st);
    }
    if (pd == NULL || pd->job == NULL) {
        fe->tok_loads[1]++;
        kvr_log(KVR_LOG_ERROR, "tokenizer: model %s: loading %s could not start (%s)", w->model,
                w->tokenizer, kvr_strerror(st));
        free(pd);
        return;
    }
    fe->tok_pend[fe->n_tok_pend++] = pd;
    kvr_log(KVR_LOG_INFO, "tokenizer: model %s: loading %s (named by worker %llu); its prompts "
            "go to the workers' /tokenize until it is loaded and checked", w->model, w->tokenizer,
            (unsigned long long)w->worker_id);
}

void fe_inproc_worker_added(kvr_frontend_t *fe, const kvr_worker_spec_t *w)
{
    fe_tokmodel_t *tm = find(fe, w->model, strlen(w->model));
    if (tm != NULL && w->tokenizer[0] != '\0' && strcmp(tm->dir, w->tokenizer) != 0)
        kvr_log_limited(&fe->rl_tok, KVR_LOG_WARN,
                        "tokenizer: worker %llu names %s for model %s, which is tokenized from "
                        "%s (the tokenizers setting): that one is kept",
                        (unsigned long long)w->worker_id, w->tokenizer, w->model, tm->dir);
    if (tm == NULL && w->tokenizer[0] != '\0' && w->model[0] != '\0')
        load_named(fe, w);
    if (tm != NULL && w->url[0] != '\0')
        probe_start(fe, tm, w);
}

/* ---------------------------------------------------------------------------------------- */
/* Metrics */

/* Each model's segment cache (tokenizer.h): the text between special tokens, kept by content. */
static void segcache_metrics(kvr_frontend_t *fe, struct kvr_prom *p)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kvr_frontend_tokenizer_segment_cache_hits_total", "counter",
         "Segments of text between special tokens (64 bytes or more) whose ids the in-process "
         "tokenizer's segment cache held."},
        {"kvr_frontend_tokenizer_segment_cache_misses_total", "counter",
         "Segments of text between special tokens (64 bytes or more) the in-process tokenizer "
         "encoded."},
        {"kvr_frontend_tokenizer_segment_cache_evictions_total", "counter",
         "Segments dropped from the segment cache to make room."},
        {"kvr_frontend_tokenizer_segment_cache_served_tokens_total", "counter",
         "Token ids the segment cache returned instead of encoding."},
        {"kvr_frontend_tokenizer_segment_cache_tokens", "gauge",
         "Token ids the segment cache holds."},
        {"kvr_frontend_tokenizer_segment_cache_capacity_tokens", "gauge",
         "The segment cache's bound, in token ids."},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        kvr_prom_family(p, fam[f].name, fam[f].type, fam[f].help);
        for (size_t i = 0; i < fe->n_tms; i++) {
            kvr_tok_cache_stats_t st;
            kvr_tok_scratch_cache_stats(kvr_tokmodel_scratch_tok(fe->tms[i]->s), &st);
            const uint64_t v[] = {st.hits,          st.misses, st.evictions,
                                  st.tokens_served, st.tokens, st.capacity};
            kvr_prom_label_t l = {"model", fe->tms[i]->name};
            kvr_prom_sample(p, fam[f].name, &l, 1, (double)v[f]);
        }
    }
}

void fe_inproc_metrics(kvr_frontend_t *fe, struct kvr_prom *p)
{
    kvr_prom_by_t path[] = {{"inprocess", (double)fe->tok_path[FE_TOKP_INPROC]},
                            {"worker", (double)fe->tok_path[FE_TOKP_WORKER]},
                            {"cache", (double)fe->tok_path[FE_TOKP_CACHE]}};
    kvr_prom_by_label(p, "kvr_frontend_tokenize_total", "counter",
                      "Text and chat prompts tokenized, by where their ids came from.", "path",
                      path, KVR_PROM_N(path));
    kvr_prom_counter(p, "kvr_frontend_tokenize_inprocess_tokens_total",
                     "Token ids made by the in-process tokenizers.", (double)fe->tok_tokens);
    kvr_prom_family(p, "kvr_frontend_tokenize_inprocess_seconds", "histogram",
                    "In-process tokenization of one prompt (chat template and encoding).");
    kvr_prom_hist(p, "kvr_frontend_tokenize_inprocess_seconds", NULL, 0, &fe->h_tokenize);
    kvr_prom_by_t dec[] = {{"probe_pending", (double)fe->tok_declined[FE_TOKD_PENDING]},
                           {"probe_refused", (double)fe->tok_declined[FE_TOKD_REFUSED]},
                           {"unsupported", (double)fe->tok_declined[FE_TOKD_UNSUPPORTED]},
                           {"no_chat_template", (double)fe->tok_declined[FE_TOKD_NO_TEMPLATE]}};
    kvr_prom_by_label(p, "kvr_frontend_tokenize_inprocess_declined_total", "counter",
                      "Prompts of an in-process model sent to a worker's /tokenize instead, by "
                      "reason.", "reason", dec, KVR_PROM_N(dec));
    kvr_prom_by_t loads[] = {{"loaded", (double)fe->tok_loads[0]},
                             {"failed", (double)fe->tok_loads[1]}};
    kvr_prom_by_label(p, "kvr_frontend_tokenizer_loads_total", "counter",
                      "Tokenizer folders named by worker registrations, loaded off the serving "
                      "thread, by result.", "result", loads, KVR_PROM_N(loads));
    kvr_prom_gauge(p, "kvr_frontend_tokenizer_loads_pending",
                   "Tokenizer folders named by worker registrations being loaded now.",
                   (double)fe->n_tok_pend);
    if (fe->n_tms == 0)
        return;
    kvr_prom_family(p, "kvr_frontend_tokenizer_probe", "gauge",
                    "In-process tokenizers: 1 for the state of each model's probe against a "
                    "worker's /tokenize.");
    for (size_t i = 0; i < fe->n_tms; i++) {
        for (int s = 0; s < N_PROBE_STATES; s++) {
            kvr_prom_label_t l[2] = {{"model", fe->tms[i]->name}, {"state", PROBE_NAMES[s]}};
            kvr_prom_sample(p, "kvr_frontend_tokenizer_probe", l, 2,
                            fe->tms[i]->state == (probe_state_t)s ? 1.0 : 0.0);
        }
    }
    kvr_prom_family(p, "kvr_frontend_tokenizer_bytes", "gauge",
                    "Memory held by each in-process tokenizer.");
    for (size_t i = 0; i < fe->n_tms; i++) {
        kvr_prom_label_t l = {"model", fe->tms[i]->name};
        kvr_prom_sample(p, "kvr_frontend_tokenizer_bytes", &l, 1, (double)fe->tms[i]->bytes);
    }
    segcache_metrics(fe, p);
}

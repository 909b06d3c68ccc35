/*
 * fe_disagg.c: disaggregated prefill/decode in the OpenAI front end (docs/disagg.md), as the
 * leg planner of fe_disagg.h: the request state machine (frontend.c) runs the legs, this file
 * says what they are.
 *
 * A request of a fleet with prefill workers is placed twice, through the same scheduler:
 * first on the prefill pool (KV-aware, booked without active blocks: its KV leaves), then on
 * the decode pool with the reference's decode overrides (overlap credit 0, assume_kv_reuse and
 * track_prefill_tokens off). The prefill worker's registration picks the wire convention:
 *   pull (vLLM, no bootstrap_port)  the prefill leg (stream false, max_tokens 1,
 *       kv_transfer_params {"do_remote_decode":true,...}) runs first and alone; its answer's
 *       kv_transfer_params go verbatim into the decode leg (no parameters: the decode worker
 *       recomputes; an answer already complete, EOS on its one token, is the client's answer);
 *   bootstrap (SGLang, bootstrap_port) the same body, with bootstrap_host, bootstrap_port and
 *       a bootstrap_room (room mod dp_size = the prefill rank), goes to both: the prefill call
 *       runs in the background (fe_bg_t, holding the prefill booking until it answers), the
 *       decode call is the request's own.
 * Each leg is a fe_leg_t the machine runs as it runs an aggregated request (d->pf_leg says
 * which one is current); failures before the first byte are retried within the leg (the
 * pools are disjoint, so one tried list serves both). When the prefill leg cannot go on (no
 * prefill worker left, retries spent, a 5xx or broken answer) the request is served
 * aggregated on the decode pool (a NEXT verdict with the whole request as the leg), or
 * refused 503 with enforce_disagg. Switching legs continues from the request's timer.
 *
 * States (kvr_router_disagg_state): pending (no prefill worker ever: an aggregated fleet),
 * active, unavailable (every prefill worker gone or fenced); transitions are logged once and
 * counted. Conditional disaggregation (disagg_policy) keeps a request local when the best
 * decode worker's cache leaves few new tokens (isl) or every prefill worker is busy (load).
 *
 * A client that leaves after its prefill (pull) but before its decode leg reached a decode
 * worker would leave the KV held on the prefill worker until that engine's timeout: a release
 * call (a decode request with max_tokens 1 and the prefill's parameters, answer dropped) makes
 * a decode worker read it at once (orphan, on FE_REL_CANCEL).
 *
 * Invariants: a request has a part (p->dis) only when planned disaggregated, taken from
 * fe->dfree (or made) at fe_plan_first and returned at FE_REL_END; p->leg mirrors the part
 * (leg_sync, at every hook's end: its body is d->leg_body). A background call (fe_bg_t: a
 * bootstrap prefill, or a release) is in fe->bgs from its start to its end; while a
 * bootstrap call's request lives, d->bg and g->owner point at each other, and the call holds
 * the prefill booking (its handle, moved from p->route) until it ends. Ownership: the front
 * end owns the calls and the idle parts; a part's bodies are its request's. Threads: the HTTP
 * thread. Cost: a leg body is one pass over the client's body; an aggregated request costs a
 * pointer test a hook (and the pool counters at its placement).
 */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "frontend/fe_body.h"
#include "base/clock.h"
#include "frontend/fe_disagg.h"
#include "frontend/fe_upstream.h"
#include "wire/disagg.h"

/* seconds: 1 ms to 60 s */
static const double PREFILL_BUCKETS[] = {1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                                         0.5,  1,      2.5,  5,    10,     30,   60};
#define N_PREFILL_BUCKETS (sizeof PREFILL_BUCKETS / sizeof PREFILL_BUCKETS[0])

static const char *const BYPASS_NAMES[FDB_COUNT] = {"unavailable", "isl", "load",
                                                     "prefill_failed"};
static const char *const PREFILL_NAMES[FDP_COUNT] = {"ok", "terminal", "no_params", "bad_params",
                                                      "error"};

/* What the prefill leg of the pull convention carries (vLLM's proxy, field for field). */
static const char PULL_KVT[] =
    "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
    "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,"
    "\"remote_port\":null}";
static const char *const PULL_DROP[] = {"stream",     "stream_options", "max_tokens",
                                        "max_completion_tokens", "min_tokens",
                                        "min_completion_tokens", "kv_transfer_params", NULL};
static const char *const DECODE_DROP[] = {"kv_transfer_params", NULL};
static const char *const BOOT_DROP[] = {"bootstrap_host", "bootstrap_port", "bootstrap_room",
                                        NULL};

/* How a request is served. */
typedef enum fe_dmode {
    FD_AGG = 0,   /* by one worker (the policy kept it local, or its prefill fell back) */
    FD_PULL,      /* vLLM: the prefill worker first, then the decode worker with its
                     kv_transfer_params */
    FD_BOOTSTRAP, /* SGLang: both at once, with a bootstrap room */
} fe_dmode_t;

/* A disaggregated request's part (p->dis). */
struct fe_dreq {
    fe_dreq_t *next_free; /* fe->dfree while idle */
    fe_dmode_t dmode;
    bool pf_leg;          /* the current leg is the prefill's (its booking and call) */
    bool has_pf;          /* pf: the prefill worker that served (or serves) it */
    kvr_worker_t pf;
    uint64_t pf_start_ns;
    char *leg_body;       /* the current leg's body when it is not p's forward body (owned) */
    size_t leg_body_len;
    fe_bg_t *bg;          /* bootstrap: its prefill call (NULL when none or finished) */
    char *kvt;            /* pull: the prefill answer's kv_transfer_params (owned) */
    size_t kvt_len;
    char *rel_base;       /* pull: the body for a release call, kept when its client left */
    size_t rel_base_len;
};

struct fe_bg {
    kvr_frontend_t *fe;
    fe_bg_t *prev, *next;
    bool release;    /* an orphan's release call (else a bootstrap prefill call) */
    fe_req_t *owner; /* NULL once its request ended (a release call has none) */
    upool_t *pool;
    upconn_t *uc;
    struct evhttp_request *up;
    bool failed;
    kvr_req_handle_t handle; /* the prefill booking it holds; KVR_REQ_HANDLE_NONE: none */
    kvr_worker_t worker;
};

static void verdict_fail(fe_verdict_t *v, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void verdict_fail(fe_verdict_t *v, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    v->step = FE_STEP_FAIL;
    v->status = status;
}

/* ---- the parts ------------------------------------------------------------------------------ */

static fe_dreq_t *dreq_get(kvr_frontend_t *fe)
{
    fe_dreq_t *d = fe->dfree;
    if (d != NULL)
        fe->dfree = d->next_free;
    else if ((d = malloc(sizeof *d)) == NULL)
        return NULL;
    *d = (fe_dreq_t){0};
    return d;
}

static void dreq_put(kvr_frontend_t *fe, fe_dreq_t *d)
{
    free(d->leg_body);
    free(d->kvt);
    free(d->rel_base);
    d->leg_body = d->kvt = d->rel_base = NULL;
    d->next_free = fe->dfree;
    fe->dfree = d;
}

/* p->leg from p's part: the leg the machine runs next. */
static void leg_sync(fe_req_t *p)
{
    const fe_dreq_t *d = p->dis;
    if (d->dmode == FD_AGG) {
        fe_leg_whole(p);
        return;
    }
    const kvr_router_config_t *cfg = &p->fe->cfg;
    p->leg = (fe_leg_t){
        .shape = d->pf_leg ? kvr_route_req_prefill_leg : kvr_route_req_decode_leg,
        .pin = d->pf_leg ? &p->hints.pf : &p->hints.worker,
        .body = d->leg_body,
        .body_len = d->leg_body_len,
        .silence_ms = d->pf_leg ? cfg->frontend_prefill_timeout_ms
                                : cfg->frontend_upstream_timeout_ms,
        .may_stream = !d->pf_leg,
        /* pull: a prefill's call goes on until it answers (its KV is then released), a
         * decode's until the worker answers (it has then read the KV, and is closed) */
        .keep = d->dmode != FD_PULL ? FE_KEEP_NONE
                : d->pf_leg         ? FE_KEEP_TO_ANSWER
                                    : FE_KEEP_TO_HEADERS,
    };
}

/* ---- the pool's state ------------------------------------------------------------------ */

kvr_disagg_state_t fe_disagg_tick(kvr_frontend_t *fe)
{
    kvr_disagg_state_t st = kvr_router_disagg_state(fe->r);
    if ((int)st == fe->dstate)
        return st;
    fe->ds.transitions[st]++;
    kvr_log(st == KVR_DISAGG_UNAVAILABLE ? KVR_LOG_WARN : KVR_LOG_INFO,
            "prefill pool %s -> %s (%zu prefill workers registered, %zu serving): %s",
            kvr_disagg_state_name((kvr_disagg_state_t)fe->dstate), kvr_disagg_state_name(st),
            kvr_router_n_role(fe->r, KVR_ROLE_PREFILL, false),
            kvr_router_n_role(fe->r, KVR_ROLE_PREFILL, true),
            st == KVR_DISAGG_ACTIVE     ? "requests are prefilled remotely"
            : fe->cfg.enforce_disagg    ? "requests are refused (enforce_disagg)"
                                        : "requests are served aggregated on the decode pool");
    fe->dstate = (int)st;
    return st;
}

/* ---- planning ------------------------------------------------------------------------------ */

/* p's prompt as a route request that only looks (no id, no booking, no pool settings). */
static kvr_route_req_t look_req(const fe_req_t *p)
{
    return (kvr_route_req_t){.tokens = p->prompt.tokens,
                             .n_tokens = p->prompt.n_tokens,
                             .model = p->prompt.model,
                             .model_len = p->prompt.model_len,
                             .lora_name = p->hints.lora,
                             .lora_name_len = p->hints.lora_len,
                             .mm = p->prompt.mm,
                             .n_mm = p->prompt.n_mm};
}

/* disagg_policy: the reason p stays local, or -1. */
static int policy_bypass(fe_req_t *p)
{
    kvr_route_req_t q = look_req(p);
    switch (kvr_router_disagg_bypass(p->fe->r, &q, kvr_now_ms())) {
    case KVR_BYPASS_ISL:
        return FDB_ISL;
    case KVR_BYPASS_LOAD:
        return FDB_LOAD;
    default:
        return -1;
    }
}

static void serve_aggregated(fe_req_t *p)
{
    if (p->dis != NULL) {
        p->dis->dmode = FD_AGG;
        p->dis->pf_leg = false;
    }
    p->fe->ds.mode[FD_AGG]++;
}

/* The first leg: the prefill's when the fleet has a serving prefill pool and the policy
 * sends p there, else the whole request; a refusal for pins that name no such worker and,
 * with enforce_disagg, for want of a prefill pool. */
static void plan_first(fe_req_t *p, fe_verdict_t *v)
{
    kvr_frontend_t *fe = p->fe;
    kvr_disagg_state_t st = fe_disagg_tick(fe); /* transitions logged as they are seen */
    if (p->hints.worker.has && kvr_router_worker(fe->r, p->hints.worker.worker) == NULL) {
        /* the client named a worker: one that is not registered is its error, as for the
         * prefill worker below */
        verdict_fail(v, 400, "worker %" PRIu64 " is not registered (named by "
                             "x-worker-instance-id, x-decode-instance-id, "
                             "nvext.backend_instance_id or nvext.decode_worker_id)",
                     p->hints.worker.worker);
        return;
    }
    if (p->hints.pf.has) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, p->hints.pf.worker);
        if (sp == NULL || sp->role != KVR_ROLE_PREFILL) {
            verdict_fail(v, 400, "x-prefill-instance-id: worker %" PRIu64 " is not a registered "
                                 "prefill worker (role=prefill)", p->hints.pf.worker);
            return;
        }
    }
    if (st != KVR_DISAGG_ACTIVE) {
        if (fe->cfg.enforce_disagg) {
            fe->ds.refused_enforced++;
            verdict_fail(v, 503, "no prefill worker is serving (the prefill pool is %s) and "
                                 "enforce_disagg is set", kvr_disagg_state_name(st));
            return;
        }
        if (st == KVR_DISAGG_UNAVAILABLE)
            fe->ds.bypass[FDB_UNAVAILABLE]++;
        serve_aggregated(p);
        return;
    }
    int why = fe->cfg.disagg_policy != KVR_DISAGG_ALWAYS && !p->hints.pf.has ? policy_bypass(p)
                                                                            : -1;
    if (why >= 0) {
        fe->ds.bypass[why]++;
        serve_aggregated(p);
        return;
    }
    if (fe->cfg.router_mode == KVR_MODE_DIRECT && !p->hints.pf.has) {
        /* the gateway picks both legs' workers (the reference's direct mode errs here too) */
        verdict_fail(v, 400, "router_mode direct: a disaggregated request names its prefill "
                             "worker (x-prefill-instance-id or nvext.prefill_worker_id)");
        return;
    }
    fe_dreq_t *d = dreq_get(fe);
    if (d == NULL) {
        verdict_fail(v, 500, "out of memory");
        return;
    }
    p->dis = d;
    d->dmode = FD_PULL; /* the prefill worker's registration decides at its placement */
    d->pf_leg = true;
}

void fe_plan_first(fe_req_t *p, fe_verdict_t *v)
{
    v->step = FE_STEP_GO;
    plan_first(p, v);
    if (p->dis != NULL)
        leg_sync(p);
}

static void count_pool(fe_req_t *p, int pool, uint64_t cached)
{
    fe_dstats_t *d = &p->fe->ds;
    d->pool_routed[pool]++;
    d->pool_prompt_tokens[pool] += p->prompt.n_tokens;
    d->pool_cached_tokens[pool] += cached < p->prompt.n_tokens ? cached : p->prompt.n_tokens;
}

/* ---- the bootstrap prefill call ------------------------------------------------------------ */

static void bg_free(fe_bg_t *g)
{
    kvr_frontend_t *fe = g->fe;
    if (g->up != NULL) { /* dropped: its connection closes, the engine aborts the request */
        evhttp_request_set_error_cb(g->up, NULL);
        evhttp_cancel_request(g->up);
        g->up = NULL;
    }
    fe_pool_release(g->uc);
    if (g->prev)
        g->prev->next = g->next;
    else
        fe->bgs = g->next;
    if (g->next)
        g->next->prev = g->prev;
    if (g->owner != NULL)
        g->owner->dis->bg = NULL;
    kvr_req_handle_t h = g->handle;
    free(g);
    if (h != KVR_REQ_HANDLE_NONE) /* last: the queue may place a request, which may start a call */
        (void)kvr_sched_release(fe->sched, h, kvr_now_ms());
}

static int bg_header(struct evhttp_request *up, void *arg)
{
    fe_bg_t *g = arg;
    if (evhttp_request_get_response_code(up) == 200 && g->handle != KVR_REQ_HANDLE_NONE)
        (void)kvr_sched_first_token(g->fe->sched, g->handle, kvr_now_ms()); /* prefill done */
    if (g->pool != NULL)
        g->pool->consecutive_failures = 0;
    return 0;
}

static void bg_error(enum evhttp_request_error err, void *arg)
{
    (void)err;
    ((fe_bg_t *)arg)->failed = true;
}

/* A bootstrap prefill call failed while its request's decode call waits for a room that
 * will not come: the machine drops that call (fe->leg_lost), and the pair is placed again,
 * elsewhere, from the prefill leg. */
static void bg_lost(fe_bg_t *g, fe_req_t *p)
{
    fe_dreq_t *d = p->dis;
    p->fe->leg_lost(p); /* its call dropped, its booking freed, placed again from the timer */
    if (p->route.n_tried < FE_MAX_ATTEMPTS)
        p->route.tried[p->route.n_tried++] = g->worker.worker_id;
    snprintf(p->route.last_fail, sizeof p->route.last_fail, "the bootstrap prefill on worker %"
             PRIu64 " failed", g->worker.worker_id);
    bg_free(g);
    d->pf_leg = true;
    d->has_pf = false;
    leg_sync(p);
}

/* The prefill call's end: read to the end and dropped (the decode worker's answer is the
 * client's). A failure before the decode worker answered restarts the pair elsewhere. */
static void bg_done(struct evhttp_request *up, void *arg)
{
    fe_bg_t *g = arg;
    kvr_frontend_t *fe = g->fe;
    g->up = NULL; /* libevent frees it after this call */
    fe_pool_release(g->uc);
    g->uc = NULL;
    int code = up != NULL ? evhttp_request_get_response_code(up) : 0;
    if (g->release) {
        fe->ds.orphans[code == 200 ? 0 : 1]++;
        if (code != 200)
            kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN,
                            "release call on decode worker %" PRIu64 " failed (%s%d): the "
                            "prefill worker frees that KV by its own timeout",
                            g->worker.worker_id, code ? "status " : "no answer, ", code);
        bg_free(g);
        return;
    }
    if (code == 200) {
        fe->ds.prefill[FDP_OK]++;
        bg_free(g);
        return;
    }
    fe->ds.bg_failed++;
    fe->ds.prefill[FDP_ERROR]++;
    kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN, "bootstrap prefill on worker %" PRIu64
                    " failed (%s%d)", g->worker.worker_id, code ? "status " : "no answer, ",
                    code);
    if (code == 0 && g->pool != NULL)
        fe_worker_failed(fe, g->pool, UPK_CONNECT);
    fe_req_t *p = g->owner;
    if (p != NULL && !p->up.got_headers && p->phase == PH_UPSTREAM) {
        bg_lost(g, p);
        return;
    }
    bg_free(g);
}

/* A background call of p's (the owner, or NULL for a release call) to worker w: body sent
 * on p's endpoint path. NULL when it could not be made; it may have ended already when this
 * returns (a connection refused at once): the caller checks its owner's d->bg. */
static fe_bg_t *bg_send(fe_req_t *p, kvr_worker_t w, bool owned, const char *body, size_t len)
{
    kvr_frontend_t *fe = p->fe;
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, w.worker_id);
    upool_t *u = sp != NULL ? fe_pool_for(fe, sp) : NULL;
    fe_bg_t *g = u != NULL && !u->bad_url ? calloc(1, sizeof *g) : NULL;
    if (g == NULL)
        return NULL;
    g->fe = fe;
    g->owner = owned ? p : NULL;
    g->release = !owned;
    g->pool = u;
    g->worker = w;
    g->next = fe->bgs;
    if (g->next)
        g->next->prev = g;
    fe->bgs = g;
    if (owned)
        p->dis->bg = g;
    g->uc = fe_pool_acquire(fe, u, fe->cfg.frontend_prefill_timeout_ms);
    g->up = g->uc != NULL ? evhttp_request_new(bg_done, g) : NULL;
    if (g->up == NULL) {
        bg_free(g);
        return NULL;
    }
    evhttp_request_set_header_cb(g->up, bg_header);
    evhttp_request_set_error_cb(g->up, bg_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(g->up);
    char rank[16];
    snprintf(rank, sizeof rank, "%u", w.dp_rank - (sp->dp_start <= w.dp_rank ? sp->dp_start : 0));
    evhttp_add_header(h, "Host", u->loc.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "x-data-parallel-rank", rank);
    fe_up_add_auth(fe, p->client.auth, h);
    evbuffer_add(evhttp_request_get_output_buffer(g->up), body, len);
    char path[KVR_ADDR_BYTES + 32];
    snprintf(path, sizeof path, "%s%s", u->loc.base_path,
             p->client.ep == KVR_OAI_CHAT ? "/v1/chat/completions" : "/v1/completions");
    evhttp_connection_set_max_body_size(g->uc->conn, (ev_ssize_t)fe->cfg.frontend_max_answer_bytes);
    fe->st.forwarded++;
    struct evhttp_request *up = g->up;
    bool alive = true;
    if (evhttp_make_request(g->uc->conn, up, EVHTTP_REQ_POST, path) != 0) {
        /* not reported through bg_done when g->up is still the request: free it here */
        for (fe_bg_t *x = fe->bgs; x != NULL; x = x->next)
            if (x == g && g->up == up) {
                g->up = NULL; /* freed by libevent */
                bg_free(g);
                alive = false;
                break;
            }
    }
    return alive ? g : NULL;
}

/* Starts the prefill call of p's bootstrap pair with its booking; false when it could not
 * be sent (the booking is then released). */
static bool bg_start(fe_req_t *p)
{
    fe_dreq_t *d = p->dis;
    kvr_req_handle_t handle = p->route.handle;
    p->route.handle = KVR_REQ_HANDLE_NONE; /* the prefill booking moves to the call */
    fe_bg_t *g = bg_send(p, p->route.worker, true, d->leg_body, d->leg_body_len);
    if (g == NULL || d->bg != g) { /* not made, or failed at once */
        if (handle != KVR_REQ_HANDLE_NONE)
            (void)kvr_sched_release(p->fe->sched, handle, kvr_now_ms());
        return false;
    }
    g->handle = handle;
    return true;
}

/* The client's body without the members a prefill leg drops (kept when a client leaves while
 * a call goes on: its own body is freed with it). */
static int keep_body(fe_req_t *p)
{
    fe_dreq_t *d = p->dis;
    if (d->rel_base != NULL)
        return KVR_OK;
    return fe_build_leg_body(p, PULL_DROP, NULL, NULL, 0, &d->rel_base, &d->rel_base_len);
}

/* The release call's body: the prompt, "stream":false, "max_tokens":1 and the prefill's
 * kv_transfer_params (d->kvt). From the kept body when there is one. */
static int release_body(fe_req_t *p, char **out, size_t *out_len)
{
    const fe_dreq_t *d = p->dis;
    int rc = keep_body(p);
    if (rc != KVR_OK || d->rel_base_len < 2)
        return rc != KVR_OK ? rc : KVR_EINVAL;
    char head[96];
    int n = snprintf(head, sizeof head,
                     ",\"stream\":false,\"max_tokens\":1%s,"
                     "\"kv_transfer_params\":",
                     p->client.ep == KVR_OAI_CHAT ? ",\"max_completion_tokens\":1" : "");
    size_t base = d->rel_base_len - 1; /* without its closing brace */
    char *b = malloc(base + (size_t)n + d->kvt_len + 1);
    if (b == NULL)
        return KVR_ENOMEM;
    memcpy(b, d->rel_base, base);
    memcpy(b + base, head, (size_t)n);
    memcpy(b + base + (size_t)n, d->kvt, d->kvt_len);
    b[base + (size_t)n + d->kvt_len] = '}';
    *out = b;
    *out_len = base + (size_t)n + d->kvt_len + 1;
    return KVR_OK;
}

/* A request whose prefill is done (pull) but whose decode leg never reached a decode worker
 * (its client left while it waited in the queue or between its legs): a decode worker is
 * sent the prompt with the prefill's kv_transfer_params and max_tokens 1, so that it reads
 * the KV and the prefill worker frees it now rather than at its own timeout. */
static void orphan(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    fe_dreq_t *d = p->dis;
    if (d->dmode != FD_PULL || d->kvt == NULL || (!d->pf_leg && p->up.leg_sent))
        return;
    kvr_route_req_t q = look_req(p);
    kvr_route_req_decode_leg(&q);
    kvr_route_res_t res;
    kvr_worker_t w = {0, 0};
    bool found = kvr_router_route(fe->r, &q, kvr_now_ms(), &res) == KVR_OK;
    if (found) {
        w = res.worker;
    } else { /* every decode worker busy: any that serves (no booking is made) */
        uint64_t ids[FE_MAX_WORKERS];
        size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
        for (size_t i = 0; i < n && i < FE_MAX_WORKERS && !found; i++) {
            const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
            if (sp != NULL && sp->role != KVR_ROLE_PREFILL && sp->url[0] != '\0' &&
                !kvr_router_fenced(fe->r, ids[i])) {
                w = (kvr_worker_t){ids[i], sp->dp_start};
                found = true;
            }
        }
    }
    char *body = NULL;
    size_t len = 0;
    if (found && release_body(p, &body, &len) != KVR_OK)
        body = NULL;
    if (body == NULL || bg_send(p, w, false, body, len) == NULL) {
        fe->ds.orphans[1]++;
        kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN,
                        "a prefill's KV could not be released (no decode worker, or out of "
                        "memory): the prefill worker frees it by its own timeout");
    }
    free(body);
}

/* p's bootstrap prefill call is cancelled (cancel) or left to finish. */
static void release_bg(fe_req_t *p, bool cancel)
{
    fe_bg_t *g = p->dis->bg;
    if (g == NULL)
        return;
    g->owner = NULL;
    p->dis->bg = NULL;
    if (cancel) {
        p->fe->ds.bg_cancelled++;
        bg_free(g);
    }
}

void fe_plan_release(fe_req_t *p, fe_rel_t why)
{
    if (p->dis == NULL)
        return;
    switch (why) {
    case FE_REL_END:
        release_bg(p, false); /* a bootstrap prefill call runs to its end on its own */
        dreq_put(p->fe, p->dis);
        p->dis = NULL;
        fe_leg_whole(p);
        return;
    case FE_REL_CANCEL:
        release_bg(p, true);
        orphan(p); /* a pulled prefill's KV would wait for its timeout */
        return;
    case FE_REL_DETACH:
        (void)keep_body(p); /* out of memory: the release call is not made, and counted */
        return;
    }
}

/* ---- the legs ------------------------------------------------------------------------------ */

/* The prefill leg cannot go on: served aggregated (the next leg is the whole request), or
 * refused with enforce_disagg. */
static void fallback(fe_req_t *p, const char *why, fe_verdict_t *v)
{
    kvr_frontend_t *fe = p->fe;
    fe_dreq_t *d = p->dis;
    release_bg(p, true);
    if (fe->cfg.enforce_disagg) {
        fe->ds.refused_enforced++;
        verdict_fail(v, 503, "the prefill failed (%s) and enforce_disagg is set", why);
        return;
    }
    fe->ds.bypass[FDB_PREFILL_FAILED]++;
    kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN,
                    "prefill failed (%s): the request is served aggregated on the decode pool",
                    why);
    free(d->leg_body);
    d->leg_body = NULL;
    d->leg_body_len = 0;
    d->has_pf = false;
    serve_aggregated(p);
    v->step = FE_STEP_NEXT;
}

/* The bootstrap triple for p's prefill placement (p->route.worker) into d->leg_body. */
static int bootstrap_body(fe_req_t *p, const kvr_worker_spec_t *sp)
{
    fe_dreq_t *d = p->dis;
    char host[KVR_ADDR_BYTES];
    if (sp->bootstrap_host[0] != '\0') {
        snprintf(host, sizeof host, "%s", sp->bootstrap_host);
    } else {
        kvr_url_t u;
        char err[64];
        if (kvr_endpoint_parse_url(sp->url, NULL, &u, err, sizeof err) != KVR_OK)
            return KVR_EINVAL;
        snprintf(host, sizeof host, "%s", u.host);
    }
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd = kvr_now_ns() * UINT64_C(0x9E3779B97F4A7C15);
    uint32_t dp = p->route.worker.dp_rank;
    uint32_t rank = dp >= sp->dp_start ? dp - sp->dp_start : 0;
    uint64_t room = kvr_disagg_room(rnd, sp->dp_size, rank);
    char tail[KVR_ADDR_BYTES + 96];
    int n = snprintf(tail, sizeof tail,
                     "\"bootstrap_host\":\"%s\",\"bootstrap_port\":%u,\"bootstrap_room\":%" PRIu64,
                     host, sp->bootstrap_port, room);
    free(d->leg_body);
    d->leg_body = NULL;
    return fe_build_leg_body(p, BOOT_DROP, NULL, tail, (size_t)n, &d->leg_body,
                             &d->leg_body_len);
}

/* A bootstrap prefill worker was placed: its call starts with the prefill booking, and p
 * goes on to its decode leg with the same body; or another prefill worker is tried. */
static void placed_bootstrap(fe_req_t *p, const kvr_worker_spec_t *sp, fe_verdict_t *v)
{
    kvr_frontend_t *fe = p->fe;
    fe_dreq_t *d = p->dis;
    d->dmode = FD_BOOTSTRAP;
    int rc = bootstrap_body(p, sp);
    if (rc != KVR_OK) {
        fallback(p, rc == KVR_ENOMEM ? "out of memory" : "its bootstrap host is unknown", v);
        return;
    }
    if (!bg_start(p)) {
        uint64_t id = p->route.worker.worker_id;
        if (p->route.n_tried < FE_MAX_ATTEMPTS)
            p->route.tried[p->route.n_tried++] = id;
        snprintf(p->route.last_fail, sizeof p->route.last_fail,
                 "the bootstrap prefill on worker %" PRIu64 " could not be sent", id);
        d->has_pf = false;
        v->step = FE_STEP_RETRY; /* another prefill worker */
        return;
    }
    fe->ds.mode[FD_BOOTSTRAP]++;
    d->pf_leg = false; /* the decode leg now, with the same body */
    v->step = FE_STEP_NEXT;
}

/* A pull prefill worker was placed: the prefill leg's body, then its call. */
static void placed_pull(fe_req_t *p, fe_verdict_t *v)
{
    fe_dreq_t *d = p->dis;
    d->dmode = FD_PULL;
    static const char chat_cap[] = ",\"max_completion_tokens\":1";
    char tail[sizeof PULL_KVT + 64];
    int n = snprintf(tail, sizeof tail, "\"stream\":false,\"max_tokens\":1%s,%s",
                     p->client.ep == KVR_OAI_CHAT ? chat_cap : "", PULL_KVT);
    free(d->leg_body);
    d->leg_body = NULL;
    if (fe_build_leg_body(p, PULL_DROP, NULL, tail, (size_t)n, &d->leg_body,
                          &d->leg_body_len) != KVR_OK)
        fallback(p, "out of memory", v);
}

void fe_plan_placed(fe_req_t *p, const kvr_route_res_t *res, fe_verdict_t *v)
{
    kvr_frontend_t *fe = p->fe;
    fe_dreq_t *d = p->dis;
    v->step = FE_STEP_GO;
    count_pool(p, d != NULL && d->pf_leg ? 0 : 1, res->cached_tokens);
    if (d == NULL || !d->pf_leg)
        return;
    d->pf = res->worker;
    d->has_pf = true;
    d->pf_start_ns = kvr_now_ns();
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, res->worker.worker_id);
    if (sp != NULL && sp->bootstrap_port != 0)
        placed_bootstrap(p, sp, v);
    else
        placed_pull(p, v);
    leg_sync(p);
}

/* Keeps the answer's kv_transfer_params (for a release call); false when it has none. */
static bool keep_kvt(fe_req_t *p, const char *b, const kvr_disagg_answer_t *a)
{
    fe_dreq_t *d = p->dis;
    if (a->kvt != KVR_KVT_OBJECT)
        return false;
    free(d->kvt);
    if ((d->kvt = malloc(a->kvt_len)) == NULL)
        return false;
    memcpy(d->kvt, b + a->kvt_at, a->kvt_len);
    d->kvt_len = a->kvt_len;
    return true;
}

/* The prefill leg's whole answer (pull): the decode leg next, or the answer itself. */
static void prefill_done(fe_req_t *p, struct evhttp_request *up, int code, fe_verdict_t *v)
{
    kvr_frontend_t *fe = p->fe;
    fe_dreq_t *d = p->dis;
    kvr_hist_observe(&fe->h_prefill, (double)(kvr_now_ns() - d->pf_start_ns) / 1e9);
    if (code >= 500) {
        fe->ds.prefill[FDP_ERROR]++;
        char why[64];
        snprintf(why, sizeof why, "prefill worker %" PRIu64 " answered %d",
                 p->route.worker.worker_id, code);
        fallback(p, why, v);
        return;
    }
    if (code != 200) { /* the engine refused the request itself: the client's answer */
        fe->ds.prefill[FDP_ERROR]++;
        v->step = FE_STEP_REPLY;
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    size_t len = evbuffer_get_length(in);
    const char *b = len ? (const char *)evbuffer_pullup(in, -1) : "";
    kvr_disagg_answer_t a;
    if (kvr_disagg_scan_answer(b, len, &a) != KVR_OK)
        a.kvt = KVR_KVT_OTHER;
    if (a.kvt != KVR_KVT_OBJECT && a.finish_stop && !p->client.stream) {
        fe->ds.prefill[FDP_TERMINAL]++; /* EOS on the one token: that is the whole answer */
        v->step = FE_STEP_REPLY;
        return;
    }
    free(d->leg_body);
    d->leg_body = NULL;
    d->leg_body_len = 0;
    if (a.kvt == KVR_KVT_OBJECT) {
        fe->ds.prefill[FDP_OK]++;
        (void)keep_kvt(p, b, &a); /* for a release call, should the decode leg not happen */
        static const char key[] = "\"kv_transfer_params\":";
        size_t tl = sizeof key - 1 + a.kvt_len;
        char *tail = malloc(tl);
        int rc = KVR_ENOMEM;
        if (tail != NULL) {
            memcpy(tail, key, sizeof key - 1);
            memcpy(tail + sizeof key - 1, b + a.kvt_at, a.kvt_len);
            rc = fe_build_leg_body(p, DECODE_DROP, NULL, tail, tl, &d->leg_body,
                                   &d->leg_body_len);
            free(tail);
        }
        if (rc != KVR_OK) {
            verdict_fail(v, 500, "out of memory");
            return;
        }
    } else {
        int k = a.kvt == KVR_KVT_OTHER ? FDP_BAD_PARAMS : FDP_NO_PARAMS;
        fe->ds.prefill[k]++;
        kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN,
                        "prefill worker %" PRIu64 " answered %s: the decode worker recomputes "
                        "the prompt", p->route.worker.worker_id,
                        k == FDP_BAD_PARAMS ? "kv_transfer_params that are not an object (or "
                                              "not JSON)"
                                            : "no kv_transfer_params");
    }
    fe->ds.mode[FD_PULL]++;
    d->pf_leg = false;
    v->step = FE_STEP_NEXT;
}

/* The prefill leg's call broke after its first byte, or went silent. */
static void prefill_broke(fe_req_t *p, up_kind_t kind, fe_verdict_t *v)
{
    kvr_frontend_t *fe = p->fe;
    uint64_t id = p->route.worker.worker_id;
    fe_up_count_error(fe, kind, id, !p->up.got_headers);
    fe_worker_failed(fe, p->up.pool, kind);
    char why[96];
    snprintf(why, sizeof why, "%s on prefill worker %llu", UPK_NAMES[kind],
             (unsigned long long)id);
    fallback(p, why, v);
}

/* The call of p, whose client left, ended (code; 0: failed): a prefill answer's KV is
 * released. */
static void orphaned(fe_req_t *p, struct evhttp_request *up, int code)
{
    if (!p->dis->pf_leg || code != 200)
        return;
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    size_t len = evbuffer_get_length(in);
    const char *b = len ? (const char *)evbuffer_pullup(in, -1) : "";
    kvr_disagg_answer_t a;
    if (kvr_disagg_scan_answer(b, len, &a) == KVR_OK && keep_kvt(p, b, &a))
        orphan(p);
}

void fe_plan_ended_dis(fe_req_t *p, const fe_leg_end_t *e, fe_verdict_t *v)
{
    fe_dreq_t *d = p->dis;
    v->step = FE_STEP_GO;
    switch (e->how) {
    case FE_END_UNPLACED:
        if (d->pf_leg && (e->rc == KVR_ENOWORKER || e->rc == KVR_ENOTALLOWED))
            fallback(p, p->route.n_tried > 0 ? p->route.last_fail
                                             : "no prefill worker can serve it", v);
        break;
    case FE_END_SPENT:
        if (d->pf_leg)
            fallback(p, p->route.last_fail, v);
        break;
    case FE_END_FAILED:
        if (d->dmode == FD_BOOTSTRAP && !d->pf_leg) { /* a new pair, a new room */
            release_bg(p, true);
            d->pf_leg = true;
            d->has_pf = false;
        }
        break;
    case FE_END_BROKEN:
        if (d->pf_leg)
            prefill_broke(p, e->kind, v);
        break;
    case FE_END_ANSWERED:
        if (d->pf_leg)
            prefill_done(p, e->up, e->code, v);
        break;
    case FE_END_ORPHANED:
        orphaned(p, e->up, e->code);
        v->step = FE_STEP_FINISH;
        break;
    }
    leg_sync(p);
}

const kvr_worker_t *fe_plan_prefill_worker(const fe_req_t *p)
{
    return p->dis != NULL && p->dis->has_pf ? &p->dis->pf : NULL;
}

/* ---- lifecycle, metrics ---------------------------------------------------------------------- */

int fe_disagg_init(kvr_frontend_t *fe, fe_leg_lost_fn lost)
{
    fe->leg_lost = lost;
    fe->rl_disagg = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    kvr_hist_init(&fe->h_prefill, PREFILL_BUCKETS, N_PREFILL_BUCKETS);
    fe->dstate = KVR_DISAGG_PENDING;
    fe_disagg_tick(fe);
    return KVR_OK;
}

void fe_disagg_free(kvr_frontend_t *fe)
{
    while (fe->bgs != NULL)
        bg_free(fe->bgs);
    while (fe->dfree != NULL) {
        fe_dreq_t *d = fe->dfree;
        fe->dfree = d->next_free;
        free(d);
    }
}

void fe_disagg_worker_removed(kvr_frontend_t *fe, uint64_t worker_id)
{
    for (fe_bg_t *g = fe->bgs; g != NULL; g = g->next)
        if (g->handle != KVR_REQ_HANDLE_NONE && g->worker.worker_id == worker_id)
            g->handle = KVR_REQ_HANDLE_NONE;
}

void fe_disagg_verify(const fe_req_t *p)
{
#ifdef NDEBUG
    (void)p;
#else
    const fe_dreq_t *d = p->dis;
    if (d == NULL)
        return;
    assert(d->dmode <= FD_BOOTSTRAP);
    assert(d->bg == NULL || d->bg->owner == p);
    assert(d->dmode != FD_AGG || (!d->pf_leg && d->bg == NULL && p->leg.shape == NULL));
    assert(p->leg.pin == (d->pf_leg ? &p->hints.pf : &p->hints.worker));
    assert(d->dmode == FD_AGG || (p->leg.body == d->leg_body &&
                                  p->leg.body_len == d->leg_body_len));
    assert(!d->pf_leg || !p->leg.may_stream);
#endif
}

void fe_disagg_metrics(const kvr_frontend_t *fe, struct kvr_prom *pr)
{
    const fe_dstats_t *d = &fe->ds;
    static const char *const modes[] = {"aggregated", "pull", "bootstrap"};
    kvr_prom_family(pr, "kvr_disagg_requests_total", "counter",
                    "Front-end requests by how they were served (aggregated: one worker).");
    for (int i = 0; i < 3; i++) {
        kvr_prom_label_t l = {"mode", modes[i]};
        kvr_prom_sample(pr, "kvr_disagg_requests_total", &l, 1, (double)d->mode[i]);
    }
    kvr_prom_family(pr, "kvr_disagg_bypass_total", "counter",
                    "Requests of a disaggregated fleet served without a remote prefill, by "
                    "reason.");
    for (int i = 0; i < FDB_COUNT; i++) {
        kvr_prom_label_t l = {"reason", BYPASS_NAMES[i]};
        kvr_prom_sample(pr, "kvr_disagg_bypass_total", &l, 1, (double)d->bypass[i]);
    }
    kvr_prom_family(pr, "kvr_disagg_prefill_total", "counter",
                    "Prefill answers by outcome (ok: KV handed on; terminal: the answer itself; "
                    "no_params / bad_params: the decode worker recomputes; error).");
    for (int i = 0; i < FDP_COUNT; i++) {
        kvr_prom_label_t l = {"outcome", PREFILL_NAMES[i]};
        kvr_prom_sample(pr, "kvr_disagg_prefill_total", &l, 1, (double)d->prefill[i]);
    }
    kvr_prom_counter(pr, "kvr_disagg_bootstrap_prefill_failed_total",
                     "Bootstrap prefill calls that failed.", (double)d->bg_failed);
    kvr_prom_counter(pr, "kvr_disagg_bootstrap_prefill_cancelled_total",
                     "Bootstrap prefill calls cancelled (client gone, request failed).",
                     (double)d->bg_cancelled);
    kvr_prom_family(pr, "kvr_disagg_orphan_releases_total", "counter",
                    "Prefilled requests whose client left before their decode leg was sent: a "
                    "decode worker was asked to read and free the KV (ok), or could not be "
                    "(failed: the prefill worker frees it by its own timeout).");
    for (int i = 0; i < 2; i++) {
        kvr_prom_label_t l = {"result", i ? "failed" : "ok"};
        kvr_prom_sample(pr, "kvr_disagg_orphan_releases_total", &l, 1, (double)d->orphans[i]);
    }
    kvr_prom_counter(pr, "kvr_disagg_refused_total",
                     "Requests refused 503 for want of a prefill (enforce_disagg).",
                     (double)d->refused_enforced);
    kvr_prom_gauge(pr, "kvr_disagg_state",
                   "The prefill pool: 0 pending (none ever), 1 active, 2 unavailable.",
                   (double)kvr_router_disagg_state(fe->r));
    kvr_prom_family(pr, "kvr_disagg_state_transitions_total", "counter",
                    "Times the prefill pool entered each state.");
    static const char *const states[] = {"pending", "active", "unavailable"};
    for (int i = 0; i < 3; i++) {
        kvr_prom_label_t l = {"to", states[i]};
        kvr_prom_sample(pr, "kvr_disagg_state_transitions_total", &l, 1,
                        (double)d->transitions[i]);
    }
    static const char *const pools[] = {"prefill", "decode"};
    static const struct {
        const char *name, *help;
    } P[3] = {{"kvr_pool_routed_total", "Placements per pool (decode: every request's worker)."},
              {"kvr_pool_prompt_tokens_total", "Prompt tokens placed per pool."},
              {"kvr_pool_cached_tokens_total",
               "Of those, cached on the chosen worker per the index (hit ratio = cached / "
               "prompt)."}};
    for (int k = 0; k < 3; k++) {
        kvr_prom_family(pr, P[k].name, "counter", P[k].help);
        const uint64_t *v = k == 0 ? d->pool_routed : k == 1 ? d->pool_prompt_tokens
                                                             : d->pool_cached_tokens;
        for (int i = 0; i < 2; i++) {
            kvr_prom_label_t l = {"pool", pools[i]};
            kvr_prom_sample(pr, P[k].name, &l, 1, (double)v[i]);
        }
    }
    kvr_prom_family(pr, "kvr_disagg_prefill_seconds", "histogram",
                    "Pull convention: the prefill call, sent to answered.");
    kvr_prom_hist(pr, "kvr_disagg_prefill_seconds", NULL, 0, &fe->h_prefill);
}


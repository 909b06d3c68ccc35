/*
 * fe_disagg.c: disaggregated prefill/decode in the OpenAI front end (docs/disagg.md).
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
 * The front end's request state machine (frontend.c) runs each leg as it runs an aggregated
 * request: p->pf_leg says which leg the booking and the upstream call belong to; failures
 * before the first byte are retried within the leg (the pools are disjoint, so one tried list
 * serves both). When the prefill leg cannot go on (no prefill worker left, retries spent, a
 * 5xx or broken answer) the request is served aggregated on the decode pool, or refused 503
 * with enforce_disagg. Switching legs continues from the request's zero-delay timer.
 *
 * States (kvr_router_disagg_state): pending (no prefill worker ever: an aggregated fleet),
 * active, unavailable (every prefill worker gone or fenced); transitions are logged once and
 * counted. Conditional disaggregation (disagg_policy) keeps a request local when the best
 * decode worker's cache leaves few new tokens (isl) or every prefill worker is busy (load).
 *
 * A client that leaves after its prefill (pull) but before its decode leg reached a decode
 * worker would leave the KV held on the prefill worker until that engine's timeout: a release
 * call (a decode request with max_tokens 1 and the prefill's parameters, answer dropped) makes
 * a decode worker read it at once (fe_disagg_orphan).
 *
 * Invariants: a background call (fe_bg_t: a bootstrap prefill, or a release) is in fe->bgs
 * from its start to its end; while a bootstrap call's request lives, p->bg and g->owner point
 * at each other, and it holds the prefill booking until it ends. Ownership: the front end owns the
 * calls; a request's leg body is the request's. Threads: the HTTP thread. Cost: a leg body is one
 * pass over the client's body.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "frontend/frontend_int.h"
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

struct fe_bg {
    kvr_frontend_t *fe;
    fe_bg_t *prev, *next;
    bool release;    /* an orphan's release call (else a bootstrap prefill call) */
    fe_req_t *owner; /* NULL once its request ended (a release call has none) */
    upool_t *pool;
    upconn_t *uc;
    struct evhttp_request *up;
    bool booked, failed;
    kvr_req_handle_t handle;
    kvr_worker_t worker;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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
    return (kvr_route_req_t){.tokens = p->tokens,
                             .n_tokens = p->n_tokens,
                             .model = p->model,
                             .model_len = p->model_len,
                             .lora_name = p->lora,
                             .lora_name_len = p->lora_len,
                             .mm = p->mm,
                             .n_mm = p->n_mm};
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
    p->dmode = FD_AGG;
    p->pf_leg = false;
    p->fe->ds.mode[FD_AGG]++;
}

bool fe_disagg_plan(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    if (p->disagg_planned)
        return true;
    p->disagg_planned = true;
    kvr_disagg_state_t st = fe_disagg_tick(fe); /* transitions logged as they are seen */
    if (p->has_pin_worker && kvr_router_worker(fe->r, p->pin_worker) == NULL) {
        /* the client named a worker: one that is not registered is its error, as for the
         * prefill worker below */
        fe_req_fail(p, 400, "worker %" PRIu64 " is not registered (named by x-worker-instance-id, "
                            "x-decode-instance-id, nvext.backend_instance_id or "
                            "nvext.decode_worker_id)", p->pin_worker);
        return false;
    }
    if (p->has_pin_pf) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, p->pin_pf);
        if (sp == NULL || sp->role != KVR_ROLE_PREFILL) {
            fe_req_fail(p, 400, "x-prefill-instance-id: worker %" PRIu64 " is not a registered "
                                "prefill worker (role=prefill)", p->pin_pf);
            return false;
        }
    }
    if (st != KVR_DISAGG_ACTIVE) {
        if (fe->cfg.enforce_disagg) {
            fe->ds.refused_enforced++;
            fe_req_fail(p, 503, "no prefill worker is serving (the prefill pool is %s) and "
                                "enforce_disagg is set", kvr_disagg_state_name(st));
            return false;
        }
        if (st == KVR_DISAGG_UNAVAILABLE)
            fe->ds.bypass[FDB_UNAVAILABLE]++;
        serve_aggregated(p);
        return true;
    }
    int why = fe->cfg.disagg_policy != KVR_DISAGG_ALWAYS && !p->has_pin_pf ? policy_bypass(p)
                                                                            : -1;
    if (why >= 0) {
        fe->ds.bypass[why]++;
        serve_aggregated(p);
        return true;
    }
    p->dmode = FD_PULL; /* the prefill worker's registration decides at its placement */
    p->pf_leg = true;
    return true;
}

void fe_disagg_route_req(fe_req_t *p, kvr_route_req_t *q)
{
    q->pool = KVR_POOL_SERVE;
    if (p->dmode == FD_AGG)
        return;
    if (p->pf_leg) {
        kvr_route_req_prefill_leg(q);
        q->has_pinned = p->has_pin_pf && p->has_pin_pf_rank;
        q->pinned = (kvr_worker_t){p->pin_pf, p->pin_pf_rank};
        return;
    }
    kvr_route_req_decode_leg(q);
}

static void count_pool(fe_req_t *p, int pool, uint64_t cached)
{
    fe_dstats_t *d = &p->fe->ds;
    d->pool_routed[pool]++;
    d->pool_prompt_tokens[pool] += p->n_tokens;
    d->pool_cached_tokens[pool] += cached < p->n_tokens ? cached : p->n_tokens;
}

/* Continues p on its next leg from its timer (never inside the libevent call that ended the
 * last one). */
static void next_leg(fe_req_t *p)
{
    p->leg_switch = true;
    p->first_token_sent = false;
    p->attempts = 0;
    if (!fe_ensure_retry_ev(p)) {
        fe_req_fail(p, 500, "out of memory");
        return;
    }
    fe_schedule_retry(p);
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
        g->owner->bg = NULL;
    bool booked = g->booked;
    kvr_req_handle_t h = g->handle;
    free(g);
    if (booked) /* last: the queue may place a request, which may start a call */
        (void)kvr_sched_release(fe->sched, h, kvr_now_ms());
}

static int bg_header(struct evhttp_request *up, void *arg)
{
    fe_bg_t *g = arg;
    if (evhttp_request_get_response_code(up) == 200 && g->booked)
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
    if (p != NULL && !p->got_headers && p->phase == PH_UPSTREAM) {
        /* its decode call waits for a room that will not come: the pair again, elsewhere */
        fe_cancel_upstream(p);
        fe_unbook(p);
        if (p->n_tried < FE_MAX_ATTEMPTS)
            p->tried[p->n_tried++] = g->worker.worker_id;
        snprintf(p->last_fail, sizeof p->last_fail, "the bootstrap prefill on worker %" PRIu64
                 " failed", g->worker.worker_id);
        bg_free(g);
        p->pf_leg = true;
        p->has_pf = false;
        fe_schedule_retry(p);
        return;
    }
    bg_free(g);
}

/* A background call of p's (the owner, or NULL for a release call) to worker w: body sent
 * on p's endpoint path. NULL when it could not be made; it may have ended already when this
 * returns (a connection refused at once): the caller checks its owner's p->bg. */
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
        p->bg = g;
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
    fe_add_upstream_auth(p, h);
    evbuffer_add(evhttp_request_get_output_buffer(g->up), body, len);
    char path[KVR_ADDR_BYTES + 32];
    snprintf(path, sizeof path, "%s%s", u->loc.base_path,
             p->ep == KVR_OAI_CHAT ? "/v1/chat/completions" : "/v1/completions");
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
    bool booked = p->booked;
    kvr_req_handle_t handle = p->handle;
    p->booked = false; /* the prefill booking moves to the call */
    fe_bg_t *g = bg_send(p, p->worker, true, p->leg_body, p->leg_body_len);
    if (g == NULL || p->bg != g) { /* not made, or failed at once */
        if (booked)
            (void)kvr_sched_release(p->fe->sched, handle, kvr_now_ms());
        return false;
    }
    g->booked = booked;
    g->handle = handle;
    return true;
}

/* The client's body without the members a prefill leg drops (kept when a client leaves while
 * a call goes on: its own body is freed with it). */
int fe_disagg_keep_body(fe_req_t *p)
{
    if (p->rel_base != NULL)
        return KVR_OK;
    return fe_build_leg_body(p, PULL_DROP, NULL, NULL, 0, &p->rel_base, &p->rel_base_len);
}

/* The release call's body: the prompt, "stream":false, "max_tokens":1 and the prefill's
 * kv_transfer_params (p->kvt). From the kept body when there is one. */
static int release_body(fe_req_t *p, char **out, size_t *out_len)
{
    int rc = fe_disagg_keep_body(p);
    if (rc != KVR_OK || p->rel_base_len < 2)
        return rc != KVR_OK ? rc : KVR_EINVAL;
    char head[96];
    int n = snprintf(head, sizeof head,
                     ",\"stream\":false,\"max_tokens\":1%s,"
                     "\"kv_transfer_params\":",
                     p->ep == KVR_OAI_CHAT ? ",\"max_completion_tokens\":1" : "");
    size_t base = p->rel_base_len - 1; /* without its closing brace */
    char *b = malloc(base + (size_t)n + p->kvt_len + 1);
    if (b == NULL)
        return KVR_ENOMEM;
    memcpy(b, p->rel_base, base);
    memcpy(b + base, head, (size_t)n);
    memcpy(b + base + (size_t)n, p->kvt, p->kvt_len);
    b[base + (size_t)n + p->kvt_len] = '}';
    *out = b;
    *out_len = base + (size_t)n + p->kvt_len + 1;
    return KVR_OK;
}

/* A request whose prefill is done (pull) but whose decode leg never reached a decode worker
 * (its client left while it waited in the queue or between its legs): a decode worker is
 * sent the prompt with the prefill's kv_transfer_params and max_tokens 1, so that it reads
 * the KV and the prefill worker frees it now rather than at its own timeout. */
void fe_disagg_orphan(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    if (p->dmode != FD_PULL || p->kvt == NULL || p->d_sent)
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

void fe_disagg_release(fe_req_t *p, bool cancel)
{
    fe_bg_t *g = p->bg;
    if (g == NULL)
        return;
    g->owner = NULL;
    p->bg = NULL;
    if (cancel) {
        p->fe->ds.bg_cancelled++;
        bg_free(g);
    }
}

/* ---- the legs ------------------------------------------------------------------------------ */

/* The bootstrap triple for p's prefill placement (p->worker) into p->leg_body. */
static int bootstrap_body(fe_req_t *p, const kvr_worker_spec_t *sp)
{
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
        rnd = mono_ns() * UINT64_C(0x9E3779B97F4A7C15);
    uint32_t rank = p->worker.dp_rank >= sp->dp_start ? p->worker.dp_rank - sp->dp_start : 0;
    uint64_t room = kvr_disagg_room(rnd, sp->dp_size, rank);
    char tail[KVR_ADDR_BYTES + 96];
    int n = snprintf(tail, sizeof tail,
                     "\"bootstrap_host\":\"%s\",\"bootstrap_port\":%u,\"bootstrap_room\":%" PRIu64,
                     host, sp->bootstrap_port, room);
    free(p->leg_body);
    p->leg_body = NULL;
    return fe_build_leg_body(p, BOOT_DROP, NULL, tail, (size_t)n, &p->leg_body,
                             &p->leg_body_len);
}

bool fe_disagg_placed(fe_req_t *p, const kvr_route_res_t *res)
{
    kvr_frontend_t *fe = p->fe;
    count_pool(p, p->pf_leg ? 0 : 1, res->cached_tokens);
    if (!p->pf_leg)
        return true;
    p->pf = res->worker;
    p->pf_cached_tokens = res->cached_tokens;
    p->has_pf = true;
    p->pf_start_ns = mono_ns();
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, res->worker.worker_id);
    int rc;
    if (sp != NULL && sp->bootstrap_port != 0) {
        p->dmode = FD_BOOTSTRAP;
        if ((rc = bootstrap_body(p, sp)) != KVR_OK) {
            fe_unbook(p);
            fe_disagg_fallback(p, rc == KVR_ENOMEM ? "out of memory"
                                                   : "its bootstrap host is unknown");
            return false;
        }
        if (!bg_start(p)) {
            if (p->n_tried < FE_MAX_ATTEMPTS)
                p->tried[p->n_tried++] = res->worker.worker_id;
            snprintf(p->last_fail, sizeof p->last_fail, "the bootstrap prefill on worker %" PRIu64
                     " could not be sent", res->worker.worker_id);
            p->has_pf = false;
            if (!fe_ensure_retry_ev(p)) {
                fe_req_fail(p, 500, "out of memory");
                return false;
            }
            fe_schedule_retry(p); /* another prefill worker */
            return false;
        }
        fe->ds.mode[FD_BOOTSTRAP]++;
        p->pf_leg = false; /* the decode leg now, with the same body */
        next_leg(p);
        return false;
    }
    p->dmode = FD_PULL;
    static const char chat_cap[] = ",\"max_completion_tokens\":1";
    char tail[sizeof PULL_KVT + 64];
    int n = snprintf(tail, sizeof tail, "\"stream\":false,\"max_tokens\":1%s,%s",
                     p->ep == KVR_OAI_CHAT ? chat_cap : "", PULL_KVT);
    free(p->leg_body);
    p->leg_body = NULL;
    if ((rc = fe_build_leg_body(p, PULL_DROP, NULL, tail, (size_t)n, &p->leg_body,
                                &p->leg_body_len)) != KVR_OK) {
        fe_unbook(p);
        fe_disagg_fallback(p, "out of memory");
        return false;
    }
    return true;
}

/* Keeps the answer's kv_transfer_params (for a release call); false when it has none. */
static bool keep_kvt(fe_req_t *p, const char *b, const kvr_disagg_answer_t *a)
{
    if (a->kvt != KVR_KVT_OBJECT)
        return false;
    free(p->kvt);
    if ((p->kvt = malloc(a->kvt_len)) == NULL)
        return false;
    memcpy(p->kvt, b + a->kvt_at, a->kvt_len);
    p->kvt_len = a->kvt_len;
    return true;
}

void fe_disagg_prefill_done(fe_req_t *p, struct evhttp_request *up, int code)
{
    kvr_frontend_t *fe = p->fe;
    kvr_hist_observe(&fe->h_prefill, (double)(mono_ns() - p->pf_start_ns) / 1e9);
    if (code >= 500) {
        fe->ds.prefill[FDP_ERROR]++;
        char why[64];
        snprintf(why, sizeof why, "prefill worker %" PRIu64 " answered %d", p->worker.worker_id,
                 code);
        fe_unbook(p);
        fe_disagg_fallback(p, why);
        return;
    }
    if (code != 200) { /* the engine refused the request itself: the client's answer */
        fe->ds.prefill[FDP_ERROR]++;
        fe_reply_whole(p, up);
        fe_req_finish(p);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    size_t len = evbuffer_get_length(in);
    const char *b = len ? (const char *)evbuffer_pullup(in, -1) : "";
    kvr_disagg_answer_t a;
    if (kvr_disagg_scan_answer(b, len, &a) != KVR_OK)
        a.kvt = KVR_KVT_OTHER;
    fe_unbook(p); /* the prefill is done: its KV moves on */
    if (a.kvt != KVR_KVT_OBJECT && a.finish_stop && !p->stream) {
        fe->ds.prefill[FDP_TERMINAL]++; /* EOS on the one token: that is the whole answer */
        fe_reply_whole(p, up);
        fe_req_finish(p);
        return;
    }
    free(p->leg_body);
    p->leg_body = NULL;
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
            rc = fe_build_leg_body(p, DECODE_DROP, NULL, tail, tl, &p->leg_body,
                                   &p->leg_body_len);
            free(tail);
        }
        if (rc != KVR_OK) {
            fe_req_fail(p, 500, "out of memory");
            return;
        }
    } else {
        int k = a.kvt == KVR_KVT_OTHER ? FDP_BAD_PARAMS : FDP_NO_PARAMS;
        fe->ds.prefill[k]++;
        kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN,
                        "prefill worker %" PRIu64 " answered %s: the decode worker recomputes "
                        "the prompt", p->worker.worker_id,
                        k == FDP_BAD_PARAMS ? "kv_transfer_params that are not an object (or "
                                              "not JSON)"
                                            : "no kv_transfer_params");
    }
    fe->ds.mode[FD_PULL]++;
    p->pf_leg = false;
    next_leg(p);
}

void fe_disagg_abandoned(fe_req_t *p, struct evhttp_request *up, int code)
{
    fe_unbook(p);
    if (p->pf_leg && code == 200) {
        struct evbuffer *in = evhttp_request_get_input_buffer(up);
        size_t len = evbuffer_get_length(in);
        const char *b = len ? (const char *)evbuffer_pullup(in, -1) : "";
        kvr_disagg_answer_t a;
        if (kvr_disagg_scan_answer(b, len, &a) == KVR_OK && keep_kvt(p, b, &a))
            fe_disagg_orphan(p);
    }
    fe_req_finish(p);
}

void fe_disagg_fallback(fe_req_t *p, const char *why)
{
    kvr_frontend_t *fe = p->fe;
    fe_disagg_release(p, true);
    fe_unbook(p);
    if (fe->cfg.enforce_disagg) {
        fe->ds.refused_enforced++;
        fe_req_fail(p, 503, "the prefill failed (%s) and enforce_disagg is set", why);
        return;
    }
    fe->ds.bypass[FDB_PREFILL_FAILED]++;
    kvr_log_limited(&fe->rl_disagg, KVR_LOG_WARN,
                    "prefill failed (%s): the request is served aggregated on the decode pool",
                    why);
    free(p->leg_body);
    p->leg_body = NULL;
    p->has_pf = false;
    serve_aggregated(p);
    next_leg(p);
}

/* ---- lifecycle, metrics ---------------------------------------------------------------------- */

int fe_disagg_init(kvr_frontend_t *fe)
{
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
}

void fe_disagg_worker_removed(kvr_frontend_t *fe, uint64_t worker_id)
{
    for (fe_bg_t *g = fe->bgs; g != NULL; g = g->next)
        if (g->booked && g->worker.worker_id == worker_id)
            g->booked = false;
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

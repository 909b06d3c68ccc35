/*
 * mocker_kv.c: the mocker's disaggregated roles (mocker_kv.h): the prefill side keeps a
 * finished prompt's KV (the engine's hold_kv) until its decode worker reads it; the decode
 * side reads it over a real loopback HTTP connection, waits the modelled transfer time and
 * admits the request with the KV in (kv_loaded: its blocks are stored and published, only the
 * last prompt token is computed). The bytes read are a small JSON answer naming the block
 * count, not KV: what is modelled is the count and the time.
 *
 *   pull (vLLM)       the prefill answer carries kv_transfer_params naming this worker
 *                     (remote_host = kv_host, remote_port = the HTTP port, remote_engine_id =
 *                     the rank's id, remote_request_id, remote_block_ids = the held physical
 *                     blocks); the decode worker POSTs them back to /kv/pull.
 *   bootstrap (SGLang) the prefill worker runs a bootstrap server; the decode worker POSTs
 *                     {"bootstrap_room":R} to /kv/bootstrap there, which answers once the
 *                     room's prefill is held (parked until then, kv_wait_timeout_s at most).
 * A read answers {"blocks":N,"dp_rank":r} and frees the hold; a hold nobody reads is freed
 * after kv_hold_timeout_s (counted). Times are modelled: divided by --speedup.
 *
 * Invariants: a hold is in m->holds exactly while its engine request is held; a parked read
 * is in m->parks exactly while its HTTP request is unanswered and its connection's close
 * callback points at it. A decode request in MQ_FETCH owns one outgoing connection, freed from
 * its timer once its one request completed (or with the request); the completion only records
 * the result and arms the timer, so nothing is freed under libevent's caller; the timer then
 * hands the request back through its kv_done (this file never admits, fails or frees a
 * request itself: mocker_admit.c does, and calls down here only).
 * Memory: one hold per held prefill, one park per early read. Cost: holds and parks are
 * lists searched linearly (a mocker holds at most its running prefills). Threads: the loop.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvrouter.h"
#include "http/http.h"
#include "mocker/mocker_kv.h"
#include "mocker/mocker_server.h"
#include "wire/disagg.h"
#include "wire/prom.h"

#define SGLANG_BOOTSTRAP_PORT 8998 /* a bootstrap_port given as null */
#define PULL_TIMEOUT_S 10

static uint64_t nonce(void)
{
    static uint64_t n;
    if (n == 0 && getrandom(&n, sizeof n, 0) != (ssize_t)sizeof n)
        n = (uint64_t)mk_mono_ns();
    return n | 1;
}

/* The engine id a rank names in kv_transfer_params ("mocker-<port>-<rank>-<nonce>"). */
static void engine_id(const rank_t *rk, char *out, size_t cap)
{
    snprintf(out, cap, "mocker-%u-%u-%016" PRIx64, rk->m->port, rk->idx, nonce());
}

/* ---- holds (prefill side) ------------------------------------------------------------- */

static void hold_free(kvr_mocker_t *m, mk_hold_t *h)
{
    mk_hold_t **pp = &m->holds;
    while (*pp != h)
        pp = &(*pp)->next;
    *pp = h->next;
    (void)kvr_engine_release_held(h->rk->eng, h->eng_id);
    free(h);
}

static mk_hold_t *hold_by_room(kvr_mocker_t *m, uint64_t room)
{
    for (mk_hold_t *h = m->holds; h; h = h->next)
        if (h->by_room && h->room == room)
            return h;
    return NULL;
}

/* A read of h answered on req; h is freed. */
static void serve_read(kvr_mocker_t *m, mk_hold_t *h, struct evhttp_request *req)
{
    char body[96];
    int n = snprintf(body, sizeof body, "{\"blocks\":%u,\"dp_rank\":%u}", h->blocks, h->rk->idx);
    m->kv.pulls_served++;
    hold_free(m, h);
    kvr_reply_body(&m->rep, req, 200, "application/json", body, (size_t)n);
}

static void park_free(kvr_mocker_t *m, mk_park_t *k)
{
    mk_park_t **pp = &m->parks;
    while (*pp != k)
        pp = &(*pp)->next;
    *pp = k->next;
    evhttp_connection_set_closecb(evhttp_request_get_connection(k->req), NULL, NULL);
    free(k);
}

/* The member a pull answer carries, naming where the KV waits. */
static char *pull_member(mreq_t *q, const mk_hold_t *h)
{
    kvr_mocker_t *m = q->m;
    if (m->cfg.kv_fault == 1)
        return strdup("\"kv_transfer_params\":\"garbage\"");
    const uint32_t *ids;
    size_t n = kvr_engine_held_blocks(q->rk->eng, q->id, &ids);
    char eid[96];
    engine_id(q->rk, eid, sizeof eid);
    size_t cap = 512 + strlen(m->cfg.kv_host) + n * 11;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t k = (size_t)snprintf(out, cap,
                                "\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                                "\"do_remote_decode\":false,\"remote_block_ids\":[[");
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%u", i ? "," : "", ids[i]);
    snprintf(out + k, cap - k,
             "]],\"remote_engine_id\":\"%s\",\"remote_request_id\":\"%s\","
             "\"remote_host\":\"%s\",\"remote_port\":%u,\"tp_size\":1}",
             eid, h->xfer_id, m->cfg.kv_host, m->cfg.kv_fault == 2 ? 1u : m->port);
    return out;
}

char *mk_kv_held(mreq_t *q, const kvr_engine_output_t *o)
{
    kvr_mocker_t *m = q->m;
    mk_hold_t *h = calloc(1, sizeof *h);
    if (!h) {
        (void)kvr_engine_release_held(q->rk->eng, q->id);
        return NULL;
    }
    h->rk = q->rk;
    h->eng_id = q->id;
    h->blocks = o->kv_blocks;
    h->by_room = q->by_room;
    h->room = q->room;
    snprintf(h->xfer_id, sizeof h->xfer_id, "%s", q->rid);
    h->deadline_ns = mk_mono_ns() + mk_modelled_ns(m, m->cfg.kv_hold_timeout_s);
    h->next = m->holds;
    m->holds = h;
    m->kv.holds++;
    if (h->by_room) { /* a read may be waiting already: served after this engine step */
        for (mk_park_t *k = m->parks; k; k = k->next)
            if (k->room == h->room) {
                event_active(m->park_ev, EV_TIMEOUT, 1);
                break;
            }
        return NULL;
    }
    char *member = pull_member(q, h);
    if (!member)
        hold_free(m, h);
    return member;
}

void mk_h_pull(kvr_mocker_t *m, struct evhttp_request *req)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_disagg_req_t d;
    char err[200];
    if (kvr_disagg_parse_req(body, len, &d, err, sizeof err) != KVR_OK) {
        mk_reply_error(m, req, 400, "%s", err);
        return;
    }
    if (d.remote_request_id[0] == '\0' || d.remote_engine_id[0] == '\0') {
        mk_reply_error(m, req, 400, "kv_transfer_params: remote_request_id and remote_engine_id "
                                    "are required");
        return;
    }
    for (mk_hold_t *h = m->holds; h; h = h->next) {
        char eid[96];
        engine_id(h->rk, eid, sizeof eid);
        if (!h->by_room && strcmp(h->xfer_id, d.remote_request_id) == 0 &&
            strcmp(eid, d.remote_engine_id) == 0) {
            serve_read(m, h, req);
            return;
        }
    }
    m->kv.pulls_unknown++;
    mk_reply_error(m, req, 404, "no KV held for request %s on engine %s (read already, expired "
                                "or never made)", d.remote_request_id, d.remote_engine_id);
}

/* Parked reads whose room is now held (run from the loop, never inside an engine step: a
 * read frees the hold, which the engine may not do while it steps). */
static void on_parks(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_mocker_t *m = arg;
    mk_park_t *next;
    for (mk_park_t *k = m->parks; k; k = next) {
        next = k->next;
        mk_hold_t *h = hold_by_room(m, k->room);
        if (h) {
            struct evhttp_request *req = k->req;
            park_free(m, k);
            serve_read(m, h, req);
        }
    }
}

static void on_park_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    mk_park_t *k = arg;
    kvr_http_release_orphan(k->req);
    park_free(k->m, k);
}

static void on_bootstrap(struct evhttp_request *req, void *arg)
{
    kvr_mocker_t *m = arg;
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *path = u ? evhttp_uri_get_path(u) : NULL;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST || !path ||
        strcmp(path, "/kv/bootstrap") != 0) {
        mk_reply_error(m, req, 404, "the bootstrap server answers POST /kv/bootstrap only");
        return;
    }
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_disagg_req_t d;
    char err[200];
    if (kvr_disagg_parse_req(body, len, &d, err, sizeof err) != KVR_OK || !d.has_room) {
        mk_reply_error(m, req, 400, "%s", d.has_room ? err : "bootstrap_room: required");
        return;
    }
    mk_hold_t *h = hold_by_room(m, d.bootstrap_room);
    if (h) {
        serve_read(m, h, req);
        return;
    }
    mk_park_t *k = calloc(1, sizeof *k);
    if (!k) {
        mk_reply_error(m, req, 500, "out of memory");
        return;
    }
    k->m = m;
    k->req = req;
    k->room = d.bootstrap_room;
    k->deadline_ns = mk_mono_ns() + mk_modelled_ns(m, m->cfg.kv_wait_timeout_s);
    k->next = m->parks;
    m->parks = k;
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_park_close, k);
}

void mk_kv_sweep(kvr_mocker_t *m, uint64_t now_ns)
{
    mk_hold_t *hn;
    for (mk_hold_t *h = m->holds; h; h = hn) {
        hn = h->next;
        if (now_ns >= h->deadline_ns) {
            m->kv.holds_expired++;
            kvr_log_limited(&m->rl_kv, KVR_LOG_WARN,
                            "rank %u: a prefill's KV (%u blocks) was not read within "
                            "kv-hold-timeout: freed", h->rk->idx, h->blocks);
            hold_free(m, h);
        }
    }
    mk_park_t *kn;
    for (mk_park_t *k = m->parks; k; k = kn) {
        kn = k->next;
        if (now_ns >= k->deadline_ns) {
            struct evhttp_request *req = k->req;
            uint64_t room = k->room;
            m->kv.parks_expired++;
            park_free(m, k);
            mk_reply_error(m, req, 404, "bootstrap room %" PRIu64 ": no prefill held it within "
                                        "kv-wait-timeout", room);
        }
    }
}

/* ---- reads (decode side) ---------------------------------------------------------------- */

static void read_failed(mreq_t *q, const char *why)
{
    kvr_mocker_t *m = q->m;
    m->kv.transfers_failed++;
    kvr_log_limited(&m->rl_kv, KVR_LOG_WARN, "KV read from %s failed: %s%s", q->peer, why,
                    m->cfg.kv_load_recompute ? " (recomputing)" : "");
    q->kv_done(q, MK_KV_FAILED, why);
}

/* The fetch's result, acted on from q's timer (after the modelled transfer time). */
static void on_xfer_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mreq_t *q = arg;
    kvr_mocker_t *m = q->m;
    if (q->fetch_conn != NULL) { /* its read is over: the connection goes (not in its callback) */
        evhttp_connection_free(q->fetch_conn);
        q->fetch_conn = NULL;
    }
    if (q->gone) { /* the client left: the prefill worker has freed its KV, so do we */
        m->kv.abandoned++;
        q->kv_done(q, MK_KV_ABANDONED, NULL);
        return;
    }
    if (q->phase == MQ_FETCH) { /* the read failed: the reason in xfer_id */
        read_failed(q, q->xfer_id);
        return;
    }
    m->kv.transfers_ok++;
    m->kv.transfer_blocks += q->xfer_blocks;
    q->kv_done(q, MK_KV_LOADED, NULL);
}

static void fetch_result(mreq_t *q, const char *why)
{
    if (why != NULL) { /* stays MQ_FETCH: the timer reports the failure */
        if (why != q->xfer_id)
            snprintf(q->xfer_id, sizeof q->xfer_id, "%s", why);
        struct timeval now = {0, 0};
        evtimer_add(q->xfer_timer, &now);
        return;
    }
    kvr_mocker_t *m = q->m;
    double s = (double)q->xfer_blocks * (double)m->cfg.kv_bytes_per_block * 8.0 /
               (m->cfg.kv_transfer_gbps * 1e9);
    m->kv.transfer_s += s;
    q->phase = MQ_XFER;
    struct timeval tv = mk_tv_of(mk_modelled_ns(m, s));
    evtimer_add(q->xfer_timer, &tv);
}

static void on_fetched(struct evhttp_request *req, void *arg)
{
    mreq_t *q = arg;
    kvr_mocker_t *m = q->m;
    q->fetch_req = NULL; /* libevent frees it after this call; the connection is ours */
    if (q->gone) { /* finished from the timer (nothing is freed inside this callback) */
        struct timeval now = {0, 0};
        evtimer_add(q->xfer_timer, &now);
        return;
    }
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code == 0) {
        fetch_result(q, "unreachable or no answer");
        return;
    }
    if (code != 200) {
        char why[48];
        snprintf(why, sizeof why, "answered %d", code);
        fetch_result(q, why);
        return;
    }
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(b);
    uint64_t blocks = 0;
    if (kvr_disagg_read_u64(len ? (const char *)evbuffer_pullup(b, -1) : "", len, "blocks",
                            &blocks) != KVR_OK) {
        fetch_result(q, "a malformed answer");
        return;
    }
    uint32_t bs = m->cfg.engine.block_size;
    uint64_t want = ((uint64_t)q->n_tokens + bs - 1) / bs;
    if (blocks != want) { /* another prompt's KV: the router paired the wrong requests */
        m->kv.transfers_mismatch++;
        snprintf(q->xfer_id, sizeof q->xfer_id, "%" PRIu64 " blocks, the prompt has %" PRIu64,
                 blocks, want);
        fetch_result(q, q->xfer_id);
        return;
    }
    q->xfer_blocks = (uint32_t)blocks;
    fetch_result(q, NULL);
}

void mk_kv_fetch(mreq_t *q, const kvr_disagg_req_t *d, mk_kv_done_fn done)
{
    kvr_mocker_t *m = q->m;
    q->kv_done = done;
    bool pull = m->cfg.kv_transfer == KVR_MOCKER_PULL;
    const char *host = pull ? d->remote_host : d->bootstrap_host;
    uint32_t port = pull ? d->remote_port
                         : d->bootstrap_port ? d->bootstrap_port : SGLANG_BOOTSTRAP_PORT;
    snprintf(q->peer, sizeof q->peer, "%s:%u", host, (unsigned)(uint16_t)port);
    if (!(q->xfer_timer = evtimer_new(m->base, on_xfer_timer, q))) {
        done(q, MK_KV_ERROR, "out of memory");
        return;
    }
    char body[KVR_DISAGG_STR_BYTES * 2 + 96];
    int n = pull ? snprintf(body, sizeof body,
                            "{\"kv_transfer_params\":{\"remote_request_id\":\"%s\","
                            "\"remote_engine_id\":\"%s\"}}",
                            d->remote_request_id, d->remote_engine_id)
                 : snprintf(body, sizeof body, "{\"bootstrap_room\":%" PRIu64 "}",
                            d->bootstrap_room);
    struct evhttp_connection *c = evhttp_connection_base_new(m->base, NULL, host, (uint16_t)port);
    struct evhttp_request *r = c ? evhttp_request_new(on_fetched, q) : NULL;
    if (!r) {
        if (c)
            evhttp_connection_free(c);
        fetch_result(q, "cannot open a connection");
        return;
    }
    evhttp_connection_set_timeout(c, pull ? PULL_TIMEOUT_S
                                          : (int)(m->cfg.kv_wait_timeout_s / m->cfg.speedup) + 5);
    evhttp_connection_set_max_headers_size(c, 16384); /* a peer's answer is small: bounded */
    evhttp_connection_set_max_body_size(c, (ev_ssize_t)1 << 20);
    struct evkeyvalq *h = evhttp_request_get_output_headers(r);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(r), body, (size_t)n);
    q->fetch_conn = c;
    q->fetch_req = r;
    if (evhttp_make_request(c, r, EVHTTP_REQ_POST, pull ? "/kv/pull" : "/kv/bootstrap") != 0 &&
        q->fetch_req == r) { /* not reported through on_fetched (the request is freed) */
        q->fetch_req = NULL;
        fetch_result(q, "the request could not be sent");
    }
}

bool mk_kv_client_gone(mreq_t *q)
{
    if (q->phase == MQ_FETCH && q->fetch_req != NULL) {
        q->gone = true; /* the read completes, so the prefill worker frees its KV */
        return true;
    }
    if (q->xfer_timer)
        evtimer_del(q->xfer_timer);
    return false;
}

void mk_kv_release(mreq_t *q)
{
    if (q->xfer_timer)
        event_free(q->xfer_timer);
    if (q->fetch_conn) /* the fetch, if still pending, is cancelled with it */
        evhttp_connection_free(q->fetch_conn);
    q->xfer_timer = NULL;
    q->fetch_conn = NULL;
}

/* ---- lifecycle, metrics ------------------------------------------------------------------ */

int mk_kv_init(kvr_mocker_t *m, char *err, size_t err_len)
{
    if (m->cfg.role != KVR_MOCKER_PREFILL || m->cfg.kv_transfer != KVR_MOCKER_BOOTSTRAP)
        return KVR_OK;
    if (!(m->park_ev = event_new(m->base, -1, 0, on_parks, m)))
        return KVR_ENOMEM;
    struct evhttp_bound_socket *bs;
    int st = mk_listen(m, "bootstrap-port", m->cfg.bootstrap_port, 4096, on_bootstrap, m,
                       &m->boot_http, &bs, err, err_len);
    if (st == KVR_OK)
        m->boot_port = kvr_http_bound_port(bs);
    return st;
}

void mk_kv_free(kvr_mocker_t *m)
{
    while (m->parks) {
        mk_park_t *k = m->parks;
        struct evhttp_request *req = k->req;
        park_free(m, k);
        mk_reply_error(m, req, 503, "the prefill worker is shutting down");
    }
    if (m->boot_http)
        evhttp_free(m->boot_http);
    if (m->park_ev)
        event_free(m->park_ev);
    while (m->holds)
        hold_free(m, m->holds);
}

void mk_kv_metrics(kvr_mocker_t *m)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } C[] = {
        {"kvr_mocker_kv_holds_total", "Prefills whose KV was held for a decode worker",
         offsetof(mk_kv_stats_t, holds)},
        {"kvr_mocker_kv_reads_served_total", "Held KV read by a decode worker (and freed)",
         offsetof(mk_kv_stats_t, pulls_served)},
        {"kvr_mocker_kv_reads_unknown_total", "Reads naming no held KV (404)",
         offsetof(mk_kv_stats_t, pulls_unknown)},
        {"kvr_mocker_kv_holds_expired_total", "Held KV freed unread after kv-hold-timeout",
         offsetof(mk_kv_stats_t, holds_expired)},
        {"kvr_mocker_kv_bootstrap_waits_expired_total",
         "Bootstrap reads whose prefill never came (404 after kv-wait-timeout)",
         offsetof(mk_kv_stats_t, parks_expired)},
        {"kvr_mocker_kv_transfers_total", "KV reads completed by this decode worker",
         offsetof(mk_kv_stats_t, transfers_ok)},
        {"kvr_mocker_kv_transfer_failures_total",
         "KV reads that failed (unreachable prefill worker, error, malformed answer, mismatch)",
         offsetof(mk_kv_stats_t, transfers_failed)},
        {"kvr_mocker_kv_transfer_invalid_params_total",
         "Decode requests whose kv_transfer_params lacked a piece (recomputed)",
         offsetof(mk_kv_stats_t, transfers_invalid)},
        {"kvr_mocker_kv_transfer_mismatches_total",
         "KV reads whose block count was not the prompt's (wrongly paired requests)",
         offsetof(mk_kv_stats_t, transfers_mismatch)},
        {"kvr_mocker_kv_transfer_blocks_total", "Blocks transferred in",
         offsetof(mk_kv_stats_t, transfer_blocks)},
        {"kvr_mocker_kv_reads_abandoned_total",
         "KV reads completed after their client left (KV freed on both sides)",
         offsetof(mk_kv_stats_t, abandoned)},
    };
    kvr_prom_label_t l[] = {{"model_name", m->cfg.model}};
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        kvr_prom_family(&m->prom, C[i].name, "counter", C[i].help);
        kvr_prom_sample(&m->prom, C[i].name, l, 1,
                        (double)*(const uint64_t *)((const char *)&m->kv + C[i].off));
    }
    kvr_prom_family(&m->prom, "kvr_mocker_kv_transfer_seconds_total", "counter",
                    "Modelled KV transfer time (blocks x bytes per block / bandwidth)");
    kvr_prom_sample(&m->prom, "kvr_mocker_kv_transfer_seconds_total", l, 1, m->kv.transfer_s);
    size_t parked = 0;
    for (mk_park_t *k = m->parks; k; k = k->next)
        parked++;
    kvr_prom_family(&m->prom, "kvr_mocker_kv_bootstrap_waiting", "gauge",
                    "Bootstrap reads waiting for their prefill");
    kvr_prom_sample(&m->prom, "kvr_mocker_kv_bootstrap_waiting", l, 1, (double)parked);
}

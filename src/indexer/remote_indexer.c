/*
 * remote_indexer.c: the router's overlaps from a remote indexer (contract in
 * remote_indexer.h).
 *
 * Invariants: a call is in exactly one place: the wait list, a slot (in flight), or the free
 * list; its done has been called at most once (finished), always from the loop, never from
 * inside kvr_sched's lookup call (sending is deferred to the kick event). A slot's connection
 * lives as long as the module (evhttp reconnects it on the next request after a failure).
 * Memory: calls are recycled through the free list; the matches buffer and the body writer
 * are reused. An answer is bounded as it arrives: its head by MAX_HEADER_BYTES on every
 * connection, a lookup's body by what an answer about this router's ranks and the prompt's
 * blocks can be (answer_cap: ANSWER_BYTES_PER_RANK a rank, 21 a block, ANSWER_SLACK_BYTES),
 * a decision's answer ({"status":"ok"} or an error) by RECORD_ANSWER_BYTES; evhttp drops the
 * connection past the bound (the lookup fails as "answer", counted and logged). Log lines
 * quote an answer by its length (it is not NUL-terminated).
 * Cost per lookup: one JSON body (~21 bytes a block) and one HTTP round trip.
 */
#include "indexer/remote_indexer.h"
#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "core/endpoint.h"
#include "base/log.h"
#include "nats/nats_link.h"
#include "base/secret.h"
#include "wire/ix_answer.h"
#include "wire/json_writer.h"
#include "wire/prom.h"

#define MAX_SLOTS 64
#define MAX_MATCHES 65536
#define MAX_RECORDS_IN_FLIGHT 1024
#define MAX_HEADER_BYTES 16384
/* One rank in an answer: its scores entry ("<u64>":{"<u32>":<u64>}) and its share of its
 * instance's (longest_matched, gpu, dp, cpu, disk), with every number at its widest: < 256. */
#define ANSWER_BYTES_PER_RANK 256
#define ANSWER_BYTES_PER_BLOCK 21 /* a frequencies entry: a u64 and a comma */
#define ANSWER_SLACK_BYTES 65536  /* ranks this router does not know, whitespace */
#define RECORD_ANSWER_BYTES 65536

typedef struct call call_t;
typedef struct slot {
    struct evhttp_connection *conn;
    call_t *call; /* in flight, or NULL */
    struct kvr_remote_ix *x;
    int refused; /* the answer in flight was refused by evhttp (its error callback): 0, or
                    1 over a bound, 2 a head that does not read (or over its bound before
                    its first line was read) */
    size_t cap;  /* the bound of its body */
} slot_t;

struct call {
    struct kvr_remote_ix *x;
    kvr_overlap_done_fn done;
    void *ctx;
    struct event *timer;
    struct evbuffer *body;
    uint64_t start_ns;
    size_t n_blocks; /* hashes asked about: bounds the answer's frequencies */
    uint64_t seq;  /* over NATS: the last token of its reply subject */
    bool finished; /* done called (the deadline passed first) */
    bool resent;   /* sent again once: its connection closed before any answer */
    call_t *next;  /* wait list, NATS in-flight list, or free list */
};

struct kvr_remote_ix {
    kvr_remote_ix_config_t cfg;
    kvr_url_t url;
    char path[300];
    char where[200]; /* for log lines: the url, or the NATS subject */
    char auth[KVR_SECRET_MAX + 8], record_auth[KVR_SECRET_MAX + 8]; /* "Bearer <token>" or "" */
    bool over_nats;
    char subj_query[160], reply_prefix[160], subj_record[160];
    char record_path[300];
    struct evhttp_connection *rec_conn; /* approximate mode: decisions, one queued connection */
    size_t records_in_flight;
    int record_refused; /* the decision's answer was refused by evhttp: refusal()'s value */
    uint64_t next_seq;
    call_t *nats_calls; /* over NATS: in flight, waiting for their reply */
    char model[KVR_MODEL_BYTES];
    slot_t slots[MAX_SLOTS];
    size_t n_slots;
    call_t *wait_head, *wait_tail, *free_calls;
    struct event *kick;
    kvr_json_writer_t w;
    kvr_match_t *m;
    size_t m_cap;
    kvr_remote_ix_stats_t st;
    kvr_ratelimit_t rl;
    kvr_hist_t h_rtt;
    bool closing;
};

static const double RTT_BUCKETS[] = {5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3,
                                     5e-3, 1e-2, 2e-2, 5e-2, 0.1,  0.5};

static void call_put(kvr_remote_ix_t *x, call_t *c)
{
    evtimer_del(c->timer);
    evbuffer_drain(c->body, evbuffer_get_length(c->body));
    c->finished = false;
    c->resent = false;
    c->next = x->free_calls;
    x->free_calls = c;
}

static void on_timeout(evutil_socket_t fd, short what, void *arg);

static call_t *call_get(kvr_remote_ix_t *x)
{
    call_t *c = x->free_calls;
    if (c != NULL) {
        x->free_calls = c->next;
        c->next = NULL;
        return c;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->x = x;
    c->timer = evtimer_new(x->cfg.base, on_timeout, c);
    c->body = evbuffer_new();
    if (c->timer == NULL || c->body == NULL) {
        if (c->timer)
            event_free(c->timer);
        if (c->body)
            evbuffer_free(c->body);
        free(c);
        return NULL;
    }
    return c;
}

static void call_destroy(call_t *c)
{
    event_free(c->timer);
    evbuffer_free(c->body);
    free(c);
}

/* The one place a caller is told (zero overlap unless status is KVR_OK). */
static void finish(kvr_remote_ix_t *x, call_t *c, int status, size_t n)
{
    c->finished = true;
    evtimer_del(c->timer);
    x->st.reachable = status == KVR_OK;
    c->done(c->ctx, status, status == KVR_OK ? x->m : NULL, status == KVR_OK ? n : 0, kvr_now_ms());
}

/* ---- sending ---- */

static void on_answer(struct evhttp_request *req, void *arg);

/* The most an answer about n_blocks blocks can legitimately be: every rank this router knows
 * matched (and slack for ranks it does not, of other routers' workers in the same partition),
 * within what the answer reader takes at all (MAX_MATCHES). */
static size_t answer_cap(const kvr_remote_ix_t *x, size_t n_blocks)
{
    size_t ranks = kvr_router_n_ranks(kvr_sched_router(x->cfg.sched));
    ranks = ranks < MAX_MATCHES ? ranks : MAX_MATCHES;
    return ANSWER_SLACK_BYTES + ranks * ANSWER_BYTES_PER_RANK + n_blocks * ANSWER_BYTES_PER_BLOCK;
}

/* What evhttp's failure of a request says of its answer: 1 over a bound (head or body), 2 a
 * head that does not read (or whose status line is not in by MAX_HEADER_BYTES), else 0. */
static int refusal(enum evhttp_request_error e)
{
    return e == EVREQ_HTTP_DATA_TOO_LONG ? 1 : e == EVREQ_HTTP_INVALID_HEADER ? 2 : 0;
}

/* evhttp failed the request (called just before on_answer(NULL)). */
static void on_error(enum evhttp_request_error e, void *arg)
{
    slot_t *sl = arg;
    sl->refused = refusal(e);
}

static void send_call(kvr_remote_ix_t *x, slot_t *sl, call_t *c)
{
    struct evhttp_request *req = evhttp_request_new(on_answer, sl);
    sl->call = c;
    sl->refused = 0;
    x->st.in_flight++;
    if (req == NULL) {
        on_answer(NULL, sl);
        return;
    }
    sl->cap = answer_cap(x, c->n_blocks);
    evhttp_connection_set_max_body_size(sl->conn, (ev_ssize_t)sl->cap);
    evhttp_request_set_error_cb(req, on_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", x->url.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (x->auth[0] != '\0')
        evhttp_add_header(h, "Authorization", x->auth);
    /* copied, not moved: the body is sent again if the connection closes under it */
    evbuffer_add(evhttp_request_get_output_buffer(req), evbuffer_pullup(c->body, -1),
                 evbuffer_get_length(c->body));
    if (evhttp_make_request(sl->conn, req, EVHTTP_REQ_POST, x->path) != 0 && sl->call == c)
        on_answer(NULL, sl); /* refused before any callback: the request is freed by libevent */
}

/* Sends waiting calls on idle slots (from the loop, never inside a lookup). */
static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    kvr_remote_ix_t *x = arg;
    for (size_t i = 0; i < x->n_slots && x->wait_head != NULL; i++) {
        if (x->slots[i].call != NULL)
            continue;
        call_t *c = x->wait_head;
        x->wait_head = c->next;
        if (x->wait_head == NULL)
            x->wait_tail = NULL;
        c->next = NULL;
        x->st.waiting--;
        send_call(x, &x->slots[i], c);
    }
}

static void kick(kvr_remote_ix_t *x)
{
    if (x->wait_head != NULL && !x->closing)
        event_active(x->kick, EV_TIMEOUT, 0);
}

/* ---- answers and deadlines ---- */

/* An answer's body: its matches in x->m (*n), or a failure counted and logged. */
static int read_body(kvr_remote_ix_t *x, const char *text, size_t len, size_t *n)
{
    char err[200];
    int rc = kvr_ix_answer_parse(text, len, x->cfg.block_size, MAX_MATCHES, &x->m, &x->m_cap, n,
                                 err, sizeof err);
    if (rc != KVR_OK) {
        x->st.failed_answer++;
        kvr_log_limited(&x->rl, KVR_LOG_WARN,
                        "remote indexer %s: its answer does not read: %s (%.*s); this decision "
                        "has zero overlap",
                        x->where, err, (int)(len < 120 ? len : 120), text);
    }
    return rc;
}

static int read_answer(kvr_remote_ix_t *x, const slot_t *sl, struct evhttp_request *req, size_t *n)
{
    int code = req != NULL ? evhttp_request_get_response_code(req) : 0;
    if (code == 0 && sl->refused != 0) {
        x->st.failed_answer++;
        if (sl->refused == 1)
            kvr_log_limited(&x->rl, KVR_LOG_WARN,
                            "remote indexer %s: its answer is refused unread: its head is over "
                            "%d bytes or its body over %zu (the most an answer can be); this "
                            "decision has zero overlap",
                            x->where, MAX_HEADER_BYTES, sl->cap);
        else
            kvr_log_limited(&x->rl, KVR_LOG_WARN,
                            "remote indexer %s: its answer is refused unread: its head does not "
                            "read (malformed, or over %d bytes); this decision has zero overlap",
                            x->where, MAX_HEADER_BYTES);
        return KVR_EIO;
    }
    if (code == 0) {
        x->st.failed_connect++;
        kvr_log_limited(&x->rl, KVR_LOG_WARN,
                        "remote indexer %s: no answer (connection refused or lost); this "
                        "decision has zero overlap",
                        x->where);
        return KVR_EIO;
    }
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(b);
    const char *text = len > 0 ? (const char *)evbuffer_pullup(b, -1) : "";
    if (code == 404) {
        /* the indexer has no partition for the model: none registered or recorded yet, or
         * its last decisions expired (approximate mode: the indexer drops an empty partition
         * and the next decision makes it again). It answered: zero overlap, reachable. */
        x->st.unknown_partition++;
        kvr_log_limited(&x->rl, KVR_LOG_WARN,
                        "remote indexer %s has no index for this request's model (404: %.*s); "
                        "this decision has zero overlap",
                        x->where, (int)(len < 200 ? len : 200), text);
        *n = 0;
        return KVR_OK;
    }
    if (code != 200) {
        x->st.failed_status++;
        kvr_log_limited(&x->rl, KVR_LOG_WARN,
                        "remote indexer %s answered %d: %.*s; this decision has zero overlap",
                        x->where, code, (int)(len < 200 ? len : 200), text);
        return KVR_EIO;
    }
    return read_body(x, text, len, n);
}

static void on_answer(struct evhttp_request *req, void *arg)
{
    slot_t *sl = arg;
    kvr_remote_ix_t *x = sl->x;
    call_t *c = sl->call;
    if (x->closing || c == NULL)
        return;
    sl->call = NULL;
    x->st.in_flight--;
    if (c->finished) {
        x->st.late_answers++;
        call_put(x, c);
        kick(x);
        return;
    }
    if (!c->resent && sl->refused == 0 &&
        (req == NULL || evhttp_request_get_response_code(req) == 0)) {
        /* no answer at all: most often a keep-alive connection the indexer closed as this
         * lookup was written to it. A lookup changes nothing: sent again, once, at once. */
        c->resent = true;
        x->st.resent++;
        send_call(x, sl, c);
        return;
    }
    size_t n = 0;
    int rc = read_answer(x, sl, req, &n);
    if (rc == KVR_OK) {
        x->st.answered++;
        kvr_hist_observe(&x->h_rtt, (double)(kvr_now_ns() - c->start_ns) * 1e-9);
    }
    finish(x, c, rc, n);
    call_put(x, c);
    kick(x);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    call_t *c = arg;
    kvr_remote_ix_t *x = c->x;
    uint64_t now = kvr_now_ns(), due = c->start_ns + x->cfg.timeout_ms * 1000000u;
    if (now < due) { /* libevent's clock is coarse (ms): never before the deadline */
        uint64_t left_us = (due - now + 999) / 1000;
        struct timeval tv = {(time_t)(left_us / 1000000), (suseconds_t)(left_us % 1000000)};
        evtimer_add(c->timer, &tv);
        return;
    }
    x->st.timeouts++;
    kvr_log_limited(&x->rl, KVR_LOG_WARN,
                    "remote indexer %s: no answer within remote_indexer_timeout_ms (%llu ms); "
                    "this decision has zero overlap",
                    x->where, (unsigned long long)x->cfg.timeout_ms);
    if (x->over_nats) { /* off the in-flight list: a late reply finds no lookup */
        for (call_t **p = &x->nats_calls; *p != NULL; p = &(*p)->next)
            if (*p == c) {
                *p = c->next;
                break;
            }
        x->st.in_flight--;
        finish(x, c, KVR_EIO, 0);
        call_put(x, c);
        return;
    }
    /* still waiting for a connection: out of the list; in flight: its answer is dropped */
    for (call_t **p = &x->wait_head, *prev = NULL; *p != NULL; prev = *p, p = &(*p)->next) {
        if (*p != c)
            continue;
        *p = c->next;
        if (x->wait_tail == c)
            x->wait_tail = prev;
        x->st.waiting--;
        finish(x, c, KVR_EIO, 0);
        call_put(x, c);
        return;
    }
    finish(x, c, KVR_EIO, 0);
}

/* ---- the scheduler's overlap source ---- */

static int lookup(void *arg, const kvr_route_req_t *q, kvr_overlap_done_fn done, void *ctx)
{
    kvr_remote_ix_t *x = arg;
    if (x->closing)
        return KVR_EIO;
    call_t *c = call_get(x);
    if (c == NULL)
        return KVR_ENOMEM;
    const char *model = q->model != NULL && q->model_len > 0 ? q->model : x->model;
    size_t model_len = q->model != NULL && q->model_len > 0 ? q->model_len : strlen(x->model);
    const char *body;
    size_t len;
    if (kvr_ix_answer_encode_query(&x->w, q->block_hashes, q->n_hashed, model, model_len) !=
            KVR_OK ||
        kvr_json_writer_finish(&x->w, &body, &len) != KVR_OK ||
        evbuffer_add(c->body, body, len) != 0) {
        call_put(x, c);
        return KVR_ENOMEM;
    }
    c->done = done;
    c->ctx = ctx;
    c->start_ns = kvr_now_ns();
    c->n_blocks = q->n_hashed;
    struct timeval tv = {(time_t)(x->cfg.timeout_ms / 1000),
                         (suseconds_t)(x->cfg.timeout_ms % 1000) * 1000};
    /* the deadline runs from now, not from the loop's cached time (older by whatever this
     * iteration has done so far: the timer fired that much early) */
    (void)event_base_update_cache_time(x->cfg.base);
    evtimer_add(c->timer, &tv);
    if (x->over_nats) {
        char reply[200];
        c->seq = ++x->next_seq;
        snprintf(reply, sizeof reply, "%s.%llu", x->reply_prefix, (unsigned long long)c->seq);
        if (kvr_nats_publish(x->cfg.nats, x->subj_query, reply, body, len) != KVR_OK) {
            call_put(x, c);
            return KVR_EIO; /* routed at once with zero overlap (the link counts it) */
        }
        c->next = x->nats_calls;
        x->nats_calls = c;
        x->st.in_flight++;
        x->st.lookups++;
        return KVR_OK;
    }
    if (x->wait_tail != NULL)
        x->wait_tail->next = c;
    else
        x->wait_head = c;
    x->wait_tail = c;
    x->st.waiting++;
    x->st.lookups++;
    kick(x);
    return KVR_OK;
}

/* An answer over NATS: its lookup named by the subject's last token. */
static void on_reply(void *arg, const char *subject, const char *reply, const uint8_t *data,
                     size_t len)
{
    (void)reply;
    kvr_remote_ix_t *x = arg;
    const char *dot = strrchr(subject, '.');
    uint64_t seq = dot ? strtoull(dot + 1, NULL, 10) : 0;
    call_t *c = NULL;
    for (call_t **p = &x->nats_calls; *p != NULL; p = &(*p)->next)
        if ((*p)->seq == seq) {
            c = *p;
            *p = c->next;
            break;
        }
    if (c == NULL) {
        x->st.late_answers++; /* its deadline passed (or an answer nobody asked for) */
        return;
    }
    x->st.in_flight--;
    size_t n = 0;
    int rc;
    if (len == 0) { /* the server's "no responders" status: nobody serves the subject */
        x->st.failed_connect++;
        kvr_log_limited(&x->rl, KVR_LOG_WARN,
                        "remote indexer %s: no router serves it (no responders); this decision "
                        "has zero overlap",
                        x->where);
        rc = KVR_EIO;
    } else {
        rc = read_body(x, (const char *)data, len, &n);
    }
    if (rc == KVR_OK) {
        x->st.answered++;
        kvr_hist_observe(&x->h_rtt, (double)(kvr_now_ns() - c->start_ns) * 1e-9);
    }
    finish(x, c, rc, n);
    call_put(x, c);
}

static int init_nats(kvr_remote_ix_t *x, char *err, size_t err_len)
{
    if (x->cfg.nats == NULL || x->cfg.ns == NULL) {
        snprintf(err, err_len, "remote_indexer: nats needs nats_url");
        return KVR_EINVAL;
    }
    x->over_nats = true;
    uint64_t rid = kvr_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)x;
    snprintf(x->subj_query, sizeof x->subj_query, "%s.indexer.query", x->cfg.ns);
    snprintf(x->subj_record, sizeof x->subj_record, "%s.indexer.record", x->cfg.ns);
    snprintf(x->reply_prefix, sizeof x->reply_prefix, "%s.indexer.reply.%016llx", x->cfg.ns,
             (unsigned long long)rid);
    snprintf(x->where, sizeof x->where, "nats %s", x->subj_query);
    char sub[200];
    snprintf(sub, sizeof sub, "%s.*", x->reply_prefix);
    if (kvr_nats_subscribe(x->cfg.nats, sub, on_reply, x) != KVR_OK) {
        snprintf(err, err_len, "remote_indexer: cannot subscribe to %s", sub);
        return KVR_EIO;
    }
    return KVR_OK;
}

/* ---- approximate mode: each decision recorded remotely ---- */

static void on_record_error(enum evhttp_request_error e, void *arg)
{
    kvr_remote_ix_t *x = arg;
    x->record_refused = refusal(e);
}

static void on_record_answer(struct evhttp_request *req, void *arg)
{
    kvr_remote_ix_t *x = arg;
    if (x->closing)
        return;
    x->records_in_flight--;
    int code = req != NULL ? evhttp_request_get_response_code(req) : 0;
    int refused = x->record_refused;
    x->record_refused = 0;
    if (code == 200) {
        x->st.records_ok++;
        return;
    }
    x->st.records_failed++;
    if (code == 0 && refused != 0) {
        kvr_log_limited(&x->rl, KVR_LOG_WARN,
                        "remote indexer %s: a routing decision's answer is refused unread (%s "
                        "over %d bytes, or a body over %d); the decision may not be recorded",
                        x->where, refused == 1 ? "a head" : "a head that does not read, or is",
                        MAX_HEADER_BYTES, RECORD_ANSWER_BYTES);
        return;
    }
    const char *text = "";
    size_t len = 0;
    if (req != NULL) {
        struct evbuffer *b = evhttp_request_get_input_buffer(req);
        len = evbuffer_get_length(b);
        text = len > 0 ? (const char *)evbuffer_pullup(b, -1) : "";
    }
    kvr_log_limited(&x->rl, KVR_LOG_WARN,
                    "remote indexer %s: a routing decision was not recorded (%s%d): %.*s", x->where,
                    code == 0 ? "no answer, " : "", code, (int)(len > 200 ? 200 : len), text);
}

static void record_failed(kvr_remote_ix_t *x, const char *why)
{
    x->st.records_failed++;
    kvr_log_limited(&x->rl, KVR_LOG_WARN,
                    "remote indexer %s: a routing decision was not "
                    "recorded: %s",
                    x->where, why);
}

static void on_decision(void *arg, const kvr_decision_t *d)
{
    kvr_remote_ix_t *x = arg;
    if (x->closing)
        return;
    x->st.records++;
    bool named = d->model != NULL && d->model_len > 0;
    kvr_ix_record_t rec = {.instance_id = d->worker.worker_id,
                           .dp_rank = d->worker.dp_rank,
                           .block_size = x->cfg.block_size,
                           .local_hashes = d->lbh,
                           .sequence_hashes = d->seq,
                           .n = d->n,
                           .model_name = named ? d->model : x->model,
                           .model_name_len = named ? d->model_len : strlen(x->model),
                           .kv_capacity_blocks = d->capacity_blocks};
    const char *body;
    size_t len;
    if (kvr_ix_answer_encode_record(&x->w, &rec) != KVR_OK ||
        kvr_json_writer_finish(&x->w, &body, &len) != KVR_OK) {
        record_failed(x, "out of memory");
        return;
    }
    if (x->over_nats) {
        if (kvr_nats_publish(x->cfg.nats, x->subj_record, NULL, body, len) != KVR_OK)
            record_failed(x, "the NATS link refused the message");
        else
            x->st.records_ok++; /* published: the serving router counts refusals */
        return;
    }
    if (x->records_in_flight >= MAX_RECORDS_IN_FLIGHT) {
        record_failed(x, "too many decisions waiting for the indexer (1024)");
        return;
    }
    struct evhttp_request *req = evhttp_request_new(on_record_answer, x);
    if (req == NULL) {
        record_failed(x, "out of memory");
        return;
    }
    evhttp_request_set_error_cb(req, on_record_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", x->url.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (x->record_auth[0] != '\0')
        evhttp_add_header(h, "Authorization", x->record_auth);
    evbuffer_add(evhttp_request_get_output_buffer(req), body, len);
    x->records_in_flight++;
    if (evhttp_make_request(x->rec_conn, req, EVHTTP_REQ_POST, x->record_path) != 0) {
        x->records_in_flight--; /* libevent freed the request without a callback */
        record_failed(x, "the request could not be queued");
    }
}

/* Approximate mode: the router's decisions go to the indexer. */
static int init_records(kvr_remote_ix_t *x, const struct timeval *ctv)
{
    if (!x->over_nats) {
        snprintf(x->record_path, sizeof x->record_path, "%s/record_routing_decision",
                 x->url.base_path);
        x->rec_conn = evhttp_connection_base_new(x->cfg.base, NULL, x->url.host, x->url.port);
        if (x->rec_conn == NULL)
            return KVR_ENOMEM;
        evhttp_connection_set_timeout_tv(x->rec_conn, ctv);
        evhttp_connection_set_max_headers_size(x->rec_conn, MAX_HEADER_BYTES);
        evhttp_connection_set_max_body_size(x->rec_conn, RECORD_ANSWER_BYTES);
    }
    kvr_decision_sink_t sink = {on_decision, x};
    kvr_router_set_decision_sink(kvr_sched_router(x->cfg.sched), &sink);
    return KVR_OK;
}

/* ---- the API extension: metrics and the state line ---- */

static void ext_metrics(void *arg, struct kvr_prom *p)
{
    kvr_remote_ix_t *x = arg;
    kvr_prom_counter(p, "kvr_remote_indexer_lookups_total",
                     "Placements whose overlaps were asked of the remote indexer.",
                     (double)x->st.lookups);
    kvr_prom_counter(p, "kvr_remote_indexer_answered_total",
                     "Lookups the remote indexer answered in time.", (double)x->st.answered);
    kvr_prom_family(p, "kvr_remote_indexer_failures_total", "counter",
                    "Lookups routed with zero overlap, by cause.");
    const struct {
        const char *cause;
        uint64_t v;
    } f[] = {{"timeout", x->st.timeouts},
             {"connect", x->st.failed_connect},
             {"status", x->st.failed_status},
             {"answer", x->st.failed_answer}};
    for (size_t i = 0; i < 4; i++) {
        kvr_prom_label_t l = {"cause", f[i].cause};
        kvr_prom_sample(p, "kvr_remote_indexer_failures_total", &l, 1, (double)f[i].v);
    }
    kvr_prom_counter(p, "kvr_remote_indexer_unknown_partition_total",
                     "Lookups answered 404: the indexer has no index for the model (zero overlap).",
                     (double)x->st.unknown_partition);
    kvr_prom_counter(p, "kvr_remote_indexer_resent_total",
                     "Lookups sent again once because their connection closed before any answer "
                     "(an idle connection the indexer closed).",
                     (double)x->st.resent);
    kvr_prom_counter(p, "kvr_remote_indexer_late_answers_total",
                     "Answers that came after their deadline (dropped).",
                     (double)x->st.late_answers);
    kvr_prom_gauge(p, "kvr_remote_indexer_reachable",
                   "1 when the last lookup was answered, else 0.", x->st.reachable ? 1 : 0);
    kvr_prom_gauge(p, "kvr_remote_indexer_waiting", "Lookups waiting for a connection.",
                   (double)x->st.waiting);
    kvr_prom_hist(p, "kvr_remote_indexer_rtt_seconds", NULL, 0, &x->h_rtt);
    if (!x->cfg.record_decisions)
        return;
    kvr_prom_counter(p, "kvr_remote_indexer_records_total",
                     "Routing decisions sent to the remote indexer (approximate mode).",
                     (double)x->st.records);
    kvr_prom_counter(p, "kvr_remote_indexer_records_failed_total",
                     "Of those, not recorded (refused, no answer, queue full).",
                     (double)x->st.records_failed);
}

static bool ext_detail(void *arg, const char **key, const char **value)
{
    kvr_remote_ix_t *x = arg;
    *key = "remote";
    *value = x->st.lookups == 0 ? "unknown" : x->st.reachable ? "reachable" : "unreachable";
    return true;
}

/* ---- life ---- */

kvr_remote_ix_t *kvr_remote_ix_new(const kvr_remote_ix_config_t *cfg, int *status, char *err,
                                   size_t err_len)
{
    kvr_remote_ix_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return *status = KVR_ENOMEM, NULL;
    x->cfg = *cfg;
    x->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    kvr_json_writer_init(&x->w);
    kvr_hist_init(&x->h_rtt, RTT_BUCKETS, sizeof RTT_BUCKETS / sizeof *RTT_BUCKETS);
    snprintf(x->model, sizeof x->model, "%s", cfg->default_model ? cfg->default_model : "default");
    char why[300];
    bool nats = strcmp(cfg->url, "nats") == 0;
    int rc = nats ? init_nats(x, err, err_len) : KVR_OK;
    if (rc != KVR_OK) {
        kvr_remote_ix_free(x);
        return *status = rc, NULL;
    }
    if (!nats && kvr_endpoint_parse_url(cfg->url, NULL, &x->url, why, sizeof why) != KVR_OK) {
        snprintf(err, err_len, "remote_indexer: %s", why);
        kvr_remote_ix_free(x);
        return *status = KVR_EINVAL, NULL;
    }
    if (!nats)
        snprintf(x->where, sizeof x->where, "%s", cfg->url);
    if (cfg->bearer != NULL && cfg->bearer[0] != '\0') /* copied: the caller's may go */
        snprintf(x->auth, sizeof x->auth, "Bearer %s", cfg->bearer);
    if (cfg->record_bearer != NULL && cfg->record_bearer[0] != '\0')
        snprintf(x->record_auth, sizeof x->record_auth, "Bearer %s", cfg->record_bearer);
    x->cfg.bearer = x->cfg.record_bearer = NULL;
    snprintf(x->path, sizeof x->path, "%s/query_by_hash", x->url.base_path);
    x->n_slots = nats ? 0 : cfg->max_connections ? cfg->max_connections : 16;
    x->n_slots = x->n_slots > MAX_SLOTS ? MAX_SLOTS : x->n_slots;
    uint64_t conn_ms = cfg->timeout_ms * 10 < 1000 ? 1000 : cfg->timeout_ms * 10;
    struct timeval ctv = {(time_t)(conn_ms / 1000), (suseconds_t)(conn_ms % 1000) * 1000};
    for (size_t i = 0; i < x->n_slots; i++) {
        x->slots[i].x = x;
        x->slots[i].conn = evhttp_connection_base_new(cfg->base, NULL, x->url.host, x->url.port);
        if (x->slots[i].conn == NULL) {
            kvr_remote_ix_free(x);
            return *status = KVR_ENOMEM, NULL;
        }
        evhttp_connection_set_timeout_tv(x->slots[i].conn, &ctv);
        evhttp_connection_set_max_headers_size(x->slots[i].conn, MAX_HEADER_BYTES);
    }
    if (cfg->record_decisions && init_records(x, &ctv) != KVR_OK) {
        kvr_remote_ix_free(x);
        return *status = KVR_ENOMEM, NULL;
    }
    x->kick = event_new(cfg->base, -1, 0, on_kick, x);
    kvr_http_service_t ext = {.metrics = ext_metrics, .detail = ext_detail, .arg = x};
    if (x->kick == NULL || (*status = kvr_http_host_add_service(cfg->host, &ext)) != KVR_OK) {
        *status = x->kick == NULL ? KVR_ENOMEM : *status;
        kvr_remote_ix_free(x);
        return NULL;
    }
    kvr_overlap_source_t src = {lookup, x};
    kvr_sched_set_overlap_source(cfg->sched, &src);
    *status = KVR_OK;
    return x;
}

void kvr_remote_ix_free(kvr_remote_ix_t *x)
{
    if (x == NULL)
        return;
    x->closing = true;
    if (x->cfg.sched != NULL) {
        kvr_sched_set_overlap_source(x->cfg.sched, NULL);
        if (x->cfg.record_decisions)
            kvr_router_set_decision_sink(kvr_sched_router(x->cfg.sched), NULL);
    }
    if (x->rec_conn != NULL)
        evhttp_connection_free(x->rec_conn); /* decisions in flight: no callback */
    if (x->cfg.host != NULL)
        kvr_http_host_remove_service(x->cfg.host, x);
    for (size_t i = 0; i < x->n_slots; i++) {
        if (x->slots[i].conn != NULL)
            evhttp_connection_free(x->slots[i].conn); /* in-flight requests: no callback */
        if (x->slots[i].call != NULL)
            call_destroy(x->slots[i].call);
    }
    for (call_t *c = x->wait_head, *n; c != NULL; c = n) {
        n = c->next;
        call_destroy(c);
    }
    for (call_t *c = x->nats_calls, *n; c != NULL; c = n) {
        n = c->next;
        call_destroy(c);
    }
    for (call_t *c = x->free_calls, *n; c != NULL; c = n) {
        n = c->next;
        call_destroy(c);
    }
    if (x->kick != NULL)
        event_free(x->kick);
    kvr_json_writer_deinit(&x->w);
    free(x->m);
    free(x);
}

void kvr_remote_ix_stats(const kvr_remote_ix_t *x, kvr_remote_ix_stats_t *out) { *out = x->st; }

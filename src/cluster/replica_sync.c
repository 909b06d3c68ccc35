/*
 * replica_sync.c: see replica_sync.h.
 *
 * Invariants:
 *   - the batch in progress holds local events only, at most BATCH_MAX, and is published
 *     within FLUSH_US of its first event (a one-shot timer armed by that event) or as soon as
 *     it is full or the next event would not fit the server's max_payload;
 *   - every request admitted from a peer has an entry in origins (id -> origin router,
 *     handle) until its free is applied or its origin goes; entries whose request the tracker
 *     freed by itself (expiry, worker removal) are swept a slice at a time;
 *   - while joining, peers' batches are held (in order) and applied after the snapshot, so
 *     the state is the snapshot followed by everything published after the request; the
 *     responder's batches held before its first chunk came are in the snapshot already (it
 *     published them before it answered, and NATS keeps one publisher's order), so their
 *     adds are skipped (applied again, an add whose free was lost would come back); their
 *     frees are applied (one of a request not in the snapshot is ignored, as unknown);
 *   - a peer's batch numbers are consecutive: a jump counts the batches lost in between;
 *   - a join that got no whole snapshot while peers were live (they reconnected to NATS after
 *     this router asked, or an answer was cut) is asked again when a peer's batch next comes,
 *     at most JOIN_RETRIES times in a row: without it, requests a peer booked while NATS was
 *     down stayed unknown here, and its stale ones stayed counted, until they expired.
 *
 * Trust: anyone who can publish on NATS can send a batch in any router's name, so what a
 * message can do is bounded here, whoever sent it:
 *   - a batch's add is taken only when its origin is the batch's router; a free or first token
 *     only for a request learnt from that same router (a local booking is never touched from
 *     NATS: its id is not in origins);
 *   - peers' bookings live in the load tracker's peer budget (router_sync_max_peer_requests,
 *     apart from router_max_requests: local requests are never crowded out), at most
 *     router_sync_max_requests_per_peer of one origin, from at most KVR_PEER_REQS_MAX_ORIGINS
 *     origins; an add's numbers are range-checked (block size, a prompt within
 *     router_max_prompt_tokens, so its hashes are bounded too);
 *   - snapshots are served at most SNAP_BURST at once, then one per SNAP_REFILL_MS (each
 *     costs O(live requests) of loop time), and once per SNAP_SAME_MS to one requester.
 */
#include "cluster/replica_sync.h"
#include "base/clock.h"

#include <event2/event.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/grow.h"
#include "cluster/peer_reqs.h"
#include "core/load.h"
#include "kvrouter.h"
#include "base/log.h"
#include "wire/prom.h"
#include "wire/sync_msg.h"

#define BATCH_MAX 256u
#define FLUSH_US 1000
#define SWEEP_MS 1000
#define SWEEP_SLOTS 8192
#define HOLD_MAX_BYTES ((size_t)256 << 20)
#define SUBJECT_BYTES 160
#define SNAP_BURST 8
#define SNAP_REFILL_MS 2000
#define SNAP_SAME_MS 2000
#define MAX_BLOCK_SIZE 65536u /* the block_size setting's range */
#define JOIN_RETRIES 3u       /* joins asked again in a row after one got no snapshot */

typedef struct held {
    struct held *next;
    size_t len;
    bool in_snapshot; /* the responder's, held before its snapshot came: already in it */
    uint8_t data[];
} held_t;

typedef struct peer_seq {
    uint64_t id, last;
} peer_seq_t;

typedef enum join_state { JOIN_IDLE = 0, JOIN_WAITING, JOIN_DONE } join_state_t;

static const double LAG_BOUNDS[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003,
                                    0.004,  0.005,   0.01,   0.025, 0.05,   0.1,   0.5,
                                    1.0};

struct kvr_replica_sync {
    kvr_replica_sync_config_t cfg;
    uint64_t self;
    char subj_events[SUBJECT_BYTES], subj_snap[SUBJECT_BYTES], subj_reply[SUBJECT_BYTES];
    kvr_router_t *r;
    /* publishing */
    kvr_sync_writer_t batch;
    uint64_t batch_seq;
    struct event *flush;
    bool flush_armed;
    size_t max_payload;
    /* applying */
    kvr_peer_reqs_t *origins;
    peer_seq_t seqs[KVR_MAX_PEERS];
    uint64_t *scratch; /* a peer's hashes, decoded */
    size_t scratch_cap;
    struct event *sweep;
    /* joining */
    join_state_t join;
    bool connected; /* as last told: a join starts on each connection */
    bool reconnect; /* the join follows a reconnect: drop what peers told before */
    bool retry_join; /* the last join got no whole snapshot while peers were live: ask again
                        when one is heard from (at most JOIN_RETRIES times in a row) */
    uint32_t join_retries;
    uint64_t join_deadline_ms, responder, next_chunk;
    struct event *join_timer;
    held_t *held, *held_tail;
    size_t held_bytes;
    kvr_sync_writer_t snap; /* serving a snapshot */
    double snap_tokens;     /* token bucket: snapshots that may be served now */
    uint64_t snap_refill_ms, snap_last_to, snap_last_ms;
    /* figures */
    kvr_hist_t lag;
    uint64_t pub_events, pub_batches, applied[4], ignored_self, duplicates, unknown_worker,
        rejected, bad_messages, lost_batches, held_dropped, snap_requests, snap_served,
        snap_entries, snap_timeouts, snap_incomplete, freed_gone, freed_reconnect, swept;
    uint64_t forged_origin, unowned, out_of_range, peer_limited, snap_refused;
    kvr_ratelimit_t rl;
};

/* ---- publishing local events ---- */

static void begin_batch(kvr_replica_sync_t *s)
{
    kvr_sync_header_t h = {.type = KVR_SYNC_EVENTS, .router_id = s->self};
    kvr_sync_begin(&s->batch, &h);
}

static void publish_batch(kvr_replica_sync_t *s)
{
    if (s->batch.n_events == 0)
        return;
    /* numbered and timed as published */
    kvr_sync_stamp(&s->batch, ++s->batch_seq, (kvr_wall_ns() / 1000u));
    (void)kvr_nats_publish(s->cfg.nats, s->subj_events, NULL, s->batch.buf, s->batch.len);
    s->pub_batches++;
    s->pub_events += s->batch.n_events;
    begin_batch(s);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_replica_sync_t *s = arg;
    s->flush_armed = false;
    publish_batch(s);
}

static void add_local(kvr_replica_sync_t *s, const kvr_sync_event_t *ev)
{
    size_t need = kvr_sync_event_bytes(ev);
    if (s->batch.len + need > s->max_payload)
        publish_batch(s);
    if (kvr_sync_add(&s->batch, ev) != KVR_OK) {
        s->rejected++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: an event of request %.*s could not be "
                        "batched (out of memory, or %zu hashes); peers will not see it",
                        (int)ev->id_len, ev->id, ev->n_seq);
        return;
    }
    if (s->batch.n_events >= BATCH_MAX) {
        publish_batch(s);
    } else if (!s->flush_armed) {
        struct timeval tv = {0, FLUSH_US};
        s->flush_armed = event_add(s->flush, &tv) == 0;
    }
}

/* The scheduler's observer: this router's bookings, first tokens and frees. */
static void on_sched(void *arg, const kvr_sched_event_t *ev)
{
    kvr_replica_sync_t *s = arg;
    if (ev->origin != KVR_SCHED_ORIGIN_LOCAL || ev->id == NULL)
        return;
    kvr_sync_event_t e = {.id = ev->id, .id_len = ev->id_len};
    switch (ev->kind) {
    case KVR_SCHED_ROUTED: {
        const kvr_load_request_t *b = ev->booking;
        if (b == NULL)
            return;
        e.kind = KVR_SYNC_ADD;
        e.origin = s->self;
        e.worker = b->worker;
        e.block_size = b->block_size;
        e.isl_tokens = b->isl_tokens;
        e.cached_tokens = b->cached_tokens;
        e.has_expected_output_tokens = b->has_expected_output_tokens;
        e.expected_output_tokens = b->expected_output_tokens;
        e.assume_kv_reuse = b->assume_kv_reuse;
        e.track_prefill_tokens = b->track_prefill_tokens;
        e.seq = b->seq;
        e.n_seq = b->n_seq;
        break;
    }
    case KVR_SCHED_FIRST_TOKEN:
        e.kind = KVR_SYNC_PREFILL_DONE;
        break;
    case KVR_SCHED_FREE:
        e.kind = KVR_SYNC_FREE;
        break;
    default:
        return; /* output blocks are not synced (as the reference) */
    }
    add_local(s, &e);
}

/* ---- applying a peer's events ---- */

static void on_gone_handle(void *arg, kvr_req_handle_t h)
{
    kvr_replica_sync_t *s = arg;
    kvr_sched_event_t ev = {.kind = KVR_SCHED_FREE, .origin = KVR_SCHED_ORIGIN_PEER,
                            .handle = h, .decay_fraction = NAN};
    (void)kvr_sched_apply(s->cfg.sched, &ev, kvr_now_ms());
}

static const uint64_t *decode_seq(kvr_replica_sync_t *s, const kvr_sync_event_t *ev)
{
    if (ev->n_seq == 0)
        return NULL;
    if (kvr_grow((void **)&s->scratch, &s->scratch_cap, ev->n_seq, KVR_SYNC_MAX_SEQ,
                 sizeof *s->scratch) != KVR_OK)
        return NULL;
    for (size_t i = 0; i < ev->n_seq; i++)
        s->scratch[i] = kvr_sync_seq_at(ev, i);
    return s->scratch;
}

/* Why a peer's add cannot be a real booking (NULL when it can): its numbers are out of the
 * ranges a router publishes. */
static const char *add_out_of_range(const kvr_replica_sync_t *s, const kvr_sync_event_t *ev)
{
    const kvr_router_config_t *c = kvr_router_config(s->r);
    uint32_t bs = ev->block_size != 0 ? ev->block_size : c->block_size; /* 0: this router's */
    if (bs > MAX_BLOCK_SIZE)
        return "block_size out of range";
    if (ev->isl_tokens > c->router_max_prompt_tokens)
        return "isl_tokens above router_max_prompt_tokens";
    if (ev->cached_tokens > ev->isl_tokens)
        return "cached_tokens above isl_tokens";
    if (ev->n_seq > ev->isl_tokens / bs)
        return "more block hashes than the prompt has blocks";
    return NULL;
}

/* Whether origin may book one more here (its own bound; the total is the tracker's). */
static bool origin_has_room(kvr_replica_sync_t *s, uint64_t origin)
{
    uint64_t cap = kvr_router_config(s->r)->router_sync_max_requests_per_peer;
    if (kvr_peer_reqs_origin_count(s->origins, origin) < cap)
        return true;
    s->peer_limited++;
    kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: router %016llx already has %llu requests "
                    "booked here (router_sync_max_requests_per_peer); its add is refused",
                    (unsigned long long)origin, (unsigned long long)cap);
    return false;
}

/* A peer's add. publisher: the router whose batch carried it (0 for a snapshot's, which
 * relays every router's requests). */
static void apply_add(kvr_replica_sync_t *s, const kvr_sync_event_t *ev, uint64_t now,
                      uint64_t publisher)
{
    if (ev->origin == s->self || ev->origin == 0)
        return; /* our own, come back in a peer's snapshot */
    if (publisher != 0 && ev->origin != publisher) {
        s->forged_origin++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: router %016llx published an add in the "
                        "name of router %016llx; refused (a router publishes its own bookings)",
                        (unsigned long long)publisher, (unsigned long long)ev->origin);
        return;
    }
    const char *bad = add_out_of_range(s, ev);
    if (bad != NULL) {
        s->out_of_range++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: add of request %.*s from router %016llx "
                        "refused: %s", (int)ev->id_len, ev->id, (unsigned long long)ev->origin,
                        bad);
        return;
    }
    kvr_load_request_info_t info;
    if (kvr_load_request_info(kvr_router_load(s->r), ev->id, ev->id_len, &info) == KVR_OK) {
        s->duplicates++; /* already known (a snapshot and a held batch overlap) */
        return;
    }
    if (!origin_has_room(s, ev->origin))
        return;
    const uint64_t *seq = decode_seq(s, ev);
    kvr_load_request_t lr = {.id = ev->id,
                             .id_len = ev->id_len,
                             .worker = ev->worker,
                             .seq = seq,
                             .n_seq = seq != NULL ? ev->n_seq : 0,
                             .isl_tokens = ev->isl_tokens,
                             .cached_tokens = ev->cached_tokens,
                             .has_expected_output_tokens = ev->has_expected_output_tokens,
                             .expected_output_tokens = ev->expected_output_tokens,
                             .block_size = ev->block_size,
                             .assume_kv_reuse = ev->assume_kv_reuse,
                             .track_prefill_tokens = ev->track_prefill_tokens,
                             .peer = true};
    kvr_req_handle_t h;
    int rc = kvr_sched_admit_peer(s->cfg.sched, &lr, now, &h);
    if (rc == KVR_ENOWORKER) {
        s->unknown_worker++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: router %016llx booked worker %llu rank %u, "
                        "which this router does not know; its load is not counted here",
                        (unsigned long long)ev->origin,
                        (unsigned long long)ev->worker.worker_id, ev->worker.dp_rank);
        return;
    }
    if (rc != KVR_OK) {
        s->rejected++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: request %.*s of router %016llx refused: %s%s",
                        (int)ev->id_len, ev->id, (unsigned long long)ev->origin,
                        kvr_strerror(rc), rc == KVR_EFULL ? " (router_sync_max_peer_requests)"
                                                          : "");
        return;
    }
    if ((rc = kvr_peer_reqs_put(s->origins, ev->id, ev->id_len, ev->origin, h)) != KVR_OK) {
        /* untracked, nobody could free it: undone (too many origins, or out of memory) */
        on_gone_handle(s, h);
        s->rejected++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: request %.*s of router %016llx refused: "
                        "%s", (int)ev->id_len, ev->id, (unsigned long long)ev->origin,
                        rc == KVR_EFULL ? "more than 256 routers have requests booked here"
                                        : kvr_strerror(rc));
        return;
    }
    s->applied[KVR_SYNC_ADD]++;
    if (ev->prefill_done) {
        kvr_sched_event_t ft = {.kind = KVR_SCHED_FIRST_TOKEN, .origin = KVR_SCHED_ORIGIN_PEER,
                                .handle = h, .decay_fraction = NAN};
        (void)kvr_sched_apply(s->cfg.sched, &ft, now);
    }
}

/* A batch's event; publisher: the batch's router. A free or first token applies only to a
 * request learnt from that router, by its handle. */
static void apply_event(kvr_replica_sync_t *s, const kvr_sync_event_t *ev, uint64_t now,
                        uint64_t publisher)
{
    if (ev->kind == KVR_SYNC_ADD) {
        apply_add(s, ev, now, publisher);
        return;
    }
    /* one lookup: the request must be one this router learnt from the publisher */
    uint64_t origin = 0;
    kvr_req_handle_t h = KVR_REQ_HANDLE_NONE;
    bool owned = ev->kind == KVR_SYNC_FREE
                     ? kvr_peer_reqs_take_from(s->origins, ev->id, ev->id_len, publisher, &h)
                     : kvr_peer_reqs_get(s->origins, ev->id, ev->id_len, &origin, &h) &&
                           origin == publisher;
    if (!owned) {
        s->unowned++; /* unknown here (missed add), local, or another router's */
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: %s of request %.*s from router %016llx "
                        "ignored: no request booked by that router has that id here (a local "
                        "request is never ended from NATS)",
                        ev->kind == KVR_SYNC_FREE ? "free" : "first token", (int)ev->id_len,
                        ev->id, (unsigned long long)publisher);
        return;
    }
    kvr_sched_event_t se = {.origin = KVR_SCHED_ORIGIN_PEER, .handle = h,
                            .kind = ev->kind == KVR_SYNC_FREE ? KVR_SCHED_FREE
                                                              : KVR_SCHED_FIRST_TOKEN,
                            .decay_fraction = NAN};
    if (h != KVR_REQ_HANDLE_NONE && kvr_sched_apply(s->cfg.sched, &se, now) == KVR_OK)
        s->applied[ev->kind]++; /* else it ended here already (expiry): nothing to do */
}

static void bad_message(kvr_replica_sync_t *s, const char *subject, const char *err)
{
    s->bad_messages++;
    kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: message on %s refused: %s", subject, err);
}

/* Lost batches between the peer's last and this one (a new peer starts wherever it is). */
static uint64_t lost_before(kvr_replica_sync_t *s, uint64_t peer, uint64_t seq)
{
    peer_seq_t *free_slot = NULL;
    for (size_t i = 0; i < KVR_MAX_PEERS; i++) {
        peer_seq_t *p = &s->seqs[i];
        if (p->id == peer) {
            uint64_t lost = seq > p->last + 1 ? seq - p->last - 1 : 0;
            p->last = seq > p->last ? seq : p->last;
            return lost;
        }
        if (p->id == 0 && free_slot == NULL)
            free_slot = p;
    }
    if (free_slot == NULL)
        free_slot = &s->seqs[peer % KVR_MAX_PEERS]; /* full: forget one */
    *free_slot = (peer_seq_t){.id = peer, .last = seq};
    return 0;
}

/* Applies a peer's batch; with in_snapshot, its adds are not (the snapshot just applied has
 * them, and those whose free was lost must not come back); its frees and first tokens are,
 * in case the order NATS keeps was not the order the snapshot was taken in. */
static void apply_batch(kvr_replica_sync_t *s, const uint8_t *data, size_t len, bool in_snapshot)
{
    kvr_sync_reader_t rd;
    char err[200];
    if (kvr_sync_open(&rd, data, len, err, sizeof err) != KVR_OK) {
        bad_message(s, s->subj_events, err);
        return;
    }
    if (rd.h.type != KVR_SYNC_EVENTS) {
        bad_message(s, s->subj_events, "not an events batch");
        return;
    }
    if (rd.h.router_id == s->self) {
        s->ignored_self++;
        return;
    }
    uint64_t lost = lost_before(s, rd.h.router_id, rd.h.seq);
    if (lost > 0) {
        s->lost_batches += lost;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: %llu batches of router %016llx were lost "
                        "(its load here may be off until its requests end or expire)",
                        (unsigned long long)lost, (unsigned long long)rd.h.router_id);
    }
    uint64_t now = kvr_now_ms(), wall = (kvr_wall_ns() / 1000u);
    kvr_sync_event_t ev;
    while (kvr_sync_next(&rd, &ev) == KVR_OK)
        if (!in_snapshot || ev.kind != KVR_SYNC_ADD) /* a free of one not in it: ignored */
            apply_event(s, &ev, now, rd.h.router_id);
    uint64_t lag = wall > rd.h.sent_us ? wall - rd.h.sent_us : 0;
    kvr_hist_observe(&s->lag, (double)lag / 1e6);
    kvr_replicas_seen(s->cfg.replicas, rd.h.router_id, lag, lost);
}

static void hold(kvr_replica_sync_t *s, const uint8_t *data, size_t len)
{
    held_t *h = s->held_bytes + len <= HOLD_MAX_BYTES ? malloc(sizeof *h + len) : NULL;
    if (h == NULL) {
        s->held_dropped++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: a batch that arrived while joining was "
                        "dropped (%zu bytes held)", s->held_bytes);
        return;
    }
    h->next = NULL;
    h->len = len;
    h->in_snapshot = false;
    memcpy(h->data, data, len);
    if (s->held_tail != NULL)
        s->held_tail->next = h;
    else
        s->held = h;
    s->held_tail = h;
    s->held_bytes += len;
}

static void join_start(kvr_replica_sync_t *s);

static void on_events(void *arg, const char *subject, const char *reply, const uint8_t *data,
                      size_t len)
{
    (void)subject;
    (void)reply;
    kvr_replica_sync_t *s = arg;
    if (s->join == JOIN_DONE && s->retry_join) { /* held, then applied after the snapshot */
        s->retry_join = false;
        s->join_retries++;
        kvr_log(KVR_LOG_INFO, "sync: a peer is heard from after a join without its snapshot: "
                "asking again (%u of %u)", s->join_retries, JOIN_RETRIES);
        s->join = JOIN_IDLE;
        join_start(s);
    }
    if (s->join == JOIN_WAITING)
        hold(s, data, len);
    else
        apply_batch(s, data, len, false);
}

/* ---- joining: asking for a snapshot ---- */

static void join_done(kvr_replica_sync_t *s, const char *how)
{
    if (s->join != JOIN_WAITING)
        return;
    s->join = JOIN_DONE;
    event_del(s->join_timer);
    held_t *h = s->held;
    size_t n = 0, known = 0;
    s->held = s->held_tail = NULL;
    s->held_bytes = 0;
    while (h != NULL) {
        held_t *next = h->next;
        apply_batch(s, h->data, h->len, h->in_snapshot);
        known += h->in_snapshot;
        free(h);
        h = next;
        n++;
    }
    kvr_log(KVR_LOG_INFO, "sync: joined (%s); %zu batches held meanwhile applied (%zu of them "
            "the responder's, in its snapshot already), %zu requests of peers known", how,
            n - known, known, kvr_peer_reqs_count(s->origins));
}

static void join_start(kvr_replica_sync_t *s)
{
    if (s->join == JOIN_WAITING)
        return;
    s->join = JOIN_WAITING;
    s->responder = 0;
    s->next_chunk = 0;
    s->join_deadline_ms = kvr_now_ms() + s->cfg.snapshot_wait_ms;
    kvr_sync_writer_t w = {0};
    kvr_sync_header_t h = {.type = KVR_SYNC_SNAP_REQ, .router_id = s->self,
                           .sent_us = (kvr_wall_ns() / 1000u)};
    kvr_sync_begin(&w, &h);
    if (w.len == KVR_SYNC_HEADER_BYTES &&
        kvr_nats_publish(s->cfg.nats, s->subj_snap, s->subj_reply, w.buf, w.len) == KVR_OK)
        s->snap_requests++;
    kvr_sync_writer_free(&w);
    struct timeval tv = {(time_t)(s->cfg.snapshot_wait_ms / 1000),
                         (suseconds_t)(s->cfg.snapshot_wait_ms % 1000) * 1000};
    event_add(s->join_timer, &tv);
}

static void on_join_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_replica_sync_t *s = arg;
    bool live = kvr_replicas_live_for(s->cfg.replicas, s->cfg.snapshot_wait_ms) > 0;
    /* a peer that reconnected after this router asked (or whose answer was cut) has what the
     * outage hid: its next batch brings a new join, which asks it */
    bool again = live && s->join_retries < JOIN_RETRIES;
    if (s->responder == 0) {
        if (live) {
            s->snap_timeouts++;
            kvr_log(KVR_LOG_WARN, "sync: no peer answered the snapshot request within %llu ms; "
                    "%s", (unsigned long long)s->cfg.snapshot_wait_ms,
                    again ? "asked again when a peer is heard from"
                          : "peers' requests already in flight are not counted until they end");
        }
        join_done(s, "no snapshot: no peer answered");
    } else {
        s->snap_incomplete++;
        join_done(s, "snapshot incomplete: its last chunk did not come in time");
    }
    s->retry_join = again;
}

/* The responder's batches held so far: it published them before its snapshot, which has
 * their effects. */
static void mark_in_snapshot(kvr_replica_sync_t *s, uint64_t responder)
{
    for (held_t *h = s->held; h != NULL; h = h->next) {
        kvr_sync_reader_t rd;
        char err[8];
        h->in_snapshot = kvr_sync_open(&rd, h->data, h->len, err, sizeof err) == KVR_OK &&
                         rd.h.type == KVR_SYNC_EVENTS && rd.h.router_id == responder;
    }
}

static void on_reply(void *arg, const char *subject, const char *reply, const uint8_t *data,
                     size_t len)
{
    (void)reply;
    kvr_replica_sync_t *s = arg;
    kvr_sync_reader_t rd;
    char err[200];
    if (len == 0) /* NATS's "no responders" status (a reply with no payload, when no other
                     replica listens): not a message to refuse; the join's deadline ends it
                     (anyone could send one: it is not taken as the end of the join) */
        return;
    if (kvr_sync_open(&rd, data, len, err, sizeof err) != KVR_OK ||
        rd.h.type != KVR_SYNC_SNAPSHOT) {
        bad_message(s, subject, rd.h.type != KVR_SYNC_SNAPSHOT ? "not a snapshot" : err);
        return;
    }
    if (s->join != JOIN_WAITING)
        return; /* late, or a second responder */
    if (s->responder == 0 && rd.h.seq == 0) {
        s->responder = rd.h.router_id;
        mark_in_snapshot(s, s->responder);
        if (s->reconnect) { /* what peers told before the break may be stale: start over */
            int st;
            s->freed_reconnect +=
                kvr_peer_reqs_take_origin(s->origins, 0, on_gone_handle, s, &st);
        }
    }
    if (rd.h.router_id != s->responder || rd.h.seq != s->next_chunk)
        return; /* another responder's, or out of order (then the deadline ends the join) */
    s->next_chunk++;
    uint64_t now = kvr_now_ms();
    kvr_sync_event_t ev;
    while (kvr_sync_next(&rd, &ev) == KVR_OK) {
        if (ev.kind == KVR_SYNC_ADD) {
            apply_add(s, &ev, now, 0);
            s->snap_entries++;
        }
    }
    if ((rd.h.flags & KVR_SYNC_FLAG_LAST) != 0) {
        s->join_retries = 0;
        s->retry_join = false;
        char how[96];
        snprintf(how, sizeof how, "snapshot from router %016llx, %llu chunks",
                 (unsigned long long)s->responder, (unsigned long long)s->next_chunk);
        join_done(s, how);
    }
}

/* ---- serving a snapshot ---- */

typedef struct snap_ctx {
    kvr_replica_sync_t *s;
    const char *reply;
    uint64_t chunk;
    size_t limit;
} snap_ctx_t;

static void snap_begin(snap_ctx_t *c)
{
    kvr_sync_header_t h = {.type = KVR_SYNC_SNAPSHOT, .router_id = c->s->self,
                           .seq = c->chunk, .sent_us = (kvr_wall_ns() / 1000u)};
    kvr_sync_begin(&c->s->snap, &h);
}

static void snap_send(snap_ctx_t *c, bool last)
{
    kvr_replica_sync_t *s = c->s;
    if (last)
        kvr_sync_set_flags(&s->snap, KVR_SYNC_FLAG_LAST);
    (void)kvr_nats_publish(s->cfg.nats, c->reply, NULL, s->snap.buf, s->snap.len);
    c->chunk++;
    snap_begin(c);
}

static int snap_visit(void *arg, const kvr_load_request_view_t *v)
{
    snap_ctx_t *c = arg;
    kvr_replica_sync_t *s = c->s;
    uint64_t origin = s->self;
    (void)kvr_peer_reqs_get(s->origins, v->id, v->id_len, &origin, NULL);
    /* the tracker keeps what is left to prefill, not the prompt's length: a prompt as long as
     * its blocks (at this router's block size, which the joiner's tracker assumes for 0) with
     * the rest cached gives the same prefill load and a consistent add */
    uint64_t prefill = v->info.prefill_tokens;
    uint64_t blocks = (uint64_t)v->info.n_prompt_blocks * kvr_router_config(s->r)->block_size;
    uint64_t isl = prefill > blocks ? prefill : blocks;
    kvr_sync_event_t e = {.kind = KVR_SYNC_ADD,
                          .id = v->id,
                          .id_len = v->id_len,
                          .origin = origin,
                          .worker = v->info.worker,
                          .isl_tokens = isl,
                          .cached_tokens = isl - prefill,
                          .has_expected_output_tokens = v->info.has_expected_output_tokens,
                          .expected_output_tokens = v->info.expected_output_tokens,
                          .prefill_done = v->info.prefill_tokens == 0,
                          .seq = v->prompt_hashes,
                          .n_seq = v->info.n_prompt_blocks};
    /* a prompt too long for one chunk goes with the hashes that fit (its leading blocks) */
    size_t room = c->limit - KVR_SYNC_HEADER_BYTES - kvr_sync_event_bytes(&e) + 8 * e.n_seq;
    if (8 * e.n_seq > room)
        e.n_seq = room / 8;
    if (s->snap.len + kvr_sync_event_bytes(&e) > c->limit)
        snap_send(c, false);
    (void)kvr_sync_add(&s->snap, &e);
    return 0;
}

/* The snapshot rate limit (see the top): true when one may be served to requester now. */
static bool snap_allowed(kvr_replica_sync_t *s, uint64_t requester)
{
    uint64_t now = kvr_now_ms();
    if (s->snap_refill_ms == 0) {
        s->snap_tokens = SNAP_BURST;
        s->snap_refill_ms = now;
    }
    s->snap_tokens += (double)(now - s->snap_refill_ms) / SNAP_REFILL_MS;
    if (s->snap_tokens > SNAP_BURST)
        s->snap_tokens = SNAP_BURST;
    s->snap_refill_ms = now;
    const char *why = NULL;
    if (requester == s->snap_last_to && now - s->snap_last_ms < SNAP_SAME_MS)
        why = "it was sent one less than 2 s ago";
    else if (s->snap_tokens < 1)
        why = "more than 8 requests at once, then one per 2 s, are served";
    if (why != NULL) {
        s->snap_refused++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "sync: snapshot request of router %016llx "
                        "refused: %s", (unsigned long long)requester, why);
        return false;
    }
    s->snap_tokens -= 1;
    s->snap_last_to = requester;
    s->snap_last_ms = now;
    return true;
}

static void on_snap_request(void *arg, const char *subject, const char *reply,
                            const uint8_t *data, size_t len)
{
    kvr_replica_sync_t *s = arg;
    kvr_sync_reader_t rd;
    char err[200];
    if (kvr_sync_open(&rd, data, len, err, sizeof err) != KVR_OK ||
        rd.h.type != KVR_SYNC_SNAP_REQ || reply[0] == '\0') {
        bad_message(s, subject, reply[0] == '\0' ? "a snapshot request without a reply subject"
                                                  : err);
        return;
    }
    if (rd.h.router_id == s->self || (s->join == JOIN_WAITING && !s->reconnect))
        return; /* ours, or we are new ourselves: another peer answers (a replica joining
                   again after a reconnect answers with what it had: after a NATS restart
                   every replica rejoins at once) */
    if (!snap_allowed(s, rd.h.router_id))
        return;
    snap_ctx_t c = {.s = s, .reply = reply, .limit = s->max_payload};
    snap_begin(&c);
    (void)kvr_load_foreach(kvr_router_load(s->r), snap_visit, &c);
    snap_send(&c, true);
    s->snap_served++;
}

/* ---- upkeep, state, figures ---- */

static bool handle_live(void *arg, kvr_req_handle_t h)
{
    const char *id;
    size_t len;
    return kvr_load_handle_id(kvr_router_load(((kvr_replica_sync_t *)arg)->r), h, &id, &len) ==
           KVR_OK;
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_replica_sync_t *s = arg;
    s->swept += kvr_peer_reqs_sweep(s->origins, handle_live, s, SWEEP_SLOTS);
}

static void on_peer_gone(void *arg, uint64_t router_id, const char *why)
{
    kvr_replica_sync_t *s = arg;
    int st;
    size_t n = kvr_peer_reqs_take_origin(s->origins, router_id, on_gone_handle, s, &st);
    s->freed_gone += n;
    if (n > 0)
        kvr_log(KVR_LOG_INFO, "sync: %zu requests of router %016llx freed (%s)", n,
                (unsigned long long)router_id, why);
}

static void on_state(void *arg, kvr_nats_state_t st)
{
    kvr_replica_sync_t *s = arg;
    bool was = s->connected;
    s->connected = st == KVR_NATS_CONNECTED;
    if (!s->connected || was)
        return;
    s->max_payload = kvr_nats_max_payload(s->cfg.nats);
    s->reconnect = s->reconnect || s->join == JOIN_DONE; /* once joined, every join is a
                                              rejoin (a connection may drop again mid-join) */
    s->join = JOIN_IDLE;
    join_start(s);
}

bool kvr_replica_sync_ready(const kvr_replica_sync_t *s) { return s->join == JOIN_DONE; }

static bool ext_ready(void *arg, const char **why)
{
    kvr_replica_sync_t *s = arg;
    *why = "replica sync: waiting for NATS and a snapshot of the peers' active requests";
    return kvr_replica_sync_ready(s);
}

static void ext_metrics(void *arg, kvr_prom_t *p)
{
    kvr_replica_sync_t *s = arg;
    kvr_prom_counter(p, "kvr_sync_published_events_total",
                     "local lifecycle events published to the other replicas",
                     (double)s->pub_events);
    kvr_prom_counter(p, "kvr_sync_published_batches_total", "batches published",
                     (double)s->pub_batches);
    const kvr_prom_by_t kinds[] = {{"add", (double)s->applied[1]},
                                   {"prefill_done", (double)s->applied[2]},
                                   {"free", (double)s->applied[3]}};
    kvr_prom_by_label(p, "kvr_sync_applied_events_total", "counter",
                      "peers' lifecycle events applied here, by kind", "kind", kinds,
                      KVR_PROM_N(kinds));
    kvr_prom_counter(p, "kvr_sync_bad_messages_total",
                     "sync messages refused (undecodable, wrong type)", (double)s->bad_messages);
    kvr_prom_counter(p, "kvr_sync_lost_batches_total",
                     "peers' batches missed (gaps in their numbering)", (double)s->lost_batches);
    kvr_prom_counter(p, "kvr_sync_duplicate_adds_total",
                     "peers' adds of a request already known here", (double)s->duplicates);
    kvr_prom_counter(p, "kvr_sync_unknown_worker_total",
                     "peers' adds for a worker this router does not know (not counted)",
                     (double)s->unknown_worker);
    kvr_prom_counter(p, "kvr_sync_rejected_total",
                     "events refused by the load tracker or not batched", (double)s->rejected);
    kvr_prom_counter(p, "kvr_sync_held_dropped_total",
                     "batches dropped while joining (the hold was full)",
                     (double)s->held_dropped);
    kvr_prom_counter(p, "kvr_sync_snapshot_requests_total", "snapshots asked for (joins)",
                     (double)s->snap_requests);
    kvr_prom_counter(p, "kvr_sync_snapshots_served_total", "snapshots sent to joining peers",
                     (double)s->snap_served);
    kvr_prom_counter(p, "kvr_sync_snapshot_entries_total", "requests received in snapshots",
                     (double)s->snap_entries);
    kvr_prom_counter(p, "kvr_sync_snapshot_timeouts_total",
                     "joins with live peers and no snapshot answer", (double)s->snap_timeouts);
    kvr_prom_counter(p, "kvr_sync_snapshot_incomplete_total",
                     "joins whose snapshot's last chunk never came", (double)s->snap_incomplete);
    kvr_prom_counter(p, "kvr_sync_forged_origin_total",
                     "adds refused: their origin was not the router that published the batch",
                     (double)s->forged_origin);
    kvr_prom_counter(p, "kvr_sync_unowned_events_total",
                     "frees and first tokens ignored: no request of the publishing router by that "
                     "id is known here (a local request is never ended from NATS)",
                     (double)s->unowned);
    kvr_prom_counter(p, "kvr_sync_out_of_range_total",
                     "adds refused: block size, prompt length or hash count out of range",
                     (double)s->out_of_range);
    kvr_prom_counter(p, "kvr_sync_peer_limited_total",
                     "adds refused: the peer already had router_sync_max_requests_per_peer here",
                     (double)s->peer_limited);
    kvr_prom_counter(p, "kvr_sync_snapshot_requests_refused_total",
                     "snapshot requests not served (rate limit)", (double)s->snap_refused);
    const kvr_prom_by_t freed[] = {{"peer_gone", (double)s->freed_gone},
                                   {"reconnect", (double)s->freed_reconnect}};
    kvr_prom_by_label(p, "kvr_sync_peer_requests_freed_total", "counter",
                      "peers' requests freed here without their free event, by why", "why", freed,
                      KVR_PROM_N(freed));
    kvr_prom_gauge(p, "kvr_sync_peer_requests", "live requests booked by peers",
                   (double)kvr_peer_reqs_count(s->origins));
    kvr_prom_gauge(p, "kvr_sync_joined", "1 once the snapshot join is done",
                   s->join == JOIN_DONE);
    kvr_prom_family(p, "kvr_sync_lag_seconds", "histogram",
                    "A peer's sync message: published to applied here, seconds.");
    kvr_prom_hist(p, "kvr_sync_lag_seconds", NULL, 0, &s->lag);
}

kvr_replica_sync_t *kvr_replica_sync_new(const kvr_replica_sync_config_t *cfg, int *status)
{
    kvr_replica_sync_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    s->cfg = *cfg;
    if (s->cfg.snapshot_wait_ms == 0)
        s->cfg.snapshot_wait_ms = 1000;
    s->r = kvr_sched_router(cfg->sched);
    s->self = kvr_replicas_self(cfg->replicas);
    s->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);
    s->max_payload = kvr_nats_max_payload(cfg->nats);
    kvr_hist_init(&s->lag, LAG_BOUNDS, sizeof LAG_BOUNDS / sizeof LAG_BOUNDS[0]);
    snprintf(s->subj_events, SUBJECT_BYTES, "%s.active_sequences", cfg->ns);
    snprintf(s->subj_snap, SUBJECT_BYTES, "%s.sync.snapshot", cfg->ns);
    snprintf(s->subj_reply, SUBJECT_BYTES, "%s.sync.reply.%016llx", cfg->ns,
             (unsigned long long)s->self);
    begin_batch(s);
    kvr_http_service_t ext = {.metrics = ext_metrics, .ready = ext_ready, .arg = s};
    struct timeval sweep = {SWEEP_MS / 1000, 0};
    int rc = KVR_OK;
    if ((s->origins = kvr_peer_reqs_new(s->self)) == NULL ||
        (s->flush = event_new(cfg->base, -1, 0, on_flush, s)) == NULL ||
        (s->join_timer = event_new(cfg->base, -1, 0, on_join_timeout, s)) == NULL ||
        (s->sweep = event_new(cfg->base, -1, EV_PERSIST, on_sweep, s)) == NULL ||
        event_add(s->sweep, &sweep) != 0)
        rc = KVR_ENOMEM;
    if (rc == KVR_OK)
        rc = kvr_nats_subscribe(cfg->nats, s->subj_events, on_events, s);
    if (rc == KVR_OK)
        rc = kvr_nats_subscribe(cfg->nats, s->subj_snap, on_snap_request, s);
    if (rc == KVR_OK)
        rc = kvr_nats_subscribe(cfg->nats, s->subj_reply, on_reply, s);
    if (rc == KVR_OK)
        rc = kvr_nats_on_state(cfg->nats, on_state, s);
    if (rc == KVR_OK)
        rc = kvr_sched_observe_named(cfg->sched, on_sched, s);
    if (rc == KVR_OK)
        rc = kvr_http_host_add_service(cfg->host, &ext);
    if (rc != KVR_OK) {
        *status = rc;
        kvr_replica_sync_free(s);
        return NULL;
    }
    kvr_replicas_on_gone(cfg->replicas, on_peer_gone, s);
    if (kvr_nats_state(cfg->nats) == KVR_NATS_CONNECTED) {
        s->connected = true;
        join_start(s);
    }
    *status = KVR_OK;
    return s;
}

void kvr_replica_sync_free(kvr_replica_sync_t *s)
{
    if (s == NULL)
        return;
    if (s->batch.len > 0)
        publish_batch(s);
    kvr_sched_unobserve(s->cfg.sched, on_sched, s);
    kvr_http_host_remove_service(s->cfg.host, s);
    kvr_replicas_on_gone(s->cfg.replicas, NULL, NULL);
    if (s->flush != NULL)
        event_free(s->flush);
    if (s->join_timer != NULL)
        event_free(s->join_timer);
    if (s->sweep != NULL)
        event_free(s->sweep);
    for (held_t *h = s->held, *next; h != NULL; h = next) {
        next = h->next;
        free(h);
    }
    kvr_peer_reqs_free(s->origins);
    kvr_sync_writer_free(&s->batch);
    kvr_sync_writer_free(&s->snap);
    free(s->scratch);
    free(s);
}

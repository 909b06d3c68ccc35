/*
 * zmq_listener.c: see zmq_listener.h for what it guarantees.
 *
 * Invariants: for each rank, on_batch has received batches in strictly increasing sequence
 * order since its last reset, each at most once; the cursor (seqtrack) is the last one handed
 * over (or skipped on purpose after a reset). A DEALER that timed out is closed and reopened,
 * so a late answer to an old replay request is never taken for a new one.
 * Threads: the owning thread only. Cost: per batch one zmq_msg_recv per frame and one
 * on_batch call; a replay costs one round trip plus the replayed batches.
 */
#include "net/zmq_listener.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "core/seqtrack.h"
#include "kvrouter.h"

#define DRAIN_PER_RANK 256 /* messages handled per rank per poll, so no rank starves others */

typedef struct rank {
    bool used;
    uint64_t worker_id;
    uint32_t dp_rank;
    void *sub;
    void *dealer;
    char replay_addr[256];
    kvr_seqtrack_t cur;
    uint64_t last_hash; /* of the last batch handed over: tells a repeat from a restart */
    kvr_zmq_rank_info_t info;
} rank_t;

struct kvr_zmq_listener {
    void *ctx;
    kvr_zmq_config_t cfg;
    kvr_zmq_handlers_t h;
    rank_t *ranks;
    size_t cap;
    zmq_pollitem_t *items;
    size_t *item_rank;
    kvr_zmq_stats_t st;
};

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* ---- creation ---- */

kvr_zmq_listener_t *kvr_zmq_listener_new(const kvr_zmq_config_t *cfg,
                                         const kvr_zmq_handlers_t *h, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    if (h == NULL || h->on_batch == NULL || h->on_reset == NULL) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_zmq_listener_t *l = calloc(1, sizeof *l);
    if (l == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    l->cfg = cfg ? *cfg : (kvr_zmq_config_t){0};
    if (l->cfg.replay_timeout_ms <= 0)
        l->cfg.replay_timeout_ms = 2000;
    if (l->cfg.max_ranks == 0)
        l->cfg.max_ranks = 1024;
    l->h = *h;
    l->cap = l->cfg.max_ranks;
    l->ranks = calloc(l->cap, sizeof *l->ranks);
    l->items = calloc(l->cap, sizeof *l->items);
    l->item_rank = calloc(l->cap, sizeof *l->item_rank);
    l->ctx = zmq_ctx_new();
    if (l->ranks == NULL || l->items == NULL || l->item_rank == NULL || l->ctx == NULL) {
        kvr_zmq_listener_free(l);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return l;
}

static void close_rank(rank_t *r)
{
    if (r->sub != NULL)
        zmq_close(r->sub);
    if (r->dealer != NULL)
        zmq_close(r->dealer);
    memset(r, 0, sizeof *r);
}

void kvr_zmq_listener_free(kvr_zmq_listener_t *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; l->ranks != NULL && i < l->cap; i++)
        if (l->ranks[i].used)
            close_rank(&l->ranks[i]);
    if (l->ctx != NULL)
        zmq_ctx_term(l->ctx);
    free(l->ranks);
    free(l->items);
    free(l->item_rank);
    free(l);
}

/* vLLM's rule, from the publisher's side: it binds '*' and ipc/inproc addresses and connects
 * to anything else; a '*' address given to us means the engine connects, so we bind. */
static bool should_bind(const char *addr)
{
    return strchr(addr, '*') != NULL || strncmp(addr, "ipc://", 6) == 0 ||
           strncmp(addr, "inproc://", 9) == 0;
}

static void *open_socket(void *ctx, int type, const char *addr, bool bind, char *err,
                         size_t err_len)
{
    void *s = zmq_socket(ctx, type);
    if (s == NULL) {
        snprintf(err, err_len, "%s: %s", addr, zmq_strerror(zmq_errno()));
        return NULL;
    }
    int linger = 0, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (type == ZMQ_SUB)
        zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    int rc = bind ? zmq_bind(s, addr) : zmq_connect(s, addr);
    if (rc != 0) {
        snprintf(err, err_len, "%s: %s", addr, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}

static rank_t *find_rank(const kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank)
{
    for (size_t i = 0; i < l->cap; i++) {
        rank_t *r = &l->ranks[i];
        if (r->used && r->worker_id == worker_id && r->dp_rank == dp_rank)
            return r;
    }
    return NULL;
}

int kvr_zmq_listener_add(kvr_zmq_listener_t *l, const kvr_zmq_endpoint_t *ep, char *err,
                         size_t err_len)
{
    char dummy[8];
    if (err == NULL) {
        err = dummy;
        err_len = sizeof dummy;
    }
    if (l == NULL || ep == NULL || ep->events == NULL) {
        snprintf(err, err_len, "events address missing");
        return KVR_EINVAL;
    }
    if (find_rank(l, ep->worker_id, ep->dp_rank) != NULL) {
        snprintf(err, err_len, "worker %llu rank %u already subscribed",
                 (unsigned long long)ep->worker_id, ep->dp_rank);
        return KVR_EEXIST;
    }
    if (ep->replay != NULL && strlen(ep->replay) >= sizeof l->ranks[0].replay_addr) {
        snprintf(err, err_len, "replay address too long");
        return KVR_EINVAL;
    }
    rank_t *r = NULL;
    for (size_t i = 0; i < l->cap && r == NULL; i++)
        if (!l->ranks[i].used)
            r = &l->ranks[i];
    if (r == NULL) {
        snprintf(err, err_len, "more than %zu worker ranks", l->cap);
        return KVR_EFULL;
    }
    void *sub = open_socket(l->ctx, ZMQ_SUB, ep->events, should_bind(ep->events), err, err_len);
    if (sub == NULL)
        return KVR_EINVAL;
    void *dealer = NULL;
    if (ep->replay != NULL) {
        dealer = open_socket(l->ctx, ZMQ_DEALER, ep->replay, false, err, err_len);
        if (dealer == NULL) {
            zmq_close(sub);
            return KVR_EINVAL;
        }
    }
    memset(r, 0, sizeof *r);
    r->used = true;
    r->worker_id = ep->worker_id;
    r->dp_rank = ep->dp_rank;
    r->sub = sub;
    r->dealer = dealer;
    if (ep->replay != NULL)
        snprintf(r->replay_addr, sizeof r->replay_addr, "%s", ep->replay);
    return KVR_OK;
}

int kvr_zmq_listener_remove(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank)
{
    rank_t *r = find_rank(l, worker_id, dp_rank);
    if (r == NULL)
        return KVR_ENOTFOUND;
    close_rank(r);
    return KVR_OK;
}

/* ---- delivery ---- */

static void reset_rank(kvr_zmq_listener_t *l, rank_t *r, kvr_zmq_reset_reason_t why)
{
    l->h.on_reset(l->h.ud, r->worker_id, r->dp_rank, why);
    kvr_seq_reset(&r->cur);
    r->info.state = KVR_ZMQ_DEGRADED;
}

/* Marks that batches up to and including seq are behind us. Applying batch 0 from a clean
 * cursor is the one way to (re)gain an exact state. */
static void advance(rank_t *r, uint64_t seq, bool applied)
{
    if (applied && !r->cur.started && seq == 0)
        r->info.state = KVR_ZMQ_EXACT;
    else if (r->info.state == KVR_ZMQ_NO_EVENTS)
        r->info.state = KVR_ZMQ_DEGRADED;
    kvr_seq_advance(&r->cur, seq);
    r->info.started = true;
    r->info.last_seq = seq;
}

static int call_batch(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq, const void *p, size_t n,
                      bool replayed)
{
    kvr_zmq_batch_t b = {.worker_id = r->worker_id,
                         .dp_rank = r->dp_rank,
                         .seq = seq,
                         .payload = p,
                         .len = n,
                         .replayed = replayed};
    int rc = l->h.on_batch(l->h.ud, &b);
    if (rc == KVR_EPARSE)
        return rc;
    r->last_hash = kvr_xxh3(p, n, 0);
    l->st.batches++;
    r->info.batches++;
    if (replayed) {
        l->st.replayed++;
        r->info.replayed++;
    }
    return KVR_OK;
}

/* Reopens the DEALER so late answers to an abandoned request cannot be mistaken. */
static void reopen_dealer(kvr_zmq_listener_t *l, rank_t *r)
{
    if (r->dealer == NULL)
        return;
    zmq_close(r->dealer);
    char err[128];
    r->dealer = open_socket(l->ctx, ZMQ_DEALER, r->replay_addr, false, err, sizeof err);
}

typedef enum replay_end { REPLAY_DONE, REPLAY_TIMEOUT, REPLAY_ERROR } replay_end_t;

/* Receives one replay message into frames (seq, payload); 1 = message, 0 = end marker. */
static int replay_recv(kvr_zmq_listener_t *l, rank_t *r, zmq_msg_t *seqf, zmq_msg_t *pay,
                       replay_end_t *why)
{
    zmq_pollitem_t it = {.socket = r->dealer, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, l->cfg.replay_timeout_ms) <= 0) {
        *why = REPLAY_TIMEOUT;
        return -1;
    }
    zmq_msg_t f[3];
    int nf = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->dealer, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (nf < 3)
            f[nf++] = m;
        else
            zmq_msg_close(&m);
    }
    int out = -1;
    *why = REPLAY_ERROR;
    if (nf == 3 && zmq_msg_size(&f[0]) == 0 && zmq_msg_size(&f[1]) == 8) {
        out = zmq_msg_size(&f[2]) == 0 ? 0 : 1;
        zmq_msg_move(seqf, &f[1]);
        zmq_msg_move(pay, &f[2]);
    } else {
        l->st.bad_frames++;
    }
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
    return out;
}

/* Gives up on part of the history: the caller drops what it knew of the rank (if anything),
 * the rank is degraded, and the cursor moves to just before `next_seq`. */
static void give_up(kvr_zmq_listener_t *l, rank_t *r, uint64_t next_seq,
                    kvr_zmq_reset_reason_t why)
{
    l->st.gaps_lost++;
    r->info.gaps_lost++;
    if (r->cur.started || r->info.state != KVR_ZMQ_NO_EVENTS)
        reset_rank(l, r, why);
    r->info.state = KVR_ZMQ_DEGRADED;
    if (next_seq > 0) {
        kvr_seq_advance(&r->cur, next_seq - 1);
        r->info.started = true;
    }
}

/* Recovers batches [from, upto) through the replay socket and hands them over in order.
 * Where the replay cannot reach back far enough, gives up on the missing part but still
 * applies what the buffer has. Returns true when every batch of the range was applied. On
 * return the cursor stands at upto - 1 either way. */
static bool recover(kvr_zmq_listener_t *l, rank_t *r, uint64_t from, uint64_t upto,
                    kvr_zmq_reset_reason_t why)
{
    bool complete = true, done = r->dealer == NULL;
    if (!done) {
        uint8_t req[8];
        put_be64(req, from);
        done = zmq_send(r->dealer, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(r->dealer, req, 8, 0) < 0;
    }
    if (done)
        complete = false;
    while (!done) {
        zmq_msg_t seqf, pay;
        zmq_msg_init(&seqf);
        zmq_msg_init(&pay);
        replay_end_t end = REPLAY_DONE;
        int got = replay_recv(l, r, &seqf, &pay, &end);
        if (got > 0) {
            uint64_t s = be64(zmq_msg_data(&seqf));
            uint64_t want = r->cur.started ? r->cur.next : from;
            if (s >= want && s < upto) {
                if (s > want) { /* the buffer starts after what we need */
                    complete = false;
                    give_up(l, r, s, why);
                }
                if (call_batch(l, r, s, zmq_msg_data(&pay), zmq_msg_size(&pay), true) == KVR_OK) {
                    advance(r, s, true);
                } else {
                    l->st.undecodable++;
                    r->info.undecodable++;
                    complete = false;
                    give_up(l, r, s + 1, KVR_RESET_UNDECODABLE);
                }
            } /* else: already applied, or beyond the gap (the live stream brings it) */
        } else {
            if (got < 0) {
                if (end == REPLAY_TIMEOUT)
                    l->st.replay_timeouts++;
                reopen_dealer(l, r); /* a late answer must not meet the next request */
            }
            done = true;
        }
        zmq_msg_close(&seqf);
        zmq_msg_close(&pay);
    }
    if (!r->cur.started || r->cur.next < upto) {
        complete = false;
        give_up(l, r, upto, why); /* the answer ended (or never came) before the gap was filled */
    }
    return complete;
}

/* A live batch that on_batch could not frame: fetch it again once from the replay socket
 * (transport damage is fixed by a second copy). Still bad, or no replay socket: drop the
 * rank's state and move past it. */
static void handle_undecodable(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq)
{
    l->st.undecodable++;
    r->info.undecodable++;
    if (recover(l, r, seq, seq + 1, KVR_RESET_UNDECODABLE))
        return;
}

static void handle_live(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq, const void *p, size_t n)
{
    uint64_t from = 0;
    kvr_seq_verdict_t v = kvr_seq_observe(&r->cur, seq, &from);
    /* the last number again with other bytes: a new process that has sent one batch so far */
    if (v == KVR_SEQ_DUPLICATE && kvr_xxh3(p, n, 0) != r->last_hash)
        v = KVR_SEQ_RESTART;
    if (v == KVR_SEQ_DUPLICATE) {
        l->st.duplicates++;
        r->info.duplicates++;
        return;
    }
    if (v == KVR_SEQ_RESTART) {
        l->st.restarts++;
        r->info.restarts++;
        reset_rank(l, r, KVR_RESET_RESTART);
        v = kvr_seq_observe(&r->cur, seq, &from);
    }
    if (v == KVR_SEQ_GAP) {
        l->st.gaps++;
        r->info.gaps++;
        (void)recover(l, r, from, seq, KVR_RESET_GAP_LOST);
    }
    if (call_batch(l, r, seq, p, n, false) == KVR_OK)
        advance(r, seq, true);
    else
        handle_undecodable(l, r, seq);
}

/* Reads one multipart message from the SUB socket; returns false when none is waiting. */
static bool read_one(kvr_zmq_listener_t *l, rank_t *r)
{
    zmq_msg_t f[3];
    int nf = 0, more = 1, total = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->sub, total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            if (total == 0)
                return false;
            break;
        }
        total++;
        more = zmq_msg_more(&m);
        if (nf < 3)
            f[nf++] = m;
        else
            zmq_msg_close(&m);
    }
    if (total == 3 && zmq_msg_size(&f[1]) == 8)
        handle_live(l, r, be64(zmq_msg_data(&f[1])), zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    else
        l->st.bad_frames++;
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
    return true;
}

int kvr_zmq_listener_poll(kvr_zmq_listener_t *l, int timeout_ms)
{
    if (l == NULL)
        return KVR_EINVAL;
    size_t n = 0;
    for (size_t i = 0; i < l->cap; i++) {
        if (!l->ranks[i].used)
            continue;
        l->items[n] = (zmq_pollitem_t){.socket = l->ranks[i].sub, .events = ZMQ_POLLIN};
        l->item_rank[n++] = i;
    }
    if (zmq_poll(l->items, (int)n, timeout_ms) < 0)
        return zmq_errno() == EINTR ? 0 : KVR_EIO;
    uint64_t before = l->st.batches;
    for (size_t k = 0; k < n; k++) {
        if (!(l->items[k].revents & ZMQ_POLLIN))
            continue;
        rank_t *r = &l->ranks[l->item_rank[k]];
        for (int m = 0; m < DRAIN_PER_RANK && r->used && read_one(l, r); m++) {
        }
    }
    return (int)(l->st.batches - before);
}

void kvr_zmq_listener_stats(const kvr_zmq_listener_t *l, kvr_zmq_stats_t *out) { *out = l->st; }

int kvr_zmq_listener_rank(const kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank,
                          kvr_zmq_rank_info_t *out)
{
    const rank_t *r = find_rank(l, worker_id, dp_rank);
    if (r == NULL)
        return KVR_ENOTFOUND;
    *out = r->info;
    return KVR_OK;
}

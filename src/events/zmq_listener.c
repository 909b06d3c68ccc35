/*
 * zmq_listener.c: see zmq_listener.h for what it guarantees.
 *
 * Invariants: for each rank, on_batch has received batches in strictly increasing sequence
 * order since its last reset, each at most once; the cursor (seqtrack) is the last one handed
 * over (or skipped on purpose after a reset). While a rank recovers, nothing live is handed
 * over for it: live batches wait in its hold (arrival order) and only replayed batches in
 * [cursor + 1, upto) move the cursor; the hold is empty whenever the rank is not recovering
 * (it is drained as soon as a recovery ends). A DEALER whose answer was abandoned (timeout,
 * overflow, malformed reply) is closed and reopened, so a late answer to an old replay
 * request is never taken for a new one; one that sent its end marker is reused. A gap's
 * replay asks from the last applied batch (hash_seq, whose payload hashed to last_hash) when
 * that is the cursor, and that batch must come back first with the same bytes (confirm).
 * peers counts the SUB's live connections, from its monitor's CONNECTED/ACCEPTED and
 * DISCONNECTED events. A resume or resync asks for everything after its cursor, so its answer
 * may bring batches whose live copies the SUB delivers later (two connections, no order
 * between them): the last REPLAYED_KEPT replayed batches are remembered (slot seq %
 * REPLAYED_KEPT holds seq + 1 and the payload's hash; 0: empty, cleared on a reset), and a
 * live batch numbered before the cursor that matches one is a duplicate; any other is a new
 * process.
 * Threads: the owning thread only. Cost: see the header.
 */
#include "events/zmq_listener.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.h>

#include "events/seqtrack.h"
#include "kvrouter.h"
#include "base/log.h"

#define WAKE_TOKEN UINT64_MAX /* the wake eventfd's epoll data (rank data is slot*4+kind) */
#define DRAIN_PER_RANK 256 /* messages handled per socket per poll, so no rank starves others */
#define REPLAYED_KEPT 64   /* replayed batches remembered per rank (1 KiB): their live copies
                              may still be on their way */

/* The sockets of a rank, as epoll's data names them (rank index * 4 + kind) and as bits of
 * rank_t.hot. */
enum sock_kind { K_SUB = 0, K_MON = 1, K_DEALER = 2 };

/* A live batch that arrived while its rank was recovering: a copy, applied later. */
typedef struct held {
    struct held *next;
    uint64_t seq;
    size_t len;
    uint8_t data[];
} held_t;

typedef struct recovery {
    bool active;
    kvr_zmq_reset_reason_t why; /* given to on_reset for what the replay does not bring */
    uint64_t from, upto;        /* the batches wanted: [from, upto) */
    bool resume;                /* confirms a resumed cursor: batch `from` must come first,
                                   unapplied; upto is UINT64_MAX until a live batch is held */
    bool decided;               /* the resume was confirmed or failed */
    bool open;                  /* a resync: everything from batch 0, upto UINT64_MAX until a
                                   live batch is held (as a resume's) */
    bool confirm;               /* a gap's replay: batch `from` (the last applied) comes
                                   first, with the bytes of last_hash, or it is a restart */
    uint64_t deadline_ms;       /* give up if the replay socket is silent until then */
    held_t *head, *tail;        /* live batches that arrived meanwhile, oldest first */
    size_t n_held, held_bytes;  /* within max_held_batches, max_held_bytes */
} recovery_t;

/* A replayed batch: its number + 1 (0: empty slot) and its payload's hash. */
typedef struct replayed {
    uint64_t seq1;
    uint64_t hash;
} replayed_t;

typedef struct rank {
    bool used;
    uint64_t worker_id;
    uint32_t dp_rank;
    void *sub;
    void *dealer;
    char replay_addr[256];
    kvr_seqtrack_t cur;
    uint64_t last_hash; /* of the last batch handed over: tells a repeat from a restart */
    uint64_t hash_seq;  /* the number of that batch; valid while has_hash */
    bool has_hash;
    void *mon;          /* PAIR: the SUB's monitor events */
    int fd[3];          /* each socket's ZMQ_FD (-1: none), watched by the listener's epoll */
    uint8_t hot;        /* bit per kind: check the socket's ZMQ_EVENTS at the next poll */
    int peers;          /* live connections of the SUB */
    bool verify;        /* reconnected: the next batch may come from a new process */
    replayed_t replayed[REPLAYED_KEPT]; /* by seq % REPLAYED_KEPT */
    kvr_zmq_rank_info_t info;
    recovery_t rec;
} rank_t;

struct kvr_zmq_listener {
    void *ctx;
    kvr_zmq_config_t cfg;
    kvr_zmq_handlers_t h;
    rank_t *ranks;
    size_t cap;
    int epfd;                /* every socket's ZMQ_FD (level-triggered) */
    int wakefd;              /* an eventfd in epfd: kvr_zmq_listener_wake */
    struct epoll_event *evs; /* epoll_wait's output, 3 per rank */
    kvr_zmq_stats_t st;
    kvr_ratelimit_t rl;
    uint64_t mon_seq; /* names each monitor's inproc address uniquely */
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

const char *kvr_zmq_reset_reason_name(kvr_zmq_reset_reason_t why)
{
    switch (why) {
    case KVR_RESET_RESTART:
        return "publisher restarted";
    case KVR_RESET_GAP_LOST:
        return "gap older than the replay buffer (or no replay socket)";
    case KVR_RESET_UNDECODABLE:
        return "undecodable batch";
    case KVR_RESET_RESUME_FAILED:
        return "saved state not confirmed by the replay buffer";
    case KVR_RESET_REPLAY_TIMEOUT:
        return "no answer from the replay socket";
    case KVR_RESET_HOLD_FULL:
        return "too many live batches held while replaying";
    case KVR_RESET_RESYNC:
        return "rebuilt from the replay buffer on request";
    }
    return "unknown";
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
    if (l->cfg.max_held_batches == 0)
        l->cfg.max_held_batches = 4096;
    if (l->cfg.max_held_bytes == 0)
        l->cfg.max_held_bytes = (size_t)64 << 20;
    l->h = *h;
    l->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    l->cap = l->cfg.max_ranks;
    l->ranks = calloc(l->cap, sizeof *l->ranks);
    l->evs = calloc(3 * l->cap + 1, sizeof *l->evs);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event wev = {.events = EPOLLIN, .data.u64 = WAKE_TOKEN};
    l->ctx = zmq_ctx_new();
    if (l->ranks == NULL || l->evs == NULL || l->epfd < 0 || l->wakefd < 0 || l->ctx == NULL ||
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &wev) != 0) {
        kvr_zmq_listener_free(l);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return l;
}

/* Drops the held batches (unapplied) and takes them off the gauges. */
static void hold_clear(kvr_zmq_listener_t *l, rank_t *r)
{
    for (held_t *h = r->rec.head, *next; h != NULL; h = next) {
        next = h->next;
        free(h);
    }
    l->st.held_batches -= r->rec.n_held;
    l->st.held_bytes -= r->rec.held_bytes;
    r->rec.head = r->rec.tail = NULL;
    r->rec.n_held = r->rec.held_bytes = 0;
}

/* Watches a socket's ZMQ_FD: the fd is readable while the socket has commands to process
 * (new messages among them); its ZMQ_EVENTS processes them and says what is ready. A new
 * socket is hot: checked at the next poll whatever its fd says. */
static bool watch(kvr_zmq_listener_t *l, rank_t *r, int kind, void *sock)
{
    r->fd[kind] = -1;
    if (sock == NULL)
        return true;
    int fd;
    size_t len = sizeof fd;
    struct epoll_event ev = {.events = EPOLLIN,
                             .data.u64 = (uint64_t)(r - l->ranks) * 4 + (uint64_t)kind};
    if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) != 0 ||
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return false;
    r->fd[kind] = fd;
    r->hot |= (uint8_t)(1u << kind);
    return true;
}

static void unwatch(kvr_zmq_listener_t *l, rank_t *r, int kind)
{
    if (r->fd[kind] >= 0)
        (void)epoll_ctl(l->epfd, EPOLL_CTL_DEL, r->fd[kind], NULL);
    r->fd[kind] = -1;
}

/* Closes a socket with a monitor, the monitor first: libzmq's I/O thread sends a socket's
 * connection events to its monitor with a blocking send, so an event of the closing socket (a
 * disconnect) sent after our end of the monitor pair is gone would block that thread for good,
 * and with it every socket of the context (seen with fast register / unregister cycles). */
static void close_monitored(void *s)
{
    (void)zmq_socket_monitor(s, NULL, 0);
    zmq_close(s);
}

static void close_rank(kvr_zmq_listener_t *l, rank_t *r)
{
    if (r->rec.active)
        l->st.replays_in_progress--;
    hold_clear(l, r);
    for (int k = K_SUB; k <= K_DEALER; k++)
        unwatch(l, r, k);
    if (r->sub != NULL)
        close_monitored(r->sub);
    if (r->mon != NULL)
        zmq_close(r->mon);
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
            close_rank(l, &l->ranks[i]);
    if (l->ctx != NULL)
        zmq_ctx_term(l->ctx);
    free(l->ranks);
    free(l->evs);
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->wakefd >= 0)
        close(l->wakefd);
    free(l);
}

void kvr_zmq_listener_wake(kvr_zmq_listener_t *l)
{
    uint64_t one = 1;
    ssize_t n = write(l->wakefd, &one, sizeof one); /* a full counter is still readable */
    (void)n;
}

/* mon: the inproc address to publish the socket's connection events on, or NULL. */
/* Engine sockets are always connected to, never bound: a registration cannot open a port or
 * create a file on the router's host (core/endpoint.h checks the address first). */
static void *open_socket(void *ctx, int type, const char *addr, const char *mon,
                         char *err, size_t err_len)
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
    if (mon != NULL && zmq_socket_monitor(s, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED |
                                                      ZMQ_EVENT_DISCONNECTED) != 0) {
        snprintf(err, err_len, "%s: monitor: %s", addr, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    int rc = zmq_connect(s, addr);
    if (rc != 0) {
        snprintf(err, err_len, "%s: %s", addr, zmq_strerror(zmq_errno()));
        if (mon != NULL)
            (void)zmq_socket_monitor(s, NULL, 0);
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
    char mon_addr[64];
    snprintf(mon_addr, sizeof mon_addr, "inproc://kvr-zmq-monitor-%llu",
             (unsigned long long)++l->mon_seq);
    void *mon = zmq_socket(l->ctx, ZMQ_PAIR);
    if (mon == NULL) {
        snprintf(err, err_len, "monitor: %s", zmq_strerror(zmq_errno()));
        return KVR_EINVAL;
    }
    int linger = 0;
    zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger);
    void *sub = open_socket(l->ctx, ZMQ_SUB, ep->events, mon_addr, err, err_len);
    if (sub == NULL || zmq_connect(mon, mon_addr) != 0) {
        if (sub != NULL) {
            snprintf(err, err_len, "monitor: %s", zmq_strerror(zmq_errno()));
            close_monitored(sub);
        }
        zmq_close(mon);
        return KVR_EINVAL;
    }
    void *dealer = NULL;
    if (ep->replay != NULL) {
        dealer = open_socket(l->ctx, ZMQ_DEALER, ep->replay, NULL, err, err_len);
        if (dealer == NULL) {
            close_monitored(sub);
            zmq_close(mon);
            return KVR_EINVAL;
        }
    }
    memset(r, 0, sizeof *r);
    r->used = true;
    r->worker_id = ep->worker_id;
    r->dp_rank = ep->dp_rank;
    r->sub = sub;
    r->mon = mon;
    r->dealer = dealer;
    if (!watch(l, r, K_SUB, sub) || !watch(l, r, K_MON, mon) || !watch(l, r, K_DEALER, dealer)) {
        snprintf(err, err_len, "cannot watch the sockets: %s", strerror(errno));
        close_rank(l, r);
        return KVR_ENOMEM;
    }
    if (ep->replay != NULL)
        snprintf(r->replay_addr, sizeof r->replay_addr, "%s", ep->replay);
    return KVR_OK;
}

int kvr_zmq_listener_remove(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank)
{
    rank_t *r = find_rank(l, worker_id, dp_rank);
    if (r == NULL)
        return KVR_ENOTFOUND;
    close_rank(l, r);
    return KVR_OK;
}

/* ---- delivery ---- */

static void reset_rank(kvr_zmq_listener_t *l, rank_t *r, kvr_zmq_reset_reason_t why)
{
    l->h.on_reset(l->h.ud, r->worker_id, r->dp_rank, why);
    kvr_seq_reset(&r->cur);
    r->has_hash = false;
    r->verify = false;
    memset(r->replayed, 0, sizeof r->replayed);
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
    r->hash_seq = seq;
    r->has_hash = true;
    r->info.last_hash = r->last_hash;
    l->st.batches++;
    r->info.batches++;
    if (replayed) {
        r->replayed[seq % REPLAYED_KEPT] = (replayed_t){.seq1 = seq + 1, .hash = r->last_hash};
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
    unwatch(l, r, K_DEALER);
    zmq_close(r->dealer);
    char err[128];
    r->dealer = open_socket(l->ctx, ZMQ_DEALER, r->replay_addr, NULL, err, sizeof err);
    if (!watch(l, r, K_DEALER, r->dealer) && r->dealer != NULL) {
        zmq_close(r->dealer); /* unwatched it would never be read: no replay socket then */
        r->dealer = NULL;
    }
}

/* Receives one multipart message: its first three frames in f (*nf of them, to be closed by
 * the caller), the rest discarded. Returns the number of frames, 0 when none was waiting. */
static int recv_message(void *sock, zmq_msg_t f[3], int *nf)
{
    int total = 0, more = 1;
    *nf = 0;
    while (more) {
        zmq_msg_t scratch, *m = *nf < 3 ? &f[*nf] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            break;
        }
        total++;
        more = zmq_msg_more(m);
        if (m == &scratch)
            zmq_msg_close(m);
        else
            (*nf)++;
    }
    return total;
}

static void close_frames(zmq_msg_t *f, int nf)
{
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
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
    if (next_seq > 0 && next_seq != UINT64_MAX) { /* UINT64_MAX: a resume's open range */
        kvr_seq_advance(&r->cur, next_seq - 1);
        r->info.started = true;
    }
}

/* ---- the hold: live batches of a recovering rank ---- */

/* Copies a live batch into the hold: at the back (arrival order), or at the front for the
 * batch that revealed a gap while the hold was being drained (it was just taken off the
 * front, and everything still held came after it). false: over a bound, or out of memory. */
static bool hold(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq, const void *p, size_t n,
                 bool front)
{
    recovery_t *rc = &r->rec;
    if (rc->n_held >= l->cfg.max_held_batches || n > l->cfg.max_held_bytes - rc->held_bytes)
        return false;
    held_t *h = malloc(sizeof *h + n);
    if (h == NULL)
        return false;
    h->seq = seq;
    h->len = n;
    if (n > 0)
        memcpy(h->data, p, n);
    if (front) {
        h->next = rc->head;
        rc->head = h;
        if (rc->tail == NULL)
            rc->tail = h;
    } else {
        h->next = NULL;
        if (rc->tail != NULL)
            rc->tail->next = h;
        else
            rc->head = h;
        rc->tail = h;
    }
    rc->n_held++;
    rc->held_bytes += n;
    r->info.held_batches = rc->n_held;
    l->st.held_batches++;
    l->st.held_bytes += n;
    return true;
}

static held_t *unhold(kvr_zmq_listener_t *l, rank_t *r)
{
    recovery_t *rc = &r->rec;
    held_t *h = rc->head;
    rc->head = h->next;
    if (rc->head == NULL)
        rc->tail = NULL;
    rc->n_held--;
    rc->held_bytes -= h->len;
    r->info.held_batches = rc->n_held;
    l->st.held_batches--;
    l->st.held_bytes -= h->len;
    return h;
}

/* ---- resumed cursors ---- */

static void end_resume(rank_t *r)
{
    r->rec.resume = false;
    r->info.resuming = false;
}

/* The resumed cursor is wrong or cannot be confirmed: the caller's reloaded state goes and
 * the rank starts over as a late joiner (the rest of the answer may still apply). */
static void resume_failed(kvr_zmq_listener_t *l, rank_t *r, const char *why)
{
    r->rec.decided = true;
    l->st.resumes_failed++;
    r->info.resumes_failed++;
    kvr_log_limited(&l->rl, KVR_LOG_WARN,
                    "worker %llu rank %u: saved state not resumed: batch %llu %s; reloaded "
                    "blocks dropped",
                    (unsigned long long)r->worker_id, r->dp_rank,
                    (unsigned long long)r->rec.from, why);
    reset_rank(l, r, KVR_RESET_RESUME_FAILED);
}

/* The first replayed batch of a resume: the saved last batch, byte for byte, confirms it.
 * true when the batch was that one (nothing to apply). */
static bool resume_check(kvr_zmq_listener_t *l, rank_t *r, uint64_t s, const void *p, size_t n)
{
    if (s == r->rec.from && kvr_xxh3(p, n, 0) == r->last_hash) {
        r->rec.decided = true;
        l->st.resumes++;
        r->info.resumes++;
        r->info.resuming = false;
        return true;
    }
    resume_failed(l, r, s == r->rec.from ? "has other bytes (the publisher restarted)"
                                         : "is no longer in the replay buffer");
    r->rec.from = s; /* take the rest of the answer from here, as a late joiner would */
    return false;
}

/* ---- recovery ---- */

/* Asks the replay socket for batches [from, upto). false when it cannot be asked (no replay
 * socket, or the request is refused): the range is given up at once. The hold is left as it
 * is (a recovery started while draining it keeps the rest). */
static bool start_recovery(kvr_zmq_listener_t *l, rank_t *r, uint64_t from, uint64_t upto,
                           kvr_zmq_reset_reason_t why)
{
    uint8_t req[8];
    put_be64(req, from);
    if (r->dealer == NULL || zmq_send(r->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(r->dealer, req, 8, ZMQ_DONTWAIT) < 0) {
        reopen_dealer(l, r); /* no half-sent request may stay queued */
        give_up(l, r, upto, why);
        return false;
    }
    r->rec.active = true;
    r->rec.confirm = false;
    r->rec.why = why;
    r->rec.from = from;
    r->rec.upto = upto;
    r->rec.deadline_ms = kvr_now_ms() + (uint64_t)l->cfg.replay_timeout_ms;
    r->info.recovering = true;
    l->st.replays_in_progress++;
    return true;
}

/* Ends the recovery: what the replay did not bring is given up. The hold stays for
 * drain_held. */
static void finish_recovery(kvr_zmq_listener_t *l, rank_t *r)
{
    r->rec.active = false;
    r->info.recovering = false;
    l->st.replays_in_progress--;
    if (r->rec.resume) {
        if (!r->rec.decided)
            resume_failed(l, r, "could not be confirmed (no answer from the replay socket, "
                                "or an answer without any batch)");
        end_resume(r);
        if (r->rec.upto == UINT64_MAX)
            return; /* no live batch waits: the replay brought everything there was */
    }
    if (r->rec.open) {
        r->rec.open = false;
        if (r->rec.upto == UINT64_MAX)
            return; /* as a resume's: nothing live waits */
    }
    if (!r->cur.started || r->cur.next < r->rec.upto)
        give_up(l, r, r->rec.upto, r->rec.why);
}

/* Stops waiting for an answer (timeout, full hold, malformed reply). */
static void abandon_recovery(kvr_zmq_listener_t *l, rank_t *r)
{
    reopen_dealer(l, r);
    finish_recovery(l, r);
}

static void hold_overflow(kvr_zmq_listener_t *l, rank_t *r)
{
    l->st.hold_overflows++;
    r->info.hold_overflows++;
    kvr_log_limited(&l->rl, KVR_LOG_WARN,
                    "worker %llu rank %u: %zu live batches (%zu bytes) held while replaying "
                    "batches %llu..%llu: hold full, gap given up",
                    (unsigned long long)r->worker_id, r->dp_rank, r->rec.n_held,
                    r->rec.held_bytes, (unsigned long long)r->rec.from,
                    (unsigned long long)r->rec.upto - 1);
    if (!r->rec.resume)
        r->rec.why = KVR_RESET_HOLD_FULL;
    abandon_recovery(l, r);
}

/* The first batch of a gap's replay, asked from the last applied batch (rec.from). true when
 * it was that batch with the same bytes (nothing to apply). Other bytes: a new publisher on
 * the same address whose numbers ran past the old one's. The rank is reset and the replay
 * asked again from batch 0 (a young publisher's buffer still has it). */
static bool confirm_check(kvr_zmq_listener_t *l, rank_t *r, uint64_t s, const void *p, size_t n)
{
    r->rec.confirm = false;
    if (s != r->rec.from)
        return false; /* the buffer no longer holds it: the gap is judged as it is */
    if (kvr_xxh3(p, n, 0) == r->last_hash)
        return true;
    l->st.restarts++;
    r->info.restarts++;
    kvr_log_limited(&l->rl, KVR_LOG_WARN,
                    "worker %llu rank %u: batch %llu came back from the replay socket with "
                    "other bytes: a new publisher; its state is rebuilt from batch 0",
                    (unsigned long long)r->worker_id, r->dp_rank, (unsigned long long)s);
    reset_rank(l, r, KVR_RESET_RESTART);
    uint8_t req[8];
    put_be64(req, 0);
    reopen_dealer(l, r); /* the rest of the old answer must not be read */
    r->rec.from = 0;
    r->rec.why = KVR_RESET_GAP_LOST;
    r->rec.deadline_ms = kvr_now_ms() + (uint64_t)l->cfg.replay_timeout_ms;
    if (r->dealer == NULL || zmq_send(r->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(r->dealer, req, 8, ZMQ_DONTWAIT) < 0)
        abandon_recovery(l, r);
    return true;
}

/* One replayed batch. Where the replay cannot reach back far enough, gives up on the missing
 * part but still applies what the buffer has. */
static void replay_batch(kvr_zmq_listener_t *l, rank_t *r, uint64_t s, const void *p, size_t n)
{
    if (r->rec.resume && !r->rec.decided && resume_check(l, r, s, p, n))
        return;
    if (r->rec.confirm && confirm_check(l, r, s, p, n))
        return;
    uint64_t want = r->cur.started ? r->cur.next : r->rec.from;
    if (s < want || s >= r->rec.upto)
        return; /* already applied, or beyond the gap (held or still to come live) */
    if (s > want) /* the buffer starts after what we need */
        give_up(l, r, s, r->rec.why);
    if (call_batch(l, r, s, p, n, true) == KVR_OK) {
        advance(r, s, true);
    } else {
        l->st.undecodable++;
        r->info.undecodable++;
        give_up(l, r, s + 1, KVR_RESET_UNDECODABLE);
    }
}

/* ---- live batches ---- */

/* A live batch that on_batch could not frame is fetched again once from the replay socket
 * (transport damage is fixed by a second copy); still bad, or no replay socket: the rank's
 * state is dropped and the cursor moves past it. */
static void apply_live(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq, const void *p, size_t n)
{
    if (call_batch(l, r, seq, p, n, false) == KVR_OK) {
        advance(r, seq, true);
        return;
    }
    l->st.undecodable++;
    r->info.undecodable++;
    (void)start_recovery(l, r, seq, seq + 1, KVR_RESET_UNDECODABLE);
}

/* A live batch numbered at or before the cursor: a duplicate if its bytes are those of the
 * last batch applied, or of a replayed one (a resume's or resync's answer came before the
 * SUB's copy); otherwise a new process numbering from the start again. */
static kvr_seq_verdict_t judge_old_number(const rank_t *r, uint64_t seq, uint64_t hash)
{
    if (r->has_hash && r->hash_seq == seq)
        return hash == r->last_hash ? KVR_SEQ_DUPLICATE : KVR_SEQ_RESTART;
    const replayed_t *k = &r->replayed[seq % REPLAYED_KEPT];
    return k->seq1 == seq + 1 && k->hash == hash ? KVR_SEQ_DUPLICATE : KVR_SEQ_RESTART;
}

/* A live batch for a rank that is not recovering (it may start a recovery). */
static void handle_live_now(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq, const void *p,
                            size_t n)
{
    uint64_t from = 0;
    kvr_seq_verdict_t v = kvr_seq_observe(&r->cur, seq, &from);
    if (v == KVR_SEQ_DUPLICATE || v == KVR_SEQ_RESTART)
        v = judge_old_number(r, seq, kvr_xxh3(p, n, 0));
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
    if (v == KVR_SEQ_APPLY && r->verify) {
        r->verify = false;
        /* the batch before this one, fetched again, must have the bytes last applied */
        if (r->has_hash && r->hash_seq + 1 == seq && r->dealer != NULL &&
            start_recovery(l, r, seq - 1, seq, KVR_RESET_GAP_LOST)) {
            r->rec.confirm = true;
            if (hold(l, r, seq, p, n, true))
                return;
            hold_overflow(l, r);
        }
    }
    if (v == KVR_SEQ_GAP) {
        r->verify = false; /* the gap's replay confirms the last batch anyway */
        l->st.gaps++;
        r->info.gaps++;
        /* from the last applied batch, when we have its bytes: it must come back unchanged */
        bool confirm = r->has_hash && r->cur.started && from > 0 && r->hash_seq == from - 1;
        if (start_recovery(l, r, confirm ? from - 1 : from, seq, KVR_RESET_GAP_LOST)) {
            r->rec.confirm = confirm;
            if (hold(l, r, seq, p, n, true))
                return; /* applied after the replayed batches */
            hold_overflow(l, r); /* the cursor now stands at seq - 1 */
        }
    }
    apply_live(l, r, seq, p, n);
}

/* Feeds the held batches through the live path in arrival order, until the hold is empty or
 * one of them starts another recovery (the rest then stay held for that one). */
static void drain_held(kvr_zmq_listener_t *l, rank_t *r)
{
    while (!r->rec.active && r->rec.head != NULL) {
        held_t *h = unhold(l, r);
        handle_live_now(l, r, h->seq, h->data, h->len);
        free(h);
    }
}

/* A live batch from the SUB socket. While the rank recovers it is held; a full hold gives the
 * gap up, applies what was held, then this batch (each round of this loop applies at least
 * one held batch, so it ends). */
static void handle_live(kvr_zmq_listener_t *l, rank_t *r, uint64_t seq, const void *p, size_t n)
{
    /* a resume asks for everything after the cursor; the first live batch held bounds it, so
     * the replay never moves the cursor past batches waiting in the hold */
    if (r->rec.active && (r->rec.resume || r->rec.open) && seq < r->rec.upto &&
        seq > r->rec.from)
        r->rec.upto = seq;
    while (r->rec.active) {
        if (hold(l, r, seq, p, n, false))
            return;
        hold_overflow(l, r);
        drain_held(l, r);
    }
    handle_live_now(l, r, seq, p, n);
}

/* Reads the SUB's monitor: connection events keep peers, the live connections, current. */
static void read_monitor(kvr_zmq_listener_t *l, rank_t *r)
{
    for (int m = 0; m < DRAIN_PER_RANK; m++) {
        zmq_msg_t f[3];
        int nf;
        if (recv_message(r->mon, f, &nf) == 0)
            break;
        if (nf >= 1 && zmq_msg_size(&f[0]) >= 2) {
            uint16_t ev;
            memcpy(&ev, zmq_msg_data(&f[0]), sizeof ev);
            if (ev == ZMQ_EVENT_CONNECTED || ev == ZMQ_EVENT_ACCEPTED) {
                r->peers++;
                /* back after a lost connection: a new process may have published as many
                 * batches as the old one meanwhile, so even the next number is checked */
                r->verify = r->info.was_connected && r->cur.started;
                r->info.was_connected = true;
            } else if (ev == ZMQ_EVENT_DISCONNECTED && r->peers > 0) {
                r->peers--;
                l->st.disconnects++;
                r->info.disconnects++;
                kvr_log_limited(&l->rl, KVR_LOG_WARN,
                                "worker %llu rank %u: events connection lost%s",
                                (unsigned long long)r->worker_id, r->dp_rank,
                                r->peers == 0 ? " (no publisher connected)" : "");
            }
            r->info.connected = r->peers > 0;
        }
        close_frames(f, nf);
    }
}

/* Reads one multipart message from the SUB socket; returns false when none is waiting. */
static bool read_one(kvr_zmq_listener_t *l, rank_t *r)
{
    zmq_msg_t f[3];
    int nf;
    int total = recv_message(r->sub, f, &nf);
    if (total == 0)
        return false;
    if (total == 3 && zmq_msg_size(&f[1]) == 8)
        handle_live(l, r, be64(zmq_msg_data(&f[1])), zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    else
        l->st.bad_frames++;
    close_frames(f, nf);
    return true;
}

/* Handles what the recovering rank's DEALER has brought: replayed batches ["", seq, payload]
 * and the end marker ["", seq, ""]. Anything else ends the recovery. */
static void read_replay(kvr_zmq_listener_t *l, rank_t *r)
{
    for (int m = 0; m < DRAIN_PER_RANK && r->rec.active; m++) {
        zmq_msg_t f[3];
        int nf;
        int total = recv_message(r->dealer, f, &nf);
        if (total == 0)
            break;
        r->rec.deadline_ms = kvr_now_ms() + (uint64_t)l->cfg.replay_timeout_ms;
        if (total == 3 && zmq_msg_size(&f[0]) == 0 && zmq_msg_size(&f[1]) == 8) {
            if (zmq_msg_size(&f[2]) > 0)
                replay_batch(l, r, be64(zmq_msg_data(&f[1])), zmq_msg_data(&f[2]),
                             zmq_msg_size(&f[2]));
            else
                finish_recovery(l, r); /* the end marker */
        } else {
            l->st.bad_frames++;
            abandon_recovery(l, r);
        }
        close_frames(f, nf);
    }
    drain_held(l, r);
}

/* Gives up the replays whose socket stayed silent past their deadline. */
static void expire_recoveries(kvr_zmq_listener_t *l, uint64_t now)
{
    for (size_t i = 0; i < l->cap; i++) {
        rank_t *r = &l->ranks[i];
        if (!r->used || !r->rec.active || now < r->rec.deadline_ms)
            continue;
        l->st.replay_timeouts++;
        r->info.replay_timeouts++;
        char upto[24] = "";
        if (r->rec.upto != UINT64_MAX)
            snprintf(upto, sizeof upto, "%llu", (unsigned long long)r->rec.upto - 1);
        kvr_log_limited(&l->rl, KVR_LOG_WARN,
                        "worker %llu rank %u: no answer from the replay socket %s for %d ms: "
                        "batches %llu..%s given up",
                        (unsigned long long)r->worker_id, r->dp_rank, r->replay_addr,
                        l->cfg.replay_timeout_ms,
                        (unsigned long long)r->rec.from + (r->rec.confirm ? 1 : 0), upto);
        if (!r->rec.resume)
            r->rec.why = KVR_RESET_REPLAY_TIMEOUT;
        abandon_recovery(l, r);
        drain_held(l, r);
    }
}

int kvr_zmq_listener_resume(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank,
                            uint64_t last_seq, uint64_t last_hash)
{
    rank_t *r = l != NULL ? find_rank(l, worker_id, dp_rank) : NULL;
    if (r == NULL)
        return KVR_ENOTFOUND;
    if (r->dealer == NULL)
        return KVR_EINVAL;
    if (r->cur.started || r->rec.active || r->info.state != KVR_ZMQ_NO_EVENTS)
        return KVR_EBUSY;
    kvr_seq_advance(&r->cur, last_seq);
    r->last_hash = last_hash;
    r->hash_seq = last_seq;
    r->has_hash = true;
    r->info.started = true;
    r->info.last_seq = last_seq;
    r->info.state = KVR_ZMQ_EXACT;
    r->rec.resume = true;
    r->rec.decided = false;
    r->info.resuming = true;
    if (!start_recovery(l, r, last_seq, UINT64_MAX, KVR_RESET_RESUME_FAILED)) {
        end_resume(r); /* start_recovery gave the range up: the rank was reset */
        return KVR_EIO;
    }
    return KVR_OK;
}

int kvr_zmq_listener_resync(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank)
{
    rank_t *r = l != NULL ? find_rank(l, worker_id, dp_rank) : NULL;
    if (r == NULL)
        return KVR_ENOTFOUND;
    if (r->dealer == NULL)
        return KVR_EINVAL;
    if (r->rec.active)
        return KVR_EBUSY;
    r->info.resyncs++;
    reset_rank(l, r, KVR_RESET_RESYNC);
    r->rec.open = true;
    if (!start_recovery(l, r, 0, UINT64_MAX, KVR_RESET_RESYNC)) {
        r->rec.open = false;
        return KVR_EIO;
    }
    return KVR_OK;
}

/* Whether sock has a message to read (processing its pending commands, which resets its fd). */
static bool readable(void *sock)
{
    int ev = 0;
    size_t len = sizeof ev;
    return sock != NULL && zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN);
}

/* Checks one rank's hot sockets (a recovering rank's DEALER always), in the order that keeps
 * the rules: the monitor before the SUB (a reconnect is known before the batches that follow
 * it). Sockets left readable (a drain stopped at DRAIN_PER_RANK) stay hot. */
static void serve_rank(kvr_zmq_listener_t *l, rank_t *r)
{
    uint8_t hot = r->hot;
    r->hot = 0;
    if (r->rec.active || (hot & (1u << K_DEALER))) {
        /* an idle DEALER's signal is consumed too (a level-triggered fd must not stay set) */
        if (readable(r->dealer) && r->rec.active)
            read_replay(l, r);
        if (r->rec.active && r->used && readable(r->dealer))
            r->hot |= 1u << K_DEALER;
    }
    if (r->used && (hot & (1u << K_MON)) && readable(r->mon)) {
        read_monitor(l, r);
        if (readable(r->mon))
            r->hot |= 1u << K_MON;
    }
    if (r->used && (hot & (1u << K_SUB)) && readable(r->sub)) {
        for (int m = 0; m < DRAIN_PER_RANK && r->used && read_one(l, r); m++) {
        }
        if (r->used && readable(r->sub))
            r->hot |= 1u << K_SUB;
    }
}

int kvr_zmq_listener_poll(kvr_zmq_listener_t *l, int timeout_ms)
{
    if (l == NULL)
        return KVR_EINVAL;
    uint64_t now = kvr_now_ms();
    long wait = timeout_ms < 0 ? -1 : timeout_ms;
    for (size_t i = 0; i < l->cap; i++) {
        rank_t *r = &l->ranks[i];
        if (!r->used)
            continue;
        if (r->hot)
            wait = 0;
        if (r->rec.active) {
            uint64_t left = r->rec.deadline_ms > now ? r->rec.deadline_ms - now : 0;
            if (wait < 0 || left < (uint64_t)wait)
                wait = (long)left;
        }
    }
    int n = epoll_wait(l->epfd, l->evs, (int)(3 * l->cap + 1), (int)wait);
    if (n < 0)
        return errno == EINTR ? 0 : KVR_EIO;
    for (int k = 0; k < n; k++) {
        uint64_t d = l->evs[k].data.u64;
        if (d == WAKE_TOKEN) {
            uint64_t v;
            ssize_t got = read(l->wakefd, &v, sizeof v);
            (void)got;
            continue;
        }
        rank_t *r = &l->ranks[d / 4];
        if (r->used)
            r->hot |= (uint8_t)(1u << (d % 4));
    }
    uint64_t before = l->st.batches;
    for (size_t i = 0; i < l->cap; i++) {
        rank_t *r = &l->ranks[i];
        if (r->used && (r->hot || r->rec.active))
            serve_rank(l, r);
    }
    expire_recoveries(l, kvr_now_ms());
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

int kvr_zmq_listener_verify(const kvr_zmq_listener_t *l, char *msg, size_t msg_len)
{
    char dummy[8];
    if (msg == NULL) {
        msg = dummy;
        msg_len = sizeof dummy;
    }
    uint64_t active = 0, held = 0, bytes = 0;
    for (size_t i = 0; i < l->cap; i++) {
        const rank_t *r = &l->ranks[i];
        if (!r->used)
            continue;
        const recovery_t *rc = &r->rec;
        size_t cnt = 0, b = 0;
        const held_t *last = NULL;
        for (const held_t *h = rc->head; h != NULL; h = h->next) {
            cnt++;
            b += h->len;
            last = h;
        }
        const char *bad = NULL;
        if (cnt != rc->n_held || b != rc->held_bytes || last != rc->tail)
            bad = "hold list does not match its count, bytes or tail";
        else if (cnt > l->cfg.max_held_batches || b > l->cfg.max_held_bytes)
            bad = "hold over its bounds";
        else if (!rc->active && cnt > 0)
            bad = "batches held while not recovering";
        else if (rc->active && (r->dealer == NULL || rc->from >= rc->upto))
            bad = "recovering without a replay socket or with an empty range";
        else if (rc->active != r->info.recovering || r->info.held_batches != cnt)
            bad = "rank info disagrees with the recovery";
        else if (rc->active && r->cur.started && r->cur.next > rc->upto)
            bad = "cursor beyond the range being recovered";
        if (bad != NULL) {
            snprintf(msg, msg_len, "worker %llu rank %u: %s", (unsigned long long)r->worker_id,
                     r->dp_rank, bad);
            return KVR_EINVAL;
        }
        active += rc->active;
        held += cnt;
        bytes += b;
    }
    if (active != l->st.replays_in_progress || held != l->st.held_batches ||
        bytes != l->st.held_bytes) {
        snprintf(msg, msg_len, "gauges (%llu, %llu, %llu) != sums (%llu, %llu, %llu)",
                 (unsigned long long)l->st.replays_in_progress,
                 (unsigned long long)l->st.held_batches, (unsigned long long)l->st.held_bytes,
                 (unsigned long long)active, (unsigned long long)held, (unsigned long long)bytes);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/*
 * kv_publisher.c: see kv_publisher.h for the wire behaviour.
 *
 * The replay ring is a circular array of (seq, len, bytes) copies that grows geometrically up
 * to buffer_steps slots (a publisher that never gets busy never pays for 10,000 slots):
 *
 *     slots:  [ s+2 | s+3 | ... free ... | s | s+1 ]
 *                                          ^head (oldest)
 *
 * Invariants (kvr_kv_pub_verify): the count kept batches carry consecutive numbers ending at
 * next_seq - 1 (so the batch for number n sits at (head + n - oldest) % cap, and a replay
 * finds its start by arithmetic); count <= buffer_steps; bytes is the sum of their lengths and
 * stays <= buffer_bytes unless the ring holds a single batch (the newest is always kept, even
 * when it alone is over the cap, so a replay can always reach the last batch sent).
 *
 * Replay answers are jobs (peer id, next number, end number) advanced with ZMQ_DONTWAIT sends
 * on a ZMQ_ROUTER_MANDATORY socket: when a peer's pipe is at the HWM the job waits for the next
 * poll instead of blocking the caller or dropping replies. The end number is fixed when the
 * request arrives (vLLM answers from the buffer as it was). If batches a waiting job still
 * has to send are evicted meanwhile, it continues from the oldest kept one: the consumer sees
 * the jump, exactly as for a request older than the ring. At most MAX_JOBS answers wait at
 * once, MAX_JOBS_PER_PEER of them for one peer (further requests are refused and counted), so
 * a peer that asks and never reads costs bounded memory (its HWM of replies queued in libzmq
 * and a few job slots) and cannot crowd out the others.
 *
 * Differences from vLLM's ZmqEventPublisher, invisible to a well-behaved consumer:
 *   - the batch is buffered before it is sent (vLLM sends, then buffers, so a failed send
 *     loses it for replay too);
 *   - a replay request must have an empty delimiter and an 8-byte number (vLLM checks the frame
 *     count only and reads any length as a big-endian integer);
 *   - vLLM's ROUTER keeps libzmq's defaults, so replies past its HWM (1000) are silently
 *     dropped and the consumer sees a hole in the middle of a replay; here they wait;
 *   - every pending request is read per poll (vLLM: one per 0.1 s loop turn), up to
 *     MAX_REQUESTS_PER_POLL messages so that a flood cannot hold the caller.
 *
 * Ownership: the ring's copies are the publisher's; zmq_send copies again into libzmq's queue
 * (a copy that outlives eviction, which zero-copy messages pointing into the ring would not).
 * Threads: the owning thread only. Cost: publish = malloc + memcpy of the payload, three sends;
 * a replay costs four sends per batch replayed; a poll with nothing to do, one failed recv.
 */
#include "events/kv_publisher.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvrouter.h"
#include "base/log.h"

#define DEFAULT_BUFFER_BYTES ((size_t)256 << 20)
#define DEFAULT_HWM 100000
#define ROUTER_HWM 1000 /* libzmq's default, as vLLM leaves it; an answer waits beyond it */
#define INITIAL_SLOTS 256u
#define MAX_REQUESTS_PER_POLL 4096
#define MAX_REQUEST_FRAMES 4 /* frames kept of a request; more only make it invalid */

#define MAX_JOBS 64         /* answers in progress at once */
#define MAX_JOBS_PER_PEER 4 /* of which for one peer: a stuck one cannot crowd out the rest */
#define MAX_PEER_ID 255     /* libzmq's limit on a routing id */

static const uint8_t END_SEQ[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

/* One answer in progress: batches [next, end) then the end marker, to one peer. */
typedef struct job {
    uint64_t next;
    uint64_t end;   /* next_seq when the request came: vLLM answers with what it had then */
    bool truncated; /* counted in replay_truncated */
    uint8_t id_len;
    uint8_t id[MAX_PEER_ID];
} job_t;

typedef struct slot {
    uint64_t seq;
    size_t len;
    uint8_t *bytes;
} slot_t;

struct kvr_kv_pub {
    void *pub;
    void *router; /* NULL without a replay endpoint */
    uint8_t *topic;
    size_t topic_len;
    uint64_t next_seq;
    uint32_t drop_left;

    slot_t *slots;
    uint32_t cap;       /* slots allocated */
    uint32_t head;      /* index of the oldest kept batch */
    uint32_t count;     /* batches kept */
    uint32_t max_steps; /* buffer_steps */
    size_t bytes;       /* sum of kept lengths */
    size_t max_bytes;   /* buffer_bytes */

    job_t jobs[MAX_JOBS]; /* in arrival order */
    uint32_t n_jobs;

    kvr_kv_pub_stats_t st;
    kvr_ratelimit_t rl_invalid, rl_send;
};

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- addresses ---- */

bool kvr_kv_pub_should_bind(const char *endpoint)
{
    if (endpoint == NULL)
        return false;
    return strchr(endpoint, '*') != NULL || strstr(endpoint, "::") != NULL ||
           starts_with(endpoint, "ipc://") || starts_with(endpoint, "inproc://");
}

static int fits(int n, size_t cap)
{
    if (n < 0)
        return KVR_EINVAL;
    return (size_t)n < cap ? KVR_OK : KVR_ETOOBIG;
}

int kvr_kv_pub_endpoint_for_rank(const char *endpoint, uint32_t rank, char *out, size_t cap)
{
    if (endpoint == NULL || out == NULL || cap == 0)
        return KVR_EINVAL;
    if (rank == 0) {
        size_t n = strlen(endpoint);
        if (n >= cap)
            return KVR_ETOOBIG;
        memcpy(out, endpoint, n + 1);
        return KVR_OK;
    }
    if (starts_with(endpoint, "ipc://") || starts_with(endpoint, "inproc://"))
        return fits(snprintf(out, cap, "%s_dp%" PRIu32, endpoint, rank), cap);
    if (!starts_with(endpoint, "tcp://"))
        return KVR_EINVAL;
    /* the port follows the last ':' ("tcp://[::1]:5557" included); digits only */
    const char *colon = strrchr(endpoint, ':');
    const char *port = colon + 1;
    size_t digits = strspn(port, "0123456789");
    if (colon < endpoint + strlen("tcp://") || digits == 0 || digits > 5 || port[digits] != '\0')
        return KVR_EINVAL;
    unsigned long base = strtoul(port, NULL, 10);
    if (base > 65535 || (uint64_t)base + rank > 65535)
        return KVR_EINVAL;
    int host_len = (int)(colon - endpoint);
    return fits(snprintf(out, cap, "%.*s:%lu", host_len, endpoint, base + rank), cap);
}

/* ---- creation ---- */

static int validate(const void *ctx, const kvr_kv_pub_config_t *cfg, char *err, size_t err_len)
{
    if (ctx == NULL) {
        snprintf(err, err_len, "kv events publisher: no ZMQ context");
        return KVR_EINVAL;
    }
    if (cfg == NULL || cfg->endpoint == NULL || cfg->endpoint[0] == '\0') {
        snprintf(err, err_len, "kv events endpoint missing");
        return KVR_EINVAL;
    }
    if (cfg->buffer_steps == 0) {
        snprintf(err, err_len, "kv events buffer_steps must be >= 1");
        return KVR_EINVAL;
    }
    if (cfg->hwm < 0) {
        snprintf(err, err_len, "kv events hwm %d must be >= 0", cfg->hwm);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* An address libzmq cannot parse is the operator's mistake (KVR_EINVAL); one it cannot use
 * (port taken, host unreachable, no such directory) is an I/O failure. */
static int zmq_failure(const char *what, const char *addr, char *err, size_t err_len)
{
    int e = zmq_errno();
    snprintf(err, err_len, "%s %s: %s", what, addr, zmq_strerror(e));
    return e == EINVAL || e == EPROTONOSUPPORT || e == ENOCOMPATPROTO ? KVR_EINVAL : KVR_EIO;
}

static void *open_socket(void *ctx, int type, const char *addr, bool bind, int hwm,
                         const char *what, int *status, char *err, size_t err_len)
{
    void *s = zmq_socket(ctx, type);
    if (s == NULL) {
        *status = zmq_failure(what, addr, err, err_len);
        return NULL;
    }
    int linger = 0, one = 1;
    /* options before bind/connect: libzmq applies them to pipes as they are created */
    int rc = zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (rc == 0)
        rc = zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (rc == 0 && strchr(addr, '[') != NULL)
        rc = zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
    if (rc == 0 && type == ZMQ_ROUTER)
        rc = zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
#ifdef ZMQ_XPUB_VERBOSER
    if (rc == 0 && type == ZMQ_XPUB) /* every subscribe and unsubscribe, not just the first */
        rc = zmq_setsockopt(s, ZMQ_XPUB_VERBOSER, &one, sizeof one);
#endif
    if (rc == 0)
        rc = bind ? zmq_bind(s, addr) : zmq_connect(s, addr);
    if (rc != 0) {
        *status = zmq_failure(what, addr, err, err_len);
        zmq_close(s);
        return NULL;
    }
    return s;
}

kvr_kv_pub_t *kvr_kv_pub_new(void *zmq_ctx, const kvr_kv_pub_config_t *cfg, int *status,
                             char *err, size_t err_len)
{
    int st_dummy;
    char err_dummy[8];
    if (status == NULL)
        status = &st_dummy;
    if (err == NULL || err_len == 0) {
        err = err_dummy;
        err_len = sizeof err_dummy;
    }
    err[0] = '\0';
    *status = validate(zmq_ctx, cfg, err, err_len);
    if (*status != KVR_OK)
        return NULL;

    kvr_kv_pub_t *p = calloc(1, sizeof *p);
    const char *topic = cfg->topic ? cfg->topic : "";
    if (p != NULL) {
        p->topic_len = strlen(topic);
        p->topic = malloc(p->topic_len + 1);
        p->cap = cfg->buffer_steps < INITIAL_SLOTS ? cfg->buffer_steps : INITIAL_SLOTS;
        p->slots = calloc(p->cap, sizeof *p->slots);
    }
    if (p == NULL || p->topic == NULL || p->slots == NULL) {
        kvr_kv_pub_free(p);
        snprintf(err, err_len, "kv events publisher: out of memory");
        *status = KVR_ENOMEM;
        return NULL;
    }
    memcpy(p->topic, topic, p->topic_len + 1);
    p->max_steps = cfg->buffer_steps;
    p->max_bytes = cfg->buffer_bytes ? cfg->buffer_bytes : DEFAULT_BUFFER_BYTES;
    p->rl_invalid = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);
    p->rl_send = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);

    int hwm = cfg->hwm ? cfg->hwm : DEFAULT_HWM;
    p->pub = open_socket(zmq_ctx, ZMQ_XPUB, cfg->endpoint, kvr_kv_pub_should_bind(cfg->endpoint),
                         hwm, "kv events endpoint", status, err, err_len);
    if (p->pub == NULL) {
        kvr_kv_pub_free(p);
        return NULL;
    }
    if (cfg->replay_endpoint != NULL && cfg->replay_endpoint[0] != '\0') {
        p->router = open_socket(zmq_ctx, ZMQ_ROUTER, cfg->replay_endpoint, true, ROUTER_HWM,
                                "kv events replay endpoint", status, err, err_len);
        if (p->router == NULL) {
            kvr_kv_pub_free(p);
            return NULL;
        }
    }
    *status = KVR_OK;
    return p;
}

void kvr_kv_pub_free(kvr_kv_pub_t *p)
{
    if (p == NULL)
        return;
    if (p->pub != NULL)
        zmq_close(p->pub);
    if (p->router != NULL)
        zmq_close(p->router);
    for (uint32_t i = 0; p->slots != NULL && i < p->count; i++)
        free(p->slots[(p->head + i) % p->cap].bytes);
    free(p->slots);
    free(p->topic);
    free(p);
}

/* ---- the ring ---- */

static slot_t *slot_at(const kvr_kv_pub_t *p, uint32_t i) /* i-th oldest */
{
    return &p->slots[(p->head + i) % p->cap];
}

static void evict_oldest(kvr_kv_pub_t *p)
{
    slot_t *s = slot_at(p, 0);
    p->bytes -= s->len;
    free(s->bytes);
    *s = (slot_t){0};
    p->head = (p->head + 1) % p->cap;
    p->count--;
}

/* Makes room for one more slot: evicts at buffer_steps, grows below it. */
static int reserve_slot(kvr_kv_pub_t *p)
{
    if (p->count == p->max_steps) {
        evict_oldest(p);
        return KVR_OK;
    }
    if (p->count < p->cap)
        return KVR_OK;
    uint32_t ncap = p->cap > p->max_steps / 2 ? p->max_steps : p->cap * 2;
    slot_t *ns = malloc((size_t)ncap * sizeof *ns);
    if (ns == NULL)
        return KVR_ENOMEM;
    for (uint32_t i = 0; i < p->count; i++) /* unwrap: oldest at index 0 */
        ns[i] = *slot_at(p, i);
    free(p->slots);
    p->slots = ns;
    p->cap = ncap;
    p->head = 0;
    return KVR_OK;
}

/* Takes ownership of bytes. */
static void push(kvr_kv_pub_t *p, uint64_t seq, uint8_t *bytes, size_t len)
{
    *slot_at(p, p->count) = (slot_t){.seq = seq, .len = len, .bytes = bytes};
    p->count++;
    p->bytes += len;
    while (p->bytes > p->max_bytes && p->count > 1)
        evict_oldest(p);
}

/* ---- publishing ---- */

static int send_frame(void *s, const void *data, size_t len, bool more)
{
    return zmq_send(s, data, len, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0 ? -1 : 0;
}

int kvr_kv_pub_publish(kvr_kv_pub_t *p, const uint8_t *payload, size_t len, uint64_t *seq)
{
    if (p == NULL || payload == NULL || len == 0)
        return KVR_EINVAL;
    uint8_t *copy = malloc(len);
    if (copy == NULL || reserve_slot(p) != KVR_OK) {
        free(copy);
        return KVR_ENOMEM;
    }
    memcpy(copy, payload, len);
    uint64_t n = p->next_seq++;
    push(p, n, copy, len); /* kept before it is sent: a failed send stays replayable */
    if (seq != NULL)
        *seq = n;
    if (p->drop_left > 0) {
        p->drop_left--;
        p->st.dropped++;
        return KVR_OK;
    }
    uint8_t seq_be[8];
    put_be64(seq_be, n);
    /* a PUB socket never blocks: past its HWM libzmq drops the message and reports success */
    if (send_frame(p->pub, p->topic, p->topic_len, true) != 0 ||
        send_frame(p->pub, seq_be, sizeof seq_be, true) != 0 ||
        send_frame(p->pub, payload, len, false) != 0) {
        p->st.publish_errors++;
        kvr_log_limited(&p->rl_send, KVR_LOG_WARN, "kv events: batch %llu not sent: %s",
                        (unsigned long long)n, zmq_strerror(zmq_errno()));
        return KVR_EIO;
    }
    p->st.published++;
    return KVR_OK;
}

void kvr_kv_pub_drop_next(kvr_kv_pub_t *p, uint32_t n)
{
    if (p != NULL)
        p->drop_left = n;
}

/* ---- replay ---- */

/* Sends [identity, "", seq, payload]. 0, or the errno of a refusal: only the identity frame
 * can be refused (EHOSTUNREACH: the peer is gone; EAGAIN: its pipe is at the HWM), the rest of
 * a message the ROUTER accepted always goes. */
static int send_reply(kvr_kv_pub_t *p, const job_t *j, const uint8_t seq_be[8],
                      const void *payload, size_t len)
{
    if (send_frame(p->router, j->id, j->id_len, true) != 0)
        return zmq_errno() ? zmq_errno() : EIO;
    if (send_frame(p->router, "", 0, true) != 0 || send_frame(p->router, seq_be, 8, true) != 0 ||
        send_frame(p->router, payload, len, false) != 0)
        return EIO; /* never EAGAIN here: a half-sent message must not be resumed */
    return 0;
}

typedef enum job_end { JOB_DONE, JOB_BLOCKED, JOB_GONE } job_end_t;

/* Sends as much of one answer as the peer's pipe takes. */
static job_end_t pump(kvr_kv_pub_t *p, job_t *j)
{
    for (;;) {
        uint8_t seq_be[8];
        int rc;
        uint64_t oldest = p->count > 0 ? slot_at(p, 0)->seq : 0;
        if (j->next < j->end && j->next < oldest) {
            /* asked for evicted batches, or they were evicted while the answer waited */
            if (!j->truncated)
                p->st.replay_truncated++;
            j->truncated = true;
            j->next = oldest; /* may now be past end: then only the end marker is left */
        }
        if (j->next < j->end) {
            const slot_t *s = slot_at(p, (uint32_t)(j->next - oldest));
            put_be64(seq_be, s->seq);
            rc = send_reply(p, j, seq_be, s->bytes, s->len);
            if (rc == 0) {
                p->st.replayed_batches++;
                j->next++;
                continue;
            }
        } else {
            rc = send_reply(p, j, END_SEQ, "", 0);
            if (rc == 0)
                return JOB_DONE;
        }
        if (rc == EAGAIN)
            return JOB_BLOCKED;
        p->st.replay_send_errors++;
        kvr_log_limited(&p->rl_send, KVR_LOG_WARN, "kv events: replay answer abandoned at %llu: %s",
                        (unsigned long long)j->next, zmq_strerror(rc));
        return JOB_GONE;
    }
}

static bool same_peer(const job_t *a, const job_t *b)
{
    return a->id_len == b->id_len && memcmp(a->id, b->id, a->id_len) == 0;
}

static uint32_t peer_jobs(const kvr_kv_pub_t *p, const job_t *j)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_jobs; i++)
        n += same_peer(&p->jobs[i], j);
    return n;
}

/* Advances every answer in arrival order; one peer's answers go strictly one after another.
 * Returns how many were completed. */
static int pump_all(kvr_kv_pub_t *p)
{
    int done = 0;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < p->n_jobs; i++) {
        job_t *j = &p->jobs[i];
        bool behind = false; /* an earlier answer to the same peer is still going */
        for (uint32_t k = 0; k < kept && !behind; k++)
            behind = same_peer(&p->jobs[k], j);
        job_end_t r = behind ? JOB_BLOCKED : pump(p, j);
        if (r == JOB_BLOCKED) {
            if (kept != i)
                p->jobs[kept] = *j;
            kept++;
        } else if (r == JOB_DONE) {
            done++;
        }
    }
    p->n_jobs = kept;
    return done;
}

/* Reads one request without waiting into *j. 1 = valid, 0 = malformed (counted), -1 = none
 * pending. */
static int read_request(kvr_kv_pub_t *p, job_t *j)
{
    zmq_msg_t f[MAX_REQUEST_FRAMES];
    int nf = 0, total = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        /* the parts of a message arrive together: once the first is here, none can block */
        if (zmq_msg_recv(&m, p->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (total == 0)
                return -1;
            break;
        }
        total++;
        more = zmq_msg_more(&m);
        if (nf < MAX_REQUEST_FRAMES)
            f[nf++] = m;
        else
            zmq_msg_close(&m);
    }
    int out = 0;
    if (total == 3 && !more && zmq_msg_size(&f[0]) <= MAX_PEER_ID &&
        zmq_msg_size(&f[1]) == 0 && zmq_msg_size(&f[2]) == 8) {
        *j = (job_t){.next = be64(zmq_msg_data(&f[2])),
                     .end = p->next_seq,
                     .id_len = (uint8_t)zmq_msg_size(&f[0])};
        memcpy(j->id, zmq_msg_data(&f[0]), j->id_len);
        out = 1;
    } else {
        p->st.invalid_requests++;
        kvr_log_limited(&p->rl_invalid, KVR_LOG_WARN,
                        "kv events: invalid replay request (%d frames%s), ignored", total,
                        total == 3 ? ", want an empty delimiter and an 8-byte sequence number"
                                   : ", want 3");
    }
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
    return out;
}

int kvr_kv_pub_poll_replay(kvr_kv_pub_t *p)
{
    if (p == NULL || p->router == NULL)
        return 0;
    int done = pump_all(p);
    for (int i = 0; i < MAX_REQUESTS_PER_POLL; i++) {
        job_t j;
        int rc = read_request(p, &j);
        if (rc < 0)
            break;
        if (rc == 0)
            continue;
        p->st.replay_requests++;
        if (p->n_jobs == MAX_JOBS || peer_jobs(p, &j) == MAX_JOBS_PER_PEER)
            done += pump_all(p);
        uint32_t mine = peer_jobs(p, &j);
        if (p->n_jobs == MAX_JOBS || mine == MAX_JOBS_PER_PEER) {
            p->st.replay_send_errors++;
            kvr_log_limited(&p->rl_send, KVR_LOG_WARN,
                            "kv events: replay request refused: %u answers waiting for this "
                            "peer, %u in all",
                            mine, p->n_jobs);
            continue;
        }
        p->jobs[p->n_jobs++] = j;
    }
    return done + pump_all(p);
}

void kvr_kv_pub_poll_subscriptions(kvr_kv_pub_t *p)
{
    if (p == NULL || p->pub == NULL)
        return;
    for (int i = 0; i < 1024; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        const uint8_t *d = zmq_msg_data(&m);
        if (zmq_msg_size(&m) >= 1 && d[0] == 1)
            p->st.subscribers++;
        else if (zmq_msg_size(&m) >= 1 && d[0] == 0 && p->st.subscribers > 0)
            p->st.subscribers--;
        zmq_msg_close(&m);
    }
}

int kvr_kv_pub_replay_fd(const kvr_kv_pub_t *p)
{
    int fd = -1;
    size_t len = sizeof fd;
    if (p == NULL || p->router == NULL || zmq_getsockopt(p->router, ZMQ_FD, &fd, &len) != 0)
        return -1;
    return fd;
}

bool kvr_kv_pub_replay_readable(const kvr_kv_pub_t *p)
{
    int ev = 0;
    size_t len = sizeof ev;
    if (p == NULL || p->router == NULL || zmq_getsockopt(p->router, ZMQ_EVENTS, &ev, &len) != 0)
        return false;
    return (ev & ZMQ_POLLIN) != 0;
}

/* ---- introspection ---- */

uint64_t kvr_kv_pub_next_seq(const kvr_kv_pub_t *p) { return p->next_seq; }

void kvr_kv_pub_get_stats(const kvr_kv_pub_t *p, kvr_kv_pub_stats_t *out)
{
    *out = p->st;
    out->buffered = p->count;
    out->buffered_bytes = p->bytes;
    out->replay_in_progress = p->n_jobs;
}

int kvr_kv_pub_endpoint(const kvr_kv_pub_t *p, bool replay, char *out, size_t cap)
{
    if (p == NULL || out == NULL || cap == 0)
        return KVR_EINVAL;
    void *s = replay ? p->router : p->pub;
    if (s == NULL)
        return KVR_ENOTFOUND;
    size_t n = cap;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, out, &n) != 0)
        return zmq_errno() == EINVAL ? KVR_ETOOBIG : KVR_EIO;
    return KVR_OK;
}

int kvr_kv_pub_verify(const kvr_kv_pub_t *p, char *msg, size_t msg_len)
{
    char dummy[8];
    if (msg == NULL || msg_len == 0) {
        msg = dummy;
        msg_len = sizeof dummy;
    }
#define FAIL(...)                                \
    do {                                         \
        snprintf(msg, msg_len, __VA_ARGS__);     \
        return KVR_EINVAL;                       \
    } while (0)
    if (p == NULL)
        FAIL("no publisher");
    if (p->count > p->cap || p->cap > p->max_steps || (p->cap > 0 && p->head >= p->cap))
        FAIL("ring shape: count %u cap %u head %u steps %u", p->count, p->cap, p->head,
             p->max_steps);
    if (p->count == 0 && p->next_seq != 0)
        FAIL("ring empty after %llu batches: the newest must be kept",
             (unsigned long long)p->next_seq);
    size_t sum = 0;
    for (uint32_t i = 0; i < p->count; i++) {
        const slot_t *s = slot_at(p, i);
        uint64_t want = p->next_seq - p->count + i;
        if (s->seq != want)
            FAIL("slot %u holds batch %llu, expected %llu", i, (unsigned long long)s->seq,
                 (unsigned long long)want);
        if (s->bytes == NULL || s->len == 0)
            FAIL("batch %llu has no bytes", (unsigned long long)s->seq);
        sum += s->len;
    }
    if (sum != p->bytes)
        FAIL("ring bytes %zu, slots add up to %zu", p->bytes, sum);
    if (p->bytes > p->max_bytes && p->count > 1)
        FAIL("ring holds %zu bytes in %u batches, cap %zu", p->bytes, p->count, p->max_bytes);
#undef FAIL
    return KVR_OK;
}

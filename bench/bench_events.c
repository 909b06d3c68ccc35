/*
 * bench_events.c: `kvrouter bench events`: the ingest pipeline's throughput, ZeroMQ to applied,
 * on one ingest thread: engine batches -> SUB socket -> decode -> rehash (XXH3 per block) ->
 * kvr_index_apply, all of it `kvrouter serve`'s own code (events/ingest.c).
 *
 * Setup, in one process: a prefix index (KVR_SYNC_RCU, budget --pairs, 2M) and a kvr_ingest_t
 * (block size 16) subscribed to --workers (4) engine publishers. Each publisher is a socket
 * this benchmark binds on tcp://127.0.0.1 (an ephemeral port), as vLLM binds and the router
 * connects. The sockets are XPUB rather than PUB (the same wire protocol to a SUB) only so that
 * the benchmark can wait for the router's subscription before batch 0: no batch is lost to
 * ZeroMQ's slow-joiner window. SNDHWM is unlimited, so ZeroMQ never drops; back-pressure goes
 * through TCP to the publisher's queue.
 *
 * The stream (seeded, generated before timing, encoded by wire/kv_encode.c exactly as vLLM's
 * array-era publisher sends it: [ts, events, 0] with 7-element BlockStored): per worker, each
 * BlockStored is one request's prefill of 32 blocks x 16 tokens (random ids < 151936), either
 * a new root or hanging off a block the worker holds (the end of an earlier prefix, or a
 * branch in its middle), and BlockRemoved events evict leaf blocks (a segment's tail) whenever
 * the worker holds more than its share of half the budget, so the index stays at a steady
 * size. A batch carries 1-3 events of one worker; workers' batches interleave at random, each
 * worker's numbered from 0 ([topic "", seq u64 BE, payload]). First a warm-up stream (stores
 * only) brings every worker to its share, untimed; then each run publishes 8M blocks' worth
 * (2M with --quick) continuing the same stream, as fast as possible (or at --rate blocks/s).
 *
 * Measured per run: from the first send to the moment the ingest thread has handed every batch
 * to the decoder and applied its events (kvr_ingest_stats polled every 2 ms through a no-op
 * command, which makes the ingest thread refresh its snapshot; so the end is late by <= ~2 ms).
 * per_s = (stored + removed blocks) / seconds; batches_per_s likewise; the median of --runs.
 * gaps = ZeroMQ gaps seen (must be 0): a gap, a rejected or undecodable event, or a stall of 5 s
 * fails the benchmark loudly (exit 1). target_per_s = 2M.
 *
 * --publish tcp://HOST:PORT: only publish, vLLM-style (PUB bound at that address, SNDHWM
 * 100000 as vLLM, numbered from 0), the same stream for one worker, generated on the fly, at
 * --rate blocks/s (0 = as fast as possible) for --duration seconds, after a subscriber has
 * joined; prints the achieved rate. For loading an external `kvrouter serve --worker
 * id=1,events=tcp://127.0.0.1:PORT`.
 *
 * Measured (2-core EPYC VM, default parameters): 1.6-1.9M blocks/s (~30K batches/s), run to
 * run noise included. The ingest thread is the bottleneck (one full core; ZeroMQ's I/O threads
 * work only while the backlog is being transferred): ~84% of it in kvr_index_apply (a quarter
 * of that rebuilding the node tables T1/T2 when tombstones pile up: with 1M pairs held they
 * sit just under a power of two, the worst case; 1.2M held gives ~2.0M blocks/s), ~11%
 * decoding, ~1% rehashing, ~2% ZeroMQ.
 *
 * Memory: the pre-generated stream (~40 bytes per block) and the generators are owned here.
 * Threads: main (setup, generation, completion polling), one publisher thread per run, the
 * ingest thread, and ZeroMQ's I/O threads (one per context).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "bench.h"
#include "kvrouter/router.h"
#include "events/ingest.h"
#include "wire/kv_encode.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 6, 0},          {"mode", KVR_BENCH_STR, 7, 0},
    {"workers", KVR_BENCH_INT, 7, 0},        {"blocks_per_batch", KVR_BENCH_NUM, 16, 1},
    {"batches", KVR_BENCH_INT, 8, 0},        {"blocks", KVR_BENCH_INT, 9, 0},
    {"runs", KVR_BENCH_INT, 0, 0},           {"per_s", KVR_BENCH_NUM, 10, 0},
    {"batches_per_s", KVR_BENCH_NUM, 13, 0}, {"target_per_s", KVR_BENCH_NUM, 12, 0},
    {"gaps", KVR_BENCH_INT, 4, 0},           {"seconds", KVR_BENCH_NUM, 7, 3},
    {"index_pairs", KVR_BENCH_INT, 11, 0},   {"rate", KVR_BENCH_NUM, 0, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

#define BLOCK_SIZE 16u
#define EV_BLOCKS 32u           /* blocks per BlockStored: one request's prefill */
#define MAX_EVENTS_PER_BATCH 3u
#define MAX_DEPTH 64u           /* segments from a root (2048 blocks, 32K tokens) */
#define VOCAB 151936u
#define RUN_BLOCKS 8000000u
#define RUN_BLOCKS_QUICK 2000000u
#define STALL_NS 5000000000ull
#define NONE UINT32_MAX

/* ---- the stream of one worker ----------------------------------------------------------- */

/* One stored event's blocks while (some of) them are held: a prefix ext[0..len). */
typedef struct seg {
    uint64_t ext[EV_BLOCKS];
    uint32_t len;
    uint32_t min_len;   /* children hang off ext[0..min_len): never trimmed below it */
    uint32_t children;
    uint32_t depth;
    uint32_t parent;    /* slot or NONE */
    uint32_t live_pos;  /* index in live[] */
} seg_t;

typedef struct wgen {
    uint32_t worker;
    kvr_bench_rng_t rng;
    seg_t *segs;
    uint32_t n_slots, cap_slots;
    uint32_t *free_slots, n_free;
    uint32_t *live, n_live;  /* slots in use (cap_slots each) */
    uint64_t held, target;
    uint64_t next_id;        /* engine hashes: mix64(worker << 40 | next_id++), all distinct */
    uint64_t seq;            /* the next batch's number */
    uint64_t removed_buf[EV_BLOCKS];
    uint32_t tokens[EV_BLOCKS * BLOCK_SIZE];
} wgen_t;

static int wgen_init(wgen_t *g, uint32_t worker, uint64_t target, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->worker = worker;
    g->target = target;
    kvr_bench_rng_seed(&g->rng, seed ^ kvr_bench_mix64(worker + 1));
    return KVR_OK;
}

static void wgen_deinit(wgen_t *g)
{
    free(g->segs);
    free(g->free_slots);
    free(g->live);
}

static uint32_t seg_alloc(wgen_t *g)
{
    if (g->n_free > 0)
        return g->free_slots[--g->n_free];
    if (g->n_slots == g->cap_slots) {
        uint32_t cap = g->cap_slots ? g->cap_slots * 2 : 1024;
        seg_t *s = realloc(g->segs, cap * sizeof *s);
        uint32_t *f = s ? realloc(g->free_slots, cap * sizeof *f) : NULL;
        uint32_t *l = f ? realloc(g->live, cap * sizeof *l) : NULL;
        if (s)
            g->segs = s;
        if (f)
            g->free_slots = f;
        if (l == NULL)
            return NONE;
        g->live = l;
        g->cap_slots = cap;
    }
    return g->n_slots++;
}

static void seg_free(wgen_t *g, uint32_t slot)
{
    seg_t *s = &g->segs[slot];
    uint32_t last = g->live[--g->n_live];
    g->live[s->live_pos] = last;
    g->segs[last].live_pos = s->live_pos;
    if (s->parent != NONE) {
        seg_t *p = &g->segs[s->parent];
        if (--p->children == 0)
            p->min_len = 0;
    }
    g->free_slots[g->n_free++] = slot;
}

/* A BlockStored of EV_BLOCKS new blocks: a new root (1 in 8, or when the parent would be too
 * deep), else hanging off a held block: the end of a segment (an extended conversation) or a
 * block in its middle (a new request sharing part of a prefix). */
static int gen_store(wgen_t *g, kvr_kv_enc_t *e)
{
    uint32_t slot = seg_alloc(g);
    if (slot == NONE)
        return KVR_ENOMEM;
    seg_t *s = &g->segs[slot];
    s->len = EV_BLOCKS;
    s->min_len = s->children = s->depth = 0;
    s->parent = NONE;
    bool has_parent = false;
    uint64_t parent = 0;
    if (g->n_live > 0 && kvr_bench_rng_below(&g->rng, 8) != 0) {
        uint32_t ps = g->live[kvr_bench_rng_below(&g->rng, g->n_live)];
        seg_t *p = &g->segs[ps];
        if (p->depth + 1 < MAX_DEPTH) {
            uint32_t pos = p->len - 1; /* the end of an earlier prefix, or a branch */
            if (kvr_bench_rng_below(&g->rng, 2))
                pos = (uint32_t)kvr_bench_rng_below(&g->rng, p->len);
            has_parent = true;
            parent = p->ext[pos];
            p->children++;
            if (p->min_len < pos + 1)
                p->min_len = pos + 1;
            s->parent = ps;
            s->depth = p->depth + 1;
        }
    }
    for (uint32_t i = 0; i < EV_BLOCKS; i++)
        s->ext[i] = kvr_bench_mix64(((uint64_t)g->worker << 40) | g->next_id++);
    for (uint32_t i = 0; i < EV_BLOCKS * BLOCK_SIZE; i++)
        g->tokens[i] = (uint32_t)kvr_bench_rng_below(&g->rng, VOCAB);
    s->live_pos = g->n_live;
    g->live[g->n_live++] = slot;
    g->held += EV_BLOCKS;
    kvr_kv_enc_stored_t ev = {.hashes = s->ext, .n_hashes = EV_BLOCKS,
                              .has_parent = has_parent, .parent = parent,
                              .tokens = g->tokens, .n_tokens = EV_BLOCKS * BLOCK_SIZE,
                              .block_size = BLOCK_SIZE, .medium = "GPU"};
    return kvr_kv_enc_add_stored(e, &ev);
}

/* A BlockRemoved of a segment's removable tail (leaf blocks, leaf first). Returns blocks. */
static int gen_remove(wgen_t *g, kvr_kv_enc_t *e, uint32_t *n_blocks)
{
    uint32_t slot = NONE;
    for (int tries = 0; tries < 16 && slot == NONE; tries++) {
        uint32_t c = g->live[kvr_bench_rng_below(&g->rng, g->n_live)];
        if (g->segs[c].len > g->segs[c].min_len)
            slot = c;
    }
    for (uint32_t i = 0, start = (uint32_t)kvr_bench_rng_below(&g->rng, g->n_live);
         i < g->n_live && slot == NONE; i++) {
        uint32_t c = g->live[(start + i) % g->n_live];
        if (g->segs[c].len > g->segs[c].min_len)
            slot = c;
    }
    if (slot == NONE) /* impossible: a segment without children is a leaf */
        return KVR_EINVAL;
    seg_t *s = &g->segs[slot];
    uint32_t k = 0;
    while (s->len > s->min_len)
        g->removed_buf[k++] = s->ext[--s->len];
    g->held -= k;
    *n_blocks = k;
    if (s->len == 0)
        seg_free(g, slot);
    kvr_kv_enc_removed_t ev = {.hashes = g->removed_buf, .n_hashes = k, .medium = "GPU"};
    return kvr_kv_enc_add_removed(e, &ev);
}

/* One batch of 1-3 events: stores while growing or at most the target, removals above it.
 * *bytes, *len point into the encoder; *blocks = stored + removed blocks. */
static int gen_batch(wgen_t *g, kvr_kv_enc_t *e, bool grow, const uint8_t **bytes, size_t *len,
                     uint32_t *blocks, uint32_t *events)
{
    uint32_t n_ev = 1 + (uint32_t)kvr_bench_rng_below(&g->rng, MAX_EVENTS_PER_BATCH);
    double ts = 1789095808.0 + (double)g->seq * 0.005;
    int rc = kvr_kv_enc_begin_batch(e, ts, true, 0);
    *blocks = 0;
    for (uint32_t i = 0; i < n_ev && rc == KVR_OK; i++) {
        uint32_t k = EV_BLOCKS;
        if (!grow && g->held > g->target)
            rc = gen_remove(g, e, &k);
        else
            rc = gen_store(g, e);
        *blocks += k;
    }
    if (rc == KVR_OK)
        rc = kvr_kv_enc_end_batch(e, bytes, len);
    *events = n_ev;
    g->seq++;
    return rc;
}

/* ---- a pre-generated stream --------------------------------------------------------------- */

typedef struct msg {
    uint64_t off;
    uint64_t seq;
    uint32_t len;
    uint32_t worker;  /* index of the publisher socket */
    uint32_t blocks;
} msg_t;

typedef struct stream {
    uint8_t *bytes;
    size_t n_bytes, cap_bytes;
    msg_t *m;
    size_t n, cap;
    uint64_t blocks, events;
} stream_t;

static void stream_clear(stream_t *s)
{
    s->n_bytes = s->n = 0;
    s->blocks = s->events = 0;
}

static int stream_append(stream_t *s, uint32_t worker, uint64_t seq, const uint8_t *b,
                         size_t len, uint32_t blocks, uint32_t events)
{
    if (s->n_bytes + len > s->cap_bytes) {
        size_t cap = s->cap_bytes ? s->cap_bytes : (size_t)64 << 20;
        while (cap < s->n_bytes + len)
            cap *= 2;
        uint8_t *nb = realloc(s->bytes, cap);
        if (nb == NULL)
            return KVR_ENOMEM;
        s->bytes = nb;
        s->cap_bytes = cap;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 65536;
        msg_t *nm = realloc(s->m, cap * sizeof *nm);
        if (nm == NULL)
            return KVR_ENOMEM;
        s->m = nm;
        s->cap = cap;
    }
    memcpy(s->bytes + s->n_bytes, b, len);
    s->m[s->n++] = (msg_t){.off = s->n_bytes, .seq = seq, .len = (uint32_t)len,
                           .worker = worker, .blocks = blocks};
    s->n_bytes += len;
    s->blocks += blocks;
    s->events += events;
    return KVR_OK;
}

/* grow: stores until every worker holds its target; else steady state for `blocks` blocks.
 * Workers take turns at random (engines publish concurrently). */
static int stream_fill(stream_t *s, wgen_t *g, uint32_t n_workers, kvr_kv_enc_t *e,
                       kvr_bench_rng_t *rng, bool grow, uint64_t blocks)
{
    stream_clear(s);
    for (;;) {
        uint32_t w = (uint32_t)kvr_bench_rng_below(rng, n_workers);
        if (grow) {
            uint32_t k = 0;
            while (k < n_workers && g[w].held >= g[w].target)
                w = (w + 1) % n_workers, k++;
            if (k == n_workers)
                return KVR_OK;
        } else if (s->blocks >= blocks) {
            return KVR_OK;
        }
        const uint8_t *b;
        size_t len;
        uint32_t nb, ne;
        uint64_t seq = g[w].seq;
        int rc = gen_batch(&g[w], e, grow, &b, &len, &nb, &ne);
        if (rc == KVR_OK)
            rc = stream_append(s, w, seq, b, len, nb, ne);
        if (rc != KVR_OK)
            return rc;
    }
}

/* ---- publishing ----------------------------------------------------------------------------- */

/* One message [topic "", seq BE, payload]; the payload by reference (it outlives the send).
 * 0 or -1 (errno from ZeroMQ). */
static int send_batch(void *sock, uint64_t seq, const uint8_t *payload, size_t len, bool by_ref)
{
    uint8_t sq[8];
    kvr_kv_enc_seq(seq, sq);
    if (zmq_send(sock, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(sock, sq, 8, ZMQ_SNDMORE) < 0)
        return -1;
    int rc = by_ref ? zmq_send_const(sock, payload, len, 0) : zmq_send(sock, payload, len, 0);
    return rc < 0 ? -1 : 0;
}

/* Sleeps until `blocks` blocks are due at `rate` blocks/s since t0 (no-op when unpaced). */
static void pace(uint64_t t0, uint64_t blocks, double rate)
{
    if (rate <= 0)
        return;
    uint64_t due = t0 + (uint64_t)((double)blocks * 1e9 / rate);
    uint64_t now = kvr_bench_now_ns();
    if (due > now)
        kvr_bench_sleep_ns(due - now);
}

typedef struct publisher {
    void **socks;
    const stream_t *s;
    double rate;
    pthread_t th;
    _Atomic uint64_t t0;  /* the first send */
    _Atomic uint64_t t1;  /* after the last send */
    int err;              /* zmq_errno() of a failed send, 0 = none */
} publisher_t;

static void *publisher_main(void *arg)
{
    publisher_t *p = arg;
    uint64_t t0 = kvr_bench_now_ns(), sent = 0;
    atomic_store(&p->t0, t0);
    for (size_t i = 0; i < p->s->n; i++) {
        const msg_t *m = &p->s->m[i];
        pace(t0, sent, p->rate);
        if (send_batch(p->socks[m->worker], m->seq, p->s->bytes + m->off, m->len, true) != 0) {
            p->err = zmq_errno();
            break;
        }
        sent += m->blocks;
    }
    atomic_store(&p->t1, kvr_bench_now_ns());
    return NULL;
}

/* An XPUB bound at addr (ephemeral port allowed) with the given SNDHWM; its real endpoint
 * (ZMQ_LAST_ENDPOINT) into ep. NULL with a message on failure. */
static void *open_pub(void *ctx, const char *addr, int hwm, char *ep, size_t ep_len)
{
    void *s = zmq_socket(ctx, ZMQ_XPUB);
    int linger = 0;
    if (s == NULL || zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_bind(s, addr) != 0) {
        fprintf(stderr, "kvrouter bench events: cannot bind %s: %s\n", addr,
                zmq_strerror(zmq_errno()));
        if (s)
            zmq_close(s);
        return NULL;
    }
    size_t n = ep_len;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n) != 0)
        snprintf(ep, ep_len, "%s", addr);
    return s;
}

/* Waits for a subscription message on an XPUB (the router's SUB has joined). */
static bool wait_subscriber(void *s, int timeout_ms)
{
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    uint8_t buf[64];
    return zmq_recv(s, buf, sizeof buf, 0) >= 0;
}

/* ---- waiting for the ingest ------------------------------------------------------------- */

/* Fresh stats: a no-op command (a worker without an events address is a no-op to the ingest
 * thread) makes the ingest thread publish its snapshot right away. */
static void fresh_stats(kvr_ingest_t *g, kvr_ingest_stats_t *st)
{
    static kvr_worker_spec_t noop = {.worker_id = UINT64_MAX, .dp_size = 1};
    (void)kvr_ingest_subscribe(g, &noop, NULL, 0);
    kvr_ingest_stats(g, st);
}

static uint64_t lost(const kvr_ingest_stats_t *st)
{
    return st->zmq.gaps + st->zmq.gaps_lost + st->zmq.restarts + st->zmq.undecodable +
           st->zmq.bad_frames + st->events_rejected + st->block_size_mismatch +
           st->decode.batch_errors + st->decode.event_errors;
}

/* Polls until the ingest has handed `want` batches in all to the decoder. *t_end = when seen.
 * KVR_OK, or KVR_EIO after printing what went wrong (a loss, or a stall). */
static int wait_applied(kvr_ingest_t *g, uint64_t want, uint64_t *t_end, kvr_ingest_stats_t *st)
{
    uint64_t last = 0, since = kvr_bench_now_ns();
    for (;;) {
        fresh_stats(g, st);
        uint64_t now = kvr_bench_now_ns();
        if (lost(st) != 0)
            break;
        if (st->zmq.batches >= want) {
            *t_end = now;
            return KVR_OK;
        }
        if (st->zmq.batches != last) {
            last = st->zmq.batches;
            since = now;
        } else if (now - since > STALL_NS) {
            break;
        }
        kvr_bench_sleep_ns(2000000);
    }
    fprintf(stderr,
            "kvrouter bench events: FAILED: the ingest got %llu of %llu batches; gaps %llu "
            "(lost %llu), restarts %llu, undecodable %llu, bad frames %llu, batch errors %llu, "
            "event errors %llu, events rejected %llu, block size mismatches %llu\n",
            (unsigned long long)st->zmq.batches, (unsigned long long)want,
            (unsigned long long)st->zmq.gaps, (unsigned long long)st->zmq.gaps_lost,
            (unsigned long long)st->zmq.restarts, (unsigned long long)st->zmq.undecodable,
            (unsigned long long)st->zmq.bad_frames, (unsigned long long)st->decode.batch_errors,
            (unsigned long long)st->decode.event_errors, (unsigned long long)st->events_rejected,
            (unsigned long long)st->block_size_mismatch);
    return KVR_EIO;
}

/* Publishes s and waits until it is all applied. *seconds = first send to all applied. */
static int publish_and_wait(void **socks, const stream_t *s, double rate, kvr_ingest_t *g,
                            double *seconds, kvr_ingest_stats_t *st)
{
    kvr_ingest_stats_t before;
    fresh_stats(g, &before);
    publisher_t p = {.socks = socks, .s = s, .rate = rate};
    if (pthread_create(&p.th, NULL, publisher_main, &p) != 0)
        return KVR_ENOMEM;
    uint64_t t_end = 0;
    int rc = wait_applied(g, before.zmq.batches + s->n, &t_end, st);
    pthread_join(p.th, NULL);
    if (p.err != 0) {
        fprintf(stderr, "kvrouter bench events: send failed: %s\n", zmq_strerror(p.err));
        return KVR_EIO;
    }
    if (rc == KVR_OK && st->events_applied - before.events_applied != s->events) {
        fprintf(stderr, "kvrouter bench events: FAILED: %llu events applied of %llu sent\n",
                (unsigned long long)(st->events_applied - before.events_applied),
                (unsigned long long)s->events);
        rc = KVR_EIO;
    }
    *seconds = (double)(t_end - atomic_load(&p.t0)) / 1e9;
    return rc;
}

/* ---- the local benchmark ---------------------------------------------------------------- */

typedef struct setup {
    kvr_index_t *ix;
    kvr_ingest_t *g;
    void *ctx;
    void **socks;
    wgen_t *gens;
    kvr_kv_enc_t *enc;
    uint32_t n_workers;
} setup_t;

static void setup_free(setup_t *su)
{
    kvr_ingest_free(su->g); /* stops the ingest thread first */
    kvr_index_free(su->ix);
    for (uint32_t w = 0; su->socks && w < su->n_workers; w++)
        if (su->socks[w])
            zmq_close(su->socks[w]);
    if (su->ctx)
        zmq_ctx_term(su->ctx);
    for (uint32_t w = 0; su->gens && w < su->n_workers; w++)
        wgen_deinit(&su->gens[w]);
    free(su->socks);
    free(su->gens);
    kvr_kv_enc_free(su->enc);
}

static int setup_new(setup_t *su, const kvr_bench_opts_t *o, uint32_t n_workers, uint64_t pairs)
{
    memset(su, 0, sizeof *su);
    su->n_workers = n_workers;
    int st;
    kvr_index_config_t ic = {.max_pairs = (size_t)pairs, .max_workers = n_workers + 1,
                             .sync = KVR_SYNC_RCU};
    kvr_ingest_config_t gc = {.block_size = BLOCK_SIZE};
    kvr_kv_enc_config_t ec = {.format = KVR_KV_FMT_VLLM_ARRAY};
    su->ix = kvr_index_new(&ic, &st);
    su->g = su->ix ? kvr_ingest_new(su->ix, &gc, &st) : NULL;
    su->enc = kvr_kv_enc_new(&ec, &st);
    su->ctx = zmq_ctx_new();
    su->socks = calloc(n_workers, sizeof *su->socks);
    su->gens = calloc(n_workers, sizeof *su->gens);
    if (su->g == NULL || su->enc == NULL || su->ctx == NULL || su->socks == NULL ||
        su->gens == NULL || kvr_ingest_start(su->g) != KVR_OK) {
        fprintf(stderr, "kvrouter bench events: setup failed\n");
        return KVR_ENOMEM;
    }
    /* half the budget held in the steady state, shared by the workers */
    uint64_t target = pairs / 2 / n_workers;
    for (uint32_t w = 0; w < n_workers; w++) {
        wgen_init(&su->gens[w], w, target, o->seed);
        char ep[256];
        su->socks[w] = open_pub(su->ctx, "tcp://127.0.0.1:*", 0, ep, sizeof ep);
        if (su->socks[w] == NULL)
            return KVR_EIO;
        kvr_worker_spec_t spec = {.worker_id = w + 1, .dp_size = 1};
        snprintf(spec.events, sizeof spec.events, "%s", ep);
        char err[256] = "";
        if (kvr_ingest_subscribe(su->g, &spec, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrouter bench events: subscribe %s: %s\n", ep, err);
            return KVR_EIO;
        }
        if (!wait_subscriber(su->socks[w], 5000)) {
            fprintf(stderr, "kvrouter bench events: the ingest did not subscribe to %s\n", ep);
            return KVR_EIO;
        }
    }
    return KVR_OK;
}

static int run_local(const kvr_bench_opts_t *o, uint32_t n_workers, uint64_t pairs)
{
    setup_t su;
    stream_t s = {0};
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, o->seed ^ 0xe7e47u);
    double *f = calloc(3 * (size_t)o->runs, sizeof *f);
    int rc = setup_new(&su, o, n_workers, pairs);
    if (rc == KVR_OK && f == NULL)
        rc = KVR_ENOMEM;
    kvr_ingest_stats_t st;
    double secs = 0;
    if (rc == KVR_OK) /* warm-up: every worker grows to its share, untimed */
        rc = stream_fill(&s, su.gens, n_workers, su.enc, &rng, true, 0);
    if (rc == KVR_OK)
        rc = publish_and_wait(su.socks, &s, 0, su.g, &secs, &st);
    uint64_t run_blocks = o->quick ? RUN_BLOCKS_QUICK : RUN_BLOCKS, batches = 0, blocks = 0;
    double *frate = f, *fbatch = f + o->runs, *fsecs = f + 2 * o->runs;
    for (unsigned r = 0; r < o->runs && rc == KVR_OK; r++) {
        rc = stream_fill(&s, su.gens, n_workers, su.enc, &rng, false, run_blocks);
        if (rc == KVR_OK)
            rc = publish_and_wait(su.socks, &s, o->rate_per_s, su.g, &secs, &st);
        if (rc != KVR_OK)
            break;
        frate[r] = (double)s.blocks / secs;
        fbatch[r] = (double)s.n / secs;
        fsecs[r] = secs;
        batches = s.n;
        blocks = s.blocks;
    }
    if (rc == KVR_OK) {
        kvr_bench_row_t row;
        kvr_bench_row_init(&row, COLS, N_COLS);
        kvr_bench_set_str(&row, "bench", "events");
        kvr_bench_set_str(&row, "mode", "local");
        kvr_bench_set_int(&row, "workers", n_workers);
        kvr_bench_set_num(&row, "blocks_per_batch", batches ? (double)blocks / (double)batches
                                                            : NAN);
        kvr_bench_set_int(&row, "batches", (int64_t)batches);
        kvr_bench_set_int(&row, "blocks", (int64_t)blocks);
        kvr_bench_set_int(&row, "runs", o->runs);
        kvr_bench_set_num(&row, "per_s", kvr_bench_median(frate, o->runs));
        kvr_bench_set_num(&row, "batches_per_s", kvr_bench_median(fbatch, o->runs));
        kvr_bench_set_num(&row, "target_per_s", 2e6);
        kvr_bench_set_int(&row, "gaps", (int64_t)st.zmq.gaps);
        kvr_bench_set_num(&row, "seconds", kvr_bench_median(fsecs, o->runs));
        kvr_bench_set_int(&row, "index_pairs", (int64_t)st.index.pairs);
        kvr_bench_set_num(&row, "rate", o->rate_per_s > 0 ? o->rate_per_s : NAN);
        kvr_bench_print_row(o, &row);
    }
    kvr_ingest_free(su.g); /* the writer stops: the index may be read here */
    su.g = NULL;
    if (su.ix != NULL)
        kvr_bench_check_stats("bench events", su.ix);
    setup_free(&su);
    free(s.bytes);
    free(s.m);
    free(f);
    return rc == KVR_OK ? 0 : 1;
}

/* ---- --publish: only publish, for an external router --------------------------------------- */

static int run_publish(const kvr_bench_opts_t *o, uint64_t pairs)
{
    int st, rc = 1;
    kvr_kv_enc_config_t ec = {.format = KVR_KV_FMT_VLLM_ARRAY};
    kvr_kv_enc_t *e = kvr_kv_enc_new(&ec, &st);
    void *ctx = zmq_ctx_new();
    wgen_t g;
    wgen_init(&g, 0, pairs / 2, o->seed);
    char ep[256];
    void *sock = e && ctx ? open_pub(ctx, o->publish, 100000, ep, sizeof ep) : NULL;
    if (sock == NULL)
        goto out;
    fprintf(stderr, "kvrouter bench events: publishing at %s; waiting for a subscriber "
                    "(60 s)\n", ep);
    if (!wait_subscriber(sock, 60000)) {
        fprintf(stderr, "kvrouter bench events: no subscriber joined %s\n", ep);
        goto out;
    }
    uint64_t t0 = kvr_bench_now_ns(), end = t0 + (uint64_t)(o->duration_s * 1e9);
    uint64_t blocks = 0, batches = 0, now = t0;
    while ((now = kvr_bench_now_ns()) < end) {
        pace(t0, blocks, o->rate_per_s);
        const uint8_t *b;
        size_t len;
        uint32_t nb, ne;
        uint64_t seq = g.seq;
        if (gen_batch(&g, e, false, &b, &len, &nb, &ne) != KVR_OK ||
            send_batch(sock, seq, b, len, false) != 0) {
            fprintf(stderr, "kvrouter bench events: publishing failed: %s\n",
                    zmq_strerror(zmq_errno()));
            goto out;
        }
        blocks += nb;
        batches++;
    }
    double secs = (double)(now - t0) / 1e9;
    kvr_bench_print_header(o, COLS, N_COLS);
    kvr_bench_row_t row;
    kvr_bench_row_init(&row, COLS, N_COLS);
    kvr_bench_set_str(&row, "bench", "events");
    kvr_bench_set_str(&row, "mode", "publish");
    kvr_bench_set_int(&row, "workers", 1);
    kvr_bench_set_num(&row, "blocks_per_batch", batches ? (double)blocks / (double)batches : NAN);
    kvr_bench_set_int(&row, "batches", (int64_t)batches);
    kvr_bench_set_int(&row, "blocks", (int64_t)blocks);
    kvr_bench_set_num(&row, "per_s", (double)blocks / secs);
    kvr_bench_set_num(&row, "batches_per_s", (double)batches / secs);
    kvr_bench_set_num(&row, "seconds", secs);
    kvr_bench_set_num(&row, "rate", o->rate_per_s > 0 ? o->rate_per_s : NAN);
    kvr_bench_print_row(o, &row);
    rc = 0;
    /* let the queued batches leave before the socket closes */
    int linger = 5000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
out:
    if (sock)
        zmq_close(sock);
    if (ctx)
        zmq_ctx_term(ctx);
    wgen_deinit(&g);
    kvr_kv_enc_free(e);
    return rc;
}

int kvr_bench_events(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_workers = {1, {4}};
    static const kvr_bench_list_t def_pairs = {1, {2000000}};
    const kvr_bench_list_t *workers = kvr_bench_pick(&o->workers, &def_workers);
    const kvr_bench_list_t *pairs = kvr_bench_pick(&o->pairs, &def_pairs);
    if (o->publish != NULL)
        return run_publish(o, pairs->v[0]);
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t i = 0; i < pairs->n; i++)
        for (size_t j = 0; j < workers->n; j++)
            if (run_local(o, (uint32_t)workers->v[j], pairs->v[i]) != 0)
                return 1;
    return 0;
}

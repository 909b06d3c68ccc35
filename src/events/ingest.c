/*
 * ingest.c: see ingest.h.
 *
 * Invariants: only the ingest thread touches the listener, the decoder and the index's write
 * side; `ranks` (its private per-rank counters) and `carry` likewise. Other threads see `snap`
 * (a copy under snap_mu) and hand over one command at a time (cmd_mu serialises callers;
 * mu + cv carry the command and its completion).
 * Cost per batch: decode O(bytes), convert O(tokens) (one XXH3 per block), apply O(blocks).
 *
 * What a loaded state file still owes (`carry`): a rank reloaded from the file is only
 * resumed until its engine's replay buffer confirms the cursor, and the live index holds it
 * only while the resume is pending (a failed resume drops it). So that a stop in that window
 * (a rolling restart during an engine outage) does not replace the file with less than it
 * held, each resumed rank stays in `carry` (its cursor and its index in the loaded file,
 * whose descriptor is kept open: the inode stays readable whatever replaces the path) until
 * the listener settles it, judged after every poll from the rank's counters:
 *   - confirmed (resumes went up): it leaves carry; from then on its live state is saved when
 *     exact, as any rank;
 *   - refused by an engine that answered (resumes_failed up, no replay timeout and no hold
 *     overflow: the engine restarted, or the batch left its buffer): stale, it leaves carry
 *     and the next save drops it (logged, counted in kvr_kv_resumes_failed_total);
 *   - not confirmed because the engine did not answer in time, or too many live batches
 *     arrived meanwhile: unconfirmed, it stays, logged once;
 *   - its worker or rank unsubscribed: it leaves carry (the operator removed it).
 * A save writes the exact ranks from the live index (also those whose engine connection is
 * lost at the stop: their state is whole up to their cursor), then every rank still in carry
 * that is not exact now, copied record for record from the loaded file (re-read at save and
 * checked again: size, trailer and checksum). Either way the next start resumes the rank from
 * that cursor, so the engine, not this router, decides whether it is still good: a stop
 * during an engine outage never throws a rank's warm state away. The descriptor is closed when
 * carry empties. Cost: one descriptor while anything is owed, one O(ranks) pass after a poll
 * while a resume is pending, and the loaded file's bytes in memory during a save that
 * carries ranks.
 */
#include "events/ingest.h"
#include "base/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "core/approx.h"
#include "events/state_file.h"
#include "wire/index_snapshot.h"

typedef struct rank_acc {
    kvr_worker_t w;
    uint64_t events_applied, events_rejected, blocks_stored, blocks_removed;
    uint64_t mismatches, out_of_range, eagle_mismatches;
    uint32_t engine_block_size;
    bool eagle;   /* the worker's eagle setting (its events should agree) */
    uint32_t block_size; /* its model's (the worker's block_size, else the router's) */
    bool error;   /* block size mismatch: until events of the right size apply again */
    bool dropped; /* its state was dropped while the stream went on: partial */
} rank_acc_t;

typedef enum cmd_kind {
    CMD_NONE = 0,
    CMD_SUBSCRIBE,
    CMD_REMOVE,
    CMD_DROP,
    CMD_DUMP,
    CMD_SAVE,
    CMD_LOAD,
    CMD_RECORD,
    CMD_FORGET,
    CMD_RESYNC,
} cmd_kind_t;

typedef struct cmd {
    cmd_kind_t kind;
    const kvr_worker_spec_t *spec;
    uint64_t worker_id;
    uint32_t dp_rank; /* REMOVE with one_rank */
    bool one_rank;
    kvr_dump_fn fn;
    void *ud;
    const char *path;  /* SAVE / LOAD: the file; NULL = memory (mem, mem_len) */
    uint8_t **mem;     /* SAVE to memory: malloc'd bytes handed over */
    const uint8_t *in; /* LOAD from memory */
    bool all;          /* LOAD: every rank's events, resumed or not */
    const uint64_t *lbh, *seq; /* RECORD: the decision's hashes (n pairs) */
    size_t n;
    uint64_t capacity; /* RECORD: the rank's cache in blocks, 0 = unknown */
    size_t *mem_len, in_len;
    kvr_ingest_snap_report_t *rep;
    char *err;
    size_t err_len;
    int rc;
    bool done;
} cmd_t;

typedef struct snap_rank {
    kvr_worker_t w;
    kvr_rank_status_t st;
} snap_rank_t;

/* A rank reloaded from the state file that the next save must not lose (see above). */
typedef enum carry_state {
    CARRY_PENDING = 0, /* resumed; its engine has not answered yet */
    CARRY_UNCONFIRMED, /* its engine did not answer in time: kept as the file had it */
} carry_state_t;

typedef struct carry_rank {
    kvr_snap_rank_t cur; /* its cursor in the loaded file */
    uint32_t file_rank;  /* its index in the loaded file's rank table */
    carry_state_t state;
    uint64_t resumes0, failed0, timeouts0, overflows0; /* the listener's counts at the resume */
} carry_rank_t;

typedef struct carry {
    int fd;        /* the loaded file; -1 once nothing is owed */
    uint64_t size; /* its size and last 16 bytes (event count, checksum) when loaded */
    uint8_t trailer[16];
    carry_rank_t *r;
    size_t n, n_pending;
    uint32_t stale;   /* settled: their engine refused the cursor (dropped) */
    uint32_t removed; /* settled: unsubscribed */
} carry_t;

struct kvr_ingest {
    kvr_index_t *ix;
    kvr_ingest_config_t cfg;
    kvr_zmq_listener_t *l;
    kvr_kv_events_t dec;
    rank_acc_t *ranks;
    size_t n_ranks;
    kvr_ingest_stats_t acc; /* events_applied etc.; the rest is filled at snapshot time */
    kvr_ratelimit_t rl_mismatch, rl_reject, rl_decode, rl_reset, rl_carry;
    kvr_approx_t *approx; /* recorded routing decisions; made by the first one */
    kvr_state_file_t *claim; /* the state file's lock, held until free */
    carry_t carry;           /* what the loaded state file still owes */

    pthread_t thread;
    bool started;
    atomic_bool stop; /* set by kvr_ingest_free on another thread */

    pthread_mutex_t cmd_mu, mu;
    pthread_cond_t cv;
    cmd_t *cmd;

    pthread_mutex_t snap_mu;
    snap_rank_t *snap;
    size_t n_snap;
    kvr_ingest_stats_t snap_stats;
};

/* ---- per-rank accounting (ingest thread) ---- */

static rank_acc_t *acc_find(kvr_ingest_t *g, kvr_worker_t w)
{
    for (size_t i = 0; i < g->n_ranks; i++)
        if (g->ranks[i].w.worker_id == w.worker_id && g->ranks[i].w.dp_rank == w.dp_rank)
            return &g->ranks[i];
    return NULL;
}

static void acc_reset(rank_acc_t *a)
{
    a->error = false;
    a->dropped = false;
    a->engine_block_size = 0;
}

/* ---- listener callbacks (ingest thread) ---- */

static void apply_one(kvr_ingest_t *g, rank_acc_t *a, const kvr_event_t *ev)
{
    int rc = kvr_index_apply(g->ix, ev);
    if (rc == KVR_OK) {
        g->acc.events_applied++;
        if (a != NULL) {
            a->events_applied++;
            a->blocks_stored += ev->kind == KVR_EV_STORED ? ev->n_blocks : 0;
            a->blocks_removed += ev->kind == KVR_EV_REMOVED ? ev->n_removed : 0;
        }
        return;
    }
    g->acc.events_rejected++;
    if (a != NULL)
        a->events_rejected++;
    kvr_log_limited(&g->rl_reject, KVR_LOG_WARN,
                    "worker %llu rank %u: event %llu rejected by the index: %s",
                    (unsigned long long)ev->worker.worker_id, ev->worker.dp_rank,
                    (unsigned long long)ev->event_id, kvr_strerror(rc));
}

/* Stored blocks windowed otherwise than the worker's registration says: applied as the engine
 * sent them, but requests (hashed by the registration) will not match them. */
static void eagle_mismatch(kvr_ingest_t *g, rank_acc_t *a, bool events_eagle)
{
    a->eagle_mismatches++;
    kvr_log_limited(&g->rl_mismatch, KVR_LOG_WARN,
                    "worker %llu rank %u: its KV events are%s Eagle (block hashes over %s), but "
                    "it is registered with eagle=%s: requests are hashed the registered way and "
                    "will not match its blocks (register it with eagle=%s)",
                    (unsigned long long)a->w.worker_id, a->w.dp_rank, events_eagle ? "" : " not",
                    events_eagle ? "block_size + 1 tokens" : "block_size tokens",
                    a->eagle ? "true" : "false", events_eagle ? "true" : "false");
}

static int on_batch(void *ud, const kvr_zmq_batch_t *b)
{
    kvr_ingest_t *g = ud;
    if (kvr_kv_events_decode(&g->dec, b->payload, b->len) != KVR_OK) {
        kvr_log_limited(&g->rl_decode, KVR_LOG_WARN, "worker %llu rank %u: batch %llu: %s",
                        (unsigned long long)b->worker_id, b->dp_rank,
                        (unsigned long long)b->seq, g->dec.err);
        return KVR_EPARSE;
    }
    rank_acc_t *a = acc_find(g, (kvr_worker_t){b->worker_id, b->dp_rank});
    /* a batch naming a rank this worker does not have: refused whole (its rank is unknown) */
    if (g->dec.has_dp_rank && acc_find(g, (kvr_worker_t){b->worker_id, g->dec.dp_rank}) == NULL) {
        g->acc.rank_out_of_range++;
        if (a != NULL)
            a->out_of_range++;
        kvr_log_limited(&g->rl_decode, KVR_LOG_WARN,
                        "worker %llu rank %u: batch %llu names dp_rank %u, which this worker "
                        "does not have: its %zu events refused",
                        (unsigned long long)b->worker_id, b->dp_rank,
                        (unsigned long long)b->seq, g->dec.dp_rank, g->dec.n_events);
        return KVR_OK;
    }
    kvr_kv_target_t t = {.worker = {b->worker_id, b->dp_rank},
                         .block_size = a != NULL ? a->block_size : g->cfg.block_size,
                         .event_id = b->seq};
    for (size_t i = 0; i < g->dec.n_events; i++) {
        kvr_event_t ev;
        int rc = kvr_kv_events_convert(&g->dec, i, &t, &ev);
        if (rc == 1) {
            if (a != NULL && a->error && ev.kind == KVR_EV_STORED)
                a->error = false; /* the right block size again; what was refused is lost */
            if (a != NULL && ev.kind == KVR_EV_STORED && g->dec.events[i].is_eagle != a->eagle)
                eagle_mismatch(g, a, g->dec.events[i].is_eagle);
            apply_one(g, a, &ev);
        } else if (rc == 0) {
            continue; /* ignored tag or remote event: counted by the decoder */
        } else if (rc == KVR_EMISMATCH) {
            g->acc.block_size_mismatch++;
            if (a != NULL) {
                a->mismatches++;
                a->error = true;
                a->dropped = true; /* the refused blocks are missing from now on */
                a->engine_block_size = g->dec.events[i].block_size;
            }
            kvr_log_limited(&g->rl_mismatch, KVR_LOG_ERROR,
                            "worker %llu rank %u: engine block size %u != its registered block "
                            "size %u: its events cannot be used (set --block-size, or the "
                            "worker's block_size=, to match)",
                            (unsigned long long)b->worker_id, b->dp_rank,
                            g->dec.events[i].block_size, t.block_size);
        } else {
            kvr_log_limited(&g->rl_decode, KVR_LOG_WARN, "worker %llu rank %u: batch %llu event %zu: %s",
                            (unsigned long long)b->worker_id, b->dp_rank,
                            (unsigned long long)b->seq, i,
                            g->dec.events[i].status != KVR_OK ? g->dec.events[i].err
                                                               : g->dec.conv_err);
        }
    }
    return KVR_OK;
}

static void on_reset(void *ud, uint64_t worker_id, uint32_t dp_rank, kvr_zmq_reset_reason_t why)
{
    kvr_ingest_t *g = ud;
    kvr_event_t ev = {.kind = KVR_EV_CLEARED, .worker = {worker_id, dp_rank}};
    (void)kvr_index_apply(g->ix, &ev);
    g->acc.resets++;
    rank_acc_t *a = acc_find(g, ev.worker);
    if (a != NULL)
        acc_reset(a);
    kvr_log_limited(&g->rl_reset, KVR_LOG_WARN, "worker %llu rank %u: state dropped: %s",
                    (unsigned long long)worker_id, dp_rank,
                    kvr_zmq_reset_reason_name(why));
}

/* ---- snapshots ---- */

static kvr_rank_state_t state_of(const rank_acc_t *a, const kvr_zmq_rank_info_t *zi, bool subscribed)
{
    if (!subscribed)
        return a->error ? KVR_RANK_ERROR : KVR_RANK_NO_EVENTS;
    if (zi->was_connected && !zi->connected)
        return KVR_RANK_UNREACHABLE;
    if (a->error)
        return KVR_RANK_ERROR;
    if (zi->recovering)
        return KVR_RANK_RECOVERING;
    switch (zi->state) {
    case KVR_ZMQ_EXACT:
        return a->dropped ? KVR_RANK_DEGRADED : KVR_RANK_EXACT;
    case KVR_ZMQ_DEGRADED:
        return KVR_RANK_DEGRADED;
    default:
        return KVR_RANK_NO_EVENTS;
    }
}

static void publish(kvr_ingest_t *g)
{
    pthread_mutex_lock(&g->snap_mu);
    if (g->n_ranks > 0 && g->snap != NULL) {
        for (size_t i = 0; i < g->n_ranks; i++) {
            const rank_acc_t *a = &g->ranks[i];
            kvr_zmq_rank_info_t zi = {0};
            bool sub = kvr_zmq_listener_rank(g->l, a->w.worker_id, a->w.dp_rank, &zi) == KVR_OK;
            kvr_rank_status_t *s = &g->snap[i].st;
            g->snap[i].w = a->w;
            *s = (kvr_rank_status_t){
                .state = state_of(a, &zi, sub),
                .started = zi.started,
                .last_seq = zi.last_seq,
                .batches = zi.batches,
                .replayed = zi.replayed,
                .gaps = zi.gaps,
                .gaps_lost = zi.gaps_lost,
                .restarts = zi.restarts,
                .undecodable = zi.undecodable,
                .duplicates = zi.duplicates,
                .events_applied = a->events_applied,
                .events_rejected = a->events_rejected,
                .blocks_stored = a->blocks_stored,
                .blocks_removed = a->blocks_removed,
                .block_size_mismatches = a->mismatches,
                .engine_block_size = a->engine_block_size,
                .index_blocks = kvr_index_worker_pairs(g->ix, a->w),
                .disconnects = zi.disconnects,
                .rank_out_of_range = a->out_of_range,
                .eagle_mismatches = a->eagle_mismatches,
            };
        }
    }
    g->n_snap = g->n_ranks;
    g->snap_stats = g->acc;
    kvr_zmq_listener_stats(g->l, &g->snap_stats.zmq);
    g->snap_stats.decode = g->dec.stats;
    kvr_index_stats(g->ix, &g->snap_stats.index);
    g->snap_stats.recorded_pairs = kvr_approx_size(g->approx);
    pthread_mutex_unlock(&g->snap_mu);
}

/* ---- warm restart (ingest thread) ---- */

static int rank_cmp(const void *a, const void *b)
{
    const kvr_snap_rank_t *x = a, *y = b;
    if (x->worker_id != y->worker_id)
        return x->worker_id < y->worker_id ? -1 : 1;
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

/* -- what a loaded state file still owes (see the top of this file) -- */

static void carry_free(carry_t *cy)
{
    if (cy->fd >= 0)
        close(cy->fd);
    free(cy->r);
    *cy = (carry_t){.fd = -1};
}

static void carry_remove(kvr_ingest_t *g, size_t i)
{
    carry_t *cy = &g->carry;
    if (cy->r[i].state == CARRY_PENDING)
        cy->n_pending--;
    cy->r[i] = cy->r[--cy->n];
    if (cy->n == 0 && cy->fd >= 0) { /* nothing owed any more: the loaded file can go */
        close(cy->fd);
        cy->fd = -1;
    }
}

/* A rank of the loaded file that was resumed (pending) or whose resume request could not be
 * sent (unconfirmed). */
static void carry_add(kvr_ingest_t *g, const kvr_snap_rank_t *k, uint32_t file_rank, bool resumed)
{
    carry_t *cy = &g->carry;
    kvr_zmq_rank_info_t zi = {0};
    (void)kvr_zmq_listener_rank(g->l, k->worker_id, k->dp_rank, &zi);
    cy->r[cy->n++] = (carry_rank_t){.cur = *k,
                                    .file_rank = file_rank,
                                    .state = resumed ? CARRY_PENDING : CARRY_UNCONFIRMED,
                                    .resumes0 = zi.resumes,
                                    .failed0 = zi.resumes_failed,
                                    .timeouts0 = zi.replay_timeouts,
                                    .overflows0 = zi.hold_overflows};
    if (resumed)
        cy->n_pending++;
    else
        kvr_log_limited(&g->rl_carry, KVR_LOG_WARN,
                        "worker %llu rank %u: the resume request could not be sent to its "
                        "replay socket; the state file keeps this rank's saved state (batch "
                        "%llu) for its engine to confirm at the next start",
                        (unsigned long long)k->worker_id, k->dp_rank,
                        (unsigned long long)k->last_seq);
}

/* Settles the pending ranks whose resume the listener has decided: after every poll while one
 * is pending (the counters are read right after the poll that moved them), and before a save. */
static void carry_judge(kvr_ingest_t *g)
{
    carry_t *cy = &g->carry;
    for (size_t i = 0; i < cy->n;) {
        const carry_rank_t *c = &cy->r[i];
        kvr_zmq_rank_info_t zi;
        if (c->state != CARRY_PENDING) {
            i++;
        } else if (kvr_zmq_listener_rank(g->l, c->cur.worker_id, c->cur.dp_rank, &zi) != KVR_OK) {
            cy->removed++; /* unsubscribed (carry_forget saw it first, normally) */
            carry_remove(g, i);
        } else if (zi.resumes > c->resumes0) {
            carry_remove(g, i); /* confirmed: its live state is the truth from now on */
        } else if (zi.resumes_failed <= c->failed0) {
            i++; /* its engine has not answered yet */
        } else if (zi.replay_timeouts > c->timeouts0 || zi.hold_overflows > c->overflows0) {
            cy->r[i].state = CARRY_UNCONFIRMED;
            cy->n_pending--;
            kvr_log_limited(&g->rl_carry, KVR_LOG_WARN,
                            "worker %llu rank %u: its engine did not confirm the saved state "
                            "in time (no replay answer, or too many live batches meanwhile); "
                            "the state file keeps this rank's saved state (batch %llu) for its "
                            "engine to confirm at the next start",
                            (unsigned long long)c->cur.worker_id, c->cur.dp_rank,
                            (unsigned long long)c->cur.last_seq);
            i++;
        } else {
            cy->stale++;
            kvr_log_limited(&g->rl_carry, KVR_LOG_INFO,
                            "worker %llu rank %u: its engine refused the saved state (it "
                            "restarted, or batch %llu left its replay buffer): the next save "
                            "leaves it out unless the rank is exact again by then",
                            (unsigned long long)c->cur.worker_id, c->cur.dp_rank,
                            (unsigned long long)c->cur.last_seq);
            carry_remove(g, i);
        }
    }
}

/* An unsubscribed worker (or one rank): what the file had for it is not kept. */
static void carry_forget(kvr_ingest_t *g, kvr_worker_t w, bool one_rank)
{
    for (size_t i = 0; i < g->carry.n;) {
        const kvr_snap_rank_t *k = &g->carry.r[i].cur;
        if (k->worker_id != w.worker_id || (one_rank && k->dp_rank != w.dp_rank)) {
            i++;
            continue;
        }
        kvr_log_limited(&g->rl_carry, KVR_LOG_INFO,
                        "worker %llu rank %u: removed before its engine confirmed its saved "
                        "state; the next save leaves it out",
                        (unsigned long long)k->worker_id, k->dp_rank);
        g->carry.removed++;
        carry_remove(g, i);
    }
}

/* The loaded file's bytes again (malloc'd into *buf), if it is still the file that was
 * loaded: same size, same trailer (event count and checksum); kvr_snap_open checks the rest. */
static int carry_read(kvr_ingest_t *g, uint8_t **buf, char *why, size_t why_len)
{
    carry_t *cy = &g->carry;
    struct stat st;
    if (fstat(cy->fd, &st) != 0 || (uint64_t)st.st_size != cy->size || cy->size > SIZE_MAX ||
        cy->size < sizeof cy->trailer) {
        snprintf(why, why_len, "it changed size on disk since it was loaded");
        return KVR_EIO;
    }
    uint8_t *b = malloc((size_t)cy->size);
    if (b == NULL) {
        snprintf(why, why_len, "no memory to read its %llu bytes", (unsigned long long)cy->size);
        return KVR_ENOMEM;
    }
    for (size_t got = 0; got < cy->size;) {
        ssize_t n = pread(cy->fd, b + got, (size_t)cy->size - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(why, why_len, "reading it again failed: %s",
                     n < 0 ? strerror(errno) : "it is shorter than when it was loaded");
            free(b);
            return KVR_EIO;
        }
        got += (size_t)n;
    }
    if (memcmp(b + cy->size - sizeof cy->trailer, cy->trailer, sizeof cy->trailer) != 0) {
        snprintf(why, why_len, "it was rewritten in place since it was loaded");
        free(b);
        return KVR_EIO;
    }
    *buf = b;
    return KVR_OK;
}

/* -- saving -- */

typedef struct save_ctx {
    kvr_ingest_t *g;
    kvr_snap_rank_t *ranks; /* the live ranks sorted by (worker, rank) (n), then the ranks
                               kept from the loaded file (n_kept) */
    uint32_t n, n_kept;
    kvr_snap_reader_t *old; /* the loaded file, for the kept ranks' events (NULL: none) */
    int64_t *old_map;       /* its rank index -> index in ranks, or -1 */
    kvr_snap_writer_t *w;
    FILE *f;
    kvr_ingest_snap_report_t *rep;
} save_ctx_t;

static int save_sink(void *ud, const void *bytes, size_t len)
{
    save_ctx_t *c = ud;
    c->rep->bytes += len;
    return fwrite(bytes, 1, len, c->f) == len ? 0 : KVR_EIO;
}

static int save_event(void *ud, const kvr_event_t *ev)
{
    save_ctx_t *c = ud;
    kvr_snap_rank_t key = {.worker_id = ev->worker.worker_id, .dp_rank = ev->worker.dp_rank};
    const kvr_snap_rank_t *r = bsearch(&key, c->ranks, c->n, sizeof key, rank_cmp);
    if (r == NULL)
        return 0; /* a rank not exact now: not saved */
    c->rep->events++;
    return kvr_snap_write_event(c->w, (uint32_t)(r - c->ranks), ev);
}

/* The ranks worth resuming (exact, started, not recovering) into c->ranks, allocated with room
 * for `extra` more. unreachable: also those exact but for their engine's connection being
 * lost now (the state file: the state they had is whole up to their cursor, and the next
 * start's resume asks the engine whether it still holds; a stop during an engine outage
 * must not throw it away). */
static int live_ranks(kvr_ingest_t *g, save_ctx_t *c, size_t extra, bool unreachable)
{
    c->ranks = calloc(g->n_ranks + extra + 1, sizeof *c->ranks);
    if (c->ranks == NULL)
        return KVR_ENOMEM;
    c->n = 0;
    c->rep->ranks_skipped = 0;
    for (size_t i = 0; i < g->n_ranks; i++) {
        const rank_acc_t *a = &g->ranks[i];
        kvr_zmq_rank_info_t zi = {0};
        bool sub = kvr_zmq_listener_rank(g->l, a->w.worker_id, a->w.dp_rank, &zi) == KVR_OK;
        kvr_rank_state_t st = state_of(a, &zi, sub);
        bool away = st == KVR_RANK_UNREACHABLE && unreachable && !a->error && !a->dropped &&
                    !zi.recovering && zi.state == KVR_ZMQ_EXACT;
        if ((st != KVR_RANK_EXACT && !away) || !zi.started) {
            c->rep->ranks_skipped++;
            continue;
        }
        c->rep->ranks_unreachable += away;
        c->ranks[c->n++] = (kvr_snap_rank_t){.worker_id = a->w.worker_id,
                                             .dp_rank = a->w.dp_rank,
                                             .last_seq = zi.last_seq,
                                             .last_hash = zi.last_hash};
    }
    qsort(c->ranks, c->n, sizeof *c->ranks, rank_cmp);
    return KVR_OK;
}

/* The snapshot of c's ranks into c->f: the live ones from the index, the kept ones from the
 * loaded file. */
static int write_snapshot(save_ctx_t *c)
{
    int rc = KVR_EIO;
    c->rep->ranks = c->n;
    c->rep->ranks_kept = c->n_kept;
    c->w = kvr_snap_writer_new(save_sink, c, c->g->cfg.block_size, (kvr_wall_ns() / 1000000u), c->ranks,
                               c->n + c->n_kept, &rc);
    if (c->w != NULL && (rc = kvr_index_dump(c->g->ix, save_event, c)) == KVR_OK &&
        c->old != NULL) {
        uint32_t fr;
        kvr_event_t ev;
        while (rc == KVR_OK && kvr_snap_next(c->old, &fr, &ev) == KVR_OK) {
            if (c->old_map[fr] < 0)
                continue;
            c->rep->events++;
            rc = kvr_snap_write_event(c->w, (uint32_t)c->old_map[fr], &ev);
        }
    }
    if (rc == KVR_OK)
        rc = kvr_snap_writer_finish(c->w);
    kvr_snap_writer_free(c->w);
    c->w = NULL;
    return rc;
}

static int save_write(void *ud, FILE *f)
{
    save_ctx_t *c = ud;
    c->f = f;
    return write_snapshot(c);
}

/* Picks the ranks the loaded file still owes that are not exact now (c->ranks[n..]) and opens
 * the loaded file again for their events. A file that cannot be read back is logged: those
 * ranks are lost (rep->ranks_lost). */
static void keep_owed(kvr_ingest_t *g, save_ctx_t *c, const char *path, uint8_t **old_bytes,
                      kvr_snap_reader_t *rd)
{
    carry_t *cy = &g->carry;
    uint32_t owed = 0;
    for (size_t i = 0; i < cy->n; i++)
        owed += bsearch(&cy->r[i].cur, c->ranks, c->n, sizeof *c->ranks, rank_cmp) == NULL;
    if (owed == 0)
        return;
    char why[300] = "";
    int rc = carry_read(g, old_bytes, why, sizeof why);
    if (rc == KVR_OK)
        rc = kvr_snap_open(rd, *old_bytes, (size_t)cy->size, why, sizeof why);
    if (rc == KVR_OK &&
        (c->old_map = malloc(((size_t)rd->info.n_ranks + 1) * sizeof *c->old_map)) == NULL) {
        snprintf(why, sizeof why, "out of memory");
        kvr_snap_close(rd);
        rc = KVR_ENOMEM;
    }
    if (rc != KVR_OK) {
        kvr_log(KVR_LOG_ERROR,
                "state_file %s: the file loaded at start cannot be read back (%s): the saved "
                "state of %u ranks their engines have not confirmed is not kept",
                path, why, owed);
        c->rep->ranks_lost = owed;
        free(*old_bytes);
        *old_bytes = NULL;
        return;
    }
    for (uint32_t i = 0; i < rd->info.n_ranks; i++)
        c->old_map[i] = -1;
    for (size_t i = 0; i < cy->n; i++) {
        const carry_rank_t *e = &cy->r[i];
        if (e->file_rank >= rd->info.n_ranks ||
            bsearch(&e->cur, c->ranks, c->n, sizeof *c->ranks, rank_cmp) != NULL)
            continue; /* exact now: its live state is saved */
        c->old_map[e->file_rank] = (int64_t)(c->n + c->n_kept);
        c->ranks[c->n + c->n_kept++] = e->cur;
    }
    c->old = rd;
}

static int snap_save(kvr_ingest_t *g, const char *path, kvr_ingest_snap_report_t *rep, char *err,
                     size_t err_len)
{
    carry_judge(g);
    save_ctx_t c = {.g = g, .rep = rep};
    int rc = live_ranks(g, &c, g->carry.n, true);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "state_file: %s not written: %s", path, kvr_strerror(rc));
        return rc;
    }
    uint8_t *old_bytes = NULL;
    kvr_snap_reader_t rd;
    keep_owed(g, &c, path, &old_bytes, &rd);
    /* counted there as not exact */
    rep->ranks_skipped = rep->ranks_skipped > c.n_kept ? rep->ranks_skipped - c.n_kept : 0;
    rep->ranks_stale = g->carry.stale;
    rc = kvr_state_file_replace(path, save_write, &c, err, err_len);
    if (c.old != NULL)
        kvr_snap_close(&rd);
    free(c.old_map);
    free(old_bytes);
    free(c.ranks);
    return rc;
}

/* The snapshot into memory (a peer replica asks for it: GET /v1/index/snapshot): the exact
 * ranks only (a rank its engine has not confirmed is not the peer's to resume). */
static int snap_save_mem(kvr_ingest_t *g, uint8_t **out, size_t *out_len,
                         kvr_ingest_snap_report_t *rep, char *err, size_t err_len)
{
    char *buf = NULL;
    size_t len = 0;
    save_ctx_t c = {.g = g, .rep = rep};
    int rc = live_ranks(g, &c, 0, false);
    if (rc == KVR_OK && (c.f = open_memstream(&buf, &len)) == NULL)
        rc = KVR_ENOMEM;
    if (rc == KVR_OK) {
        rc = write_snapshot(&c);
        if (fclose(c.f) != 0 && rc == KVR_OK)
            rc = KVR_ENOMEM;
    }
    free(c.ranks);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "index snapshot: %s", kvr_strerror(rc));
        free(buf);
        return rc;
    }
    *out = (uint8_t *)buf;
    *out_len = len;
    return KVR_OK;
}

/* -- loading -- */

/* Resumes the ranks of the file that are subscribed now (keep[i]), then applies their
 * events: nothing is applied for a rank whose cursor the listener refused.
 * all: every rank's events are applied (a standalone indexer recovering from a peer, as the
 * reference's dump is), a rank resumed where it can be; else only the resumed ranks'.
 * carry: the ranks resumed (or whose resume request could not be sent) go into g->carry. */
static void snap_apply(kvr_ingest_t *g, kvr_snap_reader_t *r, bool all, bool carry,
                       kvr_ingest_snap_report_t *rep)
{
    bool *keep = calloc(r->info.n_ranks + 1, sizeof *keep);
    if (keep == NULL)
        return;
    if (carry && (g->carry.r = calloc(r->info.n_ranks + 1, sizeof *g->carry.r)) == NULL)
        kvr_log(KVR_LOG_WARN, "state_file: no memory to track the resumed ranks: a stop "
                              "before their engines confirm them will not keep them");
    for (uint32_t i = 0; i < r->info.n_ranks; i++) {
        kvr_snap_rank_t k;
        kvr_snap_rank(r, i, &k);
        kvr_worker_t w = {k.worker_id, k.dp_rank};
        int rc = acc_find(g, w) == NULL ? KVR_ENOTFOUND
                                        : kvr_zmq_listener_resume(g->l, k.worker_id, k.dp_rank,
                                                                  k.last_seq, k.last_hash);
        keep[i] = rc == KVR_OK;
        if (keep[i])
            rep->ranks++;
        else
            rep->ranks_skipped++;
        if (carry && g->carry.r != NULL && (rc == KVR_OK || rc == KVR_EIO))
            carry_add(g, &k, i, rc == KVR_OK);
    }
    uint32_t rank;
    kvr_event_t ev;
    while (kvr_snap_next(r, &rank, &ev) == KVR_OK) {
        if (!keep[rank] && !all)
            continue;
        if (kvr_index_apply(g->ix, &ev) == KVR_OK)
            rep->events++;
        else
            rep->events_failed++;
    }
    free(keep);
}

/* Checks and applies a snapshot's bytes; what names them in messages is label. */
static int load_bytes(kvr_ingest_t *g, const uint8_t *buf, size_t len, const char *label, bool all,
                      bool carry, kvr_ingest_snap_report_t *rep, char *err, size_t err_len)
{
    rep->bytes = len;
    kvr_snap_reader_t r;
    char why[200];
    int rc = kvr_snap_open(&r, buf, len, why, sizeof why);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "%s: %s", label, why);
    } else if (r.info.block_size != g->cfg.block_size) {
        snprintf(err, err_len, "%s was saved with block size %u, the router uses %u", label,
                 r.info.block_size, g->cfg.block_size);
        rc = KVR_EMISMATCH;
    } else {
        snap_apply(g, &r, all, carry, rep);
    }
    kvr_snap_close(&r);
    return rc;
}

static int snap_load(kvr_ingest_t *g, const char *path, kvr_ingest_snap_report_t *rep,
                     char *err, size_t err_len)
{
    int fd = -1;
    uint64_t size = 0;
    int rc = kvr_state_file_open_read(path, &fd, &size, err, err_len);
    if (rc != KVR_OK)
        return rc;
    void *m = MAP_FAILED;
    if (size == 0 || size > SIZE_MAX) {
        snprintf(err, err_len, "state_file: %s is empty", path);
        rc = KVR_EIO;
    } else if ((m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
        snprintf(err, err_len, "state_file: cannot map %s: %s", path, strerror(errno));
        rc = KVR_EIO;
    }
    if (rc != KVR_OK) {
        close(fd);
        return rc;
    }
    carry_free(&g->carry); /* a new load owes only its own ranks */
    char label[600];
    snprintf(label, sizeof label, "state_file: %s", path);
    rc = load_bytes(g, m, (size_t)size, label, false, true, rep, err, err_len);
    if (rc == KVR_OK && g->carry.n > 0) {
        g->carry.fd = fd; /* read again by a save that keeps ranks of it */
        g->carry.size = size;
        memcpy(g->carry.trailer, (const uint8_t *)m + size - sizeof g->carry.trailer,
               sizeof g->carry.trailer);
    } else {
        close(fd);
    }
    munmap(m, (size_t)size);
    return rc;
}

/* ---- commands (ingest thread) ---- */

static int do_subscribe(kvr_ingest_t *g, const kvr_worker_spec_t *w, char *err, size_t err_len)
{
    if (w->events[0] == '\0')
        return KVR_OK; /* no KV events from this worker */
    if (g->n_ranks + w->dp_size > g->cfg.max_ranks) {
        snprintf(err, err_len, "more than %zu event sources", g->cfg.max_ranks);
        return KVR_EFULL;
    }
    for (uint32_t d = 0; d < w->dp_size; d++) {
        /* vLLM and SGLang give rank r the base port + r, for PUB and replay alike */
        char ev[KVR_ADDR_BYTES + 16], rp[KVR_ADDR_BYTES + 16];
        int rc = kvr_ingest_rank_address(w->events, d, ev, sizeof ev);
        if (rc == KVR_OK && w->replay[0] != '\0')
            rc = kvr_ingest_rank_address(w->replay, d, rp, sizeof rp);
        if (rc != KVR_OK) {
            snprintf(err, err_len, "events: cannot derive the address of rank %u from '%s'", d,
                     w->events);
            return rc;
        }
        kvr_zmq_endpoint_t ep = {.worker_id = w->worker_id,
                                 .dp_rank = w->dp_start + d,
                                 .events = ev,
                                 .replay = w->replay[0] ? rp : NULL};
        rc = kvr_zmq_listener_add(g->l, &ep, err, err_len);
        if (rc != KVR_OK) {
            for (uint32_t k = 0; k < d; k++)
                (void)kvr_zmq_listener_remove(g->l, w->worker_id, w->dp_start + k);
            return rc;
        }
    }
    for (uint32_t d = 0; d < w->dp_size; d++) {
        kvr_worker_t rw = {w->worker_id, w->dp_start + d};
        if (g->approx != NULL) /* its events are the truth from now on */
            (void)kvr_approx_remove_rank(g->approx, rw);
        rank_acc_t *a = &g->ranks[g->n_ranks++];
        memset(a, 0, sizeof *a);
        a->w = (kvr_worker_t){w->worker_id, w->dp_start + d};
        a->eagle = w->eagle;
        a->block_size = w->block_size ? w->block_size : g->cfg.block_size;
    }
    return KVR_OK;
}

/* Drops the index state of a worker's ranks (one rank when one_rank), unsubscribing them or
 * keeping them subscribed (marked dropped). */
static void do_remove(kvr_ingest_t *g, kvr_worker_t w, bool one_rank, bool unsubscribe)
{
    if (g->approx != NULL && one_rank)
        (void)kvr_approx_remove_rank(g->approx, w);
    else if (g->approx != NULL)
        (void)kvr_approx_remove_worker(g->approx, w.worker_id);
    if (one_rank)
        (void)kvr_index_remove_rank(g->ix, w);
    else
        (void)kvr_index_remove_worker(g->ix, w.worker_id);
    if (unsubscribe)
        carry_forget(g, w, one_rank);
    for (size_t i = 0; i < g->n_ranks;) {
        rank_acc_t *a = &g->ranks[i];
        if (a->w.worker_id != w.worker_id || (one_rank && a->w.dp_rank != w.dp_rank)) {
            i++;
            continue;
        }
        if (!unsubscribe) {
            acc_reset(a);
            a->dropped = true;
            i++;
            continue;
        }
        (void)kvr_zmq_listener_remove(g->l, a->w.worker_id, a->w.dp_rank);
        *a = g->ranks[--g->n_ranks];
    }
}

/* A routing decision, recorded as if the worker had stored the blocks (approximate mode). */
static int do_record(kvr_ingest_t *g, const cmd_t *c)
{
    kvr_worker_t w = {c->worker_id, c->dp_rank};
    if (acc_find(g, w) != NULL) {
        g->acc.records_refused++;
        return KVR_EEXIST; /* its engine's events say what it holds */
    }
    if (g->approx == NULL) {
        kvr_index_stats_t st;
        kvr_index_stats(g->ix, &st);
        kvr_approx_config_t ac = {.ttl_ms = g->cfg.approx_ttl_ms, .max_tree_size = st.max_pairs};
        int rc;
        if ((g->approx = kvr_approx_new(g->ix, &ac, &rc)) == NULL)
            return rc;
    }
    int rc = KVR_OK;
    if (c->capacity > 0) /* the router knows the rank's cache size: model it, not a TTL alone */
        rc = kvr_approx_set_capacity(g->approx, w, c->capacity);
    if (rc == KVR_OK)
        rc = kvr_approx_record(g->approx, w, c->lbh, c->seq, c->n, kvr_now_ms());
    if (rc == KVR_OK)
        g->acc.records++;
    return rc;
}

/* Drops the recorded decisions of a worker (one rank, or all): KVR_ENOTFOUND when it had
 * none (its event-fed state is untouched). */
static int do_forget(kvr_ingest_t *g, const cmd_t *c)
{
    if (g->approx == NULL)
        return KVR_ENOTFOUND;
    for (size_t i = 0; i < g->n_ranks; i++) /* a subscribed rank is not a recorded one */
        if (g->ranks[i].w.worker_id == c->worker_id &&
            (!c->one_rank || g->ranks[i].w.dp_rank == c->dp_rank))
            return KVR_ENOTFOUND;
    size_t before = kvr_approx_size(g->approx);
    if (c->one_rank)
        (void)kvr_approx_remove_rank(g->approx, (kvr_worker_t){c->worker_id, c->dp_rank});
    else
        (void)kvr_approx_remove_worker(g->approx, c->worker_id);
    return kvr_approx_size(g->approx) < before ? KVR_OK : KVR_ENOTFOUND;
}

/* Rebuilds a rank from its engine's replay buffer; without a replay socket its state is only
 * dropped (it stays subscribed, degraded, and learns again from the next events). */
static int do_resync(kvr_ingest_t *g, kvr_worker_t w)
{
    rank_acc_t *a = acc_find(g, w);
    if (a == NULL)
        return KVR_ENOTFOUND;
    int rc = kvr_zmq_listener_resync(g->l, w.worker_id, w.dp_rank);
    if (rc == KVR_EINVAL) {
        (void)kvr_index_remove_rank(g->ix, w);
        acc_reset(a);
        a->dropped = true;
        g->acc.resets++;
    }
    return rc;
}

static void run_cmd(kvr_ingest_t *g)
{
    pthread_mutex_lock(&g->mu);
    cmd_t *c = g->cmd;
    pthread_mutex_unlock(&g->mu);
    if (c == NULL)
        return;
    switch (c->kind) {
    case CMD_SUBSCRIBE:
        c->rc = do_subscribe(g, c->spec, c->err, c->err_len);
        break;
    case CMD_REMOVE:
        do_remove(g, (kvr_worker_t){c->worker_id, c->dp_rank}, c->one_rank, true);
        c->rc = KVR_OK;
        break;
    case CMD_DROP:
        do_remove(g, (kvr_worker_t){c->worker_id, 0}, false, false);
        c->rc = KVR_OK;
        break;
    case CMD_DUMP:
        c->rc = kvr_index_dump(g->ix, c->fn, c->ud);
        break;
    case CMD_RECORD:
        c->rc = do_record(g, c);
        break;
    case CMD_FORGET:
        c->rc = do_forget(g, c);
        break;
    case CMD_RESYNC:
        c->rc = do_resync(g, (kvr_worker_t){c->worker_id, c->dp_rank});
        break;
    case CMD_SAVE:
        c->rc = c->path != NULL ? snap_save(g, c->path, c->rep, c->err, c->err_len)
                                : snap_save_mem(g, c->mem, c->mem_len, c->rep, c->err,
                                                c->err_len);
        break;
    case CMD_LOAD:
        c->rc = c->path != NULL ? snap_load(g, c->path, c->rep, c->err, c->err_len)
                                : load_bytes(g, c->in, c->in_len, "peer index snapshot", c->all,
                                             false, c->rep, c->err, c->err_len);
        break;
    default:
        c->rc = KVR_EINVAL;
        break;
    }
    publish(g);
    pthread_mutex_lock(&g->mu);
    c->done = true;
    g->cmd = NULL;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void *ingest_main(void *arg)
{
    kvr_ingest_t *g = arg;
    uint64_t last_pub = 0, last_reclaim = 0, last_resets = 0;
    kvr_zmq_stats_t last_zs = {0};
    while (!atomic_load_explicit(&g->stop, memory_order_acquire)) {
        run_cmd(g);
        (void)kvr_zmq_listener_poll(g->l, 10);
        if (g->carry.n_pending > 0)
            carry_judge(g); /* right after the poll that may have decided a resume */
        uint64_t now = kvr_now_ms();
        kvr_zmq_stats_t zs;
        kvr_zmq_listener_stats(g->l, &zs);
        /* The snapshot is republished after every poll that changed anything (a batch applied
         * or dropped, a gap, a recovery starting or ending, a reset), so a state read on
         * another thread is never older than the index it describes: /v1/workers cannot say
         * "recovering" while /v1/query already answers from the recovered index. Idle, it
         * is refreshed every 100 ms (index evictions, reclaim). */
        bool changed = memcmp(&zs, &last_zs, sizeof zs) != 0 || g->acc.resets != last_resets;
        if (changed || now - last_pub >= 100) {
            publish(g);
            last_pub = now;
            last_zs = zs;
            last_resets = g->acc.resets;
        }
        if (g->approx != NULL && kvr_approx_next_expiry(g->approx) <= now)
            (void)kvr_approx_expire(g->approx, now);
        if (now - last_reclaim >= 1000) {
            kvr_index_reclaim(g->ix);
            last_reclaim = now;
        }
    }
    run_cmd(g); /* never leave a caller waiting */
    return NULL;
}

/* Sends a command and waits until the ingest thread has carried it out. */
static int send_cmd(kvr_ingest_t *g, cmd_t *c)
{
    if (!g->started) {
        /* before start (or in tests without a thread) the caller's thread runs it */
        g->cmd = c;
        run_cmd(g);
        return c->rc;
    }
    pthread_mutex_lock(&g->cmd_mu);
    pthread_mutex_lock(&g->mu);
    g->cmd = c;
    kvr_zmq_listener_wake(g->l); /* not a poll's timeout later */
    while (!c->done)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_unlock(&g->cmd_mu);
    return c->rc;
}

/* ---- public ---- */

int kvr_ingest_rank_address(const char *base, uint32_t offset, char *out, size_t cap)
{
    if (offset == 0 || strncmp(base, "tcp://", 6) != 0) {
        if (offset != 0 && (strncmp(base, "ipc://", 6) == 0 || strncmp(base, "inproc://", 9) == 0)) {
            int n = snprintf(out, cap, "%s_dp%u", base, offset);
            return n > 0 && (size_t)n < cap ? KVR_OK : KVR_ETOOBIG;
        }
        int n = snprintf(out, cap, "%s", base);
        return offset == 0 && n > 0 && (size_t)n < cap ? KVR_OK : KVR_EINVAL;
    }
    const char *colon = strrchr(base, ':');
    char *end;
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (colon == NULL || colon < base + 6 || *end != '\0' || port == 0 || port + offset > 65535)
        return KVR_EINVAL;
    int n = snprintf(out, cap, "%.*s:%lu", (int)(colon - base), base, port + offset);
    return n > 0 && (size_t)n < cap ? KVR_OK : KVR_ETOOBIG;
}

kvr_ingest_t *kvr_ingest_new(kvr_index_t *ix, const kvr_ingest_config_t *cfg, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    kvr_ingest_t *g = calloc(1, sizeof *g);
    if (g == NULL || ix == NULL || cfg == NULL || cfg->block_size == 0) {
        free(g);
        *status = g == NULL ? KVR_ENOMEM : KVR_EINVAL;
        return NULL;
    }
    g->ix = ix;
    g->cfg = *cfg;
    g->carry.fd = -1;
    if (g->cfg.max_ranks == 0)
        g->cfg.max_ranks = 1024;
    g->rl_mismatch = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);
    g->rl_reject = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    g->rl_decode = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    g->rl_reset = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    g->rl_carry = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 10);
    kvr_kv_events_init(&g->dec);
    kvr_zmq_config_t zc = {.replay_timeout_ms = cfg->replay_timeout_ms, .max_ranks = g->cfg.max_ranks};
    kvr_zmq_handlers_t h = {.on_batch = on_batch, .on_reset = on_reset, .ud = g};
    g->l = kvr_zmq_listener_new(&zc, &h, status);
    g->ranks = calloc(g->cfg.max_ranks, sizeof *g->ranks);
    g->snap = calloc(g->cfg.max_ranks, sizeof *g->snap);
    if (g->l == NULL || g->ranks == NULL || g->snap == NULL) {
        kvr_ingest_free(g);
        *status = KVR_ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&g->cmd_mu, NULL);
    pthread_mutex_init(&g->mu, NULL);
    pthread_mutex_init(&g->snap_mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *status = KVR_OK;
    return g;
}

int kvr_ingest_start(kvr_ingest_t *g)
{
    if (g->started)
        return KVR_OK;
    publish(g); /* what was applied before the start (a state file, a peer) shows at once */
    if (pthread_create(&g->thread, NULL, ingest_main, g) != 0)
        return KVR_ENOMEM;
    g->started = true;
    return KVR_OK;
}

void kvr_ingest_free(kvr_ingest_t *g)
{
    if (g == NULL)
        return;
    if (g->started) {
        atomic_store_explicit(&g->stop, true, memory_order_release);
        pthread_join(g->thread, NULL);
        g->started = false;
    }
    if (g->l != NULL) {
        kvr_zmq_listener_free(g->l);
        pthread_mutex_destroy(&g->cmd_mu);
        pthread_mutex_destroy(&g->mu);
        pthread_mutex_destroy(&g->snap_mu);
        pthread_cond_destroy(&g->cv);
    }
    kvr_kv_events_deinit(&g->dec);
    kvr_approx_free(g->approx);
    carry_free(&g->carry);
    kvr_state_file_release(g->claim); /* the lock goes last: the caller saved before */
    free(g->ranks);
    free(g->snap);
    free(g);
}

int kvr_ingest_subscribe(kvr_ingest_t *g, const kvr_worker_spec_t *w, char *err, size_t err_len)
{
    char dummy[8];
    cmd_t c = {.kind = CMD_SUBSCRIBE, .spec = w, .err = err ? err : dummy,
               .err_len = err ? err_len : sizeof dummy};
    return send_cmd(g, &c);
}

int kvr_ingest_remove_worker(kvr_ingest_t *g, uint64_t worker_id)
{
    cmd_t c = {.kind = CMD_REMOVE, .worker_id = worker_id};
    return send_cmd(g, &c);
}

int kvr_ingest_remove_rank(kvr_ingest_t *g, kvr_worker_t w)
{
    cmd_t c = {.kind = CMD_REMOVE, .worker_id = w.worker_id, .dp_rank = w.dp_rank,
               .one_rank = true};
    return send_cmd(g, &c);
}

int kvr_ingest_drop_state(kvr_ingest_t *g, uint64_t worker_id)
{
    cmd_t c = {.kind = CMD_DROP, .worker_id = worker_id};
    return send_cmd(g, &c);
}

int kvr_ingest_record(kvr_ingest_t *g, kvr_worker_t w, const uint64_t *lbh, const uint64_t *seq,
                      size_t n, uint64_t capacity)
{
    if (n == 0 || lbh == NULL || seq == NULL)
        return KVR_EINVAL;
    cmd_t c = {.kind = CMD_RECORD,
               .worker_id = w.worker_id,
               .dp_rank = w.dp_rank,
               .lbh = lbh,
               .seq = seq,
               .n = n,
               .capacity = capacity};
    return send_cmd(g, &c);
}

int kvr_ingest_forget(kvr_ingest_t *g, uint64_t worker_id, bool one_rank, uint32_t dp_rank)
{
    cmd_t c = {
        .kind = CMD_FORGET, .worker_id = worker_id, .dp_rank = dp_rank, .one_rank = one_rank};
    return send_cmd(g, &c);
}

int kvr_ingest_resync(kvr_ingest_t *g, kvr_worker_t w)
{
    cmd_t c = {.kind = CMD_RESYNC, .worker_id = w.worker_id, .dp_rank = w.dp_rank};
    return send_cmd(g, &c);
}

int kvr_ingest_dump(kvr_ingest_t *g, kvr_dump_fn fn, void *ud)
{
    cmd_t c = {.kind = CMD_DUMP, .fn = fn, .ud = ud};
    return send_cmd(g, &c);
}

static int snap_cmd(kvr_ingest_t *g, cmd_t *c, kvr_ingest_snap_report_t *rep, char *err,
                    size_t err_len)
{
    char dummy[8];
    kvr_ingest_snap_report_t r0;
    c->rep = rep ? rep : &r0;
    c->err = err ? err : dummy;
    c->err_len = err ? err_len : sizeof dummy;
    memset(c->rep, 0, sizeof *c->rep);
    return send_cmd(g, c);
}

int kvr_ingest_claim_state_file(kvr_ingest_t *g, const char *path, char *err, size_t err_len)
{
    if (g->started || g->claim != NULL) {
        snprintf(err, err_len, "state_file: claimed after the start, or twice");
        return KVR_EINVAL;
    }
    unsigned removed = 0;
    int rc = kvr_state_file_claim(path, &g->claim, &removed, err, err_len);
    if (rc == KVR_OK && removed > 0)
        kvr_log(KVR_LOG_INFO,
                "state_file %s: removed %u temporary files an interrupted save "
                "left",
                path, removed);
    return rc;
}

int kvr_ingest_save(kvr_ingest_t *g, const char *path, kvr_ingest_snap_report_t *rep,
                    char *err, size_t err_len)
{
    cmd_t c = {.kind = CMD_SAVE, .path = path};
    return snap_cmd(g, &c, rep, err, err_len);
}

int kvr_ingest_load(kvr_ingest_t *g, const char *path, kvr_ingest_snap_report_t *rep,
                    char *err, size_t err_len)
{
    cmd_t c = {.kind = CMD_LOAD, .path = path};
    return snap_cmd(g, &c, rep, err, err_len);
}

int kvr_ingest_save_mem(kvr_ingest_t *g, uint8_t **buf, size_t *len,
                        kvr_ingest_snap_report_t *rep, char *err, size_t err_len)
{
    cmd_t c = {.kind = CMD_SAVE, .mem = buf, .mem_len = len};
    return snap_cmd(g, &c, rep, err, err_len);
}

int kvr_ingest_load_mem(kvr_ingest_t *g, const uint8_t *buf, size_t len,
                        kvr_ingest_snap_report_t *rep, char *err, size_t err_len)
{
    cmd_t c = {.kind = CMD_LOAD, .in = buf, .in_len = len};
    return snap_cmd(g, &c, rep, err, err_len);
}

int kvr_ingest_load_all_mem(kvr_ingest_t *g, const uint8_t *buf, size_t len,
                            kvr_ingest_snap_report_t *rep, char *err, size_t err_len)
{
    cmd_t c = {.kind = CMD_LOAD, .in = buf, .in_len = len, .all = true};
    return snap_cmd(g, &c, rep, err, err_len);
}

int kvr_ingest_rank_status(kvr_ingest_t *g, kvr_worker_t w, kvr_rank_status_t *out)
{
    int rc = KVR_ENOTFOUND;
    pthread_mutex_lock(&g->snap_mu);
    for (size_t i = 0; i < g->n_snap; i++) {
        if (g->snap[i].w.worker_id == w.worker_id && g->snap[i].w.dp_rank == w.dp_rank) {
            *out = g->snap[i].st;
            rc = KVR_OK;
            break;
        }
    }
    pthread_mutex_unlock(&g->snap_mu);
    return rc;
}

void kvr_ingest_stats(kvr_ingest_t *g, kvr_ingest_stats_t *out)
{
    pthread_mutex_lock(&g->snap_mu);
    *out = g->snap_stats;
    pthread_mutex_unlock(&g->snap_mu);
}

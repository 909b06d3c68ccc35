/*
 * zmq_listener.h: subscribes to engines' KV-event publishers (ZeroMQ PUB, as vLLM and SGLang
 * publish: [topic, seq u64 big-endian, payload]) and hands every batch to the caller in
 * sequence order, filling gaps from the engine's replay socket (ROUTER; we use a DEALER)
 * before the batch that revealed them.
 *
 * What it decides, per worker rank (see kvr_zmq_state_t):
 *   - a gap the replay buffer still covers is replayed, then the live batch applied: exact;
 *   - a gap it no longer covers, no replay endpoint, a replay socket silent for
 *     replay_timeout_ms, a publisher restart (numbers went back), or a batch that stays
 *     undecodable after one replay: the caller is told to drop that rank's state (on_reset)
 *     and the rank is marked degraded until a publisher starts over from batch 0, which makes
 *     it exact again;
 *   - malformed messages (not 3 frames, seq not 8 bytes) are counted and skipped;
 *   - the last applied number arriving again is a duplicate if its bytes are the same, and a
 *     publisher restart (that has sent one batch so far) if they differ; an older number is a
 *     duplicate only if it is one of the last 64 replayed batches, bytes and all (a resume's
 *     or resync's answer can come before the SUB's copy of the same batches), and otherwise
 *     a restart;
 *   - a gap's replay starts one batch early, at the last batch applied, which must come back
 *     with the same bytes: other bytes mean a new process on the same address that has sent
 *     more batches than the old one (its numbers went forward, not back), so it is a restart
 *     and the rank is rebuilt from that publisher's batch 0.
 * Each SUB socket is watched by a ZeroMQ socket monitor: whether it is connected to its
 * publisher now (a killed engine shows at once as a lost connection) is in the rank info.
 * Everything dropped or doubtful is counted (kvr_zmq_stats_t, per-rank counters).
 *
 * Replay is asynchronous, per rank. A rank in recovery has the range it wants, a deadline
 * (now + replay_timeout_ms, pushed back by every replay message, so a long answer is not cut
 * while it flows) and a FIFO of copies of the live batches that arrived meanwhile, bounded by
 * max_held_batches and max_held_bytes. The answer is applied as it arrives; at its end marker
 * or deadline whatever it did not bring is given up, then the held batches go through the
 * live path in arrival order (they may reveal another gap: a new recovery). A hold that would
 * overflow gives the gap up at once (counted in hold_overflows). Other ranks are never
 * delayed: poll waits on every SUB and every recovering rank's DEALER together, with epoll
 * over their ZMQ_FDs (zmq_poll checks each socket with two syscalls on every wake-up: with
 * 64 ranks an idle listener made ~19,000 syscalls/s; epoll touches only the sockets that
 * signalled, and those a drain left readable).
 *
 * Threads: one thread owns a listener (the ingest thread): add, remove, poll and the stats
 * calls are made on it, and the handlers are called from poll on it (they must not call back
 * into the listener). poll never blocks longer than its timeout.
 * Memory: one SUB (and optional DEALER) socket per rank, and the SUB's monitor (a PAIR); zmq_msg_t buffers owned by libzmq;
 * and, only while a rank recovers, its held batches (one malloc per batch: seq + payload),
 * freed when they are applied, when the rank is removed, or by free.
 * Cost: per live batch one zmq_msg_recv per frame and one on_batch call (plus one copy while
 * its rank recovers); a replay costs one request plus the replayed batches.
 */
#ifndef KVR_ZMQ_LISTENER_H
#define KVR_ZMQ_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_zmq_batch {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t seq;
    const uint8_t *payload;
    size_t len;
    bool replayed; /* came from the replay socket */
} kvr_zmq_batch_t;

typedef enum kvr_zmq_reset_reason {
    KVR_RESET_RESTART = 0,   /* the publisher's numbers went back */
    KVR_RESET_GAP_LOST,      /* a gap the replay buffer no longer covers, or no replay socket */
    KVR_RESET_UNDECODABLE,   /* a batch still undecodable after a replay */
    KVR_RESET_RESUME_FAILED, /* a resumed cursor (kvr_zmq_listener_resume) could not be
                                confirmed: the publisher restarted, its buffer no longer holds
                                the batch, or its replay socket did not answer */
    KVR_RESET_REPLAY_TIMEOUT, /* the replay socket stayed silent for replay_timeout_ms */
    KVR_RESET_HOLD_FULL,      /* too many live batches arrived while a gap was replayed */
    KVR_RESET_RESYNC,         /* the caller asked for the rank to be rebuilt from its
                                 engine's replay buffer (kvr_zmq_listener_resync) */
} kvr_zmq_reset_reason_t;

/* "publisher restarted", "gap older than the replay buffer", ...: for logs. */
const char *kvr_zmq_reset_reason_name(kvr_zmq_reset_reason_t why);

typedef struct kvr_zmq_handlers {
    /* Applies one batch. Return 0, or KVR_EPARSE when the payload cannot be framed as a
     * batch at all (then it counts as a gap: it is replayed once before giving up). */
    int (*on_batch)(void *ud, const kvr_zmq_batch_t *b);
    /* Drop everything known about this rank (the index's Cleared for it). */
    void (*on_reset)(void *ud, uint64_t worker_id, uint32_t dp_rank, kvr_zmq_reset_reason_t why);
    void *ud;
} kvr_zmq_handlers_t;

typedef struct kvr_zmq_endpoint {
    uint64_t worker_id;
    uint32_t dp_rank;
    const char *events; /* PUB address, e.g. tcp://127.0.0.1:5557 (a '*' address is bound) */
    const char *replay; /* ROUTER address, or NULL */
} kvr_zmq_endpoint_t;

typedef enum kvr_zmq_state {
    KVR_ZMQ_NO_EVENTS = 0, /* nothing received yet */
    KVR_ZMQ_EXACT,         /* every batch since batch 0 applied in order */
    KVR_ZMQ_DEGRADED,      /* state was dropped; what is known is partial */
} kvr_zmq_state_t;

typedef struct kvr_zmq_rank_info {
    kvr_zmq_state_t state;
    bool started;
    bool recovering;       /* a replay request is outstanding; live batches are being held */
    uint64_t last_seq;
    uint64_t batches, replayed, gaps, gaps_lost, restarts, undecodable, duplicates;
    uint64_t replay_timeouts, hold_overflows;
    size_t held_batches;   /* live batches held now (0 unless recovering) */
    uint64_t last_hash;    /* XXH3-64 of batch last_seq's payload (a resume checks it) */
    bool resuming;         /* a resumed cursor waits for its confirmation (recovering too) */
    uint64_t resumes, resumes_failed;
    uint64_t resyncs;      /* rebuilds asked by the caller (kvr_zmq_listener_resync) */
    bool connected;        /* the events socket has a live connection to the publisher now */
    bool was_connected;    /* it had one once (so !connected means the publisher went away) */
    uint64_t disconnects;  /* connections to the publisher lost */
} kvr_zmq_rank_info_t;

typedef struct kvr_zmq_stats {
    uint64_t batches;       /* handed to on_batch (live and replayed) */
    uint64_t replayed;      /* of which from replay */
    uint64_t gaps;          /* gaps seen */
    uint64_t gaps_lost;     /* gaps the replay could not fill */
    uint64_t replay_timeouts;
    uint64_t restarts;
    uint64_t undecodable;   /* batches on_batch could not frame */
    uint64_t duplicates;    /* batches at or below the cursor, dropped */
    uint64_t bad_frames;    /* messages without 3 frames or an 8-byte seq */
    uint64_t hold_overflows;      /* recoveries given up because the hold was full */
    uint64_t replays_in_progress; /* gauge: ranks waiting for a replay answer */
    uint64_t held_batches;        /* gauge: live batches held by recovering ranks */
    uint64_t held_bytes;          /* gauge: their payload bytes */
    uint64_t resumes;             /* ranks resumed from a saved cursor and confirmed */
    uint64_t resumes_failed;      /* resumed cursors that could not be confirmed */
    uint64_t disconnects;         /* events connections lost (a publisher died or restarted) */
} kvr_zmq_stats_t;

typedef struct kvr_zmq_listener kvr_zmq_listener_t;

typedef struct kvr_zmq_config {
    int replay_timeout_ms;   /* silence from a replay socket before its gap is given up;
                                0 = 2000 */
    size_t max_ranks;        /* 0 = 1024 */
    size_t max_held_batches; /* live batches one recovering rank may hold; 0 = 4096 */
    size_t max_held_bytes;   /* their payload bytes; 0 = 64 MiB */
} kvr_zmq_config_t;

kvr_zmq_listener_t *kvr_zmq_listener_new(const kvr_zmq_config_t *cfg,
                                         const kvr_zmq_handlers_t *h, int *status);
void kvr_zmq_listener_free(kvr_zmq_listener_t *l);
/* KVR_EEXIST if the rank is already subscribed, KVR_EINVAL for a bad address (libzmq's
 * message in err), KVR_EFULL past max_ranks. */
int kvr_zmq_listener_add(kvr_zmq_listener_t *l, const kvr_zmq_endpoint_t *ep, char *err,
                         size_t err_len);
int kvr_zmq_listener_remove(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank);
/* Resumes a freshly added rank (nothing received yet) from a saved cursor: batch last_seq,
 * whose payload hashed to last_hash, was the last one applied to the state the caller has
 * reloaded for this rank. The rank shows exact and recovering at once, and a replay from
 * last_seq is requested: an answer that starts with that same batch (same number, same
 * bytes: the same publisher process) confirms the cursor, and the batches after it are
 * applied; anything else (another first batch, an answer with no batch, no answer within
 * replay_timeout_ms) fails the resume: on_reset(KVR_RESET_RESUME_FAILED) drops the reloaded
 * state and the rank goes on as a late joiner. Live batches that arrive meanwhile are held
 * and applied after it. KVR_ENOTFOUND (no such rank), KVR_EINVAL (no replay socket: a resume
 * cannot be confirmed), KVR_EBUSY (the rank has already received something), KVR_EIO (the
 * request could not be sent: the rank is reset). */
int kvr_zmq_listener_resume(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank,
                            uint64_t last_seq, uint64_t last_hash);
/* Rebuilds a rank from its engine's replay buffer: its state is dropped at once
 * (on_reset(KVR_RESET_RESYNC)) and a replay from batch 0 is requested (a publisher answers
 * from the oldest batch it keeps); the rank recovers as a gap does, live batches held
 * meanwhile, and is exact again if the buffer still starts at batch 0, degraded otherwise.
 * KVR_ENOTFOUND (no such rank), KVR_EINVAL (no replay socket: nothing to rebuild from; the
 * state is left as it is), KVR_EBUSY (a replay is already in progress), KVR_EIO (the request
 * could not be sent: the rank's state was dropped all the same). */
int kvr_zmq_listener_resync(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank);
/* Ends a poll that is waiting (or the next one) at once: any thread (the only call that is
 * not the owner thread's). */
void kvr_zmq_listener_wake(kvr_zmq_listener_t *l);

/* Waits up to timeout_ms (< 0: until something happens) for messages and handles all that
 * are ready, and gives up the replays whose deadline has passed (it wakes for them early).
 * Returns the number of batches handed over, or a negative status. */
int kvr_zmq_listener_poll(kvr_zmq_listener_t *l, int timeout_ms);
void kvr_zmq_listener_stats(const kvr_zmq_listener_t *l, kvr_zmq_stats_t *out);
int kvr_zmq_listener_rank(const kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank,
                          kvr_zmq_rank_info_t *out);
/* Checks the invariants (holds only while recovering, within their bounds, gauges equal to
 * the per-rank sums). KVR_OK, or KVR_EINVAL with the broken invariant in msg. */
int kvr_zmq_listener_verify(const kvr_zmq_listener_t *l, char *msg, size_t msg_len);

#endif

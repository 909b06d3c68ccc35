/*
 * zmq_listener.h: subscribes to engines' KV-event publishers (ZeroMQ PUB, as vLLM and SGLang
 * publish: [topic, seq u64 big-endian, payload]) and hands every batch to the caller in
 * sequence order, filling gaps from the engine's replay socket (ROUTER; we use a DEALER)
 * before the batch that revealed them.
 *
 * What it decides, per worker rank (see kvr_zmq_state_t):
 *   - a gap the replay buffer still covers is replayed, then the live batch applied: exact;
 *   - a gap it no longer covers, no replay endpoint, a publisher restart (numbers went back),
 *     or a batch that stays undecodable after one replay: the caller is told to drop that
 *     rank's state (on_reset) and the rank is marked degraded until a publisher starts over
 *     from batch 0, which makes it exact again;
 *   - malformed messages (not 3 frames, seq not 8 bytes) are counted and skipped;
 *   - the last applied number arriving again is a duplicate if its bytes are the same, and a
 *     publisher restart (that has sent one batch so far) if they differ.
 * Everything dropped or doubtful is counted (kvr_zmq_stats_t, per-rank counters).
 *
 * Threads: one thread owns a listener (the ingest thread): add, remove and poll are called on
 * it. Replay is synchronous inside poll, bounded by replay_timeout_ms.
 * Memory: one SUB (and optional DEALER) socket per rank; no per-batch allocation beyond
 * zmq_msg_t buffers owned by libzmq.
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
} kvr_zmq_reset_reason_t;

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
    uint64_t last_seq;
    uint64_t batches, replayed, gaps, gaps_lost, restarts, undecodable, duplicates;
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
} kvr_zmq_stats_t;

typedef struct kvr_zmq_listener kvr_zmq_listener_t;

typedef struct kvr_zmq_config {
    int replay_timeout_ms;  /* per replay request; 0 = 2000 */
    size_t max_ranks;       /* 0 = 1024 */
} kvr_zmq_config_t;

kvr_zmq_listener_t *kvr_zmq_listener_new(const kvr_zmq_config_t *cfg,
                                         const kvr_zmq_handlers_t *h, int *status);
void kvr_zmq_listener_free(kvr_zmq_listener_t *l);
/* KVR_EEXIST if the rank is already subscribed, KVR_EINVAL for a bad address (libzmq's
 * message in err), KVR_EFULL past max_ranks. */
int kvr_zmq_listener_add(kvr_zmq_listener_t *l, const kvr_zmq_endpoint_t *ep, char *err,
                         size_t err_len);
int kvr_zmq_listener_remove(kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank);
/* Waits up to timeout_ms for messages and handles all that are ready. Returns the number of
 * batches handed over, or a negative status. */
int kvr_zmq_listener_poll(kvr_zmq_listener_t *l, int timeout_ms);
void kvr_zmq_listener_stats(const kvr_zmq_listener_t *l, kvr_zmq_stats_t *out);
int kvr_zmq_listener_rank(const kvr_zmq_listener_t *l, uint64_t worker_id, uint32_t dp_rank,
                          kvr_zmq_rank_info_t *out);

#endif

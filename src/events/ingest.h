/*
 * ingest.h: the KV-event ingest thread of `kvrouter serve`. It owns the ZeroMQ listener, the
 * event decoder and the write side of the prefix index: receive -> decode -> recompute block
 * hashes -> apply, off the HTTP thread. Other threads talk to it through synchronous commands
 * (subscribe, unsubscribe, drop a worker's state, dump, record a routing decision; each wakes
 * the thread's poll) and read per-rank status snapshots
 * (republished after every poll that changed anything and after every command, so a
 * snapshot is never older than the index it describes; idle, every 100 ms).
 *
 * Per rank it keeps: the listener's sequence state (exact / degraded), events applied and
 * rejected, blocks stored/removed, and block-size mismatches, which put the rank in the
 * error state (never a silent zero overlap). Everything dropped is counted and logged with a
 * rate limit.
 */
#ifndef KVR_INGEST_H
#define KVR_INGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/router.h"
#include "kvrouter.h"
#include "events/zmq_listener.h"
#include "wire/kv_events.h"

typedef struct kvr_ingest kvr_ingest_t;

typedef struct kvr_ingest_config {
    uint32_t block_size;      /* the router's block size */
    int replay_timeout_ms;    /* 0 = 2000 */
    size_t max_ranks;         /* 0 = 1024 */
    uint64_t approx_ttl_ms;   /* recorded routing decisions' lifetime; 0 = 120000 */
} kvr_ingest_config_t;

typedef struct kvr_ingest_stats {
    kvr_zmq_stats_t zmq;
    kvr_kv_stats_t decode;
    kvr_index_stats_t index;
    uint64_t events_applied;
    uint64_t events_rejected;     /* the index refused them (parent unknown, repeated hash) */
    uint64_t block_size_mismatch; /* events refused: engine block size != router's */
    uint64_t resets;              /* rank states dropped (restart, lost gap, undecodable) */
    uint64_t rank_out_of_range;   /* batches naming a dp_rank the worker does not have */
    uint64_t records;             /* routing decisions recorded (approximate mode) */
    uint64_t records_refused;     /* ... refused: the rank's KV events are subscribed */
    uint64_t recorded_pairs;      /* gauge: (worker, block) pairs held by recorded decisions */
} kvr_ingest_stats_t;

kvr_ingest_t *kvr_ingest_new(kvr_index_t *ix, const kvr_ingest_config_t *cfg, int *status);
int kvr_ingest_start(kvr_ingest_t *g);
/* Stops the thread (if started) and frees everything. */
void kvr_ingest_free(kvr_ingest_t *g);

/* Synchronous commands, any thread; each returns once the ingest thread has carried it out. */
int kvr_ingest_subscribe(kvr_ingest_t *g, const kvr_worker_spec_t *w, char *err, size_t err_len);
/* Unsubscribes every rank of the worker and drops its index state. */
int kvr_ingest_remove_worker(kvr_ingest_t *g, uint64_t worker_id);
/* Unsubscribes one rank of a worker and drops its index state (the others are untouched). */
int kvr_ingest_remove_rank(kvr_ingest_t *g, kvr_worker_t w);
/* Drops the worker's index state but stays subscribed (a fenced, unhealthy worker). */
int kvr_ingest_drop_state(kvr_ingest_t *g, uint64_t worker_id);
/* Approximate mode (routers without KV events write their decisions here): records that w
 * was sent a prompt with these local and chained sequence hashes, as if its engine had stored
 * the blocks, for approx_ttl_ms (refreshed by a later decision; the index's pair budget
 * bounds them, oldest first). The caller checked the pairing. KVR_EEXIST when w's KV events
 * are subscribed here (they say what it holds); a rank subscribed later drops its recorded
 * state; removing a worker or rank drops it too. */
int kvr_ingest_record(kvr_ingest_t *g, kvr_worker_t w, const uint64_t *lbh, const uint64_t *seq,
                      size_t n, uint64_t capacity);
/* Drops a worker's recorded decisions (one rank, or all): KVR_OK, or KVR_ENOTFOUND when it had
 * none (or its events are subscribed: unsubscribe it instead). */
int kvr_ingest_forget(kvr_ingest_t *g, uint64_t worker_id, bool one_rank, uint32_t dp_rank);
/* Rebuilds a subscribed rank's index state from its engine's replay buffer
 * (kvr_zmq_listener_resync: dropped now, replayed from the oldest batch the engine keeps):
 * KVR_OK when the replay was asked; KVR_EINVAL when the rank has no replay socket (its state
 * is dropped instead: it stays subscribed, degraded, and learns from the next events);
 * KVR_EBUSY while a replay of it is already in progress; KVR_ENOTFOUND when not subscribed;
 * KVR_EIO when the request could not be sent (the state was dropped). */
int kvr_ingest_resync(kvr_ingest_t *g, kvr_worker_t w);
/* Runs fn over a replayable dump of the index, on the ingest thread. */
int kvr_ingest_dump(kvr_ingest_t *g, kvr_dump_fn fn, void *ud);

/* Warm restart (wire/index_snapshot.h has the file format, events/state_file.h the file-system
 * rules: lock, regular files only, new temporary file, fsync, rename). */
typedef struct kvr_ingest_snap_report {
    uint32_t ranks;             /* saved: exact ranks written from the index; loaded: resumed */
    uint32_t ranks_unreachable; /* saved (file): of ranks, those whose engine is unreachable
                                   now (exact up to their cursor; the next start asks it) */
    uint32_t ranks_skipped;     /* saved: ranks not exact and not kept (not worth resuming);
                                   loaded: ranks not configured now, without a replay socket, or
                                   already started */
    uint32_t ranks_kept;        /* saved: ranks of the loaded file their engine has not confirmed
                                   (yet), written as that file had them */
    uint32_t ranks_stale;       /* saved: ranks of the loaded file their engine refused (restarted,
                                   or the batch left its buffer), left out */
    uint32_t ranks_lost;        /* saved: ranks owed that could not be kept (the loaded file could
                                   not be read back; logged) */
    uint64_t events;            /* events written, or applied to the index */
    uint64_t events_failed;     /* loaded events the index refused */
    uint64_t bytes;
} kvr_ingest_snap_report_t;

/* Before kvr_ingest_start (serve does it before anything is loaded): claims path for this
 * process (kvr_state_file_claim: PATH.lock flock'ed until kvr_ingest_free or the process's
 * end; refused if another process holds it, or if PATH is not absent or a regular file).
 * KVR_OK, or the claim's status with err naming state_file and the problem. */
int kvr_ingest_claim_state_file(kvr_ingest_t *g, const char *path, char *err, size_t err_len);
/* Writes the index of every exact rank (its engine reachable now or not) and its cursor to
 * path, plus the ranks the file loaded by kvr_ingest_load still owes (resumed, but neither
 * confirmed nor refused by their engine: carried record for record; see ingest.c), replacing
 * path whole or not at all (kvr_state_file_replace). */
int kvr_ingest_save(kvr_ingest_t *g, const char *path, kvr_ingest_snap_report_t *rep,
                    char *err, size_t err_len);
/* Before kvr_ingest_start, after the workers are subscribed: checks the whole file (a bad
 * one is refused with a message naming the problem, nothing applied), reloads the state of
 * each rank that is subscribed with a replay socket, and resumes its cursor (the listener
 * confirms it from the engine's replay buffer, or drops the reloaded state). KVR_ENOTFOUND
 * if there is no file; KVR_EINVAL if path is not a regular file (a FIFO, a symbolic link...:
 * never opened in a way that could block or follow it). The file stays open while ranks of it
 * are owed (for kvr_ingest_save). */
int kvr_ingest_load(kvr_ingest_t *g, const char *path, kvr_ingest_snap_report_t *rep,
                    char *err, size_t err_len);
/* The same snapshot in memory, for a peer replica (GET /v1/index/snapshot): *buf is malloc'd
 * and the caller's. Any time. */
int kvr_ingest_save_mem(kvr_ingest_t *g, uint8_t **buf, size_t *len,
                        kvr_ingest_snap_report_t *rep, char *err, size_t err_len);
/* kvr_ingest_load from bytes (a peer replica's snapshot), with the same checks and rules. */
int kvr_ingest_load_mem(kvr_ingest_t *g, const uint8_t *buf, size_t len,
                        kvr_ingest_snap_report_t *rep, char *err, size_t err_len);

/* The same, but every rank's events are applied (resumed where the rank can be, else as a
 * dump without a cursor), whether this side subscribes the rank or not: a standalone indexer
 * recovering from a peer (`kvrouter indexer --peers`). rep->ranks counts the resumed ones. */
int kvr_ingest_load_all_mem(kvr_ingest_t *g, const uint8_t *buf, size_t len,
                            kvr_ingest_snap_report_t *rep, char *err, size_t err_len);

/* The address of data-parallel rank `offset` of a publisher whose rank 0 is at base: tcp ports
 * go up by the offset (vLLM and SGLang), ipc/inproc names get "_dp<offset>". */
int kvr_ingest_rank_address(const char *base, uint32_t offset, char *out, size_t cap);

/* Snapshots (any thread). */
int kvr_ingest_rank_status(kvr_ingest_t *g, kvr_worker_t w, kvr_rank_status_t *out);
void kvr_ingest_stats(kvr_ingest_t *g, kvr_ingest_stats_t *out);

#endif

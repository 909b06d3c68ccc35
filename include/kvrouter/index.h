/*
 * kvrouter/index.h: the prefix index (core/index.c): which (worker, dp_rank) holds how long a
 * prefix of a prompt, on the device tier and in the lower tiers, in a bounded amount of memory.
 *
 * Invariants: the index holds at most max_pairs (worker, block) pairs after every apply; an
 * event is applied whole or not at all; replaying kvr_index_dump into an empty index gives
 * the same lookups (kvr_index_verify checks every invariant; docs/index.md has the design).
 * Ownership: kvr_index_new/kvr_index_free; events and prompts are borrowed for the call.
 * Threads: one writer thread (apply, remove, reclaim, dump, verify); any number of registered
 * reader threads look up concurrently (kvr_index_lookup), as kvr_index_sync_t chooses.
 * Cost: apply O(blocks), lookup O(prompt blocks x matching ranks), no allocation once warm.
 */
#ifndef KVR_PUBLIC_INDEX_H
#define KVR_PUBLIC_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvr_worker {
    /* public */
    uint64_t worker_id;
    uint32_t dp_rank;
} kvr_worker_t;

typedef enum kvr_tier {
    KVR_TIER_DEVICE = 0,
    KVR_TIER_HOST = 1,      /* host pinned memory */
    KVR_TIER_DISK = 2,
    KVR_TIER_EXTERNAL = 3,
} kvr_tier_t;
#define KVR_N_TIERS 4

/* One stored block: the engine's own hash (an opaque id for parent links and removal) and
 * the router's local block hash (recomputed from token ids; navigates the index). */
typedef struct kvr_block {
    /* public */
    uint64_t ext;
    uint64_t lbh;
} kvr_block_t;

typedef enum kvr_event_kind {
    KVR_EV_STORED = 0,
    KVR_EV_REMOVED = 1,
    KVR_EV_CLEARED = 2,
} kvr_event_kind_t;

/* A mutation of one worker rank's cache, as engines report it. Borrowed for the call. */
typedef struct kvr_event {
    /* public */
    kvr_event_kind_t kind;
    kvr_worker_t worker;
    kvr_tier_t tier;           /* STORED and REMOVED; CLEARED clears every tier */
    uint64_t event_id;         /* informational here; ordering is the caller's job */
    bool has_parent;           /* STORED: false = the chain starts at the root */
    uint64_t parent_ext;       /* STORED: the parent's engine hash */
    const kvr_block_t *blocks; /* STORED: root -> leaf */
    size_t n_blocks;
    const uint64_t *removed;   /* REMOVED: engine hashes, any order */
    size_t n_removed;
} kvr_event_t;

/* How lookups are kept safe while a writer applies events (see docs/index.md for figures). */
typedef enum kvr_index_sync {
    KVR_SYNC_RCU = 0,    /* default: single writer, wait-free readers (liburcu, memb flavour) */
    KVR_SYNC_RWLOCK = 1, /* one pthread rwlock: readers share, the writer excludes them */
    KVR_SYNC_NONE = 2,   /* one thread does everything */
} kvr_index_sync_t;

/* Called by the writer for every (worker, block) pair the index evicts to stay in budget. */
typedef void (*kvr_evict_fn)(void *ud, kvr_worker_t worker, uint64_t ext, unsigned tier_mask);

typedef struct kvr_index_config {
    /* public */
    size_t max_pairs;       /* budget of (worker, block) pairs; 0 = KVR_INDEX_DEFAULT_MAX_PAIRS */
    uint32_t max_workers;   /* worker rank slots; 0 = KVR_INDEX_DEFAULT_MAX_WORKERS */
    kvr_index_sync_t sync;
    kvr_evict_fn on_evict;  /* optional */
    void *on_evict_ud;
} kvr_index_config_t;

#define KVR_INDEX_DEFAULT_MAX_PAIRS ((size_t)16 << 20)
#define KVR_INDEX_DEFAULT_MAX_WORKERS 4096u
#define KVR_INDEX_MAX_WORKERS 65535u

typedef struct kvr_index kvr_index_t;

/* Counters; monotonic unless marked as a gauge. */
typedef struct kvr_index_stats {
    /* read-only */
    uint64_t pairs;               /* gauge: (worker, block, any tier) pairs held */
    uint64_t nodes;               /* gauge: distinct prefixes (tree nodes) */
    uint64_t workers;             /* gauge: worker ranks known */
    uint64_t bytes;               /* gauge: memory owned by the index */
    uint64_t max_pairs;           /* the budget */
    uint64_t events_stored, events_removed, events_cleared;
    uint64_t blocks_stored, blocks_removed;
    uint64_t err_parent_not_found;  /* stored events rejected */
    uint64_t err_invalid_sequence;  /* stored events rejected */
    uint64_t err_block_not_found;   /* removed hashes unknown (no-op) */
    uint64_t err_capacity;          /* events rejected: no worker slot / memory */
    uint64_t warn_duplicate_store;  /* a stored block the worker already held */
    uint64_t warn_ext_rebound;      /* an engine hash moved to another prefix */
    uint64_t evicted_pairs, evicted_nodes;
    uint64_t workers_removed;
} kvr_index_stats_t;

/* Creates an index. Returns NULL and sets *status (KVR_EINVAL naming nothing, KVR_ENOMEM). */
kvr_index_t *kvr_index_new(const kvr_index_config_t *cfg, int *status);
void kvr_index_free(kvr_index_t *ix);

/* Writer thread only. Applies one event whole or not at all:
 *   KVR_OK; KVR_EPARENT (unknown parent: nothing applied); KVR_EBLOCKSEQ (a hash repeats or
 *   equals the parent: nothing applied); KVR_EFULL (no worker slot left); KVR_EINVAL.
 * Unknown hashes in a REMOVED event are counted and skipped; the others are removed.
 * After the event the index holds at most max_pairs pairs (leaf-first CLOCK eviction). */
int kvr_index_apply(kvr_index_t *ix, const kvr_event_t *ev);

/* Writer thread only. Drops every rank of worker_id. KVR_ENOWORKER if none is known. */
int kvr_index_remove_worker(kvr_index_t *ix, uint64_t worker_id);
/* Writer thread only. Drops one rank of a worker. KVR_ENOWORKER if it is not known. */
int kvr_index_remove_rank(kvr_index_t *ix, kvr_worker_t worker);

/* Writer thread only. Frees memory whose readers are gone (an RCU grace period). Cheap to call
 * often; apply() calls it itself when enough memory is waiting. */
void kvr_index_reclaim(kvr_index_t *ix);

/* Per-worker answer of a lookup. */
typedef struct kvr_match {
    /* read-only (public when a caller hands in overlaps found elsewhere) */
    kvr_worker_t worker;
    uint32_t device_blocks;  /* leading blocks held on the device tier */
    uint32_t host_blocks;    /* further blocks held in host memory, right after the device ones */
    uint32_t disk_blocks;    /* further blocks on disk or external storage, after host ones */
} kvr_match_t;

/* A lookup's result and scratch space. Reuse one per reader thread: after the first few
 * lookups it no longer allocates. */
typedef struct kvr_lookup {
    /* read-only */
    kvr_match_t *matches;  /* workers with any matched block, in no particular order */
    size_t n_matches;
    uint32_t max_depth;    /* the longest device prefix over all workers */
    /* private */
    struct kvr_lookup_scratch *priv; /* the index's scratch (opaque), made by the first lookup */
} kvr_lookup_t;

void kvr_lookup_init(kvr_lookup_t *lk);
void kvr_lookup_deinit(kvr_lookup_t *lk);

/* Any registered reader thread (and the writer). seq = the prompt's sequence hashes.
 * Returns KVR_OK or KVR_ENOMEM (scratch growth). Lookups concurrent with writes see every
 * prefix that was unchanged during the lookup exactly; prefixes being changed may be seen in
 * either state. */
int kvr_index_lookup(kvr_index_t *ix, const uint64_t *seq, size_t n, kvr_lookup_t *out);

/* Reader threads using KVR_SYNC_RCU must register once (and unregister before exiting). */
void kvr_index_reader_register(void);
void kvr_index_reader_unregister(void);

/* Writer thread only. Calls fn once per event of a replayable snapshot: replaying the events,
 * in order, into an empty index gives an index with the same lookups, pairs and engine hashes.
 * Stops early and returns fn's value if fn returns non-zero. */
typedef int (*kvr_dump_fn)(void *ud, const kvr_event_t *ev);
int kvr_index_dump(kvr_index_t *ix, kvr_dump_fn fn, void *ud);

/* Writer thread only (or quiescent). Checks every invariant; KVR_OK or KVR_EINVAL with a
 * description in msg (may be NULL). */
int kvr_index_verify(const kvr_index_t *ix, char *msg, size_t msg_len);

void kvr_index_stats(const kvr_index_t *ix, kvr_index_stats_t *out);

/* Writer-side queries used by tests and the API layer. */
/* The tiers (bit mask of 1 << kvr_tier_t) at which worker holds the block with engine hash
 * ext; 0 if it does not. */
unsigned kvr_index_holds(const kvr_index_t *ix, kvr_worker_t worker, uint64_t ext);
/* Number of pairs a worker rank holds; 0 if unknown. */
size_t kvr_index_worker_pairs(const kvr_index_t *ix, kvr_worker_t worker);

#ifdef __cplusplus
}
#endif
#endif /* KVR_PUBLIC_INDEX_H */

/*
 * kvrouter.h: the public API of libkvrouter, the core of the kvrouter KV-cache-aware router.
 *
 * What is here (the "core" layer: pure computation, no I/O, no threads of its own):
 *   - status codes (one table, kvr_strerror);
 *   - Dynamo-compatible block hashing (XXH3-64, seed 1337, LoRA / cache namespace salts,
 *     multimodal hashes, Eagle windows) and chained sequence hashes;
 *   - the prefix index: which (worker, dp_rank) holds how long a prefix of a prompt, on the
 *     device tier and in the lower tiers, in a bounded amount of memory;
 *   - approximate mode: routing decisions recorded in an index with a TTL and size pruning.
 *
 * Ownership: every pointer passed in is borrowed for the duration of the call unless a
 * function says otherwise. Objects created by kvr_X_new() are released by kvr_X_free(),
 * and kvr_X_free(NULL) is a no-op. Embedded objects use kvr_X_init()/kvr_X_deinit().
 *
 * Threads: see each module. In short, one thread writes an index (apply/remove/dump/verify),
 * any number of registered reader threads look it up concurrently (kvr_index_lookup).
 */
#ifndef KVROUTER_H
#define KVROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes. 0 is success; errors are negative. One table; kvr_strerror() names them.     */

#define KVR_STATUS_TABLE(X)                                                              \
    X(KVR_OK, 0, "ok")                                                                   \
    X(KVR_EINVAL, -1, "invalid argument")                                                \
    X(KVR_ENOMEM, -2, "out of memory")                                                   \
    X(KVR_EPARENT, -3, "parent block not found")                                         \
    X(KVR_EBLOCKSEQ, -4, "invalid block sequence (repeated hash or self-reference)")     \
    X(KVR_ENOBLOCK, -5, "block not found")                                               \
    X(KVR_EFULL, -6, "capacity exhausted")                                               \
    X(KVR_EPARSE, -7, "parse error")                                                     \
    X(KVR_ERANGE, -8, "value out of range")                                              \
    X(KVR_ENOWORKER, -9, "unknown worker")                                               \
    X(KVR_EIO, -10, "input/output error")                                                \
    X(KVR_ETOOBIG, -11, "input too large")                                               \
    X(KVR_EEXIST, -12, "already exists")                                                 \
    X(KVR_ENOTFOUND, -13, "not found")                                                   \
    X(KVR_EBUSY, -14, "every eligible worker is busy")                                   \
    X(KVR_ENOTALLOWED, -15, "worker not allowed by the request's filters")               \
    X(KVR_EQUEUEFULL, -16, "queue limit reached")                                        \
    X(KVR_EMISMATCH, -17, "block size mismatch")

enum kvr_status {
#define KVR_STATUS_ENUM(name, value, text) name = value,
    KVR_STATUS_TABLE(KVR_STATUS_ENUM)
#undef KVR_STATUS_ENUM
};

/* A static string for a status code ("unknown status" for codes not in the table). */
const char *kvr_strerror(int status);
/* The symbolic name of a status code, e.g. "KVR_EPARENT". */
const char *kvr_status_name(int status);

/* ------------------------------------------------------------------------------------------ */
/* Block hashing (core/hash.c).
 *
 * local block hash  lbh[i] = XXH3_64(token bytes of block i [|| sorted mm hashes], seed)
 * sequence hash     seq[0] = lbh[0]; seq[i] = XXH3_64(LE64(seq[i-1]) || LE64(lbh[i]), 1337)
 * seed              1337 + XXH3(lora_name, 0) + XXH3(cache_namespace, 1)  (wrapping; empty = absent)
 *
 * Only complete blocks are hashed: floor(n / bs) blocks, or floor((n - 1) / bs) with Eagle
 * windows of bs + 1 tokens. Hashing allocates nothing; callers own every buffer.
 */

#define KVR_HASH_SEED 1337u

/* Multimodal hashes attached to one block (block index relative to the prompt). */
typedef struct kvr_block_mm {
    uint32_t block;          /* block index */
    const uint64_t *hashes;  /* mm_hash values, any order (hashed in ascending order) */
    size_t n_hashes;
} kvr_block_mm_t;

typedef struct kvr_hash_opts {
    const char *lora_name;        /* NULL or "" = none */
    size_t lora_name_len;         /* bytes; ignored when lora_name is NULL */
    const char *cache_namespace;  /* NULL or "" = none */
    size_t cache_namespace_len;
    bool is_eagle;                /* windows of block_size + 1 tokens, stride block_size */
    const kvr_block_mm_t *mm;     /* sorted by block index, at most one entry per block */
    size_t n_mm;
} kvr_hash_opts_t;

/* The salted seed for these options (1337 when neither LoRA nor namespace is set). */
uint64_t kvr_hash_seed(const kvr_hash_opts_t *opts);

/* Number of complete blocks (Eagle-aware). 0 when block_size is 0. */
size_t kvr_hash_n_blocks(size_t n_tokens, uint32_t block_size, bool is_eagle);

/* Local block hashes of tokens[0..n_tokens) into lbh_out (capacity cap).
 * Returns the number of blocks (>= 0), or KVR_EINVAL (block_size 0, NULL with n > 0,
 * mm entries not strictly ascending by block), or KVR_ETOOBIG when cap is too small.
 * mm entries past the last complete block are ignored (that block is never hashed).
 * opts may be NULL (no salt, no mm, no Eagle). */
long kvr_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                     const kvr_hash_opts_t *opts, uint64_t *lbh_out, size_t cap);

/* Both at once: local block hashes into lbh_out and sequence hashes into seq_out (each of
 * capacity cap), in one interleaved pass; what the router calls per request. Same returns
 * as kvr_hash_blocks. */
long kvr_hash_prompt(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                     const kvr_hash_opts_t *opts, uint64_t *lbh_out, uint64_t *seq_out,
                     size_t cap);

/* Chained sequence hashes of lbh[0..n) into seq_out[0..n) (may alias lbh). */
void kvr_hash_chain(const uint64_t *lbh, size_t n, uint64_t *seq_out);

/* One step of the chain: the sequence hash of a block whose parent has sequence hash prev. */
uint64_t kvr_hash_chain_next(uint64_t prev_seq, uint64_t lbh);

/* XXH3_64 of bytes with a seed (the primitive, exposed for parity tests). */
uint64_t kvr_xxh3(const void *bytes, size_t len, uint64_t seed);

/* SGLang-compatible multimodal pad token: 1e6 + (mm_hash & (2^30 - 1)). */
uint32_t kvr_mm_pad_value(uint64_t mm_hash);

/* ------------------------------------------------------------------------------------------ */
/* The prefix index (core/index.c).                                                            */

typedef struct kvr_worker {
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

/* Writer thread only. Frees memory whose readers are gone (an RCU grace period). Cheap to call
 * often; apply() calls it itself when enough memory is waiting. */
void kvr_index_reclaim(kvr_index_t *ix);

/* Per-worker answer of a lookup. */
typedef struct kvr_match {
    kvr_worker_t worker;
    uint32_t device_blocks;  /* leading blocks held on the device tier */
    uint32_t host_blocks;    /* further blocks held in host memory, right after the device ones */
    uint32_t disk_blocks;    /* further blocks on disk or external storage, after host ones */
} kvr_match_t;

/* A lookup's result and scratch space. Reuse one per reader thread: after the first few
 * lookups it no longer allocates. */
typedef struct kvr_lookup {
    kvr_match_t *matches;  /* workers with any matched block, in no particular order */
    size_t n_matches;
    uint32_t max_depth;    /* the longest device prefix over all workers */
    /* private scratch */
    size_t cap_matches;
    uint64_t *active;      /* bitset over worker slots */
    uint64_t *dropped;
    uint32_t *depth;       /* per worker slot */
    uint32_t *chain;       /* node per block position */
    size_t cap_slots, cap_chain;
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

/* ------------------------------------------------------------------------------------------ */
/* Approximate mode (core/approx.c): no KV events; the router records its own routing
 * decisions as if the chosen worker had cached the prompt, with a TTL and a size bound.
 * Uses the index's writer thread. Time is passed in (milliseconds, any monotonic origin). */

typedef struct kvr_approx_config {
    uint64_t ttl_ms;            /* 0 = 120000 */
    size_t max_tree_size;       /* pairs; 0 = 1 << 20 */
    double prune_target_ratio;  /* (0, 1]; 0 = 0.8 */
} kvr_approx_config_t;

typedef struct kvr_approx kvr_approx_t;

/* Validates cfg (KVR_EINVAL naming the field in *field when non-NULL). */
int kvr_approx_config_validate(const kvr_approx_config_t *cfg, const char **field);
kvr_approx_t *kvr_approx_new(kvr_index_t *ix, const kvr_approx_config_t *cfg, int *status);
void kvr_approx_free(kvr_approx_t *ap);
/* Records that worker was sent a prompt with these hashes at now_ms; refreshes the TTL of
 * blocks already recorded; prunes to prune_target_ratio * max_tree_size when over size. */
int kvr_approx_record(kvr_approx_t *ap, kvr_worker_t worker, const uint64_t *lbh,
                      const uint64_t *seq, size_t n, uint64_t now_ms);
/* Removes entries whose TTL has passed. Returns the number removed. */
size_t kvr_approx_expire(kvr_approx_t *ap, uint64_t now_ms);
/* The earliest pending expiry (UINT64_MAX when none). */
uint64_t kvr_approx_next_expiry(const kvr_approx_t *ap);
size_t kvr_approx_size(const kvr_approx_t *ap);
/* Drops every entry of worker_id (all ranks) from the tracker and the index. */
int kvr_approx_remove_worker(kvr_approx_t *ap, uint64_t worker_id);

/* ------------------------------------------------------------------------------------------ */
/* Load tracker (core/load.c).                                                                 */
/* [section owned by the load tracker] */

/* ------------------------------------------------------------------------------------------ */
/* Selector and queue (core/select.c, core/queue.c).                                           */
/* [section owned by the selector and queue] */

/* ------------------------------------------------------------------------------------------ */
/* Router configuration (core/config.c).                                                       */
/* [section owned by the configuration] */

#ifdef __cplusplus
}
#endif
#endif /* KVROUTER_H */

/*
 * kvrouter.h: the public API of libkvrouter, the core of the kvrouter KV-cache-aware router.
 *
 * What is here (the "core" layer: pure computation, no I/O, no threads of its own):
 *   - status codes (one table, kvr_strerror);
 *   - Dynamo-compatible block hashing (XXH3-64, seed 1337, LoRA / cache namespace salts,
 *     multimodal hashes, Eagle windows) and chained sequence hashes;
 *   - the prefix index: which (worker, dp_rank) holds how long a prefix of a prompt, on the
 *     device tier and in the lower tiers, in a bounded amount of memory;
 *   - approximate mode: routing decisions recorded in an index with a TTL and size pruning;
 *   - the router itself, in <kvrouter/router.h> (configuration: <kvrouter/config.h>): workers,
 *     a routing decision per request, its lifecycle (first token, output blocks, free), the
 *     scores and loads behind it. examples/embed.c embeds it in ~100 lines.
 *
 * Build against it: `make install PREFIX=...`, then `pkg-config --cflags --libs --static
 * kvrouter` (a static library; it needs libxxhash and liburcu-memb).
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

#define KVR_STATUS_TABLE(X)                                                          \
    X(KVR_OK, 0, "ok")                                                               \
    X(KVR_EINVAL, -1, "invalid argument")                                            \
    X(KVR_ENOMEM, -2, "out of memory")                                               \
    X(KVR_EPARENT, -3, "parent block not found")                                     \
    X(KVR_EBLOCKSEQ, -4, "invalid block sequence (repeated hash or self-reference)") \
    X(KVR_ENOBLOCK, -5, "block not found")                                           \
    X(KVR_EFULL, -6, "capacity exhausted")                                           \
    X(KVR_EPARSE, -7, "parse error")                                                 \
    X(KVR_ERANGE, -8, "value out of range")                                          \
    X(KVR_ENOWORKER, -9, "unknown worker")                                           \
    X(KVR_EIO, -10, "input/output error")                                            \
    X(KVR_ETOOBIG, -11, "input too large")                                           \
    X(KVR_EEXIST, -12, "already exists")                                             \
    X(KVR_ENOTFOUND, -13, "not found")                                               \
    X(KVR_EBUSY, -14, "every eligible worker is busy")                               \
    X(KVR_ENOTALLOWED, -15, "worker not allowed by the request's filters")           \
    X(KVR_EQUEUEFULL, -16, "queue limit reached")                                    \
    X(KVR_EMISMATCH, -17, "block size mismatch")                                     \
    X(KVR_ENOMODEL, -18, "no worker serves the request's model or adapter")

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

/* A multimodal object's identifier as the reference maps it to an mm_hash: a 64-character
 * hex digest (vLLM's own) gives its first 16 hex digits; with any_string, any other non-empty
 * string its XXH3-64 (seed 0). False (nothing written) when it maps to none. */
bool kvr_hash_mm_identifier(const char *s, size_t n, bool any_string, uint64_t *out);

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
/* Writer thread only. Drops one rank of a worker. KVR_ENOWORKER if it is not known. */
int kvr_index_remove_rank(kvr_index_t *ix, kvr_worker_t worker);

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
/* The same for one rank of a worker. */
int kvr_approx_remove_rank(kvr_approx_t *ap, kvr_worker_t w);
/* A rank's cache capacity in blocks (0 = unknown: only the TTL and the size bound apply).
 * With one, the rank holds at most that many recorded blocks: recording more evicts its least
 * recently recorded ones (of one decision, the deepest first), as its engine's LRU would, so
 * the router stops crediting it with prefixes it has evicted. */
int kvr_approx_set_capacity(kvr_approx_t *ap, kvr_worker_t w, uint64_t blocks);
/* A request's life on a rank with a known capacity, as its engine's cache sees it:
 *   begin   routed: its blocks recorded (kvr_approx_record), kept under key (the load tracker's
 *           handle, never 0); a key whose slot holds an unended request ends that one first;
 *   start   its engine admitted it (the first token): its blocks held (not evictable) until
 *           it ends, as an engine holds a running request's blocks (recorded again first
 *           when one was evicted since the routing: the engine computes it again);
 *   output  it filled an output block: held too, and evictable once it ends, though no prompt
 *           asks for it;
 *   end     finished: its blocks touched again, outputs first, then its prompt deepest first,
 *           as an engine frees them into its LRU.
 * KVR_ENOTFOUND: no request under key. */
int kvr_approx_begin(kvr_approx_t *ap, uint64_t key, kvr_worker_t worker, const uint64_t *lbh,
                     const uint64_t *seq, size_t n, uint64_t now_ms);
int kvr_approx_start(kvr_approx_t *ap, uint64_t key, uint64_t now_ms);
int kvr_approx_output(kvr_approx_t *ap, uint64_t key);
int kvr_approx_end(kvr_approx_t *ap, uint64_t key, uint64_t now_ms);
/* Blocks evicted by capacity so far. */
uint64_t kvr_approx_evicted(const kvr_approx_t *ap);
/* Checks the invariants core/approx.c states (KVR_OK; KVR_EINVAL with msg; KVR_ENOMEM). O(size
 * x ranks); for tests. Not const: it marks timers while it runs, and leaves them as they were. */
int kvr_approx_verify(kvr_approx_t *ap, char *msg, size_t msg_len);

/* ------------------------------------------------------------------------------------------ */
/* Load tracker (core/load.c).                                                                 */
/* [section owned by the load tracker] */
/*
 * In-flight requests per worker rank and the load they put on it (reference 4.2 to 4.5): the
 * prompt blocks they hold (refcounted per worker, so a shared prefix counts once), the output
 * blocks they grew, the prefill tokens not yet answered by a first token, and their number.
 * The router projects, for an incoming request, each candidate's load if it were chosen.
 *
 * One thread (the event loop) owns a tracker; nothing here locks. Time is passed in
 * (milliseconds, any monotonic origin); randomness (hashes for output blocks, and for prompt
 * blocks with assume_kv_reuse off) comes from cfg.seed, so runs are reproducible.
 *
 * Request ids are byte strings of 1..KVR_LOAD_MAX_ID_BYTES bytes (copied; not NUL-terminated).
 * Lifecycle policy: a duplicate live id is rejected (KVR_EEXIST, counted, nothing changes: S24);
 * first_token / output_block / free_request on an unknown or already freed id return
 * KVR_ENOTFOUND, change nothing and are counted (S25); each request is released exactly once,
 * by free_request, by expiry, or by remove_worker, whichever comes first.
 */
#define KVR_LOAD_MAX_ID_BYTES 256u
#define KVR_LOAD_DEFAULT_BLOCK_SIZE 16u
#define KVR_LOAD_DEFAULT_EXPIRY_MS 300000u         /* 5 min backstop (S12), see load.c */
#define KVR_LOAD_DEFAULT_CHECK_INTERVAL_MS 60000u  /* sweep at most once a minute from add */
#define KVR_LOAD_DEFAULT_MAX_REQUESTS 65536u
#define KVR_LOAD_MAX_REQUESTS (1u << 24)
#define KVR_LOAD_MAX_EXPIRY_MS (UINT64_C(1) << 52)

typedef struct kvr_load_config {
    uint32_t block_size;        /* tokens per block, > 0: a request has <= isl / block_size hashes */
    bool track_active_blocks;   /* default true; false: prompt hashes are ignored (prefill pools) */
    bool track_output_blocks;   /* default false; requires track_active_blocks */
    bool assume_kv_reuse;       /* default true; false: prompt blocks get random hashes (no dedup) */
    bool track_prefill_tokens;  /* default true; false: prefill tokens are not counted */
    uint64_t expiry_ms;         /* 1..KVR_LOAD_MAX_EXPIRY_MS: requests this old are stale */
    uint64_t check_interval_ms; /* <= expiry_ms: add() sweeps stale requests at most this often */
    uint32_t max_requests;      /* 1..KVR_LOAD_MAX_REQUESTS live requests; past it add() fails */
    uint64_t seed;              /* random hashes and the request-id hash seed */
    uint32_t max_peer_requests; /* 0..KVR_LOAD_MAX_REQUESTS: requests admitted with .peer (other
                                   replicas' bookings) get this budget of their own, and
                                   max_requests is then the local requests' alone, so peers can
                                   never crowd local requests out; 0 = one shared budget */
    uint64_t max_peer_blocks;   /* prompt blocks of .peer requests held at most (their memory);
                                   0 = no bound */
} kvr_load_config_t;

/* Fills cfg with the defaults above (track_active_blocks, assume_kv_reuse and
 * track_prefill_tokens on, track_output_blocks off, seed 0). */
void kvr_load_config_init(kvr_load_config_t *cfg);
/* KVR_OK, or KVR_EINVAL with the offending field's name in *field (when field is non-NULL):
 * "block_size", "track_output_blocks", "expiry_ms", "check_interval_ms", "max_requests". */
int kvr_load_config_validate(const kvr_load_config_t *cfg, const char **field);

typedef struct kvr_load kvr_load_t;

/* cfg NULL = defaults. Returns NULL and sets *status (KVR_EINVAL, KVR_ENOMEM) on failure. */
kvr_load_t *kvr_load_new(const kvr_load_config_t *cfg, int *status);
void kvr_load_free(kvr_load_t *lt);

/* A request being admitted on a worker. Borrowed for the call. */
/* A per-request setting that overrides the tracker's configuration, or leaves it (0). */
typedef enum kvr_load_opt { KVR_LOAD_CONFIG = 0, KVR_LOAD_ON, KVR_LOAD_OFF } kvr_load_opt_t;

typedef struct kvr_load_request {
    const char *id;
    size_t id_len;
    kvr_worker_t worker;
    const uint64_t *seq;            /* the prompt's sequence hashes; NULL/0 when not tracked */
    size_t n_seq;
    uint64_t isl_tokens;            /* prompt length in tokens */
    uint64_t cached_tokens;         /* cached on this worker: prefill = isl - min(cached, isl) */
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
    uint32_t block_size;                 /* of its prompt's blocks; 0 = the tracker's */
    kvr_load_opt_t assume_kv_reuse;      /* off: its blocks never dedup with others' */
    kvr_load_opt_t track_prefill_tokens; /* off: its prompt is not counted as prefill load */
    bool peer;                           /* another replica's booking (max_peer_requests) */
} kvr_load_request_t;

/* Names a live request without its id: (generation << 32 | slot), never 0. Once the request
 * is freed (or expires, or its worker is removed) the slot's generation changes, so a stale
 * handle never names a later request: the _h calls answer KVR_ENOTFOUND for it. */
typedef uint64_t kvr_req_handle_t;
#define KVR_REQ_HANDLE_NONE UINT64_C(0)

/* Admits a request. May first free stale requests (at most every check_interval_ms).
 * KVR_OK; KVR_EINVAL (empty or too long id, seq NULL with n_seq > 0, n_seq > isl/block_size;
 * nothing counted); KVR_ETOOBIG (n_seq >= 2^31); KVR_EEXIST (live id: counted, state untouched); KVR_EFULL (max_requests
 * live: counted); KVR_ENOMEM. On any error nothing changes. */
int kvr_load_add(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms);
/* kvr_load_add that also hands back the request's handle (KVR_REQ_HANDLE_NONE on error). */
int kvr_load_admit(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms,
                   kvr_req_handle_t *handle);
/* The first output token: the request's prefill tokens leave its worker's load. Repeats are
 * KVR_OK no-ops. KVR_ENOTFOUND (counted) for an unknown id. */
int kvr_load_first_token(kvr_load_t *lt, const char *id, size_t id_len, uint64_t now_ms);
/* One more output block (with track_output_blocks; otherwise a KVR_OK no-op). decay_fraction:
 * NAN = absent; else in [0, 1] (KVR_ERANGE otherwise) and every block held by this request
 * alone, this one included, then weighs decay_fraction (4.3). KVR_ENOTFOUND (counted). */
int kvr_load_output_block(kvr_load_t *lt, const char *id, size_t id_len, double decay_fraction,
                          uint64_t now_ms);
/* Releases everything the request holds. KVR_ENOTFOUND (counted, a no-op) if unknown. */
int kvr_load_free_request(kvr_load_t *lt, const char *id, size_t id_len, uint64_t now_ms);
/* The same three calls by handle: O(1), no id hashing. A stale handle is an unknown id. */
int kvr_load_first_token_h(kvr_load_t *lt, kvr_req_handle_t h, uint64_t now_ms);
int kvr_load_output_block_h(kvr_load_t *lt, kvr_req_handle_t h, double decay_fraction,
                            uint64_t now_ms);
int kvr_load_free_h(kvr_load_t *lt, kvr_req_handle_t h, uint64_t now_ms);
/* The id of the live request h names (not counted when stale: KVR_ENOTFOUND); *id points into
 * the tracker, valid until the request is freed. */
int kvr_load_handle_id(const kvr_load_t *lt, kvr_req_handle_t h, const char **id, size_t *id_len);
/* A live request's handle, found by id (id != NULL) or by handle (then the same, when it is
 * live). KVR_ENOTFOUND when none is live. */
int kvr_load_request_handle(const kvr_load_t *lt, const char *id, size_t id_len, kvr_req_handle_t h,
                            kvr_req_handle_t *handle);
/* Frees requests added expiry_ms or more before now_ms (counted). Returns how many. */
size_t kvr_load_expire(kvr_load_t *lt, uint64_t now_ms);
/* When the oldest live request becomes stale (UINT64_MAX when none): a timer for expire(). */
uint64_t kvr_load_next_expiry(const kvr_load_t *lt);
/* Drops every request of every rank of worker_id (counted). *n_dropped (may be NULL) = how
 * many. KVR_ENOWORKER (a no-op) when no rank of it has a request. */
int kvr_load_remove_worker(kvr_load_t *lt, uint64_t worker_id, size_t *n_dropped);

/* A worker rank's current load; all zero for a rank with no request. */
typedef struct kvr_load_snapshot {
    uint64_t active_blocks;          /* round(sum of block weights) */
    uint64_t active_prefill_tokens;
    uint64_t unique_blocks;          /* distinct blocks held, whatever their weight */
    uint32_t active_requests;
} kvr_load_snapshot_t;
void kvr_load_snapshot(const kvr_load_t *lt, kvr_worker_t worker, kvr_load_snapshot_t *out);

/* An incoming request, as projected. seq must be chained sequence hashes (kvr_hash_prompt):
 * the overlap is then found by binary search (see load.c). Ignored without track_active_blocks. */
typedef struct kvr_load_query {
    const uint64_t *seq;
    size_t n_seq;
    uint64_t isl_tokens;
    kvr_load_opt_t assume_kv_reuse; /* off: no leading block counts as already active */
} kvr_load_query_t;

/* One candidate: the caller fills worker and cached_tokens; the tracker fills the rest. */
typedef struct kvr_load_projection {
    kvr_worker_t worker;                /* in */
    uint64_t cached_tokens;             /* in: the query's cached tokens on this worker (5.2) */
    uint64_t potential_prefill_tokens;  /* active_prefill_tokens + isl - min(cached, isl) */
    uint64_t potential_decode_blocks;   /* active_blocks + n_seq - overlap_blocks */
    uint64_t active_prefill_tokens;
    uint64_t active_blocks;
    uint64_t overlap_blocks;            /* leading query blocks already active on the worker */
    uint32_t active_requests;
} kvr_load_projection_t;

/* Projects the query onto each of p[0..n) (no allocation; O(log n_seq) probes per worker).
 * KVR_OK, or KVR_EINVAL (NULL arguments) with nothing written. */
int kvr_load_project(const kvr_load_t *lt, const kvr_load_query_t *q, kvr_load_projection_t *p,
                     size_t n);
/* The same for one worker. */
int kvr_load_project_one(const kvr_load_t *lt, const kvr_load_query_t *q,
                         kvr_load_projection_t *p);

/* What the tracker holds for one live request. */
typedef struct kvr_load_request_info {
    kvr_worker_t worker;
    uint64_t started_ms;        /* max(now at add, start of the previous live request) */
    uint64_t prefill_tokens;    /* counted on the worker; 0 after the first token */
    uint32_t n_prompt_blocks;
    uint32_t n_output_blocks;
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
} kvr_load_request_info_t;
/* KVR_OK or KVR_ENOTFOUND (not counted: a query). */
int kvr_load_request_info(const kvr_load_t *lt, const char *id, size_t id_len,
                          kvr_load_request_info_t *out);

/* One live request as kvr_load_foreach shows it (valid during the callback only). */
typedef struct kvr_load_request_view {
    const char *id;
    size_t id_len;
    kvr_req_handle_t handle;
    kvr_load_request_info_t info;
    const uint64_t *prompt_hashes; /* info.n_prompt_blocks of them (random ones for a request
                                      admitted with assume_kv_reuse off) */
} kvr_load_request_view_t;
/* Returns 0 to go on, anything else to stop (kvr_load_foreach returns it). */
typedef int (*kvr_load_visit_fn)(void *arg, const kvr_load_request_view_t *v);
/* Shows each live request, oldest first (a snapshot for a peer replica). KVR_OK, fn's nonzero
 * value, KVR_EINVAL or KVR_ENOMEM (one scratch array of the longest prompt's hashes).
 * fn must not change the tracker. O(live requests + their blocks). */
int kvr_load_foreach(const kvr_load_t *lt, kvr_load_visit_fn fn, void *arg);

/* Counters; monotonic unless marked as a gauge. */
typedef struct kvr_load_stats {
    uint64_t adds, frees, first_tokens, output_blocks;
    uint64_t duplicates;       /* adds rejected: the id is live */
    uint64_t full;             /* adds rejected: max_requests live */
    uint64_t peer_full;        /* peers' adds rejected: max_peer_requests live, or their blocks
                                  would pass max_peer_blocks */
    uint64_t unknown_frees;    /* free_request of an unknown id */
    uint64_t unknown_marks;    /* first_token / output_block of an unknown id */
    uint64_t expired;          /* requests freed by expiry */
    uint64_t workers_removed;  /* worker ranks dropped by remove_worker */
    uint64_t requests_dropped; /* requests freed by remove_worker */
    uint64_t live_requests;    /* gauge */
    uint64_t unique_blocks;    /* gauge: (worker rank, block) pairs held */
    uint64_t workers;          /* gauge: worker ranks with a live request */
    uint64_t active_prefill_tokens; /* gauge: over all workers */
    uint64_t bytes;            /* gauge: memory owned by the tracker */
    uint64_t max_requests;     /* the cap */
    uint64_t peer_requests;    /* gauge: live requests admitted with .peer */
    uint64_t max_peer_requests; /* their cap (0 = they share max_requests) */
    uint64_t peer_blocks;      /* gauge: prompt blocks those hold */
} kvr_load_stats_t;
void kvr_load_stats(const kvr_load_t *lt, kvr_load_stats_t *out);

/* Checks every invariant (recomputes all loads from the live requests). KVR_OK, or KVR_EINVAL
 * with a description in msg (may be NULL), or KVR_ENOMEM. O(everything held); for tests. */
int kvr_load_verify(const kvr_load_t *lt, char *msg, size_t msg_len);

/* ------------------------------------------------------------------------------------------ */
/* Selector and queue (core/select.c, core/queue.c).                                           */
/* [section owned by the selector and queue] */

/*
 * Randomness is the caller's: a splitmix64 state seeded by the caller, so every pick is
 * reproducible from a seed. One state per thread; any value is a valid state.
 */
typedef struct kvr_rng {
    uint64_t state;
} kvr_rng_t;

void kvr_rng_seed(kvr_rng_t *rng, uint64_t seed);
uint64_t kvr_rng_next(kvr_rng_t *rng);
/* Uniform in [0, 1), 53 bits. */
double kvr_rng_uniform(kvr_rng_t *rng);
/* Uniform in [0, n), unbiased; 0 when n is 0. */
uint64_t kvr_rng_below(kvr_rng_t *rng, uint64_t n);

/* -- Selector (core/select.c), reference 5.2-5.5 and 5.8. ---------------------------------- */

typedef enum kvr_select_policy {
    KVR_SELECT_POLICY_DYNAMO = 0,   /* the reference's: prefill_load_scale * adjusted prefill +
                                       decode (+ requests) */
    KVR_SELECT_POLICY_LMETRIC = 1,  /* adjusted prefill * (decode + 1) */
    KVR_SELECT_POLICY_LOCALITY = 2, /* lmetric with cached device blocks credited twice (the
                                       router's default: docs/sim.md) */
} kvr_select_policy_t;

/* Every knob of the cost function, with the reference defaults (kvr_select_config_default).
 * Validation (kvr_select_config_validate) names the first bad field. */
typedef struct kvr_select_config {
    double overlap_score_credit;         /* 1.0; finite >= 0 (values above 1 are allowed) */
    double overlap_score_credit_decay;   /* 0.0; finite >= 0 */
    double prefill_load_scale;           /* 1.0; finite >= 0 */
    double decode_active_request_weight; /* 0.0; finite >= 0 */
    double host_cache_hit_weight;        /* 0.75; [0, 1] */
    double disk_cache_hit_weight;        /* 0.25; [0, 1] (disk and external tiers) */
    double shared_cache_multiplier;      /* 0.0; [0, 1] */
    double temperature;                  /* 0.0 (router_temperature); finite >= 0 */
    double step_wait_weight;             /* 0.0 (router_step_wait_weight); finite >= 0;
                                            locality policy: blocks per ms of step wait */
    kvr_select_policy_t policy;          /* router_selection_policy */
    bool decode_pool;                    /* workers are a decode pool (5.4 special case) */
} kvr_select_config_t;

/* Per-request override (reference 5.6): each field applies only when its has_ flag is set.
 * overlap_score_weight is the deprecated spelling: non-zero sets prefill_load_scale, zero sets
 * both prefill_load_scale and overlap_score_credit to 0; it takes precedence. assume_kv_reuse
 * and track_prefill_tokens also change what the load tracker books, so the router resolves them
 * itself (into kvr_select_request_t.track_prefill_tokens). */
typedef struct kvr_select_override {
    bool has_overlap_score_credit, has_prefill_load_scale, has_temperature;
    bool has_shared_cache_multiplier, has_overlap_score_weight;
    double overlap_score_credit, prefill_load_scale, temperature;
    double shared_cache_multiplier, overlap_score_weight;
} kvr_select_override_t;

/* A preferred taint and its weight (any finite value; negative weights repel). */
typedef struct kvr_taint_weight {
    const char *taint;
    double weight;
} kvr_taint_weight_t;

/* One (worker_id, dp_rank) the router may pick, with the numbers it gathered for this prompt. */
typedef struct kvr_select_candidate {
    kvr_worker_t worker;
    uint32_t device_blocks;            /* leading prompt blocks cached on the device */
    uint32_t host_blocks;              /* further blocks in host memory (extension) */
    uint32_t disk_blocks;              /* further blocks on disk or external storage */
    uint32_t shared_blocks;            /* shared-pool hits at positions >= device_blocks */
    uint64_t active_prefill_tokens;    /* tracker: prefill tokens in flight now */
    uint64_t potential_prefill_tokens; /* tracker: active + this prompt's uncached tokens (4.5) */
    uint64_t potential_decode_blocks;  /* tracker: active blocks + this prompt's new ones */
    uint32_t active_requests;
    double step_wait_ms;               /* its engine step under way: time left (stepclock.h) */
    const char *const *taints;         /* the worker's taints */
    size_t n_taints;
    bool has_load;                     /* false: the tracker knows nothing (loads read as 0) */
    bool fenced;                       /* dead or deregistered: never picked */
    bool unfit;                        /* another model, or lacks the adapter: never picked */
    bool busy;                         /* over a busy threshold (kvr_busy): never picked */
    bool queue_busy;                   /* over the queue threshold: may be picked, but while
                                          every eligible rank is, the request waits (KVR_EBUSY) */
} kvr_select_candidate_t;

typedef struct kvr_select_request {
    uint64_t isl_tokens;               /* prompt length; 0 is allowed (load-based pick) */
    uint64_t request_blocks;           /* 0 = ceil(isl_tokens / block_size) */
    uint32_t block_size;               /* > 0 */
    bool track_prefill_tokens;         /* router_track_prefill_tokens after the override */
    bool has_pinned;                   /* pinned: that rank or an error, never another */
    kvr_worker_t pinned;
    bool has_preferred;                /* preferred (session affinity): that rank if eligible */
    kvr_worker_t preferred;
    bool has_allowed;                  /* false: every worker id is allowed */
    const uint64_t *allowed_ids;       /* ascending (repeats allowed) */
    size_t n_allowed;
    const char *const *required_taints;/* a worker must carry all of them */
    size_t n_required;
    const kvr_taint_weight_t *preferred_taints;
    size_t n_preferred;
    const kvr_select_override_t *ovr;  /* NULL = none */
    const kvr_select_candidate_t *cands;
    size_t n_cands;
} kvr_select_request_t;

/* Why a candidate was (not) eligible, in the order the filters are applied. */
typedef enum kvr_select_why {
    KVR_SELECT_ELIGIBLE = 0,
    KVR_SELECT_FENCED = 1,        /* dead or deregistered */
    KVR_SELECT_NOT_ALLOWED = 2,   /* not in allowed_ids */
    KVR_SELECT_MISSING_TAINT = 3, /* lacks a required taint */
    KVR_SELECT_BUSY = 4,          /* eligible but for load */
    KVR_SELECT_NOT_PINNED = 5,    /* eligible, but another rank is pinned or preferred */
    KVR_SELECT_OTHER_MODEL = 6,   /* serves another model, or lacks the request's adapter */
} kvr_select_why_t;

const char *kvr_select_why_name(kvr_select_why_t why);

/* Per-candidate breakdown of a decision (every term is computed, eligible or not). */
typedef struct kvr_select_explain {
    kvr_select_why_t why;
    double effective_overlap_blocks; /* device + host_w * host + disk_w * disk */
    uint64_t cached_tokens;          /* round(effective_overlap_blocks * block_size) */
    double raw_prefill_blocks;       /* prefill tokens (tracker + prompt) / block_size */
    double decay;                    /* device-credit decay in (0, 1] */
    double overlap_credit_blocks;
    double adjusted_prefill_blocks;  /* max(raw - credit, 0) (locality: + the step wait's) */
    double step_wait_blocks;         /* locality: step_wait_weight * the candidate's wait */
    double prefill_cost;             /* prefill_load_scale * adjusted (default policy) */
    double decode_cost_blocks;
    double active_request_cost;
    double logit;                    /* unbiased cost */
    double preferred_weight;         /* sum of preferred-taint weights the worker carries */
    double bias;                     /* tanh(preferred_weight) */
    double cost;                     /* logit * exp(-bias): what the pick compares */
    double probability;              /* of being picked by this call */
} kvr_select_explain_t;

typedef struct kvr_select_result {
    size_t index;                    /* into cands; SIZE_MAX when nothing was picked */
    kvr_worker_t worker;
    double cost;                     /* biased cost; the unbiased logit for pinned/preferred */
    double effective_overlap_blocks;
    uint64_t cached_tokens;
    uint64_t request_blocks;
    size_t n_eligible;               /* candidates passing every filter */
    size_t n_busy;                   /* candidates excluded only for load */
    size_t n_queue_busy;             /* eligible candidates over the queue threshold */
    const char *field;               /* KVR_EINVAL: the offending field */
} kvr_select_result_t;

void kvr_select_config_default(kvr_select_config_t *cfg);
/* KVR_OK, or KVR_EINVAL naming the field (NaN, Inf, negative, out of range) in *field. */
int kvr_select_config_validate(const kvr_select_config_t *cfg, const char **field);
int kvr_select_override_validate(const kvr_select_override_t *ovr, const char **field);
/* out = base with ovr applied (ovr may be NULL); both validated, out only written on KVR_OK. */
int kvr_select_config_merge(const kvr_select_config_t *base, const kvr_select_override_t *ovr,
                            kvr_select_config_t *out, const char **field);

/* Picks a candidate. cfg NULL = defaults; explain NULL or req->n_cands entries (caller-owned).
 * Returns KVR_OK; KVR_ENOTALLOWED (pinned rank outside allowed_ids or missing a required
 * taint); KVR_ENOWORKER (nothing eligible even ignoring load; pinned rank absent or fenced);
 * KVR_EBUSY (something would be eligible but for load; or the pinned rank is busy);
 * KVR_EINVAL (out->field names it). No allocation; O(n_cands) for bounded taint lists. */
int kvr_select(const kvr_select_config_t *cfg, const kvr_select_request_t *req, kvr_rng_t *rng,
               kvr_select_result_t *out, kvr_select_explain_t *explain);

/* Busy test of one rank (reference 5.8; with prefill_frac = router_queue_threshold it is
 * 5.7's "busy for queueing"). A rank is busy if ANY set threshold is exceeded. */
#define KVR_DEFAULT_MAX_BATCHED_TOKENS 10000000u

typedef struct kvr_busy_thresholds {
    bool has_prefill_tokens;    /* active_prefill_tokens_threshold (absolute) */
    uint64_t prefill_tokens;
    bool has_prefill_frac;      /* active_prefill_tokens_threshold_frac: finite >= 0 */
    double prefill_frac;        /* of max_num_batched_tokens */
    bool has_decode_frac;       /* active_decode_blocks_threshold: finite >= 0 */
    double decode_frac;         /* of total_kv_blocks */
} kvr_busy_thresholds_t;

typedef struct kvr_busy_load {
    uint64_t active_prefill_tokens;
    uint64_t max_num_batched_tokens; /* 0 = unknown: KVR_DEFAULT_MAX_BATCHED_TOKENS */
    uint64_t used_blocks;            /* worker-published kv_used_blocks or tracked decode blocks */
    uint64_t total_kv_blocks;        /* 0 = unknown: the decode test is skipped */
} kvr_busy_load_t;

int kvr_busy_thresholds_validate(const kvr_busy_thresholds_t *t, const char **field);
bool kvr_busy(const kvr_busy_thresholds_t *t, const kvr_busy_load_t *load);

/* -- Queue (core/queue.c), reference 5.7. -------------------------------------------------- */

typedef enum kvr_queue_order {
    KVR_QUEUE_ORDER_FCFS = 0, /* max(priority_jump, 0) - arrival_offset_secs */
    KVR_QUEUE_ORDER_WSPT = 1, /* (1 + max(priority_jump, 0)) / cost_tokens */
    KVR_QUEUE_ORDER_LCFS = 2, /* max(priority_jump, 0) + arrival_offset_secs */
} kvr_queue_order_t;

#define KVR_QUEUE_MAX_CAPACITY ((size_t)1 << 20)

typedef struct kvr_queue_config {
    size_t capacity;                 /* max queued requests, memory fixed at creation; [2, 2^20] */
    uint64_t max_pending_isl_tokens; /* 0 = unlimited */
    kvr_queue_order_t order;       /* router_queue_policy */
} kvr_queue_config_t;

/* What the caller queues (copied in). */
typedef struct kvr_queue_item {
    uint64_t isl_tokens;
    uint64_t cost_tokens;     /* wspt: uncached tokens on the best eligible worker (0 reads 1) */
    double priority_jump;     /* finite; seconds of head start (fcfs, lcfs), weight (wspt) */
    uint32_t strict_priority; /* higher tiers always dispatch first */
    uint64_t timeout_ms;      /* queue deadline = enqueue time + timeout; 0 = none */
    void *user;               /* opaque, returned as given */
} kvr_queue_item_t;

/* Names one queued request; stale handles (dispatched, expired, removed) are detected. Never 0. */
typedef uint64_t kvr_queue_handle_t;

typedef struct kvr_queue_entry {
    kvr_queue_item_t item;
    kvr_queue_handle_t handle;
    uint64_t seq;            /* enqueue order */
    uint64_t enqueued_ms;
    uint64_t deadline_ms;    /* UINT64_MAX = none */
    double score;            /* policy_score */
} kvr_queue_entry_t;

typedef struct kvr_queue_stats {
    uint64_t pending;            /* gauge */
    uint64_t pending_isl_tokens; /* gauge */
    uint64_t enqueued, dispatched, rejected, expired, cancelled;
} kvr_queue_stats_t;

typedef struct kvr_queue kvr_queue_t;

int kvr_queue_config_validate(const kvr_queue_config_t *cfg, const char **field);
/* NULL and *status = KVR_EINVAL / KVR_ENOMEM on failure. */
kvr_queue_t *kvr_queue_new(const kvr_queue_config_t *cfg, int *status);
void kvr_queue_free(kvr_queue_t *q);
/* Runtime limits (e.g. per-worker limits times discovered workers): max_requests in
 * [1, capacity] (0 = capacity), max_pending_isl_tokens 0 = unlimited. KVR_ERANGE otherwise. */
int kvr_queue_set_limits(kvr_queue_t *q, size_t max_requests, uint64_t max_pending_isl_tokens);
/* KVR_OK (handle may be NULL); KVR_EQUEUEFULL (counted in rejected) when max_requests are
 * queued or the pending ISL tokens already reach their limit (the crossing request is accepted);
 * KVR_EINVAL (priority_jump not finite). */
int kvr_queue_push(kvr_queue_t *q, const kvr_queue_item_t *item, uint64_t now_ms,
                   kvr_queue_handle_t *handle);
/* The best entry: higher (strict_priority, score), then earlier seq. KVR_ENOTFOUND if empty. */
int kvr_queue_peek(const kvr_queue_t *q, kvr_queue_entry_t *out);
int kvr_queue_pop(kvr_queue_t *q, kvr_queue_entry_t *out);              /* counts dispatched */
int kvr_queue_remove(kvr_queue_t *q, kvr_queue_handle_t h, kvr_queue_entry_t *out); /* cancelled */
/* Pops one entry whose deadline is <= now_ms (earliest first); KVR_ENOTFOUND when none. */
int kvr_queue_expire(kvr_queue_t *q, uint64_t now_ms, kvr_queue_entry_t *out);
uint64_t kvr_queue_next_deadline(const kvr_queue_t *q); /* UINT64_MAX when none */
size_t kvr_queue_len(const kvr_queue_t *q);
void kvr_queue_stats(const kvr_queue_t *q, kvr_queue_stats_t *out);
/* Checks both heaps, handles, free list, gauges and counters; KVR_EINVAL with msg otherwise. */
int kvr_queue_verify(const kvr_queue_t *q, char *msg, size_t msg_len);

/* ------------------------------------------------------------------------------------------ */
/* Router configuration (core/config.c).                                                       */
/* [section owned by the configuration] */

#ifdef __cplusplus
}
#endif
#endif /* KVROUTER_H */

/*
 * kvcache.h: the simulated engine's paged KV cache with prefix caching (the block manager of
 * `kvrouter mocker` and `kvrouter sim`), after vLLM V1's KVCacheManager / BlockPool.
 *
 * Model. num_blocks physical blocks of block_size tokens. A block is
 *   - free:     refcount 0, no hash; in the free queue;
 *   - cached:   refcount 0, holds a full block's sequence hash; in the free queue (evictable)
 *               and in the prefix table (a later request can hit it);
 *   - active:   refcount >= 1 (held by running sequences); with a hash when it is full and
 *               committed, without one while it is the sequence's partial last block.
 * Sequence hashes are the router's (core/hash.c: XXH3 seed 1337, chained), so the prefix
 * table answers exactly what the router's index would for the same tokens.
 *
 * Free queue (vLLM's FreeKVCacheBlockQueue): one doubly linked list of every refcount-0 block.
 * It starts as blocks 0 .. num_blocks-1 in id order. Allocation pops the head; a popped cached
 * block is evicted (its hash leaves the prefix table and a REMOVED event is emitted).
 * release() walks a sequence's blocks last to first and puts each that reaches refcount 0 at
 * the tail if hashed (leaf first, so a chain's tail is evicted before its prefix), at the head
 * if not (reused first, it caches nothing). A prefix hit on a cached block takes it out of
 * the queue (refcount 1). So eviction is least-recently-released first, leaves before parents.
 *
 * Logical presence. One hash is held by at most one block: when a sequence commits a full block
 * whose hash is already cached (two requests prefilled the same prefix at once), the sequence
 * switches to the existing block and its own copy goes back to the free queue (at the head,
 * unhashed: it was never in the table). Hence STORED is
 * emitted exactly when a hash appears in the prefix table and REMOVED exactly when it leaves,
 * and replaying the events into an empty prefix index gives the table's hashes.
 *
 * Events go to the sink synchronously, in the order the changes happen: the evictions of one
 * allocate() as one REMOVED event (before that call returns), the new hashes of one commit() as
 * one STORED event per contiguous run (parent = the hash of the block before the run),
 * reset() as CLEARED. Without prefix caching nothing is emitted. Event pointers are valid only
 * during the callback; the cache is consistent then, and the sink must not modify it.
 *
 * All-or-nothing: allocate() either gets every block it needs or changes nothing (KVR_EBUSY).
 * Ownership: the cache owns the blocks and the prefix table; a sequence's block table
 * (kvr_kvcache_seq_t) is embedded in the caller's request and owned by the caller, and must be
 * released before it is deinitialised. Threads: one thread. Memory: O(num_blocks), allocated at
 * creation; a sequence's table grows geometrically (the only allocation after creation).
 * Cost: match O(blocks matched); allocate O(blocks allocated + hits); commit O(blocks
 * committed), plus one pass over the sequence's committed blocks when a hash it commits is held
 * by an active block (to reject a hash repeated inside the sequence); release O(blocks held); the prefix table is open addressing at load <= 1/2.
 */
#ifndef KVR_CORE_KVCACHE_H
#define KVR_CORE_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_kvcache_config {
    uint32_t num_blocks;  /* >= 1 */
    uint32_t block_size;  /* tokens per block, >= 1 */
    bool prefix_caching;  /* false: no hits, commit() records nothing, no events */
} kvr_kvcache_config_t;

typedef enum kvr_kvcache_event_kind {
    KVR_KVC_STORED = 0,
    KVR_KVC_REMOVED,
    KVR_KVC_CLEARED,
} kvr_kvcache_event_kind_t;

typedef struct kvr_kvcache_event {
    kvr_kvcache_event_kind_t kind;
    const uint64_t *hashes; /* STORED: the run, root -> leaf; REMOVED: the evicted hashes */
    size_t n_hashes;
    bool has_parent;        /* STORED: false when hashes[0] is the sequence's first block */
    uint64_t parent;        /* STORED: the sequence hash of the block before hashes[0] */
    const uint32_t *tokens; /* STORED: n_hashes * block_size tokens */
    const char *lora_name;  /* STORED: the sequence's adapter (NULL = none) */
} kvr_kvcache_event_t;

typedef void (*kvr_kvcache_sink_fn)(void *ctx, const kvr_kvcache_event_t *ev);

/* A sequence's block table. */
typedef struct kvr_kvcache_seq {
    uint32_t *blocks;   /* physical block ids, position order */
    uint32_t n_blocks;  /* blocks held (each counted once in its refcount) */
    uint32_t cap;
    uint32_t n_full;    /* leading blocks committed (full, hashed, in the prefix table) */
    const char *lora_name; /* borrowed; named on its STORED events (its hashes are salted by
                              the caller); NULL = the base model */
} kvr_kvcache_seq_t;

typedef struct kvr_kvcache_stats {
    uint32_t num_blocks;
    uint32_t n_active;      /* refcount >= 1 */
    uint32_t n_cached;      /* hashes in the prefix table (active or not) */
    uint32_t n_free_queue;  /* refcount 0 (free or cached): what allocation can use */
    uint64_t stored_blocks; /* hashes that entered the prefix table */
    uint64_t removed_blocks;/* hashes evicted */
    uint64_t dedup_blocks;  /* commits that found their hash already cached */
    uint64_t resets;
    uint64_t cleared_blocks;/* hashes dropped by reset(): stored = removed + cleared + cached */
} kvr_kvcache_stats_t;

typedef struct kvr_kvcache kvr_kvcache_t;

/* NULL with *status = KVR_EINVAL (zero num_blocks / block_size) or KVR_ENOMEM. sink may be
 * NULL (no events). */
kvr_kvcache_t *kvr_kvcache_new(const kvr_kvcache_config_t *cfg, kvr_kvcache_sink_fn sink,
                               void *sink_ctx, int *status);
void kvr_kvcache_free(kvr_kvcache_t *kc);
/* A deep copy of src without its sink (the copy emits no events): the same blocks, queue and
 * table, so a sequence table of src names the same blocks in it. NULL with *status KVR_ENOMEM.
 * O(num_blocks). */
kvr_kvcache_t *kvr_kvcache_clone(const kvr_kvcache_t *src, int *status);

void kvr_kvcache_seq_init(kvr_kvcache_seq_t *seq);
/* Frees the table's memory; the sequence must hold no blocks (release() first). */
void kvr_kvcache_seq_deinit(kvr_kvcache_seq_t *seq);

/* How many leading blocks of seq_hashes[0..n) the prefix table holds (no change). */
size_t kvr_kvcache_match(const kvr_kvcache_t *kc, const uint64_t *seq_hashes, size_t n);

/* Makes seq hold blocks for n_tokens tokens. When seq holds no blocks, its first n_hit blocks
 * are the cached blocks of seq_hashes[0..n_hit) (n_hit <= what match() returned; they count as
 * committed); n_hit must be 0 otherwise. New blocks come from the free queue head, evicting.
 * KVR_OK; KVR_EBUSY when the free queue (minus the hit blocks it holds) is too short: nothing
 * changed; KVR_EINVAL (n_hit > 0 with blocks held, a hit hash not cached or repeated, n_hit
 * full blocks more than n_tokens covers: n_hit * block_size > n_tokens; nothing changed);
 * KVR_ENOMEM (growth of seq's table; nothing changed). */
int kvr_kvcache_allocate(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq, const uint64_t *seq_hashes,
                         size_t n_hit, uint64_t n_tokens);

/* What allocate() would take from the free queue for this request, beyond what seq holds: the
 * new blocks plus the hit blocks that sit in the queue (refcount 0). So allocate() succeeds iff
 * blocks_needed() <= kvr_kvcache_n_free() (UINT64_MAX for arguments allocate() rejects with
 * KVR_EINVAL). For admission checks without side effects. */
uint64_t kvr_kvcache_blocks_needed(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *seq,
                                   const uint64_t *seq_hashes, size_t n_hit, uint64_t n_tokens);
uint32_t kvr_kvcache_n_free(const kvr_kvcache_t *kc);

/* Commits seq's blocks [seq->n_full, n_full) as full: seq_hashes and tokens are the whole
 * sequence's (block i = seq_hashes[i], tokens[i*bs .. (i+1)*bs)). New hashes enter the prefix
 * table (STORED); a hash already there is shared instead (the duplicate block is freed).
 * KVR_EINVAL (nothing changed) when n_full exceeds the blocks held or is below seq->n_full,
 * seq_hashes or tokens is NULL, or a hash to commit repeats inside the sequence (a collision:
 * sharing it would hold one block twice). Without prefix caching only seq->n_full moves. */
int kvr_kvcache_commit(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq, const uint64_t *seq_hashes,
                       const uint32_t *tokens, size_t n_full);

/* Drops every block seq holds (refcounts down; see the free queue order above). */
void kvr_kvcache_release(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq);

/* vLLM's reset_prefix_cache: forgets every cached hash and emits CLEARED. Only when no block is
 * active (KVR_EBUSY otherwise, nothing changed). */
int kvr_kvcache_reset(kvr_kvcache_t *kc);

void kvr_kvcache_get_stats(const kvr_kvcache_t *kc, kvr_kvcache_stats_t *out);
/* Fraction of blocks active, in [0, 1] (vLLM's kv_cache_usage). */
double kvr_kvcache_usage(const kvr_kvcache_t *kc);
uint32_t kvr_kvcache_block_size(const kvr_kvcache_t *kc);

/* The prefix table's hashes into out (up to cap, any order); returns how many there are. */
size_t kvr_kvcache_cached_hashes(const kvr_kvcache_t *kc, uint64_t *out, size_t cap);

/* Checks every invariant (refcounts = table references given the sequences passed, queue
 * links and membership, table <-> block hash agreement, counters). seqs may be NULL when the
 * caller cannot list them (refcounts then only checked for consistency with the queue).
 * KVR_OK, KVR_EINVAL (the first violation named in msg by _verify_msg) or KVR_ENOMEM. */
int kvr_kvcache_verify(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *const *seqs,
                       size_t n_seqs);
int kvr_kvcache_verify_msg(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *const *seqs,
                           size_t n_seqs, char *msg, size_t msg_len);

#endif /* KVR_CORE_KVCACHE_H */

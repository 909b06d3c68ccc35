/*
 * kv_events.h: decoder for engine KV-event batches (the payload frame of a ZMQ message
 * [topic, seq u64 BE, payload] from vLLM, SGLang or the kvrouter mocker), and their conversion
 * to prefix-index events (wire layer: bytes in, structs out, no I/O).
 *
 * Accepted (docs/wire-formats.md 1.3-1.7, 2, 3):
 *   batch   [ts, events] | [ts, events, dp_rank|nil] (extra trailing elements ignored), or a map
 *           {ts, events, data_parallel_rank | attn_dp_rank | dp_rank}; ts float64/float32/int/nil
 *   event   positional [tag, ...] of any vLLM/SGLang length (trailing extras ignored), or a map
 *           {"type": tag, ...} (keys by name, any order, unknown keys ignored, missing = nil)
 *   tags    BlockStored, BlockRemoved, AllBlocksCleared; anything else decodes as
 *           KVR_KV_IGNORED (counted, not an error)
 *   hashes  signed/unsigned ints -> u64 two's complement; bin -> its last 8 bytes big-endian
 *   tokens  ints in [0, 2^32), or EAGLE pairs [[a, b], ...] -> firsts + last second, is_eagle
 *   medium  -> kvr_tier_t (see kvr_kv_tier_from_medium); locality REMOTE/unknown -> remote
 *   positional tail: group_idx (BlockStored [9], BlockRemoved [3]) is read when it is an
 *           integer and skipped otherwise (Dynamo reads that tail by type); BlockRemoved [4] is
 *           locality in vLLM's declaration but a spec kind in Dynamo's, so only "REMOTE" drops
 *           the event there; everywhere else locality is strict (REMOTE or unknown = remote)
 *
 * Failure model: a payload that cannot be framed as a batch (not msgpack, truncated, wrong
 * outer shape, trailing bytes, containers nested deeper than 32, msgpack-c's limit, a cap
 * exceeded at batch level) fails kvr_kv_events_decode() with
 * d->err naming the problem; the caller treats it as a gap. An event that is well-formed
 * msgpack but not a valid event gets its own status and message; its batch-mates still decode
 * (one bad event never drops a batch: the failure of Dynamo PR #14530).
 *
 * Ownership: the decoder owns every output (events, their hashes, tokens, names, messages and
 * conversion results); they stay valid until the next decode or kvr_kv_events_deinit(). The
 * payload is borrowed for the call only (names are copied).
 * Memory: buffers grow geometrically to the largest batch seen and are reused, so decoding and
 * converting allocate nothing in steady state. Every declared length is checked against the
 * bytes left before anything is reserved, and the limits cap what a batch may ask for; each
 * buffer stays below a small multiple of the largest accepted payload.
 * Threads: one decoder per thread; distinct decoders are independent.
 * Cost: one pass over the payload, no recursion, no per-value allocation; conversion is one
 * XXH3 per block (kvr_hash_blocks). Measured (2-core EPYC VM, best of 30): decode + convert of
 * one BlockStored of 32 blocks x 16 tokens 32 ns/block (map era 36); SGLang's one event per
 * 16-token page 84 ns/block.
 */
#ifndef KVR_WIRE_KV_EVENTS_H
#define KVR_WIRE_KV_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

#define KVR_KV_MAX_PAYLOAD_BYTES ((size_t)64 << 20)
#define KVR_KV_MAX_EVENTS ((size_t)1 << 16)
#define KVR_KV_MAX_TOKENS ((size_t)1 << 21)
#define KVR_KV_MAX_HASHES ((size_t)1 << 17)
#define KVR_KV_MAX_EXTRA_KEYS (1 << 16) /* extra_keys strings in one batch */

typedef struct kvr_kv_limits {
    size_t max_payload_bytes;  /* bytes per payload (batch error) */
    size_t max_events;         /* events per batch (batch error) */
    size_t max_tokens;         /* token ids per event (event error) */
    size_t max_hashes;         /* block hashes per event (event error) */
} kvr_kv_limits_t;

typedef enum kvr_kv_kind {
    KVR_KV_STORED = 0,
    KVR_KV_REMOVED = 1,
    KVR_KV_CLEARED = 2,
    KVR_KV_IGNORED = 3,  /* unknown tag (or Dynamo's "Ignored"); also any event whose tag
                            could not be read (then status is an error) */
} kvr_kv_kind_t;

/* One decoded event. Check status first: the other fields are meaningful only when it is
 * KVR_OK. */
typedef struct kvr_kv_event {
    kvr_kv_kind_t kind;
    int status;                /* KVR_OK, KVR_EPARSE, KVR_ERANGE or KVR_ETOOBIG */
    const char *err;           /* "" when status is KVR_OK, else one line naming the field */
    const uint64_t *hashes;    /* STORED (root -> leaf) and REMOVED: engine block hashes */
    size_t n_hashes;
    bool has_parent;           /* STORED: false = the chain starts at the root */
    uint64_t parent;
    const uint32_t *tokens;    /* STORED: every block's tokens, concatenated (pairs unfolded) */
    size_t n_tokens;
    uint32_t block_size;       /* STORED: tokens per block as the engine says; 0 otherwise */
    kvr_tier_t tier;           /* STORED and REMOVED */
    bool has_group_idx;        /* vLLM hybrid models: the emitting KV-cache group */
    uint32_t group_idx;
    bool is_eagle;             /* tokens came as EAGLE pairs (or "is_eagle": true) */
    bool remote;               /* locality REMOTE or unknown: not to be applied */
    bool unknown_medium;       /* medium not recognised: taken as the device tier */
    const char *lora_name;     /* NULL = none (empty strings count as none) */
    size_t lora_name_len;
    const char *cache_salt;    /* NULL = none; vLLM "cache_salt" key or SGLang metadata */
    size_t cache_salt_len;
    const struct kvr_kv_extra_key *extra_keys; /* STORED: vLLM extra_keys' string keys, in */
    size_t n_extra_keys;                       /* block order (NULL / 0 when none) */
} kvr_kv_event_t;

/* One string of a block's vLLM extra_keys: bare (an mm digest, a LoRA name or a cache salt,
 * told apart at conversion) or tagged (the first of a [string, offset] pair: an mm object). */
typedef struct kvr_kv_extra_key {
    uint32_t block;
    bool tagged;
    const char *s; /* NUL-terminated */
    size_t len;
} kvr_kv_extra_key_t;

/* Per-batch tallies (of the last decode). */
typedef struct kvr_kv_counts {
    size_t errors;          /* events with status != KVR_OK */
    size_t ignored;         /* KVR_KV_IGNORED events with status KVR_OK */
    size_t remote;          /* decoded events with remote set */
    size_t unknown_medium;  /* decoded events with unknown_medium set */
} kvr_kv_counts_t;

/* Cumulative counters, monotonic, for /metrics. */
typedef struct kvr_kv_stats {
    uint64_t batches, batch_errors;
    uint64_t events, event_errors, events_ignored, events_remote, warn_unknown_medium;
    uint64_t converted;               /* kvr_event_t values produced */
    uint64_t convert_mismatch;        /* block size differs from the router's */
    uint64_t convert_short_tokens;    /* token_ids too short for the blocks */
    uint64_t warn_extra_tokens;       /* token_ids longer than the blocks need (converted) */
} kvr_kv_stats_t;

typedef struct kvr_kv_events {
    /* Results of the last decode (valid after KVR_OK; empty after an error). */
    double ts;                 /* seconds; 0 when absent */
    bool has_ts;
    bool has_dp_rank;          /* the batch names its rank (vLLM >= 0.9.1, SGLang) */
    uint32_t dp_rank;
    kvr_kv_event_t *events;
    size_t n_events;
    kvr_kv_counts_t counts;
    char err[256];             /* the batch-level error, "" after success */
    char conv_err[192];        /* the last conversion error, "" after success */

    /* Settings: kvr_kv_events_init() sets the KVR_KV_MAX_* defaults; lower them freely. */
    kvr_kv_limits_t limits;
    kvr_kv_stats_t stats;

    /* private */
    struct kvr_kv_offs *offs;  /* per event: offsets into the buffers below */
    size_t ev_cap;
    uint32_t *tok_buf;
    size_t tok_cap, n_tok;
    uint64_t *hash_buf;
    size_t hash_cap, n_hash;
    char *str_buf;             /* names and messages, NUL-terminated, back to back */
    size_t str_cap, n_str;
    kvr_block_t *blk_buf;      /* conversion scratch */
    uint64_t *lbh_buf;
    size_t blk_cap;
    kvr_kv_extra_key_t *xk_buf; /* every event's extra keys (s: an offset in str_buf until the
                                   decode ends) */
    size_t xk_cap, n_xk;
    kvr_block_mm_t *mm_buf; /* conversion scratch: a stored event's multimodal blocks */
    uint64_t *mmh_buf;
    size_t mm_cap, mmh_cap;
} kvr_kv_events_t;

void kvr_kv_events_init(kvr_kv_events_t *d);
void kvr_kv_events_deinit(kvr_kv_events_t *d);

/* Decodes one payload. Returns KVR_OK (events decoded; some may carry their own error
 * status) or a batch-level error with d->err set: KVR_EPARSE (not a batch: invalid msgpack,
 * truncated, wrong shape, trailing bytes), KVR_ERANGE (dp_rank out of range), KVR_ETOOBIG (a
 * batch limit exceeded), KVR_ENOMEM, KVR_EINVAL (NULL payload with len > 0). */
int kvr_kv_events_decode(kvr_kv_events_t *d, const void *payload, size_t len);

/* Where converted events go. */
typedef struct kvr_kv_target {
    kvr_worker_t worker;   /* worker id, and the dp_rank used when the batch names none */
    uint32_t block_size;   /* the router's block size */
    uint64_t event_id;     /* copied into each event (the batch's ZMQ seq) */
} kvr_kv_target_t;

/* Converts d->events[i] of the last successful decode into *out for kvr_index_apply().
 * STORED: block j's local hash is recomputed from tokens [j*bs, j*bs + bs (+1 with Eagle)) by
 * kvr_hash_blocks with the event's lora_name and cache_salt; ext = the engine hash; parent =
 * the engine's parent hash. Repeated hashes are passed through (the index rejects them).
 * Returns 1 (out is ready; its blocks stay valid until the next convert or decode), 0 (nothing
 * to apply: an ignored tag or a remote event), or a negative status with d->conv_err set:
 * the event's own decode status; KVR_EMISMATCH (the event's block_size is not the router's:
 * nothing produced, the worker's index can no longer be trusted); KVR_ERANGE (token_ids too
 * short for the blocks); KVR_ENOMEM; KVR_EINVAL (bad arguments, i out of range). */
int kvr_kv_events_convert(kvr_kv_events_t *d, size_t i, const kvr_kv_target_t *t,
                          kvr_event_t *out);

/* The tier of a medium string (len bytes, ASCII case-insensitive). NULL or "" -> device.
 * GPU DEVICE -> device; CPU CPU_PINNED CPU_TIER1 -> host; CPU_TIER2 DISK NVME STORAGE FS OBJ ->
 * disk; EXTERNAL NETWORK REMOTE SHARED -> external; anything else -> device with *known false. */
kvr_tier_t kvr_kv_tier_from_medium(const char *s, size_t len, bool *known);

#endif /* KVR_WIRE_KV_EVENTS_H */

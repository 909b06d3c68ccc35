/*
 * kv_encode.h: encoder of engine KV-event batches, byte for byte as the engines publish them
 * (the payload frame of [topic, seq u64 BE, payload]; docs/wire-formats.md 1.3-1.6
 * and 2). The inverse of kv_events.h; the kvrouter mocker and the event benchmarks publish
 * with it, so a router cannot tell them from a real engine.
 *
 * Formats (kvr_kv_format_t):
 *   VLLM_ARRAY  vLLM 0.9.1 up to PR #42892: batch [ts, events, dp_rank|nil]; each event a
 *               positional array, tag first. BlockStored has 7 elements (through medium) and
 *               grows to the last optional field given, as the vLLM version that added it
 *               sends: lora_name 8, extra_keys 9, group_idx 10, kv-spec fields 12, locality 13
 *               (fields in between are nil). BlockRemoved: 3 (through medium), group_idx 4,
 *               locality 5. AllBlocksCleared: [tag].
 *   VLLM_MAP    vLLM >= 0.26 (PR #42892): the batch stays an array; each event is a map whose
 *               keys are "type" then the fields in declaration order; fields without a default
 *               are always present (BlockStored: block_hashes, parent_block_hash, token_ids,
 *               block_size, lora_id, medium, lora_name; BlockRemoved: block_hashes, medium),
 *               the defaulted ones only when set (msgspec omit_defaults).
 *   VLLM_V090   vLLM 0.9.0: batch [ts, events] (no rank); BlockStored 6 elements (no medium),
 *               BlockRemoved 2.
 *   SGLANG      SGLang (array era): batch [ts, events, attn_dp_rank|nil]; BlockStored
 *               [tag, hashes, parent, tokens, block_size, lora_id, medium] plus element 7, the
 *               metadata map {"cache_salt": s}, only when salted; BlockRemoved [tag, hashes,
 *               medium]. Hashes are int64 on the wire: values >= 2^63 are sent as negative ints.
 * Every value takes msgspec's smallest encoding (fixint/u8/u16/u32/u64, negative fixint/i8..i64,
 * fixstr/str8/str16, fixarray/array16, float64 for ts), which is what msgpack-c's packer writes.
 * per_page (any format): a store of n blocks is sent as n one-block events chained by parent,
 * and a removal of n hashes as n events (as SGLang emits them).
 *
 * A field the chosen format cannot carry (lora_name in VLLM_V090/SGLANG, cache_salt outside
 * SGLANG, the later vLLM fields outside VLLM_ARRAY/MAP, medium in VLLM_V090) is KVR_EINVAL, not
 * silently dropped. An add that fails leaves the batch as it was.
 *
 * Ownership: the encoder owns its buffer; the bytes returned by kvr_kv_enc_end_batch() stay
 * valid until the next begin_batch or kvr_kv_enc_free(). Arguments are borrowed for the call.
 * Memory: one buffer (msgpack_sbuffer) that grows geometrically to the largest batch and is
 * reused, so a warm encoder allocates nothing per batch.
 * Threads: one encoder per thread.
 * Cost: one pass writing each value once, O(bytes out); the batch header is written last into
 * room reserved in front of the events (no copy of the events).
 */
#ifndef KVR_WIRE_KV_ENCODE_H
#define KVR_WIRE_KV_ENCODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvr_kv_format {
    KVR_KV_FMT_VLLM_ARRAY = 0,
    KVR_KV_FMT_VLLM_MAP = 1,
    KVR_KV_FMT_VLLM_V090 = 2,
    KVR_KV_FMT_SGLANG = 3,
} kvr_kv_format_t;

typedef struct kvr_kv_enc_config {
    kvr_kv_format_t format;
    bool per_page;  /* one event per block (SGLang's granularity) */
} kvr_kv_enc_config_t;

/* One BlockStored. Strings are NUL-terminated; NULL = nil (or absent where the format omits
 * defaults). Unset optional fields cost nothing on the wire. */
typedef struct kvr_kv_enc_stored {
    const uint64_t *hashes;       /* engine block hashes, root -> leaf */
    size_t n_hashes;
    bool has_parent;              /* false: parent_block_hash nil (the chain starts at the root) */
    uint64_t parent;
    const uint32_t *tokens;       /* every block's tokens, concatenated */
    size_t n_tokens;
    uint32_t block_size;
    const char *medium;           /* "GPU", "CPU", ...; NULL = nil */
    const char *lora_name;        /* vLLM >= 0.15 (array: 8 elements) */
    bool has_lora_id;             /* the deprecated lora_id; nil otherwise */
    int64_t lora_id;
    /* later vLLM fields (VLLM_ARRAY, VLLM_MAP) */
    bool extra_keys_nil;          /* extra_keys = one nil per block (what v0.2x sends) */
    bool has_group_idx;
    uint32_t group_idx;
    const char *spec_kind;        /* kv_cache_spec_kind, e.g. "full_attention" */
    bool has_sliding_window;
    uint32_t sliding_window;      /* kv_cache_spec_sliding_window */
    const char *locality;         /* "LOCAL" / "REMOTE" */
    /* SGLang */
    const char *cache_salt;       /* BlockStoredWithMetadata: element 7 = {"cache_salt": s} */
} kvr_kv_enc_stored_t;

typedef struct kvr_kv_enc_removed {
    const uint64_t *hashes;
    size_t n_hashes;
    const char *medium;           /* NULL = nil */
    bool has_group_idx;           /* VLLM_ARRAY, VLLM_MAP */
    uint32_t group_idx;
    const char *locality;         /* VLLM_ARRAY, VLLM_MAP */
} kvr_kv_enc_removed_t;

typedef struct kvr_kv_enc kvr_kv_enc_t;

/* NULL and *status = KVR_EINVAL (unknown format) or KVR_ENOMEM on failure. */
kvr_kv_enc_t *kvr_kv_enc_new(const kvr_kv_enc_config_t *cfg, int *status);
void kvr_kv_enc_free(kvr_kv_enc_t *e);

/* Starts a batch (discarding any unfinished one). ts: seconds (time.time()). Without a rank
 * the third element is nil (VLLM_ARRAY, VLLM_MAP, SGLANG); VLLM_V090 never has one. */
int kvr_kv_enc_begin_batch(kvr_kv_enc_t *e, double ts, bool has_dp_rank, uint32_t dp_rank);

/* Each appends one event (per_page: n). KVR_OK; KVR_EINVAL (no batch begun, NULL arrays with
 * a length, a field the format cannot carry, per_page with n_tokens != n * block_size);
 * KVR_ENOMEM. On error the batch is unchanged. */
int kvr_kv_enc_add_stored(kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s);
int kvr_kv_enc_add_removed(kvr_kv_enc_t *e, const kvr_kv_enc_removed_t *r);
int kvr_kv_enc_add_cleared(kvr_kv_enc_t *e);

/* Events in the batch so far. */
size_t kvr_kv_enc_n_events(const kvr_kv_enc_t *e);

/* Finishes the batch: *bytes, *len = the payload (valid until the next begin_batch or free).
 * KVR_EINVAL if no batch was begun; KVR_ENOMEM. */
int kvr_kv_enc_end_batch(kvr_kv_enc_t *e, const uint8_t **bytes, size_t *len);

/* The sequence frame: seq as 8 bytes big-endian. */
void kvr_kv_enc_seq(uint64_t seq, uint8_t out[8]);

#endif /* KVR_WIRE_KV_ENCODE_H */

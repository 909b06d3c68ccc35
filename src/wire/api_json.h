/*
 * api_json.h: decoders for the bodies of kvrouter's JSON HTTP API, and encoders for the same
 * shapes (wire layer: bytes in, structs out, no I/O).
 *
 *   POST /v1/route                      kvr_api_decode_route          kvr_api_route_t
 *   POST /v1/requests/{id}/output_block kvr_api_decode_output_block   kvr_api_output_block_t
 *   POST /v1/query, POST /v1/loads      kvr_api_decode_query / _loads kvr_api_query_t
 *   POST /v1/workers                    kvr_api_decode_worker         kvr_api_worker_t
 *   POST /router (tagged by "method")   kvr_api_decode_router         kvr_api_router_t
 *
 * Rules common to every body:
 *   - the body is one JSON object (output_block: or empty / whitespace only);
 *   - unknown keys are ignored at any level, whatever their value (nesting capped at
 *     KVR_API_MAX_DEPTH levels to bound the work); a known key given twice is an error;
 *   - null means absent for every field; a required field absent or null is an error;
 *   - integers are read from their text: exact u64 (no double rounding), "1.0" and "1e3"
 *     are not integers, "-0" is 0; other numbers must be finite after conversion (1e999 is
 *     rejected) and in the field's range;
 *   - strings are valid UTF-8 (yajl's check, then ours for what it lets through: overlong
 *     forms, surrogates, code points above U+10FFFF), escapes decoded, and contain no control
 *     characters (U+0000..U+001F, U+007F), so every string is also a safe C string.
 * Field ranges: tokens u32; worker ids u64; dp_rank, dp_start, expected_output_tokens and
 * strict_priority u32; dp_size [1, KVR_API_MAX_DP_SIZE] with dp_start + dp_size <= 2^32;
 * decay_fraction [0, 1]; priority_jump and taint weights finite; config_override:
 * overlap_score_credit, prefill_load_scale, router_temperature, overlap_score_weight finite
 * >= 0 and shared_cache_multiplier [0, 1]; max_num_batched_tokens and total_kv_blocks >= 1;
 * request_id 1..256 bytes; taints 1..128 bytes, at most 64 per list; lora_name and
 * cache_namespace at most 1024 bytes ("" reads as absent); url, events, replay 1..2048 bytes.
 *
 * Errors: KVR_EPARSE (not JSON, not an object, empty body), KVR_EINVAL (valid JSON but a
 * field is missing, duplicated, of the wrong type or out of range), KVR_ETOOBIG (more tokens,
 * ids or taints than the limits allow), KVR_ENOMEM. kvr_api_decoder_error() then gives one
 * line naming the field and the problem, fit to send verbatim as the OpenAI error message:
 *   "tokens[3]: not an integer in [0, 4294967295]", "pinned_worker.dp_rank: missing",
 *   "config_override.router_temperature: must be a finite number >= 0",
 *   "invalid JSON at byte 17: lexical error: invalid char in json text."
 * (no quotes, backslashes or control characters; user text is clipped and sanitised).
 * On error the output struct is zeroed.
 *
 * Ownership: the decoder owns every buffer the outputs point into (tokens, ids, strings,
 * taint arrays); they stay valid until the next decode call or kvr_api_decoder_free().
 * request_id is copied into the struct. The body is borrowed for the call only.
 * Memory: buffers grow to the largest body seen and are reused (yajl allocates from an arena
 * the decoder keeps), so steady-state decoding allocates nothing. Limits cap what one body
 * may ask for; exceeding one is an error, never a larger allocation.
 * Threads: one decoder per thread; distinct decoders are independent.
 * Cost: one pass. yajl alone reads ~25 ns per token; so a top-level "tokens" array is read by
 * a scanner instead (SSE2 masks of 64-byte windows, two count-trailing-zeros and a SWAR
 * multiply per token) while yajl parses the rest of the body around it, and confirms the
 * array is the top-level "tokens" value. Anything unusual in the array (signs, fractions,
 * exponents, leading zeros, values above u32, or an error anywhere in the body) sends the whole
 * body through yajl alone, with identical results and messages. Measured on a 2-core AMD EPYC
 * VM (~2 GHz effective): /v1/route with 1K tokens and the usual optional fields 4.4 us
 * (yajl alone 25 us), 128K tokens 0.46 ms (yajl alone 3.4 ms), a 16-token body 0.9 us.
 * Without SSE2 (or with KVR_API_NO_SIMD defined) the scanner reads one token at a time.
 */
#ifndef KVR_WIRE_API_JSON_H
#define KVR_WIRE_API_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"
#include "kvrouter/router.h"
#include "wire/json_writer.h"

#define KVR_API_MAX_TOKENS ((size_t)4 << 20)
#define KVR_API_MAX_ALLOWED_IDS ((size_t)4096)
#define KVR_API_MAX_TAINTS 64
#define KVR_API_MAX_MM_HASHES 4096 /* block_mm_infos' mm_hash values, in all */
#define KVR_API_MAX_TAINT_BYTES 128
#define KVR_API_MAX_REQUEST_ID_BYTES 256
#define KVR_API_MAX_NAME_BYTES 1024  /* lora_name, cache_namespace */
#define KVR_API_MAX_URL_BYTES 2048   /* url, events, replay */
#define KVR_API_MAX_DP_SIZE 4096u
#define KVR_API_MAX_DEPTH 64

typedef struct kvr_api_options {
    size_t max_tokens;      /* <= KVR_API_MAX_TOKENS */
    size_t max_allowed_ids; /* <= KVR_API_MAX_ALLOWED_IDS */
    bool no_fast_path;      /* yajl for the whole body (tests compare both paths) */
} kvr_api_options_t;

typedef struct kvr_api_decoder kvr_api_decoder_t;

/* POST /v1/route */
typedef struct kvr_api_route {
    const uint32_t *tokens;               /* NULL when n_tokens is 0 */
    size_t n_tokens;
    bool has_request_id;
    char request_id[KVR_API_MAX_REQUEST_ID_BYTES + 1];
    bool update_state;                    /* default true */
    bool disagg;                          /* both choices of a disaggregated fleet */
    const char *lora_name;                /* NULL when absent, null or "" */
    size_t lora_name_len;
    const char *cache_namespace;          /* NULL when absent, null or "" */
    size_t cache_namespace_len;
    bool has_allowed;                     /* allowed_worker_ids given: [] allows nobody */
    const uint64_t *allowed_ids;          /* ascending, repeats kept (as the selector wants) */
    size_t n_allowed;
    bool has_pinned;
    kvr_worker_t pinned;                  /* pinned_worker {worker_id, dp_rank}, both required */
    double priority_jump;                 /* default 0 */
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
    const char *const *required_taints;   /* routing_constraints.required_taints */
    size_t n_required;
    const kvr_taint_weight_t *preferred_taints; /* routing_constraints.preferred_taints */
    size_t n_preferred;
    bool has_override;                    /* config_override given (the has_ flags say what) */
    kvr_select_override_t ovr;            /* router_temperature -> ovr.temperature */
    bool has_assume_kv_reuse, assume_kv_reuse;
    bool has_track_prefill_tokens, track_prefill_tokens;
    const kvr_block_mm_t *mm; /* block_mm_infos (or mm_routing_info's): the blocks with */
    size_t n_mm;              /* multimodal objects, ascending; NULL / 0 when none */
    const char *model; /* the model pool; NULL when absent (any worker) */
    size_t model_len;
    const char *session_id; /* session_control.session_id; NULL = none */
    size_t session_id_len;
    bool session_close; /* session_control.action "close" (else "open") */
    uint32_t strict_priority; /* queue tiers above every priority_jump (as /router's); 0 none */
} kvr_api_route_t;

/* POST /v1/requests/{id}/output_block (the id is in the path) */
typedef struct kvr_api_output_block {
    bool has_decay_fraction;
    double decay_fraction;
} kvr_api_output_block_t;

/* POST /busy_threshold (the reference's): a model's busy thresholds; fields absent are kept,
 * both absent reads them back. model is required ("" names workers registered without one). */
typedef struct kvr_api_busy {
    const char *model;
    size_t model_len;
    bool has_prefill_tokens; /* active_prefill_tokens_threshold, >= 0 (at most 1e15) */
    double prefill_tokens;
    bool has_decode_frac; /* active_decode_blocks_threshold, >= 0 */
    double decode_frac;
} kvr_api_busy_t;

/* POST /v1/query and POST /v1/loads */
typedef struct kvr_api_query {
    const uint32_t *tokens;
    size_t n_tokens;
    const char *lora_name;
    size_t lora_name_len;
    const char *cache_namespace;
    size_t cache_namespace_len;
} kvr_api_query_t;

/* POST /v1/workers */
typedef struct kvr_api_worker {
    uint64_t worker_id;
    const char *url;                      /* NULL when absent */
    size_t url_len;
    const char *events;                   /* ZMQ KV-event endpoint; NULL when absent */
    size_t events_len;
    const char *replay;                   /* ZMQ replay endpoint; NULL when absent */
    size_t replay_len;
    uint32_t dp_size;                     /* default 1 */
    uint32_t dp_start;                    /* default 0 */
    const char *const *taints;
    size_t n_taints;
    bool has_max_num_batched_tokens;
    uint64_t max_num_batched_tokens;
    bool has_total_kv_blocks;
    uint64_t total_kv_blocks;
    bool eagle; /* default false */
    const char *model; /* NULL when absent, null or "" (any model) */
    size_t model_len;
    uint32_t block_size; /* 0 when absent (the router's) */
    const char *loras;   /* "a;b": its LoRA adapters; NULL when none */
    size_t loras_len;
    const char *tokenizer; /* its model's tokenizer folder; NULL when absent */
    size_t tokenizer_len;
    kvr_worker_role_t role;     /* "role": prefill, decode, both (default) */
    const char *bootstrap_host; /* NULL when absent */
    size_t bootstrap_host_len;
    uint32_t bootstrap_port; /* 0 when absent */
} kvr_api_worker_t;

/* POST /router: the reference's tagged requests. */
typedef enum kvr_api_router_method {
    KVR_API_ROUTER_NEW = 0,
    KVR_API_ROUTER_POTENTIAL_LOADS = 1,
    KVR_API_ROUTER_MARK_PREFILL = 2,
    KVR_API_ROUTER_MARK_FREE = 3,
} kvr_api_router_method_t;

/* Fields that do not belong to the method are validated but cleared. new: tokens (required),
 * routing_constraints, priority_jump, strict_priority, lora_name, cache_namespace, request_id
 * (optional; the router makes one when absent). potential_loads: tokens (required),
 * lora_name, cache_namespace. mark_prefill, mark_free: request_id (required). */
typedef struct kvr_api_router {
    kvr_api_router_method_t method;
    const uint32_t *tokens;
    size_t n_tokens;
    const char *lora_name;
    size_t lora_name_len;
    const char *cache_namespace;
    size_t cache_namespace_len;
    bool has_request_id;
    char request_id[KVR_API_MAX_REQUEST_ID_BYTES + 1];
    double priority_jump;                 /* default 0 */
    uint32_t strict_priority;             /* default 0 */
    const char *const *required_taints;
    size_t n_required;
    const kvr_taint_weight_t *preferred_taints;
    size_t n_preferred;
    const kvr_block_mm_t *mm; /* new: block_mm_infos (as kvr_api_route_t.mm) */
    size_t n_mm;
} kvr_api_router_t;

/* The /v1/route answer. */
typedef struct kvr_api_route_response {
    const char *request_id;               /* NUL-terminated */
    kvr_worker_t worker;
    uint64_t overlap_blocks;              /* round(effective overlap blocks) */
    uint64_t cached_tokens;
} kvr_api_route_response_t;

/* The standalone indexer's API (kvrouter indexer; serve --serve-indexer), with the reference
 * indexer's field names. tenant_id (legacy) and additional_salt / additionalsalt are read
 * (strings or null) and ignored, as the reference does. */
#define KVR_IX_DEFAULT_GROUP "default"

/* POST /register: instance_id, endpoint, model_name, block_size required. */
typedef struct kvr_ix_register {
    uint64_t instance_id;
    const char *endpoint; /* the engine's ZMQ PUB address */
    size_t endpoint_len;
    const char *model_name;
    size_t model_name_len;
    const char *routing_group; /* "default" when absent */
    size_t routing_group_len;
    uint32_t block_size;       /* [1, 65536] */
    uint32_t dp_rank;          /* 0 when absent */
    const char *replay_endpoint; /* NULL when absent */
    size_t replay_endpoint_len;
} kvr_ix_register_t;

/* POST /unregister: instance_id, model_name required; no routing_group = every group; no
 * dp_rank = every rank. */
typedef struct kvr_ix_unregister {
    uint64_t instance_id;
    const char *model_name;
    size_t model_name_len;
    const char *routing_group; /* NULL when absent */
    size_t routing_group_len;
    bool has_dp_rank;
    uint32_t dp_rank;
} kvr_ix_unregister_t;

/* POST /query (token_ids, lora_name, cache_salt) and POST /query_by_hash (block_hashes; a
 * cache_salt is refused there). model_name required. */
typedef struct kvr_ix_query {
    bool by_hash;
    const uint32_t *tokens; /* /query */
    size_t n_tokens;
    const uint64_t *hashes; /* /query_by_hash: local block hashes, as u64 bits */
    size_t n_hashes;
    const char *model_name;
    size_t model_name_len;
    const char *routing_group; /* "default" when absent */
    size_t routing_group_len;
    const char *lora_name;     /* NULL when absent */
    size_t lora_name_len;
    const char *cache_salt;    /* NULL when absent */
    size_t cache_salt_len;
} kvr_ix_query_t;

/* POST /register_peer, POST /deregister_peer */
typedef struct kvr_ix_peer {
    const char *url;
    size_t url_len;
} kvr_ix_peer_t;

/* POST /record_routing_decision (approximate mode: a router's decision, written into the
 * index of the indexer it uses): instance_id, model_name, local_hashes and sequence_hashes
 * required (i64 or u64 each, as many of one as of the other, the sequence hashes chained from
 * the local ones: a mismatched pair is refused). */
typedef struct kvr_ix_record {
    uint64_t instance_id;
    uint32_t dp_rank;    /* 0 when absent */
    uint32_t block_size; /* what the router hashed with; 0 when absent (then the partition
                            must exist: a standalone indexer makes one with it) */
    const uint64_t *local_hashes, *sequence_hashes;
    size_t n;
    const char *model_name;
    size_t model_name_len;
    const char *routing_group; /* "default" when absent */
    size_t routing_group_len;
    /* Ours, optional: the worker rank's KV cache in blocks, as the router knows it (its
     * registration or its engine's /metrics); an indexer in approximate mode then models that
     * rank as a cache of this size (LRU of the decisions) instead of a TTL alone. 0 = absent. */
    uint64_t kv_capacity_blocks;
} kvr_ix_record_t;

/* Counters since the decoder was made (for /metrics: a falling fast-path share means clients
 * format token arrays in a way the scanner does not take). */
typedef struct kvr_api_stats {
    uint64_t bodies;      /* decode calls */
    uint64_t errors;      /* of which failed */
    uint64_t fast_path;   /* bodies whose tokens the fast scanner read */
    uint64_t fallbacks;   /* bodies with a "tokens" key that yajl read alone (odd
                             formatting, or an error: errors are always reported by yajl) */
} kvr_api_stats_t;

const char *kvr_api_router_method_name(kvr_api_router_method_t m);

/* opts NULL = defaults (KVR_API_MAX_TOKENS, KVR_API_MAX_ALLOWED_IDS, fast path on).
 * NULL on allocation failure or options above the maxima. */
kvr_api_decoder_t *kvr_api_decoder_new(const kvr_api_options_t *opts);
void kvr_api_decoder_free(kvr_api_decoder_t *d);
/* The last error ("" after success); valid until the next decode. */
const char *kvr_api_decoder_error(const kvr_api_decoder_t *d);
void kvr_api_decoder_stats(const kvr_api_decoder_t *d, kvr_api_stats_t *out);

int kvr_api_decode_route(kvr_api_decoder_t *d, const char *body, size_t len,
                         kvr_api_route_t *out);
int kvr_api_decode_busy(kvr_api_decoder_t *d, const char *body, size_t len, kvr_api_busy_t *out);
int kvr_api_decode_output_block(kvr_api_decoder_t *d, const char *body, size_t len,
                                kvr_api_output_block_t *out);
int kvr_api_decode_query(kvr_api_decoder_t *d, const char *body, size_t len,
                         kvr_api_query_t *out);
int kvr_api_decode_loads(kvr_api_decoder_t *d, const char *body, size_t len,
                         kvr_api_query_t *out);
int kvr_api_decode_worker(kvr_api_decoder_t *d, const char *body, size_t len,
                          kvr_api_worker_t *out);
int kvr_api_decode_router(kvr_api_decoder_t *d, const char *body, size_t len,
                          kvr_api_router_t *out);

int kvr_api_decode_ix_register(kvr_api_decoder_t *d, const char *body, size_t len,
                               kvr_ix_register_t *out);
int kvr_api_decode_ix_unregister(kvr_api_decoder_t *d, const char *body, size_t len,
                                 kvr_ix_unregister_t *out);
int kvr_api_decode_ix_query(kvr_api_decoder_t *d, const char *body, size_t len, bool by_hash,
                            kvr_ix_query_t *out);
int kvr_api_decode_ix_peer(kvr_api_decoder_t *d, const char *body, size_t len,
                           kvr_ix_peer_t *out);
int kvr_api_decode_ix_record(kvr_api_decoder_t *d, const char *body, size_t len,
                             kvr_ix_record_t *out);

/* Encoders: one complete value each (absent optional fields omitted), so that decoding the
 * output gives back the same struct (for clients, tests and the fuzz round trip). They return
 * the writer's status. */
int kvr_api_encode_route(kvr_json_writer_t *w, const kvr_api_route_t *r);
int kvr_api_encode_output_block(kvr_json_writer_t *w, const kvr_api_output_block_t *r);
int kvr_api_encode_query(kvr_json_writer_t *w, const kvr_api_query_t *r);
int kvr_api_encode_worker(kvr_json_writer_t *w, const kvr_api_worker_t *r);
/* A decoded registration as the router's worker spec: KVR_OK, or KVR_EINVAL with err naming
 * the field (a string too long for the spec, too many taints). */
int kvr_api_worker_to_spec(kvr_worker_spec_t *sp, const kvr_api_worker_t *a, char *err,
                           size_t err_len);
/* A worker spec as the registration body (POST /v1/workers, a discovery entry). */
int kvr_api_encode_worker_spec(kvr_json_writer_t *w, const kvr_worker_spec_t *sp);
int kvr_api_encode_router(kvr_json_writer_t *w, const kvr_api_router_t *r);
/* {"request_id","worker_id","dp_rank","overlap_blocks","cached_tokens"} */
int kvr_api_encode_route_response(kvr_json_writer_t *w, const kvr_api_route_response_t *r);

#endif /* KVR_WIRE_API_JSON_H */

/*
 * hash_req.h: decoder for one "hash request" JSON line (wire layer: bytes in, structs out, no I/O).
 *
 *   {"tokens":[...], "block_size":16, "lora_name":null, "cache_namespace":null,
 *    "is_eagle":false, "block_mm_hashes":{"0":[10754394637803157173, ...]}}
 *
 * tokens and block_size are required; the other keys are optional and may be null; unknown keys
 * (with values of any type and depth) are ignored; a known key given twice is an error.
 * Numbers are read from their text, so u64 values above INT64_MAX are exact and "1.0" or "1e3"
 * are not integers. tokens: u32 values; block_size: [1, 2^31 - 1]; block_mm_hashes: keys are
 * canonical decimal block indices ("0", "17"; not "017") up to 2^32 - 1, each at most once,
 * values arrays of u64 (or null: no hashes). Strings are validated UTF-8, escapes decoded.
 *
 * Output: after kvr_hash_req_parse() returns KVR_OK, tokens / n_tokens / block_size / opts are
 * ready for kvr_hash_blocks(): opts.mm is sorted by block index (one entry per block) and each
 * entry's hashes are sorted ascending (duplicates kept). On error, err holds one line naming
 * the field and the problem ("tokens[3]: not an integer in [0, 4294967295]").
 *
 * Ownership: the decoder owns every output buffer; they stay valid until the next parse or
 * kvr_hash_req_deinit(). The input line is borrowed for the call only.
 * Memory: buffers grow to the largest line seen and are reused, so parsing allocates nothing
 * in steady state (yajl's own allocations go to an arena the decoder keeps). The limits cap
 * what one line may ask for; exceeding one is an error, never a larger allocation.
 * Threads: one decoder per thread; distinct decoders are independent.
 * Cost: one pass over the line (yajl), plus a sort of the mm entries when they are not
 * already in order.
 */
#ifndef KVR_WIRE_HASH_REQ_H
#define KVR_WIRE_HASH_REQ_H

#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"
#include "wire/json_decode.h"

#define KVR_HASH_REQ_MAX_TOKENS ((size_t)16 << 20)
#define KVR_HASH_REQ_MAX_MM_BLOCKS ((size_t)1 << 20)
#define KVR_HASH_REQ_MAX_MM_HASHES ((size_t)4 << 20)
#define KVR_HASH_REQ_MAX_BLOCK_SIZE (((uint32_t)1 << 31) - 1)

typedef struct kvr_hash_req_limits {
    size_t max_tokens;     /* tokens per line */
    size_t max_mm_blocks;  /* block_mm_hashes entries per line */
    size_t max_mm_hashes;  /* mm hash values per line, all blocks together */
} kvr_hash_req_limits_t;

typedef struct kvr_hash_req {
    kvr_jd_skip_t skip;     /* private, and first: the JSON skeleton's (wire/json_decode.h) */
    /* Results of the last successful parse. */
    const uint32_t *tokens;
    size_t n_tokens;
    uint32_t block_size;
    kvr_hash_opts_t opts;   /* points into the decoder's buffers */
    char err[256];          /* the last error, "" after success */

    /* Settings: kvr_hash_req_init() sets the KVR_HASH_REQ_MAX_* defaults; lower them freely. */
    kvr_hash_req_limits_t limits;

    /* private */
    uint32_t *tok_buf;
    size_t tok_cap;
    kvr_block_mm_t *mm_buf;
    size_t mm_cap, n_mm;
    uint64_t *mmh_buf;      /* every block's hashes, back to back */
    size_t mmh_cap, n_mmh;
    char *lora_buf, *ns_buf;
    size_t lora_cap, ns_cap;
    void *arena;            /* yajl's allocations (a kvr_yajl_arena_t) */
    int state, field;
    unsigned seen;          /* bit per known top-level key */
    int status;             /* first error seen by a callback */
} kvr_hash_req_t;

void kvr_hash_req_init(kvr_hash_req_t *r);
void kvr_hash_req_deinit(kvr_hash_req_t *r);

/* Decodes one JSON value (a whole line, without or with its trailing newline) of len bytes.
 * Returns KVR_OK; KVR_EPARSE (invalid JSON or wrong shape), KVR_ERANGE (a number out of
 * range), KVR_ETOOBIG (a limit exceeded) or KVR_ENOMEM, each with r->err set. */
int kvr_hash_req_parse(kvr_hash_req_t *r, const char *line, size_t len);

#endif /* KVR_WIRE_HASH_REQ_H */

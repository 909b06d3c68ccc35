/*
 * ix_query_mp.h: the MessagePack form of the indexer API's query bodies (POST /query and
 * POST /query_by_hash with Content-Type application/msgpack), decoded into the same
 * kvr_ix_query_t as their JSON form (wire/api_json.h), with the same rules and messages.
 *
 * Shapes accepted: a map with the JSON form's keys (what rmp-serde's named encoding and
 * Python's msgpack.packb(dict) write), or an array of the fields in declaration order (what
 * rmp-serde's compact encoding writes): /query [token_ids, model_name, routing_group,
 * tenant_id, lora_name, cache_salt], /query_by_hash [block_hashes, model_name, routing_group,
 * tenant_id, cache_salt]; trailing optional elements may be left out. Unknown map keys are
 * skipped whatever they hold; a known key given twice is an error; nil means absent. Token ids
 * are u32; block hashes i64 or u64 (a negative one is its two's complement); strings are
 * UTF-8 without control characters, within the JSON form's lengths.
 *
 * Errors: KVR_EPARSE (not msgpack, not a map or array, trailing bytes), KVR_EINVAL (a field
 * missing, duplicated, of the wrong type or out of range), KVR_ETOOBIG (more than the limit
 * of ids), KVR_ENOMEM; d->err names the field ("token_ids[3]: not an integer in [0,
 * 4294967295]"). On error *out is zeroed.
 * Ownership: out points into the decoder's buffers (strings copied and NUL-terminated) until
 * the next decode or kvr_ix_mp_deinit; the payload is borrowed for the call.
 * Threads: one decoder per thread. Cost: one pass, no recursion (mp_cursor skips nested
 * unknown values iteratively); buffers grow to the largest body and are reused.
 */
#ifndef KVR_WIRE_IX_QUERY_MP_H
#define KVR_WIRE_IX_QUERY_MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/api_json.h"

typedef struct kvr_ix_mp {
    size_t max_ids; /* token ids or hashes per body; kvr_ix_mp_init: KVR_API_MAX_TOKENS */
    char err[256];
    /* private */
    uint32_t *tok;
    size_t tok_cap;
    uint64_t *hashes;
    size_t h_cap;
    char *str; /* the strings, NUL-terminated, back to back */
    size_t str_cap, str_len;
} kvr_ix_mp_t;

void kvr_ix_mp_init(kvr_ix_mp_t *d);
void kvr_ix_mp_deinit(kvr_ix_mp_t *d);
int kvr_ix_mp_decode_query(kvr_ix_mp_t *d, const uint8_t *buf, size_t len, bool by_hash,
                           kvr_ix_query_t *out);

#endif

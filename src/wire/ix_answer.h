/*
 * ix_answer.h: an indexer's answer to POST /query_by_hash, read by a router that routes with
 * a remote indexer (indexer/remote_indexer.h), and the request body it sends.
 *
 * Read: {"scores": {"<instance_id>": {"<dp_rank>": tokens, ...}, ...}, ...}: the device-tier
 * prefix of each rank, in tokens (the reference's shape; other members skipped). Each count
 * must be a multiple of the block size the router hashed with: one that is not means the
 * indexer's partition has another block size, and the whole answer is refused (a silent
 * mis-scaled overlap would route worse than none). Keys are canonical decimal u64 / u32.
 * Written: {"block_hashes":[...],"model_name":"..."} with hashes as i64 (the reference's type;
 * a hash >= 2^63 goes as its negative two's complement); in approximate mode also the
 * decision it records, POST /record_routing_decision (wire/api_json.h reads it).
 *
 * Errors: KVR_EPARSE (not the shape) or KVR_EINVAL (a key or count out of range, a count not
 * a multiple of the block size), KVR_ETOOBIG (more matches than max), KVR_ENOMEM; err names
 * it. Ownership: *out is grown with realloc and the caller's. Threads: any. Cost: one scan.
 */
#ifndef KVR_WIRE_IX_ANSWER_H
#define KVR_WIRE_IX_ANSWER_H

#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"

int kvr_ix_answer_parse(const char *text, size_t len, uint32_t block_size, size_t max,
                        kvr_match_t **out, size_t *cap, size_t *n, char *err, size_t err_len);

/* The /query_by_hash body for local block hashes lbh[0..n). */
int kvr_ix_answer_encode_query(kvr_json_writer_t *w, const uint64_t *lbh, size_t n,
                               const char *model_name, size_t model_name_len);

/* The /record_routing_decision body for one decision (hashes as i64). */
int kvr_ix_answer_encode_record(kvr_json_writer_t *w, const kvr_ix_record_t *r);

#endif

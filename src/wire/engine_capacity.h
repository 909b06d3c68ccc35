/*
 * engine_capacity.h: an engine's KV-cache size, read from its Prometheus /metrics text, for a
 * worker registered without num_blocks= (approximate mode models each worker's cache as an
 * LRU of that many blocks, and the decode-fraction cost divides by it).
 *   - vLLM: the info gauge `vllm:cache_config_info{block_size="16",...,num_gpu_blocks="N",...} 1`
 *     (one line per engine core; "None" before the cache is sized): N blocks of block_size;
 *   - SGLang: the gauge `sglang:max_total_num_tokens{...} T` (tokens in the KV pool).
 * The capacity is given in the router's blocks (tokens / router block size, rounded down);
 * with several lines (data-parallel engines) the smallest, since the router gives every rank
 * of a worker the same capacity.
 * The text comes from a worker over the network: a line is read only up to its newline,
 * labels strictly ("name" = "quoted value" pairs, escapes refused), values as decimal or
 * exponent notation; anything malformed in a line that names one of the two metrics is an
 * error naming the line's metric, other lines are skipped unread.
 * Pure: no allocation, no globals, any thread. Cost: one pass over the text.
 */
#ifndef KVR_WIRE_ENGINE_CAPACITY_H
#define KVR_WIRE_ENGINE_CAPACITY_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KVR_CAPACITY_VLLM = 1, KVR_CAPACITY_SGLANG = 2 } kvr_capacity_source_t;

typedef struct kvr_engine_capacity {
    uint64_t blocks;              /* in the router's blocks */
    uint64_t tokens;              /* the engine's pool in tokens */
    kvr_capacity_source_t source; /* which metric said it */
} kvr_engine_capacity_t;

/* KVR_OK and *out; KVR_ENOTFOUND (neither metric, or vLLM's not sized yet), KVR_EPARSE (a
 * malformed line of one of them), KVR_EINVAL (block_size 0, a capacity under one block);
 * err (when non-NULL) says which. */
int kvr_engine_capacity_parse(const char *text, size_t len, uint32_t block_size,
                              kvr_engine_capacity_t *out, char *err, size_t err_len);

#endif

/*
 * kvrouter/hash.h: Dynamo-compatible block hashing (core/hash.c).
 *
 * local block hash  lbh[i] = XXH3_64(token bytes of block i [|| sorted mm hashes], seed)
 * sequence hash     seq[0] = lbh[0]; seq[i] = XXH3_64(LE64(seq[i-1]) || LE64(lbh[i]), 1337)
 * seed              1337 + XXH3(lora_name, 0) + XXH3(cache_namespace, 1)  (wrapping; empty = absent)
 *
 * Only complete blocks are hashed: floor(n / bs) blocks, or floor((n - 1) / bs) with Eagle
 * windows of bs + 1 tokens (docs/index.md has the derivation and the parity vectors).
 * Ownership: callers own every buffer; hashing allocates nothing. Threads: any (pure).
 * Cost: O(tokens) per prompt, one pass.
 */
#ifndef KVR_PUBLIC_HASH_H
#define KVR_PUBLIC_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_HASH_SEED 1337u

/* Multimodal hashes attached to one block (block index relative to the prompt). */
typedef struct kvr_block_mm {
    /* public */
    uint32_t block;          /* block index */
    const uint64_t *hashes;  /* mm_hash values, any order (hashed in ascending order) */
    size_t n_hashes;
} kvr_block_mm_t;

typedef struct kvr_hash_opts {
    /* public */
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

#ifdef __cplusplus
}
#endif
#endif /* KVR_PUBLIC_HASH_H */

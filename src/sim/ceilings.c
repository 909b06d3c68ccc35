/*
 * ceilings.c: a trace's hit-ratio ceilings (see ceilings.h for the contract).
 *
 * Ceilings: every row's prompt is hashed at the block size (kvr_hash_prompt, as the router and
 * the engine hash it). Infinite: every sequence hash seen, in a base/u64map.h table used as a
 * set; a row hits its leading blocks found there (the set is prefix-closed, so a linear scan
 * from the root stops at the first miss). Pooled: one sim/kvcache.h cache of pooled_blocks blocks, used
 * exactly as the simulated engine uses it for one request at a time (match, allocate with the
 * hits, commit the full blocks, release), so its LRU order is the engine's. Both cap a hit at
 * floor((input_length - 1) / block_size) blocks, as the engine computes at least one token.
 * A row needing more blocks than the pooled cache has cannot run there: its match is counted
 * and the cache is left unchanged. Cost: one pass over every prompt token (generation and
 * hashing) plus O(blocks) set and cache work; memory: the set (48 bytes per distinct block at
 * load <= 1/2) and the cache (capped at the blocks the trace can ever allocate).
 * Threads: none of their own; the trace is only read.
 */
#include "sim/ceilings.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "base/u64map.h"
#include "sim/kvcache.h"

/* ------------------------------------------------------------------------------------------ */
/* Ceilings. */


int kvr_trace_ceilings(const kvr_trace_t *t, uint32_t block_size, uint64_t pooled_blocks,
                       kvr_trace_ceilings_t *out)
{
    if (t == NULL || out == NULL || block_size == 0 || KVR_TRACE_BLOCK_TOKENS % block_size != 0)
        return KVR_EINVAL;
    memset(out, 0, sizeof *out);
    uint32_t max_len = 0;
    uint64_t all_blocks = 0;
    for (size_t r = 0; r < t->n_rows; r++) {
        uint32_t n = t->rows[r].input_length;
        if (n == 0 || n > KVR_TRACE_MAX_INPUT)
            return KVR_EINVAL; /* a hand-made row outside what parsing accepts */
        if (n > max_len)
            max_len = n;
        all_blocks += (n + block_size - 1) / block_size;
    }
    size_t max_blocks = max_len / block_size + 1;
    uint32_t *tok = malloc(((size_t)max_len + 1) * sizeof *tok);
    uint64_t *lbh = malloc(max_blocks * sizeof *lbh);
    uint64_t *seq = malloc(max_blocks * sizeof *seq);
    kvr_u64map_t seen;
    bool created;
    kvr_kvcache_t *kc = NULL;
    kvr_kvcache_seq_t sq;
    kvr_kvcache_seq_init(&sq);
    int rc = kvr_u64map_init(&seen);
    if (rc == KVR_OK && !(tok && lbh && seq))
        rc = KVR_ENOMEM;
    /* A cache at least as large as everything the trace allocates never evicts: the same
     * answer as any larger one, without the memory. */
    uint64_t cache_blocks = pooled_blocks < all_blocks ? pooled_blocks : all_blocks;
    if (rc == KVR_OK && cache_blocks > 0) {
        if (cache_blocks > UINT32_MAX)
            cache_blocks = UINT32_MAX;
        kvr_kvcache_config_t kcfg = {.num_blocks = (uint32_t)cache_blocks,
                                     .block_size = block_size,
                                     .prefix_caching = true};
        kc = kvr_kvcache_new(&kcfg, NULL, NULL, &rc);
    }
    uint64_t hit_inf = 0, hit_pool = 0, prompt = 0;
    for (size_t r = 0; rc == KVR_OK && r < t->n_rows; r++) {
        const kvr_trace_row_t *row = &t->rows[r];
        uint32_t n = row->input_length;
        rc = kvr_trace_tokens(row, 0, tok, max_len);
        if (rc != KVR_OK)
            break;
        long nb = kvr_hash_prompt(tok, n, block_size, NULL, lbh, seq, max_blocks);
        if (nb < 0) {
            rc = (int)nb;
            break;
        }
        size_t cap_hit = (n - 1) / block_size;
        prompt += n;
        size_t m = 0;
        while (m < (size_t)nb && kvr_u64map_find(&seen, seq[m]) != NULL)
            m++;
        hit_inf += (uint64_t)(m < cap_hit ? m : cap_hit) * block_size;
        for (size_t b = m; rc == KVR_OK && b < (size_t)nb; b++)
            rc = kvr_u64map_get(&seen, seq[b], &created) != NULL ? KVR_OK : KVR_ENOMEM;
        if (kc == NULL || rc != KVR_OK)
            continue;
        size_t pm = kvr_kvcache_match(kc, seq, (size_t)nb);
        size_t h = pm < cap_hit ? pm : cap_hit;
        hit_pool += (uint64_t)h * block_size;
        int ar = kvr_kvcache_allocate(kc, &sq, seq, h, n);
        if (ar == KVR_EBUSY)
            continue; /* larger than the whole cache: it could not run there */
        if (ar != KVR_OK) {
            rc = ar;
            break;
        }
        rc = kvr_kvcache_commit(kc, &sq, seq, tok, (size_t)nb);
        kvr_kvcache_release(kc, &sq);
    }
    if (kc != NULL)
        kvr_kvcache_release(kc, &sq);
    kvr_kvcache_seq_deinit(&sq);
    kvr_kvcache_free(kc);
    kvr_u64map_deinit(&seen);
    free(tok);
    free(lbh);
    free(seq);
    if (rc != KVR_OK)
        return rc;
    out->prompt_tokens = prompt;
    out->infinite = prompt ? (double)hit_inf / (double)prompt : 0.0;
    out->pooled = prompt ? (double)hit_pool / (double)prompt : 0.0;
    return KVR_OK;
}

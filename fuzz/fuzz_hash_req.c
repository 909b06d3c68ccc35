/*
 * fuzz_hash_req.c: libFuzzer target for the hash request decoder (wire/hash_req.c), the trust
 * boundary of `kvrouter hash`. Arbitrary bytes are one line; a decoded request is hashed and
 * its outputs checked against the decoder's contract.
 *
 * Invariants checked: a failed parse leaves a one-line message and empty outputs; a successful
 * one has no message, tokens within the limit, mm entries strictly ascending with ascending
 * hashes, and hashes exactly kvr_hash_n_blocks() blocks.
 * Memory: one decoder reused across inputs (as the command does), small limits so each input
 * is cheap. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/hash_req.h"

#define FUZZ_MAX_TOKENS 4096
#define FUZZ_MAX_BLOCKS FUZZ_MAX_TOKENS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_hash_req_t req;
    static int ready;
    static uint64_t lbh[FUZZ_MAX_BLOCKS], seq[FUZZ_MAX_BLOCKS];
    if (!ready) {
        kvr_hash_req_init(&req);
        req.limits.max_tokens = FUZZ_MAX_TOKENS;
        req.limits.max_mm_blocks = 256;
        req.limits.max_mm_hashes = 1024;
        ready = 1;
    }

    int st = kvr_hash_req_parse(&req, (const char *)data, size);
    if (st != KVR_OK) {
        check(st < 0 && req.err[0] != '\0' && strchr(req.err, '\n') == NULL);
        check(req.n_tokens == 0 && req.tokens == NULL && req.opts.n_mm == 0);
        return 0;
    }
    check(req.err[0] == '\0');
    check(req.n_tokens <= FUZZ_MAX_TOKENS && (req.n_tokens == 0 || req.tokens != NULL));
    check(req.block_size >= 1 && req.block_size <= KVR_HASH_REQ_MAX_BLOCK_SIZE);
    for (size_t i = 0; i < req.opts.n_mm; i++) {
        const kvr_block_mm_t *e = &req.opts.mm[i];
        check(i == 0 || e->block > req.opts.mm[i - 1].block);
        check(e->n_hashes == 0 || e->hashes != NULL);
        for (size_t k = 1; k < e->n_hashes; k++)
            check(e->hashes[k - 1] <= e->hashes[k]);
    }

    size_t n = kvr_hash_n_blocks(req.n_tokens, req.block_size, req.opts.is_eagle);
    long got = kvr_hash_blocks(req.tokens, req.n_tokens, req.block_size, &req.opts, lbh,
                               FUZZ_MAX_BLOCKS);
    check(got >= 0 && (size_t)got == n);
    kvr_hash_chain(lbh, n, seq);
    if (n > 1)
        check(seq[1] == kvr_hash_chain_next(lbh[0], lbh[1]));
    return 0;
}

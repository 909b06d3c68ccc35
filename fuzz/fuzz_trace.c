/*
 * fuzz_trace.c: libFuzzer target for the Mooncake trace reader (wire/trace.c), the trust
 * boundary of `kvrouter replay` and `kvrouter sim`. Arbitrary bytes are a whole trace file;
 * a parsed trace is turned into tokens and its ceilings computed, when small enough.
 *
 * Invariants checked: a failed parse leaves an empty trace and one message line starting with
 * "line "; a successful one has rows within their ranges, ceil(input_length / 512) ids each,
 * ids laid out back to back in one array, non-decreasing timestamps; tokens are in range and
 * deterministic; ceilings are ratios in [0, 1] with pooled <= infinite when the pool is
 * larger than every request (no request is skipped), and equal to it once the pool holds
 * everything.
 * Memory: per input, the trace and a token buffer. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "sim/ceilings.h"
#include "wire/trace.h"

#define FUZZ_MAX_TOKENS 65536u /* rows beyond this total skip the token and ceiling checks */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static void check_tokens(const kvr_trace_t *t, uint64_t total)
{
    static uint32_t a[FUZZ_MAX_TOKENS], b[FUZZ_MAX_TOKENS];
    for (size_t r = 0; r < t->n_rows; r++) {
        const kvr_trace_row_t *row = &t->rows[r];
        check(kvr_trace_tokens(row, 7, a, FUZZ_MAX_TOKENS) == KVR_OK);
        check(kvr_trace_tokens(row, 7, b, FUZZ_MAX_TOKENS) == KVR_OK);
        check(memcmp(a, b, row->input_length * sizeof *a) == 0);
        for (uint32_t i = 0; i < row->input_length; i++)
            check(a[i] >= KVR_TRACE_TOKEN_LO && a[i] < KVR_TRACE_TOKEN_HI);
        if (row->input_length > 1)
            check(kvr_trace_tokens(row, 7, a, row->input_length - 1) == KVR_ETOOBIG);
    }
    kvr_trace_ceilings_t c1, c2;
    check(kvr_trace_ceilings(t, 16, total, &c1) == KVR_OK);
    check(c1.prompt_tokens == total);
    check(c1.infinite >= 0 && c1.infinite <= 1 && c1.pooled >= 0 && c1.pooled <= 1);
    check(c1.pooled == c1.infinite); /* a pool holding everything is an infinite cache */
    uint64_t max_blocks = 0;
    for (size_t r = 0; r < t->n_rows; r++)
        if ((t->rows[r].input_length + 31u) / 32u > max_blocks)
            max_blocks = (t->rows[r].input_length + 31u) / 32u;
    check(kvr_trace_ceilings(t, 32, max_blocks + 1, &c2) == KVR_OK);
    check(c2.pooled <= c2.infinite + 1e-12);
    check(kvr_trace_ceilings(t, 24, 8, &c2) == KVR_EINVAL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_trace_t t;
    char err[256];
    err[0] = '\0';
    int st = kvr_trace_parse((const char *)data, size, 0, &t, err, sizeof err);
    if (st != KVR_OK) {
        check(st == KVR_EPARSE || st == KVR_EINVAL || st == KVR_ENOMEM);
        check(strncmp(err, "line ", 5) == 0 && strchr(err, '\n') == NULL);
        check(t.rows == NULL && t.n_rows == 0 && t.ids == NULL && t.n_ids == 0);
        return 0;
    }
    size_t ids = 0;
    uint64_t total = 0;
    for (size_t r = 0; r < t.n_rows; r++) {
        const kvr_trace_row_t *row = &t.rows[r];
        check(row->input_length >= 1 && row->input_length <= KVR_TRACE_MAX_INPUT);
        check(row->output_length >= 1);
        check(row->n_hash_ids == (row->input_length + KVR_TRACE_BLOCK_TOKENS - 1) /
                                     KVR_TRACE_BLOCK_TOKENS);
        check(row->hash_ids == t.ids + ids);
        check(r == 0 || row->timestamp_ms >= t.rows[r - 1].timestamp_ms);
        ids += row->n_hash_ids;
        total += row->input_length;
    }
    check(ids == t.n_ids);
    /* max_rows keeps a prefix */
    if (t.n_rows > 1) {
        kvr_trace_t p;
        check(kvr_trace_parse((const char *)data, size, 1, &p, err, sizeof err) == KVR_OK);
        check(p.n_rows == 1 && p.rows[0].input_length == t.rows[0].input_length);
        kvr_trace_free(&p);
    }
    if (total <= FUZZ_MAX_TOKENS)
        check_tokens(&t, total);
    kvr_trace_free(&t);
    return 0;
}

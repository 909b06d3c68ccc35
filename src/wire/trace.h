/*
 * trace.h: Mooncake request traces (JSON lines), the input of `kvrouter replay` and
 * `kvrouter sim`:
 *   {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ...]}
 * timestamp: ms since the trace's start (non-decreasing in a valid file); input_length,
 * output_length: tokens (>= 1); hash_ids: one id per 512-token block of the prompt
 * (len == ceil(input_length / 512)); an id names the whole prefix up to its block, so two
 * rows with the same first k ids share their first k * 512 tokens. Unknown keys are ignored.
 *
 * Tokens: a row becomes token ids deterministically: block `id` is 512 pseudo-random ids in
 * [KVR_TRACE_TOKEN_LO, KVR_TRACE_TOKEN_HI) seeded by (id, seed), the blocks are concatenated and
 * cut to input_length. Shared ids give shared prefixes at any block size dividing 512.
 *
 * Errors name the line and the field ("line 17: input_length: must be an integer >= 1",
 * "line 3: hash_ids: 12 ids for input_length 6758 (expected 14)", "line 9: timestamp goes
 * back (1200 after 1300)"). Ownership: the trace owns its rows and ids (one allocation each
 * for all rows / all ids). Threads: any, one owner. Cost: one pass over the file.
 */
#ifndef KVR_WIRE_TRACE_H
#define KVR_WIRE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVR_TRACE_BLOCK_TOKENS 512u
#define KVR_TRACE_TOKEN_LO 1000u
#define KVR_TRACE_TOKEN_HI 31000u
#define KVR_TRACE_MAX_INPUT (1u << 22) /* tokens per row */

typedef struct kvr_trace_row {
    uint64_t timestamp_ms;
    uint32_t input_length;
    uint32_t output_length;
    const uint64_t *hash_ids; /* into the trace's id array */
    uint32_t n_hash_ids;
} kvr_trace_row_t;

typedef struct kvr_trace {
    kvr_trace_row_t *rows;
    size_t n_rows;
    uint64_t *ids;            /* all rows' hash ids */
    size_t n_ids;
} kvr_trace_t;

/* Parses text[0..len) (JSON lines; blank lines skipped). At most max_rows rows are kept
 * (0 = all). KVR_OK; KVR_EPARSE / KVR_EINVAL with err naming the line and field; KVR_ENOMEM.
 * On error *out is empty. */
int kvr_trace_parse(const char *text, size_t len, size_t max_rows, kvr_trace_t *out, char *err,
                    size_t err_len);
/* Reads and parses a file (KVR_EIO naming the path when it cannot be read). */
int kvr_trace_load(const char *path, size_t max_rows, kvr_trace_t *out, char *err,
                   size_t err_len);
void kvr_trace_free(kvr_trace_t *t);
/* Writes the rows as JSON lines (the format above; kvr_trace_parse reads them back equal).
 * KVR_OK or KVR_EIO. */
int kvr_trace_write(FILE *f, const kvr_trace_t *t);

/* The row's prompt tokens into out[0..row->input_length) (cap must be >= input_length;
 * KVR_ETOOBIG otherwise). */
int kvr_trace_tokens(const kvr_trace_row_t *row, uint64_t seed, uint32_t *out, size_t cap);

#endif /* KVR_WIRE_TRACE_H */

/*
 * tokenize_answer.h: a worker's answer to POST /tokenize (vLLM and SGLang both answer
 * {"tokens": [ids...], "count": n, "max_model_len": m, ...}), read for its token ids.
 * Untrusted bytes (a worker's): fuzzed by fuzz/fuzz_tokenize_answer.c.
 *
 * Accepts: one JSON object (RFC 8259, checked strictly by wire/json_scan.c) with exactly one
 * member "tokens" whose value is an array of integers in [0, 4294967295]; other members are
 * ignored whatever they hold. Anything else is refused with a message naming the problem.
 * Ownership: the ids go to the caller's growable array (*buf, *cap elements; realloc'd, never
 * beyond max_tokens); the text is borrowed for the call. Threads: none, any thread.
 * Cost: one strict scan of the text; the ids read by the SIMD token scanner (token_scan.h),
 * canonical integers only, or one at a time when the array is formatted otherwise.
 */
#ifndef KVR_WIRE_TOKENIZE_ANSWER_H
#define KVR_WIRE_TOKENIZE_ANSWER_H

#include <stddef.h>
#include <stdint.h>

/* KVR_OK with the ids in (*buf)[0..*n); KVR_EPARSE (not such an object; err says where);
 * KVR_ETOOBIG (more than max_tokens ids: err starts with "tokens:"); KVR_ENOMEM. */
int kvr_tokenize_answer_decode(const char *b, size_t n, size_t max_tokens, uint32_t **buf,
                               size_t *cap, size_t *n_tokens, char *err, size_t err_len);

#endif

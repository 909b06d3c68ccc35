/*
 * oai_usage.h: the engine's report of cached prompt tokens in an OpenAI answer or stream chunk
 * (usage.prompt_tokens_details.cached_tokens: vLLM with --enable-prompt-tokens-details, SGLang
 * with --enable-cache-report), read without building the JSON: the top-level object's members
 * are walked (wire/json_scan.h, lenient: the bytes are a worker's and only forwarded), so a
 * key inside a string or another member never matches.
 * Pure: no allocation, any thread. Cost: one pass over the top-level members and two small
 * nested objects.
 */
#ifndef KVR_WIRE_OAI_USAGE_H
#define KVR_WIRE_OAI_USAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* true with *cached when b[0..n) is an object whose usage.prompt_tokens_details.cached_tokens
 * is an integer >= 0; false when it is absent, null, or not such an integer. */
bool kvr_oai_usage_cached_tokens(const char *b, size_t n, uint64_t *cached);

#endif

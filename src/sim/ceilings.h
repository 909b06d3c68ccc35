/*
 * ceilings.h: the prefix-cache hit ratio a trace (wire/trace.h) could reach at best, the
 * yardsticks `kvrouter trace stats`, `sim`, `replay` and `demo` print beside a policy's figure.
 */
#ifndef KVR_SIM_CEILINGS_H
#define KVR_SIM_CEILINGS_H

#include <stdint.h>

#include "wire/trace.h"

/* Ceilings of the prefix-cache hit ratio (hit tokens / prompt tokens), rows in order, at a
 * block size dividing 512: an infinite cache (every block seen before hits), and one LRU cache
 * of pooled_blocks blocks shared by everyone (as if all workers' caches were one). Requests are
 * taken one at a time (no concurrency), a hit is capped at input_length - 1 tokens as engines
 * do. KVR_EINVAL when block_size does not divide 512. */
typedef struct kvr_trace_ceilings {
    double infinite;
    double pooled;
    uint64_t prompt_tokens;
} kvr_trace_ceilings_t;
int kvr_trace_ceilings(const kvr_trace_t *t, uint32_t block_size, uint64_t pooled_blocks,
                       kvr_trace_ceilings_t *out);

#endif /* KVR_SIM_CEILINGS_H */

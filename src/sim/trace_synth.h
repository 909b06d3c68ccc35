/*
 * trace_synth.h: `kvrouter trace synth --from FILE`: a new Mooncake trace with the prefix-tree
 * shape of a given one, scaled (as the reference's prefix-data synthesizer does).
 *
 * The source's blocks form a tree (a hash id names its whole prefix, so each id has one
 * parent). A row's leading blocks that another row also reaches are its shared prefix; the
 * rest its own tail. Each source row becomes users_scale rows, one per independent copy of
 * the shared tree (copy c's shared blocks are distinct from copy c'), in the source's order
 * (copies of one row spread over the gap to the next row), with:
 *   - its shared prefix of d blocks stretched to round(d * prefix_scale) blocks (block j of
 *     the stretched prefix stands for source block floor(j / prefix_scale): two rows sharing
 *     k source blocks share round(k * prefix_scale) new ones),
 *   - its tail of u blocks turned into round(u * prompt_scale) fresh blocks,
 *   - the last block as full as the source's, the same output length,
 *   - timestamps divided by rate_scale (rate_scale 2 = twice the request rate).
 * With every scale 1 the result is the source with ids renamed (same stats and ceilings).
 * Ownership: the output is the caller's. Threads: any. Cost: O(source ids x users_scale).
 */
#ifndef KVR_WIRE_TRACE_SYNTH_H
#define KVR_WIRE_TRACE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "wire/trace.h"

typedef struct kvr_synth_config {
    double rate_scale;   /* > 0; 1 = the source's rate */
    uint32_t users_scale; /* >= 1 copies of the shared tree */
    double prompt_scale; /* > 0: the rows' own tails */
    double prefix_scale; /* > 0: the shared prefixes */
    size_t max_rows;     /* 0 = all */
    uint64_t seed;
} kvr_synth_config_t;

/* KVR_OK; KVR_EINVAL with err naming the setting; KVR_ENOMEM. */
int kvr_trace_synth(const kvr_trace_t *src, const kvr_synth_config_t *cfg, kvr_trace_t *out,
                    char *err, size_t err_len);

#endif /* KVR_WIRE_TRACE_SYNTH_H */

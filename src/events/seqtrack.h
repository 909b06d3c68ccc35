/*
 * seqtrack.h: the sequence-number cursor of one engine publisher (one worker rank).
 *
 * Engines number their KV-event batches 0, 1, 2, ... per publisher process. The cursor says
 * what to do with each number: apply it, drop it (already applied), fill a gap first, or start
 * over because the publisher restarted (its numbers went back). Pure state, any thread that
 * owns it; O(1).
 */
#ifndef KVR_SEQTRACK_H
#define KVR_SEQTRACK_H

#include <stdbool.h>
#include <stdint.h>

typedef enum kvr_seq_verdict {
    KVR_SEQ_APPLY = 0,  /* the next batch in order */
    KVR_SEQ_DUPLICATE,  /* at or below the cursor: already applied */
    KVR_SEQ_GAP,        /* batches [gap_from, seq) are missing: recover them first */
    KVR_SEQ_RESTART,    /* the sequence went back: a new publisher process */
} kvr_seq_verdict_t;

typedef struct kvr_seqtrack {
    bool started;  /* a batch has been applied since the last reset */
    uint64_t next; /* the number expected next */
} kvr_seqtrack_t;

/* Before any batch (or after a reset), a first batch numbered 0 applies and one numbered
 * n > 0 is a gap [0, n): the history the router missed. */
kvr_seq_verdict_t kvr_seq_observe(const kvr_seqtrack_t *t, uint64_t seq, uint64_t *gap_from);
/* Records that batch seq was applied (or deliberately skipped). */
void kvr_seq_advance(kvr_seqtrack_t *t, uint64_t seq);
void kvr_seq_reset(kvr_seqtrack_t *t);

#endif

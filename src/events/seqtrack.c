/*
 * seqtrack.c: see seqtrack.h.
 *
 * A restart is recognised when a number arrives below the last applied one: PUB/SUB delivers
 * in order, so going back means a new process. The last applied number arriving again is a
 * duplicate (a replay that overlapped the live stream).
 */
#include "events/seqtrack.h"

kvr_seq_verdict_t kvr_seq_observe(const kvr_seqtrack_t *t, uint64_t seq, uint64_t *gap_from)
{
    if (!t->started) {
        if (seq == 0)
            return KVR_SEQ_APPLY;
        *gap_from = 0;
        return KVR_SEQ_GAP;
    }
    if (seq == t->next)
        return KVR_SEQ_APPLY;
    if (seq > t->next) {
        *gap_from = t->next;
        return KVR_SEQ_GAP;
    }
    if (seq + 1 == t->next)
        return KVR_SEQ_DUPLICATE;
    return KVR_SEQ_RESTART;
}

void kvr_seq_advance(kvr_seqtrack_t *t, uint64_t seq)
{
    t->started = true;
    t->next = seq + 1;
}

void kvr_seq_reset(kvr_seqtrack_t *t)
{
    t->started = false;
    t->next = 0;
}

/*
 * inflight.c: the watch of in-flight credits (contract in inflight.h). A ring of the credited
 * bookings, oldest first; a check walks it once, keeping in order the entries still unsettled.
 * The index answers for a path, not a lone hash (a probe is accepted only under the node found
 * one position earlier), so a confirmation looks up the booking's prompt from its first block
 * to its deepest credited one: the tracker keeps those hashes while the booking lives, and a
 * booking that ended unconfirmed has expired.
 */
#include "core/inflight.h"

#include <stdlib.h>
#include <string.h>

#include "base/grow.h"

void kvr_inflight_init(kvr_inflight_t *w)
{
    memset(w, 0, sizeof *w);
    kvr_lookup_init(&w->lk);
}

void kvr_inflight_deinit(kvr_inflight_t *w)
{
    kvr_lookup_deinit(&w->lk);
    free(w->seq);
}

static kvr_inflight_entry_t *at(kvr_inflight_t *w, size_t i)
{
    return &w->e[(w->head + i) % KVR_INFLIGHT_WATCH];
}

void kvr_inflight_watch(kvr_inflight_t *w, kvr_req_handle_t booking, kvr_worker_t worker,
                        uint32_t depth, uint64_t now_ms)
{
    if (w->n == KVR_INFLIGHT_WATCH) {
        w->head = (w->head + 1) % KVR_INFLIGHT_WATCH;
        w->n--;
        w->dropped++;
    }
    *at(w, w->n++) = (kvr_inflight_entry_t){booking, worker, depth, now_ms};
}

typedef enum settled { UNSETTLED, CONFIRMED, EXPIRED } settled_t;

/* Whether ix reports e's worker holding the booking's credited prefix (any tier). */
static bool reported(kvr_inflight_t *w, kvr_index_t *ix, const kvr_inflight_entry_t *e,
                     size_t n)
{
    if (ix == NULL || n < e->depth || kvr_index_lookup(ix, w->seq, e->depth, &w->lk) != KVR_OK)
        return false;
    for (size_t i = 0; i < w->lk.n_matches; i++) {
        const kvr_match_t *m = &w->lk.matches[i];
        if (m->worker.worker_id == e->worker.worker_id && m->worker.dp_rank == e->worker.dp_rank)
            return (size_t)m->device_blocks + m->host_blocks + m->disk_blocks >= e->depth;
    }
    return false;
}

static settled_t settle(kvr_inflight_t *w, kvr_index_t *ix, const kvr_load_t *lt,
                        const kvr_inflight_entry_t *e, uint64_t now_ms)
{
    size_t n = 0;
    if (kvr_grow((void **)&w->seq, &w->cap_seq, e->depth, SIZE_MAX / 8, sizeof *w->seq) !=
            KVR_OK ||
        kvr_load_prompt_h(lt, e->booking, w->seq, e->depth, &n) != KVR_OK)
        return EXPIRED; /* the booking ended unconfirmed (or no room to look: not knowable) */
    if (reported(w, ix, e, n))
        return CONFIRMED;
    return now_ms >= e->booked_ms + KVR_INFLIGHT_WINDOW_MS ? EXPIRED : UNSETTLED;
}

void kvr_inflight_check(kvr_inflight_t *w, kvr_index_t *ix, const kvr_load_t *lt,
                        uint64_t now_ms)
{
    if (w->n == 0 || now_ms < w->next_check_ms)
        return;
    w->next_check_ms = now_ms + KVR_INFLIGHT_CHECK_MS;
    size_t kept = 0;
    for (size_t i = 0; i < w->n; i++) {
        kvr_inflight_entry_t e = *at(w, i);
        switch (settle(w, ix, lt, &e, now_ms)) {
        case CONFIRMED:
            w->confirmed++;
            break;
        case EXPIRED:
            w->expired++;
            break;
        case UNSETTLED:
            *at(w, kept++) = e;
            break;
        }
    }
    w->n = kept;
}

void kvr_inflight_forget(kvr_inflight_t *w, uint64_t worker_id)
{
    size_t kept = 0;
    for (size_t i = 0; i < w->n; i++) {
        kvr_inflight_entry_t e = *at(w, i);
        if (e.worker.worker_id == worker_id)
            w->dropped++;
        else
            *at(w, kept++) = e;
    }
    w->n = kept;
}

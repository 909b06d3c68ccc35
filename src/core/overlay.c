/*
 * overlay.c: see overlay.h. The listed ranks are a small array (a handful at a time: ranks
 * whose events went wrong), searched linearly.
 */
#include "core/overlay.h"

#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "kvrouter/status.h"

struct kvr_overlay {
    kvr_index_t *ix;
    kvr_approx_t *ap;
    kvr_lookup_t lk;
    kvr_worker_t *ranks;
    size_t n, cap;
};

kvr_overlay_t *kvr_overlay_new(const kvr_approx_config_t *ac, size_t max_pairs,
                               uint32_t max_workers, int *status)
{
    kvr_overlay_t *ov = calloc(1, sizeof *ov);
    if (ov == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    kvr_lookup_init(&ov->lk);
    kvr_index_config_t ic = {.max_pairs = max_pairs, .max_workers = max_workers,
                             .sync = KVR_SYNC_NONE};
    if ((ov->ix = kvr_index_new(&ic, status)) == NULL ||
        (ov->ap = kvr_approx_new(ov->ix, ac, status)) == NULL) {
        kvr_overlay_free(ov);
        return NULL;
    }
    *status = KVR_OK;
    return ov;
}

void kvr_overlay_free(kvr_overlay_t *ov)
{
    if (ov == NULL)
        return;
    kvr_approx_free(ov->ap);
    kvr_index_free(ov->ix);
    kvr_lookup_deinit(&ov->lk);
    free(ov->ranks);
    free(ov);
}

static long find(const kvr_overlay_t *ov, kvr_worker_t w)
{
    for (size_t i = 0; i < ov->n; i++)
        if (ov->ranks[i].worker_id == w.worker_id && ov->ranks[i].dp_rank == w.dp_rank)
            return (long)i;
    return -1;
}

int kvr_overlay_set(kvr_overlay_t *ov, kvr_worker_t w, bool on, uint64_t capacity)
{
    long i = find(ov, w);
    if (!on) {
        if (i < 0)
            return KVR_OK;
        (void)kvr_approx_remove_rank(ov->ap, w);
        ov->ranks[i] = ov->ranks[--ov->n];
        return KVR_OK;
    }
    if (i >= 0)
        return KVR_OK;
    if (kvr_grow((void **)&ov->ranks, &ov->cap, ov->n + 1, SIZE_MAX, sizeof *ov->ranks) !=
        KVR_OK)
        return KVR_ENOMEM;
    if (capacity > 0 && kvr_approx_set_capacity(ov->ap, w, capacity) != KVR_OK)
        return KVR_ENOMEM;
    ov->ranks[ov->n++] = w;
    return KVR_OK;
}

bool kvr_overlay_has(const kvr_overlay_t *ov, kvr_worker_t w) { return find(ov, w) >= 0; }
size_t kvr_overlay_n(const kvr_overlay_t *ov) { return ov->n; }
kvr_worker_t kvr_overlay_rank(const kvr_overlay_t *ov, size_t i) { return ov->ranks[i]; }

void kvr_overlay_remove_worker(kvr_overlay_t *ov, uint64_t worker_id)
{
    (void)kvr_approx_remove_worker(ov->ap, worker_id);
    size_t k = 0;
    for (size_t i = 0; i < ov->n; i++)
        if (ov->ranks[i].worker_id != worker_id)
            ov->ranks[k++] = ov->ranks[i];
    ov->n = k;
}

void kvr_overlay_set_capacity(kvr_overlay_t *ov, kvr_worker_t w, uint64_t blocks)
{
    if (find(ov, w) >= 0)
        (void)kvr_approx_set_capacity(ov->ap, w, blocks);
}

const kvr_lookup_t *kvr_overlay_lookup(kvr_overlay_t *ov, const uint64_t *seq, size_t n,
                                       int *status)
{
    *status = kvr_index_lookup(ov->ix, seq, n, &ov->lk);
    return *status == KVR_OK ? &ov->lk : NULL;
}

kvr_approx_t *kvr_overlay_approx(kvr_overlay_t *ov) { return ov->ap; }

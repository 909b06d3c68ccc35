/*
 * approx.c: approximate mode (no KV events). The router records each routing decision in a
 * prefix index as if the chosen worker had cached the prompt (engine hash := router sequence
 * hash), and forgets it after a TTL, or earlier when the recorded size passes max_tree_size
 * (then it prunes down to prune_target_ratio * max_tree_size).
 *
 * Invariants: `timers` holds exactly the (worker, seq) pairs recorded and not yet removed,
 * each with its current expiry; every valid heap entry matches its timer (same expiry);
 * stale heap entries (refreshed or removed timers) are skipped when popped, and the heap is
 * rebuilt from the timers when stale entries outnumber live ones four to one.
 * Pop order: earliest expiry first; ties by larger position first (deepest blocks go first,
 * so shared prefixes outlive their extensions), then by hash and worker.
 *
 * Capacity (kvr_approx_set_capacity): a rank with a known cache size keeps a queue of its
 * blocks' touches, oldest first (entries whose timer was touched again are stale and
 * skipped); recording past the capacity evicts from its front. Invariant: a bounded rank's
 * `count` is its number of live timers, and every live timer of it has one entry in its queue
 * with the timer's stamp.
 *
 * Memory: timers and heap are bounded by max_tree_size (plus the stale allowance); a bounded
 * rank's queue by 4x its live blocks + 1024.
 * Threads: the index's writer thread.
 * Cost: record O(n log size); expire and prune O(removed log size).
 */
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "core/oatab.h"
#include "kvrouter.h"

typedef struct timer {
    uint64_t seq;
    uint64_t worker_id;
    uint64_t expiry_ms;
    uint64_t stamp; /* its last touch (the capacity queue's entries name it) */
    uint32_t dp_rank;
    uint32_t pos;
    uint8_t used;
} timer_t_;

/* A worker rank with a known cache capacity: its recorded blocks, oldest touch first. */
typedef struct qent {
    uint64_t seq, stamp;
} qent_t;

typedef struct wcap {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint8_t used;
    uint64_t cap;   /* blocks; 0 = not bounded */
    uint64_t count; /* its live timers */
    qent_t *q;      /* touches in order; an entry whose timer has another stamp is stale */
    size_t head, n, cap_q;
} wcap_t;

typedef struct hent {
    uint64_t expiry_ms;
    uint64_t seq;
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t pos;
} hent_t;

struct kvr_approx {
    kvr_index_t *ix;
    kvr_approx_config_t cfg;
    timer_t_ *t;
    size_t mask, live;
    hent_t *heap;
    size_t n_heap, cap_heap;
    kvr_block_t *blocks;
    size_t cap_blocks;
    wcap_t *w; /* per worker rank, never shrinks (a removed rank is reset) */
    size_t wmask, n_w;
    uint64_t stamp;
    uint64_t evicted; /* by capacity */
};

static size_t thash(uint64_t seq, uint64_t wid, uint32_t rank)
{
    return kvr_mix64(seq ^ kvr_mix64(wid * 31 + rank));
}

int kvr_approx_config_validate(const kvr_approx_config_t *cfg, const char **field)
{
    const char *dummy;
    if (field == NULL)
        field = &dummy;
    *field = NULL;
    if (cfg == NULL)
        return KVR_OK;
    /* NaN fails both comparisons */
    if (cfg->prune_target_ratio != 0 && !(cfg->prune_target_ratio > 0 && cfg->prune_target_ratio <= 1)) {
        *field = "router_prune_target_ratio";
        return KVR_EINVAL;
    }
    if (cfg->ttl_ms > UINT64_C(1) << 52) {
        *field = "router_ttl_secs";
        return KVR_EINVAL;
    }
    if (cfg->max_tree_size > ((size_t)1 << 40)) {
        *field = "router_max_tree_size";
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* ---- timers: a core/oatab.h table keyed by (seq, worker rank) ---- */

#define T_HOME(c, e) thash((e)->seq, (e)->worker_id, (e)->dp_rank)
#define T_EMPTY(e) (!(e)->used)
#define T_CLEAR(e) ((e)->used = 0)
KVR_OATAB_DEFINE(tt, kvr_approx_t, timer_t_, T_HOME, T_EMPTY, T_CLEAR)

typedef struct tkey {
    uint64_t seq;
    kvr_worker_t w;
} tkey_t;

static bool tmatch(const kvr_approx_t *ap, const timer_t_ *e, const void *key)
{
    (void)ap;
    const tkey_t *k = key;
    return e->seq == k->seq && e->worker_id == k->w.worker_id && e->dp_rank == k->w.dp_rank;
}

static timer_t_ *tfind(const kvr_approx_t *ap, uint64_t seq, kvr_worker_t w)
{
    tkey_t k = {seq, w};
    return tt_find(ap, ap->t, ap->mask, thash(seq, w.worker_id, w.dp_rank), tmatch, &k);
}

static int tgrow(kvr_approx_t *ap) { return tt_rehash(ap, &ap->t, &ap->mask, (ap->mask + 1) * 2); }

/* The timer for (seq, w), created unused-expiry if absent; NULL on allocation failure. */
static timer_t_ *tget(kvr_approx_t *ap, uint64_t seq, kvr_worker_t w, bool *created)
{
    *created = false;
    timer_t_ *e = tfind(ap, seq, w);
    if (e != NULL)
        return e;
    if ((ap->live + 1) * 4 > (ap->mask + 1) * 3 && tgrow(ap) != KVR_OK)
        return NULL;
    size_t i = tt_free_slot(ap->t, ap->mask, thash(seq, w.worker_id, w.dp_rank));
    ap->t[i] = (timer_t_){.seq = seq, .worker_id = w.worker_id, .dp_rank = w.dp_rank, .used = 1};
    ap->live++;
    *created = true;
    return &ap->t[i];
}

/* ---- worker ranks: a second core/oatab.h table ---- */

#define W_HOME(c, e) thash(0, (e)->worker_id, (e)->dp_rank)
#define W_EMPTY(e) (!(e)->used)
#define W_CLEAR(e) ((e)->used = 0)
KVR_OATAB_DEFINE(wt, kvr_approx_t, wcap_t, W_HOME, W_EMPTY, W_CLEAR)

static bool wmatch(const kvr_approx_t *ap, const wcap_t *e, const void *key)
{
    (void)ap;
    const kvr_worker_t *w = key;
    return e->worker_id == w->worker_id && e->dp_rank == w->dp_rank;
}

static wcap_t *wfind(const kvr_approx_t *ap, kvr_worker_t w)
{
    if (ap->w == NULL)
        return NULL;
    return wt_find(ap, ap->w, ap->wmask, thash(0, w.worker_id, w.dp_rank), wmatch, &w);
}

/* The rank's entry, made when absent; NULL on allocation failure. */
static wcap_t *wget(kvr_approx_t *ap, kvr_worker_t w)
{
    wcap_t *e = wfind(ap, w);
    if (e != NULL)
        return e;
    if (ap->w == NULL) {
        if ((ap->w = calloc(64, sizeof *ap->w)) == NULL)
            return NULL;
        ap->wmask = 63;
    }
    if ((ap->n_w + 1) * 2 > ap->wmask + 1 &&
        wt_rehash(ap, &ap->w, &ap->wmask, (ap->wmask + 1) * 2) != KVR_OK)
        return NULL;
    size_t i = wt_free_slot(ap->w, ap->wmask, thash(0, w.worker_id, w.dp_rank));
    ap->w[i] = (wcap_t){.worker_id = w.worker_id, .dp_rank = w.dp_rank, .used = 1};
    ap->n_w++;
    return &ap->w[i];
}

static void tdel(kvr_approx_t *ap, timer_t_ *e)
{
    wcap_t *w = wfind(ap, (kvr_worker_t){e->worker_id, e->dp_rank});
    if (w != NULL && w->count > 0)
        w->count--;
    tt_remove_at(ap, ap->t, ap->mask, (size_t)(e - ap->t));
    ap->live--;
}

/* ---- heap ---- */

static bool before(const hent_t *a, const hent_t *b)
{
    if (a->expiry_ms != b->expiry_ms)
        return a->expiry_ms < b->expiry_ms;
    if (a->pos != b->pos)
        return a->pos > b->pos;
    if (a->seq != b->seq)
        return a->seq < b->seq;
    if (a->worker_id != b->worker_id)
        return a->worker_id < b->worker_id;
    return a->dp_rank < b->dp_rank;
}

static void sift_up(hent_t *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&h[i], &h[p]))
            break;
        hent_t tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
}

static void sift_down(hent_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && before(&h[l], &h[m]))
            m = l;
        if (r < n && before(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        hent_t tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
}

static void heap_rebuild(kvr_approx_t *ap)
{
    ap->n_heap = 0;
    for (size_t i = 0; i <= ap->mask; i++) {
        const timer_t_ *e = &ap->t[i];
        if (e->used)
            ap->heap[ap->n_heap++] = (hent_t){e->expiry_ms, e->seq, e->worker_id, e->dp_rank, e->pos};
    }
    for (size_t i = ap->n_heap / 2; i-- > 0;)
        sift_down(ap->heap, ap->n_heap, i);
}

static int heap_push(kvr_approx_t *ap, hent_t e)
{
    if (ap->n_heap > 4 * ap->live + 1024)
        heap_rebuild(ap); /* drop stale entries; live ones are re-created from timers */
    if (ap->n_heap == ap->cap_heap) {
        size_t cap = ap->cap_heap ? ap->cap_heap * 2 : 1024;
        hent_t *nh = realloc(ap->heap, cap * sizeof *nh);
        if (nh == NULL)
            return KVR_ENOMEM;
        ap->heap = nh;
        ap->cap_heap = cap;
    }
    ap->heap[ap->n_heap] = e;
    sift_up(ap->heap, ap->n_heap++);
    return KVR_OK;
}

static hent_t heap_pop(kvr_approx_t *ap)
{
    hent_t top = ap->heap[0];
    ap->heap[0] = ap->heap[--ap->n_heap];
    sift_down(ap->heap, ap->n_heap, 0);
    return top;
}

/* ---- public ---- */

kvr_approx_t *kvr_approx_new(kvr_index_t *ix, const kvr_approx_config_t *cfg, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    if (ix == NULL || kvr_approx_config_validate(cfg, NULL) != KVR_OK) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_approx_t *ap = calloc(1, sizeof *ap);
    if (ap == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    ap->ix = ix;
    ap->cfg = cfg ? *cfg : (kvr_approx_config_t){0};
    if (ap->cfg.ttl_ms == 0)
        ap->cfg.ttl_ms = 120000;
    if (ap->cfg.max_tree_size == 0)
        ap->cfg.max_tree_size = (size_t)1 << 20;
    if (ap->cfg.prune_target_ratio == 0)
        ap->cfg.prune_target_ratio = 0.8;
    kvr_index_stats_t st;
    kvr_index_stats(ix, &st);
    if (st.max_pairs < ap->cfg.max_tree_size) {
        /* the index would evict behind the tracker's back */
        free(ap);
        *status = KVR_ERANGE;
        return NULL;
    }
    ap->t = calloc(1024, sizeof *ap->t);
    if (ap->t == NULL) {
        free(ap);
        *status = KVR_ENOMEM;
        return NULL;
    }
    ap->mask = 1023;
    *status = KVR_OK;
    return ap;
}

void kvr_approx_free(kvr_approx_t *ap)
{
    if (ap == NULL)
        return;
    for (size_t i = 0; ap->w != NULL && i <= ap->wmask; i++)
        if (ap->w[i].used)
            free(ap->w[i].q);
    free(ap->w);
    free(ap->t);
    free(ap->heap);
    free(ap->blocks);
    free(ap);
}

static void remove_one(kvr_approx_t *ap, timer_t_ *e)
{
    uint64_t ext = e->seq;
    kvr_event_t ev = {.kind = KVR_EV_REMOVED,
                      .worker = {e->worker_id, e->dp_rank},
                      .tier = KVR_TIER_DEVICE,
                      .removed = &ext,
                      .n_removed = 1};
    (void)kvr_index_apply(ap->ix, &ev);
    tdel(ap, e);
}

/* Pops heap entries while `more` says so; removes the valid ones. Returns removals. */
static size_t pop_while(kvr_approx_t *ap, uint64_t now_ms, size_t target)
{
    size_t removed = 0;
    while (ap->n_heap > 0) {
        const hent_t *top = &ap->heap[0];
        bool by_time = top->expiry_ms <= now_ms;
        bool by_size = ap->live > target;
        if (!by_time && !by_size)
            break;
        hent_t h = heap_pop(ap);
        kvr_worker_t w = {h.worker_id, h.dp_rank};
        timer_t_ *e = tfind(ap, h.seq, w);
        if (e == NULL || e->expiry_ms != h.expiry_ms)
            continue; /* stale */
        remove_one(ap, e);
        removed++;
    }
    return removed;
}

/* ---- capacity: each bounded rank keeps its recorded blocks, least recently touched first ---- */

static int queue_push(wcap_t *w, qent_t e)
{
    if (w->head + w->n == w->cap_q) {
        if (w->head > 0) { /* slide the live part to the front */
            memmove(w->q, w->q + w->head, w->n * sizeof *w->q);
            w->head = 0;
        }
        if (kvr_grow((void **)&w->q, &w->cap_q, w->n + 1, SIZE_MAX, sizeof *w->q) != KVR_OK)
            return KVR_ENOMEM;
    }
    w->q[w->head + w->n++] = e;
    return KVR_OK;
}

/* Drops the stale entries (their block was touched again or removed) when they are most of
 * the queue, so it stays within a few times the rank's live blocks. */
static void queue_compact(kvr_approx_t *ap, wcap_t *w, kvr_worker_t rank)
{
    if (w->n < 4 * w->count + 1024)
        return;
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        qent_t e = w->q[w->head + i];
        const timer_t_ *t = tfind(ap, e.seq, rank);
        if (t != NULL && t->stamp == e.stamp)
            w->q[k++] = e;
    }
    w->head = 0;
    w->n = k;
}

/* Evicts the rank's least recently touched blocks while it holds more than its capacity. */
static void evict_over_capacity(kvr_approx_t *ap, kvr_worker_t rank)
{
    wcap_t *w = wfind(ap, rank);
    while (w != NULL && w->count > w->cap && w->n > 0) {
        qent_t e = w->q[w->head++];
        w->n--;
        timer_t_ *t = tfind(ap, e.seq, rank);
        if (t == NULL || t->stamp != e.stamp)
            continue; /* touched again later (its newer entry is further on), or gone */
        remove_one(ap, t); /* the rank table does not move: only tdel's count changes */
        ap->evicted++;
    }
    if (w != NULL)
        queue_compact(ap, w, rank);
}

int kvr_approx_record(kvr_approx_t *ap, kvr_worker_t worker, const uint64_t *lbh,
                      const uint64_t *seq, size_t n, uint64_t now_ms)
{
    if (ap == NULL || (n > 0 && (lbh == NULL || seq == NULL)))
        return KVR_EINVAL;
    size_t max = ap->cfg.max_tree_size;
    if (n > max)
        n = max; /* the prefix is what can be reused */
    if (n == 0)
        return KVR_OK;
    if (ap->cap_blocks < n) {
        kvr_block_t *b = realloc(ap->blocks, n * sizeof *b);
        if (b == NULL)
            return KVR_ENOMEM;
        ap->blocks = b;
        ap->cap_blocks = n;
    }
    /* make room first, so neither the tracker nor the index ever holds more than max */
    if (ap->live + n > max) {
        size_t target = (size_t)((double)max * ap->cfg.prune_target_ratio);
        if (target > max - n)
            target = max - n;
        (void)pop_while(ap, 0, target);
    }
    for (size_t i = 0; i < n; i++)
        ap->blocks[i] = (kvr_block_t){.ext = seq[i], .lbh = lbh[i]};
    kvr_event_t ev = {.kind = KVR_EV_STORED,
                      .worker = worker,
                      .tier = KVR_TIER_DEVICE,
                      .blocks = ap->blocks,
                      .n_blocks = n};
    int rc = kvr_index_apply(ap->ix, &ev);
    if (rc != KVR_OK)
        return rc;
    uint64_t expiry = now_ms + ap->cfg.ttl_ms;
    wcap_t *wc = wget(ap, worker);
    if (wc == NULL)
        return KVR_ENOMEM;
    /* deepest first: of one decision's blocks, the capacity queue evicts the deepest first,
     * as an engine frees a sequence's last blocks before its shared prefix */
    for (size_t i = n; i-- > 0;) {
        bool created;
        timer_t_ *e = tget(ap, seq[i], worker, &created);
        if (e == NULL)
            return KVR_ENOMEM;
        wc->count += created;
        e->expiry_ms = expiry;
        e->pos = (uint32_t)i;
        e->stamp = ++ap->stamp;
        rc = heap_push(ap, (hent_t){expiry, seq[i], worker.worker_id, worker.dp_rank, (uint32_t)i});
        if (rc == KVR_OK && wc->cap > 0)
            rc = queue_push(wc, (qent_t){seq[i], e->stamp});
        if (rc != KVR_OK)
            return rc;
    }
    if (wc->cap > 0)
        evict_over_capacity(ap, worker);
    return KVR_OK;
}

static int stamp_cmp(const void *a, const void *b)
{
    const qent_t *x = a, *y = b;
    return x->stamp < y->stamp ? -1 : x->stamp > y->stamp;
}

/* Blocks recorded before the rank's capacity was known: queued in their touch order. */
static int queue_existing(kvr_approx_t *ap, wcap_t *wc, kvr_worker_t worker)
{
    wc->head = wc->n = 0;
    for (size_t i = 0; i <= ap->mask; i++) {
        const timer_t_ *e = &ap->t[i];
        if (e->used && e->worker_id == worker.worker_id && e->dp_rank == worker.dp_rank &&
            queue_push(wc, (qent_t){e->seq, e->stamp}) != KVR_OK)
            return KVR_ENOMEM;
    }
    if (wc->n > 1)
        qsort(wc->q, wc->n, sizeof *wc->q, stamp_cmp);
    return KVR_OK;
}

int kvr_approx_set_capacity(kvr_approx_t *ap, kvr_worker_t worker, uint64_t blocks)
{
    if (ap == NULL)
        return KVR_EINVAL;
    wcap_t *wc = wget(ap, worker);
    if (wc == NULL)
        return KVR_ENOMEM;
    if (wc->cap == 0 && blocks > 0 && wc->count > 0 && queue_existing(ap, wc, worker) != KVR_OK)
        return KVR_ENOMEM;
    wc->cap = blocks;
    if (blocks == 0) {
        wc->head = wc->n = 0;
        return KVR_OK;
    }
    evict_over_capacity(ap, worker);
    return KVR_OK;
}

uint64_t kvr_approx_evicted(const kvr_approx_t *ap) { return ap == NULL ? 0 : ap->evicted; }

size_t kvr_approx_expire(kvr_approx_t *ap, uint64_t now_ms)
{
    return ap == NULL ? 0 : pop_while(ap, now_ms, SIZE_MAX);
}

uint64_t kvr_approx_next_expiry(const kvr_approx_t *ap)
{
    /* the top may be stale, which only makes the caller wake early */
    return (ap == NULL || ap->n_heap == 0) ? UINT64_MAX : ap->heap[0].expiry_ms;
}

size_t kvr_approx_size(const kvr_approx_t *ap) { return ap == NULL ? 0 : ap->live; }

/* Drops the timers of worker_id (one rank, or all); the caller drops the index state. */
static void drop_timers(kvr_approx_t *ap, uint64_t worker_id, bool one_rank, uint32_t dp_rank)
{
    for (size_t i = 0; ap->w != NULL && i <= ap->wmask; i++) {
        wcap_t *w = &ap->w[i];
        if (w->used && w->worker_id == worker_id && (!one_rank || w->dp_rank == dp_rank))
            w->head = w->n = 0;
    }
    for (size_t i = 0; i <= ap->mask;) {
        timer_t_ *e = &ap->t[i];
        if (e->used && e->worker_id == worker_id && (!one_rank || e->dp_rank == dp_rank))
            tdel(ap, e); /* an entry may have shifted into i: look at i again */
        else
            i++;
    }
    heap_rebuild(ap);
}

int kvr_approx_remove_worker(kvr_approx_t *ap, uint64_t worker_id)
{
    if (ap == NULL)
        return KVR_EINVAL;
    drop_timers(ap, worker_id, false, 0);
    return kvr_index_remove_worker(ap->ix, worker_id);
}

int kvr_approx_remove_rank(kvr_approx_t *ap, kvr_worker_t w)
{
    if (ap == NULL)
        return KVR_EINVAL;
    drop_timers(ap, w.worker_id, true, w.dp_rank);
    return kvr_index_remove_rank(ap->ix, w);
}

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
 * skipped); recording past the capacity evicts from its front. Requests in flight
 * (kvr_approx_begin .. _end, kept by the load tracker's slot) model what an engine does with
 * them: from its start (first token) to its end a request pins its blocks (not evictable, as an
 * engine holds a running request's blocks) and holds its output blocks (`anon_held`: capacity
 * used by content no prompt asks for); at its end its outputs, then its prompt deepest first,
 * are touched again (an engine frees a request's blocks into its LRU when it finishes, last
 * block first). Against the engine's own block pool (sim/kvcache.h) this model caches
 * exactly the same prompt blocks (tests/core/test_approx.c); without it, the conversation
 * trace's prediction was 16% high.
 * Invariants (kvr_approx_verify): a bounded rank's `count` is its number of live timers,
 * `anon` the anonymous entries of its queue, `anon_held` the output blocks of its requests in
 * flight, and every live unpinned timer of it has an entry in its queue with the timer's stamp;
 * a timer's pins are the started requests in flight holding it.
 *
 * Memory: timers and heap are bounded by max_tree_size (plus the stale allowance); a bounded
 * rank's queue by 4x its live blocks + 1024; a request in flight keeps a copy of its hashes
 * (16 bytes a block), in buffers reused by its slot.
 * Threads: the index's writer thread.
 * Cost: record O(n log size); expire and prune O(removed log size).
 */
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "base/oatab.h"
#include "base/verify.h"
#include "core/approx.h"

typedef struct timer {
    uint64_t seq;
    uint64_t worker_id;
    uint64_t expiry_ms;
    uint64_t stamp; /* its last touch (the capacity queue's entries name it) */
    uint32_t dp_rank;
    uint32_t pos;
    uint32_t pins; /* requests in flight holding it (kvr_approx_begin .. _end) */
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
    uint64_t anon;  /* freed output blocks in its queue (content no prompt asks for) */
    uint64_t anon_held; /* output blocks of its requests in flight (not evictable) */
    qent_t *q;      /* touches in order; an entry whose timer has another stamp is stale */
    size_t head, n, cap_q;
} wcap_t;

/* A routed request in flight (kvr_approx_begin): its blocks, to touch again when it ends.
 * Kept in a slot named by the key's low half (the load tracker's slot); buffers are reused. */
typedef struct areq {
    uint64_t key; /* 0 = empty */
    kvr_worker_t w;
    size_t n, cap;
    uint64_t n_out; /* its output blocks so far (kvr_approx_output) */
    bool started;   /* its engine admitted it (kvr_approx_start): its blocks are pinned */
    uint64_t *lbh, *seq;
} areq_t;

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
    areq_t *reqs;     /* in flight, by the key's low half */
    size_t cap_reqs;
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

/* ---- timers: a base/oatab.h table keyed by (seq, worker rank) ---- */

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

/* ---- worker ranks: a second base/oatab.h table ---- */

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
    for (size_t i = 0; i < ap->cap_reqs; i++) {
        free(ap->reqs[i].lbh);
        free(ap->reqs[i].seq);
    }
    free(ap->reqs);
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
    if (w->n < 4 * (w->count + w->anon) + 1024)
        return;
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        qent_t e = w->q[w->head + i];
        const timer_t_ *t = e.stamp == 0 ? NULL : tfind(ap, e.seq, rank);
        if (e.stamp == 0 || (t != NULL && t->stamp == e.stamp))
            w->q[k++] = e;
    }
    w->head = 0;
    w->n = k;
}

/* Evicts the rank's least recently touched blocks while it holds more than its capacity. A
 * block held by a request in flight cannot go (an engine evicts only freed blocks): its entry
 * is dropped, and the request's end queues it again. So each entry is popped once. */
static void evict_over_capacity(kvr_approx_t *ap, kvr_worker_t rank)
{
    wcap_t *w = wfind(ap, rank);
    while (w != NULL && w->cap > 0 && w->count + w->anon + w->anon_held > w->cap && w->n > 0) {
        qent_t e = w->q[w->head++];
        w->n--;
        if (e.stamp == 0) { /* a freed output block */
            w->anon--;
            continue;
        }
        timer_t_ *t = tfind(ap, e.seq, rank);
        if (t == NULL || t->stamp != e.stamp || t->pins > 0)
            continue;      /* touched again later (its newer entry is further on), gone, or held */
        remove_one(ap, t); /* the rank table does not move: only tdel's count changes */
        ap->evicted++;
    }
    if (w != NULL)
        queue_compact(ap, w, rank);
}

/* Records (stores and touches) the blocks; the capacity bound is the caller's to apply. */
static int record_blocks(kvr_approx_t *ap, kvr_worker_t worker, const uint64_t *lbh,
                         const uint64_t *seq, size_t n, uint64_t now_ms)
{
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
    return KVR_OK;
}

int kvr_approx_record(kvr_approx_t *ap, kvr_worker_t worker, const uint64_t *lbh,
                      const uint64_t *seq, size_t n, uint64_t now_ms)
{
    if (ap == NULL || (n > 0 && (lbh == NULL || seq == NULL)))
        return KVR_EINVAL;
    int rc = record_blocks(ap, worker, lbh, seq, n, now_ms);
    evict_over_capacity(ap, worker);
    return rc;
}

/* Pins (+1) or unpins (-1) the request's blocks still recorded. */
static void pin(kvr_approx_t *ap, const areq_t *q, int d)
{
    for (size_t i = 0; i < q->n; i++) {
        timer_t_ *t = tfind(ap, q->seq[i], q->w);
        if (t != NULL && (d > 0 || t->pins > 0))
            t->pins = (uint32_t)((int64_t)t->pins + d);
    }
}

/* Drops the request: unpins its blocks and gives back its outputs' hold (they are not queued:
 * the caller queues them when the request ended normally). */
static void forget(kvr_approx_t *ap, areq_t *q)
{
    if (q->started)
        pin(ap, q, -1);
    wcap_t *wc = wfind(ap, q->w);
    if (wc != NULL)
        wc->anon_held -= q->n_out < wc->anon_held ? q->n_out : wc->anon_held;
    q->key = 0;
}

int kvr_approx_begin(kvr_approx_t *ap, uint64_t key, kvr_worker_t worker, const uint64_t *lbh,
                     const uint64_t *seq, size_t n, uint64_t now_ms)
{
    if (ap == NULL || key == 0 || (n > 0 && (lbh == NULL || seq == NULL)))
        return KVR_EINVAL;
    size_t slot = (uint32_t)key, old = ap->cap_reqs;
    if (slot >= old) {
        if (kvr_grow((void **)&ap->reqs, &ap->cap_reqs, slot + 1, SIZE_MAX, sizeof *ap->reqs) !=
            KVR_OK)
            return KVR_ENOMEM;
        memset(ap->reqs + old, 0, (ap->cap_reqs - old) * sizeof *ap->reqs);
    }
    areq_t *q = &ap->reqs[slot];
    if (q->key != 0) /* the slot's earlier request never ended here: it ends now */
        (void)kvr_approx_end(ap, q->key, now_ms);
    if (q->cap < n) {
        uint64_t *a = realloc(q->lbh, n * sizeof *a);
        if (a != NULL)
            q->lbh = a;
        uint64_t *b = realloc(q->seq, n * sizeof *b);
        if (b != NULL)
            q->seq = b;
        if (a == NULL || b == NULL)
            return KVR_ENOMEM;
        q->cap = n;
    }
    int rc = record_blocks(ap, worker, lbh, seq, n, now_ms);
    if (rc == KVR_OK) {
        memcpy(q->lbh, lbh, n * sizeof *lbh);
        memcpy(q->seq, seq, n * sizeof *seq);
        *q = (areq_t){.key = key, .w = worker, .n = n, .cap = q->cap, .lbh = q->lbh, .seq = q->seq};
    }
    evict_over_capacity(ap, worker);
    return rc;
}

/* The request in slot key, or NULL. */
static areq_t *req_of(kvr_approx_t *ap, uint64_t key)
{
    size_t slot = (uint32_t)key;
    if (ap == NULL || key == 0 || slot >= ap->cap_reqs || ap->reqs[slot].key != key)
        return NULL;
    return &ap->reqs[slot];
}

int kvr_approx_start(kvr_approx_t *ap, uint64_t key, uint64_t now_ms)
{
    areq_t *q = req_of(ap, key);
    if (q == NULL)
        return ap == NULL ? KVR_EINVAL : KVR_ENOTFOUND;
    if (q->started)
        return KVR_OK;
    /* its engine allocated its blocks and holds them until it ends: pinned before the bound,
     * as an engine evicts none it admits. Blocks gone since its routing are computed again:
     * recorded again (the whole chain, as an index store needs it); when none is gone there is
     * nothing to touch (a pinned block is never evicted, and the end touches them all) */
    int rc = KVR_OK;
    for (size_t i = 0; i < q->n; i++)
        if (tfind(ap, q->seq[i], q->w) == NULL) {
            rc = record_blocks(ap, q->w, q->lbh, q->seq, q->n, now_ms);
            break;
        }
    q->started = true;
    pin(ap, q, 1);
    evict_over_capacity(ap, q->w);
    return rc;
}

int kvr_approx_output(kvr_approx_t *ap, uint64_t key)
{
    areq_t *q = req_of(ap, key);
    if (q == NULL)
        return ap == NULL ? KVR_EINVAL : KVR_ENOTFOUND;
    q->n_out++;
    wcap_t *wc = wfind(ap, q->w);
    if (wc != NULL) {
        wc->anon_held++;
        evict_over_capacity(ap, q->w);
    }
    return KVR_OK;
}

int kvr_approx_end(kvr_approx_t *ap, uint64_t key, uint64_t now_ms)
{
    areq_t *q = req_of(ap, key);
    if (q == NULL)
        return ap == NULL ? KVR_EINVAL : KVR_ENOTFOUND;
    forget(ap, q);
    /* freed as an engine frees a sequence, last block first: its outputs, then its prompt
     * deepest first, all behind every block freed before */
    wcap_t *wc = wfind(ap, q->w);
    for (uint64_t i = 0; wc != NULL && wc->cap > 0 && i < q->n_out; i++) {
        if (queue_push(wc, (qent_t){0, 0}) != KVR_OK)
            return KVR_ENOMEM;
        wc->anon++;
    }
    int rc = record_blocks(ap, q->w, q->lbh, q->seq, q->n, now_ms);
    evict_over_capacity(ap, q->w);
    return rc;
}

/* Marks (used = 2) every timer of rank that a current entry of its queue names. */
static void mark_queued(kvr_approx_t *ap, const wcap_t *w, kvr_worker_t rank)
{
    for (size_t i = 0; i < w->n; i++) {
        qent_t e = w->q[w->head + i];
        timer_t_ *t = e.stamp == 0 ? NULL : tfind(ap, e.seq, rank);
        if (t != NULL && t->stamp == e.stamp)
            t->used = 2;
    }
}

static int verify_rank(kvr_approx_t *ap, const wcap_t *w, const uint32_t *pins, char *msg,
                       size_t msg_len)
{
    kvr_worker_t rank = {w->worker_id, w->dp_rank};
    uint64_t live = 0, anon = 0, held = 0;
    for (size_t i = 0; i < w->n; i++)
        anon += w->q[w->head + i].stamp == 0;
    for (size_t i = 0; i < ap->cap_reqs; i++)
        if (ap->reqs[i].key != 0 && ap->reqs[i].w.worker_id == rank.worker_id &&
            ap->reqs[i].w.dp_rank == rank.dp_rank)
            held += ap->reqs[i].n_out;
    if (w->cap > 0)
        mark_queued(ap, w, rank);
    size_t bad_pins = SIZE_MAX, unqueued = SIZE_MAX; /* the first timer breaking each rule */
    for (size_t i = 0; i <= ap->mask; i++) { /* every mark is cleared, even past a failure */
        timer_t_ *t = &ap->t[i];
        bool queued = t->used == 2;
        if (queued)
            t->used = 1;
        if (!t->used || t->worker_id != rank.worker_id || t->dp_rank != rank.dp_rank)
            continue;
        live++;
        if (t->pins != pins[i] && bad_pins == SIZE_MAX)
            bad_pins = i;
        if (w->cap > 0 && t->pins == 0 && !queued && unqueued == SIZE_MAX)
            unqueued = i;
    }
    if (bad_pins != SIZE_MAX)
        KVR_VERIFY_FAIL(
            "approx: worker %llu rank %u: a block has %u pins, %u started requests hold it",
            (unsigned long long)rank.worker_id, rank.dp_rank, ap->t[bad_pins].pins, pins[bad_pins]);
    if (unqueued != SIZE_MAX)
        KVR_VERIFY_FAIL("approx: worker %llu rank %u: an unpinned block has no queue entry",
                        (unsigned long long)rank.worker_id, rank.dp_rank);
    if (live != w->count)
        KVR_VERIFY_FAIL("approx: worker %llu rank %u: count %llu, %llu live blocks",
                        (unsigned long long)rank.worker_id, rank.dp_rank,
                        (unsigned long long)w->count, (unsigned long long)live);
    if (w->cap > 0 && anon != w->anon)
        KVR_VERIFY_FAIL("approx: worker %llu rank %u: anon %llu, %llu queued",
                        (unsigned long long)rank.worker_id, rank.dp_rank,
                        (unsigned long long)w->anon, (unsigned long long)anon);
    if (held != w->anon_held)
        KVR_VERIFY_FAIL("approx: worker %llu rank %u: anon_held %llu, its requests hold %llu",
                        (unsigned long long)rank.worker_id, rank.dp_rank,
                        (unsigned long long)w->anon_held, (unsigned long long)held);
    return KVR_OK;
}

int kvr_approx_verify(kvr_approx_t *ap, char *msg, size_t msg_len)
{
    if (ap == NULL)
        KVR_VERIFY_FAIL("approx: NULL");
    uint32_t *pins = calloc(ap->mask + 1, sizeof *pins);
    if (pins == NULL)
        return KVR_ENOMEM;
    for (size_t i = 0; i < ap->cap_reqs; i++) {
        const areq_t *q = &ap->reqs[i];
        for (size_t k = 0; q->key != 0 && q->started && k < q->n; k++) {
            const timer_t_ *t = tfind(ap, q->seq[k], q->w);
            if (t != NULL)
                pins[t - ap->t]++;
        }
    }
    int rc = KVR_OK;
    for (size_t i = 0; rc == KVR_OK && ap->w != NULL && i <= ap->wmask; i++)
        if (ap->w[i].used)
            rc = verify_rank(ap, &ap->w[i], pins, msg, msg_len);
    free(pins);
    return rc;
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
        wc->head = wc->n = wc->anon = 0;
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
            w->head = w->n = w->anon = w->anon_held = 0;
    }
    for (size_t i = 0; i < ap->cap_reqs; i++) { /* its requests in flight end unrecorded */
        areq_t *q = &ap->reqs[i];
        if (q->key != 0 && q->w.worker_id == worker_id && (!one_rank || q->w.dp_rank == dp_rank))
            q->key = 0;
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

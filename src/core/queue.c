/*
 * queue.c: requests waiting because every eligible worker is busy (as in Dynamo's KV router).
 *
 * Order (best first): higher strict_priority, then higher policy score, then earlier
 * enqueue sequence. The score is fixed at enqueue:
 *   fcfs  max(priority_jump, 0) - arrival_offset_secs   (priority_jump = seconds of head start)
 *   lcfs  max(priority_jump, 0) + arrival_offset_secs
 *   wspt  (1 + max(priority_jump, 0)) / max(cost_tokens, 1)   (Smith's rule)
 * arrival_offset_secs counts from the first enqueue the queue saw. Pop hands the best entry
 * back; the caller re-scores it against fresh loads (and may re-query overlap). The caller
 * also keeps arrivals from overtaking a backlog: route directly only when the queue is empty.
 *
 * Structure: a slot array of fixed capacity, a free list through unused slots, and two
 * indexed binary heaps over slot numbers, one in dispatch order and one by deadline (then
 * sequence), so pop, remove-by-handle and expiry are all O(log n).
 * Invariants (kvr_queue_verify): both heaps hold exactly the live slots, each slot knows its
 * position in each heap, both heap orders hold; the free list holds the other slots; the
 * gauges are the count and ISL sum of live slots; enqueued = dispatched + expired + cancelled
 * + pending. A handle is (generation << 32 | slot); the generation changes each time a slot is
 * freed, so a stale handle never names a later request.
 *
 * Memory: everything is allocated by kvr_queue_new (about 100 bytes a slot); enqueue never
 * allocates. Threads: one owner thread (the event loop); no locking. Time is passed in.
 * Cost: push, pop, remove, expire O(log n); peek, stats O(1); verify O(capacity).
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/queue.h"
#include "base/verify.h"

#define NIL UINT32_MAX
enum { ORDER = 0, DEADLINE = 1 };

typedef struct slot {
    kvr_queue_item_t item;
    double score;
    uint64_t seq;
    uint64_t enqueued_ms;
    uint64_t deadline_ms;
    uint32_t gen;
    uint32_t pos[2];    /* position in each heap; NIL when free */
    uint32_t next_free;
} slot_t;

struct kvr_queue {
    kvr_queue_config_t cfg;
    size_t max_requests;
    uint64_t max_isl;
    slot_t *slots;
    uint32_t *heap[2];
    size_t n;
    uint32_t free_head;
    uint64_t next_seq;
    bool has_epoch;
    uint64_t epoch_ms;
    kvr_queue_stats_t st;
};

int kvr_queue_config_validate(const kvr_queue_config_t *cfg, const char **field)
{
    const char *dummy;
    if (field == NULL)
        field = &dummy;
    *field = NULL;
    if (cfg == NULL) {
        *field = "queue_config";
        return KVR_EINVAL;
    }
    if (cfg->capacity < 2 || cfg->capacity > KVR_QUEUE_MAX_CAPACITY) {
        *field = "queue_capacity";
        return KVR_EINVAL;
    }
    if (cfg->order != KVR_QUEUE_ORDER_FCFS && cfg->order != KVR_QUEUE_ORDER_WSPT &&
        cfg->order != KVR_QUEUE_ORDER_LCFS) {
        *field = "router_queue_policy";
        return KVR_EINVAL;
    }
    return KVR_OK;
}

kvr_queue_t *kvr_queue_new(const kvr_queue_config_t *cfg, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    if (kvr_queue_config_validate(cfg, NULL) != KVR_OK) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_queue_t *q = calloc(1, sizeof *q);
    if (q != NULL) {
        q->slots = calloc(cfg->capacity, sizeof *q->slots);
        q->heap[ORDER] = calloc(cfg->capacity, sizeof *q->heap[ORDER]);
        q->heap[DEADLINE] = calloc(cfg->capacity, sizeof *q->heap[DEADLINE]);
    }
    if (q == NULL || q->slots == NULL || q->heap[ORDER] == NULL || q->heap[DEADLINE] == NULL) {
        kvr_queue_free(q);
        *status = KVR_ENOMEM;
        return NULL;
    }
    q->cfg = *cfg;
    q->max_requests = cfg->capacity;
    q->max_isl = cfg->max_pending_isl_tokens;
    for (size_t i = 0; i < cfg->capacity; i++) {
        slot_t *s = &q->slots[i];
        s->gen = 1;
        s->pos[ORDER] = s->pos[DEADLINE] = NIL;
        s->next_free = i + 1 < cfg->capacity ? (uint32_t)(i + 1) : NIL;
    }
    q->free_head = 0;
    *status = KVR_OK;
    return q;
}

void kvr_queue_free(kvr_queue_t *q)
{
    if (q == NULL)
        return;
    free(q->slots);
    free(q->heap[ORDER]);
    free(q->heap[DEADLINE]);
    free(q);
}

int kvr_queue_set_limits(kvr_queue_t *q, size_t max_requests, uint64_t max_pending_isl_tokens)
{
    if (q == NULL)
        return KVR_EINVAL;
    if (max_requests > q->cfg.capacity)
        return KVR_ERANGE;
    q->max_requests = max_requests ? max_requests : q->cfg.capacity;
    q->max_isl = max_pending_isl_tokens;
    return KVR_OK;
}

/* ---- two indexed heaps over slot numbers ---- */

static bool before(const kvr_queue_t *q, int h, uint32_t a, uint32_t b)
{
    const slot_t *x = &q->slots[a], *y = &q->slots[b];
    if (h == DEADLINE) {
        if (x->deadline_ms != y->deadline_ms)
            return x->deadline_ms < y->deadline_ms;
        return x->seq < y->seq;
    }
    if (x->item.strict_priority != y->item.strict_priority)
        return x->item.strict_priority > y->item.strict_priority;
    if (x->score != y->score)
        return x->score > y->score;
    return x->seq < y->seq;
}

static void place(kvr_queue_t *q, int h, size_t i, uint32_t s)
{
    q->heap[h][i] = s;
    q->slots[s].pos[h] = (uint32_t)i;
}

static void sift_up(kvr_queue_t *q, int h, size_t i)
{
    uint32_t s = q->heap[h][i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(q, h, s, q->heap[h][p]))
            break;
        place(q, h, i, q->heap[h][p]);
        i = p;
    }
    place(q, h, i, s);
}

static void sift_down(kvr_queue_t *q, int h, size_t n, size_t i)
{
    uint32_t s = q->heap[h][i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = l;
        if (l >= n)
            break;
        if (r < n && before(q, h, q->heap[h][r], q->heap[h][l]))
            m = r;
        if (!before(q, h, q->heap[h][m], s))
            break;
        place(q, h, i, q->heap[h][m]);
        i = m;
    }
    place(q, h, i, s);
}

/* Takes slot s out of heap h, which holds n entries (s included). */
static void heap_delete(kvr_queue_t *q, int h, size_t n, uint32_t s)
{
    size_t i = q->slots[s].pos[h], last = n - 1;
    q->slots[s].pos[h] = NIL;
    if (i == last)
        return;
    uint32_t moved = q->heap[h][last];
    place(q, h, i, moved);
    if (i > 0 && before(q, h, moved, q->heap[h][(i - 1) / 2]))
        sift_up(q, h, i);
    else
        sift_down(q, h, last, i);
}

/* ---- slots ---- */

static kvr_queue_handle_t handle_of(const kvr_queue_t *q, uint32_t s)
{
    return ((uint64_t)q->slots[s].gen << 32) | s;
}

static void copy_out(const kvr_queue_t *q, uint32_t s, kvr_queue_entry_t *out)
{
    if (out == NULL)
        return;
    const slot_t *x = &q->slots[s];
    *out = (kvr_queue_entry_t){.item = x->item,
                               .handle = handle_of(q, s),
                               .seq = x->seq,
                               .enqueued_ms = x->enqueued_ms,
                               .deadline_ms = x->deadline_ms,
                               .score = x->score};
}

/* Exports slot s, unlinks it from both heaps and frees it; returns it to the caller. */
static void take(kvr_queue_t *q, uint32_t s, kvr_queue_entry_t *out)
{
    copy_out(q, s, out);
    heap_delete(q, ORDER, q->n, s);
    heap_delete(q, DEADLINE, q->n, s);
    q->n--;
    slot_t *x = &q->slots[s];
    q->st.pending--;
    q->st.pending_isl_tokens -= x->item.isl_tokens;
    x->gen = x->gen == UINT32_MAX ? 1 : x->gen + 1;
    x->next_free = q->free_head;
    q->free_head = s;
}

static double score_of(const kvr_queue_t *q, const kvr_queue_item_t *it, uint64_t now_ms)
{
    double jump = it->priority_jump > 0 ? it->priority_jump : 0;
    double offset_secs = ((double)now_ms - (double)q->epoch_ms) / 1000.0;
    switch (q->cfg.order) {
    case KVR_QUEUE_ORDER_WSPT:
        return (1.0 + jump) / (double)(it->cost_tokens ? it->cost_tokens : 1);
    case KVR_QUEUE_ORDER_LCFS:
        return jump + offset_secs;
    case KVR_QUEUE_ORDER_FCFS:
    default:
        return jump - offset_secs;
    }
}

/* The O(1) part of the invariants (the rest is kvr_queue_verify's): the counters add up and
 * the live count is the gauge, within capacity. Asserted after every change in debug builds. */
#ifndef NDEBUG
static bool counts_ok(const kvr_queue_t *q)
{
    return q->n == q->st.pending && q->n <= q->cfg.capacity &&
           q->st.enqueued == q->st.dispatched + q->st.expired + q->st.cancelled + q->st.pending;
}
#endif

static bool full(const kvr_queue_t *q)
{
    return q->n >= q->max_requests || (q->max_isl != 0 && q->st.pending_isl_tokens >= q->max_isl);
}

int kvr_queue_push(kvr_queue_t *q, const kvr_queue_item_t *item, uint64_t now_ms,
                   kvr_queue_handle_t *handle)
{
    if (q == NULL || item == NULL || !isfinite(item->priority_jump))
        return KVR_EINVAL;
    if (full(q)) {
        q->st.rejected++;
        return KVR_EQUEUEFULL;
    }
    if (!q->has_epoch) {
        q->has_epoch = true;
        q->epoch_ms = now_ms;
    }
    uint32_t s = q->free_head;
    slot_t *x = &q->slots[s];
    q->free_head = x->next_free;
    x->item = *item;
    x->score = score_of(q, item, now_ms);
    x->seq = q->next_seq++;
    x->enqueued_ms = now_ms;
    x->deadline_ms = item->timeout_ms == 0 || item->timeout_ms > UINT64_MAX - now_ms
                         ? UINT64_MAX
                         : now_ms + item->timeout_ms;
    x->next_free = NIL;
    size_t i = q->n++;
    place(q, ORDER, i, s);
    place(q, DEADLINE, i, s);
    sift_up(q, ORDER, i);
    sift_up(q, DEADLINE, i);
    q->st.pending++;
    q->st.pending_isl_tokens += item->isl_tokens;
    q->st.enqueued++;
    assert(counts_ok(q));
    if (handle != NULL)
        *handle = handle_of(q, s);
    return KVR_OK;
}

int kvr_queue_peek(const kvr_queue_t *q, kvr_queue_entry_t *out)
{
    if (q == NULL || q->n == 0)
        return KVR_ENOTFOUND;
    copy_out(q, q->heap[ORDER][0], out);
    return KVR_OK;
}

int kvr_queue_pop(kvr_queue_t *q, kvr_queue_entry_t *out)
{
    if (q == NULL || q->n == 0)
        return KVR_ENOTFOUND;
    take(q, q->heap[ORDER][0], out);
    q->st.dispatched++;
    assert(counts_ok(q));
    return KVR_OK;
}

int kvr_queue_remove(kvr_queue_t *q, kvr_queue_handle_t h, kvr_queue_entry_t *out)
{
    if (q == NULL)
        return KVR_EINVAL;
    uint64_t s = h & UINT32_MAX;
    if (s >= q->cfg.capacity || q->slots[s].pos[ORDER] == NIL || handle_of(q, (uint32_t)s) != h)
        return KVR_ENOTFOUND;
    take(q, (uint32_t)s, out);
    q->st.cancelled++;
    assert(counts_ok(q));
    return KVR_OK;
}

int kvr_queue_expire(kvr_queue_t *q, uint64_t now_ms, kvr_queue_entry_t *out)
{
    if (q == NULL || q->n == 0)
        return KVR_ENOTFOUND;
    uint32_t s = q->heap[DEADLINE][0];
    if (q->slots[s].deadline_ms > now_ms || q->slots[s].deadline_ms == UINT64_MAX)
        return KVR_ENOTFOUND;
    take(q, s, out);
    q->st.expired++;
    assert(counts_ok(q));
    return KVR_OK;
}

uint64_t kvr_queue_next_deadline(const kvr_queue_t *q)
{
    return (q == NULL || q->n == 0) ? UINT64_MAX : q->slots[q->heap[DEADLINE][0]].deadline_ms;
}

size_t kvr_queue_len(const kvr_queue_t *q) { return q == NULL ? 0 : q->n; }

void kvr_queue_stats(const kvr_queue_t *q, kvr_queue_stats_t *out)
{
    if (out != NULL)
        *out = q == NULL ? (kvr_queue_stats_t){0} : q->st;
}

/* ---- verify ---- */

#define FAIL KVR_VERIFY_FAIL

static int verify_heap(const kvr_queue_t *q, int h, char *msg, size_t msg_len)
{
    for (size_t i = 0; i < q->n; i++) {
        uint32_t s = q->heap[h][i];
        if (s >= q->cfg.capacity || q->slots[s].pos[h] != i)
            FAIL("heap %d: entry %zu names slot %u whose position disagrees", h, i, s);
        if (i > 0 && before(q, h, s, q->heap[h][(i - 1) / 2]))
            FAIL("heap %d: entry %zu precedes its parent", h, i);
    }
    return KVR_OK;
}

static int verify_slots(const kvr_queue_t *q, char *msg, size_t msg_len)
{
    size_t live = 0, n_free = 0;
    uint64_t isl = 0;
    for (size_t i = 0; i < q->cfg.capacity; i++) {
        const slot_t *x = &q->slots[i];
        bool in0 = x->pos[ORDER] != NIL, in1 = x->pos[DEADLINE] != NIL;
        if (in0 != in1)
            FAIL("slot %zu is in one heap only", i);
        if (x->gen == 0)
            FAIL("slot %zu has generation 0", i);
        if (in0) {
            live++;
            isl += x->item.isl_tokens;
        }
    }
    for (uint32_t s = q->free_head; s != NIL; s = q->slots[s].next_free) {
        if (s >= q->cfg.capacity || q->slots[s].pos[ORDER] != NIL || ++n_free > q->cfg.capacity)
            FAIL("free list broken at slot %u", s);
    }
    if (live != q->n || live + n_free != q->cfg.capacity)
        FAIL("live %zu, free %zu, n %zu, capacity %zu", live, n_free, q->n, q->cfg.capacity);
    if (q->st.pending != live || q->st.pending_isl_tokens != isl)
        FAIL("gauges %llu/%llu, counted %zu/%llu", (unsigned long long)q->st.pending,
             (unsigned long long)q->st.pending_isl_tokens, live, (unsigned long long)isl);
    return KVR_OK;
}

int kvr_queue_verify(const kvr_queue_t *q, char *msg, size_t msg_len)
{
    if (q == NULL)
        FAIL("NULL queue");
    if (q->n > q->cfg.capacity)
        FAIL("%zu entries over capacity %zu", q->n, q->cfg.capacity);
    int rc = verify_slots(q, msg, msg_len);
    if (rc == KVR_OK)
        rc = verify_heap(q, ORDER, msg, msg_len);
    if (rc == KVR_OK)
        rc = verify_heap(q, DEADLINE, msg, msg_len);
    if (rc != KVR_OK)
        return rc;
    const kvr_queue_stats_t *st = &q->st;
    if (st->enqueued != st->dispatched + st->expired + st->cancelled + st->pending)
        FAIL("counters: enqueued %llu != dispatched %llu + expired %llu + cancelled %llu + "
             "pending %llu",
             (unsigned long long)st->enqueued, (unsigned long long)st->dispatched,
             (unsigned long long)st->expired, (unsigned long long)st->cancelled,
             (unsigned long long)st->pending);
    return KVR_OK;
}

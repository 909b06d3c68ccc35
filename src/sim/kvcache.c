/*
 * kvcache.c: the simulated engine's paged KV cache with prefix caching (see kvcache.h for the
 * model: free / cached / active blocks, the free queue order, dedup on commit, the events).
 *
 *   blocks   one array of num_blocks records: refcount, hash (when `hashed`), free-queue links
 *            (prev / next block ids, NONE at the ends) and a scratch mark (see below).
 *   queue    head / tail / length of the doubly linked free queue threaded through the blocks;
 *            at creation it holds blocks 0 .. num_blocks-1 in id order.
 *   table    open addressing (linear probing, capacity a power of two >= 2 * num_blocks, so
 *            load <= 1/2 since a block holds at most one hash) of (hash, block id) entries; an
 *            empty slot has block id NONE, so every u64 (0 included) is a legal hash. Deletion
 *            shifts the probe chain back (no tombstones).
 *   marks    a block's mark equals the cache's epoch when the current call has already seen it:
 *            a hash repeated in a hit list or in a commit is rejected without a second table.
 *
 * Invariants (checked by kvr_kvcache_verify):
 *   - refcount = the number of sequence tables holding the block; each table holds a block at
 *     most once;
 *   - refcount == 0 <=> the block is in the free queue; the queue's links are consistent and
 *     its length is the counter n_free;
 *   - a block is hashed <=> the table maps its hash to it (so one hash, one block);
 *   - with prefix caching a sequence's first n_full blocks are hashed and the rest are not
 *     (a sequence's uncommitted blocks are fresh from the queue, held by it alone); without
 *     prefix caching nothing is hashed;
 *   - stored_blocks = removed_blocks + cleared_blocks + (hashes in the table).
 *
 * Events are emitted when the cache is consistent (a commit advances seq->n_full block by
 * block, so a sink may call the const functions). The sink must not mutate the cache.
 *
 * Memory: the cache owns blocks, table and a num_blocks-long eviction buffer (the hashes of one
 * REMOVED event), all allocated by _new. Sequence tables are the caller's; allocate() grows
 * them geometrically before mutating anything, so ENOMEM leaves everything unchanged.
 * Threads: one thread. Cost: see kvcache.h; commit() additionally walks the sequence's
 * committed blocks once when a hash it commits is held by an active block (a dedup against a
 * concurrent prefill), to reject a hash that repeats inside the sequence.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/oatab.h"
#include "kvrouter.h"
#include "base/verify.h"

#include "sim/kvcache.h"

#define NONE UINT32_MAX
#define SEQ_MIN_CAP 8u

typedef struct blk {
    uint64_t hash;
    uint32_t ref;
    uint32_t prev, next; /* free queue; meaningful only while ref == 0 */
    uint32_t mark;
    uint8_t hashed;
} blk_t;

typedef struct slot {
    uint64_t hash;
    uint32_t blk; /* NONE = empty */
    uint32_t pad_;
} slot_t;

struct kvr_kvcache {
    kvr_kvcache_config_t cfg;
    kvr_kvcache_sink_fn sink;
    void *sink_ctx;
    blk_t *blk;
    uint32_t head, tail, n_free;
    uint32_t n_active, n_cached;
    uint32_t epoch;
    slot_t *tab;
    size_t mask;
    uint64_t *evicted; /* num_blocks */
    kvr_kvcache_stats_t st; /* counters; gauges filled by get_stats */
};

/* ---- prefix table ---- */

#define TAB_HOME(c, e) kvr_mix64((e)->hash)
#define TAB_EMPTY(e) ((e)->blk == NONE)
#define TAB_CLEAR(e) ((e)->blk = NONE)
KVR_OATAB_DEFINE(pt, kvr_kvcache_t, slot_t, TAB_HOME, TAB_EMPTY, TAB_CLEAR)

static bool hash_is(const kvr_kvcache_t *kc, const slot_t *e, const void *key)
{
    (void)kc;
    return e->hash == *(const uint64_t *)key;
}

static uint32_t tab_find(const kvr_kvcache_t *kc, uint64_t h)
{
    const slot_t *e = pt_find(kc, kc->tab, kc->mask, kvr_mix64(h), hash_is, &h);
    return e == NULL ? NONE : e->blk;
}

/* The hash must be absent (callers look it up first). */
static void tab_put(kvr_kvcache_t *kc, uint64_t h, uint32_t b)
{
    kc->tab[pt_free_slot(kc->tab, kc->mask, kvr_mix64(h))] = (slot_t){.hash = h, .blk = b};
}

/* The hash must be present. */
static void tab_del(kvr_kvcache_t *kc, uint64_t h)
{
    slot_t *e = pt_find(kc, kc->tab, kc->mask, kvr_mix64(h), hash_is, &h);
    pt_remove_at(kc, kc->tab, kc->mask, (size_t)(e - kc->tab));
}

/* ---- free queue ---- */

static void q_push_head(kvr_kvcache_t *kc, uint32_t b)
{
    blk_t *x = &kc->blk[b];
    x->prev = NONE;
    x->next = kc->head;
    if (kc->head != NONE)
        kc->blk[kc->head].prev = b;
    else
        kc->tail = b;
    kc->head = b;
    kc->n_free++;
}

static void q_push_tail(kvr_kvcache_t *kc, uint32_t b)
{
    blk_t *x = &kc->blk[b];
    x->next = NONE;
    x->prev = kc->tail;
    if (kc->tail != NONE)
        kc->blk[kc->tail].next = b;
    else
        kc->head = b;
    kc->tail = b;
    kc->n_free++;
}

static void q_remove(kvr_kvcache_t *kc, uint32_t b)
{
    blk_t *x = &kc->blk[b];
    if (x->prev != NONE)
        kc->blk[x->prev].next = x->next;
    else
        kc->head = x->next;
    if (x->next != NONE)
        kc->blk[x->next].prev = x->prev;
    else
        kc->tail = x->prev;
    x->prev = x->next = NONE;
    kc->n_free--;
}

/* ---- refcounts ---- */

/* Takes a reference; a block leaving refcount 0 leaves the queue. */
static void take(kvr_kvcache_t *kc, uint32_t b)
{
    if (kc->blk[b].ref++ == 0) {
        q_remove(kc, b);
        kc->n_active++;
    }
}

/* Drops a reference; at 0 a hashed block goes to the tail (evicted last), a plain one to the
 * head (reused first: it caches nothing). */
static void drop(kvr_kvcache_t *kc, uint32_t b)
{
    if (--kc->blk[b].ref != 0)
        return;
    kc->n_active--;
    if (kc->blk[b].hashed)
        q_push_tail(kc, b);
    else
        q_push_head(kc, b);
}

/* A fresh epoch for marks; on wrap every mark is cleared so no stale mark matches. */
static uint32_t next_epoch(kvr_kvcache_t *kc)
{
    if (++kc->epoch == 0) {
        for (uint32_t b = 0; b < kc->cfg.num_blocks; b++)
            kc->blk[b].mark = 0;
        kc->epoch = 1;
    }
    return kc->epoch;
}

static void emit(const kvr_kvcache_t *kc, const kvr_kvcache_event_t *ev)
{
    if (kc->sink != NULL)
        kc->sink(kc->sink_ctx, ev);
}

/* ---- lifecycle ---- */

kvr_kvcache_t *kvr_kvcache_new(const kvr_kvcache_config_t *cfg, kvr_kvcache_sink_fn sink,
                               void *sink_ctx, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    if (cfg == NULL || cfg->num_blocks == 0 || cfg->num_blocks == NONE || cfg->block_size == 0) {
        *status = KVR_EINVAL;
        return NULL;
    }
    size_t cap = 16;
    while (cap < 2 * (size_t)cfg->num_blocks)
        cap *= 2;
    kvr_kvcache_t *kc = calloc(1, sizeof *kc);
    if (kc != NULL) {
        kc->blk = calloc(cfg->num_blocks, sizeof *kc->blk);
        kc->tab = malloc(cap * sizeof *kc->tab);
        kc->evicted = malloc((size_t)cfg->num_blocks * sizeof *kc->evicted);
    }
    if (kc == NULL || kc->blk == NULL || kc->tab == NULL || kc->evicted == NULL) {
        kvr_kvcache_free(kc);
        *status = KVR_ENOMEM;
        return NULL;
    }
    kc->cfg = *cfg;
    kc->sink = sink;
    kc->sink_ctx = sink_ctx;
    kc->mask = cap - 1;
    for (size_t i = 0; i < cap; i++)
        kc->tab[i].blk = NONE;
    kc->head = kc->tail = NONE;
    for (uint32_t b = 0; b < cfg->num_blocks; b++)
        q_push_tail(kc, b);
    *status = KVR_OK;
    return kc;
}

kvr_kvcache_t *kvr_kvcache_clone(const kvr_kvcache_t *src, int *status)
{
    kvr_kvcache_t *kc = kvr_kvcache_new(&src->cfg, NULL, NULL, status);
    if (kc == NULL)
        return NULL;
    kvr_kvcache_t keep = *kc; /* the clone's own arrays */
    *kc = *src;
    kc->sink = NULL;
    kc->sink_ctx = NULL;
    kc->blk = keep.blk;
    kc->tab = keep.tab;
    kc->evicted = keep.evicted;
    memcpy(kc->blk, src->blk, (size_t)src->cfg.num_blocks * sizeof *kc->blk);
    memcpy(kc->tab, src->tab, (src->mask + 1) * sizeof *kc->tab);
    return kc;
}

void kvr_kvcache_free(kvr_kvcache_t *kc)
{
    if (kc == NULL)
        return;
    free(kc->blk);
    free(kc->tab);
    free(kc->evicted);
    free(kc);
}

void kvr_kvcache_seq_init(kvr_kvcache_seq_t *seq)
{
    if (seq != NULL)
        *seq = (kvr_kvcache_seq_t){0};
}

void kvr_kvcache_seq_deinit(kvr_kvcache_seq_t *seq)
{
    if (seq == NULL)
        return;
    free(seq->blocks);
    *seq = (kvr_kvcache_seq_t){0};
}

/* ---- lookups ---- */

size_t kvr_kvcache_match(const kvr_kvcache_t *kc, const uint64_t *seq_hashes, size_t n)
{
    if (kc == NULL || seq_hashes == NULL)
        return 0;
    size_t i = 0;
    while (i < n && tab_find(kc, seq_hashes[i]) != NONE)
        i++;
    return i;
}

uint32_t kvr_kvcache_n_free(const kvr_kvcache_t *kc) { return kc != NULL ? kc->n_free : 0; }

uint32_t kvr_kvcache_block_size(const kvr_kvcache_t *kc)
{
    return kc != NULL ? kc->cfg.block_size : 0;
}

double kvr_kvcache_usage(const kvr_kvcache_t *kc)
{
    return kc != NULL ? (double)kc->n_active / (double)kc->cfg.num_blocks : 0.0;
}

void kvr_kvcache_get_stats(const kvr_kvcache_t *kc, kvr_kvcache_stats_t *out)
{
    if (kc == NULL || out == NULL)
        return;
    *out = kc->st;
    out->num_blocks = kc->cfg.num_blocks;
    out->n_active = kc->n_active;
    out->n_cached = kc->n_cached;
    out->n_free_queue = kc->n_free;
}

size_t kvr_kvcache_cached_hashes(const kvr_kvcache_t *kc, uint64_t *out, size_t cap)
{
    if (kc == NULL)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i <= kc->mask; i++) {
        if (kc->tab[i].blk == NONE)
            continue;
        if (out != NULL && n < cap)
            out[n] = kc->tab[i].hash;
        n++;
    }
    return n;
}

/* ---- allocate ---- */

/* A validated allocation: how many blocks it holds after hits, and what it takes. */
typedef struct plan {
    uint64_t want;     /* blocks for n_tokens */
    uint64_t held;     /* blocks held once the hits are taken */
    uint64_t new_blks; /* from the queue head */
    uint32_t hits_queued; /* hit blocks at refcount 0 (they shorten the queue) */
} plan_t;

static uint64_t blocks_for(const kvr_kvcache_t *kc, uint64_t n_tokens)
{
    uint64_t bs = kc->cfg.block_size;
    return n_tokens / bs + (n_tokens % bs != 0);
}

/* KVR_EINVAL for the argument errors of allocate(); marks the hit blocks with a fresh epoch. */
static int plan_allocation(kvr_kvcache_t *kc, const kvr_kvcache_seq_t *seq,
                           const uint64_t *seq_hashes, size_t n_hit, uint64_t n_tokens,
                           plan_t *p)
{
    if (seq->n_blocks > 0 && n_hit > 0)
        return KVR_EINVAL;
    if (n_hit > 0 && seq_hashes == NULL)
        return KVR_EINVAL;
    if (n_hit > n_tokens / kc->cfg.block_size) /* hits are full blocks within n_tokens */
        return KVR_EINVAL;
    p->want = blocks_for(kc, n_tokens);
    p->hits_queued = 0;
    uint32_t ep = next_epoch(kc);
    for (size_t i = 0; i < n_hit; i++) {
        uint32_t b = tab_find(kc, seq_hashes[i]);
        if (b == NONE || kc->blk[b].mark == ep)
            return KVR_EINVAL; /* not cached, or a hash repeated in the hit list */
        kc->blk[b].mark = ep;
        p->hits_queued += kc->blk[b].ref == 0;
    }
    p->held = seq->n_blocks > 0 ? seq->n_blocks : n_hit;
    p->new_blks = p->want > p->held ? p->want - p->held : 0;
    return KVR_OK;
}

static int reserve_seq(kvr_kvcache_seq_t *seq, uint64_t want)
{
    if (want <= seq->cap)
        return KVR_OK;
    uint64_t n = seq->cap > 0 ? 2 * (uint64_t)seq->cap : SEQ_MIN_CAP;
    while (n < want)
        n *= 2;
    if (n > UINT32_MAX - 1)
        n = want; /* want <= num_blocks < UINT32_MAX */
    uint32_t *q = realloc(seq->blocks, (size_t)n * sizeof *q);
    if (q == NULL)
        return KVR_ENOMEM;
    seq->blocks = q;
    seq->cap = (uint32_t)n;
    return KVR_OK;
}

/* Pops the queue head for a new block; a cached block is evicted into kc->evicted[*n_ev]. */
static uint32_t pop_fresh(kvr_kvcache_t *kc, size_t *n_ev)
{
    uint32_t b = kc->head;
    blk_t *x = &kc->blk[b];
    if (x->hashed) {
        tab_del(kc, x->hash);
        x->hashed = 0;
        kc->n_cached--;
        kc->evicted[(*n_ev)++] = x->hash;
    }
    take(kc, b);
    return b;
}

int kvr_kvcache_allocate(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq, const uint64_t *seq_hashes,
                         size_t n_hit, uint64_t n_tokens)
{
    if (kc == NULL || seq == NULL)
        return KVR_EINVAL;
    plan_t p;
    int rc = plan_allocation(kc, seq, seq_hashes, n_hit, n_tokens, &p);
    if (rc != KVR_OK)
        return rc;
    if (p.new_blks > (uint64_t)(kc->n_free - p.hits_queued))
        return KVR_EBUSY;
    if (reserve_seq(seq, p.held + p.new_blks) != KVR_OK)
        return KVR_ENOMEM;
    if (seq->n_blocks == 0 && n_hit > 0) {
        for (size_t i = 0; i < n_hit; i++) {
            uint32_t b = tab_find(kc, seq_hashes[i]);
            take(kc, b);
            seq->blocks[i] = b;
        }
        seq->n_blocks = (uint32_t)n_hit;
        seq->n_full = (uint32_t)n_hit;
    }
    size_t n_ev = 0;
    for (uint64_t k = 0; k < p.new_blks; k++)
        seq->blocks[seq->n_blocks++] = pop_fresh(kc, &n_ev);
    if (n_ev > 0) {
        kc->st.removed_blocks += n_ev;
        kvr_kvcache_event_t ev = {.kind = KVR_KVC_REMOVED, .hashes = kc->evicted, .n_hashes = n_ev};
        emit(kc, &ev);
    }
    return KVR_OK;
}

uint64_t kvr_kvcache_blocks_needed(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *seq,
                                   const uint64_t *seq_hashes, size_t n_hit, uint64_t n_tokens)
{
    if (kc == NULL || seq == NULL)
        return UINT64_MAX;
    /* The marks are scratch, not state: planning leaves every observable thing unchanged. */
    plan_t p;
    if (plan_allocation((kvr_kvcache_t *)kc, seq, seq_hashes, n_hit, n_tokens, &p) != KVR_OK)
        return UINT64_MAX;
    return p.new_blks + p.hits_queued;
}

/* ---- commit ---- */

/* Rejects a hash of [seq->n_full, n_full) that repeats inside the sequence: sharing it would
 * put one block twice in the table. Hashes not yet cached are put in the table for the length
 * of the check (so a repeat within the range is found) and taken out again. */
static int check_commit(kvr_kvcache_t *kc, const kvr_kvcache_seq_t *seq,
                        const uint64_t *seq_hashes, size_t n_full)
{
    uint32_t ep = next_epoch(kc);
    int held_marked = 0, rc = KVR_OK;
    size_t i;
    for (i = seq->n_full; i < n_full; i++) {
        uint32_t b = tab_find(kc, seq_hashes[i]);
        if (b == NONE) {
            b = seq->blocks[i];
            tab_put(kc, seq_hashes[i], b);
        } else if (kc->blk[b].ref > 0 && !held_marked) {
            /* an active block: is it one of ours (committed before this call)? */
            for (uint32_t j = 0; j < seq->n_full; j++)
                kc->blk[seq->blocks[j]].mark = ep;
            held_marked = 1;
        }
        if (kc->blk[b].mark == ep) {
            rc = KVR_EINVAL;
            break;
        }
        kc->blk[b].mark = ep;
    }
    /* undo the provisional entries: ours are the unhashed blocks the table points to */
    for (size_t k = seq->n_full; k <= i && k < n_full; k++) {
        uint32_t b = tab_find(kc, seq_hashes[k]);
        if (b == seq->blocks[k] && !kc->blk[b].hashed)
            tab_del(kc, seq_hashes[k]);
    }
    return rc;
}

static void emit_stored(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *seq,
                        const uint64_t *seq_hashes, const uint32_t *tokens, size_t start,
                        size_t end)
{
    if (start == end)
        return;
    kvr_kvcache_event_t ev = {
        .kind = KVR_KVC_STORED,
        .hashes = &seq_hashes[start],
        .n_hashes = end - start,
        .has_parent = start > 0,
        .parent = start > 0 ? seq_hashes[start - 1] : 0,
        .tokens = &tokens[start * kc->cfg.block_size],
        .lora_name = seq->lora_name,
    };
    emit(kc, &ev);
}

/* Block i of seq becomes the cached block b of its hash; its own copy (only ever ours) goes
 * back to the queue head. */
static void share_block(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq, size_t i, uint32_t b)
{
    uint32_t own = seq->blocks[i];
    take(kc, b);
    seq->blocks[i] = b;
    drop(kc, own);
    kc->st.dedup_blocks++;
}

static void store_block(kvr_kvcache_t *kc, uint32_t b, uint64_t h)
{
    tab_put(kc, h, b);
    kc->blk[b].hash = h;
    kc->blk[b].hashed = 1;
    kc->n_cached++;
    kc->st.stored_blocks++;
}

int kvr_kvcache_commit(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq, const uint64_t *seq_hashes,
                       const uint32_t *tokens, size_t n_full)
{
    if (kc == NULL || seq == NULL || n_full < seq->n_full || n_full > seq->n_blocks)
        return KVR_EINVAL;
    if (n_full == seq->n_full)
        return KVR_OK;
    if (!kc->cfg.prefix_caching) {
        seq->n_full = (uint32_t)n_full;
        return KVR_OK;
    }
    if (seq_hashes == NULL || tokens == NULL)
        return KVR_EINVAL;
    int rc = check_commit(kc, seq, seq_hashes, n_full);
    if (rc != KVR_OK)
        return rc;
    size_t run = seq->n_full;
    for (size_t i = seq->n_full; i < n_full; i++) {
        uint32_t b = tab_find(kc, seq_hashes[i]);
        if (b != NONE) {
            emit_stored(kc, seq, seq_hashes, tokens, run, i);
            share_block(kc, seq, i, b);
            run = i + 1;
        } else {
            store_block(kc, seq->blocks[i], seq_hashes[i]);
        }
        seq->n_full = (uint32_t)(i + 1);
    }
    emit_stored(kc, seq, seq_hashes, tokens, run, n_full);
    return KVR_OK;
}

/* ---- release and reset ---- */

void kvr_kvcache_release(kvr_kvcache_t *kc, kvr_kvcache_seq_t *seq)
{
    if (kc == NULL || seq == NULL)
        return;
    for (uint32_t i = seq->n_blocks; i-- > 0;)
        drop(kc, seq->blocks[i]);
    seq->n_blocks = 0;
    seq->n_full = 0;
}

int kvr_kvcache_reset(kvr_kvcache_t *kc)
{
    if (kc == NULL)
        return KVR_EINVAL;
    if (kc->n_active > 0)
        return KVR_EBUSY;
    for (uint32_t b = 0; b < kc->cfg.num_blocks; b++)
        kc->blk[b].hashed = 0;
    for (size_t i = 0; i <= kc->mask; i++)
        kc->tab[i].blk = NONE;
    kc->st.cleared_blocks += kc->n_cached;
    kc->n_cached = 0;
    kc->st.resets++;
    if (kc->cfg.prefix_caching) { /* without it the cache emits nothing */
        kvr_kvcache_event_t ev = {.kind = KVR_KVC_CLEARED};
        emit(kc, &ev);
    }
    return KVR_OK;
}

/* ---- verify ---- */

#define FAIL KVR_VERIFY_FAIL

static int verify_queue(const kvr_kvcache_t *kc, char *msg, size_t msg_len)
{
    uint32_t n = 0, prev = NONE;
    for (uint32_t b = kc->head; b != NONE; prev = b, b = kc->blk[b].next) {
        if (b >= kc->cfg.num_blocks || ++n > kc->cfg.num_blocks)
            FAIL("free queue broken after block %u", prev);
        if (kc->blk[b].prev != prev)
            FAIL("free queue: block %u has prev %u, expected %u", b, kc->blk[b].prev, prev);
        if (kc->blk[b].ref != 0)
            FAIL("free queue: block %u has refcount %u", b, kc->blk[b].ref);
    }
    if (kc->tail != prev)
        FAIL("free queue tail %u, last block reached %u", kc->tail, prev);
    if (n != kc->n_free)
        FAIL("free queue holds %u blocks, counter %u", n, kc->n_free);
    uint32_t zero = 0, active = 0;
    for (uint32_t b = 0; b < kc->cfg.num_blocks; b++) {
        zero += kc->blk[b].ref == 0;
        active += kc->blk[b].ref != 0;
    }
    if (zero != n) /* every queued block has refcount 0 and none is visited twice */
        FAIL("%u blocks at refcount 0, %u in the free queue", zero, n);
    if (active != kc->n_active)
        FAIL("%u blocks active, counter %u", active, kc->n_active);
    return KVR_OK;
}

static int verify_table(const kvr_kvcache_t *kc, char *msg, size_t msg_len)
{
    uint32_t entries = 0, hashed = 0;
    for (size_t i = 0; i <= kc->mask; i++) {
        const slot_t *s = &kc->tab[i];
        if (s->blk == NONE)
            continue;
        entries++;
        if (s->blk >= kc->cfg.num_blocks)
            FAIL("table slot %zu names block %u", i, s->blk);
        const blk_t *x = &kc->blk[s->blk];
        if (!x->hashed || x->hash != s->hash)
            FAIL("table slot %zu: block %u does not hold hash %#llx", i, s->blk,
                 (unsigned long long)s->hash);
    }
    for (uint32_t b = 0; b < kc->cfg.num_blocks; b++) {
        if (!kc->blk[b].hashed)
            continue;
        hashed++;
        if (tab_find(kc, kc->blk[b].hash) != b)
            FAIL("block %u: hash %#llx not found in the table", b,
                 (unsigned long long)kc->blk[b].hash);
    }
    /* every hashed block is found (so distinct hashes), every entry names a hashed block */
    if (entries != hashed || hashed != kc->n_cached)
        FAIL("table entries %u, hashed blocks %u, counter %u", entries, hashed, kc->n_cached);
    if (2 * (size_t)entries > kc->mask + 1)
        FAIL("table over half full");
    if (!kc->cfg.prefix_caching && entries != 0)
        FAIL("%u hashes cached without prefix caching", entries);
    if (kc->st.stored_blocks != kc->st.removed_blocks + kc->st.cleared_blocks + kc->n_cached)
        FAIL("stored %llu != removed %llu + cleared %llu + cached %u",
             (unsigned long long)kc->st.stored_blocks, (unsigned long long)kc->st.removed_blocks,
             (unsigned long long)kc->st.cleared_blocks, kc->n_cached);
    return KVR_OK;
}

/* One sequence: shape, distinct blocks (marked with stamp in seen), committed <=> hashed. */
static int verify_seq(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *s, size_t si,
                      size_t *seen, uint32_t *cnt, char *msg, size_t msg_len)
{
    if (s->n_blocks > s->cap || s->n_full > s->n_blocks || (s->n_blocks > 0 && !s->blocks))
        FAIL("seq %zu: n_full %u, n_blocks %u, cap %u", si, s->n_full, s->n_blocks, s->cap);
    for (uint32_t i = 0; i < s->n_blocks; i++) {
        uint32_t b = s->blocks[i];
        if (b >= kc->cfg.num_blocks)
            FAIL("seq %zu: position %u names block %u", si, i, b);
        if (seen[b] == si + 1)
            FAIL("seq %zu holds block %u twice", si, b);
        seen[b] = si + 1;
        cnt[b]++;
        if (kc->cfg.prefix_caching && (i < s->n_full) != (kc->blk[b].hashed != 0))
            FAIL("seq %zu: block %u at position %u (n_full %u) is %shashed", si, b, i,
                 s->n_full, kc->blk[b].hashed ? "" : "not ");
    }
    return KVR_OK;
}

static int verify_seqs(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *const *seqs,
                       size_t n_seqs, size_t *seen, uint32_t *cnt, char *msg, size_t msg_len)
{
    for (size_t si = 0; si < n_seqs; si++) {
        if (seqs[si] == NULL)
            FAIL("seq %zu is NULL", si);
        int rc = verify_seq(kc, seqs[si], si, seen, cnt, msg, msg_len);
        if (rc != KVR_OK)
            return rc;
    }
    for (uint32_t b = 0; b < kc->cfg.num_blocks; b++)
        if (cnt[b] != kc->blk[b].ref)
            FAIL("block %u: refcount %u, held by %u sequences", b, kc->blk[b].ref, cnt[b]);
    return KVR_OK;
}

int kvr_kvcache_verify_msg(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *const *seqs,
                           size_t n_seqs, char *msg, size_t msg_len)
{
    if (kc == NULL)
        FAIL("cache is NULL");
    if (seqs == NULL && n_seqs > 0)
        n_seqs = 0;
    int rc = verify_queue(kc, msg, msg_len);
    if (rc == KVR_OK)
        rc = verify_table(kc, msg, msg_len);
    if (rc != KVR_OK || seqs == NULL)
        return rc;
    size_t *seen = calloc(kc->cfg.num_blocks, sizeof *seen);
    uint32_t *cnt = calloc(kc->cfg.num_blocks, sizeof *cnt);
    if (seen == NULL || cnt == NULL) {
        free(seen);
        free(cnt);
        if (msg != NULL && msg_len > 0)
            snprintf(msg, msg_len, "out of memory");
        return KVR_ENOMEM;
    }
    rc = verify_seqs(kc, seqs, n_seqs, seen, cnt, msg, msg_len);
    free(seen);
    free(cnt);
    return rc;
}

int kvr_kvcache_verify(const kvr_kvcache_t *kc, const kvr_kvcache_seq_t *const *seqs,
                       size_t n_seqs)
{
    return kvr_kvcache_verify_msg(kc, seqs, n_seqs, NULL, 0);
}

/*
 * index.c: the prefix index. For a prompt's sequence hashes it answers, per worker rank, how
 * many leading blocks the rank holds on the device tier and how far its host and disk tiers
 * extend that prefix.
 *
 * Shape. A node is one distinct prefix (a path of local block hashes from the root), keyed by
 * its router sequence hash (seq = chain(parent.seq, lbh)), so a lookup resolves every position
 * of the prompt with an independent hash probe: the probes of a 512-block prompt run in
 * parallel in the memory system instead of as 512 dependent pointer chases. A probe is
 * accepted only if the node's parent is the node found one position earlier, so the answer is
 * exact for the path, not just for the hash.
 *
 *   node table T1  seq -> node             (shared with readers)
 *   node           seq, lbh, canonical ext, parent, child list, holders[], rc
 *   holder         (worker slot u16, tier bits, REACH, OWN_EXT)   4 bytes, 4 inline per node
 *   ext table T2   node.ext -> node        (writer only; a pair whose engine hash differs from
 *   overrides T3   (slot, ext) <-> node     the node's canonical one is kept in T3)
 *   slot map       (worker, rank) -> slot  (writer only; an event finds its worker in O(1))
 *   positions      per holder array of >= 32: slot -> holder index (writer only), so a store
 *                  or removal on a block held by thousands of workers is O(1), not a scan
 *
 * Invariants (checked by kvr_index_verify):
 *   - node.seq = lbh at depth 1, chain(parent.seq, lbh) below; every live node is in T1 under
 *     its seq, in T2 under its ext, and in its parent's child list;
 *   - a non-root node has a holder or a child (empty leaves are freed at once);
 *   - per worker slot, engine hashes and held nodes are a bijection (T2/T3 lookups);
 *   - REACH(s, n) <=> s holds n on the device tier and (n is at depth 1 or REACH(s, parent));
 *     node.rc = number of REACH holders. Hence along any path the REACH sets only shrink,
 *     and a lookup compares counts instead of sets except where a worker drops out;
 *   - pairs <= max_pairs and nodes <= max_pairs after every apply.
 *
 * Memory: the index owns everything. Nodes live in fixed 64K-node chunks that never move, so
 * a reader never sees a node relocated. With KVR_SYNC_RCU, node slots, holder arrays and old
 * tables freed by the writer wait in limbo until an RCU grace period has passed.
 *
 * Threads: one writer thread calls everything except kvr_index_lookup, which any number of
 * reader threads may call concurrently (RCU: wait-free; RWLOCK: shared lock).
 *
 * Cost: lookup O(n + sum of holders at the positions where a worker drops out); store O(1)
 * amortized per block plus O(children) when a worker's device reach changes at an interior
 * node; Cleared / remove-worker O(nodes).
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: writers must not starve */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <urcu/urcu-memb.h>

/* ThreadSanitizer cannot see an RCU grace period: to it, a node freed after
 * urcu_memb_synchronize_rcu() races with the lookups that read it before. Under TSan (only)
 * each reader's unlock releases, and the writer acquires after every grace period, the
 * address of ix->tsan_grace: exactly the order RCU guarantees (every read-side section that
 * began before the grace period ended before it returned). Everything else the readers and
 * the writer share is still checked. docs/reliability.md explains the choice. */
#if defined(__SANITIZE_THREAD__)
#define KVR_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVR_UNDER_TSAN 1
#endif
#endif
#ifdef KVR_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
#define TSAN_RELEASE(p) __tsan_release(p)
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define TSAN_RELEASE(p) ((void)(p))
#define TSAN_ACQUIRE(p) ((void)(p))
#endif

#include "base/oatab.h"
#include "kvrouter/hash.h"
#include "kvrouter/index.h"
#include "base/verify.h"

#include "base/grow.h"

/* ---------------------------------------------------------------------------------------- */
/* Holders */

enum { HF_REACH = 0x1, HF_OWN_EXT = 0x2 };
#define TIER_DEVICE_BIT (1u << KVR_TIER_DEVICE)
#define TIER_LOWER_BITS (0xFu & ~TIER_DEVICE_BIT)
#define INLINE_HOLDERS 5

typedef uint32_t holder_t; /* slot | tiers << 16 | flags << 24 */

static inline uint32_t h_slot(holder_t h) { return h & 0xFFFFu; }
static inline unsigned h_tiers(holder_t h) { return (h >> 16) & 0xFFu; }
static inline unsigned h_flags(holder_t h) { return h >> 24; }
static inline holder_t h_make(uint32_t slot, unsigned tiers, unsigned flags)
{
    return slot | (tiers << 16) | (flags << 24);
}

/* An overflow holder array. From HPOS_MIN_CAP holders on, a writer-only position table
 * follows the array: uint16_t pos[pmask + 1] (power of two >= 2 x cap), entries holder index
 * + 1 (0 = empty), linear probing on the holder's slot, backward-shift deletion. It makes a
 * writer's holder_find O(1) on a block held by thousands of workers (a scan of a popular
 * block's 7,000 holders dominated `bench mooncake` at 7,000 workers); readers never use it. */
#define HPOS_MIN_CAP 32u
typedef struct hblock {
    uint32_t cap;
    uint32_t pmask; /* position table mask, 0 = none */
    _Atomic holder_t h[];
} hblock_t;

/* ---------------------------------------------------------------------------------------- */
/* Nodes */

#define NODE_CHUNK_BITS 16
#define NODE_CHUNK (1u << NODE_CHUNK_BITS)
#define MAX_CHUNKS (1u << 16)
#define ROOT 0u
#define NIL 0u /* child-list terminator (the root is never a child) */

typedef struct node {
    _Atomic uint64_t seq;
    uint64_t lbh;
    uint64_t ext;
    _Atomic uint32_t parent;
    uint32_t first_child, next_sib, prev_sib;
    _Atomic uint16_t n_holders;
    _Atomic uint16_t rc;
    _Atomic uint32_t tick;  /* last use (index ticks), set by lookups and stores */
    _Atomic uint8_t is_ovf; /* holders live in ovf (never reverts while the node lives) */
    uint8_t live;
    _Atomic uint16_t hseq; /* odd while a removal moves a holder (readers' seqcount) */
    _Atomic holder_t inl[INLINE_HOLDERS];
    _Atomic(hblock_t *) ovf;
} node_t;

/* ---------------------------------------------------------------------------------------- */
/* Node tables (T1: by seq, shared; T2: by ext, writer only). Linear probing with tombstones,
 * so a concurrent reader never misses an entry that stays. A slot is (tag << 32 | node): the
 * tag (high half of the key's hash) rejects most mismatches without touching the node. */

#define SLOT_EMPTY UINT64_C(0)
#define NODE_TOMB UINT32_MAX

typedef struct ntab {
    uint32_t mask;
    uint32_t live, tomb;
    uint32_t pad;
    _Atomic uint64_t slots[];
} ntab_t;

static inline uint32_t s_node(uint64_t s) { return (uint32_t)s; }
static inline uint32_t s_tag(uint64_t s) { return (uint32_t)(s >> 32); }

/* ---------------------------------------------------------------------------------------- */
/* Override tables (T3): (slot, key) -> value, writer only, backward-shift deletion. */

typedef struct oent {
    uint64_t key;
    uint64_t val;
    uint32_t slot; /* worker slot + 1; 0 = empty */
    uint32_t pad;
} oent_t;

typedef struct otab {
    oent_t *e;
    size_t mask, live;
} otab_t;

/* ---------------------------------------------------------------------------------------- */
/* Worker slots */

/* A worker slot's state; its identity (worker id, rank) is ix->wids[slot], one copy for the
 * writer and for readers emitting matches. */
typedef struct wslot {
    uint8_t live;
    uint8_t limbo;
    _Atomic uint32_t n_lower; /* pairs with a lower-tier bit; read by lookups */
    uint64_t n_pairs;
    uint64_t n_orphan; /* device pairs without REACH */
} wslot_t;

/* growable vectors (writer only) */
typedef struct u32vec {
    uint32_t *v;
    size_t n, cap;
} u32vec_t;
typedef struct ptrvec {
    void **v;
    size_t n, cap;
} ptrvec_t;

struct kvr_index {
    char tsan_grace; /* an address for the TSan annotation of grace periods (see top) */
    kvr_index_config_t cfg;
    uint32_t max_workers;
    size_t max_pairs;

    node_t *chunks[MAX_CHUNKS];
    uint32_t n_chunks;
    uint32_t n_alloc; /* node indices [0, n_alloc) have been handed out */
    u32vec_t free_nodes;

    _Atomic(ntab_t *) t1; /* seq -> node */
    ntab_t *t2;           /* ext -> node */
    otab_t by_ext;        /* (slot, ext) -> node, pairs with OWN_EXT */
    otab_t by_node;       /* (slot, node) -> ext, pairs with OWN_EXT */

    wslot_t *slots;
    _Atomic uint32_t slots_hw; /* slots [0, hw) have been used */
    kvr_worker_t *wids;        /* slot -> its worker (compact: readers copy it per match) */
    uint32_t *smap;            /* (worker_id, dp_rank) -> live slot + 1 (writer only) */
    size_t smap_mask;
    u32vec_t free_slots;
    u32vec_t limbo_slots;

    /* RCU limbo: freed by the writer, reclaimed after a grace period */
    u32vec_t limbo_nodes;
    ptrvec_t limbo_ptrs;
    size_t limbo_bytes; /* of limbo_ptrs */

    pthread_rwlock_t lock; /* KVR_SYNC_RWLOCK */

    /* eviction: leaves in the order they became leaves, each with the tick it was queued at;
     * entries of nodes that stopped being leaves, or were used since, are skipped or requeued */
    struct lq_ent {
        uint32_t node, tick;
    } *lq;
    size_t lq_head, lq_len, lq_cap;
    _Atomic uint32_t tick; /* advanced after every apply */
    _Atomic uint64_t lower_pairs; /* pairs with any lower-tier bit */
    kvr_index_stats_t st;
    size_t bytes_ovf; /* holder arrays */
    size_t bytes_ovr; /* override tables */

    /* writer scratch */
    u32vec_t stack;
    u32vec_t tmp_nodes;
    struct seen {
        uint64_t key;
        uint64_t gen; /* 64-bit: never wraps */
    } *seen;          /* engine hashes of the event being validated */
    size_t seen_cap;
    uint64_t seen_gen;
    uint64_t *seq_buf; /* sequence hashes of the blocks of the event being applied */
    size_t seq_cap;
};

/* ---------------------------------------------------------------------------------------- */
/* Small helpers */

static int vec_push(u32vec_t *v, uint32_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        uint32_t *nv = realloc(v->v, cap * sizeof *nv);
        if (nv == NULL)
            return KVR_ENOMEM;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return KVR_OK;
}

static int pvec_push(ptrvec_t *v, void *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        void **nv = realloc(v->v, cap * sizeof *nv);
        if (nv == NULL)
            return KVR_ENOMEM;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return KVR_OK;
}

/* Zeroed memory. Large blocks come from calloc (fresh mmap'd pages: zero-filled lazily, so a
 * small index does not pay for a whole node chunk), and their 2 MiB-aligned interior is marked
 * for transparent huge pages: the tables and node chunks are read at random and would otherwise
 * miss the TLB on nearly every access. Released with free(). */
#define HUGE_PAGE ((uintptr_t)2 << 20)
static void *big_calloc(size_t bytes)
{
    void *p = calloc(1, bytes);
#ifdef MADV_HUGEPAGE
    if (p != NULL && bytes >= 2 * HUGE_PAGE) {
        uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        uintptr_t hi = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
        if (hi > lo)
            (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: failure costs speed */
    }
#endif
    return p;
}

static inline node_t *N(const kvr_index_t *ix, uint32_t i)
{
    return &ix->chunks[i >> NODE_CHUNK_BITS][i & (NODE_CHUNK - 1)];
}

/* Waits for a grace period: every lookup that might still see what was unlinked is over. */
static void rcu_wait(kvr_index_t *ix)
{
    urcu_memb_synchronize_rcu();
    TSAN_ACQUIRE(&ix->tsan_grace);
}

/* Frees p (of bytes bytes) now (no concurrent readers possible) or after the next grace
 * period. */
static void retire_ptr(kvr_index_t *ix, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (ix->cfg.sync != KVR_SYNC_RCU || pvec_push(&ix->limbo_ptrs, p) != KVR_OK) {
        if (ix->cfg.sync == KVR_SYNC_RCU)
            rcu_wait(ix); /* out of memory for the limbo list: wait now */
        free(p);
        return;
    }
    ix->limbo_bytes += bytes;
}

/* ---------------------------------------------------------------------------------------- */
/* Node tables */

static ntab_t *ntab_new(uint32_t cap)
{
    ntab_t *t = big_calloc(sizeof *t + (size_t)cap * sizeof(uint64_t));
    if (t != NULL)
        t->mask = cap - 1;
    return t;
}

static inline size_t ntab_bytes(const ntab_t *t)
{
    return sizeof *t + ((size_t)t->mask + 1) * sizeof(uint64_t);
}

/* A key's home slot: from the high half of its hash, the half a slot stores as its tag, so a
 * rebuild re-homes every entry from the table alone, without reading a node (at 60M pairs the
 * node reads of rebuilds were 14% of the writer's time in `bench mooncake`). */
static inline size_t ntab_home(const ntab_t *t, uint64_t h) { return (size_t)(h >> 32) & t->mask; }

static inline uint64_t t1_key(const kvr_index_t *ix, uint32_t n)
{
    return atomic_load_explicit(&N(ix, n)->seq, memory_order_relaxed);
}

static void ntab_put_hashed(ntab_t *t, uint64_t h, uint32_t n);

static void ntab_put(ntab_t *t, uint64_t key, uint32_t n) { ntab_put_hashed(t, kvr_mix64(key), n); }

/* The same with the key's hash h (only its high half is used). */
static void ntab_put_hashed(ntab_t *t, uint64_t h, uint32_t n)
{
    for (size_t i = ntab_home(t, h);; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (s == SLOT_EMPTY || s_node(s) == NODE_TOMB) {
            if (s != SLOT_EMPTY)
                t->tomb--;
            atomic_store_explicit(&t->slots[i], (h & ~UINT64_C(0xFFFFFFFF)) | n,
                                  memory_order_release);
            t->live++;
            return;
        }
    }
}

/* Deletes n. When the next slot is empty no probe sequence runs through this one, so it
 * becomes empty rather than a tombstone, and so do the tombstones right before it: safe for
 * concurrent readers too, since no live entry is reached through those slots. */
static void ntab_del(ntab_t *t, uint64_t key, uint32_t n)
{
    for (size_t i = ntab_home(t, kvr_mix64(key));; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (s_node(s) == n) {
            t->live--;
            uint64_t next = atomic_load_explicit(&t->slots[(i + 1) & t->mask],
                                                 memory_order_relaxed);
            if (next != SLOT_EMPTY) {
                atomic_store_explicit(&t->slots[i], NODE_TOMB, memory_order_release);
                t->tomb++;
                return;
            }
            atomic_store_explicit(&t->slots[i], SLOT_EMPTY, memory_order_release);
            for (size_t j = (i - 1) & t->mask;; j = (j - 1) & t->mask) {
                uint64_t p = atomic_load_explicit(&t->slots[j], memory_order_relaxed);
                if (p == SLOT_EMPTY || s_node(p) != NODE_TOMB)
                    break;
                atomic_store_explicit(&t->slots[j], SLOT_EMPTY, memory_order_release);
                t->tomb--;
            }
            return;
        }
        if (s == SLOT_EMPTY)
            return; /* not present: verify() reports the inconsistency */
    }
}

/* A table sized for `want` live entries at load <= 1/2, filled from old (homes from tags). */
static ntab_t *ntab_rebuilt(const ntab_t *old, size_t want)
{
    size_t cap = 1024;
    while (cap < want * 2)
        cap *= 2;
    if (cap > (size_t)1 << 32)
        return NULL;
    ntab_t *t = ntab_new((uint32_t)cap);
    if (t == NULL)
        return NULL;
    for (size_t i = 0; i <= old->mask; i++) {
        uint64_t s = atomic_load_explicit(&old->slots[i], memory_order_relaxed);
        if (s != SLOT_EMPTY && s_node(s) != NODE_TOMB)
            ntab_put_hashed(t, s, s_node(s)); /* the slot's high half is the hash's */
    }
    return t;
}

/* Makes room for `extra` more entries (grows at load 3/4 counting tombstones, cleans when
 * tombstones dominate, shrinks when nearly empty). */
static int ntab_reserve(kvr_index_t *ix, ntab_t **slot_or_null, _Atomic(ntab_t *) *shared,
                        size_t extra)
{
    ntab_t *t = shared ? atomic_load_explicit(shared, memory_order_relaxed) : *slot_or_null;
    size_t cap = (size_t)t->mask + 1;
    size_t fill = (size_t)t->live + t->tomb + extra;
    bool too_full = fill * 8 > cap * 5 || (size_t)t->tomb * 4 > cap;
    bool too_empty = cap > 1024 && ((size_t)t->live + extra) * 16 < cap;
    if (!too_full && !too_empty)
        return KVR_OK;
    /* Growth sizes the table for twice its entries. A rebuild forced by tombstones (steady
     * churn at a constant size) sizes it for three times, so the next one is further away:
     * otherwise a table just under half full is rebuilt every few hundred thousand deletes. */
    bool churn = ((size_t)t->live + extra) * 8 <= cap * 5 && !too_empty;
    size_t want = (size_t)t->live + extra;
    ntab_t *nt = ntab_rebuilt(t, churn ? want + want / 2 : want);
    if (nt == NULL)
        return KVR_ENOMEM;
    ix->st.bytes += ntab_bytes(nt);
    ix->st.bytes -= ntab_bytes(t);
    if (shared) {
        atomic_store_explicit(shared, nt, memory_order_release);
        retire_ptr(ix, t, ntab_bytes(t));
    } else {
        *slot_or_null = nt;
        free(t);
    }
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Override tables */

static inline size_t otab_hash(uint32_t slot, uint64_t key)
{
    return kvr_mix64(key ^ ((uint64_t)slot * UINT64_C(0x9E3779B97F4A7C15)));
}

static oent_t *otab_find(const otab_t *t, uint32_t slot, uint64_t key)
{
    if (t->e == NULL)
        return NULL;
    for (size_t i = otab_hash(slot, key) & t->mask;; i = (i + 1) & t->mask) {
        oent_t *e = &t->e[i];
        if (e->slot == 0)
            return NULL;
        if (e->slot == slot + 1 && e->key == key)
            return e;
    }
}

static int otab_grow(size_t *bytes, otab_t *t)
{
    size_t cap = t->e ? (t->mask + 1) * 2 : 64;
    oent_t *ne = calloc(cap, sizeof *ne);
    if (ne == NULL)
        return KVR_ENOMEM;
    if (t->e != NULL) {
        for (size_t i = 0; i <= t->mask; i++) {
            oent_t *e = &t->e[i];
            if (e->slot == 0)
                continue;
            size_t j = otab_hash(e->slot - 1, e->key) & (cap - 1);
            while (ne[j].slot != 0)
                j = (j + 1) & (cap - 1);
            ne[j] = *e;
        }
        *bytes -= (t->mask + 1) * sizeof *ne;
        free(t->e);
    }
    *bytes += cap * sizeof *ne;
    t->e = ne;
    t->mask = cap - 1;
    return KVR_OK;
}

static int otab_put(size_t *bytes, otab_t *t, uint32_t slot, uint64_t key, uint64_t val)
{
    if (t->e == NULL || (t->live + 1) * 4 > (t->mask + 1) * 3) {
        int rc = otab_grow(bytes, t);
        if (rc != KVR_OK)
            return rc;
    }
    size_t i = otab_hash(slot, key) & t->mask;
    while (t->e[i].slot != 0 && !(t->e[i].slot == slot + 1 && t->e[i].key == key))
        i = (i + 1) & t->mask;
    if (t->e[i].slot == 0)
        t->live++;
    t->e[i] = (oent_t){.key = key, .val = val, .slot = slot + 1};
    return KVR_OK;
}

static void otab_del(otab_t *t, uint32_t slot, uint64_t key)
{
    oent_t *e = otab_find(t, slot, key);
    if (e == NULL)
        return;
    size_t i = (size_t)(e - t->e);
    t->e[i].slot = 0;
    t->live--;
    /* backward shift: pull later entries of the cluster into the hole when allowed */
    for (size_t j = (i + 1) & t->mask; t->e[j].slot != 0; j = (j + 1) & t->mask) {
        size_t home = otab_hash(t->e[j].slot - 1, t->e[j].key) & t->mask;
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            t->e[i] = t->e[j];
            t->e[j].slot = 0;
            i = j;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Holder arrays */

typedef struct hview {
    _Atomic holder_t *h;
    uint32_t n;
} hview_t;

/* Reader view: bounded by the array actually read, so a torn read is never out of bounds. */
static inline hview_t holders_read(const node_t *nd)
{
    hview_t v;
    uint32_t n = atomic_load_explicit(&nd->n_holders, memory_order_acquire);
    if (atomic_load_explicit(&nd->is_ovf, memory_order_acquire)) {
        hblock_t *b = atomic_load_explicit(&nd->ovf, memory_order_acquire);
        v.h = b->h;
        v.n = n < b->cap ? n : b->cap;
    } else {
        v.h = (_Atomic holder_t *)nd->inl;
        v.n = n < INLINE_HOLDERS ? n : INLINE_HOLDERS;
    }
    return v;
}

static inline _Atomic holder_t *holders_w(node_t *nd)
{
    if (atomic_load_explicit(&nd->is_ovf, memory_order_relaxed))
        return atomic_load_explicit(&nd->ovf, memory_order_relaxed)->h;
    return nd->inl;
}

static inline uint32_t holders_cap(const node_t *nd)
{
    if (atomic_load_explicit(&nd->is_ovf, memory_order_relaxed))
        return atomic_load_explicit(&nd->ovf, memory_order_relaxed)->cap;
    return INLINE_HOLDERS;
}

static inline uint32_t n_holders(const node_t *nd)
{
    return atomic_load_explicit(&nd->n_holders, memory_order_relaxed);
}

static inline holder_t hget(_Atomic holder_t *h, uint32_t i)
{
    return atomic_load_explicit(&h[i], memory_order_relaxed);
}

/* Release: a reader that loads the entry (acquire) also sees the slot it names initialised,
 * even when it reached the entry through an older n_holders (a removal moves the last entry,
 * possibly a new worker's, into a hole). Plain moves on x86. */
static inline void hset(_Atomic holder_t *h, uint32_t i, holder_t v)
{
    atomic_store_explicit(&h[i], v, memory_order_release);
}

static inline uint16_t *hpos(hblock_t *b) { return (uint16_t *)(void *)(b->h + b->cap); }
static inline size_t hpos_home(uint32_t slot, uint32_t pmask)
{
    return (size_t)((slot * UINT32_C(0x9E3779B1)) >> 7) & pmask;
}

static size_t hblock_bytes(const hblock_t *b)
{
    return sizeof *b + (size_t)b->cap * sizeof(holder_t) +
           (b->pmask ? ((size_t)b->pmask + 1) * sizeof(uint16_t) : 0);
}

/* The position-table entry naming holder index i (slot its slot). */
static size_t hpos_entry(hblock_t *b, uint32_t slot, uint32_t i)
{
    uint16_t *p = hpos(b);
    size_t k = hpos_home(slot, b->pmask);
    while (p[k] != i + 1)
        k = (k + 1) & b->pmask;
    return k;
}

static void hpos_insert(hblock_t *b, uint32_t slot, uint32_t i)
{
    uint16_t *p = hpos(b);
    size_t k = hpos_home(slot, b->pmask);
    while (p[k] != 0)
        k = (k + 1) & b->pmask;
    p[k] = (uint16_t)(i + 1);
}

static void hpos_erase(hblock_t *b, size_t k)
{
    uint16_t *p = hpos(b);
    p[k] = 0;
    for (size_t j = (k + 1) & b->pmask; p[j] != 0; j = (j + 1) & b->pmask) {
        size_t home = hpos_home(h_slot(atomic_load_explicit(&b->h[p[j] - 1], memory_order_relaxed)),
                                b->pmask);
        if (kvr_oatab_movable(k, j, home)) {
            p[k] = p[j];
            p[j] = 0;
            k = j;
        }
    }
}

static inline hblock_t *hblock_w(node_t *nd)
{
    if (!atomic_load_explicit(&nd->is_ovf, memory_order_relaxed))
        return NULL;
    return atomic_load_explicit(&nd->ovf, memory_order_relaxed);
}

/* Index of slot's holder in nd, or -1. */
static long holder_find(node_t *nd, uint32_t slot)
{
    hblock_t *b = hblock_w(nd);
    if (b != NULL && b->pmask != 0) {
        const uint16_t *p = hpos(b);
        for (size_t k = hpos_home(slot, b->pmask); p[k] != 0; k = (k + 1) & b->pmask)
            if (h_slot(hget(b->h, p[k] - 1u)) == slot)
                return (long)p[k] - 1;
        return -1;
    }
    _Atomic holder_t *h = holders_w(nd);
    uint32_t n = n_holders(nd);
    for (uint32_t i = 0; i < n; i++)
        if (h_slot(hget(h, i)) == slot)
            return (long)i;
    return -1;
}

/* A new overflow block of cap holders holding nd's n current ones (and their positions). */
static hblock_t *hblock_grow(node_t *nd, uint32_t n, uint32_t cap)
{
    uint32_t pcap = 0;
    if (cap >= HPOS_MIN_CAP)
        for (pcap = 2 * HPOS_MIN_CAP; pcap < 2 * cap; pcap *= 2) {
        }
    hblock_t *b =
        malloc(sizeof *b + (size_t)cap * sizeof(holder_t) + (size_t)pcap * sizeof(uint16_t));
    if (b == NULL)
        return NULL;
    b->cap = cap;
    b->pmask = pcap ? pcap - 1 : 0;
    _Atomic holder_t *old = holders_w(nd);
    for (uint32_t i = 0; i < n; i++)
        atomic_init(&b->h[i], hget(old, i));
    if (pcap) {
        memset(hpos(b), 0, (size_t)pcap * sizeof(uint16_t));
        for (uint32_t i = 0; i < n; i++)
            hpos_insert(b, h_slot(hget(b->h, i)), i);
    }
    return b;
}

static int holder_add(kvr_index_t *ix, node_t *nd, holder_t hv)
{
    uint32_t n = n_holders(nd);
    if (n == UINT16_MAX)
        return KVR_EFULL;
    if (n == holders_cap(nd)) {
        uint32_t cap = n * 2 > UINT16_MAX ? UINT16_MAX : n * 2;
        hblock_t *b = hblock_grow(nd, n, cap);
        if (b == NULL)
            return KVR_ENOMEM;
        hblock_t *ob = hblock_w(nd);
        atomic_store_explicit(&nd->ovf, b, memory_order_release);
        atomic_store_explicit(&nd->is_ovf, 1, memory_order_release);
        ix->bytes_ovf += hblock_bytes(b);
        if (ob != NULL) {
            ix->bytes_ovf -= hblock_bytes(ob);
            retire_ptr(ix, ob, hblock_bytes(ob));
        }
    }
    hset(holders_w(nd), n, hv);
    hblock_t *b = hblock_w(nd);
    if (b != NULL && b->pmask != 0)
        hpos_insert(b, h_slot(hv), n);
    atomic_store_explicit(&nd->n_holders, (uint16_t)(n + 1), memory_order_release);
    return KVR_OK;
}

/* A removal moves the last holder into the hole, so a reader scanning meanwhile may see that
 * holder twice: the node's seqcount (odd during the move) tells it to rescan with a check.
 * No fence is needed (nor allowed under TSan): a reader can see a holder twice only by reading
 * the moved one, which hset stores with release after the odd count, and it reads holders with
 * acquire, so its second look at the count sees the odd value or a later one. */
static void holder_remove_at(node_t *nd, uint32_t i)
{
    _Atomic holder_t *h = holders_w(nd);
    uint32_t n = n_holders(nd);
    uint16_t sq = atomic_load_explicit(&nd->hseq, memory_order_relaxed);
    atomic_store_explicit(&nd->hseq, (uint16_t)(sq + 1), memory_order_relaxed);
    hblock_t *b = hblock_w(nd);
    if (b != NULL && b->pmask != 0) {
        hpos_erase(b, hpos_entry(b, h_slot(hget(h, i)), i));
        if (i != n - 1)
            hpos(b)[hpos_entry(b, h_slot(hget(h, n - 1)), n - 1)] = (uint16_t)(i + 1);
    }
    if (i != n - 1)
        hset(h, i, hget(h, n - 1));
    atomic_store_explicit(&nd->n_holders, (uint16_t)(n - 1), memory_order_release);
    atomic_store_explicit(&nd->hseq, (uint16_t)(sq + 2), memory_order_release);
}

static inline void rc_add(node_t *nd, int d)
{
    uint16_t v = atomic_load_explicit(&nd->rc, memory_order_relaxed);
    atomic_store_explicit(&nd->rc, (uint16_t)(v + d), memory_order_release);
}

/* ---------------------------------------------------------------------------------------- */
/* Worker slots */

/* The slot map: (worker_id, dp_rank) -> slot of every live worker, an oatab.h instance of
 * slot + 1 entries (0 = empty) at most half full (2 x max_workers entries), so an event finds
 * its worker in O(1) whatever the fleet size (a scan of 7,000 slots cost 15% of the writer's
 * time in `bench mooncake`). */
static inline uint64_t worker_home(uint64_t worker_id, uint32_t dp_rank)
{
    return kvr_mix64(worker_id ^ kvr_mix64((uint64_t)dp_rank + 1));
}
#define SMAP_HOME(ix, e) worker_home((ix)->wids[*(e)-1].worker_id, (ix)->wids[*(e)-1].dp_rank)
#define SMAP_EMPTY(e) (*(e) == 0)
#define SMAP_CLEAR(e) (*(e) = 0)
KVR_OATAB_DEFINE(smap, kvr_index_t, uint32_t, SMAP_HOME, SMAP_EMPTY, SMAP_CLEAR)

static bool smap_match(const kvr_index_t *ix, const uint32_t *e, const void *key)
{
    const kvr_worker_t *w = key, *sw = &ix->wids[*e - 1];
    return sw->worker_id == w->worker_id && sw->dp_rank == w->dp_rank;
}

static long slot_find(const kvr_index_t *ix, kvr_worker_t w)
{
    const uint32_t *e = smap_find(ix, ix->smap, ix->smap_mask,
                                  (size_t)worker_home(w.worker_id, w.dp_rank), smap_match, &w);
    return e == NULL ? -1 : (long)*e - 1;
}

/* Slot s (live, its worker set) enters the map. */
static void smap_insert(kvr_index_t *ix, uint32_t s)
{
    const kvr_worker_t *w = &ix->wids[s];
    ix->smap[smap_free_slot(ix->smap, ix->smap_mask,
                            (size_t)worker_home(w->worker_id, w->dp_rank))] = s + 1;
}

/* Slot s (still naming its worker) leaves the map. */
static void smap_erase(kvr_index_t *ix, uint32_t s)
{
    kvr_worker_t w = ix->wids[s];
    uint32_t *e = smap_find(ix, ix->smap, ix->smap_mask,
                            (size_t)worker_home(w.worker_id, w.dp_rank), smap_match, &w);
    if (e != NULL)
        smap_remove_at(ix, ix->smap, ix->smap_mask, (size_t)(e - ix->smap));
}

static void kvr_index_reclaim_(kvr_index_t *ix);

static long slot_get(kvr_index_t *ix, kvr_worker_t w)
{
    long s = slot_find(ix, w);
    if (s >= 0)
        return s;
    /* a worker coming back before its old slot left limbo gets that slot again, so a reader
     * that saw its old pairs and sees its new ones still counts it once */
    for (size_t i = 0; i < ix->limbo_slots.n; i++) {
        wslot_t *old = &ix->slots[ix->limbo_slots.v[i]];
        const kvr_worker_t *ow = &ix->wids[ix->limbo_slots.v[i]];
        if (ow->worker_id == w.worker_id && ow->dp_rank == w.dp_rank) {
            uint32_t os = ix->limbo_slots.v[i];
            ix->limbo_slots.v[i] = ix->limbo_slots.v[--ix->limbo_slots.n];
            old->limbo = 0;
            old->live = 1;
            old->n_pairs = old->n_orphan = 0;
            atomic_store_explicit(&old->n_lower, 0, memory_order_relaxed);
            smap_insert(ix, os);
            ix->st.workers++;
            return (long)os;
        }
    }
    uint32_t ns;
    if (ix->free_slots.n > 0) {
        ns = ix->free_slots.v[--ix->free_slots.n];
    } else {
        uint32_t hw = atomic_load_explicit(&ix->slots_hw, memory_order_relaxed);
        if (hw >= ix->max_workers && ix->limbo_slots.n > 0) {
            kvr_index_reclaim_(ix); /* slots of removed workers become reusable */
            return slot_get(ix, w);
        }
        if (hw >= ix->max_workers)
            return KVR_EFULL;
        ns = hw;
    }
    wslot_t *ws = &ix->slots[ns];
    ix->wids[ns] = w;
    ws->n_pairs = 0;
    ws->n_orphan = 0;
    atomic_store_explicit(&ws->n_lower, 0, memory_order_relaxed);
    ws->limbo = 0;
    ws->live = 1;
    smap_insert(ix, ns);
    if (ns >= atomic_load_explicit(&ix->slots_hw, memory_order_relaxed))
        atomic_store_explicit(&ix->slots_hw, ns + 1, memory_order_release);
    ix->st.workers++;
    return (long)ns;
}

/* ---------------------------------------------------------------------------------------- */
/* Node allocation, linking, freeing */

static int node_reserve(kvr_index_t *ix, size_t extra)
{
    size_t avail = ix->free_nodes.n + ((size_t)ix->n_chunks * NODE_CHUNK - ix->n_alloc);
    while (avail < extra) {
        if (ix->n_chunks == MAX_CHUNKS)
            return KVR_EFULL;
        node_t *c = big_calloc((size_t)NODE_CHUNK * sizeof *c);
        if (c == NULL)
            return KVR_ENOMEM;
        ix->chunks[ix->n_chunks++] = c;
        ix->st.bytes += (size_t)NODE_CHUNK * sizeof *c;
        avail += NODE_CHUNK;
    }
    return KVR_OK;
}

static uint32_t node_alloc(kvr_index_t *ix)
{
    if (ix->free_nodes.n > 0)
        return ix->free_nodes.v[--ix->free_nodes.n];
    return ix->n_alloc++;
}

static int lq_push(kvr_index_t *ix, uint32_t n);

static void link_child(kvr_index_t *ix, uint32_t parent, uint32_t child)
{
    node_t *p = N(ix, parent), *c = N(ix, child);
    c->prev_sib = NIL;
    c->next_sib = p->first_child;
    if (p->first_child != NIL)
        N(ix, p->first_child)->prev_sib = child;
    p->first_child = child;
}

static void unlink_child(kvr_index_t *ix, uint32_t child)
{
    node_t *c = N(ix, child);
    node_t *p = N(ix, atomic_load_explicit(&c->parent, memory_order_relaxed));
    if (c->prev_sib != NIL)
        N(ix, c->prev_sib)->next_sib = c->next_sib;
    else
        p->first_child = c->next_sib;
    if (c->next_sib != NIL)
        N(ix, c->next_sib)->prev_sib = c->prev_sib;
    c->next_sib = c->prev_sib = NIL;
    if (p->first_child == NIL && p != N(ix, ROOT))
        (void)lq_push(ix, atomic_load_explicit(&c->parent, memory_order_relaxed));
}

/* Creates the node for (parent, lbh) with canonical engine hash ext. Room was reserved. */
static uint32_t node_create(kvr_index_t *ix, uint32_t parent, uint64_t seq, uint64_t lbh,
                            uint64_t ext)
{
    uint32_t n = node_alloc(ix);
    node_t *nd = N(ix, n);
    atomic_store_explicit(&nd->seq, seq, memory_order_relaxed);
    nd->lbh = lbh;
    nd->ext = ext;
    atomic_store_explicit(&nd->parent, parent, memory_order_relaxed);
    nd->first_child = NIL;
    atomic_store_explicit(&nd->n_holders, 0, memory_order_relaxed);
    atomic_store_explicit(&nd->rc, 0, memory_order_relaxed);
    atomic_store_explicit(&nd->tick, atomic_load_explicit(&ix->tick, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&nd->is_ovf, 0, memory_order_relaxed);
    atomic_store_explicit(&nd->ovf, NULL, memory_order_relaxed);
    nd->live = 1;
    link_child(ix, parent, n);
    ntab_put(atomic_load_explicit(&ix->t1, memory_order_relaxed), seq, n); /* publishes */
    ntab_put(ix->t2, ext, n);
    ix->st.nodes++;
    return n;
}

/* Deletes n from the writer-only ext table without a tombstone: later entries of the cluster
 * that may live earlier move back into the hole (no reader can be probing this table). */
static void t2_del(kvr_index_t *ix, uint64_t key, uint32_t n)
{
    ntab_t *t = ix->t2;
    size_t i = ntab_home(t, kvr_mix64(key));
    for (;; i = (i + 1) & t->mask) {
        uint64_t sl = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (sl == SLOT_EMPTY)
            return; /* not present: verify() reports the inconsistency */
        if (s_node(sl) == n)
            break;
    }
    t->live--;
    for (size_t j = (i + 1) & t->mask;; j = (j + 1) & t->mask) {
        uint64_t sl = atomic_load_explicit(&t->slots[j], memory_order_relaxed);
        if (sl == SLOT_EMPTY)
            break;
        if (s_node(sl) == NODE_TOMB)
            continue; /* a tombstone left by a rebuild-free era: skip over it */
        size_t home = ntab_home(t, sl);
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            atomic_store_explicit(&t->slots[i], sl, memory_order_relaxed);
            i = j;
        }
    }
    atomic_store_explicit(&t->slots[i], SLOT_EMPTY, memory_order_relaxed);
}

static void node_free(kvr_index_t *ix, uint32_t n)
{
    node_t *nd = N(ix, n);
    ntab_del(atomic_load_explicit(&ix->t1, memory_order_relaxed), t1_key(ix, n), n);
    t2_del(ix, nd->ext, n);
    unlink_child(ix, n);
    if (atomic_load_explicit(&nd->is_ovf, memory_order_relaxed)) {
        hblock_t *b = atomic_load_explicit(&nd->ovf, memory_order_relaxed);
        ix->bytes_ovf -= hblock_bytes(b);
        retire_ptr(ix, b, hblock_bytes(b));
    }
    nd->live = 0;
    ix->st.nodes--;
    if (ix->cfg.sync == KVR_SYNC_RCU) {
        if (vec_push(&ix->limbo_nodes, n) == KVR_OK)
            return;
        rcu_wait(ix);
    }
    atomic_store_explicit(&nd->is_ovf, 0, memory_order_relaxed);
    if (vec_push(&ix->free_nodes, n) != KVR_OK) {
        /* cannot happen: free_nodes never holds more than the allocated nodes, but if the
         * push fails the slot is merely leaked until the index is freed */
    }
}

/* Frees n and its ancestors while they hold nothing and have no children. */
static void node_try_free(kvr_index_t *ix, uint32_t n)
{
    while (n != ROOT) {
        node_t *nd = N(ix, n);
        if (n_holders(nd) != 0 || nd->first_child != NIL)
            return;
        uint32_t p = atomic_load_explicit(&nd->parent, memory_order_relaxed);
        node_free(ix, n);
        n = p;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Pairs: (slot, node) with tier bits and an engine hash */

static uint64_t pair_ext(const kvr_index_t *ix, uint32_t slot, uint32_t n, holder_t h)
{
    if (h_flags(h) & HF_OWN_EXT) {
        oent_t *e = otab_find(&ix->by_node, slot, n);
        return e ? e->val : 0;
    }
    return N(ix, n)->ext;
}

/* The node slot holds under engine hash ext, or NIL. */
static uint32_t pair_by_ext(const kvr_index_t *ix, uint32_t slot, uint64_t ext)
{
    const ntab_t *t = ix->t2;
    uint64_t h = kvr_mix64(ext);
    for (size_t i = ntab_home(t, h);; i = (i + 1) & t->mask) {
        uint64_t sl = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (sl == SLOT_EMPTY)
            break;
        uint32_t s = s_node(sl);
        if (s == NODE_TOMB || s_tag(sl) != (uint32_t)(h >> 32) || N(ix, s)->ext != ext)
            continue;
        long hi = holder_find(N(ix, s), slot);
        if (hi >= 0 && !(h_flags(hget(holders_w(N(ix, s)), (uint32_t)hi)) & HF_OWN_EXT))
            return s;
    }
    oent_t *e = otab_find(&ix->by_ext, slot, ext);
    return e ? (uint32_t)e->val : NIL;
}

static bool parent_reach(kvr_index_t *ix, uint32_t n, uint32_t slot)
{
    uint32_t p = atomic_load_explicit(&N(ix, n)->parent, memory_order_relaxed);
    if (p == ROOT)
        return true;
    long hi = holder_find(N(ix, p), slot);
    return hi >= 0 && (h_flags(hget(holders_w(N(ix, p)), (uint32_t)hi)) & HF_REACH);
}

/* Sets or clears REACH for slot on n's descendants after n's REACH changed to `on`. */
static void reach_cascade(kvr_index_t *ix, uint32_t n, uint32_t slot, bool on)
{
    wslot_t *ws = &ix->slots[slot];
    if (on && ws->n_orphan == 0)
        return;
    ix->stack.n = 0;
    if (vec_push(&ix->stack, n) != KVR_OK)
        return;
    while (ix->stack.n > 0) {
        uint32_t cur = ix->stack.v[--ix->stack.n];
        for (uint32_t c = N(ix, cur)->first_child; c != NIL; c = N(ix, c)->next_sib) {
            node_t *cn = N(ix, c);
            long hi = holder_find(cn, slot);
            if (hi < 0)
                continue;
            _Atomic holder_t *h = holders_w(cn);
            holder_t hv = hget(h, (uint32_t)hi);
            if (!(h_tiers(hv) & TIER_DEVICE_BIT) || (bool)(h_flags(hv) & HF_REACH) == on)
                continue;
            hset(h, (uint32_t)hi, h_make(slot, h_tiers(hv), h_flags(hv) ^ HF_REACH));
            rc_add(cn, on ? 1 : -1);
            if (on)
                ws->n_orphan--;
            else
                ws->n_orphan++;
            if (vec_push(&ix->stack, c) != KVR_OK)
                return;
        }
    }
}

static void lower_add(kvr_index_t *ix, uint32_t slot, int d)
{
    _Atomic uint32_t *nl = &ix->slots[slot].n_lower;
    atomic_store_explicit(nl, atomic_load_explicit(nl, memory_order_relaxed) + (uint32_t)d,
                          memory_order_relaxed);
    atomic_store_explicit(&ix->lower_pairs,
                          atomic_load_explicit(&ix->lower_pairs, memory_order_relaxed) +
                              (uint64_t)(int64_t)d,
                          memory_order_relaxed);
}

/* Changes the tier bits of the holder at hi of node n to `tiers` (non-zero), maintaining
 * REACH, rc, and the per-slot counters. */
static void pair_set_tiers(kvr_index_t *ix, uint32_t n, uint32_t hi, unsigned tiers)
{
    node_t *nd = N(ix, n);
    _Atomic holder_t *h = holders_w(nd);
    holder_t hv = hget(h, hi);
    uint32_t slot = h_slot(hv);
    unsigned old = h_tiers(hv), flags = h_flags(hv);
    wslot_t *ws = &ix->slots[slot];
    bool had_lower = old & TIER_LOWER_BITS, has_lower = tiers & TIER_LOWER_BITS;
    if (had_lower != has_lower)
        lower_add(ix, slot, has_lower ? 1 : -1);
    bool had_dev = old & TIER_DEVICE_BIT, has_dev = tiers & TIER_DEVICE_BIT;
    if (had_dev == has_dev) {
        hset(h, hi, h_make(slot, tiers, flags));
        return;
    }
    if (has_dev) {
        bool reach = parent_reach(ix, n, slot);
        hset(h, hi, h_make(slot, tiers, reach ? flags | HF_REACH : flags));
        if (reach) {
            rc_add(nd, 1);
            reach_cascade(ix, n, slot, true);
        } else {
            ws->n_orphan++;
        }
    } else {
        hset(h, hi, h_make(slot, tiers, flags & ~(unsigned)HF_REACH));
        if (flags & HF_REACH) {
            rc_add(nd, -1);
            reach_cascade(ix, n, slot, false);
        } else {
            ws->n_orphan--;
        }
    }
}

/* Removes the pair at holder index hi of n entirely; frees n (and emptied ancestors) when it
 * no longer serves any purpose unless keep_node. */
static void pair_drop(kvr_index_t *ix, uint32_t n, uint32_t hi, bool try_free)
{
    node_t *nd = N(ix, n);
    holder_t hv = hget(holders_w(nd), hi);
    uint32_t slot = h_slot(hv);
    if (h_tiers(hv) & TIER_LOWER_BITS)
        lower_add(ix, slot, -1);
    if (h_tiers(hv) & TIER_DEVICE_BIT) {
        if (h_flags(hv) & HF_REACH) {
            rc_add(nd, -1);
            /* descendants lose reach; hv is still in place while cascading */
            reach_cascade(ix, n, slot, false);
        } else {
            ix->slots[slot].n_orphan--;
        }
    }
    if (h_flags(hv) & HF_OWN_EXT) {
        oent_t *e = otab_find(&ix->by_node, slot, n);
        if (e != NULL) {
            uint64_t ext = e->val;
            otab_del(&ix->by_node, slot, n);
            otab_del(&ix->by_ext, slot, ext);
        }
    }
    holder_remove_at(nd, hi);
    ix->slots[slot].n_pairs--;
    ix->st.pairs--;
    if (try_free)
        node_try_free(ix, n);
}

/* Gives the pair (slot, n) the engine hash ext (the pair exists at holder index hi). */
static int pair_set_ext(kvr_index_t *ix, uint32_t n, uint32_t hi, uint64_t ext)
{
    node_t *nd = N(ix, n);
    _Atomic holder_t *h = holders_w(nd);
    holder_t hv = hget(h, hi);
    uint32_t slot = h_slot(hv);
    if (h_flags(hv) & HF_OWN_EXT) {
        oent_t *e = otab_find(&ix->by_node, slot, n);
        if (e != NULL) {
            otab_del(&ix->by_ext, slot, e->val);
            otab_del(&ix->by_node, slot, n);
        }
    }
    unsigned flags = h_flags(hv) & ~(unsigned)HF_OWN_EXT;
    if (ext != nd->ext) {
        int rc = otab_put(&ix->bytes_ovr, &ix->by_node, slot, n, ext);
        if (rc == KVR_OK)
            rc = otab_put(&ix->bytes_ovr, &ix->by_ext, slot, ext, n);
        if (rc != KVR_OK)
            return rc;
        flags |= HF_OWN_EXT;
    }
    hset(h, hi, h_make(slot, h_tiers(hv), flags));
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Eviction: CLOCK over leaves. A node's reference bit is set when a lookup matches it or a
 * store touches it; the hand clears it once (second chance) and evicts unreferenced leaves. */

static void evict_node(kvr_index_t *ix, uint32_t n)
{
    node_t *nd = N(ix, n);
    ix->st.evicted_nodes++;
    while (n_holders(nd) > 0) {
        uint32_t i = n_holders(nd) - 1;
        holder_t hv = hget(holders_w(nd), i);
        if (ix->cfg.on_evict != NULL) {
            ix->cfg.on_evict(ix->cfg.on_evict_ud, ix->wids[h_slot(hv)],
                             pair_ext(ix, h_slot(hv), n, hv), h_tiers(hv));
        }
        ix->st.evicted_pairs++;
        pair_drop(ix, n, i, false);
    }
    node_try_free(ix, n);
}

static int lq_push(kvr_index_t *ix, uint32_t n)
{
    if (ix->lq_len == ix->lq_cap) {
        size_t cap = ix->lq_cap ? ix->lq_cap * 2 : 1024;
        struct lq_ent *q = malloc(cap * sizeof *q);
        if (q == NULL)
            return KVR_ENOMEM;
        for (size_t i = 0; i < ix->lq_len; i++)
            q[i] = ix->lq[(ix->lq_head + i) % ix->lq_cap];
        free(ix->lq);
        ix->st.bytes += (cap - ix->lq_cap) * sizeof *q;
        ix->lq = q;
        ix->lq_cap = cap;
        ix->lq_head = 0;
    }
    uint32_t t = atomic_load_explicit(&ix->tick, memory_order_relaxed);
    ix->lq[(ix->lq_head + ix->lq_len++) % ix->lq_cap] = (struct lq_ent){n, t};
    return KVR_OK;
}

static bool is_leaf(const kvr_index_t *ix, uint32_t n)
{
    const node_t *nd = N(ix, n);
    return n != ROOT && nd->live && nd->first_child == NIL;
}

/* Drops queue entries of nodes that are no longer leaves, when they dominate the queue. */
static void lq_compact(kvr_index_t *ix)
{
    size_t kept = 0;
    for (size_t i = 0; i < ix->lq_len; i++) {
        struct lq_ent e = ix->lq[(ix->lq_head + i) % ix->lq_cap];
        if (is_leaf(ix, e.node))
            ix->lq[(ix->lq_head + kept++) % ix->lq_cap] = e;
    }
    ix->lq_len = kept;
}

/* Evicts least-recently-used leaves until within budget: the oldest queued leaf goes unless a
 * lookup or store used it after it was queued, in which case it is queued again. */
static void evict_to_budget(kvr_index_t *ix)
{
    size_t requeued = 0;
    while ((ix->st.pairs > ix->max_pairs || ix->st.nodes > ix->max_pairs) && ix->lq_len > 0) {
        struct lq_ent e = ix->lq[ix->lq_head];
        ix->lq_head = (ix->lq_head + 1) % ix->lq_cap;
        ix->lq_len--;
        if (!is_leaf(ix, e.node))
            continue; /* stale: it has children now, or it is gone */
        uint32_t used = atomic_load_explicit(&N(ix, e.node)->tick, memory_order_relaxed);
        if ((int32_t)(used - e.tick) > 0 && requeued++ < ix->lq_len + 1) {
            (void)lq_push(ix, e.node);
            continue;
        }
        evict_node(ix, e.node);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* RCU / locking */

static pthread_once_t reader_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t reader_key;
static _Thread_local bool reader_registered;

static void reader_key_destroy(void *p)
{
    (void)p;
    if (reader_registered) {
        urcu_memb_unregister_thread();
        reader_registered = false;
    }
}

static void reader_key_make(void) { (void)pthread_key_create(&reader_key, reader_key_destroy); }

void kvr_index_reader_register(void)
{
    if (reader_registered)
        return;
    (void)pthread_once(&reader_key_once, reader_key_make);
    urcu_memb_register_thread();
    reader_registered = true;
    (void)pthread_setspecific(reader_key, &reader_registered); /* unregisters at thread exit */
}

void kvr_index_reader_unregister(void)
{
    if (!reader_registered)
        return;
    urcu_memb_unregister_thread();
    reader_registered = false;
    (void)pthread_setspecific(reader_key, NULL);
}

void kvr_index_reclaim(kvr_index_t *ix)
{
    if (ix->limbo_nodes.n == 0 && ix->limbo_ptrs.n == 0 && ix->limbo_slots.n == 0)
        return;
    if (ix->cfg.sync == KVR_SYNC_RCU)
        rcu_wait(ix);
    for (size_t i = 0; i < ix->limbo_ptrs.n; i++)
        free(ix->limbo_ptrs.v[i]);
    ix->limbo_ptrs.n = 0;
    ix->limbo_bytes = 0;
    for (size_t i = 0; i < ix->limbo_nodes.n; i++) {
        uint32_t n = ix->limbo_nodes.v[i];
        atomic_store_explicit(&N(ix, n)->is_ovf, 0, memory_order_relaxed);
        (void)vec_push(&ix->free_nodes, n);
    }
    ix->limbo_nodes.n = 0;
    for (size_t i = 0; i < ix->limbo_slots.n; i++) {
        ix->slots[ix->limbo_slots.v[i]].limbo = 0;
        (void)vec_push(&ix->free_slots, ix->limbo_slots.v[i]);
    }
    ix->limbo_slots.n = 0;
}

static void kvr_index_reclaim_(kvr_index_t *ix) { kvr_index_reclaim(ix); }

static void reclaim_if_due(kvr_index_t *ix)
{
    /* a grace period is a membarrier (an IPI to every CPU running a reader): batched, but
     * bounded in memory (holder arrays outgrown by popular blocks come by the million in
     * `bench mooncake`: at 1,024 a batch the writer waited 68 times a second) */
    if (ix->limbo_nodes.n >= 8192 || ix->limbo_ptrs.n >= 65536 ||
        ix->limbo_bytes >= ((size_t)16 << 20) || ix->limbo_slots.n >= 64)
        kvr_index_reclaim(ix);
}

static void wlock(kvr_index_t *ix)
{
    if (ix->cfg.sync == KVR_SYNC_RWLOCK)
        (void)pthread_rwlock_wrlock(&ix->lock);
}

static void wunlock(kvr_index_t *ix)
{
    if (ix->cfg.sync == KVR_SYNC_RWLOCK)
        (void)pthread_rwlock_unlock(&ix->lock);
}

/* ---------------------------------------------------------------------------------------- */
/* Create / free */

kvr_index_t *kvr_index_new(const kvr_index_config_t *cfg, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    kvr_index_config_t c = cfg ? *cfg : (kvr_index_config_t){0};
    if (c.sync != KVR_SYNC_RCU && c.sync != KVR_SYNC_RWLOCK && c.sync != KVR_SYNC_NONE) {
        *status = KVR_EINVAL;
        return NULL;
    }
    if (c.max_workers > KVR_INDEX_MAX_WORKERS) {
        *status = KVR_ERANGE;
        return NULL;
    }
    kvr_index_t *ix = calloc(1, sizeof *ix);
    if (ix == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    ix->cfg = c;
    ix->max_workers = c.max_workers ? c.max_workers : KVR_INDEX_DEFAULT_MAX_WORKERS;
    ix->max_pairs = c.max_pairs ? c.max_pairs : KVR_INDEX_DEFAULT_MAX_PAIRS;
    ix->st.max_pairs = ix->max_pairs;
    ix->slots = calloc(ix->max_workers, sizeof *ix->slots);
    ix->wids = calloc(ix->max_workers, sizeof *ix->wids);
    size_t smap_cap = 2;
    while (smap_cap < 2 * (size_t)ix->max_workers)
        smap_cap *= 2;
    ix->smap = calloc(smap_cap, sizeof *ix->smap);
    ix->smap_mask = smap_cap - 1;
    ntab_t *t1 = ntab_new(1024);
    ix->t2 = ntab_new(1024);
    pthread_rwlockattr_t attr;
    bool lock_ok = pthread_rwlockattr_init(&attr) == 0;
    if (lock_ok) {
        (void)pthread_rwlockattr_setkind_np(&attr,
                                            PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        lock_ok = pthread_rwlock_init(&ix->lock, &attr) == 0;
        pthread_rwlockattr_destroy(&attr);
    }
    if (ix->slots == NULL || ix->wids == NULL || ix->smap == NULL || t1 == NULL || ix->t2 == NULL ||
        node_reserve(ix, 1) != KVR_OK || !lock_ok) {
        free(t1);
        atomic_store(&ix->t1, NULL);
        kvr_index_free(ix);
        *status = KVR_ENOMEM;
        return NULL;
    }
    atomic_store(&ix->t1, t1);
    ix->st.bytes += sizeof *ix + ix->max_workers * (sizeof *ix->slots + sizeof *ix->wids) +
                    smap_cap * sizeof *ix->smap + ntab_bytes(t1) + ntab_bytes(ix->t2);
    /* node 0 is the root: never in a table, never freed */
    uint32_t root = node_alloc(ix);
    N(ix, root)->live = 1;
    *status = KVR_OK;
    return ix;
}

void kvr_index_free(kvr_index_t *ix)
{
    if (ix == NULL)
        return;
    if (ix->cfg.sync == KVR_SYNC_RCU && (ix->limbo_ptrs.n > 0))
        rcu_wait(ix);
    for (size_t i = 0; i < ix->limbo_ptrs.n; i++)
        free(ix->limbo_ptrs.v[i]);
    for (uint32_t i = 0; i < ix->n_alloc; i++) {
        node_t *nd = N(ix, i);
        /* a freed node's holder array is in limbo_ptrs already */
        if (nd->live && atomic_load_explicit(&nd->is_ovf, memory_order_relaxed))
            free(atomic_load_explicit(&nd->ovf, memory_order_relaxed));
    }
    for (uint32_t c = 0; c < ix->n_chunks; c++)
        free(ix->chunks[c]);
    free(atomic_load(&ix->t1));
    free(ix->t2);
    free(ix->by_ext.e);
    free(ix->by_node.e);
    free(ix->slots);
    free(ix->wids);
    free(ix->smap);
    free(ix->free_nodes.v);
    free(ix->free_slots.v);
    free(ix->limbo_slots.v);
    free(ix->limbo_nodes.v);
    free(ix->limbo_ptrs.v);
    free(ix->stack.v);
    free(ix->tmp_nodes.v);
    free(ix->seen);
    free(ix->seq_buf);
    free(ix->lq);
    pthread_rwlock_destroy(&ix->lock);
    free(ix);
}

/* ---------------------------------------------------------------------------------------- */
/* Apply: Stored */

/* True when an engine hash repeats within the event or equals the parent's. */
static int has_repeated_ext(kvr_index_t *ix, const kvr_event_t *ev, bool *repeated)
{
    size_t n = ev->n_blocks;
    *repeated = false;
    if (n <= 16) {
        for (size_t i = 0; i < n; i++) {
            if (ev->has_parent && ev->blocks[i].ext == ev->parent_ext)
                *repeated = true;
            for (size_t j = i + 1; j < n; j++)
                if (ev->blocks[i].ext == ev->blocks[j].ext)
                    *repeated = true;
        }
        return KVR_OK;
    }
    /* a set stamped with a generation, so it is never cleared between events */
    size_t cap = 64;
    while (cap < 2 * (n + 1))
        cap *= 2;
    if (ix->seen_cap < cap) {
        struct seen *e = calloc(cap, sizeof *e);
        if (e == NULL)
            return KVR_ENOMEM;
        free(ix->seen);
        ix->seen = e;
        ix->seen_cap = cap;
        ix->seen_gen = 0;
    }
    ix->seen_gen++;
    size_t mask = ix->seen_cap - 1;
    for (size_t i = 0; i <= n && !*repeated; i++) {
        if (i == n && !ev->has_parent)
            break;
        uint64_t key = i < n ? ev->blocks[i].ext : ev->parent_ext;
        for (size_t j = kvr_mix64(key) & mask;; j = (j + 1) & mask) {
            if (ix->seen[j].gen != ix->seen_gen) {
                ix->seen[j] = (struct seen){key, ix->seen_gen};
                break;
            }
            if (ix->seen[j].key == key) {
                *repeated = true;
                break;
            }
        }
    }
    return KVR_OK;
}

/* The child of parent for lbh, or NIL. */
static uint32_t child_by_seq(const kvr_index_t *ix, uint32_t parent, uint64_t seq)
{
    if (N(ix, parent)->first_child == NIL)
        return NIL; /* a leaf has no child to find: most blocks of a new chain end here */
    const ntab_t *t = atomic_load_explicit(&ix->t1, memory_order_relaxed);
    uint64_t h = kvr_mix64(seq);
    for (size_t i = ntab_home(t, h);; i = (i + 1) & t->mask) {
        uint64_t sl = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (sl == SLOT_EMPTY)
            return NIL;
        uint32_t s = s_node(sl);
        if (s != NODE_TOMB && s_tag(sl) == (uint32_t)(h >> 32) && t1_key(ix, s) == seq &&
            atomic_load_explicit(&N(ix, s)->parent, memory_order_relaxed) == parent)
            return s;
    }
}

/* Stores one block for slot under parent; returns the node via *out. */
static int store_block(kvr_index_t *ix, uint32_t slot, uint32_t parent, const kvr_block_t *b,
                       uint64_t seq, unsigned tier_bit, uint32_t *out)
{
    uint32_t n = child_by_seq(ix, parent, seq);

    /* the engine hash may already name another prefix of this worker: it moves here */
    uint32_t prev = pair_by_ext(ix, slot, b->ext);
    if (prev != NIL && prev != n) {
        ix->st.warn_ext_rebound++;
        long phi = holder_find(N(ix, prev), slot);
        /* keep prev alive while we may still link under it (it can be our parent) */
        pair_drop(ix, prev, (uint32_t)phi, prev != parent);
        n = child_by_seq(ix, parent, seq); /* dropping prev may have freed an empty n */
    }
    if (n == NIL)
        n = node_create(ix, parent, seq, b->lbh, b->ext);
    node_t *nd = N(ix, n);
    atomic_store_explicit(&nd->tick, atomic_load_explicit(&ix->tick, memory_order_relaxed),
                          memory_order_relaxed);

    long hi = holder_find(nd, slot);
    if (hi < 0) {
        int rc = holder_add(ix, nd, h_make(slot, 0, 0));
        if (rc != KVR_OK)
            return rc;
        hi = (long)n_holders(nd) - 1;
        ix->slots[slot].n_pairs++;
        ix->st.pairs++;
        rc = pair_set_ext(ix, n, (uint32_t)hi, b->ext);
        if (rc != KVR_OK)
            return rc;
    } else {
        holder_t hv = hget(holders_w(nd), (uint32_t)hi);
        if (pair_ext(ix, slot, n, hv) != b->ext) {
            ix->st.warn_ext_rebound++;
            int rc = pair_set_ext(ix, n, (uint32_t)hi, b->ext);
            if (rc != KVR_OK)
                return rc;
        } else if (h_tiers(hv) & tier_bit) {
            ix->st.warn_duplicate_store++;
        }
    }
    holder_t hv = hget(holders_w(nd), (uint32_t)hi);
    if (!(h_tiers(hv) & tier_bit))
        pair_set_tiers(ix, n, (uint32_t)hi, h_tiers(hv) | tier_bit);
    *out = n;
    return KVR_OK;
}

static int seq_reserve(kvr_index_t *ix, size_t n)
{
    return kvr_grow((void **)&ix->seq_buf, &ix->seq_cap, n, SIZE_MAX, sizeof *ix->seq_buf);
}

/* The home slot's cache line and the next: a probe that misses runs to an empty slot, which
 * at our load factors is nearly always within those two lines. */
static inline void prefetch_slots(const ntab_t *t, uint64_t key)
{
    size_t i = ntab_home(t, kvr_mix64(key));
    __builtin_prefetch(&t->slots[i]);
    __builtin_prefetch(&t->slots[(i + 8) & t->mask]);
}

static void prefetch_ext(const kvr_index_t *ix, uint32_t slot, uint64_t ext)
{
    prefetch_slots(ix->t2, ext);
    if (ix->by_ext.e != NULL)
        __builtin_prefetch(&ix->by_ext.e[otab_hash(slot, ext) & ix->by_ext.mask]);
}

/* Computes the chain's sequence hashes into seq_buf and prefetches every table slot the
 * event will probe, so the misses overlap instead of following one another. */
static void prefetch_chain(kvr_index_t *ix, const kvr_event_t *ev, uint32_t parent)
{
    const ntab_t *t1 = atomic_load_explicit(&ix->t1, memory_order_relaxed);
    uint64_t prev = parent == ROOT ? 0 : N(ix, parent)->seq;
    long slot = slot_find(ix, ev->worker);
    for (size_t i = 0; i < ev->n_blocks; i++) {
        const kvr_block_t *b = &ev->blocks[i];
        uint64_t seq = (i == 0 && parent == ROOT) ? b->lbh : kvr_hash_chain_next(prev, b->lbh);
        ix->seq_buf[i] = seq;
        prev = seq;
        prefetch_slots(t1, seq);
        if (i < ix->free_nodes.n)
            __builtin_prefetch(N(ix, ix->free_nodes.v[ix->free_nodes.n - 1 - i]), 1);
        prefetch_ext(ix, slot < 0 ? 0 : (uint32_t)slot, b->ext);
    }
}

static int apply_stored(kvr_index_t *ix, const kvr_event_t *ev)
{
    if (ev->n_blocks == 0)
        return KVR_OK;
    if (ev->blocks == NULL)
        return KVR_EINVAL;
    bool repeated;
    int rc = has_repeated_ext(ix, ev, &repeated);
    if (rc != KVR_OK)
        return rc;
    if (repeated) {
        ix->st.err_invalid_sequence++;
        return KVR_EBLOCKSEQ;
    }
    long found = slot_find(ix, ev->worker);
    uint32_t parent = ROOT;
    if (ev->has_parent) {
        parent = found >= 0 ? pair_by_ext(ix, (uint32_t)found, ev->parent_ext) : NIL;
        if (parent == NIL) {
            ix->st.err_parent_not_found++;
            return KVR_EPARENT;
        }
    }
    /* reserve everything that can fail before mutating */
    if ((rc = seq_reserve(ix, ev->n_blocks)) != KVR_OK ||
        (rc = node_reserve(ix, ev->n_blocks)) != KVR_OK ||
        (rc = ntab_reserve(ix, NULL, &ix->t1, ev->n_blocks)) != KVR_OK ||
        (rc = ntab_reserve(ix, &ix->t2, NULL, ev->n_blocks)) != KVR_OK) {
        ix->st.err_capacity++;
        return rc;
    }
    long slot = found >= 0 ? found : slot_get(ix, ev->worker);
    if (slot < 0) {
        ix->st.err_capacity++;
        return (int)slot;
    }
    unsigned tier_bit = 1u << ev->tier;
    uint64_t nodes_before = ix->st.nodes + ix->st.evicted_nodes;
    prefetch_chain(ix, ev, parent);
    for (size_t i = 0; i < ev->n_blocks; i++) {
        rc = store_block(ix, (uint32_t)slot, parent, &ev->blocks[i], ix->seq_buf[i], tier_bit,
                         &parent);
        if (rc != KVR_OK) {
            ix->st.err_capacity++;
            return rc; /* only on allocation failure of a holder array or override entry */
        }
    }
    /* a created chain ends in a new leaf (the nodes before it are its ancestors) */
    if (ix->st.nodes + ix->st.evicted_nodes != nodes_before && is_leaf(ix, parent))
        (void)lq_push(ix, parent);
    ix->st.events_stored++;
    ix->st.blocks_stored += ev->n_blocks;
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Apply: Removed, Cleared, remove worker */

/* Prefetches the nodes whose ext-table tags match, without reading them. */
static void prefetch_ext_nodes(const kvr_index_t *ix, uint64_t ext)
{
    const ntab_t *t = ix->t2;
    uint64_t h = kvr_mix64(ext);
    for (size_t i = ntab_home(t, h);; i = (i + 1) & t->mask) {
        uint64_t sl = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (sl == SLOT_EMPTY)
            return;
        if (s_node(sl) != NODE_TOMB && s_tag(sl) == (uint32_t)(h >> 32))
            __builtin_prefetch(N(ix, s_node(sl)));
    }
}

/* A removal touches its table slots, its node, then the node's seq slot, parent and siblings
 * (when the node goes). Each stage is prefetched for the whole batch before the next one reads,
 * so a batch costs a few overlapped memory round trips instead of several per block. */
static void prefetch_removals(kvr_index_t *ix, uint32_t slot, const kvr_event_t *ev)
{
    size_t n = ev->n_removed;
    for (size_t i = 0; i < n; i++)
        prefetch_ext(ix, slot, ev->removed[i]);
    for (size_t i = 0; i < n; i++)
        prefetch_ext_nodes(ix, ev->removed[i]);
    const ntab_t *t1 = atomic_load_explicit(&ix->t1, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        uint32_t nd = pair_by_ext(ix, slot, ev->removed[i]);
        if (nd == NIL)
            continue;
        const node_t *x = N(ix, nd);
        prefetch_slots(t1, x->seq);
        __builtin_prefetch(N(ix, atomic_load_explicit(&x->parent, memory_order_relaxed)));
        if (x->prev_sib != NIL)
            __builtin_prefetch(N(ix, x->prev_sib));
        if (x->next_sib != NIL)
            __builtin_prefetch(N(ix, x->next_sib));
    }
}

static int apply_removed(kvr_index_t *ix, const kvr_event_t *ev)
{
    if (ev->n_removed > 0 && ev->removed == NULL)
        return KVR_EINVAL;
    long slot = slot_find(ix, ev->worker);
    unsigned tier_bit = 1u << ev->tier;
    if (slot >= 0)
        prefetch_removals(ix, (uint32_t)slot, ev);
    for (size_t i = 0; i < ev->n_removed; i++) {
        uint32_t n = slot >= 0 ? pair_by_ext(ix, (uint32_t)slot, ev->removed[i]) : NIL;
        long hi = n != NIL ? holder_find(N(ix, n), (uint32_t)slot) : -1;
        holder_t hv = hi >= 0 ? hget(holders_w(N(ix, n)), (uint32_t)hi) : 0;
        if (hi < 0 || !(h_tiers(hv) & tier_bit)) {
            ix->st.err_block_not_found++;
            continue;
        }
        unsigned tiers = h_tiers(hv) & ~tier_bit;
        if (tiers == 0)
            pair_drop(ix, n, (uint32_t)hi, true);
        else
            pair_set_tiers(ix, n, (uint32_t)hi, tiers);
        ix->st.blocks_removed++;
    }
    ix->st.events_removed++;
    return KVR_OK;
}

/* Drops every pair of slot: O(nodes). */
static void drop_slot_pairs(kvr_index_t *ix, uint32_t slot)
{
    ix->tmp_nodes.n = 0;
    for (uint32_t n = 1; n < ix->n_alloc && ix->slots[slot].n_pairs > 0; n++) {
        node_t *nd = N(ix, n);
        if (!nd->live)
            continue;
        long hi = holder_find(nd, slot);
        if (hi < 0)
            continue;
        /* no cascade needed: every pair of this slot goes, so fix counters directly */
        holder_t hv = hget(holders_w(nd), (uint32_t)hi);
        if (h_flags(hv) & HF_REACH) {
            rc_add(nd, -1);
            hset(holders_w(nd), (uint32_t)hi,
                 h_make(slot, h_tiers(hv), h_flags(hv) & ~(unsigned)HF_REACH));
            ix->slots[slot].n_orphan++;
        }
        pair_drop(ix, n, (uint32_t)hi, false);
        (void)vec_push(&ix->tmp_nodes, n);
    }
    for (size_t i = 0; i < ix->tmp_nodes.n; i++) {
        uint32_t n = ix->tmp_nodes.v[i];
        if (N(ix, n)->live)
            node_try_free(ix, n);
    }
}

static int apply_cleared(kvr_index_t *ix, const kvr_event_t *ev)
{
    long slot = slot_find(ix, ev->worker);
    if (slot >= 0)
        drop_slot_pairs(ix, (uint32_t)slot);
    ix->st.events_cleared++;
    return KVR_OK;
}

int kvr_index_apply(kvr_index_t *ix, const kvr_event_t *ev)
{
    if (ix == NULL || ev == NULL || (unsigned)ev->tier >= KVR_N_TIERS)
        return KVR_EINVAL;
    int rc;
    wlock(ix);
    switch (ev->kind) {
    case KVR_EV_STORED:
        rc = apply_stored(ix, ev);
        break;
    case KVR_EV_REMOVED:
        rc = apply_removed(ix, ev);
        break;
    case KVR_EV_CLEARED:
        rc = apply_cleared(ix, ev);
        break;
    default:
        rc = KVR_EINVAL;
        break;
    }
    evict_to_budget(ix);
    assert(ix->st.pairs <= ix->max_pairs && ix->st.nodes <= ix->max_pairs); /* the budget */
    if (ix->lq_len > 2 * ix->st.nodes + 1024)
        lq_compact(ix);
    atomic_store_explicit(&ix->tick, atomic_load_explicit(&ix->tick, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    reclaim_if_due(ix);
    wunlock(ix);
    return rc;
}

/* Drops the ranks of worker_id (one rank, or every rank when all is set). */
static int remove_ranks(kvr_index_t *ix, uint64_t worker_id, bool all, uint32_t dp_rank)
{
    if (ix == NULL)
        return KVR_EINVAL;
    wlock(ix);
    bool any = false;
    uint32_t hw = atomic_load_explicit(&ix->slots_hw, memory_order_relaxed);
    for (uint32_t s = 0; s < hw; s++) {
        wslot_t *ws = &ix->slots[s];
        if (!ws->live || ix->wids[s].worker_id != worker_id ||
            (!all && ix->wids[s].dp_rank != dp_rank))
            continue;
        any = true;
        drop_slot_pairs(ix, s);
        smap_erase(ix, s);
        ws->live = 0;
        ix->st.workers--;
        ix->st.workers_removed++;
        if (ix->cfg.sync == KVR_SYNC_RCU) {
            ws->limbo = 1;
            (void)vec_push(&ix->limbo_slots, s);
        } else {
            (void)vec_push(&ix->free_slots, s);
        }
    }
    reclaim_if_due(ix);
    wunlock(ix);
    return any ? KVR_OK : KVR_ENOWORKER;
}

int kvr_index_remove_worker(kvr_index_t *ix, uint64_t worker_id)
{
    return remove_ranks(ix, worker_id, true, 0);
}

int kvr_index_remove_rank(kvr_index_t *ix, kvr_worker_t worker)
{
    return remove_ranks(ix, worker.worker_id, false, worker.dp_rank);
}

/* ---------------------------------------------------------------------------------------- */
/* Lookup (readers) */

/* The index's half of a kvr_lookup_t: per-slot scratch no caller needs to see. */
struct kvr_lookup_scratch {
    uint32_t *mark;        /* per worker slot: a stamp (see device_walk) */
    uint32_t *alist;       /* the active slots after the walk's first drop */
    uint64_t *dropped;     /* bitset over worker slots: matched (for the lower-tier walk) */
    uint32_t *depth;       /* per worker slot: its device depth once matched (same) */
    uint32_t *chain;       /* node per block position */
    size_t cap_slots, cap_chain;
    uint32_t epoch; /* the last stamp handed out */
    uint32_t end;   /* the furthest position any tier matched (lower tiers included) */
};

static int lookup_reserve(kvr_lookup_t *lk, size_t slots, size_t n)
{
    if (lk->priv == NULL && (lk->priv = calloc(1, sizeof *lk->priv)) == NULL)
        return KVR_ENOMEM;
    struct kvr_lookup_scratch *sc = lk->priv;
    if (sc->cap_slots < slots) {
        size_t words = (slots + 63) / 64;
        uint32_t *mk = calloc(slots, sizeof *mk);
        uint32_t *al = malloc(slots * sizeof *al);
        uint64_t *d = calloc(words, sizeof *d);
        uint32_t *dep = calloc(slots, sizeof *dep);
        kvr_match_t *m = malloc(slots * sizeof *m);
        if (mk == NULL || al == NULL || d == NULL || dep == NULL || m == NULL) {
            free(mk);
            free(al);
            free(d);
            free(dep);
            free(m);
            return KVR_ENOMEM;
        }
        free(sc->mark);
        free(sc->alist);
        free(sc->dropped);
        free(sc->depth);
        free(lk->matches);
        sc->mark = mk;
        sc->alist = al;
        sc->dropped = d;
        sc->depth = dep;
        lk->matches = m;
        sc->cap_slots = slots;
        sc->epoch = 0;
    }
    return kvr_grow((void **)&sc->chain, &sc->cap_chain, n, SIZE_MAX, sizeof *sc->chain);
}

void kvr_lookup_init(kvr_lookup_t *lk) { memset(lk, 0, sizeof *lk); }

void kvr_lookup_deinit(kvr_lookup_t *lk)
{
    if (lk == NULL)
        return;
    free(lk->matches);
    if (lk->priv != NULL) {
        free(lk->priv->mark);
        free(lk->priv->alist);
        free(lk->priv->dropped);
        free(lk->priv->depth);
        free(lk->priv->chain);
        free(lk->priv);
    }
    memset(lk, 0, sizeof *lk);
}

#define PREFETCH_SLOT 16
#define PREFETCH_NODE 8

/* The node for position i (seq) under parent, or NIL. */
static inline uint32_t probe(const kvr_index_t *ix, const ntab_t *t, uint64_t seq,
                             uint32_t parent)
{
    uint64_t h = kvr_mix64(seq);
    for (size_t i = ntab_home(t, h);; i = (i + 1) & t->mask) {
        uint64_t sl = atomic_load_explicit(&t->slots[i], memory_order_acquire);
        if (sl == SLOT_EMPTY)
            return NIL;
        uint32_t s = s_node(sl);
        if (s == NODE_TOMB || s_tag(sl) != (uint32_t)(h >> 32))
            continue;
        const node_t *nd = N(ix, s);
        if (atomic_load_explicit(&nd->seq, memory_order_relaxed) == seq &&
            atomic_load_explicit(&nd->parent, memory_order_relaxed) == parent)
            return s;
    }
}

/* Resolves positions [0, n) into lk->priv->chain until the first miss; returns the chain length.
 * Stops early once `stop_when_alone` and the active set is known to be empty is not needed:
 * the caller bounds n. Probes are pipelined: slots are prefetched PREFETCH_SLOT positions
 * ahead and nodes PREFETCH_NODE ahead. */
static size_t resolve_chain(const kvr_index_t *ix, const ntab_t *t, const uint64_t *seq,
                            size_t n, uint32_t *chain)
{
    uint32_t parent = ROOT;
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH_SLOT < n)
            __builtin_prefetch(&t->slots[ntab_home(t, kvr_mix64(seq[i + PREFETCH_SLOT]))]);
        if (i + PREFETCH_NODE < n) {
            uint64_t s = atomic_load_explicit(
                &t->slots[ntab_home(t, kvr_mix64(seq[i + PREFETCH_NODE]))], memory_order_acquire);
            if (s != SLOT_EMPTY && s_node(s) != NODE_TOMB)
                __builtin_prefetch(N(ix, s_node(s)));
        }
        uint32_t nd = probe(ix, t, seq[i], parent);
        if (nd == NIL)
            return i;
        chain[i] = nd;
        parent = nd;
    }
    return n;
}

static inline bool bit_test(const uint64_t *b, uint32_t i) { return b[i >> 6] >> (i & 63) & 1; }
static inline void bit_set(uint64_t *b, uint32_t i) { b[i >> 6] |= UINT64_C(1) << (i & 63); }

/* Writes slot's match at m (device_blocks = depth, its final depth: the slot leaves the walk)
 * and returns the next one. The lower-tier walk, when there is one, reads which slots matched
 * and at what depth. The cursor is a local, not lk->n_matches: a store to a match could alias
 * that counter, which would then be reloaded for every match. */
static inline kvr_match_t *put_match(kvr_match_t *m, const kvr_index_t *ix,
                                     struct kvr_lookup_scratch *sc, uint32_t slot, uint32_t depth,
                                     bool lower)
{
    if (lower) {
        bit_set(sc->dropped, slot);
        sc->depth[slot] = depth;
    }
    m->worker = ix->wids[slot];
    m->device_blocks = depth;
    m->host_blocks = m->disk_blocks = 0;
    return m + 1;
}

/* Slot's match with its recorded depth, unless it has one already (lower-tier walk: the
 * device walk has matched every slot with a device block, so this one's depth is 0). */
static void touch(kvr_lookup_t *lk, const kvr_index_t *ix, uint32_t slot)
{
    if (!bit_test(lk->priv->dropped, slot)) {
        put_match(&lk->matches[lk->n_matches], ix, lk->priv, slot, lk->priv->depth[slot], true);
        lk->n_matches++;
    }
}

/* A stamp no mark[] entry holds yet (marks are only ever set to stamps handed out before). */
static uint32_t fresh_stamp(struct kvr_lookup_scratch *sc)
{
    if (++sc->epoch == 0) {
        memset(sc->mark, 0, sc->cap_slots * sizeof *sc->mark);
        sc->epoch = 1;
    }
    return sc->epoch;
}

/* Every REACH holder of nd (below max_slot) matched at depth, nothing emitted before: one
 * plain pass when no removal moved a holder meanwhile (the node's seqcount is unchanged and
 * even), else a pass that stamps each slot so none is emitted twice. */
static kvr_match_t *emit_holders(const kvr_index_t *ix, struct kvr_lookup_scratch *sc,
                                 const node_t *nd, uint32_t max_slot, uint32_t depth, bool lower,
                                 kvr_match_t *mo)
{
    uint16_t sq = atomic_load_explicit(&nd->hseq, memory_order_acquire);
    if (!(sq & 1) && !lower) {
        kvr_match_t *start = mo;
        hview_t v = holders_read(nd);
        for (uint32_t k = 0; k < v.n; k++) {
            holder_t h = atomic_load_explicit(&v.h[k], memory_order_acquire);
            uint32_t s = h_slot(h);
            if ((h_flags(h) & HF_REACH) && s < max_slot)
                mo = put_match(mo, ix, sc, s, depth, false);
        }
        /* after the holders' acquire loads, so it sees any removal whose move was read */
        if (atomic_load_explicit(&nd->hseq, memory_order_relaxed) == sq)
            return mo;
        mo = start;
    }
    uint32_t done = fresh_stamp(sc);
    hview_t v = holders_read(nd);
    for (uint32_t k = 0; k < v.n; k++) {
        holder_t h = atomic_load_explicit(&v.h[k], memory_order_acquire);
        uint32_t s = h_slot(h);
        if (!(h_flags(h) & HF_REACH) || s >= max_slot || sc->mark[s] == done)
            continue;
        sc->mark[s] = done;
        mo = put_match(mo, ix, sc, s, depth, lower);
    }
    return mo;
}

/* Device walk over chain[0, len): per slot, the depth at which it drops out. REACH sets only
 * shrink along a path, so a level is inspected only when its REACH count differs from the
 * active count. The active set starts as the REACH holders of chain[0], not listed: most
 * lookups of a shared prefix drop nearly every holder at one level (or none), so the first
 * drop scans that level's holders (the survivors, stamped), then chain[0]'s holders once,
 * emitting every unstamped one and listing the survivors; later drops work on that list.
 * Stamps (mark[]) also keep a slot seen twice in a torn holder array from being emitted
 * twice, and a slot is active only if chain[0] listed it. Matches come out in order of depth.
 * Cost: holders of chain[0] + holders of each drop level + the active list at each later
 * drop, and one write per match. */
static void device_walk(const kvr_index_t *ix, kvr_lookup_t *lk, size_t len, uint32_t max_slot,
                        bool lower)
{
    struct kvr_lookup_scratch *sc = lk->priv;
    sc->end = 0;
    if (len == 0)
        return;
    uint32_t *mark = sc->mark;
    kvr_match_t *mo = lk->matches + lk->n_matches;
    uint32_t done = fresh_stamp(sc); /* emitted */
    uint32_t live = 0;               /* the active list's stamp; 0: chain[0] not scanned yet */
    size_t n_list = 0;
    uint32_t n_active = atomic_load_explicit(&N(ix, sc->chain[0])->rc, memory_order_acquire);
    size_t i = 1;
    for (; i < len && n_active > 0; i++) {
        const node_t *nd = N(ix, sc->chain[i]);
        if (atomic_load_explicit(&nd->rc, memory_order_acquire) == n_active)
            continue;
        /* survivors: REACH holders of level i that are active */
        uint32_t keep = fresh_stamp(sc), kept = 0;
        hview_t v = holders_read(nd);
        for (uint32_t k = 0; k < v.n; k++) {
            holder_t h = atomic_load_explicit(&v.h[k], memory_order_acquire);
            uint32_t s = h_slot(h);
            if (!(h_flags(h) & HF_REACH) || s >= max_slot)
                continue;
            if (live == 0 || mark[s] == live) {
                mark[s] = keep;
                kept += live != 0;
            }
        }
        if (live == 0) {
            /* the first drop: chain[0]'s holders, once */
            uint32_t conf = fresh_stamp(sc);
            hview_t v0 = holders_read(N(ix, sc->chain[0]));
            for (uint32_t k = 0; k < v0.n; k++) {
                holder_t h = atomic_load_explicit(&v0.h[k], memory_order_acquire);
                uint32_t s = h_slot(h);
                if (!(h_flags(h) & HF_REACH) || s >= max_slot)
                    continue;
                uint32_t ms = mark[s];
                if (ms == keep) {
                    mark[s] = conf;
                    sc->alist[n_list++] = s;
                } else if (ms != done && ms != conf) {
                    mark[s] = done;
                    mo = put_match(mo, ix, sc, s, (uint32_t)i, lower); /* held 0 .. i-1 */
                }
            }
            /* later drops: survivors are marked with the list's stamp */
            live = conf;
            n_active = (uint32_t)n_list;
            continue;
        }
        size_t w = 0;
        for (size_t k = 0; k < n_list; k++) {
            uint32_t s = sc->alist[k];
            if (mark[s] == keep) {
                sc->alist[w++] = s;
            } else {
                mark[s] = done;
                mo = put_match(mo, ix, sc, s, (uint32_t)i, lower);
            }
        }
        n_list = w;
        live = keep;
        n_active = kept;
    }
    /* survivors hold every position walked */
    if (live == 0) {
        mo = emit_holders(ix, sc, N(ix, sc->chain[0]), max_slot, (uint32_t)i, lower, mo);
    } else {
        for (size_t k = 0; k < n_list; k++)
            mo = put_match(mo, ix, sc, sc->alist[k], (uint32_t)i, lower);
    }
    lk->n_matches = (size_t)(mo - lk->matches);
    lk->max_depth = lk->n_matches ? lk->matches[lk->n_matches - 1].device_blocks : 0;
    sc->end = lk->max_depth;
}

/* Holder of slot in nd (reader side), or 0 with *found = false. */
static holder_t reader_holder(const node_t *nd, uint32_t slot, bool *found)
{
    hview_t v = holders_read(nd);
    for (uint32_t k = 0; k < v.n; k++) {
        holder_t h = atomic_load_explicit(&v.h[k], memory_order_acquire);
        if (h_slot(h) == slot) {
            *found = true;
            return h;
        }
    }
    *found = false;
    return 0;
}

static uint32_t tier_run(const kvr_index_t *ix, const kvr_lookup_t *lk, size_t from,
                         size_t len, uint32_t slot, unsigned bits)
{
    size_t j = from;
    while (j < len) {
        bool found;
        holder_t h = reader_holder(N(ix, lk->priv->chain[j]), slot, &found);
        if (!found || !(h_tiers(h) & bits))
            break;
        j++;
    }
    return (uint32_t)(j - from);
}

/* Lower tiers: per slot with lower-tier pairs, the host run after its device prefix, then
 * the disk/external run after that. */
static void lower_walk(const kvr_index_t *ix, kvr_lookup_t *lk, size_t len, uint32_t max_slot)
{
    const unsigned host = 1u << KVR_TIER_HOST;
    const unsigned disk = (1u << KVR_TIER_DISK) | (1u << KVR_TIER_EXTERNAL);
    for (uint32_t s = 0; s < max_slot; s++) {
        if (atomic_load_explicit(&ix->slots[s].n_lower, memory_order_relaxed) == 0)
            continue;
        size_t start = bit_test(lk->priv->dropped, s) ? lk->priv->depth[s] : 0;
        uint32_t h = tier_run(ix, lk, start, len, s, host);
        uint32_t d = tier_run(ix, lk, start + h, len, s, disk);
        if (h + d == 0)
            continue;
        if (!bit_test(lk->priv->dropped, s)) {
            lk->priv->depth[s] = 0;
            touch(lk, ix, s);
        }
        for (size_t m = 0; m < lk->n_matches; m++) {
            if (lk->matches[m].worker.worker_id == ix->wids[s].worker_id &&
                lk->matches[m].worker.dp_rank == ix->wids[s].dp_rank) {
                lk->matches[m].host_blocks = h;
                lk->matches[m].disk_blocks = d;
                if (start + h + d > lk->priv->end)
                    lk->priv->end = (uint32_t)(start + h + d);
                break;
            }
        }
    }
}

/* Stamps the matched nodes with the current tick (a store only when it changes, so a hot
 * prefix does not bounce its cache lines between readers). */
static void mark_used(const kvr_index_t *ix, const kvr_lookup_t *lk)
{
    uint32_t now = atomic_load_explicit(&ix->tick, memory_order_relaxed);
    uint32_t end = lk->priv->end;
    for (uint32_t i = 0; i < end; i++) {
        node_t *nd = N(ix, lk->priv->chain[i]);
        if (atomic_load_explicit(&nd->tick, memory_order_relaxed) != now)
            atomic_store_explicit(&nd->tick, now, memory_order_relaxed);
    }
}

static void lookup_locked(kvr_index_t *ix, const uint64_t *seq, size_t n, kvr_lookup_t *lk)
{
    const ntab_t *t = atomic_load_explicit(&ix->t1, memory_order_acquire);
    uint32_t max_slot = atomic_load_explicit(&ix->slots_hw, memory_order_acquire);
    if (max_slot > lk->priv->cap_slots)
        max_slot = (uint32_t)lk->priv->cap_slots;
    bool lower = atomic_load_explicit(&ix->lower_pairs, memory_order_relaxed) > 0;
    size_t len = resolve_chain(ix, t, seq, n, lk->priv->chain);
    device_walk(ix, lk, len, max_slot, lower);
    if (lower) {
        lower_walk(ix, lk, len, max_slot);
        for (uint32_t w = 0; w < (max_slot + 63) / 64; w++)
            lk->priv->dropped[w] = 0; /* reset for the next lookup */
    }
    mark_used(ix, lk);
}

int kvr_index_lookup(kvr_index_t *ix, const uint64_t *seq, size_t n, kvr_lookup_t *lk)
{
    if (ix == NULL || lk == NULL || (seq == NULL && n > 0))
        return KVR_EINVAL;
    int rc = lookup_reserve(lk, ix->max_workers, n);
    if (rc != KVR_OK)
        return rc;
    lk->n_matches = 0;
    lk->max_depth = 0;
    if (n == 0)
        return KVR_OK;
    switch (ix->cfg.sync) {
    case KVR_SYNC_RCU:
        kvr_index_reader_register();
        urcu_memb_read_lock();
        lookup_locked(ix, seq, n, lk);
        TSAN_RELEASE(&ix->tsan_grace);
        urcu_memb_read_unlock();
        break;
    case KVR_SYNC_RWLOCK:
        (void)pthread_rwlock_rdlock(&ix->lock);
        lookup_locked(ix, seq, n, lk);
        (void)pthread_rwlock_unlock(&ix->lock);
        break;
    default:
        lookup_locked(ix, seq, n, lk);
        break;
    }
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Queries, stats */

unsigned kvr_index_holds(const kvr_index_t *ix, kvr_worker_t worker, uint64_t ext)
{
    long slot = slot_find(ix, worker);
    if (slot < 0)
        return 0;
    uint32_t n = pair_by_ext(ix, (uint32_t)slot, ext);
    if (n == NIL)
        return 0;
    node_t *nd = N(ix, n);
    long hi = holder_find(nd, (uint32_t)slot);
    return hi < 0 ? 0 : h_tiers(hget(holders_w(nd), (uint32_t)hi));
}

size_t kvr_index_worker_pairs(const kvr_index_t *ix, kvr_worker_t worker)
{
    long slot = slot_find(ix, worker);
    return slot < 0 ? 0 : (size_t)ix->slots[slot].n_pairs;
}

void kvr_index_stats(const kvr_index_t *ix, kvr_index_stats_t *out)
{
    *out = ix->st;
    out->bytes = ix->st.bytes + ix->bytes_ovf + ix->bytes_ovr +
                 (ix->free_nodes.cap + ix->limbo_nodes.cap) * sizeof(uint32_t);
}

/* ---------------------------------------------------------------------------------------- */
/* Dump: depth-first, parents before children, one single-block Stored event per pair and
 * tier. A worker holding a node whose parent it does not hold (a hole left by a mid-chain
 * removal) gets temporary ancestors stored under fresh engine hashes and removed at the end,
 * so the replay reproduces the hole. */

typedef struct dump_ctx {
    kvr_index_t *ix;
    kvr_dump_fn fn;
    void *ud;
    otab_t temp;     /* (slot, node) -> temporary ext */
    otab_t temp_ext; /* (slot, temporary ext) -> node */
    size_t bytes;
    u32vec_t temp_n; /* temp pairs in creation order: slot, node */
    uint64_t next_id;
} dump_ctx_t;

static int dump_emit_store(dump_ctx_t *d, uint32_t slot, unsigned tier, bool has_parent,
                           uint64_t parent_ext, uint64_t ext, uint64_t lbh)
{
    kvr_block_t b = {.ext = ext, .lbh = lbh};
    kvr_event_t ev = {.kind = KVR_EV_STORED,
                      .worker = d->ix->wids[slot],
                      .tier = (kvr_tier_t)tier,
                      .event_id = d->next_id++,
                      .has_parent = has_parent,
                      .parent_ext = parent_ext,
                      .blocks = &b,
                      .n_blocks = 1};
    return d->fn(d->ud, &ev);
}

/* The engine hash under which slot's copy of node n can serve as a parent in the replay,
 * creating temporary ancestors as needed. */
static int dump_parent_ext(dump_ctx_t *d, uint32_t slot, uint32_t n, uint64_t *ext);

static int dump_temp(dump_ctx_t *d, uint32_t slot, uint32_t n, uint64_t *ext)
{
    oent_t *e = otab_find(&d->temp, slot, n);
    if (e != NULL) {
        *ext = e->val;
        return 0;
    }
    /* a fresh hash this worker does not use */
    uint64_t cand = kvr_mix64(N(d->ix, n)->seq ^ UINT64_C(0x5bd1e9955bd1e995));
    while (pair_by_ext(d->ix, slot, cand) != NIL || otab_find(&d->temp_ext, slot, cand) != NULL)
        cand = kvr_mix64(cand + 1);
    uint32_t p = atomic_load_explicit(&N(d->ix, n)->parent, memory_order_relaxed);
    uint64_t pext = 0;
    int rc = p == ROOT ? 0 : dump_parent_ext(d, slot, p, &pext);
    if (rc != 0)
        return rc;
    rc = dump_emit_store(d, slot, KVR_TIER_DEVICE, p != ROOT, pext, cand, N(d->ix, n)->lbh);
    if (rc != 0)
        return rc;
    /* remember it both ways: by node, and by hash (so later candidates avoid it) */
    if (otab_put(&d->bytes, &d->temp, slot, n, cand) != KVR_OK ||
        otab_put(&d->bytes, &d->temp_ext, slot, cand, n) != KVR_OK ||
        vec_push(&d->temp_n, slot) != KVR_OK || vec_push(&d->temp_n, n) != KVR_OK)
        return KVR_ENOMEM;
    *ext = cand;
    return 0;
}

static int dump_parent_ext(dump_ctx_t *d, uint32_t slot, uint32_t n, uint64_t *ext)
{
    long hi = holder_find(N(d->ix, n), slot);
    if (hi >= 0) {
        *ext = pair_ext(d->ix, slot, n, hget(holders_w(N(d->ix, n)), (uint32_t)hi));
        return 0;
    }
    return dump_temp(d, slot, n, ext);
}

static int dump_node(dump_ctx_t *d, uint32_t n)
{
    node_t *nd = N(d->ix, n);
    uint32_t p = atomic_load_explicit(&nd->parent, memory_order_relaxed);
    for (uint32_t k = 0; k < n_holders(nd); k++) {
        holder_t hv = hget(holders_w(nd), k);
        uint32_t slot = h_slot(hv);
        uint64_t pext = 0;
        int rc = p == ROOT ? 0 : dump_parent_ext(d, slot, p, &pext);
        if (rc != 0)
            return rc;
        uint64_t ext = pair_ext(d->ix, slot, n, hv);
        for (unsigned t = 0; t < KVR_N_TIERS; t++) {
            if (!(h_tiers(hv) & (1u << t)))
                continue;
            rc = dump_emit_store(d, slot, t, p != ROOT, pext, ext, nd->lbh);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

static int dump_remove_temps(dump_ctx_t *d)
{
    for (size_t i = 0; i + 1 < d->temp_n.n; i += 2) {
        uint32_t slot = d->temp_n.v[i], n = d->temp_n.v[i + 1];
        oent_t *e = otab_find(&d->temp, slot, n);
        uint64_t ext = e ? e->val : 0;
        kvr_event_t ev = {.kind = KVR_EV_REMOVED,
                          .worker = d->ix->wids[slot],
                          .tier = KVR_TIER_DEVICE,
                          .event_id = d->next_id++,
                          .removed = &ext,
                          .n_removed = 1};
        int rc = d->fn(d->ud, &ev);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kvr_index_dump(kvr_index_t *ix, kvr_dump_fn fn, void *ud)
{
    if (ix == NULL || fn == NULL)
        return KVR_EINVAL;
    dump_ctx_t d = {.ix = ix, .fn = fn, .ud = ud};
    u32vec_t stack = {0};
    int rc = 0;
    for (uint32_t c = N(ix, ROOT)->first_child; c != NIL && rc == 0; c = N(ix, c)->next_sib)
        if (vec_push(&stack, c) != KVR_OK)
            rc = KVR_ENOMEM;
    while (rc == 0 && stack.n > 0) {
        uint32_t n = stack.v[--stack.n];
        rc = dump_node(&d, n);
        for (uint32_t c = N(ix, n)->first_child; c != NIL && rc == 0; c = N(ix, c)->next_sib)
            if (vec_push(&stack, c) != KVR_OK)
                rc = KVR_ENOMEM;
    }
    if (rc == 0)
        rc = dump_remove_temps(&d);
    free(stack.v);
    free(d.temp.e);
    free(d.temp_ext.e);
    free(d.temp_n.v);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Verify */

#define FAIL KVR_VERIFY_FAIL

static bool ntab_has(const ntab_t *t, uint64_t key, uint32_t n)
{
    uint64_t h = kvr_mix64(key);
    for (size_t i = ntab_home(t, h);; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (s_node(s) == n)
            return s_tag(s) == (uint32_t)(h >> 32);
        if (s == SLOT_EMPTY)
            return false;
    }
}

static int verify_node(const kvr_index_t *ix, uint32_t n, uint64_t *pairs, uint64_t *slot_pairs,
                       uint64_t *slot_lower, uint64_t *slot_orphan, uint64_t *own, char *msg,
                       size_t msg_len)
{
    const node_t *nd = N(ix, n);
    uint32_t p = atomic_load_explicit(&nd->parent, memory_order_relaxed);
    if (p >= ix->n_alloc || !N(ix, p)->live)
        FAIL("node %u: parent %u not live", n, p);
    uint64_t want = p == ROOT ? nd->lbh : kvr_hash_chain_next(N(ix, p)->seq, nd->lbh);
    if (nd->seq != want)
        FAIL("node %u: seq does not chain from its parent", n);
    if (!ntab_has(atomic_load_explicit(&ix->t1, memory_order_relaxed), nd->seq, n))
        FAIL("node %u: missing from the seq table", n);
    if (!ntab_has(ix->t2, nd->ext, n))
        FAIL("node %u: missing from the ext table", n);
    bool linked = false;
    for (uint32_t c = N(ix, p)->first_child; c != NIL; c = N(ix, c)->next_sib)
        if (c == n)
            linked = true;
    if (!linked)
        FAIL("node %u: not in its parent's child list", n);
    uint32_t nh = n_holders(nd);
    if (nh == 0 && nd->first_child == NIL)
        FAIL("node %u: empty leaf", n);
    if (nh > holders_cap(nd))
        FAIL("node %u: %u holders over capacity", n, nh);
    hblock_t *hb = hblock_w((node_t *)nd);
    if (hb != NULL && hb->pmask != 0) {
        uint32_t used = 0;
        for (size_t k = 0; k <= hb->pmask; k++)
            used += hpos(hb)[k] != 0;
        if (used != nh)
            FAIL("node %u: position table has %u entries for %u holders", n, used, nh);
    }
    uint32_t rc = 0;
    _Atomic holder_t *h = holders_w((node_t *)nd);
    for (uint32_t k = 0; k < nh; k++) {
        holder_t hv = hget(h, k);
        uint32_t s = h_slot(hv);
        if (s >= ix->max_workers || !ix->slots[s].live)
            FAIL("node %u: holder slot %u not live", n, s);
        if (h_tiers(hv) == 0 || h_tiers(hv) > 0xF)
            FAIL("node %u: holder %u has tier bits 0x%x", n, s, h_tiers(hv));
        for (uint32_t j = k + 1; j < nh; j++)
            if (h_slot(hget(h, j)) == s)
                FAIL("node %u: slot %u held twice", n, s);
        if (holder_find((node_t *)nd, s) != (long)k)
            FAIL("node %u: holder %u of slot %u not found by position", n, k, s);
        bool dev = h_tiers(hv) & TIER_DEVICE_BIT;
        bool want_reach = dev && parent_reach((kvr_index_t *)ix, n, s);
        if (want_reach != (bool)(h_flags(hv) & HF_REACH))
            FAIL("node %u: slot %u REACH is %d, should be %d", n, s,
                 (int)(bool)(h_flags(hv) & HF_REACH), (int)want_reach);
        rc += want_reach;
        if (dev && !want_reach)
            slot_orphan[s]++;
        if (h_tiers(hv) & TIER_LOWER_BITS)
            slot_lower[s]++;
        slot_pairs[s]++;
        (*pairs)++;
        uint64_t ext = pair_ext(ix, s, n, hv);
        if (h_flags(hv) & HF_OWN_EXT) {
            (*own)++;
            oent_t *e = otab_find(&ix->by_node, s, n);
            if (e == NULL || ext == nd->ext)
                FAIL("node %u: slot %u override entry missing or redundant", n, s);
        }
        if (pair_by_ext(ix, s, ext) != n)
            FAIL("node %u: slot %u engine hash does not lead back to it", n, s);
    }
    if (rc != atomic_load_explicit(&nd->rc, memory_order_relaxed))
        FAIL("node %u: rc %u, counted %u", n, (unsigned)nd->rc, rc);
    for (uint32_t c = nd->first_child; c != NIL; c = N(ix, c)->next_sib)
        if (!N(ix, c)->live || atomic_load_explicit(&N(ix, c)->parent, memory_order_relaxed) != n)
            FAIL("node %u: child %u not live or not pointing back", n, c);
    return KVR_OK;
}

/* Every leaf is queued for eviction at least once (else the budget could not be kept). */
static int verify_leaf_queue(const kvr_index_t *ix, char *msg, size_t msg_len)
{
    uint8_t *queued = calloc(ix->n_alloc ? ix->n_alloc : 1, 1);
    if (queued == NULL)
        FAIL("out of memory");
    for (size_t i = 0; i < ix->lq_len; i++) {
        uint32_t n = ix->lq[(ix->lq_head + i) % ix->lq_cap].node;
        if (n < ix->n_alloc)
            queued[n] = 1;
    }
    uint32_t missing = 0;
    for (uint32_t n = 1; n < ix->n_alloc; n++)
        if (is_leaf(ix, n) && !queued[n] && missing == 0)
            missing = n;
    free(queued);
    if (missing != 0)
        FAIL("leaf %u is not queued for eviction", missing);
    return KVR_OK;
}

int kvr_index_verify(const kvr_index_t *ix, char *msg, size_t msg_len)
{
    if (ix == NULL)
        FAIL("index is NULL");
    uint32_t hw = atomic_load_explicit(&ix->slots_hw, memory_order_relaxed);
    uint64_t *cnt = calloc((size_t)hw * 3 + 1, sizeof *cnt);
    if (cnt == NULL)
        FAIL("out of memory");
    uint64_t pairs = 0, nodes = 0, own = 0, lower = 0;
    int rc = KVR_OK;
    for (uint32_t n = 1; n < ix->n_alloc && rc == KVR_OK; n++) {
        if (!N(ix, n)->live)
            continue;
        nodes++;
        rc = verify_node(ix, n, &pairs, cnt, cnt + hw, cnt + 2 * (size_t)hw, &own, msg, msg_len);
    }
    for (uint32_t s = 0; s < hw && rc == KVR_OK; s++) {
        const wslot_t *ws = &ix->slots[s];
        if (!ws->live && cnt[s] != 0)
            rc = KVR_EINVAL;
        else if (ws->live && (ws->n_pairs != cnt[s] || ws->n_lower != cnt[hw + s] ||
                              ws->n_orphan != cnt[2 * (size_t)hw + s]))
            rc = KVR_EINVAL;
        if (rc != KVR_OK && msg != NULL && msg_len > 0)
            snprintf(msg, msg_len, "slot %u: counters pairs %llu/%llu lower %u/%llu orphan %llu/%llu",
                     s, (unsigned long long)ws->n_pairs, (unsigned long long)cnt[s], ws->n_lower,
                     (unsigned long long)cnt[hw + s], (unsigned long long)ws->n_orphan,
                     (unsigned long long)cnt[2 * (size_t)hw + s]);
        lower += cnt[hw + s];
    }
    free(cnt);
    if (rc != KVR_OK)
        return rc;
    size_t in_map = 0, live_slots = 0;
    if (!smap_verify(ix, ix->smap, ix->smap_mask, &in_map))
        FAIL("slot map: an entry is not reachable from its home");
    for (uint32_t s = 0; s < hw; s++) {
        if (!ix->slots[s].live)
            continue;
        live_slots++;
        kvr_worker_t w = ix->wids[s];
        if (slot_find(ix, w) != (long)s)
            FAIL("slot map: slot %u (worker %llu rank %u) not found", s,
                 (unsigned long long)w.worker_id, w.dp_rank);
    }
    if (in_map != live_slots)
        FAIL("slot map: %zu entries for %zu live slots", in_map, live_slots);
    if (pairs != ix->st.pairs)
        FAIL("pairs: counted %llu, recorded %llu", (unsigned long long)pairs,
             (unsigned long long)ix->st.pairs);
    if (nodes != ix->st.nodes)
        FAIL("nodes: counted %llu, recorded %llu", (unsigned long long)nodes,
             (unsigned long long)ix->st.nodes);
    if (lower != atomic_load_explicit(&ix->lower_pairs, memory_order_relaxed))
        FAIL("lower-tier pairs: counted %llu", (unsigned long long)lower);
    if (own != ix->by_node.live || own != ix->by_ext.live)
        FAIL("overrides: %llu pairs, tables %zu / %zu", (unsigned long long)own,
             ix->by_node.live, ix->by_ext.live);
    const ntab_t *t1 = atomic_load_explicit(&ix->t1, memory_order_relaxed);
    if (t1->live != nodes || ix->t2->live != nodes)
        FAIL("tables: %u / %u entries for %llu nodes", t1->live, ix->t2->live,
             (unsigned long long)nodes);
    if (pairs > ix->max_pairs)
        FAIL("budget: %llu pairs over %zu", (unsigned long long)pairs, ix->max_pairs);
    return verify_leaf_queue(ix, msg, msg_len);
}

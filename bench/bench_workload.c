/*
 * bench_workload.c: the synthetic prefix workload shared by `bench index` and `bench ingest`
 * (described in bench.h). It measures nothing; it produces KV events, deterministically from a
 * seed, that are valid for an index which applied all the previous ones.
 *
 * Model: roots (system prompts, 8-64 blocks, popularity skewed towards low indices) ->
 * conversations (a body of blocks after a root, generated lazily, shared by its replicas) ->
 * holdings (one worker's stored prefix of a conversation: `stored` body blocks, plus the root,
 * which a worker stores once however many of its holdings use it). A holding being stored
 * (`stored < want`) sits in a FIFO job queue and emits chunks of 1-64 blocks; an idle one is in
 * the active set, from which removals trim leaf blocks (and, once a worker's last holding of a
 * root is gone, the root's blocks) and new turns extend it. Pinned holdings (query targets)
 * are never trimmed nor extended.
 *
 * Memory: 16 bytes per generated body block, plus small per-holding and per-(worker, root)
 * records; owned by the kvr_wl_t. Threads: one at a time.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define WL_ROOT_MAX 64
#define WL_CHUNK_MAX 64
#define WL_N_ROOTS 256u
#define WL_MAX_REPLICAS 4
#define WL_BODY_MAX 32768u
#define WL_NONE UINT32_MAX

typedef struct wl_root {
    uint32_t len;
    uint64_t lbh[WL_ROOT_MAX];
    uint64_t seq[WL_ROOT_MAX];
} wl_root_t;

typedef struct wl_conv {
    uint32_t root;
    uint32_t len, cap; /* body blocks generated so far */
    uint64_t *lbh, *seq;
    uint32_t hold[WL_MAX_REPLICAS];
    uint32_t n_hold;
} wl_conv_t;

typedef struct wl_hold {
    uint32_t conv, worker;
    uint32_t stored, want;
    uint32_t active_pos; /* WL_NONE when not idle */
    bool pinned;
} wl_hold_t;

struct kvr_wl {
    kvr_wl_config_t cfg;
    bool all_holders;
    kvr_bench_rng_t rng;
    wl_root_t *roots;
    wl_conv_t *convs;
    uint32_t n_convs, cap_convs;
    uint32_t *free_convs;
    uint32_t n_free_convs, cap_free_convs;
    wl_hold_t *holds;
    uint32_t n_holds, cap_holds;
    uint32_t *free_holds;
    uint32_t n_free_holds, cap_free_holds;
    uint32_t *active;
    uint32_t n_active, cap_active;
    uint32_t *queue; /* pending holdings, FIFO from queue_head */
    uint32_t queue_head, queue_len, cap_queue;
    uint32_t *pinned;
    uint32_t n_pinned, cap_pinned;
    uint32_t *refs;     /* [worker * WL_N_ROOTS + root]: holdings of the worker on the root */
    uint8_t *root_held; /* same index: the worker stored the root's blocks */
    uint64_t *salt;     /* per worker: ext = seq ^ salt */
    uint64_t *worker_id;
    uint64_t pairs, event_id;
    kvr_block_t blocks[WL_ROOT_MAX + WL_CHUNK_MAX];
    uint64_t removed[WL_ROOT_MAX + WL_CHUNK_MAX];
};

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        fprintf(stderr, "kvrouter bench: out of memory (workload, %zu bytes)\n", n);
        exit(1);
    }
    return q;
}

/* Makes room for one more element in a vector of uint32_t-counted capacity. */
#define WL_RESERVE(ptr, len, cap)                                             \
    do {                                                                      \
        if ((len) == (cap)) {                                                 \
            (cap) = (cap) ? (cap) * 2 : 64;                                   \
            (ptr) = xrealloc((ptr), (size_t)(cap) * sizeof *(ptr));           \
        }                                                                     \
    } while (0)

kvr_wl_t *kvr_wl_new(const kvr_wl_config_t *cfg)
{
    if (cfg->workers == 0)
        return NULL;
    kvr_wl_t *wl = calloc(1, sizeof *wl);
    if (wl == NULL)
        return NULL;
    wl->cfg = *cfg;
    wl->all_holders = cfg->workers <= WL_MAX_REPLICAS;
    kvr_bench_rng_seed(&wl->rng, cfg->seed);
    wl->roots = xrealloc(NULL, WL_N_ROOTS * sizeof *wl->roots);
    for (uint32_t r = 0; r < WL_N_ROOTS; r++) {
        wl_root_t *rt = &wl->roots[r];
        rt->len = 8 + (uint32_t)kvr_bench_rng_below(&wl->rng, WL_ROOT_MAX - 8 + 1);
        for (uint32_t i = 0; i < rt->len; i++)
            rt->lbh[i] = kvr_bench_rng_next(&wl->rng);
        kvr_hash_chain(rt->lbh, rt->len, rt->seq);
    }
    size_t n = (size_t)cfg->workers * WL_N_ROOTS;
    wl->refs = calloc(n, sizeof *wl->refs);
    wl->root_held = calloc(n, 1);
    wl->salt = calloc(cfg->workers, sizeof *wl->salt);
    wl->worker_id = calloc(cfg->workers, sizeof *wl->worker_id);
    if (wl->refs == NULL || wl->root_held == NULL || wl->salt == NULL ||
        wl->worker_id == NULL) {
        kvr_wl_free(wl);
        return NULL;
    }
    for (uint32_t w = 0; w < cfg->workers; w++) {
        uint64_t h = kvr_bench_mix64(cfg->seed ^ (0x5157u + w));
        wl->worker_id[w] = h | 1; /* random-looking ids, as lease ids are */
        if (w % 8 == 7)           /* this engine hashes with its own seed */
            wl->salt[w] = kvr_bench_mix64(h + 0x77) | 1;
    }
    return wl;
}

void kvr_wl_free(kvr_wl_t *wl)
{
    if (wl == NULL)
        return;
    for (uint32_t c = 0; c < wl->n_convs; c++) {
        free(wl->convs[c].lbh);
        free(wl->convs[c].seq);
    }
    free(wl->roots);
    free(wl->convs);
    free(wl->free_convs);
    free(wl->holds);
    free(wl->free_holds);
    free(wl->active);
    free(wl->queue);
    free(wl->pinned);
    free(wl->refs);
    free(wl->root_held);
    free(wl->salt);
    free(wl->worker_id);
    free(wl);
}

uint64_t kvr_wl_pairs(const kvr_wl_t *wl)
{
    return wl->pairs;
}

bool kvr_wl_idle(const kvr_wl_t *wl)
{
    return wl->queue_len == 0;
}

static uint64_t ext_of(const kvr_wl_t *wl, uint32_t w, uint64_t seq)
{
    return seq ^ wl->salt[w];
}

static size_t wr_index(uint32_t w, uint32_t root)
{
    return (size_t)w * WL_N_ROOTS + root;
}

/* ---- sets and queues -------------------------------------------------------------------- */

static void active_add(kvr_wl_t *wl, uint32_t h)
{
    WL_RESERVE(wl->active, wl->n_active, wl->cap_active);
    wl->holds[h].active_pos = wl->n_active;
    wl->active[wl->n_active++] = h;
}

static void active_del(kvr_wl_t *wl, uint32_t h)
{
    uint32_t pos = wl->holds[h].active_pos;
    uint32_t last = wl->active[--wl->n_active];
    wl->active[pos] = last;
    wl->holds[last].active_pos = pos;
    wl->holds[h].active_pos = WL_NONE;
}

static void queue_push(kvr_wl_t *wl, uint32_t h)
{
    if (wl->queue_head > 0 && wl->queue_head + wl->queue_len == wl->cap_queue) {
        memmove(wl->queue, wl->queue + wl->queue_head, wl->queue_len * sizeof *wl->queue);
        wl->queue_head = 0;
    }
    uint32_t end = wl->queue_head + wl->queue_len;
    WL_RESERVE(wl->queue, end, wl->cap_queue);
    wl->queue[end] = h;
    wl->queue_len++;
}

static void queue_pop(kvr_wl_t *wl)
{
    wl->queue_head++;
    if (--wl->queue_len == 0)
        wl->queue_head = 0;
}

/* ---- conversations and holdings --------------------------------------------------------- */

static uint32_t conv_new(kvr_wl_t *wl, uint32_t root)
{
    uint32_t c;
    if (wl->n_free_convs > 0) {
        c = wl->free_convs[--wl->n_free_convs];
    } else {
        WL_RESERVE(wl->convs, wl->n_convs, wl->cap_convs);
        c = wl->n_convs++;
        wl->convs[c].lbh = wl->convs[c].seq = NULL;
        wl->convs[c].cap = 0;
    }
    wl_conv_t *cv = &wl->convs[c];
    cv->root = root;
    cv->len = 0;
    cv->n_hold = 0;
    return c;
}

static void conv_release(kvr_wl_t *wl, uint32_t c)
{
    wl_conv_t *cv = &wl->convs[c];
    free(cv->lbh);
    free(cv->seq);
    cv->lbh = cv->seq = NULL;
    cv->cap = cv->len = 0;
    WL_RESERVE(wl->free_convs, wl->n_free_convs, wl->cap_free_convs);
    wl->free_convs[wl->n_free_convs++] = c;
}

/* Generates body blocks up to len n (new random local hashes, chained after the root). */
static void conv_extend(kvr_wl_t *wl, wl_conv_t *cv, uint32_t n)
{
    if (n <= cv->len)
        return;
    if (n > cv->cap) {
        uint32_t cap = cv->cap ? cv->cap : 16;
        while (cap < n)
            cap *= 2;
        cv->lbh = xrealloc(cv->lbh, cap * sizeof *cv->lbh);
        cv->seq = xrealloc(cv->seq, cap * sizeof *cv->seq);
        cv->cap = cap;
    }
    const wl_root_t *rt = &wl->roots[cv->root];
    for (uint32_t i = cv->len; i < n; i++) {
        uint64_t prev = i == 0 ? rt->seq[rt->len - 1] : cv->seq[i - 1];
        cv->lbh[i] = kvr_bench_rng_next(&wl->rng);
        cv->seq[i] = kvr_hash_chain_next(prev, cv->lbh[i]);
    }
    cv->len = n;
}

/* A new holding of conversation c on worker w, queued to store want body blocks. */
static void hold_new(kvr_wl_t *wl, uint32_t c, uint32_t w, uint32_t want, bool pinned)
{
    uint32_t h;
    if (wl->n_free_holds > 0) {
        h = wl->free_holds[--wl->n_free_holds];
    } else {
        WL_RESERVE(wl->holds, wl->n_holds, wl->cap_holds);
        h = wl->n_holds++;
    }
    wl->holds[h] = (wl_hold_t){.conv = c, .worker = w, .stored = 0, .want = want,
                               .active_pos = WL_NONE, .pinned = pinned};
    wl_conv_t *cv = &wl->convs[c];
    cv->hold[cv->n_hold++] = h;
    wl->refs[wr_index(w, cv->root)]++;
    queue_push(wl, h);
}

static uint32_t pick_root(kvr_wl_t *wl)
{
    double u = kvr_bench_rng_unit(&wl->rng);
    return (uint32_t)(u * u * WL_N_ROOTS);
}

static void conv_start(kvr_wl_t *wl, uint32_t root, uint32_t want, bool pinned)
{
    uint32_t c = conv_new(wl, root);
    if (wl->all_holders) {
        for (uint32_t w = 0; w < wl->cfg.workers; w++)
            hold_new(wl, c, w, want, pinned);
    } else {
        hold_new(wl, c, (uint32_t)kvr_bench_rng_below(&wl->rng, wl->cfg.workers), want, pinned);
    }
    if (pinned) {
        WL_RESERVE(wl->pinned, wl->n_pinned, wl->cap_pinned);
        wl->pinned[wl->n_pinned++] = c;
    }
}

int kvr_wl_pin(kvr_wl_t *wl, uint32_t total_len)
{
    if (total_len == 0 || total_len > WL_BODY_MAX)
        return KVR_EINVAL;
    uint32_t root = pick_root(wl);
    uint32_t rlen = wl->roots[root].len;
    conv_start(wl, root, total_len > rlen ? total_len - rlen : 1, true);
    return KVR_OK;
}

/* Starts a job when the queue is empty: a new conversation, a replica, or a new turn. */
static void start_job(kvr_wl_t *wl, bool grow)
{
    uint64_t u = kvr_bench_rng_below(&wl->rng, 100);
    uint32_t p_new = grow ? 40 : 25;
    if (u < p_new || wl->n_active == 0) {
        uint32_t want = (uint32_t)(grow ? kvr_bench_rng_logu(&wl->rng, 4, 1024)
                                        : kvr_bench_rng_logu(&wl->rng, 1, 256));
        conv_start(wl, pick_root(wl), want, false);
        return;
    }
    uint32_t h = wl->active[kvr_bench_rng_below(&wl->rng, wl->n_active)];
    wl_hold_t *hd = &wl->holds[h];
    wl_conv_t *cv = &wl->convs[hd->conv];
    if (u < p_new + 10 && !wl->all_holders && cv->n_hold < WL_MAX_REPLICAS) {
        /* the next turn went to another worker, which prefills the whole history */
        for (int tries = 0; tries < 8; tries++) {
            uint32_t w = (uint32_t)kvr_bench_rng_below(&wl->rng, wl->cfg.workers);
            bool taken = false;
            for (uint32_t i = 0; i < cv->n_hold; i++)
                taken |= wl->holds[cv->hold[i]].worker == w;
            if (!taken) {
                hold_new(wl, hd->conv, w, hd->stored, false);
                return;
            }
        }
    }
    /* a new turn on the same worker (on every idle replica when all workers hold it) */
    uint32_t add = (uint32_t)(grow ? kvr_bench_rng_logu(&wl->rng, 1, 256)
                                   : 1 + kvr_bench_rng_below(&wl->rng, WL_CHUNK_MAX));
    if (hd->stored + add > WL_BODY_MAX) { /* at the cap: start a new conversation instead */
        conv_start(wl, pick_root(wl), add, false);
        return;
    }
    uint32_t n = wl->all_holders ? cv->n_hold : 1;
    uint32_t list[WL_MAX_REPLICAS] = {h};
    if (wl->all_holders)
        memcpy(list, cv->hold, n * sizeof *list);
    for (uint32_t i = 0; i < n; i++) {
        wl_hold_t *x = &wl->holds[list[i]];
        if (x->active_pos == WL_NONE || x->stored + add > WL_BODY_MAX)
            continue; /* being stored, or pinned */
        active_del(wl, list[i]);
        x->want = x->stored + add;
        queue_push(wl, list[i]);
    }
}

static void fill_event(kvr_wl_t *wl, kvr_event_t *ev, kvr_event_kind_t kind, uint32_t w)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->worker.worker_id = wl->worker_id[w];
    ev->worker.dp_rank = 0;
    ev->tier = KVR_TIER_DEVICE;
    ev->event_id = ++wl->event_id;
}

/* The next chunk of the job at the head of the queue. */
static size_t emit_chunk(kvr_wl_t *wl, kvr_event_t *ev)
{
    uint32_t h = wl->queue[wl->queue_head];
    wl_hold_t *hd = &wl->holds[h];
    wl_conv_t *cv = &wl->convs[hd->conv];
    const wl_root_t *rt = &wl->roots[cv->root];
    uint32_t w = hd->worker;
    uint32_t k = hd->want - hd->stored;
    uint32_t step = 1 + (uint32_t)kvr_bench_rng_below(&wl->rng, WL_CHUNK_MAX);
    if (k > step)
        k = step;
    conv_extend(wl, cv, hd->stored + k);

    fill_event(wl, ev, KVR_EV_STORED, w);
    size_t n = 0;
    if (hd->stored == 0) {
        uint8_t *held = &wl->root_held[wr_index(w, cv->root)];
        if (!*held) {
            for (uint32_t i = 0; i < rt->len; i++)
                wl->blocks[n++] = (kvr_block_t){ext_of(wl, w, rt->seq[i]), rt->lbh[i]};
            *held = 1;
        } else {
            ev->has_parent = true;
            ev->parent_ext = ext_of(wl, w, rt->seq[rt->len - 1]);
        }
    } else {
        ev->has_parent = true;
        ev->parent_ext = ext_of(wl, w, cv->seq[hd->stored - 1]);
    }
    for (uint32_t i = hd->stored; i < hd->stored + k; i++)
        wl->blocks[n++] = (kvr_block_t){ext_of(wl, w, cv->seq[i]), cv->lbh[i]};
    hd->stored += k;
    ev->blocks = wl->blocks;
    ev->n_blocks = n;
    wl->pairs += n;
    if (hd->stored == hd->want) {
        queue_pop(wl);
        if (!hd->pinned)
            active_add(wl, h);
    }
    return n;
}

/* Trims 1-64 leaf blocks of a random idle holding; its root too when it was the last user. */
static size_t emit_removal(kvr_wl_t *wl, kvr_event_t *ev)
{
    uint32_t h = wl->active[kvr_bench_rng_below(&wl->rng, wl->n_active)];
    wl_hold_t *hd = &wl->holds[h];
    wl_conv_t *cv = &wl->convs[hd->conv];
    uint32_t w = hd->worker;
    uint32_t k = 1 + (uint32_t)kvr_bench_rng_below(&wl->rng, WL_CHUNK_MAX);
    if (k > hd->stored)
        k = hd->stored;
    fill_event(wl, ev, KVR_EV_REMOVED, w);
    size_t n = 0;
    for (uint32_t i = 0; i < k; i++)
        wl->removed[n++] = ext_of(wl, w, cv->seq[hd->stored - 1 - i]);
    hd->stored -= k;
    if (hd->stored == 0) {
        size_t wr = wr_index(w, cv->root);
        active_del(wl, h);
        for (uint32_t i = 0; i < cv->n_hold; i++) {
            if (cv->hold[i] == h) {
                cv->hold[i] = cv->hold[--cv->n_hold];
                break;
            }
        }
        if (--wl->refs[wr] == 0 && wl->root_held[wr]) {
            const wl_root_t *rt = &wl->roots[cv->root];
            for (uint32_t i = rt->len; i-- > 0;)
                wl->removed[n++] = ext_of(wl, w, rt->seq[i]);
            wl->root_held[wr] = 0;
        }
        WL_RESERVE(wl->free_holds, wl->n_free_holds, wl->cap_free_holds);
        wl->free_holds[wl->n_free_holds++] = h;
        if (cv->n_hold == 0)
            conv_release(wl, hd->conv);
    }
    ev->removed = wl->removed;
    ev->n_removed = n;
    wl->pairs -= n;
    return n;
}

size_t kvr_wl_next(kvr_wl_t *wl, bool grow, kvr_event_t *ev)
{
    if (!grow && wl->n_active > 0 &&
        wl->pairs + WL_ROOT_MAX + WL_CHUNK_MAX > wl->cfg.target_pairs)
        return emit_removal(wl, ev);
    if (wl->queue_len == 0)
        start_job(wl, grow);
    return emit_chunk(wl, ev);
}

int kvr_wl_fill(kvr_wl_t *wl, kvr_index_t *ix, uint64_t target)
{
    kvr_event_t ev;
    while (wl->pairs < target || wl->queue_len > 0) {
        kvr_wl_next(wl, true, &ev);
        int st = kvr_index_apply(ix, &ev);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

size_t kvr_wl_n_pinned(const kvr_wl_t *wl)
{
    return wl->n_pinned;
}

uint32_t kvr_wl_pinned_len(const kvr_wl_t *wl, size_t i)
{
    const wl_conv_t *cv = &wl->convs[wl->pinned[i]];
    return wl->roots[cv->root].len + cv->len;
}

void kvr_wl_pinned_lbh(const kvr_wl_t *wl, size_t i, size_t n, uint64_t *out)
{
    const wl_conv_t *cv = &wl->convs[wl->pinned[i]];
    const wl_root_t *rt = &wl->roots[cv->root];
    for (size_t j = 0; j < n; j++)
        out[j] = j < rt->len ? rt->lbh[j] : cv->lbh[j - rt->len];
}

uint64_t kvr_bench_check_stats(const char *what, const kvr_index_t *ix)
{
    kvr_index_stats_t s;
    kvr_index_stats(ix, &s);
    uint64_t rejected = s.err_parent_not_found + s.err_invalid_sequence + s.err_capacity;
    if (rejected || s.err_block_not_found || s.warn_duplicate_store || s.warn_ext_rebound ||
        s.evicted_pairs)
        fprintf(stderr,
                "kvrouter bench: %s: index counters: parent_not_found %llu, "
                "invalid_sequence %llu, capacity %llu, block_not_found %llu, "
                "duplicate_store %llu, ext_rebound %llu, evicted_pairs %llu\n",
                what, (unsigned long long)s.err_parent_not_found,
                (unsigned long long)s.err_invalid_sequence,
                (unsigned long long)s.err_capacity, (unsigned long long)s.err_block_not_found,
                (unsigned long long)s.warn_duplicate_store,
                (unsigned long long)s.warn_ext_rebound, (unsigned long long)s.evicted_pairs);
    return rejected;
}

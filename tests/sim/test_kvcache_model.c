/*
 * test_kvcache_model.c: model-based randomized test of the paged KV cache.
 *
 * A naive model, written from the contract in kvcache.h and nothing else (the free queue is a
 * plain array used like a Python list: insert(0), append, remove(value), pop(0); the prefix
 * table is an unsorted array of (hash, block) pairs searched linearly), and the real cache
 * receive the same random workload: requests built from a few shared prefixes (so hits and
 * concurrent identical prefills, hence dedups, happen), admitted with the hits match() finds,
 * grown by decode tokens, committed as blocks fill, released (finished or preempted), resets,
 * bad arguments. The caches are small (8..64 blocks) so eviction and EBUSY are frequent. Some
 * seeds squeeze hashes into 0..23, so hash 0, colliding prefixes and hashes repeated inside a
 * sequence (rejected) occur; some run without prefix caching.
 *
 * After every operation: return codes, match(), blocks_needed(), the stats, every sequence's
 * block table, the set of cached hashes and the exact event stream (kind, hashes, parent,
 * tokens) are compared with the model, kvr_kvcache_verify runs, and the events replayed into a
 * plain set (STORED adds, REMOVED removes, CLEARED empties) must equal cached_hashes().
 * On failure the seed and step are printed; KVR_TEST_SEED=<seed> reruns one seed (tests/common/model_driver.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model_driver.h"

#include "kvrouter.h"

#include "sim/kvcache.h"

#define MAX_NB 64       /* blocks in a cache */
#define MAX_SB 12       /* blocks in a request */
#define MAX_BS 16
#define MAX_TOK (MAX_SB * MAX_BS)
#define N_SLOTS 8
#define N_PREFIX 4
#define MAX_EVENTS 64

/* ---- events (both sides record the same shape) ---- */

typedef struct ev {
    int kind;
    size_t n;
    uint64_t h[MAX_NB];
    int has_parent;
    uint64_t parent;
    uint32_t tok[MAX_TOK];
} ev_t;

typedef struct evlog {
    ev_t ev[MAX_EVENTS];
    size_t n;
    int overflow;
} evlog_t;

/* ---- the model ---- */

typedef struct mblk {
    uint32_t ref;
    int hashed;
    uint64_t hash;
} mblk_t;

typedef struct mseq {
    uint32_t b[MAX_SB];
    uint32_t n, n_full;
} mseq_t;

typedef struct mcache {
    uint32_t nb, bs;
    int pc;
    mblk_t blk[MAX_NB];
    uint32_t q[MAX_NB]; /* free queue, q[0] is the head */
    uint32_t qn;
    uint64_t dh[MAX_NB]; /* prefix table: dh[i] -> db[i] */
    uint32_t db[MAX_NB];
    uint32_t dn;
    uint64_t stored, removed, dedup, resets, cleared;
    evlog_t *out; /* expected events */
} mcache_t;

static void q_insert0(mcache_t *m, uint32_t b)
{
    memmove(&m->q[1], &m->q[0], m->qn * sizeof m->q[0]);
    m->q[0] = b;
    m->qn++;
}

static void q_append(mcache_t *m, uint32_t b) { m->q[m->qn++] = b; }

static void q_remove_value(mcache_t *m, uint32_t b)
{
    for (uint32_t i = 0; i < m->qn; i++)
        if (m->q[i] == b) {
            memmove(&m->q[i], &m->q[i + 1], (m->qn - i - 1) * sizeof m->q[0]);
            m->qn--;
            return;
        }
    abort(); /* the model itself is broken */
}

static uint32_t q_pop0(mcache_t *m)
{
    uint32_t b = m->q[0];
    q_remove_value(m, b);
    return b;
}

static int d_find(const mcache_t *m, uint64_t h)
{
    for (uint32_t i = 0; i < m->dn; i++)
        if (m->dh[i] == h)
            return (int)m->db[i];
    return -1;
}

static void d_add(mcache_t *m, uint64_t h, uint32_t b)
{
    m->dh[m->dn] = h;
    m->db[m->dn] = b;
    m->dn++;
}

static void d_del(mcache_t *m, uint64_t h)
{
    for (uint32_t i = 0; i < m->dn; i++)
        if (m->dh[i] == h) {
            m->dh[i] = m->dh[m->dn - 1];
            m->db[i] = m->db[m->dn - 1];
            m->dn--;
            return;
        }
    abort();
}

static ev_t *m_event(mcache_t *m, int kind)
{
    evlog_t *lg = m->out;
    if (lg->n == MAX_EVENTS) {
        lg->overflow = 1;
        return NULL;
    }
    ev_t *e = &lg->ev[lg->n++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    return e;
}

static void m_stored(mcache_t *m, const uint64_t *h, const uint32_t *tok, size_t start,
                     size_t end)
{
    if (start == end)
        return;
    ev_t *e = m_event(m, KVR_KVC_STORED);
    if (e == NULL)
        return;
    e->n = end - start;
    for (size_t i = start; i < end; i++)
        e->h[i - start] = h[i];
    e->has_parent = start > 0;
    e->parent = start > 0 ? h[start - 1] : 0;
    memcpy(e->tok, &tok[start * m->bs], e->n * m->bs * sizeof *tok);
}

static size_t m_match(const mcache_t *m, const uint64_t *h, size_t n)
{
    size_t i = 0;
    while (i < n && d_find(m, h[i]) >= 0)
        i++;
    return i;
}

/* Returns the status; *need is what blocks_needed() must say (UINT64_MAX for EINVAL). */
static int m_plan(const mcache_t *m, const mseq_t *s, const uint64_t *h, size_t n_hit,
                  uint64_t n_tokens, uint64_t *need, uint64_t *fresh)
{
    *need = UINT64_MAX;
    if (n_hit > 0 && s->n > 0)
        return KVR_EINVAL;
    if ((uint64_t)n_hit * m->bs > n_tokens)
        return KVR_EINVAL;
    uint64_t queued_hits = 0;
    for (size_t i = 0; i < n_hit; i++) {
        int b = d_find(m, h[i]);
        if (b < 0)
            return KVR_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (h[j] == h[i])
                return KVR_EINVAL;
        if (m->blk[b].ref == 0)
            queued_hits++;
    }
    uint64_t want = (n_tokens + m->bs - 1) / m->bs;
    uint64_t held = s->n > 0 ? s->n : n_hit;
    *fresh = want > held ? want - held : 0;
    *need = *fresh + queued_hits;
    return *need > m->qn ? KVR_EBUSY : KVR_OK;
}

static int m_allocate(mcache_t *m, mseq_t *s, const uint64_t *h, size_t n_hit,
                      uint64_t n_tokens)
{
    uint64_t need, fresh = 0;
    int rc = m_plan(m, s, h, n_hit, n_tokens, &need, &fresh);
    if (rc != KVR_OK)
        return rc;
    for (size_t i = 0; i < n_hit; i++) {
        uint32_t b = (uint32_t)d_find(m, h[i]);
        if (m->blk[b].ref == 0)
            q_remove_value(m, b);
        m->blk[b].ref++;
        s->b[s->n++] = b;
    }
    if (n_hit > 0)
        s->n_full = (uint32_t)n_hit;
    uint64_t evicted[MAX_NB];
    size_t n_ev = 0;
    for (uint64_t k = 0; k < fresh; k++) {
        uint32_t b = q_pop0(m);
        if (m->blk[b].hashed) {
            d_del(m, m->blk[b].hash);
            m->blk[b].hashed = 0;
            evicted[n_ev++] = m->blk[b].hash;
        }
        m->blk[b].ref = 1;
        s->b[s->n++] = b;
    }
    if (n_ev > 0) {
        m->removed += n_ev;
        ev_t *e = m_event(m, KVR_KVC_REMOVED);
        if (e != NULL) {
            e->n = n_ev;
            memcpy(e->h, evicted, n_ev * sizeof *evicted);
        }
    }
    return KVR_OK;
}

static int m_commit(mcache_t *m, mseq_t *s, const uint64_t *h, const uint32_t *tok,
                    size_t n_full)
{
    if (n_full < s->n_full || n_full > s->n)
        return KVR_EINVAL;
    if (n_full == s->n_full)
        return KVR_OK;
    if (!m->pc) {
        s->n_full = (uint32_t)n_full;
        return KVR_OK;
    }
    for (size_t i = s->n_full; i < n_full; i++)
        for (size_t j = 0; j < i; j++)
            if (h[j] == h[i])
                return KVR_EINVAL;
    size_t run = s->n_full;
    for (size_t i = s->n_full; i < n_full; i++) {
        int found = d_find(m, h[i]);
        if (found >= 0) {
            m_stored(m, h, tok, run, i);
            run = i + 1;
            uint32_t b = (uint32_t)found, own = s->b[i];
            if (m->blk[b].ref == 0)
                q_remove_value(m, b);
            m->blk[b].ref++;
            if (m->blk[own].ref != 1 || m->blk[own].hashed)
                abort();
            m->blk[own].ref = 0;
            q_insert0(m, own);
            s->b[i] = b;
            m->dedup++;
        } else {
            d_add(m, h[i], s->b[i]);
            m->blk[s->b[i]].hashed = 1;
            m->blk[s->b[i]].hash = h[i];
            m->stored++;
        }
    }
    m_stored(m, h, tok, run, n_full);
    s->n_full = (uint32_t)n_full;
    return KVR_OK;
}

static void m_release(mcache_t *m, mseq_t *s)
{
    for (uint32_t i = s->n; i-- > 0;) {
        mblk_t *x = &m->blk[s->b[i]];
        if (--x->ref == 0) {
            if (x->hashed)
                q_append(m, s->b[i]);
            else
                q_insert0(m, s->b[i]);
        }
    }
    s->n = s->n_full = 0;
}

static int m_reset(mcache_t *m)
{
    for (uint32_t b = 0; b < m->nb; b++)
        if (m->blk[b].ref > 0)
            return KVR_EBUSY;
    for (uint32_t b = 0; b < m->nb; b++)
        m->blk[b].hashed = 0;
    m->cleared += m->dn;
    m->dn = 0;
    m->resets++;
    if (m->pc)
        m_event(m, KVR_KVC_CLEARED);
    return KVR_OK;
}

/* ---- the harness ---- */

typedef struct slot {
    int live;
    uint32_t tok[MAX_TOK];
    uint64_t h[MAX_SB];
    uint32_t len;      /* tokens the request will ever have */
    uint64_t n_tokens; /* tokens allocated */
    mseq_t ms;
    kvr_kvcache_seq_t rs;
} slot_t;

typedef struct run {
    mcache_t m;
    kvr_kvcache_t *kc;
    evlog_t got, want;
    slot_t slot[N_SLOTS];
    uint32_t prefix[N_PREFIX][MAX_TOK];
    uint64_t replay[MAX_NB * 2];
    size_t n_replay;
    int tiny_hashes;
    uint64_t rng;
    unsigned long seed, step;
    char why[512];
    int failed;
} run_t;

static struct {
    unsigned long hits, shared_hits, evicted, dedup, ebusy, ebusy_grow, resets, reset_busy,
        einval, repeat_rejected, zero_hash, stored_with_parent, split_runs, preempted;
} cov;

#define CHECK(r, cond, ...)                                                                 \
    do {                                                                                    \
        if (!(cond) && !(r)->failed) {                                                      \
            (r)->failed = 1;                                                                \
            snprintf((r)->why, sizeof (r)->why, __VA_ARGS__);                               \
        }                                                                                   \
    } while (0)

static uint64_t rnd(run_t *r)
{
    uint64_t z = (r->rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static unsigned below(run_t *r, unsigned n) { return (unsigned)(rnd(r) % n); }

static void sink(void *ctx, const kvr_kvcache_event_t *e)
{
    run_t *r = ctx;
    evlog_t *lg = &r->got;
    if (lg->n == MAX_EVENTS || e->n_hashes > MAX_NB ||
        (e->kind == KVR_KVC_STORED && e->n_hashes > MAX_SB)) {
        lg->overflow = 1;
        return;
    }
    ev_t *x = &lg->ev[lg->n++];
    memset(x, 0, sizeof *x);
    x->kind = (int)e->kind;
    x->n = e->n_hashes;
    if (e->n_hashes > 0)
        memcpy(x->h, e->hashes, e->n_hashes * sizeof *x->h);
    if (e->kind == KVR_KVC_STORED) {
        x->has_parent = e->has_parent;
        x->parent = e->has_parent ? e->parent : 0;
        memcpy(x->tok, e->tokens, e->n_hashes * r->m.bs * sizeof *x->tok);
    }
}

/* The request's chained block hashes (squeezed into 0..23 on tiny seeds). */
static void hash_blocks(run_t *r, slot_t *s)
{
    uint64_t prev = UINT64_C(0x1337);
    for (uint32_t i = 0; i < s->len / r->m.bs; i++) {
        uint64_t x = prev;
        for (uint32_t t = 0; t < r->m.bs; t++)
            x = (x ^ s->tok[i * r->m.bs + t]) * UINT64_C(0x100000001B3) + 0x9E37;
        x ^= x >> 29;
        prev = x;
        s->h[i] = r->tiny_hashes ? x % 24 : x;
    }
}

/* A request: a cut of a shared prefix, then a few tokens of its own from a small alphabet. */
static void make_request(run_t *r, slot_t *s)
{
    uint32_t bs = r->m.bs;
    s->len = 1 + below(r, MAX_SB * bs);
    uint32_t cut = below(r, 5) == 0 ? 0 : below(r, s->len + 1);
    const uint32_t *p = r->prefix[below(r, N_PREFIX)];
    for (uint32_t i = 0; i < s->len; i++)
        s->tok[i] = i < cut ? p[i] : 1000 + below(r, 3);
    hash_blocks(r, s);
}

static const kvr_kvcache_seq_t *const *seq_list(run_t *r, const kvr_kvcache_seq_t **buf)
{
    for (int i = 0; i < N_SLOTS; i++)
        buf[i] = &r->slot[i].rs;
    return buf;
}

/* Real and model allocate, with blocks_needed() checked against both. */
static int do_allocate(run_t *r, slot_t *s, size_t n_hit, uint64_t n_tokens)
{
    uint64_t need_m, fresh;
    int plan = m_plan(&r->m, &s->ms, s->h, n_hit, n_tokens, &need_m, &fresh);
    uint64_t need_r = kvr_kvcache_blocks_needed(r->kc, &s->rs, s->h, n_hit, n_tokens);
    CHECK(r, need_r == need_m, "blocks_needed %llu, model %llu", (unsigned long long)need_r,
          (unsigned long long)need_m);
    int want = m_allocate(&r->m, &s->ms, s->h, n_hit, n_tokens);
    int got = kvr_kvcache_allocate(r->kc, &s->rs, s->h, n_hit, n_tokens);
    CHECK(r, got == want && want == plan, "allocate(n_hit %zu, n_tokens %llu): %d, model %d",
          n_hit, (unsigned long long)n_tokens, got, want);
    if (got == KVR_EBUSY)
        CHECK(r, need_r > kvr_kvcache_n_free(r->kc), "EBUSY though blocks_needed fits");
    if (want == KVR_EINVAL)
        cov.einval++;
    return got;
}

static void op_start(run_t *r)
{
    slot_t *s = &r->slot[below(r, N_SLOTS)];
    if (s->live)
        return;
    make_request(r, s);
    uint32_t prompt = 1 + below(r, s->len);
    size_t full = prompt / r->m.bs;
    size_t mm = m_match(&r->m, s->h, full), mr = kvr_kvcache_match(r->kc, s->h, full);
    CHECK(r, mr == mm, "match %zu, model %zu", mr, mm);
    size_t n_hit = mm;
    unsigned pick = below(r, 100);
    if (pick < 15)
        n_hit = below(r, (unsigned)mm + 1); /* hit less than there is: prefill it again */
    else if (pick < 25 && n_hit > 0 && n_hit * r->m.bs == prompt)
        n_hit--; /* as vLLM, leave the last token to compute */
    else if (pick < 28 && mm < full)
        n_hit = mm + 1; /* a hash that is not cached: EINVAL */
    int rc = do_allocate(r, s, n_hit, prompt);
    if (rc == KVR_OK) {
        s->live = 1;
        s->n_tokens = prompt;
        if (n_hit > 0) {
            cov.hits++;
            for (size_t i = 0; i < n_hit; i++)
                if (r->m.blk[s->ms.b[i]].ref > 1)
                    cov.shared_hits++;
        }
    } else if (rc == KVR_EBUSY) {
        cov.ebusy++;
    }
}

static slot_t *pick_live(run_t *r)
{
    unsigned start = below(r, N_SLOTS);
    for (unsigned k = 0; k < N_SLOTS; k++) {
        slot_t *s = &r->slot[(start + k) % N_SLOTS];
        if (s->live)
            return s;
    }
    return NULL;
}

static void release(run_t *r, slot_t *s)
{
    m_release(&r->m, &s->ms);
    kvr_kvcache_release(r->kc, &s->rs);
    s->live = 0;
}

static void op_grow(run_t *r)
{
    slot_t *s = pick_live(r);
    if (s == NULL || s->n_tokens >= s->len)
        return;
    uint64_t n = s->n_tokens + 1 + below(r, 2 * r->m.bs);
    if (n > s->len)
        n = s->len;
    int rc = do_allocate(r, s, 0, n);
    if (rc == KVR_OK) {
        s->n_tokens = n;
    } else if (rc == KVR_EBUSY) {
        cov.ebusy_grow++;
        if (below(r, 2) == 0) { /* preempted */
            release(r, s);
            cov.preempted++;
        }
    }
}

static void op_commit(run_t *r)
{
    slot_t *s = pick_live(r);
    if (s == NULL)
        return;
    uint32_t full = (uint32_t)(s->n_tokens / r->m.bs);
    uint32_t from = s->ms.n_full;
    size_t n_full = full;
    unsigned pick = below(r, 100);
    if (pick < 25 && full > from)
        n_full = from + below(r, full - from + 1);
    else if (pick < 28)
        n_full = s->ms.n + 1; /* beyond held */
    else if (pick < 30 && from > 0)
        n_full = from - 1;
    size_t dedup0 = (size_t)r->m.dedup, got_ev0 = r->got.n;
    int want = m_commit(&r->m, &s->ms, s->h, s->tok, n_full);
    int got = kvr_kvcache_commit(r->kc, &s->rs, s->h, s->tok, n_full);
    CHECK(r, got == want, "commit(%zu of %u, n_full %u): %d, model %d", n_full, s->ms.n, from,
          got, want);
    if (want == KVR_EINVAL) {
        cov.einval++;
        if (n_full >= from && n_full <= s->ms.n)
            cov.repeat_rejected++;
    }
    if (r->m.dedup > dedup0 && r->got.n > got_ev0 + 1)
        cov.split_runs++;
}

static void op_release(run_t *r)
{
    slot_t *s = pick_live(r);
    if (s != NULL)
        release(r, s);
}

static void op_reset(run_t *r)
{
    int want = m_reset(&r->m);
    int got = kvr_kvcache_reset(r->kc);
    CHECK(r, got == want, "reset: %d, model %d", got, want);
    if (want == KVR_OK)
        cov.resets++;
    else
        cov.reset_busy++;
}

static void op_bad_allocate(run_t *r)
{
    slot_t *s = pick_live(r);
    if (s == NULL || s->len < r->m.bs)
        return;
    /* hits while holding blocks, or more full hit blocks than the tokens cover */
    if (below(r, 2) == 0)
        do_allocate(r, s, 1, s->n_tokens);
    else {
        slot_t *e = NULL;
        for (int i = 0; i < N_SLOTS && e == NULL; i++)
            if (!r->slot[i].live)
                e = &r->slot[i];
        if (e == NULL)
            return;
        make_request(r, e);
        if (e->len < r->m.bs)
            return;
        size_t mm = m_match(&r->m, e->h, e->len / r->m.bs);
        if (mm > 0 && do_allocate(r, e, mm, mm * r->m.bs - 1) == KVR_OK)
            e->live = 1; /* cannot happen: checked by do_allocate against the model */
        if (e->live)
            release(r, e);
    }
}

static void op_match(run_t *r)
{
    slot_t tmp;
    make_request(r, &tmp);
    size_t n = tmp.len / r->m.bs;
    size_t mm = m_match(&r->m, tmp.h, n), mr = kvr_kvcache_match(r->kc, tmp.h, n);
    CHECK(r, mr == mm, "match %zu, model %zu", mr, mm);
}

/* ---- comparisons ---- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void check_events(run_t *r)
{
    CHECK(r, !r->got.overflow && !r->want.overflow, "event log overflow");
    CHECK(r, r->got.n == r->want.n, "%zu events, model %zu", r->got.n, r->want.n);
    for (size_t i = 0; i < r->got.n && !r->failed; i++) {
        const ev_t *g = &r->got.ev[i], *w = &r->want.ev[i];
        CHECK(r, g->kind == w->kind && g->n == w->n, "event %zu: kind %d n %zu, model %d n %zu",
              i, g->kind, g->n, w->kind, w->n);
        CHECK(r, memcmp(g->h, w->h, g->n * sizeof g->h[0]) == 0, "event %zu: hashes differ", i);
        if (g->kind != KVR_KVC_STORED)
            continue;
        CHECK(r, g->has_parent == w->has_parent && g->parent == w->parent,
              "event %zu: parent (%d, %llu), model (%d, %llu)", i, g->has_parent,
              (unsigned long long)g->parent, w->has_parent, (unsigned long long)w->parent);
        CHECK(r, memcmp(g->tok, w->tok, g->n * r->m.bs * sizeof g->tok[0]) == 0,
              "event %zu: tokens differ", i);
        cov.stored_with_parent += g->has_parent;
        for (size_t k = 0; k < g->n; k++)
            cov.zero_hash += g->h[k] == 0;
    }
}

/* Events replayed into a plain set, against the table's hashes. */
static void replay_events(run_t *r)
{
    for (size_t i = 0; i < r->got.n && !r->failed; i++) {
        const ev_t *e = &r->got.ev[i];
        if (e->kind == KVR_KVC_CLEARED) {
            r->n_replay = 0;
            continue;
        }
        for (size_t k = 0; k < e->n; k++) {
            size_t j = 0;
            while (j < r->n_replay && r->replay[j] != e->h[k])
                j++;
            if (e->kind == KVR_KVC_STORED) {
                CHECK(r, j == r->n_replay, "STORED %llu already present",
                      (unsigned long long)e->h[k]);
                if (j == r->n_replay && r->n_replay < MAX_NB * 2)
                    r->replay[r->n_replay++] = e->h[k];
            } else {
                CHECK(r, j < r->n_replay, "REMOVED %llu not present",
                      (unsigned long long)e->h[k]);
                if (j < r->n_replay)
                    r->replay[j] = r->replay[--r->n_replay];
            }
        }
    }
    uint64_t got[MAX_NB + 1], rep[MAX_NB * 2], want[MAX_NB];
    size_t n = kvr_kvcache_cached_hashes(r->kc, got, MAX_NB + 1);
    CHECK(r, n == r->n_replay && n == r->m.dn, "cached %zu hashes, replay %zu, model %u", n,
          r->n_replay, r->m.dn);
    if (r->failed)
        return;
    memcpy(rep, r->replay, n * sizeof *rep);
    memcpy(want, r->m.dh, n * sizeof *want);
    qsort(got, n, sizeof *got, cmp_u64);
    qsort(rep, n, sizeof *rep, cmp_u64);
    qsort(want, n, sizeof *want, cmp_u64);
    CHECK(r, memcmp(got, rep, n * sizeof *got) == 0, "replayed events != cached hashes");
    CHECK(r, memcmp(got, want, n * sizeof *got) == 0, "cached hashes != model");
}

static void check_state(run_t *r)
{
    const mcache_t *m = &r->m;
    kvr_kvcache_stats_t s;
    kvr_kvcache_get_stats(r->kc, &s);
    uint32_t active = 0;
    for (uint32_t b = 0; b < m->nb; b++)
        active += m->blk[b].ref > 0;
    CHECK(r, s.num_blocks == m->nb && s.n_active == active && s.n_cached == m->dn &&
                 s.n_free_queue == m->qn,
          "gauges: active %u cached %u queue %u, model %u %u %u", s.n_active, s.n_cached,
          s.n_free_queue, active, m->dn, m->qn);
    CHECK(r, s.stored_blocks == m->stored && s.removed_blocks == m->removed &&
                 s.dedup_blocks == m->dedup && s.resets == m->resets &&
                 s.cleared_blocks == m->cleared,
          "counters: stored %llu removed %llu dedup %llu resets %llu cleared %llu",
          (unsigned long long)s.stored_blocks, (unsigned long long)s.removed_blocks,
          (unsigned long long)s.dedup_blocks, (unsigned long long)s.resets,
          (unsigned long long)s.cleared_blocks);
    CHECK(r, kvr_kvcache_n_free(r->kc) == m->qn, "n_free");
    CHECK(r, kvr_kvcache_usage(r->kc) == (double)active / (double)m->nb, "usage");
    for (int i = 0; i < N_SLOTS && !r->failed; i++) {
        const slot_t *sl = &r->slot[i];
        CHECK(r, sl->rs.n_blocks == sl->ms.n && sl->rs.n_full == sl->ms.n_full,
              "slot %d: %u blocks (%u full), model %u (%u)", i, sl->rs.n_blocks, sl->rs.n_full,
              sl->ms.n, sl->ms.n_full);
        for (uint32_t k = 0; k < sl->ms.n && !r->failed; k++)
            CHECK(r, sl->rs.blocks[k] == sl->ms.b[k], "slot %d position %u: block %u, model %u",
                  i, k, sl->rs.blocks[k], sl->ms.b[k]);
    }
    const kvr_kvcache_seq_t *buf[N_SLOTS];
    char msg[256] = "";
    if (!r->failed && kvr_kvcache_verify_msg(r->kc, seq_list(r, buf), N_SLOTS, msg,
                                             sizeof msg) != KVR_OK)
        CHECK(r, 0, "verify: %s", msg);
    check_events(r);
    replay_events(r);
    r->got.n = r->want.n = 0;
}

static int run_seed(unsigned long seed, int steps)
{
    run_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->seed = seed;
    r->rng = seed * 7919 + 3;
    static const uint32_t sizes[] = {1, 2, 3, 4, 16};
    kvr_kvcache_config_t cfg = {
        .num_blocks = 8 + below(r, MAX_NB - 8 + 1),
        .block_size = sizes[below(r, 5)],
        .prefix_caching = below(r, 10) != 0,
    };
    r->tiny_hashes = below(r, 5) == 0;
    r->m.nb = cfg.num_blocks;
    r->m.bs = cfg.block_size;
    r->m.pc = cfg.prefix_caching;
    r->m.out = &r->want;
    for (uint32_t b = 0; b < cfg.num_blocks; b++)
        q_append(&r->m, b);
    for (int p = 0; p < N_PREFIX; p++)
        for (int t = 0; t < MAX_TOK; t++)
            r->prefix[p][t] = (uint32_t)(p * 10000 + t);
    int st;
    r->kc = kvr_kvcache_new(&cfg, sink, r, &st);
    assert_non_null(r->kc);
    for (int i = 0; i < N_SLOTS; i++)
        kvr_kvcache_seq_init(&r->slot[i].rs);
    for (r->step = 0; r->step < (unsigned long)steps && !r->failed; r->step++) {
        unsigned op = below(r, 100);
        if (op < 25)
            op_start(r);
        else if (op < 50)
            op_grow(r);
        else if (op < 75)
            op_commit(r);
        else if (op < 88)
            op_release(r);
        else if (op < 90)
            op_reset(r);
        else if (op < 93)
            op_bad_allocate(r);
        else
            op_match(r);
        check_state(r);
    }
    kvr_kvcache_stats_t fin;
    kvr_kvcache_get_stats(r->kc, &fin);
    cov.evicted += fin.removed_blocks;
    cov.dedup += fin.dedup_blocks;
    int failed = r->failed;
    if (failed)
        fprintf(stderr, "kvcache model FAILED: seed %lu step %lu (blocks %u, bs %u, pc %d, "
                        "tiny %d): %s\n",
                seed, r->step - 1, cfg.num_blocks, cfg.block_size, (int)cfg.prefix_caching,
                r->tiny_hashes, r->why);
    for (int i = 0; i < N_SLOTS; i++) {
        kvr_kvcache_release(r->kc, &r->slot[i].rs);
        kvr_kvcache_seq_deinit(&r->slot[i].rs);
    }
    if (!failed)
        assert_int_equal(kvr_kvcache_verify(r->kc, NULL, 0), KVR_OK);
    kvr_kvcache_free(r->kc);
    free(r);
    return failed;
}

static void test_model_random(void **state)
{
    (void)state;
    static const kvr_model_plan_t plan = {.seeds = 200, .seeds_asan = 40, .steps = 3000,
                                          .steps_one = 20000, .max_failures = 3};
    assert_int_equal(kvr_model_drive(&plan, run_seed), 0);
    if (kvr_test_seed(&(unsigned long){0}))
        return; /* one seed: the coverage bounds are for the whole sweep */
    printf("coverage: hits %lu shared_hits %lu evicted %lu dedup %lu ebusy %lu ebusy_grow %lu "
           "preempted %lu resets %lu reset_busy %lu einval %lu repeat_rejected %lu zero_hash "
           "%lu stored_with_parent %lu split_runs %lu\n",
           cov.hits, cov.shared_hits, cov.evicted, cov.dedup, cov.ebusy, cov.ebusy_grow,
           cov.preempted, cov.resets, cov.reset_busy, cov.einval, cov.repeat_rejected,
           cov.zero_hash, cov.stored_with_parent, cov.split_runs);
    assert_true(cov.hits > 100);
    assert_true(cov.shared_hits > 100);
    assert_true(cov.evicted > 100);
    assert_true(cov.dedup > 100);
    assert_true(cov.ebusy > 100);
    assert_true(cov.ebusy_grow > 100);
    assert_true(cov.preempted > 10);
    assert_true(cov.resets > 10);
    assert_true(cov.reset_busy > 10);
    assert_true(cov.einval > 100);
    assert_true(cov.repeat_rejected > 0);
    assert_true(cov.zero_hash > 0);
    assert_true(cov.stored_with_parent > 100);
    assert_true(cov.split_runs > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_load_model.c: model-based randomized test of the load tracker.
 *
 * A naive model (one record per request id in plain arrays; every load recomputed from the
 * live requests on demand: holders of a block are counted by scanning them) and the real
 * tracker receive the same random operations: adds (prompts are paths in a small 3-ary tree,
 * hashed into chained sequence hashes, so prefixes are shared often; live ids reused for
 * duplicates; inconsistent lengths), first tokens, output blocks with and without decay (and
 * out-of-range decay), frees of live, freed and never-seen ids, explicit expiry, add-driven
 * expiry sweeps, clock steps backwards, worker removal, and projections over known and unknown
 * workers. Every return code, every worker's snapshot, the counters, the touched request's
 * info and every projection are compared after each step, and kvr_load_verify() runs after
 * each step. Configurations vary with the seed (tracking flags, kv reuse, small max_requests).
 * On failure the seed and step are printed; KVR_TEST_SEED=<seed> reruns one seed (tests/common/model_driver.h).
 *
 * The model uses the tracker's documented quantization: a weight is llround(f * 2^30) and
 * active_blocks rounds the sum of weights, halves up.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "common/model_driver.h"

#include "core/load.h"
#include "kvrouter.h"

#define BS 4
#define DEPTH 8
#define N_IDS 160
#define N_WORKERS 6
#define N_PROBE (N_WORKERS + 2)
#define MAX_OUT 40
#define MAX_ENT (N_IDS * DEPTH)
#define W_ONE (UINT32_C(1) << 30)

static const kvr_worker_t WORKERS[N_PROBE] = {
    {11, 0}, {11, 1}, {22, 0}, {33, 0}, {33, 1}, {44, 0}, /* never used by adds: */ {55, 0}, {11, 2},
};

typedef struct mreq {
    int live;
    int w;
    int n;                          /* prompt blocks booked */
    uint64_t seq[DEPTH];
    uint64_t started, prefill;
    int n_out;
    int n_priv;                     /* blocks only this request can hold (random hashes) */
    uint32_t priv[DEPTH + MAX_OUT]; /* their weights */
    int has_exp;
    uint32_t exp;
    bool reuse; /* admitted with assume_kv_reuse on (its own or the config's) */
} mreq_t;

typedef struct ment {
    uint64_t hash;
    uint32_t weight;
} ment_t;

typedef struct model {
    kvr_load_config_t cfg;
    kvr_load_t *lt;
    mreq_t r[N_IDS];
    ment_t ent[N_WORKERS][MAX_ENT]; /* shared prompt blocks (assume_kv_reuse) */
    int n_ent[N_WORKERS];
    char ids[N_IDS][KVR_LOAD_MAX_ID_BYTES];
    size_t id_len[N_IDS];
    kvr_load_stats_t st; /* the counters the tracker should report */
    uint64_t now, last_check;
    uint64_t rng;
    unsigned long seed, step;
    char why[512];
    int failed;
} model_t;

/* coverage of the run, so the test fails if it stops exercising a behaviour */
static struct {
    unsigned long duplicates, full, unknown, expired, swept, dropped, decays, overlaps,
        partial_overlaps, einval, erange, back_steps, nonzero_units;
} cov;

static uint64_t rnd(model_t *m)
{
    uint64_t z = (m->rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static unsigned below(model_t *m, unsigned n) { return (unsigned)(rnd(m) % n); }

#define CHECK(m, cond, ...)                                                                 \
    do {                                                                                    \
        if (!(cond) && !(m)->failed) {                                                      \
            (m)->failed = 1;                                                                \
            snprintf((m)->why, sizeof (m)->why, __VA_ARGS__);                               \
        }                                                                                   \
    } while (0)

/* ---- the model ---- */

static int holders(const model_t *m, int w, uint64_t h)
{
    int n = 0;
    for (int i = 0; i < N_IDS; i++) {
        const mreq_t *r = &m->r[i];
        if (!r->live || r->w != w || !r->reuse)
            continue;
        for (int k = 0; k < r->n; k++)
            n += r->seq[k] == h;
    }
    return n;
}

static ment_t *ent_find(model_t *m, int w, uint64_t h)
{
    for (int i = 0; i < m->n_ent[w]; i++)
        if (m->ent[w][i].hash == h)
            return &m->ent[w][i];
    return NULL;
}

static void ent_drop_unheld(model_t *m, int w)
{
    for (int i = 0; i < m->n_ent[w];) {
        if (holders(m, w, m->ent[w][i].hash) == 0)
            m->ent[w][i] = m->ent[w][--m->n_ent[w]];
        else
            i++;
    }
}

static void m_release(model_t *m, int id)
{
    m->r[id].live = 0;
    ent_drop_unheld(m, m->r[id].w);
}

static void m_expire(model_t *m)
{
    m->last_check = m->now;
    for (int i = 0; i < N_IDS; i++) {
        mreq_t *r = &m->r[i];
        if (r->live && m->now >= r->started && m->now - r->started >= m->cfg.expiry_ms) {
            m_release(m, i);
            m->st.expired++;
        }
    }
}

static uint64_t newest_start(const model_t *m)
{
    uint64_t t = 0;
    for (int i = 0; i < N_IDS; i++)
        if (m->r[i].live && m->r[i].started > t)
            t = m->r[i].started;
    return t;
}

static int n_live(const model_t *m)
{
    int n = 0;
    for (int i = 0; i < N_IDS; i++)
        n += m->r[i].live;
    return n;
}

typedef struct mload {
    uint64_t units, blocks, prefill;
    uint32_t requests;
} mload_t;

static mload_t m_load(const model_t *m, int w)
{
    mload_t l = {0, 0, 0, 0};
    if (w >= N_WORKERS)
        return l;
    for (int i = 0; i < m->n_ent[w]; i++)
        l.units += m->ent[w][i].weight;
    l.blocks = (uint64_t)m->n_ent[w];
    for (int i = 0; i < N_IDS; i++) {
        const mreq_t *r = &m->r[i];
        if (!r->live || r->w != w)
            continue;
        l.requests++;
        l.prefill += r->prefill;
        l.blocks += (uint64_t)r->n_priv;
        for (int k = 0; k < r->n_priv; k++)
            l.units += r->priv[k];
    }
    return l;
}

static uint64_t rounded(uint64_t units) { return (units + (W_ONE / 2)) >> 30; }

/* The naive overlap: walk q until the first hash no live request on w holds. */
/* A request's own setting (kvr_load_opt_t), or the configuration's. */
static bool m_opt(kvr_load_opt_t o, bool config)
{
    return o == KVR_LOAD_CONFIG ? config : o == KVR_LOAD_ON;
}

static kvr_load_opt_t random_opt(model_t *m)
{
    unsigned r = below(m, 4);
    return r < 2 ? KVR_LOAD_CONFIG : r == 2 ? KVR_LOAD_ON : KVR_LOAD_OFF;
}

static uint64_t m_overlap(const model_t *m, int w, const uint64_t *q, int n, bool reuse)
{
    if (w >= N_WORKERS || !reuse || !m->cfg.track_active_blocks)
        return 0;
    int k = 0;
    while (k < n && holders(m, w, q[k]) > 0)
        k++;
    return (uint64_t)k;
}

/* ---- operations ---- */

static int random_prompt(model_t *m, uint64_t *seq)
{
    uint64_t lbh[DEPTH];
    int n = (int)below(m, DEPTH + 1);
    for (int i = 0; i < n; i++) {
        unsigned r = below(m, 10);
        unsigned sym = r < 6 ? 0 : r < 8 ? 1 : 2;
        lbh[i] = UINT64_C(0xA5A5A5A5) * (sym + 1) + 7;
    }
    kvr_hash_chain(lbh, (size_t)n, seq);
    return n;
}

static int pick_id(model_t *m) { return (int)below(m, N_IDS); }

static void check_info(model_t *m, int id)
{
    kvr_load_request_info_t info;
    int rc = kvr_load_request_info(m->lt, m->ids[id], m->id_len[id], &info);
    const mreq_t *r = &m->r[id];
    CHECK(m, rc == (r->live ? KVR_OK : KVR_ENOTFOUND), "info id %d: rc %s, live %d", id,
          kvr_status_name(rc), r->live);
    if (rc != KVR_OK || !r->live)
        return;
    CHECK(m, info.worker.worker_id == WORKERS[r->w].worker_id &&
                 info.worker.dp_rank == WORKERS[r->w].dp_rank,
          "info id %d: worker", id);
    CHECK(m, info.started_ms == r->started, "info id %d: started %llu, model %llu", id,
          (unsigned long long)info.started_ms, (unsigned long long)r->started);
    CHECK(m, info.prefill_tokens == r->prefill, "info id %d: prefill %llu, model %llu", id,
          (unsigned long long)info.prefill_tokens, (unsigned long long)r->prefill);
    CHECK(m, info.n_prompt_blocks == (uint32_t)r->n && info.n_output_blocks == (uint32_t)r->n_out,
          "info id %d: blocks %u+%u, model %d+%d", id, info.n_prompt_blocks,
          info.n_output_blocks, r->n, r->n_out);
    CHECK(m, info.has_expected_output_tokens == (r->has_exp != 0) &&
                 info.expected_output_tokens == r->exp,
          "info id %d: expected output tokens", id);
}

static void op_add(model_t *m)
{
    int id = pick_id(m);
    int w = (int)below(m, N_WORKERS);
    uint64_t seq[DEPTH];
    int n = random_prompt(m, seq);
    uint64_t isl = (uint64_t)n * BS + below(m, 2 * BS);
    bool bad = n > 0 && below(m, 30) == 0;
    if (bad)
        isl = (uint64_t)n * BS - 1; /* more hashes than tokens */
    uint64_t cached = below(m, 3) == 0 ? 0 : below(m, (unsigned)isl + 10);
    kvr_load_request_t rq = {.id = m->ids[id],
                             .id_len = m->id_len[id],
                             .worker = WORKERS[w],
                             .seq = n > 0 || below(m, 2) ? seq : NULL,
                             .n_seq = (size_t)n,
                             .isl_tokens = isl,
                             .cached_tokens = cached,
                             .has_expected_output_tokens = below(m, 2) == 0,
                             .expected_output_tokens = below(m, 1000),
                             .assume_kv_reuse = random_opt(m),
                             .track_prefill_tokens = random_opt(m)};
    bool reuse = m_opt(rq.assume_kv_reuse, m->cfg.assume_kv_reuse);
    /* the model's answer, in the tracker's documented order */
    int expect = KVR_OK;
    if (m->cfg.track_active_blocks && (uint64_t)n > isl / BS) {
        expect = KVR_EINVAL;
        cov.einval++;
    } else {
        if (m->now >= m->last_check && m->now - m->last_check >= m->cfg.check_interval_ms) {
            unsigned long before = (unsigned long)m->st.expired;
            m_expire(m);
            cov.swept += (unsigned long)m->st.expired - before;
        }
        if (m->r[id].live) {
            expect = KVR_EEXIST;
            m->st.duplicates++;
            cov.duplicates++;
        } else if (n_live(m) >= (int)m->cfg.max_requests) {
            expect = KVR_EFULL;
            m->st.full++;
            cov.full++;
        }
    }
    if (expect == KVR_OK) {
        mreq_t *r = &m->r[id];
        uint64_t newest = newest_start(m);
        *r = (mreq_t){
            .live = 1, .w = w, .started = m->now > newest ? m->now : newest, .reuse = reuse};
        if (m->cfg.track_active_blocks) {
            if (reuse) {
                r->n = n;
                memcpy(r->seq, seq, sizeof seq);
                for (int k = 0; k < n; k++)
                    if (ent_find(m, w, seq[k]) == NULL)
                        m->ent[w][m->n_ent[w]++] = (ment_t){seq[k], W_ONE};
            } else {
                r->n = n; /* booked under random hashes: private, never in seq[] */
                for (int k = 0; k < n; k++)
                    r->priv[r->n_priv++] = W_ONE;
            }
        }
        if (m_opt(rq.track_prefill_tokens, m->cfg.track_prefill_tokens))
            r->prefill = isl - (cached < isl ? cached : isl);
        r->has_exp = rq.has_expected_output_tokens;
        r->exp = rq.has_expected_output_tokens ? rq.expected_output_tokens : 0;
        m->st.adds++;
    }
    int rc = kvr_load_add(m->lt, &rq, m->now);
    CHECK(m, rc == expect, "add id %d w%d n %d: rc %s, model %s", id, w, n,
          kvr_status_name(rc), kvr_status_name(expect));
    check_info(m, id);
}

static void op_first_token(model_t *m)
{
    int id = pick_id(m);
    int expect = m->r[id].live ? KVR_OK : KVR_ENOTFOUND;
    if (expect == KVR_OK) {
        m->r[id].prefill = 0;
        m->st.first_tokens++;
    } else {
        m->st.unknown_marks++;
        cov.unknown++;
    }
    int rc = kvr_load_first_token(m->lt, m->ids[id], m->id_len[id], m->now);
    CHECK(m, rc == expect, "first_token id %d: rc %s, model %s", id, kvr_status_name(rc),
          kvr_status_name(expect));
    check_info(m, id);
}

static double random_decay(model_t *m)
{
    unsigned r = below(m, 20);
    if (r < 8)
        return NAN;
    if (r == 8)
        return 0.0;
    if (r == 9)
        return 1.0;
    if (r == 10)
        return below(m, 2) ? 1.5 : -0.25;
    return (double)below(m, 1001) / 1000.0;
}

static void m_decay(model_t *m, mreq_t *r, uint32_t wq)
{
    for (int k = 0; k < r->n_priv; k++)
        r->priv[k] = wq;
    if (!r->reuse)
        return;
    for (int k = 0; k < r->n; k++)
        if (holders(m, r->w, r->seq[k]) == 1)
            ent_find(m, r->w, r->seq[k])->weight = wq;
}

static void op_output_block(model_t *m)
{
    int id = pick_id(m);
    mreq_t *r = &m->r[id];
    if (r->live && r->n_out >= MAX_OUT)
        return; /* the model's arrays are bounded */
    double f = random_decay(m);
    bool decay = !isnan(f);
    int expect = KVR_OK;
    if (decay && !(f >= 0 && f <= 1)) {
        expect = KVR_ERANGE;
        cov.erange++;
    } else if (!r->live) {
        expect = KVR_ENOTFOUND;
        m->st.unknown_marks++;
        cov.unknown++;
    } else if (m->cfg.track_output_blocks) {
        r->priv[r->n_priv++] = W_ONE;
        r->n_out++;
        if (decay) {
            m_decay(m, r, (uint32_t)llround(f * (double)W_ONE));
            cov.decays++;
        }
        m->st.output_blocks++;
    }
    int rc = kvr_load_output_block(m->lt, m->ids[id], m->id_len[id], f, m->now);
    CHECK(m, rc == expect, "output_block id %d f %g: rc %s, model %s", id, f,
          kvr_status_name(rc), kvr_status_name(expect));
    check_info(m, id);
}

static void op_free(model_t *m)
{
    int id = pick_id(m);
    int expect = m->r[id].live ? KVR_OK : KVR_ENOTFOUND;
    if (expect == KVR_OK) {
        m_release(m, id);
        m->st.frees++;
    } else {
        m->st.unknown_frees++;
        cov.unknown++;
    }
    int rc = kvr_load_free_request(m->lt, m->ids[id], m->id_len[id], m->now);
    CHECK(m, rc == expect, "free id %d: rc %s, model %s", id, kvr_status_name(rc),
          kvr_status_name(expect));
    check_info(m, id);
}

static void op_expire(model_t *m)
{
    unsigned long before = (unsigned long)m->st.expired;
    m_expire(m);
    size_t want = (size_t)(m->st.expired - before);
    size_t got = kvr_load_expire(m->lt, m->now);
    cov.expired += want;
    CHECK(m, got == want, "expire at %llu: %zu freed, model %zu", (unsigned long long)m->now, got,
          want);
    uint64_t next = UINT64_MAX;
    for (int i = 0; i < N_IDS; i++)
        if (m->r[i].live && m->r[i].started + m->cfg.expiry_ms < next)
            next = m->r[i].started + m->cfg.expiry_ms;
    CHECK(m, kvr_load_next_expiry(m->lt) == next, "next expiry %llu, model %llu",
          (unsigned long long)kvr_load_next_expiry(m->lt), (unsigned long long)next);
}

static void op_remove_worker(model_t *m)
{
    uint64_t wid = WORKERS[below(m, N_PROBE)].worker_id;
    size_t want = 0;
    uint64_t ranks = 0;
    for (int w = 0; w < N_WORKERS; w++) {
        if (WORKERS[w].worker_id != wid)
            continue;
        size_t here = 0;
        for (int i = 0; i < N_IDS; i++)
            if (m->r[i].live && m->r[i].w == w) {
                m_release(m, i);
                here++;
            }
        ranks += here > 0;
        want += here;
    }
    m->st.workers_removed += ranks;
    m->st.requests_dropped += want;
    cov.dropped += want;
    size_t got = 99;
    int rc = kvr_load_remove_worker(m->lt, wid, &got);
    int expect = ranks > 0 ? KVR_OK : KVR_ENOWORKER;
    CHECK(m, rc == expect && got == want, "remove worker %llu: rc %s dropped %zu, model %s %zu",
          (unsigned long long)wid, kvr_status_name(rc), got, kvr_status_name(expect), want);
}

static void op_project(model_t *m)
{
    uint64_t q[DEPTH];
    int n = random_prompt(m, q);
    uint64_t isl = (uint64_t)n * BS + below(m, BS);
    kvr_load_query_t query = {
        .seq = q, .n_seq = (size_t)n, .isl_tokens = isl, .assume_kv_reuse = random_opt(m)};
    bool reuse = m_opt(query.assume_kv_reuse, m->cfg.assume_kv_reuse);
    kvr_load_projection_t p[N_PROBE];
    for (int w = 0; w < N_PROBE; w++)
        p[w] = (kvr_load_projection_t){.worker = WORKERS[w],
                                       .cached_tokens = below(m, 3) ? below(m, (unsigned)isl + 5) : 0};
    int rc = kvr_load_project(m->lt, &query, p, N_PROBE);
    CHECK(m, rc == KVR_OK, "project rc %s", kvr_status_name(rc));
    uint64_t mq = m->cfg.track_active_blocks ? (uint64_t)n : 0;
    for (int w = 0; w < N_PROBE && !m->failed; w++) {
        mload_t l = m_load(m, w);
        uint64_t ov = m_overlap(m, w, q, n, reuse);
        uint64_t cached = p[w].cached_tokens < isl ? p[w].cached_tokens : isl;
        if (ov > 0)
            cov.overlaps++;
        if (ov > 0 && ov < (uint64_t)n)
            cov.partial_overlaps++;
        CHECK(m, p[w].overlap_blocks == ov, "project w%d: overlap %llu, model %llu", w,
              (unsigned long long)p[w].overlap_blocks, (unsigned long long)ov);
        CHECK(m, p[w].potential_decode_blocks == rounded(l.units) + mq - ov,
              "project w%d: decode blocks %llu, model %llu", w,
              (unsigned long long)p[w].potential_decode_blocks,
              (unsigned long long)(rounded(l.units) + mq - ov));
        CHECK(m, p[w].potential_prefill_tokens == l.prefill + isl - cached,
              "project w%d: prefill %llu, model %llu", w,
              (unsigned long long)p[w].potential_prefill_tokens,
              (unsigned long long)(l.prefill + isl - cached));
        CHECK(m, p[w].active_requests == l.requests && p[w].active_prefill_tokens == l.prefill &&
                     p[w].active_blocks == rounded(l.units),
              "project w%d: active fields", w);
        kvr_load_projection_t one = {.worker = p[w].worker, .cached_tokens = p[w].cached_tokens};
        rc = kvr_load_project_one(m->lt, &query, &one);
        CHECK(m, rc == KVR_OK && one.potential_decode_blocks == p[w].potential_decode_blocks &&
                     one.potential_prefill_tokens == p[w].potential_prefill_tokens &&
                     one.overlap_blocks == p[w].overlap_blocks,
              "project_one w%d disagrees with project", w);
    }
}

/* ---- comparison after every step ---- */

static void check_state(model_t *m)
{
    uint64_t unique = 0, prefill = 0, workers = 0;
    for (int w = 0; w < N_PROBE && !m->failed; w++) {
        mload_t l = m_load(m, w);
        kvr_load_snapshot_t s;
        kvr_load_snapshot(m->lt, WORKERS[w], &s);
        CHECK(m, s.active_blocks == rounded(l.units) && s.unique_blocks == l.blocks &&
                     s.active_prefill_tokens == l.prefill && s.active_requests == l.requests,
              "snapshot w%d: blocks %llu unique %llu prefill %llu requests %u; model %llu %llu "
              "%llu %u",
              w, (unsigned long long)s.active_blocks, (unsigned long long)s.unique_blocks,
              (unsigned long long)s.active_prefill_tokens, s.active_requests,
              (unsigned long long)rounded(l.units), (unsigned long long)l.blocks,
              (unsigned long long)l.prefill, l.requests);
        if (l.units % W_ONE != 0)
            cov.nonzero_units++;
        unique += l.blocks;
        prefill += l.prefill;
        workers += l.requests > 0;
    }
    kvr_load_stats_t st;
    kvr_load_stats(m->lt, &st);
    const kvr_load_stats_t *e = &m->st;
    CHECK(m, st.adds == e->adds && st.frees == e->frees && st.first_tokens == e->first_tokens &&
                 st.output_blocks == e->output_blocks && st.duplicates == e->duplicates &&
                 st.full == e->full && st.unknown_frees == e->unknown_frees &&
                 st.unknown_marks == e->unknown_marks && st.expired == e->expired &&
                 st.workers_removed == e->workers_removed &&
                 st.requests_dropped == e->requests_dropped,
          "counters: adds %llu/%llu frees %llu/%llu dup %llu/%llu full %llu/%llu unk %llu/%llu "
          "%llu/%llu expired %llu/%llu",
          (unsigned long long)st.adds, (unsigned long long)e->adds, (unsigned long long)st.frees,
          (unsigned long long)e->frees, (unsigned long long)st.duplicates,
          (unsigned long long)e->duplicates, (unsigned long long)st.full,
          (unsigned long long)e->full, (unsigned long long)st.unknown_frees,
          (unsigned long long)e->unknown_frees, (unsigned long long)st.unknown_marks,
          (unsigned long long)e->unknown_marks, (unsigned long long)st.expired,
          (unsigned long long)e->expired);
    CHECK(m, st.live_requests == (uint64_t)n_live(m) && st.unique_blocks == unique &&
                 st.active_prefill_tokens == prefill && st.workers == workers,
          "gauges: live %llu/%d unique %llu/%llu prefill %llu/%llu workers %llu/%llu",
          (unsigned long long)st.live_requests, n_live(m), (unsigned long long)st.unique_blocks,
          (unsigned long long)unique, (unsigned long long)st.active_prefill_tokens,
          (unsigned long long)prefill, (unsigned long long)st.workers,
          (unsigned long long)workers);
    char msg[256];
    if (!m->failed && kvr_load_verify(m->lt, msg, sizeof msg) != KVR_OK) {
        m->failed = 1;
        snprintf(m->why, sizeof m->why, "verify: %s", msg);
    }
}

static void advance_clock(model_t *m)
{
    unsigned r = below(m, 100);
    if (r < 2 && m->now > 500) {
        m->now -= below(m, 500); /* a clock that steps back */
        cov.back_steps++;
    } else if (r < 40) {
        m->now += below(m, 60);
    }
}

static void setup(model_t *m, unsigned long seed)
{
    m->seed = seed;
    m->rng = seed * 7919 + 1;
    kvr_load_config_init(&m->cfg);
    m->cfg.block_size = BS;
    m->cfg.track_active_blocks = seed % 5 != 0;
    m->cfg.track_output_blocks = m->cfg.track_active_blocks && seed % 3 != 0;
    m->cfg.assume_kv_reuse = seed % 4 != 1;
    m->cfg.track_prefill_tokens = seed % 6 != 2;
    m->cfg.expiry_ms = 1500 + below(m, 3000);
    m->cfg.check_interval_ms = below(m, 3) == 0 ? 0 : below(m, 800);
    m->cfg.max_requests = seed % 4 == 2 ? 8 + below(m, 30) : 1000;
    m->cfg.seed = seed;
    m->now = 1000;
    for (int i = 0; i < N_IDS; i++) {
        /* some ids are long, one is as long as allowed, one holds a NUL byte */
        int len = snprintf(m->ids[i], sizeof m->ids[i], "req-%d", i);
        if (i % 7 == 0) {
            memset(m->ids[i] + len, 'x', 200);
            len += 200;
        }
        if (i == 1)
            len = KVR_LOAD_MAX_ID_BYTES;
        if (i == 2)
            m->ids[i][1] = '\0';
        m->id_len[i] = (size_t)len;
    }
    int st;
    m->lt = kvr_load_new(&m->cfg, &st);
    assert_non_null(m->lt);
}

static int run_seed(unsigned long seed, int steps)
{
    model_t *m = calloc(1, sizeof *m);
    assert_non_null(m);
    setup(m, seed);
    for (m->step = 0; m->step < (unsigned long)steps && !m->failed; m->step++) {
        advance_clock(m);
        unsigned r = below(m, 100);
        if (r < 32)
            op_add(m);
        else if (r < 44)
            op_first_token(m);
        else if (r < 58)
            op_output_block(m);
        else if (r < 78)
            op_free(m);
        else if (r < 81)
            op_expire(m);
        else if (r < 82)
            op_remove_worker(m);
        else
            op_project(m);
        check_state(m);
    }
    /* drain: every worker must end at exactly zero */
    for (int i = 0; i < N_IDS && !m->failed; i++)
        if (m->r[i].live) {
            m_release(m, i);
            m->st.frees++;
            CHECK(m, kvr_load_free_request(m->lt, m->ids[i], m->id_len[i], m->now) == KVR_OK,
                  "drain: free id %d failed", i);
        }
    check_state(m);
    kvr_load_stats_t st;
    kvr_load_stats(m->lt, &st);
    CHECK(m, st.live_requests == 0 && st.unique_blocks == 0 && st.workers == 0 &&
                 st.active_prefill_tokens == 0,
          "drain left load behind");
    int failed = m->failed;
    if (failed)
        fprintf(stderr, "load model test FAILED: seed %lu step %lu: %s\n", seed, m->step - 1,
                m->why);
    kvr_load_free(m->lt);
    free(m);
    return failed;
}

static void test_model_random(void **state)
{
    (void)state;
    static const kvr_model_plan_t plan = {
        .seeds = 200, .seeds_asan = 30, .steps = 3000, .steps_one = 20000};
    assert_int_equal(kvr_model_drive(&plan, run_seed), 0);
    if (kvr_test_seed(&(unsigned long){0}))
        return; /* one seed: the coverage bounds are for the whole sweep */
    printf("coverage: duplicates %lu full %lu unknown %lu expired %lu swept %lu dropped %lu "
           "decays %lu overlaps %lu partial %lu einval %lu erange %lu back %lu fractional %lu\n",
           cov.duplicates, cov.full, cov.unknown, cov.expired, cov.swept, cov.dropped, cov.decays,
           cov.overlaps, cov.partial_overlaps, cov.einval, cov.erange, cov.back_steps,
           cov.nonzero_units);
    assert_true(cov.duplicates > 100);
    assert_true(cov.full > 100);
    assert_true(cov.unknown > 1000);
    assert_true(cov.expired > 100);
    assert_true(cov.swept > 100);
    assert_true(cov.dropped > 100);
    assert_true(cov.decays > 100);
    assert_true(cov.overlaps > 1000);
    assert_true(cov.partial_overlaps > 100);
    assert_true(cov.einval > 10);
    assert_true(cov.erange > 10);
    assert_true(cov.back_steps > 10);
    assert_true(cov.nonzero_units > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * trace_gen.c: the synthetic workloads (contract and shapes in trace_gen.h).
 *
 * Invariants: a prompt is a list of segments (content id, token count); a block's hash id is
 * the interned chained hash of every (content id, offset, count) piece from the prompt's start
 * to the block's end, so equal ids <=> equal prefixes (up to 64-bit hash collisions). Each
 * unit (a chat session, an agent task, a RAG question) is generated whole at its arrival time;
 * its later requests carry later timestamps and the builder sorts the rows at the end.
 * Memory: the builder's rows and ids, the intern table (one entry per distinct block), one
 * unit's segments at a time. Threads: the caller's.
 */
#include "sim/trace_gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "base/oatab.h"
#include "base/u64map.h"

#define BLOCK KVR_TRACE_BLOCK_TOKENS
#define GEN_S_PER_TOKEN 0.03 /* an answer's generation time, for the next request's arrival */
#define GEN_S_FIXED 0.3

/* ---- random draws ---- */

double kvr_draw_exp(kvr_rng_t *rng, double mean) { return -mean * log1p(-kvr_rng_uniform(rng)); }

double kvr_draw_normal(kvr_rng_t *rng)
{
    double u = kvr_rng_uniform(rng), v = kvr_rng_uniform(rng);
    return sqrt(-2.0 * log1p(-u)) * cos(6.283185307179586 * v);
}

double kvr_draw_lognormal(kvr_rng_t *rng, double median, double sigma)
{
    return median * exp(sigma * kvr_draw_normal(rng));
}

/* Gamma(shape k, scale 1) for k >= 1 (Marsaglia and Tsang); k < 1 by the boost
 * Gamma(k) = Gamma(k + 1) * U^(1/k). */
static double gamma_unit(kvr_rng_t *rng, double k)
{
    if (k < 1.0)
        return gamma_unit(rng, k + 1.0) * pow(1.0 - kvr_rng_uniform(rng), 1.0 / k);
    double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = kvr_draw_normal(rng), v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = 1.0 - kvr_rng_uniform(rng);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v;
    }
}

double kvr_draw_gamma(kvr_rng_t *rng, double mean, double cv)
{
    double k = 1.0 / (cv * cv);
    return gamma_unit(rng, k) * mean / k;
}

void kvr_zipf_cdf(double *cdf, size_t n, double s)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        cdf[i] = (sum += pow((double)(i + 1), -s));
    for (size_t i = 0; i < n; i++)
        cdf[i] /= sum;
}

size_t kvr_draw_zipf(kvr_rng_t *rng, const double *cdf, size_t n)
{
    double u = kvr_rng_uniform(rng);
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static uint32_t clamp_len(double x, uint32_t lo, uint32_t hi)
{
    return x < lo ? lo : x > hi ? hi : (uint32_t)x;
}

/* ---- the builder ---- */

void kvr_trace_builder_init(kvr_trace_builder_t *b) { memset(b, 0, sizeof *b); }

void kvr_trace_builder_deinit(kvr_trace_builder_t *b)
{
    free(b->rows);
    free(b->off);
    free(b->ids);
    memset(b, 0, sizeof *b);
}

void kvr_trace_builder_add(kvr_trace_builder_t *b, uint64_t t_ms, uint32_t input_length,
                           uint32_t output_length, const uint64_t *ids, uint32_t n_ids)
{
    if (b->oom)
        return;
    if (b->n_rows == b->cap_rows) {
        size_t cap = b->cap_rows ? b->cap_rows * 2 : 1024;
        kvr_trace_row_t *r = realloc(b->rows, cap * sizeof *r);
        if (r != NULL)
            b->rows = r;
        size_t *o = r ? realloc(b->off, cap * sizeof *o) : NULL;
        if (o == NULL) {
            b->oom = true;
            return;
        }
        b->off = o;
        b->cap_rows = cap;
    }
    if (kvr_grow((void **)&b->ids, &b->cap_ids, b->n_ids + n_ids, SIZE_MAX, sizeof *b->ids) !=
        KVR_OK) {
        b->oom = true;
        return;
    }
    b->rows[b->n_rows] = (kvr_trace_row_t){.timestamp_ms = t_ms,
                                           .input_length = input_length,
                                           .output_length = output_length,
                                           .n_hash_ids = n_ids};
    b->off[b->n_rows++] = b->n_ids;
    if (n_ids > 0)
        memcpy(b->ids + b->n_ids, ids, n_ids * sizeof *ids);
    b->n_ids += n_ids;
}

typedef struct order {
    uint64_t t;
    size_t i;
} order_t;

static int order_cmp(const void *a, const void *b)
{
    const order_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

int kvr_trace_builder_finish(kvr_trace_builder_t *b, size_t max_rows, kvr_trace_t *out)
{
    memset(out, 0, sizeof *out);
    if (b->oom)
        return KVR_ENOMEM;
    size_t n = b->n_rows;
    order_t *ord = n ? malloc(n * sizeof *ord) : NULL;
    if (n && ord == NULL)
        return KVR_ENOMEM;
    for (size_t i = 0; i < n; i++)
        ord[i] = (order_t){b->rows[i].timestamp_ms, i};
    if (n > 1)
        qsort(ord, n, sizeof *ord, order_cmp);
    size_t keep = max_rows && max_rows < n ? max_rows : n, n_ids = 0;
    for (size_t k = 0; k < keep; k++)
        n_ids += b->rows[ord[k].i].n_hash_ids;
    out->rows = keep ? malloc(keep * sizeof *out->rows) : NULL;
    out->ids = n_ids ? malloc(n_ids * sizeof *out->ids) : NULL;
    if ((keep && out->rows == NULL) || (n_ids && out->ids == NULL)) {
        free(ord);
        kvr_trace_free(out);
        return KVR_ENOMEM;
    }
    size_t at = 0;
    for (size_t k = 0; k < keep; k++) {
        const kvr_trace_row_t *r = &b->rows[ord[k].i];
        out->rows[k] = *r;
        out->rows[k].hash_ids = out->ids + at;
        if (r->n_hash_ids > 0)
            memcpy(out->ids + at, b->ids + b->off[ord[k].i], r->n_hash_ids * sizeof *out->ids);
        at += r->n_hash_ids;
    }
    out->n_rows = keep;
    out->n_ids = n_ids;
    free(ord);
    kvr_trace_builder_deinit(b);
    return KVR_OK;
}

/* ---- prompts: segments, and their blocks' interned ids ---- */

typedef struct seg {
    uint64_t content; /* identity of the run of tokens */
    uint32_t len;
} seg_t;

typedef struct gen {
    const kvr_tracegen_config_t *cfg;
    kvr_rng_t rng;
    kvr_trace_builder_t *b;
    kvr_u64map_t tab; /* chained prefix hash -> dense id */
    uint64_t next_content;
    uint64_t *ids;
    size_t cap_ids;
    double *sys_cdf, *doc_cdf;
    uint32_t *sys_len, *doc_len; /* per workload's shared contents */
    uint32_t n_sys, n_docs;
    bool oom;
    size_t rows; /* added by the unit being generated (the pilot counts them) */
    bool pilot;  /* counting: every request counts, whenever it comes */
} gen_t;

static uint64_t intern(gen_t *g, uint64_t h)
{
    bool created;
    uint64_t *v = kvr_u64map_get(&g->tab, h, &created);
    if (v == NULL) {
        g->oom = true;
        return 0;
    }
    if (created)
        *v = g->tab.n - 1;
    return *v;
}

static uint64_t fresh(gen_t *g) { return (UINT64_C(3) << 60) | g->next_content++; }

/* Emits one request whose prompt is segs[0..n) at t seconds. */
static void emit(gen_t *g, double t, const seg_t *segs, size_t n, uint32_t output_length)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += segs[i].len;
    if (total == 0 || total > KVR_TRACE_MAX_INPUT || t < 0 ||
        (!g->pilot && t >= g->cfg->duration_s))
        return;
    size_t n_blocks = (size_t)((total + BLOCK - 1) / BLOCK);
    if (kvr_grow((void **)&g->ids, &g->cap_ids, n_blocks, SIZE_MAX, sizeof *g->ids) != KVR_OK) {
        g->oom = true;
        return;
    }
    uint64_t h = UINT64_C(0x9e3779b97f4a7c15), pos = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint32_t off = 0; off < segs[i].len;) {
            uint32_t room = BLOCK - (uint32_t)(pos % BLOCK), left = segs[i].len - off;
            uint32_t take = left < room ? left : room;
            h = kvr_mix64(h ^ kvr_mix64(segs[i].content) ^ ((uint64_t)off << 20) ^ take);
            off += take;
            pos += take;
            if (pos % BLOCK == 0 || pos == total)
                g->ids[k++] = intern(g, h ^ (pos % BLOCK)); /* a partial block differs */
        }
    }
    kvr_trace_builder_add(g->b, (uint64_t)llround(t * 1000.0), (uint32_t)total, output_length,
                          g->ids, (uint32_t)k);
    g->rows++;
}

/* A growable prompt. */
typedef struct prompt {
    seg_t *s;
    size_t n, cap;
    uint64_t tokens;
} prompt_t;

static bool push(gen_t *g, prompt_t *p, uint64_t content, uint32_t len)
{
    if (kvr_grow((void **)&p->s, &p->cap, p->n + 1, SIZE_MAX, sizeof *p->s) != KVR_OK) {
        g->oom = true;
        return false;
    }
    p->s[p->n++] = (seg_t){content, len};
    p->tokens += len;
    return true;
}

static bool copy_prompt(gen_t *g, prompt_t *dst, const prompt_t *src)
{
    dst->n = 0;
    dst->tokens = 0;
    for (size_t i = 0; i < src->n; i++)
        if (!push(g, dst, src->s[i].content, src->s[i].len))
            return false;
    return true;
}

static double gen_time(uint32_t out) { return GEN_S_FIXED + GEN_S_PER_TOKEN * out; }

static uint32_t geometric(kvr_rng_t *rng, double mean, uint32_t cap)
{
    uint32_t n = 1;
    while (n < cap && kvr_rng_uniform(rng) > 1.0 / mean)
        n++;
    return n;
}

/* ---- the workloads ---- */

#define CHAT_MAX_TOKENS 32768u
#define AGENT_MAX_TOKENS 65536u

/* A chat session: turns extend the previous prompt with its answer and a new message. */
static void unit_chat(gen_t *g, double t, prompt_t *p)
{
    size_t sys = kvr_draw_zipf(&g->rng, g->sys_cdf, 8);
    p->n = 0;
    p->tokens = 0;
    push(g, p, (UINT64_C(1) << 60) | sys, g->sys_len[sys]);
    uint32_t turns = geometric(&g->rng, 5.0, 30);
    for (uint32_t k = 0; k < turns && !g->oom; k++) {
        uint32_t msg = clamp_len(kvr_draw_lognormal(&g->rng, 120, 0.8), 8, 4000);
        uint32_t out = clamp_len(kvr_draw_lognormal(&g->rng, 250, 0.7), 16, 2048);
        if (p->tokens + msg > CHAT_MAX_TOKENS)
            break;
        push(g, p, fresh(g), msg);
        emit(g, t, p->s, p->n, out);
        push(g, p, fresh(g), out); /* the answer, in the next turn's prompt */
        t += gen_time(out) + kvr_draw_exp(&g->rng, 20.0);
    }
}

/* Steps of an agent from prompt p at time t; returns the time its last step ends. */
static double agent_steps(gen_t *g, double t, prompt_t *p, uint32_t steps, int depth)
{
    for (uint32_t k = 0; k < steps && !g->oom && p->tokens < AGENT_MAX_TOKENS; k++) {
        uint32_t out = clamp_len(kvr_draw_lognormal(&g->rng, 120, 0.6), 16, 1024);
        emit(g, t, p->s, p->n, out);
        t += gen_time(out);
        push(g, p, fresh(g), out);
        if (depth == 0 && kvr_rng_uniform(&g->rng) < 0.1) {
            /* parallel sub-agents from the prompt so far, then their results merged */
            uint32_t branches = 2 + (uint32_t)kvr_rng_below(&g->rng, 3);
            double end = t;
            prompt_t q = {0};
            for (uint32_t b = 0; b < branches && !g->oom; b++) {
                if (!copy_prompt(g, &q, p) || !push(g, &q, fresh(g), 60))
                    break;
                double e = agent_steps(g, t + 0.05 * kvr_rng_uniform(&g->rng), &q,
                                       geometric(&g->rng, 3.0, 10), 1);
                end = e > end ? e : end;
            }
            free(q.s);
            t = end;
            push(g, p, fresh(g), clamp_len(kvr_draw_lognormal(&g->rng, 400, 0.5), 32, 4000));
            continue;
        }
        uint32_t obs = clamp_len(kvr_draw_lognormal(&g->rng, 300, 1.0), 16, 8000);
        push(g, p, fresh(g), obs); /* the tool's result */
        t += kvr_draw_exp(&g->rng, 1.5);
    }
    return t;
}

static void unit_agent(gen_t *g, double t, prompt_t *p)
{
    size_t type = kvr_draw_zipf(&g->rng, g->sys_cdf + 8, 6);
    p->n = 0;
    p->tokens = 0;
    push(g, p, (UINT64_C(1) << 60) | (UINT64_C(1) << 32) | type, g->sys_len[8 + type]);
    push(g, p, fresh(g), clamp_len(kvr_draw_lognormal(&g->rng, 200, 0.6), 16, 4000));
    (void)agent_steps(g, t, p, geometric(&g->rng, 12.0, 50), 0);
}

static void unit_rag(gen_t *g, double t, prompt_t *p)
{
    size_t sys = kvr_rng_below(&g->rng, 2);
    p->n = 0;
    p->tokens = 0;
    push(g, p, (UINT64_C(1) << 60) | (UINT64_C(2) << 32) | sys, g->sys_len[14 + sys]);
    double u = kvr_rng_uniform(&g->rng);
    uint32_t k = u < 0.6 ? 1 : u < 0.9 ? 2 : 3;
    size_t picked[3];
    for (uint32_t i = 0; i < k; i++) {
        size_t d;
        bool dup;
        do {
            d = kvr_draw_zipf(&g->rng, g->doc_cdf, g->n_docs);
            dup = false;
            for (uint32_t j = 0; j < i; j++)
                dup |= picked[j] == d;
        } while (dup && g->n_docs > k);
        picked[i] = d;
        push(g, p, (UINT64_C(2) << 60) | d, g->doc_len[d]);
    }
    push(g, p, fresh(g), clamp_len(kvr_draw_lognormal(&g->rng, 60, 0.6), 8, 1000));
    emit(g, t, p->s, p->n, clamp_len(kvr_draw_lognormal(&g->rng, 200, 0.6), 16, 1024));
}

/* A document fan-out: a client sends a document nobody has sent before (behind one of the 2
 * RAG system prompts) with several questions at once (parallel map calls: extract, classify,
 * summarize each part), all within 50 ms, well inside one prefill of the document (~120 ms
 * for 6,000 tokens on the default engine model); with probability 0.3 a reduce call follows
 * the answers (the document, every question and answer, an instruction). The case where KV
 * events come too late: every call but the first finds no worker reporting the document. */
static void unit_fanout(gen_t *g, double t, prompt_t *p)
{
    size_t sys = kvr_rng_below(&g->rng, 2);
    p->n = 0;
    p->tokens = 0;
    push(g, p, (UINT64_C(1) << 60) | (UINT64_C(2) << 32) | sys, g->sys_len[14 + sys]);
    push(g, p, fresh(g), clamp_len(kvr_draw_lognormal(&g->rng, 6000, 0.5), 1000, 16000));
    uint32_t calls = 2 + geometric(&g->rng, 3.0, 15); /* 3-17, mean about 5 */
    prompt_t q = {0}, reduce = {0};
    double end = t;
    bool reduces = kvr_rng_uniform(&g->rng) < 0.3 && copy_prompt(g, &reduce, p);
    for (uint32_t c = 0; c < calls && !g->oom; c++) {
        uint32_t ask = clamp_len(kvr_draw_lognormal(&g->rng, 60, 0.6), 8, 1000);
        uint32_t out = clamp_len(kvr_draw_lognormal(&g->rng, 150, 0.6), 16, 1024);
        double at = t + 0.05 * kvr_rng_uniform(&g->rng);
        if (!copy_prompt(g, &q, p) || !push(g, &q, fresh(g), ask))
            break;
        emit(g, at, q.s, q.n, out);
        end = at + gen_time(out) > end ? at + gen_time(out) : end;
        if (reduces && (!push(g, &reduce, fresh(g), ask) || !push(g, &reduce, fresh(g), out)))
            reduces = false;
    }
    if (reduces && !g->oom && push(g, &reduce, fresh(g), 40))
        emit(g, end + 0.2, reduce.s, reduce.n,
             clamp_len(kvr_draw_lognormal(&g->rng, 300, 0.5), 32, 2048));
    free(q.s);
    free(reduce.s);
}

#define N_KINDS 4

/* Long enough for nearly every session (chat: 30 turns of ~25 s) or task to have ended. */
static const double WARMUP_S[N_KINDS] = {900.0, 600.0, 0.0, 0.0};

typedef void (*unit_fn)(gen_t *g, double t, prompt_t *p);
static const unit_fn UNITS[N_KINDS] = {unit_chat, unit_agent, unit_rag, unit_fanout};

/* Shared contents: 8 chat system prompts, 6 agent types, 2 RAG system prompts, the documents.
 * Drawn from their own stream, so a workload's shared contents do not depend on the rate. */
static int setup_contents(gen_t *g)
{
    kvr_rng_t r;
    kvr_rng_seed(&r, g->cfg->seed ^ UINT64_C(0x5eed5eed5eed5eed));
    g->n_sys = 16;
    g->n_docs = g->cfg->docs ? g->cfg->docs : 1000;
    g->sys_len = calloc(g->n_sys, sizeof *g->sys_len);
    g->sys_cdf = calloc(14, sizeof *g->sys_cdf);
    g->doc_len = calloc(g->n_docs, sizeof *g->doc_len);
    g->doc_cdf = calloc(g->n_docs, sizeof *g->doc_cdf);
    if (!g->sys_len || !g->sys_cdf || !g->doc_len || !g->doc_cdf ||
        kvr_u64map_init(&g->tab) != KVR_OK)
        return KVR_ENOMEM;
    for (uint32_t i = 0; i < 8; i++)
        g->sys_len[i] = 300 + (uint32_t)kvr_rng_below(&r, 1201);
    for (uint32_t i = 8; i < 14; i++)
        g->sys_len[i] = 3000 + (uint32_t)kvr_rng_below(&r, 7001);
    for (uint32_t i = 14; i < 16; i++)
        g->sys_len[i] = 200 + (uint32_t)kvr_rng_below(&r, 401);
    kvr_zipf_cdf(g->sys_cdf, 8, 1.0);
    kvr_zipf_cdf(g->sys_cdf + 8, 6, 1.2);
    for (uint32_t i = 0; i < g->n_docs; i++)
        g->doc_len[i] = clamp_len(kvr_draw_lognormal(&r, 3000, 0.5), 500, 16000);
    kvr_zipf_cdf(g->doc_cdf, g->n_docs, 1.1);
    return KVR_OK;
}

/* Mean requests per unit of a kind, measured on 2000 units of a pilot run (into a scratch
 * builder, with its own stream): the unit start rate is the request rate divided by it. */
static double pilot_mean(gen_t *g, int kind, prompt_t *p)
{
    kvr_trace_builder_t scratch, *real = g->b;
    kvr_trace_builder_init(&scratch);
    kvr_rng_t saved = g->rng;
    kvr_rng_seed(&g->rng, g->cfg->seed ^ (UINT64_C(0x9173) + (uint64_t)kind));
    g->b = &scratch;
    g->rows = 0;
    g->pilot = true;
    for (int i = 0; i < 2000 && !g->oom; i++)
        UNITS[kind](g, 0.0, p);
    double mean = (double)g->rows / 2000.0;
    g->pilot = false;
    g->b = real;
    g->rng = saved;
    kvr_trace_builder_deinit(&scratch);
    return mean > 0 ? mean : 1.0;
}

static double next_gap(gen_t *g, double unit_rate)
{
    if (g->cfg->arrival == KVR_ARRIVAL_GAMMA)
        return kvr_draw_gamma(&g->rng, 1.0 / unit_rate, g->cfg->cv);
    return kvr_draw_exp(&g->rng, 1.0 / unit_rate);
}

static const char *const NAMES[KVR_WORKLOAD_N] = {"chat", "agent", "rag", "mix", "fanout"};

kvr_workload_t kvr_workload_parse(const char *name)
{
    for (int i = 0; i < KVR_WORKLOAD_N; i++)
        if (strcmp(name, NAMES[i]) == 0)
            return (kvr_workload_t)i;
    return KVR_WORKLOAD_N;
}

const char *kvr_workload_name(kvr_workload_t w)
{
    return (unsigned)w < KVR_WORKLOAD_N ? NAMES[w] : "unknown";
}

static int check_config(const kvr_tracegen_config_t *c, char *err, size_t err_len)
{
    const char *bad = (unsigned)c->workload >= KVR_WORKLOAD_N                           ? "workload"
                      : !(c->rate > 0 && c->rate <= 1e6)                                ? "rate"
                      : !(c->duration_s > 0 && c->duration_s <= 86400.0 * 365)          ? "duration"
                      : c->arrival == KVR_ARRIVAL_GAMMA && !(c->cv > 0 && c->cv <= 100) ? "cv"
                      : c->docs > 1000000                                               ? "docs"
                                                                                        : NULL;
    if (bad != NULL) {
        snprintf(err, err_len, "%s: out of range", bad);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

int kvr_tracegen_run(const kvr_tracegen_config_t *cfg, kvr_trace_t *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    int rc = check_config(cfg, err, err_len);
    if (rc != KVR_OK)
        return rc;
    kvr_trace_builder_t b;
    kvr_trace_builder_init(&b);
    gen_t g = {.cfg = cfg, .b = &b};
    prompt_t p = {0};
    rc = setup_contents(&g);
    static const double MIX[N_KINDS] = {0.4, 0.3, 0.3, 0.0}; /* fan-out only on its own */
    static const kvr_workload_t KIND_OF[N_KINDS] = {KVR_WORKLOAD_CHAT, KVR_WORKLOAD_AGENT,
                                                    KVR_WORKLOAD_RAG, KVR_WORKLOAD_FANOUT};
    for (int kind = 0; kind < N_KINDS && rc == KVR_OK; kind++) {
        double share = cfg->workload == KVR_WORKLOAD_MIX ? MIX[kind]
                       : cfg->workload == KIND_OF[kind]  ? 1.0
                                                         : 0.0;
        if (share == 0)
            continue;
        double unit_rate = cfg->rate * share / pilot_mean(&g, kind, &p);
        kvr_rng_seed(&g.rng, cfg->seed * 31 + (uint64_t)kind);
        /* sessions and tasks started before 0 are under way at 0 (their requests before 0
         * are dropped): the rate is steady from the first second */
        for (double t = -WARMUP_S[kind] + next_gap(&g, unit_rate); t < cfg->duration_s && !g.oom;
             t += next_gap(&g, unit_rate))
            UNITS[kind](&g, t, &p);
        rc = g.oom ? KVR_ENOMEM : KVR_OK;
    }
    free(p.s);
    free(g.ids);
    kvr_u64map_deinit(&g.tab);
    free(g.sys_len);
    free(g.sys_cdf);
    free(g.doc_len);
    free(g.doc_cdf);
    if (rc == KVR_OK)
        rc = kvr_trace_builder_finish(&b, cfg->max_rows, out);
    kvr_trace_builder_deinit(&b);
    if (rc != KVR_OK)
        snprintf(err, err_len, "%s", kvr_strerror(rc));
    return rc;
}

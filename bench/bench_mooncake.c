/*
 * bench_mooncake.c: `kvrouter bench mooncake`, the reference's indexer harness (Dynamo's
 * mooncake_bench) on our index: a Mooncake trace is split across simulated workers, a
 * simulated engine per worker (a paged KV cache with prefix caching, sim/kvcache.h) turns
 * each worker's requests into KV events (the prompt's new blocks as one event, then each
 * output block as its own event when it fills, as engines publish them), and the lookups and the events are then replayed
 * together, open loop, with the trace's timestamps rescaled into a window; each worker's
 * stream is replayed for --duplication copies with distinct worker ids. A sweep shrinks the
 * window until the achieved rate falls behind the offered one.
 *
 * Threads: the writer (the index's one writer: every event at its scheduled time) and one
 * reader (every lookup at its scheduled time), each running back to back when behind; the
 * main thread prepares and reports. Latency: a lookup's service time (its kvr_index_lookup),
 * and separately its time from scheduled to answered (queueing included).
 * Differences from the reference's harness are listed in docs/index.md.
 * Memory: the generated events (16 bytes a stored block, 8 a removed one, 8 a looked-up
 * block) and the index. Cost: preparation hashes every prompt once.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/cli.h"
#include "bench.h"
#include "base/grow.h"
#include "sim/kvcache.h"
#include "kvrouter.h"
#include "wire/trace.h"

#define DEFAULT_TRACE "data/traces/conversation_trace.jsonl"

typedef struct mc_args {
    const char *trace;
    uint32_t workers, duplication, trace_duplication, blocks, block_size, readers;
    double simulate_s, window_s;
    bool sweep, json;
    uint64_t rows, seed;
} mc_args_t;

enum { OP_LOOKUP = 0, OP_STORED, OP_REMOVED };

typedef struct op {
    double t;          /* in [0, 1): the share of the trace's span */
    uint8_t kind;
    bool has_parent;
    uint32_t worker;   /* the unique worker (0 .. workers-1) */
    uint32_t n;        /* blocks */
    size_t off;        /* into blocks (STORED) or hashes (REMOVED, LOOKUP) */
    uint64_t parent;
    size_t order;      /* generation order: ties in t keep it */
} op_t;

typedef struct gen {
    op_t *ops;
    size_t n_ops, cap_ops;
    kvr_block_t *blocks;
    size_t n_blocks, cap_blocks;
    uint64_t *hashes;
    size_t n_hashes, cap_hashes;
    uint32_t bs;
    double t;         /* the request being simulated */
    uint32_t worker;
    bool oom;
    uint64_t stored, removed, looked_up;
} gen_t;

static op_t *new_op(gen_t *g)
{
    if (kvr_grow((void **)&g->ops, &g->cap_ops, g->n_ops + 1, SIZE_MAX, sizeof *g->ops) != KVR_OK) {
        g->oom = true;
        return NULL;
    }
    op_t *o = &g->ops[g->n_ops++];
    memset(o, 0, sizeof *o);
    o->t = g->t;
    o->worker = g->worker;
    o->order = g->n_ops - 1;
    return o;
}

static bool add_hashes(gen_t *g, const uint64_t *h, size_t n)
{
    if (kvr_grow((void **)&g->hashes, &g->cap_hashes, g->n_hashes + n, SIZE_MAX,
                 sizeof *g->hashes) != KVR_OK) {
        g->oom = true;
        return false;
    }
    memcpy(g->hashes + g->n_hashes, h, n * sizeof *h);
    g->n_hashes += n;
    return true;
}

/* The simulated engine's events, as the index will receive them. */
static void on_kv(void *ctx, const kvr_kvcache_event_t *ev)
{
    gen_t *g = ctx;
    if (g->oom || ev->kind == KVR_KVC_CLEARED)
        return;
    op_t *o = new_op(g);
    if (o == NULL)
        return;
    o->n = (uint32_t)ev->n_hashes;
    if (ev->kind == KVR_KVC_REMOVED) {
        o->kind = OP_REMOVED;
        o->off = g->n_hashes;
        add_hashes(g, ev->hashes, ev->n_hashes);
        g->removed += ev->n_hashes;
        return;
    }
    o->kind = OP_STORED;
    o->has_parent = ev->has_parent;
    o->parent = ev->parent;
    o->off = g->n_blocks;
    if (kvr_grow((void **)&g->blocks, &g->cap_blocks, g->n_blocks + ev->n_hashes, SIZE_MAX,
                 sizeof *g->blocks) != KVR_OK) {
        g->oom = true;
        return;
    }
    for (size_t i = 0; i < ev->n_hashes; i++) {
        kvr_block_t *b = &g->blocks[g->n_blocks + i];
        b->ext = ev->hashes[i];
        (void)kvr_hash_blocks(ev->tokens + i * g->bs, g->bs, g->bs, NULL, &b->lbh, 1);
    }
    g->n_blocks += ev->n_hashes;
    g->stored += ev->n_hashes;
}

static int op_cmp(const void *a, const void *b)
{
    const op_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* The reference's --trace-duplication-factor: f structurally identical copies of every row,
 * copy d with every hash id offset by (max id + 1) x d (disjoint hash spaces), each copy
 * right after its row (same timestamp). Replaces t's arrays. */
static int duplicate_trace(kvr_trace_t *t, uint32_t f)
{
    if (f <= 1)
        return KVR_OK;
    uint64_t max_id = 0;
    for (size_t i = 0; i < t->n_ids; i++)
        max_id = t->ids[i] > max_id ? t->ids[i] : max_id;
    kvr_trace_row_t *rows = malloc(t->n_rows * f * sizeof *rows);
    uint64_t *ids = malloc((t->n_ids * f + 1) * sizeof *ids);
    if (rows == NULL || ids == NULL) {
        free(rows);
        free(ids);
        return KVR_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < t->n_rows; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        for (uint32_t d = 0; d < f; d++) {
            kvr_trace_row_t *c = &rows[i * f + d];
            *c = *r;
            c->hash_ids = ids + k;
            for (uint32_t j = 0; j < r->n_hash_ids; j++)
                ids[k++] = r->hash_ids[j] + (max_id + 1) * d;
        }
    }
    free(t->rows);
    free(t->ids);
    t->rows = rows;
    t->ids = ids;
    t->n_rows *= f;
    t->n_ids = k;
    return KVR_OK;
}

/* Every unique worker's requests through its simulated engine; ops sorted by time. */
static int prepare(const mc_args_t *a, const kvr_trace_t *t, gen_t *g)
{
    g->bs = a->block_size;
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, a->seed);
    uint32_t *assign = malloc(t->n_rows * sizeof *assign);
    kvr_kvcache_t **kc = calloc(a->workers, sizeof *kc);
    uint32_t *tokens = malloc(KVR_TRACE_MAX_INPUT * sizeof *tokens);
    uint64_t *lbh = malloc((KVR_TRACE_MAX_INPUT / g->bs + 1) * sizeof *lbh);
    uint64_t *seq = malloc((KVR_TRACE_MAX_INPUT / g->bs + 1) * sizeof *seq);
    int rc = assign && kc && tokens && lbh && seq ? KVR_OK : KVR_ENOMEM;
    for (size_t i = 0; rc == KVR_OK && i < t->n_rows; i++)
        assign[i] = (uint32_t)kvr_bench_rng_below(&rng, a->workers);
    double t0 = t->n_rows ? (double)t->rows[0].timestamp_ms : 0;
    double span = t->n_rows ? (double)t->rows[t->n_rows - 1].timestamp_ms - t0 + 1 : 1;
    for (uint32_t w = 0; rc == KVR_OK && w < a->workers; w++) {
        kvr_kvcache_config_t cc = {.num_blocks = a->blocks, .block_size = g->bs,
                                   .prefix_caching = true};
        if ((kc[w] = kvr_kvcache_new(&cc, on_kv, g, &rc)) == NULL)
            break;
    }
    kvr_kvcache_seq_t sq;
    kvr_kvcache_seq_init(&sq);
    for (size_t i = 0; rc == KVR_OK && i < t->n_rows && !g->oom; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        if (kvr_trace_tokens(r, 0, tokens, KVR_TRACE_MAX_INPUT) != KVR_OK)
            continue;
        long n = kvr_hash_prompt(tokens, r->input_length, g->bs, NULL, lbh, seq,
                                 KVR_TRACE_MAX_INPUT / g->bs + 1);
        if (n <= 0 || (uint64_t)n > (uint64_t)a->blocks)
            continue; /* longer than the engine's cache: the engine would refuse it */
        g->t = ((double)r->timestamp_ms - t0) / span;
        g->worker = assign[i];
        op_t *o = new_op(g);
        if (o == NULL)
            break;
        o->kind = OP_LOOKUP;
        o->n = (uint32_t)n;
        o->off = g->n_hashes;
        add_hashes(g, seq, (size_t)n);
        g->looked_up += (uint64_t)n;
        kvr_kvcache_t *k = kc[assign[i]];
        size_t hit = kvr_kvcache_match(k, seq, (size_t)n);
        if (kvr_kvcache_allocate(k, &sq, seq, hit, r->input_length) != KVR_OK)
            continue;
        (void)kvr_kvcache_commit(k, &sq, seq, tokens, (size_t)n);
        /* decode: each output block is committed when it fills (one STORED event of one
         * block, as an engine publishes them); output tokens are pseudo-random per row */
        uint64_t total = (uint64_t)r->input_length + r->output_length;
        if (total > KVR_TRACE_MAX_INPUT || total / g->bs > a->blocks)
            total = r->input_length;
        for (uint64_t p = r->input_length; p < total; p++)
            tokens[p] = KVR_TRACE_TOKEN_LO + (uint32_t)(kvr_bench_mix64(i * 1000003 + p) %
                                                        (KVR_TRACE_TOKEN_HI - KVR_TRACE_TOKEN_LO));
        long m = kvr_hash_prompt(tokens, total, g->bs, NULL, lbh, seq,
                                 KVR_TRACE_MAX_INPUT / g->bs + 1);
        for (long b = n; b < m && kvr_kvcache_allocate(k, &sq, seq, 0, (uint64_t)(b + 1) * g->bs) ==
                                      KVR_OK;
             b++)
            (void)kvr_kvcache_commit(k, &sq, seq, tokens, (size_t)b + 1);
        kvr_kvcache_release(k, &sq);
    }
    kvr_kvcache_seq_deinit(&sq);
    for (uint32_t w = 0; kc != NULL && w < a->workers; w++)
        kvr_kvcache_free(kc[w]);
    free(kc);
    free(assign);
    free(tokens);
    free(lbh);
    free(seq);
    if (rc == KVR_OK && g->oom)
        rc = KVR_ENOMEM;
    if (rc == KVR_OK && g->n_ops > 1)
        qsort(g->ops, g->n_ops, sizeof *g->ops, op_cmp);
    return rc;
}

/* ---- the open-loop replay ---- */

typedef struct replay {
    const mc_args_t *a;
    const gen_t *g;
    kvr_index_t *ix;
    double window_ns;
    uint64_t start_ns;
    /* writer */
    uint64_t writer_end_ns, events, event_errors;
    /* readers: lookup units (lookup op x copy) taken in order from one cursor */
    const size_t *lookup_ops; /* indices into g->ops of the lookups, in time order */
    size_t n_units;
    _Atomic size_t next_unit;
    _Atomic uint64_t reader_end_ns;
    double *service_ns, *sched_ns; /* per unit */
} replay_t;

/* Sleeps until shortly before at_ns, then yields until it: the writer and the readers
 * outnumber the cores, so a thread waiting for its next op must not spin on one. */
static void wait_until(uint64_t at_ns)
{
    for (;;) {
        uint64_t now = kvr_bench_now_ns();
        if (now >= at_ns)
            return;
        if (at_ns - now > 200000)
            kvr_bench_sleep_ns(at_ns - now - 100000);
        else
            sched_yield();
    }
}

static void *writer_main(void *arg)
{
    replay_t *p = arg;
    const gen_t *g = p->g;
    for (size_t i = 0; i < g->n_ops; i++) {
        const op_t *o = &g->ops[i];
        if (o->kind == OP_LOOKUP)
            continue;
        wait_until(p->start_ns + (uint64_t)(o->t * p->window_ns));
        for (uint32_t d = 0; d < p->a->duplication; d++) {
            kvr_event_t ev = {.worker = {o->worker + d * p->a->workers, 0},
                              .tier = KVR_TIER_DEVICE};
            if (o->kind == OP_STORED) {
                ev.kind = KVR_EV_STORED;
                ev.has_parent = o->has_parent;
                ev.parent_ext = o->parent;
                ev.blocks = g->blocks + o->off;
                ev.n_blocks = o->n;
            } else {
                ev.kind = KVR_EV_REMOVED;
                ev.removed = g->hashes + o->off;
                ev.n_removed = o->n;
            }
            p->event_errors += kvr_index_apply(p->ix, &ev) != KVR_OK;
            p->events++;
        }
    }
    p->writer_end_ns = kvr_bench_now_ns();
    return NULL;
}

/* One of --readers threads: takes the next lookup unit (a lookup op of one copy), waits
 * until it is due, makes it, records its service time and its due-to-answered time. */
static void *reader_main(void *arg)
{
    replay_t *p = arg;
    const gen_t *g = p->g;
    uint32_t dup = p->a->duplication;
    kvr_index_reader_register();
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    for (;;) {
        size_t u = atomic_fetch_add_explicit(&p->next_unit, 1, memory_order_relaxed);
        if (u >= p->n_units)
            break;
        const op_t *o = &g->ops[p->lookup_ops[u / dup]];
        uint64_t at = p->start_ns + (uint64_t)(o->t * p->window_ns);
        wait_until(at);
        uint64_t t0 = kvr_bench_now_ns();
        (void)kvr_index_lookup(p->ix, g->hashes + o->off, o->n, &lk);
        uint64_t t1 = kvr_bench_now_ns();
        p->service_ns[u] = (double)(t1 - t0);
        p->sched_ns[u] = (double)(t1 - at);
    }
    kvr_lookup_deinit(&lk);
    kvr_index_reader_unregister();
    uint64_t end = kvr_bench_now_ns(), prev = atomic_load(&p->reader_end_ns);
    while (end > prev && !atomic_compare_exchange_weak(&p->reader_end_ns, &prev, end)) {
    }
    return NULL;
}

typedef struct point {
    double window_s, offered, achieved, block_ops, bytes_per_pair;
    kvr_bench_lat_t service, sched;
    uint64_t events, event_errors, lookups, pairs;
} point_t;

static int run_point(const mc_args_t *a, const gen_t *g, const size_t *lookup_ops, size_t n_lookups,
                     double window_s, point_t *pt)
{
    uint64_t workers = (uint64_t)a->workers * a->duplication;
    kvr_index_config_t ic = {.max_pairs = (size_t)((g->stored + 1024) * a->duplication),
                             .max_workers = (uint32_t)workers};
    int st;
    kvr_index_t *ix = kvr_index_new(&ic, &st);
    if (ix == NULL)
        return st;
    replay_t p = {.a = a,
                  .g = g,
                  .ix = ix,
                  .window_ns = window_s * 1e9,
                  .lookup_ops = lookup_ops,
                  .n_units = n_lookups * a->duplication};
    atomic_init(&p.next_unit, 0);
    atomic_init(&p.reader_end_ns, 0);
    p.service_ns = malloc((p.n_units + 1) * sizeof(double));
    p.sched_ns = malloc((p.n_units + 1) * sizeof(double));
    pthread_t *rt = calloc(a->readers, sizeof *rt);
    if (p.service_ns == NULL || p.sched_ns == NULL || rt == NULL) {
        free(p.service_ns);
        free(p.sched_ns);
        free(rt);
        kvr_index_free(ix);
        return KVR_ENOMEM;
    }
    pthread_t wt;
    p.start_ns = kvr_bench_now_ns() + 20000000; /* every thread up before the first op */
    int rc = KVR_OK;
    uint32_t started = 0;
    if (pthread_create(&wt, NULL, writer_main, &p) != 0)
        rc = KVR_ENOMEM;
    for (; rc == KVR_OK && started < a->readers; started++)
        if (pthread_create(&rt[started], NULL, reader_main, &p) != 0)
            rc = KVR_ENOMEM;
    if (rc != KVR_OK)
        atomic_store(&p.next_unit, p.n_units); /* the readers started stop at once */
    for (uint32_t r = 0; r < started; r++)
        pthread_join(rt[r], NULL);
    if (rc == KVR_OK || started > 0)
        pthread_join(wt, NULL);
    free(rt);
    if (rc == KVR_OK) {
        uint64_t rend = atomic_load(&p.reader_end_ns);
        uint64_t end = p.writer_end_ns > rend ? p.writer_end_ns : rend;
        double took = (double)(end - p.start_ns) * 1e-9;
        double ops = (double)(p.events + p.n_units);
        double blocks = (double)(g->stored + g->removed + g->looked_up) * a->duplication;
        kvr_index_stats_t xs;
        kvr_index_stats(ix, &xs);
        *pt = (point_t){.window_s = window_s,
                        .offered = ops / window_s,
                        .achieved = ops / (took > window_s ? took : window_s),
                        .block_ops = blocks / (took > window_s ? took : window_s),
                        .bytes_per_pair = xs.pairs ? (double)xs.bytes / (double)xs.pairs : 0,
                        .events = p.events,
                        .event_errors = p.event_errors,
                        .lookups = p.n_units,
                        .pairs = xs.pairs};
        kvr_bench_summarize(p.service_ns, p.n_units, &pt->service);
        kvr_bench_summarize(p.sched_ns, p.n_units, &pt->sched);
    }
    free(p.service_ns);
    free(p.sched_ns);
    kvr_index_free(ix);
    return rc;
}

static void print_point(const mc_args_t *a, const point_t *p)
{
    if (a->json) {
        printf("{\"workers\":%llu,\"unique_workers\":%u,\"duplication\":%u,"
               "\"trace_duplication\":%u,\"block_size\":%u,\"readers\":%u,\"window_s\":%.4f,"
               "\"offered_per_s\":%.0f,\"achieved_per_s\":%.0f,\"block_ops_per_s\":%.0f,"
               "\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"sched_p50_us\":%.2f,"
               "\"sched_p99_us\":%.2f,\"sched_p999_us\":%.2f,\"events\":%llu,"
               "\"event_errors\":%llu,\"lookups\":%llu,\"pairs\":%llu,\"bytes_per_pair\":%.1f}\n",
               (unsigned long long)a->workers * a->duplication, a->workers, a->duplication,
               a->trace_duplication, a->block_size, a->readers, p->window_s, p->offered,
               p->achieved, p->block_ops, p->service.p50_us, p->service.p99_us, p->service.p999_us,
               p->sched.p50_us, p->sched.p99_us, p->sched.p999_us, (unsigned long long)p->events,
               (unsigned long long)p->event_errors, (unsigned long long)p->lookups,
               (unsigned long long)p->pairs, p->bytes_per_pair);
    } else {
        printf("%9.3f %12.0f %12.0f %5.1f%% %13.0f %9.2f %9.2f %9.2f %10.1f %10.1f %8.1f\n",
               p->window_s, p->offered, p->achieved, 100 * p->achieved / p->offered,
               p->block_ops, p->service.p50_us, p->service.p99_us, p->service.p999_us,
               p->sched.p50_us, p->sched.p99_us, p->bytes_per_pair);
    }
    fflush(stdout);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter bench mooncake [options]\n\n"
            "The reference's indexer benchmark (mooncake_bench) on kvrouter's index: the trace\n"
            "split across simulated workers, each a simulated engine (paged KV cache, prefix\n"
            "caching) turning its requests into KV events; then the lookups and the events\n"
            "replayed together, open loop, in a window (one writer thread, --readers reader\n"
            "threads).\n\n"
            "  --trace FILE       [" DEFAULT_TRACE "]\n"
            "  --rows N           the first N rows [all]\n"
            "  --trace-duplication F  F copies of every row with disjoint hash ids (the\n"
            "                     reference's --trace-duplication-factor) [1]\n"
            "  --workers N        unique simulated workers [1000]\n"
            "  --duplication D    each worker's stream replayed for D copies with distinct ids\n"
            "                     (the reference's -d, --inference-worker-duplication-factor) [7]\n"
            "  --blocks N         KV blocks per simulated engine [16384]\n"
            "  --block-size N     tokens per block; 512 (the reference's default) makes one\n"
            "                     block of each trace hash id [512]\n"
            "  --readers N        lookup threads taking the due lookups in order [one per\n"
            "                     core]\n"
            "  --simulate-s S     accepted for the reference's command line: the engines here\n"
            "                     release a request's blocks at once (docs/index.md)\n"
            "  --window-s S       the replay window [10]\n"
            "  --sweep            shrink the window by sqrt(2) until the achieved rate is below\n"
            "                     99%% of the offered one (at most 16 points)\n"
            "  --seed N           the assignment of rows to workers [1]\n"
            "  --json             one JSON object per point\n");
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    mc_args_t *a = arg;
    const char *w = c->argv[c->i];
    if (strcmp(w, "--sweep") == 0) {
        a->sweep = true;
        return 0;
    }
    if (strcmp(w, "--json") == 0) {
        a->json = true;
        return 0;
    }
    if (kvr_cli_is(c, "--trace"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->trace);
    if (kvr_cli_is(c, "--rows"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_MAX, &a->rows);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, KVR_INDEX_MAX_WORKERS, &a->workers);
    if (kvr_cli_is(c, "--duplication"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, KVR_INDEX_MAX_WORKERS, &a->duplication);
    if (kvr_cli_is(c, "--trace-duplication"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 1024, &a->trace_duplication);
    if (kvr_cli_is(c, "--readers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 64, &a->readers);
    if (kvr_cli_is(c, "--blocks"))
        return kvr_cli_u32(c, kvr_cli_value(c), 16, 1u << 24, &a->blocks);
    if (kvr_cli_is(c, "--block-size"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 1024, &a->block_size);
    if (kvr_cli_is(c, "--simulate-s"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->simulate_s);
    if (kvr_cli_is(c, "--window-s"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->window_s);
    if (kvr_cli_is(c, "--seed"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT64_MAX, &a->seed);
    return kvr_cli_unknown(c);
}

int kvr_bench_mooncake(int argc, char **argv)
{
    mc_args_t a = {.trace = DEFAULT_TRACE,
                   .workers = 1000,
                   .duplication = 7,
                   .trace_duplication = 1,
                   .blocks = 16384,
                   .block_size = 512,
                   .readers = 0,
                   .simulate_s = 60,
                   .window_s = 10,
                   .seed = 1};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter bench mooncake", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (a.readers == 0) { /* one per core: on 2 cores two readers beside the writer sustain
                           * more than one (the writer sleeps between its events) */
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        a.readers = cpus < 1 ? 1 : (uint32_t)(cpus > 64 ? 64 : cpus);
    }
    if ((uint64_t)a.workers * a.duplication > KVR_INDEX_MAX_WORKERS)
        return kvr_cli_fail(&c, "--workers x --duplication: %llu worker ranks, more than the "
                                "index's %u",
                            (unsigned long long)a.workers * a.duplication, KVR_INDEX_MAX_WORKERS);
    kvr_trace_t t;
    char err[1024];
    if (kvr_trace_load(a.trace, (size_t)a.rows, &t, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter bench mooncake: --trace: %s\n", err);
        return 1;
    }
    gen_t g;
    memset(&g, 0, sizeof g);
    uint64_t t0 = kvr_bench_now_ns();
    rc = duplicate_trace(&t, a.trace_duplication);
    if (rc == KVR_OK)
        rc = prepare(&a, &t, &g);
    kvr_trace_free(&t);
    size_t n_lookups = 0;
    for (size_t i = 0; i < g.n_ops; i++)
        n_lookups += g.ops[i].kind == OP_LOOKUP;
    size_t *lookup_ops = malloc((n_lookups + 1) * sizeof *lookup_ops);
    if (lookup_ops == NULL && rc == KVR_OK)
        rc = KVR_ENOMEM;
    for (size_t i = 0, k = 0; lookup_ops != NULL && i < g.n_ops; i++)
        if (g.ops[i].kind == OP_LOOKUP)
            lookup_ops[k++] = i;
    fprintf(stderr,
            "mooncake: %zu lookups, %zu events (%llu blocks stored, %llu removed) from %u "
            "workers x %u blocks of %u tokens (trace x%u), prepared in %.1f s; replayed x%u "
            "(%llu worker ranks), %u reader threads\n",
            n_lookups, g.n_ops - n_lookups, (unsigned long long)g.stored,
            (unsigned long long)g.removed, a.workers, a.blocks, a.block_size, a.trace_duplication,
            (double)(kvr_bench_now_ns() - t0) * 1e-9, a.duplication,
            (unsigned long long)a.workers * a.duplication, a.readers);
    if (rc == KVR_OK && !a.json)
        printf("%9s %12s %12s %6s %13s %9s %9s %9s %10s %10s %8s\n", "window_s", "offered/s",
               "achieved/s", "ratio", "block_ops/s", "p50_us", "p99_us", "p999_us", "sched_p50",
               "sched_p99", "B/pair");
    double window = a.window_s;
    for (int k = 0; rc == KVR_OK && k < (a.sweep ? 16 : 1); k++, window /= M_SQRT2) {
        point_t p;
        rc = run_point(&a, &g, lookup_ops, n_lookups, window, &p);
        if (rc != KVR_OK)
            break;
        print_point(&a, &p);
        if (p.achieved < 0.99 * p.offered)
            break;
    }
    free(lookup_ops);
    free(g.ops);
    free(g.blocks);
    free(g.hashes);
    if (rc != KVR_OK)
        fprintf(stderr, "kvrouter bench mooncake: %s\n", kvr_strerror(rc));
    return rc == KVR_OK ? 0 : 1;
}

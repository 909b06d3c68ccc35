/*
 * bench_index.c: `kvrouter bench index`: the latency of one prefix-index lookup
 * (kvr_index_lookup) for a prompt of `depth` blocks, against an index holding `pairs`
 * (worker, block) pairs of `workers` workers, with and without a concurrent writer, and how it
 * compares with the machine's floor for the same index size.
 *
 * Index: filled from the synthetic workload of bench_workload.c (a forest of system-prompt
 * roots and conversations, stored by one worker each or replicated, every block by all
 * workers when there are at most 4), with a budget above 1.25 x pairs so nothing is evicted.
 * Pinned conversations (about 5% of the pairs per depth, at least 4) are the query targets.
 * Queries, as sequence hashes (kvr_hash_chain of a local-hash chain): `full` = a pinned
 * conversation trimmed to depth (every block held by some worker), `partial` = its first half
 * then new blocks, `miss` = new blocks from the first one. Up to 512 distinct prompts per
 * point, drawn in random order.
 *
 * Latency: each lookup is one timed interval (timer overhead subtracted) on the main thread,
 * registered as an RCU reader; at least 2000 lookups per run (more for cheap points, about
 * 60 ms per run, 20 ms with --quick) after 200 untimed ones. `matched` = the mean longest
 * device prefix found (a check: depth, depth / 2, 0). With a writer, a second thread applies
 * the workload's steady-state mix (stored chains of 1-64 blocks, removals of leaf blocks,
 * holding the size steady) paced to `writer` block mutations per second; `writer_per_s` is
 * the rate it achieved while the lookups ran (each run then lasts at least 50 ms, 20 ms with
 * --quick, doing more lookups if they are cheap, so the rate covers a meaningful window).
 *
 * Floor: an array of stats.bytes bytes, one pointer per 64-byte line, linked into one random
 * cycle (Sattolo); a sample is `depth` dependent loads along it, timed like a lookup (at
 * least 200 samples per run, ~60 ms; only the median is used).
 * floor_ratio = lookup p50 / floor p50 (the index probes positions independently, so it can
 * beat a pointer chase: a ratio below 1 is possible and means memory-level parallelism).
 * bytes_per_pair = stats.bytes / stats.pairs after the fill.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 5, 0},
    {"sync", KVR_BENCH_STR, 6, 0},
    {"pairs", KVR_BENCH_INT, 8, 0},
    {"workers", KVR_BENCH_INT, 7, 0},
    {"depth", KVR_BENCH_INT, 5, 0},
    {"query", KVR_BENCH_STR, 7, 0},
    {"writer", KVR_BENCH_STR, 6, 0},
    {"lookups", KVR_BENCH_INT, 7, 0},
    {"runs", KVR_BENCH_INT, 0, 0},
    {"matched", KVR_BENCH_NUM, 7, 1},
    {"p50_us", KVR_BENCH_NUM, 8, 3},
    {"p99_us", KVR_BENCH_NUM, 8, 3},
    {"p999_us", KVR_BENCH_NUM, 8, 3},
    {"floor_p50_us", KVR_BENCH_NUM, 12, 3},
    {"floor_ratio", KVR_BENCH_NUM, 11, 3},
    {"bytes_per_pair", KVR_BENCH_NUM, 14, 1},
    {"writer_per_s", KVR_BENCH_NUM, 12, 0},
    {"index_pairs", KVR_BENCH_INT, 0, 0},
    {"index_nodes", KVR_BENCH_INT, 0, 0},
    {"index_bytes", KVR_BENCH_INT, 0, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

#define MIN_SAMPLES 2000u
#define MIN_FLOOR_SAMPLES 200u /* only its median is used */
#define MAX_SAMPLES 50000u
#define MAX_SAMPLES_WRITER (2u << 20) /* cheap lookups during a writer's minimum window */
#define WARMUP 200u
#define MAX_QUERIES 512u

/* One built index and what its points share. */
typedef struct ictx {
    const kvr_bench_opts_t *o;
    kvr_index_sync_t sync;
    uint64_t pairs;
    uint32_t workers;
    kvr_index_t *ix;
    kvr_wl_t *wl;
    kvr_index_stats_t st; /* after the fill */
    kvr_lookup_t lk;
    kvr_bench_rng_t rng;
    double *ns; /* MAX_SAMPLES_WRITER */
    double *runs; /* 8 figures x o->runs */
    void **chase; /* the floor's array, NULL until built */
    size_t chase_lines;
    void **cursor;
} ictx_t;

typedef struct qset {
    size_t n, depth;
    uint64_t *seq; /* n x depth */
} qset_t;

static size_t clamp_samples(double budget_us, double mean_us, size_t min)
{
    double n = mean_us > 0 ? budget_us / mean_us : MAX_SAMPLES;
    return n < (double)min ? min : n > MAX_SAMPLES ? MAX_SAMPLES : (size_t)n;
}

static double budget_us(const kvr_bench_opts_t *o)
{
    return o->quick ? 2e4 : 6e4;
}

/* ---- the floor -------------------------------------------------------------------------- */

static int chase_build(ictx_t *c, uint64_t bytes)
{
    size_t n = (size_t)(bytes / 64);
    if (n < 1024)
        n = 1024;
    void **lines = aligned_alloc(64, n * 64);
    uint32_t *perm = malloc(n * sizeof *perm);
    if (lines == NULL || perm == NULL || n > UINT32_MAX) {
        free(lines);
        free(perm);
        return KVR_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) { /* Sattolo: one cycle through every line */
        size_t j = (size_t)kvr_bench_rng_below(&c->rng, i);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        lines[i * 8] = &lines[(size_t)perm[i] * 8];
    free(perm);
    c->chase = lines;
    c->chase_lines = n;
    c->cursor = lines;
    return KVR_OK;
}

static void **chase_run(void **p, size_t steps)
{
    while (steps--)
        p = (void **)*p;
    return p;
}

static volatile uintptr_t chase_sink;

/* floor p50 (us) for depth dependent loads: median over the runs. */
static double floor_p50(ictx_t *c, size_t depth)
{
    kvr_bench_lat_t lat;
    void **p = c->cursor;
    uint64_t t0 = kvr_bench_now_ns();
    for (unsigned i = 0; i < 20; i++)
        p = chase_run(p, depth);
    double mean_us = (double)(kvr_bench_now_ns() - t0) / 20 / 1e3;
    size_t n = clamp_samples(budget_us(c->o), mean_us, MIN_FLOOR_SAMPLES);
    for (unsigned r = 0; r < c->o->runs; r++) {
        for (size_t i = 0; i < n; i++) {
            uint64_t a = kvr_bench_now_ns();
            p = chase_run(p, depth);
            uint64_t b = kvr_bench_now_ns();
            c->ns[i] = (double)(b - a);
        }
        kvr_bench_summarize(c->ns, n, &lat);
        c->runs[r] = lat.p50_us;
    }
    c->cursor = p;
    chase_sink = (uintptr_t)p;
    return kvr_bench_median(c->runs, c->o->runs);
}

/* ---- queries ---------------------------------------------------------------------------- */

static int queries_build(ictx_t *c, size_t depth, uint64_t kind, qset_t *q)
{
    size_t n_pin = kvr_wl_n_pinned(c->wl), n_cand = 0;
    uint32_t *cand = malloc((n_pin + 1) * sizeof *cand);
    uint64_t *lbh = malloc(depth * sizeof *lbh);
    if (cand == NULL || lbh == NULL)
        goto nomem;
    for (size_t i = 0; i < n_pin; i++)
        if (kvr_wl_pinned_len(c->wl, i) >= depth)
            cand[n_cand++] = (uint32_t)i;
    if (n_cand == 0 && kind != KVR_BENCH_Q_MISS) {
        fprintf(stderr, "kvrouter bench index: no stored prompt of %zu blocks\n", depth);
        free(cand);
        free(lbh);
        return KVR_EINVAL;
    }
    size_t nq = kind == KVR_BENCH_Q_MISS ? 64 : n_cand;
    size_t cap = ((size_t)4 << 20) / depth; /* at most 32 MB of queries */
    nq = nq > MAX_QUERIES ? MAX_QUERIES : nq;
    nq = nq > cap ? cap : nq;
    nq = nq ? nq : 1;
    q->seq = malloc(nq * depth * sizeof *q->seq);
    if (q->seq == NULL)
        goto nomem;
    q->n = nq;
    q->depth = depth;
    for (size_t j = 0; j + 1 < n_cand; j++) { /* distinct prompts in random order */
        size_t k = j + (size_t)kvr_bench_rng_below(&c->rng, n_cand - j);
        uint32_t t = cand[j];
        cand[j] = cand[k];
        cand[k] = t;
    }
    for (size_t i = 0; i < nq; i++) {
        size_t keep = kind == KVR_BENCH_Q_FULL ? depth : kind == KVR_BENCH_Q_PARTIAL ? depth / 2 : 0;
        if (keep > 0)
            kvr_wl_pinned_lbh(c->wl, cand[i], keep, lbh);
        for (size_t j = keep; j < depth; j++)
            lbh[j] = kvr_bench_rng_next(&c->rng);
        kvr_hash_chain(lbh, depth, q->seq + i * depth);
    }
    free(cand);
    free(lbh);
    return KVR_OK;
nomem:
    free(cand);
    free(lbh);
    fprintf(stderr, "kvrouter bench index: out of memory (queries)\n");
    return KVR_ENOMEM;
}

/* ---- the writer ------------------------------------------------------------------------- */

typedef struct writer {
    kvr_index_t *ix;
    kvr_wl_t *wl;
    uint64_t rate; /* block mutations / s; KVR_BENCH_WRITER_MAX = unpaced */
    atomic_bool stop, running;
    uint64_t mutations, ns, errors;
    int first_error;
    pthread_t th;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    kvr_event_t ev;
    uint64_t done = 0, t0 = kvr_bench_now_ns(), now = t0;
    atomic_store(&w->running, true);
    while (!atomic_load_explicit(&w->stop, memory_order_relaxed)) {
        now = kvr_bench_now_ns();
        if (w->rate != KVR_BENCH_WRITER_MAX) {
            double allowed = (double)w->rate * (double)(now - t0) / 1e9;
            if ((double)done >= allowed) { /* ahead of the pace: sleep until due */
                double wait_ns = ((double)done - allowed) / (double)w->rate * 1e9;
                kvr_bench_sleep_ns(wait_ns > 1000 ? (uint64_t)wait_ns : 1000);
                continue;
            }
        }
        size_t n = kvr_wl_next(w->wl, false, &ev);
        int st = kvr_index_apply(w->ix, &ev);
        if (st != KVR_OK) {
            if (w->errors++ == 0)
                w->first_error = st;
        }
        done += n;
    }
    w->mutations = done;
    w->ns = kvr_bench_now_ns() - t0;
    return NULL;
}

static int writer_start(writer_t *w, kvr_index_t *ix, kvr_wl_t *wl, uint64_t rate)
{
    memset(w, 0, sizeof *w);
    w->ix = ix;
    w->wl = wl;
    w->rate = rate;
    atomic_init(&w->stop, false);
    atomic_init(&w->running, false);
    if (pthread_create(&w->th, NULL, writer_main, w) != 0)
        return KVR_ENOMEM;
    while (!atomic_load(&w->running))
        kvr_bench_sleep_ns(10000);
    return KVR_OK;
}

/* Stops the writer; its achieved rate in block mutations per second. */
static double writer_stop(writer_t *w)
{
    atomic_store(&w->stop, true);
    pthread_join(w->th, NULL);
    if (w->errors)
        fprintf(stderr, "kvrouter bench index: writer: %llu events rejected (first: %s)\n",
                (unsigned long long)w->errors, kvr_status_name(w->first_error));
    return w->ns ? (double)w->mutations / ((double)w->ns / 1e9) : 0.0;
}

/* ---- lookups ---------------------------------------------------------------------------- */

/* Times lookups of random queries of q: at least n, and for at least min_ns (at most
 * MAX_SAMPLES_WRITER); the count in *done. Averages the longest device prefixes in *matched. */
static int time_lookups(ictx_t *c, const qset_t *q, size_t n, uint64_t min_ns, bool timed,
                        size_t *done, double *matched)
{
    double sum = 0;
    uint64_t start = kvr_bench_now_ns(), t1 = start;
    size_t i = 0;
    for (; i < n || (t1 - start < min_ns && i < MAX_SAMPLES_WRITER); i++) {
        const uint64_t *seq = q->seq + (size_t)kvr_bench_rng_below(&c->rng, q->n) * q->depth;
        uint64_t t0 = kvr_bench_now_ns();
        int st = kvr_index_lookup(c->ix, seq, q->depth, &c->lk);
        t1 = kvr_bench_now_ns();
        if (st != KVR_OK) {
            fprintf(stderr, "kvrouter bench index: kvr_index_lookup: %s\n", kvr_strerror(st));
            return st;
        }
        if (timed)
            c->ns[i] = (double)(t1 - t0);
        sum += c->lk.max_depth;
    }
    *done = i;
    *matched = i ? sum / (double)i : 0;
    return KVR_OK;
}

/* Measures one point (o->runs runs) and prints its row. */
static int run_point(ictx_t *c, const qset_t *q, uint64_t kind, uint64_t writer_rate,
                     double floor_us)
{
    const kvr_bench_opts_t *o = c->o;
    unsigned R = o->runs;
    double *f50 = c->runs, *f99 = f50 + R, *f999 = f99 + R, *fw = f999 + R, *fm = fw + R;
    size_t n = 0, done = 0, total = 0;
    /* a writer's rate means little over a few ms: keep it running 50 ms (20 with --quick) */
    uint64_t min_ns = writer_rate ? (o->quick ? 20000000u : 50000000u) : 0;
    for (unsigned r = 0; r < R; r++) {
        writer_t w;
        if (writer_rate && writer_start(&w, c->ix, c->wl, writer_rate) != KVR_OK) {
            fprintf(stderr, "kvrouter bench index: cannot start the writer thread\n");
            return 1;
        }
        double matched;
        uint64_t t0 = kvr_bench_now_ns();
        int st = time_lookups(c, q, WARMUP, 0, false, &done, &matched);
        if (n == 0)
            n = clamp_samples(budget_us(o), (double)(kvr_bench_now_ns() - t0) / WARMUP / 1e3,
                              MIN_SAMPLES);
        if (st == KVR_OK)
            st = time_lookups(c, q, n, min_ns, true, &done, &fm[r]);
        fw[r] = writer_rate ? writer_stop(&w) : NAN;
        if (st != KVR_OK)
            return 1;
        kvr_bench_lat_t lat;
        kvr_bench_summarize(c->ns, done, &lat);
        total += done;
        f50[r] = lat.p50_us;
        f99[r] = lat.p99_us;
        f999[r] = lat.p999_us;
    }
    double expect = kind == KVR_BENCH_Q_FULL ? (double)q->depth
                    : kind == KVR_BENCH_Q_PARTIAL ? (double)(q->depth / 2) : 0.0;
    double m = kvr_bench_median(fm, R);
    if (fabs(m - expect) > 0.5)
        fprintf(stderr,
                "kvrouter bench index: warning: %s queries of depth %zu matched %.1f blocks "
                "on average, expected %.0f\n",
                kvr_bench_query_name(kind), q->depth, m, expect);

    char wname[32];
    kvr_bench_row_t row;
    kvr_bench_row_init(&row, COLS, N_COLS);
    kvr_bench_set_str(&row, "bench", "index");
    kvr_bench_set_str(&row, "sync", kvr_bench_sync_name(c->sync));
    kvr_bench_set_int(&row, "pairs", (int64_t)c->pairs);
    kvr_bench_set_int(&row, "workers", c->workers);
    kvr_bench_set_int(&row, "depth", (int64_t)q->depth);
    kvr_bench_set_str(&row, "query", kvr_bench_query_name(kind));
    kvr_bench_set_str(&row, "writer", kvr_bench_rate_name(writer_rate, wname, sizeof wname));
    kvr_bench_set_int(&row, "lookups", (int64_t)(total / R)); /* per run */
    kvr_bench_set_int(&row, "runs", R);
    kvr_bench_set_num(&row, "matched", m);
    double p50 = kvr_bench_median(f50, R);
    kvr_bench_set_num(&row, "p50_us", p50);
    kvr_bench_set_num(&row, "p99_us", kvr_bench_median(f99, R));
    kvr_bench_set_num(&row, "p999_us", kvr_bench_median(f999, R));
    kvr_bench_set_num(&row, "floor_p50_us", floor_us);
    kvr_bench_set_num(&row, "floor_ratio", floor_us > 0 ? p50 / floor_us : NAN);
    kvr_bench_set_num(&row, "bytes_per_pair",
                      c->st.pairs ? (double)c->st.bytes / (double)c->st.pairs : NAN);
    kvr_bench_set_num(&row, "writer_per_s", writer_rate ? kvr_bench_median(fw, R) : NAN);
    kvr_bench_set_int(&row, "index_pairs", (int64_t)c->st.pairs);
    kvr_bench_set_int(&row, "index_nodes", (int64_t)c->st.nodes);
    kvr_bench_set_int(&row, "index_bytes", (int64_t)c->st.bytes);
    kvr_bench_print_row(o, &row);
    return 0;
}

/* ---- one index -------------------------------------------------------------------------- */

/* The points of one index: depths x queries x writers. */
typedef struct ipoints {
    const kvr_bench_list_t *depth, *query, *writer;
} ipoints_t;

static int build(ictx_t *c, const ipoints_t *pts)
{
    kvr_wl_config_t wc = {c->workers, c->pairs,
                          c->o->seed ^ (c->pairs * 31 + c->workers) ^ 0x1d3u};
    c->wl = kvr_wl_new(&wc);
    if (c->wl == NULL) {
        fprintf(stderr, "kvrouter bench index: out of memory (workload)\n");
        return 1;
    }
    /* query targets: ~5% of the pairs per depth, at least 4 prompts */
    uint32_t holders = c->workers <= 4 ? c->workers : 1;
    uint64_t pinned_pairs = 0;
    for (size_t i = 0; i < pts->depth->n; i++) {
        uint64_t d = pts->depth->v[i];
        uint64_t k = c->pairs / 20 / (d * holders);
        k = k < 4 ? 4 : k > MAX_QUERIES ? MAX_QUERIES : k;
        for (uint64_t j = 0; j < k; j++) {
            uint64_t len = d + kvr_bench_rng_below(&c->rng, d / 8 + 1);
            kvr_wl_pin(c->wl, (uint32_t)len);
            pinned_pairs += (len + 64) * holders;
        }
    }
    /* a budget that evicts nothing: the fill ends past the target by at most one chain, and
     * tiny --pairs may be mostly query targets */
    kvr_index_config_t cfg = {
        .max_pairs = (size_t)(c->pairs + c->pairs / 4 + pinned_pairs + 65536),
        .max_workers = c->workers,
        .sync = c->sync,
    };
    int st;
    c->ix = kvr_index_new(&cfg, &st);
    if (c->ix == NULL) {
        fprintf(stderr, "kvrouter bench index: kvr_index_new: %s\n", kvr_strerror(st));
        return 1;
    }
    uint64_t t0 = kvr_bench_now_ns();
    st = kvr_wl_fill(c->wl, c->ix, c->pairs);
    double secs = (double)(kvr_bench_now_ns() - t0) / 1e9;
    if (st != KVR_OK) {
        fprintf(stderr, "kvrouter bench index: filling the index: kvr_index_apply: %s\n",
                kvr_status_name(st));
        return 1;
    }
    kvr_bench_check_stats("bench index: after the fill", c->ix);
    kvr_index_stats(c->ix, &c->st);
    if (c->st.pairs != kvr_wl_pairs(c->wl))
        fprintf(stderr, "kvrouter bench index: warning: index holds %llu pairs, workload %llu\n",
                (unsigned long long)c->st.pairs, (unsigned long long)kvr_wl_pairs(c->wl));
    fprintf(stderr,
            "bench index: %s index of %llu pairs, %u workers: filled in %.1f s (%.1fM "
            "pairs/s), %llu nodes, %.1f MB\n",
            kvr_bench_sync_name(c->sync), (unsigned long long)c->st.pairs, c->workers, secs,
            (double)c->st.pairs / secs / 1e6, (unsigned long long)c->st.nodes,
            (double)c->st.bytes / 1e6);
    if (chase_build(c, c->st.bytes) != KVR_OK) {
        fprintf(stderr, "kvrouter bench index: out of memory (floor array)\n");
        return 1;
    }
    return 0;
}

static int run_index(const kvr_bench_opts_t *o, kvr_index_sync_t sync, uint64_t pairs,
                     uint32_t workers, const ipoints_t *pts)
{
    ictx_t c = {.o = o, .sync = sync, .pairs = pairs, .workers = workers};
    kvr_bench_rng_seed(&c.rng, o->seed ^ (pairs * 7 + workers * 13 + sync));
    kvr_lookup_init(&c.lk);
    c.ns = malloc(MAX_SAMPLES_WRITER * sizeof *c.ns);
    c.runs = malloc(8 * o->runs * sizeof *c.runs);
    int rc = 1;
    if (c.ns == NULL || c.runs == NULL || build(&c, pts) != 0)
        goto out;
    if (sync == KVR_SYNC_RCU)
        kvr_index_reader_register();
    rc = 0;
    for (size_t di = 0; di < pts->depth->n && rc == 0; di++) {
        size_t depth = pts->depth->v[di];
        double fl = floor_p50(&c, depth);
        for (size_t qi = 0; qi < pts->query->n && rc == 0; qi++) {
            qset_t q = {0};
            if (queries_build(&c, depth, pts->query->v[qi], &q) != KVR_OK) {
                rc = 1;
                break;
            }
            for (size_t wi = 0; wi < pts->writer->n && rc == 0; wi++)
                rc = run_point(&c, &q, pts->query->v[qi], pts->writer->v[wi], fl);
            free(q.seq);
        }
    }
    kvr_bench_check_stats("bench index: after the points", c.ix);
    if (sync == KVR_SYNC_RCU)
        kvr_index_reader_unregister();
out:
    kvr_lookup_deinit(&c.lk);
    kvr_index_free(c.ix);
    kvr_wl_free(c.wl);
    free(c.chase);
    free(c.ns);
    free(c.runs);
    return rc;
}

int kvr_bench_index(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_pairs = {2, {1000000, 16000000}};
    static const kvr_bench_list_t quick_pairs = {1, {1000000}};
    static const kvr_bench_list_t def_workers = {3, {4, 64, 1000}};
    static const kvr_bench_list_t def_depth = {5, {32, 128, 512, 2048, 8192}};
    static const kvr_bench_list_t quick_depth = {2, {32, 512}};
    static const kvr_bench_list_t def_query = {
        3, {KVR_BENCH_Q_FULL, KVR_BENCH_Q_PARTIAL, KVR_BENCH_Q_MISS}};
    static const kvr_bench_list_t def_writer = {2, {0, 1000000}};
    static const kvr_bench_list_t def_sync = {1, {KVR_SYNC_RCU}};
    const kvr_bench_list_t *pairs = kvr_bench_pick(&o->pairs, o->quick ? &quick_pairs : &def_pairs);
    const kvr_bench_list_t *workers = kvr_bench_pick(&o->workers, &def_workers);
    const kvr_bench_list_t *syncs = kvr_bench_pick(&o->sync, &def_sync);
    ipoints_t pts = {kvr_bench_pick(&o->depth, o->quick ? &quick_depth : &def_depth),
                     kvr_bench_pick(&o->query, &def_query),
                     kvr_bench_pick(&o->writer, &def_writer)};

    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t s = 0; s < syncs->n; s++) {
        kvr_index_sync_t sync = (kvr_index_sync_t)syncs->v[s];
        kvr_bench_list_t writers = *pts.writer;
        if (sync == KVR_SYNC_NONE) { /* no concurrent writer without synchronization */
            writers.n = 0;
            for (size_t i = 0; i < pts.writer->n; i++)
                if (pts.writer->v[i] == 0)
                    writers.v[writers.n++] = 0;
            if (writers.n == 0)
                continue;
        }
        ipoints_t p = {pts.depth, pts.query, &writers};
        for (size_t i = 0; i < pairs->n; i++)
            for (size_t j = 0; j < workers->n; j++)
                if (run_index(o, sync, pairs->v[i], (uint32_t)workers->v[j], &p) != 0)
                    return 1;
    }

    /* The key point again with the rwlock, for comparison (unless --sync chose the modes). */
    if (o->sync.n == 0 && kvr_bench_list_has(pairs, 1000000) &&
        kvr_bench_list_has(workers, 64) && kvr_bench_list_has(pts.depth, 512) &&
        kvr_bench_list_has(pts.query, KVR_BENCH_Q_FULL)) {
        kvr_bench_list_t d = {1, {512}}, q = {1, {KVR_BENCH_Q_FULL}}, w = {0, {0}};
        for (size_t i = 0; i < pts.writer->n; i++)
            if (pts.writer->v[i] != 0)
                w.v[w.n++] = pts.writer->v[i];
        ipoints_t key = {&d, &q, &w};
        if (w.n > 0 && run_index(o, KVR_SYNC_RWLOCK, 1000000, 64, &key) != 0)
            return 1;
    }
    return 0;
}

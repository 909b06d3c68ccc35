/*
 * bench.h: shared pieces of `kvrouter bench`: a seeded PRNG (xoshiro256** seeded by splitmix64),
 * a monotonic timer with its calibrated overhead, percentiles and medians, the command-line
 * options (parameter lists that override each benchmark's defaults), one printer for both
 * output formats (an aligned table or one JSON object per line), and the synthetic prefix
 * workload that the index and ingest benchmarks share (bench_workload.c).
 *
 * Measuring: every latency is one clock_gettime(CLOCK_MONOTONIC) interval around the measured
 * call, minus the timer's own calibrated overhead (the median of empty intervals), so figures
 * are the call's cost, not the clock's. A "point" is one combination of parameters; it is
 * measured --runs times and each printed figure is the median of the runs' figures.
 *
 * Memory: everything here is owned by the benchmark that creates it. Threads: the helpers are
 * reentrant; a workload object belongs to one thread at a time.
 * Invariants: a printed figure is a median of --runs runs. Cost: the helpers are O(1) but for
 * the percentiles (a sort of the samples) and the workload's generation (before timing).
 */
#ifndef KVR_BENCH_H
#define KVR_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvrouter.h"

/* ---- PRNG ------------------------------------------------------------------------------- */

typedef struct kvr_bench_rng {
    uint64_t s[4];
} kvr_bench_rng_t;

uint64_t kvr_bench_splitmix64(uint64_t *state);
/* A bijective 64-bit mixer (splitmix64's finalizer). */
uint64_t kvr_bench_mix64(uint64_t x);
void kvr_bench_rng_seed(kvr_bench_rng_t *r, uint64_t seed);
uint64_t kvr_bench_rng_next(kvr_bench_rng_t *r);
/* Uniform in [0, n) (n > 0); multiply-shift, bias below 2^-32 for the sizes used here. */
uint64_t kvr_bench_rng_below(kvr_bench_rng_t *r, uint64_t n);
/* Uniform in [0, 1). */
double kvr_bench_rng_unit(kvr_bench_rng_t *r);
/* Log-uniform integer in [lo, hi]. */
uint64_t kvr_bench_rng_logu(kvr_bench_rng_t *r, uint64_t lo, uint64_t hi);

/* ---- time ------------------------------------------------------------------------------- */

uint64_t kvr_bench_now_ns(void);
/* The median cost of an empty kvr_bench_now_ns() interval, measured once. */
double kvr_bench_timer_overhead_ns(void);
void kvr_bench_sleep_ns(uint64_t ns);

/* ---- statistics ------------------------------------------------------------------------- */

void kvr_bench_sort(double *v, size_t n);
/* Nearest-rank percentile (p in [0, 1]) of sorted v[0..n). */
double kvr_bench_pct_sorted(const double *v, size_t n, double p);
/* Median of v[0..n) (sorts v). NAN when n is 0. */
double kvr_bench_median(double *v, size_t n);

/* Latency summary of n samples in nanoseconds (sorted in place; overhead subtracted). */
typedef struct kvr_bench_lat {
    double p50_us, p99_us, p999_us, mean_us;
} kvr_bench_lat_t;
void kvr_bench_summarize(double *ns, size_t n, kvr_bench_lat_t *out);

/* ---- options ---------------------------------------------------------------------------- */

#define KVR_BENCH_MAX_LIST 16

/* A parameter list given on the command line; n == 0 means "the benchmark's defaults". */
typedef struct kvr_bench_list {
    size_t n;
    uint64_t v[KVR_BENCH_MAX_LIST];
} kvr_bench_list_t;

enum { KVR_BENCH_Q_FULL = 0, KVR_BENCH_Q_PARTIAL = 1, KVR_BENCH_Q_MISS = 2 };
#define KVR_BENCH_WRITER_MAX UINT64_MAX /* writer "max": unpaced */
#define KVR_BENCH_MAX_MOCKER_ARGS 64

typedef struct kvr_bench_opts {
    bool json;
    bool quick;
    unsigned runs;
    uint64_t seed;
    kvr_bench_list_t workers, pairs, depth, tokens, block_size;
    kvr_bench_list_t query;  /* KVR_BENCH_Q_* */
    kvr_bench_list_t writer; /* block mutations per second; 0 = none */
    kvr_bench_list_t sync;   /* kvr_index_sync_t */
    /* route (bench_route.c): an HTTP load generator for a running router */
    kvr_bench_list_t clients; /* concurrent keep-alive connections */
    const char *url;          /* the router's base URL */
    double duration_s;        /* measured seconds per run (unless requests > 0) */
    double warmup_s;          /* unmeasured seconds before each run */
    uint64_t requests;        /* > 0: stop each run after this many measured responses */
    double prefix_share;      /* fraction of each prompt taken from shared prefixes */
    bool update_state;        /* book requests in the router, then DELETE them */
    unsigned threads;         /* event-loop threads generating load */
    double rate_per_s;        /* > 0: clients pace themselves to this total rate */
    /* events (bench_events.c); rate_per_s and duration_s also apply (blocks/s, seconds) */
    const char *publish;      /* only publish KV events at this address (vLLM-style) */
    /* mocker (bench_mocker.c); clients, tokens, duration, warmup, prefix_share, threads and
     * url also apply */
    bool url_set;             /* --url given: drive that mocker, spawn none */
    uint64_t max_tokens;      /* completion tokens per request */
    bool stream;              /* streamed (SSE) responses */
    double speedup;           /* the spawned mocker's --speedup */
    unsigned mocker_cpu;      /* the CPU the spawned mocker is pinned to */
    bool speedup_set, mocker_cpu_set;
    bool disagg;              /* frontend: a prefill and a decode mocker (vLLM's pull) */
    const char *tokenizer;    /* frontend: chats, tokenized in process vs by /tokenize */
    size_t n_mocker_args;     /* extra flags for the spawned mocker (pointers into argv) */
    const char *mocker_args[KVR_BENCH_MAX_MOCKER_ARGS];
} kvr_bench_opts_t;

/* The given list, or the defaults when none was given. */
const kvr_bench_list_t *kvr_bench_pick(const kvr_bench_list_t *given,
                                       const kvr_bench_list_t *defaults);
bool kvr_bench_list_has(const kvr_bench_list_t *l, uint64_t v);

const char *kvr_bench_query_name(uint64_t q);
const char *kvr_bench_sync_name(uint64_t s);
/* "none", "max", "1M/s", "500K/s", "1234/s" into buf. */
const char *kvr_bench_rate_name(uint64_t per_s, char *buf, size_t len);

/* ---- output ----------------------------------------------------------------------------- */

typedef enum kvr_bench_kind {
    KVR_BENCH_STR,
    KVR_BENCH_INT,
    KVR_BENCH_NUM,
} kvr_bench_kind_t;

/* One field of a point: its JSON name, its table width (0 = JSON only) and decimals. */
typedef struct kvr_bench_col {
    const char *name;
    kvr_bench_kind_t kind;
    int width;
    int prec;
} kvr_bench_col_t;

#define KVR_BENCH_MAX_COLS 32

typedef struct kvr_bench_val {
    bool set;
    const char *s;
    int64_t i;
    double d;
} kvr_bench_val_t;

typedef struct kvr_bench_row {
    const kvr_bench_col_t *cols;
    size_t n;
    kvr_bench_val_t v[KVR_BENCH_MAX_COLS];
} kvr_bench_row_t;

void kvr_bench_row_init(kvr_bench_row_t *row, const kvr_bench_col_t *cols, size_t n);
void kvr_bench_set_str(kvr_bench_row_t *row, const char *name, const char *s);
void kvr_bench_set_int(kvr_bench_row_t *row, const char *name, int64_t i);
/* NAN or an infinity leaves the field unset ("-" in the table, absent in JSON). */
void kvr_bench_set_num(kvr_bench_row_t *row, const char *name, double d);
/* The table's header line (nothing in JSON mode). */
void kvr_bench_print_header(const kvr_bench_opts_t *o, const kvr_bench_col_t *cols, size_t n);
void kvr_bench_print_row(const kvr_bench_opts_t *o, const kvr_bench_row_t *row);

/* ---- the synthetic prefix workload (bench_workload.c) ----------------------------------- */

/*
 * A forest of prompts: a few hundred "system prompt" roots of 8-64 blocks, each branching into
 * conversations whose bodies grow turn by turn. A conversation is stored by one worker (KV
 * routing keeps a conversation where its prefix is), sometimes replicated to a few more, or by
 * every worker when the workload has at most 4 of them. Each worker stores the root blocks it
 * needs once. Engine hashes (ext) are the sequence hashes, except for one worker in eight,
 * whose engine uses its own hash seed (ext = seq ^ salt). Events are what engines emit: stored
 * chains of 1-64 blocks extending what the worker holds (or starting at the root), and
 * removals of the worker's leaf blocks. The workload tracks exactly what each worker holds, so
 * every event it produces is valid for an index that applied all the previous ones.
 */
typedef struct kvr_wl kvr_wl_t;

typedef struct kvr_wl_config {
    uint32_t workers;
    uint64_t target_pairs; /* the steady size kept by steady-state events */
    uint64_t seed;
} kvr_wl_config_t;

kvr_wl_t *kvr_wl_new(const kvr_wl_config_t *cfg);
void kvr_wl_free(kvr_wl_t *wl);

/* Queues a pinned conversation of total_len blocks (root included): stored like the others
 * by the next events, then never trimmed nor extended, so queries can rely on it. */
int kvr_wl_pin(kvr_wl_t *wl, uint32_t total_len);

/* The next event. grow: stores only (to fill an index); otherwise the steady-state mix.
 * ev's arrays point into wl and stay valid until the next call. Returns the number of block
 * mutations (stored blocks or removed hashes) in the event. */
size_t kvr_wl_next(kvr_wl_t *wl, bool grow, kvr_event_t *ev);

/* (worker, block) pairs held by all workers after the events produced so far. */
uint64_t kvr_wl_pairs(const kvr_wl_t *wl);
bool kvr_wl_idle(const kvr_wl_t *wl); /* no chain is half stored */

/* Applies grow events to ix until it holds at least target pairs and every queued chain
 * (pinned ones included) is stored. KVR_OK or the first failing apply status. */
int kvr_wl_fill(kvr_wl_t *wl, kvr_index_t *ix, uint64_t target);

size_t kvr_wl_n_pinned(const kvr_wl_t *wl);
uint32_t kvr_wl_pinned_len(const kvr_wl_t *wl, size_t i);
/* The local block hashes of the first n blocks (root first) of pinned conversation i. */
void kvr_wl_pinned_lbh(const kvr_wl_t *wl, size_t i, size_t n, uint64_t *out);

/* Prints the index's error and warning counters to stderr when any is non-zero, naming the
 * benchmark and phase; returns the number of rejected events. */
uint64_t kvr_bench_check_stats(const char *what, const kvr_index_t *ix);

/* ---- the benchmarks --------------------------------------------------------------------- */

int kvr_bench_hash(const kvr_bench_opts_t *o);
int kvr_bench_index(const kvr_bench_opts_t *o);
int kvr_bench_snapshot(const kvr_bench_opts_t *o);
int kvr_bench_hashtab(const kvr_bench_opts_t *o); /* bench_hashtab.c */
int kvr_bench_ingest(const kvr_bench_opts_t *o);
int kvr_bench_events(const kvr_bench_opts_t *o);
int kvr_bench_route(const kvr_bench_opts_t *o);
/* bench_sync.c: its own arguments (argv[0] = "sync"). */
int kvr_bench_sync(int argc, char **argv);
/* bench_indexer.c: its own arguments (argv[0] = "indexer"). */
int kvr_bench_indexer(int argc, char **argv);
/* bench_mooncake.c: its own arguments (argv[0] = "mooncake"). */
int kvr_bench_mooncake(int argc, char **argv);
int kvr_bench_tokenize(int argc, char **argv); /* bench_tokenize.c: its own flags */
/* One point of bench route against o->url (its row printed), *per_s its median rate. */
int kvr_bench_route_point(const kvr_bench_opts_t *o, uint64_t clients, uint64_t tokens,
                          double *per_s);
int kvr_bench_mocker(const kvr_bench_opts_t *o);
void kvr_bench_mocker_usage(FILE *out); /* `kvrouter bench mocker --help` */
#define KVR_BENCH_ROUTE_THREADS 1 /* default --threads */
#define KVR_BENCH_ROUTE_THREADS_STR "1"
/* Whether url is one `bench route` can drive (http://host[:port][/base]); why says what not. */
bool kvr_bench_route_url_ok(const char *url, char *why, size_t why_len);

/* ---- children ---------------------------------------------------------------------------- */

struct kvr_child;
/* Starts argv into c (apps/child.h), its output in dir/what.log; on failure prints "who: why"
 * and the child's log, and returns false (c stopped). */
bool kvr_bench_spawn(struct kvr_child *c, const char *dir, const char *what, char **argv,
                     const char *who);
/* A fresh work directory for a benchmark's children (apps/child.h); false after printing why. */
bool kvr_bench_workdir(char *dir, size_t cap, const char *name, const char *who);
/* Stops kids[n-1] .. kids[0]. */
void kvr_bench_children_stop(struct kvr_child *kids, size_t n);
/* Removes the work directory after a success; keeps it (saying where) after a failure. */
void kvr_bench_workdir_end(const char *dir, int rc, const char *who);

#endif

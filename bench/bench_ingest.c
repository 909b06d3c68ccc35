/*
 * bench_ingest.c: `kvrouter bench ingest`: how many block mutations per second one thread
 * applies to the prefix index (kvr_index_apply), with KVR_SYNC_NONE and KVR_SYNC_RCU.
 *
 * Setup: an index with a budget of `pairs` (1M) pairs and `workers` (64) workers is filled
 * from the workload of bench_workload.c, then driven untimed through 500K steady-state
 * mutations. Steady state: stored chains of 1-64 blocks (new turns extending a worker's
 * conversation, replicas, new conversations starting at a root) and removals of 1-64 leaf
 * blocks (and of a root once its worker no longer uses it), chosen so that the size stays just
 * under the budget. Each run pre-generates 4M mutations' worth of events (1M with --quick;
 * generation is not timed), then applies them back to back.
 *
 * Figures: per_s = block mutations (stored blocks + removed hashes) / wall time of the whole
 * run (clock reads included, so slightly conservative); p50/p99/p99.9 = microseconds per
 * event (one timed interval per apply, timer overhead subtracted); target_per_s = 8M.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 6, 0},        {"sync", KVR_BENCH_STR, 6, 0},
    {"pairs", KVR_BENCH_INT, 8, 0},        {"workers", KVR_BENCH_INT, 7, 0},
    {"mutations", KVR_BENCH_INT, 9, 0},    {"events", KVR_BENCH_INT, 7, 0},
    {"runs", KVR_BENCH_INT, 0, 0},         {"p50_us", KVR_BENCH_NUM, 8, 3},
    {"p99_us", KVR_BENCH_NUM, 8, 3},       {"p999_us", KVR_BENCH_NUM, 8, 3},
    {"per_s", KVR_BENCH_NUM, 11, 0},       {"target_per_s", KVR_BENCH_NUM, 12, 0},
    {"bytes_per_pair", KVR_BENCH_NUM, 14, 1}, {"index_pairs", KVR_BENCH_INT, 0, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

#define WARM_MUTATIONS 500000u

/* Pre-generated events: their blocks and removed hashes live in two arenas sized up front,
 * so the pointers stay valid. */
typedef struct batch {
    kvr_event_t *ev;
    size_t n_ev, cap_ev;
    kvr_block_t *blocks;
    uint64_t *removed;
    size_t n_blocks, n_removed, cap;
    uint64_t mutations;
} batch_t;

static int batch_init(batch_t *b, uint64_t mutations)
{
    memset(b, 0, sizeof *b);
    b->cap = (size_t)mutations + 256;
    b->cap_ev = b->cap; /* every event has at least one mutation */
    b->ev = malloc(b->cap_ev * sizeof *b->ev);
    b->blocks = malloc(b->cap * sizeof *b->blocks);
    b->removed = malloc(b->cap * sizeof *b->removed);
    return b->ev && b->blocks && b->removed ? KVR_OK : KVR_ENOMEM;
}

static void batch_deinit(batch_t *b)
{
    free(b->ev);
    free(b->blocks);
    free(b->removed);
}

static void batch_generate(batch_t *b, kvr_wl_t *wl, uint64_t mutations)
{
    b->n_ev = b->n_blocks = b->n_removed = 0;
    b->mutations = 0;
    while (b->mutations < mutations) {
        kvr_event_t ev;
        b->mutations += kvr_wl_next(wl, false, &ev);
        if (ev.kind == KVR_EV_STORED) {
            memcpy(b->blocks + b->n_blocks, ev.blocks, ev.n_blocks * sizeof *ev.blocks);
            ev.blocks = b->blocks + b->n_blocks;
            b->n_blocks += ev.n_blocks;
        } else {
            memcpy(b->removed + b->n_removed, ev.removed, ev.n_removed * sizeof *ev.removed);
            ev.removed = b->removed + b->n_removed;
            b->n_removed += ev.n_removed;
        }
        b->ev[b->n_ev++] = ev;
    }
}

/* Applies the batch, one timed interval per event; returns the wall time in ns. */
static uint64_t batch_apply(const batch_t *b, kvr_index_t *ix, double *ns, uint64_t *errors,
                            int *first_error)
{
    uint64_t start = kvr_bench_now_ns(), prev = start;
    for (size_t i = 0; i < b->n_ev; i++) {
        int st = kvr_index_apply(ix, &b->ev[i]);
        uint64_t now = kvr_bench_now_ns();
        ns[i] = (double)(now - prev);
        prev = now;
        if (st != KVR_OK && (*errors)++ == 0)
            *first_error = st;
    }
    return prev - start;
}

static int run_config(const kvr_bench_opts_t *o, kvr_index_sync_t sync, uint64_t pairs,
                      uint32_t workers)
{
    uint64_t per_run = o->quick ? 1000000 : 4000000;
    kvr_index_config_t cfg = {.max_pairs = (size_t)pairs, .max_workers = workers, .sync = sync};
    kvr_wl_config_t wc = {workers, pairs, o->seed ^ (pairs * 31 + workers) ^ 0x19e5u};
    int st, rc = 1;
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    kvr_wl_t *wl = kvr_wl_new(&wc);
    batch_t b;
    int bst = batch_init(&b, per_run);
    double *ns = malloc(b.cap_ev * sizeof *ns);
    double *f = malloc(4 * o->runs * sizeof *f);
    if (ix == NULL || wl == NULL || bst != KVR_OK || ns == NULL || f == NULL) {
        fprintf(stderr, "kvrouter bench ingest: setup failed: %s\n",
                ix == NULL ? kvr_strerror(st) : "out of memory");
        goto out;
    }
    /* fill below the budget (a chain being stored is finished even past the target), then
     * the untimed steady-state events bring the size up to just under the budget */
    uint64_t margin = pairs / 20 > 40000 ? pairs / 20 : 40000;
    st = kvr_wl_fill(wl, ix, pairs > 2 * margin ? pairs - margin : pairs / 2);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrouter bench ingest: filling the index: %s\n", kvr_status_name(st));
        goto out;
    }
    uint64_t errors = 0;
    int first_error = KVR_OK;
    batch_generate(&b, wl, WARM_MUTATIONS < per_run ? WARM_MUTATIONS : per_run);
    batch_apply(&b, ix, ns, &errors, &first_error);

    double *f50 = f, *f99 = f + o->runs, *f999 = f99 + o->runs, *frate = f999 + o->runs;
    uint64_t events = 0, muts = 0;
    for (unsigned r = 0; r < o->runs; r++) {
        batch_generate(&b, wl, per_run);
        uint64_t wall = batch_apply(&b, ix, ns, &errors, &first_error);
        kvr_bench_lat_t lat;
        kvr_bench_summarize(ns, b.n_ev, &lat);
        f50[r] = lat.p50_us;
        f99[r] = lat.p99_us;
        f999[r] = lat.p999_us;
        frate[r] = (double)b.mutations / ((double)wall / 1e9);
        events = b.n_ev;
        muts = b.mutations;
    }
    if (errors)
        fprintf(stderr, "kvrouter bench ingest: %llu events rejected (first: %s)\n",
                (unsigned long long)errors, kvr_status_name(first_error));
    kvr_bench_check_stats("bench ingest", ix);
    kvr_index_stats_t s;
    kvr_index_stats(ix, &s);

    kvr_bench_row_t row;
    kvr_bench_row_init(&row, COLS, N_COLS);
    kvr_bench_set_str(&row, "bench", "ingest");
    kvr_bench_set_str(&row, "sync", kvr_bench_sync_name(sync));
    kvr_bench_set_int(&row, "pairs", (int64_t)pairs);
    kvr_bench_set_int(&row, "workers", workers);
    kvr_bench_set_int(&row, "mutations", (int64_t)muts);
    kvr_bench_set_int(&row, "events", (int64_t)events);
    kvr_bench_set_int(&row, "runs", o->runs);
    kvr_bench_set_num(&row, "p50_us", kvr_bench_median(f50, o->runs));
    kvr_bench_set_num(&row, "p99_us", kvr_bench_median(f99, o->runs));
    kvr_bench_set_num(&row, "p999_us", kvr_bench_median(f999, o->runs));
    kvr_bench_set_num(&row, "per_s", kvr_bench_median(frate, o->runs));
    kvr_bench_set_num(&row, "target_per_s", 8e6);
    kvr_bench_set_num(&row, "bytes_per_pair", s.pairs ? (double)s.bytes / (double)s.pairs : NAN);
    kvr_bench_set_int(&row, "index_pairs", (int64_t)s.pairs);
    kvr_bench_print_row(o, &row);
    rc = 0;
out:
    kvr_index_free(ix);
    kvr_wl_free(wl);
    batch_deinit(&b);
    free(ns);
    free(f);
    return rc;
}

int kvr_bench_ingest(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_sync = {2, {KVR_SYNC_NONE, KVR_SYNC_RCU}};
    static const kvr_bench_list_t def_pairs = {1, {1000000}};
    static const kvr_bench_list_t def_workers = {1, {64}};
    const kvr_bench_list_t *syncs = kvr_bench_pick(&o->sync, &def_sync);
    const kvr_bench_list_t *pairs = kvr_bench_pick(&o->pairs, &def_pairs);
    const kvr_bench_list_t *workers = kvr_bench_pick(&o->workers, &def_workers);
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t s = 0; s < syncs->n; s++)
        for (size_t i = 0; i < pairs->n; i++)
            for (size_t j = 0; j < workers->n; j++)
                if (run_config(o, (kvr_index_sync_t)syncs->v[s], pairs->v[i],
                               (uint32_t)workers->v[j]) != 0)
                    return 1;
    return 0;
}

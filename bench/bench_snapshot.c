/*
 * bench_snapshot.c: `kvrouter bench snapshot`: what a warm restart (`serve --state-file`)
 * costs: writing the index to its state file on exit, and checking and reloading it at start.
 *
 * Setup: an index (KVR_SYNC_RCU, as serve runs it) of --workers (64) workers filled to --pairs
 * (1M; several sizes with a list) from the workload of bench_workload.c. Then, per run:
 *   save   the rank table, then dump + wire/index_snapshot.h writer + fwrite + fflush + fsync
 *          to a file in $TMPDIR (/tmp), every rank, as serve does for its exact ranks;
 *   read   the file read back whole into memory (warm page cache: the cost of I/O is not
 *          what this measures);
 *   check  kvr_snap_open: the checksum and every record, before anything is applied;
 *   load   every event applied to an empty index (same budget).
 * Figures are medians of --runs (3); bytes_per_pair = file size / pairs; the reloaded index
 * is checked to hold as many pairs as the saved one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "wire/index_snapshot.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 8, 0},         {"pairs", KVR_BENCH_INT, 8, 0},
    {"workers", KVR_BENCH_INT, 7, 0},       {"events", KVR_BENCH_INT, 8, 0},
    {"runs", KVR_BENCH_INT, 0, 0},          {"file_mb", KVR_BENCH_NUM, 8, 1},
    {"bytes_per_pair", KVR_BENCH_NUM, 14, 1}, {"save_ms", KVR_BENCH_NUM, 8, 1},
    {"check_ms", KVR_BENCH_NUM, 8, 1},      {"load_ms", KVR_BENCH_NUM, 8, 1},
    {"load_pairs_per_s", KVR_BENCH_NUM, 16, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

typedef struct save_ctx {
    FILE *f;
    kvr_snap_writer_t *w;
    kvr_snap_rank_t *ranks; /* sorted by worker id */
    uint32_t n_ranks, cap;
    uint64_t events;
} save_ctx_t;

static int by_worker(const void *a, const void *b)
{
    uint64_t x = ((const kvr_snap_rank_t *)a)->worker_id, y = ((const kvr_snap_rank_t *)b)->worker_id;
    return x < y ? -1 : x > y;
}

static kvr_snap_rank_t *find_rank(save_ctx_t *c, uint64_t worker_id)
{
    kvr_snap_rank_t key = {.worker_id = worker_id};
    return bsearch(&key, c->ranks, c->n_ranks, sizeof key, by_worker);
}

/* First pass: the table of the workers the index holds (rank 0 each, as the workload has). */
static int collect_rank(void *ud, const kvr_event_t *ev)
{
    save_ctx_t *c = ud;
    if (find_rank(c, ev->worker.worker_id) != NULL)
        return 0;
    if (c->n_ranks == c->cap)
        return KVR_EFULL;
    c->ranks[c->n_ranks++] = (kvr_snap_rank_t){.worker_id = ev->worker.worker_id};
    qsort(c->ranks, c->n_ranks, sizeof *c->ranks, by_worker);
    return 0;
}

static int sink(void *ud, const void *bytes, size_t len)
{
    return fwrite(bytes, 1, len, ((save_ctx_t *)ud)->f) == len ? 0 : KVR_EIO;
}

static int save_event(void *ud, const kvr_event_t *ev)
{
    save_ctx_t *c = ud;
    c->events++;
    return kvr_snap_write_event(c->w, (uint32_t)(find_rank(c, ev->worker.worker_id) - c->ranks),
                                ev);
}

/* As serve saves: the rank table, then one dump pass through the writer (the table pass
 * here is serve's walk over its ranks, so it is timed too). */
static int save(kvr_index_t *ix, uint32_t workers, const char *path, uint64_t *events)
{
    save_ctx_t c = {.f = fopen(path, "wb"), .cap = workers,
                    .ranks = calloc(workers, sizeof *c.ranks)};
    int rc = c.ranks && c.f ? KVR_OK : KVR_EIO;
    if (rc == KVR_OK)
        rc = kvr_index_dump(ix, collect_rank, &c);
    if (rc == KVR_OK && (c.w = kvr_snap_writer_new(sink, &c, 16, 0, c.ranks, c.n_ranks, &rc)))
        if ((rc = kvr_index_dump(ix, save_event, &c)) == KVR_OK)
            rc = kvr_snap_writer_finish(c.w);
    kvr_snap_writer_free(c.w);
    if (c.f && (fflush(c.f) != 0 || fsync(fileno(c.f)) != 0 || fclose(c.f) != 0) && rc == KVR_OK)
        rc = KVR_EIO;
    free(c.ranks);
    *events = c.events;
    return rc;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL || fseek(f, 0, SEEK_END) != 0) {
        if (f)
            fclose(f);
        return NULL;
    }
    long n = ftell(f);
    uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
    rewind(f);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Checks and applies the file into a new index; the pairs it ends with. */
static int load(const uint8_t *buf, size_t len, uint64_t budget, double *check_ms,
                double *load_ms, uint64_t *pairs)
{
    kvr_snap_reader_t r;
    char err[200];
    uint64_t t0 = kvr_bench_now_ns();
    int rc = kvr_snap_open(&r, buf, len, err, sizeof err);
    uint64_t t1 = kvr_bench_now_ns();
    if (rc != KVR_OK) {
        fprintf(stderr, "bench snapshot: %s\n", err);
        return rc;
    }
    kvr_index_config_t ic = {.max_pairs = budget, .sync = KVR_SYNC_RCU};
    kvr_index_t *ix = kvr_index_new(&ic, &rc);
    uint32_t rank;
    kvr_event_t ev;
    while (ix && kvr_snap_next(&r, &rank, &ev) == KVR_OK)
        if ((rc = kvr_index_apply(ix, &ev)) != KVR_OK)
            break;
    uint64_t t2 = kvr_bench_now_ns();
    kvr_index_stats_t s = {0};
    if (ix)
        kvr_index_stats(ix, &s);
    *pairs = s.pairs;
    *check_ms = (double)(t1 - t0) / 1e6;
    *load_ms = (double)(t2 - t1) / 1e6;
    kvr_index_free(ix);
    kvr_snap_close(&r);
    return rc;
}

static int run_config(const kvr_bench_opts_t *o, uint64_t pairs, uint32_t workers)
{
    char path[512];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvrouter-bench-%d.state", dir && *dir ? dir : "/tmp",
             (int)getpid());
    int rc;
    kvr_index_config_t ic = {.max_pairs = pairs + pairs / 8, .sync = KVR_SYNC_RCU};
    kvr_index_t *ix = kvr_index_new(&ic, &rc);
    kvr_wl_config_t wc = {workers, pairs, o->seed ^ (pairs * 17 + workers)};
    kvr_wl_t *wl = kvr_wl_new(&wc);
    if (ix == NULL || wl == NULL || (rc = kvr_wl_fill(wl, ix, pairs)) != KVR_OK) {
        fprintf(stderr, "bench snapshot: cannot build the index: %s\n", kvr_strerror(rc));
        kvr_wl_free(wl);
        kvr_index_free(ix);
        return 1;
    }
    kvr_index_stats_t s;
    kvr_index_stats(ix, &s);
    double *f = calloc(3 * o->runs, sizeof *f);
    double *fsave = f, *fcheck = f + o->runs, *fload = f + 2 * o->runs;
    uint64_t events = 0, got = 0;
    size_t len = 0;
    for (unsigned r = 0; f && rc == KVR_OK && r < o->runs; r++) {
        uint64_t t0 = kvr_bench_now_ns();
        rc = save(ix, workers, path, &events);
        fsave[r] = (double)(kvr_bench_now_ns() - t0) / 1e6;
        uint8_t *buf = rc == KVR_OK ? read_all(path, &len) : NULL;
        if (rc == KVR_OK)
            rc = buf ? load(buf, len, ic.max_pairs, &fcheck[r], &fload[r], &got) : KVR_EIO;
        free(buf);
        if (rc == KVR_OK && got != s.pairs) {
            fprintf(stderr, "bench snapshot: reloaded %llu pairs of %llu\n",
                    (unsigned long long)got, (unsigned long long)s.pairs);
            rc = KVR_EINVAL;
        }
    }
    unlink(path);
    if (rc == KVR_OK && f) {
        kvr_bench_row_t row;
        kvr_bench_row_init(&row, COLS, N_COLS);
        kvr_bench_set_str(&row, "bench", "snapshot");
        kvr_bench_set_int(&row, "pairs", (int64_t)s.pairs);
        kvr_bench_set_int(&row, "workers", workers);
        kvr_bench_set_int(&row, "events", (int64_t)events);
        kvr_bench_set_int(&row, "runs", o->runs);
        kvr_bench_set_num(&row, "file_mb", (double)len / 1e6);
        kvr_bench_set_num(&row, "bytes_per_pair", (double)len / (double)s.pairs);
        double load_ms = kvr_bench_median(fload, o->runs);
        kvr_bench_set_num(&row, "save_ms", kvr_bench_median(fsave, o->runs));
        kvr_bench_set_num(&row, "check_ms", kvr_bench_median(fcheck, o->runs));
        kvr_bench_set_num(&row, "load_ms", load_ms);
        kvr_bench_set_num(&row, "load_pairs_per_s", (double)s.pairs / (load_ms / 1e3));
        kvr_bench_print_row(o, &row);
    } else if (rc != KVR_OK) {
        fprintf(stderr, "bench snapshot: %s\n", kvr_strerror(rc));
    }
    free(f);
    kvr_wl_free(wl);
    kvr_index_free(ix);
    return rc == KVR_OK ? 0 : 1;
}

int kvr_bench_snapshot(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_pairs = {1, {1000000}};
    static const kvr_bench_list_t def_workers = {1, {64}};
    const kvr_bench_list_t *pairs = kvr_bench_pick(&o->pairs, &def_pairs);
    const kvr_bench_list_t *workers = kvr_bench_pick(&o->workers, &def_workers);
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t p = 0; p < pairs->n; p++)
        for (size_t w = 0; w < workers->n; w++)
            if (run_config(o, pairs->v[p], (uint32_t)workers->v[w]) != 0)
                return 1;
    return 0;
}

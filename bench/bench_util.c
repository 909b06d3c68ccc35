/*
 * bench_util.c: the helpers every benchmark shares (see bench.h): PRNG, timer and its
 * calibrated overhead, percentiles, option lists, the table / JSON-lines printer, and starting
 * a child process with its log (kvr_bench_spawn).
 * Measures nothing itself; kvr_bench_timer_overhead_ns() times 20000 empty intervals once.
 * Invariants: the PRNG is deterministic from its seed. Ownership: rows and lists are the
 * caller's; a spawned child is the caller's to stop. Threads: reentrant (no globals but the
 * calibrated overhead, computed once). Cost: a median sorts a copy of its runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/child.h"
#include "base/rng.h"
#include "bench.h"

/* ---- PRNG: splitmix64 seeds xoshiro256** (Blackman & Vigna) ------------------------------ */

uint64_t kvr_bench_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t kvr_bench_splitmix64(uint64_t *state) { return kvr_splitmix64(state); }

void kvr_bench_rng_seed(kvr_bench_rng_t *r, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = kvr_bench_splitmix64(&st);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvr_bench_rng_next(kvr_bench_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t kvr_bench_rng_below(kvr_bench_rng_t *r, uint64_t n)
{
    if (n <= UINT32_MAX)
        return ((kvr_bench_rng_next(r) >> 32) * n) >> 32;
    return kvr_bench_rng_next(r) % n;
}

double kvr_bench_rng_unit(kvr_bench_rng_t *r)
{
    return (double)(kvr_bench_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t kvr_bench_rng_logu(kvr_bench_rng_t *r, uint64_t lo, uint64_t hi)
{
    double l = log((double)lo), h = log((double)hi + 1.0);
    uint64_t v = (uint64_t)exp(l + (h - l) * kvr_bench_rng_unit(r));
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- time ------------------------------------------------------------------------------- */

uint64_t kvr_bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double kvr_bench_timer_overhead_ns(void)
{
    static double overhead = -1.0;
    if (overhead >= 0.0)
        return overhead;
    enum { N = 20000 };
    double *v = malloc(N * sizeof *v);
    if (v == NULL)
        return 0.0;
    for (int i = 0; i < N; i++) {
        uint64_t t0 = kvr_bench_now_ns();
        uint64_t t1 = kvr_bench_now_ns();
        v[i] = (double)(t1 - t0);
    }
    overhead = kvr_bench_median(v, N);
    free(v);
    return overhead;
}

void kvr_bench_sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

/* ---- statistics ------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void kvr_bench_sort(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
}

double kvr_bench_pct_sorted(const double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t rank = (size_t)ceil(p * (double)n);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

double kvr_bench_median(double *v, size_t n)
{
    if (n == 0)
        return NAN;
    kvr_bench_sort(v, n);
    if (n % 2)
        return v[n / 2];
    return (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

void kvr_bench_summarize(double *ns, size_t n, kvr_bench_lat_t *out)
{
    double ov = kvr_bench_timer_overhead_ns(), sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        ns[i] = ns[i] > ov ? ns[i] - ov : 0.0;
        sum += ns[i];
    }
    kvr_bench_sort(ns, n);
    out->p50_us = kvr_bench_pct_sorted(ns, n, 0.50) / 1e3;
    out->p99_us = kvr_bench_pct_sorted(ns, n, 0.99) / 1e3;
    out->p999_us = kvr_bench_pct_sorted(ns, n, 0.999) / 1e3;
    out->mean_us = n ? sum / (double)n / 1e3 : NAN;
}

/* ---- options ---------------------------------------------------------------------------- */

const kvr_bench_list_t *kvr_bench_pick(const kvr_bench_list_t *given,
                                       const kvr_bench_list_t *defaults)
{
    return given->n > 0 ? given : defaults;
}

bool kvr_bench_list_has(const kvr_bench_list_t *l, uint64_t v)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] == v)
            return true;
    return false;
}

const char *kvr_bench_query_name(uint64_t q)
{
    switch (q) {
    case KVR_BENCH_Q_FULL:
        return "full";
    case KVR_BENCH_Q_PARTIAL:
        return "partial";
    default:
        return "miss";
    }
}

const char *kvr_bench_sync_name(uint64_t s)
{
    switch (s) {
    case KVR_SYNC_RCU:
        return "rcu";
    case KVR_SYNC_RWLOCK:
        return "rwlock";
    default:
        return "none";
    }
}

const char *kvr_bench_rate_name(uint64_t per_s, char *buf, size_t len)
{
    if (per_s == 0)
        snprintf(buf, len, "none");
    else if (per_s == KVR_BENCH_WRITER_MAX)
        snprintf(buf, len, "max");
    else if (per_s % 1000000 == 0)
        snprintf(buf, len, "%lluM/s", (unsigned long long)(per_s / 1000000));
    else if (per_s % 1000 == 0)
        snprintf(buf, len, "%lluK/s", (unsigned long long)(per_s / 1000));
    else
        snprintf(buf, len, "%llu/s", (unsigned long long)per_s);
    return buf;
}

/* ---- output ----------------------------------------------------------------------------- */

void kvr_bench_row_init(kvr_bench_row_t *row, const kvr_bench_col_t *cols, size_t n)
{
    memset(row, 0, sizeof *row);
    row->cols = cols;
    row->n = n < KVR_BENCH_MAX_COLS ? n : KVR_BENCH_MAX_COLS;
}

static kvr_bench_val_t *field(kvr_bench_row_t *row, const char *name)
{
    for (size_t i = 0; i < row->n; i++)
        if (strcmp(row->cols[i].name, name) == 0)
            return &row->v[i];
    fprintf(stderr, "kvrouter bench: internal error: no column '%s'\n", name);
    abort();
}

void kvr_bench_set_str(kvr_bench_row_t *row, const char *name, const char *s)
{
    kvr_bench_val_t *v = field(row, name);
    v->set = s != NULL;
    v->s = s;
}

void kvr_bench_set_int(kvr_bench_row_t *row, const char *name, int64_t i)
{
    kvr_bench_val_t *v = field(row, name);
    v->set = true;
    v->i = i;
}

void kvr_bench_set_num(kvr_bench_row_t *row, const char *name, double d)
{
    kvr_bench_val_t *v = field(row, name);
    v->set = isfinite(d);
    v->d = d;
}

void kvr_bench_print_header(const kvr_bench_opts_t *o, const kvr_bench_col_t *cols, size_t n)
{
    if (o->json)
        return;
    const char *sep = "";
    for (size_t i = 0; i < n; i++) {
        if (cols[i].width == 0)
            continue;
        if (cols[i].kind == KVR_BENCH_STR)
            printf("%s%-*s", sep, cols[i].width, cols[i].name);
        else
            printf("%s%*s", sep, cols[i].width, cols[i].name);
        sep = "  ";
    }
    printf("\n");
    fflush(stdout);
}

/* JSON strings here are our own identifiers and labels; escape anyway. */
static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void print_json(const kvr_bench_row_t *row)
{
    const char *sep = "{";
    for (size_t i = 0; i < row->n; i++) {
        const kvr_bench_col_t *c = &row->cols[i];
        const kvr_bench_val_t *v = &row->v[i];
        if (!v->set)
            continue;
        printf("%s\"%s\":", sep, c->name);
        sep = ",";
        if (c->kind == KVR_BENCH_STR)
            json_string(v->s);
        else if (c->kind == KVR_BENCH_INT)
            printf("%lld", (long long)v->i);
        else
            printf("%.*f", c->prec, v->d);
    }
    printf("}\n");
}

static void print_table_row(const kvr_bench_row_t *row)
{
    const char *sep = "";
    for (size_t i = 0; i < row->n; i++) {
        const kvr_bench_col_t *c = &row->cols[i];
        const kvr_bench_val_t *v = &row->v[i];
        if (c->width == 0)
            continue;
        printf("%s", sep);
        sep = "  ";
        if (!v->set)
            printf(c->kind == KVR_BENCH_STR ? "%-*s" : "%*s", c->width, "-");
        else if (c->kind == KVR_BENCH_STR)
            printf("%-*s", c->width, v->s);
        else if (c->kind == KVR_BENCH_INT)
            printf("%*lld", c->width, (long long)v->i);
        else
            printf("%*.*f", c->width, c->prec, v->d);
    }
    printf("\n");
}

void kvr_bench_print_row(const kvr_bench_opts_t *o, const kvr_bench_row_t *row)
{
    if (o->json)
        print_json(row);
    else
        print_table_row(row);
    fflush(stdout);
}

/* ---- children ---------------------------------------------------------------------------- */

bool kvr_bench_spawn(struct kvr_child *c, const char *dir, const char *what, char **argv,
                     const char *who)
{
    char log[1024], err[300];
    snprintf(log, sizeof log, "%.400s/%.60s.log", dir, what);
    if (kvr_child_start(c, what, argv, log, err, sizeof err) == KVR_OK)
        return true;
    fprintf(stderr, "%s: %s\n", who, err);
    kvr_child_show_log(c);
    kvr_child_stop(c);
    return false;
}

bool kvr_bench_workdir(char *dir, size_t cap, const char *name, const char *who)
{
    char err[300];
    if (kvr_child_workdir(dir, cap, name, err, sizeof err) == KVR_OK)
        return true;
    fprintf(stderr, "%s: %s\n", who, err);
    return false;
}

void kvr_bench_children_stop(struct kvr_child *kids, size_t n)
{
    for (size_t i = n; i-- > 0;)
        kvr_child_stop(&kids[i]);
}

void kvr_bench_workdir_end(const char *dir, int rc, const char *who)
{
    if (rc != 0)
        fprintf(stderr, "%s: failed; logs kept in %s\n", who, dir);
    else
        kvr_child_rmtree(dir);
}

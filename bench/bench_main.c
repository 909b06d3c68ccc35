/*
 * bench_main.c: `kvrouter bench {hash|index|ingest|all}`: parses and validates the options
 * and runs the benchmarks (each described in its own file). Measures nothing itself.
 * Exit codes: 0 success, 1 a benchmark failed, 2 usage error (naming the option).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "apps/apps.h"
#include "bench.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter bench {hash|index|ingest|all} [options]\n"
            "\n"
            "  hash     us per prompt: local block hashes + sequence hashes\n"
            "  index    us per prefix-index lookup, with and without a concurrent writer,\n"
            "           against the machine's floor (dependent random loads)\n"
            "  ingest   block mutations per second applied by one thread\n"
            "  all      the three, with their default parameters\n"
            "\n"
            "options:\n"
            "  --json            one JSON object per measured point per line\n"
            "  --runs N          runs per point; figures are medians of the runs (3)\n"
            "  --quick           smaller parameter sets (bench all --quick < 60 s)\n"
            "  --seed N          PRNG seed (1)\n"
            "parameter filters (comma-separated lists; replace the defaults):\n"
            "  --tokens N        hash: prompt tokens (8192,131072); K = 1024\n"
            "  --block-size N    hash: tokens per block (16,64)\n"
            "  --pairs N         index, ingest: (worker, block) pairs (1M,16M / 1M); K = 1e3, "
            "M = 1e6\n"
            "  --workers N       index, ingest: worker count (4,64,1000 / 64)\n"
            "  --depth N         index: query blocks (32,128,512,2048,8192; quick: 32,512)\n"
            "  --query Q         index: full, partial, miss\n"
            "  --writer W        index: none, max, or a rate such as 1M/s (none,1M/s)\n"
            "  --sync S          index, ingest: rcu, rwlock, none (index: rcu + rwlock at the\n"
            "                    key point; ingest: none,rcu)\n");
}

static int usage_error(const char *opt, const char *why)
{
    fprintf(stderr, "kvrouter bench: %s: %s\n", opt, why);
    fprintf(stderr, "'kvrouter bench --help' lists the options\n");
    return 2;
}

/* An unsigned count with an optional suffix: K/M/G multiply by k, k^2, k^3. */
static bool parse_count(const char *s, uint64_t k, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0)
        return false;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = k, end++;
    else if (*end == 'M' || *end == 'm')
        mul = k * k, end++;
    else if (*end == 'G' || *end == 'g')
        mul = k * k * k, end++;
    if (*end != '\0' || (mul > 1 && v > UINT64_MAX / mul))
        return false;
    *out = (uint64_t)v * mul;
    return true;
}

static bool parse_query(const char *s, uint64_t *out)
{
    static const char *names[] = {"full", "partial", "miss"};
    for (uint64_t i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0)
            return *out = i, true;
    return false;
}

static bool parse_sync(const char *s, uint64_t *out)
{
    if (strcmp(s, "rcu") == 0)
        return *out = KVR_SYNC_RCU, true;
    if (strcmp(s, "rwlock") == 0)
        return *out = KVR_SYNC_RWLOCK, true;
    if (strcmp(s, "none") == 0)
        return *out = KVR_SYNC_NONE, true;
    return false;
}

static bool parse_writer(const char *s, uint64_t *out)
{
    if (strcmp(s, "none") == 0 || strcmp(s, "0") == 0)
        return *out = 0, true;
    if (strcmp(s, "max") == 0)
        return *out = KVR_BENCH_WRITER_MAX, true;
    char buf[64];
    size_t n = strlen(s);
    if (n >= sizeof buf)
        return false;
    memcpy(buf, s, n + 1);
    if (n > 2 && strcmp(buf + n - 2, "/s") == 0)
        buf[n - 2] = '\0';
    return parse_count(buf, 1000, out) && *out > 0 && *out < KVR_BENCH_WRITER_MAX;
}

typedef enum { P_COUNT, P_QUERY, P_SYNC, P_WRITER } ptype_t;

typedef struct listopt {
    const char *name;
    const char *alias;
    ptype_t type;
    uint64_t k; /* suffix base for counts */
    uint64_t min, max;
    size_t off;
} listopt_t;

#define OFF(f) offsetof(kvr_bench_opts_t, f)
static const listopt_t LISTOPTS[] = {
    {"--tokens", NULL, P_COUNT, 1024, 1, (uint64_t)1 << 22, OFF(tokens)},
    {"--block-size", "--block_size", P_COUNT, 1024, 1, 65536, OFF(block_size)},
    {"--pairs", NULL, P_COUNT, 1000, 10000, 1000000000, OFF(pairs)},
    {"--workers", NULL, P_COUNT, 1000, 1, KVR_INDEX_MAX_WORKERS, OFF(workers)},
    {"--depth", NULL, P_COUNT, 1024, 1, 32768, OFF(depth)},
    {"--query", NULL, P_QUERY, 0, 0, 0, OFF(query)},
    {"--writer", NULL, P_WRITER, 0, 0, 0, OFF(writer)},
    {"--sync", NULL, P_SYNC, 0, 0, 0, OFF(sync)},
};

/* Parses a comma-separated list into l (replacing it). 0 or a usage error. */
static int parse_list(const listopt_t *lo, const char *val, kvr_bench_list_t *l)
{
    char buf[256];
    if (strlen(val) >= sizeof buf || *val == '\0')
        return usage_error(lo->name, "bad value");
    strcpy(buf, val);
    l->n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v = 0;
        bool ok;
        switch (lo->type) {
        case P_COUNT:
            ok = parse_count(tok, lo->k, &v) && v >= lo->min && v <= lo->max;
            break;
        case P_QUERY:
            ok = parse_query(tok, &v);
            break;
        case P_SYNC:
            ok = parse_sync(tok, &v);
            break;
        default:
            ok = parse_writer(tok, &v);
            break;
        }
        if (!ok) {
            char why[320];
            snprintf(why, sizeof why, "bad value '%s'", tok);
            return usage_error(lo->name, why);
        }
        if (l->n == KVR_BENCH_MAX_LIST)
            return usage_error(lo->name, "too many values");
        if (!kvr_bench_list_has(l, v))
            l->v[l->n++] = v;
    }
    if (l->n == 0)
        return usage_error(lo->name, "bad value");
    return 0;
}

/* --name value or --name=value: the value, or NULL (and *i unchanged) when opt is not name. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

int kvr_cmd_bench(int argc, char **argv)
{
    kvr_bench_opts_t o;
    memset(&o, 0, sizeof o);
    o.runs = 3;
    o.seed = 1;
    const char *which = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool missing = false;
        const char *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (which != NULL)
                return usage_error(a, "unexpected argument (one benchmark at a time)");
            if (strcmp(a, "hash") && strcmp(a, "index") && strcmp(a, "ingest") &&
                strcmp(a, "all"))
                return usage_error(a, "unknown benchmark (hash, index, ingest, all)");
            which = a;
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            o.json = true;
            continue;
        }
        if (strcmp(a, "--quick") == 0) {
            o.quick = true;
            continue;
        }
        if ((v = opt_value(argc, argv, &i, "--runs", &missing)) != NULL) {
            uint64_t n;
            if (!parse_count(v, 1, &n) || n < 1 || n > 1000)
                return usage_error("--runs", "expects an integer in 1..1000");
            o.runs = (unsigned)n;
            continue;
        }
        if (missing)
            return usage_error("--runs", "missing value");
        if ((v = opt_value(argc, argv, &i, "--seed", &missing)) != NULL) {
            if (!parse_count(v, 1, &o.seed))
                return usage_error("--seed", "expects an unsigned integer");
            continue;
        }
        if (missing)
            return usage_error("--seed", "missing value");
        const listopt_t *lo = NULL;
        for (size_t k = 0; k < sizeof LISTOPTS / sizeof LISTOPTS[0] && lo == NULL; k++) {
            v = opt_value(argc, argv, &i, LISTOPTS[k].name, &missing);
            if (v == NULL && !missing && LISTOPTS[k].alias)
                v = opt_value(argc, argv, &i, LISTOPTS[k].alias, &missing);
            if (missing)
                return usage_error(LISTOPTS[k].name, "missing value");
            if (v != NULL)
                lo = &LISTOPTS[k];
        }
        if (lo == NULL)
            return usage_error(a, "unknown option");
        int rc = parse_list(lo, v, (kvr_bench_list_t *)((char *)&o + lo->off));
        if (rc != 0)
            return rc;
    }
    if (which == NULL)
        return usage_error("bench", "which benchmark? (hash, index, ingest, all)");

    kvr_bench_timer_overhead_ns(); /* calibrate before anything is timed */
    bool all = strcmp(which, "all") == 0;
    int rc = 0;
    if (rc == 0 && (all || strcmp(which, "hash") == 0))
        rc = kvr_bench_hash(&o);
    if (rc == 0 && all && !o.json)
        printf("\n");
    if (rc == 0 && (all || strcmp(which, "index") == 0))
        rc = kvr_bench_index(&o);
    if (rc == 0 && all && !o.json)
        printf("\n");
    if (rc == 0 && (all || strcmp(which, "ingest") == 0))
        rc = kvr_bench_ingest(&o);
    return rc;
}

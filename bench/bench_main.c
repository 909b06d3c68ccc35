/*
 * bench_main.c: `kvrouter bench {hash|index|ingest|snapshot|route|events|mocker|frontend|all}`:
 * parses and validates the
 * options and runs the benchmarks (each described in its own file). Measures nothing itself.
 * Exit codes: 0 success, 1 a benchmark failed, 2 usage error (naming the option).
 */
#include <errno.h>
#include <limits.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "apps/child.h"
#include "bench.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: kvrouter bench "
                 "{hash|index|ingest|snapshot|route|events|mocker|frontend|indexer|mooncake|sync|\n"
                 "                      tokenize|hashtab|all} "
                 "[options]\n"
                 "\n"
                 "  hash     us per prompt: local block hashes + sequence hashes\n"
                 "  index    us per prefix-index lookup, with and without a concurrent writer,\n"
                 "           against the machine's floor (dependent random loads)\n"
                 "  ingest   block mutations per second applied by one thread\n"
                 "  snapshot warm restart: ms to save the index to a state file, check it and\n"
                 "           reload it (--pairs, 1M; --workers, 64)\n"
                 "  route    requests/s and latency of a running router's POST /v1/route, from\n"
                 "           closed-loop keep-alive HTTP clients (needs `kvrouter serve`)\n"
                 "  events   KV events per second through `kvrouter serve`'s ingest thread, from\n"
                 "           in-process engine publishers over ZeroMQ to the index (blocks/s)\n"
                 "  mocker   requests/s one `kvrouter mocker` serves on one CPU (it spawns one,\n"
                 "           pinned, KV events on), its CPU and step lag; see\n"
                 "           'kvrouter bench mocker --help'\n"
                 "  frontend the time to first token the router's OpenAI front end adds: spawns a\n"
                 "           mocker and `kvrouter serve` in front of it, sends streaming prompts\n"
                 "           from 1 client straight and through the router, alternately\n"
                 "           (--tokens, 8192; --requests per path and run, 200; --runs; --rate R:\n"
                 "           paced; --speedup, 1000; --max-tokens; --mocker-arg F or -- F...;\n"
            "           --disagg: a prefill and a decode mocker, the client doing vLLM's\n"
            "           proxy protocol itself against the router doing it; --tokenizer DIR:\n"
            "           chats of about --tokens tokens, DIR's tokenizer in the mocker, one\n"
            "           router tokenizing in process and one asking the mocker's /tokenize)\n");
    fprintf(out,
            "  tokenize the in-process tokenizer per model: load, MB/s, tokens/s; --compare\n"
            "           against HF tokenizers (its own flags: 'kvrouter bench tokenize --help')\n"
            "  mooncake the reference's indexer harness: a trace's events and lookups replayed\n"
            "           together open loop over thousands of simulated workers (see 'kvrouter\n"
            "           bench mooncake --help')\n"
            "  indexer  the standalone indexer: POST /query_by_hash per second and latency, a\n"
            "           router's decision with a remote indexer, peer recovery (spawns them;\n"
            "           see 'kvrouter bench indexer --help')\n"
            "  hashtab  ns per find / insert / delete on the load tracker's block table:\n"
            "           our table template against ck_hs and uthash (--pairs, 1M)\n"
            "  all      hash, index and ingest, with their default parameters\n"
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
            "                    key point; ingest: none,rcu)\n"
            "route (a load generator; it needs a router listening at --url):\n"
            "  --url URL         the router (http://127.0.0.1:8080)\n"
            "  --clients N       concurrent keep-alive clients, one request each in flight;\n"
            "                    a list gives several points (32)\n"
            "  --tokens N        prompt tokens per request; a list (1024; e.g. 1K,128K)\n"
            "  --duration S      measured seconds per run (10)\n"
            "  --warmup S        unmeasured seconds before each run (2)\n"
            "  --requests N      stop each run after N measured responses instead\n"
            "  --prefix-share F  fraction of each prompt taken from 8 shared prefixes (0.5)\n"
            "  --update-state B  true: the router books each request and the client DELETEs\n"
            "                    /v1/requests/{id} after it (false)\n"
            "  --threads N       client event-loop threads (" KVR_BENCH_ROUTE_THREADS_STR ")\n"
            "  --rate R          pace the clients to R requests/s in all (e.g. 30K); by\n"
            "                    default each sends its next request on the response (0)\n"
            "  a run fails (exit 1) when more than 1%% of its requests fail\n"
            "events (vLLM-format batches of 1-3 events, 32 blocks x 16 tokens per store):\n"
            "  --workers N       engine publishers (4)\n"
            "  --pairs N         index budget; half of it is held in the steady state (2M)\n"
            "  --rate R          pace the publishers to R blocks/s in all (unpaced)\n"
            "  --publish ADDR    only publish one engine's stream, bound at ADDR as vLLM does\n"
            "                    (e.g. tcp://127.0.0.1:5557), for an external `kvrouter serve`\n"
            "                    at --rate R blocks/s (unpaced) for --duration S seconds (10)\n");
}

static int usage_error(const char *opt, const char *why)
{
    fprintf(stderr, "kvrouter bench: %s: %s\n", opt, why);
    fprintf(stderr, "'kvrouter bench --help' lists the options\n");
    return 2;
}

int kvr_bench_frontend(const kvr_bench_opts_t *o); /* bench_frontend.c */

/* 'bench frontend' takes --tokens, --requests, --runs, --seed, --json, --rate, --speedup,
 * --max-tokens and mocker flags; it always streams and spawns its own children. */
static int run_frontend(const kvr_bench_opts_t *o)
{
    const char *bad = o->url_set ? "--url" : o->clients.n ? "--clients"
                      : o->update_state ? "--update-state"
                      : o->mocker_cpu_set ? "--mocker-cpu" : !o->stream ? "--stream"
                      : o->publish ? "--publish" : o->quick ? "--quick"
                      : o->workers.n ? "--workers" : o->pairs.n ? "--pairs"
                      : o->depth.n ? "--depth" : o->block_size.n ? "--block-size"
                      : o->query.n ? "--query" : o->writer.n ? "--writer"
                      : o->sync.n ? "--sync" : NULL;
    if (bad != NULL)
        return usage_error(bad, "not an option of 'bench frontend' (see --help)");
    if (o->disagg && o->tokenizer != NULL)
        return usage_error("--tokenizer", "measured aggregated only (not with --disagg)");
    kvr_bench_timer_overhead_ns();
    return kvr_bench_frontend(o);
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

/* A real number in [min, max] (no suffix). */
static bool parse_real(const char *s, double min, double max, double *out)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno != 0 || !(v >= min && v <= max))
        return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *s, bool *out)
{
    if (strcmp(s, "true") == 0 || strcmp(s, "1") == 0)
        return *out = true, true;
    if (strcmp(s, "false") == 0 || strcmp(s, "0") == 0)
        return *out = false, true;
    return false;
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
    {"--clients", NULL, P_COUNT, 1000, 1, 4096, OFF(clients)},
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

/* The route-only scalar options. */
typedef enum {
    R_URL, R_DURATION, R_WARMUP, R_REQUESTS, R_SHARE, R_UPDATE, R_THREADS, R_RATE
} ropt_t;

static const struct {
    const char *name, *alias;
    ropt_t id;
} ROUTEOPTS[] = {
    {"--url", NULL, R_URL},
    {"--duration", NULL, R_DURATION},
    {"--warmup", NULL, R_WARMUP},
    {"--requests", NULL, R_REQUESTS},
    {"--prefix-share", "--prefix_share", R_SHARE},
    {"--update-state", "--update_state", R_UPDATE},
    {"--threads", NULL, R_THREADS},
    {"--rate", NULL, R_RATE},
};

/* Validates and stores one route option's value. 0 or a usage error. */
static int set_route_opt(ropt_t id, const char *name, const char *v, kvr_bench_opts_t *o)
{
    uint64_t n = 0;
    char why[600];
    switch (id) {
    case R_URL:
        if (!kvr_bench_route_url_ok(v, why, sizeof why))
            return usage_error(name, why);
        o->url = v;
        o->url_set = true;
        return 0;
    case R_DURATION:
        if (!parse_real(v, 1e-3, 86400, &o->duration_s))
            return usage_error(name, "expects seconds in (0, 86400]");
        return 0;
    case R_WARMUP:
        if (!parse_real(v, 0, 3600, &o->warmup_s))
            return usage_error(name, "expects seconds in [0, 3600]");
        return 0;
    case R_REQUESTS:
        if (!parse_count(v, 1000, &n) || n < 1 || n > 1000000000000ull)
            return usage_error(name, "expects a count >= 1 (K = 1e3, M = 1e6)");
        o->requests = n;
        return 0;
    case R_SHARE:
        if (!parse_real(v, 0, 1, &o->prefix_share))
            return usage_error(name, "expects a fraction in [0, 1]");
        return 0;
    case R_UPDATE:
        if (!parse_bool(v, &o->update_state))
            return usage_error(name, "expects true or false");
        return 0;
    case R_THREADS:
        if (!parse_count(v, 1, &n) || n < 1 || n > 64)
            return usage_error(name, "expects an integer in 1..64");
        o->threads = (unsigned)n;
        return 0;
    case R_RATE:
        if (!parse_count(v, 1000, &n) || n > 100000000)
            return usage_error(name, "expects requests/s (K = 1e3, M = 1e6; 0 = unpaced)");
        o->rate_per_s = (double)n;
        return 0;
    }
    return usage_error(name, "unknown option");
}

/* A route option at argv[*i]: 0, a usage error, or -1 when it is none of them. *seen keeps
 * the first one given (other benchmarks reject it). */
static int parse_route_opt(int argc, char **argv, int *i, kvr_bench_opts_t *o,
                           const char **seen)
{
    for (size_t k = 0; k < sizeof ROUTEOPTS / sizeof ROUTEOPTS[0]; k++) {
        bool missing = false;
        const char *v = opt_value(argc, argv, i, ROUTEOPTS[k].name, &missing);
        if (v == NULL && !missing && ROUTEOPTS[k].alias)
            v = opt_value(argc, argv, i, ROUTEOPTS[k].alias, &missing);
        if (missing)
            return usage_error(ROUTEOPTS[k].name, "missing value");
        if (v == NULL)
            continue;
        if (*seen == NULL)
            *seen = ROUTEOPTS[k].name;
        return set_route_opt(ROUTEOPTS[k].id, ROUTEOPTS[k].name, v, o);
    }
    return -1;
}

/* A 'bench mocker' option at argv[*i]: 0, a usage error, or -1 when it is none of them.
 * *seen keeps the first one given (other benchmarks reject it). */
static int parse_mocker_opt(int argc, char **argv, int *i, kvr_bench_opts_t *o,
                            const char **seen)
{
    static const char *names[] = {"--max-tokens", "--stream", "--speedup", "--mocker-cpu",
                                  "--mocker-arg"};
    bool missing = false;
    const char *v = NULL;
    size_t k = 0;
    for (; k < sizeof names / sizeof names[0] && v == NULL && !missing; k++)
        v = opt_value(argc, argv, i, names[k], &missing);
    if (missing)
        return usage_error(names[k - 1], "missing value");
    if (v == NULL)
        return -1;
    const char *name = names[k - 1];
    if (*seen == NULL)
        *seen = name;
    uint64_t n;
    switch (k - 1) {
    case 0:
        if (!parse_count(v, 1024, &n) || n < 1 || n > 1048576)
            return usage_error(name, "expects an integer in 1..1M (K = 1024)");
        o->max_tokens = n;
        return 0;
    case 1:
        if (!parse_bool(v, &o->stream))
            return usage_error(name, "expects true or false");
        return 0;
    case 2:
        if (!parse_real(v, 1e-6, 1e9, &o->speedup))
            return usage_error(name, "expects a number in [1e-6, 1e9]");
        o->speedup_set = true;
        return 0;
    case 3:
        if (!parse_count(v, 1, &n) || n > 1023)
            return usage_error(name, "expects a CPU number in 0..1023");
        o->mocker_cpu = (unsigned)n;
        o->mocker_cpu_set = true;
        return 0;
    default:
        if (o->n_mocker_args == KVR_BENCH_MAX_MOCKER_ARGS)
            return usage_error(name, "too many mocker flags");
        o->mocker_args[o->n_mocker_args++] = v;
        return 0;
    }
}

static int bench_run(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "sync") == 0)
        return kvr_bench_sync(argc - 1, argv + 1); /* its own flags (bench_sync.c) */
    if (argc >= 2 && strcmp(argv[1], "indexer") == 0)
        return kvr_bench_indexer(argc - 1, argv + 1); /* its own flags (bench_indexer.c) */
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0)
        return kvr_bench_tokenize(argc - 1, argv + 1); /* its own flags (bench_tokenize.c) */
    if (argc >= 2 && strcmp(argv[1], "mooncake") == 0)
        return kvr_bench_mooncake(argc - 1, argv + 1); /* its own flags (bench_mooncake.c) */
    kvr_bench_opts_t o;
    memset(&o, 0, sizeof o);
    o.runs = 3;
    o.seed = 1;
    o.url = "http://127.0.0.1:8080";
    o.duration_s = 10.0;
    o.warmup_s = 2.0;
    o.prefix_share = 0.5;
    o.threads = KVR_BENCH_ROUTE_THREADS;
    o.max_tokens = 16;
    o.stream = true;
    o.speedup = 1000.0;
    const char *which = NULL;
    const char *route_opt = NULL;
    const char *not_events = NULL; /* a route option other than --rate and --duration */
    const char *not_mocker = NULL; /* a route option 'bench mocker' does not take */
    const char *mocker_opt = NULL; /* an option of 'bench mocker' only */

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool missing = false;
        const char *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            if (which != NULL && strcmp(which, "mocker") == 0)
                kvr_bench_mocker_usage(stdout);
            else
                usage(stdout);
            return 0;
        }
        if (strcmp(a, "--") == 0) { /* the rest: flags for the spawned mocker */
            for (i++; i < argc; i++) {
                if (o.n_mocker_args == KVR_BENCH_MAX_MOCKER_ARGS)
                    return usage_error("--", "too many mocker flags");
                o.mocker_args[o.n_mocker_args++] = argv[i];
            }
            mocker_opt = "--";
            break;
        }
        if (a[0] != '-') {
            if (which != NULL)
                return usage_error(a, "unexpected argument (one benchmark at a time)");
            if (strcmp(a, "events") == 0 || strcmp(a, "mocker") == 0 ||
                strcmp(a, "frontend") == 0) {
                which = a; /* bench_events.c, bench_mocker.c, bench_frontend.c */
                continue;
            }
            if (strcmp(a, "hash") && strcmp(a, "index") && strcmp(a, "ingest") &&
                strcmp(a, "snapshot") && strcmp(a, "route") && strcmp(a, "hashtab") &&
                strcmp(a, "all"))
                return usage_error(a, "unknown benchmark (hash, index, ingest, snapshot, route, "
                                      "hashtab, all)");
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
        if (strcmp(a, "--disagg") == 0) {
            o.disagg = true;
            continue;
        }
        if ((v = opt_value(argc, argv, &i, "--tokenizer", &missing)) != NULL) {
            o.tokenizer = v;
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
        if ((v = opt_value(argc, argv, &i, "--publish", &missing)) != NULL) {
            o.publish = v;
            continue;
        }
        if (missing)
            return usage_error("--publish", "missing value");
        int mrc = parse_mocker_opt(argc, argv, &i, &o, &mocker_opt);
        if (mrc >= 0) {
            if (mrc != 0)
                return mrc;
            continue;
        }
        int rrc = parse_route_opt(argc, argv, &i, &o, &route_opt);
        if (rrc >= 0) {
            if (rrc != 0)
                return rrc;
            if (strncmp(a, "--rate", 6) != 0 && strncmp(a, "--duration", 10) != 0)
                not_events = a;
            if (strncmp(a, "--rate", 6) == 0 || strncmp(a, "--requests", 10) == 0 ||
                strncmp(a, "--update", 8) == 0)
                not_mocker = a;
            continue;
        }
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
        return usage_error("bench", "which benchmark? (hash, index, ingest, snapshot, route, events, "
                                    "mocker, all)");
    bool route = strcmp(which, "route") == 0;
    bool events = strcmp(which, "events") == 0;
    bool mocker = strcmp(which, "mocker") == 0;
    bool frontend = strcmp(which, "frontend") == 0;
    if (frontend)
        return run_frontend(&o);
    if (mocker_opt && !mocker)
        return usage_error(mocker_opt, "an option of 'bench mocker' only");
    if (mocker && not_mocker)
        return usage_error(not_mocker, "not an option of 'bench mocker'");
    if (mocker && o.url_set && (o.n_mocker_args || o.mocker_cpu_set || o.speedup_set))
        return usage_error("--url", "drives a running mocker: --speedup, --mocker-cpu and "
                                    "--mocker-arg apply only to the one the benchmark spawns");
    if (mocker)
        route_opt = NULL; /* --url, --duration, --warmup, --prefix-share, --threads serve both */
    if (events && (not_events || o.clients.n > 0))
        return usage_error(not_events ? not_events : "--clients",
                           "not an option of 'bench events'");
    if (o.publish && !events)
        return usage_error("--publish", "an option of 'bench events' only");
    if (events)
        route_opt = NULL; /* --rate and --duration also serve 'bench events' */
    if (!route && !mocker && (route_opt || o.clients.n > 0))
        return usage_error(route_opt ? route_opt : "--clients", "an option of 'bench route' only");
    const char *foreign = o.quick ? "--quick" : o.workers.n ? "--workers" : o.pairs.n ? "--pairs"
                          : o.depth.n ? "--depth" : o.block_size.n ? "--block-size"
                          : o.query.n ? "--query" : o.writer.n ? "--writer"
                          : o.sync.n ? "--sync" : NULL;
    if ((route || mocker) && foreign)
        return usage_error(foreign, route ? "not an option of 'bench route' (see --help)"
                                          : "not an option of 'bench mocker' (see --help)");

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
    if (rc == 0 && strcmp(which, "snapshot") == 0)
        rc = kvr_bench_snapshot(&o);
    if (rc == 0 && strcmp(which, "hashtab") == 0)
        rc = kvr_bench_hashtab(&o);
    if (rc == 0 && route)
        rc = kvr_bench_route(&o);
    if (rc == 0 && events)
        rc = kvr_bench_events(&o);
    if (rc == 0 && mocker)
        rc = kvr_bench_mocker(&o);
    return rc;
}

/* kvrouter-bench: run by `kvrouter bench ...` (apps/cmd_bench.c) from the same folder; the
 * processes it starts are the kvrouter binary beside it. */
int main(int argc, char **argv)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            char self[PATH_MAX + 16];
            *slash = '\0';
            snprintf(self, sizeof self, "%s/kvrouter", exe);
            kvr_child_set_self(self);
        }
    }
    return bench_run(argc, argv);
}

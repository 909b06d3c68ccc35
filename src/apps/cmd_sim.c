/*
 * cmd_sim.c: `kvrouter sim`, a Mooncake trace through the real router core and N simulated
 * engines in virtual time (sim/sim.h), one run per routing policy, side by side with the
 * trace's hit-ratio ceilings (wire/trace.h: an infinite cache, and one LRU cache pooling every
 * worker's blocks). No sockets, no threads; deterministic given --seed.
 *
 * Flags: the trace and the run (--trace, --requests, --workers, --policy, --speedup, --seed,
 * --json), the engine's (as `kvrouter mocker`), and any router setting of `kvrouter serve`
 * (--router-temperature, --overlap-score-credit, --router-queue-threshold, ...), plus
 * --overlap-score-weight (Dynamo's older knob). A bad value stops it naming the flag (exit 2).
 * Trace tokens use seed 0 (as the ceilings do), so --seed changes decisions, never prompts.
 * Output: a table on stdout, or with --json one object per policy per line.
 * Memory: the trace (rows and ids), the ceilings' hash set for one pass, then one simulation
 * at a time. Cost: the ceilings pass plus one simulation per policy; the wall clock is read
 * here only to report run times.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "apps/apps.h"
#include "base/clock.h"
#include "apps/cli.h"
#include "replay/gnuplot.h"
#include "replay/replay_report.h"
#include "kvrouter/config.h"
#include "sim/sim.h"
#include "kvrouter.h"
#include "wire/json_writer.h"
#include "wire/run_report.h"
#include "sim/ceilings.h"
#include "wire/trace.h"

#define DEFAULT_TRACE "data/traces/conversation_trace.jsonl"
#define MAX_POLICIES 16
#define MAX_SPEEDUPS 32

/* Indexed by kvr_router_mode_t ("all" is these), then the simulator's clairvoyant yardstick,
 * then kv mode with one cost function each (to compare them in one run or one plot; "kv" is
 * kv mode with --router-selection-policy, locality by default). */
static const char *const POLICY_NAMES[] = {"kv",           "round-robin", "random",
                                           "least-loaded", "approx",      "oracle",
                                           "dynamo",       "lmetric",     "locality",
                                           "oracle-affinity"};
#define N_POLICY_NAMES (sizeof POLICY_NAMES / sizeof POLICY_NAMES[0])
#define POLICY_ORACLE 5
#define POLICY_DYNAMO 6                 /* .. POLICY_DYNAMO + 2: kv mode with that cost */
#define POLICY_ORACLE_AFFINITY 9
#define N_ROUTER_POLICIES POLICY_ORACLE /* "all" */
_Static_assert(KVR_MODE_APPROX + 1 == POLICY_ORACLE, "router modes come first");

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter sim [options]\n\n"
            "A trace through the real router core and simulated vLLM engines in virtual time:\n"
            "no sockets, deterministic with --seed, one row per routing policy, beside the\n"
            "trace's hit-ratio ceilings (an infinite cache; one LRU cache holding all workers'\n"
            "blocks).\n\n"
            "Run options (defaults in brackets):\n"
            "  --trace FILE                  Mooncake JSONL trace [" DEFAULT_TRACE ",\n"
            "                                else ../" DEFAULT_TRACE " beside the binary]\n"
            "  --requests N                  only the first N rows [all]\n"
            "  --workers N                   simulated engines [8]\n"
            "  --policy LIST                 comma-separated: kv, round-robin, random,\n"
            "                                least-loaded, approx, or all [all]; or oracle:\n"
            "                                clairvoyant, each request to the worker where a\n"
            "                                copy of every engine run forward gives its first\n"
            "                                token soonest (a yardstick; slow); or\n"
            "                                oracle-affinity: of the workers within 10%% of the\n"
            "                                soonest, the one caching most of the prompt (the\n"
            "                                second yardstick); or dynamo, lmetric, locality:\n"
            "                                kv with that cost function\n"
            "  --rate-scale X[,Y,...]        the trace's request rate x X (arrival = timestamp\n"
            "                                / X; the load, called speedup in the output); the\n"
            "                                engines keep their modelled times; a list runs\n"
            "                                every policy at each [1] (--speedup: the same)\n"
            "  --sweep N                     N loads evenly up to --rate-scale: X/N, ..., X\n"
            "  --plot FILE                   .png or .svg (gnuplot) of a sweep: hit ratio and\n"
            "                                TTFT p50 / p90 against load, a line per policy\n"
            "  --seed N                      the random policy and tie-breaks (prompts never\n"
            "                                change: trace tokens use seed 0) [1]\n"
            "  --json                        one JSON object per policy per line\n"
            "  --records FILE                every request's story, a JSON line each run and\n"
            "                                row (policy, speedup, row, arrival, routed, first\n"
            "                                token and finish ms, worker, outcome, prompt,\n"
            "                                cached, predicted and best cached tokens, outputs)\n"
            "  --quiet                       no progress on stderr (a run longer than a few\n"
            "                                seconds shows one, as demo and replay do)\n"
            "  --prefill-workers P --decode-workers D  disaggregated: P prefill and D decode\n"
            "                                workers (instead of --workers); the KV of each\n"
            "                                prefill travels to its decode worker in\n"
            "                                blocks x --kv-bytes-per-block [2097152] /\n"
            "                                --kv-transfer-gbps [100]\n"
            "  --event-delay-ms D            KV events reach the index D ms late [0: at once]\n"
            "  --event-jitter-ms J           ... give or take up to J ms [D / 2]\n"
            "  --event-loss P                a batch is lost with probability P and replayed\n"
            "                                after --event-replay-ms [1000]; later batches of\n"
            "                                its worker wait for it (in-order replay) [0]\n"
            "  --sessions                    sticky sessions inferred from the trace: a request\n"
            "                                whose prompt extends an earlier one's (all of its\n"
            "                                blocks but the last, at least 2) continues that\n"
            "                                conversation (--session-ttl-secs, 300 unless given)\n");
    fprintf(out,
            "Engine options (as kvrouter mocker):\n"
            "  --block-size N                tokens per KV block, engines and router [16]\n"
            "  --num-gpu-blocks N            KV blocks per worker (alias\n"
            "                                --num-gpu-blocks-override) [16384]\n"
            "  --max-num-seqs N              requests in a batch [256]\n"
            "  --max-num-batched-tokens N    tokens per step [8192]\n"
            "  --max-model-len N             prompt + output limit; longer rows are skipped\n"
            "                                and counted [num-gpu-blocks x block-size]\n"
            "  --[no-]enable-chunked-prefill [on]\n"
            "  --[no-]enable-prefix-caching  [on]\n"
            "  --prefill-poly A,B,C          prefill ms = A T^2 + B T + C\n"
            "                                [4.209989e-07,1.518344e-02,16.50142]\n"
            "  --decode-poly D,E,F           decode ms = D u^2 + E u + F [-25.74,54.01,5.74]\n"
            "  --decode-min-ms X             floor of a decode step [1]\n"
            "  --max-waiting N               engine waiting-queue cap [65536]\n"
            "Router options: every `kvrouter serve` setting, e.g.\n"
            "  --overlap-score-credit X      [1.0]     --prefill-load-scale X   [1.0]\n"
            "  --router-temperature X        [0.0]     --router-queue-threshold X [unset]\n"
            "  --overlap-score-weight X      Dynamo's older knob: X > 0 sets\n"
            "                                prefill-load-scale X; 0 sets it and the credit to 0\n"
            "(see kvrouter serve --help; router_mode is --policy, block_size is --block-size;\n"
            "router_request_expiry_ms defaults to its maximum here: no free is ever lost).\n\n"
            "Output: policy, finished requests, TTFT p50/p90/p99, ITL p50 (per request:\n"
            "(finish - first token) / (outputs - 1)), e2e p50 (ms), hit ratio (engine-reported\n"
            "cached / prompt tokens), the two ceilings, the busiest worker's share of requests,\n"
            "virtual and real seconds. Percentiles are nearest-rank.\n");
}

/* ---- arguments ----------------------------------------------------------------------------- */

typedef struct sim_args {
    kvr_sim_config_t cfg;
    const char *trace;
    uint64_t requests;
    double speedup;                /* the run's (one of speedups) */
    double speedups[MAX_SPEEDUPS]; /* --speedup A[,B,...], or made by --sweep */
    size_t n_speedups;
    uint32_t sweep;   /* --sweep N: N loads up to the highest speedup */
    const char *plot; /* --plot FILE */
    const char *records_path; /* --records FILE */
    FILE *records;            /* open while running: each run's lines appended */
    bool json;
    bool quiet; /* no progress on stderr */
    bool sessions; /* infer sessions from successive turns (--sessions) */
    bool ttl_given; /* --session-ttl-secs given (else 300 with --sessions) */
    bool jitter_set;               /* --event-jitter-ms given (else half the delay) */
    size_t policies[MAX_POLICIES]; /* into POLICY_NAMES */
    size_t n_policies;
    char setting[96]; /* the router setting being parsed, named in messages */
    uint32_t prefill_workers, decode_workers; /* disaggregated when both are set */
} sim_args_t;

static int parse_policies(const kvr_cli_t *c, const char *v, sim_args_t *a)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    a->n_policies = 0;
    const char *p = v;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        bool found = false;
        if (n == 3 && strncmp(p, "all", 3) == 0) {
            for (size_t k = 0; k < N_ROUTER_POLICIES && a->n_policies < MAX_POLICIES; k++)
                a->policies[a->n_policies++] = k;
            found = true;
        }
        for (size_t k = 0; !found && k < N_POLICY_NAMES; k++) {
            if (strlen(POLICY_NAMES[k]) == n && strncmp(p, POLICY_NAMES[k], n) == 0) {
                if (a->n_policies == MAX_POLICIES)
                    return kvr_cli_bad(c, v, "at most 16 policies");
                a->policies[a->n_policies++] = k;
                found = true;
            }
        }
        if (!found)
            return kvr_cli_bad(
                c, v,
                "each must be kv, round-robin, random, least-loaded, approx, oracle, "
                "oracle-affinity, dynamo, lmetric, locality or all");
        p += n + (comma ? 1 : 0);
        if (comma && *p == '\0')
            return kvr_cli_bad(c, v, "empty policy name");
    }
    return 0;
}

/* --speedup X or X,Y,...: each finite and > 0, at most MAX_SPEEDUPS. */
static int parse_speedups(const kvr_cli_t *c, const char *v, sim_args_t *a)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    a->n_speedups = 0;
    for (const char *p = v; *p != '\0';) {
        size_t n = strcspn(p, ",");
        char one[64];
        if (n == 0 || n >= sizeof one)
            return kvr_cli_bad(c, v, "a comma-separated list of numbers > 0");
        if (a->n_speedups == MAX_SPEEDUPS)
            return kvr_cli_bad(c, v, "at most 32 speedups");
        memcpy(one, p, n);
        one[n] = '\0';
        int rc = kvr_cli_pos(c, one, &a->speedups[a->n_speedups]);
        if (rc != 0)
            return rc;
        a->n_speedups++;
        p += n;
        if (*p == ',' && *++p == '\0')
            return kvr_cli_bad(c, v, "a comma-separated list of numbers > 0");
    }
    return 0;
}

/* A finite number >= 0 (the event link's settings; kvr_sim_config_validate checks the rest). */
static int nonneg(kvr_cli_t *c, double *out)
{
    const char *v = kvr_cli_value(c);
    int rc = kvr_cli_double(c, v, out);
    if (rc == 0 && *out < 0)
        return kvr_cli_bad(c, v, "must be >= 0");
    return rc;
}

/* Run flags: 0 handled, 2 error, -1 not a run flag. */
static int parse_run_flag(kvr_cli_t *c, sim_args_t *a)
{
    if (kvr_cli_is(c, "--trace"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->trace);
    if (kvr_cli_is(c, "--requests"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_MAX, &a->requests);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, KVR_SIM_MAX_WORKERS, &a->cfg.n_workers);
    if (kvr_cli_is(c, "--policy"))
        return parse_policies(c, kvr_cli_value(c), a);
    if (kvr_cli_is(c, "--prefill-workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, KVR_SIM_MAX_WORKERS - 1, &a->prefill_workers);
    if (kvr_cli_is(c, "--decode-workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, KVR_SIM_MAX_WORKERS - 1, &a->decode_workers);
    if (kvr_cli_is(c, "--kv-bytes-per-block"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_MAX / 8, &a->cfg.kv_bytes_per_block);
    if (kvr_cli_is(c, "--kv-transfer-gbps"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->cfg.kv_transfer_gbps);
    if (kvr_cli_is_or_old(c, "--rate-scale", "--speedup"))
        return parse_speedups(c, kvr_cli_value(c), a);
    if (kvr_cli_is(c, "--sweep"))
        return kvr_cli_u32(c, kvr_cli_value(c), 2, MAX_SPEEDUPS, &a->sweep);
    if (kvr_cli_is(c, "--plot"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->plot);
    if (kvr_cli_is(c, "--records"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->records_path);
    if (kvr_cli_is(c, "--event-delay-ms"))
        return nonneg(c, &a->cfg.link.delay_ms);
    if (kvr_cli_is(c, "--event-jitter-ms")) {
        a->jitter_set = true;
        return nonneg(c, &a->cfg.link.jitter_ms);
    }
    if (kvr_cli_is(c, "--event-loss"))
        return nonneg(c, &a->cfg.link.loss);
    if (kvr_cli_is(c, "--event-replay-ms"))
        return nonneg(c, &a->cfg.link.replay_ms);
    if (kvr_cli_is(c, "--seed"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT64_MAX, &a->cfg.seed);
    if (strcmp(c->argv[c->i], "--json") == 0) {
        a->json = true;
        return 0;
    }
    if (strcmp(c->argv[c->i], "--quiet") == 0) {
        a->quiet = true;
        return 0;
    }
    if (strcmp(c->argv[c->i], "--sessions") == 0) {
        a->sessions = true;
        return 0;
    }
    return -1;
}

/* Router settings by name (kvrouter/config.h), and --overlap-score-weight. */
static int parse_router_flag(kvr_cli_t *c, sim_args_t *a)
{
    kvr_router_config_t *r = &a->cfg.router;
    char *name = a->setting;
    if (kvr_cli_is(c, "--overlap-score-weight")) {
        const char *v = kvr_cli_value(c);
        double w;
        int rc = kvr_cli_double(c, v, &w);
        if (rc != 0)
            return rc;
        if (w < 0)
            return kvr_cli_bad(c, v, "must be >= 0");
        r->prefill_load_scale = w;
        if (w == 0)
            r->overlap_score_credit = 0;
        return 0;
    }
    if (!kvr_cli_setting(c, name, sizeof a->setting) || !kvr_config_has(name))
        return -1;
    if (strcmp(name + 2, "block-size") == 0 || strcmp(name + 2, "block_size") == 0)
        return -1; /* handled as an engine flag */
    const char *v = kvr_cli_value(c);
    if (strcmp(name + 2, "router-mode") == 0 || strcmp(name + 2, "router_mode") == 0)
        return kvr_cli_bad(c, v, "use --policy");
    if (v == NULL)
        return kvr_cli_bad(c, v, "a value is required");
    char err[300];
    if (kvr_config_set(r, name, v, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(c, "%s: %s", name, err);
    a->ttl_given |= strcmp(name + 2, "session-ttl-secs") == 0 ||
                    strcmp(name + 2, "session_ttl_secs") == 0;
    return 0;
}

/* One argument (kvr_cli_option_fn): a run flag, an engine flag (cli.h), a router setting. */
static int parse_option(kvr_cli_t *c, void *arg)
{
    sim_args_t *a = arg;
    int rc = parse_run_flag(c, a);
    if (rc == -1)
        rc = kvr_cli_engine_option(c, &a->cfg.engine);
    if (rc == -1)
        rc = parse_router_flag(c, a);
    return rc;
}

static int parse_args(int argc, char **argv, sim_args_t *a)
{
    memset(a, 0, sizeof *a);
    kvr_sim_config_default(&a->cfg);
    a->speedups[0] = 1.0;
    a->n_speedups = 1;
    a->cfg.link.replay_ms = 1000;
    for (size_t k = 0; k < N_ROUTER_POLICIES; k++)
        a->policies[a->n_policies++] = k;
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter sim", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, a, usage);
    if (rc != 0)
        return rc;
    a->cfg.router.block_size = a->cfg.engine.block_size; /* --block-size sets both */
    if (a->sessions && !a->ttl_given)
        a->cfg.router.session_ttl_secs = 300; /* serve's default is off; --sessions means on */
    if (!a->jitter_set)
        a->cfg.link.jitter_ms = a->cfg.link.delay_ms / 2;
    if (a->sweep > 0) {
        if (a->n_speedups != 1)
            return kvr_cli_fail(&c, "--sweep N takes one --rate-scale (the highest load)");
        double top = a->speedups[0];
        for (uint32_t k = 0; k < a->sweep; k++)
            a->speedups[k] = top * (double)(k + 1) / (double)a->sweep;
        a->n_speedups = a->sweep;
    }
    if (a->plot != NULL && a->n_speedups < 2)
        return kvr_cli_fail(&c, "--plot draws against load: give a sweep (--rate-scale A,B,... or "
                                "--sweep N)");
    size_t pl = a->plot != NULL ? strlen(a->plot) : 0;
    if (a->plot != NULL && (pl < 4 || (strcasecmp(a->plot + pl - 4, ".png") != 0 &&
                                       strcasecmp(a->plot + pl - 4, ".svg") != 0)))
        return kvr_cli_fail(&c, "--plot %s: the plot's name must end in .png or .svg", a->plot);
    if (a->plot != NULL && !kvr_gnuplot_available()) /* before the runs, not after */
        return kvr_cli_fail(&c, "--plot needs gnuplot, which is not installed (Debian: apt-get "
                                "install gnuplot-nox; scripts/install-deps.sh installs it)");
    a->speedup = a->speedups[0];
    if ((a->prefill_workers > 0) != (a->decode_workers > 0))
        return kvr_cli_fail(&c, "--prefill-workers and --decode-workers go together");
    if (a->prefill_workers > 0) {
        if ((uint64_t)a->prefill_workers + a->decode_workers > KVR_SIM_MAX_WORKERS)
            return kvr_cli_fail(&c, "--prefill-workers + --decode-workers: at most %u",
                                KVR_SIM_MAX_WORKERS);
        a->cfg.n_workers = a->prefill_workers + a->decode_workers;
        a->cfg.n_prefill = a->prefill_workers;
    }
    char err[300];
    if (kvr_sim_config_validate(&a->cfg, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(&c, "%s", err);
    return 0;
}

/* ---- trace --------------------------------------------------------------------------------- */

/* --trace, else the default relative to the cwd, else beside the binary (../data/traces). */
static const char *find_trace(const char *given, char *buf, size_t cap)
{
    return given != NULL ? given : kvr_cli_data_file(DEFAULT_TRACE, buf, cap);
}

static int trace_tokens(void *ud, size_t i, uint32_t *out, size_t cap)
{
    const kvr_trace_t *t = ud;
    return kvr_trace_tokens(&t->rows[i], 0, out, cap);
}

/* ---- output -------------------------------------------------------------------------------- */

typedef struct report {
    const char *policy;
    uint32_t workers;
    uint32_t prefill_workers;
    double speedup;
    uint64_t seed;
    kvr_trace_ceilings_t ceil;
    kvr_sim_result_t res;
    double run_s;
} report_t;

static void json_pcts(kvr_json_writer_t *w, const char *key, kvr_pcts_t p)
{
    kvr_json_key(w, key);
    kvr_json_begin_object(w);
    kvr_json_key(w, "p50");
    kvr_json_double(w, p.p50);
    kvr_json_key(w, "p90");
    kvr_json_double(w, p.p90);
    kvr_json_key(w, "p99");
    kvr_json_double(w, p.p99);
    kvr_json_end_object(w);
}

static int print_json(kvr_json_writer_t *w, const report_t *r)
{
    const kvr_sim_result_t *s = &r->res;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    /* the keys `kvrouter replay --json` prints too (wire/run_report.h), then the sim's own */
    kvr_run_report_t rr = {.policy = r->policy,
                           .workers = r->workers,
                           .requests = s->requests,
                           .ttft_ms = s->ttft_ms,
                           .itl_ms = s->itl_ms,
                           .e2e_ms = s->e2e_ms,
                           .hit_ratio = s->hit_ratio,
                           .ceiling_infinite = r->ceil.infinite,
                           .ceiling_pooled = r->ceil.pooled,
                           .max_worker_share = s->max_worker_share};
    kvr_run_report_write_keys(w, &rr);
    /* extras */
    kvr_json_key(w, "speedup");
    kvr_json_double(w, r->speedup);
    kvr_json_key(w, "seed");
    kvr_json_u64(w, r->seed);
    kvr_json_key(w, "too_long");
    kvr_json_u64(w, s->too_long);
    kvr_json_key(w, "rejected");
    kvr_json_u64(w, s->rejected);
    kvr_json_key(w, "expired");
    kvr_json_u64(w, s->expired);
    kvr_json_key(w, "queued");
    kvr_json_u64(w, s->queued);
    json_pcts(w, "queue_ms", s->queue_ms);
    kvr_json_key(w, "ttft_mean_ms");
    kvr_json_double(w, s->ttft_mean_ms);
    kvr_json_key(w, "prompt_tokens");
    kvr_json_u64(w, s->prompt_tokens);
    kvr_json_key(w, "cached_tokens");
    kvr_json_u64(w, s->cached_tokens);
    if (s->event_batches > 0) {
        kvr_json_key(w, "event_batches");
        kvr_json_u64(w, s->event_batches);
        kvr_json_key(w, "events_lost");
        kvr_json_u64(w, s->events_lost);
        kvr_json_key(w, "event_delay_ms");
        kvr_json_double(w, s->event_delay_ms);
    }
    kvr_json_key(w, "predicted_hit_ratio");
    kvr_json_double(w, s->prompt_tokens
                           ? (double)s->predicted_cached_tokens / (double)s->prompt_tokens
                           : 0.0);
    kvr_json_key(w, "best_hit_ratio");
    kvr_json_double(w, s->prompt_tokens
                           ? (double)s->best_cached_tokens / (double)s->prompt_tokens
                           : 0.0);
    kvr_json_key(w, "max_worker_requests");
    kvr_json_u64(w, s->max_worker_requests);
    kvr_json_key(w, "steps");
    kvr_json_u64(w, s->steps);
    kvr_json_key(w, "preemptions");
    kvr_json_u64(w, s->preemptions);
    kvr_json_key(w, "index_errors");
    kvr_json_u64(w, s->index_errors);
    kvr_json_key(w, "router_live_at_end");
    kvr_json_u64(w, s->router_live_at_end);
    kvr_json_key(w, "router_unknown_ids");
    kvr_json_u64(w, s->router_unknown_ids);
    json_pcts(w, "itl_pcts_ms", s->itl_ms);
    kvr_json_key(w, "prefill_workers");
    kvr_json_u64(w, r->prefill_workers);
    if (r->prefill_workers > 0) {
        kvr_json_key(w, "transfers");
        kvr_json_u64(w, s->transfers);
        kvr_json_key(w, "bypassed");
        kvr_json_u64(w, s->bypassed);
        kvr_json_key(w, "transfer_ms_mean");
        kvr_json_double(w, s->transfers ? s->transfer_ms / (double)s->transfers : 0.0);
        json_pcts(w, "prefill_ms", s->prefill_ms);
    }
    kvr_json_key(w, "virtual_s");
    kvr_json_double(w, s->virtual_ms / 1000.0);
    kvr_json_key(w, "run_s");
    kvr_json_double(w, r->run_s);
    kvr_json_end_object(w);
    const char *doc;
    size_t len;
    if (kvr_json_writer_finish(w, &doc, &len) != KVR_OK)
        return KVR_ENOMEM;
    fwrite(doc, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    return KVR_OK;
}

static void fmt_ms(char *buf, size_t cap, double v)
{
    if (isnan(v))
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.1f", v);
}

static void print_header(void)
{
    printf("%-19s %8s %9s %9s %9s %8s %8s %9s %6s %6s %6s %6s %8s %6s\n", "policy", "requests",
           "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90", "e2e_p50", "hit", "c_inf",
           "c_pool", "share", "virt_s", "run_s");
}

static void print_row(const report_t *r)
{
    const kvr_sim_result_t *s = &r->res;
    char a[24], b[24], c[24], d[24], e[24], f[24];
    fmt_ms(f, sizeof f, s->itl_ms.p90);
    fmt_ms(a, sizeof a, s->ttft_ms.p50);
    fmt_ms(b, sizeof b, s->ttft_ms.p90);
    fmt_ms(c, sizeof c, s->ttft_ms.p99);
    fmt_ms(d, sizeof d, s->itl_ms.p50);
    fmt_ms(e, sizeof e, s->e2e_ms.p50);
    printf("%-19s %8llu %9s %9s %9s %8s %8s %9s %6.3f %6.3f %6.3f %6.3f %8.1f %6.2f\n", r->policy,
           (unsigned long long)s->requests, a, b, c, d, f, e, s->hit_ratio, r->ceil.infinite,
           r->ceil.pooled, s->max_worker_share, s->virtual_ms / 1000.0, r->run_s);
    fflush(stdout);
}

/* ---- main ---------------------------------------------------------------------------------- */

static kvr_sim_request_t *make_requests(const kvr_trace_t *t, double speedup)
{
    kvr_sim_request_t *reqs = malloc((t->n_rows ? t->n_rows : 1) * sizeof *reqs);
    if (reqs == NULL)
        return NULL;
    for (size_t i = 0; i < t->n_rows; i++)
        reqs[i] = (kvr_sim_request_t){.arrival_ms = (double)t->rows[i].timestamp_ms / speedup,
                                      .n_tokens = t->rows[i].input_length,
                                      .max_tokens = t->rows[i].output_length};
    return reqs;
}

/* ---- sessions ------------------------------------------------------------------------------- */

/* The prefix -> session table of infer_sessions (open addressing, at most half full). */
typedef struct pent {
    uint64_t key; /* 0 = empty (a prefix hash is never 0: see prefix_key) */
    uint64_t session;
} pent_t;

static uint64_t prefix_key(uint64_t h, uint64_t id)
{
    uint64_t k = (h ^ id) * UINT64_C(0x9E3779B97F4A7C15);
    k ^= k >> 29;
    return k | 1;
}

/* Sessions of a trace without session ids: a request whose hash ids extend an earlier
 * request's (all of that one's blocks but the last, which the next turn refills, and at least
 * two, so a shared first block such as a system prompt alone does not join conversations)
 * continues the most recent such request's session; any other starts one. O(blocks) per
 * request. */
static int infer_sessions(const kvr_trace_t *t, kvr_sim_request_t *reqs, uint64_t *n_sessions)
{
    size_t cap = 16;
    while (cap < 4 * (t->n_rows + 1))
        cap *= 2;
    pent_t *tab = calloc(cap, sizeof *tab);
    uint64_t *pk = malloc(sizeof *pk * 4096);
    if (tab == NULL || pk == NULL) {
        free(tab);
        free(pk);
        return KVR_ENOMEM;
    }
    uint64_t next = 0;
    for (size_t i = 0; i < t->n_rows; i++) {
        const kvr_trace_row_t *row = &t->rows[i];
        uint32_t n = row->n_hash_ids < 4096 ? row->n_hash_ids : 4096;
        uint64_t h = 0, session = 0;
        for (uint32_t k = 0; k < n; k++)
            pk[k] = h = prefix_key(h, row->hash_ids[k]);
        for (uint32_t k = n; k >= 2 && session == 0; k--) { /* the longest known prefix */
            for (size_t j = pk[k - 1] & (cap - 1); tab[j].key != 0; j = (j + 1) & (cap - 1))
                if (tab[j].key == pk[k - 1]) {
                    session = tab[j].session;
                    break;
                }
        }
        if (session == 0)
            session = ++next;
        reqs[i].session = session;
        if (n >= 3) { /* what the next turn repeats: all blocks but the last */
            size_t j = pk[n - 2] & (cap - 1);
            while (tab[j].key != 0 && tab[j].key != pk[n - 2])
                j = (j + 1) & (cap - 1);
            tab[j] = (pent_t){pk[n - 2], session};
        }
    }
    free(tab);
    free(pk);
    *n_sessions = next;
    return KVR_OK;
}

/* One run's figures for the plot. */
typedef struct point {
    size_t policy; /* into POLICY_NAMES */
    double speedup, hit, p50, p90;
} point_t;

typedef struct points {
    point_t p[MAX_SPEEDUPS * MAX_POLICIES];
    size_t n;
} points_t;

/* Progress on stderr (replay's bar: a line every 5 s off a terminal, none for short runs). */
typedef struct sim_progress {
    kvr_progress_bar_t bar;
    double t0;
} sim_progress_t;

static void on_progress(void *arg, size_t done, size_t n, double virtual_ms)
{
    (void)virtual_ms;
    sim_progress_t *p = arg;
    kvr_replay_progress_t r = {.total = n, .sent = done, .done = done,
                               .elapsed_s = kvr_now_s() - p->t0};
    kvr_progress_bar_update(&p->bar, &r);
}

static const char *const OUTCOMES[] = {"pending", "done", "too_long", "rejected", "expired"};

/* One run's records as JSON lines on a->records (virtual ms; null where absent). */
static int write_records(const sim_args_t *a, const char *policy, const kvr_sim_request_t *reqs,
                         const kvr_sim_record_t *rec, size_t n, kvr_json_writer_t *w)
{
    for (size_t i = 0; i < n; i++) {
        const kvr_sim_record_t *x = &rec[i];
        kvr_json_writer_reset(w);
        kvr_json_begin_object(w);
        kvr_json_key(w, "policy");
        kvr_json_string(w, policy);
        kvr_json_key(w, "speedup");
        kvr_json_double(w, a->speedup);
        kvr_json_key(w, "row");
        kvr_json_u64(w, i);
        const char *tk[] = {"arrival_ms", "routed_ms", "first_ms", "finish_ms"};
        const double tv[] = {x->arrival_ms, x->routed_ms, x->first_ms, x->finish_ms};
        for (size_t k = 0; k < 4; k++) {
            kvr_json_key(w, tk[k]);
            kvr_json_double(w, tv[k]); /* NaN: null */
        }
        kvr_json_key(w, "worker");
        x->worker >= 0 ? kvr_json_i64(w, x->worker) : kvr_json_null(w);
        if (a->cfg.n_prefill > 0) {
            kvr_json_key(w, "prefill_worker");
            x->prefill_worker >= 0 ? kvr_json_i64(w, x->prefill_worker) : kvr_json_null(w);
        }
        bool known = (size_t)x->outcome < sizeof OUTCOMES / sizeof OUTCOMES[0];
        kvr_json_key(w, "outcome");
        kvr_json_string(w, known ? OUTCOMES[x->outcome] : "?");
        const char *nk[] = {"prompt_tokens", "cached_tokens", "predicted_cached_tokens",
                            "best_cached_tokens", "output_tokens"};
        const uint64_t nv[] = {reqs[i].n_tokens, x->cached_tokens, x->predicted_cached_tokens,
                               x->best_cached_tokens, x->n_output};
        for (size_t k = 0; k < sizeof nk / sizeof nk[0]; k++) {
            kvr_json_key(w, nk[k]);
            kvr_json_u64(w, nv[k]);
        }
        kvr_json_end_object(w);
        const char *data;
        size_t len;
        if (kvr_json_writer_finish(w, &data, &len) != KVR_OK)
            return KVR_ENOMEM;
        if (fwrite(data, 1, len, a->records) != len || fputc('\n', a->records) == EOF)
            return KVR_EIO;
    }
    return KVR_OK;
}

static int run_policies(const sim_args_t *a, const kvr_trace_t *t, const kvr_sim_request_t *reqs,
                        const kvr_trace_ceilings_t *ceil, points_t *pts)
{
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_sim_input_t in = {.reqs = reqs, .n = t->n_rows, .tokens = trace_tokens, .ud = (void *)t};
    int code = 0;
    for (size_t k = 0; k < a->n_policies && code == 0; k++) {
        kvr_sim_config_t cfg = a->cfg;
        size_t pk = a->policies[k];
        bool oracle = pk == POLICY_ORACLE || pk == POLICY_ORACLE_AFFINITY;
        bool cost = pk >= POLICY_DYNAMO && pk < POLICY_DYNAMO + 3;
        cfg.oracle = oracle;
        cfg.oracle_affinity = pk == POLICY_ORACLE_AFFINITY ? 0.1 : 0.0;
        cfg.router.router_mode = oracle ? KVR_MODE_LEAST_LOADED
                                 : cost ? KVR_MODE_KV
                                        : (kvr_router_mode_t)pk;
        if (cost) /* the names are in kvr_select_policy_t's order */
            cfg.router.router_selection_policy = (kvr_select_policy_t)(pk - POLICY_DYNAMO);
        cfg.router.use_kv_events = cfg.router.router_mode != KVR_MODE_APPROX;
        char label[48];
        snprintf(label, sizeof label, "%s%s", POLICY_NAMES[a->policies[k]],
                 cfg.n_prefill ? "/disagg" : "");
        report_t r = {.policy = label,
                      .workers = cfg.n_workers,
                      .prefill_workers = cfg.n_prefill,
                      .speedup = a->speedup,
                      .seed = cfg.seed,
                      .ceil = *ceil};
        char err[300] = "";
        double t0 = kvr_now_s();
        sim_progress_t prog = {.t0 = t0};
        char plabel[96];
        snprintf(plabel, sizeof plabel, "sim %s at speedup %g", label, a->speedup);
        kvr_progress_bar_init(&prog.bar, plabel);
        in.progress = a->quiet ? NULL : on_progress;
        in.progress_arg = &prog;
        kvr_sim_record_t *rec = a->records ? calloc(t->n_rows, sizeof *rec) : NULL; /* rows>0 */
        if (a->records && rec == NULL) {
            fprintf(stderr, "kvrouter sim: %s\n", kvr_strerror(KVR_ENOMEM));
            code = 1;
            break;
        }
        int rc = kvr_sim_run(&cfg, &in, &r.res, rec, err, sizeof err);
        int wrc = rc == KVR_OK && rec != NULL ? write_records(a, label, reqs, rec, t->n_rows, &w)
                                              : KVR_OK;
        if (wrc != KVR_OK) {
            fprintf(stderr, "kvrouter sim: --records %s: %s\n", a->records_path,
                    wrc == KVR_EIO ? strerror(errno) : kvr_strerror(wrc));
            code = 1;
        }
        free(rec);
        if (!a->quiet)
            kvr_progress_bar_end(&prog.bar);
        r.run_s = kvr_now_s() - t0;
        if (rc != KVR_OK) {
            fprintf(stderr, "kvrouter sim: %s: %s\n", r.policy, err[0] ? err : kvr_strerror(rc));
            code = rc == KVR_EINVAL ? 2 : 1;
            break;
        }
        if (a->json ? print_json(&w, &r) != KVR_OK : (print_row(&r), false))
            code = 1;
        pts->p[pts->n++] = (point_t){a->policies[k], a->speedup, r.res.hit_ratio, r.res.ttft_ms.p50,
                                     r.res.ttft_ms.p90};
    }
    kvr_json_writer_deinit(&w);
    return code;
}

/* Every policy at a->speedup: the requests (and sessions) at that load, the table's block. */
static int run_load(const sim_args_t *a, const kvr_trace_t *t, const kvr_trace_ceilings_t *ceil,
                    points_t *pts)
{
    kvr_sim_request_t *reqs = make_requests(t, a->speedup);
    if (reqs == NULL) {
        fprintf(stderr, "kvrouter sim: %s\n", kvr_strerror(KVR_ENOMEM));
        return 1;
    }
    uint64_t n_sessions = 0;
    int rc;
    if (a->sessions && (rc = infer_sessions(t, reqs, &n_sessions)) != KVR_OK) {
        fprintf(stderr, "kvrouter sim: sessions: %s\n", kvr_strerror(rc));
        free(reqs);
        return 1;
    }
    if (a->sessions && !a->json && pts->n == 0)
        printf("sessions: %llu inferred from successive turns (session_ttl_secs %llu)\n",
               (unsigned long long)n_sessions, (unsigned long long)a->cfg.router.session_ttl_secs);
    if (!a->json) {
        if (a->n_speedups > 1)
            printf("speedup %g\n", a->speedup);
        print_header();
    }
    int code = run_policies(a, t, reqs, ceil, pts);
    free(reqs);
    return code;
}

/* ---- the plot: hit ratio and TTFT p50 / p90 against load, a line per policy ---------------- */

typedef struct sweep_plot {
    const sim_args_t *a;
    const points_t *pts;
    char title[512];
} sweep_plot_t;

/* One inline data block per policy: speedup, hit, p50, p90. */
static void plot_data(FILE *f, const sweep_plot_t *sp)
{
    for (size_t k = 0; k < sp->a->n_policies; k++) {
        fprintf(f, "$p%zu << EOD\n", k);
        for (size_t i = 0; i < sp->pts->n; i++) {
            const point_t *p = &sp->pts->p[i];
            if (p->policy == sp->a->policies[k])
                fprintf(f, "%.17g %.17g %.17g %.17g\n", p->speedup, p->hit, p->p50, p->p90);
        }
        fputs("EOD\n", f);
    }
}

/* A policy's line style: each drawn thinner than the one before it, with its own point shape,
 * so that two policies with equal figures (kv and approx often are) both show: the later
 * inside the earlier. */
static void line_style(FILE *f, size_t k, bool dashed)
{
    static const int PT[] = {7, 5, 9, 11, 13, 15, 1, 2, 3};
    double lw = 4.0 - 0.6 * (double)k;
    fprintf(f, " with linespoints lw %.1f pt %d ps %.1f lc %zu%s", lw < 1.0 ? 1.0 : lw,
            PT[k % (sizeof PT / sizeof PT[0])], k < 4 ? 1.6 - 0.3 * (double)k : 0.6, k + 1,
            dashed ? " dt 2" : "");
}

static void plot_body(FILE *f, void *arg)
{
    const sweep_plot_t *sp = arg;
    const sim_args_t *a = sp->a;
    plot_data(f, sp);
    fputs("set key below horizontal\nset grid\nset xlabel 'speedup (load)'\n", f);
    fputs("set multiplot layout 1,2 title ", f);
    kvr_gnuplot_str(f, sp->title);
    fputs("\nset title 'prefix-cache hit ratio'\nset ylabel 'hit ratio'\nset yrange [0:*]\nplot ",
          f);
    for (size_t k = 0; k < a->n_policies; k++) {
        fprintf(f, "%s$p%zu using 1:2", k ? ", " : "", k);
        line_style(f, k, false);
        fputs(" title ", f);
        kvr_gnuplot_str(f, POLICY_NAMES[a->policies[k]]);
    }
    fputs("\nset title 'time to first token: p50 (solid), p90 (dashed)'\n"
          "set ylabel 'TTFT (ms)'\nset yrange [*:*]\nset logscale y\nplot ",
          f);
    for (size_t k = 0; k < a->n_policies; k++) {
        fprintf(f, "%s$p%zu using 1:3", k ? ", " : "", k);
        line_style(f, k, false);
        fputs(" title ", f);
        kvr_gnuplot_str(f, POLICY_NAMES[a->policies[k]]);
        fprintf(f, ", $p%zu using 1:4", k);
        line_style(f, k, true);
        fputs(" notitle", f);
    }
    fputs("\nunset multiplot\n", f);
}

static int plot_sweep(const sim_args_t *a, const kvr_trace_t *t, const char *path,
                      const points_t *pts)
{
    sweep_plot_t sp = {.a = a, .pts = pts};
    snprintf(sp.title, sizeof sp.title, "kvrouter sim: %zu requests of %s, %u workers x %u blocks",
             t->n_rows, path, (unsigned)a->cfg.n_workers, (unsigned)a->cfg.engine.num_gpu_blocks);
    kvr_gnuplot_t g = {.out = a->plot, .width = 1400, .height = 600, .body = plot_body, .arg = &sp};
    char err[512];
    int rc = kvr_gnuplot_draw(&g, err, sizeof err);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter sim: plot: %s\n", err);
        return rc == KVR_EINVAL ? 2 : 1;
    }
    if (!a->json)
        printf("plot: %s\n", a->plot);
    return 0;
}

int kvr_cmd_sim(int argc, char **argv)
{
    sim_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    char buf[PATH_MAX + 64];
    const char *path = find_trace(a.trace, buf, sizeof buf);
    if (path == NULL) {
        fprintf(stderr,
                "kvrouter sim: no trace: %s not found in the current directory nor beside the "
                "binary (../%s); give one with --trace FILE\n",
                DEFAULT_TRACE, DEFAULT_TRACE);
        return 2;
    }
    double t_start = kvr_now_s();
    kvr_trace_t t;
    char err[400];
    rc = kvr_trace_load(path, (size_t)(a.requests > SIZE_MAX ? SIZE_MAX : a.requests), &t, err,
                        sizeof err);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter sim: %s\n", err);
        return rc == KVR_EIO ? 2 : 1;
    }
    if (t.n_rows == 0) {
        fprintf(stderr, "kvrouter sim: %s: no requests\n", path);
        kvr_trace_free(&t);
        return 1;
    }
    uint32_t bs = a.cfg.engine.block_size;
    kvr_trace_ceilings_t ceil;
    if (KVR_TRACE_BLOCK_TOKENS % bs != 0) {
        fprintf(stderr, "kvrouter sim: --block-size %u: must divide 512 (the trace's block)\n",
                (unsigned)bs);
        kvr_trace_free(&t);
        return 2;
    }
    double t0 = kvr_now_s();
    rc = kvr_trace_ceilings(&t, bs, (uint64_t)a.cfg.n_workers * a.cfg.engine.num_gpu_blocks,
                            &ceil);
    double ceil_s = kvr_now_s() - t0;
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter sim: ceilings: %s\n", kvr_strerror(rc));
        kvr_trace_free(&t);
        return 1;
    }
    if (!a.json) {
        char sp[MAX_SPEEDUPS * 24] = "";
        for (size_t k = 0, used = 0; k < a.n_speedups && used < sizeof sp; k++)
            used +=
                (size_t)snprintf(sp + used, sizeof sp - used, "%s%g", k ? "," : "", a.speedups[k]);
        printf("sim: %zu requests from %s, %u workers x %u blocks x %u tokens, speedup %s, "
               "seed %llu\n"
               "ceilings (block %u): infinite cache %.4f, pooled LRU of %llu blocks %.4f "
               "(%.2f s)\n",
               t.n_rows, path, (unsigned)a.cfg.n_workers, (unsigned)a.cfg.engine.num_gpu_blocks,
               (unsigned)bs, sp, (unsigned long long)a.cfg.seed, (unsigned)bs, ceil.infinite,
               (unsigned long long)((uint64_t)a.cfg.n_workers * a.cfg.engine.num_gpu_blocks),
               ceil.pooled, ceil_s);
    }
    static points_t pts;
    pts.n = 0;
    int code = 0;
    if (a.records_path != NULL && (a.records = fopen(a.records_path, "w")) == NULL) {
        fprintf(stderr, "kvrouter sim: --records %s: %s\n", a.records_path, strerror(errno));
        kvr_trace_free(&t);
        return 2;
    }
    for (size_t k = 0; k < a.n_speedups && code == 0; k++) {
        a.speedup = a.speedups[k];
        code = run_load(&a, &t, &ceil, &pts);
    }
    if (a.records != NULL && fclose(a.records) != 0 && code == 0) {
        fprintf(stderr, "kvrouter sim: --records %s: %s\n", a.records_path, strerror(errno));
        code = 1;
    }
    if (code == 0 && a.plot != NULL)
        code = plot_sweep(&a, &t, path, &pts);
    if (!a.json && code == 0)
        printf("columns: requests finished; ttft, itl, e2e percentiles in modelled ms; hit: the\n"
               "engines' cached / prompt tokens; c_inf, c_pool: the trace's hit-ratio ceilings\n"
               "(an infinite cache; one LRU cache as large as all workers'); share: the busiest\n"
               "worker's share of requests; virt_s: modelled seconds; run_s: wall seconds\n"
               "total %.2f s\n",
               kvr_now_s() - t_start);
    kvr_trace_free(&t);
    return code;
}

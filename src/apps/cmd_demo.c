/*
 * cmd_demo.c: `kvrouter demo`, the whole system on loopback in one command: for each routing
 * policy (kv, then round-robin by default) it starts --workers `kvrouter mocker` engines (KV
 * events and replay endpoints on free ports, caches small enough that placement matters) and
 * a `kvrouter serve` router over them, replays the same slice of the conversation trace
 * against the router (replay/replay_report.h's kvr_replay_trace, in this process), stops them,
 * then prints the comparison (TTFT p50/p99, hit ratio against the trace's ceilings, the
 * busiest worker's share) and writes the plot (demo-ttft.png in the working directory).
 *
 * Time: the mockers run their modelled time --mocker-speedup times faster than real time and
 * the trace's arrivals are compressed --load times more than that (replay speedup = mocker
 * speedup x load), so the engines see --load times the trace's real request rate; latencies
 * are reported in modelled milliseconds (measured x mocker speedup), comparable with
 * `kvrouter sim --speedup LOAD`. The defaults (600 rows, 4 workers of 65,536 blocks, speedup 3,
 * load 4) take about 25 s per policy on a 2-core machine (docs/replay.md says why).
 *
 * Children: each is this binary (/proc/self/exe) in its own process group (so a terminal's
 * Ctrl-C reaches the demo only, which then stops them in order) and with PR_SET_PDEATHSIG, so
 * none outlives a demo that is killed outright; stdout is read for "listening HOST:PORT",
 * stderr goes to a log in a temporary directory, printed when something fails. SIGINT /
 * SIGTERM: the replay in progress stops (partial results are not reported), every child gets
 * SIGTERM (SIGKILL after 10 s), exit 130.
 *
 * --disagg: kv over --workers aggregated workers, then kv over the same workers split into
 * prefill and decode pools. The split (unless given as PxD) is the one that loads the busier
 * pool least, from the slice's modelled work at the demo's load (disagg_work: the mocker's
 * default timing model over the rows' lengths; O(rows), before anything starts). The report
 * gives each pool's busiest worker's share of its own legs (each mocker's
 * vllm:request_success_total, read before the fleet stops) and the TTFT-for-ITL trade-off.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "apps/apps.h"
#include "apps/child.h"
#include "apps/cli.h"
#include "replay/replay_report.h"
#include "http/http.h"
#include "replay/replay_driver.h"
#include "kvrouter.h"
#include "sim/ceilings.h"
#include "sim/engine.h"
#include "wire/trace.h"

#define DEFAULT_TRACE "data/traces/conversation_trace.jsonl"
#define MAX_POLICIES 8
#define MAX_WORKERS 16
#define MAX_ROUTERS 4

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter demo [options]\n\n"
            "Starts a router and mocker engines on loopback for each routing policy, replays the\n"
            "same slice of the conversation trace against each, and compares them: TTFT p50/p99,\n"
            "prefix-cache hit ratio against the trace's ceilings, the busiest worker's share.\n"
            "Writes the TTFT plot (gnuplot) and cleans up every process it started.\n\n"
            "options (defaults in brackets):\n"
            "  --policy LIST         comma-separated: kv, round-robin, random, least-loaded;\n"
            "                        kv+sync = kv with replica sync (with --routers 2 or more)\n"
            "                        [kv,round-robin; with --routers: kv+sync,kv,round-robin]\n"
            "  --routers N           router replicas sharing the fleet (1 to 4); requests\n"
            "                        alternate between them; 2 or more start a nats-server [1]\n"
            "  --workers N           mocker engines [4]\n"
            "  --requests N          the first N rows of the trace [600]\n"
            "  --trace FILE          [data/traces/conversation_trace.jsonl]\n"
            "  --num-gpu-blocks N    KV blocks per engine [65536]\n"
            "  --block-size N        tokens per KV block, must divide 512 [16]\n"
            "  --mocker-speedup X    engines run modelled time X times faster [3]\n"
            "  --load X              arrivals compressed X times more than the engines' time,\n"
            "                        i.e. X times the trace's request rate [4]\n"
            "  --plot FILE           .png or .svg [demo-ttft.png]\n"
            "  --disagg [auto|PxD]   compares --workers aggregated workers (kv) with the same\n"
            "                        workers split into P prefill and D decode workers\n"
            "                        (kv/PxD: the prefill leg on the prefill pool, its KV\n"
            "                        pulled by the decode worker); auto (also a bare --disagg)\n"
            "                        splits them in proportion to the slice's modelled prefill\n"
            "                        and decode work at --load; PxD (e.g. 2P2D) sets the split\n"
            "                        and the worker count\n"
            "  --keep DIR            keep the logs and per-request samples in DIR\n"
            "  --keep-up             after the comparison, keep the first kv run's router and\n"
            "                        mockers up (its live view at /ui) until Ctrl-C\n"
            "  --json                one JSON object per policy (kvrouter replay --json's keys)\n"
            "  --quiet               no progress on stderr\n");
}

typedef struct demo_args {
    const char *policies[MAX_POLICIES];
    size_t n_policies;
    char policy_buf[256];
    uint32_t workers, num_gpu_blocks, block_size;
    uint64_t requests;
    const char *trace, *plot, *keep;
    bool trace_set;
    bool keep_up; /* the first kv run's fleet stays up after the comparison */
    double mocker_speedup, load;
    bool json, quiet, policies_set;
    uint32_t routers;
    bool disagg, disagg_auto; /* --disagg [auto|PxD] */
    uint32_t prefill, decode; /* the split (auto: chosen once the trace is loaded) */
    char disagg_label[32];
} demo_args_t;

static int parse_policies(const kvr_cli_t *c, const char *v, demo_args_t *a)
{
    static const char *known[] = {"kv", "round-robin", "random", "least-loaded", "kv+sync"};
    int rc = kvr_cli_copy(c, v, a->policy_buf, sizeof a->policy_buf);
    if (rc != 0)
        return rc;
    a->n_policies = 0;
    for (char *save = NULL, *p = strtok_r(a->policy_buf, ",", &save); p;
         p = strtok_r(NULL, ",", &save)) {
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            ok = ok || strcmp(p, known[k]) == 0;
        if (!ok)
            return kvr_cli_bad(c, v, "each must be kv, kv+sync, round-robin, random or "
                                     "least-loaded");
        if (a->n_policies == MAX_POLICIES)
            return kvr_cli_bad(c, v, "at most 8");
        a->policies[a->n_policies++] = p;
    }
    if (a->n_policies == 0)
        return kvr_cli_bad(c, v, "none given");
    return 0;
}

/* --disagg, --disagg auto, --disagg=auto or --disagg PxD: a bare --disagg (the last argument,
 * or one followed by another option) is auto. */
static int parse_disagg(kvr_cli_t *c, demo_args_t *a)
{
    const char *v = "auto";
    if (c->eq != NULL || (c->i + 1 < c->argc && strncmp(c->argv[c->i + 1], "--", 2) != 0))
        v = kvr_cli_value(c);
    a->disagg = true;
    a->disagg_auto = strcmp(v, "auto") == 0;
    if (a->disagg_auto)
        return 0;
    unsigned p = 0, d = 0;
    char tail;
    if (sscanf(v, "%uP%uD%c", &p, &d, &tail) != 2 || p == 0 || d == 0 || p + d > MAX_WORKERS)
        return kvr_cli_bad(c, v, "auto, or PxD as in 2P2D (P, D >= 1, P + D <= 16)");
    a->prefill = p;
    a->decode = d;
    return 0;
}

/* One option at c->argv[c->i] (kvr_cli_option_fn). */
static int parse_option(kvr_cli_t *c, void *args)
{
    demo_args_t *a = args;
    const char *arg = c->argv[c->i];
    if (strcmp(arg, "--json") == 0) {
        a->json = true;
        return 0;
    }
    if (strcmp(arg, "--quiet") == 0) {
        a->quiet = true;
        return 0;
    }
    if (kvr_cli_is_or_old(c, "--policy", "--policies")) {
        a->policies_set = true;
        return parse_policies(c, kvr_cli_value(c), a);
    }
    if (kvr_cli_is(c, "--routers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, MAX_ROUTERS, &a->routers);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, MAX_WORKERS, &a->workers);
    if (kvr_cli_is(c, "--requests"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT32_MAX, &a->requests);
    if (kvr_cli_is(c, "--num-gpu-blocks"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &a->num_gpu_blocks);
    if (kvr_cli_is(c, "--block-size"))
        return kvr_cli_trace_block_size(c, kvr_cli_value(c), &a->block_size);
    if (kvr_cli_is(c, "--mocker-speedup"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->mocker_speedup);
    if (kvr_cli_is(c, "--load"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->load);
    if (kvr_cli_is(c, "--trace")) {
        a->trace_set = true;
        return kvr_cli_str(c, kvr_cli_value(c), &a->trace);
    }
    if (kvr_cli_is(c, "--plot"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->plot);
    if (kvr_cli_is(c, "--keep"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->keep);
    if (strcmp(arg, "--keep-up") == 0) {
        a->keep_up = true;
        return 0;
    }
    if (kvr_cli_is(c, "--disagg"))
        return parse_disagg(c, a);
    return -1;
}

static int parse_args(int argc, char **argv, demo_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->workers = 4;
    a->requests = 600;
    a->num_gpu_blocks = 65536;
    a->block_size = 16;
    a->mocker_speedup = 3.0;
    a->load = 4.0;
    a->trace = DEFAULT_TRACE;
    a->plot = "demo-ttft.png";
    a->policies[0] = "kv";
    a->policies[1] = "round-robin";
    a->n_policies = 2;
    a->routers = 1;
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter demo", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, a, usage);
    if (rc != 0)
        return rc;
    if (a->routers > 1 && !a->policies_set) {
        a->policies[0] = "kv+sync";
        a->policies[1] = "kv";
        a->policies[2] = "round-robin";
        a->n_policies = 3;
    }
    for (size_t i = 0; i < a->n_policies; i++)
        if (strcmp(a->policies[i], "kv+sync") == 0 && a->routers < 2)
            return kvr_cli_fail(&c, "--policy kv+sync needs --routers 2 or more");
    if (a->disagg) { /* aggregated kv against the same number of workers split */
        if (a->routers > 1 || a->policies_set)
            return kvr_cli_fail(&c, "--disagg compares kv with kv/PxD: no --routers or "
                                    "--policy with it");
        if (a->disagg_auto && a->workers < 2)
            return kvr_cli_fail(&c, "--disagg auto needs --workers 2 or more (a prefill and a "
                                    "decode worker)");
        if (!a->disagg_auto)
            a->workers = a->prefill + a->decode;
        snprintf(a->disagg_label, sizeof a->disagg_label, "kv/%uP%uD", a->prefill, a->decode);
        a->policies[0] = "kv";
        a->policies[1] = a->disagg_label;
        a->n_policies = 2;
    }
    return 0;
}

/* ---- the disaggregated split ------------------------------------------------------------- */

/* The slice's modelled work per modelled second at the demo's load, in workers kept busy, with
 * the mocker's default engine (the demo passes it no timing or batching flag):
 *   prefill  each prompt computed cold in max_num_batched_tokens chunks, a chunk of T tokens
 *            taking a T^2 + b T + c ms (a busy prefill worker runs full chunks back to back);
 *   decode   each request holds its prompt + output KV blocks on its decode worker for output
 *            steps of decode(u = 1) ms (a decode worker is sized by its KV: filled, each step
 *            takes the full-cache time), as a share of one worker's --num-gpu-blocks.
 * Decode work is KV held, not step time: a step serves every running request at once. */
typedef struct disagg_work {
    double prefill, decode; /* workers kept busy */
    double chunk;           /* tokens per prefill step */
    double step_ms;         /* decode step at a full cache */
    kvr_engine_timing_t tm;
} disagg_work_t;

static double prefill_ms(const disagg_work_t *w, double tokens)
{
    double ms = 0;
    for (double left = tokens; left > 0; left -= w->chunk) {
        double t = fmin(left, w->chunk);
        ms += w->tm.prefill_a * t * t + w->tm.prefill_b * t + w->tm.prefill_c;
    }
    return ms;
}

static void disagg_work(const demo_args_t *a, const kvr_trace_t *t, size_t n, double span_s,
                        disagg_work_t *w)
{
    kvr_engine_config_t eng;
    kvr_engine_config_default(&eng);
    w->tm = eng.timing;
    w->chunk = eng.max_num_batched_tokens;
    w->step_ms = fmax(w->tm.decode_min_ms, w->tm.decode_a + w->tm.decode_b + w->tm.decode_c);
    double pf_ms = 0, kv_ms = 0; /* kv_ms: worker-ms of KV held (blocks / capacity x ms) */
    for (size_t i = 0; i < n; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        double blocks = ceil(((double)r->input_length + r->output_length) / a->block_size);
        pf_ms += prefill_ms(w, r->input_length);
        kv_ms += blocks / a->num_gpu_blocks * (double)r->output_length * w->step_ms;
    }
    /* the engines see the arrivals compressed --load times: modelled seconds of arrivals */
    double modelled_s = fmax(span_s, 1e-3) / a->load;
    w->prefill = pf_ms / 1e3 / modelled_s;
    w->decode = kv_ms / 1e3 / modelled_s;
}

/* How loaded the busier pool is with p prefill workers of `workers` (1 = at capacity). */
static double split_load(const disagg_work_t *w, uint32_t workers, uint32_t p)
{
    return fmax(w->prefill / p, w->decode / (workers - p));
}

/* The prefill worker count (1 .. workers - 1) that loads the busier pool least: the workers in
 * proportion to the two works, rounded the way the bottleneck prefers. */
static uint32_t best_split(const disagg_work_t *w, uint32_t workers)
{
    uint32_t best = 1;
    for (uint32_t p = 2; p < workers; p++)
        if (split_load(w, workers, p) < split_load(w, workers, best))
            best = p;
    return best;
}

static const char *plural(uint32_t n) { return n == 1 ? "" : "s"; }

/* The smallest fleet from `workers` up whose best split keeps both pools within capacity
 * (0: none up to 256), and that split's prefill count. */
static uint32_t workers_needed(const disagg_work_t *w, uint32_t workers, uint32_t *p)
{
    for (uint32_t n = workers; n <= 256; n++)
        if (split_load(w, n, *p = best_split(w, n)) <= 1.0)
            return n;
    return 0;
}

/* The split line (which, and why: the two estimates) and its legend. */
static void print_split(const demo_args_t *a, const disagg_work_t *w, FILE *out)
{
    uint32_t auto_p = best_split(w, a->workers);
    fprintf(out,
            "split %uP%uD (%s): the slice's modelled work at load x%g keeps %.2f workers busy "
            "with prefill and %.2f with decode, so %u prefill worker%s run%s at %.0f%% and %u "
            "decode worker%s at %.0f%% of capacity",
            a->prefill, a->decode, a->disagg_auto ? "auto" : "given", a->load, w->prefill,
            w->decode, a->prefill, plural(a->prefill), a->prefill == 1 ? "s" : "",
            100.0 * w->prefill / a->prefill, a->decode, plural(a->decode),
            100.0 * w->decode / a->decode);
    if (!a->disagg_auto && auto_p != a->prefill)
        fprintf(out, " (auto: %uP%uD)", auto_p, a->workers - auto_p);
    fprintf(out,
            "\n(prefill: each prompt computed cold in %.0f-token steps of %.3g T^2 + %.3g T + "
            "%.3g ms;\n decode: each request's prompt + output KV held for output x %.1f ms steps "
            "(a full cache's),\n as a share of a worker's %u blocks; auto: the split that loads "
            "the busier pool least)\n",
            w->chunk, w->tm.prefill_a, w->tm.prefill_b, w->tm.prefill_c, w->step_ms,
            a->num_gpu_blocks);
    if (split_load(w, a->workers, a->prefill) <= 1.0)
        return;
    bool pf = w->prefill / a->prefill >= w->decode / a->decode;
    fprintf(out,
            "(over capacity: the %s pool's queue grows for the whole run, and TTFT with it;\n"
            " aggregated workers run their decodes inside their prefill steps instead",
            pf ? "prefill" : "decode");
    uint32_t p = 0, need = workers_needed(w, a->workers, &p);
    if (need > 0)
        fprintf(out,
                ";\n split, this load needs about %u workers, %uP%uD, for both pools to "
                "keep up",
                need, p, need - p);
    fprintf(out, ")\n");
}

/* ---- children ---------------------------------------------------------------------------- */

/* ---- one policy ------------------------------------------------------------------------- */

typedef struct fleet {
    kvr_child_t mockers[MAX_WORKERS];
    size_t n_mockers;
    kvr_child_t routers[MAX_ROUTERS];
    size_t n_routers;
} fleet_t;

static void fleet_stop(fleet_t *f, bool report)
{
    for (size_t i = 0; i < f->n_routers; i++) {
        int st = kvr_child_stop(&f->routers[i]);
        if (report && st != 0) {
            fprintf(stderr, "kvrouter demo: warning: router %zu exited with status %d\n", i + 1,
                    st);
            kvr_child_show_log(&f->routers[i]);
        }
    }
    f->n_routers = 0;
    for (size_t i = 0; i < f->n_mockers; i++) {
        int st = kvr_child_stop(&f->mockers[i]);
        if (report && st != 0) {
            fprintf(stderr, "kvrouter demo: warning: mocker %zu exited with status %d\n", i + 1,
                    st);
            kvr_child_show_log(&f->mockers[i]);
        }
    }
    f->n_mockers = 0;
}

static unsigned g_fleets;

/* A policy label as a file name part ("kv/2P2D" -> "kv-2P2D"). */
static const char *slug(const char *policy, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", policy);
    for (char *c = buf; *c != '\0'; c++)
        if (*c == '/')
            *c = '-';
    return buf;
}

static int fleet_start(fleet_t *f, const demo_args_t *a, const char *policy, const char *dir,
                       const char *nats_url, char *err, size_t err_len)
{
    memset(f, 0, sizeof *f);
    uint32_t n_prefill = strchr(policy, '/') != NULL ? a->prefill : 0; /* kv/PxD */
    char name[64];
    slug(policy, name, sizeof name);
    char speed[32], blocks[32], bs[32];
    snprintf(speed, sizeof speed, "%g", a->mocker_speedup);
    snprintf(blocks, sizeof blocks, "%u", a->num_gpu_blocks);
    snprintf(bs, sizeof bs, "%u", a->block_size);
    static char specs[MAX_WORKERS][512];
    for (uint32_t i = 0; i < a->workers; i++) {
        int rc = KVR_EIO;
        for (int attempt = 0; attempt < 3 && rc != KVR_OK && !g_stop; attempt++) {
            int ev = kvr_free_port(), rp = kvr_free_port();
            if (ev < 0 || rp < 0 || ev == rp)
                continue;
            char kv[256], log[PATH_MAX], what[64];
            /* the events endpoint has a star for the host: as in vLLM, the engine's PUB
             * socket binds only when its endpoint has one (or "::", or is ipc/inproc) and
             * connects otherwise, and the router's SUB connects to tcp://HOST:PORT; with
             * 127.0.0.1 on both sides both would connect and no KV event would ever flow */
            snprintf(kv, sizeof kv,
                     "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":"
                     "\"tcp://*:%d\",\"replay_endpoint\":\"tcp://127.0.0.1:%d\"}",
                     ev, rp);
            snprintf(log, sizeof log, "%.2000s/%.32s-mocker-%u.log", dir, name, i + 1);
            snprintf(what, sizeof what, "mocker %u", i + 1);
            const char *role = n_prefill == 0 ? "both" : i < n_prefill ? "prefill" : "decode";
            char *argv[] = {"kvrouter",          "mocker",   "--host",       "127.0.0.1",
                            "--port",            "0",        "--speedup",    speed,
                            "--num-gpu-blocks",  blocks,     "--block-size", bs,
                            "--kv-events-config", kv,        "--log-level",  "warn",
                            "--role",            (char *)role, NULL};
            rc = kvr_child_start(&f->mockers[i], what, argv, log, err, err_len);
            if (rc != KVR_OK) {
                kvr_child_stop(&f->mockers[i]);
                if (attempt == 2 || g_stop)
                    kvr_child_show_log(&f->mockers[i]);
                continue;
            }
            snprintf(specs[i], sizeof specs[i],
                     "id=%u,url=http://%s,events=tcp://127.0.0.1:%d,replay=tcp://127.0.0.1:%d,"
                     "role=%s",
                     i + 1, f->mockers[i].addr, ev, rp, role);
        }
        if (rc != KVR_OK)
            return rc;
        f->n_mockers++;
    }
    bool sync = strcmp(policy, "kv+sync") == 0;
    char ns[32];
    snprintf(ns, sizeof ns, "demo%u", ++g_fleets); /* each run its own namespace */
    for (uint32_t r = 0; r < a->routers; r++) {
        char *argv[24 + 2 * MAX_WORKERS];
        size_t k = 0;
        char *fixed[] = {"kvrouter", "serve",      "--http-port", "0",    "--bind",
                         "127.0.0.1", "--block-size", bs,          "--router-mode",
                         sync || n_prefill ? "kv" : (char *)policy, "--log-level", "warn",
                         "--seed", "1"};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            argv[k++] = fixed[i];
        if (nats_url != NULL) {
            argv[k++] = "--nats-url";
            argv[k++] = (char *)nats_url;
            argv[k++] = "--namespace";
            argv[k++] = ns;
            argv[k++] = "--router-replica-sync";
            argv[k++] = sync ? "true" : "false";
        }
        for (uint32_t i = 0; i < a->workers; i++) {
            argv[k++] = "--worker";
            argv[k++] = specs[i];
        }
        argv[k] = NULL;
        char log[PATH_MAX], what[64];
        snprintf(log, sizeof log, "%.2000s/%.32s-router-%u.log", dir, name, r + 1);
        snprintf(what, sizeof what, "router %u", r + 1);
        int rc = kvr_child_start(&f->routers[r], what, argv, log, err, err_len);
        f->n_routers++;
        if (rc != KVR_OK) {
            kvr_child_show_log(&f->routers[r]);
            return rc;
        }
    }
    /* ready (with replica sync: the peers' snapshot taken), then a moment for the ZeroMQ
     * subscriptions to connect: a slow joiner's first batches would be replayed later, but
     * why wait (the demo only; nothing is asserted on it) */
    for (size_t r = 0; r < f->n_routers; r++)
        if (kvr_child_wait_ready(&f->routers[r], 30.0) != KVR_OK) {
            snprintf(err, err_len, "router %zu did not become ready", r + 1);
            return KVR_EIO;
        }
    usleep(200000);
    return KVR_OK;
}

/* --keep-up: the kept fleet serves its live view until a signal (no test waits on this: it
 * is for a person at the page). */
static void keep_up(const fleet_t *f)
{
    fprintf(stderr, "kvrouter demo: the kv run's router is still up: its live view at "
                    "http://%s/ui (Ctrl-C to stop it)\n",
            f->routers[0].addr);
    while (!g_stop)
        pause(); /* a signal ends it; on_signal sets g_stop */
}

/* ---- the report -------------------------------------------------------------------------- */

typedef struct run {
    const char *policy;
    kvr_replay_summary_t m;
    double pool_hit[2]; /* the router's per-pool hit ratio: prefill, decode (NAN: none) */
    uint32_t n_prefill;         /* prefill workers of the run (0: aggregated) */
    double served[MAX_WORKERS]; /* disaggregated: legs each mocker finished (NAN: unknown) */
    double kv_tokens[MAX_WORKERS]; /* ... and prompt tokens it loaded from a prefill worker */
    char tsv[PATH_MAX];
    char url[160];
    char model[256];
} run_t;

/* The value of the sample `name{label}` in Prometheus text (NAN when absent). */
static double sample(const char *text, const char *name, const char *label)
{
    size_t nl = strlen(name);
    for (const char *l = text; l != NULL && *l != '\0'; l = strchr(l, '\n'), l = l ? l + 1 : l) {
        if (strncmp(l, name, nl) != 0 || l[nl] != '{')
            continue;
        const char *close = strchr(l, '}');
        const char *eol = strchr(l, '\n');
        const char *hit = strstr(l, label);
        if (close == NULL || hit == NULL || hit > close || (eol != NULL && close > eol))
            continue;
        return strtod(close + 1, NULL);
    }
    return NAN;
}

/* The router's hit ratio per pool (cached / prompt tokens placed), from its /metrics. */
static void pool_hits(const char *url, double out[2])
{
    out[0] = out[1] = NAN;
    uint8_t *body = NULL;
    size_t len = 0;
    int status = 0;
    char err[256];
    kvr_http_fetch_t q = {.url = url, .path = "/metrics", .timeout_ms = 5000,
                          .max_bytes = (size_t)8 << 20};
    if (kvr_http_fetch(&q, &body, &len, &status, err, sizeof err) != KVR_OK || status != 200) {
        free(body);
        return;
    }
    char *text = realloc(body, len + 1);
    if (text == NULL) {
        free(body);
        return;
    }
    text[len] = '\0';
    static const char *const pools[2] = {"pool=\"prefill\"", "pool=\"decode\""};
    for (int i = 0; i < 2; i++) {
        double c = sample(text, "kvr_pool_cached_tokens_total", pools[i]);
        double p = sample(text, "kvr_pool_prompt_tokens_total", pools[i]);
        out[i] = p > 0 ? c / p : NAN;
    }
    free(text);
}

/* The requests a mocker finished and the prompt tokens it loaded from prefill workers (its one
 * engine's vllm:request_success_total, kvr_mocker_kv_loaded_tokens_total; NAN: no answer). */
static void legs_served(const kvr_child_t *mocker, double *requests, double *kv_tokens)
{
    int status = 0;
    char *text = kvr_child_get(mocker, "/metrics", &status);
    bool ok = text != NULL && status == 200;
    *requests = ok ? sample(text, "vllm:request_success_total", "engine=\"0\"") : NAN;
    *kv_tokens = ok ? sample(text, "kvr_mocker_kv_loaded_tokens_total", "engine=\"0\"") : NAN;
    free(text);
}

static void fmt_ms(char *buf, size_t len, double x)
{
    if (isfinite(x))
        snprintf(buf, len, "%.0f ms", x);
    else
        snprintf(buf, len, "-");
}

/* The busiest of mockers [lo, hi)'s share of the requests they finished (NAN: unknown). */
static double pool_share(const run_t *r, uint32_t lo, uint32_t hi)
{
    double sum = 0, most = 0;
    for (uint32_t i = lo; i < hi; i++) {
        sum += r->served[i];
        most = fmax(most, r->served[i]);
    }
    return sum > 0 ? most / sum : NAN;
}

static void print_max_share(const run_t *r, uint32_t workers, char *buf, size_t cap)
{
    if (r->n_prefill == 0)
        snprintf(buf, cap, "%.3f", r->m.r.max_worker_share);
    else
        snprintf(buf, cap, "%.2f/%.2f", pool_share(r, 0, r->n_prefill),
                 pool_share(r, r->n_prefill, workers));
}

/* "kv/2P2D: requests per worker (...): prefill 1: 295, 2: 305; decode 3: 296, 4: 304"
 * and the KV each decode worker loaded, which is what its placement balances. */
static void print_served(const run_t *r, uint32_t workers)
{
    printf("%s: requests per worker (each engine's vllm:request_success_total): prefill",
           r->policy);
    for (uint32_t i = 0; i < workers; i++)
        printf("%s%u: %.0f", i == r->n_prefill ? "; decode " : i == 0 ? " " : ", ", i + 1,
               r->served[i]);
    printf("\n(a decode leg goes where the requests in flight hold the fewest KV blocks (weighed "
           "with the engine step under way), not where they are fewest; prompt tokens each "
           "decode worker loaded:");
    for (uint32_t i = r->n_prefill; i < workers; i++)
        printf("%s%u: %.2fM", i == r->n_prefill ? " " : ", ", i + 1, r->kv_tokens[i] / 1e6);
    printf(")\n");
}

/* The sentence on what the two rows show: aggregated runs[0], disaggregated runs[1]. */
static void print_tradeoff(const run_t *runs)
{
    const kvr_replay_summary_t *agg = &runs[0].m, *dis = &runs[1].m;
    bool smoother = dis->r.itl_ms.p90 < 0.9 * agg->r.itl_ms.p90; /* beyond run-to-run noise */
    printf("Disaggregation trades TTFT for ITL: the decode workers never run a prefill, so\n"
           "inter-token latency %s (ITL p90 %.0f ms against %.0f ms aggregated, p50 %.0f\n"
           "against %.0f), while each request pays the KV transfer and the prefill pool's queue\n"
           "(TTFT p50 %.0f ms against %.0f ms aggregated, p99 %.0f against %.0f).\n",
           smoother ? "is smoother"
                    : "is smoother only where prefills stall decode steps, and here few did",
           dis->r.itl_ms.p90, agg->r.itl_ms.p90, dis->r.itl_ms.p50, agg->r.itl_ms.p50,
           dis->r.ttft_ms.p50, agg->r.ttft_ms.p50, dis->r.ttft_ms.p99, agg->r.ttft_ms.p99);
}

static void print_comparison(const demo_args_t *a, const disagg_work_t *work, const run_t *runs,
                             size_t n, size_t rows, double span_s, double c_inf, double c_pool)
{
    double speedup = a->mocker_speedup * a->load;
    printf("\nkvrouter demo: %zu requests of %s (%.0f s of arrivals replayed in %.1f s),\n"
           "%u mocker workers x %u KV blocks of %u tokens, engines at speedup %g, load x%g\n"
           "(latencies in modelled ms: measured x %g)\n\n",
           rows, a->trace, span_s, span_s / speedup, a->workers, a->num_gpu_blocks,
           a->block_size, a->mocker_speedup, a->load, a->mocker_speedup);
    if (a->routers > 1)
        printf("%u router replicas behind one client that alternates between them; kv+sync "
               "shares their active load over NATS, kv does not (each sees only its own "
               "requests' load)\n\n",
               a->routers);
    bool dis = a->prefill > 0;
    if (dis) {
        print_split(a, work, stdout);
        printf("\n");
    }
    printf("%-13s %10s %10s %10s %10s %10s %10s %10s %11s %8s\n", "policy", "TTFT p50",
           "TTFT p90", "TTFT p99", "ITL p50", "ITL p90", "E2E p50", dis ? "hit P/D" : "hit ratio",
           "max share", "errors");
    for (size_t i = 0; i < n; i++) {
        const kvr_replay_summary_t *m = &runs[i].m;
        char p50[32], p90[32], p99[32], e2e[32], i50[32], i90[32], hit[32], share[32];
        fmt_ms(p50, sizeof p50, m->r.ttft_ms.p50);
        fmt_ms(p90, sizeof p90, m->r.ttft_ms.p90);
        fmt_ms(p99, sizeof p99, m->r.ttft_ms.p99);
        fmt_ms(i50, sizeof i50, m->r.itl_ms.p50);
        fmt_ms(i90, sizeof i90, m->r.itl_ms.p90);
        fmt_ms(e2e, sizeof e2e, m->r.e2e_ms.p50);
        if (!dis)
            snprintf(hit, sizeof hit, "%.3f", m->r.hit_ratio);
        else if (isnan(runs[i].pool_hit[0])) /* aggregated: one pool */
            snprintf(hit, sizeof hit, "%.3f", runs[i].pool_hit[1]);
        else
            snprintf(hit, sizeof hit, "%.2f/%.2f", runs[i].pool_hit[0], runs[i].pool_hit[1]);
        print_max_share(&runs[i], a->workers, share, sizeof share);
        printf("%-13s %10s %10s %10s %10s %10s %10s %10s %11s %8zu\n", runs[i].policy, p50,
               p90, p99, i50, i90, e2e, hit, share, m->failed);
    }
    if (dis)
        printf("(hit P/D: the router's index hit ratio of its placements on the prefill pool / "
               "on the decode pool; the decode choice ignores the cache (overlap credit 0), so "
               "its number is what the chosen decode worker happened to hold)\n");
    /* under the hit-ratio column, where it compares */
    printf("%-13s %10s %10s %10s %10s %10s %10s %10.3f\n", "ceiling", "", "", "", "", "", "",
           c_inf);
    printf("(hit ratio: the share of prompt tokens the engines found cached; ceiling: the\n"
           " most any routing could reach, with every block cached forever; max share: the\n"
           " busiest worker's share of the requests, 1/%u when spread evenly",
           a->workers);
    if (dis)
        printf(";\n P/D: the busiest prefill worker's share of the prefill legs / the busiest\n"
               " decode worker's share of the decode legs, 1/%u / 1/%u when spread evenly)\n",
               a->prefill, a->decode);
    else
        printf(")\n");
    for (size_t i = 0; i < n && dis; i++)
        if (runs[i].n_prefill > 0)
            print_served(&runs[i], a->workers);
    printf("\nhit-ratio ceilings of the slice: %.3f with an infinite cache, %.3f with one LRU cache "
           "of all %u x %u blocks\n",
           c_inf, c_pool, a->workers, a->num_gpu_blocks);
    if (n >= 2 && dis) {
        const kvr_replay_summary_t *x = &runs[1].m, *y = &runs[0].m;
        printf("%s vs %s: TTFT p50 x%.2f, p99 x%.2f; ITL p50 x%.2f, p90 x%.2f; E2E p50 x%.2f\n",
               runs[1].policy, runs[0].policy, x->r.ttft_ms.p50 / y->r.ttft_ms.p50,
               x->r.ttft_ms.p99 / y->r.ttft_ms.p99, x->r.itl_ms.p50 / y->r.itl_ms.p50,
               x->r.itl_ms.p90 / y->r.itl_ms.p90, x->r.e2e_ms.p50 / y->r.e2e_ms.p50);
        print_tradeoff(runs);
    } else if (n >= 2) {
        const kvr_replay_summary_t *x = &runs[0].m, *y = &runs[1].m;
        printf("%s vs %s: TTFT p50 %+.0f%%, p99 %+.0f%%; hit ratio %.3f vs %.3f (%.0f%% vs "
               "%.0f%% of the infinite-cache ceiling)\n",
               runs[0].policy, runs[1].policy,
               100.0 * (x->r.ttft_ms.p50 / y->r.ttft_ms.p50 - 1.0),
               100.0 * (x->r.ttft_ms.p99 / y->r.ttft_ms.p99 - 1.0), x->r.hit_ratio,
               y->r.hit_ratio, 100.0 * x->r.hit_ratio / c_inf, 100.0 * y->r.hit_ratio / c_inf);
    }
}

static const char *find_trace(const demo_args_t *a, char *buf, size_t cap)
{
    const char *p = a->trace_set ? NULL : kvr_cli_data_file(DEFAULT_TRACE, buf, cap);
    return p != NULL ? p : a->trace;
}

int kvr_cmd_demo(int argc, char **argv)
{
    demo_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    double t_start = kvr_child_now_s();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    kvr_child_stop_flag(&g_stop);
    signal(SIGPIPE, SIG_IGN);

    char trace_buf[PATH_MAX + 64];
    a.trace = find_trace(&a, trace_buf, sizeof trace_buf);
    kvr_trace_t trace;
    char err[1024];
    if (kvr_trace_load(a.trace, (size_t)a.requests, &trace, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter demo: %s\n", err);
        return 1;
    }
    size_t n = trace.n_rows;
    if (n == 0) {
        fprintf(stderr, "kvrouter demo: %s: no requests\n", a.trace);
        kvr_trace_free(&trace);
        return 1;
    }
    kvr_trace_ceilings_t ceil;
    if (kvr_trace_ceilings(&trace, a.block_size, (uint64_t)a.workers * a.num_gpu_blocks,
                           &ceil) != KVR_OK) {
        ceil.infinite = ceil.pooled = NAN;
    }
    double span_s = (double)(trace.rows[n - 1].timestamp_ms - trace.rows[0].timestamp_ms) /
                    1000.0;
    bool have_gnuplot = kvr_replay_have_gnuplot();
    disagg_work_t work;
    disagg_work(&a, &trace, n, span_s, &work);
    if (a.disagg_auto) {
        a.prefill = best_split(&work, a.workers);
        a.decode = a.workers - a.prefill;
        snprintf(a.disagg_label, sizeof a.disagg_label, "kv/%uP%uD", a.prefill, a.decode);
    }
    if (a.disagg && a.json)
        print_split(&a, &work, stderr);

    char dir[PATH_MAX];
    if (a.keep) {
        snprintf(dir, sizeof dir, "%s", a.keep);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "kvrouter demo: --keep %s: %s\n", dir, strerror(errno));
            kvr_trace_free(&trace);
            return 1;
        }
    } else {
        if (kvr_child_workdir(dir, sizeof dir, "demo", err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrouter demo: %s\n", err);
            kvr_trace_free(&trace);
            return 1;
        }
    }

    kvr_replay_sample_t *samples = calloc(n, sizeof *samples);
    run_t *runs = calloc(a.n_policies, sizeof *runs);
    if (samples == NULL || runs == NULL) {
        fprintf(stderr, "kvrouter demo: out of memory\n");
        free(samples);
        free(runs);
        kvr_trace_free(&trace);
        return 1;
    }
    int code = 0;
    size_t done = 0;
    kvr_child_t nats;
    char nats_url[64] = "";
    bool nats_up = false;
    if (a.routers > 1) {
        if (kvr_nats_server_start(&nats, dir, nats_url, sizeof nats_url, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrouter demo: %s\n", err);
            kvr_child_stop(&nats);
            code = 1;
        } else {
            nats_up = true;
        }
    }
    fleet_t kept; /* --keep-up: the first kv run's fleet */
    bool have_kept = false;
    for (size_t p = 0; p < a.n_policies && code == 0 && !g_stop; p++) {
        run_t *r = &runs[p];
        r->policy = a.policies[p];
        char name[64];
        snprintf(r->tsv, sizeof r->tsv, "%.2000s/%.32s.tsv", dir, slug(r->policy, name, sizeof name));
        if (!a.quiet)
            fprintf(stderr, "kvrouter demo: %s: starting %u mockers and the router\n",
                    r->policy, a.workers);
        fleet_t fleet;
        if (fleet_start(&fleet, &a, r->policy, dir, nats_up ? nats_url : NULL, err,
                        sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrouter demo: %s\n", err);
            fleet_stop(&fleet, false);
            code = 1;
            break;
        }
        snprintf(r->url, sizeof r->url, "http://%s", fleet.routers[0].addr);
        if (!a.quiet)
            fprintf(stderr, "kvrouter demo: %s: live view at %s/ui\n", r->policy, r->url);
        char more[MAX_ROUTERS][160];
        const char *more_urls[MAX_ROUTERS];
        for (size_t k = 1; k < fleet.n_routers; k++) {
            snprintf(more[k - 1], sizeof more[k - 1], "http://%s", fleet.routers[k].addr);
            more_urls[k - 1] = more[k - 1];
        }
        char label[64];
        snprintf(label, sizeof label, "kvrouter demo (%s)", r->policy);
        kvr_replay_job_t job = {
            .url = r->url,
            .more_urls = more_urls,
            .n_more_urls = fleet.n_routers - 1,
            .trace = &trace,
            .n = n,
            .speedup = a.mocker_speedup * a.load,
            .seed = 0,
            .model = NULL,
            .max_inflight = 1024,
            .timeout_s = 300.0,
            .progress = !a.quiet,
            .progress_label = label,
            .catch_signals = true,
        };
        kvr_replay_stats_t st;
        rc = kvr_replay_trace(&job, samples, &st, r->model, sizeof r->model, err, sizeof err);
        if (rc == KVR_OK && st.interrupted)
            g_stop = 1;
        bool ok = rc == KVR_OK && !g_stop;
        pool_hits(r->url, r->pool_hit);
        r->n_prefill = strchr(r->policy, '/') != NULL ? a.prefill : 0;
        for (size_t i = 0; i < fleet.n_mockers && r->n_prefill > 0; i++)
            legs_served(&fleet.mockers[i], &r->served[i], &r->kv_tokens[i]);
        if (rc != KVR_OK)
            fprintf(stderr, "kvrouter demo: %s: %s\n", r->policy, err);
        if (ok && a.keep_up && !have_kept && strncmp(r->policy, "kv", 2) == 0) {
            kept = fleet; /* stopped after the comparison */
            have_kept = true;
        } else {
            fleet_stop(&fleet, ok);
        }
        if (!ok) {
            code = g_stop ? 130 : 1;
            break;
        }
        kvr_replay_summarize(samples, n, &st, r->policy, a.workers, ceil.infinite, ceil.pooled,
                             a.mocker_speedup, &r->m);
        if (kvr_replay_write_tsv(r->tsv, samples, n, a.mocker_speedup, err, sizeof err) !=
            KVR_OK) {
            fprintf(stderr, "kvrouter demo: %s\n", err);
            code = 1;
        }
        if (r->m.error_fraction > KVR_REPLAY_MAX_ERROR_FRACTION) {
            fprintf(stderr, "kvrouter demo: %s: %zu of %zu requests failed: %s; first: %s\n",
                    r->policy, r->m.failed, r->m.ok + r->m.failed, r->m.errors,
                    r->m.first_error);
            code = 1;
        }
        if (!a.quiet)
            fprintf(stderr, "kvrouter demo: %s: %zu requests in %.1f s, TTFT p50 %.0f ms, hit "
                            "ratio %.3f\n",
                    r->policy, r->m.ok, r->m.duration_s, r->m.r.ttft_ms.p50, r->m.r.hit_ratio);
        done++;
    }
    if (nats_up && kvr_child_stop(&nats) != 0 && code == 0)
        fprintf(stderr, "kvrouter demo: warning: nats-server did not stop cleanly\n");
    if (g_stop && code == 0)
        code = 130;

    if (done > 0 && code == 0) {
        if (a.json) {
            for (size_t i = 0; i < done; i++) {
                kvr_replay_json_extra_t x = {
                    .url = runs[i].url,
                    .model = runs[i].model,
                    .trace = a.trace,
                    .speedup = a.mocker_speedup * a.load,
                    .latency_scale = a.mocker_speedup,
                    .block_size = a.block_size,
                    .num_gpu_blocks = a.num_gpu_blocks,
                };
                kvr_replay_print_json(stdout, &runs[i].m, &x);
            }
        } else {
            print_comparison(&a, &work, runs, done, n, span_s, ceil.infinite, ceil.pooled);
        }
        if (have_gnuplot) {
            kvr_plot_series_t series[MAX_POLICIES];
            for (size_t i = 0; i < done; i++)
                series[i] = (kvr_plot_series_t){runs[i].policy, runs[i].tsv};
            char title[512];
            snprintf(title, sizeof title,
                     "kvrouter demo: %zu requests of the conversation trace, %u workers%s%s, "
                     "load x%g (modelled ms)",
                     n, a.workers, a.prefill ? " vs " : "", a.disagg_label, a.load);
            if (kvr_replay_plot(a.plot, title, series, done, a.prefill > 0, err, sizeof err) ==
                KVR_OK) {
                char abs_path[PATH_MAX];
                const char *shown = a.plot[0] != '/' && realpath(a.plot, abs_path) ? abs_path
                                                                                  : a.plot;
                if (!a.json)
                    printf("plot: %s\n", shown);
                else
                    fprintf(stderr, "kvrouter demo: plot: %s\n", shown);
            } else {
                fprintf(stderr, "kvrouter demo: %s\n", err);
                code = 1;
            }
        } else {
            fprintf(stderr, "kvrouter demo: no plot: gnuplot is not installed (Debian: apt-get "
                            "install gnuplot-nox; scripts/install-deps.sh installs it)\n");
        }
        if (a.keep && !a.json)
            printf("samples and logs: %s\n", dir);
        if (!a.json)
            printf("demo took %.0f s\n", kvr_child_now_s() - t_start);
    }
    fflush(stdout);
    if (have_kept) {
        if (code == 0)
            keep_up(&kept);
        fleet_stop(&kept, false);
    }
    if (code != 0 && code != 130)
        fprintf(stderr, "kvrouter demo: logs kept in %s\n", dir);
    else if (!a.keep)
        kvr_child_rmtree(dir); /* the demo's own temporary directory */
    if (code == 130)
        fprintf(stderr, "kvrouter demo: interrupted; every process it started is stopped\n");
    free(samples);
    free(runs);
    kvr_trace_free(&trace);
    return code;
}

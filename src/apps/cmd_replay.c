/*
 * cmd_replay.c: `kvrouter replay`, a Mooncake trace (wire/trace.h) replayed open loop against
 * a live OpenAI-compatible endpoint (the router, or one engine) by the driver of
 * replay/replay_driver.h, and reported by replay/replay_report.h: a table (or --json), a
 * per-request TSV (--samples), a plot (--plot, several runs with --compare).
 *
 * Each row becomes one streaming POST /v1/completions: the prompt as token ids made up from
 * the row's hash ids (shared ids give shared prefixes at any block size dividing 512),
 * max_tokens = output_length (with ignore_eos, so a real engine generates them all),
 * stream_options.include_usage (for the cached tokens) and nvext.extra_fields ["worker_id"]
 * (for the worker share, when the endpoint reports it).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "replay/replay_report.h"
#include "kvrouter.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "sim/ceilings.h"
#include "wire/trace.h"

#define DEFAULT_TRACE "data/traces/conversation_trace.jsonl"
#define MAX_COMPARE 16

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter replay --url URL [options]\n"
            "       kvrouter replay --plot FILE --compare LABEL=SAMPLES.tsv ...\n\n"
            "Replays a Mooncake trace (JSON lines: timestamp, input_length, output_length,\n"
            "hash_ids) open loop against an OpenAI-compatible endpoint (kvrouter serve, or one\n"
            "engine): each row is sent at its timestamp / --rate-scale as a streaming\n"
            "/v1/completions request (prompt token ids made up per hash id, max_tokens = the\n"
            "output length), and TTFT, inter-token latency, end-to-end latency, throughput and\n"
            "the prefix-cache hit ratio (usage cached_tokens) are reported against the trace's\n"
            "ceilings. Latencies run from each request's send; how late the sends were (a\n"
            "client that fell behind, or --max-inflight) is reported beside them. A run in\n"
            "which more than 1%% of the requests fail exits 1; SIGINT reports what finished\n"
            "and exits 130.\n\n"
            "options (defaults in brackets):\n"
            "  --url URL             http://host:port of the endpoint (required unless only plotting)\n"
            "  --trace FILE          [data/traces/conversation_trace.jsonl, from the working\n"
            "                        directory or the binary's ../data/traces]\n"
            "  --requests N          replay the first N rows [all]\n"
            "  --rate-scale X        the trace's request rate x X: arrivals at timestamp / X\n"
            "                        [1] (--speedup: the same)\n"
            "  --seed N              seed of the synthesized prompt tokens [0]\n"
            "  --model NAME          sent as model [the first of GET /v1/models]\n"
            "  --label NAME          the policy name in the report and plot [replay]\n"
            "  --workers N           workers behind the endpoint, for the pooled ceiling\n"
            "                        [the worker ids seen, else 1]\n"
            "  --num-gpu-blocks N    KV blocks per worker, for the pooled ceiling [none: no\n"
            "                        pooled ceiling]\n"
            "  --block-size N        tokens per KV block, must divide 512 [16]\n"
            "  --max-inflight N      outstanding requests at most; later ones wait and the\n"
            "                        wait is reported [1024]\n"
            "  --timeout S           per request, send to last byte [300]\n"
            "  --latency-scale X     multiply reported latencies by X, e.g. the mockers'\n"
            "                        --speedup to report modelled milliseconds [1]\n"
            "  --json                one JSON object on stdout instead of the table\n"
            "  --samples FILE        per-request TSV: arrival_s sent_s ttft_ms itl_ms e2e_ms\n"
            "                        prompt_tokens cached_tokens output_tokens worker_id status\n"
            "  --plot FILE           .png or .svg (gnuplot): TTFT over time and its CDF\n"
            "  --compare LABEL=TSV   add another run's --samples file to the plot (repeatable)\n"
            "  --quiet               no progress on stderr\n");
}

typedef struct replay_args {
    const char *url, *trace, *model, *label, *samples, *plot;
    bool trace_set;
    uint64_t requests;
    double speedup, latency_scale, timeout_s;
    uint64_t seed;
    uint32_t workers, num_gpu_blocks, block_size, max_inflight;
    bool json, quiet;
    size_t n_compare;
    kvr_plot_series_t compare[MAX_COMPARE];
} replay_args_t;

static int parse_compare(const kvr_cli_t *c, const char *v, replay_args_t *a)
{
    const char *eq = v ? strchr(v, '=') : NULL;
    if (!eq || eq == v || !eq[1])
        return kvr_cli_bad(c, v, "must be LABEL=SAMPLES.tsv");
    if (a->n_compare == MAX_COMPARE)
        return kvr_cli_bad(c, v, "at most 16");
    /* the label is cut at '=' in place: argv is ours to edit */
    char *label = (char *)v;
    label[eq - v] = '\0';
    a->compare[a->n_compare].label = label;
    a->compare[a->n_compare].tsv = eq + 1;
    a->n_compare++;
    return 0;
}

/* One option at c->argv[c->i] (kvr_cli_option_fn). */
static int parse_option(kvr_cli_t *c, void *args)
{
    replay_args_t *a = args;
    if (kvr_cli_is(c, "--url"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->url);
    if (kvr_cli_is(c, "--trace")) {
        a->trace_set = true;
        return kvr_cli_str(c, kvr_cli_value(c), &a->trace);
    }
    if (kvr_cli_is(c, "--requests"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_MAX, &a->requests);
    if (kvr_cli_is_or_old(c, "--rate-scale", "--speedup"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->speedup);
    if (kvr_cli_is(c, "--latency-scale"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->latency_scale);
    if (kvr_cli_is(c, "--timeout"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->timeout_s);
    if (kvr_cli_is(c, "--seed"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT64_MAX, &a->seed);
    if (kvr_cli_is(c, "--model"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->model);
    if (kvr_cli_is(c, "--label"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->label);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &a->workers);
    if (kvr_cli_is(c, "--num-gpu-blocks"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &a->num_gpu_blocks);
    if (kvr_cli_is(c, "--block-size"))
        return kvr_cli_trace_block_size(c, kvr_cli_value(c), &a->block_size);
    if (kvr_cli_is(c, "--max-inflight"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 65536, &a->max_inflight);
    if (kvr_cli_is(c, "--samples"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->samples);
    if (kvr_cli_is(c, "--plot"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->plot);
    if (kvr_cli_is(c, "--compare"))
        return parse_compare(c, kvr_cli_value(c), a);
    const char *arg = c->argv[c->i];
    if (strcmp(arg, "--json") == 0) {
        a->json = true;
        return 0;
    }
    if (strcmp(arg, "--quiet") == 0) {
        a->quiet = true;
        return 0;
    }
    return -1;
}

static int parse_args(int argc, char **argv, replay_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->trace = DEFAULT_TRACE;
    a->label = "replay";
    a->speedup = 1.0;
    a->latency_scale = 1.0;
    a->timeout_s = 300.0;
    a->block_size = 16;
    a->max_inflight = 1024;
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter replay", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, a, usage);
    if (rc != 0)
        return rc;
    if (a->url == NULL && !(a->plot && a->n_compare > 0))
        return kvr_cli_fail(&c, "--url is required (see --help)");
    if (a->url) {
        kvr_http_target_t t;
        char why[400];
        if (kvr_http_target_parse(a->url, &t, why, sizeof why) != KVR_OK)
            return kvr_cli_fail(&c, "--url: %s", why);
    }
    if (a->n_compare > 0 && a->plot == NULL)
        return kvr_cli_fail(&c, "--compare needs --plot");
    return 0;
}

/* The default trace: from the working directory, else beside the binary (build/kvrouter ->
 * data/traces). */
static const char *find_default_trace(char *buf, size_t cap)
{
    const char *p = kvr_cli_data_file(DEFAULT_TRACE, buf, cap);
    return p != NULL ? p : DEFAULT_TRACE; /* the error then names the relative path */
}

/* ---- bodies ------------------------------------------------------------------------------ */

typedef struct body_ctx {
    const kvr_trace_t *trace;
    uint64_t seed;
    const char *model;
    uint32_t *tokens;
    size_t cap;
    kvr_json_writer_t w;
    char *buf;
    size_t buf_cap;
} body_ctx_t;

static int make_body(void *arg, size_t i, const char **data, size_t *len, char *err,
                     size_t err_len)
{
    body_ctx_t *b = arg;
    const kvr_trace_row_t *row = &b->trace->rows[i];
    int rc = kvr_trace_tokens(row, b->seed, b->tokens, b->cap);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "row %zu: cannot make its tokens: %s", i + 1, kvr_strerror(rc));
        return rc;
    }
    kvr_oai_request_t r;
    memset(&r, 0, sizeof r);
    r.endpoint = KVR_OAI_COMPLETIONS;
    r.model = b->model;
    r.model_len = strlen(b->model);
    r.prompt_kind = KVR_OAI_PROMPT_TOKENS;
    r.given_kind = KVR_OAI_PROMPT_TOKENS;
    r.tokens = r.prompt_ids = b->tokens;
    r.n_tokens = r.n_prompt_ids = row->input_length;
    r.has_max_tokens = true;
    r.max_tokens = row->output_length;
    r.stream = true;
    r.include_usage = true;
    r.has_nvext = true;
    r.nvext.want_worker_id = true;
    kvr_json_writer_reset(&b->w);
    kvr_oai_encode_request(&b->w, &r);
    const char *doc;
    size_t n;
    rc = kvr_json_writer_finish(&b->w, &doc, &n);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "row %zu: cannot encode its request: %s", i + 1,
                 kvr_strerror(rc));
        return rc;
    }
    /* ignore_eos (a sampling parameter the encoder does not carry): a real engine would stop
     * at an end-of-sequence token long before output_length on made-up prompts */
    static const char tail[] = ",\"ignore_eos\":true}";
    size_t need = n - 1 + sizeof tail;
    if (need > b->buf_cap) {
        char *nb = realloc(b->buf, need);
        if (nb == NULL) {
            snprintf(err, err_len, "out of memory");
            return KVR_ENOMEM;
        }
        b->buf = nb;
        b->buf_cap = need;
    }
    memcpy(b->buf, doc, n - 1); /* without the closing brace */
    memcpy(b->buf + n - 1, tail, sizeof tail);
    *data = b->buf;
    *len = need - 1;
    return KVR_OK;
}

int kvr_replay_trace(const kvr_replay_job_t *job, kvr_replay_sample_t *samples,
                     kvr_replay_stats_t *st, char *model_out, size_t model_cap, char *err,
                     size_t err_len)
{
    kvr_http_target_t targets[KVR_REPLAY_MAX_TARGETS];
    kvr_http_target_t *const target = &targets[0];
    char why[400];
    memset(st, 0, sizeof *st);
    size_t n_targets = 1 + job->n_more_urls;
    if (n_targets > KVR_REPLAY_MAX_TARGETS) {
        snprintf(err, err_len, "at most %d urls", KVR_REPLAY_MAX_TARGETS);
        return KVR_EINVAL;
    }
    for (size_t k = 0; k < n_targets; k++) {
        const char *url = k == 0 ? job->url : job->more_urls[k - 1];
        if (kvr_http_target_parse(url, &targets[k], why, sizeof why) != KVR_OK) {
            snprintf(err, err_len, "--url: %s", why);
            return KVR_EINVAL;
        }
        if (kvr_http_probe(&targets[k], 3000, why, sizeof why) != KVR_OK) {
            snprintf(err, err_len, "%s is not reachable: %s", url, why);
            return KVR_EIO;
        }
    }
    char model[KVR_OAI_MAX_NAME_BYTES + 1];
    if (job->model) {
        snprintf(model, sizeof model, "%s", job->model);
    } else {
        int rc = kvr_http_first_model(target, 10000, model, sizeof model, why, sizeof why);
        if (rc != KVR_OK) {
            snprintf(err, err_len, "%s: cannot find the model (give --model): %s", job->url,
                     why);
            return rc;
        }
    }
    if (model_out)
        snprintf(model_out, model_cap, "%s", model);
    size_t n = job->n;
    uint32_t max_len = 1;
    for (size_t i = 0; i < n; i++)
        if (job->trace->rows[i].input_length > max_len)
            max_len = job->trace->rows[i].input_length;
    double *arrival = malloc((n ? n : 1) * sizeof *arrival);
    body_ctx_t b = {.trace = job->trace, .seed = job->seed, .model = model, .cap = max_len};
    b.tokens = malloc((size_t)max_len * sizeof *b.tokens);
    kvr_json_writer_init(&b.w);
    if (arrival == NULL || b.tokens == NULL) {
        free(arrival);
        free(b.tokens);
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    uint64_t t0 = n ? job->trace->rows[0].timestamp_ms : 0;
    for (size_t i = 0; i < n; i++) {
        double a = (double)(job->trace->rows[i].timestamp_ms - t0) / 1000.0 / job->speedup;
        arrival[i] = i > 0 && a < arrival[i - 1] ? arrival[i - 1] : a;
    }
    kvr_progress_bar_t bar;
    kvr_progress_bar_init(&bar, job->progress_label);
    kvr_replay_config_t cfg = {
        .targets = targets,
        .n_targets = n_targets,
        .path = "/v1/completions",
        .n = n,
        .arrival_s = arrival,
        .body = make_body,
        .body_arg = &b,
        .max_inflight = job->max_inflight,
        .timeout_s = job->timeout_s,
        .progress = job->progress ? kvr_progress_bar_update : NULL,
        .progress_arg = &bar,
        .progress_ms = bar.tty ? 100 : 1000,
        .catch_signals = job->catch_signals,
    };
    int rc = kvr_replay_run(&cfg, samples, st, err, err_len);
    kvr_progress_bar_end(&bar);
    free(arrival);
    free(b.tokens);
    free(b.buf);
    kvr_json_writer_deinit(&b.w);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------- */

/* Room for --max-inflight connections plus what a process needs besides. */
static void raise_fd_limit(uint32_t max_inflight)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = (rlim_t)max_inflight + 64;
    if (rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
        fprintf(stderr, "kvrouter replay: warning: only %llu file descriptors allowed; "
                        "--max-inflight %u may run out of them\n",
                (unsigned long long)rl.rlim_cur, max_inflight);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int plot_only(const replay_args_t *a)
{
    char err[512];
    if (kvr_replay_plot(a->plot, "kvrouter replay: time to first token", a->compare,
                        a->n_compare, false, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter replay: %s\n", err);
        return 1;
    }
    fprintf(stderr, "kvrouter replay: wrote %s\n", a->plot);
    return 0;
}

/* --plot: this run's samples (from --samples, or a temporary TSV) and the --compare runs. */
static int write_plot(const replay_args_t *a, const kvr_replay_sample_t *s, size_t n,
                      const char *title)
{
    char err[512];
    char tmp[4096] = "";
    const char *tsv = a->samples;
    if (tsv == NULL) {
        const char *dir = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/kvrouter-samples-XXXXXX", dir && *dir ? dir : "/tmp");
        int fd = mkstemp(tmp);
        if (fd < 0) {
            fprintf(stderr, "kvrouter replay: --plot: cannot make a temporary file: %s\n",
                    strerror(errno));
            return 1;
        }
        close(fd);
        if (kvr_replay_write_tsv(tmp, s, n, a->latency_scale, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrouter replay: --plot: %s\n", err);
            unlink(tmp);
            return 1;
        }
        tsv = tmp;
    }
    kvr_plot_series_t series[MAX_COMPARE + 1];
    size_t k = 0;
    for (size_t i = 0; i < a->n_compare; i++)
        series[k++] = a->compare[i];
    series[k++] = (kvr_plot_series_t){a->label, tsv};
    int rc = kvr_replay_plot(a->plot, title, series, k, false, err, sizeof err);
    if (tmp[0])
        unlink(tmp);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter replay: %s\n", err);
        return 1;
    }
    if (!a->json)
        printf("  plot       %s\n", a->plot);
    return 0;
}

int kvr_cmd_replay(int argc, char **argv)
{
    replay_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (a.url == NULL)
        return plot_only(&a);
    if (a.plot && !kvr_replay_have_gnuplot()) { /* before a long run, not after */
        fprintf(stderr, "kvrouter replay: --plot needs gnuplot, which is not installed "
                        "(Debian: apt-get install gnuplot-nox; scripts/install-deps.sh "
                        "installs it)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit(a.max_inflight);

    char path_buf[PATH_MAX + 64];
    const char *trace_path = a.trace_set ? a.trace : find_default_trace(path_buf, sizeof path_buf);
    kvr_trace_t trace;
    char err[512];
    size_t max_rows = a.requests > SIZE_MAX ? 0 : (size_t)a.requests;
    rc = kvr_trace_load(trace_path, max_rows, &trace, err, sizeof err);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter replay: %s\n", err);
        return 1;
    }
    if (trace.n_rows == 0) {
        fprintf(stderr, "kvrouter replay: %s: no requests in the trace\n", trace_path);
        kvr_trace_free(&trace);
        return 1;
    }
    size_t n = trace.n_rows;
    kvr_replay_sample_t *samples = calloc(n, sizeof *samples);
    if (samples == NULL) {
        fprintf(stderr, "kvrouter replay: out of memory\n");
        kvr_trace_free(&trace);
        return 1;
    }
    char progress_label[96];
    snprintf(progress_label, sizeof progress_label, "kvrouter replay (%s)", a.label);
    kvr_replay_job_t job = {
        .url = a.url,
        .trace = &trace,
        .n = n,
        .speedup = a.speedup,
        .seed = a.seed,
        .model = a.model,
        .max_inflight = a.max_inflight,
        .timeout_s = a.timeout_s,
        .progress = !a.quiet,
        .progress_label = progress_label,
        .catch_signals = true,
    };
    kvr_replay_stats_t st;
    char model[KVR_OAI_MAX_NAME_BYTES + 1] = "";
    rc = kvr_replay_trace(&job, samples, &st, model, sizeof model, err, sizeof err);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter replay: %s\n", err);
        free(samples);
        kvr_trace_free(&trace);
        return 1;
    }

    /* the trace's ceilings: rows in order, one request at a time */
    double c_inf = NAN, c_pool = NAN;
    uint64_t workers = a.workers;
    uint64_t seen = 0;
    {
        kvr_replay_summary_t probe;
        kvr_replay_summarize(samples, n, &st, a.label, a.workers, NAN, NAN, 1.0, &probe);
        seen = probe.distinct_workers;
    }
    uint64_t pool_workers = workers ? workers : (seen ? seen : 1);
    kvr_trace_ceilings_t ceil;
    uint64_t pooled_blocks = (uint64_t)pool_workers * (a.num_gpu_blocks ? a.num_gpu_blocks : 1);
    if (kvr_trace_ceilings(&trace, a.block_size, pooled_blocks, &ceil) == KVR_OK) {
        c_inf = ceil.infinite;
        if (a.num_gpu_blocks)
            c_pool = ceil.pooled;
    }
    kvr_replay_summary_t m;
    kvr_replay_summarize(samples, n, &st, a.label, workers, c_inf, c_pool, a.latency_scale, &m);

    int code = 0;
    if (a.samples &&
        kvr_replay_write_tsv(a.samples, samples, n, a.latency_scale, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter replay: --samples: %s\n", err);
        code = 1;
    }
    char title[512];
    snprintf(title, sizeof title, "kvrouter replay: %.200s, %zu requests at speedup %g",
             base_name(trace_path), n, a.speedup);
    if (a.json) {
        kvr_replay_json_extra_t x = {
            .url = a.url,
            .model = model,
            .trace = trace_path,
            .speedup = a.speedup,
            .latency_scale = a.latency_scale,
            .block_size = a.block_size,
            .num_gpu_blocks = a.num_gpu_blocks,
        };
        kvr_replay_print_json(stdout, &m, &x);
    } else {
        char header[8192];
        double span = (double)(trace.rows[n - 1].timestamp_ms - trace.rows[0].timestamp_ms) /
                      1000.0;
        snprintf(header, sizeof header,
                 "kvrouter replay: %.200s against %.1000s (model %.1100s)\n"
                 "  trace      %.4200s: %zu requests over %.1f s, at speedup %g%s",
                 a.label, a.url, model, trace_path, n, span, a.speedup,
                 a.latency_scale != 1.0 ? " (latencies x latency-scale)" : "");
        kvr_replay_print_table(stdout, &m, header);
    }
    if (a.plot && write_plot(&a, samples, n, title) != 0)
        code = 1;
    fflush(stdout);
    if (m.interrupted) {
        fprintf(stderr, "kvrouter replay: interrupted: %zu requests not sent, %zu cancelled\n",
                m.not_sent, m.cancelled);
        code = 130;
    } else if (m.error_fraction > KVR_REPLAY_MAX_ERROR_FRACTION) {
        fprintf(stderr, "kvrouter replay: %zu of %zu requests failed (%.1f%%, more than 1%%): "
                        "%s; first: %s\n",
                m.failed, m.ok + m.failed, 100.0 * m.error_fraction, m.errors, m.first_error);
        code = 1;
    }
    free(samples);
    kvr_trace_free(&trace);
    return code;
}

/*
 * replay_report.h: what `kvrouter replay` and `kvrouter demo` make of a run's samples: the
 * summary (percentiles over the successful requests, throughput, prefix-cache hit ratio from
 * the usage cached_tokens against the trace's ceilings, the busiest worker's share, errors by
 * kind, how far the client fell behind the schedule), printed as a table or one JSON object
 * (wire/run_report.h's keys first, shared with `kvrouter sim --json`); the per-request TSV;
 * the gnuplot plot (TTFT over time and its CDF, one series per run); the progress bar.
 *
 * Ownership: the caller's samples are read, never kept. Threads: the caller's. Cost: a sort
 * of each latency column.
 */
#ifndef KVR_APPS_REPLAY_REPORT_H
#define KVR_APPS_REPLAY_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "replay/replay_driver.h"
#include "wire/run_report.h"
#include "wire/trace.h"

/* A run whose failed fraction exceeds this exits non-zero. */
#define KVR_REPLAY_MAX_ERROR_FRACTION 0.01

typedef struct kvr_replay_summary {
    kvr_run_report_t r;          /* the shared keys (policy, workers, requests, ...) */
    size_t ok, failed, cancelled, not_sent;
    struct {
        char name[24];           /* kvr_replay_status_name() ("other" for the 16th on) */
        size_t n;
    } kinds[16];                 /* failures by kind */
    size_t n_kinds;
    char errors[512];            /* "http-503 x3, timeout x1" ("" when none) */
    double error_fraction;       /* failed / sent */
    double duration_s;           /* first send to last end */
    double req_per_s, output_tok_per_s, prompt_tok_per_s;
    uint64_t prompt_tokens, cached_tokens, output_tokens; /* OK requests with usage */
    size_t with_usage;           /* OK requests that reported usage */
    size_t with_worker;          /* OK requests that reported nvext.worker_id */
    size_t distinct_workers;
    size_t held_back;            /* requests delayed by --max-inflight */
    double lag_p50_ms, lag_p99_ms, lag_max_ms; /* send time - arrival time */
    uint32_t peak_inflight;
    size_t connections;
    bool interrupted;
    char first_error[320];
} kvr_replay_summary_t;

/* Latencies are multiplied by latency_scale (1: as measured). ceilings: NAN when unknown;
 * workers 0: the number of distinct worker ids reported (1 when none). */
void kvr_replay_summarize(const kvr_replay_sample_t *s, size_t n, const kvr_replay_stats_t *st,
                          const char *policy, uint64_t workers, double ceiling_infinite,
                          double ceiling_pooled, double latency_scale,
                          kvr_replay_summary_t *out);

/* The sample's status for the TSV and error counts: "ok", "http-503", "timeout", ... */
const char *kvr_replay_status_name(const kvr_replay_sample_t *s, char *buf, size_t len);

/* Per-request TSV, a '#' header line then one line per request: arrival_s sent_s ttft_ms
 * itl_ms e2e_ms prompt_tokens cached_tokens output_tokens worker_id status ("-" when
 * unknown). Every time (arrivals and latencies) multiplied by latency_scale: one clock, the
 * engines'. KVR_OK or KVR_EIO (err names the path). */
int kvr_replay_write_tsv(const char *path, const kvr_replay_sample_t *s, size_t n,
                         double latency_scale, char *err, size_t err_len);

/* One run in a plot: a label and a TSV written by kvr_replay_write_tsv. */
typedef struct kvr_plot_series {
    const char *label;
    const char *tsv;
} kvr_plot_series_t;

/* Writes out (.png or .svg, chosen by its extension) with gnuplot: TTFT over time (scatter)
 * and the TTFT CDF, one series each (itl: and the ITL CDF beside them). KVR_OK; KVR_EINVAL
 * (extension, a series file that is not such a TSV), KVR_ENOTFOUND (gnuplot not installed:
 * err says how to install it), KVR_EIO. */
int kvr_replay_plot(const char *out, const char *title, const kvr_plot_series_t *series,
                    size_t n, bool itl, char *err, size_t err_len);

/* Whether gnuplot is on PATH. */
bool kvr_replay_have_gnuplot(void);

void kvr_replay_print_table(FILE *out, const kvr_replay_summary_t *m, const char *header);
/* The JSON object (one line, newline-terminated): the shared keys then replay's own. extra
 * (may be NULL) adds keys before the end (url, model, trace, ...). */
typedef struct kvr_replay_json_extra {
    const char *url, *model, *trace;
    double speedup, latency_scale;
    uint64_t block_size, num_gpu_blocks; /* 0: not given */
} kvr_replay_json_extra_t;
int kvr_replay_print_json(FILE *out, const kvr_replay_summary_t *m,
                          const kvr_replay_json_extra_t *extra);

/* The progress line on stderr: a redrawn bar when stderr is a terminal, else a line every
 * interval_s. */
typedef struct kvr_progress_bar {
    bool tty;
    double interval_s;
    double last_s;
    const char *label;
    bool drawn;
} kvr_progress_bar_t;
void kvr_progress_bar_init(kvr_progress_bar_t *b, const char *label);
void kvr_progress_bar_update(void *bar, const kvr_replay_progress_t *p); /* a progress_fn */
void kvr_progress_bar_end(kvr_progress_bar_t *b);

/* ---- one replay of a trace (cmd_replay.c), also run by `kvrouter demo` ------------------ */

typedef struct kvr_replay_job {
    const char *url;              /* http://host:port of the router or engine */
    const char *const *more_urls; /* other router replicas: requests alternate between url */
    size_t n_more_urls;           /* and these (at most 3) */
    const kvr_trace_t *trace;     /* rows [0, n) are replayed */
    size_t n;
    double speedup;               /* arrivals at timestamp / speedup */
    uint64_t seed;                /* token synthesis (wire/trace.h) */
    const char *model;            /* NULL: the first of GET /v1/models */
    uint32_t max_inflight;
    double timeout_s;
    bool progress;                /* the progress bar on stderr */
    const char *progress_label;
    bool catch_signals;           /* SIGINT/SIGTERM end the run early (partial results) */
} kvr_replay_job_t;

/* Probes the URL, finds the model, replays. model_out (may be NULL) receives the model used.
 * KVR_OK (request failures are in the samples), or an error with err saying what (an
 * unreachable URL, no model, out of memory). */
int kvr_replay_trace(const kvr_replay_job_t *job, kvr_replay_sample_t *samples,
                     kvr_replay_stats_t *st, char *model_out, size_t model_cap, char *err,
                     size_t err_len);

#endif /* KVR_APPS_REPLAY_REPORT_H */

/*
 * replay_report.c: see replay_report.h: a run's summary (percentiles, outcomes by kind), its
 * JSON and TSV files, and the gnuplot script of one or more runs' samples.
 * Invariants: a summary is computed from the samples alone (no state between calls); every
 * plot curve is written by plot_each (one style per plot). Ownership: the samples are the
 * caller's; what is allocated for a sort is freed before return. Threads: any (nothing
 * shared). Cost: a sort of the latencies per percentile set; files are written once.
 */
#include "replay/replay_report.h"

#include "replay/gnuplot.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/sort.h"
#include "base/stats.h"
#include "kvrouter.h"
#include "wire/json_writer.h"

/* ---- summary ---------------------------------------------------------------------------- */

const char *kvr_replay_status_name(const kvr_replay_sample_t *s, char *buf, size_t len)
{
    if (s->outcome == KVR_REPLAY_HTTP_STATUS)
        snprintf(buf, len, "http-%d", s->http_status);
    else
        snprintf(buf, len, "%s", kvr_replay_outcome_name(s->outcome));
    return buf;
}

static void count_kind(kvr_replay_summary_t *m, const char *name)
{
    const size_t cap = sizeof m->kinds / sizeof m->kinds[0];
    for (size_t i = 0; i < m->n_kinds; i++)
        if (strcmp(m->kinds[i].name, name) == 0) {
            m->kinds[i].n++;
            return;
        }
    if (m->n_kinds == cap) { /* every slot taken: the last one collects the rest */
        snprintf(m->kinds[cap - 1].name, sizeof m->kinds[cap - 1].name, "other");
        m->kinds[cap - 1].n++;
        return;
    }
    snprintf(m->kinds[m->n_kinds].name, sizeof m->kinds[m->n_kinds].name, "%s", name);
    m->kinds[m->n_kinds++].n = 1;
}

/* The latency column col of the OK samples, scaled, into v; returns how many. */
static size_t column(const kvr_replay_sample_t *s, size_t n, int col, double scale, double *v)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i].outcome != KVR_REPLAY_OK)
            continue;
        double x = col == 0 ? s[i].ttft_ms : col == 1 ? s[i].itl_ms : s[i].e2e_ms;
        if (isfinite(x))
            v[k++] = x * scale;
    }
    return k;
}

void kvr_replay_summarize(const kvr_replay_sample_t *s, size_t n, const kvr_replay_stats_t *st,
                          const char *policy, uint64_t workers, double ceiling_infinite,
                          double ceiling_pooled, double latency_scale,
                          kvr_replay_summary_t *m)
{
    memset(m, 0, sizeof *m);
    m->r.policy = policy;
    m->r.requests = n;
    m->r.ceiling_infinite = ceiling_infinite;
    m->r.ceiling_pooled = ceiling_pooled;
    double *v = malloc((n ? n : 1) * sizeof *v);
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    size_t sent = 0;
    size_t n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        const kvr_replay_sample_t *x = &s[i];
        if (x->outcome == KVR_REPLAY_NOT_SENT) {
            m->not_sent++;
            continue;
        }
        sent++;
        if (x->waited)
            m->held_back++;
        if (x->outcome == KVR_REPLAY_CANCELLED) {
            m->cancelled++;
            continue;
        }
        if (x->outcome != KVR_REPLAY_OK) {
            char name[24];
            m->failed++;
            count_kind(m, kvr_replay_status_name(x, name, sizeof name));
            continue;
        }
        m->ok++;
        if (x->has_usage) {
            m->with_usage++;
            m->prompt_tokens += x->prompt_tokens;
            m->cached_tokens += x->cached_tokens;
            m->output_tokens += x->output_tokens;
        }
        if (x->has_worker && ids) {
            m->with_worker++;
            ids[n_ids++] = x->worker_id;
        }
    }
    size_t off = 0;
    for (size_t k = 0; k < m->n_kinds && off < sizeof m->errors; k++)
        off += (size_t)snprintf(m->errors + off, sizeof m->errors - off, "%s%s x%zu",
                                k ? ", " : "", m->kinds[k].name, m->kinds[k].n);
    m->error_fraction = sent ? (double)m->failed / (double)sent : 0.0;

    /* latencies */
    if (v) {
        size_t k = column(s, n, 0, latency_scale, v);
        m->r.ttft_ms = kvr_stats_pcts(v, k);
        k = column(s, n, 1, latency_scale, v);
        m->r.itl_ms = kvr_stats_pcts(v, k);
        k = column(s, n, 2, latency_scale, v);
        m->r.e2e_ms = kvr_stats_pcts(v, k);
        /* how late the sends were */
        k = 0;
        for (size_t i = 0; i < n; i++)
            if (isfinite(s[i].sent_s))
                v[k++] = fmax(0.0, (s[i].sent_s - s[i].arrival_s) * 1e3);
        kvr_stats_sort(v, k);
        m->lag_p50_ms = kvr_stats_pct_sorted(v, k, 0.50);
        m->lag_p99_ms = kvr_stats_pct_sorted(v, k, 0.99);
        m->lag_max_ms = k ? v[k - 1] : NAN;
    } else {
        kvr_pcts_t none = {NAN, NAN, NAN};
        m->r.ttft_ms = m->r.itl_ms = m->r.e2e_ms = none;
        m->lag_p50_ms = m->lag_p99_ms = m->lag_max_ms = NAN;
    }

    /* cache hits: only requests that reported cached_tokens count */
    uint64_t hit_prompt = 0, hit_cached = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i].outcome == KVR_REPLAY_OK && s[i].has_usage && s[i].has_cached) {
            hit_prompt += s[i].prompt_tokens;
            hit_cached += s[i].cached_tokens;
        }
    m->r.hit_ratio = hit_prompt ? (double)hit_cached / (double)hit_prompt : NAN;

    /* the busiest worker */
    size_t best = 0;
    if (ids && n_ids > 0) {
        kvr_sort_u64(ids, n_ids);
        size_t run = 1;
        m->distinct_workers = 1;
        best = 1;
        for (size_t i = 1; i < n_ids; i++) {
            if (ids[i] == ids[i - 1]) {
                run++;
            } else {
                run = 1;
                m->distinct_workers++;
            }
            if (run > best)
                best = run;
        }
    }
    m->r.max_worker_share = n_ids ? (double)best / (double)n_ids : NAN;
    m->r.workers = workers ? workers : (m->distinct_workers ? m->distinct_workers : 1);

    if (st) {
        m->duration_s = st->duration_s;
        m->peak_inflight = st->peak_inflight;
        m->connections = st->connections;
        m->interrupted = st->interrupted;
        snprintf(m->first_error, sizeof m->first_error, "%s", st->first_error);
    }
    if (m->duration_s > 0) {
        m->req_per_s = (double)m->ok / m->duration_s;
        m->output_tok_per_s = (double)m->output_tokens / m->duration_s;
        m->prompt_tok_per_s = (double)m->prompt_tokens / m->duration_s;
    } else {
        m->req_per_s = m->output_tok_per_s = m->prompt_tok_per_s = NAN;
    }
    free(v);
    free(ids);
}

/* ---- table and JSON --------------------------------------------------------------------- */

static void fmt_num(char *buf, size_t len, double x, int prec)
{
    if (isfinite(x))
        snprintf(buf, len, "%.*f", prec, x);
    else
        snprintf(buf, len, "-");
}

static void pct_row(FILE *out, const char *name, const kvr_pcts_t *p)
{
    char a[32], b[32], c[32];
    int prec = p->p99 < 10 ? 2 : 1;
    fmt_num(a, sizeof a, p->p50, prec);
    fmt_num(b, sizeof b, p->p90, prec);
    fmt_num(c, sizeof c, p->p99, prec);
    fprintf(out, "  %-6s %12s %12s %12s\n", name, a, b, c);
}

void kvr_replay_print_table(FILE *out, const kvr_replay_summary_t *m, const char *header)
{
    const kvr_run_report_t *r = &m->r;
    char a[32], b[32], c[32];
    if (header && *header)
        fprintf(out, "%s\n", header);
    fprintf(out, "  requests   %llu: %zu ok, %zu failed", (unsigned long long)r->requests, m->ok,
            m->failed);
    if (m->cancelled || m->not_sent)
        fprintf(out, ", %zu cancelled, %zu not sent (interrupted)", m->cancelled, m->not_sent);
    fprintf(out, "; %.2f s, peak %u in flight\n", m->duration_s, m->peak_inflight);
    fprintf(out, "  latency (ms)      p50          p90          p99\n");
    pct_row(out, "TTFT", &r->ttft_ms);
    pct_row(out, "ITL", &r->itl_ms);
    pct_row(out, "E2E", &r->e2e_ms);
    fmt_num(a, sizeof a, m->req_per_s, 2);
    fmt_num(b, sizeof b, m->output_tok_per_s, 0);
    fmt_num(c, sizeof c, m->prompt_tok_per_s, 0);
    fprintf(out, "  throughput %s req/s, %s output tok/s, %s prompt tok/s\n", a, b, c);
    fmt_num(a, sizeof a, r->hit_ratio, 3);
    fmt_num(b, sizeof b, r->ceiling_infinite, 3);
    fmt_num(c, sizeof c, r->ceiling_pooled, 3);
    fprintf(out, "  cache hits %s of prompt tokens (ceilings: infinite cache %s, pooled cache %s)\n",
            a, b, c);
    if (m->with_usage < m->ok)
        fprintf(out, "             (%zu of %zu ok responses reported no usage)\n",
                m->ok - m->with_usage, m->ok);
    fmt_num(a, sizeof a, r->max_worker_share, 3);
    if (m->with_worker)
        fprintf(out, "  workers    busiest served %s of requests (%zu worker id(s) seen, %llu "
                     "assumed)\n",
                a, m->distinct_workers, (unsigned long long)r->workers);
    else
        fprintf(out, "  workers    %llu (the endpoint reports no nvext.worker_id)\n",
                (unsigned long long)r->workers);
    fmt_num(a, sizeof a, m->lag_p99_ms, 1);
    fmt_num(b, sizeof b, m->lag_max_ms, 1);
    fprintf(out, "  schedule   sends late by p99 %s ms, max %s ms; %zu held back by "
                 "--max-inflight\n",
            a, b, m->held_back);
    if (m->failed)
        fprintf(out, "  errors     %s (%.2f%%); first: %s\n", m->errors,
                100.0 * m->error_fraction, m->first_error);
    else
        fprintf(out, "  errors     none\n");
}

static void key_num(kvr_json_writer_t *w, const char *k, double v)
{
    kvr_json_key(w, k);
    kvr_json_double(w, v);
}

static void key_u64(kvr_json_writer_t *w, const char *k, uint64_t v)
{
    kvr_json_key(w, k);
    kvr_json_u64(w, v);
}

int kvr_replay_print_json(FILE *out, const kvr_replay_summary_t *m,
                          const kvr_replay_json_extra_t *x)
{
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_begin_object(&w);
    kvr_run_report_write_keys(&w, &m->r);
    key_u64(&w, "ok", m->ok);
    key_u64(&w, "failed", m->failed);
    kvr_json_key(&w, "errors");
    kvr_json_begin_object(&w);
    for (size_t k = 0; k < m->n_kinds; k++)
        key_u64(&w, m->kinds[k].name, m->kinds[k].n);
    kvr_json_end_object(&w);
    key_num(&w, "error_fraction", m->error_fraction);
    if (m->cancelled || m->not_sent || m->interrupted) {
        key_u64(&w, "cancelled", m->cancelled);
        key_u64(&w, "not_sent", m->not_sent);
        kvr_json_key(&w, "interrupted");
        kvr_json_bool(&w, m->interrupted);
    }
    key_num(&w, "duration_s", m->duration_s);
    key_num(&w, "throughput_rps", m->req_per_s);
    key_num(&w, "output_tokens_per_s", m->output_tok_per_s);
    key_u64(&w, "prompt_tokens", m->prompt_tokens);
    key_u64(&w, "cached_tokens", m->cached_tokens);
    key_u64(&w, "output_tokens", m->output_tokens);
    key_u64(&w, "held_back", m->held_back);
    kvr_json_key(&w, "send_lag_ms");
    kvr_json_begin_object(&w);
    key_num(&w, "p50", m->lag_p50_ms);
    key_num(&w, "p99", m->lag_p99_ms);
    key_num(&w, "max", m->lag_max_ms);
    kvr_json_end_object(&w);
    key_u64(&w, "peak_inflight", m->peak_inflight);
    if (x) {
        kvr_json_key(&w, "url");
        kvr_json_string(&w, x->url);
        kvr_json_key(&w, "model");
        kvr_json_string(&w, x->model);
        kvr_json_key(&w, "trace");
        kvr_json_string(&w, x->trace);
        key_num(&w, "speedup", x->speedup);
        key_num(&w, "latency_scale", x->latency_scale);
        key_u64(&w, "block_size", x->block_size);
        kvr_json_key(&w, "num_gpu_blocks");
        if (x->num_gpu_blocks)
            kvr_json_u64(&w, x->num_gpu_blocks);
        else
            kvr_json_null(&w);
    }
    kvr_json_end_object(&w);
    const char *doc;
    size_t len;
    int rc = kvr_json_writer_finish(&w, &doc, &len);
    if (rc == KVR_OK) {
        fwrite(doc, 1, len, out);
        fputc('\n', out);
        fflush(out);
    }
    kvr_json_writer_deinit(&w);
    return rc;
}

/* ---- TSV -------------------------------------------------------------------------------- */

static void tsv_num(FILE *f, double x, int prec)
{
    if (isfinite(x))
        fprintf(f, "%.*f\t", prec, x);
    else
        fputs("-\t", f);
}

#define TSV_HEADER \
    "# arrival_s\tsent_s\tttft_ms\titl_ms\te2e_ms\tprompt_tokens\tcached_tokens\t" \
    "output_tokens\tworker_id\tstatus\n"

int kvr_replay_write_tsv(const char *path, const kvr_replay_sample_t *s, size_t n,
                         double latency_scale, char *err, size_t err_len)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return KVR_EIO;
    }
    fputs(TSV_HEADER, f);
    for (size_t i = 0; i < n; i++) {
        const kvr_replay_sample_t *x = &s[i];
        /* every time on one clock: the engines' (latency_scale) */
        tsv_num(f, x->arrival_s * latency_scale, 6);
        tsv_num(f, x->sent_s * latency_scale, 6);
        tsv_num(f, x->ttft_ms * latency_scale, 3);
        tsv_num(f, x->itl_ms * latency_scale, 3);
        tsv_num(f, x->e2e_ms * latency_scale, 3);
        if (x->has_usage)
            fprintf(f, "%llu\t%s%llu\t%llu\t", (unsigned long long)x->prompt_tokens, "",
                    (unsigned long long)x->cached_tokens, (unsigned long long)x->output_tokens);
        else
            fputs("-\t-\t-\t", f);
        if (x->has_worker)
            fprintf(f, "%llu\t", (unsigned long long)x->worker_id);
        else
            fputs("-\t", f);
        char st[24];
        fprintf(f, "%s\n", kvr_replay_status_name(x, st, sizeof st));
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        return KVR_EIO;
    }
    return KVR_OK;
}

/* ---- plot ------------------------------------------------------------------------------- */

bool kvr_replay_have_gnuplot(void) { return kvr_gnuplot_available(); }

/* The series file must be a replay TSV (its header line). */
static int check_tsv(const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return KVR_EIO;
    }
    char line[256];
    bool ok = fgets(line, sizeof line, f) != NULL && strcmp(line, TSV_HEADER) == 0;
    fclose(f);
    if (!ok) {
        snprintf(err, err_len, "%s: not a samples file of kvrouter replay --samples", path);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

typedef struct replay_plot {
    const char *title;
    const kvr_plot_series_t *series;
    size_t n;
    bool itl;
} replay_plot_t;

/* One plot's curves, a series each: "tsv" using STYLE lc k title "label", comma-separated. */
static void plot_each(FILE *f, const kvr_plot_series_t *series, size_t n, const char *style)
{
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ", " : "", f);
        kvr_gnuplot_str(f, series[i].tsv);
        fprintf(f, " using %s lc %zu title ", style, i + 1);
        kvr_gnuplot_str(f, series[i].label);
    }
}

static void replay_plot_body(FILE *f, void *arg)
{
    const replay_plot_t *p = arg;
    const kvr_plot_series_t *series = p->series;
    size_t n = p->n;
    fputs("set datafile separator '\\t'\nset datafile missing '-'\nset key below horizontal\n"
          "set grid\n",
          f);
    fprintf(f, "set multiplot layout 1,%d title ", p->itl ? 3 : 2);
    kvr_gnuplot_str(f, p->title ? p->title : "kvrouter replay");
    fputs("\nset title 'TTFT over time'\n"
          "set xlabel 'arrival (s since the run started, on the clock of the TTFT axis)'\n"
          "set ylabel 'time to first token (ms)'\nset logscale y\nplot ",
          f);
    plot_each(f, series, n, "1:3 with points pt 7 ps 0.5");
    fputs("\nunset logscale y\nset title 'TTFT distribution'\n"
          "set xlabel 'time to first token (ms)'\nset ylabel 'fraction of requests'\n"
          "set logscale x\nset yrange [0:1]\nplot ",
          f);
    plot_each(f, series, n, "3:(1.0) smooth cnormal with lines lw 2");
    if (p->itl) { /* per request: (finish - first token) / (outputs - 1) */
        fputs("\nset title 'ITL distribution'\nset xlabel 'inter-token latency (ms)'\nplot ", f);
        plot_each(f, series, n, "4:(1.0) smooth cnormal with lines lw 2");
    }
    fputs("\nunset multiplot\n", f);
}

int kvr_replay_plot(const char *out, const char *title, const kvr_plot_series_t *series, size_t n,
                    bool itl, char *err, size_t err_len)
{
    if (n == 0) {
        snprintf(err, err_len, "nothing to plot");
        return KVR_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        int rc = check_tsv(series[i].tsv, err, err_len);
        if (rc != KVR_OK)
            return rc;
    }
    replay_plot_t p = {title, series, n, itl};
    kvr_gnuplot_t g = {
        .out = out, .width = itl ? 2000 : 1400, .height = 640, .body = replay_plot_body, .arg = &p};
    return kvr_gnuplot_draw(&g, err, err_len);
}

/* ---- progress --------------------------------------------------------------------------- */

void kvr_progress_bar_init(kvr_progress_bar_t *b, const char *label)
{
    memset(b, 0, sizeof *b);
    b->tty = isatty(STDERR_FILENO) == 1;
    b->interval_s = b->tty ? 0.0 : 5.0;
    b->last_s = 0.0;
    b->label = label ? label : "replay";
}

void kvr_progress_bar_update(void *arg, const kvr_replay_progress_t *p)
{
    kvr_progress_bar_t *b = arg;
    bool last = p->done == p->total;
    if (!b->tty) {
        if (!last && p->elapsed_s - b->last_s < b->interval_s)
            return;
        b->last_s = p->elapsed_s;
        if (last && !b->drawn)
            return; /* short runs: no line at all */
        fprintf(stderr, "%s: %zu/%zu done, %zu in flight, %zu waiting, %zu failed, %.1f s\n",
                b->label, p->done, p->total, p->inflight, p->waiting, p->failed, p->elapsed_s);
        b->drawn = true;
        return;
    }
    enum { WIDTH = 30 };
    size_t fill = p->total ? p->done * WIDTH / p->total : WIDTH;
    char bar[WIDTH + 1];
    for (size_t i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r\033[K%s [%s] %zu/%zu done, %zu in flight, %zu waiting, %zu failed, "
                    "%.1f s",
            b->label, bar, p->done, p->total, p->inflight, p->waiting, p->failed, p->elapsed_s);
    fflush(stderr);
    b->drawn = true;
}

void kvr_progress_bar_end(kvr_progress_bar_t *b)
{
    if (b->tty && b->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    b->drawn = false;
}

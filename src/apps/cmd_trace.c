/*
 * cmd_trace.c: `kvrouter trace stats FILE`: what a Mooncake trace (JSONL: timestamp,
 * input_length, output_length, hash_ids) holds, so nobody needs a script for it: request
 * count, time span and rate, prompt and output lengths (p50 / p90 / p99 / mean), distinct
 * 512-token blocks and how often a request's blocks were seen before, and the trace's two
 * hit-ratio ceilings for a fleet (wire/trace.h's kvr_trace_ceilings: every repeated prefix
 * hitting an infinite cache, or one LRU cache as large as the whole fleet's).
 * One pass over the rows plus the ceilings' simulation; the trace is loaded whole.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "base/oatab.h"
#include "base/stats.h"
#include "kvrouter.h"
#include "sim/ceilings.h"
#include "wire/trace.h"

typedef struct trace_args {
    const char *file;
    uint64_t rows;
    uint32_t workers, blocks, block_size;
    bool json;
} trace_args_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter trace stats FILE [options]\n"
            "       kvrouter trace gen [options]        (a synthetic workload: --help)\n"
            "       kvrouter trace synth --from FILE    (a scaled copy of FILE's shape: --help)\n\n"
            "What a Mooncake trace (JSONL: timestamp, input_length, output_length, hash_ids)\n"
            "holds, and its hit-ratio ceilings for a fleet.\n\n"
            "  --rows N               the first N rows [all]\n"
            "  --workers N            workers of the fleet the ceilings are for [8]\n"
            "  --blocks-per-worker N  KV blocks per worker [16384]\n"
            "  --block-size N         tokens per block, must divide 512 [16]\n"
            "  --json                 one JSON object\n");
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    trace_args_t *a = arg;
    const char *w = c->argv[c->i];
    if (strcmp(w, "--json") == 0) {
        a->json = true;
        return 0;
    }
    if (w[0] != '-') {
        c->flag = "FILE";
        if (a->file != NULL)
            return kvr_cli_bad(c, w, "one trace at a time");
        a->file = w;
        return 0;
    }
    if (kvr_cli_is(c, "--rows"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_MAX, &a->rows);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 1000000, &a->workers);
    if (kvr_cli_is(c, "--blocks-per-worker"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &a->blocks);
    if (kvr_cli_is(c, "--block-size"))
        return kvr_cli_trace_block_size(c, kvr_cli_value(c), &a->block_size);
    return -1;
}

/* The set of 512-token prefixes seen, keyed by the chained hash of a row's hash ids up to a
 * block (never 0): an oatab.h instance. */
typedef struct seen {
    uint64_t *t; /* 0 = empty */
    size_t mask, n;
} seen_t;

#define SEEN_HOME(c, e) kvr_mix64(*(e))
#define SEEN_EMPTY(e) (*(e) == 0)
#define SEEN_CLEAR(e) (*(e) = 0)
KVR_OATAB_DEFINE(seent, seen_t, uint64_t, SEEN_HOME, SEEN_EMPTY, SEEN_CLEAR)

static bool key_is(const seen_t *s, const uint64_t *e, const void *key)
{
    (void)s;
    return *e == *(const uint64_t *)key;
}

/* 1 when key is new (added), 0 when seen before, KVR_ENOMEM. */
static int seen_add(seen_t *s, uint64_t key)
{
    if (seent_find(s, s->t, s->mask, kvr_mix64(key), key_is, &key) != NULL)
        return 0;
    if ((s->n + 1) * 2 > s->mask + 1 && seent_rehash(s, &s->t, &s->mask, (s->mask + 1) * 2))
        return KVR_ENOMEM;
    s->t[seent_free_slot(s->t, s->mask, kvr_mix64(key))] = key;
    s->n++;
    return 1;
}

typedef struct figures {
    size_t rows;
    double span_s, rate;
    kvr_pcts_t in, out;
    double in_mean, out_mean;
    uint64_t blocks, distinct, repeated;
    kvr_trace_ceilings_t ceil;
} figures_t;

static int measure(const kvr_trace_t *t, const trace_args_t *a, figures_t *f)
{
    size_t n = t->n_rows;
    double *in = malloc((n ? n : 1) * sizeof *in), *out = malloc((n ? n : 1) * sizeof *out);
    seen_t s = {.t = calloc(1024, sizeof(uint64_t)), .mask = 1023};
    if (in == NULL || out == NULL || s.t == NULL) {
        free(in);
        free(out);
        free(s.t);
        return KVR_ENOMEM;
    }
    memset(f, 0, sizeof *f);
    f->rows = n;
    for (size_t i = 0; i < n; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        in[i] = r->input_length;
        out[i] = r->output_length;
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (uint32_t k = 0; k < r->n_hash_ids; k++) {
            h = kvr_mix64(h ^ (r->hash_ids[k] + 0x632BE59BD9B4E019ull)) | 1;
            f->blocks++;
            int fresh = seen_add(&s, h);
            if (fresh < 0) {
                free(in);
                free(out);
                free(s.t);
                return fresh;
            }
            f->distinct += fresh == 1;
            f->repeated += fresh == 0;
        }
    }
    f->in_mean = kvr_stats_mean(in, n);
    f->out_mean = kvr_stats_mean(out, n);
    f->in = kvr_stats_pcts(in, n);
    f->out = kvr_stats_pcts(out, n);
    f->span_s = n ? (double)(t->rows[n - 1].timestamp_ms - t->rows[0].timestamp_ms) / 1000.0
                  : 0.0;
    f->rate = f->span_s > 0 ? (double)n / f->span_s : NAN;
    free(in);
    free(out);
    free(s.t);
    return kvr_trace_ceilings(t, a->block_size, (uint64_t)a->workers * a->blocks, &f->ceil);
}

static void print_json(const trace_args_t *a, const figures_t *f)
{
    printf("{\"rows\":%zu,\"span_s\":%.3f,\"rate_per_s\":%.4f,"
           "\"input_length\":{\"p50\":%.0f,\"p90\":%.0f,\"p99\":%.0f,\"mean\":%.1f},"
           "\"output_length\":{\"p50\":%.0f,\"p90\":%.0f,\"p99\":%.0f,\"mean\":%.1f},"
           "\"hash_blocks\":%llu,\"distinct_prefix_blocks\":%llu,\"repeat_fraction\":%.6f,"
           "\"prompt_tokens\":%llu,\"workers\":%u,\"blocks_per_worker\":%u,\"block_size\":%u,"
           "\"ceiling_infinite\":%.6f,\"ceiling_pooled\":%.6f}\n",
           f->rows, f->span_s, f->rate, f->in.p50, f->in.p90, f->in.p99, f->in_mean,
           f->out.p50, f->out.p90, f->out.p99, f->out_mean, (unsigned long long)f->blocks,
           (unsigned long long)f->distinct,
           f->blocks ? (double)f->repeated / (double)f->blocks : 0.0,
           (unsigned long long)f->ceil.prompt_tokens, a->workers, a->blocks, a->block_size,
           f->ceil.infinite, f->ceil.pooled);
}

static void print_text(const trace_args_t *a, const figures_t *f)
{
    printf("%s: %zu requests over %.1f s (%.2f/s)\n", a->file, f->rows, f->span_s, f->rate);
    printf("input tokens   p50 %.0f  p90 %.0f  p99 %.0f  mean %.1f\n", f->in.p50, f->in.p90,
           f->in.p99, f->in_mean);
    printf("output tokens  p50 %.0f  p90 %.0f  p99 %.0f  mean %.1f\n", f->out.p50, f->out.p90,
           f->out.p99, f->out_mean);
    printf("512-token blocks: %llu referenced, %llu distinct prefixes, %.1f%% seen before\n",
           (unsigned long long)f->blocks, (unsigned long long)f->distinct,
           f->blocks ? 100.0 * (double)f->repeated / (double)f->blocks : 0.0);
    printf("hit-ratio ceilings at block size %u: %.4f with an infinite cache, %.4f with one LRU "
           "cache of %u x %u blocks\n",
           a->block_size, f->ceil.infinite, f->ceil.pooled, a->workers, a->blocks);
}

int kvr_cmd_trace(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "gen") == 0)
        return kvr_cmd_trace_gen(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "synth") == 0)
        return kvr_cmd_trace_synth(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "stats") != 0) {
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "kvrouter trace: which? (stats, gen, synth)\n");
        usage(stderr);
        return 2;
    }
    trace_args_t a = {.workers = 8, .blocks = 16384, .block_size = 16};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter trace stats", argc - 1, argv + 1);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (a.file == NULL)
        return kvr_cli_fail(&c, "a trace FILE is required");
    kvr_trace_t t;
    char err[1024];
    if (kvr_trace_load(a.file, (size_t)a.rows, &t, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter trace stats: %s\n", err);
        return 1;
    }
    figures_t f;
    rc = measure(&t, &a, &f);
    kvr_trace_free(&t);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter trace stats: %s\n", kvr_strerror(rc));
        return 1;
    }
    if (a.json)
        print_json(&a, &f);
    else
        print_text(&a, &f);
    return 0;
}

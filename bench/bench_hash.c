/*
 * bench_hash.c: `kvrouter bench hash`: the cost of hashing one prompt on the request path,
 * i.e. its local block hashes and sequence hashes in one pass (kvr_hash_prompt, what the
 * router calls), for prompts of 8K and 128K tokens at block sizes 16 and 64.
 *
 * How: 8 prompts of random token ids (< 150000) are hashed in turn into caller-owned buffers;
 * each iteration (one prompt) is one timed interval, timer overhead subtracted.
 * Iterations: at least 2000 (500 with --quick), more for cheap points, up to ~0.2 s per run.
 * Figures: p50/p99/p99.9 microseconds per prompt; per_s = tokens hashed per second (from the
 * mean); target_us = the latency target where the design sets one (block size 16).
 */
#include <math.h>
#include <stdlib.h>

#include "bench.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 6, 0},    {"tokens", KVR_BENCH_INT, 7, 0},
    {"block_size", KVR_BENCH_INT, 10, 0}, {"blocks", KVR_BENCH_INT, 6, 0},
    {"iters", KVR_BENCH_INT, 6, 0},    {"runs", KVR_BENCH_INT, 4, 0},
    {"p50_us", KVR_BENCH_NUM, 9, 3},   {"p99_us", KVR_BENCH_NUM, 9, 3},
    {"p999_us", KVR_BENCH_NUM, 9, 3},  {"per_s", KVR_BENCH_NUM, 12, 0},
    {"target_us", KVR_BENCH_NUM, 9, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

#define N_PROMPTS 8

static double target_us(uint64_t tokens, uint64_t bs)
{
    if (bs == 16 && tokens == 8192)
        return 10.0;
    if (bs == 16 && tokens == 131072)
        return 120.0;
    return NAN; /* no target: left unset */
}

/* One run: iters timed prompts. Fills lat; returns false on a hashing error. */
static bool run_once(uint32_t *const *prompts, size_t tokens, uint32_t bs, uint64_t *lbh,
                     uint64_t *seq, size_t cap, size_t iters, double *ns, kvr_bench_lat_t *lat)
{
    for (size_t i = 0; i < iters; i++) {
        const uint32_t *p = prompts[i % N_PROMPTS];
        uint64_t t0 = kvr_bench_now_ns();
        long n = kvr_hash_prompt(p, tokens, bs, NULL, lbh, seq, cap);
        if (n < 0)
            return false;
        uint64_t t1 = kvr_bench_now_ns();
        ns[i] = (double)(t1 - t0);
    }
    kvr_bench_summarize(ns, iters, lat);
    return true;
}

static int one_point(const kvr_bench_opts_t *o, uint32_t *const *prompts, uint64_t tokens,
                     uint32_t bs)
{
    size_t cap = kvr_hash_n_blocks(tokens, bs, false);
    uint64_t *lbh = malloc((cap + 1) * sizeof *lbh);
    uint64_t *seq = malloc((cap + 1) * sizeof *seq);
    size_t min_iters = o->quick ? 500 : 2000, max_iters = 20 * min_iters;
    double *ns = malloc(max_iters * sizeof *ns);
    double *r50 = malloc(o->runs * sizeof(double) * 4);
    if (lbh == NULL || seq == NULL || ns == NULL || r50 == NULL) {
        free(lbh), free(seq), free(ns), free(r50);
        fprintf(stderr, "kvrouter bench hash: out of memory\n");
        return 1;
    }
    double *r99 = r50 + o->runs, *r999 = r99 + o->runs, *rmean = r999 + o->runs;

    /* warm up and size the runs: ~0.2 s each (50 ms with --quick) */
    kvr_bench_lat_t lat;
    int rc = 0;
    if (!run_once(prompts, tokens, bs, lbh, seq, cap, 64, ns, &lat)) {
        fprintf(stderr, "kvrouter bench hash: kvr_hash_prompt failed\n");
        rc = 1;
        goto out;
    }
    double budget_us = o->quick ? 5e4 : 2e5;
    size_t iters = lat.mean_us > 0 ? (size_t)(budget_us / lat.mean_us) : max_iters;
    iters = iters < min_iters ? min_iters : iters > max_iters ? max_iters : iters;
    for (unsigned r = 0; r < o->runs; r++) {
        run_once(prompts, tokens, bs, lbh, seq, cap, iters, ns, &lat);
        r50[r] = lat.p50_us;
        r99[r] = lat.p99_us;
        r999[r] = lat.p999_us;
        rmean[r] = lat.mean_us;
    }
    kvr_bench_row_t row;
    kvr_bench_row_init(&row, COLS, N_COLS);
    kvr_bench_set_str(&row, "bench", "hash");
    kvr_bench_set_int(&row, "tokens", (int64_t)tokens);
    kvr_bench_set_int(&row, "block_size", bs);
    kvr_bench_set_int(&row, "blocks", (int64_t)cap);
    kvr_bench_set_int(&row, "iters", (int64_t)iters);
    kvr_bench_set_int(&row, "runs", o->runs);
    kvr_bench_set_num(&row, "p50_us", kvr_bench_median(r50, o->runs));
    kvr_bench_set_num(&row, "p99_us", kvr_bench_median(r99, o->runs));
    kvr_bench_set_num(&row, "p999_us", kvr_bench_median(r999, o->runs));
    kvr_bench_set_num(&row, "per_s", (double)tokens / (kvr_bench_median(rmean, o->runs) / 1e6));
    kvr_bench_set_num(&row, "target_us", target_us(tokens, bs));
    kvr_bench_print_row(o, &row);
out:
    free(lbh);
    free(seq);
    free(ns);
    free(r50);
    return rc;
}

int kvr_bench_hash(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_tokens = {2, {8192, 131072}};
    static const kvr_bench_list_t def_bs = {2, {16, 64}};
    const kvr_bench_list_t *tokens = kvr_bench_pick(&o->tokens, &def_tokens);
    const kvr_bench_list_t *bss = kvr_bench_pick(&o->block_size, &def_bs);

    uint64_t max_tokens = 0;
    for (size_t i = 0; i < tokens->n; i++)
        max_tokens = tokens->v[i] > max_tokens ? tokens->v[i] : max_tokens;
    uint32_t *prompts[N_PROMPTS] = {0};
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, o->seed ^ 0x4a5u);
    int rc = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        prompts[p] = malloc(max_tokens * sizeof(uint32_t));
        if (prompts[p] == NULL) {
            fprintf(stderr, "kvrouter bench hash: out of memory\n");
            rc = 1;
            goto out;
        }
        for (uint64_t t = 0; t < max_tokens; t++)
            prompts[p][t] = (uint32_t)kvr_bench_rng_below(&rng, 150000);
    }
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t i = 0; i < tokens->n && rc == 0; i++)
        for (size_t j = 0; j < bss->n && rc == 0; j++)
            rc = one_point(o, prompts, tokens->v[i], (uint32_t)bss->v[j]);
out:
    for (int p = 0; p < N_PROMPTS; p++)
        free(prompts[p]);
    return rc;
}

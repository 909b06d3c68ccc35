/*
 * test_sim.c: the virtual-time simulator (sim/sim.c): exact timings of lone requests against
 * the engine's polynomials, determinism (same seed: identical records; another seed: the random
 * policy changes), sanity on a slice of the conversation trace (everything finishes, the router
 * ends with nothing in flight, KV routing hits at least as much as round-robin and never more
 * than the infinite-cache ceiling), rows too long for the engines, the router queue, approximate
 * mode, disaggregated runs (exact timings of the prefill, transfer and decode legs; the isl
 * bypass), and configuration / input errors.
 * KVR_TEST_DATA names tests/data (the 300-row slice); KVR_TEST_SCALE=asan runs fewer rows.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim/sim.h"
#include "kvrouter.h"
#include "sim/ceilings.h"
#include "sim/trace_gen.h"
#include "wire/trace.h"

static size_t n_rows(void)
{
    const char *s = getenv("KVR_TEST_SCALE");
    return s != NULL && strcmp(s, "asan") == 0 ? 100 : 300;
}

/* ---- inputs -------------------------------------------------------------------------------- */

typedef struct slice {
    kvr_trace_t t;
    kvr_sim_request_t *reqs;
    kvr_sim_input_t in;
} slice_t;

static int trace_tokens(void *ud, size_t i, uint32_t *out, size_t cap)
{
    const kvr_trace_t *t = ud;
    return kvr_trace_tokens(&t->rows[i], 0, out, cap);
}

/* The first rows of the conversation trace: the test copy (300 rows), or the repository's
 * whole trace (data/traces) when more are wanted. */
static slice_t *slice_load(size_t rows, double speedup)
{
    slice_t *s = calloc(1, sizeof *s);
    assert_non_null(s);
    char path[1024], err[512];
    const char *d = getenv("KVR_TEST_DATA");
    if (rows > 300)
        snprintf(path, sizeof path, "%s/../../data/traces/conversation_trace.jsonl",
                 d ? d : "tests/data");
    else
        snprintf(path, sizeof path, "%s/conversation_trace_300.jsonl", d ? d : "tests/data");
    if (kvr_trace_load(path, rows, &s->t, err, sizeof err) != KVR_OK)
        fail_msg("%s", err);
    s->reqs = calloc(s->t.n_rows, sizeof *s->reqs);
    assert_non_null(s->reqs);
    for (size_t i = 0; i < s->t.n_rows; i++)
        s->reqs[i] = (kvr_sim_request_t){.arrival_ms = (double)s->t.rows[i].timestamp_ms / speedup,
                                         .n_tokens = s->t.rows[i].input_length,
                                         .max_tokens = s->t.rows[i].output_length};
    s->in = (kvr_sim_input_t){.reqs = s->reqs, .n = s->t.n_rows, .tokens = trace_tokens,
                              .ud = &s->t};
    return s;
}

static void slice_free(slice_t *s)
{
    kvr_trace_free(&s->t);
    free(s->reqs);
    free(s);
}

/* Hand-made prompts: token j of request i is base[i] + j (so equal bases share prompts). */
typedef struct hand {
    uint32_t base[8];
} hand_t;

static int hand_tokens(void *ud, size_t i, uint32_t *out, size_t cap)
{
    const hand_t *h = ud;
    for (size_t j = 0; j < cap; j++)
        out[j] = h->base[i] + (uint32_t)j;
    return KVR_OK;
}

static void small_config(kvr_sim_config_t *c, uint32_t workers, kvr_router_mode_t mode)
{
    kvr_sim_config_default(c);
    c->n_workers = workers;
    c->engine.num_gpu_blocks = 8192; /* 131072 tokens: every slice row fits */
    c->router.router_mode = mode;
    c->router.use_kv_events = mode != KVR_MODE_APPROX;
}

static double prefill_ms(double t) { return 4.209989e-07 * t * t + 1.518344e-02 * t + 16.50142; }
static double decode_ms(double u) { return fmax(1.0, -25.74 * u * u + 54.01 * u + 5.74); }

static void near(double got, double want)
{
    if (fabs(got - want) > 1e-9 * fmax(1.0, fabs(want)))
        fail_msg("got %.12f, expected %.12f", got, want);
}

/* ---- timing -------------------------------------------------------------------------------- */

/* One request alone: TTFT = prefill(T) exactly; each further token one decode step at the
 * usage of its step. A second identical request after the first has finished finds its prefix
 * cached: TTFT = prefill(T - cached), cached = floor((T - 1) / 16) * 16. */
static void test_lone_request_timing(void **state)
{
    (void)state;
    hand_t h = {.base = {100, 100}};
    kvr_sim_request_t reqs[2] = {{.arrival_ms = 50, .n_tokens = 1000, .max_tokens = 3},
                                 {.arrival_ms = 10000, .n_tokens = 1000, .max_tokens = 1}};
    kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = hand_tokens, .ud = &h};
    kvr_sim_config_t c;
    small_config(&c, 1, KVR_MODE_KV);
    c.engine.num_gpu_blocks = 4096;
    kvr_sim_result_t res;
    kvr_sim_record_t rec[2];
    char err[256];
    assert_int_equal(kvr_sim_run(&c, &in, &res, rec, err, sizeof err), KVR_OK);
    assert_int_equal(res.requests, 2);
    assert_int_equal(rec[0].outcome, KVR_SIM_DONE);
    assert_int_equal(rec[0].worker, 0);
    near(rec[0].routed_ms, 50);
    near(rec[0].first_ms - rec[0].arrival_ms, prefill_ms(1000));
    /* tokens 2 and 3: 1001 and 1002 tokens known, 63 blocks of 4096 active */
    double d = decode_ms(63.0 / 4096.0);
    near(rec[0].finish_ms - rec[0].first_ms, 2 * d);
    assert_int_equal(rec[0].n_output, 3);
    assert_int_equal(rec[0].cached_tokens, 0);
    assert_int_equal(rec[1].cached_tokens, 992);
    assert_int_equal(rec[1].predicted_cached_tokens, 992);
    near(rec[1].first_ms - rec[1].arrival_ms, prefill_ms(8));
    near(rec[1].finish_ms, rec[1].first_ms);
    /* summary over both */
    near(res.itl_ms.p50, d);
    near(res.ttft_ms.p50, prefill_ms(8));
    near(res.ttft_ms.p99, prefill_ms(1000));
    near(res.hit_ratio, 992.0 / 2000.0);
    near(res.virtual_ms, rec[1].finish_ms);
    near(res.max_worker_share, 1.0);
    assert_int_equal(res.router_live_at_end, 0);
    assert_int_equal(res.router_unknown_ids, 0);
    assert_int_equal(res.index_errors, 0);
    assert_true(res.index_events > 0);
}

/* Chunked prefill: a 20000-token prompt takes three steps of 8192, 8192, 3616 tokens. */
/* Disaggregated (1 prefill, 1 decode worker): TTFT = prefill(T) on the prefill worker + the
 * transfer (63 blocks x 2 MiB x 8 / 100 Gbit/s) + one decode step on the decode worker, which
 * never prefills; ITL is its decode steps. A repeat hits the prefill worker's cache (its
 * cached tokens are the prefill pool's). With disagg_policy isl, the repeat stays on the
 * decode worker instead, which holds the transferred blocks. */
static void test_disaggregated_timing(void **state)
{
    (void)state;
    hand_t h = {.base = {100, 100}};
    kvr_sim_request_t reqs[2] = {{.arrival_ms = 50, .n_tokens = 1000, .max_tokens = 3},
                                 {.arrival_ms = 10000, .n_tokens = 1000, .max_tokens = 2}};
    kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = hand_tokens, .ud = &h};
    kvr_sim_config_t c;
    small_config(&c, 2, KVR_MODE_KV);
    c.n_prefill = 1;
    c.engine.num_gpu_blocks = 4096;
    kvr_sim_result_t res;
    kvr_sim_record_t rec[2];
    char err[256];
    assert_int_equal(kvr_sim_run(&c, &in, &res, rec, err, sizeof err), KVR_OK);
    assert_int_equal(res.requests, 2);
    assert_int_equal(res.transfers, 2);
    double xfer = 63.0 * 2097152.0 * 8.0 / 100e9 * 1e3;
    double d = decode_ms(63.0 / 4096.0);
    assert_int_equal(rec[0].prefill_worker, 0);
    assert_int_equal(rec[0].worker, 1);
    near(rec[0].prefilled_ms - rec[0].arrival_ms, prefill_ms(1000));
    near(rec[0].first_ms - rec[0].prefilled_ms, xfer + d);
    near(rec[0].finish_ms - rec[0].first_ms, 2 * d);
    assert_int_equal(rec[0].cached_tokens, 0);
    assert_int_equal(rec[1].prefill_worker, 0);
    assert_int_equal(rec[1].cached_tokens, 992);
    near(rec[1].prefilled_ms - rec[1].arrival_ms, prefill_ms(8));
    near(rec[1].first_ms - rec[1].prefilled_ms, xfer + d);
    near(res.transfer_ms, 2 * xfer);
    assert_int_equal(res.router_live_at_end, 0);
    assert_int_equal(res.router_unknown_ids, 0);
    assert_int_equal(res.index_errors, 0);

    char e[200];
    assert_int_equal(kvr_config_set(&c.router, "disagg_policy", "isl", e, sizeof e), KVR_OK);
    assert_int_equal(kvr_sim_run(&c, &in, &res, rec, err, sizeof err), KVR_OK);
    assert_int_equal(res.requests, 2);
    assert_int_equal(res.bypassed, 1);
    assert_int_equal(res.transfers, 1);
    assert_int_equal(rec[1].prefill_worker, -1);
    assert_int_equal(rec[1].worker, 1);
    assert_int_equal(rec[1].cached_tokens, 992); /* the decode worker's own copy */
    near(rec[1].first_ms - rec[1].arrival_ms, prefill_ms(8));
    assert_int_equal(res.router_live_at_end, 0);

    c.n_prefill = 2; /* no decode worker left */
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "prefill-workers"));
}

static void test_chunked_ttft(void **state)
{
    (void)state;
    hand_t h = {.base = {7}};
    kvr_sim_request_t req = {.arrival_ms = 0, .n_tokens = 20000, .max_tokens = 1};
    kvr_sim_input_t in = {.reqs = &req, .n = 1, .tokens = hand_tokens, .ud = &h};
    kvr_sim_config_t c;
    small_config(&c, 2, KVR_MODE_ROUND_ROBIN);
    kvr_sim_result_t res;
    kvr_sim_record_t rec;
    assert_int_equal(kvr_sim_run(&c, &in, &res, &rec, NULL, 0), KVR_OK);
    near(rec.first_ms, 2 * prefill_ms(8192) + prefill_ms(3616));
    assert_true(isnan(res.itl_ms.p50)); /* one output: no inter-token latency */
}

/* ---- determinism --------------------------------------------------------------------------- */

static void run_slice(const slice_t *s, kvr_router_mode_t mode, uint64_t seed,
                      kvr_sim_result_t *res, kvr_sim_record_t *rec)
{
    kvr_sim_config_t c;
    small_config(&c, 4, mode);
    c.seed = seed;
    char err[256] = "";
    int rc = kvr_sim_run(&c, &s->in, res, rec, err, sizeof err);
    if (rc != KVR_OK)
        fail_msg("sim: %d %s", rc, err);
}

/* Equal doubles or both NAN. */
static bool same_f(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static bool same_records(const kvr_sim_record_t *a, const kvr_sim_record_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const kvr_sim_record_t *x = &a[i], *y = &b[i];
        if (x->outcome != y->outcome || x->worker != y->worker || x->status != y->status ||
            !same_f(x->arrival_ms, y->arrival_ms) || !same_f(x->routed_ms, y->routed_ms) ||
            !same_f(x->first_ms, y->first_ms) || !same_f(x->finish_ms, y->finish_ms) ||
            x->n_output != y->n_output || x->cached_tokens != y->cached_tokens ||
            x->predicted_cached_tokens != y->predicted_cached_tokens ||
            x->best_cached_tokens != y->best_cached_tokens)
            return false;
    }
    return true;
}

static void test_determinism(void **state)
{
    (void)state;
    slice_t *s = slice_load(n_rows() / 2, 1.5);
    size_t n = s->in.n;
    kvr_sim_record_t *r1 = calloc(n, sizeof *r1), *r2 = calloc(n, sizeof *r2);
    assert_non_null(r1);
    assert_non_null(r2);
    for (int m = KVR_MODE_KV; m <= KVR_MODE_APPROX; m++) {
        kvr_sim_result_t a, b;
        run_slice(s, (kvr_router_mode_t)m, 42, &a, r1);
        run_slice(s, (kvr_router_mode_t)m, 42, &b, r2);
        if (!same_records(r1, r2, n) || memcmp(&a, &b, sizeof a) != 0)
            fail_msg("mode %d: two runs with seed 42 differ", m);
        assert_int_equal(a.requests, n);
    }
    /* another seed: random routing places requests differently */
    kvr_sim_result_t a, b;
    run_slice(s, KVR_MODE_RANDOM, 42, &a, r1);
    run_slice(s, KVR_MODE_RANDOM, 43, &b, r2);
    size_t moved = 0;
    for (size_t i = 0; i < n; i++)
        moved += r1[i].worker != r2[i].worker;
    assert_true(moved > n / 4);
    /* round-robin does not depend on the seed */
    run_slice(s, KVR_MODE_ROUND_ROBIN, 42, &a, r1);
    run_slice(s, KVR_MODE_ROUND_ROBIN, 43, &b, r2);
    assert_true(same_records(r1, r2, n));
    free(r1);
    free(r2);
    slice_free(s);
}

/* ---- sanity -------------------------------------------------------------------------------- */

static void check_result(const kvr_sim_result_t *r, size_t n)
{
    assert_int_equal(r->requests + r->too_long + r->rejected + r->expired, n);
    assert_int_equal(r->router_live_at_end, 0);
    assert_int_equal(r->router_unknown_ids, 0);
    assert_int_equal(r->index_errors, 0);
    assert_true(r->ttft_ms.p50 > 0 && r->ttft_ms.p50 <= r->ttft_ms.p90 &&
                r->ttft_ms.p90 <= r->ttft_ms.p99);
    assert_true(r->e2e_ms.p50 >= r->ttft_ms.p50);
    assert_true(r->itl_ms.p50 >= 1.0);
    assert_true(r->max_worker_share > 0 && r->max_worker_share <= 1.0);
    assert_true(r->hit_ratio >= 0 && r->hit_ratio < 1);
    assert_true(r->virtual_ms > 0);
}

static void test_sanity(void **state)
{
    (void)state;
    slice_t *s = slice_load(300, 1.0);
    size_t n = s->in.n;
    kvr_trace_ceilings_t ceil;
    assert_int_equal(kvr_trace_ceilings(&s->t, 16, 8u * 16384u, &ceil), KVR_OK);
    kvr_sim_result_t res[5];
    for (int m = KVR_MODE_KV; m <= KVR_MODE_APPROX; m++) {
        kvr_sim_config_t c;
        small_config(&c, 8, (kvr_router_mode_t)m);
        c.engine.num_gpu_blocks = 16384;
        char err[256] = "";
        if (kvr_sim_run(&c, &s->in, &res[m], NULL, err, sizeof err) != KVR_OK)
            fail_msg("mode %d: %s", m, err);
        check_result(&res[m], n);
        assert_int_equal(res[m].requests, n);
        assert_true(res[m].hit_ratio <= ceil.infinite + 1e-12);
        assert_int_equal(res[m].prompt_tokens, ceil.prompt_tokens);
    }
    /* every row shares the first 512 tokens, so even round-robin hits something */
    assert_true(res[KVR_MODE_ROUND_ROBIN].hit_ratio > 0);
    assert_true(res[KVR_MODE_KV].hit_ratio > res[KVR_MODE_ROUND_ROBIN].hit_ratio);
    assert_true(res[KVR_MODE_KV].hit_ratio > res[KVR_MODE_RANDOM].hit_ratio);
    /* KV mode: the router knew what it would find (the index is exact in virtual time) */
    assert_true(res[KVR_MODE_KV].best_cached_tokens >= res[KVR_MODE_KV].predicted_cached_tokens);
    assert_true(res[KVR_MODE_KV].predicted_cached_tokens > 0);
    /* round-robin spreads requests evenly */
    assert_true(res[KVR_MODE_ROUND_ROBIN].max_worker_share <= 1.0 / 8 + 1.0 / (double)n);
    /* approximate mode: the engines' events never reach the index */
    assert_int_equal(res[KVR_MODE_APPROX].index_events, 0);
    assert_true(res[KVR_MODE_KV].index_events > 0);
    slice_free(s);
}

/* Conversations: 7 of them, 6 turns each, turn k of conversation c = ids c*100 + 0 .. 2k+1
 * (each turn extends the last by two 512-token blocks), one request every 2 s, turn-major, 4
 * workers. Light load, so KV routing keeps each conversation on its worker and hits almost
 * everything there is to hit; round-robin moves them (7 is prime to 4). */
static void test_conversations(void **state)
{
    (void)state;
    enum { CONV = 7, TURNS = 6, N = CONV * TURNS };
    static uint64_t ids[N][2 * TURNS];
    kvr_trace_row_t rows[N];
    kvr_sim_request_t reqs[N];
    for (int k = 0; k < TURNS; k++)
        for (int c = 0; c < CONV; c++) {
            int i = k * CONV + c;
            uint32_t nb = 2 * (uint32_t)k + 2;
            for (uint32_t b = 0; b < nb; b++)
                ids[i][b] = (uint64_t)c * 100 + b;
            rows[i] = (kvr_trace_row_t){.timestamp_ms = (uint64_t)i * 2000,
                                        .input_length = nb * 512 - 100,
                                        .output_length = 20,
                                        .hash_ids = ids[i],
                                        .n_hash_ids = nb};
            reqs[i] = (kvr_sim_request_t){.arrival_ms = (double)i * 2000,
                                          .n_tokens = rows[i].input_length,
                                          .max_tokens = 20};
        }
    kvr_trace_t t = {.rows = rows, .n_rows = N};
    kvr_sim_input_t in = {.reqs = reqs, .n = N, .tokens = trace_tokens, .ud = &t};
    kvr_trace_ceilings_t ceil;
    assert_int_equal(kvr_trace_ceilings(&t, 16, 4u * 4096u, &ceil), KVR_OK);
    assert_true(ceil.infinite > 0.5);
    kvr_sim_result_t res[5];
    for (int m = KVR_MODE_KV; m <= KVR_MODE_APPROX; m++) {
        kvr_sim_config_t c;
        small_config(&c, 4, (kvr_router_mode_t)m);
        c.engine.num_gpu_blocks = 4096;
        assert_int_equal(kvr_sim_run(&c, &in, &res[m], NULL, NULL, 0), KVR_OK);
        check_result(&res[m], N);
        assert_true(res[m].hit_ratio <= ceil.infinite + 1e-12);
    }
    /* nothing is evicted (7 x 12 blocks of 32 fit one worker), so KV and approximate routing
     * reach the infinite ceiling exactly; round-robin finds a quarter-ish of it */
    assert_true(fabs(res[KVR_MODE_KV].hit_ratio - ceil.infinite) < 1e-12);
    assert_true(fabs(res[KVR_MODE_APPROX].hit_ratio - ceil.infinite) < 1e-12);
    assert_true(res[KVR_MODE_ROUND_ROBIN].hit_ratio < 0.5 * ceil.infinite);
    assert_true(res[KVR_MODE_KV].ttft_ms.p50 < res[KVR_MODE_ROUND_ROBIN].ttft_ms.p50);
}

/* Rows that cannot fit max_model_len are skipped and counted, the others run. */
static void test_too_long(void **state)
{
    (void)state;
    slice_t *s = slice_load(n_rows() / 3, 1.0);
    size_t n = s->in.n, expect = 0;
    for (size_t i = 0; i < n; i++)
        expect += (uint64_t)s->reqs[i].n_tokens + s->reqs[i].max_tokens > 16384;
    assert_true(expect > 0 && expect < n);
    kvr_sim_config_t c;
    small_config(&c, 2, KVR_MODE_KV);
    c.engine.max_model_len = 16384;
    kvr_sim_result_t res;
    kvr_sim_record_t *rec = calloc(n, sizeof *rec);
    assert_non_null(rec);
    assert_int_equal(kvr_sim_run(&c, &s->in, &res, rec, NULL, 0), KVR_OK);
    assert_int_equal(res.too_long, expect);
    assert_int_equal(res.requests, n - expect);
    for (size_t i = 0; i < n; i++) {
        bool longer = (uint64_t)s->reqs[i].n_tokens + s->reqs[i].max_tokens > 16384;
        assert_int_equal(rec[i].outcome, longer ? KVR_SIM_TOO_LONG : KVR_SIM_DONE);
        assert_int_equal(rec[i].worker, longer ? -1 : rec[i].worker);
    }
    free(rec);
    slice_free(s);
}

/* With router_queue_threshold set, arrivals wait in the router while every worker's prefill
 * load is over it; all of them still finish, in arrival order per FCFS, deterministically. */
static void test_queue(void **state)
{
    (void)state;
    slice_t *s = slice_load(n_rows() / 2, 8.0);
    size_t n = s->in.n;
    kvr_sim_config_t c;
    small_config(&c, 2, KVR_MODE_KV);
    c.router.router_queue_threshold = (kvr_opt_f64_t){.set = true, .v = 0.5};
    c.router.router_queue_timeout_ms = 1000000000;
    kvr_sim_result_t a, b;
    kvr_sim_record_t *r1 = calloc(n, sizeof *r1), *r2 = calloc(n, sizeof *r2);
    assert_non_null(r1);
    assert_non_null(r2);
    assert_int_equal(kvr_sim_run(&c, &s->in, &a, r1, NULL, 0), KVR_OK);
    assert_int_equal(kvr_sim_run(&c, &s->in, &b, r2, NULL, 0), KVR_OK);
    assert_true(same_records(r1, r2, n));
    check_result(&a, n);
    assert_int_equal(a.requests, n);
    assert_true(a.queued > 0);
    assert_true(a.queue_ms.p99 > 0);
    for (size_t i = 1; i < n; i++) /* FCFS: placed in arrival order */
        assert_true(r1[i].routed_ms >= r1[i - 1].routed_ms);
    /* a short timeout drops some of them, counted */
    c.router.router_queue_timeout_ms = 1;
    assert_int_equal(kvr_sim_run(&c, &s->in, &a, r1, NULL, 0), KVR_OK);
    assert_true(a.expired > 0);
    check_result(&a, n);
    free(r1);
    free(r2);
    slice_free(s);
}

/* ---- errors -------------------------------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    hand_t h = {.base = {1, 2}};
    kvr_sim_request_t reqs[2] = {{.arrival_ms = 5, .n_tokens = 20, .max_tokens = 1},
                                 {.arrival_ms = 4, .n_tokens = 20, .max_tokens = 1}};
    kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = hand_tokens, .ud = &h};
    kvr_sim_config_t c;
    kvr_sim_result_t res;
    char err[256];
    small_config(&c, 2, KVR_MODE_KV);
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "request 1: arrival_ms: goes back");
    reqs[1].arrival_ms = 6;
    reqs[1].n_tokens = 0;
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "request 1: n_tokens: must be >= 1");
    reqs[1].n_tokens = 20;
    reqs[0].max_tokens = 0;
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "request 0: max_tokens: must be >= 1");
    reqs[0].max_tokens = 1;
    reqs[0].arrival_ms = NAN;
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "request 0: arrival_ms: must be a finite number >= 0");
    reqs[0].arrival_ms = 5;
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_OK);
    assert_int_equal(res.requests, 2);

    c.router.block_size = 32;
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "block_size: the router's (32) must equal the engines' (16)");
    small_config(&c, 0, KVR_MODE_KV);
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "workers: must be in [1, 4096]");
    small_config(&c, 2, KVR_MODE_KV);
    c.engine.max_num_seqs = 0;
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "max_num_seqs"));
    assert_int_equal(kvr_sim_run(&c, NULL, &res, NULL, err, sizeof err), KVR_EINVAL);
    assert_int_equal(kvr_sim_run(&c, &in, NULL, NULL, err, sizeof err), KVR_EINVAL);
    /* an empty input is a valid, empty run */
    small_config(&c, 2, KVR_MODE_KV);
    kvr_sim_input_t none = {.reqs = NULL, .n = 0, .tokens = hand_tokens, .ud = &h};
    assert_int_equal(kvr_sim_run(&c, &none, &res, NULL, err, sizeof err), KVR_OK);
    assert_int_equal(res.requests, 0);
    assert_true(isnan(res.ttft_ms.p50));
}

static int failing_tokens(void *ud, size_t i, uint32_t *out, size_t cap)
{
    (void)ud;
    (void)out;
    (void)cap;
    return i == 1 ? KVR_EIO : hand_tokens(&(hand_t){.base = {1}}, 0, out, cap);
}

static void test_tokens_failure(void **state)
{
    (void)state;
    kvr_sim_request_t reqs[2] = {{.arrival_ms = 0, .n_tokens = 20, .max_tokens = 1},
                                 {.arrival_ms = 1, .n_tokens = 20, .max_tokens = 1}};
    kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = failing_tokens, .ud = NULL};
    kvr_sim_config_t c;
    small_config(&c, 1, KVR_MODE_KV);
    kvr_sim_result_t res;
    char err[256];
    assert_int_equal(kvr_sim_run(&c, &in, &res, NULL, err, sizeof err), KVR_EIO);
    assert_string_equal(err, "the tokens callback failed");
    assert_int_equal(res.requests, 0);
}

/* Approximate mode models each engine's cache (core/approx.c: capacity, blocks held by running
 * requests, outputs, freeing at the end), so with caches that evict (700 conversation rows,
 * ~750-block prompts on 8 x 16,384 blocks) it routes as well as KV events do and predicts the
 * hits it gets. A TTL-and-route-order model got 98% of KV mode's hits here, predicted 10%
 * high. */
static void test_approx_tracks_engines(void **state)
{
    (void)state;
    slice_t *s = slice_load(700, 2.0);
    kvr_sim_result_t res[2];
    kvr_router_mode_t modes[2] = {KVR_MODE_KV, KVR_MODE_APPROX};
    for (int m = 0; m < 2; m++) {
        kvr_sim_config_t c;
        small_config(&c, 8, modes[m]);
        c.engine.num_gpu_blocks = 16384;
        char err[256] = "";
        if (kvr_sim_run(&c, &s->in, &res[m], NULL, err, sizeof err) != KVR_OK)
            fail_msg("mode %d: %s", m, err);
        check_result(&res[m], s->in.n);
    }
    double kv = res[0].hit_ratio, ax = res[1].hit_ratio;
    double pred = (double)res[1].predicted_cached_tokens / (double)res[1].prompt_tokens;
    assert_true(kv > 0.05); /* the workload has hits to find */
    if (ax < 0.97 * kv)
        fail_msg("approximate mode hit %.4f, KV mode %.4f", ax, kv);
    if (fabs(pred - ax) > 0.03 * ax)
        fail_msg("approximate mode predicted %.4f, measured %.4f", pred, ax);
    slice_free(s);
}

/* The clairvoyant placement (cfg.oracle) puts each request where its first token comes
 * soonest. A (4,000 tokens) starts on worker 0 at 0 ms; B, the same prompt, arrives while A
 * prefills: at 10 ms, waiting for A's step and then hitting its cache (64 ms + prefill(16))
 * loses to worker 1's cold prefill (prefill(4000) = 84 ms); at 60 ms it wins. */
static void test_oracle(void **state)
{
    (void)state;
    double arrivals[2] = {10, 60};
    for (int k = 0; k < 2; k++) {
        hand_t h = {.base = {100, 100}};
        kvr_sim_request_t reqs[2] = {
            {.arrival_ms = 0, .n_tokens = 4000, .max_tokens = 50},
            {.arrival_ms = arrivals[k], .n_tokens = 4000, .max_tokens = 1}};
        kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = hand_tokens, .ud = &h};
        kvr_sim_config_t c;
        small_config(&c, 2, KVR_MODE_LEAST_LOADED);
        c.engine.num_gpu_blocks = 4096;
        c.oracle = true;
        kvr_sim_result_t res;
        kvr_sim_record_t rec[2];
        assert_int_equal(kvr_sim_run(&c, &in, &res, rec, NULL, 0), KVR_OK);
        assert_int_equal(res.requests, 2);
        assert_int_equal(rec[0].worker, 0);
        double ttft = rec[1].first_ms - rec[1].arrival_ms;
        if (k == 0) {
            assert_int_equal(rec[1].worker, 1);
            assert_int_equal(rec[1].cached_tokens, 0);
            near(ttft, prefill_ms(4000));
        } else {
            assert_int_equal(rec[1].worker, 0);
            assert_int_equal(rec[1].cached_tokens, 3984);
            near(ttft, prefill_ms(4000) - 60 + prefill_ms(16));
            assert_true(ttft < prefill_ms(4000));
        }
    }
    /* the second yardstick: at 10 ms worker 0's first token (with the cache) comes 8% later
     * than worker 1's (cold): within 10%, so it keeps the prefix together */
    hand_t h = {.base = {100, 100}};
    kvr_sim_request_t reqs[2] = {{.arrival_ms = 0, .n_tokens = 4000, .max_tokens = 50},
                                 {.arrival_ms = 10, .n_tokens = 4000, .max_tokens = 1}};
    kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = hand_tokens, .ud = &h};
    kvr_sim_config_t c;
    small_config(&c, 2, KVR_MODE_LEAST_LOADED);
    c.engine.num_gpu_blocks = 4096;
    c.oracle = true;
    c.oracle_affinity = 0.1;
    kvr_sim_result_t res;
    kvr_sim_record_t rec[2];
    assert_int_equal(kvr_sim_run(&c, &in, &res, rec, NULL, 0), KVR_OK);
    assert_int_equal(rec[1].worker, 0);
    assert_int_equal(rec[1].cached_tokens, 3984);
    near(rec[1].first_ms - rec[1].arrival_ms, prefill_ms(4000) - 10 + prefill_ms(16));
    c.oracle_affinity = 0.05; /* 8% is beyond it: the soonest */
    assert_int_equal(kvr_sim_run(&c, &in, &res, rec, NULL, 0), KVR_OK);
    assert_int_equal(rec[1].worker, 1);
    c.oracle_affinity = -1;
    assert_int_equal(kvr_sim_config_validate(&c, NULL, 0), KVR_EINVAL);
    small_config(&c, 4, KVR_MODE_KV);
    c.oracle = true;
    c.n_prefill = 1;
    char err[256] = "";
    assert_int_equal(kvr_sim_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "oracle"));
}

/* KV events through the link model: B repeats A's prompt 500 ms after it. Applied at once,
 * the router knows A's worker holds it; 1 s late (no jitter), it does not yet, and every batch
 * arrived exactly 1 s after it was published; lost (this seed loses A's batch) and replayed
 * after 1 s, likewise, and counted; the index never refuses an event. */
static void test_event_delay(void **state)
{
    (void)state;
    hand_t h = {.base = {100, 100}};
    kvr_sim_request_t reqs[2] = {{.arrival_ms = 0, .n_tokens = 1000, .max_tokens = 3},
                                 {.arrival_ms = 500, .n_tokens = 1000, .max_tokens = 3}};
    kvr_sim_input_t in = {.reqs = reqs, .n = 2, .tokens = hand_tokens, .ud = &h};
    for (int k = 0; k < 3; k++) {
        kvr_sim_config_t c;
        small_config(&c, 2, KVR_MODE_KV);
        c.engine.num_gpu_blocks = 4096;
        if (k == 1)
            c.link = (kvr_evlink_config_t){.delay_ms = 1000, .replay_ms = 1000};
        if (k == 2)
            c.link = (kvr_evlink_config_t){.loss = 0.9, .replay_ms = 1000};
        kvr_sim_result_t res;
        kvr_sim_record_t rec[2];
        assert_int_equal(kvr_sim_run(&c, &in, &res, rec, NULL, 0), KVR_OK);
        assert_int_equal(res.requests, 2);
        assert_int_equal(res.index_errors, 0);
        if (k == 0) {
            assert_int_equal(rec[1].predicted_cached_tokens, 992);
            assert_int_equal(rec[1].worker, rec[0].worker);
            assert_int_equal(res.event_batches, 0);
        } else if (k == 1) {
            assert_int_equal(rec[1].predicted_cached_tokens, 0);
            assert_true(res.event_batches > 0);
            assert_int_equal(res.events_lost, 0);
            near(res.event_delay_ms, 1000);
        } else {
            /* A's one batch (its 62 blocks) was lost: replayed 1 s after it was published,
             * so B, 500 ms after A, still finds nothing on record */
            assert_int_equal(res.event_batches, 1);
            assert_int_equal(res.events_lost, 1);
            near(res.event_delay_ms, 1000);
            assert_int_equal(rec[1].predicted_cached_tokens, 0);
        }
    }
    kvr_sim_config_t c;
    small_config(&c, 2, KVR_MODE_KV);
    c.link.loss = 1;
    char err[256] = "";
    assert_int_equal(kvr_sim_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "event-loss"));
}

/* Bursts on new prefixes (trace gen's fanout workload: a new document with several questions
 * sent within 50 ms, inside one prefill of the document), at twice round-robin's unloaded
 * TTFT: KV events report the document only once its first request has prefilled it, so
 * without the in-flight credit kv mode spreads each burst and computes the document again on
 * every worker; with it (router_inflight_credit_weight, the default 1), a burst's later
 * requests go where it is being computed when they will find it computed there (admitted
 * after the steps computing it, not beside them): at least 2x the hits, the end-to-end time
 * of the median request at most 0.8x (the prefill work saved), and the TTFT lower too: the
 * median at most 0.9x (measured 0.82x; crediting every block in flight, as before, gave
 * 1.06x: a request batched with the prefill it was credited for computes it again) and the
 * p99 at most 0.8x (0.62x). */
static void test_burst_on_a_new_prefix(void **state)
{
    (void)state;
    kvr_tracegen_config_t g = {.workload = KVR_WORKLOAD_FANOUT, .rate = 4, .duration_s = 120,
                               .seed = 1};
    slice_t *s = calloc(1, sizeof *s);
    assert_non_null(s);
    char err[256] = "";
    if (kvr_tracegen_run(&g, &s->t, err, sizeof err) != KVR_OK)
        fail_msg("trace gen: %s", err);
    s->reqs = calloc(s->t.n_rows, sizeof *s->reqs);
    assert_non_null(s->reqs);
    for (size_t i = 0; i < s->t.n_rows; i++)
        s->reqs[i] = (kvr_sim_request_t){.arrival_ms = (double)s->t.rows[i].timestamp_ms / 6.0,
                                         .n_tokens = s->t.rows[i].input_length,
                                         .max_tokens = s->t.rows[i].output_length};
    s->in = (kvr_sim_input_t){.reqs = s->reqs, .n = s->t.n_rows, .tokens = trace_tokens,
                              .ud = &s->t};
    kvr_sim_result_t res[2];
    for (int credit = 0; credit < 2; credit++) {
        kvr_sim_config_t c;
        small_config(&c, 8, KVR_MODE_KV);
        c.engine.num_gpu_blocks = 16384;
        c.router.router_inflight_credit_weight = credit;
        if (kvr_sim_run(&c, &s->in, &res[credit], NULL, err, sizeof err) != KVR_OK)
            fail_msg("credit %d: %s", credit, err);
        check_result(&res[credit], s->in.n);
    }
    if (res[1].hit_ratio < 2.0 * res[0].hit_ratio || res[1].e2e_ms.p50 > 0.8 * res[0].e2e_ms.p50 ||
        res[1].ttft_ms.p50 > 0.9 * res[0].ttft_ms.p50 ||
        res[1].ttft_ms.p99 > 0.8 * res[0].ttft_ms.p99)
        fail_msg("credit off: hits %.3f, e2e p50 %.0f ms, ttft p50 %.0f p99 %.0f ms; on: %.3f, "
                 "%.0f, %.0f, %.0f",
                 res[0].hit_ratio, res[0].e2e_ms.p50, res[0].ttft_ms.p50, res[0].ttft_ms.p99,
                 res[1].hit_ratio, res[1].e2e_ms.p50, res[1].ttft_ms.p50, res[1].ttft_ms.p99);
    slice_free(s);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]); /* one test by name (or a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lone_request_timing),
        cmocka_unit_test(test_disaggregated_timing),
        cmocka_unit_test(test_chunked_ttft),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_sanity),
        cmocka_unit_test(test_conversations),
        cmocka_unit_test(test_approx_tracks_engines),
        cmocka_unit_test(test_oracle),
        cmocka_unit_test(test_event_delay),
        cmocka_unit_test(test_burst_on_a_new_prefix),
        cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_queue),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tokens_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

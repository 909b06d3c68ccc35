/*
 * test_trace_gen.c: the synthetic workloads (sim/trace_gen.c) and the trace synthesizer
 * (sim/trace_synth.c).
 *
 * Checked, for every workload and both arrival processes: the trace is valid (the writer's
 * text reads back equal through kvr_trace_parse: sorted timestamps in [0, duration), one id
 * per 512-token block), every id names one prefix (it always follows the same parent), the
 * same seed gives the same trace and another seed another one, the request rate is the one
 * asked for, Gamma arrivals are burstier than Poisson ones, and each workload has its shape
 * (chat turns extend earlier prompts; agent prompts are long and share their agent's prefix;
 * RAG documents repeat by popularity). The synthesizer: all scales 1 gives the source with ids
 * renamed one to one (same lengths, same tree), users_scale copies the rows with disjoint
 * shared prefixes, rate_scale divides the timestamps, prefix_scale stretches shared prefixes.
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

#include "kvrouter.h"
#include "wire/trace.h"
#include "sim/trace_gen.h"
#include "sim/trace_synth.h"

static kvr_trace_t gen(kvr_workload_t w, kvr_arrival_t a, double rate, double dur, uint64_t seed)
{
    kvr_tracegen_config_t c = {
        .workload = w, .rate = rate, .arrival = a, .cv = 3, .duration_s = dur, .seed = seed};
    kvr_trace_t t;
    char err[200];
    assert_int_equal(kvr_tracegen_run(&c, &t, err, sizeof err), KVR_OK);
    return t;
}

/* Written and read back: the same rows. */
static void round_trip(const kvr_trace_t *t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(kvr_trace_write(f, t), KVR_OK);
    fclose(f);
    kvr_trace_t back;
    char err[300];
    int rc = kvr_trace_parse(buf, len, 0, &back, err, sizeof err);
    if (rc != KVR_OK)
        fail_msg("%s", err);
    assert_int_equal(back.n_rows, t->n_rows);
    for (size_t i = 0; i < t->n_rows; i++) {
        assert_int_equal(back.rows[i].timestamp_ms, t->rows[i].timestamp_ms);
        assert_int_equal(back.rows[i].input_length, t->rows[i].input_length);
        assert_int_equal(back.rows[i].output_length, t->rows[i].output_length);
        assert_int_equal(back.rows[i].n_hash_ids, t->rows[i].n_hash_ids);
        assert_memory_equal(back.rows[i].hash_ids, t->rows[i].hash_ids,
                            t->rows[i].n_hash_ids * sizeof(uint64_t));
    }
    kvr_trace_free(&back);
    free(buf);
}

/* Every id always follows the same parent (UINT64_MAX: first block): it names one prefix. */
static void one_parent_per_id(const kvr_trace_t *t)
{
    uint64_t max = 0;
    for (size_t i = 0; i < t->n_ids; i++)
        max = t->ids[i] > max ? t->ids[i] : max;
    uint64_t *parent = malloc((max + 1) * sizeof *parent);
    assert_non_null(parent);
    for (uint64_t i = 0; i <= max; i++)
        parent[i] = UINT64_MAX - 1; /* unseen */
    for (size_t r = 0; r < t->n_rows; r++) {
        const kvr_trace_row_t *row = &t->rows[r];
        for (uint32_t k = 0; k < row->n_hash_ids; k++) {
            uint64_t p = k ? row->hash_ids[k - 1] : UINT64_MAX, id = row->hash_ids[k];
            if (parent[id] == UINT64_MAX - 1)
                parent[id] = p;
            else if (parent[id] != p)
                fail_msg("id %llu follows two parents", (unsigned long long)id);
        }
    }
    free(parent);
}

static void valid(const kvr_trace_t *t, double dur)
{
    assert_true(t->n_rows > 0);
    for (size_t i = 0; i < t->n_rows; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        assert_true(r->timestamp_ms < (uint64_t)(dur * 1000) + 1);
        assert_true(i == 0 || r->timestamp_ms >= t->rows[i - 1].timestamp_ms);
        assert_int_equal(r->n_hash_ids, (r->input_length + 511) / 512);
        assert_true(r->output_length >= 1);
    }
    round_trip(t);
    one_parent_per_id(t);
}

/* Of all 512-token blocks, the share some earlier row already had. */
static double repeat_share(const kvr_trace_t *t)
{
    uint64_t max = 0, seen = 0;
    for (size_t i = 0; i < t->n_ids; i++)
        max = t->ids[i] > max ? t->ids[i] : max;
    char *had = calloc(max + 1, 1);
    for (size_t i = 0; i < t->n_ids; i++) {
        seen += had[t->ids[i]];
        had[t->ids[i]] = 1;
    }
    free(had);
    return (double)seen / (double)t->n_ids;
}

static size_t distinct(const kvr_trace_t *t)
{
    uint64_t max = 0;
    size_t n = 0;
    for (size_t i = 0; i < t->n_ids; i++)
        max = t->ids[i] > max ? t->ids[i] : max;
    char *had = calloc(max + 1, 1);
    for (size_t i = 0; i < t->n_ids; i++) {
        n += !had[t->ids[i]];
        had[t->ids[i]] = 1;
    }
    free(had);
    return n;
}

static double mean_input(const kvr_trace_t *t)
{
    double s = 0;
    for (size_t i = 0; i < t->n_rows; i++)
        s += t->rows[i].input_length;
    return s / (double)t->n_rows;
}

static double gap_cv(const kvr_trace_t *t)
{
    double s = 0, s2 = 0;
    size_t n = t->n_rows - 1;
    for (size_t i = 1; i < t->n_rows; i++) {
        double g = (double)(t->rows[i].timestamp_ms - t->rows[i - 1].timestamp_ms);
        s += g;
        s2 += g * g;
    }
    double m = s / (double)n;
    return sqrt(s2 / (double)n - m * m) / m;
}

static void test_every_workload_valid(void **s)
{
    (void)s;
    for (int w = 0; w < KVR_WORKLOAD_N; w++)
        for (int a = 0; a < 2; a++) {
            kvr_trace_t t = gen((kvr_workload_t)w, (kvr_arrival_t)a, 6, 300, 7);
            valid(&t, 300);
            kvr_trace_free(&t);
        }
}

static void test_seeded(void **s)
{
    (void)s;
    kvr_trace_t a = gen(KVR_WORKLOAD_MIX, KVR_ARRIVAL_POISSON, 5, 200, 3);
    kvr_trace_t b = gen(KVR_WORKLOAD_MIX, KVR_ARRIVAL_POISSON, 5, 200, 3);
    kvr_trace_t c = gen(KVR_WORKLOAD_MIX, KVR_ARRIVAL_POISSON, 5, 200, 4);
    assert_int_equal(a.n_rows, b.n_rows);
    assert_int_equal(a.n_ids, b.n_ids);
    assert_memory_equal(a.ids, b.ids, a.n_ids * sizeof *a.ids);
    for (size_t i = 0; i < a.n_rows; i++)
        assert_int_equal(a.rows[i].timestamp_ms, b.rows[i].timestamp_ms);
    assert_true(c.n_rows != a.n_rows || c.n_ids != a.n_ids ||
                memcmp(c.ids, a.ids, a.n_ids * sizeof *a.ids) != 0);
    kvr_trace_free(&a);
    kvr_trace_free(&b);
    kvr_trace_free(&c);
}

/* The rate asked for (Poisson: 6/s over 1200 s is 7200 +- 85; sessions and tasks add
 * variance, hence the wider bound), and burstier gaps with Gamma arrivals. */
static void test_rate_and_arrivals(void **s)
{
    (void)s;
    for (int w = 0; w < KVR_WORKLOAD_N; w++) {
        kvr_trace_t t = gen((kvr_workload_t)w, KVR_ARRIVAL_POISSON, 6, 1200, 11);
        double rate = (double)t.n_rows / 1200.0;
        if (fabs(rate - 6) > 6 * 0.15)
            fail_msg("%s: %.2f requests/s for 6", kvr_workload_name((kvr_workload_t)w), rate);
        kvr_trace_free(&t);
    }
    kvr_trace_t p = gen(KVR_WORKLOAD_RAG, KVR_ARRIVAL_POISSON, 6, 1200, 12);
    kvr_trace_t g = gen(KVR_WORKLOAD_RAG, KVR_ARRIVAL_GAMMA, 6, 1200, 12);
    double cp = gap_cv(&p), cg = gap_cv(&g);
    if (!(cp > 0.85 && cp < 1.15 && cg > 2.0))
        fail_msg("gap cv: poisson %.2f (about 1), gamma cv 3: %.2f", cp, cg);
    kvr_trace_free(&p);
    kvr_trace_free(&g);
}

/* Rows that start with an earlier row's whole prompt (its full blocks), that prompt past 1536
 * tokens so that it holds more than a system prompt (at most 1500 tokens). */
static size_t extends_earlier(const kvr_trace_t *t)
{
    size_t n = 0;
    for (size_t i = 1; i < t->n_rows; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        bool found = false;
        for (size_t j = i; j-- > 0 && !found && i - j < 400;) {
            const kvr_trace_row_t *q = &t->rows[j];
            size_t full = q->input_length / 512; /* its whole blocks */
            found = q->input_length >= 1536 && full < r->n_hash_ids &&
                    memcmp(q->hash_ids, r->hash_ids, full * sizeof(uint64_t)) == 0;
        }
        n += found;
    }
    return n;
}

static void test_shapes(void **s)
{
    (void)s;
    kvr_trace_t chat = gen(KVR_WORKLOAD_CHAT, KVR_ARRIVAL_POISSON, 6, 900, 5);
    kvr_trace_t agent = gen(KVR_WORKLOAD_AGENT, KVR_ARRIVAL_POISSON, 6, 900, 5);
    kvr_trace_t rag = gen(KVR_WORKLOAD_RAG, KVR_ARRIVAL_POISSON, 6, 900, 5);
    double ext = (double)extends_earlier(&chat) / (double)chat.n_rows;
    printf("chat rows extending an earlier prompt: %.2f\n", ext);
    if (ext < 0.3)
        fail_msg("chat: only %.2f of the turns extend an earlier prompt", ext);
    if (!(mean_input(&agent) > 2 * mean_input(&chat)))
        fail_msg("agent prompts (%.0f) not long beside chat's (%.0f)", mean_input(&agent),
                 mean_input(&chat));
    double ra = repeat_share(&agent), rr = repeat_share(&rag), rc = repeat_share(&chat);
    if (!(ra > 0.8 && rr > 0.3 && rc > 0.4))
        fail_msg("repeat shares: agent %.2f, rag %.2f, chat %.2f", ra, rr, rc);
    kvr_trace_free(&chat);
    kvr_trace_free(&agent);
    kvr_trace_free(&rag);
}

static void test_gen_errors(void **s)
{
    (void)s;
    kvr_tracegen_config_t c = {.workload = KVR_WORKLOAD_CHAT, .rate = 0, .duration_s = 10};
    kvr_trace_t t;
    char err[200];
    assert_int_equal(kvr_tracegen_run(&c, &t, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "rate: out of range");
    c.rate = 1;
    c.arrival = KVR_ARRIVAL_GAMMA;
    assert_int_equal(kvr_tracegen_run(&c, &t, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "cv: out of range");
    assert_int_equal(kvr_workload_parse("rag"), KVR_WORKLOAD_RAG);
    assert_int_equal(kvr_workload_parse("nope"), KVR_WORKLOAD_N);
    c = (kvr_tracegen_config_t){.rate = 50, .duration_s = 100, .max_rows = 37, .seed = 1};
    assert_int_equal(kvr_tracegen_run(&c, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 37);
    kvr_trace_free(&t);
}

static kvr_trace_t synth(const kvr_trace_t *src, double rate, uint32_t users, double prompt,
                         double prefix)
{
    kvr_synth_config_t c = {.rate_scale = rate,
                            .users_scale = users,
                            .prompt_scale = prompt,
                            .prefix_scale = prefix,
                            .seed = 9};
    kvr_trace_t t;
    char err[200];
    int rc = kvr_trace_synth(src, &c, &t, err, sizeof err);
    if (rc != KVR_OK)
        fail_msg("%s", err);
    return t;
}

static void test_synth_identity(void **s)
{
    (void)s;
    kvr_trace_t src = gen(KVR_WORKLOAD_MIX, KVR_ARRIVAL_POISSON, 4, 300, 21);
    kvr_trace_t t = synth(&src, 1, 1, 1, 1);
    assert_int_equal(t.n_rows, src.n_rows);
    assert_int_equal(t.n_ids, src.n_ids);
    /* ids renamed one to one: a bijection between the two traces' ids */
    uint64_t max = 0;
    for (size_t i = 0; i < src.n_ids; i++)
        max = src.ids[i] > max ? src.ids[i] : max;
    for (size_t i = 0; i < t.n_ids; i++)
        max = t.ids[i] > max ? t.ids[i] : max;
    uint64_t *fwd = malloc((max + 1) * sizeof *fwd), *bwd = malloc((max + 1) * sizeof *bwd);
    for (uint64_t i = 0; i <= max; i++)
        fwd[i] = bwd[i] = UINT64_MAX;
    for (size_t r = 0; r < src.n_rows; r++) {
        assert_int_equal(t.rows[r].timestamp_ms, src.rows[r].timestamp_ms);
        assert_int_equal(t.rows[r].input_length, src.rows[r].input_length);
        assert_int_equal(t.rows[r].output_length, src.rows[r].output_length);
        for (uint32_t k = 0; k < src.rows[r].n_hash_ids; k++) {
            uint64_t a = src.rows[r].hash_ids[k], b = t.rows[r].hash_ids[k];
            assert_true(fwd[a] == UINT64_MAX || fwd[a] == b);
            assert_true(bwd[b] == UINT64_MAX || bwd[b] == a);
            fwd[a] = b;
            bwd[b] = a;
        }
    }
    free(fwd);
    free(bwd);
    valid(&t, 300);
    kvr_trace_free(&t);
    kvr_trace_free(&src);
}

static void test_synth_scales(void **s)
{
    (void)s;
    kvr_trace_t src = gen(KVR_WORKLOAD_RAG, KVR_ARRIVAL_POISSON, 4, 300, 22);
    kvr_trace_t u = synth(&src, 1, 3, 1, 1);
    assert_int_equal(u.n_rows, 3 * src.n_rows);
    valid(&u, 301);
    /* three copies of the shared tree, nothing shared across copies: three times the
     * distinct blocks, each copy repeating as the source does */
    assert_int_equal(distinct(&u), 3 * distinct(&src));
    assert_true(fabs(repeat_share(&u) - repeat_share(&src)) < 1e-9);
    kvr_trace_t r = synth(&src, 4, 1, 1, 1);
    assert_int_equal(r.n_rows, src.n_rows);
    assert_true(r.rows[r.n_rows - 1].timestamp_ms * 4 <= src.rows[src.n_rows - 1].timestamp_ms + 4);
    kvr_trace_t p = synth(&src, 1, 1, 1, 2);
    if (!(repeat_share(&p) > repeat_share(&src)))
        fail_msg("prefix x2: repeats %.3f, source %.3f", repeat_share(&p), repeat_share(&src));
    valid(&p, 300);
    kvr_trace_t q = synth(&src, 1, 1, 0.5, 1);
    if (!(mean_input(&q) < mean_input(&src)))
        fail_msg("prompt x0.5: mean input %.0f, source %.0f", mean_input(&q), mean_input(&src));
    kvr_synth_config_t bad = {
        .rate_scale = 1, .users_scale = 0, .prompt_scale = 1, .prefix_scale = 1};
    kvr_trace_t t;
    char err[200];
    assert_int_equal(kvr_trace_synth(&src, &bad, &t, err, sizeof err), KVR_EINVAL);
    assert_string_equal(err, "users_scale: out of range");
    kvr_trace_free(&u);
    kvr_trace_free(&r);
    kvr_trace_free(&p);
    kvr_trace_free(&q);
    kvr_trace_free(&src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_workload_valid), cmocka_unit_test(test_seeded),
        cmocka_unit_test(test_rate_and_arrivals),    cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_gen_errors),           cmocka_unit_test(test_synth_identity),
        cmocka_unit_test(test_synth_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

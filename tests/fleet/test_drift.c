/*
 * test_drift.c: the index's self-check (fleet/drift.h) against a model kept beside it.
 *   - rules: a sample agrees within one block; a prompt too short to hit a block is not
 *     judged; a full window below min_accuracy flags the rank once, a window at or above it
 *     recovers it, a further full window of fresh bad samples says STILL; restart empties the
 *     window; removing a worker forgets its ranks only;
 *   - model-based: random samples over several ranks, windows and thresholds, every answer of
 *     kvr_drift_observe and every view equal to a model that keeps each rank's whole history
 *     and recomputes its window from scratch; kvr_drift_verify after every step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fleet/drift.h"

static kvr_drift_sample_t sample(uint64_t id, uint64_t prompt, uint64_t pred, uint64_t rep)
{
    return (kvr_drift_sample_t){.w = {id, 0},
                                .prompt_tokens = prompt,
                                .predicted = pred,
                                .reported = rep,
                                .block_size = 16,
                                .now_ms = 1000};
}

static void test_rules(void **state)
{
    (void)state;
    kvr_drift_config_t c = {.window = 4, .min_accuracy = 0.5};
    kvr_drift_t *d = kvr_drift_new(&c);
    assert_non_null(d);
    kvr_drift_sample_t s = sample(1, 10, 0, 0); /* (10 - 1) / 16 = 0: says nothing */
    assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_SAME);
    kvr_drift_view_t v;
    assert_true(kvr_drift_view(d, (kvr_worker_t){1, 0}, &v));
    assert_int_equal(v.unjudged, 1);
    assert_int_equal(v.compared, 0);
    /* within one block agrees (an engine computes the last token of a cached prompt) */
    s = sample(1, 64, 64, 48);
    assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_SAME);
    s = sample(1, 64, 0, 48); /* three blocks missed */
    for (int i = 0; i < 2; i++)
        assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_SAME);
    /* window full (1 of 4 agree < 0.5): flagged, once */
    assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_FLAGGED);
    (void)kvr_drift_view(d, (kvr_worker_t){1, 0}, &v);
    assert_true(v.drifting);
    assert_int_equal(v.window_samples, 4);
    assert_int_equal(v.window_agreeing, 1);
    assert_true(v.mean_error > 0); /* the index misses what the engine holds */
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_SAME);
    assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_STILL); /* a fresh full window */
    /* restart: the window starts over; 2 of 4 agreeing is enough (>= 0.5) */
    kvr_drift_restart(d, (kvr_worker_t){1, 0});
    (void)kvr_drift_view(d, (kvr_worker_t){1, 0}, &v);
    assert_int_equal(v.window_samples, 0);
    assert_true(v.drifting);
    kvr_drift_sample_t good = sample(1, 64, 48, 48);
    assert_int_equal(kvr_drift_observe(d, &good), KVR_DRIFT_SAME);
    assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_SAME);
    assert_int_equal(kvr_drift_observe(d, &good), KVR_DRIFT_SAME);
    assert_int_equal(kvr_drift_observe(d, &s), KVR_DRIFT_RECOVERED);
    (void)kvr_drift_view(d, (kvr_worker_t){1, 0}, &v);
    assert_false(v.drifting);
    assert_int_equal(v.flagged, 1);
    assert_int_equal(v.recovered, 1);
    /* another worker, then its removal: the first is kept */
    kvr_drift_sample_t o = sample(2, 64, 0, 0);
    (void)kvr_drift_observe(d, &o);
    kvr_drift_remove_worker(d, 2);
    assert_false(kvr_drift_view(d, (kvr_worker_t){2, 0}, &v));
    assert_true(kvr_drift_view(d, (kvr_worker_t){1, 0}, &v));
    assert_int_equal(kvr_drift_verify(d, NULL, 0), KVR_OK);
    kvr_drift_free(d);
}

static void test_refuses_bad_config(void **state)
{
    (void)state;
    kvr_drift_config_t c = {.window = 0, .min_accuracy = 0.5};
    assert_null(kvr_drift_new(&c));
    c = (kvr_drift_config_t){.window = 1025, .min_accuracy = 0.5};
    assert_null(kvr_drift_new(&c));
    c = (kvr_drift_config_t){.window = 8, .min_accuracy = 1.5};
    assert_null(kvr_drift_new(&c));
}

/* ---- model ---- */

#define MAX_HIST 4096
typedef struct mrank {
    bool agree[MAX_HIST];
    int64_t err[MAX_HIST];
    size_t n;         /* judged samples ever */
    size_t start;     /* the window's samples are those from here (restart moves it) */
    size_t fresh_from; /* STILL counts fresh samples from here */
    bool drifting;
    uint64_t flagged, recovered;
} mrank_t;

static kvr_drift_change_t model_observe(mrank_t *m, uint32_t window, double min_acc,
                                        int64_t err, uint32_t bs)
{
    m->agree[m->n] = llabs(err) <= bs;
    m->err[m->n] = err;
    m->n++;
    size_t from = m->n - m->start > window ? m->n - window : m->start;
    size_t cnt = m->n - from, ok = 0;
    for (size_t i = from; i < m->n; i++)
        ok += m->agree[i];
    if (cnt < window)
        return KVR_DRIFT_SAME;
    bool trusted = (double)ok >= min_acc * (double)cnt - 1e-9;
    if (!m->drifting) {
        if (trusted)
            return KVR_DRIFT_SAME;
        m->drifting = true;
        m->flagged++;
        m->fresh_from = m->n;
        return KVR_DRIFT_FLAGGED;
    }
    if (trusted) {
        m->drifting = false;
        m->recovered++;
        return KVR_DRIFT_RECOVERED;
    }
    if (m->n - m->fresh_from >= window) {
        m->fresh_from = m->n;
        return KVR_DRIFT_STILL;
    }
    return KVR_DRIFT_SAME;
}

static void test_model(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int round = 0; round < 40; round++) {
        kvr_drift_config_t c = {.window = 1 + (uint32_t)(RND() % 24),
                                .min_accuracy = (double)(RND() % 11) / 10.0};
        kvr_drift_t *d = kvr_drift_new(&c);
        assert_non_null(d);
        enum { RANKS = 3 };
        mrank_t *m = calloc(RANKS, sizeof *m);
        assert_non_null(m);
        double p_bad = (double)(RND() % 100) / 100.0;
        for (int step = 0; step < 1500; step++) {
            uint32_t r = (uint32_t)(RND() % RANKS);
            kvr_worker_t w = {7, r};
            if (RND() % 200 == 0) {
                kvr_drift_restart(d, w);
                m[r].start = m[r].n;
                m[r].fresh_from = m[r].n;
                continue;
            }
            uint64_t prompt = RND() % 200;
            uint64_t pred = RND() % (prompt + 1);
            bool bad = (double)(RND() % 1000) / 1000.0 < p_bad;
            uint64_t rep = bad ? RND() % (prompt + 1) : pred + RND() % 17;
            kvr_drift_sample_t s = {.w = w, .prompt_tokens = prompt, .predicted = pred,
                                    .reported = rep, .block_size = 16, .now_ms = 5};
            kvr_drift_change_t want = KVR_DRIFT_SAME;
            bool judged = prompt > 0 && (prompt - 1) / 16 > 0;
            if (judged && m[r].n < MAX_HIST)
                want = model_observe(&m[r], c.window, c.min_accuracy,
                                     (int64_t)rep - (int64_t)pred, 16);
            else if (judged)
                break;
            assert_int_equal(kvr_drift_observe(d, &s), want);
            kvr_drift_view_t v;
            if (kvr_drift_view(d, w, &v)) {
                assert_int_equal(v.drifting, m[r].drifting);
                assert_int_equal(v.flagged, m[r].flagged);
                assert_int_equal(v.recovered, m[r].recovered);
            }
            char msg[160];
            assert_int_equal(kvr_drift_verify(d, msg, sizeof msg), KVR_OK);
        }
        free(m);
        kvr_drift_free(d);
    }
#undef RND
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_refuses_bad_config),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

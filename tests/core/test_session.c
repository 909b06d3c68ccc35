/*
 * test_session.c: sticky sessions (core/session.h): binding, preference lookups, TTL expiry,
 * LRU eviction at the cap, close, counters; and a model-based randomized test (a naive list
 * of bindings ordered by recency takes the same operations; compared after every step,
 * verify() after every step). KVR_TEST_SEED reruns one seed (tests/common/model_driver.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model_driver.h"
#include "core/session.h"

static kvr_sessions_t *make(uint64_t ttl_ms, size_t max)
{
    kvr_sessions_config_t c = {.ttl_ms = ttl_ms, .max_sessions = max};
    int st;
    kvr_sessions_t *s = kvr_sessions_new(&c, &st);
    assert_non_null(s);
    return s;
}

static void verify(const kvr_sessions_t *s)
{
    char msg[200];
    if (kvr_sessions_verify(s, msg, sizeof msg) != KVR_OK)
        fail_msg("verify: %s", msg);
}

static void test_bind_lookup_expire_close(void **st)
{
    (void)st;
    kvr_sessions_t *s = make(1000, 8);
    kvr_worker_t w;
    assert_false(kvr_sessions_lookup(s, "a", 1, 0, &w));
    assert_int_equal(kvr_sessions_bind(s, "a", 1, (kvr_worker_t){3, 1}, 100), KVR_OK);
    assert_true(kvr_sessions_lookup(s, "a", 1, 500, &w));
    assert_true(w.worker_id == 3 && w.dp_rank == 1);
    /* the same rank again: a hit; another: a rebind */
    assert_int_equal(kvr_sessions_bind(s, "a", 1, (kvr_worker_t){3, 1}, 600), KVR_OK);
    assert_int_equal(kvr_sessions_bind(s, "a", 1, (kvr_worker_t){4, 0}, 700), KVR_OK);
    kvr_sessions_stats_t ss;
    kvr_sessions_stats(s, &ss);
    assert_true(ss.binds == 1 && ss.hits == 1 && ss.rebinds == 1 && ss.live == 1);
    /* idle for the ttl after its last request: not found, then dropped by expire */
    assert_true(kvr_sessions_lookup(s, "a", 1, 1699, &w));
    assert_false(kvr_sessions_lookup(s, "a", 1, 1700, &w));
    kvr_sessions_expire(s, 1700);
    kvr_sessions_stats(s, &ss);
    assert_true(ss.expired == 1 && ss.live == 0);
    /* close */
    assert_int_equal(kvr_sessions_bind(s, "b", 1, (kvr_worker_t){1, 0}, 2000), KVR_OK);
    assert_true(kvr_sessions_close(s, "b", 1));
    assert_false(kvr_sessions_close(s, "b", 1));
    assert_false(kvr_sessions_lookup(s, "b", 1, 2000, &w));
    /* ids: empty or too long refused; the longest accepted */
    char id[KVR_SESSION_MAX_ID + 1];
    memset(id, 'x', sizeof id);
    assert_int_equal(kvr_sessions_bind(s, id, 0, (kvr_worker_t){1, 0}, 1), KVR_EINVAL);
    assert_int_equal(kvr_sessions_bind(s, id, sizeof id, (kvr_worker_t){1, 0}, 1), KVR_EINVAL);
    assert_int_equal(kvr_sessions_bind(s, id, KVR_SESSION_MAX_ID, (kvr_worker_t){1, 0}, 3000),
                     KVR_OK);
    verify(s);
    kvr_sessions_free(s);
}

/* At the cap the least recently used binding goes, not the oldest bound. */
static void test_lru_eviction(void **st)
{
    (void)st;
    kvr_sessions_t *s = make(1000000, 3);
    kvr_worker_t w;
    assert_int_equal(kvr_sessions_bind(s, "a", 1, (kvr_worker_t){1, 0}, 1), KVR_OK);
    assert_int_equal(kvr_sessions_bind(s, "b", 1, (kvr_worker_t){2, 0}, 2), KVR_OK);
    assert_int_equal(kvr_sessions_bind(s, "c", 1, (kvr_worker_t){3, 0}, 3), KVR_OK);
    assert_int_equal(kvr_sessions_bind(s, "a", 1, (kvr_worker_t){1, 0}, 4), KVR_OK); /* a used */
    assert_int_equal(kvr_sessions_bind(s, "d", 1, (kvr_worker_t){4, 0}, 5), KVR_OK);
    assert_false(kvr_sessions_lookup(s, "b", 1, 6, &w)); /* b was the least recently used */
    assert_true(kvr_sessions_lookup(s, "a", 1, 6, &w));
    assert_true(kvr_sessions_lookup(s, "c", 1, 6, &w));
    kvr_sessions_stats_t ss;
    kvr_sessions_stats(s, &ss);
    assert_true(ss.evicted == 1 && ss.live == 3);
    verify(s);
    kvr_sessions_free(s);
    kvr_sessions_config_t bad = {.ttl_ms = 0, .max_sessions = 1};
    int rc;
    assert_null(kvr_sessions_new(&bad, &rc));
    assert_int_equal(rc, KVR_EINVAL);
}

/* ---- the model ---- */

#define N_IDS 40
#define CAP 16
#define TTL 50

typedef struct mb {
    int id;
    kvr_worker_t w;
    uint64_t last;
} mb_t;

typedef struct model {
    mb_t b[CAP]; /* most recent first */
    int n;
    uint64_t now, rng;
    kvr_sessions_stats_t st;
} model_t;

static unsigned below(model_t *m, unsigned n)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return (unsigned)(m->rng % n);
}

static int mfind(const model_t *m, int id)
{
    for (int i = 0; i < m->n; i++)
        if (m->b[i].id == id)
            return i;
    return -1;
}

static void mremove(model_t *m, int i)
{
    memmove(&m->b[i], &m->b[i + 1], (size_t)(m->n - i - 1) * sizeof m->b[0]);
    m->n--;
}

static bool fresh(const model_t *m, const mb_t *b) { return m->now < b->last + TTL; }

static void mbind(model_t *m, int id, kvr_worker_t w)
{
    int i = mfind(m, id);
    mb_t b = {id, w, m->now};
    if (i >= 0) {
        mb_t old = m->b[i];
        bool same = old.w.worker_id == w.worker_id && old.w.dp_rank == w.dp_rank;
        if (same && fresh(m, &old))
            m->st.hits++;
        else if (fresh(m, &old))
            m->st.rebinds++;
        else
            m->st.binds++;
        if (old.last > b.last)
            b.last = old.last;
        mremove(m, i);
    } else {
        m->st.binds++;
        if (m->n == CAP) {
            m->n--; /* the least recently used */
            m->st.evicted++;
        }
    }
    memmove(&m->b[1], &m->b[0], (size_t)m->n * sizeof m->b[0]);
    m->b[0] = b;
    m->n++;
}

static int run_seed(unsigned long seed, int steps)
{
    kvr_sessions_config_t c = {.ttl_ms = TTL, .max_sessions = CAP};
    int rc;
    kvr_sessions_t *s = kvr_sessions_new(&c, &rc);
    model_t m = {.rng = seed * 0x9E3779B97F4A7C15u + 1};
    char id[16];
    int failed = 0;
    for (int step = 0; step < steps && !failed; step++) {
        m.now += below(&m, 4);
        int k = (int)below(&m, N_IDS);
        int len = snprintf(id, sizeof id, "s%d", k);
        unsigned op = below(&m, 10);
        if (op < 5) {
            kvr_worker_t w = {below(&m, 4), below(&m, 2)};
            mbind(&m, k, w);
            failed |= kvr_sessions_bind(s, id, (size_t)len, w, m.now) != KVR_OK;
        } else if (op < 8) {
            kvr_worker_t got, want = {0, 0};
            int i = mfind(&m, k);
            bool have = i >= 0 && fresh(&m, &m.b[i]);
            if (have)
                want = m.b[i].w;
            bool r = kvr_sessions_lookup(s, id, (size_t)len, m.now, &got);
            failed |= r != have ||
                      (have && (got.worker_id != want.worker_id || got.dp_rank != want.dp_rank));
        } else if (op < 9) {
            int i = mfind(&m, k);
            if (i >= 0) {
                mremove(&m, i);
                m.st.closed++;
            }
            failed |= kvr_sessions_close(s, id, (size_t)len) != (i >= 0);
        } else {
            while (m.n > 0 && !fresh(&m, &m.b[m.n - 1])) {
                m.n--;
                m.st.expired++;
            }
            kvr_sessions_expire(s, m.now);
        }
        kvr_sessions_stats_t ss;
        kvr_sessions_stats(s, &ss);
        m.st.live = (uint64_t)m.n;
        failed |= memcmp(&ss, &m.st, sizeof ss) != 0;
        char msg[200];
        if (kvr_sessions_verify(s, msg, sizeof msg) != KVR_OK) {
            printf("seed %lu step %d: %s\n", seed, step, msg);
            failed = 1;
        }
        if (failed)
            printf("seed %lu step %d: op %u id %d disagrees with the model\n", seed, step, op, k);
    }
    kvr_sessions_free(s);
    return failed;
}

static void test_model(void **st)
{
    (void)st;
    kvr_model_plan_t plan = {
        .seeds = 40, .seeds_asan = 8, .steps = 4000, .steps_one = 100000, .max_failures = 3};
    assert_int_equal(kvr_model_drive(&plan, run_seed), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_lookup_expire_close),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

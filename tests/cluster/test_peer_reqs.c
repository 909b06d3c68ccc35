/*
 * test_peer_reqs.c: the table of peers' requests, against a model (an array of live ids):
 * random puts, takes, per-origin takes and sweeps keep the same contents as the model, the
 * right handles are handed out, and kvr_peer_reqs_verify holds after every step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/peer_reqs.h"

#define N_IDS 2000

typedef struct model {
    bool live[N_IDS];
    uint64_t origin[N_IDS];
    kvr_req_handle_t h[N_IDS];
    bool gone[N_IDS]; /* the tracker freed it by itself: the sweep may drop it */
} model_t;

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static size_t id_of(size_t i, char *buf) { return (size_t)snprintf(buf, 32, "req-%zu", i); }

static model_t *g_model;
static size_t g_told;

static void told(void *arg, kvr_req_handle_t h)
{
    (void)arg;
    size_t i = (size_t)(h >> 8);
    assert_true(i < N_IDS && g_model->live[i] && g_model->h[i] == h);
    g_model->live[i] = false;
    g_told++;
}

static bool live_fn(void *arg, kvr_req_handle_t h)
{
    (void)arg;
    return !g_model->gone[(size_t)(h >> 8)];
}

static void check_same(kvr_peer_reqs_t *t, const model_t *m)
{
    char msg[200] = "";
    assert_int_equal(kvr_peer_reqs_verify(t, msg, sizeof msg), KVR_OK);
    size_t n = 0;
    char id[32];
    for (size_t i = 0; i < N_IDS; i++) {
        uint64_t o = 0;
        kvr_req_handle_t hh = KVR_REQ_HANDLE_NONE;
        bool has = kvr_peer_reqs_get(t, id, id_of(i, id), &o, &hh);
        assert_int_equal(has, m->live[i]);
        if (has)
            assert_true(o == m->origin[i] && hh == m->h[i]);
        n += m->live[i];
    }
    assert_int_equal(kvr_peer_reqs_count(t), n);
    for (uint64_t o = 1; o <= 5; o++) { /* each origin's count, as the model has it */
        size_t want = 0;
        for (size_t i = 0; i < N_IDS; i++)
            want += m->live[i] && m->origin[i] == o;
        assert_int_equal(kvr_peer_reqs_origin_count(t, o), want);
    }
}

/* At most KVR_PEER_REQS_MAX_ORIGINS origins hold entries: one more is refused with nothing
 * changed, and a slot frees once an origin's last entry goes (also when replaced). */
static void origin_cap(void **state)
{
    (void)state;
    kvr_peer_reqs_t *t = kvr_peer_reqs_new(7);
    char id[32];
    for (size_t o = 1; o <= KVR_PEER_REQS_MAX_ORIGINS; o++)
        assert_int_equal(kvr_peer_reqs_put(t, id, id_of(o, id), o, o << 8 | 1), KVR_OK);
    assert_int_equal(kvr_peer_reqs_origins(t), KVR_PEER_REQS_MAX_ORIGINS);
    size_t extra = id_of(100000, id);
    assert_int_equal(kvr_peer_reqs_put(t, id, extra, 9999, 1ull << 40), KVR_EFULL);
    assert_false(kvr_peer_reqs_get(t, id, extra, NULL, NULL));
    assert_int_equal(kvr_peer_reqs_count(t), KVR_PEER_REQS_MAX_ORIGINS);
    /* an existing origin still books more */
    assert_int_equal(kvr_peer_reqs_put(t, id, extra, 3, 1ull << 40), KVR_OK);
    assert_int_equal(kvr_peer_reqs_origin_count(t, 3), 2);
    /* replacing an entry's origin by a new one while full: refused, unchanged */
    assert_int_equal(kvr_peer_reqs_put(t, id, extra, 9999, 1ull << 40), KVR_EFULL);
    assert_int_equal(kvr_peer_reqs_origin_count(t, 3), 2);
    /* origin 1's only entry goes: its slot is free for a new origin */
    assert_true(kvr_peer_reqs_take(t, id, id_of(1, id), NULL, NULL));
    assert_int_equal(kvr_peer_reqs_origin_count(t, 1), 0);
    extra = id_of(100000, id);
    assert_int_equal(kvr_peer_reqs_put(t, id, extra, 9999, 1ull << 40), KVR_OK);
    assert_int_equal(kvr_peer_reqs_origin_count(t, 9999), 1);
    assert_int_equal(kvr_peer_reqs_origin_count(t, 3), 1);
    /* take_from removes only the named origin's entry */
    extra = id_of(100000, id);
    kvr_req_handle_t got = KVR_REQ_HANDLE_NONE;
    assert_false(kvr_peer_reqs_take_from(t, id, extra, 3, &got));
    assert_true(kvr_peer_reqs_get(t, id, extra, NULL, NULL));
    assert_true(kvr_peer_reqs_take_from(t, id, extra, 9999, &got));
    assert_true(got == (1ull << 40) && !kvr_peer_reqs_get(t, id, extra, NULL, NULL));
    assert_int_equal(kvr_peer_reqs_origin_count(t, 9999), 0);
    char msg[200] = "";
    assert_int_equal(kvr_peer_reqs_verify(t, msg, sizeof msg), KVR_OK);
    kvr_peer_reqs_free(t);
}

static void model_based(void **state)
{
    (void)state;
    model_t *m = calloc(1, sizeof *m);
    g_model = m;
    kvr_peer_reqs_t *t = kvr_peer_reqs_new(42);
    assert_non_null(t);
    char id[32];
    for (int step = 0; step < 20000; step++) {
        size_t i = next_rand() % N_IDS;
        size_t len = id_of(i, id);
        switch (next_rand() % 8) {
        case 0: case 1: case 2: case 3: { /* put (or replace) */
            uint64_t origin = 1 + next_rand() % 5;
            kvr_req_handle_t h = (kvr_req_handle_t)i << 8 | (1 + next_rand() % 255);
            assert_int_equal(kvr_peer_reqs_put(t, id, len, origin, h), KVR_OK);
            m->live[i] = true;
            m->gone[i] = false;
            m->origin[i] = origin;
            m->h[i] = h;
            break;
        }
        case 4: case 5: { /* take */
            uint64_t o;
            kvr_req_handle_t h;
            bool had = kvr_peer_reqs_take(t, id, len, &o, &h);
            assert_int_equal(had, m->live[i]);
            if (had)
                assert_true(o == m->origin[i] && h == m->h[i]);
            m->live[i] = false;
            break;
        }
        case 6: { /* the tracker frees it by itself; a sweep slice runs */
            m->gone[i] = true;
            size_t before = kvr_peer_reqs_count(t);
            size_t swept = kvr_peer_reqs_sweep(t, live_fn, NULL, 512);
            assert_int_equal(kvr_peer_reqs_count(t), before - swept);
            for (size_t k = 0; k < N_IDS; k++) /* what the sweep dropped was gone */
                if (m->live[k] && !kvr_peer_reqs_get(t, id, id_of(k, id), NULL, NULL)) {
                    assert_true(m->gone[k]);
                    m->live[k] = false;
                }
            break;
        }
        default: { /* an origin goes */
            if (next_rand() % 20 != 0)
                break;
            uint64_t origin = 1 + next_rand() % 5;
            size_t want = 0;
            for (size_t k = 0; k < N_IDS; k++)
                want += m->live[k] && m->origin[k] == origin;
            int st;
            g_told = 0;
            size_t n = kvr_peer_reqs_take_origin(t, origin, told, NULL, &st);
            assert_int_equal(st, KVR_OK);
            assert_int_equal(n, want);
            assert_int_equal(g_told, want);
            break;
        }
        }
        if (step % 500 == 0)
            check_same(t, m);
    }
    check_same(t, m);
    int st;
    g_told = 0;
    size_t left = kvr_peer_reqs_count(t);
    assert_int_equal(kvr_peer_reqs_take_origin(t, 0, told, NULL, &st), left); /* 0 = all */
    assert_int_equal(kvr_peer_reqs_count(t), 0);
    assert_int_equal(kvr_peer_reqs_put(t, "x", 1, 1, KVR_REQ_HANDLE_NONE), KVR_EINVAL);
    kvr_peer_reqs_free(t);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(model_based),
                                       cmocka_unit_test(origin_cap)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

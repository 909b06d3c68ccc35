/*
 * test_evlink.c: the simulator's event link (sim/evlink.c): delay and jitter bounds, in-order
 * delivery per worker, losses brought back by replay and holding back the batches behind them,
 * batches copied (the caller's buffers are reused), determinism per seed, and its settings
 * checked with the flag named.
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

#include "sim/evlink.h"
#include "kvrouter.h"

static kvr_evlink_t *mk(uint32_t workers, double delay, double jitter, double loss, double replay,
                        uint64_t seed)
{
    kvr_evlink_config_t c = {delay, jitter, loss, replay, seed};
    int st;
    kvr_evlink_t *l = kvr_evlink_new(workers, &c, &st, NULL);
    assert_non_null(l);
    return l;
}

static void verified(const kvr_evlink_t *l)
{
    char msg[200] = "";
    if (kvr_evlink_verify(l, msg, sizeof msg) != KVR_OK)
        fail_msg("%s", msg);
}

static void test_config(void **s)
{
    (void)s;
    struct {
        kvr_evlink_config_t c;
        const char *flag;
    } bad[] = {
        {{-1, 0, 0, 0, 1}, "event-delay-ms"},
        {{NAN, 0, 0, 0, 1}, "event-delay-ms"},
        {{10, 11, 0, 0, 1}, "event-jitter-ms"},
        {{10, -1, 0, 0, 1}, "event-jitter-ms"},
        {{0, 0, 1, 0, 1}, "event-loss"},
        {{0, 0, -0.1, 0, 1}, "event-loss"},
        {{0, 0, 0.1, INFINITY, 1}, "event-replay-ms"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *why = kvr_evlink_config_check(&bad[i].c);
        assert_non_null(why);
        assert_non_null(strstr(why, bad[i].flag));
        int st;
        const char *field;
        assert_null(kvr_evlink_new(2, &bad[i].c, &st, &field));
        assert_int_equal(st, KVR_EINVAL);
        assert_ptr_equal(field, why);
    }
    kvr_evlink_config_t off = {0, 0, 0, 1000, 1}, on = {0, 0, 0.01, 1000, 1};
    assert_false(kvr_evlink_config_active(&off));
    assert_true(kvr_evlink_config_active(&on));
    assert_null(kvr_evlink_config_check(&on));
}

/* Delay D with jitter J: each batch arrives within [pub + D - J, pub + D + J], or later only
 * to stay behind the batch before it; batches come out in publication order, copied. */
static void test_delay_and_order(void **s)
{
    (void)s;
    kvr_evlink_t *l = mk(2, 10, 5, 0, 1000, 7);
    kvr_block_t blocks[3];
    uint64_t removed[2];
    double at[400];
    int held = 0;
    for (int i = 0; i < 400; i++) {
        kvr_event_t e = {.worker = {(uint64_t)(i % 2), 0}};
        if (i % 3 == 0) {
            e.kind = KVR_EV_REMOVED;
            removed[0] = (uint64_t)i;
            removed[1] = (uint64_t)i + 1000;
            e.removed = removed;
            e.n_removed = 2;
        } else {
            e.kind = KVR_EV_STORED;
            for (int k = 0; k < 3; k++)
                blocks[k] =
                    (kvr_block_t){.ext = (uint64_t)i * 10 + (uint64_t)k, .lbh = (uint64_t)k};
            e.blocks = blocks;
            e.n_blocks = 3;
        }
        bool first;
        double pub = i * 1.0; /* a batch a millisecond, alternating workers */
        assert_int_equal(kvr_evlink_push(l, (uint32_t)(i % 2), pub, &e, &at[i], &first), KVR_OK);
        assert_int_equal(first, i < 2);
        assert_true(at[i] >= pub + 5 - 1e-9 && at[i] <= pub + 15 + 1e-9);
        if (i >= 2) {
            assert_true(at[i] >= at[i - 2]);
            held += at[i] == at[i - 2]; /* held back: as late as the one before */
        }
        memset(blocks, 0xff, sizeof blocks); /* the caller reuses its buffers */
        memset(removed, 0xff, sizeof removed);
    }
    assert_true(held > 20); /* jitter of +-5 ms on batches 2 ms apart: some were held back */
    verified(l);
    for (uint32_t w = 0; w < 2; w++) {
        double next = 0;
        for (int i = (int)w; i < 400; i += 2) {
            kvr_event_t e;
            assert_int_equal(kvr_evlink_pop(l, w, &e, &next), KVR_OK);
            assert_int_equal(e.worker.worker_id, w);
            if (i % 3 == 0) {
                assert_int_equal(e.kind, KVR_EV_REMOVED);
                assert_int_equal(e.n_removed, 2);
                assert_true(e.removed[0] == (uint64_t)i && e.removed[1] == (uint64_t)i + 1000);
            } else {
                assert_int_equal(e.kind, KVR_EV_STORED);
                assert_int_equal(e.n_blocks, 3);
                assert_true(e.blocks[2].ext == (uint64_t)i * 10 + 2);
            }
            if (i + 2 < 400)
                assert_true(next == at[i + 2]);
        }
        assert_true(isinf(next));
        kvr_event_t e;
        assert_int_equal(kvr_evlink_pop(l, w, &e, &next), KVR_ENOTFOUND);
    }
    kvr_evlink_stats_t st;
    kvr_evlink_stats(l, &st);
    assert_int_equal(st.batches, 400);
    assert_int_equal(st.lost, 0);
    kvr_evlink_free(l);
}

/* A lost batch arrives replay_ms after it was published; the batches behind it wait for it;
 * about the given share is lost; the same seed loses the same batches. */
static void test_loss_and_replay(void **s)
{
    (void)s;
    double at[2][1000];
    uint64_t lost[2];
    for (int run = 0; run < 2; run++) {
        kvr_evlink_t *l = mk(1, 0, 0, 0.2, 500, 99);
        for (int i = 0; i < 1000; i++) {
            kvr_event_t e = {.kind = KVR_EV_CLEARED};
            bool first;
            double pub = i * 10.0;
            assert_int_equal(kvr_evlink_push(l, 0, pub, &e, &at[run][i], &first), KVR_OK);
            assert_true(at[run][i] == pub || at[run][i] >= pub + 500 - 1e-9 ||
                        (i > 0 && at[run][i] == at[run][i - 1]));
            assert_true(i == 0 || at[run][i] >= at[run][i - 1]);
        }
        verified(l);
        kvr_evlink_stats_t st;
        kvr_evlink_stats(l, &st);
        lost[run] = st.lost;
        kvr_evlink_free(l);
    }
    assert_true(lost[0] > 120 && lost[0] < 280); /* 200 expected, +-5 sigma */
    assert_int_equal(lost[0], lost[1]);
    assert_memory_equal(at[0], at[1], sizeof at[0]);
    /* a lost batch and the ones published within its replay window arrive together */
    int held = 0;
    for (int i = 1; i < 1000; i++)
        held += at[0][i] == at[0][i - 1];
    assert_true(held > 500);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_delay_and_order),
        cmocka_unit_test(test_loss_and_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

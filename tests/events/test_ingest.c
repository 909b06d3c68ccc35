/*
 * test_ingest.c: the ingest thread's pieces that need no engine: data-parallel rank addresses
 * (vLLM and SGLang put rank r at base port + r, and ipc/inproc names get "_dp<r>"), and
 * commands before and after the thread starts (subscribe validation, remove, drop, dump).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "events/ingest.h"

static void test_rank_addresses(void **s)
{
    (void)s;
    char out[128];
    assert_int_equal(kvr_ingest_rank_address("tcp://127.0.0.1:5557", 0, out, sizeof out), KVR_OK);
    assert_string_equal(out, "tcp://127.0.0.1:5557");
    assert_int_equal(kvr_ingest_rank_address("tcp://127.0.0.1:5557", 3, out, sizeof out), KVR_OK);
    assert_string_equal(out, "tcp://127.0.0.1:5560");
    assert_int_equal(kvr_ingest_rank_address("tcp://[::1]:6000", 1, out, sizeof out), KVR_OK);
    assert_string_equal(out, "tcp://[::1]:6001");
    assert_int_equal(kvr_ingest_rank_address("ipc:///tmp/kv", 2, out, sizeof out), KVR_OK);
    assert_string_equal(out, "ipc:///tmp/kv_dp2");
    /* a port that would overflow, or no port to add to */
    assert_int_equal(kvr_ingest_rank_address("tcp://h:65535", 1, out, sizeof out), KVR_EINVAL);
    assert_int_equal(kvr_ingest_rank_address("tcp://h", 1, out, sizeof out), KVR_EINVAL);
    assert_int_equal(kvr_ingest_rank_address("tcp://h:5557", 1, out, 8), KVR_ETOOBIG);
}

static int count_events(void *ud, const kvr_event_t *ev)
{
    (void)ev;
    (*(int *)ud)++;
    return 0;
}

static void test_commands(void **s)
{
    (void)s;
    kvr_index_config_t ic = {.sync = KVR_SYNC_RCU};
    int st;
    kvr_index_t *ix = kvr_index_new(&ic, &st);
    assert_non_null(ix);
    kvr_ingest_config_t gc = {.block_size = 16, .replay_timeout_ms = 100};
    kvr_ingest_t *g = kvr_ingest_new(ix, &gc, &st);
    assert_non_null(g);
    kvr_worker_spec_t w;
    char err[200];
    assert_int_equal(kvr_worker_spec_parse("id=3,events=tcp://127.0.0.1:1,dp_size=2", &w, err,
                                           sizeof err),
                     KVR_OK);
    /* before the thread runs, commands run on the caller's thread */
    assert_int_equal(kvr_ingest_subscribe(g, &w, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_ingest_start(g), KVR_OK);
    /* a second subscription of the same ranks is refused with a reason */
    assert_int_equal(kvr_ingest_subscribe(g, &w, err, sizeof err), KVR_EEXIST);
    assert_non_null(strstr(err, "already subscribed"));
    kvr_worker_spec_t bad;
    assert_int_equal(kvr_worker_spec_parse("id=4,events=bogus://x", &bad, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_ingest_subscribe(g, &bad, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "bogus://x"));
    /* the index is written on the ingest thread only: a dump goes through it */
    int n = 0;
    assert_int_equal(kvr_ingest_dump(g, count_events, &n), KVR_OK);
    assert_int_equal(n, 0);
    kvr_rank_status_t rs;
    assert_int_equal(kvr_ingest_rank_status(g, (kvr_worker_t){3, 1}, &rs), KVR_OK);
    assert_int_equal(rs.state, KVR_RANK_NO_EVENTS);
    assert_int_equal(kvr_ingest_drop_state(g, 3), KVR_OK);
    assert_int_equal(kvr_ingest_remove_worker(g, 3), KVR_OK);
    assert_int_equal(kvr_ingest_rank_status(g, (kvr_worker_t){3, 1}, &rs), KVR_ENOTFOUND);
    kvr_ingest_free(g);
    kvr_index_free(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_addresses),
        cmocka_unit_test(test_commands),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

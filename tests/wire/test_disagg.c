/*
 * test_disagg.c: the disaggregation fields on the wire (wire/disagg.c): vLLM's
 * kv_transfer_params in requests and prefill answers, SGLang's bootstrap triple, and the
 * bootstrap room rule.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/disagg.h"

static int parse(const char *body, kvr_disagg_req_t *r, char *err)
{
    return kvr_disagg_parse_req(body, strlen(body), r, err, 200);
}

/* What vLLM's proxy sends a prefill worker, and what the decode worker then gets. */
static void test_pull_fields(void **s)
{
    (void)s;
    kvr_disagg_req_t r;
    char err[200];
    assert_int_equal(parse("{\"prompt\":\"hi\",\"kv_transfer_params\":{\"do_remote_decode\":true,"
                           "\"do_remote_prefill\":false,\"remote_engine_id\":null,"
                           "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}}",
                           &r, err),
                     KVR_OK);
    assert_int_equal(r.kvt, KVR_KVT_OBJECT);
    assert_true(r.do_remote_decode);
    assert_false(r.do_remote_prefill);
    assert_false(kvr_disagg_pull_ready(&r));
    assert_int_equal(parse("{\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                           "\"do_remote_decode\":false,\"remote_block_ids\":[[1,2,3]],"
                           "\"remote_engine_id\":\"e-1\",\"remote_request_id\":\"cmpl-7-0\","
                           "\"remote_host\":\"10.0.0.2\",\"remote_port\":5600,\"tp_size\":1},"
                           "\"stream\":true}",
                           &r, err),
                     KVR_OK);
    assert_true(kvr_disagg_pull_ready(&r));
    assert_string_equal(r.remote_host, "10.0.0.2");
    assert_int_equal(r.remote_port, 5600);
    assert_string_equal(r.remote_request_id, "cmpl-7-0");
    assert_string_equal(r.remote_engine_id, "e-1");
    /* missing pieces: read, but not ready (the engine recomputes) */
    assert_int_equal(parse("{\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                           "\"remote_host\":\"h\",\"remote_port\":1}}", &r, err), KVR_OK);
    assert_false(kvr_disagg_pull_ready(&r));
    assert_int_equal(parse("{\"kv_transfer_params\":null}", &r, err), KVR_OK);
    assert_int_equal(r.kvt, KVR_KVT_NULL);
    assert_int_equal(parse("{\"prompt\":[1,2]}", &r, err), KVR_OK);
    assert_int_equal(r.kvt, KVR_KVT_ABSENT);
}

static void test_bad_fields_named(void **s)
{
    (void)s;
    kvr_disagg_req_t r;
    char err[200];
    assert_int_equal(parse("{\"kv_transfer_params\":\"x\"}", &r, err), KVR_EINVAL);
    assert_string_equal(err, "kv_transfer_params: not an object or null");
    assert_int_equal(parse("{\"kv_transfer_params\":{\"remote_port\":70000}}", &r, err),
                     KVR_EINVAL);
    assert_non_null(strstr(err, "kv_transfer_params.remote_port"));
    assert_int_equal(r.kvt, KVR_KVT_ABSENT); /* nothing half-read */
    assert_int_equal(parse("{\"kv_transfer_params\":{\"do_remote_prefill\":1}}", &r, err),
                     KVR_EINVAL);
    assert_non_null(strstr(err, "do_remote_prefill: not a boolean"));
    assert_int_equal(parse("{\"kv_transfer_params\":{\"remote_host\":\"a\\\"b\"}}", &r, err),
                     KVR_EINVAL);
    assert_non_null(strstr(err, "remote_host"));
    assert_int_equal(parse("{\"bootstrap_room\":-1}", &r, err), KVR_EINVAL);
    assert_non_null(strstr(err, "bootstrap_room"));
    assert_int_equal(parse("{\"bootstrap_room\":9223372036854775808}", &r, err), KVR_EINVAL);
    assert_int_equal(parse("[1]", &r, err), KVR_EPARSE);
    assert_int_equal(parse("{\"a\":", &r, err), KVR_EPARSE);
    assert_int_equal(parse("", &r, err), KVR_EPARSE);
}

static void test_bootstrap_fields(void **s)
{
    (void)s;
    kvr_disagg_req_t r;
    char err[200];
    assert_int_equal(parse("{\"bootstrap_host\":\"10.1.2.3\",\"bootstrap_port\":8998,"
                           "\"bootstrap_room\":9223372036854775807,\"prompt\":\"x\"}",
                           &r, err),
                     KVR_OK);
    assert_true(r.has_room);
    assert_int_equal(r.bootstrap_room, INT64_MAX);
    assert_int_equal(r.bootstrap_port, 8998);
    assert_string_equal(r.bootstrap_host, "10.1.2.3");
    assert_int_equal(parse("{\"bootstrap_host\":\"h\",\"bootstrap_port\":null,"
                           "\"bootstrap_room\":0}", &r, err), KVR_OK);
    assert_true(r.has_room);
    assert_int_equal(r.bootstrap_port, 0);
}

/* The router's view of a prefill answer: where the parameters are, and whether the answer
 * is already complete (EOS on its one token). */
static void test_answer_scan(void **s)
{
    (void)s;
    kvr_disagg_answer_t a;
    const char *j = "{\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"a\","
                    "\"finish_reason\":\"length\"}],\"kv_transfer_params\":{\"remote_port\":5,"
                    "\"remote_block_ids\":[[1]]},\"usage\":{}}";
    assert_int_equal(kvr_disagg_scan_answer(j, strlen(j), &a), KVR_OK);
    assert_int_equal(a.kvt, KVR_KVT_OBJECT);
    assert_false(a.finish_stop);
    assert_int_equal(a.kvt_len, strlen("{\"remote_port\":5,\"remote_block_ids\":[[1]]}"));
    assert_memory_equal(j + a.kvt_at, "{\"remote_port\":5,", 17);
    j = "{\"choices\":[{\"finish_reason\":\"stop\"}],\"kv_transfer_params\":null}";
    assert_int_equal(kvr_disagg_scan_answer(j, strlen(j), &a), KVR_OK);
    assert_int_equal(a.kvt, KVR_KVT_NULL);
    assert_true(a.finish_stop);
    j = "{\"choices\":[],\"kv_transfer_params\":42}";
    assert_int_equal(kvr_disagg_scan_answer(j, strlen(j), &a), KVR_OK);
    assert_int_equal(a.kvt, KVR_KVT_OTHER);
    j = "{\"kv_transfer_params\":{\"a\":1}";
    assert_int_equal(kvr_disagg_scan_answer(j, strlen(j), &a), KVR_EPARSE);
    assert_int_equal(a.kvt, KVR_KVT_ABSENT);
    j = "{} {}";
    assert_int_equal(kvr_disagg_scan_answer(j, strlen(j), &a), KVR_EPARSE);
}

static void test_read_u64(void **s)
{
    (void)s;
    uint64_t v;
    const char *j = "{\"blocks\":63,\"dp_rank\":0}";
    assert_int_equal(kvr_disagg_read_u64(j, strlen(j), "blocks", &v), KVR_OK);
    assert_int_equal(v, 63);
    assert_int_equal(kvr_disagg_read_u64(j, strlen(j), "other", &v), KVR_ENOTFOUND);
    j = "{\"blocks\":-1}";
    assert_int_equal(kvr_disagg_read_u64(j, strlen(j), "blocks", &v), KVR_EINVAL);
    j = "{\"blocks\":null}";
    assert_int_equal(kvr_disagg_read_u64(j, strlen(j), "blocks", &v), KVR_ENOTFOUND);
    j = "{\"blocks\":1";
    assert_int_equal(kvr_disagg_read_u64(j, strlen(j), "blocks", &v), KVR_EPARSE);
}

/* room mod dp_size is the rank, the room stays in [0, 2^63 - 1], and it is spread. */
static void test_room_rule(void **s)
{
    (void)s;
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (uint32_t dp = 1; dp <= 9; dp++)
        for (uint32_t rank = 0; rank < dp; rank++)
            for (int i = 0; i < 200; i++) {
                x = x * 6364136223846793005u + 1442695040888963407u;
                uint64_t room = kvr_disagg_room(x, dp, rank);
                assert_true(room <= (uint64_t)INT64_MAX);
                assert_int_equal(room % dp, rank);
            }
    assert_true(kvr_disagg_room(UINT64_MAX, 7, 6) <= (uint64_t)INT64_MAX);
    assert_int_equal(kvr_disagg_room(UINT64_MAX, 7, 6) % 7, 6);
    assert_int_not_equal(kvr_disagg_room(1, 4, 1), kvr_disagg_room(2, 4, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_fields),      cmocka_unit_test(test_bad_fields_named),
        cmocka_unit_test(test_bootstrap_fields), cmocka_unit_test(test_answer_scan),
        cmocka_unit_test(test_read_u64),         cmocka_unit_test(test_room_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

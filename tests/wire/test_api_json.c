/*
 * test_api_json.c: the JSON API body decoders and encoders (wire/api_json.c).
 *
 * Every body goes through two decoders, one with the fast token path and one without; they
 * must agree on the status, the message and the decoded struct (compared through the
 * canonical encoding). Every accepted body is also re-encoded and decoded again (round trip).
 * Covered: every field of every body kind, defaults, nulls, u64 extremes, each error class
 * with its exact message, unknown keys at any depth, duplicate keys, limits, reuse of one
 * decoder across large and small bodies, and randomised token-array formatting.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"

enum { K_ROUTE, K_OB, K_QUERY, K_LOADS, K_WORKER, K_ROUTER };

typedef union any {
    kvr_api_route_t route;
    kvr_api_output_block_t ob;
    kvr_api_query_t query;
    kvr_api_worker_t worker;
    kvr_api_router_t router;
} any_t;

static kvr_api_decoder_t *fast_d, *slow_d, *rt_d;
static any_t out_fast, out_slow, out_rt;

static int decode(kvr_api_decoder_t *d, int kind, const char *b, size_t n, any_t *o)
{
    switch (kind) {
    case K_ROUTE:
        return kvr_api_decode_route(d, b, n, &o->route);
    case K_OB:
        return kvr_api_decode_output_block(d, b, n, &o->ob);
    case K_QUERY:
        return kvr_api_decode_query(d, b, n, &o->query);
    case K_LOADS:
        return kvr_api_decode_loads(d, b, n, &o->query);
    case K_WORKER:
        return kvr_api_decode_worker(d, b, n, &o->worker);
    default:
        return kvr_api_decode_router(d, b, n, &o->router);
    }
}

static size_t out_size(int kind)
{
    switch (kind) {
    case K_ROUTE:
        return sizeof(kvr_api_route_t);
    case K_OB:
        return sizeof(kvr_api_output_block_t);
    case K_QUERY:
    case K_LOADS:
        return sizeof(kvr_api_query_t);
    case K_WORKER:
        return sizeof(kvr_api_worker_t);
    default:
        return sizeof(kvr_api_router_t);
    }
}

/* The canonical encoding of a decoded struct (malloc'd). */
static char *canon(int kind, const any_t *o)
{
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    switch (kind) {
    case K_ROUTE:
        kvr_api_encode_route(&w, &o->route);
        break;
    case K_OB:
        kvr_api_encode_output_block(&w, &o->ob);
        break;
    case K_QUERY:
    case K_LOADS:
        kvr_api_encode_query(&w, &o->query);
        break;
    case K_WORKER:
        kvr_api_encode_worker(&w, &o->worker);
        break;
    default:
        kvr_api_encode_router(&w, &o->router);
        break;
    }
    const char *data;
    size_t len;
    assert_int_equal(kvr_json_writer_finish(&w, &data, &len), KVR_OK);
    char *copy = malloc(len + 1);
    assert_non_null(copy);
    memcpy(copy, data, len + 1);
    kvr_json_writer_deinit(&w);
    return copy;
}

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return false;
    return true;
}

/* Decodes with both decoders; they must agree. Accepted bodies must round-trip. */
static int check_n(int kind, const char *body, size_t len)
{
    int a = decode(fast_d, kind, body, len, &out_fast);
    int b = decode(slow_d, kind, body, len, &out_slow);
    if (a != b || strcmp(kvr_api_decoder_error(fast_d), kvr_api_decoder_error(slow_d)) != 0)
        fail_msg("fast/slow disagree on %.200s\n  fast %d '%s'\n  slow %d '%s'", body, a,
                 kvr_api_decoder_error(fast_d), b, kvr_api_decoder_error(slow_d));
    if (a != KVR_OK) {
        assert_true(all_zero(&out_fast, out_size(kind)));
        assert_true(all_zero(&out_slow, out_size(kind)));
        const char *m = kvr_api_decoder_error(fast_d);
        assert_true(m[0] != '\0');
        for (const char *c = m; *c; c++)  /* fit for a JSON string verbatim */
            assert_true(*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\');
        return a;
    }
    assert_string_equal(kvr_api_decoder_error(fast_d), "");
    char *x = canon(kind, &out_fast), *y = canon(kind, &out_slow);
    if (strcmp(x, y) != 0)
        fail_msg("fast/slow decode differently:\n  %.300s\n  %.300s", x, y);
    int c = decode(rt_d, kind, x, strlen(x), &out_rt);
    if (c != KVR_OK)
        fail_msg("round trip of %.300s: %s", x, kvr_api_decoder_error(rt_d));
    char *z = canon(kind, &out_rt);
    assert_string_equal(x, z);
    free(x);
    free(y);
    free(z);
    return a;
}

static int check(int kind, const char *body)
{
    return check_n(kind, body, strlen(body));
}

static any_t *ok(int kind, const char *body)
{
    int st = check(kind, body);
    if (st != KVR_OK)
        fail_msg("%.300s: %d %s", body, st, kvr_api_decoder_error(fast_d));
    return &out_fast;
}

static void err(int kind, const char *body, int status, const char *msg)
{
    int st = check(kind, body);
    if (st != status || strcmp(kvr_api_decoder_error(fast_d), msg) != 0)
        fail_msg("%.300s\n  got %d '%s'\n  expected %d '%s'", body, st,
                 kvr_api_decoder_error(fast_d), status, msg);
}

/* Starts with prefix (for yajl's wording after ours). */
static void err_prefix(int kind, const char *body, const char *prefix)
{
    int st = check(kind, body);
    if (st != KVR_EPARSE || strncmp(kvr_api_decoder_error(fast_d), prefix, strlen(prefix)) != 0)
        fail_msg("%.300s: got %d '%s', expected prefix '%s'", body, st,
                 kvr_api_decoder_error(fast_d), prefix);
}

static int setup(void **state)
{
    (void)state;
    kvr_api_options_t slow = {KVR_API_MAX_TOKENS, KVR_API_MAX_ALLOWED_IDS, true};
    fast_d = kvr_api_decoder_new(NULL);
    slow_d = kvr_api_decoder_new(&slow);
    rt_d = kvr_api_decoder_new(NULL);
    return fast_d != NULL && slow_d != NULL && rt_d != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvr_api_decoder_free(fast_d);
    kvr_api_decoder_free(slow_d);
    kvr_api_decoder_free(rt_d);
    kvr_api_decoder_free(NULL);
    return 0;
}

/* ---- /v1/route ------------------------------------------------------------------------------ */

static void test_route_minimal(void **state)
{
    (void)state;
    const kvr_api_route_t *r = &ok(K_ROUTE, "{\"tokens\":[0,1,2,4294967295]}")->route;
    assert_int_equal(r->n_tokens, 4);
    assert_int_equal(r->tokens[0], 0);
    assert_int_equal(r->tokens[2], 2);
    assert_int_equal(r->tokens[3], 4294967295u);
    assert_false(r->has_request_id);
    assert_string_equal(r->request_id, "");
    assert_true(r->update_state);
    assert_false(r->disagg);
    assert_null(r->lora_name);
    assert_int_equal(r->lora_name_len, 0);
    assert_null(r->cache_namespace);
    assert_false(r->has_allowed);
    assert_null(r->allowed_ids);
    assert_false(r->has_pinned);
    assert_true(r->priority_jump == 0.0);
    assert_false(r->has_expected_output_tokens);
    assert_int_equal(r->n_required, 0);
    assert_null(r->required_taints);
    assert_int_equal(r->n_preferred, 0);
    assert_null(r->preferred_taints);
    assert_false(r->has_override);
    assert_false(r->ovr.has_temperature);
    assert_false(r->has_assume_kv_reuse);
    assert_false(r->has_track_prefill_tokens);

    kvr_api_stats_t st;
    kvr_api_decoder_stats(fast_d, &st);
    assert_true(st.bodies >= 1 && st.fast_path >= 1 && st.fallbacks == 0);
    kvr_api_decoder_stats(slow_d, &st);
    assert_true(st.bodies >= 1 && st.fast_path == 0 && st.fallbacks == 0 && st.errors == 0);

    r = &ok(K_ROUTE, "{\"tokens\":[]}")->route;
    assert_int_equal(r->n_tokens, 0);
    assert_null(r->tokens);
    r = &ok(K_ROUTE, " \n{ \"tokens\" : [ 7 ] } \t\r\n")->route;
    assert_int_equal(r->n_tokens, 1);
    assert_int_equal(r->tokens[0], 7);
}

static void test_route_all_fields(void **state)
{
    (void)state;
    const kvr_api_route_t *r = &ok(K_ROUTE,
        "{\"tokens\":[5,6,7],\"request_id\":\"req-1\",\"update_state\":false,"
        "\"lora_name\":\"adapter-a\",\"cache_namespace\":\"tenant\\/x\","
        "\"allowed_worker_ids\":[9,3,18446744073709551615,3],"
        "\"pinned_worker\":{\"worker_id\":12,\"dp_rank\":4294967295},"
        "\"priority_jump\":-1.5,\"expected_output_tokens\":4294967295,"
        "\"routing_constraints\":{\"required_taints\":[\"gpu\",\"h100\"],"
        "\"preferred_taints\":{\"fast\":0.75,\"slow\":-2,\"zero\":0}},"
        "\"config_override\":{\"overlap_score_credit\":2.5,\"prefill_load_scale\":0,"
        "\"router_temperature\":0.5,\"shared_cache_multiplier\":1,\"overlap_score_weight\":3,"
        "\"assume_kv_reuse\":false,\"track_prefill_tokens\":true}}")->route;
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[1], 6);
    assert_true(r->has_request_id);
    assert_string_equal(r->request_id, "req-1");
    assert_false(r->update_state);
    assert_int_equal(r->lora_name_len, 9);
    assert_string_equal(r->lora_name, "adapter-a");
    assert_int_equal(r->cache_namespace_len, 8);
    assert_string_equal(r->cache_namespace, "tenant/x");
    assert_true(r->has_allowed);
    assert_int_equal(r->n_allowed, 4);  /* sorted, repeats kept */
    assert_true(r->allowed_ids[0] == 3 && r->allowed_ids[1] == 3 && r->allowed_ids[2] == 9);
    assert_true(r->allowed_ids[3] == UINT64_MAX);
    assert_true(r->has_pinned);
    assert_true(r->pinned.worker_id == 12);
    assert_int_equal(r->pinned.dp_rank, 4294967295u);
    assert_true(r->priority_jump == -1.5);
    assert_true(r->has_expected_output_tokens);
    assert_int_equal(r->expected_output_tokens, 4294967295u);
    assert_int_equal(r->n_required, 2);
    assert_string_equal(r->required_taints[0], "gpu");
    assert_string_equal(r->required_taints[1], "h100");
    assert_int_equal(r->n_preferred, 3);
    assert_string_equal(r->preferred_taints[0].taint, "fast");
    assert_true(r->preferred_taints[0].weight == 0.75);
    assert_string_equal(r->preferred_taints[1].taint, "slow");
    assert_true(r->preferred_taints[1].weight == -2);
    assert_true(r->preferred_taints[2].weight == 0);
    assert_true(r->has_override);
    assert_true(r->ovr.has_overlap_score_credit && r->ovr.overlap_score_credit == 2.5);
    assert_true(r->ovr.has_prefill_load_scale && r->ovr.prefill_load_scale == 0);
    assert_true(r->ovr.has_temperature && r->ovr.temperature == 0.5);
    assert_true(r->ovr.has_shared_cache_multiplier && r->ovr.shared_cache_multiplier == 1);
    assert_true(r->ovr.has_overlap_score_weight && r->ovr.overlap_score_weight == 3);
    assert_true(r->has_assume_kv_reuse && !r->assume_kv_reuse);
    assert_true(r->has_track_prefill_tokens && r->track_prefill_tokens);

    /* block_mm_infos: the blocks with objects, their hashes (u64, or identifiers: a 64-hex
     * digest gives its first 16 digits, another string its XXH3 with seed 0); offsets and
     * other keys are not hashed; mm_routing_info carries the same list */
    r = &ok(K_ROUTE, "{\"tokens\":[1,2,3],\"block_mm_infos\":[null,{\"mm_objects\":["
                     "{\"mm_hash\":42,\"offsets\":[[0,3]]},{\"mm_hash\":\"img-a\"}],\"x\":1},"
                     "{\"mm_objects\":[]},{\"mm_objects\":[{\"mm_hash\":\"0123456789abcdef"
                     "0123456789abcdef0123456789abcdef0123456789abcdef\"}]}]}")
             ->route;
    assert_int_equal(r->n_mm, 2);
    assert_int_equal(r->mm[0].block, 1);
    assert_int_equal(r->mm[0].n_hashes, 2);
    assert_true(r->mm[0].hashes[0] == 42 &&
                r->mm[0].hashes[1] == XXH3_64bits_withSeed("img-a", 5, 0));
    assert_int_equal(r->mm[1].block, 3);
    assert_true(r->mm[1].n_hashes == 1 && r->mm[1].hashes[0] == UINT64_C(0x0123456789abcdef));
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"mm_routing_info\":{\"block_mm_infos\":[{\"mm_objects\":"
                     "[{\"mm_hash\":7}]}]}}")
             ->route;
    assert_true(r->n_mm == 1 && r->mm[0].block == 0 && r->mm[0].hashes[0] == 7);
    err(K_ROUTE, "{\"tokens\":[1],\"block_mm_infos\":[{\"mm_objects\":[{\"mm_hash\":-1}]}]}",
        KVR_EINVAL,
        "block_mm_infos[0]: mm_hash must be an integer in [0, 2^64) or an identifier "
        "string");
    err(K_ROUTE, "{\"tokens\":[1],\"block_mm_infos\":[7]}", KVR_EINVAL,
        "block_mm_infos[0]: must be null or {mm_objects: [{mm_hash}]}");
    err(K_ROUTE,
        "{\"tokens\":[1],\"block_mm_infos\":[],\"mm_routing_info\":{\"block_mm_infos\":[]}}",
        KVR_EINVAL, "block_mm_infos: given twice (top level and mm_routing_info)");
    any_t *ra = ok(K_ROUTER, "{\"method\":\"new\",\"tokens\":[1,2],\"block_mm_infos\":"
                             "[{\"mm_objects\":[{\"mm_hash\":9}]}]}");
    assert_true(ra->router.n_mm == 1 && ra->router.mm[0].hashes[0] == 9);

    /* session_control: an id, "open" by default or "close" */
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"session_control\":{\"session_id\":\"s-1\"}}")->route;
    assert_true(r->session_id != NULL && r->session_id_len == 3 && !r->session_close);
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"session_control\":{\"session_id\":\"s\","
                     "\"action\":\"close\"}}")
             ->route;
    assert_true(r->session_close);
    err(K_ROUTE, "{\"tokens\":[1],\"session_control\":{\"action\":\"open\"}}", KVR_EINVAL,
        "session_control.session_id: missing");
    err(K_ROUTE, "{\"tokens\":[1],\"session_control\":{\"session_id\":\"s\",\"action\":\"x\"}}",
        KVR_EINVAL, "session_control.action: must be open or close");

    /* an empty allow list allows nobody; empty objects set nothing */
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"allowed_worker_ids\":[],\"routing_constraints\":{},"
                     "\"config_override\":{},\"update_state\":true}")->route;
    assert_true(r->has_allowed);
    assert_int_equal(r->n_allowed, 0);
    assert_true(r->has_override);
    assert_false(r->ovr.has_temperature || r->has_assume_kv_reuse);
    assert_true(r->update_state);

    /* key order is free: tokens last */
    r = &ok(K_ROUTE, "{\"request_id\":\"z\",\"pinned_worker\":{\"dp_rank\":1,\"worker_id\":2},"
                     "\"tokens\":[3]}")->route;
    assert_string_equal(r->request_id, "z");
    assert_true(r->pinned.worker_id == 2 && r->pinned.dp_rank == 1);
    assert_int_equal(r->tokens[0], 3);
}

static void test_route_nulls_and_empties(void **state)
{
    (void)state;
    const kvr_api_route_t *r = &ok(K_ROUTE,
        "{\"tokens\":[1],\"request_id\":null,\"update_state\":null,\"lora_name\":null,"
        "\"cache_namespace\":null,\"allowed_worker_ids\":null,\"pinned_worker\":null,"
        "\"priority_jump\":null,\"expected_output_tokens\":null,\"routing_constraints\":null,"
        "\"config_override\":null}")->route;
    assert_false(r->has_request_id);
    assert_true(r->update_state);
    assert_null(r->lora_name);
    assert_null(r->cache_namespace);
    assert_false(r->has_allowed);
    assert_false(r->has_pinned);
    assert_false(r->has_expected_output_tokens);
    assert_false(r->has_override);

    r = &ok(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":null,"
                     "\"preferred_taints\":null},\"config_override\":{\"router_temperature\":"
                     "null,\"assume_kv_reuse\":null,\"overlap_score_weight\":null}}")->route;
    assert_int_equal(r->n_required + r->n_preferred, 0);
    assert_true(r->has_override);
    assert_false(r->ovr.has_temperature || r->ovr.has_overlap_score_weight);
    assert_false(r->has_assume_kv_reuse);

    /* "" names nothing */
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"lora_name\":\"\",\"cache_namespace\":\"\"}")->route;
    assert_null(r->lora_name);
    assert_null(r->cache_namespace);
}

static void test_u64_extremes(void **state)
{
    (void)state;
    const kvr_api_route_t *r = &ok(K_ROUTE,
        "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":18446744073709551615,\"dp_rank\":0}}")
        ->route;
    assert_true(r->pinned.worker_id == UINT64_MAX);
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":0,\"dp_rank\":0}}")->route;
    assert_true(r->pinned.worker_id == 0);
    r = &ok(K_ROUTE, "{\"tokens\":[-0],\"pinned_worker\":{\"worker_id\":-0,\"dp_rank\":0}}")
        ->route;
    assert_true(r->pinned.worker_id == 0 && r->tokens[0] == 0);
    /* 2^53 + 1 stays exact (no double on the way) */
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"allowed_worker_ids\":[9007199254740993,"
                     "18446744073709551614]}")->route;
    assert_true(r->allowed_ids[0] == UINT64_C(9007199254740993));
    assert_true(r->allowed_ids[1] == UINT64_MAX - 1);

    const char *u64msg = "pinned_worker.worker_id: not an integer in [0, 18446744073709551615]";
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":18446744073709551616,"
                 "\"dp_rank\":0}}", KVR_EINVAL, u64msg);
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":-1,\"dp_rank\":0}}",
        KVR_EINVAL, u64msg);
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":1.0,\"dp_rank\":0}}",
        KVR_EINVAL, u64msg);
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":1e3,\"dp_rank\":0}}",
        KVR_EINVAL, u64msg);
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":\"1\",\"dp_rank\":0}}",
        KVR_EINVAL, u64msg);
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":1,\"dp_rank\":4294967296}}",
        KVR_EINVAL, "pinned_worker.dp_rank: not an integer in [0, 4294967295]");
    err(K_ROUTE, "{\"tokens\":[1],\"allowed_worker_ids\":[1,99999999999999999999]}", KVR_EINVAL,
        "allowed_worker_ids[1]: not an integer in [0, 18446744073709551615]");
    err(K_ROUTE, "{\"tokens\":[1],\"allowed_worker_ids\":[1,null]}", KVR_EINVAL,
        "allowed_worker_ids[1]: not an integer in [0, 18446744073709551615]");
    err(K_ROUTE, "{\"tokens\":[1],\"allowed_worker_ids\":[[1]]}", KVR_EINVAL,
        "allowed_worker_ids[0]: not an integer in [0, 18446744073709551615]");
    err(K_ROUTE, "{\"tokens\":[1],\"allowed_worker_ids\":7}", KVR_EINVAL,
        "allowed_worker_ids: must be an array of integers or null");
}

static void test_route_errors(void **state)
{
    (void)state;
    assert_true(ok(K_ROUTE, "{\"tokens\":[1],\"disagg\":true}")->route.disagg);
    assert_false(ok(K_ROUTE, "{\"tokens\":[1],\"disagg\":null}")->route.disagg);
    err(K_ROUTE, "{\"tokens\":[1],\"disagg\":1}", KVR_EINVAL,
        "disagg: must be true, false or null");
    /* tokens */
    const char *t3 = "tokens[3]: not an integer in [0, 4294967295]";
    err(K_ROUTE, "{\"tokens\":[0,1,2,1.5]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,-1]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,4294967296]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,1e2]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,\"3\"]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,null]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,true]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,[3]]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":[0,1,2,{}]}", KVR_EINVAL, t3);
    err(K_ROUTE, "{\"tokens\":\"1 2 3\"}", KVR_EINVAL, "tokens: must be an array of integers");
    err(K_ROUTE, "{\"tokens\":{}}", KVR_EINVAL, "tokens: must be an array of integers");
    err(K_ROUTE, "{}", KVR_EINVAL, "tokens: missing");
    err(K_ROUTE, "{\"request_id\":\"x\"}", KVR_EINVAL, "tokens: missing");
    err(K_ROUTE, "{\"tokens\":null}", KVR_EINVAL, "tokens: must not be null");

    /* other fields: wrong types and ranges */
    err(K_ROUTE, "{\"tokens\":[1],\"update_state\":1}", KVR_EINVAL,
        "update_state: must be true, false or null");
    err(K_ROUTE, "{\"tokens\":[1],\"lora_name\":5}", KVR_EINVAL,
        "lora_name: must be a string or null");
    err(K_ROUTE, "{\"tokens\":[1],\"cache_namespace\":[]}", KVR_EINVAL,
        "cache_namespace: must be a string or null");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":7}", KVR_EINVAL,
        "request_id: must be a string or null");
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":[1,2]}", KVR_EINVAL,
        "pinned_worker: must be an object or null");
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":1}}", KVR_EINVAL,
        "pinned_worker.dp_rank: missing");
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"dp_rank\":0,\"worker_id\":null}}",
        KVR_EINVAL, "pinned_worker.worker_id: must not be null");
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{}}", KVR_EINVAL,
        "pinned_worker.worker_id: missing");
    err(K_ROUTE, "{\"tokens\":[1],\"priority_jump\":\"high\"}", KVR_EINVAL,
        "priority_jump: must be a finite number");
    err(K_ROUTE, "{\"tokens\":[1],\"priority_jump\":1e999}", KVR_EINVAL,
        "priority_jump: must be a finite number");
    err(K_ROUTE, "{\"tokens\":[1],\"expected_output_tokens\":-5}", KVR_EINVAL,
        "expected_output_tokens: not an integer in [0, 4294967295]");
    err(K_ROUTE, "{\"tokens\":[1],\"expected_output_tokens\":12.5}", KVR_EINVAL,
        "expected_output_tokens: not an integer in [0, 4294967295]");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":true}", KVR_EINVAL,
        "routing_constraints: must be an object or null");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":\"x\"}", KVR_EINVAL,
        "config_override: must be an object or null");

    /* config_override ranges */
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"router_temperature\":-0.1}}",
        KVR_EINVAL, "config_override.router_temperature: must be a finite number >= 0");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"router_temperature\":1e400}}",
        KVR_EINVAL, "config_override.router_temperature: must be a finite number >= 0");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"overlap_score_credit\":-1}}",
        KVR_EINVAL, "config_override.overlap_score_credit: must be a finite number >= 0");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"prefill_load_scale\":\"2\"}}",
        KVR_EINVAL, "config_override.prefill_load_scale: must be a finite number >= 0");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"overlap_score_weight\":-3}}",
        KVR_EINVAL, "config_override.overlap_score_weight: must be a finite number >= 0");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"shared_cache_multiplier\":1.0001}}",
        KVR_EINVAL, "config_override.shared_cache_multiplier: must be a number in [0, 1]");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"assume_kv_reuse\":\"yes\"}}",
        KVR_EINVAL, "config_override.assume_kv_reuse: must be true, false or null");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"track_prefill_tokens\":0}}",
        KVR_EINVAL, "config_override.track_prefill_tokens: must be true, false or null");
    /* a huge but finite exponent form is fine; underflow reads as 0 */
    const kvr_api_route_t *r = &ok(K_ROUTE, "{\"tokens\":[1],\"config_override\":{"
        "\"router_temperature\":1e-400,\"prefill_load_scale\":1.7976931348623157e308}}")->route;
    assert_true(r->ovr.temperature == 0);
    assert_true(r->ovr.prefill_load_scale == 1.7976931348623157e308);
}

static void test_strings(void **state)
{
    (void)state;
    char body[4096], s[2100];
    memset(s, 'a', sizeof s);

    /* request_id: 1..256 bytes */
    snprintf(body, sizeof body, "{\"tokens\":[1],\"request_id\":\"%.256s\"}", s);
    const kvr_api_route_t *r = &ok(K_ROUTE, body)->route;
    assert_int_equal(strlen(r->request_id), 256);
    snprintf(body, sizeof body, "{\"tokens\":[1],\"request_id\":\"%.257s\"}", s);
    err(K_ROUTE, body, KVR_EINVAL, "request_id: must be 1 to 256 bytes");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"\"}", KVR_EINVAL,
        "request_id: must be 1 to 256 bytes");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"a\\nb\"}", KVR_EINVAL,
        "request_id: contains a control character");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"a\\u0000b\"}", KVR_EINVAL,
        "request_id: contains a control character");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"a\\u007fb\"}", KVR_EINVAL,
        "request_id: contains a control character");

    /* escapes are decoded, UTF-8 kept */
    r = &ok(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"\\\"q\\\" \\\\ \\u00e9 \xe2\x82\xac\"}")
        ->route;
    assert_string_equal(r->request_id, "\"q\" \\ \xc3\xa9 \xe2\x82\xac");

    /* lora_name / cache_namespace: up to 1024 bytes */
    snprintf(body, sizeof body, "{\"tokens\":[1],\"lora_name\":\"%.1024s\"}", s);
    r = &ok(K_ROUTE, body)->route;
    assert_int_equal(r->lora_name_len, 1024);
    snprintf(body, sizeof body, "{\"tokens\":[1],\"cache_namespace\":\"%.1025s\"}", s);
    err(K_ROUTE, body, KVR_EINVAL, "cache_namespace: longer than 1024 bytes");
    err(K_ROUTE, "{\"tokens\":[1],\"lora_name\":\"\\t\"}", KVR_EINVAL,
        "lora_name: contains a control character");

    /* invalid UTF-8 is a JSON error (yajl validates) */
    err_prefix(K_ROUTE, "{\"tokens\":[1],\"lora_name\":\"\xff\"}", "invalid JSON at byte ");
    /* what yajl lets through: overlong forms, surrogates, > U+10FFFF */
    err(K_ROUTE, "{\"tokens\":[1],\"lora_name\":\"\xc0\xaf\"}", KVR_EINVAL,
        "lora_name: is not valid UTF-8");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"a\xed\xa0\x80\"}", KVR_EINVAL,
        "request_id: is not valid UTF-8");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":"
                 "{\"\xf4\x90\x80\x80\":1}}}", KVR_EINVAL,
        "routing_constraints.preferred_taints: taint '?" "?" "?" "?' is not valid UTF-8");
    /* an unpaired surrogate escape: yajl substitutes '?' */
    assert_string_equal(ok(K_ROUTE, "{\"tokens\":[1],\"lora_name\":\"\\ud800\"}")->route.lora_name,
                        "?");
}

static void test_taints(void **state)
{
    (void)state;
    char body[32768];
    char t128[129];
    memset(t128, 'x', 128);
    t128[128] = '\0';

    /* 64 required taints of 128 bytes each: accepted */
    size_t n = (size_t)snprintf(body, sizeof body,
                                "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":[");
    for (int i = 0; i < 64; i++)
        n += (size_t)snprintf(body + n, sizeof body - n, "%s\"%03d%.125s\"", i ? "," : "", i,
                              t128);
    snprintf(body + n, sizeof body - n, "]}}");
    const kvr_api_route_t *r = &ok(K_ROUTE, body)->route;
    assert_int_equal(r->n_required, 64);
    assert_int_equal(strlen(r->required_taints[63]), 128);
    assert_memory_equal(r->required_taints[63], "063", 3);
    /* 65: too many */
    snprintf(body + n, sizeof body - n, ",\"x\"]}}");
    err(K_ROUTE, body, KVR_ETOOBIG, "routing_constraints.required_taints: more than 64 taints");

    snprintf(body, sizeof body,
             "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":[\"%sy\"]}}", t128);
    err(K_ROUTE, body, KVR_EINVAL, "routing_constraints.required_taints[0]: taint "
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' must be 1 to 128 bytes");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":[\"a\",\"\"]}}",
        KVR_EINVAL, "routing_constraints.required_taints[1]: taint '' must be 1 to 128 bytes");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":[\"a\\nb\"]}}",
        KVR_EINVAL,
        "routing_constraints.required_taints[0]: taint 'a?b' contains a control character");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":[1]}}",
        KVR_EINVAL, "routing_constraints.required_taints[0]: must be a string");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":\"gpu\"}}",
        KVR_EINVAL, "routing_constraints.required_taints: must be an array of strings or null");

    /* preferred taints: 64 accepted, 65 not, duplicates and bad weights rejected */
    n = (size_t)snprintf(body, sizeof body,
                         "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":{");
    for (int i = 0; i < 64; i++)
        n += (size_t)snprintf(body + n, sizeof body - n, "%s\"t%d\":%d.5", i ? "," : "", i, -i);
    snprintf(body + n, sizeof body - n, "}}}");
    r = &ok(K_ROUTE, body)->route;
    assert_int_equal(r->n_preferred, 64);
    assert_string_equal(r->preferred_taints[63].taint, "t63");
    assert_true(r->preferred_taints[63].weight == -63.5);
    snprintf(body + n, sizeof body - n, ",\"t64\":1}}}");
    err(K_ROUTE, body, KVR_ETOOBIG,
        "routing_constraints.preferred_taints: more than 64 taints");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":{\"a\":1,"
                 "\"b\":2,\"a\":3}}}", KVR_EINVAL,
        "routing_constraints.preferred_taints: duplicate taint 'a'");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":{\"a\":\"1\"}}}",
        KVR_EINVAL, "routing_constraints.preferred_taints['a']: must be a finite number");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":{\"a\":1e309}}}",
        KVR_EINVAL, "routing_constraints.preferred_taints['a']: must be a finite number");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":{\"a\":null}}}",
        KVR_EINVAL, "routing_constraints.preferred_taints['a']: must be a finite number");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":{\"\":1}}}",
        KVR_EINVAL, "routing_constraints.preferred_taints: taint '' must be 1 to 128 bytes");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"preferred_taints\":[]}}",
        KVR_EINVAL, "routing_constraints.preferred_taints: must be an object or null");
}

static void test_unknown_keys(void **state)
{
    (void)state;
    const kvr_api_route_t *r = &ok(K_ROUTE,
        "{\"x\":1,\"y\":\"s\",\"z\":null,\"w\":true,\"v\":[1,[2,{\"tokens\":[\"no\"]}]],"
        "\"u\":{\"tokens\":{},\"a\":[[[]]]},\"tokens\":[4],\"Tokens\":\"ignored\","
        "\"pinned_worker\":{\"worker_id\":1,\"dp_rank\":2,\"extra\":{\"deep\":[1]}},"
        "\"routing_constraints\":{\"other\":[1],\"required_taints\":[\"a\"]},"
        "\"config_override\":{\"router_temperature\":1,\"future_knob\":{\"x\":[]}},"
        "\"decay_fraction\":\"not a route field\",\"worker_id\":[]}")->route;
    assert_int_equal(r->n_tokens, 1);
    assert_int_equal(r->tokens[0], 4);
    assert_true(r->pinned.dp_rank == 2);
    assert_int_equal(r->n_required, 1);
    assert_true(r->ovr.temperature == 1);

    /* unknown keys may repeat (they are not tracked) */
    ok(K_ROUTE, "{\"x\":1,\"x\":2,\"tokens\":[1]}");

    /* nesting: 64 levels in all is fine, 65 is not */
    char body[512];
    size_t n = (size_t)snprintf(body, sizeof body, "{\"tokens\":[1],\"deep\":");
    for (int i = 0; i < 63; i++)
        body[n++] = '[';
    for (int i = 0; i < 63; i++)
        body[n++] = ']';
    snprintf(body + n, sizeof body - n, "}");
    ok(K_ROUTE, body);
    n = (size_t)snprintf(body, sizeof body, "{\"tokens\":[1],\"deep\":");
    for (int i = 0; i < 64; i++)
        body[n++] = '[';
    for (int i = 0; i < 64; i++)
        body[n++] = ']';
    snprintf(body + n, sizeof body - n, "}");
    err(K_ROUTE, body, KVR_EINVAL, "nesting deeper than 64 levels");
    /* inside a nested known object, the object counts as a level */
    n = (size_t)snprintf(body, sizeof body, "{\"tokens\":[1],\"config_override\":{\"deep\":");
    for (int i = 0; i < 63; i++)
        body[n++] = '{', body[n++] = '"', body[n++] = 'k', body[n++] = '"', body[n++] = ':';
    body[n++] = '1';
    for (int i = 0; i < 63; i++)
        body[n++] = '}';
    snprintf(body + n, sizeof body - n, "}}");
    err(K_ROUTE, body, KVR_EINVAL, "nesting deeper than 64 levels");
}

static void test_duplicates(void **state)
{
    (void)state;
    err(K_ROUTE, "{\"tokens\":[1],\"tokens\":[2]}", KVR_EINVAL, "tokens: duplicate key");
    err(K_ROUTE, "{\"tok\\u0065ns\":[1],\"tokens\":[2]}", KVR_EINVAL, "tokens: duplicate key");
    err(K_ROUTE, "{\"tokens\":[1],\"request_id\":\"a\",\"request_id\":\"a\"}", KVR_EINVAL,
        "request_id: duplicate key");
    err(K_ROUTE, "{\"tokens\":[1],\"lora_name\":null,\"lora_name\":null}", KVR_EINVAL,
        "lora_name: duplicate key");
    err(K_ROUTE, "{\"tokens\":[1],\"pinned_worker\":{\"worker_id\":1,\"worker_id\":1,"
                 "\"dp_rank\":0}}", KVR_EINVAL, "pinned_worker.worker_id: duplicate key");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"router_temperature\":1},"
                 "\"config_override\":{}}", KVR_EINVAL, "config_override: duplicate key");
    err(K_ROUTE, "{\"tokens\":[1],\"config_override\":{\"assume_kv_reuse\":true,"
                 "\"assume_kv_reuse\":true}}", KVR_EINVAL,
        "config_override.assume_kv_reuse: duplicate key");
    err(K_ROUTE, "{\"tokens\":[1],\"routing_constraints\":{\"required_taints\":[],"
                 "\"required_taints\":[]}}", KVR_EINVAL,
        "routing_constraints.required_taints: duplicate key");
}

static void test_invalid_json(void **state)
{
    (void)state;
    err(K_ROUTE, "", KVR_EPARSE, "empty body");
    err(K_ROUTE, " \r\n\t", KVR_EPARSE, "empty body");
    err(K_ROUTE, "[1,2]", KVR_EPARSE, "expected a JSON object");
    err(K_ROUTE, "\"tokens\"", KVR_EPARSE, "expected a JSON object");
    err(K_ROUTE, "42", KVR_EPARSE, "expected a JSON object");
    err(K_ROUTE, "null", KVR_EPARSE, "expected a JSON object");
    err(K_ROUTE, "{\"tokens\":[1,2}", KVR_EPARSE,
        "invalid JSON at byte 15: parse error: after array element, I expect ',' or ']'");
    err(K_ROUTE, "{\"tokens\":[1]} x", KVR_EPARSE,
        "invalid JSON at byte 16: parse error: trailing garbage");
    err(K_ROUTE, "{\"tokens\":[1]}{}", KVR_EPARSE,
        "invalid JSON at byte 15: parse error: trailing garbage");
    err(K_ROUTE, "{\"tokens\":[1", KVR_EPARSE,
        "invalid JSON at byte 12: parse error: premature EOF");
    err(K_ROUTE, "{\"tokens\":[1],}", KVR_EPARSE,
        "invalid JSON at byte 15: parse error: invalid object key (must be a string)");
    err(K_ROUTE, "{tokens:[1]}", KVR_EPARSE,
        "invalid JSON at byte 2: lexical error: invalid string in json text.");
    err(K_ROUTE, "{\"tokens\":[NaN]}", KVR_EPARSE,
        "invalid JSON at byte 12: lexical error: invalid char in json text.");
    err_prefix(K_ROUTE, "{\"tokens\":[01]}", "invalid JSON at byte ");
    err_prefix(K_ROUTE, "{\"tokens\":[1,]}", "invalid JSON at byte ");
    err_prefix(K_ROUTE, "{\"tokens\":[,1]}", "invalid JSON at byte ");
    err_prefix(K_ROUTE, "{\"tokens\":[1 2]}", "invalid JSON at byte ");
    err_prefix(K_ROUTE, "{\"tokens\":[1],\"a\":/*c*/1}", "invalid JSON at byte ");
    err_prefix(K_ROUTE, "\xef\xbb\xbf{\"tokens\":[1]}", "invalid JSON at byte ");
    /* a NUL byte inside the body */
    assert_int_equal(check_n(K_ROUTE, "{\"tokens\":[1]}\0", 15), KVR_EPARSE);
    assert_int_equal(check_n(K_ROUTE, "{\"tokens\":[1\0]}", 15), KVR_EPARSE);
    /* NULL body */
    kvr_api_route_t r;
    assert_int_equal(kvr_api_decode_route(fast_d, NULL, 3, &r), KVR_EINVAL);
    assert_string_equal(kvr_api_decoder_error(fast_d), "no body");
    assert_int_equal(kvr_api_decode_route(fast_d, NULL, 0, &r), KVR_EPARSE);
}

static void test_limits(void **state)
{
    (void)state;
    kvr_api_options_t o = {.max_tokens = 100, .max_allowed_ids = 3, .no_fast_path = false};
    kvr_api_decoder_t *d = kvr_api_decoder_new(&o);
    o.no_fast_path = true;
    kvr_api_decoder_t *s = kvr_api_decoder_new(&o);
    assert_non_null(d);
    assert_non_null(s);
    char body[8192];
    for (int pass = 0; pass < 2; pass++) {
        kvr_api_decoder_t *x = pass == 0 ? d : s;
        size_t n = (size_t)snprintf(body, sizeof body, "{\"tokens\":[");
        for (int i = 0; i < 100; i++)
            n += (size_t)snprintf(body + n, sizeof body - n, "%s%d", i ? "," : "", 100000 + i);
        snprintf(body + n, sizeof body - n, "]}");
        kvr_api_route_t r;
        assert_int_equal(kvr_api_decode_route(x, body, strlen(body), &r), KVR_OK);
        assert_int_equal(r.n_tokens, 100);
        assert_int_equal(r.tokens[99], 100099);
        snprintf(body + n, sizeof body - n, ",5]}");
        assert_int_equal(kvr_api_decode_route(x, body, strlen(body), &r), KVR_ETOOBIG);
        assert_string_equal(kvr_api_decoder_error(x), "tokens: more than 100 tokens");
        const char *ids = "{\"tokens\":[],\"allowed_worker_ids\":[1,2,3,4]}";
        assert_int_equal(kvr_api_decode_route(x, ids, strlen(ids), &r), KVR_ETOOBIG);
        assert_string_equal(kvr_api_decoder_error(x), "allowed_worker_ids: more than 3 ids");
    }
    kvr_api_decoder_free(d);
    kvr_api_decoder_free(s);

    /* options above the maxima are refused */
    kvr_api_options_t big = {KVR_API_MAX_TOKENS + 1, 1, false};
    assert_null(kvr_api_decoder_new(&big));
    big = (kvr_api_options_t){1, KVR_API_MAX_ALLOWED_IDS + 1, false};
    assert_null(kvr_api_decoder_new(&big));

    /* the default limits: 4096 ids accepted, 4097 not */
    char *ids = malloc(4097 * 8 + 64);
    assert_non_null(ids);
    size_t n = (size_t)sprintf(ids, "{\"tokens\":[1],\"allowed_worker_ids\":[");
    for (int i = 0; i < 4096; i++)
        n += (size_t)sprintf(ids + n, "%s%d", i ? "," : "", 4096 - i);
    strcpy(ids + n, "]}");
    const kvr_api_route_t *r = &ok(K_ROUTE, ids)->route;
    assert_int_equal(r->n_allowed, 4096);
    for (size_t i = 0; i < 4096; i++)
        assert_true(r->allowed_ids[i] == i + 1);
    strcpy(ids + n, ",1]}");
    err(K_ROUTE, ids, KVR_ETOOBIG, "allowed_worker_ids: more than 4096 ids");
    free(ids);
}

/* A body with many tokens; max_tokens + 1 tokens when over. */
static char *tokens_body(size_t n_tokens, const char *sep, const char *tail)
{
    char *b = malloc(n_tokens * 13 + strlen(tail) + 64);
    assert_non_null(b);
    size_t n = (size_t)sprintf(b, "{\"tokens\":[");
    for (size_t i = 0; i < n_tokens; i++)
        n += (size_t)sprintf(b + n, "%s%u", i ? sep : "", (unsigned)((i * 2654435761u) % 200000));
    sprintf(b + n, "]%s}", tail);
    return b;
}

static void test_large_and_reuse(void **state)
{
    (void)state;
    /* 128K tokens with every field, then a small body: nothing leaks from the large one */
    char *big = tokens_body(131072, ",", ",\"request_id\":\"big\",\"lora_name\":\"L\","
                            "\"allowed_worker_ids\":[5,4],\"routing_constraints\":{"
                            "\"required_taints\":[\"a\",\"b\"],\"preferred_taints\":{\"c\":1}},"
                            "\"config_override\":{\"router_temperature\":2}");
    const kvr_api_route_t *r = &ok(K_ROUTE, big)->route;
    assert_int_equal(r->n_tokens, 131072);
    for (size_t i = 0; i < 131072; i += 977)
        assert_int_equal(r->tokens[i], (unsigned)((i * 2654435761u) % 200000));
    assert_int_equal(r->n_required, 2);
    const uint32_t *big_tokens = r->tokens;

    r = &ok(K_ROUTE, "{\"tokens\":[3,2,1]}")->route;
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[2], 1);
    assert_ptr_equal(r->tokens, big_tokens);  /* the buffer is reused, not reallocated */
    assert_false(r->has_request_id);
    assert_null(r->lora_name);
    assert_false(r->has_allowed);
    assert_int_equal(r->n_required + r->n_preferred, 0);
    assert_false(r->has_override);

    /* the other kinds on the same decoders */
    const kvr_api_worker_t *w = &ok(K_WORKER, "{\"worker_id\":1}")->worker;
    assert_int_equal(w->n_taints, 0);
    assert_null(w->taints);
    free(big);

    /* the same large array spelled with ", " and with newlines */
    big = tokens_body(131072, ", ", "");
    assert_int_equal(ok(K_QUERY, big)->query.n_tokens, 131072);
    free(big);
    big = tokens_body(5000, ",\n  ", "");
    assert_int_equal(ok(K_LOADS, big)->query.n_tokens, 5000);
    free(big);
}

/* ---- other bodies --------------------------------------------------------------------------- */

static void test_output_block(void **state)
{
    (void)state;
    const kvr_api_output_block_t *o = &ok(K_OB, "")->ob;
    assert_false(o->has_decay_fraction);
    assert_false(ok(K_OB, " \n")->ob.has_decay_fraction);
    assert_false(ok(K_OB, "{}")->ob.has_decay_fraction);
    o = &ok(K_OB, "{\"decay_fraction\":null,\"tokens\":\"ignored\"}")->ob;
    assert_false(o->has_decay_fraction);
    o = &ok(K_OB, "{\"decay_fraction\":0.25}")->ob;
    assert_true(o->has_decay_fraction && o->decay_fraction == 0.25);
    assert_true(ok(K_OB, "{\"decay_fraction\":0}")->ob.decay_fraction == 0);
    assert_true(ok(K_OB, "{\"decay_fraction\":1}")->ob.decay_fraction == 1);
    assert_true(ok(K_OB, "{\"decay_fraction\":1e-5}")->ob.decay_fraction == 1e-5);
    const char *m = "decay_fraction: must be a number in [0, 1]";
    err(K_OB, "{\"decay_fraction\":1.5}", KVR_EINVAL, m);
    err(K_OB, "{\"decay_fraction\":-0.1}", KVR_EINVAL, m);
    err(K_OB, "{\"decay_fraction\":\"0.5\"}", KVR_EINVAL, m);
    err(K_OB, "{\"decay_fraction\":1e999}", KVR_EINVAL, m);
    err(K_OB, "{\"decay_fraction\":0.5,\"decay_fraction\":0.5}", KVR_EINVAL,
        "decay_fraction: duplicate key");
    err(K_OB, "[]", KVR_EPARSE, "expected a JSON object");
    err_prefix(K_OB, "{", "invalid JSON at byte ");
}

static void test_query_and_loads(void **state)
{
    (void)state;
    for (int kind = K_QUERY; kind <= K_LOADS; kind++) {
        const kvr_api_query_t *q = &ok(kind, "{\"tokens\":[1,2],\"lora_name\":\"l\","
                                             "\"cache_namespace\":\"ns\",\"update_state\":5,"
                                             "\"request_id\":[]}")->query;
        assert_int_equal(q->n_tokens, 2);
        assert_int_equal(q->tokens[1], 2);
        assert_string_equal(q->lora_name, "l");
        assert_int_equal(q->cache_namespace_len, 2);
        assert_string_equal(q->cache_namespace, "ns");
        q = &ok(kind, "{\"tokens\":[]}")->query;
        assert_int_equal(q->n_tokens, 0);
        assert_null(q->lora_name);
        assert_null(q->cache_namespace);
        err(kind, "{\"lora_name\":\"l\"}", KVR_EINVAL, "tokens: missing");
        err(kind, "{\"tokens\":[1,2,3,\"4\"]}", KVR_EINVAL,
            "tokens[3]: not an integer in [0, 4294967295]");
        err(kind, "{\"tokens\":[1],\"lora_name\":true}", KVR_EINVAL,
            "lora_name: must be a string or null");
    }
}

static void test_worker(void **state)
{
    (void)state;
    const kvr_api_worker_t *w = &ok(K_WORKER, "{\"worker_id\":7}")->worker;
    assert_true(w->worker_id == 7);
    assert_null(w->url);
    assert_null(w->events);
    assert_null(w->replay);
    assert_int_equal(w->dp_size, 1);
    assert_int_equal(w->dp_start, 0);
    assert_int_equal(w->n_taints, 0);
    assert_false(w->has_max_num_batched_tokens);
    assert_false(w->has_total_kv_blocks);

    w = &ok(K_WORKER, "{\"worker_id\":18446744073709551615,\"url\":\"http://10.0.0.1:8000\","
                      "\"events\":\"tcp://10.0.0.1:5557\",\"replay\":\"tcp://10.0.0.1:5558\","
                      "\"dp_size\":4096,\"dp_start\":4294963200,\"taints\":[\"gpu\",\"a100\"],"
                      "\"max_num_batched_tokens\":8192,\"total_kv_blocks\":18446744073709551615,"
                      "\"tokens\":\"ignored\"}")->worker;
    assert_true(w->worker_id == UINT64_MAX);
    assert_string_equal(w->url, "http://10.0.0.1:8000");
    assert_int_equal(w->url_len, 20);
    assert_string_equal(w->events, "tcp://10.0.0.1:5557");
    assert_string_equal(w->replay, "tcp://10.0.0.1:5558");
    assert_int_equal(w->dp_size, 4096);
    assert_int_equal(w->dp_start, 4294963200u);
    assert_int_equal(w->n_taints, 2);
    assert_string_equal(w->taints[1], "a100");
    assert_true(w->has_max_num_batched_tokens && w->max_num_batched_tokens == 8192);
    assert_true(w->has_total_kv_blocks && w->total_kv_blocks == UINT64_MAX);

    w = &ok(K_WORKER, "{\"worker_id\":0,\"url\":null,\"events\":null,\"replay\":null,"
                      "\"dp_size\":null,\"dp_start\":null,\"taints\":null,"
                      "\"max_num_batched_tokens\":null,\"total_kv_blocks\":null}")->worker;
    assert_true(w->worker_id == 0 && w->dp_size == 1 && w->url == NULL);

    err(K_WORKER, "{}", KVR_EINVAL, "worker_id: missing");
    err(K_WORKER, "{\"worker_id\":null}", KVR_EINVAL, "worker_id: must not be null");
    err(K_WORKER, "{\"worker_id\":\"7\"}", KVR_EINVAL,
        "worker_id: not an integer in [0, 18446744073709551615]");
    err(K_WORKER, "{\"worker_id\":18446744073709551616}", KVR_EINVAL,
        "worker_id: not an integer in [0, 18446744073709551615]");
    err(K_WORKER, "{\"worker_id\":1,\"dp_size\":0}", KVR_EINVAL,
        "dp_size: not an integer in [1, 4096]");
    err(K_WORKER, "{\"worker_id\":1,\"dp_size\":4097}", KVR_EINVAL,
        "dp_size: not an integer in [1, 4096]");
    err(K_WORKER, "{\"worker_id\":1,\"dp_start\":-1}", KVR_EINVAL,
        "dp_start: not an integer in [0, 4294967295]");
    err(K_WORKER, "{\"worker_id\":1,\"dp_start\":4294967295,\"dp_size\":2}", KVR_EINVAL,
        "dp_start: dp_start + dp_size must be <= 4294967296");
    assert_int_equal(ok(K_WORKER, "{\"worker_id\":1,\"dp_start\":4294967295}")->worker.dp_start,
                     4294967295u);
    err(K_WORKER, "{\"worker_id\":1,\"url\":\"\"}", KVR_EINVAL, "url: must be 1 to 2048 bytes");
    err(K_WORKER, "{\"worker_id\":1,\"events\":7}", KVR_EINVAL,
        "events: must be a string or null");
    err(K_WORKER, "{\"worker_id\":1,\"replay\":\"tcp://x\\r\"}", KVR_EINVAL,
        "replay: contains a control character");
    err(K_WORKER, "{\"worker_id\":1,\"taints\":[\"ok\",false]}", KVR_EINVAL,
        "taints[1]: must be a string");
    err(K_WORKER, "{\"worker_id\":1,\"max_num_batched_tokens\":0}", KVR_EINVAL,
        "max_num_batched_tokens: not an integer in [1, 18446744073709551615]");
    err(K_WORKER, "{\"worker_id\":1,\"total_kv_blocks\":1.5}", KVR_EINVAL,
        "total_kv_blocks: not an integer in [1, 18446744073709551615]");
    err(K_WORKER, "{\"worker_id\":1,\"worker_id\":1}", KVR_EINVAL, "worker_id: duplicate key");
    char body[3000], s[2050];
    memset(s, 'u', sizeof s);
    snprintf(body, sizeof body, "{\"worker_id\":1,\"url\":\"%.2048s\"}", s);
    assert_int_equal(ok(K_WORKER, body)->worker.url_len, 2048);
    snprintf(body, sizeof body, "{\"worker_id\":1,\"url\":\"%.2049s\"}", s);
    err(K_WORKER, body, KVR_EINVAL, "url: must be 1 to 2048 bytes");
    /* disaggregation: the role, a prefill worker's bootstrap server */
    w = &ok(K_WORKER, "{\"worker_id\":1,\"role\":\"prefill\",\"bootstrap_port\":8998,"
                      "\"bootstrap_host\":\"10.0.0.9\"}")->worker;
    assert_int_equal(w->role, KVR_ROLE_PREFILL);
    assert_int_equal(w->bootstrap_port, 8998);
    assert_string_equal(w->bootstrap_host, "10.0.0.9");
    assert_int_equal(ok(K_WORKER, "{\"worker_id\":1,\"role\":\"decode\"}")->worker.role,
                     KVR_ROLE_DECODE);
    assert_int_equal(ok(K_WORKER, "{\"worker_id\":1,\"role\":null}")->worker.role,
                     KVR_ROLE_BOTH);
    err(K_WORKER, "{\"worker_id\":1,\"role\":\"middle\"}", KVR_EINVAL,
        "role: must be prefill, decode or both");
    err(K_WORKER, "{\"worker_id\":1,\"bootstrap_port\":65536}", KVR_EINVAL,
        "bootstrap_port: not an integer in [1, 65535]");
    kvr_worker_spec_t sp;
    char e[200];
    w = &ok(K_WORKER, "{\"worker_id\":3,\"role\":\"prefill\",\"bootstrap_port\":9000}")->worker;
    assert_int_equal(kvr_api_worker_to_spec(&sp, w, e, sizeof e), KVR_OK);
    assert_int_equal(sp.role, KVR_ROLE_PREFILL);
    assert_int_equal(sp.bootstrap_port, 9000);
    kvr_json_writer_t jw;
    kvr_json_writer_init(&jw);
    assert_int_equal(kvr_api_encode_worker_spec(&jw, &sp), KVR_OK);
    const char *j;
    size_t jl;
    assert_int_equal(kvr_json_writer_finish(&jw, &j, &jl), KVR_OK);
    const kvr_api_worker_t *back = &ok(K_WORKER, j)->worker; /* the encoding reads back */
    assert_int_equal(back->role, KVR_ROLE_PREFILL);
    assert_int_equal(back->bootstrap_port, 9000);
    kvr_json_writer_deinit(&jw);
}

static void test_router(void **state)
{
    (void)state;
    const kvr_api_router_t *r = &ok(K_ROUTER,
        "{\"method\":\"new\",\"tokens\":[1,2,3],\"routing_constraints\":{\"required_taints\":"
        "[\"gpu\"],\"preferred_taints\":{\"fast\":1}},\"priority_jump\":2.5,"
        "\"strict_priority\":3,\"lora_name\":\"l\",\"cache_namespace\":\"c\"}")->router;
    assert_int_equal(r->method, KVR_API_ROUTER_NEW);
    assert_int_equal(r->n_tokens, 3);
    assert_true(r->priority_jump == 2.5);
    assert_int_equal(r->strict_priority, 3);
    assert_string_equal(r->lora_name, "l");
    assert_string_equal(r->cache_namespace, "c");
    assert_int_equal(r->n_required, 1);
    assert_string_equal(r->required_taints[0], "gpu");
    assert_int_equal(r->n_preferred, 1);
    assert_false(r->has_request_id);

    /* method may come last; request_id is optional for new */
    r = &ok(K_ROUTER, "{\"tokens\":[9],\"request_id\":\"r1\",\"method\":\"new\"}")->router;
    assert_int_equal(r->method, KVR_API_ROUTER_NEW);
    assert_true(r->has_request_id);
    assert_string_equal(r->request_id, "r1");
    assert_true(r->priority_jump == 0 && r->strict_priority == 0);

    r = &ok(K_ROUTER, "{\"method\":\"potential_loads\",\"tokens\":[4,5],\"request_id\":\"x\","
                      "\"priority_jump\":1}")->router;
    assert_int_equal(r->method, KVR_API_ROUTER_POTENTIAL_LOADS);
    assert_int_equal(r->n_tokens, 2);
    assert_false(r->has_request_id);  /* not a potential_loads field: cleared */
    assert_true(r->priority_jump == 0);

    r = &ok(K_ROUTER, "{\"method\":\"mark_prefill\",\"request_id\":\"abc\",\"tokens\":[1]}")
        ->router;
    assert_int_equal(r->method, KVR_API_ROUTER_MARK_PREFILL);
    assert_string_equal(r->request_id, "abc");
    assert_int_equal(r->n_tokens, 0);  /* cleared */
    assert_null(r->tokens);
    r = &ok(K_ROUTER, "{\"request_id\":\"abc\",\"method\":\"mark_free\"}")->router;
    assert_int_equal(r->method, KVR_API_ROUTER_MARK_FREE);
    assert_string_equal(kvr_api_router_method_name(r->method), "mark_free");
    assert_string_equal(kvr_api_router_method_name((kvr_api_router_method_t)9), "unknown");

    err(K_ROUTER, "{\"tokens\":[1]}", KVR_EINVAL, "method: missing");
    err(K_ROUTER, "{\"method\":null,\"tokens\":[1]}", KVR_EINVAL, "method: must not be null");
    err(K_ROUTER, "{\"method\":\"old\"}", KVR_EINVAL, "method: unknown method 'old' (expected "
        "new, potential_loads, mark_prefill or mark_free)");
    err(K_ROUTER, "{\"method\":\"New\"}", KVR_EINVAL, "method: unknown method 'New' (expected "
        "new, potential_loads, mark_prefill or mark_free)");
    err(K_ROUTER, "{\"method\":1}", KVR_EINVAL,
        "method: must be one of new, potential_loads, mark_prefill, mark_free");
    err(K_ROUTER, "{\"method\":\"new\"}", KVR_EINVAL, "tokens: missing");
    err(K_ROUTER, "{\"method\":\"potential_loads\",\"tokens\":null}", KVR_EINVAL,
        "tokens: must not be null");
    err(K_ROUTER, "{\"method\":\"mark_free\"}", KVR_EINVAL, "request_id: missing");
    err(K_ROUTER, "{\"method\":\"mark_prefill\",\"request_id\":\"\"}", KVR_EINVAL,
        "request_id: must be 1 to 256 bytes");
    err(K_ROUTER, "{\"method\":\"new\",\"method\":\"new\",\"tokens\":[]}", KVR_EINVAL,
        "method: duplicate key");
    err(K_ROUTER, "{\"method\":\"new\",\"tokens\":[],\"strict_priority\":-1}", KVR_EINVAL,
        "strict_priority: not an integer in [0, 4294967295]");
    /* fields of other methods are still validated */
    err(K_ROUTER, "{\"method\":\"mark_free\",\"request_id\":\"a\",\"tokens\":[-1]}", KVR_EINVAL,
        "tokens[0]: not an integer in [0, 4294967295]");
    /* route-only fields are unknown here */
    ok(K_ROUTER, "{\"method\":\"new\",\"tokens\":[],\"update_state\":{},\"pinned_worker\":7}");
}

/* ---- encoders ------------------------------------------------------------------------------- */

static void test_encoders(void **state)
{
    (void)state;
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_api_route_response_t resp = {
        .request_id = "req-\"1\"",
        .worker = {.worker_id = UINT64_MAX, .dp_rank = 3},
        .overlap_blocks = 12,
        .cached_tokens = 192,
    };
    assert_int_equal(kvr_api_encode_route_response(&w, &resp), KVR_OK);
    const char *data;
    size_t len;
    assert_int_equal(kvr_json_writer_finish(&w, &data, &len), KVR_OK);
    assert_string_equal(data, "{\"request_id\":\"req-\\\"1\\\"\",\"worker_id\":"
                              "18446744073709551615,\"dp_rank\":3,\"overlap_blocks\":12,"
                              "\"cached_tokens\":192}");

    /* a route request built field by field decodes to what was built */
    uint32_t tokens[] = {1, 4294967295u, 0};
    uint64_t ids[] = {2, 18446744073709551615u};
    const char *req[] = {"gpu"};
    kvr_taint_weight_t pref[] = {{"fast", 0.1}, {"x\"y", -1e-7}};
    kvr_api_route_t in = {
        .tokens = tokens, .n_tokens = 3, .has_request_id = true, .update_state = false,
        .lora_name = "lora", .lora_name_len = 4, .cache_namespace = "ns\\1",
        .cache_namespace_len = 4, .has_allowed = true, .allowed_ids = ids, .n_allowed = 2,
        .has_pinned = true, .pinned = {UINT64_MAX, 7}, .priority_jump = 1.0 / 3.0,
        .has_expected_output_tokens = true, .expected_output_tokens = 99,
        .required_taints = req, .n_required = 1, .preferred_taints = pref, .n_preferred = 2,
        .has_override = true,
        .ovr = {.has_temperature = true, .temperature = 0.7, .has_overlap_score_weight = true,
                .overlap_score_weight = 0},
        .has_track_prefill_tokens = true, .track_prefill_tokens = false,
    };
    strcpy(in.request_id, "rid");
    kvr_json_writer_reset(&w);
    assert_int_equal(kvr_api_encode_route(&w, &in), KVR_OK);
    assert_int_equal(kvr_json_writer_finish(&w, &data, &len), KVR_OK);
    const kvr_api_route_t *r = &ok(K_ROUTE, data)->route;
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[1], 4294967295u);
    assert_string_equal(r->request_id, "rid");
    assert_false(r->update_state);
    assert_string_equal(r->lora_name, "lora");
    assert_string_equal(r->cache_namespace, "ns\\1");
    assert_true(r->allowed_ids[1] == UINT64_MAX);
    assert_true(r->pinned.worker_id == UINT64_MAX && r->pinned.dp_rank == 7);
    assert_true(r->priority_jump == 1.0 / 3.0);
    assert_int_equal(r->expected_output_tokens, 99);
    assert_string_equal(r->required_taints[0], "gpu");
    assert_string_equal(r->preferred_taints[1].taint, "x\"y");
    assert_true(r->preferred_taints[1].weight == -1e-7);
    assert_true(r->ovr.has_temperature && r->ovr.temperature == 0.7);
    assert_true(r->ovr.has_overlap_score_weight && r->ovr.overlap_score_weight == 0);
    assert_false(r->ovr.has_prefill_load_scale);
    assert_true(r->has_track_prefill_tokens && !r->track_prefill_tokens);
    assert_false(r->has_assume_kv_reuse);

    /* the encoders of the other kinds (decoded values re-encode to the same text) */
    kvr_api_output_block_t ob = {.has_decay_fraction = true, .decay_fraction = 0.5};
    kvr_json_writer_reset(&w);
    kvr_api_encode_output_block(&w, &ob);
    assert_int_equal(kvr_json_writer_finish(&w, &data, &len), KVR_OK);
    assert_string_equal(data, "{\"decay_fraction\":0.5}");
    kvr_api_router_t rt = {.method = KVR_API_ROUTER_MARK_FREE, .has_request_id = true};
    strcpy(rt.request_id, "q");
    kvr_json_writer_reset(&w);
    kvr_api_encode_router(&w, &rt);
    assert_int_equal(kvr_json_writer_finish(&w, &data, &len), KVR_OK);
    assert_string_equal(data, "{\"method\":\"mark_free\",\"request_id\":\"q\"}");
    kvr_json_writer_deinit(&w);
}

/* ---- randomised token arrays: the fast path against the slow one ---------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static void test_random_token_arrays(void **state)
{
    (void)state;
    static const char *const seps[] = {",", ",", ",", ", ", " , ", ",\n", "\t,", ",  "};
    static const char *const odd[] = {"-0", "-1", "1.0", "1e2", "01", "00", "4294967296",
                                      "99999999999", "\"5\"", "null", "", "1 2", "[1]", ",",
                                      "0", "4294967295", "1000000000", "123456789", "-"};
    size_t cap = 1 << 16;
    char *b = malloc(cap);
    assert_non_null(b);
    uint64_t seed = 20240611;
    for (int iter = 0; iter < 3000; iter++) {
        uint64_t s = seed + (uint64_t)iter;
        size_t n_tok = rng_next(&s) % 400;
        const char *sep = seps[rng_next(&s) % (sizeof seps / sizeof seps[0])];
        bool mixed = rng_next(&s) % 4 == 0;
        bool with_odd = rng_next(&s) % 3 == 0;
        size_t n = (size_t)snprintf(b, cap, "%s{%s\"tokens\"%s:%s[%s",
                                    rng_next(&s) % 2 ? " " : "",
                                    rng_next(&s) % 2 ? "\"request_id\":\"r\"," : "",
                                    rng_next(&s) % 4 ? "" : " ", rng_next(&s) % 4 ? "" : "\n",
                                    rng_next(&s) % 4 ? "" : " ");
        for (size_t i = 0; i < n_tok && n + 64 < cap; i++) {
            if (i > 0)
                n += (size_t)snprintf(b + n, cap - n, "%s",
                                      mixed ? seps[rng_next(&s) % 8] : sep);
            uint64_t r = rng_next(&s);
            if (with_odd && r % 97 == 0) {
                n += (size_t)snprintf(b + n, cap - n, "%s", odd[r % (sizeof odd / sizeof odd[0])]);
                continue;
            }
            unsigned digits = 1 + (unsigned)(r >> 8) % 10;
            uint64_t v = (r >> 16) % 10000000000u;
            uint64_t mod = 1;
            for (unsigned k = 0; k < digits; k++)
                mod *= 10;
            v %= mod;
            if ((r >> 4) % 5 == 0)
                v %= 200000;
            n += (size_t)snprintf(b + n, cap - n, "%" PRIu64, v);
        }
        n += (size_t)snprintf(b + n, cap - n, "%s]%s}", rng_next(&s) % 4 ? "" : " ",
                              rng_next(&s) % 2 ? ",\"lora_name\":\"x\"" : "");
        kvr_api_stats_t before, after;
        kvr_api_decoder_stats(fast_d, &before);
        int st = check_n(rng_next(&s) % 2 ? K_ROUTE : K_QUERY, b, n);
        kvr_api_decoder_stats(fast_d, &after);
        if (st == KVR_OK && !with_odd && after.fast_path != before.fast_path + 1)
            fail_msg("seed %" PRIu64 ": a plain array missed the fast path: %.200s",
                     seed + (uint64_t)iter, b);
        if (!with_odd && st != KVR_OK) {
            /* only u32 overflow can fail a body without odd elements */
            assert_int_equal(st, KVR_EINVAL);
            assert_non_null(strstr(kvr_api_decoder_error(fast_d), "not an integer"));
        }
    }
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_minimal),
        cmocka_unit_test(test_route_all_fields),
        cmocka_unit_test(test_route_nulls_and_empties),
        cmocka_unit_test(test_u64_extremes),
        cmocka_unit_test(test_route_errors),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_taints),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_invalid_json),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_large_and_reuse),
        cmocka_unit_test(test_output_block),
        cmocka_unit_test(test_query_and_loads),
        cmocka_unit_test(test_worker),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_encoders),
        cmocka_unit_test(test_random_token_arrays),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

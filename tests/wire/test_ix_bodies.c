/*
 * test_ix_bodies.c: the indexer API's bodies: the JSON decoders (wire/api_json.c, indexer
 * kinds), the MessagePack query decoder (wire/ix_query_mp.c), and the RouterEvent dump
 * writer and reader (wire/router_event_json.c), and the /query_by_hash answer a router with a
 * remote indexer reads (wire/ix_answer.c).
 *
 * Checked: every field and default, the reference's aliases and ignored fields, i64 / u64
 * block hashes, each error with its message, the JSON and MessagePack forms (map and array)
 * of one query decoding to the same struct, and a dump written then read back event for
 * event (including a partition the peer reported as failed, and malformed dumps).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/ix_answer.h"
#include "wire/ix_query_mp.h"
#include "wire/json_writer.h"
#include "wire/router_event_json.h"

static kvr_api_decoder_t *dec, *slow;

static int setup(void **s)
{
    (void)s;
    dec = kvr_api_decoder_new(NULL);
    kvr_api_options_t o = {.max_tokens = KVR_API_MAX_TOKENS,
                           .max_allowed_ids = KVR_API_MAX_ALLOWED_IDS,
                           .no_fast_path = true};
    slow = kvr_api_decoder_new(&o);
    return dec && slow ? 0 : -1;
}

static int teardown(void **s)
{
    (void)s;
    kvr_api_decoder_free(dec);
    kvr_api_decoder_free(slow);
    return 0;
}

static int reg(const char *body, kvr_ix_register_t *r)
{
    return kvr_api_decode_ix_register(dec, body, strlen(body), r);
}

static void expect_reg_error(const char *body, const char *msg)
{
    kvr_ix_register_t r;
    assert_int_not_equal(reg(body, &r), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec), msg);
    assert_int_equal(r.instance_id, 0);
}

static void test_register(void **s)
{
    (void)s;
    kvr_ix_register_t r;
    assert_int_equal(reg("{\"instance_id\":18446744073709551615,\"endpoint\":\"tcp://h:5557\","
                         "\"model_name\":\"llama\",\"block_size\":16,\"routing_group\":\"acme\","
                         "\"dp_rank\":3,\"replay_endpoint\":\"tcp://h:5558\","
                         "\"tenant_id\":\"old\",\"additional_salt\":\"s\",\"lora_name\":\"x\"}",
                         &r),
                     KVR_OK);
    assert_true(r.instance_id == UINT64_MAX);
    assert_string_equal(r.endpoint, "tcp://h:5557");
    assert_string_equal(r.model_name, "llama");
    assert_string_equal(r.routing_group, "acme");
    assert_int_equal(r.block_size, 16);
    assert_int_equal(r.dp_rank, 3);
    assert_string_equal(r.replay_endpoint, "tcp://h:5558");
    /* defaults */
    assert_int_equal(reg("{\"instance_id\":7,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\","
                         "\"block_size\":64,\"additionalsalt\":null}",
                         &r),
                     KVR_OK);
    assert_string_equal(r.routing_group, "default");
    assert_int_equal(r.dp_rank, 0);
    assert_null(r.replay_endpoint);
    expect_reg_error("{\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":16}",
                     "instance_id: missing");
    expect_reg_error("{\"instance_id\":1,\"model_name\":\"m\",\"block_size\":16}",
                     "endpoint: missing");
    expect_reg_error("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"block_size\":16}",
                     "model_name: missing");
    expect_reg_error("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\"}",
                     "block_size: missing");
    expect_reg_error("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\","
                     "\"block_size\":0}",
                     "block_size: not an integer in [1, 65536]");
    expect_reg_error("{\"instance_id\":-1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\","
                     "\"block_size\":16}",
                     "instance_id: not an integer in [0, 18446744073709551615]");
    expect_reg_error("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"\","
                     "\"block_size\":16}",
                     "model_name: must be 1 to 255 bytes");
    expect_reg_error("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\","
                     "\"block_size\":16,\"additional_salt\":\"a\",\"additionalsalt\":\"b\"}",
                     "additional_salt: given twice (and as additionalsalt)");
    expect_reg_error("{\"instance_id\":1,\"instance_id\":2}", "instance_id: duplicate key");
    expect_reg_error("[1]", "expected a JSON object");
}

static void test_unregister_and_peer(void **s)
{
    (void)s;
    kvr_ix_unregister_t u;
    const char *b = "{\"instance_id\":5,\"model_name\":\"m\"}";
    assert_int_equal(kvr_api_decode_ix_unregister(dec, b, strlen(b), &u), KVR_OK);
    assert_int_equal(u.instance_id, 5);
    assert_null(u.routing_group); /* every group */
    assert_false(u.has_dp_rank);  /* every rank */
    b = "{\"instance_id\":5,\"model_name\":\"m\",\"routing_group\":\"g\",\"dp_rank\":2}";
    assert_int_equal(kvr_api_decode_ix_unregister(dec, b, strlen(b), &u), KVR_OK);
    assert_string_equal(u.routing_group, "g");
    assert_true(u.has_dp_rank);
    assert_int_equal(u.dp_rank, 2);
    b = "{\"model_name\":\"m\"}";
    assert_int_not_equal(kvr_api_decode_ix_unregister(dec, b, strlen(b), &u), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec), "instance_id: missing");
    kvr_ix_peer_t p;
    b = "{\"url\":\"http://a:8090\"}";
    assert_int_equal(kvr_api_decode_ix_peer(dec, b, strlen(b), &p), KVR_OK);
    assert_string_equal(p.url, "http://a:8090");
    b = "{\"url\":3}";
    assert_int_not_equal(kvr_api_decode_ix_peer(dec, b, strlen(b), &p), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec), "url: must be a string or null");
}

static void test_query_json(void **s)
{
    (void)s;
    kvr_ix_query_t q, q2;
    const char *b = "{\"token_ids\":[1,2,3,4294967295],\"model_name\":\"m\",\"lora_name\":\"l\","
                    "\"cache_salt\":\"c\",\"tenant_id\":\"t\"}";
    assert_int_equal(kvr_api_decode_ix_query(dec, b, strlen(b), false, &q), KVR_OK);
    assert_int_equal(q.n_tokens, 4);
    assert_int_equal(q.tokens[3], 4294967295u);
    assert_string_equal(q.model_name, "m");
    assert_string_equal(q.routing_group, "default");
    assert_string_equal(q.lora_name, "l");
    assert_string_equal(q.cache_salt, "c");
    /* the fast token scanner and yajl alone agree */
    assert_int_equal(kvr_api_decode_ix_query(slow, b, strlen(b), false, &q2), KVR_OK);
    assert_int_equal(q2.n_tokens, 4);
    assert_memory_equal(q.tokens, q2.tokens, 4 * sizeof *q.tokens);
    kvr_api_stats_t st;
    kvr_api_decoder_stats(dec, &st);
    assert_true(st.fast_path >= 1);
    b = "{\"token_ids\":[1,-2],\"model_name\":\"m\"}";
    assert_int_not_equal(kvr_api_decode_ix_query(dec, b, strlen(b), false, &q), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec),
                        "token_ids[1]: not an integer in [0, 4294967295]");
    b = "{\"tokens\":[1],\"model_name\":\"m\"}"; /* the router API's key: not this one's */
    assert_int_not_equal(kvr_api_decode_ix_query(dec, b, strlen(b), false, &q), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec), "token_ids: missing");
    /* by hash: i64 (negative = two's complement) and u64 */
    b = "{\"block_hashes\":[-1,9223372036854775807,-9223372036854775808,18446744073709551615],"
        "\"model_name\":\"m\",\"routing_group\":\"g\",\"cache_salt\":null}";
    assert_int_equal(kvr_api_decode_ix_query(dec, b, strlen(b), true, &q), KVR_OK);
    assert_true(q.by_hash);
    assert_int_equal(q.n_hashes, 4);
    assert_true(q.hashes[0] == UINT64_MAX);
    assert_true(q.hashes[1] == INT64_MAX);
    assert_true(q.hashes[2] == (uint64_t)1 << 63);
    assert_true(q.hashes[3] == UINT64_MAX);
    assert_string_equal(q.routing_group, "g");
    /* the hash scanner read them (not yajl), and yajl alone agrees */
    kvr_api_decoder_stats(dec, &st);
    uint64_t fast = st.fast_path;
    b = "{\"model_name\":\"m\",\"block_hashes\":[ 0, -0,\n7 ,-9223372036854775808,"
        "18446744073709551615]}";
    assert_int_equal(kvr_api_decode_ix_query(dec, b, strlen(b), true, &q), KVR_OK);
    kvr_api_decoder_stats(dec, &st);
    assert_int_equal(st.fast_path, fast + 1);
    assert_int_equal(kvr_api_decode_ix_query(slow, b, strlen(b), true, &q2), KVR_OK);
    assert_int_equal(q.n_hashes, 5);
    assert_memory_equal(q.hashes, q2.hashes, 5 * sizeof *q.hashes);
    assert_true(q.hashes[3] == (uint64_t)1 << 63 && q.hashes[4] == UINT64_MAX);
    b = "{\"block_hashes\":[-9223372036854775809],\"model_name\":\"m\"}";
    assert_int_not_equal(kvr_api_decode_ix_query(dec, b, strlen(b), true, &q), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec),
                        "block_hashes[0]: not an integer in [-9223372036854775808, "
                        "18446744073709551615]");
    b = "{\"block_hashes\":[1],\"model_name\":\"m\",\"cache_salt\":\"s\"}";
    assert_int_not_equal(kvr_api_decode_ix_query(dec, b, strlen(b), true, &q), KVR_OK);
    assert_string_equal(kvr_api_decoder_error(dec),
                        "cache_salt: not accepted by /query_by_hash (block_hashes must already "
                        "include the intended cache salt)");
    b = "{\"block_hashes\":[],\"model_name\":\"m\"}";
    assert_int_equal(kvr_api_decode_ix_query(dec, b, strlen(b), true, &q), KVR_OK);
    assert_int_equal(q.n_hashes, 0);
}

/* ---- MessagePack ---- */

static msgpack_sbuffer sb;
static msgpack_packer pk;

static void mp_begin(void)
{
    msgpack_sbuffer_clear(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
}

static void mp_str(const char *s)
{
    msgpack_pack_str(&pk, strlen(s));
    msgpack_pack_str_body(&pk, s, strlen(s));
}

static void test_query_msgpack(void **s)
{
    (void)s;
    msgpack_sbuffer_init(&sb);
    kvr_ix_mp_t d;
    kvr_ix_mp_init(&d);
    kvr_ix_query_t q;
    /* map form, with an unknown nested key skipped */
    mp_begin();
    msgpack_pack_map(&pk, 5);
    mp_str("extra");
    msgpack_pack_map(&pk, 1);
    mp_str("x");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_nil(&pk);
    msgpack_pack_true(&pk);
    mp_str("token_ids");
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint32(&pk, 1);
    msgpack_pack_uint32(&pk, 70000);
    msgpack_pack_uint32(&pk, 4294967295u);
    mp_str("model_name");
    mp_str("m");
    mp_str("lora_name");
    msgpack_pack_nil(&pk);
    mp_str("cache_salt");
    mp_str("salt");
    assert_int_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                     KVR_OK);
    assert_int_equal(q.n_tokens, 3);
    assert_int_equal(q.tokens[1], 70000);
    assert_int_equal(q.tokens[2], 4294967295u);
    assert_string_equal(q.model_name, "m");
    assert_string_equal(q.routing_group, "default");
    assert_null(q.lora_name);
    assert_string_equal(q.cache_salt, "salt");
    /* array form (rmp-serde's compact encoding), trailing optionals left out */
    mp_begin();
    msgpack_pack_array(&pk, 3);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int64(&pk, -1);
    msgpack_pack_uint64(&pk, UINT64_MAX - 1);
    mp_str("m");
    mp_str("g");
    assert_int_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, true, &q),
                     KVR_OK);
    assert_int_equal(q.n_hashes, 2);
    assert_true(q.hashes[0] == UINT64_MAX);
    assert_true(q.hashes[1] == UINT64_MAX - 1);
    assert_string_equal(q.routing_group, "g");
    /* errors, each named */
    mp_begin();
    msgpack_pack_map(&pk, 1);
    mp_str("model_name");
    mp_str("m");
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                         KVR_OK);
    assert_string_equal(d.err, "token_ids: missing");
    assert_null(q.model_name);
    mp_begin();
    msgpack_pack_map(&pk, 2);
    mp_str("token_ids");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_int64(&pk, -5);
    mp_str("model_name");
    mp_str("m");
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                         KVR_OK);
    assert_string_equal(d.err, "token_ids[0]: not an integer in [0, 4294967295]");
    mp_begin();
    msgpack_pack_map(&pk, 2);
    mp_str("model_name");
    mp_str("m");
    mp_str("model_name");
    mp_str("n");
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                         KVR_OK);
    assert_string_equal(d.err, "model_name: duplicate key");
    mp_begin();
    msgpack_pack_array(&pk, 5);
    msgpack_pack_array(&pk, 0);
    mp_str("m");
    msgpack_pack_nil(&pk);
    msgpack_pack_nil(&pk);
    mp_str("salt");
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, true, &q),
                         KVR_OK);
    assert_string_equal(d.err, "cache_salt: not accepted by /query_by_hash (block_hashes must "
                               "already include the intended cache salt)");
    mp_begin();
    msgpack_pack_array(&pk, 7);
    for (int i = 0; i < 7; i++)
        msgpack_pack_nil(&pk);
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                         KVR_OK);
    assert_string_equal(d.err, "body: an array of at most 6 fields, got 7");
    mp_begin();
    msgpack_pack_int(&pk, 3);
    msgpack_pack_int(&pk, 3);
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                         KVR_OK);
    assert_string_equal(d.err, "body: expected a MessagePack map or array, got an integer");
    /* truncated: an array announcing more ids than there are bytes */
    const uint8_t trunc[] = {0x82, 0xa9, 't', 'o', 'k',  'e',  'n',
                             '_',  'i',  'd', 's', 0xdc, 0x10, 0x00};
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, trunc, sizeof trunc, false, &q), KVR_OK);
    assert_non_null(strstr(d.err, "not valid MessagePack"));
    assert_int_not_equal(kvr_ix_mp_decode_query(&d, trunc, 0, false, &q), KVR_OK);
    assert_string_equal(d.err, "empty body");
    /* the limit */
    d.max_ids = 2;
    mp_begin();
    msgpack_pack_map(&pk, 1);
    mp_str("token_ids");
    msgpack_pack_array(&pk, 3);
    for (int i = 0; i < 3; i++)
        msgpack_pack_uint32(&pk, 1);
    assert_int_equal(kvr_ix_mp_decode_query(&d, (const uint8_t *)sb.data, sb.size, false, &q),
                     KVR_ETOOBIG);
    assert_string_equal(d.err, "token_ids: more than 2 tokens");
    kvr_ix_mp_deinit(&d);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- RouterEvent dumps ---- */

typedef struct got {
    char parts[4][64];
    uint32_t bs[4];
    size_t n_parts;
    kvr_event_t ev[8];
    kvr_block_t blocks[8][4];
    uint64_t removed[8][4];
    size_t n_ev;
} got_t;

static int on_part(void *ud, const char *key, size_t len, uint32_t bs)
{
    got_t *g = ud;
    snprintf(g->parts[g->n_parts], sizeof g->parts[0], "%.*s", (int)len, key);
    g->bs[g->n_parts++] = bs;
    return 0;
}

static int on_event(void *ud, const kvr_event_t *ev)
{
    got_t *g = ud;
    kvr_event_t *e = &g->ev[g->n_ev];
    *e = *ev;
    if (ev->n_blocks > 0) /* (NULL with none: memcpy may not be given NULL) */
        memcpy(g->blocks[g->n_ev], ev->blocks, ev->n_blocks * sizeof *ev->blocks);
    if (ev->n_removed > 0)
        memcpy(g->removed[g->n_ev], ev->removed, ev->n_removed * sizeof *ev->removed);
    e->blocks = g->blocks[g->n_ev];
    e->removed = g->removed[g->n_ev];
    g->n_ev++;
    return 0;
}

static void test_dump_round_trip(void **s)
{
    (void)s;
    kvr_block_t b[2] = {{.ext = UINT64_MAX, .lbh = 11}, {.ext = 5, .lbh = 12}};
    uint64_t rm[2] = {5, 1ull << 63};
    kvr_event_t evs[3] = {
        {.kind = KVR_EV_STORED,
         .worker = {7, 1},
         .tier = KVR_TIER_HOST,
         .event_id = 3,
         .has_parent = true,
         .parent_ext = 99,
         .blocks = b,
         .n_blocks = 2},
        {.kind = KVR_EV_REMOVED, .worker = {7, 0}, .event_id = 4, .removed = rm, .n_removed = 2},
        {.kind = KVR_EV_CLEARED, .worker = {8, 0}, .event_id = 5},
    };
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "llama:3b:default");
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "block_size");
    kvr_json_u64(&w, 32);
    kvr_json_key(&w, "events");
    kvr_json_begin_array(&w);
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvr_rev_encode(&w, &evs[i]), KVR_OK);
    kvr_json_end_array(&w);
    kvr_json_end_object(&w);
    kvr_json_key(&w, "broken:default");
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "error");
    kvr_json_string(&w, "dump failed");
    kvr_json_end_object(&w);
    kvr_json_end_object(&w);
    const char *text;
    size_t len;
    assert_int_equal(kvr_json_writer_finish(&w, &text, &len), KVR_OK);
    assert_non_null(strstr(text, "\"storage_tier\":\"host_pinned\""));
    assert_non_null(strstr(text, "\"data\":\"cleared\""));
    got_t *g = calloc(1, sizeof *g);
    kvr_rev_sink_t sink = {on_part, on_event, g};
    kvr_rev_report_t rep;
    char err[256];
    assert_int_equal(kvr_rev_decode_dump(text, len, &sink, &rep, err, sizeof err), KVR_OK);
    assert_int_equal(rep.partitions, 1);
    assert_int_equal(rep.partitions_failed, 1);
    assert_int_equal(rep.events, 3);
    assert_string_equal(g->parts[0], "llama:3b:default");
    assert_int_equal(g->bs[0], 32);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(g->ev[i].kind, evs[i].kind);
        assert_true(g->ev[i].worker.worker_id == evs[i].worker.worker_id);
        assert_int_equal(g->ev[i].worker.dp_rank, evs[i].worker.dp_rank);
        assert_int_equal(g->ev[i].tier, evs[i].tier);
        assert_true(g->ev[i].event_id == evs[i].event_id);
    }
    assert_true(g->ev[0].has_parent && g->ev[0].parent_ext == 99);
    assert_memory_equal(g->ev[0].blocks, b, sizeof b);
    assert_memory_equal(g->ev[1].removed, rm, sizeof rm);
    kvr_json_writer_deinit(&w);
    free(g);
}

static void expect_dump_error(const char *text, const char *msg)
{
    got_t *g = calloc(1, sizeof *g);
    kvr_rev_sink_t sink = {on_part, on_event, g};
    char err[256];
    assert_int_not_equal(kvr_rev_decode_dump(text, strlen(text), &sink, NULL, err, sizeof err),
                         KVR_OK);
    assert_string_equal(err, msg);
    free(g);
}

static void test_dump_errors(void **s)
{
    (void)s;
    expect_dump_error("[]", "dump: not one JSON object");
    expect_dump_error("{\"a:b\":{}} x", "dump: not one JSON object");
    expect_dump_error("{\"nocolon\":{\"block_size\":16,\"events\":[]}}",
                      "nocolon: partition key: must read <model>:<group> without escapes");
    expect_dump_error("{\"m:g\":{\"events\":[]}}", "m:g: block_size: missing");
    expect_dump_error("{\"m:g\":{\"block_size\":0,\"events\":[]}}",
                      "m:g: block_size: must be at least 1");
    expect_dump_error(
        "{\"m:g\":{\"block_size\":16,\"events\":[{\"event\":{\"data\":\"cleared\"}}]}}",
        "m:g: events[0].worker_id: missing");
    expect_dump_error("{\"m:g\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"storage_tier\":"
                      "\"tape\",\"event\":{\"data\":\"cleared\"}}]}}",
                      "m:g: events[0].storage_tier: not one of device, host_pinned, disk, "
                      "external");
    expect_dump_error("{\"m:g\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{"
                      "\"data\":{\"stored\":{\"parent_hash\":null,\"blocks\":[{\"block_hash\":1}"
                      "]}}}}]}}",
                      "m:g: events[0].event.data.stored.blocks[0].tokens_hash: missing");
    expect_dump_error("{\"m:g\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{"
                      "\"data\":{\"moved\":{}}}}]}}",
                      "m:g: events[0].event.data: none of stored, removed, \"cleared\"");
    expect_dump_error("{\"m:g\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{"
                      "\"dp_rank\":4294967296,\"data\":\"cleared\"}}]}}",
                      "m:g: events[0].event.dp_rank: not an integer in [0, 4294967295]");
}

/* ---- the answer a remote-indexer router reads, and the body it sends ---- */

static void test_answer(void **s)
{
    (void)s;
    kvr_match_t *m = NULL;
    size_t cap = 0, n = 0;
    char err[256];
    const char *a = "{\"scores\":{\"7\":{\"0\":48,\"1\":0},\"18446744073709551615\":{\"3\":16}},"
                    "\"frequencies\":[2,1,1],\"instances\":{\"7\":{\"gpu\":48}}}";
    assert_int_equal(kvr_ix_answer_parse(a, strlen(a), 16, 100, &m, &cap, &n, err, sizeof err),
                     KVR_OK);
    assert_int_equal(n, 2); /* the rank with 0 tokens holds nothing */
    assert_int_equal(m[0].worker.worker_id, 7);
    assert_int_equal(m[0].device_blocks, 3);
    assert_true(m[1].worker.worker_id == UINT64_MAX);
    assert_int_equal(m[1].worker.dp_rank, 3);
    assert_int_equal(m[1].device_blocks, 1);
    struct {
        const char *text, *msg;
        size_t max;
    } bad[] = {
        {"{\"scores\":{\"7\":{\"0\":40}}}",
         "scores: 40 tokens is not a whole number of "
         "16-token blocks (the indexer's block size differs "
         "from this router's)",
         100},
        {"{\"scores\":{\"07\":{\"0\":16}}}", "scores: a key is not an instance id in [0, 2^64)",
         100},
        {"{\"scores\":{\"7\":{\"x\":16}}}", "scores.7: a key is not a dp_rank in [0, 4294967295]",
         100},
        {"{\"scores\":{\"7\":{\"0\":-16}}}", "scores.7.0: not a token count", 100},
        {"{\"scores\":{\"7\":[]}}", "scores.7: must be an object", 100},
        {"{\"scores\":{\"7\":{\"0\":16,\"1\":16}}}", "scores: more than 1 ranks", 1},
        {"{\"error\":\"no indexer\"}", "answer: no scores member", 100},
        {"{\"scores\":{}} x", "answer: not one JSON object", 100},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_not_equal(kvr_ix_answer_parse(bad[i].text, strlen(bad[i].text), 16, bad[i].max,
                                                 &m, &cap, &n, err, sizeof err),
                             KVR_OK);
        assert_string_equal(err, bad[i].msg);
    }
    free(m);
    /* the body: hashes as i64, so the reference's indexer reads it */
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    uint64_t h[3] = {1, UINT64_MAX, (uint64_t)1 << 63};
    assert_int_equal(kvr_ix_answer_encode_query(&w, h, 3, "m", 1), KVR_OK);
    const char *text;
    size_t len;
    assert_int_equal(kvr_json_writer_finish(&w, &text, &len), KVR_OK);
    assert_string_equal(text,
                        "{\"block_hashes\":[1,-1,-9223372036854775808],\"model_name\":\"m\"}");
    kvr_ix_query_t q;
    assert_int_equal(kvr_api_decode_ix_query(dec, text, len, true, &q), KVR_OK);
    assert_memory_equal(q.hashes, h, sizeof h);
    kvr_json_writer_deinit(&w);
}

/* POST /record_routing_decision: the router's body read back, every refusal named. */
static void test_record(void **s)
{
    (void)s;
    uint64_t lbh[4] = {11, UINT64_MAX, (uint64_t)1 << 63, 42}, seq[4];
    kvr_hash_chain(lbh, 4, seq);
    kvr_ix_record_t in = {.instance_id = UINT64_MAX,
                          .dp_rank = 3,
                          .block_size = 16,
                          .local_hashes = lbh,
                          .sequence_hashes = seq,
                          .n = 4,
                          .model_name = "m",
                          .model_name_len = 1,
                          .routing_group = "g",
                          .routing_group_len = 1,
                          .kv_capacity_blocks = 16384};
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    assert_int_equal(kvr_ix_answer_encode_record(&w, &in), KVR_OK);
    const char *text;
    size_t len;
    assert_int_equal(kvr_json_writer_finish(&w, &text, &len), KVR_OK);
    assert_non_null(strstr(text, "\"local_hashes\":[11,-1,-9223372036854775808,42]"));
    for (int k = 0; k < 2; k++) {
        kvr_ix_record_t out;
        memset(&out, 0, sizeof out);
        assert_int_equal(kvr_api_decode_ix_record(k ? slow : dec, text, len, &out), KVR_OK);
        assert_true(out.instance_id == UINT64_MAX);
        assert_int_equal(out.dp_rank, 3);
        assert_int_equal(out.block_size, 16);
        assert_int_equal(out.n, 4);
        assert_memory_equal(out.local_hashes, lbh, sizeof lbh);
        assert_memory_equal(out.sequence_hashes, seq, sizeof seq);
        assert_string_equal(out.model_name, "m");
        assert_string_equal(out.routing_group, "g");
        assert_int_equal(out.kv_capacity_blocks, 16384);
    }
    kvr_json_writer_deinit(&w);
    /* defaults: dp_rank 0, routing_group "default", no block size; order does not matter */
    char body[600];
    snprintf(body, sizeof body,
             "{\"sequence_hashes\":[%llu,%llu],\"local_hashes\":[11,-1],\"model_name\":\"m\","
             "\"instance_id\":2}",
             (unsigned long long)seq[0], (unsigned long long)seq[1]);
    kvr_ix_record_t out;
    assert_int_equal(kvr_api_decode_ix_record(dec, body, strlen(body), &out), KVR_OK);
    assert_int_equal(out.n, 2);
    assert_int_equal(out.dp_rank, 0);
    assert_int_equal(out.block_size, 0);
    assert_int_equal(out.kv_capacity_blocks, 0); /* unknown: the indexer keeps a TTL alone */
    assert_string_equal(out.routing_group, "default");
    struct {
        const char *body, *msg;
    } bad[] = {
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[1]}",
         "sequence_hashes: missing"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[1],"
         "\"sequence_hashes\":[1,2]}",
         "local_hashes and sequence_hashes: 1 and 2 hashes (one pair per block)"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[],\"sequence_hashes\":[]}",
         "local_hashes: empty (a decision records at least one block)"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[1],\"sequence_hashes\":[2]}",
         "sequence_hashes[0]: does not chain from local_hashes[0] (mismatched pair)"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[1,2],"
         "\"sequence_hashes\":[1,2]}",
         "sequence_hashes[1]: does not chain from local_hashes[1] and the previous sequence hash "
         "(mismatched pair)"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[\"1\"],"
         "\"sequence_hashes\":[1]}",
         "local_hashes[0]: not an integer in [-9223372036854775808, 18446744073709551615]"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"block_size\":0,\"local_hashes\":[1],"
         "\"sequence_hashes\":[1]}",
         NULL},
        {"{\"model_name\":\"m\",\"local_hashes\":[1],\"sequence_hashes\":[1]}",
         "instance_id: missing"},
        {"{\"instance_id\":1,\"model_name\":\"m\",\"local_hashes\":[1],"
         "\"sequence_hashes\":[1],\"kv_capacity_blocks\":0}",
         "kv_capacity_blocks: not an integer in [1, 18446744073709551615]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&out, 0, sizeof out);
        assert_int_not_equal(kvr_api_decode_ix_record(dec, bad[i].body, strlen(bad[i].body), &out),
                             KVR_OK);
        if (bad[i].msg != NULL)
            assert_string_equal(kvr_api_decoder_error(dec), bad[i].msg);
        else
            assert_non_null(strstr(kvr_api_decoder_error(dec), "block_size"));
        assert_int_equal(out.n, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register),        cmocka_unit_test(test_unregister_and_peer),
        cmocka_unit_test(test_query_json),      cmocka_unit_test(test_query_msgpack),
        cmocka_unit_test(test_dump_round_trip), cmocka_unit_test(test_dump_errors),
        cmocka_unit_test(test_answer),          cmocka_unit_test(test_record),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

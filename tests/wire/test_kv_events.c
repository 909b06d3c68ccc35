/*
 * test_kv_events.c: the KV-event batch decoder and converter (wire/kv_events.c).
 *
 * - every byte-level example of docs/wire-formats.md 1.6 and 2, written here as
 *   literal bytes, decoded exactly;
 * - the fixtures of $KVR_TEST_DATA/kv_events/ (made independently by
 *   tests/tools/gen_kv_events.py with python3-msgpack): each .bin decoded and compared with its
 *   .json sidecar, and cross-checked with msgpack-c (a second, independent reader);
 * - truncation of valid batches at every byte offset, limits, reuse without growth;
 * - conversion: block size mismatch, salted and Eagle hashes equal kvr_hash_blocks(), short
 *   token_ids, removed/cleared, dp rank, repeated hashes rejected by a real index.
 */
#include <dirent.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>
#include <xxhash.h>
#include <yajl/yajl_tree.h>

#include "kvrouter.h"
#include "wire/kv_events.h"

#define U64(x) UINT64_C(x)
#define LIT(s) (const uint8_t *)(s), (sizeof(s) - 1)

static int setup(void **state)
{
    kvr_kv_events_t *d = malloc(sizeof *d);
    if (d == NULL)
        return -1;
    kvr_kv_events_init(d);
    *state = d;
    return 0;
}

static int teardown(void **state)
{
    kvr_kv_events_deinit(*state);
    free(*state);
    return 0;
}

/* Decodes a copy of the bytes in a buffer of exactly len bytes (so ASan sees over-reads). */
static int decode(kvr_kv_events_t *d, const uint8_t *bytes, size_t len)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    assert_non_null(copy);
    if (len > 0)
        memcpy(copy, bytes, len);
    int st = kvr_kv_events_decode(d, copy, len);
    free(copy);
    return st;
}

static void expect_ok(kvr_kv_events_t *d, const uint8_t *bytes, size_t len)
{
    int st = decode(d, bytes, len);
    if (st != KVR_OK)
        fail_msg("decode: %d %s", st, d->err);
    assert_string_equal(d->err, "");
}

static void expect_batch_err(kvr_kv_events_t *d, const uint8_t *bytes, size_t len, int status,
                             const char *contains)
{
    int st = decode(d, bytes, len);
    if (st != status || strstr(d->err, contains) == NULL)
        fail_msg("got %d '%s', expected %d containing '%s'", st, d->err, status, contains);
    assert_int_equal(d->n_events, 0);
    assert_null(strchr(d->err, '\n'));
}

static void expect_tokens(const kvr_kv_event_t *ev, const uint32_t *want, size_t n)
{
    assert_int_equal(ev->n_tokens, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ev->tokens[i], want[i]);
}

static void expect_event_ok(const kvr_kv_event_t *ev, kvr_kv_kind_t kind)
{
    if (ev->status != KVR_OK)
        fail_msg("event: %d %s", ev->status, ev->err);
    assert_int_equal(ev->kind, kind);
    assert_string_equal(ev->err, "");
}

static const uint32_t TOKENS4[] = {151644, 872, 198, 9064};
static const uint64_t HASH0 = U64(15760518052499183552);

/* ts 1789095808.8378847 as float64 */
#define TS_BYTES "\xcb\x41\xda\xa8\xdb\xe0\x35\x9f\xe7"
#define HASH0_BYTES "\xcf\xda\xb8\x9b\xaa\x7b\x58\x57\xc0"
#define TOKENS4_BYTES "\x94\xce\x00\x02\x50\x5c\xcd\x03\x68\xcc\xc6\xcd\x23\x68"

/* ---- docs/wire-formats.md 1.6 and 2, byte by byte------------------------------------------------ */

static void check_doc_store(const kvr_kv_events_t *d, bool dp, bool medium)
{
    assert_true(d->has_ts);
    assert_true(d->ts == 1789095808.8378847);
    assert_int_equal(d->has_dp_rank, dp);
    assert_int_equal(d->dp_rank, 0);
    assert_int_equal(d->n_events, 1);
    const kvr_kv_event_t *ev = &d->events[0];
    expect_event_ok(ev, KVR_KV_STORED);
    assert_int_equal(ev->n_hashes, 1);
    assert_true(ev->hashes[0] == HASH0);
    assert_false(ev->has_parent);
    expect_tokens(ev, TOKENS4, 4);
    assert_int_equal(ev->block_size, 4);
    assert_int_equal(ev->tier, KVR_TIER_DEVICE);
    assert_false(ev->unknown_medium);
    assert_null(ev->lora_name);
    assert_null(ev->cache_salt);
    assert_false(ev->is_eagle);
    assert_false(ev->remote);
    (void)medium;
}

static void test_doc_array7(void **state)
{
    static const char b[] =
        "\x93" TS_BYTES "\x91"
        "\x97" "\xab" "BlockStored" "\x91" HASH0_BYTES "\xc0" TOKENS4_BYTES "\x04" "\xc0"
        "\xa3" "GPU" "\x00";
    assert_int_equal(sizeof b - 1, 56);
    expect_ok(*state, LIT(b));
    check_doc_store(*state, true, true);
    assert_false(((kvr_kv_events_t *)*state)->events[0].has_group_idx);
}

static void test_doc_v090(void **state)
{
    static const uint8_t b[] = {
        0x92, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x96, 0xab, 0x42,
        0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0xcf, 0xda, 0xb8,
        0x9b, 0xaa, 0x7b, 0x58, 0x57, 0xc0, 0xc0, 0x94, 0xce, 0x00, 0x02, 0x50, 0x5c, 0xcd,
        0x03, 0x68, 0xcc, 0xc6, 0xcd, 0x23, 0x68, 0x04, 0xc0,
    };
    expect_ok(*state, b, sizeof b);
    check_doc_store(*state, false, false);
}

static void test_doc_map(void **state)
{
    static const char b[] =
        "\x93" TS_BYTES "\x91"
        "\x8b"
        "\xa4" "type" "\xab" "BlockStored"
        "\xac" "block_hashes" "\x91" HASH0_BYTES
        "\xb1" "parent_block_hash" "\xc0"
        "\xa9" "token_ids" TOKENS4_BYTES
        "\xaa" "block_size" "\x04"
        "\xa7" "lora_id" "\xc0"
        "\xa6" "medium" "\xa3" "GPU"
        "\xa9" "lora_name" "\xc0"
        "\xaa" "extra_keys" "\x91\xc0"
        "\xa9" "group_idx" "\x00"
        "\xb2" "kv_cache_spec_kind" "\xae" "full_attention"
        "\x00";
    assert_int_equal(sizeof b - 1, 197);
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    check_doc_store(d, true, true);
    assert_true(d->events[0].has_group_idx);
    assert_int_equal(d->events[0].group_idx, 0);
}

/* Removals and clears of 1.6, each wrapped in [ts, [event], 0]. */
#define REMOVED_ARRAY "\x93" "\xac" "BlockRemoved" "\x91" HASH0_BYTES "\xa3" "GPU"
#define REMOVED_MAP                                                                          \
    "\x84" "\xa4" "type" "\xac" "BlockRemoved" "\xac" "block_hashes" "\x91" HASH0_BYTES        \
    "\xa6" "medium" "\xa3" "GPU" "\xa9" "group_idx" "\x00"
#define CLEARED_ARRAY "\x91" "\xb0" "AllBlocksCleared"
#define CLEARED_MAP "\x81" "\xa4" "type" "\xb0" "AllBlocksCleared"

static void test_doc_removed_cleared(void **state)
{
    kvr_kv_events_t *d = *state;
    assert_int_equal(sizeof(REMOVED_ARRAY) - 1, 28);
    assert_int_equal(sizeof(CLEARED_ARRAY) - 1, 18);
    assert_int_equal(sizeof(CLEARED_MAP) - 1, 23);
    static const char b[] = "\x93" TS_BYTES "\x94" REMOVED_ARRAY REMOVED_MAP CLEARED_ARRAY
                            CLEARED_MAP "\x00";
    expect_ok(d, LIT(b));
    assert_int_equal(d->n_events, 4);
    for (int i = 0; i < 2; i++) {
        const kvr_kv_event_t *ev = &d->events[i];
        expect_event_ok(ev, KVR_KV_REMOVED);
        assert_int_equal(ev->n_hashes, 1);
        assert_true(ev->hashes[0] == HASH0);
        assert_int_equal(ev->tier, KVR_TIER_DEVICE);
        assert_int_equal(ev->has_group_idx, i == 1);
        assert_int_equal(ev->group_idx, 0);
        assert_int_equal(ev->n_tokens, 0);
    }
    expect_event_ok(&d->events[2], KVR_KV_CLEARED);
    expect_event_ok(&d->events[3], KVR_KV_CLEARED);
    assert_int_equal(d->counts.errors, 0);
}

static void test_doc_sglang(void **state)
{
    static const char b[] =
        "\x93" "\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00" "\x91"
        "\x98" "\xab" "BlockStored" "\x91\x7b" "\xc0" "\x92\x01\x02" "\x02" "\xc0" "\xa3" "GPU"
        "\x81" "\xaa" "cache_salt" "\xa8" "tenant-a"
        "\xc0";
    assert_int_equal(sizeof b - 1, 58);
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    assert_true(d->ts == 1.0);
    assert_false(d->has_dp_rank);
    assert_int_equal(d->n_events, 1);
    const kvr_kv_event_t *ev = &d->events[0];
    expect_event_ok(ev, KVR_KV_STORED);
    assert_int_equal(ev->n_hashes, 1);
    assert_true(ev->hashes[0] == 123);
    static const uint32_t toks[] = {1, 2};
    expect_tokens(ev, toks, 2);
    assert_int_equal(ev->block_size, 2);
    assert_null(ev->lora_name);
    assert_int_equal(ev->cache_salt_len, 8);
    assert_memory_equal(ev->cache_salt, "tenant-a", 9);
}

/* ---- encodings ------------------------------------------------------------------------------ */

static void test_block16_and_ints(void **state)
{
    /* 16 tokens: dc 00 10; token ids in every unsigned and signed width */
    static const char b[] =
        "\x93\x00\x91"
        "\x95" "\xab" "BlockStored" "\x91\x01" "\xc0"
        "\xdc\x00\x10"
        "\x00" "\x7f" "\xcc\x80" "\xcc\xff" "\xcd\x01\x00" "\xcd\xff\xff" "\xce\x00\x01\x00\x00"
        "\xce\xff\xff\xff\xff" "\xcf\x00\x00\x00\x00\xff\xff\xff\xff" "\xd0\x05" "\xd1\x01\x00"
        "\xd2\x00\x01\x00\x00" "\xd3\x00\x00\x00\x00\x00\x00\x00\x07" "\x01" "\x02" "\x03"
        "\x10"
        "\xc0";
    static const uint32_t want[16] = {0, 127, 128, 255, 256, 65535, 65536, 4294967295u,
                                      4294967295u, 5, 256, 65536, 7, 1, 2, 3};
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    assert_true(d->has_ts && d->ts == 0);
    assert_false(d->has_dp_rank);
    expect_event_ok(&d->events[0], KVR_KV_STORED);
    expect_tokens(&d->events[0], want, 16);
    assert_int_equal(d->events[0].block_size, 16);
}

static void test_hash_forms(void **state)
{
    /* negative fixint, int8..int64, uint64, 32-byte bin (last 8 BE), 1-byte bin */
    static const char b[] =
        "\x93\x00\x91"
        "\x92" "\xac" "BlockRemoved"
        "\x98" "\xff" "\xd0\x80" "\xd1\x80\x00" "\xd2\x80\x00\x00\x00"
        "\xd3\x80\x00\x00\x00\x00\x00\x00\x00" "\xcf\xff\xff\xff\xff\xff\xff\xff\xfe"
        "\xc4\x20" "AAAAAAAAAAAAAAAAAAAAAAAA" "\x01\x02\x03\x04\x05\x06\x07\x08"
        "\xc4\x01\x09"
        "\x00";
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    const kvr_kv_event_t *ev = &d->events[0];
    expect_event_ok(ev, KVR_KV_REMOVED);
    static const uint64_t want[] = {
        UINT64_MAX, (uint64_t)-128, (uint64_t)-32768, (uint64_t)-2147483648LL,
        U64(0x8000000000000000), U64(0xfffffffffffffffe), U64(0x0102030405060708), 9,
    };
    assert_int_equal(ev->n_hashes, 8);
    for (size_t i = 0; i < 8; i++)
        assert_true(ev->hashes[i] == want[i]);
}

static void test_eagle_pairs(void **state)
{
    static const char b[] =
        "\x93\x00\x91"
        "\x97" "\xab" "BlockStored" "\x91\x01" "\xc0"
        "\x94" "\x92\x0a\x0b" "\x92\x0b\x0c" "\x92\x0c\x0d" "\x92\x0d\x0e"
        "\x02" "\xc0" "\xc0" "\x00";
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    const kvr_kv_event_t *ev = &d->events[0];
    expect_event_ok(ev, KVR_KV_STORED);
    assert_true(ev->is_eagle);
    static const uint32_t want[] = {10, 11, 12, 13, 14};
    expect_tokens(ev, want, 5);
}

static void test_array_lengths(void **state)
{
    /* BlockStored of every vLLM length: [tag, [1], 2, [1,2,3,4], 4, nil, "CPU", "lora",
     * [nil], 3, "full_attention", 128, "LOCAL", extra, extra] cut to length n */
    static const char body[] =
        "\xab" "BlockStored" "\x91\x01" "\x02" "\x94\x01\x02\x03\x04" "\x04" "\xc0"
        "\xa3" "CPU" "\xa4" "lora" "\x91\xc0" "\x03" "\xae" "full_attention" "\xcc\x80"
        "\xa5" "LOCAL" "\xa1" "x" "\x90";
    static const size_t ends[] = {0, 12, 14, 15, 20, 21, 22, 26, 31, 33, 34, 49, 51, 57, 59, 60};
    kvr_kv_events_t *d = *state;
    for (size_t n = 5; n <= 15; n++) {
        uint8_t buf[128] = {0x93, 0x00, 0x91, (uint8_t)(n <= 15 ? 0x90 + n : 0)};
        size_t len = 4 + ends[n];
        memcpy(buf + 4, body, ends[n]);
        buf[len++] = 0x07;
        expect_ok(d, buf, len);
        assert_int_equal(d->dp_rank, 7);
        const kvr_kv_event_t *ev = &d->events[0];
        expect_event_ok(ev, KVR_KV_STORED);
        assert_true(ev->has_parent && ev->parent == 2);
        assert_int_equal(ev->n_tokens, 4);
        assert_int_equal(ev->tier, n >= 7 ? KVR_TIER_HOST : KVR_TIER_DEVICE);
        assert_int_equal(ev->lora_name_len, n >= 8 ? 4 : 0);
        assert_int_equal(ev->has_group_idx, n >= 10);
        assert_false(ev->remote);
    }
}

static void test_remote_locality_and_unknown_tag(void **state)
{
    static const char b[] =
        "\x93\x00\x94"
        "\x85" "\xa4" "type" "\xab" "BlockStored" "\xac" "block_hashes" "\x91\x01"
        "\xa9" "token_ids" "\x94\x01\x02\x03\x04" "\xaa" "block_size" "\x04"
        "\xa8" "locality" "\xa6" "REMOTE"
        "\x92" "\xaa" "BlockMoved" "\x91\x01"
        "\x83" "\xa4" "type" "\xac" "BlockRemoved" "\xac" "block_hashes" "\x91\x01"
        "\xa8" "locality" "\xa5" "LOCAL"
        "\x82" "\xa4" "type" "\xac" "BlockRemoved" "\xac" "block_hashes" "\x91\x01"
        "\x00";
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    assert_int_equal(d->n_events, 4);
    expect_event_ok(&d->events[0], KVR_KV_STORED);
    assert_true(d->events[0].remote);
    expect_event_ok(&d->events[1], KVR_KV_IGNORED);
    expect_event_ok(&d->events[2], KVR_KV_REMOVED);
    assert_false(d->events[2].remote);
    assert_int_equal(d->counts.remote, 1);
    assert_int_equal(d->counts.ignored, 1);
    assert_int_equal(d->counts.errors, 0);

    kvr_event_t out;
    kvr_kv_target_t t = {.worker = {.worker_id = 1}, .block_size = 4};
    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 0);
    assert_int_equal(kvr_kv_events_convert(d, 1, &t, &out), 0);
    assert_int_equal(kvr_kv_events_convert(d, 2, &t, &out), 1);
}

/* BlockRemoved position 4 (locality in vLLM, a spec kind in Dynamo's reading) holding a
 * container: all of it is skipped, the next event decodes (a fuzz find). */
static void test_removed_position4_container(void **state)
{
    static const char b[] =
        "\x93\x00\x92"
        "\x96" "\xac" "BlockRemoved" "\x91\x01" "\xa3" "GPU" "\x00" "\x92\x01\x91\x02" "\xa1" "x"
        "\x91" "\xb0" "AllBlocksCleared"
        "\x00";
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    assert_int_equal(d->n_events, 2);
    expect_event_ok(&d->events[0], KVR_KV_REMOVED);
    assert_false(d->events[0].remote);
    expect_event_ok(&d->events[1], KVR_KV_CLEARED);
}

static void test_corrupt_between_good(void **state)
{
    /* good, then token_ids holding a string, then good: the batch survives */
    static const char b[] =
        "\x93\x00\x93"
        "\x95" "\xab" "BlockStored" "\x91\x01" "\xc0" "\x92\x01\x02" "\x02"
        "\x95" "\xab" "BlockStored" "\x91\x02" "\x01" "\x92\x03" "\xa1" "x" "\x02"
        "\x95" "\xab" "BlockStored" "\x91\x03" "\x01" "\x92\x05\x06" "\x02"
        "\x00";
    kvr_kv_events_t *d = *state;
    expect_ok(d, LIT(b));
    assert_int_equal(d->n_events, 3);
    expect_event_ok(&d->events[0], KVR_KV_STORED);
    assert_int_equal(d->events[1].status, KVR_EPARSE);
    assert_int_equal(d->events[1].kind, KVR_KV_STORED);
    assert_string_equal(d->events[1].err,
                        "events[1].token_ids[1]: expected an integer, found a string");
    assert_int_equal(d->events[1].n_hashes, 0);
    assert_null(d->events[1].hashes);
    expect_event_ok(&d->events[2], KVR_KV_STORED);
    assert_true(d->events[2].hashes[0] == 3);
    static const uint32_t want[] = {5, 6};
    expect_tokens(&d->events[2], want, 2);
    assert_int_equal(d->counts.errors, 1);

    kvr_event_t out;
    kvr_kv_target_t t = {.worker = {.worker_id = 1}, .block_size = 2};
    assert_int_equal(kvr_kv_events_convert(d, 1, &t, &out), KVR_EPARSE);
    assert_string_equal(d->conv_err, d->events[1].err);
    assert_int_equal(kvr_kv_events_convert(d, 2, &t, &out), 1);
}

/* ---- batch-level errors ------------------------------------------------------------------- */

static void test_batch_errors(void **state)
{
    kvr_kv_events_t *d = *state;
    expect_batch_err(d, (const uint8_t *)"", 0, KVR_EPARSE, "empty payload");
    expect_batch_err(d, LIT("\xc1"), KVR_EPARSE, "invalid msgpack: byte 0xc1 at offset 0");
    expect_batch_err(d, LIT("\xc0"), KVR_EPARSE, "expected an array [ts, events, dp_rank] or "
                     "a map, found nil");
    expect_batch_err(d, LIT("\x90"), KVR_EPARSE, "batch: array of 0 elements");
    expect_batch_err(d, LIT("\x92\x00\xc0"), KVR_EPARSE,
                     "batch[1] (events): expected an array, found nil");
    expect_batch_err(d, LIT("\x93\x00\x90\xd0\xff"), KVR_ERANGE,
                     "batch[2] (dp_rank): expected an integer in [0, 4294967295] or nil, "
                     "found -1");
    expect_batch_err(d, LIT("\x93\x00\x90\xcf\x00\x00\x00\x01\x00\x00\x00\x00"), KVR_ERANGE,
                     "found 4294967296");
    expect_batch_err(d, LIT("\x93\x00\x90\x00\x00"), KVR_EPARSE,
                     "trailing bytes: 1 after the batch, from offset 4");
    expect_batch_err(d, LIT("\x92\x00\xdd\xff\xff\xff\xff\x00"), KVR_EPARSE, "truncated");
    expect_batch_err(d, LIT("\x92\x00\x91\xdb\xff\xff\xff\xff"), KVR_EPARSE,
                     "truncated: the value at offset 3 (in events[0]) runs past the end");
    expect_batch_err(d, LIT("\x81\xa2ts\x00"), KVR_EPARSE, "map without an \"events\" key");
    expect_batch_err(d, LIT("\x82\xa6" "events\x90\xa6" "events\x90"), KVR_EPARSE,
                     "batch: duplicate key \"events\"");
    assert_int_equal(kvr_kv_events_decode(d, NULL, 3), KVR_EINVAL);
    assert_true(d->stats.batch_errors >= 13);
}

/* Every strict prefix of a valid batch is a batch error, never a crash or an over-read. */
static void truncate_everywhere(kvr_kv_events_t *d, const uint8_t *b, size_t len)
{
    expect_ok(d, b, len);
    for (size_t cut = 0; cut < len; cut++) {
        int st = decode(d, b, cut);
        if (st != KVR_EPARSE)
            fail_msg("prefix of %zu/%zu bytes: %d '%s'", cut, len, st, d->err);
        assert_int_equal(d->n_events, 0);
        assert_true(d->err[0] != '\0');
    }
}

static void test_truncated_everywhere(void **state)
{
    static const char doc_map[] =
        "\x93" TS_BYTES "\x92"
        "\x8b" "\xa4" "type" "\xab" "BlockStored" "\xac" "block_hashes" "\x91" HASH0_BYTES
        "\xb1" "parent_block_hash" "\xc0" "\xa9" "token_ids" TOKENS4_BYTES
        "\xaa" "block_size" "\x04" "\xa7" "lora_id" "\xc0" "\xa6" "medium" "\xa3" "GPU"
        "\xa9" "lora_name" "\xc0" "\xaa" "extra_keys" "\x91\xc0" "\xa9" "group_idx" "\x00"
        "\xb2" "kv_cache_spec_kind" "\xae" "full_attention"
        "\x98" "\xab" "BlockStored" "\x91\xd3\x80\x00\x00\x00\x00\x00\x00\x01" "\xc4\x02\x01\x02"
        "\x92\x92\x01\x02\x92\x02\x03" "\x01" "\xc0" "\xa3" "GPU"
        "\x82" "\xaa" "cache_salt" "\xa1" "s" "\xaa" "session_id" "\xa2" "ab"
        "\x00";
    truncate_everywhere(*state, LIT(doc_map));
}

/* Nesting: msgpack-c opens at most 32 containers; the decoder draws the same line (inside an
 * unknown map key, where nothing else limits depth) and agrees with msgpack-c on each side. */
static void test_depth_matches_msgpack_c(void **state)
{
    kvr_kv_events_t *d = *state;
    static const char head[] = "\x93\x00\x91" "\x82" "\xa4" "type" "\xa3" "Foo" "\xa1" "x";
    uint8_t buf[128];
    for (size_t k = 20; k <= 40; k++) {
        size_t len = sizeof head - 1;
        memcpy(buf, head, len);
        memset(buf + len, 0x91, k);  /* k nested arrays around a nil */
        len += k;
        buf[len++] = 0xc0;
        buf[len++] = 0x00;
        int st = decode(d, buf, len);
        msgpack_zone z;
        assert_true(msgpack_zone_init(&z, 4096));
        msgpack_object root;
        size_t off = 0;
        int mrc = msgpack_unpack((const char *)buf, len, &off, &z, &root);
        msgpack_zone_destroy(&z);
        assert_int_equal(st == KVR_OK, mrc == MSGPACK_UNPACK_SUCCESS);
        if (k <= 29) {  /* 3 open around the value: 29 more make 32 */
            assert_int_equal(st, KVR_OK);
            expect_event_ok(&d->events[0], KVR_KV_IGNORED);
        } else {
            assert_int_equal(st, KVR_EPARSE);
            assert_non_null(strstr(d->err, "nested deeper than 32 levels"));
        }
    }
}

/* ---- limits and reuse ------------------------------------------------------------------- */

static void test_limits(void **state)
{
    kvr_kv_events_t *d = *state;
    static const char b[] =
        "\x93\x00\x92"
        "\x95" "\xab" "BlockStored" "\x93\x01\x02\x03" "\xc0" "\x96\x01\x02\x03\x04\x05\x06"
        "\x02"
        "\x91" "\xb0" "AllBlocksCleared"
        "\x00";
    d->limits.max_tokens = 5;
    expect_ok(d, LIT(b));
    assert_int_equal(d->events[0].status, KVR_ETOOBIG);
    assert_string_equal(d->events[0].err,
                        "events[0].token_ids: 6 tokens exceed the limit of 5 (max_tokens)");
    expect_event_ok(&d->events[1], KVR_KV_CLEARED);
    d->limits.max_tokens = KVR_KV_MAX_TOKENS;

    d->limits.max_hashes = 2;
    expect_ok(d, LIT(b));
    assert_string_equal(d->events[0].err,
                        "events[0].block_hashes: 3 hashes exceed the limit of 2 (max_hashes)");
    d->limits.max_hashes = KVR_KV_MAX_HASHES;

    d->limits.max_events = 1;
    expect_batch_err(d, LIT(b), KVR_ETOOBIG,
                     "batch[1] (events): 2 events exceed the limit of 1 (max_events)");
    d->limits.max_events = KVR_KV_MAX_EVENTS;

    d->limits.max_payload_bytes = 10;
    expect_batch_err(d, LIT(b), KVR_ETOOBIG, "exceeds the limit of 10 (max_payload_bytes)");
    d->limits.max_payload_bytes = KVR_KV_MAX_PAYLOAD_BYTES;
    expect_ok(d, LIT(b));
}

static void test_reuse_no_growth(void **state)
{
    kvr_kv_events_t *d = *state;
    static const char big[] =
        "\x93\x00\x92"
        "\x95" "\xab" "BlockStored" "\x92\x01\x02" "\xc0" "\x98\x01\x02\x03\x04\x05\x06\x07\x08"
        "\x04"
        "\x97" "\xab" "BlockStored" "\x91\x03" "\x02" "\x94\x01\x02\x03\x04" "\x04" "\xc0"
        "\xa4" "DISK"
        "\x00";
    kvr_kv_target_t t = {.worker = {.worker_id = 9, .dp_rank = 5}, .block_size = 4};
    kvr_event_t out;
    expect_ok(d, LIT(big));
    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 1);
    const void *ev = d->events, *tok = d->tok_buf, *hash = d->hash_buf, *blk = d->blk_buf;
    size_t caps[4] = {d->ev_cap, d->tok_cap, d->hash_cap, d->blk_cap};
    for (int i = 0; i < 100; i++) {
        expect_ok(d, LIT(big));
        assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 1);
        assert_int_equal(kvr_kv_events_convert(d, 1, &t, &out), 1);
        assert_int_equal(out.tier, KVR_TIER_DISK);
    }
    assert_ptr_equal(ev, d->events);
    assert_ptr_equal(tok, d->tok_buf);
    assert_ptr_equal(hash, d->hash_buf);
    assert_ptr_equal(blk, d->blk_buf);
    size_t now[4] = {d->ev_cap, d->tok_cap, d->hash_cap, d->blk_cap};
    assert_memory_equal(caps, now, sizeof caps);
}

static void test_tier_mapping(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        kvr_tier_t tier;
        bool known;
    } cases[] = {
        {"GPU", KVR_TIER_DEVICE, true}, {"device", KVR_TIER_DEVICE, true},
        {"", KVR_TIER_DEVICE, true}, {"CPU", KVR_TIER_HOST, true},
        {"CPU_PINNED", KVR_TIER_HOST, true}, {"cpu_tier1", KVR_TIER_HOST, true},
        {"CPU_TIER2", KVR_TIER_DISK, true}, {"DISK", KVR_TIER_DISK, true},
        {"NVME", KVR_TIER_DISK, true}, {"STORAGE", KVR_TIER_DISK, true},
        {"FS", KVR_TIER_DISK, true}, {"OBJ", KVR_TIER_DISK, true},
        {"EXTERNAL", KVR_TIER_EXTERNAL, true}, {"NETWORK", KVR_TIER_EXTERNAL, true},
        {"REMOTE", KVR_TIER_EXTERNAL, true}, {"SHARED", KVR_TIER_EXTERNAL, true},
        {"TAPE", KVR_TIER_DEVICE, false}, {"GPU ", KVR_TIER_DEVICE, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bool known = !cases[i].known;
        kvr_tier_t t = kvr_kv_tier_from_medium(cases[i].s, strlen(cases[i].s), &known);
        if (t != cases[i].tier || known != cases[i].known)
            fail_msg("%s: tier %d known %d", cases[i].s, t, known);
    }
    bool known = false;
    assert_int_equal(kvr_kv_tier_from_medium(NULL, 0, &known), KVR_TIER_DEVICE);
    assert_true(known);
}

/* ---- conversion --------------------------------------------------------------------------- */

static void test_convert_stored(void **state)
{
    kvr_kv_events_t *d = *state;
    /* 2 blocks of 4, LoRA name and a vLLM cache_salt, a parent, batch dp rank 3 */
    static const char b[] =
        "\x93\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91"
        "\x88" "\xa4" "type" "\xab" "BlockStored" "\xac" "block_hashes" "\x92\x0b\x0c"
        "\xb1" "parent_block_hash" "\x0a" "\xa9" "token_ids" "\x98\x00\x01\x02\x03\x04\x05\x06\x07"
        "\xaa" "block_size" "\x04" "\xa6" "medium" "\xa3" "CPU"
        "\xa9" "lora_name" "\xa9" "adapter-a" "\xaa" "cache_salt" "\xa8" "tenant-a"
        "\x03";
    expect_ok(d, LIT(b));
    kvr_kv_target_t t = {.worker = {.worker_id = 42, .dp_rank = 0}, .block_size = 4,
                         .event_id = 77};
    kvr_event_t out;
    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 1);
    assert_string_equal(d->conv_err, "");
    assert_int_equal(out.kind, KVR_EV_STORED);
    assert_true(out.worker.worker_id == 42);
    assert_int_equal(out.worker.dp_rank, 3);  /* the batch's rank wins */
    assert_true(out.event_id == 77);
    assert_int_equal(out.tier, KVR_TIER_HOST);
    assert_true(out.has_parent);
    assert_true(out.parent_ext == 10);
    assert_int_equal(out.n_blocks, 2);

    static const uint32_t toks[] = {0, 1, 2, 3, 4, 5, 6, 7};
    kvr_hash_opts_t opts = {.lora_name = "adapter-a", .lora_name_len = 9,
                            .cache_namespace = "tenant-a", .cache_namespace_len = 8};
    uint64_t lbh[2];
    assert_int_equal(kvr_hash_blocks(toks, 8, 4, &opts, lbh, 2), 2);
    assert_true(out.blocks[0].ext == 11 && out.blocks[0].lbh == lbh[0]);
    assert_true(out.blocks[1].ext == 12 && out.blocks[1].lbh == lbh[1]);
    /* docs/wire-formats.md 4: salt(ns="tenant-a", lora="adapter-a") / lbh0 */
    assert_true(lbh[0] == U64(8269515957840517240));
    uint64_t plain[2];
    assert_int_equal(kvr_hash_blocks(toks, 8, 4, NULL, plain, 2), 2);
    assert_true(plain[0] != lbh[0]);

    /* the router's block size differs: nothing produced */
    t.block_size = 16;
    uint64_t before = d->stats.convert_mismatch;
    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), KVR_EMISMATCH);
    assert_string_equal(d->conv_err, "events[0]: block_size 4 differs from the router's 16");
    assert_true(d->stats.convert_mismatch == before + 1);
    t.block_size = 0;
    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), KVR_EINVAL);
    t.block_size = 4;
    assert_int_equal(kvr_kv_events_convert(d, 1, &t, &out), KVR_EINVAL);
}

static void test_convert_sglang_salt_eagle_short(void **state)
{
    kvr_kv_events_t *d = *state;
    static const char b[] =
        "\x93\x00\x93"
        /* SGLang metadata salt, page size 2 */
        "\x98" "\xab" "BlockStored" "\x91\xff" "\xc0" "\x92\x05\x06" "\x02" "\xc0" "\xa3" "GPU"
        "\x81" "\xaa" "cache_salt" "\xa8" "tenant-a"
        /* Eagle: 2 blocks of 2 from 5 tokens */
        "\x95" "\xab" "BlockStored" "\x92\x01\x02" "\xc0"
        "\x94\x92\x00\x01\x92\x01\x02\x92\x02\x03\x92\x03\x04" "\x02"
        /* 2 blocks of 2 with only 3 tokens */
        "\x95" "\xab" "BlockStored" "\x92\x01\x02" "\xc0" "\x93\x00\x01\x02" "\x02"
        "\xc0";
    expect_ok(d, LIT(b));
    kvr_kv_target_t t = {.worker = {.worker_id = 1, .dp_rank = 6}, .block_size = 2};
    kvr_event_t out;

    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 1);
    assert_int_equal(out.worker.dp_rank, 6);  /* batch rank nil: the configured one */
    assert_false(out.has_parent);
    assert_true(out.blocks[0].ext == UINT64_MAX);
    static const uint32_t t56[] = {5, 6};
    kvr_hash_opts_t salt = {.cache_namespace = "tenant-a", .cache_namespace_len = 8};
    uint64_t lbh[2];
    assert_int_equal(kvr_hash_blocks(t56, 2, 2, &salt, lbh, 1), 1);
    assert_true(out.blocks[0].lbh == lbh[0]);

    assert_int_equal(kvr_kv_events_convert(d, 1, &t, &out), 1);
    static const uint32_t t5[] = {0, 1, 2, 3, 4};
    kvr_hash_opts_t eagle = {.is_eagle = true};
    assert_int_equal(kvr_hash_blocks(t5, 5, 2, &eagle, lbh, 2), 2);
    assert_true(out.blocks[0].lbh == lbh[0] && out.blocks[1].lbh == lbh[1]);
    /* docs/wire-formats.md 4: Eagle bs=2 tokens 0..5 -> windows [0,1,2],[2,3,4] */
    assert_true(lbh[0] == U64(11646242937812223497));
    assert_true(lbh[1] == U64(9948816348502404300));

    assert_int_equal(kvr_kv_events_convert(d, 2, &t, &out), KVR_ERANGE);
    assert_string_equal(d->conv_err, "events[2]: token_ids has 3 tokens, 2 blocks of 2 need 4");
    assert_true(d->stats.convert_short_tokens >= 1);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* vLLM's extra_keys, read as the reference reads them: a 64-digit hex digest (bare) or any
 * identifier tagged with an offset is a multimodal object of its block; the LoRA name and
 * other bare strings are not; "dynamo-cache-salt:NAME" in the first block is the namespace. */
static void test_convert_extra_keys(void **state)
{
    kvr_kv_events_t *d = *state;
    static const char digest[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 9);
    pack_str(&pk, "BlockStored");
    msgpack_pack_array(&pk, 3);
    for (int k = 1; k <= 3; k++)
        msgpack_pack_uint64(&pk, (uint64_t)k);
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 6);
    for (uint32_t k = 0; k < 6; k++)
        msgpack_pack_uint32(&pk, 100 + k);
    msgpack_pack_uint32(&pk, 2);
    msgpack_pack_nil(&pk);
    pack_str(&pk, "GPU");
    pack_str(&pk, "sql");
    msgpack_pack_array(&pk, 3); /* extra_keys */
    msgpack_pack_array(&pk, 2);
    pack_str(&pk, "sql");
    pack_str(&pk, "dynamo-cache-salt:t1");
    msgpack_pack_array(&pk, 2);
    pack_str(&pk, digest);
    msgpack_pack_bin(&pk, 3);
    msgpack_pack_bin_body(&pk, "emb", 3);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_array(&pk, 2);
    pack_str(&pk, "opaque-img");
    msgpack_pack_int(&pk, -3);
    pack_str(&pk, "sql");
    pack_str(&pk, "not-a-digest");
    msgpack_pack_nil(&pk);
    expect_ok(d, (const uint8_t *)sb.data, sb.size);
    assert_int_equal(d->events[0].n_extra_keys, 6);
    kvr_kv_target_t t = {.worker = {.worker_id = 1}, .block_size = 2};
    kvr_event_t out;
    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 1);
    uint64_t img = XXH3_64bits_withSeed("opaque-img", 10, 0), dig = U64(0x0123456789abcdef);
    kvr_block_mm_t mm[2] = {{1, &dig, 1}, {2, &img, 1}};
    kvr_hash_opts_t o = {.lora_name = "sql",
                         .lora_name_len = 3,
                         .cache_namespace = "t1",
                         .cache_namespace_len = 2,
                         .mm = mm,
                         .n_mm = 2};
    static const uint32_t toks[] = {100, 101, 102, 103, 104, 105};
    uint64_t lbh[3];
    assert_int_equal(kvr_hash_blocks(toks, 6, 2, &o, lbh, 3), 3);
    for (int k = 0; k < 3; k++)
        assert_true(out.blocks[k].lbh == lbh[k]);
    /* the images mattered: without them block 1 would hash otherwise */
    o.n_mm = 0;
    assert_int_equal(kvr_hash_blocks(toks, 6, 2, &o, lbh, 3), 3);
    assert_true(out.blocks[0].lbh == lbh[0] && out.blocks[1].lbh != lbh[1]);
    msgpack_sbuffer_destroy(&sb);
}

static void test_convert_removed_cleared_and_index(void **state)
{
    kvr_kv_events_t *d = *state;
    /* stored [1,2] (4 tokens, bs 2); stored whose hash repeats; stored equal to its parent;
     * removed [2] on the device; cleared */
    static const char b[] =
        "\x93\x00\x95"
        "\x95" "\xab" "BlockStored" "\x92\x01\x02" "\xc0" "\x94\x01\x02\x03\x04" "\x02"
        "\x95" "\xab" "BlockStored" "\x92\x05\x05" "\x02" "\x94\x05\x06\x07\x08" "\x02"
        "\x95" "\xab" "BlockStored" "\x91\x02" "\x02" "\x92\x05\x06" "\x02"
        "\x93" "\xac" "BlockRemoved" "\x91\x02" "\xa3" "GPU"
        "\x91" "\xb0" "AllBlocksCleared"
        "\x01";
    expect_ok(d, LIT(b));
    int st;
    kvr_index_config_t cfg = {.sync = KVR_SYNC_NONE};
    kvr_index_t *ix = kvr_index_new(&cfg, &st);
    assert_non_null(ix);
    kvr_kv_target_t t = {.worker = {.worker_id = 3}, .block_size = 2};
    kvr_worker_t w = {.worker_id = 3, .dp_rank = 1};
    kvr_event_t out;

    assert_int_equal(kvr_kv_events_convert(d, 0, &t, &out), 1);
    assert_int_equal(kvr_index_apply(ix, &out), KVR_OK);
    assert_int_equal(kvr_index_holds(ix, w, 2), 1u << KVR_TIER_DEVICE);

    /* the prompt 1 2 3 4 hashed by the request path finds both blocks on this rank */
    static const uint32_t prompt[] = {1, 2, 3, 4, 9};
    uint64_t lbh[2], seq[2];
    assert_int_equal(kvr_hash_prompt(prompt, 5, 2, NULL, lbh, seq, 2), 2);
    kvr_lookup_t lk;
    kvr_lookup_init(&lk);
    assert_int_equal(kvr_index_lookup(ix, seq, 2, &lk), KVR_OK);
    assert_int_equal(lk.n_matches, 1);
    assert_int_equal(lk.matches[0].device_blocks, 2);
    kvr_lookup_deinit(&lk);

    assert_int_equal(kvr_kv_events_convert(d, 1, &t, &out), 1);  /* passed through */
    assert_int_equal(kvr_index_apply(ix, &out), KVR_EBLOCKSEQ);
    assert_int_equal(kvr_kv_events_convert(d, 2, &t, &out), 1);
    assert_int_equal(kvr_index_apply(ix, &out), KVR_EBLOCKSEQ);

    assert_int_equal(kvr_kv_events_convert(d, 3, &t, &out), 1);
    assert_int_equal(out.kind, KVR_EV_REMOVED);
    assert_int_equal(out.n_removed, 1);
    assert_true(out.removed[0] == 2);
    assert_int_equal(kvr_index_apply(ix, &out), KVR_OK);
    assert_int_equal(kvr_index_holds(ix, w, 2), 0);
    assert_int_equal(kvr_index_holds(ix, w, 1), 1u << KVR_TIER_DEVICE);

    assert_int_equal(kvr_kv_events_convert(d, 4, &t, &out), 1);
    assert_int_equal(out.kind, KVR_EV_CLEARED);
    assert_int_equal(kvr_index_apply(ix, &out), KVR_OK);
    assert_int_equal(kvr_index_worker_pairs(ix, w), 0);
    char msg[256];
    assert_int_equal(kvr_index_verify(ix, msg, sizeof msg), KVR_OK);
    kvr_index_free(ix);
}

/* ---- fixtures ------------------------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            assert_non_null(buf);
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static yajl_val key(yajl_val obj, const char *name)
{
    const char *path[] = {name, NULL};
    return yajl_tree_get(obj, path, yajl_t_any);
}

static const char *str_of(yajl_val v)
{
    return YAJL_IS_STRING(v) ? YAJL_GET_STRING(v) : NULL;
}

static uint64_t u64_of(yajl_val v)
{
    const char *s = str_of(v);
    assert_non_null(s);
    return strtoull(s, NULL, 10);
}

static long long int_of(yajl_val v)
{
    assert_true(YAJL_IS_INTEGER(v));
    return YAJL_GET_INTEGER(v);
}

static void expect_name(const char *name, yajl_val want, const char *got, size_t got_len)
{
    if (YAJL_IS_NULL(want) || want == NULL) {
        if (got != NULL)
            fail_msg("%s: got '%s', expected none", name, got);
        return;
    }
    const char *w = str_of(want);
    if (got == NULL || strlen(w) != got_len || memcmp(w, got, got_len) != 0)
        fail_msg("%s: got '%s', expected '%s'", name, got ? got : "(none)", w);
}

static const char *const KIND_NAMES[] = {"stored", "removed", "cleared", "ignored"};
static const char *const TIER_NAMES[] = {"device", "host", "disk", "external"};

static void check_event(const char *file, size_t i, const kvr_kv_event_t *ev, yajl_val want)
{
    const char *kind = str_of(key(want, "kind"));
    if (strcmp(KIND_NAMES[ev->kind], kind) != 0)
        fail_msg("%s events[%zu]: kind %s, expected %s (%s)", file, i, KIND_NAMES[ev->kind],
                 kind, ev->err);
    const char *status = str_of(key(want, "status"));
    if (strcmp(status, "error") == 0) {
        const char *contains = str_of(key(want, "error_contains"));
        if (ev->status == KVR_OK || strstr(ev->err, contains) == NULL)
            fail_msg("%s events[%zu]: status %d '%s', expected an error containing '%s'",
                     file, i, ev->status, ev->err, contains);
        return;
    }
    if (ev->status != KVR_OK)
        fail_msg("%s events[%zu]: %s", file, i, ev->err);
    if (ev->kind == KVR_KV_IGNORED)
        return;
    yajl_val hashes = key(want, "hashes");
    assert_int_equal(ev->n_hashes, YAJL_GET_ARRAY(hashes)->len);
    for (size_t k = 0; k < ev->n_hashes; k++) {
        if (ev->hashes[k] != u64_of(YAJL_GET_ARRAY(hashes)->values[k]))
            fail_msg("%s events[%zu].hashes[%zu]: %" PRIu64, file, i, k, ev->hashes[k]);
    }
    yajl_val parent = key(want, "parent");
    assert_int_equal(ev->has_parent, !YAJL_IS_NULL(parent));
    if (ev->has_parent)
        assert_true(ev->parent == u64_of(parent));
    yajl_val tokens = key(want, "tokens");
    assert_int_equal(ev->n_tokens, YAJL_GET_ARRAY(tokens)->len);
    for (size_t k = 0; k < ev->n_tokens; k++) {
        if (ev->tokens[k] != (uint32_t)int_of(YAJL_GET_ARRAY(tokens)->values[k]))
            fail_msg("%s events[%zu].tokens[%zu]: %" PRIu32, file, i, k, ev->tokens[k]);
    }
    assert_int_equal(ev->block_size, int_of(key(want, "block_size")));
    if (strcmp(TIER_NAMES[ev->tier], str_of(key(want, "tier"))) != 0)
        fail_msg("%s events[%zu]: tier %s", file, i, TIER_NAMES[ev->tier]);
    assert_int_equal(ev->unknown_medium, YAJL_IS_TRUE(key(want, "unknown_medium")));
    assert_int_equal(ev->is_eagle, YAJL_IS_TRUE(key(want, "is_eagle")));
    assert_int_equal(ev->remote, YAJL_IS_TRUE(key(want, "remote")));
    yajl_val group = key(want, "group_idx");
    assert_int_equal(ev->has_group_idx, !YAJL_IS_NULL(group));
    if (ev->has_group_idx)
        assert_int_equal(ev->group_idx, int_of(group));
    expect_name("lora_name", key(want, "lora_name"), ev->lora_name, ev->lora_name_len);
    expect_name("cache_salt", key(want, "cache_salt"), ev->cache_salt, ev->cache_salt_len);
}

/* msgpack-c, read independently, agrees on the outline: valid msgpack, same event count,
 * same token count for positional BlockStored events. */
static void cross_check_msgpack_c(const char *file, const kvr_kv_events_t *d, const char *buf,
                                  size_t len)
{
    msgpack_zone z;
    assert_true(msgpack_zone_init(&z, 4096));
    msgpack_object root;
    size_t off = 0;
    int rc = msgpack_unpack(buf, len, &off, &z, &root);
    if (rc != MSGPACK_UNPACK_SUCCESS)
        fail_msg("%s: msgpack-c says %d", file, rc);
    const msgpack_object *events = NULL;
    if (root.type == MSGPACK_OBJECT_ARRAY) {
        events = &root.via.array.ptr[1];
    } else {
        for (uint32_t i = 0; i < root.via.map.size; i++) {
            const msgpack_object *k = &root.via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == 6 &&
                memcmp(k->via.str.ptr, "events", 6) == 0)
                events = &root.via.map.ptr[i].val;
        }
    }
    assert_non_null(events);
    assert_int_equal(events->via.array.size, d->n_events);
    for (size_t i = 0; i < d->n_events; i++) {
        const msgpack_object *e = &events->via.array.ptr[i];
        const kvr_kv_event_t *ev = &d->events[i];
        if (ev->status != KVR_OK || ev->kind != KVR_KV_STORED || ev->is_eagle ||
            e->type != MSGPACK_OBJECT_ARRAY)
            continue;
        const msgpack_object *toks = &e->via.array.ptr[3];
        assert_int_equal(toks->via.array.size, ev->n_tokens);
        for (size_t k = 0; k < ev->n_tokens; k++)
            assert_true(toks->via.array.ptr[k].via.u64 == ev->tokens[k]);
    }
    msgpack_zone_destroy(&z);
}

static void check_fixture(kvr_kv_events_t *d, const char *dir, const char *stem)
{
    char path[2048];
    size_t jlen, blen;
    snprintf(path, sizeof path, "%s/%s.json", dir, stem);
    char *json = read_file(path, &jlen);
    if (json == NULL)
        fail_msg("cannot read %s", path);
    snprintf(path, sizeof path, "%s/%s.bin", dir, stem);
    char *bin = read_file(path, &blen);
    if (bin == NULL)
        fail_msg("cannot read %s", path);
    char yerr[256];
    yajl_val want = yajl_tree_parse(json, yerr, sizeof yerr);
    if (want == NULL)
        fail_msg("%s.json: %s", stem, yerr);

    int st = decode(d, (const uint8_t *)bin, blen);
    const char *status = str_of(key(want, "status"));
    if (strcmp(status, "error") == 0) {
        const char *contains = str_of(key(want, "error_contains"));
        if (st == KVR_OK || strstr(d->err, contains) == NULL)
            fail_msg("%s: got %d '%s', expected an error containing '%s'", stem, st, d->err,
                     contains);
    } else {
        if (st != KVR_OK)
            fail_msg("%s: %d %s", stem, st, d->err);
        yajl_val ts = key(want, "ts");
        assert_int_equal(d->has_ts, !YAJL_IS_NULL(ts));
        if (d->has_ts && d->ts != YAJL_GET_DOUBLE(ts))
            fail_msg("%s: ts %.17g", stem, d->ts);
        yajl_val rank = key(want, "dp_rank");
        assert_int_equal(d->has_dp_rank, !YAJL_IS_NULL(rank));
        if (d->has_dp_rank)
            assert_int_equal(d->dp_rank, int_of(rank));
        yajl_val events = key(want, "events");
        if (d->n_events != YAJL_GET_ARRAY(events)->len)
            fail_msg("%s: %zu events, expected %zu", stem, d->n_events,
                     YAJL_GET_ARRAY(events)->len);
        for (size_t i = 0; i < d->n_events; i++)
            check_event(stem, i, &d->events[i], YAJL_GET_ARRAY(events)->values[i]);
        cross_check_msgpack_c(stem, d, bin, blen);
        if (blen < 4096)
            truncate_everywhere(d, (const uint8_t *)bin, blen);
    }
    yajl_tree_free(want);
    free(json);
    free(bin);
}

static void test_fixtures(void **state)
{
    const char *data = getenv("KVR_TEST_DATA");
    char dir[900];
    snprintf(dir, sizeof dir, "%s/kv_events", data != NULL ? data : "tests/data");
    DIR *dh = opendir(dir);
    if (dh == NULL)
        fail_msg("cannot open %s (set KVR_TEST_DATA)", dir);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dh)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        char stem[256];
        snprintf(stem, sizeof stem, "%.*s", (int)(len - 5), de->d_name);
        check_fixture(*state, dir, stem);
        n++;
    }
    closedir(dh);
    assert_true(n >= 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_doc_array7, setup, teardown),
        cmocka_unit_test_setup_teardown(test_doc_v090, setup, teardown),
        cmocka_unit_test_setup_teardown(test_doc_map, setup, teardown),
        cmocka_unit_test_setup_teardown(test_doc_removed_cleared, setup, teardown),
        cmocka_unit_test_setup_teardown(test_doc_sglang, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block16_and_ints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash_forms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eagle_pairs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_array_lengths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_locality_and_unknown_tag, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_position4_container, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_between_good, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_everywhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_depth_matches_msgpack_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_no_growth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tier_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert_stored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert_sglang_salt_eagle_short, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert_extra_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert_removed_cleared_and_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fixtures, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

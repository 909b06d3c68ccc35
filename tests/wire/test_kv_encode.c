/*
 * test_kv_encode.c: the KV-event batch encoder (wire/kv_encode.c).
 *
 * - every byte-level example of docs/wire-formats.md 1.6 and 2, written here as
 *   literal bytes, produced exactly (compared byte for byte);
 * - msgspec's smallest-encoding boundaries (ints, negative SGLang hashes, str8/str16, array16)
 *   and the array lengths of each vLLM era;
 * - random batches of every format (and per-page) decoded back by kvr_kv_events_decode() with
 *   every field compared; the seed is printed on failure;
 * - misuse (fields a format cannot carry, no batch) rejected without changing the batch, and
 *   the buffer reused without reallocation once warm.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/kv_encode.h"
#include "wire/kv_events.h"

#define U64(x) UINT64_C(x)
#define LIT(s) (const uint8_t *)(s), (sizeof(s) - 1)

static const double TS = 1789095808.8378847;
static const uint32_t TOKENS4[] = {151644, 872, 198, 9064};
static const uint64_t HASH0 = U64(15760518052499183552);

#define TS_BYTES "\xcb\x41\xda\xa8\xdb\xe0\x35\x9f\xe7"
#define HASH0_BYTES "\xcf\xda\xb8\x9b\xaa\x7b\x58\x57\xc0"
#define TOKENS4_BYTES "\x94\xce\x00\x02\x50\x5c\xcd\x03\x68\xcc\xc6\xcd\x23\x68"

static kvr_kv_enc_t *enc_new(kvr_kv_format_t f, bool per_page)
{
    kvr_kv_enc_config_t cfg = {.format = f, .per_page = per_page};
    int st = -1;
    kvr_kv_enc_t *e = kvr_kv_enc_new(&cfg, &st);
    assert_non_null(e);
    assert_int_equal(st, KVR_OK);
    return e;
}

/* Compares bytes, printing both in hex from the first difference on failure. */
static void expect_bytes(const uint8_t *got, size_t got_len, const uint8_t *want, size_t want_len)
{
    size_t i = 0;
    while (i < got_len && i < want_len && got[i] == want[i])
        i++;
    if (i == got_len && i == want_len)
        return;
    char g[200] = "", w[200] = "";
    for (size_t k = i; k < i + 16 && k < got_len; k++)
        snprintf(g + strlen(g), sizeof g - strlen(g), "%02x ", got[k]);
    for (size_t k = i; k < i + 16 && k < want_len; k++)
        snprintf(w + strlen(w), sizeof w - strlen(w), "%02x ", want[k]);
    fail_msg("bytes differ at offset %zu (lengths %zu, want %zu):\n got  %s\n want %s", i,
             got_len, want_len, g, w);
}

static void expect_batch(kvr_kv_enc_t *e, const uint8_t *want, size_t want_len)
{
    const uint8_t *b = NULL;
    size_t n = 0;
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
    expect_bytes(b, n, want, want_len);
}

static kvr_kv_enc_stored_t doc_store(void)
{
    return (kvr_kv_enc_stored_t){.hashes = &HASH0, .n_hashes = 1, .tokens = TOKENS4, .n_tokens = 4,
                                 .block_size = 4, .medium = "GPU"};
}

/* ---- docs/wire-formats.md 1.6 and 2, byte by byte------------------------------------------------ */

static void test_doc_array7(void **state)
{
    (void)state;
    static const char want[] =
        "\x93" TS_BYTES "\x91"
        "\x97" "\xab" "BlockStored" "\x91" HASH0_BYTES "\xc0" TOKENS4_BYTES "\x04" "\xc0"
        "\xa3" "GPU" "\x00";
    assert_int_equal(sizeof want - 1, 56);
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_VLLM_ARRAY, false);
    kvr_kv_enc_stored_t s = doc_store();
    assert_int_equal(kvr_kv_enc_begin_batch(e, TS, true, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    assert_int_equal(kvr_kv_enc_n_events(e), 1);
    expect_batch(e, LIT(want));
    kvr_kv_enc_free(e);
}

static void test_doc_v090(void **state)
{
    (void)state;
    static const uint8_t want[] = {
        0x92, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x96, 0xab, 0x42,
        0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0xcf, 0xda, 0xb8,
        0x9b, 0xaa, 0x7b, 0x58, 0x57, 0xc0, 0xc0, 0x94, 0xce, 0x00, 0x02, 0x50, 0x5c, 0xcd,
        0x03, 0x68, 0xcc, 0xc6, 0xcd, 0x23, 0x68, 0x04, 0xc0,
    };
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_VLLM_V090, false);
    kvr_kv_enc_stored_t s = doc_store();
    s.medium = NULL; /* v0.9.0 has no medium */
    assert_int_equal(kvr_kv_enc_begin_batch(e, TS, true, 0), KVR_OK); /* rank not sent */
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    expect_batch(e, want, sizeof want);
    kvr_kv_enc_free(e);
}

static void test_doc_map(void **state)
{
    (void)state;
    static const char want[] =
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
    assert_int_equal(sizeof want - 1, 197);
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_VLLM_MAP, false);
    kvr_kv_enc_stored_t s = doc_store();
    s.extra_keys_nil = true;
    s.has_group_idx = true;
    s.group_idx = 0;
    s.spec_kind = "full_attention";
    assert_int_equal(kvr_kv_enc_begin_batch(e, TS, true, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    expect_batch(e, LIT(want));
    kvr_kv_enc_free(e);
}

#define REMOVED_ARRAY "\x93" "\xac" "BlockRemoved" "\x91" HASH0_BYTES "\xa3" "GPU"
#define REMOVED_MAP                                                                          \
    "\x84" "\xa4" "type" "\xac" "BlockRemoved" "\xac" "block_hashes" "\x91" HASH0_BYTES        \
    "\xa6" "medium" "\xa3" "GPU" "\xa9" "group_idx" "\x00"
#define CLEARED_ARRAY "\x91" "\xb0" "AllBlocksCleared"
#define CLEARED_MAP "\x81" "\xa4" "type" "\xb0" "AllBlocksCleared"

static void test_doc_removed_cleared(void **state)
{
    (void)state;
    assert_int_equal(sizeof(REMOVED_ARRAY) - 1, 28);
    assert_int_equal(sizeof(CLEARED_ARRAY) - 1, 18);
    assert_int_equal(sizeof(CLEARED_MAP) - 1, 23);
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_VLLM_ARRAY, false);
    kvr_kv_enc_removed_t r = {.hashes = &HASH0, .n_hashes = 1, .medium = "GPU"};
    assert_int_equal(kvr_kv_enc_begin_batch(e, TS, true, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_removed(e, &r), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_cleared(e), KVR_OK);
    static const char want_a[] = "\x93" TS_BYTES "\x92" REMOVED_ARRAY CLEARED_ARRAY "\x00";
    expect_batch(e, LIT(want_a));
    kvr_kv_enc_free(e);

    e = enc_new(KVR_KV_FMT_VLLM_MAP, false);
    r.has_group_idx = true;
    assert_int_equal(kvr_kv_enc_begin_batch(e, TS, true, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_removed(e, &r), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_cleared(e), KVR_OK);
    static const char want_m[] = "\x93" TS_BYTES "\x92" REMOVED_MAP CLEARED_MAP "\x00";
    expect_batch(e, LIT(want_m));
    kvr_kv_enc_free(e);
}

static void test_doc_sglang_salted(void **state)
{
    (void)state;
    static const char want[] =
        "\x93" "\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00" "\x91"
        "\x98" "\xab" "BlockStored" "\x91\x7b" "\xc0" "\x92\x01\x02" "\x02" "\xc0"
        "\xa3" "GPU" "\x81" "\xaa" "cache_salt" "\xa8" "tenant-a" "\xc0";
    assert_int_equal(sizeof want - 1, 58);
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_SGLANG, false);
    static const uint64_t h[] = {123};
    static const uint32_t t[] = {1, 2};
    kvr_kv_enc_stored_t s = {.hashes = h, .n_hashes = 1, .tokens = t, .n_tokens = 2,
                             .block_size = 2, .medium = "GPU", .cache_salt = "tenant-a"};
    assert_int_equal(kvr_kv_enc_begin_batch(e, 1.0, false, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    expect_batch(e, LIT(want));
    kvr_kv_enc_free(e);
}

/* ---- encodings at their boundaries, and the array length of each era ---------------------- */

static void test_smallest_encodings(void **state)
{
    (void)state;
    /* SGLang: int64 hashes; u64 >= 2^63 goes out negative in the smallest signed form */
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_SGLANG, false);
    static const uint64_t h[] = {0, 127, 128, 65536, U64(0xffffffffffffffff),
                                 U64(0xffffffffffffffe0), U64(0xffffffffffffffdf),
                                 U64(0x8000000000000000), U64(0x7fffffffffffffff)};
    kvr_kv_enc_removed_t r = {.hashes = h, .n_hashes = 9};
    assert_int_equal(kvr_kv_enc_begin_batch(e, 0.5, true, 300), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_removed(e, &r), KVR_OK);
    static const char want_s[] =
        "\x93" "\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00" "\x91"
        "\x93" "\xac" "BlockRemoved"
        "\x99" "\x00" "\x7f" "\xcc\x80" "\xce\x00\x01\x00\x00" "\xff" "\xe0" "\xd0\xdf"
        "\xd3\x80\x00\x00\x00\x00\x00\x00\x00" "\xcf\x7f\xff\xff\xff\xff\xff\xff\xff"
        "\xc0" "\xcd\x01\x2c";
    expect_batch(e, LIT(want_s));
    kvr_kv_enc_free(e);

    /* vLLM: unsigned hashes; 16 tokens are dc 00 10; str8 for 32..255 bytes, str16 above;
     * lora_name makes the array 8 long, group_idx 10, locality 13 */
    e = enc_new(KVR_KV_FMT_VLLM_ARRAY, false);
    uint32_t toks[16];
    for (uint32_t i = 0; i < 16; i++)
        toks[i] = i == 15 ? UINT32_MAX : i;
    char lora[300];
    memset(lora, 'x', sizeof lora);
    lora[32] = '\0';
    static const uint64_t h1[] = {U64(0xffffffffffffffff)};
    kvr_kv_enc_stored_t s = {.hashes = h1, .n_hashes = 1, .has_parent = true, .parent = 5,
                             .tokens = toks, .n_tokens = 16, .block_size = 16,
                             .lora_name = lora, .has_lora_id = true, .lora_id = 3};
    assert_int_equal(kvr_kv_enc_begin_batch(e, 0.5, true, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    const uint8_t *b;
    size_t n;
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
    static const char head[] =
        "\x93" "\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00" "\x91"
        "\x98" "\xab" "BlockStored" "\x91\xcf\xff\xff\xff\xff\xff\xff\xff\xff" "\x05"
        "\xdc\x00\x10" "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e"
        "\xce\xff\xff\xff\xff" "\x10" "\x03" "\xc0" "\xd9\x20";
    assert_true(n == sizeof head - 1 + 32 + 1);
    expect_bytes(b, sizeof head - 1, LIT(head));
    assert_int_equal(b[n - 1], 0x00);

    lora[32] = 'x';
    lora[256] = '\0';
    s.lora_name = lora;
    s.has_group_idx = true;
    s.group_idx = 2;
    assert_int_equal(kvr_kv_enc_begin_batch(e, 0.5, false, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
    assert_int_equal(b[11], 0x9a); /* 10 elements */
    size_t at = sizeof head - 1 - 2;
    expect_bytes(b + at, 3, LIT("\xda\x01\x00"));
    expect_bytes(b + at + 3 + 256, 3, LIT("\xc0\x02\xc0")); /* extra_keys nil, 2, rank nil */
    assert_true(n == at + 3 + 256 + 3);

    s.locality = "REMOTE";
    assert_int_equal(kvr_kv_enc_begin_batch(e, 0.5, false, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
    assert_int_equal(b[11], 0x9d); /* 13 elements */
    expect_bytes(b + at + 3 + 256, 12, LIT("\xc0\x02\xc0\xc0\xa6" "REMOTE" "\xc0"));
    assert_true(n == at + 3 + 256 + 12);
    kvr_kv_enc_free(e);
}

/* An events array longer than 15 takes array16; 65536 events take array32. */
static void test_many_events(void **state)
{
    (void)state;
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_VLLM_ARRAY, false);
    const uint8_t *b;
    size_t n;
    assert_int_equal(kvr_kv_enc_begin_batch(e, 0.0, true, 1), KVR_OK);
    for (int i = 0; i < 16; i++)
        assert_int_equal(kvr_kv_enc_add_cleared(e), KVR_OK);
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
    expect_bytes(b, 13, LIT("\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\xdc\x00\x10"));
    assert_true(n == 13 + 16 * 18 + 1);
    assert_int_equal(kvr_kv_enc_begin_batch(e, 0.0, true, 1), KVR_OK);
    for (int i = 0; i < 65536; i++)
        assert_int_equal(kvr_kv_enc_add_cleared(e), KVR_OK);
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
    expect_bytes(b, 15, LIT("\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\xdd\x00\x01\x00\x00"));
    assert_true(n == 15 + 65536 * 18 + 1);
    kvr_kv_enc_free(e);
}

/* ---- misuse ------------------------------------------------------------------------------- */

static void test_misuse(void **state)
{
    (void)state;
    int st = 0;
    kvr_kv_enc_config_t bad = {.format = (kvr_kv_format_t)9};
    assert_null(kvr_kv_enc_new(&bad, &st));
    assert_int_equal(st, KVR_EINVAL);
    assert_null(kvr_kv_enc_new(NULL, NULL));
    kvr_kv_enc_free(NULL);

    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_SGLANG, true);
    kvr_kv_enc_stored_t s = doc_store();
    const uint8_t *b;
    size_t n;
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL); /* no batch */
    assert_int_equal(kvr_kv_enc_add_cleared(e), KVR_EINVAL);
    assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_EINVAL);
    assert_int_equal(kvr_kv_enc_begin_batch(e, 2.0, true, 0), KVR_OK);
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    s.lora_name = "a";  /* SGLang has no lora_name */
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL);
    s.lora_name = NULL;
    s.has_group_idx = true;
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL);
    s.has_group_idx = false;
    s.n_tokens = 3;  /* per page: tokens must be n * block_size */
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL);
    s.n_tokens = 4;
    s.tokens = NULL;
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL);
    kvr_kv_enc_removed_t r = {.hashes = NULL, .n_hashes = 1};
    assert_int_equal(kvr_kv_enc_add_removed(e, &r), KVR_EINVAL);
    r.hashes = s.hashes;
    r.locality = "LOCAL";
    assert_int_equal(kvr_kv_enc_add_removed(e, &r), KVR_EINVAL);
    assert_int_equal(kvr_kv_enc_n_events(e), 1);
    /* the batch is what the successful add made it */
    static const char want[] =
        "\x93" "\xcb\x40\x00\x00\x00\x00\x00\x00\x00" "\x91"
        "\x97" "\xab" "BlockStored" "\x91\xd3\xda\xb8\x9b\xaa\x7b\x58\x57\xc0" "\xc0"
        TOKENS4_BYTES "\x04" "\xc0" "\xa3" "GPU" "\x00";
    expect_batch(e, LIT(want));
    kvr_kv_enc_free(e);

    e = enc_new(KVR_KV_FMT_VLLM_MAP, false);
    assert_int_equal(kvr_kv_enc_begin_batch(e, 2.0, true, 0), KVR_OK);
    s = doc_store();
    s.cache_salt = "x";  /* vLLM carries salts in extra_keys, not here */
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL);
    kvr_kv_enc_free(e);
    e = enc_new(KVR_KV_FMT_VLLM_V090, false);
    assert_int_equal(kvr_kv_enc_begin_batch(e, 2.0, true, 0), KVR_OK);
    s = doc_store();  /* medium did not exist yet */
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_EINVAL);
    kvr_kv_enc_free(e);
}

static void test_seq_frame(void **state)
{
    (void)state;
    uint8_t b[8];
    kvr_kv_enc_seq(0, b);
    expect_bytes(b, 8, LIT("\x00\x00\x00\x00\x00\x00\x00\x00"));
    kvr_kv_enc_seq(U64(0x0102030405060708), b);
    expect_bytes(b, 8, LIT("\x01\x02\x03\x04\x05\x06\x07\x08"));
}

/* ---- random round trips through the decoder ----------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += U64(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * U64(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * U64(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

/* Values spread over every encoding width, boundaries included. */
static uint64_t rnd_u64(void)
{
    static const uint64_t edges[] = {0, 1, 127, 128, 255, 256, 65535, 65536, UINT32_MAX,
                                     U64(1) << 32, U64(1) << 63, (U64(1) << 63) - 1,
                                     UINT64_MAX, UINT64_MAX - 31, UINT64_MAX - 32};
    switch (below(3)) {
    case 0:
        return edges[below(sizeof edges / sizeof *edges)];
    case 1:
        return rnd() >> below(64);
    default:
        return rnd();
    }
}

static const char *const MEDIA[] = {NULL, "GPU", "CPU", "CPU_PINNED", "DISK", "STORAGE",
                                    "EXTERNAL", "FS"};
static const kvr_tier_t MEDIA_TIER[] = {KVR_TIER_DEVICE, KVR_TIER_DEVICE, KVR_TIER_HOST,
                                        KVR_TIER_HOST, KVR_TIER_DISK, KVR_TIER_DISK,
                                        KVR_TIER_EXTERNAL, KVR_TIER_DISK};

/* What one encoded event should decode to. */
typedef struct want_ev {
    kvr_kv_kind_t kind;
    uint64_t hashes[48];
    size_t n_hashes;
    bool has_parent;
    uint64_t parent;
    uint32_t tokens[48 * 20];
    size_t n_tokens;
    uint32_t block_size;
    int medium;
    char lora[300];
    char salt[40];
    bool has_group_idx;
    uint32_t group_idx;
    bool remote;
} want_ev_t;

#define MAX_WANT 512

static void rnd_name(char *out, size_t cap)
{
    static const size_t lens[] = {1, 5, 31, 32, 255, 256, 299};
    size_t n = lens[below(sizeof lens / sizeof *lens)];
    if (n >= cap)
        n = cap - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)('a' + below(26));
    out[n] = '\0';
}

/* Adds one random event of format f to the batch and its expected decoding to w (several with
 * per_page). Returns the number of expected events. */
static size_t add_random(kvr_kv_enc_t *e, kvr_kv_format_t f, bool per_page, want_ev_t *w)
{
    bool vllm = f == KVR_KV_FMT_VLLM_ARRAY || f == KVR_KV_FMT_VLLM_MAP;
    uint64_t kind = below(10);
    want_ev_t *x = &w[0];
    memset(x, 0, sizeof *x);
    x->medium = f == KVR_KV_FMT_VLLM_V090 ? 0 : (int)below(sizeof MEDIA / sizeof *MEDIA);
    if (vllm && below(3) == 0) {
        x->has_group_idx = true;
        x->group_idx = (uint32_t)rnd_u64();
    }
    const char *locality = NULL;
    if (vllm && below(4) == 0) {
        locality = below(2) ? "REMOTE" : "LOCAL";
        x->remote = locality[0] == 'R';
    }
    if (kind == 0) {
        x->kind = KVR_KV_CLEARED;
        x->has_group_idx = false;
        x->remote = false;
        assert_int_equal(kvr_kv_enc_add_cleared(e), KVR_OK);
        return 1;
    }
    x->n_hashes = 1 + below(per_page ? 6 : 48);
    for (size_t i = 0; i < x->n_hashes; i++)
        x->hashes[i] = rnd_u64();
    if (kind <= 3) {
        x->kind = KVR_KV_REMOVED;
        kvr_kv_enc_removed_t r = {.hashes = x->hashes, .n_hashes = x->n_hashes,
                                  .medium = MEDIA[x->medium],
                                  .has_group_idx = x->has_group_idx,
                                  .group_idx = x->group_idx, .locality = locality};
        assert_int_equal(kvr_kv_enc_add_removed(e, &r), KVR_OK);
        if (!per_page)
            return 1;
        for (size_t i = x->n_hashes; i-- > 1;) {
            w[i] = *x;
            w[i].n_hashes = 1;
            w[i].hashes[0] = x->hashes[i];
        }
        x->n_hashes = 1;
        return r.n_hashes;
    }
    x->kind = KVR_KV_STORED;
    x->has_parent = below(2);
    x->parent = rnd_u64();
    x->block_size = (uint32_t)(1 + below(20));
    x->n_tokens = x->n_hashes * x->block_size;
    if (!per_page && below(4) == 0)
        x->n_tokens -= below(x->n_tokens);  /* engines may send more or fewer */
    for (size_t i = 0; i < x->n_tokens; i++)
        x->tokens[i] = (uint32_t)rnd_u64();
    kvr_kv_enc_stored_t s = {.hashes = x->hashes, .n_hashes = x->n_hashes,
                             .has_parent = x->has_parent, .parent = x->parent,
                             .tokens = x->tokens, .n_tokens = x->n_tokens,
                             .block_size = x->block_size, .medium = MEDIA[x->medium],
                             .has_group_idx = x->has_group_idx, .group_idx = x->group_idx,
                             .locality = locality};
    if (vllm && below(2)) {
        rnd_name(x->lora, sizeof x->lora);
        s.lora_name = x->lora;
    }
    if (vllm && below(3) == 0)
        s.extra_keys_nil = true;
    if (vllm && below(3) == 0) {
        s.spec_kind = "sliding_window";
        s.has_sliding_window = true;
        s.sliding_window = (uint32_t)rnd_u64();
    }
    if (f != KVR_KV_FMT_SGLANG && f != KVR_KV_FMT_VLLM_V090 && below(3) == 0) {
        s.has_lora_id = true;
        s.lora_id = (int64_t)rnd_u64();
    }
    if (f == KVR_KV_FMT_SGLANG && below(2)) {
        rnd_name(x->salt, sizeof x->salt);
        s.cache_salt = x->salt;
    }
    assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
    if (!per_page)
        return 1;
    size_t n_pages = x->n_hashes;
    for (size_t i = n_pages; i-- > 0;) {
        want_ev_t *p = &w[i];
        if (i > 0)
            *p = *x;
        p->n_hashes = 1;
        p->hashes[0] = x->hashes[i];
        if (i > 0) {
            p->has_parent = true;
            p->parent = x->hashes[i - 1];
        }
        memmove(p->tokens, x->tokens + i * x->block_size, x->block_size * sizeof *p->tokens);
        p->n_tokens = x->block_size;
    }
    return n_pages;
}

static void expect_event(const kvr_kv_event_t *ev, const want_ev_t *w, size_t i)
{
    if (ev->status != KVR_OK)
        fail_msg("event %zu: %d %s", i, ev->status, ev->err);
    assert_int_equal(ev->kind, w->kind);
    if (w->kind == KVR_KV_CLEARED)
        return;
    assert_int_equal(ev->n_hashes, w->n_hashes);
    for (size_t k = 0; k < w->n_hashes; k++)
        assert_true(ev->hashes[k] == w->hashes[k]);
    assert_int_equal(ev->tier, MEDIA_TIER[w->medium]);
    assert_false(ev->unknown_medium);
    assert_int_equal(ev->has_group_idx, w->has_group_idx);
    if (w->has_group_idx)
        assert_int_equal(ev->group_idx, w->group_idx);
    assert_int_equal(ev->remote, w->remote);
    if (w->kind == KVR_KV_REMOVED)
        return;
    assert_int_equal(ev->has_parent, w->has_parent);
    if (w->has_parent)
        assert_true(ev->parent == w->parent);
    assert_int_equal(ev->block_size, w->block_size);
    assert_int_equal(ev->n_tokens, w->n_tokens);
    for (size_t k = 0; k < w->n_tokens; k++)
        assert_int_equal(ev->tokens[k], w->tokens[k]);
    assert_false(ev->is_eagle);
    if (w->lora[0]) {
        assert_non_null(ev->lora_name);
        assert_int_equal(ev->lora_name_len, strlen(w->lora));
        assert_memory_equal(ev->lora_name, w->lora, ev->lora_name_len);
    } else {
        assert_null(ev->lora_name);
    }
    if (w->salt[0]) {
        assert_non_null(ev->cache_salt);
        assert_int_equal(ev->cache_salt_len, strlen(w->salt));
        assert_memory_equal(ev->cache_salt, w->salt, ev->cache_salt_len);
    } else {
        assert_null(ev->cache_salt);
    }
}

static void round_trip(kvr_kv_format_t f, bool per_page, uint64_t seed, kvr_kv_events_t *d,
                       want_ev_t *w)
{
    rng_state = seed;
    kvr_kv_enc_t *e = enc_new(f, per_page);
    for (int batch = 0; batch < 60; batch++) {
        double ts = (double)(rnd() >> 11) * 0x1.0p-20;
        bool has_rank = below(2);
        uint32_t rank = (uint32_t)(below(2) ? below(8) : rnd_u64());
        assert_int_equal(kvr_kv_enc_begin_batch(e, ts, has_rank, rank), KVR_OK);
        size_t n = 0, n_add = below(20);
        for (size_t k = 0; k < n_add && n + 48 <= MAX_WANT; k++)
            n += add_random(e, f, per_page, w + n);
        assert_int_equal(kvr_kv_enc_n_events(e), n);
        const uint8_t *b;
        size_t len;
        assert_int_equal(kvr_kv_enc_end_batch(e, &b, &len), KVR_OK);
        uint8_t *copy = malloc(len);  /* exactly len bytes, so ASan sees over-reads */
        assert_non_null(copy);
        memcpy(copy, b, len);
        int st = kvr_kv_events_decode(d, copy, len);
        free(copy);
        if (st != KVR_OK)
            fail_msg("format %d per_page %d seed %" PRIu64 " batch %d: %s", f, per_page, seed,
                     batch, d->err);
        assert_true(d->has_ts);
        assert_true(d->ts == ts);
        bool want_rank = has_rank && f != KVR_KV_FMT_VLLM_V090;
        assert_int_equal(d->has_dp_rank, want_rank);
        if (want_rank)
            assert_int_equal(d->dp_rank, rank);
        assert_int_equal(d->n_events, n);
        for (size_t i = 0; i < n; i++)
            expect_event(&d->events[i], &w[i], i);
    }
    kvr_kv_enc_free(e);
}

static void test_round_trip(void **state)
{
    (void)state;
    kvr_kv_events_t d;
    kvr_kv_events_init(&d);
    want_ev_t *w = calloc(MAX_WANT, sizeof *w);
    assert_non_null(w);
    const char *env = getenv("KVR_TEST_SEED");
    uint64_t seed0 = env ? strtoull(env, NULL, 0) : 42;
    for (int f = KVR_KV_FMT_VLLM_ARRAY; f <= KVR_KV_FMT_SGLANG; f++) {
        for (int pp = 0; pp < 2; pp++) {
            uint64_t seed = seed0 * 8 + (uint64_t)(f * 2 + pp);
            print_message("format %d per_page %d seed %" PRIu64 "\n", f, pp, seed);
            round_trip((kvr_kv_format_t)f, pp, seed, &d, w);
        }
    }
    free(w);
    kvr_kv_events_deinit(&d);
}

/* Once the buffer has held the largest batch, later batches reuse it (no reallocation). */
static void test_buffer_reuse(void **state)
{
    (void)state;
    kvr_kv_enc_t *e = enc_new(KVR_KV_FMT_VLLM_ARRAY, false);
    uint64_t h[32];
    uint32_t t[512];
    for (int i = 0; i < 32; i++)
        h[i] = U64(0x9e3779b97f4a7c15) * (uint64_t)(i + 1);
    for (int i = 0; i < 512; i++)
        t[i] = 100000u + (uint32_t)i;
    kvr_kv_enc_stored_t s = {.hashes = h, .n_hashes = 32, .tokens = t, .n_tokens = 512,
                             .block_size = 16, .medium = "GPU"};
    const uint8_t *b, *first = NULL;
    size_t n;
    for (int round = 0; round < 100; round++) {
        assert_int_equal(kvr_kv_enc_begin_batch(e, 1.0, true, 0), KVR_OK);
        for (int k = 0; k < (round == 0 ? 4 : 1 + round % 4); k++)
            assert_int_equal(kvr_kv_enc_add_stored(e, &s), KVR_OK);
        assert_int_equal(kvr_kv_enc_end_batch(e, &b, &n), KVR_OK);
        if (round == 0)
            first = b; /* the header is 11 bytes for up to 15 events: same start each time */
        else
            assert_ptr_equal(b, first);
    }
    kvr_kv_enc_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_array7),
        cmocka_unit_test(test_doc_v090),
        cmocka_unit_test(test_doc_map),
        cmocka_unit_test(test_doc_removed_cleared),
        cmocka_unit_test(test_doc_sglang_salted),
        cmocka_unit_test(test_smallest_encodings),
        cmocka_unit_test(test_many_events),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_seq_frame),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_buffer_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

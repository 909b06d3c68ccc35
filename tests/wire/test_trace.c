/*
 * test_trace.c: the Mooncake trace reader (wire/trace.c): accepted rows and exact integers,
 * every error with its message (line and field), max_rows, file loading, token determinism and
 * prefix sharing, and the hit-ratio ceilings: hand-computed small traces (pooled LRU eviction,
 * the input_length - 1 cap), a 300-row slice of the conversation trace against an independent
 * reference (tests/tools/trace_ceilings_ref.py, figures hard-coded below), and the full trace's
 * infinite ceiling at block 512 (data/traces/STATS.md: 0.3736).
 * KVR_TEST_DATA names tests/data; the full trace is read from $KVR_TEST_DATA/../../data/traces.
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

#include "kvrouter.h"
#include "sim/ceilings.h"
#include "wire/trace.h"

static const char *data_dir(void)
{
    const char *d = getenv("KVR_TEST_DATA");
    return d != NULL ? d : "tests/data";
}

static int parse(const char *text, size_t max_rows, kvr_trace_t *t, char *err, size_t err_len)
{
    return kvr_trace_parse(text, strlen(text), max_rows, t, err, err_len);
}

static void expect_err(const char *text, int status, const char *msg)
{
    kvr_trace_t t;
    char err[256] = "x";
    int st = parse(text, 0, &t, err, sizeof err);
    if (st != status || strcmp(err, msg) != 0)
        fail_msg("text %s\n  got %d '%s'\n  expected %d '%s'", text, st, err, status, msg);
    assert_null(t.rows);
    assert_int_equal(t.n_rows, 0);
    assert_null(t.ids);
    assert_int_equal(t.n_ids, 0);
}

static void expect_err_prefix(const char *text, const char *prefix)
{
    kvr_trace_t t;
    char err[256] = "";
    int st = parse(text, 0, &t, err, sizeof err);
    if (st != KVR_EPARSE || strncmp(err, prefix, strlen(prefix)) != 0)
        fail_msg("text %s: got %d '%s', expected prefix '%s'", text, st, err, prefix);
    assert_int_equal(t.n_rows, 0);
}

/* ---- parsing ------------------------------------------------------------------------------- */

static void test_parse_rows(void **state)
{
    (void)state;
    const char *text =
        "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": "
        "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n"
        "\n"
        "  \t\r\n"
        "{\"hash_ids\":[18446744073709551615],\"output_length\":4294967295,\"input_length\":512,"
        "\"timestamp\":18446744073709551615,\"extra\":{\"a\":[1,{\"b\":null}],\"c\":\"s\"},"
        "\"flag\":true}\r\n"
        "{\"timestamp\":18446744073709551615,\"input_length\":513,\"output_length\":1,"
        "\"hash_ids\":[7,8]}";
    kvr_trace_t t;
    char err[256];
    assert_int_equal(parse(text, 0, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 3);
    assert_int_equal(t.n_ids, 17);
    assert_int_equal(t.rows[0].timestamp_ms, 0);
    assert_int_equal(t.rows[0].input_length, 6758);
    assert_int_equal(t.rows[0].output_length, 500);
    assert_int_equal(t.rows[0].n_hash_ids, 14);
    for (uint32_t i = 0; i < 14; i++)
        assert_int_equal(t.rows[0].hash_ids[i], i);
    assert_true(t.rows[1].timestamp_ms == UINT64_MAX);
    assert_int_equal(t.rows[1].input_length, 512);
    assert_int_equal(t.rows[1].output_length, UINT32_MAX);
    assert_int_equal(t.rows[1].n_hash_ids, 1);
    assert_true(t.rows[1].hash_ids[0] == UINT64_MAX);
    assert_int_equal(t.rows[2].n_hash_ids, 2);
    assert_int_equal(t.rows[2].hash_ids[1], 8);
    assert_ptr_equal(t.rows[0].hash_ids, t.ids);
    assert_ptr_equal(t.rows[2].hash_ids, t.ids + 15);
    kvr_trace_free(&t);
    assert_null(t.rows);
    kvr_trace_free(&t); /* twice is fine */
    kvr_trace_free(NULL);

    /* empty input: no rows, no error */
    assert_int_equal(parse("", 0, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 0);
    assert_int_equal(parse("\n\n  \n", 0, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 0);
    kvr_trace_free(&t);
}

static void test_max_rows(void **state)
{
    (void)state;
    const char *text = "{\"timestamp\":1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n"
                       "{\"timestamp\":2,\"input_length\":1,\"output_length\":1,\"hash_ids\":[2]}\n"
                       "this line is never read\n";
    kvr_trace_t t;
    char err[256];
    assert_int_equal(parse(text, 2, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 2);
    assert_int_equal(t.rows[1].hash_ids[0], 2);
    kvr_trace_free(&t);
    assert_int_equal(parse(text, 1, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 1);
    kvr_trace_free(&t);
    assert_int_equal(parse(text, 0, &t, err, sizeof err), KVR_EPARSE);
    assert_int_equal(strncmp(err, "line 3: invalid JSON", 20), 0);
}

#define ROW_OK "{\"timestamp\":5,\"input_length\":600,\"output_length\":3,\"hash_ids\":[1,2]}\n"

static void test_errors(void **state)
{
    (void)state;
    expect_err("[1]", KVR_EPARSE, "line 1: expected a JSON object");
    expect_err("17", KVR_EPARSE, "line 1: expected a JSON object");
    expect_err("\n\"s\"", KVR_EPARSE, "line 2: expected a JSON object");
    expect_err_prefix("{\"timestamp\":", "line 1: invalid JSON");
    expect_err_prefix(ROW_OK "{\"timestamp\":5,}", "line 2: invalid JSON at byte");
    expect_err_prefix(ROW_OK ROW_OK "{} x", "line 3: invalid JSON");
    expect_err_prefix("{\"a\":\"\xff\"}", "line 1: invalid JSON");
    expect_err("{\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}", KVR_EPARSE,
               "line 1: timestamp: missing");
    expect_err("{\"timestamp\":1,\"output_length\":1,\"hash_ids\":[1]}", KVR_EPARSE,
               "line 1: input_length: missing");
    expect_err("{\"timestamp\":1,\"input_length\":1,\"hash_ids\":[1]}", KVR_EPARSE,
               "line 1: output_length: missing");
    expect_err("{\"timestamp\":1,\"input_length\":1,\"output_length\":1}", KVR_EPARSE,
               "line 1: hash_ids: missing");
    expect_err("{\"timestamp\":1,\"input_length\":1,\"input_length\":1}", KVR_EPARSE,
               "line 1: input_length: duplicate key");
    expect_err("{\"timestamp\":\"0\"}", KVR_EPARSE, "line 1: timestamp: must be an integer >= 0");
    expect_err("{\"timestamp\":null}", KVR_EPARSE, "line 1: timestamp: must be an integer >= 0");
    expect_err("{\"timestamp\":-1}", KVR_EINVAL, "line 1: timestamp: must be an integer >= 0");
    expect_err("{\"timestamp\":1.5}", KVR_EINVAL, "line 1: timestamp: must be an integer >= 0");
    expect_err("{\"timestamp\":1e3}", KVR_EINVAL, "line 1: timestamp: must be an integer >= 0");
    expect_err("{\"timestamp\":18446744073709551616}", KVR_EINVAL,
               "line 1: timestamp: must be an integer >= 0");
    expect_err("{\"input_length\":0}", KVR_EINVAL,
               "line 1: input_length: must be an integer in [1, 4194304]");
    expect_err("{\"input_length\":4194305}", KVR_EINVAL,
               "line 1: input_length: must be an integer in [1, 4194304]");
    expect_err("{\"input_length\":[1]}", KVR_EPARSE,
               "line 1: input_length: must be an integer in [1, 4194304]");
    expect_err("{\"output_length\":0}", KVR_EINVAL,
               "line 1: output_length: must be an integer in [1, 4294967295]");
    expect_err("{\"output_length\":4294967296}", KVR_EINVAL,
               "line 1: output_length: must be an integer in [1, 4294967295]");
    expect_err("{\"output_length\":true}", KVR_EPARSE,
               "line 1: output_length: must be an integer in [1, 4294967295]");
    expect_err("{\"hash_ids\":{}}", KVR_EPARSE, "line 1: hash_ids: must be an array of integers");
    expect_err("{\"hash_ids\":7}", KVR_EPARSE, "line 1: hash_ids: must be an array of integers");
    expect_err("{\"hash_ids\":[1,\"2\"]}", KVR_EPARSE,
               "line 1: hash_ids[1]: not an integer in [0, 18446744073709551615]");
    expect_err("{\"hash_ids\":[1,2,[3]]}", KVR_EPARSE,
               "line 1: hash_ids[2]: not an integer in [0, 18446744073709551615]");
    expect_err("{\"hash_ids\":[-1]}", KVR_EPARSE,
               "line 1: hash_ids[0]: not an integer in [0, 18446744073709551615]");
    expect_err("{\"hash_ids\":[18446744073709551616]}", KVR_EPARSE,
               "line 1: hash_ids[0]: not an integer in [0, 18446744073709551615]");
    expect_err("{\"timestamp\":0,\"input_length\":6758,\"output_length\":1,\"hash_ids\":[0]}",
               KVR_EINVAL, "line 1: hash_ids: 1 ids for input_length 6758 (expected 14)");
    expect_err("{\"timestamp\":0,\"input_length\":512,\"output_length\":1,\"hash_ids\":[0,1]}",
               KVR_EINVAL, "line 1: hash_ids: 2 ids for input_length 512 (expected 1)");
    expect_err("{\"timestamp\":1300,\"input_length\":1,\"output_length\":1,\"hash_ids\":[0]}\n"
               "\n"
               "{\"timestamp\":1200,\"input_length\":1,\"output_length\":1,\"hash_ids\":[0]}\n",
               KVR_EINVAL, "line 3: timestamp goes back (1200 after 1300)");
    /* too many ids for any allowed input_length: stopped while reading, not after */
    size_t n = 8193;
    char *big = malloc(n * 2 + 64);
    assert_non_null(big);
    char *p = big + sprintf(big, "{\"hash_ids\":[");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, i ? ",1" : "1");
    sprintf(p, "]}");
    expect_err(big, KVR_EINVAL, "line 1: hash_ids: more than 8192 ids");
    free(big);
    /* a message always fits the buffer given */
    kvr_trace_t t;
    char small[12];
    assert_int_equal(parse("[1]", 0, &t, small, sizeof small), KVR_EPARSE);
    assert_string_equal(small, "line 1: exp");
    assert_int_equal(parse("[1]", 0, &t, NULL, 0), KVR_EPARSE);
    assert_int_equal(kvr_trace_parse(NULL, 3, 0, &t, NULL, 0), KVR_EINVAL);
}

static void test_load(void **state)
{
    (void)state;
    kvr_trace_t t;
    char err[512];
    assert_int_equal(kvr_trace_load("/nonexistent/trace.jsonl", 0, &t, err, sizeof err), KVR_EIO);
    assert_non_null(strstr(err, "/nonexistent/trace.jsonl"));
    assert_int_equal(t.n_rows, 0);

    char path[1024];
    snprintf(path, sizeof path, "%s/conversation_trace_300.jsonl", data_dir());
    assert_int_equal(kvr_trace_load(path, 0, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 300);
    assert_int_equal(t.n_ids, 8490);
    assert_int_equal(t.rows[0].input_length, 6758);
    assert_int_equal(t.rows[299].timestamp_ms, 102000);
    uint64_t sum = 0;
    for (size_t i = 0; i < t.n_rows; i++)
        sum += t.rows[i].input_length;
    assert_int_equal(sum, 4269971);
    kvr_trace_free(&t);
    assert_int_equal(kvr_trace_load(path, 10, &t, err, sizeof err), KVR_OK);
    assert_int_equal(t.n_rows, 10);
    kvr_trace_free(&t);

    /* an error in a file names the path and the line */
    char tmp[] = "/tmp/kvr_test_trace_XXXXXX";
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(ROW_OK "{\"timestamp\":5,\"input_length\":0}\n", f);
    fclose(f);
    assert_int_equal(kvr_trace_load(tmp, 0, &t, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, tmp));
    assert_non_null(strstr(err, "line 2: input_length: must be an integer in [1, 4194304]"));
    remove(tmp);
}

/* ---- tokens -------------------------------------------------------------------------------- */

static kvr_trace_row_t mkrow(const uint64_t *ids, uint32_t n_ids, uint32_t len)
{
    return (kvr_trace_row_t){.timestamp_ms = 0, .input_length = len, .output_length = 1,
                             .hash_ids = ids, .n_hash_ids = n_ids};
}

static void test_tokens(void **state)
{
    (void)state;
    static uint32_t a[2048], b[2048], c[2048];
    const uint64_t ids_a[] = {0, 1, 2, 3}, ids_b[] = {0, 1, 9, 10}, ids_c[] = {0, 1};
    kvr_trace_row_t ra = mkrow(ids_a, 4, 2048), rb = mkrow(ids_b, 4, 2048),
                    rc = mkrow(ids_c, 2, 700);
    assert_int_equal(kvr_trace_tokens(&ra, 0, a, 2048), KVR_OK);
    assert_int_equal(kvr_trace_tokens(&rb, 0, b, 2048), KVR_OK);
    /* range */
    for (size_t i = 0; i < 2048; i++) {
        assert_true(a[i] >= KVR_TRACE_TOKEN_LO && a[i] < KVR_TRACE_TOKEN_HI);
        assert_true(b[i] >= KVR_TRACE_TOKEN_LO && b[i] < KVR_TRACE_TOKEN_HI);
    }
    /* sharing: exactly the first two ids' tokens are common */
    assert_memory_equal(a, b, 1024 * sizeof *a);
    size_t same = 0;
    for (size_t i = 1024; i < 2048; i++)
        same += a[i] == b[i];
    assert_true(same < 5); /* chance agreement is 1 in 30000 a token */
    assert_true(a[1024] != b[1024] || a[1025] != b[1025]);
    /* within a row, different ids give different blocks */
    size_t same_blocks = 0;
    for (size_t i = 0; i < 512; i++)
        same_blocks += a[i] == a[512 + i];
    assert_true(same_blocks < 5);
    /* determinism, and a partial last block is a prefix of the id's block */
    assert_int_equal(kvr_trace_tokens(&ra, 0, c, 2048), KVR_OK);
    assert_memory_equal(a, c, sizeof a);
    assert_int_equal(kvr_trace_tokens(&rc, 0, c, 700), KVR_OK);
    assert_memory_equal(a, c, 700 * sizeof *a);
    /* the seed changes everything */
    assert_int_equal(kvr_trace_tokens(&ra, 1, c, 2048), KVR_OK);
    same = 0;
    for (size_t i = 0; i < 2048; i++)
        same += a[i] == c[i];
    assert_true(same < 5);
    /* fixed values (the generator as trace.c's header states it, computed in Python):
     * every reader of a trace (replay, sim, tests) must see these tokens */
    const uint64_t id0[] = {0}, id5[] = {5};
    kvr_trace_row_t r0 = mkrow(id0, 1, 4), r5 = mkrow(id5, 1, 2);
    assert_int_equal(kvr_trace_tokens(&r0, 0, c, 4), KVR_OK);
    assert_int_equal(c[0], 20518);
    assert_int_equal(c[1], 12423);
    assert_int_equal(c[2], 29863);
    assert_int_equal(c[3], 16864);
    assert_int_equal(kvr_trace_tokens(&r5, 0, c, 2), KVR_OK);
    assert_int_equal(c[0], 3184);
    assert_int_equal(c[1], 15894);
    assert_int_equal(kvr_trace_tokens(&r5, 3, c, 2), KVR_OK);
    assert_int_equal(c[0], 13361);
    assert_int_equal(c[1], 15130);
    /* errors */
    assert_int_equal(kvr_trace_tokens(&ra, 0, c, 2047), KVR_ETOOBIG);
    assert_int_equal(kvr_trace_tokens(NULL, 0, c, 10), KVR_EINVAL);
    assert_int_equal(kvr_trace_tokens(&ra, 0, NULL, 4096), KVR_EINVAL);
    kvr_trace_row_t no_ids = mkrow(NULL, 1, 10);
    assert_int_equal(kvr_trace_tokens(&no_ids, 0, c, 10), KVR_EINVAL);
    /* a hand-made row with too few ids is still fully written */
    kvr_trace_row_t short_row = mkrow(ids_c, 1, 1000);
    for (size_t i = 0; i < 1000; i++)
        c[i] = 0;
    assert_int_equal(kvr_trace_tokens(&short_row, 0, c, 1000), KVR_OK);
    assert_memory_equal(a, c, 512 * sizeof *a);
    for (size_t i = 0; i < 1000; i++)
        assert_true(c[i] >= KVR_TRACE_TOKEN_LO && c[i] < KVR_TRACE_TOKEN_HI);
}

/* ---- ceilings ------------------------------------------------------------------------------ */

static void check_ratio(double got, uint64_t hits, uint64_t total)
{
    double want = (double)hits / (double)total;
    if (fabs(got - want) > 1e-12)
        fail_msg("ratio %.15f, expected %llu / %llu = %.15f", got, (unsigned long long)hits,
                 (unsigned long long)total, want);
}

/* At block 512 each id is one block; A B C D as worked out by hand:
 *   A [1,2] 1024     B [3,4] 1024     C [1,2,5] 1536     D [3,4,6] 1536
 * pooled, 4 blocks: A and B fill the cache (LRU oldest first: A2 A1 B2 B1; a request's blocks
 * are released last block first, so its root is the most recent). C hits A1 A2 (1024), needs
 * one block: evicts B2. D finds B1 but not B2 (512) and evicts C3, A2. Infinite: C 1024, D 1024.
 * So pooled = 1536 / 5120 = 0.3, infinite = 2048 / 5120 = 0.4. */
static void test_ceilings_hand(void **state)
{
    (void)state;
    const char *text =
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[1,2]}\n"
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[3,4]}\n"
        "{\"timestamp\":0,\"input_length\":1536,\"output_length\":1,\"hash_ids\":[1,2,5]}\n"
        "{\"timestamp\":0,\"input_length\":1536,\"output_length\":1,\"hash_ids\":[3,4,6]}\n";
    kvr_trace_t t;
    char err[256];
    assert_int_equal(parse(text, 0, &t, err, sizeof err), KVR_OK);
    kvr_trace_ceilings_t c;
    assert_int_equal(kvr_trace_ceilings(&t, 512, 4, &c), KVR_OK);
    assert_int_equal(c.prompt_tokens, 5120);
    check_ratio(c.infinite, 2048, 5120);
    check_ratio(c.pooled, 1536, 5120);
    /* a larger pool keeps everything: pooled = infinite */
    assert_int_equal(kvr_trace_ceilings(&t, 512, 1000, &c), KVR_OK);
    check_ratio(c.pooled, 2048, 5120);
    /* no pool: no hits; same answers at block 16 (block sizes dividing 512 see the same
     * prefixes here: every length is a multiple of 512) */
    assert_int_equal(kvr_trace_ceilings(&t, 512, 0, &c), KVR_OK);
    check_ratio(c.pooled, 0, 5120);
    assert_int_equal(kvr_trace_ceilings(&t, 16, 128, &c), KVR_OK);
    check_ratio(c.infinite, 2048, 5120);
    check_ratio(c.pooled, 1536, 5120);
    /* a block size not dividing 512 */
    assert_int_equal(kvr_trace_ceilings(&t, 24, 4, &c), KVR_EINVAL);
    assert_int_equal(kvr_trace_ceilings(&t, 0, 4, &c), KVR_EINVAL);
    assert_int_equal(kvr_trace_ceilings(&t, 1024, 4, &c), KVR_EINVAL);
    assert_int_equal(kvr_trace_ceilings(NULL, 16, 4, &c), KVR_EINVAL);
    t.rows[1].input_length = 0; /* hand-made rows outside what parsing accepts */
    assert_int_equal(kvr_trace_ceilings(&t, 16, 4, &c), KVR_EINVAL);
    t.rows[1].input_length = KVR_TRACE_MAX_INPUT + 1;
    assert_int_equal(kvr_trace_ceilings(&t, 16, 4, &c), KVR_EINVAL);
    kvr_trace_free(&t);
}

/* The hit cap: a prompt seen in full still computes its last token, so at most
 * floor((len - 1) / bs) blocks hit; and a partial block shares a prefix at small block sizes. */
static void test_ceilings_cap(void **state)
{
    (void)state;
    const char *text =
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[1,2]}\n"
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[1,2]}\n"
        "{\"timestamp\":0,\"input_length\":600,\"output_length\":1,\"hash_ids\":[7,8]}\n"
        "{\"timestamp\":0,\"input_length\":700,\"output_length\":1,\"hash_ids\":[7,8]}\n";
    kvr_trace_t t;
    char err[256];
    assert_int_equal(parse(text, 0, &t, err, sizeof err), KVR_OK);
    kvr_trace_ceilings_t c;
    /* block 512: row 2 hits 1 block (cap 1023/512 = 1); row 4 hits block [7] (its second
     * block is partial, never hashed) */
    assert_int_equal(kvr_trace_ceilings(&t, 512, 100, &c), KVR_OK);
    assert_int_equal(c.prompt_tokens, 3348);
    check_ratio(c.infinite, 512 + 512, 3348);
    check_ratio(c.pooled, 512 + 512, 3348);
    /* block 16: row 2 hits 63 blocks (cap 1023/16); row 4 hits all of row 3's 37 full blocks
     * (592 tokens: 512 of [7] and 80 of [8]) */
    assert_int_equal(kvr_trace_ceilings(&t, 16, 1000, &c), KVR_OK);
    check_ratio(c.infinite, 63 * 16 + 37 * 16, 3348);
    check_ratio(c.pooled, 63 * 16 + 37 * 16, 3348);
    /* a pool smaller than a request: that request cannot be cached (nor evict anything) */
    assert_int_equal(kvr_trace_ceilings(&t, 512, 1, &c), KVR_OK);
    check_ratio(c.pooled, 0, 3348);
    kvr_trace_free(&t);
}

/* Figures from tests/tools/trace_ceilings_ref.py on tests/data/conversation_trace_300.jsonl. */
static void test_ceilings_slice(void **state)
{
    (void)state;
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/conversation_trace_300.jsonl", data_dir());
    kvr_trace_t t;
    assert_int_equal(kvr_trace_load(path, 0, &t, err, sizeof err), KVR_OK);
    kvr_trace_ceilings_t c;
    assert_int_equal(kvr_trace_ceilings(&t, 512, 40, &c), KVR_OK);
    assert_int_equal(c.prompt_tokens, 4269971);
    check_ratio(c.infinite, 345600, 4269971);
    check_ratio(c.pooled, 153088, 4269971);
    assert_int_equal(kvr_trace_ceilings(&t, 16, 2048, &c), KVR_OK);
    check_ratio(c.infinite, 345952, 4269971);
    check_ratio(c.pooled, 153088, 4269971);
    assert_int_equal(kvr_trace_ceilings(&t, 16, 65536, &c), KVR_OK);
    check_ratio(c.pooled, 159232, 4269971);
    assert_int_equal(kvr_trace_ceilings(&t, 16, 131072, &c), KVR_OK);
    check_ratio(c.pooled, 227840, 4269971);
    assert_int_equal(kvr_trace_ceilings(&t, 16, (uint64_t)1 << 30, &c), KVR_OK);
    check_ratio(c.pooled, 345952, 4269971);
    kvr_trace_free(&t);
}

/* The whole conversation trace: infinite ceiling at block 512 (STATS.md: 0.3736; ours caps a
 * hit at the full blocks and at input_length - 1, hence 54063104 / 144793823 = 0.37338). */
static void test_ceilings_full_trace(void **state)
{
    (void)state;
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/../../data/traces/conversation_trace.jsonl", data_dir());
    kvr_trace_t t;
    int rc = kvr_trace_load(path, 0, &t, err, sizeof err);
    if (rc == KVR_EIO)
        skip(); /* the data folder is not next to the tests */
    assert_int_equal(rc, KVR_OK);
    assert_int_equal(t.n_rows, 12031);
    assert_int_equal(t.n_ids, 288500);
    kvr_trace_ceilings_t c;
    assert_int_equal(kvr_trace_ceilings(&t, 512, 0, &c), KVR_OK);
    assert_int_equal(c.prompt_tokens, 144793823);
    check_ratio(c.infinite, 54063104, 144793823);
    assert_true(fabs(c.infinite - 0.3736) < 0.001);
    kvr_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_rows),    cmocka_unit_test(test_max_rows),
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_load),
        cmocka_unit_test(test_tokens),        cmocka_unit_test(test_ceilings_hand),
        cmocka_unit_test(test_ceilings_cap),  cmocka_unit_test(test_ceilings_slice),
        cmocka_unit_test(test_ceilings_full_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

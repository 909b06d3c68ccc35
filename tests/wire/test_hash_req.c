/*
 * test_hash_req.c: the hash request decoder (wire/hash_req.c): accepted lines and every
 * optional field, exact u64 handling, each error class with its message, limits, and reuse of
 * one decoder across lines.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/hash_req.h"

#define U64(x) UINT64_C(x)

static int setup(void **state)
{
    kvr_hash_req_t *r = malloc(sizeof *r);
    if (r == NULL)
        return -1;
    kvr_hash_req_init(r);
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    kvr_hash_req_deinit(*state);
    free(*state);
    return 0;
}

static int parse(kvr_hash_req_t *r, const char *line)
{
    return kvr_hash_req_parse(r, line, strlen(line));
}

/* Parses line, expects status and the exact error message, and cleared outputs. */
static void expect_err(kvr_hash_req_t *r, const char *line, int status, const char *msg)
{
    int st = parse(r, line);
    if (st != status || strcmp(r->err, msg) != 0)
        fail_msg("line %s\n  got %d '%s'\n  expected %d '%s'", line, st, r->err, status, msg);
    assert_int_equal(r->n_tokens, 0);
    assert_null(r->tokens);
    assert_int_equal(r->opts.n_mm, 0);
}

static void expect_ok(kvr_hash_req_t *r, const char *line)
{
    int st = parse(r, line);
    if (st != KVR_OK)
        fail_msg("line %s: %d %s", line, st, r->err);
    assert_string_equal(r->err, "");
}

/* Starts with prefix (for yajl's own wording after our prefix). */
static void expect_err_prefix(kvr_hash_req_t *r, const char *line, const char *prefix)
{
    int st = parse(r, line);
    if (st != KVR_EPARSE || strncmp(r->err, prefix, strlen(prefix)) != 0)
        fail_msg("line %s: got %d '%s', expected prefix '%s'", line, st, r->err, prefix);
}

/* ---- accepted lines ----------------------------------------------------------------------- */

static void test_minimal(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"tokens\":[0,1,2,3,4,5,6,7],\"block_size\":4}");
    assert_int_equal(r->n_tokens, 8);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(r->tokens[i], i);
    assert_int_equal(r->block_size, 4);
    assert_null(r->opts.lora_name);
    assert_null(r->opts.cache_namespace);
    assert_false(r->opts.is_eagle);
    assert_null(r->opts.mm);
    assert_int_equal(r->opts.n_mm, 0);
    /* ready for the hasher: the reference vector */
    uint64_t lbh[2];
    assert_int_equal(kvr_hash_blocks(r->tokens, r->n_tokens, r->block_size, &r->opts, lbh, 2), 2);
    assert_int_equal(lbh[0], U64(9143094415614847814));
    assert_int_equal(lbh[1], U64(12124091508212882195));

    /* key order, whitespace, a trailing newline, empty tokens */
    expect_ok(r, " \t{ \"block_size\" : 16 ,\n \"tokens\" : [ ] }\r\n");
    assert_int_equal(r->n_tokens, 0);
    assert_int_equal(r->block_size, 16);
}

static void test_all_fields(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"tokens\":[0,1,2,3,4,5,6,7],\"block_size\":4,\"lora_name\":\"adapter-a\","
                 "\"cache_namespace\":\"tenant-a\",\"is_eagle\":false,"
                 "\"block_mm_hashes\":{\"1\":[42]}}");
    assert_int_equal(r->opts.lora_name_len, 9);
    assert_memory_equal(r->opts.lora_name, "adapter-a", 9);
    assert_int_equal(r->opts.cache_namespace_len, 8);
    assert_memory_equal(r->opts.cache_namespace, "tenant-a", 8);
    assert_int_equal(kvr_hash_seed(&r->opts), U64(10790858310771630931));
    assert_int_equal(r->opts.n_mm, 1);
    assert_int_equal(r->opts.mm[0].block, 1);
    assert_int_equal(r->opts.mm[0].n_hashes, 1);
    assert_int_equal(r->opts.mm[0].hashes[0], 42);

    expect_ok(r, "{\"tokens\":[0,1,2,3,4,5],\"block_size\":2,\"is_eagle\":true}");
    assert_true(r->opts.is_eagle);
    uint64_t lbh[2];
    assert_int_equal(kvr_hash_blocks(r->tokens, r->n_tokens, r->block_size, &r->opts, lbh, 2), 2);
    assert_int_equal(lbh[0], U64(11646242937812223497));
    assert_int_equal(lbh[1], U64(9948816348502404300));

    expect_ok(r, "{\"tokens\":[0,1],\"block_size\":2,\"block_mm_hashes\":{\"0\":[42]}}");
    assert_int_equal(kvr_hash_blocks(r->tokens, r->n_tokens, r->block_size, &r->opts, lbh, 2), 1);
    assert_int_equal(lbh[0], U64(6100948656312251355));
}

static void test_nulls_and_empties(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"tokens\":[1],\"block_size\":1,\"lora_name\":null,\"cache_namespace\":null,"
                 "\"is_eagle\":null,\"block_mm_hashes\":null}");
    assert_null(r->opts.lora_name);
    assert_null(r->opts.cache_namespace);
    assert_false(r->opts.is_eagle);
    assert_int_equal(r->opts.n_mm, 0);

    /* empty strings are kept (the hasher treats them as absent) */
    expect_ok(r, "{\"tokens\":[1],\"block_size\":1,\"lora_name\":\"\",\"cache_namespace\":\"\"}");
    assert_non_null(r->opts.lora_name);
    assert_int_equal(r->opts.lora_name_len, 0);
    assert_int_equal(kvr_hash_seed(&r->opts), KVR_HASH_SEED);

    /* an empty map; an entry with null or [] hashes carries no hashes */
    expect_ok(r, "{\"tokens\":[1],\"block_size\":1,\"block_mm_hashes\":{}}");
    assert_int_equal(r->opts.n_mm, 0);
    expect_ok(r, "{\"tokens\":[1],\"block_size\":1,\"block_mm_hashes\":{\"0\":null,\"2\":[]}}");
    assert_int_equal(r->opts.n_mm, 2);
    assert_int_equal(r->opts.mm[0].n_hashes, 0);
    assert_null(r->opts.mm[0].hashes);
    assert_int_equal(r->opts.mm[1].block, 2);
    assert_int_equal(r->opts.mm[1].n_hashes, 0);
}

static void test_strings(void **state)
{
    kvr_hash_req_t *r = *state;
    /* escapes are decoded to UTF-8: the hash covers the UTF-8 bytes */
    expect_ok(r, "{\"tokens\":[],\"block_size\":1,\"lora_name\":\"\\u00fc-lora\"}");
    assert_int_equal(r->opts.lora_name_len, 7);
    assert_memory_equal(r->opts.lora_name, "\xc3\xbc-lora", 7);
    kvr_hash_opts_t raw = {.lora_name = "\xc3\xbc-lora", .lora_name_len = 7};
    assert_int_equal(kvr_hash_seed(&r->opts), kvr_hash_seed(&raw));
    /* an embedded NUL is part of the name */
    expect_ok(r, "{\"tokens\":[],\"block_size\":1,\"cache_namespace\":\"a\\u0000b\\\"\"}");
    assert_int_equal(r->opts.cache_namespace_len, 4);
    assert_memory_equal(r->opts.cache_namespace, "a\0b\"", 4);
}

static void test_unknown_keys(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"seed\":11174810518531729929,\"tokens\":[5,6],\"local_block_hashes\":[\"1\"],"
                 "\"x\":{\"tokens\":[\"no\"],\"block_size\":0,\"y\":[[{}],[null,true,1.5e300]]},"
                 "\"block_size\":2,\"sequence_hashes\":[],\"z\":-1e-7,\"w\":\"s\",\"v\":null,"
                 "\"u\":false,\"\":{\"block_mm_hashes\":{\"q\":1}}}");
    assert_int_equal(r->n_tokens, 2);
    assert_int_equal(r->tokens[1], 6);
    assert_int_equal(r->block_size, 2);
    assert_int_equal(r->opts.n_mm, 0);

    /* deep nesting under an unknown key: skipped without recursion */
    size_t depth = 200000;
    char *line = malloc(2 * depth + 64);
    assert_non_null(line);
    char *p = line + sprintf(line, "{\"deep\":");
    memset(p, '[', depth);
    p += depth;
    memset(p, ']', depth);
    p += depth;
    strcpy(p, ",\"tokens\":[1],\"block_size\":1}");
    expect_ok(r, line);
    assert_int_equal(r->n_tokens, 1);
    free(line);
}

static void test_u64_extremes(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"tokens\":[0,4294967295,-0],\"block_size\":2147483647,\"block_mm_hashes\":"
                 "{\"4294967295\":[18446744073709551615,0,10754394637803157173,"
                 "9223372036854775808,9223372036854775807]}}");
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[1], UINT32_MAX);
    assert_int_equal(r->tokens[2], 0);
    assert_int_equal(r->block_size, 2147483647u);
    assert_int_equal(r->opts.n_mm, 1);
    const kvr_block_mm_t *e = &r->opts.mm[0];
    assert_int_equal(e->block, UINT32_MAX);
    assert_int_equal(e->n_hashes, 5);
    /* sorted ascending */
    assert_int_equal(e->hashes[0], 0);
    assert_int_equal(e->hashes[1], U64(9223372036854775807));
    assert_int_equal(e->hashes[2], U64(9223372036854775808));
    assert_int_equal(e->hashes[3], U64(10754394637803157173));
    assert_int_equal(e->hashes[4], UINT64_MAX);
}

static void test_mm_sorting(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"tokens\":[1,2,3,4,5,6,7,8],\"block_size\":2,\"block_mm_hashes\":"
                 "{\"3\":[9,1,9,5],\"0\":[7],\"10\":[3,2],\"2\":[]}}");
    assert_int_equal(r->opts.n_mm, 4);
    const uint32_t blocks[4] = {0, 2, 3, 10};
    for (int i = 0; i < 4; i++)
        assert_int_equal(r->opts.mm[i].block, blocks[i]);
    assert_int_equal(r->opts.mm[0].hashes[0], 7);
    const uint64_t want3[4] = {1, 5, 9, 9}; /* duplicates kept */
    assert_int_equal(r->opts.mm[2].n_hashes, 4);
    assert_memory_equal(r->opts.mm[2].hashes, want3, sizeof want3);
    assert_int_equal(r->opts.mm[3].hashes[0], 2);
    assert_int_equal(r->opts.mm[3].hashes[1], 3);
    uint64_t a[4];
    assert_int_equal(kvr_hash_blocks(r->tokens, r->n_tokens, r->block_size, &r->opts, a, 4), 4);

    /* the same request with keys and hashes already in order hashes the same */
    uint64_t b[4];
    expect_ok(r, "{\"tokens\":[1,2,3,4,5,6,7,8],\"block_size\":2,\"block_mm_hashes\":"
                 "{\"0\":[7],\"2\":[],\"3\":[1,5,9,9],\"10\":[2,3]}}");
    assert_int_equal(kvr_hash_blocks(r->tokens, r->n_tokens, r->block_size, &r->opts, b, 4), 4);
    assert_memory_equal(a, b, sizeof a);

    /* many entries in reverse order go through the heap sort */
    static char line[65536];
    char *p = line + sprintf(line, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{");
    for (int i = 999; i >= 0; i--)
        p += sprintf(p, "\"%d\":[%d,%d]%s", i, 3 * i + 1, i, i ? "," : "}}");
    expect_ok(r, line);
    assert_int_equal(r->opts.n_mm, 1000);
    for (uint32_t i = 0; i < 1000; i++) {
        assert_int_equal(r->opts.mm[i].block, i);
        assert_int_equal(r->opts.mm[i].n_hashes, 2);
        assert_int_equal(r->opts.mm[i].hashes[0], i);
        assert_int_equal(r->opts.mm[i].hashes[1], 3 * i + 1);
    }
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_err_json(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_err(r, "", KVR_EPARSE, "empty input");
    expect_err(r, "  \t\r\n", KVR_EPARSE, "empty input");
    expect_err_prefix(r, "{\"tokens\":[1,2", "invalid JSON at byte 14: ");
    expect_err_prefix(r, "{\"tokens\":[1],\"block_size\":1", "invalid JSON at byte ");
    expect_err_prefix(r, "{\"tokens\":[1],\"block_size\":1} x", "invalid JSON at byte ");
    expect_err_prefix(r, "{\"tokens\":[1],\"block_size\":1}{}", "invalid JSON at byte ");
    expect_err_prefix(r, "{\"tokens\":[1,],\"block_size\":1}", "invalid JSON at byte ");
    expect_err_prefix(r, "{'tokens':[1]}", "invalid JSON at byte 2: lexical error");
    expect_err_prefix(r, "{\"tokens\":[01],\"block_size\":1}", "invalid JSON at byte ");
    expect_err_prefix(r, "{\"tokens\":[NaN],\"block_size\":1}", "invalid JSON at byte ");
    expect_err_prefix(r, "{\"lora_name\":\"\xff\"}", "invalid JSON at byte ");
    expect_err_prefix(r, "{\"tokens\":[1]/*c*/,\"block_size\":1}", "invalid JSON at byte ");
    /* an embedded NUL byte */
    int st = kvr_hash_req_parse(r, "{\"tokens\":[1],\0\"block_size\":1}", 30);
    assert_int_equal(st, KVR_EPARSE);
    assert_memory_equal(r->err, "invalid JSON at byte ", 21);
    /* the message is one line with nothing to escape */
    assert_null(strchr(r->err, '\n'));
    assert_null(strchr(r->err, '"'));
}

static void test_err_shape(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_err(r, "[1,2]", KVR_EPARSE, "expected a JSON object");
    expect_err(r, "17", KVR_EPARSE, "expected a JSON object");
    expect_err(r, "\"tokens\"", KVR_EPARSE, "expected a JSON object");
    expect_err(r, "null", KVR_EPARSE, "expected a JSON object");
    expect_err(r, "{}", KVR_EPARSE, "tokens: missing");
    expect_err(r, "{\"block_size\":4}", KVR_EPARSE, "tokens: missing");
    expect_err(r, "{\"tokens\":[]}", KVR_EPARSE, "block_size: missing");
    expect_err(r, "{\"tokens\":null,\"block_size\":4}", KVR_EPARSE, "tokens: missing (null)");
    expect_err(r, "{\"tokens\":[],\"block_size\":null}", KVR_EPARSE, "block_size: missing (null)");
    expect_err(r, "{\"tokens\":[],\"tokens\":[],\"block_size\":1}", KVR_EPARSE,
               "tokens: duplicate key");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"lora_name\":null,\"lora_name\":\"a\"}",
               KVR_EPARSE, "lora_name: duplicate key");
}

static void test_err_tokens(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_err(r, "{\"tokens\":{},\"block_size\":4}", KVR_EPARSE,
               "tokens: must be an array of integers");
    expect_err(r, "{\"tokens\":\"0 1 2\",\"block_size\":4}", KVR_EPARSE,
               "tokens: must be an array of integers");
    expect_err(r, "{\"tokens\":5,\"block_size\":4}", KVR_EPARSE,
               "tokens: must be an array of integers");
    const char *bad[] = {"-1", "4294967296", "1.0", "1e3", "0.5", "99999999999999999999999",
                         "null", "true", "\"7\"", "[1]", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[128];
        snprintf(line, sizeof line, "{\"tokens\":[0,1,2,%s,4],\"block_size\":4}", bad[i]);
        expect_err(r, line, i < 6 ? KVR_ERANGE : KVR_EPARSE,
                   "tokens[3]: not an integer in [0, 4294967295]");
    }
}

static void test_err_block_size(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_err(r, "{\"tokens\":[],\"block_size\":0}", KVR_ERANGE, "block_size: must be >= 1");
    expect_err(r, "{\"tokens\":[],\"block_size\":-0}", KVR_ERANGE, "block_size: must be >= 1");
    expect_err(r, "{\"tokens\":[],\"block_size\":-16}", KVR_ERANGE, "block_size: must be >= 1");
    expect_err(r, "{\"tokens\":[],\"block_size\":-99999999999999999999999}", KVR_ERANGE,
               "block_size: must be >= 1");
    expect_err(r, "{\"tokens\":[],\"block_size\":2147483648}", KVR_ERANGE,
               "block_size: must be <= 2147483647");
    expect_err(r, "{\"tokens\":[],\"block_size\":99999999999999999999999}", KVR_ERANGE,
               "block_size: must be <= 2147483647");
    expect_err(r, "{\"tokens\":[],\"block_size\":16.0}", KVR_EPARSE, "block_size: not an integer");
    expect_err(r, "{\"tokens\":[],\"block_size\":1E1}", KVR_EPARSE, "block_size: not an integer");
    expect_err(r, "{\"tokens\":[],\"block_size\":\"16\"}", KVR_EPARSE, "block_size: not an integer");
    expect_err(r, "{\"tokens\":[],\"block_size\":[16]}", KVR_EPARSE, "block_size: not an integer");
    expect_err(r, "{\"tokens\":[],\"block_size\":true}", KVR_EPARSE, "block_size: not an integer");
}

static void test_err_options(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"lora_name\":7}", KVR_EPARSE,
               "lora_name: must be a string or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"lora_name\":[\"a\"]}", KVR_EPARSE,
               "lora_name: must be a string or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"cache_namespace\":{}}", KVR_EPARSE,
               "cache_namespace: must be a string or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"is_eagle\":\"true\"}", KVR_EPARSE,
               "is_eagle: must be true, false or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"is_eagle\":1}", KVR_EPARSE,
               "is_eagle: must be true, false or null");
}

static void test_err_mm(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":[[42]]}", KVR_EPARSE,
               "block_mm_hashes: must be an object or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":42}", KVR_EPARSE,
               "block_mm_hashes: must be an object or null");
    const char *keys[] = {"x", "", "-1", "01", "1.0", " 1", "4294967296", "99999999999"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char line[128], msg[128];
        snprintf(line, sizeof line,
                 "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"0\":[1],\"%s\":[1]}}",
                 keys[i]);
        snprintf(msg, sizeof msg, "block_mm_hashes: key '%s' is not a block index", keys[i]);
        expect_err(r, line, KVR_EPARSE, msg);
    }
    /* keys are shown sanitised and shortened */
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"a\\\"b\\n\\u00fc\":[]}}",
               KVR_EPARSE, "block_mm_hashes: key 'a?b?\?\?' is not a block index");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":"
                  "{\"0123456789012345678901234567890123456789xyz\":[]}}",
               KVR_EPARSE,
               "block_mm_hashes: key '0123456789012345678901234567890123456...' is not a block "
               "index");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"3\":[1],\"3\":[2]}}",
               KVR_EPARSE, "block_mm_hashes: duplicate block index 3");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"3\":42}}", KVR_EPARSE,
               "block_mm_hashes['3']: must be an array of integers or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"3\":{}}}", KVR_EPARSE,
               "block_mm_hashes['3']: must be an array of integers or null");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":"
                  "{\"0\":[1],\"7\":[1,18446744073709551616]}}",
               KVR_ERANGE, "block_mm_hashes['7'][1]: not an integer in [0, 18446744073709551615]");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"7\":[-1]}}", KVR_ERANGE,
               "block_mm_hashes['7'][0]: not an integer in [0, 18446744073709551615]");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"7\":[\"1\"]}}",
               KVR_EPARSE, "block_mm_hashes['7'][0]: not an integer in [0, 18446744073709551615]");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"7\":[[1]]}}", KVR_EPARSE,
               "block_mm_hashes['7'][0]: not an integer in [0, 18446744073709551615]");
}

static void test_limits(void **state)
{
    kvr_hash_req_t *r = *state;
    assert_int_equal(r->limits.max_tokens, KVR_HASH_REQ_MAX_TOKENS);
    r->limits.max_tokens = 4;
    r->limits.max_mm_blocks = 2;
    r->limits.max_mm_hashes = 3;
    expect_ok(r, "{\"tokens\":[1,2,3,4],\"block_size\":1,"
                 "\"block_mm_hashes\":{\"0\":[1,2],\"1\":[3]}}");
    expect_err(r, "{\"tokens\":[1,2,3,4,5],\"block_size\":1}", KVR_ETOOBIG,
               "tokens: more than 4 tokens");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"0\":[],\"1\":[],\"2\":[]}}",
               KVR_ETOOBIG, "block_mm_hashes: more than 2 entries");
    expect_err(r, "{\"tokens\":[],\"block_size\":1,\"block_mm_hashes\":{\"0\":[1,2],\"1\":[3,4]}}",
               KVR_ETOOBIG, "block_mm_hashes: more than 3 hashes in total");
    /* a limit error stops the parse before the rest of the line is read */
    expect_err(r, "{\"tokens\":[1,2,3,4,5,\"x\"],\"block_size\":0}", KVR_ETOOBIG,
               "tokens: more than 4 tokens");
}

/* ---- reuse -------------------------------------------------------------------------------- */

static void test_reuse(void **state)
{
    kvr_hash_req_t *r = *state;
    expect_ok(r, "{\"tokens\":[1,2,3,4],\"block_size\":2,\"lora_name\":\"l\",\"is_eagle\":true,"
                 "\"cache_namespace\":\"n\",\"block_mm_hashes\":{\"1\":[5,4]}}");
    assert_int_equal(r->opts.n_mm, 1);
    expect_err_prefix(r, "{\"tokens\":[1,2,x]}", "invalid JSON at byte ");
    assert_int_equal(r->n_tokens, 0);
    assert_null(r->opts.lora_name);
    assert_int_equal(r->opts.n_mm, 0);
    /* nothing carries over from the previous lines */
    expect_ok(r, "{\"tokens\":[9],\"block_size\":1}");
    assert_int_equal(r->n_tokens, 1);
    assert_int_equal(r->tokens[0], 9);
    assert_null(r->opts.lora_name);
    assert_null(r->opts.cache_namespace);
    assert_false(r->opts.is_eagle);
    assert_int_equal(r->opts.n_mm, 0);
    assert_null(r->opts.mm);

    /* a big line, then small ones: buffers are kept (same addresses, no reallocation) */
    size_t n = 100000;
    char *line = malloc(n * 8 + 128);
    assert_non_null(line);
    char *p = line + sprintf(line, "{\"block_size\":16,\"block_mm_hashes\":{\"2\":[3,1]},\"tokens\":[");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%zu", i ? "," : "", (i * 7919) % 150000);
    strcpy(p, "]}");
    expect_ok(r, line);
    assert_int_equal(r->n_tokens, n);
    assert_int_equal(r->tokens[n - 1], ((n - 1) * 7919) % 150000);
    const uint32_t *tok = r->tokens;
    const kvr_block_mm_t *mm = r->opts.mm;
    const void *arena = r->arena;
    for (int round = 0; round < 3; round++) {
        expect_ok(r, line);
        assert_ptr_equal(r->tokens, tok);
        assert_ptr_equal(r->opts.mm, mm);
        assert_ptr_equal(r->arena, arena);
        expect_ok(r, "{\"tokens\":[1,2],\"block_size\":1,\"block_mm_hashes\":{\"0\":[1]}}");
        assert_ptr_equal(r->tokens, tok);
        assert_ptr_equal(r->opts.mm, mm);
    }
    free(line);

    /* deinit then init again leaves a usable decoder */
    kvr_hash_req_deinit(r);
    kvr_hash_req_init(r);
    expect_ok(r, "{\"tokens\":[1],\"block_size\":1}");
    kvr_hash_req_deinit(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_minimal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nulls_and_empties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_u64_extremes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mm_sorting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_err_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_err_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_err_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_err_block_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_err_options, setup, teardown),
        cmocka_unit_test_setup_teardown(test_err_mm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reuse, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

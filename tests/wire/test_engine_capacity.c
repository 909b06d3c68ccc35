/*
 * test_engine_capacity.c: an engine's KV-cache size from its /metrics text
 * (wire/engine_capacity.c): vLLM's cache_config_info labels, SGLang's pool gauge, the
 * conversions to the router's blocks, and the refusals a worker's bad text gets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/engine_capacity.h"

static int parse(const char *t, uint32_t bs, kvr_engine_capacity_t *c, char *err)
{
    return kvr_engine_capacity_parse(t, strlen(t), bs, c, err, 200);
}

/* vLLM's line as a running engine writes it, among others; blocks of another size convert. */
static void test_vllm(void **s)
{
    (void)s;
    const char *t = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                    "# TYPE vllm:cache_config_info gauge\n"
                    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n"
                    "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\","
                    "enable_prefix_caching=\"True\",engine=\"0\",num_cpu_blocks=\"0\","
                    "num_gpu_blocks=\"27000\",num_gpu_blocks_override=\"None\"} 1.0\n";
    kvr_engine_capacity_t c;
    char err[200];
    assert_int_equal(parse(t, 16, &c, err), KVR_OK);
    assert_int_equal(c.blocks, 27000);
    assert_int_equal(c.tokens, 27000 * 16);
    assert_int_equal(c.source, KVR_CAPACITY_VLLM);
    assert_int_equal(parse(t, 64, &c, err), KVR_OK); /* a router hashing 64-token blocks */
    assert_int_equal(c.blocks, 27000 / 4);
    /* two engine cores (data parallel): the smaller, every rank gets the same */
    const char *two =
        "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"900\"} 1\n"
        "vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"800\"} 1\n";
    assert_int_equal(parse(two, 16, &c, err), KVR_OK);
    assert_int_equal(c.blocks, 800);
    /* no trailing newline, CRLF lines */
    assert_int_equal(
        parse("vllm:cache_config_info{num_gpu_blocks=\"10\",block_size=\"32\"} 1.0\r\n", 16, &c,
              err),
        KVR_OK);
    assert_int_equal(c.blocks, 20);
}

static void test_sglang(void **s)
{
    (void)s;
    kvr_engine_capacity_t c;
    char err[200];
    const char *t = "# TYPE sglang:max_total_num_tokens gauge\n"
                    "sglang:max_total_num_tokens{model_name=\"meta-llama/Llama-3.1-8B\"} 1.23e+06\n"
                    "sglang:page_size{model_name=\"m\"} 1.0\n";
    assert_int_equal(parse(t, 16, &c, err), KVR_OK);
    assert_int_equal(c.tokens, 1230000);
    assert_int_equal(c.blocks, 1230000 / 16);
    assert_int_equal(c.source, KVR_CAPACITY_SGLANG);
    assert_int_equal(parse("sglang:max_total_num_tokens 4096", 16, &c, err), KVR_OK);
    assert_int_equal(c.blocks, 256);
}

/* What a worker's text gets instead of a capacity, each refusal naming its cause. */
static void test_refusals(void **s)
{
    (void)s;
    kvr_engine_capacity_t c;
    char err[200];
    assert_int_equal(parse("vllm:num_requests_running 1\n", 16, &c, err), KVR_ENOTFOUND);
    assert_non_null(strstr(err, "no vllm:cache_config_info"));
    assert_int_equal(
        parse("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n", 16, &c, err),
        KVR_ENOTFOUND);
    assert_non_null(strstr(err, "not sized yet"));
    static const char *bad[] = {
        "vllm:cache_config_info{block_size=\"16\"} 1\n",                        /* no count */
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"-3\"} 1\n",  /* not one */
        "vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"3\"} 1\n",    /* size 0 */
        "vllm:cache_config_info{num_gpu_blocks=\"3\"} 1\n",                     /* no size */
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"3\"\n",      /* cut */
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"3\"}\n",     /* no value */
        "vllm:cache_config_info{block_size=\"1\\6\",num_gpu_blocks=\"3\"} 1\n", /* escape */
        "vllm:cache_config_info{block_size=16,num_gpu_blocks=\"3\"} 1\n",       /* unquoted */
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"99999999999999999\"} 1\n",
        "sglang:max_total_num_tokens{model_name=\"m\"} NaN\n",
        "sglang:max_total_num_tokens -5\n",
        "sglang:max_total_num_tokens 1e300\n",
        "sglang:max_total_num_tokens\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        int rc = parse(bad[i], 16, &c, err);
        if (rc != KVR_EPARSE)
            fail_msg("case %zu: rc %d, want a parse error: %s", i, rc, bad[i]);
        assert_true(strstr(err, "vllm:cache_config_info") != NULL ||
                    strstr(err, "sglang:max_total_num_tokens") != NULL);
    }
    /* a pool under one router block, a block size of 0 */
    assert_int_equal(parse("sglang:max_total_num_tokens 8\n", 16, &c, err), KVR_EINVAL);
    assert_int_equal(parse("sglang:max_total_num_tokens 8\n", 0, &c, err), KVR_EINVAL);
    /* other metrics may be anything: they are skipped unread */
    assert_int_equal(parse("garbage {{{ \"\\\nsglang:max_total_num_tokens 64\n", 16, &c, err),
                     KVR_OK);
    assert_int_equal(c.blocks, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm),
        cmocka_unit_test(test_sglang),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_openai.c: the OpenAI request decoder, response encoders, chat template and SSE framing
 * (wire/openai.c), and the toy tokenizer (wire/toytok.c).
 *
 * Every body goes through two decoders, one with the fast token path and one without; they
 * must agree on the status, the message and the decoded request (compared through the
 * canonical request encoding). Every accepted body is re-encoded and decoded again (round
 * trip). Covered: every field of the three endpoints, prompt shapes, precedence rules,
 * nulls, errors with their exact messages, unknown keys at any depth, duplicates, UTF-8 and
 * escapes, limits, decoder reuse, randomised token-array formatting; encoders compared as
 * whole strings and parsed back with yajl's tree parser; the tokenizer's documented ids.
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
#include <yajl/yajl_tree.h>

#include "kvrouter.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/toytok.h"

enum { CMPL = KVR_OAI_COMPLETIONS, CHAT = KVR_OAI_CHAT, TOK = KVR_OAI_TOKENIZE };

static kvr_oai_decoder_t *fast_d, *slow_d, *rt_d;
static kvr_oai_request_t out_fast, out_slow, out_rt;

/* The canonical encoding of a decoded request (malloc'd). */
static char *canon(const kvr_oai_request_t *r)
{
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_oai_encode_request(&w, r);
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
static int check_n(kvr_oai_decoder_t *fd, kvr_oai_decoder_t *sd, int ep, const char *body,
                   size_t len)
{
    int a = kvr_oai_decode(fd, (kvr_oai_endpoint_t)ep, body, len, &out_fast);
    int b = kvr_oai_decode(sd, (kvr_oai_endpoint_t)ep, body, len, &out_slow);
    if (a != b || strcmp(kvr_oai_decoder_error(fd), kvr_oai_decoder_error(sd)) != 0)
        fail_msg("fast/slow disagree on %.200s\n  fast %d '%s'\n  slow %d '%s'", body, a,
                 kvr_oai_decoder_error(fd), b, kvr_oai_decoder_error(sd));
    if (a != KVR_OK) {
        assert_true(all_zero(&out_fast, sizeof out_fast));
        assert_true(all_zero(&out_slow, sizeof out_slow));
        const char *m = kvr_oai_decoder_error(fd);
        assert_true(m[0] != '\0' && strlen(m) < 256);
        for (const char *c = m; *c; c++)  /* fit for a JSON string verbatim */
            assert_true(*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\');
        return a;
    }
    assert_string_equal(kvr_oai_decoder_error(fd), "");
    char *x = canon(&out_fast), *y = canon(&out_slow);
    if (strcmp(x, y) != 0)
        fail_msg("fast/slow decode differently:\n  %.300s\n  %.300s", x, y);
    assert_int_equal(out_fast.prompt_kind, out_slow.prompt_kind);
    assert_int_equal(out_fast.n_tokens, out_slow.n_tokens);
    if (out_fast.n_tokens > 0)
        assert_memory_equal(out_fast.tokens, out_slow.tokens, out_fast.n_tokens * 4);
    int c = kvr_oai_decode(rt_d, (kvr_oai_endpoint_t)ep, x, strlen(x), &out_rt);
    if (c != KVR_OK)
        fail_msg("round trip of %.300s: %s", x, kvr_oai_decoder_error(rt_d));
    char *z = canon(&out_rt);
    assert_string_equal(x, z);
    assert_int_equal(out_rt.prompt_kind, out_fast.prompt_kind);
    free(x);
    free(y);
    free(z);
    return a;
}

static int check(int ep, const char *body)
{
    return check_n(fast_d, slow_d, ep, body, strlen(body));
}

static const kvr_oai_request_t *ok(int ep, const char *body)
{
    int st = check(ep, body);
    if (st != KVR_OK)
        fail_msg("%.300s: %d %s", body, st, kvr_oai_decoder_error(fast_d));
    return &out_fast;
}

static void err(int ep, const char *body, int status, const char *msg)
{
    int st = check(ep, body);
    if (st != status || strcmp(kvr_oai_decoder_error(fast_d), msg) != 0)
        fail_msg("%.300s\n  got %d '%s'\n  expected %d '%s'", body, st,
                 kvr_oai_decoder_error(fast_d), status, msg);
}

static void err_prefix(int ep, const char *body, const char *prefix)
{
    int st = check(ep, body);
    if (st != KVR_EPARSE || strncmp(kvr_oai_decoder_error(fast_d), prefix, strlen(prefix)) != 0)
        fail_msg("%.300s: got %d '%s', expected prefix '%s'", body, st,
                 kvr_oai_decoder_error(fast_d), prefix);
}

/* A refusal: status KVR_EINVAL and a message that starts with prefix. */
static void refused(int ep, const char *body, const char *prefix)
{
    int st = check(ep, body);
    if (st != KVR_EINVAL || strncmp(kvr_oai_decoder_error(fast_d), prefix, strlen(prefix)) != 0)
        fail_msg("%.300s: got %d '%s', expected %d and prefix '%s'", body, st,
                 kvr_oai_decoder_error(fast_d), KVR_EINVAL, prefix);
}

static kvr_oai_options_t slow_opts(void)
{
    kvr_oai_options_t o = {KVR_OAI_MAX_TOKENS, KVR_OAI_MAX_TEXT_BYTES, KVR_OAI_MAX_MESSAGES,
                           KVR_OAI_MAX_ALLOWED_IDS, true};
    return o;
}

static int setup(void **state)
{
    (void)state;
    kvr_oai_options_t slow = slow_opts();
    fast_d = kvr_oai_decoder_new(NULL);
    slow_d = kvr_oai_decoder_new(&slow);
    rt_d = kvr_oai_decoder_new(NULL);
    return fast_d != NULL && slow_d != NULL && rt_d != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvr_oai_decoder_free(fast_d);
    kvr_oai_decoder_free(slow_d);
    kvr_oai_decoder_free(rt_d);
    kvr_oai_decoder_free(NULL);
    return 0;
}

static void assert_tokens(const uint32_t *t, size_t n, const uint32_t *want, size_t n_want)
{
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(t[i], want[i]);
}

/* ---- /v1/completions: prompt shapes ------------------------------------------------------- */

static void test_completions_text(void **state)
{
    (void)state;
    const kvr_oai_request_t *r = ok(CMPL, "{\"model\":\"m-1\",\"prompt\":\"Hello, world\"}");
    assert_int_equal(r->endpoint, KVR_OAI_COMPLETIONS);
    assert_string_equal(r->model, "m-1");
    assert_int_equal(r->model_len, 3);
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TEXT);
    assert_int_equal(r->given_kind, KVR_OAI_PROMPT_TEXT);
    assert_int_equal(r->text_len, 12);
    assert_string_equal(r->text, "Hello, world");
    assert_null(r->tokens);
    assert_int_equal(r->n_tokens, 0);
    assert_null(r->prompt_ids);
    assert_null(r->messages);
    assert_false(r->has_max_tokens);
    assert_false(r->stream);
    assert_false(r->include_usage);
    assert_false(r->has_nvext);
    assert_false(r->nvext.has_token_data);
    assert_false(r->nvext.want_worker_id);

    /* model is optional; "" and null read as absent */
    r = ok(CMPL, "{\"prompt\":\"x\"}");
    assert_null(r->model);
    r = ok(CMPL, "{\"prompt\":\"x\",\"model\":\"\"}");
    assert_null(r->model);
    r = ok(CMPL, "{\"prompt\":\"x\",\"model\":null}");
    assert_null(r->model);
    /* a one-element array holding a string */
    r = ok(CMPL, "{\"prompt\":[\"one\"]}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TEXT);
    assert_string_equal(r->text, "one");
}

static void test_completions_tokens(void **state)
{
    (void)state;
    static const uint32_t want[] = {0, 1, 2, 4294967295u, 42};
    const kvr_oai_request_t *r = ok(CMPL, "{\"prompt\":[0,1,2,4294967295,42]}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TOKENS);
    assert_int_equal(r->given_kind, KVR_OAI_PROMPT_TOKENS);
    assert_tokens(r->tokens, r->n_tokens, want, 5);
    assert_true(r->prompt_ids == r->tokens && r->n_prompt_ids == 5);
    assert_null(r->text);

    r = ok(CMPL, "{\"prompt\":[[0,1,2,4294967295,42]]}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TOKENS);
    assert_tokens(r->tokens, r->n_tokens, want, 5);
    r = ok(CMPL, " {\n\"prompt\" :\t[ [ 0 , 1,2 ,4294967295,\n42 ] ] }\n");
    assert_tokens(r->tokens, r->n_tokens, want, 5);
    r = ok(CMPL, "{\"prompt\":[-0, 7]}");  /* -0 is 0, as in api_json */
    assert_int_equal(r->tokens[0], 0);

    kvr_oai_stats_t st;
    kvr_oai_decoder_stats(fast_d, &st);
    assert_true(st.bodies >= 4 && st.fast_path >= 3);
    kvr_oai_decoder_stats(slow_d, &st);
    assert_true(st.fast_path == 0 && st.errors == 0);
}

static void test_completions_prompt_errors(void **state)
{
    (void)state;
    err(CMPL, "{\"model\":\"m\"}", KVR_EINVAL, "prompt: missing");
    err(CMPL, "{\"prompt\":null}", KVR_EINVAL, "prompt: must not be null");
    err(CMPL, "{\"prompt\":\"\"}", KVR_EINVAL, "prompt: must not be empty");
    err(CMPL, "{\"prompt\":[]}", KVR_EINVAL, "prompt: must not be empty");
    err(CMPL, "{\"prompt\":[[]]}", KVR_EINVAL, "prompt: must not be empty");
    err(CMPL, "{\"prompt\":[\"\"]}", KVR_EINVAL, "prompt: must not be empty");
    const char *type =
        "prompt: must be a string, an array of token ids, or a one-element array of either";
    err(CMPL, "{\"prompt\":5}", KVR_EINVAL, type);
    err(CMPL, "{\"prompt\":true}", KVR_EINVAL, type);
    err(CMPL, "{\"prompt\":{\"a\":1}}", KVR_EINVAL, type);
    const char *batched = "prompt: batched prompts are not supported";
    err(CMPL, "{\"prompt\":[\"a\",\"b\"]}", KVR_EINVAL, batched);
    err(CMPL, "{\"prompt\":[[1],[2]]}", KVR_EINVAL, batched);
    err(CMPL, "{\"prompt\":[[1],\"a\"]}", KVR_EINVAL, batched);
    err(CMPL, "{\"prompt\":[\"a\",[1]]}", KVR_EINVAL, batched);
    err(CMPL, "{\"prompt\":[\"a\",null]}", KVR_EINVAL, batched);
    err(CMPL, "{\"prompt\":[null]}", KVR_EINVAL,
        "prompt[0]: must be a string or an array of token ids");
    err(CMPL, "{\"prompt\":[{}]}", KVR_EINVAL,
        "prompt[0]: must be a string or an array of token ids");
    err(CMPL, "{\"prompt\":[1,\"a\"]}", KVR_EINVAL, "prompt[1]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[1,[2]]}", KVR_EINVAL, "prompt[1]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[1,2,4294967296]}", KVR_EINVAL,
        "prompt[2]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[-1]}", KVR_EINVAL, "prompt[0]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[1.0]}", KVR_EINVAL, "prompt[0]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[1e2]}", KVR_EINVAL, "prompt[0]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[[5,null]]}", KVR_EINVAL,
        "prompt[0][1]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":[[5,[6]]]}", KVR_EINVAL,
        "prompt[0][1]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":\"a\",\"prompt\":\"b\"}", KVR_EINVAL, "prompt: duplicate key");
    /* messages mean nothing to /v1/completions */
    err(CMPL, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", KVR_EINVAL,
        "prompt: missing");
}

/* ---- scalars: max_tokens, stream, stream_options, n ----------------------------------------- */

static void test_scalars(void **state)
{
    (void)state;
    const kvr_oai_request_t *r = ok(CMPL,
        "{\"prompt\":\"x\",\"max_tokens\":4294967295,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":false},\"n\":1}");
    assert_true(r->has_max_tokens);
    assert_int_equal(r->max_tokens, 4294967295u);
    assert_true(r->stream);
    assert_true(r->include_usage);

    r = ok(CMPL, "{\"prompt\":\"x\",\"max_tokens\":null,\"stream\":null,\"stream_options\":null,"
                 "\"n\":null}");
    assert_false(r->has_max_tokens || r->stream || r->include_usage);
    r = ok(CMPL, "{\"prompt\":\"x\",\"max_tokens\":1,\"stream\":false,"
                 "\"stream_options\":{\"include_usage\":null}}");
    assert_true(r->has_max_tokens && r->max_tokens == 1);
    assert_false(r->stream || r->include_usage);
    /* max_completion_tokens is a chat field: ignored by /v1/completions */
    r = ok(CMPL, "{\"prompt\":\"x\",\"max_completion_tokens\":5}");
    assert_false(r->has_max_tokens);

    err(CMPL, "{\"prompt\":\"x\",\"max_tokens\":0}", KVR_EINVAL,
        "max_tokens: not an integer in [1, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"max_tokens\":-0}", KVR_EINVAL,
        "max_tokens: not an integer in [1, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"max_tokens\":4294967296}", KVR_EINVAL,
        "max_tokens: not an integer in [1, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"max_tokens\":16.0}", KVR_EINVAL,
        "max_tokens: not an integer in [1, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"max_tokens\":\"16\"}", KVR_EINVAL,
        "max_tokens: not an integer in [1, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"max_tokens\":99999999999999999999999}", KVR_EINVAL,
        "max_tokens: not an integer in [1, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"stream\":1}", KVR_EINVAL,
        "stream: must be true, false or null");
    err(CMPL, "{\"prompt\":\"x\",\"stream\":\"true\"}", KVR_EINVAL,
        "stream: must be true, false or null");
    err(CMPL, "{\"prompt\":\"x\",\"stream_options\":true}", KVR_EINVAL,
        "stream_options: must be an object or null");
    err(CMPL, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":\"yes\"}}", KVR_EINVAL,
        "stream_options.include_usage: must be true, false or null");
    err(CMPL, "{\"prompt\":\"x\",\"n\":2}", KVR_EINVAL, "n: only 1 is supported");
    err(CMPL, "{\"prompt\":\"x\",\"n\":0}", KVR_EINVAL, "n: only 1 is supported");
    err(CMPL, "{\"prompt\":\"x\",\"n\":1.5}", KVR_EINVAL, "n: only 1 is supported");
    err(CMPL, "{\"prompt\":\"x\",\"n\":\"1\"}", KVR_EINVAL, "n: only 1 is supported");
    err(CMPL, "{\"prompt\":\"x\",\"stream\":true,\"stream\":false}", KVR_EINVAL,
        "stream: duplicate key");
    err(CMPL, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true,"
              "\"include_usage\":true}}", KVR_EINVAL,
        "stream_options.include_usage: duplicate key");
    err(CMPL, "{\"prompt\":\"x\",\"model\":5}", KVR_EINVAL, "model: must be a string or null");
}

static void test_ignored_fields(void **state)
{
    (void)state;
    const kvr_oai_request_t *r = ok(CMPL,
        "{\"model\":\"m\",\"prompt\":[1,2,3],\"temperature\":0.7,\"top_p\":0.9,\"seed\":-5,"
        "\"stop\":[\"\\n\",\"END\"],\"logprobs\":null,\"echo\":false,\"ignore_eos\":true,"
        "\"frequency_penalty\":1e400,\"logit_bias\":{\"50256\":-100},\"user\":\"u\","
        "\"x\":{\"prompt\":\"not me\",\"a\":[[[{\"nvext\":{\"token_data\":[9]}}]]]},"
        "\"nvext\":{\"unknown\":[1,{\"b\":null}],\"x\":{\"annotations\":[\"a\"]}}}");
    /* (nvext.annotations itself is the reference's hint, refused: test_parse_errors) */
    static const uint32_t want[] = {1, 2, 3};
    assert_tokens(r->tokens, r->n_tokens, want, 3);
    assert_true(r->has_nvext);
    assert_false(r->nvext.has_token_data);
    /* unknown keys may repeat; known ones may not */
    r = ok(CMPL, "{\"prompt\":\"x\",\"u\":1,\"u\":2,\"stream_options\":{\"z\":1,\"z\":[]}}");
    assert_false(r->include_usage);
    /* a key that is known elsewhere is unknown here: no duplicate */
    r = ok(CMPL, "{\"prompt\":\"x\",\"include_usage\":5,\"token_data\":\"a\",\"role\":1}");
    assert_false(r->include_usage);
}

/* ---- nvext ------------------------------------------------------------------------------ */

static void test_nvext_all_fields(void **state)
{
    (void)state;
    const kvr_oai_request_t *r =
        ok(CMPL, "{\"prompt\":\"ignored text\",\"nvext\":{\"token_data\":[7,8,9],"
                 "\"backend_instance_id\":18446744073709551615,\"dp_rank\":4294967295,"
                 "\"lora_name\":\"adapter\",\"priority\":-2147483648,\"priority_jump\":-2.5,"
                 "\"expected_output_tokens\":128,"
                 "\"allowed_worker_ids\":[9,3,18446744073709551615,3],"
                 "\"extra_fields\":[\"timing\",\"other\",\"worker_id\"]}}");
    static const uint32_t want[] = {7, 8, 9};
    assert_true(r->has_nvext);
    const kvr_oai_nvext_t *x = &r->nvext;
    /* token_data wins over the prompt, which stays visible */
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TOKENS);
    assert_tokens(r->tokens, r->n_tokens, want, 3);
    assert_int_equal(r->given_kind, KVR_OAI_PROMPT_TEXT);
    assert_string_equal(r->text, "ignored text");
    assert_true(x->has_token_data);
    assert_tokens(x->token_data, x->n_token_data, want, 3);
    assert_true(x->has_backend_instance_id && x->backend_instance_id == UINT64_MAX);
    assert_true(x->has_dp_rank && x->dp_rank == 4294967295u);
    assert_string_equal(x->lora_name, "adapter");
    assert_int_equal(x->lora_name_len, 7);
    assert_true(x->has_priority && x->priority == INT32_MIN);
    assert_true(x->has_priority_jump && x->priority_jump == -2.5);
    assert_true(x->has_expected_output_tokens && x->expected_output_tokens == 128);
    assert_true(x->has_allowed_worker_ids);
    assert_int_equal(x->n_allowed_worker_ids, 4);  /* ascending, repeats kept */
    assert_true(x->allowed_worker_ids[0] == 3 && x->allowed_worker_ids[1] == 3 &&
                x->allowed_worker_ids[2] == 9 && x->allowed_worker_ids[3] == UINT64_MAX);
    assert_true(x->want_worker_id && x->want_timing);

    /* token_data alone is a prompt; over prompt ids too */
    r = ok(CMPL, "{\"nvext\":{\"token_data\":[4]}}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TOKENS);
    assert_int_equal(r->given_kind, 0);
    assert_int_equal(r->n_tokens, 1);
    assert_int_equal(r->tokens[0], 4);
    r = ok(CMPL, "{\"prompt\":[1,2],\"nvext\":{\"token_data\":[3]}}");
    assert_int_equal(r->n_tokens, 1);
    assert_int_equal(r->tokens[0], 3);
    assert_int_equal(r->n_prompt_ids, 2);
    assert_int_equal(r->prompt_ids[1], 2);
    /* when token_data runs, an empty prompt does not matter */
    r = ok(CMPL, "{\"prompt\":[],\"nvext\":{\"token_data\":[3]}}");
    assert_int_equal(r->given_kind, KVR_OAI_PROMPT_TOKENS);
    assert_int_equal(r->n_prompt_ids, 0);
    assert_null(r->prompt_ids);

    /* integer priority; empty lists; "" lora */
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"priority\":3,\"allowed_worker_ids\":[],"
                 "\"extra_fields\":[],\"lora_name\":\"\"}}");
    x = &r->nvext;
    assert_true(x->has_priority && x->priority == 3);
    assert_true(x->has_allowed_worker_ids && x->n_allowed_worker_ids == 0);
    assert_null(x->allowed_worker_ids);
    assert_false(x->want_worker_id || x->want_timing);
    assert_null(x->lora_name);

    /* agent_hints: latency_sensitivity is the queue head start, priority the engine's, osl
     * the expected output; each may repeat its nvext twin only with the same value */
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"agent_hints\":{\"latency_sensitivity\":1.5,"
                 "\"priority\":-7,\"osl\":64,\"speculative_prefill\":true},\"priority\":-7}}");
    x = &r->nvext;
    assert_true(x->has_priority_jump && x->priority_jump == 1.5);
    assert_true(x->has_priority && x->priority == -7);
    assert_true(x->has_expected_output_tokens && x->expected_output_tokens == 64);
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"priority\":1,\"agent_hints\":{\"priority\":2}}}",
        KVR_EINVAL,
        "nvext.agent_hints.priority: differs from nvext.priority (give one, or both equal)");
    err(CMPL,
        "{\"prompt\":\"x\",\"nvext\":{\"agent_hints\":{\"osl\":2},\"expected_output_tokens\":3}}",
        KVR_EINVAL,
        "nvext.agent_hints.osl: differs from nvext.expected_output_tokens (give one, or both "
        "equal)");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"priority\":2.5}}", KVR_EINVAL,
        "nvext.priority: not an integer in [-2147483648, 2147483647]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"agent_hints\":{\"priority\":2147483648}}}",
        KVR_EINVAL, "nvext.agent_hints.priority: not an integer in [-2147483648, 2147483647]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"agent_hints\":{\"latency_sensitivity\":\"a\"}}}",
        KVR_EINVAL, "nvext.agent_hints.latency_sensitivity: must be a finite number");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"agent_hints\":[]}}", KVR_EINVAL,
        "nvext.agent_hints: must be an object or null");
    /* chat image parts: each url's XXH3-64 (seed 0), in order; the text parts as before */
    r = ok(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                 "\"text\":\"look\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
                 "\"http://x/a.png\",\"detail\":\"low\"}},{\"image_url\":{\"url\":\"b\"},"
                 "\"type\":\"image_url\"}]}]}");
    assert_int_equal(r->n_images, 2);
    assert_true(r->images[0] == XXH3_64bits_withSeed("http://x/a.png", 14, 0));
    assert_true(r->images[1] == XXH3_64bits_withSeed("b", 1, 0));
    assert_int_equal(r->messages[0].content_len, 4);
    err(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
        KVR_EINVAL, "messages[0].content[0].image_url.url: missing");
    err(CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
        "\"text\":\"t\",\"image_url\":{\"url\":\"u\"}}]}]}",
        KVR_EINVAL, "messages[0].content[0]: an image_url part has no text");
    err(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}", KVR_EINVAL,
        "messages[0].content[0].type: unsupported content part type 'audio' (text or "
        "image_url)");
    /* session_control */
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"session_control\":{\"session_id\":\"c1\","
                 "\"action\":\"close\"},\"dp_rank\":1}}");
    assert_true(r->nvext.session_id_len == 2 && r->nvext.session_close && r->nvext.dp_rank == 1);
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"session_control\":{\"action\":\"close\"}}}",
        KVR_EINVAL, "nvext.session_control.session_id: missing");
    err(CMPL,
        "{\"prompt\":\"x\",\"nvext\":{\"session_control\":{\"session_id\":\"c\","
        "\"action\":\"stop\"}}}",
        KVR_EINVAL, "nvext.session_control.action: must be open or close");
    /* the decoder is back in nvext after agent_hints closes */
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"agent_hints\":{},\"dp_rank\":2}}");
    assert_true(r->nvext.has_dp_rank && r->nvext.dp_rank == 2);

    /* nulls */
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"token_data\":null,\"backend_instance_id\":null,"
                 "\"dp_rank\":null,\"lora_name\":null,\"priority\":null,"
                 "\"expected_output_tokens\":null,\"allowed_worker_ids\":null,"
                 "\"extra_fields\":null}}");
    x = &r->nvext;
    assert_true(r->has_nvext);
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TEXT);
    assert_false(x->has_token_data || x->has_backend_instance_id || x->has_dp_rank ||
                 x->has_priority || x->has_expected_output_tokens ||
                 x->has_allowed_worker_ids);
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":null}");
    assert_false(r->has_nvext);
    r = ok(CMPL, "{\"prompt\":\"x\",\"nvext\":{}}");
    assert_true(r->has_nvext);

    /* chat reads nvext too */
    r = ok(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                 "\"nvext\":{\"token_data\":[5,6],\"extra_fields\":[\"worker_id\"]}}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TOKENS);
    assert_int_equal(r->given_kind, KVR_OAI_PROMPT_MESSAGES);
    assert_int_equal(r->n_tokens, 2);
    assert_int_equal(r->n_messages, 1);
    assert_true(r->nvext.want_worker_id && !r->nvext.want_timing);
    r = ok(CHAT, "{\"nvext\":{\"token_data\":[5]}}");
    assert_int_equal(r->n_tokens, 1);
}

static void test_nvext_errors(void **state)
{
    (void)state;
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":[]}", KVR_EINVAL, "nvext: must be an object or null");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"token_data\":\"1 2\"}}", KVR_EINVAL,
        "nvext.token_data: must be an array of integers or null");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"token_data\":[1,-2]}}", KVR_EINVAL,
        "nvext.token_data[1]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"token_data\":[[1]]}}", KVR_EINVAL,
        "nvext.token_data[0]: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"token_data\":[]}}", KVR_EINVAL,
        "nvext.token_data: must not be empty");
    err(CMPL, "{\"nvext\":{\"token_data\":null}}", KVR_EINVAL, "prompt: missing");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"backend_instance_id\":18446744073709551616}}",
        KVR_EINVAL, "nvext.backend_instance_id: not an integer in [0, 18446744073709551615]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"backend_instance_id\":-1}}", KVR_EINVAL,
        "nvext.backend_instance_id: not an integer in [0, 18446744073709551615]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"dp_rank\":4294967296}}", KVR_EINVAL,
        "nvext.dp_rank: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"lora_name\":7}}", KVR_EINVAL,
        "nvext.lora_name: must be a string or null");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"priority\":\"high\"}}", KVR_EINVAL,
        "nvext.priority: not an integer in [-2147483648, 2147483647]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"priority_jump\":1e999}}", KVR_EINVAL,
        "nvext.priority_jump: must be a finite number");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"expected_output_tokens\":1.5}}", KVR_EINVAL,
        "nvext.expected_output_tokens: not an integer in [0, 4294967295]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"allowed_worker_ids\":[1,\"2\"]}}", KVR_EINVAL,
        "nvext.allowed_worker_ids[1]: not an integer in [0, 18446744073709551615]");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"allowed_worker_ids\":5}}", KVR_EINVAL,
        "nvext.allowed_worker_ids: must be an array of integers or null");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"extra_fields\":[\"a\",1]}}", KVR_EINVAL,
        "nvext.extra_fields[1]: must be a string");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"extra_fields\":\"worker_id\"}}", KVR_EINVAL,
        "nvext.extra_fields: must be an array of strings or null");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"dp_rank\":1,\"dp_rank\":1}}", KVR_EINVAL,
        "nvext.dp_rank: duplicate key");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{},\"nvext\":{}}", KVR_EINVAL, "nvext: duplicate key");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"token_data\":[1],\"token_data\":[1]}}", KVR_EINVAL,
        "nvext.token_data: duplicate key");

    /* too many ids */
    size_t cap = 64 + (KVR_OAI_MAX_ALLOWED_IDS + 1) * 3;
    char *b = malloc(cap);
    assert_non_null(b);
    size_t n = (size_t)snprintf(b, cap, "{\"prompt\":\"x\",\"nvext\":{\"allowed_worker_ids\":[");
    for (size_t i = 0; i <= KVR_OAI_MAX_ALLOWED_IDS; i++)
        n += (size_t)snprintf(b + n, cap - n, "%s1", i ? "," : "");
    n += (size_t)snprintf(b + n, cap - n, "]}}");
    assert_int_equal(check_n(fast_d, slow_d, CMPL, b, n), KVR_ETOOBIG);
    assert_string_equal(kvr_oai_decoder_error(fast_d),
                        "nvext.allowed_worker_ids: more than 4096 ids");
    free(b);
}

/* ---- /v1/chat/completions --------------------------------------------------------------- */

static void test_chat_messages(void **state)
{
    (void)state;
    const kvr_oai_request_t *r = ok(CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"content\":[{\"type\":\"text\",\"text\":\"Hello \"},{\"text\":\"there\",\"type\":"
        "\"text\"}],\"role\":\"user\",\"name\":\"bob\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"f\"}}]},{\"role\":\"tool\"},"
        "{\"role\":\"user\",\"content\":[]}],\"max_tokens\":9}");
    assert_int_equal(r->endpoint, KVR_OAI_CHAT);
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_MESSAGES);
    assert_int_equal(r->given_kind, KVR_OAI_PROMPT_MESSAGES);
    assert_int_equal(r->n_messages, 5);
    const kvr_oai_message_t *m = r->messages;
    assert_string_equal(m[0].role, "system");
    assert_int_equal(m[0].role_len, 6);
    assert_string_equal(m[0].content, "Be brief.");
    assert_int_equal(m[0].content_len, 9);
    assert_string_equal(m[1].role, "user");
    assert_string_equal(m[1].content, "Hello \nthere"); /* parts joined by "\n", as vLLM */
    assert_int_equal(m[1].content_len, 12);
    assert_string_equal(m[2].role, "assistant");
    assert_string_equal(m[2].content, "");
    assert_int_equal(m[2].content_len, 0);
    assert_string_equal(m[3].role, "tool");
    assert_string_equal(m[3].content, "");
    assert_string_equal(m[4].content, "");
    assert_true(r->has_max_tokens && r->max_tokens == 9);
    assert_null(r->tokens);

    /* max_completion_tokens wins over max_tokens, in either order */
    r = ok(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"x\"}],\"max_tokens\":5,"
                 "\"max_completion_tokens\":7}");
    assert_true(r->has_max_tokens && r->max_tokens == 7);
    r = ok(CHAT, "{\"max_completion_tokens\":7,\"messages\":[{\"role\":\"u\",\"content\":\"x\"}],"
                 "\"max_tokens\":5}");
    assert_int_equal(r->max_tokens, 7);
    r = ok(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"x\"}],\"max_tokens\":5,"
                 "\"max_completion_tokens\":null}");
    assert_int_equal(r->max_tokens, 5);
    r = ok(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"x\"}],"
                 "\"max_completion_tokens\":3}");
    assert_int_equal(r->max_tokens, 3);
    /* prompt means nothing to chat */
    r = ok(CHAT, "{\"prompt\":5,\"messages\":[{\"role\":\"u\",\"content\":\"x\"}]}");
    assert_null(r->text);
}

static void test_chat_errors(void **state)
{
    (void)state;
    err(CHAT, "{\"model\":\"m\"}", KVR_EINVAL, "messages: missing");
    err(CHAT, "{\"messages\":null}", KVR_EINVAL, "messages: must not be null");
    err(CHAT, "{\"messages\":[]}", KVR_EINVAL, "messages: must not be empty");
    err(CHAT, "{\"messages\":{}}", KVR_EINVAL, "messages: must be an array of message objects");
    err(CHAT, "{\"messages\":\"hi\"}", KVR_EINVAL,
        "messages: must be an array of message objects");
    err(CHAT, "{\"messages\":[{\"role\":\"u\"},\"hi\"]}", KVR_EINVAL,
        "messages[1]: must be an object");
    err(CHAT, "{\"messages\":[[]]}", KVR_EINVAL, "messages[0]: must be an object");
    err(CHAT, "{\"messages\":[{\"content\":\"x\"}]}", KVR_EINVAL, "messages[0].role: missing");
    err(CHAT, "{\"messages\":[{\"role\":\"u\"},{\"role\":null}]}", KVR_EINVAL,
        "messages[1].role: must not be null");
    err(CHAT, "{\"messages\":[{\"role\":\"\"}]}", KVR_EINVAL,
        "messages[0].role: must be 1 to 64 bytes");
    err(CHAT, "{\"messages\":[{\"role\":"
              "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}]}",
        KVR_EINVAL, "messages[0].role: must be 1 to 64 bytes");
    err(CHAT, "{\"messages\":[{\"role\":\"u\\n\"}]}", KVR_EINVAL,
        "messages[0].role: contains a control character");
    err(CHAT, "{\"messages\":[{\"role\":5}]}", KVR_EINVAL,
        "messages[0].role: must be a string or null");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"role\":\"v\"}]}", KVR_EINVAL,
        "messages[0].role: duplicate key");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"a\",\"content\":\"b\"}]}", KVR_EINVAL,
        "messages[0].content: duplicate key");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":5}]}", KVR_EINVAL,
        "messages[0].content: must be a string, an array of content parts or null");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":{\"type\":\"text\"}}]}", KVR_EINVAL,
        "messages[0].content: must be a string, an array of content parts or null");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[\"x\"]}]}", KVR_EINVAL,
        "messages[0].content[0]: must be an object");
    err(CHAT,
        "{\"messages\":[{\"role\":\"u\"},{\"role\":\"u\",\"content\":[{\"type\":\"text\","
        "\"text\":\"a\"},{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"x\"}}]}]}",
        KVR_EINVAL,
        "messages[1].content[1].type: unsupported content part type 'input_audio' (text or "
        "image_url)");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"text\":\"a\"}]}]}", KVR_EINVAL,
        "messages[0].content[0].type: missing");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":null,\"text\":\"a\"}]}]}",
        KVR_EINVAL, "messages[0].content[0].type: must not be null");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\"}]}]}", KVR_EINVAL,
        "messages[0].content[0].text: missing");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}",
        KVR_EINVAL, "messages[0].content[0].text: must be a string or null");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":3}]}]}", KVR_EINVAL,
        "messages[0].content[0].type: must be a string or null");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\",\"text\":\"a\","
              "\"text\":\"b\"}]}]}", KVR_EINVAL, "messages[0].content[0].text: duplicate key");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
        KVR_EINVAL, "max_completion_tokens: not an integer in [1, 4294967295]");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"x\"}],\"n\":3}", KVR_EINVAL,
        "n: only 1 is supported");
    /* per-message and per-part duplicate tracking restarts with each object */
    const kvr_oai_request_t *r = ok(CHAT,
        "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"text\",\"text\":\"1\"},"
        "{\"type\":\"text\",\"text\":\"2\"}]},{\"role\":\"b\",\"content\":\"3\"}]}");
    assert_string_equal(r->messages[0].content, "1\n2");
    assert_string_equal(r->messages[1].content, "3");
}

/* ---- /tokenize -------------------------------------------------------------------------- */

static void test_tokenize(void **state)
{
    (void)state;
    const kvr_oai_request_t *r = ok(TOK, "{\"model\":\"m\",\"prompt\":\"Hello\","
                                         "\"add_special_tokens\":false,\"stream\":\"any\"}");
    assert_int_equal(r->endpoint, KVR_OAI_TOKENIZE);
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TEXT);
    assert_string_equal(r->text, "Hello");
    assert_false(r->stream);
    r = ok(TOK, "{\"prompt\":\"\"}");  /* count 0 is a fine answer */
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TEXT);
    assert_int_equal(r->text_len, 0);
    assert_non_null(r->text);
    r = ok(TOK, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                "\"add_generation_prompt\":true}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_MESSAGES);
    assert_int_equal(r->n_messages, 1);
    r = ok(TOK, "{\"messages\":[]}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_MESSAGES);
    assert_int_equal(r->n_messages, 0);
    /* nvext means nothing to /tokenize */
    r = ok(TOK, "{\"prompt\":\"a\",\"nvext\":{\"token_data\":[1]}}");
    assert_int_equal(r->prompt_kind, KVR_OAI_PROMPT_TEXT);
    assert_false(r->has_nvext);

    err(TOK, "{\"model\":\"m\"}", KVR_EINVAL, "prompt: missing");
    err(TOK, "{\"prompt\":null}", KVR_EINVAL, "prompt: must not be null");
    err(TOK, "{\"prompt\":[1,2]}", KVR_EINVAL, "prompt: must be a string");
    err(TOK, "{\"prompt\":7}", KVR_EINVAL, "prompt: must be a string");
    err(TOK, "{\"prompt\":\"a\",\"messages\":[]}", KVR_EINVAL,
        "prompt: give either prompt or messages, not both");
}

/* ---- strings: UTF-8 and escapes --------------------------------------------------------- */

static void test_strings(void **state)
{
    (void)state;
    const kvr_oai_request_t *r = ok(CMPL,
        "{\"prompt\":\"caf\\u00e9 \\ud83d\\ude00\\n\\t\\\"q\\\"\\\\ \\/ \\u0000end\","
        "\"model\":\"\\u00e9t\\u00e9\"}");
    static const char want[] = "caf\xc3\xa9 \xf0\x9f\x98\x80\n\t\"q\"\\ / \0end";
    assert_int_equal(r->text_len, sizeof want - 1);
    assert_memory_equal(r->text, want, sizeof want - 1);
    assert_int_equal(r->text[r->text_len], '\0');
    assert_string_equal(r->model, "\xc3\xa9t\xc3\xa9");
    /* raw UTF-8 passes through */
    r = ok(CHAT, "{\"messages\":[{\"role\":\"\xe7\x94\xa8\",\"content\":[{\"type\":\"text\","
                 "\"text\":\"\xe4\xbd\xa0\"},{\"type\":\"text\",\"text\":\"\\u0000\xe5\xa5\xbd\"}]}]}");
    assert_string_equal(r->messages[0].role, "\xe7\x94\xa8");
    assert_int_equal(r->messages[0].content_len, 8);
    assert_memory_equal(r->messages[0].content, "\xe4\xbd\xa0\n\0\xe5\xa5\xbd", 8);

    err(CMPL, "{\"prompt\":\"\\udc00\"}", KVR_EINVAL, "prompt: is not valid UTF-8");
    err(CMPL, "{\"prompt\":\"\xc0\x80\"}", KVR_EINVAL, "prompt: is not valid UTF-8");
    err(CMPL, "{\"prompt\":[\"\xed\xa0\x80\"]}", KVR_EINVAL, "prompt: is not valid UTF-8");
    err(CMPL, "{\"prompt\":\"\xf4\x90\x80\x80\"}", KVR_EINVAL, "prompt: is not valid UTF-8");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"\xc0\x80\"}]}", KVR_EINVAL,
        "messages[0].content: is not valid UTF-8");
    err(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\",\"text\":"
              "\"\\udfff\"}]}]}", KVR_EINVAL, "messages[0].content[0].text: is not valid UTF-8");
    err(CHAT, "{\"messages\":[{\"role\":\"\xc0\x80\"}]}", KVR_EINVAL,
        "messages[0].role: is not valid UTF-8");
    err(CMPL, "{\"prompt\":\"x\",\"model\":\"a\\u0001\"}", KVR_EINVAL,
        "model: contains a control character");
    err(CMPL, "{\"prompt\":\"x\",\"nvext\":{\"lora_name\":\"\\u007f\"}}", KVR_EINVAL,
        "nvext.lora_name: contains a control character");
    err(CMPL, "{\"prompt\":\"x\",\"model\":\"\xc0\x80\"}", KVR_EINVAL,
        "model: is not valid UTF-8");
    /* yajl's own check: a stray continuation byte */
    err_prefix(CMPL, "{\"prompt\":\"\x80\"}", "invalid JSON at byte");

    char big[KVR_OAI_MAX_NAME_BYTES + 64];
    int n = snprintf(big, sizeof big, "{\"prompt\":\"x\",\"model\":\"");
    memset(big + n, 'a', KVR_OAI_MAX_NAME_BYTES + 1);
    snprintf(big + n + KVR_OAI_MAX_NAME_BYTES + 1, 8, "\"}");
    err(CMPL, big, KVR_EINVAL, "model: longer than 1024 bytes");
    snprintf(big + n + KVR_OAI_MAX_NAME_BYTES, 8, "\"}");
    r = ok(CMPL, big);
    assert_int_equal(r->model_len, KVR_OAI_MAX_NAME_BYTES);
}

/* ---- not JSON, not an object, nesting ---------------------------------------------------- */

static void test_parse_errors(void **state)
{
    (void)state;
    err(CMPL, "", KVR_EPARSE, "empty body");
    err(CMPL, " \n\t", KVR_EPARSE, "empty body");
    err(CMPL, "[1]", KVR_EPARSE, "expected a JSON object");
    err(CHAT, "\"x\"", KVR_EPARSE, "expected a JSON object");
    err(TOK, "null", KVR_EPARSE, "expected a JSON object");
    err_prefix(CMPL, "{", "invalid JSON at byte");
    err_prefix(CMPL, "{\"prompt\":[1,2", "invalid JSON");
    err_prefix(CMPL, "{\"prompt\":[1,2,]}", "invalid JSON at byte");
    err_prefix(CMPL, "{\"prompt\":\"x\"} x", "invalid JSON at byte");
    err_prefix(CMPL, "{\"prompt\":\"x\"}{}", "invalid JSON at byte");
    err_prefix(CMPL, "{\"prompt\":[1,2]]", "invalid JSON at byte");
    err_prefix(CMPL, "{\"prompt\":[01]}", "invalid JSON at byte");
    err_prefix(CMPL, "{\"prompt\":[[1,2],}", "invalid JSON at byte");
    err_prefix(CHAT, "{'messages':[]}", "invalid JSON at byte");
    /* the fast path cut the body at the array; the message is the same as yajl's alone */
    err_prefix(CMPL, "{\"prompt\":[1,2,3],\"x\":tru}", "invalid JSON at byte 25: ");
    err_prefix(CMPL, "{\"prompt\":[1,2,3],\"model\"}", "invalid JSON at byte");
    /* our checks run as yajl goes: a duplicate key before a syntax error is reported */
    err(CMPL, "{\"prompt\":[1,2,3],\"prompt\"}", KVR_EINVAL, "prompt: duplicate key");
    /* the reference's hints this router does not act on: refused by name, never dropped */
    refused(CMPL, "{\"prompt\":[1,2,3],\"nvext\":{\"routing_constraints\":{}}}",
               "nvext.routing_constraints: taint constraints are taken by POST /v1/route");
    refused(CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
               "\"nvext\":{\"annotations\":[\"query_instance_id\"]}}",
               "nvext.annotations: annotations are not supported");
    refused(CMPL, "{\"prompt\":[1,2,3],\"nvext\":{\"router_config_override\":{}}}",
               "nvext.router_config_override: per-request cost overrides");
    refused(CMPL, "{\"prompt\":[1,2,3],\"router_config_override\":{\"x\":1}}",
               "router_config_override: per-request cost overrides");
    refused(CMPL,
               "{\"prompt\":[1,2,3],\"nvext\":{\"agent_hints\":{\"strict_priority\":1}}}",
               "nvext.agent_hints.strict_priority: strict priority is not supported");
    const kvr_oai_request_t *pr =
        ok(CMPL, "{\"prompt\":[1,2,3],\"nvext\":{\"prefill_worker_id\":4,"
                 "\"prefill_dp_rank\":2}}");
    assert_true(pr->nvext.has_prefill_dp_rank);
    assert_int_equal(pr->nvext.prefill_dp_rank, 2);

    kvr_oai_request_t r;
    assert_int_equal(kvr_oai_decode(fast_d, KVR_OAI_COMPLETIONS, NULL, 3, &r), KVR_EINVAL);
    assert_string_equal(kvr_oai_decoder_error(fast_d), "no body");
    assert_int_equal(kvr_oai_decode(fast_d, KVR_OAI_COMPLETIONS, NULL, 0, &r), KVR_EPARSE);
    assert_int_equal(kvr_oai_decode(fast_d, (kvr_oai_endpoint_t)7, "{}", 2, &r), KVR_EINVAL);
    assert_string_equal(kvr_oai_decoder_error(fast_d), "unknown endpoint");

    /* unknown values nest at most 64 levels deep, counted from the top */
    char deep[256];
    for (int depth = 62; depth <= 64; depth++) {
        int n = snprintf(deep, sizeof deep, "{\"prompt\":\"x\",\"u\":");
        for (int i = 0; i < depth - 1; i++)
            deep[n++] = '[';
        for (int i = 0; i < depth - 1; i++)
            deep[n++] = ']';
        deep[n++] = '}';
        deep[n] = '\0';
        ok(CMPL, deep);
    }
    int n = snprintf(deep, sizeof deep, "{\"prompt\":\"x\",\"u\":");
    for (int i = 0; i < 64; i++)
        deep[n++] = '[';
    for (int i = 0; i < 64; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    err(CMPL, deep, KVR_EINVAL, "nesting deeper than 64 levels");
    /* inside a message part, the known levels count too */
    n = snprintf(deep, sizeof deep, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":"
                                    "\"text\",\"text\":\"a\",\"u\":");
    for (int i = 0; i < 59; i++)
        deep[n++] = '[';
    for (int i = 0; i < 59; i++)
        deep[n++] = ']';
    snprintf(deep + n, sizeof deep - (size_t)n, "}]}]}");
    ok(CHAT, deep);
    n = snprintf(deep, sizeof deep, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":"
                                    "\"text\",\"text\":\"a\",\"u\":");
    for (int i = 0; i < 60; i++)
        deep[n++] = '[';
    for (int i = 0; i < 60; i++)
        deep[n++] = ']';
    snprintf(deep + n, sizeof deep - (size_t)n, "}]}]}");
    err(CHAT, deep, KVR_EINVAL, "nesting deeper than 64 levels");
}

/* ---- limits ------------------------------------------------------------------------------- */

static void test_limits(void **state)
{
    (void)state;
    kvr_oai_options_t o = {100, 10, 3, 2, false};
    kvr_oai_decoder_t *f = kvr_oai_decoder_new(&o);
    o.no_fast_path = true;
    kvr_oai_decoder_t *s = kvr_oai_decoder_new(&o);
    assert_non_null(f);
    assert_non_null(s);
    char b[4096];
    for (int nested = 0; nested < 3; nested++) {
        for (size_t count = 99; count <= 101; count++) {
            size_t n = (size_t)snprintf(b, sizeof b, "%s", nested == 2
                                        ? "{\"nvext\":{\"token_data\":["
                                        : nested ? "{\"prompt\":[[" : "{\"prompt\":[");
            for (size_t i = 0; i < count; i++)
                n += (size_t)snprintf(b + n, sizeof b - n, "%s%zu", i ? "," : "", i * 7919);
            n += (size_t)snprintf(b + n, sizeof b - n, "%s",
                                  nested == 2 ? "]}}" : nested ? "]]}" : "]}");
            int st = check_n(f, s, CMPL, b, n);
            if (count <= 100) {
                assert_int_equal(st, KVR_OK);
                assert_int_equal(out_fast.n_tokens, count);
                assert_int_equal(out_fast.tokens[count - 1], (count - 1) * 7919);
            } else {
                assert_int_equal(st, KVR_ETOOBIG);
                assert_string_equal(kvr_oai_decoder_error(f),
                                    nested == 2 ? "nvext.token_data: more than 100 tokens"
                                                : "prompt: more than 100 tokens");
            }
        }
    }
    assert_int_equal(check_n(f, s, CMPL, "{\"prompt\":\"0123456789\"}", 23), KVR_OK);
    assert_int_equal(check_n(f, s, CMPL, "{\"prompt\":\"0123456789a\"}", 24), KVR_ETOOBIG);
    assert_string_equal(kvr_oai_decoder_error(f), "prompt: longer than 10 bytes");
    const char *m3 = "{\"messages\":[{\"role\":\"u\",\"content\":\"01234\"},{\"role\":\"u\",\"content\":"
                     "[{\"type\":\"text\",\"text\":\"567\"},{\"type\":\"text\",\"text\":\"8\"}]},"
                     "{\"role\":\"u\"}]}";
    assert_int_equal(check_n(f, s, CHAT, m3, strlen(m3)), KVR_OK);
    const char *m4 = "{\"messages\":[{\"role\":\"u\"},{\"role\":\"u\"},{\"role\":\"u\"},"
                     "{\"role\":\"u\"}]}";
    assert_int_equal(check_n(f, s, CHAT, m4, strlen(m4)), KVR_ETOOBIG);
    assert_string_equal(kvr_oai_decoder_error(f), "messages: more than 3 messages");
    const char *c11 = "{\"messages\":[{\"role\":\"u\",\"content\":\"01234\"},{\"role\":\"u\","
                      "\"content\":[{\"type\":\"text\",\"text\":\"567\"},{\"type\":\"text\","
                      "\"text\":\"890\"}]}]}";
    assert_int_equal(check_n(f, s, CHAT, c11, strlen(c11)), KVR_ETOOBIG);
    assert_string_equal(kvr_oai_decoder_error(f),
                        "messages: contents longer than 10 bytes in total");
    const char *ids = "{\"prompt\":\"x\",\"nvext\":{\"allowed_worker_ids\":[1,2,3]}}";
    assert_int_equal(check_n(f, s, CMPL, ids, strlen(ids)), KVR_ETOOBIG);
    assert_string_equal(kvr_oai_decoder_error(f), "nvext.allowed_worker_ids: more than 2 ids");
    kvr_oai_decoder_free(f);
    kvr_oai_decoder_free(s);

    /* options above the maxima */
    kvr_oai_options_t bad = slow_opts();
    bad.max_tokens = KVR_OAI_MAX_TOKENS + 1;
    assert_null(kvr_oai_decoder_new(&bad));
    bad = slow_opts();
    bad.max_text_bytes = KVR_OAI_MAX_TEXT_BYTES + 1;
    assert_null(kvr_oai_decoder_new(&bad));
    bad = slow_opts();
    bad.max_messages = KVR_OAI_MAX_MESSAGES + 1;
    assert_null(kvr_oai_decoder_new(&bad));
    bad = slow_opts();
    bad.max_allowed_ids = KVR_OAI_MAX_ALLOWED_IDS + 1;
    assert_null(kvr_oai_decoder_new(&bad));

    /* the default message limit */
    size_t cap = 64 + (KVR_OAI_MAX_MESSAGES + 1) * 16;
    char *big = malloc(cap);
    assert_non_null(big);
    size_t n = (size_t)snprintf(big, cap, "{\"messages\":[");
    for (size_t i = 0; i <= KVR_OAI_MAX_MESSAGES; i++)
        n += (size_t)snprintf(big + n, cap - n, "%s{\"role\":\"u\"}", i ? "," : "");
    n += (size_t)snprintf(big + n, cap - n, "]}");
    assert_int_equal(check_n(fast_d, slow_d, CHAT, big, n), KVR_ETOOBIG);
    assert_string_equal(kvr_oai_decoder_error(fast_d), "messages: more than 4096 messages");
    free(big);
}

/* A large body then small ones through the same decoder: nothing of the first leaks. */
static void test_reuse(void **state)
{
    (void)state;
    size_t count = 200000, cap = count * 8 + 64;
    char *b = malloc(cap);
    assert_non_null(b);
    size_t n = (size_t)snprintf(b, cap, "{\"prompt\":[");
    for (size_t i = 0; i < count; i++)
        n += (size_t)snprintf(b + n, cap - n, "%s%zu", i ? "," : "", (i * 2654435761u) % 100000);
    n += (size_t)snprintf(b + n, cap - n, "],\"nvext\":{\"token_data\":[1,2]}}");
    assert_int_equal(check_n(fast_d, slow_d, CMPL, b, n), KVR_OK);
    assert_int_equal(out_fast.n_prompt_ids, count);
    assert_int_equal(out_fast.prompt_ids[count - 1], ((count - 1) * 2654435761u) % 100000);
    free(b);
    const kvr_oai_request_t *r = ok(CMPL, "{\"prompt\":[5]}");
    assert_int_equal(r->n_tokens, 1);
    assert_false(r->nvext.has_token_data);
    r = ok(CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"x\"}]}");
    assert_int_equal(r->n_messages, 1);
    r = ok(CMPL, "{\"prompt\":\"y\"}");
    assert_int_equal(r->n_messages, 0);
    assert_string_equal(r->text, "y");
}

/* Many decoy "prompt" keys before the real one: the cut budget runs out, results do not. */
static void test_many_candidates(void **state)
{
    (void)state;
    char b[4096];
    for (int decoys = 0; decoys < 40; decoys += 3) {
        size_t n = (size_t)snprintf(b, sizeof b, "{");
        for (int i = 0; i < decoys; i++)
            n += (size_t)snprintf(b + n, sizeof b - n, "\"x%d\":{\"prompt\":[%d],"
                                  "\"token_data\":[1]},", i, i);
        n += (size_t)snprintf(b + n, sizeof b - n, "\"prompt\":[[3,1,4,1,5]],\"nvext\":"
                              "{\"token_data\":[9,2,6]}}");
        assert_int_equal(check_n(fast_d, slow_d, CMPL, b, n), KVR_OK);
        assert_int_equal(out_fast.n_prompt_ids, 5);
        assert_int_equal(out_fast.prompt_ids[4], 5);
        assert_int_equal(out_fast.n_tokens, 3);
        assert_int_equal(out_fast.tokens[2], 6);
    }
}

/* ---- randomised token arrays: the fast path against the slow one ---------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static size_t random_array(char *b, size_t cap, uint64_t *s, bool with_odd)
{
    static const char *const seps[] = {",", ",", ",", ", ", " , ", ",\n", "\t,", ",  "};
    static const char *const odd[] = {"-0", "-1", "1.0", "1e2", "01", "00", "4294967296",
                                      "99999999999", "\"5\"", "null", "", "1 2", "[1]", ",",
                                      "0", "4294967295", "1000000000", "123456789", "-"};
    size_t n_tok = rng_next(s) % 300;
    const char *sep = seps[rng_next(s) % 8];
    bool mixed = rng_next(s) % 4 == 0;
    size_t n = (size_t)snprintf(b, cap, "[%s", rng_next(s) % 4 ? "" : " ");
    for (size_t i = 0; i < n_tok && n + 64 < cap; i++) {
        if (i > 0)
            n += (size_t)snprintf(b + n, cap - n, "%s", mixed ? seps[rng_next(s) % 8] : sep);
        uint64_t r = rng_next(s);
        if (with_odd && r % 97 == 0) {
            n += (size_t)snprintf(b + n, cap - n, "%s", odd[r % (sizeof odd / sizeof odd[0])]);
            continue;
        }
        uint64_t v = (r >> 16) % 10000000000u;
        uint64_t mod = 1;
        for (unsigned k = 0, digits = 1 + (unsigned)(r >> 8) % 10; k < digits; k++)
            mod *= 10;
        v %= mod;
        if ((r >> 4) % 5 == 0)
            v %= 200000;
        n += (size_t)snprintf(b + n, cap - n, "%" PRIu64, v);
    }
    n += (size_t)snprintf(b + n, cap - n, "%s]", rng_next(s) % 4 ? "" : " ");
    return n;
}

static void test_random_token_arrays(void **state)
{
    (void)state;
    size_t cap = 1 << 16;
    char *b = malloc(cap), *arr = malloc(cap / 3), *arr2 = malloc(cap / 3);
    assert_non_null(b);
    assert_non_null(arr);
    assert_non_null(arr2);
    uint64_t seed = 20250611;
    for (int iter = 0; iter < 3000; iter++) {
        uint64_t s = seed + (uint64_t)iter;
        bool with_odd = rng_next(&s) % 3 == 0;
        random_array(arr, cap / 3, &s, with_odd);
        random_array(arr2, cap / 3, &s, with_odd);
        unsigned shape = (unsigned)(rng_next(&s) % 6);
        int ep = CMPL;
        size_t n;
        switch (shape) {
        case 0:
            n = (size_t)snprintf(b, cap, "{\"prompt\":%s}", arr);
            break;
        case 1:
            n = (size_t)snprintf(b, cap, "{\"model\":\"m\", \"prompt\" : [ %s ] ,\"n\":1}", arr);
            break;
        case 2:
            n = (size_t)snprintf(b, cap, "{\"prompt\":\"t\",\"nvext\":{\"token_data\":%s}}", arr);
            break;
        case 3:
            n = (size_t)snprintf(b, cap, "{\"nvext\":{\"token_data\":%s},\"prompt\":%s}", arr,
                                 arr2);
            break;
        case 4:
            n = (size_t)snprintf(b, cap, "{\"x\":{\"prompt\":%s},\"prompt\":[%s]}", arr2, arr);
            break;
        default:
            ep = CHAT;
            n = (size_t)snprintf(b, cap, "{\"messages\":[{\"role\":\"u\",\"prompt\":%s}],"
                                         "\"nvext\":{\"token_data\":%s}}", arr2, arr);
            break;
        }
        kvr_oai_stats_t before, after;
        kvr_oai_decoder_stats(fast_d, &before);
        int st = check_n(fast_d, slow_d, ep, b, n);
        kvr_oai_decoder_stats(fast_d, &after);
        if (st == KVR_OK && !with_odd && after.fast_path != before.fast_path + 1)
            fail_msg("seed %" PRIu64 ": a plain array missed the fast path: %.200s",
                     seed + (uint64_t)iter, b);
        if (!with_odd && st != KVR_OK) {
            /* only u32 overflow or an empty prompt can fail a body without odd elements */
            assert_int_equal(st, KVR_EINVAL);
            const char *m = kvr_oai_decoder_error(fast_d);
            assert_true(strstr(m, "not an integer") != NULL ||
                        strstr(m, "must not be empty") != NULL);
        }
    }
    free(b);
    free(arr);
    free(arr2);
}

/* ---- chat template ------------------------------------------------------------------------ */

static void test_render_chat(void **state)
{
    (void)state;
    kvr_oai_message_t m[2] = {
        {"system", 6, "Be brief.", 9},
        {"user", 4, "Hi\0!", 4},
    };
    static const char want[] = "<|system|>\nBe brief.\n<|user|>\nHi\0!\n<|assistant|>\n";
    char out[128];
    size_t n = kvr_oai_render_chat(m, 2, out, sizeof out);
    assert_int_equal(n, sizeof want - 1);
    assert_memory_equal(out, want, n);
    assert_int_equal(kvr_oai_render_chat(m, 2, NULL, 0), n);
    memset(out, 'z', sizeof out);
    assert_int_equal(kvr_oai_render_chat(m, 2, out, 10), n);  /* truncated, never past cap */
    assert_memory_equal(out, want, 10);
    assert_int_equal(out[10], 'z');
    assert_int_equal(kvr_oai_render_chat(NULL, 0, out, sizeof out), 14);
    assert_memory_equal(out, "<|assistant|>\n", 14);

    /* decoded messages render the same */
    const kvr_oai_request_t *r = ok(CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":"
                                          "\"Be brief.\"},{\"role\":\"user\",\"content\":"
                                          "[{\"type\":\"text\",\"text\":\"Hi\\u0000!\"}]}]}");
    n = kvr_oai_render_chat(r->messages, r->n_messages, out, sizeof out);
    assert_int_equal(n, sizeof want - 1);
    assert_memory_equal(out, want, n);
}

/* ---- encoders ------------------------------------------------------------------------------ */

static kvr_json_writer_t W;

static const char *finish_w(void)
{
    const char *d;
    size_t n;
    assert_int_equal(kvr_json_writer_finish(&W, &d, &n), KVR_OK);
    assert_int_equal(strlen(d), n);
    /* it parses back */
    char ebuf[256];
    yajl_val v = yajl_tree_parse(d, ebuf, sizeof ebuf);
    if (v == NULL)
        fail_msg("does not parse: %s: %s", d, ebuf);
    assert_true(YAJL_IS_OBJECT(v));
    yajl_tree_free(v);
    return d;
}

static void expect(const char *want)
{
    const char *got = finish_w();
    if (strcmp(got, want) != 0)
        fail_msg("\n  got  %s\n  want %s", got, want);
    kvr_json_writer_reset(&W);
}

static kvr_oai_response_t sample(bool chat)
{
    kvr_oai_response_t r = {
        .chat = chat,
        .id = chat ? "chatcmpl-1" : "cmpl-1",
        .created = 1700000000,
        .model = "m",
        .text = "Hi \"there\"\n",
        .text_len = 11,
        .finish_reason = "length",
        .usage = {.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2},
    };
    return r;
}

#define USAGE_JSON "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8," \
                   "\"prompt_tokens_details\":{\"cached_tokens\":2}}"

static void test_encode_responses(void **state)
{
    (void)state;
    kvr_json_writer_init(&W);
    kvr_oai_response_t r = sample(false);
    kvr_oai_encode_response(&W, &r);
    expect("{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"Hi \\\"there\\\"\\n\","
           "\"logprobs\":null,\"finish_reason\":\"length\"}]," USAGE_JSON "}");
    r = sample(true);
    r.finish_reason = "stop";
    kvr_oai_encode_response(&W, &r);
    expect("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
           "\"content\":\"Hi \\\"there\\\"\\n\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
           USAGE_JSON "}");
    /* with nvext.worker_id; NULL text is "" */
    r = sample(false);
    r.text = NULL;
    r.has_worker = true;
    r.worker = (kvr_oai_worker_info_t){7, 1, 18446744073709551615u, 4294967295u};
    kvr_oai_encode_response(&W, &r);
    expect("{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,"
           "\"finish_reason\":\"length\"}]," USAGE_JSON ",\"nvext\":{\"worker_id\":"
           "{\"prefill_worker_id\":7,\"prefill_dp_rank\":1,\"decode_worker_id\":"
           "18446744073709551615,\"decode_dp_rank\":4294967295}}}");
    kvr_json_writer_deinit(&W);
}

static void test_encode_chunks(void **state)
{
    (void)state;
    kvr_json_writer_init(&W);
    kvr_oai_response_t r = sample(false);
    r.text = " a";
    r.text_len = 2;
    r.finish_reason = NULL;
    kvr_oai_encode_chunk(&W, &r);
    expect("{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\" a\",\"logprobs\":null,"
           "\"finish_reason\":null}]}");
    r.finish_reason = "stop";
    r.has_usage = true;  /* continuous usage */
    kvr_oai_encode_chunk(&W, &r);
    expect("{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\" a\",\"logprobs\":null,"
           "\"finish_reason\":\"stop\"}]," USAGE_JSON "}");

    r = sample(true);
    r.text = "Hi";
    r.text_len = 2;
    r.finish_reason = NULL;
    r.first_chunk = true;
    kvr_oai_encode_chunk(&W, &r);
    expect("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
           "\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}]}");
    r.first_chunk = false;
    r.text = " you";
    r.text_len = 4;
    kvr_oai_encode_chunk(&W, &r);
    expect("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" you\"},"
           "\"logprobs\":null,\"finish_reason\":null}]}");
    r.text = NULL;
    r.finish_reason = "length";
    kvr_oai_encode_chunk(&W, &r);
    expect("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,"
           "\"finish_reason\":\"length\"}]}");
    r.text = "";
    r.text_len = 0;
    r.model = NULL;
    kvr_oai_encode_chunk(&W, &r);
    expect("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
           "\"model\":null,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},"
           "\"logprobs\":null,\"finish_reason\":\"length\"}]}");

    r = sample(true);
    kvr_oai_encode_usage_chunk(&W, &r);
    expect("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[]," USAGE_JSON "}");
    r = sample(false);
    r.has_worker = true;
    r.worker = (kvr_oai_worker_info_t){1, 0, 1, 0};
    kvr_oai_encode_usage_chunk(&W, &r);
    expect("{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"m\",\"choices\":[]," USAGE_JSON ",\"nvext\":{\"worker_id\":"
           "{\"prefill_worker_id\":1,\"prefill_dp_rank\":0,\"decode_worker_id\":1,"
           "\"decode_dp_rank\":0}}}");

    kvr_oai_usage_t u = {0, 0, 0};
    kvr_oai_encode_usage(&W, &u);
    expect("{\"prompt_tokens\":0,\"completion_tokens\":0,\"total_tokens\":0,"
           "\"prompt_tokens_details\":{\"cached_tokens\":0}}");
    kvr_json_writer_deinit(&W);
}

static void test_encode_misc(void **state)
{
    (void)state;
    kvr_json_writer_init(&W);
    static const uint32_t t[] = {1, 4294967295u, 0};
    kvr_oai_encode_tokenize(&W, t, 3, 8192);
    expect("{\"count\":3,\"max_model_len\":8192,\"tokens\":[1,4294967295,0],"
           "\"token_strs\":null}");
    kvr_oai_encode_tokenize(&W, NULL, 0, 1);
    expect("{\"count\":0,\"max_model_len\":1,\"tokens\":[],\"token_strs\":null}");

    kvr_oai_model_t models[2] = {{"mock", 1700000000, "kvrouter", 16384, NULL},
                                 {"other", 1, "me", 0, "mock"}};
    kvr_oai_encode_models(&W, models, 2);
    expect("{\"object\":\"list\",\"data\":[{\"id\":\"mock\",\"object\":\"model\",\"created\":"
           "1700000000,\"owned_by\":\"kvrouter\",\"max_model_len\":16384},{\"id\":\"other\","
           "\"object\":\"model\",\"created\":1,\"owned_by\":\"me\",\"parent\":\"mock\"}]}");
    kvr_oai_encode_models(&W, NULL, 0);
    expect("{\"object\":\"list\",\"data\":[]}");

    kvr_oai_encode_error(&W, "prompt: missing", NULL, 400);
    expect("{\"error\":{\"message\":\"prompt: missing\",\"type\":\"BadRequestError\","
           "\"param\":null,\"code\":400}}");
    kvr_oai_encode_error(&W, "no worker", "ServiceUnavailableError", 503);
    expect("{\"error\":{\"message\":\"no worker\",\"type\":\"ServiceUnavailableError\","
           "\"param\":null,\"code\":503}}");
    assert_string_equal(kvr_oai_error_type(404), "NotFoundError");
    assert_string_equal(kvr_oai_error_type(429), "RateLimitError");
    assert_string_equal(kvr_oai_error_type(413), "BadRequestError");
    assert_string_equal(kvr_oai_error_type(500), "InternalServerError");
    assert_string_equal(kvr_oai_error_type(502), "InternalServerError");
    assert_string_equal(kvr_oai_error_type(503), "ServiceUnavailableError");
    assert_int_equal(kvr_oai_http_status(KVR_EPARSE), 400);
    assert_int_equal(kvr_oai_http_status(KVR_EINVAL), 400);
    assert_int_equal(kvr_oai_http_status(KVR_ETOOBIG), 413);
    assert_int_equal(kvr_oai_http_status(KVR_ENOMEM), 500);

    /* the request encoder: the canonical body */
    const kvr_oai_request_t *r =
        ok(CHAT, "{\"stream\":true,\"nvext\":{\"extra_fields\":[\"timing\",\"worker_id\"],"
                 "\"priority\":-3,\"priority_jump\":0.5,\"dp_rank\":2},\"messages\":[{\"content\":["
                 "{\"type\":\"text\","
                 "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}],\"role\":\"user\"}],"
                 "\"max_completion_tokens\":4,\"stream_options\":{\"include_usage\":true},"
                 "\"model\":\"m\",\"temperature\":1}");
    kvr_oai_encode_request(&W, r);
    expect("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\"}],"
           "\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
           "\"nvext\":{\"dp_rank\":2,\"priority\":-3,\"priority_jump\":0.5,\"extra_fields\":["
           "\"worker_id\","
           "\"timing\"]}}");
    r = ok(TOK, "{\"prompt\":\"a\\u0000b\",\"stream\":true}");
    kvr_oai_encode_request(&W, r);
    expect("{\"prompt\":\"a\\u0000b\"}");

    char id[KVR_OAI_ID_BYTES];
    kvr_oai_make_id(id, false, 0x1234);
    assert_string_equal(id, "cmpl-0000000000001234");
    kvr_oai_make_id(id, true, UINT64_MAX);
    assert_string_equal(id, "chatcmpl-ffffffffffffffff");
    assert_string_equal(kvr_oai_endpoint_name(KVR_OAI_CHAT), "chat");
    assert_string_equal(kvr_oai_endpoint_name(KVR_OAI_COMPLETIONS), "completions");
    assert_string_equal(kvr_oai_endpoint_name(KVR_OAI_TOKENIZE), "tokenize");
    assert_string_equal(kvr_oai_endpoint_name((kvr_oai_endpoint_t)9), "unknown");

    char sse[64];
    size_t n = kvr_oai_sse_frame("{\"a\":1}", 7, sse, sizeof sse);
    assert_int_equal(n, 7 + KVR_OAI_SSE_OVERHEAD);
    assert_memory_equal(sse, "data: {\"a\":1}\n\n", n);
    memset(sse, 'z', sizeof sse);
    assert_int_equal(kvr_oai_sse_frame("{\"a\":1}", 7, sse, 4), 15);
    assert_memory_equal(sse, "datazz", 6);
    assert_int_equal(kvr_oai_sse_frame("{}", 2, NULL, 0), 10);
    assert_string_equal(KVR_OAI_SSE_DONE, "data: [DONE]\n\n");
    assert_int_equal(strlen(KVR_OAI_SSE_PREFIX) + strlen(KVR_OAI_SSE_SUFFIX),
                     KVR_OAI_SSE_OVERHEAD);
    kvr_json_writer_deinit(&W);
}

/* ---- toy tokenizer ------------------------------------------------------------------------- */

static void test_toytok(void **state)
{
    (void)state;
    uint32_t out[64];
    size_t n;
    static const uint32_t hello[] = {25366, 44, 32, 9918, 33};  /* as documented */
    assert_int_equal(kvr_toytok_encode("Hello, world!", 13, KVR_TOYTOK_VOCAB, out, 64, &n),
                     KVR_OK);
    assert_tokens(out, n, hello, 5);
    static const uint32_t a1[] = {97, 32, 49};
    assert_int_equal(kvr_toytok_encode("a 1", 3, KVR_TOYTOK_VOCAB, out, 64, &n), KVR_OK);
    assert_tokens(out, n, a1, 3);
    assert_int_equal(kvr_toytok_encode("", 0, KVR_TOYTOK_VOCAB, out, 64, &n), KVR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_toytok_count("Hello, world!", 13), 5);
    /* multi-byte UTF-8 stays in its word; control bytes are pieces */
    assert_int_equal(kvr_toytok_encode("caf\xc3\xa9\n\x01", 7, KVR_TOYTOK_VOCAB, out, 64, &n),
                     KVR_OK);
    assert_int_equal(n, 3);
    assert_true(out[0] >= 256 && out[1] == 10 && out[2] == 1);
    /* too small a buffer: the first cap ids, and the full count */
    assert_int_equal(kvr_toytok_encode("Hello, world!", 13, KVR_TOYTOK_VOCAB, out, 2, &n),
                     KVR_ETOOBIG);
    assert_int_equal(n, 5);
    assert_tokens(out, 2, hello, 2);
    assert_int_equal(kvr_toytok_encode("x", 1, 256, out, 64, &n), KVR_EINVAL);
    assert_int_equal(n, 0);
    /* vocab 257: every word is id 256 */
    assert_int_equal(kvr_toytok_encode("ab cd", 5, 257, out, 64, &n), KVR_OK);
    assert_true(n == 3 && out[0] == 256 && out[1] == 32 && out[2] == 256);

    /* deterministic, in range, at most one id per byte, concatenation at piece boundaries */
    uint64_t s = 77;
    char text[512];
    uint32_t ids[512], ids2[512], ids3[512];
    for (int iter = 0; iter < 500; iter++) {
        size_t len = rng_next(&s) % sizeof text;
        for (size_t i = 0; i < len; i++) {
            uint64_t r = rng_next(&s);
            text[i] = r % 3 ? (char)('a' + r % 26) : (char)(r >> 8);
        }
        uint32_t vocab = 257 + (uint32_t)(rng_next(&s) % 100000);
        size_t n1, n2, n3;
        assert_int_equal(kvr_toytok_encode(text, len, vocab, ids, 512, &n1), KVR_OK);
        assert_int_equal(kvr_toytok_encode(text, len, vocab, ids2, 512, &n2), KVR_OK);
        assert_int_equal(n1, n2);
        assert_true(n1 <= len && n1 == kvr_toytok_count(text, len));
        if (n1 > 0)
            assert_memory_equal(ids, ids2, n1 * sizeof ids[0]);
        for (size_t i = 0; i < n1; i++)
            assert_true(ids[i] < vocab);
        size_t cut = len > 0 ? rng_next(&s) % len : 0;
        text[cut] = ' ';  /* a boundary */
        kvr_toytok_encode(text, len, vocab, ids, 512, &n1);
        kvr_toytok_encode(text, cut + 1, vocab, ids2, 512, &n2);
        kvr_toytok_encode(text + cut + 1, len - cut - 1, vocab, ids3, 512, &n3);
        assert_int_equal(n1, n2 + n3);
        if (n2 > 0)
            assert_memory_equal(ids, ids2, n2 * sizeof ids[0]);
        if (n3 > 0)
            assert_memory_equal(ids + n2, ids3, n3 * sizeof ids[0]);
    }

    /* pieces */
    char p[KVR_TOYTOK_MAX_PIECE + 1];
    static const struct {
        uint32_t id;
        const char *text;
    } pieces[] = {
        {0, " "}, {10, " "}, {31, " "}, {32, " "}, {65, "A"}, {126, "~"}, {127, " "},
        {200, " "}, {255, " "}, {256, " a"}, {281, " z"}, {282, " aa"}, {307, " az"},
        {308, " ba"}, {32767, " avbl"}, {4294967295u, " mwlqkmz"},
    };
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        size_t pl = kvr_toytok_piece(pieces[i].id, p);
        assert_string_equal(p, pieces[i].text);
        assert_int_equal(pl, strlen(pieces[i].text));
        assert_true(pl >= 1 && pl <= KVR_TOYTOK_MAX_PIECE);
    }
    /* distinct word ids spell distinct words */
    char q[KVR_TOYTOK_MAX_PIECE + 1];
    for (uint32_t id = 256; id < 20000; id++) {
        kvr_toytok_piece(id, p);
        kvr_toytok_piece(id + 1, q);
        assert_true(strcmp(p, q) != 0);
    }
    static const uint32_t gen[] = {72, 105, 256, 308, 10};
    char txt[64];
    memset(txt, 'z', sizeof txt);
    size_t tl = kvr_toytok_decode(gen, 5, txt, sizeof txt);
    assert_int_equal(tl, 8);
    assert_memory_equal(txt, "Hi a ba ", 8);
    assert_int_equal(txt[8], 'z');
    assert_int_equal(kvr_toytok_decode(gen, 5, txt, 4), 8);
    assert_memory_equal(txt, "Hi a", 4);
    assert_int_equal(kvr_toytok_decode(gen, 5, NULL, 0), 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions_text),
        cmocka_unit_test(test_completions_tokens),
        cmocka_unit_test(test_completions_prompt_errors),
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_ignored_fields),
        cmocka_unit_test(test_nvext_all_fields),
        cmocka_unit_test(test_nvext_errors),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_chat_errors),
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_many_candidates),
        cmocka_unit_test(test_random_token_arrays),
        cmocka_unit_test(test_render_chat),
        cmocka_unit_test(test_encode_responses),
        cmocka_unit_test(test_encode_chunks),
        cmocka_unit_test(test_encode_misc),
        cmocka_unit_test(test_toytok),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

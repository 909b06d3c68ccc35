/*
 * test_oai_stream.c: the client side of OpenAI streaming responses (wire/oai_stream.c): a
 * mocker-style completions stream (token events, usage with cached tokens, nvext.worker_id),
 * chat deltas, SSE framing variants (CRLF, lone CR, comments, "data:" without a space,
 * multi-line data, other fields), the same result whatever the split of the bytes into feeds
 * (every split point, and random splits), what is malformed (not JSON, not an object, bad
 * usage types, data after [DONE], no [DONE], an oversized event) with messages naming the
 * event, error events, reuse after reset, and the whole-body readers (/v1/models, error
 * bodies).
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
#include "wire/oai_stream.h"

static const char MOCKER[] =
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" est\",\"logprobs\":null,\"finish_reason\":null}],"
    "\"nvext\":{\"worker_id\":{\"prefill_worker_id\":3,\"prefill_dp_rank\":0,"
    "\"decode_worker_id\":4,\"decode_dp_rank\":0}}}\n\n"
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" hln\",\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" lcb\",\"logprobs\":null,\"finish_reason\":\"length\"}]}"
    "\n\n"
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
    "\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,\"total_tokens\":23,"
    "\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n"
    "data: [DONE]\n\n";

/* Feeds text in pieces of the given sizes (cycled); returns finish's status. */
static int feed_split(kvr_oai_stream_t *s, const char *text, size_t len, const size_t *sizes,
                      size_t n_sizes, uint32_t *tokens)
{
    kvr_oai_stream_reset(s);
    size_t off = 0, k = 0;
    *tokens = 0;
    while (off < len) {
        size_t n = sizes[k++ % n_sizes];
        if (n > len - off)
            n = len - off;
        uint32_t t = 0;
        kvr_oai_stream_feed(s, text + off, n, &t);
        *tokens += t;
        off += n;
    }
    return kvr_oai_stream_finish(s);
}

static int feed_all(kvr_oai_stream_t *s, const char *text, uint32_t *tokens)
{
    size_t len = strlen(text);
    return feed_split(s, text, len, &len, 1, tokens);
}

static void test_mocker_stream(void **state)
{
    (void)state;
    kvr_oai_stream_t *s = kvr_oai_stream_new();
    assert_non_null(s);
    uint32_t toks;
    assert_int_equal(feed_all(s, MOCKER, &toks), KVR_OK);
    const kvr_oai_stream_info_t *in = kvr_oai_stream_info(s);
    assert_int_equal(toks, 3);
    assert_int_equal(in->n_token_events, 3);
    assert_int_equal(in->n_events, 5);
    assert_true(in->done);
    assert_true(in->has_usage && in->has_cached);
    assert_int_equal(in->prompt_tokens, 20);
    assert_int_equal(in->completion_tokens, 3);
    assert_int_equal(in->cached_tokens, 16);
    assert_true(in->has_worker);
    assert_int_equal(in->worker_id, 3);
    assert_int_equal(in->decode_worker_id, 4);
    assert_false(in->error_event);
    assert_string_equal(kvr_oai_stream_error(s), "");
    kvr_oai_stream_free(s);
    kvr_oai_stream_free(NULL);
}

/* Every two-piece split and some random splits give the same facts. */
static void test_splits(void **state)
{
    (void)state;
    kvr_oai_stream_t *s = kvr_oai_stream_new();
    size_t len = strlen(MOCKER);
    for (size_t cut = 0; cut <= len; cut++) {
        size_t sizes[2] = {cut ? cut : 1, len};
        uint32_t toks;
        assert_int_equal(feed_split(s, MOCKER, len, sizes, 2, &toks), KVR_OK);
        assert_int_equal(toks, 3);
        assert_int_equal(kvr_oai_stream_info(s)->cached_tokens, 16);
        assert_int_equal(kvr_oai_stream_info(s)->worker_id, 3);
    }
    unsigned seed = 7;
    for (int round = 0; round < 200; round++) {
        size_t sizes[16];
        for (size_t i = 0; i < 16; i++) {
            seed = seed * 1103515245u + 12345u;
            sizes[i] = 1 + (seed >> 16) % 40;
        }
        uint32_t toks;
        assert_int_equal(feed_split(s, MOCKER, len, sizes, 16, &toks), KVR_OK);
        assert_int_equal(toks, 3);
        assert_int_equal(kvr_oai_stream_info(s)->prompt_tokens, 20);
    }
    kvr_oai_stream_free(s);
}

static void test_framing(void **state)
{
    (void)state;
    kvr_oai_stream_t *s = kvr_oai_stream_new();
    uint32_t toks;
    /* CRLF and lone CR line ends, a comment, other fields, "data:" without a space, a JSON
     * object split over two data lines (joined by \n), a chat delta */
    const char *text =
        ": keep-alive\r\n\r\n"
        "event: message\r\nid: 1\r\nretry: 10\r\n"
        "data:{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}"
        "\r\n\r\n"
        "data: {\"choices\":[{\"index\":0,\r"
        "data: \"delta\":{\"content\":\" there\"}}]}\r\r"
        "data: {\"choices\":[{\"index\":0,\"delta\":{}}],\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":2}}\n\n"
        "data: [DONE]";
    assert_int_equal(feed_all(s, text, &toks), KVR_OK);
    const kvr_oai_stream_info_t *in = kvr_oai_stream_info(s);
    assert_int_equal(toks, 2);
    assert_true(in->done);
    assert_true(in->has_usage);
    assert_false(in->has_cached); /* no prompt_tokens_details */
    assert_int_equal(in->prompt_tokens, 5);
    assert_false(in->has_worker);

    /* empty text is not a token; a worker id given as one integer; nulls are absent */
    text = "data: {\"choices\":[{\"index\":0,\"text\":\"\"}],\"nvext\":{\"worker_id\":9},"
           "\"usage\":null,\"error\":null}\n\ndata: [DONE]\n\n";
    assert_int_equal(feed_all(s, text, &toks), KVR_OK);
    assert_int_equal(toks, 0);
    assert_true(in->has_worker);
    assert_int_equal(in->worker_id, 9);
    assert_int_equal(in->decode_worker_id, 9);
    assert_false(in->has_usage);
    assert_false(in->error_event);

    /* keys deeper or elsewhere do not count */
    text = "data: {\"x\":{\"choices\":[{\"text\":\"a\"}]},\"choices\":[{\"logprobs\":{\"text\":"
           "\"b\"}}],\"usage\":{\"x\":{\"prompt_tokens\":\"no\"}}}\n\ndata: [DONE]\n\n";
    assert_int_equal(feed_all(s, text, &toks), KVR_OK);
    assert_int_equal(toks, 0);
    assert_false(in->has_usage);
    kvr_oai_stream_free(s);
}

static void expect_error(kvr_oai_stream_t *s, const char *text, int status, const char *msg)
{
    uint32_t toks;
    int rc = feed_all(s, text, &toks);
    if (rc != status || strstr(kvr_oai_stream_error(s), msg) == NULL)
        fail_msg("%s: got %d '%s', want %d '%s'", text, rc, kvr_oai_stream_error(s), status, msg);
}

static void test_malformed(void **state)
{
    (void)state;
    kvr_oai_stream_t *s = kvr_oai_stream_new();
    expect_error(s, "data: {\"choices\":[]}\n\ndata: {nope\n\ndata: [DONE]\n\n", KVR_EPARSE,
                 "event 2: not JSON");
    expect_error(s, "data: [1,2]\n\ndata: [DONE]\n\n", KVR_EPARSE, "event 1: not a JSON object");
    expect_error(s, "data: \"x\"\n\n", KVR_EPARSE, "not a JSON object");
    expect_error(s, "data: {\"usage\":{\"prompt_tokens\":-1}}\n\n", KVR_EPARSE,
                 "usage.prompt_tokens: not an integer >= 0");
    expect_error(s, "data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":1.5}}}\n\n",
                 KVR_EPARSE, "usage.prompt_tokens_details.cached_tokens");
    expect_error(s, "data: {\"nvext\":{\"worker_id\":{\"prefill_worker_id\":\"a\"}}}\n\n",
                 KVR_EPARSE, "nvext.worker_id.prefill_worker_id");
    expect_error(s, "data: [DONE]\n\ndata: {}\n\n", KVR_EPARSE, "event 2: data after [DONE]");
    expect_error(s, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", KVR_EPARSE,
                 "stream ended without [DONE] after 1 events");
    expect_error(s, "", KVR_EPARSE, "without [DONE]");
    expect_error(s, "data:\n\n", KVR_EPARSE, "event 1: empty data");
    expect_error(s, "data: {\"a\":\"\xff\"}\n\n", KVR_EPARSE, "not JSON"); /* bad UTF-8 */

    /* sticky: later feeds change nothing */
    kvr_oai_stream_reset(s);
    uint32_t t = 99;
    assert_int_equal(kvr_oai_stream_feed(s, "data: x\n\n", 9, &t), KVR_EPARSE);
    assert_int_equal(t, 0);
    assert_int_equal(kvr_oai_stream_feed(s, "data: [DONE]\n\n", 14, &t), KVR_EPARSE);
    assert_false(kvr_oai_stream_info(s)->done);

    /* an event above the limit, fed in 1 MiB pieces */
    kvr_oai_stream_reset(s);
    size_t piece = (size_t)1 << 20;
    char *big = malloc(piece);
    assert_non_null(big);
    memset(big, 'a', piece);
    int rc = kvr_oai_stream_feed(s, "data: ", 6, NULL);
    for (size_t fed = 0; rc == KVR_OK && fed <= KVR_OAI_STREAM_MAX_EVENT; fed += piece)
        rc = kvr_oai_stream_feed(s, big, piece, NULL);
    free(big);
    assert_int_equal(rc, KVR_ETOOBIG);
    assert_non_null(strstr(kvr_oai_stream_error(s), "event 1: longer than"));

    /* reset makes it usable again */
    uint32_t toks;
    assert_int_equal(feed_all(s, MOCKER, &toks), KVR_OK);
    assert_int_equal(toks, 3);
    kvr_oai_stream_free(s);
}

static void test_error_event(void **state)
{
    (void)state;
    kvr_oai_stream_t *s = kvr_oai_stream_new();
    uint32_t toks;
    const char *text = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
                       "data: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\","
                       "\"code\":500}}\n\ndata: [DONE]\n\n";
    assert_int_equal(feed_all(s, text, &toks), KVR_OK);
    const kvr_oai_stream_info_t *in = kvr_oai_stream_info(s);
    assert_true(in->error_event);
    assert_string_equal(in->error, "engine died");
    assert_int_equal(toks, 1);
    assert_int_equal(feed_all(s, "data: {\"error\":\"plain\"}\n\ndata: [DONE]\n\n", &toks), KVR_OK);
    assert_true(in->error_event);
    assert_string_equal(in->error, "plain");
    assert_int_equal(feed_all(s, "data: {\"error\":{}}\n\ndata: [DONE]\n\n", &toks), KVR_OK);
    assert_true(in->error_event);
    assert_string_equal(in->error, "");
    kvr_oai_stream_free(s);
}

static void test_models(void **state)
{
    (void)state;
    char out[16], err[256];
    const char *b = "{\"object\":\"list\",\"data\":[{\"id\":\"llama\",\"object\":\"model\"},"
                    "{\"id\":\"second\"}]}";
    assert_int_equal(kvr_oai_models_first_id(b, strlen(b), out, sizeof out, err, sizeof err),
                     KVR_OK);
    assert_string_equal(out, "llama");
    b = "{\"data\":[]}";
    assert_int_equal(kvr_oai_models_first_id(b, strlen(b), out, sizeof out, err, sizeof err),
                     KVR_EPARSE);
    assert_non_null(strstr(err, "data[0].id missing"));
    b = "{\"data\":[{\"id\":\"a-very-long-model-name\"}]}";
    assert_int_equal(kvr_oai_models_first_id(b, strlen(b), out, sizeof out, err, sizeof err),
                     KVR_ETOOBIG);
    b = "<html>";
    assert_int_equal(kvr_oai_models_first_id(b, strlen(b), out, sizeof out, err, sizeof err),
                     KVR_EPARSE);
    assert_non_null(strstr(err, "not JSON"));
    b = "[{\"id\":\"x\"}]";
    assert_int_equal(kvr_oai_models_first_id(b, strlen(b), out, sizeof out, err, sizeof err),
                     KVR_EPARSE);
}

static void test_error_message(void **state)
{
    (void)state;
    char m[8];
    const char *b = "{\"error\":{\"message\":\"overloaded now\",\"code\":503}}";
    assert_true(kvr_oai_error_message(b, strlen(b), m, sizeof m));
    assert_string_equal(m, "overloa"); /* cut to the buffer */
    b = "{\"message\":\"m\"}";
    assert_true(kvr_oai_error_message(b, strlen(b), m, sizeof m));
    assert_string_equal(m, "m");
    b = "{\"error\":\"e\"}";
    assert_true(kvr_oai_error_message(b, strlen(b), m, sizeof m));
    assert_string_equal(m, "e");
    b = "{\"detail\":\"x\"}";
    assert_false(kvr_oai_error_message(b, strlen(b), m, sizeof m));
    b = "Internal Server Error";
    assert_false(kvr_oai_error_message(b, strlen(b), m, sizeof m));
    assert_string_equal(m, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mocker_stream), cmocka_unit_test(test_splits),
        cmocka_unit_test(test_framing),       cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_error_event),   cmocka_unit_test(test_models),
        cmocka_unit_test(test_error_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

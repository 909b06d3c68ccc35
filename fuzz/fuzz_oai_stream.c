/*
 * fuzz_oai_stream.c: libFuzzer target for the client-side readers of OpenAI responses
 * (wire/oai_stream.c), the trust boundary of `kvrouter replay`: whatever an endpoint sends.
 *
 * Input: the first byte seeds the split of the rest into feeds (1..64 bytes each, from a
 * small LCG); the rest is a response body. Seeds in fuzz/corpus/oai_stream start with any
 * byte.
 *
 * Invariants checked: the body fed whole and fed in pieces gives the same status, message
 * and facts (token events, usage, worker, done, error event); token events reported by the
 * feeds add up to the total; a failure has a message and a success saw [DONE]; counts never
 * exceed the events. The body is also read as a /v1/models body and an error body: a found
 * model id is non-empty, NUL-free and fits; messages are NUL-terminated within the buffer.
 * Memory: one stream reused across inputs (as the driver does). Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/oai_stream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

typedef struct result {
    int status;
    uint32_t fed_tokens;
    kvr_oai_stream_info_t info;
    char err[300];
} result_t;

static void run(kvr_oai_stream_t *s, const char *b, size_t n, unsigned seed, result_t *r)
{
    kvr_oai_stream_reset(s);
    r->fed_tokens = 0;
    size_t off = 0;
    while (off < n) {
        size_t k = n - off;
        if (seed != 0) {
            seed = seed * 1103515245u + 12345u;
            size_t piece = 1 + (seed >> 16) % 64;
            if (piece < k)
                k = piece;
        }
        uint32_t t = 0;
        kvr_oai_stream_feed(s, b + off, k, &t);
        r->fed_tokens += t;
        off += k;
    }
    r->status = kvr_oai_stream_finish(s);
    memcpy(&r->info, kvr_oai_stream_info(s), sizeof r->info); /* padding included */
    size_t el = strlen(kvr_oai_stream_error(s));
    check(el < sizeof r->err);
    memcpy(r->err, kvr_oai_stream_error(s), el + 1);
}

static kvr_oai_stream_t *g_stream;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (g_stream == NULL) {
        g_stream = kvr_oai_stream_new();
        check(g_stream != NULL);
    }
    unsigned seed = (unsigned)data[0] | 1u;
    const char *b = (const char *)data + 1;
    size_t n = size - 1;
    static result_t whole, split;
    run(g_stream, b, n, 0, &whole);
    run(g_stream, b, n, seed, &split);
    check(whole.status == split.status);
    check(strcmp(whole.err, split.err) == 0);
    check((whole.status == KVR_OK) == (whole.err[0] == '\0'));
    if (whole.status == KVR_OK) {
        const kvr_oai_stream_info_t *a = &whole.info, *c = &split.info;
        check(a->done);
        check(memcmp(a, c, sizeof *a) == 0);
        check(whole.fed_tokens == a->n_token_events && split.fed_tokens == a->n_token_events);
        check(a->n_token_events < a->n_events);
        check(strlen(a->error) < sizeof a->error);
        check(!a->has_cached || a->has_usage);
    }

    char model[32], err[256], msg[64];
    int rc = kvr_oai_models_first_id(b, n, model, sizeof model, err, sizeof err);
    if (rc == KVR_OK) {
        size_t ml = strlen(model);
        check(ml > 0 && ml < sizeof model);
    } else {
        check(err[0] != '\0' && strlen(err) < sizeof err);
    }
    if (kvr_oai_error_message(b, n, msg, sizeof msg))
        check(strlen(msg) < sizeof msg);
    else
        check(msg[0] == '\0');
    return 0;
}

/*
 * fuzz_ix_query.c: libFuzzer target for the indexer API's query decoders: the MessagePack one
 * (wire/ix_query_mp.c) and the JSON one (wire/api_json.c's /query and /query_by_hash kinds),
 * the trust boundary of POST /query and /query_by_hash on a standalone indexer or a router
 * serving its index. The first byte picks the decoder and the endpoint; the rest is the body.
 *
 * Invariants checked: a refusal has a message and leaves the struct zeroed; an acceptance has
 * model_name and routing_group as NUL-terminated strings of 1..255 bytes, at most the limit
 * of ids, and (by hash) no cache_salt; JSON: the fast token scanner and yajl alone agree on
 * the status and the ids. Memory: the decoders are kept across inputs (their reuse is what
 * runs in production). Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/ix_query_mp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static void check_accepted(const kvr_ix_query_t *q, bool by_hash)
{
    check(q->by_hash == by_hash);
    check(q->model_name != NULL && strlen(q->model_name) == q->model_name_len);
    check(q->model_name_len >= 1 && q->model_name_len <= 255);
    check(q->routing_group != NULL && strlen(q->routing_group) == q->routing_group_len);
    check(!by_hash || q->cache_salt == NULL);
    check(by_hash ? q->n_tokens == 0 : q->n_hashes == 0);
    check((q->n_hashes > 0) == (q->hashes != NULL));
    check((q->n_tokens > 0) == (q->tokens != NULL));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_ix_mp_t mp;
    static kvr_api_decoder_t *fast, *slow;
    if (fast == NULL) {
        kvr_ix_mp_init(&mp);
        mp.max_ids = 4096;
        kvr_api_options_t o = {.max_tokens = 4096, .max_allowed_ids = 64};
        fast = kvr_api_decoder_new(&o);
        o.no_fast_path = true;
        slow = kvr_api_decoder_new(&o);
        check(fast != NULL && slow != NULL);
    }
    if (size == 0)
        return 0;
    bool by_hash = data[0] & 1, json = data[0] & 2;
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    kvr_ix_query_t q, q2;
    if (!json) {
        int rc = kvr_ix_mp_decode_query(&mp, body, len, by_hash, &q);
        if (rc != KVR_OK) {
            check(mp.err[0] != '\0' && q.model_name == NULL && q.n_tokens == 0);
            return 0;
        }
        check(q.n_tokens <= mp.max_ids && q.n_hashes <= mp.max_ids);
        check_accepted(&q, by_hash);
        return 0;
    }
    int a = kvr_api_decode_ix_query(fast, (const char *)body, len, by_hash, &q);
    int b = kvr_api_decode_ix_query(slow, (const char *)body, len, by_hash, &q2);
    check(a == b);
    if (a != KVR_OK) {
        check(kvr_api_decoder_error(fast)[0] != '\0' && q.model_name == NULL);
        check(strcmp(kvr_api_decoder_error(fast), kvr_api_decoder_error(slow)) == 0);
        return 0;
    }
    check_accepted(&q, by_hash);
    check(q.n_tokens == q2.n_tokens && q.n_hashes == q2.n_hashes);
    check(q.n_tokens == 0 || memcmp(q.tokens, q2.tokens, q.n_tokens * sizeof *q.tokens) == 0);
    check(q.n_hashes == 0 || memcmp(q.hashes, q2.hashes, q.n_hashes * sizeof *q.hashes) == 0);
    check(strcmp(q.model_name, q2.model_name) == 0);
    return 0;
}

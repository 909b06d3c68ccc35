/*
 * fuzz_ix_query.c: libFuzzer target for the indexer API's query decoders: the MessagePack one
 * (wire/ix_query_mp.c) and the JSON one (wire/api_json.c's /query and /query_by_hash kinds),
 * the trust boundary of POST /query and /query_by_hash on a standalone indexer or a router
 * serving its index, and POST /record_routing_decision's JSON decoder. The first byte picks
 * the decoder and the endpoint; the rest is the body.
 *
 * Invariants checked: a refusal has a message and leaves the struct zeroed; an acceptance has
 * model_name and routing_group as NUL-terminated strings of 1..255 bytes, at most the limit
 * of ids, and (by hash) no cache_salt; JSON: the fast token scanner and yajl alone agree on
 * the status and the ids. A record accepted holds as many sequence as local hashes, chained
 * from them, and is read back the same from the router's encoding of it. Memory: the decoders are
 * kept across inputs (their reuse is what runs in production). Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/ix_answer.h"
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

static void check_record(kvr_api_decoder_t *d, kvr_api_decoder_t *again, const char *body,
                         size_t len)
{
    static kvr_json_writer_t w;
    static bool init;
    if (!init) {
        kvr_json_writer_init(&w);
        init = true;
    }
    kvr_ix_record_t r, r2;
    memset(&r, 0, sizeof r);
    if (kvr_api_decode_ix_record(d, body, len, &r) != KVR_OK) {
        check(kvr_api_decoder_error(d)[0] != '\0' && r.n == 0);
        return;
    }
    check(r.n > 0 && r.local_hashes != NULL && r.sequence_hashes != NULL);
    check(r.sequence_hashes[0] == r.local_hashes[0]);
    for (size_t i = 1; i < r.n; i++)
        check(r.sequence_hashes[i] ==
              kvr_hash_chain_next(r.sequence_hashes[i - 1], r.local_hashes[i]));
    const char *text = NULL;
    size_t n = 0;
    check(kvr_ix_answer_encode_record(&w, &r) == KVR_OK &&
          kvr_json_writer_finish(&w, &text, &n) == KVR_OK);
    check(kvr_api_decode_ix_record(again, text, n, &r2) == KVR_OK);
    check(r2.n == r.n && r2.instance_id == r.instance_id && r2.dp_rank == r.dp_rank &&
          r2.block_size == r.block_size);
    check(memcmp(r2.local_hashes, r.local_hashes, r.n * sizeof *r.local_hashes) == 0);
    check(memcmp(r2.sequence_hashes, r.sequence_hashes, r.n * sizeof *r.sequence_hashes) == 0);
    check(r2.model_name_len == r.model_name_len &&
          memcmp(r2.model_name, r.model_name, r.model_name_len) == 0);
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
    if (data[0] & 4) {
        check_record(fast, slow, (const char *)body, len);
        return 0;
    }
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

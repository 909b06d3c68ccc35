/*
 * ix_answer.c: an indexer's /query_by_hash answer read, and the body written (see
 * ix_answer.h). Read with the strict scanner (wire/json_scan.h): two nested objects of
 * numbers, found by key.
 */
#include "wire/ix_answer.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/grow.h"
#include "wire/json_decode.h"
#include "wire/json_scan.h"

/* A member's key as a canonical decimal integer in [0, max]. */
static bool key_int(const char *b, const kvr_json_member_t *m, uint64_t max, uint64_t *out)
{
    const char *s = b + m->key + 1;
    size_t n = m->key_end - m->key - 2;
    if (n == 0 || n > 20 || (n > 1 && s[0] == '0'))
        return false;
    return kvr_jd_parse_u64(s, n, 0, max, out);
}

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t err_len, int st,
                                                      const char *fmt, ...)
{
    if (err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* One instance's {"<rank>": tokens} object at b[v]. */
static int read_ranks(const char *b, size_t len, size_t v, uint64_t id, uint32_t bs, size_t max,
                      kvr_match_t **out, size_t *cap, size_t *n, char *err, size_t err_len)
{
    if (b[v] != '{')
        return fail(err, err_len, KVR_EPARSE, "scores.%" PRIu64 ": must be an object", id);
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, b, len, v, KVR_JSON_STRICT);
    int got;
    while ((got = kvr_json_object_next(&it, &m)) > 0) {
        uint64_t rank, tokens;
        if (!key_int(b, &m, UINT32_MAX, &rank))
            return fail(err, err_len, KVR_EINVAL,
                        "scores.%" PRIu64 ": a key is not a dp_rank in [0, 4294967295]", id);
        if (!kvr_jd_parse_u64(b + m.val, m.val_end - m.val, 0, UINT64_MAX, &tokens))
            return fail(err, err_len, KVR_EINVAL,
                        "scores.%" PRIu64 ".%" PRIu64 ": not a token count", id, rank);
        if (tokens % bs != 0 || tokens / bs > UINT32_MAX)
            return fail(err, err_len, KVR_EINVAL,
                        "scores: %" PRIu64 " tokens is not a whole number of %" PRIu32
                        "-token blocks (the indexer's block size differs from this router's)",
                        tokens, bs);
        if (tokens == 0)
            continue;
        if (*n >= max)
            return fail(err, err_len, KVR_ETOOBIG, "scores: more than %zu ranks", max);
        if (kvr_grow((void **)out, cap, *n + 1, SIZE_MAX, sizeof **out) != KVR_OK)
            return fail(err, err_len, KVR_ENOMEM, "out of memory");
        (*out)[(*n)++] =
            (kvr_match_t){.worker = {id, (uint32_t)rank}, .device_blocks = (uint32_t)(tokens / bs)};
    }
    if (got < 0)
        return fail(err, err_len, KVR_EPARSE, "scores.%" PRIu64 ": invalid JSON", id);
    return KVR_OK;
}

int kvr_ix_answer_parse(const char *text, size_t len, uint32_t block_size, size_t max,
                        kvr_match_t **out, size_t *cap, size_t *n, char *err, size_t err_len)
{
    *n = 0;
    if (block_size == 0)
        return KVR_EINVAL;
    size_t i = kvr_json_skip_ws(text, len, 0);
    size_t end = i < len ? kvr_json_skip_value(text, len, i, KVR_JSON_STRICT) : KVR_JSON_BAD;
    if (end == KVR_JSON_BAD || text[i] != '{' || kvr_json_skip_ws(text, len, end) != len)
        return fail(err, err_len, KVR_EPARSE, "answer: not one JSON object");
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, text, len, i, KVR_JSON_STRICT);
    while (kvr_json_object_next(&it, &m) > 0) {
        if (!kvr_json_key_is(text, &m, "scores"))
            continue;
        if (text[m.val] != '{')
            return fail(err, err_len, KVR_EPARSE, "scores: must be an object");
        kvr_json_iter_t si;
        kvr_json_member_t sm;
        kvr_json_object_begin(&si, text, len, m.val, KVR_JSON_STRICT);
        while (kvr_json_object_next(&si, &sm) > 0) {
            uint64_t id;
            if (!key_int(text, &sm, UINT64_MAX, &id))
                return fail(err, err_len, KVR_EINVAL,
                            "scores: a key is not an instance id in [0, 2^64)");
            int rc = read_ranks(text, len, sm.val, id, block_size, max, out, cap, n, err, err_len);
            if (rc != KVR_OK)
                return rc;
        }
        return KVR_OK;
    }
    return fail(err, err_len, KVR_EPARSE, "answer: no scores member");
}

/* key: [hashes as i64] */
static void i64_array(kvr_json_writer_t *w, const char *key, const uint64_t *v, size_t n)
{
    kvr_json_key(w, key);
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        int64_t x;
        memcpy(&x, &v[i], sizeof x);
        kvr_json_i64(w, x);
    }
    kvr_json_end_array(w);
}

int kvr_ix_answer_encode_query(kvr_json_writer_t *w, const uint64_t *lbh, size_t n,
                               const char *model_name, size_t model_name_len)
{
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    i64_array(w, "block_hashes", lbh, n);
    kvr_json_key(w, "model_name");
    kvr_json_string_n(w, model_name, model_name_len);
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

int kvr_ix_answer_encode_record(kvr_json_writer_t *w, const kvr_ix_record_t *r)
{
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "instance_id");
    kvr_json_u64(w, r->instance_id);
    kvr_json_key(w, "dp_rank");
    kvr_json_u64(w, r->dp_rank);
    if (r->block_size != 0) {
        kvr_json_key(w, "block_size");
        kvr_json_u64(w, r->block_size);
    }
    kvr_json_key(w, "model_name");
    kvr_json_string_n(w, r->model_name, r->model_name_len);
    if (r->routing_group != NULL) {
        kvr_json_key(w, "routing_group");
        kvr_json_string_n(w, r->routing_group, r->routing_group_len);
    }
    i64_array(w, "local_hashes", r->local_hashes, r->n);
    i64_array(w, "sequence_hashes", r->sequence_hashes, r->n);
    if (r->kv_capacity_blocks != 0) {
        kvr_json_key(w, "kv_capacity_blocks");
        kvr_json_u64(w, r->kv_capacity_blocks);
    }
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

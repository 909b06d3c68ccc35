/*
 * tokenize_answer.c: see tokenize_answer.h. Written on the shared scanners (json_scan for the
 * object, token_scan for the ids) rather than on yajl: the answer is one flat object and one
 * integer array, and the router's own request decoders (api_json.c) have other fields and
 * other limits, so reusing one of them for a worker's answer (as before) tied the two formats.
 */
#include "wire/tokenize_answer.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/grow.h"
#include "kvrouter.h"
#include "wire/json_scan.h"
#include "wire/token_scan.h"

static int fail(char *err, size_t err_len, int st, const char *msg, size_t at)
{
    snprintf(err, err_len, "%s (at byte %zu)", msg, at);
    return st;
}

/* The slow path: b[i..end) is an array's inside (after '['), formatted in any valid way. */
static int read_ids_slowly(const char *b, size_t end, size_t i, size_t max, uint32_t **buf,
                           size_t *cap, size_t *n_out, char *err, size_t err_len)
{
    size_t n = 0;
    i = kvr_json_skip_ws(b, end, i);
    if (i < end && b[i] == ']') {
        *n_out = 0;
        return KVR_OK;
    }
    for (;;) {
        size_t start = i;
        uint64_t v = 0;
        while (i < end && b[i] >= '0' && b[i] <= '9' && v <= UINT32_MAX)
            v = v * 10 + (uint64_t)(b[i++] - '0');
        bool leading_zero = i - start > 1 && b[start] == '0';
        if (i == start || v > UINT32_MAX || leading_zero || (i < end && strchr(".eE", b[i])))
            return fail(err, err_len, KVR_EPARSE,
                        "tokens: must be an array of integers in [0, 4294967295]", start);
        if (n == max)
            return fail(err, err_len, KVR_ETOOBIG, "tokens: more ids than allowed", start);
        if (kvr_grow((void **)buf, cap, n + 1, max, sizeof **buf) != KVR_OK)
            return KVR_ENOMEM;
        (*buf)[n++] = (uint32_t)v;
        i = kvr_json_skip_ws(b, end, i);
        if (i < end && b[i] == ',') {
            i = kvr_json_skip_ws(b, end, i + 1);
            continue;
        }
        if (i < end && b[i] == ']') {
            *n_out = n;
            return KVR_OK;
        }
        return fail(err, err_len, KVR_EPARSE, "tokens: expected ',' or ']'", i);
    }
}

static int read_ids(const char *b, const kvr_json_member_t *m, size_t max, uint32_t **buf,
                    size_t *cap, size_t *n_out, char *err, size_t err_len)
{
    if (b[m->val] != '[')
        return fail(err, err_len, KVR_EPARSE, "tokens: must be an array", m->val);
    size_t close;
    if (kvr_token_scan(b, m->val_end, m->val + 1, buf, cap, max, &close, n_out) &&
        close + 1 == m->val_end)
        return KVR_OK;
    return read_ids_slowly(b, m->val_end, m->val + 1, max, buf, cap, n_out, err, err_len);
}

int kvr_tokenize_answer_decode(const char *b, size_t n, size_t max_tokens, uint32_t **buf,
                               size_t *cap, size_t *n_tokens, char *err, size_t err_len)
{
    *n_tokens = 0;
    if (err_len > 0)
        err[0] = '\0';
    size_t i = kvr_json_skip_ws(b, n, 0);
    if (i >= n || b[i] != '{')
        return fail(err, err_len, KVR_EPARSE, "not a JSON object", i);
    kvr_json_member_t tokens = {0}, m;
    bool found = false;
    kvr_json_iter_t it;
    int r;
    kvr_json_object_begin(&it, b, n, i, KVR_JSON_STRICT);
    while ((r = kvr_json_object_next(&it, &m)) == 1) {
        if (!kvr_json_key_is(b, &m, "tokens"))
            continue;
        if (found)
            return fail(err, err_len, KVR_EPARSE, "tokens: given twice", m.key);
        tokens = m;
        found = true;
    }
    if (r < 0)
        return fail(err, err_len, KVR_EPARSE, "invalid JSON object", it.i);
    i = it.close + 1;
    if (kvr_json_skip_ws(b, n, i) != n)
        return fail(err, err_len, KVR_EPARSE, "trailing bytes after the object", i);
    if (!found)
        return fail(err, err_len, KVR_EPARSE, "tokens: missing", 0);
    return read_ids(b, &tokens, max_tokens, buf, cap, n_tokens, err, err_len);
}

/*
 * disagg.c: see disagg.h. Every reader walks objects with wire/json_scan.h in strict mode; a
 * value is interpreted only after the scanner has bounded it, so a field's reader sees
 * exactly its bytes.
 */
#include "wire/disagg.h"

#include <stdio.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/json_scan.h"

static int bad(char *err, size_t err_len, const char *field, const char *problem)
{
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "%s: %s", field, problem);
    return KVR_EINVAL;
}

/* The start of the one strict JSON object json[0..len) (whitespace around allowed), or
 * KVR_JSON_BAD. */
static size_t one_object(const char *json, size_t len)
{
    size_t i = kvr_json_skip_ws(json, len, 0);
    if (i >= len || json[i] != '{')
        return KVR_JSON_BAD;
    size_t end = kvr_json_skip_value(json, len, i, KVR_JSON_STRICT);
    if (end == KVR_JSON_BAD || kvr_json_skip_ws(json, len, end) != len)
        return KVR_JSON_BAD;
    return i;
}

static bool is_lit(const char *b, const kvr_json_member_t *m, const char *lit)
{
    size_t n = strlen(lit);
    return m->val_end - m->val == n && memcmp(b + m->val, lit, n) == 0;
}

/* A JSON integer in [0, max] (digits only: no sign, fraction or exponent). */
static bool read_u64(const char *b, const kvr_json_member_t *m, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = m->val;
    if (i == m->val_end)
        return false;
    for (; i < m->val_end; i++) {
        char c = b[i];
        if (c < '0' || c > '9' || v > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(c - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

static bool read_bool(const char *b, const kvr_json_member_t *m, bool *out)
{
    if (is_lit(b, m, "true"))
        *out = true;
    else if (is_lit(b, m, "false"))
        *out = false;
    else
        return false;
    return true;
}

/* A string without escapes, shorter than KVR_DISAGG_STR_BYTES. */
static bool read_str(const char *b, const kvr_json_member_t *m, char *out)
{
    size_t n = m->val_end - m->val;
    if (n < 2 || b[m->val] != '"' || n - 2 >= KVR_DISAGG_STR_BYTES)
        return false;
    if (memchr(b + m->val + 1, '\\', n - 2) != NULL)
        return false;
    memcpy(out, b + m->val + 1, n - 2);
    out[n - 2] = '\0';
    return true;
}

typedef struct key_reader {
    const char *key;
    char kind;    /* 'b' bool, 's' string, 'p' port, 'u' u63 */
    size_t off;   /* in kvr_disagg_req_t */
    size_t flag;  /* 'u': offset of its has_ bool; else unused */
} key_reader_t;

#define OFF(f) offsetof(kvr_disagg_req_t, f)

static const key_reader_t KVT_KEYS[] = {
    {"do_remote_decode", 'b', OFF(do_remote_decode), 0},
    {"do_remote_prefill", 'b', OFF(do_remote_prefill), 0},
    {"remote_host", 's', OFF(remote_host), 0},
    {"remote_port", 'p', OFF(remote_port), 0},
    {"remote_request_id", 's', OFF(remote_request_id), 0},
    {"remote_engine_id", 's', OFF(remote_engine_id), 0},
};

static const key_reader_t TOP_KEYS[] = {
    {"bootstrap_host", 's', OFF(bootstrap_host), 0},
    {"bootstrap_port", 'p', OFF(bootstrap_port), 0},
    {"bootstrap_room", 'u', OFF(bootstrap_room), OFF(has_room)},
};

/* Reads one member named in keys (null = absent); others are skipped. */
static int read_member(const char *b, const kvr_json_member_t *m, const key_reader_t *keys,
                       size_t n_keys, const char *where, kvr_disagg_req_t *out, char *err,
                       size_t err_len)
{
    for (size_t k = 0; k < n_keys; k++) {
        const key_reader_t *kr = &keys[k];
        if (!kvr_json_key_is(b, m, kr->key))
            continue;
        if (is_lit(b, m, "null"))
            return KVR_OK;
        char field[96];
        snprintf(field, sizeof field, "%s%s", where, kr->key);
        char *dst = (char *)out + kr->off;
        uint64_t v = 0;
        switch (kr->kind) {
        case 'b':
            if (!read_bool(b, m, (bool *)dst))
                return bad(err, err_len, field, "not a boolean");
            return KVR_OK;
        case 's':
            if (!read_str(b, m, dst))
                return bad(err, err_len, field, "not a string of at most 255 bytes without "
                                                "escapes");
            return KVR_OK;
        case 'p':
            if (!read_u64(b, m, 65535, &v) || v == 0)
                return bad(err, err_len, field, "not an integer in [1, 65535]");
            *(uint32_t *)dst = (uint32_t)v;
            return KVR_OK;
        default:
            if (!read_u64(b, m, INT64_MAX, &v))
                return bad(err, err_len, field, "not an integer in [0, 2^63 - 1]");
            *(uint64_t *)dst = v;
            *(bool *)((char *)out + kr->flag) = true;
            return KVR_OK;
        }
    }
    return KVR_OK;
}

static kvr_kvt_kind_t kind_of(const char *b, const kvr_json_member_t *m)
{
    if (is_lit(b, m, "null"))
        return KVR_KVT_NULL;
    return b[m->val] == '{' ? KVR_KVT_OBJECT : KVR_KVT_OTHER;
}

static int read_kvt(const char *b, size_t n, const kvr_json_member_t *m, kvr_disagg_req_t *out,
                    char *err, size_t err_len)
{
    out->kvt = kind_of(b, m);
    if (out->kvt == KVR_KVT_OTHER)
        return bad(err, err_len, "kv_transfer_params", "not an object or null");
    if (out->kvt != KVR_KVT_OBJECT)
        return KVR_OK;
    kvr_json_iter_t it;
    kvr_json_member_t c;
    int r = 0;
    kvr_json_object_begin(&it, b, n, m->val, KVR_JSON_STRICT);
    while ((r = kvr_json_object_next(&it, &c)) == 1) {
        int rc = read_member(b, &c, KVT_KEYS, sizeof KVT_KEYS / sizeof KVT_KEYS[0],
                             "kv_transfer_params.", out, err, err_len);
        if (rc != KVR_OK)
            return rc;
    }
    return r == 0 ? KVR_OK : KVR_EPARSE;
}

int kvr_disagg_parse_req(const char *body, size_t len, kvr_disagg_req_t *out, char *err,
                         size_t err_len)
{
    memset(out, 0, sizeof *out);
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    size_t i = one_object(body, len);
    if (i == KVR_JSON_BAD) {
        bad(err, err_len, "body", "not one JSON object");
        return KVR_EPARSE;
    }
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int r = 0, rc = KVR_OK;
    kvr_json_object_begin(&it, body, len, i, KVR_JSON_STRICT);
    while (rc == KVR_OK && (r = kvr_json_object_next(&it, &m)) == 1) {
        if (kvr_json_key_is(body, &m, "kv_transfer_params"))
            rc = read_kvt(body, len, &m, out, err, err_len);
        else
            rc = read_member(body, &m, TOP_KEYS, sizeof TOP_KEYS / sizeof TOP_KEYS[0], "", out,
                             err, err_len);
    }
    if (rc == KVR_OK && r != 0)
        rc = KVR_EPARSE;
    if (rc != KVR_OK) {
        char keep[160];
        snprintf(keep, sizeof keep, "%s", err != NULL && err_len > 0 ? err : "");
        memset(out, 0, sizeof *out);
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s", keep[0] ? keep : "body: not one JSON object");
    }
    return rc;
}

bool kvr_disagg_pull_ready(const kvr_disagg_req_t *r)
{
    return r->kvt == KVR_KVT_OBJECT && r->do_remote_prefill && r->remote_host[0] != '\0' &&
           r->remote_port != 0 && r->remote_request_id[0] != '\0' &&
           r->remote_engine_id[0] != '\0';
}

/* choices[0].finish_reason == "stop" */
static bool first_choice_stopped(const char *b, size_t n, const kvr_json_member_t *m)
{
    if (b[m->val] != '[')
        return false;
    size_t i = kvr_json_skip_ws(b, n, m->val + 1);
    if (i >= m->val_end || b[i] != '{')
        return false;
    kvr_json_iter_t it;
    kvr_json_member_t c;
    kvr_json_object_begin(&it, b, n, i, KVR_JSON_STRICT);
    while (kvr_json_object_next(&it, &c) == 1)
        if (kvr_json_key_is(b, &c, "finish_reason"))
            return is_lit(b, &c, "\"stop\"");
    return false;
}

int kvr_disagg_scan_answer(const char *json, size_t len, kvr_disagg_answer_t *out)
{
    memset(out, 0, sizeof *out);
    size_t i = one_object(json, len);
    if (i == KVR_JSON_BAD)
        return KVR_EPARSE;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int r = 0;
    kvr_json_object_begin(&it, json, len, i, KVR_JSON_STRICT);
    while ((r = kvr_json_object_next(&it, &m)) == 1) {
        if (kvr_json_key_is(json, &m, "kv_transfer_params")) {
            out->kvt = kind_of(json, &m);
            out->kvt_at = m.val;
            out->kvt_len = m.val_end - m.val;
        } else if (kvr_json_key_is(json, &m, "choices")) {
            out->finish_stop = first_choice_stopped(json, len, &m);
        }
    }
    if (r != 0) {
        memset(out, 0, sizeof *out);
        return KVR_EPARSE;
    }
    return KVR_OK;
}

int kvr_disagg_read_u64(const char *json, size_t len, const char *key, uint64_t *out)
{
    *out = 0;
    size_t i = one_object(json, len);
    if (i == KVR_JSON_BAD)
        return KVR_EPARSE;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, json, len, i, KVR_JSON_STRICT);
    while (kvr_json_object_next(&it, &m) == 1) {
        if (!kvr_json_key_is(json, &m, key))
            continue;
        if (is_lit(json, &m, "null"))
            return KVR_ENOTFOUND;
        return read_u64(json, &m, UINT64_MAX, out) ? KVR_OK : KVR_EINVAL;
    }
    return KVR_ENOTFOUND;
}

uint64_t kvr_disagg_room(uint64_t rnd, uint32_t dp_size, uint32_t rank)
{
    if (dp_size <= 1)
        return rnd & (uint64_t)INT64_MAX;
    uint64_t q_max = ((uint64_t)INT64_MAX - rank) / dp_size;
    return (rnd % (q_max + 1)) * dp_size + rank;
}

/*
 * ix_query_mp.c: the indexer API's query bodies in MessagePack (see ix_query_mp.h for the
 * shapes, rules and ownership). Written over wire/mp_cursor.h, the bounds-checked reader the
 * KV-event decoder uses (its header says why not msgpack-c).
 */
#include "wire/ix_query_mp.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "kvrouter.h"
#include "wire/json_decode.h"
#include "wire/mp_cursor.h"

enum qfield { Q_IDS, Q_MODEL, Q_GROUP, Q_TENANT, Q_LORA, Q_SALT, Q_N };

typedef struct qdef {
    const char *key;
    size_t lo, hi; /* string length; lo 0: "" reads as absent */
} qdef_t;

static const qdef_t QDEFS[Q_N] = {
    [Q_IDS] = {"token_ids", 0, 0},
    [Q_MODEL] = {"model_name", 1, 255},
    [Q_GROUP] = {"routing_group", 1, 255},
    [Q_TENANT] = {"tenant_id", 0, 255},
    [Q_LORA] = {"lora_name", 0, KVR_API_MAX_NAME_BYTES},
    [Q_SALT] = {"cache_salt", 0, KVR_API_MAX_NAME_BYTES},
};

/* The array form's field order. */
static const int QUERY_ORDER[] = {Q_IDS, Q_MODEL, Q_GROUP, Q_TENANT, Q_LORA, Q_SALT};
static const int HASH_ORDER[] = {Q_IDS, Q_MODEL, Q_GROUP, Q_TENANT, Q_SALT};

typedef struct qstate {
    kvr_ix_mp_t *d;
    kvr_mp_rd_t r;
    bool by_hash;
    int status;
    unsigned seen, present;
    size_t n_ids;
    size_t off[Q_N], len[Q_N];
} qstate_t;

void kvr_ix_mp_init(kvr_ix_mp_t *d)
{
    memset(d, 0, sizeof *d);
    d->max_ids = KVR_API_MAX_TOKENS;
}

void kvr_ix_mp_deinit(kvr_ix_mp_t *d)
{
    free(d->tok);
    free(d->hashes);
    free(d->str);
    memset(d, 0, sizeof *d);
}

static const char *key_of(const qstate_t *q, int f)
{
    return f == Q_IDS && q->by_hash ? "block_hashes" : QDEFS[f].key;
}

__attribute__((format(printf, 3, 4))) static int qfail(qstate_t *q, int st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvr_jd_vfail(&q->status, q->d->err, sizeof q->d->err, st, fmt, ap);
    va_end(ap);
    return q->status;
}

static int peek(qstate_t *q, kvr_mp_t *v, const char *where)
{
    if (kvr_mp_peek(&q->r, v) == KVR_MP_OK)
        return KVR_OK;
    return qfail(q, KVR_EPARSE, "%s: not valid MessagePack at byte %zu", where, q->r.pos);
}

static int read_ids(qstate_t *q, const kvr_mp_t *arr)
{
    kvr_ix_mp_t *d = q->d;
    const char *k = key_of(q, Q_IDS);
    if (arr->u > d->max_ids)
        return qfail(q, KVR_ETOOBIG, "%s: more than %zu %s", k, d->max_ids,
                     q->by_hash ? "hashes" : "tokens");
    size_t n = (size_t)arr->u;
    int rc = q->by_hash ? kvr_grow((void **)&d->hashes, &d->h_cap, n, d->max_ids, sizeof *d->hashes)
                        : kvr_grow((void **)&d->tok, &d->tok_cap, n, d->max_ids, sizeof *d->tok);
    if (rc != KVR_OK)
        return qfail(q, KVR_ENOMEM, "%s: out of memory", k);
    q->r.pos += arr->size;
    for (size_t i = 0; i < n; i++) {
        kvr_mp_t v;
        if (peek(q, &v, k) != KVR_OK)
            return q->status;
        bool ok = v.type == KVR_MP_UINT || (q->by_hash && v.type == KVR_MP_NEG);
        if (ok && !q->by_hash && v.u > UINT32_MAX)
            ok = false;
        if (!ok)
            return q->by_hash
                       ? qfail(q, KVR_EINVAL,
                               "%s[%zu]: not an integer in [-9223372036854775808, "
                               "18446744073709551615]",
                               k, i)
                       : qfail(q, KVR_EINVAL, "%s[%zu]: not an integer in [0, 4294967295]", k, i);
        if (q->by_hash)
            d->hashes[i] = v.u;
        else
            d->tok[i] = (uint32_t)v.u;
        q->r.pos += v.size;
    }
    q->n_ids = n;
    return KVR_OK;
}

static int read_string(qstate_t *q, int f, const kvr_mp_t *v)
{
    kvr_ix_mp_t *d = q->d;
    const qdef_t *def = &QDEFS[f];
    if (v->type != KVR_MP_STR)
        return qfail(q, KVR_EINVAL, "%s: must be a string or nil", def->key);
    size_t n = (size_t)v->u;
    if (n < def->lo || n > def->hi) {
        if (def->lo == 0)
            return qfail(q, KVR_EINVAL, "%s: longer than %zu bytes", def->key, def->hi);
        return qfail(q, KVR_EINVAL, "%s: must be %zu to %zu bytes", def->key, def->lo, def->hi);
    }
    const char *problem = kvr_jd_text_problem(v->data, n);
    if (problem != NULL)
        return qfail(q, KVR_EINVAL, "%s: %s", def->key, problem);
    q->r.pos += v->size;
    if (n == 0)
        return KVR_OK; /* "" names nothing: absent */
    if (kvr_grow((void **)&d->str, &d->str_cap, d->str_len + n + 1, SIZE_MAX, 1) != KVR_OK)
        return qfail(q, KVR_ENOMEM, "%s: out of memory", def->key);
    memcpy(d->str + d->str_len, v->data, n);
    d->str[d->str_len + n] = '\0';
    q->off[f] = d->str_len;
    q->len[f] = n;
    d->str_len += n + 1;
    q->present |= 1u << f;
    return KVR_OK;
}

/* The value of field f at the cursor. */
static int read_field(qstate_t *q, int f)
{
    const char *k = key_of(q, f);
    if (q->seen & (1u << f))
        return qfail(q, KVR_EINVAL, "%s: duplicate key", k);
    q->seen |= 1u << f;
    kvr_mp_t v;
    if (peek(q, &v, k) != KVR_OK)
        return q->status;
    if (v.type == KVR_MP_NIL) {
        q->r.pos += v.size;
        return KVR_OK;
    }
    if (f != Q_IDS)
        return read_string(q, f, &v);
    if (v.type != KVR_MP_ARRAY)
        return qfail(q, KVR_EINVAL, "%s: must be an array of integers", k);
    q->present |= 1u << f;
    return read_ids(q, &v);
}

static int field_named(const qstate_t *q, const kvr_mp_t *key)
{
    if (key->type != KVR_MP_STR)
        return -1;
    for (int f = 0; f < Q_N; f++) {
        if (q->by_hash && f == Q_LORA)
            continue;
        const char *name = key_of(q, f);
        if (kvr_mp_str_eq(key, name, strlen(name)))
            return f;
    }
    return -1;
}

static int read_map(qstate_t *q, uint64_t pairs)
{
    for (uint64_t i = 0; i < pairs && q->status == KVR_OK; i++) {
        kvr_mp_t key;
        if (peek(q, &key, "key") != KVR_OK)
            return q->status;
        int f = field_named(q, &key);
        if (f < 0) {
            if (kvr_mp_skip(&q->r, 2, 1) != KVR_MP_OK)
                return qfail(q, KVR_EPARSE, "not valid MessagePack at byte %zu", q->r.pos);
            continue;
        }
        q->r.pos += key.size;
        (void)read_field(q, f);
    }
    return q->status;
}

static int read_array(qstate_t *q, uint64_t n)
{
    const int *order = q->by_hash ? HASH_ORDER : QUERY_ORDER;
    size_t max = q->by_hash ? sizeof HASH_ORDER / sizeof *HASH_ORDER
                            : sizeof QUERY_ORDER / sizeof *QUERY_ORDER;
    if (n > max)
        return qfail(q, KVR_EINVAL, "body: an array of at most %zu fields, got %" PRIu64, max, n);
    for (uint64_t i = 0; i < n && q->status == KVR_OK; i++)
        (void)read_field(q, order[i]);
    return q->status;
}

static int finish(qstate_t *q, kvr_ix_query_t *out)
{
    kvr_ix_mp_t *d = q->d;
    for (int f = Q_IDS; f <= Q_MODEL; f++)
        if (!(q->present & (1u << f)))
            return qfail(q, KVR_EINVAL, "%s: missing", key_of(q, f));
    if (q->by_hash && (q->present & (1u << Q_SALT)))
        return qfail(q, KVR_EINVAL,
                     "cache_salt: not accepted by /query_by_hash (block_hashes "
                     "must already include the intended cache salt)");
    out->by_hash = q->by_hash;
    if (q->by_hash) {
        out->hashes = q->n_ids > 0 ? d->hashes : NULL;
        out->n_hashes = q->n_ids;
    } else {
        out->tokens = q->n_ids > 0 ? d->tok : NULL;
        out->n_tokens = q->n_ids;
    }
#define STR(f, p, l)                                                \
    do {                                                            \
        p = (q->present & (1u << (f))) ? d->str + q->off[f] : NULL; \
        l = (q->present & (1u << (f))) ? q->len[f] : 0;             \
    } while (0)
    STR(Q_MODEL, out->model_name, out->model_name_len);
    STR(Q_GROUP, out->routing_group, out->routing_group_len);
    STR(Q_LORA, out->lora_name, out->lora_name_len);
    STR(Q_SALT, out->cache_salt, out->cache_salt_len);
#undef STR
    if (out->routing_group == NULL) {
        out->routing_group = KVR_IX_DEFAULT_GROUP;
        out->routing_group_len = strlen(KVR_IX_DEFAULT_GROUP);
    }
    return KVR_OK;
}

int kvr_ix_mp_decode_query(kvr_ix_mp_t *d, const uint8_t *buf, size_t len, bool by_hash,
                           kvr_ix_query_t *out)
{
    memset(out, 0, sizeof *out);
    d->err[0] = '\0';
    d->str_len = 0;
    qstate_t q = {.d = d, .r = {.p = buf, .n = buf ? len : 0}, .by_hash = by_hash};
    kvr_mp_t top;
    if (len == 0)
        qfail(&q, KVR_EPARSE, "empty body");
    else if (peek(&q, &top, "body") != KVR_OK)
        ;
    else if (top.type == KVR_MP_MAP)
        q.r.pos += top.size, read_map(&q, top.u);
    else if (top.type == KVR_MP_ARRAY)
        q.r.pos += top.size, read_array(&q, top.u);
    else
        qfail(&q, KVR_EPARSE, "body: expected a MessagePack map or array, got %s",
              kvr_mp_tname(top.type));
    if (q.status == KVR_OK && q.r.pos != len)
        qfail(&q, KVR_EPARSE, "body: %zu trailing bytes after the value", len - q.r.pos);
    if (q.status == KVR_OK)
        finish(&q, out);
    if (q.status != KVR_OK)
        memset(out, 0, sizeof *out);
    return q.status;
}

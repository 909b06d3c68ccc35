/*
 * kv_events.c: the KV-event batch decoder and converter (see kv_events.h for the formats and
 * the contract).
 *
 * Why a cursor and not msgpack-c's object tree: msgpack-c (libmsgpack-dev 4.0) spends about
 * 8 ns per value building its tree (140-150 ns per 16-token block, over the whole ingest
 * budget on its own) and reserves every container's declared size before reading it (a 6-byte
 * payload "dd 0f ff ff ff .." maps 8 GiB), so it would need a validating pre-pass anyway. This
 * file reads the bytes once with a bounds-checked cursor instead; msgpack-c stays the
 * independent oracle of the tests and the fuzz target.
 *
 * Invariants: the cursor never reads outside [p, p + n); every declared length or element
 * count is checked against the bytes left before use (an element takes at least one byte), so
 * no buffer grows beyond a constant times the payload. Each event is decoded whole or not at
 * all: on an event error the buffers roll back to where the event started, the cursor skips the
 * event's bytes (a framing check), and the event keeps only its status and message. Framing
 * errors (truncation, byte 0xc1, trailing bytes) are always batch errors.
 * Memory: the decoder owns events, offs, tok_buf, hash_buf, str_buf (names and messages) and
 * the conversion scratch; all grow geometrically and are reused. Outputs refer to buffers by
 * offset while decoding (buffers may move) and become pointers when the batch is done.
 * Threads: none of its own; a decoder belongs to one thread at a time.
 * Cost: O(payload bytes), no recursion (skipping keeps a 33-entry stack of values still to
 * skip per level); one-byte headers, 9-byte hashes and token ids take inline fast paths.
 * Conversion: one kvr_hash_blocks() per event.
 */
#include "wire/kv_events.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "wire/mp_cursor.h"

#define NONE SIZE_MAX  /* an absent offset */

struct kvr_kv_offs {
    size_t hash, tok, lora, salt, err, xk;
};

/* The cursor's codes, and the event-level one this file adds. */
#define R_OK KVR_MP_OK
#define R_EV (-1)             /* the event is invalid; its message is recorded */
#define R_FRAME KVR_MP_FRAME  /* the payload cannot be framed at r->pos (r->why says why) */

/* Containers open around the values at each level of a batch. */
#define OPEN_BATCH 1   /* inside the batch array or map */
#define OPEN_EVENT 3   /* inside an event (batch, events, event) */

#define STR_EQ(v, lit) kvr_mp_str_eq((v), (lit), sizeof(lit) - 1)
#define str_ieq(a, alen, lit) kvr_mp_str_ieq_n((a), (alen), (lit), sizeof(lit) - 1)

/* ------------------------------------------------------------------------------------------ */
/* Buffers and messages. */

/* The state of one decode. */
typedef struct dctx {
    kvr_kv_events_t *d;
    kvr_mp_rd_t r;
    size_t ev;            /* index of the event being decoded */
    int ev_status;        /* its first error */
    char ev_msg[200];
} dctx_t;

static int ev_fail(dctx_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the event's first error ("events[i]" then fmt); returns R_EV. */
static int ev_fail(dctx_t *c, int status, const char *fmt, ...)
{
    if (c->ev_status != KVR_OK)
        return R_EV;
    c->ev_status = status;
    int k = snprintf(c->ev_msg, sizeof c->ev_msg, "events[%zu]", c->ev);
    if (k < 0 || (size_t)k >= sizeof c->ev_msg)
        k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->ev_msg + k, sizeof c->ev_msg - (size_t)k, fmt, ap);
    va_end(ap);
    return R_EV;
}

static int batch_fail(kvr_kv_events_t *d, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int batch_fail(kvr_kv_events_t *d, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof d->err, fmt, ap);
    va_end(ap);
    return status;
}

/* The batch error for a framing failure at c->r.pos, inside `where`. */
static int frame_fail(dctx_t *c, const char *where)
{
    const kvr_mp_rd_t *r = &c->r;
    switch (r->why) {
    case KVR_MP_W_BAD:
        return batch_fail(c->d, KVR_EPARSE, "invalid msgpack: byte 0xc1 at offset %zu (in %s)",
                          r->pos, where);
    case KVR_MP_W_LEN:
        return batch_fail(c->d, KVR_EPARSE,
                          "truncated: the value at offset %zu (in %s) runs past the end of the "
                          "%zu-byte payload", r->pos, where, r->n);
    case KVR_MP_W_DEEP:
        return batch_fail(c->d, KVR_EPARSE, "too deep: the container at offset %zu (in %s) "
                          "is nested deeper than %d levels", r->pos, where, KVR_MP_MAX_DEPTH);
    case KVR_MP_W_COUNT:
        return batch_fail(c->d, KVR_EPARSE,
                          "truncated: %s needs more values than the %zu bytes left after "
                          "offset %zu", where, r->n - r->pos, r->pos);
    default:
        return batch_fail(c->d, KVR_EPARSE,
                          "truncated: the payload ends (%zu bytes) inside %s", r->n, where);
    }
}

/* Appends a string (NUL-terminated) to str_buf; its offset goes to *off. */
static int push_str(kvr_kv_events_t *d, const void *s, size_t len, size_t *off)
{
    if (kvr_grow((void **)&d->str_buf, &d->str_cap, d->n_str + len + 1, SIZE_MAX, 1) != KVR_OK)
        return KVR_ENOMEM;
    memcpy(d->str_buf + d->n_str, s, len);
    d->str_buf[d->n_str + len] = '\0';
    *off = d->n_str;
    d->n_str += len + 1;
    return KVR_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Fields. Each reads one value at the cursor: R_OK (consumed), R_EV (recorded) or R_FRAME. */

static int want(dctx_t *c, kvr_mp_t *v)
{
    return kvr_mp_peek(&c->r, v) == R_OK ? R_OK : R_FRAME;
}

static int rd_hash_value(dctx_t *c, const char *name, size_t k, bool indexed, uint64_t *out)
{
    const kvr_mp_rd_t *r = &c->r;
    if (r->n - r->pos >= 9 && (r->p[r->pos] == 0xcf || r->p[r->pos] == 0xd3)) {
        *out = kvr_mp_be64(r->p + r->pos + 1);  /* u64 or i64: the same bits */
        c->r.pos += 9;
        return R_OK;
    }
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_UINT || v.type == KVR_MP_NEG) {
        *out = v.u;
    } else if (v.type == KVR_MP_BIN && v.u > 0) {
        size_t n = (size_t)v.u, from = n > 8 ? n - 8 : 0;
        uint64_t h = 0;
        for (size_t i = from; i < n; i++)
            h = h << 8 | v.data[i];
        *out = h;
    } else if (indexed) {
        return ev_fail(c, KVR_EPARSE, ".%s[%zu]: expected an integer or non-empty binary, "
                       "found %s", name, k, kvr_mp_tname(v.type));
    } else {
        return ev_fail(c, KVR_EPARSE, ".%s: expected an integer, non-empty binary or nil, "
                       "found %s", name, kvr_mp_tname(v.type));
    }
    c->r.pos += v.size;
    return R_OK;
}

static int f_hashes(dctx_t *c, kvr_kv_event_t *ev, struct kvr_kv_offs *o)
{
    kvr_kv_events_t *d = c->d;
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type != KVR_MP_ARRAY)
        return ev_fail(c, KVR_EPARSE, ".block_hashes: expected an array, found %s",
                       kvr_mp_tname(v.type));
    size_t n = (size_t)v.u;
    if (n > d->limits.max_hashes)
        return ev_fail(c, KVR_ETOOBIG, ".block_hashes: %zu hashes exceed the limit of %zu "
                       "(max_hashes)", n, d->limits.max_hashes);
    c->r.pos += v.size;
    if (kvr_grow((void **)&d->hash_buf, &d->hash_cap, d->n_hash + n, SIZE_MAX, sizeof *d->hash_buf) != KVR_OK)
        return ev_fail(c, KVR_ENOMEM, ".block_hashes: out of memory");
    uint64_t *out = d->hash_buf + d->n_hash;
    for (size_t k = 0; k < n; k++) {
        int rc = rd_hash_value(c, "block_hashes", k, true, &out[k]);
        if (rc != R_OK)
            return rc;
    }
    o->hash = d->n_hash;
    d->n_hash += n;
    ev->n_hashes = n;
    return R_OK;
}

static int f_parent(dctx_t *c, kvr_kv_event_t *ev)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_NIL) {
        c->r.pos += v.size;
        ev->has_parent = false;
        return R_OK;
    }
    int rc = rd_hash_value(c, "parent_block_hash", 0, false, &ev->parent);
    ev->has_parent = rc == R_OK;
    return rc;
}

/* A token id: an integer in [0, 2^32). */
static int rd_token(dctx_t *c, const char *what, size_t k, uint32_t *out)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    char num[24];
    if (v.type == KVR_MP_UINT && v.u <= UINT32_MAX) {
        *out = (uint32_t)v.u;
        c->r.pos += v.size;
        return R_OK;
    }
    if (v.type == KVR_MP_UINT || v.type == KVR_MP_NEG)
        return ev_fail(c, KVR_ERANGE, ".token_ids[%zu]%s: %s is not in [0, 4294967295]", k,
                       what, kvr_mp_vdesc(&v, num, sizeof num));
    return ev_fail(c, KVR_EPARSE, ".token_ids[%zu]%s: expected an integer, found %s", k, what,
                   kvr_mp_tname(v.type));
}

/* EAGLE pairs [[t0, t1], [t1, t2], ...]: the first of each pair, then the last second. */
static int eagle_pairs(dctx_t *c, kvr_kv_event_t *ev, struct kvr_kv_offs *o, size_t n)
{
    kvr_kv_events_t *d = c->d;
    if (n + 1 > d->limits.max_tokens)
        return ev_fail(c, KVR_ETOOBIG, ".token_ids: %zu tokens exceed the limit of %zu "
                       "(max_tokens)", n + 1, d->limits.max_tokens);
    if (kvr_grow((void **)&d->tok_buf, &d->tok_cap, d->n_tok + n + 1, SIZE_MAX, sizeof *d->tok_buf) != KVR_OK)
        return ev_fail(c, KVR_ENOMEM, ".token_ids: out of memory");
    uint32_t *out = d->tok_buf + d->n_tok;
    for (size_t k = 0; k < n; k++) {
        kvr_mp_t v;
        if (want(c, &v) != R_OK)
            return R_FRAME;
        if (v.type != KVR_MP_ARRAY || v.u != 2)
            return ev_fail(c, KVR_EPARSE, ".token_ids[%zu]: expected an [a, b] pair like "
                           "token_ids[0], found %s%s", k, kvr_mp_tname(v.type),
                           v.type == KVR_MP_ARRAY ? " of another length" : "");
        c->r.pos += v.size;
        int rc = rd_token(c, "[0]", k, &out[k]);
        if (rc == R_OK)
            rc = rd_token(c, "[1]", k, &out[n]);
        if (rc != R_OK)
            return rc;
    }
    o->tok = d->n_tok;
    d->n_tok += n + 1;
    ev->n_tokens = n + 1;
    ev->is_eagle = true;
    return R_OK;
}

static int f_tokens(dctx_t *c, kvr_kv_event_t *ev, struct kvr_kv_offs *o)
{
    kvr_kv_events_t *d = c->d;
    kvr_mp_rd_t *r = &c->r;
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type != KVR_MP_ARRAY)
        return ev_fail(c, KVR_EPARSE, ".token_ids: expected an array, found %s", kvr_mp_tname(v.type));
    size_t n = (size_t)v.u;
    r->pos += v.size;
    if (n == 0) {
        ev->n_tokens = 0;
        return R_OK;
    }
    uint8_t first = r->p[r->pos];  /* in bounds: peek saw n >= 1 bytes left */
    if ((first >= 0x90 && first <= 0x9f) || first == 0xdc || first == 0xdd)
        return eagle_pairs(c, ev, o, n);
    if (n > d->limits.max_tokens)
        return ev_fail(c, KVR_ETOOBIG, ".token_ids: %zu tokens exceed the limit of %zu "
                       "(max_tokens)", n, d->limits.max_tokens);
    if (kvr_grow((void **)&d->tok_buf, &d->tok_cap, d->n_tok + n, SIZE_MAX, sizeof *d->tok_buf) != KVR_OK)
        return ev_fail(c, KVR_ENOMEM, ".token_ids: out of memory");
    uint32_t *out = d->tok_buf + d->n_tok;
    const uint8_t *p = r->p;
    size_t pos = r->pos, end = r->n;
    for (size_t k = 0; k < n; k++) {
        /* the encodings msgspec and msgpack-python use for token ids, inline */
        uint8_t b = pos < end ? p[pos] : 0xc1;
        if (b < 0x80) {
            out[k] = b;
            pos += 1;
        } else if (b == 0xcd && end - pos >= 3) {
            out[k] = kvr_mp_be16(p + pos + 1);
            pos += 3;
        } else if (b == 0xce && end - pos >= 5) {
            out[k] = kvr_mp_be32(p + pos + 1);
            pos += 5;
        } else if (b == 0xcc && end - pos >= 2) {
            out[k] = p[pos + 1];
            pos += 2;
        } else {
            r->pos = pos;
            int rc = rd_token(c, "", k, &out[k]);
            if (rc != R_OK)
                return rc;
            pos = r->pos;
        }
    }
    r->pos = pos;
    o->tok = d->n_tok;
    d->n_tok += n;
    ev->n_tokens = n;
    return R_OK;
}

/* An unsigned integer in [lo, hi], or nil when nil_ok. */
static int f_u32(dctx_t *c, const char *name, uint32_t lo, uint32_t hi, bool nil_ok,
                 bool *has, uint32_t *out)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_NIL && nil_ok) {
        *has = false;
        c->r.pos += v.size;
        return R_OK;
    }
    char num[24];
    if (v.type == KVR_MP_UINT && v.u >= lo && v.u <= hi) {
        *has = true;
        *out = (uint32_t)v.u;
        c->r.pos += v.size;
        return R_OK;
    }
    return ev_fail(c, v.type == KVR_MP_UINT || v.type == KVR_MP_NEG ? KVR_ERANGE : KVR_EPARSE,
                   ".%s: expected an integer in [%" PRIu32 ", %" PRIu32 "]%s, found %s", name,
                   lo, hi, nil_ok ? " or nil" : "", kvr_mp_vdesc(&v, num, sizeof num));
}

/* group_idx at its vLLM position: Dynamo reads the positional tail by type (some producers
 * put block_mm_infos first), so a value that is not an integer or nil is skipped there. */
static int f_group_positional(dctx_t *c, kvr_kv_event_t *ev)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type != KVR_MP_UINT && v.type != KVR_MP_NEG && v.type != KVR_MP_NIL)
        return kvr_mp_skip(&c->r, 1, OPEN_EVENT);
    return f_u32(c, "group_idx", 0, UINT32_MAX, true, &ev->has_group_idx, &ev->group_idx);
}

/* A string or nil; "" counts as none. On success *off is NONE or the copy's offset. */
static int f_name(dctx_t *c, const char *name, size_t *off, size_t *len)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_NIL || (v.type == KVR_MP_STR && v.u == 0)) {
        *off = NONE;
        *len = 0;
    } else if (v.type == KVR_MP_STR) {
        if (push_str(c->d, v.data, (size_t)v.u, off) != KVR_OK)
            return ev_fail(c, KVR_ENOMEM, ".%s: out of memory", name);
        *len = (size_t)v.u;
    } else {
        return ev_fail(c, KVR_EPARSE, ".%s: expected a string or nil, found %s", name,
                       kvr_mp_tname(v.type));
    }
    c->r.pos += v.size;
    return R_OK;
}

/* One string of extra_keys (its offset in str_buf stands in s until finish()). */
static int push_xkey(dctx_t *c, uint64_t block, const void *s, size_t len, bool tagged)
{
    kvr_kv_events_t *d = c->d;
    size_t off;
    if (block > UINT32_MAX || d->n_xk >= KVR_KV_MAX_EXTRA_KEYS)
        return ev_fail(c, KVR_ETOOBIG, ".extra_keys: more than %d keys", KVR_KV_MAX_EXTRA_KEYS);
    if (kvr_grow((void **)&d->xk_buf, &d->xk_cap, d->n_xk + 1, SIZE_MAX, sizeof *d->xk_buf) !=
            KVR_OK ||
        push_str(d, s, len, &off) != KVR_OK)
        return ev_fail(c, KVR_ENOMEM, ".extra_keys: out of memory");
    d->xk_buf[d->n_xk++] =
        (kvr_kv_extra_key_t){(uint32_t)block, tagged, (const char *)(uintptr_t)off, len};
    return R_OK;
}

/* One key of a block: a string, or a [string, offset] pair, is kept; anything else (bytes of
 * prompt embeddings, numbers) is skipped. */
static int f_extra_key(dctx_t *c, uint64_t block)
{
    kvr_mp_t it;
    if (want(c, &it) != R_OK)
        return R_FRAME;
    if (it.type == KVR_MP_STR) {
        int rc = push_xkey(c, block, it.data, (size_t)it.u, false);
        c->r.pos += it.size;
        return rc;
    }
    if (it.type != KVR_MP_ARRAY || it.u != 2)
        return kvr_mp_skip(&c->r, 1, OPEN_EVENT + 2);
    c->r.pos += it.size;
    kvr_mp_t s;
    if (want(c, &s) != R_OK)
        return R_FRAME;
    if (s.type != KVR_MP_STR)
        return kvr_mp_skip(&c->r, 2, OPEN_EVENT + 3);
    int rc = push_xkey(c, block, s.data, (size_t)s.u, true);
    c->r.pos += s.size;
    return rc == R_OK ? kvr_mp_skip(&c->r, 1, OPEN_EVENT + 3) : rc;
}

/* Opens an optional container field: nil is consumed and leaves *v as nil (absent);
 * `type` is entered (v->u is its length); anything else fails naming the field. */
static int open_opt(dctx_t *c, kvr_mp_t *v, enum kvr_mp_type type, const char *name,
                    const char *what)
{
    if (want(c, v) != R_OK)
        return R_FRAME;
    if (v->type != KVR_MP_NIL && v->type != type)
        return ev_fail(c, KVR_EPARSE, ".%s: expected %s or nil, found %s", name, what,
                       kvr_mp_tname(v->type));
    c->r.pos += v->size;
    return R_OK;
}

/* vLLM's extra_keys: nil, or per block nil or an array of keys. */
static int f_extra_keys(dctx_t *c, kvr_kv_event_t *ev, struct kvr_kv_offs *o)
{
    kvr_mp_t v;
    int rc = open_opt(c, &v, KVR_MP_ARRAY, "extra_keys", "an array");
    if (rc != R_OK || v.type == KVR_MP_NIL)
        return rc;
    o->xk = c->d->n_xk;
    for (uint64_t b = 0; b < v.u; b++) {
        kvr_mp_t blk;
        if (want(c, &blk) != R_OK)
            return R_FRAME;
        if (blk.type != KVR_MP_ARRAY) { /* nil: nothing in this block */
            if (kvr_mp_skip(&c->r, 1, OPEN_EVENT + 1) != R_OK)
                return R_FRAME;
            continue;
        }
        c->r.pos += blk.size;
        for (uint64_t k = 0; k < blk.u; k++) {
            rc = f_extra_key(c, b);
            if (rc != R_OK)
                return rc;
        }
    }
    ev->n_extra_keys = c->d->n_xk - o->xk;
    return R_OK;
}

static int f_medium(dctx_t *c, kvr_kv_event_t *ev)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_NIL) {
        ev->tier = KVR_TIER_DEVICE;
    } else if (v.type == KVR_MP_STR) {
        bool known;
        ev->tier = kvr_kv_tier_from_medium((const char *)v.data, (size_t)v.u, &known);
        ev->unknown_medium = !known;
    } else {
        return ev_fail(c, KVR_EPARSE, ".medium: expected a string or nil, found %s",
                       kvr_mp_tname(v.type));
    }
    c->r.pos += v.size;
    return R_OK;
}

/* locality: nil or LOCAL keep the event; REMOTE drops it; another string drops it when
 * strict, else it is ignored (an ambiguous position, see f_event_array). */
static int f_locality(dctx_t *c, kvr_kv_event_t *ev, bool strict)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_STR) {
        if (str_ieq(v.data, (size_t)v.u, "REMOTE"))
            ev->remote = true;
        else if (!str_ieq(v.data, (size_t)v.u, "LOCAL"))
            ev->remote = strict;
    } else if (v.type != KVR_MP_NIL) {
        if (strict)
            return ev_fail(c, KVR_EPARSE, ".locality: expected a string or nil, found %s",
                           kvr_mp_tname(v.type));
        return kvr_mp_skip(&c->r, 1, OPEN_EVENT);  /* whatever it is, all of it */
    }
    c->r.pos += v.size;
    return R_OK;
}

static int f_bool(dctx_t *c, const char *name, bool *out)
{
    kvr_mp_t v;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_BOOL)
        *out = v.u != 0;
    else if (v.type != KVR_MP_NIL)
        return ev_fail(c, KVR_EPARSE, ".%s: expected a boolean or nil, found %s", name,
                       kvr_mp_tname(v.type));
    c->r.pos += v.size;
    return R_OK;
}

/* SGLang's BlockStoredMetadata: {"cache_salt": str, "session_id": ...}, other keys ignored. */
static int f_metadata(dctx_t *c, const char *name, kvr_kv_event_t *ev, struct kvr_kv_offs *o)
{
    kvr_mp_t v;
    int rc = open_opt(c, &v, KVR_MP_MAP, name, "a map");
    if (rc != R_OK || v.type == KVR_MP_NIL)
        return rc;
    for (uint64_t k = 0; k < v.u; k++) {
        kvr_mp_t key;
        if (want(c, &key) != R_OK)
            return R_FRAME;
        if (STR_EQ(&key, "cache_salt")) {
            c->r.pos += key.size;
            char fname[48];
            snprintf(fname, sizeof fname, "%s.cache_salt", name);
            rc = f_name(c, fname, &o->salt, &ev->cache_salt_len);
            if (rc != R_OK)
                return rc;
        } else if (kvr_mp_skip(&c->r, 2, OPEN_EVENT + 1) != R_OK) {
            return R_FRAME;
        }
    }
    return R_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Events. */

static kvr_kv_kind_t tag_kind(const kvr_mp_t *v)
{
    if (STR_EQ(v, "BlockStored"))
        return KVR_KV_STORED;
    if (STR_EQ(v, "BlockRemoved"))
        return KVR_KV_REMOVED;
    if (STR_EQ(v, "AllBlocksCleared"))
        return KVR_KV_CLEARED;
    return KVR_KV_IGNORED;
}

/* Positional: [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 * lora_name | SGLang metadata, extra_keys, group_idx, kv_cache_spec_kind,
 * kv_cache_spec_sliding_window, locality, ...] and [tag, block_hashes, medium, group_idx,
 * locality?, ...]. BlockRemoved's position 4 is locality in vLLM's declaration but
 * kv_cache_spec_kind in Dynamo's reading: only "REMOTE" drops the event there. */
static int event_array(dctx_t *c, kvr_kv_event_t *ev, struct kvr_kv_offs *o, const kvr_mp_t *hdr)
{
    size_t n = (size_t)hdr->u;
    if (n == 0)
        return ev_fail(c, KVR_EPARSE, ": empty array (no tag)");
    c->r.pos += hdr->size;
    kvr_mp_t tag;
    if (want(c, &tag) != R_OK)
        return R_FRAME;
    if (tag.type != KVR_MP_STR)
        return ev_fail(c, KVR_EPARSE, "[0] (tag): expected a string, found %s",
                       kvr_mp_tname(tag.type));
    ev->kind = tag_kind(&tag);
    c->r.pos += tag.size;
    if (ev->kind == KVR_KV_STORED && n < 5)
        return ev_fail(c, KVR_EPARSE, ": BlockStored array of %zu elements, need at least 5 "
                       "(tag, block_hashes, parent_block_hash, token_ids, block_size)", n);
    if (ev->kind == KVR_KV_REMOVED && n < 2)
        return ev_fail(c, KVR_EPARSE, ": BlockRemoved array of 1 element, need at least 2 "
                       "(tag, block_hashes)");
    if (ev->kind == KVR_KV_CLEARED || ev->kind == KVR_KV_IGNORED)
        return kvr_mp_skip(&c->r, n - 1, OPEN_EVENT);
    bool has = false;
    for (size_t j = 1; j < n; j++) {
        int rc;
        if (ev->kind == KVR_KV_STORED) {
            switch (j) {
            case 1: rc = f_hashes(c, ev, o); break;
            case 2: rc = f_parent(c, ev); break;
            case 3: rc = f_tokens(c, ev, o); break;
            case 4:
                rc = f_u32(c, "block_size", 1, UINT32_MAX, false, &has, &ev->block_size);
                break;
            case 6: rc = f_medium(c, ev); break;
            case 7: {
                kvr_mp_t v;
                if (want(c, &v) != R_OK)
                    return R_FRAME;
                if (v.type == KVR_MP_MAP)
                    rc = f_metadata(c, "metadata", ev, o);
                else
                    rc = f_name(c, "lora_name", &o->lora, &ev->lora_name_len);
                break;
            }
            case 8:
                rc = f_extra_keys(c, ev, o);
                break;
            case 9: rc = f_group_positional(c, ev); break;
            case 12: rc = f_locality(c, ev, true); break;
            default: rc = kvr_mp_skip(&c->r, 1, OPEN_EVENT); break;
            }
        } else {
            switch (j) {
            case 1: rc = f_hashes(c, ev, o); break;
            case 2: rc = f_medium(c, ev); break;
            case 3: rc = f_group_positional(c, ev); break;
            case 4: rc = f_locality(c, ev, false); break;
            default: rc = kvr_mp_skip(&c->r, 1, OPEN_EVENT); break;
            }
        }
        if (rc != R_OK)
            return rc;
    }
    return R_OK;
}

enum key {
    K_TYPE,
    K_HASHES,
    K_PARENT,
    K_TOKENS,
    K_BLOCK_SIZE,
    K_MEDIUM,
    K_LORA_NAME,
    K_GROUP_IDX,
    K_LOCALITY,
    K_CACHE_SALT,
    K_IS_EAGLE,
    K_METADATA,
    K_EXTRA_KEYS,
    K_OTHER,
};

static const char *const KEY_NAMES[K_OTHER] = {
    "type",     "block_hashes", "parent_block_hash", "token_ids", "block_size",
    "medium",   "lora_name",    "group_idx",         "locality",  "cache_salt",
    "is_eagle", "metadata",     "extra_keys",
};
static const uint8_t KEY_LENS[K_OTHER] = {4, 12, 17, 9, 10, 6, 9, 9, 8, 10, 8, 8, 10};

static enum key event_key(const kvr_mp_t *k)
{
    if (k->type != KVR_MP_STR)
        return K_OTHER;
    for (int i = 0; i < K_OTHER; i++) {
        if (k->u == KEY_LENS[i] && memcmp(k->data, KEY_NAMES[i], KEY_LENS[i]) == 0)
            return (enum key)i;
    }
    return K_OTHER;
}

/* Map: {"type": tag, field: value, ...}, keys in any order (msgspec writes "type" first; if
 * it is elsewhere one extra pass finds it, so fields are read knowing the event's kind). */
static int event_map(dctx_t *c, kvr_kv_event_t *ev, struct kvr_kv_offs *o, const kvr_mp_t *hdr)
{
    size_t n = (size_t)hdr->u;
    c->r.pos += hdr->size;
    size_t start = c->r.pos;
    bool found = false;
    for (size_t j = 0; j < n && !found; j++) {
        kvr_mp_t k, v;
        if (want(c, &k) != R_OK)
            return R_FRAME;
        if (STR_EQ(&k, "type")) {
            c->r.pos += k.size;
            if (want(c, &v) != R_OK)
                return R_FRAME;
            if (v.type != KVR_MP_STR)
                return ev_fail(c, KVR_EPARSE, ".type: expected a string, found %s",
                               kvr_mp_tname(v.type));
            ev->kind = tag_kind(&v);
            found = true;
        } else if (kvr_mp_skip(&c->r, 2, OPEN_EVENT) != R_OK) {
            return R_FRAME;
        }
    }
    if (!found)
        return ev_fail(c, KVR_EPARSE, ": map without a \"type\" key");
    c->r.pos = start;
    if (ev->kind == KVR_KV_CLEARED || ev->kind == KVR_KV_IGNORED)  /* no fields to read */
        return kvr_mp_skip(&c->r, 2 * (uint64_t)n, OPEN_EVENT);

    unsigned seen = 0;
    for (size_t j = 0; j < n; j++) {
        kvr_mp_t k;
        if (want(c, &k) != R_OK)
            return R_FRAME;
        if (k.type != KVR_MP_STR) {  /* not a field name: skip the key (maybe a container) and value */
            if (kvr_mp_skip(&c->r, 2, OPEN_EVENT) != R_OK)
                return R_FRAME;
            continue;
        }
        enum key key = event_key(&k);
        c->r.pos += k.size;
        if (key != K_OTHER) {
            if (seen & (1u << key))
                return ev_fail(c, KVR_EPARSE, ": duplicate key \"%s\"", KEY_NAMES[key]);
            seen |= 1u << key;
        }
        int rc;
        bool stored = ev->kind == KVR_KV_STORED, removed = ev->kind == KVR_KV_REMOVED;
        bool has = false;
        switch (key) {
        case K_HASHES:
            rc = stored || removed ? f_hashes(c, ev, o) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_PARENT:
            rc = stored ? f_parent(c, ev) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_TOKENS:
            rc = stored ? f_tokens(c, ev, o) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_BLOCK_SIZE:
            rc = stored ? f_u32(c, "block_size", 1, UINT32_MAX, false, &has, &ev->block_size)
                        : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_MEDIUM:
            rc = stored || removed ? f_medium(c, ev) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_LORA_NAME:
            rc = stored ? f_name(c, "lora_name", &o->lora, &ev->lora_name_len)
                        : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_GROUP_IDX:
            rc = stored || removed ? f_u32(c, "group_idx", 0, UINT32_MAX, true,
                                           &ev->has_group_idx, &ev->group_idx)
                                   : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_LOCALITY:
            rc = stored || removed ? f_locality(c, ev, true) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_CACHE_SALT:
            rc = stored ? f_name(c, "cache_salt", &o->salt, &ev->cache_salt_len)
                        : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_IS_EAGLE: {
            bool eagle = false;
            rc = stored ? f_bool(c, "is_eagle", &eagle) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            ev->is_eagle |= eagle;
            break;
        }
        case K_METADATA:
            rc = stored ? f_metadata(c, "metadata", ev, o) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        case K_EXTRA_KEYS:
            rc = stored ? f_extra_keys(c, ev, o) : kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        default:  /* K_TYPE (read above) and unknown keys */
            rc = kvr_mp_skip(&c->r, 1, OPEN_EVENT);
            break;
        }
        if (rc != R_OK)
            return rc;
    }
    static const enum key required_stored[] = {K_HASHES, K_TOKENS, K_BLOCK_SIZE};
    if (ev->kind == KVR_KV_STORED) {
        for (size_t i = 0; i < sizeof required_stored / sizeof *required_stored; i++) {
            if (!(seen & (1u << required_stored[i])))
                return ev_fail(c, KVR_EPARSE, ": BlockStored without \"%s\"",
                               KEY_NAMES[required_stored[i]]);
        }
    }
    if (ev->kind == KVR_KV_REMOVED && !(seen & (1u << K_HASHES)))
        return ev_fail(c, KVR_EPARSE, ": BlockRemoved without \"block_hashes\"");
    return R_OK;
}

static void event_reset(kvr_kv_event_t *ev, struct kvr_kv_offs *o)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = KVR_KV_IGNORED;
    ev->status = KVR_OK;
    ev->tier = KVR_TIER_DEVICE;
    *o = (struct kvr_kv_offs){
        .hash = NONE, .tok = NONE, .lora = NONE, .salt = NONE, .err = NONE, .xk = NONE};
}

/* Decodes event i at the cursor. R_OK (the event has its own status) or R_FRAME. */
static int decode_event(dctx_t *c, size_t i)
{
    kvr_kv_events_t *d = c->d;
    kvr_kv_event_t *ev = &d->events[i];
    struct kvr_kv_offs *o = &d->offs[i];
    event_reset(ev, o);
    c->ev = i;
    c->ev_status = KVR_OK;
    size_t start = c->r.pos, tok0 = d->n_tok, hash0 = d->n_hash, str0 = d->n_str, xk0 = d->n_xk;

    kvr_mp_t v;
    int rc;
    if (want(c, &v) != R_OK)
        return R_FRAME;
    if (v.type == KVR_MP_ARRAY)
        rc = event_array(c, ev, o, &v);
    else if (v.type == KVR_MP_MAP)
        rc = event_map(c, ev, o, &v);
    else
        rc = ev_fail(c, KVR_EPARSE, ": expected an array or a map, found %s", kvr_mp_tname(v.type));
    if (rc == R_OK)
        return R_OK;

    /* Undo the event; its bytes must still frame for the batch to go on. */
    kvr_kv_kind_t kind = ev->kind;
    d->n_tok = tok0;
    d->n_hash = hash0;
    d->n_str = str0;
    d->n_xk = xk0;
    c->r.pos = start;
    if (kvr_mp_skip(&c->r, 1, OPEN_EVENT - 1) != R_OK)
        return R_FRAME;
    if (rc == R_FRAME)  /* framed on the second look: cannot happen, but never trust it */
        ev_fail(c, KVR_EPARSE, ": internal: framing disagreed");
    event_reset(ev, o);
    ev->kind = kind;
    ev->status = c->ev_status;
    if (push_str(d, c->ev_msg, strlen(c->ev_msg), &o->err) != KVR_OK)
        o->err = NONE;  /* the status still says it */
    return R_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Batches. */

static int batch_ts(dctx_t *c, const char *where)
{
    kvr_mp_t v;
    if (kvr_mp_peek(&c->r, &v) != R_OK)
        return frame_fail(c, where);
    kvr_kv_events_t *d = c->d;
    switch (v.type) {
    case KVR_MP_FLOAT: d->ts = v.f; d->has_ts = true; break;
    case KVR_MP_UINT: d->ts = (double)v.u; d->has_ts = true; break;
    case KVR_MP_NEG: d->ts = (double)kvr_mp_as_i64(v.u); d->has_ts = true; break;
    case KVR_MP_NIL: break;
    default:
        return batch_fail(d, KVR_EPARSE, "%s: expected a number or nil, found %s", where,
                          kvr_mp_tname(v.type));
    }
    c->r.pos += v.size;
    return KVR_OK;
}

static int batch_rank(dctx_t *c, const char *where)
{
    kvr_mp_t v;
    if (kvr_mp_peek(&c->r, &v) != R_OK)
        return frame_fail(c, where);
    kvr_kv_events_t *d = c->d;
    char num[24];
    if (v.type == KVR_MP_UINT && v.u <= UINT32_MAX) {
        d->has_dp_rank = true;
        d->dp_rank = (uint32_t)v.u;
    } else if (v.type != KVR_MP_NIL) {
        return batch_fail(d, v.type == KVR_MP_UINT || v.type == KVR_MP_NEG ? KVR_ERANGE : KVR_EPARSE,
                          "%s: expected an integer in [0, 4294967295] or nil, found %s", where,
                          kvr_mp_vdesc(&v, num, sizeof num));
    }
    c->r.pos += v.size;
    return KVR_OK;
}

static int batch_events(dctx_t *c, const char *where)
{
    kvr_kv_events_t *d = c->d;
    kvr_mp_t v;
    if (kvr_mp_peek(&c->r, &v) != R_OK)
        return frame_fail(c, where);
    if (v.type != KVR_MP_ARRAY)
        return batch_fail(d, KVR_EPARSE, "%s: expected an array, found %s", where,
                          kvr_mp_tname(v.type));
    size_t n = (size_t)v.u;
    if (n > d->limits.max_events)
        return batch_fail(d, KVR_ETOOBIG, "%s: %zu events exceed the limit of %zu (max_events)",
                          where, n, d->limits.max_events);
    c->r.pos += v.size;
    if (n > d->ev_cap) {
        size_t cap1 = d->ev_cap, cap2 = d->ev_cap;
        int g1 = kvr_grow((void **)&d->events, &cap1, n, SIZE_MAX, sizeof *d->events);
        int g2 = g1 == KVR_OK ? kvr_grow((void **)&d->offs, &cap2, n, SIZE_MAX, sizeof *d->offs) : g1;
        if (g2 != KVR_OK)
            return batch_fail(d, KVR_ENOMEM, "%s: out of memory for %zu events", where, n);
        d->ev_cap = cap1 < cap2 ? cap1 : cap2;
    }
    for (size_t i = 0; i < n; i++) {
        d->n_events = i + 1;
        if (decode_event(c, i) != R_OK) {
            char in[32];
            snprintf(in, sizeof in, "events[%zu]", i);
            return frame_fail(c, in);
        }
    }
    return KVR_OK;
}

static int batch_array(dctx_t *c, const kvr_mp_t *hdr)
{
    size_t n = (size_t)hdr->u;
    if (n < 2)
        return batch_fail(c->d, KVR_EPARSE, "batch: array of %zu element%s, expected [ts, "
                          "events] or [ts, events, dp_rank]", n, n == 1 ? "" : "s");
    c->r.pos += hdr->size;
    int rc = batch_ts(c, "batch[0] (ts)");
    if (rc == KVR_OK)
        rc = batch_events(c, "batch[1] (events)");
    if (rc == KVR_OK && n >= 3)
        rc = batch_rank(c, "batch[2] (dp_rank)");
    if (rc == KVR_OK && n > 3 && kvr_mp_skip(&c->r, n - 3, OPEN_BATCH) != R_OK)
        rc = frame_fail(c, "batch[3...]");
    return rc;
}

/* Defensive: {ts, events, data_parallel_rank | attn_dp_rank | dp_rank}. */
static int batch_map(dctx_t *c, const kvr_mp_t *hdr)
{
    c->r.pos += hdr->size;
    bool seen_ts = false, seen_events = false, seen_rank = false;
    for (uint64_t j = 0; j < hdr->u; j++) {
        kvr_mp_t k;
        if (kvr_mp_peek(&c->r, &k) != R_OK)
            return frame_fail(c, "batch");
        bool *seen = NULL;
        int which = 0;
        if (STR_EQ(&k, "ts")) {
            seen = &seen_ts;
            which = 1;
        } else if (STR_EQ(&k, "events")) {
            seen = &seen_events;
            which = 2;
        } else if (STR_EQ(&k, "data_parallel_rank") || STR_EQ(&k, "attn_dp_rank") ||
                   STR_EQ(&k, "dp_rank")) {
            seen = &seen_rank;
            which = 3;
        }
        if (seen == NULL) {
            if (kvr_mp_skip(&c->r, 2, OPEN_BATCH) != R_OK)
                return frame_fail(c, "batch");
            continue;
        }
        if (*seen)
            return batch_fail(c->d, KVR_EPARSE, "batch: duplicate key \"%.*s\"", (int)k.u,
                              (const char *)k.data);
        *seen = true;
        c->r.pos += k.size;
        int rc = which == 1 ? batch_ts(c, "batch.ts")
                 : which == 2 ? batch_events(c, "batch.events")
                              : batch_rank(c, "batch.dp_rank");
        if (rc != KVR_OK)
            return rc;
    }
    if (!seen_events)
        return batch_fail(c->d, KVR_EPARSE, "batch: map without an \"events\" key");
    return KVR_OK;
}

/* Turns offsets into pointers and tallies the batch. */
static void finish(kvr_kv_events_t *d)
{
    static const char empty[] = "";
    memset(&d->counts, 0, sizeof d->counts);
    for (size_t i = 0; i < d->n_events; i++) {
        kvr_kv_event_t *ev = &d->events[i];
        const struct kvr_kv_offs *o = &d->offs[i];
        ev->hashes = o->hash != NONE && ev->n_hashes > 0 ? d->hash_buf + o->hash : NULL;
        ev->tokens = o->tok != NONE && ev->n_tokens > 0 ? d->tok_buf + o->tok : NULL;
        ev->lora_name = o->lora != NONE ? d->str_buf + o->lora : NULL;
        if (ev->lora_name == NULL)
            ev->lora_name_len = 0;
        ev->cache_salt = o->salt != NONE ? d->str_buf + o->salt : NULL;
        if (ev->cache_salt == NULL)
            ev->cache_salt_len = 0;
        ev->err = o->err != NONE ? d->str_buf + o->err : empty;
        ev->extra_keys = o->xk != NONE && ev->n_extra_keys > 0 ? d->xk_buf + o->xk : NULL;
        for (size_t k = 0; ev->extra_keys != NULL && k < ev->n_extra_keys; k++)
            d->xk_buf[o->xk + k].s = d->str_buf + (size_t)(uintptr_t)d->xk_buf[o->xk + k].s;
        if (ev->status != KVR_OK)
            d->counts.errors++;
        else if (ev->kind == KVR_KV_IGNORED)
            d->counts.ignored++;
        if (ev->remote)
            d->counts.remote++;
        if (ev->unknown_medium)
            d->counts.unknown_medium++;
    }
    d->stats.events += d->n_events;
    d->stats.event_errors += d->counts.errors;
    d->stats.events_ignored += d->counts.ignored;
    d->stats.events_remote += d->counts.remote;
    d->stats.warn_unknown_medium += d->counts.unknown_medium;
}

void kvr_kv_events_init(kvr_kv_events_t *d)
{
    memset(d, 0, sizeof *d);
    d->limits.max_payload_bytes = KVR_KV_MAX_PAYLOAD_BYTES;
    d->limits.max_events = KVR_KV_MAX_EVENTS;
    d->limits.max_tokens = KVR_KV_MAX_TOKENS;
    d->limits.max_hashes = KVR_KV_MAX_HASHES;
}

void kvr_kv_events_deinit(kvr_kv_events_t *d)
{
    if (d == NULL)
        return;
    free(d->events);
    free(d->offs);
    free(d->tok_buf);
    free(d->hash_buf);
    free(d->str_buf);
    free(d->blk_buf);
    free(d->lbh_buf);
    free(d->xk_buf);
    free(d->mm_buf);
    free(d->mmh_buf);
    kvr_kv_limits_t limits = d->limits;
    kvr_kv_stats_t stats = d->stats;
    kvr_kv_events_init(d);
    d->limits = limits;
    d->stats = stats;
}

int kvr_kv_events_decode(kvr_kv_events_t *d, const void *payload, size_t len)
{
    d->ts = 0;
    d->has_ts = false;
    d->has_dp_rank = false;
    d->dp_rank = 0;
    d->n_events = 0;
    memset(&d->counts, 0, sizeof d->counts);
    d->err[0] = '\0';
    d->conv_err[0] = '\0';
    d->n_tok = d->n_hash = d->n_str = d->n_xk = 0;
    d->stats.batches++;

    int rc;
    if (payload == NULL && len > 0) {
        rc = batch_fail(d, KVR_EINVAL, "no payload");
    } else if (len == 0) {
        rc = batch_fail(d, KVR_EPARSE, "empty payload");
    } else if (len > d->limits.max_payload_bytes) {
        rc = batch_fail(d, KVR_ETOOBIG, "payload of %zu bytes exceeds the limit of %zu "
                        "(max_payload_bytes)", len, d->limits.max_payload_bytes);
    } else {
        dctx_t c = {.d = d, .r = {.p = payload, .n = len, .pos = 0}};
        kvr_mp_t v;
        if (kvr_mp_peek(&c.r, &v) != R_OK)
            rc = frame_fail(&c, "batch");
        else if (v.type == KVR_MP_ARRAY)
            rc = batch_array(&c, &v);
        else if (v.type == KVR_MP_MAP)
            rc = batch_map(&c, &v);
        else
            rc = batch_fail(d, KVR_EPARSE, "batch: expected an array [ts, events, dp_rank] or "
                            "a map, found %s", kvr_mp_tname(v.type));
        if (rc == KVR_OK && c.r.pos != len)
            rc = batch_fail(d, KVR_EPARSE, "trailing bytes: %zu after the batch, from offset "
                            "%zu", len - c.r.pos, c.r.pos);
    }
    if (rc != KVR_OK) {
        d->stats.batch_errors++;
        d->ts = 0;
        d->has_ts = false;
        d->has_dp_rank = false;
        d->dp_rank = 0;
        d->n_events = 0;
        return rc;
    }
    finish(d);
    return KVR_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Conversion. */

static int conv_fail(kvr_kv_events_t *d, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int conv_fail(kvr_kv_events_t *d, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->conv_err, sizeof d->conv_err, fmt, ap);
    va_end(ap);
    return status;
}

/* vLLM's extra_keys, read as the reference reads them:
 *   - a cache namespace: in the first block, a bare key "dynamo-cache-salt:NAME" (after
 *     skipping the first key equal to the LoRA name), when the event names no cache_salt;
 *   - multimodal objects: a tagged key ([identifier, offset], vLLM >= 0.19) is an identifier
 *     (a 64-digit hex digest gives its first 16 digits, another string its XXH3-64); a bare key
 *     counts only as a 64-digit hex digest and never when it equals the LoRA name (bare
 *     strings are also LoRA names and salts). */
static bool is_lora(const kvr_kv_event_t *ev, const kvr_kv_extra_key_t *k)
{
    return ev->lora_name != NULL && k->len == ev->lora_name_len &&
           memcmp(k->s, ev->lora_name, k->len) == 0;
}

static void salt_from_extra_keys(const kvr_kv_event_t *ev, kvr_hash_opts_t *o)
{
    static const char tag[] = "dynamo-cache-salt:";
    bool lora_skipped = false;
    for (size_t k = 0; k < ev->n_extra_keys && ev->extra_keys[k].block == 0; k++) {
        const kvr_kv_extra_key_t *x = &ev->extra_keys[k];
        if (x->tagged)
            continue;
        if (!lora_skipped && is_lora(ev, x)) {
            lora_skipped = true;
            continue;
        }
        if (x->len > sizeof tag - 1 && memcmp(x->s, tag, sizeof tag - 1) == 0) {
            o->cache_namespace = x->s + sizeof tag - 1;
            o->cache_namespace_len = x->len - (sizeof tag - 1);
            return;
        }
    }
}

static int mm_from_extra_keys(kvr_kv_events_t *d, const kvr_kv_event_t *ev, kvr_hash_opts_t *o)
{
    size_t n = ev->n_extra_keys;
    if ((n > d->mmh_cap &&
         kvr_grow((void **)&d->mmh_buf, &d->mmh_cap, n, SIZE_MAX, sizeof *d->mmh_buf) != KVR_OK) ||
        (n > d->mm_cap &&
         kvr_grow((void **)&d->mm_buf, &d->mm_cap, n, SIZE_MAX, sizeof *d->mm_buf) != KVR_OK))
        return KVR_ENOMEM;
    size_t nh = 0, nb = 0;
    for (size_t k = 0; k < n; k++) {
        const kvr_kv_extra_key_t *x = &ev->extra_keys[k];
        uint64_t h;
        if ((!x->tagged && is_lora(ev, x)) || !kvr_hash_mm_identifier(x->s, x->len, x->tagged, &h))
            continue;
        if (nb == 0 || d->mm_buf[nb - 1].block != x->block)
            d->mm_buf[nb++] = (kvr_block_mm_t){x->block, d->mmh_buf + nh, 0};
        d->mmh_buf[nh++] = h;
        d->mm_buf[nb - 1].n_hashes++;
    }
    o->mm = nb > 0 ? d->mm_buf : NULL;
    o->n_mm = nb;
    return KVR_OK;
}

int kvr_kv_events_convert(kvr_kv_events_t *d, size_t i, const kvr_kv_target_t *t,
                          kvr_event_t *out)
{
    if (d == NULL)
        return KVR_EINVAL;
    d->conv_err[0] = '\0';
    if (t == NULL || out == NULL || i >= d->n_events)
        return conv_fail(d, KVR_EINVAL, "events[%zu]: no such event (batch of %zu)", i,
                         d->n_events);
    if (t->block_size == 0)
        return conv_fail(d, KVR_EINVAL, "router block size 0");
    const kvr_kv_event_t *ev = &d->events[i];
    if (ev->status != KVR_OK)
        return conv_fail(d, ev->status, "%s", ev->err);
    if (ev->kind == KVR_KV_IGNORED || ev->remote)
        return 0;

    memset(out, 0, sizeof *out);
    out->worker.worker_id = t->worker.worker_id;
    out->worker.dp_rank = d->has_dp_rank ? d->dp_rank : t->worker.dp_rank;
    out->event_id = t->event_id;
    out->tier = ev->tier;
    switch (ev->kind) {
    case KVR_KV_CLEARED:
        out->kind = KVR_EV_CLEARED;
        out->tier = KVR_TIER_DEVICE;
        break;
    case KVR_KV_REMOVED:
        out->kind = KVR_EV_REMOVED;
        out->removed = ev->hashes;
        out->n_removed = ev->n_hashes;
        break;
    case KVR_KV_STORED: {
        uint32_t bs = ev->block_size;
        if (bs != t->block_size) {
            d->stats.convert_mismatch++;
            return conv_fail(d, KVR_EMISMATCH, "events[%zu]: block_size %" PRIu32 " differs "
                             "from the router's %" PRIu32, i, bs, t->block_size);
        }
        size_t n = ev->n_hashes;
        uint64_t need = (uint64_t)n * bs + (ev->is_eagle && n > 0 ? 1 : 0);
        if (ev->n_tokens < need) {
            d->stats.convert_short_tokens++;
            return conv_fail(d, KVR_ERANGE, "events[%zu]: token_ids has %zu tokens, %zu blocks "
                             "of %" PRIu32 "%s need %" PRIu64, i, ev->n_tokens, n, bs,
                             ev->is_eagle ? " (Eagle)" : "", need);
        }
        if (ev->n_tokens > need)
            d->stats.warn_extra_tokens++;
        if (n > d->blk_cap) {
            size_t cap1 = d->blk_cap, cap2 = d->blk_cap;
            int g1 = kvr_grow((void **)&d->blk_buf, &cap1, n, SIZE_MAX, sizeof *d->blk_buf);
            int g2 = g1 == KVR_OK ? kvr_grow((void **)&d->lbh_buf, &cap2, n, SIZE_MAX, sizeof *d->lbh_buf) : g1;
            if (g2 != KVR_OK)
                return conv_fail(d, KVR_ENOMEM, "events[%zu]: out of memory", i);
            d->blk_cap = cap1 < cap2 ? cap1 : cap2;
        }
        kvr_hash_opts_t opts = {
            .lora_name = ev->lora_name,
            .lora_name_len = ev->lora_name_len,
            .cache_namespace = ev->cache_salt,
            .cache_namespace_len = ev->cache_salt_len,
            .is_eagle = ev->is_eagle,
        };
        if (ev->n_extra_keys > 0) {
            if (opts.cache_namespace == NULL)
                salt_from_extra_keys(ev, &opts);
            if (mm_from_extra_keys(d, ev, &opts) != KVR_OK)
                return conv_fail(d, KVR_ENOMEM, "events[%zu]: out of memory", i);
        }
        long got = kvr_hash_blocks(ev->tokens, (size_t)need, bs, &opts, d->lbh_buf, n);
        if (got < 0 || (size_t)got != n)
            return conv_fail(d, got < 0 ? (int)got : KVR_EINVAL, "events[%zu]: hashing gave "
                             "%ld blocks for %zu", i, got, n);
        for (size_t j = 0; j < n; j++)
            d->blk_buf[j] = (kvr_block_t){.ext = ev->hashes[j], .lbh = d->lbh_buf[j]};
        out->kind = KVR_EV_STORED;
        out->has_parent = ev->has_parent;
        out->parent_ext = ev->parent;
        out->blocks = n > 0 ? d->blk_buf : NULL;
        out->n_blocks = n;
        break;
    }
    default:
        return 0;
    }
    d->stats.converted++;
    return 1;
}

kvr_tier_t kvr_kv_tier_from_medium(const char *s, size_t len, bool *known)
{
#define M(s, t) {s, sizeof(s) - 1, t}
    static const struct {
        const char *name;
        size_t len;
        kvr_tier_t tier;
    } TABLE[] = {
        M("GPU", KVR_TIER_DEVICE),        M("DEVICE", KVR_TIER_DEVICE),
        M("CPU", KVR_TIER_HOST),          M("CPU_PINNED", KVR_TIER_HOST),
        M("CPU_TIER1", KVR_TIER_HOST),    M("CPU_TIER2", KVR_TIER_DISK),
        M("DISK", KVR_TIER_DISK),         M("NVME", KVR_TIER_DISK),
        M("STORAGE", KVR_TIER_DISK),      M("FS", KVR_TIER_DISK),
        M("OBJ", KVR_TIER_DISK),          M("EXTERNAL", KVR_TIER_EXTERNAL),
        M("NETWORK", KVR_TIER_EXTERNAL),  M("REMOTE", KVR_TIER_EXTERNAL),
        M("SHARED", KVR_TIER_EXTERNAL),
    };
#undef M
    bool k = true;
    kvr_tier_t tier = KVR_TIER_DEVICE;
    if (s != NULL && len > 0) {
        k = false;
        for (size_t i = 0; i < sizeof TABLE / sizeof *TABLE && !k; i++) {
            if (kvr_mp_str_ieq_n((const uint8_t *)s, len, TABLE[i].name, TABLE[i].len)) {
                tier = TABLE[i].tier;
                k = true;
            }
        }
    }
    if (known != NULL)
        *known = k;
    return tier;
}

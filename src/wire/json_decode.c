/*
 * json_decode.c: the plumbing shared by the JSON decoders (see json_decode.h for the contract).
 */
#include "wire/json_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ascii.h"
#include "base/grow.h"
#include "kvrouter.h"
#include "wire/json_writer.h"
#include "wire/token_scan.h"

int kvr_jd_parse_double(const char *s, size_t n, char **scratch, size_t *scratch_cap,
                        double *out)
{
    char local[64];
    char *b = local;
    if (n >= sizeof local) {
        if (kvr_grow((void **)scratch, scratch_cap, n + 1, SIZE_MAX, 1) != KVR_OK)
            return KVR_ENOMEM;
        b = *scratch;
    }
    memcpy(b, s, n);
    b[n] = '\0';
    char *end;
    *out = strtod(b, &end);
    return end == b + n && isfinite(*out) ? KVR_OK : KVR_EINVAL;
}

bool kvr_jd_utf8_ok(const unsigned char *s, size_t n)
{
    return kvr_ascii_end(s, 0, n) == n || kvr_json_utf8_valid((const char *)s, n);
}

const char *kvr_jd_text_problem(const unsigned char *s, size_t n)
{
    bool ascii = true;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x20 || s[i] == 0x7f)
            return "contains a control character";
        ascii &= s[i] < 0x80;
    }
    if (!ascii && !kvr_json_utf8_valid((const char *)s, n))
        return "is not valid UTF-8";
    return NULL;
}

void kvr_jd_clip(char *dst, size_t dst_len, const unsigned char *s, size_t n)
{
    size_t max = dst_len - 1, j = 0;
    bool cut = n > 40;
    if (cut)
        n = 37;
    for (size_t i = 0; i < n && j < max; i++)
        dst[j++] = (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\') ? (char)s[i] : '?';
    for (int k = 0; cut && k < 3 && j < max; k++)
        dst[j++] = '.';
    dst[j] = '\0';
}

int kvr_jd_vfail(int *status, char *err, size_t err_len, int st, const char *fmt, va_list ap)
{
    if (*status != KVR_OK)
        return 0;
    *status = st;
    if (err_len > 0)
        vsnprintf(err, err_len, fmt, ap);
    return 0;
}

int kvr_jd_fail(int *status, char *err, size_t err_len, int st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvr_jd_vfail(status, err, err_len, st, fmt, ap);
    va_end(ap);
    return 0;
}

bool kvr_jd_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!kvr_jd_is_ws(s[i]))
            return false;
    return true;
}

yajl_handle kvr_jd_yajl_open(kvr_yajl_arena_t *a, const yajl_callbacks *cb, void *ctx)
{
    kvr_yajl_arena_reset(a);
    yajl_alloc_funcs afs = kvr_yajl_arena_funcs(a);
    return yajl_alloc(cb, &afs, ctx);
}

/* yajl's message on one line: "lexical error: invalid char in json text". Its messages are
 * fixed ASCII strings; blanking what would need escaping is a guard, not a transformation. */
static void yajl_error_line(yajl_handle h, char *out, size_t cap)
{
    unsigned char *msg = yajl_get_error(h, 0, NULL, 0);
    const char *m = msg != NULL ? (const char *)msg : "unknown error";
    size_t n = strlen(m);
    while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == ' '))
        n--;
    if (n >= cap)
        n = cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)m[i];
        out[i] = (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') ? ' ' : (char)c;
    }
    out[n] = '\0';
    if (msg != NULL)
        yajl_free_error(h, msg);
}

yajl_status kvr_jd_yajl_finish(yajl_handle h, yajl_status st, size_t base, size_t len,
                               char *msg, size_t msg_len)
{
    size_t at = len;
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    else if (st == yajl_status_error)
        at = base + yajl_get_bytes_consumed(h);
    if (msg_len > 0)
        msg[0] = '\0';
    if (st == yajl_status_error && msg_len > 0) {
        char shown[160];
        yajl_error_line(h, shown, sizeof shown);
        snprintf(msg, msg_len, "invalid JSON at byte %zu: %s", at, shown);
    }
    return st;
}

/* ---- the skeleton's callbacks (see json_decode.h) ---- */

static bool skipping(const kvr_jd_skip_t *s) { return s->pending || s->depth > 0; }

/* A scalar inside a skipped container, or the skipped value itself. */
static int skip_scalar(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    if (s->depth > 0)
        return 1;
    s->pending = false;
    return s->ops->skipped(ctx);
}

static int skip_open(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    if (s->depth == 0) { /* the skipped value is a container */
        s->pending = false;
        s->depth = 1;
        return 1;
    }
    const kvr_jd_skip_ops_t *o = s->ops;
    if (o->max_depth > 0 && o->depth(ctx) + s->depth >= o->max_depth)
        return o->too_deep(ctx);
    s->depth++;
    return 1;
}

static int skip_close(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    return --s->depth == 0 ? s->ops->skipped(ctx) : 1;
}

static int jd_null(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    return skipping(s) ? skip_scalar(ctx) : s->ops->own.yajl_null(ctx);
}

static int jd_boolean(void *ctx, int v)
{
    kvr_jd_skip_t *s = ctx;
    return skipping(s) ? skip_scalar(ctx) : s->ops->own.yajl_boolean(ctx, v);
}

static int jd_number(void *ctx, const char *n, size_t len)
{
    kvr_jd_skip_t *s = ctx;
    return skipping(s) ? skip_scalar(ctx) : s->ops->own.yajl_number(ctx, n, len);
}

static int jd_string(void *ctx, const unsigned char *v, size_t len)
{
    kvr_jd_skip_t *s = ctx;
    return skipping(s) ? skip_scalar(ctx) : s->ops->own.yajl_string(ctx, v, len);
}

static int jd_start_map(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    return skipping(s) ? skip_open(ctx) : s->ops->own.yajl_start_map(ctx);
}

static int jd_map_key(void *ctx, const unsigned char *k, size_t len)
{
    kvr_jd_skip_t *s = ctx;
    return s->depth > 0 ? 1 : s->ops->own.yajl_map_key(ctx, k, len);
}

static int jd_end_map(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    return s->depth > 0 ? skip_close(ctx) : s->ops->own.yajl_end_map(ctx);
}

static int jd_start_array(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    return skipping(s) ? skip_open(ctx) : s->ops->own.yajl_start_array(ctx);
}

static int jd_end_array(void *ctx)
{
    kvr_jd_skip_t *s = ctx;
    return s->depth > 0 ? skip_close(ctx) : s->ops->own.yajl_end_array(ctx);
}

const yajl_callbacks kvr_jd_callbacks = {
    .yajl_null = jd_null,
    .yajl_boolean = jd_boolean,
    .yajl_integer = NULL,
    .yajl_double = NULL,
    .yajl_number = jd_number,
    .yajl_string = jd_string,
    .yajl_start_map = jd_start_map,
    .yajl_map_key = jd_map_key,
    .yajl_end_map = jd_end_map,
    .yajl_start_array = jd_start_array,
    .yajl_end_array = jd_end_array,
};

/*
 * json_writer.c: the JSON builder (see json_writer.h for the contract).
 *
 * Invariants: buf[0..len) is a prefix of a valid JSON document whenever status is KVR_OK;
 * buf[len] is NUL once cap > 0. depth <= KVR_JSON_MAX_DEPTH; bits at and above depth in
 * is_object/has_items are zero. after_key implies the innermost container is an object.
 * Memory: one buffer, doubled as needed and kept across reset. Threads: none of its own.
 * Cost: O(bytes written); strings are copied in runs of bytes that need no escaping.
 */
#include "wire/json_writer.h"

#include "base/ascii.h"
#include "base/dec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_json_writer_init(kvr_json_writer_t *w)
{
    memset(w, 0, sizeof *w);
}

void kvr_json_writer_deinit(kvr_json_writer_t *w)
{
    if (w == NULL)
        return;
    free(w->buf);
    kvr_json_writer_init(w);
}

void kvr_json_writer_reset(kvr_json_writer_t *w)
{
    w->len = 0;
    if (w->cap > 0)
        w->buf[0] = '\0';
    w->status = KVR_OK;
    w->depth = 0;
    w->after_key = false;
    w->top_done = false;
    w->is_object = 0;
    w->has_items = 0;
}

int kvr_json_writer_status(const kvr_json_writer_t *w)
{
    return w->status;
}

static int set_error(kvr_json_writer_t *w, int status)
{
    if (w->status == KVR_OK)
        w->status = status;
    return w->status;
}

/* Room for n more bytes plus the NUL. */
static bool reserve(kvr_json_writer_t *w, size_t n)
{
    if (w->status != KVR_OK)
        return false;
    if (n < w->cap - w->len)
        return true;
    if (n > SIZE_MAX / 2 - w->len) {
        set_error(w, KVR_ENOMEM);
        return false;
    }
    size_t need = w->len + n + 1, cap = w->cap < 256 ? 256 : w->cap;
    while (cap < need)
        cap *= 2;
    char *p = realloc(w->buf, cap);
    if (p == NULL) {
        set_error(w, KVR_ENOMEM);
        return false;
    }
    w->buf = p;
    w->cap = cap;
    return true;
}

/* Appends without a reserve check (the caller reserved). */
static void put(kvr_json_writer_t *w, const char *s, size_t n)
{
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static uint64_t bit(unsigned depth)
{
    return (uint64_t)1 << (depth - 1);
}

/* Before any value: checks that a value may come here and writes the comma it needs. */
static bool value_start(kvr_json_writer_t *w, size_t extra)
{
    if (w->status != KVR_OK)
        return false;
    if (w->depth == 0) {
        if (w->top_done) {
            set_error(w, KVR_EINVAL);
            return false;
        }
    } else if (w->is_object & bit(w->depth)) {
        if (!w->after_key) {
            set_error(w, KVR_EINVAL);
            return false;
        }
    }
    bool comma = w->depth > 0 && !(w->is_object & bit(w->depth)) && (w->has_items & bit(w->depth));
    if (!reserve(w, extra + 1))
        return false;
    if (comma)
        put(w, ",", 1);
    return true;
}

/* After a complete value (scalar or closed container). */
static void value_end(kvr_json_writer_t *w)
{
    w->after_key = false;
    if (w->depth == 0)
        w->top_done = true;
    else
        w->has_items |= bit(w->depth);
}

static int begin(kvr_json_writer_t *w, bool object)
{
    if (!value_start(w, 1))
        return w->status;
    if (w->depth >= KVR_JSON_MAX_DEPTH)
        return set_error(w, KVR_EINVAL);
    put(w, object ? "{" : "[", 1);
    w->after_key = false;
    w->depth++;
    if (object)
        w->is_object |= bit(w->depth);
    return KVR_OK;
}

static int end(kvr_json_writer_t *w, bool object)
{
    if (w->status != KVR_OK)
        return w->status;
    if (w->depth == 0 || w->after_key || ((w->is_object & bit(w->depth)) != 0) != object)
        return set_error(w, KVR_EINVAL);
    if (!reserve(w, 1))
        return w->status;
    put(w, object ? "}" : "]", 1);
    w->is_object &= ~bit(w->depth);
    w->has_items &= ~bit(w->depth);
    w->depth--;
    value_end(w);
    return KVR_OK;
}

int kvr_json_begin_object(kvr_json_writer_t *w)
{
    return begin(w, true);
}

int kvr_json_end_object(kvr_json_writer_t *w)
{
    return end(w, true);
}

int kvr_json_begin_array(kvr_json_writer_t *w)
{
    return begin(w, false);
}

int kvr_json_end_array(kvr_json_writer_t *w)
{
    return end(w, false);
}

/* ------------------------------------------------------------------------------------------ */
/* Strings. */

/* Length (2..4) of the valid UTF-8 sequence at s[0..n) whose lead byte is >= 0x80, or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;  /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;          /* no overlong forms */
        else if (c == 0xed)
            hi = 0x9f;          /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;          /* <= U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

bool kvr_json_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i = kvr_ascii_end(s, i + 1, len);
            continue;
        }
        size_t k = utf8_seq(s + i, len - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

/* Writes s as a JSON string, quotes included (the caller did value_start or the key checks). */
static void put_string(kvr_json_writer_t *w, const char *str, size_t n)
{
    static const char HEX[] = "0123456789abcdef";
    if (n > (SIZE_MAX / 2 - 2) / 6) {
        set_error(w, KVR_ENOMEM);
        return;
    }
    if (!reserve(w, 6 * n + 2))
        return;
    const unsigned char *s = (const unsigned char *)str;
    char *o = w->buf + w->len;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && s[run] >= 0x20 && s[run] < 0x80 && s[run] != '"' && s[run] != '\\')
            run++;
        memcpy(o, s + i, run - i);
        o += run - i;
        i = run;
        if (i == n)
            break;
        unsigned c = s[i];
        if (c >= 0x80) {
            size_t k = utf8_seq(s + i, n - i);
            if (k > 0) {
                memcpy(o, s + i, k);
                o += k;
                i += k;
            } else {
                memcpy(o, "\xef\xbf\xbd", 3);  /* U+FFFD for the offending byte */
                o += 3;
                i++;
            }
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\t': *o++ = 't'; break;
        case '\r': *o++ = 'r'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = HEX[c >> 4];
            *o++ = HEX[c & 15];
            break;
        }
        i++;
    }
    *o++ = '"';
    w->len = (size_t)(o - w->buf);
    w->buf[w->len] = '\0';
}

int kvr_json_key_n(kvr_json_writer_t *w, const char *key, size_t len)
{
    if (w->status != KVR_OK)
        return w->status;
    if (w->depth == 0 || !(w->is_object & bit(w->depth)) || w->after_key ||
        (key == NULL && len > 0))
        return set_error(w, KVR_EINVAL);
    bool comma = (w->has_items & bit(w->depth)) != 0;
    if (!reserve(w, 2))
        return w->status;
    if (comma)
        put(w, ",", 1);
    put_string(w, key, len);
    if (!reserve(w, 1))
        return w->status;
    put(w, ":", 1);
    w->after_key = true;
    return w->status;
}

int kvr_json_key(kvr_json_writer_t *w, const char *key)
{
    return kvr_json_key_n(w, key, key != NULL ? strlen(key) : 0);
}

int kvr_json_string_n(kvr_json_writer_t *w, const char *s, size_t len)
{
    if (s == NULL)
        return kvr_json_null(w);
    if (!value_start(w, 2))
        return w->status;
    put_string(w, s, len);
    if (w->status == KVR_OK)
        value_end(w);
    return w->status;
}

int kvr_json_raw(kvr_json_writer_t *w, const char *json, size_t len)
{
    if (len == 0)
        return set_error(w, KVR_EINVAL);
    if (!value_start(w, len))
        return w->status;
    put(w, json, len);
    value_end(w);
    return w->status;
}

int kvr_json_string(kvr_json_writer_t *w, const char *s)
{
    return kvr_json_string_n(w, s, s != NULL ? strlen(s) : 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Scalars. */

static int put_scalar(kvr_json_writer_t *w, const char *text, size_t n)
{
    if (!value_start(w, n))
        return w->status;
    put(w, text, n);
    value_end(w);
    return KVR_OK;
}

int kvr_json_u64(kvr_json_writer_t *w, uint64_t v)
{
    char buf[24];
    char *p = kvr_dec_u64_back(v, buf + sizeof buf);
    return put_scalar(w, p, (size_t)(buf + sizeof buf - p));
}

int kvr_json_i64(kvr_json_writer_t *w, int64_t v)
{
    char buf[24];
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    char *p = kvr_dec_u64_back(mag, buf + sizeof buf);
    if (v < 0)
        *--p = '-';
    return put_scalar(w, p, (size_t)(buf + sizeof buf - p));
}

/* %.*g with '.' as the decimal point whatever LC_NUMERIC says. */
static int format_g(char *buf, size_t cap, int prec, double v)
{
    int n = snprintf(buf, cap, "%.*g", prec, v);
    for (int i = 0; i < n; i++)
        if (buf[i] == ',')
            buf[i] = '.';
    return n;
}

/* Significant digits in %g output (leading zeros and the exponent excluded). */
static int sig_digits(const char *s)
{
    int n = 0;
    bool leading = true;
    for (; *s != '\0' && *s != 'e'; s++) {
        if (*s < '0' || *s > '9')
            continue;
        if (leading && *s == '0')
            continue;
        leading = false;
        n++;
    }
    return n;
}

static bool reads_back(const char *s, double v)
{
    return strtod(s, NULL) == v;
}

/* The shortest %.Ng (N <= 17) that reads back as v. For normal numbers, if 15 digits read back
 * and fewer are shown, nothing shorter can (the value is within half an ulp of the shown
 * number, well inside its 15-digit rounding interval); at exactly 15 digits, or for
 * subnormals, shorter precisions are tried in turn. */
int kvr_json_double(kvr_json_writer_t *w, double v)
{
    if (!isfinite(v))
        return kvr_json_null(w);
    char buf[40];
    int n = format_g(buf, sizeof buf, 15, v);
    if (reads_back(buf, v)) {
        if (sig_digits(buf) == 15 || (v != 0 && fabs(v) < 2.2250738585072014e-308)) {
            char shorter[40];
            for (int prec = 1; prec < 15; prec++) {
                int m = format_g(shorter, sizeof shorter, prec, v);
                if (reads_back(shorter, v)) {
                    memcpy(buf, shorter, (size_t)m + 1);
                    n = m;
                    break;
                }
            }
        }
    } else {
        n = format_g(buf, sizeof buf, 16, v);
        if (!reads_back(buf, v))
            n = format_g(buf, sizeof buf, 17, v);
    }
    if (n <= 0 || (size_t)n >= sizeof buf)
        return set_error(w, KVR_EINVAL);  /* cannot happen for a finite double */
    return put_scalar(w, buf, (size_t)n);
}

int kvr_json_bool(kvr_json_writer_t *w, bool v)
{
    return v ? put_scalar(w, "true", 4) : put_scalar(w, "false", 5);
}

int kvr_json_null(kvr_json_writer_t *w)
{
    return put_scalar(w, "null", 4);
}

int kvr_json_writer_finish(kvr_json_writer_t *w, const char **data, size_t *len)
{
    if (w->status != KVR_OK)
        return w->status;
    if (!w->top_done || w->depth != 0)
        return set_error(w, KVR_EINVAL);
    if (data != NULL)
        *data = w->buf;
    if (len != NULL)
        *len = w->len;
    return KVR_OK;
}

int kvr_json_error(kvr_json_writer_t *w, const char *message, const char *type, int code)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "error");
    kvr_json_begin_object(w);
    kvr_json_key(w, "message");
    kvr_json_string(w, message);
    kvr_json_key(w, "type");
    kvr_json_string(w, type);
    kvr_json_key(w, "code");
    kvr_json_i64(w, code);
    kvr_json_end_object(w);
    return kvr_json_end_object(w);
}

/*
 * jinja_json.c: the request's JSON (messages, tools, chat_template_kwargs) read into template
 * values, as yajl reads it: objects keep member order (a repeated key keeps its first place
 * and its last value), integers (no '.', 'e', 'E') are ints of at most 63 bits, other numbers
 * floats (strtod), strings valid UTF-8 (RFC 3629) or the read fails.
 *
 * Two readers give one reading. A one-pass reader takes what the router sends (the writer's
 * JSON: no comments, plain escapes): strings are found eight bytes a step and copied into the
 * arena once (yajl's tree, then a copy, cost a chat's render about half its time). Anything it
 * does not take exactly as yajl would (comments, \v or \f as whitespace, a \u escape of NUL
 * or of a surrogate, a number beyond its range, invalid UTF-8 or JSON, nesting past 128) rolls
 * the arena back and goes to yajl's tree (the only path before), which decides, errors
 * included.
 * Invariants: on success *out lives in the arena; on any refusal the arena is as it was.
 * Ownership: values in the caller's arena; the reader's stack of open containers is its own
 * (on the C stack, or malloc'd past 256 values, freed before it returns). Threads: none
 * (one render's arena). Cost: one pass over the text, one arena copy of each string.
 */
#include "tokenizer/jinja.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_tree.h>

#include "kvrouter/status.h"
#include "tokenizer/tok_impl.h"
#include "wire/json_decode.h"

#define MAX_DEPTH 128 /* from_tree's bound */

/* --- the one-pass reader --------------------------------------------------------------- */
struct jr {
    struct jarena *a;
    const unsigned char *p, *e;
    struct jv *stk; /* the values of the open lists, and keys and values of the open dicts */
    size_t n, cap;
    struct jv small[256];
};

/* false: not taken (the caller rolls back and asks yajl) */
static bool jr_value(struct jr *r, int depth, struct jv *out);

static void jr_ws(struct jr *r)
{
    while (r->p < r->e && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static bool jr_push(struct jr *r, struct jv v)
{
    if (r->n == r->cap) {
        size_t cap = r->cap * 2;
        struct jv *s =
            r->stk == r->small ? malloc(cap * sizeof *s) : realloc(r->stk, cap * sizeof *s);
        if (s == NULL)
            return false;
        if (r->stk == r->small)
            memcpy(s, r->small, r->n * sizeof *s);
        r->stk = s;
        r->cap = cap;
    }
    r->stk[r->n++] = v;
    return true;
}

/* The offset of the first '"', '\\' or control byte of p[0..n), or n: eight bytes a step (the
 * lowest flagged byte of each test is exact, so is the lowest of their union). */
static size_t plain_run(const unsigned char *p, size_t n)
{
    size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        uint64_t hit = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w);
        hit &= high;
        if (hit != 0)
            return i + ((size_t)__builtin_ctzll(hit) >> 3);
    }
#endif
    while (i < n && p[i] != '"' && p[i] != '\\' && p[i] >= 0x20)
        i++;
    return i;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The escape at p[0..n) (p[0] is '\\'): its length in the text (2 or 6), its bytes in out (1
 * to 3) and their number in *k; 0 when not taken (yajl's error, or its reading of \u0000 and
 * surrogates, is yajl's to give). */
static size_t jr_escape(const unsigned char *p, size_t n, char out[4], size_t *k)
{
    if (n < 2)
        return 0;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *f = memchr(from, p[1], sizeof from - 1);
    if (f != NULL && p[1] != 0) {
        out[0] = to[f - from];
        *k = 1;
        return 2;
    }
    if (p[1] != 'u' || n < 6)
        return 0;
    uint32_t cp = 0;
    for (int i = 2; i < 6; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return 0;
        cp = cp << 4 | (uint32_t)h;
    }
    if (cp == 0 || (cp & 0xF800) == 0xD800)
        return 0;
    if (cp < 0x80) {
        out[0] = (char)cp;
        *k = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        *k = 2;
    } else {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        *k = 3;
    }
    return 6;
}

/* A string at r->p ('"'): its bytes, once, in the arena. */
static bool jr_string(struct jr *r, struct jv *out)
{
    const unsigned char *s = r->p + 1, *e = r->e;
    size_t len = 0, i = 0, n = (size_t)(e - s);
    bool escaped = false;
    for (;;) { /* the end, and the decoded length */
        size_t run = plain_run(s + i, n - i);
        i += run;
        len += run;
        if (i >= n || s[i] < 0x20)
            return false;
        if (s[i] == '"')
            break;
        char b[4];
        size_t k, adv = jr_escape(s + i, n - i, b, &k);
        if (adv == 0)
            return false;
        escaped = true;
        i += adv;
        len += k;
    }
    if (kvr_tok_utf8_valid(s, i) != i) /* raw bytes; escapes decode to valid UTF-8 */
        return false;
    char *d = ja_alloc(r->a, len + 1);
    if (d == NULL)
        return false;
    if (!escaped) {
        memcpy(d, s, len);
    } else {
        size_t o = 0;
        for (size_t j = 0; j < i;) {
            size_t run = plain_run(s + j, i - j);
            memcpy(d + o, s + j, run);
            o += run;
            j += run;
            if (j < i) {
                size_t k;
                j += jr_escape(s + j, i - j, d + o, &k);
                o += k;
            }
        }
    }
    d[len] = 0;
    *out = jv_str(d, len);
    r->p = s + i + 1;
    return true;
}

/* A number at r->p: an int of at most 63 bits (its magnitude), or a float strtod reads whole. */
static bool jr_number(struct jr *r, struct jv *out)
{
    const unsigned char *p = r->p, *e = r->e, *q = p;
    bool neg = q < e && *q == '-', frac = false;
    q += neg;
    if (q >= e || *q < '0' || *q > '9' || (*q == '0' && q + 1 < e && q[1] >= '0' && q[1] <= '9'))
        return false;
    uint64_t mag = 0;
    bool big = false;
    for (; q < e && *q >= '0' && *q <= '9'; q++) {
        big = big || mag > (uint64_t)INT64_MAX / 10 ||
              mag * 10 + (uint64_t)(*q - '0') > (uint64_t)INT64_MAX;
        mag = mag * 10 + (uint64_t)(*q - '0');
    }
    if (q < e && *q == '.') {
        frac = true;
        if (++q >= e || *q < '0' || *q > '9')
            return false;
        while (q < e && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        frac = true;
        q++;
        if (q < e && (*q == '+' || *q == '-'))
            q++;
        if (q >= e || *q < '0' || *q > '9')
            return false;
        while (q < e && *q >= '0' && *q <= '9')
            q++;
    }
    if (!frac) {
        if (big)
            return false;
        *out = jv_int(neg ? -(int64_t)mag : (int64_t)mag);
    } else {
        char buf[64], *end;
        size_t n = (size_t)(q - p);
        if (n >= sizeof buf)
            return false;
        memcpy(buf, p, n);
        buf[n] = 0;
        errno = 0;
        double d = strtod(buf, &end);
        if (errno != 0 || end != buf + n)
            return false;
        *out = jv_float(d);
    }
    r->p = q;
    return true;
}

static bool jr_word(struct jr *r, const char *w, size_t n, struct jv v, struct jv *out)
{
    if ((size_t)(r->e - r->p) < n || memcmp(r->p, w, n) != 0)
        return false;
    r->p += n;
    *out = v;
    return true;
}

/* A list or a dict at r->p ('[' or '{'): its members on the stack, then into the arena. */
static bool jr_container(struct jr *r, int depth, bool dict, struct jv *out)
{
    size_t base = r->n;
    char close = dict ? '}' : ']';
    r->p++;
    jr_ws(r);
    if (r->p < r->e && *r->p == (unsigned char)close) {
        r->p++;
    } else {
        for (;;) {
            struct jv k, v;
            if (dict) {
                if (r->p >= r->e || *r->p != '"' || !jr_string(r, &k))
                    return false;
                jr_ws(r);
                if (r->p >= r->e || *r->p != ':')
                    return false;
                r->p++;
                jr_ws(r);
            }
            if (!jr_value(r, depth + 1, &v) || (dict && !jr_push(r, k)) || !jr_push(r, v))
                return false;
            jr_ws(r);
            if (r->p < r->e && *r->p == ',') {
                r->p++;
                jr_ws(r);
                continue;
            }
            if (r->p < r->e && *r->p == (unsigned char)close) {
                r->p++;
                break;
            }
            return false;
        }
    }
    size_t n = r->n - base;
    if (dict) {
        struct jdict *d = jd_new(r->a, n / 2);
        if (d == NULL)
            return false;
        for (size_t i = base; i < r->n; i += 2)
            if (jd_set(r->a, d, r->stk[i], r->stk[i + 1]) != KVR_OK)
                return false;
        *out = (struct jv){.kind = JV_DICT, .u.d = d};
    } else {
        struct jlist *l = jl_new(r->a, n);
        if (l == NULL)
            return false;
        if (n)
            memcpy(l->a, r->stk + base, n * sizeof *l->a);
        l->n = n;
        *out = (struct jv){.kind = JV_LIST, .u.l = l};
    }
    r->n = base;
    return true;
}

static bool jr_value(struct jr *r, int depth, struct jv *out)
{
    if (depth > MAX_DEPTH || r->p >= r->e)
        return false;
    switch (*r->p) {
    case '"':
        return jr_string(r, out);
    case '[':
        return jr_container(r, depth, false, out);
    case '{':
        return jr_container(r, depth, true, out);
    case 't':
        return jr_word(r, "true", 4, jv_bool(true), out);
    case 'f':
        return jr_word(r, "false", 5, jv_bool(false), out);
    case 'n':
        return jr_word(r, "null", 4, jv_none(), out);
    default:
        return jr_number(r, out);
    }
}

int jv_from_json_text(struct jarena *a, const char *json, size_t len, struct jv *out)
{
    struct jr r = {.a = a,
                   .p = (const unsigned char *)json,
                   .e = (const unsigned char *)json + len,
                   .cap = 256};
    r.stk = r.small;
    struct jmark m;
    ja_mark(a, &m);
    jr_ws(&r);
    bool ok = jr_value(&r, 0, out);
    jr_ws(&r);
    ok = ok && r.p == r.e;
    if (r.stk != r.small)
        free(r.stk);
    if (!ok)
        ja_rollback(a, &m);
    return ok ? KVR_OK : KVR_EPARSE;
}

/* --- yajl's reading -------------------------------------------------------------------- */
static int from_tree(struct jarena *a, yajl_val t, struct jv *out, int depth, char *err,
                     size_t errlen)
{
    if (depth > 128) {
        snprintf(err, errlen, "JSON nested too deep");
        return KVR_ETOOBIG;
    }
    if (!t || YAJL_IS_NULL(t)) {
        *out = jv_none();
    } else if (YAJL_IS_TRUE(t)) {
        *out = jv_bool(true);
    } else if (YAJL_IS_FALSE(t)) {
        *out = jv_bool(false);
    } else if (YAJL_IS_STRING(t)) {
        size_t n = strlen(t->u.string);
        if (!kvr_jd_utf8_ok((const unsigned char *)t->u.string, n)) {
            snprintf(err, errlen, "JSON string is not valid UTF-8");
            return KVR_EPARSE;
        }
        char *s = ja_strdup(a, t->u.string, n);
        if (!s)
            return KVR_ETOOBIG;
        *out = jv_str(s, n);
    } else if (YAJL_IS_NUMBER(t)) {
        const char *r = t->u.number.r;
        if (strpbrk(r, ".eE")) {
            if (!(t->u.number.flags & YAJL_NUMBER_DOUBLE_VALID)) {
                snprintf(err, errlen, "number %s out of range", r);
                return KVR_ERANGE;
            }
            *out = jv_float(t->u.number.d);
        } else {
            if (!(t->u.number.flags & YAJL_NUMBER_INT_VALID)) {
                snprintf(err, errlen, "integer %s out of range", r);
                return KVR_ERANGE;
            }
            *out = jv_int(t->u.number.i);
        }
    } else if (YAJL_IS_ARRAY(t)) {
        struct jlist *l = jl_new(a, t->u.array.len);
        if (!l)
            return KVR_ETOOBIG;
        for (size_t i = 0; i < t->u.array.len; i++) {
            int rc = from_tree(a, t->u.array.values[i], &l->a[i], depth + 1, err, errlen);
            if (rc)
                return rc;
        }
        l->n = t->u.array.len;
        *out = (struct jv){.kind = JV_LIST, .u.l = l};
    } else if (YAJL_IS_OBJECT(t)) {
        struct jdict *d = jd_new(a, t->u.object.len);
        if (!d)
            return KVR_ETOOBIG;
        for (size_t i = 0; i < t->u.object.len; i++) {
            struct jv k, v;
            size_t n = strlen(t->u.object.keys[i]);
            if (!kvr_jd_utf8_ok((const unsigned char *)t->u.object.keys[i], n)) {
                snprintf(err, errlen, "JSON key is not valid UTF-8");
                return KVR_EPARSE;
            }
            char *s = ja_strdup(a, t->u.object.keys[i], n);
            if (!s)
                return KVR_ETOOBIG;
            k = jv_str(s, n);
            int rc = from_tree(a, t->u.object.values[i], &v, depth + 1, err, errlen);
            if (rc)
                return rc;
            if (jd_set(a, d, k, v) != KVR_OK)
                return KVR_ETOOBIG;
        }
        *out = (struct jv){.kind = JV_DICT, .u.d = d};
    } else {
        snprintf(err, errlen, "unexpected JSON value");
        return KVR_EPARSE;
    }
    return KVR_OK;
}

int jv_from_json_yajl(struct jarena *a, const char *json, size_t len, struct jv *out, char *err,
                      size_t errlen)
{
    char *z = malloc(len + 1);
    if (!z)
        return KVR_ENOMEM;
    memcpy(z, json, len);
    z[len] = 0;
    if (strlen(z) != len) {
        free(z);
        snprintf(err, errlen, "JSON holds a NUL byte");
        return KVR_EPARSE;
    }
    char ebuf[256] = "";
    yajl_val t = yajl_tree_parse(z, ebuf, sizeof ebuf);
    free(z);
    if (!t) {
        snprintf(err, errlen, "JSON: %.*s", (int)strcspn(ebuf, "\n"), ebuf);
        return KVR_EPARSE;
    }
    int rc = from_tree(a, t, out, 0, err, errlen);
    yajl_tree_free(t);
    return rc;
}

int jv_from_json(struct jarena *a, const char *json, size_t len, struct jv *out, char *err,
                 size_t errlen)
{
    if (jv_from_json_text(a, json, len, out) == KVR_OK)
        return KVR_OK;
    return jv_from_json_yajl(a, json, len, out, err, errlen);
}

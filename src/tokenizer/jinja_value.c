/*
 * jinja_value.c: the template interpreter's value model (none, bool, int, float, string, list,
 * dict, namespace) with Python's semantics where a chat template can see them: truthiness,
 * ==, ordering, str() and repr(), float repr, json.dumps as transformers' tojson calls it, and
 * values built from JSON (the request's messages and tools) in member order.
 *
 * Invariants: values live in a jarena and are immutable (a namespace's dict aside); a jarena
 * never holds more than its cap. A jbuf never holds more than its max (err set instead).
 * Ownership: the arena owns every value; jbuf's bytes are malloc'd, the caller frees them.
 * Threads: none (an arena and a buffer belong to one render). Cost: O(size) for each
 * conversion; dict lookup is linear (chat dicts have a handful of keys).
 */
#define _GNU_SOURCE /* memmem */
#include "tokenizer/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "kvrouter/status.h"

const char *jinja_find(const char *p, size_t n, const char *q, size_t m)
{
    return m <= n ? memmem(p, n, q, m) : NULL;
}

/* --- arena ----------------------------------------------------------------------------- */
struct jchunk {
    struct jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char mem[];
};

void ja_init(struct jarena *a, size_t cap) { *a = (struct jarena){.cap = cap}; }

void ja_free(struct jarena *a)
{
    struct jchunk *c = a->head;
    while (c) {
        struct jchunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

void *ja_alloc(struct jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = c ? c->size * 2 : 4096;
        if (sz > (size_t)1 << 24)
            sz = (size_t)1 << 24;
        if (sz < n)
            sz = n;
        if (a->total + sz > a->cap || sz > SIZE_MAX - sizeof *c)
            return NULL;
        struct jchunk *nc = malloc(sizeof *nc + sz);
        if (!nc)
            return NULL;
        nc->size = sz;
        nc->used = 0;
        nc->next = c;
        a->head = c = nc;
        a->total += sz;
    }
    void *p = c->mem + c->used;
    c->used += n;
    return p;
}

void ja_mark(const struct jarena *a, struct jmark *m)
{
    *m = (struct jmark){a->head, a->head ? a->head->used : 0, a->total};
}

void ja_rollback(struct jarena *a, const struct jmark *m)
{
    while (a->head != m->head) {
        struct jchunk *c = a->head;
        a->head = c->next;
        free(c);
    }
    if (a->head)
        a->head->used = m->used;
    a->total = m->total;
}

char *ja_strdup(struct jarena *a, const char *p, size_t n)
{
    char *s = ja_alloc(a, n + 1);
    if (!s)
        return NULL;
    if (n)
        memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* --- buffers --------------------------------------------------------------------------- */
void jb_put(struct jbuf *b, const char *p, size_t n)
{
    if (b->err || n == 0)
        return;
    if (b->n + n > b->max || b->n + n < b->n) {
        b->err = KVR_ETOOBIG;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        void *buf = b->p;
        if (kvr_grow(&buf, &b->cap, b->n + n + 1, b->max + 1, 1) != KVR_OK) {
            b->err = KVR_ENOMEM;
            return;
        }
        b->p = buf;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jb_putc(struct jbuf *b, char c) { jb_put(b, &c, 1); }

/* --- lists and dicts ------------------------------------------------------------------- */
struct jlist *jl_new(struct jarena *a, size_t cap)
{
    struct jlist *l = ja_alloc(a, sizeof *l);
    if (!l)
        return NULL;
    *l = (struct jlist){0};
    if (cap) {
        l->a = ja_alloc(a, cap * sizeof *l->a);
        if (!l->a)
            return NULL;
        l->cap = cap;
    }
    return l;
}

int jl_push(struct jarena *a, struct jlist *l, struct jv v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        struct jv *na = ja_alloc(a, nc * sizeof *na);
        if (!na)
            return KVR_ETOOBIG;
        if (l->n)
            memcpy(na, l->a, l->n * sizeof *na);
        l->a = na;
        l->cap = nc;
    }
    l->a[l->n++] = v;
    return KVR_OK;
}

struct jdict *jd_new(struct jarena *a, size_t cap)
{
    struct jdict *d = ja_alloc(a, sizeof *d);
    if (!d)
        return NULL;
    *d = (struct jdict){0};
    if (cap) {
        d->k = ja_alloc(a, cap * sizeof *d->k);
        d->v = ja_alloc(a, cap * sizeof *d->v);
        if (!d->k || !d->v)
            return NULL;
        d->cap = cap;
    }
    return d;
}

int jd_set(struct jarena *a, struct jdict *d, struct jv k, struct jv v)
{
    for (size_t i = 0; i < d->n; i++) {
        if (jv_eq(d->k[i], k)) {
            d->v[i] = v;
            return KVR_OK;
        }
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        struct jv *nk = ja_alloc(a, nc * sizeof *nk), *nv = ja_alloc(a, nc * sizeof *nv);
        if (!nk || !nv)
            return KVR_ETOOBIG;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return KVR_OK;
}

const struct jv *jd_get(const struct jdict *d, struct jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k))
            return &d->v[i];
    return NULL;
}

const struct jv *jd_gets(const struct jdict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JV_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, k, n) == 0)
            return &d->v[i];
    return NULL;
}

/* --- Python semantics ------------------------------------------------------------------ */
bool jv_truthy(struct jv v)
{
    switch (v.kind) {
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0;
    case JV_STR:
        return v.u.s.n != 0;
    case JV_LIST:
        return v.u.l->kind == JL_GEN || v.u.l->n != 0;
    case JV_DICT:
        return v.u.d->n != 0;
    case JV_NS:
    case JV_FUNC:
    case JV_LOOP:
    case JV_MACRO:
        return true;
    default:
        return false;
    }
}

static bool is_num(struct jv v)
{
    return v.kind == JV_BOOL || v.kind == JV_INT || v.kind == JV_FLOAT;
}
static double num_f(struct jv v)
{
    return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t num_i(struct jv v) { return v.kind == JV_INT ? v.u.i : (int64_t)v.u.b; }

bool jv_eq(struct jv a, struct jv b)
{
    if (is_num(a) && is_num(b)) {
        if (a.kind == JV_FLOAT || b.kind == JV_FLOAT)
            return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.kind != b.kind)
        return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l->kind != b.u.l->kind)
            return false;
        if (a.u.l->kind == JL_GEN)
            return a.u.l == b.u.l;
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_eq(a.u.l->a[i], b.u.l->a[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const struct jv *o = jd_get(b.u.d, a.u.d->k[i]);
            if (!o || !jv_eq(a.u.d->v[i], *o))
                return false;
        }
        return true;
    case JV_NS:
        return a.u.d == b.u.d;
    case JV_FUNC:
        return a.u.fn == b.u.fn;
    case JV_LOOP:
        return a.u.loop == b.u.loop;
    case JV_MACRO:
        return a.u.macro == b.u.macro;
    default:
        return false;
    }
}

bool jv_same(struct jv a, struct jv b)
{
    if (a.kind != b.kind)
        return false;
    switch (a.kind) {
    case JV_BOOL:
        return a.u.b == b.u.b;
    case JV_INT:
        return a.u.i == b.u.i;
    case JV_FLOAT:
        return memcmp(&a.u.f, &b.u.f, sizeof a.u.f) == 0;
    case JV_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_same(a.u.l->a[i], b.u.l->a[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++)
            if (!jv_same(a.u.d->k[i], b.u.d->k[i]) || !jv_same(a.u.d->v[i], b.u.d->v[i]))
                return false;
        return true;
    case JV_NONE:
    case JV_UNDEF:
        return true;
    default:
        return false;
    }
}

int jv_cmp(struct jv a, struct jv b, int *out)
{
    if (is_num(a) && is_num(b)) {
        if (a.kind == JV_FLOAT || b.kind == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            *out = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = num_i(a), y = num_i(b);
            *out = x < y ? -1 : x > y ? 1 : 0;
        }
        return KVR_OK;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0; /* UTF-8 byte order is code point order */
        *out = c ? (c < 0 ? -1 : 1) : a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n ? 1 : 0;
        return KVR_OK;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE)) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a.u.l->a[i], b.u.l->a[i]))
                continue;
            return jv_cmp(a.u.l->a[i], b.u.l->a[i], out);
        }
        *out = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
        return KVR_OK;
    }
    return KVR_EINVAL;
}

size_t utf8_count(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80)
            c++;
    return c;
}

const char *jv_type_name(struct jv v)
{
    if (v.kind == JV_LIST && v.u.l->kind != JL_LIST) {
        static const char *kinds[] = {"list", "tuple", "generator", "dict_items", "range"};
        return kinds[v.u.l->kind];
    }
    static const char *names[] = {"Undefined", "NoneType", "bool",        "int",
                                  "float",     "str",      "list",        "dict",
                                  "Namespace", "function", "LoopContext", "Macro"};
    return v.kind < sizeof names / sizeof names[0] ? names[v.kind] : "?";
}

/* Python's float repr: the shortest digits that round-trip, fixed notation for exponents in
 * [-4, 16), else d.ddde+XX. */
void jv_float_repr(double f, char out[40])
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char *o = out;
    if (neg)
        *o++ = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp - 1; i++)
                *o++ = '0';
            for (size_t i = 0; i < nd; i++)
                *o++ = digits[i];
        } else {
            for (int i = 0; i <= exp; i++)
                *o++ = (size_t)i < nd ? digits[i] : '0';
            *o++ = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    *o++ = digits[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (size_t i = 1; i < nd; i++)
                *o++ = digits[i];
        }
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        strcpy(o, ex);
    }
}

static void repr_str(struct jbuf *b, const char *p, size_t n)
{
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = (sq && !dq) ? '"' : '\'';
    jb_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char esc[8];
        if (c == '\\' || c == (unsigned char)q) {
            jb_putc(b, '\\');
            jb_putc(b, (char)c);
        } else if (c == '\n') {
            jb_put(b, "\\n", 2);
        } else if (c == '\r') {
            jb_put(b, "\\r", 2);
        } else if (c == '\t') {
            jb_put(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            jb_puts(b, esc);
        } else if (c == 0xC2 && i + 1 < n && (unsigned char)p[i + 1] >= 0x80 &&
                   (unsigned char)p[i + 1] <= 0xA0) {
            /* C1 controls and NBSP are not printable: \x80..\xa0 */
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)p[i + 1]);
            jb_puts(b, esc);
            i++;
        } else {
            jb_putc(b, (char)c);
        }
    }
    jb_putc(b, q);
}

/* The containers being printed, outermost first: one met again is a cycle (a namespace set
 * into itself), printed as Python's repr prints it, "{...}" or "[...]"; nesting past
 * REPR_DEPTH is refused. */
#define REPR_DEPTH 200
struct repr_path {
    const void *c[REPR_DEPTH];
    int n;
};

static bool repr_enter(struct jbuf *b, struct repr_path *path, const void *c, const char *again)
{
    for (int i = 0; i < path->n; i++)
        if (path->c[i] == c) {
            jb_puts(b, again);
            return false;
        }
    if (path->n == REPR_DEPTH) {
        if (!b->err)
            b->err = KVR_ETOOBIG;
        return false;
    }
    path->c[path->n++] = c;
    return true;
}

static void str_or_repr_in(struct jbuf *b, struct jv v, bool repr, struct repr_path *path)
{
    char num[40];
    switch (v.kind) {
    case JV_UNDEF:
        break;
    case JV_NONE:
        jb_put(b, "None", 4);
        break;
    case JV_BOOL:
        jb_puts(b, v.u.b ? "True" : "False");
        break;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jb_puts(b, num);
        break;
    case JV_FLOAT:
        jv_float_repr(v.u.f, num);
        jb_puts(b, num);
        break;
    case JV_STR:
        if (repr)
            repr_str(b, v.u.s.p, v.u.s.n);
        else
            jb_put(b, v.u.s.p, v.u.s.n);
        break;
    case JV_LIST:
        if (v.u.l->kind != JL_LIST && v.u.l->kind != JL_TUPLE) {
            if (!b->err)
                b->err = KVR_EINVAL; /* Python prints an address or a view's type: refused */
            break;
        }
        if (!repr_enter(b, path, v.u.l, v.u.l->kind == JL_TUPLE ? "(...)" : "[...]"))
            break;
        jb_putc(b, v.u.l->kind == JL_TUPLE ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jb_put(b, ", ", 2);
            str_or_repr_in(b, v.u.l->a[i], true, path);
        }
        if (v.u.l->kind == JL_TUPLE && v.u.l->n == 1)
            jb_putc(b, ',');
        jb_putc(b, v.u.l->kind == JL_TUPLE ? ')' : ']');
        path->n--;
        break;
    case JV_DICT:
    case JV_NS:
        if (v.kind == JV_NS)
            jb_puts(b, "<Namespace ");
        if (repr_enter(b, path, v.u.d, "{...}")) {
            jb_putc(b, '{');
            for (size_t i = 0; i < v.u.d->n; i++) {
                if (i)
                    jb_put(b, ", ", 2);
                str_or_repr_in(b, v.u.d->k[i], true, path);
                jb_put(b, ": ", 2);
                str_or_repr_in(b, v.u.d->v[i], true, path);
            }
            jb_putc(b, '}');
            path->n--;
        }
        if (v.kind == JV_NS)
            jb_putc(b, '>');
        break;
    default:
        jb_puts(b, "<object>");
        break;
    }
}

static void str_or_repr(struct jbuf *b, struct jv v, bool repr)
{
    struct repr_path path;
    path.n = 0;
    str_or_repr_in(b, v, repr, &path);
}

void jv_str_to(struct jbuf *b, struct jv v) { str_or_repr(b, v, false); }
void jv_repr_to(struct jbuf *b, struct jv v)
{
    if (v.kind == JV_UNDEF)
        jb_puts(b, "Undefined");
    else
        str_or_repr(b, v, true);
}

/* --- JSON out -------------------------------------------------------------------------- */
static void json_str(struct jbuf *b, const char *p, size_t n, bool ascii)
{
    jb_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char esc[16];
        switch (c) {
        case '"':
            jb_put(b, "\\\"", 2);
            continue;
        case '\\':
            jb_put(b, "\\\\", 2);
            continue;
        case '\n':
            jb_put(b, "\\n", 2);
            continue;
        case '\r':
            jb_put(b, "\\r", 2);
            continue;
        case '\t':
            jb_put(b, "\\t", 2);
            continue;
        case '\b':
            jb_put(b, "\\b", 2);
            continue;
        case '\f':
            jb_put(b, "\\f", 2);
            continue;
        default:
            break;
        }
        if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            jb_puts(b, esc);
        } else if (c >= 0x80 && ascii) {
            uint32_t cp;
            size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (i + len > n) {
                len = n - i;
            }
            cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
            for (size_t k = 1; k < len; k++)
                cp = (cp << 6) | ((unsigned char)p[i + k] & 0x3F);
            i += len - 1;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                         0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            jb_puts(b, esc);
        } else {
            jb_putc(b, (char)c);
        }
    }
    jb_putc(b, '"');
}

static void newline_indent(struct jbuf *b, const char *ind, size_t ilen, int level)
{
    jb_putc(b, '\n');
    for (int i = 0; i < level; i++)
        jb_put(b, ind, ilen);
}

struct jsonopt {
    bool ascii, has_indent, sort;
    const char *ind, *isep, *ksep;
    size_t ilen;
    char *err;
    size_t errlen;
};

static int json_key(struct jbuf *b, struct jv k, const struct jsonopt *o)
{
    char num[48]; /* a float repr (40) quoted */
    switch (k.kind) {
    case JV_STR:
        json_str(b, k.u.s.p, k.u.s.n, o->ascii);
        return KVR_OK;
    case JV_INT:
        snprintf(num, sizeof num, "\"%lld\"", (long long)k.u.i);
        break;
    case JV_BOOL:
        snprintf(num, sizeof num, "\"%s\"", k.u.b ? "true" : "false");
        break;
    case JV_NONE:
        snprintf(num, sizeof num, "\"null\"");
        break;
    case JV_FLOAT: {
        char f[40];
        jv_float_repr(k.u.f, f);
        snprintf(num, sizeof num, "\"%s\"", f);
        break;
    }
    default:
        snprintf(o->err, o->errlen, "keys must be str, int, float, bool or None, not %s",
                 jv_type_name(k));
        return KVR_EINVAL;
    }
    jb_puts(b, num);
    return KVR_OK;
}

static int json_val(struct jbuf *b, struct jv v, const struct jsonopt *o, int level)
{
    char num[40];
    if (level > 256) {
        snprintf(o->err, o->errlen, "tojson: nesting too deep");
        return KVR_ETOOBIG;
    }
    switch (v.kind) {
    case JV_NONE:
        jb_put(b, "null", 4);
        return KVR_OK;
    case JV_BOOL:
        jb_puts(b, v.u.b ? "true" : "false");
        return KVR_OK;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jb_puts(b, num);
        return KVR_OK;
    case JV_FLOAT:
        if (isnan(v.u.f))
            jb_puts(b, "NaN");
        else if (isinf(v.u.f))
            jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jv_float_repr(v.u.f, num);
            jb_puts(b, num);
        }
        return KVR_OK;
    case JV_STR:
        json_str(b, v.u.s.p, v.u.s.n, o->ascii);
        return KVR_OK;
    case JV_LIST: {
        const struct jlist *l = v.u.l;
        if (l->kind != JL_LIST && l->kind != JL_TUPLE) {
            snprintf(o->err, o->errlen, "Object of type %s is not JSON serializable",
                     l->kind == JL_GEN    ? "generator"
                     : l->kind == JL_VIEW ? "dict_items"
                                          : "range");
            return KVR_EINVAL;
        }
        if (l->n == 0) {
            jb_put(b, "[]", 2);
            return KVR_OK;
        }
        jb_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_puts(b, o->isep);
            if (o->has_indent)
                newline_indent(b, o->ind, o->ilen, level + 1);
            int rc = json_val(b, l->a[i], o, level + 1);
            if (rc)
                return rc;
        }
        if (o->has_indent)
            newline_indent(b, o->ind, o->ilen, level);
        jb_putc(b, ']');
        return KVR_OK;
    }
    case JV_DICT: {
        const struct jdict *d = v.u.d;
        if (d->n == 0) {
            jb_put(b, "{}", 2);
            return KVR_OK;
        }
        size_t order_small[64], *order = order_small;
        if (d->n > 64) {
            order = malloc(d->n * sizeof *order);
            if (!order)
                return KVR_ENOMEM;
        }
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort) { /* insertion sort, stable, by key (str keys only, like Python) */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int c = 0;
                    if (jv_cmp(d->k[order[j - 1]], d->k[x], &c) != KVR_OK) {
                        snprintf(o->err, o->errlen, "tojson: keys of mixed types not sortable");
                        if (order != order_small)
                            free(order);
                        return KVR_EINVAL;
                    }
                    if (c <= 0)
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        jb_putc(b, '{');
        int rc = KVR_OK;
        for (size_t i = 0; i < d->n && !rc; i++) {
            if (i)
                jb_puts(b, o->isep);
            if (o->has_indent)
                newline_indent(b, o->ind, o->ilen, level + 1);
            rc = json_key(b, d->k[order[i]], o);
            if (!rc) {
                jb_puts(b, o->ksep);
                rc = json_val(b, d->v[order[i]], o, level + 1);
            }
        }
        if (order != order_small)
            free(order);
        if (rc)
            return rc;
        if (o->has_indent)
            newline_indent(b, o->ind, o->ilen, level);
        jb_putc(b, '}');
        return KVR_OK;
    }
    default:
        snprintf(o->err, o->errlen, "Object of type %s is not JSON serializable", jv_type_name(v));
        return KVR_EINVAL;
    }
}

int jv_tojson(struct jbuf *b, struct jv v, bool ensure_ascii, const char *indent, size_t ilen,
              bool has_indent, const char *item_sep, const char *key_sep, bool sort_keys, int depth,
              char *err, size_t errlen)
{
    struct jsonopt o = {.ascii = ensure_ascii,
                        .has_indent = has_indent,
                        .sort = sort_keys,
                        .ind = indent ? indent : "",
                        .ilen = indent ? ilen : 0,
                        .isep = item_sep ? item_sep : (has_indent ? "," : ", "),
                        .ksep = key_sep ? key_sep : ": ",
                        .err = err,
                        .errlen = errlen};
    return json_val(b, v, &o, depth);
}

/*
 * jinja_eval.c: renders a parsed template (jinja_parse.c) the way Jinja 3.1's
 * ImmutableSandboxedEnvironment does with transformers' settings: default Undefined (prints
 * as '', iterates as empty, is falsy; attribute access, arithmetic and ordering on it raise),
 * Python semantics for values (jinja_value.c), scoping as Jinja's (a loop iteration is a scope
 * of its own, `set` in it does not leak; `if` is no scope; namespace attributes are the way
 * out), loop.index/index0/first/last/length/revindex/revindex0/previtem/nextitem, break and
 * continue, the filters, tests, str/dict methods and globals jinja.h lists. Where Python's
 * behaviour would need Unicode case tables (upper/lower/title of non-ASCII text) or integers
 * beyond 64 bits, the render fails with an error instead of producing different text.
 *
 * Invariants: nothing the template does can exceed the bounds of jrender_opts: output bytes,
 * arena bytes, evaluation steps (loops included) and recursion depth; each is an error
 * (KVR_ETOOBIG), not a truncation. Ownership: values in the caller's render arena; the output
 * is malloc'd for the caller. Threads: none; the AST is only read, so renders of one template
 * may run in parallel. Cost: O(steps), each step O(size of the values it touches).
 */
#include "tokenizer/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/grow.h"
#include "kvrouter/status.h"

#define MAX_VARS 65536

struct ev {
    struct jarena *a;
    const struct jrender_opts *o;
    struct jbuf out;
    struct jvar *vars; /* malloc'd, grown by kvr_grow up to MAX_VARS */
    size_t nvars, cap, frame;
    size_t vis_lo; /* in a macro: its variables start here; below, only [0, top_end) shows */
    size_t top_end;
        /* the template's top-level variables are [0, top_end) */ /* frame: first variable of the
                                                                     innermost scope */
    uint64_t steps;
    int depth;
    int ctl; /* 1: break, 2: continue */
    char *err;
    size_t errlen;
};

static int fail(struct ev *e, const struct jnode *n, int rc, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(e->err, e->errlen, "template line %d: %s", n ? n->line : 0, msg);
    return rc;
}
static int oom(struct ev *e, const struct jnode *n)
{
    return fail(e, n, KVR_ETOOBIG, "render needs more than %zu bytes of memory", e->o->max_memory);
}

/* A jbuf's bytes as a string value in the arena; the jbuf is freed either way. */
static int buf_to_str(struct ev *e, const struct jnode *n, struct jbuf *b, struct jv *out)
{
    if (b->err) {
        int rc = b->err;
        free(b->p);
        if (rc == KVR_EINVAL)
            return fail(e, n, rc,
                        "printing a generator, a dict view or a range is not "
                        "supported (Python shows its address or type)");
        return fail(e, n, KVR_ETOOBIG, "string longer than %zu bytes", e->o->max_output);
    }
    char *s = ja_strdup(e->a, b->p ? b->p : "", b->n);
    size_t len = b->n;
    free(b->p);
    if (!s)
        return oom(e, n);
    *out = jv_str(s, len);
    return KVR_OK;
}

/* Python's str(v) as a string value (in the arena when formatted). */
static int to_str(struct ev *e, const struct jnode *n, struct jv v, struct jv *out)
{
    if (v.kind == JV_STR) {
        *out = v;
        return KVR_OK;
    }
    if (v.kind == JV_UNDEF) {
        *out = jv_str("", 0);
        return KVR_OK;
    }
    struct jbuf b = {.max = e->o->max_output};
    jv_str_to(&b, v);
    return buf_to_str(e, n, &b, out);
}

static struct jv lookup_name(struct ev *e, const char *name, size_t n)
{
    for (size_t i = e->nvars; i-- > e->vis_lo;)
        if (e->vars[i].n == n && memcmp(e->vars[i].name, name, n) == 0)
            return e->vars[i].v;
    for (size_t i = e->vis_lo ? e->top_end : 0; i-- > 0;)
        if (e->vars[i].n == n && memcmp(e->vars[i].name, name, n) == 0)
            return e->vars[i].v;
    static const char *const fn[] = {"raise_exception", "strftime_now", "namespace", "range"};
    for (int f = 0; f < 4; f++)
        if (strlen(fn[f]) == n && memcmp(fn[f], name, n) == 0)
            return (struct jv){.kind = JV_FUNC, .u.fn = f};
    return jv_undef();
}

static int set_var(struct ev *e, const struct jnode *n, const char *name, size_t len, struct jv v)
{
    for (size_t i = e->frame; i < e->nvars; i++)
        if (e->vars[i].n == len && memcmp(e->vars[i].name, name, len) == 0) {
            e->vars[i].v = v;
            return KVR_OK;
        }
    if (e->nvars == e->cap) {
        void *buf = e->vars;
        if (kvr_grow(&buf, &e->cap, e->nvars + 1, MAX_VARS, sizeof *e->vars) != KVR_OK)
            return fail(e, n, KVR_ETOOBIG, "more than %d variables", MAX_VARS);
        e->vars = buf;
    }
    e->vars[e->nvars++] = (struct jvar){name, len, v};
    if (e->frame == 0)
        e->top_end = e->nvars;
    return KVR_OK;
}

static int eval(struct ev *e, const struct jnode *n, struct jv *out);

static bool is_str(struct jv v) { return v.kind == JV_STR; }
static struct jv mklist(struct jlist *l) { return (struct jv){.kind = JV_LIST, .u.l = l}; }

/* Byte offset of code point index ci in s (clamped). */
static size_t cp_off(const char *p, size_t n, int64_t ci)
{
    size_t i = 0;
    while (i < n && ci > 0) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80)
            i++;
        ci--;
    }
    return i;
}
static size_t cp_len_at(const char *p, size_t n, size_t i)
{
    size_t j = i + 1;
    while (j < n && ((unsigned char)p[j] & 0xC0) == 0x80)
        j++;
    return j - i;
}

/* An iterable as a list: list itself, dict keys, string characters, undefined empty. */
static int as_list(struct ev *e, const struct jnode *n, struct jv v, struct jlist **out)
{
    switch (v.kind) {
    case JV_LIST:
        if (v.u.l->kind == JL_GEN) { /* one pass: what is left, then nothing */
            struct jlist *l = jl_new(e->a, 0);
            if (!l)
                return oom(e, n);
            if (v.u.l->pos < v.u.l->n)
                l->a = v.u.l->a + v.u.l->pos;
            l->n = l->cap = v.u.l->n - v.u.l->pos;
            v.u.l->pos = v.u.l->n;
            *out = l;
            return KVR_OK;
        }
        *out = v.u.l;
        return KVR_OK;
    case JV_UNDEF:
        *out = jl_new(e->a, 0);
        return *out ? KVR_OK : oom(e, n);
    case JV_DICT: {
        struct jlist *l = jl_new(e->a, v.u.d->n);
        if (!l)
            return oom(e, n);
        for (size_t i = 0; i < v.u.d->n; i++)
            l->a[i] = v.u.d->k[i];
        l->n = v.u.d->n;
        *out = l;
        return KVR_OK;
    }
    case JV_STR: {
        struct jlist *l = jl_new(e->a, utf8_count(v.u.s.p, v.u.s.n));
        if (!l)
            return oom(e, n);
        for (size_t i = 0; i < v.u.s.n;) {
            size_t k = cp_len_at(v.u.s.p, v.u.s.n, i);
            if (jl_push(e->a, l, jv_str(v.u.s.p + i, k)))
                return oom(e, n);
            i += k;
        }
        *out = l;
        return KVR_OK;
    }
    default:
        return fail(e, n, KVR_EINVAL, "'%s' object is not iterable", jv_type_name(v));
    }
}

static int get_attr(struct ev *e, const struct jnode *n, struct jv obj, const char *name,
                    size_t len, struct jv *out)
{
    *out = jv_undef();
    switch (obj.kind) {
    case JV_UNDEF:
        return fail(e, n, KVR_EINVAL, "'%.*s' is undefined (attribute of an undefined value)",
                    (int)len, name);
    case JV_DICT:
    case JV_NS: {
        const struct jv *v = jd_gets(obj.u.d, name, len);
        if (v)
            *out = *v;
        return KVR_OK;
    }
    case JV_LOOP: {
        const struct jloop *l = obj.u.loop;
#define IS(s) (len == sizeof s - 1 && memcmp(name, s, len) == 0)
        if (IS("index"))
            *out = jv_int(l->index0 + 1);
        else if (IS("index0"))
            *out = jv_int(l->index0);
        else if (IS("first"))
            *out = jv_bool(l->index0 == 0);
        else if (IS("last"))
            *out = jv_bool(l->index0 == l->length - 1);
        else if (IS("length"))
            *out = jv_int(l->length);
        else if (IS("revindex"))
            *out = jv_int(l->length - l->index0);
        else if (IS("revindex0"))
            *out = jv_int(l->length - l->index0 - 1);
        else if (IS("previtem")) {
            if (l->index0 > 0)
                *out = l->items->a[l->index0 - 1];
        } else if (IS("nextitem")) {
            if (l->index0 + 1 < l->length)
                *out = l->items->a[l->index0 + 1];
        } else
            return fail(e, n, KVR_EINVAL, "loop.%.*s is not supported", (int)len, name);
#undef IS
        return KVR_OK;
    }
    default:
        return KVR_OK;
    }
}

static int get_item(struct ev *e, const struct jnode *n, struct jv obj, struct jv key,
                    struct jv *out)
{
    *out = jv_undef();
    if (obj.kind == JV_UNDEF)
        return fail(e, n, KVR_EINVAL, "subscript of an undefined value");
    if (obj.kind == JV_LIST && (obj.u.l->kind == JL_GEN || obj.u.l->kind == JL_VIEW))
        return KVR_OK; /* not subscriptable: Jinja gives undefined */
    if ((obj.kind == JV_LIST || obj.kind == JV_STR) &&
        (key.kind == JV_INT || key.kind == JV_BOOL)) {
        int64_t i = key.kind == JV_INT ? key.u.i : key.u.b;
        if (obj.kind == JV_LIST) {
            int64_t len = (int64_t)obj.u.l->n;
            if (i < 0)
                i += len;
            if (i >= 0 && i < len)
                *out = obj.u.l->a[i];
            return KVR_OK;
        }
        int64_t len = (int64_t)utf8_count(obj.u.s.p, obj.u.s.n);
        if (i < 0)
            i += len;
        if (i >= 0 && i < len) {
            size_t off = cp_off(obj.u.s.p, obj.u.s.n, i);
            *out = jv_str(obj.u.s.p + off, cp_len_at(obj.u.s.p, obj.u.s.n, off));
        }
        return KVR_OK;
    }
    if (obj.kind == JV_DICT) {
        const struct jv *v = jd_get(obj.u.d, key);
        if (v)
            *out = *v;
        return KVR_OK;
    }
    if (key.kind == JV_STR)
        return get_attr(e, n, obj, key.u.s.p, key.u.s.n, out);
    return KVR_OK;
}

static int slice(struct ev *e, const struct jnode *n, struct jv obj, struct jv vs[3],
                 struct jv *out)
{
    int64_t len;
    if (obj.kind == JV_LIST && (obj.u.l->kind == JL_GEN || obj.u.l->kind == JL_VIEW)) {
        *out = jv_undef();
        return KVR_OK;
    } else if (obj.kind == JV_LIST)
        len = (int64_t)obj.u.l->n;
    else if (obj.kind == JV_STR)
        len = (int64_t)utf8_count(obj.u.s.p, obj.u.s.n);
    else if (obj.kind == JV_UNDEF)
        return fail(e, n, KVR_EINVAL, "slice of an undefined value");
    else {
        *out = jv_undef();
        return KVR_OK;
    }
    int64_t idx[3];
    bool given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = vs[k].kind != JV_NONE && vs[k].kind != JV_UNDEF;
        if (given[k] && vs[k].kind != JV_INT && vs[k].kind != JV_BOOL)
            return fail(e, n, KVR_EINVAL, "slice indices must be integers or None");
        idx[k] = given[k] ? (vs[k].kind == JV_INT ? vs[k].u.i : vs[k].u.b) : 0;
    }
    int64_t step = given[2] ? idx[2] : 1;
    if (step == 0)
        return fail(e, n, KVR_EINVAL, "slice step cannot be zero");
    int64_t start, stop;
    if (step > 0) {
        start = given[0] ? idx[0] : 0;
        stop = given[1] ? idx[1] : len;
        if (start < 0)
            start = start + len < 0 ? 0 : start + len;
        if (stop < 0)
            stop = stop + len < 0 ? 0 : stop + len;
        if (start > len)
            start = len;
        if (stop > len)
            stop = len;
    } else {
        start = given[0] ? idx[0] : len - 1;
        stop = given[1] ? idx[1] : -1 - len;
        if (start < 0)
            start = start + len < 0 ? -1 : start + len;
        else if (start >= len)
            start = len - 1;
        if (stop < 0)
            stop = stop + len < 0 ? -1 : stop + len;
        else if (stop >= len)
            stop = len - 1;
    }
    struct jlist *src = NULL;
    if (obj.kind == JV_LIST)
        src = obj.u.l;
    else {
        int rc = as_list(e, n, obj, &src);
        if (rc)
            return rc;
    }
    struct jlist *l = jl_new(e->a, 0);
    if (!l)
        return oom(e, n);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        if (jl_push(e->a, l, src->a[i]))
            return oom(e, n);
    if (obj.kind == JV_LIST) {
        l->kind = obj.u.l->kind; /* a slice of a tuple is a tuple, of a range a range */
        *out = mklist(l);
        return KVR_OK;
    }
    size_t total = 0;
    for (size_t i = 0; i < l->n; i++)
        total += l->a[i].u.s.n;
    char *s = ja_alloc(e->a, total + 1);
    if (!s)
        return oom(e, n);
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        memcpy(s + k, l->a[i].u.s.p, l->a[i].u.s.n);
        k += l->a[i].u.s.n;
    }
    *out = jv_str(s, k);
    return KVR_OK;
}

static int concat_str(struct ev *e, const struct jnode *n, struct jv a, struct jv b, struct jv *out)
{
    size_t len = a.u.s.n + b.u.s.n;
    if (len > e->o->max_output)
        return fail(e, n, KVR_ETOOBIG, "string longer than %zu bytes", e->o->max_output);
    char *s = ja_alloc(e->a, len + 1);
    if (!s)
        return oom(e, n);
    if (a.u.s.n)
        memcpy(s, a.u.s.p, a.u.s.n);
    if (b.u.s.n)
        memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
    s[len] = 0;
    *out = jv_str(s, len);
    return KVR_OK;
}

static bool num(struct jv v) { return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL; }
static double fval(struct jv v)
{
    return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t ival(struct jv v) { return v.kind == JV_INT ? v.u.i : (int64_t)v.u.b; }

/* x ** y for y >= 0 by squaring (at most 64 multiplications, whatever y is); false when the
 * result does not fit 64 bits, as a loop of y multiplications would find only after y steps. */
static bool int_pow(int64_t x, int64_t y, int64_t *out)
{
    if (x == 0 || x == 1) {
        *out = y == 0 ? 1 : x;
        return true;
    }
    if (x == -1) {
        *out = (y & 1) ? -1 : 1;
        return true;
    }
    int64_t r = 1, b = x;
    for (;;) {
        if ((y & 1) && __builtin_mul_overflow(r, b, &r))
            return false;
        y >>= 1;
        if (y == 0)
            break;
        if (__builtin_mul_overflow(b, b, &b))
            return false;
    }
    *out = r;
    return true;
}

static int binary(struct ev *e, const struct jnode *n, int op, struct jv a, struct jv b,
                  struct jv *out)
{
    if (op == '~') {
        struct jv sa, sb;
        int rc = to_str(e, n, a, &sa);
        if (!rc)
            rc = to_str(e, n, b, &sb);
        return rc ? rc : concat_str(e, n, sa, sb, out);
    }
    if (a.kind == JV_UNDEF || b.kind == JV_UNDEF)
        return fail(e, n, KVR_EINVAL, "undefined value in an arithmetic operation");
    if (op == '+' && is_str(a) && is_str(b))
        return concat_str(e, n, a, b, out);
    if (op == '+' && a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE)) {
        struct jlist *l = jl_new(e->a, a.u.l->n + b.u.l->n);
        if (!l)
            return oom(e, n);
        for (size_t i = 0; i < a.u.l->n; i++)
            l->a[l->n++] = a.u.l->a[i];
        for (size_t i = 0; i < b.u.l->n; i++)
            l->a[l->n++] = b.u.l->a[i];
        l->kind = a.u.l->kind;
        *out = mklist(l);
        return KVR_OK;
    }
    if (op == '*' && ((is_str(a) && (b.kind == JV_INT || b.kind == JV_BOOL)) ||
                      (is_str(b) && (a.kind == JV_INT || a.kind == JV_BOOL)))) {
        struct jv s = is_str(a) ? a : b;
        int64_t k = is_str(a) ? ival(b) : ival(a);
        if (k <= 0 || s.u.s.n == 0) {
            *out = jv_str("", 0);
            return KVR_OK;
        }
        if ((uint64_t)k > e->o->max_output || s.u.s.n * (uint64_t)k > e->o->max_output)
            return fail(e, n, KVR_ETOOBIG, "string longer than %zu bytes", e->o->max_output);
        char *p = ja_alloc(e->a, s.u.s.n * (size_t)k + 1);
        if (!p)
            return oom(e, n);
        for (int64_t i = 0; i < k; i++)
            memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        *out = jv_str(p, s.u.s.n * (size_t)k);
        return KVR_OK;
    }
    if (!num(a) || !num(b))
        return fail(e, n, KVR_EINVAL, "unsupported operand types for %c: '%s' and '%s'",
                    op == 'F'   ? '/'
                    : op == 'P' ? '*'
                                : op,
                    jv_type_name(a), jv_type_name(b));
    bool fl = a.kind == JV_FLOAT || b.kind == JV_FLOAT;
    if (op == '/') {
        if (fval(b) == 0)
            return fail(e, n, KVR_EINVAL, "division by zero");
        *out = jv_float(fval(a) / fval(b));
        return KVR_OK;
    }
    if (fl) {
        double x = fval(a), y = fval(b), r;
        switch (op) {
        case '+':
            r = x + y;
            break;
        case '-':
            r = x - y;
            break;
        case '*':
            r = x * y;
            break;
        case 'F':
        case '%':
            if (y == 0)
                return fail(e, n, KVR_EINVAL, "float modulo or division by zero");
            r = op == 'F' ? floor(x / y) : fmod(x, y);
            if (op == '%' && r != 0 && ((r < 0) != (y < 0)))
                r += y;
            break;
        default:
            r = pow(x, y);
            break;
        }
        *out = jv_float(r);
        return KVR_OK;
    }
    int64_t x = ival(a), y = ival(b), r = 0;
    bool ovf = false;
    switch (op) {
    case '+':
        ovf = __builtin_add_overflow(x, y, &r);
        break;
    case '-':
        ovf = __builtin_sub_overflow(x, y, &r);
        break;
    case '*':
        ovf = __builtin_mul_overflow(x, y, &r);
        break;
    case 'F':
    case '%':
        if (y == 0)
            return fail(e, n, KVR_EINVAL, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            ovf = true;
            break;
        }
        r = op == 'F' ? x / y : x % y;
        if (op == 'F' && (x % y != 0) && ((x < 0) != (y < 0)))
            r--;
        if (op == '%' && r != 0 && ((r < 0) != (y < 0)))
            r += y;
        break;
    default:
        if (y < 0) {
            *out = jv_float(pow((double)x, (double)y));
            return KVR_OK;
        }
        ovf = !int_pow(x, y, &r);
        break;
    }
    if (ovf)
        return fail(e, n, KVR_ERANGE, "integer result beyond 64 bits is not supported");
    *out = jv_int(r);
    return KVR_OK;
}

static int contains(struct ev *e, const struct jnode *n, struct jv needle, struct jv hay, bool *out)
{
    *out = false;
    switch (hay.kind) {
    case JV_STR:
        if (!is_str(needle))
            return fail(e, n, KVR_EINVAL, "'in <string>' requires string as left operand, not %s",
                        jv_type_name(needle));
        if (needle.u.s.n == 0) {
            *out = true;
            return KVR_OK;
        }
        *out = jinja_find(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
        return KVR_OK;
    case JV_LIST:
        for (size_t i = hay.u.l->kind == JL_GEN ? hay.u.l->pos : 0; i < hay.u.l->n && !*out; i++)
            *out = jv_eq(hay.u.l->a[i], needle);
        return KVR_OK;
    case JV_DICT:
        *out = jd_get(hay.u.d, needle) != NULL;
        return KVR_OK;
    case JV_UNDEF:
        return KVR_OK;
    default:
        return fail(e, n, KVR_EINVAL, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare_op(struct ev *e, const struct jnode *n, int op, struct jv a, struct jv b,
                      bool *res)
{
    if (op == JC_EQ || op == JC_NE) {
        *res = jv_eq(a, b) == (op == JC_EQ);
        return KVR_OK;
    }
    if (op == JC_IN || op == JC_NOTIN) {
        int rc = contains(e, n, a, b, res);
        if (op == JC_NOTIN)
            *res = !*res;
        return rc;
    }
    int c;
    if (a.kind == JV_UNDEF || b.kind == JV_UNDEF || jv_cmp(a, b, &c) != KVR_OK)
        return fail(e, n, KVR_EINVAL, "'<' not supported between instances of '%s' and '%s'",
                    jv_type_name(a), jv_type_name(b));
    *res = op == JC_LT ? c < 0 : op == JC_LE ? c <= 0 : op == JC_GT ? c > 0 : c >= 0;
    return KVR_OK;
}

/* --- arguments -------------------------------------------------------------------------- */
struct args {
    struct jv pos[8];
    size_t npos;
    const char *kwn[8];
    struct jv kwv[8];
    size_t nkw;
};
static int eval_args(struct ev *e, const struct jnode *n, struct args *a)
{
    if (n->nkids > 8 || n->nkw > 8)
        return fail(e, n, KVR_EINVAL, "too many arguments");
    a->npos = n->nkids;
    a->nkw = n->nkw;
    for (size_t i = 0; i < n->nkids; i++) {
        int rc = eval(e, n->kids[i], &a->pos[i]);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < n->nkw; i++) {
        a->kwn[i] = n->kwn[i];
        int rc = eval(e, n->kwv[i], &a->kwv[i]);
        if (rc)
            return rc;
    }
    return KVR_OK;
}
/* The argument at position pos (0-based, after the subject) or keyword name; def if absent. */
static struct jv arg(const struct args *a, size_t pos, const char *name, struct jv def, bool *given)
{
    if (given)
        *given = true;
    if (pos < a->npos)
        return a->pos[pos];
    for (size_t i = 0; i < a->nkw; i++)
        if (strcmp(a->kwn[i], name) == 0)
            return a->kwv[i];
    if (given)
        *given = false;
    return def;
}
static struct jv kwarg(const struct args *a, const char *name, struct jv def, bool *given)
{
    for (size_t i = 0; i < a->nkw; i++)
        if (strcmp(a->kwn[i], name) == 0) {
            if (given)
                *given = true;
            return a->kwv[i];
        }
    if (given)
        *given = false;
    return def;
}
static int check_args(struct ev *e, const struct jnode *n, const struct args *a, size_t maxpos,
                      const char *const *names, size_t nnames, const char *what)
{
    if (a->npos > maxpos)
        return fail(e, n, KVR_EINVAL, "%s takes at most %zu positional arguments", what, maxpos);
    for (size_t i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (size_t k = 0; k < nnames; k++)
            ok |= strcmp(a->kwn[i], names[k]) == 0;
        if (!ok)
            return fail(e, n, KVR_EINVAL, "%s got an unexpected keyword argument '%s'", what,
                        a->kwn[i]);
    }
    return KVR_OK;
}

/* --- strings ------------------------------------------------------------------------------ */
static bool ascii_only(struct jv s)
{
    for (size_t i = 0; i < s.u.s.n; i++)
        if ((unsigned char)s.u.s.p[i] >= 0x80)
            return false;
    return true;
}

/* mode: 0 upper, 1 lower, 2 capitalize, 3 title */
static int casemap(struct ev *e, const struct jnode *n, struct jv s, int mode, struct jv *out)
{
    if (!ascii_only(s))
        return fail(e, n, KVR_EINVAL,
                    "case mapping of non-ASCII text is not supported (Unicode case tables)");
    char *p = ja_alloc(e->a, s.u.s.n + 1);
    if (!p)
        return oom(e, n);
    bool prev_cased = false;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        bool up = false;
        if (mode == 0)
            up = true;
        else if (mode == 2)
            up = i == 0;
        else if (mode == 3)
            up = !prev_cased;
        if (up && c >= 'a' && c <= 'z')
            c = (char)(c - 32);
        else if (!up && c >= 'A' && c <= 'Z')
            c = (char)(c + 32);
        prev_cased = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        p[i] = c;
    }
    p[s.u.s.n] = 0;
    *out = jv_str(p, s.u.s.n);
    return KVR_OK;
}

static bool in_chars(struct jv chars, const char *p, size_t k)
{
    for (size_t i = 0; i + k <= chars.u.s.n;) {
        size_t l = cp_len_at(chars.u.s.p, chars.u.s.n, i);
        if (l == k && memcmp(chars.u.s.p + i, p, k) == 0)
            return true;
        i += l;
    }
    return false;
}

/* str.strip/lstrip/rstrip; chars: none for whitespace. */
static int strip(struct ev *e, const struct jnode *n, struct jv s, struct jv chars, bool left,
                 bool right, struct jv *out)
{
    if (chars.kind != JV_NONE && chars.kind != JV_UNDEF && !is_str(chars))
        return fail(e, n, KVR_EINVAL, "strip arg must be None or str");
    bool ws = !is_str(chars);
    const char *p = s.u.s.p;
    size_t b = 0, en = s.u.s.n;
    while (left && b < en) {
        size_t k = ws ? jinja_space_len(p + b, en - b) : 0;
        if (!ws) {
            size_t l = cp_len_at(p, en, b);
            k = in_chars(chars, p + b, l) ? l : 0;
        }
        if (!k)
            break;
        b += k;
    }
    while (right && en > b) {
        size_t st = en - 1;
        while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80)
            st--;
        size_t l = en - st;
        bool sp = ws ? jinja_space_len(p + st, l) == l : in_chars(chars, p + st, l);
        if (!sp)
            break;
        en = st;
    }
    *out = jv_str(p + b, en - b);
    return KVR_OK;
}

static int split(struct ev *e, const struct jnode *n, struct jv s, struct jv sep, int64_t maxs,
                 bool from_right, struct jv *out)
{
    struct jlist *l = jl_new(e->a, 0);
    if (!l)
        return oom(e, n);
    const char *p = s.u.s.p;
    size_t len = s.u.s.n;
    if (sep.kind == JV_NONE || sep.kind == JV_UNDEF) {
        if (from_right && maxs >= 0)
            return fail(e, n, KVR_EINVAL, "rsplit() with a limit on whitespace is not supported");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < len) {
                size_t k = jinja_space_len(p + i, len - i);
                if (!k)
                    break;
                i += k;
            }
            if (i >= len)
                break;
            size_t st = i;
            if (maxs >= 0 && done >= maxs) {
                size_t en = len;
                while (en > st) { /* the rest, trailing whitespace stripped */
                    size_t b = en - 1;
                    while (b > st && ((unsigned char)p[b] & 0xC0) == 0x80)
                        b--;
                    if (jinja_space_len(p + b, en - b) != en - b)
                        break;
                    en = b;
                }
                if (jl_push(e->a, l, jv_str(p + st, en - st)))
                    return oom(e, n);
                break;
            }
            while (i < len && !jinja_space_len(p + i, len - i))
                i += cp_len_at(p, len, i);
            if (jl_push(e->a, l, jv_str(p + st, i - st)))
                return oom(e, n);
            done++;
        }
    } else {
        if (!is_str(sep))
            return fail(e, n, KVR_EINVAL, "must be str or None, not %s", jv_type_name(sep));
        if (sep.u.s.n == 0)
            return fail(e, n, KVR_EINVAL, "empty separator");
        const char *q = sep.u.s.p;
        size_t m = sep.u.s.n;
        if (!from_right) {
            size_t st = 0;
            int64_t done = 0;
            const char *hit;
            while ((maxs < 0 || done < maxs) && (hit = jinja_find(p + st, len - st, q, m))) {
                size_t i = (size_t)(hit - p);
                if (jl_push(e->a, l, jv_str(p + st, i - st)))
                    return oom(e, n);
                st = i + m;
                done++;
            }
            if (jl_push(e->a, l, jv_str(p + st, len - st)))
                return oom(e, n);
        } else {
            /* from the right, then reversed */
            struct jlist *r = jl_new(e->a, 0);
            if (!r)
                return oom(e, n);
            size_t en = len;
            int64_t done = 0;
            size_t i = len;
            while (i >= m) {
                if ((maxs < 0 || done < maxs) && memcmp(p + i - m, q, m) == 0) {
                    if (jl_push(e->a, r, jv_str(p + i, en - i)))
                        return oom(e, n);
                    i -= m;
                    en = i;
                    done++;
                } else {
                    i--;
                }
            }
            if (jl_push(e->a, r, jv_str(p, en)))
                return oom(e, n);
            for (size_t k = r->n; k-- > 0;)
                if (jl_push(e->a, l, r->a[k]))
                    return oom(e, n);
        }
    }
    *out = mklist(l);
    return KVR_OK;
}

static int replace(struct ev *e, const struct jnode *n, struct jv s, struct jv old, struct jv neu,
                   int64_t count, struct jv *out)
{
    if (!is_str(old) || !is_str(neu))
        return fail(e, n, KVR_EINVAL, "replace() arguments must be str");
    struct jbuf b = {.max = e->o->max_output};
    const char *p = s.u.s.p;
    size_t len = s.u.s.n, m = old.u.s.n;
    int64_t done = 0;
    if (m == 0) {
        for (size_t i = 0; i <= len;) {
            if (count < 0 || done < count) {
                jb_put(&b, neu.u.s.p, neu.u.s.n);
                done++;
            }
            if (i == len)
                break;
            size_t k = cp_len_at(p, len, i);
            jb_put(&b, p + i, k);
            i += k;
        }
    } else {
        size_t i = 0;
        const char *hit;
        while ((count < 0 || done < count) && (hit = jinja_find(p + i, len - i, old.u.s.p, m))) {
            jb_put(&b, p + i, (size_t)(hit - (p + i)));
            jb_put(&b, neu.u.s.p, neu.u.s.n);
            i = (size_t)(hit - p) + m;
            done++;
        }
        jb_put(&b, p + i, len - i);
    }
    return buf_to_str(e, n, &b, out);
}

static int prefix_test(struct ev *e, const struct jnode *n, struct jv s, struct jv pre, bool end,
                       bool *res)
{
    *res = false;
    if (pre.kind == JV_LIST && pre.u.l->kind == JL_TUPLE) {
        for (size_t i = 0; i < pre.u.l->n && !*res; i++) {
            int rc = prefix_test(e, n, s, pre.u.l->a[i], end, res);
            if (rc)
                return rc;
        }
        return KVR_OK;
    }
    if (!is_str(pre))
        return fail(e, n, KVR_EINVAL,
                    "startswith/endswith first arg must be str or a tuple of str");
    size_t m = pre.u.s.n;
    *res = m <= s.u.s.n && (m == 0 || memcmp(s.u.s.p + (end ? s.u.s.n - m : 0), pre.u.s.p, m) == 0);
    return KVR_OK;
}

static struct jv opt_int_none(struct jv v) { return v; }

static int method(struct ev *e, const struct jnode *n, struct jv *out)
{
    struct jv obj;
    int rc = eval(e, n->a, &obj);
    if (rc)
        return rc;
    struct args a;
    if ((rc = eval_args(e, n, &a)))
        return rc;
    static const char *const no[] = {""};
    if (obj.kind == JV_DICT) {
        switch (n->op) {
        case JM_ITEMS:
        case JM_KEYS:
        case JM_VALUES: {
            if ((rc = check_args(e, n, &a, 0, no, 0, "dict method")))
                return rc;
            struct jlist *l = jl_new(e->a, obj.u.d->n);
            if (!l)
                return oom(e, n);
            for (size_t i = 0; i < obj.u.d->n; i++) {
                if (n->op == JM_ITEMS) {
                    struct jlist *t = jl_new(e->a, 2);
                    if (!t)
                        return oom(e, n);
                    t->kind = JL_TUPLE;
                    t->a[0] = obj.u.d->k[i];
                    t->a[1] = obj.u.d->v[i];
                    t->n = 2;
                    l->a[i] = mklist(t);
                } else {
                    l->a[i] = n->op == JM_KEYS ? obj.u.d->k[i] : obj.u.d->v[i];
                }
            }
            l->n = obj.u.d->n;
            l->kind = JL_VIEW;
            *out = mklist(l);
            return KVR_OK;
        }
        case JM_GET: {
            if ((rc = check_args(e, n, &a, 2, no, 0, "get")))
                return rc;
            if (a.npos < 1)
                return fail(e, n, KVR_EINVAL, "get expected at least 1 argument");
            const struct jv *v = jd_get(obj.u.d, a.pos[0]);
            *out = v ? *v : a.npos > 1 ? a.pos[1] : jv_none();
            return KVR_OK;
        }
        default:
            break;
        }
    }
    if (obj.kind == JV_UNDEF)
        return fail(e, n, KVR_EINVAL, "'%.*s' of an undefined value", (int)n->name_len, n->name);
    if (!is_str(obj))
        return fail(e, n, KVR_EINVAL, "'%s' object has no method '%.*s' that templates may call",
                    jv_type_name(obj), (int)n->name_len, n->name);
    switch (n->op) {
    case JM_STARTSWITH:
    case JM_ENDSWITH: {
        if ((rc = check_args(e, n, &a, 1, no, 0, "startswith/endswith")))
            return rc;
        if (a.npos != 1)
            return fail(e, n, KVR_EINVAL, "startswith/endswith takes one argument here");
        bool r;
        if ((rc = prefix_test(e, n, obj, a.pos[0], n->op == JM_ENDSWITH, &r)))
            return rc;
        *out = jv_bool(r);
        return KVR_OK;
    }
    case JM_STRIP:
    case JM_LSTRIP:
    case JM_RSTRIP:
        if ((rc = check_args(e, n, &a, 1, no, 0, "strip")))
            return rc;
        return strip(e, n, obj, a.npos ? a.pos[0] : jv_none(), n->op != JM_RSTRIP,
                     n->op != JM_LSTRIP, out);
    case JM_SPLIT:
    case JM_RSPLIT: {
        static const char *const nm[] = {"sep", "maxsplit"};
        if ((rc = check_args(e, n, &a, 2, nm, 2, "split")))
            return rc;
        struct jv sep = arg(&a, 0, "sep", jv_none(), NULL);
        struct jv mx = opt_int_none(arg(&a, 1, "maxsplit", jv_int(-1), NULL));
        if (mx.kind != JV_INT)
            return fail(e, n, KVR_EINVAL, "maxsplit must be an integer");
        return split(e, n, obj, sep, mx.u.i, n->op == JM_RSPLIT, out);
    }
    case JM_UPPER:
    case JM_LOWER:
    case JM_TITLE:
    case JM_CAPITALIZE:
        if ((rc = check_args(e, n, &a, 0, no, 0, "case method")))
            return rc;
        return casemap(e, n, obj,
                       n->op == JM_UPPER        ? 0
                       : n->op == JM_LOWER      ? 1
                       : n->op == JM_CAPITALIZE ? 2
                                                : 3,
                       out);
    case JM_REPLACE: {
        if ((rc = check_args(e, n, &a, 3, no, 0, "replace")))
            return rc;
        if (a.npos < 2)
            return fail(e, n, KVR_EINVAL, "replace expected at least 2 arguments");
        int64_t cnt = a.npos > 2 && a.pos[2].kind == JV_INT ? a.pos[2].u.i : -1;
        return replace(e, n, obj, a.pos[0], a.pos[1], cnt, out);
    }
    case JM_FIND: {
        if ((rc = check_args(e, n, &a, 1, no, 0, "find")))
            return rc;
        if (a.npos != 1 || !is_str(a.pos[0]))
            return fail(e, n, KVR_EINVAL, "find takes one str argument here");
        struct jv nd = a.pos[0];
        *out = jv_int(-1);
        const char *hit =
            nd.u.s.n ? jinja_find(obj.u.s.p, obj.u.s.n, nd.u.s.p, nd.u.s.n) : obj.u.s.p;
        if (hit != NULL)
            *out = jv_int((int64_t)utf8_count(obj.u.s.p, (size_t)(hit - obj.u.s.p)));
        return KVR_OK;
    }
    default:
        return fail(e, n, KVR_EINVAL, "'str' object has no method '%.*s'", (int)n->name_len,
                    n->name);
    }
}

/* --- tests ---------------------------------------------------------------------------------- */
static int test(struct ev *e, const struct jnode *n, struct jv v, const struct args *a, bool *r)
{
    struct jv x = a->npos ? a->pos[0] : jv_undef();
    int rc = KVR_OK;
    switch (n->op) {
    case JTS_DEFINED:
        *r = v.kind != JV_UNDEF;
        break;
    case JTS_UNDEFINED:
        *r = v.kind == JV_UNDEF;
        break;
    case JTS_NONE:
        *r = v.kind == JV_NONE;
        break;
    case JTS_STRING:
        *r = v.kind == JV_STR;
        break;
    case JTS_MAPPING:
        *r = v.kind == JV_DICT;
        break;
    case JTS_SEQUENCE:
        *r = v.kind == JV_STR || v.kind == JV_DICT || v.kind == JV_UNDEF ||
             (v.kind == JV_LIST && v.u.l->kind != JL_GEN && v.u.l->kind != JL_VIEW);
        break;
    case JTS_ITERABLE:
        *r = v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF;
        break;
    case JTS_NUMBER:
        *r = num(v);
        break;
    case JTS_BOOLEAN:
        *r = v.kind == JV_BOOL;
        break;
    case JTS_TRUE:
        *r = v.kind == JV_BOOL && v.u.b;
        break;
    case JTS_FALSE:
        *r = v.kind == JV_BOOL && !v.u.b;
        break;
    case JTS_INTEGER:
        *r = v.kind == JV_INT;
        break;
    case JTS_FLOAT:
        *r = v.kind == JV_FLOAT;
        break;
    case JTS_CALLABLE:
        *r = v.kind == JV_FUNC || v.kind == JV_MACRO;
        break;
    case JTS_EQ:
    case JTS_NE:
    case JTS_LT:
    case JTS_LE:
    case JTS_GT:
    case JTS_GE:
    case JTS_IN: {
        /* the comparison tests, in enum jtest order, as their operators */
        static const int op[] = {JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN};
        rc = compare_op(e, n, op[n->op - JTS_EQ], v, x, r);
        break;
    }
    case JTS_SAMEAS:
        *r = v.kind == x.kind &&
             (v.kind == JV_NONE || v.kind == JV_UNDEF || (v.kind == JV_BOOL && v.u.b == x.u.b) ||
              (v.kind == JV_LIST && v.u.l == x.u.l) ||
              ((v.kind == JV_DICT || v.kind == JV_NS) && v.u.d == x.u.d));
        break;
    case JTS_ODD:
    case JTS_EVEN:
    case JTS_DIVISIBLEBY: {
        if (v.kind != JV_INT && v.kind != JV_BOOL)
            return fail(e, n, KVR_EINVAL, "test of a non-integer value");
        int64_t i = ival(v), d = n->op == JTS_DIVISIBLEBY ? 0 : 2;
        if (n->op == JTS_DIVISIBLEBY) {
            if (x.kind != JV_INT || x.u.i == 0)
                return fail(e, n, KVR_EINVAL, "divisibleby needs a non-zero integer");
            d = x.u.i;
        }
        int64_t m = d == -1 ? 0 : i % d;
        *r = n->op == JTS_ODD ? m != 0 : m == 0;
        break;
    }
    case JTS_LOWER:
    case JTS_UPPER: {
        struct jv s;
        if ((rc = to_str(e, n, v, &s)))
            return rc;
        if (!ascii_only(s))
            return fail(e, n, KVR_EINVAL, "case test of non-ASCII text is not supported");
        bool cased = false, ok = true;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            if (c >= 'a' && c <= 'z') {
                cased = true;
                ok &= n->op == JTS_LOWER;
            } else if (c >= 'A' && c <= 'Z') {
                cased = true;
                ok &= n->op == JTS_UPPER;
            }
        }
        *r = cased && ok;
        break;
    }
    default:
        return fail(e, n, KVR_EINVAL, "test not implemented");
    }
    return rc;
}

/* --- filters -------------------------------------------------------------------------------- */
static int apply_filter(struct ev *e, const struct jnode *n, int f, struct jv v,
                        const struct args *a, struct jv *out);

static int select_items(struct ev *e, const struct jnode *n, struct jv v, const struct args *a,
                        bool by_attr, bool keep, struct jv *out)
{
    struct jlist *src;
    int rc = jv_truthy(v) ? as_list(e, n, v, &src) : KVR_OK; /* Jinja: `if seq:` */
    if (rc)
        return rc;
    if (!jv_truthy(v) && !(src = jl_new(e->a, 0)))
        return oom(e, n);
    size_t first = 0;
    struct jv attr = jv_undef();
    if (by_attr) {
        if (a->npos < 1 || !is_str(a->pos[0]))
            return fail(e, n, KVR_EINVAL, "selectattr/rejectattr needs an attribute name");
        attr = a->pos[0];
        first = 1;
    }
    struct jnode tn = *n;
    bool has_test = a->npos > first;
    if (has_test) {
        if (!is_str(a->pos[first]))
            return fail(e, n, KVR_EINVAL, "test name must be a string");
        static const char *const tests[] = {
            "defined", "undefined", "none",    "string", "mapping",     "sequence",
            "number",  "iterable",  "boolean", "true",   "false",       "integer",
            "float",   "equalto",   "ne",      "lt",     "le",          "gt",
            "ge",      "in",        "odd",     "even",   "divisibleby", "callable",
            "lower",   "upper",     "sameas",  "eq",     "=="};
        static const int ids[] = {
            JTS_DEFINED, JTS_UNDEFINED, JTS_NONE,    JTS_STRING, JTS_MAPPING,     JTS_SEQUENCE,
            JTS_NUMBER,  JTS_ITERABLE,  JTS_BOOLEAN, JTS_TRUE,   JTS_FALSE,       JTS_INTEGER,
            JTS_FLOAT,   JTS_EQ,        JTS_NE,      JTS_LT,     JTS_LE,          JTS_GT,
            JTS_GE,      JTS_IN,        JTS_ODD,     JTS_EVEN,   JTS_DIVISIBLEBY, JTS_CALLABLE,
            JTS_LOWER,   JTS_UPPER,     JTS_SAMEAS,  JTS_EQ,     JTS_EQ};
        int id = -1;
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
            if (strlen(tests[i]) == a->pos[first].u.s.n &&
                memcmp(tests[i], a->pos[first].u.s.p, a->pos[first].u.s.n) == 0)
                id = ids[i];
        if (id < 0)
            return fail(e, n, KVR_EINVAL, "test \"%.*s\" is not supported",
                        (int)a->pos[first].u.s.n, a->pos[first].u.s.p);
        tn.op = id;
    }
    struct args ta = {0};
    for (size_t i = first + 1; i < a->npos && ta.npos < 8; i++)
        ta.pos[ta.npos++] = a->pos[i];
    struct jlist *l = jl_new(e->a, 0);
    if (!l)
        return oom(e, n);
    for (size_t i = 0; i < src->n; i++) {
        struct jv item = src->a[i], x = item;
        if (by_attr) {
            /* dotted attribute paths: a.b */
            const char *p = attr.u.s.p;
            size_t left = attr.u.s.n;
            while (left) {
                const char *dot = memchr(p, '.', left);
                size_t k = dot ? (size_t)(dot - p) : left;
                struct jv key = jv_str(p, k), nx;
                if (x.kind == JV_UNDEF)
                    break;
                if ((rc = get_item(e, n, x, key, &nx)))
                    return rc;
                x = nx;
                p += k + (dot ? 1 : 0);
                left -= k + (dot ? 1 : 0);
            }
        }
        bool r;
        if (has_test) {
            if ((rc = test(e, &tn, x, &ta, &r)))
                return rc;
        } else {
            r = jv_truthy(x);
        }
        if (r == keep && jl_push(e->a, l, item))
            return oom(e, n);
    }
    l->kind = JL_GEN;
    *out = mklist(l);
    return KVR_OK;
}

/* A string's text, Python whitespace stripped, NUL-terminated in buf[64]; false when empty,
 * too long for a number or holding a NUL. */
static bool num_text(struct jv v, char buf[64])
{
    const char *p = v.u.s.p;
    size_t b = 0, en = v.u.s.n, k;
    while (b < en && (k = jinja_space_len(p + b, en - b)))
        b += k;
    while (en > b) {
        size_t st = en - 1;
        while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80)
            st--;
        if (jinja_space_len(p + st, en - st) != en - st)
            break;
        en = st;
    }
    if (en == b || en - b >= 64 || memchr(p + b, 0, en - b))
        return false;
    memcpy(buf, p + b, en - b);
    buf[en - b] = 0;
    return true;
}

static int filter_by_name(struct jv name)
{
    static const struct {
        const char *n;
        int f;
    } t[] = {{"trim", JFL_TRIM},     {"length", JFL_LENGTH},
             {"count", JFL_LENGTH},  {"tojson", JFL_TOJSON},
             {"string", JFL_STRING}, {"upper", JFL_UPPER},
             {"lower", JFL_LOWER},   {"first", JFL_FIRST},
             {"last", JFL_LAST},     {"list", JFL_LIST},
             {"int", JFL_INT},       {"float", JFL_FLOAT},
             {"abs", JFL_ABS},       {"capitalize", JFL_CAPITALIZE},
             {"title", JFL_TITLE},   {"reverse", JFL_REVERSE},
             {"items", JFL_ITEMS}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strlen(t[i].n) == name.u.s.n && memcmp(t[i].n, name.u.s.p, name.u.s.n) == 0)
            return t[i].f;
    return -1;
}

static int apply_filter(struct ev *e, const struct jnode *n, int f, struct jv v,
                        const struct args *a, struct jv *out)
{
    int rc;
    static const char *const no[] = {""};
    switch (f) {
    case JFL_SAFE:
        *out = v;
        return KVR_OK;
    case JFL_TRIM: {
        static const char *const nm[] = {"chars"};
        if ((rc = check_args(e, n, a, 1, nm, 1, "trim")))
            return rc;
        struct jv s;
        if ((rc = to_str(e, n, v, &s)))
            return rc;
        return strip(e, n, s, arg(a, 0, "chars", jv_none(), NULL), true, true, out);
    }
    case JFL_LENGTH:
        switch (v.kind) {
        case JV_STR:
            *out = jv_int((int64_t)utf8_count(v.u.s.p, v.u.s.n));
            return KVR_OK;
        case JV_LIST:
            if (v.u.l->kind == JL_GEN)
                return fail(e, n, KVR_EINVAL, "object of type 'generator' has no len()");
            *out = jv_int((int64_t)v.u.l->n);
            return KVR_OK;
        case JV_DICT:
            *out = jv_int((int64_t)v.u.d->n);
            return KVR_OK;
        case JV_UNDEF:
            *out = jv_int(0);
            return KVR_OK;
        default:
            return fail(e, n, KVR_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
        }
    case JFL_TOJSON: {
        static const char *const nm[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
        if ((rc = check_args(e, n, a, 4, nm, 4, "tojson")))
            return rc;
        bool ascii = jv_truthy(arg(a, 0, "ensure_ascii", jv_bool(false), NULL));
        struct jv ind = arg(a, 1, "indent", jv_none(), NULL);
        struct jv sep = arg(a, 2, "separators", jv_none(), NULL);
        bool sort = jv_truthy(arg(a, 3, "sort_keys", jv_bool(false), NULL));
        char spaces[64];
        const char *ip = NULL;
        size_t il = 0;
        bool has_indent = false;
        if (ind.kind == JV_INT) {
            has_indent = true;
            il = ind.u.i < 0 ? 0 : ind.u.i > 63 ? 63 : (size_t)ind.u.i;
            if (ind.u.i > 63)
                return fail(e, n, KVR_EINVAL, "tojson indent above 63 is not supported");
            memset(spaces, ' ', il);
            ip = spaces;
        } else if (is_str(ind)) {
            has_indent = true;
            ip = ind.u.s.p;
            il = ind.u.s.n;
        } else if (ind.kind != JV_NONE) {
            return fail(e, n, KVR_EINVAL, "tojson indent must be an int, a str or None");
        }
        char isep[64], ksep[64];
        const char *ips = NULL, *kps = NULL;
        if (sep.kind == JV_LIST && sep.u.l->n == 2 && is_str(sep.u.l->a[0]) &&
            is_str(sep.u.l->a[1]) && sep.u.l->a[0].u.s.n < 64 && sep.u.l->a[1].u.s.n < 64) {
            memcpy(isep, sep.u.l->a[0].u.s.p, sep.u.l->a[0].u.s.n);
            isep[sep.u.l->a[0].u.s.n] = 0;
            memcpy(ksep, sep.u.l->a[1].u.s.p, sep.u.l->a[1].u.s.n);
            ksep[sep.u.l->a[1].u.s.n] = 0;
            if (strlen(isep) != sep.u.l->a[0].u.s.n || strlen(ksep) != sep.u.l->a[1].u.s.n)
                return fail(e, n, KVR_EINVAL, "tojson separators with NUL are not supported");
            ips = isep;
            kps = ksep;
        } else if (sep.kind != JV_NONE) {
            return fail(e, n, KVR_EINVAL, "tojson separators must be a pair of strings");
        }
        struct jbuf b = {.max = e->o->max_output};
        char msg[200] = "";
        rc = jv_tojson(&b, v, ascii, ip, il, has_indent, ips, kps, sort, 0, msg, sizeof msg);
        if (rc) {
            free(b.p);
            return fail(e, n, rc, "%s", msg);
        }
        return buf_to_str(e, n, &b, out);
    }
    case JFL_ITEMS: {
        if (v.kind == JV_UNDEF) {
            struct jlist *l = jl_new(e->a, 0);
            if (!l)
                return oom(e, n);
            l->kind = JL_GEN;
            *out = mklist(l);
            return KVR_OK;
        }
        if (v.kind != JV_DICT)
            return fail(e, n, KVR_EINVAL, "Can only get item pairs from a mapping.");
        struct jlist *l = jl_new(e->a, v.u.d->n);
        if (!l)
            return oom(e, n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            struct jlist *t = jl_new(e->a, 2);
            if (!t)
                return oom(e, n);
            t->kind = JL_TUPLE;
            t->a[0] = v.u.d->k[i];
            t->a[1] = v.u.d->v[i];
            t->n = 2;
            l->a[l->n++] = mklist(t);
        }
        l->kind = JL_GEN;
        *out = mklist(l);
        return KVR_OK;
    }
    case JFL_STRING:
        return to_str(e, n, v, out);
    case JFL_UPPER:
    case JFL_LOWER:
    case JFL_CAPITALIZE:
    case JFL_TITLE: {
        struct jv s;
        if ((rc = to_str(e, n, v, &s)))
            return rc;
        return casemap(e, n, s,
                       f == JFL_UPPER        ? 0
                       : f == JFL_LOWER      ? 1
                       : f == JFL_CAPITALIZE ? 2
                                             : 3,
                       out);
    }
    case JFL_DEFAULT: {
        static const char *const nm[] = {"default_value", "boolean"};
        if ((rc = check_args(e, n, a, 2, nm, 2, "default")))
            return rc;
        struct jv d = arg(a, 0, "default_value", jv_str("", 0), NULL);
        bool boolean = jv_truthy(arg(a, 1, "boolean", jv_bool(false), NULL));
        *out = (v.kind == JV_UNDEF || (boolean && !jv_truthy(v))) ? d : v;
        return KVR_OK;
    }
    case JFL_JOIN: {
        static const char *const nm[] = {"d", "attribute"};
        if ((rc = check_args(e, n, a, 2, nm, 2, "join")))
            return rc;
        struct jv sep = arg(a, 0, "d", jv_str("", 0), NULL);
        struct jv attr = arg(a, 1, "attribute", jv_none(), NULL);
        struct jlist *l;
        if ((rc = as_list(e, n, v, &l)))
            return rc;
        struct jv acc = jv_str("", 0), s;
        if ((rc = to_str(e, n, sep, &sep)))
            return rc;
        for (size_t i = 0; i < l->n; i++) {
            struct jv item = l->a[i];
            if (attr.kind != JV_NONE && (rc = get_item(e, n, item, attr, &item)))
                return rc;
            if ((rc = to_str(e, n, item, &s)))
                return rc;
            if (i && (rc = concat_str(e, n, acc, sep, &acc)))
                return rc;
            if ((rc = concat_str(e, n, acc, s, &acc)))
                return rc;
        }
        *out = acc;
        return KVR_OK;
    }
    case JFL_REPLACE: {
        static const char *const nm[] = {"old", "new", "count"};
        if ((rc = check_args(e, n, a, 3, nm, 3, "replace")))
            return rc;
        struct jv s, cnt = arg(a, 2, "count", jv_none(), NULL);
        if ((rc = to_str(e, n, v, &s)))
            return rc;
        return replace(e, n, s, arg(a, 0, "old", jv_undef(), NULL),
                       arg(a, 1, "new", jv_undef(), NULL), cnt.kind == JV_INT ? cnt.u.i : -1, out);
    }
    case JFL_FIRST:
    case JFL_LAST: {
        if ((rc = check_args(e, n, a, 0, no, 0, "first/last")))
            return rc;
        if (f == JFL_LAST && v.kind == JV_UNDEF)
            return fail(e, n, KVR_EINVAL, "last of an undefined value");
        if (v.kind == JV_LIST && v.u.l->kind == JL_GEN) {
            if (f == JFL_LAST)
                return fail(e, n, KVR_EINVAL, "'generator' object is not reversible");
            *out = v.u.l->pos < v.u.l->n ? v.u.l->a[v.u.l->pos++] : jv_undef();
            return KVR_OK;
        }
        struct jlist *l;
        if ((rc = as_list(e, n, v, &l)))
            return rc;
        *out = l->n ? l->a[f == JFL_FIRST ? 0 : l->n - 1] : jv_undef();
        return KVR_OK;
    }
    case JFL_LIST: {
        struct jlist *l, *c;
        if ((rc = as_list(e, n, v, &l)))
            return rc;
        if (!(c = jl_new(e->a, l->n)))
            return oom(e, n);
        for (size_t i = 0; i < l->n; i++)
            c->a[i] = l->a[i];
        c->n = l->n;
        *out = mklist(c);
        return KVR_OK;
    }
    case JFL_REVERSE: {
        if (is_str(v)) {
            struct jv vs[3] = {jv_none(), jv_none(), jv_int(-1)};
            return slice(e, n, v, vs, out);
        }
        /* reversed(): an iterator; a generator is not reversible: list(value) reversed */
        bool gen = v.kind == JV_LIST && v.u.l->kind == JL_GEN;
        struct jlist *l, *c;
        if ((rc = as_list(e, n, v, &l)))
            return rc;
        if (!(c = jl_new(e->a, l->n)))
            return oom(e, n);
        for (size_t i = 0; i < l->n; i++)
            c->a[i] = l->a[l->n - 1 - i];
        c->n = l->n;
        c->kind = gen ? JL_LIST : JL_GEN;
        *out = mklist(c);
        return KVR_OK;
    }
    case JFL_SELECTATTR:
    case JFL_REJECTATTR:
    case JFL_SELECT:
    case JFL_REJECT:
        return select_items(e, n, v, a, f == JFL_SELECTATTR || f == JFL_REJECTATTR,
                            f == JFL_SELECTATTR || f == JFL_SELECT, out);
    case JFL_MAP: {
        struct jlist *l, *r;
        if (!jv_truthy(v)) /* Jinja: `if value:` */
            l = jl_new(e->a, 0);
        else if ((rc = as_list(e, n, v, &l)))
            return rc;
        if (!l)
            return oom(e, n);
        if (!(r = jl_new(e->a, l->n)))
            return oom(e, n);
        bool has_attr;
        struct jv attr = kwarg(a, "attribute", jv_none(), &has_attr);
        struct jv dflt = kwarg(a, "default", jv_undef(), NULL);
        int sub = -1;
        if (!has_attr) {
            if (a->npos != 1 || a->nkw || !is_str(a->pos[0]) ||
                (sub = filter_by_name(a->pos[0])) < 0)
                return fail(e, n, KVR_EINVAL,
                            "map: only attribute= or an argument-less "
                            "supported filter name is supported");
        }
        struct args none = {0};
        for (size_t i = 0; i < l->n; i++) {
            struct jv x;
            if (has_attr) {
                if ((rc = get_item(e, n, l->a[i], attr, &x)))
                    return rc;
                if (x.kind == JV_UNDEF && dflt.kind != JV_UNDEF)
                    x = dflt;
            } else if ((rc = apply_filter(e, n, sub, l->a[i], &none, &x))) {
                return rc;
            }
            r->a[r->n++] = x;
        }
        r->kind = JL_GEN;
        *out = mklist(r);
        return KVR_OK;
    }
    case JFL_INT: {
        struct jv d = arg(a, 0, "default", jv_int(0), NULL);
        if (v.kind == JV_INT) {
            *out = v;
        } else if (v.kind == JV_BOOL) {
            *out = jv_int(v.u.b);
        } else if (v.kind == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9e18) {
            *out = jv_int((int64_t)v.u.f);
        } else if (is_str(v)) {
            char buf[64];
            if (!num_text(v, buf)) {
                *out = d;
                return KVR_OK;
            }
            char *end;
            long long x = strtoll(buf, &end, 10);
            if (*end == 0 && !strchr(buf, ' ')) {
                *out = jv_int(x);
            } else {
                double fx = strtod(buf, &end);
                *out = (*end == 0 && isfinite(fx) && fabs(fx) < 9e18) ? jv_int((int64_t)fx) : d;
            }
        } else {
            *out = d;
        }
        return KVR_OK;
    }
    case JFL_FLOAT: {
        struct jv d = arg(a, 0, "default", jv_float(0), NULL);
        if (num(v))
            *out = jv_float(fval(v));
        else if (is_str(v)) {
            char buf[64];
            if (!num_text(v, buf)) {
                *out = d;
                return KVR_OK;
            }
            char *end;
            double fx = strtod(buf, &end);
            *out = *end == 0 ? jv_float(fx) : d;
        } else
            *out = d;
        return KVR_OK;
    }
    case JFL_ABS:
        if (v.kind == JV_INT) {
            if (v.u.i == INT64_MIN)
                return fail(e, n, KVR_ERANGE, "integer beyond 64 bits");
            *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        } else if (v.kind == JV_BOOL) {
            *out = jv_int(v.u.b);
        } else if (v.kind == JV_FLOAT) {
            *out = jv_float(fabs(v.u.f));
        } else {
            return fail(e, n, KVR_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
        }
        return KVR_OK;
    case JFL_UNIQUE:
    case JFL_SORT: {
        struct jlist *l, *r;
        if ((rc = as_list(e, n, v, &l)))
            return rc;
        if (!(r = jl_new(e->a, l->n)))
            return oom(e, n);
        for (size_t i = 0; i < l->n; i++) {
            if (l->a[i].kind == JV_STR && !ascii_only(l->a[i]))
                return fail(e, n, KVR_EINVAL, "sort/unique of non-ASCII text is not supported");
            if (l->a[i].kind == JV_STR) { /* case-insensitive by default: compare lowered */
                bool upper = false;
                for (size_t k = 0; k < l->a[i].u.s.n; k++)
                    upper |= l->a[i].u.s.p[k] >= 'A' && l->a[i].u.s.p[k] <= 'Z';
                if (upper)
                    return fail(e, n, KVR_EINVAL,
                                "sort/unique of text with capitals is not supported");
            }
            bool dup = false;
            if (f == JFL_UNIQUE)
                for (size_t k = 0; k < r->n && !dup; k++)
                    dup = jv_eq(r->a[k], l->a[i]);
            if (!dup)
                r->a[r->n++] = l->a[i];
        }
        if (f == JFL_SORT) {
            bool rev = jv_truthy(arg(a, 0, "reverse", jv_bool(false), NULL));
            if (a->npos > 1 || a->nkw > (size_t)(a->npos ? 0 : 1))
                return fail(e, n, KVR_EINVAL, "sort: only reverse is supported");
            for (size_t i = 1; i < r->n; i++) {
                struct jv x = r->a[i];
                size_t j = i;
                while (j > 0) {
                    int c;
                    if (jv_cmp(r->a[j - 1], x, &c) != KVR_OK)
                        return fail(e, n, KVR_EINVAL, "sort of values of different types");
                    if (rev ? c >= 0 : c <= 0)
                        break;
                    r->a[j] = r->a[j - 1];
                    j--;
                }
                r->a[j] = x;
            }
        }
        r->kind = f == JFL_UNIQUE ? JL_GEN : JL_LIST;
        *out = mklist(r);
        return KVR_OK;
    }
    default:
        return fail(e, n, KVR_EINVAL, "filter not implemented");
    }
}

static int exec_block(struct ev *e, const struct jnode *n);

/* A macro call: a scope of its own over the template's top-level variables (not the
 * caller's), the parameters bound (missing ones to their default or undefined), the body's
 * output captured as the call's string value. */
static int call_macro(struct ev *e, const struct jnode *n, const struct jnode *m,
                      const struct args *a, struct jv *out)
{
    if (a->npos > m->nkids)
        return fail(e, n, KVR_EINVAL, "macro '%.*s' takes not more than %zu argument(s)",
                    (int)m->name_len, m->name, m->nkids);
    for (size_t k = 0; k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->nkids; i++)
            known |= strlen(a->kwn[k]) == m->kids[i]->name_len &&
                     memcmp(a->kwn[k], m->kids[i]->name, m->kids[i]->name_len) == 0;
        if (!known)
            return fail(e, n, KVR_EINVAL, "macro '%.*s' takes no keyword argument '%s'",
                        (int)m->name_len, m->name, a->kwn[k]);
    }
    size_t frame = e->frame, vis_lo = e->vis_lo, base = e->nvars;
    struct jbuf saved = e->out;
    int ctl = e->ctl;
    e->frame = e->vis_lo = base;
    e->out = (struct jbuf){.max = e->o->max_output};
    e->ctl = 0;
    int rc = KVR_OK;
    for (size_t i = 0; i < m->nkids && !rc; i++) {
        const struct jnode *pm = m->kids[i];
        struct jv v = jv_undef();
        bool given = i < a->npos;
        if (given)
            v = a->pos[i];
        for (size_t k = 0; !given && k < a->nkw; k++)
            if (strlen(a->kwn[k]) == pm->name_len &&
                memcmp(a->kwn[k], pm->name, pm->name_len) == 0) {
                v = a->kwv[k];
                given = true;
            }
        if (!given && pm->a)
            rc = eval(e, pm->a, &v);
        if (!rc)
            rc = set_var(e, pm, pm->name, pm->name_len, v);
    }
    if (!rc)
        rc = exec_block(e, m->b);
    struct jbuf body = e->out;
    e->out = saved;
    e->nvars = base;
    e->frame = frame;
    e->vis_lo = vis_lo;
    e->ctl = ctl;
    if (rc) {
        free(body.p);
        return rc;
    }
    return buf_to_str(e, n, &body, out);
}

static int call(struct ev *e, const struct jnode *n, struct jv *out)
{
    struct jv fn;
    int rc = eval(e, n->a, &fn);
    if (rc)
        return rc;
    if (fn.kind != JV_FUNC && fn.kind != JV_MACRO)
        return fail(e, n, KVR_EINVAL, "'%.*s' is not callable", (int)n->a->name_len, n->a->name);
    struct args a;
    if ((rc = eval_args(e, n, &a)))
        return rc;
    if (fn.kind == JV_MACRO)
        return call_macro(e, n, fn.u.macro, &a, out);
    switch (fn.u.fn) {
    case JF_RAISE: {
        struct jv m = a.npos ? a.pos[0] : jv_undef();
        struct jv s;
        if ((rc = to_str(e, n, m, &s)))
            return rc;
        snprintf(e->err, e->errlen, "raise_exception: %.*s", (int)s.u.s.n, s.u.s.p);
        return KVR_EINVAL;
    }
    case JF_STRFTIME: {
        if (a.npos != 1 || !is_str(a.pos[0]) || a.pos[0].u.s.n > 200)
            return fail(e, n, KVR_EINVAL, "strftime_now takes one format string");
        char fmt[256], buf[512];
        memcpy(fmt, a.pos[0].u.s.p, a.pos[0].u.s.n);
        fmt[a.pos[0].u.s.n] = 0;
        time_t t = (time_t)e->o->now_s;
        struct tm tm;
        localtime_r(&t, &tm);
        size_t len = fmt[0] ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        if (fmt[0] && len == 0)
            return fail(e, n, KVR_EINVAL, "strftime_now: empty or too long result");
        char *s = ja_strdup(e->a, buf, len);
        if (!s)
            return oom(e, n);
        *out = jv_str(s, len);
        return KVR_OK;
    }
    case JF_NAMESPACE: {
        if (a.npos > 1 || (a.npos == 1 && a.pos[0].kind != JV_DICT))
            return fail(e, n, KVR_EINVAL, "namespace() takes keyword arguments or one dict");
        struct jdict *d = jd_new(e->a, a.nkw + (a.npos ? a.pos[0].u.d->n : 0));
        if (!d)
            return oom(e, n);
        if (a.npos)
            for (size_t i = 0; i < a.pos[0].u.d->n; i++)
                if (jd_set(e->a, d, a.pos[0].u.d->k[i], a.pos[0].u.d->v[i]))
                    return oom(e, n);
        for (size_t i = 0; i < a.nkw; i++) {
            if (a.kwv[i].kind == JV_LOOP)
                return fail(e, n, KVR_EINVAL, "storing the loop object is not supported");
            if (jd_set(e->a, d, jv_str(a.kwn[i], strlen(a.kwn[i])), a.kwv[i]))
                return oom(e, n);
        }
        *out = (struct jv){.kind = JV_NS, .u.d = d};
        return KVR_OK;
    }
    case JF_RANGE: {
        int64_t st = 0, en, step = 1;
        if (a.nkw || a.npos < 1 || a.npos > 3)
            return fail(e, n, KVR_EINVAL, "range takes 1 to 3 integer arguments");
        for (size_t i = 0; i < a.npos; i++)
            if (a.pos[i].kind != JV_INT)
                return fail(e, n, KVR_EINVAL, "range takes integers");
        if (a.npos == 1)
            en = a.pos[0].u.i;
        else {
            st = a.pos[0].u.i;
            en = a.pos[1].u.i;
            if (a.npos == 3)
                step = a.pos[2].u.i;
        }
        if (step == 0)
            return fail(e, n, KVR_EINVAL, "range() arg 3 must not be zero");
        struct jlist *l = jl_new(e->a, 0);
        if (!l)
            return oom(e, n);
        for (int64_t i = st; step > 0 ? i < en : i > en;) {
            if (l->n >= 100000) /* the sandbox's MAX_RANGE */
                return fail(e, n, KVR_ETOOBIG, "range too big");
            if (jl_push(e->a, l, jv_int(i)))
                return oom(e, n);
            if (__builtin_add_overflow(i, step, &i))
                break; /* the next would pass INT64's end, so also the range's */
        }
        l->kind = JL_RANGE;
        *out = mklist(l);
        return KVR_OK;
    }
    default:
        return fail(e, n, KVR_EINVAL, "function not implemented");
    }
}

static int eval(struct ev *e, const struct jnode *n, struct jv *out)
{
    if (++e->steps > e->o->max_steps)
        return fail(e, n, KVR_ETOOBIG, "render took more than %llu steps",
                    (unsigned long long)e->o->max_steps);
    if (++e->depth > e->o->max_depth) {
        e->depth--;
        return fail(e, n, KVR_ETOOBIG, "evaluation deeper than %d", e->o->max_depth);
    }
    int rc = KVR_OK;
    struct jv a, b;
    switch (n->kind) {
    case JE_CONST:
        *out = n->val;
        break;
    case JE_NAME:
        *out = lookup_name(e, n->name, n->name_len);
        break;
    case JE_ATTR:
        if (!(rc = eval(e, n->a, &a)))
            rc = get_attr(e, n, a, n->name, n->name_len, out);
        break;
    case JE_ITEM:
        if (!(rc = eval(e, n->a, &a)) && !(rc = eval(e, n->b, &b)))
            rc = get_item(e, n, a, b, out);
        break;
    case JE_SLICE: {
        struct jv vs[3] = {jv_none(), jv_none(), jv_none()};
        const struct jnode *parts[3] = {n->b, n->c, n->d};
        if ((rc = eval(e, n->a, &a)))
            break;
        for (int k = 0; k < 3 && !rc; k++)
            if (parts[k])
                rc = eval(e, parts[k], &vs[k]);
        if (!rc)
            rc = slice(e, n, a, vs, out);
        break;
    }
    case JE_CALL:
        rc = call(e, n, out);
        break;
    case JE_METHOD:
        rc = method(e, n, out);
        break;
    case JE_FILTER: {
        struct args ar;
        if (!(rc = eval(e, n->a, &a)) && !(rc = eval_args(e, n, &ar)))
            rc = apply_filter(e, n, n->op, a, &ar, out);
        break;
    }
    case JE_TEST: {
        struct args ar;
        bool r = false;
        if (!(rc = eval(e, n->a, &a)) && !(rc = eval_args(e, n, &ar)) &&
            !(rc = test(e, n, a, &ar, &r)))
            *out = jv_bool(r != n->negate);
        break;
    }
    case JE_BIN:
        if (!(rc = eval(e, n->a, &a)) && !(rc = eval(e, n->b, &b)))
            rc = binary(e, n, n->op, a, b, out);
        break;
    case JE_NOT:
        if (!(rc = eval(e, n->a, &a)))
            *out = jv_bool(!jv_truthy(a));
        break;
    case JE_NEG:
    case JE_POS:
        if ((rc = eval(e, n->a, &a)))
            break;
        if (a.kind == JV_FLOAT)
            *out = jv_float(n->kind == JE_NEG ? -a.u.f : a.u.f);
        else if (a.kind == JV_INT || a.kind == JV_BOOL) {
            int64_t i = ival(a);
            if (n->kind == JE_NEG && i == INT64_MIN)
                rc = fail(e, n, KVR_ERANGE, "integer beyond 64 bits");
            *out = jv_int(n->kind == JE_NEG ? -i : i);
        } else
            rc = fail(e, n, KVR_EINVAL, "bad operand type for unary -: '%s'", jv_type_name(a));
        break;
    case JE_AND:
    case JE_OR:
        if ((rc = eval(e, n->a, &a)))
            break;
        if (jv_truthy(a) == (n->kind == JE_OR))
            *out = a;
        else
            rc = eval(e, n->b, out);
        break;
    case JE_COND:
        if ((rc = eval(e, n->b, &a)))
            break;
        if (jv_truthy(a))
            rc = eval(e, n->a, out);
        else if (n->c)
            rc = eval(e, n->c, out);
        else
            *out = jv_undef();
        break;
    case JE_LIST:
    case JE_TUPLE: {
        struct jlist *l = jl_new(e->a, n->nkids);
        if (!l) {
            rc = oom(e, n);
            break;
        }
        l->kind = n->kind == JE_TUPLE ? JL_TUPLE : JL_LIST;
        for (size_t i = 0; i < n->nkids && !rc; i++) {
            rc = eval(e, n->kids[i], &l->a[i]);
            l->n = i + 1;
        }
        *out = mklist(l);
        break;
    }
    case JE_DICT: {
        struct jdict *d = jd_new(e->a, n->nkids / 2);
        if (!d) {
            rc = oom(e, n);
            break;
        }
        for (size_t i = 0; i + 1 < n->nkids && !rc; i += 2) {
            if (!(rc = eval(e, n->kids[i], &a)) && !(rc = eval(e, n->kids[i + 1], &b))) {
                if (a.kind == JV_LIST || a.kind == JV_DICT || a.kind == JV_UNDEF || a.kind == JV_NS)
                    rc = fail(e, n, KVR_EINVAL, "unhashable type: '%s'", jv_type_name(a));
                else if (jd_set(e->a, d, a, b))
                    rc = oom(e, n);
            }
        }
        *out = (struct jv){.kind = JV_DICT, .u.d = d};
        break;
    }
    case JE_CMP: {
        if ((rc = eval(e, n->a, &a)))
            break;
        bool r = true;
        for (size_t i = 0; i < n->nkids && r && !rc; i++) {
            if ((rc = eval(e, n->kids[i], &b)))
                break;
            rc = compare_op(e, n, n->ops[i], a, b, &r);
            a = b;
        }
        *out = jv_bool(r);
        break;
    }
    default:
        rc = fail(e, n, KVR_EINVAL, "internal: not an expression");
    }
    e->depth--;
    return rc;
}

/* --- statements ----------------------------------------------------------------------------- */

static int emit(struct ev *e, const struct jnode *n, const char *p, size_t len)
{
    jb_put(&e->out, p, len);
    if (e->out.err)
        return fail(e, n, e->out.err == KVR_ETOOBIG ? KVR_ETOOBIG : KVR_ENOMEM,
                    "output longer than %zu bytes", e->o->max_output);
    return KVR_OK;
}

static int bind_targets(struct ev *e, const struct jnode *n, struct jv item)
{
    if (n->nkids == 1)
        return set_var(e, n, n->kids[0]->name, n->kids[0]->name_len, item);
    struct jlist *l = NULL;
    if (item.kind == JV_LIST)
        l = item.u.l;
    else if (item.kind == JV_STR) {
        int rc = as_list(e, n, item, &l);
        if (rc)
            return rc;
    }
    if (!l || l->n != n->nkids)
        return fail(e, n, KVR_EINVAL, "cannot unpack the loop item into %zu names", n->nkids);
    for (size_t i = 0; i < n->nkids; i++) {
        int rc = set_var(e, n, n->kids[i]->name, n->kids[i]->name_len, l->a[i]);
        if (rc)
            return rc;
    }
    return KVR_OK;
}

static int exec_for(struct ev *e, const struct jnode *n)
{
    struct jv it;
    int rc = eval(e, n->a, &it);
    if (rc)
        return rc;
    struct jlist *items;
    if ((rc = as_list(e, n, it, &items)))
        return rc;
    size_t outer = e->frame, base = e->nvars;
    if (n->d) { /* the `if` filter, before loop.length is known */
        struct jlist *kept = jl_new(e->a, 0);
        if (!kept)
            return oom(e, n);
        for (size_t i = 0; i < items->n; i++) {
            e->frame = base;
            struct jv c;
            rc = bind_targets(e, n, items->a[i]);
            if (!rc)
                rc = eval(e, n->d, &c);
            e->nvars = base;
            e->frame = outer;
            if (rc)
                return rc;
            if (jv_truthy(c) && jl_push(e->a, kept, items->a[i]))
                return oom(e, n);
        }
        items = kept;
    }
    struct jloop lp = {.length = (int64_t)items->n, .items = items};
    for (size_t i = 0; i < items->n; i++) {
        if (++e->steps > e->o->max_steps)
            return fail(e, n, KVR_ETOOBIG, "render took more than %llu steps",
                        (unsigned long long)e->o->max_steps);
        lp.index0 = (int64_t)i;
        e->frame = base;
        rc = set_var(e, n, "loop", 4, (struct jv){.kind = JV_LOOP, .u.loop = &lp});
        if (!rc)
            rc = bind_targets(e, n, items->a[i]);
        if (!rc)
            rc = exec_block(e, n->b);
        e->nvars = base;
        e->frame = outer;
        if (rc)
            return rc;
        if (e->ctl == 1) {
            e->ctl = 0;
            break;
        }
        e->ctl = 0;
    }
    if (items->n == 0 && n->c)
        return exec_block(e, n->c);
    return KVR_OK;
}

static int exec_stmt(struct ev *e, const struct jnode *n)
{
    if (++e->steps > e->o->max_steps)
        return fail(e, n, KVR_ETOOBIG, "render took more than %llu steps",
                    (unsigned long long)e->o->max_steps);
    struct jv v;
    int rc;
    switch (n->kind) {
    case JN_TEXT:
        return emit(e, n, n->name, n->name_len);
    case JN_OUT:
        if ((rc = eval(e, n->a, &v)))
            return rc;
        if (v.kind == JV_STR)
            return emit(e, n, v.u.s.p, v.u.s.n);
        if ((rc = to_str(e, n, v, &v)))
            return rc;
        return emit(e, n, v.u.s.p, v.u.s.n);
    case JN_IF:
        if ((rc = eval(e, n->a, &v)))
            return rc;
        if (jv_truthy(v))
            return exec_block(e, n->b);
        if (n->c)
            return n->c->kind == JN_IF ? exec_stmt(e, n->c) : exec_block(e, n->c);
        return KVR_OK;
    case JN_FOR: {
        if (++e->depth > e->o->max_depth) {
            e->depth--;
            return fail(e, n, KVR_ETOOBIG, "evaluation deeper than %d", e->o->max_depth);
        }
        rc = exec_for(e, n);
        e->depth--;
        return rc;
    }
    case JN_SET:
        if ((rc = eval(e, n->a, &v)))
            return rc;
        if (v.kind == JV_LOOP)
            return fail(e, n, KVR_EINVAL, "storing the loop object is not supported");
        return set_var(e, n, n->name, n->name_len, v);
    case JN_SETATTR: {
        struct jv ns = lookup_name(e, n->name, n->name_len);
        if (ns.kind != JV_NS)
            return fail(e, n, KVR_EINVAL, "Cannot assign attribute on non-namespace object");
        if ((rc = eval(e, n->a, &v)))
            return rc;
        if (v.kind == JV_LOOP)
            return fail(e, n, KVR_EINVAL, "storing the loop object is not supported");
        if (jd_set(e->a, ns.u.d, jv_str(n->attr, n->attr_len), v))
            return oom(e, n);
        return KVR_OK;
    }
    case JN_MACRO:
        return set_var(e, n, n->name, n->name_len, (struct jv){.kind = JV_MACRO, .u.macro = n});
    case JN_BREAK:
        e->ctl = 1;
        return KVR_OK;
    case JN_CONTINUE:
        e->ctl = 2;
        return KVR_OK;
    case JN_BLOCK:
        return exec_block(e, n);
    default:
        return fail(e, n, KVR_EINVAL, "internal: not a statement");
    }
}

static int exec_block(struct ev *e, const struct jnode *n)
{
    if (++e->depth > e->o->max_depth) {
        e->depth--;
        return fail(e, n, KVR_ETOOBIG, "evaluation deeper than %d", e->o->max_depth);
    }
    int rc = KVR_OK;
    for (size_t i = 0; i < n->nkids && !rc && !e->ctl; i++)
        rc = exec_stmt(e, n->kids[i]);
    e->depth--;
    return rc;
}

int jinja_render(const struct jnode *root, struct jarena *a, const struct jvar *vars, size_t nvars,
                 const struct jrender_opts *o, char **out, size_t *out_len, char *err,
                 size_t errlen)
{
    struct ev e = {.a = a, .o = o, .out = {.max = o->max_output}, .err = err, .errlen = errlen};
    void *buf = NULL;
    if (kvr_grow(&buf, &e.cap, nvars + 16, MAX_VARS, sizeof *e.vars) != KVR_OK) {
        snprintf(err, errlen, "too many variables");
        return KVR_ETOOBIG;
    }
    e.vars = buf;
    if (nvars)
        memcpy(e.vars, vars, nvars * sizeof *vars);
    e.nvars = e.top_end = nvars;
    int rc = exec_block(&e, root);
    free(e.vars);
    if (rc) {
        free(e.out.p);
        return rc;
    }
    if (!e.out.p) {
        e.out.p = malloc(1);
        if (!e.out.p)
            return KVR_ENOMEM;
        e.out.p[0] = 0;
    }
    *out = e.out.p;
    *out_len = e.out.n;
    return KVR_OK;
}

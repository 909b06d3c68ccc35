/*
 * jinja_parse.c: tokens to an AST, with Jinja 3.1's grammar and precedence (inline if, or,
 * and, not, comparisons (chained, in, not in), + -, ~, * / // %, **, unary - +, then postfix
 * .attr [index] [a:b:c] (call), filters |f(args) and tests `is [not] t`), and the statements
 * a chat template uses: if/elif/else, for (tuple targets, `if` filter, else), set (a name or a
 * namespace attribute), break, continue. Everything else is REFUSED here, naming the construct
 * and its line ("template line 12: filter \"wordcount\" is not supported"), so a template
 * either renders as Jinja would or does not load.
 *
 * Invariants: the tree is in the template's arena and read-only after this returns; every
 * filter, test, method and function name in it is one the interpreter implements; nesting
 * (statements and expressions) is bounded by max_depth. Ownership: the arena owns the tree.
 * Threads: none. Cost: O(tokens).
 */
#include "tokenizer/jinja.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter/status.h"

struct ps {
    struct jarena *a;
    const struct jtok *t;
    size_t nt, i;
    int depth, max_depth, in_for, in_macro;
    const struct jtok *macros[64]; /* names of the template's macros (callable) */
    size_t nmacros;
    char *err;
    size_t errlen;
    int rc;
};

static const struct jtok *cur(struct ps *p) { return &p->t[p->i]; }

static void *perr(struct ps *p, int line, const char *fmt, ...)
{
    if (p->rc)
        return NULL;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errlen, "template line %d: %s", line, msg);
    p->rc = KVR_EPARSE;
    return NULL;
}

static struct jnode *node(struct ps *p, int kind, int line)
{
    struct jnode *n = ja_alloc(p->a, sizeof *n);
    if (!n) {
        if (!p->rc) {
            snprintf(p->err, p->errlen, "template line %d: template too large", line);
            p->rc = KVR_ETOOBIG;
        }
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

static bool is_op(struct ps *p, const char *op)
{
    const struct jtok *t = cur(p);
    return t->kind == JT_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}
static bool is_name(struct ps *p, const char *nm)
{
    const struct jtok *t = cur(p);
    return t->kind == JT_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0;
}
static bool tok_is_name(const struct jtok *t, const char *nm)
{
    return t->kind == JT_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0;
}
static bool expect_op(struct ps *p, const char *op)
{
    if (!is_op(p, op)) {
        perr(p, cur(p)->line, "expected '%s'", op);
        return false;
    }
    p->i++;
    return true;
}

/* Small growable node arrays in the arena. */
struct nvec {
    struct jnode **a;
    size_t n, cap;
};
static bool nv_push(struct ps *p, struct nvec *v, struct jnode *x)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        struct jnode **na = ja_alloc(p->a, nc * sizeof *na);
        if (!na) {
            perr(p, cur(p)->line, "template too large");
            return false;
        }
        if (v->n)
            memcpy(na, v->a, v->n * sizeof *na);
        v->a = na;
        v->cap = nc;
    }
    v->a[v->n++] = x;
    return true;
}

static int lookup(const char *const *names, size_t count, const char *s, size_t n)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
            return (int)i;
    return -1;
}

static const char *const FILTERS[] = {
    "trim",       "length", "tojson",  "items",  "string", "upper", "lower",
    "default",    "join",   "replace", "first",  "last",   "list",  "selectattr",
    "rejectattr", "map",    "reverse", "int",    "float",  "abs",   "capitalize",
    "safe",       "select", "reject",  "unique", "sort",   "title"};
static const char *const TESTS[] = {
    "defined",  "undefined",   "none",     "string", "mapping", "sequence", "number",
    "iterable", "boolean",     "true",     "false",  "integer", "float",    "eq",
    "ne",       "lt",          "le",       "gt",     "ge",      "in",       "odd",
    "even",     "divisibleby", "callable", "lower",  "upper",   "sameas"};
static const char *const METHODS[] = {
    "startswith", "endswith",   "strip", "lstrip", "rstrip", "split",  "upper", "lower", "replace",
    "title",      "capitalize", "find",  "items",  "keys",   "values", "get",   "rsplit"};
static const char *const FUNCS[] = {"raise_exception", "strftime_now", "namespace", "range"};
static const char *const LOOPATTR[] = {"index",    "index0",    "first",    "last",    "length",
                                       "revindex", "revindex0", "previtem", "nextitem"};

static int filter_alias(const char *s, size_t n)
{
    if (n == 1 && s[0] == 'd')
        return JFL_DEFAULT;
    if (n == 5 && memcmp(s, "count", 5) == 0)
        return JFL_LENGTH;
    if ((n == 1 && s[0] == 'e') || (n == 4 && memcmp(s, "safe", 4) == 0))
        return -2; /* escape, safe: Markup, whose + and ~ escape the other side */
    return lookup(FILTERS, sizeof FILTERS / sizeof FILTERS[0], s, n);
}
static int test_alias(const char *s, size_t n)
{
    static const struct {
        const char *name;
        int id;
    } al[] = {{"equalto", JTS_EQ},  {"==", JTS_EQ},          {"!=", JTS_NE},
              {"lessthan", JTS_LT}, {"greaterthan", JTS_GT}, {"<", JTS_LT},
              {"<=", JTS_LE},       {">", JTS_GT},           {">=", JTS_GE}};
    for (size_t i = 0; i < sizeof al / sizeof al[0]; i++)
        if (strlen(al[i].name) == n && memcmp(al[i].name, s, n) == 0)
            return al[i].id;
    return lookup(TESTS, sizeof TESTS / sizeof TESTS[0], s, n);
}

static struct jnode *expr(struct ps *p, bool condexpr);
static struct jnode *parse_tuple(struct ps *p, bool condexpr);
static struct jnode *unary(struct ps *p, bool with_filter);

static bool enter(struct ps *p)
{
    if (++p->depth > p->max_depth) {
        perr(p, cur(p)->line, "nesting deeper than %d", p->max_depth);
        return false;
    }
    return true;
}

/* (args) after the '(' : positional and keyword arguments into n->kids / n->kwn / n->kwv. */
static bool call_args(struct ps *p, struct jnode *n)
{
    struct nvec pos = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t kwcap = 0;
    while (!is_op(p, ")")) {
        if (pos.n + kwv.n)
            if (!expect_op(p, ","))
                return false;
        if (is_op(p, ")"))
            break;
        if (is_op(p, "*") || is_op(p, "**")) {
            perr(p, cur(p)->line, "*args and **kwargs are not supported");
            return false;
        }
        if (cur(p)->kind == JT_NAME && p->i + 1 < p->nt && p->t[p->i + 1].kind == JT_OP &&
            p->t[p->i + 1].n == 1 && p->t[p->i + 1].p[0] == '=') {
            const struct jtok *nm = cur(p);
            p->i += 2;
            struct jnode *v = expr(p, true);
            if (!v)
                return false;
            if (kwv.n == kwcap) {
                size_t nc = kwcap ? kwcap * 2 : 4;
                const char **na = ja_alloc(p->a, nc * sizeof *na);
                if (!na)
                    return perr(p, nm->line, "template too large"), false;
                if (kwv.n)
                    memcpy(na, kwn, kwv.n * sizeof *na);
                kwn = na;
                kwcap = nc;
            }
            kwn[kwv.n] = ja_strdup(p->a, nm->p, nm->n);
            if (!kwn[kwv.n] || !nv_push(p, &kwv, v))
                return false;
        } else {
            if (kwv.n)
                return perr(p, cur(p)->line, "positional argument follows keyword argument"), false;
            struct jnode *v = expr(p, true);
            if (!v || !nv_push(p, &pos, v))
                return false;
        }
    }
    p->i++;
    n->kids = pos.a;
    n->nkids = pos.n;
    n->kwn = kwn;
    n->kwv = kwv.a;
    n->nkw = kwv.n;
    return true;
}

static struct jnode *primary(struct ps *p)
{
    const struct jtok *t = cur(p);
    struct jnode *n;
    switch (t->kind) {
    case JT_NAME:
        p->i++;
        n = node(p, JE_CONST, t->line);
        if (!n)
            return NULL;
        if (tok_is_name(t, "true") || tok_is_name(t, "True")) {
            n->val = jv_bool(true);
        } else if (tok_is_name(t, "false") || tok_is_name(t, "False")) {
            n->val = jv_bool(false);
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            n->val = jv_none();
        } else {
            n->kind = JE_NAME;
            n->name = t->p;
            n->name_len = t->n;
            if (p->in_macro &&
                (tok_is_name(t, "caller") || tok_is_name(t, "varargs") || tok_is_name(t, "kwargs")))
                return perr(p, t->line, "\"%.*s\" in a macro is not supported", (int)t->n, t->p);
        }
        return n;
    case JT_STRING: {
        /* adjacent string literals concatenate */
        size_t total = 0, j = p->i;
        while (p->t[j].kind == JT_STRING)
            total += p->t[j++].n;
        char *s = ja_alloc(p->a, total + 1);
        n = node(p, JE_CONST, t->line);
        if (!s || !n)
            return perr(p, t->line, "template too large");
        size_t k = 0;
        while (cur(p)->kind == JT_STRING) {
            memcpy(s + k, cur(p)->p, cur(p)->n);
            k += cur(p)->n;
            p->i++;
        }
        s[k] = 0;
        n->val = jv_str(s, k);
        return n;
    }
    case JT_INT:
    case JT_FLOAT:
        p->i++;
        n = node(p, JE_CONST, t->line);
        if (n)
            n->val = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    case JT_OP:
        if (is_op(p, "(")) {
            p->i++;
            if (is_op(p, ")")) { /* () : the empty tuple */
                p->i++;
                n = node(p, JE_TUPLE, t->line);
                return n;
            }
            n = parse_tuple(p, true);
            if (!n || !expect_op(p, ")"))
                return NULL;
            return n;
        }
        if (is_op(p, "[") || is_op(p, "{")) {
            bool dict = is_op(p, "{");
            p->i++;
            struct nvec items = {0};
            const char *close = dict ? "}" : "]";
            while (!is_op(p, close)) {
                if (items.n && !expect_op(p, ","))
                    return NULL;
                if (is_op(p, close))
                    break;
                struct jnode *k = expr(p, true);
                if (!k || !nv_push(p, &items, k))
                    return NULL;
                if (dict) {
                    if (!expect_op(p, ":"))
                        return NULL;
                    struct jnode *v = expr(p, true);
                    if (!v || !nv_push(p, &items, v))
                        return NULL;
                }
            }
            p->i++;
            n = node(p, dict ? JE_DICT : JE_LIST, t->line);
            if (n) {
                n->kids = items.a;
                n->nkids = items.n;
            }
            return n;
        }
        return perr(p, t->line, "unexpected '%.*s'", (int)t->n, t->p);
    case JT_EOF:
        return perr(p, t->line, "unexpected end of template");
    default:
        return perr(p, t->line, "unexpected end of tag");
    }
}

/* [ ... ] after the '[': an index or a slice */
static struct jnode *subscript(struct ps *p, struct jnode *obj, int line)
{
    struct jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(p, ":")) {
            slice = true;
            if (++k > 2)
                return perr(p, line, "a slice has at most three parts");
            p->i++;
            continue;
        }
        if (is_op(p, "]"))
            break;
        if (parts[k])
            return perr(p, cur(p)->line, "expected ':' or ']'");
        parts[k] = expr(p, true);
        if (!parts[k])
            return NULL;
        if (!slice && is_op(p, ","))
            return perr(p, line, "tuple subscripts are not supported");
    }
    p->i++;
    struct jnode *n;
    if (slice) {
        n = node(p, JE_SLICE, line);
        if (!n)
            return NULL;
        n->a = obj;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    } else {
        if (!parts[0])
            return perr(p, line, "empty subscript");
        n = node(p, JE_ITEM, line);
        if (!n)
            return NULL;
        n->a = obj;
        n->b = parts[0];
    }
    return n;
}

static struct jnode *postfix(struct ps *p, struct jnode *n)
{
    while (n) {
        const struct jtok *t = cur(p);
        if (is_op(p, ".")) {
            p->i++;
            const struct jtok *nm = cur(p);
            if (nm->kind == JT_INT) { /* a.0 */
                p->i++;
                struct jnode *c = node(p, JE_CONST, nm->line), *x = node(p, JE_ITEM, nm->line);
                if (!c || !x)
                    return NULL;
                c->val = jv_int(nm->i);
                x->a = n;
                x->b = c;
                n = x;
                continue;
            }
            if (nm->kind != JT_NAME)
                return perr(p, nm->line, "expected a name after '.'");
            p->i++;
            if (is_op(p, "(")) {
                int m = lookup(METHODS, sizeof METHODS / sizeof METHODS[0], nm->p, nm->n);
                if (m < 0)
                    return perr(p, nm->line, "method \"%.*s\" is not supported", (int)nm->n, nm->p);
                p->i++;
                struct jnode *x = node(p, JE_METHOD, nm->line);
                if (!x)
                    return NULL;
                x->a = n;
                x->op = m;
                x->name = nm->p;
                x->name_len = nm->n;
                if (!call_args(p, x))
                    return NULL;
                n = x;
                continue;
            }
            if (p->in_for && n->kind == JE_NAME && n->name_len == 4 &&
                memcmp(n->name, "loop", 4) == 0 &&
                lookup(LOOPATTR, sizeof LOOPATTR / sizeof LOOPATTR[0], nm->p, nm->n) < 0)
                return perr(p, nm->line, "loop.%.*s is not supported", (int)nm->n, nm->p);
            struct jnode *x = node(p, JE_ATTR, nm->line);
            if (!x)
                return NULL;
            x->a = n;
            x->name = nm->p;
            x->name_len = nm->n;
            n = x;
        } else if (is_op(p, "[")) {
            p->i++;
            n = subscript(p, n, t->line);
        } else if (is_op(p, "(")) {
            if (n->kind != JE_NAME)
                return perr(p, t->line, "only calls of functions and methods are supported");
            int f = lookup(FUNCS, sizeof FUNCS / sizeof FUNCS[0], n->name, n->name_len);
            for (size_t m = 0; f < 0 && m < p->nmacros; m++)
                if (p->macros[m]->n == n->name_len &&
                    memcmp(p->macros[m]->p, n->name, n->name_len) == 0)
                    f = -2; /* a macro: called by name at render time */
            if (f == -1)
                return perr(p, t->line, "function \"%.*s\" is not supported", (int)n->name_len,
                            n->name);
            p->i++;
            struct jnode *x = node(p, JE_CALL, t->line);
            if (!x)
                return NULL;
            x->op = f;
            x->a = n;
            if (!call_args(p, x))
                return NULL;
            n = x;
        } else {
            break;
        }
    }
    return n;
}

static struct jnode *filter_expr(struct ps *p, struct jnode *n)
{
    while (n) {
        if (is_op(p, "|")) {
            p->i++;
            const struct jtok *nm = cur(p);
            if (nm->kind != JT_NAME)
                return perr(p, nm->line, "expected a filter name after '|'");
            p->i++;
            while (is_op(p, ".")) /* dotted filter names */
                return perr(p, nm->line, "filter \"%.*s.\" is not supported", (int)nm->n, nm->p);
            int f = filter_alias(nm->p, nm->n);
            if (f < 0)
                return perr(p, nm->line, "filter \"%.*s\" is not supported", (int)nm->n, nm->p);
            struct jnode *x = node(p, JE_FILTER, nm->line);
            if (!x)
                return NULL;
            x->op = f;
            x->a = n;
            x->name = nm->p;
            x->name_len = nm->n;
            if (is_op(p, "(")) {
                p->i++;
                if (!call_args(p, x))
                    return NULL;
            }
            n = x;
        } else if (is_name(p, "is")) {
            int line = cur(p)->line;
            p->i++;
            bool neg = false;
            if (is_name(p, "not")) {
                neg = true;
                p->i++;
            }
            const struct jtok *nm = cur(p);
            if (nm->kind != JT_NAME &&
                !(nm->kind == JT_OP && (is_op(p, "==") || is_op(p, "!=") || is_op(p, "<") ||
                                        is_op(p, ">") || is_op(p, "<=") || is_op(p, ">="))))
                return perr(p, nm->line, "expected a test name after 'is'");
            p->i++;
            int tst = test_alias(nm->p, nm->n);
            if (tst < 0)
                return perr(p, nm->line, "test \"%.*s\" is not supported", (int)nm->n, nm->p);
            struct jnode *x = node(p, JE_TEST, line);
            if (!x)
                return NULL;
            x->op = tst;
            x->negate = neg;
            x->a = n;
            x->name = nm->p;
            x->name_len = nm->n;
            const struct jtok *nx = cur(p);
            if (is_op(p, "(")) {
                p->i++;
                if (!call_args(p, x))
                    return NULL;
            } else if ((nx->kind == JT_NAME && !tok_is_name(nx, "else") && !tok_is_name(nx, "or") &&
                        !tok_is_name(nx, "and") && !tok_is_name(nx, "is") &&
                        !tok_is_name(nx, "if") && !tok_is_name(nx, "in") &&
                        !tok_is_name(nx, "not")) ||
                       nx->kind == JT_STRING || nx->kind == JT_INT || nx->kind == JT_FLOAT ||
                       is_op(p, "[") || is_op(p, "{")) {
                /* one argument without parentheses: `is divisibleby 3`, `is sameas false` */
                struct jnode *arg = postfix(p, primary(p));
                if (!arg)
                    return NULL;
                x->kids = ja_alloc(p->a, sizeof *x->kids);
                if (!x->kids)
                    return perr(p, line, "template too large");
                x->kids[0] = arg;
                x->nkids = 1;
            }
            n = x;
        } else if (is_op(p, "(")) {
            n = postfix(p, n);
        } else {
            break;
        }
    }
    return n;
}

static struct jnode *unary(struct ps *p, bool with_filter)
{
    if (!enter(p))
        return NULL;
    struct jnode *n;
    int line = cur(p)->line;
    if (is_op(p, "-") || is_op(p, "+")) {
        bool neg = is_op(p, "-");
        p->i++;
        n = node(p, neg ? JE_NEG : JE_POS, line);
        if (n && !(n->a = unary(p, false)))
            n = NULL;
    } else {
        n = primary(p);
    }
    n = postfix(p, n);
    if (with_filter)
        n = filter_expr(p, n);
    p->depth--;
    return n;
}

static struct jnode *binop(struct ps *p, struct jnode *l, int op, struct jnode *r, int line)
{
    if (!l || !r)
        return NULL;
    struct jnode *n = node(p, JE_BIN, line);
    if (n) {
        n->op = op;
        n->a = l;
        n->b = r;
    }
    return n;
}

static struct jnode *power(struct ps *p)
{
    struct jnode *n = unary(p, true);
    while (n && is_op(p, "**")) {
        int line = cur(p)->line;
        p->i++;
        n = binop(p, n, 'P', unary(p, true), line);
    }
    return n;
}
static struct jnode *math2(struct ps *p)
{
    struct jnode *n = power(p);
    while (n && (is_op(p, "*") || is_op(p, "/") || is_op(p, "//") || is_op(p, "%"))) {
        int line = cur(p)->line;
        int op = is_op(p, "//") ? 'F' : cur(p)->p[0];
        p->i++;
        n = binop(p, n, op, power(p), line);
    }
    return n;
}
static struct jnode *concat(struct ps *p)
{
    struct jnode *n = math2(p);
    while (n && is_op(p, "~")) {
        int line = cur(p)->line;
        p->i++;
        n = binop(p, n, '~', math2(p), line);
    }
    return n;
}
static struct jnode *math1(struct ps *p)
{
    struct jnode *n = concat(p);
    while (n && (is_op(p, "+") || is_op(p, "-"))) {
        int line = cur(p)->line;
        int op = cur(p)->p[0];
        p->i++;
        n = binop(p, n, op, concat(p), line);
    }
    return n;
}
static struct jnode *compare(struct ps *p)
{
    int line = cur(p)->line;
    struct jnode *l = math1(p);
    if (!l)
        return NULL;
    struct nvec ops = {0};
    int opsv[64];
    for (;;) {
        int op = -1;
        if (is_op(p, "=="))
            op = JC_EQ;
        else if (is_op(p, "!="))
            op = JC_NE;
        else if (is_op(p, "<"))
            op = JC_LT;
        else if (is_op(p, "<="))
            op = JC_LE;
        else if (is_op(p, ">"))
            op = JC_GT;
        else if (is_op(p, ">="))
            op = JC_GE;
        else if (is_name(p, "in"))
            op = JC_IN;
        else if (is_name(p, "not") && p->i + 1 < p->nt && tok_is_name(&p->t[p->i + 1], "in")) {
            op = JC_NOTIN;
            p->i++;
        }
        if (op < 0)
            break;
        p->i++;
        if (ops.n >= 64)
            return perr(p, line, "too many chained comparisons");
        opsv[ops.n] = op;
        struct jnode *r = math1(p);
        if (!r || !nv_push(p, &ops, r))
            return NULL;
    }
    if (!ops.n)
        return l;
    struct jnode *n = node(p, JE_CMP, line);
    int *o = ja_alloc(p->a, ops.n * sizeof *o);
    if (!n || !o)
        return perr(p, line, "template too large");
    memcpy(o, opsv, ops.n * sizeof *o);
    n->a = l;
    n->kids = ops.a;
    n->nkids = ops.n;
    n->ops = o;
    return n;
}
static struct jnode *not_expr(struct ps *p)
{
    if (is_name(p, "not")) {
        int line = cur(p)->line;
        p->i++;
        if (!enter(p))
            return NULL;
        struct jnode *n = node(p, JE_NOT, line);
        if (n && !(n->a = not_expr(p)))
            n = NULL;
        p->depth--;
        return n;
    }
    return compare(p);
}
/* a and b ... (or: a or b ...), left-associative */
static struct jnode *logic(struct ps *p, bool is_or)
{
    struct jnode *n = is_or ? logic(p, false) : not_expr(p);
    while (n && is_name(p, is_or ? "or" : "and")) {
        struct jnode *x = node(p, is_or ? JE_OR : JE_AND, cur(p)->line);
        p->i++;
        if (!x)
            return NULL;
        x->a = n;
        if (!(x->b = is_or ? logic(p, false) : not_expr(p)))
            return NULL;
        n = x;
    }
    return n;
}
static struct jnode *expr(struct ps *p, bool condexpr)
{
    if (!enter(p))
        return NULL;
    struct jnode *n = logic(p, true);
    while (condexpr && n && is_name(p, "if")) {
        struct jnode *x = node(p, JE_COND, cur(p)->line);
        p->i++;
        if (!x)
            return NULL;
        x->a = n;
        if (!(x->b = logic(p, true)))
            return NULL;
        if (is_name(p, "else")) {
            p->i++;
            if (!(x->c = expr(p, true)))
                return NULL;
        }
        n = x;
    }
    p->depth--;
    return n;
}

/* a or a, b, ... (a tuple) */
static struct jnode *parse_tuple(struct ps *p, bool condexpr)
{
    int line = cur(p)->line;
    struct jnode *first = expr(p, condexpr);
    if (!first || !is_op(p, ","))
        return first;
    struct nvec items = {0};
    if (!nv_push(p, &items, first))
        return NULL;
    while (is_op(p, ",")) {
        p->i++;
        const struct jtok *t = cur(p);
        if (t->kind == JT_BLOCK_END || t->kind == JT_VAR_END || is_op(p, ")") || is_name(p, "in") ||
            is_name(p, "if"))
            break;
        struct jnode *x = expr(p, condexpr);
        if (!x || !nv_push(p, &items, x))
            return NULL;
    }
    struct jnode *n = node(p, JE_TUPLE, line);
    if (n) {
        n->kids = items.a;
        n->nkids = items.n;
    }
    return n;
}

/* --- statements ------------------------------------------------------------------------ */
static bool block_end(struct ps *p)
{
    if (cur(p)->kind != JT_BLOCK_END) {
        perr(p, cur(p)->line, "expected '%%}'");
        return false;
    }
    p->i++;
    return true;
}

/* Statements until {% <one of ends> %}; leaves the cursor on the ending name. */
static struct jnode *body(struct ps *p, const char *const *ends, size_t nends, int *which);

/* After {% else: the %}, the block to {% <end> %}, the %}; into *c. */
static bool else_block(struct ps *p, const char *end, struct jnode **c)
{
    int which;
    const char *const ends[] = {end};
    if (!block_end(p) || !(*c = body(p, ends, 1, &which)))
        return false;
    p->i++;
    return true;
}

static struct jnode *stmt_if(struct ps *p, int line)
{
    struct jnode *n = node(p, JN_IF, line);
    if (!n || !(n->a = expr(p, true)) || !block_end(p))
        return NULL;
    static const char *const ends[] = {"elif", "else", "endif"};
    int which;
    if (!(n->b = body(p, ends, 3, &which)))
        return NULL;
    int eline = cur(p)->line;
    p->i++;
    if (which == 0) {
        n->c = stmt_if(p, eline);
        return n->c ? n : NULL;
    }
    if (which == 1 && !else_block(p, "endif", &n->c))
        return NULL;
    return block_end(p) ? n : NULL;
}

static struct jnode *stmt_for(struct ps *p, int line)
{
    struct jnode *n = node(p, JN_FOR, line);
    if (!n)
        return NULL;
    /* targets: a name or names separated by commas, optionally parenthesized */
    struct nvec tg = {0};
    bool paren = is_op(p, "(");
    if (paren)
        p->i++;
    for (;;) {
        const struct jtok *t = cur(p);
        if (t->kind != JT_NAME)
            return perr(p, t->line, "expected a loop variable name");
        struct jnode *x = node(p, JE_NAME, t->line);
        if (!x)
            return NULL;
        x->name = t->p;
        x->name_len = t->n;
        p->i++;
        if (!nv_push(p, &tg, x))
            return NULL;
        if (!is_op(p, ","))
            break;
        p->i++;
    }
    if (paren && !expect_op(p, ")"))
        return NULL;
    if (!is_name(p, "in"))
        return perr(p, cur(p)->line, "expected 'in'");
    p->i++;
    n->kids = tg.a;
    n->nkids = tg.n;
    if (!(n->a = parse_tuple(p, false)))
        return NULL;
    if (is_name(p, "if")) {
        p->i++;
        if (!(n->d = expr(p, true)))
            return NULL;
    }
    if (is_name(p, "recursive"))
        return perr(p, cur(p)->line, "recursive loops are not supported");
    if (!block_end(p))
        return NULL;
    static const char *const ends[] = {"else", "endfor"};
    int which;
    p->in_for++;
    n->b = body(p, ends, 2, &which);
    p->in_for--;
    if (!n->b)
        return NULL;
    p->i++;
    if (which == 0 && !else_block(p, "endfor", &n->c))
        return NULL;
    return block_end(p) ? n : NULL;
}

static struct jnode *stmt_set(struct ps *p, int line)
{
    const struct jtok *t = cur(p);
    if (t->kind != JT_NAME)
        return perr(p, t->line, "expected a name after 'set'");
    p->i++;
    struct jnode *n;
    if (is_op(p, ".")) {
        p->i++;
        const struct jtok *at = cur(p);
        if (at->kind != JT_NAME)
            return perr(p, at->line, "expected an attribute name");
        p->i++;
        n = node(p, JN_SETATTR, line);
        if (!n)
            return NULL;
        n->attr = at->p;
        n->attr_len = at->n;
    } else {
        n = node(p, JN_SET, line);
        if (!n)
            return NULL;
    }
    n->name = t->p;
    n->name_len = t->n;
    if (is_op(p, ","))
        return perr(p, line, "set with several targets is not supported");
    if (cur(p)->kind == JT_BLOCK_END)
        return perr(p, line, "block set ({%% set x %%}...{%% endset %%}) is not supported");
    if (!expect_op(p, "="))
        return NULL;
    if (!(n->a = parse_tuple(p, true)) || !block_end(p))
        return NULL;
    return n;
}

static struct jnode *stmt_macro(struct ps *p, int line)
{
    const struct jtok *t = cur(p);
    if (t->kind != JT_NAME)
        return perr(p, t->line, "expected a macro name");
    p->i++;
    struct jnode *n = node(p, JN_MACRO, line);
    if (!n || !expect_op(p, "("))
        return NULL;
    n->name = t->p;
    n->name_len = t->n;
    struct nvec params = {0};
    bool defaults = false;
    while (!is_op(p, ")")) {
        if (params.n && !expect_op(p, ","))
            return NULL;
        const struct jtok *pn = cur(p);
        if (pn->kind != JT_NAME)
            return perr(p, pn->line, "expected a parameter name");
        p->i++;
        struct jnode *x = node(p, JE_NAME, pn->line);
        if (!x)
            return NULL;
        x->name = pn->p;
        x->name_len = pn->n;
        if (is_op(p, "=")) {
            p->i++;
            if (!(x->a = expr(p, true)))
                return NULL;
            defaults = true;
        } else if (defaults) {
            return perr(p, pn->line, "non-default parameter follows a default parameter");
        }
        if (!nv_push(p, &params, x))
            return NULL;
    }
    p->i++;
    if (!block_end(p))
        return NULL;
    n->kids = params.a;
    n->nkids = params.n;
    static const char *const end[] = {"endmacro"};
    int which, saved_for = p->in_for;
    p->in_for = 0; /* a loop around the definition is not the body's */
    p->in_macro++;
    n->b = body(p, end, 1, &which);
    p->in_macro--;
    p->in_for = saved_for;
    if (!n->b)
        return NULL;
    p->i++;
    return block_end(p) ? n : NULL;
}

static struct jnode *body(struct ps *p, const char *const *ends, size_t nends, int *which)
{
    if (!enter(p))
        return NULL;
    struct nvec kids = {0};
    int line = cur(p)->line;
    for (;;) {
        const struct jtok *t = cur(p);
        struct jnode *n = NULL;
        if (t->kind == JT_EOF) {
            if (nends)
                return perr(p, t->line, "unexpected end of template: expected '%s'",
                            ends[nends - 1]);
            break;
        }
        if (t->kind == JT_DATA) {
            p->i++;
            n = node(p, JN_TEXT, t->line);
            if (!n)
                return NULL;
            n->name = t->p;
            n->name_len = t->n;
        } else if (t->kind == JT_VAR_BEGIN) {
            p->i++;
            n = node(p, JN_OUT, t->line);
            if (!n || !(n->a = parse_tuple(p, true)))
                return NULL;
            if (cur(p)->kind != JT_VAR_END)
                return perr(p, cur(p)->line, "expected '}}'");
            p->i++;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            p->i++;
            const struct jtok *kw = cur(p);
            if (kw->kind != JT_NAME)
                return perr(p, kw->line, "expected a statement name");
            for (size_t e = 0; e < nends; e++) {
                if (tok_is_name(kw, ends[e])) {
                    *which = (int)e;
                    struct jnode *b = node(p, JN_BLOCK, line);
                    if (b) {
                        b->kids = kids.a;
                        b->nkids = kids.n;
                    }
                    p->depth--;
                    return b;
                }
            }
            p->i++;
            if (tok_is_name(kw, "if")) {
                n = stmt_if(p, kw->line);
            } else if (tok_is_name(kw, "for")) {
                n = stmt_for(p, kw->line);
            } else if (tok_is_name(kw, "macro")) {
                n = stmt_macro(p, kw->line);
            } else if (tok_is_name(kw, "set")) {
                n = stmt_set(p, kw->line);
            } else if (tok_is_name(kw, "break") || tok_is_name(kw, "continue")) {
                if (!p->in_for)
                    return perr(p, kw->line, "'%.*s' outside a loop", (int)kw->n, kw->p);
                n = node(p, tok_is_name(kw, "break") ? JN_BREAK : JN_CONTINUE, kw->line);
                if (n && !block_end(p))
                    return NULL;
            } else {
                return perr(p, kw->line, "statement \"%.*s\" is not supported", (int)kw->n, kw->p);
            }
            if (!n)
                return NULL;
        } else {
            return perr(p, t->line, "unexpected token");
        }
        if (!nv_push(p, &kids, n))
            return NULL;
    }
    struct jnode *b = node(p, JN_BLOCK, line);
    if (b) {
        b->kids = kids.a;
        b->nkids = kids.n;
    }
    p->depth--;
    return b;
}

int jinja_parse(struct jarena *a, const char *src, size_t len, int max_depth, struct jnode **root,
                char *err, size_t errlen)
{
    struct jtok *toks = NULL;
    size_t nt = 0;
    int rc = jinja_lex(a, src, len, &toks, &nt, err, errlen);
    if (rc)
        return rc;
    struct ps p = {
        .a = a, .t = toks, .nt = nt, .max_depth = max_depth, .err = err, .errlen = errlen};
    for (size_t i = 0; i + 2 < nt; i++) /* macros may be called before their definition */
        if (toks[i].kind == JT_BLOCK_BEGIN && tok_is_name(&toks[i + 1], "macro") &&
            toks[i + 2].kind == JT_NAME) {
            if (p.nmacros == sizeof p.macros / sizeof p.macros[0]) {
                snprintf(err, errlen, "template line %d: more than 64 macros", toks[i].line);
                free(toks);
                return KVR_EPARSE;
            }
            p.macros[p.nmacros++] = &toks[i + 2];
        }
    int which = 0;
    struct jnode *r = body(&p, NULL, 0, &which);
    free(toks);
    if (!r) {
        if (!p.rc) {
            snprintf(err, errlen, "template: parse failed");
            return KVR_EPARSE;
        }
        return p.rc;
    }
    *root = r;
    return KVR_OK;
}

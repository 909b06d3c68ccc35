/*
 * jinja_lex.c: a template's source to tokens, as Jinja 3.1's lexer with transformers' settings
 * (trim_blocks, lstrip_blocks): newlines normalized to \n and one trailing newline dropped;
 * text between tags with whitespace control applied ({%- -%} {{- -}} {#- -#} strip Python
 * whitespace, {%+ keeps the indentation, +%} keeps the newline); comments dropped; inside tags
 * names, strings (Python escapes decoded), integers, floats and operators. An end tag inside
 * open brackets is not an end tag (Jinja's balancing). {% raw %} is refused.
 *
 * Invariants: tokens point into the arena (decoded strings, normalized text) or are literal
 * operator spellings; the array ends with one JT_EOF. Ownership: *toks is malloc'd, the
 * caller frees it; strings are the arena's. Threads: none. Cost: O(source length).
 */
#include "tokenizer/jinja.h"
#include "base/hex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "wire/json_decode.h"
#include "kvrouter/status.h"

#define MAX_TOKENS (1u << 20)

struct lx {
    struct jarena *a;
    const char *s;
    size_t n, i;
    int line;
    struct jtok *t;
    size_t nt, cap;
    char *err;
    size_t errlen;
};

size_t jinja_space_len(const char *p, size_t n)
{
    unsigned char c = (unsigned char)p[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f))
        return 1;
    if (c < 0x80 || n < 2)
        return 0;
    unsigned char c1 = (unsigned char)p[1];
    if (c == 0xC2 && (c1 == 0x85 || c1 == 0xA0))
        return 2;
    if (n < 3)
        return 0;
    unsigned char c2 = (unsigned char)p[2];
    if (c == 0xE1 && c1 == 0x9A && c2 == 0x80)
        return 3; /* U+1680 */
    if (c == 0xE2 && c1 == 0x80 &&
        ((c2 >= 0x80 && c2 <= 0x8A) || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF))
        return 3; /* U+2000..200A, 2028, 2029, 202F */
    if (c == 0xE2 && c1 == 0x81 && c2 == 0x9F)
        return 3; /* U+205F */
    if (c == 0xE3 && c1 == 0x80 && c2 == 0x80)
        return 3; /* U+3000 */
    return 0;
}

/* Length of p[0..n) with trailing Python whitespace removed. */
static size_t rstrip_len(const char *p, size_t n)
{
    while (n > 0) {
        size_t k = 0;
        for (size_t back = 1; back <= 3 && back <= n; back++) {
            size_t l = jinja_space_len(p + n - back, back);
            if (l == back) {
                k = back;
                break;
            }
        }
        if (!k)
            break;
        n -= k;
    }
    return n;
}

static int push(struct lx *x, struct jtok t)
{
    if (x->nt == x->cap) {
        void *buf = x->t;
        if (kvr_grow(&buf, &x->cap, x->nt + 1, MAX_TOKENS, sizeof *x->t) != KVR_OK) {
            snprintf(x->err, x->errlen, "template line %d: too many tokens", t.line);
            return KVR_ETOOBIG;
        }
        x->t = buf;
    }
    x->t[x->nt++] = t;
    return KVR_OK;
}

static int fail(struct lx *x, const char *what)
{
    snprintf(x->err, x->errlen, "template line %d: %s", x->line, what);
    return KVR_EPARSE;
}

static void put_utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xC0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A string literal at x->i (a quote); decoded as Python's unicode-escape does. */
static int lex_string(struct lx *x)
{
    char q = x->s[x->i];
    size_t j = x->i + 1;
    int line = x->line;
    while (j < x->n && x->s[j] != q) {
        if (x->s[j] == '\\' && j + 1 < x->n)
            j++;
        j++;
    }
    if (j >= x->n)
        return fail(x, "unterminated string");
    const char *p = x->s + x->i + 1;
    size_t n = j - x->i - 1;
    char *o = ja_alloc(x->a, n + 1);
    if (!o)
        return fail(x, "template too large");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\n')
            x->line++;
        if (c != '\\' || i + 1 >= n) {
            o[k++] = c;
            continue;
        }
        char e = p[++i];
        int hex = 0;
        switch (e) {
        case '\n':
            x->line++;
            break; /* line continuation */
        case '\\':
            o[k++] = '\\';
            break;
        case '\'':
            o[k++] = '\'';
            break;
        case '"':
            o[k++] = '"';
            break;
        case 'a':
            o[k++] = '\a';
            break;
        case 'b':
            o[k++] = '\b';
            break;
        case 'f':
            o[k++] = '\f';
            break;
        case 'n':
            o[k++] = '\n';
            break;
        case 'r':
            o[k++] = '\r';
            break;
        case 't':
            o[k++] = '\t';
            break;
        case 'v':
            o[k++] = '\v';
            break;
        case 'x':
            hex = 2;
            break;
        case 'u':
            hex = 4;
            break;
        case 'U':
            hex = 8;
            break;
        case 'N':
            return fail(x, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; d++)
                    v = v * 8 + (uint32_t)(p[++i] - '0');
                if (v < 0x80)
                    o[k++] = (char)v;
                else
                    put_utf8(o, &k, v); /* \ooo up to \777: 2 bytes, fits the escape's 4 */
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (hex) {
            uint32_t v = 0;
            for (int d = 0; d < hex; d++) {
                int h = i + 1 < n ? kvr_hex_digit(p[i + 1]) : -1;
                if (h < 0)
                    return fail(x, "truncated \\x, \\u or \\U escape in a string");
                v = v * 16 + (uint32_t)h;
                i++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return fail(x, "escape is not a valid code point");
            put_utf8(o, &k, v); /* at most 4 bytes from at least 4 source bytes */
        }
    }
    o[k] = 0;
    x->i = j + 1;
    return push(x, (struct jtok){.kind = JT_STRING, .line = line, .p = o, .n = k});
}

static int lex_number(struct lx *x)
{
    size_t j = x->i;
    char buf[64];
    size_t k = 0;
    bool isf = false, over = false;
#define PUT(c)                  \
    do {                        \
        if (k < sizeof buf - 1) \
            buf[k++] = (c);     \
        else                    \
            over = true;        \
    } while (0)
    while (j < x->n && ((x->s[j] >= '0' && x->s[j] <= '9') || x->s[j] == '_')) {
        if (x->s[j] != '_')
            PUT(x->s[j]);
        j++;
    }
    if (j + 1 < x->n && x->s[j] == '.' && x->s[j + 1] >= '0' && x->s[j + 1] <= '9') {
        isf = true;
        PUT('.');
        j++;
        while (j < x->n && ((x->s[j] >= '0' && x->s[j] <= '9') || x->s[j] == '_')) {
            if (x->s[j] != '_')
                PUT(x->s[j]);
            j++;
        }
    }
    if (j < x->n && (x->s[j] == 'e' || x->s[j] == 'E')) {
        size_t m = j + 1;
        if (m < x->n && (x->s[m] == '+' || x->s[m] == '-'))
            m++;
        if (m < x->n && x->s[m] >= '0' && x->s[m] <= '9') {
            isf = true;
            for (; j < m; j++)
                PUT(x->s[j]);
            for (; j < x->n && x->s[j] >= '0' && x->s[j] <= '9'; j++)
                PUT(x->s[j]);
        }
    }
#undef PUT
    buf[k] = 0;
    if (over)
        return fail(x, "number literal too long");
    struct jtok t = {.kind = isf ? JT_FLOAT : JT_INT, .line = x->line};
    if (isf) {
        t.f = strtod(buf, NULL);
    } else {
        unsigned long long v = strtoull(buf, NULL, 10);
        if (k > 18 || v > (unsigned long long)INT64_MAX)
            return fail(x, "integer literal out of range");
        t.i = (int64_t)v;
    }
    x->i = j;
    return push(x, t);
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char OPS1[] = "+-*/%~<>=.,:|()[]{}";

/* Tokens inside a tag up to its end; var: }} ends it, else %}. Sets *strip_after (-),
 * *keep_nl (+). */
static int lex_tag(struct lx *x, bool var, bool *strip_after, bool *keep_nl)
{
    int depth = 0;
    for (;;) {
        while (x->i < x->n && (x->s[x->i] == ' ' || x->s[x->i] == '\t' || x->s[x->i] == '\n' ||
                               x->s[x->i] == '\r' || x->s[x->i] == '\f' || x->s[x->i] == '\v')) {
            if (x->s[x->i] == '\n')
                x->line++;
            x->i++;
        }
        if (x->i >= x->n)
            return fail(x, var ? "unexpected end of template, expected '}}'"
                               : "unexpected end of template, expected '%}'");
        const char *p = x->s + x->i;
        size_t left = x->n - x->i;
        char close = var ? '}' : '%';
        if (depth == 0) {
            size_t skip = 0;
            *strip_after = *keep_nl = false;
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close && p[2] == '}') {
                *strip_after = p[0] == '-';
                *keep_nl = p[0] == '+';
                skip = 3;
            } else if (left >= 2 && p[0] == close && p[1] == '}') {
                skip = 2;
            }
            if (skip) {
                x->i += skip;
                return push(
                    x, (struct jtok){.kind = var ? JT_VAR_END : JT_BLOCK_END, .line = x->line});
            }
        }
        char c = p[0];
        int rc;
        if (c == '\'' || c == '"') {
            rc = lex_string(x);
        } else if (c >= '0' && c <= '9') {
            rc = lex_number(x);
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = 1;
            while (j < left && ((p[j] >= 'a' && p[j] <= 'z') || (p[j] >= 'A' && p[j] <= 'Z') ||
                                (p[j] >= '0' && p[j] <= '9') || p[j] == '_'))
                j++;
            x->i += j;
            rc = push(x, (struct jtok){.kind = JT_NAME, .line = x->line, .p = p, .n = j});
        } else {
            size_t len = 0;
            for (size_t k = 0; k < sizeof OPS2 / sizeof OPS2[0]; k++)
                if (left >= 2 && p[0] == OPS2[k][0] && p[1] == OPS2[k][1])
                    len = 2;
            if (!len && strchr(OPS1, c) && c)
                len = 1;
            if (!len) {
                char what[64];
                snprintf(what, sizeof what, "unexpected character '%c' (0x%02x) in a tag",
                         (c >= 0x20 && c < 0x7f) ? c : '?', (unsigned char)c);
                return fail(x, what);
            }
            if (len == 1 && (c == '(' || c == '[' || c == '{'))
                depth++;
            if (len == 1 && (c == ')' || c == ']' || c == '}')) {
                if (depth == 0)
                    return fail(x, "unbalanced bracket");
                depth--;
            }
            x->i += len;
            rc = push(x, (struct jtok){.kind = JT_OP, .line = x->line, .p = p, .n = len});
        }
        if (rc)
            return rc;
    }
}

int jinja_lex(struct jarena *a, const char *src, size_t len, struct jtok **toks, size_t *ntok,
              char *err, size_t errlen)
{
    if (!kvr_jd_utf8_ok((const unsigned char *)src, len)) { /* Python could not decode it */
        snprintf(err, errlen, "template: not valid UTF-8");
        return KVR_EPARSE;
    }
    /* newlines normalized, one trailing newline dropped (keep_trailing_newline=False) */
    char *s = ja_alloc(a, len + 1);
    if (!s) {
        snprintf(err, errlen, "template too large");
        return KVR_ETOOBIG;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    struct lx x = {.a = a, .s = s, .n = n, .line = 1, .err = err, .errlen = errlen};
    bool strip_next = false, trim_nl = false;
    int rc = KVR_OK;
    while (!rc) {
        size_t start = x.i;
        if (strip_next) {
            while (start < n) {
                size_t l = jinja_space_len(s + start, n - start);
                if (!l)
                    break;
                start += l;
            }
        } else if (trim_nl && start < n && s[start] == '\n') {
            start++;
        }
        for (size_t i = x.i; i < start; i++)
            if (s[i] == '\n')
                x.line++;
        x.i = start;
        /* the next tag */
        const char *tag = NULL;
        for (size_t i = start; i + 1 < n; i++) {
            if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
                tag = s + i;
                break;
            }
        }
        size_t dend = tag ? (size_t)(tag - s) : n;
        size_t dlen = dend - start;
        char kind = tag ? tag[1] : 0;
        char mod = (tag && dend + 2 < n) ? tag[2] : 0;
        if (tag && mod == '-') {
            dlen = rstrip_len(s + start, dlen);
        } else if (tag && (kind == '%' || kind == '#') && mod != '+') {
            /* lstrip_blocks: spaces and tabs from the line's start to the tag */
            size_t j = dlen;
            while (j > 0 && (s[start + j - 1] == ' ' || s[start + j - 1] == '\t'))
                j--;
            if ((j > 0 && s[start + j - 1] == '\n') ||
                (j == 0 && (start == 0 || s[start - 1] == '\n')))
                dlen = j;
        }
        int dline = x.line;
        for (size_t i = start; i < dend; i++)
            if (s[i] == '\n')
                x.line++;
        if (dlen)
            rc = push(&x, (struct jtok){.kind = JT_DATA, .line = dline, .p = s + start, .n = dlen});
        if (rc || !tag)
            break;
        x.i = dend + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
        strip_next = trim_nl = false;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = x.i; i + 1 < n; i++)
                if (s[i] == '#' && s[i + 1] == '}') {
                    e = s + i;
                    break;
                }
            if (!e) {
                rc = fail(&x, "unterminated comment");
                break;
            }
            size_t ei = (size_t)(e - s);
            bool minus = ei > x.i && s[ei - 1] == '-';
            bool plus = ei > x.i && s[ei - 1] == '+';
            for (size_t i = x.i; i < ei; i++)
                if (s[i] == '\n')
                    x.line++;
            x.i = ei + 2;
            strip_next = minus;
            trim_nl = !minus && !plus;
            continue;
        }
        bool var = kind == '{';
        rc = push(&x, (struct jtok){.kind = var ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, .line = x.line});
        if (rc)
            break;
        /* {% raw %} would need a different lexing mode: refused */
        if (!var) {
            size_t j = x.i;
            while (j < n && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n'))
                j++;
            if (n - j >= 3 && memcmp(s + j, "raw", 3) == 0 &&
                (j + 3 == n || !((s[j + 3] >= 'a' && s[j + 3] <= 'z') || s[j + 3] == '_'))) {
                rc = fail(&x, "statement \"raw\" is not supported");
                break;
            }
        }
        bool strip_after, keep_nl;
        rc = lex_tag(&x, var, &strip_after, &keep_nl);
        strip_next = strip_after;
        trim_nl = !var && !strip_after && !keep_nl;
    }
    if (!rc)
        rc = push(&x, (struct jtok){.kind = JT_EOF, .line = x.line});
    if (rc) {
        free(x.t);
        return rc;
    }
    *toks = x.t;
    *ntok = x.nt;
    return KVR_OK;
}

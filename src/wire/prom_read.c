/*
 * prom_read.c: see prom_read.h.
 */
#include "wire/prom_read.h"

#include <stdlib.h>
#include <string.h>

void kvr_prom_reader_init(kvr_prom_reader_t *r, const char *text, size_t len)
{
    r->text = text;
    r->len = text != NULL ? len : 0;
    r->pos = 0;
    r->skipped = 0;
}

static bool name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

static bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

/* The end of a quoted label value starting after its opening quote at p (the index of the
 * closing quote), or end when unterminated or badly escaped. */
static size_t quoted_end(const char *s, size_t p, size_t end)
{
    while (p < end) {
        if (s[p] == '"')
            return p;
        if (s[p] == '\\') {
            if (p + 1 >= end || (s[p + 1] != '\\' && s[p + 1] != '"' && s[p + 1] != 'n'))
                return end;
            p++;
        }
        p++;
    }
    return end;
}

/* The index of the closing brace of labels starting at p (after '{'), or end. */
static size_t labels_end(const char *s, size_t p, size_t end)
{
    while (p < end) {
        if (s[p] == '}')
            return p;
        if (s[p] == '"') {
            p = quoted_end(s, p + 1, end);
            if (p == end)
                return end;
        }
        p++;
    }
    return end;
}

/* One line [b, e): true and *out when it is a sample. */
static bool parse_line(const char *s, size_t b, size_t e, kvr_prom_line_t *out)
{
    if (!name_start(s[b]))
        return false;
    size_t p = b;
    while (p < e && name_char(s[p]))
        p++;
    out->name = s + b;
    out->name_len = p - b;
    out->labels = s + p;
    out->labels_len = 0;
    if (p < e && s[p] == '{') {
        size_t close = labels_end(s, p + 1, e);
        if (close == e)
            return false;
        out->labels = s + p + 1;
        out->labels_len = close - p - 1;
        p = close + 1;
    }
    if (p == e || (s[p] != ' ' && s[p] != '\t'))
        return false;
    while (p < e && (s[p] == ' ' || s[p] == '\t'))
        p++;
    size_t v = p;
    while (p < e && s[p] != ' ' && s[p] != '\t')
        p++;
    char num[64];
    if (p == v || p - v >= sizeof num)
        return false;
    memcpy(num, s + v, p - v);
    num[p - v] = '\0';
    char *stop;
    out->value = strtod(num, &stop);
    return *stop == '\0';
}

bool kvr_prom_reader_next(kvr_prom_reader_t *r, kvr_prom_line_t *out)
{
    while (r->pos < r->len) {
        const char *s = r->text;
        size_t b = r->pos;
        const char *nl = memchr(s + b, '\n', r->len - b);
        size_t e = nl != NULL ? (size_t)(nl - s) : r->len;
        r->pos = nl != NULL ? e + 1 : r->len;
        size_t t = e;
        while (t > b && (s[t - 1] == '\r' || s[t - 1] == ' ' || s[t - 1] == '\t'))
            t--;
        while (b < t && (s[b] == ' ' || s[b] == '\t'))
            b++;
        if (b == t || s[b] == '#')
            continue;
        if (parse_line(s, b, t, out))
            return true;
        r->skipped++;
    }
    return false;
}

bool kvr_prom_line_is(const kvr_prom_line_t *l, const char *name)
{
    size_t n = strlen(name);
    return l->name_len == n && memcmp(l->name, name, n) == 0;
}

/* Unescapes the quoted value [p, q) into buf; false when it does not fit. */
static bool unescape(const char *p, const char *q, char *buf, size_t cap)
{
    size_t n = 0;
    for (; p < q; p++) {
        char c = *p;
        if (c == '\\' && p + 1 < q) {
            p++;
            c = *p == 'n' ? '\n' : *p;
        }
        if (n + 1 >= cap)
            return false;
        buf[n++] = c;
    }
    if (cap == 0)
        return false;
    buf[n] = '\0';
    return true;
}

bool kvr_prom_line_label(const kvr_prom_line_t *l, const char *name, char *buf, size_t cap)
{
    const char *s = l->labels;
    size_t end = l->labels_len, p = 0, n = strlen(name);
    while (p < end) {
        while (p < end && (s[p] == ' ' || s[p] == ','))
            p++;
        size_t k = p;
        while (p < end && name_char(s[p]))
            p++;
        size_t klen = p - k;
        while (p < end && s[p] == ' ')
            p++;
        if (p >= end || s[p] != '=')
            return false;
        p++;
        while (p < end && s[p] == ' ')
            p++;
        if (p >= end || s[p] != '"')
            return false;
        size_t close = quoted_end(s, p + 1, end);
        if (close == end)
            return false;
        if (klen == n && memcmp(s + k, name, n) == 0)
            return unescape(s + p + 1, s + close, buf, cap);
        p = close + 1;
    }
    return false;
}

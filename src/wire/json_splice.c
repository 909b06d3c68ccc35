/*
 * json_splice.c: one member added at the end of a JSON object (see json_splice.h for the
 * exact input accepted and output written).
 *
 * A strict recursive-descent scanner: each scan_* returns the index just after what it
 * scanned, or BAD. The recursion depth is bounded by KVR_JSON_SPLICE_MAX_DEPTH. The input is
 * scanned in full before anything is written, so a refusal never leaves partial output.
 */
#include "wire/json_splice.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "wire/json_writer.h"

#define BAD SIZE_MAX

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *b, size_t n, size_t i)
{
    while (i < n && is_ws(b[i]))
        i++;
    return i;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* b[i] is '"'. */
static size_t scan_string(const char *b, size_t n, size_t i)
{
    size_t j = i + 1;
    bool ascii = true;
    while (j < n) {
        unsigned char c = (unsigned char)b[j];
        if (c == '"') {
            if (!ascii && !kvr_json_utf8_valid(b + i + 1, j - i - 1))
                return BAD;
            return j + 1;
        }
        if (c < 0x20)
            return BAD;
        if (c >= 0x80)
            ascii = false;
        if (c != '\\') {
            j++;
            continue;
        }
        if (++j >= n)
            return BAD;
        switch (b[j]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            j++;
            break;
        case 'u':
            if (n - j < 5)
                return BAD;
            for (size_t d = 1; d <= 4; d++)
                if (hexval(b[j + d]) < 0)
                    return BAD;
            j += 5;
            break;
        default:
            return BAD;
        }
    }
    return BAD;
}

static size_t scan_digits(const char *b, size_t n, size_t i)
{
    size_t s = i;
    while (i < n && is_digit(b[i]))
        i++;
    return i > s ? i : BAD;
}

static size_t scan_number(const char *b, size_t n, size_t i)
{
    if (i < n && b[i] == '-')
        i++;
    if (i >= n)
        return BAD;
    if (b[i] == '0')
        i++;
    else if ((i = scan_digits(b, n, i)) == BAD)
        return BAD;
    if (i < n && b[i] == '.' && (i = scan_digits(b, n, i + 1)) == BAD)
        return BAD;
    if (i < n && (b[i] == 'e' || b[i] == 'E')) {
        i++;
        if (i < n && (b[i] == '+' || b[i] == '-'))
            i++;
        if ((i = scan_digits(b, n, i)) == BAD)
            return BAD;
    }
    return i;
}

static size_t scan_literal(const char *b, size_t n, size_t i, const char *lit)
{
    size_t l = strlen(lit);
    return n - i >= l && memcmp(b + i, lit, l) == 0 ? i + l : BAD;
}

static size_t scan_value(const char *b, size_t n, size_t i, unsigned depth);

/* b[i] is '{' or '['. */
static size_t scan_container(const char *b, size_t n, size_t i, unsigned depth)
{
    if (depth >= KVR_JSON_SPLICE_MAX_DEPTH)
        return BAD;
    bool obj = b[i] == '{';
    char close = obj ? '}' : ']';
    i = skip_ws(b, n, i + 1);
    if (i < n && b[i] == close)
        return i + 1;
    for (;;) {
        if (obj) {
            if (i >= n || b[i] != '"' || (i = scan_string(b, n, i)) == BAD)
                return BAD;
            i = skip_ws(b, n, i);
            if (i >= n || b[i] != ':')
                return BAD;
            i = skip_ws(b, n, i + 1);
        }
        if ((i = scan_value(b, n, i, depth + 1)) == BAD)
            return BAD;
        i = skip_ws(b, n, i);
        if (i >= n)
            return BAD;
        if (b[i] == close)
            return i + 1;
        if (b[i] != ',')
            return BAD;
        i = skip_ws(b, n, i + 1);
    }
}

static size_t scan_value(const char *b, size_t n, size_t i, unsigned depth)
{
    if (i >= n)
        return BAD;
    switch (b[i]) {
    case '"':
        return scan_string(b, n, i);
    case '{':
    case '[':
        return scan_container(b, n, i, depth);
    case 't':
        return scan_literal(b, n, i, "true");
    case 'f':
        return scan_literal(b, n, i, "false");
    case 'n':
        return scan_literal(b, n, i, "null");
    default:
        return b[i] == '-' || is_digit(b[i]) ? scan_number(b, n, i) : BAD;
    }
}

/* Whether the key b[k..ke) (quotes included, already scanned) reads as name (ASCII). */
static bool key_is(const char *b, size_t k, size_t ke, const char *name)
{
    size_t nl = strlen(name), o = 0;
    for (size_t i = k + 1; i < ke - 1; i++) {
        char c = b[i];
        if (c == '\\') {
            c = b[++i];
            if (c == 'u') {
                int cp = 0;
                for (size_t d = 1; d <= 4; d++)
                    cp = cp * 16 + hexval(b[i + d]);
                if (cp == 0 || cp > 0x7f)
                    return false;
                c = (char)cp;
                i += 4;
            } else {
                static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
                c = to[strchr(from, c) - from];
            }
        }
        if (o == nl || name[o] != c)
            return false;
        o++;
    }
    return o == nl;
}

/* One top-level member: the key's opening quote, its end, the value's end. */
typedef struct member_span {
    size_t key, key_end, val_end;
} member_span_t;

/* The next member from b[i] (at a key's quote); BAD when it does not scan. */
static size_t next_member(const char *b, size_t n, size_t i, member_span_t *m)
{
    if (i >= n || b[i] != '"')
        return BAD;
    m->key = i;
    if ((m->key_end = scan_string(b, n, i)) == BAD)
        return BAD;
    i = skip_ws(b, n, m->key_end);
    if (i >= n || b[i] != ':')
        return BAD;
    i = skip_ws(b, n, i + 1);
    if ((m->val_end = scan_value(b, n, i, 1)) == BAD)
        return BAD;
    return m->val_end;
}

/* Scans the top-level object at b[s..n): whether it has a member named drop (counted) and
 * where its closing brace is; false when it does not scan. */
static bool scan_top(const char *b, size_t n, size_t s, const char *drop, size_t *n_members,
                     bool *has_drop, size_t *close)
{
    *n_members = 0;
    *has_drop = false;
    size_t i = skip_ws(b, n, s + 1);
    if (i < n && b[i] == '}') {
        *close = i;
        return true;
    }
    for (;;) {
        member_span_t m;
        if ((i = next_member(b, n, i, &m)) == BAD)
            return false;
        (*n_members)++;
        if (drop != NULL && !*has_drop && key_is(b, m.key, m.key_end, drop))
            *has_drop = true;
        i = skip_ws(b, n, i);
        if (i >= n)
            return false;
        if (b[i] == '}') {
            *close = i;
            return true;
        }
        if (b[i] != ',')
            return false;
        i = skip_ws(b, n, i + 1);
    }
}

int kvr_json_splice(const char *json, size_t len, const char *drop, const char *member,
                    size_t member_len, char *out, size_t out_cap, size_t *out_len)
{
    if (out_len == NULL)
        return KVR_EINVAL;
    *out_len = 0;
    if ((json == NULL && len > 0) || (member == NULL && member_len > 0) || out == NULL ||
        out_cap < KVR_JSON_SPLICE_OUT_BYTES(len, member_len))
        return KVR_EINVAL;
    size_t s = skip_ws(json, len, 0), close, n_members;
    bool has_drop;
    if (s >= len || json[s] != '{' ||
        !scan_top(json, len, s, drop, &n_members, &has_drop, &close) ||
        skip_ws(json, len, close + 1) != len)
        return KVR_EPARSE;
    size_t o = 0;
    bool any = n_members > 0;
    if (!has_drop) {
        memcpy(out, json + s, close - s);
        o = close - s;
    } else {
        out[o++] = '{';
        any = false;
        size_t i = skip_ws(json, len, s + 1);
        for (size_t k = 0; k < n_members; k++) {
            member_span_t m;
            i = next_member(json, len, i, &m); /* scanned above: cannot fail */
            if (!key_is(json, m.key, m.key_end, drop)) {
                if (any)
                    out[o++] = ',';
                memcpy(out + o, json + m.key, m.val_end - m.key);
                o += m.val_end - m.key;
                any = true;
            }
            i = skip_ws(json, len, i);
            i = skip_ws(json, len, i + 1); /* past ',' (or the '}' on the last) */
        }
    }
    if (any && member_len > 0)
        out[o++] = ',';
    if (member_len > 0)
        memcpy(out + o, member, member_len);
    o += member_len;
    out[o++] = '}';
    *out_len = o;
    return KVR_OK;
}

/*
 * json_scan.c: see json_scan.h. The strict scanner is recursive descent (depth-bounded); the
 * lenient one counts brackets in a loop. Both return KVR_JSON_BAD on failure.
 */
#include "wire/json_scan.h"
#include "base/hex.h"

#include <string.h>

#include "wire/json_writer.h"

#define BAD KVR_JSON_BAD

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

size_t kvr_json_skip_ws(const char *b, size_t n, size_t i)
{
    while (i < n && is_ws(b[i]))
        i++;
    return i;
}

/* ---- strict ------------------------------------------------------------------------------ */

/* b[i] is '"'. */
static size_t strict_string(const char *b, size_t n, size_t i)
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
                if (kvr_hex_digit(b[j + d]) < 0)
                    return BAD;
            j += 5;
            break;
        default:
            return BAD;
        }
    }
    return BAD;
}

static size_t digits(const char *b, size_t n, size_t i)
{
    size_t s = i;
    while (i < n && is_digit(b[i]))
        i++;
    return i > s ? i : BAD;
}

static size_t strict_number(const char *b, size_t n, size_t i)
{
    if (i < n && b[i] == '-')
        i++;
    if (i >= n)
        return BAD;
    if (b[i] == '0')
        i++;
    else if ((i = digits(b, n, i)) == BAD)
        return BAD;
    if (i < n && b[i] == '.' && (i = digits(b, n, i + 1)) == BAD)
        return BAD;
    if (i < n && (b[i] == 'e' || b[i] == 'E')) {
        i++;
        if (i < n && (b[i] == '+' || b[i] == '-'))
            i++;
        if ((i = digits(b, n, i)) == BAD)
            return BAD;
    }
    return i;
}

static size_t literal(const char *b, size_t n, size_t i, const char *lit)
{
    size_t l = strlen(lit);
    return n - i >= l && memcmp(b + i, lit, l) == 0 ? i + l : BAD;
}

static size_t strict_value(const char *b, size_t n, size_t i, unsigned depth);

/* b[i] is '{' or '['. */
static size_t strict_container(const char *b, size_t n, size_t i, unsigned depth)
{
    if (depth >= KVR_JSON_MAX_DEPTH)
        return BAD;
    bool obj = b[i] == '{';
    char close = obj ? '}' : ']';
    i = kvr_json_skip_ws(b, n, i + 1);
    if (i < n && b[i] == close)
        return i + 1;
    for (;;) {
        if (obj) {
            if (i >= n || b[i] != '"' || (i = strict_string(b, n, i)) == BAD)
                return BAD;
            i = kvr_json_skip_ws(b, n, i);
            if (i >= n || b[i] != ':')
                return BAD;
            i = kvr_json_skip_ws(b, n, i + 1);
        }
        if ((i = strict_value(b, n, i, depth + 1)) == BAD)
            return BAD;
        i = kvr_json_skip_ws(b, n, i);
        if (i >= n)
            return BAD;
        if (b[i] == close)
            return i + 1;
        if (b[i] != ',')
            return BAD;
        i = kvr_json_skip_ws(b, n, i + 1);
    }
}

static size_t strict_value(const char *b, size_t n, size_t i, unsigned depth)
{
    if (i >= n)
        return BAD;
    switch (b[i]) {
    case '"':
        return strict_string(b, n, i);
    case '{':
    case '[':
        return strict_container(b, n, i, depth);
    case 't':
        return literal(b, n, i, "true");
    case 'f':
        return literal(b, n, i, "false");
    case 'n':
        return literal(b, n, i, "null");
    default:
        return b[i] == '-' || is_digit(b[i]) ? strict_number(b, n, i) : BAD;
    }
}

/* ---- lenient ----------------------------------------------------------------------------- */

/* b[i] is '"': the index after the closing quote. */
static size_t lenient_string(const char *b, size_t n, size_t i)
{
    size_t j = i + 1;
    while (j < n) {
        const char *q = memchr(b + j, '"', n - j);
        if (q == NULL)
            return BAD;
        size_t qi = (size_t)(q - b), bs = 0;
        while (qi - bs > i + 1 && b[qi - bs - 1] == '\\')
            bs++;
        if (bs % 2 == 0)
            return qi + 1;
        j = qi + 1;
    }
    return BAD;
}

static size_t lenient_value(const char *b, size_t n, size_t i)
{
    if (i >= n)
        return BAD;
    char c = b[i];
    if (c == '"')
        return lenient_string(b, n, i);
    if (c == '[') { /* a flat array (token ids): memchr's speed instead of a byte loop */
        const char *close = memchr(b + i, ']', n - i);
        if (close != NULL) {
            size_t ci = (size_t)(close - b), inner = ci - i - 1;
            if (memchr(b + i + 1, '[', inner) == NULL && memchr(b + i + 1, '{', inner) == NULL &&
                memchr(b + i + 1, '"', inner) == NULL)
                return ci + 1;
        }
    }
    if (c == '{' || c == '[') {
        size_t depth = 0;
        while (i < n) {
            char ch = b[i];
            if (ch == '"') {
                if ((i = lenient_string(b, n, i)) == BAD)
                    return BAD;
                continue;
            }
            if (ch == '{' || ch == '[') {
                depth++;
            } else if (ch == '}' || ch == ']') {
                if (depth == 0)
                    return BAD;
                if (--depth == 0)
                    return i + 1;
            }
            i++;
        }
        return BAD;
    }
    size_t s = i;
    while (i < n && b[i] != ',' && b[i] != '}' && b[i] != ']' && !is_ws(b[i]))
        i++;
    return i > s ? i : BAD;
}

/* ---- both --------------------------------------------------------------------------------- */

size_t kvr_json_skip_value(const char *b, size_t n, size_t i, kvr_json_mode_t mode)
{
    return mode == KVR_JSON_STRICT ? strict_value(b, n, i, 1) : lenient_value(b, n, i);
}

size_t kvr_json_next_member(const char *b, size_t n, size_t i, kvr_json_mode_t mode,
                            kvr_json_member_t *m)
{
    if (i >= n || b[i] != '"')
        return BAD;
    m->key = i;
    m->key_end = mode == KVR_JSON_STRICT ? strict_string(b, n, i) : lenient_string(b, n, i);
    if (m->key_end == BAD)
        return BAD;
    i = kvr_json_skip_ws(b, n, m->key_end);
    if (i >= n || b[i] != ':')
        return BAD;
    m->val = kvr_json_skip_ws(b, n, i + 1);
    m->val_end = kvr_json_skip_value(b, n, m->val, mode);
    return m->val_end;
}

bool kvr_json_key_is(const char *b, const kvr_json_member_t *m, const char *name)
{
    const char *k = b + m->key + 1;
    size_t kl = m->key_end - m->key - 2, nl = strlen(name), o = 0;
    if (memchr(k, '\\', kl) == NULL)
        return kl == nl && memcmp(k, name, nl) == 0;
    for (size_t i = 0; i < kl; i++) {
        char c = k[i];
        if (c == '\\') {
            if (++i >= kl)
                return false;
            if (k[i] == 'u') {
                if (i + 4 >= kl)
                    return false;
                int cp = 0;
                for (size_t d = 1; d <= 4; d++) {
                    int h = kvr_hex_digit(k[i + d]);
                    if (h < 0)
                        return false;
                    cp = cp * 16 + h;
                }
                if (cp == 0 || cp > 0x7f)
                    return false;
                c = (char)cp;
                i += 4;
            } else if (k[i] == '"' || k[i] == '\\' || k[i] == '/') {
                c = k[i];
            } else {
                return false; /* \b \f \n \r \t: a control, in no name */
            }
        }
        if (o == nl || name[o] != c)
            return false;
        o++;
    }
    return o == nl;
}

void kvr_json_object_begin(kvr_json_iter_t *it, const char *b, size_t n, size_t i,
                           kvr_json_mode_t mode)
{
    *it = (kvr_json_iter_t){.b = b, .n = n, .i = i, .close = KVR_JSON_BAD, .mode = mode};
}

int kvr_json_object_next(kvr_json_iter_t *it, kvr_json_member_t *m)
{
    const char *b = it->b;
    size_t n = it->n, i;
    if (!it->started) {
        if (it->i >= n || b[it->i] != '{')
            return -1;
        it->started = true;
        i = kvr_json_skip_ws(b, n, it->i + 1);
        if (i < n && b[i] == '}') {
            it->close = i;
            return 0;
        }
    } else {
        if (it->close != KVR_JSON_BAD)
            return 0;
        i = kvr_json_skip_ws(b, n, it->i);
        if (i < n && b[i] == '}') {
            it->close = i;
            return 0;
        }
        if (i >= n || b[i] != ',')
            return -1;
        i = kvr_json_skip_ws(b, n, i + 1);
    }
    size_t ve = kvr_json_next_member(b, n, i, it->mode, m);
    if (ve == KVR_JSON_BAD)
        return -1;
    it->i = ve;
    return 1;
}

/*
 * tok_utf8.c: the UTF-8 the tokenizer reads: validation, lossy repair (each maximal invalid
 * subsequence becomes one U+FFFD, the Unicode "best practice" that Rust's from_utf8_lossy and
 * Python's errors="replace" follow), decoding, White_Space (as Rust's char::is_whitespace), and
 * GPT-2's byte-level alphabet (bytes <-> the code points byte-level vocabularies spell them with).
 *
 * Invariants: valid means RFC 3629 (no overlong forms, no surrogates, <= U+10FFFF).
 * Ownership: none kept. Threads: any (pure). Cost: O(n).
 */
#include <string.h>

#include "base/ascii.h"
#include "tokenizer/tok_impl.h"

/* The length of the valid sequence at s[0..n), or 0 when it is invalid; *bad the length of
 * its maximal invalid prefix (>= 1) when 0 is returned. */
static size_t seq_len(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) {
            *bad = i;
            return 0;
        }
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = i;
            return 0;
        }
    }
    return need;
}

size_t kvr_tok_utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i = kvr_ascii_end(s, i + 1, n);
            continue;
        }
        /* two and three bytes (Latin, Cyrillic, CJK, ...) checked inline; seq_len the rest */
        if (c >= 0xC2 && c <= 0xDF && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            i += 2;
            continue;
        }
        if (((c >= 0xE1 && c <= 0xEC) || c >= 0xEE) && c <= 0xEF && i + 2 < n &&
            (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80) {
            i += 3;
            continue;
        }
        size_t bad, l = seq_len(s + i, n - i, &bad);
        if (l == 0)
            return i;
        i += l;
    }
    return n;
}

size_t kvr_tok_utf8_lossy(const unsigned char *s, size_t n, unsigned char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        size_t bad = 0, l = s[i] < 0x80 ? 1 : seq_len(s + i, n - i, &bad);
        if (l == 0) {
            out[o++] = 0xEF;
            out[o++] = 0xBF;
            out[o++] = 0xBD;
            i += bad;
            continue;
        }
        memcpy(out + o, s + i, l);
        o += l;
        i += l;
    }
    return o;
}

uint32_t kvr_tok_utf8_decode(const unsigned char *s, size_t *len)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    }
    if (c < 0xF0) {
        *len = 3;
        return ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    }
    *len = 4;
    return ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

bool kvr_tok_is_whitespace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Bytes GPT-2 keeps as their own code point: '!'..'~', 0xA1..0xAC, 0xAE..0xFF. */
static bool self_byte(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t kvr_tok_byte_to_cp(unsigned b)
{
    if (self_byte(b))
        return b;
    if (b <= 0x20) /* the others, in order, from U+0100: 0x00..0x20, 0x7F..0xA0, 0xAD */
        return 256 + b;
    if (b <= 0xA0)
        return 256 + 33 + (b - 0x7F);
    return 256 + 67;
}

int kvr_tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return self_byte(cp) ? (int)cp : -1;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 67)
        return (int)(0x7F + (cp - 256 - 33));
    return cp == 256 + 67 ? 0xAD : -1;
}

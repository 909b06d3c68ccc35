/*
 * token_scan.c: the fast JSON token-array reader (see token_scan.h for the contract).
 *
 * The bulk of an array is read 64 bytes at a time: SSE2 compares give bit masks of digits,
 * commas, spaces and zeros; token starts and ends fall out of shifts, and every token ending
 * before the window's first byte that breaks `digits ',' ' '*` is converted with a SWAR
 * multiply. The tail and anything the windows stop at go through a one-token loop; whatever
 * that loop does not accept makes the whole scan fail (the caller's yajl decides).
 */
#include "wire/token_scan.h"

#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "kvrouter.h"

#if defined(__SSE2__) && !defined(KVR_API_NO_SIMD) && !defined(KVR_TOKEN_SCAN_NO_SIMD)
#include <emmintrin.h>
#define KVR_TOKEN_SIMD 1
#else
#define KVR_TOKEN_SIMD 0
#endif

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

size_t kvr_token_scan_find(const char *b, size_t len, size_t from, const char *key,
                           size_t key_len)
{
    while (from < len && len - from >= key_len) {
        const char *q = memchr(b + from, '"', len - from - key_len + 1);
        if (q == NULL)
            return 0;
        size_t p = (size_t)(q - b);
        from = p + 1;
        if (memcmp(q, key, key_len) != 0)
            continue;
        p += key_len;
        while (p < len && is_ws(b[p]))
            p++;
        if (p >= len || b[p] != ':')
            continue;
        p++;
        while (p < len && is_ws(b[p]))
            p++;
        if (p < len && b[p] == '[')
            return p + 1;
    }
    return 0;
}

/* A canonical decimal u32 of exactly len (1..10) digits at s, or false. */
static bool digits_u32(const char *s, size_t len, uint32_t *out)
{
    if (len == 0 || len > 10 || (len > 1 && s[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++)
        v = v * 10 + (unsigned)(s[i] - '0');
    if (v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

typedef struct tok_out {
    uint32_t **buf;
    size_t *cap;
    size_t max;
} tok_out_t;

static bool push_token(const tok_out_t *o, size_t *n, uint32_t v)
{
    if (*n >= o->max) /* the caller's buffer may be larger than this call's limit */
        return false;
    if (*n == *o->cap &&
        kvr_grow((void **)o->buf, o->cap, *n + 1, o->max, sizeof **o->buf) != KVR_OK)
        return false;
    (*o->buf)[(*n)++] = v;
    return true;
}

#if KVR_TOKEN_SIMD
#define SWAR_ZEROS UINT64_C(0x3030303030303030)

static uint64_t load8(const char *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* v from 1..8 ASCII digits loaded little-endian in x (the digits in the low len bytes):
 * shifted up so the number is right-aligned, then combined pairwise by multiplications. */
static uint32_t digits8(uint64_t x, size_t len)
{
    uint64_t t = (x - SWAR_ZEROS) << (8 * (8 - len));
    t = t * 10 + (t >> 8);
    t = (((t & UINT64_C(0x000000FF000000FF)) * UINT64_C(0x000F424000000064)) +
         (((t >> 16) & UINT64_C(0x000000FF000000FF)) * UINT64_C(0x0000271000000001))) >> 32;
    return (uint32_t)t;
}

/* Masks of the 64 bytes at b, bit i for b[i]: a digit, ',', ' ', '0'. */
static void window_masks(const char *b, uint64_t *digit, uint64_t *comma, uint64_t *space,
                         uint64_t *zero)
{
    const __m128i c0 = _mm_set1_epi8('0'), c9 = _mm_set1_epi8(9);
    const __m128i cc = _mm_set1_epi8(','), cs = _mm_set1_epi8(' ');
    uint64_t dg = 0, cm = 0, sp = 0, zr = 0;
    for (unsigned k = 0; k < 4; k++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(b + 16 * k));
        __m128i t = _mm_sub_epi8(x, c0);
        __m128i is_digit = _mm_cmpeq_epi8(_mm_min_epu8(t, c9), t);  /* t <= 9 unsigned */
        unsigned sh = 16 * k;
        dg |= (uint64_t)(unsigned)_mm_movemask_epi8(is_digit) << sh;
        cm |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, cc)) << sh;
        sp |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, cs)) << sh;
        zr |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, c0)) << sh;
    }
    *digit = dg;
    *comma = cm;
    *space = sp;
    *zero = zr;
}

/*
 * The bulk of an array written as `int,int,...` or `int, int, ...`, 64 bytes at a time.
 * b[p] is the first digit of a token. In each window, masks say where tokens start and end;
 * the window is good up to its first byte that breaks the pattern `digits ',' ' '*` (another
 * character, a token not followed directly by ',', a ',' not right after a digit, a leading
 * zero). Every token ending before that point is converted: its start and end come from two
 * count-trailing-zeros, so no step waits on a load. Returns the index just after the last
 * token read (at its ','), with *after set, or p unchanged with *after clear when it read
 * nothing; SIZE_MAX when the array cannot be a fast-path array.
 */
static size_t scan_windows(const tok_out_t *o, const char *b, size_t len, size_t p, size_t *n,
                           bool *after)
{
    size_t last = SIZE_MAX;
    while (len - p >= 72) {  /* 64 bytes of window + 8 for the last token's load */
        uint64_t digit, comma, space, zero;
        window_masks(b + p, &digit, &comma, &space, &zero);
        uint64_t sep = ~digit;
        uint64_t starts = digit & ~(digit << 1);
        uint64_t ends = sep & (digit << 1);
        uint64_t bad = (sep & ~comma & ~space) | (ends & ~comma) | (comma & ~(digit << 1)) |
                       (zero & starts & (digit >> 1)) | (sep & 1);
        uint64_t good = bad == 0 ? ~(uint64_t)0 : ((uint64_t)1 << __builtin_ctzll(bad)) - 1;
        uint64_t ve = ends & good;
        if (ve == 0)
            break;
        /* room for the window's tokens: at most 32 (a digit and a ',' each) */
        if (o->max - *n < 32 || (*o->cap - *n < 32 && kvr_grow((void **)o->buf, o->cap, *n + 32,
                                                               o->max, sizeof **o->buf) != KVR_OK))
            break;  /* near the limit: the careful loop counts exactly */
        uint32_t *base = *o->buf, *out = base + *n;
        unsigned e = 0;
        do {
            e = (unsigned)__builtin_ctzll(ve);
            unsigned s = (unsigned)__builtin_ctzll(starts);
            ve &= ve - 1;
            starts &= starts - 1;
            size_t tl = e - s;
            if (tl <= 8)
                *out++ = digits8(load8(b + p + s), tl);
            else if (!digits_u32(b + p + s, tl, out++))
                return SIZE_MAX;
        } while (ve != 0);
        *n = (size_t)(out - base);
        last = p + e;
        /* the next window starts at the next token: after the ',' and any spaces */
        p = last + 1;
        while (p < len && b[p] == ' ')
            p++;
        if (p >= len || (unsigned)((unsigned char)b[p] - '0') > 9)
            break;
    }
    *after = last != SIZE_MAX;
    return *after ? last : p;
}
#endif

bool kvr_token_scan(const char *b, size_t len, size_t p, uint32_t **buf, size_t *cap,
                    size_t max, size_t *close, size_t *n_out)
{
    const tok_out_t o = {buf, cap, max};
    size_t n = 0;
    while (p < len && is_ws(b[p]))
        p++;
    if (p < len && b[p] == ']') {
        *close = p;
        *n_out = 0;
        return true;
    }
    for (;;) {
        bool after = false;
#if KVR_TOKEN_SIMD
        while (p < len && is_ws(b[p]))
            p++;
        p = scan_windows(&o, b, len, p, &n, &after);
        if (p == SIZE_MAX)
            return false;
#endif
        if (!after) {
            /* one token */
            while (p < len && is_ws(b[p]))
                p++;
            size_t q = p;
            while (q < len && q - p <= 10 && (unsigned)((unsigned char)b[q] - '0') <= 9)
                q++;
            uint32_t v;
            if (!digits_u32(b + p, q - p, &v) || !push_token(&o, &n, v))
                return false;
            p = q;
        }
        /* after a token: ']' or ',' */
        while (p < len && is_ws(b[p]))
            p++;
        if (p >= len)
            return false;
        if (b[p] == ']') {
            *close = p;
            *n_out = n;
            return true;
        }
        if (b[p] != ',')
            return false;
        p++;
    }
}

/* One canonical decimal integer starting at b[p] (after its sign), read in one pass: its end
 * in *q. false for no digit, a leading zero, or a magnitude above 2^64 - 1 (2^63 when
 * negative). The first 19 digits always fit in 64 bits; only a 20th costs a check (a check
 * per digit cost more than yajl's whole reading). */
static bool read_i64(const char *b, size_t len, size_t p, bool neg, size_t *q, uint64_t *out)
{
    size_t i = p, stop = len - p > 19 ? p + 19 : len;
    uint64_t v = 0;
    unsigned d;
    while (i < stop && (d = (unsigned)((unsigned char)b[i] - '0')) <= 9) {
        v = v * 10 + d;
        i++;
    }
    if (i == p || (i - p > 1 && b[p] == '0'))
        return false;
    if (i == p + 19 && i < len && (d = (unsigned)((unsigned char)b[i] - '0')) <= 9) {
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
        i++;
        if (i < len && (unsigned)((unsigned char)b[i] - '0') <= 9)
            return false; /* 21 digits */
    }
    if (neg && v > ((uint64_t)1 << 63))
        return false;
    *q = i;
    *out = neg ? (uint64_t)0 - v : v;
    return true;
}

bool kvr_int64_scan(const char *b, size_t len, size_t p, uint64_t **buf, size_t *cap, size_t max,
                    size_t *close, size_t *n_out)
{
    size_t n = 0;
    while (p < len && is_ws(b[p]))
        p++;
    if (p < len && b[p] == ']') {
        *close = p;
        *n_out = 0;
        return true;
    }
    for (;;) {
        while (p < len && is_ws(b[p]))
            p++;
        bool neg = p < len && b[p] == '-';
        size_t q;
        uint64_t v;
        if (!read_i64(b, len, p + neg, neg, &q, &v))
            return false;
        if (n == *cap && kvr_grow((void **)buf, cap, n + 1, max, sizeof **buf) != KVR_OK)
            return false;
        (*buf)[n++] = v;
        p = q;
        while (p < len && is_ws(b[p]))
            p++;
        if (p < len && b[p] == ']') {
            *close = p;
            *n_out = n;
            return true;
        }
        if (p >= len || b[p] != ',')
            return false;
        p++;
    }
}

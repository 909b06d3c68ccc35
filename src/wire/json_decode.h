/*
 * json_decode.h: the plumbing shared by the yajl-driven JSON decoders of the wire layer
 * (wire/api_json.c, wire/openai.c, wire/trace.c, wire/hash_req.c). Internal to the wire layer.
 *
 * What: reading JSON number text exactly (integers as u64, never via double; doubles finite),
 * the string checks yajl does not make (overlong UTF-8, surrogates, > U+10FFFF, control
 * characters), user text clipped and sanitised for messages, the first-error-wins message
 * record, and opening/closing a yajl parse with "invalid JSON at byte N: <yajl's message>".
 * The decoders keep their own state machines and field tables; only what is the same logic
 * in all of them is here, so their messages stay byte-for-byte what they were.
 *
 * Invariants: number text is what yajl's lexer accepted (-?digits[.digits][e[+-]digits]);
 * "1.0" and "1e3" are not integers, "-0" is the integer 0, magnitudes above UINT64_MAX are
 * not integers. Every message written fits its buffer and holds only printable ASCII other
 * than '"' and '\' where it quotes user text or yajl.
 * Ownership: everything is borrowed for the call, except the scratch buffer of
 * kvr_jd_parse_double() (the caller's, grown with realloc) and the handle of
 * kvr_jd_yajl_open() (the caller's, freed with yajl_free(); it allocates from the arena).
 * Threads: none; pure functions on caller state, any thread.
 * Cost: O(n) in the text given; the integer readers are inline (they run once per number on
 * the decoders' slow paths); messages cost a snprintf, and only on errors.
 */
#ifndef KVR_WIRE_JSON_DECODE_H
#define KVR_WIRE_JSON_DECODE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <yajl/yajl_parse.h>

#include "wire/yajl_arena.h"

/* A buffer for kvr_jd_clip() output: 40 bytes of user text and the NUL. */
#define KVR_JD_CLIP_BYTES 48

/* A buffer for a kvr_jd_yajl_finish() message (the longest is ~200 bytes). */
#define KVR_JD_MSG_BYTES 256

/* JSON number text as an integer: false for fractions, exponents and magnitudes above
 * UINT64_MAX. *neg tells a negative value; "-0" is 0 with *neg false. */
static inline bool kvr_jd_parse_int(const char *s, size_t n, uint64_t *mag, bool *neg)
{
    size_t i = 0;
    *neg = false;
    if (i < n && s[i] == '-') {
        *neg = true;
        i++;
    }
    if (i == n)
        return false;
    uint64_t v = 0;
    for (; i < n; i++) {
        unsigned dg = (unsigned)(s[i] - '0');
        if (dg > 9 || v > (UINT64_MAX - dg) / 10)
            return false;
        v = v * 10 + dg;
    }
    if (v == 0)
        *neg = false;
    *mag = v;
    return true;
}

/* JSON number text as an unsigned integer in [lo, hi] ("-0" is 0); false otherwise. */
static inline bool kvr_jd_parse_u64(const char *s, size_t n, uint64_t lo, uint64_t hi,
                                    uint64_t *out)
{
    bool neg;
    return kvr_jd_parse_int(s, n, out, &neg) && !neg && *out >= lo && *out <= hi;
}

/* JSON number text as a finite double (strtod; the C numeric locale is assumed). Text of 64
 * bytes or more is copied into *scratch (grown as needed). KVR_OK; KVR_EINVAL when the value
 * is not finite; KVR_ENOMEM when the scratch could not grow. */
int kvr_jd_parse_double(const char *s, size_t n, char **scratch, size_t *scratch_cap,
                        double *out);

/* Whether s[0..n) is valid UTF-8 in the strict sense (no overlong forms, surrogates or code
 * points above U+10FFFF, which yajl's own check lets through); ASCII is checked first. */
bool kvr_jd_utf8_ok(const unsigned char *s, size_t n);

/* What is wrong with a decoded string that must hold text without control characters:
 * "contains a control character" (< 0x20 or 0x7f), "is not valid UTF-8", or NULL. */
const char *kvr_jd_text_problem(const unsigned char *s, size_t n);

/* Copies up to 40 bytes of user text for a message (37 and "..." when longer), replacing
 * bytes that would need escaping in JSON (and non-ASCII) with '?'. dst_len >= 1. */
void kvr_jd_clip(char *dst, size_t dst_len, const unsigned char *s, size_t n);

/* Records the first error: when *status is KVR_OK, sets it to st and formats the message
 * into err[0..err_len) (nothing written when err_len is 0); later calls change nothing.
 * Returns 0, so yajl callbacks can `return kvr_jd_fail(...)` to stop the parse. */
int kvr_jd_fail(int *status, char *err, size_t err_len, int st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int kvr_jd_vfail(int *status, char *err, size_t err_len, int st, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* JSON whitespace. */
static inline bool kvr_jd_is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* Whether s[0..n) is empty or only JSON whitespace. */
bool kvr_jd_blank(const char *s, size_t n);

/* A yajl handle with callbacks cb and context ctx allocating from a (reset first: the
 * previous handle on a must have been freed). NULL when yajl could not allocate. */
yajl_handle kvr_jd_yajl_open(kvr_yajl_arena_t *a, const yajl_callbacks *cb, void *ctx);

/* Ends a parse whose last yajl_parse() (of a piece starting at body offset base, in a text of
 * len bytes) returned st: completes it when st is ok, and returns the final status. On
 * yajl_status_error, msg holds "invalid JSON at byte N: <yajl's message on one line>" (N: len
 * when the text ended early, else where yajl stopped); otherwise msg is "". */
yajl_status kvr_jd_yajl_finish(yajl_handle h, yajl_status st, size_t base, size_t len,
                               char *msg, size_t msg_len);

/* ---- The decoder skeleton: skipping unknown members ----------------------------------------
 * Every decoder ignores a member whose key it does not know, whatever its value holds. It puts
 * a kvr_jd_skip_t FIRST in its state, calls kvr_jd_skip_next() when a key is not its own, and
 * parses with kvr_jd_callbacks: those swallow the skipped value's events (containers nested at
 * most max_depth deep, counting the decoder's own depth) and hand everything else to the
 * decoder's own callbacks, which so never see an unknown value. */
typedef struct kvr_jd_skip_ops {
    yajl_callbacks own;                /* the decoder's own (integer and double unused) */
    int (*skipped)(void *ctx);         /* the skipped value is over: expect the next key */
    unsigned (*depth)(const void *ctx);/* the decoder's own nesting (NULL with no limit) */
    unsigned max_depth;                /* 0: no limit */
    int (*too_deep)(void *ctx);        /* past max_depth: records the error, returns 0 */
} kvr_jd_skip_ops_t;

typedef struct kvr_jd_skip {
    const kvr_jd_skip_ops_t *ops;
    bool pending;                      /* the next value is skipped */
    unsigned depth;                    /* inside a skipped container this deep */
} kvr_jd_skip_t;

/* The own table of a decoder whose callbacks have the usual names (on_null, on_boolean,
 * on_number, on_string, on_start_map, on_map_key, on_start_array, and on_end for both ends). */
#define KVR_JD_OWN_CALLBACKS                                                                    \
    {                                                                                           \
        .yajl_null = on_null, .yajl_boolean = on_boolean, .yajl_number = on_number,             \
        .yajl_string = on_string, .yajl_start_map = on_start_map, .yajl_map_key = on_map_key,   \
        .yajl_end_map = on_end, .yajl_start_array = on_start_array, .yajl_end_array = on_end    \
    }

/* The callbacks to give yajl (context: the decoder, whose first member is its kvr_jd_skip_t). */
extern const yajl_callbacks kvr_jd_callbacks;

/* Starts (or restarts) a parse: nothing skipped. */
static inline void kvr_jd_skip_reset(kvr_jd_skip_t *s, const kvr_jd_skip_ops_t *ops)
{
    s->ops = ops;
    s->pending = false;
    s->depth = 0;
}

/* The value after the current key is not the decoder's: it will not see it. */
static inline void kvr_jd_skip_next(kvr_jd_skip_t *s) { s->pending = true; }

#endif /* KVR_WIRE_JSON_DECODE_H */

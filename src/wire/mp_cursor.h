/*
 * mp_cursor.h: a bounds-checked msgpack reader over one payload (the KV-event decoder's, and
 * any other decoder of untrusted msgpack in the wire layer). It reads values in place, never
 * builds a tree and never recurses.
 *
 * Why not msgpack-c: kv_events.c's opening comment has the measurement (its object tree costs
 * ~8 ns a value, and it reserves every container's declared size before reading it).
 * Invariants: the cursor never reads outside [p, p + n); a value's header is accepted only when
 * the whole value (or a container's header) is inside the payload, and a container only when
 * its elements could be (an element takes at least one byte), so no caller's buffer grows
 * beyond a constant times the payload; nesting stops at KVR_MP_MAX_DEPTH, as msgpack-c does.
 * Ownership: the payload is borrowed. Threads: none. Cost: one-byte headers (small ints, nil,
 * short arrays, maps and strings) inline in kvr_mp_peek; the rest in kvr_mp_peek_slow.
 */
#ifndef KVR_WIRE_MP_CURSOR_H
#define KVR_WIRE_MP_CURSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum kvr_mp_type {
    KVR_MP_NIL, KVR_MP_BOOL, KVR_MP_UINT, KVR_MP_NEG, KVR_MP_FLOAT, KVR_MP_STR, KVR_MP_BIN, KVR_MP_ARRAY, KVR_MP_MAP, KVR_MP_EXT,
};

/* Why a value could not be framed. */
enum kvr_mp_frame_why {
    KVR_MP_W_END,    /* the payload ends where a value should start */
    KVR_MP_W_BAD,    /* byte 0xc1 (never used by msgpack) */
    KVR_MP_W_LEN,    /* a string/binary/extension/number runs past the end */
    KVR_MP_W_COUNT,  /* a container declares more elements than bytes left */
    KVR_MP_W_DEEP,   /* a container nested deeper than KVR_MP_MAX_DEPTH */
};

/* msgpack-c refuses to open a 33rd nested container; so do we, so that both agree on what
 * valid msgpack is. The fixed structure (batch, events, event, field, pair) is 5 deep. */
#define KVR_MP_MAX_DEPTH 32

typedef struct kvr_mp_rd {
    const uint8_t *p;
    size_t n, pos;
    int why;   /* after a framing failure */
} kvr_mp_rd_t;

/* One value's header. */
typedef struct kvr_mp {
    enum kvr_mp_type type;
    size_t size;          /* bytes to the next value: the whole value, or a container's header */
    uint64_t u;           /* ints: two's complement bits; str/bin/ext: length; containers: count */
    double f;             /* KVR_MP_FLOAT */
    const uint8_t *data;  /* str/bin payload */
} kvr_mp_t;

/* Return codes of the readers. */
#define KVR_MP_OK 0
#define KVR_MP_FRAME (-2) /* the payload cannot be framed at r->pos (r->why says why) */

static inline uint16_t kvr_mp_be16(const uint8_t *p)
{
    return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static inline uint32_t kvr_mp_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t kvr_mp_be64(const uint8_t *p)
{
    return (uint64_t)kvr_mp_be32(p) << 32 | kvr_mp_be32(p + 4);
}

static inline int kvr_mp_frame(kvr_mp_rd_t *r, int why)
{
    r->why = why;
    return KVR_MP_FRAME;
}

/* Reads the header of the value at r->pos without consuming it. Checks that the whole value
 * (or a container's header) is inside the payload and that a container's elements could be.
 * kvr_mp_peek() inlines the one-byte headers (small ints, nil, short arrays, maps and strings: most
 * of an event) and leaves the rest to kvr_mp_peek_slow(). */
int kvr_mp_peek_slow(kvr_mp_rd_t *r, kvr_mp_t *v);

static inline int kvr_mp_peek(kvr_mp_rd_t *r, kvr_mp_t *v)
{
    size_t left = r->n - r->pos;
    if (left > 0) {
        uint8_t b = r->p[r->pos];
        v->size = 1;
        if (b <= 0x7f) {
            v->type = KVR_MP_UINT;
            v->u = b;
            return KVR_MP_OK;
        }
        if (b == 0xc0) {
            v->type = KVR_MP_NIL;
            v->u = 0;
            return KVR_MP_OK;
        }
        if (b >= 0x80 && b <= 0x9f) {  /* each element takes at least one byte */
            v->type = b >= 0x90 ? KVR_MP_ARRAY : KVR_MP_MAP;
            v->u = b & 0x0fu;
            if (v->u * (b >= 0x90 ? 1 : 2) <= left - 1)
                return KVR_MP_OK;
        } else if (b >= 0xa0 && b <= 0xbf) {
            v->type = KVR_MP_STR;
            v->u = b & 0x1fu;
            v->data = r->p + r->pos + 1;
            v->size = 1 + (size_t)v->u;
            if (v->u <= left - 1)
                return KVR_MP_OK;
        }
    }
    return kvr_mp_peek_slow(r, v);
}

/* Skips count values (with everything nested in them) where `open` containers are open
 * around them. left[] holds the values still to skip per level: no recursion. */
int kvr_mp_skip(kvr_mp_rd_t *r, uint64_t count, unsigned open);

/* The type's name for messages ("an integer"). */
const char *kvr_mp_tname(enum kvr_mp_type t);
/* "an integer" for types, the value itself for integers. */
const char *kvr_mp_vdesc(const kvr_mp_t *v, char *buf, size_t len);
/* Whether a[0..alen) equals b[0..blen) ignoring ASCII case (b upper-case). */
bool kvr_mp_str_ieq_n(const uint8_t *a, size_t alen, const char *b, size_t blen);

static inline int64_t kvr_mp_as_i64(uint64_t u)
{
    int64_t s;
    memcpy(&s, &u, sizeof s);
    return s;
}

static inline bool kvr_mp_str_eq(const kvr_mp_t *v, const char *s, size_t len)
{
    return v->type == KVR_MP_STR && v->u == len && memcmp(v->data, s, len) == 0;
}

#endif

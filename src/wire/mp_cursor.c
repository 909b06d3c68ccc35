/* mp_cursor.c: see mp_cursor.h. */
#include "wire/mp_cursor.h"

#include <inttypes.h>
#include <stdio.h>

int kvr_mp_peek_slow(kvr_mp_rd_t *r, kvr_mp_t *v)
{
    size_t left = r->n - r->pos;
    if (left == 0)
        return kvr_mp_frame(r, KVR_MP_W_END);
    const uint8_t *p = r->p + r->pos;
    uint8_t b = p[0];
    size_t hdr = 1, len = 0;   /* header bytes; trailing bytes for str/bin/ext/numbers */
    v->u = 0;
    if (b <= 0x7f) {
        v->type = KVR_MP_UINT;
        v->u = b;
    } else if (b <= 0x8f) {
        v->type = KVR_MP_MAP;
        v->u = b & 0x0fu;
    } else if (b <= 0x9f) {
        v->type = KVR_MP_ARRAY;
        v->u = b & 0x0fu;
    } else if (b <= 0xbf) {
        v->type = KVR_MP_STR;
        v->u = b & 0x1fu;
        len = (size_t)v->u;
    } else if (b >= 0xe0) {
        v->type = KVR_MP_NEG;
        v->u = (uint64_t)((int64_t)b - 256);
    } else {
        static const uint8_t hdr_of[0x20] = {
            /* c0 nil, c1 bad, c2 c3 bool, c4 c5 c6 bin, c7 c8 c9 ext, ca cb float */
            1, 1, 1, 1, 2, 3, 5, 3, 4, 6, 1, 1,
            /* cc..cf uint, d0..d3 int */
            1, 1, 1, 1, 1, 1, 1, 1,
            /* d4..d8 fixext (tag byte), d9 da db str, dc dd array, de df map */
            2, 2, 2, 2, 2, 2, 3, 5, 3, 5, 3, 5,
        };
        if (b == 0xc1)
            return kvr_mp_frame(r, KVR_MP_W_BAD);
        hdr = hdr_of[b - 0xc0];
        if (left < hdr)
            return kvr_mp_frame(r, KVR_MP_W_LEN);
        switch (b) {
        case 0xc0: v->type = KVR_MP_NIL; break;
        case 0xc2: case 0xc3: v->type = KVR_MP_BOOL; v->u = b & 1u; break;
        case 0xc4: v->type = KVR_MP_BIN; len = p[1]; break;
        case 0xc5: v->type = KVR_MP_BIN; len = kvr_mp_be16(p + 1); break;
        case 0xc6: v->type = KVR_MP_BIN; len = kvr_mp_be32(p + 1); break;
        case 0xc7: v->type = KVR_MP_EXT; len = p[1]; break;
        case 0xc8: v->type = KVR_MP_EXT; len = kvr_mp_be16(p + 1); break;
        case 0xc9: v->type = KVR_MP_EXT; len = kvr_mp_be32(p + 1); break;
        case 0xca: v->type = KVR_MP_FLOAT; len = 4; break;
        case 0xcb: v->type = KVR_MP_FLOAT; len = 8; break;
        case 0xcc: v->type = KVR_MP_UINT; len = 1; break;
        case 0xcd: v->type = KVR_MP_UINT; len = 2; break;
        case 0xce: v->type = KVR_MP_UINT; len = 4; break;
        case 0xcf: v->type = KVR_MP_UINT; len = 8; break;
        case 0xd0: v->type = KVR_MP_NEG; len = 1; break;
        case 0xd1: v->type = KVR_MP_NEG; len = 2; break;
        case 0xd2: v->type = KVR_MP_NEG; len = 4; break;
        case 0xd3: v->type = KVR_MP_NEG; len = 8; break;
        case 0xd4: v->type = KVR_MP_EXT; len = 1; break;
        case 0xd5: v->type = KVR_MP_EXT; len = 2; break;
        case 0xd6: v->type = KVR_MP_EXT; len = 4; break;
        case 0xd7: v->type = KVR_MP_EXT; len = 8; break;
        case 0xd8: v->type = KVR_MP_EXT; len = 16; break;
        case 0xd9: v->type = KVR_MP_STR; len = p[1]; break;
        case 0xda: v->type = KVR_MP_STR; len = kvr_mp_be16(p + 1); break;
        case 0xdb: v->type = KVR_MP_STR; len = kvr_mp_be32(p + 1); break;
        case 0xdc: v->type = KVR_MP_ARRAY; v->u = kvr_mp_be16(p + 1); break;
        case 0xdd: v->type = KVR_MP_ARRAY; v->u = kvr_mp_be32(p + 1); break;
        case 0xde: v->type = KVR_MP_MAP; v->u = kvr_mp_be16(p + 1); break;
        case 0xdf: v->type = KVR_MP_MAP; v->u = kvr_mp_be32(p + 1); break;
        default: break;
        }
    }
    if (len > left - hdr)
        return kvr_mp_frame(r, KVR_MP_W_LEN);
    const uint8_t *q = p + hdr;
    switch (v->type) {
    case KVR_MP_UINT:
        if (len == 1) v->u = q[0];
        else if (len == 2) v->u = kvr_mp_be16(q);
        else if (len == 4) v->u = kvr_mp_be32(q);
        else if (len == 8) v->u = kvr_mp_be64(q);
        break;
    case KVR_MP_NEG:
        /* sign-extend to two's complement bits (negative fixint: already done) */
        if (len == 1) v->u = (uint64_t)((int64_t)(q[0] ^ 0x80u) - 0x80);
        else if (len == 2) v->u = (uint64_t)((int64_t)(kvr_mp_be16(q) ^ 0x8000u) - 0x8000);
        else if (len == 4) v->u = (uint64_t)((int64_t)(kvr_mp_be32(q) ^ 0x80000000u) - 0x80000000);
        else if (len == 8) v->u = kvr_mp_be64(q);
        if (v->u >> 63 == 0)
            v->type = KVR_MP_UINT;  /* a signed encoding of a non-negative value */
        break;
    case KVR_MP_FLOAT:
        if (len == 4) {
            uint32_t w = kvr_mp_be32(q);
            float f;
            memcpy(&f, &w, sizeof f);
            v->f = f;
        } else {
            uint64_t w = kvr_mp_be64(q);
            memcpy(&v->f, &w, sizeof v->f);
        }
        break;
    case KVR_MP_STR:
    case KVR_MP_BIN:
    case KVR_MP_EXT:
        v->u = len;
        v->data = q;
        break;
    case KVR_MP_ARRAY:
    case KVR_MP_MAP:
        /* each element takes at least one byte */
        if (v->u > (left - hdr) / (v->type == KVR_MP_MAP ? 2 : 1))
            return kvr_mp_frame(r, KVR_MP_W_COUNT);
        break;
    default:
        break;
    }
    v->size = hdr + len;
    return KVR_MP_OK;
}

int kvr_mp_skip(kvr_mp_rd_t *r, uint64_t count, unsigned open)
{
    uint64_t left[KVR_MP_MAX_DEPTH + 1];
    unsigned top = 0;
    left[0] = count;
    for (;;) {
        while (left[top] == 0) {
            if (top == 0)
                return KVR_MP_OK;
            top--;
        }
        kvr_mp_t v;
        if (kvr_mp_peek(r, &v) != KVR_MP_OK)
            return KVR_MP_FRAME;
        bool container = v.type == KVR_MP_ARRAY || v.type == KVR_MP_MAP;
        if (container && open + top >= KVR_MP_MAX_DEPTH)
            return kvr_mp_frame(r, KVR_MP_W_DEEP);
        r->pos += v.size;
        left[top]--;
        if (container && v.u > 0)  /* peek bounded v.u by the bytes left */
            left[++top] = v.type == KVR_MP_MAP ? 2 * v.u : v.u;
    }
}

const char *kvr_mp_tname(enum kvr_mp_type t)
{
    switch (t) {
    case KVR_MP_NIL: return "nil";
    case KVR_MP_BOOL: return "a boolean";
    case KVR_MP_UINT: return "an integer";
    case KVR_MP_NEG: return "a negative integer";
    case KVR_MP_FLOAT: return "a float";
    case KVR_MP_STR: return "a string";
    case KVR_MP_BIN: return "binary";
    case KVR_MP_ARRAY: return "an array";
    case KVR_MP_MAP: return "a map";
    case KVR_MP_EXT: return "an extension";
    }
    return "?";
}


const char *kvr_mp_vdesc(const kvr_mp_t *v, char *buf, size_t len)
{
    if (v->type == KVR_MP_UINT)
        snprintf(buf, len, "%" PRIu64, v->u);
    else if (v->type == KVR_MP_NEG)
        snprintf(buf, len, "%" PRId64, kvr_mp_as_i64(v->u));
    else
        return kvr_mp_tname(v->type);
    return buf;
}


bool kvr_mp_str_ieq_n(const uint8_t *a, size_t alen, const char *b, size_t blen)
{
    if (alen != blen)
        return false;
    for (size_t i = 0; i < alen; i++) {
        unsigned c = a[i];
        if (c >= 'a' && c <= 'z')
            c -= 'a' - 'A';
        if (c != (unsigned char)b[i])
            return false;
    }
    return true;
}

/*
 * dec.h: unsigned integers as decimal text, the one writer of the tree (JSON numbers, token-id
 * lists for workers and tools). Written here rather than with snprintf: on 8,192 token ids
 * (Qwen3's range) snprintf took 327 us, a digit-at-a-time loop 87 us and this two-digit table
 * 61 us (gcc -O2, one run on the 2-core VM under load; the ratios are what matter), and a
 * worker's body for an 8K-token chat carries 8K ids.
 * Pure: no allocation, no locale, any thread. Cost: one division by 100 per two digits.
 */
#ifndef KVR_BASE_DEC_H
#define KVR_BASE_DEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVR_DEC_U64_MAX 20 /* digits of UINT64_MAX */

/* The digits of v, written so that they end just before end; returns the first digit. */
static inline char *kvr_dec_u64_back(uint64_t v, char *end)
{
    static const char d2[201] = "00010203040506070809101112131415161718192021222324"
                                "25262728293031323334353637383940414243444546474849"
                                "50515253545556575859606162636465666768697071727374"
                                "75767778798081828384858687888990919293949596979899";
    char *p = end;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, d2 + 2 * r, 2);
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, d2 + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    return p;
}

/* The digits of v at out; returns the end of what was written (at most KVR_DEC_U64_MAX). */
static inline char *kvr_dec_u64(char *out, uint64_t v)
{
    char tmp[KVR_DEC_U64_MAX];
    char *p = kvr_dec_u64_back(v, tmp + sizeof tmp);
    size_t n = (size_t)(tmp + sizeof tmp - p);
    memcpy(out, p, n);
    return out + n;
}

#endif

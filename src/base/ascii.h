/*
 * ascii.h: the one ASCII-run scanner of the tree (UTF-8 validation in the JSON layer and the
 * tokenizer, the tokenizer's NFC): where a run of bytes below 0x80 ends. Those scans spend
 * most of their time on ASCII runs, so eight bytes are tested a step and the stop is found by
 * counting trailing zeros (little-endian builds; bytes one by one elsewhere).
 * Threads: none (pure). Cost: O(run / 8).
 */
#ifndef KVR_BASE_ASCII_H
#define KVR_BASE_ASCII_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The first index >= i of s[0..n) holding a byte >= 0x80, or n. */
static inline size_t kvr_ascii_end(const unsigned char *s, size_t i, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        w &= 0x8080808080808080ull;
        if (w != 0)
            return i + ((size_t)__builtin_ctzll(w) >> 3);
        i += 8;
    }
#endif
    while (i < n && s[i] < 0x80)
        i++;
    return i;
}

#endif /* KVR_BASE_ASCII_H */

/*
 * toytok.c: the toy tokenizer (see toytok.h for the definition of the ids).
 *
 * Invariants: encode and count cut pieces the same way (one helper); ids < vocab.
 * Memory: none of its own. Threads: any. Cost: O(len) plus one XXH3_64 per word piece.
 */
#include "wire/toytok.h"

#include <string.h>

#include <xxhash.h>

/* ASCII letters and digits, and every byte of a multi-byte UTF-8 sequence. */
static int is_word(unsigned char c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c >= 0x80;
}

/* The length of the piece starting at s[0] (len >= 1). */
static size_t piece_len(const unsigned char *s, size_t len)
{
    if (!is_word(s[0]))
        return 1;
    size_t n = 1;
    while (n < len && is_word(s[n]))
        n++;
    return n;
}

size_t kvr_toytok_count(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t n = 0;
    for (size_t i = 0; i < len; i += piece_len(s + i, len - i))
        n++;
    return n;
}

int kvr_toytok_encode(const char *text, size_t len, uint32_t vocab, uint32_t *out, size_t cap,
                      size_t *n_out)
{
    *n_out = 0;
    if (vocab < KVR_TOYTOK_MIN_VOCAB)
        return KVR_EINVAL;
    const unsigned char *s = (const unsigned char *)text;
    uint64_t words = vocab - 256u;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t pl = piece_len(s + i, len - i);
        if (n < cap)
            out[n] = pl == 1 ? s[i] : (uint32_t)(256u + XXH3_64bits_withSeed(s + i, pl, 0) % words);
        n++;
        i += pl;
    }
    *n_out = n;
    return n <= cap ? KVR_OK : KVR_ETOOBIG;
}

size_t kvr_toytok_piece(uint32_t id, char out[KVR_TOYTOK_MAX_PIECE + 1])
{
    if (id < 256) {
        out[0] = id >= 0x20 && id < 0x7f ? (char)id : ' ';
        out[1] = '\0';
        return 1;
    }
    /* bijective base 26: v >= 1 spelled with digits 1..26 = 'a'..'z' */
    char rev[KVR_TOYTOK_MAX_PIECE];
    size_t k = 0;
    for (uint64_t v = (uint64_t)id - 256 + 1; v > 0; v = (v - 1) / 26)
        rev[k++] = (char)('a' + (v - 1) % 26);
    out[0] = ' ';
    for (size_t i = 0; i < k; i++)
        out[1 + i] = rev[k - 1 - i];
    out[1 + k] = '\0';
    return 1 + k;
}

size_t kvr_toytok_decode(const uint32_t *ids, size_t n, char *out, size_t cap)
{
    size_t total = 0;
    char piece[KVR_TOYTOK_MAX_PIECE + 1];
    for (size_t i = 0; i < n; i++) {
        size_t pl = kvr_toytok_piece(ids[i], piece);
        if (total < cap)
            memcpy(out + total, piece, cap - total < pl ? cap - total : pl);
        total += pl;
    }
    return total;
}

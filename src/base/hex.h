/*
 * hex.h: the one hex-digit reader of the tree (JSON's \u escapes, multimodal identifiers,
 * template string escapes, the tokenizer tool's bytes_hex).
 * Threads: none (pure). Cost: O(1).
 */
#ifndef KVR_BASE_HEX_H
#define KVR_BASE_HEX_H

/* The value of a hex digit (either case), or -1. */
static inline int kvr_hex_digit(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

#endif /* KVR_BASE_HEX_H */

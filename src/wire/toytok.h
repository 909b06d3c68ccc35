/*
 * toytok.h: a deterministic toy tokenizer (wire layer, pure functions), the stand-in for a
 * real in-process tokenizer: it lets `kvrouter mocker` and the OpenAI front end accept text
 * prompts, hash them into blocks and stream text back, with equal texts always giving equal
 * ids (so prefix caching behaves as it would with a real tokenizer on shared prefixes).
 *
 * Encoding (text bytes to ids):
 *   - the text is cut into pieces: a maximal run of word bytes (ASCII letters, ASCII digits,
 *     and every byte >= 0x80, so a UTF-8 word stays whole) is one piece; every other byte
 *     (whitespace, punctuation, control characters) is a piece of its own;
 *   - a piece of one byte is the id of that byte's value (0..255);
 *   - a longer piece is 256 + XXH3_64(piece bytes, seed 0) % (vocab - 256).
 *   So every id is < vocab, a text of n bytes has at most n tokens, and the encoding of a
 *   concatenation at a piece boundary is the concatenation of the encodings.
 *   Example (vocab 32000): "Hello, world!" -> [25366, 44, 32, 9918, 33];
 *   "a 1" -> [97, 32, 49]; "" -> [].
 * Decoding (id to text piece, for generated tokens, so streamed outputs look like text):
 *   - id < 256: that byte when printable ASCII (0x20..0x7e), else a space;
 *   - id >= 256: a space then the bijective base-26 lowercase spelling of id - 256
 *     (256 -> " a", 281 -> " z", 282 -> " aa", 32767 -> " avbl"), at most 7 letters.
 *   Decoding is not the inverse of encoding (a toy: only its determinism matters).
 *
 * Ownership: callers own every buffer; nothing is allocated. Threads: any. Cost: one pass over
 * the text plus one XXH3 per word piece (~10 ns a word); a piece is O(1).
 */
#ifndef KVR_WIRE_TOYTOK_H
#define KVR_WIRE_TOYTOK_H

#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

#define KVR_TOYTOK_VOCAB 32000u     /* the default vocabulary size */
#define KVR_TOYTOK_MIN_VOCAB 257u   /* the 256 byte ids and at least one word id */
#define KVR_TOYTOK_MAX_PIECE 8      /* bytes of the longest piece (" " + 7 letters) */

/* The number of tokens text[0..len) encodes to (<= len). */
size_t kvr_toytok_count(const char *text, size_t len);

/* Encodes text[0..len) into out[0..cap) and sets *n_out to the number of tokens. KVR_OK;
 * KVR_ETOOBIG when cap < *n_out (the first cap ids are written; cap >= len always suffices);
 * KVR_EINVAL when vocab < KVR_TOYTOK_MIN_VOCAB (nothing written, *n_out 0). */
int kvr_toytok_encode(const char *text, size_t len, uint32_t vocab, uint32_t *out, size_t cap,
                      size_t *n_out);

/* The text piece of id, NUL-terminated in out; returns its length (1..KVR_TOYTOK_MAX_PIECE). */
size_t kvr_toytok_piece(uint32_t id, char out[KVR_TOYTOK_MAX_PIECE + 1]);

/* The pieces of ids[0..n) concatenated: writes the first min(total, cap) bytes to out (no NUL)
 * and returns the total length (<= n * KVR_TOYTOK_MAX_PIECE). */
size_t kvr_toytok_decode(const uint32_t *ids, size_t n, char *out, size_t cap);

#endif /* KVR_WIRE_TOYTOK_H */

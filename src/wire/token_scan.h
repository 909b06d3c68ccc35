/*
 * token_scan.h: the fast reader of JSON token-id arrays shared by the JSON decoders
 * (wire/api_json.c for "tokens" and "token_ids", wire/openai.c for "prompt" and
 * "nvext.token_data"), and of 64-bit hash arrays (the indexer API's "block_hashes").
 * Internal to the wire layer; pure functions, no I/O.
 *
 * A decoder using it parses a body with yajl up to where kvr_token_scan_find() guesses a
 * token array opens, checks with its own parser state that yajl really is at the start of
 * that array (the guess is only textual: the key may sit inside a string or an unknown
 * object), lets kvr_token_scan() read the array, and resumes yajl at the closing ']'.
 *
 * Invariants: kvr_token_scan() accepts exactly `ws (u32 (ws , ws u32)*)? ws ]` with canonical
 * decimal integers (no sign, fraction, exponent or leading zero, value <= 4294967295), which
 * yajl reads as the same integers; it returns false for anything else (odd formatting,
 * invalid JSON, a limit reached), and the caller then lets yajl read the array, so results
 * and error messages never depend on the scanner.
 * Ownership: *buf is the caller's growable array (grown with base/grow.h's kvr_grow, never
 * beyond max elements); the body is borrowed for the call.
 * Threads: none; any thread. Cost: SSE2 masks of 64-byte windows, two count-trailing-zeros and
 * a SWAR multiply per token (~4 ns per token); without SSE2 (or with KVR_TOKEN_SCAN_NO_SIMD or
 * KVR_API_NO_SIMD defined) one token at a time.
 */
#ifndef KVR_WIRE_TOKEN_SCAN_H
#define KVR_WIRE_TOKEN_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The index just after the '[' of the first literal `key ws : ws [` in b[from..len), or 0
 * when there is none. key includes its quotes ("\"tokens\""), key_len its length. */
size_t kvr_token_scan_find(const char *b, size_t len, size_t from, const char *key,
                           size_t key_len);

/* Reads the rest of an array from b[p] (just after its '['). On success the ids are in
 * (*buf)[0..*n_out), *close is the index of the ']', and true is returned. */
bool kvr_token_scan(const char *b, size_t len, size_t p, uint32_t **buf, size_t *cap,
                    size_t max, size_t *close, size_t *n_out);

/* The same for an array of 64-bit integers (block hashes): `ws (i (ws , ws i)*)? ws ]` where
 * i is a canonical decimal integer in [-2^63, 2^64) (a negative one stored as its two's
 * complement), as yajl reads them. One number at a time (~1 ns per digit). */
bool kvr_int64_scan(const char *b, size_t len, size_t p, uint64_t **buf, size_t *cap, size_t max,
                    size_t *close, size_t *n_out);

#endif /* KVR_WIRE_TOKEN_SCAN_H */

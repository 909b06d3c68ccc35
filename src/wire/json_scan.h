/*
 * json_scan.h: where JSON values and object members begin and end, without building them.
 * The front end uses it to rewrite request bodies and find fields in worker answers; the
 * splicer (json_splice.h) to check and copy a worker's answer. Two modes:
 *   KVR_JSON_STRICT   RFC 8259: strings (escapes, no raw controls, valid UTF-8), numbers (the
 *                     grammar), true/false/null, nesting at most KVR_JSON_MAX_DEPTH;
 *   KVR_JSON_LENIENT  structure only: a string ends at its first unescaped quote, brackets
 *                     balance (any depth, no recursion), a scalar runs to a delimiter, and a
 *                     flat array (token ids) is crossed with memchr. For bytes another decoder
 *                     has validated, or that are forwarded untouched when they do not scan.
 * On valid JSON both modes find the same ends (fuzz_json_scan checks it).
 * Pure: no allocation, no globals, any thread. Cost: one pass; STRICT recursion is bounded.
 */
#ifndef KVR_WIRE_JSON_SCAN_H
#define KVR_WIRE_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVR_JSON_BAD SIZE_MAX
#define KVR_JSON_MAX_DEPTH 64

typedef enum kvr_json_mode { KVR_JSON_LENIENT, KVR_JSON_STRICT } kvr_json_mode_t;

/* One object member: its key (quotes included) and its value. */
typedef struct kvr_json_member {
    size_t key, key_end;
    size_t val, val_end;
} kvr_json_member_t;

/* Whether member m of b holds the literal null (its value is exactly those four bytes). */
static inline bool kvr_json_member_is_null(const char *b, const kvr_json_member_t *m)
{
    return m->val_end - m->val == 4 && memcmp(b + m->val, "null", 4) == 0;
}

/* The first index >= i of b[0..n) that is not JSON whitespace (n when none). */
size_t kvr_json_skip_ws(const char *b, size_t n, size_t i);
/* The index just after the value starting at b[i], or KVR_JSON_BAD. */
size_t kvr_json_skip_value(const char *b, size_t n, size_t i, kvr_json_mode_t mode);
/* The member whose key's opening quote is b[i]: fills *m and returns m->val_end, or
 * KVR_JSON_BAD. */
size_t kvr_json_next_member(const char *b, size_t n, size_t i, kvr_json_mode_t mode,
                            kvr_json_member_t *m);
/* Walks an object's members in order: begin at its '{' (b[i] must be '{'), then next until
 * it returns 0 (the object closed at it->close) or -1 (it does not scan: a bad member, or
 * something other than ',' or '}' after one). Every object loop of the tree is this one. */
typedef struct kvr_json_iter {
    const char *b;
    size_t n, i, close;
    kvr_json_mode_t mode;
    bool started;
} kvr_json_iter_t;
void kvr_json_object_begin(kvr_json_iter_t *it, const char *b, size_t n, size_t i,
                           kvr_json_mode_t mode);
/* 1 with the next member in *m; 0 at the end ('}' at it->close); -1 when it does not scan. */
int kvr_json_object_next(kvr_json_iter_t *it, kvr_json_member_t *m);
/* Whether the member's key reads name (ASCII, no controls) once its escapes are decoded, as a
 * JSON parser reads it ("nv\u0065xt" is "nvext"); a malformed escape never matches. */
bool kvr_json_key_is(const char *b, const kvr_json_member_t *m, const char *name);

#endif /* KVR_WIRE_JSON_SCAN_H */

/*
 * json_writer.h: a small JSON builder into a growable, reused buffer (wire layer, no I/O).
 *
 *   kvr_json_writer_reset(w);
 *   kvr_json_begin_object(w);
 *   kvr_json_key(w, "worker_id"); kvr_json_u64(w, id);
 *   kvr_json_end_object(w);
 *   if (kvr_json_writer_finish(w, &body, &len) != KVR_OK) ...
 *
 * Commas and colons are automatic. Strings are written as given, escaped where JSON requires
 * (quote, backslash, control characters as \n \t \r \b \f or \u00XX); bytes that are not valid
 * UTF-8 (stray continuation bytes, overlong forms, surrogates, > U+10FFFF, truncated sequences)
 * are replaced by U+FFFD, one per offending byte, so the output is always valid UTF-8 JSON.
 * Integers are exact (u64, i64). Doubles: finite values in the shortest %.Ng form (N <= 17
 * significant digits) that reads back as the same double ("0.1", "1e+300", "-0", "5e-324");
 * NaN and infinities are written as null (JSON has no spelling for them).
 *
 * Errors are sticky: the first misuse (a value where a key is due, a key outside an object,
 * an unbalanced end, a second top-level value, nesting deeper than KVR_JSON_MAX_DEPTH) sets
 * KVR_EINVAL, a failed allocation KVR_ENOMEM; later calls do nothing and return that status.
 * Every call returns the writer's status, so callers may check once, at finish.
 *
 * Ownership: the writer owns its buffer; the pointer from finish is valid until the next call
 * that writes, reset or deinit. Memory: the buffer grows geometrically to the largest document
 * and is kept across reset, so steady-state writing allocates nothing.
 * Threads: one writer per thread. Cost: O(output bytes); a double costs one to three
 * snprintf/strtod pairs (up to 17 for the rare value whose shortest form has 15 digits).
 */
#ifndef KVR_WIRE_JSON_WRITER_H
#define KVR_WIRE_JSON_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

#define KVR_JSON_MAX_DEPTH 64

typedef struct kvr_json_writer {
    /* private */
    char *buf;
    size_t len, cap;
    int status;
    unsigned depth;        /* open containers */
    bool after_key;        /* a key was written; its value is due */
    bool top_done;         /* the top-level value is complete */
    uint64_t is_object;    /* bit d: container at depth d + 1 is an object */
    uint64_t has_items;    /* bit d: container at depth d + 1 has an element (comma due) */
} kvr_json_writer_t;

void kvr_json_writer_init(kvr_json_writer_t *w);
void kvr_json_writer_deinit(kvr_json_writer_t *w);
/* Empties the document (keeps the buffer) and clears the status. */
void kvr_json_writer_reset(kvr_json_writer_t *w);
/* The writer's status (KVR_OK, KVR_EINVAL or KVR_ENOMEM). */
int kvr_json_writer_status(const kvr_json_writer_t *w);
/* KVR_OK with the document (NUL-terminated, *len bytes without the NUL) when exactly one
 * complete top-level value was written; KVR_EINVAL (incomplete) or the sticky status. */
int kvr_json_writer_finish(kvr_json_writer_t *w, const char **data, size_t *len);

int kvr_json_begin_object(kvr_json_writer_t *w);
int kvr_json_end_object(kvr_json_writer_t *w);
int kvr_json_begin_array(kvr_json_writer_t *w);
int kvr_json_end_array(kvr_json_writer_t *w);

/* An object key (escaped like a string); the next call must write its value. */
int kvr_json_key(kvr_json_writer_t *w, const char *key);
int kvr_json_key_n(kvr_json_writer_t *w, const char *key, size_t len);

/* Values. kvr_json_string(w, NULL) writes null. */
int kvr_json_string(kvr_json_writer_t *w, const char *s);
int kvr_json_string_n(kvr_json_writer_t *w, const char *s, size_t len);
int kvr_json_u64(kvr_json_writer_t *w, uint64_t v);
int kvr_json_i64(kvr_json_writer_t *w, int64_t v);
int kvr_json_double(kvr_json_writer_t *w, double v);
int kvr_json_bool(kvr_json_writer_t *w, bool v);
int kvr_json_null(kvr_json_writer_t *w);
/* One value copied as it is: json[0..len) must be one complete JSON value the caller has
 * validated (the writer checks only that it is not empty). */
int kvr_json_raw(kvr_json_writer_t *w, const char *json, size_t len);

/* True when s[0..len) is valid UTF-8 (no overlong forms, surrogates or code points above
 * U+10FFFF): what the writer copies through unchanged. */
bool kvr_json_utf8_valid(const char *s, size_t len);

/* The OpenAI error body as one value: {"error":{"message":..,"type":..,"code":code}}, with
 * code the HTTP status (vLLM's convention). message and type NULL are written as null. */
int kvr_json_error(kvr_json_writer_t *w, const char *message, const char *type, int code);

#endif /* KVR_WIRE_JSON_WRITER_H */

/*
 * json_splice.h: adds one member at the end of a JSON object without re-encoding it (how the
 * OpenAI front end gives each worker answer its "nvext":{"worker_id":{...}}).
 *
 * What it accepts: json[0..len) holding exactly one JSON object (RFC 8259), with optional
 * whitespace (space, tab, LF, CR) around it. The object is checked in full, because it comes
 * from a worker and is not trusted: strings (escapes \" \\ \/ \b \f \n \r \t \uXXXX, no raw
 * control characters, valid UTF-8 without overlong forms or surrogates), numbers (the JSON
 * grammar: no leading zeros, no bare '-' or '.'), true / false / null, nesting at most
 * KVR_JSON_SPLICE_MAX_DEPTH deep, and nothing after the object. Anything else (truncated,
 * malformed, an array, two objects) is refused with KVR_EPARSE and no output: the caller
 * forwards the original bytes instead, so a bad answer is never mangled.
 *
 * What it writes, to out:
 *  - when no top-level member is named drop: the object's bytes from its '{' to just before
 *    its '}' exactly as they were (inner whitespace included), a ',' unless the object has no
 *    members, member, '}';
 *  - otherwise the object rebuilt without the dropped members: '{', each kept member's bytes
 *    from its key's opening quote to its value's last byte (byte for byte, in order), joined by
 *    ',', then ',' (when any member was kept), member, '}'.
 * Whitespace outside the object is not copied. Keys are compared with drop after decoding
 * their escapes (so "nv\u0065xt" is "nvext" too), as a JSON parser would read them; duplicate
 * keys named drop are all dropped. member is the caller's text ("key":value, no comma) and is
 * copied as it is, unchecked; an empty member adds nothing (and no comma).
 *
 * Memory: none allocated; the caller's out needs KVR_JSON_SPLICE_OUT_BYTES(len, member_len).
 * Cost: one pass over the input (plus a second one over members when one is dropped); the
 * recursion is bounded by the depth limit. Pure: no I/O, no globals; any thread.
 */
#ifndef KVR_WIRE_JSON_SPLICE_H
#define KVR_WIRE_JSON_SPLICE_H

#include <stddef.h>

#include "kvrouter.h"

#define KVR_JSON_SPLICE_MAX_DEPTH 64 /* = KVR_JSON_MAX_DEPTH (json_scan.h) */
/* The output is never longer than this. */
#define KVR_JSON_SPLICE_OUT_BYTES(len, member_len) ((len) + (member_len) + 2)

/* Writes json with member as its last member (and without the top-level members named drop,
 * a NUL-terminated ASCII name; NULL drops nothing) to out[0..*out_len). KVR_OK; KVR_EPARSE
 * when json is not one valid object (nothing written, *out_len = 0); KVR_EINVAL when out_cap
 * is below KVR_JSON_SPLICE_OUT_BYTES(len, member_len) or a pointer is NULL. */
int kvr_json_splice(const char *json, size_t len, const char *drop, const char *member,
                    size_t member_len, char *out, size_t out_cap, size_t *out_len);

#endif /* KVR_WIRE_JSON_SPLICE_H */

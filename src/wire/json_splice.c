/*
 * json_splice.c: one member added at the end of a JSON object (see json_splice.h for the
 * exact input accepted and output written).
 *
 * The object is scanned in full by json_scan's strict mode (depth-bounded) before anything is
 * written, so a refusal never leaves partial output.
 */
#include "wire/json_splice.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "wire/json_scan.h"

#define BAD KVR_JSON_BAD
#define STRICT KVR_JSON_STRICT

_Static_assert(KVR_JSON_SPLICE_MAX_DEPTH == KVR_JSON_MAX_DEPTH, "one depth limit");

static size_t skip_ws(const char *b, size_t n, size_t i) { return kvr_json_skip_ws(b, n, i); }

/* Scans the top-level object at b[s..n): whether it has a member named drop (counted) and
 * where its closing brace is; false when it does not scan. */
static bool scan_top(const char *b, size_t n, size_t s, const char *drop, size_t *n_members,
                     bool *has_drop, size_t *close)
{
    *n_members = 0;
    *has_drop = false;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int r;
    kvr_json_object_begin(&it, b, n, s, STRICT);
    while ((r = kvr_json_object_next(&it, &m)) == 1) {
        (*n_members)++;
        if (drop != NULL && !*has_drop && kvr_json_key_is(b, &m, drop))
            *has_drop = true;
    }
    *close = it.close;
    return r == 0;
}

int kvr_json_splice(const char *json, size_t len, const char *drop, const char *member,
                    size_t member_len, char *out, size_t out_cap, size_t *out_len)
{
    if (out_len == NULL)
        return KVR_EINVAL;
    *out_len = 0;
    if ((json == NULL && len > 0) || (member == NULL && member_len > 0) || out == NULL ||
        out_cap < KVR_JSON_SPLICE_OUT_BYTES(len, member_len))
        return KVR_EINVAL;
    size_t s = skip_ws(json, len, 0), close, n_members;
    bool has_drop;
    if (s >= len || json[s] != '{' ||
        !scan_top(json, len, s, drop, &n_members, &has_drop, &close) ||
        skip_ws(json, len, close + 1) != len)
        return KVR_EPARSE;
    size_t o = 0;
    bool any = n_members > 0;
    if (!has_drop) {
        memcpy(out, json + s, close - s);
        o = close - s;
    } else {
        out[o++] = '{';
        any = false;
        size_t i = skip_ws(json, len, s + 1);
        for (size_t k = 0; k < n_members; k++) {
            kvr_json_member_t m;
            i = kvr_json_next_member(json, len, i, STRICT, &m); /* scanned above: cannot fail */
            if (!kvr_json_key_is(json, &m, drop)) {
                if (any)
                    out[o++] = ',';
                memcpy(out + o, json + m.key, m.val_end - m.key);
                o += m.val_end - m.key;
                any = true;
            }
            i = skip_ws(json, len, i);
            i = skip_ws(json, len, i + 1); /* past ',' (or the '}' on the last) */
        }
    }
    if (any && member_len > 0)
        out[o++] = ',';
    if (member_len > 0)
        memcpy(out + o, member, member_len);
    o += member_len;
    out[o++] = '}';
    *out_len = o;
    return KVR_OK;
}

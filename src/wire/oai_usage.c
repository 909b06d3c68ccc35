/*
 * oai_usage.c: see oai_usage.h.
 */
#include "wire/oai_usage.h"

#include "wire/json_scan.h"

/* The value span of member `name` of the object starting at b[i] ('{'); false when absent. */
static bool member(const char *b, size_t n, size_t i, const char *name, kvr_json_member_t *out)
{
    i = kvr_json_skip_ws(b, n, i);
    if (i >= n || b[i] != '{')
        return false;
    kvr_json_iter_t it;
    kvr_json_object_begin(&it, b, n, i, KVR_JSON_LENIENT);
    kvr_json_member_t m;
    while (kvr_json_object_next(&it, &m) == 1)
        if (kvr_json_key_is(b, &m, name)) {
            *out = m;
            return true;
        }
    return false;
}

bool kvr_oai_usage_cached_tokens(const char *b, size_t n, uint64_t *cached)
{
    kvr_json_member_t u, d, c;
    if (!member(b, n, 0, "usage", &u) || !member(b, n, u.val, "prompt_tokens_details", &d) ||
        !member(b, n, d.val, "cached_tokens", &c))
        return false;
    uint64_t v = 0;
    size_t i = c.val;
    if (i >= c.val_end || b[i] < '0' || b[i] > '9')
        return false;
    for (; i < c.val_end && b[i] >= '0' && b[i] <= '9'; i++) {
        if (v > ((uint64_t)INT64_MAX - 9) / 10)
            return false; /* beyond any real count (and past a signed 64-bit reader's) */
        v = v * 10 + (uint64_t)(b[i] - '0');
    }
    if (i != c.val_end)
        return false; /* a fraction or exponent: not a count */
    *cached = v;
    return true;
}

/*
 * fuzz_json_scan.c: libFuzzer target for the JSON span scanner (wire/json_scan.c), which
 * reads worker answers (not trusted) and client bodies in the front end.
 *
 * Input: any bytes, scanned as one value after leading whitespace, and as an object's members
 * when it is one. Invariants checked: a value the strict mode accepts and that ends where a
 * value in a document can (a delimiter or the end), the lenient mode accepts with the same end (the lenient mode is used on validated bytes and must find the same
 * spans); the members found by both modes agree span for span; kvr_json_key_is agrees with an
 * independent decoding of the key (every escape, \u to UTF-8) compared with the name; no end
 * lies past the input.
 * Memory: stack only. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/json_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* The key b[k+1..ke-1) decoded (escapes, \u as UTF-8 with surrogate pairs joined); false
 * when an escape is malformed or the result does not fit. */
static bool decode_key(const char *b, size_t k, size_t ke, char *out, size_t cap, size_t *len)
{
    size_t o = 0;
    for (size_t i = k + 1; i + 1 < ke; i++) {
        unsigned cp = (unsigned char)b[i];
        if (b[i] == '\\') {
            char e = b[++i];
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *f = e != 'u' ? strchr(from, e) : NULL;
            if (f != NULL && e != '\0') {
                cp = (unsigned char)to[f - from];
            } else if (e == 'u') {
                cp = (unsigned)strtoul((char[5]){b[i + 1], b[i + 2], b[i + 3], b[i + 4], 0}, NULL,
                                       16);
                i += 4;
            } else {
                return false;
            }
            if (cp >= 0x80) { /* non-ASCII: never equal to an ASCII name, mark it */
                if (o == cap)
                    return false;
                out[o++] = '\x80';
                continue;
            }
        }
        if (o == cap)
            return false;
        out[o++] = (char)cp;
    }
    *len = o;
    return true;
}

static void check_key(const char *b, const kvr_json_member_t *m, const char *name)
{
    char dec[512];
    size_t dl;
    bool want = decode_key(b, m->key, m->key_end, dec, sizeof dec, &dl) && dl == strlen(name) &&
                memcmp(dec, name, dl) == 0;
    check(kvr_json_key_is(b, m, name) == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *b = (const char *)data;
    size_t i = kvr_json_skip_ws(b, size, 0);
    size_t s = kvr_json_skip_value(b, size, i, KVR_JSON_STRICT);
    size_t l = kvr_json_skip_value(b, size, i, KVR_JSON_LENIENT);
    check(s == KVR_JSON_BAD || s <= size);
    check(l == KVR_JSON_BAD || l <= size);
    if (s == KVR_JSON_BAD)
        return 0;
    /* a value in a document ends at a delimiter: only there must the modes agree */
    if (s < size && (b[s] == '\0' || strchr(" \t\n\r,]}", b[s]) == NULL))
        return 0;
    check(l == s);
    if (b[i] != '{')
        return 0;
    /* the two modes' member walks agree member for member, and end alike */
    kvr_json_iter_t its, itl;
    kvr_json_member_t ms, ml;
    kvr_json_object_begin(&its, b, size, i, KVR_JSON_STRICT);
    kvr_json_object_begin(&itl, b, size, i, KVR_JSON_LENIENT);
    int rs, rl;
    while ((rs = kvr_json_object_next(&its, &ms)) == 1) {
        rl = kvr_json_object_next(&itl, &ml);
        check(rl == 1 && ms.key == ml.key && ms.key_end == ml.key_end && ms.val == ml.val &&
              ms.val_end == ml.val_end);
        check_key(b, &ms, "nvext");
        check_key(b, &ms, "prompt");
    }
    rl = kvr_json_object_next(&itl, &ml);
    check(rs == 0 && rl == 0 && its.close == itl.close && its.close + 1 == s);
    return 0;
}

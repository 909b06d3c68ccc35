/*
 * fuzz_json_splice.c: libFuzzer target for the member splicer (wire/json_splice.c), which
 * reads worker answers (not trusted) in the router's OpenAI front end.
 *
 * Input: the bytes of one worker answer. The splicer drops "nvext" and adds a fixed member.
 * Invariants checked, with yajl as the independent oracle: a success writes at most
 * KVR_JSON_SPLICE_OUT_BYTES; its input is one valid JSON object (yajl accepts it) and its
 * output is one too, ending with ,member} (or {member}); without a top-level "nvext" the
 * output is the input's object up to its closing brace byte for byte; with one, the output's
 * members are the input's in order without "nvext" (each value equal once re-serialized by
 * yajl), then the member; each kept member's bytes (key to value) appear in the output, in
 * order. A refusal writes nothing. Splicing the output again (dropping nothing) must succeed.
 * Memory: one output buffer per input. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_parse.h>
#include <yajl/yajl_tree.h>

#include "kvrouter.h"
#include "wire/json_splice.h"

#define MEMBER "\"nvext\":{\"worker_id\":{\"prefill_worker_id\":1,\"decode_dp_rank\":0}}"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* Whether b[0..n) is one JSON value per yajl (strict: no comments, no trailing bytes). */
static bool yajl_valid(const char *b, size_t n)
{
    yajl_handle h = yajl_alloc(NULL, NULL, NULL);
    check(h != NULL);
    bool ok = yajl_parse(h, (const unsigned char *)b, n) == yajl_status_ok &&
              yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    return ok;
}

static yajl_val tree(const char *b, size_t n)
{
    char *t = malloc(n + 1);
    check(t != NULL);
    memcpy(t, b, n);
    t[n] = '\0';
    yajl_val v = yajl_tree_parse(t, NULL, 0);
    free(t);
    return v;
}

static void gen_value(yajl_gen g, yajl_val v)
{
    if (YAJL_IS_OBJECT(v)) {
        yajl_gen_map_open(g);
        for (size_t i = 0; i < v->u.object.len; i++) {
            const char *k = v->u.object.keys[i];
            yajl_gen_string(g, (const unsigned char *)k, strlen(k));
            gen_value(g, v->u.object.values[i]);
        }
        yajl_gen_map_close(g);
    } else if (YAJL_IS_ARRAY(v)) {
        yajl_gen_array_open(g);
        for (size_t i = 0; i < v->u.array.len; i++)
            gen_value(g, v->u.array.values[i]);
        yajl_gen_array_close(g);
    } else if (YAJL_IS_STRING(v)) {
        yajl_gen_string(g, (const unsigned char *)v->u.string, strlen(v->u.string));
    } else if (YAJL_IS_NUMBER(v)) {
        yajl_gen_number(g, v->u.number.r, strlen(v->u.number.r));
    } else if (YAJL_IS_TRUE(v)) {
        yajl_gen_bool(g, 1);
    } else if (YAJL_IS_FALSE(v)) {
        yajl_gen_bool(g, 0);
    } else {
        yajl_gen_null(g);
    }
}

static bool same_value(yajl_val a, yajl_val b)
{
    yajl_gen ga = yajl_gen_alloc(NULL), gb = yajl_gen_alloc(NULL);
    check(ga != NULL && gb != NULL);
    gen_value(ga, a);
    gen_value(gb, b);
    const unsigned char *pa, *pb;
    size_t la, lb;
    yajl_gen_get_buf(ga, &pa, &la);
    yajl_gen_get_buf(gb, &pb, &lb);
    bool same = la == lb && memcmp(pa, pb, la) == 0;
    yajl_gen_free(ga);
    yajl_gen_free(gb);
    return same;
}

static size_t trim_ws_end(const char *b, size_t n)
{
    while (n > 0 && (b[n - 1] == ' ' || b[n - 1] == '\t' || b[n - 1] == '\n' || b[n - 1] == '\r'))
        n--;
    return n;
}

static size_t skip_ws(const char *b, size_t n)
{
    size_t i = 0;
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    return i;
}

static bool contains(const char *h, size_t n, const char *needle)
{
    size_t l = strlen(needle);
    for (size_t i = 0; i + l <= n; i++)
        if (memcmp(h + i, needle, l) == 0)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    const size_t ml = sizeof MEMBER - 1, cap = KVR_JSON_SPLICE_OUT_BYTES(size, ml);
    char *out = malloc(cap + 1);
    check(out != NULL);
    memset(out, 0x5a, cap + 1);
    size_t n = 7;
    int rc = kvr_json_splice(in, size, "nvext", MEMBER, ml, out, cap, &n);
    check(rc == KVR_OK || rc == KVR_EPARSE);
    check(out[cap] == 0x5a);
    if (rc != KVR_OK) {
        check(n == 0);
        for (size_t i = 0; i < cap; i++)
            check(out[i] == 0x5a);
        free(out);
        return 0;
    }
    check(n <= cap && n >= ml + 2);
    /* accepted input is valid JSON (the splicer may be stricter than yajl, never laxer) */
    check(yajl_valid(in, size));
    check(yajl_valid(out, n));
    check(out[0] == '{' && out[n - 1] == '}' && memcmp(out + n - 1 - ml, MEMBER, ml) == 0);
    yajl_val vi = tree(in, size), vo = tree(out, n);
    check(vi != NULL && vo != NULL && YAJL_IS_OBJECT(vi) && YAJL_IS_OBJECT(vo));
    bool had = false; /* an escaped NUL key reads as "nvext" to strcmp: counted as had */
    for (size_t i = 0; i < vi->u.object.len; i++)
        had = had || strcmp(vi->u.object.keys[i], "nvext") == 0;
    size_t s = skip_ws(in, size), e = trim_ws_end(in, size);
    if (!had) {
        /* the input's object but its '}', byte for byte, then [,]member} */
        size_t body = e - 1 - s;
        check(memcmp(out, in + s, body) == 0);
        size_t rest = n - body;
        check(rest == ml + 1 || (rest == ml + 2 && out[body] == ','));
        check(vo->u.object.len == vi->u.object.len + 1);
    }
    /* the members: the input's without nvext, in order, values unchanged, then the new one
     * (yajl_tree keys are C strings: skipped when a key may hold an escaped NUL) */
    bool nul_key = contains(in, size, "\\u0000");
    size_t k = 0;
    for (size_t i = 0; i < vi->u.object.len && !nul_key; i++) {
        if (strcmp(vi->u.object.keys[i], "nvext") == 0)
            continue;
        check(k < vo->u.object.len);
        check(strcmp(vi->u.object.keys[i], vo->u.object.keys[k]) == 0);
        check(same_value(vi->u.object.values[i], vo->u.object.values[k]));
        k++;
    }
    check(nul_key || (k + 1 == vo->u.object.len && strcmp(vo->u.object.keys[k], "nvext") == 0));
    yajl_tree_free(vi);
    yajl_tree_free(vo);
    /* the output splices again (nothing dropped, nothing added): a fixed point */
    char *again = malloc(n + 2);
    check(again != NULL);
    size_t n2 = 0;
    check(kvr_json_splice(out, n, NULL, NULL, 0, again, n + 2, &n2) == KVR_OK);
    check(n2 == n && memcmp(again, out, n) == 0);
    free(again);
    free(out);
    return 0;
}

/*
 * fuzz_jinja_json.c: libFuzzer target for the chat template's JSON reader
 * (src/tokenizer/jinja_json.c): a request's messages, tools and kwargs are read into values by
 * a one-pass reader that must read exactly as yajl's tree does, or pass the text on.
 *
 * Input: any bytes, read both ways. Invariants checked: the reader returns KVR_OK or
 * KVR_EPARSE; when it takes the text, yajl's reading succeeds and gives the same value (kinds,
 * bytes, numbers to the bit, members in order); when it passes the text on, the arena is as it
 * was. Memory: both arenas freed per input (LeakSanitizer). Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter/status.h"
#include "tokenizer/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct jarena a, b;
    ja_init(&a, 8 << 20);
    ja_init(&b, 8 << 20);
    check(ja_alloc(&a, 64) != NULL);
    struct jarena before = a;
    struct jv va, vb;
    char err[256] = "";
    int ra = jv_from_json_text(&a, (const char *)data, size, &va);
    check(ra == KVR_OK || ra == KVR_EPARSE);
    if (ra == KVR_OK) {
        int rb = jv_from_json_yajl(&b, (const char *)data, size, &vb, err, sizeof err);
        check(rb == KVR_OK && jv_same(va, vb));
    } else {
        check(a.head == before.head && a.total == before.total);
    }
    ja_free(&a);
    ja_free(&b);
    return 0;
}

/*
 * fuzz_oai_usage.c: libFuzzer target for the reader of an answer's cached-token report
 * (wire/oai_usage.c), which reads worker answers and stream chunks (not trusted).
 *
 * Input: any bytes. Invariants checked, against yajl's tree parser (an independent JSON
 * parser, Debian's libyajl): on a document yajl parses, where "cached_tokens" occurs once (so
 * duplicate keys cannot make the two readers pick different members), the reader finds a count
 * exactly when yajl has an integer >= 0 at usage.prompt_tokens_details.cached_tokens, and the
 * same one (inputs where yajl is laxer than JSON are left out: it takes \v and \f as space); on any bytes it never reads past the input (ASan) and never crashes.
 * Memory: yajl's tree per input. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_tree.h>

#include "wire/oai_usage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t occurrences(const char *b, size_t n, const char *needle)
{
    size_t k = strlen(needle), c = 0;
    for (size_t i = 0; i + k <= n; i++)
        c += memcmp(b + i, needle, k) == 0;
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    const char *b = (const char *)data;
    uint64_t got = 0;
    bool found = kvr_oai_usage_cached_tokens(b, size, &got);
    char *z = malloc(size + 1);
    if (z == NULL)
        return 0;
    memcpy(z, data, size);
    z[size] = '\0';
    yajl_val tree = memchr(data, '\0', size) == NULL ? yajl_tree_parse(z, NULL, 0) : NULL;
    if (tree != NULL && YAJL_IS_OBJECT(tree) && occurrences(b, size, "cached_tokens") == 1 &&
        occurrences(b, size, "\\") == 0 && occurrences(b, size, "-0") == 0 &&
        memchr(data, '\v', size) == NULL && memchr(data, '\f', size) == NULL) {
        /* no escapes (a key reads as its bytes), no -0 (an integer to yajl, not a count), no
         * \v or \f (whitespace to yajl, not to JSON) */
        static const char *path[] = {"usage", "prompt_tokens_details", "cached_tokens", NULL};
        yajl_val v = yajl_tree_get(tree, path, yajl_t_number);
        bool want = v != NULL && YAJL_IS_INTEGER(v) && YAJL_GET_INTEGER(v) >= 0;
        if (found != want)
            abort();
        if (want && got != (uint64_t)YAJL_GET_INTEGER(v))
            abort();
    }
    yajl_tree_free(tree);
    free(z);
    return 0;
}

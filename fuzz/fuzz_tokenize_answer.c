/*
 * fuzz_tokenize_answer.c: libFuzzer target for a worker's /tokenize answer
 * (wire/tokenize_answer.c), untrusted bytes.
 * Invariants checked: no crash or leak; on KVR_OK, at most max ids, and the ids written back
 * canonically as {"tokens":[...]} decode to the same ids (the fast scanner and the slow path
 * agree); KVR_ETOOBIG only with more than max ids, its message naming "tokens:"; every
 * refusal writes a message. Memory: the id buffers, freed per input. Threads: libFuzzer's one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/tokenize_answer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const size_t max = 64;
    uint32_t *ids = NULL, *again = NULL;
    size_t cap = 0, cap2 = 0, n = 0, n2 = 0;
    char err[160];
    int rc =
        kvr_tokenize_answer_decode((const char *)data, size, max, &ids, &cap, &n, err, sizeof err);
    if (rc == KVR_OK) {
        check(n <= max);
        char *text = malloc(16 + n * 11);
        check(text != NULL);
        size_t o = (size_t)sprintf(text, "{\"tokens\":[");
        for (size_t i = 0; i < n; i++)
            o += (size_t)sprintf(text + o, i ? ",%u" : "%u", ids[i]);
        o += (size_t)sprintf(text + o, "]}");
        check(kvr_tokenize_answer_decode(text, o, max, &again, &cap2, &n2, err, sizeof err) ==
              KVR_OK);
        check(n2 == n && (n == 0 || memcmp(ids, again, n * sizeof *ids) == 0));
        free(text);
    } else {
        check(rc == KVR_EPARSE || rc == KVR_ETOOBIG || rc == KVR_ENOMEM);
        check(err[0] != '\0' || rc == KVR_ENOMEM);
        if (rc == KVR_ETOOBIG)
            check(strncmp(err, "tokens:", 7) == 0);
    }
    free(ids);
    free(again);
    return 0;
}

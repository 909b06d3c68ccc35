/*
 * fuzz_ix_answer.c: libFuzzer target for the remote indexer's answer reader
 * (wire/ix_answer.c), the trust boundary of `serve --remote-indexer`: whatever the indexer
 * (or anything at its address) answers decides the router's overlaps.
 *
 * The first byte picks the block size (1..256); the rest is the answer. Invariants checked: a
 * refusal has a message; an acceptance yields at most max matches, each with device_blocks
 * >= 1 and no host or disk blocks (the answer's scores are the device tier); reading the same
 * bytes twice gives the same matches. Memory: the match buffer grows and is freed per input.
 * Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/ix_answer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint32_t bs = (uint32_t)data[0] + 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kvr_match_t *m = NULL, *m2 = NULL;
    size_t cap = 0, cap2 = 0, n = 0, n2 = 0;
    char err[200] = "";
    int rc = kvr_ix_answer_parse(text, len, bs, 64, &m, &cap, &n, err, sizeof err);
    int rc2 = kvr_ix_answer_parse(text, len, bs, 64, &m2, &cap2, &n2, NULL, 0);
    check(rc == rc2);
    if (rc != KVR_OK) {
        check(err[0] != '\0');
    } else {
        check(n <= 64 && n == n2);
        check(n == 0 || memcmp(m, m2, n * sizeof *m) == 0);
        for (size_t i = 0; i < n; i++)
            check(m[i].device_blocks >= 1 && m[i].host_blocks == 0 && m[i].disk_blocks == 0);
    }
    free(m);
    free(m2);
    return 0;
}

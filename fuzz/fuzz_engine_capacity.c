/*
 * fuzz_engine_capacity.c: libFuzzer target for the reader of an engine's /metrics text
 * (wire/engine_capacity.c: a worker's bytes, read to learn its KV-cache size).
 *
 * Invariants checked: no crash, no read outside the input (ASan, the input is not
 * NUL-terminated); an accepted text gives blocks >= 1, blocks = tokens / block size, a known
 * source; a refused one writes its error as a NUL-terminated string; the first byte picks the
 * router's block size so sizes other than 16 are reached.
 * Memory: none. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/engine_capacity.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t bs = size > 0 ? 1u + data[0] % 64 : 16;
    kvr_engine_capacity_t c;
    char err[128];
    memset(err, 'x', sizeof err);
    int rc = kvr_engine_capacity_parse((const char *)data, size, bs, &c, err, sizeof err);
    if (rc == KVR_OK) {
        check(c.blocks >= 1 && c.blocks == c.tokens / bs);
        check(c.source == KVR_CAPACITY_VLLM || c.source == KVR_CAPACITY_SGLANG);
    } else {
        check(rc == KVR_ENOTFOUND || rc == KVR_EPARSE || rc == KVR_EINVAL);
        check(memchr(err, '\0', sizeof err) != NULL);
    }
    return 0;
}

/*
 * fuzz_ix_peer_regs.c: libFuzzer target for the reader of a peer indexer's GET /workers answer
 * (indexer/ix_peer_regs.c): the bytes come from another process over HTTP (not trusted), and
 * what it returns is registered as engines to subscribe to.
 *
 * Input: any bytes. Invariants checked: the reader never reads past the input (ASan) nor
 * crashes; it answers KVR_OK, KVR_EPARSE, KVR_EFULL or KVR_ENOMEM, with no entries and an error
 * text unless KVR_OK; on KVR_OK, at most max entries, every string of an entry lies inside the
 * input with its stated length, every entry has a block size in [1, 65536] (names and
 * addresses are judged by the registration, not here), and reading the same bytes twice gives
 * the same answer (no hidden state).
 * Memory: the entries per input. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "indexer/ix_peer_regs.h"
#include "kvrouter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const char *b, size_t n, const char *p, size_t len)
{
    if (p == NULL) {
        if (len != 0)
            abort();
        return;
    }
    if (p < b || p + len > b + n)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    const char *b = (const char *)data;
    const size_t max = 64;
    kvr_ix_peer_reg_t *e = NULL, *e2 = NULL;
    size_t n = 0, n2 = 0;
    char err[256] = "", err2[256] = "";
    int rc = kvr_ix_peer_regs_read(b, size, max, &e, &n, err, sizeof err);
    int rc2 = kvr_ix_peer_regs_read(b, size, max, &e2, &n2, err2, sizeof err2);
    if (rc != rc2 || n != n2 || strcmp(err, err2) != 0)
        abort();
    if (rc != KVR_OK) {
        if ((rc != KVR_EPARSE && rc != KVR_EFULL && rc != KVR_ENOMEM) || e != NULL || n != 0 ||
            (rc != KVR_ENOMEM && err[0] == '\0'))
            abort();
        return 0;
    }
    if (n > max || (n > 0 && e == NULL))
        abort();
    for (size_t i = 0; i < n; i++) {
        const kvr_ix_register_t *r = &e[i].r;
        inside(b, size, r->endpoint, r->endpoint_len);
        inside(b, size, r->model_name, r->model_name_len);
        if (r->routing_group != NULL && r->routing_group_len > 0 &&
            strncmp(r->routing_group, "default", r->routing_group_len) != 0)
            inside(b, size, r->routing_group, r->routing_group_len);
        inside(b, size, r->replay_endpoint, r->replay_endpoint_len);
        if (r->block_size < 1 || r->block_size > 65536)
            abort();
        if (memcmp(&e[i].r, &e2[i].r, sizeof e[i].r) != 0 || e[i].why != e2[i].why)
            abort();
    }
    free(e);
    free(e2);
    return 0;
}

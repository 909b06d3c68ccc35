/*
 * fuzz_index_snapshot.c: libFuzzer target for the warm-restart state file decoder
 * (wire/index_snapshot.c), the trust boundary of `kvrouter serve --state-file`: a file may
 * be truncated, damaged or from another build. Each input is decoded twice: as given (the
 * checksum refuses almost everything), and resealed with a correct checksum, so the record
 * checks behind it are what the fuzzer explores.
 *
 * Invariants checked: open() either refuses with a message or accepts; an accepted file
 * yields exactly info.n_events events, each with a rank inside the table, the rank's worker,
 * a tier below KVR_N_TIERS and a non-empty block list for stores; applying them to an index
 * never breaks its invariants (kvr_index_verify).
 * Memory: one copy of the input and one small index per input. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/index_snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static void decode(const uint8_t *buf, size_t len)
{
    kvr_snap_reader_t r;
    char err[200] = "";
    int rc = kvr_snap_open(&r, buf, len, err, sizeof err);
    if (rc != KVR_OK) {
        check(rc == KVR_EPARSE && err[0] != '\0');
        return;
    }
    int st;
    kvr_index_config_t ic = {.max_pairs = 4096, .sync = KVR_SYNC_NONE};
    kvr_index_t *ix = kvr_index_new(&ic, &st);
    check(ix != NULL);
    uint32_t rank;
    kvr_event_t ev;
    uint64_t n = 0;
    while (kvr_snap_next(&r, &rank, &ev) == KVR_OK) {
        check(rank < r.info.n_ranks);
        kvr_snap_rank_t k;
        kvr_snap_rank(&r, rank, &k);
        check(ev.worker.worker_id == k.worker_id && ev.worker.dp_rank == k.dp_rank);
        check((unsigned)ev.tier < KVR_N_TIERS);
        check(ev.kind != KVR_EV_STORED || (ev.n_blocks > 0 && ev.blocks != NULL));
        (void)kvr_index_apply(ix, &ev);
        n++;
    }
    check(n == r.info.n_events);
    check(kvr_index_verify(ix, NULL, 0) == KVR_OK);
    kvr_index_free(ix);
    kvr_snap_close(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    decode(data, size);
    if (size < 48 || size > (1u << 20))
        return 0;
    uint8_t *copy = malloc(size);
    check(copy != NULL);
    memcpy(copy, data, size);
    uint64_t h = kvr_xxh3(copy, size - 8, 0);
    for (int i = 0; i < 8; i++)
        copy[size - 8 + i] = (uint8_t)(h >> (8 * i));
    decode(copy, size);
    free(copy);
    return 0;
}

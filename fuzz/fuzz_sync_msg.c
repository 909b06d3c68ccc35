/*
 * fuzz_sync_msg.c: libFuzzer target for the replica-sync message decoder (wire/sync_msg.c),
 * the trust boundary of <ns>.active_sequences and the snapshot subjects: anyone who can
 * publish on the NATS server can send these bytes.
 *
 * Invariants checked: open() either refuses with a message or accepts; an accepted message
 * yields exactly n_events events, each with a known kind, an id of 1..256 bytes inside the
 * input, hashes inside the input; re-encoding the events with the writer gives back the same
 * bytes (the decoder accepts nothing the writer would not write).
 * Memory: one writer buffer per input. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/sync_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_sync_reader_t r;
    char err[200] = "";
    if (kvr_sync_open(&r, data, size, err, sizeof err) != KVR_OK) {
        check(err[0] != '\0');
        return 0;
    }
    kvr_sync_writer_t w = {0};
    kvr_sync_begin(&w, &r.h);
    kvr_sync_event_t ev;
    uint32_t n = 0;
    uint64_t *seq = NULL;
    while (kvr_sync_next(&r, &ev) == KVR_OK) {
        n++;
        check(ev.kind >= KVR_SYNC_ADD && ev.kind <= KVR_SYNC_FREE);
        check(ev.id_len >= 1 && ev.id_len <= KVR_SYNC_MAX_ID);
        check((const uint8_t *)ev.id >= data && (const uint8_t *)ev.id + ev.id_len <= data + size);
        if (ev.kind == KVR_SYNC_ADD && ev.n_seq > 0) {
            check(ev.seq_bytes >= data && ev.seq_bytes + 8 * ev.n_seq <= data + size);
            seq = realloc(seq, ev.n_seq * sizeof *seq);
            check(seq != NULL);
            for (size_t i = 0; i < ev.n_seq; i++)
                seq[i] = kvr_sync_seq_at(&ev, i);
            ev.seq = seq;
        }
        check(kvr_sync_add(&w, &ev) == KVR_OK);
    }
    check(n == r.h.n_events);
    kvr_sync_set_flags(&w, r.h.flags);
    check(w.len == size && memcmp(w.buf, data, size) == 0);
    free(seq);
    kvr_sync_writer_free(&w);
    return 0;
}

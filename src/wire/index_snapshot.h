/*
 * index_snapshot.h: the file format of a router's warm-restart state: the prefix index of
 * the worker ranks it knew exactly, and for each the sequence cursor it had reached, so a
 * restarted router can reload the index and catch up from the engines' replay buffers
 * instead of starting empty (`kvrouter serve --state-file`).
 *
 * Layout (all integers little-endian):
 *   header  "KVRSNAP1" | u32 version (1) | u32 block_size | u64 saved_unix_ms | u32 n_ranks |
 *           u32 reserved (0)
 *   ranks   n_ranks x { u64 worker_id | u32 dp_rank | u32 flags (0) | u64 last_seq |
 *           u64 last_hash }                        (the cursor: batch last_seq was applied;
 *                                                   last_hash = XXH3-64 of its payload)
 *   events  { u8 kind (1 stored, 2 removed, 3 cleared) | u8 tier | u8 has_parent | u8 0 |
 *             u32 rank (index into ranks) | u32 n | [u64 parent_ext, n x (u64 ext, u64 lbh)]
 *             for stored, [n x u64 ext] for removed, nothing for cleared }...
 *   trailer u64 n_events | u64 XXH3-64 of every byte before it
 * The events are kvr_index_dump()'s: applied in order to an empty index they rebuild it.
 *
 * A file is untrusted bytes (it may be truncated, stale or from another build): the decoder
 * validates all of it (magic, version, checksum, every record's bounds, kind, tier, rank
 * index, counts) before the caller applies anything, so a bad file is refused whole with a
 * message naming the problem, never half-loaded.
 *
 * Ownership: the writer borrows its sink; the reader borrows the bytes it is given and owns
 * a scratch array for one event's blocks. Threads: one per object. Cost: O(bytes), one pass
 * to check, one to read; no allocation per event once the scratch has grown.
 * Why hand-written: a fixed layout read in place is checked and applied at memory speed;
 * msgpack-c (already a dependency) would allocate a zone object per value.
 */
#ifndef KVR_WIRE_INDEX_SNAPSHOT_H
#define KVR_WIRE_INDEX_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

#define KVR_SNAP_MAGIC "KVRSNAP1" /* the first bytes of a snapshot */
#define KVR_SNAP_MAGIC_LEN 8u
#define KVR_SNAP_VERSION 1u
#define KVR_SNAP_MAX_RANKS 65536u

typedef struct kvr_snap_rank {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t last_seq;
    uint64_t last_hash;
} kvr_snap_rank_t;

typedef struct kvr_snap_info {
    uint32_t version;
    uint32_t block_size;
    uint64_t saved_unix_ms;
    uint32_t n_ranks;
    uint64_t n_events;
} kvr_snap_info_t;

/* ---- writing ---- */

/* Receives the bytes in order; non-zero stops the writer (that status is returned). */
typedef int (*kvr_snap_sink_fn)(void *ud, const void *bytes, size_t len);

typedef struct kvr_snap_writer kvr_snap_writer_t;

/* Writes the header and the rank table; ranks are borrowed for the call. */
kvr_snap_writer_t *kvr_snap_writer_new(kvr_snap_sink_fn sink, void *ud, uint32_t block_size,
                                       uint64_t saved_unix_ms, const kvr_snap_rank_t *ranks,
                                       uint32_t n_ranks, int *status);
/* One event of rank `rank` (an index into the table). KVR_EINVAL for a bad kind, tier or
 * rank; the sink's status if it failed. */
int kvr_snap_write_event(kvr_snap_writer_t *w, uint32_t rank, const kvr_event_t *ev);
/* Writes the trailer. */
int kvr_snap_writer_finish(kvr_snap_writer_t *w);
void kvr_snap_writer_free(kvr_snap_writer_t *w);

/* ---- reading ---- */

typedef struct kvr_snap_reader {
    const uint8_t *buf;
    size_t len;
    kvr_snap_info_t info;
    const uint8_t *next;  /* the next event record */
    const uint8_t *end;   /* where the events end */
    kvr_block_t *blocks;  /* scratch of one event */
    uint64_t *removed;
    size_t cap;
} kvr_snap_reader_t;

/* Checks the whole file. KVR_OK and r ready to read; KVR_EPARSE (or KVR_ENOMEM) with a
 * message in err naming the problem (and the byte offset where one is known). */
int kvr_snap_open(kvr_snap_reader_t *r, const uint8_t *buf, size_t len, char *err,
                  size_t err_len);
void kvr_snap_rank(const kvr_snap_reader_t *r, uint32_t i, kvr_snap_rank_t *out);
/* The next event: KVR_OK with *rank and *ev (valid until the next call), KVR_ENOTFOUND at the
 * end. ev->worker is the rank's worker. */
int kvr_snap_next(kvr_snap_reader_t *r, uint32_t *rank, kvr_event_t *ev);
void kvr_snap_close(kvr_snap_reader_t *r);

#endif

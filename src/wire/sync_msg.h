/*
 * sync_msg.h: the replica-sync messages router replicas exchange over NATS: batches of
 * request-lifecycle events (<ns>.active_sequences), and a snapshot of the active requests
 * (the chunks of a reply to <ns>.sync.snapshot.<router id>).
 *
 * Layout (all integers little-endian, no padding):
 *   header  "KVRS" | u8 version (1) | u8 type | u16 flags | u64 router_id | u64 seq |
 *           u64 sent_us (publisher's wall clock, microseconds) | u32 n_events | u32 0
 *             type 1 EVENTS     seq = the publisher's batch number (1, 2, ...: a gap is a lost
 *                               batch)
 *             type 2 SNAP_REQ   no events; the reply subject is NATS's
 *             type 3 SNAPSHOT   seq = the chunk's index from 0; flags bit 0 = the last chunk
 *   events  n_events x { u8 kind (1 add, 2 prefill done, 3 free) | u8 opts | u16 id_len |
 *           id bytes (1..256) } then, for an add:
 *           { u64 origin (the router that booked it) | u64 worker_id | u32 dp_rank |
 *             u32 block_size | u64 isl_tokens | u64 cached_tokens | u32 expected_output_tokens |
 *             u32 n_seq | n_seq x u64 sequence hash }
 *   opts    bit 0 expected_output_tokens given; bits 1-2 assume_kv_reuse, bits 3-4
 *           track_prefill_tokens (kvr_load_opt_t: 0 config, 1 on, 2 off); bit 5 prefill done
 *           (a snapshot's request that had its first token); other bits 0
 *
 * A message is untrusted bytes (any client of the NATS server can publish): kvr_sync_open
 * checks all of it (magic, version, type, every event's bounds, kind, options, id length,
 * n_seq against the remaining bytes and KVR_SYNC_MAX_SEQ) before the caller applies anything,
 * so a bad message is refused whole with a message naming the problem, never half-applied.
 *
 * Ownership: the reader borrows the bytes; the writer owns a growable buffer. Threads: one
 * per object. Cost: O(bytes); the reader never allocates, the writer only when it grows.
 * Why hand-written: a fixed layout is checked and read in place at memory speed (the batches
 * run at tens of thousands of events a second); msgpack-c would allocate a zone per message
 * and JSON would quadruple the size of the hashes.
 */
#ifndef KVR_WIRE_SYNC_MSG_H
#define KVR_WIRE_SYNC_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

#define KVR_SYNC_VERSION 1u
#define KVR_SYNC_HEADER_BYTES 40u
#define KVR_SYNC_MAX_ID 256u
#define KVR_SYNC_MAX_SEQ (1u << 20) /* hashes in one add: far above any prompt */

typedef enum kvr_sync_type {
    KVR_SYNC_EVENTS = 1,
    KVR_SYNC_SNAP_REQ = 2,
    KVR_SYNC_SNAPSHOT = 3,
} kvr_sync_type_t;

typedef enum kvr_sync_kind {
    KVR_SYNC_ADD = 1,
    KVR_SYNC_PREFILL_DONE = 2,
    KVR_SYNC_FREE = 3,
} kvr_sync_kind_t;

#define KVR_SYNC_FLAG_LAST 1u

typedef struct kvr_sync_header {
    kvr_sync_type_t type;
    uint16_t flags;
    uint64_t router_id, seq, sent_us;
    uint32_t n_events;
} kvr_sync_header_t;

/* One event; pointers into the message (reader) or the caller's (writer). */
typedef struct kvr_sync_event {
    kvr_sync_kind_t kind;
    const char *id;
    size_t id_len;
    /* add only */
    uint64_t origin;
    kvr_worker_t worker;
    uint32_t block_size;
    uint64_t isl_tokens, cached_tokens;
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
    kvr_load_opt_t assume_kv_reuse, track_prefill_tokens;
    bool prefill_done;
    const uint8_t *seq_bytes; /* reader: n_seq little-endian u64 (kvr_sync_seq_at) */
    const uint64_t *seq;      /* writer: the hashes */
    size_t n_seq;
} kvr_sync_event_t;

typedef struct kvr_sync_reader {
    kvr_sync_header_t h;
    const uint8_t *buf;
    size_t len, pos;
    uint32_t left;
} kvr_sync_reader_t;

/* Checks the whole message and positions the reader at its first event. KVR_OK; KVR_EPARSE
 * with err naming the problem (and the event's index). */
int kvr_sync_open(kvr_sync_reader_t *r, const void *buf, size_t len, char *err, size_t err_len);
/* The next event of an opened message: KVR_OK, or KVR_ENOTFOUND after the last. */
int kvr_sync_next(kvr_sync_reader_t *r, kvr_sync_event_t *ev);
/* The i-th hash of a read add. */
uint64_t kvr_sync_seq_at(const kvr_sync_event_t *ev, size_t i);

typedef struct kvr_sync_writer {
    uint8_t *buf;
    size_t len, cap;
    uint32_t n_events;
} kvr_sync_writer_t;

/* Starts a message in w (keeps w's buffer). */
void kvr_sync_begin(kvr_sync_writer_t *w, const kvr_sync_header_t *h);
/* Appends one event: KVR_OK; KVR_EINVAL (id length, kind, n_seq); KVR_ENOMEM. On error the
 * message is as it was. */
int kvr_sync_add(kvr_sync_writer_t *w, const kvr_sync_event_t *ev);
/* Bytes one event takes. */
size_t kvr_sync_event_bytes(const kvr_sync_event_t *ev);
/* Sets the header's seq and sent_us of the message being written (a batch is numbered and
 * timed when it is published, not when it was begun). */
void kvr_sync_stamp(kvr_sync_writer_t *w, uint64_t seq, uint64_t sent_us);
/* Sets the header's flags (e.g. KVR_SYNC_FLAG_LAST) of the message being written. */
void kvr_sync_set_flags(kvr_sync_writer_t *w, uint16_t flags);
void kvr_sync_writer_free(kvr_sync_writer_t *w);

#endif

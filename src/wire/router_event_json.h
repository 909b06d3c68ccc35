/*
 * router_event_json.h: the reference's RouterEvent in JSON (its serde shape), as the indexer
 * API's GET /dump writes it and a peer's dump is read back at start (--peers):
 *
 *   {"worker_id":7,"storage_tier":"device","event":{"event_id":12,"dp_rank":0,
 *    "data":{"stored":{"parent_hash":123|null,"start_position":null,
 *                      "blocks":[{"block_hash":456,"tokens_hash":789,"mm_extra_info":null}]}}}}
 *   data {"removed":{"block_hashes":[...]}} or "cleared"
 *
 * and the whole dump: {"<model>:<group>": {"block_size": 16, "events": [RouterEvent, ...]},
 * ...} (a partition whose dump failed is {"error": "..."} and is skipped, counted).
 *
 * Reading: strict RFC 8259 (wire/json_scan.h), unknown members skipped at any level, hashes
 * u64 or i64 (a negative one is its two's complement, as the reference's i64 view of them),
 * storage_tier "device" (default), "host_pinned", "disk", "external" (any case); every event
 * is checked whole before the sink sees it, and an error names the partition, the event's
 * index and the field ("m:default: events[3].event.data.stored.blocks[0].tokens_hash:
 * missing"). The sink sees a partition's header before its events; an error stops the read
 * (what the sink already applied stays: the caller applies into a fresh index and discards it
 * on error).
 * Ownership: events handed to the sink borrow the decoder's buffers for the call.
 * Threads: one decoder per thread. Cost: one pass over the text (the scanner), plus a second
 * over each partition object to find block_size before its events.
 */
#ifndef KVR_WIRE_ROUTER_EVENT_JSON_H
#define KVR_WIRE_ROUTER_EVENT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"
#include "wire/json_writer.h"

/* One RouterEvent (the writer's status is returned). */
int kvr_rev_encode(kvr_json_writer_t *w, const kvr_event_t *ev);
/* One event of the router's own GET /v1/dump (a stored or removed event, flat):
 *   {"worker_id":7,"dp_rank":0,"storage_tier":"device","event_id":12,
 *    "stored":{"parent_hash":123|null,"blocks":[{"block_hash":456,"tokens_hash":789}]}}
 *   or "removed":{"block_hashes":[...]} in place of "stored". The writer's status. */
int kvr_dump_event_encode(kvr_json_writer_t *w, const kvr_event_t *ev);

typedef struct kvr_rev_sink {
    /* a partition: key is "<model>:<group>" (not NUL-terminated); non-zero stops the read */
    int (*partition)(void *ud, const char *key, size_t key_len, uint32_t block_size);
    int (*event)(void *ud, const kvr_event_t *ev); /* non-zero stops the read */
    void *ud;
} kvr_rev_sink_t;

typedef struct kvr_rev_report {
    uint64_t partitions, partitions_failed; /* failed: the peer's {"error": ...} entries */
    uint64_t events;
} kvr_rev_report_t;

/* Reads a whole dump into sink. KVR_OK; KVR_EPARSE (not JSON / not the shape) or KVR_EINVAL
 * (a field out of range) with err naming it; KVR_ENOMEM; or the sink's non-zero value
 * (KVR_ECANCELED when it returned something that is not a status). */
int kvr_rev_decode_dump(const char *text, size_t len, const kvr_rev_sink_t *sink,
                        kvr_rev_report_t *rep, char *err, size_t err_len);

#endif

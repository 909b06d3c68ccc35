/*
 * replica_sync.h: router replicas share their active load over NATS (router_replica_sync, as
 * the reference's). Each replica's bookings, first tokens (prefill done) and frees are
 * published on <ns>.active_sequences, batched (at most 256 events, or 1 ms after the first of
 * a batch); every other replica applies them to its own load tracker, so each one's selection
 * sees the whole fleet's load, not just the requests that came through it.
 *
 *   not synced   output-block growth (router_track_output_blocks) and approximate mode's
 *                decisions: a peer's request counts its prompt blocks and prefill tokens only
 *   join         a replica that starts or reconnects asks the others for a snapshot of their
 *                active requests (<ns>.sync.snapshot, chunks answered to its own reply
 *                subject); live batches that arrive meanwhile are held and applied after it.
 *                After a reconnect, the requests learnt from peers are dropped first (their
 *                frees may have been missed) and the snapshot restores the live ones.
 *   peer death   the requests a gone peer booked are freed at once (replicas.h tells when);
 *                router_request_expiry_ms is the backstop for anything else missed
 *   bad input    a message that does not decode, a gap in a peer's batch numbers, an add for
 *                a worker this replica does not know, a duplicate id: counted in /metrics
 *                (kvr_sync_*) and logged rate-limited; nothing is half-applied
 *
 * Ownership: borrows the link, the scheduler, the replicas and the API server (all outlive it).
 * Threads: the event loop only. Cost: a local event is appended to the batch (one copy of its
 * hashes); a peer's add is one load-tracker admit; a snapshot is O(live requests).
 */
#ifndef KVR_NET_REPLICA_SYNC_H
#define KVR_NET_REPLICA_SYNC_H

#include <stdint.h>

#include "kvrouter/sched.h"
#include "fleet/fleet.h"
#include "http/http.h"
#include "nats/nats_link.h"
#include "cluster/replicas.h"

typedef struct kvr_replica_sync kvr_replica_sync_t;

typedef struct kvr_replica_sync_config {
    struct event_base *base;
    kvr_nats_t *nats;
    kvr_sched_t *sched;
    kvr_replicas_t *replicas;
    kvr_http_host_t *host; /* its service: metrics, ... */
    const char *ns;
    uint64_t snapshot_wait_ms; /* how long a joining replica waits for a snapshot (0 = 1000) */
} kvr_replica_sync_config_t;

kvr_replica_sync_t *kvr_replica_sync_new(const kvr_replica_sync_config_t *cfg, int *status);
/* Publishes the batch in progress, then stops. */
void kvr_replica_sync_free(kvr_replica_sync_t *s);
/* Whether the join (snapshot) is done: /ready waits for it. */
bool kvr_replica_sync_ready(const kvr_replica_sync_t *s);

#endif

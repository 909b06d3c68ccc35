/*
 * discovery.h: live worker discovery (`serve --discovery nats`). Workers are entries of the
 * NATS bucket <ns>_workers: key = the worker id in decimal, value = the worker as POST
 * /v1/workers takes it (JSON: worker_id, url, events, replay, dp_size, dp_start, taints,
 * model, block_size, loras, eagle, ...), written and refreshed by a heartbeat (every third of
 * nats_presence_ttl_ms) by the engine's side: `kvrouter mocker --nats-url`, or `kvrouter
 * register` for an engine that knows nothing of NATS.
 *
 *   appears     a new entry registers the worker at once (router, KV-event subscription with
 *               replay, health probe), as POST /v1/workers would
 *   changes     an entry whose value changed re-registers it (removed, then added)
 *   goes        a deleted entry (clean stop), or one not refreshed for the TTL while this router
 *               is connected to NATS (a crash), removes the worker: its bookings and index
 *               entries go with it, requests stop going there. If it returns, it is registered
 *               again and its events subscribed afresh (with replay)
 *   refused     an entry that does not decode, whose id disagrees with its key, that names a
 *               worker given by --worker or POST /v1/workers, or that registration refuses
 *               (a block-size mismatch within a model, an endpoint not allowed): counted,
 *               logged once per value (rate-limited), and skipped until its value changes
 *
 * A router cut off from NATS keeps the workers it has (it cannot tell a dead worker from its
 * own silence); the health probes still fence workers that stop answering.
 *
 * Ownership: borrows the link, the API server and the replicas (for the connection's age);
 * owns its table of discovered workers. Threads: the event loop. Cost: an entry is one JSON
 * decode and a scan of the discovered table; the expiry check (every 250 ms) scans it too.
 */
#ifndef KVR_NET_DISCOVERY_H
#define KVR_NET_DISCOVERY_H

#include <stdint.h>

#include "fleet/fleet.h"
#include "http/http.h"
#include "nats/nats_link.h"
#include "cluster/replicas.h"

typedef struct kvr_discovery kvr_discovery_t;

typedef struct kvr_discovery_config {
    struct event_base *base;
    kvr_nats_t *nats;
    kvr_http_host_t *host; /* its service: metrics */
    kvr_fleet_t *fleet;    /* where workers are added and removed */
    kvr_replicas_t *replicas;
    const char *ns;
    uint64_t ttl_ms;
} kvr_discovery_config_t;

kvr_discovery_t *kvr_discovery_new(const kvr_discovery_config_t *cfg, int *status);
void kvr_discovery_free(kvr_discovery_t *d);

/* The engine's side: keeps sp's entry in <ns>_workers, refreshed every ttl_ms / 3, until the
 * link is freed (which deletes it). KVR_OK; KVR_EINVAL (namespace); KVR_ENOMEM; KVR_EFULL. */
int kvr_discovery_register(kvr_nats_t *n, const char *ns, uint64_t ttl_ms,
                           const kvr_worker_spec_t *sp);

#endif

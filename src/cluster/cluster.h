/*
 * cluster.h: this router among its peer replicas, the one header `serve` includes of
 * src/cluster. With nats_url set: the NATS link (nats/nats_link.h), this router's presence in
 * <ns>_routers and the peer table (GET /v1/routers), workers discovered from <ns>_workers (when
 * discovery is nats), and replica sync (the peers' active load, when router_replica_sync).
 * With or without NATS: a joining router's index, loaded from a peer's
 * GET /v1/index/snapshot (`peers`, else the live routers of <ns>_routers on allowed hosts).
 * Each part is a service of the HTTP host (metrics, /ready, /v1/routers) over the fleet.
 * The engine side of discovery (kvr_discovery_register: an engine's entry in <ns>_workers,
 * kept alive; `kvrouter register` and the mocker) is cluster/discovery.h, included here.
 * Ownership: borrows the loop, the host and the fleet (all outlive it). Threads: the HTTP
 * thread. docs/replicas.md describes the protocol.
 */
#ifndef KVR_CLUSTER_CLUSTER_H
#define KVR_CLUSTER_CLUSTER_H

#include <stddef.h>

#include "kvrouter/config.h"
#include <stdbool.h>

#include "cluster/discovery.h"
#include "events/ingest.h"
#include "fleet/fleet.h"
#include "http/http.h"
#include "nats/nats_link.h"

typedef struct kvr_cluster kvr_cluster_t;

typedef struct kvr_cluster_config {
    struct event_base *base;
    kvr_http_host_t *host; /* listening already: its ports go into the presence entry */
    kvr_fleet_t *fleet;
    const kvr_router_config_t *cfg; /* copied */
} kvr_cluster_config_t;

/* Connects to NATS when nats_url is set (the first connection in the foreground) and starts
 * the parts; not yet listed among the replicas (kvr_cluster_announce). NULL with *status and
 * err naming the part on failure. */
kvr_cluster_t *kvr_cluster_new(const kvr_cluster_config_t *c, int *status, char *err,
                               size_t err_len);
/* Sync's last batch out, the presence entry deleted, the link closed. */
void kvr_cluster_free(kvr_cluster_t *c);
/* The link, for other services over NATS (the indexer's); NULL without nats_url. */
kvr_nats_t *kvr_cluster_nats(const kvr_cluster_t *c);
/* Asks the peers (`peers`, else the live routers of the routers bucket on allowed hosts) for
 * an index snapshot without blocking the loop: KVR_OK when the asking started (done is called
 * on the loop once it ends: loaded true when a snapshot was applied into g, whose thread must
 * not be started before; the fleet's index origin then says which peer), or KVR_ENOTFOUND when
 * there is no peer to ask (done is not called). The router serves, cold, meanwhile; each
 * failure is logged. */
typedef void (*kvr_cluster_index_fn)(void *arg, bool loaded);
int kvr_cluster_load_index(kvr_cluster_t *c, kvr_ingest_t *g, kvr_cluster_index_fn done,
                           void *arg);
/* Lists this router among the replicas: call once it serves, so that a joining peer never
 * waits on a router that is itself still starting. */
int kvr_cluster_announce(kvr_cluster_t *c);

#endif
